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
#include "graphtrain/gt_core.h"

#include <math.h>

#define GT_PHILOX_M0 0xD2511F53u
#define GT_PHILOX_M1 0xCD9E8D57u
#define GT_PHILOX_W0 0x9E3779B9u
#define GT_PHILOX_W1 0xBB67AE85u

void gt_philox4x32(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4])
{
    uint32_t c0 = counter[0], c1 = counter[1], c2 = counter[2], c3 = counter[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int r = 0; r < 10; r++) {
        if (r > 0) {
            k0 += GT_PHILOX_W0;
            k1 += GT_PHILOX_W1;
        }
        uint64_t p0 = (uint64_t)GT_PHILOX_M0 * c0;
        uint64_t p1 = (uint64_t)GT_PHILOX_M1 * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        uint32_t n1 = (uint32_t)p1;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        uint32_t n3 = (uint32_t)p0;
        c0 = n0, c1 = n1, c2 = n2, c3 = n3;
    }
    out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

void gt_rng_bits(uint64_t seed, uint64_t stream, uint64_t index, uint32_t round, uint32_t out[4])
{
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    const uint32_t counter[4] = {(uint32_t)index, (uint32_t)(index >> 32), (uint32_t)stream,
                                 (uint32_t)(stream >> 32) + round};
    gt_philox4x32(counter, key, out);
}

/* 53 random bits from two words -> x * 2^-53 in [0, 1 - 2^-53]. x = 0 (probability 2^-53) maps
 * to 2^-54 instead, so the result is never 0 (log-safe) and never 1. A centred (x + 0.5) * 2^-53
 * would be nicer but is not representable near 1 (it would round up to 1.0). */
static double gt_u53(uint32_t hi, uint32_t lo)
{
    uint64_t x = (((uint64_t)hi << 32) | lo) >> 11;
    return x ? (double)x * 0x1p-53 : 0x1p-54;
}

double gt_rng_uniform(uint64_t seed, uint64_t stream, uint64_t index, uint32_t round)
{
    uint32_t w[4];
    gt_rng_bits(seed, stream, index, round, w);
    return gt_u53(w[0], w[1]);
}

/* Box–Muller: with u1, u2 uniform in (0, 1), sqrt(-2 ln u1) * cos(2 pi u2) is standard normal.
 * u1 comes from words 0-1 of the round (the same number gt_rng_uniform gives), u2 from words 2-3.
 */
double gt_rng_normal(uint64_t seed, uint64_t stream, uint64_t index, uint32_t round)
{
    uint32_t w[4];
    gt_rng_bits(seed, stream, index, round, w);
    double u1 = gt_u53(w[0], w[1]);
    double u2 = gt_u53(w[2], w[3]);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586476925286766559 * u2);
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
