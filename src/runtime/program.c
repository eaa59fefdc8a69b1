/* program.c — lowering: schedule + memory plan -> a flat array of instructions (gt_program.h).
 *
 * Each instruction carries what gt_cpu_run_kernel needs and nothing that needs the graph: the op,
 * its int and float attributes copied, its expression attributes evaluated under the binding, and
 * a buffer reference (arena, offset, dtype, concrete shape) per input and output. A reshape whose
 * output shares its input's bytes (a planned view) emits no instruction: the bytes are already
 * where its readers look. Both arenas are allocated here, once, at the planned sizes. */
#include <stdlib.h>
#include <string.h>

#include "graphtrain/gt_program.h"

static gt_buffer_ref buffer_ref(const gt_plan *p, gt_value_id v)
{
    const gt_value_plan *vp = &p->values[v];
    const gt_type *ty = gt_value_type(p->g, v);
    gt_buffer_ref r = {
        .arena = vp->arena, .dtype = ty->dtype, .ndim = ty->ndim, .offset = vp->offset};
    for (int d = 0; d < ty->ndim; d++)
        r.shape[d] = vp->shape[d];
    return r;
}

static gt_status lower_node(const gt_graph *g, const gt_plan *p, gt_node_id n,
                            const gt_sym_binding *binding, gt_instr *ins, gt_error *err)
{
    const gt_node *nd = &g->nodes[n];
    memset(ins, 0, sizeof *ins);
    ins->op = nd->op;
    ins->node = n;
    ins->n_in = nd->n_in;
    ins->n_out = nd->n_out;
    ins->ni = nd->attrs.ni;
    ins->nf = nd->attrs.nf;
    ins->ne = nd->attrs.ne;
    memcpy(ins->i, nd->attrs.i, sizeof ins->i);
    memcpy(ins->f, nd->attrs.f, sizeof ins->f);
    for (int j = 0; j < nd->attrs.ne; j++)
        if (gt_sym_eval(g->sym, nd->attrs.e[j], binding, &ins->e[j], err) != GT_OK)
            return gt_error_wrap(err, "lowering node %%%d (%s), attribute e[%d]", n,
                                 gt_op_get(nd->op)->name, j);
    for (int j = 0; j < nd->n_in; j++)
        ins->in[j] = buffer_ref(p, nd->in[j]);
    for (int j = 0; j < nd->n_out; j++)
        ins->out[j] = buffer_ref(p, nd->out[j]);
    return GT_OK;
}

gt_status gt_program_build_opts(const gt_graph *g, const gt_sym_binding *binding,
                                const gt_plan_options *opts, gt_program **out, gt_error *err)
{
    *out = NULL;
    gt_node_id *order = NULL;
    int32_t n_order = 0;
    GT_TRY(gt_schedule_build(g, &order, &n_order, err));
    gt_plan *plan = NULL;
    gt_status st = gt_plan_memory(g, binding, order, n_order, opts, &plan, err);
    free(order);
    if (st != GT_OK) return st;

    gt_program *p = gt_xcalloc(1, sizeof *p);
    p->g = g;
    p->plan = plan;
    p->instrs = gt_xcalloc((size_t)n_order + 1, sizeof *p->instrs);
    for (int32_t k = 0; k < n_order && st == GT_OK; k++) {
        gt_node_id n = plan->order[k];
        const gt_node *nd = &g->nodes[n];
        if (nd->op == GT_OP_RESHAPE && plan->values[nd->out[0]].shared == 1) continue;
        st = lower_node(g, plan, n, binding, &p->instrs[p->n_instrs], err);
        if (st == GT_OK) p->n_instrs++;
    }
    p->n_inputs = g->n_inputs;
    p->inputs = gt_xcalloc((size_t)g->n_inputs + 1, sizeof *p->inputs);
    for (int32_t k = 0; k < g->n_inputs; k++)
        p->inputs[k] = buffer_ref(plan, g->inputs[k].value);
    p->n_outputs = g->n_outputs;
    p->outputs = gt_xcalloc((size_t)g->n_outputs + 1, sizeof *p->outputs);
    for (int32_t k = 0; k < g->n_outputs; k++)
        p->outputs[k] = buffer_ref(plan, g->outputs[k].value);

    for (int a = 0; a < GT_ARENA_COUNT && st == GT_OK; a++) {
        size_t bytes = plan->arena_bytes[a]; /* a multiple of GT_PLAN_ALIGN */
        if (!bytes) continue;
        p->arena[a] = aligned_alloc(GT_PLAN_ALIGN, bytes);
        if (!p->arena[a])
            st =
                gt_error_set(err, GT_ERR_NOMEM, "program: cannot allocate the %s arena (%zu bytes)",
                             a == GT_ARENA_PERSISTENT ? "persistent" : "step", bytes);
        else
            p->allocated_bytes[a] = bytes;
    }
    if (st != GT_OK) {
        gt_program_free(p);
        return st;
    }
    *out = p;
    return GT_OK;
}

gt_status gt_program_build(const gt_graph *g, const gt_sym_binding *binding, gt_program **out,
                           gt_error *err)
{
    return gt_program_build_opts(g, binding, NULL, out, err);
}

void gt_program_free(gt_program *p)
{
    if (!p) return;
    for (int a = 0; a < GT_ARENA_COUNT; a++)
        free(p->arena[a]);
    gt_plan_free(p->plan);
    free(p->instrs);
    free(p->inputs);
    free(p->outputs);
    free(p);
}

size_t gt_program_planned_bytes(const gt_program *p, gt_arena_kind a)
{
    return (unsigned)a < GT_ARENA_COUNT ? p->plan->arena_bytes[a] : 0;
}

size_t gt_program_allocated_bytes(const gt_program *p, gt_arena_kind a)
{
    return (unsigned)a < GT_ARENA_COUNT ? p->allocated_bytes[a] : 0;
}
