/* flops.c — FLOPs per node, summed over a graph (conventions in gt_flops.h). */
#include <string.h>

#include "graphtrain/gt_flops.h"

static gt_status eval_dims(const gt_graph *g, gt_value_id v, const gt_sym_binding *b,
                           int64_t *shape, int *ndim, gt_error *err)
{
    *ndim = g->values[v].type.ndim;
    return gt_graph_eval_shape(g, v, b, shape, err);
}

static double numel(const int64_t *shape, int ndim)
{
    double n = 1;
    for (int k = 0; k < ndim; k++)
        n *= (double)shape[k];
    return n;
}

gt_status gt_node_model_flops(const gt_graph *g, gt_node_id n, const gt_sym_binding *b,
                              double *flops, gt_error *err)
{
    const gt_node *node = &g->nodes[n];
    int64_t sa[GT_MAX_DIMS], sb[GT_MAX_DIMS], so[GT_MAX_DIMS];
    int na = 0, nb = 0, no = 0;
    *flops = 0;
    switch (node->op) {
    case GT_OP_MATMUL: {
        /* out = [..., M, N]; K is a's contracted dim */
        GT_TRY(eval_dims(g, node->out[0], b, so, &no, err));
        GT_TRY(eval_dims(g, node->in[0], b, sa, &na, err));
        int64_t k = node->attrs.i[0] ? sa[na - 2] : sa[na - 1];
        *flops = 2.0 * numel(so, no) * (double)k;
        return GT_OK;
    }
    case GT_OP_GROUPED_MATMUL:
    case GT_OP_GROUPED_MATMUL_DW: {
        /* x [R, Din], the other operand [R, Dout]: 2 R Dout Din, every row counted (rows past
         * offsets[E] are zeros the kernel writes, not arithmetic, but the model counts R) */
        GT_TRY(eval_dims(g, node->in[0], b, sa, &na, err));
        GT_TRY(eval_dims(g, node->op == GT_OP_GROUPED_MATMUL ? node->out[0] : node->in[1], b, sb,
                         &nb, err));
        *flops = 2.0 * (double)sa[0] * (double)sa[1] * (double)sb[1];
        return GT_OK;
    }
    case GT_OP_SDPA:
    case GT_OP_SDPA_BACKWARD: {
        /* q [b, hq, s, d], k [b, hkv, t, d] (layout 1: q [b, s, hq, d], k [b, t, hkv, d]);
         * b·hq·s·d is q's numel in both, t is k's sequence dim */
        GT_TRY(eval_dims(g, node->in[0], b, sa, &na, err));
        GT_TRY(eval_dims(g, node->in[1], b, sb, &nb, err));
        int seq = node->attrs.i[1] == 1 ? 1 : 2;
        double dense =
            (double)sa[0] * (double)sa[1] * (double)sa[2] * (double)sb[seq] * (double)sa[3];
        *flops = (node->op == GT_OP_SDPA ? 4.0 : 8.0) * dense;
        return GT_OK;
    }
    default:
        return GT_OK;
    }
}

gt_status gt_graph_count_flops(const gt_graph *g, const gt_sym_binding *b, gt_flops *out,
                               gt_error *err)
{
    memset(out, 0, sizeof *out);
    int64_t so[GT_MAX_DIMS];
    int no = 0;
    for (gt_node_id n = 0; n < g->n_nodes; n++) {
        const gt_node *node = &g->nodes[n];
        const gt_op_info *info = gt_op_get(node->op);
        double f = 0;
        double *kind = &out->other;
        if (node->n_out > 0) GT_TRY(eval_dims(g, node->out[0], b, so, &no, err));
        switch (node->op) {
        case GT_OP_MATMUL:
        case GT_OP_GROUPED_MATMUL:
        case GT_OP_GROUPED_MATMUL_DW:
            GT_TRY(gt_node_model_flops(g, n, b, &f, err));
            kind = &out->matmul;
            break;
        case GT_OP_SDPA:
        case GT_OP_SDPA_BACKWARD:
            GT_TRY(gt_node_model_flops(g, n, b, &f, err));
            kind = &out->attention;
            break;
        default:
            if (info->flags & GT_OPF_MOVES_BYTES) break; /* no arithmetic (gt_ops.def) */
            for (int k = 0; k < node->n_out; k++) {
                GT_TRY(eval_dims(g, node->out[k], b, so, &no, err));
                f += numel(so, no);
            }
        }
        *kind += f;
        out->by_phase[node->phase < 3 ? node->phase : 0] += f;
        out->total += f;
    }
    return GT_OK;
}
