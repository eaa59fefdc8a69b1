/* test_hf_parity.c — llama3 against Hugging Face transformers (fixtures from
 * tools/gen_hf_fixtures.py): the same weights and tokens must give the same logits, loss and
 * parameter gradients within 1e-5 max abs error (fp32 on the CPU, as llm.c holds its CPU path to
 * PyTorch) and within 1e-4 of each tensor's largest magnitude. Also: the fixture's weights, which
 * came from `graphtrain init --debug.seed 42`, are reproduced bitwise by gt_param_init (init is
 * stable), and a second run is bitwise identical to the first. */
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

/* Every parameter of the model, drawn with the fixture's seed, equals the fixture's weight. */
static void check_init(const char *flavor, const gt_model *m, const gt_tensor *weights,
                       uint64_t seed)
{
    int mismatched = 0;
    for (int k = 0; k < m->n_params; k++) {
        gt_tensor t;
        gt_error err = {0};
        if (gt_tensor_alloc(&t, GT_F32, m->params[k].ndim, m->params[k].shape, &err) != GT_OK) {
            EXPECT(0, "alloc: %s", err.msg);
            return;
        }
        gt_param_init(&m->params[k], seed, 0, gt_tensor_numel(&t), &t);
        if (!hf_bitwise_equal(&t, &weights[k])) {
            mismatched++;
            EXPECT(0, "%s: gt_param_init(seed %llu) differs from the fixture's %s", flavor,
                   (unsigned long long)seed, m->params[k].fqn);
        }
        gt_tensor_free(&t);
    }
    printf("  %-10s init with seed %llu reproduces %d/%d fixture weights bitwise\n", flavor,
           (unsigned long long)seed, m->n_params - mismatched, m->n_params);
}

static void run_fixture(const char *flavor)
{
    gt_error err = {0};
    gt_safetensors st;
    if (!hf_fixture_open(flavor, &st)) return;
    const char *meta_flavor = gt_safetensors_meta(&st, "flavor");
    const char *meta_seed = gt_safetensors_meta(&st, "seed");
    EXPECT(meta_flavor && strcmp(meta_flavor, flavor) == 0, "%s: metadata flavor", flavor);
    uint64_t seed = meta_seed ? strtoull(meta_seed, NULL, 10) : 42;

    gt_model m = {0};
    gt_graph *g = gt_graph_new();
    int n_in = 0, n_out = 0;
    gt_tensor *inputs = NULL, *outputs = NULL, *again = NULL;
    if (!hf_fixture_graph(flavor, g, &m)) goto done;

    /* Feed the graph inputs from the fixture: tokens, labels, then param.<fqn> in input order. */
    n_in = g->n_inputs;
    n_out = g->n_outputs;
    inputs = calloc((size_t)n_in, sizeof *inputs);
    outputs = calloc((size_t)n_out, sizeof *outputs);
    again = calloc((size_t)n_out, sizeof *again);
    if (!hf_fixture_inputs(g, &st, inputs)) goto done;
    EXPECT(n_in == 2 + m.n_params, "%s: %d inputs", flavor, n_in);
    check_init(flavor, &m, inputs + 2, seed);

    const gt_tensor *tokens = &inputs[0];
    EXPECT(tokens->ndim == 2, "%s: tokens rank %d", flavor, tokens->ndim);
    gt_sym_binding_entry be[2] = {{"batch", tokens->shape[0]}, {"seq", tokens->shape[1]}};
    gt_sym_binding binding = {be, 2};
    EXPECT_OK(gt_eager_run(g, &binding, inputs, outputs, &err), &err);
    if (err.code != GT_OK) goto done;

    int n_grads = hf_fixture_check_outputs(flavor, g, &st, outputs, TOLERANCE, RELATIVE);
    EXPECT(n_grads == m.n_params, "%s: %d gradients for %d params", flavor, n_grads, m.n_params);

    /* Run to run: bitwise identical loss, logits and gradients. */
    EXPECT_OK(gt_eager_run(g, &binding, inputs, again, &err), &err);
    if (err.code == GT_OK) {
        int differing = hf_count_differing(outputs, again, n_out);
        EXPECT(differing == 0, "%s: %d outputs differ between two runs", flavor, differing);
    }

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
