/* step_harness.h — the whole-step harness shared by the numerics tests that run training steps
 * (tests/numerics/test_partition.c, test_program_exact.c, test_memory_policy.c) and the CUDA tests
 * that run them on the GPU (tests/cuda/test_cuda_program.c, test_cuda_graph.c): the whole-step
 * graph of a llama3 flavor, its initial state, the state fed back from one step to the next, and
 * the bitwise comparison of two runs' outputs.
 *
 * A run keeps one tensor per graph input (params, moments, optimizer scalars, tokens, labels) and
 * one slot per graph output. After each step the PARAM_UPDATE / OPT_STATE_UPDATE outputs become
 * the inputs of the same kind and name, so two runs fed the same way must stay bitwise equal at
 * every step.
 *
 * Header-only and private to the tests: every function is static inline, so a test that uses only
 * some of them still compiles warning-free. The checks count in the including test (gt_test.h). */
#ifndef GT_STEP_HARNESS_H
#define GT_STEP_HARNESS_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graphtrain/gt_autodiff.h"
#include "graphtrain/gt_exec.h"
#include "graphtrain/gt_llama3.h"
#include "graphtrain/gt_optim.h"
#include "gt_test.h"

/* The learning rate every step is given (the schedule is not under test here). */
#define STEP_HARNESS_LR 3e-3

/* A whole-step graph with the model it was built from, its AdamW settings and the batch x seq
 * binding of its symbolic shapes. */
typedef struct {
    gt_graph *g;
    gt_model model;
    gt_adamw_config adamw;
    int64_t vocab;
    gt_sym_binding_entry bind_entries[2];
    gt_sym_binding binding;
} step_graph;

/* Frees what s holds and leaves it empty (freeing it again is harmless). */
static inline void step_graph_free(step_graph *s)
{
    gt_graph_free(s->g);
    s->g = NULL;
    gt_model_free(&s->model);
}

/* The body of step_graph_build_in; on failure s may hold a partial graph. */
static inline bool step_graph_build_parts_in(step_graph *s, const char *flavor,
                                             const gt_dtype *compute_dtype, int64_t batch,
                                             int64_t seq)
{
    gt_error err = {0};
    gt_llama3_config cfg;
    memset(s, 0, sizeof *s);
    s->g = gt_graph_new();
    EXPECT_OK(gt_llama3_flavor(flavor, &cfg, &err), &err);
    if (err.code) return false;
    if (compute_dtype) cfg.compute_dtype = *compute_dtype;
    s->vocab = cfg.vocab_size;
    EXPECT_OK(gt_llama3_build(s->g, &cfg, &s->model, &err), &err);
    if (err.code) return false;
    EXPECT_OK(gt_autodiff(s->g, &err), &err);
    if (err.code) return false;
    int n = gt_optim_find_params(s->g, NULL, 0);
    gt_value_id *params = calloc((size_t)n, sizeof *params),
                *grads = calloc((size_t)n, sizeof *grads);
    gt_optim_find_params(s->g, params, n);
    int ng = 0;
    for (int k = 0; k < s->g->n_outputs && ng < n; k++)
        if (s->g->outputs[k].kind == GT_OUT_GRAD) grads[ng++] = s->g->outputs[k].value;
    EXPECT(ng == n, "%s: %d grads for %d params", flavor, ng, n);
    s->adamw = gt_adamw_config_default();
    s->adamw.max_norm = 1.0;
    s->adamw.weight_decay = 0.1;
    EXPECT_OK(gt_optim_append_adamw(s->g, n, params, grads, &s->adamw, &err), &err);
    free(params);
    free(grads);
    s->bind_entries[0] = (gt_sym_binding_entry){"batch", batch};
    s->bind_entries[1] = (gt_sym_binding_entry){"seq", seq};
    s->binding = (gt_sym_binding){s->bind_entries, 2};
    EXPECT_OK(gt_graph_verify(s->g, &err), &err);
    return err.code == GT_OK;
}

/* The body of step_graph_build; on failure s may hold a partial graph. */
static inline bool step_graph_build_parts(step_graph *s, const char *flavor, int64_t batch,
                                          int64_t seq)
{
    return step_graph_build_parts_in(s, flavor, NULL, batch, seq);
}

/* As step_graph_build, with the model computing in *compute_dtype (e.g. f32 or bf16; params stay
 * f32), or in the flavor's own compute dtype when compute_dtype is NULL. */
static inline bool step_graph_build_in(step_graph *s, const char *flavor,
                                       const gt_dtype *compute_dtype, int64_t batch, int64_t seq)
{
    if (step_graph_build_parts_in(s, flavor, compute_dtype, batch, seq)) return true;
    step_graph_free(s);
    return false;
}

/* As gt_train_build_graph with one micro-batch and no passes: model, autodiff, clipping + AdamW
 * (max_norm 1, weight decay 0.1); the graph must verify. False on failure (the checks say why),
 * with s freed; on success step_graph_free is due. */
static inline bool step_graph_build(step_graph *s, const char *flavor, int64_t batch, int64_t seq)
{
    return step_graph_build_in(s, flavor, NULL, batch, seq);
}

/* Initial state, one tensor per input of s->g: params from gt_model_init_params (seed 1234, graph
 * input order), moments and scalars zero, tokens and labels a fixed xorshift64 sequence below the
 * vocabulary size. Every input's shape is evaluated and checked. */
static inline bool step_init_state(const step_graph *s, gt_tensor *state)
{
    const gt_graph *g = s->g;
    gt_error err = {0};
    gt_tensor *params = calloc((size_t)s->model.n_params, sizeof *params);
    EXPECT_OK(gt_model_init_params(&s->model, 1234, params, &err), &err);
    int np = 0;
    uint64_t x = 88172645463325252ull;
    for (int32_t k = 0; k < g->n_inputs && err.code == GT_OK; k++) {
        const gt_io *io = &g->inputs[k];
        int64_t shape[GT_MAX_DIMS];
        EXPECT_OK(gt_graph_eval_shape(g, io->value, &s->binding, shape, &err), &err);
        const gt_type *ty = gt_value_type(g, io->value);
        if (io->kind == GT_IN_PARAM) {
            if (np < s->model.n_params) state[k] = params[np];
            np++;
            continue;
        }
        if (err.code != GT_OK) break;
        EXPECT_OK(gt_tensor_alloc(&state[k], ty->dtype, ty->ndim, shape, &err), &err);
        if (err.code == GT_OK && io->kind == GT_IN_INPUT && ty->dtype == GT_I64) {
            int64_t *d = state[k].data;
            for (int64_t i = 0; i < gt_tensor_numel(&state[k]); i++) {
                x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                d[i] = (int64_t)(x % (uint64_t)s->vocab);
            }
        }
    }
    for (int i = np; i < s->model.n_params; i++) /* not handed over: only after a failure */
        gt_tensor_free(&params[i]);
    free(params);
    return err.code == GT_OK && np == s->model.n_params;
}

/* Moves the PARAM_UPDATE / OPT_STATE_UPDATE outputs of g into the inputs of the same kind and
 * name (fqn), freeing what they replace; the moved output slots are left empty. */
static inline void step_feed_back(const gt_graph *g, gt_tensor *state, gt_tensor *outputs)
{
    for (int32_t k = 0; k < g->n_outputs; k++) {
        int want = g->outputs[k].kind == GT_OUT_PARAM_UPDATE       ? GT_IN_PARAM
                   : g->outputs[k].kind == GT_OUT_OPT_STATE_UPDATE ? GT_IN_OPT_STATE
                                                                   : -1;
        if (want < 0) continue;
        const char *name = gt_graph_str(g, g->outputs[k].fqn);
        int32_t found = -1;
        for (int32_t i = 0; i < g->n_inputs && found < 0; i++)
            if (g->inputs[i].kind == want && !strcmp(gt_graph_str(g, g->inputs[i].fqn), name))
                found = i;
        EXPECT(found >= 0, "no input for output %s", name);
        if (found < 0) continue;
        gt_tensor_free(&state[found]);
        state[found] = outputs[k];
        memset(&outputs[k], 0, sizeof outputs[k]);
    }
}

/* The optimizer scalars input of g (by name) for this step, from s's AdamW settings. */
static inline void step_set_scalars(const step_graph *s, const gt_graph *g, gt_tensor *state,
                                    int64_t step)
{
    for (int32_t k = 0; k < g->n_inputs; k++)
        if (!strcmp(gt_graph_str(g, g->inputs[k].fqn), GT_OPTIM_SCALARS_NAME))
            gt_optim_scalars(&s->adamw, step, STEP_HARNESS_LR, state[k].data);
}

/* Same dtype, shape and bytes. */
static inline bool same_bits(const gt_tensor *a, const gt_tensor *b)
{
    if (a->dtype != b->dtype || a->ndim != b->ndim) return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d]) return false;
    size_t n = gt_tensor_nbytes(a);
    return n == 0 || memcmp(a->data, b->data, n) == 0;
}

static inline void free_tensors(gt_tensor *t, int32_t n)
{
    for (int32_t k = 0; k < n; k++)
        gt_tensor_free(&t[k]);
}

/* How many of g's outputs differ bitwise between ref and got; the first three are named on
 * stderr as "  FLAVOR[ HOW] step N: output K (KIND fqn) differs" (how may be NULL). */
static inline int step_count_diffs(const char *flavor, const char *how, int64_t step,
                                   const gt_graph *g, const gt_tensor *ref, const gt_tensor *got)
{
    int bad = 0;
    for (int32_t k = 0; k < g->n_outputs; k++)
        if (!same_bits(&ref[k], &got[k]) && bad++ < 3)
            fprintf(stderr, "  %s%s%s step %lld: output %d (%s %s) differs\n", flavor,
                    how ? " " : "", how ? how : "", (long long)step, k,
                    gt_output_kind_name((gt_output_kind)g->outputs[k].kind),
                    gt_graph_str(g, g->outputs[k].fqn));
    return bad;
}

/* The loss in g's outputs (its LOSS output's first element); NaN when there is none. */
static inline float step_loss(const gt_graph *g, const gt_tensor *out)
{
    for (int32_t k = 0; k < g->n_outputs; k++)
        if (g->outputs[k].kind == GT_OUT_LOSS) return gt_tensor_get_f32(&out[k], 0);
    return NAN;
}

/* ---------------------------------------------------------------- one run */

/* The state of one run of a whole-step graph: its inputs and the outputs of the current step. */
typedef struct {
    int32_t n_inputs, n_outputs;
    gt_tensor *state; /* [n_inputs] */
    gt_tensor *out;   /* [n_outputs] */
} step_run;

/* Allocates the run for s->g and fills its initial state (step_init_state); step_run_free is due
 * either way. */
static inline bool step_run_init(step_run *r, const step_graph *s)
{
    r->n_inputs = s->g->n_inputs;
    r->n_outputs = s->g->n_outputs;
    r->state = calloc((size_t)r->n_inputs, sizeof(gt_tensor));
    r->out = calloc((size_t)r->n_outputs, sizeof(gt_tensor));
    return step_init_state(s, r->state);
}

/* After a step of graph g (s->g or a graph with the same inputs and outputs): feeds the updates
 * back and frees the rest of the outputs. */
static inline void step_run_next(step_run *r, const gt_graph *g)
{
    step_feed_back(g, r->state, r->out);
    free_tensors(r->out, r->n_outputs);
}

static inline void step_run_free(step_run *r)
{
    free_tensors(r->state, r->n_inputs);
    free(r->state);
    free(r->out);
}

#endif
