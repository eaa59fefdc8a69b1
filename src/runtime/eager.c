/* eager.c — the eager reference executor (gt_exec.h): runs a graph node by node on the CPU
 * kernels, a fresh buffer per value.
 *
 * It is the reference the compiled program must match bit for bit (DESIGN.md §6), so it does the
 * simplest thing: for each node in graph order, evaluate its output shapes and expression
 * attributes under the binding, allocate the outputs, call the kernel. A value's buffer is freed
 * after its last use (counted over node input slots); graph inputs are borrowed from the caller and
 * never freed; graph outputs are handed over (moved when the value is an intermediate named by one
 * output slot only, copied otherwise — e.g. an output that is also a graph input, or a value named
 * by two output slots).
 *
 * Collectives run through the communicators (gt_eager_run_comms): a start runs its whole
 * collective, blocking, into its fresh output buffer, and its wait copies that buffer into its
 * own. A group of size 1 is a copy and needs no communicator. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graphtrain/gt_backend.h"
#include "graphtrain/gt_exec.h"
#include "runtime_internal.h"

enum { VAL_ABSENT = 0, VAL_BORROWED, VAL_OWNED, VAL_DONE };

typedef struct {
    const gt_graph *g;
    gt_comm *const *comms; /* per mesh dim; may be NULL */
    gt_tensor *vals;
    uint8_t *state;
    int32_t *uses_left; /* remaining uses by node input slots */
    uint8_t *is_output;
} eager_state;

static void format_dims(const int64_t *shape, int ndim, gt_dtype dt, char *buf, size_t len)
{
    gt_tensor t = {.dtype = dt, .ndim = ndim};
    for (int i = 0; i < ndim; i++)
        t.shape[i] = shape[i];
    gt_tensor_format_type(&t, buf, len);
}

/* Input k must have the dtype and the shape of g->inputs[k] under the binding. */
static gt_status check_input(const gt_graph *g, int32_t k, const gt_sym_binding *binding,
                             const gt_tensor *t, gt_error *err)
{
    const gt_io *io = &g->inputs[k];
    const gt_type *ty = gt_value_type(g, io->value);
    const char *kind = gt_input_kind_name((gt_input_kind)io->kind);
    const char *name = gt_graph_str(g, io->fqn);
    int64_t shape[GT_MAX_DIMS];
    if (gt_graph_eval_shape(g, io->value, binding, shape, err) != GT_OK)
        return gt_error_wrap(err, "graph input %d (%s %s)", k, kind, name);
    bool ok = t->dtype == ty->dtype && t->ndim == ty->ndim;
    for (int i = 0; ok && i < ty->ndim; i++)
        ok = t->shape[i] == shape[i];
    if (!ok) {
        char want[160], got[160];
        format_dims(shape, ty->ndim, ty->dtype, want, sizeof want);
        gt_tensor_format_type(t, got, sizeof got);
        return gt_error_set(err, GT_ERR_INVALID, "graph input %d (%s %s): expected %s, got %s", k,
                            kind, name, want, got);
    }
    if (!t->data && gt_tensor_numel(t) > 0)
        return gt_error_set(err, GT_ERR_INVALID, "graph input %d (%s %s): tensor has no data", k,
                            kind, name);
    return GT_OK;
}

/* The kernel of node n, or its collective: a start runs to completion (blocking), a wait copies
 * the start's finished result. */
static gt_status run_call(eager_state *s, gt_node_id n, const gt_kernel_call *call, gt_error *err)
{
    const gt_node *nd = &s->g->nodes[n];
    if (nd->op == GT_OP_WAIT) {
        const gt_node *start = &s->g->nodes[s->g->values[nd->in[0]].producer];
        if (start->op == GT_OP_SEND_START) { /* the send read the start's own copy until now */
            gt_comm *c;
            GT_TRY(
                gt_runtime_comm_for(s->g, start->attrs.i[0], start->attrs.i[1], s->comms, &c, err));
            if (c) GT_TRY(gt_comm_send_wait_all(c, err));
        }
        size_t nbytes = gt_tensor_nbytes(call->in[0]);
        GT_CHECK(nbytes == gt_tensor_nbytes(call->out[0]));
        if (nbytes) memcpy(call->out[0]->data, call->in[0]->data, nbytes);
        return GT_OK;
    }
    if (!gt_op_is_collective_start(nd->op)) return gt_cpu_run_kernel(call, err);
    gt_comm *c;
    GT_TRY(gt_runtime_comm_for(s->g, nd->attrs.i[0], nd->attrs.i[1], s->comms, &c, err));
    gt_comm_request *req;
    if (nd->op == GT_OP_SEND_START) { /* sent from the start's output, alive until its wait */
        size_t nbytes = gt_tensor_nbytes(call->in[0]);
        if (nbytes) memcpy(call->out[0]->data, call->in[0]->data, nbytes);
        return gt_runtime_start(nd->op, c, nd->attrs.i, call->out[0], call->out[0], &req, err);
    }
    GT_TRY(gt_runtime_start(nd->op, c, nd->attrs.i, nd->n_in ? call->in[0] : NULL, call->out[0],
                            &req, err));
    return req ? gt_comm_wait(req, err) : GT_OK;
}

/* Runs node n: outputs allocated into s->vals, kernel called, dead inputs freed. */
static gt_status run_node(eager_state *s, gt_node_id n, const gt_sym_binding *binding,
                          gt_error *err)
{
    const gt_graph *g = s->g;
    const gt_node *nd = &g->nodes[n];
    gt_kernel_call call = {
        .op = nd->op,
        .i = nd->attrs.i,
        .f = nd->attrs.f,
        .ni = nd->attrs.ni,
        .nf = nd->attrs.nf,
        .ne = nd->attrs.ne,
        .n_in = nd->n_in,
        .n_out = nd->n_out,
    };
    int64_t e[GT_MAX_EATTR];
    for (int j = 0; j < nd->attrs.ne; j++)
        GT_TRY(gt_sym_eval(g->sym, nd->attrs.e[j], binding, &e[j], err));
    call.e = e;
    for (int j = 0; j < nd->n_in; j++) {
        gt_value_id v = nd->in[j];
        if (v < 0 || v >= g->n_values || (s->state[v] != VAL_BORROWED && s->state[v] != VAL_OWNED))
            return gt_error_set(err, GT_ERR_INVALID, "input %d (%%%d) is not defined before use", j,
                                v);
        call.in[j] = &s->vals[v];
    }
    for (int j = 0; j < nd->n_out; j++) {
        gt_value_id v = nd->out[j];
        const gt_type *ty = gt_value_type(g, v);
        int64_t shape[GT_MAX_DIMS];
        GT_TRY(gt_graph_eval_shape(g, v, binding, shape, err));
        GT_TRY(gt_tensor_alloc(&s->vals[v], ty->dtype, ty->ndim, shape, err));
        s->state[v] = VAL_OWNED;
        call.out[j] = &s->vals[v];
    }
    GT_TRY(run_call(s, n, &call, err));

    for (int j = 0; j < nd->n_in; j++) {
        gt_value_id v = nd->in[j];
        if (--s->uses_left[v] == 0 && s->state[v] == VAL_OWNED && !s->is_output[v]) {
            gt_tensor_free(&s->vals[v]);
            s->state[v] = VAL_DONE;
        }
    }
    for (int j = 0; j < nd->n_out; j++) {
        gt_value_id v = nd->out[j];
        if (s->uses_left[v] == 0 && !s->is_output[v]) {
            gt_tensor_free(&s->vals[v]);
            s->state[v] = VAL_DONE;
        }
    }
    return GT_OK;
}

/* outputs[k] <- value of g->outputs[k]: moved when this is the last slot naming an owned value.
 * A run of the micro-batch part leaves the outputs it does not compute empty. */
static gt_status hand_outputs(eager_state *s, gt_run_part part, gt_tensor *outputs, gt_error *err)
{
    const gt_graph *g = s->g;
    for (int32_t k = 0; k < g->n_outputs; k++) {
        gt_value_id v = g->outputs[k].value;
        if (part == GT_RUN_MICRO && !gt_graph_micro_output(g->outputs[k].kind)) continue;
        if (s->state[v] != VAL_BORROWED && s->state[v] != VAL_OWNED)
            return gt_error_set(err, GT_ERR_INVALID,
                                "graph output %d (%s %s): value %%%d was not "
                                "computed",
                                k, gt_output_kind_name((gt_output_kind)g->outputs[k].kind),
                                gt_graph_str(g, g->outputs[k].fqn), v);
        bool last = true;
        for (int32_t j = k + 1; j < g->n_outputs; j++)
            last &= g->outputs[j].value != v;
        if (s->state[v] == VAL_OWNED && last) {
            outputs[k] = s->vals[v];
            memset(&s->vals[v], 0, sizeof s->vals[v]);
            s->state[v] = VAL_DONE;
            continue;
        }
        const gt_tensor *src = &s->vals[v];
        GT_TRY(gt_tensor_alloc(&outputs[k], src->dtype, src->ndim, src->shape, err));
        size_t nbytes = gt_tensor_nbytes(src);
        if (nbytes) memcpy(outputs[k].data, src->data, nbytes);
    }
    return GT_OK;
}

gt_status gt_eager_run(const gt_graph *g, const gt_sym_binding *binding, const gt_tensor *inputs,
                       gt_tensor *outputs, gt_error *err)
{
    return gt_eager_run_part(g, binding, inputs, NULL, GT_RUN_ALL, outputs, err);
}

gt_status gt_eager_run_comms(const gt_graph *g, const gt_sym_binding *binding,
                             const gt_tensor *inputs, gt_comm *const comms[GT_MESH_MAX_DIMS],
                             gt_tensor *outputs, gt_error *err)
{
    return gt_eager_run_part(g, binding, inputs, comms, GT_RUN_ALL, outputs, err);
}

gt_status gt_eager_run_part(const gt_graph *g, const gt_sym_binding *binding,
                            const gt_tensor *inputs, gt_comm *const comms[GT_MESH_MAX_DIMS],
                            gt_run_part part, gt_tensor *outputs, gt_error *err)
{
    if ((g->n_inputs > 0 && !inputs) || (g->n_outputs > 0 && !outputs))
        return gt_error_set(err, GT_ERR_INVALID,
                            "eager run: the graph has %d inputs and %d outputs but got %s array",
                            g->n_inputs, g->n_outputs, inputs ? "no outputs" : "no inputs");
    for (int32_t k = 0; k < g->n_outputs; k++)
        memset(&outputs[k], 0, sizeof outputs[k]);
    for (int32_t k = 0; k < g->n_outputs; k++)
        if (g->outputs[k].value < 0 || g->outputs[k].value >= g->n_values)
            return gt_error_set(err, GT_ERR_INVALID, "graph output %d: value %%%d out of range", k,
                                g->outputs[k].value);
    for (int32_t k = 0; k < g->n_inputs; k++)
        GT_TRY(check_input(g, k, binding, &inputs[k], err));

    int32_t nv = g->n_values;
    eager_state s = {
        .g = g,
        .comms = comms,
        .vals = gt_xcalloc((size_t)nv + 1, sizeof(gt_tensor)),
        .state = gt_xcalloc((size_t)nv + 1, 1),
        .uses_left = gt_xcalloc((size_t)nv + 1, sizeof(int32_t)),
        .is_output = gt_xcalloc((size_t)nv + 1, 1),
    };
    uint8_t *in_part = NULL; /* the micro-batch part's nodes (gt_graph_micro_part) */
    if (part == GT_RUN_MICRO) {
        in_part = gt_xcalloc((size_t)g->n_nodes + 1, 1);
        gt_graph_micro_part(g, in_part);
    }
    for (gt_node_id n = 0; n < g->n_nodes; n++)
        for (int j = 0; (!in_part || in_part[n]) && j < g->nodes[n].n_in; j++) {
            gt_value_id v = g->nodes[n].in[j];
            if (v >= 0 && v < nv) s.uses_left[v]++;
        }
    for (int32_t k = 0; k < g->n_outputs; k++)
        s.is_output[g->outputs[k].value] = 1;
    for (int32_t k = 0; k < g->n_inputs; k++) {
        gt_value_id v = g->inputs[k].value;
        s.vals[v] = inputs[k];
        s.vals[v].owns_data = false; /* borrowed: the caller frees it */
        s.state[v] = VAL_BORROWED;
    }

    gt_status st = GT_OK;
    for (gt_node_id n = 0; n < g->n_nodes && st == GT_OK; n++) {
        if (in_part && !in_part[n]) continue;
        st = run_node(&s, n, binding, err);
        if (st != GT_OK) {
            char label[256];
            gt_graph_node_label(g, n, label, sizeof label);
            gt_error_wrap(err, "%s", label);
        }
    }
    if (st == GT_OK) st = hand_outputs(&s, part, outputs, err);
    if (st != GT_OK)
        for (int32_t k = 0; k < g->n_outputs; k++)
            gt_tensor_free(&outputs[k]);
    for (gt_value_id v = 0; v < nv; v++)
        if (s.state[v] == VAL_OWNED) gt_tensor_free(&s.vals[v]);
    free(in_part);
    free(s.is_output);
    free(s.uses_left);
    free(s.state);
    free(s.vals);
    return st;
}
