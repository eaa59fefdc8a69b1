/* sym_internal.h — the representation behind gt_sym.h, shared by sym.c (construction, interning),
 * sym_eval.c (eval, substitute, import) and sym_text.c (format, parse).
 *
 * An expression is a sum of terms; a term is coef * (product of atom ids, sorted by
 * gt_sym_atom_cmp, repeated for powers); terms are sorted by gt_sym_mono_cmp with no two equal
 * monomials and no zero coefficient. Atoms and expressions are hash-consed, so equal canonical
 * forms share one id. Everything is plain arrays indexed by int32, so copying a pool is a memcpy
 * per array. */
#ifndef GRAPHTRAIN_SYM_INTERNAL_H
#define GRAPHTRAIN_SYM_INTERNAL_H

#include "graphtrain/gt_sym.h"

enum { GT_SYM_ATOM_VAR = 0, GT_SYM_ATOM_FLOORDIV = 1, GT_SYM_ATOM_MOD = 2 };

typedef struct {
    int32_t kind;  /* GT_SYM_ATOM_* */
    int32_t name;  /* VAR: offset of the NUL-terminated name in pool->names; else -1 */
    gt_expr a, b;  /* FLOORDIV/MOD: a // b or a % b; VAR: GT_EXPR_INVALID */
    uint64_t hash; /* of (kind, name) or (kind, a, b) */
} gt_sym_atom;

typedef struct {
    int64_t coef;
    int32_t fac_off, n_fac; /* pool->factors[fac_off .. fac_off + n_fac) */
} gt_sym_term;

typedef struct {
    int32_t term_off, n_terms; /* pool->terms[term_off .. term_off + n_terms) */
    uint64_t hash;
} gt_sym_node;

struct gt_sym_pool {
    gt_sym_atom *atoms;
    int32_t n_atoms, cap_atoms;
    char *names;
    int32_t names_len, names_cap;
    gt_sym_node *exprs;
    int32_t n_exprs, cap_exprs;
    gt_sym_term *terms;
    int32_t n_terms, cap_terms;
    int32_t *factors;
    int32_t n_factors, cap_factors;
    /* Open-addressing hash indexes (power-of-two capacity, -1 = empty), load factor <= 1/2. */
    int32_t *expr_index;
    int32_t expr_index_cap;
    int32_t *atom_index;
    int32_t atom_index_cap;
};

static inline bool gt_sym_valid(const gt_sym_pool *p, gt_expr e)
{
    return e >= 0 && e < p->n_exprs;
}

static inline const char *gt_sym_atom_name(const gt_sym_pool *p, int32_t atom)
{
    return p->names + p->atoms[atom].name;
}

/* Total orders on atoms, monomials and expressions, by content (not by id), so the canonical term
 * order — and the formatted text — does not depend on the order the pool saw things in. */
int gt_sym_atom_cmp(const gt_sym_pool *p, int32_t x, int32_t y);
int gt_sym_expr_cmp(const gt_sym_pool *p, gt_expr e, gt_expr f);

/* Expression consisting of the one atom `atom` with coefficient 1. */
gt_expr gt_sym_atom_expr(gt_sym_pool *p, int32_t atom);

/* Python floor division / modulo on int64; false on b == 0 or overflow (INT64_MIN // -1). */
bool gt_sym_py_floordiv(int64_t a, int64_t b, int64_t *out);
bool gt_sym_py_mod(int64_t a, int64_t b, int64_t *out);

/* Valid symbol name: [A-Za-z_][A-Za-z0-9_.]* */
bool gt_sym_name_valid(const char *name, size_t len);

#endif
