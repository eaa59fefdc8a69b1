/* trainer_data.c — the trainer's data feed: the dataset opened (synthetic, a token shard, or text
 * tokenized in memory) behind one loader, and each micro-batch's tokens and labels cut from the
 * global batch the loader reads (every rank reads the whole global batch and keeps its rows),
 * with the per-token document positions of those rows (block-causal attention). */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "graphtrain/gt_data.h"
#include "graphtrain/gt_train.h"
#include "train_internal.h"

/* ---------------------------------------------------------------- files */

char *gt_train_join_path(const char *dir, const char *name)
{
    return name[0] == '/' || !dir[0] ? gt_xstrdup(name) : gt_path_join(dir, name);
}

gt_status gt_train_read_file(const char *path, char **buf, size_t *len, gt_error *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) return gt_error_set(err, GT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    char *b = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n == cap) {
            cap = cap ? 2 * cap : 1 << 16;
            char *nb = realloc(b, cap);
            if (!nb) {
                free(b);
                fclose(f);
                return gt_error_set(err, GT_ERR_NOMEM, "%s: cannot hold %zu bytes", path, cap);
            }
            b = nb;
        }
        size_t got = fread(b + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
    }
    bool failed = ferror(f);
    fclose(f);
    if (failed) {
        free(b);
        return gt_error_set(err, GT_ERR_IO, "%s: read failed", path);
    }
    *buf = b;
    *len = n;
    return GT_OK;
}

/* ---------------------------------------------------------------- a folder of shards */

static int compare_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Every shard of folder dir (its regular files, hidden ones and the writer's temporary
 * NAME.tmp.XXXXXX left out), in name order, one after the other into ids; *vocab the largest
 * vocab_size among them. An empty folder is an error. */
static gt_status read_shard_folder(const char *dir, gt_token_ids *ids, uint32_t *vocab,
                                   gt_error *err)
{
    DIR *d = opendir(dir);
    if (!d)
        return gt_error_set(err, GT_ERR_IO, "%s: cannot open the folder: %s", dir, strerror(errno));
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.' || strstr(e->d_name, ".tmp.")) continue;
        char *path = gt_path_join(dir, e->d_name);
        struct stat sb;
        if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) {
            free(path);
            continue;
        }
        if (n == cap) names = gt_xrealloc(names, (cap = cap ? 2 * cap : 16) * sizeof *names);
        names[n++] = path;
    }
    closedir(d);
    qsort(names, n, sizeof *names, compare_names);
    gt_status st = n ? GT_OK
                     : gt_error_set(err, GT_ERR_INVALID,
                                    "%s: training.dataset = \"tokens\": the folder holds no "
                                    "shard (files written by graphtrain tokenize)",
                                    dir);
    *vocab = 0;
    int32_t chunk[4096];
    for (size_t k = 0; k < n && st == GT_OK; k++) {
        gt_token_shard shard;
        st = gt_token_shard_open(names[k], &shard, err);
        if (st != GT_OK) break;
        if (shard.vocab_size > *vocab) *vocab = shard.vocab_size;
        for (uint64_t i = 0; i < shard.count && st == GT_OK;) {
            size_t m = 0;
            while (m < sizeof chunk / sizeof chunk[0] && i < shard.count)
                chunk[m++] = (int32_t)gt_token_shard_get(&shard, i++);
            st = gt_token_ids_append(ids, chunk, m, err);
        }
        gt_token_shard_close(&shard);
    }
    if (st == GT_OK)
        gt_log(GT_LOG_INFO, "dataset %s: %zu shard(s) in name order, %zu tokens", dir, n, ids->n);
    for (size_t k = 0; k < n; k++)
        free(names[k]);
    free(names);
    return st;
}

/* A dataset of fewer samples than one batch trains on repeats of them: said once. */
static void warn_if_small(const gt_trainer *t)
{
    uint64_t w = gt_loader_samples_per_epoch(t->loader);
    if (t->dist.rank != 0 || w == 0 || w >= (uint64_t)t->global_batch) return;
    gt_log(GT_LOG_WARN,
           "dataset %s holds %llu sample(s) of seq_len + 1 = %lld tokens, fewer than one batch of "
           "%lld sequences: every batch repeats them",
           t->cfg->training.dataset_path, (unsigned long long)w,
           (long long)t->cfg->training.seq_len + 1, (long long)t->global_batch);
}

/* ---------------------------------------------------------------- the feed */

static gt_status open_source(gt_trainer *t, gt_error *err);

/* The document delimiters of token shards: a shard holds ids only, so the tokenizer named by
 * training.tokenizer_path (or model.hf_assets_path's tokenizer.json), when there is one, says
 * which ids are BOS and EOS; without one every sequence is one document, said once. */
static void shard_delimiters(gt_trainer *t)
{
    const gt_config *cfg = t->cfg;
    if (cfg->model.attn_mask_type != GT_CFG_ATTN_MASK_BLOCK_CAUSAL) return;
    const char *given = cfg->training.tokenizer_path;
    char *path = given[0] ? gt_xstrdup(given)
                 : cfg->model.hf_assets_path[0]
                     ? gt_train_join_path(cfg->model.hf_assets_path, "tokenizer.json")
                     : NULL;
    gt_tokenizer *tok = NULL;
    gt_error e = {0};
    if (path && gt_tokenizer_load(path, &tok, &e) == GT_OK) {
        t->doc_bos = gt_tokenizer_bos_id(tok);
        t->doc_eos = gt_tokenizer_eos_id(tok);
    }
    gt_tokenizer_free(tok);
    free(path);
    if (t->doc_bos < 0 && t->doc_eos < 0 && t->dist.rank == 0)
        gt_log(GT_LOG_WARN,
               "model.attn_mask_type = block_causal: no tokenizer tells the BOS / EOS ids of "
               "dataset %s (set training.tokenizer_path): every sequence is one document",
               cfg->training.dataset_path);
}

gt_status gt_trainer_open_data(gt_trainer *t, gt_error *err)
{
    t->doc_bos = t->doc_eos = -1; /* synthetic: one document per sequence */
    GT_TRY(open_source(t, err));
    if (t->tokenizer) {
        t->doc_bos = gt_tokenizer_bos_id(t->tokenizer);
        t->doc_eos = gt_tokenizer_eos_id(t->tokenizer);
    } else if (t->cfg->training.dataset == GT_CFG_DATASET_TOKENS) {
        shard_delimiters(t);
    }
    warn_if_small(t);
    return GT_OK;
}

static gt_status open_source(gt_trainer *t, gt_error *err)
{
    const gt_cfg_training *tr = &t->cfg->training;
    /* every rank reads the whole global batch (and keeps its rows): the loader sees one rank */
    gt_loader_config lc = {.seq_len = tr->seq_len,
                           .local_batch = t->global_batch,
                           .dp_rank = 0,
                           .dp_degree = 1,
                           .shuffle = false,
                           .seed = (uint64_t)t->cfg->debug.seed};
    if (tr->dataset == GT_CFG_DATASET_SYNTHETIC) {
        gt_synthetic_config sc;
        gt_synthetic_config_default(&sc);
        sc.vocab_size = (int32_t)t->model_info.vocab_size;
        GT_TRY(gt_synthetic_create(&sc, &t->synthetic, err));
        return gt_loader_create_synthetic(&lc, t->synthetic, &t->loader, err);
    }
    if (!tr->dataset_path[0])
        return gt_error_set(err, GT_ERR_INVALID, "training.dataset_path: dataset '%s' needs a path",
                            tr->dataset == GT_CFG_DATASET_TOKENS ? "tokens" : "text");
    struct stat sb;
    if (tr->dataset == GT_CFG_DATASET_TOKENS && stat(tr->dataset_path, &sb) == 0 &&
        S_ISDIR(sb.st_mode)) {
        uint32_t vocab = 0;
        GT_TRY(read_shard_folder(tr->dataset_path, &t->text_ids, &vocab, err));
        if (vocab > (uint32_t)t->model_info.vocab_size)
            return gt_error_set(
                err, GT_ERR_INVALID,
                "%s: token ids go up to vocab size %u, the model's vocabulary is %lld",
                tr->dataset_path, vocab, (long long)t->model_info.vocab_size);
        return gt_loader_create_tokens(&lc, t->text_ids.ids, t->text_ids.n, tr->dataset_path,
                                       &t->loader, err);
    }
    if (tr->dataset == GT_CFG_DATASET_TOKENS) {
        GT_TRY(gt_token_shard_open(tr->dataset_path, &t->shard, err));
        t->shard_open = true;
        if (t->shard.vocab_size > (uint32_t)t->model_info.vocab_size)
            return gt_error_set(
                err, GT_ERR_INVALID,
                "%s: token ids go up to vocab size %u, the model's vocabulary is %lld",
                tr->dataset_path, t->shard.vocab_size, (long long)t->model_info.vocab_size);
        return gt_loader_create_shard(&lc, &t->shard, &t->loader, err);
    }
    /* text / jsonl: tokenize in memory */
    char *tok_path = tr->tokenizer_path[0]
                         ? gt_xstrdup(tr->tokenizer_path)
                         : gt_train_join_path(t->cfg->model.hf_assets_path, "tokenizer.json");
    gt_status st = gt_tokenizer_load(tok_path, &t->tokenizer, err);
    free(tok_path);
    if (st != GT_OK) return st;
    if (gt_tokenizer_vocab_size(t->tokenizer) > t->model_info.vocab_size)
        return gt_error_set(
            err, GT_ERR_INVALID, "the tokenizer has %d tokens, the model's vocabulary is %lld",
            gt_tokenizer_vocab_size(t->tokenizer), (long long)t->model_info.vocab_size);
    gt_tokenize_options o;
    gt_tokenize_options_default(&o);
    o.format = tr->dataset == GT_CFG_DATASET_JSONL ? GT_TEXT_JSONL : GT_TEXT_PLAIN;
    GT_TRY(gt_data_tokenize_file(t->tokenizer, tr->dataset_path, &o, &t->text_ids, NULL, err));
    return gt_loader_create_tokens(&lc, t->text_ids.ids, t->text_ids.n, tr->dataset_path,
                                   &t->loader, err);
}

gt_status gt_trainer_next_batch(gt_trainer *t, gt_error *err)
{
    GT_TRY(gt_loader_next(t->loader, t->window, err));
    int64_t b = t->global_batch, s = t->cfg->training.seq_len;
    if (!t->batch_tokens) {
        gt_loader_split_batch(t->window, b, s, t->tokens.data, t->labels.data);
        gt_loader_positions(t->tokens.data, b, s, t->doc_bos, t->doc_eos, t->positions.data);
        return GT_OK;
    }
    /* this rank's rows of the global batch */
    gt_loader_split_batch(t->window, b, s, t->batch_tokens, t->batch_labels);
    int64_t shape[2] = {b, s};
    gt_tensor all_tokens, all_labels;
    gt_tensor_wrap(&all_tokens, GT_I64, 2, shape, t->batch_tokens);
    gt_tensor_wrap(&all_labels, GT_I64, 2, shape, t->batch_labels);
    gt_shard_slice(&t->batch_box, &all_tokens, &t->tokens);
    gt_shard_slice(&t->batch_box, &all_labels, &t->labels);
    /* a rank holds whole rows (the batch splits, never the sequence): its rows' positions */
    gt_loader_positions(t->tokens.data, t->tokens.shape[0], s, t->doc_bos, t->doc_eos,
                        t->positions.data);
    return GT_OK;
}

void gt_trainer_data_free(gt_trainer *t)
{
    free(t->batch_tokens);
    free(t->batch_labels);
    gt_tensor_free(&t->tokens);
    gt_tensor_free(&t->labels);
    gt_tensor_free(&t->positions);
    free(t->window);
    gt_loader_free(t->loader);
    gt_synthetic_free(t->synthetic);
    gt_tokenizer_free(t->tokenizer);
    gt_token_ids_free(&t->text_ids);
    if (t->shard_open) gt_token_shard_close(&t->shard);
}
