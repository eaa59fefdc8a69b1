/* test_ep_tp4_launch.c — expert parallel groups that take tensor-parallel ranks on 4 ranks:
 * `dp_shard 2, tp 2, ep 4` (one ep group of all four ranks: the dp_shard x tp ranks flattened,
 * rank.dp_shard * 2 + rank.tp; without sequence parallelism; ep_tp_launch.h lists the checks).
 * Label slow. */
#define EPT_SHARD 2
#define EPT_TP 2
#define EPT_EP 4
#define EPT_SP 0
#include "distributed/ep_tp_launch.h"

int main(void)
{
    return ept_main("gt_ep_tp4_launch");
}
