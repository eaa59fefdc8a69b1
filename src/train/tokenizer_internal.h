/* tokenizer_internal.h — the tokenizer's private state, shared by tokenizer_load.c (reads
 * tokenizer.json), tokenizer.c (encode/decode) and tokenizer_util.c (hash maps, UTF-8). */
#ifndef GRAPHTRAIN_TOKENIZER_INTERNAL_H
#define GRAPHTRAIN_TOKENIZER_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "graphtrain/gt_tokenizer.h"

/* Ids are kept below 2^24 so the id-indexed tables stay small (llama3: 128256, DeepSeek-V3:
 * 129280) and a hostile file cannot ask for gigabytes. */
#define GT_TOK_MAX_ID (1 << 24)
/* Sequence nesting and total step count of a pre_tokenizer / post_processor. */
#define GT_TOK_MAX_DEPTH 8
#define GT_TOK_MAX_STEPS 32
/* BPE cache: words longer than this are not cached; the cache is cleared when it holds this
 * many words (results never depend on the cache). */
#define GT_TOK_CACHE_MAX_WORD 256
#define GT_TOK_CACHE_MAX_WORDS 65536

/* ---------------------------------------------------------------- hash maps */

/* Byte string → int32 with its own key pool. Open addressing, linear probing. */
typedef struct {
    uint32_t *slots; /* entry index + 1; 0 = empty */
    size_t n_slots;  /* power of two, >= 2 * n */
    uint64_t *hash;
    uint32_t *key_off, *key_len;
    int32_t *value;
    size_t n, cap;
    char *pool;
    size_t pool_len, pool_cap;
} gt_tok_strmap;

int32_t gt_tok_strmap_get(const gt_tok_strmap *m, const char *key, size_t len);
/* Inserts or overwrites. */
void gt_tok_strmap_put(gt_tok_strmap *m, const char *key, size_t len, int32_t value);
void gt_tok_strmap_clear(gt_tok_strmap *m);
void gt_tok_strmap_free(gt_tok_strmap *m);

/* (left id, right id) → (rank, merged id): the BPE merge table. */
typedef struct {
    uint64_t *keys; /* (left << 32 | right) + 1; 0 = empty */
    int32_t *rank, *merged;
    size_t n_slots, n;
} gt_tok_pairmap;

bool gt_tok_pairmap_get(const gt_tok_pairmap *m, int32_t left, int32_t right, int32_t *rank,
                        int32_t *merged);
void gt_tok_pairmap_put(gt_tok_pairmap *m, int32_t left, int32_t right, int32_t rank,
                        int32_t merged);
void gt_tok_pairmap_free(gt_tok_pairmap *m);

/* ---------------------------------------------------------------- UTF-8 */

/* Length of the UTF-8 sequence starting with byte b (1 for a stray byte, so loops advance). */
static inline size_t gt_utf8_len(unsigned char b)
{
    return b < 0x80 ? 1 : b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC0 ? 2 : 1;
}
/* Strict validation (no overlongs, surrogates or code points past U+10FFFF). On failure
 * *bad_offset is the offset of the first invalid byte. */
bool gt_utf8_valid(const char *s, size_t n, size_t *bad_offset);
/* Decodes the valid sequence at s (n bytes left); returns the code point, *len its length. */
uint32_t gt_utf8_decode(const char *s, size_t n, size_t *len);
/* Writes code point cp (< 0x110000) as UTF-8; returns the length. */
size_t gt_utf8_encode(uint32_t cp, char *out);
/* Unicode White_Space (what Rust's char::is_whitespace and Oniguruma's \s match). */
bool gt_unicode_is_white_space(uint32_t cp);

/* GPT-2's byte ↔ printable character map: bytes 33–126, 161–172, 174–255 map to themselves,
 * the other 68 bytes to U+0100 + k in byte order. */
uint32_t gt_byte_level_char(uint8_t byte);
/* The byte of a code point, or -1 when cp is outside the 256-character alphabet. */
int gt_byte_level_byte(uint32_t cp);

/* ---------------------------------------------------------------- the tokenizer */

typedef enum {
    GT_TOK_SPLIT,         /* regex split with a behavior (Split, Digits, ByteLevel's regex) */
    GT_TOK_PREFIX_SPACE,  /* ByteLevel add_prefix_space: " " in front unless there is one */
    GT_TOK_BYTES_TO_CHARS /* ByteLevel: each byte → its printable character */
} gt_tok_step_kind;

typedef enum {
    GT_TOK_REMOVED,
    GT_TOK_ISOLATED,
    GT_TOK_MERGED_WITH_PREVIOUS,
    GT_TOK_MERGED_WITH_NEXT,
    GT_TOK_CONTIGUOUS
} gt_tok_behavior;

typedef struct {
    gt_tok_step_kind kind;
    gt_tok_behavior behavior;
    bool invert;
    pcre2_code *re;
    pcre2_match_data *md;
    char *scratch; /* the transformed piece handed to the next step */
    size_t scratch_cap;
} gt_tok_step;

typedef struct {
    uint32_t off, len; /* content in added_pool */
    int32_t id;
    bool single_word, lstrip, rstrip, normalized, special;
} gt_tok_added;

/* Added tokens of one matching pass (non-normalized, then normalized), ordered by first byte
 * then by decreasing length so the first hit at a position is the longest. */
typedef struct {
    int32_t *order; /* indices into added */
    int n;
    int32_t first[257]; /* order[first[b] .. first[b + 1]) start with byte b */
} gt_tok_added_set;

typedef struct {
    bool is_sequence; /* the encoded text ($A); otherwise ids[off .. off + n) */
    uint32_t off, n;
} gt_tok_template_item;

struct gt_tokenizer {
    char *name;
    gt_tok_strmap vocab; /* model.vocab */
    int32_t n_ids;       /* largest id + 1 */
    /* id → token string (id_len UINT32_MAX: unused id) and id → decoded bytes */
    char *id_pool, *dec_pool;
    uint32_t *id_off, *id_len, *dec_off, *dec_len;
    size_t id_pool_len, dec_pool_len;

    gt_tok_pairmap merges;
    bool ignore_merges, fuse_unk;
    int32_t unk_id; /* -1: unknown characters are dropped */

    gt_tok_added *added;
    int n_added;
    char *added_pool;
    size_t added_pool_len;
    gt_tok_strmap added_map; /* content → id */
    gt_tok_added_set sets[2];
    pcre2_code *word_re; /* Rust regex's \w, for single_word */
    pcre2_match_data *word_md;

    gt_tok_step steps[GT_TOK_MAX_STEPS];
    int n_steps;
    pcre2_match_context *match_ctx;

    gt_tok_template_item *template_items;
    int n_template_items;
    int32_t *template_ids;
    bool has_template;

    bool byte_level_decoder;
    int32_t bos_id, eos_id;
    bool post_adds_bos, post_adds_eos;

    /* BPE cache: word → offset into cache_ids of [count, id...] */
    gt_tok_strmap cache;
    int32_t *cache_ids;
    size_t cache_len, cache_cap;
    /* BPE work arrays, grown as needed */
    struct gt_tok_symbol *symbols;
    struct gt_tok_merge *heap;
    size_t symbols_cap, heap_cap;
    gt_token_ids scratch_ids;
};

/* Compiles a Hugging Face (Oniguruma) pattern with PCRE2 (UTF, UCP), \s and \S rewritten to
 * White_Space. NULL with err set (naming field) on a bad pattern. */
pcre2_code *gt_tok_compile_regex(const char *pattern, size_t len, const char *name,
                                 const char *field, gt_error *err);
/* Compiles a literal (Split's String pattern) as an escaped regex, as Hugging Face does. */
pcre2_code *gt_tok_compile_literal(const char *literal, size_t len, const char *name,
                                   const char *field, gt_error *err);

/* Parses JSON text (jansson; NUL characters allowed in strings and keys). NULL with err set
 * (naming `name`, line and column) on a syntax error. Opaque here to keep jansson out of the
 * header: the result is a json_t *. */
struct json_t;
struct json_t *gt_tok_parse(const char *text, size_t len, const char *name, gt_error *err);

/* Builds decode tables and added-token sets once the vocab, added tokens and decoder are known
 * (tokenizer_load.c calls it last). */
void gt_tok_finish_tables(gt_tokenizer *t);

#endif
