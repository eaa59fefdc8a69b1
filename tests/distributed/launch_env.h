/* launch_env.h — starting `graphtrain train` ranks the way torchrun does (RANK, WORLD_SIZE,
 * LOCAL_RANK, MASTER_ADDR, MASTER_PORT; no MPI variables), for the tests that compare such a
 * launch with mpiexec's (tests/distributed/test_torchrun_launch.c on CPUs,
 * tests/cuda/test_gpu_safety_launch.c on GPUs). Include after launch.h. */
#ifndef GT_TESTS_DISTRIBUTED_LAUNCH_ENV_H
#define GT_TESTS_DISTRIBUTED_LAUNCH_ENV_H

#include <netinet/in.h>
#include <sys/socket.h>

#include "launch.h"

#define LAUNCH_ENV_MAX_RANKS 8

/* A TCP port nobody listens on now (the kernel's pick for port 0). */
static inline int launch_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    socklen_t len = sizeof a;
    int port = -1;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

/* Starts c as rank `rank` of `size` (GPU / LOCAL_RANK local_rank) in its own process group, output
 * into out_path; extra_env: "NAME=VALUE" strings, NULL-terminated (or NULL). */
static inline pid_t launch_env_spawn(launch_cmd *c, int rank, int size, int local_rank, int port,
                                     const char *out_path, const char *const *extra_env)
{
    char *argv[LAUNCH_MAX_ARGS + 1];
    for (int k = 0; k < c->n; k++)
        argv[k] = c->buf[k];
    argv[c->n] = NULL;
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
        char v[32];
        snprintf(v, sizeof v, "%d", rank);
        setenv("RANK", v, 1);
        snprintf(v, sizeof v, "%d", local_rank);
        setenv("LOCAL_RANK", v, 1);
        snprintf(v, sizeof v, "%d", size);
        setenv("WORLD_SIZE", v, 1);
        setenv("MASTER_ADDR", "127.0.0.1", 1);
        snprintf(v, sizeof v, "%d", port);
        setenv("MASTER_PORT", v, 1);
        for (int k = 0; extra_env && extra_env[k]; k++)
            putenv((char *)extra_env[k]);
        int out = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (out < 0 || dup2(out, 1) < 0 || dup2(out, 2) < 0) _exit(126);
        execvp(argv[0], argv);
        _exit(127);
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

#endif
