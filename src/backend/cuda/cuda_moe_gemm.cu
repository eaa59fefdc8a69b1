/* cuda_moe_gemm.cu — the grouped GEMMs of the mixture of experts: grouped_matmul (each group of
 * rows of x times its expert's weight) and grouped_matmul_dw (each expert's weight gradient).
 * bf16 with 16-byte aligned rows runs the wgmma kernels of cuda_moe_wgmma.cu; f16, f32 and
 * unaligned calls run here. The order of every sum is in cuda_moe.cu's header; in short:
 *   grouped_matmul: a block computes a 64 x 64 tile of rows of ONE group with one k-loop from
 *     column 0 (bf16 / f16: steps of 32 on the tensor cores, wmma 16x16x16 with f32 accumulate;
 *     otherwise f32 FMAs in k order), so a row's bits do not depend on the split: M-invariant.
 *   grouped_matmul_dw: a block per (expert, 64 x 64 tile of dw[e]) runs the group's rows from
 *     offsets[e] in chunks of 32 (tensor cores) or row by row (f32 FMAs), in row order. */
#include "cuda_gm.cuh"

#include <mma.h>
#include <stdint.h>

#include <type_traits>

#define GM_BM 64
#define GM_BN 64
#define GM_BK 32   /* tensor-core reduction step */
#define GM_BK32 16 /* f32 reduction step */
#define GM_PAD 8   /* 16-bit elements of padding per shared row (wmma: ldm % 8 == 0) */
#define GM_TC_THREADS 128
#define GM_F32_THREADS 256

/* ---------------------------------------------------------------- grouped_matmul */

/* Tensor cores: x, w of 16-bit type T; 4 warps, each a 32 x 32 quarter of the tile (2 x 2 wmma
 * accumulators). TB: w[e] is [Dout, Din] (B col-major in shared memory), else [Din, Dout]. VEC:
 * 16-byte loads (Din % 8 == 0, and Dout % 8 == 0 without TB, aligned tensors). The next step's
 * tiles are loaded into registers while the tensor cores work on the current one. */
template <typename T, bool TB, bool VEC>
__global__ void __launch_bounds__(GM_TC_THREADS)
    gt_k_gm_tc(int64_t R, int64_t Din, int64_t Dout, int E, const T *x, const T *w,
               const int32_t *offsets, void *out, int dot, unsigned long long *flag, int op)
{
    using namespace nvcuda;
    constexpr int LDA = GM_BK + GM_PAD, LDB = TB ? GM_BK + GM_PAD : GM_BN + GM_PAD;
    constexpr int LDC = GM_BN + 4;
    constexpr int NL = VEC ? 2 : 16; /* loads per thread per operand and step */
    typedef typename std::conditional<VEC, uint4, uint16_t>::type L;
    __shared__ __align__(128) uint16_t As[GM_BM * LDA];
    __shared__ __align__(128) uint16_t Bs[TB ? GM_BN * LDB : GM_BK * LDB];
    __shared__ __align__(128) float Cs[GM_BM * LDC];
    __shared__ gt_gm_tile tile;
    int tid = threadIdx.x;
    if (tid < 32) {
        gt_gm_tile t = gt_gm_find(offsets, E, R, blockIdx.x, GM_BM);
        if (tid == 0) tile = t;
    }
    if (blockIdx.x == 0 && blockIdx.y == 0 && tid == 32) gt_gm_check(offsets, E, R, flag, op);
    __syncthreads();
    const int e = tile.e;
    const int64_t r0 = tile.r0, r1 = tile.r1, n0 = (int64_t)blockIdx.y * GM_BN;
    if (e < 0) return;
    if (e == E) { /* rows outside the groups: zeros */
        gt_gm_zero_tile(out, dot, r0, r1, n0, GM_BM, GM_BN, Dout);
        return;
    }
    const uint16_t *xs = (const uint16_t *)x;
    const uint16_t *ws = (const uint16_t *)w + (int64_t)e * Din * Dout;
    L ra[NL], rb[NL];
    auto load = [&](int64_t k0) {
#pragma unroll
        for (int q = 0; q < NL; q++) {
            if constexpr (VEC) {
                int v = tid + GM_TC_THREADS * q;
                int64_t r = r0 + (v >> 2), k = k0 + (v & 3) * 8;
                uint4 z = make_uint4(0, 0, 0, 0);
                ra[q] = r < r1 && k < Din ? *(const uint4 *)(xs + r * Din + k) : z;
                if constexpr (TB) {
                    int64_t n = n0 + (v >> 2);
                    rb[q] = n < Dout && k < Din ? *(const uint4 *)(ws + n * Din + k) : z;
                } else {
                    int64_t kb = k0 + (v >> 3), n = n0 + (v & 7) * 8;
                    rb[q] = kb < Din && n < Dout ? *(const uint4 *)(ws + kb * Dout + n) : z;
                }
            } else {
                int l = tid + GM_TC_THREADS * q;
                int64_t r = r0 + (l >> 5), k = k0 + (l & 31);
                ra[q] = r < r1 && k < Din ? xs[r * Din + k] : (uint16_t)0;
                if constexpr (TB) {
                    int64_t n = n0 + (l >> 5);
                    rb[q] = n < Dout && k < Din ? ws[n * Din + k] : (uint16_t)0;
                } else {
                    int64_t kb = k0 + (l >> 6), n = n0 + (l & 63);
                    rb[q] = kb < Din && n < Dout ? ws[kb * Dout + n] : (uint16_t)0;
                }
            }
        }
    };
    auto store = [&](void) {
#pragma unroll
        for (int q = 0; q < NL; q++) {
            if constexpr (VEC) {
                int v = tid + GM_TC_THREADS * q;
                *(uint4 *)(As + (v >> 2) * LDA + (v & 3) * 8) = ra[q];
                if constexpr (TB)
                    *(uint4 *)(Bs + (v >> 2) * LDB + (v & 3) * 8) = rb[q];
                else
                    *(uint4 *)(Bs + (v >> 3) * LDB + (v & 7) * 8) = rb[q];
            } else {
                int l = tid + GM_TC_THREADS * q;
                As[(l >> 5) * LDA + (l & 31)] = ra[q];
                if constexpr (TB)
                    Bs[(l >> 5) * LDB + (l & 31)] = rb[q];
                else
                    Bs[(l >> 6) * LDB + (l & 63)] = rb[q];
            }
        }
    };
    typedef typename std::conditional<TB, wmma::col_major, wmma::row_major>::type BL;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++)
            wmma::fill_fragment(acc[i][j], 0.0f);
    const int warp = tid / 32, wm = warp >> 1, wn = warp & 1;
    load(0);
    for (int64_t k0 = 0; k0 < Din; k0 += GM_BK) {
        store();
        __syncthreads();
        if (k0 + GM_BK < Din) load(k0 + GM_BK);
#pragma unroll
        for (int kk = 0; kk < GM_BK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a[2];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, T, BL> b[2];
#pragma unroll
            for (int i = 0; i < 2; i++)
                wmma::load_matrix_sync(a[i], (const T *)As + (wm * 32 + i * 16) * LDA + kk, LDA);
#pragma unroll
            for (int j = 0; j < 2; j++) {
                if constexpr (TB)
                    wmma::load_matrix_sync(b[j], (const T *)Bs + (wn * 32 + j * 16) * LDB + kk,
                                           LDB);
                else
                    wmma::load_matrix_sync(b[j], (const T *)Bs + kk * LDB + wn * 32 + j * 16, LDB);
            }
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int j = 0; j < 2; j++)
                    wmma::mma_sync(acc[i][j], a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++)
            wmma::store_matrix_sync(Cs + (wm * 32 + i * 16) * LDC + wn * 32 + j * 16, acc[i][j],
                                    LDC, wmma::mem_row_major);
    __syncthreads();
    for (int l = tid; l < GM_BM * GM_BN; l += GM_TC_THREADS) {
        int row = l / GM_BN, col = l % GM_BN;
        int64_t r = r0 + row, n = n0 + col;
        if (r < r1 && n < Dout) gt_st(out, dot, r * Dout + n, Cs[row * LDC + col]);
    }
}

/* Any float dtypes: f32 FMAs, each output the sequential sum over k = 0 .. Din - 1. 16 x 16
 * threads, each the 4 x 4 outputs (ty + 16 i, tx + 16 j) of the tile. */
template <bool TB>
__global__ void __launch_bounds__(GM_F32_THREADS)
    gt_k_gm_f32(int64_t R, int64_t Din, int64_t Dout, int E, const void *x, int dxt, const void *w,
                int dwt, const int32_t *offsets, void *out, int dot, unsigned long long *flag,
                int op)
{
    __shared__ float As[GM_BK32][GM_BM + 1];
    __shared__ float Bs[GM_BK32][GM_BN + 1];
    __shared__ gt_gm_tile tile;
    int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
    if (tid < 32) {
        gt_gm_tile t = gt_gm_find(offsets, E, R, blockIdx.x, GM_BM);
        if (tid == 0) tile = t;
    }
    if (blockIdx.x == 0 && blockIdx.y == 0 && tid == 32) gt_gm_check(offsets, E, R, flag, op);
    __syncthreads();
    const int e = tile.e;
    const int64_t r0 = tile.r0, r1 = tile.r1, n0 = (int64_t)blockIdx.y * GM_BN;
    if (e < 0) return;
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
            acc[i][j] = 0.0f;
    const int64_t wb = (int64_t)e * Din * Dout;
    for (int64_t k0 = 0; e < E && k0 < Din; k0 += GM_BK32) {
#pragma unroll
        for (int q = 0; q < 4; q++) {
            int l = tid + GM_F32_THREADS * q;
            int64_t r = r0 + l / 16, k = k0 + l % 16;
            As[l % 16][l / 16] = r < r1 && k < Din ? gt_ld(x, dxt, r * Din + k) : 0.0f;
            if (TB) {
                int64_t n = n0 + l / 16;
                Bs[l % 16][l / 16] = n < Dout && k < Din ? gt_ld(w, dwt, wb + n * Din + k) : 0.0f;
            } else {
                int64_t kb = k0 + l / 64, n = n0 + l % 64;
                Bs[l / 64][l % 64] =
                    kb < Din && n < Dout ? gt_ld(w, dwt, wb + kb * Dout + n) : 0.0f;
            }
        }
        __syncthreads();
        int kn = Din - k0 < GM_BK32 ? (int)(Din - k0) : GM_BK32;
        for (int kk = 0; kk < kn; kk++) {
            float a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                a[i] = As[kk][ty + 16 * i];
                b[i] = Bs[kk][tx + 16 * i];
            }
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++)
                    acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int64_t r = r0 + ty + 16 * i, n = n0 + tx + 16 * j;
            if (r < r1 && n < Dout) gt_st(out, dot, r * Dout + n, acc[i][j]); /* e == E: 0 */
        }
}

/* The checks both grouped GEMMs share: offsets i32 [E + 1], R and the counts below 2^31. */
static gt_status gt_gm_offsets(const gt_kernel_call *c, const gt_tensor *off, int64_t E, int64_t R,
                               gt_error *err)
{
    if (off->dtype != GT_I32 || off->ndim != 1 || off->shape[0] != E + 1)
        return gt_cuda_shape_error(c, "offsets must be i32 [E + 1]", err);
    if (R >= INT32_MAX || E >= INT32_MAX / 2)
        return gt_error_set(err, GT_ERR_UNSUPPORTED, "%s: %lld rows or %lld experts above 2^31",
                            gt_kernel_op_name(c->op), (long long)R, (long long)E);
    return GT_OK;
}

template <typename T, bool TB>
static void gt_gm_launch_tc(gt_cuda_stream *s, dim3 grid, bool vec, int64_t R, int64_t Din,
                            int64_t Dout, int E, const gt_kernel_call *c)
{
    const T *x = (const T *)c->in[0]->data, *w = (const T *)c->in[1]->data;
    const int32_t *off = (const int32_t *)c->in[2]->data;
    gt_tensor *o = c->out[0];
    if (vec)
        gt_k_gm_tc<T, TB, true><<<grid, GM_TC_THREADS, 0, s->stream>>>(
            R, Din, Dout, E, x, w, off, o->data, o->dtype, s->flag, (int)c->op);
    else
        gt_k_gm_tc<T, TB, false><<<grid, GM_TC_THREADS, 0, s->stream>>>(
            R, Din, Dout, E, x, w, off, o->data, o->dtype, s->flag, (int)c->op);
}

gt_status gt_cuda_grouped_matmul(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    GT_TRY(gt_kernel_want_attrs(c, 1, 0, 0, err));
    const gt_tensor *x = c->in[0], *w = c->in[1], *off = c->in[2];
    gt_tensor *out = c->out[0];
    GT_TRY(gt_kernel_want_float(c, x, "x", err));
    GT_TRY(gt_kernel_want_float(c, w, "w", err));
    GT_TRY(gt_kernel_want_float(c, out, "output", err));
    bool tb = c->i[0] != 0;
    if (x->ndim != 2 || w->ndim != 3 || out->ndim != 2)
        return gt_cuda_shape_error(c, "x must be [R, Din], w [E, ., .], the output [R, Dout]", err);
    int64_t R = x->shape[0], Din = x->shape[1], E = w->shape[0];
    int64_t Dout = tb ? w->shape[1] : w->shape[2];
    if ((tb ? w->shape[2] : w->shape[1]) != Din || out->shape[0] != R || out->shape[1] != Dout)
        return gt_cuda_shape_error(c, "w must be [E, Dout, Din] (trans_b) or [E, Din, Dout]", err);
    GT_TRY(gt_gm_offsets(c, off, E, R, err));
    if (R == 0 || Dout == 0) return GT_OK;
    int64_t tiles = (R + GM_BM - 1) / GM_BM + E + 2, ntiles = (Dout + GM_BN - 1) / GM_BN;
    if (tiles > INT32_MAX || ntiles > 65535)
        return gt_error_set(err, GT_ERR_UNSUPPORTED, "grouped_matmul: [%lld, %lld] above the grid",
                            (long long)R, (long long)Dout);
    dim3 grid((unsigned)tiles, (unsigned)ntiles);
    bool tc = x->dtype == w->dtype && (x->dtype == GT_BF16 || x->dtype == GT_F16);
    if (tc) {
        bool vec =
            Din % 8 == 0 && (tb || Dout % 8 == 0) && gt_aligned16(x->data) && gt_aligned16(w->data);
        if (x->dtype == GT_BF16 && vec) return gt_gm_wgmma(s, c, tb, R, Din, Dout, (int)E, err);
        if (x->dtype == GT_BF16 && tb)
            gt_gm_launch_tc<__nv_bfloat16, true>(s, grid, vec, R, Din, Dout, (int)E, c);
        else if (x->dtype == GT_BF16)
            gt_gm_launch_tc<__nv_bfloat16, false>(s, grid, vec, R, Din, Dout, (int)E, c);
        else if (tb)
            gt_gm_launch_tc<__half, true>(s, grid, vec, R, Din, Dout, (int)E, c);
        else
            gt_gm_launch_tc<__half, false>(s, grid, vec, R, Din, Dout, (int)E, c);
    } else if (tb) {
        gt_k_gm_f32<true><<<grid, GM_F32_THREADS, 0, s->stream>>>(
            R, Din, Dout, (int)E, x->data, x->dtype, w->data, w->dtype, (const int32_t *)off->data,
            out->data, out->dtype, s->flag, (int)c->op);
    } else {
        gt_k_gm_f32<false><<<grid, GM_F32_THREADS, 0, s->stream>>>(
            R, Din, Dout, (int)E, x->data, x->dtype, w->data, w->dtype, (const int32_t *)off->data,
            out->data, out->dtype, s->flag, (int)c->op);
    }
    return gt_cuda_launched(c, err);
}

/* ---------------------------------------------------------------- grouped_matmul_dw */

/* dw[e][m][n] = sum over the rows r of group e of dy[r][m] * x[r][n] (M = Dout, N = Din), on the
 * tensor cores: chunks of 32 rows from offsets[e] in order, zero rows past the group. Block
 * (n tile, m tile, e); 4 warps of 32 x 32 as in gt_k_gm_tc. VEC: Din % 8 == Dout % 8 == 0,
 * aligned tensors. */
template <typename T, bool VEC>
__global__ void __launch_bounds__(GM_TC_THREADS)
    gt_k_gmdw_tc(int64_t R, int64_t Din, int64_t Dout, int E, const T *x, const T *dy,
                 const int32_t *offsets, void *out, int dot, unsigned long long *flag, int op)
{
    using namespace nvcuda;
    constexpr int LD = GM_BM + GM_PAD, LDC = GM_BN + 4; /* GM_BM == GM_BN */
    constexpr int NL = VEC ? 2 : 16;
    typedef typename std::conditional<VEC, uint4, uint16_t>::type L;
    __shared__ __align__(128) uint16_t As[GM_BK * LD]; /* As[rr][m] = dy[row rr][m0 + m] */
    __shared__ __align__(128) uint16_t Bs[GM_BK * LD]; /* Bs[rr][n] = x[row rr][n0 + n] */
    __shared__ __align__(128) float Cs[GM_BM * LDC];
    int tid = threadIdx.x, e = blockIdx.z;
    if (blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 && tid == 0)
        gt_gm_check(offsets, E, R, flag, op);
    int64_t lo, hi;
    gt_gm_group(offsets, e, R, &lo, &hi);
    const int64_t m0 = (int64_t)blockIdx.y * GM_BM, n0 = (int64_t)blockIdx.x * GM_BN;
    const uint16_t *xs = (const uint16_t *)x, *ds = (const uint16_t *)dy;
    L ra[NL], rb[NL];
    auto load = [&](int64_t k0) {
#pragma unroll
        for (int q = 0; q < NL; q++) {
            if constexpr (VEC) {
                int v = tid + GM_TC_THREADS * q;
                int64_t r = lo + k0 + (v >> 3), m = m0 + (v & 7) * 8, n = n0 + (v & 7) * 8;
                uint4 z = make_uint4(0, 0, 0, 0);
                ra[q] = r < hi && m < Dout ? *(const uint4 *)(ds + r * Dout + m) : z;
                rb[q] = r < hi && n < Din ? *(const uint4 *)(xs + r * Din + n) : z;
            } else {
                int l = tid + GM_TC_THREADS * q;
                int64_t r = lo + k0 + (l >> 6), m = m0 + (l & 63), n = n0 + (l & 63);
                ra[q] = r < hi && m < Dout ? ds[r * Dout + m] : (uint16_t)0;
                rb[q] = r < hi && n < Din ? xs[r * Din + n] : (uint16_t)0;
            }
        }
    };
    auto store = [&](void) {
#pragma unroll
        for (int q = 0; q < NL; q++) {
            if constexpr (VEC) {
                int v = tid + GM_TC_THREADS * q;
                *(uint4 *)(As + (v >> 3) * LD + (v & 7) * 8) = ra[q];
                *(uint4 *)(Bs + (v >> 3) * LD + (v & 7) * 8) = rb[q];
            } else {
                int l = tid + GM_TC_THREADS * q;
                As[(l >> 6) * LD + (l & 63)] = ra[q];
                Bs[(l >> 6) * LD + (l & 63)] = rb[q];
            }
        }
    };
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++)
            wmma::fill_fragment(acc[i][j], 0.0f);
    const int warp = tid / 32, wm = warp >> 1, wn = warp & 1;
    const int64_t rows = hi - lo;
    if (rows > 0) load(0);
    for (int64_t k0 = 0; k0 < rows; k0 += GM_BK) {
        store();
        __syncthreads();
        if (k0 + GM_BK < rows) load(k0 + GM_BK);
#pragma unroll
        for (int kk = 0; kk < GM_BK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::col_major> a[2];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> b[2];
#pragma unroll
            for (int i = 0; i < 2; i++)
                wmma::load_matrix_sync(a[i], (const T *)As + kk * LD + wm * 32 + i * 16, LD);
#pragma unroll
            for (int j = 0; j < 2; j++)
                wmma::load_matrix_sync(b[j], (const T *)Bs + kk * LD + wn * 32 + j * 16, LD);
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int j = 0; j < 2; j++)
                    wmma::mma_sync(acc[i][j], a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++)
            wmma::store_matrix_sync(Cs + (wm * 32 + i * 16) * LDC + wn * 32 + j * 16, acc[i][j],
                                    LDC, wmma::mem_row_major);
    __syncthreads();
    const int64_t ob = (int64_t)e * Dout * Din;
    for (int l = tid; l < GM_BM * GM_BN; l += GM_TC_THREADS) {
        int row = l / GM_BN, col = l % GM_BN;
        int64_t m = m0 + row, n = n0 + col;
        if (m < Dout && n < Din) gt_st(out, dot, ob + m * Din + n, Cs[row * LDC + col]);
    }
}

/* Any float dtypes: f32 FMAs over the group's rows one by one in row order. */
__global__ void __launch_bounds__(GM_F32_THREADS)
    gt_k_gmdw_f32(int64_t R, int64_t Din, int64_t Dout, int E, const void *x, int dxt,
                  const void *dy, int ddt, const int32_t *offsets, void *out, int dot,
                  unsigned long long *flag, int op)
{
    __shared__ float As[GM_BK32][GM_BM + 1];
    __shared__ float Bs[GM_BK32][GM_BN + 1];
    int tid = threadIdx.x, tx = tid % 16, ty = tid / 16, e = blockIdx.z;
    if (blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 && tid == 0)
        gt_gm_check(offsets, E, R, flag, op);
    int64_t lo, hi;
    gt_gm_group(offsets, e, R, &lo, &hi);
    const int64_t m0 = (int64_t)blockIdx.y * GM_BM, n0 = (int64_t)blockIdx.x * GM_BN;
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
            acc[i][j] = 0.0f;
    for (int64_t k0 = lo; k0 < hi; k0 += GM_BK32) {
#pragma unroll
        for (int q = 0; q < 4; q++) {
            int l = tid + GM_F32_THREADS * q;
            int64_t r = k0 + l / 64, m = m0 + l % 64, n = n0 + l % 64;
            As[l / 64][l % 64] = r < hi && m < Dout ? gt_ld(dy, ddt, r * Dout + m) : 0.0f;
            Bs[l / 64][l % 64] = r < hi && n < Din ? gt_ld(x, dxt, r * Din + n) : 0.0f;
        }
        __syncthreads();
        int kn = hi - k0 < GM_BK32 ? (int)(hi - k0) : GM_BK32;
        for (int kk = 0; kk < kn; kk++) {
            float a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                a[i] = As[kk][ty + 16 * i];
                b[i] = Bs[kk][tx + 16 * i];
            }
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++)
                    acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
    const int64_t ob = (int64_t)e * Dout * Din;
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int64_t m = m0 + ty + 16 * i, n = n0 + tx + 16 * j;
            if (m < Dout && n < Din) gt_st(out, dot, ob + m * Din + n, acc[i][j]);
        }
}

template <typename T>
static void gt_gmdw_launch_tc(gt_cuda_stream *s, dim3 grid, bool vec, int64_t R, int64_t Din,
                              int64_t Dout, int E, const gt_kernel_call *c)
{
    const T *x = (const T *)c->in[0]->data, *dy = (const T *)c->in[1]->data;
    const int32_t *off = (const int32_t *)c->in[2]->data;
    gt_tensor *o = c->out[0];
    if (vec)
        gt_k_gmdw_tc<T, true><<<grid, GM_TC_THREADS, 0, s->stream>>>(
            R, Din, Dout, E, x, dy, off, o->data, o->dtype, s->flag, (int)c->op);
    else
        gt_k_gmdw_tc<T, false><<<grid, GM_TC_THREADS, 0, s->stream>>>(
            R, Din, Dout, E, x, dy, off, o->data, o->dtype, s->flag, (int)c->op);
}

gt_status gt_cuda_grouped_matmul_dw(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    const gt_tensor *x = c->in[0], *dy = c->in[1], *off = c->in[2];
    gt_tensor *out = c->out[0];
    GT_TRY(gt_kernel_want_float(c, x, "x", err));
    GT_TRY(gt_kernel_want_float(c, dy, "dy", err));
    GT_TRY(gt_kernel_want_float(c, out, "output", err));
    if (x->ndim != 2 || dy->ndim != 2 || out->ndim != 3 || dy->shape[0] != x->shape[0])
        return gt_cuda_shape_error(c, "x must be [R, Din], dy [R, Dout], the output [E, Dout, Din]",
                                   err);
    int64_t R = x->shape[0], Din = x->shape[1], Dout = dy->shape[1], E = out->shape[0];
    if (out->shape[1] != Dout || out->shape[2] != Din)
        return gt_cuda_shape_error(c, "the output must be [E, Dout, Din]", err);
    GT_TRY(gt_gm_offsets(c, off, E, R, err));
    if (E == 0 || Din == 0 || Dout == 0) return GT_OK;
    int64_t nt = (Din + GM_BN - 1) / GM_BN, mt = (Dout + GM_BM - 1) / GM_BM;
    if (nt > INT32_MAX || mt > 65535 || E > 65535)
        return gt_error_set(err, GT_ERR_UNSUPPORTED,
                            "grouped_matmul_dw: [%lld, %lld, %lld] above the grid", (long long)E,
                            (long long)Dout, (long long)Din);
    dim3 grid((unsigned)nt, (unsigned)mt, (unsigned)E);
    bool tc = x->dtype == dy->dtype && (x->dtype == GT_BF16 || x->dtype == GT_F16);
    if (tc) {
        bool vec = Din % 8 == 0 && Dout % 8 == 0 && gt_aligned16(x->data) && gt_aligned16(dy->data);
        if (x->dtype == GT_BF16 && vec) return gt_gmdw_wgmma(s, c, R, Din, Dout, (int)E, err);
        if (x->dtype == GT_BF16)
            gt_gmdw_launch_tc<__nv_bfloat16>(s, grid, vec, R, Din, Dout, (int)E, c);
        else
            gt_gmdw_launch_tc<__half>(s, grid, vec, R, Din, Dout, (int)E, c);
    } else {
        gt_k_gmdw_f32<<<grid, GM_F32_THREADS, 0, s->stream>>>(
            R, Din, Dout, (int)E, x->data, x->dtype, dy->data, dy->dtype,
            (const int32_t *)off->data, out->data, out->dtype, s->flag, (int)c->op);
    }
    return gt_cuda_launched(c, err);
}
