/* kernel_check.h — argument checks and shape helpers every backend's kernels share. They look at
 * a gt_kernel_call's attributes and tensor metadata only (never tensor data), so the CPU and CUDA
 * backends validate a call the same way and report it in the same words. */
#ifndef GRAPHTRAIN_BACKEND_KERNEL_CHECK_H
#define GRAPHTRAIN_BACKEND_KERNEL_CHECK_H

#include "graphtrain/gt_backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* moe_pack's capacity overflow (cpu_moe_ep.c; the CUDA backend reports its device-flagged
 * overflow after the step in the same words): rank `from` sends `most` rows to block `to`, more
 * than `cap` per rank pair, worst case `worst`; names the factor needed. GT_ERR_INVALID. */
gt_status gt_kernel_moe_capacity_error(int64_t from, int64_t most, int64_t to, int64_t cap,
                                       int64_t worst, gt_error *err);
/* The op's printed name ("?" when out of range). */
const char *gt_kernel_op_name(gt_op op);
/* "f32[2, 3]" into buf; returns buf. */
const char *gt_kernel_fmt(const gt_tensor *t, char *buf, size_t n);

/* Each returns GT_OK or an error "OP: WHAT is TYPE, expected ...". */
gt_status gt_kernel_want_float(const gt_kernel_call *c, const gt_tensor *t, const char *what,
                               gt_error *err);
gt_status gt_kernel_want_index(const gt_kernel_call *c, const gt_tensor *t, const char *what,
                               gt_error *err);
gt_status gt_kernel_want_same_shape(const gt_kernel_call *c, const gt_tensor *a, const char *what_a,
                                    const gt_tensor *b, const char *what_b, gt_error *err);
gt_status gt_kernel_want_rank(const gt_kernel_call *c, const gt_tensor *t, const char *what,
                              int ndim, gt_error *err);
gt_status gt_kernel_want_same_dtype(const gt_kernel_call *c, const gt_tensor *a, const char *what_a,
                                    const gt_tensor *b, const char *what_b, gt_error *err);
/* adamw's inputs (param, grad, exp_avg, exp_avg_sq, scalars, clip) and outputs (param',
 * exp_avg', exp_avg_sq') as errors name them. */
extern const char *const gt_kernel_adamw_in[6];
extern const char *const gt_kernel_adamw_out[3];
/* adamw's checks that do not depend on a backend's dtypes: four float attributes, beta1 and beta2
 * in [0, 1), eps and weight_decay >= 0; grad, the moments and the three outputs shaped like
 * param; scalars of 3 elements and clip of 1. */
gt_status gt_kernel_want_adamw(const gt_kernel_call *c, gt_error *err);
/* A call's frame, before any kernel looks at it: n_in inputs and n_out outputs (-1: 1 to GT_MAX_IN
 * or GT_MAX_OUT), attribute counts in range, every tensor present and well formed (rank, dtype,
 * a buffer when it has elements). */
gt_status gt_kernel_check_call(const gt_kernel_call *c, int n_in, int n_out, gt_error *err);
/* At least ni int, nf float and ne expression attributes. */
gt_status gt_kernel_want_attrs(const gt_kernel_call *c, int ni, int nf, int ne, gt_error *err);
/* dim (negative counts from the end) as an index in [0, ndim). */
gt_status gt_kernel_norm_dim(const gt_kernel_call *c, int64_t dim, int ndim, int *out,
                             gt_error *err);

/* Row-major strides of a contiguous tensor. */
void gt_kernel_contig_strides(int ndim, const int64_t *shape, int64_t *strides);
/* Splits a shape at dim: outer = prod(shape[0..dim)), inner = prod(shape(dim..]). */
void gt_kernel_outer_inner(const gt_tensor *t, int dim, int64_t *outer, int64_t *inner);
/* Whether a concat's input x, for the output's elements from off along its concat dim (split at
 * it into outer and inner), already lies there: the memory plan computes such inputs in place
 * inside the output (src/runtime/plan.c), and the concat leaves them. */
bool gt_kernel_concat_in_place(const gt_tensor *x, const gt_tensor *out, int64_t outer, int64_t off,
                               int64_t inner);
/* True when a and b have the same rank and agree on every dim except dim. */
bool gt_kernel_same_but(const gt_tensor *a, const gt_tensor *b, int dim);
/* True when rows has ids' shape plus a last dim d (an embedding's rows, or their gradient). */
bool gt_kernel_rows_of_ids(const gt_tensor *ids, const gt_tensor *rows, int64_t d);

/* full: attribute i[0] is the output's dtype, e[] its shape; *bits (8 bytes, the element's
 * stored bytes first) gets the value f[0] in that dtype: rounded to f32 first (attributes are
 * doubles), then to the dtype as gt_tensor_set_f32 does; to an integer dtype by truncation toward
 * zero with saturation and NaN -> 0 (straight from the double: through f32 would lose integers
 * above 2^24); bool is value != 0. */
gt_status gt_kernel_want_full(const gt_kernel_call *c, uint8_t bits[8], gt_error *err);
/* cast: attribute i[0] is the output's dtype; input and output of one shape. */
gt_status gt_kernel_want_cast(const gt_kernel_call *c, gt_error *err);

/* matmul's dims: a [..., r_a, c_a], b [r_b, c_b] or [..., r_b, c_b] (b's batch dims those of a);
 * out = op(a) @ op(b): [..., m, n], op transposing when i[0] (a) or i[1] (b) is set; batch is
 * the product of a's batch dims. */
typedef struct {
    bool ta, tb, b_batched;
    int64_t m, n, k, batch;
} gt_kernel_matmul_dims;
gt_status gt_kernel_want_matmul(const gt_kernel_call *c, gt_kernel_matmul_dims *d, gt_error *err);

/* embedding and embedding_shard: w [V, D] (a shard's rows from e[0] on), ids of an index dtype,
 * output [ids..., D] of w's dtype. embedding_backward and embedding_shard_backward: ids,
 * dy [ids..., D], dw [e[0], D] (a shard's rows from e[1] on). Float dtypes are the backend's to
 * check. */
gt_status gt_kernel_want_embedding(const gt_kernel_call *c, gt_error *err);
gt_status gt_kernel_want_embedding_backward(const gt_kernel_call *c, gt_error *err);

/* sdpa and sdpa_backward: q, k, v (inputs 0..2) of rank 4 in layout i[1] (0: [b, heads, n, w];
 * 1: [b, n, heads, w]; 0 when the attribute is absent), causal i[0], scale f[0]; k and v of one
 * batch, kv heads and length, q and k of one head dim, hq a multiple of hkv, and as many queries
 * as keys when causal. Dtypes are the backend's to check. Document masks: the optional last input
 * (sdpa's 3, sdpa_backward's 6) is positions i64 [b, s], which needs causal; query i of batch bi
 * then sees keys i - positions[bi, i] .. i (gt_ops.def). Its values are the backend's to check
 * (they may live on a device). */
typedef struct {
    int64_t b, hq, hkv, s, t, d, dv;
    int layout;
    bool causal;
    float scale;
    const int64_t *positions; /* [b, s], or NULL: no document mask */
} gt_kernel_attn;
gt_status gt_kernel_want_attn(const gt_kernel_call *c, gt_kernel_attn *a, gt_error *err);
/* t shaped [b, h, n, last] in a's layout ([b, n, h, last] in layout 1); last < 0: an lse,
 * [b, h, n] in both layouts. */
gt_status gt_kernel_want_attn_tensor(const gt_kernel_call *c, const gt_tensor *t, const char *what,
                                     const gt_kernel_attn *a, int64_t h, int64_t n, int64_t last,
                                     gt_error *err);

/* The moves' checks (src/backend/cpu/cpu_layout.c, src/backend/cuda/cuda_layout.cu): input(s)
 * and output(s) of one dtype, the attributes in range and the output shapes they imply. A shape
 * that does not fit is "OP: output T does not fit input T and the attributes". */
gt_status gt_kernel_shape_error(const gt_kernel_call *c, const gt_tensor *x, const gt_tensor *out,
                                gt_error *err);
/* True when out's shape equals the expression attributes e[0..ne). */
bool gt_kernel_out_matches_e(const gt_kernel_call *c, const gt_tensor *out);
/* reshape: the output's shape is e[] and has the input's element count. */
gt_status gt_kernel_want_reshape(const gt_kernel_call *c, gt_error *err);
/* transpose (dims i[0], i[1]) and permute (i[0..rank)): the permutation (out dim k is input dim
 * perm[k]) and an output of the permuted shape. */
gt_status gt_kernel_want_perm(const gt_kernel_call *c, int *perm, gt_error *err);
/* slice (dim i[0], [e[0], e[1]) inside it) and slice_backward (dy placed at [e[0], e[1]) of a dim
 * of size e[2]): the normalised dim. */
gt_status gt_kernel_want_slice(const gt_kernel_call *c, int *dim, gt_error *err);
gt_status gt_kernel_want_slice_backward(const gt_kernel_call *c, int *dim, gt_error *err);
/* concat of the inputs along dim i[0] into the output; split of the input along dim i[0] into
 * outputs of sizes e[0..n_out): the normalised dim. */
gt_status gt_kernel_want_concat(const gt_kernel_call *c, int *dim, gt_error *err);
gt_status gt_kernel_want_split(const gt_kernel_call *c, int *dim, gt_error *err);

#ifdef __cplusplus
}
#endif
#endif
