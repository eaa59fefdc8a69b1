/* shape_rules_shard.c — shape rules of the vocabulary-parallel local ops (semantics in
 * gt_ops.def): embedding_shard, embedding_shard_backward, logsumexp, cross_entropy_shard and
 * cross_entropy_shard_backward. A rank holds vocabulary rows [start, start + Vl); the offsets
 * (row_start, vocab_start) are expressions of the rank's coordinate, so they only need to be
 * valid sizes here — the kernels see them evaluated. */
#include "ir/ir_internal.h"

/* (w: [Vl, D] float, ids: [...] i32/i64) -> [..., D] of w's dtype: embedding's rule, plus a
 * row_start that is a size. */
gt_status gt_shape_embedding_shard(gt_graph *g, const gt_node *n, gt_type *out, int *n_out,
                                   gt_error *err)
{
    GT_TRY(gt_shape_need_size(g, n, "row_start", n->attrs.e[0], err));
    return gt_shape_embedding(g, n, out, n_out, err);
}

/* (ids: [...], dy: [..., D] float) -> dw: [num_embeddings, D] of dy's dtype: embedding_backward's
 * rule (num_embeddings is attribute e[0] in both), plus a row_start that is a size. */
gt_status gt_shape_embedding_shard_backward(gt_graph *g, const gt_node *n, gt_type *out, int *n_out,
                                            gt_error *err)
{
    GT_TRY(gt_shape_need_size(g, n, "row_start", n->attrs.e[1], err));
    return gt_shape_embedding_backward(g, n, out, n_out, err);
}

/* (x: [..., V] float) -> f32 [...]: the last dim is reduced away. */
gt_status gt_shape_logsumexp(gt_graph *g, const gt_node *n, gt_type *out, int *n_out, gt_error *err)
{
    GT_TRY(gt_shape_need_float(g, n, 0, err));
    const gt_type *x = gt_shape_in(g, n, 0);
    if (x->ndim < 1) {
        char xs[160];
        return gt_shape_fail(g, n, err, GT_ERR_SHAPE, "x must have rank >= 1, got %s",
                             gt_type_str(g, x, xs, sizeof xs));
    }
    out[0] = *x;
    out[0].dtype = GT_F32;
    out[0].ndim = x->ndim - 1;
    *n_out = 1;
    return GT_OK;
}

/* logits: [N, Vl] float, targets: [N] i32/i64, lse: f32 [N]. */
static gt_status ce_shard_inputs(gt_graph *g, const gt_node *n, gt_error *err)
{
    GT_TRY(gt_shape_need_float(g, n, 0, err));
    GT_TRY(gt_shape_need_rank(g, n, 0, 2, err));
    GT_TRY(gt_shape_need_index(g, n, 1, err));
    GT_TRY(gt_shape_need_rank(g, n, 1, 1, err));
    GT_TRY(gt_shape_need_rank(g, n, 2, 1, err));
    GT_TRY(gt_shape_need_size(g, n, "vocab_start", n->attrs.e[0], err));
    const gt_type *l = gt_shape_in(g, n, 0), *t = gt_shape_in(g, n, 1), *s = gt_shape_in(g, n, 2);
    char ls[160], ts[160];
    if (s->dtype != GT_F32)
        return gt_shape_fail(g, n, err, GT_ERR_SHAPE, "lse must be f32, got %s",
                             gt_type_str(g, s, ts, sizeof ts));
    if (l->dims[0] != t->dims[0])
        return gt_shape_fail(g, n, err, GT_ERR_SHAPE, "logits %s and targets %s differ in N",
                             gt_type_str(g, l, ls, sizeof ls), gt_type_str(g, t, ts, sizeof ts));
    if (l->dims[0] != s->dims[0])
        return gt_shape_fail(g, n, err, GT_ERR_SHAPE, "logits %s and lse %s differ in N",
                             gt_type_str(g, l, ls, sizeof ls), gt_type_str(g, s, ts, sizeof ts));
    return GT_OK;
}

/* -> f32 scalar: this rank's part of the mean cross-entropy. */
gt_status gt_shape_cross_entropy_shard(gt_graph *g, const gt_node *n, gt_type *out, int *n_out,
                                       gt_error *err)
{
    GT_TRY(ce_shard_inputs(g, n, err));
    out[0].dtype = GT_F32;
    out[0].ndim = 0;
    *n_out = 1;
    return GT_OK;
}

/* (logits, targets, lse, dloss: [] float) -> dlogits like logits. */
gt_status gt_shape_cross_entropy_shard_backward(gt_graph *g, const gt_node *n, gt_type *out,
                                                int *n_out, gt_error *err)
{
    GT_TRY(ce_shard_inputs(g, n, err));
    GT_TRY(gt_shape_need_float(g, n, 3, err));
    GT_TRY(gt_shape_need_rank(g, n, 3, 0, err));
    out[0] = *gt_shape_in(g, n, 0);
    *n_out = 1;
    return GT_OK;
}
