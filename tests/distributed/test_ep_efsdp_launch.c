/* test_ep_efsdp_launch.c — expert parallelism with ep a proper divisor of dp_shard (issue 37, the
 * efsdp x ep mesh; acceptance on the CPU, fp32, mpiexec -np 4 oversubscribed, debugmodel):
 * `dp_shard 4, ep 2`, i.e. efsdp 2 x ep 2 with ep the inner dim (ranks {0, 1} and {2, 3} exchange
 * tokens; ranks {0, 2} and {1, 3} hold the same experts and gather them).
 *
 *   - 10 steps within 1e-5 relative of one rank with the same global batch, at every step;
 *   - against `dp_shard 4, ep 1` within 1e-5 too, but not bitwise, and this is why: the forward
 *     and the token gradients are the same bits (a routed row is computed by the same fmaf chain
 *     on whichever rank holds its expert and returns to its source row), but an expert's weight
 *     gradient adds the four source ranks' row-ordered parts as (p0 + p1) + (p2 + p3) — summed in
 *     the ep group, then reduce-scattered over efsdp — where FSDP's reduce-scatter adds
 *     ((p0 + p1) + p2) + p3. Moving every part to one rank instead would cost ep times the
 *     gradient bytes of the reduce-scatter (src/parallel/rules_moe_expand.c);
 *   - --metrics.comm_report gives the token exchange's bytes moved and valid bytes (3/8 here);
 *   - the routing of step 1 is the one-rank run's: every layer's expert_bias after step 1 (its
 *     update is a function of the step's per-expert counts only, from zero) is bitwise equal;
 *   - run vs rerun: bitwise (losses, gradient norms, final parameters hash);
 *   - a capacity factor of 0.05 fails on every rank with the error naming the layer and the
 *     factor needed, before any step;
 *   - its step-5 checkpoint resumes on one rank with the uninterrupted one-rank losses (1e-5);
 *   - on 8 ranks (test_dsv3_tiny, 5 steps, within 1e-5 of one rank): dp_shard 4 x tp 2 x ep 2
 *     (the MoE replicated over tp) and HSDP dp_replicate 2 x dp_shard 4 x ep 2;
 *   - compile on one rank: the step artifact saved on rank 0, then loaded by all four, and one
 *     precompiled by `graphtrain graph` without a launcher, then loaded, each bitwise the run
 *     without one; asked for by ep 4 (another expert_parallel_degree), it is
 *     refused naming parallelism.expert_parallel_degree. */
#include "launch.h" /* first: train_child.h defines _GNU_SOURCE */

#define EF_SECONDS 300.0
#define EF_LAYERS 6 /* debugmodel: layer 0 dense, layers 1..5 MoE */

typedef struct {
    launch_result r;
    char hash[32];
} ef_run;

static void read_hash(const char *out_path, char *hash, size_t n)
{
    hash[0] = 0;
    char *text = read_all(out_path, NULL);
    const char *p = text ? strstr(text, "params xxh64 ") : NULL;
    if (p) snprintf(hash, n, "%.16s", p + strlen("params xxh64 "));
    free(text);
}

/* The mesh of the runs with ep > 0: dp_replicate x 4 (dp_shard) x tp, the flavor and the global
 * batch (the same for the one-rank reference). */
static int g_rep = 1, g_tp = 1, g_global = 4;
static const char *g_flavor = "debugmodel";

/* dp_shard 4 with expert_parallel_degree ep (ep 0: one rank, the same global batch), `steps`
 * steps, a checkpoint every `interval` steps (0: none). */
static void ef_args(launch_cmd *c, const char *dump, int ep, int steps, int interval)
{
    int dp = g_rep * 4;
    launch_train(c, ep ? dp * g_tp : 0);
    launch_common(c, g_flavor, dump, interval ? interval : 5);
    launch_add(c, "--model.name=deepseek_v3");
    launch_add(c, "--training.steps=%d", steps);
    if (!interval) launch_add(c, "--checkpoint.enable=false");
    launch_add(c, "--training.local_batch_size=%d", ep ? g_global / dp : g_global);
    if (!ep) return;
    launch_add(c, "--parallelism.data_parallel_replicate_degree=%d", g_rep);
    launch_add(c, "--parallelism.data_parallel_shard_degree=4");
    launch_add(c, "--parallelism.tensor_parallel_degree=%d", g_tp);
    launch_add(c, "--parallelism.expert_parallel_degree=%d", ep);
}

/* extra: one more option or NULL; a resumed run (extra --checkpoint.load_step=5) records steps
 * 6.. only. out_text: the output, or NULL. */
static void run_x(const char *base, const char *name, int ep, int steps, int interval,
                  const char *extra, ef_run *out, char **out_text, bool fresh)
{
    launch_cmd c;
    char out_path[700];
    if (fresh) launch_temp_dir(out->r.dump, sizeof out->r.dump, base, name);
    snprintf(out_path, sizeof out_path, "%s/output_%s.txt", out->r.dump, name);
    ef_args(&c, out->r.dump, ep, steps, interval);
    if (extra) launch_add(&c, "%s", extra);
    double dt = 0;
    int rc = launch_run(&c, out_path, EF_SECONDS, &dt);
    bool resumed = extra && strstr(extra, "load_step");
    out->r.ok = rc == 0 && (resumed ? launch_resumed_records(out->r.dump, out->r.steps)
                                    : last_records(out->r.dump, steps, out->r.steps, NULL));
    if (out_text) *out_text = read_all(out_path, NULL);
    read_hash(out_path, out->hash, sizeof out->hash);
    printf("%-22s exit %d, %.1f s, params xxh64 %s\n", name, rc, dt, out->hash);
    EXPECT(out->r.ok && out->hash[0], "%s: exit %d, metrics or hash missing", name, rc);
    if (!out->r.ok) launch_show_tail(out_path);
}

static void bitwise(const ef_run *a, const ef_run *b, const char *what)
{
    if (!a->r.ok || !b->r.ok) return;
    int differ = 0;
    for (int s = 1; s <= LAUNCH_STEPS; s++)
        differ += a->r.steps[s].loss != b->r.steps[s].loss ||
                  a->r.steps[s].grad_norm != b->r.steps[s].grad_norm;
    printf("  %-40s %d step(s) differ; hashes %s %s\n", what, differ, a->hash, b->hash);
    EXPECT(differ == 0, "%s: %d steps' loss or grad_norm bits differ", what, differ);
    EXPECT(strcmp(a->hash, b->hash) == 0, "%s: final params hash %s vs %s", what, a->hash, b->hash);
}

static void close_to_n(const ef_run *a, const ef_run *b, int first, int last, double tol,
                       const char *what)
{
    if (!a->r.ok || !b->r.ok) return;
    double dl = launch_loss_diff(a->r.steps, b->r.steps, first, last);
    printf("  %-40s loss diff %.2e (steps %d..%d)\n", what, dl, first, last);
    EXPECT(dl <= tol, "%s: losses differ by %.3g relative (> %g)", what, dl, tol);
}

static void close_to(const ef_run *a, const ef_run *b, int first, double tol, const char *what)
{
    close_to_n(a, b, first, LAUNCH_STEPS, tol, what);
}

/* 8 ranks, test_dsv3_tiny, 5 steps against one rank with the same global batch: efsdp x ep with
 * the MoE replicated over tp (dp_shard 4 x tp 2, ep 2), and HSDP x efsdp x ep (dp_replicate 2 x
 * dp_shard 4, ep 2: the expert gradients reduce-scattered over efsdp, then all-reduced over the
 * replicas). */
static void eight_ranks(const char *base)
{
    static ef_run one, tp2, one8, hsdp;
    g_flavor = "test_dsv3_tiny";
    g_tp = 2;
    run_x(base, "tiny_1rank_b4", 0, 5, 0, NULL, &one, NULL, true);
    run_x(base, "tiny_shard4_tp2_ep2", 2, 5, 0, NULL, &tp2, NULL, true);
    close_to_n(&one, &tp2, 1, 5, 1e-5, "dp_shard 4 x tp 2 x ep 2 vs 1 rank");
    g_tp = 1;
    g_rep = 2;
    g_global = 8;
    run_x(base, "tiny_1rank_b8", 0, 5, 0, NULL, &one8, NULL, true);
    run_x(base, "tiny_hsdp2_shard4_ep2", 2, 5, 0, NULL, &hsdp, NULL, true);
    close_to_n(&one8, &hsdp, 1, 5, 1e-5, "dp_replicate 2 x dp_shard 4 x ep 2 vs 1 rank");
    g_rep = 1;
    g_global = 4;
    g_flavor = "debugmodel";
}

/* Step 1's routing: every MoE layer's expert_bias in the two runs' step-1 checkpoints. */
static void same_routing(const ef_run *a, const ef_run *b)
{
    if (!a->r.ok || !b->r.ok) return;
    char pa[700], pb[700];
    launch_ckpt_path(pa, sizeof pa, a->r.dump, 1);
    launch_ckpt_path(pb, sizeof pb, b->r.dump, 1);
    gt_safetensors fa, fb;
    gt_error err = {0};
    EXPECT_OK(gt_safetensors_open(pa, &fa, &err), &err);
    EXPECT_OK(gt_safetensors_open(pb, &fb, &err), &err);
    int same = 0, nonzero = 0;
    for (int l = 1; l < EF_LAYERS; l++) {
        char name[64];
        snprintf(name, sizeof name, "layers.%d.moe.expert_bias_E", l);
        gt_tensor ta = {0}, tb = {0};
        EXPECT_OK(gt_safetensors_get(&fa, name, &ta, &err), &err);
        EXPECT_OK(gt_safetensors_get(&fb, name, &tb, &err), &err);
        if (ta.data && tb.data && gt_tensor_nbytes(&ta) == gt_tensor_nbytes(&tb)) {
            same += memcmp(ta.data, tb.data, gt_tensor_nbytes(&ta)) == 0;
            for (int64_t i = 0; i < gt_tensor_numel(&ta); i++)
                nonzero += gt_tensor_get_f32(&ta, i) != 0.0;
        }
        gt_tensor_free(&ta);
        gt_tensor_free(&tb);
    }
    gt_safetensors_close(&fa);
    gt_safetensors_close(&fb);
    printf("  %-40s %d of %d layers' expert_bias bitwise (%d nonzero entries)\n",
           "step-1 routing vs one rank", same, EF_LAYERS - 1, nonzero);
    EXPECT(same == EF_LAYERS - 1, "step 1: %d of %d layers route as one rank", same, EF_LAYERS - 1);
    EXPECT(nonzero > 0, "step 1: every expert_bias is still zero (the check would be empty)");
}

/* The step-5 checkpoint of ep2 resumed on one rank: steps 6..10 as the uninterrupted one. */
static void resume(const char *base, const ef_run *one, const ef_run *ep2)
{
    if (!one->r.ok || !ep2->r.ok) return;
    static ef_run back;
    launch_temp_dir(back.r.dump, sizeof back.r.dump, base, "resume_1rank");
    char cmd[2400];
    snprintf(cmd, sizeof cmd,
             "mkdir -p '%s/checkpoint' && cp -r '%s/checkpoint/step-5' '%s/checkpoint/'",
             back.r.dump, ep2->r.dump, back.r.dump);
    EXPECT(system(cmd) == 0, "copying the step-5 checkpoint");
    run_x(base, "resume_1rank", 0, LAUNCH_STEPS, 5, "--checkpoint.load_step=5", &back, NULL, false);
    close_to(one, &back, 6, 1e-5, "dp_shard 4 x ep 2 -> 1 rank resume");
}

/* Compile on one rank: saved by rank 0 then loaded by all four, and precompiled by `graphtrain
 * graph` without a launcher then loaded by all four, each bitwise `ref`; asked for by ep 4,
 * refused naming the option. */
static void artifact(const char *base, const ef_run *ref)
{
    static ef_run saved, loaded;
    char art[400], opt[460], *out = NULL;
    snprintf(art, sizeof art, "%s/artifact", base);
    snprintf(opt, sizeof opt, "--compile.precompile_artifact_dir=%s", art);
    run_x(base, "ep2_save", 2, LAUNCH_STEPS, 0, opt, &saved, &out, true);
    EXPECT(out && strstr(out, "compiled the step on rank 0"), "ep 2: the artifact was not saved");
    free(out);
    bitwise(ref, &saved, "artifact saved vs none");
    run_x(base, "ep2_load", 2, LAUNCH_STEPS, 0, opt, &loaded, &out, true);
    EXPECT(out && strstr(out, "loaded the compiled step"), "ep 2: the artifact was not loaded");
    free(out);
    bitwise(ref, &loaded, "artifact loaded vs none");

    /* precompiled by `graphtrain graph` (no launcher, one process) for the 4-rank layout */
    launch_cmd c;
    char art2[400], opt2[460], gdump[512], gout[600];
    snprintf(art2, sizeof art2, "%s/artifact_graph", base);
    snprintf(opt2, sizeof opt2, "--compile.precompile_artifact_dir=%s", art2);
    launch_temp_dir(gdump, sizeof gdump, base, "graph_cmd");
    snprintf(gout, sizeof gout, "%s.txt", gdump);
    ef_args(&c, gdump, 2, LAUNCH_STEPS, 0);
    int k = 0;
    while (k < c.n && strcmp(c.buf[k], "train") != 0)
        k++;
    memmove(c.buf, c.buf + (k - 1), (size_t)(c.n - (k - 1)) * sizeof c.buf[0]);
    c.n -= k - 1;
    snprintf(c.buf[1], sizeof c.buf[1], "graph");
    launch_add(&c, "--graph.print=false");
    launch_add(&c, "%s", opt2);
    double dt = 0;
    int rc = launch_run(&c, gout, EF_SECONDS, &dt);
    printf("%-22s exit %d, %.1f s\n", "graph_cmd", rc, dt);
    EXPECT(rc == 0, "graphtrain graph --compile.precompile_artifact_dir for ep 2: exit %d", rc);
    static ef_run from_graph;
    run_x(base, "ep2_graph", 2, LAUNCH_STEPS, 0, opt2, &from_graph, &out, true);
    EXPECT(out && strstr(out, "loaded the compiled step"),
           "ep 2: the artifact of graphtrain graph was not loaded");
    free(out);
    bitwise(ref, &from_graph, "precompiled by graphtrain graph vs none");

    launch_outcome o = {0};
    char out_path[700];
    launch_temp_dir(o.dump, sizeof o.dump, base, "ep4_stale");
    snprintf(out_path, sizeof out_path, "%s/output.txt", o.dump);
    ef_args(&c, o.dump, 4, LAUNCH_STEPS, 0);
    launch_add(&c, "%s", opt);
    launch_run_outcome(&c, out_path, EF_SECONDS, &o);
    bool ok = true;
    LAUNCH_CHECK(o.rc > 0 && strstr(o.out, "parallelism.expert_parallel_degree"),
                 "the ep 2 artifact asked for by ep 4: exit %d, the option named", o.rc);
    launch_outcome_free(&o, !ok);
}

/* The comm report's token-exchange line: bytes moved vs valid bytes. debugmodel routes
 * T·K = 32·3 rows per rank, and each all_to_all moves ep·efsdp = 4 blocks of the worst case
 * C = T·min(K, E/dp_shard) = 64 rows: 96 of 256 rows valid on average, 37.5 %. */
static void token_exchange(const char *text)
{
    const char *p = text ? strstr(text, "token exchange ") : NULL;
    int count = 0;
    unsigned long long moved = 0, valid = 0;
    bool parsed = p && sscanf(p, "token exchange %d all_to_all: %llu bytes moved, %llu valid",
                              &count, &moved, &valid) == 3;
    printf("  %-40s %d all_to_all, %llu bytes moved, %llu valid\n", "comm report: token exchange",
           count, moved, valid);
    EXPECT(parsed && count > 0, "the comm report has no token-exchange line");
    EXPECT(parsed && valid * 8 == moved * 3, "token exchange: %llu valid of %llu, want 3/8", valid,
           moved);
}

/* A capacity factor far too small: the named error on every rank, no step, no hang. */
static void overflow(const char *base)
{
    launch_cmd c;
    launch_outcome o = {0};
    char out_path[700];
    launch_temp_dir(o.dump, sizeof o.dump, base, "ep2_f0.05");
    snprintf(out_path, sizeof out_path, "%s/output.txt", o.dump);
    ef_args(&c, o.dump, 2, 2, 0);
    launch_add(&c, "--parallelism.expert_parallel_capacity_factor=0.05");
    launch_run_outcome(&c, out_path, EF_SECONDS, &o);
    bool ok = true;
    printf("%-22s exit %d, %.1f s\n", "ep2_f0.05", o.rc, o.seconds);
    LAUNCH_CHECK(o.rc > 0, "capacity 0.05: exit %d, expected a failure (not a hang)", o.rc);
    LAUNCH_CHECK(strstr(o.out, "expert-parallel capacity overflow") &&
                     strstr(o.out, "layers.1.moe") &&
                     strstr(o.out, "expert_parallel_capacity_factor to at least"),
                 "capacity 0.05: the error names the overflow, the layer and the factor");
    LAUNCH_CHECK(o.records == 0, "capacity 0.05: %d steps recorded", o.records);
    launch_outcome_free(&o, !ok);
}

int main(void)
{
    char base[256];
    if (!launch_begin(base, sizeof base, "gt_ep_efsdp_launch")) return 1;
    static ef_run one, ep2, again, ep1, one_s1, ep2_s1;

    run_x(base, "1rank", 0, LAUNCH_STEPS, 5, NULL, &one, NULL, true);
    run_x(base, "shard4_ep2", 2, LAUNCH_STEPS, 5, NULL, &ep2, NULL, true);
    close_to(&one, &ep2, 1, 1e-5, "dp_shard 4 x ep 2 vs 1 rank");
    run_x(base, "shard4_ep2_again", 2, LAUNCH_STEPS, 0, NULL, &again, NULL, true);
    bitwise(&ep2, &again, "dp_shard 4 x ep 2: run vs rerun");
    run_x(base, "shard4_ep1", 1, LAUNCH_STEPS, 0, NULL, &ep1, NULL, true);
    close_to(&ep1, &ep2, 1, 1e-5, "dp_shard 4: ep 2 vs ep 1");

    run_x(base, "1rank_step1", 0, 1, 1, NULL, &one_s1, NULL, true);
    char *report = NULL;
    run_x(base, "shard4_ep2_step1", 2, 1, 1, "--metrics.comm_report=true", &ep2_s1, &report, true);
    same_routing(&one_s1, &ep2_s1);
    token_exchange(report);
    free(report);

    overflow(base);
    resume(base, &one, &ep2);
    artifact(base, &ep2);
    eight_ranks(base);
    if (gt_test_failed_ == 0 && !getenv("GT_KEEP")) remove_tree(base);
    return gt_test_finish();
}
