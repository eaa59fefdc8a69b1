/* test_pp_moe_launch.c — `graphtrain train` with pipeline parallelism on DeepSeek-V3 (issue 39),
 * through the real binary under `mpiexec -np 2`.
 *
 * DeepSeek-V3's MoE blocks carry values from one micro-batch to the next that llama3 has not: the
 * token counts of each MoE block summed over the step's micro-batches (a running sum of the
 * block's stage), the micro-batch clock that restarts those sums and lets the expert-bias update
 * through in the last micro-batch (every rank runs it, gt_pp_split.h), and the expert biases
 * themselves, updated once a step on their block's stage and read by every micro-batch's forward.
 *
 * The reference is one rank accumulating 4 micro-batches of 1 sequence (local_batch_size 1,
 * global_batch_size 4), deepseek_v3 debugmodel, fp32, seq 32, STEPS steps. A pipeline run takes a
 * local batch of 4 in micro-batches of 1 and must be that run bit for bit:
 *   - every schedule (GPipe, 1F1B, Interleaved1F1B, ZBVZeroBubble, DualPipeV) on 2 ranks, with
 *     per-stage programs (compile.enable, the default), and 1F1B node by node
 *     (--compile.enable false): the loss and grad_norm of every step the same doubles, the same
 *     final params xxh64 (parameters and model buffers), and the last step's checkpoint the same
 *     bytes as the one rank's (the expert biases and the MoE accumulation's buffers are in it,
 *     gathered from their stage's rank);
 *   - the checkpoint of a 2-rank 1F1B run after step CKPT, resumed on one rank (the reference's
 *     options), trains the later steps with the uninterrupted run's losses and grad norms, bit
 *     for bit, and ends on its checkpoint bytes. */
#include "launch.h" /* first: train_child.h defines _GNU_SOURCE */

#define RUN_SECONDS 300.0
#define STEPS 2
#define CKPT 1

static void common(launch_cmd *c, int np, const char *dump)
{
    launch_train(c, np);
    launch_common(c, "debugmodel", dump, CKPT);
    launch_add(c, "--model.name=deepseek_v3");
    launch_add(c, "--training.steps=%d", STEPS); /* after launch_common's: the later one holds */
}

static void one_rank(launch_cmd *c, const char *dump)
{
    common(c, 0, dump);
    launch_add(c, "--training.local_batch_size=1");
    launch_add(c, "--training.global_batch_size=4");
}

static void pipeline(launch_cmd *c, const char *schedule, const char *dump)
{
    common(c, 2, dump);
    launch_add(c, "--training.local_batch_size=4");
    launch_add(c, "--parallelism.pipeline_parallel_degree=2");
    launch_add(c, "--parallelism.pipeline_parallel_schedule=%s", schedule);
    launch_add(c, "--parallelism.pipeline_parallel_microbatch_size=1");
}

int main(void)
{
    char base[256], dump[400];
    if (!launch_begin(base, sizeof base, "gt_pp_moe_launch")) return 1;
    launch_cmd c;
    static launch_result ref, r;
    uint64_t ref_hash = 0, hash = 0;
    snprintf(dump, sizeof dump, "%s/one_rank", base);
    one_rank(&c, dump);
    if (!launch_run_from(&c, dump, 1, STEPS, RUN_SECONDS, &ref, &ref_hash)) {
        EXPECT(false, "the one-rank reference failed");
        return gt_test_finish();
    }
    static const char *const schedules[] = {"GPipe", "1F1B", "Interleaved1F1B", "ZBVZeroBubble",
                                            "DualPipeV"};
    for (int k = 0; k < 5; k++) {
        snprintf(dump, sizeof dump, "%s/pp2_%s", base, schedules[k]);
        pipeline(&c, schedules[k], dump);
        if (launch_run_from(&c, dump, 1, STEPS, RUN_SECONDS, &r, &hash))
            launch_compare_from(dump + strlen(base) + 1, &ref, ref_hash, &r, hash, 1, STEPS);
        else
            EXPECT(false, "%s failed", dump);
    }
    snprintf(dump, sizeof dump, "%s/pp2_1F1B_node_by_node", base);
    pipeline(&c, "1F1B", dump);
    launch_add(&c, "--compile.enable=false");
    if (launch_run_from(&c, dump, 1, STEPS, RUN_SECONDS, &r, &hash))
        launch_compare_from("pp2_1F1B --compile.enable false", &ref, ref_hash, &r, hash, 1, STEPS);
    else
        EXPECT(false, "%s failed", dump);

    /* the pp 2 checkpoint, resumed on one rank */
    char src[512];
    snprintf(src, sizeof src, "%s/pp2_1F1B", base);
    snprintf(dump, sizeof dump, "%s/resume_pp2_on_one_rank", base);
    EXPECT(launch_seed_dump(src, dump, CKPT), "cannot copy %s's step-%d checkpoint", src, CKPT);
    one_rank(&c, dump);
    if (launch_run_from(&c, dump, CKPT + 1, STEPS, RUN_SECONDS, &r, &hash))
        launch_compare_from("pp 2 -> one rank", &ref, ref_hash, &r, hash, CKPT + 1, STEPS);
    else
        EXPECT(false, "%s failed", dump);
    launch_end(base);
    return gt_test_finish();
}
