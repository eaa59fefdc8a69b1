/* shape_rules_moe.c — shape/dtype rules of DeepSeek-V3's mixture-of-experts ops: sign, moe_topk,
 * gather_last and its backward, moe_sort, moe_count, grouped_matmul and grouped_matmul_dw, and
 * expert parallel's moe_block_offsets, moe_pack and moe_unpack
 * (semantics in gt_ops.def). Sizes that are constants are checked here; symbolic ones (tokens)
 * by the kernels. */
#include "ir/ir_internal.h"

static gt_status need_i32(gt_graph *g, const gt_node *n, int k, const char *what, gt_error *err)
{
    const gt_type *t = gt_shape_in(g, n, k);
    if (t->dtype == GT_I32) return GT_OK;
    char ts[160];
    return gt_shape_fail(g, n, err, GT_ERR_SHAPE, "%s must be i32, got %s", what,
                         gt_type_str(g, t, ts, sizeof ts));
}

static gt_status need_same_dim(gt_graph *g, const gt_node *n, const char *what_a, gt_expr a,
                               const char *what_b, gt_expr b, gt_error *err)
{
    if (a == b) return GT_OK;
    int64_t va, vb;
    if (gt_sym_is_const(g->sym, a, &va) && gt_sym_is_const(g->sym, b, &vb) && va == vb)
        return GT_OK;
    char as[96], bs[96];
    return gt_shape_fail(g, n, err, GT_ERR_SHAPE, "%s (%s) must equal %s (%s)", what_a,
                         gt_expr_str(g, a, as, sizeof as), what_b,
                         gt_expr_str(g, b, bs, sizeof bs));
}

static bool dim_const(const gt_graph *g, gt_expr e, int64_t *v)
{
    return gt_sym_is_const(g->sym, e, v);
}

/* (x) -> same type. */
gt_status gt_shape_sign(gt_graph *g, const gt_node *n, gt_type *out, int *n_out, gt_error *err)
{
    GT_TRY(gt_shape_need_float(g, n, 0, err));
    out[0] = *gt_shape_in(g, n, 0);
    *n_out = 1;
    return GT_OK;
}

/* (scores: [T, E] float) -> i32 [T, k]. Schema "i:k,n_groups,n_limited". */
gt_status gt_shape_moe_topk(gt_graph *g, const gt_node *n, gt_type *out, int *n_out, gt_error *err)
{
    GT_TRY(gt_shape_need_float(g, n, 0, err));
    GT_TRY(gt_shape_need_rank(g, n, 0, 2, err));
    const gt_type *s = gt_shape_in(g, n, 0);
    int64_t k = n->attrs.i[0], groups = n->attrs.i[1], limited = n->attrs.i[2], e;
    if (k < 1)
        return gt_shape_fail(g, n, err, GT_ERR_INVALID, "k must be >= 1, got %lld", (long long)k);
    if (groups < 0)
        return gt_shape_fail(g, n, err, GT_ERR_INVALID, "n_groups must be >= 0, got %lld",
                             (long long)groups);
    if (groups > 1 && (limited < 1 || limited > groups))
        return gt_shape_fail(g, n, err, GT_ERR_INVALID,
                             "n_limited must be in [1, n_groups = %lld], got %lld",
                             (long long)groups, (long long)limited);
    if (dim_const(g, s->dims[1], &e)) {
        if (k > e)
            return gt_shape_fail(g, n, err, GT_ERR_INVALID, "k = %lld exceeds the %lld experts",
                                 (long long)k, (long long)e);
        if (groups > 1 && e % groups != 0)
            return gt_shape_fail(g, n, err, GT_ERR_INVALID,
                                 "%lld experts do not split into n_groups = %lld", (long long)e,
                                 (long long)groups);
        if (groups > 1 && k > limited * (e / groups))
            return gt_shape_fail(g, n, err, GT_ERR_INVALID,
                                 "k = %lld exceeds the %lld experts of the n_limited = %lld groups",
                                 (long long)k, (long long)(limited * (e / groups)),
                                 (long long)limited);
    }
    out[0].dtype = GT_I32;
    out[0].ndim = 2;
    out[0].dims[0] = s->dims[0];
    out[0].dims[1] = gt_sym_const(g->sym, k);
    *n_out = 1;
    return GT_OK;
}

/* (x: [T, E] float, idx: [T, K] i32) -> [T, K] of x's dtype. */
gt_status gt_shape_gather_last(gt_graph *g, const gt_node *n, gt_type *out, int *n_out,
                               gt_error *err)
{
    GT_TRY(gt_shape_need_float(g, n, 0, err));
    GT_TRY(gt_shape_need_rank(g, n, 0, 2, err));
    GT_TRY(need_i32(g, n, 1, "idx", err));
    GT_TRY(gt_shape_need_rank(g, n, 1, 2, err));
    const gt_type *x = gt_shape_in(g, n, 0), *idx = gt_shape_in(g, n, 1);
    GT_TRY(need_same_dim(g, n, "idx rows", idx->dims[0], "x rows", x->dims[0], err));
    out[0] = *idx;
    out[0].dtype = x->dtype;
    *n_out = 1;
    return GT_OK;
}

/* (idx: [T, K] i32, dy: [T, K] float) -> [T, n_cols] of dy's dtype. */
gt_status gt_shape_gather_last_backward(gt_graph *g, const gt_node *n, gt_type *out, int *n_out,
                                        gt_error *err)
{
    GT_TRY(need_i32(g, n, 0, "idx", err));
    GT_TRY(gt_shape_need_rank(g, n, 0, 2, err));
    GT_TRY(gt_shape_need_float(g, n, 1, err));
    GT_TRY(gt_shape_need_rank(g, n, 1, 2, err));
    GT_TRY(gt_shape_need_size(g, n, "n_cols", n->attrs.e[0], err));
    const gt_type *idx = gt_shape_in(g, n, 0), *dy = gt_shape_in(g, n, 1);
    GT_TRY(need_same_dim(g, n, "dy rows", dy->dims[0], "idx rows", idx->dims[0], err));
    GT_TRY(need_same_dim(g, n, "dy cols", dy->dims[1], "idx cols", idx->dims[1], err));
    out[0] = *dy;
    out[0].dims[1] = n->attrs.e[0];
    *n_out = 1;
    return GT_OK;
}

static gt_status need_experts(gt_graph *g, const gt_node *n, gt_error *err)
{
    GT_TRY(need_i32(g, n, 0, "idx", err));
    GT_TRY(gt_shape_need_rank(g, n, 0, 2, err));
    if (n->attrs.i[0] >= 1) return GT_OK;
    return gt_shape_fail(g, n, err, GT_ERR_INVALID, "n_experts must be >= 1, got %lld",
                         (long long)n->attrs.i[0]);
}

/* (idx: [T, K] i32) -> (order, token: i32 [T*K], offsets: i32 [n_experts + 1]). */
gt_status gt_shape_moe_sort(gt_graph *g, const gt_node *n, gt_type *out, int *n_out, gt_error *err)
{
    GT_TRY(need_experts(g, n, err));
    const gt_type *idx = gt_shape_in(g, n, 0);
    gt_expr rows = gt_sym_mul(g->sym, idx->dims[0], idx->dims[1]);
    for (int k = 0; k < 2; k++) {
        out[k].dtype = GT_I32;
        out[k].ndim = 1;
        out[k].dims[0] = rows;
    }
    out[2].dtype = GT_I32;
    out[2].ndim = 1;
    out[2].dims[0] = gt_sym_const(g->sym, n->attrs.i[0] + 1);
    *n_out = 3;
    return GT_OK;
}

/* (idx: [T, K] i32) -> f32 [n_experts]. */
gt_status gt_shape_moe_count(gt_graph *g, const gt_node *n, gt_type *out, int *n_out, gt_error *err)
{
    GT_TRY(need_experts(g, n, err));
    out[0].dtype = GT_F32;
    out[0].ndim = 1;
    out[0].dims[0] = gt_sym_const(g->sym, n->attrs.i[0]);
    *n_out = 1;
    return GT_OK;
}

/* offsets (input k): i32 [E + 1]. */
static gt_status need_offsets(gt_graph *g, const gt_node *n, int k, gt_error *err)
{
    GT_TRY(need_i32(g, n, k, "offsets", err));
    return gt_shape_need_rank(g, n, k, 1, err);
}

/* The grouped matmuls' inputs: 0 a float [R, D], 1 a float of rank1 and 0's dtype, 2 offsets. */
static gt_status need_grouped_inputs(gt_graph *g, const gt_node *n, int rank1, gt_error *err)
{
    GT_TRY(gt_shape_need_float(g, n, 0, err));
    GT_TRY(gt_shape_need_rank(g, n, 0, 2, err));
    GT_TRY(gt_shape_need_float(g, n, 1, err));
    GT_TRY(gt_shape_need_rank(g, n, 1, rank1, err));
    GT_TRY(gt_shape_need_same_dtype(g, n, 0, 1, err));
    return need_offsets(g, n, 2, err);
}

/* (x: [R, Din], w: [E, Dout, Din] (trans_b) or [E, Din, Dout], offsets: i32 [E + 1]) -> [R, Dout]
 * of x's dtype; x and w of one float dtype. Schema "i:trans_b". */
gt_status gt_shape_grouped_matmul(gt_graph *g, const gt_node *n, gt_type *out, int *n_out,
                                  gt_error *err)
{
    GT_TRY(need_grouped_inputs(g, n, 3, err));
    int64_t tb = n->attrs.i[0];
    if (tb != 0 && tb != 1)
        return gt_shape_fail(g, n, err, GT_ERR_INVALID, "trans_b must be 0 or 1, got %lld",
                             (long long)tb);
    const gt_type *x = gt_shape_in(g, n, 0), *w = gt_shape_in(g, n, 1);
    const gt_type *off = gt_shape_in(g, n, 2);
    gt_expr din = tb ? w->dims[2] : w->dims[1], dout = tb ? w->dims[1] : w->dims[2];
    GT_TRY(need_same_dim(g, n, "x's last dim", x->dims[1], "w's input dim", din, err));
    gt_expr e1 = gt_sym_add(g->sym, w->dims[0], gt_sym_const(g->sym, 1));
    GT_TRY(need_same_dim(g, n, "offsets' length", off->dims[0], "w's experts + 1", e1, err));
    out[0] = *x;
    out[0].dims[1] = dout;
    *n_out = 1;
    return GT_OK;
}

/* (x: [R, Din], dy: [R, Dout], offsets: i32 [E + 1]) -> [E, Dout, Din] of dy's dtype. */
gt_status gt_shape_grouped_matmul_dw(gt_graph *g, const gt_node *n, gt_type *out, int *n_out,
                                     gt_error *err)
{
    GT_TRY(need_grouped_inputs(g, n, 2, err));
    const gt_type *x = gt_shape_in(g, n, 0), *dy = gt_shape_in(g, n, 1);
    const gt_type *off = gt_shape_in(g, n, 2);
    GT_TRY(need_same_dim(g, n, "dy rows", dy->dims[0], "x rows", x->dims[0], err));
    int64_t len;
    if (dim_const(g, off->dims[0], &len) && len < 1)
        return gt_shape_fail(g, n, err, GT_ERR_SHAPE, "offsets must hold E + 1 >= 1 entries");
    out[0].dtype = dy->dtype;
    out[0].ndim = 3;
    out[0].dims[0] = gt_sym_sub(g->sym, off->dims[0], gt_sym_const(g->sym, 1));
    out[0].dims[1] = dy->dims[1];
    out[0].dims[2] = x->dims[1];
    *n_out = 1;
    return GT_OK;
}

/* ---------------------------------------------------------------- expert parallel */

/* The n_blocks attribute (>= 1) and e, the experts per block, of an offsets length E + 1. */
static gt_status need_blocks(gt_graph *g, const gt_node *n, int64_t *blocks, gt_error *err)
{
    *blocks = n->attrs.ni > 0 ? n->attrs.i[0] : 0;
    if (*blocks < 1)
        return gt_shape_fail(g, n, err, GT_ERR_INVALID, "n_blocks must be >= 1, got %lld",
                             (long long)*blocks);
    return GT_OK;
}

/* (offsets: i32 [E + 1]) -> i32 [n_blocks, E / n_blocks + 1]. */
gt_status gt_shape_moe_block_offsets(gt_graph *g, const gt_node *n, gt_type *out, int *n_out,
                                     gt_error *err)
{
    int64_t blocks, len;
    GT_TRY(need_blocks(g, n, &blocks, err));
    GT_TRY(need_offsets(g, n, 0, err));
    const gt_type *off = gt_shape_in(g, n, 0);
    if (!dim_const(g, off->dims[0], &len) || len < 2 || (len - 1) % blocks != 0)
        return gt_shape_fail(g, n, err, GT_ERR_SHAPE,
                             "offsets must hold E + 1 entries with E a multiple of %lld",
                             (long long)blocks);
    out[0].dtype = GT_I32;
    out[0].ndim = 2;
    out[0].dims[0] = gt_sym_const(g->sym, blocks);
    out[0].dims[1] = gt_sym_const(g->sym, (len - 1) / blocks + 1);
    *n_out = 1;
    return GT_OK;
}

/* input 1: the block table, i32 [n_blocks * n_blocks, e + 1]. */
static gt_status need_table(gt_graph *g, const gt_node *n, int64_t blocks, gt_error *err)
{
    GT_TRY(need_i32(g, n, 1, "table", err));
    GT_TRY(gt_shape_need_rank(g, n, 1, 2, err));
    int64_t rows;
    const gt_type *t = gt_shape_in(g, n, 1);
    if (!dim_const(g, t->dims[0], &rows) || rows != blocks * blocks)
        return gt_shape_fail(g, n, err, GT_ERR_SHAPE, "table must have %lld rows",
                             (long long)(blocks * blocks));
    return GT_OK;
}

/* (x: [R, D], table) -> [n_blocks * capacity, D]; schema "i:n_blocks e:capacity,worst,rank". */
gt_status gt_shape_moe_pack(gt_graph *g, const gt_node *n, gt_type *out, int *n_out, gt_error *err)
{
    int64_t blocks;
    GT_TRY(need_blocks(g, n, &blocks, err));
    GT_TRY(gt_shape_need_rank(g, n, 0, 2, err));
    GT_TRY(need_table(g, n, blocks, err));
    if (n->attrs.ne < 3)
        return gt_shape_fail(g, n, err, GT_ERR_INVALID, "needs capacity, worst and rank");
    out[0] = *gt_shape_in(g, n, 0);
    out[0].dims[0] = gt_sym_mul(g->sym, gt_sym_const(g->sym, blocks), n->attrs.e[0]);
    *n_out = 1;
    return GT_OK;
}

/* (y: [n_blocks * C, D], table) -> [rows, D]; schema "i:n_blocks e:rows,rank". */
gt_status gt_shape_moe_unpack(gt_graph *g, const gt_node *n, gt_type *out, int *n_out,
                              gt_error *err)
{
    int64_t blocks, len;
    GT_TRY(need_blocks(g, n, &blocks, err));
    GT_TRY(gt_shape_need_rank(g, n, 0, 2, err));
    GT_TRY(need_table(g, n, blocks, err));
    if (n->attrs.ne < 2) return gt_shape_fail(g, n, err, GT_ERR_INVALID, "needs rows and rank");
    const gt_type *y = gt_shape_in(g, n, 0);
    if (dim_const(g, y->dims[0], &len) && len % blocks != 0)
        return gt_shape_fail(g, n, err, GT_ERR_SHAPE, "y rows (%lld) must split into %lld blocks",
                             (long long)len, (long long)blocks);
    out[0] = *y;
    out[0].dims[0] = n->attrs.e[0];
    *n_out = 1;
    return GT_OK;
}
