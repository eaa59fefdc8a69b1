/* hf_fixture.h — reading and checking the Hugging Face llama3 fixtures (tests/fixtures/hf_llama3,
 * made by tools/gen_hf_fixtures.py), shared by tests/numerics/test_hf_parity.c (CPU, eager) and
 * tests/cuda/test_cuda_hf_parity.c (GPU, compiled program).
 *
 * A fixture holds the graph's inputs (tokens, labels, param.<fqn>) and the reference outputs
 * (loss, the logits metric, grad.<fqn>). Header-only and private to the tests: every function is
 * static inline; the checks count in the including test (gt_test.h). */
#ifndef GT_HF_FIXTURE_H
#define GT_HF_FIXTURE_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graphtrain/gt_autodiff.h"
#include "graphtrain/gt_graph.h"
#include "graphtrain/gt_llama3.h"
#include "graphtrain/gt_safetensors.h"
#include "gt_test.h"

/* Opens tests/fixtures/hf_llama3/<flavor>.safetensors; false (a failed check) if it cannot. */
static inline bool hf_fixture_open(const char *flavor, gt_safetensors *st)
{
    char rel[256];
    snprintf(rel, sizeof rel, "tests/fixtures/hf_llama3/%s.safetensors", flavor);
    gt_error err = {0};
    gt_status s = gt_safetensors_open(gt_test_path(rel), st, &err);
    EXPECT(s == GT_OK, "open fixture: %s (generate with tools/gen_hf_fixtures.py)", err.msg);
    return s == GT_OK;
}

/* The fixture's graph in g (from gt_graph_new): the llama3 flavor into m, its logits added as the
 * METRIC output "logits", then autodiff. False (a failed check) on failure; m and g are the
 * caller's to free either way. */
static inline bool hf_fixture_graph(const char *flavor, gt_graph *g, gt_model *m)
{
    gt_error err = {0};
    gt_llama3_config cfg;
    EXPECT_OK(gt_llama3_flavor(flavor, &cfg, &err), &err);
    EXPECT_OK(gt_llama3_build(g, &cfg, m, &err), &err);
    if (err.code != GT_OK) return false;
    gt_graph_add_output(g, GT_OUT_METRIC, "logits", m->logits);
    EXPECT_OK(gt_autodiff(g, &err), &err);
    return err.code == GT_OK;
}

/* Max |got − ref| and max |ref| over all elements, after checking the element counts agree; the
 * error must be at most `tolerance` and at most `relative` times max |ref|. Small gradients (wq,
 * wk: |ref| ~1e-4) would pass an absolute bound while 10 % wrong; fp32 agrees to ~1e-6 of the
 * tensor's scale, so the relative bound holds each tensor to its own scale as well. */
static inline void hf_compare(const char *flavor, const char *what, const gt_tensor *got,
                              const gt_tensor *ref, double tolerance, double relative)
{
    int64_t n = gt_tensor_numel(ref);
    EXPECT(gt_tensor_numel(got) == n, "%s %s: %lld elements, reference has %lld", flavor, what,
           (long long)gt_tensor_numel(got), (long long)n);
    if (gt_tensor_numel(got) != n) return;
    double err = 0, ref_max = 0;
    for (int64_t i = 0; i < n; i++) {
        double r = gt_tensor_get_f32(ref, i), d = fabs((double)gt_tensor_get_f32(got, i) - r);
        if (!(d <= err)) err = d; /* NaN propagates into err */
        if (fabs(r) > ref_max) ref_max = fabs(r);
    }
    printf("  %-10s %-40s max abs err %.3e  (max |ref| %.3e)\n", flavor, what, err, ref_max);
    EXPECT(err <= tolerance, "%s %s: max abs err %.3e > %.0e", flavor, what, err, tolerance);
    EXPECT(err <= relative * ref_max, "%s %s: max abs err %.3e > %.0e * max |ref| %.3e", flavor,
           what, err, relative, ref_max);
}

/* Same dtype and bytes. */
static inline bool hf_bitwise_equal(const gt_tensor *a, const gt_tensor *b)
{
    return a->dtype == b->dtype && gt_tensor_nbytes(a) == gt_tensor_nbytes(b) &&
           memcmp(a->data, b->data, gt_tensor_nbytes(a)) == 0;
}

/* The graph's inputs from the fixture, in input order: tokens, labels, then param.<fqn>.
 * inputs[] has g->n_inputs zeroed slots; false (a failed check) at the first missing one. */
static inline bool hf_fixture_inputs(const gt_graph *g, const gt_safetensors *st, gt_tensor *inputs)
{
    gt_error err = {0};
    for (int k = 0; k < g->n_inputs; k++) {
        const char *fqn = gt_graph_str(g, g->inputs[k].fqn);
        char name[160];
        snprintf(name, sizeof name, "%s%s", g->inputs[k].kind == GT_IN_PARAM ? "param." : "", fqn);
        EXPECT_OK(gt_safetensors_get(st, name, &inputs[k], &err), &err);
        if (err.code != GT_OK) return false;
    }
    return true;
}

/* Every output of g (loss, metrics, gradients) against the fixture's "loss", "<fqn>" and
 * "grad.<fqn>" (hf_compare with the given bounds); returns the number of gradients. */
static inline int hf_fixture_check_outputs(const char *flavor, const gt_graph *g,
                                           const gt_safetensors *st, const gt_tensor *outputs,
                                           double tolerance, double relative)
{
    int n_grads = 0;
    for (int k = 0; k < g->n_outputs; k++) {
        const gt_io *o = &g->outputs[k];
        const char *fqn = gt_graph_str(g, o->fqn);
        char name[160];
        if (o->kind == GT_OUT_LOSS) {
            snprintf(name, sizeof name, "loss");
        } else if (o->kind == GT_OUT_METRIC) {
            snprintf(name, sizeof name, "%s", fqn);
        } else {
            EXPECT(o->kind == GT_OUT_GRAD, "%s: unexpected output kind %d", flavor, o->kind);
            snprintf(name, sizeof name, "grad.%s", fqn);
            n_grads++;
        }
        gt_tensor ref;
        gt_error e = {0};
        EXPECT_OK(gt_safetensors_get(st, name, &ref, &e), &e);
        if (e.code != GT_OK) continue;
        hf_compare(flavor, name, &outputs[k], &ref, tolerance, relative);
        gt_tensor_free(&ref);
    }
    return n_grads;
}

/* How many of the n tensors differ bitwise between a and b. */
static inline int hf_count_differing(const gt_tensor *a, const gt_tensor *b, int n)
{
    int differing = 0;
    for (int k = 0; k < n; k++)
        differing += !hf_bitwise_equal(&a[k], &b[k]);
    return differing;
}

/* Frees the n tensors of t (NULL: nothing) and the array. */
static inline void hf_free_tensors(gt_tensor *t, int n)
{
    for (int k = 0; t && k < n; k++)
        gt_tensor_free(&t[k]);
    free(t);
}

#endif
