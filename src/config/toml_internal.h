/* toml_internal.h — what the two halves of the TOML parser share; private to them.
 *
 *   toml.c          document and table structure, keys, arrays and inline tables, and the public
 *                   parse API (gt_toml_parse, gt_toml_parse_value, gt_toml_parse_file, ...);
 *   toml_scalars.c  the reader's low level: positions and error messages, byte buffers, UTF-8,
 *                   strings and escapes, numbers (dates and times are refused there), and the
 *                   formatting of scalars for messages (gt_toml_quote, gt_toml_format_float, ...).
 *
 * toml.c calls into toml_scalars.c, never the other way round. */
#ifndef GT_CLI_TOML_INTERNAL_H
#define GT_CLI_TOML_INTERNAL_H

#include "config/toml.h"

/* The reader: text[0..n) (never assumed NUL-terminated), the read position, and where errors go. */
typedef struct {
    const unsigned char *s;
    size_t n, pos;
    const char *name;
    bool name_has_location; /* document mode: messages carry line:col */
    gt_error *err;
    /* Line and column of loc_pos, advanced lazily and monotonically by gt_toml_loc(). */
    size_t loc_pos;
    int loc_line, loc_col;
    int block, next_block;
    int depth;
} gt_toml_parser;

/* A growable byte buffer for string contents. */
typedef struct {
    char *data;
    size_t len, cap;
} gt_toml_buffer;

/* The byte k places after the read position, or -1 past the end. */
static inline int peek(const gt_toml_parser *p, size_t k)
{
    return p->pos + k < p->n ? p->s[p->pos + k] : -1;
}

/* A control character other than tab: not allowed raw in comments and strings. */
static inline bool is_control(int c)
{
    return (c >= 0 && c < 0x20 && c != '\t') || c == 0x7f;
}

static inline bool is_digit(int c)
{
    return c >= '0' && c <= '9';
}

/* ---------------------------------------------------------------- in toml_scalars.c */

/* Line and column (1-based, counted in characters) of byte `at`. */
void gt_toml_loc(gt_toml_parser *p, size_t at, int *line, int *col);
/* Sets p->err to "NAME:LINE:COL: message" (document mode) or "NAME: message"; returns the status
 * (GT_ERR_INVALID). */
gt_status gt_toml_fail_at(gt_toml_parser *p, size_t at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Describes the character at `at` for "found ..." in messages. */
void gt_toml_describe_char(const gt_toml_parser *p, size_t at, char *buf, size_t cap);

/* Appends n bytes; the buffer stays NUL-terminated. */
void gt_toml_buf_push(gt_toml_buffer *b, const void *src, size_t n);
/* Takes ownership of the bytes (always a valid NUL-terminated string, possibly empty). */
char *gt_toml_buf_take(gt_toml_buffer *b);

/* At the opening delimiter of a string (basic or literal, single- or multi-line): appends the
 * content to b. */
gt_status gt_toml_parse_string(gt_toml_parser *p, gt_toml_buffer *b, bool allow_multiline);
/* At a digit, sign, 'i' or 'n': an integer or a float into v. */
gt_status gt_toml_parse_number(gt_toml_parser *p, gt_toml_value *v);

#endif
