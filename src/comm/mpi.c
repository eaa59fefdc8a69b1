/* mpi.c — the MPI communicator for host tensors (Open MPI from Debian).
 *
 * Every collective is posted as one MPI non-blocking operation on bytes (MPI_BYTE), so async
 * start returns at once and gt_comm_wait completes it. Sums never use MPI's reductions, whose
 * order is implementation-defined; instead:
 *   reduce_scatter: MPI_Ialltoall of the n row blocks (in the input dtype, also when the output
 *                   is wider); rank r then sums the n blocks it received, block 0 + block 1 + …
 *                   in rank order (gt_comm_sum_ordered), into the output dtype.
 *   all_reduce:     the flat tensor (N elements) is cut into n chunks of N/n (+1 for the first
 *                   N mod n); MPI_Ialltoallv sends chunk j to rank j, rank j sums its chunk in
 *                   rank order, then MPI_Iallgatherv (in place) spreads the reduced chunks. Each
 *                   element is reduced once, on one rank, in rank order, so every rank gets the
 *                   same bits, equal to the 1-rank sum in rank order. The second phase is posted
 *                   and completed inside gt_comm_wait.
 * Communicators use MPI_ERRORS_RETURN so MPI failures become gt_status naming rank and
 * collective instead of aborting the job.
 *
 * Waits never block inside MPI: gt_comm_wait polls MPI_Test, yielding between tests (never
 * sleeping: see wait_request), until the request completes or the communicator's timeout passes.
 * A peer that died or is stuck in other work then becomes an error naming this rank, the
 * collective and the group (its world ranks) instead of a hang. A timed-out request is abandoned:
 * MPI may still write into its buffers, so its scratch is leaked on purpose and the communicator
 * is marked broken (destroy then skips MPI_Comm_free, which could wait for the dead peer), and
 * the process later skips MPI_Finalize: finalizing progresses the abandoned request, and a late
 * message would land in output buffers their owners have freed by then. */
#include "graphtrain/gt_comm.h"

#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef GT_HAVE_MPI

bool gt_comm_mpi_available(void)
{
    return false;
}

gt_status gt_comm_mpi_world(int *argc, char ***argv, gt_comm **out, gt_error *err)
{
    (void)argc, (void)argv;
    *out = NULL;
    return gt_error_set(err, GT_ERR_UNSUPPORTED,
                        "MPI communicator: this build has no MPI (install libopenmpi-dev and "
                        "reconfigure)");
}

gt_status gt_comm_mpi_finalize(gt_error *err)
{
    (void)err;
    return GT_OK;
}

#else

#include <mpi.h>

#define DEFAULT_TIMEOUT_SECONDS 30.0

typedef struct {
    MPI_Comm comm;
    double timeout_s;   /* <= 0: wait forever */
    bool broken;        /* a wait timed out: a request is abandoned */
    char members[96];   /* "world ranks 0,2" (for messages) */
    MPI_Request *sends; /* point-to-point sends started and not yet completed */
    int n_sends, cap_sends;
} mpi_impl;

typedef struct {
    MPI_Request request;
    void *scratch;        /* reduce_scatter / all_reduce: n received blocks */
    int *counts, *displs; /* all_reduce: per-rank chunk sizes and offsets, in bytes (+recv) */
    int64_t chunk_numel;  /* elements this rank reduces */
} mpi_state;

bool gt_comm_mpi_available(void)
{
    return true;
}

static gt_status mpi_fail(gt_comm *c, const char *what, int rc, gt_error *err)
{
    char msg[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    return gt_error_set(err, GT_ERR_IO, "rank %d: %s on communicator '%s' (size %d) failed: %s",
                        c->rank, what, c->name, c->size, msg);
}

static MPI_Comm comm_of(gt_comm *c)
{
    return ((mpi_impl *)c->impl)->comm;
}

/* Completes *r by polling MPI_Test, never blocking inside MPI, and yielding the core between
 * tests (with more ranks than cores the yield lets the peers it waits for run). It never sleeps:
 * a non-blocking collective moves only inside MPI calls, and where Open MPI's shared-memory
 * transport has no single-copy mechanism (CMA, often refused in containers) each test moves a few
 * fragments. Sleeping up to 1 ms between tests made a 256 MB all-gather take 4.5 s instead of
 * 0.05 s there, and an 8B run's final parameter gather several minutes. Past the communicator's
 * timeout: GT_ERR_IO naming the rank, the collective, the communicator and its members. */
/* a request was abandoned on some communicator: MPI_Finalize is skipped (see the top) */
static bool gt_mpi_abandoned;

static gt_status wait_request(gt_comm *c, MPI_Request *r, const char *what, gt_error *err)
{
    mpi_impl *impl = c->impl;
    double start = gt_now_seconds();
    for (long polls = 0;; polls++) {
        int done = 0;
        int rc = MPI_Test(r, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) return mpi_fail(c, what, rc, err);
        if (done) return GT_OK;
        if (polls < 16) continue;
        sched_yield();
        if (polls % 64) continue; /* the clock, now and then */
        double waited = gt_now_seconds() - start;
        /* once one wait on this communicator has timed out, later waits (the other collectives
         * still in flight, drained on the way out) fail at once instead of each taking a full
         * timeout more (checked after the test: a request that did complete still counts) */
        if (impl->broken)
            return gt_error_set(err, GT_ERR_IO,
                                "rank %d: %s on communicator '%s' (size %d, %s) abandoned: an "
                                "earlier collective on it timed out",
                                c->rank, what, c->name, c->size, impl->members);
        if (impl->timeout_s > 0 && waited > impl->timeout_s) {
            impl->broken = true;
            gt_mpi_abandoned = true;
            return gt_error_set(err, GT_ERR_IO,
                                "rank %d: %s on communicator '%s' (size %d, %s) did not complete "
                                "within %.0f s: a peer rank of this group died or is stuck "
                                "(comm.init_timeout_seconds / train_timeout_seconds)",
                                c->rank, what, c->name, c->size, impl->members, impl->timeout_s);
        }
    }
}

static gt_status to_int(gt_comm *c, gt_coll_kind kind, size_t bytes, int *out, gt_error *err)
{
    if (bytes > (size_t)INT_MAX)
        return gt_error_set(err, GT_ERR_UNSUPPORTED,
                            "rank %d: %s on communicator '%s': block of %zu bytes exceeds the "
                            "MPI count limit (%d)",
                            c->rank, gt_coll_kind_name(kind), c->name, bytes, INT_MAX);
    *out = (int)bytes;
    return GT_OK;
}

static gt_status mpi_start(gt_comm *c, gt_coll_kind kind, const gt_tensor *in, gt_tensor *out,
                           int root, gt_comm_request *req, gt_error *err)
{
    MPI_Comm comm = comm_of(c);
    int n = c->size, rc = MPI_SUCCESS;
    size_t es = gt_dtype_size(in->dtype);
    mpi_state *s = gt_xcalloc(1, sizeof *s);
    req->impl_state = s;
    s->request = MPI_REQUEST_NULL;
    if (kind != GT_COLL_BROADCAST && in->data == out->data && kind != GT_COLL_ALL_REDUCE)
        return gt_error_set(err, GT_ERR_INVALID,
                            "rank %d: %s on communicator '%s': input and output must not alias",
                            c->rank, gt_coll_kind_name(kind), c->name);
    int block = 0;
    switch (kind) {
    case GT_COLL_ALL_GATHER:
        GT_TRY(to_int(c, kind, gt_tensor_nbytes(in), &block, err));
        rc = MPI_Iallgather(in->data, block, MPI_BYTE, out->data, block, MPI_BYTE, comm,
                            &s->request);
        break;
    case GT_COLL_BROADCAST:
        GT_TRY(to_int(c, kind, gt_tensor_nbytes(out), &block, err));
        rc = MPI_Ibcast(out->data, block, MPI_BYTE, root, comm, &s->request);
        break;
    case GT_COLL_GATHER:
        GT_TRY(to_int(c, kind, gt_tensor_nbytes(in), &block, err));
        rc = MPI_Igather(in->data, block, MPI_BYTE, c->rank == root ? out->data : NULL, block,
                         MPI_BYTE, root, comm, &s->request);
        break;
    case GT_COLL_ALL_TO_ALL:
        GT_TRY(to_int(c, kind, gt_tensor_nbytes(in) / (size_t)n, &block, err));
        rc =
            MPI_Ialltoall(in->data, block, MPI_BYTE, out->data, block, MPI_BYTE, comm, &s->request);
        break;
    case GT_COLL_REDUCE_SCATTER:
        /* blocks in the input dtype: out may be wider (f32 for bf16/f16, gt_comm.h) */
        GT_TRY(to_int(c, kind, (size_t)gt_tensor_numel(out) * es, &block, err));
        s->chunk_numel = gt_tensor_numel(out);
        s->scratch = malloc((size_t)block * (size_t)n + 1);
        if (!s->scratch)
            return gt_error_set(err, GT_ERR_NOMEM, "rank %d: reduce_scatter scratch of %zu bytes",
                                c->rank, (size_t)block * (size_t)n);
        rc = MPI_Ialltoall(in->data, block, MPI_BYTE, s->scratch, block, MPI_BYTE, comm,
                           &s->request);
        break;
    case GT_COLL_ALL_REDUCE: {
        int64_t numel = gt_tensor_numel(in);
        /* Count arrays must stay valid until the request completes, so they live in s. */
        s->counts = gt_xmalloc(sizeof(int) * 4 * (size_t)n);
        s->displs = s->counts + n;
        int *recv_counts = s->counts + 2 * n;
        int *recv_displs = s->counts + 3 * n;
        for (int j = 0; j < n; j++) {
            int64_t first, chunk;
            gt_comm_chunk(numel, n, j, &first, &chunk);
            gt_status st = to_int(c, kind, (size_t)chunk * es, &s->counts[j], err);
            if (st == GT_OK) st = to_int(c, kind, (size_t)first * es, &s->displs[j], err);
            if (st != GT_OK) return st;
        }
        int mine = s->counts[c->rank];
        s->chunk_numel = (int64_t)((size_t)mine / es);
        for (int i = 0; i < n; i++) {
            recv_counts[i] = mine;
            recv_displs[i] = i * mine; /* n * mine <= total bytes + n * es: fits (checked above) */
        }
        s->scratch = malloc((size_t)mine * (size_t)n + 1);
        if (!s->scratch)
            return gt_error_set(err, GT_ERR_NOMEM, "rank %d: all_reduce scratch of %zu bytes",
                                c->rank, (size_t)mine * (size_t)n);
        rc = MPI_Ialltoallv(in->data, s->counts, s->displs, MPI_BYTE, s->scratch, recv_counts,
                            recv_displs, MPI_BYTE, comm, &s->request);
        break;
    }
    default:
        GT_CHECK(!"unknown collective");
    }
    if (rc != MPI_SUCCESS) return mpi_fail(c, gt_coll_kind_name(kind), rc, err);
    return GT_OK;
}

static gt_status mpi_wait(gt_comm *c, gt_comm_request *req, gt_error *err)
{
    mpi_state *s = req->impl_state;
    const char *what = gt_coll_kind_name(req->kind);
    gt_status wst = wait_request(c, &s->request, what, err);
    if (wst != GT_OK) {
        if (((mpi_impl *)c->impl)->broken) s->scratch = NULL, s->counts = NULL; /* MPI's now */
        return wst;
    }
    int rc;
    if (req->kind != GT_COLL_REDUCE_SCATTER && req->kind != GT_COLL_ALL_REDUCE) return GT_OK;

    int n = c->size;
    gt_dtype dt = req->in->dtype;
    size_t block = (size_t)s->chunk_numel * gt_dtype_size(dt);
    const void **src = gt_xmalloc(sizeof(void *) * (size_t)n);
    for (int r = 0; r < n; r++)
        src[r] = (const char *)s->scratch + (size_t)r * block;
    char *dst = req->out->data;
    if (req->kind == GT_COLL_ALL_REDUCE) dst += s->displs[c->rank];
    gt_status st = gt_comm_sum_ordered(dt, req->out->dtype, s->chunk_numel,
                                       (const void *const *)src, n, dst, err);
    free(src);
    if (st != GT_OK || req->kind == GT_COLL_REDUCE_SCATTER) return st;

    /* all_reduce phase 2: every rank's reduced chunk to every rank. */
    rc = MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_BYTE, req->out->data, s->counts, s->displs, MPI_BYTE,
                         comm_of(c), &s->request);
    if (rc != MPI_SUCCESS) return mpi_fail(c, what, rc, err);
    gt_status gst = wait_request(c, &s->request, what, err);
    if (gst != GT_OK && ((mpi_impl *)c->impl)->broken) s->counts = NULL; /* MPI's now */
    return gst;
}

static void mpi_free_request(gt_comm_request *req)
{
    mpi_state *s = req->impl_state;
    if (!s) return;
    /* A request abandoned after a failed start: nothing was posted (request is NULL). */
    free(s->scratch);
    free(s->counts);
    free(s);
    req->impl_state = NULL;
}

static gt_status mpi_all_gather_u64(gt_comm *c, const uint64_t *in, int64_t count, uint64_t *out,
                                    gt_error *err)
{
    if (count > INT_MAX / 8)
        return gt_error_set(err, GT_ERR_UNSUPPORTED, "rank %d: all_gather of %lld words", c->rank,
                            (long long)count);
    MPI_Request r = MPI_REQUEST_NULL;
    int rc =
        MPI_Iallgather(in, (int)count, MPI_UINT64_T, out, (int)count, MPI_UINT64_T, comm_of(c), &r);
    if (rc != MPI_SUCCESS) return mpi_fail(c, "all_gather (schedule check)", rc, err);
    return wait_request(c, &r, "all_gather (schedule check)", err);
}

static gt_status wrap_comm(MPI_Comm comm, const char *name, double timeout_s, gt_comm **out,
                           gt_error *err);

static gt_status mpi_split(gt_comm *c, int color, int key, gt_comm **out, gt_error *err)
{
    MPI_Comm sub;
    int rc = MPI_Comm_split(comm_of(c), color, key, &sub);
    if (rc != MPI_SUCCESS) return mpi_fail(c, "split", rc, err);
    char name[64];
    snprintf(name, sizeof name, "%.40s/split(%d)", c->name, color);
    return wrap_comm(sub, name, ((mpi_impl *)c->impl)->timeout_s, out, err);
}

static gt_status mpi_send_start(gt_comm *c, const void *buf, size_t bytes, int peer, int tag,
                                gt_error *err)
{
    mpi_impl *impl = c->impl;
    if (bytes > (size_t)INT_MAX)
        return gt_error_set(err, GT_ERR_UNSUPPORTED,
                            "rank %d: send of %zu bytes on communicator '%s' exceeds the MPI "
                            "count limit",
                            c->rank, bytes, c->name);
    if (impl->n_sends == impl->cap_sends) {
        impl->cap_sends = impl->cap_sends ? 2 * impl->cap_sends : 16;
        impl->sends = gt_xrealloc(impl->sends, (size_t)impl->cap_sends * sizeof *impl->sends);
    }
    MPI_Request *r = &impl->sends[impl->n_sends];
    int rc = MPI_Isend(buf, (int)bytes, MPI_BYTE, peer, tag, impl->comm, r);
    if (rc != MPI_SUCCESS) return mpi_fail(c, "send", rc, err);
    impl->n_sends++;
    return GT_OK;
}

static gt_status mpi_recv(gt_comm *c, void *buf, size_t bytes, int peer, int tag, gt_error *err)
{
    if (bytes > (size_t)INT_MAX)
        return gt_error_set(err, GT_ERR_UNSUPPORTED,
                            "rank %d: recv of %zu bytes on communicator '%s' exceeds the MPI "
                            "count limit",
                            c->rank, bytes, c->name);
    MPI_Request r = MPI_REQUEST_NULL;
    int rc = MPI_Irecv(buf, (int)bytes, MPI_BYTE, peer, tag, comm_of(c), &r);
    if (rc != MPI_SUCCESS) return mpi_fail(c, "recv", rc, err);
    return wait_request(c, &r, "recv", err);
}

static gt_status mpi_send_wait_all(gt_comm *c, gt_error *err)
{
    mpi_impl *impl = c->impl;
    gt_status st = GT_OK;
    for (int i = 0; i < impl->n_sends && st == GT_OK; i++)
        st = wait_request(c, &impl->sends[i], "send", err);
    impl->n_sends = 0;
    return st;
}

static void mpi_destroy(gt_comm *c)
{
    mpi_impl *impl = c->impl;
    free(impl->sends);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && !impl->broken) MPI_Comm_free(&impl->comm);
    free(impl);
    free(c);
}

static void mpi_set_timeout(gt_comm *c, double seconds)
{
    ((mpi_impl *)c->impl)->timeout_s = seconds;
}

static const gt_comm_vtable mpi_vtable = {
    .name = "mpi",
    .start = mpi_start,
    .wait = mpi_wait,
    .free_request = mpi_free_request,
    .split = mpi_split,
    .all_gather_u64 = mpi_all_gather_u64,
    .destroy = mpi_destroy,
    .send_start = mpi_send_start,
    .recv = mpi_recv,
    .send_wait_all = mpi_send_wait_all,
    .set_timeout = mpi_set_timeout,
};

/* "world ranks 0,2,4" (the members of comm in its rank order), cut short with "..." when long. */
static void format_members(MPI_Comm comm, int size, char *buf, size_t cap)
{
    MPI_Group group, world;
    int *mine = gt_xmalloc(sizeof(int) * 2 * (size_t)size), *theirs = mine + size;
    for (int r = 0; r < size; r++)
        mine[r] = r;
    MPI_Comm_group(comm, &group);
    MPI_Comm_group(MPI_COMM_WORLD, &world);
    MPI_Group_translate_ranks(group, size, mine, world, theirs);
    MPI_Group_free(&group);
    MPI_Group_free(&world);
    gt_comm_format_members(theirs, size, buf, cap);
    free(mine);
}

/* Takes ownership of comm. */
static gt_status wrap_comm(MPI_Comm comm, const char *name, double timeout_s, gt_comm **out,
                           gt_error *err)
{
    (void)err;
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    gt_comm *c = gt_xcalloc(1, sizeof *c);
    mpi_impl *impl = gt_xcalloc(1, sizeof *impl);
    impl->comm = comm;
    impl->timeout_s = timeout_s;
    c->vt = &mpi_vtable;
    c->impl = impl;
    MPI_Comm_rank(comm, &c->rank);
    MPI_Comm_size(comm, &c->size);
    snprintf(c->name, sizeof c->name, "%s", name);
    format_members(comm, c->size, impl->members, sizeof impl->members);
    *out = c;
    return GT_OK;
}

gt_status gt_comm_mpi_world(int *argc, char ***argv, gt_comm **out, gt_error *err)
{
    *out = NULL;
    int initialized = 0, provided = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
        /* Only the thread that calls graphtrain's collectives talks to MPI. */
        int rc = MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
        if (rc != MPI_SUCCESS)
            return gt_error_set(err, GT_ERR_IO, "MPI_Init_thread failed (code %d)", rc);
    }
    MPI_Comm world;
    int rc = MPI_Comm_dup(MPI_COMM_WORLD, &world);
    if (rc != MPI_SUCCESS)
        return gt_error_set(err, GT_ERR_IO, "MPI_Comm_dup(MPI_COMM_WORLD) failed (code %d)", rc);
    return wrap_comm(world, "world", DEFAULT_TIMEOUT_SECONDS, out, err);
}

gt_status gt_comm_mpi_finalize(gt_error *err)
{
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (initialized && !finalized && !gt_mpi_abandoned) {
        int rc = MPI_Finalize();
        if (rc != MPI_SUCCESS)
            return gt_error_set(err, GT_ERR_IO, "MPI_Finalize failed (code %d)", rc);
    }
    return GT_OK;
}

#endif
