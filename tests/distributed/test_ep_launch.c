/* test_ep_launch.c — expert parallelism (issue 37, acceptance on the CPU, fp32, mpiexec -np 2).
 *
 *   - DeepSeek-V3 debugmodel, 5 steps, `dp_shard 2, ep 2` against `dp_shard 2, ep 1`: the losses
 *     and gradient norms of every step and the final parameters' hash (every whole parameter and
 *     every buffer, expert_bias among them) are bitwise equal. Why they can be: a routed row is
 *     computed by the same fmaf chain on whichever rank holds its expert (grouped_matmul's
 *     M-invariance) and goes back to its source row, and an expert's weight gradient is each
 *     source rank's row-ordered part added in rank order, as FSDP's reduce-scatter adds them
 *     (src/parallel/rules_moe_expand.c).
 *   - test_dsv3_tiny with capacity factor 1.0, and 0.75 (smaller blocks that still hold every
 *     pair's rows on this data), is bitwise the worst case (0); a factor of 0.05
 *     fails on both ranks with the error naming the layer and the factor needed, in bounded time
 *     (no rank left waiting in a collective).
 *   - An expert_parallel_degree that does not divide dp_shard x tp is refused naming the option.
 *   - test_dsv3_tiny, 10 steps: ep 2 within 1e-6 relative of one rank (same global batch); its
 *     step-5 checkpoint resumes on one rank with the uninterrupted one-rank losses (1e-6) and on
 *     dp_shard 2 x tp 2 x ep 2 (1e-5).
 *   - HSDP x EP (dp_replicate 2 x dp_shard 2, 4 ranks): ep 2 bitwise ep 1 (test_dsv3_tiny); and
 *     dp_shard 2 x tp 2 x ep 2 (4 ranks) bitwise ep 1 on that layout, and within 1e-5 relative of
 *     one rank at every step.
 *   - The seed PR's layout dp_shard 4 x tp 2 x ep 4 (8 ranks): bitwise ep 1 on that layout; its
 *     step artifact saved on rank 0 and then loaded by all 8, each bitwise the direct compile.
 *   - Compile on one rank: the ep 2 step artifact saved, then loaded, and one precompiled by
 *     `graphtrain graph` without a launcher then loaded, each bitwise the run without one; asked
 * for by ep 1, it is refused naming parallelism.expert_parallel_degree.
 */
#include "launch.h" /* first: train_child.h defines _GNU_SOURCE */

#define EP_STEPS 5
#define EP_SECONDS 300.0

typedef struct {
    launch_result r;
    char hash[32];
} ep_run;

/* The "params xxh64 H" of a run's output. */
static void read_hash(const char *out_path, char *hash, size_t n)
{
    hash[0] = 0;
    char *text = read_all(out_path, NULL);
    const char *p = text ? strstr(text, "params xxh64 ") : NULL;
    if (p) snprintf(hash, n, "%.16s", p + strlen("params xxh64 "));
    free(text);
}

/* The mesh of the runs with ep > 0: dp_replicate x dp_shard x tp (the global batch stays 4). */
static int g_rep = 1, g_shard = 2, g_tp = 1;

/* A run of `steps` steps on 2 ranks (dp_shard 2, expert_parallel_degree ep; ep 0: one rank with
 * the same global batch of 4), checkpoints only with `steps` 10 (every 5 steps). */
static void ep_args_n(launch_cmd *c, const char *flavor, const char *dump, int ep,
                      const char *factor, int steps)
{
    launch_train(c, ep ? g_rep * g_shard * g_tp : 0);
    launch_common(c, flavor, dump, 5);
    launch_add(c, "--model.name=deepseek_v3");
    launch_add(c, "--training.steps=%d", steps);
    if (steps != LAUNCH_STEPS) launch_add(c, "--checkpoint.enable=false");
    launch_add(c, "--training.local_batch_size=%d", ep ? 4 / (g_rep * g_shard) : 4);
    if (!ep) return;
    launch_add(c, "--parallelism.data_parallel_replicate_degree=%d", g_rep);
    launch_add(c, "--parallelism.tensor_parallel_degree=%d", g_tp);
    launch_add(c, "--parallelism.data_parallel_shard_degree=%d", g_shard);
    launch_add(c, "--parallelism.expert_parallel_degree=%d", ep);
    if (factor) launch_add(c, "--parallelism.expert_parallel_capacity_factor=%s", factor);
}

static void ep_args(launch_cmd *c, const char *flavor, const char *dump, int ep, const char *factor)
{
    ep_args_n(c, flavor, dump, ep, factor, EP_STEPS);
}

/* extra: one more option or NULL; steps: EP_STEPS, or LAUNCH_STEPS with checkpoints; a resumed
 * run (extra --checkpoint.load_step=5) records steps 6.. only. out_text: the output, or NULL. */
static void run_x(const char *base, const char *name, const char *flavor, int ep,
                  const char *factor, const char *extra, int steps, ep_run *out, char **out_text,
                  bool fresh)
{
    launch_cmd c;
    char out_path[700];
    if (fresh) launch_temp_dir(out->r.dump, sizeof out->r.dump, base, name);
    snprintf(out_path, sizeof out_path, "%s/output_%s.txt", out->r.dump, name);
    ep_args_n(&c, flavor, out->r.dump, ep, factor, steps);
    if (extra) launch_add(&c, "%s", extra);
    double dt = 0;
    int rc = launch_run(&c, out_path, EP_SECONDS, &dt);
    bool resumed = extra && strstr(extra, "load_step");
    out->r.ok = rc == 0 && (resumed ? launch_resumed_records(out->r.dump, out->r.steps)
                                    : last_records(out->r.dump, steps, out->r.steps, NULL));
    if (out_text) *out_text = read_all(out_path, NULL);
    read_hash(out_path, out->hash, sizeof out->hash);
    printf("%-22s exit %d, %.1f s, params xxh64 %s\n", name, rc, dt, out->hash);
    EXPECT(out->r.ok && out->hash[0], "%s: exit %d, metrics or hash missing", name, rc);
    if (!out->r.ok) launch_show_tail(out_path);
}

static void run(const char *base, const char *name, const char *flavor, int ep, const char *factor,
                ep_run *out)
{
    run_x(base, name, flavor, ep, factor, NULL, EP_STEPS, out, NULL, true);
}

static void bitwise(const ep_run *a, const ep_run *b, const char *what)
{
    if (!a->r.ok || !b->r.ok) return;
    int differ = 0;
    for (int s = 1; s <= EP_STEPS; s++)
        differ += a->r.steps[s].loss != b->r.steps[s].loss ||
                  a->r.steps[s].grad_norm != b->r.steps[s].grad_norm;
    printf("  %-32s %d step(s) differ; hashes %s %s\n", what, differ, a->hash, b->hash);
    EXPECT(differ == 0, "%s: %d steps' loss or grad_norm bits differ", what, differ);
    EXPECT(strcmp(a->hash, b->hash) == 0, "%s: final params hash %s vs %s", what, a->hash, b->hash);
}

static void overflow(const char *base)
{
    launch_cmd c;
    launch_outcome o = {0};
    char out_path[700];
    launch_temp_dir(o.dump, sizeof o.dump, base, "tiny_ep2_f0.05");
    snprintf(out_path, sizeof out_path, "%s/output.txt", o.dump);
    ep_args(&c, "test_dsv3_tiny", o.dump, 2, "0.05");
    launch_run_outcome(&c, out_path, EP_SECONDS, &o);
    bool ok = true;
    printf("%-22s exit %d, %.1f s\n", "tiny_ep2_f0.05", o.rc, o.seconds);
    LAUNCH_CHECK(o.rc > 0, "capacity 0.05: exit %d, expected a failure (not a hang)", o.rc);
    LAUNCH_CHECK(strstr(o.out, "expert-parallel capacity overflow") &&
                     strstr(o.out, "layers.1.moe") &&
                     strstr(o.out, "expert_parallel_capacity_factor to at least"),
                 "capacity 0.05: the error names the overflow, the layer and the factor");
    LAUNCH_CHECK(o.records == 0, "capacity 0.05: %d steps recorded", o.records);
    launch_outcome_free(&o, !ok);
}

static void refused(const char *base)
{
    launch_cmd c;
    launch_outcome o = {0};
    char out_path[700];
    launch_temp_dir(o.dump, sizeof o.dump, base, "refused");
    snprintf(out_path, sizeof out_path, "%s/output.txt", o.dump);
    launch_train(&c, 0);
    launch_common(&c, "test_dsv3_tiny", o.dump, EP_STEPS);
    launch_add(&c, "--model.name=deepseek_v3");
    launch_add(&c, "--parallelism.data_parallel_shard_degree=1");
    launch_add(&c, "--parallelism.expert_parallel_degree=2");
    launch_run_outcome(&c, out_path, EP_SECONDS, &o);
    bool ok = true;
    LAUNCH_CHECK(o.rc > 0 && strstr(o.out, "parallelism.expert_parallel_degree = 2 must divide"),
                 "ep 2 on one rank: exit %d, the error names the option", o.rc);
    launch_outcome_free(&o, !ok);
}

/* The step-5 checkpoint of test_dsv3_tiny on dp_shard 2, ep 2 resumed on one rank: steps 6..10
 * as the uninterrupted one-rank run within 1e-6 relative (the per-rank sums of the data-parallel
 * runs round differently from one rank's); resumed on dp_shard 2 x tp 2 x ep 2: within 1e-5.
 * The experts are stored whole in the checkpoint. */
static void resume(const char *base)
{
    static ep_run one, ep2, back;
    run_x(base, "tiny_1rank_10", "test_dsv3_tiny", 0, NULL, NULL, LAUNCH_STEPS, &one, NULL, true);
    run_x(base, "tiny_ep2_10", "test_dsv3_tiny", 2, NULL, NULL, LAUNCH_STEPS, &ep2, NULL, true);
    if (!one.r.ok || !ep2.r.ok) return;
    double whole = launch_loss_diff(one.r.steps, ep2.r.steps, 1, LAUNCH_STEPS);
    printf("  %-32s loss diff %.2e\n", "ep 2 vs 1 rank, 10 steps", whole);
    EXPECT(whole <= 1e-6, "ep 2 vs one rank: losses differ by %.3g relative", whole);
    launch_temp_dir(back.r.dump, sizeof back.r.dump, base, "tiny_resume_1rank");
    char cmd[2400];
    snprintf(cmd, sizeof cmd,
             "mkdir -p '%s/checkpoint' && cp -r '%s/checkpoint/step-5' '%s/checkpoint/'",
             back.r.dump, ep2.r.dump, back.r.dump);
    EXPECT(system(cmd) == 0, "copying the step-5 checkpoint");
    run_x(base, "tiny_resume_1rank", "test_dsv3_tiny", 0, NULL, "--checkpoint.load_step=5",
          LAUNCH_STEPS, &back, NULL, false);
    if (!back.r.ok) return;
    double dl = launch_loss_diff(one.r.steps, back.r.steps, 6, LAUNCH_STEPS);
    printf("  %-32s loss diff %.2e (steps 6..10)\n", "ep 2 -> 1 rank resume", dl);
    EXPECT(dl <= 1e-6, "ep 2 checkpoint resumed on one rank: losses differ by %.3g", dl);

    /* ... and on dp_shard 2 x tp 2 x ep 2 (4 ranks) */
    static ep_run tp_back;
    launch_temp_dir(tp_back.r.dump, sizeof tp_back.r.dump, base, "tiny_resume_tp2_ep2");
    snprintf(cmd, sizeof cmd,
             "mkdir -p '%s/checkpoint' && cp -r '%s/checkpoint/step-5' '%s/checkpoint/'",
             tp_back.r.dump, ep2.r.dump, tp_back.r.dump);
    EXPECT(system(cmd) == 0, "copying the step-5 checkpoint");
    g_tp = 2;
    run_x(base, "tiny_resume_tp2_ep2", "test_dsv3_tiny", 2, NULL, "--checkpoint.load_step=5",
          LAUNCH_STEPS, &tp_back, NULL, false);
    g_tp = 1;
    if (!tp_back.r.ok) return;
    dl = launch_loss_diff(one.r.steps, tp_back.r.steps, 6, LAUNCH_STEPS);
    printf("  %-32s loss diff %.2e (steps 6..10)\n", "ep 2 -> tp 2 x ep 2 resume", dl);
    EXPECT(dl <= 1e-5, "ep 2 checkpoint resumed on dp_shard 2 x tp 2 x ep 2: losses differ by %.3g",
           dl);
}

/* Compile on one rank: test_dsv3_tiny on dp_shard 2, ep 2 saves its step artifact, then loads
 * it; both are bitwise the run without one (ref), and so is the run that loads the artifact
 * `graphtrain graph` precompiled without a launcher; the artifact asked for by ep 1 is refused
 * naming the option. */
static void artifact(const char *base, const ep_run *ref)
{
    static ep_run saved, loaded;
    char art[400], opt[460], *out = NULL;
    snprintf(art, sizeof art, "%s/artifact", base);
    snprintf(opt, sizeof opt, "--compile.precompile_artifact_dir=%s", art);
    run_x(base, "tiny_ep2_save", "test_dsv3_tiny", 2, NULL, opt, EP_STEPS, &saved, &out, true);
    EXPECT(out && strstr(out, "compiled the step on rank 0"), "ep 2: the artifact was not saved");
    free(out);
    bitwise(ref, &saved, "ep 2: artifact saved vs none");
    run_x(base, "tiny_ep2_load", "test_dsv3_tiny", 2, NULL, opt, EP_STEPS, &loaded, &out, true);
    EXPECT(out && strstr(out, "loaded the compiled step"), "ep 2: the artifact was not loaded");
    free(out);
    bitwise(ref, &loaded, "ep 2: artifact loaded vs none");

    /* precompiled by `graphtrain graph` (no launcher, one process) for the 2-rank layout */
    launch_cmd c;
    char art2[400], opt2[460], gdump[512], gout[600];
    snprintf(art2, sizeof art2, "%s/artifact_graph", base);
    snprintf(opt2, sizeof opt2, "--compile.precompile_artifact_dir=%s", art2);
    launch_temp_dir(gdump, sizeof gdump, base, "graph_cmd");
    snprintf(gout, sizeof gout, "%s.txt", gdump);
    ep_args(&c, "test_dsv3_tiny", gdump, 2, NULL);
    int k = 0;
    while (k < c.n && strcmp(c.buf[k], "train") != 0)
        k++;
    memmove(c.buf, c.buf + (k - 1), (size_t)(c.n - (k - 1)) * sizeof c.buf[0]);
    c.n -= k - 1;
    snprintf(c.buf[1], sizeof c.buf[1], "graph");
    launch_add(&c, "--graph.print=false");
    launch_add(&c, "%s", opt2);
    double dt = 0;
    int rc = launch_run(&c, gout, EP_SECONDS, &dt);
    printf("%-22s exit %d, %.1f s\n", "graph_cmd", rc, dt);
    EXPECT(rc == 0, "graphtrain graph --compile.precompile_artifact_dir for ep 2: exit %d", rc);
    static ep_run from_graph;
    run_x(base, "tiny_ep2_graph", "test_dsv3_tiny", 2, NULL, opt2, EP_STEPS, &from_graph, &out,
          true);
    EXPECT(out && strstr(out, "loaded the compiled step"),
           "ep 2: the artifact of graphtrain graph was not loaded");
    free(out);
    bitwise(ref, &from_graph, "ep 2: precompiled by graphtrain graph vs none");

    launch_outcome o = {0};
    char out_path[700];
    launch_temp_dir(o.dump, sizeof o.dump, base, "tiny_ep1_stale");
    snprintf(out_path, sizeof out_path, "%s/output.txt", o.dump);
    ep_args(&c, "test_dsv3_tiny", o.dump, 1, NULL);
    launch_add(&c, "%s", opt);
    launch_run_outcome(&c, out_path, EP_SECONDS, &o);
    bool ok = true;
    LAUNCH_CHECK(o.rc > 0 && strstr(o.out, "parallelism.expert_parallel_degree"),
                 "the ep 2 artifact asked for by ep 1: exit %d, the option named", o.rc);
    launch_outcome_free(&o, !ok);
}

int main(void)
{
    char base[256];
    if (!launch_begin(base, sizeof base, "gt_ep_launch")) return 1;
    static ep_run ep1, ep2, worst, one, part;

    run(base, "debugmodel_ep1", "debugmodel", 1, NULL, &ep1);
    run(base, "debugmodel_ep2", "debugmodel", 2, NULL, &ep2);
    bitwise(&ep1, &ep2, "debugmodel dp_shard 2: ep 2 vs ep 1");

    run(base, "tiny_ep2", "test_dsv3_tiny", 2, NULL, &worst);
    run(base, "tiny_ep2_f1.0", "test_dsv3_tiny", 2, "1.0", &one);
    bitwise(&worst, &one, "test_dsv3_tiny ep 2: factor 1.0 vs worst case");
    /* 96 rows per pair instead of 128: the zero tails are shorter, no row is dropped */
    run(base, "tiny_ep2_f0.75", "test_dsv3_tiny", 2, "0.75", &part);
    bitwise(&worst, &part, "test_dsv3_tiny ep 2: factor 0.75 vs worst case");

    overflow(base);
    refused(base);
    resume(base);
    artifact(base, &worst);

    /* HSDP x EP: dp_replicate 2 x dp_shard 2 (4 ranks), ep 2 vs ep 1: the expert gradients are
     * reduced over dp_shard (rank order) and then all-reduced over the replicas in both */
    static ep_run h1, h2;
    g_rep = 2;
    run(base, "tiny_hsdp_ep1", "test_dsv3_tiny", 1, NULL, &h1);
    run(base, "tiny_hsdp_ep2", "test_dsv3_tiny", 2, NULL, &h2);
    bitwise(&h1, &h2, "test_dsv3_tiny HSDP 2x2: ep 2 vs ep 1");
    g_rep = 1;

    /* the seed layout dp_shard 2 x tp 2 x ep 2 (4 ranks; the MoE layers replicated over tp):
     * bitwise ep 1 on the same layout, and within 1e-5 relative of one rank per step */
    static ep_run t1, t2, single;
    g_tp = 2;
    run(base, "tiny_tp2_ep1", "test_dsv3_tiny", 1, NULL, &t1);
    run(base, "tiny_tp2_ep2", "test_dsv3_tiny", 2, NULL, &t2);
    g_tp = 1;
    bitwise(&t1, &t2, "test_dsv3_tiny dp_shard 2 x tp 2: ep 2 vs ep 1");
    run(base, "tiny_1rank", "test_dsv3_tiny", 0, NULL, &single);
    if (single.r.ok && t2.r.ok) {
        double dl = launch_loss_diff(single.r.steps, t2.r.steps, 1, EP_STEPS);
        printf("  %-32s loss diff %.2e\n", "dp_shard 2 x tp 2 x ep 2 vs 1 rank", dl);
        EXPECT(dl <= 1e-5, "dp_shard 2 x tp 2 x ep 2 vs one rank: losses differ by %.3g", dl);
    }

    /* the seed PR's layout, dp_shard 4 x tp 2 x ep 4 on 8 ranks (one token row block per rank):
     * bitwise ep 1 on that layout (4-way rank-order sums either way), and its artifact saved and
     * loaded bitwise the direct compile */
    static ep_run s1, s4, s4_save, s4_load;
    char art8[400], opt8[460], *text = NULL;
    snprintf(art8, sizeof art8, "%s/artifact8", base);
    snprintf(opt8, sizeof opt8, "--compile.precompile_artifact_dir=%s", art8);
    g_shard = 4;
    g_tp = 2;
    run(base, "tiny_seed_ep1", "test_dsv3_tiny", 1, NULL, &s1);
    run(base, "tiny_seed_ep4", "test_dsv3_tiny", 4, NULL, &s4);
    bitwise(&s1, &s4, "dp_shard 4 x tp 2: ep 4 vs ep 1");
    run_x(base, "tiny_seed_save", "test_dsv3_tiny", 4, NULL, opt8, EP_STEPS, &s4_save, &text, true);
    EXPECT(text && strstr(text, "compiled the step on rank 0"), "8 ranks: the artifact not saved");
    free(text);
    run_x(base, "tiny_seed_load", "test_dsv3_tiny", 4, NULL, opt8, EP_STEPS, &s4_load, &text, true);
    EXPECT(text && strstr(text, "loaded the compiled step"), "8 ranks: the artifact not loaded");
    free(text);
    g_shard = 2;
    g_tp = 1;
    bitwise(&s4, &s4_save, "dp_shard 4 x tp 2 x ep 4: saved vs direct");
    bitwise(&s4, &s4_load, "dp_shard 4 x tp 2 x ep 4: loaded vs direct");
    launch_end(base);
    return gt_test_finish();
}
