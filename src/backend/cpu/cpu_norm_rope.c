/* cpu_norm_rope.c — rms_norm, rms_norm_backward and rope.
 *
 * rms_norm over the last dim D, per row:  r = 1/sqrt(mean(x^2) + eps),  y = (x * r) * w
 * (the order Hugging Face's LlamaRMSNorm rounds in). mean(x^2) accumulates in double: rows are
 * long (D up to 16k) and it sets the scale of every output.
 *
 * Backward, with xhat = x * r and g = w * dy, all in double (for short rows g - xhat * mean
 * cancels: with D = 1 it is g * eps / (x^2 + eps), which f32 would lose entirely):
 *   dx = r * (g - xhat * mean(g * xhat))
 *   dw = sum over rows of dy * xhat           (one accumulator per column, rows in order) */
#include "cpu_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/rope_freqs.h" /* gt_rope_inv_freq, shared with the other backend */

/* Checks x [..., D], w [D] and returns D and the row count. */
static gt_status gt_cpu_norm_shapes(const gt_kernel_call *c, const gt_tensor *x, const gt_tensor *w,
                                    int64_t *dim, int64_t *rows, gt_error *err)
{
    GT_TRY(gt_cpu_want_f32(c, x, "x", err));
    GT_TRY(gt_cpu_want_f32(c, w, "w", err));
    GT_TRY(gt_kernel_want_attrs(c, 0, 1, 0, err));
    if (x->ndim < 1 || w->ndim != 1 || w->shape[0] != x->shape[x->ndim - 1]) {
        char bx[128], bw[128];
        return gt_error_set(err, GT_ERR_SHAPE, "%s: x %s and w %s: w must be [last dim of x]",
                            gt_kernel_op_name(c->op), gt_kernel_fmt(x, bx, sizeof bx),
                            gt_kernel_fmt(w, bw, sizeof bw));
    }
    *dim = w->shape[0];
    *rows = *dim > 0 ? gt_tensor_numel(x) / *dim : 0;
    return GT_OK;
}

/* r = 1/sqrt(mean(x^2) + eps) for one row, in double. */
static double gt_cpu_rms_scale(const float *x, int64_t d, double eps)
{
    double ss = 0.0;
    for (int64_t j = 0; j < d; j++)
        ss += (double)x[j] * x[j];
    return 1.0 / sqrt(ss / (double)d + eps);
}

gt_status gt_cpu_rms_norm(const gt_kernel_call *c, gt_error *err)
{
    const gt_tensor *x = c->in[0], *w = c->in[1];
    gt_tensor *y = c->out[0];
    int64_t d, rows;
    GT_TRY(gt_cpu_norm_shapes(c, x, w, &d, &rows, err));
    GT_TRY(gt_cpu_want_f32(c, y, "output", err));
    GT_TRY(gt_kernel_want_same_shape(c, x, "x", y, "output", err));
    const float *wp = w->data;
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = (const float *)x->data + r * d;
        float *yr = (float *)y->data + r * d;
        float s = (float)gt_cpu_rms_scale(xr, d, c->f[0]);
        for (int64_t j = 0; j < d; j++)
            yr[j] = (xr[j] * s) * wp[j];
    }
    return GT_OK;
}

/* add_rms_norm (a, b, w) -> (h, y): the add into h, then rms_norm of h into y, each through
 * gt_cpu_run_kernel on the tensors as given (a byte kernel: h is stored, rounded to its dtype,
 * before the norm reads it), so both outputs are the unfused pair's bit for bit. */
gt_status gt_cpu_add_rms_norm(const gt_kernel_call *c, gt_error *err)
{
    GT_TRY(gt_kernel_want_attrs(c, 0, 1, 0, err));
    gt_kernel_call add = {.op = GT_OP_ADD, .n_in = 2, .n_out = 1};
    add.in[0] = c->in[0];
    add.in[1] = c->in[1];
    add.out[0] = c->out[0];
    GT_TRY(gt_kernel_want_same_shape(c, c->in[0], "a", c->in[1], "b", err));
    GT_TRY(gt_cpu_run_kernel(&add, err));
    gt_kernel_call norm = {.op = GT_OP_RMS_NORM, .f = c->f, .nf = 1, .n_in = 2, .n_out = 1};
    norm.in[0] = c->out[0];
    norm.in[1] = c->in[2];
    norm.out[0] = c->out[1];
    return gt_cpu_run_kernel(&norm, err);
}

gt_status gt_cpu_rms_norm_backward(const gt_kernel_call *c, gt_error *err)
{
    const gt_tensor *x = c->in[0], *w = c->in[1], *dy = c->in[2];
    gt_tensor *dx = c->out[0], *dw = c->out[1];
    int64_t d, rows;
    GT_TRY(gt_cpu_norm_shapes(c, x, w, &d, &rows, err));
    GT_TRY(gt_cpu_want_f32(c, dy, "dy", err));
    GT_TRY(gt_cpu_want_f32(c, dx, "dx", err));
    GT_TRY(gt_cpu_want_f32(c, dw, "dw", err));
    GT_TRY(gt_kernel_want_same_shape(c, x, "x", dy, "dy", err));
    GT_TRY(gt_kernel_want_same_shape(c, x, "x", dx, "dx", err));
    GT_TRY(gt_kernel_want_same_shape(c, w, "w", dw, "dw", err));
    double *acc = calloc(d > 0 ? (size_t)d : 1, sizeof *acc);
    if (!acc)
        return gt_error_set(err, GT_ERR_NOMEM, "rms_norm_backward: out of memory for %lld doubles",
                            (long long)d);
    const float *wp = w->data;
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = (const float *)x->data + r * d;
        const float *gr = (const float *)dy->data + r * d;
        float *dxr = (float *)dx->data + r * d;
        double s = gt_cpu_rms_scale(xr, d, c->f[0]), dot = 0.0;
        for (int64_t j = 0; j < d; j++) {
            double xhat = xr[j] * s;
            dot += (double)wp[j] * gr[j] * xhat;
            acc[j] += gr[j] * xhat;
        }
        double mean = dot / (double)d;
        for (int64_t j = 0; j < d; j++)
            dxr[j] = (float)(s * ((double)wp[j] * gr[j] - xr[j] * s * mean));
    }
    float *dwp = dw->data;
    for (int64_t j = 0; j < d; j++)
        dwp[j] = (float)acc[j];
    free(acc);
    return GT_OK;
}

/* rms_norm_backward_add (x, w, r, d0[, d1[, d2]]) -> (dx, dw): the add chain dy = (d0 + d1) + d2,
 * then rms_norm_backward of dy into (g, dw), then r + g into dx, each step through
 * gt_cpu_run_kernel on tensors of x's dtype (a byte kernel: dy and g are stored, rounded to that
 * dtype, before the next step reads them), so dx and dw are the unfused ops' bit for bit. */
gt_status gt_cpu_rms_norm_backward_add(const gt_kernel_call *c, gt_error *err)
{
    static const char *const names[6] = {"x", "w", "r", "d0", "d1", "d2"};
    GT_TRY(gt_kernel_want_attrs(c, 0, 1, 0, err));
    if (c->n_in < 4 || c->n_in > 6 || c->n_out != 2)
        return gt_error_set(err, GT_ERR_INVALID,
                            "rms_norm_backward_add: expected inputs (x, w, r, d0[, d1[, d2]]) and "
                            "outputs (dx, dw), got %d and %d",
                            c->n_in, c->n_out);
    const gt_tensor *x = c->in[0];
    for (int k = 2; k < c->n_in; k++)
        GT_TRY(gt_kernel_want_same_shape(c, x, "x", c->in[k], names[k], err));
    gt_tensor dy, g;
    memset(&dy, 0, sizeof dy);
    GT_TRY(gt_tensor_alloc(&g, x->dtype, x->ndim, x->shape, err));
    gt_status st = GT_OK;
    const gt_tensor *dyp = c->in[3];
    if (c->n_in > 4) {
        st = gt_tensor_alloc(&dy, x->dtype, x->ndim, x->shape, err);
        gt_kernel_call add = {.op = GT_OP_ADD, .n_in = 2, .n_out = 1};
        add.in[0] = c->in[3];
        add.out[0] = &dy;
        for (int k = 4; k < c->n_in && st == GT_OK; k++) {
            add.in[1] = c->in[k];
            st = gt_cpu_run_kernel(&add, err);
            add.in[0] = &dy; /* elementwise: in place is safe */
        }
        dyp = &dy;
    }
    if (st == GT_OK) {
        gt_kernel_call bwd = {
            .op = GT_OP_RMS_NORM_BACKWARD, .f = c->f, .nf = 1, .n_in = 3, .n_out = 2};
        bwd.in[0] = x;
        bwd.in[1] = c->in[1];
        bwd.in[2] = dyp;
        bwd.out[0] = &g;
        bwd.out[1] = c->out[1];
        st = gt_cpu_run_kernel(&bwd, err);
    }
    if (st == GT_OK) {
        gt_kernel_call add = {.op = GT_OP_ADD, .n_in = 2, .n_out = 1};
        add.in[0] = c->in[2];
        add.in[1] = &g;
        add.out[0] = c->out[0];
        st = gt_cpu_run_kernel(&add, err);
    }
    gt_tensor_free(&g);
    gt_tensor_free(&dy);
    return st;
}

gt_status gt_cpu_rope(const gt_kernel_call *c, gt_error *err)
{
    GT_TRY(gt_kernel_want_attrs(c, 2, 4, 0, err));
    const gt_tensor *x = c->in[0];
    gt_tensor *out = c->out[0];
    GT_TRY(gt_cpu_want_f32(c, x, "x", err));
    GT_TRY(gt_cpu_want_f32(c, out, "output", err));
    GT_TRY(gt_kernel_want_rank(c, x, "x", 4, err));
    GT_TRY(gt_kernel_want_same_shape(c, x, "x", out, "output", err));
    int64_t b = x->shape[0], s = x->shape[1], h = x->shape[2], d = x->shape[3], half = d / 2;
    if (d % 2 != 0)
        return gt_error_set(err, GT_ERR_SHAPE, "rope: head dim %lld must be even", (long long)d);
    /* per-token positions (packed documents): the table then covers 0 .. their largest */
    const int64_t *pos = NULL;
    int64_t rows = s;
    if (c->n_in > 1) {
        const gt_tensor *pt = c->in[1];
        if (pt->dtype != GT_I64 || pt->ndim != 2 || pt->shape[0] != b || pt->shape[1] != s)
            return gt_error_set(err, GT_ERR_SHAPE, "rope: positions must be i64 [%lld, %lld]",
                                (long long)b, (long long)s);
        pos = pt->data;
        rows = 0;
        for (int64_t k = 0; k < b * s; k++) {
            if (pos[k] < 0 || pos[k] >= ((int64_t)1 << 40))
                return gt_error_set(err, GT_ERR_INVALID,
                                    "rope: positions[%lld, %lld] = %lld is outside [0, 2^40)",
                                    (long long)(k / s), (long long)(k % s), (long long)pos[k]);
            rows = pos[k] + 1 > rows ? pos[k] + 1 : rows;
        }
    }
    if (gt_tensor_numel(x) == 0) return GT_OK;
    /* cos/sin table [s, d/2]: angle = f32(p) * inv_freq_j rounded to f32, as HF's
     * inv_freq @ position_ids (bit-identical angles, checked against transformers). cos and sin
     * of that f32 angle are taken in double and rounded once — correctly rounded in practice,
     * which neither glibc's cosf nor torch's vectorized cos always is (both are within 1 ulp).
     * The inverse rotation uses -angle: same cos, negated sin. */
    float *inv = malloc((size_t)half * sizeof *inv + 1);
    float *cs = malloc((size_t)(2 * rows * half) * sizeof *cs + 1);
    if (!inv || !cs) {
        free(inv);
        free(cs);
        return gt_error_set(err, GT_ERR_NOMEM, "rope: out of memory for a %lld x %lld table",
                            (long long)rows, (long long)half);
    }
    gt_rope_inv_freq(c, d, inv);
    float sign = c->i[0] ? -1.0f : 1.0f;
    for (int64_t p = 0; p < rows; p++) {
        for (int64_t j = 0; j < half; j++) {
            float angle = (float)p * inv[j];
            cs[2 * (p * half + j)] = (float)cos((double)angle);
            cs[2 * (p * half + j) + 1] = sign * (float)sin((double)angle);
        }
    }
    /* Half rotation: out[j] = x[j] cos - x[j + d/2] sin;  out[j + d/2] = x[j + d/2] cos + x[j] sin.
     * Interleaved, the pair (j, j + d/2) is (2j, 2j + 1) instead (a complex multiply, as
     * torchtitan's complex RoPE). Reads of a pair finish before its writes, so out may alias x. */
    int64_t i1 = gt_rope_interleaved(c) ? 1 : half, step = gt_rope_interleaved(c) ? 2 : 1;
    for (int64_t bi = 0; bi < b; bi++) {
        for (int64_t p = 0; p < s; p++) {
            const float *t = cs + 2 * (pos ? pos[bi * s + p] : p) * half;
            for (int64_t hi = 0; hi < h; hi++) {
                int64_t off = ((bi * s + p) * h + hi) * d;
                const float *xr = (const float *)x->data + off;
                float *yr = (float *)out->data + off;
                for (int64_t j = 0; j < half; j++) {
                    int64_t a = j * step, b = a + i1;
                    float x1 = xr[a], x2 = xr[b], co = t[2 * j], si = t[2 * j + 1];
                    yr[a] = x1 * co - x2 * si;
                    yr[b] = x2 * co + x1 * si;
                }
            }
        }
    }
    free(inv);
    free(cs);
    return GT_OK;
}
