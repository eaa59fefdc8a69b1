/* test_torchrun_launch.c — multi-rank training without MPI: the processes a torchrun-style launcher
 * starts (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, LOCAL_RANK in the environment) join over the
 * TCP communicator (src/comm/tcp.c) and train exactly what `mpiexec` trains (issue 7).
 *
 * For FSDP2 (2 processes) and FSDP2xTP2 (4), test_tiny, fp32, 10 steps, synthetic data (the runs
 * of launch.h): the test forks the N `graphtrain train` processes itself, each with its own RANK
 * and MASTER_ADDR=127.0.0.1, MASTER_PORT=a free port, and checks
 *   - every process exits 0 within the bound;
 *   - every step's loss and grad norm are BITWISE those of the same layout under `mpiexec -np N`
 *     (both communicators sum in rank order, so the bits cannot differ), and the step-10
 *     checkpoints are the same bytes.
 * And a wrong launch never hangs: one process started alone as rank 0 of WORLD_SIZE=2
 * (--comm.init_timeout_seconds=3) fails within the bound naming the missing rank 1; one started alone
 * as rank 1 fails naming rank 0.
 *
 * The communicator itself, over 3 and 4 forked copies of this test (gt_comm_tcp_world): every
 * collective against a local reference (each rank's input is a pure function of (rank, element),
 * sums are naive loops in rank order, compared bit for bit), including a 4 MB all-reduce (larger
 * than the socket buffers: the exchange must not deadlock), chunks of zero elements, bf16, i64 in
 * place, the widening reduce_scatter (bf16 / f16 into f32: also equal to the f32 one of the
 * widened inputs; other dtype pairs refused), a split with reversed keys, and a schedule mismatch
 * reported on every rank. */
#include "launch.h" /* first: train_child.h defines _GNU_SOURCE */
#include "launch_env.h"

#include "comm_test.h"
#include "graphtrain/gt_comm.h"

#define RUN_SECONDS 240.0
#define ALONE_SECONDS 30.0
#define MAX_RANKS LAUNCH_ENV_MAX_RANKS

static const launch_layout fsdp2 = {"FSDP2", 1, 2, 1};
static const launch_layout fsdp2_tp2 = {"FSDP2xTP2", 1, 2, 2};

/* layout l under `mpiexec -np N` into base/NAME */
static void run_mpi(const char *base, const char *name, const launch_layout *l, launch_result *r)
{
    launch_cmd c;
    char out_path[600];
    launch_temp_dir(r->dump, sizeof r->dump, base, name);
    snprintf(out_path, sizeof out_path, "%s/output.txt", r->dump);
    launch_layout_run(&c, l, "test_tiny", r->dump, LAUNCH_STEPS);
    double dt = 0;
    int rc = launch_run(&c, out_path, RUN_SECONDS, &dt);
    r->ok = rc == 0 && last_records(r->dump, LAUNCH_STEPS, r->steps, NULL);
    printf("%-24s mpiexec -np %d: exit %d, %.1f s\n", name, launch_ranks(l), rc, dt);
    EXPECT(r->ok, "%s: exit %d or missing metrics", name, rc);
    if (!r->ok) launch_show_tail(out_path);
}

/* layout l as N processes with torchrun's environment into base/NAME */
static void run_tcp(const char *base, const char *name, const launch_layout *l, launch_result *r)
{
    launch_cmd c;
    int n = launch_ranks(l), rc[MAX_RANKS];
    launch_temp_dir(r->dump, sizeof r->dump, base, name);
    launch_layout_run_np(&c, l, 0, "test_tiny", r->dump, LAUNCH_STEPS);
    int port = comm_test_free_port();
    EXPECT(port > 0, "no free TCP port");
    double dt = launch_env_ranks(&c, 0, n, n, NULL, port, r->dump, NULL, rc, RUN_SECONDS);
    int bad = 0;
    for (int k = 0; k < n; k++) {
        bad += rc[k] != 0;
        EXPECT(rc[k] == 0, "%s: rank %d exited %d (-1: still running after %.0f s)", name, k, rc[k],
               RUN_SECONDS);
        if (rc[k] != 0) {
            char out_path[600];
            snprintf(out_path, sizeof out_path, "%s/rank%d.txt", r->dump, k);
            launch_show_tail(out_path);
        }
    }
    r->ok = bad == 0 && last_records(r->dump, LAUNCH_STEPS, r->steps, NULL);
    printf("%-24s %d processes over TCP (port %d): %d failed, %.1f s\n", name, n, port, bad, dt);
    EXPECT(r->ok, "%s: a rank failed or metrics are missing", name);
}

static void compare_bitwise(const launch_result *a, const launch_result *b, const char *what)
{
    if (!a->ok || !b->ok) return;
    bool same = false;
    int differ = launch_bitwise_diff(a, b, LAUNCH_STEPS, &same);
    EXPECT(differ == 0, "%s: %d of %d steps with other loss or grad_norm bits", what, differ,
           LAUNCH_STEPS);
    EXPECT(same, "%s: step-%d checkpoints differ", what, LAUNCH_STEPS);
    printf("  %-22s %d steps bitwise equal, checkpoints %s\n", what, LAUNCH_STEPS - differ,
           same ? "equal" : "differ");
}

/* One process alone as rank `rank` of WORLD_SIZE=2: it must fail within the bound, its output
 * naming the other rank (`expect`). */
static void run_alone(const char *base, const char *name, int rank, const char *expect)
{
    launch_cmd c;
    char dump[512], out_path[600];
    int rc = 0;
    launch_temp_dir(dump, sizeof dump, base, name);
    launch_layout_run_np(&c, &fsdp2, 0, "test_tiny", dump, LAUNCH_STEPS);
    launch_add(&c, "--comm.init_timeout_seconds=3");
    int port = comm_test_free_port();
    double dt = launch_env_ranks(&c, rank, 1, 2, NULL, port, dump, NULL, &rc, ALONE_SECONDS);
    snprintf(out_path, sizeof out_path, "%s/rank%d.txt", dump, rank);
    char *out = read_all(out_path, NULL);
    printf("%-24s rank %d alone: exit %d, %.1f s\n", name, rank, rc, dt);
    EXPECT(rc > 0, "%s: rank %d alone of 2 exited %d (-1: still running after %.0f s)", name, rank,
           rc, ALONE_SECONDS);
    EXPECT(out && strstr(out, expect), "%s: the output does not say '%s'", name, expect);
    if (!out || !strstr(out, expect)) launch_show_tail(out_path);
    free(out);
}

/* ---------------------------------------------------------------- the communicator alone */

/* Split by parity with reversed keys: the sub-communicator's rank order is descending world rank;
 * an all-gather of the world ranks over it shows the order. */
static void check_split(gt_comm *c)
{
    gt_error err = {0};
    int color = c->rank % 2, m = 0, members[MAX_RANKS], pos = -1;
    for (int r = c->size - 1; r >= 0; r--)
        if (r % 2 == color) members[m++] = r;
    for (int i = 0; i < m; i++)
        if (members[i] == c->rank) pos = i;
    gt_comm *sub = NULL;
    EXPECT_OK(gt_comm_split(c, color, -c->rank, &sub, &err), &err);
    if (!sub) return;
    EXPECT(gt_comm_size(sub) == m && gt_comm_rank(sub) == pos,
           "rank %d: split: %d of %d, "
           "expected %d of %d",
           c->rank, gt_comm_rank(sub), gt_comm_size(sub), pos, m);
    int64_t one[1] = {1}, all_shape[1] = {m};
    gt_tensor mine, all;
    gt_tensor_alloc(&mine, GT_I64, 1, one, &err), gt_tensor_alloc(&all, GT_I64, 1, all_shape, &err);
    ((int64_t *)mine.data)[0] = c->rank;
    EXPECT_OK(gt_comm_all_gather(sub, &mine, &all, &err), &err);
    int bad = 0;
    for (int i = 0; i < m; i++)
        bad += ((int64_t *)all.data)[i] != members[i];
    EXPECT(bad == 0, "rank %d: split members out of (key, rank) order", c->rank);
    /* the world still works between sub-communicator collectives on the shared sockets */
    comm_test_all_reduce(sub, GT_F32, 11, false, false);
    comm_test_all_reduce(c, GT_F32, 13, false, false);
    gt_tensor_free(&mine), gt_tensor_free(&all);
    gt_comm_destroy(sub);
}

/* Rank n-1 has one collective more: every rank must fail naming collective #1. */
static void check_schedule_mismatch(gt_comm *c)
{
    gt_comm_sched_entry e[2] = {{GT_COLL_ALL_GATHER, 7, 64, 0}, {GT_COLL_ALL_REDUCE, 7, 128, 0}};
    gt_error err = {0};
    gt_status st = gt_comm_check_schedule(c, e, c->rank == c->size - 1 ? 2 : 1, &err);
    EXPECT(st == GT_ERR_INVALID && strstr(err.msg, "#1"), "rank %d: schedule mismatch: %s", c->rank,
           err.msg);
    EXPECT_OK(gt_comm_check_schedule(c, e, 2, &err), &err);
}

/* One rank of the communicator test (a forked child; RANK etc. are set). Returns failures. */
static int comm_rank_main(void)
{
    gt_error err = {0};
    gt_comm *w = NULL;
    EXPECT_OK(gt_comm_tcp_world(20, &w, &err), &err);
    if (!w) return 1;
    comm_test_all_reduce(w, GT_F32, 1000003, false, false); /* 4 MB: more than the socket buffers */
    comm_test_all_reduce(w, GT_F32, 5, false, false);
    comm_test_all_reduce(w, GT_F32, 2, true, false); /* fewer elements than ranks: empty chunks */
    comm_test_all_reduce(w, GT_BF16, 37, false, false);
    comm_test_all_reduce(w, GT_I64, 29, true, false);
    comm_test_moves(w);
    comm_test_reduce_scatter_widen(w, GT_BF16, 5, 8);
    comm_test_reduce_scatter_widen(w, GT_F16, 7, 3);
    check_split(w);
    check_schedule_mismatch(w);
    gt_comm_destroy(w);
    return gt_test_failed_;
}

static void run_comm(int n)
{
    int port = comm_test_free_port();
    pid_t pid[MAX_RANKS];
    fflush(NULL);
    for (int r = 0; r < n; r++) {
        pid[r] = fork();
        if (pid[r] == 0) {
            comm_test_set_rank_env("localhost", port, r, n);
            gt_test_failed_ = 0;
            int failed = comm_rank_main();
            fflush(NULL);
            _exit(failed ? 1 : 0);
        }
    }
    int ok = 0;
    double t0 = now_seconds();
    for (int r = 0; r < n; r++) {
        int rc = pid[r] > 0 ? wait_child(pid[r], 120.0 - (now_seconds() - t0)) : -1;
        ok += rc == 0;
        EXPECT(rc == 0, "communicator test, %d ranks: rank %d exited %d", n, r, rc);
    }
    printf("communicator over TCP, %d ranks: %d of %d ranks passed, %.1f s\n", n, ok, n,
           now_seconds() - t0);
}

int main(void)
{
    run_comm(3);
    run_comm(4);

    char base[256];
    if (!launch_begin(base, sizeof base, "gt_torchrun_launch")) return 1;

    run_alone(base, "alone_rank0", 0, "rank(s) 1 did not connect");
    run_alone(base, "alone_rank1", 1, "no answer from rank 0");

    const launch_layout *layouts[] = {&fsdp2, &fsdp2_tp2};
    for (int k = 0; k < 2; k++) {
        static launch_result mpi, tcp;
        char name[64];
        snprintf(name, sizeof name, "%s_mpiexec", layouts[k]->name);
        run_mpi(base, name, layouts[k], &mpi);
        snprintf(name, sizeof name, "%s_tcp", layouts[k]->name);
        run_tcp(base, name, layouts[k], &tcp);
        snprintf(name, sizeof name, "%s tcp vs mpiexec", layouts[k]->name);
        compare_bitwise(&mpi, &tcp, name);
    }
    launch_end(base);
    return gt_test_finish();
}
