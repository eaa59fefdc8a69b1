/* sym.c — symbolic dimension expressions: the pool, canonical form, interning and arithmetic.
 *
 * Canonical form (see sym_internal.h): a sorted sum of monomials coef * a1 * a2 * … with atoms
 * sorted inside each monomial. Monomials are ordered graded-lexicographically: higher degree
 * first, then by their sorted atom lists (the constant term comes last), which is a monomial
 * order, so "2*s + 1", "a*a + 2*a*b + b*b". Every constructor builds a temporary polynomial,
 * sorts and combines it, and interns it through a hash table: O(size) per construction, O(1)
 * amortised lookup. All coefficient arithmetic is overflow-checked; an overflow gives
 * GT_EXPR_INVALID, never undefined behaviour. */
#include "sym_internal.h"

#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- small helpers */

static uint64_t gt_sym_mix(uint64_t h, uint64_t v)
{
    /* A strong-enough 64-bit combiner (multiply-xorshift); only used for table lookups. */
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h *= 0xbf58476d1ce4e5b9ull;
    return h ^ (h >> 31);
}

/* Grows *ptr (element size esize) so that it holds at least `need` elements. */
static void gt_sym_reserve(void **ptr, int32_t *cap, int64_t need, size_t esize)
{
    if (need <= *cap) return;
    GT_CHECK(need < INT32_MAX / 2); /* pool indexes are int32 */
    int64_t c = *cap ? *cap : 16;
    while (c < need)
        c *= 2;
    *ptr = gt_xrealloc(*ptr, (size_t)c * esize);
    *cap = (int32_t)c;
}

bool gt_sym_py_floordiv(int64_t a, int64_t b, int64_t *out)
{
    if (b == 0 || (a == INT64_MIN && b == -1)) return false;
    int64_t q = a / b, r = a % b;
    if (r != 0 && ((r < 0) != (b < 0))) q -= 1; /* C truncates toward zero; Python floors */
    *out = q;
    return true;
}

bool gt_sym_py_mod(int64_t a, int64_t b, int64_t *out)
{
    if (b == 0) return false;
    if (b == -1) { /* INT64_MIN % -1 is UB in C; the answer is 0 */
        *out = 0;
        return true;
    }
    int64_t r = a % b;
    if (r != 0 && ((r < 0) != (b < 0))) r += b; /* result takes the divisor's sign */
    *out = r;
    return true;
}

bool gt_sym_name_valid(const char *name, size_t len)
{
    if (!name || len == 0) return false;
    char c = name[0];
    if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_')) return false;
    for (size_t i = 1; i < len; i++) {
        c = name[i];
        if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '.'))
            return false;
    }
    return true;
}

/* ---------------------------------------------------------------- pool */

gt_sym_pool *gt_sym_pool_new(void)
{
    gt_sym_pool *p = gt_xcalloc(1, sizeof *p);
    return p;
}

#define GT_SYM_DUP(field, count)                                                                   \
    do {                                                                                           \
        if (src->field) {                                                                          \
            p->field = gt_xmalloc((size_t)(count) * sizeof *src->field);                           \
            memcpy(p->field, src->field, (size_t)(count) * sizeof *src->field);                    \
        }                                                                                          \
    } while (0)

gt_sym_pool *gt_sym_pool_copy(const gt_sym_pool *src)
{
    gt_sym_pool *p = gt_xmalloc(sizeof *p);
    *p = *src;
    p->atoms = NULL, p->names = NULL, p->exprs = NULL, p->terms = NULL, p->factors = NULL;
    p->expr_index = NULL, p->atom_index = NULL;
    GT_SYM_DUP(atoms, src->cap_atoms);
    GT_SYM_DUP(names, src->names_cap);
    GT_SYM_DUP(exprs, src->cap_exprs);
    GT_SYM_DUP(terms, src->cap_terms);
    GT_SYM_DUP(factors, src->cap_factors);
    GT_SYM_DUP(expr_index, src->expr_index_cap);
    GT_SYM_DUP(atom_index, src->atom_index_cap);
    return p;
}
#undef GT_SYM_DUP

void gt_sym_pool_free(gt_sym_pool *p)
{
    if (!p) return;
    free(p->atoms);
    free(p->names);
    free(p->exprs);
    free(p->terms);
    free(p->factors);
    free(p->expr_index);
    free(p->atom_index);
    free(p);
}

/* ---------------------------------------------------------------- orders */

/* Monomial order: higher degree first; equal degree: lexicographic on the sorted atom lists. */
static int gt_sym_mono_cmp(const gt_sym_pool *p, const int32_t *fa, int32_t na, const int32_t *fb,
                           int32_t nb)
{
    if (na != nb) return na > nb ? -1 : 1;
    for (int32_t i = 0; i < na; i++) {
        int c = gt_sym_atom_cmp(p, fa[i], fb[i]);
        if (c) return c;
    }
    return 0;
}

/* Symbols first (by name), then floordivs, then mods (by numerator, then denominator). Equal ids
 * mean equal content (interning), so the recursion only walks until the first difference. */
int gt_sym_atom_cmp(const gt_sym_pool *p, int32_t x, int32_t y)
{
    if (x == y) return 0;
    const gt_sym_atom *ax = &p->atoms[x], *ay = &p->atoms[y];
    if (ax->kind != ay->kind) return ax->kind < ay->kind ? -1 : 1;
    if (ax->kind == GT_SYM_ATOM_VAR) return strcmp(p->names + ax->name, p->names + ay->name);
    int c = gt_sym_expr_cmp(p, ax->a, ay->a);
    return c ? c : gt_sym_expr_cmp(p, ax->b, ay->b);
}

int gt_sym_expr_cmp(const gt_sym_pool *p, gt_expr e, gt_expr f)
{
    if (e == f) return 0;
    const gt_sym_node *ne = &p->exprs[e], *nf = &p->exprs[f];
    int32_t n = ne->n_terms < nf->n_terms ? ne->n_terms : nf->n_terms;
    for (int32_t i = 0; i < n; i++) {
        const gt_sym_term *te = &p->terms[ne->term_off + i], *tf = &p->terms[nf->term_off + i];
        int c = gt_sym_mono_cmp(p, p->factors + te->fac_off, te->n_fac, p->factors + tf->fac_off,
                                tf->n_fac);
        if (c) return c;
        if (te->coef != tf->coef) return te->coef < tf->coef ? -1 : 1;
    }
    if (ne->n_terms != nf->n_terms) return ne->n_terms < nf->n_terms ? -1 : 1;
    return 0; /* unreachable for distinct interned ids */
}

/* ---------------------------------------------------------------- temporary polynomials */

typedef struct {
    int64_t coef;
    int32_t off, nf; /* factors in poly->fac */
} gt_sym_mono;

typedef struct {
    gt_sym_mono *t;
    int32_t n, cap;
    int32_t *fac;
    int32_t nfac, capfac;
    bool overflow;
} gt_sym_poly;

static void gt_sym_poly_free(gt_sym_poly *q)
{
    free(q->t);
    free(q->fac);
}

/* Appends coef * (product of the factors in fa and fb, each sorted), merging the two lists. */
static void gt_sym_poly_push2(const gt_sym_pool *p, gt_sym_poly *q, int64_t coef, const int32_t *fa,
                              int32_t na, const int32_t *fb, int32_t nb)
{
    gt_sym_reserve((void **)&q->t, &q->cap, (int64_t)q->n + 1, sizeof *q->t);
    gt_sym_reserve((void **)&q->fac, &q->capfac, (int64_t)q->nfac + na + nb, sizeof *q->fac);
    int32_t off = q->nfac, i = 0, j = 0;
    while (i < na || j < nb) {
        if (j >= nb || (i < na && gt_sym_atom_cmp(p, fa[i], fb[j]) <= 0))
            q->fac[q->nfac++] = fa[i++];
        else
            q->fac[q->nfac++] = fb[j++];
    }
    q->t[q->n++] = (gt_sym_mono){coef, off, na + nb};
}

/* Appends every term of e, coefficients multiplied by `scale` (overflow recorded). */
static void gt_sym_poly_load(const gt_sym_pool *p, gt_sym_poly *q, gt_expr e, int64_t scale)
{
    const gt_sym_node *n = &p->exprs[e];
    for (int32_t i = 0; i < n->n_terms; i++) {
        const gt_sym_term *t = &p->terms[n->term_off + i];
        int64_t c;
        if (__builtin_mul_overflow(t->coef, scale, &c)) q->overflow = true;
        gt_sym_poly_push2(p, q, c, p->factors + t->fac_off, t->n_fac, NULL, 0);
    }
}

static int gt_sym_poly_mono_cmp(const gt_sym_pool *p, const gt_sym_poly *q, const gt_sym_mono *a,
                                const gt_sym_mono *b)
{
    return gt_sym_mono_cmp(p, q->fac + a->off, a->nf, q->fac + b->off, b->nf);
}

/* Stable merge sort of q->t by monomial order (qsort has no context argument in C11). */
static void gt_sym_poly_sort(const gt_sym_pool *p, gt_sym_poly *q)
{
    if (q->n < 2) return;
    gt_sym_mono *tmp = gt_xmalloc((size_t)q->n * sizeof *tmp);
    for (int32_t width = 1; width < q->n; width *= 2) {
        for (int32_t lo = 0; lo < q->n; lo += 2 * width) {
            int32_t mid = lo + width < q->n ? lo + width : q->n;
            int32_t hi = lo + 2 * width < q->n ? lo + 2 * width : q->n;
            int32_t i = lo, j = mid, k = lo;
            while (i < mid || j < hi) {
                if (j >= hi || (i < mid && gt_sym_poly_mono_cmp(p, q, &q->t[i], &q->t[j]) <= 0))
                    tmp[k++] = q->t[i++];
                else
                    tmp[k++] = q->t[j++];
            }
        }
        memcpy(q->t, tmp, (size_t)q->n * sizeof *tmp);
    }
    free(tmp);
}

/* Sorts, combines equal monomials (checked addition) and drops zero coefficients. */
static void gt_sym_poly_canon(const gt_sym_pool *p, gt_sym_poly *q)
{
    gt_sym_poly_sort(p, q);
    int32_t out = 0;
    for (int32_t i = 0; i < q->n;) {
        gt_sym_mono m = q->t[i];
        int32_t j = i + 1;
        while (j < q->n && gt_sym_poly_mono_cmp(p, q, &q->t[i], &q->t[j]) == 0) {
            if (__builtin_add_overflow(m.coef, q->t[j].coef, &m.coef)) q->overflow = true;
            j++;
        }
        if (m.coef != 0) q->t[out++] = m;
        i = j;
    }
    q->n = out;
}

/* ---------------------------------------------------------------- interning */

static uint64_t gt_sym_poly_hash(const gt_sym_poly *q)
{
    uint64_t h = gt_sym_mix(0x5ca1ab1eull, (uint64_t)q->n);
    for (int32_t i = 0; i < q->n; i++) {
        h = gt_sym_mix(h, (uint64_t)q->t[i].coef);
        h = gt_sym_mix(h, (uint64_t)q->t[i].nf);
        for (int32_t k = 0; k < q->t[i].nf; k++)
            h = gt_sym_mix(h, (uint64_t)q->fac[q->t[i].off + k]);
    }
    return h;
}

static bool gt_sym_expr_equals_poly(const gt_sym_pool *p, gt_expr e, const gt_sym_poly *q)
{
    const gt_sym_node *n = &p->exprs[e];
    if (n->n_terms != q->n) return false;
    for (int32_t i = 0; i < q->n; i++) {
        const gt_sym_term *t = &p->terms[n->term_off + i];
        const gt_sym_mono *m = &q->t[i];
        if (t->coef != m->coef || t->n_fac != m->nf) return false;
        if (m->nf &&
            memcmp(p->factors + t->fac_off, q->fac + m->off, (size_t)m->nf * sizeof(int32_t)) != 0)
            return false;
    }
    return true;
}

/* Rebuilds an index of capacity cap from the hashes stored alongside the entries. */
static void gt_sym_index_rebuild(int32_t **index, int32_t *cap, int32_t new_cap, int32_t n,
                                 const void *entries, size_t esize, size_t hash_offset)
{
    free(*index);
    *index = gt_xmalloc((size_t)new_cap * sizeof(int32_t));
    memset(*index, 0xff, (size_t)new_cap * sizeof(int32_t)); /* -1 */
    *cap = new_cap;
    uint64_t mask = (uint64_t)new_cap - 1;
    for (int32_t i = 0; i < n; i++) {
        uint64_t h;
        memcpy(&h, (const char *)entries + (size_t)i * esize + hash_offset, sizeof h);
        uint64_t s = h & mask;
        while ((*index)[s] >= 0)
            s = (s + 1) & mask;
        (*index)[s] = i;
    }
}

/* Files entry id (hash h, the last of the n entries) in the index; past half full the index
 * doubles and is rebuilt from all n entries instead. */
static void gt_sym_index_add(int32_t **index, int32_t *cap, int32_t n, const void *entries,
                             size_t esize, size_t hash_offset, uint64_t h, int32_t id)
{
    if ((int64_t)n * 2 > *cap) {
        gt_sym_index_rebuild(index, cap, *cap ? *cap * 2 : 64, n, entries, esize, hash_offset);
        return;
    }
    uint64_t mask = (uint64_t)*cap - 1, s = h & mask;
    while ((*index)[s] >= 0)
        s = (s + 1) & mask;
    (*index)[s] = id;
}

static gt_expr gt_sym_intern_poly(gt_sym_pool *p, gt_sym_poly *q)
{
    if (q->overflow) return GT_EXPR_INVALID;
    uint64_t h = gt_sym_poly_hash(q);
    if (p->expr_index_cap) {
        uint64_t mask = (uint64_t)p->expr_index_cap - 1;
        for (uint64_t s = h & mask; p->expr_index[s] >= 0; s = (s + 1) & mask) {
            gt_expr e = p->expr_index[s];
            if (p->exprs[e].hash == h && gt_sym_expr_equals_poly(p, e, q)) return e;
        }
    }
    /* New expression: append its terms and factors. */
    gt_sym_reserve((void **)&p->exprs, &p->cap_exprs, (int64_t)p->n_exprs + 1, sizeof *p->exprs);
    gt_sym_reserve((void **)&p->terms, &p->cap_terms, (int64_t)p->n_terms + q->n, sizeof *p->terms);
    gt_sym_reserve((void **)&p->factors, &p->cap_factors, (int64_t)p->n_factors + q->nfac,
                   sizeof *p->factors);
    gt_expr e = p->n_exprs++;
    p->exprs[e] = (gt_sym_node){p->n_terms, q->n, h};
    for (int32_t i = 0; i < q->n; i++) {
        const gt_sym_mono *m = &q->t[i];
        p->terms[p->n_terms++] = (gt_sym_term){m->coef, p->n_factors, m->nf};
        for (int32_t k = 0; k < m->nf; k++)
            p->factors[p->n_factors++] = q->fac[m->off + k];
    }
    gt_sym_index_add(&p->expr_index, &p->expr_index_cap, p->n_exprs, p->exprs, sizeof *p->exprs,
                     offsetof(gt_sym_node, hash), h, e);
    return e;
}

static uint64_t gt_sym_atom_hash(int32_t kind, const char *name, size_t len, gt_expr a, gt_expr b)
{
    uint64_t h = gt_sym_mix(0xa70a70ull, (uint64_t)kind);
    if (kind == GT_SYM_ATOM_VAR) return gt_sym_mix(h, gt_hash64(name, len, 0));
    return gt_sym_mix(gt_sym_mix(h, (uint64_t)(uint32_t)a), (uint64_t)(uint32_t)b);
}

/* Finds or adds the atom; name (len bytes, not necessarily NUL-terminated) for VAR. */
static int32_t gt_sym_intern_atom(gt_sym_pool *p, int32_t kind, const char *name, size_t len,
                                  gt_expr a, gt_expr b)
{
    uint64_t h = gt_sym_atom_hash(kind, name, len, a, b);
    if (p->atom_index_cap) {
        uint64_t mask = (uint64_t)p->atom_index_cap - 1;
        for (uint64_t s = h & mask; p->atom_index[s] >= 0; s = (s + 1) & mask) {
            const gt_sym_atom *at = &p->atoms[p->atom_index[s]];
            if (at->hash != h || at->kind != kind) continue;
            if (kind == GT_SYM_ATOM_VAR) {
                const char *an = p->names + at->name;
                if (strncmp(an, name, len) == 0 && an[len] == '\0') return p->atom_index[s];
            } else if (at->a == a && at->b == b) {
                return p->atom_index[s];
            }
        }
    }
    gt_sym_reserve((void **)&p->atoms, &p->cap_atoms, (int64_t)p->n_atoms + 1, sizeof *p->atoms);
    int32_t id = p->n_atoms++;
    gt_sym_atom at = {kind, -1, GT_EXPR_INVALID, GT_EXPR_INVALID, h};
    if (kind == GT_SYM_ATOM_VAR) {
        gt_sym_reserve((void **)&p->names, &p->names_cap, (int64_t)p->names_len + (int64_t)len + 1,
                       1);
        at.name = p->names_len;
        memcpy(p->names + p->names_len, name, len);
        p->names[p->names_len + (int32_t)len] = '\0';
        p->names_len += (int32_t)len + 1;
    } else {
        at.a = a;
        at.b = b;
    }
    p->atoms[id] = at;
    gt_sym_index_add(&p->atom_index, &p->atom_index_cap, p->n_atoms, p->atoms, sizeof *p->atoms,
                     offsetof(gt_sym_atom, hash), h, id);
    return id;
}

gt_expr gt_sym_atom_expr(gt_sym_pool *p, int32_t atom)
{
    gt_sym_poly q = {0};
    gt_sym_poly_push2(p, &q, 1, &atom, 1, NULL, 0);
    gt_expr e = gt_sym_intern_poly(p, &q);
    gt_sym_poly_free(&q);
    return e;
}

/* ---------------------------------------------------------------- constructors */

gt_expr gt_sym_const(gt_sym_pool *p, int64_t c)
{
    gt_sym_poly q = {0};
    if (c != 0) gt_sym_poly_push2(p, &q, c, NULL, 0, NULL, 0); /* 0 is the empty sum */
    gt_expr e = gt_sym_intern_poly(p, &q);
    gt_sym_poly_free(&q);
    return e;
}

gt_expr gt_sym_var(gt_sym_pool *p, const char *name)
{
    if (!name) return GT_EXPR_INVALID;
    size_t len = strlen(name);
    if (!gt_sym_name_valid(name, len) || len > (1u << 20)) return GT_EXPR_INVALID;
    return gt_sym_atom_expr(p, gt_sym_intern_atom(p, GT_SYM_ATOM_VAR, name, len, -1, -1));
}

bool gt_sym_is_const(const gt_sym_pool *p, gt_expr e, int64_t *value)
{
    if (!gt_sym_valid(p, e)) return false;
    const gt_sym_node *n = &p->exprs[e];
    if (n->n_terms == 0) {
        if (value) *value = 0;
        return true;
    }
    if (n->n_terms == 1 && p->terms[n->term_off].n_fac == 0) {
        if (value) *value = p->terms[n->term_off].coef;
        return true;
    }
    return false;
}

/* a + scale * b */
static gt_expr gt_sym_add_scaled(gt_sym_pool *p, gt_expr a, gt_expr b, int64_t scale)
{
    if (!gt_sym_valid(p, a) || !gt_sym_valid(p, b)) return GT_EXPR_INVALID;
    gt_sym_poly q = {0};
    gt_sym_poly_load(p, &q, a, 1);
    gt_sym_poly_load(p, &q, b, scale);
    gt_sym_poly_canon(p, &q);
    gt_expr e = gt_sym_intern_poly(p, &q);
    gt_sym_poly_free(&q);
    return e;
}

gt_expr gt_sym_add(gt_sym_pool *p, gt_expr a, gt_expr b)
{
    return gt_sym_add_scaled(p, a, b, 1);
}
gt_expr gt_sym_sub(gt_sym_pool *p, gt_expr a, gt_expr b)
{
    return gt_sym_add_scaled(p, a, b, -1);
}

gt_expr gt_sym_mul(gt_sym_pool *p, gt_expr a, gt_expr b)
{
    if (!gt_sym_valid(p, a) || !gt_sym_valid(p, b)) return GT_EXPR_INVALID;
    gt_sym_poly q = {0};
    const gt_sym_node na = p->exprs[a], nb = p->exprs[b];
    for (int32_t i = 0; i < na.n_terms; i++) {
        const gt_sym_term ta = p->terms[na.term_off + i];
        for (int32_t j = 0; j < nb.n_terms; j++) {
            const gt_sym_term tb = p->terms[nb.term_off + j];
            int64_t c;
            if (__builtin_mul_overflow(ta.coef, tb.coef, &c)) q.overflow = true;
            gt_sym_poly_push2(p, &q, c, p->factors + ta.fac_off, ta.n_fac, p->factors + tb.fac_off,
                              tb.n_fac);
        }
    }
    gt_sym_poly_canon(p, &q);
    gt_expr e = gt_sym_intern_poly(p, &q);
    gt_sym_poly_free(&q);
    return e;
}

/* gcd of magnitudes; works for INT64_MIN (magnitude 2^63) too. */
static int64_t gt_sym_gcd(int64_t a, int64_t b)
{
    uint64_t x = a < 0 ? (uint64_t)0 - (uint64_t)a : (uint64_t)a;
    uint64_t y = b < 0 ? (uint64_t)0 - (uint64_t)b : (uint64_t)b;
    while (y) {
        uint64_t t = x % y;
        x = y;
        y = t;
    }
    return (int64_t)x; /* callers always include some 0 < k < 2^63, so x < 2^63 */
}

/* True when e is exactly the atom (y % k) with coefficient 1 and k the constant `k`. */
static bool gt_sym_is_mod_by(const gt_sym_pool *p, gt_expr e, int64_t k)
{
    const gt_sym_node *n = &p->exprs[e];
    if (n->n_terms != 1) return false;
    const gt_sym_term *t = &p->terms[n->term_off];
    if (t->coef != 1 || t->n_fac != 1) return false;
    const gt_sym_atom *at = &p->atoms[p->factors[t->fac_off]];
    int64_t kb;
    return at->kind == GT_SYM_ATOM_MOD && gt_sym_is_const(p, at->b, &kb) && kb == k;
}

/* a // b (want_mod false) or a % b (true), Python floor semantics. With a constant divisor k:
 *   - both constant: fold; k < 0: a // k = (-a) // (-k), a % k = -((-a) % (-k));
 *   - a = k*q + r where q collects the terms whose coefficient k divides (exactly, for any
 *     integer-valued q): a // k = q + r // k and a % k = r % k; r constant folds;
 *   - g = gcd(coefficients of r, k) > 1: r // k = (r/g) // (k/g), r % k = g * ((r/g) % (k/g));
 *   - (y % k) % k = y % k and (y % k) // k = 0 (0 <= y % k < k for k > 0).
 * Anything else (including every symbolic divisor) becomes an opaque atom. */
static gt_expr gt_sym_divmod(gt_sym_pool *p, gt_expr a, gt_expr b, bool want_mod)
{
    if (!gt_sym_valid(p, a) || !gt_sym_valid(p, b)) return GT_EXPR_INVALID;
    const int32_t kind = want_mod ? GT_SYM_ATOM_MOD : GT_SYM_ATOM_FLOORDIV;
    int64_t k, ca;
    if (!gt_sym_is_const(p, b, &k) || k == INT64_MIN)
        return gt_sym_atom_expr(p, gt_sym_intern_atom(p, kind, NULL, 0, a, b));
    if (k == 0) return GT_EXPR_INVALID;
    if (gt_sym_is_const(p, a, &ca)) {
        int64_t r;
        bool ok = want_mod ? gt_sym_py_mod(ca, k, &r) : gt_sym_py_floordiv(ca, k, &r);
        return ok ? gt_sym_const(p, r) : GT_EXPR_INVALID;
    }
    if (k < 0) {
        gt_expr na = gt_sym_mul(p, a, gt_sym_const(p, -1));
        gt_expr r = gt_sym_divmod(p, na, gt_sym_const(p, -k), want_mod);
        return want_mod ? gt_sym_mul(p, r, gt_sym_const(p, -1)) : r;
    }
    if (k == 1) return want_mod ? gt_sym_const(p, 0) : a;

    /* Split a into k*q + r. Subsets of a canonical sum stay sorted; scaling keeps them non-zero. */
    gt_sym_poly q = {0}, r = {0};
    const gt_sym_node na = p->exprs[a];
    int64_t g = k;
    for (int32_t i = 0; i < na.n_terms; i++) {
        const gt_sym_term t = p->terms[na.term_off + i];
        if (t.coef % k == 0) {
            gt_sym_poly_push2(p, &q, t.coef / k, p->factors + t.fac_off, t.n_fac, NULL, 0);
        } else {
            gt_sym_poly_push2(p, &r, t.coef, p->factors + t.fac_off, t.n_fac, NULL, 0);
            g = gt_sym_gcd(g, t.coef);
        }
    }
    gt_expr result;
    gt_expr qe = gt_sym_intern_poly(p, &q);
    if (r.n == 0) {
        result = want_mod ? gt_sym_const(p, 0) : qe;
    } else if (r.n == 1 && r.t[0].nf == 0) {
        int64_t v;
        bool ok =
            want_mod ? gt_sym_py_mod(r.t[0].coef, k, &v) : gt_sym_py_floordiv(r.t[0].coef, k, &v);
        gt_expr ve = ok ? gt_sym_const(p, v) : GT_EXPR_INVALID;
        result = want_mod ? ve : gt_sym_add(p, qe, ve);
    } else if (g > 1) {
        for (int32_t i = 0; i < r.n; i++)
            r.t[i].coef /= g;
        gt_expr rg = gt_sym_intern_poly(p, &r);
        gt_expr inner = gt_sym_divmod(p, rg, gt_sym_const(p, k / g), want_mod);
        result = want_mod ? gt_sym_mul(p, gt_sym_const(p, g), inner) : gt_sym_add(p, qe, inner);
    } else {
        gt_expr re = gt_sym_intern_poly(p, &r);
        if (gt_sym_is_mod_by(p, re, k)) {
            result = want_mod ? re : qe;
        } else {
            gt_expr ke = gt_sym_const(p, k);
            gt_expr atom = gt_sym_atom_expr(p, gt_sym_intern_atom(p, kind, NULL, 0, re, ke));
            result = want_mod ? atom : gt_sym_add(p, qe, atom);
        }
    }
    gt_sym_poly_free(&q);
    gt_sym_poly_free(&r);
    return result;
}

gt_expr gt_sym_floordiv(gt_sym_pool *p, gt_expr a, gt_expr b)
{
    return gt_sym_divmod(p, a, b, false);
}
gt_expr gt_sym_mod(gt_sym_pool *p, gt_expr a, gt_expr b)
{
    return gt_sym_divmod(p, a, b, true);
}
