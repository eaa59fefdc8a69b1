/* test_philox.c — Philox4x32-10 against Random123's published known-answer vectors, the
 * (seed, stream, index, round) mapping, and the samplers' moments against their analytic values
 * (bounds of 5 standard errors over 10^6 samples). */
#include "graphtrain/gt_core.h"
#include "gt_test.h"

#include <math.h>

static void test_kat(void)
{
    const struct {
        uint32_t ctr[4], key[2], out[4];
    } kat[] = {
        {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
        {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
         {0xffffffff, 0xffffffff},
         {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
        {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
         {0xa4093822, 0x299f31d0},
         {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
    };
    for (int i = 0; i < 3; i++) {
        uint32_t out[4];
        gt_philox4x32(kat[i].ctr, kat[i].key, out);
        for (int k = 0; k < 4; k++)
            EXPECT(out[k] == kat[i].out[k], "kat %d word %d: %08x want %08x", i, k, out[k],
                   kat[i].out[k]);
    }
}

/* The documented mapping: key = seed halves, counter = index halves, stream halves (+ round). */
static void test_mapping(void)
{
    uint64_t seed = 0x0123456789abcdefull, stream = 0xfedcba9876543210ull, index = 0x1122334455ull;
    for (uint32_t round = 0; round < 3; round++) {
        uint32_t a[4], b[4];
        gt_rng_bits(seed, stream, index, round, a);
        const uint32_t ctr[4] = {0x22334455u, 0x11u, 0x76543210u, 0xfedcba98u + round};
        const uint32_t key[2] = {0x89abcdefu, 0x01234567u};
        gt_philox4x32(ctr, key, b);
        EXPECT(a[0] == b[0] && a[1] == b[1] && a[2] == b[2] && a[3] == b[3], "mapping round %u",
               round);
    }
}

/* Element i depends on (seed, stream, index) only: computing elements in any order, alone or
 * among others, gives the same numbers, and changing any key component changes them. */
static void test_determinism(void)
{
    enum { N = 1000 };
    static double fwd[N];
    for (int i = 0; i < N; i++)
        fwd[i] = gt_rng_normal(7, 99, (uint64_t)i, 0);
    int same = 0, diff_seed = 0, diff_stream = 0, diff_round = 0;
    for (int i = N - 1; i >= 0; i -= 3) {
        same += gt_rng_normal(7, 99, (uint64_t)i, 0) == fwd[i];
        diff_seed += gt_rng_normal(8, 99, (uint64_t)i, 0) != fwd[i];
        diff_stream += gt_rng_normal(7, 100, (uint64_t)i, 0) != fwd[i];
        diff_round += gt_rng_normal(7, 99, (uint64_t)i, 1) != fwd[i];
    }
    int n = (N + 2) / 3;
    EXPECT(same == n && diff_seed == n && diff_stream == n && diff_round == n,
           "same %d, seed %d, stream %d, round %d of %d", same, diff_seed, diff_stream, diff_round,
           n);
    EXPECT(gt_rng_uniform(1, 2, 3, 4) == gt_rng_uniform(1, 2, 3, 4), "uniform repeatable");
    EXPECT(gt_rng_trunc_normal(1, 2, 3, 0, 1, -2, 2) == gt_rng_trunc_normal(1, 2, 3, 0, 1, -2, 2),
           "trunc_normal repeatable");
}

static void test_uniform(void)
{
    const int n = 1000000;
    double s = 0, s2 = 0;
    int outside = 0;
    int bit_ones[32] = {0};
    for (int i = 0; i < n; i++) {
        double u = gt_rng_uniform(42, 0xabcdef, (uint64_t)i, 0);
        outside += !(u > 0.0 && u < 1.0);
        s += u;
        s2 += (u - 0.5) * (u - 0.5);
        uint32_t w[4];
        gt_rng_bits(42, 0xabcdef, (uint64_t)i, 0, w);
        for (int b = 0; b < 32; b++)
            bit_ones[b] += (w[3] >> b) & 1;
    }
    EXPECT(outside == 0, "%d uniforms outside (0, 1)", outside);
    double mean = s / n, var = s2 / n;
    /* Var(U) = 1/12; Var((U - 1/2)^2) = 1/80 - 1/144 = 1/180 */
    EXPECT(fabs(mean - 0.5) < 5 * sqrt(1.0 / 12 / n), "uniform mean %f", mean);
    EXPECT(fabs(var - 1.0 / 12) < 5 * sqrt(1.0 / 180 / n), "uniform variance %f", var);
    int bad_bits = 0;
    for (int b = 0; b < 32; b++)
        bad_bits += fabs(bit_ones[b] - n / 2.0) > 5 * sqrt(n / 4.0);
    EXPECT(bad_bits == 0, "%d biased bits in word 3", bad_bits);
}

static void test_normal(void)
{
    const int n = 1000000;
    double s = 0, s2 = 0, s4 = 0;
    for (int i = 0; i < n; i++) {
        double z = gt_rng_normal(3, 17, (uint64_t)i, 0);
        s += z, s2 += z * z, s4 += z * z * z * z;
    }
    double mean = s / n, var = s2 / n, m4 = s4 / n;
    /* E z = 0, E z^2 = 1 (Var z^2 = 2), E z^4 = 3 (Var z^4 = 105 - 9 = 96) */
    EXPECT(fabs(mean) < 5 * sqrt(1.0 / n), "normal mean %f", mean);
    EXPECT(fabs(var - 1) < 5 * sqrt(2.0 / n), "normal variance %f", var);
    EXPECT(fabs(m4 - 3) < 5 * sqrt(96.0 / n), "normal 4th moment %f", m4);
}

/* The sampler's own ln and cos(2 pi x) against libm's (an independent implementation): within a
 * few ulps over a sweep of (0, 1] and at the points where their reductions switch branch. */
static void test_own_math(void)
{
    double worst_log = 0, worst_cos = 0;
    const int n = 200000;
    for (int i = 0; i <= n + 12; i++) {
        double x;
        if (i <= n)
            x = i == 0 ? 0x1p-54 : (double)i / n; /* the sampler's smallest uniform, then (0, 1] */
        else /* powers of two and around the reductions' switch points */
            x = (const double[]){0.5,
                                 0.25,
                                 0x1p-53,
                                 1 - 0x1p-53,
                                 0.70710678118654746,
                                 0.70710678118654757,
                                 0.125,
                                 0.375,
                                 0.625,
                                 0.875,
                                 0.1,
                                 0.9}[i - n - 1];
        double a = gt_rng_log(x), b = log(x);
        double rel = b != 0 ? fabs(a - b) / fabs(b) : fabs(a);
        if (rel > worst_log) worst_log = rel;
        double c = gt_rng_cos2pi(x), d = cos(2 * M_PI * x);
        if (fabs(c - d) > worst_cos) worst_cos = fabs(c - d);
    }
    /* 1e-15 relative is under 5 ulps; cos(2 pi x) itself carries the rounding of 2 pi x */
    EXPECT(worst_log < 1e-15, "gt_rng_log: worst relative error %.3g against libm", worst_log);
    EXPECT(worst_cos < 2e-15, "gt_rng_cos2pi: worst error %.3g against libm", worst_cos);
    EXPECT(gt_rng_log(1.0) == 0.0, "ln 1 = %.17g", gt_rng_log(1.0));
    EXPECT(gt_rng_cos2pi(0.0) == 1.0 && gt_rng_cos2pi(0.5) == -1.0 && gt_rng_cos2pi(1.0) == 1.0,
           "cos(2 pi x) at 0, 1/2, 1: %.17g %.17g %.17g", gt_rng_cos2pi(0.0), gt_rng_cos2pi(0.5),
           gt_rng_cos2pi(1.0));
    printf("own math: ln within %.3g relative, cos(2 pi x) within %.3g of libm\n", worst_log,
           worst_cos);
}

/* The batched normals are the one-at-a-time ones, bit for bit, whatever the batch's start and
 * length (full batches of lanes and a shorter tail). */
static void test_normal_n(void)
{
    static double out[1037];
    const uint64_t starts[] = {0, 1, 7, 1000003, (1ull << 32) - 5};
    const int64_t lengths[] = {1, 7, 8, 9, 1037};
    int diff = 0, checked = 0;
    for (size_t a = 0; a < sizeof starts / sizeof starts[0]; a++)
        for (size_t b = 0; b < sizeof lengths / sizeof lengths[0]; b++) {
            gt_rng_normal_n(21, 99, starts[a], lengths[b], out);
            for (int64_t k = 0; k < lengths[b]; k++, checked++)
                diff += out[k] != gt_rng_normal(21, 99, starts[a] + (uint64_t)k, 0);
        }
    EXPECT(diff == 0, "%d of %d batched normals differ from gt_rng_normal", diff, checked);
}

static double phi(double x)
{
    return exp(-0.5 * x * x) / sqrt(2 * M_PI);
}
static double Phi(double x)
{
    return 0.5 * erfc(-x / sqrt(2));
}

static void check_trunc(double mu, double sd, double lo, double hi)
{
    const int n = 400000;
    double s = 0, s2 = 0;
    int outside = 0;
    for (int i = 0; i < n; i++) {
        double x = gt_rng_trunc_normal(11, 5, (uint64_t)i, mu, sd, lo, hi);
        outside += !(x >= lo && x <= hi);
        s += x, s2 += x * x;
    }
    double mean = s / n, var = s2 / n - mean * mean;
    /* Truncated normal, a = (lo - mu)/sd, b = (hi - mu)/sd, Z = Phi(b) - Phi(a):
     *   mean = mu + sd (phi(a) - phi(b)) / Z
     *   var  = sd^2 [1 + (a phi(a) - b phi(b)) / Z - ((phi(a) - phi(b)) / Z)^2] */
    double a = (lo - mu) / sd, b = (hi - mu) / sd, Z = Phi(b) - Phi(a);
    double am = mu + sd * (phi(a) - phi(b)) / Z;
    double av = sd * sd * (1 + (a * phi(a) - b * phi(b)) / Z - pow((phi(a) - phi(b)) / Z, 2));
    EXPECT(outside == 0, "%d samples outside [%g, %g]", outside, lo, hi);
    /* a truncated normal has kurtosis < 3, so Var(sample variance) < 2 var^2 / n */
    EXPECT(fabs(mean - am) < 5 * sqrt(av / n), "trunc mean %f vs %f", mean, am);
    EXPECT(fabs(var - av) < 5 * sqrt(2.0 / n) * av, "trunc variance %f vs %f", var, av);
}

static void test_trunc_normal(void)
{
    check_trunc(0.0, 1.0, -2.0, 2.0);    /* torch's default shape */
    check_trunc(0.5, 2.0, -1.0, 3.0);    /* asymmetric, most mass cut */
    check_trunc(0.0, 0.02, -0.04, 0.04); /* init-like scale */
    /* a far-tail interval does not loop forever: clamped into range */
    double x = gt_rng_trunc_normal(1, 1, 0, 0.0, 1.0, 40.0, 41.0);
    EXPECT(x >= 40.0 && x <= 41.0, "far tail clamped: %f", x);
    EXPECT(gt_rng_trunc_normal(1, 1, 0, 0.3, 0.0, -1, 1) == 0.3, "std 0 gives the mean");
}

int main(void)
{
    test_kat();
    test_mapping();
    test_determinism();
    test_uniform();
    test_normal();
    test_own_math();
    test_normal_n();
    test_trunc_normal();
    return gt_test_finish();
}
