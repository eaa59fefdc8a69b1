/* nccl_setup.c — creating NCCL communicators (through an MPI bootstrap or a TCP rendezvous),
 * splitting and destroying them (gt_comm.h, "NCCL"; the collectives are in nccl.c).
 *
 * Creation: rank 0 makes the unique id and hands it out (a broadcast over the bootstrap
 * communicator, or tcp_rendezvous.c), then every rank joins with a non-blocking ncclConfig
 * (blocking = 0) and polls the join up to the timeout, so a rank that never comes is an error on
 * the others. Split: the members of the new group come from an exchange of (color, key) over the
 * parent (for messages: their world ranks); the group's first member makes a unique id, a second
 * exchange hands it out, and the group joins as above (see nccl_split for why not ncclCommSplit).
 * Destroy: ncclCommFinalize polled up to the timeout, then ncclCommDestroy (ncclCommAbort when the
 * finalize does not complete). */
#include "graphtrain/gt_comm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(GT_HAVE_NCCL) && defined(GT_HAVE_CUDA)

#include "nccl_internal.h"
#include "tcp_rendezvous.h"

static const gt_comm_vtable nccl_vtable;

/* A gt_comm around an initialised NCCL communicator (taken over; aborted on failure). */
static gt_status wrap(ncclComm_t nc, const char *name, int rank, int size, int world_rank,
                      const int *world, int device, cudaStream_t compute, double timeout_s,
                      bool blocking, gt_nccl_buffers buffers, gt_comm **out, gt_error *err)
{
    gt_comm *c = gt_xcalloc(1, sizeof *c);
    nccl_impl *im = gt_xcalloc(1, sizeof *im);
    c->vt = &nccl_vtable;
    c->impl = im;
    c->rank = rank;
    c->size = size;
    snprintf(c->name, sizeof c->name, "%s", name);
    im->nccl = nc;
    im->device = device;
    im->world_rank = world_rank;
    im->world = gt_xmalloc((size_t)size * sizeof *im->world);
    memcpy(im->world, world, (size_t)size * sizeof *im->world);
    gt_comm_format_members(world, size, im->members, sizeof im->members);
    im->compute = compute;
    im->timeout_s = timeout_s;
    im->blocking = blocking;
    im->buffers = buffers;
    int least = 0, greatest = 0;
    cudaError_t e = cudaDeviceGetStreamPriorityRange(&least, &greatest);
    if (e == cudaSuccess)
        e = cudaStreamCreateWithPriority(&im->stream, cudaStreamNonBlocking, greatest);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&im->fork, cudaEventDisableTiming);
    if (e != cudaSuccess) {
        gt_status st = gt_nccl_cuda_fail(c, "creating its stream", e, err);
        gt_nccl_abort(c, "setup failed");
        c->vt->destroy(c);
        return st;
    }
    *out = c;
    return GT_OK;
}

static ncclConfig_t make_config(bool blocking, gt_nccl_buffers buffers)
{
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = blocking ? 1 : 0;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
    /* symmetric buffers: all-gathers and all-to-alls on the copy engines, no SM taken */
    if (buffers == GT_NCCL_BUFFERS_SYMMETRIC) cfg.CTAPolicy = NCCL_CTA_POLICY_ZERO;
#else
    (void)buffers;
#endif
    return cfg;
}

static bool blocking_requested(void)
{
    const char *b = getenv("GT_NCCL_BLOCKING");
    return b && b[0] == '1';
}

/* Joins the group of `size` ranks that id names, as `rank`: ncclCommInitRankConfig, polled up to
 * timeout_s. world[] gives the members' root ranks (for messages). */
static gt_status join_group(const ncclUniqueId *id, const char *name, int rank, int size,
                            int world_rank, const int *world, int device, cudaStream_t compute,
                            double timeout_s, bool blocking, gt_nccl_buffers buffers, gt_comm **out,
                            gt_error *err)
{
    ncclConfig_t cfg = make_config(blocking, buffers);
    ncclComm_t nc = NULL;
    ncclResult_t r = ncclCommInitRankConfig(&nc, size, *id, rank, &cfg);
    bool timed_out = false;
    /* non-blocking: the join may go on in the background; its state says when it is done */
    if ((r == ncclSuccess || r == ncclInProgress) && nc)
        r = gt_nccl_settle(nc, ncclInProgress, timeout_s, &timed_out);
    if (r == ncclSuccess && !nc) r = ncclInternalError;
    if (r != ncclSuccess || timed_out) {
        const char *last = nc ? ncclGetLastError(nc) : "";
        gt_status st =
            timed_out
                ? gt_error_set(err, GT_ERR_IO,
                               "rank %d: joining NCCL communicator '%s' (size %d) on device %d "
                               "did not complete within %.0f s: a peer rank died, never started, "
                               "or cannot reach this one",
                               world_rank, name, size, device, timeout_s)
                : gt_error_set(err, GT_ERR_IO,
                               "rank %d: joining NCCL communicator '%s' (size %d) on device %d "
                               "failed: %s%s%s",
                               world_rank, name, size, device, ncclGetErrorString(r),
                               last && last[0] ? ": " : "", last ? last : "");
        if (nc) ncclCommAbort(nc);
        return st;
    }
    int got = -1, user_rank = -1;
    ncclResult_t q1 = ncclCommCount(nc, &got), q2 = ncclCommUserRank(nc, &user_rank);
    if (q1 != ncclSuccess || q2 != ncclSuccess || got != size || user_rank != rank) {
        ncclCommAbort(nc);
        return gt_error_set(err, GT_ERR_INTERNAL,
                            "rank %d: NCCL communicator '%s': NCCL reports %d ranks with this one "
                            "at %d (%s / %s), expected %d at %d",
                            world_rank, name, got, user_rank, ncclGetErrorString(q1),
                            ncclGetErrorString(q2), size, rank);
    }
    return wrap(nc, name, rank, size, world_rank, world, device, compute, timeout_s, blocking,
                buffers, out, err);
}

/* Words of an ncclUniqueId in the host exchange, plus one: whether its maker succeeded. */
#define ID_WORDS ((sizeof(ncclUniqueId) + 7) / 8 + 1)

/* Not ncclCommSplit (whose non-blocking form failed with an NCCL internal error on the NCCL of the
 * GPU machines here): the members are computed from an exchange of (color, key) over the parent,
 * the new group's rank 0 makes a unique id, a second exchange hands it to the group, and the group
 * joins with ncclCommInitRankConfig. Both exchanges are collectives over the parent, so every rank
 * takes part whatever happens in other groups. */
static gt_status nccl_split(gt_comm *c, int color, int key, gt_comm **out, gt_error *err)
{
    nccl_impl *im = gt_nccl_impl(c);
    if (im->aborted) return gt_nccl_aborted_error(c, "split", err);
    int n = c->size;
    /* the new group's members in (key, parent rank) order */
    uint64_t mine[2] = {(uint64_t)color, (uint64_t)(int64_t)key};
    uint64_t *all = gt_xmalloc(2 * (size_t)n * sizeof *all);
    uint64_t *ids = gt_xmalloc(ID_WORDS * (size_t)n * sizeof *ids), my_id[ID_WORDS] = {0};
    int *idx = gt_xmalloc(2 * (size_t)n * sizeof *idx), *world = idx + n;
    gt_status st = gt_nccl_all_gather_u64(c, mine, 2, all, err);
    int m = 0, rank = -1;
    for (int q = 0; st == GT_OK && q < n; q++) {
        if (all[2 * q] != (uint64_t)color) continue;
        int64_t kq = (int64_t)all[2 * q + 1];
        int at = m++;
        while (at > 0 && (int64_t)all[2 * idx[at - 1] + 1] > kq) {
            idx[at] = idx[at - 1];
            at--;
        }
        idx[at] = q;
    }
    for (int j = 0; j < m; j++) {
        world[j] = im->world[idx[j]];
        if (idx[j] == c->rank) rank = j;
    }
    char name[64];
    snprintf(name, sizeof name, "%.40s/split(%d)", c->name, color);
    gt_error id_err = {0};
    if (st == GT_OK && rank == 0) { /* this rank leads its group: it makes the id */
        ncclUniqueId id;
        ncclResult_t r = ncclGetUniqueId(&id);
        if (r == ncclSuccess) {
            memcpy(my_id + 1, &id, sizeof id);
            my_id[0] = 1;
        } else {
            gt_error_set(&id_err, GT_ERR_IO, "rank %d: split of '%s': ncclGetUniqueId: %s",
                         im->world_rank, c->name, ncclGetErrorString(r));
        }
    }
    if (st == GT_OK) st = gt_nccl_all_gather_u64(c, my_id, ID_WORDS, ids, err);
    if (st == GT_OK) {
        const uint64_t *leader = ids + ID_WORDS * (size_t)idx[0];
        if (!leader[0]) {
            st = id_err.code ? id_err.code : GT_ERR_IO;
            if (id_err.code)
                *err = id_err;
            else
                gt_error_set(err, GT_ERR_IO,
                             "rank %d: split of '%s': rank %d of the group could not make an NCCL "
                             "id",
                             im->world_rank, c->name, world[0]);
        } else {
            ncclUniqueId id;
            memcpy(&id, leader + 1, sizeof id);
            st = join_group(&id, name, rank, m, im->world_rank, world, im->device, im->compute,
                            im->timeout_s, im->blocking, im->buffers, out, err);
        }
    }
    free(all);
    free(ids);
    free(idx);
    return st;
}

static void nccl_destroy(gt_comm *c)
{
    nccl_impl *im = gt_nccl_impl(c);
    if (!im->aborted && im->nccl) {
        /* windows first: deregistering is a collective over the live communicator */
        gt_comm_nccl_window_deregister(c, im->scratch.win);
        im->scratch.win = NULL;
        for (int k = 0; k < im->n_retired; k++) {
            gt_comm_nccl_window_deregister(c, im->retired[k].win);
            im->retired[k].win = NULL;
        }
        /* flush (bounded), then free; a peer that never finalises makes it an abort */
        bool timed_out = false;
        ncclResult_t r =
            gt_nccl_settle(im->nccl, ncclCommFinalize(im->nccl), im->timeout_s, &timed_out);
        if (r == ncclSuccess && !timed_out)
            ncclCommDestroy(im->nccl);
        else
            ncclCommAbort(im->nccl);
        im->nccl = NULL;
    }
    if (im->stream) {
        gt_comm *self[1] = {c};
        gt_error ignored = {0};
        if (gt_nccl_watch(self, 1, NULL, im->stream, &ignored) == GT_OK) {
            gt_nccl_free_scratch(c, im->scratch); /* windows: deregistered above */
            for (int k = 0; k < im->n_retired; k++)
                gt_nccl_free_scratch(c, im->retired[k]);
        } /* else leaked: the device may still write them */
        cudaStreamDestroy(im->stream);
    }
    free(im->retired);
    if (im->fork) cudaEventDestroy(im->fork);
    for (int k = 0; k < im->n_free; k++)
        cudaEventDestroy(im->free_ev[k]);
    free(im->free_ev);
    free(im->group_done);
    free(im->world);
    free(im);
    free(c);
}

static const gt_comm_vtable nccl_vtable = {
    .name = "nccl",
    .start = gt_nccl_start,
    .wait = gt_nccl_wait,
    .free_request = gt_nccl_free_request,
    .split = nccl_split,
    .all_gather_u64 = gt_nccl_all_gather_u64,
    .destroy = nccl_destroy,
    .set_timeout = gt_nccl_set_timeout,
};

/* The bytes rank 0 hands out: whether it made an id, and the id. */
typedef struct {
    unsigned char ok;
    ncclUniqueId id;
} id_blob;

static gt_status make_id(id_blob *b, gt_error *err)
{
    memset(b, 0, sizeof *b);
    ncclResult_t r = ncclGetUniqueId(&b->id);
    if (r != ncclSuccess)
        return gt_error_set(err, GT_ERR_IO, "rank 0: ncclGetUniqueId failed: %s",
                            ncclGetErrorString(r));
    b->ok = 1;
    return GT_OK;
}

/* Joins the world communicator of `size` ranks as `rank` on device, through b's id. */
static gt_status join(const id_blob *b, int rank, int size, int device, void *compute,
                      double timeout_s, gt_nccl_buffers buffers, gt_comm **out, gt_error *err)
{
    if (!b->ok)
        return gt_error_set(err, GT_ERR_IO,
                            "rank %d: NCCL communicator: rank 0 could not make an NCCL id", rank);
    int *world = gt_xmalloc((size_t)size * sizeof *world);
    for (int q = 0; q < size; q++)
        world[q] = q;
    /* symmetric windows on a non-blocking communicator: NCCL 2.28.3 refused to register them
     * ("Attempt to use communicator before the previous operation returned ncclSuccess") until
     * gt_nccl_settle also polled after a call that returned ncclSuccess (NVIDIA/nccl#1734) */
    bool blocking = blocking_requested();
    gt_status st = join_group(&b->id, "world", rank, size, rank, world, device,
                              (cudaStream_t)compute, timeout_s, blocking, buffers, out, err);
    free(world);
    return st;
}

/* NVLink multicast off unless the user chose otherwise, before NCCL reads its environment. */
static gt_status prepare(int device, int rank, gt_error *err)
{
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess)
        return gt_error_set(err, GT_ERR_UNSUPPORTED, "rank %d: NCCL communicator: device %d: %s",
                            rank, device, cudaGetErrorString(e));
    return GT_OK;
}

gt_status gt_comm_nccl_create(gt_comm *bootstrap, int device, void *compute_stream,
                              double timeout_seconds, gt_nccl_buffers buffers, gt_comm **out,
                              gt_error *err)
{
    *out = NULL;
    if (!bootstrap)
        return gt_error_set(err, GT_ERR_INVALID, "NCCL communicator: no bootstrap communicator");
    int rank = gt_comm_rank(bootstrap), size = gt_comm_size(bootstrap);
    GT_TRY(prepare(device, rank, err));
    id_blob b;
    memset(&b, 0, sizeof b);
    gt_error id_err = {0};
    gt_status id_st = rank == 0 ? make_id(&b, &id_err) : GT_OK;
    /* the id (or its absence) goes out either way, so no rank waits for a broadcast that never
     * comes */
    int64_t shape[1] = {(int64_t)sizeof b};
    gt_tensor t;
    gt_tensor_wrap(&t, GT_BOOL, 1, shape, &b);
    gt_status st = gt_comm_broadcast(bootstrap, &t, 0, err);
    if (st != GT_OK) return gt_error_wrap(err, "NCCL communicator: broadcasting the NCCL id");
    if (id_st != GT_OK) {
        *err = id_err;
        return id_st;
    }
    double timeout = timeout_seconds > 0 ? timeout_seconds : GT_NCCL_DEFAULT_TIMEOUT;
    return join(&b, rank, size, device, compute_stream, timeout, buffers, out, err);
}

static gt_status env_int(const char *name, bool required, int *out, gt_error *err)
{
    const char *v = getenv(name);
    if (!v || !v[0]) {
        if (!required) return GT_OK;
        return gt_error_set(err, GT_ERR_INVALID,
                            "NCCL communicator over TCP: environment variable %s is not set "
                            "(launchers such as torchrun set MASTER_ADDR, MASTER_PORT, RANK, "
                            "WORLD_SIZE)",
                            name);
    }
    char *end = NULL;
    long x = strtol(v, &end, 10);
    if (*end || x < 0 || x > 1000000000)
        return gt_error_set(err, GT_ERR_INVALID,
                            "NCCL communicator over TCP: %s='%s' is not a non-negative integer",
                            name, v);
    *out = (int)x;
    return GT_OK;
}

gt_status gt_comm_nccl_create_tcp(int device, void *compute_stream, double timeout_seconds,
                                  gt_comm **out, gt_error *err)
{
    *out = NULL;
    double timeout = timeout_seconds > 0 ? timeout_seconds : GT_NCCL_DEFAULT_TIMEOUT;
    const char *addr = getenv("MASTER_ADDR");
    if (!addr || !addr[0])
        return gt_error_set(err, GT_ERR_INVALID,
                            "NCCL communicator over TCP: environment variable MASTER_ADDR is not "
                            "set (launchers such as torchrun set MASTER_ADDR, MASTER_PORT, RANK, "
                            "WORLD_SIZE)");
    int port = 0, rank = 0, size = 0, local = 0;
    GT_TRY(env_int("MASTER_PORT", true, &port, err));
    GT_TRY(env_int("RANK", true, &rank, err));
    GT_TRY(env_int("WORLD_SIZE", true, &size, err));
    GT_TRY(env_int("LOCAL_RANK", false, &local, err));
    if (device < 0) device = local;
    GT_TRY(prepare(device, rank, err));
    id_blob b;
    memset(&b, 0, sizeof b);
    gt_error id_err = {0};
    gt_status id_st = rank == 0 ? make_id(&b, &id_err) : GT_OK;
    gt_status st = gt_tcp_rendezvous(addr, port, rank, size, &b, sizeof b, timeout, err);
    if (st != GT_OK) return gt_error_wrap(err, "NCCL communicator over TCP");
    if (id_st != GT_OK) {
        *err = id_err;
        return id_st;
    }
    return join(&b, rank, size, device, compute_stream, timeout, GT_NCCL_BUFFERS_PLAIN, out, err);
}

#else
typedef int gt_nccl_setup_unused; /* ISO C: a translation unit declares something */
#endif
