/* test_data.c — synthetic corpus, token shards, text/JSONL tokenization and the loader.
 *
 * Synthetic corpus: the entropy rate H it reports is checked against what its samples show —
 * the mean of -ln P(x_t | x_t-1) over 2M sampled transitions, and the plug-in conditional
 * entropy from transition counts (which uses no model probabilities at all) — and π against the
 * token frequencies; rows sum to 1 and π P = π. Token shards: the reader accepts shards written
 * by the independent Python writer (tools/gen_tokenizer.py), our writer's header is checked byte
 * by byte, and every malformed seed is refused with a message naming the file. Loader: packing
 * (exact windows, shifted labels), sharding (disjoint, covering, equal to the 1-rank batch),
 * shuffling (each epoch a permutation), save/restore (identical next batches, also through the
 * text form and on a different number of ranks); document positions (restart at BOS, after EOS,
 * at a window's start). */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "graphtrain/gt_data.h"
#include "gt_test.h"

static char tmpdir[256];

static const char *tmp_path(const char *name)
{
    static char buf[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", tmpdir, name);
    return buf[k];
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    fwrite(text, 1, strlen(text), f);
    fclose(f);
}

static int count_dir_entries(const char *dir)
{
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.') n++;
    closedir(d);
    return n;
}

/* ---------------------------------------------------------------- synthetic corpus */

static void test_synthetic_config_errors(void)
{
    gt_synthetic_config c;
    gt_synthetic *s = NULL;
    gt_error err = {0};
    gt_synthetic_config_default(&c);
    c.vocab_size = 1;
    EXPECT(gt_synthetic_create(&c, &s, &err) == GT_ERR_INVALID && strstr(err.msg, "vocab_size"),
           "%s", err.msg);
    gt_synthetic_config_default(&c);
    c.max_successors = 1, c.min_successors = 2;
    gt_error_clear(&err);
    EXPECT(gt_synthetic_create(&c, &s, &err) == GT_ERR_INVALID && strstr(err.msg, "successors"),
           "%s", err.msg);
    EXPECT(s == NULL, "no corpus on error");
}

static void test_synthetic_entropy(void)
{
    gt_synthetic_config c;
    gt_synthetic_config_default(&c);
    gt_synthetic *s = NULL;
    gt_error err = {0};
    EXPECT_OK(gt_synthetic_create(&c, &s, &err), &err);
    if (!s) return;
    int V = c.vocab_size;
    double H = gt_synthetic_entropy_rate(s);

    /* rows are distributions with 2..8 successors; π is a distribution with π P = π */
    double pi_sum = 0, worst_row = 0, worst_balance = 0;
    int min_k = V, max_k = 0;
    for (int a = 0; a < V; a++) {
        double row = 0;
        int k = 0;
        for (int b = 0; b < V; b++) {
            double p = gt_synthetic_transition_prob(s, a, b);
            row += p;
            k += p > 0;
        }
        if (k < min_k) min_k = k;
        if (k > max_k) max_k = k;
        worst_row = fmax(worst_row, fabs(row - 1));
        pi_sum += gt_synthetic_stationary_prob(s, a);
    }
    for (int b = 0; b < V; b++) {
        double in = 0;
        for (int a = 0; a < V; a++)
            in += gt_synthetic_stationary_prob(s, a) * gt_synthetic_transition_prob(s, a, b);
        worst_balance = fmax(worst_balance, fabs(in - gt_synthetic_stationary_prob(s, b)));
    }
    EXPECT(worst_row < 1e-12 && fabs(pi_sum - 1) < 1e-12, "row error %g, sum(pi) - 1 = %g",
           worst_row, pi_sum - 1);
    EXPECT(worst_balance < 1e-12, "pi P - pi: %g", worst_balance);
    EXPECT(min_k >= c.min_successors && max_k <= c.max_successors, "successors %d..%d", min_k,
           max_k);
    EXPECT(H > 0.3 && H < log((double)c.max_successors), "H = %g", H);

    /* 2048 samples of 1025 tokens: 2.1M transitions */
    enum { N_SAMPLES = 2048, LEN = 1025 };
    int64_t *row = malloc(LEN * sizeof *row);
    int64_t *counts = calloc((size_t)V * V, sizeof *counts);
    int64_t *freq = calloc((size_t)V, sizeof *freq);
    double nll = 0;
    int64_t n_trans = 0, impossible = 0;
    for (uint64_t g = 0; g < N_SAMPLES; g++) {
        gt_synthetic_sample(s, g, LEN, row);
        for (int t = 0; t < LEN; t++) {
            freq[row[t]]++;
            if (t == 0) continue;
            double p = gt_synthetic_transition_prob(s, (int32_t)row[t - 1], (int32_t)row[t]);
            if (p <= 0) {
                impossible++;
                continue;
            }
            nll -= log(p);
            counts[row[t - 1] * V + row[t]]++;
            n_trans++;
        }
    }
    nll /= (double)n_trans;
    /* plug-in conditional entropy: -Σ N(a,b)/N ln(N(a,b)/N(a)) */
    double plug = 0;
    for (int a = 0; a < V; a++) {
        int64_t na = 0;
        for (int b = 0; b < V; b++)
            na += counts[a * V + b];
        for (int b = 0; b < V; b++) {
            int64_t nab = counts[a * V + b];
            if (nab) plug -= (double)nab / (double)n_trans * log((double)nab / (double)na);
        }
    }
    double tv = 0;
    for (int a = 0; a < V; a++)
        tv +=
            fabs((double)freq[a] / (N_SAMPLES * (double)LEN) - gt_synthetic_stationary_prob(s, a));
    tv /= 2;
    EXPECT(impossible == 0, "%lld transitions outside the chain", (long long)impossible);
    /* standard error of the mean NLL ~ 1/sqrt(2.1M) ≈ 7e-4 */
    EXPECT(fabs(nll - H) < 0.005, "sampled mean -ln p %.5f vs H %.5f", nll, H);
    EXPECT(fabs(plug - H) < 0.01, "plug-in conditional entropy %.5f vs H %.5f", plug, H);
    EXPECT(tv < 0.02, "token frequencies vs pi: total variation %.4f", tv);
    printf("synthetic corpus V=%d: H = %.6f nats/token, sampled %.6f, plug-in %.6f\n", V, H, nll,
           plug);

    /* determinism: same seed → same samples, in any order; another seed → other samples */
    int64_t a[64], b[64];
    gt_synthetic_sample(s, 12345, 64, a);
    gt_synthetic_sample(s, 7, 64, b);
    gt_synthetic_sample(s, 12345, 64, b);
    EXPECT(memcmp(a, b, sizeof a) == 0, "sample 12345 depends on what was drawn before");
    gt_synthetic *s2 = NULL, *s3 = NULL;
    EXPECT_OK(gt_synthetic_create(&c, &s2, &err), &err);
    c.seed++;
    EXPECT_OK(gt_synthetic_create(&c, &s3, &err), &err);
    if (s2 && s3) {
        gt_synthetic_sample(s2, 12345, 64, b);
        EXPECT(memcmp(a, b, sizeof a) == 0 && gt_synthetic_entropy_rate(s2) == H,
               "a second corpus with the same seed differs");
        gt_synthetic_sample(s3, 12345, 64, b);
        EXPECT(memcmp(a, b, sizeof a) != 0 && gt_synthetic_entropy_rate(s3) != H,
               "another seed gives the same corpus");
    }
    gt_synthetic_free(s2);
    gt_synthetic_free(s3);
    free(row);
    free(counts);
    free(freq);
    gt_synthetic_free(s);
}

/* ---------------------------------------------------------------- token shards */

static uint32_t rd32(const unsigned char *p)
{
    return p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t rd64(const unsigned char *p)
{
    return rd32(p) | (uint64_t)rd32(p + 4) << 32;
}

static void test_shard_round_trip(void)
{
    gt_error err = {0};
    for (int wide = 0; wide < 2; wide++) {
        uint32_t vocab = wide ? 200000 : 50000;
        enum { N = 100003 };
        int32_t *ids = malloc(N * sizeof *ids);
        for (int i = 0; i < N; i++)
            ids[i] = (int32_t)(((uint64_t)i * 2654435761u) % vocab);
        const char *path = tmp_path(wide ? "wide.gttokens" : "narrow.gttokens");
        EXPECT_OK(gt_token_shard_write(path, ids, N, vocab, &err), &err);

        /* the header, byte by byte, and the payload checksum with libxxhash directly */
        FILE *f = fopen(path, "rb");
        unsigned char *raw = malloc(64 + 4 * (size_t)N);
        size_t got = f ? fread(raw, 1, 64 + 4 * (size_t)N, f) : 0;
        if (f) fclose(f);
        uint32_t width = wide ? 4 : 2;
        EXPECT(got == 64 + (size_t)width * N, "file size %zu", got);
        EXPECT(memcmp(raw, "GTTOKENS", 8) == 0 && rd32(raw + 8) == 1 && rd32(raw + 12) == width &&
                   rd64(raw + 16) == N && rd32(raw + 24) == vocab && rd32(raw + 28) == 0,
               "header fields");
        EXPECT(rd64(raw + 32) == XXH64(raw + 64, (size_t)width * N, 0), "payload checksum");
        EXPECT(rd64(raw + 56) == XXH64(raw, 56, 0), "header checksum");
        bool payload_ok = true;
        for (int i = 0; i < N; i++) {
            uint32_t v = width == 2 ? (uint32_t)(raw[64 + 2 * i] | raw[64 + 2 * i + 1] << 8)
                                    : rd32(raw + 64 + 4 * i);
            payload_ok &= v == (uint32_t)ids[i];
        }
        EXPECT(payload_ok, "payload is not the ids, little-endian");
        free(raw);

        gt_token_shard sh;
        EXPECT_OK(gt_token_shard_open(path, &sh, &err), &err);
        bool same = sh.count == N && sh.vocab_size == vocab && sh.dtype == width;
        for (int i = 0; same && i < N; i++)
            same = gt_token_shard_get(&sh, (uint64_t)i) == (uint32_t)ids[i];
        EXPECT(same, "shard read back differs");
        gt_token_shard_close(&sh);
        free(ids);
    }

    /* an id out of range is refused and leaves nothing behind */
    int before = count_dir_entries(tmpdir);
    int32_t bad[] = {1, 2, 70000};
    gt_error_clear(&err);
    gt_status st = gt_token_shard_write(tmp_path("bad.gttokens"), bad, 3, 65536, &err);
    EXPECT(st == GT_ERR_INVALID && strstr(err.msg, "token 2") && strstr(err.msg, "70000"), "%s",
           err.msg);
    EXPECT(count_dir_entries(tmpdir) == before, "a failed write left files behind");

    /* atomic replacement: an aborted writer keeps the old file, a committed one replaces it */
    int32_t one[] = {1, 2, 3}, two[] = {4, 5};
    const char *path = tmp_path("atomic.gttokens");
    EXPECT_OK(gt_token_shard_write(path, one, 3, 10, &err), &err);
    gt_token_shard_writer *w;
    EXPECT_OK(gt_token_shard_writer_open(path, 10, &w, &err), &err);
    EXPECT_OK(gt_token_shard_writer_append(w, two, 2, &err), &err);
    gt_token_shard_writer_abort(w);
    gt_token_shard sh;
    EXPECT_OK(gt_token_shard_open(path, &sh, &err), &err);
    EXPECT(sh.count == 3 && gt_token_shard_get(&sh, 2) == 3, "abort changed the file");
    gt_token_shard_close(&sh);
    EXPECT_OK(gt_token_shard_writer_open(path, 10, &w, &err), &err);
    EXPECT_OK(gt_token_shard_writer_append(w, two, 2, &err), &err);
    EXPECT_OK(gt_token_shard_writer_commit(w, &err), &err);
    EXPECT_OK(gt_token_shard_open(path, &sh, &err), &err);
    EXPECT(sh.count == 2 && gt_token_shard_get(&sh, 1) == 5, "commit did not replace the file");
    gt_token_shard_close(&sh);
}

/* Shards written by tools/gen_tokenizer.py's own writer (pure Python xxh64). */
static void test_shard_corpus(void)
{
    static const struct {
        const char *file;
        const char *what; /* NULL: must load */
    } cases[] = {
        {"good_u16.bin", NULL},
        {"good_u32.bin", NULL},
        {"empty_payload.bin", NULL},
        {"truncated_header.bin", "truncated"},
        {"truncated_payload.bin", "count mismatch"},
        {"bad_magic.bin", "bad magic"},
        {"bad_version.bin", "version 9"},
        {"bad_dtype.bin", "dtype 3"},
        {"count_mismatch.bin", "count mismatch"},
        {"checksum_mismatch.bin", "payload checksum mismatch"},
        {"id_out_of_vocab.bin", "not below vocab_size 500"},
        {"trailing_bytes.bin", "trailing bytes"},
        {"empty.bin", "truncated"},
        {"payload_bitflip.bin", "payload checksum mismatch"},
        {"header_bitflip.bin", "header checksum mismatch"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char rel[256];
        snprintf(rel, sizeof rel, "tests/fuzz/corpus/token_shard/%s", cases[i].file);
        gt_token_shard sh;
        gt_error err = {0};
        gt_status st = gt_token_shard_open(gt_test_path(rel), &sh, &err);
        if (!cases[i].what) {
            EXPECT(st == GT_OK, "%s: %s", cases[i].file, err.msg);
            if (st == GT_OK && strcmp(cases[i].file, "good_u16.bin") == 0) {
                bool same = sh.count == 300 && sh.vocab_size == 1000 && sh.dtype == 2;
                for (uint64_t k = 0; same && k < 300; k++)
                    same = gt_token_shard_get(&sh, k) == (uint32_t)((k * 7919) % 1000);
                EXPECT(same, "good_u16.bin: tokens differ from the Python writer's");
            }
            if (st == GT_OK && strcmp(cases[i].file, "good_u32.bin") == 0)
                EXPECT(sh.count == 50 && sh.dtype == 4 &&
                           gt_token_shard_get(&sh, 49) == 49u * 70001,
                       "good_u32.bin");
            if (st == GT_OK) gt_token_shard_close(&sh);
        } else {
            EXPECT(st == GT_ERR_FORMAT && strstr(err.msg, cases[i].file) &&
                       strstr(err.msg, cases[i].what),
                   "%s: got %s \"%s\", want \"%s\"", cases[i].file, gt_status_name(st), err.msg,
                   cases[i].what);
        }
    }
    gt_token_shard sh;
    gt_error err = {0};
    EXPECT(gt_token_shard_open(tmp_path("missing.gttokens"), &sh, &err) == GT_ERR_IO &&
               strstr(err.msg, "missing.gttokens"),
           "%s", err.msg);
}

/* ---------------------------------------------------------------- text → tokens */

static void test_tokenize_text(void)
{
    gt_error err = {0};
    gt_tokenizer *tok = NULL;
    EXPECT_OK(gt_tokenizer_load(gt_test_path("tests/fixtures/tokenizer"), &tok, &err), &err);
    if (!tok) return;
    int32_t bos = gt_tokenizer_token_to_id(tok, "<|begin_of_text|>", 17);
    int32_t eos = gt_tokenizer_token_to_id(tok, "<|end_of_text|>", 15);
    EXPECT(bos >= 0 && eos >= 0 && bos == gt_tokenizer_bos_id(tok) &&
               eos == gt_tokenizer_eos_id(tok),
           "bos %d eos %d", bos, eos);

    const char *docs[] = {"First Citizen:\nBefore we proceed any further, hear me speak.",
                          "Café — 日本語 😀 \"quoted\"\ttab", "", "All:\nSpeak, speak."};
    const char *jsonl = "{\"text\": \"First Citizen:\\nBefore we proceed any further, hear me "
                        "speak.\", \"id\": 1}\n"
                        "{\"text\": \"Caf\\u00e9 \\u2014 \\u65e5\\u672c\\u8a9e \\ud83d\\ude00 "
                        "\\\"quoted\\\"\\ttab\"}\r\n"
                        "   \n"
                        "{\"text\": \"\"}\n"
                        "{\"meta\": 3, \"text\": \"All:\\nSpeak, speak.\"}";
    write_text(tmp_path("docs.jsonl"), jsonl);

    /* expected: [BOS] encode(doc) [EOS] per document, back to back */
    gt_token_ids want = {0};
    for (int i = 0; i < 4; i++) {
        gt_token_ids_append(&want, &bos, 1, &err);
        EXPECT_OK(gt_tokenizer_encode(tok, docs[i], strlen(docs[i]), false, &want, &err), &err);
        gt_token_ids_append(&want, &eos, 1, &err);
    }
    gt_token_ids got = {0};
    gt_tokenize_stats stats = {0};
    EXPECT_OK(gt_data_tokenize_file(tok, tmp_path("docs.jsonl"), NULL, &got, &stats, &err), &err);
    EXPECT(got.n == want.n && memcmp(got.ids, want.ids, want.n * sizeof(int32_t)) == 0,
           "JSONL stream: %zu ids, want %zu", got.n, want.n);
    EXPECT(stats.documents == 4 && stats.files == 1 && stats.tokens == (int64_t)want.n,
           "stats: %lld docs", (long long)stats.documents);

    /* plain text: the whole file is one document */
    write_text(tmp_path("doc.txt"), docs[1]);
    gt_token_ids plain = {0};
    EXPECT_OK(gt_data_tokenize_file(tok, tmp_path("doc.txt"), NULL, &plain, NULL, &err), &err);
    size_t n1 = 0;
    for (size_t i = 0, seen = 0; i < want.n; i++) /* document 1 sits between the 2nd and 3rd BOS */
        if (want.ids[i] == bos && ++seen == 2) n1 = i;
    bool plain_ok = plain.n > 2 && plain.ids[0] == bos && plain.ids[plain.n - 1] == eos &&
                    memcmp(plain.ids, want.ids + n1, plain.n * sizeof(int32_t)) == 0;
    EXPECT(plain_ok, "plain text document");

    /* another field name; no BOS/EOS */
    write_text(tmp_path("body.jsonl"), "{\"body\": \"All:\\nSpeak, speak.\"}\n");
    gt_tokenize_options o;
    gt_tokenize_options_default(&o);
    o.json_field = "body";
    o.add_bos = o.add_eos = false;
    gt_token_ids body = {0}, body_want = {0};
    EXPECT_OK(gt_data_tokenize_file(tok, tmp_path("body.jsonl"), &o, &body, NULL, &err), &err);
    /* the template still adds BOS (the tokenizer's own post-processor, as torchtitan) */
    EXPECT_OK(gt_tokenizer_encode(tok, docs[3], strlen(docs[3]), true, &body_want, &err), &err);
    EXPECT(body.n == body_want.n && memcmp(body.ids, body_want.ids, body.n * 4) == 0,
           "field \"body\": %zu ids", body.n);

    /* errors name the file and line */
    write_text(tmp_path("bad1.jsonl"), "{\"text\": \"ok\"}\n{\"text\": \"unterminated}\n");
    write_text(tmp_path("bad2.jsonl"), "{\"text\": \"ok\"}\n\n{\"txt\": \"x\"}\n");
    gt_token_ids junk = {0};
    gt_error_clear(&err);
    gt_status st = gt_data_tokenize_file(tok, tmp_path("bad1.jsonl"), NULL, &junk, NULL, &err);
    EXPECT(st == GT_ERR_FORMAT && strstr(err.msg, "bad1.jsonl:2:"), "%s", err.msg);
    EXPECT(junk.n == 0, "a failed file leaves no ids");
    gt_error_clear(&err);
    st = gt_data_tokenize_file(tok, tmp_path("bad2.jsonl"), NULL, &junk, NULL, &err);
    EXPECT(st == GT_ERR_FORMAT && strstr(err.msg, "bad2.jsonl:3:") && strstr(err.msg, "\"text\""),
           "%s", err.msg);
    write_text(tmp_path("bad.txt"), "ok \xff not utf-8");
    gt_error_clear(&err);
    st = gt_data_tokenize_file(tok, tmp_path("bad.txt"), NULL, &junk, NULL, &err);
    EXPECT(st == GT_ERR_FORMAT && strstr(err.msg, "bad.txt") && strstr(err.msg, "offset 3"), "%s",
           err.msg);

    /* several files into one shard: the concatenation of the streams */
    const char *inputs[] = {tmp_path("docs.jsonl"), tmp_path("doc.txt")};
    gt_tokenize_stats sst = {0};
    EXPECT_OK(gt_data_tokenize_to_shard(tok, inputs, 2, NULL, tmp_path("out.gttokens"), &sst, &err),
              &err);
    gt_token_shard sh;
    EXPECT_OK(gt_token_shard_open(tmp_path("out.gttokens"), &sh, &err), &err);
    bool same = sh.count == got.n + plain.n && sh.vocab_size == 2048 && sh.dtype == 2;
    for (size_t i = 0; same && i < got.n; i++)
        same = gt_token_shard_get(&sh, i) == (uint32_t)got.ids[i];
    for (size_t i = 0; same && i < plain.n; i++)
        same = gt_token_shard_get(&sh, got.n + i) == (uint32_t)plain.ids[i];
    EXPECT(same && sst.files == 2 && sst.documents == 5, "shard of two files");
    gt_token_shard_close(&sh);
    const char *bad_inputs[] = {tmp_path("docs.jsonl"), tmp_path("bad2.jsonl")};
    gt_error_clear(&err);
    st =
        gt_data_tokenize_to_shard(tok, bad_inputs, 2, NULL, tmp_path("never.gttokens"), NULL, &err);
    EXPECT(st == GT_ERR_FORMAT && access(tmp_path("never.gttokens"), F_OK) != 0,
           "a failed tokenize must not leave a shard: %s", err.msg);

    gt_token_ids_free(&want);
    gt_token_ids_free(&got);
    gt_token_ids_free(&plain);
    gt_token_ids_free(&body);
    gt_token_ids_free(&body_want);
    gt_token_ids_free(&junk);
    gt_tokenizer_free(tok);
}

/* ---------------------------------------------------------------- loader */

static gt_loader_config loader_config(int64_t L, int64_t B, int rank, int ranks)
{
    gt_loader_config c = {.seq_len = L, .local_batch = B, .dp_rank = rank, .dp_degree = ranks};
    return c;
}

static void test_loader_packing_and_sharding(void)
{
    enum { N = 1000, L = 9 }; /* 100 windows of 10 tokens */
    int32_t *stream = malloc(N * sizeof *stream);
    for (int i = 0; i < N; i++)
        stream[i] = i;
    gt_error err = {0};

    /* packing: sample g is tokens [10g, 10g + 10); labels are inputs shifted by one */
    gt_loader_config c1 = loader_config(L, 4, 0, 1);
    gt_loader *one = NULL;
    EXPECT_OK(gt_loader_create_tokens(&c1, stream, N, "ints", &one, &err), &err);
    EXPECT(gt_loader_samples_per_epoch(one) == 100, "windows");
    int64_t batch[4 * (L + 1)], inputs[4 * L], labels[4 * L];
    EXPECT_OK(gt_loader_next(one, batch, &err), &err);
    EXPECT_OK(gt_loader_next(one, batch, &err), &err);
    bool ok = true;
    for (int b = 0; b < 4; b++)
        for (int t = 0; t <= L; t++)
            ok &= batch[b * (L + 1) + t] == (4 + b) * (L + 1) + t;
    EXPECT(ok, "second batch is not windows 4..7");
    gt_loader_split_batch(batch, 4, L, inputs, labels);
    ok = true;
    for (int b = 0; b < 4; b++)
        for (int t = 0; t < L; t++)
            ok &= inputs[b * L + t] == batch[b * (L + 1) + t] &&
                  labels[b * L + t] == batch[b * (L + 1) + t + 1];
    EXPECT(ok, "inputs/labels split");
    gt_loader_free(one);

    /* sharding: 3 ranks × B=2 over 40 steps (crossing epochs) vs 1 rank × B=6 */
    enum { R = 3, B = 2, STEPS = 40 };
    gt_loader *ranks[R], *single = NULL;
    for (int r = 0; r < R; r++) {
        gt_loader_config c = loader_config(L, B, r, R);
        EXPECT_OK(gt_loader_create_tokens(&c, stream, N, "ints", &ranks[r], &err), &err);
    }
    gt_loader_config cs = loader_config(L, R * B, 0, 1);
    EXPECT_OK(gt_loader_create_tokens(&cs, stream, N, "ints", &single, &err), &err);
    int seen[100] = {0};
    bool union_ok = true, disjoint_ok = true;
    for (int step = 0; step < STEPS; step++) {
        int64_t rb[B * (L + 1)], sb[R * B * (L + 1)];
        EXPECT_OK(gt_loader_next(single, sb, &err), &err);
        int step_windows[R * B];
        for (int r = 0; r < R; r++) {
            EXPECT_OK(gt_loader_next(ranks[r], rb, &err), &err);
            union_ok &= memcmp(rb, sb + r * B * (L + 1), sizeof rb) == 0;
            for (int b = 0; b < B; b++)
                step_windows[r * B + b] = (int)(rb[b * (L + 1)] / (L + 1));
        }
        for (int i = 0; i < R * B; i++)
            for (int j = 0; j < i; j++)
                disjoint_ok &= step_windows[i] != step_windows[j];
        if (step < 16) /* the first 96 samples: epoch 0 */
            for (int i = 0; i < R * B; i++)
                seen[step_windows[i]]++;
    }
    int covered = 0, twice = 0;
    for (int w = 0; w < 100; w++)
        covered += seen[w] > 0, twice += seen[w] > 1;
    EXPECT(union_ok, "the ranks' batches, in rank order, are not the 1-rank batch");
    EXPECT(disjoint_ok, "two ranks got the same window in one step");
    EXPECT(covered == 96 && twice == 0, "epoch 0: %d windows covered, %d twice", covered, twice);
    for (int r = 0; r < R; r++)
        gt_loader_free(ranks[r]);
    gt_loader_free(single);

    /* errors */
    gt_loader *l = NULL;
    gt_loader_config bad = loader_config(L, 2, 3, 3);
    gt_error_clear(&err);
    EXPECT(gt_loader_create_tokens(&bad, stream, N, "ints", &l, &err) == GT_ERR_INVALID &&
               strstr(err.msg, "dp_rank"),
           "%s", err.msg);
    gt_loader_config big = loader_config(N, 1, 0, 1);
    gt_error_clear(&err);
    EXPECT(gt_loader_create_tokens(&big, stream, N, "ints", &l, &err) == GT_ERR_INVALID &&
               strstr(err.msg, "ints") && strstr(err.msg, "1001"),
           "%s", err.msg);
    EXPECT(l == NULL, "no loader on error");
    free(stream);
}

static void test_loader_shuffle(void)
{
    enum { N = 640, L = 15, W = 40 };
    int32_t stream[N];
    for (int i = 0; i < N; i++)
        stream[i] = i;
    gt_error err = {0};
    gt_loader_config c = loader_config(L, 5, 0, 1);
    c.shuffle = true;
    c.seed = 99;
    gt_loader *l = NULL, *l2 = NULL;
    EXPECT_OK(gt_loader_create_tokens(&c, stream, N, "ints", &l, &err), &err);
    EXPECT_OK(gt_loader_create_tokens(&c, stream, N, "ints", &l2, &err), &err);
    int order[3][W];
    bool same_again = true;
    for (int e = 0; e < 3; e++) {
        int seen[W] = {0};
        for (int s = 0; s < W / 5; s++) {
            int64_t b[5 * (L + 1)], b2[5 * (L + 1)];
            EXPECT_OK(gt_loader_next(l, b, &err), &err);
            EXPECT_OK(gt_loader_next(l2, b2, &err), &err);
            same_again &= memcmp(b, b2, sizeof b) == 0;
            for (int i = 0; i < 5; i++) {
                int w = (int)(b[i * (L + 1)] / (L + 1));
                order[e][s * 5 + i] = w;
                seen[w]++;
            }
        }
        int perm_ok = 1;
        for (int w = 0; w < W; w++)
            perm_ok &= seen[w] == 1;
        EXPECT(perm_ok, "epoch %d is not a permutation of the windows", e);
    }
    int identity = 1;
    for (int w = 0; w < W; w++)
        identity &= order[0][w] == w;
    EXPECT(!identity && memcmp(order[0], order[1], sizeof order[0]) != 0,
           "shuffled epochs are not shuffled or repeat");
    EXPECT(same_again, "shuffle is not deterministic");
    gt_loader_free(l);
    gt_loader_free(l2);
}

static void test_loader_resume(void)
{
    gt_error err = {0};
    gt_synthetic_config sc;
    gt_synthetic_config_default(&sc);
    gt_synthetic *syn = NULL;
    EXPECT_OK(gt_synthetic_create(&sc, &syn, &err), &err);
    enum { L = 32, B = 4 };
    int32_t stream[5000];
    for (int i = 0; i < 5000; i++)
        stream[i] = (i * 37) % 1000;

    for (int src = 0; src < 2; src++) {
        gt_loader_config c = loader_config(L, B, 0, 1);
        c.shuffle = src == 1;
        c.seed = 5;
        gt_loader *a = NULL, *b = NULL;
        if (src == 0) {
            EXPECT_OK(gt_loader_create_synthetic(&c, syn, &a, &err), &err);
            EXPECT_OK(gt_loader_create_synthetic(&c, syn, &b, &err), &err);
        } else {
            EXPECT_OK(gt_loader_create_tokens(&c, stream, 5000, "s", &a, &err), &err);
            EXPECT_OK(gt_loader_create_tokens(&c, stream, 5000, "s", &b, &err), &err);
        }
        if (!a || !b) continue;
        int64_t batch[B * (L + 1)], want[50][B * (L + 1)];
        for (int i = 0; i < 7; i++)
            EXPECT_OK(gt_loader_next(a, batch, &err), &err);
        gt_loader_state st;
        gt_loader_get_state(a, &st);
        char text[64];
        gt_loader_state_format(&st, text, sizeof text);
        for (int i = 0; i < 50; i++)
            EXPECT_OK(gt_loader_next(a, want[i], &err), &err);

        gt_loader_state back;
        EXPECT_OK(gt_loader_state_parse(text, &back, &err), &err);
        EXPECT_OK(gt_loader_set_state(b, &back, &err), &err);
        bool same = true;
        for (int i = 0; i < 50; i++) {
            EXPECT_OK(gt_loader_next(b, batch, &err), &err);
            same &= memcmp(batch, want[i], sizeof batch) == 0;
        }
        EXPECT(same, "source %d: batches after restore differ (%s)", src, text);

        /* restored on 2 ranks with half the batch: the same global batches, split */
        gt_loader *r0 = NULL, *r1 = NULL;
        gt_loader_config c0 = loader_config(L, B / 2, 0, 2), c1 = loader_config(L, B / 2, 1, 2);
        c0.shuffle = c1.shuffle = c.shuffle;
        c0.seed = c1.seed = c.seed;
        if (src == 0) {
            EXPECT_OK(gt_loader_create_synthetic(&c0, syn, &r0, &err), &err);
            EXPECT_OK(gt_loader_create_synthetic(&c1, syn, &r1, &err), &err);
        } else {
            EXPECT_OK(gt_loader_create_tokens(&c0, stream, 5000, "s", &r0, &err), &err);
            EXPECT_OK(gt_loader_create_tokens(&c1, stream, 5000, "s", &r1, &err), &err);
        }
        EXPECT_OK(gt_loader_set_state(r0, &back, &err), &err);
        EXPECT_OK(gt_loader_set_state(r1, &back, &err), &err);
        same = true;
        for (int i = 0; i < 50; i++) {
            int64_t h0[B / 2 * (L + 1)], h1[B / 2 * (L + 1)];
            EXPECT_OK(gt_loader_next(r0, h0, &err), &err);
            EXPECT_OK(gt_loader_next(r1, h1, &err), &err);
            same &= memcmp(h0, want[i], sizeof h0) == 0 &&
                    memcmp(h1, want[i] + B / 2 * (L + 1), sizeof h1) == 0;
        }
        EXPECT(same, "source %d: 2-rank restore differs from the 1-rank batches", src);
        gt_loader_free(r0);
        gt_loader_free(r1);

        /* a position saved for other data or another seq_len is refused */
        gt_loader *other = NULL;
        gt_loader_config co = loader_config(L + 1, B, 0, 1);
        co.shuffle = c.shuffle;
        co.seed = c.seed;
        if (src == 0)
            EXPECT_OK(gt_loader_create_synthetic(&co, syn, &other, &err), &err);
        else
            EXPECT_OK(gt_loader_create_tokens(&co, stream, 5000, "s", &other, &err), &err);
        gt_error_clear(&err);
        EXPECT(gt_loader_set_state(other, &back, &err) == GT_ERR_INVALID &&
                   strstr(err.msg, "other data"),
               "%s", err.msg);
        gt_loader_free(other);
        gt_loader_free(a);
        gt_loader_free(b);
    }

    /* a shard source reads the same as the same tokens in memory */
    const char *path = tmp_path("loader.gttokens");
    EXPECT_OK(gt_token_shard_write(path, stream, 5000, 1000, &err), &err);
    gt_token_shard sh;
    EXPECT_OK(gt_token_shard_open(path, &sh, &err), &err);
    gt_loader_config c = loader_config(L, B, 0, 1);
    gt_loader *from_shard = NULL, *from_mem = NULL;
    EXPECT_OK(gt_loader_create_shard(&c, &sh, &from_shard, &err), &err);
    EXPECT_OK(gt_loader_create_tokens(&c, stream, 5000, "s", &from_mem, &err), &err);
    bool same = from_shard && from_mem;
    for (int i = 0; same && i < 60; i++) {
        int64_t x[B * (L + 1)], y[B * (L + 1)];
        EXPECT_OK(gt_loader_next(from_shard, x, &err), &err);
        EXPECT_OK(gt_loader_next(from_mem, y, &err), &err);
        same = memcmp(x, y, sizeof x) == 0;
    }
    EXPECT(same, "shard source differs from the in-memory stream");
    gt_loader_free(from_shard);
    gt_loader_free(from_mem);
    gt_token_shard_close(&sh);

    static const char *bad[] = {"gtloader1:12",
                                "gtloader2:1:0000000000000000",
                                "gtloader1:-1:0000000000000000",
                                "gtloader1:1:00000000000000000",
                                "gtloader1:1:000000000000000g",
                                "gtloader1::0000000000000000"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        gt_loader_state st;
        gt_error_clear(&err);
        EXPECT(gt_loader_state_parse(bad[i], &st, &err) == GT_ERR_FORMAT, "accepted \"%s\"",
               bad[i]);
    }
    gt_synthetic_free(syn);
}

/* Document positions (block-causal attention): restart at a window's first token and at every
 * BOS; with no BOS known, after every EOS; with neither, one document per row. */
static void test_loader_positions(void)
{
    enum { BOS = 1, EOS = 2, L = 9 };
    const int64_t in[2 * L] = {
        7,   8,   EOS, BOS, 5,   6,   EOS, BOS, 4, /* row 0: starts mid-document */
        BOS, EOS, BOS, 3,   BOS, BOS, 9,   9,   9};
    const int64_t want_bos[2 * L] = {0, 1, 2, 0, 1, 2, 3, 0, 1, 0, 1, 0, 1, 0, 0, 1, 2, 3};
    const int64_t want_eos[2 * L] = {0, 1, 2, 0, 1, 2, 3, 0, 1, 0, 1, 0, 1, 2, 3, 4, 5, 6};
    int64_t pos[2 * L];
    gt_loader_positions(in, 2, L, BOS, EOS, pos);
    EXPECT(memcmp(pos, want_bos, sizeof pos) == 0, "positions restart at BOS and at t = 0");
    gt_loader_positions(in, 2, L, -1, EOS, pos);
    EXPECT(memcmp(pos, want_eos, sizeof pos) == 0, "positions restart after EOS when no BOS");
    gt_loader_positions(in, 2, L, -1, -1, pos);
    bool ok = true;
    for (int i = 0; i < 2 * L; i++)
        ok &= pos[i] == i % L;
    EXPECT(ok, "no delimiter: one document per row, positions 0..L-1");
}

int main(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/gt_test_data_XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    test_synthetic_config_errors();
    test_synthetic_entropy();
    test_shard_round_trip();
    test_shard_corpus();
    test_tokenize_text();
    test_loader_packing_and_sharding();
    test_loader_shuffle();
    test_loader_resume();
    test_loader_positions();
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return gt_test_finish();
}
