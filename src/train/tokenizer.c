/* tokenizer.c — encoding and decoding with a loaded byte-level BPE tokenizer.
 *
 * encode(text) follows Hugging Face tokenizers step by step so the ids are identical:
 *   1. added tokens: non-normalized ones are cut out of the text first, then normalized ones out
 *      of the remaining pieces (no normalizer is supported, so both match the raw text);
 *      matching is leftmost-longest and non-overlapping, as Aho-Corasick does there;
 *   2. every remaining piece runs through the pre-tokenizer steps depth-first (a step's output
 *      pieces go to the next step one at a time, so memory stays O(piece), not O(text));
 *   3. each final piece (a "word") is BPE-merged: repeatedly merge the adjacent pair with the
 *      lowest merge rank, the leftmost one on ties, until no pair has a rank;
 *   4. the post-processor's template wraps the ids when asked.
 * The whole text is validated as UTF-8 once, so PCRE2 runs with PCRE2_NO_UTF_CHECK. */
#include <stdlib.h>
#include <string.h>

#include "train/tokenizer_internal.h"

struct gt_tok_symbol {
    int32_t id;
    int32_t prev, next; /* -1 at the ends */
    bool alive;
};

struct gt_tok_merge {
    int32_t rank, pos, merged;
};

/* ---------------------------------------------------------------- id arrays */

void gt_token_ids_free(gt_token_ids *v)
{
    free(v->ids);
    v->ids = NULL;
    v->n = v->cap = 0;
}

gt_status gt_token_ids_append(gt_token_ids *v, const int32_t *ids, size_t n, gt_error *err)
{
    if (v->n + n > v->cap) {
        size_t cap = v->cap ? v->cap : 256;
        while (cap < v->n + n)
            cap *= 2;
        int32_t *p = realloc(v->ids, cap * sizeof *p);
        if (!p) return gt_error_set(err, GT_ERR_NOMEM, "token ids: cannot grow to %zu ids", cap);
        v->ids = p;
        v->cap = cap;
    }
    if (n) memcpy(v->ids + v->n, ids, n * sizeof *ids);
    v->n += n;
    return GT_OK;
}

static gt_status gt_tok_push(gt_token_ids *v, int32_t id, gt_error *err)
{
    if (v->n < v->cap) {
        v->ids[v->n++] = id;
        return GT_OK;
    }
    return gt_token_ids_append(v, &id, 1, err);
}

/* ---------------------------------------------------------------- accessors */

int32_t gt_tokenizer_vocab_size(const gt_tokenizer *t)
{
    return t->n_ids;
}
int32_t gt_tokenizer_bos_id(const gt_tokenizer *t)
{
    return t->bos_id;
}
int32_t gt_tokenizer_eos_id(const gt_tokenizer *t)
{
    return t->eos_id;
}

int32_t gt_tokenizer_token_to_id(const gt_tokenizer *t, const char *token, size_t len)
{
    int32_t id = gt_tok_strmap_get(&t->added_map, token, len);
    return id >= 0 ? id : gt_tok_strmap_get(&t->vocab, token, len);
}

const char *gt_tokenizer_id_to_token(const gt_tokenizer *t, int32_t id, size_t *len)
{
    if (id < 0 || id >= t->n_ids || t->id_len[id] == UINT32_MAX) return NULL;
    *len = t->id_len[id];
    return t->id_pool + t->id_off[id];
}

/* ---------------------------------------------------------------- tables */

void gt_tok_finish_tables(gt_tokenizer *t)
{
    /* Decoded bytes of every id. With a ByteLevel decoder a token whose characters are all in
     * the byte alphabet becomes those bytes; any other token is copied as UTF-8 (Hugging Face's
     * ByteLevel decoder does the same per token). */
    t->dec_off = gt_xmalloc((size_t)t->n_ids * sizeof *t->dec_off);
    t->dec_len = gt_xmalloc((size_t)t->n_ids * sizeof *t->dec_len);
    t->dec_pool = gt_xmalloc(t->id_pool_len + 1);
    size_t o = 0;
    for (int32_t id = 0; id < t->n_ids; id++) {
        t->dec_off[id] = (uint32_t)o;
        t->dec_len[id] = t->id_len[id];
        if (t->id_len[id] == UINT32_MAX) continue;
        const char *s = t->id_pool + t->id_off[id];
        size_t n = t->id_len[id], start = o;
        bool mapped = t->byte_level_decoder;
        for (size_t i = 0; mapped && i < n;) {
            size_t l;
            int b = gt_byte_level_byte(gt_utf8_decode(s + i, n - i, &l));
            if (b < 0)
                mapped = false;
            else
                t->dec_pool[o++] = (char)b;
            i += l;
        }
        if (!mapped) {
            o = start;
            memcpy(t->dec_pool + o, s, n);
            o += n;
        }
        t->dec_len[id] = (uint32_t)(o - start);
    }
    t->dec_pool_len = o;

    /* Added-token matching sets, by first byte then decreasing length. */
    for (int pass = 0; pass < 2; pass++) {
        gt_tok_added_set *set = &t->sets[pass];
        set->order = gt_xmalloc((size_t)(t->n_added + 1) * sizeof *set->order);
        set->n = 0;
        for (int b = 0; b < 256; b++) {
            set->first[b] = set->n;
            size_t begin = (size_t)set->n;
            for (int k = 0; k < t->n_added; k++) {
                const gt_tok_added *a = &t->added[k];
                if (a->normalized != (pass == 1)) continue;
                if ((unsigned char)t->added_pool[a->off] != b) continue;
                set->order[set->n++] = k;
            }
            /* insertion sort by length, longest first (stable: file order on ties) */
            for (size_t i = begin + 1; i < (size_t)set->n; i++) {
                int32_t k = set->order[i];
                size_t j = i;
                while (j > begin && t->added[set->order[j - 1]].len < t->added[k].len) {
                    set->order[j] = set->order[j - 1];
                    j--;
                }
                set->order[j] = k;
            }
        }
        set->first[256] = set->n;
    }
}

/* ---------------------------------------------------------------- BPE */

static void gt_tok_heap_push(gt_tokenizer *t, size_t *n, struct gt_tok_merge m)
{
    if (*n == t->heap_cap) {
        t->heap_cap = t->heap_cap ? 2 * t->heap_cap : 64;
        t->heap = gt_xrealloc(t->heap, t->heap_cap * sizeof *t->heap);
    }
    struct gt_tok_merge *h = t->heap;
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h[p].rank < m.rank || (h[p].rank == m.rank && h[p].pos < m.pos)) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = m;
}

static struct gt_tok_merge gt_tok_heap_pop(gt_tokenizer *t, size_t *n)
{
    struct gt_tok_merge *h = t->heap, top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n &&
            (h[c + 1].rank < h[c].rank || (h[c + 1].rank == h[c].rank && h[c + 1].pos < h[c].pos)))
            c++;
        if (last.rank < h[c].rank || (last.rank == h[c].rank && last.pos < h[c].pos)) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = last;
    return top;
}

static gt_status gt_tok_bpe_word(gt_tokenizer *t, const char *w, size_t n, gt_token_ids *out,
                                 gt_error *err)
{
    if (t->ignore_merges) {
        int32_t id = gt_tok_strmap_get(&t->vocab, w, n);
        if (id >= 0) return gt_tok_push(out, id, err);
    }
    bool cacheable = n <= GT_TOK_CACHE_MAX_WORD;
    if (cacheable) {
        int32_t at = gt_tok_strmap_get(&t->cache, w, n);
        if (at >= 0)
            return gt_token_ids_append(out, t->cache_ids + at + 1, (size_t)t->cache_ids[at], err);
    }

    /* Initial symbols: one per character; a character outside the vocab becomes unk_token
     * (runs fused with fuse_unk) or is dropped when there is none. */
    if (n > t->symbols_cap) {
        t->symbols_cap = n;
        t->symbols = gt_xrealloc(t->symbols, n * sizeof *t->symbols);
    }
    struct gt_tok_symbol *sym = t->symbols;
    int32_t count = 0;
    bool pending_unk = false;
    for (size_t i = 0; i < n;) {
        size_t l = gt_utf8_len((unsigned char)w[i]);
        if (l > n - i) l = n - i;
        int32_t id = gt_tok_strmap_get(&t->vocab, w + i, l);
        i += l;
        if (id < 0) {
            if (t->unk_id < 0) continue;
            if (pending_unk && t->fuse_unk) continue;
            if (pending_unk) sym[count++] = (struct gt_tok_symbol){t->unk_id, 0, 0, true};
            pending_unk = true;
            continue;
        }
        if (pending_unk) sym[count++] = (struct gt_tok_symbol){t->unk_id, 0, 0, true};
        pending_unk = false;
        sym[count++] = (struct gt_tok_symbol){id, 0, 0, true};
    }
    if (pending_unk) sym[count++] = (struct gt_tok_symbol){t->unk_id, 0, 0, true};
    for (int32_t i = 0; i < count; i++) {
        sym[i].prev = i - 1;
        sym[i].next = i + 1 < count ? i + 1 : -1;
    }

    size_t heap_n = 0;
    int32_t rank, merged;
    for (int32_t i = 0; i + 1 < count; i++)
        if (gt_tok_pairmap_get(&t->merges, sym[i].id, sym[i + 1].id, &rank, &merged))
            gt_tok_heap_push(t, &heap_n, (struct gt_tok_merge){rank, i, merged});
    while (heap_n > 0) {
        struct gt_tok_merge m = gt_tok_heap_pop(t, &heap_n);
        struct gt_tok_symbol *cur = &sym[m.pos];
        if (!cur->alive || cur->next < 0) continue;
        /* A queue entry is stale when either symbol changed since it was pushed. */
        struct gt_tok_symbol *right = &sym[cur->next];
        if (!gt_tok_pairmap_get(&t->merges, cur->id, right->id, &rank, &merged) ||
            merged != m.merged)
            continue;
        cur->id = m.merged;
        right->alive = false;
        cur->next = right->next;
        if (cur->next >= 0) sym[cur->next].prev = m.pos;
        if (cur->prev >= 0 &&
            gt_tok_pairmap_get(&t->merges, sym[cur->prev].id, cur->id, &rank, &merged))
            gt_tok_heap_push(t, &heap_n, (struct gt_tok_merge){rank, cur->prev, merged});
        if (cur->next >= 0 &&
            gt_tok_pairmap_get(&t->merges, cur->id, sym[cur->next].id, &rank, &merged))
            gt_tok_heap_push(t, &heap_n, (struct gt_tok_merge){rank, m.pos, merged});
    }

    size_t base = out->n;
    for (int32_t i = 0; i < count; i++)
        if (sym[i].alive) GT_TRY(gt_tok_push(out, sym[i].id, err));
    if (cacheable) {
        size_t k = out->n - base;
        if (t->cache.n >= GT_TOK_CACHE_MAX_WORDS) {
            gt_tok_strmap_clear(&t->cache);
            t->cache_len = 0;
        }
        if (t->cache_len + k + 1 > t->cache_cap) {
            while (t->cache_len + k + 1 > t->cache_cap)
                t->cache_cap = t->cache_cap ? 2 * t->cache_cap : 4096;
            t->cache_ids = gt_xrealloc(t->cache_ids, t->cache_cap * sizeof *t->cache_ids);
        }
        t->cache_ids[t->cache_len] = (int32_t)k;
        if (k) memcpy(t->cache_ids + t->cache_len + 1, out->ids + base, k * sizeof *out->ids);
        gt_tok_strmap_put(&t->cache, w, n, (int32_t)t->cache_len);
        t->cache_len += k + 1;
    }
    return GT_OK;
}

/* ---------------------------------------------------------------- pre-tokenizer steps */

typedef struct {
    gt_tokenizer *t;
    gt_token_ids *out;
    gt_error *err;
} gt_tok_ctx;

static gt_status gt_tok_run_steps(gt_tok_ctx *c, int k, const char *s, size_t n);

static char *gt_tok_scratch(gt_tok_step *st, size_t n)
{
    if (n > st->scratch_cap) {
        st->scratch_cap = n < 256 ? 256 : n;
        st->scratch = gt_xrealloc(st->scratch, st->scratch_cap);
    }
    return st->scratch;
}

/* Segments of a piece as Hugging Face's Pattern::find_matches yields them: the gaps between
 * regex matches and the matches themselves, in order, covering the piece. Empty matches follow
 * the Oniguruma iterator: an empty match right where the previous match ended is skipped by
 * advancing one character. */
typedef struct {
    const gt_tok_step *st;
    gt_tok_ctx *c;
    const char *s;
    size_t n;
    size_t search_at, prev_end, last_match_end;
    bool have_last_match, done, have_pending;
    size_t pending_a, pending_b;
} gt_tok_segments;

static gt_status gt_tok_next_segment(gt_tok_segments *g, size_t *a, size_t *b, bool *is_match,
                                     bool *got)
{
    *got = true;
    if (g->have_pending) {
        g->have_pending = false;
        *a = g->pending_a, *b = g->pending_b, *is_match = true;
        return GT_OK;
    }
    while (!g->done) {
        if (g->search_at > g->n) {
            g->done = true;
            break;
        }
        int rc = pcre2_match(g->st->re, (PCRE2_SPTR)g->s, g->n, g->search_at, PCRE2_NO_UTF_CHECK,
                             g->st->md, g->c->t->match_ctx);
        if (rc == PCRE2_ERROR_NOMATCH) {
            g->done = true;
            break;
        }
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return gt_error_set(g->c->err, GT_ERR_INVALID,
                                "%s: pre_tokenizer regex failed on a %zu-byte piece: %s",
                                g->c->t->name, g->n, (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(g->st->md);
        size_t ms = ov[0], me = ov[1];
        if (me < ms) me = ms; /* \K tricks; never in real tokenizers */
        if (ms == me && g->have_last_match && g->last_match_end == me) {
            g->search_at +=
                g->search_at < g->n ? gt_utf8_len((unsigned char)g->s[g->search_at]) : 1;
            continue;
        }
        g->search_at = me;
        g->last_match_end = me;
        g->have_last_match = true;
        if (g->prev_end != ms) {
            *a = g->prev_end, *b = ms, *is_match = false;
            g->have_pending = true;
            g->pending_a = ms, g->pending_b = me;
        } else {
            *a = ms, *b = me, *is_match = true;
        }
        g->prev_end = me;
        return GT_OK;
    }
    if (g->prev_end != g->n) {
        *a = g->prev_end, *b = g->n, *is_match = false;
        g->prev_end = g->n;
        return GT_OK;
    }
    *got = false;
    return GT_OK;
}

static gt_status gt_tok_split(gt_tok_ctx *c, int k, const char *s, size_t n)
{
    const gt_tok_step *st = &c->t->steps[k];
    gt_tok_segments g = {.st = st, .c = c, .s = s, .n = n};
    size_t a = 0, b = 0;
    bool m = false, got = false;
    /* acc: the piece being built (MergedWith*, Contiguous fold segments into it). */
    bool have_acc = false, acc_match = false, prev_match = false;
    size_t acc_a = 0, acc_b = 0;
    /* MergedWithNext needs the next segment's flag: keep one segment of lookahead. */
    bool have_cur = false, cur_m = false, carry = false;
    size_t cur_a = 0, cur_b = 0, carry_a = 0;
    for (;;) {
        GT_TRY(gt_tok_next_segment(&g, &a, &b, &m, &got));
        if (got) m ^= st->invert;
        switch (st->behavior) {
        case GT_TOK_ISOLATED:
            if (got) GT_TRY(gt_tok_run_steps(c, k + 1, s + a, b - a));
            break;
        case GT_TOK_REMOVED:
            if (got && !m) GT_TRY(gt_tok_run_steps(c, k + 1, s + a, b - a));
            break;
        case GT_TOK_MERGED_WITH_PREVIOUS:
            if (got && m && !prev_match && have_acc) {
                acc_b = b;
            } else {
                if (have_acc) GT_TRY(gt_tok_run_steps(c, k + 1, s + acc_a, acc_b - acc_a));
                have_acc = got, acc_a = a, acc_b = b;
            }
            prev_match = m;
            break;
        case GT_TOK_CONTIGUOUS:
            if (got && have_acc && m == acc_match) {
                acc_b = b;
            } else {
                if (have_acc) GT_TRY(gt_tok_run_steps(c, k + 1, s + acc_a, acc_b - acc_a));
                have_acc = got, acc_a = a, acc_b = b, acc_match = m;
            }
            break;
        case GT_TOK_MERGED_WITH_NEXT:
            if (have_cur) {
                if (cur_m && got && !m) {
                    /* a match followed by a non-match: glue it to the front of the next */
                    carry = true, carry_a = cur_a;
                } else {
                    size_t from = carry ? carry_a : cur_a;
                    carry = false;
                    GT_TRY(gt_tok_run_steps(c, k + 1, s + from, cur_b - from));
                }
            }
            have_cur = got, cur_a = a, cur_b = b, cur_m = m;
            break;
        }
        if (!got) return GT_OK;
    }
}

static gt_status gt_tok_run_steps(gt_tok_ctx *c, int k, const char *s, size_t n)
{
    if (n == 0) return GT_OK;
    gt_tokenizer *t = c->t;
    if (k == t->n_steps) return gt_tok_bpe_word(t, s, n, c->out, c->err);
    gt_tok_step *st = &t->steps[k];
    switch (st->kind) {
    case GT_TOK_SPLIT:
        return gt_tok_split(c, k, s, n);
    case GT_TOK_PREFIX_SPACE: {
        if (s[0] == ' ') return gt_tok_run_steps(c, k + 1, s, n);
        char *p = gt_tok_scratch(st, n + 1);
        p[0] = ' ';
        memcpy(p + 1, s, n);
        return gt_tok_run_steps(c, k + 1, p, n + 1);
    }
    case GT_TOK_BYTES_TO_CHARS: {
        char *p = gt_tok_scratch(st, 2 * n);
        size_t o = 0;
        for (size_t i = 0; i < n; i++)
            o += gt_utf8_encode(gt_byte_level_char((uint8_t)s[i]), p + o);
        return gt_tok_run_steps(c, k + 1, p, o);
    }
    }
    return GT_OK;
}

/* ---------------------------------------------------------------- added tokens */

/* Rust regex's \w on the character that ends (at_end) or starts the string. */
static bool gt_tok_word_char(const gt_tokenizer *t, const char *s, size_t n, bool at_end)
{
    if (n == 0) return false;
    size_t i = 0;
    if (at_end) {
        i = n - 1;
        while (i > 0 && ((unsigned char)s[i] & 0xC0) == 0x80)
            i--;
    }
    size_t l = gt_utf8_len((unsigned char)s[i]);
    if (l > n - i) l = n - i;
    return pcre2_match(t->word_re, (PCRE2_SPTR)(s + i), l, 0, PCRE2_ANCHORED | PCRE2_NO_UTF_CHECK,
                       t->word_md, NULL) >= 0;
}

static gt_status gt_tok_split_added(gt_tok_ctx *c, int pass, const char *s, size_t n)
{
    if (n == 0) return GT_OK;
    gt_tokenizer *t = c->t;
    const gt_tok_added_set *set = &t->sets[pass];
    if (set->n == 0)
        return pass == 0 ? gt_tok_split_added(c, 1, s, n) : gt_tok_run_steps(c, 0, s, n);
    size_t start_offset = 0, pos = 0;
    while (pos < n) {
        /* leftmost position with a match, longest token there */
        const gt_tok_added *hit = NULL;
        size_t p = pos;
        for (; p < n && !hit; p++) {
            unsigned b = (unsigned char)s[p];
            for (int32_t i = set->first[b]; i < set->first[b + 1]; i++) {
                const gt_tok_added *a = &t->added[set->order[i]];
                if (a->len <= n - p && memcmp(s + p, t->added_pool + a->off, a->len) == 0) {
                    hit = a;
                    break;
                }
            }
        }
        if (!hit) break;
        size_t start = p - 1, stop = start + hit->len;
        pos = stop;
        if (hit->single_word) {
            bool start_space = start == 0 || !gt_tok_word_char(t, s, start, true);
            bool stop_space = stop == n || !gt_tok_word_char(t, s + stop, n - stop, false);
            if (!start_space || !stop_space) continue;
        }
        if (hit->lstrip) {
            size_t i = start;
            while (i > 0) {
                size_t j = i - 1;
                while (j > 0 && ((unsigned char)s[j] & 0xC0) == 0x80)
                    j--;
                size_t l;
                if (!gt_unicode_is_white_space(gt_utf8_decode(s + j, i - j, &l))) break;
                i = j;
            }
            start = i > start_offset ? i : start_offset;
        }
        if (hit->rstrip) {
            while (stop < n) {
                size_t l;
                if (!gt_unicode_is_white_space(gt_utf8_decode(s + stop, n - stop, &l))) break;
                stop += l;
            }
        }
        if (start_offset < start) {
            if (pass == 0)
                GT_TRY(gt_tok_split_added(c, 1, s + start_offset, start - start_offset));
            else
                GT_TRY(gt_tok_run_steps(c, 0, s + start_offset, start - start_offset));
        }
        GT_TRY(gt_tok_push(c->out, hit->id, c->err));
        start_offset = stop;
    }
    if (start_offset < n) {
        if (pass == 0) return gt_tok_split_added(c, 1, s + start_offset, n - start_offset);
        return gt_tok_run_steps(c, 0, s + start_offset, n - start_offset);
    }
    return GT_OK;
}

/* ---------------------------------------------------------------- encode / decode */

gt_status gt_tokenizer_encode(gt_tokenizer *t, const char *text, size_t len, bool post_process,
                              gt_token_ids *out, gt_error *err)
{
    size_t bad;
    if (!gt_utf8_valid(text, len, &bad))
        return gt_error_set(err, GT_ERR_FORMAT,
                            "%s: text to encode is not valid UTF-8 (byte offset %zu)", t->name,
                            bad);
    size_t base = out->n;
    gt_tok_ctx c = {t, out, err};
    gt_status st = gt_tok_split_added(&c, 0, text, len);
    if (st != GT_OK) {
        out->n = base;
        return st;
    }
    if (!post_process || !t->has_template) return GT_OK;

    /* Template: the encoded ids ($A) with the special tokens' ids around them. */
    gt_token_ids *body = &t->scratch_ids;
    body->n = 0;
    if (out->n > base && (st = gt_token_ids_append(body, out->ids + base, out->n - base, err))) {
        out->n = base;
        return st;
    }
    out->n = base;
    for (int i = 0; i < t->n_template_items; i++) {
        const gt_tok_template_item *it = &t->template_items[i];
        st = it->is_sequence ? gt_token_ids_append(out, body->ids, body->n, err)
             : it->n         ? gt_token_ids_append(out, t->template_ids + it->off, it->n, err)
                             : GT_OK;
        if (st != GT_OK) {
            out->n = base;
            return st;
        }
    }
    return GT_OK;
}

gt_status gt_tokenizer_encode_document(gt_tokenizer *t, const char *text, size_t len, bool add_bos,
                                       bool add_eos, gt_token_ids *out, gt_error *err)
{
    size_t base = out->n;
    if (add_bos && t->bos_id >= 0 && !t->post_adds_bos) GT_TRY(gt_tok_push(out, t->bos_id, err));
    gt_status st = gt_tokenizer_encode(t, text, len, true, out, err);
    if (st == GT_OK && add_eos && t->eos_id >= 0 && !t->post_adds_eos)
        st = gt_tok_push(out, t->eos_id, err);
    if (st != GT_OK) out->n = base;
    return st;
}

gt_status gt_tokenizer_decode(const gt_tokenizer *t, const int32_t *ids, size_t n, char **out,
                              size_t *out_len, gt_error *err)
{
    *out = NULL;
    *out_len = 0;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= t->n_ids || t->dec_len[id] == UINT32_MAX)
            return gt_error_set(err, GT_ERR_INVALID,
                                "%s: cannot decode id %d at position %zu: not a token of this "
                                "tokenizer (vocab size %d)",
                                t->name, id, i, t->n_ids);
        total += t->dec_len[id];
    }
    char *buf = malloc(total + 1);
    if (!buf) return gt_error_set(err, GT_ERR_NOMEM, "%s: decode needs %zu bytes", t->name, total);
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        memcpy(buf + o, t->dec_pool + t->dec_off[ids[i]], t->dec_len[ids[i]]);
        o += t->dec_len[ids[i]];
    }
    buf[o] = '\0';
    *out = buf;
    *out_len = o;
    return GT_OK;
}

void gt_tokenizer_free(gt_tokenizer *t)
{
    if (!t) return;
    free(t->name);
    gt_tok_strmap_free(&t->vocab);
    free(t->id_pool);
    free(t->dec_pool);
    free(t->id_off);
    free(t->id_len);
    free(t->dec_off);
    free(t->dec_len);
    gt_tok_pairmap_free(&t->merges);
    free(t->added);
    free(t->added_pool);
    gt_tok_strmap_free(&t->added_map);
    for (int i = 0; i < 2; i++)
        free(t->sets[i].order);
    if (t->word_md) pcre2_match_data_free(t->word_md);
    if (t->word_re) pcre2_code_free(t->word_re);
    for (int i = 0; i < t->n_steps; i++) {
        if (t->steps[i].md) pcre2_match_data_free(t->steps[i].md);
        if (t->steps[i].re) pcre2_code_free(t->steps[i].re);
        free(t->steps[i].scratch);
    }
    if (t->match_ctx) pcre2_match_context_free(t->match_ctx);
    free(t->template_items);
    free(t->template_ids);
    gt_tok_strmap_free(&t->cache);
    free(t->cache_ids);
    free(t->symbols);
    free(t->heap);
    gt_token_ids_free(&t->scratch_ids);
    free(t);
}
