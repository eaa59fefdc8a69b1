/* test_cuda_pp_launch.c — pipeline parallelism on the GPU (issue 39): `graphtrain train` with
 * training.device = cuda and pipeline_parallel_degree 2, launched torchrun-style (RANK,
 * WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), label cuda.
 *
 * Each pipeline rank runs its step as one unrolled graph on a CUDA executor
 * (src/train/trainer_pp_device.c); the values that cross ranks go through host memory over the
 * TCP communicator. On a machine with one GPU both ranks share it (each its own process and CUDA
 * context), on two or more each has its own (LOCAL_RANK).
 *
 * llama3 debugmodel, fp32, seq 32, synthetic data, a local batch of 4 in micro-batches of 1, 5
 * steps, a checkpoint at step 5. The reference is one process on the GPU accumulating the same 4
 * micro-batches (--training.local_batch_size 1 --training.global_batch_size 4). 1F1B (2 stages)
 * and ZBVZeroBubble (4 stages, two a rank, dI and dW apart) must give every step's loss and
 * grad_norm as the same doubles, the same final params xxh64 and the same step-5 checkpoint bytes.
 * Rank 0 says its step is one program and the plan's bytes before step 1. Skipped (exit 0)
 * without a GPU. */
#include "distributed/launch.h" /* first: train_child.h defines _GNU_SOURCE */
#include "distributed/launch_env.h"

#include "graphtrain/gt_cuda.h"

#define STEPS 5
#define RUN_SECONDS 300.0

static void options(launch_cmd *c, const char *dump)
{
    launch_add(c, "%s", launch_binary());
    launch_add(c, "train");
    launch_add(c, "--training.device=cuda");
    launch_common_steps(c, "debugmodel", dump, STEPS, STEPS);
}

/* pp 2 under `schedule` as two processes; checked against the one-GPU run `one`. */
static void pipeline(const char *base, const char *schedule, int gpus, const launch_result *one,
                     uint64_t one_hash)
{
    char dump[512], out_path[600], name[64];
    launch_temp_dir(dump, sizeof dump, base, schedule);
    launch_cmd c = {0};
    options(&c, dump);
    launch_add(&c, "--training.local_batch_size=4");
    launch_add(&c, "--parallelism.pipeline_parallel_degree=2");
    launch_add(&c, "--parallelism.pipeline_parallel_schedule=%s", schedule);
    launch_add(&c, "--parallelism.pipeline_parallel_microbatch_size=1");
    int local[2] = {0, gpus > 1 ? 1 : 0};
    static launch_result pp;
    uint64_t hash = 0;
    snprintf(name, sizeof name, "pp 2 (%s)", schedule);
    double dt = launch_env_run(&c, 2, local, dump, STEPS, RUN_SECONDS, name, &pp, &hash);
    printf("%s on %s over TCP: %.1f s\n", name, gpus > 1 ? "two GPUs" : "one GPU", dt);
    snprintf(out_path, sizeof out_path, "%s/rank0.txt", dump);
    char *out = read_all(out_path, NULL); /* rank 0 logs */
    const char *want = "pipeline rank 0 on the GPU: its step is one program";
    EXPECT(out && strstr(out, want), "%s: rank 0 has no line \"%s\"", name, want);
    free(out);
    if (pp.ok && one->ok) launch_compare_from(name, one, one_hash, &pp, hash, 1, STEPS);
}

int main(void)
{
    int gpus = gt_cuda_device_count();
    if (gpus < 1) {
        printf("skipped: no GPU visible\n");
        return 0;
    }
    char base[256], dump[512];
    if (!launch_begin(base, sizeof base, "gt_cuda_pp_launch")) return 1;
    static launch_result one;
    uint64_t one_hash = 0;
    launch_temp_dir(dump, sizeof dump, base, "one_gpu");
    launch_cmd c = {0};
    options(&c, dump);
    launch_add(&c, "--training.local_batch_size=1");
    launch_add(&c, "--training.global_batch_size=4");
    EXPECT(launch_run_from(&c, dump, 1, STEPS, RUN_SECONDS, &one, &one_hash),
           "one GPU, accumulation of 4: no complete run");
    pipeline(base, "1F1B", gpus, &one, one_hash);
    pipeline(base, "ZBVZeroBubble", gpus, &one, one_hash);
    if (gt_test_failed_ == 0) remove_tree(base);
    return gt_test_finish();
}
