/* test_program_exact.c — the compiled program equals the eager executor bit for bit.
 *
 * For test_tiny, test_gqa and test_odd: the whole-step graph (forward, loss, backward, AdamW with
 * clipping) is run 5 steps by gt_eager_run and 5 steps by gt_program_run, each feeding its own
 * updated params and moments back; every output (loss, grad_norm, grads, params, moments) must be
 * memcmp-equal at every step. The program runs with the default plan (views and in-place adamw)
 * and, for test_tiny, with sharing disabled too. The arenas allocated equal the plan's figures.
 * Last, debugmodel at 8 x 2048 tokens is planned (not run) and its report printed, with the planned
 * step arena against the sum of all buffer sizes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graphtrain/gt_autodiff.h"
#include "graphtrain/gt_backend.h"
#include "graphtrain/gt_exec.h"
#include "graphtrain/gt_model.h"
#include "graphtrain/gt_optim.h"
#include "graphtrain/gt_program.h"
#include "gt_test.h"

#define STEPS 5

typedef struct {
    gt_graph *g;
    gt_model model;
    gt_adamw_config adamw;
    gt_sym_binding_entry bind_entries[2];
    gt_sym_binding binding;
} step_graph;

/* As gt_train_build_graph with one micro-batch: model, autodiff, AdamW. */
static bool build(step_graph *s, const char *flavor, int64_t batch, int64_t seq)
{
    gt_error err = {0};
    gt_llama3_config cfg;
    memset(s, 0, sizeof *s);
    s->g = gt_graph_new();
    EXPECT_OK(gt_llama3_flavor(flavor, &cfg, &err), &err);
    if (err.code) return false;
    EXPECT_OK(gt_llama3_build(s->g, &cfg, &s->model, &err), &err);
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

static void step_graph_free(step_graph *s)
{
    gt_graph_free(s->g);
    gt_model_free(&s->model);
}

/* Initial state, one tensor per graph input: params from gt_model_init_params (graph input
 * order), moments zero, tokens/labels a fixed pseudo-random sequence. */
static bool init_state(const step_graph *s, gt_tensor *state, int64_t vocab)
{
    const gt_graph *g = s->g;
    gt_error err = {0};
    gt_tensor *params = calloc((size_t)s->model.n_params, sizeof *params);
    EXPECT_OK(gt_model_init_params(&s->model, 1234, params, &err), &err);
    int np = 0;
    uint64_t x = 88172645463325252ull;
    for (int32_t k = 0; k < g->n_inputs; k++) {
        const gt_io *io = &g->inputs[k];
        int64_t shape[GT_MAX_DIMS];
        EXPECT_OK(gt_graph_eval_shape(g, io->value, &s->binding, shape, &err), &err);
        const gt_type *ty = gt_value_type(g, io->value);
        if (io->kind == GT_IN_PARAM) {
            state[k] = params[np++];
            continue;
        }
        EXPECT_OK(gt_tensor_alloc(&state[k], ty->dtype, ty->ndim, shape, &err), &err);
        if (io->kind == GT_IN_INPUT && ty->dtype == GT_I64) {
            int64_t *d = state[k].data;
            for (int64_t i = 0; i < gt_tensor_numel(&state[k]); i++) {
                x ^= x << 13, x ^= x >> 7, x ^= x << 17; /* xorshift64 */
                d[i] = (int64_t)(x % (uint64_t)vocab);
            }
        }
    }
    free(params);
    return err.code == GT_OK && np == s->model.n_params;
}

/* Feeds the PARAM_UPDATE / OPT_STATE_UPDATE outputs back into the matching inputs (by kind and
 * fqn); takes ownership of those outputs. */
static void feed_back(const gt_graph *g, gt_tensor *state, gt_tensor *outputs)
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

static void set_scalars(const step_graph *s, gt_tensor *state, int64_t step)
{
    const gt_graph *g = s->g;
    for (int32_t k = 0; k < g->n_inputs; k++)
        if (!strcmp(gt_graph_str(g, g->inputs[k].fqn), GT_OPTIM_SCALARS_NAME))
            gt_optim_scalars(&s->adamw, step, 3e-3, state[k].data);
}

static bool same_bits(const gt_tensor *a, const gt_tensor *b)
{
    if (a->dtype != b->dtype || a->ndim != b->ndim) return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d]) return false;
    size_t n = gt_tensor_nbytes(a);
    return n == 0 || memcmp(a->data, b->data, n) == 0;
}

static void free_tensors(gt_tensor *t, int32_t n)
{
    for (int32_t k = 0; k < n; k++)
        gt_tensor_free(&t[k]);
}

/* 5 steps eager vs 5 steps program (with the given plan options), compared every step. */
static void check_flavor(const char *flavor, const gt_plan_options *opts)
{
    step_graph s;
    if (!build(&s, flavor, 2, 16)) {
        step_graph_free(&s);
        return;
    }
    gt_llama3_config cfg;
    gt_error err = {0};
    gt_llama3_flavor(flavor, &cfg, &err);
    const gt_graph *g = s.g;
    int32_t ni = g->n_inputs, no = g->n_outputs;
    gt_tensor *st_e = calloc((size_t)ni, sizeof(gt_tensor)),
              *st_p = calloc((size_t)ni, sizeof(gt_tensor));
    gt_tensor *out_e = calloc((size_t)no, sizeof(gt_tensor)),
              *out_p = calloc((size_t)no, sizeof(gt_tensor));
    bool ok = init_state(&s, st_e, cfg.vocab_size) && init_state(&s, st_p, cfg.vocab_size);

    gt_program *prog = NULL;
    EXPECT_OK(gt_program_build_opts(g, &s.binding, opts, &prog, &err), &err);
    ok = ok && prog;
    if (ok)
        for (int a = 0; a < GT_ARENA_COUNT; a++)
            EXPECT(gt_program_allocated_bytes(prog, a) == gt_program_planned_bytes(prog, a) &&
                       gt_program_planned_bytes(prog, a) == prog->plan->arena_bytes[a],
                   "%s arena %d: allocated %zu, planned %zu", flavor, a,
                   gt_program_allocated_bytes(prog, a), gt_program_planned_bytes(prog, a));
    for (int64_t step = 1; ok && step <= STEPS; step++) {
        set_scalars(&s, st_e, step);
        set_scalars(&s, st_p, step);
        EXPECT_OK(gt_eager_run(g, &s.binding, st_e, out_e, &err), &err);
        EXPECT_OK(gt_program_run(prog, st_p, out_p, &err), &err);
        if (err.code) break;
        int bad = 0;
        for (int32_t k = 0; k < no; k++)
            if (!same_bits(&out_e[k], &out_p[k])) {
                if (bad++ < 3)
                    fprintf(stderr, "  %s step %lld: output %d (%s %s) differs\n", flavor,
                            (long long)step, k,
                            gt_output_kind_name((gt_output_kind)g->outputs[k].kind),
                            gt_graph_str(g, g->outputs[k].fqn));
            }
        EXPECT(bad == 0, "%s step %lld (views %d, in place %d): %d of %d outputs differ", flavor,
               (long long)step, !opts || !opts->no_views, !opts || !opts->no_in_place, bad, no);
        if (step == 1 || step == STEPS)
            for (int32_t k = 0; k < no; k++)
                if (g->outputs[k].kind == GT_OUT_LOSS)
                    printf("%s step %lld loss %.9g (eager and program)\n", flavor, (long long)step,
                           gt_tensor_get_f32(&out_p[k], 0));
        feed_back(g, st_e, out_e);
        feed_back(g, st_p, out_p);
        free_tensors(out_e, no);
        free_tensors(out_p, no);
    }
    if (prog && (!opts || (!opts->no_in_place && !opts->no_views))) {
        EXPECT(prog->plan->n_in_place == 3 * s.model.n_params,
               "%s: %d outputs in place, expected 3 per param (%d params)", flavor,
               prog->plan->n_in_place, s.model.n_params);
        EXPECT(prog->plan->arena_bytes[GT_ARENA_PERSISTENT] ==
                   prog->plan->total_value_bytes[GT_ARENA_PERSISTENT],
               "%s: persistent arena %zu bytes, its buffers %zu", flavor,
               prog->plan->arena_bytes[GT_ARENA_PERSISTENT],
               prog->plan->total_value_bytes[GT_ARENA_PERSISTENT]);
    }
    gt_program_free(prog);
    free_tensors(st_e, ni);
    free_tensors(st_p, ni);
    free(st_e);
    free(st_p);
    free(out_e);
    free(out_p);
    step_graph_free(&s);
}

/* Planning only: debugmodel at 8 x 2048 tokens. */
static void report_debugmodel(void)
{
    step_graph s;
    gt_error err = {0};
    if (!build(&s, "debugmodel", 8, 2048)) {
        step_graph_free(&s);
        return;
    }
    gt_node_id *order = NULL;
    int32_t n = 0;
    gt_plan *plan = NULL;
    EXPECT_OK(gt_schedule_build(s.g, &order, &n, &err), &err);
    EXPECT_OK(gt_plan_memory(s.g, &s.binding, order, n, NULL, &plan, &err), &err);
    if (plan) {
        gt_plan_print(plan, stdout);
        size_t sum = 0;
        for (gt_value_id v = 0; v < plan->n_values; v++)
            if (plan->values[v].first != -2) sum += plan->values[v].nbytes;
        printf("debugmodel 8x2048: step arena %zu bytes = %.3f of the sum of all value sizes "
               "(%zu bytes); activations live at the peak %zu bytes\n",
               plan->arena_bytes[GT_ARENA_STEP], (double)plan->arena_bytes[GT_ARENA_STEP] / sum,
               sum, plan->peak_by_category[GT_MEM_ACTIVATION]);
        EXPECT(plan->arena_bytes[GT_ARENA_STEP] >= plan->live_peak_bytes &&
                   plan->arena_bytes[GT_ARENA_STEP] < sum,
               "step arena %zu, live peak %zu, sum %zu", plan->arena_bytes[GT_ARENA_STEP],
               plan->live_peak_bytes, sum);
    }
    gt_plan_free(plan);
    free(order);
    step_graph_free(&s);
}

int main(void)
{
    gt_cpu_set_threads(1);
    const gt_plan_options no_sharing = {.no_views = true, .no_in_place = true};
    check_flavor("test_tiny", NULL);
    check_flavor("test_tiny", &no_sharing);
    check_flavor("test_gqa", NULL);
    check_flavor("test_odd", NULL);
    report_debugmodel();
    return gt_test_finish();
}
