/* schedule.c — the order in which a program runs the graph's nodes (gt_program.h).
 *
 * Today the schedule is the graph's own node order (the IR keeps nodes topologically sorted), made
 * an explicit array so that later passes (prefetch, overlap, memory-aware reordering) can hand the
 * planner and the lowering another order without renumbering the graph. gt_schedule_check is what
 * any such order must satisfy: a permutation of the nodes in which every input is a graph input or
 * the output of an earlier node. */
#include <stdlib.h>
#include <string.h>

#include "graphtrain/gt_program.h"

gt_status gt_schedule_check(const gt_graph *g, const gt_node_id *order, int32_t n, gt_error *err)
{
    if (n != g->n_nodes)
        return gt_error_set(err, GT_ERR_INVALID, "schedule: %d entries for a graph of %d nodes", n,
                            g->n_nodes);
    uint8_t *seen = gt_xcalloc((size_t)g->n_nodes + 1, 1);
    uint8_t *defined = gt_xcalloc((size_t)g->n_values + 1, 1);
    gt_status st = GT_OK;
    for (int32_t k = 0; k < g->n_inputs; k++)
        if (g->inputs[k].value >= 0 && g->inputs[k].value < g->n_values)
            defined[g->inputs[k].value] = 1;
    for (int32_t k = 0; k < n && st == GT_OK; k++) {
        gt_node_id id = order[k];
        if (id < 0 || id >= g->n_nodes || seen[id]) {
            st = gt_error_set(err, GT_ERR_INVALID, "schedule: entry %d names node %%%d, %s", k, id,
                              id < 0 || id >= g->n_nodes ? "out of range" : "already scheduled");
            break;
        }
        seen[id] = 1;
        const gt_node *nd = &g->nodes[id];
        for (int j = 0; j < nd->n_in && st == GT_OK; j++) {
            gt_value_id v = nd->in[j];
            if (v < 0 || v >= g->n_values || !defined[v])
                st = gt_error_set(err, GT_ERR_INVALID,
                                  "schedule: node %%%d (%s) at position %d reads %%%d before it is "
                                  "defined",
                                  id, gt_op_get(nd->op)->name, k, v);
        }
        for (int j = 0; j < nd->n_out && st == GT_OK; j++)
            if (nd->out[j] >= 0 && nd->out[j] < g->n_values) defined[nd->out[j]] = 1;
    }
    free(seen);
    free(defined);
    return st;
}

gt_status gt_schedule_build(const gt_graph *g, gt_node_id **order, int32_t *n, gt_error *err)
{
    gt_node_id *o = gt_xmalloc(((size_t)g->n_nodes + 1) * sizeof *o);
    for (gt_node_id k = 0; k < g->n_nodes; k++)
        o[k] = k;
    gt_status st = gt_schedule_check(g, o, g->n_nodes, err);
    if (st != GT_OK) {
        free(o);
        return st;
    }
    *order = o;
    *n = g->n_nodes;
    return GT_OK;
}
