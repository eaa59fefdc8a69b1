/* test_hf_pretrained_load.c — a folder written by transformers' own save_pretrained loads with
 * checkpoint.initial_load_in_hf and gives transformers' first-step loss (issue 41, item 1, last
 * acceptance point).
 *
 * tests/fixtures/hf_pretrained (tools/gen_hf_pretrained_fixture.py): a test_tiny LlamaForCausalLM
 * in fp32 sharded by save_pretrained into 2 safetensors files with their index, and batch.json:
 * the batch's token rows (seq_len + 1 ids each) and transformers' loss on them. The rows become a
 * GTTOKENS shard of exactly one batch of windows (no shuffle: window i is row i), one step runs
 * from the folder in float32, and metrics.jsonl's step-1 loss (written so that it reads back
 * exactly) must be transformers' within 1e-5 relative. */
#include "train_child.h" /* first: it defines _GNU_SOURCE */

#include <math.h>

#include "graphtrain/gt_core.h"
#include "graphtrain/gt_data.h"
#include "graphtrain/gt_metrics.h"
#include "gt_test.h"

#define BOUND 300.0
#define RELATIVE 1e-5
#define MAX_TOKENS 4096

/* The integer after "key": in text; false if absent. */
static bool json_int(const char *text, const char *key, long long *out)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(text, pat);
    return p && sscanf(p + strlen(pat), " %lld", out) == 1;
}

/* batch.json: {"batch": B, "seq_len": S, "tokens": [...], "loss": x} */
static bool read_batch(const char *path, long long *batch, long long *seq, int32_t *tokens,
                       size_t *n, double *loss)
{
    char *text = read_all(path, NULL);
    if (!text) return false;
    bool ok = json_int(text, "batch", batch) && json_int(text, "seq_len", seq);
    const char *p = strstr(text, "\"tokens\":"), *l = strstr(text, "\"loss\":");
    ok = ok && p && l && sscanf(l + 7, " %lf", loss) == 1 && (p = strchr(p, '['));
    *n = 0;
    while (ok && *p != ']') {
        char *end;
        long v = strtol(p + 1, &end, 10);
        if (end == p + 1 || *n >= MAX_TOKENS) {
            ok = false;
            break;
        }
        tokens[(*n)++] = (int32_t)v;
        p = end;
        while (*p == ' ')
            p++;
        if (*p != ',' && *p != ']') ok = false;
    }
    free(text);
    return ok && *n == (size_t)(*batch * (*seq + 1));
}

int main(void)
{
    char root[] = "/tmp/gt_hf_pretrained_XXXXXX";
    const char *binary = train_child_start(root);
    if (!binary) return 1;
    char shard[400], dump[400];
    char *folder = strdup(gt_test_path("tests/fixtures/hf_pretrained"));
    snprintf(shard, sizeof shard, "%s/batch.bin", root);
    snprintf(dump, sizeof dump, "%s/run", root);

    char index[4200], batch_path[4200];
    snprintf(index, sizeof index, "%s/model.safetensors.index.json", folder);
    snprintf(batch_path, sizeof batch_path, "%s/batch.json", folder);
    EXPECT(access(index, R_OK) == 0, "the fixture is not sharded: no %s", index);
    static int32_t tokens[MAX_TOKENS];
    long long batch = 0, seq = 0;
    size_t n = 0;
    double want = 0.0;
    if (!read_batch(batch_path, &batch, &seq, tokens, &n, &want)) {
        EXPECT(false, "cannot read %s (generate with tools/gen_hf_pretrained_fixture.py)",
               batch_path);
        free(folder);
        return gt_test_finish();
    }
    gt_error err = {0};
    EXPECT_OK(gt_token_shard_write(shard, tokens, n, 256, &err), &err);

    char load[4200], ds[500], bs[64], sl[64];
    snprintf(load, sizeof load, "checkpoint.initial_load_path=%s", folder);
    snprintf(ds, sizeof ds, "training.dataset_path=%s", shard);
    snprintf(bs, sizeof bs, "training.local_batch_size=%lld", batch);
    snprintf(sl, sizeof sl, "training.seq_len=%lld", seq);
    const char *opts[] = {"model.flavor=test_tiny",
                          "training.mixed_precision_param=float32",
                          "job.print_config=false",
                          "metrics.log_freq=1",
                          "training.dataset=tokens",
                          ds,
                          bs,
                          sl,
                          "training.steps=1",
                          load,
                          "checkpoint.initial_load_in_hf=true"};
    char out_path[600], err_path[600];
    snprintf(out_path, sizeof out_path, "%s.out", dump);
    snprintf(err_path, sizeof err_path, "%s.err", dump);
    pid_t pid =
        spawn_train(binary, opts, (int)(sizeof opts / sizeof opts[0]), dump, out_path, err_path);
    int rc = pid > 0 ? wait_child(pid, BOUND) : -1;
    char *o = read_all(out_path, NULL), *e = read_all(err_path, NULL);
    EXPECT(rc == 0, "the run from the save_pretrained folder exited %d", rc);
    EXPECT((o && strstr(o, "parameters from the Hugging Face folder")) ||
               (e && strstr(e, "parameters from the Hugging Face folder")),
           "the run does not say it loaded the folder");
    if (rc != 0)
        fprintf(stderr, "--- stdout ---\n%s\n--- stderr ---\n%s\n", o ? o : "", e ? e : "");
    free(o);
    free(e);

    gt_metrics_step step[2];
    if (rc == 0 && last_records(dump, 1, step, NULL)) {
        double rel = fabs(step[1].loss - want) / fabs(want);
        printf("  first-step loss %.9f, transformers %.9f, relative difference %.2e\n",
               step[1].loss, want, rel);
        EXPECT(rel <= RELATIVE, "first-step loss %.9g is not transformers' %.9g (relative %.2e)",
               step[1].loss, want, rel);
    } else {
        EXPECT(false, "no step-1 record in %s/metrics.jsonl", dump);
    }

    free(folder);
    if (!gt_test_failed_) remove_tree(root);
    return gt_test_finish();
}
