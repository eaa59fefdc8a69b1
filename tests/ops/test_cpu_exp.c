/* test_cpu_exp.c — gt_cpu_expf, the CPU kernels' exp (cpu_internal.h), against the double exp of
 * libm rounded to f32:
 *   - every 61st f32 bit pattern between -105 and 90 (about 37 million inputs, normal, subnormal
 *     and overflowing results), plus the boundaries and their neighbours: within 1 ulp of the
 *     rounded reference (an ulp of the reference; for subnormal references the subnormal spacing),
 *     0 below the underflow bound and +inf above the overflow one;
 *   - the special inputs: exp(±0) = 1 exactly, exp(-inf) = 0, exp(+inf) = +inf, exp(NaN) is NaN;
 *   - gt_cpu_exp_n (the vectorized loop) bitwise equal to gt_cpu_expf element by element for every
 *     offset and length up to 70, with sign -1 and a shift, in place and not.
 *   - gt_cpu_exp_sum (exps summed in vector lanes where every partial sum is proven exact)
 *     bitwise equal to the ordered double sum of the gt_cpu_expf values, and its exps written
 *     the same, on rows of 1 to 700 elements (several 256-element chunks) whose spread makes the
 *     lane sum exact, inexact from the start, or inexact from a later chunk on, with zeros,
 *     -inf, +inf and NaN; on the inexact rows a 16-lane sum does differ from the ordered one
 *     (checked, so the rows do test the exactness condition: taking the lane sum always fails);
 *   - gt_cpu_max_n equal to the ordered max loop (NaNs skipped, a first one too, -inf when none is
 *     left).
 * Mutations checked by hand when the test was written: 1/700 for the r^6 coefficient 1/720 gives
 * 2 ulp, a dropped ln2_lo step 2.2 million inputs beyond the bound. */
#include "backend/cpu/cpu_internal.h"
#include "gt_test.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Distance in ulps of got from want (both finite and non-negative: the bit patterns of
 * non-negative floats are ordered like the values, so their difference counts the floats between).
 */
static int64_t ulps(float got, float want)
{
    return llabs((int64_t)gt_f32_bits(got) - (int64_t)gt_f32_bits(want));
}

static int64_t worst = 0;
static float worst_x = 0;
static int64_t checked = 0, bad = 0;

static void check(float x)
{
    if (isnan(x)) return; /* NaN patterns (an edge's neighbours): test_special */
    float want = (float)exp((double)x), got = gt_cpu_expf(x);
    checked++;
    if (isinf(want) || want == 0.0f) {
        /* overflow: +inf; underflow: 0, or the smallest subnormal right at the edge */
        bool ok = isinf(want) ? (isinf(got) || ulps(got, FLT_MAX) <= 2) : ulps(got, 0.0f) <= 1;
        if (!ok && bad++ < 5)
            printf("  x %a: exp %a, got %a\n", (double)x, (double)want, (double)got);
        return;
    }
    int64_t u = isinf(got) || isnan(got) ? INT64_MAX : ulps(got, want);
    if (u > worst) worst = u, worst_x = x;
    if (u > 1 && bad++ < 5)
        printf("  x %a: exp %a, got %a (%lld ulp)\n", (double)x, (double)want, (double)got,
               (long long)u);
}

static void test_range(void)
{
    /* the negative and positive f32 patterns with |x| <= 105 / 90 */
    for (uint32_t b = 0; b <= gt_f32_bits(90.0f); b += 61)
        check(gt_bits_f32(b));
    for (uint32_t b = 0x80000000u; b <= gt_f32_bits(-105.0f); b += 61)
        check(gt_bits_f32(b));
    const float edges[] = {-0x1.9fe368p+6f, 0x1.62e43p+6f, -87.33655f,   -87.33654f, 88.7228f,
                           -103.0f,         -104.0f,       0x1p-149f,    -0x1p-149f, 1e-8f,
                           -1e-8f,          0.34657359f,   -0.34657359f, 0.5f,       1.0f};
    for (size_t k = 0; k < sizeof edges / sizeof edges[0]; k++)
        for (int d = -3; d <= 3; d++)
            check(gt_bits_f32((uint32_t)((int64_t)gt_f32_bits(edges[k]) + d)));
    printf("exp: %lld inputs, worst %lld ulp at x = %a, %lld outside 1 ulp\n", (long long)checked,
           (long long)worst, (double)worst_x, (long long)bad);
    EXPECT(bad == 0 && worst <= 1, "%lld inputs beyond 1 ulp; worst %lld ulp at %a", (long long)bad,
           (long long)worst, (double)worst_x);
}

static void test_special(void)
{
    EXPECT(gt_cpu_expf(0.0f) == 1.0f && gt_cpu_expf(-0.0f) == 1.0f, "exp(±0) = %a, %a",
           (double)gt_cpu_expf(0.0f), (double)gt_cpu_expf(-0.0f));
    EXPECT(gt_cpu_expf(-INFINITY) == 0.0f, "exp(-inf) = %a", (double)gt_cpu_expf(-INFINITY));
    EXPECT(isinf(gt_cpu_expf(INFINITY)) && gt_cpu_expf(INFINITY) > 0, "exp(+inf) = %a",
           (double)gt_cpu_expf(INFINITY));
    EXPECT(isnan(gt_cpu_expf(NAN)) && isnan(gt_cpu_expf(-NAN)), "exp(NaN) is not NaN");
    EXPECT(gt_cpu_expf(1000.0f) == INFINITY && gt_cpu_expf(-1000.0f) == 0.0f, "far tails");
}

static void test_array(void)
{
    float x[80], y[80], z[80];
    int mismatches = 0;
    for (int k = 0; k < 80; k++) /* a spread of magnitudes, both signs, some specials */
        x[k] = (k % 7 == 3) ? NAN : (float)((k * 37 % 101) - 50) * 0.9f + (float)k * 0.013f;
    x[11] = INFINITY, x[12] = -INFINITY, x[13] = -0.0f;
    for (int off = 0; off < 8; off++)
        for (int n = 0; n + off <= 70; n++)
            for (int variant = 0; variant < 3; variant++) {
                float sign = variant == 1 ? -1.0f : 1.0f, shift = variant == 2 ? 3.25f : 0.0f;
                memcpy(z, x, sizeof z);
                gt_cpu_exp_n(x + off, y, n, sign, shift);
                if (variant == 2) gt_cpu_exp_n(z + off, z + off, n, sign, shift); /* in place */
                for (int j = 0; j < n; j++) {
                    float want = gt_cpu_expf(sign * x[off + j] - shift);
                    bool same = memcmp(&want, &y[j], sizeof want) == 0 &&
                                (variant != 2 || memcmp(&want, &z[off + j], sizeof want) == 0);
                    mismatches += !same;
                }
            }
    printf("exp_n: vector loop bitwise the scalar exp: %s\n", mismatches ? "NO" : "yes");
    EXPECT(mismatches == 0, "%d elements of gt_cpu_exp_n differ from gt_cpu_expf", mismatches);
}

static uint64_t rng_state = 0x9e3779b97f4a7c15u;
static float uniform(void) /* [0, 1) */
{
    rng_state = rng_state * 6364136223846793005u + 1442695040888963407u;
    return (float)(rng_state >> 40) / 16777216.0f;
}

static void test_sum_max(void)
{
    enum { N = 700 };
    static float x[N], e[N];
    int sum_bad = 0, e_bad = 0, max_bad = 0, lanes_differ = 0, rows = 0;
    for (int kind = 0; kind < 6; kind++)
        for (int n = 1; n <= N; n += (n < 40 ? 1 : 37)) {
            /* 0: within 2 of the max (exact); 1: within 40 (inexact); 2: within 2 up to 300, then
             * within 60 (inexact from a later chunk); 3: within 8 with some -inf and NaN; 4:
             * within 2 with a +inf; 5: exps underflowing to zero among close ones */
            for (int j = 0; j < n; j++) {
                float spread = kind == 1               ? 40.0f
                               : kind == 2 && j >= 300 ? 60.0f
                               : kind == 3             ? 8.0f
                                                       : 2.0f;
                x[j] = -spread * uniform();
                if (kind == 5 && j % 5 == 2) x[j] = -200.0f * uniform() - 104.0f;
            }
            if (kind == 3 && n > 3) x[n / 3] = -INFINITY, x[n / 2] = NAN, x[0] = NAN;
            if (kind == 4) x[n - 1] = INFINITY;
            float m_want = -INFINITY;
            for (int j = 0; j < n; j++)
                m_want = x[j] > m_want ? x[j] : m_want;
            float m = gt_cpu_max_n(x, n);
            max_bad += !(m == m_want);
            float shift = kind == 4 ? 0.0f : m_want;
            double want = 0.0, lane[16] = {0};
            for (int j = 0; j < n; j++) {
                float ej = gt_cpu_expf(x[j] - shift);
                want += ej;
                lane[j % 16] += ej;
            }
            double lanes = 0.0;
            for (int l = 0; l < 16; l++)
                lanes += lane[l];
            if (kind == 1 || kind == 2) lanes_differ += memcmp(&lanes, &want, sizeof want) != 0;
            double got = gt_cpu_exp_sum(x, e, n, shift);
            double got_null = gt_cpu_exp_sum(x, NULL, n, shift);
            sum_bad +=
                memcmp(&got, &want, sizeof want) != 0 || memcmp(&got_null, &want, sizeof want);
            for (int j = 0; j < n; j++) {
                float ej = gt_cpu_expf(x[j] - shift);
                e_bad += memcmp(&ej, &e[j], sizeof ej) != 0;
            }
            rows++;
        }
    printf(
        "exp_sum: %d rows bitwise the ordered sum: %s (a 16-lane sum differs on %d inexact rows); "
        "max_n: %s\n",
        rows, sum_bad || e_bad ? "NO" : "yes", lanes_differ, max_bad ? "NO" : "yes");
    EXPECT(sum_bad == 0, "%d rows of gt_cpu_exp_sum differ from the ordered sum", sum_bad);
    EXPECT(e_bad == 0, "%d exps written by gt_cpu_exp_sum differ from gt_cpu_expf", e_bad);
    EXPECT(lanes_differ > 10,
           "only %d inexact rows where a lane sum differs: the rows do not test "
           "the exactness condition",
           lanes_differ);
    EXPECT(max_bad == 0, "%d rows of gt_cpu_max_n differ from the ordered max", max_bad);
}

int main(void)
{
    test_special();
    test_array();
    test_sum_max();
    test_range();
    return gt_test_finish();
}
