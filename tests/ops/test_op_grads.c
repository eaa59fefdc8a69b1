/* test_op_grads.c — gradient rules of the elementwise, reduction and layout ops vs central finite
 * differences (harness and tolerance: grad_check.h). The model-level ops (matmul, rms_norm, rope,
 * sdpa, softmax, cross_entropy, embedding) are in test_grad_nn.c. */
#include "grad_check.h"

#define S(...) ((const int64_t[]){__VA_ARGS__})

/* ---------------------------------------------------------------- binary, with broadcasting */

static void test_binary(gt_op op, const char *label, int na, const int64_t *sa, int nb,
                        const int64_t *sb)
{
    gc_case c;
    gc_begin(&c, label, 1 + (uint64_t)op);
    /* b stays away from 0 so div is smooth over the FD step. */
    gt_value_id a = gc_param(&c, na, sa, -1.0, 1.0);
    gt_value_id b = gc_param(&c, nb, sb, 0.5, 1.5);
    gt_value_id y = op == GT_OP_ADD   ? gt_add(c.g, a, b)
                    : op == GT_OP_SUB ? gt_sub(c.g, a, b)
                    : op == GT_OP_MUL ? gt_mul(c.g, a, b)
                                      : gt_div(c.g, a, b);
    gc_run1(&c, y);
}

static void test_binaries(void)
{
    gt_op ops[4] = {GT_OP_ADD, GT_OP_SUB, GT_OP_MUL, GT_OP_DIV};
    const char *same[4] = {"add [3,5]", "sub [3,5]", "mul [3,5]", "div [3,5]"};
    const char *bcast[4] = {"add [3,1,5]+[4,5]", "sub [3,1,5]-[4,5]", "mul [3,1,5]*[4,5]",
                            "div [3,1,5]/[4,5]"};
    const char *bcast2[4] = {"add [4,5]+[3,1,5]", "sub [4,5]-[3,1,5]", "mul [4,5]*[3,1,5]",
                             "div [4,5]/[3,1,5]"};
    for (int i = 0; i < 4; i++) {
        test_binary(ops[i], same[i], 2, S(3, 5), 2, S(3, 5));
        test_binary(ops[i], bcast[i], 3, S(3, 1, 5), 2, S(4, 5));
        test_binary(ops[i], bcast2[i], 2, S(4, 5), 3, S(3, 1, 5));
    }
    /* a scalar-like [1] operand and a [] operand */
    test_binary(GT_OP_MUL, "mul [3,5]*[1]", 2, S(3, 5), 1, S(1));
    test_binary(GT_OP_DIV, "div [3,5]/[]", 2, S(3, 5), 0, S(0));
}

/* ---------------------------------------------------------------- unary */

static void test_unary(gt_op op, const char *label, double lo, double hi)
{
    gc_case c;
    gc_begin(&c, label, 100 + (uint64_t)op);
    gt_value_id x = gc_param(&c, 3, S(2, 3, 5), lo, hi);
    gc_run1(&c, gt_unary(c.g, op, x));
}

static void test_unaries(void)
{
    test_unary(GT_OP_NEG, "neg", -2.0, 2.0);
    test_unary(GT_OP_EXP, "exp", -2.0, 1.5);
    test_unary(GT_OP_LOG, "log", 0.5, 2.0); /* positive inputs: log, sqrt, rsqrt are smooth */
    test_unary(GT_OP_SQRT, "sqrt", 0.5, 2.0);
    test_unary(GT_OP_RSQRT, "rsqrt", 0.5, 2.0);
    test_unary(GT_OP_SILU, "silu", -3.0, 3.0);
    test_unary(GT_OP_SIGMOID, "sigmoid", -3.0, 3.0);

    gc_case c;
    gc_begin(&c, "scale", 7);
    gc_run1(&c, gt_scale(c.g, gc_param(&c, 2, S(3, 7), -1.0, 1.0), -1.7));
    gc_begin(&c, "add_scalar", 8);
    gc_run1(&c, gt_add_scalar(c.g, gc_param(&c, 2, S(3, 7), -1.0, 1.0), 0.3));
    gc_begin(&c, "cast f32->f32", 9);
    gc_run1(&c, gt_cast(c.g, gc_param(&c, 2, S(3, 7), -1.0, 1.0), GT_F32));
}

/* cast f32 -> bf16 -> f32: FD through bf16 rounding is meaningless, so check the exact property
 * instead: d/dx sum(cast(cast(x)) * R) = R rounded to bf16 (the chain rule casts dy to bf16 on the
 * way back, then to f32). The reference rounding is gt_f32_to_bf16 on R. */
static void test_cast_chain(void)
{
    gc_case c;
    gc_begin(&c, "cast f32->bf16->f32", 10);
    gt_value_id x = gc_param(&c, 2, S(3, 7), -1.0, 1.0);
    gt_value_id y = gt_cast(c.g, gt_cast(c.g, x, GT_BF16), GT_F32);
    gt_value_id r = gc_input(&c, GT_IN_INPUT, GT_F32, 2, S(3, 7));
    gt_tensor *rt = &c.in[c.n_in - 1];
    for (int i = 0; i < 21; i++)
        gt_tensor_set_f32(rt, i, (float)gc_uniform(&c.rng, -1.0, 1.0));
    int all[2] = {0, 1};
    gt_value_id loss = gt_reduce(c.g, GT_OP_SUM, gt_mul(c.g, y, r), 2, all, false);
    gt_graph_add_output(c.g, GT_OUT_LOSS, "loss", loss);
    gt_error err = {0};
    EXPECT_OK(gt_autodiff(c.g, &err), &err);
    gt_tensor outs[2] = {{0}};
    EXPECT_OK(gt_eager_run(c.g, &gc_no_binding, c.in, outs, &err), &err);
    int bad = 0;
    for (int i = 0; outs[1].data && i < 21; i++) {
        float want = gt_bf16_to_f32(gt_f32_to_bf16(gt_tensor_get_f32(rt, i)));
        bad += gt_tensor_get_f32(&outs[1], i) != want;
    }
    EXPECT(outs[1].data && bad == 0, "cast chain: %d gradient elements differ from bf16(R)", bad);
    gt_tensor_free(&outs[0]);
    gt_tensor_free(&outs[1]);
    gc_end(&c);
}

/* ---------------------------------------------------------------- reductions */

static void test_reduce(gt_op op, const char *label, int ndims, const int *dims, bool keepdim)
{
    gc_case c;
    gc_begin(&c, label, 200 + (uint64_t)ndims * 7 + (uint64_t)keepdim);
    gt_value_id x = op == GT_OP_MAX ? gc_param_distinct(&c, 3, S(3, 4, 5))
                                    : gc_param(&c, 3, S(3, 4, 5), -1.0, 1.0);
    gc_run1(&c, gt_reduce(c.g, op, x, ndims, dims, keepdim));
}

static void test_reductions(void)
{
    gt_op ops[4] = {GT_OP_SUM, GT_OP_MEAN, GT_OP_MAX, GT_OP_SUM_SQUARES};
    const char *names[4][4] = {
        {"sum dim 1", "sum dims 0,2 keepdim", "sum all", "sum dim -1 keepdim"},
        {"mean dim 1", "mean dims 0,2 keepdim", "mean all", "mean dim -1 keepdim"},
        {"max dim 1", "max dims 0,2 keepdim", "max all", "max dim -1 keepdim"},
        {"sum_squares dim 1", "sum_squares dims 0,2 keepdim", "sum_squares all",
         "sum_squares dim -1 keepdim"},
    };
    for (int i = 0; i < 4; i++) {
        test_reduce(ops[i], names[i][0], 1, (const int[]){1}, false);
        test_reduce(ops[i], names[i][1], 2, (const int[]){0, 2}, true);
        test_reduce(ops[i], names[i][2], 3, (const int[]){0, 1, 2}, false);
        test_reduce(ops[i], names[i][3], 1, (const int[]){-1}, true);
    }
}

/* ---------------------------------------------------------------- layout */

static void test_layout(void)
{
    gc_case c;
    gt_graph *g;

    gc_begin(&c, "broadcast_to [3,1,5]->[2,3,4,5]", 301);
    g = c.g;
    gc_run1(&c, gt_broadcast_to(g, gc_param(&c, 3, S(3, 1, 5), -1, 1), 4,
                                (gt_expr[]){gt_c(g, 2), gt_c(g, 3), gt_c(g, 4), gt_c(g, 5)}));

    gc_begin(&c, "sum_to [3,4,5]->[4,1]", 302);
    g = c.g;
    gc_run1(&c, gt_sum_to(g, gc_param(&c, 3, S(3, 4, 5), -1, 1), 2,
                          (gt_expr[]){gt_c(g, 4), gt_c(g, 1)}));

    gc_begin(&c, "reshape [3,4,5]->[12,5]", 303);
    g = c.g;
    gc_run1(&c, gt_reshape(g, gc_param(&c, 3, S(3, 4, 5), -1, 1), 2,
                           (gt_expr[]){gt_c(g, 12), gt_c(g, 5)}));

    /* the gradient of a regroup is the regroup back: the batch of 4 as 2 blocks of 2 rows */
    gc_begin(&c, "regroup [4,3,5]->[2,2,3,5]", 313);
    g = c.g;
    gc_run1(&c, gt_regroup(g, gc_param(&c, 3, S(4, 3, 5), -1, 1), 4,
                           (gt_expr[]){gt_c(g, 2), gt_c(g, 2), gt_c(g, 3), gt_c(g, 5)}));

    gc_begin(&c, "transpose [3,4,5] 0<->2", 304);
    gc_run1(&c, gt_transpose(c.g, gc_param(&c, 3, S(3, 4, 5), -1, 1), 0, 2));

    gc_begin(&c, "permute [3,4,5] (2,0,1)", 305);
    gc_run1(&c, gt_permute(c.g, gc_param(&c, 3, S(3, 4, 5), -1, 1), 3, (const int[]){2, 0, 1}));

    gc_begin(&c, "permute [2,3,4,5] (1,3,0,2)", 306);
    gc_run1(&c,
            gt_permute(c.g, gc_param(&c, 4, S(2, 3, 4, 5), -1, 1), 4, (const int[]){1, 3, 0, 2}));

    gc_begin(&c, "slice [3,5,2] dim 1 [1,4)", 307);
    g = c.g;
    gc_run1(&c, gt_slice(g, gc_param(&c, 3, S(3, 5, 2), -1, 1), 1, gt_c(g, 1), gt_c(g, 4)));

    gc_begin(&c, "slice_backward [3,2,4] dim 1 [1,3) size 6", 308);
    g = c.g;
    gc_run1(&c, gt_slice_backward(g, gc_param(&c, 3, S(3, 2, 4), -1, 1), 1, gt_c(g, 1), gt_c(g, 3),
                                  gt_c(g, 6)));

    gc_begin(&c, "concat dim 1 of [3,2,4] [3,1,4] [3,3,4]", 309);
    {
        gt_value_id xs[3] = {gc_param(&c, 3, S(3, 2, 4), -1, 1), gc_param(&c, 3, S(3, 1, 4), -1, 1),
                             gc_param(&c, 3, S(3, 3, 4), -1, 1)};
        gc_run1(&c, gt_concat(c.g, 3, xs, 1));
    }

    /* split: all pieces weighted, then only pieces 0 and 2 (piece 1's gradient is replaced by
     * zeros: its window of dx must be exactly 0, which FD confirms since the loss ignores it). */
    for (int partial = 0; partial < 2; partial++) {
        gc_begin(&c,
                 partial ? "split [3,7,2] dim 1 (2,4,1), pieces 0 and 2"
                         : "split [3,7,2] dim 1 (2,4,1)",
                 310 + (uint64_t)partial);
        g = c.g;
        gt_value_id pieces[3];
        gt_split(g, gc_param(&c, 3, S(3, 7, 2), -1, 1), 1, 3,
                 (gt_expr[]){gt_c(g, 2), gt_c(g, 4), gt_c(g, 1)}, pieces);
        if (partial) {
            gt_value_id used[2] = {pieces[0], pieces[2]};
            gc_check(&c, 2, used);
        } else {
            gc_check(&c, 3, pieces);
        }
        gc_end(&c);
    }
}

int main(void)
{
    test_binaries();
    test_unaries();
    test_cast_chain();
    test_reductions();
    test_layout();
    return gt_test_finish();
}
