/* cuda_matmul.cu — matmul through cuBLASLt.
 *
 *   a: [..., r_a, c_a], b: [r_b, c_b] or [..., r_b, c_b]; out = op(a) @ op(b): [..., M, N]
 * (semantics of cpu_matmul.c). Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T, so
 * cuBLASLt gets b as its "A" and a as its "B", with the transpose flags swapped in.
 *
 * Precision: compute type CUBLAS_COMPUTE_32F in every case — for f32 that keeps TF32 off (pure
 * fp32 products and sums), for bf16/f16 inputs it accumulates in fp32 (output rounded once).
 * Inputs of mixed dtypes are first widened to f32 in scratch.
 *
 * Determinism: the algorithm is chosen once per shape (the first heuristic result whose split-K
 * count is 1, i.e. no cross-block reduction at all; the heuristic's first result otherwise) and
 * cached in the stream, so a shape always runs the same kernel with the same workspace; cuBLASLt
 * kernels without split-K reductions use no atomics and are bitwise reproducible run to run. Some
 * nvjet kernels that report a split-K count of 1 still split K and add the parts in a separate
 * splitKreduce_kernel (seen in CUPTI traces); runs with them stay bitwise (the GPU tests rerun
 * whole steps and compare bits). On its first (warm-up) call a large shape times the heuristic's
 * other candidates and may take a faster one, but only one whose output has that pick's bits
 * (cuda_matmul_tune.cu; GT_MATMUL_TUNE=0 turns it off). An f32 weight gradient with a long k and
 * a small output is split along k by hand, its parts summed in a fixed order (gt_splitk_chunks). */
#include "cuda_internal.h"

#include <string.h>

static cudaDataType_t gt_cuda_dt(gt_dtype dt)
{
    return dt == GT_BF16 ? CUDA_R_16BF : dt == GT_F16 ? CUDA_R_16F : CUDA_R_32F;
}

static gt_status gt_lt_check(const gt_kernel_call *c, cublasStatus_t st, const char *what,
                             gt_error *err)
{
    if (st == CUBLAS_STATUS_SUCCESS) return GT_OK;
    return gt_error_set(err, GT_ERR_INTERNAL, "%s: cuBLASLt %s failed: status %d",
                        gt_kernel_op_name(c->op), what, (int)st);
}

__global__ void gt_k_widen(int64_t n, const void *x, int dx, float *y)
{
    GT_GRID_STRIDE(i, n)
    {
        y[i] = gt_ld(x, dx, i);
    }
}

__global__ void gt_k_narrow(int64_t n, const float *x, void *y, int dy)
{
    GT_GRID_STRIDE(i, n)
    {
        gt_st(y, dy, i, x[i]);
    }
}

__global__ void gt_k_zero(int64_t n, void *y, int dy)
{
    GT_GRID_STRIDE(i, n)
    {
        gt_st(y, dy, i, 0.0f);
    }
}

cublasStatus_t gt_cuda_matmul_launch(gt_cuda_stream *s, const gt_cuda_matmul_call *m,
                                     const cublasLtMatmulAlgo_t *algo)
{
    float alpha = 1.0f, beta = 0.0f;
    return cublasLtMatmul(s->lt, m->desc, &alpha, m->a, m->la, m->b, m->lb, &beta, m->out, m->lc,
                          m->out, m->lc, algo, s->workspace, s->workspace_bytes, s->stream);
}

/* Picks (or recalls) the algorithm for this problem. */
static gt_status gt_cuda_pick_algo(gt_cuda_stream *s, const gt_kernel_call *c,
                                   const gt_cuda_matmul_call *m, cublasLtMatmulAlgo_t *algo,
                                   gt_error *err)
{
    const gt_gemm *g = m->g;
    int64_t key[10] = {g->ta,    g->tb,       g->m,        g->n,        g->k,
                       g->batch, g->stride_a, g->stride_b, g->stride_c, g->dt};
    for (int i = 0; i < GT_CUDA_ALGO_CACHE; i++) {
        if (s->cache[i].used && memcmp(s->cache[i].key, key, sizeof key) == 0) {
            *algo = s->cache[i].algo;
            return GT_OK;
        }
    }
    cublasLtMatmulPreference_t pref;
    GT_TRY(gt_lt_check(c, cublasLtMatmulPreferenceCreate(&pref), "preference", err));
    size_t ws = s->workspace_bytes;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                         sizeof ws);
    cublasLtMatmulHeuristicResult_t res[GT_CUDA_ALGO_CANDIDATES];
    int nres = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(
        s->lt, m->desc, m->la, m->lb, m->lc, m->lc, pref, s->tune ? GT_CUDA_ALGO_CANDIDATES : 8,
        res, &nres);
    cublasLtMatmulPreferenceDestroy(pref);
    GT_TRY(gt_lt_check(c, st, "heuristic", err));
    if (nres == 0)
        return gt_error_set(err, GT_ERR_UNSUPPORTED,
                            "matmul: cuBLASLt has no algorithm for %lld x %lld x %lld (batch %lld, "
                            "%s)",
                            (long long)g->m, (long long)g->n, (long long)g->k, (long long)g->batch,
                            gt_dtype_name(g->dt));
    int pick = 0;
    for (int i = 0; i < nres; i++) {
        int32_t splitk = 1;
        size_t got = 0;
        if (cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM,
                                                 &splitk, sizeof splitk,
                                                 &got) == CUBLAS_STATUS_SUCCESS &&
            splitk <= 1) {
            pick = i;
            break;
        }
    }
    if (s->tune) pick = gt_cuda_matmul_tune(s, m, res, nres, pick);
    *algo = res[pick].algo;
    gt_cuda_algo_entry *e = &s->cache[s->next_slot];
    s->next_slot = (s->next_slot + 1) % GT_CUDA_ALGO_CACHE;
    memcpy(e->key, key, sizeof key);
    e->algo = *algo;
    e->used = true;
    return GT_OK;
}

static gt_status gt_cuda_gemm(gt_cuda_stream *s, const gt_kernel_call *c, const gt_gemm *g,
                              const void *a, const void *b, void *out, gt_error *err)
{
    cudaDataType_t t = gt_cuda_dt(g->dt);
    cublasLtMatmulDesc_t desc = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
    gt_status st = gt_lt_check(c, cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
                               "descriptor", err);
    /* cuBLASLt's A = our b (column-major: rows x cols with leading dim), B = our a. */
    cublasOperation_t opa = g->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t opb = g->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    if (st == GT_OK) {
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa);
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb);
        uint64_t ar = g->tb ? g->k : g->n, ac = g->tb ? g->n : g->k;
        uint64_t br = g->ta ? g->m : g->k, bc = g->ta ? g->k : g->m;
        st = gt_lt_check(c, cublasLtMatrixLayoutCreate(&la, t, ar, ac, (int64_t)ar), "layout", err);
        if (st == GT_OK)
            st = gt_lt_check(c, cublasLtMatrixLayoutCreate(&lb, t, br, bc, (int64_t)br), "layout",
                             err);
        if (st == GT_OK)
            st =
                gt_lt_check(c, cublasLtMatrixLayoutCreate(&lc, t, g->n, g->m, g->n), "layout", err);
    }
    if (st == GT_OK && g->batch > 1) {
        int32_t bcount = (int32_t)g->batch;
        cublasLtMatrixLayout_t ls[3] = {la, lb, lc};
        int64_t strides[3] = {g->stride_b, g->stride_a, g->stride_c};
        for (int k = 0; k < 3; k++) {
            cublasLtMatrixLayoutSetAttribute(ls[k], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bcount,
                                             sizeof bcount);
            cublasLtMatrixLayoutSetAttribute(ls[k], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                             &strides[k], sizeof strides[k]);
        }
    }
    gt_cuda_matmul_call m = {g, desc, la, lb, lc, b, a, out};
    cublasLtMatmulAlgo_t algo;
    if (st == GT_OK) st = gt_cuda_pick_algo(s, c, &m, &algo, err);
    if (st == GT_OK) st = gt_lt_check(c, gt_cuda_matmul_launch(s, &m, &algo), "matmul", err);
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (desc) cublasLtMatmulDescDestroy(desc);
    return st;
}

/* A weight gradient in f32 (a^T b: a long k, a small output), e.g. the MoE router's gate,
 * [8, 256] over 16384 tokens: cuBLASLt's pick (split-K count 1, see the header) runs one block per
 * 32 x 32 output tile through the whole of k, 0.45 ms at DeepSeek-V3 debugmodel's shape. Here k is
 * cut into `chunks` equal runs of at least 256 rows, multiplied as one strided batch into scratch,
 * and the partial products are summed in chunk order by gt_k_sum_chunks: a fixed order (other bits
 * than the unsplit product, the same every run). 1 where the form or the sizes do not fit. */
static int64_t gt_splitk_chunks(const gt_gemm *g)
{
    if (g->dt != GT_F32 || g->batch != 1 || !g->ta || g->tb || g->m * g->n > 65536 ||
        g->k < 8192)
        return 1;
    int64_t s = 64;
    while (s > 1 && (g->k % s != 0 || g->k / s < 256))
        s /= 2;
    return s;
}

__global__ void gt_k_sum_chunks(int64_t n, int64_t chunks, const float *part, float *out)
{
    GT_GRID_STRIDE(i, n)
    {
        float acc = part[i];
        for (int64_t j = 1; j < chunks; j++)
            acc += part[j * n + i];
        out[i] = acc;
    }
}

static gt_status gt_cuda_gemm_splitk(gt_cuda_stream *s, const gt_kernel_call *c, const gt_gemm *g,
                                     int64_t chunks, const void *a, const void *b, void *out,
                                     gt_error *err)
{
    int64_t mn = g->m * g->n;
    void *part;
    GT_TRY(gt_cuda_scratch(s, c, (size_t)(chunks * mn) * sizeof(float), &part, err));
    gt_gemm one = *g;
    one.k = g->k / chunks;
    one.batch = chunks;
    one.stride_a = one.k * g->m; /* a is [k, m]: chunk j is rows j·k/chunks.. */
    one.stride_b = one.k * g->n; /* b is [k, n] */
    one.stride_c = mn;
    GT_TRY(gt_cuda_gemm(s, c, &one, a, b, part, err));
    gt_k_sum_chunks<<<gt_cuda_blocks(mn), GT_CUDA_THREADS, 0, s->stream>>>(
        mn, chunks, (const float *)part, (float *)out);
    return gt_cuda_launched(c, err);
}

gt_status gt_cuda_matmul(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    const gt_tensor *a = c->in[0], *b = c->in[1];
    gt_tensor *out = c->out[0];
    GT_TRY(gt_kernel_want_float(c, a, "a", err));
    GT_TRY(gt_kernel_want_float(c, b, "b", err));
    GT_TRY(gt_kernel_want_float(c, out, "output", err));
    gt_kernel_matmul_dims d;
    GT_TRY(gt_kernel_want_matmul(c, &d, err));
    bool ta = d.ta, tb = d.tb;
    int64_t m = d.m, n = d.n, k = d.k, batch = d.batch;
    int64_t numel = gt_tensor_numel(out);
    if (numel == 0) return GT_OK;
    if (k == 0) {
        gt_k_zero<<<gt_cuda_blocks(numel), GT_CUDA_THREADS, 0, s->stream>>>(numel, out->data,
                                                                            out->dtype);
        return gt_cuda_launched(c, err);
    }
    gt_gemm g = {ta, tb, m, n, k, batch, m * k, d.b_batched ? k * n : 0, m * n, a->dtype};
    if (!d.b_batched && !ta) { /* fold the batch into M: one gemm */
        g.m = batch * m;
        g.batch = 1;
    }
    if (g.m > 0x7fffffff || n > 0x7fffffff || k > 0x7fffffff || g.batch > 0x7fffffff)
        return gt_error_set(err, GT_ERR_UNSUPPORTED, "matmul: dims exceed cuBLASLt's int range");
    bool same = a->dtype == b->dtype && b->dtype == out->dtype;
    if (same && !d.b_batched && ta && batch > 1) {
        /* b shared by every batch matrix: one gemm per batch element, in order (no reliance on a
         * zero batch stride). */
        size_t es = gt_dtype_size(a->dtype);
        gt_gemm one = g;
        one.batch = 1;
        for (int64_t i = 0; i < batch; i++)
            GT_TRY(gt_cuda_gemm(s, c, &one, (const char *)a->data + (size_t)(i * m * k) * es,
                                b->data, (char *)out->data + (size_t)(i * m * n) * es, err));
        return GT_OK;
    }
    int64_t chunks = same ? gt_splitk_chunks(&g) : 1;
    if (chunks > 1) return gt_cuda_gemm_splitk(s, c, &g, chunks, a->data, b->data, out->data, err);
    if (same) return gt_cuda_gemm(s, c, &g, a->data, b->data, out->data, err);
    /* Mixed dtypes: widen every operand that is not f32 into scratch, multiply in f32. */
    int64_t na = gt_tensor_numel(a), nb = gt_tensor_numel(b);
    size_t ba = ((size_t)na * 4 + 255) & ~(size_t)255, bb = ((size_t)nb * 4 + 255) & ~(size_t)255;
    void *scr;
    GT_TRY(gt_cuda_scratch(s, c, ba + bb + (size_t)numel * 4, &scr, err));
    float *wa = (float *)scr, *wb = (float *)((char *)scr + ba);
    float *wo = (float *)((char *)scr + ba + bb);
    const void *pa = a->data, *pb = b->data;
    if (a->dtype != GT_F32) {
        gt_k_widen<<<gt_cuda_blocks(na), GT_CUDA_THREADS, 0, s->stream>>>(na, a->data, a->dtype,
                                                                          wa);
        pa = wa;
    }
    if (b->dtype != GT_F32) {
        gt_k_widen<<<gt_cuda_blocks(nb), GT_CUDA_THREADS, 0, s->stream>>>(nb, b->data, b->dtype,
                                                                          wb);
        pb = wb;
    }
    GT_TRY(gt_cuda_launched(c, err));
    g.dt = GT_F32;
    void *po = out->dtype == GT_F32 ? out->data : (void *)wo;
    if (!d.b_batched && ta && batch > 1) {
        gt_gemm one = g;
        one.batch = 1;
        for (int64_t i = 0; i < batch; i++)
            GT_TRY(gt_cuda_gemm(s, c, &one, (const float *)pa + i * m * k, pb,
                                (float *)po + i * m * n, err));
    } else {
        GT_TRY(gt_cuda_gemm(s, c, &g, pa, pb, po, err));
    }
    if (out->dtype != GT_F32) {
        gt_k_narrow<<<gt_cuda_blocks(numel), GT_CUDA_THREADS, 0, s->stream>>>(numel, wo, out->data,
                                                                              out->dtype);
        return gt_cuda_launched(c, err);
    }
    return GT_OK;
}
