/* test_export_hf.c — the Hugging Face llama export (gt_export.h).
 *
 * Against references written here, independently of the exporter:
 *   - config.json, read back with jansson, holds every field transformers' LlamaConfig needs with
 *     the values of the graphtrain config;
 *   - model.safetensors holds every parameter under transformers' name (the table below, from
 *     LlamaForCausalLM's state dict), bitwise equal to the source in f32, and equal to a
 *     round-to-nearest-even written here in bf16; metadata {"format": "pt"};
 *   - a non-empty directory, a file in the way, a config that does not fit the tensors and an
 *     unsupported dtype are refused, and a refused export leaves the disk as it was;
 *   - sharding with small limits: the index's weight_map names every tensor once, total_size is
 *     the byte sum, each shard holds exactly the tensors mapped to it, in parameter order, and the
 *     cut is transformers' greedy rule (a shard ends only when the next tensor would pass the
 *     limit; a tensor above the limit stands alone);
 *   - transformers itself: tests/fixtures/hf_export/ holds the logits transformers computed after
 *     loading the exported f32 and bf16 directories with AutoModelForCausalLM.from_pretrained
 *     (tools/check_hf_export.py); graphtrain's eager executor on the same weights and tokens must
 *     agree within 1e-5. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* nftw */
#endif
#include <dirent.h>
#include <ftw.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "graphtrain/gt_exec.h"
#include "graphtrain/gt_graph.h"
#include "graphtrain/gt_llama3.h"
#include "graphtrain/gt_safetensors.h"
#include "gt_test.h"

#define TOLERANCE 1e-5
#define RELATIVE 1e-4

/* ---------------------------------------------------------------- helpers */

typedef struct {
    gt_llama3_config cfg;
    gt_model m;
    gt_graph *g;
    gt_tensor *params;
} model_fixture;

static bool model_open(const char *flavor, uint64_t seed, model_fixture *f)
{
    gt_error err = {0};
    memset(f, 0, sizeof *f);
    f->g = gt_graph_new();
    EXPECT_OK(gt_llama3_flavor(flavor, &f->cfg, &err), &err);
    if (err.code == GT_OK) EXPECT_OK(gt_llama3_build(f->g, &f->cfg, &f->m, &err), &err);
    if (err.code != GT_OK) return false;
    f->params = calloc((size_t)f->m.n_params, sizeof *f->params);
    EXPECT_OK(gt_model_init_params(&f->m, seed, f->params, &err), &err);
    return err.code == GT_OK;
}

static void model_close(model_fixture *f)
{
    for (int k = 0; f->params && k < f->m.n_params; k++)
        gt_tensor_free(&f->params[k]);
    free(f->params);
    gt_model_free(&f->m);
    gt_graph_free(f->g);
}

/* transformers' name for a torchtitan fqn, from LlamaForCausalLM's state dict. */
static void expected_hf_name(const char *fqn, char *out, size_t n)
{
    static const char *const table[][2] = {
        {"attention.wq.weight", "self_attn.q_proj.weight"},
        {"attention.wk.weight", "self_attn.k_proj.weight"},
        {"attention.wv.weight", "self_attn.v_proj.weight"},
        {"attention.wo.weight", "self_attn.o_proj.weight"},
        {"attention_norm.weight", "input_layernorm.weight"},
        {"ffn_norm.weight", "post_attention_layernorm.weight"},
        {"feed_forward.w1.weight", "mlp.gate_proj.weight"},
        {"feed_forward.w2.weight", "mlp.down_proj.weight"},
        {"feed_forward.w3.weight", "mlp.up_proj.weight"},
    };
    snprintf(out, n, "?");
    if (strcmp(fqn, "tok_embeddings.weight") == 0) snprintf(out, n, "model.embed_tokens.weight");
    if (strcmp(fqn, "norm.weight") == 0) snprintf(out, n, "model.norm.weight");
    if (strcmp(fqn, "output.weight") == 0) snprintf(out, n, "lm_head.weight");
    int layer, used = 0;
    if (sscanf(fqn, "layers.%d.%n", &layer, &used) == 1 && used > 0) {
        for (size_t k = 0; k < sizeof table / sizeof table[0]; k++)
            if (strcmp(fqn + used, table[k][0]) == 0)
                snprintf(out, n, "model.layers.%d.%s", layer, table[k][1]);
    }
}

/* f32 → bf16, round to nearest even (finite inputs: the weights are finite). */
static uint16_t reference_bf16(float x)
{
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    uint32_t lsb = (bits >> 16) & 1u;
    return (uint16_t)((bits + 0x7fffu + lsb) >> 16);
}

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

static void remove_tree(const char *path)
{
    nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* Sorted names of a directory's entries, joined by ','. */
static void list_dir(const char *dir, char *out, size_t n)
{
    char *names[64];
    int count = 0;
    out[0] = '\0';
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL && count < 64) {
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
            names[count++] = strdup(e->d_name);
    }
    closedir(d);
    for (int i = 1; i < count; i++) /* insertion sort: a handful of names */
        for (int j = i; j > 0 && strcmp(names[j - 1], names[j]) > 0; j--) {
            char *t = names[j];
            names[j] = names[j - 1];
            names[j - 1] = t;
        }
    size_t len = 0;
    for (int i = 0; i < count; i++) {
        int w = snprintf(out + len, n - len, "%s%s", i ? "," : "", names[i]);
        if (w > 0 && (size_t)w < n - len) len += (size_t)w;
        free(names[i]);
    }
}

static char *join(const char *a, const char *b)
{
    size_t n = strlen(a) + strlen(b) + 2;
    char *p = malloc(n);
    snprintf(p, n, "%s/%s", a, b);
    return p;
}

static bool file_exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* The tensor named name in st equals src converted to dtype (f32: bitwise; bf16: reference RNE). */
static void check_tensor(const gt_safetensors *st, const char *name, const gt_tensor *src,
                         gt_dtype dtype)
{
    const gt_st_entry *e = gt_safetensors_find(st, name);
    EXPECT(e != NULL, "%s: no tensor '%s'", st->path, name);
    if (!e) return;
    bool shape_ok = e->dtype == dtype && e->ndim == src->ndim;
    for (int d = 0; shape_ok && d < src->ndim; d++)
        shape_ok = e->shape[d] == src->shape[d];
    EXPECT(shape_ok, "%s: '%s' has the wrong dtype or shape", st->path, name);
    if (!shape_ok) return;
    int64_t numel = gt_tensor_numel(src);
    const uint8_t *data = st->data + e->begin;
    if (dtype == GT_F32) {
        EXPECT(e->end - e->begin == (uint64_t)numel * 4 &&
                   memcmp(data, src->data, (size_t)numel * 4) == 0,
               "%s: '%s' differs from the source", st->path, name);
    } else {
        int64_t bad = 0;
        const float *x = src->data;
        for (int64_t i = 0; i < numel; i++) {
            uint16_t h;
            memcpy(&h, data + 2 * i, 2);
            bad += h != reference_bf16(x[i]);
        }
        EXPECT(bad == 0, "%s: '%s': %lld bf16 elements are not the RNE rounding", st->path, name,
               (long long)bad);
    }
}

/* ---------------------------------------------------------------- config.json */

static json_int_t get_int(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    EXPECT(json_is_integer(v), "config.json: '%s' is not an integer", key);
    return json_is_integer(v) ? json_integer_value(v) : -1;
}

static double get_real(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    EXPECT(json_is_number(v), "config.json: '%s' is not a number", key);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

static void expect_string(json_t *o, const char *key, const char *want)
{
    const char *got = json_string_value(json_object_get(o, key));
    EXPECT(got && strcmp(got, want) == 0, "config.json: '%s' is '%s', want '%s'", key,
           got ? got : "(not a string)", want);
}

/* bos, eos: the expected token ids, < 0 for null. */
static void check_config_tokens(const char *dir, const gt_llama3_config *c, const char *torch_dtype,
                                int64_t bos, int64_t eos)
{
    char *path = join(dir, "config.json");
    json_error_t jerr;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    EXPECT(json_is_object(root), "%s: %s", path, jerr.text);
    free(path);
    if (!json_is_object(root)) return;

    json_t *arch = json_object_get(root, "architectures");
    const char *arch0 = json_string_value(json_array_get(arch, 0));
    EXPECT(json_is_array(arch) && json_array_size(arch) == 1 && arch0 &&
               strcmp(arch0, "LlamaForCausalLM") == 0,
           "config.json: architectures is not [\"LlamaForCausalLM\"]");
    expect_string(root, "model_type", "llama");
    expect_string(root, "hidden_act", "silu");
    expect_string(root, "torch_dtype", torch_dtype);
    EXPECT(get_int(root, "hidden_size") == c->dim, "hidden_size");
    EXPECT(get_int(root, "intermediate_size") == c->ffn_hidden, "intermediate_size");
    EXPECT(get_int(root, "num_hidden_layers") == c->n_layers, "num_hidden_layers");
    EXPECT(get_int(root, "num_attention_heads") == c->n_heads, "num_attention_heads");
    EXPECT(get_int(root, "num_key_value_heads") == c->n_kv_heads, "num_key_value_heads");
    EXPECT(get_int(root, "head_dim") * c->n_heads == c->dim, "head_dim");
    EXPECT(get_int(root, "vocab_size") == c->vocab_size, "vocab_size");
    EXPECT(get_int(root, "max_position_embeddings") == c->max_seq_len, "max_position_embeddings");
    /* Doubles must read back exactly. */
    EXPECT(get_real(root, "rms_norm_eps") == c->norm_eps, "rms_norm_eps");
    EXPECT(get_real(root, "rope_theta") == c->rope_theta, "rope_theta");
    EXPECT(json_is_false(json_object_get(root, "tie_word_embeddings")), "tie_word_embeddings");
    EXPECT(json_is_false(json_object_get(root, "attention_bias")), "attention_bias");
    EXPECT(json_is_false(json_object_get(root, "mlp_bias")), "mlp_bias");
    if (bos < 0)
        EXPECT(json_is_null(json_object_get(root, "bos_token_id")), "bos_token_id not null");
    else
        EXPECT(get_int(root, "bos_token_id") == bos, "bos_token_id");
    if (eos < 0)
        EXPECT(json_is_null(json_object_get(root, "eos_token_id")), "eos_token_id not null");
    else
        EXPECT(get_int(root, "eos_token_id") == eos, "eos_token_id");

    /* No scaling (original context 0): null, which transformers reads as plain RoPE. */
    json_t *rs = json_object_get(root, "rope_scaling");
    if (c->rope_original_max_position == 0)
        EXPECT(json_is_null(rs), "config.json: rope_scaling is not null without scaling");
    else
        EXPECT(json_is_object(rs), "config.json: rope_scaling is not an object");
    if (json_is_object(rs)) {
        expect_string(rs, "rope_type", "llama3");
        EXPECT(get_real(rs, "factor") == c->rope_factor, "rope_scaling.factor");
        EXPECT(get_real(rs, "low_freq_factor") == c->rope_low_freq_factor, "low_freq_factor");
        EXPECT(get_real(rs, "high_freq_factor") == c->rope_high_freq_factor, "high_freq_factor");
        EXPECT(get_int(rs, "original_max_position_embeddings") == c->rope_original_max_position,
               "original_max_position_embeddings");
    }
    json_decref(root);
}

static void check_config(const char *dir, const gt_llama3_config *c, const char *torch_dtype)
{
    check_config_tokens(dir, c, torch_dtype, -1, -1);
}

/* ---------------------------------------------------------------- single-file export */

static void check_single(const char *dir, const model_fixture *f, gt_dtype dtype)
{
    char listing[512];
    list_dir(dir, listing, sizeof listing);
    EXPECT(strcmp(listing, "config.json,model.safetensors") == 0, "%s holds %s", dir, listing);
    check_config(dir, &f->cfg, dtype == GT_F32 ? "float32" : "bfloat16");

    char *path = join(dir, "model.safetensors");
    gt_safetensors st;
    gt_error err = {0};
    EXPECT_OK(gt_safetensors_open(path, &st, &err), &err);
    free(path);
    if (err.code != GT_OK) return;
    const char *format = gt_safetensors_meta(&st, "format");
    EXPECT(format && strcmp(format, "pt") == 0, "metadata format is '%s'", format ? format : "");
    EXPECT(st.n_entries == f->m.n_params, "%d tensors, want %d", st.n_entries, f->m.n_params);
    for (int k = 0; k < f->m.n_params; k++) {
        char name[160];
        expected_hf_name(f->m.params[k].fqn, name, sizeof name);
        check_tensor(&st, name, &f->params[k], dtype);
    }
    gt_safetensors_close(&st);
}

static void test_single_and_refusals(const char *base)
{
    model_fixture f;
    if (!model_open("test_odd", 7, &f)) return;
    gt_error err = {0};

    /* mkdir -p: two missing levels. */
    char *dir = join(base, "f32/nested");
    EXPECT_OK(gt_export_hf_llama3(&f.cfg, &f.m, f.params, dir, GT_F32, &err), &err);
    check_single(dir, &f, GT_F32);

    /* A second export into the same directory is refused and changes nothing. */
    char before[512], after[512];
    list_dir(dir, before, sizeof before);
    gt_error e2 = {0};
    gt_status s = gt_export_hf_llama3(&f.cfg, &f.m, f.params, dir, GT_BF16, &e2);
    EXPECT(s == GT_ERR_INVALID && strstr(e2.msg, "not empty") && strstr(e2.msg, dir),
           "non-empty directory: %s: %s", gt_status_name(s), e2.msg);
    list_dir(dir, after, sizeof after);
    EXPECT(strcmp(before, after) == 0, "refused export changed %s: %s", dir, after);
    check_single(dir, &f, GT_F32);

    /* A file where a directory should be. */
    char *file_dir = join(dir, "config.json/sub");
    gt_error e3 = {0};
    s = gt_export_hf_llama3(&f.cfg, &f.m, f.params, file_dir, GT_F32, &e3);
    EXPECT(s == GT_ERR_INVALID && strstr(e3.msg, "not a directory"), "file in the way: %s: %s",
           gt_status_name(s), e3.msg);
    free(file_dir);

    /* An existing empty directory is fine; bf16. */
    char *bf = join(base, "bf16");
    mkdir(bf, 0777);
    err = (gt_error){0};
    EXPECT_OK(gt_export_hf_llama3(&f.cfg, &f.m, f.params, bf, GT_BF16, &err), &err);
    check_single(bf, &f, GT_BF16);

    /* The tensors must fit the config; nothing is created otherwise. */
    gt_llama3_config other;
    EXPECT_OK(gt_llama3_flavor("test_gqa", &other, &err), &err);
    char *never = join(base, "never");
    gt_error e4 = {0};
    s = gt_export_hf_llama3(&other, &f.m, f.params, never, GT_F32, &e4);
    EXPECT(s == GT_ERR_SHAPE && strstr(e4.msg, "tok_embeddings.weight"), "config mismatch: %s: %s",
           gt_status_name(s), e4.msg);
    EXPECT(!file_exists(never), "a refused export created %s", never);
    gt_error e5 = {0};
    s = gt_export_hf_llama3(&f.cfg, &f.m, f.params, never, GT_F16, &e5);
    EXPECT(s == GT_ERR_INVALID && strstr(e5.msg, "f16"), "f16: %s: %s", gt_status_name(s), e5.msg);
    EXPECT(!file_exists(never), "a refused export created %s", never);
    free(never);

    /* Token ids when known; plain RoPE when the config has no llama3.1 scaling. */
    gt_llama3_config plain = f.cfg;
    plain.rope_original_max_position = 0;
    char *tok = join(base, "tokens");
    gt_export_hf_options o = {GT_F32, 0, 128000, 128001, NULL, NULL, 0};
    err = (gt_error){0};
    EXPECT_OK(gt_export_hf_llama3_opts(&plain, &f.m, f.params, tok, &o, &err), &err);
    check_config_tokens(tok, &plain, "float32", 128000, 128001);
    free(tok);

    free(bf);
    free(dir);
    model_close(&f);
}

static void test_names(void)
{
    char out[160];
    gt_error err = {0};
    EXPECT_OK(gt_export_hf_llama3_name("layers.12.feed_forward.w2.weight", out, sizeof out, &err),
              &err);
    EXPECT(strcmp(out, "model.layers.12.mlp.down_proj.weight") == 0, "got %s", out);
    const char *bad[] = {"layers.x.attention.wq.weight",
                         "layers.01.attention.wq.weight",
                         "layers.1.attention.wq.bias",
                         "layers..ffn_norm.weight",
                         "lm_head.weight",
                         "layers.1"};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        gt_error e = {0};
        gt_status s = gt_export_hf_llama3_name(bad[k], out, sizeof out, &e);
        EXPECT(s == GT_ERR_INVALID && strstr(e.msg, bad[k]), "'%s' accepted or unnamed: %s", bad[k],
               e.msg);
    }
    gt_error e = {0};
    EXPECT(gt_export_hf_llama3_name("layers.1.attention.wq.weight", out, 10, &e) == GT_ERR_INVALID,
           "a short buffer is not refused");
}

/* ---------------------------------------------------------------- shards */

static void check_sharded(const char *dir, const model_fixture *f, uint64_t limit)
{
    int n = f->m.n_params;
    char *path = join(dir, "model.safetensors.index.json");
    json_error_t jerr;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    EXPECT(json_is_object(root), "%s: %s", path, jerr.text);
    free(path);
    if (!json_is_object(root)) return;
    json_t *map = json_object_get(root, "weight_map");
    EXPECT(json_is_object(map) && (int)json_object_size(map) == n, "weight_map: %d entries",
           json_is_object(map) ? (int)json_object_size(map) : -1);
    uint64_t total = 0;
    for (int k = 0; k < n; k++)
        total += gt_tensor_nbytes(&f->params[k]);
    json_t *meta = json_object_get(root, "metadata");
    EXPECT(json_is_object(meta) && get_int(meta, "total_size") == (json_int_t)total,
           "total_size is not %llu", (unsigned long long)total);

    /* The shard count from the first tensor's file name; every file must match the pattern. */
    char name0[160];
    expected_hf_name(f->m.params[0].fqn, name0, sizeof name0);
    int n_shards = 0, k0 = 0;
    const char *file0 = json_string_value(json_object_get(map, name0));
    EXPECT(file0 && sscanf(file0, "model-%5d-of-%5d.safetensors", &k0, &n_shards) == 2 && k0 == 1 &&
               n_shards > 1,
           "first tensor's shard: %s", file0 ? file0 : "(none)");
    if (n_shards <= 1) {
        json_decref(root);
        return;
    }

    char listing[4096], want[4096] = "config.json";
    size_t len = strlen(want);
    for (int s = 1; s <= n_shards; s++)
        len += (size_t)snprintf(want + len, sizeof want - len, ",model-%05d-of-%05d.safetensors", s,
                                n_shards);
    snprintf(want + len, sizeof want - len, ",model.safetensors.index.json");
    list_dir(dir, listing, sizeof listing);
    EXPECT(strcmp(listing, want) == 0, "%s holds %s, want %s", dir, listing, want);

    /* Walk the parameters in order through the shards: each shard holds a consecutive run. */
    int k = 0;
    uint64_t prev_bytes = 0;
    for (int s = 1; s <= n_shards && k <= n; s++) {
        char file[64];
        snprintf(file, sizeof file, "model-%05d-of-%05d.safetensors", s, n_shards);
        char *sp = join(dir, file);
        gt_safetensors st;
        gt_error err = {0};
        EXPECT_OK(gt_safetensors_open(sp, &st, &err), &err);
        free(sp);
        if (err.code != GT_OK) break;
        const char *format = gt_safetensors_meta(&st, "format");
        EXPECT(format && strcmp(format, "pt") == 0, "%s: metadata format", file);
        uint64_t bytes = 0;
        for (int e = 0; e < st.n_entries && k < n; e++, k++) {
            char name[160];
            expected_hf_name(f->m.params[k].fqn, name, sizeof name);
            EXPECT(strcmp(st.entries[e].name, name) == 0, "%s entry %d is %s, want %s", file, e,
                   st.entries[e].name, name);
            const char *mapped = json_string_value(json_object_get(map, name));
            EXPECT(mapped && strcmp(mapped, file) == 0, "weight_map[%s] = %s, want %s", name,
                   mapped ? mapped : "(none)", file);
            check_tensor(&st, name, &f->params[k], GT_F32);
            bytes += gt_tensor_nbytes(&f->params[k]);
        }
        EXPECT(st.n_entries >= 1, "%s is empty", file);
        EXPECT(bytes <= limit || st.n_entries == 1, "%s: %llu bytes in %d tensors > limit %llu",
               file, (unsigned long long)bytes, st.n_entries, (unsigned long long)limit);
        /* Greedy: the previous shard ended because this shard's first tensor did not fit. */
        if (s > 1 && st.n_entries >= 1) {
            uint64_t first = (uint64_t)st.entries[0].end - st.entries[0].begin;
            EXPECT(prev_bytes + first > limit, "%s: its first tensor fit in the previous shard",
                   file);
        }
        prev_bytes = bytes;
        gt_safetensors_close(&st);
    }
    EXPECT(k == n, "the shards hold %d of %d tensors", k, n);
    json_decref(root);
}

static void test_shards(const char *base)
{
    model_fixture f;
    if (!model_open("test_odd", 11, &f)) return;
    uint64_t largest = 0, total = 0;
    for (int k = 0; k < f.m.n_params; k++) {
        uint64_t b = gt_tensor_nbytes(&f.params[k]);
        if (b > largest) largest = b;
        total += b;
    }
    /* Several tensors per shard; one below the largest tensor (so it stands alone); one byte
     * (every tensor alone). */
    const uint64_t limits[] = {total / 5, largest - 1, 1};
    for (size_t i = 0; i < sizeof limits / sizeof limits[0]; i++) {
        char sub[64];
        snprintf(sub, sizeof sub, "shards_%zu", i);
        char *dir = join(base, sub);
        gt_export_hf_options o = {GT_F32, limits[i], -1, -1, NULL, NULL, 0};
        gt_error err = {0};
        EXPECT_OK(gt_export_hf_llama3_opts(&f.cfg, &f.m, f.params, dir, &o, &err), &err);
        if (err.code == GT_OK) {
            check_sharded(dir, &f, limits[i]);
            check_config(dir, &f.cfg, "float32");
        }
        free(dir);
    }
    /* With the limit exactly the total, everything fits one file and there is no index. */
    char *dir = join(base, "shards_exact");
    gt_export_hf_options o = {GT_F32, total, -1, -1, NULL, NULL, 0};
    gt_error err = {0};
    EXPECT_OK(gt_export_hf_llama3_opts(&f.cfg, &f.m, f.params, dir, &o, &err), &err);
    if (err.code == GT_OK) check_single(dir, &f, GT_F32);
    free(dir);
    model_close(&f);
}

/* ---------------------------------------------------------------- transformers' logits */

static void compare(const char *flavor, const char *what, const gt_tensor *got,
                    const gt_tensor *ref)
{
    int64_t n = gt_tensor_numel(ref);
    EXPECT(gt_tensor_numel(got) == n, "%s %s: %lld elements, reference %lld", flavor, what,
           (long long)gt_tensor_numel(got), (long long)n);
    if (gt_tensor_numel(got) != n) return;
    double err = 0, ref_max = 0;
    for (int64_t i = 0; i < n; i++) {
        double r = gt_tensor_get_f32(ref, i), d = fabs((double)gt_tensor_get_f32(got, i) - r);
        if (!(d <= err)) err = d; /* NaN propagates */
        if (fabs(r) > ref_max) ref_max = fabs(r);
    }
    printf("  %-9s %-12s max abs err vs transformers %.3e  (max |ref| %.3e)\n", flavor, what, err,
           ref_max);
    EXPECT(err <= TOLERANCE, "%s %s: max abs err %.3e > %.0e", flavor, what, err, TOLERANCE);
    EXPECT(err <= RELATIVE * ref_max, "%s %s: max abs err %.3e > %.0e * %.3e", flavor, what, err,
           RELATIVE, ref_max);
}

/* graphtrain's logits for tokens with params (forward only; labels are unused by the logits). */
static gt_status run_logits(model_fixture *f, const gt_tensor *tokens, gt_tensor *logits,
                            gt_error *err)
{
    gt_graph *g = gt_graph_new();
    gt_model m = {0};
    gt_status st = gt_llama3_build(g, &f->cfg, &m, err);
    gt_tensor labels = {0}, *inputs = NULL, *outputs = NULL;
    if (st != GT_OK) goto done;
    gt_graph_add_output(g, GT_OUT_METRIC, "logits", m.logits);
    st = gt_tensor_alloc(&labels, GT_I64, 2, tokens->shape, err);
    if (st != GT_OK) goto done;
    inputs = calloc((size_t)g->n_inputs, sizeof *inputs);
    outputs = calloc((size_t)g->n_outputs, sizeof *outputs);
    EXPECT(g->n_inputs == 2 + f->m.n_params, "%d graph inputs", g->n_inputs);
    for (int k = 0; k < g->n_inputs; k++) {
        const gt_tensor *src = k == 0 ? tokens : k == 1 ? &labels : &f->params[k - 2];
        gt_tensor_wrap(&inputs[k], src->dtype, src->ndim, src->shape, src->data);
    }
    gt_sym_binding_entry be[2] = {{"batch", tokens->shape[0]}, {"seq", tokens->shape[1]}};
    gt_sym_binding binding = {be, 2};
    st = gt_eager_run(g, &binding, inputs, outputs, err);
    if (st == GT_OK) {
        for (int k = 0; k < g->n_outputs; k++) {
            if (g->outputs[k].kind == GT_OUT_METRIC) {
                *logits = outputs[k];
                outputs[k] = (gt_tensor){0};
            }
        }
    }
    for (int k = 0; outputs && k < g->n_outputs; k++)
        gt_tensor_free(&outputs[k]);
done:
    free(inputs);
    free(outputs);
    gt_tensor_free(&labels);
    gt_model_free(&m);
    gt_graph_free(g);
    return st;
}

static void test_transformers_logits(const char *flavor)
{
    char rel[128];
    snprintf(rel, sizeof rel, "tests/fixtures/hf_export/%s.safetensors", flavor);
    gt_safetensors st;
    gt_error err = {0};
    EXPECT_OK(gt_safetensors_open(gt_test_path(rel), &st, &err), &err);
    if (err.code != GT_OK) return;
    const char *meta_flavor = gt_safetensors_meta(&st, "flavor");
    const char *meta_seed = gt_safetensors_meta(&st, "seed");
    EXPECT(meta_flavor && strcmp(meta_flavor, flavor) == 0, "%s: metadata flavor", rel);
    EXPECT(meta_seed != NULL, "%s: metadata seed", rel);
    model_fixture f;
    gt_tensor tokens = {0}, ref = {0}, logits = {0};
    if (!meta_seed || !model_open(flavor, strtoull(meta_seed, NULL, 10), &f)) {
        gt_safetensors_close(&st);
        return;
    }
    EXPECT_OK(gt_safetensors_get(&st, "tokens", &tokens, &err), &err);
    if (err.code != GT_OK) goto done;

    /* f32 export: the weights as they are. */
    EXPECT_OK(gt_safetensors_get(&st, "logits_f32", &ref, &err), &err);
    if (err.code == GT_OK) EXPECT_OK(run_logits(&f, &tokens, &logits, &err), &err);
    if (err.code == GT_OK) compare(flavor, "f32 export", &logits, &ref);
    gt_tensor_free(&ref);
    gt_tensor_free(&logits);

    /* bf16 export: transformers upcast the stored bf16 weights to f32; do the same here. */
    for (int k = 0; k < f.m.n_params; k++) {
        float *x = f.params[k].data;
        for (int64_t i = 0; i < gt_tensor_numel(&f.params[k]); i++) {
            uint32_t bits = (uint32_t)reference_bf16(x[i]) << 16;
            memcpy(&x[i], &bits, sizeof bits);
        }
    }
    err = (gt_error){0};
    EXPECT_OK(gt_safetensors_get(&st, "logits_bf16", &ref, &err), &err);
    if (err.code == GT_OK) EXPECT_OK(run_logits(&f, &tokens, &logits, &err), &err);
    if (err.code == GT_OK) compare(flavor, "bf16 export", &logits, &ref);
done:
    gt_tensor_free(&tokens);
    gt_tensor_free(&ref);
    gt_tensor_free(&logits);
    model_close(&f);
    gt_safetensors_close(&st);
}

int main(void)
{
    char base[] = "/tmp/gt_test_export_hf_XXXXXX";
    EXPECT(mkdtemp(base) != NULL, "mkdtemp failed");
    test_names();
    test_single_and_refusals(base);
    test_shards(base);
    remove_tree(base);
    test_transformers_logits("test_gqa");
    test_transformers_logits("test_odd");
    return gt_test_finish();
}
