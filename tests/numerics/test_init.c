/* test_init.c — parameter initialisation: slices equal the full tensor bitwise (any shard layout
 * initialises the same values), torchtitan's init per parameter kind (spec and sample statistics
 * against the closed-form moments), seeds and fqns give independent streams. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "graphtrain/gt_graph.h"
#include "graphtrain/gt_llama3.h"
#include "gt_test.h"

static float *init_full(const gt_param_spec *p, uint64_t seed, int64_t *numel)
{
    *numel = gt_shape_numel(p->ndim, p->shape);
    float *buf = malloc((size_t)*numel * sizeof *buf);
    gt_tensor t;
    gt_tensor_wrap(&t, GT_F32, 1, numel, buf);
    gt_param_init(p, seed, 0, *numel, &t);
    return buf;
}

/* A small LCG for slice positions (the test's own, independent of the library's RNG). */
static uint64_t lcg(uint64_t *s)
{
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return *s >> 33;
}

static void test_slices(const gt_model *m)
{
    uint64_t state = 12345;
    for (int k = 0; k < m->n_params; k++) {
        const gt_param_spec *p = &m->params[k];
        int64_t n;
        float *full = init_full(p, 42, &n);
        for (int trial = 0; trial < 6; trial++) {
            int64_t start, count;
            if (trial == 0) { /* the last element alone */
                start = n - 1;
                count = 1;
            } else if (trial == 1) { /* a row-aligned shard: the second half of the rows */
                start = (p->shape[0] / 2) * (n / p->shape[0]);
                count = n - start;
            } else {
                start = (int64_t)(lcg(&state) % (uint64_t)n);
                count = 1 + (int64_t)(lcg(&state) % (uint64_t)(n - start));
            }
            float *part = malloc((size_t)count * sizeof *part);
            gt_tensor t;
            gt_tensor_wrap(&t, GT_F32, 1, &count, part);
            gt_param_init(p, 42, start, count, &t);
            EXPECT(memcmp(part, full + start, (size_t)count * sizeof *part) == 0,
                   "%s: slice [%lld, %lld) differs from the full tensor", p->fqn, (long long)start,
                   (long long)(start + count));

            /* A bf16 shard is the bf16 rounding of the same f32 values. */
            uint16_t *half = malloc((size_t)count * sizeof *half);
            gt_tensor hb;
            gt_tensor_wrap(&hb, GT_BF16, 1, &count, half);
            gt_param_init(p, 42, start, count, &hb);
            int64_t bad = 0;
            for (int64_t i = 0; i < count; i++)
                bad += half[i] != gt_f32_to_bf16(full[start + i]);
            EXPECT(bad == 0, "%s: bf16 slice: %lld elements differ", p->fqn, (long long)bad);
            free(half);
            free(part);
        }
        free(full);
    }
}

typedef struct {
    double mean, std, max_abs;
    int64_t beyond_3std; /* |x| > 3·(expected std) */
} moments;

static moments sample_moments(const float *x, int64_t n, double expected_std)
{
    double s = 0, ss = 0;
    moments r = {0};
    for (int64_t i = 0; i < n; i++)
        s += x[i];
    r.mean = s / (double)n;
    for (int64_t i = 0; i < n; i++) {
        double d = x[i] - r.mean;
        ss += d * d;
        double a = fabs(x[i]);
        if (a > r.max_abs) r.max_abs = a;
        if (a > 3.0 * expected_std) r.beyond_3std++;
    }
    r.std = sqrt(ss / (double)(n - 1));
    return r;
}

/* Std of N(0, σ²) truncated to [−cσ, cσ]: σ · sqrt(1 − 2cφ(c) / (2Φ(c) − 1)). */
static double truncated_std(double sigma, double c)
{
    double phi = exp(-0.5 * c * c) / sqrt(2.0 * M_PI);
    double mass = erf(c / sqrt(2.0));
    return sigma * sqrt(1.0 - 2.0 * c * phi / mass);
}

static const gt_param_spec *find(const gt_model *m, const char *fqn)
{
    for (int k = 0; k < m->n_params; k++) {
        if (strcmp(m->params[k].fqn, fqn) == 0) return &m->params[k];
    }
    return NULL;
}

/* Checks spec fields against torchtitan's rule and the sampled moments against the law: the
 * sample std of n draws has relative standard error ≈ 1/sqrt(2n); 6 of those (at least 1.5 %)
 * is the tolerance, the mean within 6 standard errors. */
static void check_kind(const gt_model *m, const char *fqn, gt_init_kind kind, double std, double lo,
                       double hi)
{
    const gt_param_spec *p = find(m, fqn);
    EXPECT(p != NULL, "no param %s", fqn);
    if (!p) return;
    EXPECT(p->init == kind, "%s: init kind %d, want %d", fqn, p->init, kind);
    if (kind == GT_INIT_NORMAL || kind == GT_INIT_TRUNC_NORMAL) {
        EXPECT(fabs(p->std - std) <= 1e-12 * std, "%s: std %g, want %g", fqn, p->std, std);
    }
    if (kind == GT_INIT_TRUNC_NORMAL) {
        EXPECT(p->lo == lo && p->hi == hi, "%s: bounds [%g, %g], want [%g, %g]", fqn, p->lo, p->hi,
               lo, hi);
    }

    int64_t n;
    float *x = init_full(p, 42, &n);
    if (kind == GT_INIT_ONES) {
        int64_t bad = 0;
        for (int64_t i = 0; i < n; i++)
            bad += x[i] != 1.0f;
        EXPECT(bad == 0, "%s: %lld elements are not 1", fqn, (long long)bad);
        free(x);
        return;
    }
    /* The law's std: a cut at c·σ narrows it (c = 3 for the output; c = 100 for 0.02 in [-2, 2]
     * is indistinguishable from the plain normal). */
    double law_std = kind == GT_INIT_NORMAL ? std : truncated_std(std, hi / std);
    moments r = sample_moments(x, n, std);
    double rel_se = 1.0 / sqrt(2.0 * (double)n);
    double tol = fmax(6.0 * rel_se, 0.015);
    EXPECT(fabs(r.std / law_std - 1.0) < tol, "%s: sample std %.6g, law %.6g (n %lld)", fqn, r.std,
           law_std, (long long)n);
    EXPECT(fabs(r.mean) < 6.0 * law_std / sqrt((double)n), "%s: mean %.3g", fqn, r.mean);
    if (kind == GT_INIT_TRUNC_NORMAL) {
        EXPECT(r.max_abs <= hi, "%s: max |x| %g outside [%g, %g]", fqn, r.max_abs, lo, hi);
    }
    if (kind == GT_INIT_NORMAL) {
        /* Untruncated: P(|x| > 3σ) = 0.27 %, so some of n draws land there. */
        double expect = 0.0027 * (double)n;
        EXPECT((double)r.beyond_3std > 0.5 * expect && (double)r.beyond_3std < 1.5 * expect,
               "%s: %lld draws beyond 3 std, expected about %.0f", fqn, (long long)r.beyond_3std,
               expect);
    }
    free(x);
}

static void test_kinds(const gt_model *m, const gt_llama3_config *cfg)
{
    check_kind(m, "tok_embeddings.weight", GT_INIT_NORMAL, 1.0, 0, 0);
    for (int64_t i = 0; i < cfg->n_layers; i++) {
        char fqn[128];
        double depth_std = 0.02 / sqrt(2.0 * (double)(i + 1));
        static const char *const plain[] = {"attention.wq", "attention.wk", "attention.wv",
                                            "feed_forward.w1"};
        static const char *const scaled[] = {"attention.wo", "feed_forward.w2", "feed_forward.w3"};
        for (int j = 0; j < 4; j++) {
            snprintf(fqn, sizeof fqn, "layers.%lld.%s.weight", (long long)i, plain[j]);
            check_kind(m, fqn, GT_INIT_TRUNC_NORMAL, 0.02, -2.0, 2.0);
        }
        for (int j = 0; j < 3; j++) {
            snprintf(fqn, sizeof fqn, "layers.%lld.%s.weight", (long long)i, scaled[j]);
            check_kind(m, fqn, GT_INIT_TRUNC_NORMAL, depth_std, -2.0, 2.0);
        }
        snprintf(fqn, sizeof fqn, "layers.%lld.attention_norm.weight", (long long)i);
        check_kind(m, fqn, GT_INIT_ONES, 0, 0, 0);
        snprintf(fqn, sizeof fqn, "layers.%lld.ffn_norm.weight", (long long)i);
        check_kind(m, fqn, GT_INIT_ONES, 0, 0, 0);
    }
    check_kind(m, "norm.weight", GT_INIT_ONES, 0, 0, 0);
    double out_std = 1.0 / sqrt((double)cfg->dim);
    check_kind(m, "output.weight", GT_INIT_TRUNC_NORMAL, out_std, -3.0 * out_std, 3.0 * out_std);

    /* The ±3σ cut is reached, not just respected: P(|x| > 2.9σ) ≈ 0.37 % before the cut. */
    int64_t n;
    float *x = init_full(find(m, "output.weight"), 42, &n);
    int64_t near_edge = 0;
    for (int64_t i = 0; i < n; i++)
        near_edge += fabs(x[i]) > 2.9 * out_std;
    EXPECT(near_edge > 0, "output: no draw beyond 2.9 std of %lld", (long long)n);
    free(x);
}

/* Fraction of positions where two tensors hold the same value. */
static double same_fraction(const float *a, const float *b, int64_t n)
{
    int64_t same = 0;
    for (int64_t i = 0; i < n; i++)
        same += a[i] == b[i];
    return (double)same / (double)n;
}

static void test_streams(const gt_model *m)
{
    const gt_param_spec *wq0 = find(m, "layers.0.attention.wq.weight");
    const gt_param_spec *wq1 = find(m, "layers.1.attention.wq.weight");
    EXPECT(wq0 && wq1, "wq params");
    if (!wq0 || !wq1) return;
    int64_t n;
    float *a = init_full(wq0, 42, &n);
    float *again = init_full(wq0, 42, &n);
    float *seed43 = init_full(wq0, 43, &n);
    float *other = init_full(wq1, 42, &n); /* same shape and law, another fqn */
    EXPECT(memcmp(a, again, (size_t)n * sizeof *a) == 0, "same (seed, fqn) must repeat bitwise");
    EXPECT(same_fraction(a, seed43, n) < 0.01, "seeds 42 and 43 agree on %.3f of elements",
           same_fraction(a, seed43, n));
    EXPECT(same_fraction(a, other, n) < 0.01, "layers 0 and 1 wq agree on %.3f of elements",
           same_fraction(a, other, n));
    /* Independent streams, not shifted copies of one: element i of one fqn is not element i + 1
     * of the other. */
    EXPECT(same_fraction(a, other + 1, n - 1) < 0.01, "shifted streams agree");
    free(a);
    free(again);
    free(seed43);
    free(other);

    gt_param_spec zeros = *wq0;
    zeros.init = GT_INIT_ZEROS;
    float *z = init_full(&zeros, 42, &n);
    int64_t nonzero = 0;
    for (int64_t i = 0; i < n; i++)
        nonzero += z[i] != 0.0f;
    EXPECT(nonzero == 0, "zeros init: %lld non-zero", (long long)nonzero);
    free(z);
}

/* A large parameter is initialised by several threads (gt_param_init splits big ranges): the
 * result equals drawing it in small pieces, whatever the machine's core count. */
static void test_threaded_init(void)
{
    gt_param_spec p = {.fqn = "layers.0.feed_forward.w1.weight",
                       .dtype = GT_F32,
                       .ndim = 2,
                       .shape = {1024, 1030},
                       .init = GT_INIT_TRUNC_NORMAL,
                       .std = 0.02,
                       .lo = -0.06,
                       .hi = 0.06};
    int64_t n = 1024 * 1030;
    float *whole = malloc((size_t)n * sizeof *whole), *pieces = malloc((size_t)n * sizeof *pieces);
    gt_tensor t;
    gt_tensor_wrap(&t, GT_F32, 1, &n, whole);
    gt_param_init(&p, 11, 0, n, &t);
    for (int64_t s = 0; s < n; s += 999) {
        int64_t c = s + 999 > n ? n - s : 999;
        gt_tensor piece;
        gt_tensor_wrap(&piece, GT_F32, 1, &c, pieces + s);
        gt_param_init(&p, 11, s, c, &piece);
    }
    EXPECT(memcmp(whole, pieces, (size_t)n * sizeof *whole) == 0,
           "threaded init differs from piecewise init");
    free(whole);
    free(pieces);
}

/* gt_model_init_params writes every parameter exactly as gt_param_init does alone. */
static void test_init_params(const gt_model *m)
{
    gt_error err = {0};
    gt_tensor *params = calloc((size_t)m->n_params, sizeof *params);
    EXPECT_OK(gt_model_init_params(m, 7, params, &err), &err);
    for (int k = 0; k < m->n_params; k++) {
        int64_t n;
        float *x = init_full(&m->params[k], 7, &n);
        EXPECT(params[k].dtype == GT_F32 && gt_tensor_numel(&params[k]) == n &&
                   params[k].ndim == m->params[k].ndim &&
                   memcmp(params[k].data, x, (size_t)n * sizeof *x) == 0,
               "gt_model_init_params: %s", m->params[k].fqn);
        free(x);
        gt_tensor_free(&params[k]);
    }
    free(params);
}

int main(void)
{
    test_threaded_init();
    gt_error err = {0};
    gt_llama3_config cfg;
    gt_model m;

    /* test_odd: odd sizes (dim 72, ffn 249, vocab 301) for the slice checks. */
    EXPECT_OK(gt_llama3_flavor("test_odd", &cfg, &err), &err);
    gt_graph *g = gt_graph_new();
    EXPECT_OK(gt_llama3_build(g, &cfg, &m, &err), &err);
    if (err.code == GT_OK) {
        test_slices(&m);
        test_streams(&m);
        test_init_params(&m);
        gt_model_free(&m);
    }
    gt_graph_free(g);

    /* debugmodel: enough elements per tensor (65k–524k) for tight statistics, six depths. */
    EXPECT_OK(gt_llama3_flavor("debugmodel", &cfg, &err), &err);
    g = gt_graph_new();
    EXPECT_OK(gt_llama3_build(g, &cfg, &m, &err), &err);
    if (err.code == GT_OK) {
        test_kinds(&m, &cfg);
        gt_model_free(&m);
    }
    gt_graph_free(g);
    return gt_test_finish();
}
