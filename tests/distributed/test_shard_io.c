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
 *   - gathers the whole tensor from every rank's block (gt_shard_gather over the world) and
 *     compares it bit for bit with the whole initialisation;
 *   - slices its block back out of the whole tensor (gt_shard_slice) and gets its block again.
 * The same for a 3-d parameter split on its first or middle dim, whose blocks are walked in runs
 * longer than a row. */
#include <string.h>

#include "graphtrain/gt_comm.h"
#include "graphtrain/gt_model.h"
#include "gt_test.h"
#include "train/train_internal.h"

#define ROWS 8
#define COLS 12

/* The naive box: see the header comment. */
static void reference_box(const gt_mesh *m, const gt_placement place[GT_MESH_MAX_DIMS],
                          const int coords[GT_MESH_NDIMS], const int64_t *global, int64_t *start,
                          int64_t *size)
{
    for (int d = 0; d < 2; d++) {
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

/* The block gathers back into the whole tensor (also when only rank 0 receives) and slices back
 * out of it; frees both. */
static void check_gather_slice(gt_comm *world, const gt_mesh *mesh, const char *what,
                               const gt_shard_box *box, gt_tensor *whole, gt_tensor *block)
{
    gt_error err = {0};
    gt_tensor gathered, again;
    gt_tensor_alloc(&gathered, GT_F32, whole->ndim, whole->shape, &err);
    gt_tensor_alloc(&again, GT_F32, block->ndim, block->shape, &err);
    EXPECT_OK(gt_shard_gather(world, mesh, box, block, &gathered, &err), &err);
    EXPECT(memcmp(gathered.data, whole->data, gt_tensor_nbytes(whole)) == 0,
           "%s rank %d: the gathered tensor differs from the whole initialisation", what,
           world->rank);
    /* a rank that only contributes (full NULL) takes part in the same exchange */
    EXPECT_OK(gt_shard_gather(world, mesh, box, block, world->rank == 0 ? &gathered : NULL, &err),
              &err);
    gt_shard_slice(box, whole, &again);
    EXPECT(memcmp(again.data, block->data, gt_tensor_nbytes(block)) == 0,
           "%s rank %d: slicing the whole tensor does not give the block", what, world->rank);
    gt_tensor_free(whole);
    gt_tensor_free(&gathered);
    gt_tensor_free(block);
    gt_tensor_free(&again);
}

static void check_placement(gt_comm *world, const gt_mesh *mesh, const char *what,
                            const gt_placement place[GT_MESH_MAX_DIMS])
{
    gt_error err = {0};
    int coords[GT_MESH_NDIMS];
    gt_mesh_coords(mesh, world->rank, coords);
    gt_param_spec spec = {.dtype = GT_F32, .ndim = 2, .init = GT_INIT_NORMAL, .std = 0.02};
    snprintf(spec.fqn, sizeof spec.fqn, "layers.0.attention.wq.weight");
    spec.shape[0] = ROWS, spec.shape[1] = COLS;
    int64_t global[2] = {ROWS, COLS}, start[2], size[2];
    reference_box(mesh, place, coords, global, start, size);

    gt_shard_box box;
    EXPECT_OK(gt_shard_box_init(&box, mesh, place, 2, global, coords, &err), &err);
    EXPECT(box.start[0] == start[0] && box.start[1] == start[1] && box.size[0] == size[0] &&
               box.size[1] == size[1],
           "%s rank %d: box [%lld+%lld, %lld+%lld], reference [%lld+%lld, %lld+%lld]", what,
           world->rank, (long long)box.start[0], (long long)box.size[0], (long long)box.start[1],
           (long long)box.size[1], (long long)start[0], (long long)size[0], (long long)start[1],
           (long long)size[1]);

    gt_tensor whole, block;
    gt_tensor_alloc(&whole, GT_F32, 2, global, &err);
    gt_tensor_alloc(&block, GT_F32, 2, size, &err);
    gt_param_init(&spec, 7, 0, ROWS * COLS, &whole);
    gt_shard_init_param(&box, &spec, 7, &block);
    int bad = 0;
    for (int64_t r = 0; r < size[0]; r++)
        for (int64_t c = 0; c < size[1]; c++) {
            float a = ((float *)block.data)[r * size[1] + c];
            float b = ((float *)whole.data)[(start[0] + r) * COLS + start[1] + c];
            bad += memcmp(&a, &b, sizeof a) != 0;
        }
    EXPECT(bad == 0, "%s rank %d: %d block elements differ from the whole initialisation", what,
           world->rank, bad);
    check_gather_slice(world, mesh, what, &box, &whole, &block);
}

/* A 3-d parameter [D0, D1, D2] under place: the block initialised and sliced in runs that span
 * more than one row (dims after the split one whole) equals the whole initialisation at the box's
 * positions, and gathers back to it. */
#define D0 4
#define D1 6
#define D2 5
static void check_3d(gt_comm *world, const gt_mesh *mesh, const char *what,
                     const gt_placement place[GT_MESH_MAX_DIMS])
{
    gt_error err = {0};
    int coords[GT_MESH_NDIMS];
    gt_mesh_coords(mesh, world->rank, coords);
    gt_param_spec spec = {.dtype = GT_F32, .ndim = 3, .init = GT_INIT_NORMAL, .std = 0.02};
    snprintf(spec.fqn, sizeof spec.fqn, "conv3d.weight");
    int64_t global[3] = {D0, D1, D2};
    memcpy(spec.shape, global, sizeof global);
    gt_shard_box box;
    EXPECT_OK(gt_shard_box_init(&box, mesh, place, 3, global, coords, &err), &err);
    gt_tensor whole, block;
    gt_tensor_alloc(&whole, GT_F32, 3, global, &err);
    gt_tensor_alloc(&block, GT_F32, 3, box.size, &err);
    gt_param_init(&spec, 7, 0, D0 * D1 * D2, &whole);
    gt_shard_init_param(&box, &spec, 7, &block);
    int bad = 0;
    const float *bl = block.data, *wh = whole.data;
    for (int64_t i = 0; i < box.size[0]; i++)
        for (int64_t j = 0; j < box.size[1]; j++)
            for (int64_t k = 0; k < box.size[2]; k++) {
                float a = bl[(i * box.size[1] + j) * box.size[2] + k];
                float b = wh[((box.start[0] + i) * D1 + box.start[1] + j) * D2 + box.start[2] + k];
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

    gt_placement place[GT_MESH_MAX_DIMS];
    memset(place, 0, sizeof place);
    check_placement(world, &mesh, "replicate", place);
    place[GT_MESH_DP_SHARD] = (gt_placement){GT_PLACE_SHARD, 0, 0, 0};
    check_placement(world, &mesh, "S(0)@dp_shard", place);
    place[GT_MESH_TP] = (gt_placement){GT_PLACE_SHARD, 1, 0, 0};
    check_placement(world, &mesh, "S(0)@dp_shard, S(1)@tp", place);
    place[GT_MESH_TP] = (gt_placement){GT_PLACE_SHARD, 0, 0, 0};
    place[GT_MESH_DP_SHARD] = (gt_placement){GT_PLACE_SHARD, 0, 1, 0};
    check_placement(world, &mesh, "S(0)@tp outer, S(0)@dp_shard inner", place);
    place[GT_MESH_TP] = (gt_placement){GT_PLACE_SHARD, 0, 1, 0};
    place[GT_MESH_DP_SHARD] = (gt_placement){GT_PLACE_SHARD, 0, 0, 0};
    check_placement(world, &mesh, "S(0)@dp_shard outer, S(0)@tp inner", place);

    memset(place, 0, sizeof place);
    check_3d(world, &mesh, "3-d replicate", place);
    place[GT_MESH_DP_SHARD] = (gt_placement){GT_PLACE_SHARD, 0, 0, 0};
    check_3d(world, &mesh, "3-d S(0)@dp_shard", place);
    place[GT_MESH_DP_SHARD] = (gt_placement){GT_PLACE_SHARD, 1, 0, 0};
    check_3d(world, &mesh, "3-d S(1)@dp_shard", place);
    place[GT_MESH_TP] = (gt_placement){GT_PLACE_SHARD, 0, 0, 0};
    check_3d(world, &mesh, "3-d S(1)@dp_shard, S(0)@tp", place);

    gt_comm_destroy(world);
    gt_comm_mpi_finalize(&err);
    return gt_test_finish();
}
