/* canonicalize.c — local rewrites of views and no-op conversions to their simplest form.
 *
 * Contract
 *   requires   a verified graph (nodes in topological order).
 *   guarantees uses of these values read the simpler equivalent instead (the folded nodes are
 *              left dead for DCE; no id changes, no value changes type):
 *                reshape(x) to x's own dims            -> x
 *                reshape(reshape(x))                   -> reshape(x)   (then -> x if identity)
 *                transpose(x, d, d)                    -> x
 *                transpose(transpose(x, a, b), a, b)   -> x            (either order of a, b)
 *                permute(x, identity)                  -> x
 *                permute(permute(x, p), q)             -> permute(x, p∘q), or x when p∘q = id
 *                permute/transpose over permute/transpose: the same composition, the result a
 *                permute unless it is the identity (two non-cancelling transposes stay)
 *                slice(x, dim, 0, x.dims[dim])         -> x
 *                cast(x, x.dtype)                      -> x
 *              A rewrite is taken only when the op's shape rule, re-run on the rewritten node,
 *              gives exactly the stored output type (so symbolic dims the pool cannot prove
 *              equal just leave the node alone).
 *   numerics   exact: every rule drops or merges pure data movement (views, permutations,
 *              same-dtype casts, which round nothing) and never touches arithmetic.
 *
 * Composition of permutations: out.shape[k] = in.shape[perm[k]], so y = permute(x, p),
 * z = permute(y, q) gives z[k] = y[q[k]] = x[p[q[k]]]: the composite is c[k] = p[q[k]]. A transpose
 * (a, b) is the permutation that swaps a and b.
 *
 * One forward sweep: inputs are resolved through the replacement map before each node is looked
 * at, so a node always sees its operand's already-simplified producer and chains fold fully. */
#include <stdlib.h>
#include <string.h>

#include "passes/pass_internal.h"

/* The producer node of v when it is one of `op`, else NULL. */
static const gt_node *producer_of(const gt_graph *g, gt_value_id v, gt_op op)
{
    gt_node_id p = g->values[v].producer;
    if (p == GT_NONE || g->nodes[p].op != op) return NULL;
    return &g->nodes[p];
}

static bool is_view_perm(const gt_node *n)
{
    return n->op == GT_OP_TRANSPOSE || n->op == GT_OP_PERMUTE;
}

/* The permutation a transpose or permute node applies to an input of rank ndim. */
static bool node_perm(const gt_node *n, int ndim, int64_t *perm)
{
    if (ndim < 0 || ndim > GT_MAX_DIMS) return false;
    for (int k = 0; k < ndim; k++)
        perm[k] = k;
    if (n->op == GT_OP_TRANSPOSE) {
        int64_t a = n->attrs.i[0], b = n->attrs.i[1];
        if (n->attrs.ni < 2 || a < 0 || a >= ndim || b < 0 || b >= ndim) return false;
        perm[a] = b;
        perm[b] = a;
        return true;
    }
    if (n->attrs.ni != ndim) return false;
    for (int k = 0; k < ndim; k++) {
        if (n->attrs.i[k] < 0 || n->attrs.i[k] >= ndim) return false;
        perm[k] = n->attrs.i[k];
    }
    return true;
}

static bool perm_is_identity(const int64_t *perm, int ndim)
{
    for (int k = 0; k < ndim; k++)
        if (perm[k] != k) return false;
    return true;
}

/* Replaces node n's output by v when their types agree. */
static bool fold_to(gt_graph *g, gt_value_id *repl, const gt_node *n, gt_value_id v)
{
    if (!gt_pass_type_equal(&g->values[n->out[0]].type, &g->values[v].type)) return false;
    repl[n->out[0]] = v;
    return true;
}

static void canon_reshape(gt_graph *g, gt_value_id *repl, gt_node_id id)
{
    gt_node *n = &g->nodes[id];
    const gt_node *inner = producer_of(g, n->in[0], GT_OP_RESHAPE);
    if (inner) {
        gt_node proposed = *n;
        proposed.in[0] = inner->in[0];
        if (gt_pass_shape_matches(g, &proposed, n)) n->in[0] = inner->in[0];
    }
    fold_to(g, repl, n, n->in[0]);
}

static void canon_permutation(gt_graph *g, gt_value_id *repl, gt_node_id id)
{
    gt_node *n = &g->nodes[id];
    int ndim = g->values[n->in[0]].type.ndim;
    int64_t outer[GT_MAX_DIMS];
    if (!node_perm(n, ndim, outer)) return;
    if (perm_is_identity(outer, ndim)) {
        fold_to(g, repl, n, n->in[0]);
        return;
    }
    gt_node_id pid = g->values[n->in[0]].producer;
    if (pid == GT_NONE || !is_view_perm(&g->nodes[pid])) return;
    const gt_node *inner = &g->nodes[pid];
    int64_t p[GT_MAX_DIMS], c[GT_MAX_DIMS];
    if (!node_perm(inner, g->values[inner->in[0]].type.ndim, p)) return;
    for (int k = 0; k < ndim; k++)
        c[k] = p[outer[k]];
    if (perm_is_identity(c, ndim)) {
        fold_to(g, repl, n, inner->in[0]);
        return;
    }
    /* Two transposes of different dim pairs stay as they are: the result is no simpler. */
    if (n->op == GT_OP_TRANSPOSE && inner->op == GT_OP_TRANSPOSE) return;
    gt_node proposed = *n;
    proposed.op = GT_OP_PERMUTE;
    proposed.in[0] = inner->in[0];
    memset(&proposed.attrs, 0, sizeof proposed.attrs);
    proposed.attrs.ni = (uint8_t)ndim;
    for (int k = 0; k < ndim; k++)
        proposed.attrs.i[k] = c[k];
    if (gt_pass_shape_matches(g, &proposed, n)) *n = proposed;
}

static void canon_slice(gt_graph *g, gt_value_id *repl, gt_node_id id)
{
    const gt_node *n = &g->nodes[id];
    const gt_type *in = &g->values[n->in[0]].type;
    int64_t dim = n->attrs.i[0], start;
    if (n->attrs.ni < 1 || n->attrs.ne < 2 || dim < 0 || dim >= in->ndim) return;
    if (!gt_sym_is_const(g->sym, n->attrs.e[0], &start) || start != 0) return;
    if (n->attrs.e[1] != in->dims[dim]) return;
    fold_to(g, repl, n, n->in[0]);
}

static void canon_cast(gt_graph *g, gt_value_id *repl, gt_node_id id)
{
    const gt_node *n = &g->nodes[id];
    if (n->attrs.ni >= 1 && n->attrs.i[0] == (int64_t)g->values[n->in[0]].type.dtype)
        fold_to(g, repl, n, n->in[0]);
}

gt_status gt_pass_canonicalize(gt_graph *g, const gt_pass_ctx *ctx, gt_error *err)
{
    (void)ctx;
    (void)err;
    gt_value_id *repl = gt_pass_repl_new(g);
    for (gt_node_id id = 0; id < g->n_nodes; id++) {
        gt_pass_repl_node_inputs(g, id, repl);
        switch (g->nodes[id].op) {
        case GT_OP_RESHAPE:
            canon_reshape(g, repl, id);
            break;
        case GT_OP_TRANSPOSE:
        case GT_OP_PERMUTE:
            canon_permutation(g, repl, id);
            break;
        case GT_OP_SLICE:
            canon_slice(g, repl, id);
            break;
        case GT_OP_CAST:
            canon_cast(g, repl, id);
            break;
        default:
            break;
        }
    }
    gt_pass_repl_outputs(g, repl);
    free(repl);
    return GT_OK;
}
