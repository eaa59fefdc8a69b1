/* test_cuda_pp_unroll.c — a pipeline step unrolled into one graph (gt_pp_unroll) runs on the GPU
 * bitwise as the GPU's gradient accumulation, and as one CUDA graph, label cuda.
 *
 * The setup of test_pp_unroll.c (pp_harness.h: llama3 debugmodel in f32, 4 micro-batches of 1 x
 * 32 tokens, the trainer's step graph for them). The reference is the trainer's accumulation on
 * the device: one CUDA program of the step graph, its micro-batch part run for micro-batches 0 to
 * 2 (each feeding its running sums to the next), then the whole graph for micro-batch 3. Against
 * it, for every schedule on pp 2 (every stage in one graph, rank -1), over 3 steps feeding the
 * updated parameters and moments back: the unrolled step as a CUDA program, and as that program
 * captured into one CUDA graph after its first step and replayed for the others. Each
 * micro-batch's loss, the grad norm and every updated parameter and moment are memcmp-equal to the
 * reference; the same for the step graph after the trainer's pass pipeline (gt_train_compile_graph,
 * training.device cuda: fusion, the memory policy) and its unroll, under 1F1B and ZBVZeroBubble.
 * The device's losses are within 1e-4 relative of the CPU's accumulation (fp32). */
#include <math.h>

#include "graphtrain/gt_cuda.h"
#include "graphtrain/gt_program.h"
#include "pp_harness.h"

/* One run of cp: every input set, `part` run, the outputs it computes read into out. */
static void gpu_run(gt_cuda_program *cp, const gt_graph *g, const gt_tensor *in, gt_run_part part,
                    gt_tensor *out, bool replay_capture, gt_error *err)
{
    for (int32_t k = 0; k < g->n_inputs && !err->code; k++)
        EXPECT_OK(gt_cuda_program_set_input(cp, k, &in[k], err), err);
    if (!err->code) EXPECT_OK(gt_cuda_program_exec_part(cp, part, err), err);
    if (replay_capture && !err->code && !gt_cuda_program_captured(cp)) {
        EXPECT_OK(gt_cuda_program_capture(cp, err), err);
        EXPECT(gt_cuda_program_captured(cp), "the unrolled step is one CUDA graph");
    }
    for (int32_t k = 0; k < g->n_outputs && !err->code; k++) {
        if (part == GT_RUN_MICRO && !gt_graph_micro_output(g->outputs[k].kind)) continue;
        EXPECT_OK(gt_cuda_program_read_output(cp, k, &out[k], err), err);
    }
}

/* The trainer's accumulation on the device (reference_step of pp_harness.h on cp). */
static void gpu_reference(setup *s, gt_cuda_program *cp, gt_tensor inputs[MICRO][PP_MAX_INPUTS],
                          gt_tensor *losses, gt_tensor *outputs)
{
    const gt_graph *g = s->g;
    gt_error err = {0};
    static gt_tensor sums[PP_MAX_INPUTS], run_in[PP_MAX_INPUTS];
    memset(sums, 0, sizeof sums);
    for (int m = 0; m < MICRO && !err.code; m++) {
        memcpy(run_in, inputs[m], (size_t)g->n_inputs * sizeof *run_in);
        for (int32_t k = 0; k < g->n_inputs; k++)
            if (m > 0 && g->inputs[k].kind == GT_IN_BUFFER && sums[k].data) run_in[k] = sums[k];
        gt_tensor *out = calloc((size_t)g->n_outputs, sizeof *out);
        gpu_run(cp, g, run_in, m < MICRO - 1 ? GT_RUN_MICRO : GT_RUN_ALL, out, false, &err);
        for (int32_t k = 0; k < g->n_outputs; k++) {
            if (g->outputs[k].kind == GT_OUT_LOSS) {
                losses[m] = out[k];
                if (m == MICRO - 1 && out[k].data) {
                    gt_tensor_alloc(&outputs[k], out[k].dtype, out[k].ndim, out[k].shape, &err);
                    memcpy(outputs[k].data, out[k].data, gt_tensor_nbytes(&out[k]));
                }
                continue;
            }
            if (m == MICRO - 1) {
                outputs[k] = out[k];
                continue;
            }
            if (g->outputs[k].kind == GT_OUT_BUFFER_UPDATE && out[k].data) {
                int32_t i = input_named(g, GT_IN_BUFFER, gt_graph_str(g, g->outputs[k].fqn));
                if (i < 0) {
                    gt_tensor_free(&out[k]);
                    continue;
                }
                gt_tensor_free(&sums[i]);
                sums[i] = out[k];
            } else {
                gt_tensor_free(&out[k]);
            }
        }
        free(out);
    }
    for (int32_t k = 0; k < g->n_inputs; k++)
        gt_tensor_free(&sums[k]);
}

/* The unrolled step on cp: inputs mapped from the micro-batches', outputs to losses / outputs. */
static void gpu_unrolled(setup *s, gt_cuda_program *cp, const gt_pp_unrolled *u, bool capture,
                         gt_tensor inputs[MICRO][PP_MAX_INPUTS], gt_tensor *losses,
                         gt_tensor *outputs)
{
    gt_error err = {0};
    const gt_graph *d = u->g;
    gt_tensor *in = pp_unrolled_inputs(u, inputs);
    gt_tensor *out = calloc((size_t)d->n_outputs + 1, sizeof *out);
    gpu_run(cp, d, in, GT_RUN_ALL, out, capture, &err);
    if (!err.code) pp_unrolled_outputs(s->g, u, out, losses, outputs);
    free(in);
    free(out);
}

static void check(setup *s, gt_pp_schedule_kind kind, bool cpu_too, bool compiled)
{
    const gt_graph *g = s->g;
    gt_error err = {0};
    int32_t S;
    gt_pp_split split;
    gt_pp_schedule sched;
    if (!pp_split_schedule(s, kind, 2, &split, &sched, &S)) return;
    uint8_t per_micro[PP_MAX_INPUTS] = {0};
    pp_per_micro(g, per_micro);
    gt_pp_unrolled u;
    EXPECT_OK(gt_pp_unroll(g, &split, &sched, -1, per_micro, &u, &err), &err);
    gt_cuda_program *ref = NULL, *un = NULL, *cap = NULL;
    if (!err.code) EXPECT_OK(gt_cuda_program_build(g, &s->binding, NULL, &ref, &err), &err);
    if (!err.code) EXPECT_OK(gt_cuda_program_build(u.g, &s->binding, NULL, &un, &err), &err);
    if (!err.code) EXPECT_OK(gt_cuda_program_build(u.g, &s->binding, NULL, &cap, &err), &err);
    static gt_tensor ref_in[MICRO][PP_MAX_INPUTS], pp_in[MICRO][PP_MAX_INPUTS];
    init_inputs(s, ref_in);
    init_inputs(s, pp_in);
    int diffs = 0;
    double worst = 0;
    for (int64_t step = 1; step <= STEPS && !err.code; step++) {
        gt_tensor rl[MICRO] = {{0}}, pl[MICRO] = {{0}}, cl[MICRO] = {{0}}, hl[MICRO] = {{0}};
        gt_tensor *ro = calloc((size_t)g->n_outputs, sizeof *ro);
        gt_tensor *po = calloc((size_t)g->n_outputs, sizeof *po);
        gt_tensor *co = calloc((size_t)g->n_outputs, sizeof *co);
        gt_tensor *ho = calloc((size_t)g->n_outputs, sizeof *ho);
        next_step(g, ref_in, NULL, step);
        next_step(g, pp_in, NULL, step);
        gpu_reference(s, ref, ref_in, rl, ro);
        gpu_unrolled(s, un, &u, false, pp_in, pl, po);
        gpu_unrolled(s, cap, &u, true, pp_in, cl, co);
        diffs += pp_step_diffs("unrolled", g, step, rl, ro, pl, po);
        diffs += pp_step_diffs("captured", g, step, rl, ro, cl, co);
        if (cpu_too) { /* the CPU's accumulation of the same inputs */
            reference_step(s, ref_in, hl, ho);
            for (int m = 0; m < MICRO; m++) {
                double a = gt_tensor_get_f32(&rl[m], 0), b = gt_tensor_get_f32(&hl[m], 0);
                double rel = fabs(a - b) / fmax(fabs(b), 1e-30);
                worst = fmax(worst, rel);
                EXPECT(rel < 1e-4, "%s step %lld micro %d: GPU loss %.9g, CPU %.9g",
                       gt_pp_schedule_name(kind), (long long)step, m, a, b);
            }
        }
        if (step == STEPS)
            printf("%-16s pp 2 (%d stages)%s: %d nodes unrolled, step %d micro 0 loss %.7f, "
                   "program and CUDA graph bitwise the GPU accumulation: %s\n",
                   gt_pp_schedule_name(kind), S, compiled ? ", compiled" : "", u.g->n_nodes, STEPS,
                   gt_tensor_get_f32(&rl[0], 0), diffs ? "NO" : "yes");
        next_step(g, ref_in, ro, step + 1);
        next_step(g, pp_in, po, step + 1);
        free_outputs(rl, MICRO);
        free_outputs(pl, MICRO);
        free_outputs(cl, MICRO);
        free_outputs(hl, MICRO);
        gt_tensor *all[4] = {ro, po, co, ho};
        for (int i = 0; i < 4; i++) {
            free_outputs(all[i], g->n_outputs);
            free(all[i]);
        }
    }
    if (cpu_too) printf("  GPU vs CPU accumulation: losses within %.2e relative\n", worst);
    EXPECT(diffs == 0, "%s: %d differences", gt_pp_schedule_name(kind), diffs);
    for (int m = 0; m < MICRO; m++)
        for (int32_t k = 0; k < g->n_inputs; k++)
            gt_tensor_free(&ref_in[m][k]), gt_tensor_free(&pp_in[m][k]);
    gt_cuda_program_free(ref);
    gt_cuda_program_free(un);
    gt_cuda_program_free(cap);
    gt_pp_unrolled_free(&u);
    gt_pp_schedule_free(&sched);
    gt_pp_split_free(&split);
}

int main(void)
{
    if (gt_cuda_device_count() == 0) {
        printf("0 passed, 0 failed (no CUDA device)\n");
        return 0;
    }
    gt_error err = {0};
    if (gt_cuda_init(0, NULL, &err) != GT_OK) {
        fprintf(stderr, "CUDA setup failed: %s\n", err.msg);
        return 1;
    }
    setup s;
    if (build(&s) && s.g->n_inputs <= PP_MAX_INPUTS) {
        for (int k = 0; k < GT_PP_N_SCHEDULES; k++)
            check(&s, (gt_pp_schedule_kind)k, k == 0, false);
        /* after the trainer's pass pipeline for the GPU, the step graph and the unrolled one */
        s.cfg.training.device = GT_CFG_DEVICE_CUDA;
        EXPECT_OK(gt_train_compile_graph(&s.cfg, s.g, NULL, &err), &err);
        if (!err.code) {
            check(&s, GT_PP_1F1B, false, true);
            check(&s, GT_PP_ZBV_ZERO_BUBBLE, false, true);
        }
    }
    gt_graph_free(s.g);
    gt_model_free(&s.model);
    gt_config_free(&s.cfg);
    return gt_test_finish();
}
