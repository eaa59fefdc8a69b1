/* cuda_cudnn.cu — sdpa on cuDNN's fused flash attention, where graphtrain is built with cuDNN
 * (GT_HAVE_CUDNN) and the call is one it serves well: bf16 q, k, v and out, f32 lse, head dims 64
 * to 256 (d of q and k, dv of v and out: DeepSeek-V3's MLA has d 192, dv 128), as many keys as
 * queries; forward and backward. Host code only: cuDNN's backend API.
 *
 * The forward's operation graph is cuDNN's flash attention pattern, per (batch, head), with S, P
 * and the row statistics virtual (they never reach memory):
 *   S = Q K^T (f32 accumulation), S *= scale, causal: S_ij = -1e20 where j > i,
 *   M_i = max_j S_ij, E = exp(S - M), Z_i = sum_j E_ij, lse_i = M_i + log Z_i, P = E / Z (bf16),
 *   O = P V.
 * lse is the natural-log statistic graphtrain's own forward writes, so either backward reads it.
 * Heads of q share k and v by GQA (hq a multiple of hkv) through the tensors' dims. The backward's
 * graph is gt_cudnn_backward_graph's.
 *
 * Determinism: only engine configs without cuDNN's NONDETERMINISTIC note are taken, and one plan
 * is built per shape (the first the heuristics rank that builds) and kept, so every run of a shape
 * runs the same kernel: reruns, graph and eager runs, captured and uncaptured steps give the same
 * bits. A shape no engine builds falls back to graphtrain's kernels, for good. Plans are built on
 * a step's first (warm-up) run: never under stream capture (which refuses allocation).
 *
 * The backward's dQ = dS K goes straight to the bf16 output, with no f32 accumulator in the graph:
 * cudnn-frontend's deterministic pattern on Hopper. The accumulator form (dQ added up in f32 over
 * key blocks, then rounded) carries no NONDETERMINISTIC note either, yet its dQ bits differed run
 * to run on an H200 (cuDNN 9.14 and 9.19, 2026-11-27: at head dim 64 every run, at 128 rarely).
 * So a backward plan's first run is also run twice and compared (gt_cudnn_sdpa_backward); a plan
 * whose bits differ is dropped for graphtrain's kernels. docs/BENCHMARKS.md has the numbers.
 *
 * GT_CUDNN=0 in the environment keeps graphtrain's kernels (cuda.cu); GT_CUDNN_VERBOSE=1 lists, on
 * stderr, each graph's engine configs with their notes and knobs, and what was built. */
#include "cuda_internal.h"

#ifdef GT_HAVE_CUDNN
#include <cudnn.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GT_CUDNN_PLANS 32

typedef cudnnBackendDescriptor_t gt_cudnn_desc;

/* clang-format off */
enum {
    UID_Q = 1, UID_K, UID_V, UID_O, UID_STATS, UID_SCALE, UID_MASK_VALUE,
    UID_DO, UID_DQ, UID_DK, UID_DV, UID_ROW_SUM, UID_ONE, /* backward */
    UID_VIRTUAL = 100
};
/* clang-format on */
/* b, hq, hkv, s, d, layout, causal, scale's bits, 0 forward / 1 backward, dv */
#define GT_CUDNN_KEY 10

/* The descriptors of one graph, destroyed together (with its plan: the plan refers to them). */
typedef struct {
    gt_cudnn_desc d[128];
    int n;
} gt_cudnn_pool;

typedef struct {
    int64_t key[GT_CUDNN_KEY];
    gt_cudnn_desc plan; /* NULL: no deterministic engine builds this shape */
    int64_t workspace;
    int checked; /* backward: 0 not yet, 1 two runs gave the same bits, -1 they did not */
    gt_cudnn_pool pool;
} gt_cudnn_plan;

struct gt_cudnn {
    cudnnHandle_t handle;
    gt_cudnn_plan plans[GT_CUDNN_PLANS];
    int n_plans;
    void *workspace;
    size_t workspace_bytes;
};

/* ---------------------------------------------------------------- descriptors */

/* A descriptor-building step failed: its name and cuDNN's own last message. */
static gt_status gt_cudnn_fail(cudnnStatus_t st, const char *what, gt_error *err)
{
    char last[400] = "";
    cudnnGetLastErrorString(last, sizeof last);
    return gt_error_set(
        err, GT_ERR_UNSUPPORTED,
        "sdpa on cuDNN: %s: %s%s%s (GT_CUDNN=0 in the environment runs graphtrain's "
        "own attention kernels)",
        what, cudnnGetErrorString(st), last[0] ? ": " : "", last);
}
#define GT_CUDNN_TRY(x)                                                                            \
    do {                                                                                           \
        cudnnStatus_t st_ = (x);                                                                   \
        if (st_ != CUDNN_STATUS_SUCCESS) return gt_cudnn_fail(st_, #x, err);                       \
    } while (0)

static gt_status gt_cudnn_new(gt_cudnn_pool *p, cudnnBackendDescriptorType_t type,
                              gt_cudnn_desc *out, gt_error *err)
{
    if (p->n == (int)(sizeof p->d / sizeof p->d[0]))
        return gt_error_set(err, GT_ERR_INTERNAL, "sdpa on cuDNN: descriptor pool full");
    GT_CUDNN_TRY(cudnnBackendCreateDescriptor(type, out));
    p->d[p->n++] = *out;
    return GT_OK;
}

static void gt_cudnn_pool_free(gt_cudnn_pool *p)
{
    for (int i = p->n - 1; i >= 0; i--)
        cudnnBackendDestroyDescriptor(p->d[i]);
    p->n = 0;
}

static gt_status gt_cudnn_set(gt_cudnn_desc d, cudnnBackendAttributeName_t a,
                              cudnnBackendAttributeType_t t, int64_t n, const void *v,
                              gt_error *err)
{
    GT_CUDNN_TRY(cudnnBackendSetAttribute(d, a, t, n, v));
    return GT_OK;
}

/* A 4-d tensor: its uid, element type, dims and strides (elements); virtual ones exist only
 * inside the fused kernel, by-value ones are host scalars given at execution. */
static gt_status gt_cudnn_tensor(gt_cudnn_pool *p, gt_cudnn_desc *out, int64_t uid,
                                 cudnnDataType_t dt, const int64_t dim[4], const int64_t stride[4],
                                 bool is_virtual, bool by_value, bool reorder, gt_error *err)
{
    GT_TRY(gt_cudnn_new(p, CUDNN_BACKEND_TENSOR_DESCRIPTOR, out, err));
    int64_t align = 16;
    GT_TRY(gt_cudnn_set(*out, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt, err));
    GT_TRY(gt_cudnn_set(*out, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dim, err));
    GT_TRY(gt_cudnn_set(*out, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, stride, err));
    GT_TRY(gt_cudnn_set(*out, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, err));
    GT_TRY(gt_cudnn_set(*out, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align, err));
    GT_TRY(
        gt_cudnn_set(*out, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual, err));
    GT_TRY(
        gt_cudnn_set(*out, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value, err));
    if (reorder) { /* the softmax output feeding the second matmul, in cuDNN's tile order */
        cudnnBackendTensorReordering_t r = CUDNN_TENSOR_REORDERING_F16x16;
        GT_TRY(gt_cudnn_set(*out, CUDNN_ATTR_TENSOR_REORDERING_MODE,
                            CUDNN_TYPE_TENSOR_REORDERING_MODE, 1, &r, err));
    }
    GT_CUDNN_TRY(cudnnBackendFinalize(*out));
    return GT_OK;
}

/* A virtual tensor (never in memory: an intermediate of the graph) with the next virtual uid. */
static gt_status gt_cudnn_virtual(gt_cudnn_pool *p, int64_t *vid, cudnnDataType_t dt,
                                  const int64_t dim[4], const int64_t stride[4], gt_cudnn_desc *out,
                                  gt_error *err)
{
    return gt_cudnn_tensor(p, out, (*vid)++, dt, dim, stride, true, false, false, err);
}

/* y = mode(x[, b[, t]]) computed in `prec`; axis >= 0 for GEN_INDEX. Appends to ops[*n]. */
static gt_status gt_cudnn_pointwise(gt_cudnn_pool *p, gt_cudnn_desc *ops, int *n,
                                    cudnnPointwiseMode_t mode, cudnnDataType_t prec, int64_t axis,
                                    gt_cudnn_desc x, gt_cudnn_desc b, gt_cudnn_desc t,
                                    gt_cudnn_desc y, gt_error *err)
{
    gt_cudnn_desc pw, op;
    GT_TRY(gt_cudnn_new(p, CUDNN_BACKEND_POINTWISE_DESCRIPTOR, &pw, err));
    GT_TRY(gt_cudnn_set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, err));
    GT_TRY(gt_cudnn_set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec, err));
    if (axis >= 0)
        GT_TRY(gt_cudnn_set(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, err));
    GT_CUDNN_TRY(cudnnBackendFinalize(pw));
    GT_TRY(gt_cudnn_new(p, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, &op, err));
    const cudnnBackendAttributeType_t D = CUDNN_TYPE_BACKEND_DESCRIPTOR;
    GT_TRY(gt_cudnn_set(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, D, 1, &pw, err));
    GT_TRY(gt_cudnn_set(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, D, 1, &x, err));
    if (b) GT_TRY(gt_cudnn_set(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, D, 1, &b, err));
    if (t) GT_TRY(gt_cudnn_set(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, D, 1, &t, err));
    GT_TRY(gt_cudnn_set(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, D, 1, &y, err));
    GT_CUDNN_TRY(cudnnBackendFinalize(op));
    ops[(*n)++] = op;
    return GT_OK;
}

/* y[..., 0] = `how` over the last dim of x, in f32. */
static gt_status gt_cudnn_reduction(gt_cudnn_pool *p, gt_cudnn_desc *ops, int *n,
                                    cudnnReduceTensorOp_t how, gt_cudnn_desc x, gt_cudnn_desc y,
                                    gt_error *err)
{
    gt_cudnn_desc r, op;
    cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    const cudnnBackendAttributeType_t D = CUDNN_TYPE_BACKEND_DESCRIPTOR;
    GT_TRY(gt_cudnn_new(p, CUDNN_BACKEND_REDUCTION_DESCRIPTOR, &r, err));
    GT_TRY(gt_cudnn_set(r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1,
                        &how, err));
    GT_TRY(gt_cudnn_set(r, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32, err));
    GT_CUDNN_TRY(cudnnBackendFinalize(r));
    GT_TRY(gt_cudnn_new(p, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, &op, err));
    GT_TRY(gt_cudnn_set(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, D, 1, &x, err));
    GT_TRY(gt_cudnn_set(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, D, 1, &y, err));
    GT_TRY(gt_cudnn_set(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, D, 1, &r, err));
    GT_CUDNN_TRY(cudnnBackendFinalize(op));
    ops[(*n)++] = op;
    return GT_OK;
}

/* Batched c = a b, f32 accumulation. */
static gt_status gt_cudnn_matmul(gt_cudnn_pool *p, gt_cudnn_desc *ops, int *n, gt_cudnn_desc a,
                                 gt_cudnn_desc b, gt_cudnn_desc c, gt_error *err)
{
    gt_cudnn_desc m, op;
    cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    const cudnnBackendAttributeType_t D = CUDNN_TYPE_BACKEND_DESCRIPTOR;
    GT_TRY(gt_cudnn_new(p, CUDNN_BACKEND_MATMUL_DESCRIPTOR, &m, err));
    GT_TRY(gt_cudnn_set(m, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32, err));
    GT_CUDNN_TRY(cudnnBackendFinalize(m));
    GT_TRY(gt_cudnn_new(p, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, &op, err));
    GT_TRY(gt_cudnn_set(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, D, 1, &a, err));
    GT_TRY(gt_cudnn_set(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, D, 1, &b, err));
    GT_TRY(gt_cudnn_set(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, D, 1, &c, err));
    GT_TRY(gt_cudnn_set(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, D, 1, &m, err));
    GT_CUDNN_TRY(cudnnBackendFinalize(op));
    ops[(*n)++] = op;
    return GT_OK;
}

/* y = x viewed with y's dims and strides (a transpose, as cuDNN's flash patterns write them). */
static gt_status gt_cudnn_reshape(gt_cudnn_pool *p, gt_cudnn_desc *ops, int *n, gt_cudnn_desc x,
                                  gt_cudnn_desc y, gt_error *err)
{
    gt_cudnn_desc op;
    const cudnnBackendAttributeType_t D = CUDNN_TYPE_BACKEND_DESCRIPTOR;
    GT_TRY(gt_cudnn_new(p, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, &op, err));
    GT_TRY(gt_cudnn_set(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, D, 1, &x, err));
    GT_TRY(gt_cudnn_set(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, D, 1, &y, err));
    GT_CUDNN_TRY(cudnnBackendFinalize(op));
    ops[(*n)++] = op;
    return GT_OK;
}

/* ---------------------------------------------------------------- graph and plan */

/* Strides of q-like ([b, hq, s, d]) and k-like tensors in cuDNN's [b, heads, s, d] dims, for
 * layout 0 ([b, heads, s, d] in memory) or 1 ([b, s, heads, d]). */
static void gt_cudnn_strides(int64_t heads, int64_t s, int64_t d, bool layout1, int64_t out[4])
{
    out[0] = heads * s * d, out[1] = layout1 ? d : s * d, out[2] = layout1 ? heads * d : d;
    out[3] = 1;
}

/* The graph's operations, finalized into an operation graph. */
static gt_status gt_cudnn_graph(cudnnHandle_t h, gt_cudnn_pool *p, gt_cudnn_desc *ops, int n,
                                gt_cudnn_desc *graph, gt_error *err)
{
    GT_TRY(gt_cudnn_new(p, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, graph, err));
    GT_TRY(gt_cudnn_set(*graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h, err));
    GT_TRY(gt_cudnn_set(*graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, n,
                        ops, err));
    GT_CUDNN_TRY(cudnnBackendFinalize(*graph));
    return GT_OK;
}

/* The causal select: x where row >= column, the mask value elsewhere (into *out). */
static gt_status gt_cudnn_causal(gt_cudnn_pool *p, gt_cudnn_desc *ops, int *n, int64_t *vid,
                                 const int64_t s_dim[4], const int64_t s_str[4], gt_cudnn_desc x,
                                 gt_cudnn_desc *out, gt_error *err)
{
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    const int64_t one[4] = {1, 1, 1, 1};
    gt_cudnn_desc mask_value, row, col, keep;
    GT_TRY(gt_cudnn_tensor(p, &mask_value, UID_MASK_VALUE, f32, one, one, false, true, false, err));
    GT_TRY(gt_cudnn_virtual(p, vid, f32, s_dim, s_str, &row, err));
    GT_TRY(gt_cudnn_virtual(p, vid, f32, s_dim, s_str, &col, err));
    GT_TRY(gt_cudnn_virtual(p, vid, CUDNN_DATA_BOOLEAN, s_dim, s_str, &keep, err));
    GT_TRY(gt_cudnn_virtual(p, vid, f32, s_dim, s_str, out, err));
    GT_TRY(
        gt_cudnn_pointwise(p, ops, n, CUDNN_POINTWISE_GEN_INDEX, f32, 2, x, NULL, NULL, row, err));
    GT_TRY(
        gt_cudnn_pointwise(p, ops, n, CUDNN_POINTWISE_GEN_INDEX, f32, 3, x, NULL, NULL, col, err));
    GT_TRY(gt_cudnn_pointwise(p, ops, n, CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, -1, row, col,
                              NULL, keep, err));
    return gt_cudnn_pointwise(p, ops, n, CUDNN_POINTWISE_BINARY_SELECT, f32, -1, x, mask_value,
                              keep, *out, err);
}

/* out = a b for a kv head's gradient (dK or dV): with GQA, the product per q head into a virtual
 * [b, hq, s, d] in bf16 (cuDNN's pattern wants the input dtype there: f32 gave wrong dK and dV),
 * then a sum over each group of heads into out. */
static gt_status gt_cudnn_matmul_kv(gt_cudnn_pool *p, gt_cudnn_desc *ops, int *n, int64_t *vid,
                                    bool gqa, const int64_t q_dim[4], const int64_t full_str[4],
                                    gt_cudnn_desc a, gt_cudnn_desc b, gt_cudnn_desc out,
                                    gt_error *err)
{
    if (!gqa) return gt_cudnn_matmul(p, ops, n, a, b, out, err);
    gt_cudnn_desc full;
    GT_TRY(gt_cudnn_virtual(p, vid, CUDNN_DATA_BFLOAT16, q_dim, full_str, &full, err));
    GT_TRY(gt_cudnn_matmul(p, ops, n, a, b, full, err));
    return gt_cudnn_reduction(p, ops, n, CUDNN_REDUCE_TENSOR_ADD, full, out, err);
}

/* The backward graph of one shape (cudnn-frontend's flash backward pattern):
 *   D = rowsum(dO * O) (f32, to the row-sum buffer), P = exp(scale Q K^T - lse) (causal: 0 above
 *   the diagonal), dV = P^T dO, dP = dO V^T, dS = scale P (dP - D), dK = dS^T Q, dQ = dS K
 *   (straight to bf16: see the header). With GQA, dK and dV come as hq heads and a reduction adds
 * each group into its kv head. */
static gt_status gt_cudnn_backward_graph(cudnnHandle_t h, gt_cudnn_pool *p, const int64_t *key,
                                         gt_cudnn_desc *graph, gt_error *err)
{
    const int64_t b = key[0], hq = key[1], hkv = key[2], s = key[3], d = key[4], dv_ = key[9];
    const bool layout1 = key[5] != 0, causal = key[6] != 0, gqa = hq != hkv;
    const cudnnDataType_t bf = CUDNN_DATA_BFLOAT16, f32 = CUDNN_DATA_FLOAT;
    int64_t q_str[4], k_str[4], o_str[4], v_str[4];
    gt_cudnn_strides(hq, s, d, layout1, q_str);
    gt_cudnn_strides(hkv, s, d, layout1, k_str);
    gt_cudnn_strides(hq, s, dv_, layout1, o_str);
    gt_cudnn_strides(hkv, s, dv_, layout1, v_str);
    const int64_t q_dim[4] = {b, hq, s, d}, k_dim[4] = {b, hkv, s, d}, kt_dim[4] = {b, hkv, d, s};
    const int64_t o_dim[4] = {b, hq, s, dv_}, v_dim[4] = {b, hkv, s, dv_};
    const int64_t vt_dim[4] = {b, hkv, dv_, s};
    const int64_t kt_str[4] = {k_str[0], k_str[1], k_str[3], k_str[2]};
    const int64_t vt_str[4] = {v_str[0], v_str[1], v_str[3], v_str[2]};
    const int64_t s_dim[4] = {b, hq, s, s}, s_str[4] = {hq * s * s, s * s, s, 1};
    const int64_t st_str[4] = {hq * s * s, s * s, 1, s}; /* [b, hq, keys, queries] of an S */
    const int64_t r_dim[4] = {b, hq, s, 1}, r_str[4] = {hq * s, s, 1, 1}, one[4] = {1, 1, 1, 1};
    const int64_t full_str[4] = {hq * s * d, s * d, d, 1}; /* packed [b, hq, s, d] */
    const int64_t full_o_str[4] = {hq * s * dv_, s * dv_, dv_, 1}; /* packed [b, hq, s, dv] */
    int64_t vid = UID_VIRTUAL;
    gt_cudnn_desc q, kt, vt, o, g, lse, scale, unit, dq, dk, dv, row_sum;
    GT_TRY(gt_cudnn_tensor(p, &q, UID_Q, bf, q_dim, q_str, false, false, false, err));
    GT_TRY(gt_cudnn_tensor(p, &kt, UID_K, bf, kt_dim, kt_str, false, false, false, err));
    GT_TRY(gt_cudnn_tensor(p, &vt, UID_V, bf, vt_dim, vt_str, false, false, false, err));
    GT_TRY(gt_cudnn_tensor(p, &o, UID_O, bf, o_dim, o_str, false, false, false, err));
    GT_TRY(gt_cudnn_tensor(p, &g, UID_DO, bf, o_dim, o_str, false, false, false, err));
    GT_TRY(gt_cudnn_tensor(p, &lse, UID_STATS, f32, r_dim, r_str, false, false, false, err));
    GT_TRY(gt_cudnn_tensor(p, &scale, UID_SCALE, f32, one, one, false, true, false, err));
    GT_TRY(gt_cudnn_tensor(p, &unit, UID_ONE, f32, one, one, false, true, false, err));
    GT_TRY(gt_cudnn_tensor(p, &dq, UID_DQ, bf, q_dim, q_str, false, false, false, err));
    GT_TRY(gt_cudnn_tensor(p, &dk, UID_DK, bf, k_dim, k_str, false, false, false, err));
    GT_TRY(gt_cudnn_tensor(p, &dv, UID_DV, bf, v_dim, v_str, false, false, false, err));
    GT_TRY(gt_cudnn_tensor(p, &row_sum, UID_ROW_SUM, f32, r_dim, r_str, false, false, false, err));
    gt_cudnn_desc ops[40];
    int n = 0;
    /* D = rowsum(dO * O) * 1 */
    gt_cudnn_desc go, go_sum;
    GT_TRY(gt_cudnn_virtual(p, &vid, f32, o_dim, full_o_str, &go, err));
    GT_TRY(gt_cudnn_virtual(p, &vid, f32, r_dim, r_str, &go_sum, err));
    GT_TRY(gt_cudnn_pointwise(p, ops, &n, CUDNN_POINTWISE_MUL, f32, -1, g, o, NULL, go, err));
    GT_TRY(gt_cudnn_reduction(p, ops, &n, CUDNN_REDUCE_TENSOR_ADD, go, go_sum, err));
    GT_TRY(gt_cudnn_pointwise(p, ops, &n, CUDNN_POINTWISE_MUL, f32, -1, go_sum, unit, NULL, row_sum,
                              err));
    /* P = exp(scale Q K^T - lse), masked */
    gt_cudnn_desc sc, ss, sub, masked, prob, prob_t;
    GT_TRY(gt_cudnn_virtual(p, &vid, f32, s_dim, s_str, &sc, err));
    GT_TRY(gt_cudnn_virtual(p, &vid, f32, s_dim, s_str, &ss, err));
    GT_TRY(gt_cudnn_virtual(p, &vid, f32, s_dim, s_str, &sub, err));
    GT_TRY(gt_cudnn_virtual(p, &vid, f32, s_dim, s_str, &prob, err));
    GT_TRY(gt_cudnn_virtual(p, &vid, bf, s_dim, st_str, &prob_t, err));
    GT_TRY(gt_cudnn_matmul(p, ops, &n, q, kt, sc, err));
    GT_TRY(gt_cudnn_pointwise(p, ops, &n, CUDNN_POINTWISE_MUL, f32, -1, sc, scale, NULL, ss, err));
    GT_TRY(gt_cudnn_pointwise(p, ops, &n, CUDNN_POINTWISE_SUB, f32, -1, ss, lse, NULL, sub, err));
    masked = sub;
    if (causal) GT_TRY(gt_cudnn_causal(p, ops, &n, &vid, s_dim, s_str, sub, &masked, err));
    GT_TRY(gt_cudnn_pointwise(p, ops, &n, CUDNN_POINTWISE_EXP, f32, -1, masked, NULL, NULL, prob,
                              err));
    /* dV = P^T dO (per q head, then summed over each group) */
    GT_TRY(gt_cudnn_reshape(p, ops, &n, prob, prob_t, err));
    GT_TRY(gt_cudnn_matmul_kv(p, ops, &n, &vid, gqa, o_dim, full_o_str, prob_t, g, dv, err));
    /* dS = scale P (dO V^T - D) */
    gt_cudnn_desc dp, dps, ds, dss, dss_t, k_again;
    GT_TRY(gt_cudnn_virtual(p, &vid, f32, s_dim, s_str, &dp, err));
    GT_TRY(gt_cudnn_virtual(p, &vid, f32, s_dim, s_str, &dps, err));
    GT_TRY(gt_cudnn_virtual(p, &vid, f32, s_dim, s_str, &ds, err));
    GT_TRY(gt_cudnn_virtual(p, &vid, f32, s_dim, s_str, &dss, err));
    GT_TRY(gt_cudnn_virtual(p, &vid, bf, s_dim, st_str, &dss_t, err));
    GT_TRY(gt_cudnn_virtual(p, &vid, bf, k_dim, k_str, &k_again, err));
    GT_TRY(gt_cudnn_matmul(p, ops, &n, g, vt, dp, err));
    GT_TRY(
        gt_cudnn_pointwise(p, ops, &n, CUDNN_POINTWISE_SUB, f32, -1, dp, row_sum, NULL, dps, err));
    GT_TRY(gt_cudnn_pointwise(p, ops, &n, CUDNN_POINTWISE_MUL, f32, -1, dps, prob, NULL, ds, err));
    GT_TRY(gt_cudnn_pointwise(p, ops, &n, CUDNN_POINTWISE_MUL, f32, -1, ds, scale, NULL, dss, err));
    /* dK = dS^T Q */
    GT_TRY(gt_cudnn_reshape(p, ops, &n, dss, dss_t, err));
    GT_TRY(gt_cudnn_matmul_kv(p, ops, &n, &vid, gqa, q_dim, full_str, dss_t, q, dk, err));
    /* dQ = dS K */
    GT_TRY(gt_cudnn_reshape(p, ops, &n, kt, k_again, err));
    GT_TRY(gt_cudnn_matmul(p, ops, &n, dss, k_again, dq, err));
    return gt_cudnn_graph(h, p, ops, n, graph, err);
}

/* The forward graph of one shape (key: b, hq, hkv, s, d, layout, causal) in the pool. */
static gt_status gt_cudnn_forward_graph(cudnnHandle_t h, gt_cudnn_pool *p, const int64_t *key,
                                        gt_cudnn_desc *graph, gt_error *err)
{
    const int64_t b = key[0], hq = key[1], hkv = key[2], s = key[3], d = key[4], dv = key[9];
    const bool layout1 = key[5] != 0, causal = key[6] != 0;
    const cudnnDataType_t bf = CUDNN_DATA_BFLOAT16, f32 = CUDNN_DATA_FLOAT;
    /* cuDNN's dims are [b, heads, s, d] whatever the layout; the strides place them. K enters
     * transposed ([d, s]). */
    const int64_t q_dim[4] = {b, hq, s, d}, kt_dim[4] = {b, hkv, d, s}, v_dim[4] = {b, hkv, s, dv};
    const int64_t o_dim[4] = {b, hq, s, dv};
    int64_t q_str[4], k_str[4], v_str[4], o_str[4];
    gt_cudnn_strides(hq, s, d, layout1, q_str);
    gt_cudnn_strides(hkv, s, d, layout1, k_str);
    gt_cudnn_strides(hkv, s, dv, layout1, v_str);
    gt_cudnn_strides(hq, s, dv, layout1, o_str);
    const int64_t kt_str[4] = {k_str[0], k_str[1], k_str[3], k_str[2]};
    const int64_t s_dim[4] = {b, hq, s, s}, s_str[4] = {hq * s * s, s * s, s, 1};
    const int64_t r_dim[4] = {b, hq, s, 1}, r_str[4] = {hq * s, s, 1, 1}, one[4] = {1, 1, 1, 1};
    int64_t vid = UID_VIRTUAL;
    gt_cudnn_desc q, kt, v, o, lse, scale, score, scaled, masked, mx, sub, ex, sum, lg, prob;
    GT_TRY(gt_cudnn_tensor(p, &q, UID_Q, bf, q_dim, q_str, false, false, false, err));
    GT_TRY(gt_cudnn_tensor(p, &kt, UID_K, bf, kt_dim, kt_str, false, false, false, err));
    GT_TRY(gt_cudnn_tensor(p, &v, UID_V, bf, v_dim, v_str, false, false, false, err));
    GT_TRY(gt_cudnn_tensor(p, &o, UID_O, bf, o_dim, o_str, false, false, false, err));
    GT_TRY(gt_cudnn_tensor(p, &lse, UID_STATS, f32, r_dim, r_str, false, false, false, err));
    GT_TRY(gt_cudnn_tensor(p, &scale, UID_SCALE, f32, one, one, false, true, false, err));
    GT_TRY(gt_cudnn_virtual(p, &vid, f32, s_dim, s_str, &score, err));
    GT_TRY(gt_cudnn_virtual(p, &vid, f32, s_dim, s_str, &scaled, err));
    GT_TRY(gt_cudnn_virtual(p, &vid, f32, r_dim, r_str, &mx, err));
    GT_TRY(gt_cudnn_virtual(p, &vid, f32, s_dim, s_str, &sub, err));
    GT_TRY(gt_cudnn_virtual(p, &vid, f32, s_dim, s_str, &ex, err));
    GT_TRY(gt_cudnn_virtual(p, &vid, f32, r_dim, r_str, &sum, err));
    GT_TRY(gt_cudnn_virtual(p, &vid, f32, r_dim, r_str, &lg, err));
    GT_TRY(gt_cudnn_tensor(p, &prob, vid++, bf, s_dim, s_str, true, false, true, err));
    gt_cudnn_desc ops[16];
    int n = 0;
    GT_TRY(gt_cudnn_matmul(p, ops, &n, q, kt, score, err));
    GT_TRY(gt_cudnn_pointwise(p, ops, &n, CUDNN_POINTWISE_MUL, f32, -1, score, scale, NULL, scaled,
                              err));
    masked = scaled;
    if (causal) GT_TRY(gt_cudnn_causal(p, ops, &n, &vid, s_dim, s_str, scaled, &masked, err));
    GT_TRY(gt_cudnn_reduction(p, ops, &n, CUDNN_REDUCE_TENSOR_MAX, masked, mx, err));
    GT_TRY(
        gt_cudnn_pointwise(p, ops, &n, CUDNN_POINTWISE_SUB, f32, -1, masked, mx, NULL, sub, err));
    GT_TRY(gt_cudnn_pointwise(p, ops, &n, CUDNN_POINTWISE_EXP, f32, -1, sub, NULL, NULL, ex, err));
    GT_TRY(gt_cudnn_reduction(p, ops, &n, CUDNN_REDUCE_TENSOR_ADD, ex, sum, err));
    GT_TRY(gt_cudnn_pointwise(p, ops, &n, CUDNN_POINTWISE_LOG, f32, -1, sum, NULL, NULL, lg, err));
    GT_TRY(gt_cudnn_pointwise(p, ops, &n, CUDNN_POINTWISE_ADD, f32, -1, mx, lg, NULL, lse, err));
    GT_TRY(gt_cudnn_pointwise(p, ops, &n, CUDNN_POINTWISE_DIV, f32, -1, ex, sum, NULL, prob, err));
    GT_TRY(gt_cudnn_matmul(p, ops, &n, prob, v, o, err));
    return gt_cudnn_graph(h, p, ops, n, graph, err);
}

/* GT_CUDNN_VERBOSE=1 in the environment: each engine config considered, its engine, numerical
 * notes and knobs, and whether its plan built, on stderr. */
static bool gt_cudnn_verbose(void)
{
    const char *v = getenv("GT_CUDNN_VERBOSE");
    return v && v[0] && strcmp(v, "0") != 0;
}

/* Whether engine carries no NONDETERMINISTIC note (verbose: its global index and notes). */
static bool gt_cudnn_engine_deterministic(gt_cudnn_desc engine, bool verbose)
{
    int64_t got = 0, n_notes = 0, index = -1;
    cudnnBackendNumericalNote_t notes[32];
    if (cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE,
                                 CUDNN_TYPE_NUMERICAL_NOTE, 32, &n_notes,
                                 notes) != CUDNN_STATUS_SUCCESS)
        return false;
    bool deterministic = true;
    for (int64_t k = 0; k < n_notes; k++)
        deterministic &= notes[k] != CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC;
    if (verbose) {
        cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &got,
                                 &index);
        fprintf(stderr, "cudnn:   engine %lld notes", (long long)index);
        for (int64_t k = 0; k < n_notes; k++)
            fprintf(stderr, " %d", (int)notes[k]);
        fprintf(stderr, "%s\n", deterministic ? "" : " (nondeterministic)");
    }
    return deterministic;
}

/* Builds the plan of engine config cfg into out->plan (left NULL where cuDNN refuses it). */
static void gt_cudnn_build_plan(cudnnHandle_t h, gt_cudnn_desc cfg, gt_cudnn_plan *out,
                                bool verbose)
{
    const cudnnBackendAttributeType_t D = CUDNN_TYPE_BACKEND_DESCRIPTOR;
    gt_cudnn_desc plan;
    int64_t got = 0;
    if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan) !=
        CUDNN_STATUS_SUCCESS)
        return;
    cudnnStatus_t st =
        cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, D, 1, &cfg);
    if (st == CUDNN_STATUS_SUCCESS) st = cudnnBackendFinalize(plan);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                      CUDNN_TYPE_INT64, 1, &got, &out->workspace);
    if (verbose) {
        char last[400] = "";
        if (st != CUDNN_STATUS_SUCCESS) cudnnGetLastErrorString(last, sizeof last);
        fprintf(stderr, "cudnn:   plan %s %s\n", cudnnGetErrorString(st), last);
    }
    if (st != CUDNN_STATUS_SUCCESS) {
        cudnnBackendDestroyDescriptor(plan);
        return;
    }
    out->plan = plan;
}

/* Up to max descriptors of a type into k; how many were made. */
static int gt_cudnn_make_n(cudnnBackendDescriptorType_t type, gt_cudnn_desc *k, int max)
{
    int made = 0;
    while (made < max && cudnnBackendCreateDescriptor(type, &k[made]) == CUDNN_STATUS_SUCCESS)
        made++;
    return made;
}

static void gt_cudnn_free_n(gt_cudnn_desc *k, int n)
{
    for (int i = 0; i < n; i++)
        cudnnBackendDestroyDescriptor(k[i]);
}

/* Knob choices and knob ranges, on stderr (GT_CUDNN_VERBOSE). */
static void gt_cudnn_print_knobs(gt_cudnn_desc cfg, gt_cudnn_desc engine)
{
    const cudnnBackendAttributeType_t D = CUDNN_TYPE_BACKEND_DESCRIPTOR;
    gt_cudnn_desc k[32];
    int64_t n = 0;
    int made = gt_cudnn_make_n(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR, k, 32);
    fprintf(stderr, "cudnn:   choices");
    if (cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, D, made, &n, k) ==
        CUDNN_STATUS_SUCCESS)
        for (int64_t i = 0; i < n; i++) {
            cudnnBackendKnobType_t t;
            int64_t v = 0, got;
            cudnnBackendGetAttribute(k[i], CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, CUDNN_TYPE_KNOB_TYPE,
                                     1, &got, &t);
            cudnnBackendGetAttribute(k[i], CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, CUDNN_TYPE_INT64, 1,
                                     &got, &v);
            fprintf(stderr, " %d=%lld", (int)t, (long long)v);
        }
    gt_cudnn_free_n(k, made);
    made = gt_cudnn_make_n(CUDNN_BACKEND_KNOB_INFO_DESCRIPTOR, k, 32);
    fprintf(stderr, "; ranges");
    if (cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_KNOB_INFO, D, made, &n, k) ==
        CUDNN_STATUS_SUCCESS)
        for (int64_t i = 0; i < n; i++) {
            cudnnBackendKnobType_t t;
            int64_t lo = 0, hi = 0, st = 0, got;
            cudnnBackendGetAttribute(k[i], CUDNN_ATTR_KNOB_INFO_TYPE, CUDNN_TYPE_KNOB_TYPE, 1, &got,
                                     &t);
            cudnnBackendGetAttribute(k[i], CUDNN_ATTR_KNOB_INFO_MINIMUM_VALUE, CUDNN_TYPE_INT64, 1,
                                     &got, &lo);
            cudnnBackendGetAttribute(k[i], CUDNN_ATTR_KNOB_INFO_MAXIMUM_VALUE, CUDNN_TYPE_INT64, 1,
                                     &got, &hi);
            cudnnBackendGetAttribute(k[i], CUDNN_ATTR_KNOB_INFO_STRIDE, CUDNN_TYPE_INT64, 1, &got,
                                     &st);
            fprintf(stderr, " %d:%lld..%lld/%lld", (int)t, (long long)lo, (long long)hi,
                    (long long)st);
        }
    fprintf(stderr, "\n");
    gt_cudnn_free_n(k, made);
}

/* A graph's plan: the first engine config the heuristics rank that is deterministic and builds
 * (verbose: every config listed, under `what`); *plan stays NULL when none builds. */
static gt_status gt_cudnn_first_plan(cudnnHandle_t h, gt_cudnn_pool *p, gt_cudnn_desc graph,
                                     const char *what, gt_cudnn_plan *out, bool verbose,
                                     gt_error *err)
{
    gt_cudnn_desc heur;
    cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    const cudnnBackendAttributeType_t D = CUDNN_TYPE_BACKEND_DESCRIPTOR;
    GT_TRY(gt_cudnn_new(p, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &heur, err));
    GT_TRY(gt_cudnn_set(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, D, 1, &graph, err));
    GT_TRY(gt_cudnn_set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, err));
    GT_CUDNN_TRY(cudnnBackendFinalize(heur));
    int64_t count = 0;
    GT_CUDNN_TRY(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, D, 0, &count, NULL));
    gt_cudnn_desc cfgs[16];
    if (count > 16) count = 16;
    for (int64_t i = 0; i < count; i++)
        GT_TRY(gt_cudnn_new(p, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &cfgs[i], err));
    if (count > 0)
        GT_CUDNN_TRY(
            cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, D, count, &count, cfgs));
    if (verbose)
        fprintf(stderr, "cudnn: %s graph, %lld engine configs (cuDNN %zu)\n", what,
                (long long)count, cudnnGetVersion());
    for (int64_t i = 0; i < count; i++) {
        gt_cudnn_desc engine;
        int64_t got = 0;
        GT_TRY(gt_cudnn_new(p, CUDNN_BACKEND_ENGINE_DESCRIPTOR, &engine, err));
        if (cudnnBackendGetAttribute(cfgs[i], CUDNN_ATTR_ENGINECFG_ENGINE, D, 1, &got, &engine) !=
                CUDNN_STATUS_SUCCESS ||
            !gt_cudnn_engine_deterministic(engine, verbose))
            continue;
        if (verbose) gt_cudnn_print_knobs(cfgs[i], engine);
        if (!out->plan) gt_cudnn_build_plan(h, cfgs[i], out, verbose);
        if (out->plan && !verbose) break;
    }
    return GT_OK;
}

static gt_status gt_cudnn_get(gt_cuda_stream *s, gt_error *err)
{
    if (s->cudnn) return GT_OK;
    struct gt_cudnn *c = (struct gt_cudnn *)calloc(1, sizeof *c);
    if (!c) return gt_error_set(err, GT_ERR_NOMEM, "sdpa on cuDNN: out of memory");
    cudnnStatus_t st = cudnnCreate(&c->handle);
    if (st == CUDNN_STATUS_SUCCESS) st = cudnnSetStream(c->handle, s->stream);
    if (st != CUDNN_STATUS_SUCCESS) {
        if (c->handle) cudnnDestroy(c->handle);
        free(c);
        return gt_cudnn_fail(st, "cudnnCreate", err);
    }
    s->cudnn = c;
    return GT_OK;
}

/* The plan of `key`, built and kept on first use (NULL plan: the shape falls back). */
static gt_status gt_cudnn_plan_of(gt_cuda_stream *s, const int64_t key[GT_CUDNN_KEY],
                                  gt_cudnn_plan **out, gt_error *err)
{
    GT_TRY(gt_cudnn_get(s, err));
    struct gt_cudnn *c = s->cudnn;
    for (int i = 0; i < c->n_plans; i++)
        if (memcmp(c->plans[i].key, key, sizeof c->plans[i].key) == 0) {
            *out = &c->plans[i];
            return GT_OK;
        }
    *out = NULL;
    if (c->n_plans == GT_CUDNN_PLANS) return GT_OK; /* more shapes than kept: graphtrain's kernel */
    gt_cudnn_plan *pl = &c->plans[c->n_plans];
    memset(pl, 0, sizeof *pl);
    memcpy(pl->key, key, sizeof pl->key);
    gt_cudnn_desc graph;
    gt_error why = {}; /* a graph cuDNN refuses is a shape it does not serve: no error */
    const bool verbose = gt_cudnn_verbose();
    const char *what = key[8] ? "backward" : "forward";
    gt_status built = key[8] ? gt_cudnn_backward_graph(c->handle, &pl->pool, key, &graph, &why)
                             : gt_cudnn_forward_graph(c->handle, &pl->pool, key, &graph, &why);
    if (built == GT_OK)
        built = gt_cudnn_first_plan(c->handle, &pl->pool, graph, what, pl, verbose, &why);
    if (built != GT_OK && verbose) fprintf(stderr, "cudnn: %s graph refused: %s\n", what, why.msg);
    if (!pl->plan) gt_cudnn_pool_free(&pl->pool);
    if (pl->plan && (size_t)pl->workspace > c->workspace_bytes) {
        gt_cuda_free(c->workspace);
        c->workspace = NULL;
        c->workspace_bytes = 0;
        GT_TRY(gt_cuda_malloc(&c->workspace, (size_t)pl->workspace, err));
        c->workspace_bytes = (size_t)pl->workspace;
    }
    c->n_plans++;
    *out = pl;
    return GT_OK;
}

/* The plan for call a (kind 0 forward, 1 backward), or NULL where cuDNN does not take it. */
static gt_status gt_cudnn_plan_for(gt_cuda_stream *s, const gt_cudnn_sdpa *a, int kind,
                                   gt_cudnn_plan **out, gt_error *err)
{
    *out = NULL;
    if (a->positions) return GT_OK; /* block-causal: graphtrain's flash kernels take it */
    if (s->cudnn_off || a->d < 64 || a->d > 256 || a->d % 8 || a->d_v < 64 || a->d_v > 256 ||
        a->d_v % 8 || a->s != a->t)
        return GT_OK;
    float scale = (float)a->scale;
    int32_t scale_bits;
    memcpy(&scale_bits, &scale, sizeof scale_bits);
    const int64_t key[GT_CUDNN_KEY] = {a->b,      a->hq,     a->hkv,     a->s, a->d,
                                       a->layout, a->causal, scale_bits, kind, a->d_v};
    gt_cudnn_plan *pl;
    GT_TRY(gt_cudnn_plan_of(s, key, &pl, err));
    if (pl && pl->plan) *out = pl;
    return GT_OK;
}

/* Runs plan pl with the n (uid, pointer) pairs. */
static gt_status gt_cudnn_execute(gt_cuda_stream *s, const gt_cudnn_plan *pl, int64_t n,
                                  const int64_t *uids, void *const *ptrs, const char *what,
                                  gt_error *err)
{
    struct gt_cudnn *c = s->cudnn;
    gt_cudnn_desc pack;
    GT_CUDNN_TRY(cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack));
    cudnnStatus_t st = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS,
                                                CUDNN_TYPE_INT64, n, uids);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
                                      CUDNN_TYPE_VOID_PTR, n, ptrs);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR,
                                      1, &c->workspace);
    if (st == CUDNN_STATUS_SUCCESS) st = cudnnBackendFinalize(pack);
    if (st == CUDNN_STATUS_SUCCESS) st = cudnnBackendExecute(c->handle, pl->plan, pack);
    cudnnBackendDestroyDescriptor(pack);
    return st == CUDNN_STATUS_SUCCESS ? GT_OK : gt_cudnn_fail(st, what, err);
}

gt_status gt_cudnn_sdpa_forward(gt_cuda_stream *s, const gt_cudnn_sdpa *a, bool *ran, gt_error *err)
{
    *ran = false;
    gt_cudnn_plan *pl;
    GT_TRY(gt_cudnn_plan_for(s, a, 0, &pl, err));
    if (!pl) return GT_OK;
    float scale = a->scale, mask_value = -1e20f;
    const int64_t uids[7] = {UID_Q, UID_K, UID_V, UID_O, UID_STATS, UID_SCALE, UID_MASK_VALUE};
    void *const ptrs[7] = {(void *)a->q, (void *)a->k, (void *)a->v, a->out,
                           a->lse,       &scale,       &mask_value};
    GT_TRY(gt_cudnn_execute(s, pl, a->causal ? 7 : 6, uids, ptrs, "sdpa forward", err));
    *ran = true;
    return GT_OK;
}

/* x rounded up to 256 bytes (the scratch's pieces start aligned). */
static size_t gt_cudnn_align(size_t x)
{
    return (x + 255) / 256 * 256;
}

/* Whether n bytes at device pointers x and y are the same (through the host). */
static gt_status gt_cudnn_same_bytes(gt_cuda_stream *s, const void *x, const void *y, size_t n,
                                     bool *same, gt_error *err)
{
    /* the runs compared, and every kernel before them, done through the stream's drain */
    GT_TRY(gt_cuda_stream_drain(s, err));
    char *h = (char *)malloc(2 * n);
    if (!h) return gt_error_set(err, GT_ERR_NOMEM, "sdpa backward on cuDNN: out of host memory");
    cudaError_t e = cudaMemcpyAsync(h, x, n, cudaMemcpyDeviceToHost, s->stream);
    if (e == cudaSuccess) e = cudaMemcpyAsync(h + n, y, n, cudaMemcpyDeviceToHost, s->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(s->stream);
    *same = e == cudaSuccess && memcmp(h, h + n, n) == 0;
    free(h);
    if (e != cudaSuccess)
        return gt_error_set(err, GT_ERR_INTERNAL, "sdpa backward on cuDNN: checking its bits: %s",
                            cudaGetErrorString(e));
    return GT_OK;
}

gt_status gt_cudnn_sdpa_backward(gt_cuda_stream *s, const gt_kernel_call *c, const gt_cudnn_sdpa *a,
                                 bool *ran, gt_error *err)
{
    *ran = false;
    gt_cudnn_plan *pl;
    GT_TRY(gt_cudnn_plan_for(s, a, 1, &pl, err));
    if (!pl || pl->checked < 0) return GT_OK;
    /* the scratch: the row sums D ([b, hq, s] f32) and, on a plan's first run, a second dq, dk,
     * dv */
    size_t rows = (size_t)(a->b * a->hq * a->s), sums = gt_cudnn_align(rows * sizeof(float));
    size_t nq = rows * (size_t)a->d * 2, nk = (size_t)(a->b * a->hkv * a->s * a->d) * 2,
           nv = (size_t)(a->b * a->hkv * a->s * a->d_v) * 2, nq_al = gt_cudnn_align(nq),
           nk_al = gt_cudnn_align(nk), nv_al = gt_cudnn_align(nv);
    void *scr;
    GT_TRY(gt_cuda_scratch(s, c, sums + (pl->checked ? 0 : nq_al + nk_al + nv_al), &scr, err));
    char *again = (char *)scr + sums;
    float scale = a->scale, mask_value = -1e20f, unit = 1.0f;
    const int64_t uids[13] = {UID_Q,     UID_K,  UID_V,         UID_O,     UID_DO,
                              UID_STATS, UID_DQ, UID_ROW_SUM,   UID_SCALE, UID_ONE,
                              UID_DK,    UID_DV, UID_MASK_VALUE};
    void *ptrs[13] = {(void *)a->q, (void *)a->k, (void *)a->v, a->out, (void *)a->g,
                      a->lse,       a->dq,        scr,          &scale, &unit,
                      a->dk,        a->dv,        &mask_value};
    const int n_io = a->causal ? 13 : 12, iq = 6, ik = 10, iv = 11;
    GT_TRY(gt_cudnn_execute(s, pl, n_io, uids, ptrs, "sdpa backward", err));
    if (!pl->checked) {
        /* The first run of a plan (a warm-up, never captured) runs twice and compares: a
         * configuration whose bits differ is dropped for graphtrain's kernels, for good. */
        ptrs[iq] = again, ptrs[ik] = again + nq_al, ptrs[iv] = again + nq_al + nk_al;
        GT_TRY(gt_cudnn_execute(s, pl, n_io, uids, ptrs, "sdpa backward", err));
        bool sq, sk, sv;
        GT_TRY(gt_cudnn_same_bytes(s, a->dq, ptrs[iq], nq, &sq, err));
        GT_TRY(gt_cudnn_same_bytes(s, a->dk, ptrs[ik], nk, &sk, err));
        GT_TRY(gt_cudnn_same_bytes(s, a->dv, ptrs[iv], nv, &sv, err));
        pl->checked = sq && sk && sv ? 1 : -1;
        if (gt_cudnn_verbose())
            fprintf(stderr,
                    "cudnn: backward b %lld hq %lld hkv %lld s %lld d %lld dv %lld: two runs %s\n",
                    (long long)a->b, (long long)a->hq, (long long)a->hkv, (long long)a->s,
                    (long long)a->d, (long long)a->d_v,
                    pl->checked > 0 ? "the same" : "differ: graphtrain's kernels");
        if (pl->checked < 0) return GT_OK;
    }
    *ran = true;
    return GT_OK;
}

void gt_cudnn_free(struct gt_cudnn *c)
{
    if (!c) return;
    for (int i = 0; i < c->n_plans; i++) {
        if (c->plans[i].plan) cudnnBackendDestroyDescriptor(c->plans[i].plan);
        gt_cudnn_pool_free(&c->plans[i].pool);
    }
    gt_cuda_free(c->workspace);
    cudnnDestroy(c->handle);
    free(c);
}

extern "C" bool gt_cuda_have_cudnn(void)
{
    return true;
}

#else /* no cuDNN: graphtrain's own kernels */

gt_status gt_cudnn_sdpa_forward(gt_cuda_stream *s, const gt_cudnn_sdpa *a, bool *ran, gt_error *err)
{
    (void)s, (void)a, (void)err;
    *ran = false;
    return GT_OK;
}

gt_status gt_cudnn_sdpa_backward(gt_cuda_stream *s, const gt_kernel_call *c, const gt_cudnn_sdpa *a,
                                 bool *ran, gt_error *err)
{
    (void)s, (void)c, (void)a, (void)err;
    *ran = false;
    return GT_OK;
}

void gt_cudnn_free(struct gt_cudnn *c)
{
    (void)c;
}

extern "C" bool gt_cuda_have_cudnn(void)
{
    return false;
}

#endif

extern "C" void gt_cuda_stream_set_cudnn(gt_cuda_stream *s, bool on)
{
    s->cudnn_off = !on;
}
