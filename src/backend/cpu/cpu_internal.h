/* cpu_internal.h — shared pieces of the CPU backend (private to src/backend/cpu).
 *
 * Every op in gt_ops.def has a kernel gt_cpu_<name>. The dispatcher (cpu.c) hands "f32 kernels"
 * only f32 float tensors (it widens bf16/f16 around them); "byte kernels" (layout copies, cast,
 * full, embedding) see the real dtypes and move elements as bytes. Integer tensors (ids, targets)
 * always reach the kernel as they are, i32 or i64. */
#ifndef GRAPHTRAIN_CPU_INTERNAL_H
#define GRAPHTRAIN_CPU_INTERNAL_H

#include "backend/kernel_check.h"
#include "graphtrain/gt_backend.h"

#include <stdbool.h>
#include <stdint.h>

/* An element loop also compiled for x86-64-v4 (AVX-512) and x86-64-v3 (AVX2, FMA), the widest
 * the CPU has picked at load time (GCC function multi-versioning, GCC on x86-64 only). The v4
 * clone runs 16 lanes: gt_cpu_exp_n takes 0.56 ns an element there against 0.93-1.0 in the v3
 * clone (this VM's Xeon, 200-element rows, 2026-12-06). The clone computes the same bits as
 * long as nothing is summed across elements: add, sub, mul, div and sqrt are IEEE operations at
 * any vector width, fmaf is the FMA instruction, and contraction of other multiply-adds into
 * FMAs is turned off. no-trapping-math lets GCC turn float compares into selects (gt_cpu_expf's
 * range checks; a compare may raise an FP exception, which nothing here reads): the values are the
 * same either way. (sqrtf is the square-root instruction because the CPU backend is built with
 * -fno-math-errno, CMakeLists.txt; the attribute's form of that flag does not take.) The element
 * functions such a loop calls must be always_inline: GCC does not inline a function built with
 * other options into it (AdamW's was not, until 2026-11-28: its clone called libm's fmaf and
 * sqrtf for every element). */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define GT_CPU_ELEMENT_LOOP                                                                        \
    __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"),                   \
                   optimize("O3", "fp-contract=off", "no-trapping-math")))
#else
#define GT_CPU_ELEMENT_LOOP
#endif

/* exp(x) in f32 for the CPU kernels (softmax, attention, cross-entropy, sigmoid, exp), in place of
 * libm's expf: branch-free, so the loops of gt_cpu_exp_n vectorize, and the same bits in a vector
 * lane as here (IEEE adds and multiplies only, never contracted: every caller is compiled without
 * FMA or is a GT_CPU_ELEMENT_LOOP). Within 1 ulp of exp over the whole range (test_cpu_exp checks
 * it against the double exp): x = n ln2 + r with n = round(x log2 e) and ln2 split in two (the high
 * part's 16 bits make n ln2_hi exact), e^r by its Taylor polynomial to r^7 on |r| <= ln2 / 2
 * (truncation below 3e-9), then times 2^n in two exact power-of-two steps so that results down to
 * the subnormals round once. Below -103.97 it is 0, above 88.72 +inf, NaN stays NaN. */
static inline __attribute__((always_inline)) float gt_cpu_expf(float x)
{
    const float lo = -0x1.9fe368p+6f, hi = 0x1.62e43p+6f; /* about ln 2^-150, ln FLT_MAX */
    const float shifter = 0x1.8p23f; /* adding it rounds |v| < 2^22 to an integer, nearest even */
    float xc = x >= lo ? x : lo;     /* NaN goes to lo here and comes back below */
    xc = xc <= hi ? xc : hi;
    float n = (xc * 0x1.715476p+0f + shifter) - shifter; /* round(x log2 e), in [-150, 128] */
    float r = xc - n * 0x1.62e4p-1f;                     /* ln2_hi: n ln2_hi is exact */
    r = r - n * 0x1.7f7d1cp-20f;                         /* ln2_lo = ln2 - ln2_hi */
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    int32_t ni = (int32_t)n, n1 = ni / 2, n2 = ni - n1; /* each in [-75, 64]: normal scales */
    float s1 = gt_bits_f32((uint32_t)(n1 + 127) << 23); /* 2^n1 */
    float s2 = gt_bits_f32((uint32_t)(n2 + 127) << 23); /* 2^n2 */
    float y = (p * s1) * s2;
    y = x > hi ? __builtin_inff() : y;
    y = x < lo ? 0.0f : y;
    return x != x ? x : y;
}

/* y[j] = gt_cpu_expf(sign * x[j] - shift) for j < n (sign 1 or -1: an exact negation; the
 * subtraction rounded as written); y may be x. A GT_CPU_ELEMENT_LOOP: vectorized where it can be,
 * the bits of the scalar calls. */
void gt_cpu_exp_n(const float *x, float *y, int64_t n, float sign, float shift);
/* sum_j exp(x[j] - shift) in double, the bits of the sum in j order, the exps (gt_cpu_exp_n's)
 * also written to e when e is not NULL (e may be x): a softmax row's or a log-sum-exp's
 * denominator. (Summed in vector lanes where cpu_exp.c proves every partial sum exact.) */
double gt_cpu_exp_sum(const float *x, float *e, int64_t n, float shift);
/* max_j x[j] as the ordered loop m = x[j] > m ? x[j] : m from -inf finds it (NaNs skipped; -inf
 * when n is 0 or every element is NaN), vectorized; of an equal +0 and -0 either may come back. */
float gt_cpu_max_n(const float *x, int64_t n);

/* One prototype per op: gt_cpu_full, gt_cpu_add, ... */
#define X(E, name, nin, nout, flags, rule, alias, pairs, recompute, schema)                        \
    gt_status gt_cpu_##name(const gt_kernel_call *c, gt_error *err);
#include "graphtrain/gt_ops.def"
#undef X

/* ---------------------------------------------------------------- checks (cpu_util.c; the
 * backend-neutral ones are in ../kernel_check.h) */

/* GT_ERR_SHAPE "<op>: <what> is <type>, expected f32" unless t is f32. */
gt_status gt_cpu_want_f32(const gt_kernel_call *c, const gt_tensor *t, const char *what,
                          gt_error *err);
/* Element i of an i32/i64 tensor. */
static inline int64_t gt_cpu_index_at(const gt_tensor *t, int64_t i)
{
    return t->dtype == GT_I32 ? (int64_t)((const int32_t *)t->data)[i]
                              : ((const int64_t *)t->data)[i];
}

/* The embedding gradients (cpu_util.c), call c = (ids, dy) -> dw [rows, d]: dw = 0, then
 * dw[id - start] += dy[p] for every token p in order whose id lies in [start, start + rows), in
 * f32. all_in_range: an id outside [0, rows) is an error (embedding_backward) rather than skipped
 * (embedding_shard_backward, whose other ids are other ranks' rows). */
/* The loss gradients' operands (cpu_util.c): dloss an f32 scalar, dlogits f32 of logits' shape;
 * errors name the op of c. */
gt_status gt_cpu_ce_grad_check(const gt_kernel_call *c, const gt_tensor *logits,
                               const gt_tensor *dloss, const gt_tensor *dx, gt_error *err);
gt_status gt_cpu_embedding_scatter(const gt_kernel_call *c, int64_t start, bool all_in_range,
                                   gt_error *err);

/* ---------------------------------------------------------------- strided iteration (cpu_iter.c)
 *
 * Walks a row-major index space `shape` with up to GT_CPU_ITER_MAX operands, each with its own
 * per-dim element strides (0 = broadcast / reduced). The caller processes one innermost row at a
 * time: `len` elements, operand k starting at off[k] and stepping inner[k]. Dims that are size 1
 * are dropped and adjacent dims that are contiguous for every operand are merged, so the common
 * cases (same shape, [N, D] + [D]) become one or two long rows. The visiting order is always the
 * row-major order of the full index space, which is what makes reductions built on it ordered. */
#define GT_CPU_ITER_MAX 3

typedef struct {
    int ndim; /* after merging; >= 1 */
    int nops;
    int64_t shape[GT_MAX_DIMS];
    int64_t stride[GT_CPU_ITER_MAX][GT_MAX_DIMS];
    int64_t idx[GT_MAX_DIMS];
    int64_t rows; /* number of innermost rows */
    int64_t len;  /* elements per row */
    int64_t off[GT_CPU_ITER_MAX];
    int64_t inner[GT_CPU_ITER_MAX];
} gt_cpu_iter;

void gt_cpu_iter_init(gt_cpu_iter *it, int ndim, const int64_t *shape, int nops,
                      const int64_t *const *strides);
/* A reduction's walk: x (contiguous) in memory order as operand 0, the output's strides ostride
 * (0 on reduced dims) as operand 1. */
void gt_cpu_iter_reduce(gt_cpu_iter *it, const gt_tensor *x, const int64_t *ostride);
/* Moves off[] to the next row (call rows - 1 times after the first row). */
void gt_cpu_iter_next(gt_cpu_iter *it);
/* Moves it to row r (0 <= r < rows) of its walk, as r calls of gt_cpu_iter_next from row 0 do. */
void gt_cpu_iter_seek(gt_cpu_iter *it, int64_t r);

/* Strides that broadcast tensor shape `xs` (rank xn) to `out` (rank on) by numpy rules (aligned at
 * the right; a dim of 1 broadcasts with stride 0). False if they do not broadcast. */
bool gt_cpu_broadcast_strides(int on, const int64_t *out, int xn, const int64_t *xs,
                              int64_t *strides);

/* ---------------------------------------------------------------- shared math */

/* Ordered sum into `out` (numel of the reduced shape) of x walked with `ostride` (0 on the dims
 * that are summed away): each output element receives its terms in row-major order of x, in a
 * double accumulator, divided by `divisor` (1 for a sum, the count for a mean) before rounding.
 * Used by sum, mean and sum_to. GT_ERR_NOMEM names the op on failure. */
gt_status gt_cpu_sum_strided(const gt_kernel_call *c, const gt_tensor *x, const int64_t *ostride,
                             float *out, int64_t out_numel, double divisor, gt_error *err);

/* C = alpha * op(A) @ op(B) + beta * C, row-major, op = transpose when the flag is set; A is
 * stored [M, K] ([K, M] when ta), B [K, N] ([N, K] when tb), C [M, N]. Deterministic at a fixed
 * OpenBLAS thread count (see cpu_matmul.c for why bits may change with the count). K == 0
 * scales C by beta (0 gives zeros). The dims must fit OpenBLAS's int (gt_cpu_gemm_fits). */
void gt_cpu_sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                  const float *b, float beta, float *c);
/* gt_cpu_sgemm with explicit leading dimensions (elements between consecutive stored rows of A,
 * B and C; each at least its stored row length): the same products in the same order, on rows
 * that sit inside a larger row-major tensor (sdpa's [b, s, heads, d] layout). */
void gt_cpu_sgemm_ld(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                     int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc);
bool gt_cpu_gemm_fits(int64_t m, int64_t n, int64_t k);

/* ---------------------------------------------------------------- threads (cpu_pool.c) */

/* Runs job(i) for i in [0, n) on the backend's persistent threads (gt_cpu_set_threads' count, the
 * caller one of them) and returns when all are done; the result is that of the failed job of
 * lowest index (its message in err), GT_OK when none failed. Jobs must write disjoint data; which
 * thread runs a job never changes what it computes. Nested or concurrent calls run inline. */
gt_status gt_cpu_run_jobs(int n, gt_job_fn job, void *user, gt_error *err);
/* [0, n) cut into blocks of `grain` (the last shorter), fn(lo, hi, user) once per block, the blocks
 * on the pool's threads; one thread runs the same blocks in order. The partition depends on n and
 * grain only: pick grain from the shape, never from the thread count. */
typedef void (*gt_cpu_range_fn)(int64_t lo, int64_t hi, void *user);
void gt_cpu_parallel_for(int64_t n, int64_t grain, gt_cpu_range_fn fn, void *user);
/* About how many elements of an element loop one block gets, and so the smallest op that is cut
 * at all: a block costs some us, above a hand-off to a spinning worker (about 1 us). 65536 (most
 * of test_tiny's ops left on one thread) measured no better on the loaded 2-core VM
 * (2026-12-06), within its noise. Only speed depends on it (the kernels that use it compute
 * every element alone). */
#define GT_CPU_GRAIN 16384
/* Blocks of about GT_CPU_GRAIN elements in units of `per` elements (rows of a row kernel). */
static inline int64_t gt_cpu_grain_of(int64_t per)
{
    return per >= GT_CPU_GRAIN ? 1 : per > 0 ? GT_CPU_GRAIN / per : GT_CPU_GRAIN;
}

/* ---------------------------------------------------------------- GT_CPU_PROFILE (cpu_profile.c)
 *
 * Off unless the environment sets it; then kernels and sgemm calls add their times, printed at
 * exit. A kernel: depth = gt_cpu_prof_enter(), t0 = gt_cpu_prof_now(), run it,
 * gt_cpu_prof_op(op, depth, now - t0) (only depth 0, the outermost, counts). */
bool gt_cpu_prof_on(void);
double gt_cpu_prof_now(void);
int gt_cpu_prof_enter(void);
void gt_cpu_prof_op(gt_op op, int depth, double seconds);
void gt_cpu_prof_sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double seconds);

#endif
