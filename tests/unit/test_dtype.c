/* test_dtype.c — dtype table and the f32 <-> bf16 / f16 conversions, against a reference that
 * picks the nearest representable value by comparing distances in double (ties to the even
 * pattern), independent of the bit tricks in dtype.c. */
#include "graphtrain/gt_core.h"
#include "gt_test.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rnd32(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 2685821657736338717ull) >> 32);
}

/* Value of a non-negative bf16 / f16 pattern from the format definition; the all-ones exponent
 * with zero mantissa (inf) is treated as the next power of two, which is what rounding compares
 * against (IEEE: overflow rounds to inf exactly when the ideal rounding would exceed the max). */
static double bf16_value(uint16_t h)
{
    int e = (h >> 7) & 0xff, m = h & 0x7f;
    if (e == 0) return ldexp(m, -133); /* 2^-126 * m / 128 */
    return ldexp(1.0 + m / 128.0, e - 127);
}
static double f16_value(uint16_t h)
{
    int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    if (e == 0) return ldexp(m, -24);
    return ldexp(1.0 + m / 1024.0, e - 15);
}

/* Nearest pattern by distance, ties to even; patterns are monotone in value. */
static uint16_t ref_round(double x, double (*value)(uint16_t), uint16_t inf_pattern)
{
    uint16_t sign = 0;
    if (x < 0 || (x == 0 && signbit(x))) sign = 0x8000, x = -x;
    uint16_t lo = 0, hi = inf_pattern; /* largest lo with value(lo) <= x */
    while (lo < hi) {
        uint16_t mid = (uint16_t)((lo + hi + 1) / 2);
        if (value(mid) <= x)
            lo = mid;
        else
            hi = (uint16_t)(mid - 1);
    }
    if (lo == inf_pattern) return sign | inf_pattern;
    double dlo = x - value(lo), dhi = value((uint16_t)(lo + 1)) - x;
    uint16_t r = lo;
    if (dhi < dlo || (dhi == dlo && (lo & 1))) r = (uint16_t)(lo + 1);
    return sign | r;
}

static void test_table(void)
{
    const struct {
        gt_dtype dt;
        size_t size;
        const char *name;
        bool is_float;
    } t[] = {{GT_F32, 4, "f32", true},  {GT_BF16, 2, "bf16", true}, {GT_F16, 2, "f16", true},
             {GT_I32, 4, "i32", false}, {GT_I64, 8, "i64", false},  {GT_BOOL, 1, "bool", false}};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        EXPECT(gt_dtype_size(t[i].dt) == t[i].size, "size of %s", t[i].name);
        EXPECT(strcmp(gt_dtype_name(t[i].dt), t[i].name) == 0, "name %s", t[i].name);
        EXPECT(gt_dtype_is_float(t[i].dt) == t[i].is_float, "is_float %s", t[i].name);
        gt_dtype d = GT_DTYPE_COUNT;
        EXPECT(gt_dtype_from_name(t[i].name, &d) && d == t[i].dt, "from_name %s", t[i].name);
    }
    const char *alias[] = {"float32", "bfloat16", "float16", "int32", "int64"};
    gt_dtype want[] = {GT_F32, GT_BF16, GT_F16, GT_I32, GT_I64};
    for (int i = 0; i < 5; i++) {
        gt_dtype d = GT_DTYPE_COUNT;
        EXPECT(gt_dtype_from_name(alias[i], &d) && d == want[i], "alias %s", alias[i]);
    }
    gt_dtype d;
    EXPECT(!gt_dtype_from_name("float64", &d) && !gt_dtype_from_name("", &d) &&
               !gt_dtype_from_name(NULL, &d) && !gt_dtype_from_name("F32", &d),
           "unknown names rejected");
    /* the exact widenings a sum may store: bf16 and f16 into f32, nothing else */
    for (int from = 0; from < GT_DTYPE_COUNT; from++)
        for (int to = 0; to < GT_DTYPE_COUNT; to++) {
            bool want_widen = to == GT_F32 && (from == GT_BF16 || from == GT_F16);
            EXPECT(gt_dtype_widens_to_f32((gt_dtype)from, (gt_dtype)to) == want_widen,
                   "widens %s -> %s", gt_dtype_name((gt_dtype)from), gt_dtype_name((gt_dtype)to));
        }
}

/* Every 16-bit pattern: widening is exact (compare with the format definition) and narrowing
 * gives the pattern back; NaN patterns stay NaN. */
static void test_exhaustive_16(void)
{
    int bad_bf = 0, bad_h = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float fb = gt_bf16_to_f32((uint16_t)h), fh = gt_f16_to_f32((uint16_t)h);
        bool bf_nan = ((h >> 7) & 0xff) == 0xff && (h & 0x7f);
        bool h_nan = ((h >> 10) & 0x1f) == 0x1f && (h & 0x3ff);
        bool bf_inf = ((h >> 7) & 0xff) == 0xff && !(h & 0x7f);
        bool h_inf = ((h >> 10) & 0x1f) == 0x1f && !(h & 0x3ff);
        double sb = (h & 0x8000) ? -1.0 : 1.0;
        if (bf_nan)
            bad_bf += !isnan(fb) || !isnan(gt_bf16_to_f32(gt_f32_to_bf16(fb)));
        else if (bf_inf)
            bad_bf += !(isinf(fb) && (fb < 0) == (sb < 0));
        else
            bad_bf +=
                (double)fb != sb * bf16_value((uint16_t)(h & 0x7fff)) || gt_f32_to_bf16(fb) != h;
        if (h_nan)
            bad_h += !isnan(fh) || !isnan(gt_f16_to_f32(gt_f32_to_f16(fh)));
        else if (h_inf)
            bad_h += !(isinf(fh) && (fh < 0) == (sb < 0));
        else
            bad_h += (double)fh != sb * f16_value((uint16_t)(h & 0x7fff)) || gt_f32_to_f16(fh) != h;
    }
    EXPECT(bad_bf == 0, "%d bf16 patterns wrong", bad_bf);
    EXPECT(bad_h == 0, "%d f16 patterns wrong", bad_h);
}

static void check_one(float x, int *bad_bf, int *bad_h)
{
    uint16_t rb = ref_round((double)x, bf16_value, 0x7f80);
    uint16_t rh = ref_round((double)x, f16_value, 0x7c00);
    uint16_t gb = gt_f32_to_bf16(x), gh = gt_f32_to_f16(x);
    if (gb != rb && (*bad_bf)++ < 5)
        fprintf(stderr, "bf16(%a) = %04x, want %04x\n", (double)x, gb, rb);
    if (gh != rh && (*bad_h)++ < 5)
        fprintf(stderr, "f16(%a) = %04x, want %04x\n", (double)x, gh, rh);
}

static void test_rounding(void)
{
    int bad_bf = 0, bad_h = 0;
    /* random f32 across the whole finite range (bf16) and around the f16 range */
    for (int i = 0; i < 200000; i++) {
        uint32_t u = rnd32();
        float x = gt_bits_f32(u);
        if (!isfinite(x)) continue;
        check_one(x, &bad_bf, &bad_h);
        /* exponent squeezed into [2^-30, 2^17): f16 subnormals, normals, overflow */
        uint32_t e = 97 + rnd32() % 47;
        check_one(gt_bits_f32((u & 0x807fffffu) | (e << 23)), &bad_bf, &bad_h);
    }
    /* exact midpoints and their neighbours (ties to even), all f16 / bf16 neighbours */
    for (uint32_t h = 0; h < 0x7c00; h++) {
        double mid = (f16_value((uint16_t)h) + f16_value((uint16_t)(h + 1))) / 2;
        float m = (float)mid; /* exact: 12 significant bits */
        check_one(m, &bad_bf, &bad_h);
        check_one(nextafterf(m, 0), &bad_bf, &bad_h);
        check_one(nextafterf(m, INFINITY), &bad_bf, &bad_h);
        check_one(-m, &bad_bf, &bad_h);
    }
    for (uint32_t h = 0; h < 0x7f80; h += 7) {
        float m = (float)((bf16_value((uint16_t)h) + bf16_value((uint16_t)(h + 1))) / 2);
        check_one(m, &bad_bf, &bad_h);
        check_one(nextafterf(m, 0), &bad_bf, &bad_h);
        check_one(-nextafterf(m, INFINITY), &bad_bf, &bad_h);
    }
    EXPECT(bad_bf == 0, "%d bf16 roundings differ from the reference", bad_bf);
    EXPECT(bad_h == 0, "%d f16 roundings differ from the reference", bad_h);
}

static void test_specials(void)
{
    EXPECT(gt_f32_to_f16(65504.0f) == 0x7bff, "f16 max");
    EXPECT(gt_f32_to_f16(65519.99f) == 0x7bff, "just below the midpoint stays finite");
    EXPECT(gt_f32_to_f16(65520.0f) == 0x7c00, "midpoint 65520 rounds to inf (even)");
    EXPECT(gt_f32_to_f16(-1e6f) == 0xfc00, "overflow gives -inf");
    EXPECT(gt_f32_to_bf16(FLT_MAX) == 0x7f80, "FLT_MAX rounds to bf16 inf");
    EXPECT(gt_f32_to_f16(0x1p-24f) == 0x0001, "smallest f16 subnormal");
    EXPECT(gt_f32_to_f16(0x1p-25f) == 0x0000, "half the smallest subnormal ties to 0");
    EXPECT(gt_f32_to_f16(0x1.8p-24f) == 0x0002, "1.5 units ties to 2 (even)");
    EXPECT(gt_f32_to_f16(0x1p-14f) == 0x0400, "smallest f16 normal");
    EXPECT(gt_f32_to_f16(-0.0f) == 0x8000 && gt_f32_to_bf16(-0.0f) == 0x8000, "-0 keeps its sign");
    EXPECT(gt_f16_to_f32(0x0001) == 0x1p-24f, "subnormal widens exactly");
    EXPECT(gt_f32_to_bf16(1.0f) == 0x3f80 && gt_bf16_to_f32(0x3f80) == 1.0f, "bf16 1.0");
    EXPECT(gt_f32_to_f16(1.0f) == 0x3c00 && gt_f16_to_f32(0x3c00) == 1.0f, "f16 1.0");
    /* NaNs: quiet and signalling, both signs; the result is a NaN with the quiet bit set */
    uint32_t nans[] = {0x7fc00000u, 0x7f800001u, 0xffc00001u, 0xff800100u, 0x7fffffffu};
    for (int i = 0; i < 5; i++) {
        float n = gt_bits_f32(nans[i]);
        uint16_t b = gt_f32_to_bf16(n), h = gt_f32_to_f16(n);
        EXPECT((b & 0x7f80) == 0x7f80 && (b & 0x0040), "bf16 NaN %08x -> %04x", nans[i], b);
        EXPECT((h & 0x7c00) == 0x7c00 && (h & 0x0200), "f16 NaN %08x -> %04x", nans[i], h);
        EXPECT(((b ^ (nans[i] >> 16)) & 0x8000) == 0, "bf16 NaN sign");
        EXPECT(isnan(gt_bf16_to_f32(b)) && isnan(gt_f16_to_f32(h)), "NaN widens to NaN");
        EXPECT(gt_f32_bits(gt_f16_to_f32(0x7c01)) & 0x00400000u, "signalling f16 NaN widens quiet");
    }
    EXPECT(gt_f32_to_bf16(INFINITY) == 0x7f80 && gt_f32_to_f16(-INFINITY) == 0xfc00, "inf");
}

/* The array conversions (vectorized) against the scalar ones checked above, bit for bit: every
 * bf16 pattern, and f32 patterns drawn at random plus every exponent with tie and NaN mantissas,
 * converted at every offset 0..7 and length 0..67 so the vector loops' heads and tails run too. */
static void test_arrays(void)
{
    enum { N = 1 << 16, M = 1 << 18 };
    uint16_t *h = malloc(N * sizeof *h), *hb = malloc(M * sizeof *hb);
    float *f = malloc(M * sizeof *f), *w = malloc(M * sizeof *w);
    for (uint32_t i = 0; i < N; i++)
        h[i] = (uint16_t)i;
    gt_bf16_to_f32_n(h, w, N);
    int bad = 0;
    for (uint32_t i = 0; i < N; i++)
        bad += gt_f32_bits(w[i]) != gt_f32_bits(gt_bf16_to_f32(h[i]));
    EXPECT(bad == 0, "bf16 -> f32 arrays: %d of %d patterns differ from the scalar", bad, N);
    for (uint32_t i = 0; i < M; i++) {
        uint32_t u = rnd32();
        if (i % 4 == 1) u = (u & 0xff800000u) | 0x8000u | (u & 0x10000u); /* ties */
        if (i % 4 == 2) u = (u & 0x807fffffu) | 0x7f800000u;              /* inf, NaNs */
        f[i] = gt_bits_f32(u);
    }
    int bad_n = 0, bad_r = 0;
    for (int off = 0; off < 8; off++)
        for (int len = 0; len < 68; len++) {
            gt_f32_to_bf16_n(f + off * 997 + len, hb, len);
            memcpy(w, f + off * 997 + len, (size_t)len * sizeof *w);
            gt_f32_round_bf16_n(w, len);
            for (int i = 0; i < len; i++) {
                float x = f[off * 997 + len + i];
                bad_n += hb[i] != gt_f32_to_bf16(x);
                bad_r += gt_f32_bits(w[i]) != gt_f32_bits(gt_bf16_to_f32(gt_f32_to_bf16(x)));
            }
        }
    gt_f32_to_bf16_n(f, hb, M);
    memcpy(w, f, M * sizeof *w);
    gt_f32_round_bf16_n(w, M);
    for (uint32_t i = 0; i < M; i++) {
        bad_n += hb[i] != gt_f32_to_bf16(f[i]);
        bad_r += gt_f32_bits(w[i]) != gt_f32_bits(gt_bf16_to_f32(gt_f32_to_bf16(f[i])));
    }
    EXPECT(bad_n == 0, "f32 -> bf16 arrays: %d values differ from the scalar", bad_n);
    EXPECT(bad_r == 0, "bf16 rounding in place: %d values differ from the scalar", bad_r);
    free(h);
    free(hb);
    free(f);
    free(w);
}

int main(void)
{
    test_table();
    test_exhaustive_16();
    test_rounding();
    test_specials();
    test_arrays();
    return gt_test_finish();
}
