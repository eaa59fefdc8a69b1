/* dce.c — dead-code elimination.
 *
 * Contract
 *   requires   a verified graph (nodes in topological order).
 *   guarantees every remaining node has an output that reaches a graph output, or an op flagged
 *              side-effect or collective (those always stay: a collective must run on every
 *              rank whether or not this rank reads its result); node and value ids are
 *              compacted in order, with every index remapped (node inputs/outputs, value
 *              producers, origins, graph inputs/outputs); graph inputs stay even when unused,
 *              since callers feed inputs by position; a backward node whose origin was removed
 *              gets origin GT_NONE.
 *   numerics   exact: removed nodes computed nothing that is read.
 *
 * One reverse sweep suffices: a node's users all come after it, so by the time the sweep reaches
 * a node every use of its outputs has been decided. */
#include <stdlib.h>

#include "passes/pass_internal.h"

gt_status gt_pass_dce(gt_graph *g, const gt_pass_ctx *ctx, gt_error *err)
{
    (void)ctx;
    (void)err;
    uint8_t *needed = gt_xcalloc((size_t)(g->n_values ? g->n_values : 1), 1);
    uint8_t *keep = gt_xcalloc((size_t)(g->n_nodes ? g->n_nodes : 1), 1);
    for (int32_t k = 0; k < g->n_outputs; k++)
        needed[g->outputs[k].value] = 1;
    bool removed_any = false;
    for (gt_node_id n = g->n_nodes - 1; n >= 0; n--) {
        const gt_node *node = &g->nodes[n];
        const gt_op_info *info = gt_op_get(node->op);
        bool live = info && (info->flags & (GT_OPF_SIDE_EFFECT | GT_OPF_COLLECTIVE));
        for (int k = 0; k < node->n_out && !live; k++)
            live = needed[node->out[k]];
        keep[n] = live;
        removed_any |= !live;
        if (!live) continue;
        for (int k = 0; k < node->n_in; k++)
            needed[node->in[k]] = 1;
    }
    if (removed_any) gt_pass_compact(g, keep);
    free(needed);
    free(keep);
    return GT_OK;
}
