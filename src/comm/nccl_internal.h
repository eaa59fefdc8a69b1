/* nccl_internal.h — what the two halves of the NCCL communicator share (private to src/comm):
 * nccl.c (waits, scratch, collectives) and nccl_setup.c (creation, split, destroy). Only with
 * GT_HAVE_NCCL and GT_HAVE_CUDA. */
#ifndef GT_COMM_NCCL_INTERNAL_H
#define GT_COMM_NCCL_INTERNAL_H

#include <cuda_runtime.h>
#include <nccl.h>

#include "graphtrain/gt_comm.h"

#define GT_NCCL_DEFAULT_TIMEOUT 30.0 /* seconds */

/* A scratch buffer and its symmetric window (GT_NCCL_BUFFERS_SYMMETRIC; else NULL). */
typedef struct {
    void *p, *win;
} gt_nccl_scratch;

typedef struct {
    ncclComm_t nccl; /* NULL once aborted */
    int device;
    int world_rank; /* this process's rank in the root communicator (for messages) */
    int *world;     /* [size]: the root communicator's rank of each member */
    char members[96];
    cudaStream_t stream;  /* the communicator's own */
    cudaStream_t compute; /* the one the next collectives are ordered with */
    cudaEvent_t fork;
    cudaEvent_t *free_ev; /* done events not in use */
    int n_free, cap_free;
    gt_nccl_scratch scratch;
    size_t scratch_bytes;
    bool scratch_captured;    /* a CUDA graph uses this scratch: never free it before destroy */
    gt_nccl_buffers buffers;  /* given at gt_comm_nccl_create; splits inherit it */
    gt_nccl_scratch *retired; /* such buffers replaced by a larger one */
    int n_retired;
    double timeout_s;
    bool blocking;
    bool aborted;
    char why[400]; /* why it was aborted */
    /* between gt_comm_nccl_group_begin and _end: the all-gathers posted since, whose done events
     * are recorded once the group is launched */
    bool in_group;
    cudaEvent_t *group_done;
    int n_group, cap_group;
} nccl_impl;

typedef struct {
    cudaEvent_t done;
    cudaStream_t compute;
} nccl_req;

/* The communicator's state. */
nccl_impl *gt_nccl_impl(gt_comm *c);
/* The timeout of its host calls and of gt_comm_nccl_wait_event (the vtable's set_timeout). */
void gt_nccl_set_timeout(gt_comm *c, double seconds);
/* Finishes a non-blocking call that returned r on comm: polls its state while ncclInProgress.
 * *timed_out when timeout_s (> 0) passed first. */
ncclResult_t gt_nccl_settle(ncclComm_t comm, ncclResult_t r, double timeout_s, bool *timed_out);
/* "NCCL communicator 'NAME' (size N, world ranks …)". */
void gt_nccl_describe(gt_comm *c, char *buf, size_t len);
/* Aborts c (its in-flight kernels end; it refuses every later call, citing why). */
void gt_nccl_abort(gt_comm *c, const char *why);
gt_status gt_nccl_aborted_error(gt_comm *c, const char *what, gt_error *err);
gt_status gt_nccl_cuda_fail(gt_comm *c, const char *what, cudaError_t e, gt_error *err);
/* Polls until ev completes (or, ev NULL, stream st is idle), watching the async errors of the NCCL
 * communicators among comms; past the shortest timeout or on an NCCL error it aborts them all and
 * fails naming them. */
gt_status gt_nccl_watch(gt_comm *const *comms, int n, cudaEvent_t ev, cudaStream_t st,
                        gt_error *err);

/* Deregisters the window of a scratch buffer of c (collective), then frees the buffer
 * (ncclMemFree or cudaFree, as it was allocated). */
void gt_nccl_free_scratch(gt_comm *c, gt_nccl_scratch s);

/* The vtable entries defined in nccl.c. */
gt_status gt_nccl_start(gt_comm *c, gt_coll_kind kind, const gt_tensor *in, gt_tensor *out,
                        int root, gt_comm_request *req, gt_error *err);
gt_status gt_nccl_wait(gt_comm *c, gt_comm_request *req, gt_error *err);
void gt_nccl_free_request(gt_comm_request *req);
gt_status gt_nccl_all_gather_u64(gt_comm *c, const uint64_t *in, int64_t count, uint64_t *out,
                                 gt_error *err);

#endif
