/* remat.c — rematerialization: recompute tagged forward chains inside the backward.
 *
 * Contract
 *   requires   forward nodes tagged "recompute" (memory_policy.c, or by hand) are recomputable:
 *              no random, side-effect or collective op, every input a graph input or a forward
 *              output. A tagged node that is not is refused (GT_ERR_INVALID naming it).
 *   guarantees for every non-forward node b that reads a value v produced by a tagged forward node:
 *              b reads a copy of v instead. The copy comes from duplicating the chain of tagged
 *              forward nodes behind v (transitively, stopping at untagged forward values, params
 *              and inputs: the saved values), placed right before the first non-forward node
 *              that needs any of it. Each tagged node is copied at most once: a later backward use
 *              shares the copies made for an earlier one (one chain per first use, not per use —
 *              the copies of a block are made once, when its backward starts, like torch's
 *              checkpoint). Collectives are never tagged (a start/wait pair is not recomputed:
 *              its output is saved), and a wait's input 1 always names its start's input.
 *              Copies keep op, attributes, fqn and tags ("recompute"), and get phase bwd and
 *              origin = the node they copy. Forward uses and graph outputs keep the
 *              originals, so an original's liveness ends in the forward; an original nothing reads
 *              any more is left for DCE. Node order stays topological; value ids of the
 *              originals do not change (copies' values are appended).
 *   numerics   exact: a copy runs the same op with the same attributes on the same input bits
 *              (saved values are the originals' buffers, recomputed inputs are bitwise copies by
 *              induction), and every kernel is deterministic.
 *
 * Cost: O(nodes + values + copies · log copies). */
#include <stdlib.h>
#include <string.h>

#include "passes/memory_policy_internal.h"

static int cmp_node_id(const void *a, const void *b)
{
    gt_node_id x = *(const gt_node_id *)a, y = *(const gt_node_id *)b;
    return (x > y) - (x < y);
}

/* A wait's input 1 is its start's input, listed only to keep that very buffer alive while the
 * collective reads it: it follows whatever the start reads (a recomputed copy when the start is a
 * backward node that remat rewired, the original when the start is in the forward), never a copy
 * of its own. */
static bool is_wait_keepalive(const gt_node *nd, int k)
{
    return nd->op == GT_OP_WAIT && k == 1;
}

static gt_value_id start_input(const gt_graph *g, const gt_node *wait)
{
    gt_node_id start = g->values[wait->in[0]].producer;
    GT_CHECK(start != GT_NONE);
    return g->nodes[start].in[0];
}

/* Refuses a tagged node remat cannot duplicate. */
static gt_status check_tagged(const gt_graph *g, gt_node_id n, gt_error *err)
{
    if (gt_remat_can_recompute(g, n)) return GT_OK;
    char buf[512];
    gt_graph_format_node(g, n, buf, sizeof buf);
    const gt_node *nd = &g->nodes[n];
    const gt_op_info *info = gt_op_get(nd->op);
    const char *why = "it reads a value produced outside the forward";
    if (info && (info->flags & GT_OPF_RANDOM))
        why = "its op is random";
    else if (info && (info->flags & GT_OPF_SIDE_EFFECT))
        why = "its op has side effects";
    else if (info && (info->flags & GT_OPF_COLLECTIVE))
        why = "its op is a collective";
    return gt_error_set(err, GT_ERR_INVALID,
                        "remat: node %d is tagged \"recompute\" but cannot be recomputed: %s (%s)",
                        n, why, buf);
}

typedef struct {
    gt_graph *g;
    const uint8_t *tagged; /* per original node */
    gt_node_id *copy_of;   /* per original node: its copy, GT_NONE until made */
    gt_value_id *map;      /* per original value: its copy's value, GT_NONE if none */
    gt_node_id *stack, *chain;
    uint8_t *marked;
} remat_state;

/* Copies the not-yet-copied tagged chain behind node p, in original (topological) order. */
static gt_status copy_chain(remat_state *s, gt_node_id p, gt_error *err)
{
    gt_graph *g = s->g;
    int32_t n_stack = 0, n_chain = 0;
    s->stack[n_stack++] = p;
    s->marked[p] = 1;
    while (n_stack) {
        gt_node_id n = s->stack[--n_stack];
        s->chain[n_chain++] = n;
        const gt_node *nd = &g->nodes[n];
        for (int k = 0; k < nd->n_in; k++) {
            gt_node_id q = g->values[nd->in[k]].producer;
            if (q == GT_NONE || !s->tagged[q] || s->copy_of[q] != GT_NONE || s->marked[q]) continue;
            s->marked[q] = 1;
            s->stack[n_stack++] = q;
        }
    }
    qsort(s->chain, (size_t)n_chain, sizeof *s->chain, cmp_node_id);
    for (int32_t k = 0; k < n_chain; k++) {
        gt_node_id n = s->chain[k];
        GT_TRY(gt_graph_copy_region(g, g, n, n + 1, s->map, err));
        gt_node_id c = g->n_nodes - 1;
        g->nodes[c].phase = GT_PHASE_BACKWARD;
        g->nodes[c].origin = n;
        s->copy_of[n] = c;
        s->marked[n] = 0;
    }
    return GT_OK;
}

gt_status gt_pass_remat(gt_graph *g, const gt_pass_ctx *ctx, gt_error *err)
{
    (void)ctx;
    int32_t n0 = g->n_nodes;
    uint8_t *tagged = gt_xcalloc((size_t)n0 + 1, 1);
    int32_t n_tagged = 0;
    for (gt_node_id n = 0; n < n0; n++) {
        const gt_node *nd = &g->nodes[n];
        if (nd->phase != GT_PHASE_FORWARD || !gt_node_has_tag(g, nd, "recompute")) continue;
        gt_status st = check_tagged(g, n, err);
        if (st != GT_OK) {
            free(tagged);
            return st;
        }
        tagged[n] = 1;
        n_tagged++;
    }
    if (!n_tagged) {
        free(tagged);
        return GT_OK;
    }
    remat_state s = {.g = g, .tagged = tagged};
    s.copy_of = gt_xmalloc(((size_t)n0 + 1) * sizeof *s.copy_of);
    s.map = gt_xmalloc(((size_t)g->n_values + 1) * sizeof *s.map);
    s.stack = gt_xmalloc(((size_t)n0 + 1) * sizeof *s.stack);
    s.chain = gt_xmalloc(((size_t)n0 + 1) * sizeof *s.chain);
    s.marked = gt_xcalloc((size_t)n0 + 1, 1);
    /* insert_before[c - n0] = the original node copy c goes right before */
    gt_node_id *insert_before = gt_xmalloc(((size_t)n_tagged + 1) * sizeof *insert_before);
    for (gt_node_id n = 0; n < n0; n++)
        s.copy_of[n] = GT_NONE;
    for (gt_value_id v = 0; v < g->n_values; v++)
        s.map[v] = GT_NONE;

    gt_status st = GT_OK;
    for (gt_node_id b = 0; b < n0 && st == GT_OK; b++) {
        if (g->nodes[b].phase == GT_PHASE_FORWARD) continue;
        int32_t before = g->n_nodes;
        for (int k = 0; k < g->nodes[b].n_in && st == GT_OK; k++) {
            if (is_wait_keepalive(&g->nodes[b], k)) continue;
            gt_node_id p = g->values[g->nodes[b].in[k]].producer;
            if (p != GT_NONE && p < n0 && tagged[p] && s.copy_of[p] == GT_NONE)
                st = copy_chain(&s, p, err);
        }
        for (gt_node_id c = before; c < g->n_nodes; c++)
            insert_before[c - n0] = b;
        gt_node *nd = &g->nodes[b];
        for (int k = 0; k < nd->n_in; k++) {
            if (is_wait_keepalive(nd, k)) {
                nd->in[1] = start_input(g, nd);
                continue;
            }
            gt_node_id p = g->values[nd->in[k]].producer;
            if (p != GT_NONE && p < n0 && tagged[p]) nd->in[k] = s.map[nd->in[k]];
        }
    }
    if (st == GT_OK) {
        /* copies right before the node that first needed them, in the order they were made */
        gt_node_id *order = gt_xmalloc(((size_t)g->n_nodes + 1) * sizeof *order);
        int32_t k = 0;
        gt_node_id c = n0;
        for (gt_node_id b = 0; b < n0; b++) {
            while (c < g->n_nodes && insert_before[c - n0] == b)
                order[k++] = c++;
            order[k++] = b;
        }
        GT_CHECK(k == g->n_nodes && c == g->n_nodes);
        gt_pass_apply_order(g, order);
        free(order);
    }
    free(insert_before);
    free(s.marked);
    free(s.chain);
    free(s.stack);
    free(s.map);
    free(s.copy_of);
    free(tagged);
    return st;
}
