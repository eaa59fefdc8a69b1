/* nccl.c — the NCCL communicator for device tensors (gt_comm.h, "NCCL"): host waits, scratch
 * and the collectives; creation, split and destroy are in nccl_setup.c.
 *
 * Streams. Each communicator owns a stream (highest priority, so its kernels start as soon as
 * their inputs are ready) and is given the compute stream its collectives are ordered with. A
 * start is
 *     record(fork, compute); comm stream waits for fork; NCCL work (+ sum kernel) on the comm
 *     stream; record(done, comm stream)
 * and its wait is "compute waits for done": no host blocking anywhere, so the transfer overlaps
 * whatever the compute stream runs between start and wait, and while the compute stream is being
 * captured the comm stream joins the capture at the fork and leaves it at the wait. `fork` is
 * reused by every start (it is consumed at once); `done` events come from a per-communicator
 * free list, one per request in flight.
 *
 * Sums (all_reduce, reduce_scatter) in rank order, the MPI communicator's bits:
 *   reduce_scatter: block j of the input goes to rank j (grouped ncclSend/ncclRecv) into scratch
 *     [n][k], in the input dtype; gt_comm_nccl_sum adds the n blocks in rank order into the
 *     output, in its dtype (f32 for a widening bf16/f16 scatter), reading the own block from the
 *     input where it lies (no copy).
 *   all_reduce (N elements, c = ceil(N / n), rank j owns elements [j·c, min((j+1)·c, N))): the
 *     same exchange of the owned chunks, the rank-order sum of this rank's chunk, then an in-place
 *     ncclAllGather of the reduced chunks — into the output when n divides N, else into a padded
 *     scratch area copied out. Each element is summed once, on one rank, so every rank gets the
 *     same bits.
 *   all_gather, broadcast: ncclAllGather / ncclBroadcast on bytes; all_to_all: grouped
 *   send/recv.
 * With symmetric buffers (gt_nccl_buffers) the equal-block exchanges of reduce_scatter and
 * all_to_all are one ncclAlltoAll instead, which NCCL runs on the copy engines like the
 * all-gathers (the scratch is a symmetric window too); all_reduce's uneven chunks stay send/recv.
 *
 * Non-blocking NCCL (config blocking = 0): a call may return ncclInProgress and finish in the
 * background; gt_nccl_settle() polls ncclCommGetAsyncError until it is done, up to the
 * communicator's timeout, so a peer that never joins (init, split, the lazy connection of a first
 * collective) becomes an error. Device-side hangs are caught by gt_comm_nccl_wait_event, through
 * which every host wait for device work with collectives goes. A communicator that failed or timed
 * out is aborted (ncclCommAbort, which also ends its stuck kernels) and refuses later calls. */
#include "graphtrain/gt_comm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool gt_comm_is_nccl(const gt_comm *c)
{
    return c && c->vt && c->vt->name && !strcmp(c->vt->name, "nccl");
}

#if !(defined(GT_HAVE_NCCL) && defined(GT_HAVE_CUDA))

bool gt_comm_nccl_available(void)
{
    return false;
}

gt_status gt_comm_nccl_check_buffers(gt_nccl_buffers buffers, gt_error *err)
{
    (void)buffers;
    return gt_error_set(err, GT_ERR_UNSUPPORTED,
                        "NCCL buffers: this build has no NCCL (build with CUDA and NCCL)");
}

static gt_status no_nccl(gt_comm **out, gt_error *err)
{
    *out = NULL;
    return gt_error_set(err, GT_ERR_UNSUPPORTED,
                        "NCCL communicator: this build has no NCCL (build with CUDA and NCCL: "
                        "nccl.h and libnccl under the CUDA toolkit or NCCL_HOME)");
}

gt_status gt_comm_nccl_create(gt_comm *bootstrap, int device, void *compute_stream,
                              double timeout_seconds, gt_nccl_buffers buffers, gt_comm **out,
                              gt_error *err)
{
    (void)bootstrap, (void)device, (void)compute_stream, (void)timeout_seconds, (void)buffers;
    return no_nccl(out, err);
}

gt_status gt_comm_nccl_create_tcp(int device, void *compute_stream, double timeout_seconds,
                                  gt_comm **out, gt_error *err)
{
    (void)device, (void)compute_stream, (void)timeout_seconds;
    return no_nccl(out, err);
}

bool gt_comm_nccl_aborted(const gt_comm *c)
{
    (void)c;
    return false;
}

void gt_comm_nccl_abort(gt_comm *c, const char *why)
{
    (void)c, (void)why;
}

void gt_comm_nccl_set_stream(gt_comm *c, void *compute_stream)
{
    (void)c, (void)compute_stream;
}

gt_status gt_comm_nccl_group_begin(gt_comm *c, gt_error *err)
{
    (void)c;
    return gt_error_set(err, GT_ERR_UNSUPPORTED, "NCCL group: this build has no NCCL");
}

gt_status gt_comm_nccl_group_end(gt_comm *c, gt_error *err)
{
    (void)c, (void)err;
    return GT_OK;
}

gt_status gt_comm_nccl_mem_alloc(void **p, size_t bytes, gt_error *err)
{
    (void)bytes;
    *p = NULL;
    return gt_error_set(
        err, GT_ERR_UNSUPPORTED,
        "NCCL-registrable memory: this build has no NCCL (build with CUDA and NCCL)");
}

void gt_comm_nccl_mem_free(void *p)
{
    (void)p;
}

gt_status gt_comm_nccl_window_register(gt_comm *c, void *p, size_t bytes, void **win, gt_error *err)
{
    (void)c, (void)p, (void)bytes;
    *win = NULL;
    return gt_error_set(
        err, GT_ERR_UNSUPPORTED,
        "NCCL symmetric windows: this build has no NCCL (build with CUDA and NCCL)");
}

void gt_comm_nccl_window_deregister(gt_comm *c, void *win)
{
    (void)c, (void)win;
}

gt_status gt_comm_nccl_wait_event(gt_comm *const *comms, int n, void *event, gt_error *err)
{
    (void)comms, (void)n, (void)event;
    return gt_error_set(err, GT_ERR_UNSUPPORTED, "NCCL communicator: this build has no NCCL");
}

#else

#include <pthread.h>
#include <sched.h>
#include <time.h>

#include "nccl_internal.h"
#include "nccl_sum.h"

#define SCRATCH_ALIGN 256
/* How long an abort may take before the caller stops waiting for it (see abort_bounded). */
#define GT_NCCL_ABORT_WAIT_S 5

bool gt_comm_nccl_available(void)
{
    return true;
}

gt_status gt_comm_nccl_check_buffers(gt_nccl_buffers buffers, gt_error *err)
{
    if (buffers != GT_NCCL_BUFFERS_SYMMETRIC) return GT_OK;
    int lib = 0;
    ncclGetVersion(&lib);
    if (NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0) && lib >= NCCL_VERSION(2, 28, 0)) return GT_OK;
    return gt_error_set(err, GT_ERR_UNSUPPORTED,
                        "symmetric NCCL buffers (--comm.nccl_buffers symmetric) need NCCL 2.28 or "
                        "later: this build's nccl.h is version %d, the loaded library %d; use "
                        "--comm.nccl_buffers plain",
                        NCCL_VERSION_CODE, lib);
}

nccl_impl *gt_nccl_impl(gt_comm *c)
{
    return c->impl;
}

/* ---------------------------------------------------------------- polling */

/* Between polls: yield for the first 2 ms, then sleep 50 us doubling up to 1 ms. */
static void backoff(double start, long *sleep_ns)
{
    if (gt_now_seconds() - start < 2e-3) {
        sched_yield();
        return;
    }
    struct timespec ts = {0, *sleep_ns};
    nanosleep(&ts, NULL);
    if (*sleep_ns < 1000000) *sleep_ns *= 2;
}

/* Finishes a non-blocking call that returned r on comm: polls its state while ncclInProgress.
 * A call that returned ncclSuccess is checked too: NCCL may still hold the communicator in
 * progress then (NVIDIA/nccl#1734, #1495), and its next call would fail with "Attempt to use
 * communicator before the previous operation returned ncclSuccess". *timed_out when timeout_s
 * (> 0) passed first. */
ncclResult_t gt_nccl_settle(ncclComm_t comm, ncclResult_t r, double timeout_s, bool *timed_out)
{
    *timed_out = false;
    double t0 = gt_now_seconds();
    long sleep_ns = 50000;
    if (r == ncclSuccess) {
        ncclResult_t state = ncclSuccess;
        if (ncclCommGetAsyncError(comm, &state) == ncclSuccess && state == ncclInProgress)
            r = ncclInProgress;
    }
    while (r == ncclInProgress) {
        ncclResult_t state = ncclInProgress;
        ncclResult_t q = ncclCommGetAsyncError(comm, &state);
        if (q != ncclSuccess) return q;
        r = state;
        if (r != ncclInProgress) break;
        if (timeout_s > 0 && gt_now_seconds() - t0 > timeout_s) {
            *timed_out = true;
            break;
        }
        backoff(t0, &sleep_ns);
    }
    return r;
}

void gt_nccl_describe(gt_comm *c, char *buf, size_t len)
{
    snprintf(buf, len, "NCCL communicator '%s' (size %d, %s)", c->name, c->size,
             gt_nccl_impl(c)->members);
}

/* ncclCommAbort on a thread of its own, so that the caller can stop waiting for it: recent NCCL
 * versions synchronise the ranks of a node even while aborting (NVIDIA/nccl#863), so with a peer
 * that is stopped rather than dead the abort itself never returns (seen on 2 H200s: rank 0 in
 * pthread_cond_wait under ncclCommAbort). The record is freed by whichever side leaves last. */
typedef struct {
    ncclComm_t comm;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    int refs;
} abort_job;

static void abort_job_release(abort_job *j)
{
    pthread_mutex_lock(&j->mu);
    bool last = --j->refs == 0;
    pthread_mutex_unlock(&j->mu);
    if (!last) return;
    pthread_cond_destroy(&j->cv);
    pthread_mutex_destroy(&j->mu);
    free(j);
}

static void *abort_job_run(void *arg)
{
    abort_job *j = arg;
    ncclCommAbort(j->comm);
    pthread_mutex_lock(&j->mu);
    j->done = true;
    pthread_cond_signal(&j->cv);
    pthread_mutex_unlock(&j->mu);
    abort_job_release(j);
    return NULL;
}

/* Runs ncclCommAbort(comm) and waits at most GT_NCCL_ABORT_WAIT_S for it; false when it did not
 * return in time (it goes on in the background: the process is about to exit, which ends the
 * device work and the thread alike). */
static bool abort_bounded(ncclComm_t comm)
{
    abort_job *j = gt_xcalloc(1, sizeof *j);
    j->comm = comm;
    j->refs = 2;
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    pthread_t th;
    if (pthread_create(&th, NULL, abort_job_run, j) != 0) { /* no thread: abort here */
        ncclCommAbort(comm);
        j->refs = 1;
        abort_job_release(j);
        return true;
    }
    pthread_detach(th);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += GT_NCCL_ABORT_WAIT_S;
    pthread_mutex_lock(&j->mu);
    while (!j->done)
        if (pthread_cond_timedwait(&j->cv, &j->mu, &until) != 0) break;
    bool done = j->done;
    pthread_mutex_unlock(&j->mu);
    abort_job_release(j);
    return done;
}

/* Aborts c (its in-flight kernels end; it refuses every later call, citing why). */
void gt_nccl_abort(gt_comm *c, const char *why)
{
    nccl_impl *im = gt_nccl_impl(c);
    if (im->aborted) return;
    im->aborted = true;
    size_t len = strlen(why);
    if (len >= sizeof im->why) len = sizeof im->why - 1; /* the start says what went wrong */
    memcpy(im->why, why, len);
    im->why[len] = '\0';
    if (im->nccl && !abort_bounded(im->nccl)) {
        char d[200];
        gt_nccl_describe(c, d, sizeof d);
        gt_log(GT_LOG_WARN,
               "rank %d: ncclCommAbort of %s did not return within %d s (a peer rank is "
               "stuck, not dead); leaving it to process exit",
               im->world_rank, d, GT_NCCL_ABORT_WAIT_S);
    }
    im->nccl = NULL;
}

gt_status gt_nccl_aborted_error(gt_comm *c, const char *what, gt_error *err)
{
    char d[200];
    gt_nccl_describe(c, d, sizeof d);
    return gt_error_set(err, GT_ERR_IO,
                        "rank %d: %s on %s: the communicator was aborted earlier (%s)",
                        gt_nccl_impl(c)->world_rank, what, d, gt_nccl_impl(c)->why);
}

/* Finishes call result r of `what` on c; an NCCL error or a timeout aborts c. */
static gt_status settle_call(gt_comm *c, ncclResult_t r, const char *what, gt_error *err)
{
    nccl_impl *im = gt_nccl_impl(c);
    bool timed_out;
    r = gt_nccl_settle(im->nccl, r, im->timeout_s, &timed_out);
    if (r == ncclSuccess && !timed_out) return GT_OK;
    char d[200];
    gt_nccl_describe(c, d, sizeof d);
    gt_status st;
    if (timed_out) {
        st = gt_error_set(err, GT_ERR_IO,
                          "rank %d: %s on %s did not complete within %.0f s on the host: a peer "
                          "rank died, never joined, or is stuck (comm.init_timeout_seconds / train_timeout_seconds)",
                          im->world_rank, what, d, im->timeout_s);
    } else {
        const char *last = ncclGetLastError(im->nccl);
        st = gt_error_set(err, GT_ERR_IO, "rank %d: %s on %s failed: %s%s%s", im->world_rank, what,
                          d, ncclGetErrorString(r), last && last[0] ? ": " : "", last ? last : "");
    }
    gt_nccl_abort(c, err->msg);
    return st;
}

gt_status gt_nccl_cuda_fail(gt_comm *c, const char *what, cudaError_t e, gt_error *err)
{
    char d[200];
    gt_nccl_describe(c, d, sizeof d);
    return gt_error_set(err, GT_ERR_INTERNAL, "rank %d: %s on %s: CUDA error %s",
                        gt_nccl_impl(c)->world_rank, what, d, cudaGetErrorString(e));
}

/* Polls until ev completes (or, ev NULL, stream st is idle), watching the async errors of the
 * NCCL communicators among comms. Past the shortest timeout or on an NCCL error: aborts them all,
 * waits a little for the aborted kernels to end, and fails naming them. */
gt_status gt_nccl_watch(gt_comm *const *comms, int n, cudaEvent_t ev, cudaStream_t st,
                        gt_error *err)
{
    gt_comm *mine[16] = {NULL};
    int m = 0;
    double timeout = 0;
    for (int k = 0; k < n; k++) {
        gt_comm *c = comms[k];
        bool dup = false;
        for (int j = 0; j < m; j++)
            dup |= mine[j] == c;
        if (!gt_comm_is_nccl(c) || dup || m == 16) continue;
        mine[m++] = c;
        double t = gt_nccl_impl(c)->timeout_s;
        if (t > 0 && (timeout <= 0 || t < timeout)) timeout = t;
    }
    double t0 = gt_now_seconds();
    long sleep_ns = 50000;
    char failed[400] = "";
    for (long polls = 0;; polls++) {
        cudaError_t q = ev ? cudaEventQuery(ev) : cudaStreamQuery(st);
        if (q == cudaSuccess) break;
        if (q != cudaErrorNotReady)
            return gt_error_set(err, GT_ERR_INTERNAL, "waiting for device work: CUDA error %s",
                                cudaGetErrorString(q));
        for (int j = 0; j < m && polls >= 16 && !failed[0]; j++) {
            nccl_impl *im = gt_nccl_impl(mine[j]);
            ncclResult_t a = ncclSuccess;
            if (im->nccl && ncclCommGetAsyncError(im->nccl, &a) == ncclSuccess &&
                a != ncclSuccess && a != ncclInProgress) {
                char d[200];
                gt_nccl_describe(mine[j], d, sizeof d);
                const char *last = ncclGetLastError(im->nccl);
                snprintf(failed, sizeof failed, "%s reported %s%s%s", d, ncclGetErrorString(a),
                         last && last[0] ? ": " : "", last ? last : "");
            }
        }
        if (!failed[0] && timeout > 0 && gt_now_seconds() - t0 > timeout) {
            char list[300] = "";
            size_t used = 0;
            for (int j = 0; j < m && used + 8 < sizeof list; j++) {
                char d[200];
                gt_nccl_describe(mine[j], d, sizeof d);
                used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", j ? ", " : "", d);
            }
            snprintf(failed, sizeof failed, "device work using %s did not complete within %.0f s",
                     list, timeout);
        }
        if (failed[0]) break;
        backoff(t0, &sleep_ns);
    }
    if (!failed[0]) return GT_OK;
    int rank = m ? gt_nccl_impl(mine[0])->world_rank : -1;
    gt_status s = gt_error_set(err, GT_ERR_IO,
                               "rank %d: %s: a peer rank died or is stuck; the communicator%s "
                               "%s aborted (comm.init_timeout_seconds / train_timeout_seconds)",
                               rank, failed, m > 1 ? "s" : "", m > 1 ? "were" : "was");
    /* said now: the abort and what follows it wait on the device, which a wedged peer may stall */
    gt_log(GT_LOG_ERROR, "%s", err->msg);
    for (int j = 0; j < m; j++)
        gt_nccl_abort(mine[j], err->msg);
    /* the aborted kernels end: let the device work drain (bounded) before the buffers are reused */
    double t1 = gt_now_seconds();
    while ((ev ? cudaEventQuery(ev) : cudaStreamQuery(st)) == cudaErrorNotReady &&
           gt_now_seconds() - t1 < 10.0) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    return s;
}

gt_status gt_comm_nccl_wait_event(gt_comm *const *comms, int n, void *event, gt_error *err)
{
    if (!event) return gt_error_set(err, GT_ERR_INVALID, "gt_comm_nccl_wait_event: no event");
    return gt_nccl_watch(comms, n, (cudaEvent_t)event, NULL, err);
}

/* ---------------------------------------------------------------- scratch and events */

static size_t align_up(size_t x)
{
    return (x + SCRATCH_ALIGN - 1) / SCRATCH_ALIGN * SCRATCH_ALIGN;
}

/* Scratch of at least `need` bytes. Growing waits for the comm stream (its queued work may read the
 * old buffer) and reallocates: never during a capture. */
static gt_status reserve_scratch(gt_comm *c, size_t need, bool capturing, const char *what,
                                 gt_error *err)
{
    nccl_impl *im = gt_nccl_impl(c);
    if (need <= im->scratch_bytes) return GT_OK;
    if (capturing) {
        char d[200];
        gt_nccl_describe(c, d, sizeof d);
        return gt_error_set(err, GT_ERR_UNSUPPORTED,
                            "rank %d: %s on %s needs %zu bytes of scratch during a CUDA graph "
                            "capture, %zu allocated (run the step once before capturing it)",
                            im->world_rank, what, d, need, im->scratch_bytes);
    }
    gt_comm *self[1] = {c};
    GT_TRY(gt_nccl_watch(self, 1, NULL, im->stream, err));
    size_t want = need > 2 * im->scratch_bytes ? need : 2 * im->scratch_bytes;
    if (im->scratch.p && im->scratch_captured) { /* a graph replays with this pointer: keep it */
        im->retired = gt_xrealloc(im->retired, (size_t)(im->n_retired + 1) * sizeof *im->retired);
        im->retired[im->n_retired++] = im->scratch;
    } else {
        gt_nccl_free_scratch(c, im->scratch);
    }
    im->scratch = (gt_nccl_scratch){NULL, NULL};
    im->scratch_bytes = 0;
    im->scratch_captured = false;
    const char *why = NULL;
    if (im->buffers != GT_NCCL_BUFFERS_PLAIN) {
        ncclResult_t r = ncclMemAlloc(&im->scratch.p, want);
        if (r != ncclSuccess) why = ncclGetErrorString(r);
    } else {
        cudaError_t e = cudaMalloc(&im->scratch.p, want);
        if (e != cudaSuccess) why = cudaGetErrorString(e);
    }
    if (why) {
        im->scratch.p = NULL;
        char d[200];
        gt_nccl_describe(c, d, sizeof d);
        return gt_error_set(err, GT_ERR_NOMEM, "rank %d: %s on %s: %zu bytes of scratch: %s",
                            im->world_rank, what, d, want, why);
    }
    im->scratch_bytes = want;
    if (im->buffers == GT_NCCL_BUFFERS_SYMMETRIC) /* every rank grows it at the same collective */
        return gt_comm_nccl_window_register(c, im->scratch.p, want, &im->scratch.win, err);
    return GT_OK;
}

static gt_status take_event(gt_comm *c, cudaEvent_t *ev, gt_error *err)
{
    nccl_impl *im = gt_nccl_impl(c);
    if (im->n_free > 0) {
        *ev = im->free_ev[--im->n_free];
        return GT_OK;
    }
    cudaError_t e = cudaEventCreateWithFlags(ev, cudaEventDisableTiming);
    return e == cudaSuccess ? GT_OK : gt_nccl_cuda_fail(c, "creating an event", e, err);
}

static void give_event(nccl_impl *im, cudaEvent_t ev)
{
    if (im->n_free == im->cap_free) {
        im->cap_free = im->cap_free ? 2 * im->cap_free : 8;
        im->free_ev = gt_xrealloc(im->free_ev, (size_t)im->cap_free * sizeof *im->free_ev);
    }
    im->free_ev[im->n_free++] = ev;
}

/* ---------------------------------------------------------------- collectives */

/* Scratch bytes a collective needs (0 for the pure data movements). */
static size_t scratch_need(gt_comm *c, gt_coll_kind kind, const gt_tensor *in, const gt_tensor *out)
{
    size_t es = gt_dtype_size(in->dtype), n = (size_t)c->size;
    /* n received blocks of the output's length, in the input dtype (out may be wider) */
    if (kind == GT_COLL_REDUCE_SCATTER) return n * (size_t)gt_tensor_numel(out) * es;
    if (kind != GT_COLL_ALL_REDUCE) return 0;
    size_t numel = (size_t)gt_tensor_numel(in), chunk = (numel + n - 1) / n;
    if (numel % n == 0) return n * chunk * es;
    return align_up(n * chunk * es) + n * chunk * es; /* received chunks, then the padded gather */
}

/* Block j of `send` (send_len[j] bytes at send + send_off[j]) goes to rank j; the block of rank r
 * lands at recv + r * recv_len (recv_len bytes from each). The own block is a device copy when
 * copy_own (the sums read it where it is instead). */
static gt_status exchange(gt_comm *c, const char *send, const size_t *send_off,
                          const size_t *send_len, char *recv, size_t recv_len, bool copy_own,
                          const char *what, gt_error *err)
{
    nccl_impl *im = gt_nccl_impl(c);
    int n = c->size, me = c->rank;
    if (copy_own && send_len[me]) {
        cudaError_t e = cudaMemcpyAsync(recv + (size_t)me * recv_len, send + send_off[me],
                                        send_len[me], cudaMemcpyDeviceToDevice, im->stream);
        if (e != cudaSuccess) return gt_nccl_cuda_fail(c, what, e, err);
    }
    ncclResult_t r = ncclGroupStart();
    for (int j = 0; j < n && r == ncclSuccess; j++) {
        if (j == me) continue;
        if (send_len[j])
            r = ncclSend(send + send_off[j], send_len[j], ncclUint8, j, im->nccl, im->stream);
        if (r == ncclSuccess && recv_len)
            r = ncclRecv(recv + (size_t)j * recv_len, recv_len, ncclUint8, j, im->nccl, im->stream);
    }
    ncclResult_t end = ncclGroupEnd();
    return settle_call(c, r != ncclSuccess ? r : end, what, err);
}

/* Block j of `send` (blk bytes at send + j * blk) goes to rank j, the block of rank r lands at
 * recv + r * blk (the own block only when copy_own). Symmetric buffers: one ncclAlltoAll (which
 * copies the own block anyway), run on the copy engines when both buffers lie in symmetric windows
 * and the CTA policy is zero; otherwise grouped send/recv. */
static gt_status all_to_all(gt_comm *c, const char *send, char *recv, size_t blk, bool copy_own,
                            const char *what, gt_error *err)
{
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
    nccl_impl *im = gt_nccl_impl(c);
    if (im->buffers == GT_NCCL_BUFFERS_SYMMETRIC)
        return settle_call(c, ncclAlltoAll(send, recv, blk, ncclUint8, im->nccl, im->stream), what,
                           err);
#endif
    int n = c->size;
    size_t *off = gt_xmalloc(2 * (size_t)n * sizeof *off), *len = off + n;
    for (int j = 0; j < n; j++) {
        off[j] = (size_t)j * blk;
        len[j] = blk;
    }
    gt_status st = exchange(c, send, off, len, recv, blk, copy_own, what, err);
    free(off);
    return st;
}

static gt_status enqueue_reduce_scatter(gt_comm *c, const gt_tensor *in, gt_tensor *out,
                                        gt_error *err)
{
    nccl_impl *im = gt_nccl_impl(c);
    int n = c->size;
    /* blocks travel in the input dtype; a widening scatter (bf16/f16 in, f32 out) sums them in
     * f32 straight into the output */
    size_t blk = (size_t)gt_tensor_numel(out) * gt_dtype_size(in->dtype);
    /* the sum reads the own block where it lies, in the input */
    GT_TRY(all_to_all(c, in->data, im->scratch.p, blk, false, "reduce_scatter", err));
    return gt_comm_nccl_sum(in->dtype, out->dtype, gt_tensor_numel(out), im->scratch.p, n, c->rank,
                            (const char *)in->data + (size_t)c->rank * blk, out->data, im->stream,
                            err);
}

static gt_status enqueue_all_reduce(gt_comm *c, const gt_tensor *in, gt_tensor *out, gt_error *err)
{
    nccl_impl *im = gt_nccl_impl(c);
    int n = c->size, me = c->rank;
    size_t es = gt_dtype_size(in->dtype), numel = (size_t)gt_tensor_numel(in);
    size_t chunk = (numel + (size_t)n - 1) / (size_t)n;
    size_t *off = gt_xmalloc(2 * (size_t)n * sizeof *off), *len = off + n;
    for (int j = 0; j < n; j++) {
        size_t lo = (size_t)j * chunk, hi = lo + chunk < numel ? lo + chunk : numel;
        off[j] = lo * es;
        len[j] = hi > lo ? (hi - lo) * es : 0;
    }
    size_t mine = len[me], mine_off = off[me];
    gt_status st = exchange(c, in->data, off, len, im->scratch.p, mine, false, "all_reduce", err);
    free(off);
    if (st != GT_OK) return st;
    bool even = numel % (size_t)n == 0;
    char *gather = even ? out->data : (char *)im->scratch.p + align_up((size_t)n * chunk * es);
    char *dst = gather + (size_t)me * chunk * es;
    GT_TRY(gt_comm_nccl_sum(in->dtype, out->dtype, (int64_t)(mine / es), im->scratch.p, n, me,
                            (const char *)in->data + mine_off, dst, im->stream, err));
    GT_TRY(settle_call(c, ncclAllGather(dst, gather, chunk * es, ncclUint8, im->nccl, im->stream),
                       "all_reduce", err));
    if (even) return GT_OK;
    cudaError_t e =
        cudaMemcpyAsync(out->data, gather, numel * es, cudaMemcpyDeviceToDevice, im->stream);
    return e == cudaSuccess ? GT_OK : gt_nccl_cuda_fail(c, "all_reduce", e, err);
}

static gt_status enqueue(gt_comm *c, gt_coll_kind kind, const gt_tensor *in, gt_tensor *out,
                         int root, gt_error *err)
{
    nccl_impl *im = gt_nccl_impl(c);
    size_t nin = gt_tensor_nbytes(in);
    switch (kind) {
    case GT_COLL_ALL_GATHER:
        return settle_call(c,
                           ncclAllGather(in->data, out->data, nin, ncclUint8, im->nccl, im->stream),
                           "all_gather", err);
    case GT_COLL_BROADCAST:
        return settle_call(
            c, ncclBroadcast(out->data, out->data, nin, ncclUint8, root, im->nccl, im->stream),
            "broadcast", err);
    case GT_COLL_ALL_TO_ALL:
        return all_to_all(c, in->data, out->data, nin / (size_t)c->size, true, "all_to_all", err);
    case GT_COLL_REDUCE_SCATTER:
        return enqueue_reduce_scatter(c, in, out, err);
    case GT_COLL_ALL_REDUCE:
        return enqueue_all_reduce(c, in, out, err);
    case GT_COLL_GATHER:
        return gt_error_set(err, GT_ERR_UNSUPPORTED,
                            "rank %d: gather on NCCL communicator '%s': only host communicators "
                            "(MPI, TCP) gather",
                            c->rank, c->name);
    default:
        return gt_error_set(err, GT_ERR_INVALID, "NCCL: unknown collective %d", (int)kind);
    }
}

gt_status gt_nccl_start(gt_comm *c, gt_coll_kind kind, const gt_tensor *in, gt_tensor *out,
                        int root, gt_comm_request *req, gt_error *err)
{
    nccl_impl *im = gt_nccl_impl(c);
    const char *what = gt_coll_kind_name(kind);
    if (im->aborted) return gt_nccl_aborted_error(c, what, err);
    if (kind != GT_COLL_BROADCAST && kind != GT_COLL_ALL_REDUCE && in->data == out->data)
        return gt_error_set(err, GT_ERR_INVALID,
                            "rank %d: %s on communicator '%s': input and output must not alias",
                            im->world_rank, what, c->name);
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    cudaError_t e = cudaStreamIsCapturing(im->compute, &cs);
    if (e != cudaSuccess) return gt_nccl_cuda_fail(c, what, e, err);
    bool capturing = cs != cudaStreamCaptureStatusNone;
    size_t need = scratch_need(c, kind, in, out);
    GT_TRY(reserve_scratch(c, need, capturing, what, err));
    if (capturing && need) im->scratch_captured = true;
    if (im->in_group && kind != GT_COLL_ALL_GATHER)
        return gt_error_set(err, GT_ERR_INVALID,
                            "rank %d: %s on communicator '%s' inside an NCCL group: only "
                            "all-gathers are grouped",
                            im->world_rank, what, c->name);
    nccl_req *s = gt_xcalloc(1, sizeof *s);
    req->impl_state = s;
    s->compute = im->compute;
    GT_TRY(take_event(c, &s->done, err));
    e = cudaEventRecord(im->fork, s->compute);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(im->stream, im->fork, 0);
    if (e != cudaSuccess) return gt_nccl_cuda_fail(c, what, e, err);
    if (im->in_group) { /* posted at the group's end; done is recorded after that */
        size_t nin = gt_tensor_nbytes(in);
        ncclResult_t r =
            nin ? ncclAllGather(in->data, out->data, nin, ncclUint8, im->nccl, im->stream)
                : ncclSuccess;
        if (r != ncclSuccess && r != ncclInProgress) return settle_call(c, r, what, err);
        if (im->n_group == im->cap_group) {
            im->cap_group = im->cap_group ? 2 * im->cap_group : 16;
            im->group_done =
                gt_xrealloc(im->group_done, (size_t)im->cap_group * sizeof *im->group_done);
        }
        im->group_done[im->n_group++] = s->done;
        return GT_OK;
    }
    gt_status st = gt_tensor_numel(in) > 0 || gt_tensor_numel(out) > 0
                       ? enqueue(c, kind, in, out, root, err)
                       : GT_OK;
    e = cudaEventRecord(s->done, im->stream);
    if (st == GT_OK && e != cudaSuccess) st = gt_nccl_cuda_fail(c, what, e, err);
    if (st != GT_OK) /* no wait will come: join the comm stream back now (a capture needs it) */
        cudaStreamWaitEvent(s->compute, s->done, 0);
    return st;
}

gt_status gt_comm_nccl_group_begin(gt_comm *c, gt_error *err)
{
    nccl_impl *im = gt_nccl_impl(c);
    if (im->aborted) return gt_nccl_aborted_error(c, "an NCCL group", err);
    GT_CHECK(!im->in_group);
    ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess) return settle_call(c, r, "starting an NCCL group", err);
    im->in_group = true;
    im->n_group = 0;
    return GT_OK;
}

gt_status gt_comm_nccl_group_end(gt_comm *c, gt_error *err)
{
    nccl_impl *im = gt_nccl_impl(c);
    if (!im->in_group) return GT_OK;
    im->in_group = false;
    gt_status st = settle_call(c, ncclGroupEnd(), "an NCCL group of all-gathers", err);
    /* recorded also on failure: a wait (a capture's join) must find them recorded */
    for (int k = 0; k < im->n_group; k++) {
        cudaError_t e = cudaEventRecord(im->group_done[k], im->stream);
        if (st == GT_OK && e != cudaSuccess)
            st = gt_nccl_cuda_fail(c, "an NCCL group of all-gathers", e, err);
    }
    im->n_group = 0;
    return st;
}

gt_status gt_nccl_wait(gt_comm *c, gt_comm_request *req, gt_error *err)
{
    nccl_req *s = req->impl_state;
    cudaError_t e = cudaStreamWaitEvent(s->compute, s->done, 0);
    return e == cudaSuccess ? GT_OK : gt_nccl_cuda_fail(c, gt_coll_kind_name(req->kind), e, err);
}

void gt_nccl_free_request(gt_comm_request *req)
{
    nccl_req *s = req->impl_state;
    if (!s) return;
    if (s->done) give_event(gt_nccl_impl(req->comm), s->done);
    free(s);
    req->impl_state = NULL;
}

/* Over NCCL itself (a real exchange whatever launched the job); synchronous, bounded. */
gt_status gt_nccl_all_gather_u64(gt_comm *c, const uint64_t *in, int64_t count, uint64_t *out,
                                 gt_error *err)
{
    nccl_impl *im = gt_nccl_impl(c);
    const char *what = "all_gather (host words)";
    if (im->aborted) return gt_nccl_aborted_error(c, what, err);
    if (count <= 0) return GT_OK;
    size_t bytes = (size_t)count * sizeof *in;
    char *dev = NULL;
    cudaError_t e = cudaMalloc((void **)&dev, bytes * ((size_t)c->size + 1));
    if (e != cudaSuccess) return gt_nccl_cuda_fail(c, what, e, err);
    gt_status st = GT_OK;
    e = cudaMemcpyAsync(dev, in, bytes, cudaMemcpyHostToDevice, im->stream);
    if (e != cudaSuccess) st = gt_nccl_cuda_fail(c, what, e, err);
    if (st == GT_OK)
        st = settle_call(c, ncclAllGather(dev, dev + bytes, bytes, ncclUint8, im->nccl, im->stream),
                         what, err);
    gt_comm *self[1] = {c};
    if (st == GT_OK) st = gt_nccl_watch(self, 1, NULL, im->stream, err);
    if (st == GT_OK) {
        e = cudaMemcpy(out, dev + bytes, bytes * (size_t)c->size, cudaMemcpyDeviceToHost);
        if (e != cudaSuccess) st = gt_nccl_cuda_fail(c, what, e, err);
    }
    cudaFree(dev);
    return st;
}

void gt_nccl_set_timeout(gt_comm *c, double seconds)
{
    gt_nccl_impl(c)->timeout_s = seconds;
}

bool gt_comm_nccl_aborted(const gt_comm *c)
{
    return gt_comm_is_nccl(c) && gt_nccl_impl((gt_comm *)c)->aborted;
}

void gt_comm_nccl_abort(gt_comm *c, const char *why)
{
    if (gt_comm_is_nccl(c)) gt_nccl_abort(c, why);
}

void gt_comm_nccl_set_stream(gt_comm *c, void *compute_stream)
{
    if (gt_comm_is_nccl(c)) gt_nccl_impl(c)->compute = (cudaStream_t)compute_stream;
}

gt_status gt_comm_nccl_mem_alloc(void **p, size_t bytes, gt_error *err)
{
    *p = NULL;
    if (bytes == 0) return GT_OK;
    ncclResult_t r = ncclMemAlloc(p, bytes);
    if (r == ncclSuccess) return GT_OK;
    *p = NULL;
    return gt_error_set(err, GT_ERR_NOMEM,
                        "ncclMemAlloc of %zu bytes (NCCL-registrable memory): %s", bytes,
                        ncclGetErrorString(r));
}

void gt_comm_nccl_mem_free(void *p)
{
    if (p) ncclMemFree(p);
}

gt_status gt_comm_nccl_window_register(gt_comm *c, void *p, size_t bytes, void **win, gt_error *err)
{
    *win = NULL;
    if (!gt_comm_is_nccl(c))
        return gt_error_set(err, GT_ERR_INVALID,
                            "symmetric window: communicator '%s' is not an NCCL one", c->name);
    const char *what = "registering a symmetric window";
    if (gt_nccl_impl(c)->aborted) return gt_nccl_aborted_error(c, what, err);
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
    ncclWindow_t w = NULL;
    GT_TRY(settle_call(
        c, ncclCommWindowRegister(gt_nccl_impl(c)->nccl, p, bytes, &w, NCCL_WIN_COLL_SYMMETRIC),
        what, err));
    *win = w;
    return GT_OK;
#else
    (void)p, (void)bytes;
    return gt_error_set(err, GT_ERR_UNSUPPORTED,
                        "%s: this build's NCCL is %d.%d; symmetric windows and ncclAlltoAll need "
                        "NCCL 2.28 or later",
                        what, NCCL_MAJOR, NCCL_MINOR);
#endif
}

void gt_comm_nccl_window_deregister(gt_comm *c, void *win)
{
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
    if (!win || !gt_comm_is_nccl(c)) return;
    nccl_impl *im = gt_nccl_impl(c);
    if (im->aborted || !im->nccl) return; /* its memory is left as it is */
    bool timed_out;
    gt_nccl_settle(im->nccl, ncclCommWindowDeregister(im->nccl, (ncclWindow_t)win), im->timeout_s,
                   &timed_out);
#else
    (void)c, (void)win;
#endif
}

void gt_nccl_free_scratch(gt_comm *c, gt_nccl_scratch s)
{
    if (!s.p) return;
    gt_comm_nccl_window_deregister(c, s.win);
    if (gt_nccl_impl(c)->buffers != GT_NCCL_BUFFERS_PLAIN)
        ncclMemFree(s.p);
    else
        cudaFree(s.p);
}

#endif
