/* tokenizer_json.c — reading JSON files for the tokenizer: the whole file, and jansson parsing
 * with a workaround for NUL characters in object keys. */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "train/tokenizer_internal.h"

/* jansson refuses U+0000 in object keys, and torchtitan's test vocab has the key "\u0000". So
 * every \u0000 escape is parsed as U+10FFFF (a noncharacter, written \udbff\udfff) and turned
 * back into a NUL afterwards; a file that holds both characters is refused. */
static const char gt_tok_sentinel[] = "\xF4\x8F\xBF\xBF";

static bool gt_tok_has_sentinel(const char *s, size_t n)
{
    for (size_t i = 0; i + 4 <= n; i++)
        if (memcmp(s + i, gt_tok_sentinel, 4) == 0) return true;
    return false;
}

static char *gt_tok_replace_nul_escapes(const char *text, size_t len, size_t *out_len,
                                        bool *conflict)
{
    *conflict = gt_tok_has_sentinel(text, len);
    char *out = gt_xmalloc(2 * len + 1);
    size_t o = 0;
    for (size_t i = 0; i < len; i++) {
        /* a backslash always starts a two-character escape (or a \uXXXX one) */
        if (text[i] == '\\' && i + 1 < len) {
            if (i + 6 <= len && text[i + 1] == 'u' && memcmp(text + i + 2, "0000", 4) == 0) {
                memcpy(out + o, "\\udbff\\udfff", 12);
                o += 12;
                i += 5;
                continue;
            }
            if (i + 12 <= len && text[i + 1] == 'u' &&
                strncasecmp(text + i + 2, "dbff\\udfff", 10) == 0)
                *conflict = true;
            out[o++] = text[i++];
        }
        out[o++] = text[i];
    }
    *out_len = o;
    return out;
}

/* Puts the NULs back into every string and object key. */
static void gt_tok_restore_nul(json_t *j, int depth)
{
    if (depth > 64) return; /* tokenizer.json is shallow; deeper values are never read */
    char *buf;
    size_t n;
    if (json_is_string(j)) {
        const char *s = json_string_value(j);
        n = json_string_length(j);
        if (!gt_tok_has_sentinel(s, n)) return;
        buf = gt_xmalloc(n + 1);
        size_t o = 0;
        for (size_t i = 0; i < n; i++) {
            if (i + 4 <= n && memcmp(s + i, gt_tok_sentinel, 4) == 0) {
                buf[o++] = '\0';
                i += 3;
            } else {
                buf[o++] = s[i];
            }
        }
        json_string_setn(j, buf, o);
        free(buf);
    } else if (json_is_array(j)) {
        for (size_t i = 0; i < json_array_size(j); i++)
            gt_tok_restore_nul(json_array_get(j, i), depth + 1);
    } else if (json_is_object(j)) {
        const char *key;
        size_t key_len;
        json_t *v;
        void *tmp;
        json_t *renamed = json_object();
        json_object_keylen_foreach_safe(j, tmp, key, key_len, v)
        {
            gt_tok_restore_nul(v, depth + 1);
            if (!gt_tok_has_sentinel(key, key_len)) continue;
            buf = gt_xmalloc(key_len + 1);
            size_t o = 0;
            for (size_t i = 0; i < key_len; i++) {
                if (i + 4 <= key_len && memcmp(key + i, gt_tok_sentinel, 4) == 0) {
                    buf[o++] = '\0';
                    i += 3;
                } else {
                    buf[o++] = key[i];
                }
            }
            json_object_setn(renamed, buf, o, v);
            free(buf);
            json_object_deln(j, key, key_len);
        }
        json_object_keylen_foreach(renamed, key, key_len, v) json_object_setn(j, key, key_len, v);
        json_decref(renamed);
    }
}

json_t *gt_tok_parse(const char *text, size_t len, const char *name, gt_error *err)
{
    bool conflict;
    size_t n;
    char *fixed = gt_tok_replace_nul_escapes(text, len, &n, &conflict);
    bool had_nul = n != len;
    if (had_nul && conflict) {
        free(fixed);
        gt_error_set(err, GT_ERR_UNSUPPORTED,
                     "%s: holds both U+0000 and U+10FFFF, which graphtrain cannot tell apart",
                     name);
        return NULL;
    }
    json_error_t jerr;
    json_t *root = json_loadb(fixed, n, JSON_ALLOW_NUL, &jerr);
    free(fixed);
    if (!root) {
        gt_error_set(err, GT_ERR_FORMAT, "%s: not valid JSON at line %d column %d: %s", name,
                     jerr.line, jerr.column, jerr.text);
        return NULL;
    }
    if (had_nul) gt_tok_restore_nul(root, 0);
    return root;
}
