/* test_gpu_safety_launch.c — a multi-GPU run never hangs, and a torchrun-style launch trains on
 * GPUs exactly what `mpiexec` trains (issue 7, acceptance), label cuda. Skipped (exit 0, with the
 * reason) on a machine with fewer than 2 GPUs.
 *
 * llama3 debugmodel, FSDP2 on 2 GPUs (one process per GPU), synthetic data, seq 128, global batch
 * 4:
 *   - a dead rank: rank 1 SIGKILLs itself at step 3 (debug.test_kill_rank_at_step = 1:3). The
 *     `mpiexec -np 2` launch must exit non-zero within 60 s, its output naming rank 1 in a line
 *     that rank 1 did not print itself (mpiexec's "process rank 1 ... exited on signal 9"), with
 *     no metrics record past step 2 (step 3 needs rank 1's collectives).
 *   - a hung rank: rank 1 SIGSTOPs itself at step 3 ("1:3:stop", comm.train_timeout_seconds = 10).
 *     Rank 0 must fail within 60 s with a message naming the collective's communicator and its
 *     group ("... 'NAME' (size 2, world ranks 0,1) did not complete within 10 s"): the NCCL
 *     watchdog (src/comm/nccl.c, gt_nccl_watch) when the device work is what waits, the host
 *     communicator's timeout when a host collective is. Its NCCL abort, which waits for the
 *     stopped peer, is bounded (gt_nccl_abort). The launch then ends non-zero and no process of
 *     the run is left (the stopped rank is killed).
 *   Both fault cases run with --comm.nccl_buffers plain, and again with symmetric where the NCCL
 *   library supports it (its collectives then run on the copy engines).
 *   - torchrun-style launch: 2 processes started by this test with RANK, WORLD_SIZE, LOCAL_RANK,
 *     MASTER_ADDR=127.0.0.1, MASTER_PORT=a free port and no MPI in their environment (the TCP
 *     communicator bootstraps NCCL), fp32, 10 steps, a checkpoint at step 10: every step's loss and
 *     grad norm BITWISE those of the same run under `mpiexec -np 2`, and the step-10 checkpoints
 *     the same bytes. LOCAL_RANK is the reverse of RANK (rank 0 on GPU 1, rank 1 on GPU 0) so the
 *     GPU is seen to follow LOCAL_RANK and not RANK: NCCL's own "Init COMPLETE" line (NCCL_DEBUG =
 *     INFO) in each rank's output gives the device it joined on. (NCCL also refuses two ranks of
 *     one communicator on one GPU, so a shared GPU could not pass either.) */
#include "distributed/launch.h" /* first: train_child.h defines _GNU_SOURCE */
#include "distributed/launch_env.h"

#include <ctype.h>
#include <dirent.h>

#include "graphtrain/gt_comm.h"
#include "graphtrain/gt_cuda.h"

#define BOUND_SECONDS 60.0 /* a failure must end the job within this */
#define FAULT_STEPS 20
#define RUN_SECONDS 150.0 /* one healthy 10-step run, start-up included */
#define RANKS 2

/* ---------------------------------------------------------------- the runs */

/* FSDP2 on 2 GPUs, global batch 4 x 128 tokens, `steps` steps, a metrics record per step. */
static void gpu_options(launch_cmd *c, int steps, const char *dump)
{
    launch_add(c, "--training.device=cuda");
    launch_add(c, "--model.flavor=debugmodel");
    launch_add(c, "--training.dataset=synthetic");
    launch_add(c, "--training.seq_len=128");
    launch_add(c, "--training.local_batch_size=2");
    launch_add(c, "--parallelism.data_parallel_shard_degree=%d", RANKS);
    launch_add(c, "--training.steps=%d", steps);
    launch_add(c, "--metrics.log_freq=1");
    launch_add(c, "--metrics.save_jsonl=true");
    launch_add(c, "--job.print_config=false");
    launch_add(c, "--job.dump_folder=%s", dump);
}

/* The bitwise runs: fp32, 10 steps, the checkpoint of step 10. */
static void fp32_options(launch_cmd *c, const char *dump)
{
    gpu_options(c, LAUNCH_STEPS, dump);
    launch_add(c, "--training.mixed_precision_param=float32");
    launch_add(c, "--checkpoint.enable=true");
    launch_add(c, "--checkpoint.interval=%d", LAUNCH_STEPS);
    launch_add(c, "--checkpoint.keep_latest_k=0");
}

/* ---------------------------------------------------------------- failures */

/* `mpiexec -np 2 graphtrain train` of the fault runs with extra options ("--a=b", NULL-ended) and
 * `--comm.nccl_buffers=BUFFERS`, in which rank 1 meets its fault at step 3, printing `fault` then.
 * Checks what every fault run must (`what` names the case in the messages): the launch ends
 * non-zero within the bound, after rank 1 reached its fault. Returns whether those held. */
static bool run_fault(const char *base, const char *name, const char *buffers,
                      const char *const *extra, const char *what, const char *fault,
                      launch_outcome *o)
{
    launch_cmd c;
    char out_path[600];
    launch_temp_dir(o->dump, sizeof o->dump, base, name);
    snprintf(out_path, sizeof out_path, "%s.txt", o->dump);
    launch_train(&c, RANKS);
    gpu_options(&c, FAULT_STEPS, o->dump);
    launch_add(&c, "--comm.nccl_buffers=%s", buffers);
    for (int k = 0; extra[k]; k++)
        launch_add(&c, "%s", extra[k]);
    launch_run_outcome(&c, out_path, BOUND_SECONDS + 30, o);
    printf("%-14s exit %d after %.1f s, %d metrics records\n", name, o->rc, o->seconds, o->records);
    bool ok = true;
    LAUNCH_CHECK(o->rc != 0 && o->rc != -1 && o->seconds < BOUND_SECONDS,
                 "%s: exit %d after %.1f s (-1: still running after %.0f s)", what, o->rc,
                 o->seconds, BOUND_SECONDS + 30);
    LAUNCH_CHECK(strstr(o->out, fault) != NULL,
                 "%s: rank 1 never reached step 3 (the job failed before the fault)", what);
    return ok;
}

/* The line of `text` that starts at p, into buf (cut at cap - 1). Returns the next line or NULL. */
static const char *take_line(const char *p, char *buf, size_t cap)
{
    const char *end = strchr(p, '\n');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    size_t n = len < cap - 1 ? len : cap - 1;
    memcpy(buf, p, n);
    buf[n] = 0;
    return end ? end + 1 : NULL;
}

/* A line of text naming rank r ("rank R", not "rank R0") that rank r did not print itself: not
 * its log ("[graphtrain rank R] ..."), not its failure line ("graphtrain train (rank R of N)"),
 * not an NCCL debug line. Copied into line; false when there is none. */
static bool names_rank_elsewhere(const char *text, int r, char *line, size_t cap)
{
    char needle[32], own_log[48], own_fail[32];
    snprintf(needle, sizeof needle, "rank %d", r);
    snprintf(own_log, sizeof own_log, "[graphtrain rank %d]", r);
    snprintf(own_fail, sizeof own_fail, "(rank %d of ", r);
    char buf[1024];
    for (const char *p = text; p && *p;) {
        p = take_line(p, buf, sizeof buf);
        if (strstr(buf, own_log) || strstr(buf, own_fail) || strstr(buf, "NCCL INFO")) continue;
        for (const char *h = strstr(buf, needle); h; h = strstr(h + 1, needle)) {
            if (isdigit((unsigned char)h[strlen(needle)])) continue;
            snprintf(line, cap, "%s", buf);
            return true;
        }
    }
    return false;
}

/* The failure line of rank r of `size` ("graphtrain train (rank R of N): ..."), into line. */
static bool failure_line(const char *text, int r, int size, char *line, size_t cap)
{
    char head[64];
    snprintf(head, sizeof head, "graphtrain train (rank %d of %d): ", r, size);
    const char *p = strstr(text, head);
    if (!p) return false;
    take_line(p, line, cap);
    return true;
}

/* Pids of live processes other than this one whose command line contains needle (a zombie's
 * command line is empty: it is not counted). */
static int procs_with(const char *needle, pid_t *pids, int max)
{
    DIR *d = opendir("/proc");
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while (n < max && (e = readdir(d)) != NULL) {
        char *end = NULL;
        long pid = strtol(e->d_name, &end, 10);
        if (end == e->d_name || *end || pid <= 0 || pid == (long)getpid()) continue;
        char path[64];
        snprintf(path, sizeof path, "/proc/%ld/cmdline", pid);
        size_t len = 0;
        char *cmd = read_all(path, &len);
        if (!cmd) continue;
        for (size_t i = 0; i < len; i++)
            if (!cmd[i]) cmd[i] = ' '; /* the arguments are NUL-separated */
        if (strstr(cmd, needle)) pids[n++] = (pid_t)pid;
        free(cmd);
    }
    closedir(d);
    return n;
}

/* No process of the run into `dump` (its ranks, its launcher) outlives it: each is gone within
 * 15 s (a killed process with a GPU context takes a moment to exit). Leftovers are killed. */
static bool check_no_leftovers(const char *dump, const char *what)
{
    char needle[600];
    snprintf(needle, sizeof needle, "--job.dump_folder=%s", dump);
    pid_t pids[16];
    int n = 0;
    double t0 = now_seconds();
    while ((n = procs_with(needle, pids, 16)) > 0 && now_seconds() - t0 < 15.0)
        sleep_us(100000);
    EXPECT(n == 0, "%s: %d process(es) of the run still alive 15 s after it ended (pid %d)", what,
           n, n > 0 ? (int)pids[0] : 0);
    for (int k = 0; k < n; k++)
        kill(pids[k], SIGKILL);
    return n == 0;
}

/* The end of a fault run: step 3 never completed (at most 2 records) and no process of the run is
 * left; its output is shown when a check of the case failed (ok false). */
static void end_fault(launch_outcome *o, bool ok, const char *what)
{
    LAUNCH_CHECK(o->records <= 2, "%s: %d steps recorded, step 3 cannot have completed", what,
                 o->records);
    ok = check_no_leftovers(o->dump, what) && ok;
    launch_outcome_free(o, !ok);
}

static void dead_rank(const char *base, const char *buffers)
{
    static const char *const x[] = {"--debug.test_kill_rank_at_step=1:3", NULL};
    launch_outcome o;
    char name[64];
    snprintf(name, sizeof name, "killed_rank_%s", buffers);
    bool ok = run_fault(base, name, buffers, x, "killed rank", "rank 1 kills itself at step 3", &o);
    char line[1024] = "";
    bool named = names_rank_elsewhere(o.out, 1, line, sizeof line);
    LAUNCH_CHECK(named,
                 "killed rank: no line of the output (other than rank 1's own) names rank 1");
    if (named) printf("  names the dead rank: %s\n", line);
    end_fault(&o, ok, "killed rank");
}

static void hung_rank(const char *base, const char *buffers)
{
    static const char *const x[] = {"--debug.test_kill_rank_at_step=1:3:stop",
                                    "--comm.train_timeout_seconds=10", NULL};
    launch_outcome o;
    char name[64];
    snprintf(name, sizeof name, "hung_rank_%s", buffers);
    bool ok = run_fault(base, name, buffers, x, "hung rank", "rank 1 stops itself at step 3", &o);
    char line[1024] = "";
    bool failed = failure_line(o.out, 0, RANKS, line, sizeof line);
    LAUNCH_CHECK(failed, "hung rank: rank 0 printed no failure line");
    LAUNCH_CHECK(failed && strstr(line, "did not complete within 10 s") &&
                     strstr(line, "communicator '") && strstr(line, "world ranks 0,1"),
                 "hung rank: rank 0's failure does not name the timed-out communicator and its "
                 "group: %s",
                 line);
    if (failed)
        printf("  rank 0 (%s): %s\n",
               strstr(line, "NCCL communicator") ? "NCCL watchdog" : "host communicator", line);
    end_fault(&o, ok, "hung rank");
}

/* ---------------------------------------------------------------- torchrun-style launch */

/* The local rank (GPU) of rank r: the reverse of r. */
static int local_rank_of(int r)
{
    return RANKS - 1 - r;
}

static void run_mpi(const char *base, launch_result *res)
{
    launch_cmd c;
    char out_path[600];
    launch_temp_dir(res->dump, sizeof res->dump, base, "FSDP2_mpiexec");
    snprintf(out_path, sizeof out_path, "%s/output.txt", res->dump);
    launch_train(&c, RANKS);
    fp32_options(&c, res->dump);
    double dt = 0;
    int rc = launch_run(&c, out_path, RUN_SECONDS, &dt);
    res->ok = rc == 0 && last_records(res->dump, LAUNCH_STEPS, res->steps, NULL);
    printf("%-14s mpiexec -np %d: exit %d, %.1f s\n", "FSDP2_mpiexec", RANKS, rc, dt);
    EXPECT(res->ok, "FSDP2 under mpiexec: exit %d or missing metrics", rc);
    if (!res->ok) launch_show_tail(out_path);
}

/* Every "Init COMPLETE" line NCCL printed in DUMP/rankR.txt names cudaDev = R's local rank; at
 * least one such line. */
static void check_devices(const char *dump)
{
    for (int r = 0; r < RANKS; r++) {
        char path[600], buf[1024];
        snprintf(path, sizeof path, "%s/rank%d.txt", dump, r);
        char *text = read_all(path, NULL);
        int lines = 0, wrong = 0, dev = -1;
        for (const char *p = text; p && *p;) {
            p = take_line(p, buf, sizeof buf);
            const char *d = strstr(buf, " cudaDev ");
            if (!strstr(buf, "Init COMPLETE") || !d) continue;
            lines++;
            if (sscanf(d, " cudaDev %d", &dev) != 1 || dev != local_rank_of(r)) wrong++;
        }
        printf("  rank %d (LOCAL_RANK %d): %d NCCL communicator(s), on cudaDev %d\n", r,
               local_rank_of(r), lines, dev);
        EXPECT(lines > 0 && wrong == 0,
               "torchrun launch: rank %d with LOCAL_RANK %d: %d NCCL init lines, %d on another "
               "device (last cudaDev %d)",
               r, local_rank_of(r), lines, wrong, dev);
        if (lines == 0 || wrong) launch_show_tail(path);
        free(text);
    }
}

static void run_tcp(const char *base, launch_result *res)
{
    launch_cmd c;
    int rc[RANKS];
    launch_temp_dir(res->dump, sizeof res->dump, base, "FSDP2_tcp");
    launch_train(&c, 0);
    fp32_options(&c, res->dump);
    int port = comm_test_free_port();
    EXPECT(port > 0, "no free TCP port");
    /* LOCAL_RANK the reverse of RANK; NCCL_DEBUG=INFO: NCCL prints the device each rank joins */
    int locals[RANKS];
    for (int r = 0; r < RANKS; r++)
        locals[r] = local_rank_of(r);
    static const char *const nccl_debug[] = {"NCCL_DEBUG=INFO", NULL};
    double dt =
        launch_env_ranks(&c, 0, RANKS, RANKS, locals, port, res->dump, nccl_debug, rc, RUN_SECONDS);
    int bad = 0;
    for (int r = 0; r < RANKS; r++) {
        bad += rc[r] != 0;
        EXPECT(rc[r] == 0, "torchrun launch: rank %d exited %d (-1: still running after %.0f s)", r,
               rc[r], RUN_SECONDS);
        if (rc[r] != 0) {
            char out_path[600];
            snprintf(out_path, sizeof out_path, "%s/rank%d.txt", res->dump, r);
            launch_show_tail(out_path);
        }
    }
    res->ok = bad == 0 && last_records(res->dump, LAUNCH_STEPS, res->steps, NULL);
    printf("%-14s %d processes over TCP (port %d): %d failed, %.1f s\n", "FSDP2_tcp", RANKS, port,
           bad, dt);
    EXPECT(res->ok, "torchrun launch: a rank failed or metrics are missing");
    if (bad == 0) check_devices(res->dump);
}

static void compare_bitwise(const launch_result *a, const launch_result *b)
{
    if (!a->ok || !b->ok) return;
    bool same = false;
    int differ = launch_bitwise_diff(a, b, LAUNCH_STEPS, &same);
    EXPECT(differ == 0, "torchrun vs mpiexec: %d of %d steps with other loss or grad_norm bits",
           differ, LAUNCH_STEPS);
    EXPECT(same, "torchrun vs mpiexec: step-%d checkpoints differ (runs in %s and %s)",
           LAUNCH_STEPS, a->dump, b->dump);
    printf("  torchrun vs mpiexec: %d of %d steps bitwise equal, checkpoints %s\n",
           LAUNCH_STEPS - differ, LAUNCH_STEPS, same ? "equal" : "differ");
}

int main(void)
{
    int gpus = gt_cuda_device_count();
    if (gpus < RANKS) {
        printf("skipped: %d GPU(s) visible, this test needs %d or more\n", gpus, RANKS);
        return 0;
    }
    char base[256];
    if (!launch_begin(base, sizeof base, "gt_gpu_safety_launch")) return 1;
    setenv("NCCL_NVLS_ENABLE", "0", 0); /* NVLink multicast off in every rank (unless chosen) */

    /* Both fault cases with NCCL's own buffers, and with symmetric ones where this NCCL has
     * them: their all-gathers then run on the copy engines, a dead peer leaves a copy waiting on a
     * stream memory wait rather than a kernel, and the job must still end. */
    dead_rank(base, "plain");
    hung_rank(base, "plain");
    gt_error err = {0};
    if (gt_comm_nccl_check_buffers(GT_NCCL_BUFFERS_SYMMETRIC, &err) == GT_OK) {
        dead_rank(base, "symmetric");
        hung_rank(base, "symmetric");
    } else {
        printf("symmetric buffers: not run: %s\n", err.msg);
    }
    static launch_result mpi, tcp;
    run_mpi(base, &mpi);
    run_tcp(base, &tcp);
    compare_bitwise(&mpi, &tcp);

    launch_end(base);
    return gt_test_finish();
}
