/* memory_policy_internal.h — what memory_policy.c, mincut.c and remat.c share. Not public API. */
#ifndef GRAPHTRAIN_MEMORY_POLICY_INTERNAL_H
#define GRAPHTRAIN_MEMORY_POLICY_INTERNAL_H

#include "passes/pass_internal.h"

/* The repeated block a node belongs to (its structural unit when >= 0); -1 outside every block. */
static inline int gt_node_block(const gt_node *n)
{
    return n->unit >= 0 ? n->unit : -1;
}

/* A forward node remat may duplicate: no random, side-effect or collective flag (but an FSDP
 * gather tagged "fsdp.reshard"), and every input a graph input or a forward node's output. */
bool gt_remat_can_recompute(const gt_graph *g, gt_node_id n);

/* boundary[v] = 1 for every block boundary value (memory_policy.c); caller frees. */
uint8_t *gt_policy_boundaries(const gt_graph *g);

/* recompute[n] = wants[n] and n's output is needed by the backward, directly or through other
 * recompute nodes (arrays of n_nodes). */
void gt_policy_close(const gt_graph *g, const uint8_t *wants, uint8_t *recompute);

/* Sets the "recompute" tag on exactly the forward nodes with recompute[n] != 0. */
gt_status gt_policy_set_tags(gt_graph *g, const uint8_t *recompute, gt_error *err);

/* The budget policy (mincut.c): chooses and tags, or explains why the budget cannot be met. */
gt_status gt_policy_budget(gt_graph *g, const gt_pass_options *o, gt_error *err);

#endif
