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

gt_status gt_cpu_broadcast_to(const gt_kernel_call *c, gt_error *err)
{
    const gt_tensor *x = c->in[0];
    gt_tensor *out = c->out[0];
    GT_TRY(gt_kernel_want_same_dtype(c, x, "input", out, "output", err));
    int64_t xs[GT_MAX_DIMS];
    if (!gt_kernel_out_matches_e(c, out) ||
        !gt_cpu_broadcast_strides(out->ndim, out->shape, x->ndim, x->shape, xs))
        return gt_kernel_shape_error(c, x, out, err);
    gt_cpu_gather(x, xs, out);
    return GT_OK;
}

gt_status gt_cpu_reshape(const gt_kernel_call *c, gt_error *err)
{
    const gt_tensor *x = c->in[0];
    gt_tensor *out = c->out[0];
    GT_TRY(gt_kernel_want_reshape(c, err));
    if (x->data != out->data && gt_tensor_nbytes(x) > 0)
        memmove(out->data, x->data, gt_tensor_nbytes(x));
    return GT_OK;
}

/* A reshape the symbols could not prove: gt_kernel_want_reshape checks the bound numel. */
gt_status gt_cpu_regroup(const gt_kernel_call *c, gt_error *err)
{
    return gt_cpu_reshape(c, err);
}

/* out.shape[k] = x.shape[perm[k]]: gather with x's stride of dim perm[k] along out dim k. */
static gt_status gt_cpu_permute_by(const gt_kernel_call *c, gt_error *err)
{
    const gt_tensor *x = c->in[0];
    int perm[GT_MAX_DIMS];
    GT_TRY(gt_kernel_want_perm(c, perm, err));
    int64_t xstr[GT_MAX_DIMS], g[GT_MAX_DIMS];
    gt_kernel_contig_strides(x->ndim, x->shape, xstr);
    for (int k = 0; k < x->ndim; k++)
        g[k] = xstr[perm[k]];
    gt_cpu_gather(x, g, c->out[0]);
    return GT_OK;
}

gt_status gt_cpu_transpose(const gt_kernel_call *c, gt_error *err)
{
    return gt_cpu_permute_by(c, err);
}

gt_status gt_cpu_permute(const gt_kernel_call *c, gt_error *err)
{
    return gt_cpu_permute_by(c, err);
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
    const gt_tensor *x = c->in[0];
    gt_tensor *out = c->out[0];
    int dim;
    GT_TRY(gt_kernel_want_slice(c, &dim, err));
    int64_t start = c->e[0], end = c->e[1];
    int64_t outer, inner;
    gt_kernel_outer_inner(x, dim, &outer, &inner);
    gt_cpu_copy_blocks(out->data, end - start, 0, x->data, x->shape[dim], start, end - start, outer,
                       inner, gt_dtype_size(x->dtype));
    return GT_OK;
}

gt_status gt_cpu_slice_backward(const gt_kernel_call *c, gt_error *err)
{
    const gt_tensor *dy = c->in[0];
    gt_tensor *out = c->out[0];
    int dim;
    GT_TRY(gt_kernel_want_slice_backward(c, &dim, err));
    int64_t start = c->e[0], end = c->e[1], size = c->e[2];
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
    gt_tensor *out = c->out[0];
    int dim;
    GT_TRY(gt_kernel_want_concat(c, &dim, err));
    int64_t total = out->shape[dim], outer, inner, off = 0;
    gt_kernel_outer_inner(out, dim, &outer, &inner);
    for (int k = 0; k < c->n_in; k++) {
        int64_t n = c->in[k]->shape[dim];
        if (!gt_kernel_concat_in_place(c->in[k], out, outer, off, inner))
            gt_cpu_copy_blocks(out->data, total, off, c->in[k]->data, n, 0, n, outer, inner,
                               gt_dtype_size(out->dtype));
        off += n;
    }
    return GT_OK;
}

gt_status gt_cpu_split(const gt_kernel_call *c, gt_error *err)
{
    const gt_tensor *x = c->in[0];
    int dim;
    GT_TRY(gt_kernel_want_split(c, &dim, err));
    int64_t total = x->shape[dim], outer, inner, off = 0;
    gt_kernel_outer_inner(x, dim, &outer, &inner);
    for (int k = 0; k < c->n_out; k++) {
        int64_t n = c->e[k];
        gt_cpu_copy_blocks(c->out[k]->data, n, 0, x->data, total, off, n, outer, inner,
                           gt_dtype_size(x->dtype));
        off += n;
    }
    return GT_OK;
}
