/* gt_comm.h — communicators: collectives on host tensors over a group of ranks (DESIGN.md §5).
 *
 * One interface, several implementations: MPI for CPU tensors (src/comm/mpi.c), a fake one for
 * compile-only runs and unit tests (src/comm/fake.c), NCCL for CUDA device tensors
 * (src/comm/nccl.c, below). A communicator is one group of ranks: the world, or a sub-group made
 * by gt_comm_split (one per mesh dim).
 *
 * Every collective has an async form (`*_start` returns a request, gt_comm_wait completes and
 * frees it) and a blocking form (start + wait). Tensors are contiguous, row-major, in host memory
 * (device memory for NCCL).
 *
 * Determinism: sums are computed in a fixed order, so every rank gets identical bits and the
 * result equals the 1-rank sum x_0 + x_1 + … + x_{n-1} accumulated left to right in rank order
 * (in f32 for f32/bf16/f16, in 64-bit integers for i32/i64; a bf16/f16 sum is rounded to its
 * dtype once at the end, or kept in f32 by a widening reduce_scatter). MPI_Allreduce's order is
 * implementation-defined, so the MPI communicator does not use it: all_reduce is a
 * reduce_scatter (an all-to-all of chunks, each rank summing its chunk in rank order) followed by
 * an all_gather of the reduced chunks. */
#ifndef GRAPHTRAIN_GT_COMM_H
#define GRAPHTRAIN_GT_COMM_H

#include "graphtrain/gt_core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    GT_COLL_ALL_REDUCE = 0, /* out = sum over ranks of in; same shape */
    GT_COLL_ALL_GATHER,     /* in [k, …] → out [n·k, …]: rank r's block at rows r·k.. */
    GT_COLL_REDUCE_SCATTER, /* in [n·k, …] → out [k, …]: rank r gets rows r·k.. of the sum */
    GT_COLL_BROADCAST,      /* buf on root copied to buf on every rank */
    GT_COLL_ALL_TO_ALL, /* in [n·k, …] → out [n·k, …]: block j of rank i → block i of rank j */
    GT_COLL_GATHER, /* in [k, …] → out [n·k, …] on root only (host communicators) */
    GT_COLL_SEND,   /* in to one peer rank (pipeline point-to-point) */
    GT_COLL_RECV,   /* out from one peer rank */
    GT_COLL_KIND_COUNT
} gt_coll_kind;

const char *gt_coll_kind_name(gt_coll_kind kind); /* "all_reduce", … */

typedef struct gt_comm gt_comm;
typedef struct gt_comm_request gt_comm_request;

/* ---------------------------------------------------------------- implementation interface */

/* What an implementation provides. Shapes and dtypes are checked by the generic layer
 * (src/comm/comm.c) before these are called, so implementations only move and sum bytes.
 * The generic layer allocates the request (comm, kind, in, out, root filled in); start may hang
 * its own state on req->impl_state. */
typedef struct {
    const char *name; /* "mpi", "fake", "nccl" */
    gt_status (*start)(gt_comm *c, gt_coll_kind kind, const gt_tensor *in, gt_tensor *out, int root,
                       gt_comm_request *req, gt_error *err);
    gt_status (*wait)(gt_comm *c, gt_comm_request *req, gt_error *err);
    void (*free_request)(gt_comm_request *req); /* releases impl_state; may be NULL */
    gt_status (*split)(gt_comm *c, int color, int key, gt_comm **out, gt_error *err);
    /* All ranks contribute `count` u64 words; out holds size·count words in rank order. Used by
     * the schedule check, so it must be a real exchange even where collectives are not. */
    gt_status (*all_gather_u64)(gt_comm *c, const uint64_t *in, int64_t count, uint64_t *out,
                                gt_error *err);
    void (*destroy)(gt_comm *c);
    /* Point-to-point (pipeline parallelism); NULL where the implementation has none. send_start
     * does not block: buf must stay valid until send_wait_all, which completes every send
     * started on c. recv blocks until the matching send (same peer and tag) arrives. */
    gt_status (*send_start)(gt_comm *c, const void *buf, size_t bytes, int peer, int tag,
                            gt_error *err);
    gt_status (*recv)(gt_comm *c, void *buf, size_t bytes, int peer, int tag, gt_error *err);
    gt_status (*send_wait_all)(gt_comm *c, gt_error *err);
    /* How long a wait may take (seconds; <= 0: forever); NULL where nothing waits (fake). */
    void (*set_timeout)(gt_comm *c, double seconds);
} gt_comm_vtable;

struct gt_comm {
    const gt_comm_vtable *vt;
    int rank, size;
    char name[64]; /* "world", "world/split(color=1)": used in error messages */
    void *impl;
};

struct gt_comm_request {
    gt_comm *comm;
    gt_coll_kind kind;
    const gt_tensor *in;
    gt_tensor *out;
    int root;
    void *impl_state;
};

/* ---------------------------------------------------------------- construction */

/* A fake communicator of `size` ranks seen from `rank`. With size 1 every collective is the
 * identity (a copy); with size > 1 collectives only check shapes and leave out untouched, for
 * compile-only runs of a mesh with no peers. */
gt_status gt_comm_fake_create(int size, int rank, gt_comm **out, gt_error *err);

/* True when this build has MPI (GT_HAVE_MPI). */
bool gt_comm_mpi_available(void);
/* Initialises MPI if not yet initialised (argc/argv may be NULL) and returns a communicator over
 * MPI_COMM_WORLD (duplicated, errors returned rather than aborting). GT_ERR_UNSUPPORTED without
 * MPI. */
gt_status gt_comm_mpi_world(int *argc, char ***argv, gt_comm **out, gt_error *err);
/* Finalises MPI if this process initialised it and it is not finalised yet. Destroy every
 * communicator first. */
gt_status gt_comm_mpi_finalize(gt_error *err);

/* A host communicator over TCP sockets (src/comm/tcp.c), for launchers without MPI (torchrun,
 * Slurm): reads RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT from the environment; rank 0
 * listens on MASTER_PORT and tells every rank the others' addresses, and the ranks connect into a
 * full mesh. Collective over every rank of the job. Setup is bounded by timeout_seconds (<= 0:
 * 30 s): a missing or bad variable, or a rank that never connects, is an error naming it. Its
 * collectives give the MPI communicator's bits (rank-order sums); start performs the whole
 * collective and wait does nothing; a collective fails when no byte moves for timeout_seconds
 * (<= 0: never) or a peer closes its connection, naming that rank. Named "world"; split
 * communicators share its sockets. It has point-to-point (below), on the same streams. */
gt_status gt_comm_tcp_world(double timeout_seconds, gt_comm **out, gt_error *err);

/* ---------------------------------------------------------------- NCCL (device tensors)
 *
 * The NCCL communicator (src/comm/nccl.c) runs the same collectives on DEVICE memory: the tensors'
 * data are device pointers of the communicator's device. Every collective is asynchronous on the
 * device and never blocks the host: start records an event on the compute stream, makes the
 * communicator's own stream wait for it and queues the NCCL work there; gt_comm_wait makes the
 * compute stream wait for an event recorded after that work (stream order only). So compute
 * queued between a start and its wait overlaps the transfer, and a start/wait pair issued while
 * the compute stream is being captured becomes part of the CUDA graph.
 *
 * Determinism as above: all_gather, broadcast and all_to_all move bytes; all_reduce and
 * reduce_scatter do not use NCCL's reductions: the chunks travel by an all-to-all (grouped
 * ncclSend/ncclRecv into a scratch buffer), a kernel sums the n received chunks in rank order
 * (f32 accumulation for bf16/f16), and all_reduce then all-gathers the reduced chunks. A widening
 * reduce_scatter's chunks travel (and sit in the scratch) in bf16/f16; the kernel writes their
 * f32 sum. Every rank gets the bits the MPI communicator gives on the same inputs.
 *
 * Scratch: one device buffer per communicator, grown (outside a capture only) to the largest
 * reduction seen; the first, uncaptured run of a step sizes it, and a reduction that would need
 * more during a capture fails naming the sizes. Ops on one communicator run in order on its stream,
 * so they share the scratch safely; a buffer a captured CUDA graph uses is kept (not freed when a
 * later, larger reduction grows the scratch) until the communicator is destroyed.
 *
 * Errors and hangs: the communicator is non-blocking (NCCL config blocking = 0); every host call
 * into NCCL is polled with ncclCommGetAsyncError up to the communicator's timeout. A host wait for
 * device work that uses collectives goes through gt_comm_nccl_wait_event, which polls the event
 * and the communicators' async errors: past the timeout, or on an NCCL error, it aborts the
 * communicators (so the stuck kernels end) and fails naming this rank, each communicator and its
 * world ranks. An aborted communicator fails every later call naming why. NCCL_NVLS_ENABLE=0 is
 * set in the process environment when unset (NVLink multicast stays off). GT_NCCL_BLOCKING=1 in
 * the environment makes new communicators blocking (diagnosis only: host calls then cannot time
 * out). */

/* True when this build has NCCL (GT_HAVE_NCCL; requires CUDA). */
bool gt_comm_nccl_available(void);
/* True when c is an NCCL communicator (false for NULL). */
bool gt_comm_is_nccl(const gt_comm *c);

/* Where the device buffers of an NCCL communicator's collectives live, given when it is created
 * (--comm.nccl_buffers; communicators split from it inherit it).
 *
 * PLAIN: cudaMalloc.
 *
 * REGISTRABLE: ncclMemAlloc (cuMem-backed), which NCCL registers when a captured CUDA graph passes
 * it to its collectives at the same offset on every rank (graphtrain's arenas: every rank runs the
 * same plan), for zero-copy transfers between the GPUs of a host.
 *
 * SYMMETRIC: the same memory (its scratch too), registered as symmetric windows
 * (gt_comm_nccl_window_register; NCCL 2.28 or later); the exchanges of reduce_scatter and
 * all_to_all are posted as ncclAlltoAll, and the communicator takes NCCL's zero-CTA policy: its
 * all-gathers and all-to-alls run on the copy engines, leaving the SMs to compute. (NCCL 2.28.3
 * refused to register windows on a non-blocking communicator while a call that had returned
 * ncclSuccess was still in progress; gt_nccl_settle waits for that, so these communicators are
 * non-blocking like the others, their set-up bounded by the timeout.) */
typedef enum {
    GT_NCCL_BUFFERS_PLAIN = 0,
    GT_NCCL_BUFFERS_REGISTRABLE,
    GT_NCCL_BUFFERS_SYMMETRIC
} gt_nccl_buffers;

/* GT_OK when this build and the NCCL library it loaded support `buffers`; else GT_ERR_UNSUPPORTED
 * naming both versions (SYMMETRIC needs NCCL 2.28). */
gt_status gt_comm_nccl_check_buffers(gt_nccl_buffers buffers, gt_error *err);

/* An NCCL communicator over the ranks of `bootstrap` (a host communicator, normally the MPI world:
 * same rank and size): rank 0 makes the unique id and broadcasts it through bootstrap, then every
 * rank joins on CUDA device `device` (which becomes the calling thread's current device).
 * compute_stream is the cudaStream_t (as void *) whose work the collectives are ordered with; NULL
 * is the legacy default stream; gt_comm_nccl_set_stream changes it. Collective over bootstrap. It
 * is named "world" in messages; its members are the bootstrap's ranks ("world ranks 0,1,…").
 * Joining is bounded by timeout_seconds (<= 0: the default 30 s; a rank that never joins is an
 * error naming the communicator), which also becomes the communicator's timeout
 * (gt_comm_set_timeout). `buffers`: above. */
gt_status gt_comm_nccl_create(gt_comm *bootstrap, int device, void *compute_stream,
                              double timeout_seconds, gt_nccl_buffers buffers, gt_comm **out,
                              gt_error *err);
/* The same without MPI, for launchers such as torchrun: reads MASTER_ADDR, MASTER_PORT, RANK and
 * WORLD_SIZE from the environment (and LOCAL_RANK as the device when device < 0; 0 when unset);
 * rank 0 listens on MASTER_PORT and sends the id to each other rank over TCP. Every step is bounded
 * by timeout_seconds (<= 0: the default 30 s): a missing variable, a rank that never connects or a
 * rank 0 that never answers is an error naming it, not a hang. */
gt_status gt_comm_nccl_create_tcp(int device, void *compute_stream, double timeout_seconds,
                                  gt_comm **out, gt_error *err);
/* True when c is an NCCL communicator that was aborted (a timeout or an NCCL error): its
 * device work may include kernels that were captured in a CUDA graph before the abort and that a
 * device synchronisation would wait for, so a caller should leave the device as it is and exit. */
bool gt_comm_nccl_aborted(const gt_comm *c);
/* Aborts c (an NCCL communicator; a no-op on others): its in-flight kernels end and every later
 * call fails citing `why`. For a rank that fails outside a device wait (a host collective timed
 * out) while device collectives may still wait for a peer. */
void gt_comm_nccl_abort(gt_comm *c, const char *why);
/* The compute stream (a cudaStream_t, as void *) that c's next collectives are ordered with (a
 * request keeps the stream of its start). A no-op on other communicators. */
void gt_comm_nccl_set_stream(gt_comm *c, void *compute_stream);
/* An NCCL group on c (ncclGroupStart .. ncclGroupEnd): the all-gathers started on c in between
 * (only all-gathers) are launched together at _end, as one NCCL operation, each still its own
 * request; their completion events are recorded after the launch, so a wait orders after the whole
 * group. _end without a group is a no-op; on an error it still closes the group. */
gt_status gt_comm_nccl_group_begin(gt_comm *c, gt_error *err);
gt_status gt_comm_nccl_group_end(gt_comm *c, gt_error *err);
/* Device memory NCCL can register (ncclMemAlloc). Free with gt_comm_nccl_mem_free. Builds without
 * NCCL: GT_ERR_UNSUPPORTED. */
gt_status gt_comm_nccl_mem_alloc(void **p, size_t bytes, gt_error *err);
void gt_comm_nccl_mem_free(void *p);
/* Registers [p, p + bytes) of gt_comm_nccl_mem_alloc memory as a symmetric window of c: a
 * collective over c (every rank, same order, the same bytes at its own p). *win is the handle for
 * gt_comm_nccl_window_deregister (also collective). GT_ERR_UNSUPPORTED without NCCL 2.28. */
gt_status gt_comm_nccl_window_register(gt_comm *c, void *p, size_t bytes, void **win,
                                       gt_error *err);
void gt_comm_nccl_window_deregister(gt_comm *c, void *win);
/* Waits on the host until `event` (a cudaEvent_t recorded after device work that uses the NCCL
 * communicators among comms[0 .. n); other entries and NULL are ignored) has completed, polling
 * it and the communicators' async errors. Past the shortest of their timeouts, or on an NCCL error,
 * it aborts those communicators and returns GT_ERR_IO naming this rank, each communicator and its
 * world ranks ("a peer rank died or is stuck"). */
gt_status gt_comm_nccl_wait_event(gt_comm *const *comms, int n, void *event, gt_error *err);

/* Sub-groups: ranks with the same color form one communicator, ordered by (key, parent rank).
 * Collective over c: every rank must call it. */
gt_status gt_comm_split(gt_comm *c, int color, int key, gt_comm **out, gt_error *err);
void gt_comm_destroy(gt_comm *c);
/* How long a collective, point-to-point wait or (NCCL) host call on c may take (seconds; <= 0:
 * forever; default 30): past it the call fails naming this rank, the collective and the group's
 * world ranks, so a dead or stuck peer stops the job instead of hanging it. Communicators split
 * from c afterwards inherit it; TCP communicators split from one world share it. Nothing on a
 * fake communicator. The trainer sets comm.init_timeout_seconds for setup and step 1, then
 * comm.train_timeout_seconds. */
void gt_comm_set_timeout(gt_comm *c, double seconds);

int gt_comm_rank(const gt_comm *c);
int gt_comm_size(const gt_comm *c);

/* ---------------------------------------------------------------- collectives */

/* Async: start checks shapes and dtypes (in and out must have the same dtype, except that
 * reduce_scatter may widen, below; bf16/f16 sums accumulate in f32), posts the transfer and
 * returns a request; in must stay unchanged and out untouched until gt_comm_wait returns.
 * gt_comm_wait completes the collective and frees req (also on error). Errors name the rank, the
 * communicator and the collective.
 *
 * Widening reduce_scatter: in bf16 or f16, out f32. The blocks travel in the input dtype (half
 * the bytes of an f32 scatter) and the receiver sums them widened, in f32 in rank order, and
 * stores the f32 sum unrounded. Widening is exact, so the result is bitwise the f32
 * reduce_scatter of the inputs widened on the host: FSDP's bf16 gradients need no cast to f32
 * before their reduce-scatter (the reduce_scatter_narrow pass). */
gt_status gt_comm_all_reduce_start(gt_comm *c, const gt_tensor *in, gt_tensor *out,
                                   gt_comm_request **req, gt_error *err);
gt_status gt_comm_all_gather_start(gt_comm *c, const gt_tensor *in, gt_tensor *out,
                                   gt_comm_request **req, gt_error *err);
gt_status gt_comm_reduce_scatter_start(gt_comm *c, const gt_tensor *in, gt_tensor *out,
                                       gt_comm_request **req, gt_error *err);
/* In place: buf is read on root and written on every other rank. */
gt_status gt_comm_broadcast_start(gt_comm *c, gt_tensor *buf, int root, gt_comm_request **req,
                                  gt_error *err);
gt_status gt_comm_all_to_all_start(gt_comm *c, const gt_tensor *in, gt_tensor *out,
                                   gt_comm_request **req, gt_error *err);
/* All-gather's blocks on root alone: root's out gets rank r's block at rows r·k..; the other ranks
 * only send, and their out is neither read nor written (its shape is checked; it may have no
 * storage). MPI, TCP and fake communicators; NCCL refuses it. */
gt_status gt_comm_gather_start(gt_comm *c, const gt_tensor *in, gt_tensor *out, int root,
                               gt_comm_request **req, gt_error *err);
gt_status gt_comm_wait(gt_comm_request *req, gt_error *err);

/* Point-to-point between two ranks of c (pipeline parallelism): t's bytes to rank peer under tag
 * (>= 0, < 32768), without blocking (t must stay valid until gt_comm_send_wait_all); t's bytes
 * from rank peer under tag, blocking. Messages of one peer and tag arrive in the order sent;
 * other tags may be received in any order. The MPI and TCP communicators have it (TCP: the sends
 * progress whenever the rank waits on any communicator over the same sockets, src/comm/tcp_p2p.c);
 * NCCL and fake do not yet. Errors: a peer out of range or this rank, a communicator with no
 * point-to-point, naming the communicator; a wait past the communicator's timeout, naming the
 * peer. */
gt_status gt_comm_send_start(gt_comm *c, const gt_tensor *t, int peer, int tag, gt_error *err);
gt_status gt_comm_recv(gt_comm *c, gt_tensor *t, int peer, int tag, gt_error *err);
gt_status gt_comm_send_wait_all(gt_comm *c, gt_error *err);

/* Blocking forms: start + wait. */
gt_status gt_comm_all_reduce(gt_comm *c, const gt_tensor *in, gt_tensor *out, gt_error *err);
gt_status gt_comm_all_gather(gt_comm *c, const gt_tensor *in, gt_tensor *out, gt_error *err);
gt_status gt_comm_reduce_scatter(gt_comm *c, const gt_tensor *in, gt_tensor *out, gt_error *err);
gt_status gt_comm_broadcast(gt_comm *c, gt_tensor *buf, int root, gt_error *err);
gt_status gt_comm_all_to_all(gt_comm *c, const gt_tensor *in, gt_tensor *out, gt_error *err);
gt_status gt_comm_gather(gt_comm *c, const gt_tensor *in, gt_tensor *out, int root, gt_error *err);

/* ---------------------------------------------------------------- schedule check (safety) */

/* One collective of a rank's planned schedule. group names the communicator (e.g. a hash of the
 * mesh dim names); bytes is the payload each rank contributes; place is 0, or a hash of where its
 * buffers lie when every rank's must lie at the same offsets (NCCL symmetric windows). */
typedef struct {
    gt_coll_kind kind;
    uint64_t group;
    uint64_t bytes;
    uint64_t place;
} gt_comm_sched_entry;

/* 64-bit hash of entry `index` (kind, group, bytes, place, index). */
uint64_t gt_comm_sched_entry_hash(const gt_comm_sched_entry *e, int64_t index);

/* Collective over c. Every rank hashes its schedule; ranks exchange (count, hash) and, when they
 * differ, the per-entry hashes of the common prefix. On a mismatch every rank returns
 * GT_ERR_INVALID naming the first differing collective index and the ranks that disagree — the
 * number of exchanges never depends on the schedules, so a mismatch cannot hang. */
gt_status gt_comm_check_schedule(gt_comm *c, const gt_comm_sched_entry *entries, int64_t count,
                                 gt_error *err);

/* For implementations: sums n_src equal-length buffers of `numel` elements of dtype dt into dst
 * of dtype out_dt, src[0] + src[1] + … in that order (f32 accumulation for float types). out_dt
 * is dt, or f32 for bf16/f16 blocks (the widening reduce_scatter: the f32 sum, not rounded back).
 * dst may alias src[0] when out_dt == dt. */
gt_status gt_comm_sum_ordered(gt_dtype dt, gt_dtype out_dt, int64_t numel, const void *const *src,
                              int n_src, void *dst, gt_error *err);
/* For implementations of that sum: GT_OK when blocks of dt can be summed into out_dt (out_dt is
 * dt, or f32 for bf16/f16 blocks; *widen says which), else GT_ERR_UNSUPPORTED naming both. */
gt_status gt_comm_sum_check_dtypes(gt_dtype dt, gt_dtype out_dt, bool *widen, gt_error *err);
/* The result of a collective over one rank (gather, scatter, sum and all_to_all are the
 * identity there): out = in (memmove; nothing when they share a buffer), or in widened to f32 for
 * a widening reduce_scatter (the one-block ordered sum). in and out have equal element counts. */
gt_status gt_comm_one_rank(const gt_tensor *in, gt_tensor *out, gt_error *err);
/* For implementations: "world ranks 0,2,4" (world[i] = the world rank of comm rank i), cut
 * short with "..." when it does not fit, for error messages. */
void gt_comm_format_members(const int *world, int size, char *buf, size_t cap);
/* For implementations: all_reduce's chunk j of n over numel elements — numel / n elements, one
 * more for j < numel % n — as *start and *count (elements). */
void gt_comm_chunk(int64_t numel, int n, int j, int64_t *start, int64_t *count);

#ifdef __cplusplus
}
#endif
#endif
