/* toml_scalars.c — the low level of the TOML parser (see toml.h; shared declarations in
 * toml_internal.h): positions and error messages, byte buffers, UTF-8, strings with their escapes,
 * numbers (and the refusal of dates and times), and the formatting of scalars for messages and
 * printing. The document structure built on these is in toml.c. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/toml_internal.h"

/* ---------------------------------------------------------------- buffers */

void gt_toml_buf_push(gt_toml_buffer *b, const void *src, size_t n)
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

static void buf_byte(gt_toml_buffer *b, int c)
{
    unsigned char ch = (unsigned char)c;
    gt_toml_buf_push(b, &ch, 1);
}

/* Takes ownership of the bytes (always a valid NUL-terminated string, possibly empty). */
char *gt_toml_buf_take(gt_toml_buffer *b)
{
    if (!b->data) gt_toml_buf_push(b, "", 0);
    char *d = b->data;
    b->data = NULL;
    b->len = b->cap = 0;
    return d;
}

/* ---------------------------------------------------------------- positions and errors */

void gt_toml_loc(gt_toml_parser *p, size_t at, int *line, int *col)
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

gt_status gt_toml_fail_at(gt_toml_parser *p, size_t at, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (!p->name_has_location) return gt_error_set(p->err, GT_ERR_INVALID, "%s: %s", p->name, msg);
    int line, col;
    gt_toml_loc(p, at, &line, &col);
    return gt_error_set(p->err, GT_ERR_INVALID, "%s:%d:%d: %s", p->name, line, col, msg);
}

/* Describes the character at `at` for "found ..." in messages. */
void gt_toml_describe_char(const gt_toml_parser *p, size_t at, char *buf, size_t cap)
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

/* ---------------------------------------------------------------- UTF-8 */

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

/* ---------------------------------------------------------------- messages */

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

/* ---------------------------------------------------------------- strings */

static int hex_value(int c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static void utf8_encode(gt_toml_buffer *b, uint32_t cp)
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
    gt_toml_buf_push(b, u, n);
}

/* At '\\' inside a basic string: appends the escaped character. */
static gt_status escape(gt_toml_parser *p, gt_toml_buffer *b)
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
                return gt_toml_fail_at(
                    p, at, "invalid escape: \\%c needs exactly %d hexadecimal digits", c, digits);
            cp = cp * 16 + (uint32_t)h;
        }
        if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return gt_toml_fail_at(p, at, "invalid escape: U+%X is not a Unicode scalar value", cp);
        utf8_encode(b, cp);
        p->pos += 2 + (size_t)digits;
        return GT_OK;
    }
    char found[32];
    gt_toml_describe_char(p, at + 1, found, sizeof found);
    return gt_toml_fail_at(
        p, at,
        "invalid escape sequence: backslash followed by %s (allowed: \\b \\t \\n \\f "
        "\\r \\\" \\\\ \\uXXXX \\UXXXXXXXX)",
        found);
}

/* Counts the quote run at pos; in a multi-line string 3..5 quotes close it (up to two of them
 * belong to the content, TOML 1.0: 'a quotation mark, or two, adjacent to the end'). */
static size_t quote_run(const gt_toml_parser *p, int q)
{
    size_t k = 0;
    while (peek(p, k) == q)
        k++;
    return k;
}

/* At the opening delimiter of a string (basic "..." / """...""", literal '...' / '''...''').
 * Appends the content to b. */
gt_status gt_toml_parse_string(gt_toml_parser *p, gt_toml_buffer *b, bool allow_multiline)
{
    size_t start = p->pos;
    int q = peek(p, 0);
    bool literal = q == '\'';
    bool multi = peek(p, 1) == q && peek(p, 2) == q;
    if (multi && !allow_multiline)
        return gt_toml_fail_at(p, start, "a multi-line string cannot be used as a key");
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
            return gt_toml_fail_at(p, start, "unterminated string (no closing %s)",
                                   multi ? (literal ? "'''" : "\"\"\"") : (literal ? "'" : "\""));
        if (c == q) {
            if (!multi) {
                p->pos++;
                return GT_OK;
            }
            size_t run = quote_run(p, q);
            if (run >= 3) {
                if (run > 5)
                    return gt_toml_fail_at(p, p->pos,
                                           "too many quotes at the end of a multi-line string");
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
                return gt_toml_fail_at(p, start,
                                       "unterminated string (a newline before the closing "
                                       "quote; use triple quotes for a multi-line string)");
            if (c == '\r' && peek(p, 1) != '\n')
                return gt_toml_fail_at(p, p->pos,
                                       "carriage return (\\r) not followed by a newline");
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
            return gt_toml_fail_at(
                p, p->pos, "control character U+%04X must be escaped (write \\u%04X) in a string",
                c, c);
        buf_byte(b, c);
        p->pos++;
    }
}

/* ---------------------------------------------------------------- numbers */

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
gt_status gt_toml_parse_number(gt_toml_parser *p, gt_toml_value *v)
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
        return gt_toml_fail_at(p, start,
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
            return gt_toml_fail_at(p, start,
                                   "a sign is not allowed on a hexadecimal, octal or binary "
                                   "integer (%s)",
                                   shown);
        base = t[i + 1] == 'x' ? 16 : t[i + 1] == 'o' ? 8 : 2;
        i += 2;
    }
    if (!is_digit(t[0]) && t[0] != '+' && t[0] != '-')
        return gt_toml_fail_at(p, start, "expected a value, found %s (strings must be quoted)",
                               shown);
    bool bad = false, is_float = false;
    size_t digits_start = i;
    if (base == 10 && i + 1 < len && t[i] == '0' && (is_digit(t[i + 1]) || t[i + 1] == '_'))
        return gt_toml_fail_at(p, start, "leading zeros are not allowed in a number (%s)", shown);
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
        if (len == 0) return gt_toml_fail_at(p, start, "expected a value");
        return gt_toml_fail_at(p, start, "invalid number %s", shown);
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
        if (!ok)
            return gt_toml_fail_at(p, start, "float %s is out of the range of a double", shown);
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
        return gt_toml_fail_at(p, start,
                               "integer %s does not fit in 64 bits (range -2^63 .. 2^63-1)", shown);
    v->type = GT_TOML_INTEGER;
    v->as.integer = negative ? (int64_t)(0 - mag) : (int64_t)mag;
    return GT_OK;
}
