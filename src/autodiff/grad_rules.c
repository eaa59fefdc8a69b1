/* grad_rules.c — gradient rules of the elementwise, reduction and layout ops.
 *
 * Each rule appends the nodes of the vector-Jacobian product dL/dx = (dy/dx)^T dL/dy for one
 * forward node, composed from gt_build.h helpers. Notation: x, a, b are the node's inputs, y its
 * output, dy the incoming gradient (dout[0]). The fused ops of the model (matmul, norms, attention,
 * losses) are in grad_rules_nn.c. The forward node is copied before anything is appended, because
 * an append may move g->nodes. */
#include <string.h>

#include "autodiff/grad_rules.h"
#include "graphtrain/gt_build.h"

/* ---------------------------------------------------------------- helpers */

bool gt_grad_same_dims(const gt_type *a, const gt_type *b)
{
    if (a->ndim != b->ndim) return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->dims[i] != b->dims[i]) return false;
    return true;
}

bool gt_grad_same_type(const gt_type *a, const gt_type *b)
{
    return a->dtype == b->dtype && gt_grad_same_dims(a, b);
}

gt_value_id gt_grad_reduce_to(gt_graph *g, gt_value_id dy, gt_value_id x)
{
    if (dy == GT_NONE) return GT_NONE;
    /* Copies: the append below may move g->values. */
    gt_type ty = *gt_value_type(g, dy), tx = *gt_value_type(g, x);
    if (gt_grad_same_dims(&ty, &tx)) return dy;
    return gt_sum_to(g, dy, tx.ndim, tx.dims);
}

gt_status gt_grad_unsupported(gt_graph *g, gt_node_id n, gt_error *err)
{
    return gt_error_set(err, GT_ERR_UNSUPPORTED, "op %s has no gradient rule",
                        gt_op_get(g->nodes[n].op)->name);
}

/* ---------------------------------------------------------------- sources and elementwise */

gt_status gt_grad_full(gt_graph *g, gt_node_id n, const gt_value_id *dout, gt_value_id *din,
                       gt_error *err)
{
    /* A constant: no inputs, nothing to differentiate. */
    (void)g, (void)n, (void)dout, (void)din, (void)err;
    return GT_OK;
}

/* add/sub/mul/div broadcast their inputs (numpy rules), so each input's gradient is the
 * elementwise gradient summed over the dims that input was broadcast along (sum_to). */
gt_status gt_grad_add(gt_graph *g, gt_node_id n, const gt_value_id *dout, gt_value_id *din,
                      gt_error *err)
{
    (void)err;
    gt_node nd = g->nodes[n];
    din[0] = gt_grad_reduce_to(g, dout[0], nd.in[0]);
    din[1] = gt_grad_reduce_to(g, dout[0], nd.in[1]);
    return GT_OK;
}

gt_status gt_grad_sub(gt_graph *g, gt_node_id n, const gt_value_id *dout, gt_value_id *din,
                      gt_error *err)
{
    (void)err;
    gt_node nd = g->nodes[n];
    din[0] = gt_grad_reduce_to(g, dout[0], nd.in[0]);
    /* d(a - b)/db = -1; negate after the reduction (exact either way, fewer elements after). */
    din[1] = gt_unary(g, GT_OP_NEG, gt_grad_reduce_to(g, dout[0], nd.in[1]));
    return GT_OK;
}

gt_status gt_grad_mul(gt_graph *g, gt_node_id n, const gt_value_id *dout, gt_value_id *din,
                      gt_error *err)
{
    (void)err;
    gt_node nd = g->nodes[n];
    gt_value_id a = nd.in[0], b = nd.in[1], dy = dout[0];
    din[0] = gt_grad_reduce_to(g, gt_mul(g, dy, b), a); /* d(ab)/da = b */
    din[1] = gt_grad_reduce_to(g, gt_mul(g, dy, a), b); /* d(ab)/db = a */
    return GT_OK;
}

gt_status gt_grad_div(gt_graph *g, gt_node_id n, const gt_value_id *dout, gt_value_id *din,
                      gt_error *err)
{
    (void)err;
    gt_node nd = g->nodes[n];
    gt_value_id a = nd.in[0], b = nd.in[1], y = nd.out[0];
    /* y = a/b: dy/da = 1/b; dy/db = -a/b^2 = -(1/b) * y, so both share q = dy/b. */
    gt_value_id q = gt_div(g, dout[0], b);
    din[0] = gt_grad_reduce_to(g, q, a);
    din[1] = gt_unary(g, GT_OP_NEG, gt_grad_reduce_to(g, gt_mul(g, q, y), b));
    return GT_OK;
}

gt_status gt_grad_neg(gt_graph *g, gt_node_id n, const gt_value_id *dout, gt_value_id *din,
                      gt_error *err)
{
    (void)n, (void)err;
    din[0] = gt_unary(g, GT_OP_NEG, dout[0]);
    return GT_OK;
}

gt_status gt_grad_exp(gt_graph *g, gt_node_id n, const gt_value_id *dout, gt_value_id *din,
                      gt_error *err)
{
    (void)err;
    gt_node nd = g->nodes[n];
    din[0] = gt_mul(g, nd.out[0], dout[0]); /* d exp(x) = exp(x) = y */
    return GT_OK;
}

gt_status gt_grad_log(gt_graph *g, gt_node_id n, const gt_value_id *dout, gt_value_id *din,
                      gt_error *err)
{
    (void)err;
    gt_node nd = g->nodes[n];
    din[0] = gt_div(g, dout[0], nd.in[0]); /* d log(x) = 1/x */
    return GT_OK;
}

gt_status gt_grad_sqrt(gt_graph *g, gt_node_id n, const gt_value_id *dout, gt_value_id *din,
                       gt_error *err)
{
    (void)err;
    gt_node nd = g->nodes[n];
    din[0] = gt_scale(g, gt_div(g, dout[0], nd.out[0]), 0.5); /* d sqrt(x) = 0.5 / y */
    return GT_OK;
}

gt_status gt_grad_rsqrt(gt_graph *g, gt_node_id n, const gt_value_id *dout, gt_value_id *din,
                        gt_error *err)
{
    (void)err;
    gt_node nd = g->nodes[n];
    gt_value_id y = nd.out[0];
    /* y = x^(-1/2): dy/dx = -1/2 x^(-3/2) = -0.5 y^3 */
    gt_value_id y3 = gt_mul(g, gt_mul(g, y, y), y);
    din[0] = gt_scale(g, gt_mul(g, dout[0], y3), -0.5);
    return GT_OK;
}

gt_status gt_grad_silu(gt_graph *g, gt_node_id n, const gt_value_id *dout, gt_value_id *din,
                       gt_error *err)
{
    (void)err;
    gt_node nd = g->nodes[n];
    din[0] = gt_silu_backward(g, nd.in[0], dout[0]);
    return GT_OK;
}

gt_status gt_grad_sigmoid(gt_graph *g, gt_node_id n, const gt_value_id *dout, gt_value_id *din,
                          gt_error *err)
{
    (void)err;
    gt_node nd = g->nodes[n];
    gt_value_id y = nd.out[0];
    gt_value_id one_minus_y = gt_add_scalar(g, gt_unary(g, GT_OP_NEG, y), 1.0);
    din[0] = gt_mul(g, gt_mul(g, dout[0], y), one_minus_y); /* dy * y * (1 - y) */
    return GT_OK;
}

gt_status gt_grad_scale(gt_graph *g, gt_node_id n, const gt_value_id *dout, gt_value_id *din,
                        gt_error *err)
{
    (void)err;
    gt_node nd = g->nodes[n];
    din[0] = gt_scale(g, dout[0], nd.attrs.f[0]);
    return GT_OK;
}

gt_status gt_grad_add_scalar(gt_graph *g, gt_node_id n, const gt_value_id *dout, gt_value_id *din,
                             gt_error *err)
{
    (void)g, (void)n, (void)err;
    din[0] = dout[0]; /* identity: values are immutable, so the same id serves both */
    return GT_OK;
}

GT_GRAD_NONE(silu_backward)

gt_status gt_grad_cast(gt_graph *g, gt_node_id n, const gt_value_id *dout, gt_value_id *din,
                       gt_error *err)
{
    (void)err;
    gt_node nd = g->nodes[n];
    gt_dtype in_dt = gt_value_type(g, nd.in[0])->dtype;
    /* An integer source gets no gradient; a float one gets dy rounded back to its dtype. */
    if (gt_dtype_is_float(in_dt)) din[0] = gt_cast(g, dout[0], in_dt);
    return GT_OK;
}

/* ---------------------------------------------------------------- reductions */

/* dy of a reduction over dims (attrs.i[1..ni)) spread back over x's shape: with keepdim = 0 the
 * reduced dims are put back as size 1 (reshape), then broadcast_to x's dims. */
static gt_value_id expand_reduced(gt_graph *g, gt_value_id dy, const gt_node *nd)
{
    gt_type tx = *gt_value_type(g, nd->in[0]);
    gt_type ty = *gt_value_type(g, dy);
    bool keepdim = nd->attrs.i[0] != 0;
    if (!keepdim) {
        gt_expr kept[GT_MAX_DIMS];
        for (int j = 0; j < tx.ndim; j++)
            kept[j] = tx.dims[j];
        for (int k = 1; k < nd->attrs.ni; k++)
            kept[nd->attrs.i[k]] = gt_c(g, 1);
        gt_type tk = ty;
        tk.ndim = tx.ndim;
        memcpy(tk.dims, kept, sizeof kept);
        if (!gt_grad_same_dims(&ty, &tk)) dy = gt_reshape(g, dy, tx.ndim, kept);
        ty = tk;
    }
    if (gt_grad_same_dims(&ty, &tx)) return dy;
    return gt_broadcast_to(g, dy, tx.ndim, tx.dims);
}

gt_status gt_grad_sum(gt_graph *g, gt_node_id n, const gt_value_id *dout, gt_value_id *din,
                      gt_error *err)
{
    (void)err;
    gt_node nd = g->nodes[n];
    din[0] = expand_reduced(g, dout[0], &nd);
    return GT_OK;
}

/* d/dx sum(x^2) = 2 x dy, in f32 (the op's arithmetic), cast back to x's dtype. */
gt_status gt_grad_sum_squares(gt_graph *g, gt_node_id n, const gt_value_id *dout, gt_value_id *din,
                              gt_error *err)
{
    (void)err;
    gt_node nd = g->nodes[n];
    gt_dtype dt = gt_value_type(g, nd.in[0])->dtype;
    gt_value_id x = dt == GT_F32 ? nd.in[0] : gt_cast(g, nd.in[0], GT_F32);
    gt_value_id dx = gt_mul(g, gt_scale(g, x, 2.0), expand_reduced(g, dout[0], &nd));
    din[0] = dt == GT_F32 ? dx : gt_cast(g, dx, dt);
    return GT_OK;
}

gt_status gt_grad_mean(gt_graph *g, gt_node_id n, const gt_value_id *dout, gt_value_id *din,
                       gt_error *err)
{
    gt_node nd = g->nodes[n];
    const gt_type *tx = gt_value_type(g, nd.in[0]);
    /* mean = sum / count, count = product of the reduced dims. It must be a constant: a symbolic
     * count would need a runtime scalar, which the op set does not have. */
    gt_expr count = gt_c(g, 1);
    for (int k = 1; k < nd.attrs.ni; k++)
        count = gt_sym_mul(g->sym, count, tx->dims[nd.attrs.i[k]]);
    int64_t c;
    if (!gt_sym_is_const(g->sym, count, &c)) {
        char buf[128];
        gt_sym_format(g->sym, count, buf, sizeof buf);
        return gt_error_set(err, GT_ERR_UNSUPPORTED,
                            "gradient of mean over a symbolic count (%s) is not supported", buf);
    }
    /* Scale first: dy has the reduced (smaller) shape. An empty reduction has no elements to
     * receive a gradient, so its scale does not matter. */
    gt_value_id scaled = gt_scale(g, dout[0], c > 0 ? 1.0 / (double)c : 0.0);
    din[0] = expand_reduced(g, scaled, &nd);
    return GT_OK;
}

gt_status gt_grad_max(gt_graph *g, gt_node_id n, const gt_value_id *dout, gt_value_id *din,
                      gt_error *err)
{
    (void)err;
    gt_node nd = g->nodes[n];
    int dims[GT_MAX_IATTR];
    int nd_dims = nd.attrs.ni - 1;
    for (int k = 0; k < nd_dims; k++)
        dims[k] = (int)nd.attrs.i[k + 1];
    /* The gradient goes to the first (row-major) maximum of each group, as the kernel picks it. */
    din[0] = gt_max_backward(g, nd.in[0], nd.out[0], dout[0], nd_dims, dims, nd.attrs.i[0] != 0);
    return GT_OK;
}

GT_GRAD_NONE(max_backward)

/* ---------------------------------------------------------------- layout */

gt_status gt_grad_broadcast_to(gt_graph *g, gt_node_id n, const gt_value_id *dout, gt_value_id *din,
                               gt_error *err)
{
    (void)err;
    gt_node nd = g->nodes[n];
    din[0] = gt_grad_reduce_to(g, dout[0], nd.in[0]);
    return GT_OK;
}

gt_status gt_grad_sum_to(gt_graph *g, gt_node_id n, const gt_value_id *dout, gt_value_id *din,
                         gt_error *err)
{
    (void)err;
    gt_node nd = g->nodes[n];
    gt_type tx = *gt_value_type(g, nd.in[0]);
    const gt_type *ty = gt_value_type(g, dout[0]);
    din[0] = gt_grad_same_dims(ty, &tx) ? dout[0] : gt_broadcast_to(g, dout[0], tx.ndim, tx.dims);
    return GT_OK;
}

gt_status gt_grad_reshape(gt_graph *g, gt_node_id n, const gt_value_id *dout, gt_value_id *din,
                          gt_error *err)
{
    (void)err;
    gt_node nd = g->nodes[n];
    gt_type tx = *gt_value_type(g, nd.in[0]);
    const gt_type *ty = gt_value_type(g, dout[0]);
    din[0] = gt_grad_same_dims(ty, &tx) ? dout[0] : gt_reshape(g, dout[0], tx.ndim, tx.dims);
    return GT_OK;
}

gt_status gt_grad_regroup(gt_graph *g, gt_node_id n, const gt_value_id *dout, gt_value_id *din,
                          gt_error *err)
{
    (void)err;
    gt_node nd = g->nodes[n];
    gt_type tx = *gt_value_type(g, nd.in[0]);
    const gt_type *ty = gt_value_type(g, dout[0]);
    din[0] = gt_grad_same_dims(ty, &tx) ? dout[0] : gt_regroup(g, dout[0], tx.ndim, tx.dims);
    return GT_OK;
}

gt_status gt_grad_transpose(gt_graph *g, gt_node_id n, const gt_value_id *dout, gt_value_id *din,
                            gt_error *err)
{
    (void)err;
    gt_node nd = g->nodes[n];
    din[0] = gt_transpose(g, dout[0], (int)nd.attrs.i[0], (int)nd.attrs.i[1]); /* self-inverse */
    return GT_OK;
}

gt_status gt_grad_permute(gt_graph *g, gt_node_id n, const gt_value_id *dout, gt_value_id *din,
                          gt_error *err)
{
    (void)err;
    gt_node nd = g->nodes[n];
    /* y.shape[k] = x.shape[perm[k]], so x is y permuted by the inverse: inv[perm[k]] = k. */
    int inv[GT_MAX_IATTR];
    for (int k = 0; k < nd.attrs.ni; k++)
        inv[nd.attrs.i[k]] = k;
    din[0] = gt_permute(g, dout[0], nd.attrs.ni, inv);
    return GT_OK;
}

gt_status gt_grad_slice(gt_graph *g, gt_node_id n, const gt_value_id *dout, gt_value_id *din,
                        gt_error *err)
{
    (void)err;
    gt_node nd = g->nodes[n];
    int dim = (int)nd.attrs.i[0];
    gt_expr size = gt_value_type(g, nd.in[0])->dims[dim];
    din[0] = gt_slice_backward(g, dout[0], dim, nd.attrs.e[0], nd.attrs.e[1], size);
    return GT_OK;
}

gt_status gt_grad_slice_backward(gt_graph *g, gt_node_id n, const gt_value_id *dout,
                                 gt_value_id *din, gt_error *err)
{
    (void)err;
    gt_node nd = g->nodes[n];
    /* slice_backward pads with zeros; its adjoint takes the window back out. */
    din[0] = gt_slice(g, dout[0], (int)nd.attrs.i[0], nd.attrs.e[0], nd.attrs.e[1]);
    return GT_OK;
}

gt_status gt_grad_concat(gt_graph *g, gt_node_id n, const gt_value_id *dout, gt_value_id *din,
                         gt_error *err)
{
    (void)err;
    gt_node nd = g->nodes[n];
    int dim = (int)nd.attrs.i[0];
    /* One split node hands every input its window of dy. */
    gt_expr sizes[GT_MAX_IN] = {0};
    for (int k = 0; k < nd.n_in; k++)
        sizes[k] = gt_value_type(g, nd.in[k])->dims[dim];
    gt_value_id pieces[GT_MAX_OUT];
    if (nd.n_in == 1) {
        din[0] = dout[0];
        return GT_OK;
    }
    if (gt_split(g, dout[0], dim, nd.n_in, sizes, pieces) == GT_NONE) return GT_OK;
    for (int k = 0; k < nd.n_in; k++)
        if (gt_dtype_is_float(gt_value_type(g, nd.in[k])->dtype)) din[k] = pieces[k];
    return GT_OK;
}

gt_status gt_grad_split(gt_graph *g, gt_node_id n, const gt_value_id *dout, gt_value_id *din,
                        gt_error *err)
{
    (void)err;
    gt_node nd = g->nodes[n];
    /* Pieces no gradient reaches contribute zeros to their window of dx. */
    gt_value_id pieces[GT_MAX_IN];
    for (int k = 0; k < nd.n_out; k++) {
        if (dout[k] != GT_NONE) {
            pieces[k] = dout[k];
        } else {
            gt_type t = *gt_value_type(g, nd.out[k]);
            pieces[k] = gt_full(g, t.dtype, t.ndim, t.dims, 0.0);
        }
    }
    din[0] = nd.n_out == 1 ? pieces[0] : gt_concat(g, nd.n_out, pieces, (int)nd.attrs.i[0]);
    return GT_OK;
}
