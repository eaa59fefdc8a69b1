/* test_cuda_hf_parity.c — llama3 on the GPU in fp32 against Hugging Face transformers (the
 * fixtures of tests/fixtures/hf_llama3, made by tools/gen_hf_fixtures.py; read as in
 * tests/numerics/test_hf_parity.c): the same weights and tokens, run as a compiled program on the
 * CUDA backend (gt_cuda_program_run), must give the fixture's logits, loss and parameter gradients
 * within 1e-4 max abs error (the CUDA issue's bound) and within 1e-4 of each tensor's largest
 * magnitude (so that small gradients are held to their own scale). A second GPU run must be bitwise
 * identical. Without a CUDA device the test skips (exit 0). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_test_util.h"
#include "graphtrain/gt_autodiff.h"
#include "graphtrain/gt_cuda.h"
#include "graphtrain/gt_graph.h"
#include "graphtrain/gt_llama3.h"
#include "graphtrain/gt_program.h"
#include "graphtrain/gt_safetensors.h"
#include "gt_test.h"
#include "hf_fixture.h"

#define TOLERANCE 1e-4
#define RELATIVE 1e-4

static const char *const fixtures[] = {"test_tiny", "test_gqa", "test_odd"};

static void run_fixture(const char *flavor)
{
    gt_error err = {0};
    gt_safetensors st;
    if (!hf_fixture_open(flavor, &st)) return;

    gt_model m = {0};
    gt_graph *g = gt_graph_new();
    int n_in = 0, n_out = 0;
    gt_tensor *inputs = NULL, *outputs = NULL, *again = NULL;
    gt_cuda_program *cp = NULL;
    if (!hf_fixture_graph(flavor, g, &m)) goto done;

    /* graph inputs from the fixture: tokens, labels, then param.<fqn> in input order */
    n_in = g->n_inputs;
    n_out = g->n_outputs;
    inputs = calloc((size_t)n_in, sizeof *inputs);
    outputs = calloc((size_t)n_out, sizeof *outputs);
    again = calloc((size_t)n_out, sizeof *again);
    if (!hf_fixture_inputs(g, &st, inputs)) goto done;
    const gt_tensor *tokens = &inputs[0];
    EXPECT(tokens->ndim == 2, "%s: tokens rank %d", flavor, tokens->ndim);
    if (tokens->ndim != 2) goto done;
    gt_sym_binding_entry be[2] = {{"batch", tokens->shape[0]}, {"seq", tokens->shape[1]}};
    gt_sym_binding binding = {be, 2};
    EXPECT_OK(gt_cuda_program_build(g, &binding, NULL, &cp, &err), &err);
    if (err.code != GT_OK) goto done;
    EXPECT_OK(gt_cuda_program_run(cp, inputs, outputs, &err), &err);
    if (err.code != GT_OK) goto done;

    int n_grads = hf_fixture_check_outputs(flavor, g, &st, outputs, TOLERANCE, RELATIVE);
    EXPECT(n_grads == m.n_params, "%s: %d gradients for %d params", flavor, n_grads, m.n_params);

    /* run to run on the GPU: bitwise identical loss, logits and gradients */
    EXPECT_OK(gt_cuda_program_run(cp, inputs, again, &err), &err);
    if (err.code == GT_OK) {
        int differing = hf_count_differing(outputs, again, n_out);
        EXPECT(differing == 0, "%s: %d outputs differ between two GPU runs", flavor, differing);
        printf("  %-10s second GPU run: %d of %d outputs differ\n", flavor, differing, n_out);
    }

done:
    gt_cuda_program_free(cp);
    hf_free_tensors(inputs, n_in);
    hf_free_tensors(outputs, n_out);
    hf_free_tensors(again, n_out);
    gt_model_free(&m);
    gt_graph_free(g);
    gt_safetensors_close(&st);
}

int main(void)
{
    gt_cuda_device_info info;
    int rc = cu_test_start(&info, NULL);
    if (rc >= 0) return rc;
    printf("device: %s\n", info.name);
    for (size_t k = 0; k < sizeof fixtures / sizeof fixtures[0]; k++)
        run_fixture(fixtures[k]);
    return gt_test_finish();
}
