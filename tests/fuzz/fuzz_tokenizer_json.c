/* fuzz_tokenizer_json.c — tokenizer.json parsing (and encoding with whatever loads).
 *
 * The input is a tokenizer.json; it is loaded alone and with a small tokenizer_config.json. A
 * file that loads must encode and decode without crashing: fixed probe strings (special-token
 * look-alikes, whitespace runs, digits, multi-byte text, a backtracking trap) and the input
 * itself as text. Encoding may fail (a regex past its match limit, invalid UTF-8), never crash. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "graphtrain/gt_tokenizer.h"

static void gt_fuzz_exercise(gt_tokenizer *tok, const uint8_t *data, size_t size)
{
    static const char *probes[] = {
        "",
        "Hello world! It's 2024, isn't it?\n\n  indented\ttab\r\n",
        "<s>abc</s><x> <s> ab c [MASK]  <|endoftext|>",
        "Café 日本語 😀👍🏽 e\xCC\x81 \xC2\xA0\xE3\x80\x80 12345678",
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaab",
    };
    gt_error err = {0};
    for (size_t i = 0; i < sizeof probes / sizeof *probes + 1; i++) {
        const char *s = i < sizeof probes / sizeof *probes ? probes[i] : (const char *)data;
        size_t n = i < sizeof probes / sizeof *probes ? strlen(s) : (size > 4096 ? 4096 : size);
        gt_token_ids ids = {0};
        gt_status st = gt_tokenizer_encode(tok, s, n, i % 2 == 0, &ids, &err);
        if (st == GT_OK) {
            char *out = NULL;
            size_t out_len = 0;
            if (gt_tokenizer_decode(tok, ids.ids, ids.n, &out, &out_len, &err) == GT_OK) free(out);
        }
        gt_token_ids_free(&ids);
        ids = (gt_token_ids){0};
        (void)gt_tokenizer_encode_document(tok, s, n, true, true, &ids, &err);
        gt_token_ids_free(&ids);
    }
    int32_t probe_ids[] = {0, 1, 2, gt_tokenizer_vocab_size(tok) - 1, gt_tokenizer_vocab_size(tok)};
    char *out = NULL;
    size_t out_len;
    if (gt_tokenizer_decode(tok, probe_ids, 5, &out, &out_len, &err) == GT_OK) free(out);
    size_t len;
    (void)gt_tokenizer_id_to_token(tok, 0, &len);
    (void)gt_tokenizer_token_to_id(tok, "<s>", 3);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char config[] =
        "{\"bos_token\": \"<s>\", \"eos_token\": {\"content\": \"</s>\", \"lstrip\": true}, "
        "\"pad_token\": null, \"added_tokens_decoder\": {\"5\": {\"content\": \"<x>\", "
        "\"rstrip\": true, \"special\": true}}}";
    for (int with_config = 0; with_config < 2; with_config++) {
        gt_tokenizer *tok = NULL;
        gt_error err = {0};
        gt_status st =
            gt_tokenizer_load_json((const char *)data, size, with_config ? config : NULL,
                                   with_config ? sizeof config - 1 : 0, "fuzz.json", &tok, &err);
        if (st == GT_OK) {
            gt_fuzz_exercise(tok, data, size);
            gt_tokenizer_free(tok);
        }
    }
    return 0;
}
