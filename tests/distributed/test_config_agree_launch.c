/* test_config_agree_launch.c — ranks launched with different options stop before step 1, naming
 * the first option that differs (issue 41): before, two TCP ranks of FSDP2 with different
 * learning rates trained a silently inconsistent model.
 *
 * Two `graphtrain train` processes with torchrun's environment (launch_env.h), test_tiny FSDP2;
 * rank 1 alone gets --optimizer.lr=0.001 (and a different --training.cpu_threads, which may
 * differ). Both must exit non-zero within the bound, each output naming --optimizer.lr and
 * rank 1, and no step may have run (no metrics record). */
#include "launch.h" /* first: train_child.h defines _GNU_SOURCE */
#include "launch_env.h"

#define BOUND_SECONDS 120.0

static const launch_layout fsdp2 = {"FSDP2", 1, 2, 1};

int main(void)
{
    char base[256], dump[512];
    if (!launch_begin(base, sizeof base, "gt_config_agree")) return 1;
    launch_temp_dir(dump, sizeof dump, base, "lr_differs");
    launch_cmd c[2];
    for (int r = 0; r < 2; r++) {
        launch_layout_run_np(&c[r], &fsdp2, 0, "test_tiny", dump, 5);
        launch_add(&c[r], "--comm.init_timeout_seconds=20");
        launch_add(&c[r], "--training.cpu_threads=%d", r + 1);
    }
    launch_add(&c[1], "--optimizer.lr=0.001");
    int port = comm_test_free_port();
    EXPECT(port > 0, "no free TCP port");
    pid_t pid[2];
    char out_path[2][600];
    for (int r = 0; r < 2; r++) {
        snprintf(out_path[r], sizeof out_path[r], "%s/rank%d.txt", dump, r);
        pid[r] = launch_env_spawn(&c[r], r, 2, r, port, out_path[r], NULL);
    }
    double t0 = now_seconds();
    for (int r = 0; r < 2; r++) {
        int rc = pid[r] > 0 ? wait_child(pid[r], BOUND_SECONDS - (now_seconds() - t0)) : -1;
        char *out = read_all(out_path[r], NULL);
        bool named = out && strstr(out, "--optimizer.lr is 0.001 on rank 1");
        printf("rank %d: exit %d after %.1f s, %s\n", r, rc, now_seconds() - t0,
               named ? "names --optimizer.lr" : "does not name the option");
        EXPECT(rc > 0, "rank %d exited %d (-1: still running after %.0f s); expected a failure", r,
               rc, BOUND_SECONDS);
        EXPECT(named, "rank %d: the output does not name --optimizer.lr on rank 1", r);
        if (!named) launch_show_tail(out_path[r]);
        free(out);
    }
    char metrics[600];
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", dump);
    size_t len = 0;
    char *m = read_all(metrics, &len);
    EXPECT(!m || len == 0, "a step ran before the options were compared (%zu bytes of metrics)",
           len);
    free(m);
    launch_end(base);
    return gt_test_finish();
}
