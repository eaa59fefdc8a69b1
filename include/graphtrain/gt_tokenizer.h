/* gt_tokenizer.h — Hugging Face byte-level BPE tokenizers (tokenizer.json), encode and decode.
 *
 * Reads the tokenizer.json that the Hugging Face `tokenizers` library writes for byte-level BPE
 * models (GPT-2, llama3, DeepSeek-V3, the torchtitan test tokenizer) and encodes text to exactly
 * the ids that library produces:
 *
 *   text ─ added/special tokens matched first (leftmost-longest; lstrip, rstrip, single_word)
 *        ─ pre_tokenizer on each remaining piece: Sequence of Split (PCRE2 regex with UTF + UCP,
 *          or a literal; behaviors Isolated, Removed, MergedWithPrevious, MergedWithNext,
 *          Contiguous; invert), Digits, ByteLevel (add_prefix_space; GPT-2's regex when
 *          use_regex; bytes → printable characters)
 *        ─ BPE on each pre-token (merge ranks, lowest rank first, leftmost on ties; a per-word
 *          cache; ignore_merges; unk_token / fuse_unk; unknown characters are dropped when there
 *          is no unk_token, as Hugging Face does)
 *        ─ post_processor when asked (TemplateProcessing, ByteLevel, Sequence of both).
 *
 * Supported tokenizer.json: model.type "BPE" (merges as "a b" strings or [a, b] pairs; dropout
 * null or 0; no continuing_subword_prefix / end_of_word_suffix; no byte_fallback), normalizer
 * null, decoder null or ByteLevel. Anything else is refused with GT_ERR_UNSUPPORTED naming the
 * field; a malformed file with GT_ERR_FORMAT naming the file and the field.
 *
 * Regex note: patterns run on PCRE2 where Hugging Face uses Oniguruma. `\s` and `\S` are
 * rewritten to \p{White_Space} / \P{White_Space} (Oniguruma's meaning; PCRE2's `\s` also matches
 * U+180E). Characters newer than the system PCRE2's Unicode tables (PCRE2 10.42: Unicode 15.0)
 * have no letter/number property and may split differently from Hugging Face's.
 *
 * Text is UTF-8; invalid UTF-8 is refused (GT_ERR_FORMAT with the byte offset). */
#ifndef GRAPHTRAIN_GT_TOKENIZER_H
#define GRAPHTRAIN_GT_TOKENIZER_H

#include "graphtrain/gt_core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gt_tokenizer gt_tokenizer;

/* A growable array of token ids. Start zeroed ({0}); gt_token_ids_free releases it. */
typedef struct {
    int32_t *ids;
    size_t n, cap;
} gt_token_ids;

void gt_token_ids_free(gt_token_ids *v);
/* Appends n ids (GT_ERR_NOMEM when the array cannot grow). */
gt_status gt_token_ids_append(gt_token_ids *v, const int32_t *ids, size_t n, gt_error *err);

/* path: a tokenizer.json file (its folder's tokenizer_config.json, when there is one, is read too),
 * or a directory holding tokenizer.json and optionally tokenizer_config.json. With a config, every
 * special token it names (bos_token, eos_token, pad_token, unk_token, sep_token, cls_token,
 * mask_token, added_tokens_decoder) is added as a special token and BOS/EOS are the config's
 * bos_token / eos_token — exactly as torchtitan's HuggingFaceTokenizer reads a tokenizer directory.
 * Without a config, BOS/EOS are taken from the special added tokens with the usual names
 * (<|begin_of_text|>, <s>, <|bos|>, <bos>, [BOS] / <|end_of_text|>, </s>, <|endoftext|>, <|eos|>,
 * <eos>, [EOS]) when present. When neither BOS nor EOS is known, a warning says so (documents
 * would be joined with nothing between them). */
gt_status gt_tokenizer_load(const char *path, gt_tokenizer **out, gt_error *err);

/* The same from memory: json (json_len bytes) is tokenizer.json's text; config_json may be NULL.
 * name is the file name used in messages. The buffers are not kept. */
gt_status gt_tokenizer_load_json(const char *json, size_t json_len, const char *config_json,
                                 size_t config_len, const char *name, gt_tokenizer **out,
                                 gt_error *err);
void gt_tokenizer_free(gt_tokenizer *t);

/* Largest id + 1 over the model vocab and the added tokens. */
int32_t gt_tokenizer_vocab_size(const gt_tokenizer *t);
/* -1 when the tokenizer has none. */
int32_t gt_tokenizer_bos_id(const gt_tokenizer *t);
int32_t gt_tokenizer_eos_id(const gt_tokenizer *t);
/* Id of a token's string form (vocab entry or added token); -1 when absent. */
int32_t gt_tokenizer_token_to_id(const gt_tokenizer *t, const char *token, size_t len);
/* The token string of id (not NUL-terminated; *len set), or NULL for an unused id. */
const char *gt_tokenizer_id_to_token(const gt_tokenizer *t, int32_t id, size_t *len);

/* Appends the ids of text (len bytes of UTF-8) to out: Hugging Face's
 * Tokenizer.encode(text, add_special_tokens=post_process).ids. Not thread-safe: the tokenizer
 * keeps a per-word BPE cache. Fails on invalid UTF-8 and when a regex exceeds PCRE2's match
 * limit (a pathological pattern). On failure out keeps what was appended before the call. */
gt_status gt_tokenizer_encode(gt_tokenizer *t, const char *text, size_t len, bool post_process,
                              gt_token_ids *out, gt_error *err);

/* Appends one training document as torchtitan's HuggingFaceTokenizer.encode(text, add_bos,
 * add_eos): encode with the post-processor, then BOS in front unless the post-processor already
 * adds it (and the tokenizer has one), EOS at the end likewise. */
gt_status gt_tokenizer_encode_document(gt_tokenizer *t, const char *text, size_t len, bool add_bos,
                                       bool add_eos, gt_token_ids *out, gt_error *err);

/* The bytes of ids, as Hugging Face's decode(ids, skip_special_tokens=False) before its lossy
 * UTF-8 conversion: with a ByteLevel decoder each token's characters map back to bytes (a token
 * with a character outside the byte alphabet is copied as its UTF-8). *out is malloc'd and
 * NUL-terminated (*out_len excludes the NUL). An unused or out-of-range id is an error. */
gt_status gt_tokenizer_decode(const gt_tokenizer *t, const int32_t *ids, size_t n, char **out,
                              size_t *out_len, gt_error *err);

#ifdef __cplusplus
}
#endif
#endif
