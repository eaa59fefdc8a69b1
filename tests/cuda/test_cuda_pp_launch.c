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
 * Rank 0 says its step is one program and the plan's bytes before step 1. Each run is also
 * bitwise under:
 *   - compile.cudagraphs (the default): after step 1 each rank's step is CUDA graphs between its
 *     host sends and receives (rank 0 says so); 1F1B runs once more with it off, kernel by kernel;
 *   - compile on one rank: ZBVZeroBubble with compile.precompile_artifact_dir saves every rank's
 *     compiled step (DIR/pp_rank<R>_step.graph), and a second run loads its own (rank 0 says
 *     which); a 1F1B run on those artifacts is refused by both ranks, naming the schedule.
 * Skipped (exit 0) without a GPU. */
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

/* A pp 2 run under `schedule`, `extra` (an option or NULL), into BASE/tag. */
static void pp_cmd(launch_cmd *c, const char *base, const char *tag, const char *schedule,
                   const char *extra, char *dump, size_t n)
{
    launch_temp_dir(dump, n, base, tag);
    *c = (launch_cmd){0};
    options(c, dump);
    launch_add(c, "--training.local_batch_size=4");
    launch_add(c, "--parallelism.pipeline_parallel_degree=2");
    launch_add(c, "--parallelism.pipeline_parallel_schedule=%s", schedule);
    launch_add(c, "--parallelism.pipeline_parallel_microbatch_size=1");
    if (extra) launch_add(c, "%s", extra);
}

/* Whether rank 0's log in dump has `want` (or lacks it, when !has). */
static void rank0_says(const char *name, const char *dump, const char *want, bool has)
{
    char out_path[600];
    snprintf(out_path, sizeof out_path, "%s/rank0.txt", dump);
    char *out = read_all(out_path, NULL);
    EXPECT(out && !strstr(out, want) == !has, "%s: rank 0 %s a line \"%s\"", name,
           has ? "has no" : "has", want);
    free(out);
}

/* pp 2 under `schedule` and `extra` as two processes; checked against the one-GPU run `one`;
 * rank 0 says `says` (and not `not_says`, when given). */
static void pipeline(const char *base, const char *tag, const char *schedule, const char *extra,
                     const char *says, const char *not_says, int gpus, const launch_result *one,
                     uint64_t one_hash)
{
    char dump[512], name[160];
    launch_cmd c;
    pp_cmd(&c, base, tag, schedule, extra, dump, sizeof dump);
    int local[2] = {0, gpus > 1 ? 1 : 0};
    static launch_result pp;
    uint64_t hash = 0;
    snprintf(name, sizeof name, "pp 2 (%s, %s)", schedule, tag);
    double dt = launch_env_run(&c, 2, local, dump, STEPS, RUN_SECONDS, name, &pp, &hash);
    printf("%s on %s over TCP: %.1f s\n", name, gpus > 1 ? "two GPUs" : "one GPU", dt);
    rank0_says(name, dump, "pipeline rank 0 on the GPU: its step is one program", true);
    if (says) rank0_says(name, dump, says, true);
    if (not_says) rank0_says(name, dump, not_says, false);
    if (pp.ok && one->ok) launch_compare_from(name, one, one_hash, &pp, hash, 1, STEPS);
}

/* A pp 2 run that both ranks must refuse, each saying `what`. */
static void refused(const char *base, const char *tag, const char *schedule, const char *extra,
                    int gpus, const char *what)
{
    char dump[512], out_path[600];
    launch_cmd c;
    pp_cmd(&c, base, tag, schedule, extra, dump, sizeof dump);
    int local[2] = {0, gpus > 1 ? 1 : 0}, rc[2] = {0, 0}, port = comm_test_free_port();
    EXPECT(port > 0, "%s: no free TCP port", tag);
    launch_env_ranks(&c, 0, 2, 2, local, port, dump, NULL, rc, 120.0);
    for (int r = 0; r < 2; r++) {
        snprintf(out_path, sizeof out_path, "%s/rank%d.txt", dump, r);
        char *out = read_all(out_path, NULL);
        EXPECT(rc[r] > 0 && out && strstr(out, what), "%s: rank %d exited %d without \"%s\"", tag,
               r, rc[r], what);
        if (rc[r] <= 0 || !out || !strstr(out, what)) launch_show_tail(out_path);
        free(out);
    }
    printf("  refused %s: exit %d, %d: %s\n", tag, rc[0], rc[1], what);
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
    const char *graphs = "compile.cudagraphs: a pipeline rank's step is CUDA graphs";
    pipeline(base, "1F1B", "1F1B", NULL, graphs, NULL, gpus, &one, one_hash);
    pipeline(base, "1F1B_eager", "1F1B", "--compile.cudagraphs=false", NULL, graphs, gpus, &one,
             one_hash);
    pipeline(base, "ZBV", "ZBVZeroBubble", NULL, graphs, NULL, gpus, &one, one_hash);
    /* compile on one rank: the first run saves every rank's step, the second loads its own */
    char art[400], opt[500];
    snprintf(art, sizeof art, "%s/artifacts", base);
    snprintf(opt, sizeof opt, "--compile.precompile_artifact_dir=%s", art);
    pipeline(base, "ZBV_compiled", "ZBVZeroBubble", opt, "compiled the steps of 2 ranks on rank 0",
             NULL, gpus, &one, one_hash);
    pipeline(base, "ZBV_loaded", "ZBVZeroBubble", opt, "(not compiled here)",
             "compiled the steps of 2 ranks", gpus, &one, one_hash);
    snprintf(dump, sizeof dump, "%s/pp_rank1_step.graph", art);
    EXPECT(access(dump, R_OK) == 0, "no artifact %s", dump);
    refused(base, "1F1B_on_ZBV_artifacts", "1F1B", opt, gpus,
            "'parallelism.pipeline_parallel_schedule = \"1F1B\"'");
    launch_end(base);
    return gt_test_finish();
}
