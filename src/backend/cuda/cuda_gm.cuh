/* cuda_gm.cuh — what the grouped GEMM kernels share (cuda_moe_gemm.cu, cuda_moe_wgmma.cu): the row
 * tiles of a grouped product found from the offsets on the device, the offsets' check, a group's
 * rows. Private to src/backend/cuda. */
#ifndef GRAPHTRAIN_CUDA_GM_CUH
#define GRAPHTRAIN_CUDA_GM_CUH

#include "cuda_internal.h"

/* ---------------------------------------------------------------- offsets on the device */

typedef struct {
    int e;          /* the group; E: rows outside the groups (zeros); -1: no rows */
    int64_t r0, r1; /* the tile's rows */
} gt_gm_tile;

/* Tile `tile` of the row tiles of a grouped GEMM over R rows, found by a full warp. Every block
 * reads the offsets as o_0 = min(R, max(0, offsets[0])), o_{e+1} = min(R, max(o_e,
 * offsets[e + 1])) (a prefix max: what bad offsets become, flagged by gt_gm_check). The tiles:
 * first those of the rows [0, o_0) (zeros), then group e's ceil((o_{e+1} - o_e) / BM) in group
 * order, then those of the rows [o_E, R) (zeros): at most ceil(R / BM) + E + 2. Rounds of 32
 * groups: a warp scan of the prefix max and of the tile counts, a ballot for the first group past
 * `tile`. */
static __device__ gt_gm_tile gt_gm_find(const int32_t *offsets, int E, int64_t R, int64_t tile,
                                        int bm)
{
    int lane = threadIdx.x % 32;
    gt_gm_tile t;
    int64_t prev = offsets[0];
    prev = prev < 0 ? 0 : (prev > R ? R : prev);
    int64_t acc = (prev + bm - 1) / bm; /* the head's tiles */
    if (tile < acc) {
        t.e = E;
        t.r0 = tile * bm;
        t.r1 = t.r0 + bm < prev ? t.r0 + bm : prev;
        return t;
    }
    for (int base = 0; base < E; base += 32) {
        int e = base + lane;
        int64_t hi = e < E ? (int64_t)offsets[e + 1] : prev;
        for (int o = 1; o < 32; o <<= 1) {
            int64_t v = __shfl_up_sync(0xffffffffu, hi, o);
            if (lane >= o && v > hi) hi = v;
        }
        hi = hi < prev ? prev : hi;
        hi = hi > R ? R : hi;
        int64_t lo = __shfl_up_sync(0xffffffffu, hi, 1);
        if (lane == 0) lo = prev;
        int64_t nt = (hi - lo + bm - 1) / bm, cum = nt;
        for (int o = 1; o < 32; o <<= 1) {
            int64_t v = __shfl_up_sync(0xffffffffu, cum, o);
            if (lane >= o) cum += v;
        }
        unsigned past = __ballot_sync(0xffffffffu, e < E && acc + cum > tile);
        if (past) {
            int f = __ffs(past) - 1;
            int64_t flo = __shfl_sync(0xffffffffu, lo, f), fhi = __shfl_sync(0xffffffffu, hi, f);
            int64_t fcum = __shfl_sync(0xffffffffu, cum, f), fnt = __shfl_sync(0xffffffffu, nt, f);
            t.e = base + f;
            t.r0 = flo + (tile - (acc + fcum - fnt)) * bm;
            t.r1 = t.r0 + bm < fhi ? t.r0 + bm : fhi;
            return t;
        }
        acc += __shfl_sync(0xffffffffu, cum, 31);
        prev = __shfl_sync(0xffffffffu, hi, 31);
    }
    t.r0 = prev + (tile - acc) * bm;
    t.e = t.r0 < R ? E : -1;
    t.r1 = t.r0 + bm < R ? t.r0 + bm : R;
    return t;
}

/* Flags the first bad offset (a value outside [0, R], a decrease); one thread. */
static __device__ void gt_gm_check(const int32_t *offsets, int E, int64_t R,
                                   unsigned long long *flag, int op)
{
    int64_t prev = 0;
    for (int e = 0; e <= E; e++) {
        int64_t v = offsets[e];
        if (v < prev || v > R) {
            gt_flag(flag, op, e, R + 1);
            return;
        }
        prev = v;
    }
}

/* A tile of the rows outside the groups: zeros in rows [r0, min(r0 + bm, r1)), columns
 * [n0, n0 + bn) below Dout, written by the whole block. */
static __device__ void gt_gm_zero_tile(void *out, int dot, int64_t r0, int64_t r1, int64_t n0,
                                       int bm, int bn, int64_t Dout)
{
    for (int l = threadIdx.x; l < bm * bn; l += blockDim.x) {
        int64_t r = r0 + l / bn, n = n0 + l % bn;
        if (r < r1 && n < Dout) gt_st(out, dot, r * Dout + n, 0.0f);
    }
}

/* The rows [lo, hi) of group e, clamped into [0, R] (bad offsets are flagged by gt_gm_check). */
static __device__ __forceinline__ void gt_gm_group(const int32_t *offsets, int e, int64_t R,
                                                   int64_t *lo, int64_t *hi)
{
    int64_t a = offsets[e], b = offsets[e + 1];
    a = a < 0 ? 0 : (a > R ? R : a);
    b = b < a ? a : (b > R ? R : b);
    *lo = a;
    *hi = b;
}

/* The bf16 grouped GEMMs on Hopper's wgmma with a cp.async pipeline (cuda_moe_wgmma.cu, sm_90a),
 * for 16-byte aligned tensors with Din % 8 == 0 and Dout % 8 == 0: every output row
 * (grouped_matmul) or every weight-gradient element (grouped_matmul_dw) the same sum in the same
 * order as described there. */
gt_status gt_gm_wgmma(gt_cuda_stream *s, const gt_kernel_call *c, bool tb, int64_t R, int64_t Din,
                      int64_t Dout, int E, gt_error *err);
gt_status gt_gmdw_wgmma(gt_cuda_stream *s, const gt_kernel_call *c, int64_t R, int64_t Din,
                        int64_t Dout, int E, gt_error *err);

#endif
