/* export_hf.c — write a llama3 as a Hugging Face transformers directory (gt_export.h).
 *
 *   DIR/config.json                      LlamaForCausalLM config (model_type "llama")
 *   DIR/model.safetensors                every weight, when they fit in one shard, or
 *   DIR/model-0000k-of-0000n.safetensors + DIR/model.safetensors.index.json
 *                                        {"metadata": {"total_size": bytes},
 *                                         "weight_map": {hf name: shard file}}
 *
 * Names. torchtitan's fqns map one to one onto LlamaForCausalLM's state dict (table below); shapes
 * are the same ([out, in] linears), so the export is a rename plus an optional dtype cast.
 *
 * RoPE. graphtrain rotates with Hugging Face's half-rotation layout (dimension j pairs with
 * j + hd/2, src/models/llama3.c), which is what LlamaForCausalLM computes, so wq and wk are written
 * as they are. Meta's original checkpoints pair adjacent dimensions (2j, 2j + 1) instead and need
 * transformers' convert script to permute the rows of wq and wk; ours must NOT be permuted.
 *
 * Shards follow transformers' rule: tensors go in parameter order into the current shard until the
 * next would take it past the limit (5·10⁹ bytes by default); a tensor larger than the limit gets
 * a shard of its own. One shard is written as model.safetensors with no index, as transformers
 * does.
 *
 * Files. Every file is written atomically (temporary name, fsync, rename; safetensors through
 * gt_safetensors_write). The directory must be new or empty, so an export never mixes with other
 * weights; on failure the files written so far are removed, which leaves DIR empty and a retry
 * possible. config.json is written last: a directory without it is visibly incomplete. */
#include "graphtrain/gt_llama3.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "export_hf_internal.h"
#include "graphtrain/gt_safetensors.h"

#define HF_NAME_MAX GT_HF_NAME_MAX
#define HF_MAX_SHARDS 99999 /* the 5-digit file numbering */

/* ---------------------------------------------------------------- names and shapes */

/* Expected shape of a parameter: dim0 × dim1 (dim1 0 for vectors), in units of the config. */
typedef enum { SZ_D, SZ_V, SZ_F, SZ_Q, SZ_KV, SZ_NONE } hf_size;

typedef struct {
    const char *ours, *theirs;
    hf_size rows, cols;
} hf_name_row;

/* Per layer: suffix after "layers.N." → suffix after "model.layers.N.". Q = heads·hd (= D for
 * llama3), KV = kv_heads·hd, F = ffn hidden. */
static const hf_name_row hf_layer_names[] = {
    {"attention.wq.weight", "self_attn.q_proj.weight", SZ_Q, SZ_D},
    {"attention.wk.weight", "self_attn.k_proj.weight", SZ_KV, SZ_D},
    {"attention.wv.weight", "self_attn.v_proj.weight", SZ_KV, SZ_D},
    {"attention.wo.weight", "self_attn.o_proj.weight", SZ_D, SZ_Q},
    {"attention_norm.weight", "input_layernorm.weight", SZ_D, SZ_NONE},
    {"ffn_norm.weight", "post_attention_layernorm.weight", SZ_D, SZ_NONE},
    {"feed_forward.w1.weight", "mlp.gate_proj.weight", SZ_F, SZ_D},
    {"feed_forward.w2.weight", "mlp.down_proj.weight", SZ_D, SZ_F},
    {"feed_forward.w3.weight", "mlp.up_proj.weight", SZ_F, SZ_D},
};
static const hf_name_row hf_global_names[] = {
    {"tok_embeddings.weight", "model.embed_tokens.weight", SZ_V, SZ_D},
    {"norm.weight", "model.norm.weight", SZ_D, SZ_NONE},
    {"output.weight", "lm_head.weight", SZ_V, SZ_D},
};
#define N_LAYER_NAMES ((int)(sizeof hf_layer_names / sizeof hf_layer_names[0]))
#define N_GLOBAL_NAMES ((int)(sizeof hf_global_names / sizeof hf_global_names[0]))

/* Finds the row of fqn and, for a layer parameter, its layer index (-1 for a global one). */
static const hf_name_row *hf_lookup(const char *fqn, long long *layer)
{
    *layer = -1;
    for (int k = 0; k < N_GLOBAL_NAMES; k++)
        if (strcmp(fqn, hf_global_names[k].ours) == 0) return &hf_global_names[k];
    if (strncmp(fqn, "layers.", 7) != 0) return NULL;
    const char *p = fqn + 7;
    if (*p < '0' || *p > '9' || (p[0] == '0' && p[1] != '.')) return NULL; /* no "01" */
    long long n = 0;
    for (; *p >= '0' && *p <= '9'; p++) {
        if (n > 1000000000LL) return NULL;
        n = n * 10 + (*p - '0');
    }
    if (*p != '.') return NULL;
    for (int k = 0; k < N_LAYER_NAMES; k++) {
        if (strcmp(p + 1, hf_layer_names[k].ours) == 0) {
            *layer = n;
            return &hf_layer_names[k];
        }
    }
    return NULL;
}

gt_status gt_export_hf_llama3_name(const char *fqn, char *out, size_t n, gt_error *err)
{
    long long layer;
    const hf_name_row *row = fqn ? hf_lookup(fqn, &layer) : NULL;
    if (!row)
        return gt_error_set(err, GT_ERR_INVALID,
                            "parameter '%.200s' has no Hugging Face llama name (expected "
                            "tok_embeddings.weight, norm.weight, output.weight or "
                            "layers.N.<attention.wq|wk|wv|wo, attention_norm, ffn_norm, "
                            "feed_forward.w1|w2|w3>.weight)",
                            fqn ? fqn : "(null)");
    int w = layer < 0 ? snprintf(out, n, "%s", row->theirs)
                      : snprintf(out, n, "model.layers.%lld.%s", layer, row->theirs);
    if (w < 0 || (size_t)w >= n)
        return gt_error_set(err, GT_ERR_INVALID,
                            "parameter '%.200s': its Hugging Face name needs %d bytes, %zu given",
                            fqn, w + 1, n);
    return GT_OK;
}

static int64_t hf_size_of(const gt_llama3_config *cfg, hf_size s)
{
    int64_t hd = cfg->dim / cfg->n_heads;
    switch (s) {
    case SZ_D:
        return cfg->dim;
    case SZ_V:
        return cfg->vocab_size;
    case SZ_F:
        return cfg->ffn_hidden;
    case SZ_Q:
        return cfg->n_heads * hd;
    case SZ_KV:
        return cfg->n_kv_heads * hd;
    case SZ_NONE:
        return 0;
    }
    return -1;
}

/* The config must be one gt_llama3_build accepts, and every parameter an f32 tensor of the shape
 * that config implies (so config.json describes the tensors), each fqn exactly once. */
static gt_status hf_check_inputs(const gt_llama3_config *cfg, const gt_model *m,
                                 const gt_tensor *params, char (*names)[HF_NAME_MAX], gt_error *err)
{
    if (cfg->dim <= 0 || cfg->n_layers <= 0 || cfg->n_heads <= 0 || cfg->n_kv_heads <= 0 ||
        cfg->vocab_size <= 0 || cfg->ffn_hidden <= 0 || cfg->max_seq_len <= 0 ||
        cfg->dim % cfg->n_heads != 0 || cfg->n_heads % cfg->n_kv_heads != 0 ||
        !(cfg->norm_eps > 0.0) || !(cfg->rope_theta > 0.0))
        return gt_error_set(err, GT_ERR_INVALID,
                            "llama3 config '%s' is not exportable: dim %lld, n_layers %lld, "
                            "n_heads %lld, n_kv_heads %lld, vocab_size %lld, ffn_hidden %lld, "
                            "max_seq_len %lld must be > 0 with heads dividing dim and kv heads "
                            "dividing heads; norm_eps and rope_theta > 0",
                            cfg->flavor, (long long)cfg->dim, (long long)cfg->n_layers,
                            (long long)cfg->n_heads, (long long)cfg->n_kv_heads,
                            (long long)cfg->vocab_size, (long long)cfg->ffn_hidden,
                            (long long)cfg->max_seq_len);
    int64_t want = 3 + 9 * cfg->n_layers;
    if (m->n_params != want)
        return gt_error_set(err, GT_ERR_INVALID,
                            "llama3 '%s': the model has %d parameters, the config's %lld layers "
                            "need %lld",
                            cfg->flavor, m->n_params, (long long)cfg->n_layers, (long long)want);
    /* Each (row, layer) pair once: with the count above, no fqn is missing either. */
    uint8_t *seen = gt_xcalloc((size_t)want, 1);
    gt_status st = GT_OK;
    for (int k = 0; k < m->n_params && st == GT_OK; k++) {
        const gt_param_spec *p = &m->params[k];
        const gt_tensor *t = &params[k];
        long long layer;
        const hf_name_row *row = hf_lookup(p->fqn, &layer);
        st = gt_export_hf_llama3_name(p->fqn, names[k], HF_NAME_MAX, err);
        if (st != GT_OK) break;
        if (layer >= cfg->n_layers) {
            st =
                gt_error_set(err, GT_ERR_INVALID, "parameter '%s': layer %lld, the config has %lld",
                             p->fqn, layer, (long long)cfg->n_layers);
            break;
        }
        int64_t slot =
            layer < 0 ? (int64_t)(row - hf_global_names)
                      : N_GLOBAL_NAMES + layer * N_LAYER_NAMES + (int64_t)(row - hf_layer_names);
        if (seen[slot]++) {
            st = gt_error_set(err, GT_ERR_INVALID, "parameter '%s' appears twice", p->fqn);
            break;
        }
        int64_t rows = hf_size_of(cfg, row->rows), cols = hf_size_of(cfg, row->cols);
        int ndim = cols > 0 ? 2 : 1;
        bool ok = t->dtype == GT_F32 && t->ndim == ndim && t->shape[0] == rows &&
                  (ndim == 1 || t->shape[1] == cols) && t->data != NULL;
        if (!ok) {
            char got[64], need[64];
            gt_tensor_format_type(t, got, sizeof got);
            if (ndim == 2)
                snprintf(need, sizeof need, "f32[%lld, %lld]", (long long)rows, (long long)cols);
            else
                snprintf(need, sizeof need, "f32[%lld]", (long long)rows);
            st = gt_error_set(err, GT_ERR_SHAPE, "parameter '%s' is %s%s, the config '%s' needs %s",
                              p->fqn, got, t->data ? "" : " without data", cfg->flavor, need);
        }
    }
    free(seen);
    return st;
}

/* ---------------------------------------------------------------- files */

/* mkdir -p, then require DIR to be an empty directory. */
gt_status gt_hf_prepare_dir(const char *dir, gt_error *err)
{
    GT_TRY(gt_make_dirs(dir, err));
    DIR *d = opendir(dir);
    if (!d) return gt_error_set(err, GT_ERR_IO, "cannot open the directory: %s", strerror(errno));
    gt_status st = GT_OK;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        st = gt_error_set(err, GT_ERR_INVALID,
                          "the directory is not empty (it holds '%.200s'); export into a new "
                          "or empty directory",
                          e->d_name);
        break;
    }
    closedir(d);
    return st;
}

/* Writes text to path atomically: "<path>.tmp.<pid>", fsync, rename, fsync of the directory. */
static gt_status hf_write_text(const char *dir, const char *path, const char *text, gt_error *err)
{
    size_t cap = strlen(path) + 32;
    char *tmp = gt_xmalloc(cap);
    snprintf(tmp, cap, "%s.tmp.%ld", path, (long)getpid());
    size_t n = strlen(text);
    const char *what = "create";
    FILE *f = fopen(tmp, "wb");
    if (!f) goto fail;
    what = "write";
    if (fwrite(text, 1, n, f) != n || fflush(f) != 0) goto fail;
    what = "fsync";
    if (fsync(fileno(f)) != 0) goto fail;
    what = "close";
    FILE *closing = f;
    f = NULL;
    if (fclose(closing) != 0) goto fail;
    what = "rename";
    if (rename(tmp, path) != 0) goto fail;
    free(tmp);
    what = "fsync the directory";
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0 || (fsync(fd) != 0 && errno != EINVAL)) {
        int e = errno;
        if (fd >= 0) close(fd);
        return gt_error_set(err, GT_ERR_IO, "%s: cannot %s: %s", path, what, strerror(e));
    }
    close(fd);
    return GT_OK;
fail:;
    int e = errno;
    if (f) fclose(f);
    remove(tmp);
    gt_status st = gt_error_set(err, GT_ERR_IO, "%s: cannot %s temporary file %s: %s", path, what,
                                tmp, strerror(e));
    free(tmp);
    return st;
}

gt_status gt_hf_write_json(const char *dir, const char *path, json_t *root, gt_error *err)
{
    /* Sorted keys and 2-space indent, as transformers writes them; doubles with 17 significant
     * digits, so every value reads back exactly. */
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_SORT_KEYS);
    if (!text) return gt_error_set(err, GT_ERR_NOMEM, "%s: cannot serialize JSON", path);
    size_t n = strlen(text);
    char *with_newline = gt_xmalloc(n + 2);
    memcpy(with_newline, text, n);
    memcpy(with_newline + n, "\n", 2);
    free(text);
    gt_status st = hf_write_text(dir, path, with_newline, err);
    free(with_newline);
    return st;
}

/* ---------------------------------------------------------------- config.json */

static json_t *hf_token_id(int64_t id)
{
    return id < 0 ? json_null() : json_integer((json_int_t)id);
}

static json_t *hf_config_json(const gt_llama3_config *cfg, const gt_export_hf_options *o)
{
    json_t *c = json_object();
    json_object_set_new(c, "architectures", json_pack("[s]", "LlamaForCausalLM"));
    json_object_set_new(c, "model_type", json_string("llama"));
    json_object_set_new(c, "hidden_size", json_integer(cfg->dim));
    json_object_set_new(c, "intermediate_size", json_integer(cfg->ffn_hidden));
    json_object_set_new(c, "num_hidden_layers", json_integer(cfg->n_layers));
    json_object_set_new(c, "num_attention_heads", json_integer(cfg->n_heads));
    json_object_set_new(c, "num_key_value_heads", json_integer(cfg->n_kv_heads));
    json_object_set_new(c, "head_dim", json_integer(cfg->dim / cfg->n_heads));
    json_object_set_new(c, "vocab_size", json_integer(cfg->vocab_size));
    json_object_set_new(c, "rms_norm_eps", json_real(cfg->norm_eps));
    /* rope_theta + rope_scaling: the spelling of Meta's Llama 3.1 configs on the Hub; transformers
     * 4.x reads it as is and 5.x folds it into rope_parameters. Without scaling
     * (original_max_position 0) rope_scaling is null: plain RoPE. */
    json_object_set_new(c, "rope_theta", json_real(cfg->rope_theta));
    if (cfg->rope_original_max_position > 0) {
        json_t *s = json_object();
        json_object_set_new(s, "rope_type", json_string("llama3"));
        json_object_set_new(s, "factor", json_real(cfg->rope_factor));
        json_object_set_new(s, "low_freq_factor", json_real(cfg->rope_low_freq_factor));
        json_object_set_new(s, "high_freq_factor", json_real(cfg->rope_high_freq_factor));
        json_object_set_new(s, "original_max_position_embeddings",
                            json_integer(cfg->rope_original_max_position));
        json_object_set_new(c, "rope_scaling", s);
    } else {
        json_object_set_new(c, "rope_scaling", json_null());
    }
    json_object_set_new(c, "max_position_embeddings", json_integer(cfg->max_seq_len));
    json_object_set_new(c, "tie_word_embeddings", json_false());
    json_object_set_new(c, "attention_bias", json_false());
    json_object_set_new(c, "attention_dropout", json_real(0.0));
    json_object_set_new(c, "mlp_bias", json_false());
    json_object_set_new(c, "hidden_act", json_string("silu"));
    json_object_set_new(c, "torch_dtype",
                        json_string(o->dtype == GT_BF16 ? "bfloat16" : "float32"));
    json_object_set_new(c, "use_cache", json_true());
    json_object_set_new(c, "bos_token_id", hf_token_id(o->bos_token_id));
    json_object_set_new(c, "eos_token_id", hf_token_id(o->eos_token_id));
    return c;
}

/* ---------------------------------------------------------------- shards */

/* shard_of[k] for each tensor of bytes[k] (see the header comment); returns the shard count. */
static int hf_plan_shards(const uint64_t *bytes, int n, uint64_t limit, int *shard_of)
{
    int shard = 0;
    uint64_t used = 0;
    bool empty = true;
    for (int k = 0; k < n; k++) {
        if (!empty && bytes[k] > limit - used) { /* used <= limit unless the shard is one tensor */
            shard++;
            used = 0;
            empty = true;
        }
        shard_of[k] = shard;
        used = bytes[k] > limit - used ? limit : used + bytes[k]; /* saturate: closes the shard */
        empty = false;
    }
    return n > 0 ? shard + 1 : 0;
}

static void hf_shard_name(int shard, int n_shards, char *buf, size_t n)
{
    if (n_shards == 1)
        snprintf(buf, n, "model.safetensors");
    else
        snprintf(buf, n, "model-%05d-of-%05d.safetensors", shard + 1, n_shards);
}

/* Writes the tensors of one shard, cast to dtype. */
static gt_status hf_write_shard(const char *path, const gt_tensor *params, const char *const *names,
                                const int *shard_of, int n, int shard, gt_dtype dtype,
                                gt_error *err)
{
    int count = 0;
    for (int k = 0; k < n; k++)
        count += shard_of[k] == shard;
    const char **st_names = gt_xcalloc((size_t)count, sizeof *st_names);
    const gt_tensor **ptrs = gt_xcalloc((size_t)count, sizeof *ptrs);
    gt_tensor *cast = gt_xcalloc((size_t)count, sizeof *cast);
    gt_status st = GT_OK;
    int j = 0;
    for (int k = 0; k < n && st == GT_OK; k++) {
        if (shard_of[k] != shard) continue;
        st_names[j] = names[k];
        if (dtype == GT_F32) {
            ptrs[j] = &params[k];
        } else {
            /* bf16: round to nearest even, one shard at a time so the copy stays ≤ one shard. */
            st = gt_tensor_alloc(&cast[j], GT_BF16, params[k].ndim, params[k].shape, err);
            if (st != GT_OK) break;
            const float *src = params[k].data;
            uint16_t *dst = cast[j].data;
            int64_t numel = gt_tensor_numel(&params[k]);
            for (int64_t i = 0; i < numel; i++)
                dst[i] = gt_f32_to_bf16(src[i]);
            ptrs[j] = &cast[j];
        }
        j++;
    }
    if (st == GT_OK) {
        static const char *const keys[1] = {"format"}, *const values[1] = {"pt"};
        st = gt_safetensors_write(path, count, st_names, ptrs, 1, keys, values, err);
    }
    for (int i = 0; i < count; i++)
        gt_tensor_free(&cast[i]);
    free(cast);
    free(ptrs);
    free(st_names);
    return st;
}

static gt_status hf_write_index(const char *dir, const char *path, const char *const *names,
                                const int *shard_of, const uint64_t *bytes, int n, int n_shards,
                                gt_error *err)
{
    json_t *map = json_object();
    uint64_t total = 0;
    for (int k = 0; k < n; k++) {
        char file[64];
        hf_shard_name(shard_of[k], n_shards, file, sizeof file);
        json_object_set_new(map, names[k], json_string(file));
        total += bytes[k];
    }
    json_t *root = json_object();
    json_object_set_new(root, "metadata", json_pack("{s:I}", "total_size", (json_int_t)total));
    json_object_set_new(root, "weight_map", map);
    gt_status st = gt_hf_write_json(dir, path, root, err);
    json_decref(root);
    return st;
}

/* ---------------------------------------------------------------- export */

gt_status gt_export_hf_llama3_opts(const gt_llama3_config *cfg, const gt_model *m,
                                   const gt_tensor *params, const char *dir,
                                   const gt_export_hf_options *opts, gt_error *err)
{
    gt_export_hf_options o = {GT_F32, 0, -1, -1, NULL, NULL, 0};
    if (opts) o = *opts;
    if (!cfg || !m || !params || !dir || !dir[0])
        return gt_error_set(err, GT_ERR_INVALID, "Hugging Face export: missing %s",
                            !cfg      ? "config"
                            : !m      ? "model"
                            : !params ? "parameters"
                                      : "directory");
    if (o.dtype != GT_F32 && o.dtype != GT_BF16)
        return gt_error_set(err, GT_ERR_INVALID,
                            "Hugging Face export to %s: dtype %s, expected f32 or bf16", dir,
                            gt_dtype_name(o.dtype));
    if (o.max_shard_bytes == 0) o.max_shard_bytes = GT_EXPORT_HF_SHARD_BYTES;

    int n = m->n_params;
    char(*names)[HF_NAME_MAX] = gt_xcalloc((size_t)(n > 0 ? n : 1), sizeof *names);
    const char **name_ptrs = gt_xcalloc((size_t)(n > 0 ? n : 1), sizeof *name_ptrs);
    for (int k = 0; k < n; k++)
        name_ptrs[k] = names[k];
    gt_status st = hf_check_inputs(cfg, m, params, names, err);
    if (st == GT_OK) {
        json_t *config = hf_config_json(cfg, &o);
        st = gt_hf_write_dir(dir, n, name_ptrs, params, &o, config, err);
        json_decref(config);
    }
    if (st != GT_OK)
        gt_error_wrap(err, "exporting llama3 '%s' to Hugging Face directory %s", cfg->flavor, dir);
    free(name_ptrs);
    free(names);
    return st;
}

gt_status gt_hf_write_dir(const char *dir, int n, const char *const *names,
                          const gt_tensor *tensors, const gt_export_hf_options *opts,
                          json_t *config, gt_error *err)
{
    gt_export_hf_options o = *opts;
    if (o.max_shard_bytes == 0) o.max_shard_bytes = GT_EXPORT_HF_SHARD_BYTES;
    const gt_tensor *params = tensors;
    uint64_t *bytes = gt_xcalloc((size_t)(n > 0 ? n : 1), sizeof *bytes);
    int *shard_of = gt_xcalloc((size_t)(n > 0 ? n : 1), sizeof *shard_of);
    char **written = NULL; /* files to remove if a later step fails */
    int n_written = 0, n_shards = 0;

    gt_status st = gt_hf_prepare_dir(dir, err);
    if (st == GT_OK) {
        for (int k = 0; k < n; k++)
            bytes[k] = (uint64_t)gt_tensor_numel(&params[k]) * gt_dtype_size(o.dtype);
        n_shards = hf_plan_shards(bytes, n, o.max_shard_bytes, shard_of);
        if (n_shards > HF_MAX_SHARDS)
            st = gt_error_set(err, GT_ERR_INVALID,
                              "Hugging Face export to %s: %d shards of at most %llu bytes; the "
                              "file names allow %d",
                              dir, n_shards, (unsigned long long)o.max_shard_bytes, HF_MAX_SHARDS);
    }
    if (st == GT_OK) written = gt_xcalloc((size_t)n_shards + 2, sizeof *written);
    for (int s = 0; st == GT_OK && s < n_shards; s++) {
        char file[64];
        hf_shard_name(s, n_shards, file, sizeof file);
        char *path = gt_path_join(dir, file);
        st = hf_write_shard(path, params, names, shard_of, n, s, o.dtype, err);
        written[n_written++] = path;
    }
    if (st == GT_OK && n_shards > 1) {
        char *path = gt_path_join(dir, "model.safetensors.index.json");
        st = hf_write_index(dir, path, names, shard_of, bytes, n, n_shards, err);
        written[n_written++] = path;
    }
    if (st == GT_OK) {
        char *path = gt_path_join(dir, "config.json");
        st = gt_hf_write_json(dir, path, config, err);
        written[n_written++] = path;
    }
    if (st != GT_OK)
        for (int i = 0; i < n_written; i++)
            remove(written[i]); /* a file that failed before its rename is simply absent */
    for (int i = 0; i < n_written; i++)
        free(written[i]);
    free(written);
    free(shard_of);
    free(bytes);
    return st;
}

gt_status gt_export_hf_llama3(const gt_llama3_config *cfg, const gt_model *m,
                              const gt_tensor *params, const char *dir, gt_dtype dtype,
                              gt_error *err)
{
    gt_export_hf_options o = {dtype, 0, -1, -1, NULL, NULL, 0};
    return gt_export_hf_llama3_opts(cfg, m, params, dir, &o, err);
}
