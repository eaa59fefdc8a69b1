/* test_dsv3_hf_parity.c — DeepSeek-V3 against independent references, fp32, CPU, eager: each
 * fixture of tests/fixtures/hf_dsv3 (tools/gen_dsv3_fixtures.py) holds a batch, every parameter and
 * the expert biases, and the reference's loss, logits, every gradient and the routing ids:
 *   test_dsv3_tiny_sigmoid  Hugging Face DeepseekV3 (q_lora 0, sigmoid, 1 dense layer first)
 *   test_dsv3_qlora         Hugging Face DeepseekV3 (q_lora > 0, sigmoid with expert groups, route
 *                           norm and route scale)
 *   test_dsv3_tiny          the script's plain-torch reference with softmax scores (torchtitan's
 *                           router, which HF cannot express; the script checks that reference
 *                           against HF on the sigmoid configs first)
 *   test_dsv3_qlora_force   that reference on the test_dsv3_qlora shape with torchtitan's
 *                           --debug.moe_force_load_balance: round-robin ids (t·K + j) mod E
 * graphtrain's logits, loss and gradients must agree within 1e-5 relative to each tensor's scale
 * (and 1e-5 absolute), and each MoE layer's routing ids exactly (as sets per token: the fixture
 * sorts each row). With the forced round robin the ids are also checked, unsorted, on a batch of
 * 1 x 5 tokens (T·K = 15 is not a multiple of E = 8: the tiling's cut). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graphtrain/gt_autodiff.h"
#include "graphtrain/gt_deepseek_v3.h"
#include "graphtrain/gt_exec.h"
#include "graphtrain/gt_model.h"
#include "graphtrain/gt_safetensors.h"
#include "hf_fixture.h"

/* The routing ids of each MoE layer as METRIC outputs "routing.layers.N" (what the moe_count
 * nodes count: moe_topk's ids, or the forced round robin). */
static void add_routing_outputs(gt_graph *g)
{
    int32_t n = g->n_nodes;
    for (gt_node_id k = 0; k < n; k++) {
        if (g->nodes[k].op != GT_OP_MOE_COUNT) continue;
        char name[64];
        snprintf(name, sizeof name, "routing.layers.%d", g->nodes[k].unit);
        gt_graph_add_output(g, GT_OUT_METRIC, name, g->nodes[k].in[0]);
    }
}

/* --debug.moe_force_load_balance on batch 1 x 5 of the fixture's tokens: every MoE layer's ids,
 * unsorted, are (t·K + j) mod E. in: the inputs the fixture filled (tokens and labels first). */
static void check_round_robin(gt_graph *g, const gt_tensor *in, int64_t top_k, int64_t n_experts)
{
    gt_tensor *small = calloc((size_t)g->n_inputs + 1, sizeof *small);
    gt_tensor *out = calloc((size_t)g->n_outputs + 1, sizeof *out);
    gt_error err = {0};
    int64_t shape[2] = {1, 5};
    for (int k = 0; k < g->n_inputs; k++) {
        small[k] = in[k];
        if (k < 2) { /* tokens, labels: the first 5 of the first sequence */
            EXPECT_OK(gt_tensor_alloc(&small[k], GT_I64, 2, shape, &err), &err);
            memcpy(small[k].data, in[k].data, 5 * sizeof(int64_t));
        }
    }
    gt_sym_binding_entry be[2] = {{"batch", 1}, {"seq", 5}};
    gt_sym_binding b = {be, 2};
    EXPECT_OK(gt_eager_run(g, &b, small, out, &err), &err);
    int layers = 0, differ = 0;
    for (int k = 0; err.code == GT_OK && k < g->n_outputs; k++) {
        if (strncmp(gt_graph_str(g, g->outputs[k].fqn), "routing.", 8)) continue;
        const int32_t *ids = out[k].data;
        EXPECT(gt_tensor_numel(&out[k]) == 5 * top_k, "round robin: %lld ids",
               (long long)gt_tensor_numel(&out[k]));
        for (int64_t i = 0; i < gt_tensor_numel(&out[k]); i++)
            differ += ids[i] != (int32_t)(i % n_experts);
        layers++;
    }
    printf("  round robin on 1 x 5 tokens: %d MoE layers, %d ids differ from (t*K + j) mod E\n",
           layers, differ);
    EXPECT(layers > 0 && differ == 0, "round robin: %d layers, %d ids differ", layers, differ);
    for (int k = 0; k < 2; k++)
        gt_tensor_free(&small[k]);
    free(small);
    hf_free_tensors(out, g->n_outputs);
}

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* got [T, K] i32, each row sorted here, against the fixture's sorted rows: the same bits. */
static void check_routing(const char *flavor, const char *name, gt_tensor *got,
                          const gt_tensor *ref)
{
    bool same_shape = got->dtype == GT_I32 && ref->dtype == GT_I32 && got->ndim == 2 &&
                      ref->ndim == 2 && got->shape[0] == ref->shape[0] &&
                      got->shape[1] == ref->shape[1];
    EXPECT(same_shape, "%s %s: shape or dtype differs from the fixture's", flavor, name);
    if (!same_shape) return;
    int64_t t = got->shape[0], k = got->shape[1];
    int32_t *ids = got->data;
    for (int64_t r = 0; r < t; r++)
        qsort(ids + r * k, (size_t)k, sizeof *ids, cmp_i32);
    int differ = 0;
    for (int64_t i = 0; i < t * k; i++)
        differ += ids[i] != ((const int32_t *)ref->data)[i];
    printf("  %-22s %-24s %d of %lld ids differ\n", flavor, name, differ, (long long)(t * k));
    EXPECT(differ == 0, "%s %s: %d routing ids differ", flavor, name, differ);
}

/* Fixture `fixture` against graphtrain's `flavor` (with the forced round robin when force). */
static void run_fixture(const char *fixture, const char *flavor, bool force)
{
    char rel[256];
    snprintf(rel, sizeof rel, "tests/fixtures/hf_dsv3/%s.safetensors", fixture);
    gt_safetensors st;
    gt_error err = {0};
    EXPECT_OK(gt_safetensors_open(gt_test_path(rel), &st, &err), &err);
    if (err.code != GT_OK) return;
    gt_model_config mc;
    EXPECT_OK(gt_model_config_init("deepseek_v3", flavor, GT_F32, &mc, &err), &err);
    mc.moe_force_load_balance = force;
    gt_graph *g = gt_graph_new();
    gt_model m = {0};
    if (err.code == GT_OK) EXPECT_OK(gt_model_build(g, &mc, &m, &err), &err);
    if (err.code == GT_OK) {
        gt_graph_add_output(g, GT_OUT_METRIC, "logits", m.logits);
        add_routing_outputs(g);
        EXPECT_OK(gt_autodiff(g, &err), &err);
    }
    gt_tensor *in = calloc((size_t)g->n_inputs + 1, sizeof *in);
    gt_tensor *out = calloc((size_t)g->n_outputs + 1, sizeof *out);
    for (int k = 0; err.code == GT_OK && k < g->n_inputs; k++) {
        const char *prefix = g->inputs[k].kind == GT_IN_PARAM    ? "param."
                             : g->inputs[k].kind == GT_IN_BUFFER ? "buffer."
                                                                 : "";
        char name[192];
        snprintf(name, sizeof name, "%s%s", prefix, gt_graph_str(g, g->inputs[k].fqn));
        EXPECT_OK(gt_safetensors_get(&st, name, &in[k], &err), &err);
    }
    gt_sym_binding_entry be[2] = {{"batch", 0}, {"seq", 0}};
    if (err.code == GT_OK) {
        be[0].value = in[0].shape[0];
        be[1].value = in[0].shape[1];
    }
    gt_sym_binding b = {be, 2};
    if (err.code == GT_OK) EXPECT_OK(gt_eager_run(g, &b, in, out, &err), &err);
    int n_grads = 0, n_routing = 0;
    for (int k = 0; err.code == GT_OK && k < g->n_outputs; k++) {
        const gt_io *o = &g->outputs[k];
        const char *fqn = gt_graph_str(g, o->fqn);
        char name[192];
        snprintf(name, sizeof name, "%s%s", o->kind == GT_OUT_GRAD ? "grad." : "",
                 o->kind == GT_OUT_LOSS ? "loss" : fqn);
        gt_tensor ref;
        gt_error e = {0};
        EXPECT_OK(gt_safetensors_get(&st, name, &ref, &e), &e);
        if (e.code != GT_OK) continue;
        if (!strncmp(name, "routing.", 8)) {
            check_routing(fixture, name, &out[k], &ref);
            n_routing++;
        } else {
            hf_compare(fixture, name, &out[k], &ref, 1e-5, 1e-5);
            n_grads += o->kind == GT_OUT_GRAD;
        }
        gt_tensor_free(&ref);
    }
    EXPECT(err.code != GT_OK || (n_grads == m.n_params && n_routing > 0),
           "%s: %d gradients of %d parameters, %d routing layers checked", fixture, n_grads,
           m.n_params, n_routing);
    if (err.code == GT_OK && force) {
        const gt_deepseek_v3_config *cfg = (const gt_deepseek_v3_config *)mc.cfg;
        check_round_robin(g, in, cfg->top_k, cfg->n_experts);
    }
    hf_free_tensors(in, g->n_inputs);
    hf_free_tensors(out, g->n_outputs);
    gt_model_free(&m);
    gt_graph_free(g);
    gt_safetensors_close(&st);
}

int main(void)
{
    run_fixture("test_dsv3_tiny_sigmoid", "test_dsv3_tiny_sigmoid", false);
    run_fixture("test_dsv3_qlora", "test_dsv3_qlora", false);
    run_fixture("test_dsv3_tiny", "test_dsv3_tiny", false);
    run_fixture("test_dsv3_qlora_force", "test_dsv3_qlora", true);
    return gt_test_finish();
}
