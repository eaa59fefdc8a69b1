/* pp_harness.h — the pipeline-parallel step tests' common part (tests/numerics/test_pp_exec.c,
 * test_pp_moe_exec.c, tests/distributed/test_pp_mpi.c): llama3's (or PP_MODEL's) debugmodel f32
 * step graph for MICRO micro-batches of gradient accumulation as the trainer builds it,
 * per-micro-batch inputs, feeding updates back, and the reference step: the trainer's accumulation
 * (gt_eager_run_part of the micro-batch part for all but the last micro-batch, running sums fed
 * forward, then the whole graph).
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
#define PP_MAX_INPUTS 512 /* the step graph's inputs, at most (DeepSeek-V3 debugmodel: ~300) */

typedef struct {
    gt_config cfg;
    gt_train_layout layout;
    gt_graph *g;
    gt_model model;
    gt_sym_binding_entry entries[GT_TRAIN_BINDING_MAX];
    gt_sym_binding binding;
    int64_t vocab;
} setup;

/* PP_MODEL: the model family (llama3 unless the test defines another, deepseek_v3) */
#ifndef PP_MODEL
#define PP_MODEL "llama3"
#endif

static inline bool build(setup *s)
{
    gt_error err = {0};
    memset(s, 0, sizeof *s);
    gt_config_defaults(&s->cfg);
    char *argv[] = {"--model.name",
                    PP_MODEL,
                    "--model.flavor",
                    "debugmodel",
                    "--training.local_batch_size",
                    "1",
                    "--training.seq_len",
                    "32",
                    "--training.mixed_precision_param",
                    "float32",
                    "--training.global_batch_size",
                    "4"};
    EXPECT_OK(gt_config_apply_overrides(&s->cfg, 12, argv, &err), &err);
    EXPECT_OK(gt_train_layout_init(&s->cfg, 0, 0, &s->layout, &err), &err);
    s->g = gt_graph_new();
    EXPECT_OK(gt_train_build_global_graph(&s->cfg, &s->layout, s->g, &s->model, MICRO, &err), &err);
    gt_train_binding(&s->cfg, &s->layout, s->entries, &s->binding);
    s->vocab = 2048;
    return err.code == GT_OK;
}

/* inputs[m]: parameters (seed 7) and zero state shared, tokens and labels of micro-batch m. */
static inline void init_inputs(setup *s, gt_tensor inputs[MICRO][PP_MAX_INPUTS])
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

/* The updated params, moments and model buffers back into every micro-batch's inputs; optimizer
 * scalars of `step` into them. */
static inline void next_step(const gt_graph *g, gt_tensor inputs[MICRO][PP_MAX_INPUTS],
                             gt_tensor *outputs, int64_t step)
{
    for (int32_t k = 0; outputs && k < g->n_outputs; k++) {
        int want = g->outputs[k].kind == GT_OUT_PARAM_UPDATE       ? GT_IN_PARAM
                   : g->outputs[k].kind == GT_OUT_OPT_STATE_UPDATE ? GT_IN_OPT_STATE
                   : g->outputs[k].kind == GT_OUT_BUFFER_UPDATE    ? GT_IN_BUFFER
                                                                   : -1;
        if (want < 0) continue;
        int32_t i = input_named(g, want, gt_graph_str(g, g->outputs[k].fqn));
        /* the buffers carried between steps (the expert biases, the MoE accumulation's counts
         * and micro-batch clock), as the trainer carries them; the gradient sums start at zero */
        if (i >= 0 && want == GT_IN_BUFFER && g->inputs[i].plan.as_param) continue;
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
static inline void reference_step(setup *s, gt_tensor inputs[MICRO][PP_MAX_INPUTS],
                                  gt_tensor *losses, gt_tensor *outputs)
{
    const gt_graph *g = s->g;
    gt_error err = {0};
    static gt_tensor sums[PP_MAX_INPUTS], run_in[PP_MAX_INPUTS];
    memset(sums, 0, sizeof sums);
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

/* A step's losses pl and outputs po against the reference's rl and ro: the number of tensors
 * missing or not memcmp-equal (the first 3 named on stderr, prefixed by `what`). */
static inline int pp_step_diffs(const char *what, const gt_graph *g, int64_t step,
                                const gt_tensor *rl, const gt_tensor *ro, const gt_tensor *pl,
                                const gt_tensor *po)
{
    int diffs = 0;
    for (int m = 0; m < MICRO; m++)
        if (!(pl[m].data && rl[m].data && same(&rl[m], &pl[m])) && diffs++ < 3)
            fprintf(stderr, "  %s step %lld micro %d: loss %.9g vs %.9g\n", what, (long long)step,
                    m, rl[m].data ? gt_tensor_get_f32(&rl[m], 0) : -1.0,
                    pl[m].data ? gt_tensor_get_f32(&pl[m], 0) : -1.0);
    for (int32_t k = 0; k < g->n_outputs; k++)
        if (!(po[k].data && ro[k].data && same(&ro[k], &po[k])) && diffs++ < 3)
            fprintf(stderr, "  %s step %lld: output %d (%s) differs\n", what, (long long)step, k,
                    gt_graph_str(g, g->outputs[k].fqn));
    return diffs;
}

/* The stage split of s's graph for `kind` on pp ranks (its default stages per rank) and the
 * schedule of MICRO micro-batches; *n_stages receives the stage count. */
static inline bool pp_split_schedule(setup *s, gt_pp_schedule_kind kind, int32_t pp,
                                     gt_pp_split *split, gt_pp_schedule *sched, int32_t *n_stages)
{
    gt_error err = {0};
    int32_t S = pp * gt_pp_default_stages_per_rank(kind);
    int64_t fl[16];
    *n_stages = S;
    EXPECT_OK(gt_pp_split_layers(6, S, 1, 1, fl, &err), &err);
    if (!err.code) EXPECT_OK(gt_pp_split_graph(s->g, S, fl, split, &err), &err);
    if (!err.code)
        EXPECT_OK(
            gt_pp_schedule_build(kind, pp, gt_pp_default_stages_per_rank(kind), MICRO, sched, &err),
            &err);
    return err.code == GT_OK;
}

/* ---------------------------------------------------------------- the unrolled step
 * (gt_pp_unroll: tests/numerics/test_pp_unroll.c, tests/distributed/test_pp_unroll_mpi.c,
 * tests/cuda/test_cuda_pp_unroll.c) */

/* per_micro of gt_pp_unroll: the micro-batch's own inputs (the i64 INPUTs: tokens, labels,
 * positions); returns how many. */
static inline int32_t pp_per_micro(const gt_graph *g, uint8_t *per_micro)
{
    int32_t n = 0;
    for (int32_t k = 0; k < g->n_inputs; k++) {
        per_micro[k] = g->inputs[k].kind == GT_IN_INPUT &&
                       gt_value_type(g, g->inputs[k].value)->dtype == GT_I64;
        n += per_micro[k];
    }
    return n;
}

/* The unrolled step's inputs: views of the micro-batches' (calloc'ed; the caller frees it). */
static inline gt_tensor *pp_unrolled_inputs(const gt_pp_unrolled *u,
                                            gt_tensor inputs[MICRO][PP_MAX_INPUTS])
{
    gt_tensor *in = calloc((size_t)u->g->n_inputs + 1, sizeof *in);
    for (int32_t j = 0; j < u->g->n_inputs; j++) {
        in[j] = inputs[u->input_mb[j] < 0 ? 0 : u->input_mb[j]][u->input_of[j]];
        in[j].owns_data = false;
    }
    return in;
}

/* The unrolled step's outputs out (taken over) as reference_step gives them: losses[m] per
 * micro-batch (the last one's copied from its LOSS output), outputs[k] the step graph's. */
static inline void pp_unrolled_outputs(const gt_graph *g, const gt_pp_unrolled *u, gt_tensor *out,
                                       gt_tensor *losses, gt_tensor *outputs)
{
    gt_error err = {0};
    for (int32_t j = 0; j < u->g->n_outputs; j++) {
        int32_t k = u->output_of[j], m = u->output_mb[j];
        if (m < MICRO - 1) {
            losses[m] = out[j];
            continue;
        }
        if (g->outputs[k].kind == GT_OUT_LOSS && out[j].data) {
            EXPECT_OK(gt_tensor_alloc(&losses[m], out[j].dtype, out[j].ndim, out[j].shape, &err),
                      &err);
            if (!err.code) memcpy(losses[m].data, out[j].data, gt_tensor_nbytes(&out[j]));
        }
        outputs[k] = out[j];
    }
}

/* ---------------------------------------------------------------- the schedules' check
 * (test_pp_exec.c says what it asserts) */
/* With programs: every stage's parts are built; those with nodes and no collective are
 * compiled (the one-rank graph has none), each allocating what its memory plan says. The passes
 * local to a part run on it, as the trainer runs them (the whole-step ones ran before the split,
 * on a graph of test_pp_exec's compile_step, or not at all). */
static inline gt_status compile_part(gt_graph *g, void *user, gt_error *err)
{
    setup *s = user;
    return gt_train_compile_graph_scope(&s->cfg, &s->layout, g, NULL, GT_PASS_SCOPE_PART, err);
}

static inline gt_pp_programs *programs_of(setup *s, const gt_pp_split *split,
                                          const gt_pp_schedule *sched, const char *name,
                                          bool passes)
{
    gt_error err = {0};
    gt_pp_programs *p = NULL;
    gt_pp_programs_opts o = {.compile = passes ? compile_part : NULL, .compile_user = s};
    EXPECT_OK(gt_pp_programs_build(s->g, &s->binding, split, sched, -1, &o, &p, &err), &err);
    int compiled = 0, parts = 0;
    for (int32_t st = 0; p && st < split->n_stages; st++)
        for (int k = GT_PP_PART_F; k <= GT_PP_PART_W; k++) {
            const gt_pp_part_info *in = gt_pp_programs_info(p, st, (gt_pp_part)k);
            parts += in->n_nodes > 0;
            compiled += in->compiled;
            EXPECT(!in->compiled || (in->planned_bytes == in->allocated_bytes &&
                                     in->live_peak_bytes <= in->planned_bytes && in->n_out > 0),
                   "%s: stage %d part %d planned %lld B, allocated %lld B", name, st, k,
                   (long long)in->planned_bytes, (long long)in->allocated_bytes);
            EXPECT(in->compiled || in->n_nodes == 0, "%s: stage %d part %d not compiled: %s", name,
                   st, k, in->why);
        }
    EXPECT(p && compiled == parts && compiled > 0, "%s: %d of %d parts compiled", name, compiled,
           parts);
    return p;
}

/* programs: 0 node by node, 1 the parts as programs, 2 the same after the pass pipeline */
static inline void pp_check_schedule(setup *s, gt_pp_schedule_kind kind, int32_t pp, int programs)
{
    const gt_graph *g = s->g;
    gt_error err = {0};
    int32_t S;
    gt_pp_split split;
    gt_pp_schedule sched;
    if (!pp_split_schedule(s, kind, pp, &split, &sched, &S)) return;
    gt_pp_programs *progs =
        programs ? programs_of(s, &split, &sched, gt_pp_schedule_name(kind), programs == 2) : NULL;
    static gt_tensor ref_in[MICRO][PP_MAX_INPUTS], pp_in[MICRO][PP_MAX_INPUTS];
    init_inputs(s, ref_in);
    init_inputs(s, pp_in);
    int diffs = 0;
    gt_pp_step_keep *keep = NULL;
    for (int64_t step = 1; step <= STEPS && err.code == GT_OK; step++) {
        gt_tensor rl[MICRO] = {{0}}, pl[MICRO] = {{0}};
        gt_tensor *ro = calloc((size_t)g->n_outputs, sizeof *ro);
        gt_tensor *po = calloc((size_t)g->n_outputs, sizeof *po);
        next_step(g, ref_in, NULL, step);
        next_step(g, pp_in, NULL, step);
        reference_step(s, ref_in, rl, ro);
        const gt_tensor *in_ptrs[MICRO];
        for (int m = 0; m < MICRO; m++)
            in_ptrs[m] = pp_in[m];
        gt_pp_step_stats run, plan;
        /* steps 2.. reuse step 1's plan and arena */
        EXPECT_OK(gt_pp_step_programs_kept(g, &s->binding, &split, &sched, NULL, NULL, progs,
                                           in_ptrs, pl, po, &run, &keep, &err),
                  &err);
        if (err.code != GT_OK) break;
        /* the plan on sizes alone is the step as run, and the step frees what it has read */
        EXPECT_OK(gt_pp_step_plan_programs(g, &s->binding, &split, &sched, -1, progs, &plan, &err),
                  &err);
        EXPECT(!memcmp(&run, &plan, sizeof run) && run.peak_bytes < run.allocated_bytes,
               "%s pp %d step %lld: held at most %lld B (planned %lld) of %lld B (planned %lld)",
               gt_pp_schedule_name(kind), pp, (long long)step, (long long)run.peak_bytes,
               (long long)plan.peak_bytes, (long long)run.allocated_bytes,
               (long long)plan.allocated_bytes);
        /* the values in one arena, allocated as planned (the memcmp above): at least the peak
         * held (the gaps between offsets), well under what the step computes */
        EXPECT(run.arena_bytes >= run.peak_bytes && run.arena_bytes < run.allocated_bytes,
               "%s pp %d step %lld: an arena of %lld B for a peak of %lld B of %lld B",
               gt_pp_schedule_name(kind), pp, (long long)step, (long long)run.arena_bytes,
               (long long)run.peak_bytes, (long long)run.allocated_bytes);
        if (step == 1)
            printf("%-16s pp %d: step values held at most %lld of %lld B, in an arena of %lld B, "
                   "as planned\n",
                   gt_pp_schedule_name(kind), pp, (long long)run.peak_bytes,
                   (long long)run.allocated_bytes, (long long)run.arena_bytes);
        char what[64];
        snprintf(what, sizeof what, "%s pp %d", gt_pp_schedule_name(kind), pp);
        diffs += pp_step_diffs(what, g, step, rl, ro, pl, po);
        if (step == STEPS)
            printf("%-16s pp %d (%d stages)%s: step %d loss %.7f (micro 0 %.7f), bitwise %s\n",
                   gt_pp_schedule_name(kind), pp, S,
                   programs == 2 ? ", programs after passes"
                   : progs       ? ", programs"
                                 : "",
                   STEPS,
                   gt_tensor_get_f32(&rl[0], 0) + gt_tensor_get_f32(&rl[1], 0) +
                       gt_tensor_get_f32(&rl[2], 0) + gt_tensor_get_f32(&rl[3], 0),
                   gt_tensor_get_f32(&rl[0], 0), diffs ? "NO" : "yes");
        next_step(g, ref_in, ro, step + 1);
        next_step(g, pp_in, po, step + 1);
        free_outputs(rl, MICRO);
        free_outputs(pl, MICRO);
        free_outputs(ro, g->n_outputs);
        free_outputs(po, g->n_outputs);
        free(ro);
        free(po);
    }
    EXPECT(diffs == 0, "%s pp %d%s: %d losses or outputs differ", gt_pp_schedule_name(kind), pp,
           progs ? " (programs)" : "", diffs);
    gt_pp_step_keep_free(keep);
    gt_pp_programs_free(progs);

    /* a W moved before the previous micro-batch's W of its stage */
    if (kind == GT_PP_ZBV_ZERO_BUBBLE && pp == 2 && !programs) {
        gt_pp_action *a = sched.actions[0];
        int w0 = -1, w1 = -1;
        for (int i = 0; i < sched.n_actions[0]; i++) {
            if (a[i].kind == GT_PP_W && a[i].stage == 0 && a[i].mb == 0) w0 = i;
            if (a[i].kind == GT_PP_W && a[i].stage == 0 && a[i].mb == 1) w1 = i;
        }
        EXPECT(w0 >= 0 && w1 > w0, "0W0 at %d, 0W1 at %d", w0, w1);
        if (w0 >= 0 && w1 > w0) {
            a[w0].mb = 1, a[w1].mb = 0;
            gt_tensor pl[MICRO] = {{0}};
            gt_tensor *po = calloc((size_t)g->n_outputs, sizeof *po);
            const gt_tensor *in_ptrs[MICRO];
            for (int m = 0; m < MICRO; m++)
                in_ptrs[m] = pp_in[m];
            gt_status st = gt_pp_eager_step(g, &s->binding, &split, &sched, in_ptrs, pl, po, &err);
            EXPECT(st == GT_ERR_INVALID && strstr(err.msg, "0W1 runs before 0W0") &&
                       strstr(err.msg, "rank 0 action"),
                   "%s", err.msg);
            free(po);
        }
    }
    for (int m = 0; m < MICRO; m++)
        for (int32_t k = 0; k < g->n_inputs; k++)
            gt_tensor_free(&ref_in[m][k]), gt_tensor_free(&pp_in[m][k]);
    gt_pp_schedule_free(&sched);
    gt_pp_split_free(&split);
}

#endif
