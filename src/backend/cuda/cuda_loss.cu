/* cuda_loss.cu — cross_entropy and cross_entropy_backward: one block of GT_CE_THREADS per row of
 * logits [N, V] (a row is a whole vocabulary: 128256 values for llama3).
 *
 * A row is read with 16-byte vector loads (8 bf16 / f16 or 4 f32 values; the few elements before
 * the first aligned vector and after the last one singly), four vectors in flight per thread.
 * Each thread keeps an online softmax state over its values in index order, in f32:
 *     m = running max,  s = sum_j exp(x_j - m);  on a new max m': s <- s exp(m - m').
 * The block then combines the per-thread states in a fixed order (warp xor butterflies, then the
 * warp results in order):
 *     M = max_t m_t,  sum = sum_t s_t exp(m_t - M)  (double),  lse = M + log(sum),
 * the CPU's max-then-sum log-sum-exp up to f32 rounding, in a single read of the row.
 *   forward:  loss_i = lse_i - x_i[t_i] (double) per row; one block adds the rows in a fixed order
 *             and divides by the valid count.
 *   backward: a second pass over the row writes dlogits_ij = e_ij coef / sum - [j == t_i] coef,
 *             e_ij = exp(x_ij - M), coef = dloss / n_valid; ignored rows get zeros. The pass runs
 *             over the row back to front, so the vectors read last by the first pass (most likely
 *             still in L2) are read first; dlogits are stored with the streaming hint so they do
 *             not push the row out of L2.
 * exp(x - M) is exp2f(x log2 e - M log2 e) (one fma and the ex2 unit). Every sum has an order
 * fixed by the shape and the block size alone, so results are bitwise identical run to run. */
#include "cuda_internal.h"

/* 256 threads per row (measured on an H200 at [16384, 128256] bf16: 2-10 % faster than 512 or 1024
 * threads; 8 vectors in flight slower than 4) */
#define GT_CE_THREADS 256
#define GT_CE_WARPS (GT_CE_THREADS / 32)
#define GT_CE_UNROLL 4 /* vectors in flight per thread */

static constexpr float GT_CE_LOG2E = 1.4426950408889634f;

/* ---------------------------------------------------------------- row statistics */

/* Adds n values to the online state (m, s). Values that are all -inf so far add nothing (their
 * exp is 0 against any finite max; a row that is -inf throughout is made NaN by the caller, as
 * the CPU's exp(-inf - -inf) is). NaN propagates through m and s. */
template <int N> __device__ __forceinline__ void gt_ce_acc(float &m, float &s, const float *f)
{
    float lm = m;
#pragma unroll
    for (int k = 0; k < N; k++)
        lm = gt_nanmax(f[k], lm);
    if (lm == -INFINITY) return;
    if (lm != m) { /* a new max (or NaN): rescale the sum so far; exp(-inf) = 0 when m = -inf */
        s *= exp2f((m - lm) * GT_CE_LOG2E);
        m = lm;
    }
    float c = -m * GT_CE_LOG2E;
#pragma unroll
    for (int k = 0; k < N; k++)
        s += exp2f(fmaf(f[k], GT_CE_LOG2E, c));
}

/* Fixed-order block max / double sum (GT_CE_THREADS threads): a xor butterfly in each warp
 * (commutative steps: every lane ends with the same bits), the warp results in warp order through
 * shared memory, the same butterfly again. Every thread gets the result. */
__device__ __forceinline__ float gt_ce_block_max(float v, float *sh)
{
    for (int o = 16; o > 0; o >>= 1)
        v = gt_nanmax(v, __shfl_xor_sync(0xffffffffu, v, o));
    int lane = threadIdx.x % 32;
    if (lane == 0) sh[threadIdx.x / 32] = v;
    __syncthreads();
    v = lane < GT_CE_WARPS ? sh[lane] : -INFINITY;
    for (int o = 16; o > 0; o >>= 1)
        v = gt_nanmax(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads(); /* sh is free again */
    return v;
}

__device__ __forceinline__ double gt_ce_block_sum(double v, double *sh)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    int lane = threadIdx.x % 32;
    if (lane == 0) sh[threadIdx.x / 32] = v;
    __syncthreads();
    v = lane < GT_CE_WARPS ? sh[lane] : 0.0;
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    return v;
}

/* The row's elements: `head` single values [0, head) up to the first 16-byte boundary, nvec
 * vectors of V values, single values [tail0, v) after them. */
typedef struct {
    int64_t head, nvec, tail0;
} gt_ce_split;

template <typename T>
__device__ __forceinline__ gt_ce_split gt_ce_row_split(int64_t base, int64_t v)
{
    constexpr int V = gt_vec16<T>::n;
    gt_ce_split r;
    r.head = (V - base % V) % V; /* the tensor starts on a 16-byte boundary (host-checked) */
    if (r.head > v) r.head = v;
    r.nvec = (v - r.head) / V;
    r.tail0 = r.head + r.nvec * V;
    return r;
}

/* M and sum (see the top) of row x[base .. base + v). */
template <typename T>
__device__ __forceinline__ void gt_ce_row_stats(const void *x, int dx, int64_t base, int64_t v,
                                                float *M, double *sum, float *shf, double *shd)
{
    typedef gt_vec16<T> io;
    constexpr int V = io::n, U = GT_CE_UNROLL, NT = GT_CE_THREADS;
    gt_ce_split sp = gt_ce_row_split<T>(base, v);
    float m = -INFINITY, s = 0.0f;
    int tid = threadIdx.x;
    if (tid < sp.head) { /* head < V <= 8 values: threads 0.. take one each */
        float f = gt_ld(x, dx, base + tid);
        gt_ce_acc<1>(m, s, &f);
    }
    int64_t b0 = base + sp.head, k = tid;
    for (; k + (U - 1) * NT < sp.nvec; k += U * NT) {
        typename io::raw r[U];
#pragma unroll
        for (int u = 0; u < U; u++)
            r[u] = io::ld(x, dx, b0 + (k + u * NT) * V);
#pragma unroll
        for (int u = 0; u < U; u++) {
            float f[V];
            io::to_f32(r[u], f);
            gt_ce_acc<V>(m, s, f);
        }
    }
    for (; k < sp.nvec; k += NT) {
        float f[V];
        io::to_f32(io::ld(x, dx, b0 + k * V), f);
        gt_ce_acc<V>(m, s, f);
    }
    if (sp.tail0 + tid < v) {
        float f = gt_ld(x, dx, base + sp.tail0 + tid);
        gt_ce_acc<1>(m, s, &f);
    }
    float mx = gt_ce_block_max(m, shf);
    /* s = 0 exactly when this thread saw only -inf (m = -inf): no term, not 0 * exp(NaN) */
    double part = s == 0.0f ? 0.0 : (double)(s * exp2f((m - mx) * GT_CE_LOG2E));
    double sm = gt_ce_block_sum(part, shd);
    *M = mx;
    *sum = mx == -INFINITY ? (double)NAN : sm;
}

/* ---------------------------------------------------------------- kernels */

/* Per row: loss_i = lse_i - x_i[t_i] (double) and valid_i (0 for ignored or bad targets). */
template <typename T>
__global__ void __launch_bounds__(GT_CE_THREADS)
    gt_k_ce_fwd(int64_t rows, int64_t v, const void *x, int dx, const void *tg, int dt,
                int64_t ignore, double *loss, int64_t *valid, unsigned long long *flag)
{
    __shared__ float shf[GT_CE_WARPS];
    __shared__ double shd[GT_CE_WARPS];
    for (int64_t i = blockIdx.x; i < rows; i += gridDim.x) {
        int64_t t = gt_ld_index(tg, dt, i), base = i * v;
        bool bad = t != ignore && (t < 0 || t >= v);
        if (bad && threadIdx.x == 0) gt_flag(flag, GT_OP_CROSS_ENTROPY, i, v);
        if (t == ignore || bad) {
            if (threadIdx.x == 0) {
                loss[i] = 0.0;
                valid[i] = 0;
            }
            continue;
        }
        float M;
        double sum;
        gt_ce_row_stats<T>(x, dx, base, v, &M, &sum, shf, shd);
        if (threadIdx.x == 0) {
            loss[i] = (double)M + log(sum) - (double)gt_ld(x, dx, base + t);
            valid[i] = 1;
        }
    }
}

/* dlogits of the values j .. j + N - 1 of a row (f: the logits in, the gradient out). */
template <int N>
__device__ __forceinline__ void gt_ce_grad(float *f, int64_t j, int64_t t, float c, float scale,
                                           double scale_d, double coef, bool zero)
{
#pragma unroll
    for (int k = 0; k < N; k++) {
        float e = exp2f(fmaf(f[k], GT_CE_LOG2E, c));
        /* the target column: e coef / sum - coef in double, as the CPU */
        f[k] = zero ? 0.0f : j + k == t ? (float)((double)e * scale_d - coef) : e * scale;
    }
}

/* dlogits row by row; coef = dloss / n_valid is read from device memory (n_valid: ce_count).
 * LOSS (cross_entropy_with_grad): also loss_i and valid_i as gt_k_ce_fwd writes them, from the
 * same row statistics. */
template <typename T, bool LOSS>
__global__ void __launch_bounds__(GT_CE_THREADS)
    gt_k_ce_bwd(int64_t rows, int64_t v, const void *x, int dx, const void *tg, int dt,
                int64_t ignore, const int64_t *n_valid, const void *dloss, int ddl, void *g, int dg,
                unsigned long long *flag, double *loss, int64_t *valid)
{
    typedef gt_vec16<T> io;
    constexpr int V = io::n, U = GT_CE_UNROLL, NT = GT_CE_THREADS;
    __shared__ float shf[GT_CE_WARPS];
    __shared__ double shd[GT_CE_WARPS];
    int64_t nv = *n_valid;
    double coef = nv > 0 ? (double)gt_ld(dloss, ddl, 0) / (double)nv : 0.0;
    int tid = threadIdx.x;
    for (int64_t i = blockIdx.x; i < rows; i += gridDim.x) {
        int64_t t = gt_ld_index(tg, dt, i), base = i * v;
        bool bad = t != ignore && (t < 0 || t >= v);
        if (bad && tid == 0)
            gt_flag(flag, LOSS ? GT_OP_CROSS_ENTROPY_WITH_GRAD : GT_OP_CROSS_ENTROPY_BACKWARD, i,
                    v);
        bool zero = t == ignore || bad || nv == 0; /* uniform over the block */
        float M = 0.0f;
        double sum = 1.0;
        if (!zero) gt_ce_row_stats<T>(x, dx, base, v, &M, &sum, shf, shd);
        if (LOSS && tid == 0) {
            loss[i] = zero ? 0.0 : (double)M + log(sum) - (double)gt_ld(x, dx, base + t);
            valid[i] = zero ? 0 : 1;
        }
        double scale_d = coef / sum;
        float scale = (float)scale_d, c = -M * GT_CE_LOG2E;
        gt_ce_split sp = gt_ce_row_split<T>(base, v);
        /* back to front: vector nvec - 1 - r for r = tid, tid + NT, ... */
        int64_t b0 = base + sp.head, r = tid;
        for (; r + (U - 1) * NT < sp.nvec; r += U * NT) {
            typename io::raw raw[U];
            int64_t kk[U];
#pragma unroll
            for (int u = 0; u < U; u++) {
                kk[u] = sp.nvec - 1 - (r + u * NT);
                if (!zero) raw[u] = io::ld(x, dx, b0 + kk[u] * V);
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                float f[V] = {};
                if (!zero) io::to_f32(raw[u], f);
                gt_ce_grad<V>(f, sp.head + kk[u] * V, t, c, scale, scale_d, coef, zero);
                io::st(g, dg, b0 + kk[u] * V, f);
            }
        }
        for (; r < sp.nvec; r += NT) {
            int64_t kv = sp.nvec - 1 - r;
            float f[V] = {};
            if (!zero) io::to_f32(io::ld(x, dx, b0 + kv * V), f);
            gt_ce_grad<V>(f, sp.head + kv * V, t, c, scale, scale_d, coef, zero);
            io::st(g, dg, b0 + kv * V, f);
        }
        /* the single values: head [0, head) and tail [tail0, v), one per thread */
        int64_t j = tid < sp.head ? tid : sp.tail0 + (tid - sp.head);
        if (tid < sp.head || (tid - sp.head < V && j < v)) {
            float f = zero ? 0.0f : gt_ld(x, dx, base + j);
            gt_ce_grad<1>(&f, j, t, c, scale, scale_d, coef, zero);
            gt_st(g, dg, base + j, f);
        }
    }
}

/* One block: total loss and valid count in a fixed order; out = total / n_valid (NaN if 0). */
__global__ void __launch_bounds__(GT_CE_THREADS)
    gt_k_ce_finish(int64_t rows, const double *loss, const int64_t *valid, void *out, int dout)
{
    __shared__ double shd[GT_CE_WARPS];
    double tot = 0.0, cnt = 0.0;
    for (int64_t i = threadIdx.x; i < rows; i += blockDim.x) {
        tot += loss[i];
        cnt += (double)valid[i];
    }
    tot = gt_ce_block_sum(tot, shd);
    cnt = gt_ce_block_sum(cnt, shd); /* integers below 2^53: exact in any order */
    if (threadIdx.x == 0) gt_st(out, dout, 0, (float)(tot / cnt));
}

/* One block: the number of rows whose target is valid (in range, not ignored). */
__global__ void __launch_bounds__(GT_CE_THREADS)
    gt_k_ce_count(int64_t rows, int64_t v, const void *tg, int dt, int64_t ignore, int64_t *n_valid)
{
    __shared__ double shd[GT_CE_WARPS];
    double cnt = 0.0;
    for (int64_t i = threadIdx.x; i < rows; i += blockDim.x) {
        int64_t t = gt_ld_index(tg, dt, i);
        cnt += (t != ignore && t >= 0 && t < v) ? 1.0 : 0.0;
    }
    cnt = gt_ce_block_sum(cnt, shd);
    if (threadIdx.x == 0) *n_valid = (int64_t)cnt;
}

/* ---------------------------------------------------------------- host side */

/* The vector element type shared by logits and (backward) dlogits, or 0 for the generic path:
 * mixed dtypes or a tensor not on a 16-byte boundary. */
static int gt_ce_kind(const gt_tensor *logits, const gt_tensor *dx)
{
    if (!gt_aligned16(logits->data)) return 0;
    if (dx && (dx->dtype != logits->dtype || !gt_aligned16(dx->data))) return 0;
    return logits->dtype;
}

static unsigned gt_ce_grid(int64_t rows)
{
    return (unsigned)(rows < 65536 ? rows : 65536);
}

static gt_status gt_cuda_ce_check(const gt_kernel_call *c, const gt_tensor *logits,
                                  const gt_tensor *targets, gt_error *err)
{
    GT_TRY(gt_kernel_want_attrs(c, 1, 0, 0, err));
    GT_TRY(gt_kernel_want_float(c, logits, "logits", err));
    GT_TRY(gt_kernel_want_index(c, targets, "targets", err));
    if (logits->ndim != 2 || targets->ndim != 1 || targets->shape[0] != logits->shape[0])
        return gt_cuda_shape_error(c, "expected logits [N, V] and targets [N]", err);
    return GT_OK;
}

gt_status gt_cuda_cross_entropy(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    const gt_tensor *logits = c->in[0], *targets = c->in[1];
    gt_tensor *out = c->out[0];
    GT_TRY(gt_cuda_ce_check(c, logits, targets, err));
    GT_TRY(gt_kernel_want_float(c, out, "output", err));
    if (out->ndim != 0) return gt_cuda_shape_error(c, "the output must be a scalar", err);
    int64_t rows = logits->shape[0], v = logits->shape[1];
    void *scr;
    size_t lb = ((size_t)rows * sizeof(double) + 255) & ~(size_t)255;
    GT_TRY(gt_cuda_scratch(s, c, lb + (size_t)rows * sizeof(int64_t) + 8, &scr, err));
    double *loss = (double *)scr;
    int64_t *valid = (int64_t *)((char *)scr + lb);
    if (rows > 0) {
        unsigned gr = gt_ce_grid(rows);
        const void *x = logits->data;
        int dx = logits->dtype, dt = targets->dtype;
        int64_t ig = c->i[0];
        switch (gt_ce_kind(logits, NULL)) {
        case GT_BF16:
            gt_k_ce_fwd<__nv_bfloat16><<<gr, GT_CE_THREADS, 0, s->stream>>>(
                rows, v, x, dx, targets->data, dt, ig, loss, valid, s->flag);
            break;
        case GT_F16:
            gt_k_ce_fwd<__half><<<gr, GT_CE_THREADS, 0, s->stream>>>(rows, v, x, dx, targets->data,
                                                                     dt, ig, loss, valid, s->flag);
            break;
        case GT_F32:
            gt_k_ce_fwd<float><<<gr, GT_CE_THREADS, 0, s->stream>>>(rows, v, x, dx, targets->data,
                                                                    dt, ig, loss, valid, s->flag);
            break;
        default:
            gt_k_ce_fwd<void><<<gr, GT_CE_THREADS, 0, s->stream>>>(rows, v, x, dx, targets->data,
                                                                   dt, ig, loss, valid, s->flag);
            break;
        }
        GT_TRY(gt_cuda_launched(c, err));
    }
    gt_k_ce_finish<<<1, GT_CE_THREADS, 0, s->stream>>>(rows, loss, valid, out->data, out->dtype);
    return gt_cuda_launched(c, err);
}

/* The dlogits kernel for the logits' vector type; with loss/valid, also the per-row losses. */
template <bool LOSS>
static void gt_ce_bwd_launch(gt_cuda_stream *s, int kind, int64_t rows, int64_t v,
                             const gt_tensor *logits, const gt_tensor *targets, int64_t ig,
                             const int64_t *n_valid, const gt_tensor *dloss, gt_tensor *dx,
                             double *loss, int64_t *valid)
{
    unsigned gr = gt_ce_grid(rows);
    const void *x = logits->data, *tg = targets->data, *dl = dloss->data;
    int xd = logits->dtype, td = targets->dtype, ld = dloss->dtype, gd = dx->dtype;
    switch (kind) {
    case GT_BF16:
        gt_k_ce_bwd<__nv_bfloat16, LOSS><<<gr, GT_CE_THREADS, 0, s->stream>>>(
            rows, v, x, xd, tg, td, ig, n_valid, dl, ld, dx->data, gd, s->flag, loss, valid);
        break;
    case GT_F16:
        gt_k_ce_bwd<__half, LOSS><<<gr, GT_CE_THREADS, 0, s->stream>>>(
            rows, v, x, xd, tg, td, ig, n_valid, dl, ld, dx->data, gd, s->flag, loss, valid);
        break;
    case GT_F32:
        gt_k_ce_bwd<float, LOSS><<<gr, GT_CE_THREADS, 0, s->stream>>>(
            rows, v, x, xd, tg, td, ig, n_valid, dl, ld, dx->data, gd, s->flag, loss, valid);
        break;
    default:
        gt_k_ce_bwd<void, LOSS><<<gr, GT_CE_THREADS, 0, s->stream>>>(
            rows, v, x, xd, tg, td, ig, n_valid, dl, ld, dx->data, gd, s->flag, loss, valid);
        break;
    }
}

/* Checks of cross_entropy_backward's (logits, targets, dloss) and dlogits. */
static gt_status gt_cuda_ce_bwd_check(const gt_kernel_call *c, const gt_tensor *dx, gt_error *err)
{
    const gt_tensor *logits = c->in[0], *dloss = c->in[2];
    GT_TRY(gt_cuda_ce_check(c, logits, c->in[1], err));
    GT_TRY(gt_kernel_want_float(c, dloss, "dloss", err));
    GT_TRY(gt_kernel_want_float(c, dx, "dlogits", err));
    GT_TRY(gt_kernel_want_same_shape(c, logits, "logits", dx, "dlogits", err));
    if (gt_tensor_numel(dloss) != 1) return gt_cuda_shape_error(c, "dloss must be a scalar", err);
    return GT_OK;
}

gt_status gt_cuda_cross_entropy_backward(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    const gt_tensor *logits = c->in[0], *targets = c->in[1];
    gt_tensor *dx = c->out[0];
    GT_TRY(gt_cuda_ce_bwd_check(c, dx, err));
    int64_t rows = logits->shape[0], v = logits->shape[1];
    if (rows == 0 || v == 0) return GT_OK;
    void *scr;
    GT_TRY(gt_cuda_scratch(s, c, sizeof(int64_t), &scr, err));
    int64_t *n_valid = (int64_t *)scr;
    gt_k_ce_count<<<1, GT_CE_THREADS, 0, s->stream>>>(rows, v, targets->data, targets->dtype,
                                                      c->i[0], n_valid);
    GT_TRY(gt_cuda_launched(c, err));
    gt_ce_bwd_launch<false>(s, gt_ce_kind(logits, dx), rows, v, logits, targets, c->i[0], n_valid,
                            c->in[2], dx, NULL, NULL);
    return gt_cuda_launched(c, err);
}

/* cross_entropy_with_grad (logits, targets, dloss) -> (loss, dlogits): the valid-row count, then
 * one kernel that takes each row's statistics once for its loss and its dlogits (the row read
 * twice, the second time back to front, mostly from L2), then the fixed-order mean: the bits of
 * cross_entropy and cross_entropy_backward, which share gt_ce_row_stats and these formulas. */
gt_status gt_cuda_cross_entropy_with_grad(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    const gt_tensor *logits = c->in[0], *targets = c->in[1];
    gt_tensor *out = c->out[0], *dx = c->out[1];
    GT_TRY(gt_cuda_ce_bwd_check(c, dx, err));
    GT_TRY(gt_kernel_want_float(c, out, "loss", err));
    if (out->ndim != 0) return gt_cuda_shape_error(c, "the loss must be a scalar", err);
    int64_t rows = logits->shape[0], v = logits->shape[1];
    void *scr;
    size_t lb = ((size_t)rows * sizeof(double) + 255) & ~(size_t)255;
    size_t vb = ((size_t)rows * sizeof(int64_t) + 255) & ~(size_t)255;
    GT_TRY(gt_cuda_scratch(s, c, lb + vb + sizeof(int64_t), &scr, err));
    double *loss = (double *)scr;
    int64_t *valid = (int64_t *)((char *)scr + lb), *n_valid = (int64_t *)((char *)scr + lb + vb);
    if (rows > 0) { /* V = 0 too: every target not ignored is flagged, as by the forward */
        gt_k_ce_count<<<1, GT_CE_THREADS, 0, s->stream>>>(rows, v, targets->data, targets->dtype,
                                                          c->i[0], n_valid);
        GT_TRY(gt_cuda_launched(c, err));
        gt_ce_bwd_launch<true>(s, gt_ce_kind(logits, dx), rows, v, logits, targets, c->i[0],
                               n_valid, c->in[2], dx, loss, valid);
        GT_TRY(gt_cuda_launched(c, err));
    }
    gt_k_ce_finish<<<1, GT_CE_THREADS, 0, s->stream>>>(rows, loss, valid, out->data, out->dtype);
    return gt_cuda_launched(c, err);
}
