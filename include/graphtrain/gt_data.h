/* gt_data.h — training data: the synthetic corpus, token shards, text → tokens, the loader.
 *
 *   synthetic Markov corpus ──┐
 *   token shard (GTTOKENS) ───┼─► loader: windows of seq_len + 1 tokens, sharded over data-
 *   in-memory token stream ───┘   parallel ranks, position saved in checkpoints
 *   text / JSON lines ─(tokenizer)─► token stream or shard
 *
 * Every source is random-access by a global sample index, so a batch is a pure function of
 * (source, config, position): resuming from a saved position reproduces the next batch exactly,
 * on any number of ranks. */
#ifndef GRAPHTRAIN_GT_DATA_H
#define GRAPHTRAIN_GT_DATA_H

#include "graphtrain/gt_core.h"
#include "graphtrain/gt_tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- synthetic corpus */

/* A first-order Markov chain over V tokens. Context c has k_c successors, k_c uniform in
 * [min_successors, max_successors]: its successor on a random cycle through all V tokens (so the
 * chain is irreducible) plus distinct random others, with Dirichlet(1) probabilities — all drawn
 * from Philox keyed by seed. Samples start from the stationary distribution π, so every position
 * is distributed as π and the best possible expected loss of every predicted token (given any
 * amount of context: the chain is first order) is the entropy rate
 *     H = Σ_c π(c) · H(P(·|c)) = -Σ_c π(c) Σ_n P(n|c) ln P(n|c)   nats.
 * The first token of a sample is only ever an input (labels are tokens 1..seq_len), so H is
 * exactly the per-token floor of the loader's cross-entropy. */
typedef struct {
    int32_t vocab_size;     /* V, ≥ 2 (default 256) */
    int32_t min_successors; /* ≥ 1 (default 2) */
    int32_t max_successors; /* ≤ V (default 8) */
    uint64_t seed;          /* (default 1234) */
} gt_synthetic_config;

void gt_synthetic_config_default(gt_synthetic_config *c);

typedef struct gt_synthetic gt_synthetic;

/* GT_ERR_INVALID naming the field for out-of-range settings. */
gt_status gt_synthetic_create(const gt_synthetic_config *c, gt_synthetic **out, gt_error *err);
void gt_synthetic_free(gt_synthetic *s);
const gt_synthetic_config *gt_synthetic_get_config(const gt_synthetic *s);
/* The entropy rate H in nats per token: the loss floor of a model trained on this corpus.
 * π comes from power iteration on the lazy chain (P + I)/2 in double precision, to a change
 * below 1e-15 per sweep. */
double gt_synthetic_entropy_rate(const gt_synthetic *s);
/* P(to | from) and π(token); 0 outside the chain's support. */
double gt_synthetic_transition_prob(const gt_synthetic *s, int32_t from, int32_t to);
double gt_synthetic_stationary_prob(const gt_synthetic *s, int32_t token);
/* len tokens of sample `index`: x0 ~ π, x(t+1) ~ P(· | x(t)), drawn from Philox at
 * (seed, index, t). Deterministic and independent of every other sample. */
void gt_synthetic_sample(const gt_synthetic *s, uint64_t index, int64_t len, int64_t *out);

/* ---------------------------------------------------------------- token shards */

/* File layout (little-endian), 64-byte header then the payload:
 *   0  char[8]  magic "GTTOKENS"
 *   8  u32      version (1)
 *   12 u32      dtype: bytes per token, 2 (uint16) or 4 (uint32)
 *   16 u64      count: tokens in the payload
 *   24 u32      vocab_size: every token < vocab_size
 *   28 u32      reserved, 0
 *   32 u64      payload checksum: xxHash64 (seed 0) of the payload bytes
 *   40 ...      zero up to byte 56
 *   56 u64      header checksum: xxHash64 (seed 0) of bytes 0..55
 *   64 payload  count × dtype bytes; the file ends exactly there. */
#define GT_TOKEN_SHARD_MAGIC "GTTOKENS"
#define GT_TOKEN_SHARD_VERSION 1
#define GT_TOKEN_SHARD_HEADER_BYTES 64

typedef struct {
    uint32_t dtype; /* 2 or 4 */
    uint64_t count;
    uint32_t vocab_size;
    uint64_t checksum;
    const uint8_t *payload;
    /* private: the mapping gt_token_shard_open made */
    void *map;
    size_t map_len;
} gt_token_shard;

/* Validates a shard held in memory (data stays owned by the caller and must outlive the shard):
 * size, magic, version, dtype, reserved bytes, header checksum, count vs size, payload
 * checksum, every token < vocab_size. Errors name `name` and what was expected. */
gt_status gt_token_shard_parse(const void *data, size_t size, const char *name, gt_token_shard *out,
                               gt_error *err);
/* Maps a shard file read-only and validates it as above. */
gt_status gt_token_shard_open(const char *path, gt_token_shard *out, gt_error *err);
void gt_token_shard_close(gt_token_shard *s);

static inline uint32_t gt_token_shard_get(const gt_token_shard *s, uint64_t i)
{
    const uint8_t *p = s->payload + i * s->dtype;
    return s->dtype == 2
               ? (uint32_t)p[0] | (uint32_t)p[1] << 8
               : (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Streaming writer: tokens go to PATH.tmp.XXXXXX; commit checks them, writes the header,
 * fsyncs, renames to PATH and fsyncs the directory, so PATH is either absent, the old file, or
 * the complete new one. dtype is uint16 when vocab_size <= 65536, else uint32. */
typedef struct gt_token_shard_writer gt_token_shard_writer;
gt_status gt_token_shard_writer_open(const char *path, uint32_t vocab_size,
                                     gt_token_shard_writer **out, gt_error *err);
/* GT_ERR_INVALID (naming the position) for an id outside [0, vocab_size). */
gt_status gt_token_shard_writer_append(gt_token_shard_writer *w, const int32_t *ids, size_t n,
                                       gt_error *err);
/* Finishes and frees the writer (also on failure, after removing the temporary file). */
gt_status gt_token_shard_writer_commit(gt_token_shard_writer *w, gt_error *err);
/* Removes the temporary file and frees the writer. */
void gt_token_shard_writer_abort(gt_token_shard_writer *w);
/* One call: open, append, commit. */
gt_status gt_token_shard_write(const char *path, const int32_t *ids, size_t n, uint32_t vocab_size,
                               gt_error *err);

/* ---------------------------------------------------------------- text → tokens */

typedef enum {
    GT_TEXT_AUTO,  /* by extension: .jsonl / .json / .ndjson → JSONL, anything else → PLAIN */
    GT_TEXT_PLAIN, /* the whole file is one document */
    GT_TEXT_JSONL  /* one JSON object per line; the document is its string field (default
                      "text"); blank lines are skipped */
} gt_text_format;

typedef struct {
    gt_text_format format;
    const char *json_field; /* NULL: "text" */
    bool add_bos, add_eos;  /* per document, when the tokenizer has them (default true) */
} gt_tokenize_options;

void gt_tokenize_options_default(gt_tokenize_options *o);

typedef struct {
    int64_t files, documents, bytes, tokens;
} gt_tokenize_stats;

/* Appends the tokens of every document of a file: each document is
 * gt_tokenizer_encode_document(text, add_bos, add_eos), as torchtitan tokenizes a sample, so
 * documents are packed back to back as [BOS] doc [EOS] [BOS] doc [EOS] … Errors name the file
 * (and line for JSONL). stats (may be NULL) accumulates. */
gt_status gt_data_tokenize_file(gt_tokenizer *tok, const char *path, const gt_tokenize_options *o,
                                gt_token_ids *out, gt_tokenize_stats *stats, gt_error *err);

/* Tokenizes files in order into one shard at out_path (vocab size from the tokenizer), written
 * atomically. This is what `graphtrain tokenize` runs. */
gt_status gt_data_tokenize_to_shard(gt_tokenizer *tok, const char *const *paths, int n_paths,
                                    const gt_tokenize_options *o, const char *out_path,
                                    gt_tokenize_stats *stats, gt_error *err);

/* ---------------------------------------------------------------- loader */

typedef struct {
    int64_t seq_len;     /* tokens a model sees per sequence; a sample holds seq_len + 1 */
    int64_t local_batch; /* sequences per rank per batch */
    int32_t dp_rank, dp_degree;
    bool shuffle;  /* token sources: visit windows in a fresh random order each epoch */
    uint64_t seed; /* for shuffle */
} gt_loader_config;

/* The loader's position: part of a checkpoint. next_sample is global (independent of the
 * number of ranks); fingerprint identifies source + seq_len + shuffle + seed, so a position is
 * never applied to other data. */
typedef struct {
    uint64_t next_sample;
    uint64_t fingerprint;
} gt_loader_state;

typedef struct gt_loader gt_loader;

/* Sample g of a token stream is the window tokens[w·(L+1), (w+1)·(L+1)) with w = g mod W
 * (or the epoch's permutation of it), W = floor(count / (L+1)) windows, epoch = g / W: windows
 * do not overlap, as torchtitan cuts its token buffer, and the tail shorter than a window is
 * not used. The synthetic source generates sample g directly. A batch of rank r is samples
 * next_sample + r·B + i, i < B; the batch advances next_sample by dp_degree·B, so the ranks'
 * batches are disjoint and their union, in rank order, is the 1-rank batch of dp_degree·B.
 *
 * The loader borrows its source: keep it alive until gt_loader_free. */
gt_status gt_loader_create_synthetic(const gt_loader_config *c, const gt_synthetic *s,
                                     gt_loader **out, gt_error *err);
gt_status gt_loader_create_shard(const gt_loader_config *c, const gt_token_shard *shard,
                                 gt_loader **out, gt_error *err);
/* name identifies the stream in messages. */
gt_status gt_loader_create_tokens(const gt_loader_config *c, const int32_t *tokens, size_t n,
                                  const char *name, gt_loader **out, gt_error *err);
void gt_loader_free(gt_loader *l);

/* Fills tokens[local_batch][seq_len + 1] and advances one global batch. */
gt_status gt_loader_next(gt_loader *l, int64_t *tokens, gt_error *err);
/* inputs[b][t] = tokens[b][t], labels[b][t] = tokens[b][t + 1] (t < seq_len): next-token
 * targets. */
void gt_loader_split_batch(const int64_t *tokens, int64_t batch, int64_t seq_len, int64_t *inputs,
                           int64_t *labels);
/* Per-token positions of packed documents (torchtitan's dataloader "positions"; the model's
 * RoPE and block-causal mask read them): positions[b][t] restarts at 0 at t = 0 (a window's
 * first token starts its document, as torchtitan renormalises a window's positions) and at every
 * document start, and counts up by one inside a document. A document starts at each bos token
 * (bos >= 0), or, when only eos is known (bos < 0, eos >= 0), right after each eos; with neither
 * every row is one document (the synthetic corpus). */
void gt_loader_positions(const int64_t *inputs, int64_t batch, int64_t seq_len, int64_t bos,
                         int64_t eos, int64_t *positions);
/* Windows per epoch (0 for the synthetic source, which has no epochs). */
uint64_t gt_loader_samples_per_epoch(const gt_loader *l);

void gt_loader_get_state(const gt_loader *l, gt_loader_state *st);
/* GT_ERR_INVALID when the fingerprint is another source's or configuration's. */
gt_status gt_loader_set_state(gt_loader *l, const gt_loader_state *st, gt_error *err);
/* "gtloader1:<next_sample>:<fingerprint as 16 hex digits>" for checkpoint manifests; buf of at
 * least 64 bytes. */
void gt_loader_state_format(const gt_loader_state *st, char *buf, size_t n);
gt_status gt_loader_state_parse(const char *s, gt_loader_state *st, gt_error *err);

#ifdef __cplusplus
}
#endif
#endif
