/* graph_edit.c — value replacement and node removal with index compaction, shared by the passes.
 *
 * Compaction keeps the relative order of nodes and of values, so a compacted graph is still in
 * topological order and its listing diffs cleanly against the original. */
#include <stdlib.h>
#include <string.h>

#include "passes/pass_internal.h"

gt_value_id *gt_pass_repl_new(const gt_graph *g)
{
    gt_value_id *repl = gt_xmalloc((size_t)(g->n_values ? g->n_values : 1) * sizeof *repl);
    for (gt_value_id v = 0; v < g->n_values; v++)
        repl[v] = v;
    return repl;
}

gt_value_id gt_pass_repl_find(const gt_value_id *repl, gt_value_id v)
{
    while (repl[v] != v)
        v = repl[v];
    return v;
}

bool gt_pass_repl_node_inputs(gt_graph *g, gt_node_id n, const gt_value_id *repl)
{
    gt_node *node = &g->nodes[n];
    bool changed = false;
    for (int k = 0; k < node->n_in; k++) {
        gt_value_id w = gt_pass_repl_find(repl, node->in[k]);
        changed |= w != node->in[k];
        node->in[k] = w;
    }
    return changed;
}

void gt_pass_repl_outputs(gt_graph *g, const gt_value_id *repl)
{
    for (int32_t k = 0; k < g->n_outputs; k++)
        g->outputs[k].value = gt_pass_repl_find(repl, g->outputs[k].value);
}

bool gt_pass_type_equal(const gt_type *a, const gt_type *b)
{
    return gt_type_equal(a, b);
}

bool gt_pass_shape_matches(gt_graph *g, const gt_node *proposed, const gt_node *stored)
{
    const gt_op_info *info = gt_op_get(proposed->op);
    if (!info) return false;
    gt_type types[GT_MAX_OUT];
    memset(types, 0, sizeof types);
    int n_out = 0;
    /* A proposal the shape rule rejects is simply not taken; its message is not wanted. */
    gt_error scratch = {0};
    if (info->shape(g, proposed, types, &n_out, &scratch) != GT_OK) return false;
    if (n_out != stored->n_out) return false;
    for (int k = 0; k < n_out; k++)
        if (!gt_pass_type_equal(&types[k], &g->values[stored->out[k]].type)) return false;
    return true;
}

void gt_pass_place_node(gt_graph *g, gt_node_id at, const gt_node *nd)
{
    g->nodes[at] = *nd;
    for (int k = 0; k < nd->n_out; k++) {
        g->values[nd->out[k]].producer = at;
        g->values[nd->out[k]].producer_slot = k;
    }
}

void gt_pass_compact(gt_graph *g, const uint8_t *keep)
{
    int32_t nn = g->n_nodes, nv = g->n_values;
    gt_node_id *node_map = gt_xmalloc((size_t)(nn ? nn : 1) * sizeof *node_map);
    gt_value_id *value_map = gt_xmalloc((size_t)(nv ? nv : 1) * sizeof *value_map);
    gt_node_id next_node = 0;
    for (gt_node_id n = 0; n < nn; n++)
        node_map[n] = keep[n] ? next_node++ : GT_NONE;
    /* A value survives when it is a graph input (producer none) or its producer survives. */
    gt_value_id next_value = 0;
    for (gt_value_id v = 0; v < nv; v++) {
        gt_node_id p = g->values[v].producer;
        value_map[v] = (p == GT_NONE || keep[p]) ? next_value++ : GT_NONE;
    }
    /* New ids never exceed old ones, so moving entries down in ascending order is safe. */
    for (gt_value_id v = 0; v < nv; v++) {
        if (value_map[v] == GT_NONE) continue;
        gt_value val = g->values[v];
        if (val.producer != GT_NONE) val.producer = node_map[val.producer];
        g->values[value_map[v]] = val;
    }
    for (gt_node_id n = 0; n < nn; n++) {
        if (!keep[n]) continue;
        gt_node node = g->nodes[n];
        for (int k = 0; k < node.n_in; k++) {
            GT_CHECK(value_map[node.in[k]] != GT_NONE);
            node.in[k] = value_map[node.in[k]];
        }
        for (int k = 0; k < node.n_out; k++)
            node.out[k] = value_map[node.out[k]];
        if (node.origin != GT_NONE) node.origin = node_map[node.origin];
        g->nodes[node_map[n]] = node;
    }
    for (int32_t k = 0; k < g->n_inputs; k++)
        g->inputs[k].value = value_map[g->inputs[k].value];
    for (int32_t k = 0; k < g->n_outputs; k++) {
        GT_CHECK(value_map[g->outputs[k].value] != GT_NONE);
        g->outputs[k].value = value_map[g->outputs[k].value];
    }
    g->n_nodes = next_node;
    g->n_values = next_value;
    /* The builder stamps cur_origin on new nodes; keep it pointing at the same node or none. */
    if (g->cur_origin != GT_NONE && g->cur_origin < nn) g->cur_origin = node_map[g->cur_origin];
    free(node_map);
    free(value_map);
}

/* Moves the nodes into `order` (old ids) and remaps producers and origins (pass_internal.h). */
void gt_pass_apply_order(gt_graph *g, const gt_node_id *order)
{
    int32_t n = g->n_nodes;
    gt_node_id *pos = gt_xmalloc(((size_t)n + 1) * sizeof *pos);
    gt_node *moved = gt_xmalloc(((size_t)n + 1) * sizeof *moved);
    for (int32_t k = 0; k < n; k++)
        pos[order[k]] = k;
    for (int32_t k = 0; k < n; k++) {
        moved[k] = g->nodes[order[k]];
        if (moved[k].origin != GT_NONE) moved[k].origin = pos[moved[k].origin];
    }
    memcpy(g->nodes, moved, (size_t)n * sizeof *moved);
    for (gt_value_id v = 0; v < g->n_values; v++)
        if (g->values[v].producer != GT_NONE) g->values[v].producer = pos[g->values[v].producer];
    if (g->cur_origin >= 0 && g->cur_origin < n) g->cur_origin = pos[g->cur_origin];
    free(moved);
    free(pos);
}

int32_t gt_pass_fuse_each(gt_graph *g, gt_pass_fuse_fn fuse)
{
    int32_t nn = g->n_nodes, fused = 0;
    gt_pass_fuse_ctx cx;
    gt_pass_uses_build(g, &cx.uses);
    cx.is_out = gt_xcalloc((size_t)g->n_values + 1, 1);
    for (int32_t k = 0; k < g->n_outputs; k++)
        cx.is_out[g->outputs[k].value] = 1;
    cx.keep = gt_xmalloc((size_t)nn + 1);
    memset(cx.keep, 1, (size_t)nn + 1);
    for (gt_node_id m = 0; m < nn; m++)
        if (cx.keep[m] && fuse(g, &cx, m)) fused++;
    if (fused > 0) gt_pass_compact(g, cx.keep);
    free(cx.keep);
    free(cx.is_out);
    gt_pass_uses_free(&cx.uses);
    return fused;
}
