/* build_moe.c — the builders of DeepSeek-V3's mixture-of-experts ops (gt_build.h): each fills its
 * op's attribute schema (gt_ops.def) and appends one node; errors land in g->err. */
#include "graphtrain/gt_build.h"
#include "ir/ir_internal.h"

gt_value_id gt_sign(gt_graph *g, gt_value_id x)
{
    return gt_graph_add_node(g, GT_OP_SIGN, &x, 1, NULL, NULL);
}

/* Schema "i:k,n_groups,n_limited". */
gt_value_id gt_moe_topk(gt_graph *g, gt_value_id scores, int k, int n_groups, int n_limited)
{
    gt_attrs at = {.ni = 3};
    at.i[0] = k;
    at.i[1] = n_groups;
    at.i[2] = n_limited;
    return gt_graph_add_node(g, GT_OP_MOE_TOPK, &scores, 1, &at, NULL);
}

gt_value_id gt_gather_last(gt_graph *g, gt_value_id x, gt_value_id idx)
{
    gt_value_id in[2] = {x, idx};
    return gt_graph_add_node(g, GT_OP_GATHER_LAST, in, 2, NULL, NULL);
}

/* Schema "e:n_cols". */
gt_value_id gt_gather_last_backward(gt_graph *g, gt_value_id idx, gt_value_id dy, gt_expr n_cols)
{
    gt_attrs at = {.ne = 1};
    at.e[0] = n_cols;
    gt_value_id in[2] = {idx, dy};
    return gt_graph_add_node(g, GT_OP_GATHER_LAST_BACKWARD, in, 2, &at, NULL);
}

/* Schema "i:n_experts"; outputs (order, token, offsets). */
gt_value_id gt_moe_sort(gt_graph *g, gt_value_id idx, int n_experts, gt_value_id *token,
                        gt_value_id *offsets)
{
    gt_attrs at = {.ni = 1};
    at.i[0] = n_experts;
    gt_value_id outs[3] = {GT_NONE, GT_NONE, GT_NONE};
    gt_value_id order = gt_graph_add_node(g, GT_OP_MOE_SORT, &idx, 1, &at, outs);
    if (token) *token = order == GT_NONE ? GT_NONE : outs[1];
    if (offsets) *offsets = order == GT_NONE ? GT_NONE : outs[2];
    return order;
}

/* Schema "i:n_experts". */
gt_value_id gt_moe_count(gt_graph *g, gt_value_id idx, int n_experts)
{
    gt_attrs at = {.ni = 1};
    at.i[0] = n_experts;
    return gt_graph_add_node(g, GT_OP_MOE_COUNT, &idx, 1, &at, NULL);
}

/* Schema "i:trans_b". */
gt_value_id gt_grouped_matmul(gt_graph *g, gt_value_id x, gt_value_id w, gt_value_id offsets,
                              bool trans_b)
{
    gt_attrs at = {.ni = 1};
    at.i[0] = trans_b ? 1 : 0;
    gt_value_id in[3] = {x, w, offsets};
    return gt_graph_add_node(g, GT_OP_GROUPED_MATMUL, in, 3, &at, NULL);
}

gt_value_id gt_grouped_matmul_dw(gt_graph *g, gt_value_id x, gt_value_id dy, gt_value_id offsets)
{
    gt_value_id in[3] = {x, dy, offsets};
    return gt_graph_add_node(g, GT_OP_GROUPED_MATMUL_DW, in, 3, NULL, NULL);
}

/* Schema "i:n_blocks". */
gt_value_id gt_moe_block_offsets(gt_graph *g, gt_value_id offsets, int n_blocks)
{
    gt_attrs at = {.ni = 1};
    at.i[0] = n_blocks;
    return gt_graph_add_node(g, GT_OP_MOE_BLOCK_OFFSETS, &offsets, 1, &at, NULL);
}

/* Schema "i:n_blocks e:capacity,worst,rank". */
gt_value_id gt_moe_pack(gt_graph *g, gt_value_id x, gt_value_id table, int n_blocks,
                        gt_expr capacity, gt_expr worst, gt_expr rank)
{
    gt_attrs at = {.ni = 1, .ne = 3};
    at.i[0] = n_blocks;
    at.e[0] = capacity;
    at.e[1] = worst;
    at.e[2] = rank;
    gt_value_id in[2] = {x, table};
    return gt_graph_add_node(g, GT_OP_MOE_PACK, in, 2, &at, NULL);
}

/* Schema "i:n_blocks e:rows,rank". */
gt_value_id gt_moe_unpack(gt_graph *g, gt_value_id y, gt_value_id table, int n_blocks, gt_expr rows,
                          gt_expr rank)
{
    gt_attrs at = {.ni = 1, .ne = 2};
    at.i[0] = n_blocks;
    at.e[0] = rows;
    at.e[1] = rank;
    gt_value_id in[2] = {y, table};
    return gt_graph_add_node(g, GT_OP_MOE_UNPACK, in, 2, &at, NULL);
}
