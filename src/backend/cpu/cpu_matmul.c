/* cpu_matmul.c — matmul through OpenBLAS cblas_sgemm.
 *
 *   a: [..., r_a, c_a], b: [r_b, c_b] or [..., r_b, c_b] (same leading dims as a)
 *   op(a) = a^T on the last two dims when trans_a (likewise b); out = op(a) @ op(b): [..., M, N].
 * With b of rank 2 and no trans_a, a's leading dims fold into M: one sgemm of (batch*M) x K x N.
 * Otherwise one sgemm per batch element, in batch order. Each sgemm is deterministic at a fixed
 * OpenBLAS thread count (threads split M and N, never K, so no element's sum is raced). Bits can
 * change with the thread count: the split decides whether a full-tile or an edge micro-kernel
 * computes an element, and those round differently (measured: OpenBLAS 0.3.21, ~10% of elements
 * of a 256^3 product differ by an ulp between 1 and 2 threads). */
#include "cpu_internal.h"

#include <cblas.h>
#include <limits.h>
#include <string.h>

bool gt_cpu_gemm_fits(int64_t m, int64_t n, int64_t k)
{
    return m <= INT_MAX && n <= INT_MAX && k <= INT_MAX;
}

static int gt_cpu_ld(int64_t cols)
{
    return cols > 1 ? (int)cols : 1;
}

void gt_cpu_sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                  const float *b, float beta, float *c)
{
    gt_cpu_sgemm_ld(ta, tb, m, n, k, alpha, a, gt_cpu_ld(ta ? m : k), b, gt_cpu_ld(tb ? k : n),
                    beta, c, gt_cpu_ld(n));
}

void gt_cpu_sgemm_ld(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                     int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc)
{
    if (m == 0 || n == 0) return;
    if (k == 0) {
        /* op(A) @ op(B) is all zeros; BLAS is not asked to handle the empty product. */
        for (int64_t i = 0; i < m; i++) {
            float *row = c + i * ldc;
            if (beta == 0.0f) {
                memset(row, 0, (size_t)n * sizeof *row);
            } else {
                for (int64_t j = 0; j < n; j++)
                    row[j] *= beta;
            }
        }
        return;
    }
    GT_CHECK(lda <= INT_MAX && ldb <= INT_MAX && ldc <= INT_MAX);
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                (int)m, (int)n, (int)k, alpha, a, (int)lda, b, (int)ldb, beta, c, (int)ldc);
}

gt_status gt_cpu_matmul(const gt_kernel_call *c, gt_error *err)
{
    const gt_tensor *a = c->in[0], *b = c->in[1];
    gt_tensor *out = c->out[0];
    GT_TRY(gt_cpu_want_f32(c, a, "a", err));
    GT_TRY(gt_cpu_want_f32(c, b, "b", err));
    GT_TRY(gt_cpu_want_f32(c, out, "output", err));
    gt_kernel_matmul_dims d;
    GT_TRY(gt_kernel_want_matmul(c, &d, err));
    bool ta = d.ta, tb = d.tb;
    int64_t m = d.m, n = d.n, k = d.k, batch = d.batch;
    const float *ap = a->data, *bp = b->data;
    float *op = out->data;
    if (!d.b_batched && !ta) {
        if (!gt_cpu_gemm_fits(batch * m, n, k))
            return gt_error_set(err, GT_ERR_UNSUPPORTED,
                                "matmul: %lld x %lld x %lld exceeds BLAS "
                                "int dims",
                                (long long)(batch * m), (long long)n, (long long)k);
        gt_cpu_sgemm(false, tb, batch * m, n, k, 1.0f, ap, bp, 0.0f, op);
        return GT_OK;
    }
    if (!gt_cpu_gemm_fits(m, n, k))
        return gt_error_set(err, GT_ERR_UNSUPPORTED,
                            "matmul: %lld x %lld x %lld exceeds BLAS int "
                            "dims",
                            (long long)m, (long long)n, (long long)k);
    int64_t b_step = d.b_batched ? k * n : 0;
    for (int64_t i = 0; i < batch; i++)
        gt_cpu_sgemm(ta, tb, m, n, k, 1.0f, ap + i * m * k, bp + i * b_step, 0.0f, op + i * m * n);
    return GT_OK;
}
