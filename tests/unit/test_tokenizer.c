/* test_tokenizer.c — the byte-level BPE tokenizer against Hugging Face tokenizers' own ids.
 *
 * References (all written by tools/gen_tokenizer.py with the `tokenizers` package):
 *   - tinyshakespeare.ids.u16le: HF's ids for the whole of ../shared/data/tinyshakespeare.txt
 *     with the generated llama3-style tokenizer; we must produce exactly these and decode back
 *     to the file's bytes;
 *   - cases.json: unicode text (accents, emoji, CJK, scripts with combining marks, Unicode
 *     whitespace), special tokens, a GPT-2 style tokenizer (add_prefix_space, its regex, legacy
 *     merges, added tokens with lstrip/rstrip/single_word/normalized), every Split behavior,
 *     Digits, ignore_merges, unk_token/fuse_unk, and the torchtitan test tokenizer read the way
 *     torchtitan reads it (BOS/EOS from tokenizer_config.json).
 * Plus properties needing no reference: decode(encode(x)) == x for random UTF-8, and the error
 * messages for malformed files name the file and the field. Cases that need ../shared are
 * skipped only when it is absent. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "graphtrain/gt_tokenizer.h"
#include "gt_test.h"

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    size_t got = fread(buf, 1, (size_t)n, f);
    fclose(f);
    buf[got] = '\0';
    *len = got;
    return buf;
}

static bool exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0;
}

static char shared_dir[4096];

static bool have_shared(void)
{
    char p[4200];
    snprintf(p, sizeof p, "%s/data/tinyshakespeare.txt", shared_dir);
    return exists(p);
}

static bool ids_equal(const gt_token_ids *got, json_t *want, size_t *first_diff)
{
    size_t n = json_array_size(want);
    for (size_t i = 0; i < n && i < got->n; i++) {
        if (got->ids[i] != (int32_t)json_integer_value(json_array_get(want, i))) {
            *first_diff = i;
            return false;
        }
    }
    *first_diff = n < got->n ? n : got->n;
    return n == got->n;
}

/* ---------------------------------------------------------------- whole tinyshakespeare */

static void test_tinyshakespeare(void)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/data/tinyshakespeare.txt", shared_dir);
    size_t text_len, ref_len;
    char *text = read_file(path, &text_len);
    char *ref =
        read_file(gt_test_path("tests/fixtures/tokenizer/tinyshakespeare.ids.u16le"), &ref_len);
    EXPECT(text && ref, "missing %s or the ids fixture", path);
    if (!text || !ref) return;
    size_t n_ref = ref_len / 2;

    gt_error err = {0};
    gt_tokenizer *tok = NULL;
    EXPECT_OK(gt_tokenizer_load(gt_test_path("tests/fixtures/tokenizer"), &tok, &err), &err);
    if (!tok) return;
    gt_token_ids ids = {0};
    EXPECT_OK(gt_tokenizer_encode(tok, text, text_len, true, &ids, &err), &err);
    size_t mismatches = 0, first = SIZE_MAX;
    for (size_t i = 0; i < n_ref && i < ids.n; i++) {
        uint16_t want = (uint16_t)((unsigned char)ref[2 * i] | (unsigned char)ref[2 * i + 1] << 8);
        if (ids.ids[i] != want) {
            mismatches++;
            if (first == SIZE_MAX) first = i;
        }
    }
    EXPECT(ids.n == n_ref && mismatches == 0,
           "tinyshakespeare: %zu ids (HF %zu), %zu differ, first at %zu", ids.n, n_ref, mismatches,
           first);

    /* BOS comes from the template; the rest decodes to the file's bytes exactly */
    EXPECT(ids.n > 0 && ids.ids[0] == gt_tokenizer_bos_id(tok), "first id %d, bos %d",
           ids.n ? ids.ids[0] : -1, gt_tokenizer_bos_id(tok));
    char *dec = NULL;
    size_t dec_len = 0;
    EXPECT_OK(gt_tokenizer_decode(tok, ids.ids + 1, ids.n - 1, &dec, &dec_len, &err), &err);
    EXPECT(dec && dec_len == text_len && memcmp(dec, text, text_len) == 0,
           "decode(encode(tinyshakespeare)) differs (%zu vs %zu bytes)", dec_len, text_len);
    free(dec);

    /* without the post-processor: the same ids minus the BOS */
    gt_token_ids plain = {0};
    EXPECT_OK(gt_tokenizer_encode(tok, text, text_len, false, &plain, &err), &err);
    EXPECT(plain.n + 1 == ids.n && memcmp(plain.ids, ids.ids + 1, plain.n * sizeof(int32_t)) == 0,
           "encode without post-processing is not the template's $A");

    /* The legacy merges form ("a b" strings) gives the same tokenizer. */
    size_t json_len;
    char *json = read_file(gt_test_path("tests/fixtures/tokenizer/tokenizer.json"), &json_len);
    json_t *root = json_loadb(json, json_len, JSON_ALLOW_NUL, NULL);
    json_t *merges = json_object_get(json_object_get(root, "model"), "merges");
    size_t n_merges = json_array_size(merges);
    for (size_t i = 0; i < n_merges; i++) {
        json_t *m = json_array_get(merges, i);
        char buf[512];
        snprintf(buf, sizeof buf, "%s %s", json_string_value(json_array_get(m, 0)),
                 json_string_value(json_array_get(m, 1)));
        json_array_set_new(merges, i, json_string(buf));
    }
    char *legacy = json_dumps(root, JSON_COMPACT);
    gt_tokenizer *tok2 = NULL;
    EXPECT_OK(gt_tokenizer_load_json(legacy, strlen(legacy), NULL, 0, "legacy.json", &tok2, &err),
              &err);
    if (tok2) {
        gt_token_ids ids2 = {0}, ids1 = {0};
        size_t excerpt = text_len < 200000 ? text_len : 200000;
        EXPECT_OK(gt_tokenizer_encode(tok2, text, excerpt, false, &ids2, &err), &err);
        EXPECT_OK(gt_tokenizer_encode(tok, text, excerpt, false, &ids1, &err), &err);
        EXPECT(n_merges > 1000 && ids2.n > 0 && ids2.n == ids1.n &&
                   memcmp(ids2.ids, ids1.ids, ids2.n * sizeof(int32_t)) == 0,
               "legacy merges encode differently");
        gt_token_ids_free(&ids1);
        /* a bare tokenizer.json: BOS/EOS from the special tokens' names */
        EXPECT(gt_tokenizer_bos_id(tok2) == gt_tokenizer_token_to_id(tok2, "<|begin_of_text|>", 17),
               "bare file bos %d", gt_tokenizer_bos_id(tok2));
        EXPECT(gt_tokenizer_eos_id(tok2) == gt_tokenizer_token_to_id(tok2, "<|end_of_text|>", 15),
               "bare file eos %d", gt_tokenizer_eos_id(tok2));
        gt_token_ids_free(&ids2);
        gt_tokenizer_free(tok2);
    }
    free(legacy);
    json_decref(root);
    free(json);
    gt_token_ids_free(&plain);
    gt_token_ids_free(&ids);
    gt_tokenizer_free(tok);
    free(text);
    free(ref);
}

/* ---------------------------------------------------------------- cases.json */

static char *replace_all(const char *s, size_t n, const char *from, size_t from_len, const char *to,
                         size_t to_len, size_t *out_len)
{
    char *out = malloc(n * (to_len > from_len ? to_len : 1) + 1);
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        if (i + from_len <= n && memcmp(s + i, from, from_len) == 0) {
            memcpy(out + o, to, to_len);
            o += to_len;
            i += from_len;
        } else {
            out[o++] = s[i++];
        }
    }
    out[o] = '\0';
    *out_len = o;
    return out;
}

static void set_dotted(json_t *root, const char *dotted, json_t *value)
{
    char key[256];
    snprintf(key, sizeof key, "%s", dotted);
    json_t *node = root;
    char *k = key, *dot;
    while ((dot = strchr(k, '.'))) {
        *dot = '\0';
        node = json_object_get(node, k);
        k = dot + 1;
    }
    json_object_set(node, k, value);
}

/* Loads a case's tokenizer: a fixture file, the fixture directory, or the shared one, with the
 * case's overrides applied to tokenizer.json. */
static gt_tokenizer *load_case_tokenizer(json_t *c, gt_error *err)
{
    const char *which = json_string_value(json_object_get(c, "tokenizer"));
    char json_path[4200], config_path[4300] = "";
    if (strncmp(which, "shared:", 7) == 0) {
        snprintf(json_path, sizeof json_path, "%s/data/%s/tokenizer.json", shared_dir, which + 7);
        snprintf(config_path, sizeof config_path, "%s/data/%s/tokenizer_config.json", shared_dir,
                 which + 7);
    } else if (strncmp(which, "dir:", 4) == 0) {
        snprintf(json_path, sizeof json_path, "%s",
                 gt_test_path("tests/fixtures/tokenizer/tokenizer.json"));
        snprintf(config_path, sizeof config_path, "%s",
                 gt_test_path("tests/fixtures/tokenizer/tokenizer_config.json"));
    } else {
        char rel[512];
        snprintf(rel, sizeof rel, "tests/fixtures/tokenizer/%s", which);
        snprintf(json_path, sizeof json_path, "%s", gt_test_path(rel));
    }
    size_t json_len = 0, config_len = 0;
    char *json = read_file(json_path, &json_len);
    char *config = config_path[0] ? read_file(config_path, &config_len) : NULL;
    if (!json) {
        gt_error_set(err, GT_ERR_IO, "cannot read %s", json_path);
        free(config);
        return NULL;
    }
    json_t *override = json_object_get(c, "override");
    if (override) {
        /* jansson cannot hold the "\u0000" key of torchtitan's vocab: carry it through the
         * edit as U+10FFFF and write the escape back afterwards */
        char *edited = replace_all(json, json_len, "\\u0000", 6, "\\udbff\\udfff", 12, &json_len);
        free(json);
        json_t *root = json_loadb(edited, json_len, 0, NULL);
        free(edited);
        const char *key;
        json_t *v;
        json_object_foreach(override, key, v) set_dotted(root, key, v);
        char *dumped = json_dumps(root, JSON_COMPACT);
        json = replace_all(dumped, strlen(dumped), "\xF4\x8F\xBF\xBF", 4, "\\u0000", 6, &json_len);
        free(dumped);
        json_decref(root);
    }
    gt_tokenizer *tok = NULL;
    gt_tokenizer_load_json(json, json_len, config, config_len, json_path, &tok, err);
    free(json);
    free(config);
    return tok;
}

static void test_cases(void)
{
    json_error_t jerr;
    json_t *root = json_load_file(gt_test_path("tests/fixtures/tokenizer/cases.json"), 0, &jerr);
    EXPECT(root, "cases.json: %s", jerr.text);
    json_t *cases = json_object_get(root, "cases");
    int ran = 0, skipped = 0;
    for (size_t i = 0; i < json_array_size(cases); i++) {
        json_t *c = json_array_get(cases, i);
        const char *name = json_string_value(json_object_get(c, "name"));
        const char *which = json_string_value(json_object_get(c, "tokenizer"));
        if (strncmp(which, "shared:", 7) == 0 && !have_shared()) {
            skipped++;
            continue;
        }
        gt_error err = {0};
        gt_tokenizer *tok = load_case_tokenizer(c, &err);
        EXPECT(tok, "%s: load failed: %s", name, err.msg);
        if (!tok) continue;
        json_t *text = json_object_get(c, "text");
        const char *s = json_string_value(text);
        size_t n = json_string_length(text);
        gt_token_ids ids = {0};
        const char *mode = json_string_value(json_object_get(c, "mode"));
        gt_status st;
        if (strcmp(mode, "document") == 0)
            st = gt_tokenizer_encode_document(tok, s, n, true, true, &ids, &err);
        else
            st = gt_tokenizer_encode(tok, s, n, json_is_true(json_object_get(c, "post_process")),
                                     &ids, &err);
        EXPECT(st == GT_OK, "%s: encode: %s", name, err.msg);
        size_t diff;
        json_t *want = json_object_get(c, "ids");
        bool same = ids_equal(&ids, want, &diff);
        EXPECT(same, "%s: %zu ids, HF %zu; first difference at %zu (got %d, HF %d)", name, ids.n,
               json_array_size(want), diff, diff < ids.n ? ids.ids[diff] : -1,
               diff < json_array_size(want) ? (int)json_integer_value(json_array_get(want, diff))
                                            : -1);
        json_t *decoded = json_object_get(c, "decoded");
        if (decoded) {
            char *d = NULL;
            size_t dl = 0;
            EXPECT_OK(gt_tokenizer_decode(tok, ids.ids, ids.n, &d, &dl, &err), &err);
            EXPECT(d && dl == json_string_length(decoded) &&
                       memcmp(d, json_string_value(decoded), dl) == 0,
                   "%s: decode differs from HF's", name);
            free(d);
        }
        gt_token_ids_free(&ids);
        gt_tokenizer_free(tok);
        ran++;
    }
    EXPECT(ran >= 60, "only %d cases ran", ran);
    if (skipped) printf("skipped %d cases that need %s\n", skipped, shared_dir);
    json_decref(root);
}

/* ---------------------------------------------------------------- torchtitan's tokenizer */

static void test_torchtitan_special_ids(void)
{
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/data/tokenizer", shared_dir);
    gt_error err = {0};
    gt_tokenizer *tok = NULL;
    EXPECT_OK(gt_tokenizer_load(dir, &tok, &err), &err);
    if (!tok) return;
    /* tokenizer_config.json: bos "<|begin_of_text|>" (2002), eos "<|end_of_text|>" (2003) */
    EXPECT(gt_tokenizer_bos_id(tok) == 2002 && gt_tokenizer_eos_id(tok) == 2003, "bos %d eos %d",
           gt_tokenizer_bos_id(tok), gt_tokenizer_eos_id(tok));
    EXPECT(gt_tokenizer_vocab_size(tok) == 2020, "vocab %d", gt_tokenizer_vocab_size(tok));
    size_t len;
    const char *s = gt_tokenizer_id_to_token(tok, 2019, &len);
    EXPECT(s && len == 5 && memcmp(s, "[PAD]", 5) == 0, "id 2019");
    /* its vocab key "\u0000" is a one-byte NUL token, id 0 */
    s = gt_tokenizer_id_to_token(tok, 0, &len);
    EXPECT(s && len == 1 && s[0] == '\0', "id 0 is not the NUL token");
    EXPECT(gt_tokenizer_token_to_id(tok, "\0", 1) == 0, "token_to_id(NUL)");
    gt_tokenizer_free(tok);
}

/* ---------------------------------------------------------------- properties */

static void test_round_trip_random(void)
{
    gt_error err = {0};
    gt_tokenizer *tok = NULL;
    EXPECT_OK(
        gt_tokenizer_load(gt_test_path("tests/fixtures/tokenizer/tokenizer.json"), &tok, &err),
        &err);
    if (!tok) return;
    /* Random UTF-8 over a mix of ranges: ASCII (with whitespace and digits), Latin-1, CJK,
     * emoji, and the special tokens' text. A byte-level tokenizer must reproduce every byte. */
    static const uint32_t ranges[][2] = {{0x20, 0x7E},     {0x09, 0x0D},       {0xA0, 0x17F},
                                         {0x4E00, 0x4FFF}, {0x1F600, 0x1F64F}, {0x0300, 0x036F}};
    for (int trial = 0; trial < 200; trial++) {
        char buf[2048];
        size_t n = 0;
        int len = 1 + (int)(gt_rng_uniform(7, 1, (uint64_t)trial, 0) * 300);
        for (int i = 0; i < len && n + 32 < sizeof buf; i++) {
            uint64_t idx = (uint64_t)trial * 1000 + (uint64_t)i;
            double u = gt_rng_uniform(7, 2, idx, 0);
            if (u < 0.02) {
                memcpy(buf + n, "<|end_of_text|>", 15);
                n += 15;
                continue;
            }
            size_t r = u < 0.6 ? 0 : (size_t)(gt_rng_uniform(7, 3, idx, 0) * 6);
            uint32_t lo = ranges[r][0], hi = ranges[r][1];
            uint32_t cp = lo + (uint32_t)(gt_rng_uniform(7, 4, idx, 0) * (hi - lo + 1));
            if (cp > hi) cp = hi;
            /* UTF-8 by hand so the test does not share code with the tokenizer */
            if (cp < 0x80) {
                buf[n++] = (char)cp;
            } else if (cp < 0x800) {
                buf[n++] = (char)(0xC0 | (cp >> 6));
                buf[n++] = (char)(0x80 | (cp & 0x3F));
            } else if (cp < 0x10000) {
                buf[n++] = (char)(0xE0 | (cp >> 12));
                buf[n++] = (char)(0x80 | ((cp >> 6) & 0x3F));
                buf[n++] = (char)(0x80 | (cp & 0x3F));
            } else {
                buf[n++] = (char)(0xF0 | (cp >> 18));
                buf[n++] = (char)(0x80 | ((cp >> 12) & 0x3F));
                buf[n++] = (char)(0x80 | ((cp >> 6) & 0x3F));
                buf[n++] = (char)(0x80 | (cp & 0x3F));
            }
        }
        gt_token_ids ids = {0};
        EXPECT_OK(gt_tokenizer_encode(tok, buf, n, false, &ids, &err), &err);
        char *d = NULL;
        size_t dl = 0;
        EXPECT_OK(gt_tokenizer_decode(tok, ids.ids, ids.n, &d, &dl, &err), &err);
        EXPECT(d && dl == n && memcmp(d, buf, n) == 0, "trial %d: round trip differs", trial);
        /* encoding again (now from the BPE cache) gives the same ids */
        gt_token_ids again = {0};
        EXPECT_OK(gt_tokenizer_encode(tok, buf, n, false, &again, &err), &err);
        EXPECT(again.n == ids.n && memcmp(again.ids, ids.ids, ids.n * sizeof(int32_t)) == 0,
               "trial %d: second encode differs", trial);
        free(d);
        gt_token_ids_free(&ids);
        gt_token_ids_free(&again);
    }
    gt_tokenizer_free(tok);
}

static void test_bad_input(void)
{
    gt_error err = {0};
    gt_tokenizer *tok = NULL;
    EXPECT_OK(gt_tokenizer_load(gt_test_path("tests/fixtures/tokenizer"), &tok, &err), &err);
    if (!tok) return;
    gt_token_ids ids = {0};
    int32_t keep = 5;
    gt_token_ids_append(&ids, &keep, 1, &err);
    const char bad[] = "abc\xC3(def";
    gt_error_clear(&err);
    gt_status st = gt_tokenizer_encode(tok, bad, sizeof bad - 1, false, &ids, &err);
    EXPECT(st == GT_ERR_FORMAT && strstr(err.msg, "UTF-8") && strstr(err.msg, "offset 3"),
           "invalid UTF-8: %s", err.msg);
    EXPECT(ids.n == 1 && ids.ids[0] == 5, "a failed encode must leave earlier ids alone");
    int32_t bad_ids[] = {1, 2048, 3};
    char *d = NULL;
    size_t dl;
    gt_error_clear(&err);
    st = gt_tokenizer_decode(tok, bad_ids, 3, &d, &dl, &err);
    EXPECT(st == GT_ERR_INVALID && strstr(err.msg, "2048") && !d, "decode bad id: %s", err.msg);
    gt_token_ids_free(&ids);
    gt_tokenizer_free(tok);

    gt_error_clear(&err);
    st = gt_tokenizer_load("/nonexistent/tokenizer.json", &tok, &err);
    EXPECT(st == GT_ERR_IO && strstr(err.msg, "/nonexistent/tokenizer.json"), "missing: %s",
           err.msg);
}

/* Malformed files (the fuzz seeds): the error names the file and the field. */
static void test_errors(void)
{
    static const struct {
        const char *file;
        gt_status code;
        const char *field;
    } cases[] = {
        {"bad_model_type.json", GT_ERR_UNSUPPORTED, "model.type"},
        {"no_model.json", GT_ERR_FORMAT, "model"},
        {"vocab_not_object.json", GT_ERR_FORMAT, "model.vocab"},
        {"vocab_negative_id.json", GT_ERR_FORMAT, "model.vocab"},
        {"vocab_dup_id.json", GT_ERR_FORMAT, "both have id 0"},
        {"vocab_huge_id.json", GT_ERR_FORMAT, "model.vocab"},
        {"merge_unknown.json", GT_ERR_FORMAT, "model.merges[0]: token \"zz\""},
        {"merge_result_missing.json", GT_ERR_FORMAT, "model.merges[0]: the merged token \"ba\""},
        {"merge_bad_string.json", GT_ERR_FORMAT, "model.merges[0]"},
        {"merge_bad_type.json", GT_ERR_FORMAT, "model.merges[0]"},
        {"bad_regex.json", GT_ERR_FORMAT, "pre_tokenizer.pretokenizers[0].pattern"},
        {"bad_behavior.json", GT_ERR_FORMAT, "pre_tokenizer.pretokenizers[0]"},
        {"bad_pretok.json", GT_ERR_UNSUPPORTED, "pre_tokenizer"},
        {"normalizer.json", GT_ERR_UNSUPPORTED, "normalizer"},
        {"added_no_content.json", GT_ERR_FORMAT, "added_tokens[0]"},
        {"added_bad_id.json", GT_ERR_FORMAT, "added_tokens[0]"},
        {"added_id_clash.json", GT_ERR_FORMAT, "added_tokens[0]"},
        {"template_unknown.json", GT_ERR_FORMAT, "post_processor.single[0]"},
        {"template_bad_id.json", GT_ERR_FORMAT, "post_processor"},
        {"decoder_bad.json", GT_ERR_UNSUPPORTED, "decoder"},
        {"dropout.json", GT_ERR_UNSUPPORTED, "model.dropout"},
        {"unk_missing.json", GT_ERR_FORMAT, "model.unk_token"},
        {"truncation.json", GT_ERR_UNSUPPORTED, "truncation"},
        {"not_json.json", GT_ERR_FORMAT, "not valid JSON"},
        {"empty.json", GT_ERR_FORMAT, "not valid JSON"},
        {"array.json", GT_ERR_FORMAT, "(root)"},
        {"added_id_not_next.json", GT_ERR_FORMAT, "added_tokens[0]: \"<s>\" has id 12"},
        {"nested_too_deep.json", GT_ERR_UNSUPPORTED, "nested deeper than"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char rel[256];
        snprintf(rel, sizeof rel, "tests/fuzz/corpus/tokenizer_json/%s", cases[i].file);
        gt_error err = {0};
        gt_tokenizer *tok = NULL;
        gt_status st = gt_tokenizer_load(gt_test_path(rel), &tok, &err);
        EXPECT(st == cases[i].code && !tok && strstr(err.msg, cases[i].file) &&
                   strstr(err.msg, cases[i].field),
               "%s: got %s \"%s\", want %s naming \"%s\"", cases[i].file, gt_status_name(st),
               err.msg, gt_status_name(cases[i].code), cases[i].field);
        gt_tokenizer_free(tok);
    }

    /* the valid seed loads; its catastrophic-regex sibling fails to encode instead of hanging */
    gt_error err = {0};
    gt_tokenizer *tok = NULL;
    EXPECT_OK(
        gt_tokenizer_load(gt_test_path("tests/fuzz/corpus/tokenizer_json/tiny.json"), &tok, &err),
        &err);
    if (tok) {
        gt_token_ids ids = {0};
        EXPECT_OK(gt_tokenizer_encode(tok, "abc ab<s>c", 10, true, &ids, &err), &err);
        /* HF: ['<s>', 'abc', 'Ġ', 'ab', '<s>', 'c'] (the split regex isolates the space) */
        int32_t want[] = {7, 5, 3, 2, 7, 4};
        EXPECT(ids.n == 6 && memcmp(ids.ids, want, sizeof want) == 0, "tiny: %zu ids", ids.n);
        gt_token_ids_free(&ids);
        gt_tokenizer_free(tok);
    }
    EXPECT_OK(
        gt_tokenizer_load(gt_test_path("tests/fuzz/corpus/tokenizer_json/catastrophic_regex.json"),
                          &tok, &err),
        &err);
    if (tok) {
        char s[64];
        memset(s, 'a', 40);
        s[40] = 'b';
        gt_token_ids ids = {0};
        gt_error_clear(&err);
        gt_status st = gt_tokenizer_encode(tok, s, 41, false, &ids, &err);
        EXPECT(st == GT_ERR_INVALID && strstr(err.msg, "regex"), "catastrophic: %s", err.msg);
        gt_token_ids_free(&ids);
        gt_tokenizer_free(tok);
    }
}

static void capture_log(gt_log_level level, const char *msg, void *user)
{
    if (level == GT_LOG_WARN) snprintf(user, 1024, "%s", msg);
}

/* Issue 41: `--tokenizer FOLDER/tokenizer.json` reads FOLDER/tokenizer_config.json too (BOS/EOS
 * as the folder form finds them), and a tokenizer with no known BOS/EOS warns. */
static void test_config_beside_file(void)
{
    char dir[] = "/tmp/gt_tok_beside_XXXXXX", path[600], warned[1024] = "";
    if (!mkdtemp(dir)) return;
    size_t len = 0;
    char *json = read_file(gt_test_path("tests/fixtures/tokenizer/tokenizer.json"), &len);
    if (!json) return;
    /* the special tokens the config names are not the ones a guess would pick */
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    FILE *f = fopen(path, "wb");
    fwrite(json, 1, len, f);
    fclose(f);
    char cfg_path[600];
    snprintf(cfg_path, sizeof cfg_path, "%s/tokenizer_config.json", dir);
    f = fopen(cfg_path, "w");
    fputs("{\"bos_token\": \"<|start_header_id|>\", \"eos_token\": \"<|eot_id|>\"}\n", f);
    fclose(f);
    gt_error err = {0};
    gt_tokenizer *file_form = NULL, *dir_form = NULL;
    EXPECT_OK(gt_tokenizer_load(path, &file_form, &err), &err);
    EXPECT_OK(gt_tokenizer_load(dir, &dir_form, &err), &err);
    if (file_form && dir_form) {
        EXPECT(gt_tokenizer_bos_id(file_form) == 2045 && gt_tokenizer_eos_id(file_form) == 2047,
               "FOLDER/tokenizer.json: bos %d eos %d, want the config's 2045 and 2047",
               gt_tokenizer_bos_id(file_form), gt_tokenizer_eos_id(file_form));
        EXPECT(gt_tokenizer_bos_id(dir_form) == gt_tokenizer_bos_id(file_form) &&
                   gt_tokenizer_eos_id(dir_form) == gt_tokenizer_eos_id(file_form),
               "the file and folder forms differ");
    }
    gt_tokenizer_free(file_form);
    gt_tokenizer_free(dir_form);
    remove(cfg_path);
    /* no config and no special added token: a warning */
    json_t *root = json_loadb(json, len, JSON_ALLOW_NUL, NULL);
    json_object_set_new(root, "added_tokens", json_array());
    json_object_set_new(root, "post_processor", json_null());
    json_dump_file(root, path, JSON_COMPACT);
    json_decref(root);
    gt_log_set_sink(capture_log, warned);
    gt_tokenizer *bare = NULL;
    EXPECT_OK(gt_tokenizer_load(path, &bare, &err), &err);
    gt_log_set_sink(NULL, NULL);
    if (bare)
        EXPECT(gt_tokenizer_bos_id(bare) < 0 && gt_tokenizer_eos_id(bare) < 0 &&
                   strstr(warned, "no BOS or EOS token is known"),
               "no BOS/EOS: bos %d eos %d, warning '%s'", gt_tokenizer_bos_id(bare),
               gt_tokenizer_eos_id(bare), warned);
    gt_tokenizer_free(bare);
    remove(path);
    rmdir(dir);
    free(json);
}

int main(void)
{
    snprintf(shared_dir, sizeof shared_dir, "%s/../shared", GT_SOURCE_DIR);
    if (have_shared()) {
        test_tinyshakespeare();
        test_torchtitan_special_ids();
    } else {
        printf("skipping the tinyshakespeare and torchtitan tokenizer cases: %s is absent\n",
               shared_dir);
    }
    test_cases();
    test_round_trip_random();
    test_bad_input();
    test_errors();
    test_config_beside_file();
    return gt_test_finish();
}
