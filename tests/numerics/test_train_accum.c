/* test_train_accum.c — gradient accumulation equals the large batch it splits.
 *
 * Two runs of 5 steps on the same 8 sequences per step:
 *   accum:  local_batch_size 4, global_batch_size 8 — two micro-batches, each loss scaled by 1/2
 *           before autodiff, gradients summed, then one AdamW update;
 *   big:    local_batch_size 8, global_batch_size 8 — one batch.
 * Mean cross-entropy over 8·S tokens = (mean over the first 4·S + mean over the last 4·S) / 2, and
 * the gradient is linear in the loss, so both runs take the same steps up to float summation
 * order: per-step loss and grad_norm, and every final parameter (max |a − b| over a tensor
 * relative to max |a|), agree within 1e-5. The learning rate is a function of the step alone:
 * equal bit for bit.
 *
 * The accumulation run again with compile.enable = false (the eager executor, running the graph's
 * micro-batch part and then the whole graph node by node) gives the compiled run's bits: every
 * loss and grad_norm and the final parameters' hash.
 *
 * Resume: the accumulation run saving at step 2 too ends with the same parameters, and its step-2
 * checkpoint moved alone into a fresh folder resumes to them (the running sums are zeroed each
 * step, so they are not state a checkpoint needs).
 *
 * The compiled step's plan: each running sum (BUFFER_UPDATE grad_accum.<fqn>) is updated in place
 * over its input, so the persistent arena holds one copy of the sums; the micro-batch part has
 * every gradient's sum and no adamw.
 *
 * Also: a global batch that is not a multiple of the local batch (6 vs 4) is refused with a message
 * naming training.global_batch_size. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* nftw */
#endif
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graphtrain/gt_backend.h"
#include "graphtrain/gt_checkpoint.h"
#include "graphtrain/gt_config.h"
#include "graphtrain/gt_llama3.h"
#include "graphtrain/gt_metrics.h"
#include "graphtrain/gt_program.h"
#include "graphtrain/gt_safetensors.h"
#include "graphtrain/gt_train.h"
#include "gt_test.h"
#include "train_child.h"

#define STEPS 5
#define TOLERANCE 1e-5

static gt_status make_config(gt_config *cfg, const char *dump, const char *local,
                             const char *global, gt_error *err)
{
    static const char *const options[][2] = {
        {"model.flavor", "test_tiny"},
        {"training.dataset", "synthetic"},
        {"training.seq_len", "32"},
        {"training.steps", "5"},
        {"training.mixed_precision_param", "float32"},
        {"metrics.log_freq", "1"},
        {"metrics.save_jsonl", "true"},
        {"checkpoint.enable", "true"},
        {"checkpoint.interval", "5"},
    };
    gt_config_defaults(cfg);
    gt_status st = GT_OK;
    for (size_t k = 0; k < sizeof options / sizeof options[0] && st == GT_OK; k++)
        st = gt_config_set(cfg, options[k][0], options[k][1], err);
    if (st == GT_OK) st = gt_config_set(cfg, "training.local_batch_size", local, err);
    if (st == GT_OK) st = gt_config_set(cfg, "training.global_batch_size", global, err);
    if (st == GT_OK) st = gt_config_set(cfg, "job.dump_folder", dump, err);
    if (st == GT_OK) st = gt_config_validate(cfg, err);
    return st;
}

/* The one record of each step 1..STEPS. */
static bool read_steps(const char *dump, gt_metrics_step out[STEPS + 1])
{
    gt_metrics_log log = {0};
    if (!read_metrics(dump, &log)) return false;
    bool ok = log.n_steps == STEPS;
    for (int64_t k = 0; ok && k < log.n_steps; k++) {
        ok = log.steps[k].step == k + 1;
        out[k + 1] = log.steps[k];
    }
    gt_metrics_log_free(&log);
    return ok;
}

static double relative(double a, double b)
{
    return fabs(a - b) / fmax(fabs(a), fabs(b));
}

/* Compares every parameter (not the optimizer moments) of the two final checkpoints; returns the
 * largest tensor-relative difference max|a − b| / max|a|. */
static double compare_params(const char *dump_a, const char *dump_b, int *n_compared)
{
    char pa[512], pb[512];
    snprintf(pa, sizeof pa, "%s/checkpoint/step-%d/" GT_CHECKPOINT_TENSOR_FILE, dump_a, STEPS);
    snprintf(pb, sizeof pb, "%s/checkpoint/step-%d/" GT_CHECKPOINT_TENSOR_FILE, dump_b, STEPS);
    gt_safetensors sa = {0}, sb = {0};
    gt_error err = {0};
    EXPECT_OK(gt_safetensors_open(pa, &sa, &err), &err);
    EXPECT_OK(gt_safetensors_open(pb, &sb, &err), &err);
    double worst = 0;
    *n_compared = 0;
    for (int k = 0; k < sa.n_entries; k++) {
        const char *name = sa.entries[k].name;
        if (!strncmp(name, "optim.", 6)) continue;
        gt_tensor ta = {0}, tb = {0};
        EXPECT_OK(gt_safetensors_get(&sa, name, &ta, &err), &err);
        EXPECT_OK(gt_safetensors_get(&sb, name, &tb, &err), &err);
        int64_t n = gt_tensor_numel(&ta);
        EXPECT(n > 0 && n == gt_tensor_numel(&tb), "%s: %lld vs %lld elements", name, (long long)n,
               (long long)gt_tensor_numel(&tb));
        double max_a = 0, max_diff = 0;
        for (int64_t i = 0; n == gt_tensor_numel(&tb) && i < n; i++) {
            double a = gt_tensor_get_f32(&ta, i), b = gt_tensor_get_f32(&tb, i);
            max_a = fmax(max_a, fabs(a));
            max_diff = fmax(max_diff, fabs(a - b));
        }
        double rel = max_a > 0 ? max_diff / max_a : max_diff;
        EXPECT(rel <= TOLERANCE, "%s: max |accum - big| = %.3g, max |param| = %.3g (rel %.3g)",
               name, max_diff, max_a, rel);
        worst = fmax(worst, rel);
        (*n_compared)++;
        gt_tensor_free(&ta);
        gt_tensor_free(&tb);
    }
    gt_safetensors_close(&sa);
    gt_safetensors_close(&sb);
    return worst;
}

/* The plan of the compiled step with 2 micro-batches (test_tiny, batch 4 x 32). */
static void check_plan(void)
{
    gt_config cfg;
    gt_error err = {0};
    EXPECT_OK(make_config(&cfg, "/tmp/unused", "4", "8", &err), &err);
    gt_graph *g = gt_graph_new();
    gt_model model = {0};
    EXPECT_OK(gt_train_build_graph(&cfg, g, &model, 2, &err), &err);
    gt_sym_binding_entry e[] = {{"batch", 4}, {"seq", 32}};
    gt_sym_binding b = {e, 2};
    gt_program *p = NULL;
    EXPECT_OK(gt_program_build(g, &b, &p, &err), &err);
    int n_sums = 0, in_place = 0, micro_adamw = 0, adamw = 0, micro_sums = 0;
    for (int32_t k = 0; p && k < g->n_outputs; k++) {
        if (g->outputs[k].kind != GT_OUT_BUFFER_UPDATE) continue;
        n_sums++;
        int32_t in = gt_program_state_input(g, k);
        in_place += in >= 0 && p->outputs[k].offset == p->inputs[in].offset &&
                    p->outputs[k].arena == GT_ARENA_PERSISTENT;
    }
    uint8_t *part = gt_xcalloc((size_t)g->n_nodes + 1, 1);
    gt_graph_micro_part(g, part);
    for (gt_node_id n = 0; n < g->n_nodes; n++) {
        adamw += g->nodes[n].op == GT_OP_ADAMW;
        micro_adamw += part[n] && g->nodes[n].op == GT_OP_ADAMW;
    }
    for (int32_t k = 0; k < g->n_outputs; k++) {
        gt_node_id from = g->values[g->outputs[k].value].producer;
        micro_sums += g->outputs[k].kind == GT_OUT_BUFFER_UPDATE && from >= 0 && part[from];
    }
    printf("plan: %d running sums, %d in place; micro-batch part: %d sums, %d of %d adamw\n",
           n_sums, in_place, micro_sums, micro_adamw, adamw);
    EXPECT(n_sums == model.n_params && in_place == n_sums,
           "%d of %d running sums updated in place (%d params)", in_place, n_sums, model.n_params);
    EXPECT(micro_sums == n_sums && adamw == model.n_params && micro_adamw == 0,
           "micro-batch part: %d of %d sums, %d of %d adamw", micro_sums, n_sums, micro_adamw,
           adamw);
    free(part);
    gt_program_free(p);
    gt_graph_free(g);
    gt_model_free(&model);
    gt_config_free(&cfg);
}

int main(void)
{
    gt_cpu_set_threads(1);
    char root[] = "/tmp/gt_train_accum_XXXXXX";
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 1;
    }
    check_plan();
    char dir_accum[128], dir_big[128], dir_bad[128], dir_eager[128];
    snprintf(dir_accum, sizeof dir_accum, "%s/accum", root);
    snprintf(dir_eager, sizeof dir_eager, "%s/eager", root);
    snprintf(dir_big, sizeof dir_big, "%s/big", root);
    snprintf(dir_bad, sizeof dir_bad, "%s/bad", root);

    gt_config cfg;
    gt_error err = {0};
    gt_train_result r_accum = {0}, r_big = {0};
    EXPECT_OK(make_config(&cfg, dir_accum, "4", "8", &err), &err);
    EXPECT_OK(gt_train(&cfg, &r_accum, &err), &err);
    gt_config_free(&cfg);
    EXPECT_OK(make_config(&cfg, dir_big, "8", "8", &err), &err);
    EXPECT_OK(gt_train(&cfg, &r_big, &err), &err);
    gt_config_free(&cfg);
    EXPECT(r_accum.last_step == STEPS && r_big.last_step == STEPS, "runs ended at %lld and %lld",
           (long long)r_accum.last_step, (long long)r_big.last_step);

    gt_metrics_step ma[STEPS + 1], mb[STEPS + 1];
    bool have_a = read_steps(dir_accum, ma), have_b = read_steps(dir_big, mb);
    EXPECT(have_a && have_b, "metrics of steps 1..%d missing", STEPS);
    double worst_loss = 0, worst_norm = 0;
    for (int s = 1; have_a && have_b && s <= STEPS; s++) {
        double rl = relative(ma[s].loss, mb[s].loss);
        double rn = relative(ma[s].grad_norm, mb[s].grad_norm);
        EXPECT(rl <= TOLERANCE, "step %d loss: accum %.9g, big %.9g", s, ma[s].loss, mb[s].loss);
        EXPECT(rn <= TOLERANCE, "step %d grad_norm: accum %.9g, big %.9g", s, ma[s].grad_norm,
               mb[s].grad_norm);
        EXPECT(ma[s].lr == mb[s].lr, "step %d lr: accum %.17g, big %.17g", s, ma[s].lr, mb[s].lr);
        EXPECT(ma[s].tokens == mb[s].tokens, "step %d tokens: accum %lld, big %lld", s,
               (long long)ma[s].tokens, (long long)mb[s].tokens);
        worst_loss = fmax(worst_loss, rl);
        worst_norm = fmax(worst_norm, rn);
    }
    int n_params = 0;
    double worst_param = compare_params(dir_accum, dir_big, &n_params);
    EXPECT(n_params > 0, "no parameters compared");
    printf("accum 4x2 vs batch 8 over %d steps: loss rel %.3g, grad_norm rel %.3g, params rel "
           "%.3g (%d tensors); final loss %.6f vs %.6f\n",
           STEPS, worst_loss, worst_norm, worst_param, n_params, r_accum.final_loss,
           r_big.final_loss);

    /* the eager executor: the compiled run's bits */
    gt_train_result r_eager = {0};
    EXPECT_OK(make_config(&cfg, dir_eager, "4", "8", &err), &err);
    EXPECT_OK(gt_config_set(&cfg, "compile.enable", "false", &err), &err);
    EXPECT_OK(gt_train(&cfg, &r_eager, &err), &err);
    gt_config_free(&cfg);
    gt_metrics_step me[STEPS + 1];
    int differ = 0;
    bool have_e = read_steps(dir_eager, me);
    EXPECT(have_e, "eager accumulation: metrics of steps 1..%d missing", STEPS);
    for (int s = 1; have_a && have_e && s <= STEPS; s++)
        differ += me[s].loss != ma[s].loss || me[s].grad_norm != ma[s].grad_norm;
    EXPECT(differ == 0 && r_eager.params_hash == r_accum.params_hash,
           "eager vs compiled accumulation: %d steps differ, params %016llx vs %016llx", differ,
           (unsigned long long)r_eager.params_hash, (unsigned long long)r_accum.params_hash);
    printf("eager vs compiled accumulation: %d steps differ, params xxh64 %016llx / %016llx\n",
           differ, (unsigned long long)r_eager.params_hash,
           (unsigned long long)r_accum.params_hash);

    /* resume: a save at step 2 changes nothing, and step-2 alone resumes to the same bits */
    char dir_two[128], dir_resumed[160], from[300], to[300];
    snprintf(dir_two, sizeof dir_two, "%s/two", root);
    snprintf(dir_resumed, sizeof dir_resumed, "%s/resumed", root);
    gt_train_result r_two = {0}, r_resumed = {0};
    EXPECT_OK(make_config(&cfg, dir_two, "4", "8", &err), &err);
    EXPECT_OK(gt_config_set(&cfg, "checkpoint.interval", "2", &err), &err);
    EXPECT_OK(gt_train(&cfg, &r_two, &err), &err);
    gt_config_free(&cfg);
    snprintf(from, sizeof from, "%s/checkpoint/step-2", dir_two);
    snprintf(to, sizeof to, "%s/checkpoint", dir_resumed);
    EXPECT(mkdir(dir_resumed, 0755) == 0 && mkdir(to, 0755) == 0, "mkdir %s", to);
    snprintf(to, sizeof to, "%s/checkpoint/step-2", dir_resumed);
    EXPECT(rename(from, to) == 0, "moving %s to %s", from, to);
    EXPECT_OK(make_config(&cfg, dir_resumed, "4", "8", &err), &err);
    EXPECT_OK(gt_train(&cfg, &r_resumed, &err), &err);
    gt_config_free(&cfg);
    EXPECT(r_two.params_hash == r_accum.params_hash && r_resumed.first_step == 3 &&
               r_resumed.params_hash == r_accum.params_hash,
           "accumulation resume: saving at 2 %016llx, resumed from 2 (first step %lld) %016llx, "
           "uninterrupted %016llx",
           (unsigned long long)r_two.params_hash, (long long)r_resumed.first_step,
           (unsigned long long)r_resumed.params_hash, (unsigned long long)r_accum.params_hash);
    printf("accumulation resumed at step 2: params xxh64 %016llx (uninterrupted %016llx)\n",
           (unsigned long long)r_resumed.params_hash, (unsigned long long)r_accum.params_hash);

    /* 6 is not a multiple of 4: refused, naming the option */
    gt_status st = make_config(&cfg, dir_bad, "4", "6", &err);
    if (st == GT_OK) st = gt_train(&cfg, NULL, &err);
    gt_config_free(&cfg);
    EXPECT(st != GT_OK, "global batch 6 with local batch 4 was accepted");
    EXPECT(strstr(err.msg, "training.global_batch_size") != NULL,
           "the message should name training.global_batch_size: %s", err.msg);
    printf("global 6 / local 4: %s\n", err.msg);

    remove_tree(root);
    return gt_test_finish();
}
