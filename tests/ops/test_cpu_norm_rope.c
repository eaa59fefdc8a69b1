/* test_cpu_norm_rope.c — CPU kernels rms_norm, rms_norm_backward (finite differences on x and w)
 * and rope (plain and llama3.1-scaled frequencies; the inverse rotation is the gradient, checked by
 * finite differences). References are double loops; forward tolerance 1e-5 relative. */
#include "test_cpu_util.h"

/* ---------------------------------------------------------------- rms_norm */

static void ref_rms_norm(const double *x, const double *w, int64_t rows, int64_t d, double eps,
                         double *y)
{
    for (int64_t r = 0; r < rows; r++) {
        double ms = 0.0;
        for (int64_t j = 0; j < d; j++)
            ms += x[r * d + j] * x[r * d + j];
        double inv = 1.0 / sqrt(ms / (double)d + eps);
        for (int64_t j = 0; j < d; j++)
            y[r * d + j] = x[r * d + j] * inv * w[j];
    }
}

typedef struct {
    double *x, *w, *dy, *y;
    int64_t rows, d;
    double eps;
} rms_ctx;

static double rms_objective(void *p)
{
    rms_ctx *c = p;
    ref_rms_norm(c->x, c->w, c->rows, c->d, c->eps, c->y);
    double l = 0.0;
    for (int64_t i = 0; i < c->rows * c->d; i++)
        l += c->dy[i] * c->y[i];
    return l;
}

static void test_rms_norm(tt_rng *r)
{
    struct {
        int ndim;
        int64_t shape[3];
        double eps;
    } cases[] = {{2, {3, 19}, 1e-5},
                 {3, {2, 3, 7}, 1e-6},
                 {2, {1, 1}, 1e-5},
                 {2, {5, 1}, 1e-5},
                 {1, {19}, 1e-5}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int nd = cases[c].ndim;
        int64_t d = cases[c].shape[nd - 1];
        gt_tensor x = tt_rand(nd, cases[c].shape, r, -2, 2), w = tt_rand(1, &d, r, 0.5, 1.5);
        gt_tensor y = tt_new(GT_F32, nd, cases[c].shape);
        gt_tensor dy = tt_rand(nd, cases[c].shape, r, -1, 1);
        gt_tensor dx = tt_new(GT_F32, nd, cases[c].shape), dw = tt_new(GT_F32, 1, &d);
        rms_ctx ctx = {
            tt_to_double(&x), tt_to_double(&w), tt_to_double(&dy), NULL, gt_tensor_numel(&x) / d, d,
            cases[c].eps};
        ctx.y = tt_doubles(ctx.rows * d);
        ref_rms_norm(ctx.x, ctx.w, ctx.rows, d, ctx.eps, ctx.y);
        tt_call k;
        tt_init(&k, GT_OP_RMS_NORM);
        tt_in(&k, &x);
        tt_in(&k, &w);
        tt_out(&k, &y);
        tt_f(&k, cases[c].eps);
        if (tt_run_ok(&k, "rms_norm"))
            EXPECT(tt_close(&y, ctx.y, 1e-5, 1e-6, "rms_norm"), "%zu", c);
        EXPECT(tt_deterministic(&k), "rms_norm determinism");
        EXPECT(tt_half_path(&k, GT_BF16, 0), "rms_norm bf16");

        double *fdx = tt_doubles(ctx.rows * d), *fdw = tt_doubles(d);
        tt_fd(ctx.x, ctx.rows * d, 1e-4, rms_objective, &ctx, fdx);
        tt_fd(ctx.w, d, 1e-4, rms_objective, &ctx, fdw);
        tt_call kb;
        tt_init(&kb, GT_OP_RMS_NORM_BACKWARD);
        tt_in(&kb, &x);
        tt_in(&kb, &w);
        tt_in(&kb, &dy);
        tt_out(&kb, &dx);
        tt_out(&kb, &dw);
        tt_f(&kb, cases[c].eps);
        if (tt_run_ok(&kb, "rms_norm_backward")) {
            EXPECT(tt_close(&dx, fdx, 1e-4, 1e-5, "rms_norm_backward dx"), "%zu", c);
            EXPECT(tt_close(&dw, fdw, 1e-4, 1e-5, "rms_norm_backward dw"), "%zu", c);
        }
        EXPECT(tt_deterministic(&kb), "rms_norm_backward determinism");
        EXPECT(tt_half_path(&kb, GT_BF16, 0), "rms_norm_backward bf16");
        free(fdx);
        free(fdw);
        free(ctx.x);
        free(ctx.w);
        free(ctx.dy);
        free(ctx.y);
        gt_tensor_free(&x);
        gt_tensor_free(&w);
        gt_tensor_free(&y);
        gt_tensor_free(&dy);
        gt_tensor_free(&dx);
        gt_tensor_free(&dw);
    }
}

/* ---------------------------------------------------------------- rope */

typedef struct {
    double theta, factor, lo, hi;
    int64_t omp;
} rope_params;

/* inv_freq_j = theta^(-2j/d), llama3.1-scaled when omp > 0 — straight from the formula, in double.
 */
static void ref_inv_freq(const rope_params *p, int64_t d, double *inv)
{
    for (int64_t j = 0; j < d / 2; j++) {
        double f = pow(p->theta, -2.0 * (double)j / (double)d);
        if (p->omp > 0) {
            double wavelen = 2.0 * 3.14159265358979323846 / f;
            double lo_wl = (double)p->omp / p->lo, hi_wl = (double)p->omp / p->hi;
            if (wavelen < hi_wl) {
                /* high frequency: unchanged */
            } else if (wavelen > lo_wl) {
                f /= p->factor;
            } else {
                double s = ((double)p->omp / wavelen - p->lo) / (p->hi - p->lo);
                f = (1.0 - s) * f / p->factor + s * f;
            }
        }
        inv[j] = f;
    }
}

/* y = rope(x) over [b, s, h, d] at positions 0..s-1, half-rotation pairs (j, j + d/2). */
static void ref_rope(const double *x, const int64_t *sh, const double *inv, double sign, double *y)
{
    int64_t half = sh[3] / 2;
    for (int64_t bi = 0; bi < sh[0]; bi++)
        for (int64_t p = 0; p < sh[1]; p++)
            for (int64_t h = 0; h < sh[2]; h++) {
                int64_t o = ((bi * sh[1] + p) * sh[2] + h) * sh[3];
                for (int64_t j = 0; j < half; j++) {
                    double a = sign * (double)p * inv[j], c = cos(a), s = sin(a);
                    y[o + j] = x[o + j] * c - x[o + j + half] * s;
                    y[o + j + half] = x[o + j + half] * c + x[o + j] * s;
                }
            }
}

typedef struct {
    double *x, *dy, *y, *inv;
    const int64_t *shape;
    int64_t n;
} rope_ctx;

static double rope_objective(void *p)
{
    rope_ctx *c = p;
    ref_rope(c->x, c->shape, c->inv, 1.0, c->y);
    double l = 0.0;
    for (int64_t i = 0; i < c->n; i++)
        l += c->dy[i] * c->y[i];
    return l;
}

static void rope_attrs(tt_call *k, const rope_params *p, bool inverse)
{
    tt_i(k, inverse);
    tt_i(k, p->omp);
    tt_f(k, p->theta);
    tt_f(k, p->factor);
    tt_f(k, p->lo);
    tt_f(k, p->hi);
}

static void test_rope(tt_rng *r)
{
    const int64_t shapes[][4] = {{2, 7, 3, 8}, {1, 19, 2, 6}, {1, 5, 1, 2}, {1, 3, 2, 16}};
    const rope_params params[] = {{10000.0, 1.0, 1.0, 1.0, 0},
                                  {500000.0, 8.0, 1.0, 4.0, 8192},
                                  {500000.0, 8.0, 1.0, 4.0, 16}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        for (size_t pi = 0; pi < sizeof params / sizeof params[0]; pi++) {
            const int64_t *sh = shapes[s];
            gt_tensor x = tt_rand(4, sh, r, -1, 1), y = tt_new(GT_F32, 4, sh);
            gt_tensor dy = tt_rand(4, sh, r, -1, 1), dx = tt_new(GT_F32, 4, sh);
            rope_ctx ctx = {tt_to_double(&x),   tt_to_double(&dy), NULL, tt_doubles(sh[3] / 2), sh,
                            gt_tensor_numel(&x)};
            ctx.y = tt_doubles(ctx.n);
            ref_inv_freq(&params[pi], sh[3], ctx.inv);
            ref_rope(ctx.x, sh, ctx.inv, 1.0, ctx.y);
            tt_call k;
            tt_init(&k, GT_OP_ROPE);
            tt_in(&k, &x);
            tt_out(&k, &y);
            rope_attrs(&k, &params[pi], false);
            if (tt_run_ok(&k, "rope"))
                EXPECT(tt_close(&y, ctx.y, 1e-5, 1e-5, "rope"), "shape %zu params %zu", s, pi);
            EXPECT(tt_deterministic(&k), "rope determinism");
            EXPECT(tt_half_path(&k, GT_BF16, 0), "rope bf16");

            /* The inverse rotation applied to dy is the gradient of sum dy * rope(x). */
            double *fd = tt_doubles(ctx.n);
            tt_fd(ctx.x, ctx.n, 1e-3, rope_objective, &ctx, fd);
            tt_call kb;
            tt_init(&kb, GT_OP_ROPE);
            tt_in(&kb, &dy);
            tt_out(&kb, &dx);
            rope_attrs(&kb, &params[pi], true);
            if (tt_run_ok(&kb, "rope inverse"))
                EXPECT(tt_close(&dx, fd, 1e-4, 1e-5, "rope inverse"), "shape %zu params %zu", s,
                       pi);
            free(fd);
            free(ctx.x);
            free(ctx.dy);
            free(ctx.y);
            free(ctx.inv);
            gt_tensor_free(&x);
            gt_tensor_free(&y);
            gt_tensor_free(&dy);
            gt_tensor_free(&dx);
        }
    }
    /* An odd head dim has no half rotation. */
    gt_tensor x = tt_rand(4, TT_SHAPE(1, 2, 1, 5), r, -1, 1),
              y = tt_new(GT_F32, 4, TT_SHAPE(1, 2, 1, 5));
    tt_call k;
    tt_init(&k, GT_OP_ROPE);
    tt_in(&k, &x);
    tt_out(&k, &y);
    rope_attrs(&k, &params[0], false);
    gt_error err = {0};
    EXPECT(tt_run(&k, &err) == GT_ERR_SHAPE, "rope with d = 5 must fail");
    gt_tensor_free(&x);
    gt_tensor_free(&y);
}

int main(void)
{
    tt_rng r = {5};
    test_rms_norm(&r);
    test_rope(&r);
    return gt_test_finish();
}
