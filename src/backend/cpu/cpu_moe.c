/* cpu_moe.c — CPU kernels of DeepSeek-V3's mixture-of-experts ops (placeholder: step 1). */
#include "cpu_internal.h"

#define GT_CPU_MOE_TODO(name)                                                                      \
    gt_status gt_cpu_##name(const gt_kernel_call *c, gt_error *err)                                \
    {                                                                                              \
        (void)c;                                                                                   \
        return gt_error_set(err, GT_ERR_UNSUPPORTED, #name ": no CPU kernel yet");                 \
    }
GT_CPU_MOE_TODO(sign)
GT_CPU_MOE_TODO(moe_topk)
GT_CPU_MOE_TODO(gather_last)
GT_CPU_MOE_TODO(gather_last_backward)
GT_CPU_MOE_TODO(moe_sort)
GT_CPU_MOE_TODO(moe_count)
GT_CPU_MOE_TODO(grouped_matmul)
GT_CPU_MOE_TODO(grouped_matmul_dw)
