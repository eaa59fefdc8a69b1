/* test_eager.c — the eager executor: symbolic shapes evaluated under a binding (one graph, two
 * batch sizes) against naive loops; outputs that alias graph inputs or appear twice; unused
 * outputs of multi-output nodes; input validation naming the input; kernel errors naming the
 * node; no leaks on any path (run under ASan). */
#include <string.h>

#include "graphtrain/gt_build.h"
#include "graphtrain/gt_exec.h"
#include "gt_test.h"

static gt_sym_binding bind_batch(gt_sym_binding_entry *e, int64_t b)
{
    e->name = "batch";
    e->value = b;
    return (gt_sym_binding){e, 1};
}

/* x: [batch, 3], w: [3]; y = x * w (broadcast), z = sum(y, dim 1): [batch].
 * Outputs: z, x itself, y twice, x again. */
static gt_graph *build_scaled_sum(void)
{
    gt_graph *g = gt_graph_new();
    gt_expr dx[2] = {gt_sym_var(g->sym, "batch"), gt_c(g, 3)};
    gt_expr dw[1] = {gt_c(g, 3)};
    gt_value_id x = gt_graph_add_input(g, GT_IN_INPUT, "tokens_x", GT_F32, 2, dx);
    gt_value_id w = gt_graph_add_input(g, GT_IN_PARAM, "scale.weight", GT_F32, 1, dw);
    gt_value_id y = gt_mul(g, x, w);
    gt_value_id z = gt_reduce(g, GT_OP_SUM, y, 1, (const int[]){1}, false);
    gt_graph_add_output(g, GT_OUT_METRIC, "z", z);
    gt_graph_add_output(g, GT_OUT_METRIC, "x", x);
    gt_graph_add_output(g, GT_OUT_METRIC, "y", y);
    gt_graph_add_output(g, GT_OUT_METRIC, "y_again", y);
    gt_graph_add_output(g, GT_OUT_METRIC, "x_again", x);
    return g;
}

static void test_symbolic_and_aliasing(void)
{
    gt_graph *g = build_scaled_sum();
    gt_error err = {0};
    float ws[3] = {0.5f, -2.0f, 3.25f};
    for (int64_t b = 2; b <= 7; b += 5) {
        float xs[21];
        for (int i = 0; i < 21; i++)
            xs[i] = (float)(i % 5) - 1.5f + 0.1f * (float)i;
        gt_tensor in[2];
        gt_tensor_wrap(&in[0], GT_F32, 2, (int64_t[]){b, 3}, xs);
        gt_tensor_wrap(&in[1], GT_F32, 1, (int64_t[]){3}, ws);
        gt_sym_binding_entry e;
        gt_sym_binding bind = bind_batch(&e, b);
        gt_tensor out[5];
        gt_status st = gt_eager_run(g, &bind, in, out, &err);
        EXPECT(st == GT_OK, "batch %lld: %s", (long long)b, err.msg);
        if (st != GT_OK) continue;
        EXPECT(out[0].ndim == 1 && out[0].shape[0] == b, "z shape for batch %lld", (long long)b);
        double worst = 0;
        for (int64_t i = 0; i < b; i++) {
            double ref = 0;
            for (int j = 0; j < 3; j++)
                ref += (double)xs[i * 3 + j] * ws[j];
            worst = fmax(worst, fabs(ref - gt_tensor_get_f32(&out[0], i)));
        }
        EXPECT(worst < 1e-5, "batch %lld: z off by %g", (long long)b, worst);
        /* x handed back twice: equal contents, fresh buffers, caller's input untouched */
        for (int k = 1; k <= 4; k += 3) {
            EXPECT(out[k].data != xs && out[k].ndim == 2 && out[k].shape[0] == b &&
                       memcmp(out[k].data, xs, (size_t)b * 3 * sizeof(float)) == 0,
                   "output %d (graph input x) not a faithful copy", k);
        }
        EXPECT(out[1].data != out[4].data, "x outputs share a buffer");
        /* y handed back twice: exact products x*w (one f32 rounding each), distinct buffers */
        int bad = 0;
        for (int64_t i = 0; i < b * 3; i++)
            bad += gt_tensor_get_f32(&out[2], i) != xs[i] * ws[i % 3] ||
                   gt_tensor_get_f32(&out[3], i) != xs[i] * ws[i % 3];
        EXPECT(bad == 0 && out[2].data != out[3].data, "y outputs: %d wrong elements", bad);
        for (int k = 0; k < 5; k++)
            gt_tensor_free(&out[k]);
    }
    gt_graph_free(g);
}

static void test_input_validation(void)
{
    gt_graph *g = build_scaled_sum();
    gt_error err = {0};
    float xs[9] = {0}, ws[3] = {0};
    int32_t xi[6] = {0};
    gt_sym_binding_entry e;
    gt_sym_binding bind = bind_batch(&e, 2);
    gt_tensor in[2], out[5];
    gt_tensor_wrap(&in[1], GT_F32, 1, (int64_t[]){3}, ws);

    /* wrong dtype */
    gt_tensor_wrap(&in[0], GT_I32, 2, (int64_t[]){2, 3}, xi);
    gt_status st = gt_eager_run(g, &bind, in, out, &err);
    EXPECT(st == GT_ERR_INVALID && strstr(err.msg, "tokens_x") && strstr(err.msg, "f32"),
           "wrong dtype: %s", err.msg);
    EXPECT(out[0].data == NULL && out[4].data == NULL, "outputs set on error");

    /* wrong dim under the binding (batch = 2, tensor has 3 rows) */
    gt_error_clear(&err);
    gt_tensor_wrap(&in[0], GT_F32, 2, (int64_t[]){3, 3}, xs);
    st = gt_eager_run(g, &bind, in, out, &err);
    EXPECT(st == GT_ERR_INVALID && strstr(err.msg, "tokens_x") && strstr(err.msg, "[2, 3]"),
           "wrong dim: %s", err.msg);

    /* wrong rank */
    gt_error_clear(&err);
    gt_tensor_wrap(&in[0], GT_F32, 1, (int64_t[]){6}, xs);
    st = gt_eager_run(g, &bind, in, out, &err);
    EXPECT(st == GT_ERR_INVALID && strstr(err.msg, "tokens_x"), "wrong rank: %s", err.msg);

    /* wrong param shape names the param */
    gt_error_clear(&err);
    gt_tensor_wrap(&in[0], GT_F32, 2, (int64_t[]){2, 3}, xs);
    gt_tensor_wrap(&in[1], GT_F32, 1, (int64_t[]){2}, ws);
    st = gt_eager_run(g, &bind, in, out, &err);
    EXPECT(st == GT_ERR_INVALID && strstr(err.msg, "scale.weight"), "wrong param: %s", err.msg);

    /* unbound symbol */
    gt_error_clear(&err);
    gt_tensor_wrap(&in[1], GT_F32, 1, (int64_t[]){3}, ws);
    gt_sym_binding empty = {NULL, 0};
    st = gt_eager_run(g, &empty, in, out, &err);
    EXPECT(st != GT_OK && strstr(err.msg, "batch"), "unbound symbol: %s", err.msg);
    gt_graph_free(g);
}

/* An embedding id out of range fails inside the kernel; the error names the node, op and fqn, and
 * everything allocated so far is released (ASan's leak check runs at exit). */
static void test_kernel_error(void)
{
    gt_graph *g = gt_graph_new();
    gt_expr dw[2] = {gt_c(g, 5), gt_c(g, 4)}, di[1] = {gt_c(g, 3)};
    gt_value_id w = gt_graph_add_input(g, GT_IN_PARAM, "tok_embeddings.weight", GT_F32, 2, dw);
    gt_value_id ids = gt_graph_add_input(g, GT_IN_INPUT, "tokens", GT_I32, 1, di);
    gt_value_id w2 = gt_unary(g, GT_OP_EXP, w); /* an owned intermediate alive at the failure */
    gt_graph_set_fqn(g, "tok_embeddings");
    gt_value_id h = gt_embedding(g, w2, ids);
    gt_graph_set_fqn(g, NULL);
    gt_graph_add_output(g, GT_OUT_METRIC, "w2", w2);
    gt_graph_add_output(g, GT_OUT_METRIC, "h", gt_unary(g, GT_OP_NEG, h));
    float ws[20] = {0};
    int32_t bad_ids[3] = {0, 9, 1};
    gt_tensor in[2], out[2];
    gt_tensor_wrap(&in[0], GT_F32, 2, (int64_t[]){5, 4}, ws);
    gt_tensor_wrap(&in[1], GT_I32, 1, (int64_t[]){3}, bad_ids);
    gt_error err = {0};
    gt_sym_binding empty = {NULL, 0};
    gt_status st = gt_eager_run(g, &empty, in, out, &err);
    EXPECT(st == GT_ERR_INVALID && strstr(err.msg, "node %") && strstr(err.msg, "embedding") &&
               strstr(err.msg, "tok_embeddings") && strstr(err.msg, "9"),
           "kernel error: %s %s", gt_status_name(st), err.msg);
    EXPECT(out[0].data == NULL && out[1].data == NULL, "outputs set on error");

    /* the same graph with valid ids runs */
    gt_error_clear(&err);
    int32_t good_ids[3] = {0, 4, 1};
    gt_tensor_wrap(&in[1], GT_I32, 1, (int64_t[]){3}, good_ids);
    EXPECT_OK(gt_eager_run(g, &empty, in, out, &err), &err);
    bool ok = out[1].data != NULL;
    for (int i = 0; ok && i < 12; i++)
        ok = gt_tensor_get_f32(&out[1], i) == -1.0f; /* -exp(0) */
    EXPECT(ok, "embedding of exp(0) rows is not -1");
    gt_tensor_free(&out[0]);
    gt_tensor_free(&out[1]);
    gt_graph_free(g);
}

/* A long chain (each intermediate freed after its one use) and a split whose other pieces are
 * never used: results vs naive loops. */
static void test_chain_and_split(void)
{
    gt_graph *g = gt_graph_new();
    gt_expr d[2] = {gt_c(g, 3), gt_c(g, 7)};
    gt_value_id x = gt_graph_add_input(g, GT_IN_INPUT, "x", GT_F32, 2, d);
    gt_value_id h = x;
    for (int i = 0; i < 12; i++)
        h = gt_add_scalar(g, gt_scale(g, h, 0.5), 1.0);
    gt_value_id pieces[3];
    gt_split(g, h, 1, 3, (gt_expr[]){gt_c(g, 2), gt_c(g, 4), gt_c(g, 1)}, pieces);
    gt_graph_add_output(g, GT_OUT_METRIC, "middle", pieces[1]);
    float xs[21];
    for (int i = 0; i < 21; i++)
        xs[i] = (float)i - 10.0f;
    gt_tensor in, out;
    gt_tensor_wrap(&in, GT_F32, 2, (int64_t[]){3, 7}, xs);
    gt_error err = {0};
    gt_sym_binding empty = {NULL, 0};
    EXPECT_OK(gt_eager_run(g, &empty, &in, &out, &err), &err);
    bool ok = out.data && out.ndim == 2 && out.shape[0] == 3 && out.shape[1] == 4;
    for (int r = 0; ok && r < 3; r++)
        for (int c = 0; c < 4; c++) {
            float v = xs[r * 7 + 2 + c];
            for (int i = 0; i < 12; i++)
                v = v * 0.5f + 1.0f; /* exact in f32 for these values */
            ok &= gt_tensor_get_f32(&out, r * 4 + c) == v;
        }
    EXPECT(ok, "chain + split middle piece wrong");
    gt_tensor_free(&out);
    gt_graph_free(g);
}

int main(void)
{
    test_symbolic_and_aliasing();
    test_input_validation();
    test_kernel_error();
    test_chain_and_split();
    return gt_test_finish();
}
