/* test_cpus.c — gt_cpu_count follows the process's affinity mask (what a launcher that binds
 * ranks leaves it), and gt_param_init, which sizes its threads by it, gives the same bits on one
 * CPU as on all of them. gt_run_jobs runs every job exactly once on any number of threads, and
 * reports the failed job of lowest index, whichever thread ran it and whenever. */
#define _GNU_SOURCE
#include "graphtrain/gt_core.h"
#include "graphtrain/gt_llama3.h"
#include "gt_test.h"

#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#define N_JOBS 1000

typedef struct {
    atomic_int runs[N_JOBS];
    int fail[2]; /* these indices fail */
} job_log;

static gt_status count_job(int i, void *user, gt_error *err)
{
    job_log *log = user;
    atomic_fetch_add(&log->runs[i], 1);
    if (i == log->fail[0] || i == log->fail[1])
        return gt_error_set(err, GT_ERR_IO, "job %d failed", i);
    return GT_OK;
}

/* n jobs on `threads` threads, jobs fail[0] and fail[1] failing (-1: none). */
static void check_jobs(int n, int threads, int fail0, int fail1)
{
    static job_log log;
    memset(&log, 0, sizeof log);
    log.fail[0] = fail0, log.fail[1] = fail1;
    gt_error err = {0};
    gt_status st = gt_run_jobs(n, threads, count_job, &log, &err);
    int wrong = 0;
    for (int i = 0; i < N_JOBS; i++)
        wrong += atomic_load(&log.runs[i]) != (i < n ? 1 : 0);
    EXPECT(wrong == 0, "%d jobs on %d threads: %d ran other than once", n, threads, wrong);
    int first = fail0 < 0 ? fail1 : fail1 < 0 || fail0 < fail1 ? fail0 : fail1;
    if (first < 0) {
        EXPECT(st == GT_OK, "%d jobs on %d threads, none failing: %s", n, threads, err.msg);
        return;
    }
    char want[32];
    snprintf(want, sizeof want, "job %d failed", first);
    EXPECT(st == GT_ERR_IO && !strcmp(err.msg, want), "%d jobs on %d threads: got '%s', want '%s'",
           n, threads, err.msg, want);
}

int main(void)
{
    cpu_set_t all;
    EXPECT(sched_getaffinity(0, sizeof all, &all) == 0, "sched_getaffinity failed");
    EXPECT(gt_cpu_count() == CPU_COUNT(&all), "gt_cpu_count %d, affinity mask %d CPUs",
           gt_cpu_count(), CPU_COUNT(&all));

    /* 2^20 elements: split over threads wherever more than one CPU is allowed */
    gt_param_spec p = {.fqn = "layers.0.feed_forward.w1.weight",
                       .dtype = GT_F32,
                       .ndim = 2,
                       .shape = {1024, 1024},
                       .init = GT_INIT_TRUNC_NORMAL,
                       .std = 0.02,
                       .lo = -0.04,
                       .hi = 0.04};
    const int64_t shape[2] = {1024, 1024};
    gt_error err = {0};
    gt_tensor wide, one;
    EXPECT_OK(gt_tensor_alloc(&wide, GT_F32, 2, shape, &err), &err);
    EXPECT_OK(gt_tensor_alloc(&one, GT_F32, 2, shape, &err), &err);
    gt_param_init(&p, 7, 0, 1 << 20, &wide);

    int first = 0;
    while (first < CPU_SETSIZE && !CPU_ISSET(first, &all))
        first++;
    cpu_set_t single;
    CPU_ZERO(&single);
    CPU_SET(first, &single);
    EXPECT(sched_setaffinity(0, sizeof single, &single) == 0, "binding to CPU %d failed", first);
    EXPECT(gt_cpu_count() == 1, "bound to one CPU, gt_cpu_count says %d", gt_cpu_count());
    gt_param_init(&p, 7, 0, 1 << 20, &one);
    EXPECT(sched_setaffinity(0, sizeof all, &all) == 0, "restoring the affinity failed");
    EXPECT(memcmp(wide.data, one.data, gt_tensor_nbytes(&wide)) == 0,
           "param init on one CPU differs from init on %d", CPU_COUNT(&all));
    gt_tensor_free(&wide);
    gt_tensor_free(&one);

    static const int thread_counts[] = {1, 2, 4, 16};
    for (int k = 0; k < 4; k++) {
        int th = thread_counts[k];
        check_jobs(0, th, -1, -1);
        check_jobs(1, th, -1, -1);
        check_jobs(N_JOBS, th, -1, -1);
        check_jobs(N_JOBS, th, 700, 300); /* the lower index is reported, not the later-run one */
        check_jobs(N_JOBS, th, 999, -1);
        check_jobs(3, th, 0, 2);
    }
    return gt_test_finish();
}
