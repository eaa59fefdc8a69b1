/* test_train_hf_load.c — starting from Hugging Face weights and saving the last checkpoint as a
 * Hugging Face folder (issue 41, item 1: checkpoint.initial_load_path, initial_load_in_hf,
 * last_save_in_hf).
 *
 *   A: test_tiny, 3 steps, last_save_in_hf → A/checkpoint/step-3-hf.
 *   B: starts from A's folder with lr 0 and weight decay 0 (the step leaves the parameters as they
 *      are): its final parameter hash is A's, and its own step-1-hf folder is byte for byte A's
 *      (export → import → export).
 *   S: A's weights re-exported in bfloat16 over several shards with their index: loaded, then saved
 *      in float32, every value is A's rounded to bfloat16 (the sharded and bf16 paths).
 *   Refusals, before any step: another flavor (config.json's num_attention_heads named), a folder
 *   whose tensor is missing (named), initial_load_path without initial_load_in_hf. */
#include "train_child.h" /* first: it defines _GNU_SOURCE */

#include "graphtrain/gt_core.h"
#include "graphtrain/gt_model.h"
#include "graphtrain/gt_safetensors.h"
#include "gt_test.h"

#define BOUND 300.0

static int run_train(const char *binary, const char *const *opts, int n, const char *dump,
                     char **out)
{
    return train_child_run(binary, opts, n, dump, BOUND, out);
}

#define COMMON                                                                                     \
    "model.flavor=test_tiny", "training.mixed_precision_param=float32", "training.seq_len=16",     \
        "training.local_batch_size=2", "job.print_config=false", "checkpoint.enable=true",         \
        "checkpoint.last_save_in_hf=true"

/* A run from folder `from` with lr 0; *hash its final parameters' hash. */
static int run_from(const char *binary, const char *dump, const char *from, const char *flavor,
                    uint64_t *hash, char **out)
{
    char load[700], fl[64];
    snprintf(load, sizeof load, "checkpoint.initial_load_path=%s", from);
    snprintf(fl, sizeof fl, "model.flavor=%s", flavor);
    const char *opts[] = {COMMON,
                          fl,
                          load,
                          "checkpoint.initial_load_in_hf=true",
                          "training.steps=1",
                          "checkpoint.interval=1",
                          "optimizer.lr=0",
                          "optimizer.weight_decay=0"};
    int rc = run_train(binary, opts, (int)(sizeof opts / sizeof opts[0]), dump, out);
    long long first = 0, last = 0;
    if (hash && (rc != 0 || !parse_summary(*out, &first, &last, hash))) *hash = 0;
    return rc;
}

/* The model's parameters from A's folder, in parameter order (whole, f32). */
static bool read_params(const char *dir, gt_model_config *mc, gt_model *m, gt_tensor **params)
{
    gt_error err = {0};
    EXPECT_OK(gt_model_config_init("llama3", "test_tiny", GT_F32, mc, &err), &err);
    gt_graph *g = gt_graph_new();
    EXPECT_OK(gt_model_build(g, mc, m, &err), &err);
    gt_graph_free(g);
    char path[800];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    gt_safetensors st;
    if (gt_safetensors_open(path, &st, &err) != GT_OK) {
        EXPECT(false, "%s", err.msg);
        return false;
    }
    *params = calloc((size_t)m->n_params, sizeof **params);
    bool ok = true;
    for (int k = 0; k < m->n_params && ok; k++) {
        char hf[256];
        ok = mc->family->hf_name(m->params[k].fqn, hf, sizeof hf, &err) == GT_OK &&
             gt_safetensors_get(&st, hf, &(*params)[k], &err) == GT_OK;
        EXPECT(ok, "%s", err.msg);
    }
    gt_safetensors_close(&st);
    return ok;
}

static void free_params(gt_model *m, gt_tensor *params)
{
    for (int k = 0; params && k < m->n_params; k++)
        gt_tensor_free(&params[k]);
    free(params);
    gt_model_free(m);
}

int main(void)
{
    char root[] = "/tmp/gt_hf_load_XXXXXX";
    const char *binary = train_child_start(root);
    if (!binary) return 1;
    char dump_a[300], hf_a[400], dump_b[300], hf_b[400], path_a[500], path_b[500];
    snprintf(dump_a, sizeof dump_a, "%s/a", root);
    snprintf(hf_a, sizeof hf_a, "%s/checkpoint/step-3-hf", dump_a);
    snprintf(dump_b, sizeof dump_b, "%s/b", root);
    snprintf(hf_b, sizeof hf_b, "%s/checkpoint/step-1-hf", dump_b);

    /* A */
    const char *opts_a[] = {COMMON, "training.steps=3", "checkpoint.interval=3"};
    char *out = NULL;
    int rc = run_train(binary, opts_a, (int)(sizeof opts_a / sizeof opts_a[0]), dump_a, &out);
    long long first = 0, last = 0;
    uint64_t hash_a = 0, hash_b = 0;
    EXPECT(rc == 0 && parse_summary(out, &first, &last, &hash_a), "run A exited %d", rc);
    if (rc != 0) train_child_show_tail(out);
    free(out);
    snprintf(path_a, sizeof path_a, "%s/model.safetensors", hf_a);
    EXPECT(access(path_a, R_OK) == 0, "last_save_in_hf wrote no %s", path_a);

    /* B: import, one step with lr 0, export */
    rc = run_from(binary, dump_b, hf_a, "test_tiny", &hash_b, &out);
    EXPECT(rc == 0, "run B (from A's folder) exited %d", rc);
    EXPECT(strstr(out, "parameters from the Hugging Face folder"), "run B does not say it loaded");
    if (rc != 0) train_child_show_tail(out);
    free(out);
    EXPECT(hash_b == hash_a, "run B's parameters %016llx are not A's %016llx",
           (unsigned long long)hash_b, (unsigned long long)hash_a);
    snprintf(path_b, sizeof path_b, "%s/model.safetensors", hf_b);
    EXPECT(same_bytes(path_a, path_b), "export -> import -> export: %s and %s differ", path_a,
           path_b);
    snprintf(path_a, sizeof path_a, "%s/config.json", hf_a);
    snprintf(path_b, sizeof path_b, "%s/config.json", hf_b);
    EXPECT(same_bytes(path_a, path_b), "the config.json files differ");

    /* S: bf16 over several shards */
    gt_model_config mc;
    gt_model m = {0};
    gt_tensor *params = NULL;
    if (read_params(hf_a, &mc, &m, &params)) {
        char hf_s[400], dump_s[300];
        snprintf(hf_s, sizeof hf_s, "%s/sharded_bf16", root);
        snprintf(dump_s, sizeof dump_s, "%s/s", root);
        gt_export_hf_options o = {
            .dtype = GT_BF16, .max_shard_bytes = 40000, .bos_token_id = -1, .eos_token_id = -1};
        gt_error err = {0};
        EXPECT_OK(gt_model_export_hf(&mc, &m, params, hf_s, &o, &err), &err);
        char index[500];
        snprintf(index, sizeof index, "%s/model.safetensors.index.json", hf_s);
        EXPECT(access(index, R_OK) == 0, "the bf16 export is not sharded");
        rc = run_from(binary, dump_s, hf_s, "test_tiny", NULL, &out);
        EXPECT(rc == 0 && strstr(out, "in bfloat16"), "run S (sharded bf16) exited %d", rc);
        if (rc != 0) train_child_show_tail(out);
        free(out);
        char saved[600];
        snprintf(saved, sizeof saved, "%s/checkpoint/step-1-hf", dump_s);
        gt_model_config mc2;
        gt_model m2 = {0};
        gt_tensor *back = NULL;
        if (rc == 0 && read_params(saved, &mc2, &m2, &back)) {
            int64_t bad = 0;
            for (int k = 0; k < m.n_params; k++) {
                const float *a = params[k].data, *b = back[k].data;
                for (int64_t i = 0; i < gt_tensor_numel(&params[k]); i++)
                    bad += b[i] != gt_bf16_to_f32(gt_f32_to_bf16(a[i]));
            }
            EXPECT(bad == 0, "sharded bf16: %lld values are not A's rounded to bf16",
                   (long long)bad);
        }
        free_params(&m2, back);

        /* a folder without one tensor: refused naming it */
        char hf_m[400], dump_m[300];
        snprintf(hf_m, sizeof hf_m, "%s/missing", root);
        snprintf(dump_m, sizeof dump_m, "%s/m", root);
        o.dtype = GT_F32;
        o.max_shard_bytes = 0;
        EXPECT_OK(gt_model_export_hf(&mc, &m, params, hf_m, &o, &err), &err);
        char st_path[500], hf[256];
        snprintf(st_path, sizeof st_path, "%s/model.safetensors", hf_m);
        gt_safetensors st;
        EXPECT_OK(gt_safetensors_open(st_path, &st, &err), &err);
        int n = st.n_entries - 1; /* the last one left out */
        const char **names = calloc((size_t)n, sizeof *names);
        gt_tensor *ts = calloc((size_t)n, sizeof *ts);
        const gt_tensor **tp = calloc((size_t)n, sizeof *tp);
        for (int k = 0; k < n; k++) {
            names[k] = st.entries[k].name;
            EXPECT_OK(gt_safetensors_get(&st, names[k], &ts[k], &err), &err);
            tp[k] = &ts[k];
        }
        snprintf(hf, sizeof hf, "%s", st.entries[n].name);
        remove(st_path);
        EXPECT_OK(gt_safetensors_write(st_path, n, names, tp, 0, NULL, NULL, &err), &err);
        for (int k = 0; k < n; k++)
            gt_tensor_free(&ts[k]);
        free(ts), free(tp), free(names);
        gt_safetensors_close(&st);
        rc = run_from(binary, dump_m, hf_m, "test_tiny", NULL, &out);
        EXPECT(rc > 0 && strstr(out, hf) && strstr(out, "is missing"),
               "a missing tensor (%s): exit %d, not named", hf, rc);
        if (!strstr(out, "is missing")) train_child_show_tail(out);
        free(out);
    }
    free_params(&m, params);

    /* another flavor: config.json refused naming the key */
    char dump_f[300];
    snprintf(dump_f, sizeof dump_f, "%s/f", root);
    rc = run_from(binary, dump_f, hf_a, "test_gqa", NULL, &out);
    EXPECT(rc > 0 && strstr(out, "num_attention_heads = 4, but llama3 flavor test_gqa has 8"),
           "another flavor: exit %d, config.json's num_attention_heads not named", rc);
    if (!strstr(out, "num_attention_heads")) train_child_show_tail(out);
    free(out);

    gt_config cfg;
    gt_error err = {0};
    gt_config_defaults(&cfg);
    gt_status st = gt_config_set(&cfg, "checkpoint.initial_load_path", hf_a, &err);
    if (st == GT_OK) st = gt_config_validate(&cfg, &err);
    EXPECT(st != GT_OK && strstr(err.msg, "initial_load_in_hf"),
           "initial_load_path without initial_load_in_hf: %s", err.msg);
    gt_config_free(&cfg);

    if (!gt_test_failed_) remove_tree(root);
    return gt_test_finish();
}
