/* test_cpu_exp.c — gt_cpu_expf, the CPU kernels' exp (cpu_internal.h), against the double exp of
 * libm rounded to f32:
 *   - every 61st f32 bit pattern between -105 and 90 (about 37 million inputs, normal, subnormal
 *     and overflowing results), plus the boundaries and their neighbours: within 1 ulp of the
 *     rounded reference (an ulp of the reference; for subnormal references the subnormal spacing),
 *     0 below the underflow bound and +inf above the overflow one;
 *   - the special inputs: exp(±0) = 1 exactly, exp(-inf) = 0, exp(+inf) = +inf, exp(NaN) is NaN;
 *   - gt_cpu_exp_n (the vectorized loop) bitwise equal to gt_cpu_expf element by element for every
 *     offset and length up to 70, with sign -1 and a shift, in place and not.
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

int main(void)
{
    test_special();
    test_array();
    test_range();
    return gt_test_finish();
}
