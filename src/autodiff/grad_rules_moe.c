/* grad_rules_moe.c — gradient rules of DeepSeek-V3's mixture-of-experts ops. The routing ops
 * (sign, moe_topk, moe_sort, moe_count) are GT_OPF_NONDIFF: autodiff never makes their outputs
 * active, so their rule is the shared refusal and is never called. The rest are linear in their
 * float inputs, and each gradient is another op of the family. */
#include "autodiff/grad_rules.h"
#include "graphtrain/gt_build.h"

GT_GRAD_NONE(sign)
GT_GRAD_NONE(moe_topk)
GT_GRAD_NONE(moe_sort)
GT_GRAD_NONE(moe_count)

/* out[t, j] = x[t, idx[t, j]]: its adjoint scatters dy back to the picked columns (a row's ids are
 * distinct, so nothing is summed). */
gt_status gt_grad_gather_last(gt_graph *g, gt_node_id n, const gt_value_id *dout, gt_value_id *din,
                              gt_error *err)
{
    (void)err;
    gt_node nd = g->nodes[n];
    gt_expr n_cols = gt_value_type(g, nd.in[0])->dims[1];
    din[0] = gt_gather_last_backward(g, nd.in[1], dout[0], n_cols);
    return GT_OK; /* idx is an integer: no gradient */
}

/* The scatter's adjoint is the gather. */
gt_status gt_grad_gather_last_backward(gt_graph *g, gt_node_id n, const gt_value_id *dout,
                                       gt_value_id *din, gt_error *err)
{
    (void)err;
    gt_node nd = g->nodes[n];
    din[1] = gt_gather_last(g, dout[0], nd.in[0]);
    return GT_OK;
}

/* y[r] = x[r] w[e]^T (trans_b) or x[r] w[e], for the rows r of group e:
 *   trans_b: dx[r] = dy[r] w[e]     = grouped_matmul(dy, w, trans_b = 0)
 *            dw[e] = sum dy[r]^T x[r] = grouped_matmul_dw(x, dy)            [E, Dout, Din]
 *   else:    dx[r] = dy[r] w[e]^T   = grouped_matmul(dy, w, trans_b = 1)
 *            dw[e] = sum x[r]^T dy[r] = grouped_matmul_dw(dy, x)            [E, Din, Dout]
 * Rows past offsets[E] have y = 0, and get dx = 0 and add nothing to dw, as they should. */
gt_status gt_grad_grouped_matmul(gt_graph *g, gt_node_id n, const gt_value_id *dout,
                                 gt_value_id *din, gt_error *err)
{
    (void)err;
    gt_node nd = g->nodes[n];
    bool tb = nd.attrs.i[0] != 0;
    gt_value_id x = nd.in[0], w = nd.in[1], off = nd.in[2];
    din[0] = gt_grouped_matmul(g, dout[0], w, off, !tb);
    din[1] =
        tb ? gt_grouped_matmul_dw(g, x, dout[0], off) : gt_grouped_matmul_dw(g, dout[0], x, off);
    return GT_OK; /* offsets are integers: no gradient */
}

/* dw[e] = sum over group e of dy[r]^T x[r] is bilinear: with ddw its output gradient,
 *   dx[r]  = dy[r] ddw[e]    = grouped_matmul(dy, ddw, trans_b = 0)
 *   ddy[r] = x[r] ddw[e]^T   = grouped_matmul(x, ddw, trans_b = 1)
 * and zero for rows past offsets[E], which dw does not read. */
gt_status gt_grad_grouped_matmul_dw(gt_graph *g, gt_node_id n, const gt_value_id *dout,
                                    gt_value_id *din, gt_error *err)
{
    (void)err;
    gt_node nd = g->nodes[n];
    gt_value_id x = nd.in[0], dy = nd.in[1], off = nd.in[2];
    din[0] = gt_grouped_matmul(g, dy, dout[0], off, false);
    din[1] = gt_grouped_matmul(g, x, dout[0], off, true);
    return GT_OK;
}

/* Expert parallel's row moves. moe_block_offsets is NONDIFF. moe_pack and moe_unpack are
 * permutations of the rows a rank sends (the rest zeros), each the other's adjoint: the gradient
 * of a pack is the unpack of its gradient to x's rows, and the other way round. */
GT_GRAD_NONE(moe_block_offsets)

gt_status gt_grad_moe_pack(gt_graph *g, gt_node_id n, const gt_value_id *dout, gt_value_id *din,
                           gt_error *err)
{
    (void)err;
    gt_node nd = g->nodes[n];
    gt_expr rows = gt_value_type(g, nd.in[0])->dims[0];
    din[0] = gt_moe_unpack(g, dout[0], nd.in[1], (int)nd.attrs.i[0], rows, nd.attrs.e[2]);
    return GT_OK; /* the table is an integer: no gradient */
}

gt_status gt_grad_moe_unpack(gt_graph *g, gt_node_id n, const gt_value_id *dout, gt_value_id *din,
                             gt_error *err)
{
    (void)err;
    gt_node nd = g->nodes[n];
    int blocks = (int)nd.attrs.i[0];
    gt_expr cap =
        gt_sym_floordiv(g->sym, gt_value_type(g, nd.in[0])->dims[0], gt_sym_const(g->sym, blocks));
    din[0] = gt_moe_pack(g, dout[0], nd.in[1], blocks, cap, cap, nd.attrs.e[1]);
    return GT_OK;
}
