/* rules_vocab.c — vocabulary-parallel expanders (parallel_internal.h): the local subgraphs of
 * embedding, embedding_backward, cross_entropy and cross_entropy_backward when their rule set
 * c->vocab on mesh dim `mesh_dim` (n ranks, coordinate r, each holding Vl = V/n vocabulary rows
 * starting at r*Vl — or, when other mesh dims split the same tensor dim too, at the block offset
 * their nesting gives).
 *
 *   embedding (w S(0), ids R) -> P:  embedding_shard(w, ids; row_start): each rank writes the rows
 *       of the ids it holds and zeros elsewhere; the sum over ranks is the embedding.
 *   embedding_backward (ids R, dy R) -> S(0):  embedding_shard_backward(ids, dy; Vl, row_start):
 *       each rank accumulates the tokens of its rows, in token order.
 *   cross_entropy (logits S(1), targets R) -> P:
 *       lse_r = logsumexp(logits) [N]                        per-rank log-sum-exp of its columns
 *       all = all_gather(reshape(lse_r, [1, N])) [n, N]
 *       lse = logsumexp(transpose(all)) [N]                  log sum_r exp(lse_r): the global one
 *       loss_r = cross_entropy_shard(logits, targets, lse; vocab_start)
 *     sum_r loss_r is the cross-entropy: each non-ignored row's lse - x[t] is added by the one
 *     rank that holds column t, and every rank divides by the same global count.
 *   cross_entropy_backward (logits S(1), targets R, dloss R) -> S(1):
 *       cross_entropy_shard_backward(logits, targets, lse, dloss; vocab_start) with the global lse
 *     of the forward when the same local logits and targets had one (memo kind 1), else computed
 *     again as above. The logits are never gathered. */
#include "parallel/rules_internal.h"

enum { MEMO_GLOBAL_LSE = 1 };

/* Offset of this rank's block of tensor dim `dim` of local value v, in elements: with the mesh
 * dims that split `dim` taken outermost (lowest order) first, block index = sum over them of
 * coord * (product of the degrees nested inside), times the local size. */
static gt_expr block_start(gt_par *p, gt_value_id v, int dim)
{
    gt_graph *g = gt_par_dst(p);
    const gt_mesh *m = gt_par_mesh(p);
    const gt_placement *place = g->values[v].place;
    /* the mesh dims splitting `dim`, innermost (highest order) first */
    int split[GT_MESH_NDIMS], n_split = 0;
    for (int md = 0; md < GT_MESH_NDIMS; md++) {
        if (m->size[md] == 1 || !gt_is_s_at(place[md], dim)) continue;
        int k = n_split++;
        for (; k > 0 && place[split[k - 1]].order < place[md].order; k--)
            split[k] = split[k - 1];
        split[k] = md;
    }
    gt_expr index = gt_sym_const(g->sym, 0), stride = gt_sym_const(g->sym, 1);
    for (int k = 0; k < n_split; k++) {
        int md = split[k];
        index = gt_sym_add(g->sym, index, gt_sym_mul(g->sym, gt_par_coord(p, md), stride));
        stride = gt_sym_mul(g->sym, stride, gt_sym_const(g->sym, m->size[md]));
    }
    return gt_sym_mul(g->sym, index, gt_value_type(g, v)->dims[dim]);
}

/* Placements of a value derived from the local logits [N, Vl]: the logits' splits of N (other
 * mesh dims: data parallel) moved to tensor dim `n_dim`, and `self` on mesh_dim. */
static void derived_place(gt_par *p, gt_value_id logits, int mesh_dim, int n_dim, gt_placement self,
                          gt_placement out[GT_MESH_MAX_DIMS])
{
    const gt_placement *lp = gt_par_dst(p)->values[logits].place;
    for (int md = 0; md < GT_MESH_MAX_DIMS; md++)
        out[md] = gt_is_s_at(lp[md], 0) ? gt_shard_moved(lp[md], n_dim) : gt_place_replicate();
    out[mesh_dim] = self;
}

/* The global log-sum-exp per row of local logits [N, Vl] split along the vocabulary. */
static gt_value_id global_lse(gt_par *p, gt_value_id logits, int mesh_dim)
{
    gt_graph *g = gt_par_dst(p);
    gt_attrs none = {0};
    gt_placement pl[GT_MESH_MAX_DIMS];
    gt_expr rows = gt_value_type(g, logits)->dims[0];

    /* per rank: lse_r [N], seen as [1, N] = block r of the [n, N] stack (S(0) on mesh_dim) */
    gt_value_id lse_r = gt_par_emit(p, GT_OP_LOGSUMEXP, &logits, 1, &none, NULL);
    gt_attrs shape = {.ne = 2};
    shape.e[0] = gt_sym_const(g->sym, 1);
    shape.e[1] = rows;
    gt_value_id row = gt_par_emit(p, GT_OP_RESHAPE, &lse_r, 1, &shape, NULL);
    if (row == GT_NONE) return GT_NONE;
    derived_place(p, logits, mesh_dim, 0, gt_place_shard(0, 0), pl);
    gt_par_set_place(p, lse_r, pl);
    derived_place(p, logits, mesh_dim, 1, gt_place_shard(0, 0), pl);
    gt_par_set_place(p, row, pl);

    /* [n, N] on every rank -> [N, n] -> log sum_r exp(lse_r) */
    gt_value_id all = gt_par_all_gather(p, row, mesh_dim);
    if (all == GT_NONE) return GT_NONE;
    derived_place(p, logits, mesh_dim, 1, gt_place_replicate(), pl);
    gt_par_set_place(p, all, pl);
    gt_attrs tr = {.ni = 2};
    tr.i[0] = 0;
    tr.i[1] = 1;
    gt_value_id cols = gt_par_emit(p, GT_OP_TRANSPOSE, &all, 1, &tr, NULL);
    gt_value_id lse = gt_par_emit(p, GT_OP_LOGSUMEXP, &cols, 1, &none, NULL);
    if (lse == GT_NONE) return GT_NONE;
    derived_place(p, logits, mesh_dim, 0, gt_place_replicate(), pl);
    gt_par_set_place(p, cols, pl);
    gt_par_set_place(p, lse, pl);
    return lse;
}

static gt_status emitted(gt_par *p, const gt_node *n, gt_value_id v, gt_error *err)
{
    if (v != GT_NONE) return GT_OK;
    gt_graph *g = gt_par_dst(p);
    if (g->err.code != GT_OK) {
        *err = g->err;
        return err->code;
    }
    return gt_error_set(err, GT_ERR_INTERNAL, "parallelize: vocabulary-parallel %s: no output",
                        gt_op_get(n->op)->name);
}

gt_status gt_par_expand_vocab(gt_par *p, const gt_node *n, int mesh_dim, const gt_value_id *in,
                              gt_value_id *out, gt_error *err)
{
    gt_graph *g = gt_par_dst(p);
    gt_attrs a = {0};
    switch (n->op) {
    case GT_OP_EMBEDDING: /* (w [Vl, D], ids) */
        a.ne = 1;
        a.e[0] = block_start(p, in[0], 0);
        out[0] = gt_par_emit(p, GT_OP_EMBEDDING_SHARD, in, 2, &a, NULL);
        return emitted(p, n, out[0], err);
    case GT_OP_EMBEDDING_BACKWARD: { /* (ids, dy) -> [V/n, D] */
        int64_t v, size = gt_par_mesh(p)->size[mesh_dim];
        gt_expr ve = n->attrs.e[0], vl;
        if (gt_sym_is_const(g->sym, ve, &v)) {
            if (v % size != 0)
                return gt_error_set(err, GT_ERR_INVALID,
                                    "parallelize: embedding_backward: num_embeddings %lld does not "
                                    "split %lld ways",
                                    (long long)v, (long long)size);
            vl = gt_sym_const(g->sym, v / size);
        } else {
            vl = gt_sym_floordiv(g->sym, ve, gt_sym_const(g->sym, size));
        }
        a.ne = 2;
        a.e[0] = vl;
        a.e[1] = gt_sym_mul(g->sym, gt_par_coord(p, mesh_dim), vl);
        out[0] = gt_par_emit(p, GT_OP_EMBEDDING_SHARD_BACKWARD, in, 2, &a, NULL);
        return emitted(p, n, out[0], err);
    }
    case GT_OP_CROSS_ENTROPY:
    case GT_OP_CROSS_ENTROPY_BACKWARD: {
        gt_value_id lse = gt_par_memo_get(p, MEMO_GLOBAL_LSE, in[0], in[1]);
        if (lse == GT_NONE) {
            lse = global_lse(p, in[0], mesh_dim);
            GT_TRY(emitted(p, n, lse, err));
            gt_par_memo_put(p, MEMO_GLOBAL_LSE, in[0], in[1], lse);
        }
        a.ni = 1;
        a.i[0] = n->attrs.i[0]; /* ignore_index */
        a.ne = 1;
        a.e[0] = block_start(p, in[0], 1);
        gt_value_id args[4] = {in[0], in[1], lse, n->op == GT_OP_CROSS_ENTROPY ? GT_NONE : in[2]};
        gt_op op = n->op == GT_OP_CROSS_ENTROPY ? GT_OP_CROSS_ENTROPY_SHARD
                                                : GT_OP_CROSS_ENTROPY_SHARD_BACKWARD;
        out[0] = gt_par_emit(p, op, args, n->op == GT_OP_CROSS_ENTROPY ? 3 : 4, &a, NULL);
        return emitted(p, n, out[0], err);
    }
    default:
        return gt_error_set(err, GT_ERR_INTERNAL,
                            "parallelize: %s has no vocabulary-parallel form (a rule set vocab)",
                            gt_op_get(n->op)->name);
    }
}
