/* cpu_elementwise.c — f32 elementwise kernels: add sub mul div (numpy broadcasting), the unary
 * functions, scale, add_scalar and silu_backward.
 *
 * Each element is computed independently in f32 (no accumulation), so results are identical
 * run to run and do not depend on how the index space is walked: large ops go in blocks of rows or
 * elements to the backend's threads (gt_cpu_parallel_for), with the same bits on any count. Scalars
 * from attributes are rounded to f32 first, as torch does for a float tensor times a Python float.
 */
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
GT_CPU_ELEMENT_LOOP static void
gt_cpu_silu_backward_finish(int64_t n, const float *x, const float *dy, const float *e, float *out)
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

typedef struct {
    gt_op op;
    gt_cpu_iter it;
    const float *a, *b;
    float *out;
} gt_cpu_binary_call;

static void gt_cpu_binary_rows(int64_t lo, int64_t hi, void *user)
{
    const gt_cpu_binary_call *j = user;
    gt_cpu_iter it = j->it;
    gt_cpu_iter_seek(&it, lo);
    for (int64_t r = lo; r < hi; r++) {
        gt_cpu_binary_row(j->op, it.len, j->a + it.off[0], it.inner[0], j->b + it.off[1],
                          it.inner[1], j->out + it.off[2]);
        gt_cpu_iter_next(&it);
    }
}

/* Elements [lo, hi) of the single row. */
static void gt_cpu_binary_elems(int64_t lo, int64_t hi, void *user)
{
    const gt_cpu_binary_call *j = user;
    const gt_cpu_iter *it = &j->it;
    gt_cpu_binary_row(j->op, hi - lo, j->a + it->off[0] + lo * it->inner[0], it->inner[0],
                      j->b + it->off[1] + lo * it->inner[1], it->inner[1],
                      j->out + it->off[2] + lo * it->inner[2]);
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
    gt_cpu_binary_call j = {.op = c->op, .a = a->data, .b = b->data, .out = out->data};
    gt_cpu_iter_init(&j.it, out->ndim, out->shape, 3, strides);
    if (j.it.rows == 1) /* one long row (same shapes): blocks of its elements */
        gt_cpu_parallel_for(j.it.len, GT_CPU_GRAIN, gt_cpu_binary_elems, &j);
    else
        gt_cpu_parallel_for(j.it.rows, gt_cpu_grain_of(j.it.len), gt_cpu_binary_rows, &j);
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

typedef struct {
    gt_op op;
    float v; /* scale's alpha, add_scalar's value */
    const float *x;
    float *y;
} gt_cpu_unary_call;

/* Elements [lo, hi) of a unary op. */
static void gt_cpu_unary_block(int64_t lo, int64_t hi, void *user)
{
    const gt_cpu_unary_call *u = user;
    int64_t n = hi - lo;
    const float *xp = u->x + lo;
    float *y = u->y + lo;
    switch (u->op) {
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
        float alpha = u->v;
        for (int64_t i = 0; i < n; i++)
            y[i] = alpha * xp[i];
        break;
    }
    case GT_OP_ADD_SCALAR: {
        float v = u->v;
        for (int64_t i = 0; i < n; i++)
            y[i] = xp[i] + v;
        break;
    }
    default:
        GT_CHECK(!"gt_cpu_unary: not a unary op");
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
    gt_cpu_unary_call u = {.op = c->op, .x = x->data, .y = out->data};
    if (c->op == GT_OP_SCALE || c->op == GT_OP_ADD_SCALAR) {
        GT_TRY(gt_kernel_want_attrs(c, 0, 1, 0, err));
        u.v = (float)c->f[0];
    }
    gt_cpu_parallel_for(gt_tensor_numel(x), GT_CPU_GRAIN, gt_cpu_unary_block, &u);
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
