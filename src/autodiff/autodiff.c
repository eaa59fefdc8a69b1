/* autodiff.c — reverse-mode differentiation over the IR (gt_autodiff.h).
 *
 * Algorithm, for a scalar loss L and values wrt[]:
 *   1. active values: those on a path wrt -> L, i.e. forward-reachable from some wrt through float
 *      values (integers carry no gradient) and backward-reachable from L. The outputs of a
 *      GT_OPF_NONDIFF op (routing decisions, counts) are never active: constants to the backward.
 *   2. seed dL/dL = full(1.0) of L's type.
 *   3. walk the forward nodes in reverse order; for a node with an active output that received a
 *      gradient, call its rule (grad_rules*.c) and add what it returns for each active input.
 *   4. prune the backward nodes whose results nobody asked for (a rule computes the gradient of
 *      every float input; e.g. matmul's dA when only B is a wrt), so no dead work is left.
 *
 * Accumulation order (this is what makes the sums deterministic): a value used by several consumers
 * receives its contributions in the order the rules produce them — consumers in reverse node
 * order, and within one consumer by input slot — and they are summed as a left fold
 *   grad = add(add(c1, c2), c3) ...
 * While a rule runs, the builder stamps its nodes (and the accumulating adds) with phase backward,
 * origin = the forward node, fqn = the forward node's fqn; the caller's builder state is restored.
 */
#include <stdlib.h>
#include <string.h>

#include "autodiff/grad_rules.h"
#include "graphtrain/gt_build.h"

static const gt_grad_rule gt_grad_rules[GT_OP_COUNT] = {
#define X(E, name, nin, nout, flags, rule, alias, pairs, recompute, schema)                        \
    [GT_OP_##E] = gt_grad_##name,
#include "graphtrain/gt_ops.def"
#undef X
};

/* Takes the builder's sticky error (if any) into err, naming the node whose rule caused it. */
static gt_status take_builder_error(gt_graph *g, gt_node_id n, gt_error *err)
{
    if (g->err.code == GT_OK) return GT_OK;
    char label[256];
    gt_graph_node_label(g, n, label, sizeof label);
    gt_status code =
        gt_error_set(err, g->err.code, "autodiff: gradient of %s: %s", label, g->err.msg);
    gt_error_clear(&g->err);
    return code;
}

/* active[v] = 1 for values on a float path from some wrt to loss (over the first nv values). */
static uint8_t *find_active(const gt_graph *g, gt_value_id loss, int n, const gt_value_id *wrt)
{
    int32_t nv = g->n_values;
    uint8_t *fwd = gt_xcalloc((size_t)nv, 1);
    uint8_t *bwd = gt_xcalloc((size_t)nv, 1);
    for (int i = 0; i < n; i++)
        if (gt_dtype_is_float(g->values[wrt[i]].type.dtype)) fwd[wrt[i]] = 1;
    for (gt_node_id k = 0; k < g->n_nodes; k++) {
        const gt_node *nd = &g->nodes[k];
        bool any = false;
        for (int j = 0; j < nd->n_in; j++)
            any |= fwd[nd->in[j]] != 0;
        /* NONDIFF outputs are constants (routing ids, counts, signs): no gradient path */
        if (!any || (gt_op_get(nd->op)->flags & GT_OPF_NONDIFF)) continue;
        for (int j = 0; j < nd->n_out; j++)
            if (gt_dtype_is_float(g->values[nd->out[j]].type.dtype)) fwd[nd->out[j]] = 1;
    }
    bwd[loss] = 1;
    for (gt_node_id k = g->n_nodes - 1; k >= 0; k--) {
        const gt_node *nd = &g->nodes[k];
        bool any = false;
        for (int j = 0; j < nd->n_out; j++)
            any |= bwd[nd->out[j]] != 0;
        if (!any) continue;
        for (int j = 0; j < nd->n_in; j++)
            bwd[nd->in[j]] = 1;
    }
    for (int32_t v = 0; v < nv; v++)
        fwd[v] = fwd[v] && bwd[v];
    free(bwd);
    return fwd;
}

/* Removes the nodes appended since (first_node, first_value) that no requested gradient needs,
 * renumbering the survivors' nodes and values (all of them are new, so nothing older refers to
 * them). grads[] is remapped in place. */
static void prune_backward(gt_graph *g, gt_node_id first_node, gt_value_id first_value, int n,
                           gt_value_id *grads)
{
    int32_t n_new_values = g->n_values - first_value;
    if (g->n_nodes == first_node) return;
    uint8_t *live = gt_xcalloc((size_t)n_new_values + 1, 1);
    uint8_t *keep = gt_xcalloc((size_t)(g->n_nodes - first_node), 1);
    for (int i = 0; i < n; i++)
        if (grads[i] >= first_value) live[grads[i] - first_value] = 1;
    for (gt_node_id k = g->n_nodes - 1; k >= first_node; k--) {
        const gt_node *nd = &g->nodes[k];
        bool any = false;
        for (int j = 0; j < nd->n_out; j++)
            any |= live[nd->out[j] - first_value] != 0;
        if (!any) continue;
        keep[k - first_node] = 1;
        for (int j = 0; j < nd->n_in; j++)
            if (nd->in[j] >= first_value) live[nd->in[j] - first_value] = 1;
    }
    /* Survivors keep their relative order, so every new index is <= the old one and the arrays
     * can be compacted in place, front to back. */
    gt_value_id *vmap = gt_xmalloc(sizeof(gt_value_id) * ((size_t)n_new_values + 1));
    for (int32_t v = 0; v < n_new_values; v++)
        vmap[v] = GT_NONE;
    gt_node_id next_node = first_node;
    gt_value_id next_value = first_value;
    for (gt_node_id k = first_node; k < g->n_nodes; k++) {
        if (!keep[k - first_node]) continue;
        gt_node nd = g->nodes[k];
        for (int j = 0; j < nd.n_in; j++)
            if (nd.in[j] >= first_value) nd.in[j] = vmap[nd.in[j] - first_value];
        for (int j = 0; j < nd.n_out; j++) {
            gt_value val = g->values[nd.out[j]];
            vmap[nd.out[j] - first_value] = next_value;
            val.producer = next_node;
            g->values[next_value] = val;
            nd.out[j] = next_value++;
        }
        g->nodes[next_node++] = nd;
    }
    g->n_nodes = next_node;
    g->n_values = next_value;
    for (int i = 0; i < n; i++)
        if (grads[i] >= first_value) grads[i] = vmap[grads[i] - first_value];
    free(vmap);
    free(keep);
    free(live);
}

/* Checks a rule's result against the input it is the gradient of: a broken rule is our bug, but
 * reporting it beats a wrong sum later. */
static gt_status check_grad_type(gt_graph *g, gt_node_id n, int slot, gt_value_id d, gt_error *err)
{
    const gt_type *want = gt_value_type(g, g->nodes[n].in[slot]);
    const gt_type *got = gt_value_type(g, d);
    if (gt_grad_same_type(want, got)) return GT_OK;
    char label[256], tw[160], tg[160];
    gt_graph_node_label(g, n, label, sizeof label);
    gt_graph_format_type(g, want, tw, sizeof tw);
    gt_graph_format_type(g, got, tg, sizeof tg);
    return gt_error_set(err, GT_ERR_INTERNAL,
                        "autodiff: gradient rule of %s gave %s for input %d, expected %s", label,
                        tg, slot, tw);
}

/* Steps 2 and 3 of the header comment: fills grad[] (indexed by the first nv values). */
static gt_status backward_walk(gt_graph *g, gt_value_id loss, const uint8_t *active,
                               gt_node_id n_fwd_nodes, gt_value_id *grad, gt_error *err)
{
    gt_node_id loss_node = g->values[loss].producer;
    g->cur_phase = GT_PHASE_BACKWARD;
    g->cur_origin = loss_node;
    g->cur_fqn = loss_node != GT_NONE ? g->nodes[loss_node].fqn : 0;
    g->cur_unit = loss_node != GT_NONE ? g->nodes[loss_node].unit : GT_UNIT_REST;
    gt_type lt = *gt_value_type(g, loss);
    grad[loss] = gt_full(g, lt.dtype, lt.ndim, lt.dims, 1.0);
    if (g->err.code != GT_OK) {
        gt_status code =
            gt_error_set(err, g->err.code, "autodiff: seeding the loss: %s", g->err.msg);
        gt_error_clear(&g->err);
        return code;
    }

    for (gt_node_id k = n_fwd_nodes - 1; k >= 0; k--) {
        gt_node nd = g->nodes[k];
        gt_value_id dout[GT_MAX_OUT], din[GT_MAX_IN];
        bool any = false;
        for (int j = 0; j < nd.n_out; j++) {
            dout[j] = active[nd.out[j]] ? grad[nd.out[j]] : GT_NONE;
            any |= dout[j] != GT_NONE;
        }
        if (!any) continue;
        for (int j = 0; j < GT_MAX_IN; j++)
            din[j] = GT_NONE;

        g->cur_origin = k;
        g->cur_fqn = nd.fqn;
        g->cur_unit = nd.unit;
        gt_status st = gt_grad_rules[nd.op](g, k, dout, din, err);
        if (st != GT_OK) {
            char label[256];
            gt_graph_node_label(g, k, label, sizeof label);
            gt_error_wrap(err, "autodiff: gradient of %s", label);
            gt_error_clear(&g->err);
            return st;
        }
        GT_TRY(take_builder_error(g, k, err));

        for (int j = 0; j < nd.n_in; j++) {
            gt_value_id v = nd.in[j];
            if (din[j] == GT_NONE || !active[v]) continue;
            GT_TRY(check_grad_type(g, k, j, din[j], err));
            grad[v] = grad[v] == GT_NONE ? din[j] : gt_add(g, grad[v], din[j]);
        }
        GT_TRY(take_builder_error(g, k, err));
    }
    return GT_OK;
}

gt_status gt_autodiff_wrt(gt_graph *g, gt_value_id loss, int n, const gt_value_id *wrt,
                          gt_value_id *grads, gt_error *err)
{
    if (g->err.code != GT_OK)
        return gt_error_set(err, GT_ERR_INVALID,
                            "autodiff: the graph has a pending builder error: %s", g->err.msg);
    if (loss < 0 || loss >= g->n_values)
        return gt_error_set(err, GT_ERR_INVALID,
                            "autodiff: loss %%%d is not a value of the graph "
                            "(it has %d values)",
                            loss, g->n_values);
    if (!gt_dtype_is_float(g->values[loss].type.dtype))
        return gt_error_set(err, GT_ERR_INVALID,
                            "autodiff: loss %%%d has dtype %s, expected a float", loss,
                            gt_dtype_name(g->values[loss].type.dtype));
    if (n < 0 || (n > 0 && (!wrt || !grads)))
        return gt_error_set(err, GT_ERR_INVALID, "autodiff: bad wrt list (n = %d)", n);
    for (int i = 0; i < n; i++)
        if (wrt[i] < 0 || wrt[i] >= g->n_values)
            return gt_error_set(err, GT_ERR_INVALID,
                                "autodiff: wrt[%d] = %%%d is not a value of the graph", i, wrt[i]);

    gt_node_id n_fwd_nodes = g->n_nodes;
    gt_value_id n_fwd_values = g->n_values;
    uint8_t *active = find_active(g, loss, n, wrt);
    gt_value_id *grad = gt_xmalloc(sizeof(gt_value_id) * (size_t)n_fwd_values);
    for (gt_value_id v = 0; v < n_fwd_values; v++)
        grad[v] = GT_NONE;
    for (int i = 0; i < n; i++)
        grads[i] = GT_NONE;

    gt_builder_state saved = gt_graph_builder_save(g);
    gt_status st = GT_OK;
    if (active[loss]) st = backward_walk(g, loss, active, n_fwd_nodes, grad, err);
    if (st == GT_OK)
        for (int i = 0; i < n; i++)
            grads[i] = active[wrt[i]] ? grad[wrt[i]] : GT_NONE;
    /* On failure every appended node is dead (grads all GT_NONE), so pruning drops them all and
     * the graph is left as it came. */
    prune_backward(g, n_fwd_nodes, n_fwd_values, n, grads);
    gt_graph_builder_restore(g, saved);
    free(grad);
    free(active);
    return st;
}

gt_status gt_autodiff(gt_graph *g, gt_error *err)
{
    gt_value_id loss = GT_NONE;
    int n_loss = 0;
    for (int32_t i = 0; i < g->n_outputs; i++) {
        if (g->outputs[i].kind != GT_OUT_LOSS) continue;
        loss = g->outputs[i].value;
        n_loss++;
    }
    if (n_loss != 1)
        return gt_error_set(err, GT_ERR_INVALID,
                            "autodiff: the graph has %d LOSS outputs, expected exactly one",
                            n_loss);

    int n_params = 0;
    for (int32_t i = 0; i < g->n_inputs; i++)
        n_params += g->inputs[i].kind == GT_IN_PARAM;
    gt_value_id *wrt = gt_xmalloc(sizeof(gt_value_id) * ((size_t)n_params + 1));
    gt_value_id *grads = gt_xmalloc(sizeof(gt_value_id) * ((size_t)n_params + 1));
    gt_str *fqns = gt_xmalloc(sizeof(gt_str) * ((size_t)n_params + 1));
    n_params = 0;
    for (int32_t i = 0; i < g->n_inputs; i++) {
        if (g->inputs[i].kind != GT_IN_PARAM) continue;
        fqns[n_params] = g->inputs[i].fqn;
        wrt[n_params++] = g->inputs[i].value;
    }

    gt_status st = gt_autodiff_wrt(g, loss, n_params, wrt, grads, err);
    gt_builder_state saved = gt_graph_builder_save(g);
    for (int i = 0; st == GT_OK && i < n_params; i++) {
        if (grads[i] == GT_NONE) {
            /* The loss does not depend on this param: its gradient is exactly zero. */
            g->cur_phase = GT_PHASE_BACKWARD;
            g->cur_origin = GT_NONE;
            g->cur_fqn = fqns[i];
            g->cur_unit = GT_UNIT_REST;
            gt_type t = *gt_value_type(g, wrt[i]);
            grads[i] = gt_full(g, t.dtype, t.ndim, t.dims, 0.0);
            if (grads[i] == GT_NONE) {
                st = gt_error_set(err, g->err.code, "autodiff: zero gradient of %s: %s",
                                  gt_graph_str(g, fqns[i]), g->err.msg);
                gt_error_clear(&g->err);
                break;
            }
        }
        /* Copy the name: interning may move the string table it points into. */
        char *name = gt_xstrdup(gt_graph_str(g, fqns[i]));
        gt_graph_add_output(g, GT_OUT_GRAD, name, grads[i]);
        free(name);
    }
    gt_graph_builder_restore(g, saved);
    free(fqns);
    free(grads);
    free(wrt);
    return st;
}
