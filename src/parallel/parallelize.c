/* parallelize.c — the global whole-step graph -> one SPMD graph with explicit collectives
 * (gt_parallel.h says what comes out; parallel_internal.h is the rule interface).
 *
 * One walk over the nodes in order. For each node: its inputs' placements per mesh dim go to the
 * op's rule (one call per mesh dim of size > 1); every input whose placement differs from what the
 * rule wants is converted (convert(), cached per value and target so a value gathered for three
 * matmuls is gathered once); the node is re-emitted on local shapes (shape attributes rewritten to
 * the local output shape) or, for vocabulary-parallel ops, expanded; its outputs get the rule's
 * placements, and the shape rule's local types are checked against the global types divided as
 * those placements say. Values with a preferred placement — gradients: their parameter's — are
 * converted right after they are produced, so the gradient-norm sums and AdamW read the
 * reduce-scattered shard (FSDP) rather than gathering twice.
 *
 * Conversion order for one value (per mesh dim): partial -> shard (reduce_scatter) first, since it
 * shrinks the data; then partial -> replicate (all_reduce); then shard of one dim -> shard of
 * another (all_to_all); then shard -> replicate (all_gather), innermost shard first; last
 * replicate -> shard (a local slice at the rank's symbolic offset).
 * Collectives work on tensor dim 0; another dim is permuted to the front and back around them. */
#include <stdlib.h>
#include <string.h>

#include "graphtrain/gt_build.h"
#include "parallel/parallel_internal.h"

typedef struct {
    gt_value_id from;
    gt_placement to[GT_MESH_MAX_DIMS];
    int key; /* 1: a backward re-gather (reshard after forward) */
    gt_value_id v;
} cache_entry;

typedef struct {
    int kind;
    gt_value_id a, b, v;
} memo_entry;

struct gt_par {
    const gt_graph *src;
    gt_graph *dst;
    gt_parallel_plan plan;
    gt_value_id *map;                         /* src value -> local value */
    bool *weight;                             /* src value: a PARAM through casts and views */
    gt_placement (*prefer)[GT_MESH_MAX_DIMS]; /* src value: kind GT_PLACE_NONE = none */
    /* src value: what the rules are told is preferred — prefer, or, for the input of a cast whose
     * output has one, the cast output's (so embedding_backward under bf16, whose f32 cast is the
     * gradient, still picks its vocabulary-parallel form). Only prefer is converted to eagerly:
     * the data-parallel reduction stays after the cast, in f32. */
    gt_placement (*hint)[GT_MESH_MAX_DIMS];
    gt_node_id *node_map; /* src node -> its main local node */
    cache_entry *cache;
    int32_t n_cache, cap_cache;
    memo_entry *memo;
    int32_t n_memo, cap_memo;
    /* symbolic dims that shard, rewritten as multiples so local dims stay exact expressions:
     * batch -> dp * batch (batch is then the per-rank batch), seq -> tp * seq_shard (sequence
     * parallel) */
    const char *subst_name[2];
    gt_expr subst_repl[2];
    int n_subst;
    int32_t last_block; /* the largest structural unit (block index) of a node; -1 for none */
    bool keep_gathered; /* the node being converted keeps its gathered weights for the backward */
};

/* A global expression in the local graph's terms. */
static gt_expr gexpr(gt_par *p, gt_expr e)
{
    for (int k = 0; k < p->n_subst; k++)
        e = gt_sym_replace(p->dst->sym, e, p->subst_name[k], p->subst_repl[k]);
    return e;
}

/* ---------------------------------------------------------------- small helpers */

const gt_graph *gt_par_src(const gt_par *p)
{
    return p->src;
}

gt_graph *gt_par_dst(gt_par *p)
{
    return p->dst;
}

const gt_mesh *gt_par_mesh(const gt_par *p)
{
    return &p->plan.mesh;
}

gt_expr gt_par_coord(gt_par *p, int mesh_dim)
{
    gt_sym_pool *sym = p->dst->sym;
    if (mesh_dim == GT_MESH_EFSDP || mesh_dim == GT_MESH_EP) {
        /* ep is the inner dim of dp_shard (gt_mesh_expert_split), or of dp_shard x tp flattened
         * (gt_mesh_expert_tp) */
        gt_expr shard = gt_sym_var(sym, gt_mesh_coord_symbol(GT_MESH_DP_SHARD));
        if (gt_mesh_expert_tp(&p->plan.mesh, p->plan.expert_parallel_degree))
            shard = gt_sym_add(
                sym, gt_sym_mul(sym, shard, gt_sym_const(sym, p->plan.mesh.size[GT_MESH_TP])),
                gt_sym_var(sym, gt_mesh_coord_symbol(GT_MESH_TP)));
        gt_expr ep = gt_sym_const(sym, p->dst->mesh.size[GT_MESH_EP]);
        return mesh_dim == GT_MESH_EP ? gt_sym_mod(sym, shard, ep)
                                      : gt_sym_floordiv(sym, shard, ep);
    }
    return gt_sym_var(sym, gt_mesh_coord_symbol(mesh_dim));
}

void gt_par_set_place(gt_par *p, gt_value_id v, const gt_placement place[GT_MESH_MAX_DIMS])
{
    if (v < 0 || v >= p->dst->n_values) return;
    memcpy(p->dst->values[v].place, place, sizeof p->dst->values[v].place);
}

gt_value_id gt_par_memo_get(gt_par *p, int kind, gt_value_id a, gt_value_id b)
{
    for (int32_t k = 0; k < p->n_memo; k++)
        if (p->memo[k].kind == kind && p->memo[k].a == a && p->memo[k].b == b) return p->memo[k].v;
    return GT_NONE;
}

void gt_par_memo_put(gt_par *p, int kind, gt_value_id a, gt_value_id b, gt_value_id v)
{
    if (p->n_memo == p->cap_memo) {
        p->cap_memo = p->cap_memo ? 2 * p->cap_memo : 16;
        p->memo = gt_xrealloc(p->memo, (size_t)p->cap_memo * sizeof *p->memo);
    }
    p->memo[p->n_memo++] = (memo_entry){kind, a, b, v};
}

static bool layout_equal(const gt_placement *a, const gt_placement *b)
{
    for (int md = 0; md < GT_MESH_NDIMS; md++)
        if (!gt_place_equal(a[md], b[md])) return false;
    return true;
}

static const gt_placement *place_of(gt_par *p, gt_value_id local)
{
    return p->dst->values[local].place;
}

/* Stamps the current src node's metadata on what is emitted next. */
static void stamp(gt_par *p, const gt_node *n)
{
    p->dst->cur_fqn = n ? n->fqn : 0;
    p->dst->cur_unit = n ? n->unit : GT_UNIT_REST;
    p->dst->cur_phase = n ? (gt_phase)n->phase : GT_PHASE_FORWARD;
    p->dst->cur_origin =
        n && n->origin != GT_NONE && p->node_map[n->origin] >= 0 ? p->node_map[n->origin] : GT_NONE;
}

static gt_status dst_error(gt_par *p, gt_error *err)
{
    if (p->dst->err.code != GT_OK) {
        *err = p->dst->err;
        return err->code;
    }
    return GT_OK;
}

gt_value_id gt_par_emit(gt_par *p, gt_op op, const gt_value_id *in, int n_in, const gt_attrs *attrs,
                        gt_value_id *outs)
{
    return gt_graph_add_node(p->dst, op, in, n_in, attrs, outs);
}

static void tag_last(gt_par *p, const char *tag)
{
    if (tag && p->dst->n_nodes > 0) gt_graph_add_tag(p->dst, p->dst->n_nodes - 1, tag);
}

/* ---------------------------------------------------------------- collectives */

/* A weight gathered for FSDP with reshard-after-forward: the memory policy may recompute (re-run)
 * the gather in the backward instead of keeping the forward's gathered copy alive. */
#define GT_FSDP_RESHARD_TAG "fsdp.reshard"

static gt_value_id collective(gt_par *p, gt_op start_op, gt_value_id x, int mesh_dim,
                              const char *tag)
{
    const char *reshard = tag && p->plan.fsdp_reshard_after_forward && !p->keep_gathered &&
                                  start_op == GT_OP_ALL_GATHER_START &&
                                  strcmp(tag, "fsdp.all_gather") == 0
                              ? GT_FSDP_RESHARD_TAG
                              : NULL;
    gt_attrs a = {.ni = 2};
    a.i[0] = mesh_dim;
    a.i[1] = p->dst->mesh.size[mesh_dim];
    gt_value_id s = gt_graph_add_node(p->dst, start_op, &x, 1, &a, NULL);
    tag_last(p, tag);
    tag_last(p, reshard);
    gt_value_id in[2] = {s, x};
    gt_attrs none = {0};
    gt_value_id w = gt_graph_add_node(p->dst, GT_OP_WAIT, in, 2, &none, NULL);
    tag_last(p, tag);
    tag_last(p, reshard);
    return w;
}

gt_value_id gt_par_all_gather(gt_par *p, gt_value_id x, int mesh_dim)
{
    return collective(p, GT_OP_ALL_GATHER_START, x, mesh_dim, NULL);
}

gt_value_id gt_par_reduce_scatter(gt_par *p, gt_value_id x, int mesh_dim)
{
    return collective(p, GT_OP_REDUCE_SCATTER_START, x, mesh_dim, NULL);
}

gt_value_id gt_par_all_to_all(gt_par *p, gt_value_id x, int mesh_dim)
{
    return collective(p, GT_OP_ALL_TO_ALL_START, x, mesh_dim, GT_TAG_TOKEN_EXCHANGE);
}

double gt_par_capacity_factor(const gt_par *p)
{
    return p->plan.expert_parallel_capacity_factor;
}

/* A gather or reduce-scatter along tensor dim `dim` (not 0) of n ranks' blocks, as one permute
 * around a collective of rank-major blocks (a collective works on dim 0):
 *   all_gather:     x [.., k, ..] -> view [1, .., k, ..] -> gather -> [n, .., k, ..]
 *                   -> permute [.., n, k, ..] -> view [.., n*k, ..];
 *   reduce_scatter: x [.., n*k, ..] -> view [.., n, k, ..] -> permute [n, .., k, ..]
 *                   -> reduce-scatter -> [1, .., k, ..] -> view [.., k, ..].
 * The same bytes in the same places as permuting dim to the front before and back after, with one
 * copy of the tensor instead of two (a sequence-parallel gather's input, a reduce-scatter's
 * output need none). */
static gt_value_id collective_on_dim(gt_par *p, gt_op start_op, gt_value_id x, int dim,
                                     int mesh_dim, const char *tag)
{
    if (dim == 0) return collective(p, start_op, x, mesh_dim, tag);
    gt_graph *g = p->dst;
    gt_type t = *gt_value_type(g, x); /* a copy: adding nodes moves the value array */
    int nd = t.ndim, n = p->plan.mesh.size[mesh_dim];
    gt_expr nn = gt_c(g, n), one = gt_c(g, 1), dims[GT_MAX_DIMS];
    int perm[GT_MAX_DIMS], k = 0;
    if (start_op == GT_OP_ALL_GATHER_START) {
        dims[0] = one; /* [1, ...] */
        for (int d = 0; d < nd; d++)
            dims[d + 1] = t.dims[d];
        x = gt_reshape(g, x, nd + 1, dims);
        x = collective(p, start_op, x, mesh_dim, tag);
        for (int d = 0; d < dim; d++) /* [n, ..] -> [.., n, k, ..] */
            perm[k++] = d + 1;
        perm[k++] = 0;
        for (int d = dim; d < nd; d++)
            perm[k++] = d + 1;
        x = gt_permute(g, x, nd + 1, perm);
        for (int d = 0; d < nd; d++)
            dims[d] = d == dim ? gt_sym_mul(g->sym, nn, t.dims[d]) : t.dims[d];
        return gt_reshape(g, x, nd, dims);
    }
    /* reduce-scatter: [.., n, k, ..] with the n in front */
    for (int d = 0; d < nd; d++) {
        if (d == dim) dims[k++] = nn;
        dims[k++] = d == dim ? gt_sym_floordiv(g->sym, t.dims[d], nn) : t.dims[d];
    }
    x = gt_reshape(g, x, nd + 1, dims);
    k = 0;
    perm[k++] = dim;
    for (int d = 0; d <= nd; d++)
        if (d != dim) perm[k++] = d;
    x = gt_permute(g, x, nd + 1, perm);
    x = collective(p, start_op, x, mesh_dim, tag);
    for (int d = 0; d < nd; d++)
        dims[d] = d == dim ? gt_sym_floordiv(g->sym, t.dims[d], nn) : t.dims[d];
    return gt_reshape(g, x, nd, dims);
}

/* shard(a) -> shard(b) over mesh dim md (n ranks) by one all_to_all, x local: dim b is split into
 * n blocks, the block index moved to the front ([n, ..., b/n, ...]), block j sent to rank j; the
 * front index of what arrives is the sender, whose block of dim a it holds, so it moves next to
 * dim a and merges with it ([..., n*a, ..., b/n, ...]). Intermediate values stay unplaced, as
 * collective_on_dim's. GT_NONE when a node cannot be built (the error is the graph's). */
static gt_value_id all_to_all_dims(gt_par *p, gt_value_id x, int a, int b, int md) /* rank < max */
{
    gt_graph *g = p->dst;
    gt_type t = *gt_value_type(g, x); /* a copy: adding nodes moves the value array */
    int nd = t.ndim, n = p->plan.mesh.size[md];
    gt_expr nn = gt_c(g, n), rest[GT_MAX_DIMS], dims[GT_MAX_DIMS];
    int perm[GT_MAX_DIMS], k = 0;
    for (int d = 0; d < nd; d++)
        rest[d] = d == b ? gt_sym_floordiv(g->sym, t.dims[b], nn) : t.dims[d];
    for (int d = 0; d < nd; d++) { /* [..., n, b/n, ...] */
        if (d == b) dims[k++] = nn;
        dims[k++] = rest[d];
    }
    x = gt_reshape(g, x, nd + 1, dims);
    if (b != 0) { /* the block index to the front */
        k = 0;
        perm[k++] = b;
        for (int d = 0; d <= nd; d++)
            if (d != b) perm[k++] = d;
        x = gt_permute(g, x, nd + 1, perm);
    }
    x = collective(p, GT_OP_ALL_TO_ALL_START, x, md, NULL);
    if (a != 0) { /* [n, rest...] -> [rest[0..a), n, rest[a..)] */
        k = 0;
        for (int d = 0; d < a; d++)
            perm[k++] = d + 1;
        perm[k++] = 0;
        for (int d = a; d < nd; d++)
            perm[k++] = d + 1;
        x = gt_permute(g, x, nd + 1, perm);
    }
    for (int d = 0; d < nd; d++)
        dims[d] = d == a ? gt_sym_mul(g->sym, nn, rest[a]) : rest[d];
    return gt_reshape(g, x, nd, dims);
}

/* True when mesh dim md's shard of tensor dim `dim` is the innermost split of that dim among
 * the placements pl (no other mesh dim of size > 1 splits it inside md's blocks). */
static bool innermost_split(const gt_mesh *m, const gt_placement *pl, int md, int dim)
{
    for (int o = 0; o < GT_MESH_NDIMS; o++)
        if (o != md && m->size[o] > 1 && pl[o].kind == GT_PLACE_SHARD && pl[o].dim == dim &&
            pl[o].order >= pl[md].order)
            return false;
    return true;
}

/* ---------------------------------------------------------------- conversions */

/* The tag of a parameter's collective: its gather (FSDP), and the reductions of its gradient over
 * any mesh dim but TP's reduce-scatter (an activation's, sequence parallel). A gradient all-reduce
 * over TP (a TP-replicated weight, a norm's, whose gradient each rank summed over its own tokens)
 * is a gradient reduction like HSDP's over dp_replicate: bucketed per block and waited for late. */
static const char *collective_tag(int mesh_dim, bool weight, bool grad, gt_op op)
{
    if (grad && op == GT_OP_ALL_REDUCE_START) return "fsdp.all_reduce";
    if (mesh_dim == GT_MESH_TP) return NULL;
    if (weight && op == GT_OP_ALL_GATHER_START) return "fsdp.all_gather";
    if (grad && op == GT_OP_REDUCE_SCATTER_START) return "fsdp.reduce_scatter";
    return NULL;
}

/* Converts local value x (placements `from`) to placements `to`; every intermediate value gets
 * its placements. weight/grad only pick tags for the bucketing passes. */
static gt_status localize(gt_par *p, const gt_type *global, const gt_placement *place,
                          const char *what, gt_type *out, gt_error *err);

/* Padded shards: the rows dim d has with mesh dim md's split undone (its true size). */
static gt_status unsplit_rows(gt_par *p, const gt_type *global, const gt_placement *cur, int md,
                              int d, int64_t *rows, gt_error *err)
{
    gt_placement tmp[GT_MESH_MAX_DIMS];
    memcpy(tmp, cur, sizeof tmp);
    tmp[md] = gt_place_replicate();
    gt_type t;
    GT_TRY(localize(p, global, tmp, "padding", &t, err));
    if (!gt_sym_is_const(p->dst->sym, t.dims[d], rows))
        return gt_error_set(err, GT_ERR_INTERNAL, "parallelize: a padded dim is not constant");
    return GT_OK;
}

/* x with zero rows appended along d up to n * ceil(rows / n) (for a reduce-scatter or a slice into
 * padded blocks). */
static gt_value_id pad_rows(gt_par *p, gt_value_id x, int d, int64_t rows, int n)
{
    int64_t block = (rows + n - 1) / n;
    if (block * n == rows) return x;
    return gt_slice_backward(p->dst, x, d, gt_c(p->dst, 0), gt_c(p->dst, rows),
                             gt_c(p->dst, block * n));
}

static gt_status convert_value(gt_par *p, gt_value_id x, const gt_type *global,
                               const gt_placement *to, bool weight, bool grad, gt_value_id *out,
                               gt_error *err)
{
    gt_placement cur[GT_MESH_MAX_DIMS];
    memcpy(cur, place_of(p, x), sizeof cur);
    const gt_mesh *m = &p->plan.mesh;
    /* 1. partial -> shard, outermost split first: a reduce-scatter splits the dim as the value
     * holds it, so a mesh dim that splits inside another's blocks goes after that one */
    for (int order = 0; order < 8; order++)
        for (int md = 0; md < GT_MESH_NDIMS; md++) {
            if (cur[md].kind != GT_PLACE_PARTIAL || m->size[md] == 1 ||
                to[md].kind != GT_PLACE_SHARD || to[md].order != order)
                continue;
            gt_op op = GT_OP_REDUCE_SCATTER_START;
            if (to[md].padded) {
                int64_t rows;
                GT_TRY(unsplit_rows(p, global, cur, md, to[md].dim, &rows, err));
                x = pad_rows(p, x, to[md].dim, rows, m->size[md]);
                gt_par_set_place(p, x, cur);
            }
            x = collective_on_dim(p, op, x, to[md].dim, md, collective_tag(md, weight, grad, op));
            cur[md] = to[md];
            gt_par_set_place(p, x, cur);
        }
    /* 2. partial -> replicate */
    for (int md = 0; md < GT_MESH_NDIMS; md++) {
        if (cur[md].kind != GT_PLACE_PARTIAL || m->size[md] == 1 || to[md].kind == GT_PLACE_PARTIAL)
            continue;
        gt_op op = GT_OP_ALL_REDUCE_START;
        x = collective(p, op, x, md, collective_tag(md, weight, grad, op));
        cur[md] = gt_place_replicate();
        gt_par_set_place(p, x, cur);
    }
    /* 3. shard -> shard of another dim over the same mesh dim: one all_to_all (unpadded blocks,
     * each the innermost split of its dim; else 4 and 5 below gather and slice) */
    for (int md = 0; md < GT_MESH_NDIMS; md++) {
        gt_placement f = cur[md], t = to[md];
        if (m->size[md] == 1 || f.kind != GT_PLACE_SHARD || t.kind != GT_PLACE_SHARD ||
            f.dim == t.dim || f.padded || t.padded)
            continue;
        gt_placement after[GT_MESH_MAX_DIMS];
        memcpy(after, cur, sizeof after);
        after[md] = t;
        int64_t c;
        const gt_type *lt = gt_value_type(p->dst, x);
        if (t.dim >= lt->ndim || lt->ndim + 1 > GT_MAX_DIMS ||
            !innermost_split(m, cur, md, f.dim) || !innermost_split(m, after, md, t.dim) ||
            (gt_sym_is_const(p->dst->sym, lt->dims[t.dim], &c) && c % m->size[md] != 0))
            continue;
        x = all_to_all_dims(p, x, f.dim, t.dim, md);
        GT_TRY(dst_error(p, err));
        cur[md] = t;
        gt_par_set_place(p, x, cur);
    }
    /* 4. shard -> replicate (or another shard), innermost first */
    for (;;) {
        int pick = -1;
        for (int md = 0; md < GT_MESH_NDIMS; md++) {
            if (cur[md].kind != GT_PLACE_SHARD || m->size[md] == 1) continue;
            if (gt_place_equal(cur[md], to[md])) continue;
            if (pick < 0 || cur[md].order > cur[pick].order) pick = md;
        }
        if (pick < 0) break;
        /* the gather must be the innermost split of its tensor dim */
        for (int md = 0; md < GT_MESH_NDIMS; md++)
            if (md != pick && cur[md].kind == GT_PLACE_SHARD && cur[md].dim == cur[pick].dim &&
                cur[md].order > cur[pick].order && m->size[md] > 1)
                return gt_error_set(err, GT_ERR_INTERNAL,
                                    "parallelize: cannot gather dim %d over %s before the inner "
                                    "split over %s",
                                    cur[pick].dim, gt_mesh_dim_name(pick), gt_mesh_dim_name(md));
        gt_op op = GT_OP_ALL_GATHER_START;
        int pd = cur[pick].dim;
        int64_t rows = -1;
        if (cur[pick].padded) GT_TRY(unsplit_rows(p, global, cur, pick, pd, &rows, err));
        x = collective_on_dim(p, op, x, pd, pick, collective_tag(pick, weight, grad, op));
        if (rows >= 0 && rows % m->size[pick] != 0) /* drop the padding rows */
            x = gt_slice(p->dst, x, pd, gt_c(p->dst, 0), gt_c(p->dst, rows));
        cur[pick] = gt_place_replicate();
        gt_par_set_place(p, x, cur);
    }
    /* 5. replicate -> shard: the rank's block, outermost first */
    for (int order = 0; order < 8; order++)
        for (int md = 0; md < GT_MESH_NDIMS; md++) {
            if (to[md].kind != GT_PLACE_SHARD || m->size[md] == 1 || to[md].order != order)
                continue;
            if (gt_place_equal(cur[md], to[md])) continue;
            if (cur[md].kind != GT_PLACE_REPLICATE)
                return gt_error_set(err, GT_ERR_INTERNAL,
                                    "parallelize: cannot convert to a shard over %s",
                                    gt_mesh_dim_name(md));
            int d = to[md].dim;
            if (to[md].padded) { /* zero rows up to n * ceil, then the rank's ceil-sized block */
                int64_t rows;
                GT_TRY(unsplit_rows(p, global, cur, md, d, &rows, err));
                x = pad_rows(p, x, d, rows, m->size[md]);
                gt_par_set_place(p, x, cur);
            }
            const gt_type *t = gt_value_type(p->dst, x);
            int64_t c;
            if (d >= t->ndim ||
                (gt_sym_is_const(p->dst->sym, t->dims[d], &c) && c % m->size[md] != 0))
                return gt_error_set(err, GT_ERR_INVALID,
                                    "parallelize: dim %d of a value does not split over %s %d", d,
                                    gt_mesh_dim_name(md), m->size[md]);
            gt_expr k = gt_sym_floordiv(p->dst->sym, t->dims[d], gt_c(p->dst, m->size[md]));
            gt_expr start = gt_sym_mul(p->dst->sym, gt_par_coord(p, md), k);
            x = gt_slice(p->dst, x, d, start, gt_sym_add(p->dst->sym, start, k));
            cur[md] = to[md];
            gt_par_set_place(p, x, cur);
        }
    /* what is left: a replicate wanted as partial (never asked by a rule) */
    for (int md = 0; md < GT_MESH_NDIMS; md++)
        if (m->size[md] > 1 && !gt_place_equal(cur[md], to[md]))
            return gt_error_set(err, GT_ERR_INTERNAL,
                                "parallelize: no conversion to partial over %s",
                                gt_mesh_dim_name(md));
    GT_TRY(dst_error(p, err));
    *out = x;
    return GT_OK;
}

/* Cached conversion of the local value of src value sv. */
static gt_status convert(gt_par *p, gt_value_id sv, const gt_placement *to, int key,
                         gt_value_id *out, gt_error *err)
{
    gt_value_id x = p->map[sv];
    if (layout_equal(place_of(p, x), to)) {
        *out = x;
        return GT_OK;
    }
    for (int32_t k = 0; k < p->n_cache; k++)
        if (p->cache[k].from == x && p->cache[k].key == key && layout_equal(p->cache[k].to, to)) {
            *out = p->cache[k].v;
            return GT_OK;
        }
    bool grad = p->prefer[sv][0].kind != GT_PLACE_NONE;
    GT_TRY(convert_value(p, x, gt_value_type(p->src, sv), to, p->weight[sv], grad, out, err));
    if (p->n_cache == p->cap_cache) {
        p->cap_cache = p->cap_cache ? 2 * p->cap_cache : 64;
        p->cache = gt_xrealloc(p->cache, (size_t)p->cap_cache * sizeof *p->cache);
    }
    cache_entry *e = &p->cache[p->n_cache++];
    e->from = x;
    memcpy(e->to, to, sizeof e->to);
    e->key = key;
    e->v = *out;
    return GT_OK;
}

/* ---------------------------------------------------------------- local types */

/* The local type of a global type under placements: each sharded dim divided by the product of
 * the degrees that split it. */
static gt_status localize(gt_par *p, const gt_type *global, const gt_placement *place,
                          const char *what, gt_type *out, gt_error *err)
{
    *out = *global;
    for (int d = 0; d < global->ndim; d++)
        out->dims[d] = gexpr(p, global->dims[d]);
    for (int d = 0; d < global->ndim; d++) {
        int64_t div = 1, pad = 1; /* pad: the degree of a padded (ceil-sized) split */
        for (int md = 0; md < GT_MESH_NDIMS; md++)
            if (place[md].kind == GT_PLACE_SHARD && place[md].dim == d) {
                if (place[md].padded)
                    pad *= p->plan.mesh.size[md];
                else
                    div *= p->plan.mesh.size[md];
            }
        if (div == 1 && pad == 1) continue;
        int64_t c;
        if (pad > 1) {
            if (!gt_sym_is_const(p->dst->sym, out->dims[d], &c) || c % div != 0)
                return gt_error_set(err, GT_ERR_INVALID,
                                    "parallelize: %s: dim %d cannot be padded for its shards", what,
                                    d);
            out->dims[d] = gt_c(p->dst, (c / div + pad - 1) / pad);
            continue;
        }
        if (gt_sym_is_const(p->dst->sym, out->dims[d], &c)) {
            if (c % div != 0)
                return gt_error_set(
                    err, GT_ERR_INVALID,
                    "parallelize: %s: dim %d (size %lld) does not split evenly %lld "
                    "ways; choose degrees that divide it",
                    what, d, (long long)c, (long long)div);
            out->dims[d] = gt_c(p->dst, c / div);
        } else {
            out->dims[d] = gt_sym_floordiv(p->dst->sym, out->dims[d], gt_c(p->dst, div));
        }
    }
    return GT_OK;
}

/* Equal types, comparing symbolic dims by value under a binding where every symbol is a large
 * highly divisible number ((b//2)//2 and b//4 are different expressions of the same size). */
static bool same_type(gt_par *p, const gt_type *a, const gt_type *b)
{
    if (a->dtype != b->dtype || a->ndim != b->ndim) return false;
    for (int d = 0; d < a->ndim; d++) {
        if (a->dims[d] == b->dims[d]) continue;
        static const gt_sym_binding_entry e[] = {{"batch", 55440},     {"seq", 55440},
                                                 {"seq_shard", 55440}, {"rank.dp_replicate", 0},
                                                 {"rank.dp_shard", 0}, {"rank.tp", 0}};
        gt_sym_binding bind = {e, 6};
        int64_t x, y;
        gt_error ignore = {0};
        if (gt_sym_eval(p->dst->sym, a->dims[d], &bind, &x, &ignore) != GT_OK ||
            gt_sym_eval(p->dst->sym, b->dims[d], &bind, &y, &ignore) != GT_OK || x != y)
            return false;
    }
    return true;
}

/* ---------------------------------------------------------------- one node */

static bool op_has_shape_attrs(gt_op op)
{
    return op == GT_OP_FULL || op == GT_OP_RESHAPE || op == GT_OP_REGROUP ||
           op == GT_OP_BROADCAST_TO || op == GT_OP_SUM_TO;
}

/* Ops that may run on a padded shard (zero rows past the true size): each maps zero rows to zero
 * rows, or sums them away. The clip's sum of squares and AdamW run on FSDP's padded shards; every
 * other op gets its padded inputs gathered (the gather drops the padding). */
static bool keeps_padding(gt_op op)
{
    switch (op) {
    case GT_OP_CAST:
    case GT_OP_MUL:
    case GT_OP_ADD:
    case GT_OP_SUB:
    case GT_OP_NEG:
    case GT_OP_SCALE:
    case GT_OP_SUM:
    case GT_OP_SUM_SQUARES:
    case GT_OP_ADAMW:
        return true;
    default:
        return false;
    }
}

static bool op_is_view_or_cast(gt_op op)
{
    return op == GT_OP_CAST || op == GT_OP_RESHAPE || op == GT_OP_TRANSPOSE || op == GT_OP_PERMUTE;
}

static void node_label(const gt_par *p, const gt_node *n, char *buf, size_t len)
{
    const char *fqn = gt_graph_str(p->src, n->fqn);
    snprintf(buf, len, "%s%s%s", gt_op_get(n->op)->name, fqn[0] ? " at " : "", fqn);
}

/* Under reshard-after-forward's default policy, the last transformer block and the modules after
 * it (final norm, output) are not resharded: their backward follows their forward at once, so
 * gathering their weights again would only add a collective on the critical path (torchtitan's
 * rule for the last block; FSDP2 keeps the root's parameters, norm and output among them). */
static bool keeps_gathered(const gt_par *p, const gt_node *n)
{
    if (!p->plan.fsdp_reshard_after_forward || p->plan.fsdp_reshard_last) return false;
    return n->unit == GT_UNIT_REST || (n->unit >= 0 && n->unit == p->last_block);
}

static gt_status convert_node(gt_par *p, gt_node_id nid, gt_error *err)
{
    const gt_node *n = &p->src->nodes[nid];
    const gt_mesh *m = &p->plan.mesh;
    stamp(p, n);
    char label[256];
    node_label(p, n, label, sizeof label);

    gt_placement have[GT_MAX_IN][GT_MESH_MAX_DIMS], want[GT_MAX_IN][GT_MESH_MAX_DIMS];
    gt_placement out_place[GT_MAX_OUT][GT_MESH_MAX_DIMS], settle[GT_MAX_OUT][GT_MESH_MAX_DIMS];
    bool weight[GT_MAX_IN];
    double in_scale[GT_MAX_IN], out_scale = 1.0;
    int vocab_dim = -1, expert_dim = -1;
    memset(out_place, 0, sizeof out_place);
    memset(settle, 0, sizeof settle);
    for (int k = 0; k < n->n_in; k++) {
        memcpy(have[k], place_of(p, p->map[n->in[k]]), sizeof have[k]);
        memcpy(want[k], have[k], sizeof want[k]);
        weight[k] = p->weight[n->in[k]];
        in_scale[k] = 1.0;
    }
    gt_shard_rule rule = gt_shard_rule_for(n->op);
    bool ep_tp = gt_mesh_expert_tp(m, p->plan.expert_parallel_degree);
    /* a tp split of the tokens nests inside the data-parallel dims splitting input 0's rows */
    int token_order = 0;
    for (int md = 0; md < GT_MESH_TP && n->n_in > 0; md++)
        token_order +=
            m->size[md] > 1 && have[0][md].kind == GT_PLACE_SHARD && have[0][md].dim == 0;
    for (int md = 0; md < GT_MESH_NDIMS; md++) {
        if (m->size[md] == 1) continue;
        gt_placement in1[GT_MAX_IN], prefer1[GT_MAX_OUT];
        for (int k = 0; k < n->n_in; k++) {
            in1[k] = have[k][md];
            /* padded shards only reach ops that keep zero rows zero; others see (and so get) the
             * gathered value */
            if (in1[k].kind == GT_PLACE_SHARD && in1[k].padded && !keeps_padding(n->op))
                in1[k] = gt_place_replicate();
        }
        for (int j = 0; j < n->n_out; j++)
            prefer1[j] = p->hint[n->out[j]][md];
        gt_shard_ctx c = {.g = p->src,
                          .n = n,
                          .mesh_dim = md,
                          .group_size = m->size[md],
                          .in = in1,
                          .weight = weight,
                          .prefer = prefer1,
                          .sequence_parallel = md == GT_MESH_TP && p->plan.sequence_parallel,
                          .expert_parallel =
                              md == GT_MESH_DP_SHARD && !ep_tp ? p->plan.expert_parallel_degree : 1,
                          .expert_tp = md == GT_MESH_TP && ep_tp,
                          .token_order = token_order,
                          .expert_store = ep_tp ? gt_parallel_expert_storage(m, md)
                                                : (gt_placement){GT_PLACE_NONE, 0, 0, 0},
                          .out_scale = 1.0};
        for (int k = 0; k < n->n_in; k++) {
            c.want[k] = in1[k];
            c.in_scale[k] = 1.0;
        }
        for (int j = 0; j < n->n_out; j++)
            c.settle[j] = (gt_placement){GT_PLACE_NONE, 0, 0, 0};
        gt_status st = rule(&c, err);
        if (st != GT_OK) return st;
        for (int k = 0; k < n->n_in; k++) {
            want[k][md] = c.want[k];
            in_scale[k] *= c.in_scale[k];
        }
        for (int j = 0; j < n->n_out; j++) {
            out_place[j][md] = c.out[j];
            settle[j][md] = c.settle[j].kind == GT_PLACE_NONE ? c.out[j] : c.settle[j];
        }
        out_scale *= c.out_scale;
        if (c.vocab) {
            if (vocab_dim >= 0)
                return gt_error_set(err, GT_ERR_INTERNAL,
                                    "parallelize: %s: vocabulary-parallel over two mesh dims",
                                    label);
            vocab_dim = md;
        }
        if (c.expert) expert_dim = md;
    }

    /* inputs in the wanted placements; a weight gathered for the backward again when resharding */
    gt_value_id in[GT_MAX_IN];
    p->keep_gathered = keeps_gathered(p, n);
    bool regather =
        p->plan.fsdp_reshard_after_forward && !p->keep_gathered && n->phase != GT_PHASE_FORWARD;
    for (int k = 0; k < n->n_in; k++) {
        GT_TRY(convert(p, n->in[k], want[k], p->weight[n->in[k]] && regather, &in[k], err));
        if (in_scale[k] != 1.0) {
            in[k] = gt_scale(p->dst, in[k], in_scale[k]);
            GT_TRY(dst_error(p, err));
            gt_par_set_place(p, in[k], want[k]);
        }
    }
    p->keep_gathered = false;

    gt_value_id outs[GT_MAX_OUT];
    for (int j = 0; j < GT_MAX_OUT; j++)
        outs[j] = GT_NONE;
    gt_type local_out[GT_MAX_OUT];
    for (int j = 0; j < n->n_out; j++)
        GT_TRY(
            localize(p, gt_value_type(p->src, n->out[j]), out_place[j], label, &local_out[j], err));
    if (vocab_dim >= 0 || expert_dim >= 0) {
        int32_t first = p->dst->n_nodes;
        if (vocab_dim >= 0)
            GT_TRY(gt_par_expand_vocab(p, n, vocab_dim, in, outs, err));
        else
            GT_TRY(gt_par_expand_moe(p, n, expert_dim, in, outs, err));
        stamp(p, n);
        /* the node's counterpart (its backward nodes' origin) is the expansion's last node */
        if (p->dst->n_nodes > first) p->node_map[nid] = p->dst->n_nodes - 1;
        /* the expansion's nodes keep the node's tags (the EP overlap schedule finds a chunk's
         * token exchange by them) */
        for (int32_t id = first; id < p->dst->n_nodes; id++)
            for (int t = 0; t < n->n_tags; t++)
                gt_graph_add_tag(p->dst, id, gt_graph_str(p->src, n->tags[t]));
    } else {
        gt_attrs a = n->attrs;
        for (int k = 0; k < a.ne; k++)
            a.e[k] = gexpr(p, a.e[k]);
        if (op_has_shape_attrs(n->op)) {
            a.ne = (uint8_t)local_out[0].ndim;
            for (int d = 0; d < local_out[0].ndim; d++)
                a.e[d] = local_out[0].dims[d];
        } else if (n->op == GT_OP_EMBEDDING_BACKWARD) {
            a.e[0] = local_out[0].dims[0];
        }
        gt_graph_add_node(p->dst, n->op, in, n->n_in, &a, outs);
        GT_TRY(dst_error(p, err));
        p->node_map[nid] = p->dst->n_nodes - 1;
        for (int t = 0; t < n->n_tags; t++)
            gt_graph_add_tag(p->dst, p->dst->n_nodes - 1, gt_graph_str(p->src, n->tags[t]));
    }
    GT_TRY(dst_error(p, err));
    for (int j = 0; j < n->n_out; j++) {
        if (outs[j] == GT_NONE)
            return gt_error_set(err, GT_ERR_INTERNAL, "parallelize: %s: output %d not produced",
                                label, j);
        const gt_type *got = gt_value_type(p->dst, outs[j]);
        if (!same_type(p, got, &local_out[j])) {
            char a[128], b[128];
            gt_graph_format_type(p->dst, got, a, sizeof a);
            gt_graph_format_type(p->dst, &local_out[j], b, sizeof b);
            return gt_error_set(err, GT_ERR_INTERNAL,
                                "parallelize: %s: output %d is %s locally, its placements say %s "
                                "(a sharding rule is wrong)",
                                label, j, a, b);
        }
        gt_par_set_place(p, outs[j], out_place[j]);
    }
    if (out_scale != 1.0) {
        outs[0] = gt_scale(p->dst, outs[0], out_scale);
        GT_TRY(dst_error(p, err));
        gt_par_set_place(p, outs[0], out_place[0]);
    }
    for (int j = 0; j < n->n_out; j++) {
        gt_value_id sv = n->out[j];
        p->map[sv] = outs[j];
        p->weight[sv] = op_is_view_or_cast(n->op) && weight[0];
        if (!layout_equal(settle[j], out_place[j]))
            GT_TRY(convert(p, sv, settle[j], 0, &p->map[sv], err));
        if (p->prefer[sv][0].kind != GT_PLACE_NONE)
            GT_TRY(convert(p, sv, p->prefer[sv], 0, &p->map[sv], err));
    }
    return GT_OK;
}

/* ---------------------------------------------------------------- inputs, outputs, driver */

static int32_t input_by_fqn(const gt_graph *g, int kind, gt_str fqn)
{
    for (int32_t k = 0; k < g->n_inputs; k++)
        if (g->inputs[k].kind == kind && g->inputs[k].fqn == fqn) return k;
    return -1;
}

/* Gradients prefer their parameter's placements: GRAD outputs and AdamW's gradient input. */
static void set_preferences(gt_par *p, const gt_placement (*in_place)[GT_MESH_MAX_DIMS])
{
    const gt_graph *g = p->src;
    for (int32_t k = 0; k < g->n_outputs; k++) {
        if (g->outputs[k].kind != GT_OUT_GRAD) continue;
        int32_t in = input_by_fqn(g, GT_IN_PARAM, g->outputs[k].fqn);
        if (in >= 0) memcpy(p->prefer[g->outputs[k].value], in_place[in], sizeof p->prefer[0]);
    }
    for (int32_t i = 0; i < g->n_nodes; i++) {
        const gt_node *n = &g->nodes[i];
        if (n->op != GT_OP_ADAMW) continue;
        gt_value_id param = n->in[0], grad = n->in[1];
        for (int32_t k = 0; k < g->n_inputs; k++)
            if (g->inputs[k].value == param)
                memcpy(p->prefer[grad], in_place[k], sizeof p->prefer[0]);
    }
    memcpy(p->hint, p->prefer, (size_t)g->n_values * sizeof p->hint[0]);
    for (int32_t i = g->n_nodes - 1; i >= 0; i--) {
        const gt_node *n = &g->nodes[i];
        if (n->op == GT_OP_CAST && p->hint[n->out[0]][0].kind != GT_PLACE_NONE &&
            p->hint[n->in[0]][0].kind == GT_PLACE_NONE)
            memcpy(p->hint[n->in[0]], p->hint[n->out[0]], sizeof p->hint[0]);
    }
}

static gt_status add_outputs(gt_par *p, gt_error *err)
{
    const gt_graph *g = p->src;
    for (int32_t k = 0; k < g->n_outputs; k++) {
        const gt_io *o = &g->outputs[k];
        gt_placement to[GT_MESH_MAX_DIMS] = {{0}};
        int32_t in = -1;
        switch ((gt_output_kind)o->kind) {
        case GT_OUT_GRAD:
            in = input_by_fqn(g, GT_IN_PARAM, o->fqn);
            break;
        case GT_OUT_PARAM_UPDATE:
            in = input_by_fqn(g, GT_IN_PARAM, o->fqn);
            break;
        case GT_OUT_BUFFER_UPDATE:
            in = input_by_fqn(g, GT_IN_BUFFER, o->fqn);
            break;
        case GT_OUT_OPT_STATE_UPDATE:
            in = input_by_fqn(g, GT_IN_OPT_STATE, o->fqn);
            break;
        default: /* loss, metrics: replicate */
            break;
        }
        if (in >= 0) memcpy(to, place_of(p, p->map[g->inputs[in].value]), sizeof to);
        stamp(p, NULL);
        p->dst->cur_fqn = o->fqn;
        /* a parameter's gradient and update belong to its unit; the rest to none */
        if (in >= 0 && (o->kind == GT_OUT_GRAD || o->kind == GT_OUT_PARAM_UPDATE))
            p->dst->cur_unit = g->inputs[in].plan.unit;
        p->dst->cur_phase = GT_PHASE_OPTIMIZER;
        gt_value_id v;
        GT_TRY(convert(p, o->value, to, 0, &v, err));
        gt_graph_add_output(p->dst, (gt_output_kind)o->kind, gt_graph_str(g, o->fqn), v);
        GT_TRY(dst_error(p, err));
    }
    return GT_OK;
}

static void par_free(gt_par *p)
{
    free(p->map);
    free(p->weight);
    free(p->prefer);
    free(p->hint);
    free(p->node_map);
    free(p->cache);
    free(p->memo);
}

gt_status gt_parallelize(const gt_graph *g, const gt_parallel_plan *plan,
                         const gt_placement (*in_place)[GT_MESH_MAX_DIMS], gt_graph **out,
                         gt_error *err)
{
    *out = NULL;
    if (g->mesh.ndim != 0)
        return gt_error_set(err, GT_ERR_INVALID, "parallelize: the graph is already parallelized");
    gt_mesh check;
    GT_TRY(gt_mesh_init(&check, plan->mesh.size[0], plan->mesh.size[1], plan->mesh.size[2], err));

    gt_par p = {.src = g, .plan = *plan};
    /* the local graph starts as a copy (strings and symbols keep their ids) without nodes */
    p.dst = gt_graph_copy(g);
    p.dst->n_nodes = p.dst->n_values = p.dst->n_inputs = p.dst->n_outputs = 0;
    p.dst->err = (gt_error){0};
    p.dst->mesh.ndim = GT_MESH_NDIMS;
    for (int md = 0; md < GT_MESH_NDIMS; md++) {
        p.dst->mesh.size[md] = plan->mesh.size[md];
        p.dst->mesh.name[md] = gt_graph_intern(p.dst, gt_mesh_dim_name(md));
    }
    bool ep_tp = gt_mesh_expert_tp(&plan->mesh, plan->expert_parallel_degree);
    if (gt_mesh_expert_split(&plan->mesh, plan->expert_parallel_degree) || ep_tp) {
        int ep = plan->expert_parallel_degree;
        p.dst->mesh.ndim = GT_MESH_EP_NDIMS;
        p.dst->mesh.size[GT_MESH_EFSDP] =
            plan->mesh.size[GT_MESH_DP_SHARD] * (ep_tp ? plan->mesh.size[GT_MESH_TP] : 1) / ep;
        p.dst->mesh.size[GT_MESH_EP] = ep;
        for (int md = GT_MESH_EFSDP; md <= GT_MESH_EP; md++)
            p.dst->mesh.name[md] = gt_graph_intern(p.dst, gt_mesh_dim_name(md));
    }
    int dp = plan->mesh.size[GT_MESH_DP_REPLICATE] * plan->mesh.size[GT_MESH_DP_SHARD];
    if (dp > 1) {
        p.subst_name[p.n_subst] = "batch";
        p.subst_repl[p.n_subst++] =
            gt_sym_mul(p.dst->sym, gt_c(p.dst, dp), gt_sym_var(p.dst->sym, "batch"));
    }
    /* and when ep takes tp ranks, whose token split is then a multiple of the tp ranks'
     * sequence blocks the shape algebra can cancel ((tp * s) // tp = s) */
    if ((plan->sequence_parallel || ep_tp) && plan->mesh.size[GT_MESH_TP] > 1) {
        p.subst_name[p.n_subst] = "seq";
        p.subst_repl[p.n_subst++] = gt_sym_mul(p.dst->sym, gt_c(p.dst, plan->mesh.size[GT_MESH_TP]),
                                               gt_sym_var(p.dst->sym, "seq_shard"));
    }
    size_t nv = (size_t)(g->n_values ? g->n_values : 1);
    p.map = gt_xcalloc(nv, sizeof *p.map);
    p.weight = gt_xcalloc(nv, sizeof *p.weight);
    p.prefer = gt_xmalloc(nv * sizeof *p.prefer);
    p.hint = gt_xmalloc(nv * sizeof *p.hint);
    for (size_t v = 0; v < nv; v++)
        for (int md = 0; md < GT_MESH_MAX_DIMS; md++)
            p.prefer[v][md] = (gt_placement){GT_PLACE_NONE, 0, 0, 0};
    p.node_map = gt_xmalloc((size_t)(g->n_nodes ? g->n_nodes : 1) * sizeof *p.node_map);
    p.last_block = -1;
    for (int32_t i = 0; i < g->n_nodes; i++) {
        p.node_map[i] = GT_NONE;
        if (g->nodes[i].unit > p.last_block) p.last_block = g->nodes[i].unit;
    }

    gt_status st = GT_OK;
    for (int32_t k = 0; st == GT_OK && k < g->n_inputs; k++) {
        const gt_io *io = &g->inputs[k];
        const char *fqn = gt_graph_str(g, io->fqn);
        for (int md = GT_MESH_NDIMS; md < GT_MESH_MAX_DIMS; md++)
            if (in_place[k][md].kind != GT_PLACE_REPLICATE)
                st = gt_error_set(err, GT_ERR_INVALID, "parallelize: input '%s': mesh dim %d", fqn,
                                  md);
        gt_type t;
        if (st == GT_OK) st = localize(&p, gt_value_type(g, io->value), in_place[k], fqn, &t, err);
        if (st != GT_OK) break;
        gt_value_id v =
            gt_graph_add_input(p.dst, (gt_input_kind)io->kind, fqn, t.dtype, t.ndim, t.dims);
        st = dst_error(&p, err);
        if (st != GT_OK) break;
        p.dst->inputs[p.dst->n_inputs - 1].plan = io->plan;
        gt_par_set_place(&p, v, in_place[k]);
        p.map[io->value] = v;
        p.weight[io->value] = io->kind == GT_IN_PARAM;
    }
    if (st == GT_OK) set_preferences(&p, in_place);
    for (int32_t i = 0; st == GT_OK && i < g->n_nodes; i++)
        st = convert_node(&p, i, err);
    if (st == GT_OK) st = add_outputs(&p, err);
    stamp(&p, NULL);
    if (st == GT_OK) st = gt_graph_verify(p.dst, err);
    par_free(&p);
    if (st != GT_OK) {
        gt_graph_free(p.dst);
        return st;
    }
    *out = p.dst;
    return GT_OK;
}
