/* bucketing.c — FSDP bucketing: the FSDP collectives of one bucket become one collective over a
 * flat buffer, so a block's parameters are gathered (and its gradients reduce-scattered) by one
 * transfer instead of one per tensor.
 *
 * Contract
 *   requires   a graph with a mesh (no-op otherwise). The candidates are the collective starts
 *              tagged "fsdp.all_gather", "fsdp.reduce_scatter" or "fsdp.all_reduce" (parallelize)
 *              that have exactly one wait and an input of constant size, not yet bucketed.
 *   guarantees candidates with the same tag, op, mesh dim, group size, dtype and phase whose
 *              start is in the same structural unit (gt_node.unit, set by the model builder) — a
 *              repeated block, the token embedding, or everything else (norm, output) — are
 *              replaced by one start and one wait (tags: the FSDP tag and "bucket:block.N",
 *              "bucket:embed" or "bucket:rest"; fqn: the members' common module path). With
 * options->bucket_cap_bytes > 0 a bucket is cut, in node order, into pieces whose members'
 * unsharded sizes sum to at most the cap. Rank r's view, n = group size, member i with numel_i
 * elements at offset off_i, S = sum numel_i: all_gather:     x_i [k_i, ...] -> reshape [numel_i] ->
 * concat -> [S] -> all_gather -> [n*S]
 *                     -> reshape [n, S] -> slice columns [off_i, off_i + numel_i) -> [n, numel_i]
 *                     -> reshape [n*k_i, ...]: row block r of member i is rank r's x_i, as before;
 *     reduce_scatter: x_i [n*k_i, ...] -> reshape [n, numel_i/n] -> concat along dim 1 -> [n, T]
 *                     (T = S/n) -> reshape [n*T] -> reduce_scatter -> [T] (row r of the summed
 *                     [n, T]: rank r's block of every member) -> slice [off_i/n, off_i/n +
 *                     numel_i/n) -> reshape [k_i, ...];
 *     all_reduce:     flatten, concat, all_reduce, slice, reshape.
 *              A concat node takes at most GT_MAX_IN inputs; past that, the cheapest contiguous
 *              run of members is concatenated first (its bytes are copied twice, every other
 *              member's once: a llama3 block's 9 members re-copy two small neighbours, not 8).
 *              The start goes where the first member's start was, with the parameter casts and
 *              views feeding later members moved up to it; when a member's input is real compute
 *              produced later, the start goes right after the last such producer instead (the
 *              reshapes and slices between that producer and the member's input move along).
 *              The wait (and the unpacking) goes right before the first use of any member's
 *              result. When that is impossible (an input produced after a use), the bucket is
 *              cut there.
 *              Each member's result keeps its old placements; the flat buffers are S(0) (gather
 *              input, scatter output) or P (reduction input) on the collective's mesh dim.
 *              Members whose input depends on another candidate's result (HSDP: the all-reduce of
 *              a reduce-scatter's output) are bucketed in a later round, after their producers.
 *   numerics   exact: gathers move bytes; reductions sum every element over the same ranks in the
 *              same (rank) order, whatever buffer it sits in.
 *
 * With options->gathers_unbucketed the all-gathers are not candidates: each tensor keeps its own
 * gather (no packing, no unpacking), and the CUDA executor posts a block's adjacent gathers as one
 * NCCL group.
 *
 * Cost: a few sweeps over the graph per round (usually two rounds), plus the sort by keys. */
#include <stdlib.h>
#include <string.h>

#include "graphtrain/gt_build.h"
#include "passes/pass_internal.h"

typedef struct {
    gt_node_id start, wait;
    gt_value_id in; /* the start's input */
    int tag;
    gt_op op;
    int mesh_dim, group_size;
    gt_dtype dtype;
    uint8_t phase;
    int64_t bucket;
    int64_t numel, bytes;
    gt_node_id avail;     /* last producer its start must follow; -1 when it can move anywhere */
    gt_node_id first_use; /* first user of the wait's output; n when none */
    int32_t bucket_id;    /* this round's partition */
    int piece;            /* index among its group's buckets; -1 when the group is one */
    bool deferred;        /* reads a result rewritten this round: next round */
} member;

static int cmp_member(const void *a, const void *b)
{
    const member *x = a, *y = b;
#define CMP(f)                                                                                     \
    if (x->f != y->f) return x->f < y->f ? -1 : 1
    CMP(tag);
    CMP(op);
    CMP(mesh_dim);
    CMP(group_size);
    CMP(dtype);
    CMP(phase);
    CMP(bucket);
    CMP(start);
#undef CMP
    return 0;
}

/* A gather bucket's members in the order of their inputs (the start's order breaking ties): the
 * backward's re-gather of a block then packs the same values in the same order as its forward
 * gather, and takes the forward's buffer (emit_bucket). */
static int cmp_gather_member(const void *a, const void *b)
{
    const member *x = a, *y = b;
    if (x->in != y->in) return x->in < y->in ? -1 : 1;
    return x->start < y->start ? -1 : x->start > y->start;
}

static bool same_group(const member *x, const member *y)
{
    return x->tag == y->tag && x->op == y->op && x->mesh_dim == y->mesh_dim &&
           x->group_size == y->group_size && x->dtype == y->dtype && x->phase == y->phase &&
           x->bucket == y->bucket;
}

static bool const_numel(const gt_graph *g, gt_value_id v, int64_t *numel)
{
    const gt_type *t = gt_value_type(g, v);
    int64_t n = 1, d;
    for (int k = 0; k < t->ndim; k++) {
        if (!gt_sym_is_const(g->sym, t->dims[k], &d)) return false;
        n *= d;
    }
    *numel = n;
    return true;
}

/* ---------------------------------------------------------------- one round */

typedef struct {
    gt_graph *g;
    int32_t n;              /* nodes before this round's rewrites */
    uint8_t *hoist;         /* per value (of the original n_values) */
    gt_value_id *view_root; /* per value: what a chain of reshapes and slices reads */
    gt_pass_key *keys;
    int32_t cap_keys;
    int64_t seq;
    gt_value_id *repl; /* over the original values */
    uint8_t *dead;     /* per original node */
    gt_node_id *stack;
    int32_t *mark, stamp;
    gt_value_id *scratch; /* concat tree */
    int64_t *scratch_bytes;
    /* the gather buckets packed so far: pack value, where it was put, mesh dim, group size and
     * member inputs */
    struct gather_pack {
        gt_value_id buf;
        gt_node_id at;
        int mesh_dim, group_size;
        int32_t count;
        gt_value_id *ins;
    } * packs;
    int32_t n_packs;
} round_state;

/* The pack of a gather bucket over the same inputs in the same order, put before position at,
 * or GT_NONE. */
static gt_value_id find_pack(const round_state *s, const member *m, int32_t count, gt_node_id at)
{
    for (int32_t k = 0; k < s->n_packs; k++) {
        const struct gather_pack *p = &s->packs[k];
        bool same = p->at <= at && p->count == count && p->mesh_dim == m[0].mesh_dim &&
                    p->group_size == m[0].group_size;
        for (int32_t i = 0; same && i < count; i++)
            same = p->ins[i] == m[i].in;
        if (same) return p->buf;
    }
    return GT_NONE;
}

static void add_pack(round_state *s, const member *m, int32_t count, gt_value_id buf, gt_node_id at)
{
    s->packs = gt_xrealloc(s->packs, (size_t)(s->n_packs + 1) * sizeof *s->packs);
    struct gather_pack *p = &s->packs[s->n_packs++];
    *p = (struct gather_pack){
        buf, at, m[0].mesh_dim, m[0].group_size, count, gt_xmalloc((size_t)count * sizeof *p->ins)};
    for (int32_t i = 0; i < count; i++)
        p->ins[i] = m[i].in;
}

/* Keys for the nodes appended since `from`: right before position major, in creation order. */
static void key_new_nodes(round_state *s, gt_node_id from, int64_t major)
{
    gt_graph *g = s->g;
    if (g->n_nodes > s->cap_keys) {
        s->cap_keys = g->n_nodes * 2;
        s->keys = gt_xrealloc(s->keys, (size_t)s->cap_keys * sizeof *s->keys);
    }
    for (gt_node_id x = from; x < g->n_nodes; x++)
        s->keys[x] = (gt_pass_key){major, (int64_t)s->n + s->seq++};
}

/* Gives the hoistable nodes behind value v that sit at or after major the key (major, position),
 * so that they run, in their old order, right before the bucket's start. */
static void hoist_chain(round_state *s, gt_value_id v, int64_t major)
{
    gt_graph *g = s->g;
    int32_t n_stack = 0;
    s->stamp++;
    gt_node_id p = g->values[v].producer;
    if (p != GT_NONE) s->stack[n_stack++] = p, s->mark[p] = s->stamp;
    while (n_stack) {
        gt_node_id y = s->stack[--n_stack];
        if (y < major) continue;
        gt_pass_key k = {major, y};
        if (gt_pass_key_less(k, s->keys[y])) s->keys[y] = k;
        for (int j = 0; j < g->nodes[y].n_in; j++) {
            gt_node_id q = g->values[g->nodes[y].in[j]].producer;
            if (q != GT_NONE && s->mark[q] != s->stamp)
                s->mark[q] = s->stamp, s->stack[n_stack++] = q;
        }
    }
}

/* Moves the reshapes and slices between value v and its view root to right before position
 * major (those at or after it), in their old order: they only re-read bytes that exist there. */
static void hoist_views(round_state *s, gt_value_id v, int64_t major)
{
    gt_graph *g = s->g;
    while (v != s->view_root[v]) {
        gt_node_id p = g->values[v].producer;
        gt_pass_key k = {major, p};
        if (p >= major && gt_pass_key_less(k, s->keys[p])) s->keys[p] = k;
        v = g->nodes[p].in[0];
    }
}

static gt_status node_failed(gt_graph *g, const char *what, gt_error *err)
{
    gt_status st = gt_error_set(err, GT_ERR_INTERNAL, "fsdp_bucketing: cannot build the %s: %s",
                                what, g->err.msg);
    memset(&g->err, 0, sizeof g->err);
    return st;
}

/* Concatenates xs[0..n) (bytes[i] each) along dim, in order, at most GT_MAX_IN inputs per node.
 * Every concat level copies what passes through it, so while more than GT_MAX_IN remain, the
 * contiguous run of the fewest bytes among those whose concat brings the count down (length
 * min(GT_MAX_IN, n - GT_MAX_IN + 1)) becomes one inner concat: a llama3 block's 9 members copy
 * two small neighbours twice, not eight of them. GT_NONE when a node cannot be built. */
static gt_value_id concat_tree(round_state *s, gt_value_id *xs, int64_t *bytes, int32_t n, int dim)
{
    gt_graph *g = s->g;
    while (n > GT_MAX_IN) {
        int32_t len = n - GT_MAX_IN + 1 < GT_MAX_IN ? n - GT_MAX_IN + 1 : GT_MAX_IN, best = 0;
        int64_t best_bytes = INT64_MAX;
        for (int32_t i = 0; i + len <= n; i++) {
            int64_t b = 0;
            for (int32_t k = i; k < i + len; k++)
                b += bytes[k];
            if (b < best_bytes) best = i, best_bytes = b;
        }
        xs[best] = gt_concat(g, len, xs + best, dim);
        if (xs[best] == GT_NONE) return GT_NONE;
        bytes[best] = best_bytes;
        memmove(xs + best + 1, xs + best + len, (size_t)(n - best - len) * sizeof *xs);
        memmove(bytes + best + 1, bytes + best + len, (size_t)(n - best - len) * sizeof *bytes);
        n -= len - 1;
    }
    return n == 1 ? xs[0] : gt_concat(g, n, xs, dim);
}

/* place[] of a flat buffer: `on_dim` on the collective's mesh dim; on the others, what every
 * member's value has there when it is replicate or partial (HSDP: partial over dp_replicate),
 * else replicate. */
static void set_flat_place(gt_graph *g, gt_value_id v, const member *m, int32_t count,
                           gt_place_kind on_dim, bool from_outputs)
{
    gt_placement *pl = g->values[v].place;
    memset(pl, 0, sizeof g->values[v].place);
    for (int d = 0; d < g->mesh.ndim && d < GT_MESH_MAX_DIMS; d++) {
        if (d == m[0].mesh_dim) {
            pl[d] = (gt_placement){(uint8_t)on_dim, 0, 0, 0};
            continue;
        }
        gt_placement first = {0, 0, 0, 0};
        bool same = true;
        for (int32_t i = 0; i < count && same; i++) {
            const gt_node *st = &g->nodes[m[i].start];
            gt_value_id mv = from_outputs ? g->nodes[m[i].wait].out[0] : st->in[0];
            gt_placement p = g->values[mv].place[d];
            if (i == 0) first = p;
            same = p.kind == first.kind && p.kind != GT_PLACE_SHARD;
        }
        if (same) pl[d] = first;
    }
}

static int common_prefix_len(const char *a, const char *b)
{
    int len = 0, k = 0;
    for (; a[k] && a[k] == b[k]; k++)
        if (a[k + 1] == '.' || a[k + 1] == 0)
            len = (b[k + 1] == '.' || b[k + 1] == 0) ? k + 1 : len;
    return len;
}

/* The bucket's fqn (members' common module path, else the first member's) and its tag name. */
static void bucket_names(const gt_graph *g, const member *m, int32_t count, int piece, char *fqn,
                         size_t fqn_len, char *tag, size_t tag_len)
{
    const char *first = gt_graph_str(g, g->nodes[m[0].start].fqn);
    int len = (int)strlen(first);
    for (int32_t i = 1; i < count; i++) {
        int c = common_prefix_len(first, gt_graph_str(g, g->nodes[m[i].start].fqn));
        if (c < len) len = c;
    }
    if (len == 0) len = (int)strlen(first);
    snprintf(fqn, fqn_len, "%.*s", len, first);
    char name[64];
    if (m[0].bucket >= 0)
        snprintf(name, sizeof name, "block.%lld", (long long)m[0].bucket);
    else
        snprintf(name, sizeof name, "%s", m[0].bucket == GT_UNIT_EMBED ? "embed" : "rest");
    if (piece >= 0)
        snprintf(tag, tag_len, "%s%s/%d", GT_FSDP_BUCKET_TAG_PREFIX, name, piece);
    else
        snprintf(tag, tag_len, "%s%s", GT_FSDP_BUCKET_TAG_PREFIX, name);
}

/* Rewrites members m[0..count) as one collective: start (with its packing) right before
 * position at_start, wait (with its unpacking) right before position at_wait. */
static gt_status emit_bucket(round_state *s, const member *m, int32_t count, int piece,
                             gt_node_id at_start, gt_node_id at_wait, gt_error *err)
{
    gt_graph *g = s->g;
    int64_t n = m[0].group_size, total = 0;
    gt_op op = m[0].op;
    for (int32_t i = 0; i < count; i++)
        total += m[i].numel;
    char fqn[256], tag[96];
    bucket_names(g, m, count, piece, fqn, sizeof fqn, tag, sizeof tag);
    gt_builder_state saved = gt_graph_builder_save(g);
    g->cur_phase = (gt_phase)m[0].phase;
    g->cur_unit = (int32_t)m[0].bucket; /* every member's unit */
    gt_status st = GT_OK;

    /* packing: flat member buffers, concatenated; a re-gather takes its earlier gather's pack */
    gt_place_kind pack_kind = op == GT_OP_ALL_GATHER_START ? GT_PLACE_SHARD : GT_PLACE_PARTIAL;
    gt_node_id from = g->n_nodes;
    gt_value_id reused = op == GT_OP_ALL_GATHER_START ? find_pack(s, m, count, at_start) : GT_NONE;
    for (int32_t i = 0; i < count && reused == GT_NONE; i++) {
        const gt_node *start = &g->nodes[m[i].start];
        gt_value_id x = start->in[0];
        g->cur_fqn = start->fqn;
        g->cur_origin = start->origin;
        /* [numel_i], or [n, numel_i / n] for a scatter (row r: the block rank r receives) */
        gt_type flat = {.dtype = m[i].dtype, .ndim = 1, .dims = {gt_c(g, m[i].numel)}};
        if (op == GT_OP_REDUCE_SCATTER_START)
            flat.ndim = 2, flat.dims[0] = gt_c(g, n), flat.dims[1] = gt_c(g, m[i].numel / n);
        if (s->hoist[x])
            hoist_chain(s, x, at_start);
        else
            hoist_views(s, x, at_start);
        s->scratch_bytes[i] = m[i].bytes;
        if (gt_pass_type_equal(gt_value_type(g, x), &flat)) {
            s->scratch[i] = x;
            continue;
        }
        s->scratch[i] = gt_reshape(g, x, flat.ndim, flat.dims);
        if (s->scratch[i] == GT_NONE) {
            st = node_failed(g, "member flattening", err);
            break;
        }
        set_flat_place(g, s->scratch[i], m + i, 1, pack_kind, false);
    }
    g->cur_fqn = gt_graph_intern(g, fqn);
    g->cur_origin = GT_NONE;
    gt_value_id buf = reused;
    if (st == GT_OK && reused == GT_NONE) {
        int cat_dim = op == GT_OP_REDUCE_SCATTER_START ? 1 : 0;
        buf = concat_tree(s, s->scratch, s->scratch_bytes, count, cat_dim);
        if (buf != GT_NONE && op == GT_OP_REDUCE_SCATTER_START) {
            /* [n, S] -> [n*S]: S = total / n per rank */
            gt_expr flat = gt_c(g, total);
            buf = gt_reshape(g, buf, 1, &flat);
        }
        if (buf == GT_NONE) st = node_failed(g, "bucket buffer", err);
        if (st == GT_OK && op == GT_OP_ALL_GATHER_START) add_pack(s, m, count, buf, at_start);
    }
    gt_value_id pending = GT_NONE, done = GT_NONE;
    if (st == GT_OK) {
        for (gt_node_id x = from; x < g->n_nodes; x++)
            if (g->nodes[x].op == GT_OP_CONCAT)
                set_flat_place(g, g->nodes[x].out[0], m, count, pack_kind, false);
        if (reused == GT_NONE) set_flat_place(g, buf, m, count, pack_kind, false);
        gt_attrs a = {0};
        a.ni = 2, a.i[0] = m[0].mesh_dim, a.i[1] = n;
        pending = gt_graph_add_node(g, op, &buf, 1, &a, NULL);
        if (pending == GT_NONE) st = node_failed(g, "bucket collective", err);
    }
    if (st == GT_OK) {
        gt_graph_add_tag(g, g->n_nodes - 1, gt_pass_fsdp_tags[m[0].tag]);
        gt_graph_add_tag(g, g->n_nodes - 1, tag);
        key_new_nodes(s, from, at_start);
        from = g->n_nodes;
        gt_value_id in[2] = {pending, buf};
        done = gt_graph_add_node(g, GT_OP_WAIT, in, 2, NULL, NULL);
        if (done == GT_NONE) st = node_failed(g, "bucket wait", err);
    }
    if (st == GT_OK) {
        gt_graph_add_tag(g, g->n_nodes - 1, gt_pass_fsdp_tags[m[0].tag]);
        gt_graph_add_tag(g, g->n_nodes - 1, tag);
        gt_place_kind after =
            op == GT_OP_REDUCE_SCATTER_START ? GT_PLACE_SHARD : GT_PLACE_REPLICATE;
        set_flat_place(g, pending, m, count, after, true);
        set_flat_place(g, done, m, count, after, true);
        if (op == GT_OP_ALL_GATHER_START) {
            gt_expr rows[2] = {gt_c(g, n), gt_c(g, total)};
            done = gt_reshape(g, done, 2, rows);
            if (done == GT_NONE)
                st = node_failed(g, "bucket unpacking", err);
            else
                set_flat_place(g, done, m, count, after, true);
        }
    }
    /* unpacking: each member's slice, reshaped to its old result type */
    int64_t off = 0;
    for (int32_t i = 0; i < count && st == GT_OK; i++) {
        gt_value_id old = g->nodes[m[i].wait].out[0];
        gt_type want = *gt_value_type(g, old); /* a copy: adding nodes moves the value array */
        g->cur_fqn = g->nodes[m[i].start].fqn;
        g->cur_origin = g->nodes[m[i].start].origin;
        int64_t len = op == GT_OP_REDUCE_SCATTER_START ? m[i].numel / n : m[i].numel;
        gt_value_id piece_v = gt_slice(g, done, op == GT_OP_ALL_GATHER_START ? 1 : 0, gt_c(g, off),
                                       gt_c(g, off + len));
        off += len;
        if (piece_v == GT_NONE) {
            st = node_failed(g, "member slice", err);
            break;
        }
        set_flat_place(g, piece_v, m + i, 1,
                       op == GT_OP_REDUCE_SCATTER_START ? GT_PLACE_SHARD : GT_PLACE_REPLICATE,
                       true);
        if (!gt_pass_type_equal(gt_value_type(g, piece_v), &want)) {
            piece_v = gt_reshape(g, piece_v, want.ndim, want.dims);
            if (piece_v == GT_NONE) {
                st = node_failed(g, "member result", err);
                break;
            }
        }
        memcpy(g->values[piece_v].place, g->values[old].place, sizeof g->values[old].place);
        g->values[piece_v].name = g->values[old].name;
        s->repl[old] = piece_v;
        s->dead[m[i].start] = 1;
        s->dead[m[i].wait] = 1;
    }
    if (st == GT_OK) key_new_nodes(s, from, at_wait);
    gt_graph_builder_restore(g, saved);
    return st;
}

/* Cuts the group m[0..count) (sorted by start) into buckets, in node order: a member joins the
 * current bucket while the byte cap holds and the bucket's start can still precede its first use
 * (after every input that cannot move, not before the first member's start). Sets bucket and
 * piece of every member; returns the next free bucket id. */
static int32_t partition_group(member *m, int32_t count, int64_t cap, int32_t next_id)
{
    int32_t first = next_id;
    for (int32_t k = 0; k < count;) {
        gt_node_id last_avail = m[k].avail, first_use = m[k].first_use;
        int64_t bytes = m[k].bytes;
        int32_t j = k + 1;
        for (; j < count; j++) {
            gt_node_id la = m[j].avail > last_avail ? m[j].avail : last_avail;
            gt_node_id fu = m[j].first_use < first_use ? m[j].first_use : first_use;
            gt_node_id at = la + 1 > m[k].start ? la + 1 : m[k].start;
            if ((cap > 0 && bytes + m[j].bytes > cap) || at > fu) break;
            last_avail = la, first_use = fu, bytes += m[j].bytes;
        }
        for (int32_t i = k; i < j; i++)
            m[i].bucket_id = next_id, m[i].piece = next_id - first;
        next_id++;
        k = j;
    }
    if (next_id - first == 1)
        for (int32_t i = 0; i < count; i++)
            m[i].piece = -1;
    return next_id;
}

/* Emits the bucket of the members b[0..count) that were not deferred: start right after the
 * last input that cannot move (not before the first member's start), wait right before the
 * first use. Dropping members only relaxes both bounds, so the partition's check still holds. */
static gt_status emit_members(round_state *s, member *b, int32_t count, int *emitted, gt_error *err)
{
    int32_t kept = 0;
    for (int32_t i = 0; i < count; i++)
        if (!b[i].deferred) b[kept++] = b[i];
    if (kept < 2) return GT_OK;
    gt_node_id last_avail = -1, first_use = s->n;
    for (int32_t i = 0; i < kept; i++) {
        if (b[i].avail > last_avail) last_avail = b[i].avail;
        if (b[i].first_use < first_use) first_use = b[i].first_use;
    }
    gt_node_id at = last_avail + 1 > b[0].start ? last_avail + 1 : b[0].start;
    GT_CHECK(at <= first_use);
    if (b[0].op == GT_OP_ALL_GATHER_START) qsort(b, (size_t)kept, sizeof *b, cmp_gather_member);
    (*emitted)++;
    return emit_bucket(s, b, kept, b[0].piece, at, first_use, err);
}

/* Finds this round's candidates and rewrites their buckets. *emitted = buckets made. */
static gt_status bucket_round(gt_graph *g, const gt_pass_options *o, int *emitted, gt_error *err)
{
    *emitted = 0;
    int32_t n = g->n_nodes, nv = g->n_values;
    gt_node_id *wait_of = gt_pass_find_waits(g);
    member *m = gt_xmalloc(((size_t)n + 1) * sizeof *m);
    uint8_t *cand_node = gt_xcalloc((size_t)n + 1, 1);
    int32_t nm = 0;
    for (gt_node_id x = 0; x < n; x++) {
        const gt_node *nd = &g->nodes[x];
        if (!gt_op_is_collective_start(nd->op) || wait_of[x] == GT_NONE) continue;
        int tag = gt_pass_fsdp_tag(g, nd);
        int64_t numel, out_numel;
        if (o && o->gathers_unbucketed && nd->op == GT_OP_ALL_GATHER_START) continue;
        if (tag < 0 || gt_pass_is_bucketed(g, nd) || !const_numel(g, nd->in[0], &numel) ||
            !const_numel(g, nd->out[0], &out_numel) || numel == 0)
            continue;
        const gt_type *t = gt_value_type(g, nd->in[0]);
        int64_t big = numel > out_numel ? numel : out_numel;
        cand_node[x] = cand_node[wait_of[x]] = 1;
        m[nm++] = (member){.start = x,
                           .wait = wait_of[x],
                           .in = nd->in[0],
                           .tag = tag,
                           .op = nd->op,
                           .mesh_dim = (int)nd->attrs.i[0],
                           .group_size = (int)nd->attrs.i[1],
                           .dtype = t->dtype,
                           .phase = nd->phase,
                           .bucket = nd->unit,
                           .numel = numel,
                           .bytes = big * (int64_t)gt_dtype_size(t->dtype)};
    }
    free(wait_of);
    qsort(m, (size_t)nm, sizeof *m, cmp_member);

    /* Where each start may go and where each result is first needed. A use by another
     * candidate's start (or its wait, which lists the start's input) is left out: that candidate
     * reads a result rewritten this round, so the taint sweep below defers it, and the sort by
     * keys delays it behind the new wait. */
    uint8_t *hoist = gt_pass_hoistable(g);
    /* A reshape or slice of a computed value can run anywhere after that value (HSDP: the
     * all-reduce members read slices of a bucketed reduce-scatter's result). */
    gt_value_id *view_root = gt_xmalloc(((size_t)nv + 1) * sizeof *view_root);
    for (gt_value_id v = 0; v < nv; v++) {
        gt_node_id p = g->values[v].producer;
        bool view = p != GT_NONE && !hoist[v] && g->nodes[p].n_in == 1 &&
                    (g->nodes[p].op == GT_OP_RESHAPE || g->nodes[p].op == GT_OP_SLICE);
        view_root[v] = view ? view_root[g->nodes[p].in[0]] : v;
    }
    gt_pass_uses uses;
    gt_pass_uses_build(g, &uses);
    for (int32_t k = 0; k < nm; k++) {
        gt_value_id in = g->nodes[m[k].start].in[0];
        gt_node_id p = g->values[view_root[in]].producer;
        m[k].avail = (p == GT_NONE || hoist[in]) ? -1 : p;
        gt_value_id out = g->nodes[m[k].wait].out[0];
        m[k].first_use = n;
        for (int32_t j = uses.first[out]; j < uses.first[out + 1]; j++) {
            gt_node_id u = uses.node[j];
            if (!cand_node[u] && u < m[k].first_use) m[k].first_use = u;
        }
    }
    gt_pass_uses_free(&uses);
    free(cand_node);

    /* buckets, then the results they rewrite: a member whose input depends on one (HSDP: the
     * all-reduce of a reduce-scatter's result) waits for the next round */
    int64_t cap = o ? o->bucket_cap_bytes : 0;
    int32_t n_buckets = 0;
    for (int32_t k = 0; k < nm;) {
        int32_t j = k + 1;
        while (j < nm && same_group(&m[k], &m[j]))
            j++;
        n_buckets = partition_group(m + k, j - k, cap, n_buckets);
        k = j;
    }
    int32_t *size = gt_xcalloc((size_t)n_buckets + 1, sizeof *size);
    for (int32_t k = 0; k < nm; k++)
        size[m[k].bucket_id]++;
    uint8_t *source = gt_xcalloc((size_t)n + 1, 1);
    for (int32_t k = 0; k < nm; k++)
        if (size[m[k].bucket_id] >= 2) source[m[k].wait] = 1;
    uint8_t *taint = gt_xcalloc((size_t)nv + 1, 1);
    for (gt_node_id x = 0; x < n; x++) {
        const gt_node *nd = &g->nodes[x];
        bool t = source[x];
        for (int k = 0; k < nd->n_in && !t; k++)
            t = taint[nd->in[k]];
        for (int k = 0; k < nd->n_out; k++)
            taint[nd->out[k]] = t;
    }
    for (int32_t k = 0; k < nm; k++)
        m[k].deferred = taint[g->nodes[m[k].start].in[0]];
    free(taint);
    free(source);
    free(size);

    round_state s = {.g = g, .n = n, .hoist = hoist, .view_root = view_root};
    s.cap_keys = n + 64;
    s.keys = gt_xmalloc((size_t)s.cap_keys * sizeof *s.keys);
    for (gt_node_id x = 0; x < n; x++)
        s.keys[x] = (gt_pass_key){x, GT_KEY_STAY};
    s.repl = gt_pass_repl_new(g);
    s.dead = gt_xcalloc((size_t)n + 1, 1);
    s.stack = gt_xmalloc(((size_t)n + 1) * sizeof *s.stack);
    s.mark = gt_xcalloc((size_t)n + 1, sizeof *s.mark);
    s.scratch = gt_xmalloc(((size_t)nm + 1) * sizeof *s.scratch);
    s.scratch_bytes = gt_xmalloc(((size_t)nm + 1) * sizeof *s.scratch_bytes);
    gt_status st = GT_OK;
    for (int32_t k = 0; k < nm && st == GT_OK;) {
        int32_t j = k + 1;
        while (j < nm && m[j].bucket_id == m[k].bucket_id)
            j++;
        st = emit_members(&s, m + k, j - k, emitted, err);
        k = j;
    }
    if (st == GT_OK && *emitted) {
        /* every read of an old result now reads its unpacked slice */
        s.repl = gt_xrealloc(s.repl, ((size_t)g->n_values + 1) * sizeof *s.repl);
        for (gt_value_id v = nv; v < g->n_values; v++)
            s.repl[v] = v;
        for (gt_node_id x = 0; x < g->n_nodes; x++)
            gt_pass_repl_node_inputs(g, x, s.repl);
        gt_pass_repl_outputs(g, s.repl);
        gt_node_id *order = gt_xmalloc(((size_t)g->n_nodes + 1) * sizeof *order);
        st = gt_pass_order_by_keys(g, s.keys, order, "fsdp_bucketing", err);
        if (st == GT_OK) {
            uint8_t *keep = gt_xmalloc((size_t)g->n_nodes + 1);
            for (gt_node_id x = 0; x < g->n_nodes; x++)
                keep[x] = !(order[x] < n && s.dead[order[x]]);
            gt_pass_compact(g, keep);
            free(keep);
        }
        free(order);
    }
    for (int32_t k = 0; k < s.n_packs; k++)
        free(s.packs[k].ins);
    free(s.packs);
    free(s.scratch);
    free(s.scratch_bytes);
    free(s.mark);
    free(s.stack);
    free(s.dead);
    free(s.repl);
    free(s.keys);
    free(view_root);
    free(hoist);
    free(m);
    return st;
}

/* Backward duplicates first: with reshard-after-forward the backward can gather one parameter
 * twice — for a forward node the memory policy recomputes (remat's copy of the forward gather)
 * and for the backward's own use (parallelize). Same input, same group, so the same bits: the
 * later gather's readers take the earlier one's result and the later start/wait go. The earlier
 * one comes first in node order, so it is defined before every reader of the later one. */
static void dedupe_backward_gathers(gt_graph *g)
{
    gt_node_id *wait_of = gt_pass_find_waits(g);
    gt_value_id *repl = gt_pass_repl_new(g);
    uint8_t *keep = gt_xmalloc((size_t)g->n_nodes + 1);
    memset(keep, 1, (size_t)g->n_nodes + 1);
    gt_node_id *seen = gt_xmalloc(((size_t)g->n_nodes + 1) * sizeof *seen);
    int32_t n_seen = 0;
    bool any = false;
    for (gt_node_id n = 0; n < g->n_nodes; n++) {
        const gt_node *nd = &g->nodes[n];
        if (nd->op != GT_OP_ALL_GATHER_START || nd->phase != GT_PHASE_BACKWARD ||
            gt_pass_fsdp_tag(g, nd) != 0 || wait_of[n] == GT_NONE)
            continue;
        gt_node_id first = GT_NONE;
        for (int32_t k = 0; k < n_seen && first == GT_NONE; k++) {
            const gt_node *f = &g->nodes[seen[k]];
            if (f->in[0] == nd->in[0] && f->attrs.i[0] == nd->attrs.i[0] &&
                f->attrs.i[1] == nd->attrs.i[1])
                first = seen[k];
        }
        if (first == GT_NONE) {
            seen[n_seen++] = n;
            continue;
        }
        repl[g->nodes[wait_of[n]].out[0]] = g->nodes[wait_of[first]].out[0];
        keep[n] = keep[wait_of[n]] = 0;
        any = true;
    }
    if (any) {
        for (gt_node_id n = 0; n < g->n_nodes; n++)
            gt_pass_repl_node_inputs(g, n, repl);
        gt_pass_repl_outputs(g, repl);
        gt_pass_compact(g, keep);
    }
    free(seen);
    free(keep);
    free(repl);
    free(wait_of);
}

gt_status gt_pass_fsdp_bucketing(gt_graph *g, const gt_pass_ctx *ctx, gt_error *err)
{
    if (g->mesh.ndim == 0) return GT_OK;
    dedupe_backward_gathers(g);
    const gt_pass_options *o = ctx ? ctx->options : NULL;
    /* Each round buckets every group whose inputs do not wait on this round's other results;
     * the rest (results of results) go in the next. The round count is the depth of such chains
     * (2 with HSDP); the bound only guards against a bug. */
    for (int round = 0; round < 16; round++) {
        int emitted = 0;
        GT_TRY(bucket_round(g, o, &emitted, err));
        if (!emitted) break;
    }
    return GT_OK;
}
