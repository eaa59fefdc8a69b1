/* cpu_norm_rope.c — rms_norm, rms_norm_backward and rope.
 *
 * rms_norm over the last dim D, per row:  r = 1/sqrt(mean(x^2) + eps),  y = (x * r) * w
 * (the order Hugging Face's LlamaRMSNorm rounds in). mean(x^2) accumulates in double: rows are
 * long (D up to 16k) and it sets the scale of every output.
 *
 * Backward, with xhat = x * r and g = w * dy, all in double (for short rows g - xhat * mean
 * cancels: with D = 1 it is g * eps / (x^2 + eps), which f32 would lose entirely):
 *   dx = r * (g - xhat * mean(g * xhat))
 *   dw = sum over rows of dy * xhat           (one accumulator per column, rows in order)
 *
 * Threads (gt_cpu_parallel_for, blocks fixed by the shape): the norms and rope by blocks of rows,
 * each row computed alone; dw by blocks of columns, each column summing its rows in order. So the
 * bits are the same on any thread count. */
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

typedef struct {
    int64_t d, rows;
    double eps;
    const float *x, *w, *dy;
    float *y;  /* rms_norm's output, rms_norm_backward's dx */
    double *s; /* rms_norm_backward: each row's scale */
    float *dw;
} gt_cpu_norm_call;

static void gt_cpu_rms_norm_rows(int64_t lo, int64_t hi, void *user)
{
    const gt_cpu_norm_call *n = user;
    int64_t d = n->d;
    const float *wp = n->w;
    for (int64_t r = lo; r < hi; r++) {
        const float *xr = n->x + r * d;
        float *yr = n->y + r * d;
        float s = (float)gt_cpu_rms_scale(xr, d, n->eps);
        for (int64_t j = 0; j < d; j++)
            yr[j] = (xr[j] * s) * wp[j];
    }
}

/* rms_norm_backward's rows [lo, hi): their scales and dx. */
static void gt_cpu_rms_norm_bwd_rows(int64_t lo, int64_t hi, void *user)
{
    const gt_cpu_norm_call *n = user;
    int64_t d = n->d;
    const float *wp = n->w;
    for (int64_t r = lo; r < hi; r++) {
        const float *xr = n->x + r * d;
        const float *gr = n->dy + r * d;
        float *dxr = n->y + r * d;
        double s = gt_cpu_rms_scale(xr, d, n->eps), dot = 0.0;
        for (int64_t j = 0; j < d; j++) {
            double xhat = xr[j] * s;
            dot += (double)wp[j] * gr[j] * xhat;
        }
        n->s[r] = s;
        double mean = dot / (double)d;
        for (int64_t j = 0; j < d; j++)
            dxr[j] = (float)(s * ((double)wp[j] * gr[j] - xr[j] * s * mean));
    }
}

/* rms_norm_backward's dw columns [lo, hi): each sums its rows in order, in double. */
static void gt_cpu_rms_norm_bwd_cols(int64_t lo, int64_t hi, void *user)
{
    const gt_cpu_norm_call *n = user;
    int64_t d = n->d;
    double acc[64];
    for (int64_t j0 = lo; j0 < hi; j0 += 64) {
        int64_t m = hi - j0 < 64 ? hi - j0 : 64;
        for (int64_t j = 0; j < m; j++)
            acc[j] = 0.0;
        for (int64_t r = 0; r < n->rows; r++) {
            const float *xr = n->x + r * d + j0;
            const float *gr = n->dy + r * d + j0;
            double s = n->s[r];
            for (int64_t j = 0; j < m; j++) {
                double xhat = xr[j] * s;
                acc[j] += gr[j] * xhat;
            }
        }
        for (int64_t j = 0; j < m; j++)
            n->dw[j0 + j] = (float)acc[j];
    }
}

/* rms_norm_backward on one thread in one pass over the rows: dx as gt_cpu_rms_norm_bwd_rows and
 * dw as gt_cpu_rms_norm_bwd_cols compute them, each element by the same operations in the same
 * order (so the bits of any thread count), without reading x and dy a second time. */
static void gt_cpu_rms_norm_bwd_serial(const gt_cpu_norm_call *n)
{
    int64_t d = n->d;
    const float *wp = n->w;
    double *acc = n->s; /* d doubles: the caller sized s for max(rows, d) */
    for (int64_t j = 0; j < d; j++)
        acc[j] = 0.0;
    for (int64_t r = 0; r < n->rows; r++) {
        const float *xr = n->x + r * d;
        const float *gr = n->dy + r * d;
        float *dxr = n->y + r * d;
        double s = gt_cpu_rms_scale(xr, d, n->eps), dot = 0.0;
        for (int64_t j = 0; j < d; j++) {
            double xhat = xr[j] * s;
            dot += (double)wp[j] * gr[j] * xhat;
            acc[j] += gr[j] * xhat;
        }
        double mean = dot / (double)d;
        for (int64_t j = 0; j < d; j++)
            dxr[j] = (float)(s * ((double)wp[j] * gr[j] - xr[j] * s * mean));
    }
    for (int64_t j = 0; j < d; j++)
        n->dw[j] = (float)acc[j];
}

gt_status gt_cpu_rms_norm(const gt_kernel_call *c, gt_error *err)
{
    const gt_tensor *x = c->in[0], *w = c->in[1];
    gt_tensor *y = c->out[0];
    int64_t d, rows;
    GT_TRY(gt_cpu_norm_shapes(c, x, w, &d, &rows, err));
    GT_TRY(gt_cpu_want_f32(c, y, "output", err));
    GT_TRY(gt_kernel_want_same_shape(c, x, "x", y, "output", err));
    gt_cpu_norm_call n = {.d = d, .eps = c->f[0], .x = x->data, .w = w->data, .y = y->data};
    gt_cpu_parallel_for(rows, gt_cpu_grain_of(d), gt_cpu_rms_norm_rows, &n);
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
    int64_t ns = rows > d ? rows : d; /* the rows' scales, or the one-pass dw accumulators */
    double *s = malloc(ns > 0 ? (size_t)ns * sizeof *s : 1);
    if (!s)
        return gt_error_set(err, GT_ERR_NOMEM, "rms_norm_backward: out of memory for %lld doubles",
                            (long long)ns);
    gt_cpu_norm_call n = {.d = d,
                          .rows = rows,
                          .eps = c->f[0],
                          .x = x->data,
                          .w = w->data,
                          .dy = dy->data,
                          .y = dx->data,
                          .s = s,
                          .dw = dw->data};
    if (gt_cpu_threads() <= 1) { /* one pass: the same operations per element, ~12 % faster */
        gt_cpu_rms_norm_bwd_serial(&n);
        free(s);
        return GT_OK;
    }
    gt_cpu_parallel_for(rows, gt_cpu_grain_of(d), gt_cpu_rms_norm_bwd_rows, &n);
    /* columns in blocks of 64 (a multiple of every block but the last) */
    int64_t cols = rows > 0 ? gt_cpu_grain_of(rows) : d;
    cols = cols < 64 ? 64 : (cols + 63) / 64 * 64;
    gt_cpu_parallel_for(d, cols, gt_cpu_rms_norm_bwd_cols, &n);
    free(s);
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

typedef struct {
    int64_t half, h, s, d, i1, step;
    float sign;
    const float *inv;
    float *cs;
    const int64_t *pos;
    const float *x;
    float *y;
} gt_cpu_rope_call;

/* Positions [lo, hi) of the cos/sin table [rows, d/2]: angle = f32(p) * inv_freq_j rounded to f32,
 * as HF's inv_freq @ position_ids (bit-identical angles, checked against transformers). cos and
 * sin of that f32 angle are taken in double and rounded once — correctly rounded in practice,
 * which neither glibc's cosf nor torch's vectorized cos always is (both are within 1 ulp). The
 * inverse rotation uses -angle: same cos, negated sin. */
static void gt_cpu_rope_table(int64_t lo, int64_t hi, void *user)
{
    const gt_cpu_rope_call *r = user;
    int64_t half = r->half;
    for (int64_t p = lo; p < hi; p++) {
        for (int64_t j = 0; j < half; j++) {
            float angle = (float)p * r->inv[j];
            r->cs[2 * (p * half + j)] = (float)cos((double)angle);
            r->cs[2 * (p * half + j) + 1] = r->sign * (float)sin((double)angle);
        }
    }
}

/* Tokens [lo, hi) (of b * s), every head of each.
 * Half rotation: out[j] = x[j] cos - x[j + d/2] sin;  out[j + d/2] = x[j + d/2] cos + x[j] sin.
 * Interleaved, the pair (j, j + d/2) is (2j, 2j + 1) instead (a complex multiply, as
 * torchtitan's complex RoPE). Reads of a pair finish before its writes, so out may alias x. */
static void gt_cpu_rope_rows(int64_t lo, int64_t hi, void *user)
{
    const gt_cpu_rope_call *r = user;
    int64_t half = r->half, h = r->h, d = r->d, i1 = r->i1, step = r->step;
    for (int64_t bp = lo; bp < hi; bp++) {
        int64_t p = bp % r->s;
        const float *t = r->cs + 2 * (r->pos ? r->pos[bp] : p) * half;
        for (int64_t hi_ = 0; hi_ < h; hi_++) {
            int64_t off = (bp * h + hi_) * d;
            const float *xr = r->x + off;
            float *yr = r->y + off;
            for (int64_t j = 0; j < half; j++) {
                int64_t a = j * step, b = a + i1;
                float x1 = xr[a], x2 = xr[b], co = t[2 * j], si = t[2 * j + 1];
                yr[a] = x1 * co - x2 * si;
                yr[b] = x2 * co + x1 * si;
            }
        }
    }
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
    /* the cos/sin table [rows, d/2] (gt_cpu_rope_table), then the rotation */
    float *inv = malloc((size_t)half * sizeof *inv + 1);
    float *cs = malloc((size_t)(2 * rows * half) * sizeof *cs + 1);
    if (!inv || !cs) {
        free(inv);
        free(cs);
        return gt_error_set(err, GT_ERR_NOMEM, "rope: out of memory for a %lld x %lld table",
                            (long long)rows, (long long)half);
    }
    gt_rope_inv_freq(c, d, inv);
    gt_cpu_rope_call r = {.half = half,
                          .h = h,
                          .s = s,
                          .d = d,
                          .sign = c->i[0] ? -1.0f : 1.0f,
                          .inv = inv,
                          .cs = cs,
                          .pos = pos,
                          .x = x->data,
                          .y = out->data,
                          .i1 = gt_rope_interleaved(c) ? 1 : half,
                          .step = gt_rope_interleaved(c) ? 2 : 1};
    /* a table entry (a double cos and sin) costs about 16 elements of the rotation */
    gt_cpu_parallel_for(rows, gt_cpu_grain_of(16 * half), gt_cpu_rope_table, &r);
    gt_cpu_parallel_for(b * s, gt_cpu_grain_of(h * d), gt_cpu_rope_rows, &r);
    free(inv);
    free(cs);
    return GT_OK;
}
