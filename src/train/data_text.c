/* data_text.c — text and JSON-lines files → token stream or token shard.
 *
 * Each document becomes gt_tokenizer_encode_document(text, add_bos, add_eos), exactly as
 * torchtitan's text datasets tokenize a sample, and documents follow each other with nothing in
 * between: [BOS] doc [EOS] [BOS] doc [EOS] … The loader then cuts this stream into windows. */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "graphtrain/gt_data.h"

void gt_tokenize_options_default(gt_tokenize_options *o)
{
    o->format = GT_TEXT_AUTO;
    o->json_field = NULL;
    o->add_bos = true;
    o->add_eos = true;
}

typedef gt_status (*gt_doc_sink)(void *user, const int32_t *ids, size_t n, gt_error *err);

static bool gt_ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

static gt_status gt_text_map(const char *path, const char **data, size_t *size, gt_error *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return gt_error_set(err, GT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return gt_error_set(err, GT_ERR_IO, "%s: not a regular file", path);
    }
    *size = (size_t)sb.st_size;
    *data = "";
    if (*size > 0) {
        void *m = mmap(NULL, *size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            int e = errno;
            close(fd);
            return gt_error_set(err, GT_ERR_IO, "%s: cannot map %zu bytes: %s", path, *size,
                                strerror(e));
        }
        *data = m;
    }
    close(fd);
    return GT_OK;
}

static gt_status gt_text_document(gt_tokenizer *tok, const char *text, size_t len,
                                  const gt_tokenize_options *o, gt_token_ids *doc, gt_doc_sink sink,
                                  void *user, gt_tokenize_stats *stats, gt_error *err)
{
    doc->n = 0;
    GT_TRY(gt_tokenizer_encode_document(tok, text, len, o->add_bos, o->add_eos, doc, err));
    GT_TRY(sink(user, doc->ids, doc->n, err));
    stats->documents++;
    stats->bytes += (int64_t)len;
    stats->tokens += (int64_t)doc->n;
    return GT_OK;
}

/* Runs every document of one file through the tokenizer into sink. */
static gt_status gt_text_for_each(gt_tokenizer *tok, const char *path, const gt_tokenize_options *o,
                                  gt_doc_sink sink, void *user, gt_tokenize_stats *stats,
                                  gt_error *err)
{
    const char *data = "";
    size_t size = 0;
    GT_TRY(gt_text_map(path, &data, &size, err));
    gt_text_format fmt = o->format;
    if (fmt == GT_TEXT_AUTO)
        fmt = gt_ends_with(path, ".jsonl") || gt_ends_with(path, ".json") ||
                      gt_ends_with(path, ".ndjson")
                  ? GT_TEXT_JSONL
                  : GT_TEXT_PLAIN;
    const char *field = o->json_field ? o->json_field : "text";
    gt_token_ids doc = {0};
    gt_status st = GT_OK;
    if (fmt == GT_TEXT_PLAIN) {
        st = gt_text_document(tok, data, size, o, &doc, sink, user, stats, err);
        if (st != GT_OK) gt_error_wrap(err, "%s", path);
    } else {
        size_t pos = 0;
        for (int64_t line = 1; pos < size && st == GT_OK; line++) {
            const char *nl = memchr(data + pos, '\n', size - pos);
            size_t end = nl ? (size_t)(nl - data) : size, len = end - pos;
            const char *s = data + pos;
            pos = end + 1;
            size_t k = 0;
            while (k < len && (s[k] == ' ' || s[k] == '\t' || s[k] == '\r'))
                k++;
            if (k == len) continue; /* blank line */
            json_error_t jerr;
            json_t *obj = json_loadb(s, len, JSON_ALLOW_NUL, &jerr);
            json_t *text = json_object_get(obj, field);
            if (!obj) {
                st = gt_error_set(err, GT_ERR_FORMAT, "%s:%lld: not valid JSON (column %d): %s",
                                  path, (long long)line, jerr.column, jerr.text);
            } else if (!json_is_string(text)) {
                st = gt_error_set(err, GT_ERR_FORMAT,
                                  "%s:%lld: expected an object with a string field \"%s\"", path,
                                  (long long)line, field);
            } else {
                st = gt_text_document(tok, json_string_value(text), json_string_length(text), o,
                                      &doc, sink, user, stats, err);
                if (st != GT_OK) gt_error_wrap(err, "%s:%lld", path, (long long)line);
            }
            json_decref(obj);
        }
    }
    gt_token_ids_free(&doc);
    if (size > 0) munmap((void *)data, size);
    if (st == GT_OK) stats->files++;
    return st;
}

static gt_status gt_sink_ids(void *user, const int32_t *ids, size_t n, gt_error *err)
{
    return gt_token_ids_append(user, ids, n, err);
}

static gt_status gt_sink_shard(void *user, const int32_t *ids, size_t n, gt_error *err)
{
    return gt_token_shard_writer_append(user, ids, n, err);
}

gt_status gt_data_tokenize_file(gt_tokenizer *tok, const char *path, const gt_tokenize_options *o,
                                gt_token_ids *out, gt_tokenize_stats *stats, gt_error *err)
{
    gt_tokenize_options def;
    if (!o) gt_tokenize_options_default(&def), o = &def;
    gt_tokenize_stats local = {0};
    size_t base = out->n;
    gt_status st = gt_text_for_each(tok, path, o, gt_sink_ids, out, stats ? stats : &local, err);
    if (st != GT_OK) out->n = base;
    return st;
}

gt_status gt_data_tokenize_to_shard(gt_tokenizer *tok, const char *const *paths, int n_paths,
                                    const gt_tokenize_options *o, const char *out_path,
                                    gt_tokenize_stats *stats, gt_error *err)
{
    gt_tokenize_options def;
    if (!o) gt_tokenize_options_default(&def), o = &def;
    gt_tokenize_stats local = {0};
    if (!stats) stats = &local;
    if (n_paths < 1)
        return gt_error_set(err, GT_ERR_INVALID, "%s: no input files to tokenize", out_path);
    /* the shard replaces out_path when it is complete: an input there would be lost */
    struct stat out_sb;
    bool out_exists = stat(out_path, &out_sb) == 0;
    for (int i = 0; i < n_paths; i++) {
        struct stat in_sb;
        bool same = !strcmp(paths[i], out_path) ||
                    (out_exists && stat(paths[i], &in_sb) == 0 && in_sb.st_dev == out_sb.st_dev &&
                     in_sb.st_ino == out_sb.st_ino);
        if (same)
            return gt_error_set(err, GT_ERR_INVALID,
                                "%s: the output is also input file %d (%s); the shard would "
                                "overwrite it: choose another --out",
                                out_path, i + 1, paths[i]);
    }
    gt_token_shard_writer *w;
    GT_TRY(gt_token_shard_writer_open(out_path, (uint32_t)gt_tokenizer_vocab_size(tok), &w, err));
    for (int i = 0; i < n_paths; i++) {
        gt_status st = gt_text_for_each(tok, paths[i], o, gt_sink_shard, w, stats, err);
        if (st != GT_OK) {
            gt_token_shard_writer_abort(w);
            return st;
        }
    }
    return gt_token_shard_writer_commit(w, err);
}
