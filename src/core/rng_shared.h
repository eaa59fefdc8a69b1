/* rng_shared.h — the pieces of the parameter sampler (src/core/philox.c) that the device's
 * parameter initialisation (src/backend/cuda/cuda_init.cu) repeats and must give the same bits
 * for: Philox4x32-10's rounds and graphtrain's counter mapping, the exact bit-level conversions
 * behind the 53-bit uniforms, and the coefficients of the sampler's own ln and cos(2 pi x).
 * philox.c evaluates ln and cos over vector lanes, cuda_init.cu one element per thread; both take
 * their coefficients from here. */
#ifndef GT_RNG_SHARED_H
#define GT_RNG_SHARED_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define GT_RNG_HD __host__ __device__
#else
#define GT_RNG_HD
#endif

#define GT_PHILOX_M0 0xD2511F53u
#define GT_PHILOX_M1 0xCD9E8D57u
#define GT_PHILOX_W0 0x9E3779B9u
#define GT_PHILOX_W1 0xBB67AE85u

/* c: the counter in, the output out; key (k0, k1), bumped by the Weyl constants between rounds */
GT_RNG_HD static inline void gt_philox_rounds(uint32_t c[4], uint32_t k0, uint32_t k1)
{
    uint32_t c0 = c[0], c1 = c[1], c2 = c[2], c3 = c[3];
    for (int r = 0; r < 10; r++) {
        if (r > 0) {
            k0 += GT_PHILOX_W0;
            k1 += GT_PHILOX_W1;
        }
        uint64_t p0 = (uint64_t)GT_PHILOX_M0 * c0;
        uint64_t p1 = (uint64_t)GT_PHILOX_M1 * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c1 = (uint32_t)p1, c3 = (uint32_t)p0;
        c0 = n0, c2 = n2;
    }
    c[0] = c0, c[1] = c1, c[2] = c2, c[3] = c3;
}

/* gt_rng_bits (philox.c): key = (lo32 seed, hi32 seed), counter = (lo32 index, hi32 index,
 * lo32 stream, hi32 stream + round) */
GT_RNG_HD static inline void gt_philox_bits(uint64_t seed, uint64_t stream, uint64_t index,
                                            uint32_t round, uint32_t out[4])
{
    out[0] = (uint32_t)index, out[1] = (uint32_t)(index >> 32);
    out[2] = (uint32_t)stream, out[3] = (uint32_t)(stream >> 32) + round;
    gt_philox_rounds(out, (uint32_t)seed, (uint32_t)(seed >> 32));
}

GT_RNG_HD static inline uint64_t gt_rng_to_bits(double x)
{
    uint64_t b;
    memcpy(&b, &x, sizeof b);
    return b;
}

GT_RNG_HD static inline double gt_rng_from_bits(uint64_t b)
{
    double x;
    memcpy(&x, &b, sizeof x);
    return x;
}

/* (double)v for v < 2^52, exactly, by bits: 2^52 + v has v as its mantissa. Vectorizes where an
 * integer-to-double conversion of 64-bit lanes does not (SSE2, AVX2). */
GT_RNG_HD static inline double gt_rng_small_int(uint64_t v)
{
    return gt_rng_from_bits(0x4330000000000000ull | v) - 0x1p52;
}

/* 53 random bits from two words -> x * 2^-53 in [0, 1 - 2^-53]. x = 0 (probability 2^-53) maps
 * to 2^-54 instead, so the result is never 0 (log-safe) and never 1. A centred (x + 0.5) * 2^-53
 * would be nicer but is not representable near 1 (it would round up to 1.0). x is converted as
 * its two halves (each exact, and so is their sum) and selected without a branch, so the
 * sampler's lanes vectorize it too. */
GT_RNG_HD static inline double gt_u53(uint32_t hi, uint32_t lo)
{
    uint64_t x = (((uint64_t)hi << 32) | lo) >> 11;
    double u = (gt_rng_small_int(x >> 32) * 0x1p32 + gt_rng_small_int(x & 0xFFFFFFFFull)) * 0x1p-53;
    return x == 0 ? 0x1p-54 : u;
}

/* ln: 2 atanh(s) = 2 (s + s^3/3 + ... + s^21/21), Horner from 1/21 through these; ln 2 as a head
 * whose products with the exponent are exact and a tail */
#define GT_RNG_LOG_INV_ODD                                                                         \
    {                                                                                              \
        1.0 / 19, 1.0 / 17, 1.0 / 15, 1.0 / 13, 1.0 / 11, 1.0 / 9, 1.0 / 7, 1.0 / 5, 1.0 / 3       \
    }
#define GT_RNG_LOG_FIRST (1.0 / 21)
#define GT_RNG_LN2_HI 0x1.62e42fefa0000p-1
#define GT_RNG_LN2_LO 0x1.cf79abc9e3b3ap-40
/* cos t and sin t / t as Taylor polynomials in z = t^2, Horner from 1/16! and 1/17! */
#define GT_RNG_COS_C                                                                               \
    {                                                                                              \
        -1.0 / 87178291200.0, 1.0 / 479001600.0, -1.0 / 3628800.0, 1.0 / 40320.0, -1.0 / 720.0,    \
            1.0 / 24.0, -0.5, 1.0                                                                  \
    }
#define GT_RNG_SIN_C                                                                               \
    {                                                                                              \
        -1.0 / 1307674368000.0, 1.0 / 6227020800.0, -1.0 / 39916800.0, 1.0 / 362880.0,             \
            -1.0 / 5040.0, 1.0 / 120.0, -1.0 / 6.0                                                 \
    }
#define GT_RNG_COS_FIRST (1.0 / 20922789888000.0)
#define GT_RNG_SIN_FIRST (1.0 / 355687428096000.0)

#endif
