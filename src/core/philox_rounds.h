/* philox_rounds.h — Philox4x32-10's ten rounds on one counter (see philox.c), shared by the CPU
 * sampler (philox.c) and the device's parameter initialisation (cuda_init.cu), which must give
 * the same bits. Integer arithmetic only. */
#ifndef GT_PHILOX_ROUNDS_H
#define GT_PHILOX_ROUNDS_H

#include <stdint.h>

#ifdef __CUDACC__
#define GT_PHILOX_HD __host__ __device__
#else
#define GT_PHILOX_HD
#endif

#define GT_PHILOX_M0 0xD2511F53u
#define GT_PHILOX_M1 0xCD9E8D57u
#define GT_PHILOX_W0 0x9E3779B9u
#define GT_PHILOX_W1 0xBB67AE85u

/* c: the counter in, the output out; key (k0, k1), bumped by the Weyl constants between rounds */
GT_PHILOX_HD static inline void gt_philox_rounds(uint32_t c[4], uint32_t k0, uint32_t k1)
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

#endif
