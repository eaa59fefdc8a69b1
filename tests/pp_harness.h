/* pp_harness.h — the pipeline-parallel step tests' common part (tests/numerics/test_pp_exec.c,
 * tests/distributed/test_pp_mpi.c): llama3 debugmodel's f32 step graph for MICRO micro-batches of
 * gradient accumulation as the trainer builds it, per-micro-batch inputs, feeding updates back,
 * and the reference step: the trainer's accumulation (gt_eager_run_part of the micro-batch part
 * for all but the last micro-batch, running sums fed forward, then the whole graph).
 *
 * Header-only and private to the tests. */
#ifndef GT_PP_HARNESS_H
#define GT_PP_HARNESS_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graphtrain/gt_exec.h"
#include "graphtrain/gt_optim.h"
#include "graphtrain/gt_pipeline.h"
#include "graphtrain/gt_pp_split.h"
#include "graphtrain/gt_train.h"
#include "gt_test.h"

#define MICRO 4
#define STEPS 3

typedef struct {
    gt_config cfg;
    gt_train_layout layout;
    gt_graph *g;
    gt_model model;
    gt_sym_binding_entry entries[GT_TRAIN_BINDING_MAX];
    gt_sym_binding binding;
    int64_t vocab;
} setup;

static inline bool build(setup *s)
{
    gt_error err = {0};
    memset(s, 0, sizeof *s);
    gt_config_defaults(&s->cfg);
    char *argv[] = {"--model.flavor",
                    "debugmodel",
                    "--training.local_batch_size",
                    "1",
                    "--training.seq_len",
                    "32",
                    "--training.mixed_precision_param",
                    "float32",
                    "--training.global_batch_size",
                    "4"};
    EXPECT_OK(gt_config_apply_overrides(&s->cfg, 10, argv, &err), &err);
    EXPECT_OK(gt_train_layout_init(&s->cfg, 0, 0, &s->layout, &err), &err);
    s->g = gt_graph_new();
    EXPECT_OK(gt_train_build_global_graph(&s->cfg, &s->layout, s->g, &s->model, MICRO, &err), &err);
    gt_train_binding(&s->cfg, &s->layout, s->entries, &s->binding);
    s->vocab = 2048;
    return err.code == GT_OK;
}

/* inputs[m]: parameters (seed 7) and zero state shared, tokens and labels of micro-batch m. */
static inline void init_inputs(setup *s, gt_tensor inputs[MICRO][256])
{
    const gt_graph *g = s->g;
    gt_error err = {0};
    gt_tensor *params = calloc((size_t)s->model.n_params, sizeof *params);
    EXPECT_OK(gt_model_init_params(&s->model, 7, params, &err), &err);
    int np = 0;
    uint64_t x = 88172645463325252ull;
    for (int32_t k = 0; k < g->n_inputs; k++) {
        const gt_io *io = &g->inputs[k];
        int64_t shape[GT_MAX_DIMS];
        EXPECT_OK(gt_graph_eval_shape(g, io->value, &s->binding, shape, &err), &err);
        const gt_type *ty = gt_value_type(g, io->value);
        bool per_micro = io->kind == GT_IN_INPUT && ty->dtype == GT_I64;
        for (int m = 0; m < MICRO; m++) {
            if (m > 0 && !per_micro) {
                inputs[m][k] = inputs[0][k];
                inputs[m][k].owns_data = false;
                continue;
            }
            if (io->kind == GT_IN_PARAM) {
                inputs[m][k] = params[np++];
                continue;
            }
            EXPECT_OK(gt_tensor_alloc(&inputs[m][k], ty->dtype, ty->ndim, shape, &err), &err);
            if (per_micro) {
                int64_t *d = inputs[m][k].data;
                bool pos = strcmp(gt_graph_str(g, io->fqn), "positions") == 0;
                for (int64_t i = 0; i < gt_tensor_numel(&inputs[m][k]); i++) {
                    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                    /* positions: packed documents of 5 tokens (block-causal attention) */
                    d[i] = pos ? i % shape[ty->ndim - 1] % 5 : (int64_t)(x % (uint64_t)s->vocab);
                }
            }
        }
    }
    free(params);
}

static inline int32_t input_named(const gt_graph *g, int kind, const char *name)
{
    for (int32_t i = 0; i < g->n_inputs; i++)
        if (g->inputs[i].kind == kind && !strcmp(gt_graph_str(g, g->inputs[i].fqn), name)) return i;
    return -1;
}

/* The updated params and moments back into every micro-batch's inputs; optimizer scalars of
 * `step` into them. */
static inline void next_step(const gt_graph *g, gt_tensor inputs[MICRO][256], gt_tensor *outputs,
                             int64_t step)
{
    for (int32_t k = 0; outputs && k < g->n_outputs; k++) {
        int want = g->outputs[k].kind == GT_OUT_PARAM_UPDATE       ? GT_IN_PARAM
                   : g->outputs[k].kind == GT_OUT_OPT_STATE_UPDATE ? GT_IN_OPT_STATE
                                                                   : -1;
        if (want < 0) continue;
        int32_t i = input_named(g, want, gt_graph_str(g, g->outputs[k].fqn));
        size_t nb = gt_tensor_nbytes(&outputs[k]);
        if (i >= 0 && nb == gt_tensor_nbytes(&inputs[0][i]))
            memcpy(inputs[0][i].data, outputs[k].data, nb);
    }
    gt_adamw_config a = gt_adamw_config_default();
    int32_t sc = input_named(g, GT_IN_INPUT, GT_OPTIM_SCALARS_NAME);
    EXPECT(sc >= 0, "no optimizer scalars");
    if (sc >= 0) gt_optim_scalars(&a, step, 8e-4, inputs[0][sc].data);
}

static inline bool same(const gt_tensor *a, const gt_tensor *b)
{
    size_t n = gt_tensor_nbytes(a);
    return a->dtype == b->dtype && n == gt_tensor_nbytes(b) && (!n || !memcmp(a->data, b->data, n));
}

/* The trainer's accumulation: micro part for 0 .. MICRO-2 (sums fed forward), all for the last. */
static inline void reference_step(setup *s, gt_tensor inputs[MICRO][256], gt_tensor *losses,
                                  gt_tensor *outputs)
{
    const gt_graph *g = s->g;
    gt_error err = {0};
    gt_tensor sums[256] = {{0}}, run_in[256];
    for (int m = 0; m < MICRO; m++) {
        memcpy(run_in, inputs[m], (size_t)g->n_inputs * sizeof *run_in);
        for (int32_t k = 0; k < g->n_inputs; k++)
            if (m > 0 && g->inputs[k].kind == GT_IN_BUFFER) run_in[k] = sums[k];
        gt_tensor *out = calloc((size_t)g->n_outputs, sizeof *out);
        EXPECT_OK(gt_eager_run_part(g, &s->binding, run_in, NULL,
                                    m < MICRO - 1 ? GT_RUN_MICRO : GT_RUN_ALL, out, &err),
                  &err);
        for (int32_t k = 0; k < g->n_outputs; k++) {
            if (g->outputs[k].kind == GT_OUT_LOSS) {
                losses[m] = out[k];
                if (m == MICRO - 1) {
                    gt_tensor_alloc(&outputs[k], out[k].dtype, out[k].ndim, out[k].shape, &err);
                    memcpy(outputs[k].data, out[k].data, gt_tensor_nbytes(&out[k]));
                }
                continue;
            }
            if (m == MICRO - 1) {
                outputs[k] = out[k];
                continue;
            }
            if (g->outputs[k].kind == GT_OUT_BUFFER_UPDATE) {
                int32_t i = input_named(g, GT_IN_BUFFER, gt_graph_str(g, g->outputs[k].fqn));
                if (m > 0) gt_tensor_free(&sums[i]);
                sums[i] = out[k];
            } else {
                gt_tensor_free(&out[k]);
            }
        }
        free(out);
    }
    for (int32_t k = 0; k < g->n_inputs; k++)
        gt_tensor_free(&sums[k]);
}

static inline void free_outputs(gt_tensor *t, int32_t n)
{
    for (int32_t k = 0; k < n; k++)
        gt_tensor_free(&t[k]);
}

#endif
