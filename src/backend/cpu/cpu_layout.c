/* cpu_layout.c — kernels that only move elements: broadcast_to, reshape, transpose, permute,
 * slice, slice_backward, concat, split.
 *
 * They copy stored bytes, so they serve every dtype (f32, bf16, ids, masks) unchanged and exactly;
 * input and output dtypes must match. Shapes are checked against the attributes, so a caller's
 * mistake becomes GT_ERR_SHAPE instead of an out-of-bounds copy. */
#include "cpu_internal.h"

#include <string.h>

/* Copies n elements of size es from src (element stride ss: 0 replicates one element) to the
 * contiguous dst. */
static void gt_cpu_copy_row(char *dst, const char *src, int64_t n, int64_t ss, size_t es)
{
    if (ss == 1) {
        memcpy(dst, src, (size_t)n * es);
        return;
    }
    switch (es) {
    case 1:
        for (int64_t j = 0; j < n; j++)
            dst[j] = src[j * ss];
        break;
    case 2:
        for (int64_t j = 0; j < n; j++)
            ((uint16_t *)dst)[j] = ((const uint16_t *)src)[j * ss];
        break;
    case 4:
        for (int64_t j = 0; j < n; j++)
            ((uint32_t *)dst)[j] = ((const uint32_t *)src)[j * ss];
        break;
    default:
        for (int64_t j = 0; j < n; j++)
            ((uint64_t *)dst)[j] = ((const uint64_t *)src)[j * ss];
        break;
    }
}

/* out[idx] = x[sum_d idx[d] * xstride[d]] over out's index space, row-major. */
static void gt_cpu_gather(const gt_tensor *x, const int64_t *xstride, gt_tensor *out)
{
    int64_t ostr[GT_MAX_DIMS];
    gt_kernel_contig_strides(out->ndim, out->shape, ostr);
    const int64_t *strides[2] = {xstride, ostr};
    gt_cpu_iter it;
    gt_cpu_iter_init(&it, out->ndim, out->shape, 2, strides);
    size_t es = gt_dtype_size(x->dtype);
    const char *xp = x->data;
    char *op = out->data;
    for (int64_t r = 0; r < it.rows; r++) {
        gt_cpu_copy_row(op + (size_t)it.off[1] * es, xp + (size_t)it.off[0] * es, it.len,
                        it.inner[0], es);
        gt_cpu_iter_next(&it);
    }
}

static gt_status gt_cpu_shape_error(const gt_kernel_call *c, const gt_tensor *x,
                                    const gt_tensor *out, gt_error *err)
{
    char bx[128], bo[128];
    return gt_error_set(err, GT_ERR_SHAPE, "%s: output %s does not fit input %s and the attributes",
                        gt_kernel_op_name(c->op), gt_kernel_fmt(out, bo, sizeof bo),
                        gt_kernel_fmt(x, bx, sizeof bx));
}

/* True when out's shape equals the expression attributes e[0..ne). */
static bool gt_cpu_out_matches_e(const gt_kernel_call *c, const gt_tensor *out)
{
    if (c->ne != out->ndim || (c->ne > 0 && !c->e)) return false;
    for (int d = 0; d < out->ndim; d++)
        if (c->e[d] != out->shape[d]) return false;
    return true;
}

gt_status gt_cpu_broadcast_to(const gt_kernel_call *c, gt_error *err)
{
    const gt_tensor *x = c->in[0];
    gt_tensor *out = c->out[0];
    GT_TRY(gt_kernel_want_same_dtype(c, x, "input", out, "output", err));
    int64_t xs[GT_MAX_DIMS];
    if (!gt_cpu_out_matches_e(c, out) ||
        !gt_cpu_broadcast_strides(out->ndim, out->shape, x->ndim, x->shape, xs))
        return gt_cpu_shape_error(c, x, out, err);
    gt_cpu_gather(x, xs, out);
    return GT_OK;
}

gt_status gt_cpu_reshape(const gt_kernel_call *c, gt_error *err)
{
    const gt_tensor *x = c->in[0];
    gt_tensor *out = c->out[0];
    GT_TRY(gt_kernel_want_same_dtype(c, x, "input", out, "output", err));
    if (!gt_cpu_out_matches_e(c, out) || gt_tensor_numel(x) != gt_tensor_numel(out))
        return gt_cpu_shape_error(c, x, out, err);
    if (x->data != out->data && gt_tensor_nbytes(x) > 0)
        memmove(out->data, x->data, gt_tensor_nbytes(x));
    return GT_OK;
}

/* out.shape[k] = x.shape[perm[k]]: gather with x's stride of dim perm[k] along out dim k. */
static gt_status gt_cpu_permute_by(const gt_kernel_call *c, const int *perm, gt_error *err)
{
    const gt_tensor *x = c->in[0];
    gt_tensor *out = c->out[0];
    GT_TRY(gt_kernel_want_same_dtype(c, x, "input", out, "output", err));
    if (out->ndim != x->ndim) return gt_cpu_shape_error(c, x, out, err);
    int64_t xstr[GT_MAX_DIMS], g[GT_MAX_DIMS];
    gt_kernel_contig_strides(x->ndim, x->shape, xstr);
    for (int k = 0; k < x->ndim; k++) {
        if (out->shape[k] != x->shape[perm[k]]) return gt_cpu_shape_error(c, x, out, err);
        g[k] = xstr[perm[k]];
    }
    gt_cpu_gather(x, g, out);
    return GT_OK;
}

gt_status gt_cpu_transpose(const gt_kernel_call *c, gt_error *err)
{
    GT_TRY(gt_kernel_want_attrs(c, 2, 0, 0, err));
    int rank = c->in[0]->ndim, d0, d1, perm[GT_MAX_DIMS];
    GT_TRY(gt_kernel_norm_dim(c, c->i[0], rank, &d0, err));
    GT_TRY(gt_kernel_norm_dim(c, c->i[1], rank, &d1, err));
    for (int k = 0; k < rank; k++)
        perm[k] = k;
    perm[d0] = d1;
    perm[d1] = d0;
    return gt_cpu_permute_by(c, perm, err);
}

gt_status gt_cpu_permute(const gt_kernel_call *c, gt_error *err)
{
    int rank = c->in[0]->ndim, perm[GT_MAX_DIMS];
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
    return gt_cpu_permute_by(c, perm, err);
}

/* Copies, for each of `outer` blocks, `n` elements of dim-extent from src (extent src_dim, at
 * src_off) to dst (extent dst_dim, at dst_off); `inner` elements per dim step. */
static void gt_cpu_copy_blocks(char *dst, int64_t dst_dim, int64_t dst_off, const char *src,
                               int64_t src_dim, int64_t src_off, int64_t n, int64_t outer,
                               int64_t inner, size_t es)
{
    size_t row = (size_t)(n * inner) * es;
    if (row == 0) return;
    for (int64_t o = 0; o < outer; o++)
        memcpy(dst + (size_t)((o * dst_dim + dst_off) * inner) * es,
               src + (size_t)((o * src_dim + src_off) * inner) * es, row);
}

gt_status gt_cpu_slice(const gt_kernel_call *c, gt_error *err)
{
    GT_TRY(gt_kernel_want_attrs(c, 1, 0, 2, err));
    const gt_tensor *x = c->in[0];
    gt_tensor *out = c->out[0];
    GT_TRY(gt_kernel_want_same_dtype(c, x, "input", out, "output", err));
    int dim;
    GT_TRY(gt_kernel_norm_dim(c, c->i[0], x->ndim, &dim, err));
    int64_t start = c->e[0], end = c->e[1];
    if (start < 0 || end < start || end > x->shape[dim])
        return gt_error_set(err, GT_ERR_INVALID, "slice: [%lld, %lld) outside dim %d of size %lld",
                            (long long)start, (long long)end, dim, (long long)x->shape[dim]);
    if (!gt_kernel_same_but(x, out, dim) || out->shape[dim] != end - start)
        return gt_cpu_shape_error(c, x, out, err);
    int64_t outer, inner;
    gt_kernel_outer_inner(x, dim, &outer, &inner);
    gt_cpu_copy_blocks(out->data, end - start, 0, x->data, x->shape[dim], start, end - start, outer,
                       inner, gt_dtype_size(x->dtype));
    return GT_OK;
}

gt_status gt_cpu_slice_backward(const gt_kernel_call *c, gt_error *err)
{
    GT_TRY(gt_kernel_want_attrs(c, 1, 0, 3, err));
    const gt_tensor *dy = c->in[0];
    gt_tensor *out = c->out[0];
    GT_TRY(gt_kernel_want_same_dtype(c, dy, "dy", out, "output", err));
    int dim;
    GT_TRY(gt_kernel_norm_dim(c, c->i[0], dy->ndim, &dim, err));
    int64_t start = c->e[0], end = c->e[1], size = c->e[2];
    if (start < 0 || end < start || end > size)
        return gt_error_set(err, GT_ERR_INVALID,
                            "slice_backward: [%lld, %lld) outside dim %d of size %lld",
                            (long long)start, (long long)end, dim, (long long)size);
    if (!gt_kernel_same_but(dy, out, dim) || dy->shape[dim] != end - start ||
        out->shape[dim] != size)
        return gt_cpu_shape_error(c, dy, out, err);
    /* All-zero bytes are 0 in every dtype. */
    if (gt_tensor_nbytes(out) > 0) memset(out->data, 0, gt_tensor_nbytes(out));
    int64_t outer, inner;
    gt_kernel_outer_inner(out, dim, &outer, &inner);
    gt_cpu_copy_blocks(out->data, size, start, dy->data, end - start, 0, end - start, outer, inner,
                       gt_dtype_size(dy->dtype));
    return GT_OK;
}

gt_status gt_cpu_concat(const gt_kernel_call *c, gt_error *err)
{
    GT_TRY(gt_kernel_want_attrs(c, 1, 0, 0, err));
    gt_tensor *out = c->out[0];
    int dim;
    GT_TRY(gt_kernel_norm_dim(c, c->i[0], out->ndim, &dim, err));
    int64_t total = 0;
    for (int k = 0; k < c->n_in; k++) {
        GT_TRY(gt_kernel_want_same_dtype(c, c->in[k], "an input", out, "output", err));
        if (!gt_kernel_same_but(c->in[k], out, dim))
            return gt_cpu_shape_error(c, c->in[k], out, err);
        total += c->in[k]->shape[dim];
    }
    if (total != out->shape[dim]) return gt_cpu_shape_error(c, c->in[0], out, err);
    int64_t outer, inner, off = 0;
    gt_kernel_outer_inner(out, dim, &outer, &inner);
    for (int k = 0; k < c->n_in; k++) {
        int64_t n = c->in[k]->shape[dim];
        gt_cpu_copy_blocks(out->data, total, off, c->in[k]->data, n, 0, n, outer, inner,
                           gt_dtype_size(out->dtype));
        off += n;
    }
    return GT_OK;
}

gt_status gt_cpu_split(const gt_kernel_call *c, gt_error *err)
{
    GT_TRY(gt_kernel_want_attrs(c, 1, 0, 0, err));
    const gt_tensor *x = c->in[0];
    int dim;
    GT_TRY(gt_kernel_norm_dim(c, c->i[0], x->ndim, &dim, err));
    if (c->ne != c->n_out)
        return gt_error_set(err, GT_ERR_INVALID, "split: %d sizes but %d outputs", c->ne, c->n_out);
    int64_t total = 0;
    for (int k = 0; k < c->n_out; k++) {
        GT_TRY(gt_kernel_want_same_dtype(c, x, "input", c->out[k], "an output", err));
        if (!gt_kernel_same_but(c->out[k], x, dim) || c->out[k]->shape[dim] != c->e[k])
            return gt_cpu_shape_error(c, x, c->out[k], err);
        total += c->e[k];
    }
    if (total != x->shape[dim]) return gt_cpu_shape_error(c, x, c->out[0], err);
    int64_t outer, inner, off = 0;
    gt_kernel_outer_inner(x, dim, &outer, &inner);
    for (int k = 0; k < c->n_out; k++) {
        int64_t n = c->e[k];
        gt_cpu_copy_blocks(c->out[k]->data, n, 0, x->data, total, off, n, outer, inner,
                           gt_dtype_size(x->dtype));
        off += n;
    }
    return GT_OK;
}
