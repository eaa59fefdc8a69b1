/* launch_env.h — starting `graphtrain train` ranks the way torchrun does (RANK, WORLD_SIZE,
 * LOCAL_RANK, MASTER_ADDR, MASTER_PORT; no MPI variables), for the tests that compare such a
 * launch with mpiexec's (tests/distributed/test_torchrun_launch.c on CPUs,
 * tests/cuda/test_gpu_safety_launch.c on GPUs). Include after launch.h. A free port for
 * MASTER_PORT: comm_test_free_port (comm_test.h). */
#ifndef GT_TESTS_DISTRIBUTED_LAUNCH_ENV_H
#define GT_TESTS_DISTRIBUTED_LAUNCH_ENV_H

#include "launch.h"

#include "comm_test.h"

#define LAUNCH_ENV_MAX_RANKS 8

/* Starts c as rank `rank` of `size` (GPU / LOCAL_RANK local_rank) in its own process group, output
 * into out_path; extra_env: "NAME=VALUE" strings, NULL-terminated (or NULL). */
static inline pid_t launch_env_spawn(launch_cmd *c, int rank, int size, int local_rank, int port,
                                     const char *out_path, const char *const *extra_env)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        setpgid(0, 0);
        /* not an MPI launch, whatever the test's own environment says */
        static const char *const not_mpi[] = {"OMPI_COMM_WORLD_SIZE",
                                              "OMPI_COMM_WORLD_LOCAL_RANK",
                                              "PMIX_RANK",
                                              "PMI_SIZE",
                                              "MPI_LOCALRANKID",
                                              "SLURM_LOCALID"};
        for (size_t k = 0; k < sizeof not_mpi / sizeof not_mpi[0]; k++)
            unsetenv(not_mpi[k]);
        comm_test_set_rank_env("127.0.0.1", port, rank, size);
        char v[32];
        snprintf(v, sizeof v, "%d", local_rank);
        setenv("LOCAL_RANK", v, 1);
        for (int k = 0; extra_env && extra_env[k]; k++)
            putenv((char *)extra_env[k]);
        launch_exec(c, out_path);
    }
    if (pid > 0) setpgid(pid, 0);
    return pid;
}

/* Runs c as ranks first..first+count-1 of a world of `size` (each its own process; LOCAL_RANK
 * local_ranks[k], or the rank when local_ranks is NULL), output into DUMP/rankR.txt; rc[k]: each
 * one's exit code, -1 when it ran past `seconds` (then every one still running is killed).
 * Returns the wall time. */
static inline double launch_env_ranks(launch_cmd *c, int first, int count, int size,
                                      const int *local_ranks, int port, const char *dump,
                                      const char *const *extra_env, int *rc, double seconds)
{
    pid_t pid[LAUNCH_ENV_MAX_RANKS];
    bool done[LAUNCH_ENV_MAX_RANKS] = {0};
    if (count > LAUNCH_ENV_MAX_RANKS) count = LAUNCH_ENV_MAX_RANKS;
    double t0 = now_seconds();
    for (int k = 0; k < count; k++) {
        char out_path[600];
        snprintf(out_path, sizeof out_path, "%s/rank%d.txt", dump, first + k);
        int local = local_ranks ? local_ranks[k] : first + k;
        pid[k] = launch_env_spawn(c, first + k, size, local, port, out_path, extra_env);
        rc[k] = -1;
        done[k] = pid[k] < 0;
    }
    for (;;) {
        int left = 0;
        for (int k = 0; k < count; k++) {
            if (done[k]) continue;
            int ws;
            pid_t r = waitpid(pid[k], &ws, WNOHANG);
            if (r == pid[k]) {
                rc[k] = exit_code(ws);
                done[k] = true;
            } else if (r < 0 && errno != EINTR) {
                done[k] = true;
            } else {
                left++;
            }
        }
        if (left == 0) break;
        if (now_seconds() - t0 > seconds) {
            for (int k = 0; k < count; k++)
                if (!done[k]) {
                    kill(-pid[k], SIGKILL);
                    waitpid(pid[k], NULL, 0);
                }
            break;
        }
        sleep_us(2000);
    }
    for (int k = 0; k < count; k++)
        if (pid[k] > 0) kill(-pid[k], SIGKILL); /* anything left behind */
    return now_seconds() - t0;
}

/* A run of `size` ranks (LAUNCH_ENV_MAX_RANKS at most) on a free port that must succeed: every
 * rank exits 0 (a tail of each that did not is shown), and rank 0's output and DUMP have steps
 * 1..steps (launch_collect into r and *hash). Returns the wall time. */
static inline double launch_env_run(launch_cmd *c, int size, const int *local_ranks,
                                    const char *dump, int steps, double seconds, const char *name,
                                    launch_result *r, uint64_t *hash)
{
    int port = comm_test_free_port(), rc[LAUNCH_ENV_MAX_RANKS];
    EXPECT(port > 0, "%s: no free TCP port", name);
    double dt = launch_env_ranks(c, 0, size, size, local_ranks, port, dump, NULL, rc, seconds);
    bool all = true;
    char out_path[600];
    for (int k = 0; k < size; k++) {
        EXPECT(rc[k] == 0, "%s: rank %d exited %d (-1: still running after %.0f s)", name, k, rc[k],
               seconds);
        snprintf(out_path, sizeof out_path, "%s/rank%d.txt", dump, k);
        if (rc[k] != 0) launch_show_tail(out_path);
        all = all && rc[k] == 0;
    }
    snprintf(out_path, sizeof out_path, "%s/rank0.txt", dump);
    r->ok = false;
    EXPECT(all && launch_collect(out_path, dump, 1, steps, r, hash), "%s: no complete run", name);
    return dt;
}

#endif
