/* test_ep_tp4_launch.c — expert parallel groups that take tensor-parallel ranks on 4 ranks:
 * `dp_shard 2, tp 2, ep 4` (one ep group of all four ranks: the dp_shard x tp ranks flattened,
 * rank.dp_shard * 2 + rank.tp; without sequence parallelism; ep_tp_launch.h lists the checks),
 * and `dp_shard 1, tp 4, ep 2` with sequence parallelism, where efsdp 2 groups tp ranks: each
 * rank stores 2 of the 8 experts, gathers its ep coordinate's 4 over efsdp and reduce-scatters
 * their gradient back (10 steps within 1e-5 of one rank). Label slow. */
#define EPT_SHARD 2
#define EPT_TP 2
#define EPT_EP 4
#define EPT_SP 0
#define EPT_MORE tp4_ep2

#include "distributed/ep_tp_launch.h"

static void tp4_ep2(const char *base, const epl_run *one)
{
    static epl_run run;
    epl = (epl_layout){"debugmodel", 1, 1, 4, 4, 1};
    epl_run_x(base, "tp4_ep2", 2, LAUNCH_STEPS, 0, NULL, &run, NULL);
    epl_close(one, &run, 1, "tp 4 x ep 2 (efsdp 2 over tp) vs 1 rank");
}

int main(void)
{
    return ept_main("gt_ep_tp4_launch");
}
