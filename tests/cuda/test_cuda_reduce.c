/* test_cuda_reduce.c — the CUDA sum / mean / max / sum_to paths for long reductions.
 *
 * cuda_reduce.cu picks a path from the shape: one thread per group (short groups), a column split
 * (kept dims innermost, e.g. [rows, D] -> [D]) and a row split (few groups over a long extent,
 * e.g. a full sum: many blocks write double partials, a second pass adds them). Each case here
 * forces one path and checks, against a naive host reference that sums in double:
 *   - sum / mean: |gpu - ref| <= 2^-23 |ref| + 1e-12 sum |x| (the GPU also sums in double, so
 *     only the final rounding to f32 may differ: at most half an ulp, plus a double-order term);
 *   - max: exact (a maximum does not depend on the order), NaN propagates;
 *   - determinism: two runs give identical bits (outputs pre-filled with different patterns).
 * `--bench` prints (asserts nothing) the time of a full sum at the llama3-1B gradient sizes.
 * Without a CUDA device the test skips (exit 0). */
#include "cuda_test_util.h"
#include "graphtrain/gt_cuda.h"
#include "gt_test.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static gt_cuda_stream *g_stream;
static uint64_t rng_state = 0x243f6a8885a308d3ull;

/* Runs op on device copies of x into out (host shape), twice; returns false on a CUDA error.
 * res gets the first run; *same whether both runs' bits match. */
static bool run_gpu(const char *name, gt_op op, const gt_tensor *x, const int64_t *iattr, int ni,
                    const int64_t *e, int ne, const gt_tensor *out, float *res, bool *same)
{
    gt_error err = {0};
    gt_tensor dx, dout;
    size_t nb = gt_tensor_nbytes(out);
    if (gt_cuda_tensor_upload(g_stream, x, &dx, &err) != GT_OK) return false;
    if (gt_cuda_tensor_alloc(&dout, out->dtype, out->ndim, out->shape, &err) != GT_OK) {
        gt_cuda_tensor_free(&dx);
        return false;
    }
    gt_kernel_call k = cu_kernel_call(op, iattr, ni, NULL, 0, e, ne, &dx, 1, &dout, 1);
    float *run2 = malloc(nb), *pat = malloc(nb);
    GT_CHECK(run2 && pat);
    bool ok = true;
    for (int rep = 0; rep < 2 && ok; rep++) {
        memset(pat, rep == 0 ? 0xff : 0x5a, nb);
        ok = gt_cuda_memcpy_h2d(g_stream, dout.data, pat, nb, &err) == GT_OK &&
             gt_cuda_run_kernel(&k, g_stream, &err) == GT_OK &&
             gt_cuda_memcpy_d2h(g_stream, rep == 0 ? res : run2, dout.data, nb, &err) == GT_OK &&
             gt_cuda_stream_sync(g_stream, &err) == GT_OK;
        EXPECT(ok, "%s: CUDA run failed: %s", name, err.msg);
    }
    *same = ok && memcmp(res, run2, nb) == 0;
    free(run2);
    free(pat);
    gt_cuda_tensor_free(&dx);
    gt_cuda_tensor_free(&dout);
    return ok;
}

/* Naive reference: for each output element g (row-major over x's kept dims), the terms of x over
 * the reduced dims in row-major order, summed in double (or maxed). */
static void reference(const float *x, int ndim, const int64_t *shape, const bool *reduced, int kind,
                      double *ref, double *abs_sum, int64_t groups)
{
    for (int64_t g = 0; g < groups; g++) {
        ref[g] = kind == 0 ? 0.0 : -INFINITY;
        abs_sum[g] = 0.0;
    }
    int64_t n = 1;
    for (int d = 0; d < ndim; d++)
        n *= shape[d];
    for (int64_t i = 0; i < n; i++) {
        int64_t rem = i, g = 0, gmul = 1;
        for (int d = ndim - 1; d >= 0; d--) {
            int64_t c = rem % shape[d];
            rem /= shape[d];
            if (!reduced[d]) {
                g += c * gmul;
                gmul *= shape[d];
            }
        }
        double v = x[i];
        if (kind == 0) {
            ref[g] += v;
            abs_sum[g] += fabs(v);
        } else if (isnan(v) || v > ref[g] || isnan(ref[g])) {
            ref[g] = isnan(ref[g]) ? ref[g] : v;
        }
    }
}

/* One case: op over `dims` of x (shape), f32; x uniform in [lo, hi]; nan_at >= 0 plants a NaN. */
static void check_case(const char *name, gt_op op, int ndim, const int64_t *shape, const int *dims,
                       int nd, double lo, double hi, int64_t nan_at)
{
    gt_error err = {0};
    gt_tensor x;
    GT_CHECK(gt_tensor_alloc(&x, GT_F32, ndim, shape, &err) == GT_OK);
    float *xd = (float *)x.data;
    int64_t n = gt_tensor_numel(&x);
    for (int64_t i = 0; i < n; i++)
        xd[i] = (float)cu_urand(&rng_state, lo, hi);
    if (nan_at >= 0) xd[nan_at] = NAN;
    bool reduced[GT_MAX_DIMS] = {false};
    int64_t iattr[1 + GT_MAX_DIMS] = {0}, e[GT_MAX_DIMS], oshape[GT_MAX_DIMS];
    for (int k = 0; k < nd; k++) {
        reduced[dims[k]] = true;
        iattr[1 + k] = dims[k];
    }
    int on = 0;
    int64_t groups = 1;
    for (int d = 0; d < ndim; d++) {
        if (!reduced[d]) groups *= shape[d];
        /* sum/mean/max with keepdim = 0 drop reduced dims; sum_to keeps them as size 1 */
        if (op == GT_OP_SUM_TO)
            oshape[on++] = reduced[d] ? 1 : shape[d];
        else if (!reduced[d])
            oshape[on++] = shape[d];
    }
    for (int d = 0; d < on; d++)
        e[d] = oshape[d];
    gt_tensor out;
    GT_CHECK(gt_tensor_alloc(&out, GT_F32, on, oshape, &err) == GT_OK);
    int kind = op == GT_OP_MAX ? 1 : 0;
    double *ref = malloc(sizeof(double) * (size_t)groups);
    double *abs_sum = malloc(sizeof(double) * (size_t)groups);
    float *res = malloc(sizeof(float) * (size_t)groups);
    GT_CHECK(ref && abs_sum && res);
    reference(xd, ndim, shape, reduced, kind, ref, abs_sum, groups);
    bool same = false;
    bool ok = op == GT_OP_SUM_TO ? run_gpu(name, op, &x, NULL, 0, e, on, &out, res, &same)
                                 : run_gpu(name, op, &x, iattr, 1 + nd, NULL, 0, &out, res, &same);
    if (ok) {
        double worst = 0.0;
        int64_t bad = 0;
        for (int64_t g = 0; g < groups; g++) {
            double want = op == GT_OP_MEAN ? ref[g] / (double)(n / groups) : ref[g];
            double scale = op == GT_OP_MEAN ? (double)(n / groups) : 1.0;
            double got = res[g];
            bool good;
            if (kind == 1 || isnan(want)) {
                good = (isnan(want) && isnan(got)) || got == want;
            } else {
                double tol = 0x1p-23 * fabs(want) + 1e-12 * abs_sum[g] / scale;
                double d = fabs(got - want);
                good = d <= tol;
                if (fabs(want) > 0 && d / fabs(want) > worst) worst = d / fabs(want);
            }
            bad += !good;
        }
        printf("%-36s groups %-7lld terms %-9lld max rel err %.2e  %s\n", name, (long long)groups,
               (long long)(n / groups), worst, same ? "bitwise-identical" : "DIFFER");
        EXPECT(bad == 0, "%s: %lld of %lld outputs off the double reference", name, (long long)bad,
               (long long)groups);
        EXPECT(same, "%s: two GPU runs differ (or an output is not written)", name);
    }
    free(ref);
    free(abs_sum);
    free(res);
    gt_tensor_free(&x);
    gt_tensor_free(&out);
}

/* sum_squares over `dims` of x (dtype dt: f32 or bf16) must be bitwise the GPU sum of the f32
 * squares of x widened (each product rounded to f32 once, on the host: IEEE, so what mul gives),
 * on every path the shape picks; and close to the double reference of the sum of squares. */
static void check_sum_squares(const char *name, gt_dtype dt, int ndim, const int64_t *shape,
                              const int *dims, int nd)
{
    gt_error err = {0};
    gt_tensor x, x32, sq;
    GT_CHECK(gt_tensor_alloc(&x, dt, ndim, shape, &err) == GT_OK);
    GT_CHECK(gt_tensor_alloc(&x32, GT_F32, ndim, shape, &err) == GT_OK);
    GT_CHECK(gt_tensor_alloc(&sq, GT_F32, ndim, shape, &err) == GT_OK);
    int64_t n = gt_tensor_numel(&x);
    for (int64_t i = 0; i < n; i++)
        gt_tensor_set_f32(&x, i, (float)cu_urand(&rng_state, -3, 3));
    gt_tensor_convert(&x, &x32);
    const float *xf = x32.data;
    float *sqf = sq.data;
    for (int64_t i = 0; i < n; i++)
        sqf[i] = xf[i] * xf[i];
    bool reduced[GT_MAX_DIMS] = {false};
    int64_t iattr[1 + GT_MAX_DIMS] = {0}, oshape[GT_MAX_DIMS];
    for (int k = 0; k < nd; k++) {
        reduced[dims[k]] = true;
        iattr[1 + k] = dims[k];
    }
    int on = 0;
    int64_t groups = 1;
    for (int d = 0; d < ndim; d++)
        if (!reduced[d]) groups *= shape[d], oshape[on++] = shape[d];
    gt_tensor out;
    GT_CHECK(gt_tensor_alloc(&out, GT_F32, on, oshape, &err) == GT_OK);
    float *a = malloc(sizeof(float) * (size_t)groups), *b = malloc(sizeof(float) * (size_t)groups);
    double *ref = malloc(sizeof(double) * (size_t)groups);
    double *abs_sum = malloc(sizeof(double) * (size_t)groups);
    GT_CHECK(a && b && ref && abs_sum);
    bool same_a = false, same_b = false;
    bool ok = run_gpu(name, GT_OP_SUM_SQUARES, &x, iattr, 1 + nd, NULL, 0, &out, a, &same_a) &&
              run_gpu(name, GT_OP_SUM, &sq, iattr, 1 + nd, NULL, 0, &out, b, &same_b);
    if (ok) {
        reference(sqf, ndim, shape, reduced, 0, ref, abs_sum, groups);
        int64_t off = 0, far = 0;
        for (int64_t g = 0; g < groups; g++) {
            off += memcmp(&a[g], &b[g], sizeof a[g]) != 0;
            far += fabs(a[g] - ref[g]) > 0x1p-23 * fabs(ref[g]) + 1e-12 * abs_sum[g];
        }
        printf("%-36s groups %-7lld %s  %lld differ from sum(x*x)\n", name, (long long)groups,
               gt_dtype_name(dt), (long long)off);
        EXPECT(off == 0 && same_a, "%s: %lld of %lld outputs differ from the sum of the squares",
               name, (long long)off, (long long)groups);
        EXPECT(far == 0, "%s: %lld outputs off the double reference", name, (long long)far);
    }
    free(a);
    free(b);
    free(ref);
    free(abs_sum);
    gt_tensor_free(&x);
    gt_tensor_free(&x32);
    gt_tensor_free(&sq);
    gt_tensor_free(&out);
}

#define SH(...) ((const int64_t[]){__VA_ARGS__})
#define DIMS(...) ((const int[]){__VA_ARGS__})

static void cases(void)
{
    /* row split: a full sum over 2M terms, one group (many blocks + second pass) */
    check_case("sum all [2048,1000]", GT_OP_SUM, 2, SH(2048, 1000), DIMS(0, 1), 2, -1, 1, -1);
    check_case("mean all [2048,1000]", GT_OP_MEAN, 2, SH(2048, 1000), DIMS(0, 1), 2, 0, 1, -1);
    check_case("max all [2048,1000]", GT_OP_MAX, 2, SH(2048, 1000), DIMS(0, 1), 2, -5, 3, -1);
    check_case("max all with NaN [1000,999]", GT_OP_MAX, 2, SH(1000, 999), DIMS(0, 1), 2, -1, 1,
               777777);
    /* row split over a few groups, a count that does not divide into the chunks */
    check_case("sum dim1 [3,300007]", GT_OP_SUM, 2, SH(3, 300007), DIMS(1), 1, -1, 2, -1);
    /* row split with reduced dims that do not merge (middle dim kept: strided terms) */
    check_case("sum dims0,2 [40,7,3001]", GT_OP_SUM, 3, SH(40, 7, 3001), DIMS(0, 2), 2, -1, 1, -1);
    check_case("max dims0,2 [40,7,3001]", GT_OP_MAX, 3, SH(40, 7, 3001), DIMS(0, 2), 2, -1, 1, -1);
    /* one block per group, no split (many groups) */
    check_case("sum dim1 [2000,333]", GT_OP_SUM, 2, SH(2000, 333), DIMS(1), 1, -1, 1, -1);
    /* column split: leading dims reduced, kept dims innermost (chunks of rows + second pass) */
    check_case("sum dim0 [5000,96]", GT_OP_SUM, 2, SH(5000, 96), DIMS(0), 1, -1, 1, -1);
    check_case("sum_to [6,900,40] -> [1,1,40]", GT_OP_SUM_TO, 3, SH(6, 900, 40), DIMS(0, 1), 2, -1,
               1, -1);
    check_case("max dim0 [5000,96]", GT_OP_MAX, 2, SH(5000, 96), DIMS(0), 1, -1, 1, -1);
    check_case("mean dims0,1 [7,9,50] (one chunk)", GT_OP_MEAN, 3, SH(7, 9, 50), DIMS(0, 1), 2, -1,
               1, -1);
    /* short groups: one thread each */
    check_case("sum dim2 [30,40,20]", GT_OP_SUM, 3, SH(30, 40, 20), DIMS(2), 1, -1, 1, -1);
    /* sum_squares: the gradient norm's full sums (vector path, f32 and bf16, odd sizes for the
     * unaligned head and tail), a column split and short groups */
    for (int k = 0; k < 2; k++) {
        gt_dtype dt = k ? GT_BF16 : GT_F32;
        check_sum_squares("sum_squares all [2048,1000]", dt, 2, SH(2048, 1000), DIMS(0, 1), 2);
        check_sum_squares("sum_squares all [1001,333]", dt, 2, SH(1001, 333), DIMS(0, 1), 2);
        check_sum_squares("sum_squares dim0 [5000,96]", dt, 2, SH(5000, 96), DIMS(0), 1);
        check_sum_squares("sum_squares dim2 [30,40,20]", dt, 3, SH(30, 40, 20), DIMS(2), 1);
    }
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Prints the mean time of op (reduced dims `dims`) on a device tensor of `shape` (opt-in). */
static void bench_one(const char *name, gt_op op, int ndim, const int64_t *shape, const int *dims,
                      int nd, const int64_t *e, int ne)
{
    gt_error err = {0};
    gt_tensor dx, dout;
    int64_t oshape[GT_MAX_DIMS], iattr[1 + GT_MAX_DIMS] = {0};
    bool reduced[GT_MAX_DIMS] = {false};
    for (int k = 0; k < nd; k++) {
        reduced[dims[k]] = true;
        iattr[1 + k] = dims[k];
    }
    int on = 0;
    for (int d = 0; d < ndim; d++)
        if (op == GT_OP_SUM_TO || !reduced[d]) oshape[on++] = reduced[d] ? 1 : shape[d];
    if (gt_cuda_tensor_alloc(&dx, GT_F32, ndim, shape, &err) != GT_OK ||
        gt_cuda_tensor_alloc(&dout, GT_F32, on, oshape, &err) != GT_OK) {
        printf("bench %s: %s\n", name, err.msg);
        return;
    }
    gt_kernel_call k = cu_kernel_call(op, iattr, op == GT_OP_SUM_TO ? 0 : 1 + nd, NULL, 0, e, ne,
                                      &dx, 1, &dout, 1);
    int reps = 20;
    bool ok = gt_cuda_run_kernel(&k, g_stream, &err) == GT_OK &&
              gt_cuda_stream_sync(g_stream, &err) == GT_OK;
    double t0 = now_s();
    for (int r = 0; r < reps && ok; r++)
        ok = gt_cuda_run_kernel(&k, g_stream, &err) == GT_OK;
    ok = ok && gt_cuda_stream_sync(g_stream, &err) == GT_OK;
    double dt = (now_s() - t0) / reps;
    double gb = (double)gt_tensor_nbytes(&dx) / 1e9;
    if (ok)
        printf("bench %-34s %9.3f ms  %7.1f GB/s\n", name, dt * 1e3, gb / dt);
    else
        printf("bench %s: %s\n", name, err.msg);
    gt_cuda_tensor_free(&dx);
    gt_cuda_tensor_free(&dout);
}

int main(int argc, char **argv)
{
    gt_cuda_device_info info;
    int rc = cu_test_start(&info, &g_stream);
    if (rc >= 0) return rc;
    if (argc > 1 && strcmp(argv[1], "--bench") == 0) {
        printf("device: %s (%d SMs)\n", info.name, info.sm_count);
        bench_one("sum all [2048,8192] f32", GT_OP_SUM, 2, SH(2048, 8192), DIMS(0, 1), 2, NULL, 0);
        bench_one("sum all [128256,2048] f32", GT_OP_SUM, 2, SH(128256, 2048), DIMS(0, 1), 2, NULL,
                  0);
        bench_one("sum all [2048] f32", GT_OP_SUM, 1, SH(2048), DIMS(0), 1, NULL, 0);
        bench_one("sum_to [16384,2048] -> [1,2048]", GT_OP_SUM_TO, 2, SH(16384, 2048), DIMS(0), 1,
                  SH(1, 2048), 2);
        bench_one("sum dim1 [16384,2048]", GT_OP_SUM, 2, SH(16384, 2048), DIMS(1), 1, NULL, 0);
        gt_cuda_stream_destroy(g_stream);
        return 0;
    }
    cases();
    gt_cuda_stream_destroy(g_stream);
    return gt_test_finish();
}
