/* sym_text.c — gt_sym_format and gt_sym_parse: the stable text form of an expression.
 *
 * Grammar (Python's precedence: unary minus binds tighter than * // %, which bind tighter than
 * + -, all left-associative):
 *     expr    := term (('+' | '-') term)*
 *     term    := unary (('*' | '//' | '%') unary)*
 *     unary   := '-' unary | '+' unary | primary       ('-' directly before digits: a negative
 *                                                      literal, so -9223372036854775808 parses)
 *     primary := INTEGER | NAME | '(' expr ')'
 * The formatter writes terms in canonical order, "c*a*b" for monomials (coefficient omitted when
 * it is 1), " - " for negative coefficients, and parentheses exactly where the grammar needs them,
 * so gt_sym_parse(gt_sym_format(e)) rebuilds e. */
#include "sym_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/* ---------------------------------------------------------------- format */

typedef struct {
    char *buf;
    size_t cap;
    size_t len; /* length needed so far (may exceed cap) */
} gt_sym_writer;

static void gt_sym_put(gt_sym_writer *w, const char *s)
{
    size_t n = strlen(s);
    if (w->buf && w->len + 1 < w->cap) {
        size_t room = w->cap - 1 - w->len;
        memcpy(w->buf + w->len, s, n < room ? n : room);
    }
    w->len += n;
}

static void gt_sym_put_u64(gt_sym_writer *w, uint64_t v)
{
    char tmp[24];
    snprintf(tmp, sizeof tmp, "%" PRIu64, v);
    gt_sym_put(w, tmp);
}

static void gt_sym_format_expr(const gt_sym_pool *p, gt_expr e, gt_sym_writer *w);

/* True when e prints as a single symbol name or a non-negative integer (no parentheses needed on
 * the right of // or %). */
static bool gt_sym_is_simple(const gt_sym_pool *p, gt_expr e)
{
    int64_t c;
    if (gt_sym_is_const(p, e, &c)) return c >= 0;
    const gt_sym_node *n = &p->exprs[e];
    if (n->n_terms != 1) return false;
    const gt_sym_term *t = &p->terms[n->term_off];
    return t->coef == 1 && t->n_fac == 1 &&
           p->atoms[p->factors[t->fac_off]].kind == GT_SYM_ATOM_VAR;
}

static void gt_sym_format_atom(const gt_sym_pool *p, int32_t atom, bool parens, gt_sym_writer *w)
{
    const gt_sym_atom *at = &p->atoms[atom];
    if (at->kind == GT_SYM_ATOM_VAR) {
        gt_sym_put(w, gt_sym_atom_name(p, atom));
        return;
    }
    gt_expr a = at->a, b = at->b;
    const gt_sym_node *na = &p->exprs[a];
    /* Left operand: parenthesised when it is a sum, or starts with a minus sign. */
    bool pa = na->n_terms > 1 || (na->n_terms == 1 && p->terms[na->term_off].coef < 0);
    bool pb = !gt_sym_is_simple(p, b);
    if (parens) gt_sym_put(w, "(");
    if (pa) gt_sym_put(w, "(");
    gt_sym_format_expr(p, a, w);
    if (pa) gt_sym_put(w, ")");
    gt_sym_put(w, at->kind == GT_SYM_ATOM_MOD ? " % " : " // ");
    if (pb) gt_sym_put(w, "(");
    gt_sym_format_expr(p, b, w);
    if (pb) gt_sym_put(w, ")");
    if (parens) gt_sym_put(w, ")");
}

static void gt_sym_format_expr(const gt_sym_pool *p, gt_expr e, gt_sym_writer *w)
{
    const gt_sym_node *n = &p->exprs[e];
    if (n->n_terms == 0) {
        gt_sym_put(w, "0");
        return;
    }
    for (int32_t i = 0; i < n->n_terms; i++) {
        const gt_sym_term *t = &p->terms[n->term_off + i];
        const int64_t c = t->coef;
        bool coef_written;
        bool unary_minus; /* a leading '-' binds to the first factor only (Python precedence) */
        if (c == INT64_MIN) {
            /* |c| = 2^63 has no positive int64 literal: write a negative literal, added. */
            if (i > 0) gt_sym_put(w, " + ");
            gt_sym_put(w, "-9223372036854775808");
            coef_written = unary_minus = true;
        } else {
            uint64_t mag = c < 0 ? (uint64_t)0 - (uint64_t)c : (uint64_t)c;
            if (i > 0) {
                gt_sym_put(w, c < 0 ? " - " : " + "); /* binary: applies to the whole term */
                unary_minus = false;
            } else {
                if (c < 0) gt_sym_put(w, "-");
                unary_minus = c < 0;
            }
            coef_written = mag != 1 || t->n_fac == 0;
            if (coef_written) gt_sym_put_u64(w, mag);
        }
        for (int32_t k = 0; k < t->n_fac; k++) {
            if (k > 0 || coef_written) gt_sym_put(w, "*");
            /* A floordiv/mod factor needs parentheses unless it is the whole term and nothing
             * binds to it: "x // 4", "y - x // 4", but "2*(x // 4)", "(x // 4)*y", "-(x // 4)". */
            bool alone = t->n_fac == 1 && !coef_written && !unary_minus;
            gt_sym_format_atom(p, p->factors[t->fac_off + k], !alone, w);
        }
    }
}

int gt_sym_format(const gt_sym_pool *p, gt_expr e, char *buf, size_t n)
{
    gt_sym_writer w = {buf, n, 0};
    if (!p || !gt_sym_valid(p, e))
        gt_sym_put(&w, "<invalid>");
    else
        gt_sym_format_expr(p, e, &w);
    if (buf && n) buf[w.len < n ? w.len : n - 1] = '\0';
    return (int)w.len;
}

/* ---------------------------------------------------------------- parse */

#define GT_SYM_PARSE_MAX_DEPTH 256

typedef struct {
    gt_sym_pool *p;
    const char *text;
    size_t pos;
    int depth;
    gt_error *err;
} gt_sym_parser;

static void gt_sym_skip_space(gt_sym_parser *ps)
{
    while (ps->text[ps->pos] == ' ' || ps->text[ps->pos] == '\t' || ps->text[ps->pos] == '\n' ||
           ps->text[ps->pos] == '\r')
        ps->pos++;
}

static gt_status gt_sym_parse_fail(gt_sym_parser *ps, size_t pos, const char *what)
{
    return gt_error_set(ps->err, GT_ERR_INVALID,
                        "symbolic expression \"%.200s\": %s at position %zu", ps->text, what, pos);
}

/* Reports a constructor that returned GT_EXPR_INVALID (its operands were valid). */
static gt_status gt_sym_check_built(gt_sym_parser *ps, gt_expr r, size_t pos, const char *op,
                                    gt_expr rhs)
{
    if (r != GT_EXPR_INVALID) return GT_OK;
    int64_t c;
    if (op && rhs != GT_EXPR_INVALID && gt_sym_is_const(ps->p, rhs, &c) && c == 0)
        return gt_sym_parse_fail(ps, pos, "division by zero");
    return gt_sym_parse_fail(ps, pos, "integer overflow");
}

static gt_status gt_sym_parse_expr(gt_sym_parser *ps, gt_expr *out);

/* Digits at ps->pos as a magnitude <= limit. */
static gt_status gt_sym_parse_digits(gt_sym_parser *ps, uint64_t limit, uint64_t *out)
{
    size_t start = ps->pos;
    uint64_t v = 0;
    while (ps->text[ps->pos] >= '0' && ps->text[ps->pos] <= '9') {
        uint64_t d = (uint64_t)(ps->text[ps->pos] - '0');
        if (v > (limit - d) / 10)
            return gt_sym_parse_fail(ps, start, "integer literal out of range");
        v = v * 10 + d;
        ps->pos++;
    }
    *out = v;
    return GT_OK;
}

static gt_status gt_sym_parse_primary(gt_sym_parser *ps, gt_expr *out)
{
    gt_sym_skip_space(ps);
    size_t start = ps->pos;
    char c = ps->text[ps->pos];
    if (c >= '0' && c <= '9') {
        uint64_t v = 0;
        GT_TRY(gt_sym_parse_digits(ps, (uint64_t)INT64_MAX, &v));
        *out = gt_sym_const(ps->p, (int64_t)v);
        return GT_OK;
    }
    if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_') {
        size_t end = ps->pos + 1;
        for (;;) {
            char d = ps->text[end];
            if (!((d >= 'A' && d <= 'Z') || (d >= 'a' && d <= 'z') || (d >= '0' && d <= '9') ||
                  d == '_' || d == '.'))
                break;
            end++;
        }
        size_t len = end - start;
        if (len > 255) return gt_sym_parse_fail(ps, start, "symbol name longer than 255");
        char name[256];
        memcpy(name, ps->text + start, len);
        name[len] = '\0';
        ps->pos = end;
        *out = gt_sym_var(ps->p, name);
        return GT_OK;
    }
    if (c == '(') {
        ps->pos++;
        GT_TRY(gt_sym_parse_expr(ps, out));
        gt_sym_skip_space(ps);
        if (ps->text[ps->pos] != ')') return gt_sym_parse_fail(ps, ps->pos, "expected ')'");
        ps->pos++;
        return GT_OK;
    }
    if (c == '\0') return gt_sym_parse_fail(ps, start, "unexpected end of input");
    return gt_sym_parse_fail(ps, start, "expected an integer, a name or '('");
}

static gt_status gt_sym_parse_unary(gt_sym_parser *ps, gt_expr *out)
{
    gt_sym_skip_space(ps);
    size_t start = ps->pos;
    char c = ps->text[ps->pos];
    if (c != '-' && c != '+') return gt_sym_parse_primary(ps, out);
    ps->pos++;
    if (c == '-' && ps->text[ps->pos] >= '0' && ps->text[ps->pos] <= '9') {
        uint64_t v = 0; /* negative literal: magnitude up to 2^63 */
        GT_TRY(gt_sym_parse_digits(ps, (uint64_t)INT64_MAX + 1u, &v));
        *out = gt_sym_const(ps->p, (int64_t)((uint64_t)0 - v));
        return GT_OK;
    }
    if (++ps->depth > GT_SYM_PARSE_MAX_DEPTH)
        return gt_sym_parse_fail(ps, start, "nesting too deep");
    gt_expr x;
    GT_TRY(gt_sym_parse_unary(ps, &x));
    ps->depth--;
    *out = c == '-' ? gt_sym_mul(ps->p, gt_sym_const(ps->p, -1), x) : x;
    return gt_sym_check_built(ps, *out, start, NULL, GT_EXPR_INVALID);
}

static gt_status gt_sym_parse_term(gt_sym_parser *ps, gt_expr *out)
{
    gt_expr acc;
    GT_TRY(gt_sym_parse_unary(ps, &acc));
    for (;;) {
        gt_sym_skip_space(ps);
        size_t at = ps->pos;
        const char *s = ps->text + ps->pos;
        int op; /* 0 '*', 1 '//', 2 '%' */
        if (s[0] == '*')
            op = 0, ps->pos += 1;
        else if (s[0] == '/' && s[1] == '/')
            op = 1, ps->pos += 2;
        else if (s[0] == '%')
            op = 2, ps->pos += 1;
        else if (s[0] == '/')
            return gt_sym_parse_fail(ps, at, "'/' is not supported, use '//'");
        else
            break;
        gt_expr rhs;
        GT_TRY(gt_sym_parse_unary(ps, &rhs));
        acc = op == 0   ? gt_sym_mul(ps->p, acc, rhs)
              : op == 1 ? gt_sym_floordiv(ps->p, acc, rhs)
                        : gt_sym_mod(ps->p, acc, rhs);
        GT_TRY(gt_sym_check_built(ps, acc, at, op ? "div" : NULL, rhs));
    }
    *out = acc;
    return GT_OK;
}

static gt_status gt_sym_parse_expr(gt_sym_parser *ps, gt_expr *out)
{
    if (++ps->depth > GT_SYM_PARSE_MAX_DEPTH)
        return gt_sym_parse_fail(ps, ps->pos, "nesting too deep");
    gt_expr acc;
    GT_TRY(gt_sym_parse_term(ps, &acc));
    for (;;) {
        gt_sym_skip_space(ps);
        size_t at = ps->pos;
        char c = ps->text[ps->pos];
        if (c != '+' && c != '-') break;
        ps->pos++;
        gt_expr rhs;
        GT_TRY(gt_sym_parse_term(ps, &rhs));
        acc = c == '+' ? gt_sym_add(ps->p, acc, rhs) : gt_sym_sub(ps->p, acc, rhs);
        GT_TRY(gt_sym_check_built(ps, acc, at, NULL, GT_EXPR_INVALID));
    }
    ps->depth--;
    *out = acc;
    return GT_OK;
}

gt_status gt_sym_parse(gt_sym_pool *p, const char *text, gt_expr *out, gt_error *err)
{
    if (!text) return gt_error_set(err, GT_ERR_INVALID, "symbolic expression: NULL text");
    gt_sym_parser ps = {p, text, 0, 0, err};
    gt_expr e;
    GT_TRY(gt_sym_parse_expr(&ps, &e));
    gt_sym_skip_space(&ps);
    if (text[ps.pos] != '\0') return gt_sym_parse_fail(&ps, ps.pos, "unexpected character");
    if (out) *out = e;
    return GT_OK;
}
