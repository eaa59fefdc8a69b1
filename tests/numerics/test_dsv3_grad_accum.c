/* test_dsv3_grad_accum.c — DeepSeek-V3's expert-bias update under gradient accumulation: the
 * routed-token counts are summed over a step's micro-batches, and the bias moves once per step,
 * from the sum.
 *
 * test_dsv3_tiny (one dense layer, one MoE layer of 8 experts, top-2) in f32 on the synthetic
 * dataset, 3 steps of 8 sequences of 32 tokens, a checkpoint every step:
 *   accum:  local_batch_size 4, global_batch_size 8 — two micro-batches per step;
 *   full:   accum with compile.memory_policy = full (the policy that recomputes the most: every
 *           forward activation the backward reads is recomputed there, the router included);
 *   eager:  accum with compile.enable = false (the micro-batch part and the whole graph run node
 *           by node);
 *   big:    local_batch_size 8, global_batch_size 8 — the same tokens as one batch.
 * Checked:
 *   - accum, steps 1..3: the checkpoint's BUFFER moe_counts.layers.1.moe.expert_bias_E (the
 *     step's summed counts) are whole numbers summing to 2 micro-batches x 4 x 32 tokens x top-2 =
 *     512 (one micro-batch's would be 256, a count taken twice 1024); the micro-batch index is
 *     back at 0; and the saved bias b_s equals, bit for bit, the host's recomputation
 *     b_{s-1} + (d - mean(d)), d = f32(1e-3)·sign(mean(c) - c), from those counts c (the means as
 *     the CPU kernel takes them: a double sum divided by E, rounded to f32) — one update per step
 *     (two would move the bias twice, an update per micro-batch would read half the counts);
 *   - full and eager repeat accum bit for bit: every loss and grad_norm, the counts and the bias
 *     of every step, the final hash (a recomputed router neither counts a token twice nor routes
 *     differently);
 *   - big: every step's loss within 1e-5 (relative) of accum's; its step-1 bias equals accum's
 *     and the host's update from accum's step-1 summed counts, bit for bit (the 8 sequences
 *     route the same way whether split or not, and the sum of the halves' counts is the batch's);
 *   - resume: accum's step-1 checkpoint alone in a fresh folder trains steps 2..3 to accum's
 *     final hash (the counts, the micro-batch index and the bias are checkpointed state).
 * Also: with 2 micro-batches the step graph's micro-batch part holds the count sums, and the
 * bias update reads them only through the sums. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* nftw */
#endif
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "graphtrain/gt_backend.h"
#include "graphtrain/gt_checkpoint.h"
#include "graphtrain/gt_config.h"
#include "graphtrain/gt_metrics.h"
#include "graphtrain/gt_optim.h"
#include "graphtrain/gt_safetensors.h"
#include "graphtrain/gt_train.h"
#include "gt_test.h"
#include "train_child.h"

#define STEPS 3
#define N_EXPERTS 8
#define BIAS_NAME "layers.1.moe.expert_bias_E"
#define COUNTS_NAME GT_OPTIM_MOE_COUNTS_PREFIX BIAS_NAME
#define COEFF 1e-3
#define TOKENS_PER_STEP (8 * 32 * 2) /* sequences x seq_len x top_k */

static gt_status make_config(gt_config *cfg, const char *dump, const char *local,
                             const char *global, gt_error *err)
{
    static const char *const options[] = {
        "model.name=deepseek_v3",     "model.flavor=test_dsv3_tiny",
        "training.dataset=synthetic", "training.seq_len=32",
        "training.steps=3",           "training.mixed_precision_param=float32",
        "optimizer.lr=1e-2",          "metrics.log_freq=1",
        "metrics.save_jsonl=true",    "checkpoint.enable=true",
        "checkpoint.interval=1",      "checkpoint.keep_latest_k=0",
    };
    gt_status st =
        train_child_config(cfg, options, (int)(sizeof options / sizeof options[0]), dump, err);
    if (st == GT_OK) st = gt_config_set(cfg, "training.local_batch_size", local, err);
    if (st == GT_OK) st = gt_config_set(cfg, "training.global_batch_size", global, err);
    if (st == GT_OK) st = gt_config_validate(cfg, err);
    return st;
}

static bool same_double(double a, double b)
{
    return memcmp(&a, &b, sizeof a) == 0;
}

/* f32 tensor `name` of checkpoint `step` into out[n] (false, with a failed expectation, if it is
 * missing or not f32[n]). */
static bool read_f32(const char *dump, int step, const char *name, float *out, int n)
{
    char path[512];
    snprintf(path, sizeof path, "%s/checkpoint/step-%d/" GT_CHECKPOINT_TENSOR_FILE, dump, step);
    gt_safetensors st = {0};
    gt_tensor x = {0};
    gt_error err = {0};
    bool ok = gt_safetensors_open(path, &st, &err) == GT_OK &&
              gt_safetensors_get(&st, name, &x, &err) == GT_OK;
    EXPECT(ok, "%s: %s", path, err.msg);
    ok = ok && x.dtype == GT_F32 && gt_tensor_numel(&x) == n;
    EXPECT(ok || err.msg[0], "%s: %s is not f32[%d]", path, name, n);
    if (ok) memcpy(out, x.data, (size_t)n * sizeof *out);
    gt_tensor_free(&x);
    gt_safetensors_close(&st);
    return ok;
}

/* b + (d - mean(d)), d = f32(coeff)·sign(mean(c) - c), as the step graph computes it on the CPU. */
static void host_update(const float *b, const float *c, float *out)
{
    double sum = 0;
    for (int e = 0; e < N_EXPERTS; e++)
        sum += c[e];
    float mean_c = (float)(sum / N_EXPERTS), d[N_EXPERTS];
    sum = 0;
    for (int e = 0; e < N_EXPERTS; e++) {
        float x = mean_c - c[e];
        d[e] = (float)COEFF * (float)((x > 0) - (x < 0));
        sum += d[e];
    }
    float mean_d = (float)(sum / N_EXPERTS);
    for (int e = 0; e < N_EXPERTS; e++)
        out[e] = b[e] + (d[e] - mean_d);
}

/* The accumulation run's steps: counts[s], bias[s] (bias[0] = 0). */
static void check_counts_and_updates(const char *dump, float counts[STEPS + 1][N_EXPERTS],
                                     float bias[STEPS + 1][N_EXPERTS])
{
    memset(bias[0], 0, sizeof bias[0]);
    for (int s = 1; s <= STEPS; s++) {
        float micro = -1;
        bool ok = read_f32(dump, s, COUNTS_NAME, counts[s], N_EXPERTS) &&
                  read_f32(dump, s, BIAS_NAME, bias[s], N_EXPERTS) &&
                  read_f32(dump, s, GT_OPTIM_MOE_MICRO_NAME, &micro, 1);
        if (!ok) return;
        double total = 0;
        bool whole = true;
        for (int e = 0; e < N_EXPERTS; e++)
            total += counts[s][e], whole &= counts[s][e] == floorf(counts[s][e]);
        EXPECT(whole && total == TOKENS_PER_STEP,
               "step %d: the summed counts total %.0f (want %d, whole numbers)", s, total,
               TOKENS_PER_STEP);
        EXPECT(micro == 0.0f, "step %d: %s = %g after the step (want 0)", s,
               GT_OPTIM_MOE_MICRO_NAME, micro);
        float want[N_EXPERTS];
        host_update(bias[s - 1], counts[s], want);
        int differ = 0;
        for (int e = 0; e < N_EXPERTS; e++)
            differ += memcmp(&want[e], &bias[s][e], sizeof want[e]) != 0;
        EXPECT(differ == 0, "step %d: %d of %d bias entries differ from the host's update", s,
               differ, N_EXPERTS);
        printf("step %d: summed counts [", s);
        for (int e = 0; e < N_EXPERTS; e++)
            printf("%s%.0f", e ? " " : "", counts[s][e]);
        printf("] (total %.0f), bias %s the host's update\n", total,
               differ ? "differs from" : "equals");
    }
}

/* Every loss and grad_norm of runs a and b equal (bitwise) or within tol (relative). */
static int compare_steps(const char *a, const char *b, double tol, const char *what)
{
    gt_metrics_step ma[STEPS + 1], mb[STEPS + 1];
    bool ok = last_records(a, STEPS, ma, NULL) && last_records(b, STEPS, mb, NULL);
    EXPECT(ok, "%s: metrics of steps 1..%d missing", what, STEPS);
    int differ = 0;
    for (int s = 1; ok && s <= STEPS; s++) {
        if (tol == 0)
            differ += !same_double(ma[s].loss, mb[s].loss) ||
                      !same_double(ma[s].grad_norm, mb[s].grad_norm);
        else
            differ += !(fabs(ma[s].loss - mb[s].loss) <= tol * fabs(ma[s].loss));
        if (tol > 0) printf("%s step %d: loss %.9f vs %.9f\n", what, s, ma[s].loss, mb[s].loss);
    }
    return ok ? differ : -1;
}

/* Counts and bias of every step of run b equal run a's, bit for bit. */
static int compare_state(const char *a, const char *b)
{
    int differ = 0;
    for (int s = 1; s <= STEPS; s++) {
        float ca[N_EXPERTS], cb[N_EXPERTS], ba[N_EXPERTS], bb[N_EXPERTS];
        if (!read_f32(a, s, COUNTS_NAME, ca, N_EXPERTS) ||
            !read_f32(b, s, COUNTS_NAME, cb, N_EXPERTS) ||
            !read_f32(a, s, BIAS_NAME, ba, N_EXPERTS) || !read_f32(b, s, BIAS_NAME, bb, N_EXPERTS))
            return -1;
        differ += memcmp(ca, cb, sizeof ca) != 0 || memcmp(ba, bb, sizeof ba) != 0;
    }
    return differ;
}

/* The step graph with 2 micro-batches: its micro-batch part computes the count sums (one per
 * MoE layer) and the bias update reads the counts through them only. */
static void check_graph(void)
{
    gt_config cfg;
    gt_error err = {0};
    EXPECT_OK(make_config(&cfg, "/tmp/unused", "4", "8", &err), &err);
    gt_graph *g = gt_graph_new();
    gt_model model = {0};
    EXPECT_OK(gt_train_build_graph(&cfg, g, &model, 2, &err), &err);
    uint8_t *part = gt_xcalloc((size_t)g->n_nodes + 1, 1);
    gt_graph_micro_part(g, part);
    int sums = 0, micro_sums = 0, counts = 0;
    for (int32_t k = 0; k < g->n_outputs; k++) {
        const gt_io *o = &g->outputs[k];
        if (o->kind != GT_OUT_BUFFER_UPDATE ||
            strncmp(gt_graph_str(g, o->fqn), GT_OPTIM_MOE_COUNTS_PREFIX "layers.", 17))
            continue;
        gt_node_id from = g->values[o->value].producer;
        sums++;
        micro_sums += from >= 0 && part[from];
    }
    for (gt_node_id n = 0; n < g->n_nodes; n++)
        counts += g->nodes[n].op == GT_OP_MOE_COUNT;
    printf("graph: %d count sums (%d in the micro-batch part), %d moe_count nodes, %d MoE "
           "layers\n",
           sums, micro_sums, counts, model.n_moe);
    EXPECT(sums == model.n_moe && micro_sums == sums && model.n_moe == 1,
           "%d count sums, %d in the micro-batch part, %d MoE layers", sums, micro_sums,
           model.n_moe);
    free(part);
    gt_graph_free(g);
    gt_model_free(&model);
    gt_config_free(&cfg);
}

static void run(const char *dump, const char *local, const char *global, const char *key,
                const char *value, gt_train_result *r)
{
    gt_config cfg;
    gt_error err = {0};
    EXPECT_OK(make_config(&cfg, dump, local, global, &err), &err);
    if (key) EXPECT_OK(gt_config_set(&cfg, key, value, &err), &err);
    EXPECT_OK(gt_train(&cfg, r, &err), &err);
    gt_config_free(&cfg);
}

int main(void)
{
    gt_cpu_set_threads(1);
    char root[] = "/tmp/gt_dsv3_accum_XXXXXX";
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 1;
    }
    check_graph();
    char accum[128], full[128], eager[128], big[128];
    snprintf(accum, sizeof accum, "%s/accum", root);
    snprintf(full, sizeof full, "%s/full", root);
    snprintf(eager, sizeof eager, "%s/eager", root);
    snprintf(big, sizeof big, "%s/big", root);
    gt_train_result ra = {0}, rf = {0}, re = {0}, rb = {0};
    run(accum, "4", "8", NULL, NULL, &ra);
    run(full, "4", "8", "compile.memory_policy", "full", &rf);
    run(eager, "4", "8", "compile.enable", "false", &re);
    run(big, "8", "8", NULL, NULL, &rb);

    float counts[STEPS + 1][N_EXPERTS], bias[STEPS + 1][N_EXPERTS];
    check_counts_and_updates(accum, counts, bias);

    int d_full = compare_steps(accum, full, 0, "full"), s_full = compare_state(accum, full);
    EXPECT(d_full == 0 && s_full == 0 && rf.params_hash == ra.params_hash,
           "memory_policy full vs none: %d steps, %d counts/biases differ, hash %016llx vs "
           "%016llx",
           d_full, s_full, (unsigned long long)rf.params_hash, (unsigned long long)ra.params_hash);
    printf("memory_policy full: %d steps and %d counts/biases differ, final xxh64 %016llx\n",
           d_full, s_full, (unsigned long long)rf.params_hash);
    int d_eager = compare_steps(accum, eager, 0, "eager"), s_eager = compare_state(accum, eager);
    EXPECT(d_eager == 0 && s_eager == 0 && re.params_hash == ra.params_hash,
           "eager vs compiled: %d steps, %d counts/biases differ, hash %016llx vs %016llx", d_eager,
           s_eager, (unsigned long long)re.params_hash, (unsigned long long)ra.params_hash);
    printf("eager: %d steps and %d counts/biases differ, final xxh64 %016llx (compiled %016llx)\n",
           d_eager, s_eager, (unsigned long long)re.params_hash,
           (unsigned long long)ra.params_hash);

    int d_big = compare_steps(accum, big, 1e-5, "accum vs big");
    EXPECT(d_big == 0, "accum vs one batch: %d steps' losses differ by more than 1e-5", d_big);
    float b_big[N_EXPERTS], want[N_EXPERTS];
    if (read_f32(big, 1, BIAS_NAME, b_big, N_EXPERTS)) {
        host_update(bias[0], counts[1], want);
        EXPECT(!memcmp(b_big, bias[1], sizeof b_big) && !memcmp(b_big, want, sizeof want),
               "step 1: the one-batch run's bias differs from the accumulation run's or from the "
               "host's update from the summed counts");
        printf("step 1: one batch's bias %s the accumulation run's\n",
               memcmp(b_big, bias[1], sizeof b_big) ? "differs from" : "equals");
    }

    /* resume from the step-1 checkpoint alone */
    char resumed[128], from[300], to[300], copy[700];
    snprintf(resumed, sizeof resumed, "%s/resumed", root);
    snprintf(from, sizeof from, "%s/checkpoint/step-1", accum);
    snprintf(to, sizeof to, "%s/checkpoint", resumed);
    EXPECT(mkdir(resumed, 0755) == 0 && mkdir(to, 0755) == 0, "mkdir %s", to);
    snprintf(copy, sizeof copy, "cp -r '%s' '%s/step-1'", from, to);
    EXPECT(system(copy) == 0, "%s", copy);
    gt_train_result rr = {0};
    run(resumed, "4", "8", NULL, NULL, &rr);
    EXPECT(rr.first_step == 2 && rr.params_hash == ra.params_hash,
           "resumed from step 1: first step %lld, hash %016llx vs uninterrupted %016llx",
           (long long)rr.first_step, (unsigned long long)rr.params_hash,
           (unsigned long long)ra.params_hash);
    printf("resumed from step 1: first step %lld, final xxh64 %016llx\n", (long long)rr.first_step,
           (unsigned long long)rr.params_hash);
    remove_tree(root);
    return gt_test_finish();
}
