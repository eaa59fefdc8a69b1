/* tokenizer_util.c — hash maps, UTF-8, the byte-level alphabet and regex compilation for the
 * tokenizer. */
#include <stdlib.h>
#include <string.h>

#include "train/tokenizer_internal.h"

/* ---------------------------------------------------------------- string map */

static size_t gt_tok_probe_start(uint64_t h, size_t n_slots)
{
    return (size_t)h & (n_slots - 1);
}

static void gt_tok_strmap_rehash(gt_tok_strmap *m, size_t n_slots)
{
    free(m->slots);
    m->slots = gt_xcalloc(n_slots, sizeof *m->slots);
    m->n_slots = n_slots;
    for (size_t e = 0; e < m->n; e++) {
        size_t i = gt_tok_probe_start(m->hash[e], n_slots);
        while (m->slots[i])
            i = (i + 1) & (n_slots - 1);
        m->slots[i] = (uint32_t)e + 1;
    }
}

int32_t gt_tok_strmap_get(const gt_tok_strmap *m, const char *key, size_t len)
{
    if (m->n == 0) return -1;
    uint64_t h = gt_hash64(key, len, 0);
    for (size_t i = gt_tok_probe_start(h, m->n_slots);; i = (i + 1) & (m->n_slots - 1)) {
        uint32_t s = m->slots[i];
        if (!s) return -1;
        size_t e = s - 1;
        if (m->hash[e] == h && m->key_len[e] == len &&
            memcmp(m->pool + m->key_off[e], key, len) == 0)
            return m->value[e];
    }
}

void gt_tok_strmap_put(gt_tok_strmap *m, const char *key, size_t len, int32_t value)
{
    GT_CHECK(len < UINT32_MAX);
    uint64_t h = gt_hash64(key, len, 0);
    if (m->n_slots) {
        for (size_t i = gt_tok_probe_start(h, m->n_slots);; i = (i + 1) & (m->n_slots - 1)) {
            uint32_t s = m->slots[i];
            if (!s) break;
            size_t e = s - 1;
            if (m->hash[e] == h && m->key_len[e] == len &&
                memcmp(m->pool + m->key_off[e], key, len) == 0) {
                m->value[e] = value;
                return;
            }
        }
    }
    if (m->n == m->cap) {
        m->cap = m->cap ? 2 * m->cap : 64;
        m->hash = gt_xrealloc(m->hash, m->cap * sizeof *m->hash);
        m->key_off = gt_xrealloc(m->key_off, m->cap * sizeof *m->key_off);
        m->key_len = gt_xrealloc(m->key_len, m->cap * sizeof *m->key_len);
        m->value = gt_xrealloc(m->value, m->cap * sizeof *m->value);
    }
    if (m->pool_len + len + 1 > m->pool_cap) {
        while (m->pool_len + len + 1 > m->pool_cap)
            m->pool_cap = m->pool_cap ? 2 * m->pool_cap : 1024;
        m->pool = gt_xrealloc(m->pool, m->pool_cap);
    }
    GT_CHECK(m->pool_len + len < UINT32_MAX);
    if (len) memcpy(m->pool + m->pool_len, key, len);
    size_t e = m->n++;
    m->hash[e] = h;
    m->key_off[e] = (uint32_t)m->pool_len;
    m->key_len[e] = (uint32_t)len;
    m->value[e] = value;
    m->pool_len += len;
    if (2 * m->n > m->n_slots) {
        gt_tok_strmap_rehash(m, m->n_slots ? 2 * m->n_slots : 128);
        return;
    }
    size_t i = gt_tok_probe_start(h, m->n_slots);
    while (m->slots[i])
        i = (i + 1) & (m->n_slots - 1);
    m->slots[i] = (uint32_t)e + 1;
}

void gt_tok_strmap_clear(gt_tok_strmap *m)
{
    if (m->slots) memset(m->slots, 0, m->n_slots * sizeof *m->slots);
    m->n = 0;
    m->pool_len = 0;
}

void gt_tok_strmap_free(gt_tok_strmap *m)
{
    free(m->slots);
    free(m->hash);
    free(m->key_off);
    free(m->key_len);
    free(m->value);
    free(m->pool);
    memset(m, 0, sizeof *m);
}

/* ---------------------------------------------------------------- pair map */

/* splitmix64's finalizer: spreads the two ids over all 64 bits. */
static uint64_t gt_tok_mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

static uint64_t gt_tok_pair_key(int32_t left, int32_t right)
{
    return (((uint64_t)(uint32_t)left << 32) | (uint32_t)right) + 1;
}

bool gt_tok_pairmap_get(const gt_tok_pairmap *m, int32_t left, int32_t right, int32_t *rank,
                        int32_t *merged)
{
    if (m->n == 0) return false;
    uint64_t key = gt_tok_pair_key(left, right);
    for (size_t i = gt_tok_mix64(key) & (m->n_slots - 1);; i = (i + 1) & (m->n_slots - 1)) {
        if (m->keys[i] == 0) return false;
        if (m->keys[i] == key) {
            *rank = m->rank[i];
            *merged = m->merged[i];
            return true;
        }
    }
}

static void gt_tok_pairmap_insert(gt_tok_pairmap *m, uint64_t key, int32_t rank, int32_t merged)
{
    size_t i = gt_tok_mix64(key) & (m->n_slots - 1);
    while (m->keys[i] != 0 && m->keys[i] != key)
        i = (i + 1) & (m->n_slots - 1);
    if (m->keys[i] == 0) m->n++;
    m->keys[i] = key;
    m->rank[i] = rank;
    m->merged[i] = merged;
}

void gt_tok_pairmap_put(gt_tok_pairmap *m, int32_t left, int32_t right, int32_t rank,
                        int32_t merged)
{
    if (2 * (m->n + 1) > m->n_slots) {
        gt_tok_pairmap old = *m;
        m->n_slots = old.n_slots ? 2 * old.n_slots : 256;
        m->n = 0;
        m->keys = gt_xcalloc(m->n_slots, sizeof *m->keys);
        m->rank = gt_xmalloc(m->n_slots * sizeof *m->rank);
        m->merged = gt_xmalloc(m->n_slots * sizeof *m->merged);
        for (size_t i = 0; i < old.n_slots; i++)
            if (old.keys[i]) gt_tok_pairmap_insert(m, old.keys[i], old.rank[i], old.merged[i]);
        gt_tok_pairmap_free(&old);
    }
    gt_tok_pairmap_insert(m, gt_tok_pair_key(left, right), rank, merged);
}

void gt_tok_pairmap_free(gt_tok_pairmap *m)
{
    free(m->keys);
    free(m->rank);
    free(m->merged);
    memset(m, 0, sizeof *m);
}

/* ---------------------------------------------------------------- UTF-8 */

bool gt_utf8_valid(const char *s, size_t n, size_t *bad_offset)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        unsigned c = p[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t len;
        uint32_t cp, min;
        if (c >= 0xC2 && c <= 0xDF) {
            len = 2, cp = c & 0x1F, min = 0x80;
        } else if (c >= 0xE0 && c <= 0xEF) {
            len = 3, cp = c & 0x0F, min = 0x800;
        } else if (c >= 0xF0 && c <= 0xF4) {
            len = 4, cp = c & 0x07, min = 0x10000;
        } else {
            *bad_offset = i;
            return false;
        }
        if (n - i < len) {
            *bad_offset = i;
            return false;
        }
        for (size_t k = 1; k < len; k++) {
            if ((p[i + k] & 0xC0) != 0x80) {
                *bad_offset = i;
                return false;
            }
            cp = (cp << 6) | (p[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
            *bad_offset = i;
            return false;
        }
        i += len;
    }
    return true;
}

uint32_t gt_utf8_decode(const char *s, size_t n, size_t *len)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t l = gt_utf8_len(p[0]);
    if (l > n) l = 1;
    *len = l;
    if (l == 1) return p[0];
    uint32_t cp = p[0] & (0x7F >> l);
    for (size_t k = 1; k < l; k++)
        cp = (cp << 6) | (p[k] & 0x3F);
    return cp;
}

size_t gt_utf8_encode(uint32_t cp, char *out)
{
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

bool gt_unicode_is_white_space(uint32_t cp)
{
    /* The White_Space property (PropList.txt); stable across Unicode versions. */
    return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
           cp == 0x205F || cp == 0x3000;
}

/* ---------------------------------------------------------------- byte-level alphabet */

static bool gt_byte_is_printable(unsigned b)
{
    return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
}

uint32_t gt_byte_level_char(uint8_t byte)
{
    if (gt_byte_is_printable(byte)) return byte;
    /* The k-th non-printable byte (in byte order) maps to U+0100 + k. */
    uint32_t k = 0;
    for (unsigned b = 0; b < byte; b++)
        k += !gt_byte_is_printable(b);
    return 256 + k;
}

int gt_byte_level_byte(uint32_t cp)
{
    if (cp < 256) return gt_byte_is_printable(cp) ? (int)cp : -1;
    if (cp >= 256 + 68) return -1;
    uint32_t k = cp - 256;
    for (unsigned b = 0; b < 256; b++)
        if (!gt_byte_is_printable(b) && k-- == 0) return (int)b;
    return -1;
}

/* ---------------------------------------------------------------- regex */

static pcre2_code *gt_tok_compile(const char *pat, size_t len, const char *what, const char *name,
                                  const char *field, gt_error *err)
{
    int code;
    PCRE2_SIZE offset;
    pcre2_code *re =
        pcre2_compile((PCRE2_SPTR)pat, len, PCRE2_UTF | PCRE2_UCP, &code, &offset, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(code, msg, sizeof msg);
        gt_error_set(err, GT_ERR_FORMAT, "%s: %s: %s does not compile at offset %zu: %s", name,
                     field, what, (size_t)offset, (const char *)msg);
        return NULL;
    }
    /* JIT is an optimisation only: the interpreter gives the same matches. */
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    return re;
}

pcre2_code *gt_tok_compile_regex(const char *pattern, size_t len, const char *name,
                                 const char *field, gt_error *err)
{
    /* Oniguruma's \s is Unicode White_Space; PCRE2's also matches U+180E. Rewrite \s and \S
     * (outside and inside classes alike: \p{..} is valid in both). An escaped backslash is
     * copied as a pair so "\\s" stays a backslash followed by 's'. */
    size_t cap = len * 16 + 1, o = 0;
    char *out = gt_xmalloc(cap);
    for (size_t i = 0; i < len; i++) {
        if (pattern[i] == '\\' && i + 1 < len) {
            char c = pattern[i + 1];
            const char *rep = c == 's' ? "\\p{White_Space}" : c == 'S' ? "\\P{White_Space}" : NULL;
            if (rep) {
                size_t rl = strlen(rep);
                memcpy(out + o, rep, rl);
                o += rl;
            } else {
                out[o++] = '\\';
                out[o++] = c;
            }
            i++;
            continue;
        }
        out[o++] = pattern[i];
    }
    pcre2_code *re = gt_tok_compile(out, o, "regex", name, field, err);
    free(out);
    return re;
}

pcre2_code *gt_tok_compile_literal(const char *literal, size_t len, const char *name,
                                   const char *field, gt_error *err)
{
    /* Every ASCII non-alphanumeric character escaped is a literal in PCRE2; other bytes
     * (letters, digits, UTF-8 sequences) are literals already. */
    char *out = gt_xmalloc(2 * len + 1);
    size_t o = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)literal[i];
        bool alnum = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
        if (c < 0x80 && !alnum) out[o++] = '\\';
        out[o++] = (char)c;
    }
    pcre2_code *re = gt_tok_compile(out, o, "string pattern", name, field, err);
    free(out);
    return re;
}
