/* fake.c — a communicator with no peers, for compile-only runs and unit tests.
 *
 * Size 1: every collective is the identity on one rank (all_reduce/all_gather/reduce_scatter/
 * all_to_all copy in to out, a widening reduce_scatter widens it; broadcast leaves buf as it is).
 * Simulated size > 1: the generic layer has checked shapes and dtypes; nothing is moved, out is
 * left untouched, since there is no peer data to produce. The schedule check sees every simulated
 * rank with this rank's schedule. */
#include "graphtrain/gt_comm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static gt_status fake_start(gt_comm *c, gt_coll_kind kind, const gt_tensor *in, gt_tensor *out,
                            int root, gt_comm_request *req, gt_error *err)
{
    (void)root, (void)req;
    if (c->size != 1 || kind == GT_COLL_BROADCAST) return GT_OK; /* size 1: a gather copies too */
    return gt_comm_one_rank(in, out, err);
}

static gt_status fake_wait(gt_comm *c, gt_comm_request *req, gt_error *err)
{
    (void)c, (void)req, (void)err;
    return GT_OK;
}

static gt_status fake_all_gather_u64(gt_comm *c, const uint64_t *in, int64_t count, uint64_t *out,
                                     gt_error *err)
{
    (void)err;
    for (int r = 0; r < c->size; r++)
        if (count > 0) memcpy(out + (size_t)r * (size_t)count, in, (size_t)count * sizeof *in);
    return GT_OK;
}

static gt_status fake_split(gt_comm *c, int color, int key, gt_comm **out, gt_error *err);

static void fake_destroy(gt_comm *c)
{
    free(c);
}

static const gt_comm_vtable fake_vtable = {
    .name = "fake",
    .start = fake_start,
    .wait = fake_wait,
    .free_request = NULL,
    .split = fake_split,
    .all_gather_u64 = fake_all_gather_u64,
    .destroy = fake_destroy,
};

gt_status gt_comm_fake_create(int size, int rank, gt_comm **out, gt_error *err)
{
    *out = NULL;
    if (size < 1 || rank < 0 || rank >= size)
        return gt_error_set(err, GT_ERR_INVALID,
                            "fake communicator: rank %d, size %d: expected size >= 1 and "
                            "0 <= rank < size",
                            rank, size);
    gt_comm *c = gt_xcalloc(1, sizeof *c);
    c->vt = &fake_vtable;
    c->rank = rank;
    c->size = size;
    snprintf(c->name, sizeof c->name, "fake%d", size);
    *out = c;
    return GT_OK;
}

/* With no peers, this rank cannot know the other ranks' colors: the sub-group is this rank alone
 * (size 1), which is exact for size 1 and a compile-only approximation otherwise. */
static gt_status fake_split(gt_comm *c, int color, int key, gt_comm **out, gt_error *err)
{
    (void)key;
    GT_TRY(gt_comm_fake_create(1, 0, out, err));
    snprintf((*out)->name, sizeof(*out)->name, "%.40s/split(%d)", c->name, color);
    return GT_OK;
}
