/* test_cpu_threads.c — the CPU kernels that go in blocks to the backend's threads give the bits of
 * one thread on 2, 3 and 7 threads: elementwise ops (same shapes, a broadcast row, a broadcast
 * middle dim), unary ops, a fused element program with a broadcast input, AdamW, rms_norm and
 * its backward (dw summed by column blocks), rope (with per-token positions), cross-entropy and
 * its gradient (ignored rows included), embedding_backward and sum_squares. Shapes are several
 * blocks long with a short last block, and NaN, infinities and a -0 are planted. The pool itself:
 * a kernel called from inside a job (attention's products) and calls back to back at changing
 * thread counts. Each kernel's values are checked against references in its own test; here the
 * property is thread-count independence, bit for bit. One thread runs the same blocks, so the
 * partition itself is checked too, against references that know no blocks: the same kernel on
 * one row at a time (too small to be cut), or the exact f32/double formula where it is a single
 * IEEE operation or an ordered sum (elementwise arithmetic, dw, embedding_backward, sum_squares).
 */
#include "backend/cpu/cpu_internal.h"
#include "ir/fused_program.h"
#include "test_cpu_util.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>

static const int g_threads[] = {2, 3, 7};

/* Runs k on one thread, then on each count of g_threads: every output must have the same bits
 * (tt_deterministic also proves every element is written). */
static void check_threads(tt_call *k, const char *what)
{
    gt_cpu_set_threads(1);
    if (!tt_run_ok(k, what)) return;
    gt_tensor first[GT_MAX_OUT];
    for (int o = 0; o < k->c.n_out; o++) {
        first[o] = tt_new(k->c.out[o]->dtype, k->c.out[o]->ndim, k->c.out[o]->shape);
        memcpy(first[o].data, k->c.out[o]->data, gt_tensor_nbytes(&first[o]));
    }
    for (size_t t = 0; t < sizeof g_threads / sizeof g_threads[0]; t++) {
        gt_cpu_set_threads(g_threads[t]);
        bool same = tt_deterministic(k);
        for (int o = 0; o < k->c.n_out; o++)
            same = same && tt_same_bits(&first[o], k->c.out[o]);
        EXPECT(same, "%s: the bits of one thread on %d threads", what, g_threads[t]);
    }
    gt_cpu_set_threads(1);
    for (int o = 0; o < k->c.n_out; o++)
        gt_tensor_free(&first[o]);
}

/* Operand slicing for row_by_row: a sliced operand is viewed as `rows` tensors of shape
 * shape[0..ndim) (one row's), `row` elements apart; an unsliced one is passed whole. */
typedef struct {
    bool sliced;
    int ndim;
    int64_t shape[4];
    int64_t row;
} tt_slice;

/* k (already run) against k run on each row alone: the sliced outputs must match bit for bit. */
static bool row_by_row(const tt_call *k, int64_t rows, const tt_slice *in, const tt_slice *out)
{
    bool same = true;
    for (int64_t r = 0; r < rows && same; r++) {
        tt_call kr = *k;
        gt_tensor ti[GT_MAX_IN], to[GT_MAX_OUT];
        for (int j = 0; j < k->c.n_in; j++) {
            if (!in[j].sliced) continue;
            const gt_tensor *t = k->c.in[j];
            gt_tensor_wrap(&ti[j], t->dtype, in[j].ndim, in[j].shape,
                           (char *)t->data + r * in[j].row * (int64_t)gt_dtype_size(t->dtype));
            kr.c.in[j] = &ti[j];
        }
        for (int j = 0; j < k->c.n_out; j++) {
            const gt_tensor *t = k->c.out[j];
            to[j] = tt_new(t->dtype, out[j].ndim, out[j].shape);
            kr.c.out[j] = &to[j];
        }
        if (!tt_run_ok(&kr, "one row")) return false;
        for (int j = 0; j < k->c.n_out; j++) {
            if (out[j].sliced)
                same = same && memcmp(to[j].data,
                                      (const char *)k->c.out[j]->data +
                                          r * out[j].row * (int64_t)gt_dtype_size(to[j].dtype),
                                      gt_tensor_nbytes(&to[j])) == 0;
            gt_tensor_free(&to[j]);
        }
    }
    return same;
}

static bool same_f32(float a, float b)
{
    return memcmp(&a, &b, sizeof a) == 0;
}

static void plant_specials(gt_tensor *t)
{
    int64_t n = gt_tensor_numel(t);
    gt_tensor_set_f32(t, n / 3, NAN);
    gt_tensor_set_f32(t, n / 2, INFINITY);
    gt_tensor_set_f32(t, n - 1, -0.0f);
}

static void test_elementwise(tt_rng *r)
{
    const struct {
        gt_op op;
        int an, bn, on;
        int64_t as[3], bs[3], os[3];
    } cases[] = {
        {GT_OP_ADD, 2, 2, 2, {5, 70001}, {5, 70001}, {5, 70001}}, /* one long row: element blocks */
        {GT_OP_MUL, 2, 1, 2, {1200, 257}, {257}, {1200, 257}},    /* rows, b broadcast */
        {GT_OP_SUB, 3, 3, 3, {160, 3, 301}, {160, 1, 301}, {160, 3, 301}}, /* a middle dim */
        {GT_OP_DIV, 2, 2, 2, {1, 401}, {403, 1}, {403, 401}}, /* both broadcast: an outer product */
        {GT_OP_SILU_BACKWARD, 2, 2, 2, {200, 1001}, {200, 1001}, {200, 1001}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        gt_tensor a = tt_rand(cases[c].an, cases[c].as, r, -4, 4);
        gt_tensor b = tt_rand(cases[c].bn, cases[c].bs, r, -4, 4);
        plant_specials(&a);
        gt_tensor out = tt_new(GT_F32, cases[c].on, cases[c].os);
        tt_call k;
        tt_init(&k, cases[c].op);
        tt_in(&k, &a);
        tt_in(&k, &b);
        tt_out(&k, &out);
        char what[64];
        snprintf(what, sizeof what, "elementwise case %zu", c);
        check_threads(&k, what);
        bool same = true;
        if (cases[c].op == GT_OP_SILU_BACKWARD) {
            tt_slice in[2] = {{true, 2, {1, 1001}, 1001}, {true, 2, {1, 1001}, 1001}};
            tt_slice out1[1] = {{true, 2, {1, 1001}, 1001}};
            same = row_by_row(&k, 200, in, out1);
        } else {
            const float *ap = a.data, *bp = b.data, *op = out.data;
            for (int64_t i = 0; i < gt_tensor_numel(&out) && same; i++) {
                int64_t idx[3];
                tt_unravel(i, cases[c].on, cases[c].os, idx);
                float x = ap[tt_ravel_bcast(idx, cases[c].on, cases[c].an, cases[c].as)];
                float y = bp[tt_ravel_bcast(idx, cases[c].on, cases[c].bn, cases[c].bs)];
                float want = cases[c].op == GT_OP_ADD   ? x + y
                             : cases[c].op == GT_OP_MUL ? x * y
                             : cases[c].op == GT_OP_SUB ? x - y
                                                        : x / y;
                same = same_f32(op[i], want);
            }
        }
        EXPECT(same, "%s: the bits of the unblocked reference", what);
        gt_tensor_free(&a);
        gt_tensor_free(&b);
        gt_tensor_free(&out);
    }
    const gt_op unary[] = {GT_OP_SILU, GT_OP_EXP, GT_OP_SQRT, GT_OP_SCALE, GT_OP_ADD_SCALAR};
    for (size_t u = 0; u < sizeof unary / sizeof unary[0]; u++) {
        gt_tensor x = tt_rand(2, TT_SHAPE(100, 2001), r, -3, 3),
                  y = tt_new(GT_F32, 2, TT_SHAPE(100, 2001));
        plant_specials(&x);
        tt_call k;
        tt_init(&k, unary[u]);
        tt_in(&k, &x);
        tt_out(&k, &y);
        if (unary[u] == GT_OP_SCALE || unary[u] == GT_OP_ADD_SCALAR) tt_f(&k, 0.37);
        char what[64];
        snprintf(what, sizeof what, "unary op %d", unary[u]);
        check_threads(&k, what);
        tt_slice rs[1] = {{true, 2, {1, 2001}, 2001}};
        EXPECT(row_by_row(&k, 100, rs, rs), "%s: the bits of one row at a time", what);
        gt_tensor_free(&x);
        gt_tensor_free(&y);
    }
}

/* out = add(silu(mul(x0, x1)), x2) rounded to bf16 on the way (a cast in the middle), x2 [D]
 * broadcast over the rows, and the product as a second output. */
static void test_fused(tt_rng *r)
{
    const int64_t rows = 270, d = 999;
    gt_tensor x0 = tt_rand(2, TT_SHAPE(rows, d), r, -3, 3),
              x1 = tt_rand(2, TT_SHAPE(rows, d), r, -3, 3);
    gt_tensor x2 = tt_rand(1, TT_SHAPE(d), r, -1, 1);
    plant_specials(&x0);
    gt_tensor o0 = tt_new(GT_F32, 2, TT_SHAPE(rows, d)), o1 = tt_new(GT_F32, 2, TT_SHAPE(rows, d));
    tt_call k;
    tt_init(&k, GT_OP_FUSED_ELEMENTWISE);
    tt_in(&k, &x0);
    tt_in(&k, &x1);
    tt_in(&k, &x2);
    tt_out(&k, &o0);
    tt_out(&k, &o1);
    tt_i(&k, gt_fused_encode_out(GT_OP_MUL, GT_F32, 0, 1, 0, true));
    tt_i(&k, gt_fused_encode(GT_OP_SILU, GT_BF16, GT_FUSED_TEMP + 0, 0, 0));
    tt_i(&k, gt_fused_encode(GT_OP_ADD, GT_F32, GT_FUSED_TEMP + 1, 2, 0));
    check_threads(&k, "fused_elementwise");
    tt_slice in[3] = {{true, 2, {1, d}, d}, {true, 2, {1, d}, d}, {false, 0, {0}, 0}};
    tt_slice out[2] = {{true, 2, {1, d}, d}, {true, 2, {1, d}, d}};
    EXPECT(row_by_row(&k, rows, in, out), "fused_elementwise: the bits of one row at a time");
    gt_tensor *all[] = {&x0, &x1, &x2, &o0, &o1};
    for (size_t j = 0; j < sizeof all / sizeof all[0]; j++)
        gt_tensor_free(all[j]);
}

static void test_adamw(tt_rng *r)
{
    const int64_t shape[] = {137, 2003};
    gt_tensor p = tt_rand(2, shape, r, -1, 1), g = tt_rand(2, shape, r, -1, 1);
    gt_tensor m = tt_rand(2, shape, r, -0.1, 0.1), v = tt_rand(2, shape, r, 0, 0.01);
    plant_specials(&g);
    gt_tensor scal = tt_new(GT_F32, 1, TT_SHAPE(3)), clip = tt_new(GT_F32, 0, NULL);
    gt_tensor_set_f32(&scal, 0, 1e-3f);
    gt_tensor_set_f32(&scal, 1, 0.1f);
    gt_tensor_set_f32(&scal, 2, 0.05f);
    gt_tensor_set_f32(&clip, 0, 0.5f);
    gt_tensor po = tt_new(GT_F32, 2, shape), mo = tt_new(GT_F32, 2, shape),
              vo = tt_new(GT_F32, 2, shape);
    tt_call k;
    tt_init(&k, GT_OP_ADAMW);
    const gt_tensor *ins[6] = {&p, &g, &m, &v, &scal, &clip};
    for (int j = 0; j < 6; j++)
        tt_in(&k, ins[j]);
    tt_out(&k, &po);
    tt_out(&k, &mo);
    tt_out(&k, &vo);
    tt_f(&k, 0.9);
    tt_f(&k, 0.95);
    tt_f(&k, 1e-8);
    tt_f(&k, 0.1);
    check_threads(&k, "adamw");
    tt_slice row = {true, 2, {1, shape[1]}, shape[1]}, whole = {false, 0, {0}, 0};
    tt_slice in[6] = {row, row, row, row, whole, whole}, out[3] = {row, row, row};
    EXPECT(row_by_row(&k, shape[0], in, out), "adamw: the bits of one row at a time");
    gt_tensor *all[] = {&p, &g, &m, &v, &scal, &clip, &po, &mo, &vo};
    for (size_t j = 0; j < sizeof all / sizeof all[0]; j++)
        gt_tensor_free(all[j]);
}

static void test_norms(tt_rng *r)
{
    const int64_t rows = 301, d = 517;
    gt_tensor x = tt_rand(2, TT_SHAPE(rows, d), r, -2, 2), w = tt_rand(1, TT_SHAPE(d), r, 0.5, 1.5);
    gt_tensor dy = tt_rand(2, TT_SHAPE(rows, d), r, -1, 1);
    gt_tensor y = tt_new(GT_F32, 2, TT_SHAPE(rows, d)), dx = tt_new(GT_F32, 2, TT_SHAPE(rows, d));
    gt_tensor dw = tt_new(GT_F32, 1, TT_SHAPE(d));
    tt_call k;
    tt_init(&k, GT_OP_RMS_NORM);
    tt_in(&k, &x);
    tt_in(&k, &w);
    tt_out(&k, &y);
    tt_f(&k, 1e-5);
    check_threads(&k, "rms_norm");
    tt_slice row = {true, 2, {1, d}, d}, whole = {false, 0, {0}, 0};
    tt_slice in[3] = {row, whole, row}, out[2] = {row, {false, 1, {d}, 0}};
    EXPECT(row_by_row(&k, rows, in, out), "rms_norm: the bits of one row at a time");
    tt_call kb;
    tt_init(&kb, GT_OP_RMS_NORM_BACKWARD);
    tt_in(&kb, &x);
    tt_in(&kb, &w);
    tt_in(&kb, &dy);
    tt_out(&kb, &dx);
    tt_out(&kb, &dw);
    tt_f(&kb, 1e-5);
    check_threads(&kb, "rms_norm_backward");
    EXPECT(row_by_row(&kb, rows, in, out), "rms_norm_backward dx: the bits of one row at a time");
    /* dw: per column, the rows' dy * xhat in row order in double (the kernel's formula) */
    const float *xp = x.data, *gp = dy.data, *dwp = dw.data;
    double *acc = tt_doubles(d);
    for (int64_t i = 0; i < rows; i++) {
        double ss = 0.0;
        for (int64_t j = 0; j < d; j++)
            ss += (double)xp[i * d + j] * xp[i * d + j];
        double sc = 1.0 / sqrt(ss / (double)d + 1e-5);
        for (int64_t j = 0; j < d; j++) {
            double xhat = xp[i * d + j] * sc;
            acc[j] += gp[i * d + j] * xhat;
        }
    }
    bool same = true;
    for (int64_t j = 0; j < d; j++)
        same = same && same_f32(dwp[j], (float)acc[j]);
    EXPECT(same, "rms_norm_backward dw: the bits of the ordered column sums");
    free(acc);
    gt_tensor *all[] = {&x, &w, &dy, &y, &dx, &dw};
    for (size_t j = 0; j < sizeof all / sizeof all[0]; j++)
        gt_tensor_free(all[j]);
}

static void test_rope(tt_rng *r)
{
    const int64_t b = 2, s = 150, h = 5, d = 64;
    gt_tensor x = tt_rand(4, TT_SHAPE(b, s, h, d), r, -1, 1),
              y = tt_new(GT_F32, 4, TT_SHAPE(b, s, h, d));
    gt_tensor pos = tt_new(GT_I64, 2, TT_SHAPE(b, s));
    for (int64_t i = 0; i < b * s; i++)
        ((int64_t *)pos.data)[i] = (i * 7) % 211;
    for (int with_pos = 0; with_pos < 2; with_pos++) {
        for (int inverse = 0; inverse < 2; inverse++) {
            tt_call k;
            tt_init(&k, GT_OP_ROPE);
            tt_in(&k, &x);
            if (with_pos) tt_in(&k, &pos);
            tt_out(&k, &y);
            tt_i(&k, inverse);
            tt_i(&k, 0);
            tt_f(&k, 500000.0);
            tt_f(&k, 8.0);
            tt_f(&k, 1.0);
            tt_f(&k, 4.0);
            char what[64];
            snprintf(what, sizeof what, "rope positions %d inverse %d", with_pos, inverse);
            check_threads(&k, what);
            if (with_pos) { /* one token at a time, at its position */
                tt_slice tok = {true, 4, {1, 1, h, d}, h * d};
                tt_slice in[2] = {tok, {true, 2, {1, 1}, 1}};
                EXPECT(row_by_row(&k, b * s, in, &tok), "%s: the bits of one token at a time",
                       what);
            }
        }
    }
    gt_tensor_free(&x);
    gt_tensor_free(&y);
    gt_tensor_free(&pos);
}

static void test_loss(tt_rng *r)
{
    const int64_t rows = 203, v = 1001;
    gt_tensor logits = tt_rand(2, TT_SHAPE(rows, v), r, -6, 6),
              targets = tt_new(GT_I64, 1, TT_SHAPE(rows));
    for (int64_t i = 0; i < rows; i++)
        ((int64_t *)targets.data)[i] = i % 17 == 3 ? -100 : (int64_t)(tt_next(r) % (uint64_t)v);
    gt_tensor loss = tt_new(GT_F32, 0, NULL), dloss = tt_new(GT_F32, 0, NULL);
    gt_tensor_set_f32(&dloss, 0, 1.25f);
    gt_tensor dx = tt_new(GT_F32, 2, TT_SHAPE(rows, v));
    tt_call k;
    tt_init(&k, GT_OP_CROSS_ENTROPY);
    tt_in(&k, &logits);
    tt_in(&k, &targets);
    tt_out(&k, &loss);
    tt_i(&k, -100);
    check_threads(&k, "cross_entropy");
    tt_call kb;
    tt_init(&kb, GT_OP_CROSS_ENTROPY_BACKWARD);
    tt_in(&kb, &logits);
    tt_in(&kb, &targets);
    tt_in(&kb, &dloss);
    tt_out(&kb, &dx);
    tt_i(&kb, -100);
    check_threads(&kb, "cross_entropy_backward");

    /* embedding_backward: 3000 rows of 64, 700 tokens with repeats (rows summed in token order) */
    const int64_t vocab = 3000, dim = 64, n = 700;
    gt_tensor ids = tt_new(GT_I64, 1, TT_SHAPE(n)), dy = tt_rand(2, TT_SHAPE(n, dim), r, -1, 1);
    for (int64_t p = 0; p < n; p++)
        ((int64_t *)ids.data)[p] = (int64_t)(tt_next(r) % 400) * 7;
    gt_tensor dw = tt_new(GT_F32, 2, TT_SHAPE(vocab, dim));
    tt_call ke;
    tt_init(&ke, GT_OP_EMBEDDING_BACKWARD);
    tt_in(&ke, &ids);
    tt_in(&ke, &dy);
    tt_out(&ke, &dw);
    tt_e(&ke, vocab);
    check_threads(&ke, "embedding_backward");
    float *want = calloc((size_t)(vocab * dim), sizeof *want);
    for (int64_t p = 0; p < n; p++)
        for (int64_t j = 0; j < dim; j++)
            want[((int64_t *)ids.data)[p] * dim + j] += ((const float *)dy.data)[p * dim + j];
    EXPECT(memcmp(want, dw.data, (size_t)(vocab * dim) * sizeof *want) == 0,
           "embedding_backward: the bits of the token-order sums");
    free(want);

    gt_tensor x = tt_rand(2, TT_SHAPE(9, 11113), r, -3, 3), ss = tt_new(GT_F32, 0, NULL);
    tt_call ks;
    tt_init(&ks, GT_OP_SUM_SQUARES);
    tt_in(&ks, &x);
    tt_out(&ks, &ss);
    tt_i(&ks, 0);
    tt_i(&ks, 0);
    tt_i(&ks, 1);
    check_threads(&ks, "sum_squares");
    double sum = 0.0;
    for (int64_t i = 0; i < gt_tensor_numel(&x); i++) {
        float q = ((const float *)x.data)[i] * ((const float *)x.data)[i];
        sum += q;
    }
    EXPECT(same_f32(*(const float *)ss.data, (float)sum), "sum_squares: the ordered double sum");
    gt_tensor *all[] = {&logits, &targets, &loss, &dloss, &dx, &ids, &dy, &dw, &x, &ss};
    for (size_t j = 0; j < sizeof all / sizeof all[0]; j++)
        gt_tensor_free(all[j]);
}

/* ---------------------------------------------------------------- the pool */

typedef struct {
    atomic_int runs[64];
    atomic_int inner[64 * 8];
    int outer; /* the job of the nested call */
} pool_ctx;

static gt_status pool_inner_job(int j, void *user, gt_error *err)
{
    (void)err;
    pool_ctx *p = user;
    atomic_fetch_add(&p->inner[p->outer * 8 + j], 1);
    return GT_OK;
}

/* Every 16th job makes a call of its own (as attention's jobs call the blocked sgemm): it must run
 * inline, each of its jobs once. Jobs 37 and 41 fail: the call reports 37's error. */
static gt_status pool_job(int i, void *user, gt_error *err)
{
    pool_ctx *p = user;
    atomic_fetch_add(&p->runs[i], 1);
    if (i % 16 == 0) {
        pool_ctx local = {0};
        gt_status st = gt_cpu_run_jobs(8, pool_inner_job, &local, err);
        for (int j = 0; j < 8 && st == GT_OK; j++)
            atomic_fetch_add(&p->inner[i * 8 + j], atomic_load(&local.inner[j]));
    }
    return i == 37 || i == 41 ? gt_error_set(err, GT_ERR_INVALID, "job %d failed", i) : GT_OK;
}

static void test_pool(void)
{
    for (int t = 1; t <= 4; t++) {
        gt_cpu_set_threads(t);
        for (int rep = 0; rep < 200; rep++) {
            pool_ctx p = {0};
            gt_error err = {0};
            gt_status st = gt_cpu_run_jobs(64, pool_job, &p, &err);
            bool once = true;
            for (int i = 0; i < 64; i++) {
                once = once && atomic_load(&p.runs[i]) == 1;
                for (int j = 0; j < 8; j++)
                    once = once && atomic_load(&p.inner[i * 8 + j]) == (i % 16 == 0);
            }
            if (!once || st != GT_ERR_INVALID || !strstr(err.msg, "job 37")) {
                EXPECT(false, "%d threads, call %d: every job once (%d), the lowest failure (%s)",
                       t, rep, once, err.msg);
                break;
            }
        }
    }
    gt_cpu_set_threads(1);
}

int main(void)
{
    tt_rng r = {0x7e4d};
    test_pool();
    test_elementwise(&r);
    test_fused(&r);
    test_adamw(&r);
    test_norms(&r);
    test_rope(&r);
    test_loss(&r);
    return gt_test_finish();
}
