/* loader.c — batches of [local_batch, seq_len + 1] tokens for one data-parallel rank.
 *
 * A batch is a pure function of the global sample counter: rank r of n reads samples
 * next_sample + r·B + i (i < B) and every rank advances next_sample by n·B. Sample g of a token
 * stream is window w = g mod W (W = floor(count / (L + 1)) non-overlapping windows), or the
 * epoch's permutation of it when shuffling, with epoch g / W. So the position is one integer,
 * a checkpoint restores it exactly, and a different number of ranks splits the same global
 * batches differently without changing them. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graphtrain/gt_data.h"

typedef enum { GT_SRC_SYNTHETIC, GT_SRC_SHARD, GT_SRC_TOKENS } gt_loader_source;

struct gt_loader {
    gt_loader_config cfg;
    gt_loader_source kind;
    const gt_synthetic *synthetic;
    const gt_token_shard *shard;
    const int32_t *tokens;
    uint64_t count;   /* tokens in the stream */
    uint64_t windows; /* W */
    char *name;
    uint64_t next_sample, fingerprint;
    uint32_t *perm; /* shuffle: the permutation of epoch perm_epoch */
    uint64_t perm_epoch;
    bool have_perm;
};

static gt_status gt_loader_check_config(const gt_loader_config *c, const char *name, gt_error *err)
{
    if (c->seq_len < 1 || c->seq_len > (1 << 30))
        return gt_error_set(err, GT_ERR_INVALID, "loader %s: seq_len %lld must be in [1, 2^30]",
                            name, (long long)c->seq_len);
    if (c->local_batch < 1 || c->local_batch > (1 << 24))
        return gt_error_set(err, GT_ERR_INVALID, "loader %s: local_batch %lld must be in [1, 2^24]",
                            name, (long long)c->local_batch);
    if (c->dp_degree < 1 || c->dp_rank < 0 || c->dp_rank >= c->dp_degree)
        return gt_error_set(err, GT_ERR_INVALID,
                            "loader %s: dp_rank %d must be in [0, dp_degree %d)", name, c->dp_rank,
                            c->dp_degree);
    return GT_OK;
}

/* fingerprint = hash of (source identity, seq_len, shuffle, shuffle seed) */
static uint64_t gt_loader_fingerprint(const gt_loader *l, uint64_t a, uint64_t b, uint64_t c)
{
    uint64_t words[8] = {(uint64_t)l->kind,
                         a,
                         b,
                         c,
                         (uint64_t)l->cfg.seq_len,
                         (uint64_t)l->cfg.shuffle,
                         l->cfg.shuffle ? l->cfg.seed : 0,
                         0x6774646174ull};
    return gt_hash64(words, sizeof words, 0);
}

static gt_status gt_loader_new(const gt_loader_config *c, gt_loader_source kind, const char *name,
                               gt_loader **out, gt_error *err)
{
    *out = NULL;
    GT_TRY(gt_loader_check_config(c, name, err));
    gt_loader *l = gt_xcalloc(1, sizeof *l);
    l->cfg = *c;
    l->kind = kind;
    l->name = gt_xstrdup(name);
    *out = l;
    return GT_OK;
}

static gt_status gt_loader_set_stream(gt_loader *l, uint64_t count, gt_error *err)
{
    uint64_t span = (uint64_t)l->cfg.seq_len + 1;
    l->count = count;
    l->windows = count / span;
    if (l->windows == 0)
        return gt_error_set(err, GT_ERR_INVALID,
                            "loader %s: %llu tokens, but one sample needs seq_len + 1 = %llu",
                            l->name, (unsigned long long)count, (unsigned long long)span);
    if (l->cfg.shuffle && l->windows > UINT32_MAX)
        return gt_error_set(err, GT_ERR_UNSUPPORTED,
                            "loader %s: shuffling more than 2^32 windows is not supported",
                            l->name);
    return GT_OK;
}

gt_status gt_loader_create_synthetic(const gt_loader_config *c, const gt_synthetic *s,
                                     gt_loader **out, gt_error *err)
{
    GT_TRY(gt_loader_new(c, GT_SRC_SYNTHETIC, "synthetic", out, err));
    gt_loader *l = *out;
    l->synthetic = s;
    const gt_synthetic_config *sc = gt_synthetic_get_config(s);
    l->fingerprint = gt_loader_fingerprint(
        l, (uint64_t)sc->vocab_size,
        (uint64_t)sc->min_successors << 32 | (uint32_t)sc->max_successors, sc->seed);
    return GT_OK;
}

gt_status gt_loader_create_shard(const gt_loader_config *c, const gt_token_shard *shard,
                                 gt_loader **out, gt_error *err)
{
    GT_TRY(gt_loader_new(c, GT_SRC_SHARD, "token shard", out, err));
    gt_loader *l = *out;
    l->shard = shard;
    gt_status st = gt_loader_set_stream(l, shard->count, err);
    if (st != GT_OK) {
        gt_loader_free(l);
        *out = NULL;
        return st;
    }
    l->fingerprint = gt_loader_fingerprint(l, shard->count, shard->vocab_size, shard->checksum);
    return GT_OK;
}

gt_status gt_loader_create_tokens(const gt_loader_config *c, const int32_t *tokens, size_t n,
                                  const char *name, gt_loader **out, gt_error *err)
{
    GT_TRY(gt_loader_new(c, GT_SRC_TOKENS, name ? name : "tokens", out, err));
    gt_loader *l = *out;
    l->tokens = tokens;
    gt_status st = gt_loader_set_stream(l, n, err);
    for (size_t i = 0; i < n && st == GT_OK; i++)
        if (tokens[i] < 0)
            st = gt_error_set(err, GT_ERR_INVALID, "loader %s: token %zu is negative (%d)", l->name,
                              i, tokens[i]);
    if (st != GT_OK) {
        gt_loader_free(l);
        *out = NULL;
        return st;
    }
    l->fingerprint = gt_loader_fingerprint(l, n, gt_hash64(tokens, n * sizeof *tokens, 0), 0);
    return GT_OK;
}

void gt_loader_free(gt_loader *l)
{
    if (!l) return;
    free(l->name);
    free(l->perm);
    free(l);
}

uint64_t gt_loader_samples_per_epoch(const gt_loader *l)
{
    return l->windows;
}

/* Fisher–Yates with Philox at (seed, "loader.shuffle", epoch·2^32 + i): epoch e's order. */
static void gt_loader_build_perm(gt_loader *l, uint64_t epoch)
{
    uint64_t W = l->windows, stream = gt_hash_str("loader.shuffle");
    if (!l->perm) l->perm = gt_xmalloc(W * sizeof *l->perm);
    for (uint64_t i = 0; i < W; i++)
        l->perm[i] = (uint32_t)i;
    for (uint64_t i = W - 1; i > 0; i--) {
        uint64_t j =
            (uint64_t)(gt_rng_uniform(l->cfg.seed, stream, epoch << 32 | i, 0) * (double)(i + 1));
        if (j > i) j = i;
        uint32_t t = l->perm[i];
        l->perm[i] = l->perm[j];
        l->perm[j] = t;
    }
    l->perm_epoch = epoch;
    l->have_perm = true;
}

static void gt_loader_sample(gt_loader *l, uint64_t g, int64_t *row)
{
    int64_t span = l->cfg.seq_len + 1;
    if (l->kind == GT_SRC_SYNTHETIC) {
        gt_synthetic_sample(l->synthetic, g, span, row);
        return;
    }
    uint64_t epoch = g / l->windows, w = g % l->windows;
    if (l->cfg.shuffle) {
        if (!l->have_perm || l->perm_epoch != epoch) gt_loader_build_perm(l, epoch);
        w = l->perm[w];
    }
    uint64_t start = w * (uint64_t)span;
    if (l->kind == GT_SRC_SHARD)
        for (int64_t t = 0; t < span; t++)
            row[t] = gt_token_shard_get(l->shard, start + (uint64_t)t);
    else
        for (int64_t t = 0; t < span; t++)
            row[t] = l->tokens[start + (uint64_t)t];
}

gt_status gt_loader_next(gt_loader *l, int64_t *tokens, gt_error *err)
{
    uint64_t B = (uint64_t)l->cfg.local_batch, step = B * (uint64_t)l->cfg.dp_degree;
    if (l->next_sample > UINT64_MAX - step)
        return gt_error_set(err, GT_ERR_INVALID, "loader %s: sample counter overflow", l->name);
    uint64_t first = l->next_sample + (uint64_t)l->cfg.dp_rank * B;
    for (uint64_t i = 0; i < B; i++)
        gt_loader_sample(l, first + i, tokens + i * (uint64_t)(l->cfg.seq_len + 1));
    l->next_sample += step;
    return GT_OK;
}

void gt_loader_split_batch(const int64_t *tokens, int64_t batch, int64_t seq_len, int64_t *inputs,
                           int64_t *labels)
{
    for (int64_t b = 0; b < batch; b++) {
        const int64_t *row = tokens + b * (seq_len + 1);
        memcpy(inputs + b * seq_len, row, (size_t)seq_len * sizeof *row);
        memcpy(labels + b * seq_len, row + 1, (size_t)seq_len * sizeof *row);
    }
}

void gt_loader_positions(const int64_t *inputs, int64_t batch, int64_t seq_len, int64_t bos,
                         int64_t eos, int64_t *positions)
{
    for (int64_t b = 0; b < batch; b++) {
        const int64_t *x = inputs + b * seq_len;
        int64_t *p = positions + b * seq_len;
        for (int64_t t = 0; t < seq_len; t++) {
            bool starts = t == 0 || (bos >= 0 ? x[t] == bos : eos >= 0 && x[t - 1] == eos);
            p[t] = starts ? 0 : p[t - 1] + 1;
        }
    }
}

void gt_loader_get_state(const gt_loader *l, gt_loader_state *st)
{
    st->next_sample = l->next_sample;
    st->fingerprint = l->fingerprint;
}

gt_status gt_loader_set_state(gt_loader *l, const gt_loader_state *st, gt_error *err)
{
    if (st->fingerprint != l->fingerprint)
        return gt_error_set(err, GT_ERR_INVALID,
                            "loader %s: the saved position is for other data (fingerprint "
                            "%016" PRIx64 ", this loader %016" PRIx64
                            "): the dataset, seq_len, shuffle or seed changed",
                            l->name, st->fingerprint, l->fingerprint);
    l->next_sample = st->next_sample;
    return GT_OK;
}

void gt_loader_state_format(const gt_loader_state *st, char *buf, size_t n)
{
    snprintf(buf, n, "gtloader1:%" PRIu64 ":%016" PRIx64, st->next_sample, st->fingerprint);
}

gt_status gt_loader_state_parse(const char *s, gt_loader_state *st, gt_error *err)
{
    static const char prefix[] = "gtloader1:";
    const char *p = s;
    uint64_t next = 0, fp = 0;
    bool ok = strncmp(p, prefix, sizeof prefix - 1) == 0;
    p += ok ? sizeof prefix - 1 : 0;
    int digits = 0;
    for (; ok && *p >= '0' && *p <= '9'; p++, digits++) {
        uint64_t d = (uint64_t)(*p - '0');
        if (next > (UINT64_MAX - d) / 10) ok = false;
        next = next * 10 + d;
    }
    ok = ok && digits > 0 && *p++ == ':';
    for (digits = 0; ok && *p; p++, digits++) {
        char c = *p;
        int v = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (v < 0 || digits == 16) ok = false;
        fp = fp << 4 | (uint64_t)(v < 0 ? 0 : v);
    }
    if (!ok || digits != 16)
        return gt_error_set(err, GT_ERR_FORMAT,
                            "loader state \"%.80s\": expected gtloader1:<next sample>:<16 hex "
                            "digits>",
                            s);
    st->next_sample = next;
    st->fingerprint = fp;
    return GT_OK;
}
