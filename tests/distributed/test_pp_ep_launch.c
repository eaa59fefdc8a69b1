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
    if (!launch_run_from(&c, dump, 1, STEPS, RUN_SECONDS, &ref, &ref_hash)) {
        EXPECT(false, "the dp_shard 2 x ep 2 reference failed");
        return gt_test_finish();
    }
    snprintf(dump, sizeof dump, "%s/pp2_dp_shard2_ep2_1F1B", base);
    pipeline(&c, "1F1B", dump);
    if (launch_run_from(&c, dump, 1, STEPS, RUN_SECONDS, &r, &hash))
        launch_compare_from("pp2 x dp_shard2 x ep2 1F1B", &ref, ref_hash, &r, hash, 1, STEPS);
    else
        EXPECT(false, "%s failed", dump);
    snprintf(dump, sizeof dump, "%s/pp2_dp_shard2_ep2_ZBV_node_by_node", base);
    pipeline(&c, "ZBVZeroBubble", dump);
    launch_add(&c, "--compile.enable=false");
    if (launch_run_from(&c, dump, 1, STEPS, RUN_SECONDS, &r, &hash))
        launch_compare_from("pp2 x dp_shard2 x ep2 ZBV eager", &ref, ref_hash, &r, hash, 1, STEPS);
    else
        EXPECT(false, "%s failed", dump);
    launch_end(base);
    return gt_test_finish();
}
