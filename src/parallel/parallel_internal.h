/* parallel_internal.h — what the files of src/parallel share: the sharding-rule interface that
 * parallelize.c (the engine) calls for every node, and the engine calls that rules' expanders use
 * to emit local subgraphs. Not part of the public API. */
#ifndef GRAPHTRAIN_PARALLEL_INTERNAL_H
#define GRAPHTRAIN_PARALLEL_INTERNAL_H

#include "graphtrain/gt_parallel.h"

/* gt_placement.kind of "no preference" (gt_shard_ctx.prefer). */
#define GT_PLACE_NONE 0xff

/* ---------------------------------------------------------------- sharding rules (rules*.c)
 *
 * One rule per op, applied to one mesh dim at a time (placements on different mesh dims are
 * independent for every op of gt_ops.def). Given the placements its inputs have on that dim, the
 * rule says which placements it wants its inputs in (`want`, prefilled with `in`: leave an input
 * alone to keep it) and which placements its outputs then have (`out`, prefilled replicate). The
 * engine converts every input whose placement differs from `want` (collectives or a local slice),
 * emits the node on local shapes, and checks that the shape rule's local output types match the
 * global types divided as `out` says — so a wrong rule is an internal error, never a silent
 * wrong answer.
 *
 * A rule never fails for a legal node: when nothing smarter applies it wants every input
 * replicate (gathering is always correct). It must not want shard(d) of a dim that does not
 * divide (gt_shard_divides). Partial means "sum over the ranks": a rule may only pass partial
 * through ops that are linear in that input (add/sub of two partials, neg, scale, mul/div by a
 * replicate, views, sum, matmul with a replicate other side, ...). */
typedef struct {
    const gt_graph *g; /* the global graph */
    const gt_node *n;  /* the global node */
    int mesh_dim, group_size;
    const gt_placement *in; /* [n->n_in]: the inputs' placements on this mesh dim */
    /* [n->n_in]: the input is a parameter seen through casts and views only. When a weight and
     * an activation cannot both keep their shards, gather the weight (that is FSDP). */
    const bool *weight;
    /* [n->n_out]: the placement the output is wanted in later (a gradient: its parameter's), or
     * kind GT_PLACE_NONE. Rules may use it to produce that placement directly. */
    const gt_placement *prefer;
    /* On the tp mesh dim with sequence parallel: where a rule would turn a partial activation of
     * rank 3 ([b, s, D]) replicate, it wants shard(1) instead (a reduce_scatter along the
     * sequence) when the op can work on sequence blocks (elementwise, rms_norm and its backward).
     * And on the tp dim a weight keeps its (plan's) shard in a matmul conflict: the activation is
     * gathered instead (sequence-parallel all_gather), whereas on the data-parallel dims the
     * weight is gathered (FSDP). */
    bool sequence_parallel;

    /* set by the rule */
    gt_placement want[GT_MAX_IN];
    gt_placement out[GT_MAX_OUT];
    /* The engine multiplies output 0 by out_scale after the node, and input k by in_scale[k]
     * before it (both prefilled 1): a local mean over a dim split n ways is the global mean's
     * partial times n, so the rule makes the output partial with out_scale 1/n. */
    double out_scale;
    double in_scale[GT_MAX_IN];
    /* Vocabulary-parallel on this mesh dim: instead of copying the node, the engine calls the
     * op's expander (gt_par_expand_vocab) once every input is in its wanted placement. */
    bool vocab;
    /* Expert parallel (rules_moe.c): the ep degree when this mesh dim is the expert-parallel
     * group (set by the engine; 1 otherwise). A rule that sets `expert` has the engine call
     * gt_par_expand_moe instead of copying the node. */
    int expert_parallel;
    bool expert;
    /* On the tp dim when ep takes tp ranks (gt_mesh_expert_tp): the routing ops split tokens
     * replicated over tp into the tp ranks' blocks (shard(0) nested at token_order, inside the
     * data-parallel dims' shards), and grouped_matmul sets `expert` here, the ep groups cutting
     * the flattened dp_shard x tp ranks. */
    bool expert_tp;
    int token_order;
    /* When ep takes tp ranks: the placement on this mesh dim (dp_shard or tp) of the routed-expert
     * weights' lean storage, E / (dp_shard x tp) whole experts per rank in the flattened order
     * rank.dp_shard * tp + rank.tp (shard(0) on dp_shard, shard(0) nested inside it on tp:
     * gt_parallel_input_layouts). grouped_matmul wants its weight there (the expander gathers it
     * over efsdp only) and grouped_matmul_dw's gradient lands there (reduce-scattered over
     * efsdp only). Kind GT_PLACE_NONE otherwise. */
    gt_placement expert_store;
    /* [n->n_out], prefilled kind GT_PLACE_NONE: the placement the engine converts output k to
     * right after the node, when the rule's out[k] is only good for the node itself (an
     * embedding that looked up columns goes back to its tokens' split). */
    gt_placement settle[GT_MAX_OUT];
} gt_shard_ctx;

typedef gt_status (*gt_shard_rule)(gt_shard_ctx *c, gt_error *err);

/* The routed-expert weights' lean storage on mesh dim md when ep takes tp ranks (layout.c):
 * shard(0) on dp_shard (replicate when it has one rank) and on tp shard(0) nested inside it, so
 * rank (s, t) holds block s * tp + t; kind GT_PLACE_NONE on the other dims. */
gt_placement gt_parallel_expert_storage(const gt_mesh *m, int md);

/* The rule of op (rules.c). Never NULL for a valid op. */
gt_shard_rule gt_shard_rule_for(gt_op op);

/* True when global dim `dim` of input k (output k when `output`) can be split group_size ways:
 * a constant divisible by it, or symbolic (symbolic dims — batch, seq — are checked when bound). */
bool gt_shard_divides(const gt_shard_ctx *c, bool output, int k, int dim);

static inline gt_placement gt_place_replicate(void)
{
    return (gt_placement){GT_PLACE_REPLICATE, 0, 0, 0};
}
static inline gt_placement gt_place_partial(void)
{
    return (gt_placement){GT_PLACE_PARTIAL, 0, 0, 0};
}
static inline gt_placement gt_place_shard(int dim, int order)
{
    return (gt_placement){GT_PLACE_SHARD, (int8_t)dim, (uint8_t)order, 0};
}
static inline bool gt_place_equal(gt_placement a, gt_placement b)
{
    if (a.kind != b.kind) return false;
    return a.kind != GT_PLACE_SHARD ||
           (a.dim == b.dim && a.order == b.order && a.padded == b.padded);
}

/* ---------------------------------------------------------------- engine calls for expanders */

typedef struct gt_par gt_par; /* parallelize.c */

/* The global graph being parallelized. */
const gt_graph *gt_par_src(const gt_par *p);
/* The graph being built (local types). */
gt_graph *gt_par_dst(gt_par *p);
const gt_mesh *gt_par_mesh(const gt_par *p);
/* Appends a node to the local graph with the current node's metadata (fqn, phase, tags); returns
 * output 0 (outs, when not NULL, gets every output) or GT_NONE with the error recorded. */
gt_value_id gt_par_emit(gt_par *p, gt_op op, const gt_value_id *in, int n_in, const gt_attrs *attrs,
                        gt_value_id *outs);
/* An all-gather over mesh dim `mesh_dim` along tensor dim 0, as start + wait: x [k, ...] ->
 * [n*k, ...]. */
gt_value_id gt_par_all_gather(gt_par *p, gt_value_id x, int mesh_dim);
/* The symbolic coordinate of this rank on mesh dim `mesh_dim` ("rank.tp"), in the local graph. */
gt_expr gt_par_coord(gt_par *p, int mesh_dim);
/* Sets the placement of a local value on every mesh dim (values emitted by gt_par_emit start
 * replicate). */
void gt_par_set_place(gt_par *p, gt_value_id v, const gt_placement place[GT_MESH_MAX_DIMS]);

/* ---------------------------------------------------------------- expanders (rules_vocab.c)
 *
 * Vocabulary-parallel forms on mesh dim `mesh_dim` of: embedding (weight shard(0), ids
 * replicate -> partial output, embedding_shard), embedding_backward (-> shard(0) gradient,
 * embedding_shard_backward), cross_entropy (logits shard(1), targets replicate -> partial loss:
 * logsumexp, all_gather of the per-rank log-sum-exps, their logsumexp, cross_entropy_shard) and
 * cross_entropy_backward (-> shard(1) logits gradient, cross_entropy_shard_backward, reusing the
 * forward's global log-sum-exp when the same logits and targets had one). `in` are the local
 * inputs (already in the wanted placements), `out` receives the local outputs; the engine sets
 * their placements from the rules' `out`. */
gt_status gt_par_expand_vocab(gt_par *p, const gt_node *n, int mesh_dim, const gt_value_id *in,
                              gt_value_id *out, gt_error *err);
/* An all-to-all over mesh dim `mesh_dim`, as start + wait: x [n*k, ...], rows j*k.. go to rank j;
 * rows i*k.. of the result came from rank i. */
gt_value_id gt_par_all_to_all(gt_par *p, gt_value_id x, int mesh_dim);
/* A reduce-scatter over mesh dim `mesh_dim` along tensor dim 0, as start + wait: x [n*k, ...] ->
 * [k, ...], rows r*k.. of the sum over the group (summed in rank order). */
gt_value_id gt_par_reduce_scatter(gt_par *p, gt_value_id x, int mesh_dim);
/* The plan's expert_parallel_capacity_factor (0: worst case). */
double gt_par_capacity_factor(const gt_par *p);

/* ---------------------------------------------------------------- expert parallel (rules_moe*.c)
 *
 * The expert-parallel forms on mesh dim `mesh_dim` (the ep group) of grouped_matmul (rows of the
 * rank's tokens -> rows sent to the experts' ranks, multiplied there, sent back) and
 * grouped_matmul_dw (the rows and their gradients sent to the experts' ranks -> the gradient of
 * the rank's experts, whole). rules_moe_expand.c says how. */
gt_status gt_par_expand_moe(gt_par *p, const gt_node *n, int mesh_dim, const gt_value_id *in,
                            gt_value_id *out, gt_error *err);

/* The engine's memo for the expanders: a local value keyed by (kind, a, b); GT_NONE if absent. */
gt_value_id gt_par_memo_get(gt_par *p, int kind, gt_value_id a, gt_value_id b);
void gt_par_memo_put(gt_par *p, int kind, gt_value_id a, gt_value_id b, gt_value_id v);

#endif
