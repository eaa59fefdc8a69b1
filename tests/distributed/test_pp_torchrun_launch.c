/* test_pp_torchrun_launch.c — a pipeline launched torchrun-style (issue 39): two `graphtrain train`
 * processes started with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT and no MPI join over the TCP
 * communicator, whose point-to-point carries the stages' activations and gradients
 * (src/comm/tcp_p2p.c).
 *
 * pp 2, 1F1B, a local batch of 4 in micro-batches of 1, llama3 debugmodel, fp32, seq 32, 5 steps,
 * must be bit for bit the one rank accumulating the same 4 micro-batches
 * (--training.local_batch_size=1 --training.global_batch_size=4), as test_pp_launch checks under
 * mpiexec: every step's loss and grad_norm the same doubles, the same final params xxh64, and the
 * step-5 checkpoints the same bytes. And a pipeline started with neither launcher is refused
 * naming both ways to start it, and a GPU pipeline with another mesh dim (pp 2 x dp_shard 2 on
 * 4 processes) by every rank, naming what GPU pipelines run (before any device is touched: this
 * holds on a machine without one). */
#include "launch.h" /* first: train_child.h defines _GNU_SOURCE */
#include "launch_env.h"

#define STEPS 5
#define RUN_SECONDS 240.0

static void options(launch_cmd *c, const char *dump)
{
    launch_add(c, "%s", launch_binary());
    launch_add(c, "train");
    launch_add(c, "--model.flavor=debugmodel");
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

static void pipeline_options(launch_cmd *c, const char *dump)
{
    options(c, dump);
    launch_add(c, "--training.local_batch_size=4");
    launch_add(c, "--parallelism.pipeline_parallel_degree=2");
    launch_add(c, "--parallelism.pipeline_parallel_schedule=1F1B");
    launch_add(c, "--parallelism.pipeline_parallel_microbatch_size=1");
}

/* The records of steps 1..STEPS and the final hash of the output at out_path. */
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

int main(void)
{
    char base[256], dump[512], out_path[600];
    if (!launch_begin(base, sizeof base, "gt_pp_torchrun_launch")) return 1;
    launch_cmd c;

    /* the reference: one rank, 4 micro-batches of accumulation */
    static launch_result one, pp;
    uint64_t one_hash = 0, pp_hash = 0;
    launch_temp_dir(dump, sizeof dump, base, "one_rank");
    snprintf(out_path, sizeof out_path, "%s/output.txt", dump);
    c.n = 0;
    options(&c, dump);
    launch_add(&c, "--training.local_batch_size=1");
    launch_add(&c, "--training.global_batch_size=4");
    double dt = 0;
    int rc = launch_run(&c, out_path, RUN_SECONDS, &dt);
    EXPECT(rc == 0 && collect(out_path, dump, &one, &one_hash), "one rank: exit %d", rc);
    printf("one rank, accumulation of 4: exit %d, %.1f s\n", rc, dt);

    /* pp 2 as two processes with torchrun's environment */
    launch_temp_dir(dump, sizeof dump, base, "pp2_tcp");
    c.n = 0;
    pipeline_options(&c, dump);
    int port = comm_test_free_port(), rcs[2];
    EXPECT(port > 0, "no free TCP port");
    dt = launch_env_ranks(&c, 0, 2, 2, NULL, port, dump, NULL, rcs, RUN_SECONDS);
    for (int k = 0; k < 2; k++) {
        EXPECT(rcs[k] == 0, "pp 2 over TCP: rank %d exited %d (-1: still running after %.0f s)", k,
               rcs[k], RUN_SECONDS);
        snprintf(out_path, sizeof out_path, "%s/rank%d.txt", dump, k);
        if (rcs[k] != 0) launch_show_tail(out_path);
    }
    snprintf(out_path, sizeof out_path, "%s/rank0.txt", dump);
    EXPECT(rcs[0] == 0 && rcs[1] == 0 && collect(out_path, dump, &pp, &pp_hash),
           "pp 2 over TCP: no complete run");
    printf("pp 2 (1F1B) over TCP, port %d: %.1f s\n", port, dt);

    if (one.ok && pp.ok) {
        int differ = 0;
        for (int s = 1; s <= STEPS; s++)
            differ += one.steps[s].loss != pp.steps[s].loss ||
                      one.steps[s].grad_norm != pp.steps[s].grad_norm;
        char pa[700], pb[700];
        launch_ckpt_path(pa, sizeof pa, one.dump, STEPS);
        launch_ckpt_path(pb, sizeof pb, pp.dump, STEPS);
        bool same = same_bytes(pa, pb);
        EXPECT(differ == 0,
               "pp 2 over TCP: %d of %d steps' loss or grad_norm differ from one "
               "rank's",
               differ, STEPS);
        EXPECT(pp_hash == one_hash, "pp 2 over TCP: params xxh64 %016llx, one rank's %016llx",
               (unsigned long long)pp_hash, (unsigned long long)one_hash);
        EXPECT(same, "pp 2 over TCP: the step-%d checkpoint differs from one rank's", STEPS);
        printf("  loss and grad_norm of steps 1..%d bitwise: %s; hash %016llx; checkpoint %s\n",
               STEPS, differ ? "NO" : "yes", (unsigned long long)pp_hash,
               same ? "same" : "DIFFERS");
    }

    /* neither mpirun nor torchrun's environment: refused, naming both */
    launch_temp_dir(dump, sizeof dump, base, "no_launcher");
    snprintf(out_path, sizeof out_path, "%s/output.txt", dump);
    c.n = 0;
    pipeline_options(&c, dump);
    rc = launch_run(&c, out_path, 60.0, &dt);
    char *out = read_all(out_path, NULL);
    EXPECT(rc > 0 && out && strstr(out, "pipeline_parallel_degree = 2") && strstr(out, "mpirun") &&
               strstr(out, "MASTER_ADDR"),
           "a pipeline with no launcher: exit %d, not refused naming both launches", rc);
    if (rc <= 0 || !out || !strstr(out, "MASTER_ADDR")) launch_show_tail(out_path);
    free(out);

    /* on the GPU, pp with another dim: refused on every rank */
    launch_temp_dir(dump, sizeof dump, base, "gpu_pp_dp");
    c.n = 0;
    pipeline_options(&c, dump);
    launch_add(&c, "--training.device=cuda");
    launch_add(&c, "--parallelism.data_parallel_shard_degree=2");
    int rc4[4];
    port = comm_test_free_port();
    launch_env_ranks(&c, 0, 4, 4, NULL, port, dump, NULL, rc4, 120.0);
    for (int k = 0; k < 4; k++) {
        snprintf(out_path, sizeof out_path, "%s/rank%d.txt", dump, k);
        out = read_all(out_path, NULL);
        EXPECT(rc4[k] > 0 && out && strstr(out, "GPU pipelines run pp alone"),
               "GPU pp 2 x dp_shard 2: rank %d exit %d, not refused naming it", k, rc4[k]);
        if (rc4[k] <= 0 || !out || !strstr(out, "GPU pipelines run pp alone"))
            launch_show_tail(out_path);
        free(out);
    }

    if (gt_test_failed_ == 0) remove_tree(base);
    return gt_test_finish();
}
