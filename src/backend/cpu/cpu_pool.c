/* cpu_pool.c — the CPU backend's persistent threads: jobs of one kernel call spread over them.
 *
 * gt_cpu_set_threads(n) sizes the pool: n - 1 workers, started on the first call that needs them
 * and kept for the life of the process (a kernel of ~50 us cannot pay a pthread_create per call,
 * which is what gt_run_jobs costs). A call hands out jobs 0..n-1 of a fixed partition (the
 * caller's rule, of the shape alone); which thread runs a job never changes what it computes, so
 * the bits do not depend on the thread count. The caller runs jobs too and returns when every job
 * is done.
 *
 * One call at a time: a call made while another is running (from a job, or from another thread
 * of the process, such as ranks of a test that are threads) runs its jobs itself, in index order.
 * A job index is claimed by a compare-and-swap on a word that also holds the call's generation, so
 * a worker that wakes late, after its call has ended, can never run a job of a later call with an
 * earlier call's function. Workers spin briefly between calls (a step's kernels come back to back)
 * and then sleep on a condition variable. */
#include "cpu_internal.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>

#define GT_CPU_POOL_MAX 64
/* polls of a worker for the next call before it sleeps (a few hundred us) */
#define GT_CPU_POOL_SPIN 4000

typedef struct {
    gt_job_fn fn;
    void *user;
    int n;
    int workers; /* workers that take part: the thread count set, less the caller */
} pool_call;

static struct {
    pthread_mutex_t lock; /* guards gen's publication, call, started, sleeping */
    pthread_cond_t wake;
    atomic_flag busy;          /* a call is running */
    atomic_uint_fast64_t gen;  /* generation of the current call (published under lock) */
    atomic_uint_fast64_t next; /* gen << 32 | next job index */
    atomic_int done;           /* jobs of the current call finished */
    pool_call call;
    int started; /* workers running */
    int sleeping;
    atomic_int failed; /* lowest failed job index + 1 of the current call, 0 when none */
    gt_status st;
    gt_error err;
} gt_cpu_pool = {
    .lock = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER, .busy = ATOMIC_FLAG_INIT};

static _Thread_local bool gt_cpu_pool_in_job;

static inline void gt_cpu_pool_pause(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Records job i's failure if it is the lowest so far (so the result does not depend on timing). */
static void gt_cpu_pool_fail(int i, gt_status st, const gt_error *e)
{
    pthread_mutex_lock(&gt_cpu_pool.lock);
    int f = atomic_load(&gt_cpu_pool.failed);
    if (f == 0 || i + 1 < f) {
        atomic_store(&gt_cpu_pool.failed, i + 1);
        gt_cpu_pool.st = st;
        gt_cpu_pool.err = *e;
    }
    pthread_mutex_unlock(&gt_cpu_pool.lock);
}

/* Claims and runs jobs of call `gen` until none is left or a later call has begun. */
static void gt_cpu_pool_work(uint64_t gen, const pool_call *call)
{
    uint64_t v = atomic_load(&gt_cpu_pool.next);
    for (;;) {
        if ((v >> 32) != (gen & 0xffffffffu) || (int)(v & 0xffffffffu) >= call->n) return;
        if (!atomic_compare_exchange_weak(&gt_cpu_pool.next, &v, v + 1)) continue;
        int i = (int)(v & 0xffffffffu);
        gt_error e = {0};
        gt_status st = call->fn(i, call->user, &e);
        if (st != GT_OK) gt_cpu_pool_fail(i, st, &e);
        atomic_fetch_add(&gt_cpu_pool.done, 1);
        v = atomic_load(&gt_cpu_pool.next);
    }
}

static void *gt_cpu_pool_worker(void *arg)
{
    int id = (int)(intptr_t)arg;
    gt_cpu_pool_in_job = true; /* a kernel call from a job runs inline */
    uint64_t seen = 0;
    for (;;) {
        uint64_t gen = atomic_load(&gt_cpu_pool.gen);
        /* (spinning with sched_yield instead measured slower on the loaded VM: a worker that
         * gave its core away was not there when the next call came) */
        for (int s = 0; gen == seen && s < GT_CPU_POOL_SPIN; s++) {
            gt_cpu_pool_pause();
            gen = atomic_load(&gt_cpu_pool.gen);
        }
        pool_call call;
        pthread_mutex_lock(&gt_cpu_pool.lock);
        while ((gen = atomic_load(&gt_cpu_pool.gen)) == seen) {
            gt_cpu_pool.sleeping++;
            pthread_cond_wait(&gt_cpu_pool.wake, &gt_cpu_pool.lock);
            gt_cpu_pool.sleeping--;
        }
        call = gt_cpu_pool.call;
        pthread_mutex_unlock(&gt_cpu_pool.lock);
        seen = gen;
        if (id < call.workers) gt_cpu_pool_work(gen, &call);
    }
    return NULL;
}

/* A child forked while workers ran has none of them, and may have inherited the lock held: it
 * starts afresh (its calls start new workers). */
static void gt_cpu_pool_atfork_child(void)
{
    pthread_mutex_init(&gt_cpu_pool.lock, NULL);
    pthread_cond_init(&gt_cpu_pool.wake, NULL);
    atomic_flag_clear(&gt_cpu_pool.busy);
    gt_cpu_pool.started = 0;
    gt_cpu_pool.sleeping = 0;
    gt_cpu_pool_in_job = false;
}

static pthread_once_t gt_cpu_pool_once = PTHREAD_ONCE_INIT;

static void gt_cpu_pool_init(void)
{
    pthread_atfork(NULL, NULL, gt_cpu_pool_atfork_child);
}

/* Starts workers up to threads - 1 (those that fail to start leave their share to the others). */
static void gt_cpu_pool_grow(int threads)
{
    int want = threads - 1 < GT_CPU_POOL_MAX ? threads - 1 : GT_CPU_POOL_MAX;
    pthread_once(&gt_cpu_pool_once, gt_cpu_pool_init);
    pthread_mutex_lock(&gt_cpu_pool.lock);
    while (gt_cpu_pool.started < want) {
        pthread_t th;
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        int rc =
            pthread_create(&th, &at, gt_cpu_pool_worker, (void *)(intptr_t)gt_cpu_pool.started);
        pthread_attr_destroy(&at);
        if (rc != 0) break;
        gt_cpu_pool.started++;
    }
    pthread_mutex_unlock(&gt_cpu_pool.lock);
}

/* The jobs in index order on this thread: all of them, as on threads; the lowest failure wins. */
static gt_status gt_cpu_pool_inline(int n, gt_job_fn job, void *user, gt_error *err)
{
    gt_status first = GT_OK;
    for (int i = 0; i < n; i++) {
        gt_error e = {0};
        gt_status st = job(i, user, &e);
        if (st != GT_OK && first == GT_OK) {
            first = st;
            if (err) *err = e;
        }
    }
    return first;
}

gt_status gt_cpu_run_jobs(int n, gt_job_fn job, void *user, gt_error *err)
{
    int threads = gt_cpu_threads();
    if (n <= 0) return GT_OK;
    if (n == 1 || threads <= 1 || gt_cpu_pool_in_job || atomic_flag_test_and_set(&gt_cpu_pool.busy))
        return gt_cpu_pool_inline(n, job, user, err);
    gt_cpu_pool_grow(threads);
    /* Workers started for a larger count earlier sit this call out (pool_call.workers). */
    pthread_mutex_lock(&gt_cpu_pool.lock);
    uint64_t gen = atomic_load(&gt_cpu_pool.gen) + 1;
    gt_cpu_pool.call = (pool_call){.fn = job, .user = user, .n = n, .workers = threads - 1};
    atomic_store(&gt_cpu_pool.failed, 0);
    gt_cpu_pool.st = GT_OK;
    atomic_store(&gt_cpu_pool.done, 0);
    atomic_store(&gt_cpu_pool.next, (gen & 0xffffffffu) << 32);
    atomic_store(&gt_cpu_pool.gen, gen);
    if (gt_cpu_pool.sleeping > 0) pthread_cond_broadcast(&gt_cpu_pool.wake);
    pool_call call = gt_cpu_pool.call;
    pthread_mutex_unlock(&gt_cpu_pool.lock);

    gt_cpu_pool_in_job = true;
    gt_cpu_pool_work(gen, &call);
    gt_cpu_pool_in_job = false;
    /* the rest are running on workers: wait for them (yield: on a busy machine they need a core) */
    for (int s = 0; atomic_load(&gt_cpu_pool.done) < n; s++) {
        if (s < 4096)
            gt_cpu_pool_pause();
        else
            sched_yield();
    }
    gt_status st = GT_OK;
    if (atomic_load(&gt_cpu_pool.failed) != 0) {
        st = gt_cpu_pool.st;
        if (err) *err = gt_cpu_pool.err;
    }
    atomic_flag_clear(&gt_cpu_pool.busy);
    return st;
}

typedef struct {
    int64_t n, grain;
    gt_cpu_range_fn fn;
    void *user;
} range_call;

static gt_status gt_cpu_range_job(int i, void *user, gt_error *err)
{
    (void)err;
    const range_call *r = user;
    int64_t lo = (int64_t)i * r->grain, hi = lo + r->grain < r->n ? lo + r->grain : r->n;
    r->fn(lo, hi, r->user);
    return GT_OK;
}

void gt_cpu_parallel_for(int64_t n, int64_t grain, gt_cpu_range_fn fn, void *user)
{
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    int64_t blocks = (n + grain - 1) / grain;
    if (blocks <= 1 || blocks > INT32_MAX || gt_cpu_threads() <= 1) {
        for (int64_t lo = 0; lo < n; lo += grain) /* the same blocks, in order */
            fn(lo, n - lo < grain ? n : lo + grain, user);
        return;
    }
    range_call r = {.n = n, .grain = grain, .fn = fn, .user = user};
    gt_cpu_run_jobs((int)blocks, gt_cpu_range_job, &r, NULL);
}
