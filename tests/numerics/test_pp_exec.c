/* test_pp_exec.c — a training step run as each pipeline schedule runs it equals gradient
 * accumulation over the same micro-batches, bitwise (gt_pp_eager_step, src/runtime/pp_exec.c).
 *
 * llama3 debugmodel in f32, the step graph for 4 micro-batches of 1 x 32 tokens exactly as the
 * trainer builds it for --training.global_batch_size 4 --training.local_batch_size 1
 * (gt_train_build_global_graph: loss / 4, running gradient sums, clipping, AdamW). The reference
 * is the trainer's accumulation: gt_eager_run_part of the micro-batch part for micro-batches 0 to
 * 2, each feeding its running sums to the next, then the whole graph for micro-batch 3. Against
 * it, for every schedule on pp 2 (GPipe, 1F1B: 2 stages; Interleaved1F1B, ZBVZeroBubble,
 * DualPipeV: 4 stages), and for 1F1B and ZBVZeroBubble on pp 4 as well, over 3 steps feeding the
 * updated parameters and moments back: each micro-batch's loss, the grad norm and every updated
 * parameter and moment are memcmp-equal. A schedule whose W runs before the previous
 * micro-batch's W of its stage is refused naming the action. */
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

static bool build(setup *s)
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
static void init_inputs(setup *s, gt_tensor inputs[MICRO][256])
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
                for (int64_t i = 0; i < gt_tensor_numel(&inputs[m][k]); i++) {
                    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                    d[i] = (int64_t)(x % (uint64_t)s->vocab);
                }
            }
        }
    }
    free(params);
}

static int32_t input_named(const gt_graph *g, int kind, const char *name)
{
    for (int32_t i = 0; i < g->n_inputs; i++)
        if (g->inputs[i].kind == kind && !strcmp(gt_graph_str(g, g->inputs[i].fqn), name)) return i;
    return -1;
}

/* The updated params and moments back into every micro-batch's inputs; optimizer scalars of
 * `step` into them. */
static void next_step(const gt_graph *g, gt_tensor inputs[MICRO][256], gt_tensor *outputs,
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

static bool same(const gt_tensor *a, const gt_tensor *b)
{
    size_t n = gt_tensor_nbytes(a);
    return a->dtype == b->dtype && n == gt_tensor_nbytes(b) && (!n || !memcmp(a->data, b->data, n));
}

/* The trainer's accumulation: micro part for 0 .. MICRO-2 (sums fed forward), all for the last. */
static void reference_step(setup *s, gt_tensor inputs[MICRO][256], gt_tensor *losses,
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

static void free_outputs(gt_tensor *t, int32_t n)
{
    for (int32_t k = 0; k < n; k++)
        gt_tensor_free(&t[k]);
}

static void check_schedule(setup *s, gt_pp_schedule_kind kind, int32_t pp)
{
    const gt_graph *g = s->g;
    gt_error err = {0};
    int32_t spr = gt_pp_default_stages_per_rank(kind), S = pp * spr;
    int64_t fl[16];
    gt_pp_split split;
    gt_pp_schedule sched;
    EXPECT_OK(gt_pp_split_layers(6, S, 1, 1, fl, &err), &err);
    EXPECT_OK(gt_pp_split_graph(g, S, fl, &split, &err), &err);
    EXPECT_OK(gt_pp_schedule_build(kind, pp, spr, MICRO, &sched, &err), &err);
    if (err.code != GT_OK) return;
    static gt_tensor ref_in[MICRO][256], pp_in[MICRO][256];
    init_inputs(s, ref_in);
    init_inputs(s, pp_in);
    int diffs = 0;
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
        EXPECT_OK(gt_pp_eager_step(g, &s->binding, &split, &sched, in_ptrs, pl, po, &err), &err);
        if (err.code != GT_OK) break;
        for (int m = 0; m < MICRO; m++) {
            EXPECT(same(&rl[m], &pl[m]), "%s pp %d step %lld micro %d: loss %.9g vs %.9g",
                   gt_pp_schedule_name(kind), pp, (long long)step, m, gt_tensor_get_f32(&rl[m], 0),
                   gt_tensor_get_f32(&pl[m], 0));
        }
        for (int32_t k = 0; k < g->n_outputs; k++)
            if (!same(&ro[k], &po[k]) && diffs++ < 3)
                fprintf(stderr, "  %s pp %d step %lld: output %d (%s) differs\n",
                        gt_pp_schedule_name(kind), pp, (long long)step, k,
                        gt_graph_str(g, g->outputs[k].fqn));
        if (step == STEPS)
            printf("%-16s pp %d (%d stages): step %d loss %.7f (micro 0 %.7f), bitwise %s\n",
                   gt_pp_schedule_name(kind), pp, S, STEPS,
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
    EXPECT(diffs == 0, "%s pp %d: %d outputs differ", gt_pp_schedule_name(kind), pp, diffs);

    /* a W moved before the previous micro-batch's W of its stage */
    if (kind == GT_PP_ZBV_ZERO_BUBBLE && pp == 2) {
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

int main(void)
{
    setup s;
    if (build(&s) && s.g->n_inputs <= 256) {
        for (int k = 0; k < GT_PP_N_SCHEDULES; k++)
            check_schedule(&s, (gt_pp_schedule_kind)k, 2);
        check_schedule(&s, GT_PP_1F1B, 4);
        check_schedule(&s, GT_PP_ZBV_ZERO_BUBBLE, 4);
    }
    gt_graph_free(s.g);
    gt_model_free(&s.model);
    gt_config_free(&s.cfg);
    return gt_test_finish();
}
