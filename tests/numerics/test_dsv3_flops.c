/* test_dsv3_flops.c — DeepSeek-V3's active parameters and the MFU a MoE run reports.
 *
 * - Counts: for every flavor of tests/fixtures/hf_dsv3/param_counts.json (written by
 *   tools/gen_dsv3_fixtures.py from the shapes alone, torchtitan's get_moe_model_nparams_and_flops
 *   formulas: 16B 15,706,484,224 total, 2,661,150,208 active), the family's total and active
 *   counts and its attention FLOPs per token and position equal the script's.
 * - `graphtrain graph --model.name deepseek_v3 --model.flavor 16B` prints both counts.
 * - The trainer's MFU: 2 steps of test_dsv3_tiny (f32, batch 2 x 16, --metrics.peak_tflops 1)
 *   record model_flops_per_step = tokens · (6 · (active − embedding) + 6 · L · H · (qk + v) · seq),
 *   the active count taken here from the built model's parameters (routed experts scaled by
 *   top_k / n_experts), and mfu = that / (step seconds · 1e12). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* popen, nftw */
#endif
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graphtrain/gt_backend.h"
#include "graphtrain/gt_config.h"
#include "graphtrain/gt_deepseek_v3.h"
#include "graphtrain/gt_metrics.h"
#include "graphtrain/gt_model.h"
#include "graphtrain/gt_train.h"
#include "gt_test.h"
#include "train_child.h"

static int64_t json_int(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    EXPECT(json_is_integer(v), "param_counts.json: %s is not an integer", key);
    return json_is_integer(v) ? (int64_t)json_integer_value(v) : -1;
}

static void check_counts(void)
{
    json_error_t je;
    json_t *root = json_load_file(gt_test_path("tests/fixtures/hf_dsv3/param_counts.json"), 0, &je);
    EXPECT(root != NULL, "param_counts.json: %s", je.text);
    if (!root) return;
    const char *flavor;
    json_t *want;
    int n = 0;
    json_object_foreach(root, flavor, want)
    {
        gt_model_config mc;
        gt_error err = {0};
        EXPECT_OK(gt_model_config_init("deepseek_v3", flavor, GT_BF16, &mc, &err), &err);
        if (err.code != GT_OK) continue;
        const gt_deepseek_v3_config *cfg = (const gt_deepseek_v3_config *)(const void *)mc.cfg;
        gt_model_info info;
        gt_model_info_of(&mc, &info);
        int64_t total = gt_deepseek_v3_param_count(cfg), active = info.active_params;
        EXPECT(total == json_int(want, "total") && active == json_int(want, "active") &&
                   info.attention_flops_per_position ==
                       (double)json_int(want, "attention_flops_per_position"),
               "%s: total %lld, active %lld, attention %.0f differ from the script's", flavor,
               (long long)total, (long long)active, info.attention_flops_per_position);
        printf("%-10s total %15lld  active %14lld  (the script's %lld / %lld)\n", flavor,
               (long long)total, (long long)active, (long long)json_int(want, "total"),
               (long long)json_int(want, "active"));
        n++;
    }
    EXPECT(n >= 3, "%d flavors compared", n);
    json_decref(root);
}

static void check_graph_command(void)
{
    const char *binary = getenv("GT_BINARY");
    EXPECT(binary && binary[0], "GT_BINARY must name the graphtrain program (CTest sets it)");
    if (!binary || !binary[0]) return;
    char cmd[1024];
    snprintf(
        cmd, sizeof cmd,
        "'%s' graph --model.name deepseek_v3 --model.flavor 16B --graph.print=false 2>/dev/null",
        binary);
    FILE *p = popen(cmd, "r");
    EXPECT(p != NULL, "popen %s", cmd);
    if (!p) return;
    char line[512];
    bool total = false, active = false;
    while (fgets(line, sizeof line, p)) {
        total |= !strncmp(line, "parameters ", 11) && strstr(line, " 15706484224 ");
        active |= !strncmp(line, "active params ", 14) && strstr(line, " 2661150208 ");
    }
    int rc = pclose(p);
    EXPECT(rc == 0 && total && active, "graphtrain graph 16B: exit %d, total %s, active %s printed",
           rc, total ? "" : "not", active ? "" : "not");
    printf("graphtrain graph 16B prints 15706484224 parameters and 2661150208 active\n");
}

static void check_mfu(void)
{
    static const char *const options[] = {
        "model.name=deepseek_v3",
        "model.flavor=test_dsv3_tiny",
        "training.dataset=synthetic",
        "training.local_batch_size=2",
        "training.seq_len=16",
        "training.steps=2",
        "training.mixed_precision_param=float32",
        "metrics.log_freq=1",
        "metrics.save_jsonl=true",
        "metrics.peak_tflops=1",
    };
    char root[] = "/tmp/gt_dsv3_flops_XXXXXX";
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        EXPECT(false, "mkdtemp");
        return;
    }
    gt_config cfg;
    gt_error err = {0};
    gt_train_result r = {0};
    EXPECT_OK(
        train_child_config(&cfg, options, (int)(sizeof options / sizeof options[0]), root, &err),
        &err);
    EXPECT_OK(gt_train(&cfg, &r, &err), &err);

    /* the expectation, from the built model's parameters */
    gt_model_config mc;
    gt_model m = {0};
    gt_graph *g = gt_graph_new();
    EXPECT_OK(gt_model_config_init("deepseek_v3", "test_dsv3_tiny", GT_F32, &mc, &err), &err);
    EXPECT_OK(gt_model_build(g, &mc, &m, &err), &err);
    const gt_deepseek_v3_config *dc = (const gt_deepseek_v3_config *)(const void *)mc.cfg;
    double matmul = 0;
    for (int k = 0; k < m.n_params; k++) {
        const gt_param_spec *p = &m.params[k];
        double n = (double)gt_shape_numel(p->ndim, p->shape);
        if (strstr(p->fqn, "tok_embeddings")) continue;
        if (strstr(p->fqn, "routed_experts")) n = n * (double)dc->top_k / (double)dc->n_experts;
        matmul += n;
    }
    double seq = 16, tokens = 2 * 16;
    double per_token =
        6 * matmul + 6.0 * (double)dc->n_layers * (double)dc->n_heads *
                         (double)(dc->qk_nope_head_dim + dc->qk_rope_head_dim + dc->v_head_dim) *
                         seq;
    double want = per_token * tokens;
    gt_metrics_step s[3];
    bool have = last_records(root, 2, s, NULL);
    EXPECT(have, "metrics of steps 1..2 missing");
    for (int k = 1; have && k <= 2; k++) {
        double got = s[k].model_flops_per_step;
        EXPECT(fabs(got - want) <= 1e-12 * want,
               "step %d: model_flops_per_step %.17g, want %.17g (active-parameter count)", k, got,
               want);
        double mfu = want / s[k].step_seconds / 1e12;
        EXPECT(fabs(s[k].mfu - mfu) <= 1e-6 * mfu, "step %d: mfu %.9g, want %.9g", k, s[k].mfu,
               mfu);
        printf("step %d: model FLOPs %.6e (want %.6e), mfu %.3g\n", k, got, want, s[k].mfu);
    }
    gt_model_free(&m);
    gt_graph_free(g);
    gt_config_free(&cfg);
    remove_tree(root);
}

int main(void)
{
    gt_cpu_set_threads(1);
    check_counts();
    check_graph_command();
    check_mfu();
    return gt_test_finish();
}
