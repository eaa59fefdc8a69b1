/* cuda_norm_rope.cu — rms_norm, rms_norm_backward and rope.
 *
 * rms_norm, per row of D:  r = 1/sqrt(mean(x^2) + eps),  y = (x * r) * w, with mean(x^2)
 * accumulated in double and r rounded to f32 as cpu_norm_rope.c does.
 * Backward, per row (double, as the CPU):  dx = r * (g - xhat * mean(g * xhat)), g = w * dy,
 * dw = sum over rows of dy * xhat, without atomics.
 *
 * Fast paths (D % 8 == 0, D <= 8192 forward and 4096 backward, 16-byte aligned tensors): one block
 * per row, thread t owns the 8 elements [8t, 8t + 8) and moves them with one 16-byte load/store
 * (two for f32), so each row is read once into registers. Row sums: 8 terms per thread in order, a
 * warp xor-butterfly, then the warp totals in warp order — a fixed order, in double. The backward
 * kernel gives each block a fixed chunk of consecutive rows (chunk depends only on the shape); its
 * threads keep the dw partial of their 8 columns in double over the chunk's rows in order and write
 * it once; a second kernel adds the chunk partials of each column in chunk order. Other shapes take
 * the generic kernels below (same math, scalar loads).
 *
 * rope: inv_freq is computed on the host in f32 exactly as the CPU kernel (same code path, powf),
 * passed by value. Each block covers a few consecutive (batch, position) rows; it first builds
 * their cos/sin table in shared memory — angle = f32(p) * inv_j in f32, cos/sin in double rounded
 * once, as the CPU does — then rotates every head of those rows with float math (8 pairs per
 * thread with 16-byte accesses when d/2 % 8 == 0 and aligned, else 1). The pairs are (j, j + d/2),
 * or (2j, 2j + 1) when the optional `interleaved` slot is 1; YaRN (`scaling` 2) only changes
 * inv_freq, in the shared host code. */
#include "cuda_internal.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <type_traits>

#include "backend/rope_freqs.h" /* gt_rope_inv_freq, shared with the other backend */

#define GT_NORM_CHUNK 64
#define GT_ROPE_MAX_HALF 512
#define GT_RMS_CHUNKS 1024
/* The backward fast path keeps ~100 values per thread: at 1024 threads (64 registers) it spills. */
#define GT_RMS_BWD_THREADS 512
/* Threads per SM the bf16 backward is compiled to keep resident (a register cap). H200, [16384,
 * 2048] bf16: no cap (92 registers, 2 blocks of 256) 118.9 us; 768 (3 blocks) 104.6 us; 1024 (64
 * registers, spills) 106.1 us; [16384, 256]: 19.8, 17.8, 19.2 us. */
#ifndef GT_RMS_BWD_MIN_THREADS
#define GT_RMS_BWD_MIN_THREADS 768
#endif
#define GT_ROPE_ITEMS 256

/* ---------------------------------------------------------------- 8-wide loads and stores */

/* Elements [i, i + 8) (i % 8 == 0, base 16-byte aligned): one 16-byte access for bf16/f16, two
 * for f32. Widening and rounding are those of gt_ld / gt_st. */
__device__ __forceinline__ void gt_ld8(const void *p, int dt, int64_t i, float *v)
{
    if (dt == GT_F32) {
        const float4 *q = (const float4 *)((const float *)p + i);
        float4 a = q[0], b = q[1];
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
        v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
        return;
    }
    uint4 u = *(const uint4 *)((const unsigned short *)p + i);
    unsigned wd[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int k = 0; k < 4; k++) {
        unsigned short lo = (unsigned short)(wd[k] & 0xffffu), hi = (unsigned short)(wd[k] >> 16);
        if (dt == GT_BF16) {
            v[2 * k] = __uint_as_float((unsigned)lo << 16);
            v[2 * k + 1] = __uint_as_float((unsigned)hi << 16);
        } else {
            v[2 * k] = __half2float(__ushort_as_half(lo));
            v[2 * k + 1] = __half2float(__ushort_as_half(hi));
        }
    }
}

__device__ __forceinline__ void gt_st8(void *p, int dt, int64_t i, const float *v)
{
    if (dt == GT_F32) {
        float4 *q = (float4 *)((float *)p + i);
        q[0] = make_float4(v[0], v[1], v[2], v[3]);
        q[1] = make_float4(v[4], v[5], v[6], v[7]);
        return;
    }
    unsigned wd[4];
#pragma unroll
    for (int k = 0; k < 4; k++) {
        unsigned lo, hi;
        if (dt == GT_BF16) {
            lo = __bfloat16_as_ushort(__float2bfloat16_rn(v[2 * k]));
            hi = __bfloat16_as_ushort(__float2bfloat16_rn(v[2 * k + 1]));
        } else {
            lo = __half_as_ushort(__float2half_rn(v[2 * k]));
            hi = __half_as_ushort(__float2half_rn(v[2 * k + 1]));
        }
        wd[k] = lo | (hi << 16);
    }
    *(uint4 *)((unsigned short *)p + i) = make_uint4(wd[0], wd[1], wd[2], wd[3]);
}

/* V = 8: gt_ld8 / gt_st8; V = 1: one element. */
template <int V> __device__ __forceinline__ void gt_ldv(const void *p, int dt, int64_t i, float *v)
{
    if (V == 8)
        gt_ld8(p, dt, i, v);
    else
        v[0] = gt_ld(p, dt, i);
}

template <int V> __device__ __forceinline__ void gt_stv(void *p, int dt, int64_t i, const float *v)
{
    if (V == 8)
        gt_st8(p, dt, i, v);
    else
        gt_st(p, dt, i, v[0]);
}

/* ---------------------------------------------------------------- rms_norm fast paths
 * Row groups: a group of TPR threads owns a row (thread t of the group: columns [8t, 8t + 8)).
 * TPR is d / 8 rounded up to a power of two, so a group of at most 32 threads is an aligned part
 * of a warp whose sums need no barrier. A block of BLOCK = max(TPR, 256) threads holds
 * G = BLOCK / TPR groups, each on its own rows, so an SM keeps many rows in flight even when rows
 * are short (d = 256: 32 threads per row, 8 rows per block; one row per 32-thread block and a
 * serial walk over its rows left most of the SM idle). Block b covers the rows of chunk b
 * ([b chunk, (b + 1) chunk), chunk from the shape alone); group g takes rows b chunk + g,
 * + G, ... in order, loading its next row while it reduces the current one. */

/* Sums a and b over the TPR threads of this thread's group; every thread of the group gets the
 * same bits: an xor butterfly within the group (a + b == b + a exactly), then for TPR > 32 the
 * group's warp totals added in warp order by every thread. TPR > 32: every thread of the block
 * calls it (one barrier pair); sh holds BLOCK / 32 double2. */
template <int TPR> __device__ __forceinline__ double2 gt_group_sum2(double a, double b, double2 *sh)
{
    constexpr int W = TPR < 32 ? TPR : 32;
#pragma unroll
    for (int o = W / 2; o > 0; o >>= 1) {
        a += __shfl_xor_sync(0xffffffffu, a, o);
        b += __shfl_xor_sync(0xffffffffu, b, o);
    }
    if (TPR <= 32) return make_double2(a, b);
    constexpr int WPG = TPR > 32 ? TPR / 32 : 1; /* warps per group */
    int warp = threadIdx.x >> 5, first = warp - warp % WPG;
    if ((threadIdx.x & 31) == 0) sh[warp] = make_double2(a, b);
    __syncthreads();
    double2 t = make_double2(0.0, 0.0);
#pragma unroll
    for (int k = 0; k < WPG; k++) {
        t.x += sh[first + k].x;
        t.y += sh[first + k].y;
    }
    __syncthreads();
    return t;
}

/* The rows of block blockIdx.x's chunk that group grp takes: first, first + G, ... (mine of
 * them, in order); every group of the block makes passes passes (a group past its rows idles
 * through the barriers). */
struct gt_rms_rows {
    int64_t first;
    int mine, passes;
};

template <int G>
__device__ __forceinline__ gt_rms_rows gt_rms_chunk(int64_t rows, int64_t chunk, int grp)
{
    int64_t r0 = (int64_t)blockIdx.x * chunk, r1 = r0 + chunk < rows ? r0 + chunk : rows;
    int n = r1 > r0 ? (int)(r1 - r0) : 0;
    gt_rms_rows q = {r0 + grp, n > grp ? (n - grp + G - 1) / G : 0, (n + G - 1) / G};
    return q;
}

/* Eight consecutive elements of T (bf16: one 16-byte word; f32: two), kept raw between a load
 * and their use: the row kernels hold the current and the next row, and raw bf16 takes half the
 * registers of floats. */
template <typename T> struct gt_v8 {
    uint4 u[sizeof(T) / 2];
};

template <typename T> __device__ __forceinline__ gt_v8<T> gt_v8_ld(const T *p, int64_t i)
{
    gt_v8<T> v;
#pragma unroll
    for (int k = 0; k < (int)(sizeof(T) / 2); k++)
        v.u[k] = ((const uint4 *)(p + i))[k];
    return v;
}

template <typename T> __device__ __forceinline__ gt_v8<T> gt_v8_zero(void)
{
    gt_v8<T> v;
#pragma unroll
    for (int k = 0; k < (int)(sizeof(T) / 2); k++)
        v.u[k] = make_uint4(0, 0, 0, 0);
    return v;
}

/* v rounded to T (nearest even) and widened back: what storing it as T and loading it gives. */
template <typename T> __device__ __forceinline__ float gt_round_to(float v)
{
    return sizeof(T) == 4 ? v : __bfloat162float(__float2bfloat16_rn(v));
}

/* The 8 values widened to f32 (exact). */
template <typename T> __device__ __forceinline__ void gt_v8_get(const gt_v8<T> &v, float *f)
{
    const unsigned *w = (const unsigned *)v.u;
#pragma unroll
    for (int k = 0; k < 8; k++)
        f[k] = sizeof(T) == 4 ? __uint_as_float(w[k])
                              : __uint_as_float(((w[k / 2] >> (16 * (k % 2))) & 0xffffu) << 16);
}

/* Stores 8 floats rounded to T (nearest even). */
template <typename T> __device__ __forceinline__ void gt_v8_st(T *p, int64_t i, const float *f)
{
    uint4 *q = (uint4 *)(p + i);
    if (sizeof(T) == 4) {
        q[0] = make_uint4(__float_as_uint(f[0]), __float_as_uint(f[1]), __float_as_uint(f[2]),
                          __float_as_uint(f[3]));
        q[1 % (sizeof(T) / 2)] = make_uint4(__float_as_uint(f[4]), __float_as_uint(f[5]),
                                            __float_as_uint(f[6]), __float_as_uint(f[7]));
    } else {
        unsigned wd[4];
#pragma unroll
        for (int k = 0; k < 4; k++)
            wd[k] = (unsigned)__bfloat16_as_ushort(__float2bfloat16_rn(f[2 * k])) |
                    (unsigned)__bfloat16_as_ushort(__float2bfloat16_rn(f[2 * k + 1])) << 16;
        q[0] = make_uint4(wd[0], wd[1], wd[2], wd[3]);
    }
}

/* Forward: y = (x * r) * w with r = 1 / sqrt(mean(x^2) + eps), the squares exact in double as
 * the CPU kernel sums them, r rounded to f32. */
/* RES (add_rms_norm): the row is h = x + r, each sum rounded to T as the add kernel rounds it and
 * stored to hout, and the norm reads those rounded values: bitwise the add then rms_norm. */
template <typename T, int TPR, bool RES>
__global__ void __launch_bounds__(TPR > 256 ? TPR : 256)
    gt_k_rms_fwd8(int64_t rows, int64_t d, int64_t chunk, double eps, const T *x, const T *r,
                  const T *w, T *out, T *hout)
{
    constexpr int BLOCK = TPR > 256 ? TPR : 256, G = BLOCK / TPR;
    __shared__ double2 sh[BLOCK / 32];
    int grp = threadIdx.x / TPR;
    int64_t j = (int64_t)(threadIdx.x % TPR) * 8;
    bool act = j < d;
    gt_rms_rows q = gt_rms_chunk<G>(rows, chunk, grp);
    int64_t step = (int64_t)G * d; /* elements from one of the group's rows to its next */
    const T *xp = x + q.first * d + j, *rp = RES ? r + q.first * d + j : nullptr;
    T *yp = out + q.first * d + j, *hp = RES ? hout + q.first * d + j : nullptr;
    gt_v8<T> wr = gt_v8_zero<T>(), xr = gt_v8_zero<T>(), rr = gt_v8_zero<T>();
    if (act) wr = gt_v8_ld(w, j);
    if (act && q.mine > 0) {
        xr = gt_v8_ld(xp, 0);
        if (RES) rr = gt_v8_ld(rp, 0);
    }
    for (int it = 0; it < q.passes; it++, xp += step, yp += step) {
        gt_v8<T> xn = gt_v8_zero<T>(), rn = gt_v8_zero<T>();
        if (act && it + 1 < q.mine) {
            xn = gt_v8_ld(xp, step);
            if (RES) rn = gt_v8_ld(rp, step);
        }
        float xv[8];
        gt_v8_get(xr, xv);
        if (RES) {
            float rv[8];
            gt_v8_get(rr, rv);
#pragma unroll
            for (int k = 0; k < 8; k++)
                xv[k] = gt_round_to<T>(xv[k] + rv[k]);
            if (act && it < q.mine) gt_v8_st(hp, 0, xv);
            rp += step;
            hp += step;
        }
        double ss = 0.0;
#pragma unroll
        for (int k = 0; k < 8; k++)
            ss += (double)xv[k] * xv[k];
        ss = gt_group_sum2<TPR>(ss, 0.0, sh).x;
        float sf = (float)(1.0 / sqrt(ss / (double)d + eps));
        if (act && it < q.mine) {
            float wv[8], y[8];
            gt_v8_get(wr, wv);
#pragma unroll
            for (int k = 0; k < 8; k++)
                y[k] = __fmul_rn(__fmul_rn(xv[k], sf), wv[k]);
            gt_v8_st(yp, 0, y);
        }
        xr = xn;
        rr = rn;
    }
}

/* Backward, per row: g = w dy, s = 1 / sqrt(mean(x^2) + eps), c = s^2 sum(g x) / d (= s times
 * mean(g xhat)); dx = s (g - x c); and dw partial += dy (x s). The element math runs in A: double
 * for f32 tensors (the parity runs), float for bf16 ones, whose results round to 8 bits anyway
 * (the double math and its conversions made the bf16 kernel compute-bound: H200, [16384, 2048],
 * 184 us for 201 MB). A thread's two row sums over its 8 columns are taken in A, the group's in
 * double. partial[b * d + col] = sum over block b's rows of dy x s: each group adds its rows in
 * order, then the G group totals are added in group order. */
/* rms_norm_backward_add: ND (1-3) branch gradients d0, d1, d2 summed left to right into dy, each
 * sum rounded to T as the add kernels round it; RES: dx = res + g with g (the norm's dx) rounded
 * to T first, as storing g and adding it would. Bitwise the unfused add chain, rms_norm_backward
 * and residual add. */
template <typename T, int TPR, int ND, bool RES>
__global__ void __launch_bounds__(TPR > 256 ? TPR : 256,
                                  sizeof(T) == 2 &&
                                          GT_RMS_BWD_MIN_THREADS / (TPR > 256 ? TPR : 256) > 1
                                      ? GT_RMS_BWD_MIN_THREADS / (TPR > 256 ? TPR : 256)
                                      : 1)
    gt_k_rms_bwd8(int64_t rows, int64_t d, int64_t chunk, double eps, const T *x, const T *w,
                  const T *dy, const T *dy1, const T *dy2, const T *res, T *dx, double *partial)
{
    typedef typename std::conditional<sizeof(T) == 4, double, float>::type A;
    constexpr int BLOCK = TPR > 256 ? TPR : 256, G = BLOCK / TPR;
    __shared__ double2 sh[BLOCK / 32];
    __shared__ A acc_sh[G > 1 ? BLOCK * 8 : 1];
    int grp = threadIdx.x / TPR;
    int64_t j = (int64_t)(threadIdx.x % TPR) * 8;
    bool act = j < d;
    gt_rms_rows q = gt_rms_chunk<G>(rows, chunk, grp);
    int64_t step = (int64_t)G * d; /* elements from one of the group's rows to its next */
    int64_t at = q.first * d + j;  /* the group's current row, column j */
    const T *gps[3] = {dy, dy1, dy2};
    gt_v8<T> wr = gt_v8_zero<T>(), xr = gt_v8_zero<T>(), gr[ND];
#pragma unroll
    for (int e = 0; e < ND; e++)
        gr[e] = gt_v8_zero<T>();
    A acc[8];
#pragma unroll
    for (int k = 0; k < 8; k++)
        acc[k] = (A)0;
    if (act) wr = gt_v8_ld(w, j);
    if (act && q.mine > 0) {
        xr = gt_v8_ld(x, at);
#pragma unroll
        for (int e = 0; e < ND; e++)
            gr[e] = gt_v8_ld(gps[e], at);
    }
    for (int it = 0; it < q.passes; it++, at += step) {
        gt_v8<T> xn = gt_v8_zero<T>(), gn[ND], rr = gt_v8_zero<T>();
#pragma unroll
        for (int e = 0; e < ND; e++)
            gn[e] = gt_v8_zero<T>();
        if (act && it + 1 < q.mine) {
            xn = gt_v8_ld(x, at + step);
#pragma unroll
            for (int e = 0; e < ND; e++)
                gn[e] = gt_v8_ld(gps[e], at + step);
        }
        if (RES && act && it < q.mine) rr = gt_v8_ld(res, at); /* in flight over the row sums */
        float xv[8], gv[8], wv[8];
        gt_v8_get(xr, xv);
        gt_v8_get(gr[0], gv);
#pragma unroll
        for (int e = 1; e < ND; e++) {
            float ev[8];
            gt_v8_get(gr[e], ev);
#pragma unroll
            for (int k = 0; k < 8; k++)
                gv[k] = gt_round_to<T>(gv[k] + ev[k]);
        }
        gt_v8_get(wr, wv);
        A ss = (A)0, dot = (A)0;
#pragma unroll
        for (int k = 0; k < 8; k++) {
            ss += (A)xv[k] * (A)xv[k];
            dot += (A)wv[k] * (A)gv[k] * (A)xv[k];
        }
        double2 t = gt_group_sum2<TPR>((double)ss, (double)dot, sh);
        double sd = 1.0 / sqrt(t.x / (double)d + eps);
        A s = (A)sd, c = (A)(sd * sd * t.y / (double)d);
        if (act && it < q.mine) {
            float o[8];
#pragma unroll
            for (int k = 0; k < 8; k++) {
                A xa = (A)xv[k], ga = (A)wv[k] * (A)gv[k];
                o[k] = (float)(s * (ga - xa * c));
                acc[k] += (A)gv[k] * (xa * s);
            }
            if (RES) {
                float rv[8];
                gt_v8_get(rr, rv);
#pragma unroll
                for (int k = 0; k < 8; k++)
                    o[k] = rv[k] + gt_round_to<T>(o[k]);
            }
            gt_v8_st(dx, at, o);
        }
        xr = xn;
#pragma unroll
        for (int e = 0; e < ND; e++)
            gr[e] = gn[e];
    }
    double *pp = partial + (int64_t)blockIdx.x * d + j;
    if (G == 1) {
        if (act)
            for (int k = 0; k < 8; k++)
                pp[k] = (double)acc[k];
        return;
    }
    if (act)
        for (int k = 0; k < 8; k++)
            acc_sh[grp * TPR * 8 + j + k] = acc[k];
    __syncthreads();
    if (grp == 0 && act)
        for (int k = 0; k < 8; k++) {
            double s = 0.0;
            for (int g = 0; g < G; g++)
                s += (double)acc_sh[g * TPR * 8 + j + k];
            pp[k] = s;
        }
}

/* dw[col] = sum of partial[c * d + col] over c. Block: 32 columns x 32 lanes; lane l adds chunks
 * l, l + 32, ... in order, then lane totals are added in lane order (fixed, shape-only order). */
__global__ void __launch_bounds__(1024)
    gt_k_rms_dw_sum(int64_t d, int64_t chunks, const double *partial, void *dw, int ddw)
{
    __shared__ double sh[32][33];
    int col_in = threadIdx.x & 31, lane = threadIdx.x >> 5;
    int64_t col = (int64_t)blockIdx.x * 32 + col_in;
    double acc = 0.0;
    if (col < d)
        for (int64_t c = lane; c < chunks; c += 32)
            acc += partial[c * d + col];
    sh[lane][col_in] = acc;
    __syncthreads();
    if (lane == 0 && col < d) {
        double t = 0.0;
        for (int l = 0; l < 32; l++)
            t += sh[l][col_in];
        gt_st(dw, ddw, col, (float)t);
    }
}

/* The fast paths need whole 16-byte groups of one dtype: d % 8 == 0, one thread per 8 columns
 * (<= max_t), every tensor bf16 or every tensor f32, and every tensor 16-byte aligned. Returns
 * the threads per row TPR (d / 8 rounded up to a power of two, at least 8), or 0 for the generic
 * kernels. */
static unsigned gt_rms_fast_threads(int64_t d, const gt_tensor *const *ts, int n, int64_t max_t)
{
    if (d <= 0 || d % 8 != 0 || d / 8 > max_t) return 0;
    if (ts[0]->dtype != GT_BF16 && ts[0]->dtype != GT_F32) return 0;
    for (int k = 0; k < n; k++)
        if (!gt_aligned16(ts[k]->data) || ts[k]->dtype != ts[0]->dtype) return 0;
    unsigned t = 8;
    while ((int64_t)t * 8 < d)
        t *= 2;
    return t;
}

/* Rows per block of the fast paths: at most GT_RMS_CHUNKS blocks (enough to fill the GPU, few dw
 * partials to add); a function of the shape alone, so the dw sums keep their order. */
static int64_t gt_rms_chunk_rows(int64_t rows)
{
    return rows > 0 ? (rows + GT_RMS_CHUNKS - 1) / GT_RMS_CHUNKS : 1;
}

/* Calls f.template run<T, TPR>() for the power of two tpr (8 .. MAX_TPR; gt_rms_fast_threads
 * caps it, and the caps below only keep wider kernels than the op takes from being built). */
template <typename T, int MAX_TPR, typename F> static void gt_rms_dispatch_t(unsigned tpr, F &f)
{
    switch (tpr) {
    case 8:
        f.template run<T, 8>();
        break;
    case 16:
        f.template run<T, 16>();
        break;
    case 32:
        f.template run<T, 32>();
        break;
    case 64:
        f.template run<T, 64>();
        break;
    case 128:
        f.template run<T, 128>();
        break;
    case 256:
        f.template run<T, 256>();
        break;
    case 512:
        f.template run<T, (512 < MAX_TPR ? 512 : MAX_TPR)>();
        break;
    default:
        f.template run<T, MAX_TPR>();
        break;
    }
}

/* The same for the tensors' dtype dt (bf16 or f32). */
template <int MAX_TPR, typename F> static void gt_rms_dispatch(int dt, unsigned tpr, F &f)
{
    if (dt == GT_F32)
        gt_rms_dispatch_t<float, MAX_TPR>(tpr, f);
    else
        gt_rms_dispatch_t<__nv_bfloat16, MAX_TPR>(tpr, f);
}

/* rms_norm of x, or (r and h given) of h = x + r stored to h: add_rms_norm. */
struct gt_rms_fwd_launch {
    cudaStream_t st;
    int64_t rows, d, chunk;
    double eps;
    const gt_tensor *x, *w;
    gt_tensor *y;
    const gt_tensor *r;
    gt_tensor *h;
    template <typename T, int TPR> void run()
    {
        unsigned nb = (unsigned)((rows + chunk - 1) / chunk);
        constexpr int block = TPR > 256 ? TPR : 256;
        if (r)
            gt_k_rms_fwd8<T, TPR, true>
                <<<nb, block, 0, st>>>(rows, d, chunk, eps, (const T *)x->data, (const T *)r->data,
                                       (const T *)w->data, (T *)y->data, (T *)h->data);
        else
            gt_k_rms_fwd8<T, TPR, false>
                <<<nb, block, 0, st>>>(rows, d, chunk, eps, (const T *)x->data, nullptr,
                                       (const T *)w->data, (T *)y->data, nullptr);
    }
};

/* rms_norm_backward (nd = 1, no res) or rms_norm_backward_add (nd = 1..3 terms of dy, res). */
struct gt_rms_bwd_launch {
    cudaStream_t st;
    int64_t rows, d, chunk;
    double eps;
    const gt_tensor *x, *w;
    const gt_tensor *const *dy;
    int nd;
    const gt_tensor *res;
    gt_tensor *dx;
    double *partial;
    template <typename T, int TPR, int ND, bool RES> void go()
    {
        unsigned nb = (unsigned)((rows + chunk - 1) / chunk);
        constexpr int block = TPR > 256 ? TPR : 256;
        const T *d1 = ND > 1 ? (const T *)dy[1]->data : nullptr;
        const T *d2 = ND > 2 ? (const T *)dy[2]->data : nullptr;
        gt_k_rms_bwd8<T, TPR, ND, RES><<<nb, block, 0, st>>>(
            rows, d, chunk, eps, (const T *)x->data, (const T *)w->data, (const T *)dy[0]->data, d1,
            d2, RES ? (const T *)res->data : nullptr, (T *)dx->data, partial);
    }
    template <typename T, int TPR> void run()
    {
        if (!res)
            go<T, TPR, 1, false>();
        else if (nd == 1)
            go<T, TPR, 1, true>();
        else if (nd == 2)
            go<T, TPR, 2, true>();
        else
            go<T, TPR, 3, true>();
    }
};

/* The branch-gradient terms of dy and the residual of the generic kernels (gt_ld dtype codes):
 * dy = ((d0 + d1) + d2), each sum rounded to dt; n = 1: dy = d0. */
typedef struct {
    const void *d[3];
    int n, dt;
    const void *res; /* rms_norm_backward_add's r; NULL for rms_norm_backward */
    int rdt;
} gt_rms_terms;

__device__ __forceinline__ float gt_rms_dy(const gt_rms_terms &t, int64_t i)
{
    float v = gt_ld(t.d[0], t.dt, i);
    for (int e = 1; e < t.n; e++)
        v = gt_round_dt(t.dt, v + gt_ld(t.d[e], t.dt, i));
    return v;
}

/* mode 0: forward (y); mode 1: backward (dx, and r per row into rs; dy from the terms t). */
__global__ void __launch_bounds__(GT_CUDA_THREADS)
    gt_k_rms_rows(int mode, int64_t rows, int64_t d, double eps, const void *x, int dxt,
                  const void *w, int dwt, gt_rms_terms t, void *out, int dout, double *rs)
{
    __shared__ double sh[GT_CUDA_THREADS];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        int64_t base = r * d;
        double ss = 0.0;
        for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
            double v = gt_ld(x, dxt, base + j);
            ss += v * v;
        }
        ss = gt_block_sum(ss, sh);
        double s = 1.0 / sqrt(ss / (double)d + eps);
        if (mode == 0) {
            float sf = (float)s;
            for (int64_t j = threadIdx.x; j < d; j += blockDim.x)
                gt_st(out, dout, base + j,
                      __fmul_rn(__fmul_rn(gt_ld(x, dxt, base + j), sf), gt_ld(w, dwt, j)));
            continue;
        }
        double dot = 0.0;
        for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
            double xhat = (double)gt_ld(x, dxt, base + j) * s;
            dot += (double)gt_ld(w, dwt, j) * gt_rms_dy(t, base + j) * xhat;
        }
        double mean = gt_block_sum(dot, sh) / (double)d;
        for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
            double xv = gt_ld(x, dxt, base + j);
            double gv = (double)gt_ld(w, dwt, j) * gt_rms_dy(t, base + j);
            float o = (float)(s * (gv - xv * s * mean));
            if (t.res) o = gt_ld(t.res, t.rdt, base + j) + gt_round_dt(dout, o);
            gt_st(out, dout, base + j, o);
        }
        if (threadIdx.x == 0) rs[r] = s;
    }
}

/* partial[c * d + j] = sum over rows of chunk c, in order, of dy * x * r. */
__global__ void gt_k_rms_dw_partial(int64_t rows, int64_t d, int64_t chunks, const void *x, int dxt,
                                    gt_rms_terms t, const double *rs, double *partial)
{
    GT_GRID_STRIDE(i, chunks * d)
    {
        int64_t c = i / d, j = i - c * d, r1 = (c + 1) * GT_NORM_CHUNK;
        double acc = 0.0;
        for (int64_t r = c * GT_NORM_CHUNK; r < r1 && r < rows; r++)
            acc += (double)gt_rms_dy(t, r * d + j) * ((double)gt_ld(x, dxt, r * d + j) * rs[r]);
        partial[i] = acc;
    }
}

__global__ void gt_k_rms_dw_finish(int64_t d, int64_t chunks, const double *partial, void *dw,
                                   int ddw)
{
    GT_GRID_STRIDE(j, d)
    {
        double acc = 0.0;
        for (int64_t c = 0; c < chunks; c++)
            acc += partial[c * d + j];
        gt_st(dw, ddw, j, (float)acc);
    }
}

static gt_status gt_cuda_norm_shapes(const gt_kernel_call *c, const gt_tensor *x,
                                     const gt_tensor *w, int64_t *d, int64_t *rows, gt_error *err)
{
    GT_TRY(gt_kernel_want_float(c, x, "x", err));
    GT_TRY(gt_kernel_want_float(c, w, "w", err));
    GT_TRY(gt_kernel_want_attrs(c, 0, 1, 0, err));
    if (x->ndim < 1 || w->ndim != 1 || w->shape[0] != x->shape[x->ndim - 1])
        return gt_cuda_shape_error(c, "w must be [last dim of x]", err);
    *d = w->shape[0];
    *rows = *d > 0 ? gt_tensor_numel(x) / *d : 0;
    return GT_OK;
}

gt_status gt_cuda_rms_norm(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    const gt_tensor *x = c->in[0], *w = c->in[1];
    gt_tensor *y = c->out[0];
    int64_t d = 0, rows = 0;
    GT_TRY(gt_cuda_norm_shapes(c, x, w, &d, &rows, err));
    GT_TRY(gt_kernel_want_float(c, y, "output", err));
    GT_TRY(gt_kernel_want_same_shape(c, x, "x", y, "output", err));
    if (rows == 0) return GT_OK;
    const gt_tensor *ts[3] = {x, w, y};
    unsigned tpr = gt_rms_fast_threads(d, ts, 3, 1024);
    if (tpr > 0) {
        gt_rms_fwd_launch f = {s->stream, rows, d,   gt_rms_chunk_rows(rows), c->f[0], x, w,
                               y,         NULL, NULL};
        gt_rms_dispatch<1024>(x->dtype, tpr, f);
        return gt_cuda_launched(c, err);
    }
    gt_rms_terms t;
    memset(&t, 0, sizeof t);
    gt_k_rms_rows<<<(unsigned)(rows < 65536 ? rows : 65536), GT_CUDA_THREADS, 0, s->stream>>>(
        0, rows, d, c->f[0], x->data, x->dtype, w->data, w->dtype, t, y->data, y->dtype, NULL);
    return gt_cuda_launched(c, err);
}

/* add_rms_norm (a, b, w) -> (h, y): one pass (gt_k_rms_fwd8 with RES) when the rms_norm fast path
 * takes the shapes and every tensor has one dtype (bf16 or f32) and 16-byte alignment; else the
 * add kernel, then the rms_norm kernel on h. Either way bitwise add then rms_norm. */
gt_status gt_cuda_add_rms_norm(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    const gt_tensor *a = c->in[0], *b = c->in[1], *w = c->in[2];
    gt_tensor *h = c->out[0], *y = c->out[1];
    int64_t d = 0, rows = 0;
    GT_TRY(gt_cuda_norm_shapes(c, a, w, &d, &rows, err));
    GT_TRY(gt_kernel_want_float(c, b, "b", err));
    GT_TRY(gt_kernel_want_float(c, h, "h", err));
    GT_TRY(gt_kernel_want_float(c, y, "output", err));
    GT_TRY(gt_kernel_want_same_shape(c, a, "a", b, "b", err));
    GT_TRY(gt_kernel_want_same_shape(c, a, "a", h, "h", err));
    GT_TRY(gt_kernel_want_same_shape(c, a, "a", y, "output", err));
    if (rows == 0) return GT_OK;
    const gt_tensor *ts[5] = {a, b, w, h, y};
    unsigned tpr = gt_rms_fast_threads(d, ts, 5, 1024);
    if (tpr > 0) {
        gt_rms_fwd_launch f = {s->stream, rows, d, gt_rms_chunk_rows(rows), c->f[0], a, w, y, b, h};
        gt_rms_dispatch<1024>(a->dtype, tpr, f);
        return gt_cuda_launched(c, err);
    }
    gt_kernel_call add, norm;
    memset(&add, 0, sizeof add);
    add.op = GT_OP_ADD;
    add.n_in = 2;
    add.n_out = 1;
    add.in[0] = a;
    add.in[1] = b;
    add.out[0] = h;
    GT_TRY(gt_cuda_add(s, &add, err));
    memset(&norm, 0, sizeof norm);
    norm.op = GT_OP_RMS_NORM;
    norm.f = c->f;
    norm.nf = 1;
    norm.n_in = 2;
    norm.n_out = 1;
    norm.in[0] = h;
    norm.in[1] = w;
    norm.out[0] = y;
    return gt_cuda_rms_norm(s, &norm, err);
}

/* rms_norm_backward (x, w, dy) and rms_norm_backward_add (x, w, r, d0[, d1[, d2]]): inputs
 * first_dy.. are the terms of dy (summed left to right, rounded), res (input 2 of the _add op, or
 * NULL) is added to the norm's dx; names[k] names input k in errors. */
static gt_status gt_cuda_rms_bwd(gt_cuda_stream *s, const gt_kernel_call *c,
                                 const char *const *names, int first_dy, const gt_tensor *res,
                                 gt_error *err)
{
    const gt_tensor *x = c->in[0], *w = c->in[1], *const *dys = &c->in[first_dy];
    gt_tensor *dx = c->out[0], *dw = c->out[1];
    int nd = c->n_in - first_dy;
    int64_t d = 0, rows = 0;
    GT_TRY(gt_cuda_norm_shapes(c, x, w, &d, &rows, err));
    for (int k = 2; k < c->n_in; k++) {
        GT_TRY(gt_kernel_want_float(c, c->in[k], names[k], err));
        GT_TRY(gt_kernel_want_same_shape(c, x, "x", c->in[k], names[k], err));
    }
    GT_TRY(gt_kernel_want_float(c, dx, "dx", err));
    GT_TRY(gt_kernel_want_float(c, dw, "dw", err));
    GT_TRY(gt_kernel_want_same_shape(c, x, "x", dx, "dx", err));
    GT_TRY(gt_kernel_want_same_shape(c, w, "w", dw, "dw", err));
    if (d == 0) return GT_OK;
    const gt_tensor *ts[8] = {x, w, dx, dw, res ? res : x};
    for (int e = 0; e < nd; e++)
        ts[5 + e] = dys[e];
    unsigned tpr = gt_rms_fast_threads(d, ts, 5 + nd, GT_RMS_BWD_THREADS);
    if (tpr > 0 && rows > 0) {
        int64_t chunk = gt_rms_chunk_rows(rows), nch = (rows + chunk - 1) / chunk;
        void *scr;
        GT_TRY(gt_cuda_scratch(s, c, (size_t)(nch * d) * sizeof(double), &scr, err));
        gt_rms_bwd_launch f = {s->stream, rows, d,  chunk, c->f[0], x,
                               w,         dys,  nd, res,   dx,      (double *)scr};
        gt_rms_dispatch<GT_RMS_BWD_THREADS>(x->dtype, tpr, f);
        GT_TRY(gt_cuda_launched(c, err));
        gt_k_rms_dw_sum<<<(unsigned)((d + 31) / 32), 1024, 0, s->stream>>>(
            d, nch, (const double *)scr, dw->data, dw->dtype);
        return gt_cuda_launched(c, err);
    }
    gt_rms_terms t;
    memset(&t, 0, sizeof t);
    t.n = nd;
    t.dt = dys[0]->dtype;
    for (int e = 0; e < nd; e++)
        t.d[e] = dys[e]->data;
    t.res = res ? res->data : NULL;
    t.rdt = res ? res->dtype : 0;
    int64_t chunks = (rows + GT_NORM_CHUNK - 1) / GT_NORM_CHUNK;
    size_t rb = ((size_t)rows * sizeof(double) + 255) & ~(size_t)255;
    void *scr;
    GT_TRY(gt_cuda_scratch(s, c, rb + (size_t)(chunks * d) * sizeof(double) + 8, &scr, err));
    double *rs = (double *)scr, *partial = (double *)((char *)scr + rb);
    if (rows > 0) {
        gt_k_rms_rows<<<(unsigned)(rows < 65536 ? rows : 65536), GT_CUDA_THREADS, 0, s->stream>>>(
            1, rows, d, c->f[0], x->data, x->dtype, w->data, w->dtype, t, dx->data, dx->dtype, rs);
        GT_TRY(gt_cuda_launched(c, err));
        gt_k_rms_dw_partial<<<gt_cuda_blocks(chunks * d), GT_CUDA_THREADS, 0, s->stream>>>(
            rows, d, chunks, x->data, x->dtype, t, rs, partial);
        GT_TRY(gt_cuda_launched(c, err));
    }
    gt_k_rms_dw_finish<<<gt_cuda_blocks(d), GT_CUDA_THREADS, 0, s->stream>>>(d, chunks, partial,
                                                                             dw->data, dw->dtype);
    return gt_cuda_launched(c, err);
}

gt_status gt_cuda_rms_norm_backward(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    static const char *const names[3] = {"x", "w", "dy"};
    return gt_cuda_rms_bwd(s, c, names, 2, NULL, err);
}

/* rms_norm_backward_add (x, w, r, d0[, d1[, d2]]) -> (dx, dw): one pass. The terms of dy and r
 * must have x's dtype (the shape rule's same-type inputs), so the sums round where the unfused
 * add kernels rounded. */
gt_status gt_cuda_rms_norm_backward_add(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    static const char *const names[6] = {"x", "w", "r", "d0", "d1", "d2"};
    if (c->n_in < 4 || c->n_in > 6 || c->n_out != 2)
        return gt_cuda_shape_error(
            c, "expected inputs (x, w, r, d0[, d1[, d2]]) and outputs (dx, dw)", err);
    for (int k = 2; k < c->n_in; k++)
        if (c->in[k]->dtype != c->in[0]->dtype)
            return gt_cuda_shape_error(c, "r and the terms of dy must have x's dtype", err);
    return gt_cuda_rms_bwd(s, c, names, 3, c->in[2], err);
}

/* ---------------------------------------------------------------- rope */

typedef struct {
    float inv[GT_ROPE_MAX_HALF];
} gt_rope_freqs;

/* x viewed as [nbs = b * s, h, 2 * half]. Block k covers rows [k * npos, (k + 1) * npos): it
 * builds their cos/sin table tab[q][j] = (cos, sign * sin) in shared memory, then each item
 * (row, head, group of V pairs) reads both elements of its pairs before writing them, so out may
 * alias x. Pair j is (j, j + half), or (2j, 2j + 1) with IL (interleaved: the V pairs are 2V
 * consecutive elements, two V-wide accesses). A thread loads its first item before it builds its
 * share of the table, so the loads are in flight during the double-precision cos/sin (at the
 * llama3 shapes every thread has one item: table, then loads, put the two latencies end to end). */
template <int V, bool IL>
__global__ void __launch_bounds__(GT_CUDA_THREADS)
    gt_k_rope(int64_t nbs, int64_t s, int64_t h, int64_t half, int npos, float sign,
              gt_rope_freqs f, const int64_t *pos, const void *x, int dxt, void *out, int dout)
{
    extern __shared__ float tab[];
    int64_t bp0 = (int64_t)blockIdx.x * npos;
    int64_t groups = half / V, per_row = h * groups;
    /* item t: row q of the block, head hd, pairs [j, j + V); base = the row's first element */
    int64_t t = threadIdx.x, q = 0, j = 0, base = 0;
    float x1[V], x2[V];
    auto next = [&](void) {
        q = t / per_row;
        int64_t rem = t - q * per_row, hd = rem / groups;
        j = (rem - hd * groups) * V;
        if (q >= npos || bp0 + q >= nbs) return false;
        base = ((bp0 + q) * h + hd) * 2 * half;
        if (IL) {
            float buf[2 * V];
            gt_ldv<V>(x, dxt, base + 2 * j, buf);
            gt_ldv<V>(x, dxt, base + 2 * j + V, buf + V);
#pragma unroll
            for (int k = 0; k < V; k++) {
                x1[k] = buf[2 * k];
                x2[k] = buf[2 * k + 1];
            }
        } else {
            gt_ldv<V>(x, dxt, base + j, x1);
            gt_ldv<V>(x, dxt, base + half + j, x2);
        }
        return true;
    };
    bool have = next();
    for (int64_t e = threadIdx.x; e < npos * half; e += blockDim.x) {
        int64_t qe = e / half, je = e - qe * half;
        /* row bp0 + qe sits at index (bp0 + qe) % s of its sequence, or at its given position */
        int64_t row = bp0 + qe, p = row % s;
        if (pos) p = row < nbs ? pos[row] : 0;
        float angle = __fmul_rn((float)p, f.inv[je]);
        tab[2 * e] = (float)cos((double)angle);
        tab[2 * e + 1] = sign * (float)sin((double)angle);
    }
    __syncthreads();
    while (have) {
        const float *cs = tab + 2 * (q * half + j);
        float y1[V], y2[V];
#pragma unroll
        for (int k = 0; k < V; k++) {
            float co = cs[2 * k], si = cs[2 * k + 1];
            y1[k] = __fsub_rn(__fmul_rn(x1[k], co), __fmul_rn(x2[k], si));
            y2[k] = __fadd_rn(__fmul_rn(x2[k], co), __fmul_rn(x1[k], si));
        }
        if (IL) {
            float buf[2 * V];
#pragma unroll
            for (int k = 0; k < V; k++) {
                buf[2 * k] = y1[k];
                buf[2 * k + 1] = y2[k];
            }
            gt_stv<V>(out, dout, base + 2 * j, buf);
            gt_stv<V>(out, dout, base + 2 * j + V, buf + V);
        } else {
            gt_stv<V>(out, dout, base + j, y1);
            gt_stv<V>(out, dout, base + half + j, y2);
        }
        t += blockDim.x;
        have = next();
    }
}

template <int V>
static void gt_rope_launch(cudaStream_t st, bool il, int64_t blocks, size_t smem, int64_t nbs,
                           const gt_tensor *x, int64_t npos, float sign, const gt_rope_freqs &f,
                           const int64_t *pos, gt_tensor *out)
{
    int64_t s = x->shape[1], h = x->shape[2], half = x->shape[3] / 2;
    if (il)
        gt_k_rope<V, true><<<(unsigned)blocks, GT_CUDA_THREADS, smem, st>>>(
            nbs, s, h, half, (int)npos, sign, f, pos, x->data, x->dtype, out->data, out->dtype);
    else
        gt_k_rope<V, false><<<(unsigned)blocks, GT_CUDA_THREADS, smem, st>>>(
            nbs, s, h, half, (int)npos, sign, f, pos, x->data, x->dtype, out->data, out->dtype);
}

gt_status gt_cuda_rope(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    GT_TRY(gt_kernel_want_attrs(c, 2, 4, 0, err));
    const gt_tensor *x = c->in[0];
    gt_tensor *out = c->out[0];
    GT_TRY(gt_kernel_want_float(c, x, "x", err));
    GT_TRY(gt_kernel_want_float(c, out, "output", err));
    if (x->ndim != 4) return gt_cuda_shape_error(c, "x must be [b, s, h, d]", err);
    GT_TRY(gt_kernel_want_same_shape(c, x, "x", out, "output", err));
    int64_t d = x->shape[3], half = d / 2;
    if (d % 2 != 0)
        return gt_error_set(err, GT_ERR_SHAPE, "rope: head dim %lld must be even", (long long)d);
    if (half > GT_ROPE_MAX_HALF)
        return gt_error_set(err, GT_ERR_UNSUPPORTED, "rope: head dim %lld above %d", (long long)d,
                            2 * GT_ROPE_MAX_HALF);
    /* per-token positions (packed documents), i64 [b, s] on the device; values are trusted to be
     * >= 0 (the loader's; the CPU kernel checks them) */
    const int64_t *pos = NULL;
    if (c->n_in > 1) {
        const gt_tensor *pt = c->in[1];
        if (pt->dtype != GT_I64 || pt->ndim != 2 || pt->shape[0] != x->shape[0] ||
            pt->shape[1] != x->shape[1])
            return gt_cuda_shape_error(c, "positions must be i64 [b, s] of x", err);
        pos = (const int64_t *)pt->data;
    }
    if (gt_tensor_numel(x) == 0) return GT_OK;
    gt_rope_freqs f;
    memset(&f, 0, sizeof f);
    gt_rope_inv_freq(c, d, f.inv); /* host f32, as the CPU kernel */
    bool vec = half % 8 == 0 && gt_aligned16(x->data) && gt_aligned16(out->data);
    /* Rows per block: about GT_ROPE_ITEMS items each (a table of npos * half <= 2048 pairs). */
    int64_t nbs = x->shape[0] * x->shape[1], per_row = x->shape[2] * (vec ? half / 8 : half);
    int64_t npos = per_row >= GT_ROPE_ITEMS ? 1 : GT_ROPE_ITEMS / per_row;
    if (npos * half > 2048) npos = 2048 / half > 0 ? 2048 / half : 1;
    if (npos > nbs) npos = nbs;
    int64_t blocks = (nbs + npos - 1) / npos;
    if (blocks > INT32_MAX)
        return gt_error_set(err, GT_ERR_UNSUPPORTED, "rope: %lld rows above the grid limit",
                            (long long)nbs);
    size_t smem = (size_t)(npos * half) * 2 * sizeof(float);
    float sign = c->i[0] ? -1.0f : 1.0f;
    bool il = gt_rope_interleaved(c) != 0; /* an optional slot, absent (0) in llama graphs */
    if (vec)
        gt_rope_launch<8>(s->stream, il, blocks, smem, nbs, x, npos, sign, f, pos, out);
    else
        gt_rope_launch<1>(s->stream, il, blocks, smem, nbs, x, npos, sign, f, pos, out);
    return gt_cuda_launched(c, err);
}
