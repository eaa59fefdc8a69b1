/* cuda_layout.cu — kernels that move elements: broadcast_to, reshape, transpose, permute, slice,
 * slice_backward, concat, split, embedding; and embedding_backward.
 *
 * Moves copy stored bytes (element size 1, 2, 4 or 8), so every dtype is served exactly; input and
 * output dtypes must match. A gather (broadcast_to, transpose, permute) first drops size-1 dims and
 * merges dims the input holds contiguously, then picks one of three kernels:
 *   - the innermost output dim is contiguous in the input (e.g. [b,s,h,d] -> [b,h,s,d]): rows of
 *     that dim are copied with the widest access (up to 16 bytes) that every row start allows;
 *   - another output dim is the input's contiguous one (a true transpose): 32x32 tiles through
 *     shared memory, so that both the reads and the writes are coalesced;
 *   - otherwise (a broadcast innermost dim): one element per thread, index-mapped.
 * embedding_backward (and embedding_shard_backward, through gt_cuda_embedding_grad) sums in token
 * order without atomics on floats: the token positions are sorted by id with CUB's stable radix
 * sort, then one block per vocabulary row finds its run of positions (one binary search per row,
 * in parallel) and adds those rows of dy in increasing position — the order a serial scatter-add
 * gives. Work O(N * passes + V * D) instead of the O(V * N) of a scan per row. */
#include "cuda_internal.h"

#include <cub/device/device_radix_sort.cuh>
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

/* Rows of `row_units` units of type U: row r (row-major over ix's dims) starts at unit offset
 * base + offset of r in ix (operand 0; strides already in units) of x; out is contiguous. */
template <typename U>
__global__ void gt_k_copy_rows(gt_cuda_index ix, int64_t n_units, int64_t row_units, const U *x,
                               int64_t base, U *out)
{
    GT_GRID_STRIDE(i, n_units)
    {
        int64_t r = i / row_units, u = i - r * row_units, off[1];
        gt_index_offsets(ix, r, 1, off);
        out[i] = x[base + off[0] + u];
    }
}

/* The transpose of dims B (input stride 1, output stride ob) and L (the output's innermost dim,
 * input stride sl), for every index of the other ("batch") dims, in 32x32 tiles: a warp reads 32
 * consecutive input elements along B and writes 32 consecutive output elements along L. */
typedef struct {
    gt_cuda_index batch; /* operand 0: input strides, operand 1: output strides */
    int64_t nb, nl, sl, ob, tiles_b, tiles_l, n_tiles;
} gt_tile_desc;

#define GT_TILE 32
#define GT_TILE_ROWS 8

template <typename T>
__global__ void __launch_bounds__(GT_TILE *GT_TILE_ROWS)
    gt_k_transpose_tiles(gt_tile_desc t, const T *x, int64_t base, T *out)
{
    __shared__ T tile[GT_TILE][GT_TILE + 1];
    for (int64_t k = blockIdx.x; k < t.n_tiles; k += gridDim.x) {
        int64_t tl = k % t.tiles_l, rest = k / t.tiles_l, tb = rest % t.tiles_b;
        int64_t off[2];
        gt_index_offsets(t.batch, rest / t.tiles_b, 2, off);
        int64_t b0 = tb * GT_TILE, l0 = tl * GT_TILE;
        for (int r = threadIdx.y; r < GT_TILE; r += GT_TILE_ROWS) {
            int64_t l = l0 + r, bb = b0 + threadIdx.x;
            if (l < t.nl && bb < t.nb) tile[r][threadIdx.x] = x[base + off[0] + bb + l * t.sl];
        }
        __syncthreads();
        for (int r = threadIdx.y; r < GT_TILE; r += GT_TILE_ROWS) {
            int64_t bb = b0 + r, l = l0 + threadIdx.x;
            if (l < t.nl && bb < t.nb) out[off[1] + bb * t.ob + l] = tile[threadIdx.x][r];
        }
        __syncthreads();
    }
}

/* Drops size-1 dims and merges each dim into the one before it where the input holds them
 * contiguously (stride[prev] == stride[d] * shape[d]); the output is row-major, so its order is
 * unchanged. Returns the new rank (at least 1). */
static int gt_cuda_collapse(int nd, const int64_t *shape, const int64_t *stride, int64_t *cs,
                            int64_t *cst)
{
    int m = 0;
    for (int d = 0; d < nd; d++) {
        if (shape[d] == 1) continue;
        if (m > 0 && cst[m - 1] == stride[d] * shape[d]) {
            cs[m - 1] *= shape[d];
            cst[m - 1] = stride[d];
        } else {
            cs[m] = shape[d];
            cst[m] = stride[d];
            m++;
        }
    }
    if (m == 0) {
        cs[0] = 1;
        cst[0] = 0;
        m = 1;
    }
    return m;
}

template <typename U>
static void gt_launch_copy_rows(cudaStream_t st, const gt_cuda_index &ix, int64_t n_units,
                                int64_t row_units, const void *x, int64_t base, void *out)
{
    gt_k_copy_rows<U><<<gt_cuda_blocks(n_units), GT_CUDA_THREADS, 0, st>>>(
        ix, n_units, row_units, (const U *)x, base, (U *)out);
}

template <typename T>
static void gt_launch_tiles(cudaStream_t st, const gt_tile_desc &t, const void *x, int64_t base,
                            void *out)
{
    unsigned blocks = (unsigned)(t.n_tiles < 65536 ? t.n_tiles : 65536);
    gt_k_transpose_tiles<T>
        <<<blocks, dim3(GT_TILE, GT_TILE_ROWS), 0, st>>>(t, (const T *)x, base, (T *)out);
}

static gt_status gt_cuda_gather(gt_cuda_stream *s, const gt_kernel_call *c, const gt_tensor *x,
                                const int64_t *xstride, int64_t base, gt_tensor *out, gt_error *err)
{
    int64_t n = gt_tensor_numel(out);
    if (n == 0) return GT_OK;
    int es = (int)gt_dtype_size(x->dtype);
    int64_t cs[GT_MAX_DIMS], cst[GT_MAX_DIMS];
    int m = gt_cuda_collapse(out->ndim, out->shape, xstride, cs, cst);
    gt_cuda_index ix;
    memset(&ix, 0, sizeof ix);
    if (cst[m - 1] == 1) {
        /* Contiguous rows of L elements: the widest unit dividing the row length, every row
         * start (base and strides) and both pointers. */
        int64_t row = cs[m - 1] * es;
        if (m == 1)
            return gt_cuda_copy_2d(s, c, out->data, row, (const char *)x->data + base * es, row,
                                   row, 1, err);
        uint64_t g =
            (uint64_t)row | (uint64_t)(base * es) | (uintptr_t)x->data | (uintptr_t)out->data;
        for (int d = 0; d < m - 1; d++)
            g |= (uint64_t)(cst[d] * es);
        int u = (g & 15u) == 0 ? 16 : (g & 7u) == 0 ? 8 : (g & 3u) == 0 ? 4 : (g & 1u) == 0 ? 2 : 1;
        ix.ndim = m - 1;
        for (int d = 0; d < m - 1; d++) {
            ix.shape[d] = cs[d];
            ix.stride[0][d] = cst[d] * es / u;
        }
        int64_t row_units = row / u, n_units = n * es / u, ub = base * es / u;
        if (u == 16)
            gt_launch_copy_rows<uint4>(s->stream, ix, n_units, row_units, x->data, ub, out->data);
        else if (u == 8)
            gt_launch_copy_rows<uint2>(s->stream, ix, n_units, row_units, x->data, ub, out->data);
        else if (u == 4)
            gt_launch_copy_rows<uint32_t>(s->stream, ix, n_units, row_units, x->data, ub,
                                          out->data);
        else if (u == 2)
            gt_launch_copy_rows<uint16_t>(s->stream, ix, n_units, row_units, x->data, ub,
                                          out->data);
        else
            gt_launch_copy_rows<uint8_t>(s->stream, ix, n_units, row_units, x->data, ub, out->data);
        return gt_cuda_launched(c, err);
    }
    int bdim = -1;
    for (int d = 0; d < m - 1; d++)
        if (cst[d] == 1) bdim = d;
    if (bdim >= 0) {
        int64_t ost[GT_MAX_DIMS];
        gt_kernel_contig_strides(m, cs, ost);
        gt_tile_desc t;
        memset(&t, 0, sizeof t);
        for (int d = 0; d < m - 1; d++) {
            if (d == bdim) continue;
            t.batch.shape[t.batch.ndim] = cs[d];
            t.batch.stride[0][t.batch.ndim] = cst[d];
            t.batch.stride[1][t.batch.ndim] = ost[d];
            t.batch.ndim++;
        }
        t.nb = cs[bdim];
        t.nl = cs[m - 1];
        t.sl = cst[m - 1];
        t.ob = ost[bdim];
        t.tiles_b = (t.nb + GT_TILE - 1) / GT_TILE;
        t.tiles_l = (t.nl + GT_TILE - 1) / GT_TILE;
        t.n_tiles = n / (t.nb * t.nl) * t.tiles_b * t.tiles_l;
        if (es == 2)
            gt_launch_tiles<uint16_t>(s->stream, t, x->data, base, out->data);
        else if (es == 4)
            gt_launch_tiles<uint32_t>(s->stream, t, x->data, base, out->data);
        else if (es == 8)
            gt_launch_tiles<unsigned long long>(s->stream, t, x->data, base, out->data);
        else
            gt_launch_tiles<uint8_t>(s->stream, t, x->data, base, out->data);
        return gt_cuda_launched(c, err);
    }
    ix.ndim = m;
    memcpy(ix.shape, cs, sizeof(int64_t) * (size_t)m);
    memcpy(ix.stride[0], cst, sizeof(int64_t) * (size_t)m);
    gt_k_gather<<<gt_cuda_blocks(n), GT_CUDA_THREADS, 0, s->stream>>>(
        ix, n, es, (const char *)x->data, base, (char *)out->data);
    return gt_cuda_launched(c, err);
}

gt_status gt_cuda_broadcast_to(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    const gt_tensor *x = c->in[0];
    gt_tensor *out = c->out[0];
    GT_TRY(gt_kernel_want_same_dtype(c, x, "input", out, "output", err));
    int64_t xs[GT_MAX_DIMS];
    if (!gt_kernel_out_matches_e(c, out) ||
        !gt_cuda_broadcast_strides(out->ndim, out->shape, x->ndim, x->shape, xs))
        return gt_kernel_shape_error(c, x, out, err);
    return gt_cuda_gather(s, c, x, xs, 0, out, err);
}

gt_status gt_cuda_reshape(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    const gt_tensor *x = c->in[0];
    gt_tensor *out = c->out[0];
    GT_TRY(gt_kernel_want_reshape(c, err));
    if (x->data == out->data) return GT_OK;
    int64_t bytes = (int64_t)gt_tensor_nbytes(x);
    return gt_cuda_copy_2d(s, c, out->data, bytes, x->data, bytes, bytes, 1, err);
}

/* A reshape the symbols could not prove: gt_kernel_want_reshape checks the bound numel. */
gt_status gt_cuda_regroup(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    return gt_cuda_reshape(s, c, err);
}

/* out.shape[k] = x.shape[perm[k]]: gather with x's stride of dim perm[k] along out dim k. */
static gt_status gt_cuda_permute_by(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    const gt_tensor *x = c->in[0];
    int perm[GT_MAX_DIMS];
    GT_TRY(gt_kernel_want_perm(c, perm, err));
    int64_t xstr[GT_MAX_DIMS], g[GT_MAX_DIMS];
    gt_kernel_contig_strides(x->ndim, x->shape, xstr);
    for (int k = 0; k < x->ndim; k++)
        g[k] = xstr[perm[k]];
    return gt_cuda_gather(s, c, x, g, 0, c->out[0], err);
}

gt_status gt_cuda_transpose(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    return gt_cuda_permute_by(s, c, err);
}

gt_status gt_cuda_permute(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    return gt_cuda_permute_by(s, c, err);
}

/* Row r of `rows` (unit offsets r * sp in src, r * dp in dst) of row_units units of U. */
template <typename U>
__global__ void gt_k_copy_2d(int64_t n_units, int64_t row_units, int64_t sp, int64_t dp,
                             const U *src, U *dst)
{
    GT_GRID_STRIDE(i, n_units)
    {
        int64_t r = i / row_units, u = i - r * row_units;
        dst[r * dp + u] = src[r * sp + u];
    }
}

template <typename U>
static void gt_launch_copy_2d(cudaStream_t st, int64_t rows, int64_t width, int64_t sp, int64_t dp,
                              const void *src, void *dst)
{
    int64_t w = width / (int64_t)sizeof(U), n = rows * w;
    gt_k_copy_2d<U><<<gt_cuda_blocks(n), GT_CUDA_THREADS, 0, st>>>(
        n, w, sp / (int64_t)sizeof(U), dp / (int64_t)sizeof(U), (const U *)src, (U *)dst);
}

/* Copies `rows` rows of `width` bytes (src rows `spitch` bytes apart, dst rows `dpitch` apart) by a
 * kernel in units of the widest access (up to 16 bytes) that both pointers, the width and the
 * pitches allow. Every device-to-device copy of a kernel goes through here rather than
 * cudaMemcpy(2D)Async: in a captured step those become copy-engine nodes, and FSDP's bucket
 * packing and unpacking ran at ~0.8 TB/s there (1B FSDP on 4 x H200: the step is ~4 ms shorter
 * with this kernel; docs/BENCHMARKS.md). */
gt_status gt_cuda_copy_2d(gt_cuda_stream *s, const gt_kernel_call *c, void *dst, int64_t dpitch,
                          const void *src, int64_t spitch, int64_t width, int64_t rows,
                          gt_error *err)
{
    if (width <= 0 || rows <= 0) return GT_OK;
    if (rows == 1) spitch = dpitch = width;
    uint64_t g =
        (uint64_t)width | (uint64_t)spitch | (uint64_t)dpitch | (uintptr_t)src | (uintptr_t)dst;
    cudaStream_t st = s->stream;
    if ((g & 15u) == 0)
        gt_launch_copy_2d<uint4>(st, rows, width, spitch, dpitch, src, dst);
    else if ((g & 7u) == 0)
        gt_launch_copy_2d<uint2>(st, rows, width, spitch, dpitch, src, dst);
    else if ((g & 3u) == 0)
        gt_launch_copy_2d<uint32_t>(st, rows, width, spitch, dpitch, src, dst);
    else if ((g & 1u) == 0)
        gt_launch_copy_2d<uint16_t>(st, rows, width, spitch, dpitch, src, dst);
    else
        gt_launch_copy_2d<uint8_t>(st, rows, width, spitch, dpitch, src, dst);
    return gt_cuda_launched(c, err);
}

/* For each of `outer` blocks, copies n * inner elements from src (dim extent src_dim, starting at
 * src_off) to dst (extent dst_dim, at dst_off): a 2D copy, one row per outer block. */
static gt_status gt_cuda_copy_blocks(gt_cuda_stream *s, const gt_kernel_call *c, void *dst,
                                     int64_t dst_dim, int64_t dst_off, const void *src,
                                     int64_t src_dim, int64_t src_off, int64_t n, int64_t outer,
                                     int64_t inner, size_t es, gt_error *err)
{
    int64_t e = (int64_t)es;
    return gt_cuda_copy_2d(s, c, (char *)dst + dst_off * inner * e, dst_dim * inner * e,
                           (const char *)src + src_off * inner * e, src_dim * inner * e,
                           n * inner * e, outer, err);
}

gt_status gt_cuda_slice(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    const gt_tensor *x = c->in[0];
    gt_tensor *out = c->out[0];
    int dim;
    GT_TRY(gt_kernel_want_slice(c, &dim, err));
    int64_t start = c->e[0], end = c->e[1];
    int64_t outer, inner;
    gt_kernel_outer_inner(x, dim, &outer, &inner);
    return gt_cuda_copy_blocks(s, c, out->data, end - start, 0, x->data, x->shape[dim], start,
                               end - start, outer, inner, gt_dtype_size(x->dtype), err);
}

gt_status gt_cuda_slice_backward(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    const gt_tensor *dy = c->in[0];
    gt_tensor *out = c->out[0];
    int dim;
    GT_TRY(gt_kernel_want_slice_backward(c, &dim, err));
    int64_t start = c->e[0], end = c->e[1], size = c->e[2];
    if (gt_tensor_nbytes(out) > 0)
        GT_TRY(gt_cuda_check(c, cudaMemsetAsync(out->data, 0, gt_tensor_nbytes(out), s->stream),
                             "memset", err));
    int64_t outer, inner;
    gt_kernel_outer_inner(out, dim, &outer, &inner);
    return gt_cuda_copy_blocks(s, c, out->data, size, start, dy->data, end - start, 0, end - start,
                               outer, inner, gt_dtype_size(dy->dtype), err);
}

gt_status gt_cuda_concat(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    gt_tensor *out = c->out[0];
    int dim;
    GT_TRY(gt_kernel_want_concat(c, &dim, err));
    int64_t total = out->shape[dim], outer, inner, off = 0;
    gt_kernel_outer_inner(out, dim, &outer, &inner);
    for (int k = 0; k < c->n_in; k++) {
        int64_t n = c->in[k]->shape[dim];
        if (!gt_kernel_concat_in_place(c->in[k], out, outer, off, inner))
            GT_TRY(gt_cuda_copy_blocks(s, c, out->data, total, off, c->in[k]->data, n, 0, n, outer,
                                       inner, gt_dtype_size(out->dtype), err));
        off += n;
    }
    return GT_OK;
}

gt_status gt_cuda_split(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    const gt_tensor *x = c->in[0];
    int dim;
    GT_TRY(gt_kernel_want_split(c, &dim, err));
    int64_t total = x->shape[dim], outer, inner, off = 0;
    gt_kernel_outer_inner(x, dim, &outer, &inner);
    for (int k = 0; k < c->n_out; k++) {
        int64_t n = c->e[k];
        GT_TRY(gt_cuda_copy_blocks(s, c, c->out[k]->data, n, 0, x->data, total, off, n, outer,
                                   inner, gt_dtype_size(x->dtype), err));
        off += n;
    }
    return GT_OK;
}

/* ---------------------------------------------------------------- embedding */

/* out[p, :] = w[ids[p], :], one block per row p (grid-stride over rows), units of U (the widest
 * access dividing the row's bytes and both pointers); an id outside [0, V) is flagged and its row
 * written as zero bytes. */
template <typename U>
__global__ void gt_k_embedding(int64_t n, int64_t row_units, const U *w, int64_t vocab,
                               const void *ids, int dids, U *out, unsigned long long *flag)
{
    for (int64_t p = blockIdx.x; p < n; p += gridDim.x) {
        int64_t id = gt_ld_index(ids, dids, p);
        bool bad = id < 0 || id >= vocab;
        if (bad && threadIdx.x == 0) gt_flag(flag, GT_OP_EMBEDDING, p, vocab);
        for (int64_t u = threadIdx.x; u < row_units; u += blockDim.x) {
            U v;
            if (bad)
                memset(&v, 0, sizeof v);
            else
                v = w[id * row_units + u];
            out[p * row_units + u] = v;
        }
    }
}

template <typename U>
static void gt_launch_embedding(cudaStream_t st, int64_t n, int64_t row_units, const void *w,
                                int64_t vocab, const gt_tensor *ids, void *out,
                                unsigned long long *flag)
{
    unsigned threads = row_units >= 256 ? 256 : (unsigned)((row_units + 31) / 32 * 32);
    unsigned blocks = (unsigned)(n < 65536 ? n : 65536);
    gt_k_embedding<U><<<blocks, threads, 0, st>>>(n, row_units, (const U *)w, vocab, ids->data,
                                                  ids->dtype, (U *)out, flag);
}

gt_status gt_cuda_embedding(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    const gt_tensor *w = c->in[0], *ids = c->in[1];
    gt_tensor *out = c->out[0];
    GT_TRY(gt_kernel_want_embedding(c, err));
    int64_t vocab = w->shape[0], d = w->shape[1];
    int64_t n = gt_tensor_numel(ids);
    if (n * d == 0) return GT_OK;
    int64_t row = d * (int64_t)gt_dtype_size(w->dtype);
    uint64_t g = (uint64_t)row | (uintptr_t)w->data | (uintptr_t)out->data;
    int u = (g & 15u) == 0 ? 16 : (g & 7u) == 0 ? 8 : (g & 3u) == 0 ? 4 : (g & 1u) == 0 ? 2 : 1;
    if (u == 16)
        gt_launch_embedding<uint4>(s->stream, n, row / 16, w->data, vocab, ids, out->data, s->flag);
    else if (u == 8)
        gt_launch_embedding<uint2>(s->stream, n, row / 8, w->data, vocab, ids, out->data, s->flag);
    else if (u == 4)
        gt_launch_embedding<uint32_t>(s->stream, n, row / 4, w->data, vocab, ids, out->data,
                                      s->flag);
    else if (u == 2)
        gt_launch_embedding<uint16_t>(s->stream, n, row / 2, w->data, vocab, ids, out->data,
                                      s->flag);
    else
        gt_launch_embedding<uint8_t>(s->stream, n, row, w->data, vocab, ids, out->data, s->flag);
    return gt_cuda_launched(c, err);
}

#define GT_EMB_THREADS 256

/* keys[p] = ids[p] - row0 when that is one of the vl rows, else vl (sorted past every row's run,
 * so no row sums it; flagged when flag is given: embedding_backward's ids must all be rows, a
 * shard's may belong to another rank); vals[p] = p. */
__global__ void gt_k_emb_keys(int64_t n, int64_t row0, int64_t vl, const void *ids, int dids,
                              int32_t *keys, int32_t *vals, int op, unsigned long long *flag)
{
    GT_GRID_STRIDE(p, n)
    {
        int64_t id = gt_ld_index(ids, dids, p) - row0;
        if (id < 0 || id >= vl) {
            if (flag) gt_flag(flag, op, p, vl);
            id = vl;
        }
        keys[p] = (int32_t)id;
        vals[p] = (int32_t)p;
    }
}

/* First index in sorted keys[0, n) with keys[i] >= v. */
__device__ __forceinline__ int64_t gt_lower_bound(const int32_t *keys, int64_t n, int64_t v)
{
    int64_t lo = 0, hi = n;
    while (lo < hi) {
        int64_t mid = (lo + hi) >> 1;
        if ((int64_t)keys[mid] < v)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* start[v] = first sorted index with key >= v, for v in [0, vocab]: one thread per v, so the
 * binary searches' dependent loads overlap across the grid (not one chain per row block). */
__global__ void gt_k_emb_starts(int64_t n, int64_t vocab, const int32_t *keys, int32_t *start)
{
    GT_GRID_STRIDE(v, vocab + 1)
    start[v] = (int32_t)gt_lower_bound(keys, n, v);
}

/* Block v: dw[v, :] = sum over its run [start[v], start[v + 1]) of sorted positions (increasing
 * p) of dy[p, :], each thread owning columns j = tid, tid + 256, ... (8 per pass held in
 * registers); rows without a token are written as zeros. */
__global__ void __launch_bounds__(GT_EMB_THREADS)
    gt_k_embedding_backward(int64_t d, const int32_t *start, const int32_t *pos, const void *dy,
                            int ddy, void *dw, int ddw)
{
    int64_t v = blockIdx.x;
    int64_t h0 = start ? start[v] : 0, h1 = start ? start[v + 1] : 0;
    for (int64_t j0 = 0; j0 < d; j0 += 8 * GT_EMB_THREADS) {
        float acc[8];
#pragma unroll
        for (int k = 0; k < 8; k++)
            acc[k] = 0.0f;
        for (int64_t h = h0; h < h1; h++) {
            int64_t row = (int64_t)pos[h] * d;
#pragma unroll
            for (int k = 0; k < 8; k++) {
                int64_t j = j0 + k * GT_EMB_THREADS + threadIdx.x;
                if (j < d) acc[k] += gt_ld(dy, ddy, row + j);
            }
        }
#pragma unroll
        for (int k = 0; k < 8; k++) {
            int64_t j = j0 + k * GT_EMB_THREADS + threadIdx.x;
            if (j < d) gt_st(dw, ddw, v * d + j, acc[k]);
        }
    }
}

static size_t gt_emb_align(size_t x)
{
    return (x + 255) & ~(size_t)255;
}

gt_status gt_cuda_embedding_grad(gt_cuda_stream *s, const gt_kernel_call *c, const gt_tensor *ids,
                                 const gt_tensor *dy, gt_tensor *dw, int64_t row0,
                                 bool flag_foreign, gt_error *err)
{
    int64_t vl = dw->shape[0], d = dw->shape[1], n = gt_tensor_numel(ids);
    int32_t *start = NULL, *pos = NULL;
    if (n > 0) {
        int bits = 1;
        while (bits < 31 && (vl >> bits) != 0) /* keys lie in [0, vl] */
            bits++;
        size_t sort_bytes = 0;
        cudaError_t e = cub::DeviceRadixSort::SortPairs(
            (void *)NULL, sort_bytes, (const int32_t *)NULL, (int32_t *)NULL, (const int32_t *)NULL,
            (int32_t *)NULL, (int)n, 0, bits, s->stream);
        GT_TRY(gt_cuda_check(c, e, "sizing the sort", err));
        size_t nb = gt_emb_align((size_t)n * sizeof(int32_t));
        size_t sb = gt_emb_align((size_t)(vl + 1) * sizeof(int32_t));
        void *scr;
        GT_TRY(gt_cuda_scratch(s, c, 4 * nb + sb + sort_bytes, &scr, err));
        char *b = (char *)scr;
        int32_t *k0 = (int32_t *)b, *v0 = (int32_t *)(b + nb);
        int32_t *k1 = (int32_t *)(b + 2 * nb), *v1 = (int32_t *)(b + 3 * nb);
        start = (int32_t *)(b + 4 * nb);
        gt_k_emb_keys<<<gt_cuda_blocks(n), GT_CUDA_THREADS, 0, s->stream>>>(
            n, row0, vl, ids->data, ids->dtype, k0, v0, (int)c->op, flag_foreign ? s->flag : NULL);
        GT_TRY(gt_cuda_launched(c, err));
        e = cub::DeviceRadixSort::SortPairs(b + 4 * nb + sb, sort_bytes, k0, k1, v0, v1, (int)n, 0,
                                            bits, s->stream);
        GT_TRY(gt_cuda_check(c, e, "sorting the ids", err));
        pos = v1;
        gt_k_emb_starts<<<gt_cuda_blocks(vl + 1), GT_CUDA_THREADS, 0, s->stream>>>(n, vl, k1,
                                                                                   start);
        GT_TRY(gt_cuda_launched(c, err));
    }
    gt_k_embedding_backward<<<(unsigned)vl, GT_EMB_THREADS, 0, s->stream>>>(
        d, start, pos, dy->data, dy->dtype, dw->data, dw->dtype);
    return gt_cuda_launched(c, err);
}

gt_status gt_cuda_embedding_backward(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    const gt_tensor *ids = c->in[0], *dy = c->in[1];
    gt_tensor *dw = c->out[0];
    GT_TRY(gt_kernel_want_float(c, dy, "dy", err));
    GT_TRY(gt_kernel_want_float(c, dw, "dw", err));
    GT_TRY(gt_kernel_want_embedding_backward(c, err));
    int64_t vocab = dw->shape[0], d = dw->shape[1];
    if (vocab * d == 0) return GT_OK;
    int64_t n = gt_tensor_numel(ids);
    /* Keys (ids, vocab for a bad one) and positions are int32 in the sort. */
    if (vocab >= 0x7fffffff || n > 0x7fffffff)
        return gt_error_set(err, GT_ERR_UNSUPPORTED,
                            "embedding_backward: %lld rows or %lld ids exceed 2^31 - 1",
                            (long long)vocab, (long long)n);
    return gt_cuda_embedding_grad(s, c, ids, dy, dw, 0, true, err);
}
