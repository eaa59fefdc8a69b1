/* cpu_attention.c — scaled dot-product attention (sdpa) and its backward.
 *
 *   q: [b, hq, s, d], k: [b, hkv, t, d], v: [b, hkv, t, dv]; query head h reads kv head
 *   h / (hq / hkv) (grouped-query attention). Layout 1 (attribute 1) stores q, k, v, out and their
 *   gradients [b, s, heads, d] instead: a head's [s, d] block is then the rows h, h + heads, ...
 *   of the [b * s * heads, d] matrix, read in place by giving sgemm a leading dimension of
 *   heads * d (the products and their order are those of layout 0, so the results are bitwise
 *   those of transposing to layout 0 and back). lse is [b, hq, s] in both. Per (batch, head), with
 *   S = scale * q k^T:
 *     lse_i = log sum_{j unmasked} exp(S_ij)        (causal masks j > i; needs s == t)
 *     P = exp(S - lse),  out = P v.
 *   Backward, recomputing P from lse (nothing of size s x t is saved):
 *     dV = P^T dO;  dP = dO V^T;  D_i = sum_c dO_ic O_ic;  dS = P * (dP - D_i);
 *     dQ = scale * dS K;  dK = scale * dS^T Q.
 *   dK and dV of a kv head sum over the query heads of its group, in head order.
 *
 * Document masks (positions, gt_ops.def): query i sees keys start_i = i - positions_i .. i. A
 * block of query rows computes scores only from its first visible key k0 = min start_i on, and
 * each row's softmax runs over its own [start_i, i] (zeros elsewhere). With one document every
 * start is 0, k0 = 0 and every loop is the causal one: the same bits.
 *
 * Queries go in blocks of GT_CPU_ATTN_ROWS rows, so the score buffer is [rows, t] rather than
 * [s, t]; with causal masking a block only reads keys up to its last row. The matrix products are
 * sgemm calls (deterministic); softmax sums are double. Block sizes are constants, so the order of
 * every sum is fixed: identical bits run to run.
 *
 * Threads: one job per (batch, kv head), on up to gt_cpu_threads threads (gt_cpu_run_jobs). A job
 * does its group's query heads in head order, as one thread would, and writes only its own heads'
 * outputs (its kv head's dk and dv, its query heads' out, lse and dq), so the bits are the same on
 * any thread count. */
#include "cpu_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define GT_CPU_ATTN_ROWS 128

/* The row loops around the products, vectorized (the bits of the element-by-element loops). */
GT_CPU_ELEMENT_LOOP static void gt_cpu_attn_scale(float *x, int64_t n, float s)
{
    for (int64_t j = 0; j < n; j++)
        x[j] *= s;
}

/* dS = P * (dP - D_i) over a row, into dP's row */
GT_CPU_ELEMENT_LOOP static void gt_cpu_attn_ds(float *dp, const float *p, int64_t n, float di)
{
    for (int64_t j = 0; j < n; j++)
        dp[j] = p[j] * (dp[j] - di);
}

static void gt_cpu_attn_zero(float *x, int64_t n)
{
    if (n > 0) memset(x, 0, (size_t)n * sizeof *x);
}

typedef gt_kernel_attn gt_cpu_attn; /* layout 0: [b, heads, n, w]; 1: [b, n, heads, w] */

/* Where head h of batch bi starts and how far apart its rows are, in elements, for a tensor of
 * `heads` heads of n rows of width w in the call's layout. */
typedef struct {
    int64_t batch, head, row;
} gt_cpu_attn_stride;

static gt_cpu_attn_stride gt_cpu_attn_strides(const gt_cpu_attn *a, int64_t heads, int64_t n,
                                              int64_t w)
{
    if (a->layout == 1) return (gt_cpu_attn_stride){heads * n * w, w, heads * w};
    return (gt_cpu_attn_stride){heads * n * w, n * w, w};
}

static int64_t gt_cpu_attn_at(gt_cpu_attn_stride st, int64_t bi, int64_t h)
{
    return bi * st.batch + h * st.head;
}

static gt_status gt_cpu_attn_shapes(const gt_kernel_call *c, gt_cpu_attn *a, gt_error *err)
{
    GT_TRY(gt_kernel_want_attn(c, a, err));
    GT_TRY(gt_cpu_want_f32(c, c->in[0], "q", err));
    GT_TRY(gt_cpu_want_f32(c, c->in[1], "k", err));
    GT_TRY(gt_cpu_want_f32(c, c->in[2], "v", err));
    /* layout 1 gives sgemm row strides up to hq * max(d, dv) as leading dimensions */
    if (!gt_cpu_gemm_fits(a->s, a->t, a->d) || !gt_cpu_gemm_fits(a->dv, 1, 1) ||
        (a->layout == 1 && !gt_cpu_gemm_fits(a->hq * a->d, a->hq * a->dv, 1)))
        return gt_error_set(err, GT_ERR_UNSUPPORTED,
                            "%s: s = %lld, t = %lld, hq = %lld, d = %lld, dv = %lld exceed BLAS "
                            "int dims",
                            gt_kernel_op_name(c->op), (long long)a->s, (long long)a->t,
                            (long long)a->hq, (long long)a->d, (long long)a->dv);
    return GT_OK;
}

/* Checks t is f32 and shaped [b, h, n, last] ([b, n, h, last] in layout 1; n and last as given;
 * last < 0 = lse, rank 3 [b, h, n] in both layouts). */
static gt_status gt_cpu_attn_want(const gt_kernel_call *c, const gt_tensor *t, const char *what,
                                  const gt_cpu_attn *a, int64_t h, int64_t n, int64_t last,
                                  gt_error *err)
{
    GT_TRY(gt_cpu_want_f32(c, t, what, err));
    return gt_kernel_want_attn_tensor(c, t, what, a, h, n, last, err);
}

/* Number of keys query row i sees (the end of its range: keys start .. end - 1). */
static inline int64_t gt_cpu_attn_keys(const gt_cpu_attn *a, int64_t i)
{
    return a->causal ? i + 1 : a->t;
}

/* The first key query row i of batch bi sees: its document's start (0 without documents). */
static inline int64_t gt_cpu_attn_start(const gt_cpu_attn *a, int64_t bi, int64_t i)
{
    return a->positions ? i - a->positions[bi * a->s + i] : 0;
}

/* The first key any of rows i0 .. i0 + rows - 1 sees. */
static int64_t gt_cpu_attn_block_start(const gt_cpu_attn *a, int64_t bi, int64_t i0, int64_t rows)
{
    int64_t k0 = a->t;
    for (int64_t r = 0; r < rows; r++) {
        int64_t st = gt_cpu_attn_start(a, bi, i0 + r);
        k0 = st < k0 ? st : k0;
    }
    return rows > 0 ? k0 : 0;
}

/* Every position within its row's document: 0 <= positions[b, i] <= i, so every query sees at
 * least itself and never a key before the row. */
static gt_status gt_cpu_attn_check_positions(const gt_kernel_call *c, const gt_cpu_attn *a,
                                             gt_error *err)
{
    for (int64_t bi = 0; a->positions && bi < a->b; bi++)
        for (int64_t i = 0; i < a->s; i++) {
            int64_t p = a->positions[bi * a->s + i];
            if (p < 0 || p > i)
                return gt_error_set(err, GT_ERR_INVALID,
                                    "%s: positions[%lld, %lld] = %lld is outside [0, %lld]: a "
                                    "document starts at position 0 and counts up by one",
                                    gt_kernel_op_name(c->op), (long long)bi, (long long)i,
                                    (long long)p, (long long)i);
        }
    return GT_OK;
}

/* What a job of either direction reads: the call's shapes, strides and tensors. */
typedef struct {
    gt_cpu_attn a;
    gt_cpu_attn_stride sq, sk, sv, so;
    const gt_kernel_call *c;
} gt_cpu_attn_job;

static void gt_cpu_attn_job_init(gt_cpu_attn_job *j, const gt_kernel_call *c, const gt_cpu_attn *a)
{
    j->a = *a;
    j->c = c;
    j->sq = gt_cpu_attn_strides(a, a->hq, a->s, a->d);
    j->sk = gt_cpu_attn_strides(a, a->hkv, a->t, a->d);
    j->sv = gt_cpu_attn_strides(a, a->hkv, a->t, a->dv);
    j->so = gt_cpu_attn_strides(a, a->hq, a->s, a->dv);
}

/* Forward job i: kv head i % hkv of batch i / hkv and its group of query heads, in head order. */
static gt_status gt_cpu_sdpa_job(int i, void *user, gt_error *err)
{
    const gt_cpu_attn_job *j = user;
    const gt_cpu_attn a = j->a;
    gt_cpu_attn_stride sq = j->sq, sk = j->sk, sv = j->sv, so = j->so;
    float *sc = malloc((size_t)(GT_CPU_ATTN_ROWS * (a.t > 0 ? a.t : 1)) * sizeof *sc);
    if (!sc)
        return gt_error_set(err, GT_ERR_NOMEM, "sdpa: out of memory for a %d x %lld score block",
                            GT_CPU_ATTN_ROWS, (long long)a.t);
    const float *q = j->c->in[0]->data, *k = j->c->in[1]->data, *v = j->c->in[2]->data;
    float *out = j->c->out[0]->data, *lse = j->c->out[1]->data;
    int64_t group = a.hq / a.hkv, bi = i / a.hkv, kvh = i % a.hkv;
    const float *kp = k + gt_cpu_attn_at(sk, bi, kvh), *vp = v + gt_cpu_attn_at(sv, bi, kvh);
    for (int64_t h = kvh * group; h < (kvh + 1) * group; h++) {
        int64_t qh = bi * a.hq + h;
        const float *qb = q + gt_cpu_attn_at(sq, bi, h);
        float *ob = out + gt_cpu_attn_at(so, bi, h);
        for (int64_t i0 = 0; i0 < a.s; i0 += GT_CPU_ATTN_ROWS) {
            int64_t rows = a.s - i0 < GT_CPU_ATTN_ROWS ? a.s - i0 : GT_CPU_ATTN_ROWS;
            /* keys k0 .. k0 + tb - 1: the block's visible range (scores column jj = key k0 + jj) */
            int64_t k0 = gt_cpu_attn_block_start(&a, bi, i0, rows);
            int64_t tb = (a.causal ? i0 + rows : a.t) - k0;
            const float *qp = qb + i0 * sq.row;
            gt_cpu_sgemm_ld(false, true, rows, tb, a.d, a.scale, qp, sq.row, kp + k0 * sk.row,
                            sk.row, 0.0f, sc, tb > 0 ? tb : 1);
            for (int64_t r = 0; r < rows; r++) {
                float *row = sc + r * tb;
                int64_t lo = gt_cpu_attn_start(&a, bi, i0 + r) - k0;
                int64_t nk = gt_cpu_attn_keys(&a, i0 + r) - k0;
                float m = gt_cpu_max_n(row + lo, nk - lo);
                double sum = gt_cpu_exp_sum(row + lo, row + lo, nk - lo, m);
                float inv = (float)(1.0 / sum);
                gt_cpu_attn_scale(row + lo, nk - lo, inv);
                gt_cpu_attn_zero(row, lo);
                gt_cpu_attn_zero(row + nk, tb - nk);
                /* No visible key (t == 0): lse = -inf and the row of out is 0. */
                lse[qh * a.s + i0 + r] = nk > lo ? (float)((double)m + log(sum)) : -INFINITY;
            }
            gt_cpu_sgemm_ld(false, false, rows, a.dv, tb, 1.0f, sc, tb > 0 ? tb : 1,
                            vp + k0 * sv.row, sv.row, 0.0f, ob + i0 * so.row, so.row);
        }
    }
    free(sc);
    return GT_OK;
}

/* The jobs of a call: one per (batch, kv head), on up to gt_cpu_threads threads. */
static gt_status gt_cpu_attn_run(const gt_kernel_call *c, const gt_cpu_attn *a, gt_job_fn fn,
                                 gt_error *err)
{
    gt_cpu_attn_job j;
    gt_cpu_attn_job_init(&j, c, a);
    int64_t n = a->b * a->hkv;
    if (n > INT32_MAX)
        return gt_error_set(err, GT_ERR_UNSUPPORTED, "%s: %lld (batch, kv head) pairs",
                            gt_kernel_op_name(c->op), (long long)n);
    return gt_cpu_run_jobs((int)n, fn, &j, err);
}

gt_status gt_cpu_sdpa(const gt_kernel_call *c, gt_error *err)
{
    gt_cpu_attn a;
    GT_TRY(gt_cpu_attn_shapes(c, &a, err));
    GT_TRY(gt_cpu_attn_want(c, c->out[0], "out", &a, a.hq, a.s, a.dv, err));
    GT_TRY(gt_cpu_attn_want(c, c->out[1], "lse", &a, a.hq, a.s, -1, err));
    if (a.b * a.hq * a.s == 0) return GT_OK;
    GT_TRY(gt_cpu_attn_check_positions(c, &a, err));
    return gt_cpu_attn_run(c, &a, gt_cpu_sdpa_job, err);
}

/* Backward job i: kv head i % hkv of batch i / hkv; dk and dv sum over its group's query heads in
 * head order and over row blocks (sgemm with beta = 1), as the one-thread loop did. */
static gt_status gt_cpu_sdpa_backward_job(int i, void *user, gt_error *err)
{
    const gt_cpu_attn_job *j = user;
    const gt_cpu_attn a = j->a;
    gt_cpu_attn_stride sq = j->sq, sk = j->sk, sv = j->sv, so = j->so;
    size_t blk = (size_t)(GT_CPU_ATTN_ROWS * (a.t > 0 ? a.t : 1));
    float *p = malloc(blk * sizeof *p), *dp = malloc(blk * sizeof *dp);
    if (!p || !dp) {
        free(p);
        free(dp);
        return gt_error_set(err, GT_ERR_NOMEM, "sdpa_backward: out of memory for %d x %lld blocks",
                            GT_CPU_ATTN_ROWS, (long long)a.t);
    }
    const gt_kernel_call *c = j->c;
    const float *q = c->in[0]->data, *k = c->in[1]->data, *v = c->in[2]->data;
    const float *o = c->in[3]->data, *lse = c->in[4]->data, *dout = c->in[5]->data;
    float *dq = c->out[0]->data, *dk = c->out[1]->data, *dv = c->out[2]->data;
    int64_t group = a.hq / a.hkv, bi = i / a.hkv, kvh = i % a.hkv;
    int64_t ko = gt_cpu_attn_at(sk, bi, kvh), vo = gt_cpu_attn_at(sv, bi, kvh);
    for (int64_t h = kvh * group; h < (kvh + 1) * group; h++) {
        int64_t qh = bi * a.hq + h;
        for (int64_t i0 = 0; i0 < a.s; i0 += GT_CPU_ATTN_ROWS) {
            int64_t rows = a.s - i0 < GT_CPU_ATTN_ROWS ? a.s - i0 : GT_CPU_ATTN_ROWS;
            /* keys k0 .. k0 + tb - 1, as in the forward */
            int64_t k0 = gt_cpu_attn_block_start(&a, bi, i0, rows);
            int64_t tb = (a.causal ? i0 + rows : a.t) - k0, ldp = tb > 0 ? tb : 1;
            const float *kp = k + ko + k0 * sk.row, *vp = v + vo + k0 * sv.row;
            float *dkp = dk + ko + k0 * sk.row, *dvp = dv + vo + k0 * sv.row;
            int64_t lo = qh * a.s + i0; /* lse row */
            int64_t qo = gt_cpu_attn_at(sq, bi, h) + i0 * sq.row;
            int64_t oo = gt_cpu_attn_at(so, bi, h) + i0 * so.row;
            const float *qp = q + qo, *op = o + oo, *gp = dout + oo;
            /* P = exp(scale q k^T - lse), 0 where masked or where no key is visible. */
            gt_cpu_sgemm_ld(false, true, rows, tb, a.d, a.scale, qp, sq.row, kp, sk.row, 0.0f, p,
                            ldp);
            for (int64_t r = 0; r < rows; r++) {
                float *row = p + r * tb, l = lse[lo + r];
                int64_t st = gt_cpu_attn_start(&a, bi, i0 + r) - k0;
                int64_t nk = isinf(l) && l < 0 ? st : gt_cpu_attn_keys(&a, i0 + r) - k0;
                gt_cpu_exp_n(row + st, row + st, nk - st, 1.0f, l);
                gt_cpu_attn_zero(row, st);
                gt_cpu_attn_zero(row + nk, tb - nk);
            }
            /* dV += P^T dO */
            gt_cpu_sgemm_ld(true, false, tb, a.dv, rows, 1.0f, p, ldp, gp, so.row, 1.0f, dvp,
                            sv.row);
            /* dP = dO V^T */
            gt_cpu_sgemm_ld(false, true, rows, tb, a.dv, 1.0f, gp, so.row, vp, sv.row, 0.0f, dp,
                            ldp);
            for (int64_t r = 0; r < rows; r++) {
                double dsum = 0.0; /* D_i = dO_i . O_i */
                for (int64_t jj = 0; jj < a.dv; jj++)
                    dsum += (double)gp[r * so.row + jj] * op[r * so.row + jj];
                gt_cpu_attn_ds(dp + r * tb, p + r * tb, tb, (float)dsum);
            }
            gt_cpu_sgemm_ld(false, false, rows, a.d, tb, a.scale, dp, ldp, kp, sk.row, 0.0f,
                            dq + qo, sq.row);
            gt_cpu_sgemm_ld(true, false, tb, a.d, rows, a.scale, dp, ldp, qp, sq.row, 1.0f, dkp,
                            sk.row);
        }
    }
    free(p);
    free(dp);
    return GT_OK;
}

gt_status gt_cpu_sdpa_backward(const gt_kernel_call *c, gt_error *err)
{
    gt_cpu_attn a;
    GT_TRY(gt_cpu_attn_shapes(c, &a, err));
    GT_TRY(gt_cpu_attn_want(c, c->in[3], "out", &a, a.hq, a.s, a.dv, err));
    GT_TRY(gt_cpu_attn_want(c, c->in[4], "lse", &a, a.hq, a.s, -1, err));
    GT_TRY(gt_cpu_attn_want(c, c->in[5], "dout", &a, a.hq, a.s, a.dv, err));
    GT_TRY(gt_cpu_attn_want(c, c->out[0], "dq", &a, a.hq, a.s, a.d, err));
    GT_TRY(gt_cpu_attn_want(c, c->out[1], "dk", &a, a.hkv, a.t, a.d, err));
    GT_TRY(gt_cpu_attn_want(c, c->out[2], "dv", &a, a.hkv, a.t, a.dv, err));
    /* dk and dv accumulate (beta = 1) from zero */
    if (gt_tensor_nbytes(c->out[1]) > 0) memset(c->out[1]->data, 0, gt_tensor_nbytes(c->out[1]));
    if (gt_tensor_nbytes(c->out[2]) > 0) memset(c->out[2]->data, 0, gt_tensor_nbytes(c->out[2]));
    if (a.b * a.hq * a.s == 0) return GT_OK;
    GT_TRY(gt_cpu_attn_check_positions(c, &a, err));
    return gt_cpu_attn_run(c, &a, gt_cpu_sdpa_backward_job, err);
}
