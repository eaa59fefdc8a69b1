/* memory_policy.c — decide which forward values the backward recomputes (tagging only).
 *
 * Contract
 *   requires   a whole-step graph: forward nodes (phase fwd) followed by backward / optimizer
 *              nodes that read some forward values ("saved" values, held from the forward to the
 *              backward); the nodes of repeated (transformer) blocks carry their block index as
 *              their structural unit (gt_node.unit, set by the model builder).
 *   guarantees every forward node that remat must duplicate carries the tag "recompute", and no
 *              other forward node does (stale "recompute" tags on forward nodes are removed). No
 *              node, value or edge changes: this pass alone is a no-op on the computation.
 *   numerics   exact (tags only; remat, which acts on them, is exact too).
 *
 * Policies (options->memory_policy), applied to the nodes of transformer blocks only; nodes outside
 * blocks (embedding, final norm, output projection, loss) are always saved, as torchtitan wraps
 * only the blocks in activation checkpointing:
 *   none      nothing is recomputed (also the config's "eager": torchtitan's name for no AC).
 *   full      every block node is recomputed except those producing block boundaries: the block's
 *             inputs are the only values the backward keeps of it (torchtitan's full AC).
 *   default   matmul and sdpa outputs (out and lse) are saved, and so are parameter casts: a cast
 *             node whose input is a graph input of kind PARAM (the compute-dtype copy of a weight,
 *             bf16 under mixed precision), so the backward reads the forward's copy instead of
 *             casting every block parameter again. Everything else in a block — elementwise ops
 *             (other casts included), norms, transposes, views — is recomputed from them;
 *             block boundaries are force-saved (torchtitan's selective "op" policy, saving every
 *             matmul). Under FSDP parallelize casts the rank's f32 shard before gathering it, so
 *             the saved copy is the bf16 shard (1/N of the weight) and the gather itself is still
 *             redone in the backward ("fsdp.reshard"); a cast of a gathered value would read no
 *             PARAM input and be recomputed like any other cast. rope and add outputs are saved
 *             too: each takes the place of an operand of its size that nothing else in the
 *             backward reads (the q / k projection; the attention output projection, summed with
 *             the block input, a boundary), so keeping them costs no memory.
 *   budget    the save set comes from a min-cut over the forward/backward boundary (mincut.c).
 *
 * Block boundary: a value produced by a forward node of block N (or outside every block) and read
 * by a forward node of another block or outside every block. That is the residual stream entering
 * each block (the embedding output for block 0) and the last block's output entering the final
 * norm. Its producer is never tagged.
 *
 * Recomputable: a forward node whose op has no random, side-effect or collective flag and whose
 * inputs are all graph inputs or forward outputs (recomputation reads only saved values, params
 * and inputs, never a backward value); and the FSDP parameter gathers parallelize tags
 * "fsdp.reshard" (start and wait: re-gathered in the backward rather than kept). Others are
 * saved whatever the policy.
 *
 * Which nodes get the tag: a node the policy would recompute is tagged only when the backward
 * needs its output, directly or through other tagged nodes. Walking the nodes backwards computes
 * that closure in one pass, since every reader of a node comes after it:
 *   demanded(v) = some non-forward node reads v, or some tagged node reads v
 *   tagged(n)   = policy_recompute(n) and some output of n is demanded. */
#include <stdlib.h>
#include <string.h>

#include "passes/memory_policy_internal.h"

#define GT_RECOMPUTE_TAG "recompute"

const char *gt_memory_policy_name(gt_memory_policy p)
{
    switch (p) {
    case GT_MEMORY_POLICY_NONE:
        return "none";
    case GT_MEMORY_POLICY_FULL:
        return "full";
    case GT_MEMORY_POLICY_DEFAULT:
        return "default";
    case GT_MEMORY_POLICY_BUDGET:
        return "budget";
    }
    return "?";
}

bool gt_remat_can_recompute(const gt_graph *g, gt_node_id n)
{
    const gt_node *nd = &g->nodes[n];
    if (nd->phase != GT_PHASE_FORWARD) return false;
    const gt_op_info *info = gt_op_get(nd->op);
    if (!info || (info->flags & (GT_OPF_RANDOM | GT_OPF_SIDE_EFFECT))) return false;
    /* Collectives are saved, except an FSDP parameter gather under reshard-after-forward
     * (tagged by parallelize): running it again in the backward is what resharding means, and
     * every rank recomputes the same gathers, so the schedules still agree. */
    if ((info->flags & GT_OPF_COLLECTIVE) &&
        !((nd->op == GT_OP_ALL_GATHER_START || nd->op == GT_OP_WAIT) &&
          gt_node_has_tag(g, nd, "fsdp.reshard")))
        return false;
    for (int k = 0; k < nd->n_in; k++) {
        gt_node_id p = g->values[nd->in[k]].producer;
        if (p != GT_NONE && g->nodes[p].phase != GT_PHASE_FORWARD) return false;
    }
    return true;
}

gt_status gt_policy_set_tags(gt_graph *g, const uint8_t *recompute, gt_error *err)
{
    gt_str tag = gt_graph_intern(g, GT_RECOMPUTE_TAG);
    for (gt_node_id n = 0; n < g->n_nodes; n++) {
        gt_node *nd = &g->nodes[n];
        if (nd->phase != GT_PHASE_FORWARD) continue;
        /* drop a stale tag, keeping the others in order */
        int w = 0;
        for (int k = 0; k < nd->n_tags; k++)
            if (nd->tags[k] != tag) nd->tags[w++] = nd->tags[k];
        for (int k = w; k < nd->n_tags; k++)
            nd->tags[k] = 0;
        nd->n_tags = (uint8_t)w;
        if (!recompute[n]) continue;
        if (nd->n_tags >= GT_MAX_TAGS) {
            char buf[512];
            gt_graph_format_node(g, n, buf, sizeof buf);
            return gt_error_set(err, GT_ERR_INVALID,
                                "memory_policy: node %d cannot take the tag '%s': it has %d tags "
                                "already (%s)",
                                n, GT_RECOMPUTE_TAG, GT_MAX_TAGS, buf);
        }
        nd->tags[nd->n_tags++] = tag;
    }
    return GT_OK;
}

/* layer[n] for every node: its block index, -1 outside every block. */
static int *node_layers(const gt_graph *g)
{
    int *layer = gt_xmalloc(((size_t)g->n_nodes + 1) * sizeof *layer);
    for (gt_node_id n = 0; n < g->n_nodes; n++)
        layer[n] = gt_node_block(&g->nodes[n]);
    return layer;
}

uint8_t *gt_policy_boundaries(const gt_graph *g)
{
    int *layer = node_layers(g);
    uint8_t *boundary = gt_xcalloc((size_t)g->n_values + 1, 1);
    for (gt_node_id n = 0; n < g->n_nodes; n++) {
        const gt_node *nd = &g->nodes[n];
        if (nd->phase != GT_PHASE_FORWARD) continue;
        for (int k = 0; k < nd->n_in; k++) {
            gt_node_id p = g->values[nd->in[k]].producer;
            if (p != GT_NONE && g->nodes[p].phase == GT_PHASE_FORWARD && layer[p] != layer[n])
                boundary[nd->in[k]] = 1;
        }
    }
    free(layer);
    return boundary;
}

/* param[v] = 1 for every graph input of kind PARAM (the trainable parameter itself, or under
 * FSDP / TP the rank's local shard of it). */
static uint8_t *param_values(const gt_graph *g)
{
    uint8_t *param = gt_xcalloc((size_t)g->n_values + 1, 1);
    for (int32_t k = 0; k < g->n_inputs; k++)
        if (g->inputs[k].kind == GT_IN_PARAM) param[g->inputs[k].value] = 1;
    return param;
}

/* Would the policy recompute node n (before asking whether the backward needs it)? */
static bool policy_wants(const gt_graph *g, gt_node_id n, gt_memory_policy policy, const int *layer,
                         const uint8_t *boundary, const uint8_t *param)
{
    const gt_node *nd = &g->nodes[n];
    if (layer[n] < 0 || !gt_remat_can_recompute(g, n)) return false;
    for (int k = 0; k < nd->n_out; k++)
        if (boundary[nd->out[k]]) return false;
    if (policy == GT_MEMORY_POLICY_FULL) return true;
    /* default: the recompute column of gt_ops.def says which outputs stay saved (the expensive
     * ops', those that cost no memory to keep, parameters' compute-dtype copies) */
    switch (gt_op_get(nd->op)->recompute) {
    case GT_RECOMPUTE_FLOPS:
    case GT_RECOMPUTE_KEEP:
        return false;
    case GT_RECOMPUTE_KEEP_PARAM:
        return !param[nd->in[0]];
    default:
        return true;
    }
}

void gt_policy_close(const gt_graph *g, const uint8_t *wants, uint8_t *recompute)
{
    uint8_t *demanded = gt_xcalloc((size_t)g->n_values + 1, 1);
    for (gt_node_id n = 0; n < g->n_nodes; n++) {
        const gt_node *nd = &g->nodes[n];
        if (nd->phase == GT_PHASE_FORWARD) continue;
        for (int k = 0; k < nd->n_in; k++)
            demanded[nd->in[k]] = 1;
    }
    for (gt_node_id n = g->n_nodes - 1; n >= 0; n--) {
        const gt_node *nd = &g->nodes[n];
        recompute[n] = 0;
        if (nd->phase != GT_PHASE_FORWARD || !wants[n]) continue;
        bool needed = false;
        for (int k = 0; k < nd->n_out; k++)
            needed |= demanded[nd->out[k]] != 0;
        if (!needed) continue;
        recompute[n] = 1;
        for (int k = 0; k < nd->n_in; k++)
            demanded[nd->in[k]] = 1;
    }
    free(demanded);
}

gt_status gt_pass_memory_policy(gt_graph *g, const gt_pass_ctx *ctx, gt_error *err)
{
    gt_memory_policy policy =
        ctx && ctx->options ? ctx->options->memory_policy : GT_MEMORY_POLICY_NONE;
    if (policy == GT_MEMORY_POLICY_BUDGET) return gt_policy_budget(g, ctx->options, err);
    uint8_t *recompute = gt_xcalloc((size_t)g->n_nodes + 1, 1);
    gt_status st = GT_OK;
    if (policy == GT_MEMORY_POLICY_FULL || policy == GT_MEMORY_POLICY_DEFAULT) {
        int *layer = node_layers(g);
        uint8_t *boundary = gt_policy_boundaries(g);
        uint8_t *param = param_values(g);
        uint8_t *wants = gt_xcalloc((size_t)g->n_nodes + 1, 1);
        for (gt_node_id n = 0; n < g->n_nodes; n++)
            wants[n] = policy_wants(g, n, policy, layer, boundary, param);
        gt_policy_close(g, wants, recompute);
        free(wants);
        free(param);
        free(boundary);
        free(layer);
    } else if (policy != GT_MEMORY_POLICY_NONE) {
        st = gt_error_set(err, GT_ERR_INVALID, "memory_policy: unknown policy %d", (int)policy);
    }
    if (st == GT_OK) st = gt_policy_set_tags(g, recompute, err);
    free(recompute);
    return st;
}
