/* test_executor.c — gt_executor (gt_exec.h), the one interface over eager and the CPU program (the
 * CUDA program's is exercised by the trainer on the GPU): a graph with state (w' = w + x, loss =
 * sum(w * x)) runs three steps on each, through set_input, stage_input, run_part, carry,
 * fetch_output, end_run, wait and read_scalar, with the same losses and final state bitwise; eager
 * borrows the caller's tensor and a carry replaces it; the capabilities and the trivial or refused
 * entries of a backend that lacks them. */
#include <string.h>

#include "graphtrain/gt_build.h"
#include "graphtrain/gt_exec.h"
#include "gt_test.h"

static gt_graph *build_step(void)
{
    gt_graph *g = gt_graph_new();
    gt_expr d[1] = {gt_c(g, 4)};
    gt_value_id w = gt_graph_add_input(g, GT_IN_PARAM, "w", GT_F32, 1, d);
    gt_value_id x = gt_graph_add_input(g, GT_IN_INPUT, "x", GT_F32, 1, d);
    gt_value_id loss = gt_reduce(g, GT_OP_SUM, gt_mul(g, w, x), 1, (const int[]){0}, false);
    gt_graph_add_output(g, GT_OUT_LOSS, "loss", loss);
    gt_graph_add_output(g, GT_OUT_PARAM_UPDATE, "w", gt_add(g, w, x));
    return g;
}

/* Three steps from w = {1, 2, 3, 4} with x changing each step; losses and the final w out. */
static void run_steps(gt_executor_kind kind, const gt_graph *g, double loss[3], float w_out[4])
{
    gt_error err = {0};
    gt_sym_binding none = {NULL, 0};
    gt_executor *ex = NULL;
    EXPECT_OK(gt_executor_create(g, &none, kind, NULL, &ex, &err), &err);
    if (!ex) return;
    EXPECT(gt_executor_kind_of(ex) == kind, "%s: its kind", gt_executor_kind_name(kind));
    gt_tensor w, x;
    EXPECT_OK(gt_tensor_alloc(&w, GT_F32, 1, (int64_t[]){4}, &err), &err);
    EXPECT_OK(gt_tensor_alloc(&x, GT_F32, 1, (int64_t[]){4}, &err), &err);
    for (int i = 0; i < 4; i++)
        gt_tensor_set_f32(&w, i, (float)(i + 1));
    EXPECT_OK(gt_executor_set_input(ex, 0, &w, &err), &err);
    for (int s = 0; s < 3; s++) {
        for (int i = 0; i < 4; i++)
            gt_tensor_set_f32(&x, i, 0.25f * (float)(s + 1) - 0.125f * (float)i);
        EXPECT_OK(gt_executor_stage_input(ex, 1, &x, &err), &err);
        EXPECT_OK(gt_executor_run_part(ex, GT_RUN_ALL, &err), &err);
        EXPECT_OK(gt_executor_carry(ex, 1, gt_program_state_input(g, 1), &err), &err);
        EXPECT_OK(gt_executor_fetch_output(ex, 0, &err), &err);
        int64_t ticket = -1;
        EXPECT_OK(gt_executor_end_run(ex, &ticket, &err), &err);
        EXPECT(ticket == s, "%s: ticket %lld at step %d", gt_executor_kind_name(kind),
               (long long)ticket, s);
        EXPECT_OK(gt_executor_wait(ex, ticket, &err), &err);
        loss[s] = -1;
        EXPECT_OK(gt_executor_read_scalar(ex, ticket, 0, &loss[s], &err), &err);
    }
    EXPECT(gt_executor_runs(ex, GT_RUN_ALL) == 3 && gt_executor_runs(ex, GT_RUN_MICRO) == 0,
           "%s: run counts", gt_executor_kind_name(kind));
    /* an older ticket's result is gone on a synchronous executor: *v stays as it is */
    double old = 7;
    EXPECT_OK(gt_executor_read_scalar(ex, 0, 0, &old, &err), &err);
    EXPECT(old == 7, "%s: a stale ticket read %g", gt_executor_kind_name(kind), old);
    gt_tensor back;
    EXPECT_OK(gt_tensor_alloc(&back, GT_F32, 1, (int64_t[]){4}, &err), &err);
    EXPECT_OK(gt_executor_read_input(ex, 0, &back, &err), &err);
    memcpy(w_out, back.data, sizeof(float) * 4);
    if (kind == GT_EXECUTOR_EAGER) /* the caller's tensor itself holds the state */
        EXPECT(!memcmp(w.data, back.data, sizeof(float) * 4), "eager: the carry replaced w");

    /* what a backend lacks: trivial, or refused naming the operation */
    unsigned caps = gt_executor_caps(ex);
    EXPECT(!(caps & (GT_EXEC_CAP_ASYNC | GT_EXEC_CAP_DEVICE)), "%s: synchronous, on the host",
           gt_executor_kind_name(kind));
    bool captured = true;
    EXPECT_OK(gt_executor_capture_part(ex, GT_RUN_ALL, &captured, &err), &err);
    EXPECT(!captured, "%s: nothing captured", gt_executor_kind_name(kind));
    EXPECT_OK(gt_executor_mark(ex, 2, &err), &err);
    double s = 5;
    EXPECT_OK(gt_executor_mark_seconds(ex, 2, 3, &s, &err), &err);
    EXPECT(s == 5, "%s: no marks", gt_executor_kind_name(kind));
    char byte;
    gt_error e = {0};
    EXPECT(gt_executor_read_input_bytes(ex, 0, 0, 1, &byte, &e) == GT_ERR_INVALID &&
               strstr(e.msg, "read_input_bytes") && strstr(e.msg, gt_executor_kind_name(kind)),
           "%s: read_input_bytes refused: %s", gt_executor_kind_name(kind), e.msg);
    EXPECT(gt_executor_input_data(ex, 0) == NULL && gt_executor_stream(ex) == NULL,
           "%s: no device buffers", gt_executor_kind_name(kind));
    int32_t n = -1;
    EXPECT_OK(gt_executor_collectives(ex, false, NULL, 0, &n, &err), &err);
    EXPECT(n == 0, "%s: %d collectives", gt_executor_kind_name(kind), n);
    if (kind == GT_EXECUTOR_EAGER) {
        EXPECT(gt_executor_lowered(ex) == NULL && gt_executor_comm_timings(ex, NULL, 0) == -1 &&
                   gt_executor_allocated_bytes(ex, GT_ARENA_STEP) == 0,
               "eager: no program, no timings");
        EXPECT(caps == 0, "eager: caps %u", caps);
        gt_error_clear(&e);
        EXPECT(gt_executor_drop_collective(ex, 0, &e) == GT_ERR_INVALID &&
                   strstr(e.msg, "drop_collective"),
               "eager: drop_collective refused: %s", e.msg);
    } else {
        EXPECT(gt_executor_lowered(ex) != NULL && gt_executor_comm_timings(ex, NULL, 0) == 0 &&
                   gt_executor_planned_bytes(ex, GT_ARENA_PERSISTENT) > 0,
               "cpu: a planned program");
        EXPECT(caps == (GT_EXEC_CAP_COMM_TIMINGS | GT_EXEC_CAP_DROP_COLLECTIVE), "cpu: caps %u",
               caps);
    }
    gt_error_clear(&e);
    EXPECT(gt_executor_set_input(ex, 9, &x, &e) == GT_ERR_INVALID && strstr(e.msg, "input 9"),
           "%s: input out of range: %s", gt_executor_kind_name(kind), e.msg);
    gt_tensor_free(&back);
    gt_executor_free(ex);
    gt_tensor_free(&w);
    gt_tensor_free(&x);
}

static void test_eager_and_cpu_agree(void)
{
    gt_graph *g = build_step();
    double le[3], lc[3];
    float we[4], wc[4];
    run_steps(GT_EXECUTOR_EAGER, g, le, we);
    run_steps(GT_EXECUTOR_CPU, g, lc, wc);
    EXPECT(!memcmp(le, lc, sizeof le) && !memcmp(we, wc, sizeof we),
           "eager and cpu: the same losses (%g %g %g / %g %g %g) and state", le[0], le[1], le[2],
           lc[0], lc[1], lc[2]);
    /* step 1: sum({1, 2, 3, 4} * {0.25, 0.125, 0, -0.125}) = 0 */
    EXPECT(le[0] == 0, "step 1 loss %g", le[0]);
    gt_graph_free(g);
}

/* Eager reads inputs the caller set: one never set is named. */
static void test_eager_unset_input(void)
{
    gt_graph *g = build_step();
    gt_error err = {0};
    gt_sym_binding none = {NULL, 0};
    gt_executor *ex = NULL;
    EXPECT_OK(gt_executor_create(g, &none, GT_EXECUTOR_EAGER, NULL, &ex, &err), &err);
    EXPECT(gt_executor_run_part(ex, GT_RUN_ALL, &err) == GT_ERR_INVALID &&
               strstr(err.msg, "never set") && strstr(err.msg, "w"),
           "unset input: %s", err.msg);
    gt_executor_free(ex);
#ifndef GT_HAVE_CUDA
    gt_error_clear(&err);
    EXPECT(gt_executor_create(g, &none, GT_EXECUTOR_CUDA, NULL, &ex, &err) == GT_ERR_UNSUPPORTED &&
               ex == NULL,
           "cuda without CUDA: %s", err.msg);
#endif
    gt_graph_free(g);
}

int main(void)
{
    test_eager_and_cpu_agree();
    test_eager_unset_input();
    return gt_test_finish();
}
