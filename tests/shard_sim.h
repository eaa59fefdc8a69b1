/* shard_sim.h — simulating the ranks of one mesh dim in one process, for tests of parallelized
 * graphs: a communicator whose ranks are threads, and the copy of a rank's block
 * (gt_placement_local_box) out of or into a whole tensor.
 *
 * The ranks share one sim_exchange. A collective posts this rank's in/out tensors, meets the
 * peers at a barrier, computes its own output from every rank's input (sums in rank order through
 * gt_comm_sum_ordered, as every communicator must), and meets them again before returning, so no
 * rank frees or reuses a buffer another still reads. A rank that finishes (or fails) calls
 * sim_finished, so the others never wait forever; a barrier also gives up after 20 s. */
#ifndef GT_TEST_SHARD_SIM_H
#define GT_TEST_SHARD_SIM_H

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "graphtrain/gt_comm.h"

#define SIM_RANKS 2

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int arrived;
    unsigned long phase;
    int n_done;
    const gt_tensor *in[SIM_RANKS];
    int kind[SIM_RANKS];
} sim_exchange;

static inline void sim_exchange_init(sim_exchange *x)
{
    memset(x, 0, sizeof *x);
    pthread_mutex_init(&x->mu, NULL);
    pthread_cond_init(&x->cv, NULL);
}

static inline void sim_exchange_destroy(sim_exchange *x)
{
    pthread_mutex_destroy(&x->mu);
    pthread_cond_destroy(&x->cv);
}

/* A rank's thread is done with its collectives (call it whether it succeeded or not). */
static inline void sim_finished(sim_exchange *x)
{
    pthread_mutex_lock(&x->mu);
    x->n_done++;
    pthread_cond_broadcast(&x->cv);
    pthread_mutex_unlock(&x->mu);
}

static inline gt_status sim_barrier(sim_exchange *x, int rank, gt_error *err)
{
    pthread_mutex_lock(&x->mu);
    unsigned long ph = x->phase;
    if (++x->arrived == SIM_RANKS) {
        x->arrived = 0;
        x->phase++;
        pthread_cond_broadcast(&x->cv);
        pthread_mutex_unlock(&x->mu);
        return GT_OK;
    }
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 20;
    bool timed_out = false;
    while (x->phase == ph && x->n_done == 0 && !timed_out)
        timed_out = pthread_cond_timedwait(&x->cv, &x->mu, &until) != 0;
    bool ok = x->phase != ph;
    pthread_mutex_unlock(&x->mu);
    if (ok) return GT_OK;
    return gt_error_set(err, GT_ERR_INTERNAL, "simulated rank %d: a peer %s", rank,
                        timed_out ? "never reached the collective" : "finished without it");
}

static inline gt_status sim_start(gt_comm *c, gt_coll_kind kind, const gt_tensor *in,
                                  gt_tensor *out, int root, gt_comm_request *req, gt_error *err)
{
    (void)root, (void)req;
    sim_exchange *x = c->impl;
    int r = c->rank;
    x->in[r] = in;
    x->kind[r] = kind;
    GT_TRY(sim_barrier(x, r, err));
    const void *src[SIM_RANKS];
    size_t off = kind == GT_COLL_REDUCE_SCATTER
                     ? (size_t)(gt_tensor_numel(out) * r) * gt_dtype_size(in->dtype)
                     : 0;
    bool same = true;
    for (int k = 0; k < SIM_RANKS; k++) {
        src[k] = (const char *)x->in[k]->data + off;
        same = same && x->kind[k] == x->kind[0];
    }
    gt_status st = GT_OK;
    if (!same) {
        st = gt_error_set(err, GT_ERR_INTERNAL, "simulated ranks run different collectives");
    } else if (kind == GT_COLL_ALL_GATHER) {
        size_t bytes = gt_tensor_nbytes(in);
        for (int k = 0; k < SIM_RANKS; k++)
            if (bytes) memcpy((char *)out->data + (size_t)k * bytes, src[k], bytes);
    } else if (kind == GT_COLL_ALL_TO_ALL) { /* block k of the output: rank k's block r */
        size_t blk = gt_tensor_nbytes(in) / SIM_RANKS;
        for (int k = 0; k < SIM_RANKS; k++)
            if (blk)
                memcpy((char *)out->data + (size_t)k * blk,
                       (const char *)x->in[k]->data + (size_t)r * blk, blk);
    } else if (kind == GT_COLL_ALL_REDUCE || kind == GT_COLL_REDUCE_SCATTER) {
        st = gt_comm_sum_ordered(in->dtype, out->dtype, gt_tensor_numel(out), src, SIM_RANKS,
                                 out->data, err);
    } else {
        st = gt_error_set(err, GT_ERR_UNSUPPORTED, "simulated communicator: %s",
                          gt_coll_kind_name(kind));
    }
    gt_error ignore = {0};
    gt_status st2 = sim_barrier(x, r, st == GT_OK ? err : &ignore);
    return st != GT_OK ? st : st2;
}

static inline gt_status sim_wait(gt_comm *c, gt_comm_request *req, gt_error *err)
{
    (void)c, (void)req, (void)err;
    return GT_OK; /* the start ran the whole collective */
}

static inline gt_status sim_split(gt_comm *c, int color, int key, gt_comm **out, gt_error *err)
{
    (void)c, (void)color, (void)key, (void)out;
    return gt_error_set(err, GT_ERR_UNSUPPORTED, "simulated communicator: split");
}

static inline gt_status sim_u64(gt_comm *c, const uint64_t *in, int64_t count, uint64_t *out,
                                gt_error *err)
{
    (void)c, (void)in, (void)count, (void)out;
    return gt_error_set(err, GT_ERR_UNSUPPORTED, "simulated communicator: all_gather_u64");
}

static inline void sim_destroy(gt_comm *c)
{
    (void)c; /* owned by the caller */
}

/* Rank `rank`'s communicator over exchange x (no allocation: destroy is a no-op). */
static inline gt_comm sim_comm(sim_exchange *x, int rank)
{
    static const gt_comm_vtable vt = {
        .name = "threads",
        .start = sim_start,
        .wait = sim_wait,
        .split = sim_split,
        .all_gather_u64 = sim_u64,
        .destroy = sim_destroy,
    };
    gt_comm c = {.vt = &vt, .rank = rank, .size = SIM_RANKS, .impl = x};
    snprintf(c.name, sizeof c.name, "threads");
    return c;
}

/* ---------------------------------------------------------------- blocks */

/* Copies the box [start, start + size) of a row-major tensor of shape `full` to (to_box) or from
 * a contiguous box tensor; es = element size. */
static inline void sim_box_copy(char *big, const int64_t *full, char *box, const int64_t *start,
                                const int64_t *size, int ndim, size_t es, bool to_box)
{
    int64_t total = 1;
    for (int d = 0; d < ndim; d++)
        total *= size[d];
    if (total == 0) return;
    if (ndim == 0) {
        memcpy(to_box ? box : big, to_box ? big : box, es);
        return;
    }
    int64_t row = size[ndim - 1], idx[GT_MAX_DIMS] = {0};
    for (int64_t done = 0; done < total; done += row) {
        int64_t off = 0;
        for (int d = 0; d < ndim; d++)
            off = off * full[d] + start[d] + (d == ndim - 1 ? 0 : idx[d]);
        char *b = big + (size_t)off * es, *s = box + (size_t)done * es;
        memcpy(to_box ? s : b, to_box ? b : s, (size_t)row * es);
        for (int d = ndim - 2; d >= 0; d--) {
            if (++idx[d] < size[d]) break;
            idx[d] = 0;
        }
    }
}

#endif
