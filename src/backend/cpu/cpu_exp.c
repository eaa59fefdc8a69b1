/* cpu_exp.c — exp over arrays for the CPU kernels (gt_cpu_expf in cpu_internal.h, element by
 * element in a loop the compiler vectorizes), the row maxima and the softmax denominators.
 *
 * The denominators are double sums of the exps in index order. Such a sum rounds at each add, so
 * its bits depend on the order, and one add after another waits on the last (4 cycles each: 14 %
 * of an attention forward). But where every partial sum is exact, any order gives the same bits,
 * and that can be checked cheaply: a float e > 0 is a multiple of its ulp u(e) (2^(E - 23) for
 * e in [2^E, 2^(E+1)), 2^-149 below the normals), so all the terms are multiples of the smallest
 * of them, u_min, and so is every partial sum in any order; a partial sum is at most
 * S = (the sum so far) + (terms left) * (largest term). When S <= 2^52 u_min, every partial sum
 * is an integer multiple of u_min below 2^52 u_min: exact in double's 53 bits. Then 16 lanes sum
 * the chunk and add exactly. Softmax rows of scores that lie within about 15 nats of their
 * maximum (each exp above 2^-21, the usual case) meet it; a row that does not continues in order
 * from that point, which is the ordered sum's value so far, since up to it every add was exact. */
#include "cpu_internal.h"

#include <string.h>

#define GT_CPU_EXP_CHUNK 256
#define GT_CPU_LANES 16

/* The last n % 16 elements go through a padded block of 16 so that they run in vector lanes too:
 * GCC's scalar epilogue took half the time of a 128-element softmax row. */
GT_CPU_ELEMENT_LOOP void gt_cpu_exp_n(const float *x, float *y, int64_t n, float sign, float shift)
{
    int64_t body = n - n % GT_CPU_LANES;
    for (int64_t j = 0; j < body; j++)
        y[j] = gt_cpu_expf(sign * x[j] - shift);
    if (body == n) return;
    float t[GT_CPU_LANES] = {0};
    memcpy(t, x + body, (size_t)(n - body) * sizeof *t);
    for (int l = 0; l < GT_CPU_LANES; l++)
        t[l] = gt_cpu_expf(sign * t[l] - shift);
    memcpy(y + body, t, (size_t)(n - body) * sizeof *t);
}

/* GCC's vector types: 16 float lanes (one zmm register in the x86-64-v4 clone, two ymm in the v3
 * one). Plain C loops over lane arrays do not vectorize here (GCC will not vectorize a float
 * reduction without reassociation, nor these selects as SLP). */
typedef float gt_v16f __attribute__((vector_size(64)));
typedef float gt_v8f __attribute__((vector_size(32)));
typedef double gt_v8d __attribute__((vector_size(64)));
typedef int32_t gt_v16i __attribute__((vector_size(64)));
typedef uint32_t gt_v16u __attribute__((vector_size(64)));

/* m ? a : b lane by lane, m from a vector compare (all ones or zero). Macros, not functions: a
 * function taking 64-byte vectors has another ABI with AVX-512 than without (GCC's -Wpsabi). */
#define GT_V16F_SEL(m, a, b) ((gt_v16f)(((gt_v16i)(a) & (m)) | ((gt_v16i)(b) & ~(m))))
#define GT_V16U_SEL(m, a, b) (((a) & (gt_v16u)(m)) | ((b) & ~(gt_v16u)(m)))

/* Lane l keeps the first largest of the elements l, l + 16, ... (x > m: a NaN never replaces,
 * an equal value never replaces), the same select as the ordered loop's. */
GT_CPU_ELEMENT_LOOP float gt_cpu_max_n(const float *x, int64_t n)
{
    float m = -__builtin_inff();
    int64_t j = 0;
    if (n >= GT_CPU_LANES) {
        gt_v16f lane = {0}; /* from -inf, as the loop: a NaN first element must not stick */
        lane -= __builtin_inff();
        for (j = 0; j + GT_CPU_LANES <= n; j += GT_CPU_LANES) {
            gt_v16f v;
            memcpy(&v, x + j, sizeof v);
            lane = GT_V16F_SEL(v > lane, v, lane);
        }
        for (int l = 0; l < GT_CPU_LANES; l++)
            m = lane[l] > m ? lane[l] : m;
    }
    for (; j < n; j++)
        m = x[j] > m ? x[j] : m;
    return m;
}

/* The exps' sum in 16 double lanes, and the bits of the smallest nonzero exp (UINT32_MAX when
 * none) and of the largest. The exps are >= 0 or NaN, and the bits of floats >= 0 order as they
 * do, so both are integer minima and maxima of the bits (zero's bits minus one wrap to the top; a
 * NaN comes out as the largest or makes the sum NaN, and either stops the exact sum). */
GT_CPU_ELEMENT_LOOP static double gt_cpu_exp_chunk_stats(const float *e, int64_t n,
                                                         uint32_t *lo_bits, uint32_t *hi_bits)
{
    gt_v8d s0 = {0}, s1 = {0};
    gt_v16u lo = {0}, hi = {0};
    lo -= 1;
    int64_t j = 0;
    for (; j + GT_CPU_LANES <= n; j += GT_CPU_LANES) {
        gt_v8f a, b;
        memcpy(&a, e + j, sizeof a);
        memcpy(&b, e + j + 8, sizeof b);
        s0 += __builtin_convertvector(a, gt_v8d);
        s1 += __builtin_convertvector(b, gt_v8d);
        gt_v16u v;
        memcpy(&v, e + j, sizeof v);
        gt_v16u vm1 = v - 1;
        lo = GT_V16U_SEL(vm1 < lo, vm1, lo);
        hi = GT_V16U_SEL(v > hi, v, hi);
    }
    double s = 0.0;
    uint32_t a = UINT32_MAX, b = 0;
    for (int l = 0; l < 8; l++)
        s += s0[l] + s1[l];
    for (int l = 0; l < GT_CPU_LANES; l++) {
        a = lo[l] < a ? lo[l] : a;
        b = hi[l] > b ? hi[l] : b;
    }
    for (; j < n; j++) {
        uint32_t v;
        memcpy(&v, e + j, sizeof v);
        s += e[j];
        a = v - 1 < a ? v - 1 : a;
        b = v > b ? v : b;
    }
    *lo_bits = a + 1; /* 0: every exp was zero */
    *hi_bits = b;
    return s;
}

/* The ulp of the positive finite float of these bits (2^-149 for the subnormals). */
static double gt_cpu_ulp_bits(uint32_t bits)
{
    int E = (int)((bits >> 23) & 0xff);
    return __builtin_ldexp(1.0, (E > 0 ? E - 127 : -126) - 23);
}

double gt_cpu_exp_sum(const float *x, float *e, int64_t n, float shift)
{
    double sum = 0.0, u_min = __builtin_inf();
    bool exact = true; /* every add so far was exact */
    float chunk[GT_CPU_EXP_CHUNK];
    for (int64_t j0 = 0; j0 < n; j0 += GT_CPU_EXP_CHUNK) { /* a chunk's exps, then their sum */
        int64_t len = n - j0 < GT_CPU_EXP_CHUNK ? n - j0 : GT_CPU_EXP_CHUNK;
        float *ej = e ? e + j0 : chunk;
        gt_cpu_exp_n(x + j0, ej, len, 1.0f, shift);
        if (exact) {
            uint32_t lo, hi;
            double s = gt_cpu_exp_chunk_stats(ej, len, &lo, &hi);
            if (lo) {
                double u = gt_cpu_ulp_bits(lo);
                u_min = u < u_min ? u : u_min;
            }
            /* a NaN or inf term fails here (s, hi: 0x7f800000 and up), and so does a sum that
             * might round: n - j0 terms left, none above hi */
            if (__builtin_isfinite(s) && hi < 0x7f800000u &&
                sum + (double)(n - j0) * (double)gt_bits_f32(hi) <= __builtin_ldexp(u_min, 52)) {
                sum += s;
                continue;
            }
            exact = false;
        }
        for (int64_t j = 0; j < len; j++)
            sum += ej[j];
    }
    return sum;
}
