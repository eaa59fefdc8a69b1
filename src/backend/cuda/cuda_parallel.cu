/* cuda_parallel.cu — the parallel ops on CUDA.
 *
 * Collectives (all_gather_start, reduce_scatter_start, all_reduce_start, all_to_all_start,
 * send_start, recv_start, wait)
 * are not kernels: the CUDA program runs them through its NCCL communicators
 * (src/runtime/exec_cuda.c).
 *
 * The vocabulary-parallel local ops (gt_ops.def; the CPU kernels in src/backend/cpu/cpu_shard.c are
 * the reference). A rank holds vocabulary rows [start, start + Vl). Every sum has an order fixed by
 * the shapes alone, and no floating-point atomics are used:
 *   embedding_shard: one block per token copies its row (in the widest unit the row's bytes and
 *     pointers allow) or writes zero bytes for an id outside the rank's rows.
 *   embedding_shard_backward: embedding_backward's kernels (gt_cuda_embedding_grad, cuda_layout.cu)
 *     on local ids; ids outside the rank's rows sort past them and add nowhere. Rows are summed in
 *     increasing position — the token order of the CPU's scatter-add, so f32 results are bitwise
 *     the CPU's.
 *   logsumexp: one block per row: max (NaN propagates), then sum_j exp(x_j - max) in double over a
 *     fixed tree, lse = max + log(sum) — the CPU's formula up to the order of the double sum.
 *   cross_entropy_shard: one block: per row lse_i - x_i[t_i - start] in double for the rows whose
 *     target is this rank's, summed and counted over a fixed tree; loss = total / count.
 *   cross_entropy_shard_backward: a one-block count of the non-ignored rows, then one block per
 *     row: dlogits_ij = coef exp(x_ij - lse_i) - [j == t_i - start] coef, coef = dloss / count,
 *     exp in f32 (the target column's difference in double, as the CPU).
 * A target that is negative and not the ignore_index is flagged on the stream's error word (the
 * CPU kernel rejects it before computing). */
#include "cuda_internal.h"

#define GT_PAR_THREADS 256

gt_status gt_cuda_all_gather_start(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    (void)s;
    return gt_error_set(err, GT_ERR_UNSUPPORTED,
                        "%s: a collective is not a kernel: run it in a CUDA program with NCCL "
                        "communicators (gt_cuda_program_set_comms)",
                        gt_op_get(c->op)->name);
}

gt_status gt_cuda_reduce_scatter_start(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    return gt_cuda_all_gather_start(s, c, err);
}

gt_status gt_cuda_all_reduce_start(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    return gt_cuda_all_gather_start(s, c, err);
}

gt_status gt_cuda_all_to_all_start(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    return gt_cuda_all_gather_start(s, c, err);
}

gt_status gt_cuda_send_start(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    return gt_cuda_all_gather_start(s, c, err);
}

gt_status gt_cuda_recv_start(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    return gt_cuda_all_gather_start(s, c, err);
}

gt_status gt_cuda_wait(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    return gt_cuda_all_gather_start(s, c, err);
}

/* ---------------------------------------------------------------- shared helpers */

static unsigned gt_par_grid(int64_t rows)
{
    return (unsigned)(rows < 1 ? 1 : rows < 65536 ? rows : 65536);
}

/* ---------------------------------------------------------------- embedding_shard */

/* out[p, :] = w[id - start, :] for an id among the rank's rows, else zero bytes; units of U. */
template <typename U>
__global__ void gt_k_embedding_shard(int64_t n, int64_t row_units, const U *w, int64_t start,
                                     int64_t vl, const void *ids, int dids, U *out)
{
    for (int64_t p = blockIdx.x; p < n; p += gridDim.x) {
        int64_t local = gt_ld_index(ids, dids, p) - start;
        bool mine = local >= 0 && local < vl;
        for (int64_t u = threadIdx.x; u < row_units; u += blockDim.x) {
            U v;
            if (mine)
                v = w[local * row_units + u];
            else
                memset(&v, 0, sizeof v);
            out[p * row_units + u] = v;
        }
    }
}

template <typename U>
static void gt_launch_embedding_shard(cudaStream_t st, int64_t n, int64_t row_units, const void *w,
                                      int64_t start, int64_t vl, const gt_tensor *ids, void *out)
{
    unsigned threads = row_units >= 256 ? 256 : (unsigned)((row_units + 31) / 32 * 32);
    gt_k_embedding_shard<U><<<gt_par_grid(n), threads, 0, st>>>(
        n, row_units, (const U *)w, start, vl, ids->data, ids->dtype, (U *)out);
}

gt_status gt_cuda_embedding_shard(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    const gt_tensor *w = c->in[0], *ids = c->in[1];
    gt_tensor *out = c->out[0];
    GT_TRY(gt_kernel_want_float(c, w, "w", err));
    GT_TRY(gt_kernel_want_embedding(c, err));
    int64_t vl = w->shape[0], d = w->shape[1], start = c->e[0];
    int64_t n = gt_tensor_numel(ids);
    if (n * d == 0) return GT_OK;
    int64_t row = d * (int64_t)gt_dtype_size(w->dtype);
    uint64_t g = (uint64_t)row | (uintptr_t)w->data | (uintptr_t)out->data;
    cudaStream_t st = s->stream;
    if ((g & 15u) == 0)
        gt_launch_embedding_shard<uint4>(st, n, row / 16, w->data, start, vl, ids, out->data);
    else if ((g & 7u) == 0)
        gt_launch_embedding_shard<uint2>(st, n, row / 8, w->data, start, vl, ids, out->data);
    else if ((g & 3u) == 0)
        gt_launch_embedding_shard<uint32_t>(st, n, row / 4, w->data, start, vl, ids, out->data);
    else
        gt_launch_embedding_shard<uint16_t>(st, n, row / 2, w->data, start, vl, ids, out->data);
    return gt_cuda_launched(c, err);
}

/* ---------------------------------------------------------------- embedding_shard_backward */

gt_status gt_cuda_embedding_shard_backward(gt_cuda_stream *s, const gt_kernel_call *c,
                                           gt_error *err)
{
    const gt_tensor *ids = c->in[0], *dy = c->in[1];
    gt_tensor *dw = c->out[0];
    GT_TRY(gt_kernel_want_float(c, dy, "dy", err));
    GT_TRY(gt_kernel_want_float(c, dw, "dw", err));
    GT_TRY(gt_kernel_want_embedding_backward(c, err));
    int64_t vl = dw->shape[0], d = dw->shape[1], start = c->e[1];
    if (vl * d == 0) return GT_OK;
    int64_t n = gt_tensor_numel(ids);
    if (vl >= 0x7fffffff || n >= 0x7fffffff)
        return gt_error_set(err, GT_ERR_UNSUPPORTED,
                            "embedding_shard_backward: %lld rows or %lld ids exceed 2^31 - 2",
                            (long long)vl, (long long)n);
    /* ids of other ranks' rows are not errors here: they sort past this rank's rows */
    return gt_cuda_embedding_grad(s, c, ids, dy, dw, start, false, err);
}

/* ---------------------------------------------------------------- logsumexp */

__global__ void __launch_bounds__(GT_PAR_THREADS)
    gt_k_logsumexp(int64_t rows, int64_t v, const void *x, int dx, void *out, int dout)
{
    __shared__ float shf[GT_PAR_THREADS];
    __shared__ double shd[GT_PAR_THREADS];
    for (int64_t i = blockIdx.x; i < rows; i += gridDim.x) {
        int64_t base = i * v;
        float m = -INFINITY;
        for (int64_t j = threadIdx.x; j < v; j += blockDim.x)
            m = gt_nanmax(gt_ld(x, dx, base + j), m);
        m = gt_block_max(m, shf);
        double sum = 0.0;
        if (!isnan(m) && !isinf(m))
            for (int64_t j = threadIdx.x; j < v; j += blockDim.x)
                sum += (double)expf(gt_ld(x, dx, base + j) - m);
        sum = gt_block_sum(sum, shd);
        if (threadIdx.x == 0)
            gt_st(out, dout, i, isnan(m) || isinf(m) ? m : (float)((double)m + log(sum)));
    }
}

gt_status gt_cuda_logsumexp(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    const gt_tensor *x = c->in[0];
    gt_tensor *out = c->out[0];
    GT_TRY(gt_kernel_want_float(c, x, "x", err));
    GT_TRY(gt_kernel_want_float(c, out, "output", err));
    bool ok = x->ndim >= 1 && out->ndim == x->ndim - 1;
    for (int k = 0; ok && k < out->ndim; k++)
        ok = out->shape[k] == x->shape[k];
    if (!ok) return gt_cuda_shape_error(c, "expected x [..., V] and output [...]", err);
    int64_t v = x->shape[x->ndim - 1], rows = gt_tensor_numel(out);
    if (rows == 0) return GT_OK;
    gt_k_logsumexp<<<gt_par_grid(rows), GT_PAR_THREADS, 0, s->stream>>>(rows, v, x->data, x->dtype,
                                                                        out->data, out->dtype);
    return gt_cuda_launched(c, err);
}

/* ---------------------------------------------------------------- cross_entropy_shard */

static gt_status gt_cuda_ce_shard_check(const gt_kernel_call *c, gt_error *err)
{
    GT_TRY(gt_kernel_want_attrs(c, 1, 0, 1, err));
    const gt_tensor *logits = c->in[0], *targets = c->in[1], *lse = c->in[2];
    GT_TRY(gt_kernel_want_float(c, logits, "logits", err));
    GT_TRY(gt_kernel_want_index(c, targets, "targets", err));
    GT_TRY(gt_kernel_want_float(c, lse, "lse", err));
    GT_TRY(gt_kernel_want_rank(c, logits, "logits", 2, err));
    GT_TRY(gt_kernel_want_rank(c, targets, "targets", 1, err));
    GT_TRY(gt_kernel_want_rank(c, lse, "lse", 1, err));
    if (targets->shape[0] != logits->shape[0] || lse->shape[0] != logits->shape[0])
        return gt_cuda_shape_error(c, "expected logits [N, Vl], targets [N], lse [N]", err);
    return GT_OK;
}

/* One block: total = sum over the rows with a target of this rank of lse_i - x_i[t_i - start]
 * (double), count = rows whose target is not ignored; out = total / count (NaN for 0 / 0).
 * Negative targets that are not ignored are flagged. */
__global__ void __launch_bounds__(GT_PAR_THREADS)
    gt_k_ce_shard(int64_t rows, int64_t vl, int64_t start, int64_t ignore, const void *x, int dx,
                  const void *tg, int dt, const void *lse, int dl, void *out, int dout,
                  unsigned long long *flag)
{
    __shared__ double sh[GT_PAR_THREADS];
    double total = 0.0, count = 0.0;
    for (int64_t i = threadIdx.x; i < rows; i += blockDim.x) {
        int64_t t = gt_ld_index(tg, dt, i);
        if (t == ignore) continue;
        if (t < 0) {
            gt_flag(flag, GT_OP_CROSS_ENTROPY_SHARD, i, start + vl);
            continue;
        }
        count += 1.0;
        int64_t local = t - start;
        if (local >= 0 && local < vl)
            total += (double)gt_ld(lse, dl, i) - (double)gt_ld(x, dx, i * vl + local);
    }
    total = gt_block_sum(total, sh);
    count = gt_block_sum(count, sh); /* integers below 2^53: exact in any order */
    if (threadIdx.x == 0) gt_st(out, dout, 0, (float)(total / count));
}

gt_status gt_cuda_cross_entropy_shard(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    GT_TRY(gt_cuda_ce_shard_check(c, err));
    const gt_tensor *logits = c->in[0], *targets = c->in[1], *lse = c->in[2];
    gt_tensor *out = c->out[0];
    GT_TRY(gt_kernel_want_float(c, out, "output", err));
    GT_TRY(gt_kernel_want_rank(c, out, "output", 0, err));
    gt_k_ce_shard<<<1, GT_PAR_THREADS, 0, s->stream>>>(
        logits->shape[0], logits->shape[1], c->e[0], c->i[0], logits->data, logits->dtype,
        targets->data, targets->dtype, lse->data, lse->dtype, out->data, out->dtype, s->flag);
    return gt_cuda_launched(c, err);
}

/* One block: the rows whose target is not ignored (negative ones flagged, not counted). */
__global__ void __launch_bounds__(GT_PAR_THREADS)
    gt_k_ce_shard_count(int64_t rows, int64_t limit, int64_t ignore, const void *tg, int dt,
                        int64_t *n_valid, unsigned long long *flag)
{
    __shared__ double sh[GT_PAR_THREADS];
    double count = 0.0;
    for (int64_t i = threadIdx.x; i < rows; i += blockDim.x) {
        int64_t t = gt_ld_index(tg, dt, i);
        if (t != ignore && t < 0) gt_flag(flag, GT_OP_CROSS_ENTROPY_SHARD_BACKWARD, i, limit);
        count += t != ignore && t >= 0 ? 1.0 : 0.0;
    }
    count = gt_block_sum(count, sh);
    if (threadIdx.x == 0) *n_valid = (int64_t)count;
}

/* Block per row i: dlogits_ij = coef e_ij - [j == t_i - start] coef, e_ij = exp(x_ij - lse_i);
 * zeros for ignored rows (or no valid row at all). */
__global__ void __launch_bounds__(GT_PAR_THREADS)
    gt_k_ce_shard_bwd(int64_t rows, int64_t vl, int64_t start, int64_t ignore, const void *x,
                      int dx, const void *tg, int dt, const void *lse, int dl, const void *dloss,
                      int ddl, const int64_t *n_valid, void *g, int dg)
{
    int64_t nv = *n_valid;
    double coef = nv > 0 ? (double)gt_ld(dloss, ddl, 0) / (double)nv : 0.0;
    float coef_f = (float)coef;
    for (int64_t i = blockIdx.x; i < rows; i += gridDim.x) {
        int64_t t = gt_ld_index(tg, dt, i), base = i * vl, local = t - start;
        bool zero = t == ignore || t < 0 || nv == 0; /* uniform over the block */
        float li = zero ? 0.0f : gt_ld(lse, dl, i);
        for (int64_t j = threadIdx.x; j < vl; j += blockDim.x) {
            float r = 0.0f;
            if (!zero) {
                float e = expf(gt_ld(x, dx, base + j) - li);
                r = j == local ? (float)((double)e * coef - coef) : e * coef_f;
            }
            gt_st(g, dg, base + j, r);
        }
    }
}

gt_status gt_cuda_cross_entropy_shard_backward(gt_cuda_stream *s, const gt_kernel_call *c,
                                               gt_error *err)
{
    GT_TRY(gt_cuda_ce_shard_check(c, err));
    const gt_tensor *logits = c->in[0], *targets = c->in[1], *lse = c->in[2], *dloss = c->in[3];
    gt_tensor *dx = c->out[0];
    GT_TRY(gt_kernel_want_float(c, dloss, "dloss", err));
    GT_TRY(gt_kernel_want_float(c, dx, "dlogits", err));
    GT_TRY(gt_kernel_want_same_shape(c, logits, "logits", dx, "dlogits", err));
    if (gt_tensor_numel(dloss) != 1) return gt_cuda_shape_error(c, "dloss must be a scalar", err);
    int64_t rows = logits->shape[0], vl = logits->shape[1], start = c->e[0], ig = c->i[0];
    if (rows == 0 || vl == 0) return GT_OK;
    void *scr;
    GT_TRY(gt_cuda_scratch(s, c, sizeof(int64_t), &scr, err));
    int64_t *n_valid = (int64_t *)scr;
    gt_k_ce_shard_count<<<1, GT_PAR_THREADS, 0, s->stream>>>(rows, start + vl, ig, targets->data,
                                                             targets->dtype, n_valid, s->flag);
    GT_TRY(gt_cuda_launched(c, err));
    gt_k_ce_shard_bwd<<<gt_par_grid(rows), GT_PAR_THREADS, 0, s->stream>>>(
        rows, vl, start, ig, logits->data, logits->dtype, targets->data, targets->dtype, lse->data,
        lse->dtype, dloss->data, dloss->dtype, n_valid, dx->data, dx->dtype);
    return gt_cuda_launched(c, err);
}
