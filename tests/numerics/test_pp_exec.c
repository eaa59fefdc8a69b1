/* test_pp_exec.c — a training step run as each pipeline schedule runs it equals gradient
 * accumulation over the same micro-batches, bitwise (gt_pp_eager_step, src/runtime/pp_exec.c).
 *
 * llama3 debugmodel in f32, the step graph for 4 micro-batches of 1 x 32 tokens exactly as the
 * trainer builds it for --training.global_batch_size 4 --training.local_batch_size 1
 * (gt_train_build_global_graph: loss / 4, running gradient sums, clipping, AdamW). The reference
 * is the trainer's accumulation: gt_eager_run_part of the micro-batch part for micro-batches 0 to
 * 2, each feeding its running sums to the next, then the whole graph for micro-batch 3. Against
 * it, for every schedule on pp 2 (GPipe, 1F1B: 2 stages; Interleaved1F1B, ZBVZeroBubble,
 * DualPipeV: 4 stages), and for 1F1B and ZBVZeroBubble on pp 4 as well, over 3 steps feeding the
 * updated parameters and moments back: each micro-batch's loss, the grad norm and every updated
 * parameter and moment are memcmp-equal. A schedule whose W runs before the previous
 * micro-batch's W of its stage is refused naming the action. The same holds for the compiled
 * step graph (the pass pipeline: fusion, recomputation) under 1F1B and DualPipeV. Every step's
 * figures (collectives, peak bytes held, bytes computed) are those gt_pp_step_plan gives on
 * sizes alone, and the step holds less than it computes (values freed after their last read).
 * Each schedule again with every stage's F, I and W parts as programs of their own
 * (gt_pp_programs: a memory plan and lowered instructions each; for 1F1B and ZBVZeroBubble also
 * with the trainer's pass pipeline run on each part first), on the step graph and on the
 * compiled one: the same bits, each program's arenas allocated as planned, the plan's figures
 * those of the run. */
#include "pp_harness.h"

int main(void)
{
    setup s;
    if (build(&s) && s.g->n_inputs <= PP_MAX_INPUTS) {
        for (int k = 0; k < GT_PP_N_SCHEDULES; k++) {
            pp_check_schedule(&s, (gt_pp_schedule_kind)k, 2, 0);
            pp_check_schedule(&s, (gt_pp_schedule_kind)k, 2, 1);
        }
        pp_check_schedule(&s, GT_PP_1F1B, 4, 0);
        pp_check_schedule(&s, GT_PP_ZBV_ZERO_BUBBLE, 4, 0);
        pp_check_schedule(&s, GT_PP_ZBV_ZERO_BUBBLE, 4, 1);
        pp_check_schedule(&s, GT_PP_1F1B, 2, 2);
        pp_check_schedule(&s, GT_PP_ZBV_ZERO_BUBBLE, 2, 2);
        /* the compiled graph (the pass pipeline: fusion, recomputation) splits and runs alike */
        gt_error err = {0};
        EXPECT_OK(gt_train_compile_graph(&s.cfg, s.g, NULL, &err), &err);
        printf("compiled: %d nodes\n", s.g->n_nodes);
        if (err.code == GT_OK) {
            pp_check_schedule(&s, GT_PP_1F1B, 2, 0);
            pp_check_schedule(&s, GT_PP_DUALPIPEV, 2, 0);
            pp_check_schedule(&s, GT_PP_1F1B, 2, 1);
        }
    }
    gt_graph_free(s.g);
    gt_model_free(&s.model);
    gt_config_free(&s.cfg);
    return gt_test_finish();
}
