/* cpu_exp.c — exp over arrays for the CPU kernels (gt_cpu_expf in cpu_internal.h, element by
 * element in a loop the compiler vectorizes). */
#include "cpu_internal.h"

GT_CPU_ELEMENT_LOOP void gt_cpu_exp_n(const float *x, float *y, int64_t n, float sign, float shift)
{
    for (int64_t j = 0; j < n; j++)
        y[j] = gt_cpu_expf(sign * x[j] - shift);
}

double gt_cpu_exp_sum(const float *x, float *e, int64_t n, float shift)
{
    double sum = 0.0;
    float chunk[256];
    for (int64_t j0 = 0; j0 < n; j0 += 256) { /* the exps of a chunk, then their sum in order */
        int64_t len = n - j0 < 256 ? n - j0 : 256;
        float *ej = e ? e + j0 : chunk;
        gt_cpu_exp_n(x + j0, ej, len, 1.0f, shift);
        for (int64_t j = 0; j < len; j++)
            sum += ej[j];
    }
    return sum;
}
