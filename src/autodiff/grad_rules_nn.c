/* grad_rules_nn.c — gradient rules of the model-level ops: matmul, rms_norm, rope, sdpa, softmax,
 * cross_entropy, embedding; and the refusals of the fused backward ops.
 *
 * The fused ops differentiate through their dedicated backward op (rms_norm_backward,
 * sdpa_backward, ...) rather than a composition, which is both cheaper and what the kernels are
 * tuned for. Integer inputs (ids, targets) get no gradient. */
#include "autodiff/grad_rules.h"
#include "graphtrain/gt_build.h"

/* ---------------------------------------------------------------- matmul */

/* C = op(A) op(B), op = transpose of the last two dims when the flag is set. With
 * d op(A) = dC op(B)^T and d op(B) = op(A)^T dC, each transpose combination folds into one matmul:
 *   ta tb | dA                 | dB
 *   0  0  | dC B^T  (dc,b,0,1) | A^T dC  (a,dc,1,0)
 *   0  1  | dC B    (dc,b,0,0) | dC^T A  (dc,a,1,0)
 *   1  0  | B dC^T  (b,dc,0,1) | A dC    (a,dc,0,0)
 *   1  1  | B^T dC^T(b,dc,1,1) | dC^T A^T(dc,a,1,1)
 * The same formulas hold batched (equal ranks, equal batch dims). When b has rank 2 and a more,
 * B is shared by every leading index of a, so dB sums over them: flatten op(A) to [M, k] and dC to
 * [M, n] (M = product of a's leading dims times m) and use the 2-D formula once; dA comes from a
 * broadcast matmul dC op(B)^T (transposed back when ta). */
gt_status gt_grad_matmul(gt_graph *g, gt_node_id n, const gt_value_id *dout, gt_value_id *din,
                         gt_error *err)
{
    (void)err;
    gt_node nd = g->nodes[n];
    gt_value_id a = nd.in[0], b = nd.in[1], dc = dout[0];
    bool ta = nd.attrs.i[0] != 0, tb = nd.attrs.i[1] != 0;
    gt_type type_a = *gt_value_type(g, a), type_b = *gt_value_type(g, b);
    gt_type type_c = *gt_value_type(g, nd.out[0]);

    if (type_a.ndim == type_b.ndim) {
        if (!ta && !tb) {
            din[0] = gt_matmul(g, dc, b, false, true);
            din[1] = gt_matmul(g, a, dc, true, false);
        } else if (!ta && tb) {
            din[0] = gt_matmul(g, dc, b, false, false);
            din[1] = gt_matmul(g, dc, a, true, false);
        } else if (ta && !tb) {
            din[0] = gt_matmul(g, b, dc, false, true);
            din[1] = gt_matmul(g, a, dc, false, false);
        } else {
            din[0] = gt_matmul(g, b, dc, true, true);
            din[1] = gt_matmul(g, dc, a, true, true);
        }
        return GT_OK;
    }

    /* b rank 2 broadcast over a's leading dims. */
    int r = type_a.ndim;
    gt_value_id d_op_a = gt_matmul(g, dc, b, false, !tb); /* dC op(B)^T: [..., m, k] */
    din[0] = ta ? gt_transpose(g, d_op_a, r - 2, r - 1) : d_op_a;

    gt_value_id op_a = ta ? gt_transpose(g, a, r - 2, r - 1) : a; /* [..., m, k] */
    gt_expr k_dim = ta ? type_a.dims[r - 2] : type_a.dims[r - 1];
    gt_expr rows = gt_c(g, 1);
    for (int j = 0; j < r - 1; j++)
        rows = gt_sym_mul(g->sym, rows, ta && j == r - 2 ? type_a.dims[r - 1] : type_a.dims[j]);
    gt_expr a2_dims[2] = {rows, k_dim};
    gt_expr dc2_dims[2] = {rows, type_c.dims[type_c.ndim - 1]};
    gt_value_id a2 = gt_reshape(g, op_a, 2, a2_dims);
    gt_value_id dc2 = gt_reshape(g, dc, 2, dc2_dims);
    /* d op(B) = A2^T dC2 : [k, n]; with tb, dB = (A2^T dC2)^T = dC2^T A2 : [n, k]. */
    din[1] = tb ? gt_matmul(g, dc2, a2, true, false) : gt_matmul(g, a2, dc2, true, false);
    return GT_OK;
}

/* ---------------------------------------------------------------- norms and rope */

gt_status gt_grad_rms_norm(gt_graph *g, gt_node_id n, const gt_value_id *dout, gt_value_id *din,
                           gt_error *err)
{
    (void)err;
    gt_node nd = g->nodes[n];
    din[0] = gt_rms_norm_backward(g, nd.in[0], nd.in[1], dout[0], nd.attrs.f[0], &din[1]);
    return GT_OK;
}

GT_GRAD_NONE(rms_norm_backward)

gt_status gt_grad_rope(gt_graph *g, gt_node_id n, const gt_value_id *dout, gt_value_id *din,
                       gt_error *err)
{
    (void)err;
    gt_node nd = g->nodes[n];
    /* rope rotates each pair ((j, j + d/2), or (2j, 2j + 1) interleaved) by an angle: an orthogonal
     * map whose transpose is the rotation by the negative angle, i.e. the same op with inverse
     * flipped. */
    gt_rope_params p = {
        .theta = nd.attrs.f[0],
        .factor = nd.attrs.f[1],
        .low_freq_factor = nd.attrs.f[2],
        .high_freq_factor = nd.attrs.f[3],
        .original_max_position = nd.attrs.i[1],
        .scaling = nd.attrs.ni > 2 ? (int)nd.attrs.i[2] : 0,
        .interleaved = nd.attrs.ni > 3 ? (int)nd.attrs.i[3] : 0,
    };
    din[0] = gt_rope_at(g, dout[0], nd.n_in > 1 ? nd.in[1] : GT_NONE, &p, nd.attrs.i[0] == 0);
    return GT_OK; /* positions are integers: no gradient */
}

/* ---------------------------------------------------------------- attention */

/* sdpa has two outputs: out = P V and lse_i = log sum_j exp(s_ij), s = scale * q k^T (masked).
 * sdpa_backward only takes dout; it recomputes P = exp(s - lse) and forms
 *   dS = P o (dP - D),  dP = dO V^T,  D_i = sum_d dO_id out_id.
 * A gradient dlse adds dlse_i * d lse_i / d s_ij = dlse_i * P_ij to dS, i.e. it replaces D_i by
 * D_i - dlse_i. We get exactly that from the same kernel by widening the value dim by one column:
 * v' = [v, 0], out' = [out, -dlse], dO' = [dO, 1]. Then dP' = dO V^T (the zero column adds
 * nothing), D'_i = D_i - dlse_i, and dV' = P^T dO' whose first dv columns are dV. Models never
 * differentiate lse, so this path only costs when asked for; with a bf16 out, -dlse is rounded to
 * bf16 on the way in. The value dim is the last in both layouts, so the widening is a concat on
 * dim 3 either way; -dlse ([b, h, s] in both) becomes a column [b, h, s, 1], transposed to
 * [b, s, h, 1] in layout 1 to line up with out. */
gt_status gt_grad_sdpa(gt_graph *g, gt_node_id n, const gt_value_id *dout, gt_value_id *din,
                       gt_error *err)
{
    (void)err;
    gt_node nd = g->nodes[n];
    gt_value_id q = nd.in[0], k = nd.in[1], v = nd.in[2], out = nd.out[0], lse = nd.out[1];
    bool causal = nd.attrs.i[0] != 0;
    int layout = (int)nd.attrs.i[1];
    double scale = nd.attrs.f[0];
    gt_value_id d_out = dout[0], d_lse = dout[1];
    /* the document mask (positions, integers: no gradient) goes to the backward unchanged */
    gt_value_id pos = nd.n_in > 3 ? nd.in[3] : GT_NONE;

    if (d_lse == GT_NONE) {
        gt_value_id in[6] = {q, k, v, out, lse, d_out};
        din[0] = gt_sdpa_backward_docs(g, in, pos, causal, scale, layout, &din[1], &din[2]);
        return GT_OK;
    }
    gt_type to = *gt_value_type(g, out), tv = *gt_value_type(g, v), tl = *gt_value_type(g, lse);
    if (d_out == GT_NONE) d_out = gt_full(g, to.dtype, to.ndim, to.dims, 0.0);
    /* one column in out's (and dout's) layout and in v's: the first three dims, then 1 */
    gt_expr col_o[4] = {to.dims[0], to.dims[1], to.dims[2], gt_c(g, 1)};
    gt_expr col_v[4] = {tv.dims[0], tv.dims[1], tv.dims[2], gt_c(g, 1)};
    gt_expr col_l[4] = {tl.dims[0], tl.dims[1], tl.dims[2], gt_c(g, 1)}; /* [b, h, s, 1] */

    gt_value_id v_wide[2] = {v, gt_full(g, tv.dtype, 4, col_v, 0.0)};
    gt_value_id neg_dlse = gt_reshape(g, gt_unary(g, GT_OP_NEG, d_lse), 4, col_l);
    if (layout == 1) neg_dlse = gt_transpose(g, neg_dlse, 1, 2); /* [b, s, h, 1] */
    if (gt_value_type(g, d_lse)->dtype != to.dtype) neg_dlse = gt_cast(g, neg_dlse, to.dtype);
    gt_value_id out_wide[2] = {out, neg_dlse};
    gt_value_id dout_wide[2] = {d_out, gt_full(g, to.dtype, 4, col_o, 1.0)};

    gt_value_id dv_wide = GT_NONE;
    gt_value_id in[6] = {q,
                         k,
                         gt_concat(g, 2, v_wide, 3),
                         gt_concat(g, 2, out_wide, 3),
                         lse,
                         gt_concat(g, 2, dout_wide, 3)};
    din[0] = gt_sdpa_backward_docs(g, in, pos, causal, scale, layout, &din[1], &dv_wide);
    din[2] = gt_slice(g, dv_wide, 3, gt_c(g, 0), tv.dims[3]);
    return GT_OK;
}

GT_GRAD_NONE(sdpa_backward)

/* ---------------------------------------------------------------- softmax, loss, embedding */

gt_status gt_grad_softmax(gt_graph *g, gt_node_id n, const gt_value_id *dout, gt_value_id *din,
                          gt_error *err)
{
    (void)err;
    gt_node nd = g->nodes[n];
    din[0] = gt_softmax_backward(g, nd.out[0], dout[0], (int)nd.attrs.i[0]);
    return GT_OK;
}

GT_GRAD_NONE(softmax_backward)

gt_status gt_grad_cross_entropy(gt_graph *g, gt_node_id n, const gt_value_id *dout,
                                gt_value_id *din, gt_error *err)
{
    (void)err;
    gt_node nd = g->nodes[n];
    din[0] = gt_cross_entropy_backward(g, nd.in[0], nd.in[1], dout[0], nd.attrs.i[0]);
    return GT_OK; /* targets are integers: no gradient */
}

GT_GRAD_NONE(cross_entropy_backward)

gt_status gt_grad_embedding(gt_graph *g, gt_node_id n, const gt_value_id *dout, gt_value_id *din,
                            gt_error *err)
{
    (void)err;
    gt_node nd = g->nodes[n];
    gt_expr num_embeddings = gt_value_type(g, nd.in[0])->dims[0];
    din[0] = gt_embedding_backward(g, nd.in[1], dout[0], num_embeddings);
    return GT_OK; /* ids are integers: no gradient */
}

gt_status gt_grad_embedding_backward(gt_graph *g, gt_node_id n, const gt_value_id *dout,
                                     gt_value_id *din, gt_error *err)
{
    (void)err;
    gt_node nd = g->nodes[n];
    /* dw[v] = sum over tokens t with ids[t] = v of dy[t] is linear in dy; its adjoint gathers:
     * d dy[t] = ddw[ids[t]], an embedding lookup. */
    din[1] = gt_embedding(g, dout[0], nd.in[0]);
    return GT_OK;
}
