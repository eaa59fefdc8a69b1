/* cuda_elementwise.cu — elementwise kernels: add sub mul div silu_backward (numpy broadcasting),
 * the unary functions, scale, add_scalar, clamp, the AdamW step, cast and full.
 *
 * Each element is computed alone in f32, so results are deterministic and independent of the
 * launch shape. Scalars from attributes are rounded to f32 first (as the CPU backend). AdamW uses
 * explicitly rounded operations (__fmul_rn etc.) and fmaf exactly where cpu_optim.c does, so that
 * nvcc's multiply-add contraction cannot change its bits: it is bitwise equal to the CPU kernel. */
#include "cuda_internal.h"

#include <math.h>
#include <string.h>

__device__ __forceinline__ float gt_sigmoidf(float x)
{
    return 1.0f / (1.0f + expf(-x));
}

/* ---------------------------------------------------------------- binary with broadcasting */

__global__ void gt_k_binary(int op, gt_cuda_index ix, int64_t n, const void *a, int da,
                            const void *b, int db, void *out, int dout)
{
    GT_GRID_STRIDE(i, n)
    {
        int64_t off[2];
        gt_index_offsets(ix, i, 2, off);
        float x = gt_ld(a, da, off[0]), y = gt_ld(b, db, off[1]), r;
        switch (op) {
        case GT_OP_ADD:
            r = x + y;
            break;
        case GT_OP_SUB:
            r = x - y;
            break;
        case GT_OP_MUL:
            r = x * y;
            break;
        case GT_OP_DIV:
            r = x / y;
            break;
        default: { /* silu_backward: dy * s * (1 + x * (1 - s)); a = x, b = dy */
            float s = gt_sigmoidf(x);
            r = __fmul_rn(__fmul_rn(y, s), __fadd_rn(1.0f, __fmul_rn(x, 1.0f - s)));
        }
        }
        gt_st(out, dout, i, r);
    }
}

static gt_status gt_cuda_binary(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    const gt_tensor *a = c->in[0], *b = c->in[1];
    gt_tensor *out = c->out[0];
    GT_TRY(gt_cuda_want_float(c, a, "input 0", err));
    GT_TRY(gt_cuda_want_float(c, b, "input 1", err));
    GT_TRY(gt_cuda_want_float(c, out, "output", err));
    gt_cuda_index ix;
    memset(&ix, 0, sizeof ix);
    int rank = a->ndim > b->ndim ? a->ndim : b->ndim;
    if (out->ndim != rank ||
        !gt_cuda_broadcast_strides(out->ndim, out->shape, a->ndim, a->shape, ix.stride[0]) ||
        !gt_cuda_broadcast_strides(out->ndim, out->shape, b->ndim, b->shape, ix.stride[1]))
        return gt_cuda_shape_error(c, "inputs do not broadcast to the output", err);
    ix.ndim = out->ndim;
    memcpy(ix.shape, out->shape, sizeof ix.shape);
    int64_t n = gt_tensor_numel(out);
    if (n == 0) return GT_OK;
    gt_k_binary<<<gt_cuda_blocks(n), GT_CUDA_THREADS, 0, s->stream>>>(
        (int)c->op, ix, n, a->data, a->dtype, b->data, b->dtype, out->data, out->dtype);
    return gt_cuda_launched(c, err);
}

#define GT_BINARY(name)                                                                            \
    gt_status gt_cuda_##name(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)            \
    {                                                                                              \
        return gt_cuda_binary(s, c, err);                                                          \
    }
GT_BINARY(add)
GT_BINARY(sub)
GT_BINARY(mul)
GT_BINARY(div)
GT_BINARY(silu_backward)

/* ---------------------------------------------------------------- unary */

__global__ void gt_k_unary(int op, int64_t n, const void *x, int dx, void *y, int dy, float a,
                           float lo, float hi)
{
    GT_GRID_STRIDE(i, n)
    {
        float v = gt_ld(x, dx, i), r;
        switch (op) {
        case GT_OP_NEG:
            r = -v;
            break;
        case GT_OP_EXP:
            r = expf(v);
            break;
        case GT_OP_LOG:
            r = logf(v);
            break;
        case GT_OP_SQRT:
            r = sqrtf(v);
            break;
        case GT_OP_RSQRT:
            r = 1.0f / sqrtf(v);
            break;
        case GT_OP_SILU:
            r = v * gt_sigmoidf(v);
            break;
        case GT_OP_SIGMOID:
            r = gt_sigmoidf(v);
            break;
        case GT_OP_SCALE:
            r = a * v;
            break;
        case GT_OP_ADD_SCALAR:
            r = v + a;
            break;
        default: /* clamp: comparisons are false for NaN, so NaN passes through */
            r = v < lo ? lo : v > hi ? hi : v;
        }
        gt_st(y, dy, i, r);
    }
}

static gt_status gt_cuda_unary(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    const gt_tensor *x = c->in[0];
    gt_tensor *out = c->out[0];
    GT_TRY(gt_cuda_want_float(c, x, "input", err));
    GT_TRY(gt_cuda_want_float(c, out, "output", err));
    GT_TRY(gt_cuda_want_same_shape(c, x, "input", out, "output", err));
    float a = 0.0f, lo = 0.0f, hi = 0.0f;
    if (c->op == GT_OP_SCALE || c->op == GT_OP_ADD_SCALAR) {
        GT_TRY(gt_cuda_want_attrs(c, 0, 1, 0, err));
        a = (float)c->f[0];
    }
    if (c->op == GT_OP_CLAMP) {
        GT_TRY(gt_cuda_want_attrs(c, 0, 2, 0, err));
        if (isnan(c->f[0]) || isnan(c->f[1]) || c->f[0] > c->f[1])
            return gt_error_set(err, GT_ERR_INVALID,
                                "clamp: bounds must satisfy min <= max, got [%g, %g]", c->f[0],
                                c->f[1]);
        lo = (float)c->f[0];
        hi = (float)c->f[1];
    }
    int64_t n = gt_tensor_numel(x);
    if (n == 0) return GT_OK;
    gt_k_unary<<<gt_cuda_blocks(n), GT_CUDA_THREADS, 0, s->stream>>>(
        (int)c->op, n, x->data, x->dtype, out->data, out->dtype, a, lo, hi);
    return gt_cuda_launched(c, err);
}

#define GT_UNARY(name)                                                                             \
    gt_status gt_cuda_##name(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)            \
    {                                                                                              \
        return gt_cuda_unary(s, c, err);                                                           \
    }
GT_UNARY(neg)
GT_UNARY(exp)
GT_UNARY(log)
GT_UNARY(sqrt)
GT_UNARY(rsqrt)
GT_UNARY(silu)
GT_UNARY(sigmoid)
GT_UNARY(scale)
GT_UNARY(add_scalar)
GT_UNARY(clamp)

/* ---------------------------------------------------------------- adamw */

/* The step's constants come from device tensors (scalars = {lr, bc1, bc2}, clip), so a captured
 * step replays with new values; each thread derives them as cpu_optim.c does: in double, rounded
 * to f32 once. Range checks of lr/bc1/bc2 cannot fail synchronously here: they are the host's
 * (gt_optim_scalars) responsibility; the hyper-parameters are checked below. */
__global__ void gt_k_adamw(int64_t n, const void *p, int dp, const void *g, int dg, const float *m,
                           const float *v, const float *scalars, const float *clipp, void *po,
                           int dpo, float *mo, float *vo, double beta1, double beta2, double eps,
                           double wd)
{
    double lr = scalars[0], bc1 = scalars[1], bc2 = scalars[2];
    float clip = clipp[0];
    float decay = (float)(1.0 - lr * wd), w1 = (float)(1.0 - beta1), b2 = (float)beta2;
    float w2 = (float)(1.0 - beta2), neg_step = (float)(-(lr / bc1));
    float bc2_sqrt = (float)sqrt(bc2), epsf = (float)eps;
    GT_GRID_STRIDE(i, n)
    {
        float pv = gt_ld(p, dp, i), gv = gt_ld(g, dg, i), mv = m[i], vv = v[i];
        gv = __fmul_rn(gv, clip);
        if (wd != 0.0) pv = __fmul_rn(pv, decay);
        float diff = __fsub_rn(gv, mv);
        mv = w1 < 0.5f ? fmaf(w1, diff, mv) : fmaf(__fsub_rn(w1, 1.0f), diff, gv);
        vv = fmaf(__fmul_rn(w2, gv), gv, __fmul_rn(vv, b2));
        float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vv), bc2_sqrt), epsf);
        gt_st(po, dpo, i, __fadd_rn(pv, __fdiv_rn(__fmul_rn(neg_step, mv), denom)));
        mo[i] = mv;
        vo[i] = vv;
    }
}

gt_status gt_cuda_adamw(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    static const char *const in_names[6] = {"param",      "grad",    "exp_avg",
                                            "exp_avg_sq", "scalars", "clip"};
    static const char *const out_names[3] = {"param'", "exp_avg'", "exp_avg_sq'"};
    GT_TRY(gt_cuda_want_attrs(c, 0, 4, 0, err));
    GT_TRY(gt_cuda_want_float(c, c->in[0], in_names[0], err));
    GT_TRY(gt_cuda_want_float(c, c->in[1], in_names[1], err));
    GT_TRY(gt_cuda_want_float(c, c->out[0], out_names[0], err));
    for (int k = 2; k < 6; k++)
        if (c->in[k]->dtype != GT_F32)
            return gt_error_set(err, GT_ERR_SHAPE, "adamw: %s is %s, expected f32", in_names[k],
                                gt_dtype_name(c->in[k]->dtype));
    for (int k = 1; k < 3; k++)
        if (c->out[k]->dtype != GT_F32)
            return gt_error_set(err, GT_ERR_SHAPE, "adamw: %s is %s, expected f32", out_names[k],
                                gt_dtype_name(c->out[k]->dtype));
    const gt_tensor *p = c->in[0];
    for (int k = 1; k < 4; k++)
        GT_TRY(gt_cuda_want_same_shape(c, p, in_names[0], c->in[k], in_names[k], err));
    for (int k = 0; k < 3; k++)
        GT_TRY(gt_cuda_want_same_shape(c, p, in_names[0], c->out[k], out_names[k], err));
    if (gt_tensor_numel(c->in[4]) != 3 || gt_tensor_numel(c->in[5]) != 1)
        return gt_error_set(err, GT_ERR_SHAPE, "adamw: scalars must have 3 elements and clip 1");
    double beta1 = c->f[0], beta2 = c->f[1], eps = c->f[2], wd = c->f[3];
    if (!(beta1 >= 0.0 && beta1 < 1.0) || !(beta2 >= 0.0 && beta2 < 1.0) || !(eps >= 0.0) ||
        !(wd >= 0.0))
        return gt_error_set(err, GT_ERR_INVALID,
                            "adamw: hyper-parameters beta1 %g, beta2 %g, eps %g, weight_decay %g "
                            "out of range",
                            beta1, beta2, eps, wd);
    int64_t n = gt_tensor_numel(p);
    if (n == 0) return GT_OK;
    gt_k_adamw<<<gt_cuda_blocks(n), GT_CUDA_THREADS, 0, s->stream>>>(
        n, p->data, p->dtype, c->in[1]->data, c->in[1]->dtype, (const float *)c->in[2]->data,
        (const float *)c->in[3]->data, (const float *)c->in[4]->data, (const float *)c->in[5]->data,
        c->out[0]->data, c->out[0]->dtype, (float *)c->out[1]->data, (float *)c->out[2]->data,
        beta1, beta2, eps, wd);
    return gt_cuda_launched(c, err);
}

/* ---------------------------------------------------------------- cast and full */

/* Float -> integer truncates toward zero and saturates, NaN -> 0; bool is v != 0 (core's
 * gt_tensor_set_f32 rules). Integer -> integer goes through int64 (i32 wraps). Anything with a
 * float goes through f32. */
__device__ __forceinline__ int64_t gt_f2i_sat(float v, int64_t lo, int64_t hi)
{
    double d = v;
    if (d != d) return 0;
    if (d <= (double)lo) return lo;
    if (d >= (double)hi) return hi;
    return (int64_t)d;
}

__global__ void gt_k_cast(int64_t n, const void *x, int dx, void *y, int dy)
{
    bool xi = dx == GT_I32 || dx == GT_I64 || dx == GT_BOOL;
    bool yi = dy == GT_I32 || dy == GT_I64 || dy == GT_BOOL;
    GT_GRID_STRIDE(i, n)
    {
        if (xi && yi) {
            int64_t v = dx == GT_I32   ? ((const int32_t *)x)[i]
                        : dx == GT_I64 ? ((const int64_t *)x)[i]
                                       : (int64_t)(((const uint8_t *)x)[i] != 0);
            if (dy == GT_I32)
                ((int32_t *)y)[i] = (int32_t)(uint32_t)(uint64_t)v;
            else if (dy == GT_I64)
                ((int64_t *)y)[i] = v;
            else
                ((uint8_t *)y)[i] = v != 0;
            continue;
        }
        float v = dx == GT_I32    ? (float)((const int32_t *)x)[i]
                  : dx == GT_I64  ? (float)((const int64_t *)x)[i]
                  : dx == GT_BOOL ? (((const uint8_t *)x)[i] ? 1.0f : 0.0f)
                                  : gt_ld(x, dx, i);
        if (dy == GT_I32)
            ((int32_t *)y)[i] = (int32_t)gt_f2i_sat(v, INT32_MIN, INT32_MAX);
        else if (dy == GT_I64)
            ((int64_t *)y)[i] = gt_f2i_sat(v, INT64_MIN, INT64_MAX);
        else if (dy == GT_BOOL)
            ((uint8_t *)y)[i] = v != 0.0f;
        else
            gt_st(y, dy, i, v);
    }
}

gt_status gt_cuda_cast(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    GT_TRY(gt_cuda_want_attrs(c, 1, 0, 0, err));
    const gt_tensor *x = c->in[0];
    gt_tensor *out = c->out[0];
    if (c->i[0] != (int64_t)out->dtype)
        return gt_error_set(err, GT_ERR_SHAPE, "cast: attribute dtype %lld but output is %s",
                            (long long)c->i[0], gt_dtype_name(out->dtype));
    GT_TRY(gt_cuda_want_same_shape(c, x, "input", out, "output", err));
    int64_t n = gt_tensor_numel(x);
    if (n == 0) return GT_OK;
    if (x->dtype == out->dtype) {
        if (x->data == out->data) return GT_OK;
        return gt_cuda_check(c,
                             cudaMemcpyAsync(out->data, x->data, gt_tensor_nbytes(x),
                                             cudaMemcpyDeviceToDevice, s->stream),
                             "copy", err);
    }
    gt_k_cast<<<gt_cuda_blocks(n), GT_CUDA_THREADS, 0, s->stream>>>(n, x->data, x->dtype, out->data,
                                                                    out->dtype);
    return gt_cuda_launched(c, err);
}

/* Replicates one element of es bytes (its bits in `w`). */
__global__ void gt_k_fill(int64_t n, int es, unsigned long long w, void *out)
{
    GT_GRID_STRIDE(i, n)
    {
        if (es == 1)
            ((uint8_t *)out)[i] = (uint8_t)w;
        else if (es == 2)
            ((uint16_t *)out)[i] = (uint16_t)w;
        else if (es == 4)
            ((uint32_t *)out)[i] = (uint32_t)w;
        else
            ((unsigned long long *)out)[i] = w;
    }
}

gt_status gt_cuda_full(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    GT_TRY(gt_cuda_want_attrs(c, 1, 1, 0, err));
    gt_tensor *out = c->out[0];
    if (c->i[0] != (int64_t)out->dtype)
        return gt_error_set(err, GT_ERR_SHAPE, "full: attribute dtype %lld but output is %s",
                            (long long)c->i[0], gt_dtype_name(out->dtype));
    bool shape_ok = c->ne == out->ndim && (c->ne == 0 || c->e);
    for (int d = 0; shape_ok && d < out->ndim; d++)
        shape_ok = c->e[d] == out->shape[d];
    if (!shape_ok) return gt_cuda_shape_error(c, "output does not match the shape attribute", err);
    int64_t n = gt_tensor_numel(out);
    if (n == 0) return GT_OK;
    /* The element's bits are made on the host exactly as cpu_cast.c makes them. */
    uint8_t bits[8] = {0};
    double v = c->f[0];
    if (out->dtype == GT_I64) {
        int64_t iv = isnan(v) ? 0 : v >= 0x1p63 ? INT64_MAX : v <= -0x1p63 ? INT64_MIN : (int64_t)v;
        memcpy(bits, &iv, sizeof iv);
    } else if (out->dtype == GT_I32) {
        int32_t iv = isnan(v)             ? 0
                     : v >= 2147483647.0  ? INT32_MAX
                     : v <= -2147483648.0 ? INT32_MIN
                                          : (int32_t)v;
        memcpy(bits, &iv, sizeof iv);
    } else if (out->dtype == GT_BOOL) {
        bits[0] = v != 0.0;
    } else {
        gt_tensor one;
        int64_t one_shape[1] = {1};
        gt_tensor_wrap(&one, out->dtype, 1, one_shape, bits);
        gt_tensor_set_f32(&one, 0, (float)v);
    }
    unsigned long long w = 0;
    memcpy(&w, bits, sizeof w); /* little endian: the element's bytes are w's low bytes */
    gt_k_fill<<<gt_cuda_blocks(n), GT_CUDA_THREADS, 0, s->stream>>>(
        n, (int)gt_dtype_size(out->dtype), w, out->data);
    return gt_cuda_launched(c, err);
}
