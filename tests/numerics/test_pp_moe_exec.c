/* test_pp_moe_exec.c — test_pp_exec.c's check on DeepSeek-V3 (debugmodel, f32): a step run as a
 * pipeline schedule runs it equals gradient accumulation over the same micro-batches, bitwise,
 * with the MoE load balancing's cross-micro-batch values in play: the token counts summed over the
 * micro-batches (a running sum of each MoE block's stage), the micro-batch clock that restarts the
 * sums and gates the expert-bias update (gt_pp_split.h's GT_PP_PART_CLOCK, on every rank), and
 * the expert-bias update itself, once a step on its block's stage; the biases are fed back between
 * steps and compared with the other outputs. 1F1B (2 stages) and DualPipeV (4 stages, the V
 * placement) node by node, and 1F1B with its parts as programs. */
#define PP_MODEL "deepseek_v3"
#include "pp_harness.h"

int main(void)
{
    setup s;
    if (build(&s) && s.g->n_inputs <= PP_MAX_INPUTS) {
        gt_error err = {0};
        int64_t fl[3];
        gt_pp_split split;
        EXPECT_OK(gt_pp_split_layers(6, 2, 1, 1, fl, &err), &err);
        EXPECT_OK(gt_pp_split_graph(s.g, 2, fl, &split, &err), &err);
        /* the counter and its gates are the clock; no stage sends them */
        EXPECT(split.n_clock > 0, "no clock nodes");
        for (int32_t k = 0; k < split.n_cross; k++)
            EXPECT(split.part[s.g->values[split.cross[k].value].producer] != GT_PP_PART_CLOCK,
                   "a clock value crosses stages");
        gt_pp_split_free(&split);
        pp_check_schedule(&s, GT_PP_1F1B, 2, 0);
        pp_check_schedule(&s, GT_PP_DUALPIPEV, 2, 0);
        pp_check_schedule(&s, GT_PP_1F1B, 2, 1);
    }
    gt_graph_free(s.g);
    gt_model_free(&s.model);
    gt_config_free(&s.cfg);
    return gt_test_finish();
}
