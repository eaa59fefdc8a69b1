/* test_program_exact.c — the compiled program equals the eager executor bit for bit.
 *
 * For test_tiny, test_gqa and test_odd: the whole-step graph (forward, loss, backward, AdamW with
 * clipping) is run 5 steps by gt_eager_run and 5 steps by gt_program_run, each feeding its own
 * updated params and moments back; every output (loss, grad_norm, grads, params, moments) must be
 * memcmp-equal at every step. A second program runs the same steps with its state kept in its
 * arenas, as the trainer runs it (gt_program_set_input of every input at step 1, of the INPUT
 * kind only after; gt_program_exec; outputs read as views; updates carried): the same bits every
 * step, and the state gt_program_read_input returns after the last step is the eager run's. The
 * programs run with the default plan (views and in-place adamw: carrying is no copy) and, for
 * test_tiny, with sharing disabled too (carrying copies); its calls refuse a wrong index or type
 * with an error naming it. The arenas allocated equal the plan's
 * figures. Last, debugmodel at 8 x 2048 tokens is planned (not run) and its report printed, with
 * the planned step arena against the sum of all buffer sizes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graphtrain/gt_backend.h"
#include "graphtrain/gt_program.h"
#include "gt_test.h"
#include "step_harness.h"

#define STEPS 5

/* The resident program's calls refuse a wrong index or type with an error naming it. */
static void check_refusals(gt_program *res, const gt_graph *g, const gt_tensor *state)
{
    int32_t loss = -1, param = -1;
    for (int32_t k = 0; k < g->n_outputs; k++)
        if (g->outputs[k].kind == GT_OUT_LOSS) loss = k;
    for (int32_t k = 0; k < g->n_inputs && param < 0; k++)
        if (g->inputs[k].kind == GT_IN_PARAM && gt_tensor_numel(&state[k]) > 1) param = k;
    EXPECT(loss >= 0 && param >= 0, "no loss output (%d) or matrix parameter input (%d)", loss,
           param);
    if (loss < 0 || param < 0) return;
    gt_error e = {0};
    gt_status st = gt_program_set_input(res, g->n_inputs, &state[0], &e);
    EXPECT(st == GT_ERR_INVALID && strstr(e.msg, "no graph input"), "set_input past the end: %s",
           e.msg);
    e = (gt_error){0};
    st = gt_program_carry(res, loss, param, &e);
    EXPECT(st == GT_ERR_INVALID && strstr(e.msg, "carry into graph input") &&
               strstr(e.msg, gt_graph_str(g, g->inputs[param].fqn)),
           "carry of the loss into a parameter: %s", e.msg);
    gt_tensor wrong;
    const int64_t one[1] = {1};
    EXPECT_OK(gt_tensor_alloc(&wrong, GT_F32, 1, one, &e), &e);
    e = (gt_error){0};
    st = gt_program_set_input(res, param, &wrong, &e);
    EXPECT(st == GT_ERR_INVALID && strstr(e.msg, gt_graph_str(g, g->inputs[param].fqn)),
           "set_input of a 1-element tensor into a parameter: %s", e.msg);
    e = (gt_error){0};
    st = gt_program_read_input(res, param, &wrong, &e);
    EXPECT(st == GT_ERR_INVALID && strstr(e.msg, "reading graph input"),
           "read_input into a 1-element tensor: %s", e.msg);
    gt_tensor_free(&wrong);
    gt_tensor view;
    e = (gt_error){0};
    st = gt_program_output(res, g->n_outputs, &view, &e);
    EXPECT(st == GT_ERR_INVALID && strstr(e.msg, "no graph output"), "output past the end: %s",
           e.msg);
}

/* 5 steps eager vs 5 steps program (with the given plan options), compared every step. */
static void check_flavor(const char *flavor, const gt_plan_options *opts)
{
    step_graph s;
    if (!step_graph_build(&s, flavor, 2, 16)) return;
    gt_error err = {0};
    const gt_graph *g = s.g;
    step_run e, p; /* eager, program */
    bool ok = step_run_init(&e, &s);
    ok = step_run_init(&p, &s) && ok;

    step_run q; /* the resident program's feed: its scalars change, its state is never fed back */
    ok = step_run_init(&q, &s) && ok;
    gt_tensor *view = calloc((size_t)g->n_outputs, sizeof *view);

    gt_program *prog = NULL, *res = NULL;
    EXPECT_OK(gt_program_build_opts(g, &s.binding, opts, &prog, &err), &err);
    EXPECT_OK(gt_program_build_opts(g, &s.binding, opts, &res, &err), &err);
    ok = ok && prog && res;
    if (ok)
        for (int a = 0; a < GT_ARENA_COUNT; a++)
            EXPECT(gt_program_allocated_bytes(prog, a) == gt_program_planned_bytes(prog, a) &&
                       gt_program_planned_bytes(prog, a) == prog->plan->arena_bytes[a],
                   "%s arena %d: allocated %zu, planned %zu", flavor, a,
                   gt_program_allocated_bytes(prog, a), gt_program_planned_bytes(prog, a));
    for (int64_t step = 1; ok && step <= STEPS; step++) {
        step_set_scalars(&s, g, e.state, step);
        step_set_scalars(&s, g, p.state, step);
        EXPECT_OK(gt_eager_run(g, &s.binding, e.state, e.out, &err), &err);
        EXPECT_OK(gt_program_run(prog, p.state, p.out, &err), &err);
        if (err.code) break;
        int bad = step_count_diffs(flavor, NULL, step, g, e.out, p.out);
        EXPECT(bad == 0, "%s step %lld (views %d, in place %d): %d of %d outputs differ", flavor,
               (long long)step, !opts || !opts->no_views, !opts || !opts->no_in_place, bad,
               g->n_outputs);
        step_set_scalars(&s, g, q.state, step);
        for (int32_t k = 0; k < g->n_inputs && !err.code; k++)
            if (step == 1 || g->inputs[k].kind == GT_IN_INPUT)
                EXPECT_OK(gt_program_set_input(res, k, &q.state[k], &err), &err);
        if (!err.code) EXPECT_OK(gt_program_exec(res, &err), &err);
        for (int32_t k = 0; k < g->n_outputs && !err.code; k++)
            EXPECT_OK(gt_program_output(res, k, &view[k], &err), &err);
        if (err.code) break;
        bad = step_count_diffs(flavor, "resident", step, g, e.out, view);
        EXPECT(bad == 0, "%s step %lld, state kept in the arenas: %d of %d outputs differ", flavor,
               (long long)step, bad, g->n_outputs);
        for (int32_t k = 0; k < g->n_outputs && !err.code; k++) {
            int32_t in = gt_program_state_input(g, k);
            if (in >= 0) EXPECT_OK(gt_program_carry(res, k, in, &err), &err);
        }
        if (step == 1 || step == STEPS)
            printf("%s step %lld loss %.9g (eager and program)\n", flavor, (long long)step,
                   step_loss(g, p.out));
        step_run_next(&e, g);
        step_run_next(&p, g);
    }
    /* the state read back is what the eager run feeds its next step */
    int stale = 0;
    for (int32_t k = 0; ok && !err.code && k < g->n_inputs; k++) {
        if (g->inputs[k].kind == GT_IN_INPUT) continue;
        gt_tensor back;
        EXPECT_OK(gt_tensor_alloc(&back, e.state[k].dtype, e.state[k].ndim, e.state[k].shape, &err),
                  &err);
        if (err.code) break;
        EXPECT_OK(gt_program_read_input(res, k, &back, &err), &err);
        if (!same_bits(&back, &e.state[k]) && stale++ < 3)
            fprintf(stderr, "  %s: input %d (%s) read back after step %d differs\n", flavor, k,
                    gt_graph_str(g, g->inputs[k].fqn), STEPS);
        gt_tensor_free(&back);
    }
    EXPECT(stale == 0, "%s: %d state inputs read back from the resident program differ", flavor,
           stale);
    if (res && !opts) check_refusals(res, g, q.state);
    if (prog && (!opts || (!opts->no_in_place && !opts->no_views))) {
        EXPECT(prog->plan->n_in_place == 3 * s.model.n_params,
               "%s: %d outputs in place, expected 3 per param (%d params)", flavor,
               prog->plan->n_in_place, s.model.n_params);
        EXPECT(prog->plan->arena_bytes[GT_ARENA_PERSISTENT] ==
                   prog->plan->total_value_bytes[GT_ARENA_PERSISTENT],
               "%s: persistent arena %zu bytes, its buffers %zu", flavor,
               prog->plan->arena_bytes[GT_ARENA_PERSISTENT],
               prog->plan->total_value_bytes[GT_ARENA_PERSISTENT]);
    }
    gt_program_free(prog);
    gt_program_free(res);
    free(view);
    step_run_free(&e);
    step_run_free(&p);
    step_run_free(&q);
    step_graph_free(&s);
}

/* Planning only: debugmodel at 8 x 2048 tokens. */
static void report_debugmodel(void)
{
    step_graph s;
    gt_error err = {0};
    if (!step_graph_build(&s, "debugmodel", 8, 2048)) return;
    gt_node_id *order = NULL;
    int32_t n = 0;
    gt_plan *plan = NULL;
    EXPECT_OK(gt_schedule_build(s.g, &order, &n, &err), &err);
    EXPECT_OK(gt_plan_memory(s.g, &s.binding, order, n, NULL, &plan, &err), &err);
    if (plan) {
        gt_plan_print(plan, stdout);
        size_t sum = 0;
        for (gt_value_id v = 0; v < plan->n_values; v++)
            if (plan->values[v].first != -2) sum += plan->values[v].nbytes;
        printf("debugmodel 8x2048: step arena %zu bytes = %.3f of the sum of all value sizes "
               "(%zu bytes); activations live at the peak %zu bytes\n",
               plan->arena_bytes[GT_ARENA_STEP], (double)plan->arena_bytes[GT_ARENA_STEP] / sum,
               sum, plan->peak_by_category[GT_MEM_ACTIVATION]);
        EXPECT(plan->arena_bytes[GT_ARENA_STEP] >= plan->live_peak_bytes &&
                   plan->arena_bytes[GT_ARENA_STEP] < sum,
               "step arena %zu, live peak %zu, sum %zu", plan->arena_bytes[GT_ARENA_STEP],
               plan->live_peak_bytes, sum);
    }
    gt_plan_free(plan);
    free(order);
    step_graph_free(&s);
}

int main(void)
{
    gt_cpu_set_threads(1);
    const gt_plan_options no_sharing = {.no_views = true, .no_in_place = true};
    check_flavor("test_tiny", NULL);
    check_flavor("test_tiny", &no_sharing);
    check_flavor("test_gqa", NULL);
    check_flavor("test_odd", NULL);
    report_debugmodel();
    return gt_test_finish();
}
