/* test_sym.c — symbolic expressions: canonical forms, folding, evaluation, substitution, import,
 * copy, and the text round trip, checked against a naive evaluator of the expression trees that
 * built them (Python integer semantics). */
#include "graphtrain/gt_sym.h"
#include "gt_test.h"

#include <math.h>
#include <string.h>

/* ---------------------------------------------------------------- helpers */

static uint64_t rng_state = 0x1234567887654321ull;
static uint32_t rnd(uint32_t n) /* xorshift64*, independent of the code under test */
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 2685821657736338717ull) >> 33) % n;
}

/* Python's // and % by way of long double floor (exact for the small values used here). */
static int64_t naive_floordiv(int64_t a, int64_t b)
{
    return (int64_t)floorl((long double)a / b);
}
static int64_t naive_mod(int64_t a, int64_t b)
{
    return a - b * naive_floordiv(a, b);
}

static const char *fmt(const gt_sym_pool *p, gt_expr e)
{
    static char buf[4][512];
    static int k;
    k = (k + 1) % 4;
    gt_sym_format(p, e, buf[k], sizeof buf[k]);
    return buf[k];
}

static int64_t eval_ok(const gt_sym_pool *p, gt_expr e, const gt_sym_binding *b)
{
    gt_error err = {0};
    int64_t v = 0;
    EXPECT_OK(gt_sym_eval(p, e, b, &v, &err), &err);
    return v;
}

/* ---------------------------------------------------------------- random expression trees */

enum { T_CONST, T_VAR, T_ADD, T_SUB, T_MUL, T_DIV, T_MOD };
typedef struct {
    int op;
    int64_t c;
    int var;
    int l, r;
} tnode;
typedef struct {
    tnode n[256];
    int count;
} tree;

static const char *var_names[3] = {"a", "b", "c.x"};

static int gen(tree *t, int depth)
{
    int id = t->count++;
    tnode *n = &t->n[id];
    int choice = depth <= 0 ? (int)rnd(2) : (int)rnd(7);
    n->op = choice;
    if (choice == T_CONST) {
        n->c = (int64_t)rnd(13) - 6;
    } else if (choice == T_VAR) {
        n->var = (int)rnd(3);
    } else {
        int l = gen(t, depth - 1);
        int r;
        if ((choice == T_DIV || choice == T_MOD) && rnd(2)) {
            r = t->count++; /* constant divisors are the common case: exercise their rules */
            t->n[r] = (tnode){T_CONST, (int64_t)rnd(9) - 4, 0, 0, 0};
        } else {
            r = gen(t, depth - 1);
        }
        t->n[id].l = l;
        t->n[id].r = r;
    }
    return id;
}

static gt_expr build(gt_sym_pool *p, const tree *t, int id)
{
    const tnode *n = &t->n[id];
    switch (n->op) {
    case T_CONST:
        return gt_sym_const(p, n->c);
    case T_VAR:
        return gt_sym_var(p, var_names[n->var]);
    case T_ADD:
        return gt_sym_add(p, build(p, t, n->l), build(p, t, n->r));
    case T_SUB:
        return gt_sym_sub(p, build(p, t, n->l), build(p, t, n->r));
    case T_MUL:
        return gt_sym_mul(p, build(p, t, n->l), build(p, t, n->r));
    case T_DIV:
        return gt_sym_floordiv(p, build(p, t, n->l), build(p, t, n->r));
    default:
        return gt_sym_mod(p, build(p, t, n->l), build(p, t, n->r));
    }
}

/* Naive evaluation; false on a zero divisor (or a value too large to evaluate exactly here). */
static bool naive_eval(const tree *t, int id, const int64_t *vars, int64_t *out)
{
    const tnode *n = &t->n[id];
    if (n->op == T_CONST) return *out = n->c, true;
    if (n->op == T_VAR) return *out = vars[n->var], true;
    int64_t x, y;
    if (!naive_eval(t, n->l, vars, &x) || !naive_eval(t, n->r, vars, &y)) return false;
    switch (n->op) {
    case T_ADD:
        *out = x + y;
        break;
    case T_SUB:
        *out = x - y;
        break;
    case T_MUL:
        *out = x * y;
        break;
    case T_DIV:
        if (y == 0) return false;
        *out = naive_floordiv(x, y);
        break;
    default:
        if (y == 0) return false;
        *out = naive_mod(x, y);
        break;
    }
    return *out > -(1ll << 40) && *out < (1ll << 40);
}

/* ---------------------------------------------------------------- tests */

static void test_identities(void)
{
    gt_sym_pool *p = gt_sym_pool_new();
    gt_expr a = gt_sym_var(p, "a"), b = gt_sym_var(p, "b"), c = gt_sym_var(p, "c");
    EXPECT(a != GT_EXPR_INVALID && a == gt_sym_var(p, "a"), "same name, same id");
    EXPECT(gt_sym_add(p, a, b) == gt_sym_add(p, b, a), "a+b commutes");
    EXPECT(gt_sym_mul(p, a, b) == gt_sym_mul(p, b, a), "a*b commutes");
    EXPECT(gt_sym_add(p, gt_sym_add(p, a, b), c) == gt_sym_add(p, a, gt_sym_add(p, b, c)),
           "+ associates");
    EXPECT(gt_sym_mul(p, gt_sym_mul(p, a, b), c) == gt_sym_mul(p, a, gt_sym_mul(p, b, c)),
           "* associates");
    gt_expr s = gt_sym_add(p, a, b);
    gt_expr sq = gt_sym_mul(p, s, s);
    gt_expr two = gt_sym_const(p, 2);
    gt_expr expand =
        gt_sym_add(p, gt_sym_add(p, gt_sym_mul(p, a, a), gt_sym_mul(p, two, gt_sym_mul(p, a, b))),
                   gt_sym_mul(p, b, b));
    EXPECT(sq == expand, "(a+b)^2: %s vs %s", fmt(p, sq), fmt(p, expand));
    EXPECT(strcmp(fmt(p, sq), "a*a + 2*a*b + b*b") == 0, "got %s", fmt(p, sq));
    int64_t v = -1;
    EXPECT(gt_sym_is_const(p, gt_sym_sub(p, sq, expand), &v) && v == 0, "a - a = 0");
    EXPECT(gt_sym_sub(p, a, a) == gt_sym_const(p, 0), "a - a is the constant 0");
    EXPECT(gt_sym_mul(p, a, gt_sym_const(p, 0)) == gt_sym_const(p, 0), "a*0 = 0");
    EXPECT(gt_sym_mul(p, a, gt_sym_const(p, 1)) == a, "a*1 = a");
    EXPECT(gt_sym_add(p, gt_sym_const(p, 3), gt_sym_const(p, 4)) == gt_sym_const(p, 7), "3+4");
    EXPECT(gt_sym_is_const(p, gt_sym_mul(p, gt_sym_const(p, -3), gt_sym_const(p, 5)), &v) &&
               v == -15,
           "-3*5");
    EXPECT(!gt_sym_is_const(p, a, &v), "a is not constant");
    /* a*(b+1) - a*b = a */
    gt_expr t =
        gt_sym_sub(p, gt_sym_mul(p, a, gt_sym_add(p, b, gt_sym_const(p, 1))), gt_sym_mul(p, a, b));
    EXPECT(t == a, "a*(b+1) - a*b = a, got %s", fmt(p, t));
    /* invalid operands and names propagate */
    EXPECT(gt_sym_add(p, GT_EXPR_INVALID, a) == GT_EXPR_INVALID, "invalid propagates (add)");
    EXPECT(gt_sym_mul(p, a, GT_EXPR_INVALID) == GT_EXPR_INVALID, "invalid propagates (mul)");
    EXPECT(gt_sym_floordiv(p, GT_EXPR_INVALID, a) == GT_EXPR_INVALID, "invalid propagates (//)");
    EXPECT(gt_sym_mod(p, a, 1 << 30) == GT_EXPR_INVALID, "out-of-range id is invalid");
    EXPECT(gt_sym_var(p, "1x") == GT_EXPR_INVALID, "bad name");
    EXPECT(gt_sym_var(p, "") == GT_EXPR_INVALID, "empty name");
    EXPECT(gt_sym_var(p, "a b") == GT_EXPR_INVALID, "name with space");
    EXPECT(gt_sym_var(p, "rank.tp_0") != GT_EXPR_INVALID, "dotted name");
    gt_sym_pool_free(p);
}

static void test_format(void)
{
    gt_sym_pool *p = gt_sym_pool_new();
    /* seq made first: the canonical order is by name, not by creation. */
    gt_expr seq = gt_sym_var(p, "seq"), batch = gt_sym_var(p, "batch");
    struct {
        gt_expr e;
        const char *text;
    } cases[] = {
        {gt_sym_mul(p, seq, batch), "batch*seq"},
        {gt_sym_add(p, gt_sym_mul(p, gt_sym_const(p, 2), seq), gt_sym_const(p, 1)), "2*seq + 1"},
        {gt_sym_floordiv(p, gt_sym_add(p, seq, gt_sym_const(p, 3)), gt_sym_const(p, 4)),
         "(seq + 3) // 4"},
        {gt_sym_const(p, 7), "7"},
        {gt_sym_const(p, -7), "-7"},
        {gt_sym_const(p, 0), "0"},
        {gt_sym_sub(p, gt_sym_const(p, 1), seq), "-seq + 1"},
        {gt_sym_sub(p, seq, gt_sym_const(p, 1)), "seq - 1"},
        {gt_sym_mod(p, seq, gt_sym_const(p, 8)), "seq % 8"},
        {gt_sym_mul(p, gt_sym_const(p, 2), gt_sym_floordiv(p, seq, batch)), "2*(seq // batch)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        EXPECT(strcmp(fmt(p, cases[i].e), cases[i].text) == 0, "got '%s' want '%s'",
               fmt(p, cases[i].e), cases[i].text);
        gt_error err = {0};
        gt_expr back = GT_EXPR_INVALID;
        EXPECT_OK(gt_sym_parse(p, cases[i].text, &back, &err), &err);
        EXPECT(back == cases[i].e, "parse '%s' gives the same id", cases[i].text);
    }
    /* the returned length is the full length even when the buffer is short */
    char small[4];
    int n = gt_sym_format(p, cases[1].e, small, sizeof small);
    EXPECT(n == (int)strlen("2*seq + 1") && strcmp(small, "2*s") == 0, "truncation: %d '%s'", n,
           small);
    gt_sym_pool_free(p);
}

static void test_floordiv_mod(void)
{
    gt_sym_pool *p = gt_sym_pool_new();
    int64_t v;
    /* constant folding against the naive reference, negatives included */
    for (int64_t a = -30; a <= 30; a++) {
        for (int64_t b = -7; b <= 7; b++) {
            if (b == 0) continue;
            gt_expr q = gt_sym_floordiv(p, gt_sym_const(p, a), gt_sym_const(p, b));
            gt_expr r = gt_sym_mod(p, gt_sym_const(p, a), gt_sym_const(p, b));
            EXPECT(gt_sym_is_const(p, q, &v) && v == naive_floordiv(a, b), "%lld // %lld",
                   (long long)a, (long long)b);
            EXPECT(gt_sym_is_const(p, r, &v) && v == naive_mod(a, b), "%lld %% %lld", (long long)a,
                   (long long)b);
        }
    }
    EXPECT(gt_sym_is_const(p, gt_sym_floordiv(p, gt_sym_const(p, -7), gt_sym_const(p, 2)), &v) &&
               v == -4,
           "-7 // 2 = -4");
    EXPECT(gt_sym_is_const(p, gt_sym_mod(p, gt_sym_const(p, -7), gt_sym_const(p, 2)), &v) && v == 1,
           "-7 %% 2 = 1");
    gt_expr x = gt_sym_var(p, "x"), y = gt_sym_var(p, "y");
    gt_expr k = gt_sym_const(p, 6);
    EXPECT(gt_sym_floordiv(p, x, gt_sym_const(p, 1)) == x, "x // 1 = x");
    EXPECT(gt_sym_mod(p, x, gt_sym_const(p, 1)) == gt_sym_const(p, 0), "x %% 1 = 0");
    EXPECT(gt_sym_floordiv(p, gt_sym_mul(p, x, k), k) == x, "x*k // k = x");
    EXPECT(gt_sym_mod(p, gt_sym_mul(p, x, k), k) == gt_sym_const(p, 0), "x*k %% k = 0");
    gt_expr lin = gt_sym_add(p, gt_sym_mul(p, gt_sym_const(p, 12), x),
                             gt_sym_mul(p, gt_sym_const(p, -18), y));
    EXPECT(gt_sym_floordiv(p, lin, k) == gt_sym_sub(p, gt_sym_mul(p, gt_sym_const(p, 2), x),
                                                    gt_sym_mul(p, gt_sym_const(p, 3), y)),
           "(12x - 18y) // 6 = 2x - 3y, got %s", fmt(p, gt_sym_floordiv(p, lin, k)));
    EXPECT(gt_sym_floordiv(p, x, gt_sym_const(p, 0)) == GT_EXPR_INVALID, "x // 0 is invalid");
    EXPECT(gt_sym_mod(p, x, gt_sym_const(p, 0)) == GT_EXPR_INVALID, "x %% 0 is invalid");
    /* the simplified forms agree with direct evaluation for a range of x, y, divisors */
    for (int64_t d = -5; d <= 5; d++) {
        if (d == 0) continue;
        gt_expr de = gt_sym_const(p, d);
        gt_expr num =
            gt_sym_add(p, gt_sym_mul(p, gt_sym_const(p, 4), x),
                       gt_sym_add(p, gt_sym_mul(p, gt_sym_const(p, 2), y), gt_sym_const(p, 6)));
        gt_expr qd = gt_sym_floordiv(p, num, de), rd = gt_sym_mod(p, num, de);
        for (int64_t xv = -9; xv <= 9; xv += 3)
            for (int64_t yv = -8; yv <= 8; yv += 4) {
                gt_sym_binding_entry e[2] = {{"x", xv}, {"y", yv}};
                gt_sym_binding b = {e, 2};
                int64_t n = 4 * xv + 2 * yv + 6;
                EXPECT(eval_ok(p, qd, &b) == naive_floordiv(n, d), "(%s) x=%lld y=%lld", fmt(p, qd),
                       (long long)xv, (long long)yv);
                EXPECT(eval_ok(p, rd, &b) == naive_mod(n, d), "(%s) x=%lld y=%lld", fmt(p, rd),
                       (long long)xv, (long long)yv);
            }
    }
    gt_sym_pool_free(p);
}

static void test_overflow(void)
{
    gt_sym_pool *p = gt_sym_pool_new();
    gt_expr big = gt_sym_const(p, INT64_MAX), x = gt_sym_var(p, "x");
    EXPECT(gt_sym_add(p, big, gt_sym_const(p, 1)) == GT_EXPR_INVALID, "INT64_MAX + 1");
    EXPECT(gt_sym_mul(p, big, gt_sym_const(p, 2)) == GT_EXPR_INVALID, "INT64_MAX * 2");
    EXPECT(gt_sym_mul(p, gt_sym_mul(p, big, x), gt_sym_const(p, 3)) == GT_EXPR_INVALID,
           "coefficient overflow");
    EXPECT(gt_sym_sub(p, gt_sym_const(p, INT64_MIN), gt_sym_const(p, 1)) == GT_EXPR_INVALID,
           "INT64_MIN - 1");
    EXPECT(gt_sym_floordiv(p, gt_sym_const(p, INT64_MIN), gt_sym_const(p, -1)) == GT_EXPR_INVALID,
           "INT64_MIN // -1");
    int64_t v;
    EXPECT(gt_sym_is_const(p, gt_sym_mod(p, gt_sym_const(p, INT64_MIN), gt_sym_const(p, -1)), &v) &&
               v == 0,
           "INT64_MIN %% -1 = 0");
    gt_expr min = gt_sym_const(p, INT64_MIN);
    gt_error err = {0};
    gt_expr back;
    EXPECT_OK(gt_sym_parse(p, fmt(p, min), &back, &err), &err);
    EXPECT(back == min, "INT64_MIN round trip: %s", fmt(p, min));
    gt_expr mx = gt_sym_add(p, gt_sym_mul(p, min, x), gt_sym_const(p, 5));
    EXPECT_OK(gt_sym_parse(p, fmt(p, mx), &back, &err), &err);
    EXPECT(back == mx, "INT64_MIN*x round trip: %s", fmt(p, mx));
    /* evaluation overflow is an error, not UB */
    gt_expr xx = gt_sym_mul(p, x, x);
    gt_sym_binding_entry e[1] = {{"x", (int64_t)1 << 40}};
    gt_sym_binding b = {e, 1};
    gt_error_clear(&err);
    EXPECT(gt_sym_eval(p, xx, &b, &v, &err) != GT_OK && strstr(err.msg, "overflow"), "%s", err.msg);
    gt_sym_pool_free(p);
}

static void test_eval_errors(void)
{
    gt_sym_pool *p = gt_sym_pool_new();
    gt_expr a = gt_sym_var(p, "a"), seq = gt_sym_var(p, "seq");
    gt_expr e = gt_sym_add(p, a, gt_sym_mul(p, a, seq));
    gt_sym_binding_entry ent[1] = {{"a", 3}};
    gt_sym_binding b = {ent, 1};
    gt_error err = {0};
    int64_t v;
    EXPECT(gt_sym_eval(p, e, &b, &v, &err) == GT_ERR_INVALID && strstr(err.msg, "'seq'"),
           "unbound symbol named: %s", err.msg);
    gt_expr d = gt_sym_floordiv(p, seq, a);
    gt_sym_binding_entry ent2[2] = {{"a", 0}, {"seq", 5}};
    gt_sym_binding b2 = {ent2, 2};
    gt_error_clear(&err);
    EXPECT(gt_sym_eval(p, d, &b2, &v, &err) == GT_ERR_INVALID &&
               strstr(err.msg, "division by zero"),
           "division by zero: %s", err.msg);
    gt_error_clear(&err);
    EXPECT(gt_sym_eval(p, gt_sym_mod(p, seq, a), &b2, &v, &err) == GT_ERR_INVALID, "mod by zero");
    gt_error_clear(&err);
    EXPECT(gt_sym_eval(p, GT_EXPR_INVALID, &b2, &v, &err) == GT_ERR_INVALID, "invalid id");
    gt_sym_pool_free(p);
}

static void test_parse_errors(void)
{
    gt_sym_pool *p = gt_sym_pool_new();
    const char *bad[] = {"(s + 3", "s / 2",  "3 $",         "",
                         "s +",    "2 // 0", "s % (s - s)", "99999999999999999999",
                         "s*)",    "1x"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        gt_error err = {0};
        gt_expr e;
        EXPECT(gt_sym_parse(p, bad[i], &e, &err) == GT_ERR_INVALID && strstr(err.msg, "position"),
               "'%s' should fail with a position: %s", bad[i], err.msg);
    }
    gt_error err = {0};
    gt_expr e;
    gt_sym_parse(p, "(s + 3", &e, &err);
    EXPECT(strstr(err.msg, "position 6") != NULL, "missing ')' reported at 6: %s", err.msg);
    /* deep nesting is an error, not a stack overflow */
    char deep[4000];
    memset(deep, '(', 2000);
    memset(deep + 2000, ')', 1999);
    deep[3999] = '\0';
    deep[1999] = '1';
    gt_error_clear(&err);
    EXPECT(gt_sym_parse(p, deep, &e, &err) == GT_ERR_INVALID, "deep nesting rejected");
    /* Python precedence */
    gt_error_clear(&err);
    gt_expr x = gt_sym_var(p, "x");
    EXPECT_OK(gt_sym_parse(p, "-x // 2 + 3 * 2 % 4 - (1 - x)", &e, &err), &err);
    gt_expr want = gt_sym_add(
        p, gt_sym_floordiv(p, gt_sym_mul(p, gt_sym_const(p, -1), x), gt_sym_const(p, 2)),
        gt_sym_add(p, gt_sym_const(p, (3 * 2) % 4), gt_sym_sub(p, x, gt_sym_const(p, 1))));
    EXPECT(e == want, "precedence: %s vs %s", fmt(p, e), fmt(p, want));
    gt_sym_pool_free(p);
}

/* Random trees: evaluation, format/parse round trip, substitute, import and copy. */
static void test_random(void)
{
    gt_sym_pool *p = gt_sym_pool_new();
    int compared = 0, roundtrips = 0;
    for (int iter = 0; iter < 3000; iter++) {
        tree t = {.count = 0};
        int root = gen(&t, 1 + (int)rnd(4));
        gt_expr e = build(p, &t, root);
        int64_t vars[3];
        if (e == GT_EXPR_INVALID) {
            /* only a provably zero constant divisor (or overflow, impossible at these sizes) */
            int64_t out;
            for (int k = 0; k < 4; k++) {
                for (int j = 0; j < 3; j++)
                    vars[j] = (int64_t)rnd(21) - 10;
                EXPECT(!naive_eval(&t, root, vars, &out), "built invalid but evaluates");
            }
            continue;
        }
        /* evaluation under random bindings vs the naive tree evaluation */
        for (int k = 0; k < 6; k++) {
            for (int j = 0; j < 3; j++)
                vars[j] = (int64_t)rnd(21) - 10;
            gt_sym_binding_entry ent[3] = {{"a", vars[0]}, {"b", vars[1]}, {"c.x", vars[2]}};
            gt_sym_binding b = {ent, 3};
            int64_t want, got;
            gt_error err = {0};
            bool nok = naive_eval(&t, root, vars, &want);
            gt_status st = gt_sym_eval(p, e, &b, &got, &err);
            if (nok) {
                EXPECT(st == GT_OK && got == want, "%s at a=%lld b=%lld c=%lld: %lld vs %lld (%s)",
                       fmt(p, e), (long long)vars[0], (long long)vars[1], (long long)vars[2],
                       (long long)got, (long long)want, err.msg);
                compared++;
            } else if (st != GT_OK) {
                EXPECT(strstr(err.msg, "division by zero") != NULL, "%s", err.msg);
            }
            /* an error from the symbolic side implies a zero divisor in the tree */
            if (st != GT_OK) {
                int64_t tmp;
                EXPECT(!naive_eval(&t, root, vars, &tmp), "sym error without zero division: %s",
                       err.msg);
            }
        }
        /* format -> parse gives the same id; in a fresh pool, the same text */
        char text[512];
        int len = gt_sym_format(p, e, text, sizeof text);
        if (len < (int)sizeof text) {
            gt_error err = {0};
            gt_expr back = GT_EXPR_INVALID;
            EXPECT_OK(gt_sym_parse(p, text, &back, &err), &err);
            EXPECT(back == e, "round trip '%s' -> '%s'", text, fmt(p, back));
            gt_sym_pool *q = gt_sym_pool_new();
            EXPECT_OK(gt_sym_parse(q, text, &back, &err), &err);
            EXPECT(strcmp(fmt(q, back), text) == 0, "fresh pool: '%s' vs '%s'", fmt(q, back), text);
            /* import into another pool and back */
            gt_expr imp = gt_sym_import(q, p, e);
            EXPECT(imp == back, "import equals parse in the other pool");
            EXPECT(gt_sym_import(p, q, imp) == e, "import back gives the original id");
            gt_sym_pool_free(q);
            roundtrips++;
        }
        /* substitute a = 3 (into the same pool): then eval with b, c matches eval with all */
        {
            gt_sym_binding_entry part[1] = {{"a", 3}};
            gt_sym_binding pb = {part, 1};
            gt_expr s = gt_sym_substitute(p, p, e, &pb);
            for (int j = 1; j < 3; j++)
                vars[j] = (int64_t)rnd(21) - 10;
            gt_sym_binding_entry rest[2] = {{"b", vars[1]}, {"c.x", vars[2]}};
            gt_sym_binding rb = {rest, 2};
            gt_sym_binding_entry all[3] = {{"a", 3}, {"b", vars[1]}, {"c.x", vars[2]}};
            gt_sym_binding ab = {all, 3};
            int64_t v1, v2;
            gt_error e1 = {0}, e2 = {0};
            gt_status s1 = gt_sym_eval(p, e, &ab, &v1, &e1);
            if (s1 == GT_OK) {
                EXPECT(s != GT_EXPR_INVALID, "substitute invalid");
                gt_status s2 = gt_sym_eval(p, s, &rb, &v2, &e2);
                EXPECT(s2 == GT_OK && v1 == v2, "substitute a=3 in %s -> %s: %lld vs %lld (%s)",
                       fmt(p, e), fmt(p, s), (long long)v1, (long long)v2, e2.msg);
            }
        }
    }
    EXPECT(compared > 5000 && roundtrips > 2500, "coverage: %d evaluations, %d round trips",
           compared, roundtrips);
    gt_sym_pool_free(p);
}

static void test_substitute_import_copy(void)
{
    gt_sym_pool *p = gt_sym_pool_new();
    gt_expr b = gt_sym_var(p, "batch"), s = gt_sym_var(p, "seq"), r = gt_sym_var(p, "rank.tp");
    gt_expr e = gt_sym_add(p, gt_sym_mul(p, b, s), gt_sym_floordiv(p, s, gt_sym_add(p, r, r)));
    gt_sym_binding_entry ent[2] = {{"batch", 4}, {"rank.tp", 2}};
    gt_sym_binding bind = {ent, 2};
    gt_sym_pool *q = gt_sym_pool_new();
    gt_expr sub = gt_sym_substitute(q, p, e, &bind);
    EXPECT(strcmp(fmt(q, sub), "4*seq + seq // 4") == 0, "partial bind: %s", fmt(q, sub));
    gt_expr sub_same = gt_sym_substitute(p, p, e, &bind);
    EXPECT(strcmp(fmt(p, sub_same), "4*seq + seq // 4") == 0, "in place: %s", fmt(p, sub_same));
    /* substitute with everything bound gives a constant */
    gt_sym_binding_entry ent3[3] = {{"batch", 4}, {"rank.tp", 2}, {"seq", 9}};
    gt_sym_binding full = {ent3, 3};
    int64_t v;
    EXPECT(gt_sym_is_const(p, gt_sym_substitute(p, p, e, &full), &v) && v == 4 * 9 + 9 / 4,
           "fully bound substitute");
    EXPECT(gt_sym_substitute(p, p, e, NULL) == e, "empty binding is the identity");

    /* copy: every id means the same; later constructions agree in both */
    int32_t n_before = 0;
    char before[64][128];
    for (gt_expr k = 0; k < 64; k++) {
        if (gt_sym_format(p, k, before[k], sizeof before[k]) && strcmp(before[k], "<invalid>"))
            n_before = k + 1;
    }
    gt_sym_pool *c = gt_sym_pool_copy(p);
    for (gt_expr k = 0; k < n_before; k++)
        EXPECT(strcmp(fmt(c, k), before[k]) == 0, "copy id %d: %s vs %s", (int)k, fmt(c, k),
               before[k]);
    gt_expr n1 = gt_sym_mul(p, e, gt_sym_var(p, "z"));
    gt_expr n2 = gt_sym_mul(c, e, gt_sym_var(c, "z"));
    EXPECT(n1 == n2, "same construction, same id in copy");
    EXPECT(gt_sym_var(c, "seq") == s, "existing symbol keeps its id in the copy");
    gt_sym_pool_free(p); /* the copy owns its own arrays */
    EXPECT(strcmp(fmt(c, n2), "batch*seq*z + z*(seq // (2*rank.tp))") == 0, "%s", fmt(c, n2));
    gt_sym_pool_free(c);
    gt_sym_pool_free(q);
}

/* Interning stays fast with many expressions (a graph of ~10k nodes): a linear scan would make
 * this take minutes; the hash table keeps it well under a second. No timing is asserted. */
static void test_many(void)
{
    gt_sym_pool *p = gt_sym_pool_new();
    gt_expr s = gt_sym_var(p, "seq");
    gt_expr ids[20000];
    for (int i = 0; i < 20000; i++)
        ids[i] = gt_sym_add(p, gt_sym_mul(p, gt_sym_const(p, i + 1), s), gt_sym_const(p, i));
    int ok = 1;
    for (int i = 0; i < 20000; i++) {
        gt_expr again = gt_sym_add(p, gt_sym_mul(p, s, gt_sym_const(p, i + 1)), gt_sym_const(p, i));
        if (again != ids[i] || (i && ids[i] == ids[i - 1])) ok = 0;
    }
    EXPECT(ok, "20000 distinct expressions intern consistently");
    gt_sym_pool_free(p);
}

/* Random strings over the grammar's alphabet: the parser either fails with a message or gives an
 * expression whose text parses back to the same id; it never crashes (run under ASan/UBSan). */
static void test_parse_garbage(void)
{
    gt_sym_pool *p = gt_sym_pool_new();
    const char alphabet[] = "ab_.x019 +-*/%()";
    int parsed = 0;
    for (int iter = 0; iter < 20000; iter++) {
        char text[24];
        int len = (int)rnd(sizeof text);
        for (int i = 0; i < len; i++)
            text[i] = alphabet[rnd(sizeof alphabet - 1)];
        text[len] = '\0';
        gt_error err = {0};
        gt_expr e = GT_EXPR_INVALID, back = GT_EXPR_INVALID;
        if (gt_sym_parse(p, text, &e, &err) != GT_OK) {
            EXPECT(err.code == GT_ERR_INVALID && strstr(err.msg, "position"), "'%s': %s", text,
                   err.msg);
            continue;
        }
        parsed++;
        EXPECT_OK(gt_sym_parse(p, fmt(p, e), &back, &err), &err);
        EXPECT(back == e, "'%s' -> '%s' does not round trip", text, fmt(p, e));
    }
    EXPECT(parsed > 500, "only %d random strings parsed", parsed);
    gt_sym_pool_free(p);
}

int main(void)
{
    test_identities();
    test_format();
    test_floordiv_mod();
    test_overflow();
    test_eval_errors();
    test_parse_errors();
    test_random();
    test_substitute_import_copy();
    test_many();
    test_parse_garbage();
    return gt_test_finish();
}
