/* reorder.c — FSDP prefetch: where the FSDP collectives start and where they are waited for,
 * and the node-order machinery the FSDP passes share (order by keys, users, hoistable values).
 *
 * Contract
 *   requires   a graph with a mesh (no-op otherwise) whose FSDP collectives carry the tags
 *              "fsdp.all_gather", "fsdp.reduce_scatter", "fsdp.all_reduce" (parallelize) and
 *              each start has exactly one wait (others are left where they are).
 *   guarantees only the node order changes, and it stays topological:
 *     - prefetch: per phase, the all-gather groups (starts of one bucket — a block, the
 *       embeddings, the rest — by the start's fqn) in node order: group i+1's starts, with the
 *       parameter casts and views feeding them, move to right before the first compute node of
 *       group i (forward: layer i+1 is gathered while layer i computes; backward, whose groups
 *       come in reverse layer order, likewise), but never ahead of group i's own starts and never
 *       further ahead than that: at most one bucket is gathered ahead (memory); with
 *       options->fsdp_prefetch_depth = d > 1, group i+d's starts go before group i's first
 *       compute node instead, d buckets ahead (groups 1 .. d-1 right after their predecessor's
 *       starts); a phase's first group moves to right before the first compute node of the
 *       bucket computed just before its first use, if any (backward: the block after it, whose
 *       weights stayed gathered);
 *     - gradient reduce-scatters and all-reduces start as soon as their inputs exist (with the
 *       flatten/concat nodes that only feed them);
 *     - so do the collectives of activations (starts without an FSDP tag: the token embedding's
 *       all_to_alls, sequence parallel), with the views and permutes that only feed them, and
 *       ahead of the gradient starts that become ready at the same point; their waits (those
 *       with a user in the step) go right before their first use, and the forward or backward
 *       nodes between the previous activation start and this one that it does not need go
 *       right after it (sink_independent);
 *     - every FSDP wait, with the slices and reshapes that only unpack its buffer, moves to right
 *       before the first node that uses the result — for gradient collectives no later than right
 *       after the next gradient group starts, so at most two groups of unsharded gradients are in
 *       flight (memory);
 *     - the waits of the last gradient group whose first user is an optimizer node (the
 *       backward's last reduce-scatters), with everything that depends on them, go after the
 *       optimizer nodes that do not depend on them: the gradient norm's sums over the gradients
 *       already reduced overlap the last transfers.
 *   numerics   exact: the same nodes compute the same values; only their order changes.
 *
 * How nodes move: every node gets a key (position it wants to run before, tie-break) and the new
 * order is the smallest-key-first topological order (gt_pass_order_by_keys). */
#include <stdlib.h>
#include <string.h>

#include "passes/pass_internal.h"

/* ---------------------------------------------------------------- shared machinery */

void gt_pass_uses_build(const gt_graph *g, gt_pass_uses *u)
{
    u->first = gt_xcalloc((size_t)g->n_values + 2, sizeof *u->first);
    int64_t total = 0;
    for (gt_node_id n = 0; n < g->n_nodes; n++)
        for (int k = 0; k < g->nodes[n].n_in; k++)
            u->first[g->nodes[n].in[k] + 1]++;
    for (gt_value_id v = 0; v < g->n_values; v++)
        u->first[v + 1] += u->first[v];
    total = u->first[g->n_values];
    u->node = gt_xmalloc(((size_t)total + 1) * sizeof *u->node);
    int32_t *fill = gt_xmalloc(((size_t)g->n_values + 1) * sizeof *fill);
    memcpy(fill, u->first, (size_t)g->n_values * sizeof *fill);
    for (gt_node_id n = 0; n < g->n_nodes; n++)
        for (int k = 0; k < g->nodes[n].n_in; k++)
            u->node[fill[g->nodes[n].in[k]]++] = n;
    free(fill);
}

void gt_pass_uses_free(gt_pass_uses *u)
{
    free(u->first);
    free(u->node);
    u->first = NULL;
    u->node = NULL;
}

uint8_t *gt_pass_hoistable(const gt_graph *g)
{
    uint8_t *hoist = gt_xcalloc((size_t)g->n_values + 1, 1);
    for (int32_t k = 0; k < g->n_inputs; k++)
        hoist[g->inputs[k].value] = 1;
    for (gt_node_id n = 0; n < g->n_nodes; n++) {
        const gt_node *nd = &g->nodes[n];
        const gt_op_info *info = gt_op_get(nd->op);
        bool ok = info && !(info->flags & (GT_OPF_COLLECTIVE | GT_OPF_RANDOM | GT_OPF_SIDE_EFFECT));
        for (int k = 0; k < nd->n_in && ok; k++)
            ok = hoist[nd->in[k]];
        for (int k = 0; k < nd->n_out; k++)
            hoist[nd->out[k]] = ok;
    }
    return hoist;
}

typedef struct {
    const gt_pass_key *keys;
    gt_node_id *a;
    int32_t n;
} key_heap;

static bool heap_less(const key_heap *h, gt_node_id x, gt_node_id y)
{
    if (gt_pass_key_less(h->keys[x], h->keys[y])) return true;
    if (gt_pass_key_less(h->keys[y], h->keys[x])) return false;
    return x < y;
}

static void heap_push(key_heap *h, gt_node_id x)
{
    int32_t i = h->n++;
    h->a[i] = x;
    while (i > 0 && heap_less(h, h->a[i], h->a[(i - 1) / 2])) {
        gt_node_id t = h->a[i];
        h->a[i] = h->a[(i - 1) / 2];
        h->a[(i - 1) / 2] = t;
        i = (i - 1) / 2;
    }
}

static gt_node_id heap_pop(key_heap *h)
{
    gt_node_id top = h->a[0];
    h->a[0] = h->a[--h->n];
    int32_t i = 0;
    for (;;) {
        int32_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < h->n && heap_less(h, h->a[l], h->a[m])) m = l;
        if (r < h->n && heap_less(h, h->a[r], h->a[m])) m = r;
        if (m == i) break;
        gt_node_id t = h->a[i];
        h->a[i] = h->a[m];
        h->a[m] = t;
        i = m;
    }
    return top;
}

gt_status gt_pass_order_by_keys(gt_graph *g, const gt_pass_key *keys, gt_node_id *order,
                                const char *who, gt_error *err)
{
    int32_t n = g->n_nodes;
    gt_pass_uses u;
    gt_pass_uses_build(g, &u);
    int32_t *missing = gt_xcalloc((size_t)n + 1, sizeof *missing);
    gt_node_id *out = gt_xmalloc(((size_t)n + 1) * sizeof *out);
    key_heap h = {keys, gt_xmalloc(((size_t)n + 1) * sizeof *h.a), 0};
    for (gt_node_id x = 0; x < n; x++) {
        for (int k = 0; k < g->nodes[x].n_in; k++)
            missing[x] += g->values[g->nodes[x].in[k]].producer != GT_NONE;
        if (!missing[x]) heap_push(&h, x);
    }
    int32_t placed = 0;
    while (h.n) {
        gt_node_id x = heap_pop(&h);
        out[placed++] = x;
        for (int k = 0; k < g->nodes[x].n_out; k++) {
            gt_value_id v = g->nodes[x].out[k];
            for (int32_t j = u.first[v]; j < u.first[v + 1]; j++)
                if (--missing[u.node[j]] == 0) heap_push(&h, u.node[j]);
        }
    }
    gt_status st = GT_OK;
    if (placed != n)
        st = gt_error_set(err, GT_ERR_INTERNAL,
                          "%s: the rewritten graph has a cycle (%d of %d nodes could be ordered)",
                          who, placed, n);
    else {
        gt_pass_apply_order(g, out);
        if (order) memcpy(order, out, (size_t)n * sizeof *out);
    }
    free(h.a);
    free(out);
    free(missing);
    gt_pass_uses_free(&u);
    return st;
}

/* ---------------------------------------------------------------- the pass */

typedef struct {
    gt_node_id start, wait;
    int tag;
    uint8_t phase;
    int64_t bucket;
} coll;

/* Collectives of one (tag, phase, bucket), in node order: colls[first .. first + count). */
typedef struct {
    int32_t first, count;
    gt_pass_key start_key; /* the key of its last start once placed */
} group;

typedef struct {
    gt_graph *g;
    int32_t n;
    gt_pass_uses uses;
    uint8_t *hoist;      /* per value */
    uint8_t *unpack;     /* per node: in the unpacking chain of an FSDP wait */
    uint8_t *feeds_grad; /* per node: a gradient start or the packing that only feeds one */
    gt_node_id *wait_fu; /* per node (wait): first node outside its chain using it; n if none */
    uint8_t *unbounded;  /* per node (wait): of a gradient group that no later group bounds */
    gt_pass_key *keys;
    int64_t seq;
    gt_node_id *stack, *list;
    int32_t *mark, stamp;
} reorder_state;

static gt_pass_key next_key(reorder_state *s, int64_t major)
{
    return (gt_pass_key){major, (int64_t)s->n + s->seq++};
}

static void set_key_min(reorder_state *s, gt_node_id x, gt_pass_key k)
{
    if (gt_pass_key_less(k, s->keys[x])) s->keys[x] = k;
}

static bool is_unpack_op(gt_op op)
{
    return op == GT_OP_RESHAPE || op == GT_OP_SLICE;
}

static bool is_pack_op(gt_op op)
{
    return op == GT_OP_RESHAPE || op == GT_OP_SLICE || op == GT_OP_CONCAT || op == GT_OP_PERMUTE ||
           op == GT_OP_TRANSPOSE;
}

static int cmp_node_id(const void *a, const void *b)
{
    gt_node_id x = *(const gt_node_id *)a, y = *(const gt_node_id *)b;
    return (x > y) - (x < y);
}

/* The unpacking chain of wait w (reshapes and slices fed only by w or the chain), into s->list
 * in node order; returns its length and sets s->wait_fu[w] to the first other user. */
static int32_t unpack_chain(reorder_state *s, gt_node_id w)
{
    gt_graph *g = s->g;
    int32_t n_list = 0, n_stack = 0;
    gt_node_id fu = s->n;
    s->stamp++;
    s->mark[w] = s->stamp;
    s->stack[n_stack++] = w;
    while (n_stack) {
        gt_node_id x = s->stack[--n_stack];
        gt_value_id v = g->nodes[x].out[0];
        for (int32_t j = s->uses.first[v]; j < s->uses.first[v + 1]; j++) {
            gt_node_id c = s->uses.node[j];
            if (s->mark[c] == s->stamp) continue;
            if (is_unpack_op(g->nodes[c].op) && g->nodes[c].n_in == 1 && g->nodes[c].n_out == 1) {
                s->mark[c] = s->stamp;
                s->stack[n_stack++] = c;
                s->list[n_list++] = c;
            } else if (c < fu && !s->feeds_grad[c]) {
                /* a gradient start reading this result (HSDP: the all-reduce after the
                 * reduce-scatter) follows the wait wherever it goes */
                fu = c;
            }
        }
    }
    qsort(s->list, (size_t)n_list, sizeof *s->list, cmp_node_id);
    s->wait_fu[w] = fu;
    return n_list;
}

/* Places wait w and its unpacking chain at key k (in node order). */
static void place_wait(reorder_state *s, gt_node_id w, int64_t major, gt_pass_key bound)
{
    int32_t n_list = unpack_chain(s, w);
    gt_pass_key k = next_key(s, major);
    if (gt_pass_key_less(bound, k)) k = bound;
    s->keys[w] = k;
    for (int32_t j = 0; j < n_list; j++) {
        k.minor++;
        s->keys[s->list[j]] = k;
    }
    s->seq += n_list;
}

/* Moves all-gather start x to key position `major`, with the hoistable nodes feeding it (casts,
 * views and packing of parameters) that sit at or after that position. */
static void place_gather_start(reorder_state *s, gt_node_id x, int64_t major)
{
    gt_graph *g = s->g;
    gt_value_id in = g->nodes[x].in[0];
    gt_node_id p = g->values[in].producer;
    if (!s->hoist[in] && p != GT_NONE && major <= p) major = p + 1;
    if (s->hoist[in]) {
        int32_t n_stack = 0;
        s->stamp++;
        if (p != GT_NONE) s->stack[n_stack++] = p, s->mark[p] = s->stamp;
        while (n_stack) {
            gt_node_id y = s->stack[--n_stack];
            if (y < major) continue;
            set_key_min(s, y, (gt_pass_key){major, y});
            for (int k = 0; k < g->nodes[y].n_in; k++) {
                gt_node_id q = g->values[g->nodes[y].in[k]].producer;
                if (q != GT_NONE && s->mark[q] != s->stamp) {
                    s->mark[q] = s->stamp;
                    s->stack[n_stack++] = q;
                }
            }
        }
    }
    s->keys[x] = next_key(s, major);
}

/* The packing nodes (reshape, slice, concat, permute, transpose; not another wait's unpacking)
 * that feed only start x, into s->list in node order followed by x; returns their count (without
 * x). They are marked s->mark[] == s->mark[x]. */
static int32_t packing_chain(reorder_state *s, gt_node_id x, gt_node_id w)
{
    gt_graph *g = s->g;
    /* candidates: packing ancestors, decided from the highest position down so that every user
     * of a candidate is decided before it */
    int32_t n_list = 0, n_stack = 0;
    s->stamp++;
    int32_t in_chain = s->stamp; /* mark value for chain members */
    s->stamp++;
    int32_t seen = s->stamp;
    gt_node_id p0 = g->values[g->nodes[x].in[0]].producer;
    if (p0 != GT_NONE) s->stack[n_stack++] = p0, s->mark[p0] = seen;
    while (n_stack) {
        gt_node_id y = s->stack[--n_stack];
        if (!is_pack_op(g->nodes[y].op) || s->unpack[y]) continue;
        s->list[n_list++] = y;
        for (int k = 0; k < g->nodes[y].n_in; k++) {
            gt_node_id q = g->values[g->nodes[y].in[k]].producer;
            if (q != GT_NONE && s->mark[q] != seen) s->mark[q] = seen, s->stack[n_stack++] = q;
        }
    }
    qsort(s->list, (size_t)n_list, sizeof *s->list, cmp_node_id);
    s->mark[x] = in_chain;
    if (w != GT_NONE) s->mark[w] = in_chain;
    for (int32_t j = n_list - 1; j >= 0; j--) {
        gt_node_id y = s->list[j];
        bool exclusive = true;
        for (int k = 0; k < g->nodes[y].n_out && exclusive; k++) {
            gt_value_id v = g->nodes[y].out[k];
            for (int32_t u = s->uses.first[v]; u < s->uses.first[v + 1] && exclusive; u++)
                exclusive = s->mark[s->uses.node[u]] == in_chain;
            for (int32_t o = 0; o < g->n_outputs && exclusive; o++)
                exclusive = g->outputs[o].value != v;
        }
        if (exclusive) s->mark[y] = in_chain;
    }
    int32_t kept = 0;
    for (int32_t j = 0; j < n_list; j++)
        if (s->mark[s->list[j]] == in_chain) s->list[kept++] = s->list[j];
    s->list[kept] = x;
    return kept;
}

/* Moves start x, with its packing, to right after the last of its real inputs — where that
 * input is going (its key): an input this pass moves later (HSDP: the reduce-scatter's wait
 * before the all-reduce) takes the start along. `ahead`: before the starts placed there without
 * it (an activation's collective goes on the communicator's stream before the gradient
 * reduce-scatters that became ready with it: its result is on the critical path, theirs feed
 * the optimizer). */
static void place_start(reorder_state *s, gt_node_id x, gt_node_id w, bool ahead)
{
    const gt_graph *g = s->g;
    int32_t kept = packing_chain(s, x, w);
    gt_pass_key at = {0, -1}; /* minor -1: right before node `major`, fresh tie-break below */
    for (int32_t j = 0; j <= kept; j++) {
        const gt_node *nd = &g->nodes[s->list[j]];
        for (int k = 0; k < nd->n_in; k++) {
            gt_node_id q = g->values[nd->in[k]].producer;
            if (q == GT_NONE || s->mark[q] == s->mark[x]) continue;
            gt_pass_key after =
                s->keys[q].minor == GT_KEY_STAY ? (gt_pass_key){q + 1, -1} : s->keys[q];
            if (gt_pass_key_less(at, after)) at = after;
        }
    }
    for (int32_t j = 0; j <= kept; j++) {
        gt_pass_key k = at;
        if (at.minor == -1) /* ahead: minors below every next_key's (>= n), in chain order */
            k = ahead ? (gt_pass_key){at.major, j - kept - 2} : next_key(s, at.major);
        s->keys[s->list[j]] = k;
    }
}

/* Sinks independent work under activation collective x (forward, backward): the nodes of x's
 * phase and FSDP bucket (its block) after `prev` (the previous activation start, or -1) and before
 * x in node order that x does not need and that no rule moved (keys still STAY; not collectives)
 * go right after x, so they run while x's transfer is in flight (backward: the weight gradients'
 * matmuls under the sequence-parallel reduce-scatter of the input gradient that the matmuls
 * beside them produced). Other blocks' work stays: their gradients' reduce-scatters start when
 * it is done. */
static void sink_independent(reorder_state *s, gt_node_id prev, gt_node_id x)
{
    const gt_graph *g = s->g;
    if (g->nodes[x].phase == GT_PHASE_OPTIMIZER) return; /* ordered by defer_late_waits */
    int32_t n_stack = 0;
    s->stamp++;
    s->mark[x] = s->stamp;
    s->stack[n_stack++] = x;
    while (n_stack) { /* what x needs, back to prev */
        const gt_node *nd = &g->nodes[s->stack[--n_stack]];
        for (int k = 0; k < nd->n_in; k++) {
            gt_node_id q = g->values[nd->in[k]].producer;
            if (q == GT_NONE || q <= prev || s->mark[q] == s->stamp) continue;
            s->mark[q] = s->stamp;
            s->stack[n_stack++] = q;
        }
    }
    gt_pass_key at = s->keys[x];
    int64_t bucket = g->nodes[x].unit;
    for (gt_node_id y = prev + 1; y < x; y++) {
        const gt_node *nd = &g->nodes[y];
        if (s->mark[y] == s->stamp || s->keys[y].minor != GT_KEY_STAY ||
            nd->phase != g->nodes[x].phase || (gt_op_get(nd->op)->flags & GT_OPF_COLLECTIVE) ||
            nd->unit != bucket)
            continue;
        at.minor++;
        s->keys[y] = at;
    }
}

static int cmp_coll(const void *a, const void *b)
{
    const coll *x = a, *y = b;
    if (x->tag != y->tag) return x->tag - y->tag;
    if (x->phase != y->phase) return (int)x->phase - (int)y->phase;
    if (x->bucket != y->bucket) return x->bucket < y->bucket ? -1 : 1;
    return (x->start > y->start) - (x->start < y->start);
}

/* Groups of sorted colls[0..n) with tag `tag`, ordered by first start; returns the count. */
static int32_t make_groups(const coll *c, int32_t n, int tag, group *out)
{
    int32_t ng = 0;
    for (int32_t k = 0; k < n;) {
        int32_t j = k;
        while (j < n && c[j].tag == c[k].tag && c[j].phase == c[k].phase &&
               c[j].bucket == c[k].bucket)
            j++;
        if (c[k].tag == tag) out[ng++] = (group){k, j - k, {0, 0}};
        k = j;
    }
    /* by first start (insertion sort: groups are few and nearly sorted) */
    for (int32_t a = 1; a < ng; a++) {
        group t = out[a];
        int32_t b = a;
        while (b > 0 && c[out[b - 1].first].start > c[t.first].start) {
            out[b] = out[b - 1];
            b--;
        }
        out[b] = t;
    }
    return ng;
}

/* First compute node (not collective, not hoistable, not unpacking) of `phase` at or after lo
 * whose fqn is in `bucket`; `limit` when there is none before it. */
static gt_node_id first_compute(const reorder_state *s, uint8_t phase, int64_t bucket,
                                gt_node_id lo, gt_node_id limit)
{
    const gt_graph *g = s->g;
    for (gt_node_id x = lo; x < limit; x++) {
        const gt_node *nd = &g->nodes[x];
        const gt_op_info *info = gt_op_get(nd->op);
        if (nd->phase != phase || (info->flags & GT_OPF_COLLECTIVE) || s->unpack[x]) continue;
        if (nd->n_out > 0 && s->hoist[nd->out[0]]) continue;
        if (nd->unit == bucket) return x;
    }
    return limit;
}

/* Where a phase's first gather group may start: the first compute node of the bucket that
 * computes right before the group's first use fu (backward under the default reshard policy: the
 * last block keeps its gathered weights, so the next block's gather starts with that block's
 * backward); -1 (stay) when no other bucket computes before it in the phase. */
static int64_t previous_bucket_start(const reorder_state *s, uint8_t phase, int64_t bucket,
                                     gt_node_id fu)
{
    const gt_graph *g = s->g;
    for (gt_node_id x = fu - 1; x >= 0; x--) {
        const gt_node *nd = &g->nodes[x];
        if (nd->phase != phase || (gt_op_get(nd->op)->flags & GT_OPF_COLLECTIVE) || s->unpack[x])
            continue;
        if (nd->n_out > 0 && s->hoist[nd->out[0]]) continue;
        int64_t b = nd->unit;
        if (b != bucket) return first_compute(s, phase, b, 0, fu);
    }
    return -1;
}

/* depth: how many groups are gathered ahead of the one computing (options->fsdp_prefetch_depth;
 * 1 by default). Group m of a phase starts before the first compute node of group m - depth, never
 * ahead of group m - 1's starts; groups 1 .. depth - 1 right after their predecessor's starts. */
static void prefetch_gathers(reorder_state *s, const coll *c, const group *gr, int32_t ng,
                             int depth)
{
    gt_node_id *fcs = gt_xmalloc(((size_t)ng + 1) * sizeof *fcs);
    /* per phase, in node order of the groups */
    for (int phase = 0; phase <= GT_PHASE_OPTIMIZER; phase++) {
        gt_node_id lo = 0;
        int32_t m = 0;      /* the group's index within its phase */
        int64_t after = -1; /* right after the previous group's last start */
        for (int32_t i = 0; i < ng; i++) {
            const group *q = &gr[i];
            if (c[q->first].phase != phase) continue;
            gt_node_id fu = s->n, last_start = 0;
            for (int32_t k = q->first; k < q->first + q->count; k++) {
                if (s->wait_fu[c[k].wait] < fu) fu = s->wait_fu[c[k].wait];
                if (c[k].start > last_start) last_start = c[k].start;
            }
            int64_t major;
            if (m == 0)
                major = previous_bucket_start(s, (uint8_t)phase, c[q->first].bucket, fu);
            else if (m < depth)
                major = after;
            else
                major = fcs[m - depth] > after ? fcs[m - depth] : after;
            if (major > fu) major = fu;
            for (int32_t k = q->first; k < q->first + q->count; k++) {
                if (major >= 0)
                    place_gather_start(s, c[k].start, major);
                else
                    s->keys[c[k].start] = (gt_pass_key){c[k].start, GT_KEY_STAY};
            }
            /* group m + depth starts before group m's first compute node, not ahead of group
             * m + depth - 1 */
            gt_node_id fc = first_compute(s, (uint8_t)phase, c[q->first].bucket, lo, fu);
            after = major >= 0 ? s->keys[c[q->first + q->count - 1].start].major
                               : (int64_t)last_start + 1;
            fcs[m++] = fc;
            lo = fc < s->n ? fc + 1 : lo;
        }
    }
    free(fcs);
}

static void place_gradients(reorder_state *s, coll *c, group *gr, int32_t ng)
{
    for (int32_t i = 0; i < ng; i++)
        for (int32_t k = gr[i].first; k < gr[i].first + gr[i].count; k++) {
            place_start(s, c[k].start, c[k].wait, false);
            if (gt_pass_key_less(gr[i].start_key, s->keys[c[k].start]) || k == gr[i].first)
                gr[i].start_key = s->keys[c[k].start];
        }
    /* by start key, then each group's waits no later than right after the next group starts */
    for (int32_t a = 1; a < ng; a++) {
        group t = gr[a];
        int32_t b = a;
        while (b > 0 && gt_pass_key_less(t.start_key, gr[b - 1].start_key)) {
            gr[b] = gr[b - 1];
            b--;
        }
        gr[b] = t;
    }
    for (int32_t i = 0; i < ng; i++) {
        gt_pass_key bound = {GT_KEY_STAY, GT_KEY_STAY};
        if (i + 1 < ng)
            bound = (gt_pass_key){gr[i + 1].start_key.major, gr[i + 1].start_key.minor + 1};
        for (int32_t k = gr[i].first; k < gr[i].first + gr[i].count; k++) {
            place_wait(s, c[k].wait, s->wait_fu[c[k].wait], bound);
            s->unbounded[c[k].wait] = i + 1 == ng;
        }
    }
}

/* The waits of the last gradient group (no later group bounds them) whose first user is in the
 * optimizer — the backward's last reduce-scatters: nothing is left to overlap them but the
 * optimizer's own work — and every node that depends on them go after the optimizer nodes that
 * do not: the gradient norm's sums of the gradients already reduced run while the last ones are
 * still in flight. Keys only rise. */
static void defer_late_waits(reorder_state *s, const coll *c, int32_t nc)
{
    gt_graph *g = s->g;
    uint8_t *late = gt_xcalloc((size_t)s->n + 1, 1);
    bool any = false;
    for (int32_t k = 0; k < nc; k++) {
        gt_node_id w = c[k].wait, fu = s->wait_fu[w];
        if (c[k].tag != 0 && s->unbounded[w] && fu < s->n &&
            g->nodes[fu].phase == GT_PHASE_OPTIMIZER)
            late[w] = 1, any = true;
    }
    gt_node_id last_free = -1;
    for (gt_node_id x = 0; any && x < s->n; x++) {
        const gt_node *nd = &g->nodes[x];
        for (int j = 0; j < nd->n_in && !late[x]; j++) {
            gt_node_id p = g->values[nd->in[j]].producer;
            late[x] = p != GT_NONE && late[p];
        }
        if (!late[x] && nd->phase == GT_PHASE_OPTIMIZER) last_free = x;
    }
    for (gt_node_id x = 0; any && last_free >= 0 && x < s->n; x++) {
        gt_pass_key k = {last_free + 1, x};
        if (late[x] && gt_pass_key_less(s->keys[x], k)) s->keys[x] = k;
    }
    free(late);
}

gt_status gt_pass_fsdp_reorder(gt_graph *g, const gt_pass_ctx *ctx, gt_error *err)
{
    int depth = ctx && ctx->options && ctx->options->fsdp_prefetch_depth > 1
                    ? ctx->options->fsdp_prefetch_depth
                    : 1;
    if (g->mesh.ndim == 0 || g->n_nodes == 0) return GT_OK;
    int32_t n = g->n_nodes;
    gt_node_id *wait_of = gt_pass_find_waits(g);
    coll *c = gt_xmalloc(((size_t)n + 1) * sizeof *c);
    int32_t nc = 0;
    for (gt_node_id x = 0; x < n; x++) {
        const gt_node *nd = &g->nodes[x];
        int tag = gt_op_is_collective_start(nd->op) ? gt_pass_fsdp_tag(g, nd) : -1;
        if (tag < 0 || wait_of[x] == GT_NONE) continue;
        c[nc++] = (coll){x, wait_of[x], tag, nd->phase, nd->unit};
    }
    if (nc == 0) {
        free(wait_of);
        free(c);
        return GT_OK;
    }
    qsort(c, (size_t)nc, sizeof *c, cmp_coll);

    reorder_state s = {.g = g, .n = n};
    gt_pass_uses_build(g, &s.uses);
    s.hoist = gt_pass_hoistable(g);
    s.unpack = gt_xcalloc((size_t)n + 1, 1);
    s.feeds_grad = gt_xcalloc((size_t)n + 1, 1);
    s.wait_fu = gt_xmalloc(((size_t)n + 1) * sizeof *s.wait_fu);
    s.unbounded = gt_xcalloc((size_t)n + 1, 1);
    s.keys = gt_xmalloc(((size_t)n + 1) * sizeof *s.keys);
    s.stack = gt_xmalloc(((size_t)n + 1) * sizeof *s.stack);
    s.list = gt_xmalloc(((size_t)n + 2) * sizeof *s.list);
    s.mark = gt_xcalloc((size_t)n + 1, sizeof *s.mark);
    for (gt_node_id x = 0; x < n; x++)
        s.keys[x] = (gt_pass_key){x, GT_KEY_STAY};
    /* unpacking chains of every FSDP wait, then the packing of every gradient start, then the
     * first users of every wait */
    for (int32_t k = 0; k < nc; k++) {
        int32_t len = unpack_chain(&s, c[k].wait);
        for (int32_t j = 0; j < len; j++)
            s.unpack[s.list[j]] = 1;
    }
    for (int32_t k = 0; k < nc; k++) {
        if (c[k].tag == 0) continue;
        int32_t len = packing_chain(&s, c[k].start, c[k].wait);
        for (int32_t j = 0; j <= len; j++)
            s.feeds_grad[s.list[j]] = 1;
        s.feeds_grad[c[k].wait] = 1; /* it reads the start's input too */
    }
    for (int32_t k = 0; k < nc; k++)
        unpack_chain(&s, c[k].wait);

    group *gr = gt_xmalloc(((size_t)nc + 1) * sizeof *gr);
    int32_t ng = make_groups(c, nc, 0, gr);
    prefetch_gathers(&s, c, gr, ng, depth);
    for (int32_t i = 0; i < ng; i++)
        for (int32_t k = gr[i].first; k < gr[i].first + gr[i].count; k++)
            place_wait(&s, c[k].wait, s.wait_fu[c[k].wait],
                       (gt_pass_key){GT_KEY_STAY, GT_KEY_STAY});
    for (int tag = 1; tag <= 2; tag++) {
        ng = make_groups(c, nc, tag, gr);
        place_gradients(&s, c, gr, ng);
    }
    defer_late_waits(&s, c, nc);
    /* activation collectives: start as soon as their input exists, waited for right before
     * their first use (backward: a sequence-parallel reduce-scatter of an input gradient runs
     * while the weight gradients' matmuls compute: sink_independent) */
    gt_node_id prev = -1;
    for (gt_node_id x = 0; x < n; x++)
        if (gt_op_is_collective_start(g->nodes[x].op) && gt_pass_fsdp_tag(g, &g->nodes[x]) < 0 &&
            wait_of[x] != GT_NONE) {
            place_start(&s, x, wait_of[x], true);
            unpack_chain(&s, wait_of[x]);
            if (s.wait_fu[wait_of[x]] < n) /* one whose result only leaves the step stays */
                place_wait(&s, wait_of[x], s.wait_fu[wait_of[x]],
                           (gt_pass_key){GT_KEY_STAY, GT_KEY_STAY});
            sink_independent(&s, prev, x);
            prev = x;
        }
    free(wait_of);
    gt_status st = gt_pass_order_by_keys(g, s.keys, NULL, "fsdp_reorder", err);

    free(gr);
    free(s.mark);
    free(s.list);
    free(s.stack);
    free(s.keys);
    free(s.wait_fu);
    free(s.unbounded);
    free(s.feeds_grad);
    free(s.unpack);
    free(s.hoist);
    gt_pass_uses_free(&s.uses);
    free(c);
    return st;
}
