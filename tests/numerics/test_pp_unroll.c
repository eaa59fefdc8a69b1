/* test_pp_unroll.c — a pipeline step unrolled into one graph (gt_pp_unroll, src/runtime/
 * pp_unroll.c) runs bitwise as gradient accumulation over the same micro-batches.
 *
 * The setup of test_pp_exec.c (pp_harness.h: llama3 debugmodel in f32, 4 micro-batches of 1 x 32
 * tokens, the step graph the trainer builds for them). For every schedule on pp 2, and 1F1B and
 * ZBVZeroBubble on pp 4, the step is unrolled with every stage in one graph and run, over 3 steps
 * feeding the updated parameters and moments back, three ways: node by node (gt_eager_run), as
 * the CPU program (gt_program: schedule, memory plan, lowered instructions), and as the CPU
 * program after the trainer's whole pass pipeline (gt_train_compile_graph: fusion, the memory
 * policy) on the unrolled graph. Each micro-batch's loss, the grad norm and every updated
 * parameter and moment are memcmp-equal to the reference (the trainer's accumulation). The
 * unrolled graph has one tokens, labels and positions input per micro-batch and each parameter
 * once; a running gradient sum is an input only for micro-batch 0. A W moved before the previous
 * micro-batch's W of its stage is refused naming both actions, as is a rank the schedule does
 * not have. */
#include "graphtrain/gt_program.h"
#include "pp_harness.h"

enum { EAGER = 0, PROGRAM, COMPILED, N_WAYS };
static const char *const way_name[N_WAYS] = {"eager", "program", "compiled program"};

/* The unrolled step's inputs from the per-micro-batch inputs, its outputs to losses and outputs
 * as the reference gives them. */
static void run_unrolled(setup *s, const gt_pp_unrolled *u, int way,
                         gt_tensor inputs[MICRO][PP_MAX_INPUTS], gt_tensor *losses,
                         gt_tensor *outputs)
{
    gt_error err = {0};
    const gt_graph *d = u->g;
    gt_tensor *in = pp_unrolled_inputs(u, inputs);
    gt_tensor *out = calloc((size_t)d->n_outputs + 1, sizeof *out);
    if (way == EAGER) {
        EXPECT_OK(gt_eager_run(d, &s->binding, in, out, &err), &err);
    } else {
        gt_program *p = NULL;
        EXPECT_OK(gt_program_build(d, &s->binding, &p, &err), &err);
        if (p) EXPECT_OK(gt_program_run(p, in, out, &err), &err);
        gt_program_free(p);
    }
    if (err.code == GT_OK) pp_unrolled_outputs(s->g, u, out, losses, outputs);
    free(in);
    free(out);
}

static void check(setup *s, gt_pp_schedule_kind kind, int32_t pp, int way)
{
    const gt_graph *g = s->g;
    gt_error err = {0};
    int32_t S;
    gt_pp_split split;
    gt_pp_schedule sched;
    if (!pp_split_schedule(s, kind, pp, &split, &sched, &S)) return;
    uint8_t per_micro[PP_MAX_INPUTS] = {0};
    int32_t n_per_micro = pp_per_micro(g, per_micro), n_shared = 0;
    gt_pp_unrolled u;
    EXPECT_OK(gt_pp_unroll(g, &split, &sched, -1, per_micro, &u, &err), &err);
    if (err.code != GT_OK) goto done;
    /* each micro-batch's tokens, labels and positions; every other input once */
    int32_t n_mb_inputs = 0;
    for (int32_t j = 0; j < u.g->n_inputs; j++) {
        n_mb_inputs += u.input_mb[j] >= 0;
        n_shared += u.input_mb[j] < 0;
        EXPECT(u.input_mb[j] < 0 || per_micro[u.input_of[j]], "input %d: micro-batch %d of %s", j,
               u.input_mb[j], gt_graph_str(u.g, u.g->inputs[j].fqn));
    }
    EXPECT(n_mb_inputs == n_per_micro * MICRO && n_shared + n_per_micro <= g->n_inputs,
           "%s: %d per-micro-batch inputs (want %d x %d), %d shared of %d",
           gt_pp_schedule_name(kind), n_mb_inputs, n_per_micro, MICRO, n_shared, g->n_inputs);
    if (way == COMPILED) {
        EXPECT_OK(gt_train_compile_graph(&s->cfg, u.g, NULL, &err), &err);
        if (err.code != GT_OK) goto done;
    }
    static gt_tensor ref_in[MICRO][PP_MAX_INPUTS], pp_in[MICRO][PP_MAX_INPUTS];
    init_inputs(s, ref_in);
    init_inputs(s, pp_in);
    int diffs = 0;
    for (int64_t step = 1; step <= STEPS && err.code == GT_OK; step++) {
        gt_tensor rl[MICRO] = {{0}}, pl[MICRO] = {{0}};
        gt_tensor *ro = calloc((size_t)g->n_outputs, sizeof *ro);
        gt_tensor *po = calloc((size_t)g->n_outputs, sizeof *po);
        next_step(g, ref_in, NULL, step);
        next_step(g, pp_in, NULL, step);
        reference_step(s, ref_in, rl, ro);
        run_unrolled(s, &u, way, pp_in, pl, po);
        char what[96];
        snprintf(what, sizeof what, "%s pp %d %s", gt_pp_schedule_name(kind), pp, way_name[way]);
        diffs += pp_step_diffs(what, g, step, rl, ro, pl, po);
        if (step == STEPS)
            printf("%-16s pp %d (%d stages), %s: %d nodes unrolled, %d inputs, step %d micro 0 "
                   "loss %.7f, bitwise %s\n",
                   gt_pp_schedule_name(kind), pp, S, way_name[way], u.g->n_nodes, u.g->n_inputs,
                   STEPS, gt_tensor_get_f32(&rl[0], 0), diffs ? "NO" : "yes");
        next_step(g, ref_in, ro, step + 1);
        next_step(g, pp_in, po, step + 1);
        free_outputs(rl, MICRO);
        free_outputs(pl, MICRO);
        free_outputs(ro, g->n_outputs);
        free_outputs(po, g->n_outputs);
        free(ro);
        free(po);
    }
    EXPECT(diffs == 0, "%s pp %d %s: %d losses or outputs differ", gt_pp_schedule_name(kind), pp,
           way_name[way], diffs);
    for (int m = 0; m < MICRO; m++)
        for (int32_t k = 0; k < g->n_inputs; k++)
            gt_tensor_free(&ref_in[m][k]), gt_tensor_free(&pp_in[m][k]);
done:
    gt_pp_unrolled_free(&u);
    gt_pp_schedule_free(&sched);
    gt_pp_split_free(&split);
}

/* Bad input: the W order, and a rank outside the schedule. */
static void check_refusals(setup *s)
{
    gt_error err = {0};
    int32_t S;
    gt_pp_split split;
    gt_pp_schedule sched;
    uint8_t per_micro[PP_MAX_INPUTS] = {0};
    if (!pp_split_schedule(s, GT_PP_ZBV_ZERO_BUBBLE, 2, &split, &sched, &S)) return;
    gt_pp_unrolled u;
    gt_status st = gt_pp_unroll(s->g, &split, &sched, 2, per_micro, &u, &err);
    EXPECT(st == GT_ERR_INVALID && strstr(err.msg, "rank 2 of 2") && !u.g, "%s", err.msg);
    gt_pp_action *a = sched.actions[0];
    int w0 = -1, w1 = -1;
    for (int i = 0; i < sched.n_actions[0]; i++) {
        if (a[i].kind == GT_PP_W && a[i].stage == 0 && a[i].mb == 0) w0 = i;
        if (a[i].kind == GT_PP_W && a[i].stage == 0 && a[i].mb == 1) w1 = i;
    }
    EXPECT(w0 >= 0 && w1 > w0, "0W0 at %d, 0W1 at %d", w0, w1);
    if (w0 >= 0 && w1 > w0) {
        a[w0].mb = 1, a[w1].mb = 0;
        err = (gt_error){0};
        st = gt_pp_unroll(s->g, &split, &sched, -1, per_micro, &u, &err);
        EXPECT(st == GT_ERR_INVALID && strstr(err.msg, "0W1 runs before 0W0") &&
                   strstr(err.msg, "rank 0 action") && !u.g,
               "%s", err.msg);
    }
    gt_pp_schedule_free(&sched);
    gt_pp_split_free(&split);
}

int main(void)
{
    setup s;
    if (build(&s) && s.g->n_inputs <= PP_MAX_INPUTS) {
        check_refusals(&s);
        for (int k = 0; k < GT_PP_N_SCHEDULES; k++)
            for (int way = 0; way < N_WAYS; way++)
                check(&s, (gt_pp_schedule_kind)k, 2, way);
        check(&s, GT_PP_1F1B, 4, PROGRAM);
        check(&s, GT_PP_ZBV_ZERO_BUBBLE, 4, PROGRAM);
    }
    gt_graph_free(s.g);
    gt_model_free(&s.model);
    gt_config_free(&s.cfg);
    return gt_test_finish();
}
