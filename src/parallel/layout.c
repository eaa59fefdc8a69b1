/* layout.c — the placements graph inputs start from (the model's tensor-parallel plan on each
 * parameter, SimpleFSDP's shard(0) storage — the token embedding's on dim 1 —, the routed experts'
 * flattened dp_shard x tp storage when ep takes tp ranks, the data-parallel batch), the block of a
 * global tensor a rank holds, and placement text. */
#include <stdio.h>
#include <string.h>

#include "graphtrain/gt_parallel.h"
#include "parallel/parallel_internal.h"

/* The tensor dim tensor parallelism splits, from the model's plan: ColwiseParallel shards a
 * Linear's weight [out, in] on dim 0 (and the vocabulary-parallel embedding and output on their
 * rows), RowwiseParallel on dim 1. -1: replicate. */
static int tp_shard_dim(gt_param_plan plan)
{
    switch ((gt_tp_style)plan.tp) {
    case GT_TP_COLWISE:
        return 0;
    case GT_TP_ROWWISE:
        return 1;
    default:
        return -1;
    }
}

/* dims: the parameter's dims when constant, else -1. */
static void param_layout(const gt_parallel_plan *plan, gt_param_plan pp, int ndim,
                         const int64_t *dims, gt_placement *out)
{
    int tp_dim = plan->mesh.size[GT_MESH_TP] > 1 ? tp_shard_dim(pp) : -1;
    if (tp_dim >= ndim) tp_dim = -1;
    if (tp_dim >= 0) out[GT_MESH_TP] = gt_place_shard(tp_dim, 0);
    int n = plan->mesh.size[GT_MESH_DP_SHARD];
    /* The token embedding without tp: FSDP storage on dim 1 (columns), so the step gathers the
     * tokens (gt_rule_embedding) and all_to_alls activations of [tokens, D] instead of gathering
     * the [V, D] table and reduce-scattering its [V, D] gradient: V = 128256 rows against the
     * tokens of a batch. */
    if (n > 1 && tp_dim < 0 && ndim == 2 && pp.role == GT_ROLE_EMBEDDING && dims[1] > 0 &&
        dims[1] % n == 0) {
        out[GT_MESH_DP_SHARD] = gt_place_shard(1, 0);
        return;
    }
    /* FSDP storage: dim 0, inside tp's block when tp splits dim 0 too (the gather over dp_shard
     * then gives back exactly the tensor-parallel block); padded to ceil(D / n) rows when the
     * (tensor-parallel block's) dim 0 does not divide, as FSDP2 does */
    if (n > 1 && ndim >= 1) {
        out[GT_MESH_DP_SHARD] = gt_place_shard(0, tp_dim == 0 ? 1 : 0);
        int64_t rows = dims[0];
        if (rows > 0 && tp_dim == 0 && rows % plan->mesh.size[GT_MESH_TP] == 0)
            rows /= plan->mesh.size[GT_MESH_TP];
        if (rows > 0 && rows % n != 0) out[GT_MESH_DP_SHARD].padded = 1;
    }
}

/* The routed-expert weights when ep takes tp ranks (gt_mesh_expert_tp): their lean storage, whole
 * experts sharded over the flattened dp_shard x tp ranks in the tokens' order rank.dp_shard * tp
 * + rank.tp, so each rank stores E / (dp_shard * tp) experts (torchtitan's ETP 1, efsdp x ep)
 * instead of FSDP's E / dp_shard whole over tp. The expert count divides dp_shard * tp (the
 * trainer checks). */
gt_placement gt_parallel_expert_storage(const gt_mesh *m, int md)
{
    bool shard = m->size[GT_MESH_DP_SHARD] > 1;
    if (md == GT_MESH_DP_SHARD) return shard ? gt_place_shard(0, 0) : gt_place_replicate();
    if (md == GT_MESH_TP) return gt_place_shard(0, shard ? 1 : 0);
    return (gt_placement){GT_PLACE_NONE, 0, 0, 0};
}

static void expert_layout(const gt_parallel_plan *plan, gt_placement *out)
{
    out[GT_MESH_DP_SHARD] = gt_parallel_expert_storage(&plan->mesh, GT_MESH_DP_SHARD);
    out[GT_MESH_TP] = gt_parallel_expert_storage(&plan->mesh, GT_MESH_TP);
}

static bool is_batch_dim(const gt_graph *g, gt_expr e)
{
    char buf[64];
    gt_sym_format(g->sym, e, buf, sizeof buf);
    return strcmp(buf, "batch") == 0;
}

gt_status gt_parallel_input_layouts(const gt_parallel_plan *plan, const gt_graph *g,
                                    gt_placement (*out)[GT_MESH_MAX_DIMS], gt_error *err)
{
    /* routed-expert weights (the model's GT_ROLE_EXPERT; their moments and gradient sums carry
     * the parameter's plan) take the lean storage when ep takes tp ranks */
    bool ep_tp = gt_mesh_expert_tp(&plan->mesh, plan->expert_parallel_degree);
    for (int32_t k = 0; k < g->n_inputs; k++) {
        const gt_io *in = &g->inputs[k];
        bool expert = ep_tp && in->plan.role == GT_ROLE_EXPERT;
        const gt_type *t = gt_value_type(g, in->value);
        const char *fqn = gt_graph_str(g, in->fqn);
        int64_t dims[GT_MAX_DIMS];
        for (int d = 0; d < GT_MAX_DIMS; d++)
            if (d >= t->ndim || !gt_sym_is_const(g->sym, t->dims[d], &dims[d])) dims[d] = -1;
        for (int d = 0; d < GT_MESH_MAX_DIMS; d++)
            out[k][d] = gt_place_replicate();
        switch ((gt_input_kind)in->kind) {
        case GT_IN_PARAM:
        case GT_IN_OPT_STATE: /* a moment sits where its parameter does (the optimizer copies the
                               * parameter's plan onto it) */
            if (expert)
                expert_layout(plan, out[k]);
            else
                param_layout(plan, in->plan, t->ndim, dims, out[k]);
            break;
        case GT_IN_INPUT:
            if (t->ndim >= 1 && is_batch_dim(g, t->dims[0])) {
                if (plan->mesh.size[GT_MESH_DP_REPLICATE] > 1)
                    out[k][GT_MESH_DP_REPLICATE] = gt_place_shard(0, 0);
                if (plan->mesh.size[GT_MESH_DP_SHARD] > 1)
                    out[k][GT_MESH_DP_SHARD] =
                        gt_place_shard(0, plan->mesh.size[GT_MESH_DP_REPLICATE] > 1 ? 1 : 0);
            }
            break;
        case GT_IN_BUFFER:
            /* gradient accumulation's running sum sits where its parameter does (the same plan);
             * other buffers are replicated */
            if (expert)
                expert_layout(plan, out[k]);
            else if (in->plan.as_param)
                param_layout(plan, in->plan, t->ndim, dims, out[k]);
            break;
        default:
            return gt_error_set(err, GT_ERR_INVALID, "graph input %d ('%s'): unknown kind %d", k,
                                fqn, in->kind);
        }
    }
    return GT_OK;
}

gt_status gt_placement_local_box(const gt_mesh *m, const gt_placement place[GT_MESH_MAX_DIMS],
                                 int ndim, const int64_t *global, const int coords[GT_MESH_NDIMS],
                                 int64_t *start, int64_t *size, gt_error *err)
{
    for (int d = 0; d < ndim; d++) {
        start[d] = 0;
        size[d] = global[d];
        /* the mesh dims that split tensor dim d, outermost (lowest order) first; ties by mesh dim
         */
        for (int order = 0; order < 256; order++) {
            bool any_left = false;
            for (int md = 0; md < GT_MESH_NDIMS; md++) {
                const gt_placement *p = &place[md];
                if (p->kind != GT_PLACE_SHARD || p->dim != d) continue;
                if (p->order > order) any_left = true;
                if (p->order != order || m->size[md] == 1) continue;
                if (p->padded) { /* ceil-sized blocks; the last ones short or empty */
                    int64_t block = (size[d] + m->size[md] - 1) / m->size[md];
                    int64_t first = coords[md] * block;
                    int64_t valid = size[d] - first;
                    valid = valid < 0 ? 0 : valid > block ? block : valid;
                    start[d] += first < size[d] ? first : size[d];
                    size[d] = valid;
                    continue;
                }
                if (size[d] % m->size[md] != 0)
                    return gt_error_set(err, GT_ERR_INVALID,
                                        "dim %d of size %lld does not split evenly over %s %d", d,
                                        (long long)size[d], gt_mesh_dim_name(md), m->size[md]);
                size[d] /= m->size[md];
                start[d] += coords[md] * size[d];
            }
            if (!any_left) break;
        }
    }
    return GT_OK;
}

void gt_placement_local_shape(const gt_mesh *m, const gt_placement place[GT_MESH_MAX_DIMS],
                              int ndim, const int64_t *global, int64_t *local)
{
    for (int d = 0; d < ndim; d++) {
        local[d] = global[d];
        for (int md = 0; md < GT_MESH_NDIMS; md++)
            if (place[md].kind == GT_PLACE_SHARD && place[md].dim == d && m->size[md] > 1 &&
                !place[md].padded)
                local[d] /= m->size[md];
        for (int md = 0; md < GT_MESH_NDIMS; md++)
            if (place[md].kind == GT_PLACE_SHARD && place[md].dim == d && m->size[md] > 1 &&
                place[md].padded)
                local[d] = (local[d] + m->size[md] - 1) / m->size[md];
    }
}
