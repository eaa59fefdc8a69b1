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
    launch_common_steps(c, "debugmodel", dump, STEPS, STEPS);
}

static void pipeline_options(launch_cmd *c, const char *dump)
{
    options(c, dump);
    launch_add(c, "--training.local_batch_size=4");
    launch_add(c, "--parallelism.pipeline_parallel_degree=2");
    launch_add(c, "--parallelism.pipeline_parallel_schedule=1F1B");
    launch_add(c, "--parallelism.pipeline_parallel_microbatch_size=1");
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
    c.n = 0;
    options(&c, dump);
    launch_add(&c, "--training.local_batch_size=1");
    launch_add(&c, "--training.global_batch_size=4");
    EXPECT(launch_run_from(&c, dump, 1, STEPS, RUN_SECONDS, &one, &one_hash),
           "one rank, accumulation of 4: no complete run");

    /* pp 2 as two processes with torchrun's environment */
    launch_temp_dir(dump, sizeof dump, base, "pp2_tcp");
    c.n = 0;
    pipeline_options(&c, dump);
    double dt =
        launch_env_run(&c, 2, NULL, dump, STEPS, RUN_SECONDS, "pp 2 over TCP", &pp, &pp_hash);
    printf("pp 2 (1F1B) over TCP: %.1f s\n", dt);
    if (one.ok && pp.ok)
        launch_compare_from("pp 2 over TCP", &one, one_hash, &pp, pp_hash, 1, STEPS);

    /* neither mpirun nor torchrun's environment: refused, naming both */
    launch_temp_dir(dump, sizeof dump, base, "no_launcher");
    snprintf(out_path, sizeof out_path, "%s/output.txt", dump);
    c.n = 0;
    pipeline_options(&c, dump);
    int rc = launch_run(&c, out_path, 60.0, &dt);
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
    int rc4[4], port = comm_test_free_port();
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

    launch_end(base);
    return gt_test_finish();
}
