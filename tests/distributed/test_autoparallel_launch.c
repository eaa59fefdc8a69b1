/* test_autoparallel_launch.c — training on AutoParallel's layout (issue 40, acceptance): llama3
 * debugmodel, fp32 on CPU, 10 steps of the same global batch (4 sequences of 32 tokens) as one
 * rank, under `mpiexec -np N` oversubscribed, with --compile.enable_autoparallel:
 *   - dp_shard 2 (2 ranks) and dp_shard 2 x tp 2 (4 ranks), backend native: every step's loss
 *     within 1e-5 relative of one rank's, the step-10 parameters within 1e-5 (max |a - b| over a
 *     tensor relative to max |a|);
 *   - backend autoparallel (memory policy, FSDP bucket cap and prefetch depth from the solver's
 *     cost model and budget; the log header says what it chose) on dp_shard 2 and dp_shard 2 x
 *     tp 2: tracks one rank the same way, and is bitwise the native run of the same layout (the
 *     passes it steers only move bytes and reorder);
 *   - on dp_shard 2 the solver chooses FSDP at this shape: bitwise the hand FSDP run;
 *   - the 4-rank runs twice, native and backend: the same loss and grad_norm bits and the same
 *     checkpoint bytes.
 * The layout is whatever the solver chooses on the CPU cost model; test_autoparallel checks the
 * choices themselves. */
#include "launch.h" /* first: train_child.h defines _GNU_SOURCE */

#define RUN_SECONDS 300.0
#define TOLERANCE 1e-5

static void run(const char *base, const char *name, const launch_layout *l, const char *extra1,
                const char *extra2, launch_result *r)
{
    launch_cmd c;
    char out_path[600];
    launch_temp_dir(r->dump, sizeof r->dump, base, name);
    snprintf(out_path, sizeof out_path, "%s/output.txt", r->dump);
    launch_layout_run(&c, l, "debugmodel", r->dump, LAUNCH_STEPS);
    if (l && strcmp(name, "hand_fsdp2") != 0) launch_add(&c, "--compile.enable_autoparallel=true");
    if (extra1) launch_add(&c, "%s", extra1);
    if (extra2) launch_add(&c, "%s", extra2);
    double dt = 0;
    int rc = launch_run(&c, out_path, RUN_SECONDS, &dt);
    r->ok = rc == 0 && last_records(r->dump, LAUNCH_STEPS, r->steps, NULL);
    printf("%-32s %d rank(s): exit %d, %.1f s\n", name, l ? launch_ranks(l) : 1, rc, dt);
    EXPECT(r->ok, "%s: exit %d or missing metrics", name, rc);
    if (!r->ok) launch_show_tail(out_path);
}

/* Two runs of one layout: every step's loss and grad_norm bits and the final checkpoint's bytes
 * the same. */
static void expect_bitwise(const launch_result *a, const launch_result *b, const char *what)
{
    if (!a->ok || !b->ok) return;
    bool same = false;
    int differ = launch_bitwise_diff(a, b, LAUNCH_STEPS, &same);
    EXPECT(differ == 0 && same, "%s: %d steps with other loss or grad_norm bits; checkpoints %s",
           what, differ, same ? "same" : "differ");
}

/* The backend's choice is in the run's log header (rank 0's). */
static void expect_policy_logged(const launch_result *r, const char *what)
{
    if (!r->ok) return;
    char path[700];
    snprintf(path, sizeof path, "%s/output.txt", r->dump);
    FILE *f = fopen(path, "r");
    char line[4096];
    bool seen = false;
    while (f && !seen && fgets(line, sizeof line, f))
        seen = strstr(line, "backend autoparallel: memory_policy budget") &&
               strstr(line, "fsdp_bucket_cap_mb") && strstr(line, "fsdp_prefetch_depth");
    if (f) fclose(f);
    EXPECT(seen, "%s: the log names the chosen memory budget, bucket cap and prefetch depth", what);
}

static void compare(const launch_result *ref, const launch_result *r, const char *what)
{
    if (!ref->ok || !r->ok) return;
    double dl = launch_loss_diff(ref->steps, r->steps, 1, LAUNCH_STEPS);
    EXPECT(dl <= TOLERANCE, "%s: losses differ from one rank's by %.3g relative", what, dl);
    char a[700], b[700];
    launch_ckpt_path(a, sizeof a, ref->dump, LAUNCH_STEPS);
    launch_ckpt_path(b, sizeof b, r->dump, LAUNCH_STEPS);
    int missing = 0;
    double dp = launch_params_diff(a, b, &missing);
    EXPECT(dp >= 0 && dp <= TOLERANCE && missing == 0,
           "%s: final parameters differ by %.3g (%d missing)", what, dp, missing);
    printf("  %-30s loss diff %.2e, param diff %.2e\n", what, dl, dp);
}

int main(void)
{
    char base[256];
    if (!launch_begin(base, sizeof base, "gt_autoparallel_launch")) return 1;
    static const launch_layout fsdp2 = {"FSDP2", 1, 2, 1}, fsdp2tp2 = {"FSDP2xTP2", 1, 2, 2};
    static launch_result ref, r2, r2_backend, r4, r4_again, r4_backend, r4_backend_again;
    static const char *const backend = "--compile.autoparallel_backend=autoparallel";
    static const char *const budget = "--parallelism.autoparallel_memory_budget_gb=1";
    run(base, "debugmodel_1rank", NULL, NULL, NULL, &ref);
    run(base, "autoparallel_dp2", &fsdp2, NULL, NULL, &r2);
    compare(&ref, &r2, "autoparallel dp_shard 2");
    /* at this shape the solver chooses FSDP on dp_shard 2: the hand plan's run, bit for bit */
    static launch_result hand;
    run(base, "hand_fsdp2", &fsdp2, NULL, NULL, &hand);
    expect_bitwise(&r2, &hand, "dp_shard 2: autoparallel against hand FSDP");
    run(base, "autoparallel_dp2_backend", &fsdp2, backend, budget, &r2_backend);
    compare(&ref, &r2_backend, "backend autoparallel dp_shard 2");
    expect_bitwise(&r2, &r2_backend, "dp_shard 2: backend autoparallel against native");
    expect_policy_logged(&r2_backend, "dp_shard 2");
    run(base, "autoparallel_dp2xtp2", &fsdp2tp2, NULL, NULL, &r4);
    compare(&ref, &r4, "autoparallel dp_shard 2 x tp 2");
    run(base, "autoparallel_dp2xtp2_backend", &fsdp2tp2, backend, budget, &r4_backend);
    compare(&ref, &r4_backend, "backend autoparallel dp_shard 2 x tp 2");
    expect_bitwise(&r4, &r4_backend, "dp_shard 2 x tp 2: backend autoparallel against native");
    expect_policy_logged(&r4_backend, "dp_shard 2 x tp 2");
    run(base, "autoparallel_dp2xtp2_again", &fsdp2tp2, NULL, NULL, &r4_again);
    expect_bitwise(&r4, &r4_again, "native rerun");
    run(base, "autoparallel_dp2xtp2_backend_again", &fsdp2tp2, backend, budget, &r4_backend_again);
    expect_bitwise(&r4_backend, &r4_backend_again, "backend rerun");
    launch_end(base);
    return gt_test_finish();
}
