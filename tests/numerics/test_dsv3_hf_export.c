/* test_dsv3_hf_export.c — deepseek_v3 to and from a Hugging Face transformers directory.
 *
 * For the fixtures test_dsv3_tiny_sigmoid (q_lora 0) and test_dsv3_qlora (q_lora > 0, expert
 * groups) of tests/fixtures/hf_dsv3 (tools/gen_dsv3_fixtures.py):
 *   - export: the fixture's parameters and expert biases through the family's hf_export; the
 *     directory's tensor names and shapes are exactly those transformers' save_pretrained writes
 *     for that config (hf_names.json, from the script: routed experts one tensor per expert,
 *     mlp.gate.e_score_correction_bias, ...), every tensor holds the fixture's bits (the expert
 *     j of w1/w2/w3 is gate/down/up_proj j), and config.json has save_pretrained's values for
 *     every field hf_names.json lists (sizes, routing, YaRN rope_parameters, ...);
 *   - import through the trainer (checkpoint.initial_load_path + initial_load_in_hf): one step at
 *     lr 0 with --debug.moe_force_load_balance (32 tokens x top-k over 8 experts: balanced counts,
 *     so the expert-bias update is 0) leaves what was read untouched: the step-1 checkpoint holds
 *     the fixture's parameters and biases bit for bit, the model built on them gives the fixture's
 *     loss on its batch (within 1e-5, as the parity test), and checkpoint.last_save_in_hf writes
 *     a directory whose every tensor equals the first export's (round trip, bitwise);
 *   - a config.json of another flavor is refused naming the key;
 *   - `graphtrain export --hf` of a trained run (gt_train_export_hf) writes the trained, nonzero
 *     expert biases as e_score_correction_bias, and they re-import bitwise.
 * The python side (that transformers loads such a directory and reproduces the fixture's logits)
 * is tools/gen_dsv3_fixtures.py --check-export DIR FIXTURE; GT_KEEP_EXPORT=DIR keeps the exports
 * here for it. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* nftw */
#endif
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "graphtrain/gt_backend.h"
#include "graphtrain/gt_checkpoint.h"
#include "graphtrain/gt_config.h"
#include "graphtrain/gt_exec.h"
#include "graphtrain/gt_model.h"
#include "graphtrain/gt_safetensors.h"
#include "graphtrain/gt_train.h"
#include "gt_test.h"
#include "train_child.h"

#define MAX_T 256

typedef struct {
    gt_model_config mc;
    gt_model m;
    gt_graph *g;
    gt_safetensors fx;
    gt_tensor params[MAX_T], bufs[8];
    char bias_names[8][64];
    const char *bias_ptrs[8];
    int n_bufs;
} fixture;

static bool fixture_load(const char *flavor, fixture *f)
{
    memset(f, 0, sizeof *f);
    char rel[256];
    snprintf(rel, sizeof rel, "tests/fixtures/hf_dsv3/%s.safetensors", flavor);
    gt_error err = {0};
    EXPECT_OK(gt_safetensors_open(gt_test_path(rel), &f->fx, &err), &err);
    EXPECT_OK(gt_model_config_init("deepseek_v3", flavor, GT_F32, &f->mc, &err), &err);
    f->g = gt_graph_new();
    EXPECT_OK(gt_model_build(f->g, &f->mc, &f->m, &err), &err);
    if (err.code != GT_OK || f->m.n_params > MAX_T) return false;
    for (int k = 0; k < f->m.n_params; k++) {
        char name[192];
        snprintf(name, sizeof name, "param.%s", f->m.params[k].fqn);
        EXPECT_OK(gt_safetensors_get(&f->fx, name, &f->params[k], &err), &err);
    }
    for (int32_t i = 0; i < f->g->n_inputs && f->n_bufs < 8; i++) {
        if (f->g->inputs[i].kind != GT_IN_BUFFER) continue;
        char name[192];
        snprintf(f->bias_names[f->n_bufs], sizeof f->bias_names[0], "%s",
                 gt_graph_str(f->g, f->g->inputs[i].fqn));
        snprintf(name, sizeof name, "buffer.%s", f->bias_names[f->n_bufs]);
        f->bias_ptrs[f->n_bufs] = f->bias_names[f->n_bufs];
        EXPECT_OK(gt_safetensors_get(&f->fx, name, &f->bufs[f->n_bufs++], &err), &err);
    }
    return err.code == GT_OK;
}

static void fixture_free(fixture *f)
{
    for (int k = 0; k < f->m.n_params; k++)
        gt_tensor_free(&f->params[k]);
    for (int b = 0; b < f->n_bufs; b++)
        gt_tensor_free(&f->bufs[b]);
    gt_model_free(&f->m);
    gt_graph_free(f->g);
    gt_safetensors_close(&f->fx);
}

/* The tensor `name` of DIR/model.safetensors (false if absent). */
static bool read_exported(const char *dir, const char *name, gt_tensor *out)
{
    char path[512];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    gt_safetensors st;
    gt_error err = {0};
    bool ok = gt_safetensors_open(path, &st, &err) == GT_OK;
    ok = ok && gt_safetensors_get(&st, name, out, &err) == GT_OK;
    if (ok || err.code != GT_OK) gt_safetensors_close(&st);
    return ok;
}

static bool same_tensor(const gt_tensor *t, const void *data, int ndim, const int64_t *shape)
{
    if (t->dtype != GT_F32 || t->ndim != ndim) return false;
    for (int d = 0; d < ndim; d++)
        if (t->shape[d] != shape[d]) return false;
    return !memcmp(t->data, data, gt_tensor_nbytes(t));
}

/* Names, shapes and bits of the export in dir against hf_names.json and the fixture. */
static void check_export(const char *flavor, fixture *f, const char *dir, json_t *want)
{
    json_t *tensors = json_object_get(want, "tensors");
    char path[512];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    gt_safetensors st;
    gt_error err = {0};
    EXPECT_OK(gt_safetensors_open(path, &st, &err), &err);
    if (err.code != GT_OK) return;
    int wrong = 0;
    for (int k = 0; k < st.n_entries; k++) {
        const gt_st_entry *e = &st.entries[k];
        json_t *shape = json_object_get(tensors, e->name);
        bool ok = json_is_array(shape) && (int)json_array_size(shape) == e->ndim;
        for (int d = 0; ok && d < e->ndim; d++)
            ok = json_integer_value(json_array_get(shape, (size_t)d)) == e->shape[d];
        if (!ok && wrong++ < 5) fprintf(stderr, "%s: %s not as save_pretrained\n", flavor, e->name);
    }
    EXPECT(wrong == 0 && st.n_entries == (int)json_object_size(tensors),
           "%s: %d of %d exported tensors differ in name or shape from save_pretrained's %zu",
           flavor, wrong, st.n_entries, json_object_size(tensors));
    gt_safetensors_close(&st);

    /* every value */
    int differ = 0, n = 0;
    for (int k = 0; k < f->m.n_params; k++) {
        const gt_tensor *p = &f->params[k];
        char hf[192];
        EXPECT_OK(f->mc.family->hf_name(f->m.params[k].fqn, hf, sizeof hf, &err), &err);
        char *star = strchr(hf, '*');
        int64_t parts = star ? p->shape[0] : 1;
        size_t slice = gt_tensor_nbytes(p) / (size_t)parts;
        for (int64_t e = 0; e < parts; e++, n++) {
            char name[200];
            if (star)
                snprintf(name, sizeof name, "%.*s%lld%s", (int)(star - hf), hf, (long long)e,
                         star + 1);
            else
                snprintf(name, sizeof name, "%s", hf);
            gt_tensor x = {0};
            bool ok = read_exported(dir, name, &x) &&
                      same_tensor(&x, (const char *)p->data + (size_t)e * slice,
                                  star ? p->ndim - 1 : p->ndim, star ? p->shape + 1 : p->shape);
            differ += !ok;
            gt_tensor_free(&x);
        }
    }
    for (int b = 0; b < f->n_bufs; b++, n++) {
        char hf[192];
        EXPECT_OK(f->mc.family->hf_name(f->bias_names[b], hf, sizeof hf, &err), &err);
        gt_tensor x = {0};
        differ += !(read_exported(dir, hf, &x) &&
                    same_tensor(&x, f->bufs[b].data, f->bufs[b].ndim, f->bufs[b].shape));
        gt_tensor_free(&x);
    }
    EXPECT(differ == 0, "%s: %d of %d exported tensors differ from the fixture's", flavor, differ,
           n);

    /* config.json */
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_error_t je;
    json_t *config = json_load_file(path, 0, &je);
    EXPECT(config != NULL, "%s: %s", path, je.text);
    const char *key;
    json_t *v;
    int keys = 0, bad = 0;
    json_object_foreach(json_object_get(want, "config"), key, v)
    {
        keys++;
        if (json_equal(v, json_object_get(config, key))) continue;
        char *a = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY),
             *b = json_dumps(json_object_get(config, key), JSON_COMPACT | JSON_ENCODE_ANY);
        fprintf(stderr, "%s: config.json %s = %s, save_pretrained writes %s\n", flavor, key,
                b ? b : "(absent)", a ? a : "?");
        free(a);
        free(b);
        bad++;
    }
    EXPECT(config && bad == 0, "%s: %d of %d config.json fields differ", flavor, bad, keys);
    printf("%s: %d tensors as save_pretrained names them, %d values checked (%d differ), %d "
           "config fields (%d differ)\n",
           flavor, (int)json_object_size(tensors), n, differ, keys, bad);
    if (config) json_decref(config);
}

/* The fixture's loss of the model on the step-1 checkpoint of dump. */
static void check_loss(const char *flavor, fixture *f, const char *dump)
{
    char path[512];
    snprintf(path, sizeof path, "%s/checkpoint/step-1/" GT_CHECKPOINT_TENSOR_FILE, dump);
    gt_safetensors ck;
    gt_error err = {0};
    EXPECT_OK(gt_safetensors_open(path, &ck, &err), &err);
    if (err.code != GT_OK) return;
    gt_tensor *in = calloc((size_t)f->g->n_inputs + 1, sizeof *in);
    gt_tensor out[4] = {0};
    int same = 0, n = 0;
    for (int32_t i = 0; err.code == GT_OK && i < f->g->n_inputs; i++) {
        const gt_io *io = &f->g->inputs[i];
        const char *name = gt_graph_str(f->g, io->fqn);
        if (io->kind == GT_IN_INPUT) {
            EXPECT_OK(gt_safetensors_get(&f->fx, name, &in[i], &err), &err);
            continue;
        }
        EXPECT_OK(gt_safetensors_get(&ck, name, &in[i], &err), &err);
        char fx[200];
        snprintf(fx, sizeof fx, "%s%s", io->kind == GT_IN_PARAM ? "param." : "buffer.", name);
        gt_tensor ref = {0};
        EXPECT_OK(gt_safetensors_get(&f->fx, fx, &ref, &err), &err);
        same += err.code == GT_OK && in[i].dtype == ref.dtype &&
                gt_tensor_nbytes(&in[i]) == gt_tensor_nbytes(&ref) &&
                !memcmp(in[i].data, ref.data, gt_tensor_nbytes(&ref));
        n++;
        gt_tensor_free(&ref);
    }
    EXPECT(same == n, "%s: %d of %d imported tensors differ from the fixture's", flavor, n - same,
           n);
    gt_sym_binding_entry be[2] = {{"batch", in[0].shape[0]}, {"seq", in[0].shape[1]}};
    gt_sym_binding b = {be, 2};
    if (err.code == GT_OK) EXPECT_OK(gt_eager_run(f->g, &b, in, out, &err), &err);
    gt_tensor ref = {0};
    EXPECT_OK(gt_safetensors_get(&f->fx, "loss", &ref, &err), &err);
    if (err.code == GT_OK) {
        float got = *(const float *)out[0].data, want = *(const float *)ref.data;
        EXPECT(fabsf(got - want) <= 1e-5f * fabsf(want), "%s: loss %.7f, the fixture's %.7f",
               flavor, got, want);
        printf("%s: imported %d tensors bit for bit; loss on the fixture's batch %.7f (fixture "
               "%.7f)\n",
               flavor, same, got, want);
    }
    gt_tensor_free(&ref);
    for (int k = 0; k < 4; k++)
        gt_tensor_free(&out[k]);
    for (int32_t i = 0; i < f->g->n_inputs; i++)
        gt_tensor_free(&in[i]);
    free(in);
    gt_safetensors_close(&ck);
}

/* Every tensor of a/model.safetensors equals b's, and b has no other. */
static void check_same_dir(const char *flavor, const char *a, const char *b)
{
    char pa[512], pb[512];
    snprintf(pa, sizeof pa, "%s/model.safetensors", a);
    snprintf(pb, sizeof pb, "%s/model.safetensors", b);
    gt_safetensors sa, sb;
    gt_error err = {0};
    EXPECT_OK(gt_safetensors_open(pa, &sa, &err), &err);
    EXPECT_OK(gt_safetensors_open(pb, &sb, &err), &err);
    if (err.code != GT_OK) return;
    int differ = 0;
    for (int k = 0; k < sa.n_entries; k++) {
        gt_tensor x = {0}, y = {0};
        bool ok = gt_safetensors_get(&sa, sa.entries[k].name, &x, &err) == GT_OK &&
                  gt_safetensors_get(&sb, sa.entries[k].name, &y, &err) == GT_OK &&
                  gt_tensor_nbytes(&x) == gt_tensor_nbytes(&y) &&
                  !memcmp(x.data, y.data, gt_tensor_nbytes(&x));
        differ += !ok;
        gt_tensor_free(&x);
        gt_tensor_free(&y);
    }
    EXPECT(differ == 0 && sa.n_entries == sb.n_entries,
           "%s: round trip: %d of %d tensors differ (%d vs %d tensors)", flavor, differ,
           sa.n_entries, sa.n_entries, sb.n_entries);
    printf("%s: export -> import -> export: %d tensors, %d differ\n", flavor, sa.n_entries, differ);
    gt_safetensors_close(&sa);
    gt_safetensors_close(&sb);
}

static void run(const char *flavor, const char *root, json_t *names)
{
    fixture f;
    if (!fixture_load(flavor, &f)) {
        EXPECT(false, "%s: fixture not loaded", flavor);
        return;
    }
    char dir[300], dump[300], again[400];
    snprintf(dir, sizeof dir, "%s/%s-hf", root, flavor);
    snprintf(dump, sizeof dump, "%s/%s-run", root, flavor);
    gt_export_hf_options o = {.dtype = GT_F32,
                              .bos_token_id = -1,
                              .eos_token_id = -1,
                              .buffers = f.bufs,
                              .buffer_names = f.bias_ptrs,
                              .n_buffers = f.n_bufs};
    gt_error err = {0};
    EXPECT_OK(gt_model_export_hf(&f.mc, &f.m, f.params, dir, &o, &err), &err);
    check_export(flavor, &f, dir, json_object_get(names, flavor));

    /* import through the trainer, one step that changes nothing, export again */
    const char *options[] = {
        "model.name=deepseek_v3",
        "training.dataset=synthetic",
        "training.local_batch_size=2",
        "training.seq_len=16",
        "training.steps=1",
        "training.mixed_precision_param=float32",
        "optimizer.lr=0",
        "lr_scheduler.warmup_steps=0",
        "debug.moe_force_load_balance=true",
        "checkpoint.enable=true",
        "checkpoint.interval=1",
        "checkpoint.last_save_in_hf=true",
    };
    gt_config cfg;
    gt_train_result r = {0};
    EXPECT_OK(
        train_child_config(&cfg, options, (int)(sizeof options / sizeof options[0]), dump, &err),
        &err);
    EXPECT_OK(gt_config_set(&cfg, "model.flavor", flavor, &err), &err);
    EXPECT_OK(gt_config_set(&cfg, "checkpoint.initial_load_path", dir, &err), &err);
    EXPECT_OK(gt_config_set(&cfg, "checkpoint.initial_load_in_hf", "true", &err), &err);
    EXPECT_OK(gt_config_validate(&cfg, &err), &err);
    EXPECT_OK(gt_train(&cfg, &r, &err), &err);
    gt_config_free(&cfg);
    check_loss(flavor, &f, dump);
    snprintf(again, sizeof again, "%s/checkpoint/step-1-hf", dump);
    check_same_dir(flavor, dir, again);
    fixture_free(&f);
}

/* The expert biases of checkpoint step `step` of dump (f32 [E] each) and their layers. */
static int read_biases(const char *dump, int step, gt_tensor *out, int *layers, int max)
{
    char path[600];
    snprintf(path, sizeof path, "%s/checkpoint/step-%d/model.safetensors", dump, step);
    gt_safetensors f;
    gt_error err = {0};
    EXPECT_OK(gt_safetensors_open(path, &f, &err), &err);
    if (err.code != GT_OK) return 0;
    int n = 0;
    for (int k = 0; k < f.n_entries && n < max; k++) {
        int layer = -1, used = 0;
        const char *name = f.entries[k].name;
        if (sscanf(name, "layers.%d.moe.expert_bias_E%n", &layer, &used) != 1 || name[used])
            continue;
        layers[n] = layer;
        EXPECT_OK(gt_safetensors_get(&f, name, &out[n++], &err), &err);
    }
    gt_safetensors_close(&f);
    return n;
}

static bool same_bits(const gt_tensor *a, const gt_tensor *b)
{
    return a->data && b->data && gt_tensor_nbytes(a) == gt_tensor_nbytes(b) &&
           !memcmp(a->data, b->data, gt_tensor_nbytes(a));
}

/* The export directory of a trained run's dump folder. */
static const char *dump_hf(const char *dump)
{
    static char dir[400];
    snprintf(dir, sizeof dir, "%s-hf", dump);
    return dir;
}

static void train_flavor(const char *flavor, const char *const *options, int n, const char *dump,
                         const char *hf_dir)
{
    gt_config cfg;
    gt_train_result r = {0};
    gt_error err = {0};
    EXPECT_OK(train_child_config(&cfg, options, n, dump, &err), &err);
    EXPECT_OK(gt_config_set(&cfg, "model.flavor", flavor, &err), &err);
    if (hf_dir) {
        EXPECT_OK(gt_config_set(&cfg, "checkpoint.initial_load_path", hf_dir, &err), &err);
        EXPECT_OK(gt_config_set(&cfg, "checkpoint.initial_load_in_hf", "true", &err), &err);
    }
    EXPECT_OK(gt_config_validate(&cfg, &err), &err);
    EXPECT_OK(gt_train(&cfg, &r, &err), &err);
    if (!hf_dir) EXPECT_OK(gt_train_export_hf(&cfg, 3, dump_hf(dump), GT_F32, &err), &err);
    gt_config_free(&cfg);
}

/* `graphtrain export --hf` of a trained run (gt_train_export_hf, step 3): the expert biases the
 * steps moved (nonzero) are the directory's e_score_correction_bias, bit for bit; read back
 * through the trainer's import (one step at lr 0 with balanced routing, so no bias update) the
 * step-1 checkpoint holds the same bits again. */
static void trained_export(const char *root)
{
    const char *flavor = "test_dsv3_tiny_sigmoid";
    char dump[300], back[300];
    snprintf(dump, sizeof dump, "%s/trained-run", root);
    snprintf(back, sizeof back, "%s/trained-back", root);
    const char *train[] = {
        "model.name=deepseek_v3",
        "training.dataset=synthetic",
        "training.local_batch_size=2",
        "training.seq_len=16",
        "training.steps=3",
        "training.mixed_precision_param=float32",
        "checkpoint.enable=true",
        "checkpoint.interval=3",
    };
    train_flavor(flavor, train, (int)(sizeof train / sizeof train[0]), dump, NULL);

    gt_tensor trained[8] = {{0}}, read[8] = {{0}};
    int layers[8], layers_back[8];
    int n = read_biases(dump, 3, trained, layers, 8), same = 0, nonzero = 0;
    char path[450];
    snprintf(path, sizeof path, "%s/model.safetensors", dump_hf(dump));
    gt_safetensors hf;
    gt_error err = {0};
    EXPECT_OK(gt_safetensors_open(path, &hf, &err), &err);
    for (int k = 0; k < n && err.code == GT_OK; k++) {
        char name[160];
        gt_tensor h = {0};
        snprintf(name, sizeof name, "model.layers.%d.mlp.gate.e_score_correction_bias", layers[k]);
        gt_error e2 = {0};
        if (gt_safetensors_get(&hf, name, &h, &e2) == GT_OK) same += same_bits(&h, &trained[k]);
        for (int64_t i = 0; i < gt_tensor_numel(&trained[k]); i++)
            nonzero += gt_tensor_get_f32(&trained[k], i) != 0.0;
        gt_tensor_free(&h);
    }
    if (err.code == GT_OK) gt_safetensors_close(&hf);
    printf("trained export: %d of %d layers' e_score_correction_bias the trained bits (%d nonzero "
           "entries)\n",
           same, n, nonzero);
    EXPECT(n > 0 && same == n, "trained export: %d of %d expert biases exported bitwise", same, n);
    EXPECT(nonzero > 0, "trained export: every expert bias is zero (the check would be empty)");

    const char *again[] = {
        "model.name=deepseek_v3",
        "training.dataset=synthetic",
        "training.local_batch_size=2",
        "training.seq_len=16",
        "training.steps=1",
        "training.mixed_precision_param=float32",
        "optimizer.lr=0",
        "lr_scheduler.warmup_steps=0",
        "debug.moe_force_load_balance=true",
        "checkpoint.enable=true",
        "checkpoint.interval=1",
    };
    train_flavor(flavor, again, (int)(sizeof again / sizeof again[0]), back, dump_hf(dump));
    int m = read_biases(back, 1, read, layers_back, 8), equal = 0;
    for (int k = 0; k < m && k < n; k++)
        equal += layers_back[k] == layers[k] && same_bits(&read[k], &trained[k]);
    printf("trained export re-imported: %d of %d expert biases bitwise\n", equal, n);
    EXPECT(m == n && equal == n, "re-import: %d of %d expert biases bitwise", equal, n);
    for (int k = 0; k < 8; k++) {
        gt_tensor_free(&trained[k]);
        gt_tensor_free(&read[k]);
    }
}

int main(void)
{
    gt_cpu_set_threads(1);
    const char *keep = getenv("GT_KEEP_EXPORT");
    char tmp[] = "/tmp/gt_dsv3_hf_export_XXXXXX";
    const char *root = keep && keep[0] ? keep : mkdtemp(tmp);
    if (!root) {
        perror("mkdtemp");
        return 1;
    }
    mkdir(root, 0755);
    json_error_t je;
    json_t *names = json_load_file(gt_test_path("tests/fixtures/hf_dsv3/hf_names.json"), 0, &je);
    EXPECT(names != NULL, "hf_names.json: %s", je.text);
    run("test_dsv3_tiny_sigmoid", root, names);
    run("test_dsv3_qlora", root, names);
    trained_export(root);

    /* another flavor's config.json, named by the key that differs */
    char path[400], *text = NULL;
    snprintf(path, sizeof path, "%s/test_dsv3_qlora-hf/config.json", root);
    size_t len = 0;
    text = read_all(path, &len);
    gt_model_config mc;
    gt_error err = {0};
    EXPECT_OK(gt_model_config_init("deepseek_v3", "test_dsv3_tiny", GT_F32, &mc, &err), &err);
    gt_status st = text ? gt_model_hf_import(&mc, text, len, path, &err) : GT_ERR_IO;
    EXPECT(st == GT_ERR_INVALID && strstr(err.msg, "num_hidden_layers"),
           "another flavor's config.json: %s", err.msg);
    printf("test_dsv3_tiny reading test_dsv3_qlora's config.json: %s\n", err.msg);
    free(text);
    if (names) json_decref(names);
    if (!(keep && keep[0])) remove_tree(root);
    return gt_test_finish();
}
