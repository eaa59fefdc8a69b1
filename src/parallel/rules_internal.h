/* rules_internal.h — what rules.c (dispatch, elementwise, reductions, views) and rules_nn.c (the
 * neural-network ops) share: placement predicates and the small moves every rule makes. Private to
 * src/parallel/rules*.c. */
#ifndef GRAPHTRAIN_PARALLEL_RULES_INTERNAL_H
#define GRAPHTRAIN_PARALLEL_RULES_INTERNAL_H

#include "parallel/parallel_internal.h"

static inline bool gt_is_r(gt_placement p)
{
    return p.kind == GT_PLACE_REPLICATE;
}
static inline bool gt_is_p(gt_placement p)
{
    return p.kind == GT_PLACE_PARTIAL;
}
static inline bool gt_is_s(gt_placement p)
{
    return p.kind == GT_PLACE_SHARD;
}
static inline bool gt_is_s_at(gt_placement p, int dim)
{
    return p.kind == GT_PLACE_SHARD && p.dim == dim;
}
/* p (a shard) moved to tensor dim `dim`, keeping its nesting order. */
static inline gt_placement gt_shard_moved(gt_placement p, int dim)
{
    p.kind = GT_PLACE_SHARD;
    p.dim = (int8_t)dim;
    return p;
}

static inline const gt_type *gt_rule_in_type(const gt_shard_ctx *c, int k)
{
    return &c->g->values[c->n->in[k]].type;
}
static inline const gt_type *gt_rule_out_type(const gt_shard_ctx *c, int k)
{
    return &c->g->values[c->n->out[k]].type;
}

/* Every input replicate (then every output is replicate: the rules' fast path). */
bool gt_rule_all_replicate(const gt_shard_ctx *c);
/* Wants every input replicate; every output replicate. Always correct. */
gt_status gt_rule_gather_all(gt_shard_ctx *c);
/* True when the expression is the constant 1 (a broadcast dim). */
bool gt_rule_is_one(const gt_shard_ctx *c, gt_expr e);

/* Sequence parallel applies to input k (output k when `output`): the flag is set (tp mesh dim),
 * the tensor is an activation [b, s, D] (rank 3) and s splits. A partial one then goes to S(1),
 * a reduce_scatter along the sequence, where a rule would otherwise want it replicate. */
bool gt_rule_sequence_rows(const gt_shard_ctx *c, bool output, int k);

/* The neural-network rules (rules_nn.c), named by gt_ops.def's rule column. */
gt_status gt_rule_matmul(gt_shard_ctx *c, gt_error *err);
gt_status gt_rule_rms_norm(gt_shard_ctx *c, gt_error *err);
gt_status gt_rule_rms_norm_backward(gt_shard_ctx *c, gt_error *err);
gt_status gt_rule_rope(gt_shard_ctx *c, gt_error *err);
gt_status gt_rule_sdpa(gt_shard_ctx *c, gt_error *err);
gt_status gt_rule_softmax(gt_shard_ctx *c, gt_error *err);
gt_status gt_rule_softmax_backward(gt_shard_ctx *c, gt_error *err);
gt_status gt_rule_embedding(gt_shard_ctx *c, gt_error *err);
gt_status gt_rule_embedding_backward(gt_shard_ctx *c, gt_error *err);
gt_status gt_rule_cross_entropy(gt_shard_ctx *c, gt_error *err);
gt_status gt_rule_cross_entropy_backward(gt_shard_ctx *c, gt_error *err);
gt_status gt_rule_adamw(gt_shard_ctx *c, gt_error *err);
/* DeepSeek-V3's MoE ops (rules_moe.c), and the embeddings that dispatch and combine routed rows. */
gt_status gt_rule_moe(gt_shard_ctx *c, gt_error *err);
/* Value v of global graph g is an output of moe_sort (routed ids: the rank's own row numbers). */
bool gt_rule_from_moe_sort(const gt_graph *g, gt_value_id v);

#endif
