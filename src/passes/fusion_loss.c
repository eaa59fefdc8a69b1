/* fusion_loss.c — the fusion pass's step for the loss: cross_entropy and the
 * cross_entropy_backward of the same logits become one cross_entropy_with_grad node (gt_ops.def),
 * which reads each row of logits for its statistics once and gives both the loss and dlogits.
 *
 * Why: the loss reads the [tokens, vocab] logits once (row max and sum of exponentials) and the
 * backward reads them twice more (the same statistics again, then each dlogit); at llama3 1B the
 * logits are 16384 x 128256 bf16 = 4.2 GB, so the forward's read alone is ~1 ms per step.
 *
 * Rule: a cross_entropy node c (logits, targets) and a cross_entropy_backward node b (the same
 * logits and targets, the same ignore_index, dloss) with c before b merge when every node reading
 * c's loss comes after b and no collective lies between c and b. The fused node (logits, targets,
 * dloss) -> (loss, dlogits) takes b's place (fqn, phase, origin, tags), where all three inputs
 * exist; c is removed, so the loss is produced later than before but before its first reader.
 * Exact: the kernels compute each row's statistics, loss and dlogits with the two ops' code. */
#include <stdlib.h>
#include <string.h>

#include "passes/pass_internal.h"

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
            nc->in[1] != nb->in[1] || nc->attrs.i[0] != nb->attrs.i[0] ||
            cx->collectives[c + 1] != cx->collectives[b])
            continue;
        gt_value_id loss = nc->out[0];
        bool late = true;
        for (int32_t k = u->first[loss]; k < u->first[loss + 1]; k++)
            late = late && u->node[k] > b;
        if (!late) continue;
        gt_node f = *nb;
        f.op = GT_OP_CROSS_ENTROPY_WITH_GRAD;
        f.n_out = 2;
        f.out[0] = loss;
        f.out[1] = nb->out[0];
        if (!gt_pass_shape_matches(g, &f, &f)) continue;
        gt_pass_place_node(g, b, &f);
        cx->keep[c] = 0;
        return true;
    }
    return false;
}

int32_t gt_fusion_loss(gt_graph *g)
{
    return gt_pass_fuse_each(g, fuse);
}
