/* mincut.c — the budget memory policy: what to save, by a min-cut over the forward/backward
 * boundary, so that the planned step memory fits a budget with the fewest recomputed FLOPs.
 *
 * Candidates: the nodes "full" may recompute (block nodes that are recomputable and produce no
 * block boundary, memory_policy.c). Every other forward node is computed in the forward only.
 *
 * The cut (as torch's min-cut partitioner, with recompute cost on the other side of the scale):
 * a flow network with a source S ("computed in the forward"), a sink T ("needed by the backward")
 * and two vertices per forward node n, n_in and n_out:
 *   S -> n_in     cost(n), the FLOPs of recomputing n, when n is a candidate; infinite otherwise;
 *   n_in -> n_out lambda * bytes(n), the bytes of n's outputs: cutting it = saving n;
 *   p_out -> n_in infinite, for every input of n produced by forward node p;
 *   n_out -> T    infinite when a backward (or optimizer) node reads an output of n.
 * In a finite cut every value the backward reads is either saved (n_in on S's side, n_out on T's)
 * or recomputed (n_in on T's side, paying cost(n)), and a recomputed node's producers are again
 * saved or recomputed: exactly the states remat can realise. The minimum cut minimises
 * cost(recomputed) + lambda * bytes(saved). lambda trades FLOPs for bytes: lambda = 0 saves
 * everything (none), a large lambda saves the fewest bytes the candidates allow (about full).
 * cost(n): matmul 2·M·N·K, sdpa 4·b·h·s·t·d, views 0, everything else one per output element;
 * plus 1, so that a free recomputation is never preferred to saving nothing.
 *
 * The saved bytes are not the whole story: the planned step memory also holds the recomputed
 * values while the backward uses them, temporaries and gradients. So each candidate cut is judged
 * by the real figure: tags set, remat and dce run on a copy of the graph, and the caller's
 * measure (the trainer: the runtime's planned step arena) applied. lambda = 2^k, and k is found by
 * bisection: the smallest k whose plan fits (saved bytes fall as lambda grows). When even the
 * largest lambda and the full policy do not fit, the pass fails and states the smallest planned
 * figure it reached. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "graphtrain/gt_flops.h"
#include "passes/memory_policy_internal.h"

#define CUT_INF (INT64_MAX / 4)
#define LAMBDA_MIN_LOG2 (-12)
#define LAMBDA_MAX_LOG2 24

/* ---------------------------------------------------------------- max flow (Dinic) */

typedef struct {
    int32_t to, next;
    int64_t cap;
} flow_edge;

typedef struct {
    int32_t n_vertices, n_edges, cap_edges;
    int32_t *head, *level, *iter, *queue;
    flow_edge *edges;
} flow_net;

static void flow_init(flow_net *f, int32_t n_vertices)
{
    memset(f, 0, sizeof *f);
    f->n_vertices = n_vertices;
    f->head = gt_xmalloc((size_t)n_vertices * sizeof *f->head);
    f->level = gt_xmalloc((size_t)n_vertices * sizeof *f->level);
    f->iter = gt_xmalloc((size_t)n_vertices * sizeof *f->iter);
    f->queue = gt_xmalloc((size_t)n_vertices * sizeof *f->queue);
    for (int32_t v = 0; v < n_vertices; v++)
        f->head[v] = -1;
}

static void flow_free(flow_net *f)
{
    free(f->head);
    free(f->level);
    free(f->iter);
    free(f->queue);
    free(f->edges);
}

static void flow_add(flow_net *f, int32_t a, int32_t b, int64_t cap)
{
    if (f->n_edges + 2 > f->cap_edges) {
        f->cap_edges = f->cap_edges ? 2 * f->cap_edges : 256;
        f->edges = gt_xrealloc(f->edges, (size_t)f->cap_edges * sizeof *f->edges);
    }
    f->edges[f->n_edges] = (flow_edge){b, f->head[a], cap};
    f->head[a] = f->n_edges++;
    f->edges[f->n_edges] = (flow_edge){a, f->head[b], 0};
    f->head[b] = f->n_edges++;
}

static bool flow_bfs(flow_net *f, int32_t s, int32_t t)
{
    for (int32_t v = 0; v < f->n_vertices; v++)
        f->level[v] = -1;
    int32_t qh = 0, qt = 0;
    f->level[s] = 0;
    f->queue[qt++] = s;
    while (qh < qt) {
        int32_t v = f->queue[qh++];
        for (int32_t e = f->head[v]; e >= 0; e = f->edges[e].next)
            if (f->edges[e].cap > 0 && f->level[f->edges[e].to] < 0) {
                f->level[f->edges[e].to] = f->level[v] + 1;
                f->queue[qt++] = f->edges[e].to;
            }
    }
    return f->level[t] >= 0;
}

/* One augmenting path in the level graph, iteratively (graphs are deep: no recursion). */
static int64_t flow_augment(flow_net *f, int32_t s, int32_t t, int32_t *path)
{
    int32_t depth = 0, v = s;
    for (;;) {
        if (v == t) {
            int64_t push = CUT_INF;
            for (int32_t k = 0; k < depth; k++)
                if (f->edges[path[k]].cap < push) push = f->edges[path[k]].cap;
            for (int32_t k = 0; k < depth; k++) {
                f->edges[path[k]].cap -= push;
                f->edges[path[k] ^ 1].cap += push;
            }
            return push;
        }
        int32_t e = f->iter[v];
        for (; e >= 0; e = f->edges[e].next) {
            const flow_edge *x = &f->edges[e];
            if (x->cap > 0 && f->level[x->to] == f->level[v] + 1) break;
        }
        f->iter[v] = e;
        if (e >= 0) {
            path[depth++] = e;
            v = f->edges[e].to;
            continue;
        }
        /* dead end: retreat and skip the edge that led here */
        f->level[v] = -1;
        if (depth == 0) return 0;
        depth--;
        v = f->edges[path[depth] ^ 1].to;
        f->iter[v] = f->edges[f->iter[v]].next;
    }
}

/* Max flow from s to t; afterwards level[v] >= 0 exactly for the vertices on s's side. */
static void flow_run(flow_net *f, int32_t s, int32_t t)
{
    int32_t *path = gt_xmalloc(((size_t)f->n_vertices + 1) * sizeof *path);
    while (flow_bfs(f, s, t)) {
        memcpy(f->iter, f->head, (size_t)f->n_vertices * sizeof *f->iter);
        while (flow_augment(f, s, t, path) > 0) {
        }
    }
    flow_bfs(f, s, t);
    free(path);
}

/* ---------------------------------------------------------------- costs */

typedef struct {
    int64_t *cost;  /* per node: recompute FLOPs + 1 */
    int64_t *bytes; /* per node: bytes of its outputs */
    uint8_t *wants; /* per node: a candidate */
    uint8_t *read_by_backward;
} cut_input;

static gt_status numel_of(const gt_graph *g, gt_value_id v, const gt_sym_binding *b, int64_t *out,
                          int64_t *shape, gt_error *err)
{
    GT_TRY(gt_graph_eval_shape(g, v, b, shape, err));
    *out = gt_shape_numel(gt_value_type(g, v)->ndim, shape);
    return GT_OK;
}

static gt_status node_costs(const gt_graph *g, const gt_sym_binding *b, cut_input *in,
                            gt_error *err)
{
    for (gt_node_id n = 0; n < g->n_nodes; n++) {
        const gt_node *nd = &g->nodes[n];
        if (nd->phase != GT_PHASE_FORWARD) continue;
        int64_t shape[GT_MAX_DIMS], numel = 0, bytes = 0;
        for (int k = 0; k < nd->n_out; k++) {
            GT_TRY(numel_of(g, nd->out[k], b, &numel, shape, err));
            bytes += numel * (int64_t)gt_dtype_size(gt_value_type(g, nd->out[k])->dtype);
        }
        /* gt_ops.def's recompute column: a view is free, a compute-bound op costs its model
         * FLOPs (exact integers in a double), anything else one pass over its output */
        int64_t flops = 0;
        switch (gt_op_get(nd->op)->recompute) {
        case GT_RECOMPUTE_FREE:
            break;
        case GT_RECOMPUTE_FLOPS: {
            double f;
            GT_TRY(gt_node_model_flops(g, n, b, &f, err));
            flops = (int64_t)f;
            break;
        }
        default:
            GT_TRY(numel_of(g, nd->out[0], b, &flops, shape, err));
        }
        in->cost[n] = flops + 1;
        in->bytes[n] = bytes;
    }
    return GT_OK;
}

/* The recompute set of the minimum cut at lambda = 2^log2_lambda. */
static void min_cut(const gt_graph *g, const cut_input *in, int log2_lambda, uint8_t *recompute)
{
    int32_t n = g->n_nodes, s = 2 * n, t = 2 * n + 1;
    flow_net f;
    flow_init(&f, 2 * n + 2);
    for (gt_node_id v = 0; v < n; v++) {
        const gt_node *nd = &g->nodes[v];
        if (nd->phase != GT_PHASE_FORWARD) continue;
        int64_t save = in->bytes[v];
        save = log2_lambda >= 0 ? save << log2_lambda : save >> -log2_lambda;
        flow_add(&f, s, 2 * v, in->wants[v] ? in->cost[v] : CUT_INF);
        flow_add(&f, 2 * v, 2 * v + 1, save);
        if (in->read_by_backward[v]) flow_add(&f, 2 * v + 1, t, CUT_INF);
        for (int k = 0; k < nd->n_in; k++) {
            gt_node_id p = g->values[nd->in[k]].producer;
            if (p != GT_NONE && g->nodes[p].phase == GT_PHASE_FORWARD)
                flow_add(&f, 2 * p + 1, 2 * v, CUT_INF);
        }
    }
    flow_run(&f, s, t);
    uint8_t *wants = gt_xcalloc((size_t)n + 1, 1);
    for (gt_node_id v = 0; v < n; v++)
        wants[v] = in->wants[v] && g->nodes[v].phase == GT_PHASE_FORWARD && f.level[2 * v] < 0;
    gt_policy_close(g, wants, recompute);
    free(wants);
    flow_free(&f);
}

/* ---------------------------------------------------------------- judging a cut */

/* Planned step memory of g with exactly the nodes of recompute recomputed. */
static gt_status measure_cut(const gt_graph *g, const gt_pass_options *o, const uint8_t *recompute,
                             size_t *bytes, gt_error *err)
{
    gt_graph *c = gt_graph_copy(g);
    gt_pass_ctx ctx = {.options = o, .index = 0};
    gt_status st = gt_policy_set_tags(c, recompute, err);
    if (st == GT_OK) st = gt_pass_remat(c, &ctx, err);
    if (st == GT_OK) st = gt_pass_dce(c, &ctx, err);
    /* fusion changes lifetimes too (fused intermediates vanish, absorbed casts leave their bf16
     * inputs live): measure the graph the later passes will plan */
    if (st == GT_OK && gt_pass_enabled(o, "fusion")) st = gt_pass_fusion(c, &ctx, err);
    if (st == GT_OK) st = o->measure(c, o->measure_user, bytes, err);
    gt_graph_free(c);
    return st;
}

gt_status gt_policy_budget(gt_graph *g, const gt_pass_options *o, gt_error *err)
{
    if (!o || o->memory_budget_bytes <= 0 || !o->binding || !o->measure)
        return gt_error_set(err, GT_ERR_INVALID,
                            "memory_policy budget: needs a budget > 0 bytes (got %lld), a symbol "
                            "binding and a planned-memory measure in the pass options",
                            o ? (long long)o->memory_budget_bytes : 0LL);
    size_t budget = (size_t)o->memory_budget_bytes;
    int32_t n = g->n_nodes;
    cut_input in = {.cost = gt_xcalloc((size_t)n + 1, sizeof *in.cost),
                    .bytes = gt_xcalloc((size_t)n + 1, sizeof *in.bytes),
                    .wants = gt_xcalloc((size_t)n + 1, 1),
                    .read_by_backward = gt_xcalloc((size_t)n + 1, 1)};
    uint8_t *recompute = gt_xcalloc((size_t)n + 1, 1), *best = gt_xcalloc((size_t)n + 1, 1);
    uint8_t *boundary = gt_policy_boundaries(g);
    for (gt_node_id v = 0; v < n; v++) {
        const gt_node *nd = &g->nodes[v];
        bool ok = gt_node_block(nd) >= 0 && gt_remat_can_recompute(g, v);
        for (int k = 0; k < nd->n_out && ok; k++)
            ok = !boundary[nd->out[k]];
        in.wants[v] = ok;
        if (nd->phase == GT_PHASE_FORWARD) continue;
        for (int k = 0; k < nd->n_in; k++) {
            gt_node_id p = g->values[nd->in[k]].producer;
            if (p != GT_NONE && g->nodes[p].phase == GT_PHASE_FORWARD) in.read_by_backward[p] = 1;
        }
    }
    free(boundary);
    gt_status st = node_costs(g, o->binding, &in, err);

    /* nothing recomputed first: when that fits there is nothing to trade */
    size_t bytes = 0, smallest = SIZE_MAX;
    bool found = false;
    if (st == GT_OK) st = measure_cut(g, o, recompute, &bytes, err);
    if (st == GT_OK && bytes <= budget) found = true;
    smallest = bytes;
    /* bisection on log2 lambda for the smallest lambda that fits */
    int lo = LAMBDA_MIN_LOG2, hi = LAMBDA_MAX_LOG2;
    if (st == GT_OK && !found) {
        min_cut(g, &in, hi, recompute);
        st = measure_cut(g, o, recompute, &bytes, err);
        if (st == GT_OK && bytes < smallest) smallest = bytes;
        if (st == GT_OK && bytes <= budget) {
            found = true;
            memcpy(best, recompute, (size_t)n);
            while (hi - lo > 1 && st == GT_OK) {
                int mid = lo + (hi - lo) / 2;
                min_cut(g, &in, mid, recompute);
                st = measure_cut(g, o, recompute, &bytes, err);
                if (st == GT_OK && bytes <= budget) {
                    hi = mid;
                    memcpy(best, recompute, (size_t)n);
                } else {
                    lo = mid;
                }
            }
        } else if (st == GT_OK) {
            /* the full policy as a last candidate (it may plan smaller than the cut) */
            gt_policy_close(g, in.wants, recompute);
            st = measure_cut(g, o, recompute, &bytes, err);
            if (st == GT_OK && bytes < smallest) smallest = bytes;
            if (st == GT_OK && bytes <= budget) {
                found = true;
                memcpy(best, recompute, (size_t)n);
            }
        }
    }
    if (st == GT_OK && !found)
        st = gt_error_set(err, GT_ERR_INVALID,
                          "memory_policy budget: compile.activation_memory_budget_gb = %.4f "
                          "(%zu bytes) cannot be met: the smallest planned step memory reachable "
                          "by recomputation is %zu bytes (%.4f GiB); raise the budget to at least "
                          "that",
                          (double)budget / (1024.0 * 1024.0 * 1024.0), budget, smallest,
                          (double)smallest / (1024.0 * 1024.0 * 1024.0));
    if (st == GT_OK) st = gt_policy_set_tags(g, best, err);
    free(in.cost);
    free(in.bytes);
    free(in.wants);
    free(in.read_by_backward);
    free(recompute);
    free(best);
    return st;
}
