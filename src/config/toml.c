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
 * A "block" is the run of key/values after one [header] (or inside one inline table).
 *
 * The reader's low level (positions and error messages, UTF-8, strings and escapes, numbers) is in
 * toml_scalars.c; toml_internal.h declares what the two files share. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/toml_internal.h"

enum { KIND_HEADER, KIND_IMPLICIT, KIND_DOTTED, KIND_INLINE };

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

/* ---------------------------------------------------------------- whitespace, comments */

static void skip_ws(gt_toml_parser *p)
{
    while (peek(p, 0) == ' ' || peek(p, 0) == '\t')
        p->pos++;
}

/* At '#': consumes the comment up to (not including) the end of line. */
static gt_status skip_comment(gt_toml_parser *p)
{
    p->pos++;
    for (int c = peek(p, 0); c >= 0 && c != '\n'; c = peek(p, 0)) {
        if (c == '\r' && peek(p, 1) == '\n') break;
        if (is_control(c))
            return gt_toml_fail_at(p, p->pos,
                                   "control character U+%04X is not allowed in a comment", c);
        p->pos++;
    }
    return GT_OK;
}

/* At '\n' or '\r': consumes one newline (LF or CRLF). */
static gt_status newline(gt_toml_parser *p)
{
    if (peek(p, 0) == '\n') {
        p->pos++;
        return GT_OK;
    }
    if (peek(p, 0) == '\r' && peek(p, 1) == '\n') {
        p->pos += 2;
        return GT_OK;
    }
    return gt_toml_fail_at(p, p->pos, "carriage return (\\r) not followed by a newline");
}

/* Whitespace, comments and newlines (inside arrays). */
static gt_status skip_ws_newlines(gt_toml_parser *p)
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
static gt_status expect_line_end(gt_toml_parser *p, const char *after)
{
    skip_ws(p);
    if (peek(p, 0) == '#') GT_TRY(skip_comment(p));
    int c = peek(p, 0);
    if (c < 0) return GT_OK;
    if (c == '\n' || c == '\r') return newline(p);
    char found[32];
    gt_toml_describe_char(p, p->pos, found, sizeof found);
    return gt_toml_fail_at(p, p->pos, "expected a newline after %s, found %s", after, found);
}

/* ---------------------------------------------------------------- keys */

typedef struct {
    char *text;
    size_t len;
    size_t at;     /* where the part starts */
    int line, col; /* of `at`, taken while reading (gt_toml_loc() only moves forward cheaply) */
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

/* A key: one or more parts separated by '.', whitespace allowed around the dots. On failure the
 * parts read so far are freed. */
static gt_status parse_key(gt_toml_parser *p, key_path *k)
{
    k->n = 0;
    for (;;) {
        if (k->n == GT_TOML_MAX_DEPTH) {
            key_path_free(k);
            return gt_toml_fail_at(p, p->pos, "a key has more than %d dotted parts",
                                   GT_TOML_MAX_DEPTH);
        }
        key_part *part = &k->parts[k->n];
        part->at = p->pos;
        gt_toml_loc(p, p->pos, &part->line, &part->col);
        int c = peek(p, 0);
        gt_toml_buffer b = {0};
        if (c == '"' || c == '\'') {
            gt_status st = gt_toml_parse_string(p, &b, false);
            if (st != GT_OK) {
                free(b.data);
                key_path_free(k);
                return st;
            }
        } else if (is_bare_key_char(c)) {
            size_t s = p->pos;
            while (is_bare_key_char(peek(p, 0)))
                p->pos++;
            gt_toml_buf_push(&b, p->s + s, p->pos - s);
        } else {
            char found[32];
            gt_toml_describe_char(p, p->pos, found, sizeof found);
            key_path_free(k);
            return gt_toml_fail_at(p, p->pos,
                                   "expected a key (letters, digits, '_', '-' or a quoted "
                                   "string), found %s",
                                   found);
        }
        part->len = b.len;
        part->text = gt_toml_buf_take(&b);
        k->n++;
        skip_ws(p);
        if (peek(p, 0) != '.') return GT_OK;
        p->pos++;
        skip_ws(p);
    }
}

/* A key and the character that must follow it (consumed); what says where that character
 * belongs in the message when another one stands there. */
static gt_status parse_key_then(gt_toml_parser *p, key_path *k, char want, const char *what)
{
    GT_TRY(parse_key(p, k));
    if (peek(p, 0) != want) {
        key_path_free(k);
        char found[32];
        gt_toml_describe_char(p, p->pos, found, sizeof found);
        return gt_toml_fail_at(p, p->pos, "expected '%c' %s, found %s", want, what, found);
    }
    p->pos++;
    return GT_OK;
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

/* Entry e (named name in messages), reached by key part part, must be a table that keys can still
 * be added to: not a scalar or array, and not an inline table (closed by its braces). verb says
 * what was being done to it. */
static gt_status need_open_table(gt_toml_parser *p, const key_part *part, const gt_toml_entry *e,
                                 const char *name, const char *verb)
{
    if (e->value->type != GT_TOML_TABLE)
        return gt_toml_fail_at(p, part->at,
                               "cannot use '%s' as a table: it is already %s defined at line %d",
                               name, entry_kind(e), e->line);
    if (e->value->as.table.kind == KIND_INLINE)
        return gt_toml_fail_at(p, part->at,
                               "cannot %s '%s': it is an inline table defined at line %d", verb,
                               name, e->line);
    return GT_OK;
}

/* Inserts parts[0..n-1] = v into table t: parts before the last name (possibly new) sub-tables.
 * Takes ownership of v, also on failure. */
static gt_status insert_keyval(gt_toml_parser *p, gt_toml_table *t, key_path *k, gt_toml_value *v)
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
            gt_status st = need_open_table(p, part, e, name, "add keys to");
            if (st == GT_OK && ev->as.table.kind == KIND_HEADER)
                st = gt_toml_fail_at(p, part->at,
                                     "cannot add to table [%s] with a dotted key: it was "
                                     "defined by a [header] at line %d",
                                     name, e->line);
            else if (st == GT_OK && ev->as.table.kind == KIND_DOTTED &&
                     ev->as.table.block != p->block)
                st = gt_toml_fail_at(p, part->at,
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
        return gt_toml_fail_at(p, last->at, "duplicate key '%s' (first defined at line %d)", name,
                               e->line);
    }
    table_add(t, last->text, last->len, last->line, last->col, v);
    return GT_OK;
}

/* ---------------------------------------------------------------- values */

static gt_status parse_value(gt_toml_parser *p, gt_toml_value **out);

static gt_status parse_array(gt_toml_parser *p, gt_toml_value *v)
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
        if (peek(p, 0) < 0) return gt_toml_fail_at(p, start, "unterminated array (no closing ']')");
        gt_toml_value *item;
        GT_TRY(parse_value(p, &item));
        array_push(v, item);
        GT_TRY(skip_ws_newlines(p));
        int c = peek(p, 0);
        if (c == ',') {
            p->pos++;
        } else if (c != ']') {
            if (c < 0) return gt_toml_fail_at(p, start, "unterminated array (no closing ']')");
            char found[32];
            gt_toml_describe_char(p, p->pos, found, sizeof found);
            return gt_toml_fail_at(p, p->pos,
                                   "expected ',' or ']' after an array element, found %s", found);
        }
    }
}

static gt_status parse_inline_table(gt_toml_parser *p, gt_toml_value *v)
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
            gt_toml_describe_char(p, p->pos, found, sizeof found);
            st = gt_toml_fail_at(p, p->pos, "expected '=' after key, found %s", found);
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
                st = gt_toml_fail_at(p, p->pos,
                                     "a trailing comma is not allowed in an inline table");
                goto done;
            }
            continue;
        }
        if (c == '}') {
            p->pos++;
            goto done;
        }
        if (c < 0) {
            st = gt_toml_fail_at(p, start, "unterminated inline table (no closing '}')");
        } else if (c == '\n' || c == '\r') {
            st = gt_toml_fail_at(p, p->pos,
                                 "expected ',' or '}' in an inline table, found end of line "
                                 "(an inline table must fit on one line)");
        } else {
            char found[32];
            gt_toml_describe_char(p, p->pos, found, sizeof found);
            st = gt_toml_fail_at(p, p->pos, "expected ',' or '}' in an inline table, found %s",
                                 found);
        }
        goto done;
    }
done:
    p->block = saved_block;
    if (st == GT_OK) seal(v);
    return st;
}

static gt_status parse_value(gt_toml_parser *p, gt_toml_value **out)
{
    *out = NULL;
    int line, col;
    gt_toml_loc(p, p->pos, &line, &col);
    if (p->depth >= GT_TOML_MAX_DEPTH)
        return gt_toml_fail_at(p, p->pos, "arrays and inline tables nest deeper than %d levels",
                               GT_TOML_MAX_DEPTH);
    gt_toml_value *v = new_value(GT_TOML_BOOLEAN, line, col);
    gt_status st;
    int c = peek(p, 0);
    p->depth++;
    if (c == '"' || c == '\'') {
        gt_toml_buffer b = {0};
        st = gt_toml_parse_string(p, &b, true);
        v->type = GT_TOML_STRING;
        v->as.str.len = b.len;
        v->as.str.data = gt_toml_buf_take(&b);
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
        st = gt_toml_parse_number(p, v);
    } else {
        char found[32];
        gt_toml_describe_char(p, p->pos, found, sizeof found);
        bool letter = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
        st = gt_toml_fail_at(p, p->pos,
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
static gt_status parse_header(gt_toml_parser *p, gt_toml_value *root, gt_toml_table **current)
{
    size_t start = p->pos;
    if (peek(p, 1) == '[')
        return gt_toml_fail_at(p, start,
                               "arrays of tables ([[name]]) are not supported in graphtrain "
                               "configs");
    int line, col;
    gt_toml_loc(p, start, &line, &col);
    p->pos++;
    skip_ws(p);
    key_path k;
    GT_TRY(parse_key_then(p, &k, ']', "to close the table header"));
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
        st = need_open_table(p, part, e, name, "extend");
        if (st != GT_OK) break;
        if (last && ev->as.table.kind == KIND_HEADER)
            st = gt_toml_fail_at(p, start, "table [%s] is defined twice (first at line %d)", name,
                                 e->line);
        else if (last && ev->as.table.kind == KIND_DOTTED)
            st = gt_toml_fail_at(p, start,
                                 "table [%s] was already defined by dotted keys at line %d", name,
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

static gt_status parse_keyval(gt_toml_parser *p, gt_toml_table *table)
{
    key_path k;
    GT_TRY(parse_key_then(p, &k, '=', "after key"));
    skip_ws(p);
    gt_toml_value *v;
    gt_status st = parse_value(p, &v);
    if (st == GT_OK) st = insert_keyval(p, table, &k, v);
    key_path_free(&k);
    return st;
}

static void parser_init(gt_toml_parser *p, const char *text, size_t len, const char *name,
                        bool located, gt_error *err)
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

static gt_status check_utf8(gt_toml_parser *p)
{
    size_t bad = gt_utf8_invalid_at((const char *)p->s, p->n);
    if (bad < p->n)
        return gt_toml_fail_at(p, bad, "invalid UTF-8 (byte 0x%02X); TOML files must be UTF-8",
                               (unsigned)p->s[bad]);
    return GT_OK;
}

gt_status gt_toml_parse(const char *text, size_t len, const char *name, gt_toml_value **out,
                        gt_error *err)
{
    *out = NULL;
    gt_toml_parser p;
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
    gt_toml_parser p;
    parser_init(&p, text, len, name, false, err);
    GT_TRY(check_utf8(&p));
    skip_ws(&p);
    gt_toml_value *v;
    GT_TRY(parse_value(&p, &v));
    skip_ws(&p);
    if (p.pos != p.n) {
        gt_toml_free(v);
        char found[32];
        gt_toml_describe_char(&p, p.pos, found, sizeof found);
        return gt_toml_fail_at(&p, p.pos, "unexpected %s after the value", found);
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
