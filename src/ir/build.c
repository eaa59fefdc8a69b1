/* build.c — the typed builders of gt_build.h: each fills gt_attrs in its op's schema order
 * (gt_ops.def), turns negative dim indices into dim + rank, and appends one node. Errors land in
 * g->err; a GT_NONE input gives GT_NONE (gt_graph_add_node). */
#include <string.h>

#include "graphtrain/gt_build.h"
#include "ir/ir_internal.h"

static void build_fail(gt_graph *g, const char *op, const char *what)
{
    gt_error e = {0};
    const char *fqn = gt_graph_str(g, g->cur_fqn);
    gt_error_set(&e, GT_ERR_INVALID, "%s%s%s: %s", op, fqn[0] ? " at " : "", fqn, what);
    gt_graph_record_error(g, &e);
}

/* Rank of x, or -1 when x is not a value (the node append reports that). */
static int rank_of(const gt_graph *g, gt_value_id x)
{
    return x >= 0 && x < g->n_values ? g->values[x].type.ndim : -1;
}

/* -1 = last: dim + rank for a negative dim when the rank is known; the shape rule range-checks. */
static int64_t norm_dim(int dim, int rank)
{
    return dim < 0 && rank >= 0 ? dim + rank : dim;
}

static gt_value_id node1(gt_graph *g, gt_op op, gt_value_id a, const gt_attrs *at)
{
    return gt_graph_add_node(g, op, &a, 1, at, NULL);
}

static gt_value_id node2(gt_graph *g, gt_op op, gt_value_id a, gt_value_id b, const gt_attrs *at)
{
    gt_value_id in[2] = {a, b};
    return gt_graph_add_node(g, op, in, 2, at, NULL);
}

static gt_value_id node3(gt_graph *g, gt_op op, gt_value_id a, gt_value_id b, gt_value_id c,
                         const gt_attrs *at)
{
    gt_value_id in[3] = {a, b, c};
    return gt_graph_add_node(g, op, in, 3, at, NULL);
}

/* Shape lists go into the expression slots; more dims than a type holds is a caller error. */
static bool fill_shape(gt_graph *g, const char *op, gt_attrs *at, int ndim, const gt_expr *dims)
{
    if (ndim < 0 || ndim > GT_MAX_DIMS || (ndim > 0 && !dims)) {
        build_fail(g, op, "shape rank outside [0, 8] or no dims given");
        return false;
    }
    for (int k = 0; k < ndim; k++)
        at->e[at->ne++] = dims[k];
    return true;
}

gt_expr gt_c(gt_graph *g, int64_t c)
{
    return gt_sym_const(g->sym, c);
}

gt_value_id gt_full(gt_graph *g, gt_dtype dt, int ndim, const gt_expr *dims, double value)
{
    gt_attrs at = {.ni = 1, .nf = 1};
    at.i[0] = dt;
    at.f[0] = value;
    if (!fill_shape(g, "full", &at, ndim, dims)) return GT_NONE;
    return gt_graph_add_node(g, GT_OP_FULL, NULL, 0, &at, NULL);
}

gt_value_id gt_add(gt_graph *g, gt_value_id a, gt_value_id b)
{
    return node2(g, GT_OP_ADD, a, b, NULL);
}
gt_value_id gt_sub(gt_graph *g, gt_value_id a, gt_value_id b)
{
    return node2(g, GT_OP_SUB, a, b, NULL);
}
gt_value_id gt_mul(gt_graph *g, gt_value_id a, gt_value_id b)
{
    return node2(g, GT_OP_MUL, a, b, NULL);
}
gt_value_id gt_div(gt_graph *g, gt_value_id a, gt_value_id b)
{
    return node2(g, GT_OP_DIV, a, b, NULL);
}

gt_value_id gt_unary(gt_graph *g, gt_op op, gt_value_id x)
{
    switch (op) {
    case GT_OP_NEG:
    case GT_OP_EXP:
    case GT_OP_LOG:
    case GT_OP_SQRT:
    case GT_OP_RSQRT:
    case GT_OP_SILU:
    case GT_OP_SIGMOID:
        return node1(g, op, x, NULL);
    default:
        break;
    }
    const gt_op_info *info = gt_op_get(op);
    build_fail(g, info ? info->name : "unknown op",
               "gt_unary takes neg, exp, log, sqrt, rsqrt, silu or sigmoid");
    return GT_NONE;
}

gt_value_id gt_scale(gt_graph *g, gt_value_id x, double alpha)
{
    gt_attrs at = {.nf = 1};
    at.f[0] = alpha;
    return node1(g, GT_OP_SCALE, x, &at);
}

gt_value_id gt_add_scalar(gt_graph *g, gt_value_id x, double value)
{
    gt_attrs at = {.nf = 1};
    at.f[0] = value;
    return node1(g, GT_OP_ADD_SCALAR, x, &at);
}

gt_value_id gt_silu_backward(gt_graph *g, gt_value_id x, gt_value_id dy)
{
    return node2(g, GT_OP_SILU_BACKWARD, x, dy, NULL);
}

gt_value_id gt_cast(gt_graph *g, gt_value_id x, gt_dtype dt)
{
    gt_attrs at = {.ni = 1};
    at.i[0] = dt;
    return node1(g, GT_OP_CAST, x, &at);
}

/* Schema "i:keepdim,dims*". */
static bool fill_reduce(gt_graph *g, const char *op, gt_attrs *at, gt_value_id x, int ndims,
                        const int *dims, bool keepdim)
{
    if (ndims < 0 || ndims > GT_MAX_IATTR - 1 || (ndims > 0 && !dims)) {
        build_fail(g, op, "reduction dim count outside [0, 7] or no dims given");
        return false;
    }
    at->ni = 0;
    at->i[at->ni++] = keepdim ? 1 : 0;
    int rank = rank_of(g, x);
    for (int k = 0; k < ndims; k++)
        at->i[at->ni++] = norm_dim(dims[k], rank);
    return true;
}

gt_value_id gt_reduce(gt_graph *g, gt_op op, gt_value_id x, int ndims, const int *dims,
                      bool keepdim)
{
    if (op != GT_OP_SUM && op != GT_OP_MEAN && op != GT_OP_MAX && op != GT_OP_SUM_SQUARES) {
        const gt_op_info *info = gt_op_get(op);
        build_fail(g, info ? info->name : "unknown op",
                   "gt_reduce takes sum, mean, max or sum_squares");
        return GT_NONE;
    }
    gt_attrs at = {0};
    if (!fill_reduce(g, gt_op_get(op)->name, &at, x, ndims, dims, keepdim)) return GT_NONE;
    return node1(g, op, x, &at);
}

gt_value_id gt_max_backward(gt_graph *g, gt_value_id x, gt_value_id y, gt_value_id dy, int ndims,
                            const int *dims, bool keepdim)
{
    gt_attrs at = {0};
    if (!fill_reduce(g, "max_backward", &at, x, ndims, dims, keepdim)) return GT_NONE;
    return node3(g, GT_OP_MAX_BACKWARD, x, y, dy, &at);
}

gt_value_id gt_broadcast_to(gt_graph *g, gt_value_id x, int ndim, const gt_expr *dims)
{
    gt_attrs at = {0};
    if (!fill_shape(g, "broadcast_to", &at, ndim, dims)) return GT_NONE;
    return node1(g, GT_OP_BROADCAST_TO, x, &at);
}

gt_value_id gt_sum_to(gt_graph *g, gt_value_id x, int ndim, const gt_expr *dims)
{
    gt_attrs at = {0};
    if (!fill_shape(g, "sum_to", &at, ndim, dims)) return GT_NONE;
    return node1(g, GT_OP_SUM_TO, x, &at);
}

gt_value_id gt_reshape(gt_graph *g, gt_value_id x, int ndim, const gt_expr *dims)
{
    gt_attrs at = {0};
    if (!fill_shape(g, "reshape", &at, ndim, dims)) return GT_NONE;
    return node1(g, GT_OP_RESHAPE, x, &at);
}

gt_value_id gt_regroup(gt_graph *g, gt_value_id x, int ndim, const gt_expr *dims)
{
    gt_attrs at = {0};
    if (!fill_shape(g, "regroup", &at, ndim, dims)) return GT_NONE;
    return node1(g, GT_OP_REGROUP, x, &at);
}

gt_value_id gt_transpose(gt_graph *g, gt_value_id x, int dim0, int dim1)
{
    int rank = rank_of(g, x);
    gt_attrs at = {.ni = 2};
    at.i[0] = norm_dim(dim0, rank);
    at.i[1] = norm_dim(dim1, rank);
    return node1(g, GT_OP_TRANSPOSE, x, &at);
}

gt_value_id gt_permute(gt_graph *g, gt_value_id x, int ndim, const int *perm)
{
    if (ndim < 0 || ndim > GT_MAX_DIMS || (ndim > 0 && !perm)) {
        build_fail(g, "permute", "perm length outside [0, 8] or no perm given");
        return GT_NONE;
    }
    int rank = rank_of(g, x);
    gt_attrs at = {.ni = (uint8_t)ndim};
    for (int k = 0; k < ndim; k++)
        at.i[k] = norm_dim(perm[k], rank);
    return node1(g, GT_OP_PERMUTE, x, &at);
}

gt_value_id gt_slice(gt_graph *g, gt_value_id x, int dim, gt_expr start, gt_expr end)
{
    gt_attrs at = {.ni = 1, .ne = 2};
    at.i[0] = norm_dim(dim, rank_of(g, x));
    at.e[0] = start;
    at.e[1] = end;
    return node1(g, GT_OP_SLICE, x, &at);
}

gt_value_id gt_slice_backward(gt_graph *g, gt_value_id dy, int dim, gt_expr start, gt_expr end,
                              gt_expr size)
{
    gt_attrs at = {.ni = 1, .ne = 3};
    at.i[0] = norm_dim(dim, rank_of(g, dy));
    at.e[0] = start;
    at.e[1] = end;
    at.e[2] = size;
    return node1(g, GT_OP_SLICE_BACKWARD, dy, &at);
}

gt_value_id gt_concat(gt_graph *g, int n, const gt_value_id *xs, int dim)
{
    gt_attrs at = {.ni = 1};
    at.i[0] = norm_dim(dim, n > 0 && xs ? rank_of(g, xs[0]) : -1);
    if (n > 0 && !xs) {
        build_fail(g, "concat", "no inputs given");
        return GT_NONE;
    }
    return gt_graph_add_node(g, GT_OP_CONCAT, xs, n, &at, NULL);
}

gt_value_id gt_split(gt_graph *g, gt_value_id x, int dim, int n, const gt_expr *sizes,
                     gt_value_id *outs)
{
    if (outs)
        for (int k = 0; k < n && k < GT_MAX_OUT; k++)
            outs[k] = GT_NONE;
    if (n < 1 || n > GT_MAX_OUT || !sizes) {
        build_fail(g, "split", "needs 1..8 sizes");
        return GT_NONE;
    }
    gt_attrs at = {.ni = 1};
    at.i[0] = norm_dim(dim, rank_of(g, x));
    for (int k = 0; k < n; k++)
        at.e[at.ne++] = sizes[k];
    return gt_graph_add_node(g, GT_OP_SPLIT, &x, 1, &at, outs);
}

gt_value_id gt_matmul(gt_graph *g, gt_value_id a, gt_value_id b, bool trans_a, bool trans_b)
{
    gt_attrs at = {.ni = 2};
    at.i[0] = trans_a ? 1 : 0;
    at.i[1] = trans_b ? 1 : 0;
    return node2(g, GT_OP_MATMUL, a, b, &at);
}

gt_value_id gt_rms_norm(gt_graph *g, gt_value_id x, gt_value_id w, double eps)
{
    gt_attrs at = {.nf = 1};
    at.f[0] = eps;
    return node2(g, GT_OP_RMS_NORM, x, w, &at);
}

gt_value_id gt_rms_norm_backward(gt_graph *g, gt_value_id x, gt_value_id w, gt_value_id dy,
                                 double eps, gt_value_id *dw)
{
    gt_attrs at = {.nf = 1};
    at.f[0] = eps;
    gt_value_id in[3] = {x, w, dy}, outs[2];
    gt_value_id dx = gt_graph_add_node(g, GT_OP_RMS_NORM_BACKWARD, in, 3, &at, outs);
    if (dw) *dw = dx == GT_NONE ? GT_NONE : outs[1];
    return dx;
}

gt_value_id gt_rope(gt_graph *g, gt_value_id x, const gt_rope_params *p, bool inverse)
{
    return gt_rope_at(g, x, GT_NONE, p, inverse);
}

gt_value_id gt_rope_at(gt_graph *g, gt_value_id x, gt_value_id positions, const gt_rope_params *p,
                       bool inverse)
{
    if (!p) {
        build_fail(g, "rope", "no parameters given");
        return GT_NONE;
    }
    /* scaling and interleaved are optional slots, left out when 0: llama's nodes stay as they
     * were before the slots existed (the same attributes, printout and serialized bytes). */
    gt_attrs at = {.ni = p->interleaved ? 4 : p->scaling ? 3 : 2, .nf = 4};
    at.i[0] = inverse ? 1 : 0;
    at.i[1] = p->original_max_position;
    at.i[2] = p->scaling;
    at.i[3] = p->interleaved;
    at.f[0] = p->theta;
    at.f[1] = p->factor;
    at.f[2] = p->low_freq_factor;
    at.f[3] = p->high_freq_factor;
    if (positions == GT_NONE) return node1(g, GT_OP_ROPE, x, &at);
    gt_value_id in[2] = {x, positions};
    return gt_graph_add_node(g, GT_OP_ROPE, in, 2, &at, NULL);
}

gt_value_id gt_sdpa(gt_graph *g, gt_value_id q, gt_value_id k, gt_value_id v, bool causal,
                    double scale, gt_value_id *lse)
{
    return gt_sdpa_layout(g, q, k, v, causal, scale, 0, lse);
}

gt_value_id gt_sdpa_layout(gt_graph *g, gt_value_id q, gt_value_id k, gt_value_id v, bool causal,
                           double scale, int layout, gt_value_id *lse)
{
    return gt_sdpa_docs(g, q, k, v, GT_NONE, causal, scale, layout, lse);
}

gt_value_id gt_sdpa_docs(gt_graph *g, gt_value_id q, gt_value_id k, gt_value_id v,
                         gt_value_id positions, bool causal, double scale, int layout,
                         gt_value_id *lse)
{
    gt_attrs at = {.ni = 2, .nf = 1};
    at.i[0] = causal ? 1 : 0;
    at.i[1] = layout;
    at.f[0] = scale;
    gt_value_id in[4] = {q, k, v, positions}, outs[2];
    gt_value_id out = gt_graph_add_node(g, GT_OP_SDPA, in, positions == GT_NONE ? 3 : 4, &at, outs);
    if (lse) *lse = out == GT_NONE ? GT_NONE : outs[1];
    return out;
}

gt_value_id gt_sdpa_backward(gt_graph *g, gt_value_id q, gt_value_id k, gt_value_id v,
                             gt_value_id out, gt_value_id lse, gt_value_id dout, bool causal,
                             double scale, gt_value_id *dk, gt_value_id *dv)
{
    return gt_sdpa_backward_layout(g, q, k, v, out, lse, dout, causal, scale, 0, dk, dv);
}

gt_value_id gt_sdpa_backward_layout(gt_graph *g, gt_value_id q, gt_value_id k, gt_value_id v,
                                    gt_value_id out, gt_value_id lse, gt_value_id dout, bool causal,
                                    double scale, int layout, gt_value_id *dk, gt_value_id *dv)
{
    gt_value_id in[6] = {q, k, v, out, lse, dout};
    return gt_sdpa_backward_docs(g, in, GT_NONE, causal, scale, layout, dk, dv);
}

gt_value_id gt_sdpa_backward_docs(gt_graph *g, const gt_value_id qkv_out_lse_dout[6],
                                  gt_value_id positions, bool causal, double scale, int layout,
                                  gt_value_id *dk, gt_value_id *dv)
{
    gt_attrs at = {.ni = 2, .nf = 1};
    at.i[0] = causal ? 1 : 0;
    at.i[1] = layout;
    at.f[0] = scale;
    gt_value_id in[7], outs[3];
    memcpy(in, qkv_out_lse_dout, 6 * sizeof *in);
    in[6] = positions;
    gt_value_id dq =
        gt_graph_add_node(g, GT_OP_SDPA_BACKWARD, in, positions == GT_NONE ? 6 : 7, &at, outs);
    if (dk) *dk = dq == GT_NONE ? GT_NONE : outs[1];
    if (dv) *dv = dq == GT_NONE ? GT_NONE : outs[2];
    return dq;
}

gt_value_id gt_softmax(gt_graph *g, gt_value_id x, int dim)
{
    gt_attrs at = {.ni = 1};
    at.i[0] = norm_dim(dim, rank_of(g, x));
    return node1(g, GT_OP_SOFTMAX, x, &at);
}

gt_value_id gt_softmax_backward(gt_graph *g, gt_value_id y, gt_value_id dy, int dim)
{
    gt_attrs at = {.ni = 1};
    at.i[0] = norm_dim(dim, rank_of(g, y));
    return node2(g, GT_OP_SOFTMAX_BACKWARD, y, dy, &at);
}

gt_value_id gt_cross_entropy(gt_graph *g, gt_value_id logits, gt_value_id targets,
                             int64_t ignore_index)
{
    gt_attrs at = {.ni = 1};
    at.i[0] = ignore_index;
    return node2(g, GT_OP_CROSS_ENTROPY, logits, targets, &at);
}

gt_value_id gt_cross_entropy_backward(gt_graph *g, gt_value_id logits, gt_value_id targets,
                                      gt_value_id dloss, int64_t ignore_index)
{
    gt_attrs at = {.ni = 1};
    at.i[0] = ignore_index;
    return node3(g, GT_OP_CROSS_ENTROPY_BACKWARD, logits, targets, dloss, &at);
}

gt_value_id gt_embedding(gt_graph *g, gt_value_id w, gt_value_id ids)
{
    return node2(g, GT_OP_EMBEDDING, w, ids, NULL);
}

gt_value_id gt_embedding_backward(gt_graph *g, gt_value_id ids, gt_value_id dy,
                                  gt_expr num_embeddings)
{
    gt_attrs at = {.ne = 1};
    at.e[0] = num_embeddings;
    return node2(g, GT_OP_EMBEDDING_BACKWARD, ids, dy, &at);
}

gt_value_id gt_clamp(gt_graph *g, gt_value_id x, double min, double max)
{
    gt_attrs at = {.nf = 2};
    at.f[0] = min;
    at.f[1] = max;
    return node1(g, GT_OP_CLAMP, x, &at);
}

/* Schema "f:beta1,beta2,eps,weight_decay"; outputs (p', m', v'). */
gt_value_id gt_adamw(gt_graph *g, gt_value_id p, gt_value_id grad, gt_value_id m, gt_value_id v,
                     gt_value_id scalars, gt_value_id clip, double beta1, double beta2, double eps,
                     double weight_decay, gt_value_id *m_out, gt_value_id *v_out)
{
    gt_attrs at = {.nf = 4};
    at.f[0] = beta1;
    at.f[1] = beta2;
    at.f[2] = eps;
    at.f[3] = weight_decay;
    gt_value_id in[6] = {p, grad, m, v, scalars, clip};
    gt_value_id outs[3] = {GT_NONE, GT_NONE, GT_NONE};
    gt_value_id r = gt_graph_add_node(g, GT_OP_ADAMW, in, 6, &at, outs);
    if (m_out) *m_out = r == GT_NONE ? GT_NONE : outs[1];
    if (v_out) *v_out = r == GT_NONE ? GT_NONE : outs[2];
    return r;
}
