/* toml.h — a TOML v1.0 parser for configuration files (private to src/config).
 *
 * The result is a plain tree: a table is an ordered list of (key, value) entries, an array a list
 * of values. Every value and entry remembers the line and column (1-based, counted in characters)
 * where it was written, so that the config layer can name the place of a bad option.
 *
 * Supported: comments; bare, quoted and dotted keys; [tables]; basic, literal and multi-line
 * strings with every TOML escape; decimal/hex/octal/binary integers with '_' separators; floats
 * with exponents, inf and nan; booleans; (nested) arrays; inline tables. Not supported, with a
 * clear error: arrays of tables ([[x]]) and dates/times. The input may be arbitrary bytes. */
#ifndef GT_CLI_TOML_H
#define GT_CLI_TOML_H

#include "graphtrain/gt_core.h"

/* Arrays and inline tables nest at most this deep; keys have at most this many dotted parts. */
#define GT_TOML_MAX_DEPTH 64
/* gt_toml_parse_file refuses larger files (a config is a few kilobytes). */
#define GT_TOML_MAX_FILE_BYTES (16u << 20)

typedef enum {
    GT_TOML_STRING,
    GT_TOML_INTEGER,
    GT_TOML_FLOAT,
    GT_TOML_BOOLEAN,
    GT_TOML_ARRAY,
    GT_TOML_TABLE,
} gt_toml_type;

typedef struct gt_toml_value gt_toml_value;
typedef struct gt_toml_entry gt_toml_entry;

typedef struct {
    gt_toml_entry **entries; /* in the order they were written */
    int n, cap;
    uint32_t *slots; /* open-addressing index (entry index + 1) once the table grows */
    int n_slots;
    int kind;  /* parser bookkeeping: how the table was created (toml.c) */
    int block; /* parser bookkeeping: the block whose dotted keys may still extend it */
} gt_toml_table;

struct gt_toml_value {
    gt_toml_type type;
    int line, col;
    union {
        struct {
            char *data; /* NUL-terminated; may also contain NUL bytes (written as \u0000) */
            size_t len;
        } str;
        int64_t integer;
        double number;
        bool boolean;
        struct {
            gt_toml_value **items;
            int n, cap;
        } array;
        gt_toml_table table;
    } as;
};

struct gt_toml_entry {
    char *key; /* NUL-terminated; key_len bytes (a quoted key may contain NUL) */
    size_t key_len;
    int line, col; /* of the key */
    gt_toml_value *value;
};

/* Parses a whole document into a root table. name is used in error messages, which read
 * "NAME:LINE:COL: what was expected". */
gt_status gt_toml_parse(const char *text, size_t len, const char *name, gt_toml_value **out,
                        gt_error *err);
/* Reads and parses a file (GT_ERR_IO when it cannot be read). */
gt_status gt_toml_parse_file(const char *path, gt_toml_value **out, gt_error *err);
/* Parses one value that makes up all of text (surrounding spaces allowed), e.g. "[1, 2]" or
 * "0x10"; used for command-line values. Errors read "NAME: what was expected". */
gt_status gt_toml_parse_value(const char *text, size_t len, const char *name, gt_toml_value **out,
                              gt_error *err);
void gt_toml_free(gt_toml_value *v);

/* Entry of table v under key (NULL if absent or v is not a table). */
const gt_toml_entry *gt_toml_find(const gt_toml_value *v, const char *key, size_t key_len);
const char *gt_toml_type_name(gt_toml_type t); /* "string", "integer", "float", ... */

/* Writes s as a TOML basic string with quotes ("a\"b"); non-printable bytes are escaped. Output is
 * truncated to cap bytes (always NUL-terminated) when max_chars > 0 and s is longer than that,
 * with "..." appended. Returns the number of bytes written. */
size_t gt_toml_quote(const char *s, size_t len, size_t max_chars, char *buf, size_t cap);
/* A float in TOML syntax that reads back to exactly v: shortest digits, always with '.' or an
 * exponent ("1.0", "8e-4", "0.1"), or inf / -inf / nan. */
void gt_toml_format_float(double v, char *buf, size_t cap);
/* "integer 3", "string \"abc\"", "array", ... for messages. */
void gt_toml_describe(const gt_toml_value *v, char *buf, size_t cap);
/* Index of the first byte that is not valid UTF-8, or len if all of s is. */
size_t gt_utf8_invalid_at(const char *s, size_t len);

#endif
