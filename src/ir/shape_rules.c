/* shape_rules.c — shape/dtype rules for constants, elementwise ops, reductions and layout ops, plus
 * the helpers every rule shares. The neural-network ops (matmul, norms, rope, attention, softmax,
 * losses, embeddings) are in shape_rules_nn.c.
 *
 * Dims are gt_expr ids in the graph's pool and the pool interns canonical forms, so two dims are
 * equal exactly when their ids are equal. A rule fills out_types[0..*n_out) or returns
 * GT_ERR_SHAPE (GT_ERR_INVALID for a malformed attribute) naming the op, its fqn and the dims. */
#include <stdarg.h>
#include <string.h>

#include "ir/ir_internal.h"

/* ---------------------------------------------------------------- helpers */

gt_status gt_shape_fail(gt_graph *g, const gt_node *n, gt_error *err, gt_status code,
                        const char *fmt, ...)
{
    char label[256], what[768];
    gt_node_label(g, n, label, sizeof label);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return gt_error_set(err, code, "%s: %s", label, what);
}

bool gt_type_equal(const gt_type *a, const gt_type *b)
{
    if (a->dtype != b->dtype || a->ndim != b->ndim) return false;
    for (int k = 0; k < a->ndim; k++)
        if (a->dims[k] != b->dims[k]) return false;
    return true;
}

bool gt_expr_is_one(const gt_graph *g, gt_expr e)
{
    int64_t c;
    return e != GT_EXPR_INVALID && gt_sym_is_const(g->sym, e, &c) && c == 1;
}

const char *gt_type_str(const gt_graph *g, const gt_type *t, char *buf, size_t len)
{
    gt_graph_format_type(g, t, buf, len);
    return buf;
}

const char *gt_expr_str(const gt_graph *g, gt_expr e, char *buf, size_t len)
{
    if (e == GT_EXPR_INVALID)
        snprintf(buf, len, "<invalid>");
    else
        gt_sym_format(g->sym, e, buf, len);
    return buf;
}

gt_status gt_shape_need_float(gt_graph *g, const gt_node *n, int k, gt_error *err)
{
    const gt_type *t = gt_shape_in(g, n, k);
    if (gt_dtype_is_float(t->dtype)) return GT_OK;
    char ts[160];
    return gt_shape_fail(g, n, err, GT_ERR_SHAPE, "input %d must be float, got %s", k,
                         gt_type_str(g, t, ts, sizeof ts));
}

gt_status gt_shape_need_index(gt_graph *g, const gt_node *n, int k, gt_error *err)
{
    const gt_type *t = gt_shape_in(g, n, k);
    if (t->dtype == GT_I32 || t->dtype == GT_I64) return GT_OK;
    char ts[160];
    return gt_shape_fail(g, n, err, GT_ERR_SHAPE, "input %d must be i32 or i64 indices, got %s", k,
                         gt_type_str(g, t, ts, sizeof ts));
}

gt_status gt_shape_need_same_dtype(gt_graph *g, const gt_node *n, int k0, int k1, gt_error *err)
{
    const gt_type *a = gt_shape_in(g, n, k0), *b = gt_shape_in(g, n, k1);
    if (a->dtype == b->dtype) return GT_OK;
    char as[160], bs[160];
    return gt_shape_fail(g, n, err, GT_ERR_SHAPE, "dtypes differ: input %d is %s, input %d is %s",
                         k0, gt_type_str(g, a, as, sizeof as), k1,
                         gt_type_str(g, b, bs, sizeof bs));
}

gt_status gt_shape_need_same_type(gt_graph *g, const gt_node *n, int k0, int k1, gt_error *err)
{
    const gt_type *a = gt_shape_in(g, n, k0), *b = gt_shape_in(g, n, k1);
    if (gt_type_equal(a, b)) return GT_OK;
    char as[160], bs[160];
    return gt_shape_fail(g, n, err, GT_ERR_SHAPE,
                         "input %d and input %d must have the same type: %s vs %s", k0, k1,
                         gt_type_str(g, a, as, sizeof as), gt_type_str(g, b, bs, sizeof bs));
}

gt_status gt_shape_need_rank(gt_graph *g, const gt_node *n, int k, int rank, gt_error *err)
{
    const gt_type *t = gt_shape_in(g, n, k);
    if (t->ndim == rank) return GT_OK;
    char ts[160];
    return gt_shape_fail(g, n, err, GT_ERR_SHAPE, "input %d must have rank %d, got %s", k, rank,
                         gt_type_str(g, t, ts, sizeof ts));
}

gt_status gt_shape_need_dim(gt_graph *g, const gt_node *n, const char *what, int64_t dim, int ndim,
                            gt_error *err)
{
    if (dim >= 0 && dim < ndim) return GT_OK;
    return gt_shape_fail(g, n, err, GT_ERR_SHAPE, "%s %lld out of range [0, %d)", what,
                         (long long)dim, ndim);
}

gt_status gt_shape_need_size(gt_graph *g, const gt_node *n, const char *what, gt_expr e,
                             gt_error *err)
{
    int64_t c;
    if (e == GT_EXPR_INVALID)
        return gt_shape_fail(g, n, err, GT_ERR_SHAPE, "%s is an invalid expression", what);
    if (gt_sym_is_const(g->sym, e, &c) && c < 0)
        return gt_shape_fail(g, n, err, GT_ERR_SHAPE, "%s is negative (%lld)", what, (long long)c);
    return GT_OK;
}

/* A type whose dims are the node's expression attributes (full, broadcast_to, sum_to, reshape). */
static gt_status shape_from_eattrs(gt_graph *g, const gt_node *n, int first, gt_dtype dt,
                                   gt_type *out, gt_error *err)
{
    int ndim = n->attrs.ne - first;
    if (ndim > GT_MAX_DIMS)
        return gt_shape_fail(g, n, err, GT_ERR_SHAPE, "shape has %d dims, at most %d", ndim,
                             GT_MAX_DIMS);
    out->dtype = dt;
    out->ndim = ndim;
    for (int k = 0; k < ndim; k++) {
        char what[32];
        snprintf(what, sizeof what, "shape[%d]", k);
        GT_TRY(gt_shape_need_size(g, n, what, n->attrs.e[first + k], err));
        out->dims[k] = n->attrs.e[first + k];
    }
    return GT_OK;
}

/* ---------------------------------------------------------------- constants and elementwise */

gt_status gt_shape_full(gt_graph *g, const gt_node *n, gt_type *out, int *n_out, gt_error *err)
{
    int64_t dt = n->attrs.i[0];
    if (dt < 0 || dt >= GT_DTYPE_COUNT)
        return gt_shape_fail(g, n, err, GT_ERR_INVALID, "dtype %lld is not a dtype", (long long)dt);
    *n_out = 1;
    return shape_from_eattrs(g, n, 0, (gt_dtype)dt, &out[0], err);
}

/* numpy broadcasting, aligned at the last dim: a pair of dims is compatible when equal or when
 * one is the constant 1; the result takes the other. A missing leading dim counts as 1. */
static gt_status broadcast_binary(gt_graph *g, const gt_node *n, gt_type *out, int *n_out,
                                  gt_error *err)
{
    GT_TRY(gt_shape_need_float(g, n, 0, err));
    GT_TRY(gt_shape_need_same_dtype(g, n, 0, 1, err));
    const gt_type *a = gt_shape_in(g, n, 0), *b = gt_shape_in(g, n, 1);
    int r = a->ndim > b->ndim ? a->ndim : b->ndim;
    out->dtype = a->dtype;
    out->ndim = r;
    for (int k = 0; k < r; k++) {
        int ia = k - (r - a->ndim), ib = k - (r - b->ndim);
        if (ia < 0) {
            out->dims[k] = b->dims[ib];
        } else if (ib < 0 || a->dims[ia] == b->dims[ib] || gt_expr_is_one(g, b->dims[ib])) {
            out->dims[k] = a->dims[ia];
        } else if (gt_expr_is_one(g, a->dims[ia])) {
            out->dims[k] = b->dims[ib];
        } else {
            char da[64], db[64], as[160], bs[160];
            return gt_shape_fail(
                g, n, err, GT_ERR_SHAPE, "cannot broadcast dim %d: %s vs %s (a: %s, b: %s)", k,
                gt_expr_str(g, a->dims[ia], da, sizeof da),
                gt_expr_str(g, b->dims[ib], db, sizeof db), gt_type_str(g, a, as, sizeof as),
                gt_type_str(g, b, bs, sizeof bs));
        }
    }
    *n_out = 1;
    return GT_OK;
}

gt_status gt_shape_add(gt_graph *g, const gt_node *n, gt_type *out, int *n_out, gt_error *err)
{
    return broadcast_binary(g, n, out, n_out, err);
}
gt_status gt_shape_sub(gt_graph *g, const gt_node *n, gt_type *out, int *n_out, gt_error *err)
{
    return broadcast_binary(g, n, out, n_out, err);
}
gt_status gt_shape_mul(gt_graph *g, const gt_node *n, gt_type *out, int *n_out, gt_error *err)
{
    return broadcast_binary(g, n, out, n_out, err);
}
gt_status gt_shape_div(gt_graph *g, const gt_node *n, gt_type *out, int *n_out, gt_error *err)
{
    return broadcast_binary(g, n, out, n_out, err);
}

/* (x) -> same type; x float. */
static gt_status same_as_float_input(gt_graph *g, const gt_node *n, gt_type *out, int *n_out,
                                     gt_error *err)
{
    GT_TRY(gt_shape_need_float(g, n, 0, err));
    out[0] = *gt_shape_in(g, n, 0);
    *n_out = 1;
    return GT_OK;
}

#define GT_UNARY_RULE(name)                                                                        \
    gt_status gt_shape_##name(gt_graph *g, const gt_node *n, gt_type *out, int *n_out,             \
                              gt_error *err)                                                       \
    {                                                                                              \
        return same_as_float_input(g, n, out, n_out, err);                                         \
    }
GT_UNARY_RULE(neg)
GT_UNARY_RULE(exp)
GT_UNARY_RULE(log)
GT_UNARY_RULE(sqrt)
GT_UNARY_RULE(rsqrt)
GT_UNARY_RULE(silu)
GT_UNARY_RULE(sigmoid)
GT_UNARY_RULE(scale)
GT_UNARY_RULE(add_scalar)
#undef GT_UNARY_RULE

/* (x, dy) -> dx; x and dy float, same type (no broadcasting in a gradient). */
gt_status gt_shape_silu_backward(gt_graph *g, const gt_node *n, gt_type *out, int *n_out,
                                 gt_error *err)
{
    GT_TRY(gt_shape_need_float(g, n, 0, err));
    GT_TRY(gt_shape_need_same_type(g, n, 0, 1, err));
    out[0] = *gt_shape_in(g, n, 0);
    *n_out = 1;
    return GT_OK;
}

gt_status gt_shape_cast(gt_graph *g, const gt_node *n, gt_type *out, int *n_out, gt_error *err)
{
    int64_t dt = n->attrs.i[0];
    if (dt < 0 || dt >= GT_DTYPE_COUNT)
        return gt_shape_fail(g, n, err, GT_ERR_INVALID, "dtype %lld is not a dtype", (long long)dt);
    out[0] = *gt_shape_in(g, n, 0);
    out[0].dtype = (gt_dtype)dt;
    *n_out = 1;
    return GT_OK;
}

/* ---------------------------------------------------------------- reductions */

/* Schema "i:keepdim,dims*": the reduced type of x. Reduced dims vanish, or become 1 with keepdim.
 * An empty dims list reduces nothing (each group is one element), so the type is x's. */
static gt_status reduced_type(gt_graph *g, const gt_node *n, const gt_type *x, gt_type *out,
                              gt_error *err)
{
    int64_t keepdim = n->attrs.i[0];
    if (keepdim != 0 && keepdim != 1)
        return gt_shape_fail(g, n, err, GT_ERR_INVALID, "keepdim must be 0 or 1, got %lld",
                             (long long)keepdim);
    bool reduced[GT_MAX_DIMS] = {false};
    for (int k = 1; k < n->attrs.ni; k++) {
        int64_t d = n->attrs.i[k];
        GT_TRY(gt_shape_need_dim(g, n, "reduction dim", d, x->ndim, err));
        if (reduced[d])
            return gt_shape_fail(g, n, err, GT_ERR_SHAPE, "reduction dim %lld listed twice",
                                 (long long)d);
        reduced[d] = true;
    }
    out->dtype = x->dtype;
    out->ndim = 0;
    for (int d = 0; d < x->ndim; d++) {
        if (!reduced[d])
            out->dims[out->ndim++] = x->dims[d];
        else if (keepdim)
            out->dims[out->ndim++] = gt_sym_const(g->sym, 1);
    }
    return GT_OK;
}

static gt_status reduce_rule(gt_graph *g, const gt_node *n, gt_type *out, int *n_out, gt_error *err)
{
    GT_TRY(gt_shape_need_float(g, n, 0, err));
    GT_TRY(reduced_type(g, n, gt_shape_in(g, n, 0), &out[0], err));
    *n_out = 1;
    return GT_OK;
}

gt_status gt_shape_sum(gt_graph *g, const gt_node *n, gt_type *out, int *n_out, gt_error *err)
{
    return reduce_rule(g, n, out, n_out, err);
}
gt_status gt_shape_mean(gt_graph *g, const gt_node *n, gt_type *out, int *n_out, gt_error *err)
{
    return reduce_rule(g, n, out, n_out, err);
}
gt_status gt_shape_max(gt_graph *g, const gt_node *n, gt_type *out, int *n_out, gt_error *err)
{
    return reduce_rule(g, n, out, n_out, err);
}
/* The reduced shape, in f32 whatever the float x. */
gt_status gt_shape_sum_squares(gt_graph *g, const gt_node *n, gt_type *out, int *n_out,
                               gt_error *err)
{
    GT_TRY(reduce_rule(g, n, out, n_out, err));
    out[0].dtype = GT_F32;
    return GT_OK;
}

/* (x, y, dy) -> dx like x; y and dy have the reduced type of x. */
gt_status gt_shape_max_backward(gt_graph *g, const gt_node *n, gt_type *out, int *n_out,
                                gt_error *err)
{
    GT_TRY(gt_shape_need_float(g, n, 0, err));
    const gt_type *x = gt_shape_in(g, n, 0);
    gt_type r;
    GT_TRY(reduced_type(g, n, x, &r, err));
    for (int k = 1; k <= 2; k++) {
        const gt_type *t = gt_shape_in(g, n, k);
        if (!gt_type_equal(t, &r)) {
            char ts[160], rs[160];
            return gt_shape_fail(
                g, n, err, GT_ERR_SHAPE, "input %d (%s) must have the reduced type %s", k,
                gt_type_str(g, t, ts, sizeof ts), gt_type_str(g, &r, rs, sizeof rs));
        }
    }
    out[0] = *x;
    *n_out = 1;
    return GT_OK;
}

/* ---------------------------------------------------------------- broadcasting and views */

/* x broadcasts to shape: aligned at the last dim, each x dim equals the target dim or is 1. */
gt_status gt_shape_broadcast_to(gt_graph *g, const gt_node *n, gt_type *out, int *n_out,
                                gt_error *err)
{
    const gt_type *x = gt_shape_in(g, n, 0);
    GT_TRY(shape_from_eattrs(g, n, 0, x->dtype, &out[0], err));
    char xs[160], ts[160];
    if (x->ndim > out->ndim)
        return gt_shape_fail(g, n, err, GT_ERR_SHAPE, "cannot broadcast %s to lower rank %s",
                             gt_type_str(g, x, xs, sizeof xs),
                             gt_type_str(g, &out[0], ts, sizeof ts));
    int off = out->ndim - x->ndim;
    for (int k = 0; k < x->ndim; k++) {
        if (x->dims[k] != out->dims[off + k] && !gt_expr_is_one(g, x->dims[k]))
            return gt_shape_fail(g, n, err, GT_ERR_SHAPE, "cannot broadcast %s to %s (dim %d)",
                                 gt_type_str(g, x, xs, sizeof xs),
                                 gt_type_str(g, &out[0], ts, sizeof ts), k);
    }
    *n_out = 1;
    return GT_OK;
}

/* The reverse of broadcast_to: shape must broadcast to x's shape; the broadcast dims sum away. */
gt_status gt_shape_sum_to(gt_graph *g, const gt_node *n, gt_type *out, int *n_out, gt_error *err)
{
    GT_TRY(gt_shape_need_float(g, n, 0, err));
    const gt_type *x = gt_shape_in(g, n, 0);
    GT_TRY(shape_from_eattrs(g, n, 0, x->dtype, &out[0], err));
    char xs[160], ts[160];
    if (out->ndim > x->ndim)
        return gt_shape_fail(g, n, err, GT_ERR_SHAPE, "cannot sum %s to higher rank %s",
                             gt_type_str(g, x, xs, sizeof xs),
                             gt_type_str(g, &out[0], ts, sizeof ts));
    int off = x->ndim - out->ndim;
    for (int k = 0; k < out->ndim; k++) {
        if (out->dims[k] != x->dims[off + k] && !gt_expr_is_one(g, out->dims[k]))
            return gt_shape_fail(g, n, err, GT_ERR_SHAPE, "%s does not broadcast to %s (dim %d)",
                                 gt_type_str(g, &out[0], ts, sizeof ts),
                                 gt_type_str(g, x, xs, sizeof xs), k);
    }
    *n_out = 1;
    return GT_OK;
}

static gt_expr numel_expr(gt_graph *g, const gt_type *t)
{
    gt_expr p = gt_sym_const(g->sym, 1);
    for (int k = 0; k < t->ndim; k++)
        p = gt_sym_mul(g->sym, p, t->dims[k]);
    return p;
}

/* Same number of elements, proved symbolically: the canonical products must be the same
 * expression (for constants that is the same value). */
gt_status gt_shape_reshape(gt_graph *g, const gt_node *n, gt_type *out, int *n_out, gt_error *err)
{
    const gt_type *x = gt_shape_in(g, n, 0);
    GT_TRY(shape_from_eattrs(g, n, 0, x->dtype, &out[0], err));
    gt_expr nx = numel_expr(g, x), no = numel_expr(g, &out[0]);
    int64_t cx, co;
    bool same = nx != GT_EXPR_INVALID && nx == no;
    if (!same && gt_sym_is_const(g->sym, nx, &cx) && gt_sym_is_const(g->sym, no, &co))
        same = cx == co;
    if (!same) {
        char xs[160], ts[160], ns[64], ms[64];
        return gt_shape_fail(g, n, err, GT_ERR_SHAPE, "numel differs: %s vs %s (x: %s, shape: %s)",
                             gt_expr_str(g, nx, ns, sizeof ns), gt_expr_str(g, no, ms, sizeof ms),
                             gt_type_str(g, x, xs, sizeof xs),
                             gt_type_str(g, &out[0], ts, sizeof ts));
    }
    *n_out = 1;
    return GT_OK;
}

/* The shape attributes as they are: the kernel checks the numel once the sizes are bound (a
 * regroup's G·(b // G) = b holds for every b its program is built for, never as symbols). */
gt_status gt_shape_regroup(gt_graph *g, const gt_node *n, gt_type *out, int *n_out, gt_error *err)
{
    const gt_type *x = gt_shape_in(g, n, 0);
    GT_TRY(shape_from_eattrs(g, n, 0, x->dtype, &out[0], err));
    *n_out = 1;
    return GT_OK;
}

gt_status gt_shape_transpose(gt_graph *g, const gt_node *n, gt_type *out, int *n_out, gt_error *err)
{
    const gt_type *x = gt_shape_in(g, n, 0);
    int64_t d0 = n->attrs.i[0], d1 = n->attrs.i[1];
    GT_TRY(gt_shape_need_dim(g, n, "dim0", d0, x->ndim, err));
    GT_TRY(gt_shape_need_dim(g, n, "dim1", d1, x->ndim, err));
    out[0] = *x;
    out[0].dims[d0] = x->dims[d1];
    out[0].dims[d1] = x->dims[d0];
    *n_out = 1;
    return GT_OK;
}

/* out.shape[k] = x.shape[perm[k]]; perm is a permutation of 0..rank-1. */
gt_status gt_shape_permute(gt_graph *g, const gt_node *n, gt_type *out, int *n_out, gt_error *err)
{
    const gt_type *x = gt_shape_in(g, n, 0);
    if (n->attrs.ni != x->ndim)
        return gt_shape_fail(g, n, err, GT_ERR_SHAPE, "perm has %d entries for rank %d",
                             n->attrs.ni, x->ndim);
    bool used[GT_MAX_DIMS] = {false};
    out[0] = *x;
    for (int k = 0; k < x->ndim; k++) {
        int64_t p = n->attrs.i[k];
        GT_TRY(gt_shape_need_dim(g, n, "perm entry", p, x->ndim, err));
        if (used[p])
            return gt_shape_fail(g, n, err, GT_ERR_SHAPE, "perm lists dim %lld twice",
                                 (long long)p);
        used[p] = true;
        out[0].dims[k] = x->dims[p];
    }
    *n_out = 1;
    return GT_OK;
}

/* Checks 0 <= start <= end <= size wherever the compared values are constants (and end - start
 * is not a negative constant); returns end - start. */
static gt_status slice_bounds(gt_graph *g, const gt_node *n, gt_expr start, gt_expr end,
                              gt_expr size, gt_expr *len, gt_error *err)
{
    GT_TRY(gt_shape_need_size(g, n, "start", start, err));
    GT_TRY(gt_shape_need_size(g, n, "end", end, err));
    int64_t cs = 0, ce = 0, cz = 0, cl = 0;
    bool ks = gt_sym_is_const(g->sym, start, &cs), ke = gt_sym_is_const(g->sym, end, &ce);
    bool kz = gt_sym_is_const(g->sym, size, &cz);
    *len = gt_sym_sub(g->sym, end, start);
    bool bad = (ks && ke && cs > ce) || (ke && kz && ce > cz) || (ks && kz && cs > cz) ||
               (gt_sym_is_const(g->sym, *len, &cl) && cl < 0);
    if (bad) {
        char ss[64], es[64], zs[64];
        return gt_shape_fail(g, n, err, GT_ERR_SHAPE, "bounds [%s, %s) do not fit size %s",
                             gt_expr_str(g, start, ss, sizeof ss),
                             gt_expr_str(g, end, es, sizeof es),
                             gt_expr_str(g, size, zs, sizeof zs));
    }
    return GT_OK;
}

gt_status gt_shape_slice(gt_graph *g, const gt_node *n, gt_type *out, int *n_out, gt_error *err)
{
    const gt_type *x = gt_shape_in(g, n, 0);
    int64_t dim = n->attrs.i[0];
    GT_TRY(gt_shape_need_dim(g, n, "dim", dim, x->ndim, err));
    gt_expr len;
    GT_TRY(slice_bounds(g, n, n->attrs.e[0], n->attrs.e[1], x->dims[dim], &len, err));
    out[0] = *x;
    out[0].dims[dim] = len;
    *n_out = 1;
    return GT_OK;
}

/* (dy) -> zeros with dims[dim] = size, dy at [start, end): dy.dims[dim] must be end - start. */
gt_status gt_shape_slice_backward(gt_graph *g, const gt_node *n, gt_type *out, int *n_out,
                                  gt_error *err)
{
    const gt_type *dy = gt_shape_in(g, n, 0);
    int64_t dim = n->attrs.i[0];
    gt_expr size = n->attrs.e[2];
    GT_TRY(gt_shape_need_dim(g, n, "dim", dim, dy->ndim, err));
    GT_TRY(gt_shape_need_size(g, n, "size", size, err));
    gt_expr len;
    GT_TRY(slice_bounds(g, n, n->attrs.e[0], n->attrs.e[1], size, &len, err));
    if (dy->dims[dim] != len) {
        char ts[160], ls[64];
        return gt_shape_fail(g, n, err, GT_ERR_SHAPE, "dy %s has dim %lld != end - start = %s",
                             gt_type_str(g, dy, ts, sizeof ts), (long long)dim,
                             gt_expr_str(g, len, ls, sizeof ls));
    }
    out[0] = *dy;
    out[0].dims[dim] = size;
    *n_out = 1;
    return GT_OK;
}

/* Inputs agree in dtype, rank and every dim but `dim`, whose sizes add up. */
gt_status gt_shape_concat(gt_graph *g, const gt_node *n, gt_type *out, int *n_out, gt_error *err)
{
    const gt_type *x0 = gt_shape_in(g, n, 0);
    int64_t dim = n->attrs.i[0];
    GT_TRY(gt_shape_need_dim(g, n, "dim", dim, x0->ndim, err));
    out[0] = *x0;
    for (int k = 1; k < n->n_in; k++) {
        const gt_type *x = gt_shape_in(g, n, k);
        bool ok = x->dtype == x0->dtype && x->ndim == x0->ndim;
        for (int d = 0; ok && d < x0->ndim; d++)
            ok = d == dim || x->dims[d] == x0->dims[d];
        if (!ok) {
            char as[160], bs[160];
            return gt_shape_fail(g, n, err, GT_ERR_SHAPE,
                                 "input %d (%s) does not match input 0 (%s) outside dim %lld", k,
                                 gt_type_str(g, x, bs, sizeof bs),
                                 gt_type_str(g, x0, as, sizeof as), (long long)dim);
        }
        out[0].dims[dim] = gt_sym_add(g->sym, out[0].dims[dim], x->dims[dim]);
    }
    *n_out = 1;
    return GT_OK;
}

/* One output per size; the sizes add up to x.dims[dim]. */
gt_status gt_shape_split(gt_graph *g, const gt_node *n, gt_type *out, int *n_out, gt_error *err)
{
    const gt_type *x = gt_shape_in(g, n, 0);
    int64_t dim = n->attrs.i[0];
    GT_TRY(gt_shape_need_dim(g, n, "dim", dim, x->ndim, err));
    int parts = n->attrs.ne;
    if (parts < 1 || parts > GT_MAX_OUT)
        return gt_shape_fail(g, n, err, GT_ERR_SHAPE, "needs 1..%d sizes, got %d", GT_MAX_OUT,
                             parts);
    gt_expr total = gt_sym_const(g->sym, 0);
    for (int k = 0; k < parts; k++) {
        char what[32];
        snprintf(what, sizeof what, "sizes[%d]", k);
        GT_TRY(gt_shape_need_size(g, n, what, n->attrs.e[k], err));
        total = gt_sym_add(g->sym, total, n->attrs.e[k]);
        out[k] = *x;
        out[k].dims[dim] = n->attrs.e[k];
    }
    if (total != x->dims[dim]) {
        char ts[64], xs[160];
        return gt_shape_fail(g, n, err, GT_ERR_SHAPE, "sizes add up to %s, dim %lld of %s",
                             gt_expr_str(g, total, ts, sizeof ts), (long long)dim,
                             gt_type_str(g, x, xs, sizeof xs));
    }
    *n_out = parts;
    return GT_OK;
}
