/* rope_freqs.h — RoPE's inverse frequencies, shared by the CPU kernel (cpu_norm_rope.c) and the
 * CUDA kernel's host side (cuda_norm_rope.cu), so both compute the same f32 values from the same
 * code. Plain C that also compiles as C++ host code under nvcc; every function is static inline. */
#ifndef GT_ROPE_FREQS_H
#define GT_ROPE_FREQS_H

#include <math.h>
#include <stdint.h>

#include "graphtrain/gt_backend.h"

/* inv_freq_j for j < d/2, in the f32 steps of Hugging Face's LlamaRotaryEmbedding so that angles
 * agree to the last bit where libm agrees with torch:
 *   inv = 1 / theta^(f32(2j) / d)                     (powf in f32)
 * and with llama3.1 scaling (original_max_position L > 0, factor F, low/high freq factors lo/hi):
 *   wavelen = 2*pi / inv;  lo_wl = L / lo;  hi_wl = L / hi   (compared in f32)
 *   wavelen < hi_wl: inv;  wavelen > lo_wl: inv / F;
 *   else s = (L / wavelen - lo) / (hi - lo),  inv = (1 - s) * inv / F + s * inv.
 * Attributes of the rope call c: i[1] = L (<= 0: no scaling), f[0] = theta, f[1] = F,
 * f[2] = lo, f[3] = hi. */
static inline void gt_rope_inv_freq(const gt_kernel_call *c, int64_t d, float *inv)
{
    int64_t half = d / 2, omp = c->i[1];
    float theta = (float)c->f[0];
    for (int64_t j = 0; j < half; j++)
        inv[j] = 1.0f / powf(theta, (float)(2 * j) / (float)d);
    if (omp <= 0) return;
    float factor = (float)c->f[1], lo = (float)c->f[2];
    float lo_wl = (float)((double)omp / c->f[2]), hi_wl = (float)((double)omp / c->f[3]);
    float hi_minus_lo = (float)(c->f[3] - c->f[2]);
    for (int64_t j = 0; j < half; j++) {
        float wavelen = (float)(2.0 * 3.14159265358979323846) / inv[j];
        if (wavelen < hi_wl) continue;
        if (wavelen > lo_wl) {
            inv[j] = inv[j] / factor;
            continue;
        }
        float s = ((float)omp / wavelen - lo) / hi_minus_lo;
        inv[j] = (1.0f - s) * inv[j] / factor + s * inv[j];
    }
}

#endif
