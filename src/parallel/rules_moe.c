/* rules_moe.c — the sharding rule `moe` of DeepSeek-V3's mixture-of-experts ops (moe_topk,
 * gather_last and its backward, moe_sort, moe_count, grouped_matmul, grouped_matmul_dw), and of
 * the embeddings that dispatch and combine the routed rows (an embedding or embedding_backward
 * whose ids are an output of moe_sort: rules_nn.c hands them here).
 *
 * The routed rows of a rank are its own tokens' rows: with the tokens split over a mesh dim
 * (data parallel, S(0)), every rank routes, sorts and combines its own tokens, and the values in
 * between — the sorted rows, the token and order ids (local row numbers), the expert offsets —
 * are per-rank values the rule labels as their dims say: rows S(0) like the tokens, offsets
 * partial (the sum over the ranks of the per-rank offsets is the global one), moe_count partial
 * (its sum over ranks is the step's count, which the bias update all-reduces). These labels keep
 * the engine's shape check honest; nothing but these rules reads the ids, so no collective ever
 * moves them (a gather of local row numbers would be wrong, so the rule never asks for one).
 *
 * The experts then take one of two forms on that mesh dim:
 *   - data parallel (expert_parallel off): grouped_matmul gathers the expert weights (FSDP) and
 *     runs every expert on the rank's rows; grouped_matmul_dw gives a partial gradient, which the
 *     engine reduce-scatters to the parameter's shard;
 *   - expert parallel (the mesh dim is the ep group, or is split into efsdp x ep groups; the
 *     weights are S(0) on it, each rank holding E/n whole experts): the rule keeps the weights
 *     and sets c->expert; gt_par_expand_moe (rules_moe_expand.c) sends the rows to the experts'
 *     ranks and back.
 * Replicated tokens (a mesh dim that does not split them: tp without sequence parallel) keep
 * everything replicate, except when ep takes tp ranks (gt_mesh_expert_tp, c->expert_tp on the tp
 * dim): routing then splits the tokens over tp, the rows stay split through dispatch and
 * combine (the engine all-gathers the combined output where a replicated op reads it), and
 * grouped_matmul's expansion runs on the tp dim with the expert weights in their lean storage
 * (c->expert_store on dp_shard and tp: E / (dp_shard x tp) whole experts per rank). */
#include "parallel/rules_internal.h"

#include "graphtrain/gt_graph.h"

bool gt_rule_from_moe_sort(const gt_graph *g, gt_value_id v)
{
    gt_node_id pn = g->values[v].producer;
    return pn != GT_NONE && g->nodes[pn].op == GT_OP_MOE_SORT;
}

static bool rows_split(gt_placement p)
{
    return gt_is_s_at(p, 0) && !p.padded;
}

/* The tokens' placement on this mesh dim: the first input split along its rows, else replicate. */
static gt_placement token_place(const gt_shard_ctx *c, int n_token_inputs)
{
    for (int k = 0; k < n_token_inputs; k++)
        if (rows_split(c->in[k])) return c->in[k];
    return gt_place_replicate();
}

/* Every one of the first n inputs wanted in the tokens' placement t. A replicate input is sliced
 * (a local slice of a table indexed by the rank's own tokens is the rank's part of it); a partial
 * one is all-reduced first. Ids of moe_sort are never converted: they already are the rank's. */
static void want_tokens(gt_shard_ctx *c, int n, gt_placement t)
{
    for (int k = 0; k < n; k++)
        if (!gt_place_equal(c->in[k], t) && !gt_rule_from_moe_sort(c->g, c->n->in[k]))
            c->want[k] = t;
}

static gt_status refuse(gt_shard_ctx *c, const char *why, gt_error *err)
{
    const gt_op_info *info = gt_op_get(c->n->op);
    const char *fqn = gt_graph_str(c->g, c->n->fqn);
    return gt_error_set(
        err, GT_ERR_UNSUPPORTED, "parallelize: %s%s%s on mesh dim %d of %d ranks: %s",
        info ? info->name : "?", fqn[0] ? " at " : "", fqn, c->mesh_dim, c->group_size, why);
}

/* Expert parallel applies to a grouped matmul on this mesh dim: the ep group is this dim, or
 * its ep-inner subgroups (ep a proper divisor: gt_mesh_expert_split), and the expert weights
 * (input 1 of grouped_matmul) are split by whole experts on it. */
static bool expert_parallel(const gt_shard_ctx *c)
{
    return c->expert_parallel > 1 && c->group_size % c->expert_parallel == 0;
}

gt_status gt_rule_moe(gt_shard_ctx *c, gt_error *err)
{
    const gt_node *n = c->n;
    bool routing = n->op == GT_OP_MOE_TOPK || n->op == GT_OP_GATHER_LAST ||
                   n->op == GT_OP_GATHER_LAST_BACKWARD;
    if (!(routing && c->expert_tp) && gt_rule_all_replicate(c)) return GT_OK;
    switch (n->op) {
    case GT_OP_MOE_TOPK:
    case GT_OP_GATHER_LAST:
    case GT_OP_GATHER_LAST_BACKWARD: {
        gt_placement t = token_place(c, n->n_in);
        /* ep takes tp ranks: tokens replicated over tp are cut into the tp ranks' blocks here,
         * where routing starts (a local slice), so every rank of the flattened dp_shard x tp
         * group routes and dispatches distinct tokens */
        if (c->expert_tp && gt_is_r(t)) t = gt_place_shard(0, c->token_order);
        if (!gt_is_s(t)) return gt_rule_gather_all(c);
        want_tokens(c, n->n_in, t);
        c->out[0] = t;
        /* the token gradient of the scores goes back to the tokens' (tp-replicated) layout */
        if (c->expert_tp && n->op == GT_OP_GATHER_LAST_BACKWARD)
            c->settle[0] = gt_place_replicate();
        return GT_OK;
    }
    case GT_OP_MOE_SORT:
    case GT_OP_MOE_COUNT: {
        gt_placement t = token_place(c, 1);
        if (!gt_is_s(t)) return gt_rule_gather_all(c);
        if (n->op == GT_OP_MOE_COUNT) {
            c->out[0] = gt_place_partial();
            return GT_OK;
        }
        c->out[0] = c->out[1] = t;
        c->out[2] = gt_place_partial();
        return GT_OK;
    }
    case GT_OP_EMBEDDING:            /* dispatch: (rows [T, D], ids of moe_sort) */
    case GT_OP_EMBEDDING_BACKWARD: { /* combine: (ids of moe_sort, dy [T*K, D]) */
        int ids = n->op == GT_OP_EMBEDDING ? 1 : 0;
        gt_placement t = c->in[ids];
        if (!rows_split(t)) {
            if (gt_is_r(t)) return gt_rule_gather_all(c);
            return refuse(c, "the routed ids are not split like the tokens", err);
        }
        want_tokens(c, n->n_in, t);
        c->out[0] = t;
        /* the combined rows (and the dispatch's token gradient) all-gathered back over tp */
        if (c->expert_tp && n->op == GT_OP_EMBEDDING_BACKWARD) c->settle[0] = gt_place_replicate();
        return GT_OK;
    }
    case GT_OP_GROUPED_MATMUL: { /* (x [R, Din], w [E, ...], offsets) */
        gt_placement x = c->in[0], off = c->in[2];
        if (!rows_split(x) || !gt_is_p(off)) {
            if (gt_is_r(x) && gt_is_r(off)) {
                c->want[1] = gt_place_replicate();
                return GT_OK;
            }
            return refuse(c, "routed rows and expert offsets are not split like the tokens", err);
        }
        c->out[0] = x;
        /* ep takes tp ranks: the weights in their lean storage on dp_shard and tp (converted
         * there if they are not: a local slice), gathered over efsdp by the tp dim's expander */
        if (c->expert_store.kind != GT_PLACE_NONE) {
            c->want[1] = c->expert_store;
            c->expert = c->expert_tp;
            return GT_OK;
        }
        if (expert_parallel(c) && rows_split(c->in[1]) && c->weight[1]) {
            c->expert = true;
            return GT_OK;
        }
        c->want[1] = gt_place_replicate(); /* FSDP: every expert on every rank */
        return GT_OK;
    }
    case GT_OP_GROUPED_MATMUL_DW: { /* (x [R, Din], dy [R, Dout], offsets) -> [E, Dout, Din] */
        gt_placement x = c->in[0], dy = c->in[1], off = c->in[2];
        if (gt_is_r(x) && gt_is_r(dy) && gt_is_r(off)) return GT_OK;
        if (!gt_is_p(off) || !rows_split(x) || !rows_split(dy) || !gt_place_equal(x, dy))
            return refuse(c, "routed rows and expert offsets are not split like the tokens", err);
        if (c->expert_store.kind != GT_PLACE_NONE) { /* the rank's block, reduced over efsdp */
            c->expert = c->expert_tp;
            c->out[0] = c->expert_store;
            return GT_OK;
        }
        if (expert_parallel(c)) {
            c->expert = true;
            c->out[0] = c->prefer && rows_split(c->prefer[0]) ? c->prefer[0] : gt_place_shard(0, 0);
            return GT_OK;
        }
        c->out[0] = gt_place_partial(); /* the rank's rows' part; reduce-scattered (FSDP) */
        return GT_OK;
    }
    default:
        return gt_rule_gather_all(c);
    }
}
