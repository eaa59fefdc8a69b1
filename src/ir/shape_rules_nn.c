/* shape_rules_nn.c — shape/dtype rules for the neural-network ops: matmul, rms_norm, rope, sdpa,
 * softmax, cross_entropy, embedding and their backward ops (semantics in gt_ops.def). */
#include <math.h>

#include "ir/ir_internal.h"

static gt_status need_flag(gt_graph *g, const gt_node *n, const char *what, int64_t v,
                           gt_error *err)
{
    if (v == 0 || v == 1) return GT_OK;
    return gt_shape_fail(g, n, err, GT_ERR_INVALID, "%s must be 0 or 1, got %lld", what,
                         (long long)v);
}

static gt_status need_min_rank(gt_graph *g, const gt_node *n, int k, const char *name, int rank,
                               gt_error *err)
{
    const gt_type *t = gt_shape_in(g, n, k);
    if (t->ndim >= rank) return GT_OK;
    char ts[160];
    return gt_shape_fail(g, n, err, GT_ERR_SHAPE, "%s must have rank >= %d, got %s", name, rank,
                         gt_type_str(g, t, ts, sizeof ts));
}

/* ---------------------------------------------------------------- matmul */

/* op(a) @ op(b) with op = swap of the last two dims when the flag is set:
 * op(a): [..., m, k], op(b): [..., k, n] -> [..., m, n]. b of rank 2 broadcasts over a's leading
 * dims; otherwise a and b have the same rank and identical leading dims. */
gt_status gt_shape_matmul(gt_graph *g, const gt_node *n, gt_type *out, int *n_out, gt_error *err)
{
    GT_TRY(gt_shape_need_float(g, n, 0, err));
    GT_TRY(gt_shape_need_same_dtype(g, n, 0, 1, err));
    GT_TRY(need_min_rank(g, n, 0, "a", 2, err));
    GT_TRY(need_min_rank(g, n, 1, "b", 2, err));
    GT_TRY(need_flag(g, n, "trans_a", n->attrs.i[0], err));
    GT_TRY(need_flag(g, n, "trans_b", n->attrs.i[1], err));
    const gt_type *a = gt_shape_in(g, n, 0), *b = gt_shape_in(g, n, 1);
    bool ta = n->attrs.i[0] != 0, tb = n->attrs.i[1] != 0;
    int ra = a->ndim, rb = b->ndim;
    gt_expr m = a->dims[ra - (ta ? 1 : 2)], ka = a->dims[ra - (ta ? 2 : 1)];
    gt_expr kb = b->dims[rb - (tb ? 1 : 2)], nb = b->dims[rb - (tb ? 2 : 1)];
    char as[160], bs[160];
    if (rb != 2) {
        bool ok = ra == rb;
        for (int d = 0; ok && d < ra - 2; d++)
            ok = a->dims[d] == b->dims[d];
        if (!ok)
            return gt_shape_fail(g, n, err, GT_ERR_SHAPE,
                                 "batch dims differ: b must be rank 2 or match a's leading dims "
                                 "(a: %s, b: %s)",
                                 gt_type_str(g, a, as, sizeof as),
                                 gt_type_str(g, b, bs, sizeof bs));
    }
    if (ka != kb) {
        char ks[64], ls[64];
        return gt_shape_fail(g, n, err, GT_ERR_SHAPE, "inner dims differ: %s vs %s (a: %s, b: %s)",
                             gt_expr_str(g, ka, ks, sizeof ks), gt_expr_str(g, kb, ls, sizeof ls),
                             gt_type_str(g, a, as, sizeof as), gt_type_str(g, b, bs, sizeof bs));
    }
    out[0] = *a;
    out[0].dims[ra - 2] = m;
    out[0].dims[ra - 1] = nb;
    *n_out = 1;
    return GT_OK;
}

/* ---------------------------------------------------------------- rms_norm */

/* x: [..., D] float, w: [D] of x's dtype. */
static gt_status rms_norm_inputs(gt_graph *g, const gt_node *n, gt_error *err)
{
    GT_TRY(gt_shape_need_float(g, n, 0, err));
    GT_TRY(gt_shape_need_same_dtype(g, n, 0, 1, err));
    GT_TRY(need_min_rank(g, n, 0, "x", 1, err));
    GT_TRY(gt_shape_need_rank(g, n, 1, 1, err));
    const gt_type *x = gt_shape_in(g, n, 0), *w = gt_shape_in(g, n, 1);
    if (w->dims[0] != x->dims[x->ndim - 1]) {
        char xs[160], ws[160];
        return gt_shape_fail(g, n, err, GT_ERR_SHAPE, "weight %s does not match last dim of x %s",
                             gt_type_str(g, w, ws, sizeof ws), gt_type_str(g, x, xs, sizeof xs));
    }
    double eps = n->attrs.f[0];
    if (!(eps >= 0))
        return gt_shape_fail(g, n, err, GT_ERR_INVALID, "eps must be >= 0, got %g", eps);
    return GT_OK;
}

gt_status gt_shape_rms_norm(gt_graph *g, const gt_node *n, gt_type *out, int *n_out, gt_error *err)
{
    GT_TRY(rms_norm_inputs(g, n, err));
    out[0] = *gt_shape_in(g, n, 0);
    *n_out = 1;
    return GT_OK;
}

/* (a, b, w) -> (h like a, y like h): a and b of one type (no broadcasting), w as for rms_norm of h
 * (the rule checks it on a, which has h's type). */
gt_status gt_shape_add_rms_norm(gt_graph *g, const gt_node *n, gt_type *out, int *n_out,
                                gt_error *err)
{
    GT_TRY(gt_shape_need_float(g, n, 1, err));
    GT_TRY(gt_shape_need_same_type(g, n, 0, 1, err));
    gt_node m = *n; /* (a, w) as rms_norm's (x, w) */
    m.in[1] = n->in[2];
    m.n_in = 2;
    GT_TRY(rms_norm_inputs(g, &m, err));
    out[0] = out[1] = *gt_shape_in(g, n, 0);
    *n_out = 2;
    return GT_OK;
}

/* (x, w, dy) -> (dx like x, dw like w). */
gt_status gt_shape_rms_norm_backward(gt_graph *g, const gt_node *n, gt_type *out, int *n_out,
                                     gt_error *err)
{
    GT_TRY(rms_norm_inputs(g, n, err));
    GT_TRY(gt_shape_need_same_type(g, n, 0, 2, err));
    out[0] = *gt_shape_in(g, n, 0);
    out[1] = *gt_shape_in(g, n, 1);
    *n_out = 2;
    return GT_OK;
}

/* (x, w, r, d0[, d1[, d2]]) -> (dx like x, dw like w): x and w as for rms_norm; r and every term
 * of dy have x's type (no broadcasting: they are the operands of the adds it replaces). */
gt_status gt_shape_rms_norm_backward_add(gt_graph *g, const gt_node *n, gt_type *out, int *n_out,
                                         gt_error *err)
{
    if (n->n_in < 4 || n->n_in > 6)
        return gt_shape_fail(g, n, err, GT_ERR_SHAPE,
                             "expected 4 to 6 inputs (x, w, r, d0[, d1[, d2]]), got %d", n->n_in);
    GT_TRY(rms_norm_inputs(g, n, err));
    for (int k = 2; k < n->n_in; k++)
        GT_TRY(gt_shape_need_same_type(g, n, 0, k, err));
    out[0] = *gt_shape_in(g, n, 0);
    out[1] = *gt_shape_in(g, n, 1);
    *n_out = 2;
    return GT_OK;
}

/* ---------------------------------------------------------------- positions */

/* Input k, when present, is the per-token positions of a packed batch: i64 [b, s] with the b and
 * s of the tokens it positions (rope, sdpa; gt_ops.def). */
static gt_status need_positions(gt_graph *g, const gt_node *n, int k, gt_expr b, gt_expr s,
                                gt_error *err)
{
    const gt_type *p = gt_shape_in(g, n, k);
    if (p->dtype == GT_I64 && p->ndim == 2 && p->dims[0] == b && p->dims[1] == s) return GT_OK;
    char ps[160];
    return gt_shape_fail(g, n, err, GT_ERR_SHAPE,
                         "positions (input %d) must be i64 [batch, seq] of the tokens, got %s", k,
                         gt_type_str(g, p, ps, sizeof ps));
}

/* ---------------------------------------------------------------- rope */

/* x: [b, s, h, d] float, d even (pairs (j, j + d/2), or (2j, 2j + 1) interleaved). Schema
 * "i:inverse,original_max_position,scaling?,interleaved? f:theta,factor,low_freq_factor,
 * high_freq_factor"; YaRN (scaling 2) reads beta_fast / beta_slow from the last two floats. The
 * llama3.1 scaling interpolates between the wavelengths original_max_position / low_freq_factor and
 * / high_freq_factor, so it needs factor > 0 and high_freq_factor > low_freq_factor > 0. */
gt_status gt_shape_rope(gt_graph *g, const gt_node *n, gt_type *out, int *n_out, gt_error *err)
{
    if (n->n_in != 1 && n->n_in != 2)
        return gt_shape_fail(g, n, err, GT_ERR_INVALID,
                             "takes x and optional positions, got %d "
                             "inputs",
                             n->n_in);
    GT_TRY(gt_shape_need_float(g, n, 0, err));
    GT_TRY(gt_shape_need_rank(g, n, 0, 4, err));
    GT_TRY(need_flag(g, n, "inverse", n->attrs.i[0], err));
    const gt_type *x = gt_shape_in(g, n, 0);
    if (n->n_in == 2) GT_TRY(need_positions(g, n, 1, x->dims[0], x->dims[1], err));
    int64_t d;
    if (gt_sym_is_const(g->sym, x->dims[3], &d) && d % 2 != 0)
        return gt_shape_fail(g, n, err, GT_ERR_SHAPE, "head dim %lld must be even", (long long)d);
    double theta = n->attrs.f[0], factor = n->attrs.f[1];
    double lo = n->attrs.f[2], hi = n->attrs.f[3];
    if (!(theta > 0) || !isfinite(theta))
        return gt_shape_fail(g, n, err, GT_ERR_INVALID, "theta must be > 0, got %g", theta);
    int64_t omp = n->attrs.i[1];
    if (omp < 0)
        return gt_shape_fail(g, n, err, GT_ERR_INVALID, "original_max_position %lld < 0",
                             (long long)omp);
    int64_t scaling = n->attrs.ni > 2 ? n->attrs.i[2] : 0;
    if (scaling != 0 && scaling != 2)
        return gt_shape_fail(g, n, err, GT_ERR_INVALID, "scaling must be 0 or 2 (YaRN), got %lld",
                             (long long)scaling);
    if (n->attrs.ni > 3) GT_TRY(need_flag(g, n, "interleaved", n->attrs.i[3], err));
    if (scaling == 2 && !(omp > 0 && factor > 0 && lo > 0 && hi > 0 && isfinite(lo) &&
                          isfinite(hi) && isfinite(factor)))
        return gt_shape_fail(g, n, err, GT_ERR_INVALID,
                             "YaRN needs original_max_position > 0, factor > 0, beta_fast > 0 "
                             "and beta_slow > 0, got %lld, factor=%g beta_fast=%g beta_slow=%g",
                             (long long)omp, factor, lo, hi);
    if (scaling == 0 && omp > 0 && !(factor > 0 && lo > 0 && hi > lo))
        return gt_shape_fail(g, n, err, GT_ERR_INVALID,
                             "llama3.1 scaling needs factor > 0 and high_freq_factor > "
                             "low_freq_factor > 0, got factor=%g low=%g high=%g",
                             factor, lo, hi);
    out[0] = *x;
    *n_out = 1;
    return GT_OK;
}

/* ---------------------------------------------------------------- sdpa */

/* Layout 0: q [b, hq, s, d], k [b, hkv, t, d], v [b, hkv, t, dv]; layout 1: q [b, s, hq, d],
 * k [b, t, hkv, d], v [b, t, hkv, dv]. One float dtype, hq % hkv == 0 when both are constants.
 * Fills out: q's layout with dv as the last dim (q's dtype) and lse: f32 [b, hq, s] (both
 * layouts). */
static gt_status sdpa_types(gt_graph *g, const gt_node *n, gt_type *o, gt_type *lse, gt_error *err)
{
    int base = n->op == GT_OP_SDPA ? 3 : 6; /* inputs before the optional positions */
    if (n->n_in != base && n->n_in != base + 1)
        return gt_shape_fail(g, n, err, GT_ERR_INVALID, "takes %d inputs (+ positions), got %d",
                             base, n->n_in);
    GT_TRY(gt_shape_need_float(g, n, 0, err));
    GT_TRY(gt_shape_need_same_dtype(g, n, 0, 1, err));
    GT_TRY(gt_shape_need_same_dtype(g, n, 0, 2, err));
    for (int k = 0; k < 3; k++)
        GT_TRY(gt_shape_need_rank(g, n, k, 4, err));
    GT_TRY(need_flag(g, n, "causal", n->attrs.i[0], err));
    int64_t layout = n->attrs.i[1];
    if (layout != 0 && layout != 1)
        return gt_shape_fail(g, n, err, GT_ERR_INVALID,
                             "layout must be 0 ([b, heads, seq, d]) or 1 ([b, seq, heads, d]), "
                             "got %lld",
                             (long long)layout);
    int hd = layout ? 2 : 1, sd = layout ? 1 : 2; /* heads and sequence dims */
    const gt_type *q = gt_shape_in(g, n, 0), *k = gt_shape_in(g, n, 1), *v = gt_shape_in(g, n, 2);
    const char *why = NULL;
    if (q->dims[0] != k->dims[0] || q->dims[0] != v->dims[0])
        why = "batch dims differ";
    else if (k->dims[hd] != v->dims[hd])
        why = "k and v have different head counts";
    else if (k->dims[sd] != v->dims[sd])
        why = "k and v have different lengths";
    else if (q->dims[3] != k->dims[3])
        why = "q and k head dims differ";
    int64_t hq, hkv;
    if (!why && gt_sym_is_const(g->sym, q->dims[hd], &hq) &&
        gt_sym_is_const(g->sym, k->dims[hd], &hkv) && (hkv <= 0 || hq % hkv != 0))
        why = "query heads are not a multiple of kv heads";
    if (why) {
        char qs[160], ks[160], vs[160];
        return gt_shape_fail(g, n, err, GT_ERR_SHAPE, "%s (layout %lld: %s; q: %s, k: %s, v: %s)",
                             why, (long long)layout,
                             layout ? "q [b, s, hq, d], k [b, t, hkv, d], v [b, t, hkv, dv]"
                                    : "q [b, hq, s, d], k [b, hkv, t, d], v [b, hkv, t, dv]",
                             gt_type_str(g, q, qs, sizeof qs), gt_type_str(g, k, ks, sizeof ks),
                             gt_type_str(g, v, vs, sizeof vs));
    }
    if (n->n_in == base + 1) {
        if (n->attrs.i[0] != 1 || q->dims[sd] != k->dims[sd])
            return gt_shape_fail(g, n, err, GT_ERR_INVALID,
                                 "document masks (positions) need causal = 1 and as many keys "
                                 "as queries");
        GT_TRY(need_positions(g, n, base, q->dims[0], q->dims[sd], err));
    }
    *o = *q;
    o->dims[3] = v->dims[3];
    lse->dtype = GT_F32;
    lse->ndim = 3;
    lse->dims[0] = q->dims[0];
    lse->dims[1] = q->dims[hd];
    lse->dims[2] = q->dims[sd];
    return GT_OK;
}

gt_status gt_shape_sdpa(gt_graph *g, const gt_node *n, gt_type *out, int *n_out, gt_error *err)
{
    GT_TRY(sdpa_types(g, n, &out[0], &out[1], err));
    *n_out = 2;
    return GT_OK;
}

/* (q, k, v, out, lse, dout[, positions]) -> (dq, dk, dv); out, lse, dout as sdpa produced them. */
gt_status gt_shape_sdpa_backward(gt_graph *g, const gt_node *n, gt_type *out, int *n_out,
                                 gt_error *err)
{
    gt_type o, lse;
    GT_TRY(sdpa_types(g, n, &o, &lse, err));
    static const char *const names[3] = {"out", "lse", "dout"};
    for (int k = 3; k < 6; k++) {
        const gt_type *t = gt_shape_in(g, n, k), *want = k == 4 ? &lse : &o;
        if (!gt_type_equal(t, want)) {
            char ts[160], ws[160];
            return gt_shape_fail(g, n, err, GT_ERR_SHAPE, "%s is %s, expected %s", names[k - 3],
                                 gt_type_str(g, t, ts, sizeof ts),
                                 gt_type_str(g, want, ws, sizeof ws));
        }
    }
    for (int k = 0; k < 3; k++)
        out[k] = *gt_shape_in(g, n, k);
    *n_out = 3;
    return GT_OK;
}

/* ---------------------------------------------------------------- softmax */

gt_status gt_shape_softmax(gt_graph *g, const gt_node *n, gt_type *out, int *n_out, gt_error *err)
{
    GT_TRY(gt_shape_need_float(g, n, 0, err));
    const gt_type *x = gt_shape_in(g, n, 0);
    GT_TRY(gt_shape_need_dim(g, n, "dim", n->attrs.i[0], x->ndim, err));
    out[0] = *x;
    *n_out = 1;
    return GT_OK;
}

/* (y, dy) -> dx; y and dy of one float type. */
gt_status gt_shape_softmax_backward(gt_graph *g, const gt_node *n, gt_type *out, int *n_out,
                                    gt_error *err)
{
    GT_TRY(gt_shape_need_float(g, n, 0, err));
    GT_TRY(gt_shape_need_same_type(g, n, 0, 1, err));
    const gt_type *y = gt_shape_in(g, n, 0);
    GT_TRY(gt_shape_need_dim(g, n, "dim", n->attrs.i[0], y->ndim, err));
    out[0] = *y;
    *n_out = 1;
    return GT_OK;
}

/* ---------------------------------------------------------------- cross entropy */

/* logits: [N, V] float, targets: [N] i32/i64. */
static gt_status cross_entropy_inputs(gt_graph *g, const gt_node *n, gt_error *err)
{
    GT_TRY(gt_shape_need_float(g, n, 0, err));
    GT_TRY(gt_shape_need_rank(g, n, 0, 2, err));
    GT_TRY(gt_shape_need_index(g, n, 1, err));
    GT_TRY(gt_shape_need_rank(g, n, 1, 1, err));
    const gt_type *l = gt_shape_in(g, n, 0), *t = gt_shape_in(g, n, 1);
    if (l->dims[0] != t->dims[0]) {
        char ls[160], ts[160];
        return gt_shape_fail(g, n, err, GT_ERR_SHAPE, "logits %s and targets %s differ in N",
                             gt_type_str(g, l, ls, sizeof ls), gt_type_str(g, t, ts, sizeof ts));
    }
    return GT_OK;
}

/* -> f32 scalar (rank 0), whatever the logits dtype: the mean is accumulated in f32. */
gt_status gt_shape_cross_entropy(gt_graph *g, const gt_node *n, gt_type *out, int *n_out,
                                 gt_error *err)
{
    GT_TRY(cross_entropy_inputs(g, n, err));
    out[0].dtype = GT_F32;
    out[0].ndim = 0;
    *n_out = 1;
    return GT_OK;
}

/* (logits, targets, dloss: [] float) -> dlogits like logits. */
gt_status gt_shape_cross_entropy_backward(gt_graph *g, const gt_node *n, gt_type *out, int *n_out,
                                          gt_error *err)
{
    GT_TRY(cross_entropy_inputs(g, n, err));
    GT_TRY(gt_shape_need_float(g, n, 2, err));
    GT_TRY(gt_shape_need_rank(g, n, 2, 0, err));
    out[0] = *gt_shape_in(g, n, 0);
    *n_out = 1;
    return GT_OK;
}

/* (logits, targets, dloss: [] float) -> (loss: f32 [], dlogits like logits). */
gt_status gt_shape_cross_entropy_with_grad(gt_graph *g, const gt_node *n, gt_type *out, int *n_out,
                                           gt_error *err)
{
    GT_TRY(gt_shape_cross_entropy_backward(g, n, &out[1], n_out, err));
    GT_TRY(gt_shape_cross_entropy(g, n, &out[0], n_out, err));
    *n_out = 2;
    return GT_OK;
}

/* ---------------------------------------------------------------- embedding */

/* (w: [V, D] float, ids: [...] i32/i64) -> [..., D] of w's dtype. */
gt_status gt_shape_embedding(gt_graph *g, const gt_node *n, gt_type *out, int *n_out, gt_error *err)
{
    GT_TRY(gt_shape_need_float(g, n, 0, err));
    GT_TRY(gt_shape_need_rank(g, n, 0, 2, err));
    GT_TRY(gt_shape_need_index(g, n, 1, err));
    const gt_type *w = gt_shape_in(g, n, 0), *ids = gt_shape_in(g, n, 1);
    if (ids->ndim + 1 > GT_MAX_DIMS)
        return gt_shape_fail(g, n, err, GT_ERR_SHAPE, "ids rank %d leaves no room for D",
                             ids->ndim);
    out[0] = *ids;
    out[0].dtype = w->dtype;
    out[0].dims[out[0].ndim++] = w->dims[1];
    *n_out = 1;
    return GT_OK;
}

/* (ids: [...], dy: [..., D]) -> dw: [num_embeddings, D] of dy's dtype. */
gt_status gt_shape_embedding_backward(gt_graph *g, const gt_node *n, gt_type *out, int *n_out,
                                      gt_error *err)
{
    GT_TRY(gt_shape_need_index(g, n, 0, err));
    GT_TRY(gt_shape_need_float(g, n, 1, err));
    GT_TRY(gt_shape_need_size(g, n, "num_embeddings", n->attrs.e[0], err));
    const gt_type *ids = gt_shape_in(g, n, 0), *dy = gt_shape_in(g, n, 1);
    bool ok = dy->ndim == ids->ndim + 1;
    for (int d = 0; ok && d < ids->ndim; d++)
        ok = dy->dims[d] == ids->dims[d];
    if (!ok) {
        char is[160], ds[160];
        return gt_shape_fail(g, n, err, GT_ERR_SHAPE, "dy %s must be ids %s plus a last dim D",
                             gt_type_str(g, dy, ds, sizeof ds), gt_type_str(g, ids, is, sizeof is));
    }
    out[0].dtype = dy->dtype;
    out[0].ndim = 2;
    out[0].dims[0] = n->attrs.e[0];
    out[0].dims[1] = dy->dims[dy->ndim - 1];
    *n_out = 1;
    return GT_OK;
}
