/* test_pp_ep_launch.c — pipelines x expert parallelism on DeepSeek-V3 (issue 39): `graphtrain
 * train` under `mpiexec -np 4`, pp 2 x dp_shard 2 x ep 2.
 *
 * Expert parallelism lives inside each pipeline rank's mesh (ep divides dp_shard x tp as without
 * the pipeline; pp is the outermost dim): the tokens' all-to-alls and the experts' gathers and
 * reduce-scatters over their efsdp group run in the stage parts' programs on the mesh's
 * communicators, the token counts' all-reduce in the expert-bias update, once a step on the
 * block's stage. The reference is dp_shard 2 x ep 2 (2 ranks) accumulating the same 4
 * micro-batches of 1 sequence a rank; deepseek_v3 debugmodel, fp32, seq 32, STEPS steps. The
 * pipeline (1F1B with per-stage programs, and ZBVZeroBubble node by node: 4 stages in a V) must
 * be it bit for bit: the losses and grad norms of every step, the final params xxh64 and the
 * last checkpoint's bytes (expert biases included). Labelled slow (4 ranks of DeepSeek-V3). */
#include "launch.h" /* first: train_child.h defines _GNU_SOURCE */

#define RUN_SECONDS 300.0
#define STEPS 3

static void common(launch_cmd *c, int np, const char *dump)
{
    launch_train(c, np);
    launch_common(c, "debugmodel", dump, STEPS); /* one checkpoint: the last step's */
    launch_add(c, "--model.name=deepseek_v3");
    launch_add(c, "--training.steps=%d", STEPS); /* after launch_common's: the later one holds */
}

/* dp_shard 2 x ep 2 on np processes: the reference (np 2) accumulates 4 micro-batches of 1
 * sequence a rank; under a pipeline (np 4, pp outermost) a local batch of 4 in micro-batches of
 * 1, the same sequences. */
static void mesh(launch_cmd *c, int np, const char *dump)
{
    common(c, np, dump);
    launch_add(c, "--parallelism.data_parallel_shard_degree=2");
    launch_add(c, "--parallelism.expert_parallel_degree=2");
}

static void pipeline(launch_cmd *c, const char *schedule, const char *dump)
{
    mesh(c, 4, dump);
    launch_add(c, "--training.local_batch_size=4");
    launch_add(c, "--parallelism.pipeline_parallel_degree=2");
    launch_add(c, "--parallelism.pipeline_parallel_schedule=%s", schedule);
    launch_add(c, "--parallelism.pipeline_parallel_microbatch_size=1");
}

/* The last record of each step first..STEPS of DUMP/metrics.jsonl into out[first..]; false unless
 * each has one and no earlier step has (a resumed run starts after its checkpoint). */
static bool records(const char *dump, int first, gt_metrics_step *out)
{
    gt_metrics_log log = {0};
    if (!read_metrics(dump, &log)) return false;
    for (int s = 0; s <= STEPS; s++)
        out[s].step = 0;
    for (int64_t k = 0; k < log.n_steps; k++) {
        int64_t s = log.steps[k].step;
        if (s >= 1 && s <= STEPS) out[s] = log.steps[k];
    }
    gt_metrics_log_free(&log);
    bool ok = true;
    for (int s = 1; s <= STEPS; s++)
        ok = ok && (s < first ? out[s].step == 0 : out[s].step == s);
    return ok;
}

/* Runs c with its output into DUMP.txt; the records of steps first..STEPS into r, *hash the final
 * hash (0 when the run names none). */
static bool run(launch_cmd *c, const char *dump, int first, launch_result *r, uint64_t *hash)
{
    char out_path[600];
    snprintf(out_path, sizeof out_path, "%s.txt", dump);
    snprintf(r->dump, sizeof r->dump, "%s", dump);
    double dt = 0;
    int rc = launch_run(c, out_path, RUN_SECONDS, &dt);
    char *out = read_all(out_path, NULL);
    long long f = 0, l = 0;
    r->ok = rc == 0 && out && parse_summary(out, &f, &l, hash) && f == first && l == STEPS &&
            records(dump, first, r->steps);
    printf("%-48s exit %d, %.1f s\n", dump, rc, dt);
    if (!r->ok) launch_show_tail(out_path);
    free(out);
    return r->ok;
}

/* Steps first..STEPS of r against ref: losses and grad norms bitwise, the last checkpoint's
 * bytes, and the hash when given. */
static void compare(const char *name, const launch_result *ref, uint64_t ref_hash,
                    const launch_result *r, uint64_t hash, int first)
{
    int differ = 0;
    for (int s = first; s <= STEPS; s++)
        differ += ref->steps[s].loss != r->steps[s].loss ||
                  ref->steps[s].grad_norm != r->steps[s].grad_norm;
    char pa[700], pb[700];
    launch_ckpt_path(pa, sizeof pa, ref->dump, STEPS);
    launch_ckpt_path(pb, sizeof pb, r->dump, STEPS);
    bool same_ckpt = same_bytes(pa, pb);
    EXPECT(differ == 0, "%s: %d of steps %d..%d differ from the reference's", name, differ, first,
           STEPS);
    EXPECT(hash == ref_hash, "%s: params xxh64 %016llx, the reference's %016llx", name,
           (unsigned long long)hash, (unsigned long long)ref_hash);
    EXPECT(same_ckpt, "%s: the step-%d checkpoint differs from the reference's", name, STEPS);
    printf("  %-30s loss %d..%d and grad_norm bitwise: %s; hash %016llx; checkpoint %s\n", name,
           first, STEPS, differ ? "NO" : "yes", (unsigned long long)hash,
           same_ckpt ? "same" : "DIFFERS");
}

int main(void)
{
    char base[256], dump[400];
    if (!launch_begin(base, sizeof base, "gt_pp_ep_launch")) return 1;
    launch_cmd c;
    static launch_result ref, r;
    uint64_t ref_hash = 0, hash = 0;
    snprintf(dump, sizeof dump, "%s/dp_shard2_ep2", base);
    mesh(&c, 2, dump);
    launch_add(&c, "--training.local_batch_size=1");
    launch_add(&c, "--training.global_batch_size=8");
    if (!run(&c, dump, 1, &ref, &ref_hash)) {
        EXPECT(false, "the dp_shard 2 x ep 2 reference failed");
        return gt_test_finish();
    }
    snprintf(dump, sizeof dump, "%s/pp2_dp_shard2_ep2_1F1B", base);
    pipeline(&c, "1F1B", dump);
    if (run(&c, dump, 1, &r, &hash))
        compare("pp2 x dp_shard2 x ep2 1F1B", &ref, ref_hash, &r, hash, 1);
    else
        EXPECT(false, "%s failed", dump);
    snprintf(dump, sizeof dump, "%s/pp2_dp_shard2_ep2_ZBV_node_by_node", base);
    pipeline(&c, "ZBVZeroBubble", dump);
    launch_add(&c, "--compile.enable=false");
    if (run(&c, dump, 1, &r, &hash))
        compare("pp2 x dp_shard2 x ep2 ZBV eager", &ref, ref_hash, &r, hash, 1);
    else
        EXPECT(false, "%s failed", dump);
    if (gt_test_failed_ == 0) remove_tree(base);
    return gt_test_finish();
}
