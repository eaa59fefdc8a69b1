/* test_deepseek_v3.c — the deepseek_v3 family (src/models/deepseek_v3*.c): parameter counts of the
 * torchtitan flavors against torchtitan 0.3.0's own numbers (REFERENCE.md, not recomputed here
 * from the code under test), the flavor errors, and every flavor's forward graph built and
 * verified with its fqns, units, MoE tags and expert-bias buffers (shapes only: nothing runs). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graphtrain/gt_deepseek_v3.h"
#include "graphtrain/gt_model.h"
#include "gt_test.h"

/* torchtitan 0.3.0's get_moe_model_nparams_and_flops on the meta device (REFERENCE.md). */
static void test_param_counts(void)
{
    static const struct {
        const char *flavor;
        int64_t params;
    } want[] = {{"debugmodel", 33014016}, {"16B", 15706484224LL}, {"671B", 671026404352LL}};
    for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) {
        gt_deepseek_v3_config cfg;
        gt_error err = {0};
        EXPECT_OK(gt_deepseek_v3_flavor(want[k].flavor, &cfg, &err), &err);
        EXPECT(gt_deepseek_v3_param_count(&cfg) == want[k].params, "%s: %lld parameters, want %lld",
               want[k].flavor, (long long)gt_deepseek_v3_param_count(&cfg),
               (long long)want[k].params);
    }
    /* 16B active: every dense parameter, gate and shared experts, 6 of 64 routed experts:
     * 15,706,484,224 − 26 · 58 · 3 · 1408 · 2048 (the routed experts torchtitan leaves out) */
    gt_deepseek_v3_config cfg;
    gt_error err = {0};
    EXPECT_OK(gt_deepseek_v3_flavor("16B", &cfg, &err), &err);
    EXPECT(gt_deepseek_v3_active_param_count(&cfg) == 15706484224LL - 26LL * 58 * 3 * 1408 * 2048,
           "16B active %lld", (long long)gt_deepseek_v3_active_param_count(&cfg));
}

static void test_flavor_errors(void)
{
    gt_deepseek_v3_config cfg;
    gt_error err = {0};
    EXPECT(gt_deepseek_v3_flavor("3B", &cfg, &err) == GT_ERR_INVALID && strstr(err.msg, "3B") &&
               strstr(err.msg, "16B") && strstr(err.msg, "671B"),
           "unknown flavor listed: %s", err.msg);
    gt_model_config mc;
    gt_error e2 = {0};
    EXPECT(gt_model_config_init("deepseek_v3", "8B", GT_F32, &mc, &e2) == GT_ERR_INVALID &&
               strstr(e2.msg, "model.flavor"),
           "model.flavor named: %s", e2.msg);

    EXPECT_OK(gt_deepseek_v3_flavor("671B", &cfg, &err), &err);
    cfg.n_expert_groups = 7;
    gt_error e3 = {0};
    EXPECT(gt_deepseek_v3_check_config(&cfg, &e3) == GT_ERR_INVALID &&
               strstr(e3.msg, "n_experts") && strstr(e3.msg, "n_expert_groups"),
           "groups not dividing experts named: %s", e3.msg);
    EXPECT_OK(gt_deepseek_v3_flavor("debugmodel", &cfg, &err), &err);
    cfg.top_k = 9;
    gt_error e4 = {0};
    EXPECT(gt_deepseek_v3_check_config(&cfg, &e4) == GT_ERR_INVALID && strstr(e4.msg, "top_k") &&
               strstr(e4.msg, "n_experts"),
           "top_k > experts named: %s", e4.msg);
    EXPECT_OK(gt_deepseek_v3_flavor("debugmodel", &cfg, &err), &err);
    cfg.qk_rope_head_dim = 63;
    gt_error e5 = {0};
    EXPECT(gt_deepseek_v3_check_config(&cfg, &e5) == GT_ERR_INVALID &&
               strstr(e5.msg, "qk_rope_head_dim"),
           "odd rope dim named: %s", e5.msg);
}

static int count_tagged(const gt_graph *g, const char *tag)
{
    int n = 0;
    for (int32_t k = 0; k < g->n_nodes; k++)
        n += gt_node_has_tag(g, &g->nodes[k], tag);
    return n;
}

static bool has_param(const gt_model *m, const char *fqn)
{
    for (int k = 0; k < m->n_params; k++)
        if (!strcmp(m->params[k].fqn, fqn)) return true;
    return false;
}

/* Each flavor's forward graph in f32 and bf16: it verifies, its PARAMs count as the shapes say,
 * one expert-bias BUFFER and one count per MoE layer, the MoE regions tagged. */
static void test_graphs(void)
{
    for (int f = 0; gt_deepseek_v3_flavor_list[f]; f++) {
        const char *name = gt_deepseek_v3_flavor_list[f];
        for (int bf = 0; bf < 2; bf++) {
            gt_model_config mc;
            gt_error err = {0};
            EXPECT_OK(gt_model_config_init("deepseek_v3", name, bf ? GT_BF16 : GT_F32, &mc, &err),
                      &err);
            const gt_deepseek_v3_config *cfg = (const gt_deepseek_v3_config *)mc.cfg;
            gt_graph *g = gt_graph_new();
            gt_model m;
            gt_status st = gt_model_build(g, &mc, &m, &err);
            EXPECT(st == GT_OK, "%s builds: %s", name, err.msg);
            if (st != GT_OK) {
                gt_graph_free(g);
                continue;
            }
            EXPECT_OK(gt_graph_verify(g, &err), &err);
            EXPECT(gt_model_param_count(&m) == gt_deepseek_v3_param_count(cfg),
                   "%s: graph parameters %lld", name, (long long)gt_model_param_count(&m));
            int64_t n_moe = cfg->n_layers - cfg->n_dense_layers;
            EXPECT(m.n_moe == n_moe, "%s: %d MoE layers", name, m.n_moe);
            int buffers = 0;
            for (int32_t k = 0; k < g->n_inputs; k++)
                buffers += g->inputs[k].kind == GT_IN_BUFFER;
            EXPECT(buffers == n_moe, "%s: %d expert-bias buffers", name, buffers);
            EXPECT(count_tagged(g, "moe.dispatch") > 0 && count_tagged(g, "moe.experts") >= 4 &&
                       count_tagged(g, "moe.combine") > 0,
                   "%s: MoE regions tagged", name);
            char fqn[128];
            snprintf(fqn, sizeof fqn, "layers.%lld.moe.routed_experts.inner_experts.w2_EDF",
                     (long long)cfg->n_dense_layers);
            EXPECT(has_param(&m, fqn) && has_param(&m, "lm_head.weight") &&
                       has_param(&m, cfg->q_lora_rank ? "layers.0.attention.wq_b.weight"
                                                      : "layers.0.attention.wq.weight") &&
                       has_param(&m, "layers.0.feed_forward.w1.weight"),
                   "%s: torchtitan's fqns", name);
            gt_model_info info;
            gt_model_info_of(&mc, &info);
            EXPECT(info.active_params > 0 && info.active_params <= gt_model_param_count(&m),
                   "%s: active parameters %lld", name, (long long)info.active_params);
            gt_model_free(&m);
            gt_graph_free(g);
        }
    }
}

int main(void)
{
    test_param_counts();
    test_flavor_errors();
    test_graphs();
    return gt_test_finish();
}
