/* mesh.c — the device mesh: three named dims (dp_replicate, dp_shard, tp), ranks numbered
 * row-major over them with tp fastest, as torchtitan's mesh ["dp_replicate", "dp_shard", "tp"];
 * and expert parallel's split of dp_shard (or of dp_shard x tp) into efsdp x ep (ep inner,
 * torchtitan's sparse mesh). */
#include <stdio.h>

#include "graphtrain/gt_parallel.h"

static const char *const mesh_names[GT_MESH_EP_NDIMS] = {"dp_replicate", "dp_shard", "tp", "efsdp",
                                                         "ep"};
static const char *const coord_names[GT_MESH_NDIMS] = {"rank.dp_replicate", "rank.dp_shard",
                                                       "rank.tp"};

gt_status gt_mesh_init(gt_mesh *m, int dp_replicate, int dp_shard, int tp, gt_error *err)
{
    int sizes[GT_MESH_NDIMS] = {dp_replicate, dp_shard, tp};
    for (int d = 0; d < GT_MESH_NDIMS; d++) {
        if (sizes[d] < 1)
            return gt_error_set(err, GT_ERR_INVALID, "mesh: %s degree must be >= 1, got %d",
                                mesh_names[d], sizes[d]);
        m->size[d] = sizes[d];
    }
    if ((long long)dp_replicate * dp_shard * tp > (1 << 24))
        return gt_error_set(err, GT_ERR_INVALID, "mesh: %d x %d x %d ranks is too many",
                            dp_replicate, dp_shard, tp);
    return GT_OK;
}

int gt_mesh_world_size(const gt_mesh *m)
{
    int n = 1;
    for (int d = 0; d < GT_MESH_NDIMS; d++)
        n *= m->size[d];
    return n;
}

void gt_mesh_coords(const gt_mesh *m, int rank, int coords[GT_MESH_NDIMS])
{
    for (int d = GT_MESH_NDIMS - 1; d >= 0; d--) {
        coords[d] = rank % m->size[d];
        rank /= m->size[d];
    }
}

int gt_mesh_rank(const gt_mesh *m, const int coords[GT_MESH_NDIMS])
{
    int r = 0;
    for (int d = 0; d < GT_MESH_NDIMS; d++)
        r = r * m->size[d] + coords[d];
    return r;
}

const char *gt_mesh_dim_name(int dim)
{
    return dim >= 0 && dim < GT_MESH_EP_NDIMS ? mesh_names[dim] : "?";
}

const char *gt_mesh_coord_symbol(int dim)
{
    return dim >= 0 && dim < GT_MESH_NDIMS ? coord_names[dim] : "rank.?";
}

int gt_mesh_format(const gt_mesh *m, char *buf, size_t len)
{
    int n = 0;
    for (int d = 0; d < GT_MESH_NDIMS; d++) {
        if (m->size[d] == 1) continue;
        n += snprintf(buf + (n < (int)len ? n : (int)len), n < (int)len ? len - (size_t)n : 0,
                      "%s%s %d", n ? " x " : "", mesh_names[d], m->size[d]);
    }
    if (n == 0) n = snprintf(buf, len, "1 rank");
    return n;
}

bool gt_mesh_expert_split(const gt_mesh *m, int ep)
{
    int n = m->size[GT_MESH_DP_SHARD];
    return ep > 1 && ep < n && n % ep == 0;
}

bool gt_mesh_expert_tp(const gt_mesh *m, int ep)
{
    int n = m->size[GT_MESH_DP_SHARD], tp = m->size[GT_MESH_TP];
    return ep > 1 && tp > 1 && n % ep != 0 && (n * tp) % ep == 0;
}

int gt_mesh_expert_flat(const gt_mesh *m, int ep, const int coords[GT_MESH_NDIMS])
{
    if (!gt_mesh_expert_tp(m, ep)) return coords[GT_MESH_DP_SHARD];
    return coords[GT_MESH_DP_SHARD] * m->size[GT_MESH_TP] + coords[GT_MESH_TP];
}
