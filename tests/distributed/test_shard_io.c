/* test_shard_io.c — the trainer's blocks of sharded tensors (src/train/shard_io.c), under mpirun
 * with 2 ranks (mesh dp_shard 2) and 4 ranks (dp_shard 2 x tp 2).
 *
 * For a parameter of global shape [8, 12] and each of several placements (replicate, rows split
 * over dp_shard, rows over dp_shard and columns over tp, rows split over both dims nested in
 * either order), every rank:
 *   - computes its box and checks it against a naive reference: for tensor dim d, the mesh dims
 *     that shard it, outermost (lowest order) first, form a mixed-radix block index of the rank's
 *     coordinates; block size = G[d] / product of their sizes, start = index * size;
 *   - initialises its block with gt_shard_init_param and compares it, element by element, with the
 *     same box of the whole tensor initialised at once (gt_param_init of every element): the bits
 *     a one-rank run starts from;
 *   - gathers the whole tensor from every rank's block on each rank in turn (gt_shard_whole over
 *     the world) and compares it bit for bit with the whole initialisation, hashes it from the
 *     blocks (gt_shard_hash): gt_hash64 of the whole, and gathers it to every rank at once
 *     (gt_shard_gather_start / _finish, all in flight together);
 *   - slices its block back out of the whole tensor (gt_shard_slice) and gets its block again.
 * The same for a 3-d parameter [4, 6, 5] split on its first or middle dim, whose blocks are
 * walked in runs longer than a row (check_block serves both ranks). */
#include <string.h>

#include "graphtrain/gt_comm.h"
#include "graphtrain/gt_llama3.h"
#include "gt_test.h"
#include "train/train_internal.h"

/* The naive box: see the header comment. */
static void reference_box(const gt_mesh *m, const gt_placement place[GT_MESH_MAX_DIMS],
                          const int coords[GT_MESH_NDIMS], int ndim, const int64_t *global,
                          int64_t *start, int64_t *size)
{
    for (int d = 0; d < ndim; d++) {
        int dims[GT_MESH_NDIMS], n = 0;
        for (int md = 0; md < GT_MESH_NDIMS; md++)
            if (place[md].kind == GT_PLACE_SHARD && place[md].dim == d) dims[n++] = md;
        for (int i = 0; i < n; i++) /* sort by order, then mesh dim */
            for (int j = i + 1; j < n; j++)
                if (place[dims[j]].order < place[dims[i]].order) {
                    int t = dims[i];
                    dims[i] = dims[j], dims[j] = t;
                }
        int64_t index = 0, parts = 1;
        for (int i = 0; i < n; i++) {
            index = index * m->size[dims[i]] + coords[dims[i]];
            parts *= m->size[dims[i]];
        }
        size[d] = global[d] / parts;
        start[d] = index * size[d];
    }
}

/* The blocks gather back into the whole tensor on each rank in turn (gt_shard_whole, twice over
 * the same buffers: blocks in rank order are used as gathered, others placed first), the whole
 * tensor hashes as gt_hash64 of the one-rank tensor (gt_shard_hash, on its root only), gathers to
 * every rank at once (one gt_shard_gather_start per root, all in flight, then finished in order)
 * give every rank the whole tensor, and the block slices back out of the whole tensor; frees
 * both. */
static void check_gather_slice(gt_comm *world, const gt_mesh *mesh, const char *what,
                               const gt_shard_box *box, gt_tensor *whole, gt_tensor *block)
{
    gt_error err = {0};
    gt_shard_buffers buf = {0};
    uint64_t want = gt_hash64(whole->data, gt_tensor_nbytes(whole), 0);
    size_t bytes = gt_tensor_nbytes(whole);
    for (int rep = 0; rep < 2 * world->size; rep++) {
        int root = rep % world->size;
        const void *got = NULL;
        EXPECT_OK(gt_shard_whole(world, mesh, box, block, root, &buf, &got, &err), &err);
        EXPECT(world->rank == root ? got && memcmp(got, whole->data, bytes) == 0 : got == NULL,
               "%s rank %d: the tensor gathered to rank %d differs from the whole "
               "initialisation (or another rank got one)",
               what, world->rank, root);
        uint64_t h = 99;
        EXPECT_OK(gt_shard_hash(world, mesh, box, block, root, &buf, &h, &err), &err);
        EXPECT(world->rank == root ? h == want : h == 99,
               "%s rank %d: the hash from the blocks gathered to rank %d %016llx, of the whole "
               "tensor %016llx (99 off the root)",
               what, world->rank, root, (unsigned long long)h, (unsigned long long)want);
    }
    gt_shard_gather g[4];
    gt_shard_buffers each[4] = {{0}};
    GT_CHECK(world->size <= 4);
    for (int r = 0; r < world->size; r++)
        EXPECT_OK(gt_shard_gather_start(world, block, r, &each[r], &g[r], &err), &err);
    for (int r = 0; r < world->size; r++) {
        const void *got = NULL;
        EXPECT_OK(gt_shard_gather_finish(world, mesh, box, &each[r], &g[r], &got, &err), &err);
        EXPECT(world->rank == r ? got && memcmp(got, whole->data, bytes) == 0 : got == NULL,
               "%s rank %d: of the gathers in flight together, the one to rank %d went wrong", what,
               world->rank, r);
        gt_shard_buffers_free(&each[r]);
    }
    gt_shard_buffers_free(&buf);
    gt_tensor again;
    gt_tensor_alloc(&again, GT_F32, block->ndim, block->shape, &err);
    gt_shard_slice(box, whole, &again);
    EXPECT(memcmp(again.data, block->data, gt_tensor_nbytes(block)) == 0,
           "%s rank %d: slicing the whole tensor does not give the block", what, world->rank);
    gt_tensor_free(whole);
    gt_tensor_free(block);
    gt_tensor_free(&again);
}

/* One parameter of global shape (ndim dims) under place: the rank's box against the reference,
 * its initialised block element by element against the whole initialisation, then gather and
 * slice. */
static void check_block(gt_comm *world, const gt_mesh *mesh, const char *what,
                        const gt_placement place[GT_MESH_MAX_DIMS], int ndim, const int64_t *global)
{
    gt_error err = {0};
    int coords[GT_MESH_NDIMS];
    gt_mesh_coords(mesh, world->rank, coords);
    gt_param_spec spec = {.dtype = GT_F32, .ndim = ndim, .init = GT_INIT_NORMAL, .std = 0.02};
    snprintf(spec.fqn, sizeof spec.fqn, "layers.0.attention.wq.weight");
    memcpy(spec.shape, global, (size_t)ndim * sizeof global[0]);
    int64_t start[GT_MAX_DIMS], size[GT_MAX_DIMS];
    reference_box(mesh, place, coords, ndim, global, start, size);

    gt_shard_box box;
    EXPECT_OK(gt_shard_box_init(&box, mesh, place, ndim, global, coords, &err), &err);
    for (int d = 0; d < ndim; d++)
        EXPECT(box.start[d] == start[d] && box.size[d] == size[d],
               "%s rank %d: box dim %d %lld+%lld, reference %lld+%lld", what, world->rank, d,
               (long long)box.start[d], (long long)box.size[d], (long long)start[d],
               (long long)size[d]);

    gt_tensor whole, block;
    gt_tensor_alloc(&whole, GT_F32, ndim, global, &err);
    gt_tensor_alloc(&block, GT_F32, ndim, size, &err);
    gt_param_init(&spec, 7, 0, gt_tensor_numel(&whole), &whole);
    gt_shard_init_param(&box, &spec, 7, &block);
    int bad = 0;
    for (int64_t e = 0; e < gt_tensor_numel(&block); e++) {
        int64_t rest = e, at = 0, stride = 1; /* e's multi-index in the block, placed in whole */
        for (int d = ndim - 1; d >= 0; d--) {
            at += (start[d] + rest % size[d]) * stride;
            rest /= size[d], stride *= global[d];
        }
        float a = ((float *)block.data)[e], b = ((float *)whole.data)[at];
        bad += memcmp(&a, &b, sizeof a) != 0;
    }
    EXPECT(bad == 0, "%s rank %d: %d block elements differ from the whole initialisation", what,
           world->rank, bad);
    check_gather_slice(world, mesh, what, &box, &whole, &block);
}

int main(int argc, char **argv)
{
    gt_error err = {0};
    gt_comm *world = NULL;
    if (gt_comm_mpi_world(&argc, &argv, &world, &err) != GT_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    int tp = world->size >= 4 ? 2 : 1;
    gt_mesh mesh;
    EXPECT_OK(gt_mesh_init(&mesh, 1, world->size / tp, tp, &err), &err);

    /* each case: the tensor's rank, then the dp_shard and tp placements ({kind, dim, order}) */
    const int64_t shape2[2] = {8, 12}, shape3[3] = {4, 6, 5};
    const gt_placement R = {GT_PLACE_REPLICATE, 0, 0, 0};
    const struct {
        const char *what;
        int ndim;
        gt_placement dp, tp;
    } cases[] = {
        {"replicate", 2, R, R},
        {"S(0)@dp_shard", 2, {GT_PLACE_SHARD, 0, 0, 0}, R},
        {"S(0)@dp_shard, S(1)@tp", 2, {GT_PLACE_SHARD, 0, 0, 0}, {GT_PLACE_SHARD, 1, 0, 0}},
        {"S(0)@tp outer, S(0)@dp_shard inner",
         2,
         {GT_PLACE_SHARD, 0, 1, 0},
         {GT_PLACE_SHARD, 0, 0, 0}},
        {"S(0)@dp_shard outer, S(0)@tp inner",
         2,
         {GT_PLACE_SHARD, 0, 0, 0},
         {GT_PLACE_SHARD, 0, 1, 0}},
        {"3-d replicate", 3, R, R},
        {"3-d S(0)@dp_shard", 3, {GT_PLACE_SHARD, 0, 0, 0}, R},
        {"3-d S(1)@dp_shard", 3, {GT_PLACE_SHARD, 1, 0, 0}, R},
        {"3-d S(1)@dp_shard, S(0)@tp", 3, {GT_PLACE_SHARD, 1, 0, 0}, {GT_PLACE_SHARD, 0, 0, 0}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        gt_placement place[GT_MESH_MAX_DIMS];
        memset(place, 0, sizeof place);
        place[GT_MESH_DP_SHARD] = cases[c].dp;
        place[GT_MESH_TP] = cases[c].tp;
        check_block(world, &mesh, cases[c].what, place, cases[c].ndim,
                    cases[c].ndim == 2 ? shape2 : shape3);
    }

    gt_comm_destroy(world);
    gt_comm_mpi_finalize(&err);
    return gt_test_finish();
}
