/* test_autodiff.c — the reverse-mode driver: metadata of backward nodes, the documented
 * accumulation order, pruning of unneeded gradient work, GT_NONE for unrelated values, zero
 * gradients of unused params, refusals (backward ops on the float path, no loss, symbolic mean),
 * and a symbolic-shape graph differentiated once and run at two batch sizes against a naive
 * reference. Numerical correctness of every rule is in tests/ops/test_op_grads.c. */
#include <string.h>

#include "graphtrain/gt_autodiff.h"
#include "graphtrain/gt_build.h"
#include "graphtrain/gt_exec.h"
#include "gt_test.h"

static gt_expr dims2[2];
static const gt_expr *d2(gt_graph *g, int64_t a, int64_t b)
{
    dims2[0] = gt_c(g, a);
    dims2[1] = gt_c(g, b);
    return dims2;
}

static gt_value_id sum_all(gt_graph *g, gt_value_id x)
{
    int nd = gt_value_type(g, x)->ndim;
    int all[GT_MAX_DIMS];
    for (int i = 0; i < nd; i++)
        all[i] = i;
    return gt_reduce(g, GT_OP_SUM, x, nd, all, false);
}

static gt_node_id producer(const gt_graph *g, gt_value_id v)
{
    return g->values[v].producer;
}

/* Backward nodes carry phase bwd, origin = the forward node, fqn copied from it; the builder's
 * state is restored; one GRAD output per PARAM, in input order, named by the param fqn. */
static void test_metadata(void)
{
    gt_graph *g = gt_graph_new();
    gt_value_id w1 = gt_graph_add_input(g, GT_IN_PARAM, "mlp.w1", GT_F32, 2, d2(g, 3, 4));
    gt_value_id x = gt_graph_add_input(g, GT_IN_INPUT, "x", GT_F32, 2, d2(g, 2, 3));
    gt_value_id w2 = gt_graph_add_input(g, GT_IN_PARAM, "mlp.w2", GT_F32, 2, d2(g, 4, 3));
    gt_graph_set_fqn(g, "layers.0.mlp");
    gt_value_id h = gt_unary(g, GT_OP_SILU, gt_matmul(g, x, w1, false, false));
    gt_value_id y = gt_matmul(g, h, w2, false, false);
    gt_graph_set_fqn(g, "loss");
    gt_value_id loss = sum_all(g, gt_mul(g, y, y));
    gt_graph_add_output(g, GT_OUT_LOSS, "loss", loss);
    gt_graph_set_fqn(g, "after");
    gt_str after = g->cur_fqn;
    int32_t n_fwd = g->n_nodes;

    gt_error err = {0};
    EXPECT_OK(gt_autodiff(g, &err), &err);
    EXPECT_OK(gt_graph_verify(g, &err), &err);
    EXPECT(g->cur_fqn == after && g->cur_phase == GT_PHASE_FORWARD && g->cur_origin == GT_NONE,
           "builder state not restored");
    int bad = 0;
    for (int32_t n = n_fwd; n < g->n_nodes; n++) {
        const gt_node *nd = &g->nodes[n];
        bool ok = nd->phase == GT_PHASE_BACKWARD && nd->origin >= 0 && nd->origin < n_fwd &&
                  nd->fqn == g->nodes[nd->origin].fqn;
        bad += !ok;
    }
    EXPECT(g->n_nodes > n_fwd && bad == 0, "%d backward nodes with wrong phase/origin/fqn", bad);
    EXPECT(g->n_outputs == 3, "outputs: %d", g->n_outputs);
    if (g->n_outputs == 3) {
        EXPECT(g->outputs[1].kind == GT_OUT_GRAD &&
                   strcmp(gt_graph_str(g, g->outputs[1].fqn), "mlp.w1") == 0,
               "first GRAD is not mlp.w1");
        EXPECT(g->outputs[2].kind == GT_OUT_GRAD &&
                   strcmp(gt_graph_str(g, g->outputs[2].fqn), "mlp.w2") == 0,
               "second GRAD is not mlp.w2");
    }
    (void)w2;
    gt_graph_free(g);
}

/* x has three consumers c1 = exp(x), c2 = neg(x), c3 = sigmoid(x) (in node order). Documented
 * order: contributions in reverse node order, left fold: grad x = add(add(d3, d2), d1), each d_k
 * built by the rule of c_k (origin). */
static void test_accumulation_order(void)
{
    gt_graph *g = gt_graph_new();
    gt_value_id x = gt_graph_add_input(g, GT_IN_PARAM, "x", GT_F32, 2, d2(g, 2, 3));
    gt_value_id c1 = gt_unary(g, GT_OP_EXP, x);
    gt_value_id c2 = gt_unary(g, GT_OP_NEG, x);
    gt_value_id c3 = gt_unary(g, GT_OP_SIGMOID, x);
    gt_value_id loss = sum_all(g, gt_add(g, gt_add(g, c1, c2), c3));
    gt_value_id grad = GT_NONE;
    gt_error err = {0};
    EXPECT_OK(gt_autodiff_wrt(g, loss, 1, &x, &grad, &err), &err);
    EXPECT(grad != GT_NONE, "no gradient for x");
    if (grad == GT_NONE) {
        gt_graph_free(g);
        return;
    }
    const gt_node *outer = &g->nodes[producer(g, grad)];
    EXPECT(outer->op == GT_OP_ADD, "outer accumulation is %s", gt_op_get(outer->op)->name);
    const gt_node *inner = &g->nodes[producer(g, outer->in[0])];
    EXPECT(inner->op == GT_OP_ADD, "inner accumulation is %s", gt_op_get(inner->op)->name);
    gt_node_id o1 = g->nodes[producer(g, outer->in[1])].origin;
    gt_node_id o3 = g->nodes[producer(g, inner->in[0])].origin;
    gt_node_id o2 = g->nodes[producer(g, inner->in[1])].origin;
    EXPECT(o3 == producer(g, c3) && o2 == producer(g, c2) && o1 == producer(g, c1),
           "accumulation order: origins %d %d %d, expected %d %d %d", o3, o2, o1, producer(g, c3),
           producer(g, c2), producer(g, c1));
    gt_graph_free(g);
}

/* Only b is differentiated in matmul(a, b): the dA matmul the rule builds is pruned, leaving one
 * backward matmul. Unrelated and integer values get GT_NONE; the loss itself gets the seed. */
static void test_pruning_and_none(void)
{
    gt_graph *g = gt_graph_new();
    gt_value_id a = gt_graph_add_input(g, GT_IN_INPUT, "a", GT_F32, 2, d2(g, 3, 5));
    gt_value_id b = gt_graph_add_input(g, GT_IN_PARAM, "b", GT_F32, 2, d2(g, 5, 4));
    gt_value_id u = gt_graph_add_input(g, GT_IN_PARAM, "u", GT_F32, 2, d2(g, 2, 2));
    gt_expr n3[1] = {gt_c(g, 3)};
    gt_value_id ids = gt_graph_add_input(g, GT_IN_INPUT, "ids", GT_I32, 1, n3);
    gt_value_id loss = sum_all(g, gt_matmul(g, a, b, false, false));
    gt_value_id side = gt_unary(g, GT_OP_EXP, u); /* not on the loss path */
    (void)side;
    int32_t n_fwd = g->n_nodes;
    gt_value_id wrt[5] = {b, u, ids, a, loss};
    gt_value_id grads[5];
    gt_error err = {0};
    EXPECT_OK(gt_autodiff_wrt(g, loss, 5, wrt, grads, &err), &err);
    EXPECT(grads[0] != GT_NONE, "b has no gradient");
    EXPECT(grads[1] == GT_NONE, "unused u got a gradient");
    EXPECT(grads[2] == GT_NONE, "integer ids got a gradient");
    EXPECT(grads[3] != GT_NONE, "a (asked for) has no gradient");
    EXPECT(grads[4] != GT_NONE && g->nodes[producer(g, grads[4])].op == GT_OP_FULL,
           "d loss / d loss is not the seed full");
    EXPECT_OK(gt_graph_verify(g, &err), &err);
    gt_graph_free(g);

    /* Same graph, wrt = b only. */
    g = gt_graph_new();
    a = gt_graph_add_input(g, GT_IN_INPUT, "a", GT_F32, 2, d2(g, 3, 5));
    b = gt_graph_add_input(g, GT_IN_PARAM, "b", GT_F32, 2, d2(g, 5, 4));
    loss = sum_all(g, gt_matmul(g, a, b, false, false));
    n_fwd = g->n_nodes;
    gt_value_id gb;
    EXPECT_OK(gt_autodiff_wrt(g, loss, 1, &b, &gb, &err), &err);
    int matmuls = 0;
    for (int32_t n = n_fwd; n < g->n_nodes; n++)
        matmuls += g->nodes[n].op == GT_OP_MATMUL;
    EXPECT(matmuls == 1, "%d backward matmuls, expected 1 (dA pruned)", matmuls);
    EXPECT_OK(gt_graph_verify(g, &err), &err);
    gt_graph_free(g);
}

/* A PARAM the loss does not use gets a zero full as its GRAD. */
static void test_unused_param_zero(void)
{
    gt_graph *g = gt_graph_new();
    gt_value_id p = gt_graph_add_input(g, GT_IN_PARAM, "p", GT_F32, 2, d2(g, 2, 3));
    gt_graph_add_input(g, GT_IN_PARAM, "unused", GT_F32, 2, d2(g, 4, 1));
    gt_graph_add_output(g, GT_OUT_LOSS, "loss", sum_all(g, gt_unary(g, GT_OP_EXP, p)));
    gt_error err = {0};
    EXPECT_OK(gt_autodiff(g, &err), &err);
    EXPECT(g->n_outputs == 3, "outputs %d", g->n_outputs);
    if (g->n_outputs == 3) {
        const gt_node *z = &g->nodes[producer(g, g->outputs[2].value)];
        EXPECT(z->op == GT_OP_FULL && z->attrs.f[0] == 0.0, "unused param grad is not zeros");
        const gt_type *t = gt_value_type(g, g->outputs[2].value);
        int64_t d0 = 0, d1 = 0;
        EXPECT(t->ndim == 2 && gt_sym_is_const(g->sym, t->dims[0], &d0) &&
                   gt_sym_is_const(g->sym, t->dims[1], &d1) && d0 == 4 && d1 == 1,
               "zero grad has the wrong shape");
    }
    gt_graph_free(g);
}

static void test_errors(void)
{
    gt_error err = {0};
    /* No LOSS output. */
    gt_graph *g = gt_graph_new();
    gt_graph_add_input(g, GT_IN_PARAM, "p", GT_F32, 2, d2(g, 2, 3));
    EXPECT(gt_autodiff(g, &err) == GT_ERR_INVALID && strstr(err.msg, "LOSS"), "no loss: %s",
           err.msg);
    gt_graph_free(g);

    /* The loss depends on silu_backward through a float path: refused, naming the op and node. */
    gt_error_clear(&err);
    g = gt_graph_new();
    gt_value_id x = gt_graph_add_input(g, GT_IN_PARAM, "x", GT_F32, 2, d2(g, 2, 3));
    gt_value_id dy = gt_graph_add_input(g, GT_IN_PARAM, "dy", GT_F32, 2, d2(g, 2, 3));
    gt_graph_set_fqn(g, "weird");
    gt_graph_add_output(g, GT_OUT_LOSS, "loss", sum_all(g, gt_silu_backward(g, x, dy)));
    int32_t n_nodes = g->n_nodes;
    gt_status st = gt_autodiff(g, &err);
    EXPECT(st == GT_ERR_UNSUPPORTED && strstr(err.msg, "silu_backward") && strstr(err.msg, "weird"),
           "backward op on the path: %s %s", gt_status_name(st), err.msg);
    EXPECT(g->n_nodes == n_nodes && g->err.code == GT_OK,
           "a failed autodiff left %d nodes or a builder error", g->n_nodes - n_nodes);
    gt_graph_free(g);

    /* A backward op elsewhere in the graph (not on the loss path) is fine. */
    gt_error_clear(&err);
    g = gt_graph_new();
    x = gt_graph_add_input(g, GT_IN_PARAM, "x", GT_F32, 2, d2(g, 2, 3));
    dy = gt_graph_add_input(g, GT_IN_INPUT, "dy", GT_F32, 2, d2(g, 2, 3));
    gt_value_id other = gt_silu_backward(g, dy, dy);
    gt_graph_add_output(g, GT_OUT_METRIC, "other", other);
    gt_graph_add_output(g, GT_OUT_LOSS, "loss", sum_all(g, gt_unary(g, GT_OP_EXP, x)));
    EXPECT_OK(gt_autodiff(g, &err), &err);
    gt_graph_free(g);

    /* mean over a symbolic dim: refused (the count must be a constant). */
    gt_error_clear(&err);
    g = gt_graph_new();
    gt_expr dims[2] = {gt_sym_var(g->sym, "batch"), gt_c(g, 3)};
    x = gt_graph_add_input(g, GT_IN_PARAM, "x", GT_F32, 2, dims);
    gt_value_id m = gt_reduce(g, GT_OP_MEAN, x, 1, (const int[]){0}, false);
    gt_graph_add_output(g, GT_OUT_LOSS, "loss", sum_all(g, m));
    st = gt_autodiff(g, &err);
    EXPECT(st == GT_ERR_UNSUPPORTED && strstr(err.msg, "batch"), "symbolic mean: %s %s",
           gt_status_name(st), err.msg);
    gt_graph_free(g);

    /* A pending builder error is reported, not differentiated around. */
    gt_error_clear(&err);
    g = gt_graph_new();
    gt_value_id a = gt_graph_add_input(g, GT_IN_PARAM, "a", GT_F32, 2, d2(g, 2, 3));
    gt_value_id bad = gt_matmul(g, a, a, false, false); /* inner dims 3 vs 2 */
    EXPECT(bad == GT_NONE, "bad matmul built");
    gt_value_id grad;
    st = gt_autodiff_wrt(g, a, 1, &a, &grad, &err);
    EXPECT(st == GT_ERR_INVALID && strstr(err.msg, "pending"), "pending error: %s", err.msg);
    gt_graph_free(g);
}

/* y = x @ w with x: [batch, 4]; loss = sum(y * r). Differentiate once, run at batch 2 and 5,
 * compare dW with the naive x^T r (double). */
static void test_symbolic_batch(void)
{
    gt_graph *g = gt_graph_new();
    gt_expr batch = gt_sym_var(g->sym, "batch");
    gt_expr dx[2] = {batch, gt_c(g, 4)}, dr[2] = {batch, gt_c(g, 3)};
    gt_value_id x = gt_graph_add_input(g, GT_IN_INPUT, "x", GT_F32, 2, dx);
    gt_value_id w = gt_graph_add_input(g, GT_IN_PARAM, "w", GT_F32, 2, d2(g, 4, 3));
    gt_value_id r = gt_graph_add_input(g, GT_IN_INPUT, "r", GT_F32, 2, dr);
    gt_value_id loss = sum_all(g, gt_mul(g, gt_matmul(g, x, w, false, false), r));
    gt_graph_add_output(g, GT_OUT_LOSS, "loss", loss);
    gt_error err = {0};
    EXPECT_OK(gt_autodiff(g, &err), &err);
    for (int64_t b = 2; b <= 5; b += 3) {
        float xs[20], ws[12], rs[15];
        for (int i = 0; i < 20; i++)
            xs[i] = (float)((i * 7 % 11) - 5) * 0.25f;
        for (int i = 0; i < 12; i++)
            ws[i] = (float)((i * 5 % 7) - 3) * 0.5f;
        for (int i = 0; i < 15; i++)
            rs[i] = (float)((i * 3 % 8) - 4) * 0.125f;
        gt_tensor in[3];
        gt_tensor_wrap(&in[0], GT_F32, 2, (int64_t[]){b, 4}, xs);
        gt_tensor_wrap(&in[1], GT_F32, 2, (int64_t[]){4, 3}, ws);
        gt_tensor_wrap(&in[2], GT_F32, 2, (int64_t[]){b, 3}, rs);
        gt_sym_binding_entry e = {"batch", b};
        gt_sym_binding bind = {&e, 1};
        gt_tensor out[2];
        EXPECT_OK(gt_eager_run(g, &bind, in, out, &err), &err);
        double worst = 0;
        for (int i = 0; out[1].data && i < 4; i++)
            for (int j = 0; j < 3; j++) {
                double ref = 0;
                for (int64_t t = 0; t < b; t++)
                    ref += (double)xs[t * 4 + i] * rs[t * 3 + j];
                worst = fmax(worst, fabs(ref - gt_tensor_get_f32(&out[1], i * 3 + j)));
            }
        EXPECT(out[1].data && worst < 1e-5, "batch %lld: dW off by %g", (long long)b, worst);
        gt_tensor_free(&out[0]);
        gt_tensor_free(&out[1]);
    }
    gt_graph_free(g);
}

int main(void)
{
    test_metadata();
    test_accumulation_order();
    test_pruning_and_none();
    test_unused_param_zero();
    test_errors();
    test_symbolic_batch();
    return gt_test_finish();
}
