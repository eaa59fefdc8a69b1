/* sym_eval.c — evaluating symbolic expressions, and rebuilding them under a partial binding or in
 * another pool.
 *
 * Both walk the expression DAG term by term; the value of each floordiv/mod atom is memoised for
 * the duration of one call, so a shared sub-expression is visited once. Evaluation is checked int64
 * arithmetic with Python floor semantics; overflow and division by zero are errors. */
#include "sym_internal.h"

#include <stdlib.h>
#include <string.h>

/* A tiny per-call memo: atom id -> value (linear lookup; calls touch few atoms). */
typedef struct {
    int32_t *atoms;
    int64_t *values;
    int32_t n, cap;
} gt_sym_memo;

static bool gt_sym_memo_get(const gt_sym_memo *m, int32_t atom, int64_t *v)
{
    for (int32_t i = 0; i < m->n; i++)
        if (m->atoms[i] == atom) {
            *v = m->values[i];
            return true;
        }
    return false;
}

static void gt_sym_memo_put(gt_sym_memo *m, int32_t atom, int64_t v)
{
    if (m->n == m->cap) {
        m->cap = m->cap ? m->cap * 2 : 16;
        m->atoms = gt_xrealloc(m->atoms, (size_t)m->cap * sizeof *m->atoms);
        m->values = gt_xrealloc(m->values, (size_t)m->cap * sizeof *m->values);
    }
    m->atoms[m->n] = atom;
    m->values[m->n] = v;
    m->n++;
}

static void gt_sym_memo_free(gt_sym_memo *m)
{
    free(m->atoms);
    free(m->values);
}

/* The binding's value for name (first entry wins). */
static bool gt_sym_binding_find(const gt_sym_binding *b, const char *name, int64_t *v)
{
    if (!b) return false;
    for (int i = 0; i < b->n; i++)
        if (b->entries[i].name && strcmp(b->entries[i].name, name) == 0) {
            *v = b->entries[i].value;
            return true;
        }
    return false;
}

/* ---------------------------------------------------------------- eval */

typedef struct {
    const gt_sym_pool *p;
    const gt_sym_binding *b;
    gt_expr top;
    gt_sym_memo memo;
    gt_error *err;
} gt_sym_eval_ctx;

static gt_status gt_sym_eval_expr(gt_sym_eval_ctx *c, gt_expr e, int64_t *out);

/* Error text helper: the top-level expression, formatted (truncated). */
#define GT_SYM_EVAL_FAIL(c, code, fmt, ...)                                                        \
    do {                                                                                           \
        char top_[256];                                                                            \
        gt_sym_format((c)->p, (c)->top, top_, sizeof top_);                                        \
        return gt_error_set((c)->err, code, fmt " (evaluating %s)", __VA_ARGS__, top_);            \
    } while (0)

static gt_status gt_sym_eval_atom(gt_sym_eval_ctx *c, int32_t atom, int64_t *out)
{
    const gt_sym_atom at = c->p->atoms[atom];
    if (at.kind == GT_SYM_ATOM_VAR) {
        const char *name = gt_sym_atom_name(c->p, atom);
        if (!gt_sym_binding_find(c->b, name, out))
            GT_SYM_EVAL_FAIL(c, GT_ERR_INVALID, "symbol '%s' is not bound", name);
        return GT_OK;
    }
    if (gt_sym_memo_get(&c->memo, atom, out)) return GT_OK;
    int64_t x, y;
    GT_TRY(gt_sym_eval_expr(c, at.a, &x));
    GT_TRY(gt_sym_eval_expr(c, at.b, &y));
    if (y == 0) {
        char den[256];
        gt_sym_format(c->p, at.b, den, sizeof den);
        GT_SYM_EVAL_FAIL(c, GT_ERR_INVALID, "division by zero: divisor %s is 0", den);
    }
    bool ok = at.kind == GT_SYM_ATOM_MOD ? gt_sym_py_mod(x, y, out) : gt_sym_py_floordiv(x, y, out);
    if (!ok)
        GT_SYM_EVAL_FAIL(c, GT_ERR_INVALID, "integer overflow in %lld // %lld", (long long)x,
                         (long long)y);
    gt_sym_memo_put(&c->memo, atom, *out);
    return GT_OK;
}

static gt_status gt_sym_eval_expr(gt_sym_eval_ctx *c, gt_expr e, int64_t *out)
{
    const gt_sym_pool *p = c->p;
    const gt_sym_node n = p->exprs[e];
    int64_t sum = 0;
    for (int32_t i = 0; i < n.n_terms; i++) {
        const gt_sym_term t = p->terms[n.term_off + i];
        int64_t prod = t.coef;
        for (int32_t k = 0; k < t.n_fac; k++) {
            int64_t v;
            GT_TRY(gt_sym_eval_atom(c, p->factors[t.fac_off + k], &v));
            if (__builtin_mul_overflow(prod, v, &prod))
                GT_SYM_EVAL_FAIL(c, GT_ERR_INVALID, "%s", "integer overflow");
        }
        if (__builtin_add_overflow(sum, prod, &sum))
            GT_SYM_EVAL_FAIL(c, GT_ERR_INVALID, "%s", "integer overflow");
    }
    *out = sum;
    return GT_OK;
}

gt_status gt_sym_eval(const gt_sym_pool *p, gt_expr e, const gt_sym_binding *b, int64_t *out,
                      gt_error *err)
{
    if (!gt_sym_valid(p, e))
        return gt_error_set(err, GT_ERR_INVALID, "symbolic expression id %d is invalid", (int)e);
    gt_sym_eval_ctx c = {p, b, e, {0}, err};
    int64_t v = 0;
    gt_status st = gt_sym_eval_expr(&c, e, &v);
    gt_sym_memo_free(&c.memo);
    if (st == GT_OK && out) *out = v;
    return st;
}

/* ---------------------------------------------------------------- substitute / import */

typedef struct {
    gt_sym_pool *dst;
    const gt_sym_pool *src;
    const gt_sym_binding *b;
    const char *rname; /* gt_sym_replace: this symbol becomes repl (an expr of dst) */
    gt_expr repl;
    gt_sym_memo memo; /* src atom -> dst expr */
} gt_sym_subst_ctx;

static gt_expr gt_sym_subst_expr(gt_sym_subst_ctx *c, gt_expr e);

static gt_expr gt_sym_subst_atom(gt_sym_subst_ctx *c, int32_t atom)
{
    int64_t v;
    if (gt_sym_memo_get(&c->memo, atom, &v)) return (gt_expr)v;
    /* Copy what we need first: when dst == src, building in dst may move src's arrays. */
    const gt_sym_atom at = c->src->atoms[atom];
    gt_expr r;
    if (at.kind == GT_SYM_ATOM_VAR) {
        const char *name = gt_sym_atom_name(c->src, atom);
        if (c->rname && strcmp(name, c->rname) == 0) {
            r = c->repl;
        } else if (gt_sym_binding_find(c->b, name, &v)) {
            r = gt_sym_const(c->dst, v);
        } else {
            char *copy = gt_xstrdup(name); /* name points into src->names */
            r = gt_sym_var(c->dst, copy);
            free(copy);
        }
    } else {
        gt_expr x = gt_sym_subst_expr(c, at.a);
        gt_expr y = gt_sym_subst_expr(c, at.b);
        r = at.kind == GT_SYM_ATOM_MOD ? gt_sym_mod(c->dst, x, y) : gt_sym_floordiv(c->dst, x, y);
    }
    gt_sym_memo_put(&c->memo, atom, r);
    return r;
}

static gt_expr gt_sym_subst_expr(gt_sym_subst_ctx *c, gt_expr e)
{
    const gt_sym_node n = c->src->exprs[e];
    gt_expr sum = gt_sym_const(c->dst, 0);
    for (int32_t i = 0; i < n.n_terms; i++) {
        const gt_sym_term t = c->src->terms[n.term_off + i];
        gt_expr m = gt_sym_const(c->dst, t.coef);
        for (int32_t k = 0; k < t.n_fac; k++) {
            int32_t atom = c->src->factors[t.fac_off + k];
            m = gt_sym_mul(c->dst, m, gt_sym_subst_atom(c, atom));
        }
        sum = gt_sym_add(c->dst, sum, m);
    }
    return sum;
}

gt_expr gt_sym_substitute(gt_sym_pool *dst, const gt_sym_pool *src, gt_expr e,
                          const gt_sym_binding *b)
{
    if (!gt_sym_valid(src, e)) return GT_EXPR_INVALID;
    if (dst == src && (!b || b->n == 0)) return e; /* nothing to replace, same pool */
    gt_sym_subst_ctx c = {dst, src, b, NULL, GT_EXPR_INVALID, {0}};
    gt_expr r = gt_sym_subst_expr(&c, e);
    gt_sym_memo_free(&c.memo);
    return r;
}

gt_expr gt_sym_import(gt_sym_pool *dst, const gt_sym_pool *src, gt_expr e)
{
    return gt_sym_substitute(dst, src, e, NULL);
}

gt_expr gt_sym_replace(gt_sym_pool *p, gt_expr e, const char *name, gt_expr repl)
{
    if (!gt_sym_valid(p, e) || !gt_sym_valid(p, repl) || !name) return GT_EXPR_INVALID;
    char *copy = gt_xstrdup(name); /* name may point into p's names, which may move */
    gt_sym_subst_ctx c = {p, p, NULL, copy, repl, {0}};
    gt_expr r = gt_sym_subst_expr(&c, e);
    gt_sym_memo_free(&c.memo);
    free(copy);
    return r;
}
