/* test_cuda_shard_ops.c — CUDA vs CPU for the vocabulary-parallel local ops: embedding_shard,
 * embedding_shard_backward, logsumexp, cross_entropy_shard, cross_entropy_shard_backward.
 *
 * Each case builds random inputs, runs the CPU kernel (the reference, src/backend/cpu/cpu_shard.c)
 * and the CUDA kernel twice, and checks:
 *   - accuracy: max |gpu - cpu| / max |cpu| within 1e-5 in f32 and 1e-2 in bf16 (two bf16 ulps at
 *     the largest value: the f32 computations may differ in the last bit before rounding); NaN and
 *     inf where the CPU has them;
 *   - exactness where the math allows it: embedding_shard copies bytes and
 *     embedding_shard_backward adds f32 rows in token order on both sides, so those are bitwise
 *     the CPU's;
 *   - determinism and coverage: the device outputs are pre-filled with different byte patterns
 *     before the two runs, and the runs must give identical bits.
 * Shapes cover ids of the rank's rows and others (i32 and i64), repeated ids, rows of odd byte
 * length (the narrow copy path), a sort with several radix digits (Vl = 300), rows that are all
 * -inf, hold +inf or NaN, ignored targets, a batch with every target ignored (0/0 = NaN), and a
 * negative target, which the CUDA kernels flag on the stream's error word. Without a CUDA device
 * the test skips (exit 0). */
#include "cuda_test_util.h"
#include "graphtrain/gt_cuda.h"
#include "gt_test.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define SH(...) ((const int64_t[]){__VA_ARGS__})

static uint64_t rng_state = 0x5eed5eed12345678ull;

typedef struct {
    const char *name;
    gt_op op;
    int64_t i[GT_MAX_IATTR];
    int64_t e[GT_MAX_EATTR];
    int ni, ne, n_in;
    gt_tensor in[GT_MAX_IN], out;
} tcase;

static gt_cuda_stream *g_stream;

/* Uniform in [lo, hi) from this test's stream. */
static gt_tensor t_rand(gt_dtype dt, int ndim, const int64_t *shape, double lo, double hi)
{
    return cu_tensor_rand(&rng_state, dt, ndim, shape, lo, hi);
}

/* Ids in [lo, hi) from this test's stream, with those at k % every == 1 replaced by `special`
 * when every > 0. */
static gt_tensor t_ids(gt_dtype dt, int ndim, const int64_t *shape, int64_t lo, int64_t hi,
                       int64_t special, int every)
{
    return cu_tensor_ids(&rng_state, dt, ndim, shape, lo, hi, special, every);
}

static void tc_free(tcase *c)
{
    for (int k = 0; k < c->n_in; k++)
        gt_tensor_free(&c->in[k]);
    gt_tensor_free(&c->out);
}

/* The call with one output, *out. */
static gt_kernel_call tc_call(const tcase *c, gt_tensor *in, gt_tensor *out)
{
    return cu_kernel_call(c->op, c->i, c->ni, NULL, 0, c->e, c->ne, in, c->n_in, out, 1);
}

/* Runs the case on the CPU and twice on the GPU and checks it (exact: bitwise the CPU's); frees
 * the case. */
static void check(tcase *c, double tol, bool exact)
{
    gt_error err = {0};
    gt_kernel_call cpu = tc_call(c, c->in, &c->out);
    gt_status st = gt_cpu_run_kernel(&cpu, &err);
    EXPECT(st == GT_OK, "%s: CPU reference failed: %s", c->name, err.msg);
    if (st != GT_OK) {
        tc_free(c);
        return;
    }
    gt_tensor din[GT_MAX_IN], dout, run[2];
    for (int k = 0; k < c->n_in; k++)
        GT_CHECK(gt_cuda_tensor_upload(g_stream, &c->in[k], &din[k], &err) == GT_OK);
    GT_CHECK(gt_cuda_tensor_alloc(&dout, c->out.dtype, c->out.ndim, c->out.shape, &err) == GT_OK);
    gt_kernel_call gpu = tc_call(c, din, &dout);
    bool ran = true;
    for (int rep = 0; rep < 2; rep++) {
        run[rep] = cu_tensor_new(c->out.dtype, c->out.ndim, c->out.shape);
        if (!ran) continue;
        ran &= cu_fill_pattern(g_stream, &dout, rep == 0 ? 0xff : 0x5a);
        st = gt_cuda_run_kernel(&gpu, g_stream, &err);
        if (st == GT_OK) st = gt_cuda_stream_sync(g_stream, &err);
        EXPECT(st == GT_OK, "%s: CUDA kernel failed: %s", c->name, err.msg);
        ran &= st == GT_OK && gt_cuda_tensor_download(g_stream, &dout, &run[rep], &err) == GT_OK;
    }
    if (ran) {
        size_t nb = gt_tensor_nbytes(&c->out);
        bool same = memcmp(run[0].data, run[1].data, nb) == 0;
        bool equal_cpu = memcmp(run[0].data, c->out.data, nb) == 0;
        double e = cu_rel_err(&run[0], &c->out);
        printf("%-44s max rel err %.2e (bound %.0e)  %s%s\n", c->name, e, tol,
               same ? "bitwise-identical runs" : "RUNS DIFFER", equal_cpu ? ", = CPU bits" : "");
        EXPECT(e <= tol, "%s: max rel err %.3e above %.1e", c->name, e, tol);
        EXPECT(same, "%s: two GPU runs differ (or an output element is not written)", c->name);
        if (exact) EXPECT(equal_cpu, "%s: bitwise equal to the CPU", c->name);
    }
    for (int k = 0; k < c->n_in; k++)
        gt_cuda_tensor_free(&din[k]);
    gt_cuda_tensor_free(&dout);
    gt_tensor_free(&run[0]);
    gt_tensor_free(&run[1]);
    tc_free(c);
}

static double tol_of(gt_dtype ft)
{
    return ft == GT_F32 ? 1e-5 : 1e-2;
}

/* "op dtype detail" in a ring of buffers. */
static const char *nm(const char *op, gt_dtype ft, const char *detail)
{
    static char names[8][96];
    static int next;
    char *b = names[next++ % 8];
    snprintf(b, 96, "%s %s %s", op, gt_dtype_name(ft), detail);
    return b;
}

/* ---------------------------------------------------------------- cases */

static void case_embedding(gt_dtype ft)
{
    /* rows [5, 12) of a 20-row table; D = 12 (16-byte rows in f32 and bf16... ) and D = 5 (odd) */
    const int64_t dims[2] = {12, 5};
    const gt_dtype idt[2] = {GT_I64, GT_I32};
    for (int k = 0; k < 2; k++) {
        tcase c = {.name = nm("embedding_shard", ft, k ? "D=5 i32" : "D=12 i64"),
                   .op = GT_OP_EMBEDDING_SHARD,
                   .ne = 1,
                   .n_in = 2};
        c.e[0] = 5;
        c.in[0] = t_rand(ft, 2, SH(7, dims[k]), -2, 2);
        c.in[1] = t_ids(idt[k], 2, SH(3, 5), 0, 20, -1, 0);
        c.out = cu_tensor_new(ft, 3, SH(3, 5, dims[k]));
        check(&c, 0.0, true);
    }
    /* the backward: repeated ids (every third token is row 6), ids of other ranks */
    const int64_t vls[2] = {7, 300}, ns[2] = {36, 3000}, starts[2] = {5, 1000};
    for (int k = 0; k < 2; k++) {
        tcase c = {.name = nm("embedding_shard_backward", ft, k ? "Vl=300 N=3000" : "Vl=7 N=36"),
                   .op = GT_OP_EMBEDDING_SHARD_BACKWARD,
                   .ne = 2,
                   .n_in = 2};
        int64_t d = k ? 70 : 9;
        c.e[0] = vls[k];
        c.e[1] = starts[k];
        c.in[0] = t_ids(k ? GT_I32 : GT_I64, 1, SH(ns[k]), starts[k] - vls[k] / 2,
                        starts[k] + vls[k] + 3, starts[k] + 1, 3);
        c.in[1] = t_rand(ft, 2, SH(ns[k], d), -1, 1);
        c.out = cu_tensor_new(ft, 2, SH(vls[k], d));
        check(&c, tol_of(ft), ft == GT_F32);
    }
}

static void case_logsumexp(gt_dtype ft)
{
    tcase c = {.name = nm("logsumexp", ft, "[6, 300]"), .op = GT_OP_LOGSUMEXP, .n_in = 1};
    c.in[0] = t_rand(ft, 2, SH(6, 300), -8, 8);
    for (int64_t j = 0; j < 300; j++) {
        gt_tensor_set_f32(&c.in[0], 1 * 300 + j, -INFINITY); /* row 1: all -inf */
        /* row 2: large, needs the max */
        gt_tensor_set_f32(&c.in[0], 2 * 300 + j, (float)cu_urand(&rng_state, 60, 90));
    }
    gt_tensor_set_f32(&c.in[0], 3 * 300 + 17, INFINITY); /* row 3: +inf */
    gt_tensor_set_f32(&c.in[0], 4 * 300 + 5, NAN);       /* row 4: NaN */
    c.out = cu_tensor_new(GT_F32, 1, SH(6));
    check(&c, tol_of(ft), false);

    tcase d = {.name = nm("logsumexp", ft, "[2, 3, 1029]"), .op = GT_OP_LOGSUMEXP, .n_in = 1};
    d.in[0] = t_rand(ft, 3, SH(2, 3, 1029), -3, 3);
    d.out = cu_tensor_new(GT_F32, 2, SH(2, 3));
    check(&d, tol_of(ft), false);
}

/* logits [n, vl] of the rank holding vocabulary [start, start + vl); targets in [0, 3 vl) with
 * every third ignored (-100) unless all_ignored. */
static void ce_inputs(tcase *c, gt_dtype ft, int64_t n, int64_t vl, bool all_ignored)
{
    c->ni = 1;
    c->ne = 1;
    c->i[0] = -100;
    c->e[0] = vl;
    c->in[0] = t_rand(ft, 2, SH(n, vl), -4, 4);
    c->in[1] = t_ids(GT_I64, 1, SH(n), 0, 3 * vl, -100, all_ignored ? 1 : 3);
    if (all_ignored)
        for (int64_t i = 0; i < n; i++)
            ((int64_t *)c->in[1].data)[i] = -100;
    c->in[2] = t_rand(GT_F32, 1, SH(n), 5, 7);
}

static void case_cross_entropy(gt_dtype ft)
{
    for (int all_ignored = 0; all_ignored < 2; all_ignored++) {
        tcase c = {.name = nm("cross_entropy_shard", ft, all_ignored ? "all ignored" : "[40, 33]"),
                   .op = GT_OP_CROSS_ENTROPY_SHARD,
                   .n_in = 3};
        ce_inputs(&c, ft, 40, 33, all_ignored);
        c.out = cu_tensor_new(GT_F32, 0, NULL);
        check(&c, tol_of(ft), false);

        tcase b = {.name = nm("cross_entropy_shard_backward", ft,
                              all_ignored ? "all ignored" : "[40, 33]"),
                   .op = GT_OP_CROSS_ENTROPY_SHARD_BACKWARD,
                   .n_in = 4};
        ce_inputs(&b, ft, 40, 33, all_ignored);
        b.in[3] = cu_tensor_new(GT_F32, 0, NULL);
        gt_tensor_set_f32(&b.in[3], 0, 0.7f);
        b.out = cu_tensor_new(ft, 2, SH(40, 33));
        check(&b, tol_of(ft), false);
    }
    /* a long row: more columns than threads */
    tcase b = {.name = nm("cross_entropy_shard_backward", ft, "[5, 1500]"),
               .op = GT_OP_CROSS_ENTROPY_SHARD_BACKWARD,
               .n_in = 4};
    ce_inputs(&b, ft, 5, 1500, false);
    b.in[3] = cu_tensor_new(GT_F32, 0, NULL);
    gt_tensor_set_f32(&b.in[3], 0, 1.3f);
    b.out = cu_tensor_new(ft, 2, SH(5, 1500));
    check(&b, tol_of(ft), false);
}

/* A negative target that is not the ignore_index: the CPU refuses it; the CUDA kernels flag it and
 * the next sync reports it naming the op. */
static void case_bad_target(void)
{
    const gt_op ops[2] = {GT_OP_CROSS_ENTROPY_SHARD, GT_OP_CROSS_ENTROPY_SHARD_BACKWARD};
    for (int k = 0; k < 2; k++) {
        tcase c = {.name = "bad target", .op = ops[k], .n_in = k ? 4 : 3};
        ce_inputs(&c, GT_F32, 8, 4, false);
        ((int64_t *)c.in[1].data)[5] = -7;
        if (k) {
            c.in[3] = cu_tensor_new(GT_F32, 0, NULL);
            gt_tensor_set_f32(&c.in[3], 0, 1.0f);
            c.out = cu_tensor_new(GT_F32, 2, SH(8, 4));
        } else {
            c.out = cu_tensor_new(GT_F32, 0, NULL);
        }
        gt_error err = {0};
        gt_kernel_call cpu = tc_call(&c, c.in, &c.out);
        EXPECT(gt_cpu_run_kernel(&cpu, &err) == GT_ERR_INVALID, "CPU refuses target -7");
        gt_tensor din[4], dout;
        for (int j = 0; j < c.n_in; j++)
            GT_CHECK(gt_cuda_tensor_upload(g_stream, &c.in[j], &din[j], &err) == GT_OK);
        GT_CHECK(gt_cuda_tensor_alloc(&dout, c.out.dtype, c.out.ndim, c.out.shape, &err) == GT_OK);
        gt_kernel_call gpu = tc_call(&c, din, &dout);
        gt_status st = gt_cuda_run_kernel(&gpu, g_stream, &err);
        if (st == GT_OK) st = gt_cuda_stream_sync(g_stream, &err);
        EXPECT(st == GT_ERR_INVALID && strstr(err.msg, gt_op_get(ops[k])->name) &&
                   strstr(err.msg, " 5 "),
               "%s: a negative target is reported naming the op and row 5: %s",
               gt_op_get(ops[k])->name, err.msg);
        for (int j = 0; j < c.n_in; j++)
            gt_cuda_tensor_free(&din[j]);
        gt_cuda_tensor_free(&dout);
        tc_free(&c);
    }
}

int main(void)
{
    int rc = cu_test_start(NULL, &g_stream);
    if (rc >= 0) return rc;
    const gt_dtype fts[2] = {GT_F32, GT_BF16};
    for (int k = 0; k < 2; k++) {
        case_embedding(fts[k]);
        case_logsumexp(fts[k]);
        case_cross_entropy(fts[k]);
    }
    case_bad_target();
    gt_cuda_stream_destroy(g_stream);
    return gt_test_finish();
}
