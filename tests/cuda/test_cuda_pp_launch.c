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
    launch_add(c, "--model.flavor=debugmodel");
    launch_add(c, "--training.device=cuda");
    launch_add(c, "--training.dataset=synthetic");
    launch_add(c, "--training.seq_len=32");
    launch_add(c, "--training.steps=%d", STEPS);
    launch_add(c, "--training.mixed_precision_param=float32");
    launch_add(c, "--optimizer.eps=1e-5");
    launch_add(c, "--metrics.log_freq=1");
    launch_add(c, "--metrics.save_jsonl=true");
    launch_add(c, "--checkpoint.enable=true");
    launch_add(c, "--checkpoint.interval=%d", STEPS);
    launch_add(c, "--checkpoint.keep_latest_k=0");
    launch_add(c, "--job.print_config=false");
    launch_add(c, "--job.dump_folder=%s", dump);
}

static bool collect(const char *out_path, const char *dump, launch_result *r, uint64_t *hash)
{
    char *out = read_all(out_path, NULL);
    long long first = 0, last = 0;
    snprintf(r->dump, sizeof r->dump, "%s", dump);
    r->ok = out && parse_summary(out, &first, &last, hash) && first == 1 && last == STEPS &&
            last_records(dump, STEPS, r->steps, NULL);
    if (!r->ok) launch_show_tail(out_path);
    free(out);
    return r->ok;
}

/* pp 2 under `schedule` as two processes; checked against the one-GPU run `one`. */
static void pipeline(const char *base, const char *schedule, int gpus, const launch_result *one,
                     uint64_t one_hash)
{
    char dump[512], out_path[600];
    launch_temp_dir(dump, sizeof dump, base, schedule);
    launch_cmd c = {0};
    options(&c, dump);
    launch_add(&c, "--training.local_batch_size=4");
    launch_add(&c, "--parallelism.pipeline_parallel_degree=2");
    launch_add(&c, "--parallelism.pipeline_parallel_schedule=%s", schedule);
    launch_add(&c, "--parallelism.pipeline_parallel_microbatch_size=1");
    int port = comm_test_free_port(), rcs[2], local[2] = {0, gpus > 1 ? 1 : 0};
    EXPECT(port > 0, "no free TCP port");
    double dt = launch_env_ranks(&c, 0, 2, 2, local, port, dump, NULL, rcs, RUN_SECONDS);
    for (int k = 0; k < 2; k++) {
        snprintf(out_path, sizeof out_path, "%s/rank%d.txt", dump, k);
        EXPECT(rcs[k] == 0, "%s: rank %d exited %d (-1: still running after %.0f s)", schedule, k,
               rcs[k], RUN_SECONDS);
        if (rcs[k] != 0) launch_show_tail(out_path);
    }
    static launch_result pp;
    uint64_t hash = 0;
    snprintf(out_path, sizeof out_path, "%s/rank0.txt", dump);
    char *out = read_all(out_path, NULL); /* rank 0 logs */
    const char *want = "pipeline rank 0 on the GPU: its step is one program";
    EXPECT(out && strstr(out, want), "%s: rank 0 has no line \"%s\"", schedule, want);
    free(out);
    bool ok = rcs[0] == 0 && rcs[1] == 0 && collect(out_path, dump, &pp, &hash);
    EXPECT(ok, "%s: no complete run", schedule);
    printf("pp 2 (%s) on %s over TCP: %.1f s\n", schedule, gpus > 1 ? "two GPUs" : "one GPU", dt);
    if (!ok || !one->ok) return;
    int differ = 0;
    for (int s = 1; s <= STEPS; s++)
        differ += one->steps[s].loss != pp.steps[s].loss ||
                  one->steps[s].grad_norm != pp.steps[s].grad_norm;
    char pa[700], pb[700];
    launch_ckpt_path(pa, sizeof pa, one->dump, STEPS);
    launch_ckpt_path(pb, sizeof pb, pp.dump, STEPS);
    bool same = same_bytes(pa, pb);
    EXPECT(differ == 0, "%s: %d of %d steps' loss or grad_norm differ from one GPU's", schedule,
           differ, STEPS);
    EXPECT(hash == one_hash, "%s: params xxh64 %016llx, one GPU's %016llx", schedule,
           (unsigned long long)hash, (unsigned long long)one_hash);
    EXPECT(same, "%s: the step-%d checkpoint differs from one GPU's", schedule, STEPS);
    printf("  loss and grad_norm of steps 1..%d bitwise: %s (step %d loss %.7f); hash %016llx; "
           "checkpoint %s\n",
           STEPS, differ ? "NO" : "yes", STEPS, pp.steps[STEPS].loss, (unsigned long long)hash,
           same ? "same" : "DIFFERS");
}

int main(void)
{
    int gpus = gt_cuda_device_count();
    if (gpus < 1) {
        printf("skipped: no GPU visible\n");
        return 0;
    }
    char base[256], dump[512], out_path[600];
    if (!launch_begin(base, sizeof base, "gt_cuda_pp_launch")) return 1;
    static launch_result one;
    uint64_t one_hash = 0;
    launch_temp_dir(dump, sizeof dump, base, "one_gpu");
    snprintf(out_path, sizeof out_path, "%s/output.txt", dump);
    launch_cmd c = {0};
    options(&c, dump);
    launch_add(&c, "--training.local_batch_size=1");
    launch_add(&c, "--training.global_batch_size=4");
    double dt = 0;
    int rc = launch_run(&c, out_path, RUN_SECONDS, &dt);
    EXPECT(rc == 0 && collect(out_path, dump, &one, &one_hash), "one GPU: exit %d", rc);
    printf("one GPU, accumulation of 4: exit %d, %.1f s\n", rc, dt);
    pipeline(base, "1F1B", gpus, &one, one_hash);
    pipeline(base, "ZBVZeroBubble", gpus, &one, one_hash);
    if (gt_test_failed_ == 0) remove_tree(base);
    return gt_test_finish();
}
