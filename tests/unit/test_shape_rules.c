/* test_shape_rules.c — every op's shape/dtype rule against types derived by hand from the
 * semantics in gt_ops.def, and every kind of misuse (arity, inner dims, dtype, dim index,
 * symbolic mismatch) reported as GT_ERR_SHAPE / GT_ERR_INVALID with a message naming the op. */
#include <string.h>

#include "graphtrain/gt_build.h"
#include "graphtrain/gt_graph.h"
#include "gt_test.h"

static gt_graph *g;
static gt_expr B, S; /* symbols "batch", "seq" */

static gt_expr C(int64_t c)
{
    return gt_sym_const(g->sym, c);
}
static gt_expr MUL(gt_expr a, gt_expr b)
{
    return gt_sym_mul(g->sym, a, b);
}

static gt_value_id input(gt_dtype dt, int ndim, const gt_expr *dims)
{
    static int count;
    char name[32];
    snprintf(name, sizeof name, "x%d", count++);
    return gt_graph_add_input(g, GT_IN_INPUT, name, dt, ndim, dims);
}
#define IN(dt, ...)                                                                                \
    input(dt, (int)(sizeof((gt_expr[]){__VA_ARGS__}) / sizeof(gt_expr)), (gt_expr[]){__VA_ARGS__})
#define SCALAR_IN(dt) input(dt, 0, NULL)

/* v has dtype dt and exactly the dims given (dims compare by expression id). */
static bool type_is(gt_value_id v, gt_dtype dt, int ndim, const gt_expr *dims)
{
    if (v < 0 || v >= g->n_values) return false;
    const gt_type *t = gt_value_type(g, v);
    if (t->dtype != dt || t->ndim != ndim) return false;
    for (int k = 0; k < ndim; k++)
        if (t->dims[k] != dims[k]) return false;
    return true;
}
static const char *type_text(gt_value_id v)
{
    static char buf[256];
    if (v < 0 || v >= g->n_values) return "(no value)";
    gt_graph_format_type(g, gt_value_type(g, v), buf, sizeof buf);
    return buf;
}
#define EXPECT_TYPE(v, dt, ...)                                                                    \
    do {                                                                                           \
        gt_value_id v_ = (v);                                                                      \
        const gt_expr d_[] = {__VA_ARGS__};                                                        \
        EXPECT(type_is(v_, dt, (int)(sizeof d_ / sizeof d_[0]), d_), "got %s, err: %s",            \
               type_text(v_), g->err.msg);                                                         \
    } while (0)
#define EXPECT_SCALAR(v, dt)                                                                       \
    EXPECT(type_is((v), dt, 0, NULL), "got %s, err: %s", type_text(v), g->err.msg)

/* The last build failed with code and a message that contains `needle` (op name etc.). Clears the
 * sticky error for the next case. */
static void expect_fail(gt_value_id v, gt_status code, const char *needle, int line)
{
    bool ok = v == GT_NONE && g->err.code == code && strstr(g->err.msg, needle);
    EXPECT(ok, "line %d: wanted %s containing '%s', got v=%d %s: '%s'", line, gt_status_name(code),
           needle, v, gt_status_name(g->err.code), g->err.msg);
    gt_error_clear(&g->err);
}
#define EXPECT_FAIL(v, code, needle) expect_fail((v), (code), (needle), __LINE__)

static void test_full_and_elementwise(void)
{
    EXPECT_TYPE(gt_full(g, GT_F32, 2, (gt_expr[]){B, C(4)}, 0.5), GT_F32, B, C(4));
    EXPECT_TYPE(gt_full(g, GT_I64, 1, (gt_expr[]){S}, 0), GT_I64, S);
    EXPECT_SCALAR(gt_full(g, GT_BF16, 0, NULL, 1), GT_BF16);
    gt_attrs bad = {.ni = 1, .nf = 1};
    bad.i[0] = 99;
    EXPECT_FAIL(gt_graph_add_node(g, GT_OP_FULL, NULL, 0, &bad, NULL), GT_ERR_INVALID, "full");
    EXPECT_FAIL(gt_full(g, GT_F32, 1, (gt_expr[]){C(-3)}, 0), GT_ERR_SHAPE, "full");

    /* numpy broadcasting: [b, s, 1] with [s, 8] -> [b, s, 8]; [4, 1] with [1, 5] -> [4, 5] */
    gt_value_id a = IN(GT_F32, B, S, C(1)), b = IN(GT_F32, S, C(8));
    EXPECT_TYPE(gt_add(g, a, b), GT_F32, B, S, C(8));
    EXPECT_TYPE(gt_add(g, b, a), GT_F32, B, S, C(8));
    gt_value_id c = IN(GT_BF16, C(4), C(1)), d = IN(GT_BF16, C(1), C(5));
    EXPECT_TYPE(gt_sub(g, c, d), GT_BF16, C(4), C(5));
    EXPECT_TYPE(gt_mul(g, c, d), GT_BF16, C(4), C(5));
    EXPECT_TYPE(gt_div(g, d, c), GT_BF16, C(4), C(5));
    gt_value_id s0 = SCALAR_IN(GT_F32);
    EXPECT_TYPE(gt_mul(g, a, s0), GT_F32, B, S, C(1));

    gt_value_id x256 = IN(GT_F32, B, C(256)), x512 = IN(GT_F32, B, C(512));
    EXPECT_FAIL(gt_add(g, x256, x512), GT_ERR_SHAPE, "add");
    EXPECT_FAIL(gt_add(g, IN(GT_F32, B), IN(GT_F32, S)), GT_ERR_SHAPE, "add"); /* b vs s */
    EXPECT_FAIL(gt_mul(g, IN(GT_F32, C(3)), IN(GT_BF16, C(3))), GT_ERR_SHAPE, "mul");
    EXPECT_FAIL(gt_div(g, IN(GT_I32, C(3)), IN(GT_I32, C(3))), GT_ERR_SHAPE, "div");

    /* unary ops keep the type; ints are refused */
    const gt_op unary[] = {GT_OP_NEG,   GT_OP_EXP,  GT_OP_LOG,    GT_OP_SQRT,
                           GT_OP_RSQRT, GT_OP_SILU, GT_OP_SIGMOID};
    gt_value_id xb = IN(GT_BF16, B, S, C(3)), xi = IN(GT_I64, C(3));
    for (size_t k = 0; k < sizeof unary / sizeof unary[0]; k++) {
        EXPECT_TYPE(gt_unary(g, unary[k], xb), GT_BF16, B, S, C(3));
        EXPECT_FAIL(gt_unary(g, unary[k], xi), GT_ERR_SHAPE, gt_op_get(unary[k])->name);
    }
    EXPECT_FAIL(gt_unary(g, GT_OP_MATMUL, xb), GT_ERR_INVALID, "matmul");
    EXPECT_TYPE(gt_scale(g, xb, 0.5), GT_BF16, B, S, C(3));
    EXPECT_TYPE(gt_add_scalar(g, xb, 2), GT_BF16, B, S, C(3));
    EXPECT_FAIL(gt_scale(g, xi, 2), GT_ERR_SHAPE, "scale");
    EXPECT_TYPE(gt_silu_backward(g, xb, xb), GT_BF16, B, S, C(3));
    EXPECT_FAIL(gt_silu_backward(g, xb, IN(GT_BF16, B, S, C(4))), GT_ERR_SHAPE, "silu_backward");

    EXPECT_TYPE(gt_cast(g, xb, GT_F32), GT_F32, B, S, C(3));
    EXPECT_TYPE(gt_cast(g, xi, GT_F32), GT_F32, C(3));
    EXPECT_FAIL(gt_cast(g, xb, (gt_dtype)42), GT_ERR_INVALID, "cast");
}

static void test_reductions(void)
{
    gt_value_id x = IN(GT_F32, B, S, C(8));
    EXPECT_TYPE(gt_reduce(g, GT_OP_SUM, x, 2, (int[]){1, -1}, false), GT_F32, B);
    EXPECT_TYPE(gt_reduce(g, GT_OP_MEAN, x, 2, (int[]){1, 2}, true), GT_F32, B, C(1), C(1));
    EXPECT_TYPE(gt_reduce(g, GT_OP_MAX, x, 1, (int[]){0}, false), GT_F32, S, C(8));
    EXPECT_SCALAR(gt_reduce(g, GT_OP_SUM, x, 3, (int[]){0, 1, 2}, false), GT_F32);
    EXPECT_TYPE(gt_reduce(g, GT_OP_SUM, x, 0, NULL, false), GT_F32, B, S, C(8));
    EXPECT_FAIL(gt_reduce(g, GT_OP_SUM, x, 1, (int[]){3}, false), GT_ERR_SHAPE, "sum");
    EXPECT_FAIL(gt_reduce(g, GT_OP_MEAN, x, 2, (int[]){1, -2}, false), GT_ERR_SHAPE, "mean");
    EXPECT_FAIL(gt_reduce(g, GT_OP_MAX, IN(GT_I32, C(4)), 1, (int[]){0}, false), GT_ERR_SHAPE,
                "max");
    EXPECT_FAIL(gt_reduce(g, GT_OP_EXP, x, 1, (int[]){0}, false), GT_ERR_INVALID, "exp");

    gt_value_id y = gt_reduce(g, GT_OP_MAX, x, 1, (int[]){2}, true);
    EXPECT_TYPE(gt_max_backward(g, x, y, y, 1, (int[]){2}, true), GT_F32, B, S, C(8));
    gt_value_id y2 = gt_reduce(g, GT_OP_MAX, x, 1, (int[]){2}, false);
    EXPECT_TYPE(gt_max_backward(g, x, y2, y2, 1, (int[]){-1}, false), GT_F32, B, S, C(8));
    EXPECT_FAIL(gt_max_backward(g, x, y, y, 1, (int[]){2}, false), GT_ERR_SHAPE, "max_backward");
}

static void test_layout(void)
{
    gt_value_id col = IN(GT_F32, S, C(1));
    EXPECT_TYPE(gt_broadcast_to(g, col, 3, (gt_expr[]){B, S, C(8)}), GT_F32, B, S, C(8));
    EXPECT_FAIL(gt_broadcast_to(g, IN(GT_F32, S, C(2)), 3, (gt_expr[]){B, S, C(8)}), GT_ERR_SHAPE,
                "broadcast_to");
    EXPECT_FAIL(gt_broadcast_to(g, IN(GT_F32, B, S, C(8)), 2, (gt_expr[]){S, C(8)}), GT_ERR_SHAPE,
                "broadcast_to");

    gt_value_id x = IN(GT_F32, B, S, C(8));
    EXPECT_TYPE(gt_sum_to(g, x, 2, (gt_expr[]){S, C(1)}), GT_F32, S, C(1));
    EXPECT_TYPE(gt_sum_to(g, x, 3, (gt_expr[]){C(1), S, C(8)}), GT_F32, C(1), S, C(8));
    EXPECT_FAIL(gt_sum_to(g, x, 2, (gt_expr[]){S, C(4)}), GT_ERR_SHAPE, "sum_to");

    /* reshape keeps numel, proved on the canonical product */
    gt_value_id r = IN(GT_F32, B, S, C(4));
    EXPECT_TYPE(gt_reshape(g, r, 2, (gt_expr[]){MUL(B, S), C(4)}), GT_F32, MUL(B, S), C(4));
    EXPECT_TYPE(gt_reshape(g, r, 3, (gt_expr[]){MUL(S, B), C(2), C(2)}), GT_F32, MUL(B, S), C(2),
                C(2));
    EXPECT_TYPE(gt_reshape(g, r, 2, (gt_expr[]){B, MUL(C(4), S)}), GT_F32, B, MUL(S, C(4)));
    EXPECT_FAIL(gt_reshape(g, r, 2, (gt_expr[]){MUL(B, S), C(8)}), GT_ERR_SHAPE, "reshape");
    gt_value_id k = IN(GT_I64, C(6), C(4));
    EXPECT_TYPE(gt_reshape(g, k, 2, (gt_expr[]){C(3), C(8)}), GT_I64, C(3), C(8));
    EXPECT_TYPE(gt_reshape(g, k, 1, (gt_expr[]){C(24)}), GT_I64, C(24));
    EXPECT_FAIL(gt_reshape(g, k, 2, (gt_expr[]){C(5), C(5)}), GT_ERR_SHAPE, "reshape");

    gt_value_id q = IN(GT_BF16, B, S, C(8), C(64));
    EXPECT_TYPE(gt_transpose(g, q, 1, 2), GT_BF16, B, C(8), S, C(64));
    EXPECT_TYPE(gt_transpose(g, q, -1, -2), GT_BF16, B, S, C(64), C(8));
    EXPECT_FAIL(gt_transpose(g, q, 1, 4), GT_ERR_SHAPE, "transpose");
    EXPECT_TYPE(gt_permute(g, q, 4, (int[]){0, 2, 1, 3}), GT_BF16, B, C(8), S, C(64));
    EXPECT_TYPE(gt_permute(g, q, 4, (int[]){3, -2, 0, 1}), GT_BF16, C(64), C(8), B, S);
    EXPECT_FAIL(gt_permute(g, q, 4, (int[]){0, 0, 1, 2}), GT_ERR_SHAPE, "permute");
    EXPECT_FAIL(gt_permute(g, q, 3, (int[]){0, 1, 2}), GT_ERR_SHAPE, "permute");

    /* slice [start, end) along dim; symbolic bounds allowed */
    gt_value_id t = IN(GT_F32, B, C(10));
    EXPECT_TYPE(gt_slice(g, t, 1, C(2), C(5)), GT_F32, B, C(3));
    EXPECT_TYPE(gt_slice(g, t, -1, C(0), C(10)), GT_F32, B, C(10));
    gt_value_id u = IN(GT_F32, B, S);
    EXPECT_TYPE(gt_slice(g, u, 1, C(1), S), GT_F32, B, gt_sym_add(g->sym, S, C(-1)));
    EXPECT_FAIL(gt_slice(g, t, 1, C(5), C(2)), GT_ERR_SHAPE, "slice");
    EXPECT_FAIL(gt_slice(g, t, 1, C(0), C(11)), GT_ERR_SHAPE, "slice");
    EXPECT_FAIL(gt_slice(g, t, 1, C(-1), C(3)), GT_ERR_SHAPE, "slice");
    EXPECT_FAIL(gt_slice(g, t, 2, C(0), C(1)), GT_ERR_SHAPE, "slice");
    EXPECT_FAIL(gt_slice(g, u, 1, S, gt_sym_sub(g->sym, S, C(1))), GT_ERR_SHAPE, "slice");

    gt_value_id dy = IN(GT_F32, B, C(3));
    EXPECT_TYPE(gt_slice_backward(g, dy, 1, C(2), C(5), C(10)), GT_F32, B, C(10));
    EXPECT_FAIL(gt_slice_backward(g, IN(GT_F32, B, C(4)), 1, C(2), C(5), C(10)), GT_ERR_SHAPE,
                "slice_backward");
    EXPECT_FAIL(gt_slice_backward(g, dy, 1, C(8), C(11), C(10)), GT_ERR_SHAPE, "slice_backward");

    /* concat adds the sizes along dim; the other dims must agree */
    gt_value_id parts[3] = {IN(GT_F32, B, C(2)), IN(GT_F32, B, C(3)), IN(GT_F32, B, S)};
    EXPECT_TYPE(gt_concat(g, 3, parts, 1), GT_F32, B, gt_sym_add(g->sym, S, C(5)));
    EXPECT_TYPE(gt_concat(g, 1, parts, -1), GT_F32, B, C(2));
    gt_value_id bad[2] = {IN(GT_F32, B, C(2)), IN(GT_F32, S, C(2))};
    EXPECT_FAIL(gt_concat(g, 2, bad, 1), GT_ERR_SHAPE, "concat");
    gt_value_id mixed[2] = {IN(GT_F32, B, C(2)), IN(GT_BF16, B, C(2))};
    EXPECT_FAIL(gt_concat(g, 2, mixed, 1), GT_ERR_SHAPE, "concat");
    EXPECT_FAIL(gt_concat(g, 0, parts, 0), GT_ERR_INVALID, "concat");
    gt_value_id nine[9];
    for (int k = 0; k < 9; k++)
        nine[k] = parts[0];
    EXPECT_FAIL(gt_concat(g, 9, nine, 0), GT_ERR_INVALID, "concat");

    gt_value_id outs[3];
    gt_value_id sp = IN(GT_F32, B, C(10));
    gt_value_id first = gt_split(g, sp, 1, 3, (gt_expr[]){C(3), C(5), C(2)}, outs);
    EXPECT(first == outs[0], "split returns outs[0]");
    EXPECT_TYPE(outs[0], GT_F32, B, C(3));
    EXPECT_TYPE(outs[1], GT_F32, B, C(5));
    EXPECT_TYPE(outs[2], GT_F32, B, C(2));
    EXPECT(g->nodes[g->n_nodes - 1].n_out == 3, "split node has 3 outputs");
    gt_value_id two[2];
    gt_value_id sy = IN(GT_F32, B, S);
    gt_split(g, sy, -1, 2, (gt_expr[]){C(1), gt_sym_sub(g->sym, S, C(1))}, two);
    EXPECT_TYPE(two[1], GT_F32, B, gt_sym_sub(g->sym, S, C(1)));
    EXPECT_FAIL(gt_split(g, sp, 1, 2, (gt_expr[]){C(3), C(6)}, outs), GT_ERR_SHAPE, "split");
    EXPECT(outs[0] == GT_NONE && outs[1] == GT_NONE, "failed split writes GT_NONE outputs");
}

static void test_matmul(void)
{
    gt_expr bs = MUL(B, S);
    gt_value_id x = IN(GT_F32, bs, C(256)), w = IN(GT_F32, C(256), C(768));
    gt_value_id wt = IN(GT_F32, C(768), C(256));
    EXPECT_TYPE(gt_matmul(g, x, w, false, false), GT_F32, bs, C(768));
    EXPECT_TYPE(gt_matmul(g, x, wt, false, true), GT_F32, bs, C(768));
    EXPECT_TYPE(gt_matmul(g, x, x, true, false), GT_F32, C(256), C(256)); /* x^T x */
    /* b of rank 2 broadcasts over a's leading dims */
    gt_value_id x3 = IN(GT_F32, B, S, C(256));
    EXPECT_TYPE(gt_matmul(g, x3, w, false, false), GT_F32, B, S, C(768));
    /* batched: [b, h, s, d] @ [b, h, d, t] and q @ k^T */
    gt_value_id q = IN(GT_BF16, B, C(4), S, C(64)), kt = IN(GT_BF16, B, C(4), C(64), S);
    EXPECT_TYPE(gt_matmul(g, q, kt, false, false), GT_BF16, B, C(4), S, S);
    EXPECT_TYPE(gt_matmul(g, q, q, false, true), GT_BF16, B, C(4), S, S);
    EXPECT_TYPE(gt_matmul(g, q, q, true, false), GT_BF16, B, C(4), C(64), C(64));

    /* The message names op, fqn, both inner dims and both types. */
    gt_graph_set_fqn(g, "layers.0.attention.wq");
    gt_value_id w512 = IN(GT_F32, C(512), C(768));
    gt_value_id bad = gt_matmul(g, x, w512, false, false);
    EXPECT(bad == GT_NONE && g->err.code == GT_ERR_SHAPE, "inner mismatch fails");
    EXPECT(strstr(g->err.msg, "matmul at layers.0.attention.wq") &&
               strstr(g->err.msg, "inner dims") && strstr(g->err.msg, "256") &&
               strstr(g->err.msg, "512") && strstr(g->err.msg, "batch*seq"),
           "message: %s", g->err.msg);
    /* The first error sticks; a GT_NONE input propagates without a new error. */
    char first[GT_ERROR_MSG_MAX];
    memcpy(first, g->err.msg, sizeof first);
    EXPECT(gt_unary(g, GT_OP_EXP, bad) == GT_NONE, "GT_NONE propagates");
    EXPECT(gt_add(g, x, bad) == GT_NONE, "GT_NONE propagates");
    EXPECT(gt_add(g, x, w) == GT_NONE && strcmp(first, g->err.msg) == 0,
           "later error does not replace the first: %s", g->err.msg);
    gt_error_clear(&g->err);
    gt_graph_set_fqn(g, NULL);

    EXPECT_FAIL(gt_matmul(g, q, IN(GT_BF16, C(3), C(4), C(64), S), false, false), GT_ERR_SHAPE,
                "batch dims");
    EXPECT_FAIL(gt_matmul(g, x3, IN(GT_F32, B, C(4), C(256), C(8)), false, false), GT_ERR_SHAPE,
                "matmul");
    EXPECT_FAIL(gt_matmul(g, x, IN(GT_BF16, C(256), C(8)), false, false), GT_ERR_SHAPE, "matmul");
    EXPECT_FAIL(gt_matmul(g, x, IN(GT_F32, C(256)), false, false), GT_ERR_SHAPE, "matmul");
    EXPECT_FAIL(gt_matmul(g, IN(GT_I32, C(2), C(2)), IN(GT_I32, C(2), C(2)), false, false),
                GT_ERR_SHAPE, "matmul");
    /* symbolic inner dims that differ cannot be proved equal */
    EXPECT_FAIL(gt_matmul(g, IN(GT_F32, C(2), B), IN(GT_F32, S, C(2)), false, false), GT_ERR_SHAPE,
                "inner dims");

    /* direct add_node: arity, input ids, NULL attrs = all zero */
    gt_value_id in3[3] = {x, w, w};
    EXPECT_FAIL(gt_graph_add_node(g, GT_OP_MATMUL, in3, 3, NULL, NULL), GT_ERR_INVALID, "matmul");
    EXPECT_FAIL(gt_graph_add_node(g, GT_OP_EXP, in3, 0, NULL, NULL), GT_ERR_INVALID, "exp");
    gt_value_id oob[2] = {x, 1 << 30};
    EXPECT_FAIL(gt_graph_add_node(g, GT_OP_ADD, oob, 2, NULL, NULL), GT_ERR_INVALID, "add");
    EXPECT_TYPE(gt_graph_add_node(g, GT_OP_MATMUL, (gt_value_id[]){x, w}, 2, NULL, NULL), GT_F32,
                bs, C(768));
    gt_attrs many = {.ni = 3};
    EXPECT_FAIL(gt_graph_add_node(g, GT_OP_MATMUL, (gt_value_id[]){x, w}, 2, &many, NULL),
                GT_ERR_INVALID, "matmul");
    gt_attrs flag2 = {.ni = 2, .i = {2, 0}};
    EXPECT_FAIL(gt_graph_add_node(g, GT_OP_MATMUL, (gt_value_id[]){x, w}, 2, &flag2, NULL),
                GT_ERR_INVALID, "trans_a");
    EXPECT_FAIL(gt_graph_add_node(g, (gt_op)999, NULL, 0, NULL, NULL), GT_ERR_INVALID, "999");
    /* an expression attribute cannot default: slice without start/end */
    EXPECT_FAIL(gt_graph_add_node(g, GT_OP_SLICE, &x, 1, NULL, NULL), GT_ERR_INVALID, "slice");
}

static void test_nn(void)
{
    gt_value_id x = IN(GT_BF16, B, S, C(64)), w = IN(GT_BF16, C(64));
    EXPECT_TYPE(gt_rms_norm(g, x, w, 1e-5), GT_BF16, B, S, C(64));
    EXPECT_FAIL(gt_rms_norm(g, x, IN(GT_BF16, C(65)), 1e-5), GT_ERR_SHAPE, "rms_norm");
    EXPECT_FAIL(gt_rms_norm(g, x, IN(GT_F32, C(64)), 1e-5), GT_ERR_SHAPE, "rms_norm");
    EXPECT_FAIL(gt_rms_norm(g, x, IN(GT_BF16, C(1), C(64)), 1e-5), GT_ERR_SHAPE, "rms_norm");
    gt_value_id dw = GT_NONE;
    gt_value_id dx = gt_rms_norm_backward(g, x, w, x, 1e-5, &dw);
    EXPECT_TYPE(dx, GT_BF16, B, S, C(64));
    EXPECT_TYPE(dw, GT_BF16, C(64));
    EXPECT_FAIL(gt_rms_norm_backward(g, x, w, IN(GT_BF16, B, C(64)), 1e-5, &dw), GT_ERR_SHAPE,
                "rms_norm_backward");
    EXPECT(dw == GT_NONE, "failed backward writes GT_NONE to dw");

    gt_rope_params rp = {.theta = 500000,
                         .factor = 8,
                         .low_freq_factor = 1,
                         .high_freq_factor = 4,
                         .original_max_position = 8192};
    gt_value_id xq = IN(GT_F32, B, S, C(8), C(64));
    EXPECT_TYPE(gt_rope(g, xq, &rp, false), GT_F32, B, S, C(8), C(64));
    EXPECT_TYPE(gt_rope(g, xq, &rp, true), GT_F32, B, S, C(8), C(64));
    EXPECT_FAIL(gt_rope(g, IN(GT_F32, B, S, C(63)), &rp, false), GT_ERR_SHAPE, "rope");
    EXPECT_FAIL(gt_rope(g, IN(GT_F32, B, S, C(8), C(63)), &rp, false), GT_ERR_SHAPE, "rope");
    gt_rope_params zero = {0};
    EXPECT_FAIL(gt_rope(g, xq, &zero, false), GT_ERR_INVALID, "rope");

    /* GQA: 8 query heads over 2 kv heads; out takes v's head dim; lse is f32 [b, hq, s] */
    gt_expr T = gt_sym_var(g->sym, "kv_len");
    gt_value_id q = IN(GT_BF16, B, C(8), S, C(64));
    gt_value_id k = IN(GT_BF16, B, C(2), T, C(64)), v = IN(GT_BF16, B, C(2), T, C(32));
    gt_value_id lse = GT_NONE;
    gt_value_id o = gt_sdpa(g, q, k, v, true, 0.125, &lse);
    EXPECT_TYPE(o, GT_BF16, B, C(8), S, C(32));
    EXPECT_TYPE(lse, GT_F32, B, C(8), S);
    EXPECT_TYPE(gt_sdpa(g, q, k, v, false, 0.125, NULL), GT_BF16, B, C(8), S, C(32));
    EXPECT_FAIL(gt_sdpa(g, IN(GT_BF16, B, C(6), S, C(64)), IN(GT_BF16, B, C(4), T, C(64)),
                        IN(GT_BF16, B, C(4), T, C(64)), true, 1, NULL),
                GT_ERR_SHAPE, "multiple");
    EXPECT_FAIL(gt_sdpa(g, q, k, IN(GT_BF16, B, C(2), S, C(32)), true, 1, NULL), GT_ERR_SHAPE,
                "sdpa");
    EXPECT_FAIL(gt_sdpa(g, q, IN(GT_BF16, B, C(2), T, C(32)), v, true, 1, NULL), GT_ERR_SHAPE,
                "sdpa");
    EXPECT_FAIL(gt_sdpa(g, q, IN(GT_F32, B, C(2), T, C(64)), v, true, 1, NULL), GT_ERR_SHAPE,
                "sdpa");
    EXPECT_FAIL(gt_sdpa(g, IN(GT_BF16, B, S, C(64)), k, v, true, 1, NULL), GT_ERR_SHAPE, "sdpa");

    gt_value_id dk = GT_NONE, dv = GT_NONE;
    gt_value_id dq = gt_sdpa_backward(g, q, k, v, o, lse, o, true, 0.125, &dk, &dv);
    EXPECT_TYPE(dq, GT_BF16, B, C(8), S, C(64));
    EXPECT_TYPE(dk, GT_BF16, B, C(2), T, C(64));
    EXPECT_TYPE(dv, GT_BF16, B, C(2), T, C(32));
    EXPECT_FAIL(gt_sdpa_backward(g, q, k, v, o, o, o, true, 0.125, &dk, &dv), GT_ERR_SHAPE,
                "sdpa_backward");

    /* layout 1: q [b, s, hq, d], k [b, t, hkv, d], v [b, t, hkv, dv]; out [b, s, hq, dv]; lse
     * still f32 [b, hq, s] */
    gt_value_id q1 = IN(GT_BF16, B, S, C(8), C(64));
    gt_value_id k1 = IN(GT_BF16, B, T, C(2), C(64)), v1 = IN(GT_BF16, B, T, C(2), C(32));
    gt_value_id lse1 = GT_NONE;
    gt_value_id o1 = gt_sdpa_layout(g, q1, k1, v1, true, 0.125, 1, &lse1);
    EXPECT_TYPE(o1, GT_BF16, B, S, C(8), C(32));
    EXPECT_TYPE(lse1, GT_F32, B, C(8), S);
    const gt_node *n1 = o1 != GT_NONE ? &g->nodes[g->values[o1].producer] : NULL;
    EXPECT(n1 && n1->attrs.ni == 2 && n1->attrs.i[1] == 1,
           "layout 1 sdpa node carries ni = 2, layout = 1");
    /* the layout-0 builder writes layout 0 explicitly */
    const gt_node *n0 = &g->nodes[g->values[o].producer];
    EXPECT(n0->attrs.ni == 2 && n0->attrs.i[1] == 0,
           "layout 0 sdpa node carries ni = 2, layout = 0");
    /* heads counts are read at dim 2: 6 over 4 does not divide in layout 1 */
    EXPECT_FAIL(gt_sdpa_layout(g, IN(GT_BF16, B, S, C(6), C(64)), IN(GT_BF16, B, T, C(4), C(64)),
                               IN(GT_BF16, B, T, C(4), C(64)), true, 1, 1, NULL),
                GT_ERR_SHAPE, "layout 1");
    /* k and v lengths are dim 1 in layout 1 */
    EXPECT_FAIL(gt_sdpa_layout(g, q1, k1, IN(GT_BF16, B, S, C(2), C(32)), true, 1, 1, NULL),
                GT_ERR_SHAPE, "different lengths");
    /* [b, 2 heads, 6 keys, d] read as layout 1 has 6 kv heads, which 8 query heads do not
     * divide (as layout 0 it is fine) */
    gt_value_id k6 = IN(GT_BF16, B, C(2), C(6), C(64)), v6 = IN(GT_BF16, B, C(2), C(6), C(32));
    EXPECT_TYPE(gt_sdpa(g, q, k6, v6, false, 1, NULL), GT_BF16, B, C(8), S, C(32));
    EXPECT_FAIL(gt_sdpa_layout(g, q1, k6, v6, false, 1, 1, NULL), GT_ERR_SHAPE, "layout 1");
    /* only 0 and 1 exist */
    EXPECT_FAIL(gt_sdpa_layout(g, q1, k1, v1, true, 1, 2, NULL), GT_ERR_INVALID, "layout");
    EXPECT_FAIL(gt_sdpa_layout(g, q1, k1, v1, true, 1, -1, NULL), GT_ERR_INVALID, "layout");
    gt_value_id dq1 =
        gt_sdpa_backward_layout(g, q1, k1, v1, o1, lse1, o1, true, 0.125, 1, &dk, &dv);
    EXPECT_TYPE(dq1, GT_BF16, B, S, C(8), C(64));
    EXPECT_TYPE(dk, GT_BF16, B, T, C(2), C(64));
    EXPECT_TYPE(dv, GT_BF16, B, T, C(2), C(32));
    /* out given in layout 0 to a layout-1 backward */
    EXPECT_FAIL(gt_sdpa_backward_layout(g, q1, k1, v1, o, lse1, o1, true, 0.125, 1, &dk, &dv),
                GT_ERR_SHAPE, "out is");
    EXPECT_FAIL(gt_sdpa_backward_layout(g, q1, k1, v1, o1, lse1, o1, true, 0.125, 3, &dk, &dv),
                GT_ERR_INVALID, "layout");

    gt_value_id logits = IN(GT_F32, B, S, C(1000));
    EXPECT_TYPE(gt_softmax(g, logits, -1), GT_F32, B, S, C(1000));
    EXPECT_TYPE(gt_softmax(g, logits, 0), GT_F32, B, S, C(1000));
    EXPECT_FAIL(gt_softmax(g, logits, 3), GT_ERR_SHAPE, "softmax");
    EXPECT_FAIL(gt_softmax(g, logits, -4), GT_ERR_SHAPE, "softmax");
    EXPECT_TYPE(gt_softmax_backward(g, logits, logits, 2), GT_F32, B, S, C(1000));
    EXPECT_FAIL(gt_softmax_backward(g, logits, IN(GT_BF16, B, S, C(1000)), 2), GT_ERR_SHAPE,
                "softmax_backward");

    gt_expr N = MUL(B, S);
    gt_value_id lg = IN(GT_BF16, N, C(1000)), tg = IN(GT_I64, N), tg32 = IN(GT_I32, N);
    gt_value_id loss = gt_cross_entropy(g, lg, tg, -100);
    EXPECT_SCALAR(loss, GT_F32);
    EXPECT_SCALAR(gt_cross_entropy(g, lg, tg32, -100), GT_F32);
    EXPECT_FAIL(gt_cross_entropy(g, lg, IN(GT_F32, N), -100), GT_ERR_SHAPE, "cross_entropy");
    EXPECT_FAIL(gt_cross_entropy(g, lg, IN(GT_I64, B), -100), GT_ERR_SHAPE, "cross_entropy");
    EXPECT_FAIL(gt_cross_entropy(g, logits, tg, -100), GT_ERR_SHAPE, "cross_entropy");
    EXPECT_TYPE(gt_cross_entropy_backward(g, lg, tg, loss, -100), GT_BF16, N, C(1000));
    EXPECT_FAIL(gt_cross_entropy_backward(g, lg, tg, IN(GT_F32, C(1)), -100), GT_ERR_SHAPE,
                "cross_entropy_backward");

    gt_value_id emb = IN(GT_F32, C(1000), C(64)), ids = IN(GT_I32, B, S);
    gt_value_id h = gt_embedding(g, emb, ids);
    EXPECT_TYPE(h, GT_F32, B, S, C(64));
    EXPECT_TYPE(gt_embedding(g, emb, IN(GT_I64, N)), GT_F32, N, C(64));
    EXPECT_FAIL(gt_embedding(g, emb, IN(GT_F32, B, S)), GT_ERR_SHAPE, "embedding");
    EXPECT_FAIL(gt_embedding(g, IN(GT_F32, C(1000)), ids), GT_ERR_SHAPE, "embedding");
    EXPECT_TYPE(gt_embedding_backward(g, ids, h, C(1000)), GT_F32, C(1000), C(64));
    EXPECT_FAIL(gt_embedding_backward(g, ids, IN(GT_F32, B, C(64)), C(1000)), GT_ERR_SHAPE,
                "embedding_backward");
    EXPECT_FAIL(gt_embedding_backward(g, h, h, C(1000)), GT_ERR_SHAPE, "embedding_backward");
}

int main(void)
{
    g = gt_graph_new();
    B = gt_sym_var(g->sym, "batch");
    S = gt_sym_var(g->sym, "seq");
    test_full_and_elementwise();
    test_reductions();
    test_layout();
    test_matmul();
    test_nn();
    /* Every node that went in passed its rule; the graph as a whole must verify. */
    gt_error err = {0};
    EXPECT_OK(gt_graph_verify(g, &err), &err);
    gt_graph_free(g);
    return gt_test_finish();
}
