/* test_shard_ops.c — the vocabulary-parallel local ops (embedding_shard, embedding_shard_backward,
 * logsumexp, cross_entropy_shard, cross_entropy_shard_backward) on the CPU.
 *
 * The property: split the vocabulary of random logits [N, V] / a table [V, D] into n = 1, 2, 3
 * blocks, run each block's local op, and combine the blocks the way vocabulary parallelism does:
 *   - the log-sum-exp of the per-block log-sum-exps equals a naive double log-sum-exp (1e-6);
 *   - the per-block cross_entropy_shard losses sum to a naive double cross-entropy mean and to
 *     the cross_entropy op (1e-6), ignore_index rows included;
 *   - cross_entropy_shard_backward blocks concatenated equal cross_entropy_backward (1e-6) and
 *     central finite differences of the double reference;
 *   - embedding_shard blocks summed equal embedding (bitwise: one block holds each row);
 *   - embedding_shard_backward blocks concatenated equal embedding_backward bitwise (the same
 *     token-order f32 sums).
 * Also: f32 / bf16 / f16 logits and tables, i32 / i64 ids, determinism, symbolic offsets through
 * the eager executor, and shape-rule errors naming the op and the dims. */
#include <string.h>

#include "graphtrain/gt_exec.h"
#include "graphtrain/gt_graph.h"
#include "test_cpu_util.h"

#define IGNORE (-100)

/* ---------------------------------------------------------------- helpers */

static gt_tensor make_ids(gt_dtype dt, int ndim, const int64_t *shape, const int64_t *vals)
{
    gt_tensor t = tt_new(dt, ndim, shape);
    int64_t n = gt_tensor_numel(&t);
    for (int64_t i = 0; i < n; i++) {
        if (dt == GT_I32)
            ((int32_t *)t.data)[i] = (int32_t)vals[i];
        else
            ((int64_t *)t.data)[i] = vals[i];
    }
    return t;
}

/* Columns [c0, c0 + w) of a 2-D tensor, any dtype, as a new tensor. */
static gt_tensor cols(const gt_tensor *x, int64_t c0, int64_t w)
{
    int64_t rows = x->shape[0], v = x->shape[1];
    size_t es = gt_dtype_size(x->dtype);
    gt_tensor b = tt_new(x->dtype, 2, TT_SHAPE(rows, w));
    for (int64_t i = 0; i < rows; i++)
        memcpy((char *)b.data + (size_t)(i * w) * es,
               (const char *)x->data + (size_t)(i * v + c0) * es, (size_t)w * es);
    return b;
}

/* Rows [r0, r0 + h) of a 2-D tensor, any dtype. */
static gt_tensor rows_of(const gt_tensor *x, int64_t r0, int64_t h)
{
    size_t row = (size_t)x->shape[1] * gt_dtype_size(x->dtype);
    gt_tensor b = tt_new(x->dtype, 2, TT_SHAPE(h, x->shape[1]));
    if (h * x->shape[1] > 0)
        memcpy(b.data, (const char *)x->data + (size_t)r0 * row, (size_t)h * row);
    return b;
}

static gt_tensor convert_to(const gt_tensor *x, gt_dtype dt)
{
    gt_tensor t = tt_new(dt, x->ndim, x->shape);
    gt_tensor_convert(x, &t);
    return t;
}

/* A kernel call with the block's tensors; runs it and returns whether it succeeded. */
static bool run1(gt_op op, const gt_tensor *const *in, int n_in, gt_tensor *out, int64_t iattr,
                 int ni, const int64_t *e, int ne, const char *what)
{
    tt_call k;
    tt_init(&k, op);
    for (int j = 0; j < n_in; j++)
        tt_in(&k, in[j]);
    tt_out(&k, out);
    if (ni) tt_i(&k, iattr);
    for (int j = 0; j < ne; j++)
        tt_e(&k, e[j]);
    bool ok = tt_run_ok(&k, what);
    if (ok) EXPECT(tt_deterministic(&k), "%s determinism", what);
    return ok;
}

/* ---------------------------------------------------------------- double references */

typedef struct {
    double *x;
    const int64_t *t;
    int64_t n, v;
    double dloss;
} ce_ref;

static double ref_lse(const double *x, int64_t v)
{
    double mx = -INFINITY, sum = 0.0;
    for (int64_t j = 0; j < v; j++)
        mx = fmax(mx, x[j]);
    for (int64_t j = 0; j < v; j++)
        sum += exp(x[j] - mx);
    return mx + log(sum);
}

/* dloss * mean over non-ignored rows of lse(x_i) - x_i[t_i] (NaN when all are ignored). */
static double ref_ce(void *p)
{
    ce_ref *c = p;
    double total = 0.0;
    int64_t valid = 0;
    for (int64_t i = 0; i < c->n; i++) {
        if (c->t[i] == IGNORE) continue;
        total += ref_lse(c->x + i * c->v, c->v) - c->x[i * c->v + c->t[i]];
        valid++;
    }
    return c->dloss * total / (double)valid;
}

/* ---------------------------------------------------------------- cross entropy */

/* Logits [n, v] of dtype ldt (rounded from random f32), targets of dtype tdt with some rows
 * ignored, split into `blocks` vocabulary blocks. */
static void check_ce(tt_rng *r, int64_t n, int64_t v, int blocks, gt_dtype ldt, gt_dtype tdt,
                     bool all_ignored)
{
    char what[96];
    snprintf(what, sizeof what, "ce n=%lld v=%lld blocks=%d %s %s", (long long)n, (long long)v,
             blocks, gt_dtype_name(ldt), gt_dtype_name(tdt));
    int64_t vb = v / blocks;
    gt_tensor x32 = tt_rand(2, TT_SHAPE(n, v), r, -4, 4);
    for (int64_t j = 0; j < v && n > 1; j++) /* a row of large logits: only max-shifting survives */
        gt_tensor_set_f32(&x32, v + j, 80.0f + (float)j * 0.25f);
    gt_tensor logits = convert_to(&x32, ldt);
    int64_t *tv = calloc((size_t)n, sizeof *tv);
    for (int64_t i = 0; i < n; i++)
        tv[i] = all_ignored || i % 3 == 2 ? IGNORE : (int64_t)(tt_next(r) % (uint64_t)v);
    gt_tensor targets = make_ids(tdt, 1, &n, tv);
    gt_tensor dloss = tt_new(GT_F32, 0, NULL);
    *(float *)dloss.data = 0.75f;

    /* reference on the (rounded) logits */
    gt_tensor xr = convert_to(&logits, GT_F32);
    ce_ref ref = {tt_to_double(&xr), tv, n, v, 1.0};
    double *lse_ref = tt_doubles(n);
    for (int64_t i = 0; i < n; i++)
        lse_ref[i] = ref_lse(ref.x + i * v, v);
    double loss_ref = ref_ce(&ref);

    /* the whole-vocabulary ops */
    gt_tensor loss_full = tt_new(GT_F32, 0, NULL), dx_full = tt_new(ldt, 2, TT_SHAPE(n, v));
    run1(GT_OP_CROSS_ENTROPY, (const gt_tensor *[]){&logits, &targets}, 2, &loss_full, IGNORE, 1,
         NULL, 0, "cross_entropy");
    run1(GT_OP_CROSS_ENTROPY_BACKWARD, (const gt_tensor *[]){&logits, &targets, &dloss}, 3,
         &dx_full, IGNORE, 1, NULL, 0, "cross_entropy_backward");

    /* per block: local log-sum-exp, stacked [n, blocks] and reduced again */
    gt_tensor stack = tt_new(GT_F32, 2, TT_SHAPE(n, blocks)), lse = tt_new(GT_F32, 1, &n);
    gt_tensor part = tt_new(GT_F32, 1, &n);
    for (int b = 0; b < blocks; b++) {
        gt_tensor xb = cols(&logits, b * vb, vb);
        run1(GT_OP_LOGSUMEXP, (const gt_tensor *[]){&xb}, 1, &part, 0, 0, NULL, 0, "logsumexp");
        for (int64_t i = 0; i < n; i++)
            ((float *)stack.data)[i * blocks + b] = ((float *)part.data)[i];
        gt_tensor_free(&xb);
    }
    run1(GT_OP_LOGSUMEXP, (const gt_tensor *[]){&stack}, 1, &lse, 0, 0, NULL, 0,
         "logsumexp of blocks");
    EXPECT(tt_close(&lse, lse_ref, 1e-6, 0, "combined logsumexp"), "%s", what);

    /* per block: loss parts and gradient blocks */
    double loss_sum = 0.0;
    gt_tensor dx = tt_new(ldt, 2, TT_SHAPE(n, v));
    size_t es = gt_dtype_size(ldt);
    for (int b = 0; b < blocks; b++) {
        gt_tensor xb = cols(&logits, b * vb, vb), lb = tt_new(GT_F32, 0, NULL);
        gt_tensor gb = tt_new(ldt, 2, TT_SHAPE(n, vb));
        int64_t start = b * vb;
        if (run1(GT_OP_CROSS_ENTROPY_SHARD, (const gt_tensor *[]){&xb, &targets, &lse}, 3, &lb,
                 IGNORE, 1, &start, 1, "cross_entropy_shard"))
            loss_sum += *(float *)lb.data;
        run1(GT_OP_CROSS_ENTROPY_SHARD_BACKWARD, (const gt_tensor *[]){&xb, &targets, &lse, &dloss},
             4, &gb, IGNORE, 1, &start, 1, "cross_entropy_shard_backward");
        for (int64_t i = 0; i < n; i++)
            memcpy((char *)dx.data + (size_t)(i * v + start) * es,
                   (const char *)gb.data + (size_t)(i * vb) * es, (size_t)vb * es);
        gt_tensor_free(&xb);
        gt_tensor_free(&lb);
        gt_tensor_free(&gb);
    }
    if (all_ignored) {
        EXPECT(isnan(loss_sum) && isnan(*(float *)loss_full.data), "%s: all ignored gives NaN",
               what);
        bool zero = true;
        for (int64_t i = 0; i < n * v; i++)
            zero = zero && gt_tensor_get_f32(&dx, i) == 0.0f;
        EXPECT(zero, "%s: all ignored gives zero gradients", what);
    } else {
        EXPECT(fabs(loss_sum - loss_ref) <= 1e-6 * fabs(loss_ref), "%s: sum %.9g, reference %.9g",
               what, loss_sum, loss_ref);
        double full = *(float *)loss_full.data;
        EXPECT(fabs(loss_sum - full) <= 1e-6 * fabs(full), "%s: sum %.9g, cross_entropy %.9g", what,
               loss_sum, full);
        /* against cross_entropy_backward, row by row: the shard op sees the global log-sum-exp
         * as f32 (the op's interface), so exp(x - lse) carries lse's rounding, |lse| * 2^-24
         * relative, on top of 1e-6 (the large-logit row has lse ~ 90). In half dtypes both round
         * nearly the same f32 value, up to one unit in the last place apart. */
        double tol = ldt == GT_F32 ? 1e-6 : (ldt == GT_BF16 ? 8e-3 : 1e-3);
        for (int64_t i = 0; i < n; i++) {
            gt_tensor gr = rows_of(&dx, i, 1), wr = rows_of(&dx_full, i, 1);
            double *wv = tt_to_double(&wr), rt = tol + fabs(lse_ref[i]) * 0x1p-24;
            EXPECT(tt_close(&gr, wv, rt, 1e-2 * tol, "concat vs cross_entropy_backward"),
                   "%s row %lld", what, (long long)i);
            free(wv);
            gt_tensor_free(&gr);
            gt_tensor_free(&wr);
        }
        if (ldt == GT_F32) {
            double *fd = tt_doubles(n * v);
            ref.dloss = 0.75;
            tt_fd(ref.x, n * v, 1e-4, ref_ce, &ref, fd);
            EXPECT(tt_close_abs(&dx, fd, 1e-5, 1e-6, 1e-9, "concat vs finite differences"), "%s",
                   what);
            free(fd);
        }
    }
    free(tv);
    free(ref.x);
    free(lse_ref);
    gt_tensor_free(&x32);
    gt_tensor_free(&xr);
    gt_tensor_free(&logits);
    gt_tensor_free(&targets);
    gt_tensor_free(&dloss);
    gt_tensor_free(&loss_full);
    gt_tensor_free(&dx_full);
    gt_tensor_free(&stack);
    gt_tensor_free(&lse);
    gt_tensor_free(&part);
    gt_tensor_free(&dx);
}

static void test_cross_entropy(tt_rng *r)
{
    const gt_dtype ldts[] = {GT_F32, GT_BF16, GT_F16};
    for (int blocks = 1; blocks <= 3; blocks++)
        for (int l = 0; l < 3; l++)
            for (int t = 0; t < 2; t++)
                check_ce(r, 7, 30, blocks, ldts[l], t ? GT_I64 : GT_I32, false);
    check_ce(r, 1, 6, 3, GT_F32, GT_I64, false);
    check_ce(r, 4, 12, 2, GT_F32, GT_I32, true);
}

/* logsumexp on rows of -inf / +inf / NaN, and on a 3-D input. */
static void test_logsumexp_edges(tt_rng *r)
{
    gt_tensor x = tt_new(GT_F32, 2, TT_SHAPE(3, 4)), y = tt_new(GT_F32, 1, TT_SHAPE(3));
    for (int j = 0; j < 4; j++) {
        gt_tensor_set_f32(&x, j, -INFINITY);
        gt_tensor_set_f32(&x, 4 + j, j == 1 ? INFINITY : 1.0f);
        gt_tensor_set_f32(&x, 8 + j, j == 2 ? NAN : 1.0f);
    }
    if (run1(GT_OP_LOGSUMEXP, (const gt_tensor *[]){&x}, 1, &y, 0, 0, NULL, 0, "logsumexp edges")) {
        float *o = y.data;
        EXPECT(isinf(o[0]) && o[0] < 0, "-inf row gives -inf, got %g", o[0]);
        EXPECT(isinf(o[1]) && o[1] > 0, "+inf row gives +inf, got %g", o[1]);
        EXPECT(isnan(o[2]), "NaN row gives NaN, got %g", o[2]);
    }
    gt_tensor_free(&x);
    gt_tensor_free(&y);

    gt_tensor x3 = tt_rand(3, TT_SHAPE(2, 3, 5), r, -3, 3), y3 = tt_new(GT_F32, 2, TT_SHAPE(2, 3));
    if (run1(GT_OP_LOGSUMEXP, (const gt_tensor *[]){&x3}, 1, &y3, 0, 0, NULL, 0, "logsumexp 3-D")) {
        double *xd = tt_to_double(&x3), ref[6];
        for (int i = 0; i < 6; i++)
            ref[i] = ref_lse(xd + i * 5, 5);
        EXPECT(tt_close(&y3, ref, 1e-6, 0, "logsumexp 3-D"), "rank 3");
        free(xd);
    }
    gt_tensor_free(&x3);
    gt_tensor_free(&y3);
}

/* ---------------------------------------------------------------- embedding */

static void check_embedding(tt_rng *r, int blocks, gt_dtype wdt, gt_dtype idt)
{
    char what[96];
    snprintf(what, sizeof what, "embedding blocks=%d %s %s", blocks, gt_dtype_name(wdt),
             gt_dtype_name(idt));
    const int64_t v = 12, d = 5, vb = v / blocks, ishape[2] = {3, 7};
    gt_tensor w32 = tt_rand(2, TT_SHAPE(v, d), r, -2, 2), w = convert_to(&w32, wdt);
    int64_t idv[21];
    for (int i = 0; i < 21; i++) /* 21 tokens over 12 rows: repeated ids */
        idv[i] = (int64_t)(tt_next(r) % (uint64_t)v);
    gt_tensor ids = make_ids(idt, 2, ishape, idv);
    gt_tensor dy32 = tt_rand(3, TT_SHAPE(3, 7, d), r, -1, 1), dy = convert_to(&dy32, wdt);

    gt_tensor full = tt_new(wdt, 3, TT_SHAPE(3, 7, d)), dw_full = tt_new(wdt, 2, TT_SHAPE(v, d));
    int64_t ne = v;
    run1(GT_OP_EMBEDDING, (const gt_tensor *[]){&w, &ids}, 2, &full, 0, 0, NULL, 0, "embedding");
    run1(GT_OP_EMBEDDING_BACKWARD, (const gt_tensor *[]){&ids, &dy}, 2, &dw_full, 0, 0, &ne, 1,
         "embedding_backward");

    /* forward blocks summed in f32 (each row is non-zero in exactly one block) */
    int64_t nout = 3 * 7 * d;
    float *sum = calloc((size_t)nout, sizeof *sum);
    gt_tensor dw = tt_new(wdt, 2, TT_SHAPE(v, d));
    size_t row = (size_t)d * gt_dtype_size(wdt);
    for (int b = 0; b < blocks; b++) {
        int64_t start = b * vb, eb[2] = {vb, start};
        gt_tensor wb = rows_of(&w, start, vb), ob = tt_new(wdt, 3, TT_SHAPE(3, 7, d));
        gt_tensor gb = tt_new(wdt, 2, TT_SHAPE(vb, d));
        if (run1(GT_OP_EMBEDDING_SHARD, (const gt_tensor *[]){&wb, &ids}, 2, &ob, 0, 0, &start, 1,
                 "embedding_shard"))
            for (int64_t i = 0; i < nout; i++)
                sum[i] += gt_tensor_get_f32(&ob, i);
        if (run1(GT_OP_EMBEDDING_SHARD_BACKWARD, (const gt_tensor *[]){&ids, &dy}, 2, &gb, 0, 0, eb,
                 2, "embedding_shard_backward"))
            memcpy((char *)dw.data + (size_t)start * row, gb.data, (size_t)vb * row);
        gt_tensor_free(&wb);
        gt_tensor_free(&ob);
        gt_tensor_free(&gb);
    }
    gt_tensor summed = tt_new(wdt, 3, TT_SHAPE(3, 7, d));
    for (int64_t i = 0; i < nout; i++)
        gt_tensor_set_f32(&summed, i, sum[i]);
    EXPECT(tt_same_bits(&summed, &full), "%s: blocks summed == embedding", what);
    EXPECT(tt_same_bits(&dw, &dw_full), "%s: blocks concatenated == embedding_backward", what);
    free(sum);
    gt_tensor_free(&summed);
    gt_tensor_free(&dw);
    gt_tensor_free(&w32);
    gt_tensor_free(&w);
    gt_tensor_free(&ids);
    gt_tensor_free(&dy32);
    gt_tensor_free(&dy);
    gt_tensor_free(&full);
    gt_tensor_free(&dw_full);
}

static void test_embedding(tt_rng *r)
{
    const gt_dtype wdts[] = {GT_F32, GT_BF16, GT_F16};
    for (int blocks = 1; blocks <= 3; blocks++)
        for (int l = 0; l < 3; l++)
            for (int t = 0; t < 2; t++)
                check_embedding(r, blocks, wdts[l], t ? GT_I64 : GT_I32);
}

/* ---------------------------------------------------------------- graphs */

static gt_value_id add_in(gt_graph *g, const char *name, gt_dtype dt, int ndim, const int64_t *dims)
{
    gt_expr e[GT_MAX_DIMS];
    for (int k = 0; k < ndim; k++)
        e[k] = gt_sym_const(g->sym, dims[k]);
    return gt_graph_add_input(g, GT_IN_INPUT, name, dt, ndim, e);
}

/* The eager executor evaluates a symbolic row_start ("rank.tp" * Vl) per rank: each rank's
 * embedding_shard graph, summed over the ranks, equals embedding. */
static void test_symbolic_offset(tt_rng *r)
{
    const int64_t v = 9, d = 4, vb = 3, nid = 6;
    gt_tensor w = tt_rand(2, TT_SHAPE(v, d), r, -1, 1);
    int64_t idv[6] = {0, 8, 4, 3, 3, 7};
    gt_tensor ids = make_ids(GT_I64, 1, &nid, idv), full = tt_new(GT_F32, 2, TT_SHAPE(nid, d));
    run1(GT_OP_EMBEDDING, (const gt_tensor *[]){&w, &ids}, 2, &full, 0, 0, NULL, 0, "embedding");

    gt_graph *g = gt_graph_new();
    gt_value_id in[2] = {add_in(g, "w", GT_F32, 2, TT_SHAPE(vb, d)),
                         add_in(g, "ids", GT_I64, 1, &nid)};
    gt_attrs a = {0};
    a.e[0] = gt_sym_mul(g->sym, gt_sym_var(g->sym, "rank.tp"), gt_sym_const(g->sym, vb));
    a.ne = 1;
    gt_value_id out = gt_graph_add_node(g, GT_OP_EMBEDDING_SHARD, in, 2, &a, NULL);
    EXPECT(out != GT_NONE, "embedding_shard node: %s", g->err.msg);
    gt_graph_add_output(g, GT_OUT_METRIC, "out", out);
    float sum[24] = {0};
    for (int rank = 0; rank < 3 && out != GT_NONE; rank++) {
        gt_sym_binding_entry be = {"rank.tp", rank};
        gt_sym_binding bind = {&be, 1};
        gt_tensor inputs[2] = {rows_of(&w, rank * vb, vb), ids}, res = {0};
        gt_error err = {0};
        EXPECT_OK(gt_eager_run(g, &bind, inputs, &res, &err), &err);
        for (int64_t i = 0; i < nid * d && res.data; i++)
            sum[i] += gt_tensor_get_f32(&res, i);
        gt_tensor_free(&inputs[0]);
        gt_tensor_free(&res);
    }
    bool same = true;
    for (int64_t i = 0; i < nid * d; i++)
        same = same && sum[i] == gt_tensor_get_f32(&full, i);
    EXPECT(same, "eager embedding_shard over 3 ranks == embedding");
    gt_graph_free(g);
    gt_tensor_free(&w);
    gt_tensor_free(&ids);
    gt_tensor_free(&full);
}

/* Adds a node and checks its output type (dtype, dims) or its error. */
static gt_value_id node(gt_graph *g, gt_op op, const gt_value_id *in, int n_in, int64_t ignore,
                        int ne)
{
    gt_attrs a = {0};
    if (op == GT_OP_CROSS_ENTROPY_SHARD || op == GT_OP_CROSS_ENTROPY_SHARD_BACKWARD) {
        a.i[0] = ignore;
        a.ni = 1;
    }
    for (int k = 0; k < ne; k++)
        a.e[k] = gt_sym_const(g->sym, k == 0 && op == GT_OP_EMBEDDING_SHARD_BACKWARD ? 4 : 8);
    a.ne = (uint8_t)ne;
    gt_error_clear(&g->err);
    return gt_graph_add_node(g, op, in, n_in, &a, NULL);
}

static bool has_type(gt_graph *g, gt_value_id v, const char *want)
{
    char buf[128] = "";
    if (v != GT_NONE) gt_graph_format_type(g, gt_value_type(g, v), buf, sizeof buf);
    bool ok = v != GT_NONE && strcmp(buf, want) == 0;
    if (!ok) fprintf(stderr, "  got %s (%s), want %s\n", buf, g->err.msg, want);
    return ok;
}

/* The last node failed with a message containing every needle. */
static bool failed_with(gt_graph *g, gt_value_id v, const char *n1, const char *n2, const char *n3)
{
    const char *m = g->err.msg;
    bool ok = v == GT_NONE && g->err.code == GT_ERR_SHAPE && strstr(m, n1) && strstr(m, n2) &&
              (!n3 || strstr(m, n3));
    if (!ok) fprintf(stderr, "  message: %s\n", m);
    return ok;
}

static void test_shape_rules(void)
{
    gt_graph *g = gt_graph_new();
    gt_value_id w = add_in(g, "w", GT_BF16, 2, TT_SHAPE(4, 6));
    gt_value_id w1 = add_in(g, "w1", GT_F32, 1, TT_SHAPE(12));
    gt_value_id ids = add_in(g, "ids", GT_I64, 2, TT_SHAPE(2, 7));
    gt_value_id fids = add_in(g, "fids", GT_F32, 2, TT_SHAPE(2, 7));
    gt_value_id dy = add_in(g, "dy", GT_F32, 3, TT_SHAPE(2, 7, 6));
    gt_value_id dyb = add_in(g, "dyb", GT_F32, 2, TT_SHAPE(7, 6));
    gt_value_id lg = add_in(g, "logits", GT_F16, 2, TT_SHAPE(7, 12));
    gt_value_id tg = add_in(g, "targets", GT_I32, 1, TT_SHAPE(7));
    gt_value_id tg6 = add_in(g, "targets6", GT_I32, 1, TT_SHAPE(6));
    gt_value_id lse = add_in(g, "lse", GT_F32, 1, TT_SHAPE(7));
    gt_value_id lse6 = add_in(g, "lse6", GT_F32, 1, TT_SHAPE(6));
    gt_value_id lseb = add_in(g, "lseb", GT_BF16, 1, TT_SHAPE(7));
    gt_value_id dl = add_in(g, "dloss", GT_F32, 0, NULL);
    gt_value_id dl1 = add_in(g, "dloss1", GT_F32, 1, TT_SHAPE(1));
    gt_value_id sc = add_in(g, "scalar", GT_F32, 0, NULL);

    /* good types */
    EXPECT(has_type(g, node(g, GT_OP_EMBEDDING_SHARD, (gt_value_id[]){w, ids}, 2, 0, 1),
                    "bf16[2, 7, 6]"),
           "embedding_shard type");
    EXPECT(has_type(g, node(g, GT_OP_EMBEDDING_SHARD_BACKWARD, (gt_value_id[]){ids, dy}, 2, 0, 2),
                    "f32[4, 6]"),
           "embedding_shard_backward type");
    EXPECT(has_type(g, node(g, GT_OP_LOGSUMEXP, &lg, 1, 0, 0), "f32[7]"), "logsumexp type");
    EXPECT(has_type(g, node(g, GT_OP_CROSS_ENTROPY_SHARD, (gt_value_id[]){lg, tg, lse}, 3, -100, 1),
                    "f32[]"),
           "cross_entropy_shard type");
    EXPECT(has_type(g,
                    node(g, GT_OP_CROSS_ENTROPY_SHARD_BACKWARD, (gt_value_id[]){lg, tg, lse, dl}, 4,
                         -100, 1),
                    "f16[7, 12]"),
           "cross_entropy_shard_backward type");

    /* errors name the op and the offending dims */
    EXPECT(failed_with(g, node(g, GT_OP_EMBEDDING_SHARD, (gt_value_id[]){w1, ids}, 2, 0, 1),
                       "embedding_shard", "rank 2", "f32[12]"),
           "embedding_shard rank-1 table");
    EXPECT(failed_with(g, node(g, GT_OP_EMBEDDING_SHARD, (gt_value_id[]){w, fids}, 2, 0, 1),
                       "embedding_shard", "i32 or i64", "f32[2, 7]"),
           "embedding_shard float ids");
    EXPECT(failed_with(g,
                       node(g, GT_OP_EMBEDDING_SHARD_BACKWARD, (gt_value_id[]){ids, dyb}, 2, 0, 2),
                       "embedding_shard_backward", "f32[7, 6]", "i64[2, 7]"),
           "embedding_shard_backward dy mismatch");
    EXPECT(
        failed_with(g, node(g, GT_OP_LOGSUMEXP, &sc, 1, 0, 0), "logsumexp", "rank >= 1", "f32[]"),
        "logsumexp of a scalar");
    EXPECT(
        failed_with(g, node(g, GT_OP_LOGSUMEXP, &ids, 1, 0, 0), "logsumexp", "float", "i64[2, 7]"),
        "logsumexp of ids");
    EXPECT(failed_with(
               g, node(g, GT_OP_CROSS_ENTROPY_SHARD, (gt_value_id[]){lg, tg6, lse}, 3, -100, 1),
               "cross_entropy_shard", "f16[7, 12]", "i32[6]"),
           "cross_entropy_shard N mismatch");
    EXPECT(failed_with(
               g, node(g, GT_OP_CROSS_ENTROPY_SHARD, (gt_value_id[]){lg, tg, lse6}, 3, -100, 1),
               "cross_entropy_shard", "f16[7, 12]", "f32[6]"),
           "cross_entropy_shard lse mismatch");
    EXPECT(failed_with(
               g, node(g, GT_OP_CROSS_ENTROPY_SHARD, (gt_value_id[]){lg, tg, lseb}, 3, -100, 1),
               "cross_entropy_shard", "lse must be f32", "bf16[7]"),
           "cross_entropy_shard bf16 lse");
    EXPECT(failed_with(g,
                       node(g, GT_OP_CROSS_ENTROPY_SHARD_BACKWARD,
                            (gt_value_id[]){lg, tg, lse, dl1}, 4, -100, 1),
                       "cross_entropy_shard_backward", "rank 0", "f32[1]"),
           "cross_entropy_shard_backward dloss rank");
    gt_graph_free(g);
}

/* Kernel-level errors: negative targets that are not ignored, and shape mismatches. */
static void test_kernel_errors(void)
{
    int64_t n = 3;
    gt_tensor x = tt_new(GT_F32, 2, TT_SHAPE(3, 4)), lse = tt_new(GT_F32, 1, &n);
    memset(x.data, 0, gt_tensor_nbytes(&x));
    memset(lse.data, 0, gt_tensor_nbytes(&lse));
    gt_tensor t = make_ids(GT_I64, 1, &n, (int64_t[]){1, -5, IGNORE}),
              loss = tt_new(GT_F32, 0, NULL);
    tt_call k;
    tt_init(&k, GT_OP_CROSS_ENTROPY_SHARD);
    tt_in(&k, &x);
    tt_in(&k, &t);
    tt_in(&k, &lse);
    tt_out(&k, &loss);
    tt_i(&k, IGNORE);
    tt_e(&k, 0);
    gt_error err = {0};
    EXPECT(tt_run(&k, &err) == GT_ERR_INVALID && strstr(err.msg, "row 1 is -5"),
           "negative target: %s", err.msg);
    gt_tensor lse2 = tt_new(GT_F32, 1, TT_SHAPE(2));
    k.c.in[2] = &lse2;
    EXPECT(tt_run(&k, &err) == GT_ERR_SHAPE && strstr(err.msg, "cross_entropy_shard"),
           "lse of the wrong length: %s", err.msg);
    gt_tensor_free(&x);
    gt_tensor_free(&lse);
    gt_tensor_free(&lse2);
    gt_tensor_free(&t);
    gt_tensor_free(&loss);
}

int main(void)
{
    tt_rng r = {20240611};
    test_cross_entropy(&r);
    test_logsumexp_edges(&r);
    test_embedding(&r);
    test_symbolic_offset(&r);
    test_shape_rules();
    test_kernel_errors();
    return gt_test_finish();
}
