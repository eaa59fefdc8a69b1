/* test_cpu_attention_docs.c — block-causal sdpa (packed documents, a positions input) and rope at
 * per-token positions on the CPU.
 *
 * sdpa and sdpa_backward with positions [b, s] (query i sees keys i - positions[i] .. i) against a
 * naive double masked attention written from the mask's definition (document ids counted where
 * positions restart at 0, as torchtitan's document mask_mod; a key is visible when it has the
 * query's document id and is not later), and their gradients against central finite differences of
 * that reference: documents of length 1, one whole-sequence document, many short documents,
 * documents that cross the kernel's 128-row query blocks, GQA, both layouts. A sequence that is one
 * document gives bitwise the causal call's results (forward and backward). Determinism, the same
 * bits on 3 threads, the bf16 wrapper. Positions that are not a document's (p > i, p < 0) and
 * positions without causal are errors. rope with positions: bitwise the rope of a token placed at
 * its position; positions 0..s-1 bitwise the rope without positions. */
#include "test_cpu_util.h"

typedef struct {
    int64_t b, hq, hkv, s, d, dv;
    double scale;
    int layout;
} doc_case;

/* Positions of rows of documents: every document doc_len long, or 1..9 drawn from the rng. */
static void fill_positions(int64_t *pos, int64_t b, int64_t s, int64_t doc_len, tt_rng *r)
{
    for (int64_t bi = 0; bi < b; bi++) {
        int64_t i = 0;
        while (i < s) {
            int64_t len = doc_len > 0 ? doc_len : 1 + (int64_t)(tt_next(r) % 9);
            for (int64_t k = 0; k < len && i < s; k++, i++)
                pos[bi * s + i] = k;
        }
    }
}

/* Index of element (bi, h, i, c) of a [b, heads, n, w] tensor in the case's layout. */
static int64_t at(const doc_case *a, int64_t heads, int64_t n, int64_t w, int64_t bi, int64_t h,
                  int64_t i, int64_t c)
{
    return a->layout ? ((bi * n + i) * heads + h) * w + c : ((bi * heads + h) * n + i) * w + c;
}

/* Visible: key j has query i's document id and j <= i (ids: positions == 0 starts a document). */
static void ref_sdpa_docs(const doc_case *a, const int64_t *pos, const double *q, const double *k,
                          const double *v, double *out, double *lse)
{
    int64_t *doc = malloc((size_t)a->s * sizeof *doc);
    double *l = tt_doubles(a->s);
    for (int64_t bi = 0; bi < a->b; bi++) {
        for (int64_t i = 0, id = -1; i < a->s; i++)
            doc[i] = id += pos[bi * a->s + i] == 0;
        for (int64_t h = 0; h < a->hq; h++) {
            int64_t kh = h / (a->hq / a->hkv);
            for (int64_t i = 0; i < a->s; i++) {
                double mx = -INFINITY, sum = 0.0;
                for (int64_t j = 0; j <= i; j++) {
                    if (doc[j] != doc[i]) continue;
                    double dot = 0.0;
                    for (int64_t c = 0; c < a->d; c++)
                        dot += q[at(a, a->hq, a->s, a->d, bi, h, i, c)] *
                               k[at(a, a->hkv, a->s, a->d, bi, kh, j, c)];
                    l[j] = a->scale * dot;
                    mx = fmax(mx, l[j]);
                }
                for (int64_t j = 0; j <= i; j++)
                    if (doc[j] == doc[i]) sum += exp(l[j] - mx);
                double ls = mx + log(sum);
                if (lse) lse[(bi * a->hq + h) * a->s + i] = ls;
                for (int64_t c = 0; c < a->dv; c++) {
                    double o = 0.0;
                    for (int64_t j = 0; j <= i; j++)
                        if (doc[j] == doc[i])
                            o += exp(l[j] - ls) * v[at(a, a->hkv, a->s, a->dv, bi, kh, j, c)];
                    out[at(a, a->hq, a->s, a->dv, bi, h, i, c)] = o;
                }
            }
        }
    }
    free(doc);
    free(l);
}

typedef struct {
    const doc_case *a;
    const int64_t *pos;
    double *q, *k, *v, *dout, *out;
    int64_t nout;
} docs_ctx;

static double docs_objective(void *p)
{
    docs_ctx *c = p;
    ref_sdpa_docs(c->a, c->pos, c->q, c->k, c->v, c->out, NULL);
    double l = 0.0;
    for (int64_t i = 0; i < c->nout; i++)
        l += c->dout[i] * c->out[i];
    return l;
}

/* Shape [b, heads, n, w] in the case's layout. */
static gt_tensor new_in(const doc_case *a, int64_t heads, int64_t w, tt_rng *r, double lo,
                        double hi)
{
    int64_t sh[4] = {a->b, a->layout ? a->s : heads, a->layout ? heads : a->s, w};
    return r ? tt_rand(4, sh, r, lo, hi) : tt_new(GT_F32, 4, sh);
}

static void call_init(tt_call *k, gt_op op, const doc_case *a, gt_tensor *const *in, int n_in,
                      gt_tensor *const *out, int n_out)
{
    tt_init(k, op);
    for (int j = 0; j < n_in; j++)
        tt_in(k, in[j]);
    for (int j = 0; j < n_out; j++)
        tt_out(k, out[j]);
    tt_i(k, 1);
    tt_i(k, a->layout);
    tt_f(k, a->scale);
}

/* doc_len > 0: documents of that length; 0: random lengths 1..9; -1: one document. */
static void run_docs_case(const doc_case *a, int64_t doc_len, tt_rng *r, bool fd)
{
    gt_tensor q = new_in(a, a->hq, a->d, r, -1.5, 1.5), k = new_in(a, a->hkv, a->d, r, -1.5, 1.5);
    gt_tensor v = new_in(a, a->hkv, a->dv, r, -1, 1), dout = new_in(a, a->hq, a->dv, r, -1, 1);
    gt_tensor out = new_in(a, a->hq, a->dv, NULL, 0, 0);
    gt_tensor lse = tt_new(GT_F32, 3, TT_SHAPE(a->b, a->hq, a->s));
    gt_tensor dq = new_in(a, a->hq, a->d, NULL, 0, 0), dk = new_in(a, a->hkv, a->d, NULL, 0, 0);
    gt_tensor dv = new_in(a, a->hkv, a->dv, NULL, 0, 0);
    gt_tensor pos = tt_new(GT_I64, 2, TT_SHAPE(a->b, a->s));
    int64_t *pp = pos.data;
    if (doc_len < 0)
        for (int64_t i = 0; i < a->b * a->s; i++)
            pp[i] = i % a->s;
    else
        fill_positions(pp, a->b, a->s, doc_len, r);

    docs_ctx ctx = {a,
                    pp,
                    tt_to_double(&q),
                    tt_to_double(&k),
                    tt_to_double(&v),
                    tt_to_double(&dout),
                    NULL,
                    gt_tensor_numel(&out)};
    ctx.out = tt_doubles(ctx.nout);
    double *ref_lse = tt_doubles(gt_tensor_numel(&lse));
    ref_sdpa_docs(a, pp, ctx.q, ctx.k, ctx.v, ctx.out, ref_lse);

    tt_call kf, kb;
    gt_tensor *fin[4] = {&q, &k, &v, &pos}, *fout[2] = {&out, &lse};
    call_init(&kf, GT_OP_SDPA, a, fin, 4, fout, 2);
    if (tt_run_ok(&kf, "sdpa docs")) {
        EXPECT(tt_close(&out, ctx.out, 1e-5, 1e-5, "sdpa docs out"), "s %lld doc_len %lld",
               (long long)a->s, (long long)doc_len);
        EXPECT(tt_close(&lse, ref_lse, 1e-5, 1e-6, "sdpa docs lse"), "s %lld doc_len %lld",
               (long long)a->s, (long long)doc_len);
    }
    EXPECT(tt_deterministic(&kf), "sdpa docs determinism");
    gt_tensor out1 = new_in(a, a->hq, a->dv, NULL, 0, 0);
    memcpy(out1.data, out.data, gt_tensor_nbytes(&out));
    gt_cpu_set_threads(3);
    EXPECT(tt_run_ok(&kf, "sdpa docs, 3 threads") && tt_same_bits(&out, &out1),
           "sdpa docs on 3 threads differs from 1");
    gt_cpu_set_threads(1);
    EXPECT(tt_half_path(&kf, GT_BF16, 1u << 1), "sdpa docs bf16 (lse kept f32)");
    tt_run_ok(&kf, "sdpa docs again");

    gt_tensor *bin[7] = {&q, &k, &v, &out, &lse, &dout, &pos}, *bout[3] = {&dq, &dk, &dv};
    call_init(&kb, GT_OP_SDPA_BACKWARD, a, bin, 7, bout, 3);
    if (fd && tt_run_ok(&kb, "sdpa_backward docs")) {
        double *g[3] = {tt_doubles(gt_tensor_numel(&q)), tt_doubles(gt_tensor_numel(&k)),
                        tt_doubles(gt_tensor_numel(&v))};
        tt_fd(ctx.q, gt_tensor_numel(&q), 1e-4, docs_objective, &ctx, g[0]);
        tt_fd(ctx.k, gt_tensor_numel(&k), 1e-4, docs_objective, &ctx, g[1]);
        tt_fd(ctx.v, gt_tensor_numel(&v), 1e-4, docs_objective, &ctx, g[2]);
        EXPECT(tt_close_abs(&dq, g[0], 1e-4, 1e-5, 1e-6, "docs dq"), "doc_len %lld",
               (long long)doc_len);
        EXPECT(tt_close_abs(&dk, g[1], 1e-4, 1e-5, 1e-6, "docs dk"), "doc_len %lld",
               (long long)doc_len);
        EXPECT(tt_close_abs(&dv, g[2], 1e-4, 1e-5, 1e-6, "docs dv"), "doc_len %lld",
               (long long)doc_len);
        for (int j = 0; j < 3; j++)
            free(g[j]);
    }
    EXPECT(tt_deterministic(&kb), "sdpa_backward docs determinism");
    gt_tensor dq1 = new_in(a, a->hq, a->d, NULL, 0, 0);
    memcpy(dq1.data, dq.data, gt_tensor_nbytes(&dq));
    gt_cpu_set_threads(3);
    EXPECT(tt_run_ok(&kb, "sdpa_backward docs, 3 threads") && tt_same_bits(&dq, &dq1),
           "sdpa_backward docs on 3 threads differs from 1");
    gt_cpu_set_threads(1);
    EXPECT(tt_half_path(&kb, GT_BF16, 0), "sdpa_backward docs bf16");

    /* One document: the causal call's bits, forward and backward. */
    if (doc_len < 0) {
        gt_tensor oc = new_in(a, a->hq, a->dv, NULL, 0, 0);
        gt_tensor lc = tt_new(GT_F32, 3, TT_SHAPE(a->b, a->hq, a->s));
        gt_tensor dqc = new_in(a, a->hq, a->d, NULL, 0, 0),
                  dkc = new_in(a, a->hkv, a->d, NULL, 0, 0);
        gt_tensor dvc = new_in(a, a->hkv, a->dv, NULL, 0, 0);
        tt_call cf, cb;
        gt_tensor *cfo[2] = {&oc, &lc}, *cbo[3] = {&dqc, &dkc, &dvc};
        call_init(&cf, GT_OP_SDPA, a, fin, 3, cfo, 2);
        tt_run_ok(&kf, "sdpa docs");
        EXPECT(tt_run_ok(&cf, "sdpa causal") && tt_same_bits(&oc, &out) && tt_same_bits(&lc, &lse),
               "one document must give the causal forward's bits (s %lld)", (long long)a->s);
        call_init(&cb, GT_OP_SDPA_BACKWARD, a, bin, 6, cbo, 3);
        tt_run_ok(&kb, "sdpa_backward docs");
        EXPECT(tt_run_ok(&cb, "sdpa_backward causal") && tt_same_bits(&dqc, &dq) &&
                   tt_same_bits(&dkc, &dk) && tt_same_bits(&dvc, &dv),
               "one document must give the causal backward's bits (s %lld)", (long long)a->s);
        gt_tensor *cs[] = {&oc, &lc, &dqc, &dkc, &dvc};
        for (size_t j = 0; j < sizeof cs / sizeof cs[0]; j++)
            gt_tensor_free(cs[j]);
    }

    free(ctx.q);
    free(ctx.k);
    free(ctx.v);
    free(ctx.dout);
    free(ctx.out);
    free(ref_lse);
    gt_tensor *ts[] = {&q, &k, &v, &dout, &out, &lse, &dq, &dk, &dv, &pos, &out1, &dq1};
    for (size_t j = 0; j < sizeof ts / sizeof ts[0]; j++)
        gt_tensor_free(ts[j]);
}

/* Positions that are not a packed document's, and positions without causal: errors. */
static void test_bad_positions(tt_rng *r)
{
    doc_case a = {1, 1, 1, 4, 2, 2, 1.0, 0};
    gt_tensor q = new_in(&a, 1, 2, r, -1, 1), k = new_in(&a, 1, 2, r, -1, 1);
    gt_tensor v = new_in(&a, 1, 2, r, -1, 1), out = new_in(&a, 1, 2, NULL, 0, 0);
    gt_tensor lse = tt_new(GT_F32, 3, TT_SHAPE(1, 1, 4));
    gt_tensor pos = tt_new(GT_I64, 2, TT_SHAPE(1, 4));
    int64_t *p = pos.data;
    const int64_t bad[2][4] = {{0, 1, 3, 0}, {0, -1, 0, 1}};
    gt_tensor *in[4] = {&q, &k, &v, &pos}, *o[2] = {&out, &lse};
    for (int c = 0; c < 2; c++) {
        memcpy(p, bad[c], sizeof bad[c]);
        tt_call kf;
        call_init(&kf, GT_OP_SDPA, &a, in, 4, o, 2);
        gt_error err = {0};
        EXPECT(tt_run(&kf, &err) == GT_ERR_INVALID && strstr(err.msg, "positions[0, "),
               "bad positions must fail naming the element: %s", err.msg);
    }
    for (int64_t i = 0; i < 4; i++)
        p[i] = i;
    tt_call kf;
    call_init(&kf, GT_OP_SDPA, &a, in, 4, o, 2);
    kf.i[0] = 0; /* not causal */
    gt_error err = {0};
    EXPECT(tt_run(&kf, &err) == GT_ERR_SHAPE && strstr(err.msg, "causal"),
           "positions without causal must fail: %s", err.msg);
    gt_tensor *ts[] = {&q, &k, &v, &out, &lse, &pos};
    for (size_t j = 0; j < sizeof ts / sizeof ts[0]; j++)
        gt_tensor_free(ts[j]);
}

/* rope at positions: token (bi, i) rotated as a token at index positions[bi, i] of a plain rope
 * call, bit for bit; positions 0..s-1 give the plain call's bits. Both pair layouts. */
static void test_rope_positions(tt_rng *r)
{
    const int64_t b = 2, s = 9, h = 3, d = 8;
    const int64_t rows[2][9] = {{0, 1, 2, 0, 1, 0, 0, 1, 2}, {0, 1, 2, 3, 4, 5, 6, 7, 8}};
    gt_tensor x = tt_rand(4, TT_SHAPE(b, s, h, d), r, -2, 2);
    gt_tensor y = tt_new(GT_F32, 4, TT_SHAPE(b, s, h, d)), yp = tt_new(GT_F32, 4, x.shape);
    gt_tensor pos = tt_new(GT_I64, 2, TT_SHAPE(b, s));
    memcpy(pos.data, rows, sizeof rows);
    for (int inter = 0; inter < 2; inter++) {
        tt_call kp, kn;
        tt_init(&kp, GT_OP_ROPE);
        tt_in(&kp, &x);
        tt_in(&kp, &pos);
        tt_out(&kp, &yp);
        tt_init(&kn, GT_OP_ROPE);
        tt_in(&kn, &x);
        tt_out(&kn, &y);
        tt_call *ks[2] = {&kp, &kn};
        for (int j = 0; j < 2; j++) {
            tt_i(ks[j], 0);
            tt_i(ks[j], 0);
            tt_i(ks[j], 0);
            tt_i(ks[j], inter);
            tt_f(ks[j], 10000.0);
            tt_f(ks[j], 1.0);
            tt_f(ks[j], 1.0);
            tt_f(ks[j], 4.0);
        }
        if (!tt_run_ok(&kp, "rope positions") || !tt_run_ok(&kn, "rope")) continue;
        /* row 1 is 0..s-1: the plain call's bits */
        size_t row = (size_t)(s * h * d) * sizeof(float);
        EXPECT(memcmp((char *)yp.data + row, (char *)y.data + row, row) == 0,
               "rope with positions 0..s-1 must equal rope without (interleaved %d)", inter);
        /* row 0: token i at positions[0, i] equals the plain rope of x[0, i] placed at that index
         * (x[0, p] for p = i' where the plain call rotates index p) */
        bool ok = true;
        for (int64_t i = 0; i < s; i++) {
            int64_t p = rows[0][i];
            gt_tensor xi = tt_new(GT_F32, 4, TT_SHAPE(1, s, h, d)),
                      yi = tt_new(GT_F32, 4, xi.shape);
            for (int64_t t = 0; t < s; t++)
                memcpy((float *)xi.data + t * h * d, (float *)x.data + i * h * d,
                       (size_t)(h * d) * sizeof(float));
            kn.c.in[0] = &xi;
            kn.c.out[0] = &yi;
            ok = ok && tt_run_ok(&kn, "rope of one token") &&
                 memcmp((float *)yi.data + p * h * d, (float *)yp.data + i * h * d,
                        (size_t)(h * d) * sizeof(float)) == 0;
            kn.c.in[0] = &x;
            kn.c.out[0] = &y;
            gt_tensor_free(&xi);
            gt_tensor_free(&yi);
        }
        EXPECT(ok, "rope at positions must be the rope of each token at its position (%d)", inter);
        EXPECT(tt_deterministic(&kp), "rope positions determinism");
        EXPECT(tt_half_path(&kp, GT_BF16, 0), "rope positions bf16");
        int64_t *pp = pos.data;
        pp[3] = -1;
        gt_error err = {0};
        EXPECT(tt_run(&kp, &err) == GT_ERR_INVALID && strstr(err.msg, "positions[0, 3]"),
               "a negative position must fail naming it: %s", err.msg);
        pp[3] = 0;
    }
    gt_tensor *ts[] = {&x, &y, &yp, &pos};
    for (size_t j = 0; j < sizeof ts / sizeof ts[0]; j++)
        gt_tensor_free(ts[j]);
}

int main(void)
{
    tt_rng r = {43};
    test_bad_positions(&r);
    test_rope_positions(&r);
    const doc_case small[] = {
        {2, 4, 2, 11, 3, 5, 0.57735, 0},
        {1, 2, 1, 13, 4, 3, 0.5, 1},
    };
    for (size_t c = 0; c < sizeof small / sizeof small[0]; c++)
        for (int64_t len = -1; len <= 3; len++)
            run_docs_case(&small[c], len, &r, true); /* one doc, random, length 1, 2, 3 */
    /* documents crossing the 128-row query blocks; finite differences on the smaller one */
    const doc_case big[] = {
        {1, 2, 2, 150, 3, 2, 0.7, 1},
        {1, 4, 2, 300, 8, 8, 0.35355, 0},
    };
    run_docs_case(&big[0], 0, &r, true);
    run_docs_case(&big[0], 37, &r, false);
    run_docs_case(&big[0], -1, &r, false);
    run_docs_case(&big[1], 0, &r, false);
    run_docs_case(&big[1], 100, &r, false);
    run_docs_case(&big[1], -1, &r, false);
    return gt_test_finish();
}
