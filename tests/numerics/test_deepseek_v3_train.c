/* test_deepseek_v3_train.c — DeepSeek-V3 trains on the CPU, its expert bias is model state.
 *
 * test_dsv3_tiny (one dense layer, one MoE layer of 8 experts, top-2, softmax routing) in f32 on
 * the synthetic dataset (vocab 128, the flavor's), batch 4 x 32, 20 steps, lr 1e-2:
 *   compiled: checkpoint every step (keep all);
 *   eager:    compile.enable = false, no checkpoints;
 *   resumed:  the compiled run's step-2 checkpoint alone in a fresh folder, trained to step 20.
 * Checked:
 *   - the loss falls (the mean of the last 5 steps at least 0.5 nats below the first 5);
 *   - compiled and eager give the same bits: every step's loss and grad_norm, the final hash
 *     (the eager run saves nothing: a save per step changes nothing either);
 *   - the resumed run starts at step 3 and repeats the uninterrupted run bit for bit: losses,
 *     grad_norms, the final hash and the step-20 checkpoint file (parameters, moments and
 *     layers.1.moe.expert_bias_E);
 *   - the final hash is xxh64 of the list of every parameter's xxh64 followed by the expert
 *     bias's, recomputed from the step-20 checkpoint (so the hash covers expert_bias);
 *   - the expert-bias update: for each of steps 1..3, the saved bias b_s equals, bit for bit, the
 *     host's recomputation b_{s-1} + (d0 - mean(d0)) in f32 with d0_e = f32(1e-3)·s_e, for some
 *     sign vector s in {-1, 0, +1}^8 (searched over all 3^8; the mean as the CPU kernel takes it:
 *     a double sum divided by E, rounded to f32) that is the sign pattern sign(mean(c) - c) of
 *     some token counts c: +1 and -1 both present, or all 0 (b_0 = 0). The counts themselves are
 *     not read back (recomputing the routing is the model test's business): what is checked is
 *     that the trainer carries the bias from step to step, that the update's algebra holds
 *     exactly, and that the routing is not balanced (some step moves the bias). The sum of each
 *     step's change is also within 8 ulps of 1e-3 of zero. */
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
#include "graphtrain/gt_safetensors.h"
#include "graphtrain/gt_train.h"
#include "gt_test.h"
#include "train_child.h"

#define STEPS 20
#define N_EXPERTS 8
#define BIAS_NAME "layers.1.moe.expert_bias_E"
#define COEFF 1e-3

static const char *const run_options[] = {
    "model.name=deepseek_v3",
    "model.flavor=test_dsv3_tiny",
    "training.dataset=synthetic",
    "training.local_batch_size=4",
    "training.seq_len=32",
    "training.steps=20",
    "training.mixed_precision_param=float32",
    "optimizer.lr=1e-2",
    "metrics.log_freq=1",
    "metrics.save_jsonl=true",
    "checkpoint.enable=true",
    "checkpoint.interval=1",
    "checkpoint.keep_latest_k=0",
};
#define N_OPTIONS ((int)(sizeof run_options / sizeof run_options[0]))

static gt_status make_config(gt_config *cfg, const char *dump, gt_error *err)
{
    return train_child_config(cfg, run_options, N_OPTIONS, dump, err);
}

static bool same_double(double a, double b)
{
    return memcmp(&a, &b, sizeof a) == 0;
}

/* The tensor `name` of checkpoint `step` of the run in dump (f32; the caller frees it). */
static bool read_ckpt_tensor(const char *dump, int step, const char *name, gt_tensor *out)
{
    char path[512];
    snprintf(path, sizeof path, "%s/checkpoint/step-%d/" GT_CHECKPOINT_TENSOR_FILE, dump, step);
    gt_safetensors st = {0};
    gt_error err = {0};
    bool ok = gt_safetensors_open(path, &st, &err) == GT_OK &&
              gt_safetensors_get(&st, name, out, &err) == GT_OK;
    if (!ok) fprintf(stderr, "%s: %s\n", path, err.msg);
    gt_safetensors_close(&st);
    return ok;
}

/* ---------------------------------------------------------------- the expert-bias update */

/* b + (d0 - mean(d0)) for sign vector s, as the step graph computes it on the CPU. */
static void bias_update(const float *b, const int *s, float *out)
{
    float d0[N_EXPERTS];
    double sum = 0;
    for (int e = 0; e < N_EXPERTS; e++) {
        d0[e] = (float)COEFF * (float)s[e];
        sum += d0[e];
    }
    float mean = (float)(sum / N_EXPERTS);
    for (int e = 0; e < N_EXPERTS; e++)
        out[e] = b[e] + (d0[e] - mean);
}

/* A sign pattern some counts give: both signs, or none. */
static bool feasible(const int *s)
{
    bool pos = false, neg = false, zero = false;
    for (int e = 0; e < N_EXPERTS; e++)
        pos |= s[e] > 0, neg |= s[e] < 0, zero |= s[e] == 0;
    return (pos && neg) || (!pos && !neg);
}

/* The sign vectors (of all 3^E) whose update takes prev to next bit for bit: how many, and the
 * first in *found. */
static int match_update(const float *prev, const float *next, int *found)
{
    int matches = 0, total = 1;
    for (int e = 0; e < N_EXPERTS; e++)
        total *= 3;
    for (int code = 0; code < total; code++) {
        int s[N_EXPERTS], c = code;
        for (int e = 0; e < N_EXPERTS; e++, c /= 3)
            s[e] = c % 3 - 1;
        if (!feasible(s)) continue;
        float got[N_EXPERTS];
        bias_update(prev, s, got);
        if (memcmp(got, next, sizeof got) != 0) continue;
        if (matches++ == 0) memcpy(found, s, sizeof s);
    }
    return matches;
}

static void check_bias_updates(const char *dump)
{
    float prev[N_EXPERTS] = {0};
    int moved = 0;
    for (int step = 1; step <= 3; step++) {
        gt_tensor b = {0};
        if (!read_ckpt_tensor(dump, step, BIAS_NAME, &b)) {
            EXPECT(false, "step %d: no %s in the checkpoint", step, BIAS_NAME);
            return;
        }
        EXPECT(b.dtype == GT_F32 && b.ndim == 1 && b.shape[0] == N_EXPERTS,
               "step %d: %s is not f32[%d]", step, BIAS_NAME, N_EXPERTS);
        if (b.dtype != GT_F32 || gt_tensor_numel(&b) != N_EXPERTS) {
            gt_tensor_free(&b);
            return;
        }
        const float *next = b.data;
        int s[N_EXPERTS] = {0};
        int matches = match_update(prev, next, s);
        double dsum = 0;
        for (int e = 0; e < N_EXPERTS; e++)
            dsum += (double)next[e] - (double)prev[e];
        EXPECT(matches == 1, "step %d: %d sign vectors give the saved bias (want exactly 1)", step,
               matches);
        EXPECT(fabs(dsum) <= 8 * COEFF * 0x1p-23, "step %d: the bias change sums to %.3g, not ~0",
               step, dsum);
        bool any = false;
        for (int e = 0; e < N_EXPERTS; e++)
            any |= s[e] != 0;
        moved += any;
        printf("step %d: expert_bias change sign(mean(c) - c) = [", step);
        for (int e = 0; e < N_EXPERTS; e++)
            printf("%s%+d", e ? " " : "", s[e]);
        printf("], sum of the change %.3g, bias[0] %.9g\n", dsum, next[0]);
        memcpy(prev, next, sizeof prev);
        gt_tensor_free(&b);
    }
    EXPECT(moved > 0, "the expert bias never moved in steps 1..3");
}

/* ---------------------------------------------------------------- the final hash */

/* xxh64 of [every parameter's xxh64 (graph input order), every model buffer's], from the step-20
 * checkpoint: what the trainer's final hash documents. */
static uint64_t hash_from_checkpoint(const char *dump)
{
    gt_config cfg;
    gt_error err = {0};
    EXPECT_OK(make_config(&cfg, dump, &err), &err);
    gt_graph *g = gt_graph_new();
    gt_model model = {0};
    EXPECT_OK(gt_train_build_graph(&cfg, g, &model, 1, &err), &err);
    int n = 0;
    uint64_t hv[256];
    for (int k = 0; k < model.n_params && n < 255; k++) {
        gt_tensor x = {0};
        if (!read_ckpt_tensor(dump, STEPS, model.params[k].fqn, &x)) break;
        hv[n++] = gt_hash64(x.data, gt_tensor_nbytes(&x), 0);
        gt_tensor_free(&x);
    }
    EXPECT(n == model.n_params, "read %d of %d parameters", n, model.n_params);
    int buffers = 0;
    for (int k = 0; k < g->n_inputs && n < 256; k++) {
        const gt_io *in = &g->inputs[k];
        if (in->kind != GT_IN_BUFFER || in->plan.as_param) continue;
        gt_tensor x = {0};
        if (!read_ckpt_tensor(dump, STEPS, gt_graph_str(g, in->fqn), &x)) continue;
        hv[n++] = gt_hash64(x.data, gt_tensor_nbytes(&x), 0);
        buffers++;
        gt_tensor_free(&x);
    }
    EXPECT(buffers == 1, "%d model buffers in the step graph (want 1: %s)", buffers, BIAS_NAME);
    gt_graph_free(g);
    gt_model_free(&model);
    gt_config_free(&cfg);
    return gt_hash64(hv, (size_t)n * sizeof *hv, 0);
}

/* ---------------------------------------------------------------- the test */

/* The metrics of steps from..STEPS of dump (the last record of each): false unless each has one. */
static bool steps_of(const char *dump, int from, gt_metrics_step m[STEPS + 1])
{
    gt_metrics_log log = {0};
    if (!read_metrics(dump, &log)) return false;
    for (int s = 0; s <= STEPS; s++)
        m[s].step = 0;
    for (int64_t k = 0; k < log.n_steps; k++)
        if (log.steps[k].step >= from && log.steps[k].step <= STEPS)
            m[log.steps[k].step] = log.steps[k];
    gt_metrics_log_free(&log);
    bool ok = true;
    for (int s = from; s <= STEPS; s++)
        ok = ok && m[s].step == s;
    return ok;
}

int main(void)
{
    gt_cpu_set_threads(1);
    char root[] = "/tmp/gt_dsv3_train_XXXXXX";
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 1;
    }
    char dir_c[128], dir_e[128], dir_r[128], from[300], to[300];
    snprintf(dir_c, sizeof dir_c, "%s/compiled", root);
    snprintf(dir_e, sizeof dir_e, "%s/eager", root);
    snprintf(dir_r, sizeof dir_r, "%s/resumed", root);

    /* compiled, a checkpoint every step */
    gt_config cfg;
    gt_error err = {0};
    gt_train_result rc = {0}, re = {0}, rr = {0};
    EXPECT_OK(make_config(&cfg, dir_c, &err), &err);
    EXPECT_OK(gt_train(&cfg, &rc, &err), &err);
    gt_config_free(&cfg);
    EXPECT(rc.first_step == 1 && rc.last_step == STEPS, "compiled run trained %lld..%lld",
           (long long)rc.first_step, (long long)rc.last_step);

    /* eager, no checkpoints */
    EXPECT_OK(make_config(&cfg, dir_e, &err), &err);
    EXPECT_OK(gt_config_set(&cfg, "compile.enable", "false", &err), &err);
    EXPECT_OK(gt_config_set(&cfg, "checkpoint.enable", "false", &err), &err);
    EXPECT_OK(gt_train(&cfg, &re, &err), &err);
    gt_config_free(&cfg);

    gt_metrics_step mc[STEPS + 1], me[STEPS + 1], mr[STEPS + 1];
    bool have_c = steps_of(dir_c, 1, mc), have_e = steps_of(dir_e, 1, me);
    EXPECT(have_c && have_e, "metrics of steps 1..%d missing", STEPS);
    if (have_c) {
        double first = 0, last = 0;
        for (int s = 1; s <= 5; s++)
            first += mc[s].loss / 5, last += mc[STEPS - 5 + s].loss / 5;
        EXPECT(last < first - 0.5, "loss: first 5 steps %.4f, last 5 %.4f (want a fall of 0.5)",
               first, last);
        printf("loss: steps 1-5 mean %.4f, steps 16-20 mean %.4f (step 1 %.4f, step 20 %.4f)\n",
               first, last, mc[1].loss, mc[STEPS].loss);
    }
    int differ = 0;
    for (int s = 1; have_c && have_e && s <= STEPS; s++)
        differ +=
            !same_double(mc[s].loss, me[s].loss) || !same_double(mc[s].grad_norm, me[s].grad_norm);
    EXPECT(differ == 0 && rc.params_hash == re.params_hash,
           "eager vs compiled: %d steps differ, hash %016llx vs %016llx", differ,
           (unsigned long long)re.params_hash, (unsigned long long)rc.params_hash);
    printf("eager vs compiled: %d steps differ, final xxh64 %016llx / %016llx\n", differ,
           (unsigned long long)re.params_hash, (unsigned long long)rc.params_hash);

    /* the expert bias after steps 1..3, and the final hash from the checkpoint */
    check_bias_updates(dir_c);
    uint64_t h = hash_from_checkpoint(dir_c);
    EXPECT(h == rc.params_hash, "final hash %016llx, recomputed from the checkpoint %016llx",
           (unsigned long long)rc.params_hash, (unsigned long long)h);

    /* resume from the step-2 checkpoint alone */
    snprintf(from, sizeof from, "%s/checkpoint/step-2", dir_c);
    snprintf(to, sizeof to, "%s/checkpoint", dir_r);
    EXPECT(mkdir(dir_r, 0755) == 0 && mkdir(to, 0755) == 0, "mkdir %s", to);
    snprintf(to, sizeof to, "%s/checkpoint/step-2", dir_r);
    char copy[700];
    snprintf(copy, sizeof copy, "cp -r '%s' '%s'", from, to);
    EXPECT(system(copy) == 0, "%s", copy);
    EXPECT_OK(make_config(&cfg, dir_r, &err), &err);
    EXPECT_OK(gt_train(&cfg, &rr, &err), &err);
    gt_config_free(&cfg);
    bool have_r = steps_of(dir_r, 3, mr);
    EXPECT(have_r, "resumed run: metrics of steps 3..%d missing", STEPS);
    int rdiffer = 0;
    for (int s = 3; have_c && have_r && s <= STEPS; s++)
        rdiffer +=
            !same_double(mc[s].loss, mr[s].loss) || !same_double(mc[s].grad_norm, mr[s].grad_norm);
    EXPECT(rr.first_step == 3 && rr.last_step == STEPS && rdiffer == 0 &&
               rr.params_hash == rc.params_hash,
           "resumed from step 2: trained %lld..%lld, %d steps differ, hash %016llx vs "
           "uninterrupted %016llx",
           (long long)rr.first_step, (long long)rr.last_step, rdiffer,
           (unsigned long long)rr.params_hash, (unsigned long long)rc.params_hash);
    char pa[512], pb[512];
    snprintf(pa, sizeof pa, "%s/checkpoint/step-%d/" GT_CHECKPOINT_TENSOR_FILE, dir_c, STEPS);
    snprintf(pb, sizeof pb, "%s/checkpoint/step-%d/" GT_CHECKPOINT_TENSOR_FILE, dir_r, STEPS);
    EXPECT(same_bytes(pa, pb), "%s and %s differ", pa, pb);
    printf("resumed from step 2: trained %lld..%lld, %d steps differ, final xxh64 %016llx "
           "(uninterrupted %016llx)\n",
           (long long)rr.first_step, (long long)rr.last_step, rdiffer,
           (unsigned long long)rr.params_hash, (unsigned long long)rc.params_hash);

    remove_tree(root);
    return gt_test_finish();
}
