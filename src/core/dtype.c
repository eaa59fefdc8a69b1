/* dtype.c — dtype table and the bf16/f16 <-> f32 conversions.
 *
 * Bit layouts: f32 = 1 sign, 8 exponent (bias 127), 23 mantissa; bf16 = the top 16 bits of an f32
 * (1, 8, 7); f16 = 1 sign, 5 exponent (bias 15), 10 mantissa, subnormals down to 2^-24.
 * Narrowing rounds to nearest, ties to even; NaN stays a (quiet) NaN with its sign; values too big
 * for the target give inf of the same sign. Widening is exact. */
#include "graphtrain/gt_core.h"

#include <string.h>

size_t gt_dtype_size(gt_dtype dt)
{
    switch (dt) {
    case GT_F32:
        return 4;
    case GT_BF16:
        return 2;
    case GT_F16:
        return 2;
    case GT_I32:
        return 4;
    case GT_I64:
        return 8;
    case GT_BOOL:
        return 1;
    case GT_DTYPE_COUNT:
        break;
    }
    return 0;
}

const char *gt_dtype_name(gt_dtype dt)
{
    switch (dt) {
    case GT_F32:
        return "f32";
    case GT_BF16:
        return "bf16";
    case GT_F16:
        return "f16";
    case GT_I32:
        return "i32";
    case GT_I64:
        return "i64";
    case GT_BOOL:
        return "bool";
    case GT_DTYPE_COUNT:
        break;
    }
    return "?";
}

bool gt_dtype_from_name(const char *name, gt_dtype *out)
{
    static const struct {
        const char *name;
        gt_dtype dt;
    } names[] = {
        {"f32", GT_F32}, {"float32", GT_F32}, {"bf16", GT_BF16}, {"bfloat16", GT_BF16},
        {"f16", GT_F16}, {"float16", GT_F16}, {"i32", GT_I32},   {"int32", GT_I32},
        {"i64", GT_I64}, {"int64", GT_I64},   {"bool", GT_BOOL},
    };
    if (!name) return false;
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        if (strcmp(name, names[k].name) == 0) {
            if (out) *out = names[k].dt;
            return true;
        }
    }
    return false;
}

bool gt_dtype_is_float(gt_dtype dt)
{
    return dt == GT_F32 || dt == GT_BF16 || dt == GT_F16;
}

bool gt_dtype_widens_to_f32(gt_dtype from, gt_dtype to)
{
    return to == GT_F32 && (from == GT_BF16 || from == GT_F16);
}

/* The bf16 rules on bit patterns, branch-free so that the array loops below vectorize; the scalar
 * conversions are the same functions.
 * Widening: the bf16 bits on top, a NaN made quiet.
 * Narrowing: round to nearest even on the 16 dropped bits (add 0x7fff, plus 1 when the kept lsb is
 * odd; a carry out of the mantissa bumps the exponent, which is exactly right, and the largest
 * finite values round up into 0x7f80 = inf); a NaN keeps its top bits, made quiet. */
static inline uint32_t gt_bf16_widen_bits(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    uint32_t nan = ((u & 0x7f800000u) == 0x7f800000u) & ((u & 0x007fffffu) != 0);
    return u | ((0u - nan) & 0x00400000u);
}

static inline uint32_t gt_bf16_narrow_bits(uint32_t u)
{
    uint32_t nan = (u & 0x7fffffffu) > 0x7f800000u;
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return nan ? (u >> 16) | 0x0040u : rounded;
}

float gt_bf16_to_f32(uint16_t h)
{
    return gt_bits_f32(gt_bf16_widen_bits(h));
}

uint16_t gt_f32_to_bf16(float f)
{
    return (uint16_t)gt_bf16_narrow_bits(gt_f32_bits(f));
}

/* The array forms: the bit rules above element by element (integer operations only, so the vector
 * width cannot change a bit). With GCC on x86-64 also built for x86-64-v3 (AVX2), picked at load
 * time. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define GT_ARRAY_LOOP __attribute__((target_clones("arch=x86-64-v3", "default"), optimize("O3")))
#else
#define GT_ARRAY_LOOP
#endif

GT_ARRAY_LOOP void gt_bf16_to_f32_n(const uint16_t *src, float *dst, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        dst[i] = gt_bits_f32(gt_bf16_widen_bits(src[i]));
}

GT_ARRAY_LOOP void gt_f32_to_bf16_n(const float *src, uint16_t *dst, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        dst[i] = (uint16_t)gt_bf16_narrow_bits(gt_f32_bits(src[i]));
}

/* v[i] = bf16 v[i] widened back: the narrowed bits on top (a quiet NaN stays quiet). */
GT_ARRAY_LOOP void gt_f32_round_bf16_n(float *v, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        v[i] = gt_bits_f32(gt_bf16_narrow_bits(gt_f32_bits(v[i])) << 16);
}

float gt_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0) {
        /* zero or subnormal: mant * 2^-24, exact in f32 */
        float v = (float)mant * 0x1p-24f;
        return sign ? -v : v;
    }
    if (exp == 31) {
        uint32_t u = sign | 0x7f800000u | (mant << 13);
        if (mant) u |= 0x00400000u; /* quiet NaN */
        return gt_bits_f32(u);
    }
    return gt_bits_f32(sign | ((exp + 112u) << 23) | (mant << 13)); /* rebias 15 -> 127 */
}

uint16_t gt_f32_to_f16(float f)
{
    uint32_t u = gt_f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t x = u & 0x7fffffffu;
    if (x >= 0x7f800000u) {
        if (x == 0x7f800000u) return sign | 0x7c00u;              /* inf */
        return (uint16_t)(sign | 0x7e00u | ((x >> 13) & 0x3ffu)); /* quiet NaN */
    }
    /* 65520 = 0x477ff000 is halfway between 65504 (the largest f16, odd mantissa) and 2^16, so it
     * and everything above rounds to inf. */
    if (x >= 0x477ff000u) return sign | 0x7c00u;
    if (x < 0x38800000u) {
        /* Below 2^-14: an f16 subnormal (or zero). The value is m * 2^(e-150) with the implicit
         * bit in m; in units of 2^-24 that is m >> (126 - e), rounded to nearest even. */
        uint32_t e = x >> 23;
        if (e < 102) return sign; /* < 2^-25: below half the smallest subnormal, rounds to 0 */
        uint32_t m = (x & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e; /* 14..24 */
        uint32_t r = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (r & 1u))) r++; /* r may become 0x400: smallest normal */
        return (uint16_t)(sign | r);
    }
    /* Normal: rebias the exponent (127 -> 15) and round the 13 dropped bits to nearest even; a
     * mantissa carry moves into the exponent correctly and cannot pass 0x7bff (checked above). */
    uint32_t v = x - 0x38000000u;
    v += 0x0fffu + ((v >> 13) & 1u);
    return (uint16_t)(sign | (v >> 13));
}
