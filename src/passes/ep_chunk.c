/* ep_chunk.c — the EP chunking pass: each MoE block (or each MoE) of the forward graph computed as
 * two chunks of the batch (or of the sequence), so that one chunk's token exchange can overlap
 * the other chunk's compute (torchtitan's graph trainer, compile.ep_overlap).
 *
 * Contract. Input: a forward graph as a model builder made it (before autodiff: the backward is
 * then derived from the chunked forward, so forward and backward are chunked alike by
 * construction). A region is the contiguous run of forward nodes of one block unit (layers.*) or
 * of its "layers.N.moe" nodes (layers.*.moe), in a block that routes tokens (moe_count). In each:
 *   - the chunked live-ins are the values from outside whose shape holds the chunk symbol
 *     ("batch" or "seq"), sliced in two along that dim: [0, c0) and [c0, n) with
 *     c0 = n // 2 (batch: the outermost dim; seq: a dim that is the sequence itself);
 *   - under data parallelism (groups G > 1) the graph is the global one and its batch b holds
 *     the G ranks' batches of m = b // G rows each, one after the other; each rank's own are cut
 *     in two, so that every chunk stays on its rank: the value [b·r, ...] is regrouped into the
 *     ranks' blocks [G, m·r, ...] (regroup: a reshape whose numel G·m = b the kernel checks when
 *     bound, as the symbols cannot prove it), sliced along dim 1 at m0 = m // 2, and each piece
 *     reshaped to [G·m_k·r, ...]: chunk k has G·m_k rows (m1 = m - m0). Joined the other way
 *     round: reshape to [G, m_k·r, ...], concat along dim 1, regroup to [b·r, ...]. Parallelize
 *     keeps all of it rank-local (a shard of dim 0 is a shard of the blocks' dim 0), and the rank
 *     sees its own slices [0, m0) and [m0, m) — the eager builder cuts each rank's batch alike;
 *   - the nodes that read a chunked value (transitively), or whose shape holds the symbol, are
 *     copied once per chunk with the symbol replaced by the chunk's size in their attributes;
 *     the others stay, shared by both chunks. Casts of parameters are copied per chunk unless
 *     early gradient accumulation is on (then one cast serves both chunks and the chunks'
 *     gradients are added before it, in the compute dtype);
 *   - the values the rest of the graph reads are joined: concat along the chunk dim, or, for the
 *     token counts (moe_count, no chunk dim), add — counts add exactly.
 * The result equals what the model builder makes when it builds each module once per chunk
 * (strategy eager), node for node in each chunk, so the training step is bitwise the same
 * (early accumulation off; in f32 there are no casts, so on and off agree too). Node order:
 * the region's shared nodes, the slices, chunk 0, chunk 1, the joins, then the rest. Value ids
 * change: the caller's ids in `track` are rewritten. A region that is not contiguous, a chunked
 * value split in a dim that cannot be cut in two contiguous pieces, or a value that leaves a
 * region without the chunk dim and is no token count is refused, naming it. */
#include <stdlib.h>
#include <string.h>

#include "graphtrain/gt_build.h"
#include "passes/pass_internal.h"

typedef struct {
    gt_graph *g;
    const gt_chunk_options *o;
    const char *sym;   /* "batch" or "seq" */
    gt_expr n, c[2];   /* the symbol, the chunks' sizes */
    int64_t groups;    /* batch: the data-parallel ranks' blocks (1: none) */
    gt_expr m[2];      /* with groups: each rank's rows of chunk k (c[k] = groups·m[k]) */
    gt_node_id lo, hi; /* the region */
    int32_t unit;
} chunker;

/* Whether e holds the chunk symbol. */
static bool holds(chunker *k, gt_expr e)
{
    gt_sym_pool *p = k->g->sym;
    return gt_sym_replace(p, e, k->sym, gt_sym_add(p, k->n, gt_sym_const(p, 1))) != e;
}

/* The one dim of value v that holds the symbol, -1 when none; -2 when it cannot be cut in two
 * contiguous pieces (several dims; batch not outermost; seq not alone in its dim). */
static int chunk_dim(chunker *k, gt_value_id v)
{
    const gt_type *t = gt_value_type(k->g, v);
    int dim = -1;
    for (int d = 0; d < t->ndim; d++)
        if (holds(k, t->dims[d])) {
            if (dim >= 0) return -2;
            dim = d;
        }
    if (dim < 0) return -1;
    bool seq = k->o->seq;
    if ((!seq && dim != 0) || (seq && t->dims[dim] != k->n)) return -2;
    return dim;
}

static gt_status refuse(chunker *k, gt_value_id v, const char *why, gt_error *err)
{
    char label[256] = "a graph input";
    gt_node_id p = k->g->values[v].producer;
    if (p != GT_NONE) gt_graph_node_label(k->g, p, label, sizeof label);
    return gt_error_set(err, GT_ERR_UNSUPPORTED, "compile.ep_overlap: block %d: value %%%d (%s) %s",
                        k->unit, v, label, why);
}

static bool is_param(const gt_graph *g, gt_value_id v)
{
    for (int32_t k = 0; k < g->n_inputs; k++)
        if (g->inputs[k].value == v) return g->inputs[k].kind == GT_IN_PARAM;
    return false;
}

/* Whether node id belongs to the region of unit u. */
static bool in_region(const gt_graph *g, gt_node_id id, int32_t u, const char *moe_prefix)
{
    const gt_node *n = &g->nodes[id];
    if (n->phase != GT_PHASE_FORWARD || n->unit != u) return false;
    if (!moe_prefix) return true;
    const char *f = gt_graph_str(g, n->fqn);
    size_t l = strlen(moe_prefix);
    return !strncmp(f, moe_prefix, l) && (f[l] == 0 || f[l] == '.');
}

/* Finds the first region of a unit > after: *lo..*hi, *unit; false when none is left. */
static bool find_region(chunker *k, int32_t after, gt_error *err, gt_status *st)
{
    gt_graph *g = k->g;
    *st = GT_OK;
    for (int32_t u = after + 1;; u++) {
        bool any = false, moe = false;
        char prefix[64];
        snprintf(prefix, sizeof prefix, "layers.%d.moe", u);
        const char *pre = k->o->moe_only ? prefix : NULL;
        gt_node_id lo = GT_NONE, hi = GT_NONE;
        for (gt_node_id id = 0; id < g->n_nodes; id++) {
            if (g->nodes[id].unit > u && g->nodes[id].unit >= 0) any = true;
            if (!in_region(g, id, u, pre)) continue;
            any = true;
            moe |= g->nodes[id].op == GT_OP_MOE_COUNT;
            if (lo == GT_NONE) lo = id;
            if (hi != GT_NONE && hi != id) {
                *st = gt_error_set(err, GT_ERR_UNSUPPORTED,
                                   "compile.ep_overlap: block %d's %s nodes are not contiguous "
                                   "(node %d follows node %d)",
                                   u, pre ? "moe" : "forward", id, hi - 1);
                return false;
            }
            hi = id + 1;
        }
        if (!any) return false;
        if (lo != GT_NONE && moe) {
            k->lo = lo, k->hi = hi, k->unit = u;
            return true;
        }
    }
}

/* e (a dim holding the symbol) with the symbol replaced by size. */
static gt_expr at(chunker *k, gt_expr e, gt_expr size)
{
    return gt_sym_replace(k->g->sym, e, k->sym, size);
}

/* Value v, chunked along dim d, cut in two: parts[k] is chunk k's, its slice tagged as chunk k.
 * With groups, each rank's block is cut (the header says how). */
static void cut(chunker *k, gt_value_id v, int d, gt_value_id parts[2])
{
    gt_graph *g = k->g;
    gt_type t = *gt_value_type(g, v);
    gt_expr full = t.dims[d], zero = gt_sym_const(g->sym, 0);
    if (k->groups == 1 || d != 0) {
        gt_expr c0 = at(k, full, k->c[0]);
        parts[0] = gt_slice(g, v, d, zero, c0);
        gt_graph_add_tag(g, g->n_nodes - 1, GT_CHUNK_TAG_0);
        parts[1] = gt_slice(g, v, d, c0, full);
        gt_graph_add_tag(g, g->n_nodes - 1, GT_CHUNK_TAG_1);
        return;
    }
    gt_expr dims[GT_MAX_DIMS + 1], m = gt_sym_add(g->sym, k->m[0], k->m[1]);
    dims[0] = gt_sym_const(g->sym, k->groups);
    dims[1] = at(k, full, m);
    for (int j = 1; j < t.ndim; j++)
        dims[j + 1] = t.dims[j];
    gt_value_id blocks = gt_regroup(g, v, t.ndim + 1, dims);
    gt_expr edge[3] = {zero, at(k, full, k->m[0]), dims[1]};
    for (int c = 0; c < 2; c++) {
        gt_value_id piece = gt_slice(g, blocks, 1, edge[c], edge[c + 1]);
        gt_graph_add_tag(g, g->n_nodes - 1, c ? GT_CHUNK_TAG_1 : GT_CHUNK_TAG_0);
        t.dims[0] = at(k, full, k->c[c]);
        parts[c] = gt_reshape(g, piece, t.ndim, t.dims);
        gt_graph_add_tag(g, g->n_nodes - 1, c ? GT_CHUNK_TAG_1 : GT_CHUNK_TAG_0);
    }
}

/* The chunks' parts of value v (chunked along dim d) joined back into v's type. */
static gt_value_id join_parts(chunker *k, gt_value_id v, int d, const gt_value_id parts[2])
{
    gt_graph *g = k->g;
    if (k->groups == 1 || d != 0) return gt_concat(g, 2, parts, d);
    gt_type t = *gt_value_type(g, v);
    gt_expr dims[GT_MAX_DIMS + 1];
    dims[0] = gt_sym_const(g->sym, k->groups);
    for (int j = 1; j < t.ndim; j++)
        dims[j + 1] = t.dims[j];
    gt_value_id blocks[2];
    for (int c = 0; c < 2; c++) {
        dims[1] = at(k, t.dims[0], k->m[c]);
        blocks[c] = gt_reshape(g, parts[c], t.ndim + 1, dims);
    }
    return gt_regroup(g, gt_concat(g, 2, blocks, 1), t.ndim, t.dims);
}

/* Chunks the region k->lo .. k->hi; track's ids follow. */
static gt_status chunk_region(chunker *k, gt_value_id *track, int n_track, gt_error *err)
{
    gt_graph *g = k->g;
    const gt_node_id lo = k->lo, hi = k->hi, n0 = g->n_nodes;
    const int32_t nv = g->n_values;
    uint8_t *dup = gt_xcalloc((size_t)n0, 1);
    uint8_t *chunked = gt_xcalloc((size_t)nv, 1); /* a chunked live-in or a copied node's value */
    gt_value_id *live_in = gt_xmalloc((size_t)nv * sizeof *live_in);
    int n_live_in = 0;
    gt_status st = GT_OK;
    for (gt_node_id id = lo; id < hi && st == GT_OK; id++) {
        gt_node *n = &g->nodes[id];
        bool d = false;
        for (int j = 0; j < n->n_in; j++) {
            gt_value_id v = n->in[j];
            gt_node_id p = g->values[v].producer;
            bool outside = p == GT_NONE || p < lo;
            if (outside && !chunked[v] && chunk_dim(k, v) != -1) {
                if (chunk_dim(k, v) < 0) {
                    st = refuse(k, v,
                                "enters the region and cannot be cut in two along the "
                                "chunk dim",
                                err);
                    break;
                }
                chunked[v] = 1;
                live_in[n_live_in++] = v;
            }
            d |= chunked[v] != 0;
            if (n->op == GT_OP_CAST && !k->o->early_grad && is_param(g, v)) d = true;
        }
        for (int j = 0; j < n->n_out; j++)
            d |= chunk_dim(k, n->out[j]) != -1;
        if (d) {
            dup[id] = 1;
            for (int j = 0; j < n->n_out; j++)
                chunked[n->out[j]] = 1;
        }
    }
    /* values of copied nodes read after the region, by the graph's outputs or by the caller */
    uint8_t *out = gt_xcalloc((size_t)nv, 1);
    for (gt_node_id id = hi; id < n0; id++)
        for (int j = 0; j < g->nodes[id].n_in; j++)
            out[g->nodes[id].in[j]] = 1;
    for (int32_t j = 0; j < g->n_outputs; j++)
        out[g->outputs[j].value] = 1;
    for (int j = 0; j < n_track; j++)
        if (track[j] >= 0 && track[j] < nv) out[track[j]] = 1;

    gt_node_id *ids = gt_xmalloc((size_t)(hi - lo) * sizeof *ids);
    int n_ids = 0;
    for (gt_node_id id = lo; id < hi; id++)
        if (dup[id]) ids[n_ids++] = id;
    gt_value_id *map[2] = {gt_xmalloc((size_t)nv * sizeof(gt_value_id)),
                           gt_xmalloc((size_t)nv * sizeof(gt_value_id))};
    gt_value_id *join = gt_xmalloc((size_t)nv * sizeof *join);
    for (gt_value_id v = 0; v < nv; v++)
        join[v] = GT_NONE;
    gt_builder_state saved = gt_graph_builder_save(g);
    const gt_node *first = &g->nodes[lo];
    g->cur_fqn = first->fqn;
    g->cur_phase = GT_PHASE_FORWARD;
    g->cur_origin = GT_NONE;
    g->cur_unit = k->unit;
    for (int c = 0; c < 2 && st == GT_OK; c++)
        for (gt_value_id v = 0; v < nv; v++)
            map[c][v] = GT_NONE;
    for (int j = 0; j < n_live_in && st == GT_OK; j++) { /* the slices, chunk 0 then 1 */
        gt_value_id v = live_in[j], parts[2];
        cut(k, v, chunk_dim(k, v), parts);
        map[0][v] = parts[0], map[1][v] = parts[1];
        if (g->err.code != GT_OK) { /* a cut the builder refused: no copy may read it */
            *err = g->err;
            st = err->code;
        }
    }
    for (int c = 0; c < 2 && st == GT_OK; c++) {
        gt_sym_subst s = {k->sym, k->c[c]};
        gt_node_id from = g->n_nodes;
        st = gt_graph_copy_nodes(g, g, ids, n_ids, map[c], &s, err);
        for (gt_node_id id = from; st == GT_OK && id < g->n_nodes; id++)
            gt_graph_add_tag(g, id, c ? GT_CHUNK_TAG_1 : GT_CHUNK_TAG_0);
    }
    for (int j = 0; j < n_ids && st == GT_OK; j++) { /* the joins */
        const gt_node *n = &g->nodes[ids[j]];
        for (int o = 0; o < n->n_out && st == GT_OK; o++) {
            gt_value_id v = n->out[o];
            if (!out[v]) continue;
            int d = chunk_dim(k, v);
            gt_value_id parts[2] = {map[0][v], map[1][v]};
            if (d >= 0)
                join[v] = join_parts(k, v, d, parts);
            else if (d == -1 && n->op == GT_OP_MOE_COUNT)
                join[v] = gt_add(g, parts[0], parts[1]);
            else
                st = refuse(k, v,
                            d == -1 ? "leaves the region without the chunk dim and is no token "
                                      "count (moe_count): the chunks cannot be joined"
                                    : "leaves the region and cannot be joined along the chunk dim",
                            err);
            n = &g->nodes[ids[j]]; /* appending may move the node array */
        }
    }
    if (st == GT_OK && g->err.code != GT_OK) {
        *err = g->err;
        st = err->code;
    }
    gt_graph_builder_restore(g, saved);
    gt_value_id *repl = gt_pass_repl_new(g); /* sized for the new values too */
    for (gt_value_id v = 0; v < nv; v++)
        if (join[v] != GT_NONE) repl[v] = join[v];
    if (st == GT_OK) {
        /* readers after the region, the outputs and the caller's ids take the joins */
        for (gt_node_id id = hi; id < n0; id++)
            gt_pass_repl_node_inputs(g, id, repl);
        gt_pass_repl_outputs(g, repl);
        for (int j = 0; j < n_track; j++)
            if (track[j] >= 0 && track[j] < nv) track[j] = gt_pass_repl_find(repl, track[j]);
        /* order: before, shared, the copied originals (dropped below), new nodes, after */
        int32_t nn = g->n_nodes, at = 0;
        gt_node_id *order = gt_xmalloc((size_t)nn * sizeof *order);
        uint8_t *keep = gt_xmalloc((size_t)nn);
        for (gt_node_id id = 0; id < lo; id++)
            order[at++] = id;
        for (gt_node_id id = lo; id < hi; id++)
            if (!dup[id]) order[at++] = id;
        int32_t first_dropped = at;
        for (int j = 0; j < n_ids; j++)
            order[at++] = ids[j];
        int32_t end_dropped = at;
        for (gt_node_id id = n0; id < nn; id++)
            order[at++] = id;
        for (gt_node_id id = hi; id < n0; id++)
            order[at++] = id;
        gt_pass_apply_order(g, order);
        for (int32_t p = 0; p < nn; p++)
            keep[p] = p < first_dropped || p >= end_dropped;
        /* the value ids compaction gives (gt_pass_compact keeps values in order) */
        int32_t nvals = g->n_values, next = 0;
        gt_value_id *vmap = gt_xmalloc((size_t)nvals * sizeof *vmap);
        for (gt_value_id v = 0; v < nvals; v++) {
            gt_node_id p = g->values[v].producer;
            vmap[v] = p == GT_NONE || keep[p] ? next++ : GT_NONE;
        }
        for (int j = 0; j < n_track; j++)
            if (track[j] >= 0 && track[j] < nvals) track[j] = vmap[track[j]];
        gt_pass_compact(g, keep);
        free(vmap);
        free(order);
        free(keep);
    }
    free(repl);
    free(join);
    free(map[0]);
    free(map[1]);
    free(ids);
    free(out);
    free(live_in);
    free(chunked);
    free(dup);
    return st;
}

gt_status gt_pass_ep_chunk(gt_graph *g, const gt_chunk_options *o, gt_value_id *track, int n_track,
                           gt_error *err)
{
    chunker k = {.g = g, .o = o, .sym = o->seq ? "seq" : "batch"};
    k.groups = !o->seq && o->groups > 1 ? o->groups : 1;
    gt_sym_pool *p = g->sym;
    k.n = gt_sym_var(p, k.sym);
    gt_expr two = gt_sym_const(p, 2), G = gt_sym_const(p, k.groups);
    k.m[0] = gt_sym_floordiv(p, gt_sym_floordiv(p, k.n, G), two);
    k.m[1] = gt_sym_sub(p, gt_sym_floordiv(p, k.n, G), k.m[0]);
    /* one group: c0 = n // 2 and c1 = n - c0 (n // 1 is n itself) */
    k.c[0] = k.groups == 1 ? k.m[0] : gt_sym_mul(p, G, k.m[0]);
    k.c[1] = k.groups == 1 ? gt_sym_sub(p, k.n, k.c[0]) : gt_sym_mul(p, G, k.m[1]);
    int32_t after = -1, regions = 0;
    gt_status st;
    while (find_region(&k, after, err, &st)) {
        GT_TRY(chunk_region(&k, track, n_track, err));
        after = k.unit;
        regions++;
    }
    if (st != GT_OK) return st;
    if (regions == 0)
        return gt_error_set(err, GT_ERR_UNSUPPORTED,
                            "compile.ep_overlap: no MoE block to chunk (module_fqn %s): the "
                            "model routes no tokens",
                            o->moe_only ? "layers.*.moe" : "layers.*");
    return GT_OK;
}
