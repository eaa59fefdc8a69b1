/* test_cpu_elementwise.c — CPU kernels add/sub/mul/div (broadcasting), unary ops, scale,
 * add_scalar, silu_backward (finite differences), cast and full; the bf16/f16 wrapper; determinism.
 * References are naive double loops; tolerance 1e-5 relative for f32 results. */
#include "backend/cpu/cpu_internal.h"
#include "test_cpu_util.h"

static double ref_binary(gt_op op, double a, double b)
{
    switch (op) {
    case GT_OP_ADD:
        return a + b;
    case GT_OP_SUB:
        return a - b;
    case GT_OP_MUL:
        return a * b;
    case GT_OP_DIV:
        return a / b;
    default:
        return NAN;
    }
}

static double ref_sigmoid(double x)
{
    return 1.0 / (1.0 + exp(-x));
}

static double ref_unary(gt_op op, double x, double attr)
{
    switch (op) {
    case GT_OP_NEG:
        return -x;
    case GT_OP_EXP:
        return exp(x);
    case GT_OP_LOG:
        return log(x);
    case GT_OP_SQRT:
        return sqrt(x);
    case GT_OP_RSQRT:
        return 1.0 / sqrt(x);
    case GT_OP_SILU:
        return x * ref_sigmoid(x);
    case GT_OP_SIGMOID:
        return ref_sigmoid(x);
    case GT_OP_SCALE:
        return (float)attr * x;
    case GT_OP_ADD_SCALAR:
        return x + (float)attr;
    default:
        return NAN;
    }
}

typedef struct {
    int na, nb;
    int64_t a[4], b[4];
} shape_pair;

static void test_binary(tt_rng *r)
{
    const shape_pair pairs[] = {
        {1, 1, {19}, {19}},
        {2, 1, {3, 7}, {7}},
        {3, 2, {2, 1, 5}, {3, 1}},
        {1, 2, {1}, {4, 3}},
        {0, 2, {0}, {2, 3}},
        {2, 2, {7, 1}, {1, 19}},
        {4, 4, {2, 3, 1, 7}, {2, 1, 5, 7}},
    };
    const gt_op ops[] = {GT_OP_ADD, GT_OP_SUB, GT_OP_MUL, GT_OP_DIV};
    for (size_t p = 0; p < sizeof pairs / sizeof pairs[0]; p++) {
        const shape_pair *sp = &pairs[p];
        int on = sp->na > sp->nb ? sp->na : sp->nb;
        int64_t os[4];
        for (int d = 0; d < on; d++) { /* numpy: align right, 1 stretches */
            int da = d - (on - sp->na), db = d - (on - sp->nb);
            int64_t ea = da >= 0 ? sp->a[da] : 1, eb = db >= 0 ? sp->b[db] : 1;
            os[d] = ea == 1 ? eb : ea;
        }
        gt_tensor a = tt_rand(sp->na, sp->a, r, -2, 2);
        gt_tensor b = tt_rand(sp->nb, sp->b, r, 0.5, 2); /* away from 0 for div */
        gt_tensor out = tt_new(GT_F32, on, os);
        int64_t n = gt_tensor_numel(&out), idx[4];
        double *ref = tt_doubles(n);
        for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++) {
            for (int64_t i = 0; i < n; i++) {
                tt_unravel(i, on, os, idx);
                double av = gt_tensor_get_f32(&a, tt_ravel_bcast(idx, on, sp->na, sp->a));
                double bv = gt_tensor_get_f32(&b, tt_ravel_bcast(idx, on, sp->nb, sp->b));
                ref[i] = ref_binary(ops[o], av, bv);
            }
            tt_call k;
            tt_init(&k, ops[o]);
            tt_in(&k, &a);
            tt_in(&k, &b);
            tt_out(&k, &out);
            if (tt_run_ok(&k, "binary"))
                EXPECT(tt_close(&out, ref, 1e-6, 0, "binary"), "op %d pair %zu", (int)ops[o], p);
            EXPECT(tt_deterministic(&k), "binary determinism op %d pair %zu", (int)ops[o], p);
            EXPECT(tt_half_path(&k, GT_BF16, 0), "binary bf16 path op %d pair %zu", (int)ops[o], p);
            EXPECT(tt_half_path(&k, GT_F16, 0), "binary f16 path op %d pair %zu", (int)ops[o], p);
        }
        free(ref);
        gt_tensor_free(&a);
        gt_tensor_free(&b);
        gt_tensor_free(&out);
    }

    /* Shapes that do not broadcast to the output are an error, not a crash. */
    gt_tensor a = tt_rand(1, TT_SHAPE(3), r, -1, 1), b = tt_rand(1, TT_SHAPE(4), r, -1, 1);
    gt_tensor out = tt_new(GT_F32, 1, TT_SHAPE(4));
    tt_call k;
    tt_init(&k, GT_OP_ADD);
    tt_in(&k, &a);
    tt_in(&k, &b);
    tt_out(&k, &out);
    gt_error err = {0};
    EXPECT(tt_run(&k, &err) == GT_ERR_SHAPE, "add of [3] and [4] must fail: %s", err.msg);
    gt_tensor_free(&a);
    gt_tensor_free(&b);
    gt_tensor_free(&out);
}

static void test_unary(tt_rng *r)
{
    const gt_op ops[] = {GT_OP_NEG,  GT_OP_EXP,     GT_OP_LOG,   GT_OP_SQRT,      GT_OP_RSQRT,
                         GT_OP_SILU, GT_OP_SIGMOID, GT_OP_SCALE, GT_OP_ADD_SCALAR};
    const int64_t shapes[][3] = {{3, 19, 1}, {1, 1, 1}, {7, 1, 3}};
    for (size_t s = 0; s < 3; s++) {
        for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++) {
            bool positive = ops[o] == GT_OP_LOG || ops[o] == GT_OP_SQRT || ops[o] == GT_OP_RSQRT;
            gt_tensor x = tt_rand(3, shapes[s], r, positive ? 0.05 : -6, positive ? 5 : 6);
            gt_tensor y = tt_new(GT_F32, 3, shapes[s]);
            double attr = ops[o] == GT_OP_SCALE ? -0.37 : 1.25;
            int64_t n = gt_tensor_numel(&x);
            double *ref = tt_doubles(n);
            for (int64_t i = 0; i < n; i++)
                ref[i] = ref_unary(ops[o], gt_tensor_get_f32(&x, i), attr);
            tt_call k;
            tt_init(&k, ops[o]);
            tt_in(&k, &x);
            tt_out(&k, &y);
            if (ops[o] == GT_OP_SCALE || ops[o] == GT_OP_ADD_SCALAR) tt_f(&k, attr);
            if (tt_run_ok(&k, "unary"))
                EXPECT(tt_close(&y, ref, 1e-5, 0, "unary"), "op %d", ops[o]);
            EXPECT(tt_deterministic(&k), "unary determinism op %d", ops[o]);
            EXPECT(tt_half_path(&k, GT_BF16, 0), "unary bf16 op %d", ops[o]);
            free(ref);
            gt_tensor_free(&x);
            gt_tensor_free(&y);
        }
    }
}

/* The kernels' f32 bits are the element-by-element formula's, whatever vector loop computes them:
 * contiguous add/sub/mul/div (their dense loop), silu_backward and silu/sigmoid (the kernels' exp,
 * gt_cpu_expf, in chunks of 256, then the rest), over 1001 elements (chunk and vector tails), silu
 * also in place. */
static void test_f32_formulas(tt_rng *r)
{
    const int64_t shape[1] = {1001};
    gt_tensor a = tt_rand(1, shape, r, -9, 9), b = tt_rand(1, shape, r, 0.5, 3);
    gt_tensor y = tt_new(GT_F32, 1, shape);
    const float *pa = a.data, *pb = b.data;
    const gt_op bin[] = {GT_OP_ADD, GT_OP_SUB, GT_OP_MUL, GT_OP_DIV, GT_OP_SILU_BACKWARD};
    for (int o = 0; o < 5; o++) {
        tt_call k;
        tt_init(&k, bin[o]);
        tt_in(&k, &a);
        tt_in(&k, &b);
        tt_out(&k, &y);
        int bad = 0;
        if (tt_run_ok(&k, "dense binary"))
            for (int64_t i = 0; i < shape[0]; i++) {
                float s = 1.0f / (1.0f + gt_cpu_expf(-pa[i])); /* silu_backward: a = x, b = dy */
                float want = bin[o] == GT_OP_ADD   ? pa[i] + pb[i]
                             : bin[o] == GT_OP_SUB ? pa[i] - pb[i]
                             : bin[o] == GT_OP_MUL ? pa[i] * pb[i]
                             : bin[o] == GT_OP_DIV ? pa[i] / pb[i]
                                                   : pb[i] * s * (1.0f + pa[i] * (1.0f - s));
                bad += memcmp(&want, &((float *)y.data)[i], 4) != 0;
            }
        EXPECT(bad == 0, "dense binary op %d: %d elements off the f32 formula", bin[o], bad);
    }
    for (int o = 0; o < 3; o++) { /* silu, sigmoid, silu in place */
        gt_op op = o == 1 ? GT_OP_SIGMOID : GT_OP_SILU;
        gt_tensor x = tt_rand(1, shape, r, -12, 12);
        float *keep = malloc((size_t)shape[0] * sizeof *keep);
        memcpy(keep, x.data, (size_t)shape[0] * sizeof *keep);
        tt_call k;
        tt_init(&k, op);
        tt_in(&k, &x);
        tt_out(&k, o == 2 ? &x : &y);
        const float *got = o == 2 ? x.data : y.data;
        int bad = 0;
        if (tt_run_ok(&k, "silu/sigmoid"))
            for (int64_t i = 0; i < shape[0]; i++) {
                float s = 1.0f / (1.0f + gt_cpu_expf(-keep[i])); /* the kernels' exp */
                float want = op == GT_OP_SILU ? keep[i] * s : s;
                bad += memcmp(&want, &got[i], 4) != 0;
            }
        EXPECT(bad == 0, "%s%s: %d elements off the f32 formula",
               op == GT_OP_SILU ? "silu" : "sigmoid", o == 2 ? " in place" : "", bad);
        free(keep);
        gt_tensor_free(&x);
    }
    gt_tensor_free(&a);
    gt_tensor_free(&b);
    gt_tensor_free(&y);
}

/* silu_backward vs central differences of L(x) = sum dy * silu(x) in double. */
typedef struct {
    double *x, *dy;
    int64_t n;
} silu_ctx;

static double silu_objective(void *p)
{
    silu_ctx *c = p;
    double l = 0.0;
    for (int64_t i = 0; i < c->n; i++)
        l += c->dy[i] * c->x[i] * ref_sigmoid(c->x[i]);
    return l;
}

static void test_silu_backward(tt_rng *r)
{
    const int64_t shape[2] = {7, 19};
    gt_tensor x = tt_rand(2, shape, r, -6, 6), dy = tt_rand(2, shape, r, -1, 1);
    gt_tensor dx = tt_new(GT_F32, 2, shape);
    silu_ctx c = {tt_to_double(&x), tt_to_double(&dy), gt_tensor_numel(&x)};
    double *fd = tt_doubles(c.n);
    tt_fd(c.x, c.n, 1e-4, silu_objective, &c, fd);
    tt_call k;
    tt_init(&k, GT_OP_SILU_BACKWARD);
    tt_in(&k, &x);
    tt_in(&k, &dy);
    tt_out(&k, &dx);
    if (tt_run_ok(&k, "silu_backward")) EXPECT(tt_close(&dx, fd, 1e-4, 1e-6, "silu_backward"), " ");
    EXPECT(tt_deterministic(&k), "silu_backward determinism");
    EXPECT(tt_half_path(&k, GT_BF16, 0), "silu_backward bf16");
    free(c.x);
    free(c.dy);
    free(fd);
    gt_tensor_free(&x);
    gt_tensor_free(&dy);
    gt_tensor_free(&dx);
}

/* The half-precision neighbours of a rounded value h: h is the nearest representable value to v
 * when no neighbour is strictly closer. */
static bool nearest_half(gt_dtype dt, float v, uint16_t h)
{
    float (*widen)(uint16_t) = dt == GT_BF16 ? gt_bf16_to_f32 : gt_f16_to_f32;
    double got = widen(h), dist = fabs((double)v - got);
    for (int s = -1; s <= 1; s += 2) {
        uint16_t nb = (uint16_t)(h + s);
        float w = widen(nb);
        if (isfinite(w) && fabs((double)v - w) < dist) return false;
    }
    return true;
}

static void test_cast(tt_rng *r)
{
    const int64_t shape[2] = {5, 19};
    gt_tensor x = tt_rand(2, shape, r, -50, 50);
    for (int i = 0; i < 95; i += 7)
        gt_tensor_set_f32(&x, i, 0.0f);
    int64_t n = gt_tensor_numel(&x);
    const gt_dtype targets[] = {GT_BF16, GT_F16, GT_I32, GT_I64, GT_BOOL, GT_F32};
    for (size_t t = 0; t < sizeof targets / sizeof targets[0]; t++) {
        gt_tensor y = tt_new(targets[t], 2, shape);
        tt_call k;
        tt_init(&k, GT_OP_CAST);
        tt_in(&k, &x);
        tt_out(&k, &y);
        tt_i(&k, targets[t]);
        if (!tt_run_ok(&k, "cast")) continue;
        bool ok = true;
        for (int64_t i = 0; i < n && ok; i++) {
            float v = ((const float *)x.data)[i];
            switch (targets[t]) {
            case GT_BF16:
            case GT_F16:
                ok = nearest_half(targets[t], v, ((uint16_t *)y.data)[i]);
                break;
            case GT_I32:
                ok = ((int32_t *)y.data)[i] == (int32_t)trunc(v);
                break;
            case GT_I64:
                ok = ((int64_t *)y.data)[i] == (int64_t)trunc(v);
                break;
            case GT_BOOL:
                ok = ((uint8_t *)y.data)[i] == (v != 0.0f);
                break;
            default:
                ok = ((float *)y.data)[i] == v;
                break;
            }
            if (!ok)
                fprintf(stderr, "  cast to %s: element %lld of %g\n", gt_dtype_name(targets[t]),
                        (long long)i, v);
        }
        EXPECT(ok, "cast f32 -> %s", gt_dtype_name(targets[t]));
        EXPECT(tt_deterministic(&k), "cast determinism %s", gt_dtype_name(targets[t]));
        /* And back: every narrow value widens exactly; ints and bools come back as numbers. */
        gt_tensor back = tt_new(GT_F32, 2, shape);
        tt_call kb;
        tt_init(&kb, GT_OP_CAST);
        tt_in(&kb, &y);
        tt_out(&kb, &back);
        tt_i(&kb, GT_F32);
        if (tt_run_ok(&kb, "cast back")) {
            bool okb = true;
            for (int64_t i = 0; i < n; i++) {
                double want;
                switch (targets[t]) {
                case GT_BF16:
                    want = gt_bf16_to_f32(((uint16_t *)y.data)[i]);
                    break;
                case GT_F16:
                    want = gt_f16_to_f32(((uint16_t *)y.data)[i]);
                    break;
                case GT_I32:
                    want = ((int32_t *)y.data)[i];
                    break;
                case GT_I64:
                    want = (double)((int64_t *)y.data)[i];
                    break;
                case GT_BOOL:
                    want = ((uint8_t *)y.data)[i];
                    break;
                default:
                    want = ((float *)y.data)[i];
                    break;
                }
                okb = okb && ((float *)back.data)[i] == want;
            }
            EXPECT(okb, "cast %s -> f32", gt_dtype_name(targets[t]));
        }
        gt_tensor_free(&back);
        gt_tensor_free(&y);
    }
    /* bf16 -> f16 rounds once from the exact bf16 value; i32 -> i64 is exact. */
    gt_tensor xb = tt_new(GT_BF16, 2, shape), yh = tt_new(GT_F16, 2, shape);
    gt_tensor_convert(&x, &xb);
    tt_call k;
    tt_init(&k, GT_OP_CAST);
    tt_in(&k, &xb);
    tt_out(&k, &yh);
    tt_i(&k, GT_F16);
    if (tt_run_ok(&k, "cast bf16 -> f16")) {
        bool ok = true;
        for (int64_t i = 0; i < n; i++)
            ok = ok && nearest_half(GT_F16, gt_bf16_to_f32(((uint16_t *)xb.data)[i]),
                                    ((uint16_t *)yh.data)[i]);
        EXPECT(ok, "cast bf16 -> f16");
    }
    gt_tensor i32 = tt_new(GT_I32, 1, TT_SHAPE(4)), i64 = tt_new(GT_I64, 1, TT_SHAPE(4));
    const int32_t iv[4] = {-2147483647 - 1, -1, 0, 2147483647};
    memcpy(i32.data, iv, sizeof iv);
    tt_init(&k, GT_OP_CAST);
    tt_in(&k, &i32);
    tt_out(&k, &i64);
    tt_i(&k, GT_I64);
    if (tt_run_ok(&k, "cast i32 -> i64"))
        for (int i = 0; i < 4; i++)
            EXPECT(((int64_t *)i64.data)[i] == iv[i], "i32->i64 %d", i);
    gt_tensor_free(&i32);
    gt_tensor_free(&i64);
    gt_tensor_free(&xb);
    gt_tensor_free(&yh);
    gt_tensor_free(&x);
}

static void test_full(void)
{
    const int64_t shape[3] = {3, 1, 7};
    struct {
        gt_dtype dt;
        double value;
    } cases[] = {{GT_F32, 0.3},  {GT_BF16, 0.3}, {GT_F16, -2.5},     {GT_I64, 123456789012.0},
                 {GT_I32, -7.0}, {GT_BOOL, 1.0}, {GT_F32, -INFINITY}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        gt_tensor y = tt_new(cases[c].dt, 3, shape);
        tt_call k;
        tt_init(&k, GT_OP_FULL);
        tt_out(&k, &y);
        tt_i(&k, cases[c].dt);
        tt_f(&k, cases[c].value);
        for (int d = 0; d < 3; d++)
            tt_e(&k, shape[d]);
        EXPECT(tt_deterministic(&k), "full determinism %zu", c);
        bool ok = true;
        for (int64_t i = 0; i < 21; i++) {
            switch (cases[c].dt) {
            case GT_F32:
                ok = ok && ((float *)y.data)[i] == (float)cases[c].value;
                break;
            case GT_BF16:
                ok = ok && nearest_half(GT_BF16, (float)cases[c].value, ((uint16_t *)y.data)[i]);
                break;
            case GT_F16:
                ok = ok && gt_f16_to_f32(((uint16_t *)y.data)[i]) == -2.5f;
                break;
            case GT_I64:
                ok = ok && ((int64_t *)y.data)[i] == 123456789012LL;
                break;
            case GT_I32:
                ok = ok && ((int32_t *)y.data)[i] == -7;
                break;
            default:
                ok = ok && ((uint8_t *)y.data)[i] == 1;
                break;
            }
        }
        EXPECT(ok, "full case %zu (%s)", c, gt_dtype_name(cases[c].dt));
        gt_tensor_free(&y);
    }
}

/* Calls a caller could get wrong come back as errors naming the op. */
static void test_dispatch_errors(tt_rng *r)
{
    gt_tensor a = tt_rand(1, TT_SHAPE(3), r, -1, 1), out = tt_new(GT_F32, 1, TT_SHAPE(3));
    gt_tensor ints = tt_new(GT_I32, 1, TT_SHAPE(3));
    gt_error err = {0};
    tt_call k;
    tt_init(&k, GT_OP_ADD); /* one input for a binary op */
    tt_in(&k, &a);
    tt_out(&k, &out);
    EXPECT(tt_run(&k, &err) == GT_ERR_INVALID && strstr(err.msg, "add"), "arity: %s", err.msg);
    tt_init(&k, GT_OP_EXP); /* integer input to a float op */
    tt_in(&k, &ints);
    tt_out(&k, &out);
    EXPECT(tt_run(&k, &err) == GT_ERR_SHAPE && strstr(err.msg, "exp"), "dtype: %s", err.msg);
    tt_init(&k, GT_OP_SCALE); /* missing attribute */
    tt_in(&k, &a);
    tt_out(&k, &out);
    EXPECT(tt_run(&k, &err) == GT_ERR_INVALID && strstr(err.msg, "scale"), "attrs: %s", err.msg);
    tt_init(&k, (gt_op)GT_OP_COUNT);
    EXPECT(tt_run(&k, &err) == GT_ERR_INVALID, "unknown op: %s", err.msg);
    gt_tensor_free(&a);
    gt_tensor_free(&out);
    gt_tensor_free(&ints);
}

int main(void)
{
    tt_rng r = {42};
    test_binary(&r);
    test_unary(&r);
    test_f32_formulas(&r);
    test_silu_backward(&r);
    test_cast(&r);
    test_full();
    test_dispatch_errors(&r);
    return gt_test_finish();
}
