/* cuda_layout.cu — kernels that move elements: broadcast_to, reshape, transpose, permute, slice,
 * slice_backward, concat, split, embedding; and embedding_backward.
 *
 * Moves copy stored bytes (element size 1, 2, 4 or 8), so every dtype is served exactly; input and
 * output dtypes must match. embedding_backward sums in token order without atomics: one block per
 * vocabulary row scans the ids in order, compacts the positions holding its id (warp ballots and a
 * fixed prefix), and adds those rows of dy in that order — the order a serial scatter-add gives. */
#include "cuda_internal.h"

#include <string.h>

__device__ __forceinline__ void gt_copy_elem(char *dst, int64_t di, const char *src, int64_t si,
                                             int es)
{
    if (es == 4)
        ((uint32_t *)dst)[di] = ((const uint32_t *)src)[si];
    else if (es == 2)
        ((uint16_t *)dst)[di] = ((const uint16_t *)src)[si];
    else if (es == 8)
        ((unsigned long long *)dst)[di] = ((const unsigned long long *)src)[si];
    else
        dst[di] = src[si];
}

/* out[i] = x[offset of i in ix (operand 0)], i over out's elements. */
__global__ void gt_k_gather(gt_cuda_index ix, int64_t n, int es, const char *x, int64_t base,
                            char *out)
{
    GT_GRID_STRIDE(i, n)
    {
        int64_t off[1];
        gt_index_offsets(ix, i, 1, off);
        gt_copy_elem(out, i, x, base + off[0], es);
    }
}

static gt_status gt_cuda_gather(gt_cuda_stream *s, const gt_kernel_call *c, const gt_tensor *x,
                                const int64_t *xstride, int64_t base, gt_tensor *out, gt_error *err)
{
    int64_t n = gt_tensor_numel(out);
    if (n == 0) return GT_OK;
    gt_cuda_index ix;
    memset(&ix, 0, sizeof ix);
    ix.ndim = out->ndim;
    memcpy(ix.shape, out->shape, sizeof ix.shape);
    memcpy(ix.stride[0], xstride, sizeof(int64_t) * (size_t)out->ndim);
    gt_k_gather<<<gt_cuda_blocks(n), GT_CUDA_THREADS, 0, s->stream>>>(
        ix, n, (int)gt_dtype_size(x->dtype), (const char *)x->data, base, (char *)out->data);
    return gt_cuda_launched(c, err);
}

static gt_status gt_cuda_same_dtype(const gt_kernel_call *c, const gt_tensor *a, const gt_tensor *b,
                                    gt_error *err)
{
    if (a->dtype == b->dtype) return GT_OK;
    return gt_error_set(err, GT_ERR_SHAPE, "%s: input is %s but output is %s, expected the same",
                        gt_cuda_op_name(c->op), gt_dtype_name(a->dtype), gt_dtype_name(b->dtype));
}

static bool gt_cuda_out_matches_e(const gt_kernel_call *c, const gt_tensor *out)
{
    if (c->ne != out->ndim || (c->ne > 0 && !c->e)) return false;
    for (int d = 0; d < out->ndim; d++)
        if (c->e[d] != out->shape[d]) return false;
    return true;
}

gt_status gt_cuda_broadcast_to(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    const gt_tensor *x = c->in[0];
    gt_tensor *out = c->out[0];
    GT_TRY(gt_cuda_same_dtype(c, x, out, err));
    int64_t xs[GT_MAX_DIMS];
    if (!gt_cuda_out_matches_e(c, out) ||
        !gt_cuda_broadcast_strides(out->ndim, out->shape, x->ndim, x->shape, xs))
        return gt_cuda_shape_error(c, "output does not fit the input and the attributes", err);
    return gt_cuda_gather(s, c, x, xs, 0, out, err);
}

gt_status gt_cuda_reshape(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    const gt_tensor *x = c->in[0];
    gt_tensor *out = c->out[0];
    GT_TRY(gt_cuda_same_dtype(c, x, out, err));
    if (!gt_cuda_out_matches_e(c, out) || gt_tensor_numel(x) != gt_tensor_numel(out))
        return gt_cuda_shape_error(c, "output does not fit the input and the attributes", err);
    if (x->data == out->data || gt_tensor_nbytes(x) == 0) return GT_OK;
    return gt_cuda_check(c,
                         cudaMemcpyAsync(out->data, x->data, gt_tensor_nbytes(x),
                                         cudaMemcpyDeviceToDevice, s->stream),
                         "copy", err);
}

static gt_status gt_cuda_permute_by(gt_cuda_stream *s, const gt_kernel_call *c, const int *perm,
                                    gt_error *err)
{
    const gt_tensor *x = c->in[0];
    gt_tensor *out = c->out[0];
    GT_TRY(gt_cuda_same_dtype(c, x, out, err));
    if (out->ndim != x->ndim) return gt_cuda_shape_error(c, "rank mismatch", err);
    int64_t xstr[GT_MAX_DIMS], g[GT_MAX_DIMS];
    gt_cuda_contig_strides(x->ndim, x->shape, xstr);
    for (int k = 0; k < x->ndim; k++) {
        if (out->shape[k] != x->shape[perm[k]])
            return gt_cuda_shape_error(c, "output is not the permuted input", err);
        g[k] = xstr[perm[k]];
    }
    return gt_cuda_gather(s, c, x, g, 0, out, err);
}

gt_status gt_cuda_transpose(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    GT_TRY(gt_cuda_want_attrs(c, 2, 0, 0, err));
    int rank = c->in[0]->ndim, d0, d1, perm[GT_MAX_DIMS];
    GT_TRY(gt_cuda_norm_dim(c, c->i[0], rank, &d0, err));
    GT_TRY(gt_cuda_norm_dim(c, c->i[1], rank, &d1, err));
    for (int k = 0; k < rank; k++)
        perm[k] = k;
    perm[d0] = d1;
    perm[d1] = d0;
    return gt_cuda_permute_by(s, c, perm, err);
}

gt_status gt_cuda_permute(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    int rank = c->in[0]->ndim, perm[GT_MAX_DIMS];
    bool seen[GT_MAX_DIMS] = {false};
    if (c->ni != rank)
        return gt_error_set(err, GT_ERR_INVALID, "permute: %d perm entries for rank %d", c->ni,
                            rank);
    for (int k = 0; k < rank; k++) {
        GT_TRY(gt_cuda_norm_dim(c, c->i[k], rank, &perm[k], err));
        if (seen[perm[k]])
            return gt_error_set(err, GT_ERR_INVALID, "permute: dim %d appears twice", perm[k]);
        seen[perm[k]] = true;
    }
    return gt_cuda_permute_by(s, c, perm, err);
}

static void gt_cuda_outer_inner(const gt_tensor *t, int dim, int64_t *outer, int64_t *inner)
{
    *outer = 1;
    *inner = 1;
    for (int d = 0; d < dim; d++)
        *outer *= t->shape[d];
    for (int d = dim + 1; d < t->ndim; d++)
        *inner *= t->shape[d];
}

static bool gt_cuda_same_but(const gt_tensor *a, const gt_tensor *b, int dim)
{
    if (a->ndim != b->ndim) return false;
    for (int d = 0; d < a->ndim; d++)
        if (d != dim && a->shape[d] != b->shape[d]) return false;
    return true;
}

/* For each of `outer` blocks, copies n * inner elements from src (dim extent src_dim, starting at
 * src_off) to dst (extent dst_dim, at dst_off): a 2D copy, one row per outer block. */
static gt_status gt_cuda_copy_blocks(gt_cuda_stream *s, const gt_kernel_call *c, void *dst,
                                     int64_t dst_dim, int64_t dst_off, const void *src,
                                     int64_t src_dim, int64_t src_off, int64_t n, int64_t outer,
                                     int64_t inner, size_t es, gt_error *err)
{
    size_t row = (size_t)(n * inner) * es;
    if (row == 0 || outer == 0) return GT_OK;
    cudaError_t e = cudaMemcpy2DAsync(
        (char *)dst + (size_t)(dst_off * inner) * es, (size_t)(dst_dim * inner) * es,
        (const char *)src + (size_t)(src_off * inner) * es, (size_t)(src_dim * inner) * es, row,
        (size_t)outer, cudaMemcpyDeviceToDevice, s->stream);
    return gt_cuda_check(c, e, "2D copy", err);
}

gt_status gt_cuda_slice(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    GT_TRY(gt_cuda_want_attrs(c, 1, 0, 2, err));
    const gt_tensor *x = c->in[0];
    gt_tensor *out = c->out[0];
    GT_TRY(gt_cuda_same_dtype(c, x, out, err));
    int dim;
    GT_TRY(gt_cuda_norm_dim(c, c->i[0], x->ndim, &dim, err));
    int64_t start = c->e[0], end = c->e[1];
    if (start < 0 || end < start || end > x->shape[dim])
        return gt_error_set(err, GT_ERR_INVALID, "slice: [%lld, %lld) outside dim %d of size %lld",
                            (long long)start, (long long)end, dim, (long long)x->shape[dim]);
    if (!gt_cuda_same_but(x, out, dim) || out->shape[dim] != end - start)
        return gt_cuda_shape_error(c, "output does not fit the slice", err);
    int64_t outer, inner;
    gt_cuda_outer_inner(x, dim, &outer, &inner);
    return gt_cuda_copy_blocks(s, c, out->data, end - start, 0, x->data, x->shape[dim], start,
                               end - start, outer, inner, gt_dtype_size(x->dtype), err);
}

gt_status gt_cuda_slice_backward(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    GT_TRY(gt_cuda_want_attrs(c, 1, 0, 3, err));
    const gt_tensor *dy = c->in[0];
    gt_tensor *out = c->out[0];
    GT_TRY(gt_cuda_same_dtype(c, dy, out, err));
    int dim;
    GT_TRY(gt_cuda_norm_dim(c, c->i[0], dy->ndim, &dim, err));
    int64_t start = c->e[0], end = c->e[1], size = c->e[2];
    if (start < 0 || end < start || end > size)
        return gt_error_set(err, GT_ERR_INVALID,
                            "slice_backward: [%lld, %lld) outside dim %d of size %lld",
                            (long long)start, (long long)end, dim, (long long)size);
    if (!gt_cuda_same_but(dy, out, dim) || dy->shape[dim] != end - start || out->shape[dim] != size)
        return gt_cuda_shape_error(c, "output does not fit the slice", err);
    if (gt_tensor_nbytes(out) > 0)
        GT_TRY(gt_cuda_check(c, cudaMemsetAsync(out->data, 0, gt_tensor_nbytes(out), s->stream),
                             "memset", err));
    int64_t outer, inner;
    gt_cuda_outer_inner(out, dim, &outer, &inner);
    return gt_cuda_copy_blocks(s, c, out->data, size, start, dy->data, end - start, 0, end - start,
                               outer, inner, gt_dtype_size(dy->dtype), err);
}

gt_status gt_cuda_concat(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    GT_TRY(gt_cuda_want_attrs(c, 1, 0, 0, err));
    gt_tensor *out = c->out[0];
    int dim;
    GT_TRY(gt_cuda_norm_dim(c, c->i[0], out->ndim, &dim, err));
    int64_t total = 0;
    for (int k = 0; k < c->n_in; k++) {
        GT_TRY(gt_cuda_same_dtype(c, c->in[k], out, err));
        if (!gt_cuda_same_but(c->in[k], out, dim))
            return gt_cuda_shape_error(c, "an input does not fit the output", err);
        total += c->in[k]->shape[dim];
    }
    if (total != out->shape[dim]) return gt_cuda_shape_error(c, "sizes do not add up", err);
    int64_t outer, inner, off = 0;
    gt_cuda_outer_inner(out, dim, &outer, &inner);
    for (int k = 0; k < c->n_in; k++) {
        int64_t n = c->in[k]->shape[dim];
        GT_TRY(gt_cuda_copy_blocks(s, c, out->data, total, off, c->in[k]->data, n, 0, n, outer,
                                   inner, gt_dtype_size(out->dtype), err));
        off += n;
    }
    return GT_OK;
}

gt_status gt_cuda_split(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    GT_TRY(gt_cuda_want_attrs(c, 1, 0, 0, err));
    const gt_tensor *x = c->in[0];
    int dim;
    GT_TRY(gt_cuda_norm_dim(c, c->i[0], x->ndim, &dim, err));
    if (c->ne != c->n_out)
        return gt_error_set(err, GT_ERR_INVALID, "split: %d sizes but %d outputs", c->ne, c->n_out);
    int64_t total = 0;
    for (int k = 0; k < c->n_out; k++) {
        GT_TRY(gt_cuda_same_dtype(c, x, c->out[k], err));
        if (!gt_cuda_same_but(c->out[k], x, dim) || c->out[k]->shape[dim] != c->e[k])
            return gt_cuda_shape_error(c, "an output does not fit the sizes", err);
        total += c->e[k];
    }
    if (total != x->shape[dim]) return gt_cuda_shape_error(c, "sizes do not add up", err);
    int64_t outer, inner, off = 0;
    gt_cuda_outer_inner(x, dim, &outer, &inner);
    for (int k = 0; k < c->n_out; k++) {
        int64_t n = c->e[k];
        GT_TRY(gt_cuda_copy_blocks(s, c, c->out[k]->data, n, 0, x->data, total, off, n, outer,
                                   inner, gt_dtype_size(x->dtype), err));
        off += n;
    }
    return GT_OK;
}

/* ---------------------------------------------------------------- embedding */

/* out[p, :] = w[ids[p], :]; an id outside [0, V) is flagged and its row written as zero bytes. */
__global__ void gt_k_embedding(int64_t n, int64_t d, int es, const char *w, int64_t vocab,
                               const void *ids, int dids, char *out, unsigned long long *flag)
{
    GT_GRID_STRIDE(i, n * d)
    {
        int64_t p = i / d, j = i - p * d, id = gt_ld_index(ids, dids, p);
        if (id < 0 || id >= vocab) {
            if (j == 0) gt_flag(flag, GT_OP_EMBEDDING, p, vocab);
            for (int b = 0; b < es; b++)
                out[i * es + b] = 0;
            continue;
        }
        gt_copy_elem(out, i, w, id * d + j, es);
    }
}

gt_status gt_cuda_embedding(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    const gt_tensor *w = c->in[0], *ids = c->in[1];
    gt_tensor *out = c->out[0];
    GT_TRY(gt_cuda_want_index(c, ids, "ids", err));
    GT_TRY(gt_cuda_same_dtype(c, w, out, err));
    if (w->ndim != 2) return gt_cuda_shape_error(c, "w must be [V, D]", err);
    int64_t vocab = w->shape[0], d = w->shape[1];
    bool ok = out->ndim == ids->ndim + 1 && out->shape[ids->ndim] == d;
    for (int k = 0; ok && k < ids->ndim; k++)
        ok = out->shape[k] == ids->shape[k];
    if (!ok) return gt_cuda_shape_error(c, "output should be [ids..., D]", err);
    int64_t n = gt_tensor_numel(ids);
    if (n * d == 0) return GT_OK;
    gt_k_embedding<<<gt_cuda_blocks(n * d), GT_CUDA_THREADS, 0, s->stream>>>(
        n, d, (int)gt_dtype_size(w->dtype), (const char *)w->data, vocab, ids->data, ids->dtype,
        (char *)out->data, s->flag);
    return gt_cuda_launched(c, err);
}

#define GT_EMB_THREADS 256

/* Block v: dw[v, :] = sum over positions p with ids[p] == v, in increasing p, of dy[p, :]. Each
 * thread owns columns j = tid, tid + 256, ...; at most 8 columns per thread live in registers per
 * pass over the ids (wider rows take several passes). */
__global__ void __launch_bounds__(GT_EMB_THREADS)
    gt_k_embedding_backward(int64_t n, int64_t d, int64_t vocab, const void *ids, int dids,
                            const void *dy, int ddy, void *dw, int ddw, unsigned long long *flag)
{
    __shared__ int64_t hits[GT_EMB_THREADS];
    __shared__ int warp_count[GT_EMB_THREADS / 32], warp_base[GT_EMB_THREADS / 32 + 1];
    int64_t v = blockIdx.x;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int64_t j0 = 0; j0 < d; j0 += 8 * GT_EMB_THREADS) {
        float acc[8];
#pragma unroll
        for (int k = 0; k < 8; k++)
            acc[k] = 0.0f;
        for (int64_t p0 = 0; p0 < n; p0 += GT_EMB_THREADS) {
            int64_t p = p0 + threadIdx.x;
            bool hit = false;
            if (p < n) {
                int64_t id = gt_ld_index(ids, dids, p);
                hit = id == v;
                /* Block 0 reports ids out of range once, on its first column pass. */
                if (v == 0 && j0 == 0 && (id < 0 || id >= vocab))
                    gt_flag(flag, GT_OP_EMBEDDING_BACKWARD, p, vocab);
            }
            unsigned mask = __ballot_sync(0xffffffffu, hit);
            if (lane == 0) warp_count[warp] = __popc(mask);
            __syncthreads();
            if (threadIdx.x == 0) {
                warp_base[0] = 0;
                for (int k = 0; k < GT_EMB_THREADS / 32; k++)
                    warp_base[k + 1] = warp_base[k] + warp_count[k];
            }
            __syncthreads();
            if (hit) hits[warp_base[warp] + __popc(mask & ((1u << lane) - 1u))] = p;
            __syncthreads();
            int nh = warp_base[GT_EMB_THREADS / 32];
            for (int h = 0; h < nh; h++) {
                int64_t row = hits[h] * d;
#pragma unroll
                for (int k = 0; k < 8; k++) {
                    int64_t j = j0 + k * GT_EMB_THREADS + threadIdx.x;
                    if (j < d) acc[k] += gt_ld(dy, ddy, row + j);
                }
            }
            __syncthreads();
        }
#pragma unroll
        for (int k = 0; k < 8; k++) {
            int64_t j = j0 + k * GT_EMB_THREADS + threadIdx.x;
            if (j < d) gt_st(dw, ddw, v * d + j, acc[k]);
        }
    }
}

gt_status gt_cuda_embedding_backward(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    GT_TRY(gt_cuda_want_attrs(c, 0, 0, 1, err));
    const gt_tensor *ids = c->in[0], *dy = c->in[1];
    gt_tensor *dw = c->out[0];
    GT_TRY(gt_cuda_want_index(c, ids, "ids", err));
    GT_TRY(gt_cuda_want_float(c, dy, "dy", err));
    GT_TRY(gt_cuda_want_float(c, dw, "dw", err));
    if (dw->ndim != 2) return gt_cuda_shape_error(c, "dw must be [V, D]", err);
    int64_t vocab = dw->shape[0], d = dw->shape[1];
    bool ok = vocab == c->e[0] && dy->ndim == ids->ndim + 1 && dy->shape[ids->ndim] == d;
    for (int k = 0; ok && k < ids->ndim; k++)
        ok = dy->shape[k] == ids->shape[k];
    if (!ok)
        return gt_cuda_shape_error(c, "expected dy [ids..., D] and dw [num_embeddings, D]", err);
    if (vocab * d == 0) return GT_OK;
    if (vocab > 0x7fffffff)
        return gt_error_set(err, GT_ERR_UNSUPPORTED, "embedding_backward: %lld rows exceed a grid",
                            (long long)vocab);
    gt_k_embedding_backward<<<(unsigned)vocab, GT_EMB_THREADS, 0, s->stream>>>(
        gt_tensor_numel(ids), d, vocab, ids->data, ids->dtype, dy->data, dy->dtype, dw->data,
        dw->dtype, s->flag);
    return gt_cuda_launched(c, err);
}
