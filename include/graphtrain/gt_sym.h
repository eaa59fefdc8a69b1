/* gt_sym.h — symbolic integer expressions for tensor dimensions.
 *
 * A dimension is a gt_expr: an index into a gt_sym_pool. Expressions are integer polynomials over
 * atoms; an atom is a named symbol (batch, seq, a rank coordinate) or an opaque floordiv / mod of
 * two expressions. Every constructor simplifies to a canonical form and interns it, so two
 * expressions that simplify to the same form have the same index: shape equality is index
 * equality. Canonical form: a sum of monomials with non-zero integer coefficients, monomials
 * ordered by their atoms; constants fold; x floordiv 1 = x, x mod 1 = 0, c1 floordiv c2 folds
 * (floor semantics, as Python), and (k*x) floordiv k = x when k divides every coefficient.
 *
 * The pool is plain arrays, so copying it (with the graph that owns it) is a memcpy. */
#ifndef GRAPHTRAIN_GT_SYM_H
#define GRAPHTRAIN_GT_SYM_H

#include "gt_core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef int32_t gt_expr;
#define GT_EXPR_INVALID ((gt_expr)-1)

typedef struct gt_sym_pool gt_sym_pool;

gt_sym_pool *gt_sym_pool_new(void);
gt_sym_pool *gt_sym_pool_copy(const gt_sym_pool *p);
void gt_sym_pool_free(gt_sym_pool *p);

gt_expr gt_sym_const(gt_sym_pool *p, int64_t c);
/* A named symbol; the same name gives the same expr. Names: [A-Za-z_][A-Za-z0-9_.]* */
gt_expr gt_sym_var(gt_sym_pool *p, const char *name);
gt_expr gt_sym_add(gt_sym_pool *p, gt_expr a, gt_expr b);
gt_expr gt_sym_sub(gt_sym_pool *p, gt_expr a, gt_expr b);
gt_expr gt_sym_mul(gt_sym_pool *p, gt_expr a, gt_expr b);
gt_expr gt_sym_floordiv(gt_sym_pool *p, gt_expr a, gt_expr b); /* b must not be constant 0 */
gt_expr gt_sym_mod(gt_sym_pool *p, gt_expr a, gt_expr b);
/* Any GT_EXPR_INVALID operand gives GT_EXPR_INVALID (errors propagate, never crash). */

bool gt_sym_is_const(const gt_sym_pool *p, gt_expr e, int64_t *value);

/* Values for symbols, by name. */
typedef struct {
    const char *name;
    int64_t value;
} gt_sym_binding_entry;
typedef struct {
    const gt_sym_binding_entry *entries;
    int n;
} gt_sym_binding;

/* Evaluates e; an unbound symbol or a division by zero is an error naming it. */
gt_status gt_sym_eval(const gt_sym_pool *p, gt_expr e, const gt_sym_binding *b, int64_t *out,
                      gt_error *err);
/* Replaces bound symbols by their values, leaving the rest symbolic (concretize). */
gt_expr gt_sym_substitute(gt_sym_pool *dst, const gt_sym_pool *src, gt_expr e,
                          const gt_sym_binding *b);
/* e with every occurrence of symbol `name` replaced by expression repl (both in p). */
gt_expr gt_sym_replace(gt_sym_pool *p, gt_expr e, const char *name, gt_expr repl);
/* Rebuilds e (from src) inside dst; used when moving expressions between graphs. */
gt_expr gt_sym_import(gt_sym_pool *dst, const gt_sym_pool *src, gt_expr e);

/* Stable text: "b*s", "2*s + 1", "(s + 3) // 4", "7". Returns the length it needed. */
int gt_sym_format(const gt_sym_pool *p, gt_expr e, char *buf, size_t n);
/* Parses the format above (integers, names, + - * // % and parentheses). */
gt_status gt_sym_parse(gt_sym_pool *p, const char *text, gt_expr *out, gt_error *err);

#ifdef __cplusplus
}
#endif
#endif
