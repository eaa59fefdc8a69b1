/* gt_build.h — typed helpers that append one node each (model code, autodiff, optimizer).
 *
 * Each returns the (first) output value, or GT_NONE after recording an error in g->err; a GT_NONE
 * input gives GT_NONE, so a builder function checks g->err once at the end. Dims are gt_expr in the
 * graph's pool; negative dim indices count from the end (-1 = last). */
#ifndef GRAPHTRAIN_GT_BUILD_H
#define GRAPHTRAIN_GT_BUILD_H

#include "gt_graph.h"

#ifdef __cplusplus
extern "C" {
#endif

gt_expr gt_c(gt_graph *g, int64_t c); /* constant dim */

gt_value_id gt_full(gt_graph *g, gt_dtype dt, int ndim, const gt_expr *dims, double value);
gt_value_id gt_add(gt_graph *g, gt_value_id a, gt_value_id b);
gt_value_id gt_sub(gt_graph *g, gt_value_id a, gt_value_id b);
gt_value_id gt_mul(gt_graph *g, gt_value_id a, gt_value_id b);
gt_value_id gt_div(gt_graph *g, gt_value_id a, gt_value_id b);
gt_value_id gt_unary(gt_graph *g, gt_op op,
                     gt_value_id x); /* neg exp log sqrt rsqrt silu sigmoid */
gt_value_id gt_scale(gt_graph *g, gt_value_id x, double alpha);
gt_value_id gt_add_scalar(gt_graph *g, gt_value_id x, double value);
gt_value_id gt_silu_backward(gt_graph *g, gt_value_id x, gt_value_id dy);
gt_value_id gt_cast(gt_graph *g, gt_value_id x, gt_dtype dt);
/* op = GT_OP_SUM, GT_OP_MEAN, GT_OP_MAX or GT_OP_SUM_SQUARES (f32 output) */
gt_value_id gt_reduce(gt_graph *g, gt_op op, gt_value_id x, int ndims, const int *dims,
                      bool keepdim);
gt_value_id gt_max_backward(gt_graph *g, gt_value_id x, gt_value_id y, gt_value_id dy, int ndims,
                            const int *dims, bool keepdim);
gt_value_id gt_broadcast_to(gt_graph *g, gt_value_id x, int ndim, const gt_expr *dims);
gt_value_id gt_sum_to(gt_graph *g, gt_value_id x, int ndim, const gt_expr *dims);
gt_value_id gt_reshape(gt_graph *g, gt_value_id x, int ndim, const gt_expr *dims);
/* A reshape whose equal numel is checked when bound (gt_ops.def: regroup): [b, ...] to the
 * data-parallel ranks' blocks [G, b // G, ...] and back. */
gt_value_id gt_regroup(gt_graph *g, gt_value_id x, int ndim, const gt_expr *dims);
gt_value_id gt_transpose(gt_graph *g, gt_value_id x, int dim0, int dim1);
gt_value_id gt_permute(gt_graph *g, gt_value_id x, int ndim, const int *perm);
gt_value_id gt_slice(gt_graph *g, gt_value_id x, int dim, gt_expr start, gt_expr end);
gt_value_id gt_slice_backward(gt_graph *g, gt_value_id dy, int dim, gt_expr start, gt_expr end,
                              gt_expr size);
gt_value_id gt_concat(gt_graph *g, int n, const gt_value_id *xs, int dim);
/* Writes n outputs to outs; returns outs[0]. */
gt_value_id gt_split(gt_graph *g, gt_value_id x, int dim, int n, const gt_expr *sizes,
                     gt_value_id *outs);
gt_value_id gt_matmul(gt_graph *g, gt_value_id a, gt_value_id b, bool trans_a, bool trans_b);
gt_value_id gt_rms_norm(gt_graph *g, gt_value_id x, gt_value_id w, double eps);
/* dx returned; dw written to *dw */
gt_value_id gt_rms_norm_backward(gt_graph *g, gt_value_id x, gt_value_id w, gt_value_id dy,
                                 double eps, gt_value_id *dw);

/* scaling 0: llama3.1 scaling when original_max_position > 0 (as before the field existed);
 * scaling 2 (GT_ROPE_YARN): YaRN as torchtitan's ComplexRoPE, with low_freq_factor = beta_fast,
 * high_freq_factor = beta_slow, factor = the rope factor and original_max_position = the original
 * sequence length (apply it only where torchtitan does: max_seq_len > that length).
 * interleaved 1: pairs (2j, 2j + 1) (torchtitan's complex RoPE); 0: pairs (j, j + d/2).
 * Zero-initialise the struct: the new fields at 0 give llama's graphs bit for bit. */
typedef struct {
    double theta;
    double factor;
    double low_freq_factor;        /* YaRN: beta_fast */
    double high_freq_factor;       /* YaRN: beta_slow */
    int64_t original_max_position; /* 0 = no llama3.1 scaling */
    int scaling;                   /* 0 or GT_ROPE_YARN */
    int interleaved;               /* 0 or 1 */
} gt_rope_params;
#define GT_ROPE_YARN 2
gt_value_id gt_rope(gt_graph *g, gt_value_id x, const gt_rope_params *p, bool inverse);
/* The same at per-token positions (i64 [b, s]; GT_NONE: 0..s-1, gt_rope's node). */
gt_value_id gt_rope_at(gt_graph *g, gt_value_id x, gt_value_id positions, const gt_rope_params *p,
                       bool inverse);

/* out returned; lse written to *lse (may be NULL). Layout 0: q, k, v, out [b, heads, seq, d]. */
gt_value_id gt_sdpa(gt_graph *g, gt_value_id q, gt_value_id k, gt_value_id v, bool causal,
                    double scale, gt_value_id *lse);
/* dq returned; dk, dv written (layout 0) */
gt_value_id gt_sdpa_backward(gt_graph *g, gt_value_id q, gt_value_id k, gt_value_id v,
                             gt_value_id out, gt_value_id lse, gt_value_id dout, bool causal,
                             double scale, gt_value_id *dk, gt_value_id *dv);
/* The same with the layout attribute: 0 = [b, heads, seq, d], 1 = [b, seq, heads, d] for every
 * tensor but lse ([b, heads, seq] in both; gt_ops.def). */
gt_value_id gt_sdpa_layout(gt_graph *g, gt_value_id q, gt_value_id k, gt_value_id v, bool causal,
                           double scale, int layout, gt_value_id *lse);
gt_value_id gt_sdpa_backward_layout(gt_graph *g, gt_value_id q, gt_value_id k, gt_value_id v,
                                    gt_value_id out, gt_value_id lse, gt_value_id dout, bool causal,
                                    double scale, int layout, gt_value_id *dk, gt_value_id *dv);
/* Block-causal over packed documents: positions i64 [b, s] (restarting at 0 at each document,
 * gt_ops.def) as sdpa's fourth input, sdpa_backward's seventh; GT_NONE gives the nodes above. */
gt_value_id gt_sdpa_docs(gt_graph *g, gt_value_id q, gt_value_id k, gt_value_id v,
                         gt_value_id positions, bool causal, double scale, int layout,
                         gt_value_id *lse);
gt_value_id gt_sdpa_backward_docs(gt_graph *g, const gt_value_id qkv_out_lse_dout[6],
                                  gt_value_id positions, bool causal, double scale, int layout,
                                  gt_value_id *dk, gt_value_id *dv);
gt_value_id gt_softmax(gt_graph *g, gt_value_id x, int dim);
gt_value_id gt_softmax_backward(gt_graph *g, gt_value_id y, gt_value_id dy, int dim);
gt_value_id gt_cross_entropy(gt_graph *g, gt_value_id logits, gt_value_id targets,
                             int64_t ignore_index);
gt_value_id gt_cross_entropy_backward(gt_graph *g, gt_value_id logits, gt_value_id targets,
                                      gt_value_id dloss, int64_t ignore_index);
gt_value_id gt_embedding(gt_graph *g, gt_value_id w, gt_value_id ids);
gt_value_id gt_embedding_backward(gt_graph *g, gt_value_id ids, gt_value_id dy,
                                  gt_expr num_embeddings);

/* DeepSeek-V3's mixture-of-experts ops (gt_ops.def gives the semantics). */
gt_value_id gt_sign(gt_graph *g, gt_value_id x);
/* scores [T, E] -> i32 [T, k]; n_groups <= 1: no group limit (n_limited is then ignored). */
gt_value_id gt_moe_topk(gt_graph *g, gt_value_id scores, int k, int n_groups, int n_limited);
gt_value_id gt_gather_last(gt_graph *g, gt_value_id x, gt_value_id idx);
gt_value_id gt_gather_last_backward(gt_graph *g, gt_value_id idx, gt_value_id dy, gt_expr n_cols);
/* order returned; token (i32 [T*K]) and offsets (i32 [n_experts + 1]) written (either may be
 * NULL). */
gt_value_id gt_moe_sort(gt_graph *g, gt_value_id idx, int n_experts, gt_value_id *token,
                        gt_value_id *offsets);
gt_value_id gt_moe_count(gt_graph *g, gt_value_id idx, int n_experts);
/* w: [E, Dout, Din] with trans_b (torchtitan's expert weights), [E, Din, Dout] without. */
gt_value_id gt_grouped_matmul(gt_graph *g, gt_value_id x, gt_value_id w, gt_value_id offsets,
                              bool trans_b);
/* -> [E, Dout, Din] (E from offsets' length - 1) */
gt_value_id gt_grouped_matmul_dw(gt_graph *g, gt_value_id x, gt_value_id dy, gt_value_id offsets);
/* Expert parallel (gt_ops.def; parallelize emits them): n_blocks ranks in the ep group; table is
 * the all-gathered moe_block_offsets of every rank, i32 [n*n, E/n + 1]. */
gt_value_id gt_moe_block_offsets(gt_graph *g, gt_value_id offsets, int n_blocks);
gt_value_id gt_moe_pack(gt_graph *g, gt_value_id x, gt_value_id table, int n_blocks,
                        gt_expr capacity, gt_expr worst, gt_expr rank);
gt_value_id gt_moe_unpack(gt_graph *g, gt_value_id y, gt_value_id table, int n_blocks, gt_expr rows,
                          gt_expr rank);

/* Optimizer ops (gt_ops.def). clamp: min(max(x, min), max); pass -INFINITY / INFINITY to leave a
 * side open. */
gt_value_id gt_clamp(gt_graph *g, gt_value_id x, double min, double max);
/* One AdamW step on one parameter: p' returned; m', v' written to *m_out, *v_out (may be NULL).
 * scalars: f32[3] {lr, 1 - beta1^t, 1 - beta2^t}; clip: f32 [] gradient multiplier. */
gt_value_id gt_adamw(gt_graph *g, gt_value_id p, gt_value_id grad, gt_value_id m, gt_value_id v,
                     gt_value_id scalars, gt_value_id clip, double beta1, double beta2, double eps,
                     double weight_decay, gt_value_id *m_out, gt_value_id *v_out);

#ifdef __cplusplus
}
#endif
#endif
