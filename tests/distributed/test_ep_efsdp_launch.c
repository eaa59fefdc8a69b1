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
 *     refused naming parallelism.expert_parallel_degree.
 * The runs and the checks they share with test_ep_tp_launch are distributed/ep_tp_launch.h's. */
#include "distributed/ep_tp_launch.h" /* the runs and checks (epl_*) */

/* 8 ranks, test_dsv3_tiny, 5 steps against one rank with the same global batch: efsdp x ep with
 * the MoE replicated over tp (dp_shard 4 x tp 2, ep 2), and HSDP x efsdp x ep (dp_replicate 2 x
 * dp_shard 4, ep 2: the expert gradients reduce-scattered over efsdp, then all-reduced over the
 * replicas). */
static void eight_ranks(const char *base)
{
    static epl_run one, tp2, one8, hsdp;
    epl_layout saved = epl;
    epl.flavor = "test_dsv3_tiny";
    epl.tp = 2;
    epl_run_x(base, "tiny_1rank_b4", 0, 5, 0, NULL, &one, NULL);
    epl_run_x(base, "tiny_shard4_tp2_ep2", 2, 5, 0, NULL, &tp2, NULL);
    epl_close_n(&one, &tp2, 1, 5, "dp_shard 4 x tp 2 x ep 2 vs 1 rank");
    epl.tp = 1;
    epl.rep = 2;
    epl.global = 8;
    epl_run_x(base, "tiny_1rank_b8", 0, 5, 0, NULL, &one8, NULL);
    epl_run_x(base, "tiny_hsdp2_shard4_ep2", 2, 5, 0, NULL, &hsdp, NULL);
    epl_close_n(&one8, &hsdp, 1, 5, "dp_replicate 2 x dp_shard 4 x ep 2 vs 1 rank");
    epl = saved;
}

/* Compile on one rank: saved by rank 0 then loaded by all four, and precompiled by `graphtrain
 * graph` without a launcher then loaded by all four, each bitwise `ref`; asked for by ep 4,
 * refused naming the option. */
static void artifact(const char *base, const epl_run *ref)
{
    char art[400], opt[460], *out = NULL;
    snprintf(art, sizeof art, "%s/artifact", base);
    snprintf(opt, sizeof opt, "--compile.precompile_artifact_dir=%s", art);
    epl_artifact(base, art, "ep2_", 2, ref);

    /* precompiled by `graphtrain graph` (no launcher, one process) for the 4-rank layout */
    launch_cmd c;
    char art2[400], opt2[460], gdump[512], gout[600];
    snprintf(art2, sizeof art2, "%s/artifact_graph", base);
    snprintf(opt2, sizeof opt2, "--compile.precompile_artifact_dir=%s", art2);
    launch_temp_dir(gdump, sizeof gdump, base, "graph_cmd");
    snprintf(gout, sizeof gout, "%s.txt", gdump);
    epl_args(&c, gdump, 2, LAUNCH_STEPS, 0);
    int k = 0;
    while (k < c.n && strcmp(c.buf[k], "train") != 0)
        k++;
    memmove(c.buf, c.buf + (k - 1), (size_t)(c.n - (k - 1)) * sizeof c.buf[0]);
    c.n -= k - 1;
    snprintf(c.buf[1], sizeof c.buf[1], "graph");
    launch_add(&c, "--graph.print=false");
    launch_add(&c, "%s", opt2);
    double dt = 0;
    int rc = launch_run(&c, gout, EPL_SECONDS, &dt);
    printf("%-22s exit %d, %.1f s\n", "graph_cmd", rc, dt);
    EXPECT(rc == 0, "graphtrain graph --compile.precompile_artifact_dir for ep 2: exit %d", rc);
    static epl_run from_graph;
    epl_run_x(base, "ep2_graph", 2, LAUNCH_STEPS, 0, opt2, &from_graph, &out);
    EXPECT(out && strstr(out, "loaded the compiled step"),
           "ep 2: the artifact of graphtrain graph was not loaded");
    free(out);
    epl_bitwise(ref, &from_graph, "precompiled by graphtrain graph vs none");

    launch_outcome o = {0};
    char out_path[700];
    launch_temp_dir(o.dump, sizeof o.dump, base, "ep4_stale");
    snprintf(out_path, sizeof out_path, "%s/output.txt", o.dump);
    epl_args(&c, o.dump, 4, LAUNCH_STEPS, 0);
    launch_add(&c, "%s", opt);
    launch_run_outcome(&c, out_path, EPL_SECONDS, &o);
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

int main(void)
{
    char base[256];
    if (!launch_begin(base, sizeof base, "gt_ep_efsdp_launch")) return 1;
    epl = (epl_layout){"debugmodel", 1, 4, 1, 4, -1};
    static epl_run one, ep2, again, ep1, one_s1, ep2_s1;

    epl_run_x(base, "1rank", 0, LAUNCH_STEPS, 5, NULL, &one, NULL);
    epl_run_x(base, "shard4_ep2", 2, LAUNCH_STEPS, 5, NULL, &ep2, NULL);
    epl_close(&one, &ep2, 1, "dp_shard 4 x ep 2 vs 1 rank");
    epl_run_x(base, "shard4_ep2_again", 2, LAUNCH_STEPS, 0, NULL, &again, NULL);
    epl_bitwise(&ep2, &again, "dp_shard 4 x ep 2: run vs rerun");
    epl_run_x(base, "shard4_ep1", 1, LAUNCH_STEPS, 0, NULL, &ep1, NULL);
    epl_close(&ep1, &ep2, 1, "dp_shard 4: ep 2 vs ep 1");

    epl_run_x(base, "1rank_step1", 0, 1, 1, NULL, &one_s1, NULL);
    char *report = NULL;
    epl_run_x(base, "shard4_ep2_step1", 2, 1, 1, "--metrics.comm_report=true", &ep2_s1, &report);
    epl_same_routing(&one_s1, &ep2_s1);
    token_exchange(report);
    free(report);

    /* a capacity factor far too small: the named error on every rank, no step, no hang */
    epl_refused(base, "ep2_f0.05", 2, "--parallelism.expert_parallel_capacity_factor=0.05",
                "expert-parallel capacity overflow", "layers.1.moe",
                "expert_parallel_capacity_factor to at least");
    epl_resume(base, &one, &ep2, "dp_shard 4 x ep 2 -> 1 rank resume");
    artifact(base, &ep2);
    eight_ranks(base);
    launch_end(base);
    return gt_test_finish();
}
