/* toml.c — TOML v1.0 parser (the subset a training config needs; see toml.h).
 *
 * Why our own: no C TOML library is packaged in Debian (tomlc99 and toml++ are not in the
 * archive), and graphtrain builds from Debian packages only. A config parser is small enough to
 * write and fuzz ourselves.
 *
 * Shape of the parser: a recursive-descent reader over a byte buffer that is never assumed to be
 * NUL-terminated; every read goes through peek(), which returns -1 past the end. Recursion happens
 * only for nested arrays and inline tables and is capped at GT_TOML_MAX_DEPTH.
 *
 * Table rules (TOML 1.0 §Table, as tomli and toml-test read them). Every table records how it was
 * created:
 *   HEADER   defined by a [header] (or the root): a second [header] for it is an error, and dotted
 *            keys from another block may not add to it;
 *   IMPLICIT created as the parent of a [a.b] header: a later [a] may define it once;
 *   DOTTED   created by a dotted key (a.b = 1): extendable by dotted keys of the same block only,
 *            and never redefinable by a [header];
 *   INLINE   an inline table { ... } and everything inside it: sealed once closed.
 * A "block" is the run of key/values after one [header] (or inside one inline table). */
#include "cli/toml.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { KIND_HEADER, KIND_IMPLICIT, KIND_DOTTED, KIND_INLINE };

typedef struct {
    const unsigned char *s;
    size_t n, pos;
    const char *name;
    bool name_has_location; /* document mode: messages carry line:col */
    gt_error *err;
    /* Line and column of loc_pos, advanced lazily and monotonically by loc(). */
    size_t loc_pos;
    int loc_line, loc_col;
    int block, next_block;
    int depth;
} parser;

/* A growable byte buffer for string contents. */
typedef struct {
    char *data;
    size_t len, cap;
} buffer;

static void buf_push(buffer *b, const void *src, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 32;
        while (b->len + n + 1 > cap)
            cap *= 2;
        b->data = gt_xrealloc(b->data, cap);
        b->cap = cap;
    }
    memcpy(b->data + b->len, src, n);
    b->len += n;
    b->data[b->len] = '\0';
}

static void buf_byte(buffer *b, int c)
{
    unsigned char ch = (unsigned char)c;
    buf_push(b, &ch, 1);
}

/* Takes ownership of the bytes (always a valid NUL-terminated string, possibly empty). */
static char *buf_take(buffer *b)
{
    if (!b->data) buf_push(b, "", 0);
    char *d = b->data;
    b->data = NULL;
    b->len = b->cap = 0;
    return d;
}

/* ---------------------------------------------------------------- positions and errors */

static int peek(const parser *p, size_t k)
{
    return p->pos + k < p->n ? p->s[p->pos + k] : -1;
}

static void loc(parser *p, size_t at, int *line, int *col)
{
    if (at > p->n) at = p->n;
    if (at < p->loc_pos) {
        p->loc_pos = 0;
        p->loc_line = 1;
        p->loc_col = 1;
    }
    for (size_t i = p->loc_pos; i < at; i++) {
        if (p->s[i] == '\n') {
            p->loc_line++;
            p->loc_col = 1;
        } else if ((p->s[i] & 0xC0) != 0x80) { /* count characters, not UTF-8 continuation bytes */
            p->loc_col++;
        }
    }
    p->loc_pos = at;
    *line = p->loc_line;
    *col = p->loc_col;
}

static gt_status fail_at(parser *p, size_t at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static gt_status fail_at(parser *p, size_t at, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (!p->name_has_location) return gt_error_set(p->err, GT_ERR_INVALID, "%s: %s", p->name, msg);
    int line, col;
    loc(p, at, &line, &col);
    return gt_error_set(p->err, GT_ERR_INVALID, "%s:%d:%d: %s", p->name, line, col, msg);
}

/* Describes the character at `at` for "found ..." in messages. */
static void describe_char(const parser *p, size_t at, char *buf, size_t cap)
{
    if (at >= p->n) {
        snprintf(buf, cap, "end of file");
        return;
    }
    int c = p->s[at];
    if (c == '\n' || c == '\r')
        snprintf(buf, cap, "end of line");
    else if (c > 0x20 && c < 0x7f)
        snprintf(buf, cap, "'%c'", c);
    else if (c == ' ' || c == '\t')
        snprintf(buf, cap, "whitespace");
    else
        snprintf(buf, cap, "byte 0x%02X", (unsigned)c);
}

size_t gt_utf8_invalid_at(const char *str, size_t len)
{
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < len) {
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        /* Lead byte → number of continuation bytes and the allowed range of the first one
         * (this excludes overlong forms, surrogates U+D800..DFFF and code points > U+10FFFF). */
        size_t need;
        unsigned lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF)
            need = 1;
        else if (c == 0xE0)
            need = 2, lo = 0xA0;
        else if (c == 0xED)
            need = 2, hi = 0x9F;
        else if (c >= 0xE1 && c <= 0xEF)
            need = 2;
        else if (c == 0xF0)
            need = 3, lo = 0x90;
        else if (c >= 0xF1 && c <= 0xF3)
            need = 3;
        else if (c == 0xF4)
            need = 3, hi = 0x8F;
        else
            return i;
        if (need > len - i - 1) return i; /* truncated sequence */
        if (s[i + 1] < lo || s[i + 1] > hi) return i;
        for (size_t k = 2; k <= need; k++)
            if ((s[i + k] & 0xC0) != 0x80) return i;
        i += need + 1;
    }
    return len;
}

/* ---------------------------------------------------------------- tree */

static gt_toml_value *new_value(gt_toml_type type, int line, int col)
{
    gt_toml_value *v = gt_xcalloc(1, sizeof *v);
    v->type = type;
    v->line = line;
    v->col = col;
    return v;
}

void gt_toml_free(gt_toml_value *v)
{
    if (!v) return;
    if (v->type == GT_TOML_STRING) {
        free(v->as.str.data);
    } else if (v->type == GT_TOML_ARRAY) {
        for (int i = 0; i < v->as.array.n; i++)
            gt_toml_free(v->as.array.items[i]);
        free(v->as.array.items);
    } else if (v->type == GT_TOML_TABLE) {
        gt_toml_table *t = &v->as.table;
        for (int i = 0; i < t->n; i++) {
            gt_toml_free(t->entries[i]->value);
            free(t->entries[i]->key);
            free(t->entries[i]);
        }
        free(t->entries);
        free(t->slots);
    }
    free(v);
}

/* FNV-1a: keys are short and the index only needs a fixed, deterministic spread. */
static uint32_t key_hash(const char *k, size_t len)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < len; i++)
        h = (h ^ (unsigned char)k[i]) * 16777619u;
    return h;
}

/* Small tables are scanned; from 16 entries on, an open-addressing index keeps lookups O(1) so
 * that a document with very many keys still parses in linear time. */
static void index_rebuild(gt_toml_table *t)
{
    int n_slots = 32;
    while (n_slots < 2 * t->cap)
        n_slots *= 2;
    free(t->slots);
    t->slots = gt_xcalloc((size_t)n_slots, sizeof *t->slots);
    t->n_slots = n_slots;
    for (int i = 0; i < t->n; i++) {
        uint32_t s = key_hash(t->entries[i]->key, t->entries[i]->key_len) & (uint32_t)(n_slots - 1);
        while (t->slots[s])
            s = (s + 1) & (uint32_t)(n_slots - 1);
        t->slots[s] = (uint32_t)i + 1;
    }
}

static gt_toml_entry *table_find(const gt_toml_table *t, const char *key, size_t len)
{
    if (!t->slots) {
        for (int i = 0; i < t->n; i++) {
            gt_toml_entry *e = t->entries[i];
            if (e->key_len == len && !memcmp(e->key, key, len)) return e;
        }
        return NULL;
    }
    uint32_t mask = (uint32_t)(t->n_slots - 1);
    for (uint32_t s = key_hash(key, len) & mask; t->slots[s]; s = (s + 1) & mask) {
        gt_toml_entry *e = t->entries[t->slots[s] - 1];
        if (e->key_len == len && !memcmp(e->key, key, len)) return e;
    }
    return NULL;
}

/* Adds key → v (the caller checked that key is absent); takes ownership of v, copies key. */
static gt_toml_entry *table_add(gt_toml_table *t, const char *key, size_t len, int line, int col,
                                gt_toml_value *v)
{
    if (t->n == t->cap) {
        t->cap = t->cap ? 2 * t->cap : 8;
        t->entries = gt_xrealloc(t->entries, (size_t)t->cap * sizeof *t->entries);
        if (t->cap >= 16) index_rebuild(t);
    }
    gt_toml_entry *e = gt_xcalloc(1, sizeof *e);
    e->key = gt_xmalloc(len + 1);
    memcpy(e->key, key, len);
    e->key[len] = '\0';
    e->key_len = len;
    e->line = line;
    e->col = col;
    e->value = v;
    t->entries[t->n++] = e;
    if (t->slots) {
        uint32_t mask = (uint32_t)(t->n_slots - 1);
        uint32_t s = key_hash(key, len) & mask;
        while (t->slots[s])
            s = (s + 1) & mask;
        t->slots[s] = (uint32_t)t->n;
    }
    return e;
}

const gt_toml_entry *gt_toml_find(const gt_toml_value *v, const char *key, size_t key_len)
{
    if (!v || v->type != GT_TOML_TABLE) return NULL;
    return table_find(&v->as.table, key, key_len);
}

static void array_push(gt_toml_value *a, gt_toml_value *item)
{
    if (a->as.array.n == a->as.array.cap) {
        a->as.array.cap = a->as.array.cap ? 2 * a->as.array.cap : 4;
        a->as.array.items =
            gt_xrealloc(a->as.array.items, (size_t)a->as.array.cap * sizeof *a->as.array.items);
    }
    a->as.array.items[a->as.array.n++] = item;
}

/* Marks an inline table and every table inside it sealed. */
static void seal(gt_toml_value *v)
{
    if (v->type == GT_TOML_TABLE) {
        v->as.table.kind = KIND_INLINE;
        for (int i = 0; i < v->as.table.n; i++)
            seal(v->as.table.entries[i]->value);
    } else if (v->type == GT_TOML_ARRAY) {
        for (int i = 0; i < v->as.array.n; i++)
            seal(v->as.array.items[i]);
    }
}

const char *gt_toml_type_name(gt_toml_type t)
{
    switch (t) {
    case GT_TOML_STRING:
        return "string";
    case GT_TOML_INTEGER:
        return "integer";
    case GT_TOML_FLOAT:
        return "float";
    case GT_TOML_BOOLEAN:
        return "boolean";
    case GT_TOML_ARRAY:
        return "array";
    case GT_TOML_TABLE:
        return "table";
    }
    return "value";
}

/* ---------------------------------------------------------------- messages */

size_t gt_toml_quote(const char *s, size_t len, size_t max_chars, char *buf, size_t cap)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t o = 0;
    if (cap == 0) return 0;
#define PUT(ch)                                                                                    \
    do {                                                                                           \
        if (o + 1 < cap) buf[o++] = (ch);                                                          \
    } while (0)
    PUT('"');
    size_t n = len;
    bool cut = false;
    if (max_chars > 0 && n > max_chars) n = max_chars, cut = true;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            PUT('\\');
            PUT((char)c);
        } else if (c == '\n') {
            PUT('\\');
            PUT('n');
        } else if (c == '\t') {
            PUT('\\');
            PUT('t');
        } else if (c < 0x20 || c == 0x7f) {
            PUT('\\');
            PUT('u');
            PUT('0');
            PUT('0');
            PUT(hex[c >> 4]);
            PUT(hex[c & 15]);
        } else {
            PUT((char)c);
        }
    }
    if (cut) {
        PUT('.');
        PUT('.');
        PUT('.');
    }
    PUT('"');
#undef PUT
    buf[o] = '\0';
    return o;
}

void gt_toml_format_float(double v, char *buf, size_t cap)
{
    if (isnan(v)) {
        snprintf(buf, cap, "%snan", signbit(v) ? "-" : "");
        return;
    }
    if (isinf(v)) {
        snprintf(buf, cap, "%sinf", v < 0 ? "-" : "");
        return;
    }
    /* The shortest %g form that reads back to the same double (at most 17 digits suffice). */
    char tmp[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*g", prec, v);
        if (strtod(tmp, NULL) == v) break;
    }
    /* TOML needs a '.' or an exponent to tell a float from an integer: "1" → "1.0". */
    if (!strpbrk(tmp, ".e")) strcat(tmp, ".0");
    snprintf(buf, cap, "%s", tmp);
}

void gt_toml_describe(const gt_toml_value *v, char *buf, size_t cap)
{
    char f[48];
    char q[160];
    switch (v->type) {
    case GT_TOML_STRING:
        gt_toml_quote(v->as.str.data, v->as.str.len, 60, q, sizeof q);
        snprintf(buf, cap, "string %s", q);
        break;
    case GT_TOML_INTEGER:
        snprintf(buf, cap, "integer %lld", (long long)v->as.integer);
        break;
    case GT_TOML_FLOAT:
        gt_toml_format_float(v->as.number, f, sizeof f);
        snprintf(buf, cap, "float %s", f);
        break;
    case GT_TOML_BOOLEAN:
        snprintf(buf, cap, "boolean %s", v->as.boolean ? "true" : "false");
        break;
    default:
        snprintf(buf, cap, "%s", gt_toml_type_name(v->type));
        break;
    }
}

/* A key for messages: quoted only when it is not a plain bare key. */
static void key_for_message(const char *k, size_t len, char *buf, size_t cap)
{
    bool bare = len > 0 && len <= 60;
    for (size_t i = 0; bare && i < len; i++) {
        unsigned char c = (unsigned char)k[i];
        bare = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
               c == '_' || c == '-';
    }
    if (bare)
        snprintf(buf, cap, "%.*s", (int)len, k);
    else
        gt_toml_quote(k, len, 60, buf, cap);
}

/* ---------------------------------------------------------------- whitespace, comments */

static void skip_ws(parser *p)
{
    while (peek(p, 0) == ' ' || peek(p, 0) == '\t')
        p->pos++;
}

static bool is_control(int c)
{
    return (c >= 0 && c < 0x20 && c != '\t') || c == 0x7f;
}

/* At '#': consumes the comment up to (not including) the end of line. */
static gt_status skip_comment(parser *p)
{
    p->pos++;
    for (int c = peek(p, 0); c >= 0 && c != '\n'; c = peek(p, 0)) {
        if (c == '\r' && peek(p, 1) == '\n') break;
        if (is_control(c))
            return fail_at(p, p->pos, "control character U+%04X is not allowed in a comment", c);
        p->pos++;
    }
    return GT_OK;
}

/* At '\n' or '\r': consumes one newline (LF or CRLF). */
static gt_status newline(parser *p)
{
    if (peek(p, 0) == '\n') {
        p->pos++;
        return GT_OK;
    }
    if (peek(p, 0) == '\r' && peek(p, 1) == '\n') {
        p->pos += 2;
        return GT_OK;
    }
    return fail_at(p, p->pos, "carriage return (\\r) not followed by a newline");
}

/* Whitespace, comments and newlines (inside arrays). */
static gt_status skip_ws_newlines(parser *p)
{
    for (;;) {
        skip_ws(p);
        int c = peek(p, 0);
        if (c == '#')
            GT_TRY(skip_comment(p));
        else if (c == '\n' || c == '\r')
            GT_TRY(newline(p));
        else
            return GT_OK;
    }
}

/* After a key/value or a [header]: optional comment, then end of line or end of file. */
static gt_status expect_line_end(parser *p, const char *after)
{
    skip_ws(p);
    if (peek(p, 0) == '#') GT_TRY(skip_comment(p));
    int c = peek(p, 0);
    if (c < 0) return GT_OK;
    if (c == '\n' || c == '\r') return newline(p);
    char found[32];
    describe_char(p, p->pos, found, sizeof found);
    return fail_at(p, p->pos, "expected a newline after %s, found %s", after, found);
}

/* ---------------------------------------------------------------- strings */

static int hex_value(int c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static void utf8_encode(buffer *b, uint32_t cp)
{
    unsigned char u[4];
    size_t n;
    if (cp < 0x80)
        u[0] = (unsigned char)cp, n = 1;
    else if (cp < 0x800) {
        u[0] = (unsigned char)(0xC0 | (cp >> 6));
        u[1] = (unsigned char)(0x80 | (cp & 0x3F));
        n = 2;
    } else if (cp < 0x10000) {
        u[0] = (unsigned char)(0xE0 | (cp >> 12));
        u[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        u[2] = (unsigned char)(0x80 | (cp & 0x3F));
        n = 3;
    } else {
        u[0] = (unsigned char)(0xF0 | (cp >> 18));
        u[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
        u[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        u[3] = (unsigned char)(0x80 | (cp & 0x3F));
        n = 4;
    }
    buf_push(b, u, n);
}

/* At '\\' inside a basic string: appends the escaped character. */
static gt_status escape(parser *p, buffer *b)
{
    size_t at = p->pos;
    int c = peek(p, 1);
    const char *simple = "b\bt\tn\nf\fr\r\"\"\\\\";
    for (const char *s = simple; *s; s += 2) {
        if (c == s[0]) {
            buf_byte(b, s[1]);
            p->pos += 2;
            return GT_OK;
        }
    }
    if (c == 'u' || c == 'U') {
        int digits = c == 'u' ? 4 : 8;
        uint32_t cp = 0;
        for (int i = 0; i < digits; i++) {
            int h = hex_value(peek(p, 2 + (size_t)i));
            if (h < 0)
                return fail_at(p, at, "invalid escape: \\%c needs exactly %d hexadecimal digits", c,
                               digits);
            cp = cp * 16 + (uint32_t)h;
        }
        if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return fail_at(p, at, "invalid escape: U+%X is not a Unicode scalar value", cp);
        utf8_encode(b, cp);
        p->pos += 2 + (size_t)digits;
        return GT_OK;
    }
    char found[32];
    describe_char(p, at + 1, found, sizeof found);
    return fail_at(p, at,
                   "invalid escape sequence: backslash followed by %s (allowed: \\b \\t \\n \\f "
                   "\\r \\\" \\\\ \\uXXXX \\UXXXXXXXX)",
                   found);
}

/* Counts the quote run at pos; in a multi-line string 3..5 quotes close it (up to two of them
 * belong to the content, TOML 1.0: 'a quotation mark, or two, adjacent to the end'). */
static size_t quote_run(const parser *p, int q)
{
    size_t k = 0;
    while (peek(p, k) == q)
        k++;
    return k;
}

/* At the opening delimiter of a string (basic "..." / """...""", literal '...' / '''...''').
 * Appends the content to b. */
static gt_status parse_string(parser *p, buffer *b, bool allow_multiline)
{
    size_t start = p->pos;
    int q = peek(p, 0);
    bool literal = q == '\'';
    bool multi = peek(p, 1) == q && peek(p, 2) == q;
    if (multi && !allow_multiline)
        return fail_at(p, start, "a multi-line string cannot be used as a key");
    if (multi) {
        p->pos += 3;
        /* A newline right after the opening delimiter is trimmed. */
        if (peek(p, 0) == '\n')
            p->pos++;
        else if (peek(p, 0) == '\r' && peek(p, 1) == '\n')
            p->pos += 2;
    } else {
        p->pos++;
    }
    for (;;) {
        int c = peek(p, 0);
        if (c < 0)
            return fail_at(p, start, "unterminated string (no closing %s)",
                           multi ? (literal ? "'''" : "\"\"\"") : (literal ? "'" : "\""));
        if (c == q) {
            if (!multi) {
                p->pos++;
                return GT_OK;
            }
            size_t run = quote_run(p, q);
            if (run >= 3) {
                if (run > 5)
                    return fail_at(p, p->pos, "too many quotes at the end of a multi-line string");
                for (size_t k = 0; k < run - 3; k++)
                    buf_byte(b, q);
                p->pos += run;
                return GT_OK;
            }
            for (size_t k = 0; k < run; k++)
                buf_byte(b, q);
            p->pos += run;
            continue;
        }
        if (c == '\n' || c == '\r') {
            if (!multi)
                return fail_at(p, start,
                               "unterminated string (a newline before the closing "
                               "quote; use triple quotes for a multi-line string)");
            if (c == '\r' && peek(p, 1) != '\n')
                return fail_at(p, p->pos, "carriage return (\\r) not followed by a newline");
            buf_byte(b, '\n'); /* CRLF is normalised to LF */
            p->pos += c == '\r' ? 2 : 1;
            continue;
        }
        if (c == '\\' && !literal) {
            if (multi) {
                /* Line-ending backslash: trims it and all whitespace and newlines that follow. */
                size_t k = 1;
                while (peek(p, k) == ' ' || peek(p, k) == '\t')
                    k++;
                int e = peek(p, k);
                if (e == '\n' || (e == '\r' && peek(p, k + 1) == '\n')) {
                    p->pos += k;
                    for (;;) {
                        int w = peek(p, 0);
                        if (w == ' ' || w == '\t' || w == '\n')
                            p->pos++;
                        else if (w == '\r' && peek(p, 1) == '\n')
                            p->pos += 2;
                        else
                            break;
                    }
                    continue;
                }
            }
            GT_TRY(escape(p, b));
            continue;
        }
        if (is_control(c))
            return fail_at(p, p->pos,
                           "control character U+%04X must be escaped (write \\u%04X) in a string",
                           c, c);
        buf_byte(b, c);
        p->pos++;
    }
}

/* ---------------------------------------------------------------- keys */

typedef struct {
    char *text;
    size_t len;
    size_t at;     /* where the part starts */
    int line, col; /* of `at`, taken while reading (loc() only moves forward cheaply) */
} key_part;

typedef struct {
    key_part parts[GT_TOML_MAX_DEPTH];
    int n;
} key_path;

static void key_path_free(key_path *k)
{
    for (int i = 0; i < k->n; i++)
        free(k->parts[i].text);
    k->n = 0;
}

static bool is_bare_key_char(int c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-';
}

/* A key: one or more parts separated by '.', whitespace allowed around the dots. On failure the
 * parts read so far are freed. */
static gt_status parse_key(parser *p, key_path *k)
{
    k->n = 0;
    for (;;) {
        if (k->n == GT_TOML_MAX_DEPTH) {
            key_path_free(k);
            return fail_at(p, p->pos, "a key has more than %d dotted parts", GT_TOML_MAX_DEPTH);
        }
        key_part *part = &k->parts[k->n];
        part->at = p->pos;
        loc(p, p->pos, &part->line, &part->col);
        int c = peek(p, 0);
        buffer b = {0};
        if (c == '"' || c == '\'') {
            gt_status st = parse_string(p, &b, false);
            if (st != GT_OK) {
                free(b.data);
                key_path_free(k);
                return st;
            }
        } else if (is_bare_key_char(c)) {
            size_t s = p->pos;
            while (is_bare_key_char(peek(p, 0)))
                p->pos++;
            buf_push(&b, p->s + s, p->pos - s);
        } else {
            char found[32];
            describe_char(p, p->pos, found, sizeof found);
            key_path_free(k);
            return fail_at(p, p->pos,
                           "expected a key (letters, digits, '_', '-' or a quoted "
                           "string), found %s",
                           found);
        }
        part->len = b.len;
        part->text = buf_take(&b);
        k->n++;
        skip_ws(p);
        if (peek(p, 0) != '.') return GT_OK;
        p->pos++;
        skip_ws(p);
    }
}

/* Describes an existing entry for "already defined" messages. */
static const char *entry_kind(const gt_toml_entry *e)
{
    switch (e->value->type) {
    case GT_TOML_STRING:
        return "a string";
    case GT_TOML_INTEGER:
        return "an integer";
    case GT_TOML_FLOAT:
        return "a float";
    case GT_TOML_BOOLEAN:
        return "a boolean";
    case GT_TOML_ARRAY:
        return "an array";
    case GT_TOML_TABLE:
        break;
    }
    return e->value->as.table.kind == KIND_INLINE ? "an inline table" : "a table";
}

/* Inserts parts[0..n-1] = v into table t: parts before the last name (possibly new) sub-tables.
 * Takes ownership of v, also on failure. */
static gt_status insert_keyval(parser *p, gt_toml_table *t, key_path *k, gt_toml_value *v)
{
    char name[128];
    for (int i = 0; i < k->n - 1; i++) {
        key_part *part = &k->parts[i];
        gt_toml_entry *e = table_find(t, part->text, part->len);
        key_for_message(part->text, part->len, name, sizeof name);
        if (!e) {
            gt_toml_value *sub = new_value(GT_TOML_TABLE, part->line, part->col);
            sub->as.table.kind = KIND_DOTTED;
            sub->as.table.block = p->block;
            e = table_add(t, part->text, part->len, part->line, part->col, sub);
        } else {
            gt_toml_value *ev = e->value;
            gt_status st = GT_OK;
            if (ev->type != GT_TOML_TABLE)
                st = fail_at(p, part->at,
                             "cannot use '%s' as a table: it is already %s defined "
                             "at line %d",
                             name, entry_kind(e), e->line);
            else if (ev->as.table.kind == KIND_INLINE)
                st = fail_at(p, part->at,
                             "cannot add keys to '%s': it is an inline table defined "
                             "at line %d",
                             name, e->line);
            else if (ev->as.table.kind == KIND_HEADER)
                st = fail_at(p, part->at,
                             "cannot add to table [%s] with a dotted key: it was "
                             "defined by a [header] at line %d",
                             name, e->line);
            else if (ev->as.table.kind == KIND_DOTTED && ev->as.table.block != p->block)
                st = fail_at(p, part->at,
                             "cannot add keys to '%s' here: it was defined by dotted "
                             "keys at line %d, in another table section",
                             name, e->line);
            if (st != GT_OK) {
                gt_toml_free(v);
                return st;
            }
            if (ev->as.table.kind == KIND_IMPLICIT) { /* now defined; no [header] may follow */
                ev->as.table.kind = KIND_DOTTED;
                ev->as.table.block = p->block;
            }
        }
        t = &e->value->as.table;
    }
    key_part *last = &k->parts[k->n - 1];
    gt_toml_entry *e = table_find(t, last->text, last->len);
    if (e) {
        gt_toml_free(v);
        key_for_message(last->text, last->len, name, sizeof name);
        return fail_at(p, last->at, "duplicate key '%s' (first defined at line %d)", name, e->line);
    }
    table_add(t, last->text, last->len, last->line, last->col, v);
    return GT_OK;
}

/* ---------------------------------------------------------------- numbers */

static bool is_digit(int c)
{
    return c >= '0' && c <= '9';
}

/* Digits of `base` with single '_' between digits. Returns the index after them, or 0 with *bad
 * set when the run is empty or an underscore is misplaced. */
static size_t scan_digits(const char *t, size_t len, size_t i, int base, bool *bad)
{
    size_t start = i;
    while (i < len) {
        int c = (unsigned char)t[i];
        int d = hex_value(c);
        if (d >= 0 && d < base && (base == 16 || is_digit(c))) {
            i++;
        } else if (c == '_' && i > start && i + 1 < len) {
            int nd = hex_value((unsigned char)t[i + 1]);
            if (nd < 0 || nd >= base || (base != 16 && !is_digit((unsigned char)t[i + 1]))) break;
            i++;
        } else {
            break;
        }
    }
    if (i == start || t[i - 1] == '_') *bad = true;
    return i;
}

static bool is_number_char(int c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || is_digit(c) || c == '_' ||
           c == '.' || c == '+' || c == '-' || c == ':';
}

/* At a digit, sign, 'i' or 'n': an integer or a float. */
static gt_status parse_number(parser *p, gt_toml_value *v)
{
    size_t start = p->pos, end = p->pos;
    while (end < p->n && is_number_char(p->s[end]))
        end++;
    const char *t = (const char *)p->s + start;
    size_t len = end - start;
    char shown[80];
    gt_toml_quote(t, len, 40, shown, sizeof shown);

    /* 1979-05-27, 07:32:00: TOML dates and times, which no config option needs. */
    if ((len >= 5 && is_digit(t[0]) && is_digit(t[1]) && is_digit(t[2]) && is_digit(t[3]) &&
         t[4] == '-') ||
        (len >= 3 && is_digit(t[0]) && is_digit(t[1]) && t[2] == ':'))
        return fail_at(p, start,
                       "dates and times are not supported in graphtrain configs "
                       "(write the value as a string)");

    size_t i = 0;
    bool negative = false;
    if (len > 0 && (t[0] == '+' || t[0] == '-')) negative = t[0] == '-', i = 1;
    if (len - i == 3 && (!memcmp(t + i, "inf", 3) || !memcmp(t + i, "nan", 3))) {
        v->type = GT_TOML_FLOAT;
        v->as.number = t[i] == 'i' ? INFINITY : NAN;
        if (negative) v->as.number = -v->as.number;
        p->pos = end;
        return GT_OK;
    }
    int base = 10;
    if (len - i >= 2 && t[i] == '0' && (t[i + 1] == 'x' || t[i + 1] == 'o' || t[i + 1] == 'b')) {
        if (i > 0)
            return fail_at(p, start,
                           "a sign is not allowed on a hexadecimal, octal or binary "
                           "integer (%s)",
                           shown);
        base = t[i + 1] == 'x' ? 16 : t[i + 1] == 'o' ? 8 : 2;
        i += 2;
    }
    if (!is_digit(t[0]) && t[0] != '+' && t[0] != '-')
        return fail_at(p, start, "expected a value, found %s (strings must be quoted)", shown);
    bool bad = false, is_float = false;
    size_t digits_start = i;
    if (base == 10 && i + 1 < len && t[i] == '0' && (is_digit(t[i + 1]) || t[i + 1] == '_'))
        return fail_at(p, start, "leading zeros are not allowed in a number (%s)", shown);
    i = scan_digits(t, len, i, base, &bad);
    size_t digits_end = i;
    if (!bad && base == 10 && i < len && t[i] == '.') {
        is_float = true;
        i = scan_digits(t, len, i + 1, 10, &bad);
    }
    if (!bad && base == 10 && i < len && (t[i] == 'e' || t[i] == 'E')) {
        is_float = true;
        i++;
        if (i < len && (t[i] == '+' || t[i] == '-')) i++;
        i = scan_digits(t, len, i, 10, &bad);
    }
    if (bad || i != len) {
        if (len == 0) return fail_at(p, start, "expected a value");
        return fail_at(p, start, "invalid number %s", shown);
    }
    p->pos = end;
    if (is_float) {
        /* strtod after dropping the underscores; the grammar was checked above, so strtod sees a
         * plain decimal float (graphtrain never changes LC_NUMERIC from "C"). */
        char small[64];
        char *copy = len < sizeof small ? small : gt_xmalloc(len + 1);
        size_t o = 0;
        for (size_t k = 0; k < len; k++)
            if (t[k] != '_') copy[o++] = t[k];
        copy[o] = '\0';
        errno = 0;
        char *stop;
        double d = strtod(copy, &stop);
        bool ok = stop == copy + o && !isinf(d);
        if (copy != small) free(copy);
        if (!ok) return fail_at(p, start, "float %s is out of the range of a double", shown);
        v->type = GT_TOML_FLOAT;
        v->as.number = d;
        return GT_OK;
    }
    /* Integer: accumulate the magnitude in 64 unsigned bits, then apply the sign; the range is
     * that of int64 (TOML 1.0: "64 bit (signed long) range expected"). */
    uint64_t mag = 0;
    bool overflow = false;
    for (size_t k = digits_start; k < digits_end; k++) {
        if (t[k] == '_') continue;
        uint64_t d = (uint64_t)hex_value((unsigned char)t[k]);
        if (mag > (UINT64_MAX - d) / (uint64_t)base) overflow = true;
        mag = mag * (uint64_t)base + d;
    }
    uint64_t limit = negative ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
    if (overflow || mag > limit)
        return fail_at(p, start, "integer %s does not fit in 64 bits (range -2^63 .. 2^63-1)",
                       shown);
    v->type = GT_TOML_INTEGER;
    v->as.integer = negative ? (int64_t)(0 - mag) : (int64_t)mag;
    return GT_OK;
}

/* ---------------------------------------------------------------- values */

static gt_status parse_value(parser *p, gt_toml_value **out);

static gt_status parse_array(parser *p, gt_toml_value *v)
{
    size_t start = p->pos;
    p->pos++; /* '[' */
    v->type = GT_TOML_ARRAY;
    for (;;) {
        GT_TRY(skip_ws_newlines(p));
        if (peek(p, 0) == ']') {
            p->pos++;
            return GT_OK;
        }
        if (peek(p, 0) < 0) return fail_at(p, start, "unterminated array (no closing ']')");
        gt_toml_value *item;
        GT_TRY(parse_value(p, &item));
        array_push(v, item);
        GT_TRY(skip_ws_newlines(p));
        int c = peek(p, 0);
        if (c == ',') {
            p->pos++;
        } else if (c != ']') {
            if (c < 0) return fail_at(p, start, "unterminated array (no closing ']')");
            char found[32];
            describe_char(p, p->pos, found, sizeof found);
            return fail_at(p, p->pos, "expected ',' or ']' after an array element, found %s",
                           found);
        }
    }
}

static gt_status parse_inline_table(parser *p, gt_toml_value *v)
{
    size_t start = p->pos;
    p->pos++; /* '{' */
    v->type = GT_TOML_TABLE;
    v->as.table.kind = KIND_INLINE;
    int saved_block = p->block;
    p->block = ++p->next_block; /* dotted keys inside may extend only tables made in here */
    gt_status st = GT_OK;
    skip_ws(p);
    if (peek(p, 0) == '}') {
        p->pos++;
        goto done;
    }
    for (;;) {
        skip_ws(p);
        key_path k;
        if ((st = parse_key(p, &k)) != GT_OK) goto done;
        if (peek(p, 0) != '=') {
            key_path_free(&k);
            char found[32];
            describe_char(p, p->pos, found, sizeof found);
            st = fail_at(p, p->pos, "expected '=' after key, found %s", found);
            goto done;
        }
        p->pos++;
        skip_ws(p);
        gt_toml_value *item;
        if ((st = parse_value(p, &item)) != GT_OK) {
            key_path_free(&k);
            goto done;
        }
        st = insert_keyval(p, &v->as.table, &k, item);
        key_path_free(&k);
        if (st != GT_OK) goto done;
        skip_ws(p);
        int c = peek(p, 0);
        if (c == ',') {
            p->pos++;
            skip_ws(p);
            if (peek(p, 0) == '}') {
                st = fail_at(p, p->pos, "a trailing comma is not allowed in an inline table");
                goto done;
            }
            continue;
        }
        if (c == '}') {
            p->pos++;
            goto done;
        }
        if (c < 0) {
            st = fail_at(p, start, "unterminated inline table (no closing '}')");
        } else if (c == '\n' || c == '\r') {
            st = fail_at(p, p->pos,
                         "expected ',' or '}' in an inline table, found end of line "
                         "(an inline table must fit on one line)");
        } else {
            char found[32];
            describe_char(p, p->pos, found, sizeof found);
            st = fail_at(p, p->pos, "expected ',' or '}' in an inline table, found %s", found);
        }
        goto done;
    }
done:
    p->block = saved_block;
    if (st == GT_OK) seal(v);
    return st;
}

static gt_status parse_value(parser *p, gt_toml_value **out)
{
    *out = NULL;
    int line, col;
    loc(p, p->pos, &line, &col);
    if (p->depth >= GT_TOML_MAX_DEPTH)
        return fail_at(p, p->pos, "arrays and inline tables nest deeper than %d levels",
                       GT_TOML_MAX_DEPTH);
    gt_toml_value *v = new_value(GT_TOML_BOOLEAN, line, col);
    gt_status st;
    int c = peek(p, 0);
    p->depth++;
    if (c == '"' || c == '\'') {
        buffer b = {0};
        st = parse_string(p, &b, true);
        v->type = GT_TOML_STRING;
        v->as.str.len = b.len;
        v->as.str.data = buf_take(&b);
    } else if (c == '[') {
        st = parse_array(p, v);
    } else if (c == '{') {
        st = parse_inline_table(p, v);
    } else if (c == 't' && peek(p, 1) == 'r' && peek(p, 2) == 'u' && peek(p, 3) == 'e' &&
               !is_bare_key_char(peek(p, 4))) {
        v->as.boolean = true;
        p->pos += 4;
        st = GT_OK;
    } else if (c == 'f' && peek(p, 1) == 'a' && peek(p, 2) == 'l' && peek(p, 3) == 's' &&
               peek(p, 4) == 'e' && !is_bare_key_char(peek(p, 5))) {
        v->as.boolean = false;
        p->pos += 5;
        st = GT_OK;
    } else if (is_digit(c) || c == '+' || c == '-' || c == 'i' || c == 'n') {
        st = parse_number(p, v);
    } else {
        char found[32];
        describe_char(p, p->pos, found, sizeof found);
        bool letter = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
        st = fail_at(p, p->pos,
                     "expected a value (string, number, true/false, array or inline "
                     "table), found %s%s",
                     found, letter ? " (strings must be quoted)" : "");
    }
    p->depth--;
    if (st != GT_OK) {
        gt_toml_free(v);
        return st;
    }
    *out = v;
    return GT_OK;
}

/* ---------------------------------------------------------------- document */

/* At '[': a [header] (arrays of tables are refused). Sets *current to the table it names. */
static gt_status parse_header(parser *p, gt_toml_value *root, gt_toml_table **current)
{
    size_t start = p->pos;
    if (peek(p, 1) == '[')
        return fail_at(p, start,
                       "arrays of tables ([[name]]) are not supported in graphtrain "
                       "configs");
    int line, col;
    loc(p, start, &line, &col);
    p->pos++;
    skip_ws(p);
    key_path k;
    GT_TRY(parse_key(p, &k));
    if (peek(p, 0) != ']') {
        key_path_free(&k);
        char found[32];
        describe_char(p, p->pos, found, sizeof found);
        return fail_at(p, p->pos, "expected ']' to close the table header, found %s", found);
    }
    p->pos++;
    gt_toml_table *t = &root->as.table;
    char name[128];
    gt_status st = GT_OK;
    for (int i = 0; i < k.n && st == GT_OK; i++) {
        key_part *part = &k.parts[i];
        bool last = i == k.n - 1;
        gt_toml_entry *e = table_find(t, part->text, part->len);
        if (!e) {
            gt_toml_value *sub = new_value(GT_TOML_TABLE, line, col);
            sub->as.table.kind = last ? KIND_HEADER : KIND_IMPLICIT;
            e = table_add(t, part->text, part->len, line, col, sub);
            t = &sub->as.table;
            continue;
        }
        key_for_message(part->text, part->len, name, sizeof name);
        gt_toml_value *ev = e->value;
        if (ev->type != GT_TOML_TABLE)
            st = fail_at(p, part->at,
                         "cannot use '%s' as a table: it is already %s defined at "
                         "line %d",
                         name, entry_kind(e), e->line);
        else if (ev->as.table.kind == KIND_INLINE)
            st = fail_at(p, part->at,
                         "cannot extend '%s': it is an inline table defined at line "
                         "%d",
                         name, e->line);
        else if (last && ev->as.table.kind == KIND_HEADER)
            st = fail_at(p, start, "table [%s] is defined twice (first at line %d)", name, e->line);
        else if (last && ev->as.table.kind == KIND_DOTTED)
            st = fail_at(p, start, "table [%s] was already defined by dotted keys at line %d", name,
                         e->line);
        else if (last) { /* IMPLICIT: defined now */
            ev->as.table.kind = KIND_HEADER;
            e->line = line;
            e->col = col;
        }
        t = &ev->as.table;
    }
    key_path_free(&k);
    if (st != GT_OK) return st;
    *current = t;
    p->block = ++p->next_block;
    return GT_OK;
}

static gt_status parse_keyval(parser *p, gt_toml_table *table)
{
    key_path k;
    GT_TRY(parse_key(p, &k));
    if (peek(p, 0) != '=') {
        key_path_free(&k);
        char found[32];
        describe_char(p, p->pos, found, sizeof found);
        return fail_at(p, p->pos, "expected '=' after key, found %s", found);
    }
    p->pos++;
    skip_ws(p);
    gt_toml_value *v;
    gt_status st = parse_value(p, &v);
    if (st == GT_OK) st = insert_keyval(p, table, &k, v);
    key_path_free(&k);
    return st;
}

static void parser_init(parser *p, const char *text, size_t len, const char *name, bool located,
                        gt_error *err)
{
    memset(p, 0, sizeof *p);
    p->s = (const unsigned char *)text;
    p->n = len;
    p->name = name ? name : "<toml>";
    p->name_has_location = located;
    p->err = err;
    p->loc_line = 1;
    p->loc_col = 1;
}

static gt_status check_utf8(parser *p)
{
    size_t bad = gt_utf8_invalid_at((const char *)p->s, p->n);
    if (bad < p->n)
        return fail_at(p, bad, "invalid UTF-8 (byte 0x%02X); TOML files must be UTF-8",
                       (unsigned)p->s[bad]);
    return GT_OK;
}

gt_status gt_toml_parse(const char *text, size_t len, const char *name, gt_toml_value **out,
                        gt_error *err)
{
    *out = NULL;
    parser p;
    parser_init(&p, text, len, name, true, err);
    if (len > (size_t)1 << 30)
        return gt_error_set(err, GT_ERR_INVALID, "%s: larger than 1 GiB", p.name);
    GT_TRY(check_utf8(&p));
    if (len >= 3 && !memcmp(text, "\xEF\xBB\xBF", 3)) p.pos = 3; /* byte order mark */
    gt_toml_value *root = new_value(GT_TOML_TABLE, 1, 1);
    root->as.table.kind = KIND_HEADER;
    gt_toml_table *current = &root->as.table;
    gt_status st = GT_OK;
    while (st == GT_OK) {
        skip_ws(&p);
        int c = peek(&p, 0);
        if (c < 0) break;
        if (c == '#' || c == '\n' || c == '\r') {
            st = expect_line_end(&p, "a comment");
        } else if (c == '[') {
            st = parse_header(&p, root, &current);
            if (st == GT_OK) st = expect_line_end(&p, "a table header");
        } else {
            st = parse_keyval(&p, current);
            if (st == GT_OK) st = expect_line_end(&p, "a key/value pair");
        }
    }
    if (st != GT_OK) {
        gt_toml_free(root);
        return st;
    }
    *out = root;
    return GT_OK;
}

gt_status gt_toml_parse_value(const char *text, size_t len, const char *name, gt_toml_value **out,
                              gt_error *err)
{
    *out = NULL;
    parser p;
    parser_init(&p, text, len, name, false, err);
    GT_TRY(check_utf8(&p));
    skip_ws(&p);
    gt_toml_value *v;
    GT_TRY(parse_value(&p, &v));
    skip_ws(&p);
    if (p.pos != p.n) {
        gt_toml_free(v);
        char found[32];
        describe_char(&p, p.pos, found, sizeof found);
        return fail_at(&p, p.pos, "unexpected %s after the value", found);
    }
    *out = v;
    return GT_OK;
}

gt_status gt_toml_parse_file(const char *path, gt_toml_value **out, gt_error *err)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return gt_error_set(err, GT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    /* Read at most the limit + 1 bytes: never trust a size (the path may be a pipe or device). */
    size_t cap = 1 << 16, len = 0;
    char *data = gt_xmalloc(cap);
    for (;;) {
        if (len == cap) {
            if (cap > GT_TOML_MAX_FILE_BYTES) break;
            cap *= 2;
            data = gt_xrealloc(data, cap);
        }
        size_t got = fread(data + len, 1, cap - len, f);
        len += got;
        if (got == 0) break;
    }
    bool failed = ferror(f) != 0;
    int saved_errno = errno;
    fclose(f);
    gt_status st;
    if (failed)
        st = gt_error_set(err, GT_ERR_IO, "%s: cannot read: %s", path, strerror(saved_errno));
    else if (len > GT_TOML_MAX_FILE_BYTES)
        st = gt_error_set(err, GT_ERR_INVALID, "%s: larger than %u MiB; not a config file", path,
                          GT_TOML_MAX_FILE_BYTES >> 20);
    else
        st = gt_toml_parse(data, len, path, out, err);
    free(data);
    return st;
}
