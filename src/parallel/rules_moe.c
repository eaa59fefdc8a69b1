/* rules_moe.c — the sharding rule `moe` of DeepSeek-V3's mixture-of-experts ops (moe_topk,
 * gather_last and its backward, moe_sort, moe_count, grouped_matmul, grouped_matmul_dw).
 *
 * Rules run only for mesh dims of more than one rank. Replicating every input would be correct,
 * but it would gather every rank's tokens for routing and run every expert on every rank, and the
 * load-balancing counts would no longer be the per-step counts the model's bias update expects
 * once batches split: a silent cost, not an answer. Until expert parallelism lands (all_to_all
 * dispatch, experts sharded on their own mesh dim) the rule refuses, naming the op. */
#include "parallel/rules_internal.h"

#include "graphtrain/gt_graph.h"

gt_status gt_rule_moe(gt_shard_ctx *c, gt_error *err)
{
    const gt_op_info *info = gt_op_get(c->n->op);
    const char *fqn = gt_graph_str(c->g, c->n->fqn);
    return gt_error_set(err, GT_ERR_UNSUPPORTED,
                        "parallelize: %s%s%s on mesh dim %d of %d ranks: DeepSeek-V3's MoE ops "
                        "run on one rank until expert parallelism lands",
                        info ? info->name : "?", fqn[0] ? " at " : "", fqn, c->mesh_dim,
                        c->group_size);
}
