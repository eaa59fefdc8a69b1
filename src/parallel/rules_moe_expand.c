/* rules_moe_expand.c — the expert-parallel expander (parallel_internal.h): the local subgraphs of
 * grouped_matmul and grouped_matmul_dw when rules_moe.c set c->expert on the ep mesh dim (n
 * ranks, coordinate r, each holding the e = E / n experts r*e .. r*e + e - 1 whole).
 *
 * Each rank's routed rows x [R, D] are sorted by expert (moe_sort), so the rows bound for rank b
 * are one run: offsets[b*e] .. offsets[b*e + e]. Per layer (memo: once per offsets value):
 *   table = all_gather(moe_block_offsets(offsets))        i32 [n*n, e + 1], the same on every rank:
 *                                                         row a*n + b = a's block for b
 * Per row tensor sent (memo: once per value, so xs goes once for w1 and w3 and again only for
 * their weight gradients' reuse):
 *   recv = all_to_all(moe_pack(x, table; C))              [n*C, D]: block a = a's rows for r
 * grouped_matmul (x, w [e, ..], offsets) ->
 *   y_a = grouped_matmul(recv[a*C ..], w, table[a*n + r]) per source a  (rows M-invariant)
 *   out = moe_unpack(all_to_all(concat(y_0 .. y_{n-1})), table)     [R, Dout]: the rank's rows
 * grouped_matmul_dw (x, dy, offsets) ->
 *   dw = sum over a, in order, of grouped_matmul_dw(recv_x[a*C ..], recv_dy[a*C ..], table[a*n+r])
 *     [e, Dout, Din]: the rank's experts' gradient, whole.
 *
 * Why this is bitwise the data-parallel form (ep = 1, the same dp_shard layout): a row's output
 * is the same fmaf chain over Din whichever rank computes it (grouped_matmul's M-invariance), and
 * it returns to its source row; a source a's part of dw[e] is the same row-ordered chain over
 * a's rows of expert e as rank a's own grouped_matmul_dw computes for ep = 1, and the parts add
 * in rank order as the reduce-scatter adds them.
 *
 * C, the rows per rank pair: the worst case T * min(K, e) (T the rank's tokens, K the top-k)
 * unless parallelism.expert_parallel_capacity_factor f in (0, 1) asks for ceil(f * worst); an
 * overflow is moe_pack's error (gt_ops.def), the same on every rank.
 *
 * ep a proper divisor of dp_shard (gt_mesh_expert_split: n dp_shard ranks = F efsdp x ep, ep
 * inner, rank.dp_shard = f*ep + c). The expert weights keep FSDP's storage, n blocks of
 * b = E / n experts, rank f*ep + c holding block f*ep + c; ep coordinate c runs the F blocks
 * {f'*ep + c}, which its efsdp group (the ranks f'*ep + c) holds. So, with the rows cut into the
 * n storage blocks instead of n ranks (table over dp_shard, [n*n, b + 1], the same everywhere):
 *   wg   = all_gather over efsdp (the rank's block)                [F*b, ..]: sub-block f' =
 *                                                                  block f'*ep + c
 *   sent = moe_pack(x; n blocks of C) regrouped ep-major: blocks (c', f') = block f'*ep + c'
 *   recv = all_to_all over ep                                      [ep*F*C, D]: (a, f') from a
 * grouped_matmul -> y_(a, f') = grouped_matmul(recv(a, f'), wg[f'], table[(f*ep + a)*n +
 *                  f'*ep + c]); all_to_all back over ep; regrouped block-major; moe_unpack.
 * grouped_matmul_dw -> dw_f' = sum over a, in order, of grouped_matmul_dw on (a, f'); the
 *                  F dw_f' stacked are the gradient of wg, reduce-scattered over efsdp to the
 *                  rank's block [b, ..] (its FSDP storage).
 * Rows still go to the one rank that runs their expert and come back (M-invariance), so the
 * forward and dX are bitwise ep 1's; dW adds the n source ranks' parts as (sum over the ep group)
 * summed over efsdp — ((p0 + p1) + (p2 + p3)) for dp_shard 4, ep 2 — where FSDP's reduce-scatter
 * adds ((p0 + p1) + p2) + p3: equal to rounding, not bitwise. Padding costs: every (rank, block)
 * pair gets C rows, so an all_to_all moves F times the rows of the unsplit form's pair blocks.
 *
 * ep taking tp ranks (gt_mesh_expert_tp; the expander runs on the tp dim, where rules_moe.c split
 * the tokens): the same split form over the flattened group of n = dp_shard * tp ranks, index
 * rank.dp_shard * tp + rank.tp (the table all-gathered over tp, then dp_shard, gives that order).
 * The n storage blocks of b = E / n experts are the weights' storage here too, torchtitan's ETP 1
 * (layout.c: shard(0) on dp_shard with shard(0) nested inside it on tp, so rank (s, t) holds
 * block s * tp + t, and so do the AdamW moments): wg is gathered over efsdp, the gradient
 * reduce-scattered over efsdp, each rank storing 1 / (dp_shard * tp) of the expert state. With
 * F = 1 (ep = dp_shard * tp) the rank's own block is all it multiplies by and its gradient is
 * the ep group's sum, with no collective. */
#include <math.h>
#include <stdlib.h>

#include "graphtrain/gt_build.h"
#include "parallel/rules_internal.h"

enum { MEMO_TABLE = 2, MEMO_SENT = 3 };

static gt_status emitted(gt_par *p, gt_value_id v, gt_error *err)
{
    if (v != GT_NONE) return GT_OK;
    gt_graph *g = gt_par_dst(p);
    if (g->err.code != GT_OK) {
        *err = g->err;
        return err->code;
    }
    return gt_error_set(err, GT_ERR_INTERNAL, "parallelize: expert-parallel expansion: no output");
}

/* Placements of a per-rank value of the expansion: replicate on every mesh dim but the data-
 * parallel ones that split the tokens (`rows`' placements there, moved to dim 0) — the value
 * differs per rank there, so the label must not claim it is the same everywhere. */
static void local_place(gt_par *p, gt_value_id rows, gt_placement out[GT_MESH_MAX_DIMS])
{
    const gt_placement *rp = gt_par_dst(p)->values[rows].place;
    for (int md = 0; md < GT_MESH_MAX_DIMS; md++)
        out[md] = gt_is_s_at(rp[md], 0) ? rp[md] : gt_place_replicate();
}

/* K, the experts per token, from the global offsets' moe_sort (its ids are [T, K]); 1 if unknown.
 */
static int64_t top_k(const gt_graph *g, gt_value_id offsets)
{
    gt_node_id pn = g->values[offsets].producer;
    int64_t k;
    if (pn == GT_NONE || g->nodes[pn].op != GT_OP_MOE_SORT) return 1;
    const gt_type *ids = gt_value_type(g, g->nodes[pn].in[0]);
    return ids->ndim == 2 && gt_sym_is_const(g->sym, ids->dims[1], &k) && k > 0 ? k : 1;
}

/* tp: ep takes tp ranks, the rows were cut over the flattened dp_shard x tp group, whose
 * index is rank.dp_shard * tp + rank.tp: gathered over tp first (inner), then dp_shard. */
static gt_value_id block_table(gt_par *p, gt_value_id offsets, int mesh_dim, int n, bool tp)
{
    gt_value_id t = gt_par_memo_get(p, MEMO_TABLE, offsets, GT_NONE);
    if (t != GT_NONE) return t;
    gt_value_id own = gt_moe_block_offsets(gt_par_dst(p), offsets, n);
    if (own == GT_NONE) return GT_NONE;
    t = gt_par_all_gather(p, own, tp ? GT_MESH_TP : mesh_dim);
    if (t != GT_NONE && tp && gt_par_mesh(p)->size[GT_MESH_DP_SHARD] > 1)
        t = gt_par_all_gather(p, t, GT_MESH_DP_SHARD);
    gt_par_memo_put(p, MEMO_TABLE, offsets, GT_NONE, t);
    return t;
}

typedef struct {
    int mesh_dim, n; /* the mesh dim the rows are cut for (dp_shard) and its size */
    /* ep group: its size and the coordinate c (split: the ep dim, size n / F; else n and rank) */
    int ep, f_n;
    bool tp;   /* ep takes tp ranks: n = dp_shard x tp flattened (the weights' lean storage) */
    int64_t e; /* experts per block: E / n */
    gt_expr rank, cap, worst, rows, ep_rank;
    gt_value_id table;
} ep_ctx;

static gt_status ep_init(gt_par *p, const gt_node *n, int mesh_dim, const gt_value_id *in,
                         ep_ctx *x, gt_error *err)
{
    gt_graph *g = gt_par_dst(p);
    const gt_mesh *m = gt_par_mesh(p);
    x->mesh_dim = mesh_dim;
    x->tp = mesh_dim == GT_MESH_TP && g->mesh.ndim > GT_MESH_EP;
    x->n = x->tp ? m->size[GT_MESH_DP_SHARD] * m->size[GT_MESH_TP] : m->size[mesh_dim];
    int64_t len;
    const gt_type *off = gt_value_type(g, in[2]);
    if (!gt_sym_is_const(g->sym, off->dims[0], &len) || (len - 1) % x->n != 0)
        return gt_error_set(err, GT_ERR_INVALID,
                            "parallelize: expert parallel over %d ranks: the routed experts do "
                            "not split evenly (set parallelism.expert_parallel_degree to a "
                            "divisor of the experts)",
                            x->n);
    x->e = (len - 1) / x->n;
    x->rank = gt_par_coord(p, mesh_dim);
    if (x->tp)
        x->rank = gt_sym_add(
            g->sym,
            gt_sym_mul(g->sym, gt_par_coord(p, GT_MESH_DP_SHARD), gt_c(g, m->size[GT_MESH_TP])),
            gt_par_coord(p, GT_MESH_TP));
    x->ep = x->n;
    x->f_n = 1;
    x->ep_rank = x->rank;
    if (g->mesh.ndim > GT_MESH_EP && (mesh_dim == GT_MESH_DP_SHARD || x->tp)) {
        x->ep = g->mesh.size[GT_MESH_EP];
        x->f_n = g->mesh.size[GT_MESH_EFSDP];
        x->ep_rank = gt_par_coord(p, GT_MESH_EP);
    }
    x->rows = gt_value_type(g, in[0])->dims[0]; /* T * K local rows */
    int64_t k = top_k(gt_par_src(p), n->in[2]);
    if (k <= x->e)
        x->worst = x->rows;
    else
        x->worst = gt_sym_mul(g->sym, gt_sym_floordiv(g->sym, x->rows, gt_c(g, k)), gt_c(g, x->e));
    double f = gt_par_capacity_factor(p);
    x->cap = x->worst;
    if (f > 0.0 && f < 1.0) { /* ceil(f * worst) in thousandths, at least one row */
        int64_t q = (int64_t)ceil(f * 1000.0);
        if (q < 1) q = 1;
        x->cap = gt_sym_floordiv(
            g->sym, gt_sym_add(g->sym, gt_sym_mul(g->sym, x->worst, gt_c(g, q)), gt_c(g, 999)),
            gt_c(g, 1000));
    }
    x->table = block_table(p, in[2], mesh_dim, x->n, x->tp);
    return emitted(p, x->table, err);
}

static gt_value_id regroup(gt_par *p, const ep_ctx *x, gt_value_id v, bool to_ep,
                           const gt_placement *pl);

/* The rows of local value v as the experts' ranks receive them: [n*C, D], block a from rank a;
 * split (ep < dp_shard): [ep*F*C, D], (a, f') from a, exchanged within the ep group. */
static gt_value_id sent(gt_par *p, const ep_ctx *x, gt_value_id v, gt_value_id offsets, bool split)
{
    gt_value_id r = gt_par_memo_get(p, MEMO_SENT, v, offsets);
    if (r != GT_NONE) return r;
    gt_placement pl[GT_MESH_MAX_DIMS];
    local_place(p, v, pl);
    gt_value_id packed = gt_moe_pack(gt_par_dst(p), v, x->table, x->n, x->cap, x->worst, x->rank);
    if (packed == GT_NONE) return GT_NONE;
    gt_par_set_place(p, packed, pl);
    if (split) packed = regroup(p, x, packed, true, pl);
    if (packed == GT_NONE) return GT_NONE;
    r = gt_par_all_to_all(p, packed, split ? GT_MESH_EP : x->mesh_dim);
    if (r == GT_NONE) return GT_NONE;
    gt_par_set_place(p, r, pl);
    gt_par_memo_put(p, MEMO_SENT, v, offsets, r);
    return r;
}

/* Block a of received rows [n*C, D] and its offsets [e + 1] (table row a*n + r). */
static void block_of(gt_par *p, const ep_ctx *x, gt_value_id recv, int a, gt_value_id *rows,
                     gt_value_id *offs)
{
    gt_graph *g = gt_par_dst(p);
    gt_expr start = gt_sym_mul(g->sym, gt_c(g, a), x->cap);
    *rows = gt_slice(g, recv, 0, start, gt_sym_add(g->sym, start, x->cap));
    gt_expr row = gt_sym_add(g->sym, gt_c(g, (int64_t)a * x->n), x->rank);
    gt_value_id one = gt_slice(g, x->table, 0, row, gt_sym_add(g->sym, row, gt_c(g, 1)));
    gt_expr flat = gt_c(g, x->e + 1);
    *offs = gt_reshape(g, one, 1, &flat);
}

/* ys[0 .. n) stacked along dim 0, by concats of at most GT_MAX_IN inputs (ys is overwritten). */
static gt_value_id concat_rows(gt_par *p, gt_value_id *ys, int n, const gt_placement *pl)
{
    while (n > 1) {
        int m = 0;
        for (int a = 0; a < n; a += GT_MAX_IN) {
            int k = n - a < GT_MAX_IN ? n - a : GT_MAX_IN;
            ys[m] = k == 1 ? ys[a] : gt_concat(gt_par_dst(p), k, ys + a, 0);
            if (ys[m] == GT_NONE) return GT_NONE;
            gt_par_set_place(p, ys[m++], pl);
        }
        n = m;
    }
    return ys[0];
}

/* ---------------------------------------------------------------- ep splits dp_shard */

/* Rows [start*C, (start + count)*C) of v, blocks of C rows. */
static gt_value_id blocks(gt_par *p, const ep_ctx *x, gt_value_id v, int start, int count)
{
    gt_graph *g = gt_par_dst(p);
    gt_expr a = gt_sym_mul(g->sym, gt_c(g, start), x->cap);
    return gt_slice(g, v, 0, a, gt_sym_add(g->sym, a, gt_sym_mul(g->sym, gt_c(g, count), x->cap)));
}

/* v's n blocks of C rows reordered: to_ep (block-major j = f'*ep + c' -> ep-major (c', f')) or
 * back. */
static gt_value_id regroup(gt_par *p, const ep_ctx *x, gt_value_id v, bool to_ep,
                           const gt_placement *pl)
{
    gt_value_id *parts = gt_xcalloc((size_t)x->n, sizeof *parts);
    int k = 0;
    for (int i = 0; i < x->ep && to_ep; i++) /* i = c' */
        for (int f = 0; f < x->f_n; f++)
            parts[k++] = blocks(p, x, v, f * x->ep + i, 1);
    for (int j = 0; j < x->n && !to_ep; j++) /* j = f'*ep + c' <- ep-major (c', f') */
        parts[k++] = blocks(p, x, v, (j % x->ep) * x->f_n + j / x->ep, 1);
    for (int i = 0; i < k; i++)
        gt_par_set_place(p, parts[i], pl);
    gt_value_id r = concat_rows(p, parts, k, pl);
    free(parts);
    return r;
}

/* Block (a, f') of received rows and its offsets [b + 1]: table row (f*ep + a)*n + f'*ep + c,
 * f*ep + a = rank.dp_shard - c + a. */
static void block_split(gt_par *p, const ep_ctx *x, gt_value_id recv, int a, int f,
                        gt_value_id *rows, gt_value_id *offs)
{
    gt_graph *g = gt_par_dst(p);
    *rows = blocks(p, x, recv, a * x->f_n + f, 1);
    gt_expr src = gt_sym_add(g->sym, gt_sym_sub(g->sym, x->rank, x->ep_rank), gt_c(g, a));
    gt_expr row = gt_sym_add(g->sym, gt_sym_mul(g->sym, src, gt_c(g, x->n)),
                             gt_sym_add(g->sym, gt_c(g, (int64_t)f * x->ep), x->ep_rank));
    gt_value_id one = gt_slice(g, x->table, 0, row, gt_sym_add(g->sym, row, gt_c(g, 1)));
    gt_expr flat = gt_c(g, x->e + 1);
    *offs = gt_reshape(g, one, 1, &flat);
}

static gt_status expand_split(gt_par *p, const gt_node *n, const ep_ctx *x, const gt_value_id *in,
                              const gt_placement *pl, gt_value_id *out, gt_error *err)
{
    gt_graph *g = gt_par_dst(p);
    int nb = x->ep * x->f_n;
    if (n->op == GT_OP_GROUPED_MATMUL) { /* (x, w [b, ..], offsets) */
        gt_value_id recv = sent(p, x, in[0], in[2], true);
        GT_TRY(emitted(p, recv, err));
        /* the F blocks f'*ep + c of the rank's ep coordinate c, gathered over efsdp from their
         * storage (one block: the rank's own) */
        gt_value_id wg = in[1];
        if (x->f_n > 1) {
            wg = gt_par_all_gather(p, in[1], GT_MESH_EFSDP);
            GT_TRY(emitted(p, wg, err));
            gt_par_set_place(p, wg, gt_par_dst(p)->values[in[1]].place);
        }
        gt_value_id *ys = gt_xcalloc((size_t)nb, sizeof *ys);
        for (int a = 0; a < x->ep; a++)
            for (int f = 0; f < x->f_n; f++) {
                gt_value_id rows, offs;
                block_split(p, x, recv, a, f, &rows, &offs);
                gt_value_id w = wg;
                if (x->f_n > 1) {
                    gt_expr w0 = gt_c(g, f * x->e);
                    w = gt_slice(g, wg, 0, w0, gt_sym_add(g->sym, w0, gt_c(g, x->e)));
                }
                ys[a * x->f_n + f] = gt_grouped_matmul(g, rows, w, offs, n->attrs.i[0] != 0);
                gt_par_set_place(p, ys[a * x->f_n + f], pl);
            }
        gt_value_id y = concat_rows(p, ys, nb, pl);
        free(ys);
        GT_TRY(emitted(p, y, err));
        gt_value_id back = gt_par_all_to_all(p, y, GT_MESH_EP);
        GT_TRY(emitted(p, back, err));
        gt_par_set_place(p, back, pl);
        gt_value_id mine = regroup(p, x, back, false, pl);
        GT_TRY(emitted(p, mine, err));
        out[0] = gt_moe_unpack(g, mine, x->table, x->n, x->rows, x->rank);
        return emitted(p, out[0], err);
    }
    /* grouped_matmul_dw (x, dy, offsets) -> [b, Dout, Din] */
    gt_value_id rx = sent(p, x, in[0], in[2], true);
    GT_TRY(emitted(p, rx, err));
    gt_value_id rdy = sent(p, x, in[1], in[2], true);
    GT_TRY(emitted(p, rdy, err));
    gt_value_id *dws = gt_xcalloc((size_t)x->f_n, sizeof *dws);
    for (int f = 0; f < x->f_n; f++)
        for (int a = 0; a < x->ep; a++) {
            gt_value_id xa, dya, offs;
            block_split(p, x, rx, a, f, &xa, &offs);
            block_split(p, x, rdy, a, f, &dya, &offs);
            gt_value_id part = gt_grouped_matmul_dw(g, xa, dya, offs);
            gt_par_set_place(p, part, pl);
            dws[f] = dws[f] == GT_NONE || a == 0 ? part : gt_add(g, dws[f], part);
            gt_par_set_place(p, dws[f], pl);
        }
    gt_value_id all = concat_rows(p, dws, x->f_n, pl);
    free(dws);
    GT_TRY(emitted(p, all, err));
    out[0] = x->f_n > 1 ? gt_par_reduce_scatter(p, all, GT_MESH_EFSDP) : all;
    return emitted(p, out[0], err);
}

gt_status gt_par_expand_moe(gt_par *p, const gt_node *n, int mesh_dim, const gt_value_id *in,
                            gt_value_id *out, gt_error *err)
{
    gt_graph *g = gt_par_dst(p);
    ep_ctx x;
    GT_TRY(ep_init(p, n, mesh_dim, in, &x, err));
    gt_placement pl[GT_MESH_MAX_DIMS];
    local_place(p, in[0], pl);
    if ((x.f_n > 1 || x.tp) && (n->op == GT_OP_GROUPED_MATMUL || n->op == GT_OP_GROUPED_MATMUL_DW))
        return expand_split(p, n, &x, in, pl, out, err);
    switch (n->op) {
    case GT_OP_GROUPED_MATMUL: { /* (x, w [e, ..], offsets) */
        gt_value_id recv = sent(p, &x, in[0], in[2], false);
        GT_TRY(emitted(p, recv, err));
        gt_value_id *ys = gt_xcalloc((size_t)x.n, sizeof *ys);
        for (int a = 0; a < x.n; a++) {
            gt_value_id rows, offs;
            block_of(p, &x, recv, a, &rows, &offs);
            ys[a] = gt_grouped_matmul(g, rows, in[1], offs, n->attrs.i[0] != 0);
            gt_par_set_place(p, ys[a], pl);
        }
        gt_value_id y = concat_rows(p, ys, x.n, pl);
        free(ys);
        GT_TRY(emitted(p, y, err));
        gt_par_set_place(p, y, pl);
        gt_value_id back = gt_par_all_to_all(p, y, mesh_dim);
        GT_TRY(emitted(p, back, err));
        gt_par_set_place(p, back, pl);
        out[0] = gt_moe_unpack(g, back, x.table, x.n, x.rows, x.rank);
        return emitted(p, out[0], err);
    }
    case GT_OP_GROUPED_MATMUL_DW: { /* (x, dy, offsets) -> [e, Dout, Din] */
        gt_value_id rx = sent(p, &x, in[0], in[2], false);
        GT_TRY(emitted(p, rx, err));
        gt_value_id rdy = sent(p, &x, in[1], in[2], false);
        GT_TRY(emitted(p, rdy, err));
        gt_value_id dw = GT_NONE;
        for (int a = 0; a < x.n; a++) {
            gt_value_id xa, dya, offs;
            block_of(p, &x, rx, a, &xa, &offs);
            block_of(p, &x, rdy, a, &dya, &offs);
            gt_value_id part = gt_grouped_matmul_dw(g, xa, dya, offs);
            gt_par_set_place(p, part, pl);
            dw = dw == GT_NONE ? part : gt_add(g, dw, part);
            gt_par_set_place(p, dw, pl);
        }
        out[0] = dw;
        return emitted(p, out[0], err);
    }
    default:
        return gt_error_set(err, GT_ERR_INTERNAL,
                            "parallelize: %s has no expert-parallel form (a rule set expert)",
                            gt_op_get(n->op)->name);
    }
}
