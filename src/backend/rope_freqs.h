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
 * f[2] = lo, f[3] = hi; with scaling 2 (i[2]) YaRN instead (gt_rope_yarn). */
/* The optional int slots of rope (absent: 0, what llama graphs have): scaling (2 = YaRN) and
 * interleaved (1: pairs (2j, 2j + 1)). */
static inline int64_t gt_rope_scaling(const gt_kernel_call *c)
{
    return c->ni > 2 ? c->i[2] : 0;
}
static inline int64_t gt_rope_interleaved(const gt_kernel_call *c)
{
    return c->ni > 3 ? c->i[3] : 0;
}

/* YaRN (scaling 2) as torchtitan's ComplexRoPE (its `yarn` branch; torchtitan applies it only when
 * max_seq_len > the original length L, which the model decides), with beta_fast = f[2],
 * beta_slow = f[3], rope factor F = f[1], L = i[1]:
 *   corr(b) = d ln(L / (2 pi b)) / (2 ln theta)                      (double, as Python floats)
 *   low = max(floor(corr(beta_fast)), 0);  high = min(ceil(corr(beta_slow)), d - 1)
 *   high == low: high += 0.001
 *   ramp_j = clamp((f32(j) - f32(low)) / f32(high - low), 0, 1);  smooth = 1 - ramp_j   (f32)
 *   inv = inv / F * (1 - smooth) + inv * smooth                       (f32, op by op)
 * mscale is not applied here (the model folds it into the attention scale). */
static inline void gt_rope_yarn(const gt_kernel_call *c, int64_t d, float *inv)
{
    const double pi = 3.14159265358979323846;
    double base = c->f[0], orig = (double)c->i[1];
    double clow = (double)d * log(orig / (c->f[2] * 2.0 * pi)) / (2.0 * log(base));
    double chigh = (double)d * log(orig / (c->f[3] * 2.0 * pi)) / (2.0 * log(base));
    double low = floor(clow), high = ceil(chigh);
    if (low < 0) low = 0;
    if (high > (double)(d - 1)) high = (double)(d - 1);
    if (low == high) high += 0.001;
    float flow = (float)low, span = (float)(high - low), factor = (float)c->f[1];
    for (int64_t j = 0; j < d / 2; j++) {
        float ramp = ((float)j - flow) / span;
        ramp = ramp < 0.0f ? 0.0f : ramp > 1.0f ? 1.0f : ramp;
        float smooth = 1.0f - ramp;
        inv[j] = inv[j] / factor * (1.0f - smooth) + inv[j] * smooth;
    }
}

static inline void gt_rope_inv_freq(const gt_kernel_call *c, int64_t d, float *inv)
{
    int64_t half = d / 2, omp = c->i[1];
    float theta = (float)c->f[0];
    for (int64_t j = 0; j < half; j++)
        inv[j] = 1.0f / powf(theta, (float)(2 * j) / (float)d);
    if (gt_rope_scaling(c) == 2) {
        gt_rope_yarn(c, d, inv);
        return;
    }
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
