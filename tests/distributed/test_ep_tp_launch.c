/* test_ep_tp_launch.c — expert parallel groups that take tensor-parallel ranks on 2 ranks:
 * `dp_shard 1, tp 2, ep 2` with sequence parallelism (the tp ranks split the MoE tokens and
 * exchange them; ep_tp_launch.h lists the checks), plus the capacity overflow error. */
#define EPT_SHARD 1
#define EPT_TP 2
#define EPT_EP 2
#define EPT_FULL 1
#define EPT_SP 1
#include "distributed/ep_tp_launch.h"

int main(void)
{
    return ept_main("gt_ep_tp_launch");
}
