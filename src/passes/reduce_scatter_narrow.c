/* reduce_scatter_narrow.c — reduce-scatter mixed-precision gradients in their own 16-bit dtype.
 *
 * Under FSDP with bf16 compute each weight gradient is produced in bf16, widened by
 * cast(...; dtype=f32) (the parameter cast's gradient), reshaped, concatenated into the bucket
 * (fsdp_bucketing) and reduce-scattered in f32. The collective sums in f32 in rank order whatever
 * the input dtype, and widening is exact, so sending the bf16 values and widening them at the
 * receiver gives the same bits with half the bytes on the wire and in the bucket copies, and no
 * cast kernels: a widening reduce_scatter_start (gt_ops.def: bf16/f16 input, dtype=f32).
 *
 * Contract
 *   requires   a graph with a mesh (no-op otherwise; also a no-op in f32 mode, which has no casts).
 *   guarantees every reduce_scatter_start with an f32 input and output and exactly one wait, whose
 *              input is a tree of reshape, concat and slice_backward nodes (f32) whose leaves are
 *              all cast(x_i; dtype=f32) of values x_i of one 16-bit float dtype h (bf16 or f16),
 *              reads that tree rebuilt over the x_i (each node copied with the same op and
 *              attributes, so the same shapes, in dtype h) and has dtype=f32; its output type is
 *              unchanged (checked by its shape rule before the rewrite). Its wait keeps the new
 *              buffer alive instead of the old one. The per-tensor form (fsdp_bucketing off) is
 *              reshape(cast(x)) or cast(x) itself. Each copy takes the fqn, phase, tags, origin and
 *              placements of the node it copies (gt_graph_copy_region) and runs right before it;
 *              the old tree nodes and casts nothing reads any more are removed, a cast (or view)
 *              that something else still reads stays. Other collectives are left alone.
 *   numerics   exact: widen(reshape(x)) = reshape(widen(x)), widen(concat(x, y)) =
 *              concat(widen(x), widen(y)) and slice_backward pads with zeros, which widen to zeros,
 *              so the widening collective sees, block by block, the f32 values the old one read
 *              and sums them in the same f32 rank order (gt_comm.h).
 *
 * Cost: one sweep over the nodes plus the trees' sizes, one reorder by keys and one compaction. */
#include <stdlib.h>
#include <string.h>

#include "passes/pass_internal.h"

typedef struct {
    gt_graph *g;
    int8_t *memo;       /* per value: 0 unknown, 1 a tree over 16-bit casts, -1 not */
    gt_dtype *leaf;     /* per value with memo 1: the dtype of its leaves' sources */
    uint8_t *copy;      /* per node: an inner tree node to copy */
    uint8_t *candidate; /* per node: may become dead (inner tree node or leaf cast) */
} narrow_state;

/* Whether f32 value v is a tree of reshape / concat / slice_backward over casts to f32 of 16-bit
 * float values of one dtype (*leaf). Trees are shallow (a bucket's concat tree is ~3 deep). */
static bool narrowable(narrow_state *s, gt_value_id v, gt_dtype *leaf)
{
    const gt_graph *g = s->g;
    if (s->memo[v]) {
        *leaf = s->leaf[v];
        return s->memo[v] > 0;
    }
    s->memo[v] = -1;
    gt_node_id p = g->values[v].producer;
    if (p == GT_NONE || gt_value_type(g, v)->dtype != GT_F32) return false;
    const gt_node *nd = &g->nodes[p];
    bool ok = false;
    gt_dtype dt = GT_F32;
    if (nd->op == GT_OP_CAST) {
        dt = gt_value_type(g, nd->in[0])->dtype;
        ok = gt_dtype_widens_to_f32(dt, GT_F32);
    } else if (nd->op == GT_OP_RESHAPE || nd->op == GT_OP_CONCAT ||
               nd->op == GT_OP_SLICE_BACKWARD) {
        ok = true;
        for (int k = 0; k < nd->n_in && ok; k++) {
            gt_dtype in_dt;
            ok = narrowable(s, nd->in[k], &in_dt) && (k == 0 || in_dt == dt);
            dt = in_dt;
        }
    }
    if (!ok) return false;
    s->memo[v] = 1;
    s->leaf[v] = dt;
    *leaf = dt;
    return true;
}

/* Marks the tree behind narrowable value v: inner nodes to copy, and every node of it (casts
 * too) as a candidate for removal. */
static void mark_tree(narrow_state *s, gt_value_id v)
{
    gt_node_id p = s->g->values[v].producer;
    if (s->candidate[p]) return;
    s->candidate[p] = 1;
    const gt_node *nd = &s->g->nodes[p];
    if (nd->op == GT_OP_CAST) return;
    s->copy[p] = 1;
    for (int k = 0; k < nd->n_in; k++)
        mark_tree(s, nd->in[k]);
}

/* The start n as a widening reduce-scatter of `in`, when its shape rule gives the same output
 * type (it always should: the copies keep every shape). */
static bool rewrite_start(gt_graph *g, gt_node_id n, gt_value_id in)
{
    gt_node proposed = g->nodes[n];
    proposed.in[0] = in;
    proposed.attrs.ni = 3;
    proposed.attrs.i[2] = GT_F32;
    if (!gt_pass_shape_matches(g, &proposed, &g->nodes[n])) return false;
    g->nodes[n] = proposed;
    return true;
}

/* Removes the candidates nothing reads any more (nor a graph output), readers before the nodes
 * they read; the rest of the graph is untouched. keep: per node. */
static void drop_dead(const gt_graph *g, const narrow_state *s, int32_t n, uint8_t *keep)
{
    int32_t *uses = gt_graph_use_counts(g);
    for (gt_node_id x = n - 1; x >= 0; x--) {
        const gt_node *nd = &g->nodes[x];
        if (!s->candidate[x] || uses[nd->out[0]] > 0) continue;
        keep[x] = 0;
        for (int k = 0; k < nd->n_in; k++) { /* use counts count a node once per value */
            bool seen = false;
            for (int j = 0; j < k; j++)
                seen = seen || nd->in[j] == nd->in[k];
            if (!seen) uses[nd->in[k]]--;
        }
    }
    free(uses);
}

gt_status gt_pass_reduce_scatter_narrow(gt_graph *g, const gt_pass_ctx *ctx, gt_error *err)
{
    (void)ctx;
    if (g->mesh.ndim == 0) return GT_OK;
    int32_t n = g->n_nodes, nv = g->n_values;
    narrow_state s = {.g = g};
    s.memo = gt_xcalloc((size_t)nv + 1, sizeof *s.memo);
    s.leaf = gt_xcalloc((size_t)nv + 1, sizeof *s.leaf);
    s.copy = gt_xcalloc((size_t)n + 1, 1);
    s.candidate = gt_xcalloc((size_t)n + 1, 1);
    gt_node_id *wait_of = gt_pass_find_waits(g);
    gt_node_id *starts = gt_xmalloc(((size_t)n + 1) * sizeof *starts);
    int32_t n_starts = 0, n_copies = 0;
    for (gt_node_id x = 0; x < n; x++) {
        const gt_node *nd = &g->nodes[x];
        gt_dtype leaf;
        if (nd->op != GT_OP_REDUCE_SCATTER_START || wait_of[x] == GT_NONE ||
            gt_value_type(g, nd->out[0])->dtype != GT_F32 || !narrowable(&s, nd->in[0], &leaf))
            continue;
        starts[n_starts++] = x;
        mark_tree(&s, nd->in[0]);
    }
    gt_status st = GT_OK;
    if (n_starts == 0) goto done;

    /* The copies, in node order (inputs before readers): map[v] is v's 16-bit twin; a leaf cast's
     * twin is its input; GT_NONE: v has none. keys: each copy right before the node it copies. */
    gt_value_id *map = gt_xmalloc(((size_t)nv + 1) * sizeof *map);
    for (gt_value_id v = 0; v < nv; v++)
        map[v] = GT_NONE;
    for (gt_node_id x = 0; x < n; x++) {
        if (s.candidate[x] && !s.copy[x]) map[g->nodes[x].out[0]] = g->nodes[x].in[0];
        n_copies += s.copy[x];
    }
    gt_pass_key *keys = gt_xmalloc(((size_t)n + (size_t)n_copies + 1) * sizeof *keys);
    for (gt_node_id x = 0; x < n; x++)
        keys[x] = (gt_pass_key){x, GT_KEY_STAY};
    for (gt_node_id x = 0; x < n && st == GT_OK; x++) {
        if (!s.copy[x]) continue;
        gt_node_id at = g->n_nodes;
        st = gt_graph_copy_region(g, g, x, x + 1, map, err);
        if (st == GT_OK) keys[at] = (gt_pass_key){x, at};
    }
    for (int32_t k = 0; k < n_starts && st == GT_OK; k++) {
        gt_node_id x = starts[k];
        gt_value_id narrow = map[g->nodes[x].in[0]];
        if (rewrite_start(g, x, narrow))
            g->nodes[wait_of[x]].in[1] = narrow; /* the buffer the collective reads stays alive */
    }
    if (st == GT_OK) {
        /* the old trees and casts nothing reads now go (and a copy no start took, if any) */
        int32_t total = g->n_nodes;
        uint8_t *keep = gt_xmalloc((size_t)total + 1);
        memset(keep, 1, (size_t)total + 1);
        s.candidate = gt_xrealloc(s.candidate, (size_t)total + 1);
        memset(s.candidate + n, 1, (size_t)(total - n));
        drop_dead(g, &s, total, keep);
        gt_node_id *order = gt_xmalloc(((size_t)total + 1) * sizeof *order);
        st = gt_pass_order_by_keys(g, keys, order, "reduce_scatter_narrow", err);
        if (st == GT_OK) {
            uint8_t *kept = gt_xmalloc((size_t)total + 1);
            for (gt_node_id x = 0; x < total; x++)
                kept[x] = keep[order[x]];
            gt_pass_compact(g, kept);
            free(kept);
        }
        free(order);
        free(keep);
    }
    free(keys);
    free(map);
done:
    free(starts);
    free(wait_of);
    free(s.candidate);
    free(s.copy);
    free(s.leaf);
    free(s.memo);
    return st;
}
