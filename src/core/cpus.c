/* cpus.c — how many CPUs this process may run on, and jobs spread over threads. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <unistd.h>

#include "graphtrain/gt_core.h"

int gt_cpu_count(void)
{
    /* the affinity mask, not the host's count: a launcher that binds a rank to some cores
     * (mpirun binds each rank to one core when -np <= 2) leaves it only those */
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* ---------------------------------------------------------------- jobs on threads */

#define GT_JOBS_MAX_THREADS 64

typedef struct {
    int n;
    gt_job_fn job;
    void *user;
    atomic_int next;
    pthread_mutex_t lock; /* guards first_failed, st, err */
    int first_failed;
    gt_status st;
    gt_error err;
} jobs;

static void *jobs_run(void *arg)
{
    jobs *j = arg;
    for (int i; (i = atomic_fetch_add(&j->next, 1)) < j->n;) {
        gt_error e = {0};
        gt_status st = j->job(i, j->user, &e);
        if (st == GT_OK) continue;
        pthread_mutex_lock(&j->lock);
        if (j->first_failed < 0 || i < j->first_failed) {
            j->first_failed = i;
            j->st = st;
            j->err = e;
        }
        pthread_mutex_unlock(&j->lock);
    }
    return NULL;
}

gt_status gt_run_jobs(int n, int threads, gt_job_fn job, void *user, gt_error *err)
{
    jobs j = {.n = n, .job = job, .user = user, .first_failed = -1, .st = GT_OK};
    atomic_init(&j.next, 0);
    pthread_mutex_init(&j.lock, NULL);
    if (threads > n) threads = n;
    if (threads > GT_JOBS_MAX_THREADS) threads = GT_JOBS_MAX_THREADS;
    pthread_t th[GT_JOBS_MAX_THREADS];
    bool started[GT_JOBS_MAX_THREADS] = {0};
    for (int t = 1; t < threads; t++)
        started[t] = pthread_create(&th[t], NULL, jobs_run, &j) == 0;
    jobs_run(&j);
    for (int t = 1; t < threads; t++)
        if (started[t]) pthread_join(th[t], NULL);
    pthread_mutex_destroy(&j.lock);
    if (j.st != GT_OK && err) *err = j.err;
    return j.st;
}
