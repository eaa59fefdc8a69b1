/* cpu_elementwise.c — f32 elementwise kernels: add sub mul div (numpy broadcasting), the unary
 * functions, scale, add_scalar and silu_backward.
 *
 * Each element is computed independently in f32 (no accumulation), so results are identical
 * run to run and do not depend on how the index space is walked. Scalars from attributes are
 * rounded to f32 first, as torch does for a float tensor times a Python float. */
#include "cpu_internal.h"

#include <math.h>

/* sigmoid(x) = 1 / (1 + e^-x); for x -> -inf, e^-x -> inf and the quotient -> 0 without NaN. */
static inline float gt_cpu_sigmoidf(float x)
{
    return 1.0f / (1.0f + gt_cpu_expf(-x));
}

/* One innermost row of a binary op: out[j] = a[j*sa] (op) b[j*sb]. The switch sits outside the
 * loops so each loop is a plain strided kernel; inlined into the two callers below. */
static inline __attribute__((always_inline)) void gt_cpu_binary_loop(gt_op op, int64_t n,
                                                                     const float *a, int64_t sa,
                                                                     const float *b, int64_t sb,
                                                                     float *out)
{
    switch (op) {
    case GT_OP_ADD:
        for (int64_t j = 0; j < n; j++)
            out[j] = a[j * sa] + b[j * sb];
        break;
    case GT_OP_SUB:
        for (int64_t j = 0; j < n; j++)
            out[j] = a[j * sa] - b[j * sb];
        break;
    case GT_OP_MUL:
        for (int64_t j = 0; j < n; j++)
            out[j] = a[j * sa] * b[j * sb];
        break;
    case GT_OP_DIV:
        for (int64_t j = 0; j < n; j++)
            out[j] = a[j * sa] / b[j * sb];
        break;
    case GT_OP_SILU_BACKWARD:
        /* d/dx [x * s(x)] = s + x * s * (1 - s) = s * (1 + x * (1 - s)); a = x, b = dy. */
        for (int64_t j = 0; j < n; j++) {
            float x = a[j * sa], s = gt_cpu_sigmoidf(x);
            out[j] = b[j * sb] * s * (1.0f + x * (1.0f - s));
        }
        break;
    default:
        GT_CHECK(!"gt_cpu_binary_row: not a binary op");
    }
}

/* Rows with no broadcast in the innermost dim (the common case), compiled with unit strides so
 * the loops vectorize (GT_CPU_ELEMENT_LOOP: the same bits at any width). */
GT_CPU_ELEMENT_LOOP static void gt_cpu_binary_dense(gt_op op, int64_t n, const float *a,
                                                    const float *b, float *out)
{
    gt_cpu_binary_loop(op, n, a, 1, b, 1, out);
}

/* silu_backward's dense row given e = exp(-x): the operations of gt_cpu_binary_loop's, in order. */
GT_CPU_ELEMENT_LOOP static void gt_cpu_silu_backward_finish(int64_t n, const float *x,
                                                            const float *dy, const float *e,
                                                            float *out)
{
    for (int64_t j = 0; j < n; j++) {
        float s = 1.0f / (1.0f + e[j]);
        out[j] = dy[j] * s * (1.0f + x[j] * (1.0f - s));
    }
}

static void gt_cpu_binary_row(gt_op op, int64_t n, const float *a, int64_t sa, const float *b,
                              int64_t sb, float *out)
{
    if (sa == 1 && sb == 1 && op == GT_OP_SILU_BACKWARD) {
        float e[256]; /* the exps of a chunk (vectorized), then the rest of the formula */
        for (int64_t i = 0; i < n; i += 256) {
            int64_t m = n - i < 256 ? n - i : 256;
            gt_cpu_exp_n(a + i, e, m, -1.0f, 0.0f);
            gt_cpu_silu_backward_finish(m, a + i, b + i, e, out + i);
        }
    } else if (sa == 1 && sb == 1) {
        gt_cpu_binary_dense(op, n, a, b, out);
    } else {
        gt_cpu_binary_loop(op, n, a, sa, b, sb, out);
    }
}

static gt_status gt_cpu_binary(const gt_kernel_call *c, gt_error *err)
{
    const gt_tensor *a = c->in[0], *b = c->in[1];
    gt_tensor *out = c->out[0];
    GT_TRY(gt_cpu_want_f32(c, a, "input 0", err));
    GT_TRY(gt_cpu_want_f32(c, b, "input 1", err));
    GT_TRY(gt_cpu_want_f32(c, out, "output", err));
    int64_t sa[GT_MAX_DIMS], sb[GT_MAX_DIMS], so[GT_MAX_DIMS];
    int rank = a->ndim > b->ndim ? a->ndim : b->ndim;
    if (out->ndim != rank ||
        !gt_cpu_broadcast_strides(out->ndim, out->shape, a->ndim, a->shape, sa) ||
        !gt_cpu_broadcast_strides(out->ndim, out->shape, b->ndim, b->shape, sb)) {
        char ba[128], bb[128], bo[128];
        return gt_error_set(err, GT_ERR_SHAPE, "%s: %s and %s do not broadcast to output %s",
                            gt_kernel_op_name(c->op), gt_kernel_fmt(a, ba, sizeof ba),
                            gt_kernel_fmt(b, bb, sizeof bb), gt_kernel_fmt(out, bo, sizeof bo));
    }
    gt_kernel_contig_strides(out->ndim, out->shape, so);
    const int64_t *strides[3] = {sa, sb, so};
    gt_cpu_iter it;
    gt_cpu_iter_init(&it, out->ndim, out->shape, 3, strides);
    const float *ap = a->data, *bp = b->data;
    float *op = out->data;
    for (int64_t r = 0; r < it.rows; r++) {
        gt_cpu_binary_row(c->op, it.len, ap + it.off[0], it.inner[0], bp + it.off[1], it.inner[1],
                          op + it.off[2]);
        gt_cpu_iter_next(&it);
    }
    return GT_OK;
}

gt_status gt_cpu_add(const gt_kernel_call *c, gt_error *err)
{
    return gt_cpu_binary(c, err);
}
gt_status gt_cpu_sub(const gt_kernel_call *c, gt_error *err)
{
    return gt_cpu_binary(c, err);
}
gt_status gt_cpu_mul(const gt_kernel_call *c, gt_error *err)
{
    return gt_cpu_binary(c, err);
}
gt_status gt_cpu_div(const gt_kernel_call *c, gt_error *err)
{
    return gt_cpu_binary(c, err);
}
gt_status gt_cpu_silu_backward(const gt_kernel_call *c, gt_error *err)
{
    return gt_cpu_binary(c, err);
}

/* y = x * sigmoid(x) (silu) or y = sigmoid(x) over n elements (in place is fine), in chunks:
 * the expf calls first, then the divisions and products in a loop the compiler vectorizes. The
 * same operations in the same order as gt_cpu_sigmoidf element by element. */
GT_CPU_ELEMENT_LOOP static void gt_cpu_sigmoid_finish(int64_t n, const float *x, const float *e,
                                                      float *y, bool times_x)
{
    if (times_x) {
        for (int64_t k = 0; k < n; k++)
            y[k] = x[k] * (1.0f / (1.0f + e[k]));
    } else {
        for (int64_t k = 0; k < n; k++)
            y[k] = 1.0f / (1.0f + e[k]);
    }
}

static void gt_cpu_sigmoid_rows(int64_t n, const float *x, float *y, bool times_x)
{
    float e[256];
    for (int64_t i = 0; i < n; i += 256) {
        int64_t m = n - i < 256 ? n - i : 256;
        gt_cpu_exp_n(x + i, e, m, -1.0f, 0.0f);
        gt_cpu_sigmoid_finish(m, x + i, e, y + i, times_x);
    }
}

/* Unary ops over a flat array (input and output have the same shape; in place is fine). */
static gt_status gt_cpu_unary(const gt_kernel_call *c, gt_error *err)
{
    const gt_tensor *x = c->in[0];
    gt_tensor *out = c->out[0];
    GT_TRY(gt_cpu_want_f32(c, x, "input", err));
    GT_TRY(gt_cpu_want_f32(c, out, "output", err));
    GT_TRY(gt_kernel_want_same_shape(c, x, "input", out, "output", err));
    int64_t n = gt_tensor_numel(x);
    const float *xp = x->data;
    float *y = out->data;
    switch (c->op) {
    case GT_OP_NEG:
        for (int64_t i = 0; i < n; i++)
            y[i] = -xp[i];
        break;
    case GT_OP_EXP:
        gt_cpu_exp_n(xp, y, n, 1.0f, 0.0f);
        break;
    case GT_OP_LOG:
        for (int64_t i = 0; i < n; i++)
            y[i] = logf(xp[i]);
        break;
    case GT_OP_SQRT:
        for (int64_t i = 0; i < n; i++)
            y[i] = sqrtf(xp[i]);
        break;
    case GT_OP_RSQRT:
        for (int64_t i = 0; i < n; i++)
            y[i] = 1.0f / sqrtf(xp[i]);
        break;
    case GT_OP_SILU:
        gt_cpu_sigmoid_rows(n, xp, y, true);
        break;
    case GT_OP_SIGMOID:
        gt_cpu_sigmoid_rows(n, xp, y, false);
        break;
    case GT_OP_SCALE: {
        GT_TRY(gt_kernel_want_attrs(c, 0, 1, 0, err));
        float alpha = (float)c->f[0];
        for (int64_t i = 0; i < n; i++)
            y[i] = alpha * xp[i];
        break;
    }
    case GT_OP_ADD_SCALAR: {
        GT_TRY(gt_kernel_want_attrs(c, 0, 1, 0, err));
        float v = (float)c->f[0];
        for (int64_t i = 0; i < n; i++)
            y[i] = xp[i] + v;
        break;
    }
    default:
        GT_CHECK(!"gt_cpu_unary: not a unary op");
    }
    return GT_OK;
}

gt_status gt_cpu_neg(const gt_kernel_call *c, gt_error *err)
{
    return gt_cpu_unary(c, err);
}
gt_status gt_cpu_exp(const gt_kernel_call *c, gt_error *err)
{
    return gt_cpu_unary(c, err);
}
gt_status gt_cpu_log(const gt_kernel_call *c, gt_error *err)
{
    return gt_cpu_unary(c, err);
}
gt_status gt_cpu_sqrt(const gt_kernel_call *c, gt_error *err)
{
    return gt_cpu_unary(c, err);
}
gt_status gt_cpu_rsqrt(const gt_kernel_call *c, gt_error *err)
{
    return gt_cpu_unary(c, err);
}
gt_status gt_cpu_silu(const gt_kernel_call *c, gt_error *err)
{
    return gt_cpu_unary(c, err);
}
gt_status gt_cpu_sigmoid(const gt_kernel_call *c, gt_error *err)
{
    return gt_cpu_unary(c, err);
}
gt_status gt_cpu_scale(const gt_kernel_call *c, gt_error *err)
{
    return gt_cpu_unary(c, err);
}
gt_status gt_cpu_add_scalar(const gt_kernel_call *c, gt_error *err)
{
    return gt_cpu_unary(c, err);
}
