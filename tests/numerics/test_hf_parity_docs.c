/* test_hf_parity_docs.c — llama3 with packed documents (model.attn_mask_type block_causal: RoPE at
 * per-document positions, block-causal attention) against Hugging Face transformers given the same
 * position_ids and an explicit 4-D block-causal mask (fixtures from tools/gen_hf_docs_fixtures.py,
 * whose generator also checks the mask against FlexAttention with torchtitan's document mask_mod):
 * logits, loss and every parameter gradient within 1e-5 max abs error (fp32 on the CPU) and 1e-4
 * of each tensor's largest magnitude; a second run bitwise identical; and the same weights and
 * tokens without the documents (the causal graph) give other logits, so the mask is exercised. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "graphtrain/gt_autodiff.h"
#include "graphtrain/gt_exec.h"
#include "graphtrain/gt_graph.h"
#include "graphtrain/gt_llama3.h"
#include "graphtrain/gt_safetensors.h"
#include "gt_test.h"
#include "hf_fixture.h"

#define TOLERANCE 1e-5
#define RELATIVE 1e-4

static const char *const fixtures[] = {"test_tiny", "test_gqa", "test_odd"};

/* The block-causal llama3 graph of a flavor with its logits as the METRIC "logits", and autodiff.
 */
static bool docs_graph(const char *flavor, bool block_causal, gt_graph *g, gt_model *m)
{
    gt_error err = {0};
    gt_llama3_config cfg;
    EXPECT_OK(gt_llama3_flavor(flavor, &cfg, &err), &err);
    cfg.block_causal = block_causal;
    EXPECT_OK(gt_llama3_build(g, &cfg, m, &err), &err);
    if (err.code != GT_OK) return false;
    gt_graph_add_output(g, GT_OUT_METRIC, "logits", m->logits);
    EXPECT_OK(gt_autodiff(g, &err), &err);
    return err.code == GT_OK;
}

/* Index of the graph output named `name` (METRIC), or -1. */
static int output_named(const gt_graph *g, const char *name)
{
    for (int k = 0; k < g->n_outputs; k++)
        if (g->outputs[k].kind == GT_OUT_METRIC &&
            !strcmp(gt_graph_str(g, g->outputs[k].fqn), name))
            return k;
    return -1;
}

/* The causal graph (no positions input) on the fixture's tokens and weights: its logits must
 * differ from the block-causal ones by far more than the tolerance. */
static void check_mask_matters(const char *flavor, const gt_safetensors *st,
                               const gt_tensor *docs_logits)
{
    gt_model m = {0};
    gt_graph *g = gt_graph_new();
    gt_tensor *in = NULL, *out = NULL;
    int n_in = 0, n_out = 0;
    gt_error err = {0};
    if (!docs_graph(flavor, false, g, &m)) goto done;
    n_in = g->n_inputs;
    n_out = g->n_outputs;
    in = calloc((size_t)n_in, sizeof *in);
    out = calloc((size_t)n_out, sizeof *out);
    if (!hf_fixture_inputs(g, st, in)) goto done;
    gt_sym_binding_entry be[2] = {{"batch", in[0].shape[0]}, {"seq", in[0].shape[1]}};
    gt_sym_binding binding = {be, 2};
    EXPECT_OK(gt_eager_run(g, &binding, in, out, &err), &err);
    int k = output_named(g, "logits");
    if (err.code != GT_OK || k < 0) goto done;
    double diff = 0;
    for (int64_t i = 0; i < gt_tensor_numel(docs_logits); i++) {
        double d = fabs((double)gt_tensor_get_f32(&out[k], i) - gt_tensor_get_f32(docs_logits, i));
        diff = d > diff ? d : diff;
    }
    printf("  %-10s causal vs block-causal logits differ by %.3g\n", flavor, diff);
    EXPECT(diff > 1e-3, "%s: the document mask changed the logits by only %.3g", flavor, diff);
done:
    hf_free_tensors(in, n_in);
    hf_free_tensors(out, n_out);
    gt_model_free(&m);
    gt_graph_free(g);
}

static void run_fixture(const char *flavor)
{
    gt_error err = {0};
    gt_safetensors st;
    char rel[256];
    snprintf(rel, sizeof rel, "tests/fixtures/hf_llama3_docs/%s.safetensors", flavor);
    gt_status s = gt_safetensors_open(gt_test_path(rel), &st, &err);
    EXPECT(s == GT_OK, "open fixture: %s (generate with tools/gen_hf_docs_fixtures.py)", err.msg);
    if (s != GT_OK) return;

    gt_model m = {0};
    gt_graph *g = gt_graph_new();
    int n_in = 0, n_out = 0;
    gt_tensor *inputs = NULL, *outputs = NULL, *again = NULL;
    if (!docs_graph(flavor, true, g, &m)) goto done;
    n_in = g->n_inputs;
    n_out = g->n_outputs;
    inputs = calloc((size_t)n_in, sizeof *inputs);
    outputs = calloc((size_t)n_out, sizeof *outputs);
    again = calloc((size_t)n_out, sizeof *again);
    /* tokens, labels, positions, then param.<fqn> in input order */
    if (!hf_fixture_inputs(g, &st, inputs)) goto done;
    EXPECT(n_in == 3 + m.n_params, "%s: %d inputs", flavor, n_in);
    EXPECT(!strcmp(gt_graph_str(g, g->inputs[2].fqn), "positions"), "%s: input 2 is positions",
           flavor);

    gt_sym_binding_entry be[2] = {{"batch", inputs[0].shape[0]}, {"seq", inputs[0].shape[1]}};
    gt_sym_binding binding = {be, 2};
    EXPECT_OK(gt_eager_run(g, &binding, inputs, outputs, &err), &err);
    if (err.code != GT_OK) goto done;
    int n_grads = hf_fixture_check_outputs(flavor, g, &st, outputs, TOLERANCE, RELATIVE);
    EXPECT(n_grads == m.n_params, "%s: %d gradients for %d params", flavor, n_grads, m.n_params);

    EXPECT_OK(gt_eager_run(g, &binding, inputs, again, &err), &err);
    if (err.code == GT_OK) {
        int differing = hf_count_differing(outputs, again, n_out);
        EXPECT(differing == 0, "%s: %d outputs differ between two runs", flavor, differing);
    }
    int k = output_named(g, "logits");
    if (k >= 0) check_mask_matters(flavor, &st, &outputs[k]);

done:
    hf_free_tensors(inputs, n_in);
    hf_free_tensors(outputs, n_out);
    hf_free_tensors(again, n_out);
    gt_model_free(&m);
    gt_graph_free(g);
    gt_safetensors_close(&st);
}

int main(void)
{
    for (size_t k = 0; k < sizeof fixtures / sizeof fixtures[0]; k++)
        run_fixture(fixtures[k]);
    return gt_test_finish();
}
