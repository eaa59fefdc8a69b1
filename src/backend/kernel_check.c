/* kernel_check.c — argument checks and shape helpers shared by the backends (kernel_check.h). */
#include "kernel_check.h"

#include <math.h>
#include <string.h>

/* Backends depend on core only (DESIGN.md §2): the names come from the op table itself, not
 * from the IR's gt_op_get. */
static const char *const gt_kernel_op_names[GT_OP_COUNT] = {
#define X(E, name, nin, nout, flags, rule, alias, pairs, recompute, schema) #name,
#include "graphtrain/gt_ops.def"
#undef X
};

const char *gt_kernel_op_name(gt_op op)
{
    return (unsigned)op < GT_OP_COUNT ? gt_kernel_op_names[op] : "?";
}

const char *gt_kernel_fmt(const gt_tensor *t, char *buf, size_t n)
{
    gt_tensor_format_type(t, buf, n);
    return buf;
}

gt_status gt_kernel_want_float(const gt_kernel_call *c, const gt_tensor *t, const char *what,
                               gt_error *err)
{
    if (gt_dtype_is_float(t->dtype)) return GT_OK;
    char b[128];
    return gt_error_set(err, GT_ERR_SHAPE, "%s: %s is %s, expected a float tensor",
                        gt_kernel_op_name(c->op), what, gt_kernel_fmt(t, b, sizeof b));
}

gt_status gt_kernel_want_index(const gt_kernel_call *c, const gt_tensor *t, const char *what,
                               gt_error *err)
{
    if (t->dtype == GT_I32 || t->dtype == GT_I64) return GT_OK;
    char b[128];
    return gt_error_set(err, GT_ERR_SHAPE, "%s: %s is %s, expected i32 or i64",
                        gt_kernel_op_name(c->op), what, gt_kernel_fmt(t, b, sizeof b));
}

gt_status gt_kernel_want_same_shape(const gt_kernel_call *c, const gt_tensor *a, const char *what_a,
                                    const gt_tensor *b, const char *what_b, gt_error *err)
{
    bool same = a->ndim == b->ndim;
    for (int d = 0; same && d < a->ndim; d++)
        same = a->shape[d] == b->shape[d];
    if (same) return GT_OK;
    char ba[128], bb[128];
    return gt_error_set(err, GT_ERR_SHAPE, "%s: %s is %s but %s is %s, expected the same shape",
                        gt_kernel_op_name(c->op), what_a, gt_kernel_fmt(a, ba, sizeof ba), what_b,
                        gt_kernel_fmt(b, bb, sizeof bb));
}

gt_status gt_kernel_want_rank(const gt_kernel_call *c, const gt_tensor *t, const char *what,
                              int ndim, gt_error *err)
{
    if (t->ndim == ndim) return GT_OK;
    char b[128];
    return gt_error_set(err, GT_ERR_SHAPE, "%s: %s is %s, expected rank %d",
                        gt_kernel_op_name(c->op), what, gt_kernel_fmt(t, b, sizeof b), ndim);
}

gt_status gt_kernel_want_same_dtype(const gt_kernel_call *c, const gt_tensor *a, const char *what_a,
                                    const gt_tensor *b, const char *what_b, gt_error *err)
{
    if (a->dtype == b->dtype) return GT_OK;
    return gt_error_set(err, GT_ERR_SHAPE, "%s: %s is %s but %s is %s, expected the same dtype",
                        gt_kernel_op_name(c->op), what_a, gt_dtype_name(a->dtype), what_b,
                        gt_dtype_name(b->dtype));
}

gt_status gt_kernel_check_call(const gt_kernel_call *c, int n_in, int n_out, gt_error *err)
{
    const char *name = gt_kernel_op_name(c->op);
    bool in_ok = n_in >= 0 ? c->n_in == n_in : c->n_in >= 1 && c->n_in <= GT_MAX_IN;
    bool out_ok = n_out >= 0 ? c->n_out == n_out : c->n_out >= 1 && c->n_out <= GT_MAX_OUT;
    if (!in_ok || !out_ok)
        return gt_error_set(err, GT_ERR_INVALID, "%s: called with %d inputs and %d outputs", name,
                            c->n_in, c->n_out);
    if (c->ni < 0 || c->ni > GT_MAX_IATTR || c->nf < 0 || c->nf > GT_MAX_FATTR || c->ne < 0 ||
        c->ne > GT_MAX_EATTR)
        return gt_error_set(err, GT_ERR_INVALID, "%s: attribute counts %d/%d/%d out of range", name,
                            c->ni, c->nf, c->ne);
    for (int k = 0; k < c->n_in + c->n_out; k++) {
        const gt_tensor *t = k < c->n_in ? c->in[k] : c->out[k - c->n_in];
        if (!t || t->ndim < 0 || t->ndim > GT_MAX_DIMS || gt_tensor_numel(t) < 0 ||
            (unsigned)t->dtype >= GT_DTYPE_COUNT || (t->data == NULL && gt_tensor_numel(t) > 0))
            return gt_error_set(err, GT_ERR_INVALID, "%s: %s %d is missing or malformed", name,
                                k < c->n_in ? "input" : "output", k < c->n_in ? k : k - c->n_in);
    }
    return GT_OK;
}

gt_status gt_kernel_want_attrs(const gt_kernel_call *c, int ni, int nf, int ne, gt_error *err)
{
    if (c->ni >= ni && c->nf >= nf && c->ne >= ne && (ni == 0 || c->i) && (nf == 0 || c->f) &&
        (ne == 0 || c->e))
        return GT_OK;
    return gt_error_set(err, GT_ERR_INVALID,
                        "%s: got %d int, %d float, %d expression attributes, expected at least "
                        "%d, %d, %d",
                        gt_kernel_op_name(c->op), c->ni, c->nf, c->ne, ni, nf, ne);
}

gt_status gt_kernel_norm_dim(const gt_kernel_call *c, int64_t dim, int ndim, int *out,
                             gt_error *err)
{
    int64_t d = dim < 0 ? dim + ndim : dim;
    if (d < 0 || d >= ndim)
        return gt_error_set(err, GT_ERR_INVALID, "%s: dim %lld out of range for rank %d",
                            gt_kernel_op_name(c->op), (long long)dim, ndim);
    *out = (int)d;
    return GT_OK;
}

void gt_kernel_contig_strides(int ndim, const int64_t *shape, int64_t *strides)
{
    int64_t s = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        strides[d] = s;
        s *= shape[d];
    }
}

void gt_kernel_outer_inner(const gt_tensor *t, int dim, int64_t *outer, int64_t *inner)
{
    *outer = 1;
    *inner = 1;
    for (int d = 0; d < dim; d++)
        *outer *= t->shape[d];
    for (int d = dim + 1; d < t->ndim; d++)
        *inner *= t->shape[d];
}

bool gt_kernel_concat_in_place(const gt_tensor *x, const gt_tensor *out, int64_t outer, int64_t off,
                               int64_t inner)
{
    return outer == 1 &&
           x->data == (const char *)out->data + (size_t)(off * inner) * gt_dtype_size(out->dtype);
}

bool gt_kernel_same_but(const gt_tensor *a, const gt_tensor *b, int dim)
{
    if (a->ndim != b->ndim) return false;
    for (int d = 0; d < a->ndim; d++)
        if (d != dim && a->shape[d] != b->shape[d]) return false;
    return true;
}

bool gt_kernel_rows_of_ids(const gt_tensor *ids, const gt_tensor *rows, int64_t d)
{
    bool ok = rows->ndim == ids->ndim + 1 && rows->shape[ids->ndim] == d;
    for (int k = 0; ok && k < ids->ndim; k++)
        ok = rows->shape[k] == ids->shape[k];
    return ok;
}

const char *const gt_kernel_adamw_in[6] = {"param",      "grad",    "exp_avg",
                                           "exp_avg_sq", "scalars", "clip"};
const char *const gt_kernel_adamw_out[3] = {"param'", "exp_avg'", "exp_avg_sq'"};

gt_status gt_kernel_want_adamw(const gt_kernel_call *c, gt_error *err)
{
    GT_TRY(gt_kernel_want_attrs(c, 0, 4, 0, err));
    const gt_tensor *p = c->in[0];
    for (int k = 1; k < 4; k++)
        GT_TRY(gt_kernel_want_same_shape(c, p, gt_kernel_adamw_in[0], c->in[k],
                                         gt_kernel_adamw_in[k], err));
    for (int k = 0; k < 3; k++)
        GT_TRY(gt_kernel_want_same_shape(c, p, gt_kernel_adamw_in[0], c->out[k],
                                         gt_kernel_adamw_out[k], err));
    if (gt_tensor_numel(c->in[4]) != 3 || gt_tensor_numel(c->in[5]) != 1) {
        char bs[128], bc[128];
        return gt_error_set(
            err, GT_ERR_SHAPE, "adamw: scalars must have 3 elements and clip 1, got %s and %s",
            gt_kernel_fmt(c->in[4], bs, sizeof bs), gt_kernel_fmt(c->in[5], bc, sizeof bc));
    }
    double beta1 = c->f[0], beta2 = c->f[1], eps = c->f[2], wd = c->f[3];
    if (!(beta1 >= 0.0 && beta1 < 1.0) || !(beta2 >= 0.0 && beta2 < 1.0) || !(eps >= 0.0) ||
        !(wd >= 0.0))
        return gt_error_set(err, GT_ERR_INVALID,
                            "adamw: hyper-parameters beta1 %g, beta2 %g, eps %g, weight_decay %g "
                            "out of range",
                            beta1, beta2, eps, wd);
    return GT_OK;
}

gt_status gt_kernel_want_full(const gt_kernel_call *c, uint8_t bits[8], gt_error *err)
{
    GT_TRY(gt_kernel_want_attrs(c, 1, 1, 0, err));
    const gt_tensor *out = c->out[0];
    if (c->i[0] != (int64_t)out->dtype)
        return gt_error_set(err, GT_ERR_SHAPE, "full: attribute dtype %lld but output is %s",
                            (long long)c->i[0], gt_dtype_name(out->dtype));
    bool shape_ok = c->ne == out->ndim && (c->ne == 0 || c->e);
    for (int d = 0; shape_ok && d < out->ndim; d++)
        shape_ok = c->e[d] == out->shape[d];
    if (!shape_ok) {
        char b[128];
        return gt_error_set(err, GT_ERR_SHAPE, "full: output %s does not match the shape attribute",
                            gt_kernel_fmt(out, b, sizeof b));
    }
    memset(bits, 0, 8);
    double v = c->f[0];
    if (out->dtype == GT_I64) {
        int64_t iv = isnan(v) ? 0 : v >= 0x1p63 ? INT64_MAX : v <= -0x1p63 ? INT64_MIN : (int64_t)v;
        memcpy(bits, &iv, sizeof iv);
    } else if (out->dtype == GT_I32) {
        int32_t iv = isnan(v)             ? 0
                     : v >= 2147483647.0  ? INT32_MAX
                     : v <= -2147483648.0 ? INT32_MIN
                                          : (int32_t)v;
        memcpy(bits, &iv, sizeof iv);
    } else if (out->dtype == GT_BOOL) {
        bits[0] = v != 0.0;
    } else {
        gt_tensor one;
        int64_t one_shape[1] = {1};
        gt_tensor_wrap(&one, out->dtype, 1, one_shape, bits);
        gt_tensor_set_f32(&one, 0, (float)v);
    }
    return GT_OK;
}

gt_status gt_kernel_want_cast(const gt_kernel_call *c, gt_error *err)
{
    GT_TRY(gt_kernel_want_attrs(c, 1, 0, 0, err));
    if (c->i[0] != (int64_t)c->out[0]->dtype)
        return gt_error_set(err, GT_ERR_SHAPE, "cast: attribute dtype %lld but output is %s",
                            (long long)c->i[0], gt_dtype_name(c->out[0]->dtype));
    return gt_kernel_want_same_shape(c, c->in[0], "input", c->out[0], "output", err);
}

gt_status gt_kernel_want_matmul(const gt_kernel_call *c, gt_kernel_matmul_dims *d, gt_error *err)
{
    GT_TRY(gt_kernel_want_attrs(c, 2, 0, 0, err));
    const gt_tensor *a = c->in[0], *b = c->in[1], *out = c->out[0];
    bool ta = c->i[0] != 0, tb = c->i[1] != 0;
    char ba[128], bb[128], bo[128];
    int ra = a->ndim, rb = b->ndim;
    if (ra < 2 || rb < 2 || (rb != 2 && rb != ra))
        return gt_error_set(err, GT_ERR_SHAPE,
                            "matmul: a %s and b %s: need rank >= 2 and b of rank 2 or a's rank",
                            gt_kernel_fmt(a, ba, sizeof ba), gt_kernel_fmt(b, bb, sizeof bb));
    d->ta = ta;
    d->tb = tb;
    d->b_batched = rb != 2;
    d->m = ta ? a->shape[ra - 1] : a->shape[ra - 2];
    d->k = ta ? a->shape[ra - 2] : a->shape[ra - 1];
    int64_t kb = tb ? b->shape[rb - 1] : b->shape[rb - 2];
    d->n = tb ? b->shape[rb - 2] : b->shape[rb - 1];
    d->batch = 1;
    bool ok =
        d->k == kb && out->ndim == ra && out->shape[ra - 2] == d->m && out->shape[ra - 1] == d->n;
    for (int x = 0; ok && x < ra - 2; x++) {
        ok = out->shape[x] == a->shape[x] && (rb == 2 || b->shape[x] == a->shape[x]);
        d->batch *= a->shape[x];
    }
    if (!ok)
        return gt_error_set(err, GT_ERR_SHAPE,
                            "matmul(trans_a=%d, trans_b=%d): a %s, b %s and output %s do not fit",
                            (int)ta, (int)tb, gt_kernel_fmt(a, ba, sizeof ba),
                            gt_kernel_fmt(b, bb, sizeof bb), gt_kernel_fmt(out, bo, sizeof bo));
    return GT_OK;
}

gt_status gt_kernel_want_embedding(const gt_kernel_call *c, gt_error *err)
{
    GT_TRY(gt_kernel_want_attrs(c, 0, 0, c->op == GT_OP_EMBEDDING_SHARD ? 1 : 0, err));
    const gt_tensor *w = c->in[0], *ids = c->in[1], *out = c->out[0];
    GT_TRY(gt_kernel_want_index(c, ids, "ids", err));
    GT_TRY(gt_kernel_want_rank(c, w, "w", 2, err));
    GT_TRY(gt_kernel_want_same_dtype(c, w, "w", out, "output", err));
    if (gt_kernel_rows_of_ids(ids, out, w->shape[1])) return GT_OK;
    char bw[128], bi[128], bo[128];
    return gt_error_set(err, GT_ERR_SHAPE, "%s: w %s, ids %s: output %s should be [ids..., %lld]",
                        gt_kernel_op_name(c->op), gt_kernel_fmt(w, bw, sizeof bw),
                        gt_kernel_fmt(ids, bi, sizeof bi), gt_kernel_fmt(out, bo, sizeof bo),
                        (long long)w->shape[1]);
}

gt_status gt_kernel_want_embedding_backward(const gt_kernel_call *c, gt_error *err)
{
    GT_TRY(gt_kernel_want_attrs(c, 0, 0, c->op == GT_OP_EMBEDDING_SHARD_BACKWARD ? 2 : 1, err));
    const gt_tensor *ids = c->in[0], *dy = c->in[1], *dw = c->out[0];
    GT_TRY(gt_kernel_want_index(c, ids, "ids", err));
    GT_TRY(gt_kernel_want_rank(c, dw, "dw", 2, err));
    if (dw->shape[0] == c->e[0] && gt_kernel_rows_of_ids(ids, dy, dw->shape[1])) return GT_OK;
    char bi[128], bd[128], bw[128];
    return gt_error_set(
        err, GT_ERR_SHAPE, "%s: ids %s, dy %s, dw %s: expected dy [ids..., D], dw [%lld, D]",
        gt_kernel_op_name(c->op), gt_kernel_fmt(ids, bi, sizeof bi),
        gt_kernel_fmt(dy, bd, sizeof bd), gt_kernel_fmt(dw, bw, sizeof bw), (long long)c->e[0]);
}

gt_status gt_kernel_want_attn(const gt_kernel_call *c, gt_kernel_attn *a, gt_error *err)
{
    GT_TRY(gt_kernel_want_attrs(c, 1, 1, 0, err));
    int64_t layout = c->ni > 1 ? c->i[1] : 0;
    if (layout != 0 && layout != 1)
        return gt_error_set(err, GT_ERR_INVALID, "%s: layout must be 0 or 1, got %lld",
                            gt_kernel_op_name(c->op), (long long)layout);
    const gt_tensor *q = c->in[0], *k = c->in[1], *v = c->in[2];
    GT_TRY(gt_kernel_want_rank(c, q, "q", 4, err));
    GT_TRY(gt_kernel_want_rank(c, k, "k", 4, err));
    GT_TRY(gt_kernel_want_rank(c, v, "v", 4, err));
    int hd = layout ? 2 : 1, sd = layout ? 1 : 2; /* heads and sequence dims */
    *a = (gt_kernel_attn){.b = q->shape[0],
                          .hq = q->shape[hd],
                          .hkv = k->shape[hd],
                          .s = q->shape[sd],
                          .t = k->shape[sd],
                          .d = q->shape[3],
                          .dv = v->shape[3],
                          .layout = (int)layout,
                          .causal = c->i[0] != 0,
                          .scale = (float)c->f[0]};
    char bq[128], bk[128], bv[128];
    if (k->shape[0] != a->b || v->shape[0] != a->b || v->shape[hd] != a->hkv ||
        v->shape[sd] != a->t || k->shape[3] != a->d || a->hkv == 0 || a->hq % a->hkv != 0)
        return gt_error_set(err, GT_ERR_SHAPE,
                            "%s: q %s, k %s, v %s: expected %s with hq a multiple of hkv (layout "
                            "%d)",
                            gt_kernel_op_name(c->op), gt_kernel_fmt(q, bq, sizeof bq),
                            gt_kernel_fmt(k, bk, sizeof bk), gt_kernel_fmt(v, bv, sizeof bv),
                            layout ? "q [b, s, hq, d], k [b, t, hkv, d], v [b, t, hkv, dv]"
                                   : "q [b, hq, s, d], k [b, hkv, t, d], v [b, hkv, t, dv]",
                            a->layout);
    if (a->causal && a->s != a->t)
        return gt_error_set(err, GT_ERR_INVALID,
                            "%s: causal attention needs as many queries as keys, got s = %lld, "
                            "t = %lld",
                            gt_kernel_op_name(c->op), (long long)a->s, (long long)a->t);
    int base = c->op == GT_OP_SDPA ? 3 : 6;
    if (c->n_in != base && c->n_in != base + 1)
        return gt_error_set(err, GT_ERR_INVALID, "%s: takes %d inputs (+ positions), got %d",
                            gt_kernel_op_name(c->op), base, c->n_in);
    if (c->n_in == base + 1) {
        const gt_tensor *p = c->in[base];
        char bp[128];
        if (p->dtype != GT_I64 || p->ndim != 2 || p->shape[0] != a->b || p->shape[1] != a->s ||
            !a->causal)
            return gt_error_set(err, GT_ERR_SHAPE,
                                "%s: positions %s: expected i64 [%lld, %lld] with causal = 1",
                                gt_kernel_op_name(c->op), gt_kernel_fmt(p, bp, sizeof bp),
                                (long long)a->b, (long long)a->s);
        a->positions = p->data;
    }
    return GT_OK;
}

gt_status gt_kernel_want_attn_tensor(const gt_kernel_call *c, const gt_tensor *t, const char *what,
                                     const gt_kernel_attn *a, int64_t h, int64_t n, int64_t last,
                                     gt_error *err)
{
    int rank = last < 0 ? 3 : 4;
    int64_t d1 = rank == 4 && a->layout == 1 ? n : h, d2 = rank == 4 && a->layout == 1 ? h : n;
    bool ok = t->ndim == rank && t->shape[0] == a->b && t->shape[1] == d1 && t->shape[2] == d2 &&
              (rank == 3 || t->shape[3] == last);
    if (ok) return GT_OK;
    char bt[128];
    return gt_error_set(err, GT_ERR_SHAPE, "%s: %s is %s, expected [%lld, %lld, %lld%s%lld]",
                        gt_kernel_op_name(c->op), what, gt_kernel_fmt(t, bt, sizeof bt),
                        (long long)a->b, (long long)d1, (long long)d2, rank == 4 ? ", " : "",
                        rank == 4 ? (long long)last : 0LL);
}

/* ---------------------------------------------------------------- moves */

gt_status gt_kernel_shape_error(const gt_kernel_call *c, const gt_tensor *x, const gt_tensor *out,
                                gt_error *err)
{
    char bx[128], bo[128];
    return gt_error_set(err, GT_ERR_SHAPE, "%s: output %s does not fit input %s and the attributes",
                        gt_kernel_op_name(c->op), gt_kernel_fmt(out, bo, sizeof bo),
                        gt_kernel_fmt(x, bx, sizeof bx));
}

bool gt_kernel_out_matches_e(const gt_kernel_call *c, const gt_tensor *out)
{
    if (c->ne != out->ndim || (c->ne > 0 && !c->e)) return false;
    for (int d = 0; d < out->ndim; d++)
        if (c->e[d] != out->shape[d]) return false;
    return true;
}

gt_status gt_kernel_want_reshape(const gt_kernel_call *c, gt_error *err)
{
    const gt_tensor *x = c->in[0], *out = c->out[0];
    GT_TRY(gt_kernel_want_same_dtype(c, x, "input", out, "output", err));
    if (!gt_kernel_out_matches_e(c, out) || gt_tensor_numel(x) != gt_tensor_numel(out))
        return gt_kernel_shape_error(c, x, out, err);
    return GT_OK;
}

gt_status gt_kernel_want_perm(const gt_kernel_call *c, int *perm, gt_error *err)
{
    const gt_tensor *x = c->in[0], *out = c->out[0];
    int rank = x->ndim;
    if (c->op == GT_OP_TRANSPOSE) {
        int d0 = 0, d1 = 0;
        GT_TRY(gt_kernel_want_attrs(c, 2, 0, 0, err));
        GT_TRY(gt_kernel_norm_dim(c, c->i[0], rank, &d0, err));
        GT_TRY(gt_kernel_norm_dim(c, c->i[1], rank, &d1, err));
        for (int k = 0; k < rank; k++)
            perm[k] = k;
        perm[d0] = d1;
        perm[d1] = d0;
    } else {
        bool seen[GT_MAX_DIMS] = {false};
        if (c->ni != rank)
            return gt_error_set(err, GT_ERR_INVALID, "permute: %d perm entries for rank %d", c->ni,
                                rank);
        for (int k = 0; k < rank; k++) {
            GT_TRY(gt_kernel_norm_dim(c, c->i[k], rank, &perm[k], err));
            if (seen[perm[k]])
                return gt_error_set(err, GT_ERR_INVALID, "permute: dim %d appears twice", perm[k]);
            seen[perm[k]] = true;
        }
    }
    GT_TRY(gt_kernel_want_same_dtype(c, x, "input", out, "output", err));
    if (out->ndim != rank) return gt_kernel_shape_error(c, x, out, err);
    for (int k = 0; k < rank; k++)
        if (out->shape[k] != x->shape[perm[k]]) return gt_kernel_shape_error(c, x, out, err);
    return GT_OK;
}

/* slice and slice_backward alike: [e[0], e[1]) lies in a dim of `size`, `part` is that range of
 * `whole` along dim and otherwise of its shape, and whole's dim has `size`. */
static gt_status want_range(const gt_kernel_call *c, int dim, int64_t size, const gt_tensor *whole,
                            const gt_tensor *part, gt_error *err)
{
    int64_t start = c->e[0], end = c->e[1];
    if (start < 0 || end < start || end > size)
        return gt_error_set(err, GT_ERR_INVALID, "%s: [%lld, %lld) outside dim %d of size %lld",
                            gt_kernel_op_name(c->op), (long long)start, (long long)end, dim,
                            (long long)size);
    if (!gt_kernel_same_but(part, whole, dim) || part->shape[dim] != end - start ||
        whole->shape[dim] != size)
        return gt_kernel_shape_error(c, c->in[0], c->out[0], err);
    return GT_OK;
}

gt_status gt_kernel_want_slice(const gt_kernel_call *c, int *dim, gt_error *err)
{
    GT_TRY(gt_kernel_want_attrs(c, 1, 0, 2, err));
    const gt_tensor *x = c->in[0], *out = c->out[0];
    GT_TRY(gt_kernel_want_same_dtype(c, x, "input", out, "output", err));
    GT_TRY(gt_kernel_norm_dim(c, c->i[0], x->ndim, dim, err));
    return want_range(c, *dim, x->shape[*dim], x, out, err);
}

gt_status gt_kernel_want_slice_backward(const gt_kernel_call *c, int *dim, gt_error *err)
{
    GT_TRY(gt_kernel_want_attrs(c, 1, 0, 3, err));
    const gt_tensor *dy = c->in[0], *out = c->out[0];
    GT_TRY(gt_kernel_want_same_dtype(c, dy, "dy", out, "output", err));
    GT_TRY(gt_kernel_norm_dim(c, c->i[0], dy->ndim, dim, err));
    return want_range(c, *dim, c->e[2], out, dy, err);
}

gt_status gt_kernel_want_concat(const gt_kernel_call *c, int *dim, gt_error *err)
{
    GT_TRY(gt_kernel_want_attrs(c, 1, 0, 0, err));
    const gt_tensor *out = c->out[0];
    GT_TRY(gt_kernel_norm_dim(c, c->i[0], out->ndim, dim, err));
    int64_t total = 0;
    for (int k = 0; k < c->n_in; k++) {
        GT_TRY(gt_kernel_want_same_dtype(c, c->in[k], "an input", out, "output", err));
        if (!gt_kernel_same_but(c->in[k], out, *dim))
            return gt_kernel_shape_error(c, c->in[k], out, err);
        total += c->in[k]->shape[*dim];
    }
    if (total != out->shape[*dim]) return gt_kernel_shape_error(c, c->in[0], out, err);
    return GT_OK;
}

gt_status gt_kernel_want_split(const gt_kernel_call *c, int *dim, gt_error *err)
{
    GT_TRY(gt_kernel_want_attrs(c, 1, 0, 0, err));
    const gt_tensor *x = c->in[0];
    GT_TRY(gt_kernel_norm_dim(c, c->i[0], x->ndim, dim, err));
    if (c->ne != c->n_out)
        return gt_error_set(err, GT_ERR_INVALID, "split: %d sizes but %d outputs", c->ne, c->n_out);
    int64_t total = 0;
    for (int k = 0; k < c->n_out; k++) {
        GT_TRY(gt_kernel_want_same_dtype(c, x, "input", c->out[k], "an output", err));
        if (!gt_kernel_same_but(c->out[k], x, *dim) || c->out[k]->shape[*dim] != c->e[k])
            return gt_kernel_shape_error(c, x, c->out[k], err);
        total += c->e[k];
    }
    if (total != x->shape[*dim]) return gt_kernel_shape_error(c, x, c->out[0], err);
    return GT_OK;
}
