/* trainer_ep_comms.c — expert parallel's communicators: the efsdp and ep groups of torchtitan's
 * sparse mesh [dp_replicate, efsdp, ep] (ep inner), split from the world when ep cuts the
 * dp_shard ranks (gt_mesh_expert_split) or the flattened dp_shard x tp ranks (gt_mesh_expert_tp).
 *
 * Flattened index i = gt_mesh_expert_flat (rank.dp_shard, or rank.dp_shard * tp + rank.tp), so
 * efsdp coordinate f = i / ep and ep coordinate c = i mod ep, as the graph's symbols say
 * (parallelize.c's gt_par_coord). efsdp groups the ranks of one dp_replicate group with the same
 * c (they hold the same experts), ep the ranks with the same f (they exchange tokens). Each group
 * is split with color = the world rank of its member whose own coordinate is 0 and key = that
 * coordinate, so a group's comm rank is its coordinate there (block r = coordinate r). */
#include <stdio.h>
#include <string.h>

#include "train/train_internal.h"

/* The world rank with flattened index i and this rank's other coordinates. */
static int rank_at(const gt_train_layout *l, int ep, int i)
{
    int co[GT_MESH_NDIMS];
    memcpy(co, l->coords, sizeof co);
    if (gt_mesh_expert_tp(&l->mesh, ep)) {
        co[GT_MESH_DP_SHARD] = i / l->mesh.size[GT_MESH_TP];
        co[GT_MESH_TP] = i % l->mesh.size[GT_MESH_TP];
    } else {
        co[GT_MESH_DP_SHARD] = i;
    }
    return gt_mesh_rank(&l->mesh, co);
}

gt_status gt_train_dist_expert_comms(const gt_config *cfg, gt_train_dist *d, gt_error *err)
{
    int ep = (int)cfg->parallelism.expert_parallel_degree;
    const gt_train_layout *l = &d->layout;
    if (!gt_mesh_expert_split(&l->mesh, ep) && !gt_mesh_expert_tp(&l->mesh, ep)) return GT_OK;
    int i = gt_mesh_expert_flat(&l->mesh, ep, l->coords);
    int f = i / ep, c = i % ep;
    for (int k = GT_MESH_EFSDP; k <= GT_MESH_EP; k++) {
        int color = rank_at(l, ep, k == GT_MESH_EFSDP ? c : f * ep);
        GT_TRY(gt_comm_split(d->world, color, k == GT_MESH_EFSDP ? f : c, &d->dim_comm[k], err));
        snprintf(d->dim_comm[k]->name, sizeof d->dim_comm[k]->name, "%s/group %d",
                 gt_mesh_dim_name(k), color);
    }
    return GT_OK;
}
