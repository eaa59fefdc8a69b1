/* philox.c — Philox4x32-10 (Salmon, Moraes, Dror, Shaw, "Parallel random numbers: as easy as
 * 1, 2, 3", SC 2011) and the samplers built on it.
 *
 * One round maps counter (c0, c1, c2, c3) and key (k0, k1) to
 *     (hi(M1*c2) ^ c1 ^ k0,  lo(M1*c2),  hi(M0*c0) ^ c3 ^ k1,  lo(M0*c0))
 * with M0 = 0xD2511F53, M1 = 0xCD9E8D57 (hi/lo: the halves of the 64-bit product); between rounds
 * the key is bumped by the Weyl constants (0x9E3779B9, 0xBB67AE85). Ten rounds.
 *
 * graphtrain's mapping of (seed, stream, index, round) onto Philox:
 *     key     = { lo32(seed), hi32(seed) }
 *     counter = { lo32(index), hi32(index), lo32(stream), hi32(stream) + round }   (mod 2^32)
 * so element `index` of a stream depends on nothing else, and redrawing (round > 0) never touches
 * a neighbour's counter. Round r of stream s aliases round 0 of stream s + r*2^32; streams are
 * 64-bit hashes of fqns, so an overlap has probability ~ (rounds used) * (streams) / 2^64. */
#include "core/rng_shared.h"
#include "graphtrain/gt_core.h"

#include <math.h>
#include <string.h>

void gt_philox4x32(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4])
{
    uint32_t c[4] = {counter[0], counter[1], counter[2], counter[3]};
    gt_philox_rounds(c, key[0], key[1]);
    memcpy(out, c, sizeof c);
}

void gt_rng_bits(uint64_t seed, uint64_t stream, uint64_t index, uint32_t round, uint32_t out[4])
{
    gt_philox_bits(seed, stream, index, round, out);
}

double gt_rng_uniform(uint64_t seed, uint64_t stream, uint64_t index, uint32_t round)
{
    uint32_t w[4];
    gt_rng_bits(seed, stream, index, round, w);
    return gt_u53(w[0], w[1]);
}

/* ---------------------------------------------------------------- the sampler's own log and cos
 *
 * Box–Muller needs ln and cos. libm's differ between libraries and machines in their last bit,
 * which can change the f32 a parameter rounds to, so the sampler evaluates its own from +, -, *, /
 * and sqrt alone, in a fixed order (philox.c is compiled with -ffp-contract=off: no fused
 * multiply-adds), and gets the same bits wherever IEEE doubles round to nearest. Both are within a
 * few ulps of the true values; the samples' distribution is what matters (test_philox).
 *
 * Each works on GT_RNG_LANES independent elements at once, every step over all lanes before the
 * next, so that the compiler keeps the lanes in vector registers and their dependency chains
 * (Philox's rounds, a division, Horner's polynomials) overlap: several times faster than one
 * element at a time. The one-element entry points run the same code (their value in every lane),
 * so both give the same bits. */
#define GT_RNG_LANES 8

/* The lanes are written for the vector unit: on x86-64 the batch entry point is also compiled for
 * AVX-512 (x86-64-v4: 64-bit lane conversions and compares) and picked at load time where the CPU
 * has it, 2.2x the SSE2 baseline on this project's VM (an AVX2 clone was no faster). Every lane
 * operation is an IEEE add, multiply, divide or square root (no FMA: -ffp-contract=off), so both
 * give the same bits. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define GT_RNG_CLONES __attribute__((target_clones("arch=x86-64-v4", "default")))
#else
#define GT_RNG_CLONES
#endif
#define GT_RNG_INLINE static inline __attribute__((always_inline))


/* Philox4x32-10 of GT_RNG_LANES counters (index + l, index's high word, stream, stream's high
 * word + round) side by side: gt_philox4x32's rounds, lane by lane. */
GT_RNG_INLINE void philox_lanes(uint64_t seed, uint64_t stream, uint64_t index, uint32_t round,
                                uint32_t w[4][GT_RNG_LANES])
{
    uint32_t c0[GT_RNG_LANES], c1[GT_RNG_LANES], c2[GT_RNG_LANES], c3[GT_RNG_LANES];
    for (int l = 0; l < GT_RNG_LANES; l++) {
        uint64_t i = index + (uint64_t)l;
        c0[l] = (uint32_t)i, c1[l] = (uint32_t)(i >> 32);
        c2[l] = (uint32_t)stream, c3[l] = (uint32_t)(stream >> 32) + round;
    }
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int r = 0; r < 10; r++) {
        if (r > 0) {
            k0 += GT_PHILOX_W0;
            k1 += GT_PHILOX_W1;
        }
        for (int l = 0; l < GT_RNG_LANES; l++) {
            uint64_t p0 = (uint64_t)GT_PHILOX_M0 * c0[l];
            uint64_t p1 = (uint64_t)GT_PHILOX_M1 * c2[l];
            uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1[l] ^ k0;
            uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3[l] ^ k1;
            c1[l] = (uint32_t)p1, c3[l] = (uint32_t)p0;
            c0[l] = n0, c2[l] = n2;
        }
    }
    for (int l = 0; l < GT_RNG_LANES; l++)
        w[0][l] = c0[l], w[1][l] = c1[l], w[2][l] = c2[l], w[3][l] = c3[l];
}

/* ln x for positive normal doubles: x = 2^e m with m in [sqrt(1/2), sqrt(2)), and
 * ln m = 2 atanh(s) = 2 (s + s^3/3 + s^5/5 + ...) with s = (m - 1) / (m + 1), |s| <= 0.1716: the
 * series to s^21 leaves under 1e-17. ln 2 is split in a head whose products with e are exact and
 * a tail. */
GT_RNG_INLINE void log_lanes(const double *x, double *out)
{
    static const double inv_odd[] = GT_RNG_LOG_INV_ODD;
    const double ln2_hi = GT_RNG_LN2_HI, ln2_lo = GT_RNG_LN2_LO;
    double e[GT_RNG_LANES], s[GT_RNG_LANES], z[GT_RNG_LANES], p[GT_RNG_LANES];
    for (int l = 0; l < GT_RNG_LANES; l++) {
        uint64_t b = gt_rng_to_bits(x[l]);
        double m = gt_rng_from_bits((b & 0x000FFFFFFFFFFFFFull) | 0x3FF0000000000000ull);
        double big = m > 1.4142135623730951 ? 1.0 : 0.0;
        m = m - big * 0.5 * m; /* m / 2 when big: both exact */
        /* the biased exponent as a double, exactly, without an integer conversion */
        e[l] = (gt_rng_small_int(b >> 52) - 1023.0) + big;
        s[l] = (m - 1.0) / (m + 1.0);
        z[l] = s[l] * s[l];
        p[l] = GT_RNG_LOG_FIRST;
    }
    for (int k = 0; k < (int)(sizeof inv_odd / sizeof inv_odd[0]); k++)
        for (int l = 0; l < GT_RNG_LANES; l++)
            p[l] = p[l] * z[l] + inv_odd[k];
    for (int l = 0; l < GT_RNG_LANES; l++) {
        double ln_m = 2.0 * s[l] + 2.0 * s[l] * (z[l] * p[l]);
        out[l] = e[l] * ln2_hi + (e[l] * ln2_lo + ln_m);
    }
}

/* cos(2 pi x) for x in [0, 1]: x = q/4 + r with q = round(4x) and |r| <= 1/8 (both exact), then
 * t = 2 pi r, |t| <= pi/4, and cos(2 pi x) is cos t, -sin t, -cos t or sin t by q mod 4, each a
 * Taylor polynomial to t^16 / t^17 (remainder under 2e-18). */
GT_RNG_INLINE void cos2pi_lanes(const double *x, double *out)
{
    static const double cos_c[] = GT_RNG_COS_C;
    static const double sin_c[] = GT_RNG_SIN_C;
    double t[GT_RNG_LANES], z[GT_RNG_LANES], c[GT_RNG_LANES], sn[GT_RNG_LANES];
    uint64_t q[GT_RNG_LANES];
    for (int l = 0; l < GT_RNG_LANES; l++) {
        /* 4x rounded to the nearest integer (ties to even) by adding and taking away 1.5 * 2^52,
         * whose sum holds that integer in its low mantissa bits */
        double big = 4.0 * x[l] + 0x1.8p52;
        q[l] = gt_rng_to_bits(big) & 3;
        t[l] = 6.283185307179586 * (x[l] - 0.25 * (big - 0x1.8p52));
        z[l] = t[l] * t[l];
        c[l] = GT_RNG_COS_FIRST;
        sn[l] = GT_RNG_SIN_FIRST;
    }
    for (int k = 0; k < (int)(sizeof cos_c / sizeof cos_c[0]); k++)
        for (int l = 0; l < GT_RNG_LANES; l++)
            c[l] = c[l] * z[l] + cos_c[k];
    for (int k = 0; k < (int)(sizeof sin_c / sizeof sin_c[0]); k++)
        for (int l = 0; l < GT_RNG_LANES; l++)
            sn[l] = sn[l] * z[l] + sin_c[k];
    for (int l = 0; l < GT_RNG_LANES; l++) {
        double sv = t[l] + t[l] * (z[l] * sn[l]);
        double v = q[l] & 1 ? sv : c[l];
        out[l] = (q[l] + 1) & 2 ? -v : v; /* q = 1, 2: negated */
    }
}

/* f(x) through a lane function: x in every lane. */
static double one_lane(void (*f)(const double *, double *), double x)
{
    double in[GT_RNG_LANES], out[GT_RNG_LANES];
    for (int l = 0; l < GT_RNG_LANES; l++)
        in[l] = x;
    f(in, out);
    return out[0];
}

double gt_rng_log(double x)
{
    return one_lane(log_lanes, x);
}

double gt_rng_cos2pi(double x)
{
    return one_lane(cos2pi_lanes, x);
}

/* Box–Muller: with u1, u2 uniform in (0, 1), sqrt(-2 ln u1) * cos(2 pi u2) is standard normal.
 * u1 comes from words 0-1 of the round (the same number gt_rng_uniform gives), u2 from words 2-3.
 * Elements index .. index + GT_RNG_LANES - 1 of round `round`. */
GT_RNG_INLINE void normal_lanes(uint64_t seed, uint64_t stream, uint64_t index, uint32_t round,
                                double *out)
{
    uint32_t w[4][GT_RNG_LANES];
    double u1[GT_RNG_LANES], u2[GT_RNG_LANES], ln[GT_RNG_LANES], cs[GT_RNG_LANES];
    philox_lanes(seed, stream, index, round, w);
    for (int l = 0; l < GT_RNG_LANES; l++) {
        u1[l] = gt_u53(w[0][l], w[1][l]);
        u2[l] = gt_u53(w[2][l], w[3][l]);
    }
    log_lanes(u1, ln);
    cos2pi_lanes(u2, cs);
    for (int l = 0; l < GT_RNG_LANES; l++)
        out[l] = sqrt(-2.0 * ln[l]) * cs[l];
}

double gt_rng_normal(uint64_t seed, uint64_t stream, uint64_t index, uint32_t round)
{
    uint32_t w[4];
    gt_rng_bits(seed, stream, index, round, w);
    double ln = gt_rng_log(gt_u53(w[0], w[1]));
    return sqrt(-2.0 * ln) * gt_rng_cos2pi(gt_u53(w[2], w[3]));
}

GT_RNG_CLONES void gt_rng_normal_n(uint64_t seed, uint64_t stream, uint64_t index, int64_t n,
                                   double *out)
{
    double tail[GT_RNG_LANES];
    for (int64_t k = 0; k < n; k += GT_RNG_LANES) {
        if (n - k >= GT_RNG_LANES) {
            normal_lanes(seed, stream, index + (uint64_t)k, 0, out + k);
        } else {
            normal_lanes(seed, stream, index + (uint64_t)k, 0, tail);
            memcpy(out + k, tail, (size_t)(n - k) * sizeof *out);
        }
    }
}

/* Rejection: draw mean + std * N(0, 1) with rounds 0, 1, 2, … until it lands in [lo, hi]. Exact
 * truncated normal as long as it terminates; the expected number of rounds is
 * 1 / (Phi((hi-mean)/std) - Phi((lo-mean)/std)), small whenever the interval covers a fair part of
 * the mass (torch's default [-2, 2] std: 1.05 rounds). After GT_TRUNC_NORMAL_MAX_ROUNDS misses
 * (an interval far in a tail) the last draw is clamped into [lo, hi], which is biased but bounded,
 * deterministic and never loops forever. A degenerate std <= 0 gives mean clamped. */
#define GT_TRUNC_NORMAL_MAX_ROUNDS 1000u

static double gt_clamp(double x, double lo, double hi)
{
    return x < lo ? lo : (x > hi ? hi : x);
}

double gt_rng_trunc_normal(uint64_t seed, uint64_t stream, uint64_t index, double mean, double std,
                           double lo, double hi)
{
    if (!(std > 0.0)) return gt_clamp(mean, lo, hi);
    double x = mean;
    for (uint32_t round = 0; round < GT_TRUNC_NORMAL_MAX_ROUNDS; round++) {
        x = mean + std * gt_rng_normal(seed, stream, index, round);
        if (x >= lo && x <= hi) return x;
    }
    return gt_clamp(x, lo, hi);
}
