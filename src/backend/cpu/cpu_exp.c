/* cpu_exp.c — exp over arrays for the CPU kernels (gt_cpu_expf in cpu_internal.h, element by
 * element in a loop the compiler vectorizes).
 *
 * As a GT_CPU_ELEMENT_LOOP (an x86-64-v3 clone, contraction off), plus no-trapping-math: the
 * range selects of gt_cpu_expf compare floats, which GCC otherwise keeps as branches (a compare
 * may raise an FP exception); nothing here reads the exception flags, and the values are the
 * same either way. */
#include "cpu_internal.h"

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
__attribute__((target_clones("arch=x86-64-v3", "default"),
               optimize("O3", "fp-contract=off", "no-trapping-math")))
#endif
void gt_cpu_exp_n(const float *x, float *y, int64_t n, float sign, float shift)
{
    for (int64_t j = 0; j < n; j++)
        y[j] = gt_cpu_expf(sign * x[j] - shift);
}
