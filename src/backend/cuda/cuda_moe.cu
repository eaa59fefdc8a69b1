/* cuda_moe.cu — DeepSeek-V3's mixture-of-experts ops on the device: sign, moe_topk, gather_last and
 * its backward, moe_sort, moe_count, grouped_matmul and grouped_matmul_dw.
 *
 * Determinism: integer work is exact; the only float sums are the GEMMs', each a fixed order. No
 * atomics at all except the error word's.
 *   moe_topk: one warp per row; every choice is a warp argmax under a total order (NaN above
 *     every number, then value, then lower index), so it is the CPU's choice bit for bit.
 *   moe_sort / moe_count: the flat ids cut into chunks of GT_MOE_CHUNK; one warp per chunk counts
 *     its ids per expert (32 at a time, __match_any_sync: the lowest lane of each id adds the
 *     lanes that share it); one block turns the per-chunk counts into, per expert, the rows of the
 *     earlier chunks (a sequential loop per expert) and the offsets (a block scan of the totals);
 *     a warp per chunk then places its ids in order (rank = earlier lanes with the same id plus the
 *     rows already placed): the stable sort, independent of timing. Counts and offsets never
 *     leave the device.
 *   For f32 operands both GEMMs are the CPU kernel's fmaf chains (cpu_moe.c), bit for bit.
 *   grouped_matmul: each block computes a BM x BN output tile of rows of ONE group with the same
 *     k-loop (BK columns at a time from column 0, zero padded past Din; within a step the tensor
 *     core's or the thread's fixed order), so an output row's bits depend on its x row and w[e]
 *     only: the same under any group split, offsets or R (M-invariant; no split-K). The grid is
 *     sized for the worst case (ceil(R / BM) + E + 2 row tiles); each block finds its group from
 *     offsets on the device (a warp scan of the tiles per group); the tiles of the rows before
 *     offsets[0] and from offsets[E] are zeros. bf16 / f16 (x and w of one dtype) on tensor cores
 *     (wmma 16x16x16, f32 accumulate), other dtypes on f32 FMAs in k order.
 *   grouped_matmul_dw: one block per (expert, BM x BN tile of dw[e]) reduces the group's rows in
 *     chunks of BK rows from offsets[e] in row order, each chunk on the tensor cores (bf16 / f16)
 *     or as FMAs in row order (f32), into f32; zeros for an empty group.
 * Offsets are read on the device only; bad ones (negative, decreasing, above R) are flagged on the
 * stream's error word and clamped so that no access leaves the tensors. */
#include "cuda_internal.h"

#include <math.h>
#include <mma.h>
#include <stdint.h>

#define GT_MOE_CHUNK 1024  /* ids per warp in moe_sort / moe_count */
#define GT_MOE_MAX_E 8192  /* experts (shared-memory counters of a chunk) */
#define GT_TOPK_MAX_E 1024 /* moe_topk: 32 experts per lane (a 32-bit taken mask) */
#define GT_TOPK_WARPS 4    /* rows per moe_topk block */

/* ---------------------------------------------------------------- sign */

__global__ void gt_k_sign(int64_t n, const void *x, int dxt, void *out, int dot)
{
    GT_GRID_STRIDE(i, n)
    {
        float v = gt_ld(x, dxt, i);
        /* -0 gives +0 (as the CPU kernel); NaN stays NaN */
        gt_st(out, dot, i, v > 0.0f ? 1.0f : (v < 0.0f ? -1.0f : (v == 0.0f ? 0.0f : v)));
    }
}

gt_status gt_cuda_sign(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    const gt_tensor *x = c->in[0];
    gt_tensor *out = c->out[0];
    GT_TRY(gt_kernel_want_float(c, x, "x", err));
    GT_TRY(gt_kernel_want_float(c, out, "output", err));
    GT_TRY(gt_kernel_want_same_shape(c, x, "x", out, "output", err));
    int64_t n = gt_tensor_numel(x);
    if (n == 0) return GT_OK;
    gt_k_sign<<<gt_cuda_blocks(n), GT_CUDA_THREADS, 0, s->stream>>>(n, x->data, x->dtype, out->data,
                                                                    out->dtype);
    return gt_cuda_launched(c, err);
}

/* ---------------------------------------------------------------- moe_topk */

/* The total order of moe_topk: NaN above every number, then the larger value, then the lower
 * index (index -1: no candidate, below everything). */
__device__ __forceinline__ bool gt_topk_better(float a, int ia, float b, int ib)
{
    if (ia < 0) return false;
    if (ib < 0) return true;
    bool an = a != a, bn = b != b;
    if (an != bn) return an;
    if (!an && a != b) return a > b;
    return ia < ib;
}

/* Every lane gets the warp's best (value, index). */
__device__ __forceinline__ void gt_warp_best(float &v, int &i)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, v, o);
        int oi = __shfl_xor_sync(0xffffffffu, i, o);
        if (gt_topk_better(ov, oi, v, i)) {
            v = ov;
            i = oi;
        }
    }
}

/* One warp per row t: the row in shared memory; with G > 1 lane g scores group g (its top two
 * summed, best first), L rounds of warp argmax keep the best groups and the others' scores become
 * -inf; then K rounds of warp argmax over the lanes' untaken experts (expert e: lane e % 32, bit
 * e / 32 of its taken mask). */
__global__ void __launch_bounds__(32 * GT_TOPK_WARPS)
    gt_k_moe_topk(int64_t T, int E, int K, int G, int L, const float *scores, int32_t *out)
{
    extern __shared__ float sh_rows[];
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int64_t t = (int64_t)blockIdx.x * GT_TOPK_WARPS + warp;
    if (t >= T) return; /* the whole warp: no block barrier below */
    float *row = sh_rows + (size_t)warp * E;
    for (int e = lane; e < E; e += 32)
        row[e] = scores[t * E + e];
    __syncwarp();
    if (G > 1) {
        int per = E / G;
        float gs = 0.0f;
        int gi = -1;
        if (lane < G) {
            float b1 = 0.0f, b2 = 0.0f;
            int i1 = -1, i2 = -1;
            for (int e = lane * per; e < (lane + 1) * per; e++) {
                float v = row[e];
                if (gt_topk_better(v, e, b1, i1)) {
                    b2 = b1;
                    i2 = i1;
                    b1 = v;
                    i1 = e;
                } else if (gt_topk_better(v, e, b2, i2)) {
                    b2 = v;
                    i2 = e;
                }
            }
            gs = i2 >= 0 ? b1 + b2 : b1;
            gi = lane;
        }
        unsigned keep = 0;
        for (int r = 0; r < L; r++) {
            float v = gs;
            int i = gi >= 0 && !((keep >> gi) & 1u) ? gi : -1;
            gt_warp_best(v, i);
            if (i >= 0) keep |= 1u << i;
        }
        __syncwarp();
        for (int e = lane; e < E; e += 32)
            if (!((keep >> (e / per)) & 1u)) row[e] = -INFINITY;
        __syncwarp();
    }
    unsigned taken = 0;
    for (int r = 0; r < K; r++) {
        float v = 0.0f;
        int i = -1;
        for (int m = 0; lane + 32 * m < E; m++) {
            int e = lane + 32 * m;
            if ((taken >> m) & 1u) continue;
            if (gt_topk_better(row[e], e, v, i)) {
                v = row[e];
                i = e;
            }
        }
        gt_warp_best(v, i);
        if (i >= 0 && i % 32 == lane) taken |= 1u << (i / 32);
        if (lane == 0) out[t * K + r] = i;
    }
}

gt_status gt_cuda_moe_topk(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    GT_TRY(gt_kernel_want_attrs(c, 3, 0, 0, err));
    const gt_tensor *x = c->in[0];
    gt_tensor *out = c->out[0];
    if (x->dtype != GT_F32 || x->ndim != 2)
        return gt_cuda_shape_error(c, "scores must be f32 [T, E]", err);
    int64_t T = x->shape[0], E = x->shape[1], K = c->i[0], G = c->i[1], L = c->i[2];
    if (out->dtype != GT_I32 || out->ndim != 2 || out->shape[0] != T || out->shape[1] != K)
        return gt_cuda_shape_error(c, "output must be i32 [T, k]", err);
    if (K < 1 || K > E)
        return gt_error_set(err, GT_ERR_SHAPE, "moe_topk: k %lld outside [1, %lld experts]",
                            (long long)K, (long long)E);
    if (G > 1 && (E % G != 0 || L < 1 || L > G || K > L * (E / G)))
        return gt_error_set(err, GT_ERR_SHAPE,
                            "moe_topk: %lld experts in n_groups %lld with n_limited %lld",
                            (long long)E, (long long)G, (long long)L);
    if (E > GT_TOPK_MAX_E || G > 32)
        return gt_error_set(err, GT_ERR_UNSUPPORTED,
                            "moe_topk: %lld experts or %lld groups above the CUDA kernel's %d / 32",
                            (long long)E, (long long)G, GT_TOPK_MAX_E);
    if (T == 0) return GT_OK;
    int64_t blocks = (T + GT_TOPK_WARPS - 1) / GT_TOPK_WARPS;
    if (blocks > INT32_MAX)
        return gt_error_set(err, GT_ERR_UNSUPPORTED, "moe_topk: %lld rows", (long long)T);
    size_t smem = (size_t)GT_TOPK_WARPS * (size_t)E * sizeof(float);
    gt_k_moe_topk<<<(unsigned)blocks, 32 * GT_TOPK_WARPS, smem, s->stream>>>(
        T, (int)E, (int)K, G > 1 ? (int)G : 1, (int)L, (const float *)x->data,
        (int32_t *)out->data);
    return gt_cuda_launched(c, err);
}

/* ---------------------------------------------------------------- gather_last and backward */

/* Elements are moved as their bits (U: the element's size). */
template <typename U>
__global__ void gt_k_gather_last(int64_t n, int64_t K, int64_t E, const U *x, const void *idx,
                                 int idt, U *out, unsigned long long *flag, int op)
{
    GT_GRID_STRIDE(i, n)
    {
        int64_t id = gt_ld_index(idx, idt, i);
        if (id < 0 || id >= E) {
            gt_flag(flag, op, i, E);
            out[i] = (U)0;
            continue;
        }
        out[i] = x[(i / K) * E + id];
    }
}

/* One thread per dx element (t, e): the value of the last j with idx[t, j] == e, else zero. The
 * threads of column 0 also flag a row's ids outside [0, E). */
template <typename U>
__global__ void gt_k_gather_last_bwd(int64_t n, int64_t K, int64_t E, const void *idx, int idt,
                                     const U *dy, U *dx, unsigned long long *flag, int op)
{
    GT_GRID_STRIDE(i, n)
    {
        int64_t t = i / E, e = i - t * E;
        U v = (U)0;
        for (int64_t j = 0; j < K; j++) {
            int64_t id = gt_ld_index(idx, idt, t * K + j);
            if (id == e) v = dy[t * K + j];
            if (e == 0 && (id < 0 || id >= E)) gt_flag(flag, op, t * K + j, E);
        }
        dx[i] = v;
    }
}

gt_status gt_cuda_gather_last(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    const gt_tensor *x = c->in[0], *idx = c->in[1];
    gt_tensor *out = c->out[0];
    GT_TRY(gt_kernel_want_float(c, x, "x", err));
    GT_TRY(gt_kernel_want_index(c, idx, "idx", err));
    GT_TRY(gt_kernel_want_same_dtype(c, x, "x", out, "output", err));
    if (x->ndim != 2 || idx->ndim != 2 || idx->shape[0] != x->shape[0])
        return gt_cuda_shape_error(c, "x must be [T, E] and idx [T, K]", err);
    GT_TRY(gt_kernel_want_same_shape(c, idx, "idx", out, "output", err));
    int64_t n = gt_tensor_numel(out), K = idx->shape[1], E = x->shape[1];
    if (n == 0) return GT_OK;
    unsigned b = gt_cuda_blocks(n);
    if (gt_dtype_size(x->dtype) == 2)
        gt_k_gather_last<uint16_t><<<b, GT_CUDA_THREADS, 0, s->stream>>>(
            n, K, E, (const uint16_t *)x->data, idx->data, idx->dtype, (uint16_t *)out->data,
            s->flag, (int)c->op);
    else
        gt_k_gather_last<uint32_t><<<b, GT_CUDA_THREADS, 0, s->stream>>>(
            n, K, E, (const uint32_t *)x->data, idx->data, idx->dtype, (uint32_t *)out->data,
            s->flag, (int)c->op);
    return gt_cuda_launched(c, err);
}

gt_status gt_cuda_gather_last_backward(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    GT_TRY(gt_kernel_want_attrs(c, 0, 0, 1, err));
    const gt_tensor *idx = c->in[0], *dy = c->in[1];
    gt_tensor *dx = c->out[0];
    GT_TRY(gt_kernel_want_index(c, idx, "idx", err));
    GT_TRY(gt_kernel_want_float(c, dy, "dy", err));
    GT_TRY(gt_kernel_want_same_dtype(c, dy, "dy", dx, "output", err));
    GT_TRY(gt_kernel_want_same_shape(c, idx, "idx", dy, "dy", err));
    if (idx->ndim != 2 || dx->ndim != 2 || dx->shape[0] != idx->shape[0] || dx->shape[1] != c->e[0])
        return gt_cuda_shape_error(c, "idx and dy must be [T, K], the output [T, n_cols]", err);
    int64_t n = gt_tensor_numel(dx), K = idx->shape[1], E = dx->shape[1];
    if (n == 0) return GT_OK;
    unsigned b = gt_cuda_blocks(n);
    if (gt_dtype_size(dy->dtype) == 2)
        gt_k_gather_last_bwd<uint16_t><<<b, GT_CUDA_THREADS, 0, s->stream>>>(
            n, K, E, idx->data, idx->dtype, (const uint16_t *)dy->data, (uint16_t *)dx->data,
            s->flag, (int)c->op);
    else
        gt_k_gather_last_bwd<uint32_t><<<b, GT_CUDA_THREADS, 0, s->stream>>>(
            n, K, E, idx->data, idx->dtype, (const uint32_t *)dy->data, (uint32_t *)dx->data,
            s->flag, (int)c->op);
    return gt_cuda_launched(c, err);
}

/* ---------------------------------------------------------------- moe_sort and moe_count */

/* Chunk blockIdx.x's ids per expert into hist[chunk][E] (one warp; ids outside [0, E) flagged
 * when flag is given, and skipped). */
__global__ void __launch_bounds__(32) gt_k_moe_hist(int64_t n, int E, const void *idx, int idt,
                                                    int32_t *hist, unsigned long long *flag, int op)
{
    extern __shared__ int32_t cnt[];
    int lane = threadIdx.x;
    for (int e = lane; e < E; e += 32)
        cnt[e] = 0;
    __syncwarp();
    int64_t c0 = (int64_t)blockIdx.x * GT_MOE_CHUNK;
    int64_t c1 = c0 + GT_MOE_CHUNK < n ? c0 + GT_MOE_CHUNK : n;
    for (int64_t b = c0; b < c1; b += 32) {
        int64_t i = b + lane;
        int id = -1;
        if (i < c1) {
            int64_t v = gt_ld_index(idx, idt, i);
            if (v >= 0 && v < E)
                id = (int)v;
            else if (flag)
                gt_flag(flag, op, i, E);
        }
        unsigned same = __match_any_sync(0xffffffffu, id);
        if (id >= 0 && (same & ((1u << lane) - 1u)) == 0) cnt[id] += __popc(same);
        __syncwarp();
    }
    for (int e = lane; e < E; e += 32)
        hist[(int64_t)blockIdx.x * E + e] = cnt[e];
}

/* One block: per expert, hist[c][e] becomes the rows of chunks before c (in chunk order); the
 * totals go to counts (moe_count) or, scanned across experts, to offsets[0 .. E] (moe_sort). */
__global__ void __launch_bounds__(1024)
    gt_k_moe_scan(int64_t chunks, int E, int32_t *hist, int32_t *offsets, float *counts)
{
    extern __shared__ int32_t tot[];
    __shared__ int32_t warp_sum[32];
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        int32_t run = 0;
        for (int64_t c = 0; c < chunks; c++) {
            int32_t v = hist[c * E + e];
            hist[c * E + e] = run;
            run += v;
        }
        tot[e] = run;
        if (counts) counts[e] = (float)run;
    }
    if (!offsets) return;
    __syncthreads();
    /* exclusive scan of tot: thread k owns the contiguous segment [k * seg, (k + 1) * seg) */
    int seg = (E + blockDim.x - 1) / blockDim.x, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    int e0 = threadIdx.x * seg, e1 = e0 + seg < E ? e0 + seg : E;
    int32_t mine = 0;
    for (int e = e0; e < e1; e++)
        mine += tot[e];
    int32_t inc = mine;
    for (int o = 1; o < 32; o <<= 1) {
        int32_t v = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o) inc += v;
    }
    if (lane == 31) warp_sum[warp] = inc;
    __syncthreads();
    if (warp == 0) {
        int nw = blockDim.x / 32;
        int32_t w = lane < nw ? warp_sum[lane] : 0, wi = w;
        for (int o = 1; o < 32; o <<= 1) {
            int32_t v = __shfl_up_sync(0xffffffffu, wi, o);
            if (lane >= o) wi += v;
        }
        warp_sum[lane] = wi - w; /* rows of the warps before */
    }
    __syncthreads();
    int32_t run = warp_sum[warp] + inc - mine;
    for (int e = e0; e < e1; e++) {
        offsets[e] = run;
        run += tot[e];
    }
    if (e1 == E && e0 < E) offsets[E] = run;
    if (E == 0 && threadIdx.x == 0) offsets[0] = 0;
}

/* Chunk blockIdx.x places its ids in order: sorted row offsets[id] + (rows of the chunks before,
 * hist) + (this chunk's earlier ids with the same expert). */
__global__ void __launch_bounds__(32)
    gt_k_moe_place(int64_t n, int E, int64_t K, const void *idx, int idt, const int32_t *hist,
                   const int32_t *offsets, int32_t *order, int32_t *token)
{
    extern __shared__ int32_t pos[];
    int lane = threadIdx.x;
    for (int e = lane; e < E; e += 32)
        pos[e] = offsets[e] + hist[(int64_t)blockIdx.x * E + e];
    __syncwarp();
    int64_t c0 = (int64_t)blockIdx.x * GT_MOE_CHUNK;
    int64_t c1 = c0 + GT_MOE_CHUNK < n ? c0 + GT_MOE_CHUNK : n;
    for (int64_t b = c0; b < c1; b += 32) {
        int64_t i = b + lane;
        int id = -1;
        if (i < c1) {
            int64_t v = gt_ld_index(idx, idt, i);
            if (v >= 0 && v < E) id = (int)v;
        }
        unsigned same = __match_any_sync(0xffffffffu, id);
        unsigned before = same & ((1u << lane) - 1u);
        if (id >= 0) {
            int32_t p = pos[id] + __popc(before);
            order[p] = (int32_t)i;
            token[p] = (int32_t)(i / K);
        }
        __syncwarp();
        if (id >= 0 && before == 0) pos[id] += __popc(same);
        __syncwarp();
    }
}

static gt_status gt_moe_ids(const gt_kernel_call *c, const gt_tensor *idx, int64_t *E,
                            int64_t *chunks, gt_error *err)
{
    GT_TRY(gt_kernel_want_attrs(c, 1, 0, 0, err));
    GT_TRY(gt_kernel_want_index(c, idx, "idx", err));
    *E = c->i[0];
    int64_t n = gt_tensor_numel(idx);
    if (*E < 1 || *E > GT_MOE_MAX_E)
        return gt_error_set(err, GT_ERR_UNSUPPORTED, "%s: n_experts %lld outside [1, %d]",
                            gt_kernel_op_name(c->op), (long long)*E, GT_MOE_MAX_E);
    if (n >= INT32_MAX)
        return gt_error_set(err, GT_ERR_UNSUPPORTED, "%s: %lld ids above 2^31 - 1",
                            gt_kernel_op_name(c->op), (long long)n);
    *chunks = (n + GT_MOE_CHUNK - 1) / GT_MOE_CHUNK;
    return GT_OK;
}

/* The per-chunk counts of idx into scratch (*hist) and their per-expert prefix, with the totals
 * into counts or the offsets (gt_k_moe_scan). */
static gt_status gt_moe_count_ids(gt_cuda_stream *s, const gt_kernel_call *c, const gt_tensor *idx,
                                  int64_t E, int64_t chunks, int32_t *offsets, float *counts,
                                  int32_t **hist, gt_error *err)
{
    void *scratch = NULL;
    GT_TRY(gt_cuda_scratch(s, c, (size_t)(chunks > 0 ? chunks : 1) * (size_t)E * sizeof(int32_t),
                           &scratch, err));
    *hist = (int32_t *)scratch;
    size_t smem = (size_t)E * sizeof(int32_t);
    if (chunks > 0) {
        gt_k_moe_hist<<<(unsigned)chunks, 32, smem, s->stream>>>(
            gt_tensor_numel(idx), (int)E, idx->data, idx->dtype, *hist, s->flag, (int)c->op);
        GT_TRY(gt_cuda_launched(c, err));
    }
    gt_k_moe_scan<<<1, 1024, smem, s->stream>>>(chunks, (int)E, *hist, offsets, counts);
    return gt_cuda_launched(c, err);
}

gt_status gt_cuda_moe_sort(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    const gt_tensor *idx = c->in[0];
    int64_t E = 0, chunks = 0;
    GT_TRY(gt_moe_ids(c, idx, &E, &chunks, err));
    int64_t n = gt_tensor_numel(idx), K = idx->ndim >= 2 ? idx->shape[idx->ndim - 1] : 1;
    for (int k = 0; k < 3; k++)
        if (c->out[k]->dtype != GT_I32 || c->out[k]->ndim != 1 ||
            c->out[k]->shape[0] != (k < 2 ? n : E + 1))
            return gt_cuda_shape_error(c, "outputs must be i32 [T*K], [T*K], [n_experts + 1]", err);
    if (idx->ndim != 2) return gt_cuda_shape_error(c, "idx must be [T, K]", err);
    int32_t *hist = NULL, *offsets = (int32_t *)c->out[2]->data;
    GT_TRY(gt_moe_count_ids(s, c, idx, E, chunks, offsets, NULL, &hist, err));
    if (chunks == 0) return GT_OK;
    gt_k_moe_place<<<(unsigned)chunks, 32, (size_t)E * sizeof(int32_t), s->stream>>>(
        n, (int)E, K, idx->data, idx->dtype, hist, offsets, (int32_t *)c->out[0]->data,
        (int32_t *)c->out[1]->data);
    return gt_cuda_launched(c, err);
}

gt_status gt_cuda_moe_count(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    const gt_tensor *idx = c->in[0];
    gt_tensor *out = c->out[0];
    int64_t E = 0, chunks = 0;
    GT_TRY(gt_moe_ids(c, idx, &E, &chunks, err));
    if (out->dtype != GT_F32 || out->ndim != 1 || out->shape[0] != E)
        return gt_cuda_shape_error(c, "output must be f32 [n_experts]", err);
    int32_t *hist = NULL;
    return gt_moe_count_ids(s, c, idx, E, chunks, NULL, (float *)out->data, &hist, err);
}

/* ---------------------------------------------------------------- expert parallel row moves */

/* moe_block_offsets: one thread per output entry. */
__global__ void gt_k_moe_block_offsets(int64_t n, int64_t e1, const int32_t *off, int32_t *out)
{
    GT_GRID_STRIDE(i, n * e1)
    {
        int64_t b = i / e1, l = i % e1;
        out[i] = off[b * (e1 - 1) + l] - off[b * (e1 - 1)];
    }
}

gt_status gt_cuda_moe_block_offsets(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    const gt_tensor *off = c->in[0];
    gt_tensor *out = c->out[0];
    if (c->ni < 1 || off->dtype != GT_I32 || out->dtype != GT_I32 || off->ndim != 1 ||
        out->ndim != 2 || out->shape[0] != c->i[0] ||
        off->shape[0] != c->i[0] * (out->shape[1] - 1) + 1)
        return gt_cuda_shape_error(c, "offsets i32 [E + 1] -> i32 [n_blocks, E / n_blocks + 1]",
                                   err);
    int64_t total = out->shape[0] * out->shape[1];
    gt_k_moe_block_offsets<<<gt_cuda_blocks(total), GT_CUDA_THREADS, 0, s->stream>>>(
        out->shape[0], out->shape[1], (const int32_t *)off->data, (int32_t *)out->data);
    return gt_cuda_launched(c, err);
}

/* The rank's block b: first source row (the sum of its earlier blocks' counts) and count, read
 * from the device table [n*n, e1]. n is small (the ep degree): a loop per thread. */
__device__ __forceinline__ void gt_moe_block(const int32_t *table, int64_t n, int64_t e1,
                                             int64_t rank, int64_t b, int64_t *start,
                                             int64_t *count)
{
    int64_t run = 0;
    for (int64_t j = 0; j < b; j++)
        run += table[(rank * n + j) * e1 + e1 - 1];
    *start = run;
    *count = table[(rank * n + b) * e1 + e1 - 1];
}

/* moe_pack: one thread per byte of the output [n*C, row]. A count above C copies its first C
 * rows only (never past the block); below the worst case gt_k_moe_overflow has flagged it. */
__global__ void gt_k_moe_pack(int64_t n, int64_t cap, int64_t rows, int64_t row_bytes,
                              const int32_t *table, int64_t e1, int64_t rank, const uint8_t *x,
                              uint8_t *out)
{
    GT_GRID_STRIDE(i, n * cap * row_bytes)
    {
        int64_t r = i / row_bytes, byte = i % row_bytes, b = r / cap, k = r % cap;
        int64_t start, count;
        gt_moe_block(table, n, e1, rank, b, &start, &count);
        out[i] = k < count && start + k < rows ? x[(start + k) * row_bytes + byte] : 0;
    }
}

/* moe_unpack: one thread per byte of the output [rows, row]. */
__global__ void gt_k_moe_unpack(int64_t n, int64_t cap, int64_t rows, int64_t row_bytes,
                                const int32_t *table, int64_t e1, int64_t rank, const uint8_t *y,
                                uint8_t *out)
{
    GT_GRID_STRIDE(i, rows * row_bytes)
    {
        int64_t r = i / row_bytes, byte = i % row_bytes;
        uint8_t v = 0;
        int64_t run = 0;
        for (int64_t b = 0; b < n; b++) {
            int64_t count = table[(rank * n + b) * e1 + e1 - 1];
            if (r < run + count) {
                int64_t k = r - run;
                if (k < cap) v = y[(b * cap + k) * row_bytes + byte];
                break;
            }
            run += count;
        }
        out[i] = v;
    }
}

/* The node of the moe_pack being launched (gt_cuda_moe_pack_site), baked into the overflow
 * check's arguments, so a captured graph's replay names it too. */
static int64_t g_pack_site = -1;

extern "C" void gt_cuda_moe_pack_site(int64_t node)
{
    g_pack_site = node;
}

/* Capacity below the worst case (parallelism.expert_parallel_capacity_factor < 1): one thread
 * reads the whole table (the same on every rank, so every rank flags the same pair) and, when a
 * pair needs more than C rows, claims the stream's data-error word (the first flag wins; the host
 * reads it after the step, never inside it):
 *   flag[0] = (op + 1) | from << 16 | to << 40   (the pair with the most rows; the lowest wins)
 *   flag[1] = most << 32 | C
 *   flag[2] = worst << 32 | node (0xffffffff: unknown) */
__global__ void gt_k_moe_overflow(int64_t n, int64_t e1, const int32_t *table, int64_t cap,
                                  int64_t worst, int64_t node, unsigned long long *flag)
{
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    int64_t most = 0, pair = 0;
    for (int64_t p = 0; p < n * n; p++)
        if (table[p * e1 + e1 - 1] > most) {
            most = table[p * e1 + e1 - 1];
            pair = p;
        }
    if (most <= cap) return;
    unsigned long long from = (unsigned long long)(pair / n) & 0xffffffull,
                       to = (unsigned long long)(pair % n) & 0xffffffull;
    unsigned long long w0 = ((unsigned long long)GT_OP_MOE_PACK + 1) | from << 16 | to << 40;
    if (atomicCAS(&flag[0], 0ull, w0) != 0ull) return;
    flag[1] = (unsigned long long)most << 32 | ((unsigned long long)cap & 0xffffffffull);
    flag[2] = (unsigned long long)worst << 32 |
              (node < 0 ? 0xffffffffull : (unsigned long long)node & 0xffffffffull);
}

extern "C" int64_t gt_cuda_moe_overflow_node(const unsigned long long *f)
{
    if ((f[0] & 0xffffull) != (unsigned long long)GT_OP_MOE_PACK + 1) return -1;
    unsigned long long node = f[2] & 0xffffffffull;
    return node == 0xffffffffull ? -1 : (int64_t)node;
}

extern "C" gt_status gt_cuda_moe_overflow_report(const unsigned long long *f, gt_error *err)
{
    int64_t from = (int64_t)((f[0] >> 16) & 0xffffffull);
    int64_t to = (int64_t)((f[0] >> 40) & 0xffffffull);
    int64_t most = (int64_t)(f[1] >> 32), cap = (int64_t)(f[1] & 0xffffffffull);
    return gt_kernel_moe_capacity_error(from, most, to, cap, (int64_t)(f[2] >> 32), err);
}

static gt_status gt_moe_ep_check(const gt_kernel_call *c, const gt_tensor *rows_in,
                                 const gt_tensor *table, int64_t rank, gt_error *err)
{
    if (c->ni >= 1 && (rank < 0 || rank >= c->i[0]))
        return gt_cuda_shape_error(c, "the rank attribute must be in [0, n_blocks)", err);
    if (c->ni < 1 || c->i[0] < 1 || table->dtype != GT_I32 || table->ndim != 2 ||
        table->shape[0] != c->i[0] * c->i[0] || rows_in->ndim != 2 ||
        c->out[0]->ndim != 2 || c->out[0]->dtype != rows_in->dtype ||
        c->out[0]->shape[1] != rows_in->shape[1])
        return gt_cuda_shape_error(c, "rows [R, D], table i32 [n*n, e + 1], output of rows' dtype",
                                   err);
    return GT_OK;
}

gt_status gt_cuda_moe_pack(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    const gt_tensor *x = c->in[0], *table = c->in[1];
    gt_tensor *out = c->out[0];
    GT_TRY(gt_moe_ep_check(c, x, table, c->ne >= 3 ? c->e[2] : 0, err));
    if (c->ne < 3 || out->shape[0] != c->i[0] * c->e[0])
        return gt_cuda_shape_error(c, "output must be [n_blocks * capacity, D]", err);
    if (c->e[0] < c->e[1]) { /* an overflow is possible: checked on the device, reported after */
        gt_k_moe_overflow<<<1, 1, 0, s->stream>>>(c->i[0], table->shape[1],
                                                  (const int32_t *)table->data, c->e[0], c->e[1],
                                                  g_pack_site, s->flag);
        GT_TRY(gt_cuda_launched(c, err));
    }
    int64_t row_bytes = x->shape[1] * (int64_t)gt_dtype_size(x->dtype);
    int64_t total = out->shape[0] * row_bytes;
    if (total == 0) return GT_OK;
    gt_k_moe_pack<<<gt_cuda_blocks(total), GT_CUDA_THREADS, 0, s->stream>>>(
        c->i[0], c->e[0], x->shape[0], row_bytes, (const int32_t *)table->data, table->shape[1],
        c->e[2], (const uint8_t *)x->data, (uint8_t *)out->data);
    return gt_cuda_launched(c, err);
}

gt_status gt_cuda_moe_unpack(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    const gt_tensor *y = c->in[0], *table = c->in[1];
    gt_tensor *out = c->out[0];
    GT_TRY(gt_moe_ep_check(c, y, table, c->ne >= 2 ? c->e[1] : 0, err));
    if (c->ne < 2 || out->shape[0] != c->e[0] || y->shape[0] % c->i[0] != 0)
        return gt_cuda_shape_error(c, "y [n_blocks * C, D] -> [rows, D]", err);
    int64_t row_bytes = y->shape[1] * (int64_t)gt_dtype_size(y->dtype);
    int64_t total = out->shape[0] * row_bytes;
    if (total == 0) return GT_OK;
    gt_k_moe_unpack<<<gt_cuda_blocks(total), GT_CUDA_THREADS, 0, s->stream>>>(
        c->i[0], y->shape[0] / c->i[0], out->shape[0], row_bytes, (const int32_t *)table->data,
        table->shape[1], c->e[1], (const uint8_t *)y->data, (uint8_t *)out->data);
    return gt_cuda_launched(c, err);
}
