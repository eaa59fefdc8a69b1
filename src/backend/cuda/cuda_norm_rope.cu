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
 * thread with 16-byte accesses when d/2 % 8 == 0 and aligned, else 1). */
#include "cuda_internal.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "backend/rope_freqs.h" /* gt_rope_inv_freq, shared with the other backend */

#define GT_NORM_CHUNK 64
#define GT_ROPE_MAX_HALF 512
#define GT_RMS_CHUNKS 1024
/* The backward fast path keeps ~100 values per thread: at 1024 threads (64 registers) it spills. */
#define GT_RMS_BWD_THREADS 512
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

/* Sum over the block of one double per thread (blockDim.x a multiple of 32): warp xor-butterfly
 * (a + b == b + a exactly, so every lane ends with the same bits), then the warp totals added in
 * warp order by every thread. `sh` holds 32 doubles; reusable right after return. */
__device__ __forceinline__ double gt_row_sum_dbl(double v, double *sh)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
    __syncthreads();
    double t = 0.0;
    for (unsigned k = 0; k < (blockDim.x >> 5); k++)
        t += sh[k];
    __syncthreads();
    return t;
}

/* gt_row_sum_dbl for two values at once (one pair of barriers for both); `sh` holds 32 double2. */
__device__ __forceinline__ double2 gt_row_sum2_dbl(double a, double b, double2 *sh)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        a += __shfl_xor_sync(0xffffffffu, a, o);
        b += __shfl_xor_sync(0xffffffffu, b, o);
    }
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = make_double2(a, b);
    __syncthreads();
    double2 t = make_double2(0.0, 0.0);
    for (unsigned k = 0; k < (blockDim.x >> 5); k++) {
        t.x += sh[k].x;
        t.y += sh[k].y;
    }
    __syncthreads();
    return t;
}

/* ---------------------------------------------------------------- rms_norm fast paths */

/* Forward: block per row (grid-stride), thread t owns columns [8t, 8t + 8) of a row of d. */
__global__ void __launch_bounds__(1024)
    gt_k_rms_fwd8(int64_t rows, int64_t d, double eps, const void *x, int dxt, const void *w,
                  int dwt, void *out, int dout)
{
    __shared__ double sh[32];
    int64_t j = (int64_t)threadIdx.x * 8;
    bool act = j < d;
    float wv[8] = {0}, xv[8] = {0};
    if (act) gt_ld8(w, dwt, j, wv);
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        double ss = 0.0;
        if (act) {
            gt_ld8(x, dxt, r * d + j, xv);
#pragma unroll
            for (int k = 0; k < 8; k++)
                ss += (double)xv[k] * xv[k];
        }
        ss = gt_row_sum_dbl(ss, sh);
        float sf = (float)(1.0 / sqrt(ss / (double)d + eps));
        if (act) {
            float y[8];
#pragma unroll
            for (int k = 0; k < 8; k++)
                y[k] = __fmul_rn(__fmul_rn(xv[k], sf), wv[k]);
            gt_st8(out, dout, r * d + j, y);
        }
    }
}

/* Backward: block c handles rows [c * chunk, (c + 1) * chunk) in order, prefetching the next row
 * while it reduces the current one; partial[c * d + col] = sum over those rows of dy * xhat.
 * The row's two sums, sum x^2 and sum w dy x, go through one block reduction: with
 * s = rsqrt(mean x^2 + eps), mean(w dy xhat) = s * sum(w dy x) / d. The per-row barrier pairs are
 * what bound this kernel (a block works through its rows one after another). */
__global__ void __launch_bounds__(GT_RMS_BWD_THREADS)
    gt_k_rms_bwd8(int64_t rows, int64_t d, int64_t chunk, double eps, const void *x, int dxt,
                  const void *w, int dwt, const void *dy, int ddy, void *dx, int ddx,
                  double *partial)
{
    __shared__ double2 sh[32];
    int64_t j = (int64_t)threadIdx.x * 8, r0 = (int64_t)blockIdx.x * chunk;
    int64_t r1 = r0 + chunk < rows ? r0 + chunk : rows;
    bool act = j < d;
    float xv[8] = {0}, gv[8] = {0};
    double acc[8] = {0};
    if (act) {
        gt_ld8(x, dxt, r0 * d + j, xv);
        gt_ld8(dy, ddy, r0 * d + j, gv);
    }
    for (int64_t r = r0; r < r1; r++) {
        float xn[8] = {0}, gn[8] = {0};
        if (act && r + 1 < r1) {
            gt_ld8(x, dxt, (r + 1) * d + j, xn);
            gt_ld8(dy, ddy, (r + 1) * d + j, gn);
        }
        /* w is re-read per row (an L1 hit) rather than held: registers set the occupancy. */
        float wv[8] = {0};
        if (act) gt_ld8(w, dwt, j, wv);
        double ss = 0.0, dot = 0.0;
#pragma unroll
        for (int k = 0; k < 8; k++) {
            ss += (double)xv[k] * xv[k];
            dot += (double)wv[k] * gv[k] * xv[k];
        }
        double2 t = gt_row_sum2_dbl(ss, dot, sh);
        double s = 1.0 / sqrt(t.x / (double)d + eps);
        double mean = s * t.y / (double)d;
#pragma unroll
        for (int k = 0; k < 8; k++)
            acc[k] += gv[k] * ((double)xv[k] * s);
        if (act) {
            float o[8];
#pragma unroll
            for (int k = 0; k < 8; k++)
                o[k] = (float)(s * ((double)wv[k] * gv[k] - (double)xv[k] * s * mean));
            gt_st8(dx, ddx, r * d + j, o);
        }
#pragma unroll
        for (int k = 0; k < 8; k++)
            xv[k] = xn[k], gv[k] = gn[k];
    }
    if (act)
        for (int k = 0; k < 8; k++)
            partial[blockIdx.x * d + j + k] = acc[k];
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

/* The fast paths need whole 16-byte groups: d % 8 == 0, one thread per 8 columns (<= max_t), and
 * every tensor 16-byte aligned. Returns the block size, or 0 for the generic kernels. */
static unsigned gt_rms_fast_threads(int64_t d, const gt_tensor *const *ts, int n, int64_t max_t)
{
    if (d <= 0 || d % 8 != 0 || d / 8 > max_t) return 0;
    for (int k = 0; k < n; k++)
        if (((uintptr_t)ts[k]->data & 15u) != 0) return 0;
    unsigned t = 32;
    while ((int64_t)t * 8 < d)
        t *= 2;
    return t;
}

/* mode 0: forward (y); mode 1: backward (dx, and r per row into rs). */
__global__ void __launch_bounds__(GT_CUDA_THREADS)
    gt_k_rms_rows(int mode, int64_t rows, int64_t d, double eps, const void *x, int dxt,
                  const void *w, int dwt, const void *dy, int ddy, void *out, int dout, double *rs)
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
            dot += (double)gt_ld(w, dwt, j) * gt_ld(dy, ddy, base + j) * xhat;
        }
        double mean = gt_block_sum(dot, sh) / (double)d;
        for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
            double xv = gt_ld(x, dxt, base + j);
            double gv = (double)gt_ld(w, dwt, j) * gt_ld(dy, ddy, base + j);
            gt_st(out, dout, base + j, (float)(s * (gv - xv * s * mean)));
        }
        if (threadIdx.x == 0) rs[r] = s;
    }
}

/* partial[c * d + j] = sum over rows of chunk c, in order, of dy * x * r. */
__global__ void gt_k_rms_dw_partial(int64_t rows, int64_t d, int64_t chunks, const void *x, int dxt,
                                    const void *dy, int ddy, const double *rs, double *partial)
{
    GT_GRID_STRIDE(i, chunks * d)
    {
        int64_t c = i / d, j = i - c * d, r1 = (c + 1) * GT_NORM_CHUNK;
        double acc = 0.0;
        for (int64_t r = c * GT_NORM_CHUNK; r < r1 && r < rows; r++)
            acc += (double)gt_ld(dy, ddy, r * d + j) * ((double)gt_ld(x, dxt, r * d + j) * rs[r]);
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
    unsigned nt = gt_rms_fast_threads(d, ts, 3, 1024);
    if (nt > 0) {
        gt_k_rms_fwd8<<<(unsigned)(rows < (1 << 20) ? rows : (1 << 20)), nt, 0, s->stream>>>(
            rows, d, c->f[0], x->data, x->dtype, w->data, w->dtype, y->data, y->dtype);
        return gt_cuda_launched(c, err);
    }
    gt_k_rms_rows<<<(unsigned)(rows < 65536 ? rows : 65536), GT_CUDA_THREADS, 0, s->stream>>>(
        0, rows, d, c->f[0], x->data, x->dtype, w->data, w->dtype, NULL, 0, y->data, y->dtype,
        NULL);
    return gt_cuda_launched(c, err);
}

gt_status gt_cuda_rms_norm_backward(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    const gt_tensor *x = c->in[0], *w = c->in[1], *dy = c->in[2];
    gt_tensor *dx = c->out[0], *dw = c->out[1];
    int64_t d = 0, rows = 0;
    GT_TRY(gt_cuda_norm_shapes(c, x, w, &d, &rows, err));
    GT_TRY(gt_kernel_want_float(c, dy, "dy", err));
    GT_TRY(gt_kernel_want_float(c, dx, "dx", err));
    GT_TRY(gt_kernel_want_float(c, dw, "dw", err));
    GT_TRY(gt_kernel_want_same_shape(c, x, "x", dy, "dy", err));
    GT_TRY(gt_kernel_want_same_shape(c, x, "x", dx, "dx", err));
    GT_TRY(gt_kernel_want_same_shape(c, w, "w", dw, "dw", err));
    if (d == 0) return GT_OK;
    const gt_tensor *ts[5] = {x, w, dy, dx, dw};
    unsigned nt = gt_rms_fast_threads(d, ts, 5, GT_RMS_BWD_THREADS);
    if (nt > 0 && rows > 0) {
        /* At most GT_RMS_CHUNKS chunks: enough blocks to fill the GPU, few partials to add. */
        int64_t chunk = (rows + GT_RMS_CHUNKS - 1) / GT_RMS_CHUNKS;
        int64_t nch = (rows + chunk - 1) / chunk;
        void *scr;
        GT_TRY(gt_cuda_scratch(s, c, (size_t)(nch * d) * sizeof(double), &scr, err));
        gt_k_rms_bwd8<<<(unsigned)nch, nt, 0, s->stream>>>(
            rows, d, chunk, c->f[0], x->data, x->dtype, w->data, w->dtype, dy->data, dy->dtype,
            dx->data, dx->dtype, (double *)scr);
        GT_TRY(gt_cuda_launched(c, err));
        gt_k_rms_dw_sum<<<(unsigned)((d + 31) / 32), 1024, 0, s->stream>>>(
            d, nch, (const double *)scr, dw->data, dw->dtype);
        return gt_cuda_launched(c, err);
    }
    int64_t chunks = (rows + GT_NORM_CHUNK - 1) / GT_NORM_CHUNK;
    size_t rb = ((size_t)rows * sizeof(double) + 255) & ~(size_t)255;
    void *scr;
    GT_TRY(gt_cuda_scratch(s, c, rb + (size_t)(chunks * d) * sizeof(double) + 8, &scr, err));
    double *rs = (double *)scr, *partial = (double *)((char *)scr + rb);
    if (rows > 0) {
        gt_k_rms_rows<<<(unsigned)(rows < 65536 ? rows : 65536), GT_CUDA_THREADS, 0, s->stream>>>(
            1, rows, d, c->f[0], x->data, x->dtype, w->data, w->dtype, dy->data, dy->dtype,
            dx->data, dx->dtype, rs);
        GT_TRY(gt_cuda_launched(c, err));
        gt_k_rms_dw_partial<<<gt_cuda_blocks(chunks * d), GT_CUDA_THREADS, 0, s->stream>>>(
            rows, d, chunks, x->data, x->dtype, dy->data, dy->dtype, rs, partial);
        GT_TRY(gt_cuda_launched(c, err));
    }
    gt_k_rms_dw_finish<<<gt_cuda_blocks(d), GT_CUDA_THREADS, 0, s->stream>>>(d, chunks, partial,
                                                                             dw->data, dw->dtype);
    return gt_cuda_launched(c, err);
}

/* ---------------------------------------------------------------- rope */

typedef struct {
    float inv[GT_ROPE_MAX_HALF];
} gt_rope_freqs;

/* x viewed as [nbs = b * s, h, 2 * half]. Block k covers rows [k * npos, (k + 1) * npos): it
 * builds their cos/sin table tab[q][j] = (cos, sign * sin) in shared memory, then each item
 * (row, head, group of V pairs) reads both halves of its pairs before writing them, so out may
 * alias x. */
template <int V>
__global__ void __launch_bounds__(GT_CUDA_THREADS)
    gt_k_rope(int64_t nbs, int64_t s, int64_t h, int64_t half, int npos, float sign,
              gt_rope_freqs f, const void *x, int dxt, void *out, int dout)
{
    extern __shared__ float tab[];
    int64_t bp0 = (int64_t)blockIdx.x * npos;
    for (int64_t t = threadIdx.x; t < npos * half; t += blockDim.x) {
        int64_t q = t / half, j = t - q * half;
        float angle = __fmul_rn((float)((bp0 + q) % s), f.inv[j]);
        tab[2 * t] = (float)cos((double)angle);
        tab[2 * t + 1] = sign * (float)sin((double)angle);
    }
    __syncthreads();
    int64_t groups = half / V, per_row = h * groups;
    for (int64_t t = threadIdx.x; t < npos * per_row; t += blockDim.x) {
        int64_t q = t / per_row, rem = t - q * per_row, hd = rem / groups;
        int64_t j = (rem - hd * groups) * V;
        if (bp0 + q >= nbs) break; /* t grows with q: the rest are past the end too */
        int64_t base = ((bp0 + q) * h + hd) * 2 * half;
        const float *cs = tab + 2 * (q * half + j);
        float x1[V], x2[V], y1[V], y2[V];
        gt_ldv<V>(x, dxt, base + j, x1);
        gt_ldv<V>(x, dxt, base + half + j, x2);
#pragma unroll
        for (int k = 0; k < V; k++) {
            float co = cs[2 * k], si = cs[2 * k + 1];
            y1[k] = __fsub_rn(__fmul_rn(x1[k], co), __fmul_rn(x2[k], si));
            y2[k] = __fadd_rn(__fmul_rn(x2[k], co), __fmul_rn(x1[k], si));
        }
        gt_stv<V>(out, dout, base + j, y1);
        gt_stv<V>(out, dout, base + half + j, y2);
    }
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
    if (gt_tensor_numel(x) == 0) return GT_OK;
    gt_rope_freqs f;
    memset(&f, 0, sizeof f);
    gt_rope_inv_freq(c, d, f.inv); /* host f32, as the CPU kernel */
    bool vec =
        half % 8 == 0 && ((uintptr_t)x->data & 15u) == 0 && ((uintptr_t)out->data & 15u) == 0;
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
    if (vec)
        gt_k_rope<8><<<(unsigned)blocks, GT_CUDA_THREADS, smem, s->stream>>>(
            nbs, x->shape[1], x->shape[2], half, (int)npos, sign, f, x->data, x->dtype, out->data,
            out->dtype);
    else
        gt_k_rope<1><<<(unsigned)blocks, GT_CUDA_THREADS, smem, s->stream>>>(
            nbs, x->shape[1], x->shape[2], half, (int)npos, sign, f, x->data, x->dtype, out->data,
            out->dtype);
    return gt_cuda_launched(c, err);
}
