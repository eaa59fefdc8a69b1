/* tokenizer_load.c — reads and validates tokenizer.json (and tokenizer_config.json).
 *
 * Every field is checked before use; a malformed file is refused with "FILE: FIELD: what was
 * expected" (GT_ERR_FORMAT), a valid but unsupported feature with GT_ERR_UNSUPPORTED. The
 * result mirrors what Hugging Face tokenizers builds from the same file: model vocab and merge
 * ranks (later duplicates of a merge pair win, as its HashMap collect does), added tokens with
 * their flags, the pre-tokenizer as a flat list of steps, the post-processor's template. */
#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "train/tokenizer_internal.h"
#include "train/train_internal.h"

typedef struct {
    gt_tokenizer *t;
    const char *name; /* the file being read, for messages */
    gt_error *err;
    int32_t max_id;
    int n_templates;
    gt_tok_strmap vocab_ids; /* id (4 bytes) → index of its model.vocab entry */
    int32_t max_added;       /* largest added-token id so far, -1 before the first */
} gt_tok_loader;

static gt_status gt_tok_fail(gt_tok_loader *L, gt_status code, const char *field, const char *fmt,
                             ...) __attribute__((format(printf, 4, 5)));

static gt_status gt_tok_fail(gt_tok_loader *L, gt_status code, const char *field, const char *fmt,
                             ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return gt_error_set(L->err, code, "%s: %s: %s", L->name, field, msg);
}

/* Optional boolean: absent or null gives def. */
static gt_status gt_tok_get_bool(gt_tok_loader *L, json_t *obj, const char *key, bool def,
                                 const char *field, bool *out)
{
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return GT_OK;
    }
    if (!json_is_boolean(v))
        return gt_tok_fail(L, GT_ERR_FORMAT, field, "\"%s\" must be true or false", key);
    *out = json_is_true(v);
    return GT_OK;
}

static const char *gt_tok_type(json_t *obj)
{
    json_t *v = json_object_get(obj, "type");
    return json_is_string(v) ? json_string_value(v) : NULL;
}

/* ---------------------------------------------------------------- model */

static gt_status gt_tok_load_vocab(gt_tok_loader *L, json_t *vocab)
{
    gt_tokenizer *t = L->t;
    if (!json_is_object(vocab))
        return gt_tok_fail(L, GT_ERR_FORMAT, "model.vocab", "expected an object {token: id}");
    size_t n = json_object_size(vocab);
    if (n >= GT_TOK_MAX_ID)
        return gt_tok_fail(L, GT_ERR_FORMAT, "model.vocab", "%zu entries; at most %d", n,
                           GT_TOK_MAX_ID - 1);
    gt_tok_strmap *seen = &L->vocab_ids;
    const char *key;
    size_t klen;
    json_t *v;
    gt_status st = GT_OK;
    json_object_keylen_foreach(vocab, key, klen, v)
    {
        if (!json_is_integer(v) || json_integer_value(v) < 0 ||
            json_integer_value(v) >= GT_TOK_MAX_ID) {
            st = gt_tok_fail(L, GT_ERR_FORMAT, "model.vocab",
                             "token \"%.64s\": id must be an integer in [0, %d)", key,
                             GT_TOK_MAX_ID);
            break;
        }
        int32_t id = (int32_t)json_integer_value(v);
        int32_t prev = gt_tok_strmap_get(seen, (const char *)&id, sizeof id);
        if (prev >= 0) {
            st = gt_tok_fail(L, GT_ERR_FORMAT, "model.vocab",
                             "tokens \"%.64s\" and \"%.64s\" both have id %d",
                             t->vocab.pool + t->vocab.key_off[prev], key, id);
            break;
        }
        gt_tok_strmap_put(seen, (const char *)&id, sizeof id, (int32_t)t->vocab.n);
        gt_tok_strmap_put(&t->vocab, key, klen, id);
        if (id > L->max_id) L->max_id = id;
    }
    return st;
}

/* A merge's two tokens: "a b" (exactly one space, as Hugging Face splits it) or ["a", "b"]. */
static gt_status gt_tok_merge_parts(gt_tok_loader *L, json_t *m, size_t i, const char **a,
                                    size_t *alen, const char **b, size_t *blen)
{
    char field[64];
    snprintf(field, sizeof field, "model.merges[%zu]", i);
    if (json_is_string(m)) {
        const char *s = json_string_value(m);
        size_t n = json_string_length(m);
        const char *sp = memchr(s, ' ', n);
        if (!sp || memchr(sp + 1, ' ', n - (size_t)(sp - s) - 1))
            return gt_tok_fail(L, GT_ERR_FORMAT, field,
                               "expected \"left right\" with exactly one space, got \"%.64s\"", s);
        *a = s, *alen = (size_t)(sp - s);
        *b = sp + 1, *blen = n - *alen - 1;
        return GT_OK;
    }
    if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
        json_is_string(json_array_get(m, 1))) {
        *a = json_string_value(json_array_get(m, 0)),
        *alen = json_string_length(json_array_get(m, 0));
        *b = json_string_value(json_array_get(m, 1)),
        *blen = json_string_length(json_array_get(m, 1));
        return GT_OK;
    }
    return gt_tok_fail(L, GT_ERR_FORMAT, field,
                       "expected a string \"left right\" or a pair [\"left\", \"right\"]");
}

static gt_status gt_tok_load_merges(gt_tok_loader *L, json_t *merges)
{
    gt_tokenizer *t = L->t;
    if (!merges || json_is_null(merges)) return GT_OK;
    if (!json_is_array(merges))
        return gt_tok_fail(L, GT_ERR_FORMAT, "model.merges", "expected an array");
    size_t n = json_array_size(merges);
    if (n >= GT_TOK_MAX_ID)
        return gt_tok_fail(L, GT_ERR_FORMAT, "model.merges", "%zu merges; at most %d", n,
                           GT_TOK_MAX_ID - 1);
    char *joined = NULL;
    size_t joined_cap = 0;
    gt_status st = GT_OK;
    for (size_t i = 0; i < n && st == GT_OK; i++) {
        const char *a = NULL, *b = NULL;
        size_t alen = 0, blen = 0;
        if ((st = gt_tok_merge_parts(L, json_array_get(merges, i), i, &a, &alen, &b, &blen))) break;
        char field[64];
        snprintf(field, sizeof field, "model.merges[%zu]", i);
        int32_t ia = gt_tok_strmap_get(&t->vocab, a, alen);
        int32_t ib = gt_tok_strmap_get(&t->vocab, b, blen);
        if (ia < 0 || ib < 0) {
            st = gt_tok_fail(L, GT_ERR_FORMAT, field, "token \"%.*s\" is not in model.vocab",
                             (int)(ia < 0 ? (alen > 64 ? 64 : alen) : (blen > 64 ? 64 : blen)),
                             ia < 0 ? a : b);
            break;
        }
        if (alen + blen > joined_cap) {
            joined_cap = 2 * (alen + blen);
            joined = gt_xrealloc(joined, joined_cap);
        }
        memcpy(joined, a, alen);
        memcpy(joined + alen, b, blen);
        int32_t merged = gt_tok_strmap_get(&t->vocab, joined, alen + blen);
        if (merged < 0) {
            int show = (int)(alen + blen > 64 ? 64 : alen + blen);
            st = gt_tok_fail(L, GT_ERR_FORMAT, field,
                             "the merged token \"%.*s\" is not in model.vocab", show, joined);
            break;
        }
        gt_tok_pairmap_put(&t->merges, ia, ib, (int32_t)i, merged);
    }
    free(joined);
    return st;
}

static gt_status gt_tok_load_model(gt_tok_loader *L, json_t *model)
{
    gt_tokenizer *t = L->t;
    if (!json_is_object(model))
        return gt_tok_fail(L, GT_ERR_FORMAT, "model", "expected an object with \"type\": \"BPE\"");
    const char *type = gt_tok_type(model);
    if (!type) return gt_tok_fail(L, GT_ERR_FORMAT, "model.type", "expected a string");
    if (strcmp(type, "BPE") != 0)
        return gt_tok_fail(L, GT_ERR_UNSUPPORTED, "model.type",
                           "\"%.64s\" is not supported (only byte-level \"BPE\")", type);
    GT_TRY(gt_tok_load_vocab(L, json_object_get(model, "vocab")));
    GT_TRY(gt_tok_load_merges(L, json_object_get(model, "merges")));

    json_t *dropout = json_object_get(model, "dropout");
    if (dropout && !json_is_null(dropout)) {
        if (!json_is_number(dropout) || json_number_value(dropout) < 0 ||
            json_number_value(dropout) > 1)
            return gt_tok_fail(L, GT_ERR_FORMAT, "model.dropout",
                               "expected null or a number in [0, 1]");
        if (json_number_value(dropout) > 0)
            return gt_tok_fail(L, GT_ERR_UNSUPPORTED, "model.dropout",
                               "BPE dropout (%g) is random; graphtrain tokenizes deterministically",
                               json_number_value(dropout));
    }
    const char *affix[2] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        json_t *v = json_object_get(model, affix[i]);
        if (!v || json_is_null(v) || (json_is_string(v) && json_string_length(v) == 0)) continue;
        char field[64];
        snprintf(field, sizeof field, "model.%s", affix[i]);
        return gt_tok_fail(L, json_is_string(v) ? GT_ERR_UNSUPPORTED : GT_ERR_FORMAT, field,
                           "only null is supported (byte-level BPE has no word affixes)");
    }
    bool byte_fallback = false;
    GT_TRY(gt_tok_get_bool(L, model, "fuse_unk", false, "model.fuse_unk", &t->fuse_unk));
    GT_TRY(gt_tok_get_bool(L, model, "ignore_merges", false, "model.ignore_merges",
                           &t->ignore_merges));
    GT_TRY(
        gt_tok_get_bool(L, model, "byte_fallback", false, "model.byte_fallback", &byte_fallback));
    if (byte_fallback)
        return gt_tok_fail(L, GT_ERR_UNSUPPORTED, "model.byte_fallback",
                           "byte fallback (<0x..> tokens) is not supported");
    t->unk_id = -1;
    json_t *unk = json_object_get(model, "unk_token");
    if (unk && !json_is_null(unk)) {
        if (!json_is_string(unk))
            return gt_tok_fail(L, GT_ERR_FORMAT, "model.unk_token", "expected null or a string");
        t->unk_id = gt_tok_strmap_get(&t->vocab, json_string_value(unk), json_string_length(unk));
        if (t->unk_id < 0)
            return gt_tok_fail(L, GT_ERR_FORMAT, "model.unk_token",
                               "\"%.64s\" is not in model.vocab", json_string_value(unk));
    }
    return GT_OK;
}

/* ---------------------------------------------------------------- added tokens */

/* The id Hugging Face gives an added token (AddedVocabulary::add_tokens): its model.vocab id
 * when it has one, else the next id after the vocab — vocab.len() while no added token is past
 * it, then the largest added id + 1. */
static int32_t gt_tok_hf_added_id(gt_tok_loader *L, const char *content, size_t len)
{
    int32_t id = gt_tok_strmap_get(&L->t->vocab, content, len);
    if (id >= 0) return id;
    int32_t vocab_n = (int32_t)L->t->vocab.n;
    if (L->max_added < 0) return vocab_n;
    return L->max_added >= vocab_n || vocab_n == 0 ? L->max_added + 1 : vocab_n;
}

static gt_status gt_tok_add_token(gt_tok_loader *L, const char *field, const char *content,
                                  size_t len, int32_t id, const gt_tok_added *flags)
{
    gt_tokenizer *t = L->t;
    if (len == 0) return gt_tok_fail(L, GT_ERR_FORMAT, field, "\"content\" is empty");
    if (gt_tok_strmap_get(&t->added_map, content, len) >= 0)
        return gt_tok_fail(L, GT_ERR_FORMAT, field, "\"%.64s\" is added twice", content);
    int32_t vocab_id = gt_tok_strmap_get(&t->vocab, content, len);
    int32_t expected = gt_tok_hf_added_id(L, content, len);
    if (id != expected)
        return gt_tok_fail(L, GT_ERR_FORMAT, field,
                           vocab_id >= 0 ? "\"%.64s\" has id %d but model.vocab gives it id %d"
                                         : "\"%.64s\" has id %d, but Hugging Face gives an added "
                                           "token outside model.vocab the next free id, %d",
                           content, id, expected);
    if (id >= GT_TOK_MAX_ID)
        return gt_tok_fail(L, GT_ERR_FORMAT, field, "too many tokens (id %d)", id);
    for (int k = 0; k < t->n_added; k++)
        if (t->added[k].id == id)
            return gt_tok_fail(L, GT_ERR_FORMAT, field,
                               "id %d is already the added token \"%.64s\"", id,
                               t->added_pool + t->added[k].off);
    int32_t e = vocab_id < 0 ? gt_tok_strmap_get(&L->vocab_ids, (const char *)&id, sizeof id) : -1;
    if (e >= 0)
        return gt_tok_fail(L, GT_ERR_FORMAT, field, "id %d of \"%.64s\" is model.vocab's \"%.*s\"",
                           id, content, (int)(t->vocab.key_len[e] > 64 ? 64 : t->vocab.key_len[e]),
                           t->vocab.pool + t->vocab.key_off[e]);
    t->added = gt_xrealloc(t->added, (size_t)(t->n_added + 1) * sizeof *t->added);
    t->added_pool = gt_xrealloc(t->added_pool, t->added_pool_len + len + 1);
    memcpy(t->added_pool + t->added_pool_len, content, len);
    gt_tok_added *a = &t->added[t->n_added++];
    *a = *flags;
    a->off = (uint32_t)t->added_pool_len;
    a->len = (uint32_t)len;
    a->id = id;
    t->added_pool_len += len;
    gt_tok_strmap_put(&t->added_map, content, len, id);
    if (id > L->max_id) L->max_id = id;
    if (id > L->max_added) L->max_added = id;
    return GT_OK;
}

static gt_status gt_tok_token_flags(gt_tok_loader *L, json_t *o, const char *field,
                                    bool special_def, gt_tok_added *f)
{
    memset(f, 0, sizeof *f);
    GT_TRY(gt_tok_get_bool(L, o, "single_word", false, field, &f->single_word));
    GT_TRY(gt_tok_get_bool(L, o, "lstrip", false, field, &f->lstrip));
    GT_TRY(gt_tok_get_bool(L, o, "rstrip", false, field, &f->rstrip));
    GT_TRY(gt_tok_get_bool(L, o, "special", special_def, field, &f->special));
    return gt_tok_get_bool(L, o, "normalized", !f->special, field, &f->normalized);
}

static gt_status gt_tok_load_added(gt_tok_loader *L, json_t *added)
{
    if (!added || json_is_null(added)) return GT_OK;
    if (!json_is_array(added))
        return gt_tok_fail(L, GT_ERR_FORMAT, "added_tokens", "expected an array");
    for (size_t i = 0; i < json_array_size(added); i++) {
        json_t *o = json_array_get(added, i);
        char field[64];
        snprintf(field, sizeof field, "added_tokens[%zu]", i);
        if (!json_is_object(o))
            return gt_tok_fail(L, GT_ERR_FORMAT, field, "expected an object {id, content, ...}");
        json_t *id = json_object_get(o, "id"), *content = json_object_get(o, "content");
        if (!json_is_integer(id) || json_integer_value(id) < 0 ||
            json_integer_value(id) >= GT_TOK_MAX_ID)
            return gt_tok_fail(L, GT_ERR_FORMAT, field, "\"id\" must be an integer in [0, %d)",
                               GT_TOK_MAX_ID);
        if (!json_is_string(content))
            return gt_tok_fail(L, GT_ERR_FORMAT, field, "\"content\" must be a string");
        gt_tok_added f;
        GT_TRY(gt_tok_token_flags(L, o, field, false, &f));
        GT_TRY(gt_tok_add_token(L, field, json_string_value(content), json_string_length(content),
                                (int32_t)json_integer_value(id), &f));
    }
    return GT_OK;
}

/* tokenizer_config.json's special tokens, added as Hugging Face's add_special_tokens does: an
 * existing added token is kept, a vocab token keeps its id, a new token gets the next id. */
static gt_status gt_tok_add_special(gt_tok_loader *L, const char *field, const char *content,
                                    size_t len, const gt_tok_added *flags)
{
    if (len == 0) return gt_tok_fail(L, GT_ERR_FORMAT, field, "the token is empty");
    if (gt_tok_strmap_get(&L->t->added_map, content, len) >= 0) return GT_OK;
    return gt_tok_add_token(L, field, content, len, gt_tok_hf_added_id(L, content, len), flags);
}

/* A config token value: "text", {"content": "text", ...} or null. */
static gt_status gt_tok_config_token(gt_tok_loader *L, json_t *v, const char *field,
                                     const char **content, size_t *len, gt_tok_added *flags)
{
    *content = NULL;
    memset(flags, 0, sizeof *flags);
    flags->special = true;
    if (!v || json_is_null(v)) return GT_OK;
    if (json_is_string(v)) {
        *content = json_string_value(v);
        *len = json_string_length(v);
        return GT_OK;
    }
    json_t *c = json_object_get(v, "content");
    if (!json_is_object(v) || !json_is_string(c))
        return gt_tok_fail(L, GT_ERR_FORMAT, field,
                           "expected a string or an object with a string \"content\"");
    GT_TRY(gt_tok_token_flags(L, v, field, true, flags));
    /* torchtitan reads "normalized" with default true for these objects */
    json_t *norm = json_object_get(v, "normalized");
    if (!norm || json_is_null(norm)) flags->normalized = true;
    *content = json_string_value(c);
    *len = json_string_length(c);
    return GT_OK;
}

static gt_status gt_tok_load_config(gt_tok_loader *L, json_t *cfg)
{
    gt_tokenizer *t = L->t;
    if (!json_is_object(cfg)) return gt_tok_fail(L, GT_ERR_FORMAT, "(root)", "expected an object");
    static const char *keys[] = {"bos_token", "eos_token", "pad_token", "unk_token",
                                 "sep_token", "cls_token", "mask_token"};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
        const char *content;
        size_t len;
        gt_tok_added f;
        GT_TRY(gt_tok_config_token(L, json_object_get(cfg, keys[i]), keys[i], &content, &len, &f));
        if (!content) continue;
        GT_TRY(gt_tok_add_special(L, keys[i], content, len, &f));
        if (i < 2) {
            int32_t id = gt_tokenizer_token_to_id(t, content, len);
            if (i == 0)
                t->bos_id = id;
            else
                t->eos_id = id;
        }
    }
    json_t *dec = json_object_get(cfg, "added_tokens_decoder");
    if (dec && !json_is_null(dec)) {
        if (!json_is_object(dec))
            return gt_tok_fail(L, GT_ERR_FORMAT, "added_tokens_decoder", "expected an object");
        const char *key;
        json_t *v;
        json_object_foreach(dec, key, v)
        {
            char field[96];
            snprintf(field, sizeof field, "added_tokens_decoder[\"%.48s\"]", key);
            if (!json_is_object(v))
                return gt_tok_fail(L, GT_ERR_FORMAT, field, "expected an object with \"content\"");
            const char *content;
            size_t len;
            gt_tok_added f;
            GT_TRY(gt_tok_config_token(L, v, field, &content, &len, &f));
            GT_TRY(gt_tok_add_special(L, field, content, len, &f));
        }
    }
    return GT_OK;
}

/* ---------------------------------------------------------------- pre-tokenizer */

static gt_status gt_tok_add_step(gt_tok_loader *L, const char *field, gt_tok_step_kind kind,
                                 gt_tok_behavior behavior, bool invert, pcre2_code *re)
{
    gt_tokenizer *t = L->t;
    if (t->n_steps == GT_TOK_MAX_STEPS) {
        if (re) pcre2_code_free(re);
        return gt_tok_fail(L, GT_ERR_UNSUPPORTED, field, "more than %d pre-tokenizer steps",
                           GT_TOK_MAX_STEPS);
    }
    gt_tok_step *st = &t->steps[t->n_steps++];
    memset(st, 0, sizeof *st);
    st->kind = kind;
    st->behavior = behavior;
    st->invert = invert;
    st->re = re;
    if (re) st->md = pcre2_match_data_create_from_pattern(re, NULL);
    GT_CHECK(!re || st->md);
    return GT_OK;
}

static gt_status gt_tok_load_pretok(gt_tok_loader *L, json_t *p, const char *field, int depth)
{
    if (!p || json_is_null(p)) return GT_OK;
    if (depth > GT_TOK_MAX_DEPTH)
        return gt_tok_fail(L, GT_ERR_UNSUPPORTED, field, "nested deeper than %d", GT_TOK_MAX_DEPTH);
    const char *type = json_is_object(p) ? gt_tok_type(p) : NULL;
    if (!type) return gt_tok_fail(L, GT_ERR_FORMAT, field, "expected an object with a \"type\"");
    char sub[160];
    if (strcmp(type, "Sequence") == 0) {
        json_t *list = json_object_get(p, "pretokenizers");
        if (!json_is_array(list))
            return gt_tok_fail(L, GT_ERR_FORMAT, field, "\"pretokenizers\" must be an array");
        for (size_t i = 0; i < json_array_size(list); i++) {
            snprintf(sub, sizeof sub, "%.120s.pretokenizers[%zu]", field, i);
            GT_TRY(gt_tok_load_pretok(L, json_array_get(list, i), sub, depth + 1));
        }
        return GT_OK;
    }
    if (strcmp(type, "Split") == 0) {
        json_t *pat = json_object_get(p, "pattern");
        json_t *rx = json_object_get(pat, "Regex"), *lit = json_object_get(pat, "String");
        snprintf(sub, sizeof sub, "%.120s.pattern", field);
        if (!json_is_object(pat) || json_object_size(pat) != 1 ||
            !(json_is_string(rx) || json_is_string(lit)))
            return gt_tok_fail(L, GT_ERR_FORMAT, sub,
                               "expected {\"Regex\": \"...\"} or {\"String\": \"...\"}");
        static const char *names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext",
                                      "Contiguous"};
        json_t *beh = json_object_get(p, "behavior");
        int b = -1;
        for (int i = 0; i < 5 && json_is_string(beh); i++)
            if (strcmp(json_string_value(beh), names[i]) == 0) b = i;
        if (b < 0)
            return gt_tok_fail(L, GT_ERR_FORMAT, field,
                               "\"behavior\" must be one of Removed, Isolated, "
                               "MergedWithPrevious, MergedWithNext, Contiguous");
        bool invert = false;
        GT_TRY(gt_tok_get_bool(L, p, "invert", false, field, &invert));
        pcre2_code *re = rx ? gt_tok_compile_regex(json_string_value(rx), json_string_length(rx),
                                                   L->name, sub, L->err)
                            : gt_tok_compile_literal(json_string_value(lit),
                                                     json_string_length(lit), L->name, sub, L->err);
        if (!re) return L->err ? L->err->code : GT_ERR_FORMAT;
        return gt_tok_add_step(L, field, GT_TOK_SPLIT, (gt_tok_behavior)b, invert, re);
    }
    if (strcmp(type, "Digits") == 0) {
        /* Rust's char::is_numeric is \p{N}; each digit is its own match */
        bool individual = false;
        GT_TRY(gt_tok_get_bool(L, p, "individual_digits", false, field, &individual));
        pcre2_code *re = gt_tok_compile_regex("\\p{N}", 5, L->name, field, L->err);
        if (!re) return GT_ERR_INTERNAL;
        return gt_tok_add_step(L, field, GT_TOK_SPLIT,
                               individual ? GT_TOK_ISOLATED : GT_TOK_CONTIGUOUS, false, re);
    }
    if (strcmp(type, "ByteLevel") == 0) {
        bool prefix = true, use_regex = true;
        GT_TRY(gt_tok_get_bool(L, p, "add_prefix_space", true, field, &prefix));
        GT_TRY(gt_tok_get_bool(L, p, "use_regex", true, field, &use_regex));
        if (prefix) GT_TRY(gt_tok_add_step(L, field, GT_TOK_PREFIX_SPACE, 0, false, NULL));
        if (use_regex) {
            /* GPT-2's pre-tokenizer regex, which ByteLevel applies when use_regex is true */
            static const char gpt2[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| "
                                       "?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
            pcre2_code *re = gt_tok_compile_regex(gpt2, sizeof gpt2 - 1, L->name, field, L->err);
            if (!re) return GT_ERR_INTERNAL;
            GT_TRY(gt_tok_add_step(L, field, GT_TOK_SPLIT, GT_TOK_ISOLATED, false, re));
        }
        return gt_tok_add_step(L, field, GT_TOK_BYTES_TO_CHARS, 0, false, NULL);
    }
    return gt_tok_fail(L, GT_ERR_UNSUPPORTED, field,
                       "type \"%.64s\" is not supported (Sequence, Split, Digits, ByteLevel are)",
                       type);
}

/* ---------------------------------------------------------------- post-processor, decoder */

static gt_status gt_tok_load_template(gt_tok_loader *L, json_t *p, const char *field)
{
    gt_tokenizer *t = L->t;
    if (++L->n_templates > 1)
        return gt_tok_fail(L, GT_ERR_UNSUPPORTED, field, "more than one TemplateProcessing");
    json_t *single = json_object_get(p, "single"), *specials = json_object_get(p, "special_tokens");
    char sub[200];
    snprintf(sub, sizeof sub, "%.120s.single", field);
    if (!json_is_array(single)) return gt_tok_fail(L, GT_ERR_FORMAT, sub, "expected an array");
    size_t n = json_array_size(single);
    t->template_items = gt_xcalloc(n + 1, sizeof *t->template_items);
    t->has_template = true;
    size_t n_ids = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *item = json_array_get(single, i);
        snprintf(sub, sizeof sub, "%.120s.single[%zu]", field, i);
        json_t *seq = json_object_get(item, "Sequence"),
               *sp = json_object_get(item, "SpecialToken");
        json_t *id = json_object_get(seq ? seq : sp, "id");
        if (!json_is_object(item) || json_object_size(item) != 1 || !(seq || sp) ||
            !json_is_string(id))
            return gt_tok_fail(L, GT_ERR_FORMAT, sub,
                               "expected {\"Sequence\": {\"id\": \"A\"}} or "
                               "{\"SpecialToken\": {\"id\": NAME}}");
        gt_tok_template_item *it = &t->template_items[t->n_template_items++];
        if (seq) {
            if (strcmp(json_string_value(id), "A") != 0)
                return gt_tok_fail(L, GT_ERR_FORMAT, sub,
                                   "a single-sequence template can only hold sequence \"A\"");
            it->is_sequence = true;
            continue;
        }
        json_t *spec = json_object_get(specials, json_string_value(id));
        json_t *ids = json_object_get(spec, "ids");
        if (!json_is_array(ids))
            return gt_tok_fail(L, GT_ERR_FORMAT, sub,
                               "special token \"%.64s\" has no \"ids\" array in special_tokens",
                               json_string_value(id));
        it->off = (uint32_t)n_ids;
        it->n = (uint32_t)json_array_size(ids);
        t->template_ids = gt_xrealloc(t->template_ids, (n_ids + it->n + 1) * sizeof(int32_t));
        for (size_t k = 0; k < it->n; k++) {
            json_t *v = json_array_get(ids, k);
            if (!json_is_integer(v) || json_integer_value(v) < 0 ||
                json_integer_value(v) > L->max_id)
                return gt_tok_fail(L, GT_ERR_FORMAT, sub,
                                   "special token \"%.64s\": ids[%zu] is not a token id of this "
                                   "tokenizer",
                                   json_string_value(id), k);
            t->template_ids[n_ids++] = (int32_t)json_integer_value(v);
        }
    }
    return GT_OK;
}

static gt_status gt_tok_load_post(gt_tok_loader *L, json_t *p, const char *field, int depth)
{
    if (!p || json_is_null(p)) return GT_OK;
    const char *type = json_is_object(p) ? gt_tok_type(p) : NULL;
    if (!type) return gt_tok_fail(L, GT_ERR_FORMAT, field, "expected an object with a \"type\"");
    if (strcmp(type, "ByteLevel") == 0) return GT_OK; /* offsets only; ids unchanged */
    if (strcmp(type, "TemplateProcessing") == 0) return gt_tok_load_template(L, p, field);
    if (strcmp(type, "Sequence") == 0 && depth < GT_TOK_MAX_DEPTH) {
        json_t *list = json_object_get(p, "processors");
        if (!json_is_array(list))
            return gt_tok_fail(L, GT_ERR_FORMAT, field, "\"processors\" must be an array");
        for (size_t i = 0; i < json_array_size(list); i++) {
            char sub[160];
            snprintf(sub, sizeof sub, "%.120s.processors[%zu]", field, i);
            GT_TRY(gt_tok_load_post(L, json_array_get(list, i), sub, depth + 1));
        }
        return GT_OK;
    }
    return gt_tok_fail(L, GT_ERR_UNSUPPORTED, field,
                       "type \"%.64s\" is not supported (ByteLevel, TemplateProcessing, Sequence "
                       "are)",
                       type);
}

static gt_status gt_tok_load_decoder(gt_tok_loader *L, json_t *d, const char *field, int depth)
{
    if (!d || json_is_null(d)) return GT_OK;
    const char *type = json_is_object(d) ? gt_tok_type(d) : NULL;
    if (!type) return gt_tok_fail(L, GT_ERR_FORMAT, field, "expected an object with a \"type\"");
    if (strcmp(type, "ByteLevel") == 0) {
        L->t->byte_level_decoder = true;
        return GT_OK;
    }
    if (strcmp(type, "Sequence") == 0 && depth < GT_TOK_MAX_DEPTH) {
        json_t *list = json_object_get(d, "decoders");
        if (!json_is_array(list))
            return gt_tok_fail(L, GT_ERR_FORMAT, field, "\"decoders\" must be an array");
        for (size_t i = 0; i < json_array_size(list); i++) {
            char sub[160];
            snprintf(sub, sizeof sub, "%.120s.decoders[%zu]", field, i);
            GT_TRY(gt_tok_load_decoder(L, json_array_get(list, i), sub, depth + 1));
        }
        return GT_OK;
    }
    return gt_tok_fail(L, GT_ERR_UNSUPPORTED, field,
                       "type \"%.64s\" is not supported (ByteLevel is)", type);
}

/* ---------------------------------------------------------------- assembly */

static void gt_tok_build_id_tables(gt_tokenizer *t, int32_t max_id)
{
    t->n_ids = max_id + 1;
    size_t n = (size_t)t->n_ids;
    t->id_off = gt_xmalloc(n * sizeof *t->id_off);
    t->id_len = gt_xmalloc(n * sizeof *t->id_len);
    for (size_t i = 0; i < n; i++)
        t->id_len[i] = UINT32_MAX, t->id_off[i] = 0;
    t->id_pool = gt_xmalloc(t->vocab.pool_len + t->added_pool_len + 1);
    memcpy(t->id_pool, t->vocab.pool, t->vocab.pool_len);
    for (size_t e = 0; e < t->vocab.n; e++) {
        t->id_off[t->vocab.value[e]] = t->vocab.key_off[e];
        t->id_len[t->vocab.value[e]] = t->vocab.key_len[e];
    }
    size_t o = t->vocab.pool_len;
    if (t->added_pool_len) memcpy(t->id_pool + o, t->added_pool, t->added_pool_len);
    for (int k = 0; k < t->n_added; k++) {
        const gt_tok_added *a = &t->added[k];
        if (t->id_len[a->id] != UINT32_MAX) continue; /* also a vocab token: same string */
        t->id_off[a->id] = (uint32_t)(o + a->off);
        t->id_len[a->id] = a->len;
    }
    t->id_pool_len = o + t->added_pool_len;
}

/* Without tokenizer_config.json: BOS/EOS from special added tokens with well-known names. */
static void gt_tok_guess_bos_eos(gt_tokenizer *t)
{
    static const char *bos[] = {"<|begin_of_text|>", "<s>", "<|bos|>", "<bos>", "[BOS]"};
    static const char *eos[] = {"<|end_of_text|>", "</s>",  "<|endoftext|>",
                                "<|eos|>",         "<eos>", "[EOS]"};
    for (size_t i = 0; i < sizeof bos / sizeof *bos && t->bos_id < 0; i++)
        for (int k = 0; k < t->n_added; k++)
            if (t->added[k].special && t->added[k].len == strlen(bos[i]) &&
                memcmp(t->added_pool + t->added[k].off, bos[i], t->added[k].len) == 0)
                t->bos_id = t->added[k].id;
    for (size_t i = 0; i < sizeof eos / sizeof *eos && t->eos_id < 0; i++)
        for (int k = 0; k < t->n_added; k++)
            if (t->added[k].special && t->added[k].len == strlen(eos[i]) &&
                memcmp(t->added_pool + t->added[k].off, eos[i], t->added[k].len) == 0)
                t->eos_id = t->added[k].id;
}

static gt_status gt_tok_load_root(gt_tok_loader *L, json_t *root, json_t *cfg,
                                  const char *config_name)
{
    gt_tokenizer *t = L->t;
    if (!json_is_object(root))
        return gt_tok_fail(L, GT_ERR_FORMAT, "(root)", "expected a JSON object");
    const char *unsupported[] = {"truncation", "padding", "normalizer"};
    for (int i = 0; i < 3; i++) {
        json_t *v = json_object_get(root, unsupported[i]);
        if (v && !json_is_null(v))
            return gt_tok_fail(L, GT_ERR_UNSUPPORTED, unsupported[i],
                               "only null is supported (got a %s)",
                               json_is_object(v) && gt_tok_type(v) ? gt_tok_type(v) : "value");
    }
    json_t *model = json_object_get(root, "model");
    if (!model) return gt_tok_fail(L, GT_ERR_FORMAT, "model", "missing");
    GT_TRY(gt_tok_load_model(L, model));
    GT_TRY(gt_tok_load_added(L, json_object_get(root, "added_tokens")));
    if (cfg) {
        const char *name = L->name;
        L->name = config_name;
        gt_status st = gt_tok_load_config(L, cfg);
        L->name = name;
        GT_TRY(st);
    }
    GT_TRY(gt_tok_load_pretok(L, json_object_get(root, "pre_tokenizer"), "pre_tokenizer", 0));
    GT_TRY(gt_tok_load_post(L, json_object_get(root, "post_processor"), "post_processor", 0));
    GT_TRY(gt_tok_load_decoder(L, json_object_get(root, "decoder"), "decoder", 0));

    gt_tok_build_id_tables(t, L->max_id);
    gt_tok_finish_tables(t);
    for (int i = 0; i < t->n_template_items; i++) {
        const gt_tok_template_item *it = &t->template_items[i];
        for (uint32_t k = 0; !it->is_sequence && k < it->n; k++)
            if (t->id_len[t->template_ids[it->off + k]] == UINT32_MAX)
                return gt_tok_fail(L, GT_ERR_FORMAT, "post_processor",
                                   "template id %d is not a token of this tokenizer",
                                   t->template_ids[it->off + k]);
    }
    for (int k = 0; k < t->n_added; k++) {
        if (!t->added[k].single_word) continue;
        /* Rust regex's Unicode \w, which Hugging Face uses to decide single_word */
        static const char word[] = "[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\p{Join_Control}]";
        t->word_re = gt_tok_compile_regex(word, sizeof word - 1, L->name, "added_tokens", L->err);
        GT_CHECK(t->word_re);
        t->word_md = pcre2_match_data_create_from_pattern(t->word_re, NULL);
        break;
    }
    if (!cfg) gt_tok_guess_bos_eos(t);

    /* torchtitan's test for "the tokenizer adds BOS/EOS itself": encode("") holds them. */
    gt_token_ids empty = {0};
    GT_TRY(gt_tokenizer_encode(t, "", 0, true, &empty, L->err));
    for (size_t i = 0; i < empty.n; i++) {
        if (empty.ids[i] == t->bos_id) t->post_adds_bos = true;
        if (empty.ids[i] == t->eos_id) t->post_adds_eos = true;
    }
    gt_token_ids_free(&empty);
    return GT_OK;
}

static gt_status gt_tok_load_buffers(const char *json, size_t json_len, const char *config_json,
                                     size_t config_len, const char *name, const char *config_name,
                                     gt_tokenizer **out, gt_error *err)
{
    *out = NULL;
    json_t *root = gt_tok_parse(json, json_len, name, err);
    if (!root) return GT_ERR_FORMAT;
    json_t *cfg = NULL;
    if (config_json) {
        cfg = gt_tok_parse(config_json, config_len, config_name, err);
        if (!cfg) {
            json_decref(root);
            return GT_ERR_FORMAT;
        }
    }
    gt_tokenizer *t = gt_xcalloc(1, sizeof *t);
    t->name = gt_xstrdup(name);
    t->bos_id = t->eos_id = t->unk_id = -1;
    t->match_ctx = pcre2_match_context_create(NULL);
    GT_CHECK(t->match_ctx);
    /* Bounds backtracking so a pathological pattern fails instead of hanging. */
    pcre2_set_match_limit(t->match_ctx, 10000000);
    gt_tok_loader L = {.t = t, .name = t->name, .err = err, .max_id = -1, .max_added = -1};
    gt_status st = gt_tok_load_root(&L, root, cfg, config_name);
    gt_tok_strmap_free(&L.vocab_ids);
    json_decref(root);
    if (cfg) json_decref(cfg);
    if (st != GT_OK) {
        gt_tokenizer_free(t);
        return st;
    }
    *out = t;
    return GT_OK;
}

gt_status gt_tokenizer_load_json(const char *json, size_t json_len, const char *config_json,
                                 size_t config_len, const char *name, gt_tokenizer **out,
                                 gt_error *err)
{
    char config_name[4096];
    snprintf(config_name, sizeof config_name, "%s (tokenizer_config.json)", name);
    return gt_tok_load_buffers(json, json_len, config_json, config_len, name, config_name, out,
                               err);
}

gt_status gt_tokenizer_load(const char *path, gt_tokenizer **out, gt_error *err)
{
    *out = NULL;
    struct stat sb;
    if (stat(path, &sb) != 0)
        return gt_error_set(err, GT_ERR_IO, "tokenizer %s: %s", path, strerror(errno));
    char json_path[4096], config_path[4096] = "";
    bool is_dir = S_ISDIR(sb.st_mode), have_config = false;
    if (is_dir) {
        snprintf(json_path, sizeof json_path, "%s/tokenizer.json", path);
        snprintf(config_path, sizeof config_path, "%s/tokenizer_config.json", path);
        have_config = stat(config_path, &sb) == 0;
    } else {
        /* FOLDER/tokenizer.json, the form the README shows: its tokenizer_config.json beside it
         * names BOS and EOS just as the folder form's does */
        snprintf(json_path, sizeof json_path, "%s", path);
        const char *slash = strrchr(path, '/');
        int dir_len = slash ? (int)(slash - path) : 0;
        snprintf(config_path, sizeof config_path, "%.*s%stokenizer_config.json", dir_len, path,
                 slash ? "/" : "");
        have_config = stat(config_path, &sb) == 0 && S_ISREG(sb.st_mode);
        if (!have_config) config_path[0] = 0;
    }
    char *json = NULL, *config = NULL;
    size_t json_len = 0, config_len = 0;
    GT_TRY(gt_train_read_file(json_path, &json, &json_len, err));
    if (have_config) {
        gt_status st = gt_train_read_file(config_path, &config, &config_len, err);
        if (st != GT_OK) {
            free(json);
            return st;
        }
    }
    gt_status st =
        gt_tok_load_buffers(json, json_len, config, config_len, json_path, config_path, out, err);
    free(json);
    free(config);
    if (st == GT_OK && (*out)->bos_id < 0 && (*out)->eos_id < 0)
        gt_log(GT_LOG_WARN,
               "tokenizer %s: no BOS or EOS token is known (%s, and no special added token "
               "has a usual name): documents are joined with nothing between them",
               json_path,
               have_config ? "its tokenizer_config.json names neither"
                           : "no tokenizer_config.json beside it");
    return st;
}
