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
 * with the passes local to a part run on each part first), on the step graph and on the
 * compiled one: the same bits, each program's arenas allocated as planned, the plan's figures
 * those of the run. The trainer's compile of a pipeline under compile.memory_policy none and
 * full (the whole-step passes, recomputation among them, before the split; the local ones on
 * each part): under full the stages save under a quarter of the activations a micro-batch that
 * they save under none, every schedule's step holds less over its actions, and every schedule
 * (and ZBVZeroBubble on pp 4) runs bitwise the accumulation. */
#include "pp_harness.h"

/* The trainer's compile of a pipeline step under compile.memory_policy `policy`: the passes that
 * see the whole step on s's graph before the split. */
static bool compile_step(setup *s, gt_cfg_memory_policy policy)
{
    gt_error err = {0};
    if (!build(s)) return false;
    s->cfg.compile.memory_policy = policy;
    EXPECT_OK(
        gt_train_compile_graph_scope(&s->cfg, &s->layout, s->g, NULL, GT_PASS_SCOPE_WHOLE, &err),
        &err);
    return err.code == GT_OK && s->g->n_inputs <= PP_MAX_INPUTS;
}

/* What one micro-batch of each stage holds from its forward to its backward, and what the step
 * holds at most over a schedule's actions, on the step graph of s split for kind on pp 2; the
 * recomputed nodes (remat's copies) into *n_copies, each checked to be in its stage's backward. */
static void held_by(setup *s, gt_pp_schedule_kind kind, int64_t *saved, int64_t *held,
                    int32_t *n_copies)
{
    gt_error err = {0};
    int32_t spr = gt_pp_default_stages_per_rank(kind), S = 2 * spr;
    int64_t fl[16];
    gt_pp_split split;
    gt_pp_schedule sched;
    gt_pp_step_stats plan = {0};
    EXPECT_OK(gt_pp_split_layers(6, S, 1, 1, fl, &err), &err);
    EXPECT_OK(gt_pp_split_graph(s->g, S, fl, &split, &err), &err);
    if (err.code != GT_OK) return;
    /* remat's copies run in the backward (I or W) of the stage whose block they recompute */
    int32_t copies = 0, misplaced = 0;
    for (gt_node_id n = 0; n < s->g->n_nodes; n++) {
        const gt_node *nd = &s->g->nodes[n];
        if (nd->phase != GT_PHASE_BACKWARD || !gt_node_has_tag(s->g, nd, "recompute")) continue;
        copies++;
        bool in_block = nd->unit >= fl[split.stage[n]] && nd->unit < fl[split.stage[n] + 1];
        misplaced += !in_block || (split.part[n] != GT_PP_PART_I && split.part[n] != GT_PP_PART_W);
    }
    EXPECT(misplaced == 0, "%s: %d of %d recomputed nodes outside their block's stage backward",
           gt_pp_schedule_name(kind), misplaced, copies);
    *n_copies = copies;
    EXPECT_OK(gt_pp_split_saved_bytes(s->g, &split, &s->binding, saved, &err), &err);
    EXPECT_OK(gt_pp_schedule_build(kind, 2, spr, MICRO, &sched, &err), &err);
    EXPECT_OK(gt_pp_step_plan(s->g, &s->binding, &split, &sched, -1, &plan, &err), &err);
    *held = plan.actions_peak_bytes;
    gt_pp_schedule_free(&sched);
    gt_pp_split_free(&split);
}

/* compile.memory_policy full under a pipeline: recomputation runs on the whole step before the
 * split, so a stage's backward parts recompute its blocks from their inputs. Each stage saves
 * under a quarter of what it saves with none, the step holds less over every schedule's actions,
 * and every schedule runs the parts (the local passes on each) bitwise the accumulation of the
 * same graph. */
static void check_memory_policy(void)
{
    static setup none, full;
    if (!compile_step(&none, GT_CFG_MEMORY_NONE) || !compile_step(&full, GT_CFG_MEMORY_FULL))
        return;
    printf("memory_policy none: %d nodes, full: %d nodes after the whole-step passes\n",
           none.g->n_nodes, full.g->n_nodes);
    EXPECT(full.g->n_nodes > none.g->n_nodes, "full: %d nodes, none %d: nothing recomputed",
           full.g->n_nodes, none.g->n_nodes);
    for (int k = 0; k < GT_PP_N_SCHEDULES; k++) {
        int64_t sn[8] = {0}, sf[8] = {0}, hn = 0, hf = 0;
        gt_pp_schedule_kind kind = (gt_pp_schedule_kind)k;
        int32_t cn = -1, cf = 0;
        held_by(&none, kind, sn, &hn, &cn);
        held_by(&full, kind, sf, &hf, &cf);
        EXPECT(cn == 0 && cf > 0, "%s: %d recomputed nodes under none, %d under full",
               gt_pp_schedule_name(kind), cn, cf);
        int32_t S = 2 * gt_pp_default_stages_per_rank(kind);
        int64_t tn = 0, tf = 0;
        for (int32_t st = 0; st < S; st++) {
            EXPECT(sf[st] < sn[st],
                   "%s stage %d saves %lld B a micro-batch under full, %lld B under none",
                   gt_pp_schedule_name(kind), st, (long long)sf[st], (long long)sn[st]);
            tn += sn[st], tf += sf[st];
        }
        /* the last stage's norm, output and loss are saved whatever the policy (torchtitan's AC
         * wraps the blocks alone) */
        EXPECT(4 * tf < tn,
               "%s: the stages save %lld B a micro-batch under full, %lld B under none",
               gt_pp_schedule_name(kind), (long long)tf, (long long)tn);
        EXPECT(hf < hn, "%s: the step holds %lld B over its actions under full, %lld B under none",
               gt_pp_schedule_name(kind), (long long)hf, (long long)hn);
        printf("%-16s stage 0 saves %lld B (none) -> %lld B (full) a micro-batch; step holds "
               "%lld -> %lld B over the actions\n",
               gt_pp_schedule_name(kind), (long long)sn[0], (long long)sf[0], (long long)hn,
               (long long)hf);
        pp_check_schedule(&full, kind, 2, 2);
    }
    pp_check_schedule(&full, GT_PP_ZBV_ZERO_BUBBLE, 4, 2);
    setup *both[2] = {&none, &full};
    for (int k = 0; k < 2; k++) {
        gt_graph_free(both[k]->g);
        gt_model_free(&both[k]->model);
        gt_config_free(&both[k]->cfg);
    }
}

int main(void)
{
    check_memory_policy();
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
