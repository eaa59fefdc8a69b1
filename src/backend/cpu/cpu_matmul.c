/* cpu_matmul.c — matmul through OpenBLAS cblas_sgemm.
 *
 *   a: [..., r_a, c_a], b: [r_b, c_b] or [..., r_b, c_b] (same leading dims as a)
 *   op(a) = a^T on the last two dims when trans_a (likewise b); out = op(a) @ op(b): [..., M, N].
 * With b of rank 2 and no trans_a, a's leading dims fold into M: one sgemm of (batch*M) x K x N.
 * Otherwise one sgemm per batch element, in batch order.
 *
 * Threads without changing bits. OpenBLAS's own threads would change the result with their
 * count: its split decides whether a full-tile or an edge micro-kernel computes an element, and
 * those round differently (measured: OpenBLAS 0.3.21, ~10% of elements of a 256^3 product differ
 * by an ulp between 1 and 2 threads). So OpenBLAS always runs on one thread, and a large sgemm
 * is cut into blocks of C's rows (or columns, whichever C has more of) by a rule of its shape
 * alone (gemm_blocks): each block is one single-threaded sgemm, the blocks go to up to
 * gt_cpu_set_threads' count of threads, and an element's bits depend on the shape, never on the
 * thread count or the machine's cores. Blocks write disjoint parts of C; no element's sum is
 * split. */
#include "cpu_internal.h"

#include <cblas.h>
#include <limits.h>
#include <pthread.h>
#include <string.h>

/* The block rule: about one block per GEMM_BLOCK_WORK multiply-adds, each of at least
 * GEMM_BLOCK_MIN rows (columns), at most GEMM_MAX_BLOCKS; a block is a multiple of
 * GEMM_BLOCK_ALIGN rows (columns) but the last. Smaller blocks would cost a single thread more
 * than they let two win (each sgemm packs the other operand again, and runs short panels).
 * Constants: changing them may change the bits of a blocked product. */
#define GEMM_BLOCK_WORK (INT64_C(1) << 23)
#define GEMM_BLOCK_MIN 256
#define GEMM_MAX_BLOCKS 16
#define GEMM_BLOCK_ALIGN 16

static int gt_cpu_threads_n = 1;
static pthread_once_t gt_cpu_blas_once = PTHREAD_ONCE_INIT;

static void gt_cpu_blas_one_thread(void)
{
    openblas_set_num_threads(1);
}

void gt_cpu_set_threads(int n)
{
    pthread_once(&gt_cpu_blas_once, gt_cpu_blas_one_thread);
    if (n > 0) gt_cpu_threads_n = n;
}

int gt_cpu_threads(void)
{
    return gt_cpu_threads_n;
}

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

typedef struct {
    bool ta, tb, rows; /* rows: blocks of C's rows, else of its columns */
    int64_t m, n, k, lda, ldb, ldc;
    int64_t size; /* rows (columns) of a block; the last may have fewer */
    float alpha, beta;
    const float *a, *b;
    float *c;
} gemm_blocks;

/* Cuts C by the block rule above; returns the number of blocks (1: the whole product at once). */
static int gemm_blocks_plan(gemm_blocks *g)
{
    g->rows = g->m >= g->n;
    int64_t extent = g->rows ? g->m : g->n;
    double work = (double)g->m * (double)g->n * (double)g->k; /* rounded the same everywhere */
    int64_t nb = work >= (double)GEMM_MAX_BLOCKS * GEMM_BLOCK_WORK
                     ? GEMM_MAX_BLOCKS
                     : (int64_t)(work / (double)GEMM_BLOCK_WORK);
    if (nb > extent / GEMM_BLOCK_MIN) nb = extent / GEMM_BLOCK_MIN;
    if (nb < 2) {
        g->size = extent;
        return 1;
    }
    int64_t size = (extent + nb - 1) / nb;
    size = (size + GEMM_BLOCK_ALIGN - 1) / GEMM_BLOCK_ALIGN * GEMM_BLOCK_ALIGN;
    g->size = size;
    return (int)((extent + size - 1) / size);
}

static void gemm_call(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                      const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                      float *c, int64_t ldc)
{
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                (int)m, (int)n, (int)k, alpha, a, (int)lda, b, (int)ldb, beta, c, (int)ldc);
}

/* Block i: C's rows (columns) [i size, (i + 1) size), from A's rows (B's columns) of them. */
static gt_status gemm_block(int i, void *user, gt_error *err)
{
    (void)err;
    const gemm_blocks *g = user;
    int64_t lo = (int64_t)i * g->size, extent = g->rows ? g->m : g->n;
    int64_t len = extent - lo < g->size ? extent - lo : g->size;
    if (g->rows)
        gemm_call(g->ta, g->tb, len, g->n, g->k, g->alpha, g->ta ? g->a + lo : g->a + lo * g->lda,
                  g->lda, g->b, g->ldb, g->beta, g->c + lo * g->ldc, g->ldc);
    else
        gemm_call(g->ta, g->tb, g->m, len, g->k, g->alpha, g->a, g->lda,
                  g->tb ? g->b + lo * g->ldb : g->b + lo, g->ldb, g->beta, g->c + lo, g->ldc);
    return GT_OK;
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
    pthread_once(&gt_cpu_blas_once, gt_cpu_blas_one_thread);
    gemm_blocks g = {.ta = ta,
                     .tb = tb,
                     .m = m,
                     .n = n,
                     .k = k,
                     .alpha = alpha,
                     .beta = beta,
                     .a = a,
                     .b = b,
                     .c = c,
                     .lda = lda,
                     .ldb = ldb,
                     .ldc = ldc};
    int nb = gemm_blocks_plan(&g);
    bool prof = gt_cpu_prof_on();
    double t0 = prof ? gt_cpu_prof_now() : 0.0;
    if (nb == 1)
        gemm_block(0, &g, NULL);
    else
        gt_cpu_run_jobs(nb, gemm_block, &g, NULL); /* gemm_block never fails */
    if (prof) gt_cpu_prof_sgemm(ta, tb, m, n, k, gt_cpu_prof_now() - t0);
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
