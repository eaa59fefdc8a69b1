/* fusion_loss.c — the fusion pass's step for the loss: cross_entropy and the
 * cross_entropy_backward of the same logits become one cross_entropy_with_grad node (gt_ops.def),
 * which reads each row of logits for its statistics once and gives both the loss and dlogits.
 *
 * Why: the loss reads the [tokens, vocab] logits once (row max and sum of exponentials) and the
 * backward reads them twice more (the same statistics again, then each dlogit); at llama3 1B the
 * logits are 16384 x 128256 bf16 = 4.2 GB, so the forward's read alone is ~1 ms per step.
 *
 * Rule: a cross_entropy node c (logits, targets) and a cross_entropy_backward node b (the same
 * logits and targets, the same ignore_index, dloss) with c before b merge when no input of b is
 * computed from c's loss (dloss is the backward's seed, not the loss). The fused node (logits,
 * targets, dloss) -> (loss, dlogits) takes b's place (fqn, phase, origin, tags), where all three
 * inputs exist; c is removed, so the loss is produced later than before. Nodes that read the
 * loss before b (under data parallelism the forward scales it by 1 / dp right away) move, with
 * whatever reads them in turn, to just after the fused node, in their order: the graph is
 * reordered by position keys (gt_pass_order_by_keys), so every other node keeps its place.
 * Collectives between c and b (FSDP's all-gathers for the backward) do not matter.
 * Exact: the kernels compute each row's statistics, loss and dlogits with the two ops' code. */
#include <stdlib.h>
#include <string.h>

#include "passes/pass_internal.h"

/* True when some input of b is computed, through nodes between c and b, from c's output. */
static bool reads_loss(const gt_graph *g, gt_node_id c, gt_node_id b)
{
    uint8_t *dep = gt_xcalloc((size_t)(b - c) + 1, 1); /* dep[x - c]: x is computed from c */
    dep[0] = 1;
    bool found = false;
    for (gt_node_id x = c + 1; x <= b && !found; x++) {
        const gt_node *nx = &g->nodes[x];
        for (int k = 0; k < nx->n_in && !dep[x - c]; k++) {
            gt_node_id p = g->values[nx->in[k]].producer;
            dep[x - c] = p != GT_NONE && p >= c && dep[p - c];
        }
        found = x == b && dep[x - c];
    }
    free(dep);
    return found;
}

static bool fuse(gt_graph *g, gt_pass_fuse_ctx *cx, gt_node_id b)
{
    const gt_node *nb = &g->nodes[b];
    if (nb->op != GT_OP_CROSS_ENTROPY_BACKWARD || nb->n_in != 3) return false;
    /* the cross_entropy reading the same logits: among the logits' readers */
    const gt_pass_uses *u = &cx->uses;
    gt_value_id logits = nb->in[0];
    for (int32_t e = u->first[logits]; e < u->first[logits + 1]; e++) {
        gt_node_id c = u->node[e];
        const gt_node *nc = &g->nodes[c];
        if (c >= b || !cx->keep[c] || nc->op != GT_OP_CROSS_ENTROPY || nc->in[0] != logits ||
            nc->in[1] != nb->in[1] || nc->attrs.i[0] != nb->attrs.i[0] || reads_loss(g, c, b))
            continue;
        gt_node f = *nb;
        f.op = GT_OP_CROSS_ENTROPY_WITH_GRAD;
        f.n_out = 2;
        f.out[0] = nc->out[0];
        f.out[1] = nb->out[0];
        if (!gt_pass_shape_matches(g, &f, &f)) continue;
        gt_pass_place_node(g, b, &f);
        cx->keep[c] = 0;
        return true;
    }
    return false;
}

gt_status gt_fusion_loss(gt_graph *g, gt_error *err)
{
    if (gt_pass_fuse_each(g, fuse) == 0) return GT_OK;
    /* the loss's early readers wait for the fused node; the rest stays where it is */
    gt_pass_key *keys = gt_xmalloc(((size_t)g->n_nodes + 1) * sizeof *keys);
    for (gt_node_id n = 0; n < g->n_nodes; n++)
        keys[n] = (gt_pass_key){n, GT_KEY_STAY};
    gt_status st = gt_pass_order_by_keys(g, keys, NULL, "fusion (loss)", err);
    free(keys);
    return st;
}
