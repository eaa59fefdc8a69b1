/* test_cpu_loss.c — CPU softmax / softmax_backward, cross_entropy / cross_entropy_backward
 * (ignore_index, i32 and i64 targets), embedding / embedding_backward: forwards vs naive double
 * references (1e-5 relative), backwards vs central finite differences (1e-4), bf16 path,
 * determinism, and the user errors (CE target out of range, embedding id out of range). */
#include "test_cpu_util.h"

/* ---------------------------------------------------------------- softmax */

typedef struct {
    double *x, *dy, *y;
    int64_t outer, n, inner;
} sm_ctx;

static void ref_softmax(const double *x, int64_t outer, int64_t n, int64_t inner, double *y)
{
    for (int64_t o = 0; o < outer; o++)
        for (int64_t in = 0; in < inner; in++) {
            double mx = -INFINITY, sum = 0.0;
            for (int64_t j = 0; j < n; j++)
                mx = fmax(mx, x[(o * n + j) * inner + in]);
            for (int64_t j = 0; j < n; j++)
                sum += exp(x[(o * n + j) * inner + in] - mx);
            for (int64_t j = 0; j < n; j++)
                y[(o * n + j) * inner + in] = exp(x[(o * n + j) * inner + in] - mx) / sum;
        }
}

static double sm_objective(void *p)
{
    sm_ctx *c = p;
    ref_softmax(c->x, c->outer, c->n, c->inner, c->y);
    double l = 0.0;
    for (int64_t i = 0; i < c->outer * c->n * c->inner; i++)
        l += c->dy[i] * c->y[i];
    return l;
}

static void test_softmax(tt_rng *r)
{
    struct {
        int ndim;
        int64_t shape[3];
        int dim;
    } cases[] = {{2, {3, 19}, 1},   {2, {3, 19}, 0}, {2, {3, 19}, -1},
                 {3, {2, 7, 3}, 1}, {1, {1}, 0},     {3, {1, 3, 19}, 2}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int nd = cases[c].ndim, dim = (cases[c].dim + nd) % nd;
        const int64_t *sh = cases[c].shape;
        gt_tensor x = tt_rand(nd, sh, r, -5, 5), y = tt_new(GT_F32, nd, sh);
        gt_tensor dy = tt_rand(nd, sh, r, -1, 1), dx = tt_new(GT_F32, nd, sh);
        if (c == 0) /* large logits: only a max-shifted softmax survives */
            for (int j = 0; j < 19; j++)
                gt_tensor_set_f32(&x, j, 90.0f + (float)j);
        sm_ctx ctx = {
            tt_to_double(&x), tt_to_double(&dy), tt_doubles(gt_tensor_numel(&x)), 1, sh[dim], 1};
        for (int d = 0; d < dim; d++)
            ctx.outer *= sh[d];
        for (int d = dim + 1; d < nd; d++)
            ctx.inner *= sh[d];
        ref_softmax(ctx.x, ctx.outer, ctx.n, ctx.inner, ctx.y);
        tt_call k;
        tt_init(&k, GT_OP_SOFTMAX);
        tt_in(&k, &x);
        tt_out(&k, &y);
        tt_i(&k, cases[c].dim);
        if (tt_run_ok(&k, "softmax")) EXPECT(tt_close(&y, ctx.y, 1e-5, 1e-7, "softmax"), "%zu", c);
        EXPECT(tt_deterministic(&k), "softmax determinism");
        EXPECT(tt_half_path(&k, GT_BF16, 0), "softmax bf16");

        double *fd = tt_doubles(gt_tensor_numel(&x));
        tt_fd(ctx.x, gt_tensor_numel(&x), 1e-4, sm_objective, &ctx, fd);
        tt_call kb;
        tt_init(&kb, GT_OP_SOFTMAX_BACKWARD);
        tt_in(&kb, &y);
        tt_in(&kb, &dy);
        tt_out(&kb, &dx);
        tt_i(&kb, cases[c].dim);
        if (tt_run_ok(&kb, "softmax_backward"))
            EXPECT(tt_close_abs(&dx, fd, 1e-4, 1e-5, 1e-7, "softmax_backward"), "%zu", c);
        EXPECT(tt_deterministic(&kb), "softmax_backward determinism");
        EXPECT(tt_half_path(&kb, GT_BF16, 0), "softmax_backward bf16");
        free(fd);
        free(ctx.x);
        free(ctx.dy);
        free(ctx.y);
        gt_tensor_free(&x);
        gt_tensor_free(&y);
        gt_tensor_free(&dy);
        gt_tensor_free(&dx);
    }
}

/* ---------------------------------------------------------------- cross entropy */

typedef struct {
    double *x;
    const int64_t *t;
    int64_t n, v, ignore;
} ce_ctx;

/* mean over non-ignored rows of logsumexp(x_i) - x_i[t_i] */
static double ce_objective(void *p)
{
    ce_ctx *c = p;
    double total = 0.0;
    int64_t valid = 0;
    for (int64_t i = 0; i < c->n; i++) {
        if (c->t[i] == c->ignore) continue;
        const double *x = c->x + i * c->v;
        double mx = -INFINITY, sum = 0.0;
        for (int64_t j = 0; j < c->v; j++)
            mx = fmax(mx, x[j]);
        for (int64_t j = 0; j < c->v; j++)
            sum += exp(x[j] - mx);
        total += mx + log(sum) - x[c->t[i]];
        valid++;
    }
    return total / (double)valid;
}

static gt_tensor make_targets(gt_dtype dt, int64_t n, const int64_t *vals)
{
    gt_tensor t = tt_new(dt, 1, &n);
    for (int64_t i = 0; i < n; i++) {
        if (dt == GT_I32)
            ((int32_t *)t.data)[i] = (int32_t)vals[i];
        else
            ((int64_t *)t.data)[i] = vals[i];
    }
    return t;
}

static void test_cross_entropy(tt_rng *r)
{
    struct {
        int64_t n, v, ignore;
        gt_dtype dt;
    } cases[] = {{7, 19, -100, GT_I64},
                 {1, 1, -100, GT_I32},
                 {5, 3, 2, GT_I32},
                 {19, 7, -100, GT_I32},
                 {4, 6, -1, GT_I64}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int64_t n = cases[c].n, v = cases[c].v, ignore = cases[c].ignore;
        int64_t *tv = calloc((size_t)n, sizeof *tv);
        for (int64_t i = 0; i < n; i++)
            tv[i] = (int64_t)(tt_next(r) % (uint64_t)v);
        if (n > 3) tv[1] = tv[3] = ignore; /* some ignored rows */
        if (n == 5) tv[0] = 2;             /* ignore_index 2 is a real class here */
        gt_tensor logits = tt_rand(2, TT_SHAPE(n, v), r, -4, 4);
        gt_tensor targets = make_targets(cases[c].dt, n, tv);
        gt_tensor loss = tt_new(GT_F32, 0, NULL), dloss = tt_new(GT_F32, 0, NULL);
        gt_tensor dx = tt_new(GT_F32, 2, TT_SHAPE(n, v));
        ((float *)dloss.data)[0] = 0.7f;
        ce_ctx ctx = {tt_to_double(&logits), tv, n, v, ignore};
        double ref = ce_objective(&ctx);
        tt_call k;
        tt_init(&k, GT_OP_CROSS_ENTROPY);
        tt_in(&k, &logits);
        tt_in(&k, &targets);
        tt_out(&k, &loss);
        tt_i(&k, ignore);
        if (tt_run_ok(&k, "cross_entropy"))
            EXPECT(tt_close(&loss, &ref, 1e-5, 0, "cross_entropy"), "case %zu", c);
        EXPECT(tt_deterministic(&k), "cross_entropy determinism");
        EXPECT(tt_half_path(&k, GT_BF16, 1u), "cross_entropy bf16 logits");

        double *fd = tt_doubles(n * v);
        tt_fd(ctx.x, n * v, 1e-4, ce_objective, &ctx, fd);
        for (int64_t i = 0; i < n * v; i++)
            fd[i] *= 0.7f;
        tt_call kb;
        tt_init(&kb, GT_OP_CROSS_ENTROPY_BACKWARD);
        tt_in(&kb, &logits);
        tt_in(&kb, &targets);
        tt_in(&kb, &dloss);
        tt_out(&kb, &dx);
        tt_i(&kb, ignore);
        if (tt_run_ok(&kb, "cross_entropy_backward"))
            EXPECT(tt_close_abs(&dx, fd, 1e-4, 1e-5, 1e-8, "cross_entropy_backward"), "case %zu",
                   c);
        EXPECT(tt_deterministic(&kb), "cross_entropy_backward determinism");
        EXPECT(tt_half_path(&kb, GT_BF16, 0), "cross_entropy_backward bf16");

        /* A target outside [0, V) that is not ignore_index is the user's error. */
        tv[n - 1] = v;
        gt_tensor bad = make_targets(cases[c].dt, n, tv);
        k.c.in[1] = &bad;
        gt_error err = {0};
        EXPECT(tt_run(&k, &err) == GT_ERR_INVALID, "target %lld must fail", (long long)v);
        char want[64];
        snprintf(want, sizeof want, "row %lld is %lld", (long long)(n - 1), (long long)v);
        EXPECT(strstr(err.msg, want) != NULL, "message names row and value: %s", err.msg);
        kb.c.in[1] = &bad;
        EXPECT(tt_run(&kb, &err) == GT_ERR_INVALID, "backward with target %lld must fail",
               (long long)v);
        gt_tensor_free(&bad);
        free(fd);
        free(ctx.x);
        free(tv);
        gt_tensor *ts[] = {&logits, &targets, &loss, &dloss, &dx};
        for (size_t j = 0; j < 5; j++)
            gt_tensor_free(ts[j]);
    }

    /* Every row ignored: the loss is NaN (0/0, as torch) and the gradient is 0. */
    const int64_t ign[3] = {-100, -100, -100};
    gt_tensor logits = tt_rand(2, TT_SHAPE(3, 4), r, -1, 1), targets = make_targets(GT_I64, 3, ign);
    gt_tensor loss = tt_new(GT_F32, 0, NULL), dloss = tt_new(GT_F32, 0, NULL);
    gt_tensor dx = tt_new(GT_F32, 2, TT_SHAPE(3, 4));
    ((float *)dloss.data)[0] = 1.0f;
    tt_call k;
    tt_init(&k, GT_OP_CROSS_ENTROPY);
    tt_in(&k, &logits);
    tt_in(&k, &targets);
    tt_out(&k, &loss);
    tt_i(&k, -100);
    if (tt_run_ok(&k, "cross_entropy all ignored"))
        EXPECT(isnan(((float *)loss.data)[0]), "all-ignored loss is NaN");
    tt_init(&k, GT_OP_CROSS_ENTROPY_BACKWARD);
    tt_in(&k, &logits);
    tt_in(&k, &targets);
    tt_in(&k, &dloss);
    tt_out(&k, &dx);
    tt_i(&k, -100);
    if (tt_run_ok(&k, "cross_entropy_backward all ignored")) {
        bool zero = true;
        for (int i = 0; i < 12; i++)
            zero = zero && ((float *)dx.data)[i] == 0.0f;
        EXPECT(zero, "all-ignored gradient is 0");
    }
    gt_tensor *ts[] = {&logits, &targets, &loss, &dloss, &dx};
    for (size_t j = 0; j < 5; j++)
        gt_tensor_free(ts[j]);
}

/* ---------------------------------------------------------------- embedding */

typedef struct {
    double *w, *dy;
    const int64_t *ids;
    int64_t n, d;
} emb_ctx;

static double emb_objective(void *p)
{
    emb_ctx *c = p;
    double l = 0.0;
    for (int64_t i = 0; i < c->n; i++)
        for (int64_t j = 0; j < c->d; j++)
            l += c->dy[i * c->d + j] * c->w[c->ids[i] * c->d + j];
    return l;
}

static void test_embedding(tt_rng *r)
{
    const int64_t vocab = 11, d = 7;
    struct {
        int ndim;
        int64_t shape[2];
        gt_dtype dt;
    } cases[] = {{2, {3, 5}, GT_I64}, {1, {19}, GT_I32}, {1, {1}, GT_I64}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int nd = cases[c].ndim;
        int64_t n = nd == 2 ? cases[c].shape[0] * cases[c].shape[1] : cases[c].shape[0];
        int64_t *iv = calloc((size_t)n, sizeof *iv);
        for (int64_t i = 0; i < n; i++)
            iv[i] = (int64_t)(tt_next(r) % (uint64_t)vocab);
        if (n > 2) iv[2] = iv[0]; /* a repeated id: its gradient rows add */
        gt_tensor ids = tt_new(cases[c].dt, nd, cases[c].shape);
        for (int64_t i = 0; i < n; i++) {
            if (cases[c].dt == GT_I32)
                ((int32_t *)ids.data)[i] = (int32_t)iv[i];
            else
                ((int64_t *)ids.data)[i] = iv[i];
        }
        int64_t os[3] = {cases[c].shape[0], cases[c].shape[1], d};
        os[nd] = d;
        const gt_dtype wdt[2] = {GT_F32, GT_BF16};
        for (int wi = 0; wi < 2; wi++) {
            gt_tensor w = tt_new(wdt[wi], 2, TT_SHAPE(vocab, d)), out = tt_new(wdt[wi], nd + 1, os);
            tt_fill(&w, r, -1, 1);
            tt_call k;
            tt_init(&k, GT_OP_EMBEDDING);
            tt_in(&k, &w);
            tt_in(&k, &ids);
            tt_out(&k, &out);
            if (tt_run_ok(&k, "embedding")) {
                bool ok = true;
                for (int64_t i = 0; i < n; i++)
                    for (int64_t j = 0; j < d; j++)
                        ok = ok && gt_tensor_get_f32(&out, i * d + j) ==
                                       gt_tensor_get_f32(&w, iv[i] * d + j);
                EXPECT(ok, "embedding rows, %s weights", gt_dtype_name(wdt[wi]));
            }
            EXPECT(tt_deterministic(&k), "embedding determinism");
            gt_tensor bad = tt_new(cases[c].dt, nd, cases[c].shape);
            memcpy(bad.data, ids.data, gt_tensor_nbytes(&ids));
            gt_tensor_set_f32(&bad, n - 1, (float)vocab);
            k.c.in[1] = &bad;
            gt_error err = {0};
            EXPECT(tt_run(&k, &err) == GT_ERR_INVALID, "embedding id %lld must fail",
                   (long long)vocab);
            char want[64];
            snprintf(want, sizeof want, "id %lld at position %lld", (long long)vocab,
                     (long long)(n - 1));
            EXPECT(strstr(err.msg, want) != NULL, "message names id and position: %s", err.msg);
            gt_tensor_free(&bad);
            gt_tensor_free(&w);
            gt_tensor_free(&out);
        }

        gt_tensor w = tt_rand(2, TT_SHAPE(vocab, d), r, -1, 1);
        gt_tensor dy = tt_rand(nd + 1, os, r, -1, 1), dw = tt_new(GT_F32, 2, TT_SHAPE(vocab, d));
        emb_ctx ctx = {tt_to_double(&w), tt_to_double(&dy), iv, n, d};
        double *fd = tt_doubles(vocab * d);
        tt_fd(ctx.w, vocab * d, 1e-3, emb_objective, &ctx, fd);
        tt_call kb;
        tt_init(&kb, GT_OP_EMBEDDING_BACKWARD);
        tt_in(&kb, &ids);
        tt_in(&kb, &dy);
        tt_out(&kb, &dw);
        tt_e(&kb, vocab);
        if (tt_run_ok(&kb, "embedding_backward"))
            EXPECT(tt_close_abs(&dw, fd, 1e-5, 1e-6, 1e-9, "embedding_backward"), "case %zu", c);
        EXPECT(tt_deterministic(&kb), "embedding_backward determinism");
        EXPECT(tt_half_path(&kb, GT_BF16, 0), "embedding_backward bf16");
        free(fd);
        free(ctx.w);
        free(ctx.dy);
        free(iv);
        gt_tensor_free(&w);
        gt_tensor_free(&dy);
        gt_tensor_free(&dw);
        gt_tensor_free(&ids);
    }
}

int main(void)
{
    tt_rng r = {17};
    test_softmax(&r);
    test_cross_entropy(&r);
    test_embedding(&r);
    return gt_test_finish();
}
