/* cuda_norm_rope.cu — rms_norm, rms_norm_backward and rope.
 *
 * rms_norm, one block per row of D:  r = 1/sqrt(mean(x^2) + eps),  y = (x * r) * w, with
 * mean(x^2) accumulated in double (fixed tree) and r rounded to f32 as cpu_norm_rope.c does.
 * Backward, per row (double, as the CPU):  dx = r * (g - xhat * mean(g * xhat)), g = w * dy.
 * dw = sum over rows of dy * xhat, without atomics: pass 1 writes r per row; pass 2 has one thread
 * per (column, chunk of GT_NORM_CHUNK rows) add its rows in order into a partial; pass 3 adds the
 * partials of each column in chunk order. The order depends only on the shape.
 *
 * rope: inv_freq is computed on the host in f32 exactly as the CPU kernel (same code path, powf),
 * passed by value; each thread forms angle = f32(p) * inv_j in f32 and cos/sin in double rounded
 * once, as the CPU does. */
#include "cuda_internal.h"

#include <math.h>
#include <string.h>

#define GT_NORM_CHUNK 64
#define GT_ROPE_MAX_HALF 512

__device__ __forceinline__ double gt_block_sum_dbl(double v, double *sh)
{
    sh[threadIdx.x] = v;
    __syncthreads();
    for (unsigned w = blockDim.x / 2; w > 0; w >>= 1) {
        if (threadIdx.x < w) sh[threadIdx.x] += sh[threadIdx.x + w];
        __syncthreads();
    }
    double r = sh[0];
    __syncthreads();
    return r;
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
        ss = gt_block_sum_dbl(ss, sh);
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
        double mean = gt_block_sum_dbl(dot, sh) / (double)d;
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
    GT_TRY(gt_cuda_want_float(c, x, "x", err));
    GT_TRY(gt_cuda_want_float(c, w, "w", err));
    GT_TRY(gt_cuda_want_attrs(c, 0, 1, 0, err));
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
    int64_t d, rows;
    GT_TRY(gt_cuda_norm_shapes(c, x, w, &d, &rows, err));
    GT_TRY(gt_cuda_want_float(c, y, "output", err));
    GT_TRY(gt_cuda_want_same_shape(c, x, "x", y, "output", err));
    if (rows == 0) return GT_OK;
    gt_k_rms_rows<<<(unsigned)(rows < 65536 ? rows : 65536), GT_CUDA_THREADS, 0, s->stream>>>(
        0, rows, d, c->f[0], x->data, x->dtype, w->data, w->dtype, NULL, 0, y->data, y->dtype,
        NULL);
    return gt_cuda_launched(c, err);
}

gt_status gt_cuda_rms_norm_backward(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    const gt_tensor *x = c->in[0], *w = c->in[1], *dy = c->in[2];
    gt_tensor *dx = c->out[0], *dw = c->out[1];
    int64_t d, rows;
    GT_TRY(gt_cuda_norm_shapes(c, x, w, &d, &rows, err));
    GT_TRY(gt_cuda_want_float(c, dy, "dy", err));
    GT_TRY(gt_cuda_want_float(c, dx, "dx", err));
    GT_TRY(gt_cuda_want_float(c, dw, "dw", err));
    GT_TRY(gt_cuda_want_same_shape(c, x, "x", dy, "dy", err));
    GT_TRY(gt_cuda_want_same_shape(c, x, "x", dx, "dx", err));
    GT_TRY(gt_cuda_want_same_shape(c, w, "w", dw, "dw", err));
    if (d == 0) return GT_OK;
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

__global__ void gt_k_rope(int64_t total, int64_t s, int64_t h, int64_t half, float sign,
                          gt_rope_freqs f, const void *x, int dxt, void *out, int dout)
{
    /* One thread per (b, p, head, j < half): reads both halves of its pair before writing, so out
     * may alias x. */
    GT_GRID_STRIDE(i, total)
    {
        int64_t j = i % half, row = i / half, p = (row / h) % s, base = row * 2 * half;
        float angle = __fmul_rn((float)p, f.inv[j]);
        float co = (float)cos((double)angle), si = sign * (float)sin((double)angle);
        float x1 = gt_ld(x, dxt, base + j), x2 = gt_ld(x, dxt, base + j + half);
        gt_st(out, dout, base + j, __fsub_rn(__fmul_rn(x1, co), __fmul_rn(x2, si)));
        gt_st(out, dout, base + j + half, __fadd_rn(__fmul_rn(x2, co), __fmul_rn(x1, si)));
    }
}

/* inv_freq exactly as cpu_norm_rope.c computes it (host f32 arithmetic). */
static void gt_cuda_rope_inv_freq(const gt_kernel_call *c, int64_t d, float *inv)
{
    int64_t half = d / 2, omp = c->i[1];
    float theta = (float)c->f[0];
    for (int64_t j = 0; j < half; j++)
        inv[j] = 1.0f / powf(theta, (float)(2 * j) / (float)d);
    if (omp <= 0) return;
    float factor = (float)c->f[1], lo = (float)c->f[2];
    float lo_wl = (float)((double)omp / c->f[2]), hi_wl = (float)((double)omp / c->f[3]);
    float hi_minus_lo = (float)(c->f[3] - c->f[2]);
    for (int64_t j = 0; j < half; j++) {
        float wavelen = (float)(2.0 * 3.14159265358979323846) / inv[j];
        if (wavelen < hi_wl) continue;
        if (wavelen > lo_wl) {
            inv[j] = inv[j] / factor;
            continue;
        }
        float sm = ((float)omp / wavelen - lo) / hi_minus_lo;
        inv[j] = (1.0f - sm) * inv[j] / factor + sm * inv[j];
    }
}

gt_status gt_cuda_rope(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    GT_TRY(gt_cuda_want_attrs(c, 2, 4, 0, err));
    const gt_tensor *x = c->in[0];
    gt_tensor *out = c->out[0];
    GT_TRY(gt_cuda_want_float(c, x, "x", err));
    GT_TRY(gt_cuda_want_float(c, out, "output", err));
    if (x->ndim != 4) return gt_cuda_shape_error(c, "x must be [b, s, h, d]", err);
    GT_TRY(gt_cuda_want_same_shape(c, x, "x", out, "output", err));
    int64_t d = x->shape[3], half = d / 2;
    if (d % 2 != 0)
        return gt_error_set(err, GT_ERR_SHAPE, "rope: head dim %lld must be even", (long long)d);
    if (half > GT_ROPE_MAX_HALF)
        return gt_error_set(err, GT_ERR_UNSUPPORTED, "rope: head dim %lld above %d", (long long)d,
                            2 * GT_ROPE_MAX_HALF);
    int64_t total = gt_tensor_numel(x) / 2;
    if (total == 0) return GT_OK;
    gt_rope_freqs f;
    memset(&f, 0, sizeof f);
    gt_cuda_rope_inv_freq(c, d, f.inv);
    gt_k_rope<<<gt_cuda_blocks(total), GT_CUDA_THREADS, 0, s->stream>>>(
        total, x->shape[1], x->shape[2], half, c->i[0] ? -1.0f : 1.0f, f, x->data, x->dtype,
        out->data, out->dtype);
    return gt_cuda_launched(c, err);
}
