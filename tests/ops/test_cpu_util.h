/* test_cpu_util.h — helpers shared by the CPU kernel tests (tests/ops/test_cpu_*.c): a local PRNG,
 * kernel-call building, tolerance checks against double references, central finite differences,
 * determinism (run twice, identical bits, every element written) and the bf16/f16 wrapper check.
 *
 * References in the tests are naive loops in double, written independently of the kernels. */
#ifndef GT_TEST_CPU_UTIL_H
#define GT_TEST_CPU_UTIL_H

#include <stdint.h>
#include <string.h>

#include "graphtrain/gt_backend.h"
#include "gt_test.h"

#define TT_SHAPE(...) ((const int64_t[]){__VA_ARGS__})

/* ---------------------------------------------------------------- PRNG (splitmix64) */

typedef struct {
    uint64_t s;
} tt_rng;

static inline uint64_t tt_next(tt_rng *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [lo, hi). */
static inline double tt_uniform(tt_rng *r, double lo, double hi)
{
    return lo + (hi - lo) * (double)(tt_next(r) >> 11) * 0x1p-53;
}

/* ---------------------------------------------------------------- tensors */

static inline gt_tensor tt_new(gt_dtype dt, int ndim, const int64_t *shape)
{
    gt_tensor t;
    gt_error err = {0};
    gt_status st = gt_tensor_alloc(&t, dt, ndim, shape, &err);
    GT_CHECK(st == GT_OK);
    return t;
}

/* Fills a float tensor with uniform values in [lo, hi) (rounded to its dtype). */
static inline void tt_fill(gt_tensor *t, tt_rng *r, double lo, double hi)
{
    int64_t n = gt_tensor_numel(t);
    for (int64_t i = 0; i < n; i++)
        gt_tensor_set_f32(t, i, (float)tt_uniform(r, lo, hi));
}

static inline gt_tensor tt_rand(int ndim, const int64_t *shape, tt_rng *r, double lo, double hi)
{
    gt_tensor t = tt_new(GT_F32, ndim, shape);
    tt_fill(&t, r, lo, hi);
    return t;
}

/* Copies a float tensor's values into a new double array (caller frees). */
static inline double *tt_to_double(const gt_tensor *t)
{
    int64_t n = gt_tensor_numel(t);
    double *d = malloc((size_t)(n > 0 ? n : 1) * sizeof *d);
    GT_CHECK(d != NULL);
    for (int64_t i = 0; i < n; i++)
        d[i] = gt_tensor_get_f32(t, i);
    return d;
}

static inline double *tt_doubles(int64_t n)
{
    double *d = calloc((size_t)(n > 0 ? n : 1), sizeof *d);
    GT_CHECK(d != NULL);
    return d;
}

/* Multi-index of flat index i in a row-major shape. */
static inline void tt_unravel(int64_t i, int ndim, const int64_t *shape, int64_t *idx)
{
    for (int d = ndim - 1; d >= 0; d--) {
        idx[d] = shape[d] ? i % shape[d] : 0;
        i = shape[d] ? i / shape[d] : 0;
    }
}

/* Flat index of a multi-index; dims where shape is 1 read index 0 (numpy broadcasting) and the
 * index is aligned at the right when ndim < the index's rank. */
static inline int64_t tt_ravel_bcast(const int64_t *idx, int idx_ndim, int ndim,
                                     const int64_t *shape)
{
    int64_t f = 0;
    for (int d = 0; d < ndim; d++) {
        int64_t v = shape[d] == 1 ? 0 : idx[d + idx_ndim - ndim];
        f = f * shape[d] + v;
    }
    return f;
}

/* ---------------------------------------------------------------- kernel calls */

typedef struct {
    gt_kernel_call c;
    int64_t i[GT_MAX_IATTR];
    double f[GT_MAX_FATTR];
    int64_t e[GT_MAX_EATTR];
} tt_call;

static inline void tt_init(tt_call *k, gt_op op)
{
    memset(k, 0, sizeof *k);
    k->c.op = op;
}
static inline void tt_in(tt_call *k, const gt_tensor *t)
{
    k->c.in[k->c.n_in++] = t;
}
static inline void tt_out(tt_call *k, gt_tensor *t)
{
    k->c.out[k->c.n_out++] = t;
}
static inline void tt_i(tt_call *k, int64_t v)
{
    k->i[k->c.ni++] = v;
}
static inline void tt_f(tt_call *k, double v)
{
    k->f[k->c.nf++] = v;
}
static inline void tt_e(tt_call *k, int64_t v)
{
    k->e[k->c.ne++] = v;
}

static inline gt_status tt_run(tt_call *k, gt_error *err)
{
    k->c.i = k->i;
    k->c.f = k->f;
    k->c.e = k->e;
    gt_error_clear(err);
    return gt_cpu_run_kernel(&k->c, err);
}

/* Runs k and reports a failure through EXPECT; returns whether it succeeded. */
static inline bool tt_run_ok(tt_call *k, const char *what)
{
    gt_error err = {0};
    gt_status st = tt_run(k, &err);
    EXPECT(st == GT_OK, "%s: %s: %s", what, gt_status_name(st), err.msg);
    return st == GT_OK;
}

/* ---------------------------------------------------------------- comparisons */

/* |got - ref| <= rtol * |ref| + atol_rel * max|ref| for every element (atol scales with the
 * tensor's magnitude, so entries that cancel to ~0 are judged against the size of their terms)
 * + atol. Prints the worst element on failure. */
static inline bool tt_close_abs(const gt_tensor *got, const double *ref, double rtol,
                                double atol_rel, double atol, const char *what)
{
    int64_t n = gt_tensor_numel(got);
    double mx = 0.0;
    for (int64_t i = 0; i < n; i++)
        mx = fabs(ref[i]) > mx ? fabs(ref[i]) : mx;
    double worst = 0.0;
    int64_t wi = -1;
    for (int64_t i = 0; i < n; i++) {
        double g = gt_tensor_get_f32(got, i), tol = rtol * fabs(ref[i]) + atol_rel * mx + atol;
        double ex = fabs(g - ref[i]) - tol;
        if (!(ex <= 0.0) && (wi < 0 || ex > worst || isnan(ex))) {
            worst = ex;
            wi = i;
        }
    }
    if (wi >= 0) {
        fprintf(stderr, "  %s: element %lld got %.9g, reference %.9g (max|ref| %.3g)\n", what,
                (long long)wi, gt_tensor_get_f32(got, wi), ref[wi], mx);
        return false;
    }
    return true;
}

static inline bool tt_close(const gt_tensor *got, const double *ref, double rtol, double atol_rel,
                            const char *what)
{
    return tt_close_abs(got, ref, rtol, atol_rel, 0.0, what);
}

static inline bool tt_same_bits(const gt_tensor *a, const gt_tensor *b)
{
    return a->dtype == b->dtype && gt_tensor_nbytes(a) == gt_tensor_nbytes(b) &&
           memcmp(a->data, b->data, gt_tensor_nbytes(a)) == 0;
}

/* ---------------------------------------------------------------- finite differences */

/* grad[i] = (f(x + h e_i) - f(x - h e_i)) / 2h for the n entries of x (perturbed in place and
 * restored). f evaluates the double-precision reference objective. */
static inline void tt_fd(double *x, int64_t n, double h, double (*f)(void *ctx), void *ctx,
                         double *grad)
{
    for (int64_t i = 0; i < n; i++) {
        double save = x[i];
        x[i] = save + h;
        double fp = f(ctx);
        x[i] = save - h;
        double fm = f(ctx);
        x[i] = save;
        grad[i] = (fp - fm) / (2.0 * h);
    }
}

/* ---------------------------------------------------------------- determinism */

/* Runs k twice, pre-filling the outputs with two different byte patterns: identical bits both
 * times means the kernel is deterministic and writes every element of every output. */
static inline bool tt_deterministic(tt_call *k)
{
    gt_tensor first[GT_MAX_OUT];
    bool same = true;
    for (int run = 0; run < 2; run++) {
        for (int o = 0; o < k->c.n_out; o++)
            memset(k->c.out[o]->data, run ? 0xa5 : 0x7f, gt_tensor_nbytes(k->c.out[o]));
        if (!tt_run_ok(k, "determinism run")) return false;
        for (int o = 0; o < k->c.n_out; o++) {
            if (run == 0) {
                first[o] = tt_new(k->c.out[o]->dtype, k->c.out[o]->ndim, k->c.out[o]->shape);
                memcpy(first[o].data, k->c.out[o]->data, gt_tensor_nbytes(&first[o]));
            } else {
                same = same && tt_same_bits(&first[o], k->c.out[o]);
                gt_tensor_free(&first[o]);
            }
        }
    }
    return same;
}

/* ---------------------------------------------------------------- the bf16/f16 wrapper */

/* Checks that running k with its float tensors stored as `half` equals running it in f32 on the
 * half-rounded inputs and rounding the outputs to `half` — bit for bit. Outputs whose bit is set in
 * keep_f32 stay f32 in the half run (sdpa's lse, the cross-entropy loss) and must equal the f32
 * run exactly. k's own tensors are f32 (or integer) and are not modified. */
static inline bool tt_half_path(const tt_call *k, gt_dtype half, unsigned keep_f32)
{
    tt_call k32 = *k, kh = *k;
    gt_tensor in32[GT_MAX_IN], inh[GT_MAX_IN], out32[GT_MAX_OUT], outh[GT_MAX_OUT];
    for (int j = 0; j < k->c.n_in; j++) {
        const gt_tensor *t = k->c.in[j];
        if (!gt_dtype_is_float(t->dtype)) continue;
        in32[j] = tt_new(GT_F32, t->ndim, t->shape);
        inh[j] = tt_new(half, t->ndim, t->shape);
        gt_tensor_convert(t, &inh[j]);
        gt_tensor_convert(&inh[j], &in32[j]);
        k32.c.in[j] = &in32[j];
        kh.c.in[j] = &inh[j];
    }
    for (int j = 0; j < k->c.n_out; j++) {
        const gt_tensor *t = k->c.out[j];
        out32[j] = tt_new(GT_F32, t->ndim, t->shape);
        outh[j] = tt_new((keep_f32 >> j) & 1 ? GT_F32 : half, t->ndim, t->shape);
        k32.c.out[j] = &out32[j];
        kh.c.out[j] = &outh[j];
    }
    bool ok = tt_run_ok(&k32, "f32 run on rounded inputs") && tt_run_ok(&kh, "half run");
    for (int j = 0; ok && j < k->c.n_out; j++) {
        gt_tensor want = tt_new(outh[j].dtype, outh[j].ndim, outh[j].shape);
        gt_tensor_convert(&out32[j], &want);
        ok = tt_same_bits(&want, &outh[j]);
        gt_tensor_free(&want);
    }
    for (int j = 0; j < k->c.n_in; j++) {
        if (!gt_dtype_is_float(k->c.in[j]->dtype)) continue;
        gt_tensor_free(&in32[j]);
        gt_tensor_free(&inh[j]);
    }
    for (int j = 0; j < k->c.n_out; j++) {
        gt_tensor_free(&out32[j]);
        gt_tensor_free(&outh[j]);
    }
    return ok;
}

#endif
