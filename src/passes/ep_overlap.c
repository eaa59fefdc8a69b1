/* ep_overlap.c — the EP overlap schedule: in each block the chunking pass split (ep_chunk.c), the
 * two chunks' nodes interleaved so that one chunk's token exchange is in flight while the other
 * chunk computes (torchtitan's ep_overlap_schedule_pass). Exact: only the order changes.
 *
 * A node belongs to chunk c when it carries the tag "chunk.c" (the chunking pass's forward copies,
 * remat's copies of them, the nodes parallelize expands them into), when its origin does (their
 * backward), or when every input from a chunk comes from chunk c (a redistribution parallelize
 * inserted, its wait) — unless it reads both chunks, or only parameters, or makes a parameter's
 * gradient out of no chunk's values (chunks_of: these are shared, whatever origin they carry). For
 * each block (unit) and phase, the span from the first to the last node of either chunk is
 * rescheduled by a list scheduler over its dependencies with the priority (segment, chunk rank,
 * original position) where a chunk node's segment counts its own chunk's token exchanges (the
 * all-to-all starts parallelize tags GT_TAG_TOKEN_EXCHANGE) before it in the original order, and
 * the chunk rank puts chunk 0 first in the forward and chunk 1 first in the backward (the backward
 * runs the chunks in reverse). So the order becomes: chunk A's nodes up to its first collective
 * start, chunk B's up to its first, A's up to its second (its experts run while B's dispatch
 * all-to-all is in flight), and so on through combine. Other nodes in the span (the chunks' shared
 * nodes — the slices of a join's gradient both chunks wait for —, another block's prefetched FSDP
 * gather) and the chunks' collectives other than the token exchange (a gradient's reduce-scatter
 * after both chunks added into it): waits as late as they can, the rest as early as they are ready.
 * Each block's two chunks must start as many token exchanges in each phase, else the block is
 * refused by name. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "passes/pass_internal.h"

/* The chunk of node id: 0, 1, or -1. */
static int chunk_of(const gt_graph *g, gt_node_id id)
{
    const gt_node *n = &g->nodes[id];
    for (int hop = 0; hop < 2 && n; hop++) {
        if (gt_node_has_tag(g, n, GT_CHUNK_TAG_0)) return 0;
        if (gt_node_has_tag(g, n, GT_CHUNK_TAG_1)) return 1;
        n = n->origin != GT_NONE ? &g->nodes[n->origin] : NULL;
    }
    return -1;
}

typedef struct {
    int64_t seg, rank;
    gt_node_id pos;
} prio;

static bool before(const prio *a, const prio *b)
{
    if (a->seg != b->seg) return a->seg < b->seg;
    if (a->rank != b->rank) return a->rank < b->rank;
    return a->pos < b->pos;
}

/* Reschedules nodes lo .. hi (inclusive) of block u in phase ph into order[lo .. hi]. */
static gt_status schedule_span(const gt_graph *g, const int8_t *chunk, gt_node_id lo, gt_node_id hi,
                               gt_phase ph, int32_t u, gt_node_id *order, gt_error *err)
{
    int32_t n = hi - lo + 1;
    prio *pr = gt_xmalloc((size_t)n * sizeof *pr);
    int32_t *missing = gt_xcalloc((size_t)n, sizeof *missing);
    uint8_t *done = gt_xcalloc((size_t)n, 1);
    int64_t seg[2] = {0, 0};
    /* the collectives each chunk starts, in order, to check that they match */
    int32_t n_starts[2] = {0, 0};
    gt_op *starts[2] = {gt_xmalloc((size_t)n * sizeof(gt_op)),
                        gt_xmalloc((size_t)n * sizeof(gt_op))};
    for (gt_node_id id = lo; id <= hi; id++) {
        const gt_node *nd = &g->nodes[id];
        int c = nd->phase == ph ? chunk[id] : -1; /* another phase's node: no chunk's here */
        /* a chunk's token exchange (expert parallelism's all-to-alls, tagged); its other
         * collectives (a gradient's reduce-scatter after both chunks added into it, the
         * parameters' gathers) belong to no one chunk */
        bool start =
            nd->op == GT_OP_ALL_TO_ALL_START && gt_node_has_tag(g, nd, GT_TAG_TOKEN_EXCHANGE);
        prio *p = &pr[id - lo];
        p->pos = id;
        if (c >= 0 && gt_op_is_collective_start(nd->op) && !start) c = -1;
        if (c >= 0) {
            p->seg = seg[c];
            p->rank = ph == GT_PHASE_FORWARD ? c : 1 - c;
            if (start) {
                seg[c]++;
                starts[c][n_starts[c]++] = nd->op;
            }
        } else {
            p->seg = nd->op == GT_OP_WAIT ? INT64_MAX : -1;
            p->rank = 0;
        }
        for (int k = 0; k < nd->n_in; k++) {
            gt_node_id q = g->values[nd->in[k]].producer;
            if (q >= lo && q <= hi) missing[id - lo]++;
        }
    }
    gt_status st = GT_OK;
    if (n_starts[0] != n_starts[1] ||
        memcmp(starts[0], starts[1], (size_t)n_starts[0] * sizeof(gt_op)) != 0)
        st =
            gt_error_set(err, GT_ERR_UNSUPPORTED,
                         "ep_overlap: block %d, %s: its chunks start %d and %d token exchanges: no "
                         "two matching chunks to overlap",
                         u, gt_phase_name(ph), n_starts[0], n_starts[1]);
    /* list scheduling: the ready node of the smallest priority, n times (spans are one block's
     * nodes: the quadratic scan is cheap next to the rest of compilation) */
    for (int32_t at = 0; st == GT_OK && at < n; at++) {
        int32_t best = -1;
        for (int32_t k = 0; k < n; k++)
            if (!done[k] && missing[k] == 0 && (best < 0 || before(&pr[k], &pr[best]))) best = k;
        if (best < 0) {
            st = gt_error_set(err, GT_ERR_INTERNAL, "ep_overlap: block %d: a cycle in its span", u);
            break;
        }
        done[best] = 1;
        order[lo + at] = lo + best;
        const gt_node *nd = &g->nodes[lo + best];
        for (gt_node_id id = lo + best + 1; id <= hi; id++) { /* its readers in the span */
            const gt_node *r = &g->nodes[id];
            for (int k = 0; k < r->n_in; k++)
                for (int o = 0; o < nd->n_out; o++)
                    if (r->in[k] == nd->out[o]) missing[id - lo]--;
        }
    }
    free(starts[0]);
    free(starts[1]);
    free(done);
    free(missing);
    free(pr);
    return st;
}

/* Which nodes only make parameter gradients: every reader of their outputs does too, or is the
 * optimizer, or the output is a GRAD output (a reverse sweep: readers come later in the order). */
static uint8_t *gradient_only(const gt_graph *g)
{
    int32_t nn = g->n_nodes, nv = g->n_values;
    uint8_t *only = gt_xcalloc((size_t)(nn ? nn : 1), 1);
    uint8_t *ok = gt_xmalloc((size_t)(nv ? nv : 1)), *used = gt_xcalloc((size_t)(nv ? nv : 1), 1);
    memset(ok, 1, (size_t)(nv ? nv : 1));
    for (int32_t k = 0; k < g->n_outputs; k++) {
        gt_value_id v = g->outputs[k].value;
        ok[v] &= g->outputs[k].kind == GT_OUT_GRAD;
        used[v] = 1;
    }
    for (gt_node_id id = nn - 1; id >= 0; id--) {
        const gt_node *nd = &g->nodes[id];
        only[id] = nd->phase == GT_PHASE_BACKWARD && nd->n_out > 0;
        for (int j = 0; j < nd->n_out; j++)
            only[id] &= ok[nd->out[j]] && used[nd->out[j]];
        for (int k = 0; k < nd->n_in; k++) {
            ok[nd->in[k]] &= only[id] || nd->phase == GT_PHASE_OPTIMIZER;
            used[nd->in[k]] = 1;
        }
    }
    free(ok);
    free(used);
    return only;
}

/* The chunk of every node: 0, 1 or -1 (the header says how). Never a chunk's, whatever its tags
 * and origin say: a node that reads both chunks (autodiff's sum of the chunks' gradients takes
 * one chunk's origin), a value of the parameters alone (a weight gathered again for the backward:
 * passes give it its first reader's origin), and a node of a parameter's gradient that reads no
 * chunk (the sum's FSDP bucket, reduce-scatter and slices, with the sum's origin). */
static int8_t *chunks_of(const gt_graph *g)
{
    int32_t nn = g->n_nodes;
    int8_t *chunk = gt_xmalloc((size_t)(nn ? nn : 1));
    uint8_t *weights = gt_xcalloc((size_t)(nn ? nn : 1), 1);
    uint8_t *data = gt_xcalloc((size_t)(g->n_values ? g->n_values : 1), 1);
    uint8_t *grad = gradient_only(g);
    for (int32_t k = 0; k < g->n_inputs; k++) /* the step's data: tokens, labels, positions */
        data[g->inputs[k].value] = g->inputs[k].kind == GT_IN_INPUT;
    for (gt_node_id id = 0; id < nn; id++) {
        const gt_node *nd = &g->nodes[id];
        chunk[id] = (int8_t)chunk_of(g, id);
        bool read[2] = {false, false};
        weights[id] = 1;
        for (int k = 0; k < nd->n_in; k++) {
            gt_node_id q = g->values[nd->in[k]].producer;
            if (q != GT_NONE && chunk[q] >= 0) read[chunk[q]] = true;
            weights[id] &= q == GT_NONE ? !data[nd->in[k]] : weights[q];
        }
        if ((read[0] && read[1]) || weights[id] || (grad[id] && !read[0] && !read[1]))
            chunk[id] = -1;
        /* a node parallelize added without the tags (a redistribution of a chunk's tokens, its
         * wait) belongs to the chunk all its chunked inputs come from */
        else if (chunk[id] < 0 && (read[0] || read[1]) && nd->phase != GT_PHASE_OPTIMIZER)
            chunk[id] = read[0] ? 0 : 1;
    }
    free(grad);
    free(data);
    free(weights);
    return chunk;
}

gt_status gt_pass_ep_overlap(gt_graph *g, const gt_pass_ctx *ctx, gt_error *err)
{
    (void)ctx;
    int32_t nn = g->n_nodes, max_unit = -1;
    int8_t *chunk = chunks_of(g);
    for (gt_node_id id = 0; id < nn; id++)
        if (chunk[id] >= 0 && g->nodes[id].unit > max_unit) max_unit = g->nodes[id].unit;
    gt_node_id *order = gt_xmalloc((size_t)(nn ? nn : 1) * sizeof *order);
    for (gt_node_id id = 0; id < nn; id++)
        order[id] = id;
    gt_status st = GT_OK;
    /* which span claimed each node: spans must not overlap (each reorders its own range) */
    int32_t *owner = gt_xmalloc((size_t)(nn ? nn : 1) * sizeof *owner);
    for (gt_node_id id = 0; id < nn; id++)
        owner[id] = -1;
    /* a block's backward span starts after its forward one (a backward node the passes hoisted
     * among the forward nodes stays where it is, scheduled as no chunk's) */
    for (int32_t u = 0; st == GT_OK && u <= max_unit; u++) {
        gt_node_id after = -1;
        for (int ph = GT_PHASE_FORWARD; st == GT_OK && ph <= GT_PHASE_BACKWARD; ph++) {
            gt_node_id lo = GT_NONE, hi = GT_NONE;
            for (gt_node_id id = after + 1; id < nn; id++) {
                const gt_node *nd = &g->nodes[id];
                /* a chunk's other collectives (the counts' all-reduce for the bias update, its
                 * wait deferred to the optimizer) do not stretch the span */
                bool other = (nd->op == GT_OP_WAIT || gt_op_is_collective_start(nd->op)) &&
                             !gt_node_has_tag(g, nd, GT_TAG_TOKEN_EXCHANGE);
                if (chunk[id] >= 0 && nd->unit == u && nd->phase == ph && !other) {
                    if (lo == GT_NONE) lo = id;
                    hi = id;
                }
            }
            if (lo == GT_NONE) continue;
            for (gt_node_id id = lo; id <= hi && st == GT_OK; id++) {
                if (owner[id] >= 0) {
                    char label[256];
                    gt_graph_node_label(g, id, label, sizeof label);
                    st = gt_error_set(err, GT_ERR_UNSUPPORTED,
                                      "ep_overlap: block %d's chunks (%s, nodes %d..%d) interleave "
                                      "with block %d's (at node %d, %s): no span of its own to "
                                      "schedule",
                                      u, gt_phase_name((gt_phase)ph), lo, hi, owner[id], id, label);
                }
                owner[id] = u;
            }
            if (st == GT_OK) st = schedule_span(g, chunk, lo, hi, (gt_phase)ph, u, order, err);
            after = hi;
        }
    }
    free(owner);
    if (st == GT_OK) gt_pass_apply_order(g, order);
    free(order);
    free(chunk);
    return st;
}
