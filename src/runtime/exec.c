/* exec.c — the program executor on the CPU backend (gt_program.h).
 *
 * A run: check and copy each graph input into its planned buffer; call gt_cpu_run_kernel for each
 * instruction with gt_tensor views (gt_tensor_wrap) onto the arenas; copy each graph output out
 * into a fresh tensor the caller owns. Kernels write every element of their outputs, so the
 * arenas are never cleared between runs. */
#include <stdio.h>
#include <string.h>

#include "graphtrain/gt_program.h"
#include "runtime_internal.h"

static void *ref_data(void *const *arena, const gt_buffer_ref *r)
{
    return arena[r->arena] ? (char *)arena[r->arena] + r->offset : NULL;
}

static void ref_tensor(void *const *arena, const gt_buffer_ref *r, gt_tensor *t)
{
    gt_tensor_wrap(t, r->dtype, r->ndim, r->shape, ref_data(arena, r));
}

static gt_status copy_input(gt_program *p, int32_t k, const gt_tensor *t, gt_error *err)
{
    const gt_graph *g = p->g;
    const gt_io *io = &g->inputs[k];
    const gt_buffer_ref *r = &p->inputs[k];
    gt_tensor want;
    ref_tensor(p->arena, r, &want);
    bool ok = t->dtype == r->dtype && t->ndim == r->ndim;
    for (int d = 0; ok && d < r->ndim; d++)
        ok = t->shape[d] == r->shape[d];
    if (!ok) {
        char w[160], got[160];
        gt_tensor_format_type(&want, w, sizeof w);
        gt_tensor_format_type(t, got, sizeof got);
        return gt_error_set(err, GT_ERR_INVALID, "graph input %d (%s %s): expected %s, got %s", k,
                            gt_input_kind_name((gt_input_kind)io->kind), gt_graph_str(g, io->fqn),
                            w, got);
    }
    size_t nbytes = gt_tensor_nbytes(t);
    if (!nbytes) return GT_OK;
    if (!t->data)
        return gt_error_set(err, GT_ERR_INVALID, "graph input %d (%s %s): tensor has no data", k,
                            gt_input_kind_name((gt_input_kind)io->kind), gt_graph_str(g, io->fqn));
    memmove(want.data, t->data, nbytes); /* memmove: the caller may pass a view of the arena */
    return GT_OK;
}

void gt_program_kernel_call(const gt_instr *ins, void *const *arena, gt_kernel_call *call,
                            gt_tensor *in, gt_tensor *out)
{
    *call = (gt_kernel_call){
        .op = ins->op,
        .i = ins->i,
        .f = ins->f,
        .e = ins->e,
        .ni = ins->ni,
        .nf = ins->nf,
        .ne = ins->ne,
        .n_in = ins->n_in,
        .n_out = ins->n_out,
    };
    for (int j = 0; j < ins->n_in; j++) {
        ref_tensor(arena, &ins->in[j], &in[j]);
        call->in[j] = &in[j];
    }
    for (int j = 0; j < ins->n_out; j++) {
        ref_tensor(arena, &ins->out[j], &out[j]);
        call->out[j] = &out[j];
    }
}

void gt_program_wrap_kernel_error(const gt_graph *g, const gt_instr *ins, const char *suffix,
                                  gt_error *err)
{
    const gt_node *nd = &g->nodes[ins->node];
    const char *fqn = gt_graph_str(g, nd->fqn);
    gt_error_wrap(err, "node %%%d %s%s%s%s", ins->node, gt_op_get(nd->op)->name,
                  fqn && fqn[0] ? " at " : "", fqn ? fqn : "", suffix);
}

static gt_status run_instr(gt_program *p, const gt_instr *ins, gt_error *err)
{
    gt_tensor in[GT_MAX_IN], out[GT_MAX_OUT];
    gt_kernel_call call;
    gt_program_kernel_call(ins, p->arena, &call, in, out);
    gt_status st = gt_cpu_run_kernel(&call, err);
    if (st != GT_OK) gt_program_wrap_kernel_error(p->g, ins, "", err);
    return st;
}

gt_status gt_program_run(gt_program *p, const gt_tensor *inputs, gt_tensor *outputs, gt_error *err)
{
    if ((p->n_inputs > 0 && !inputs) || (p->n_outputs > 0 && !outputs))
        return gt_error_set(err, GT_ERR_INVALID,
                            "program run: the graph has %d inputs and %d outputs but got %s array",
                            p->n_inputs, p->n_outputs, inputs ? "no outputs" : "no inputs");
    for (int32_t k = 0; k < p->n_outputs; k++)
        memset(&outputs[k], 0, sizeof outputs[k]);
    for (int32_t k = 0; k < p->n_inputs; k++)
        GT_TRY(copy_input(p, k, &inputs[k], err));
    for (int32_t k = 0; k < p->n_instrs; k++)
        GT_TRY(run_instr(p, &p->instrs[k], err));
    for (int32_t k = 0; k < p->n_outputs; k++) {
        const gt_buffer_ref *r = &p->outputs[k];
        gt_status st = gt_tensor_alloc(&outputs[k], r->dtype, r->ndim, r->shape, err);
        if (st != GT_OK) {
            for (int32_t j = 0; j < k; j++)
                gt_tensor_free(&outputs[j]);
            return st;
        }
        size_t nbytes = gt_tensor_nbytes(&outputs[k]);
        if (nbytes) memcpy(outputs[k].data, ref_data(p->arena, r), nbytes);
    }
    return GT_OK;
}
