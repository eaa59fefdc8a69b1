/* test_passes_exact.c — the exact passes keep the whole training step bitwise identical.
 *
 * For each llama3 test flavor the whole-step graph (forward, loss, backward, clipping, AdamW) is
 * built twice; one copy goes through the pass pipeline (canonicalize, cse, dce, verifying after
 * each). Both run in the eager executor on the same parameters, optimizer state and batch, and
 * every output — loss, gradient norm, updated parameters, updated moments — must match byte for
 * byte (memcmp). The reference is the untouched graph. The pipeline must also have removed nodes,
 * so the comparison is not vacuous. Node counts before/after are printed for debugmodel and 8B
 * (graphs on symbolic shapes: building them allocates no tensors). */
#include <stdlib.h>
#include <string.h>

#include "graphtrain/gt_autodiff.h"
#include "graphtrain/gt_exec.h"
#include "graphtrain/gt_llama3.h"
#include "graphtrain/gt_optim.h"
#include "graphtrain/gt_pass.h"
#include "gt_test.h"

static gt_status build_step(const char *flavor, gt_graph *g, gt_model *model, gt_error *err)
{
    gt_llama3_config cfg;
    GT_TRY(gt_llama3_flavor(flavor, &cfg, err));
    GT_TRY(gt_llama3_build(g, &cfg, model, err));
    GT_TRY(gt_autodiff(g, err));
    int n = gt_optim_find_params(g, NULL, 0);
    gt_value_id *params = calloc((size_t)n, sizeof *params);
    gt_value_id *grads = calloc((size_t)n, sizeof *grads);
    gt_optim_find_params(g, params, n);
    int ng = 0;
    for (int k = 0; k < g->n_outputs; k++)
        if (g->outputs[k].kind == GT_OUT_GRAD && ng < n) grads[ng++] = g->outputs[k].value;
    gt_adamw_config a = gt_adamw_config_default();
    gt_status st = ng == n ? gt_optim_append_adamw(g, n, params, grads, &a, err)
                           : gt_error_set(err, GT_ERR_INTERNAL, "%d params, %d grads", n, ng);
    free(params);
    free(grads);
    return st;
}

/* Inputs for one step: initialised params (in PARAM order), moments with a deterministic non-zero
 * pattern (exp_avg_sq >= 0), a token batch, the step-3 scalars. */
static gt_tensor *make_inputs(const gt_graph *g, const gt_model *m, const gt_sym_binding *b,
                              int64_t vocab, gt_error *err)
{
    gt_tensor *in = calloc((size_t)g->n_inputs, sizeof *in);
    gt_tensor *params = calloc((size_t)m->n_params, sizeof *params);
    EXPECT_OK(gt_model_init_params(m, 1234, params, err), err);
    int np = 0;
    gt_adamw_config a = gt_adamw_config_default();
    for (int k = 0; k < g->n_inputs; k++) {
        const gt_io *io = &g->inputs[k];
        const char *name = gt_graph_str(g, io->fqn);
        if (io->kind == GT_IN_PARAM) {
            in[k] = params[np++];
            continue;
        }
        int64_t shape[GT_MAX_DIMS];
        EXPECT_OK(gt_graph_eval_shape(g, io->value, b, shape, err), err);
        const gt_type *t = gt_value_type(g, io->value);
        EXPECT_OK(gt_tensor_alloc(&in[k], t->dtype, t->ndim, shape, err), err);
        int64_t numel = gt_tensor_numel(&in[k]);
        if (strcmp(name, GT_OPTIM_SCALARS_NAME) == 0) {
            float s[3];
            gt_optim_scalars(&a, 3, 3e-3, s);
            memcpy(in[k].data, s, sizeof s);
        } else if (io->kind == GT_IN_OPT_STATE) {
            bool sq =
                strncmp(name, GT_OPTIM_EXP_AVG_SQ_PREFIX, strlen(GT_OPTIM_EXP_AVG_SQ_PREFIX)) == 0;
            for (int64_t i = 0; i < numel; i++) {
                float v = (float)((i * 2654435761u + (uint64_t)k) % 1000) * 1e-6f;
                gt_tensor_set_f32(&in[k], i, sq ? v * v : v - 5e-4f);
            }
        } else {
            /* tokens and labels: a fixed pseudo-random sequence in [0, vocab) */
            int64_t *ids = in[k].data;
            for (int64_t i = 0; i < numel; i++)
                ids[i] = (int64_t)((i * 7919u + (uint64_t)k * 104729u) % (uint64_t)vocab);
        }
    }
    EXPECT(np == m->n_params, "every param fed");
    free(params); /* the tensors' data now belongs to in[] */
    return in;
}

static void free_tensors(gt_tensor *t, int n)
{
    for (int k = 0; k < n; k++)
        gt_tensor_free(&t[k]);
    free(t);
}

static void check_flavor(const char *flavor)
{
    gt_error err = {0};
    gt_graph *g = gt_graph_new();
    gt_model model;
    memset(&model, 0, sizeof model);
    EXPECT_OK(build_step(flavor, g, &model, &err), &err);
    gt_llama3_config cfg;
    EXPECT_OK(gt_llama3_flavor(flavor, &cfg, &err), &err);

    gt_graph *opt = gt_graph_copy(g);
    gt_pass_options o = {.verify_each = true, .quiet = true};
    gt_pass_report rep;
    EXPECT_OK(gt_pass_run_pipeline(opt, &o, &rep, &err), &err);
    EXPECT(opt->n_nodes < g->n_nodes, "%s: the pipeline removed nodes (%d -> %d)", flavor,
           g->n_nodes, opt->n_nodes);
    EXPECT(opt->n_inputs == g->n_inputs && opt->n_outputs == g->n_outputs, "%s: io kept", flavor);
    printf("%s: nodes %d -> %d\n", flavor, g->n_nodes, opt->n_nodes);

    gt_sym_binding_entry e[2] = {{"batch", 2}, {"seq", 16}};
    gt_sym_binding b = {e, 2};
    gt_tensor *in = make_inputs(g, &model, &b, cfg.vocab_size, &err);
    gt_tensor *out_ref = calloc((size_t)g->n_outputs, sizeof *out_ref);
    gt_tensor *out_opt = calloc((size_t)g->n_outputs, sizeof *out_opt);
    EXPECT_OK(gt_eager_run(g, &b, in, out_ref, &err), &err);
    EXPECT_OK(gt_eager_run(opt, &b, in, out_opt, &err), &err);
    int differ = 0;
    for (int k = 0; k < g->n_outputs; k++) {
        size_t n = gt_tensor_nbytes(&out_ref[k]);
        bool same = n == gt_tensor_nbytes(&out_opt[k]) && out_ref[k].dtype == out_opt[k].dtype &&
                    (n == 0 || memcmp(out_ref[k].data, out_opt[k].data, n) == 0);
        if (!same && differ++ < 5)
            fprintf(stderr, "%s: output %d (%s %s) differs\n", flavor, k,
                    gt_output_kind_name((gt_output_kind)g->outputs[k].kind),
                    gt_graph_str(g, g->outputs[k].fqn));
    }
    EXPECT(differ == 0, "%s: %d of %d outputs differ", flavor, differ, g->n_outputs);
    float loss = out_ref[0].data ? gt_tensor_get_f32(&out_ref[0], 0) : NAN;
    EXPECT(isfinite(loss), "%s: finite loss", flavor);

    free_tensors(in, g->n_inputs);
    free_tensors(out_ref, g->n_outputs);
    free_tensors(out_opt, g->n_outputs);
    gt_model_free(&model);
    gt_graph_free(g);
    gt_graph_free(opt);
}

/* Node counts only (no execution) for the real sizes. */
static void count_flavor(const char *flavor)
{
    gt_error err = {0};
    gt_graph *g = gt_graph_new();
    gt_model model;
    memset(&model, 0, sizeof model);
    EXPECT_OK(build_step(flavor, g, &model, &err), &err);
    int32_t before = g->n_nodes;
    gt_pass_options o = {.verify_each = true, .quiet = true};
    gt_pass_report rep;
    EXPECT_OK(gt_pass_run_pipeline(g, &o, &rep, &err), &err);
    printf("%s whole-step graph: nodes %d -> %d (", flavor, before, g->n_nodes);
    for (int k = 0; k < rep.n_run; k++)
        printf("%s%s %d -> %d", k ? ", " : "", rep.pass[k].name, rep.pass[k].nodes_before,
               rep.pass[k].nodes_after);
    printf(")\n");
    EXPECT(g->n_nodes < before, "%s: nodes removed", flavor);
    gt_model_free(&model);
    gt_graph_free(g);
}

int main(void)
{
    gt_log_set_level(GT_LOG_WARN);
    check_flavor("test_tiny");
    check_flavor("test_gqa");
    check_flavor("test_odd");
    count_flavor("debugmodel");
    count_flavor("8B");
    return gt_test_finish();
}
