/* test_train_resume.c — resume from a checkpoint repeats the uninterrupted run bit for bit
 * (issue 3, acceptance "Resume"; DESIGN.md §6 lists the pair as bitwise).
 *
 *   a/  gt_train in this process: 20 steps straight, a checkpoint every 10.
 *   b/  `graphtrain train` with the same options as a child process, killed (SIGKILL) as soon as
 *       b/checkpoint/step-10/manifest.json exists; then the same command again, which resumes from
 *       the latest checkpoint (reading it in pieces of 1000 bytes on several threads) and trains
 *       to step 20.
 *
 * The run is so short that the child may pass step 10 before the kill lands; checkpoints after
 * step 10 are then deleted, so the second process always resumes from step 10 and trains 11..20,
 * whatever the timing. Both runs use training.steps = 20 (the LR schedule depends on it).
 *
 * Checked, bitwise: the last record of every step 1..20 in the two metrics.jsonl files (loss,
 * grad_norm, lr — the resumed run appends, a later record wins), the final params hash of the
 * in-process result against the one the CLI prints, and the two step-20 model.safetensors files
 * (parameters and AdamW moments), and the resumed process's log says it took its parameters from
 * step-10 without drawing them first. Also: resuming a finished run trains nothing and keeps the
 * parameters; resuming with another model flavor is refused with a message naming the checkpoint
 * and both flavors, and leaves the run's config.toml as it was. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* nftw */
#endif
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "graphtrain/gt_backend.h"
#include "graphtrain/gt_checkpoint.h"
#include "graphtrain/gt_config.h"
#include "graphtrain/gt_metrics.h"
#include "graphtrain/gt_train.h"
#include "gt_test.h"
#include "train_child.h"

#define STEPS 20
#define HALF 10
#define CHILD_SECONDS 300.0 /* every wait on a child is bounded by this */

/* The run's options, as `section.key=value`; dump_folder is added per run. */
static const char *const run_options[] = {
    "model.flavor=test_tiny",      "training.dataset=synthetic",
    "training.local_batch_size=4", "training.seq_len=32",
    "training.steps=20",           "training.mixed_precision_param=float32",
    "metrics.log_freq=1",          "metrics.save_jsonl=true",
    "checkpoint.enable=true",      "checkpoint.interval=10",
};
#define N_OPTIONS ((int)(sizeof run_options / sizeof run_options[0]))

/* ---------------------------------------------------------------- helpers */

static bool exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0;
}

static bool same_double(double a, double b)
{
    return memcmp(&a, &b, sizeof a) == 0;
}

/* ---------------------------------------------------------------- the test */

static gt_status make_config(gt_config *cfg, const char *dump, const char *flavor, gt_error *err)
{
    gt_status st = train_child_config(cfg, run_options, N_OPTIONS, dump, err);
    if (st == GT_OK && flavor) st = gt_config_set(cfg, "model.flavor", flavor, err);
    if (st == GT_OK) st = gt_config_validate(cfg, err);
    return st;
}

int main(void)
{
    gt_cpu_set_threads(1); /* as the CLI: bits must not depend on the core count */
    char root[] = "/tmp/gt_train_resume_XXXXXX";
    const char *binary = train_child_start(root);
    EXPECT(binary, "no graphtrain program or no test folder (stderr says which)");
    if (!binary) return gt_test_finish();
    char dir_a[128], dir_b[128], path[1024], path2[1024], out_path[1024], err_path[1024];
    snprintf(dir_a, sizeof dir_a, "%s/a", root);
    snprintf(dir_b, sizeof dir_b, "%s/b", root);
    snprintf(out_path, sizeof out_path, "%s/stdout.txt", root);
    snprintf(err_path, sizeof err_path, "%s/stderr.txt", root);

    /* a: 20 steps straight, in this process */
    gt_config cfg;
    gt_error err = {0};
    gt_train_result ra = {0};
    EXPECT_OK(make_config(&cfg, dir_a, NULL, &err), &err);
    EXPECT_OK(gt_train(&cfg, &ra, &err), &err);
    EXPECT(ra.first_step == 1 && ra.last_step == STEPS, "straight run trained %lld..%lld",
           (long long)ra.first_step, (long long)ra.last_step);

    /* b, part 1: the CLI, killed once checkpoint 10 is complete (its manifest is written inside
     * the temporary directory, so step-10/manifest.json appears only with the rename) */
    char manifest10[512];
    snprintf(manifest10, sizeof manifest10, "%s/checkpoint/step-%d/" GT_CHECKPOINT_MANIFEST, dir_b,
             HALF);
    pid_t pid = spawn_train(binary, run_options, N_OPTIONS, dir_b, out_path, err_path);
    EXPECT(pid > 0, "fork failed");
    double deadline = now_seconds() + CHILD_SECONDS;
    int ws, early_exit = -1;
    while (pid > 0 && !exists(manifest10) && now_seconds() < deadline) {
        if (waitpid(pid, &ws, WNOHANG) == pid) {
            early_exit = exit_code(ws);
            pid = 0;
            break;
        }
        sleep_us(50);
    }
    if (pid > 0) {
        kill(pid, SIGKILL);
        int rc = wait_child(pid, CHILD_SECONDS);
        EXPECT(rc == 128 + SIGKILL || rc == 0, "first child ended with %d", rc);
    } else {
        EXPECT(early_exit == 0, "first child exited with %d before step %d (stderr in %s)",
               early_exit, HALF, err_path);
    }
    EXPECT(exists(manifest10), "no checkpoint step %d in %s", HALF, dir_b);

    /* Whatever the child did after step 10 is removed, so the resume starts at step 10. */
    char ckpt_b[256];
    snprintf(ckpt_b, sizeof ckpt_b, "%s/checkpoint", dir_b);
    int64_t *steps = NULL;
    int n_steps = 0;
    EXPECT_OK(gt_checkpoint_list(ckpt_b, &steps, &n_steps, &err), &err);
    for (int k = 0; k < n_steps; k++)
        if (steps[k] > HALF) {
            snprintf(path, sizeof path, "%s/step-%lld", ckpt_b, (long long)steps[k]);
            remove_tree(path);
        }
    free(steps);
    gt_metrics_log part1 = {0};
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir_b);
    if (gt_metrics_read(path, &part1, &err) == GT_OK) {
        printf("first process: killed after %lld logged steps\n", (long long)part1.n_steps);
        gt_metrics_log_free(&part1);
    }

    /* b, part 2: the same command resumes from step 10 and trains to the end, reading its blocks
     * in pieces of 1000 bytes (tensors and elements split across pieces and threads) */
    setenv("GT_CKPT_READ_PIECE_BYTES", "1000", 1);
    pid = spawn_train(binary, run_options, N_OPTIONS, dir_b, out_path, err_path);
    unsetenv("GT_CKPT_READ_PIECE_BYTES");
    int rc = wait_child(pid, CHILD_SECONDS);
    EXPECT(rc == 0, "resumed child exited with %d (stderr in %s)", rc, err_path);
    char *out = read_all(out_path, NULL);
    long long first = 0, last = 0;
    uint64_t hash_b = 0;
    EXPECT(parse_summary(out, &first, &last, &hash_b), "no summary line in the output:\n%s",
           out ? out : "(none)");
    free(out);
    /* the parameters came from the checkpoint: the resumed process did not draw them first */
    char *log = read_all(err_path, NULL);
    EXPECT(log && strstr(log, "parameters from step-10, not drawn"),
           "the resumed run's log does not say its parameters came from step-10:\n%s",
           log ? log : "(none)");
    free(log);
    EXPECT(first == HALF + 1 && last == STEPS, "resumed run trained %lld..%lld, expected %d..%d",
           first, last, HALF + 1, STEPS);
    EXPECT(hash_b == ra.params_hash, "final params xxh64: straight %016llx, resumed %016llx",
           (unsigned long long)ra.params_hash, (unsigned long long)hash_b);
    printf("params xxh64: straight %016llx, resumed %016llx\n", (unsigned long long)ra.params_hash,
           (unsigned long long)hash_b);

    /* per-step metrics, bitwise */
    gt_metrics_step ma[STEPS + 1], mb[STEPS + 1];
    int64_t n_a = 0, n_b = 0;
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir_a);
    snprintf(path2, sizeof path2, "%s/metrics.jsonl", dir_b);
    bool have_a = last_records(dir_a, STEPS, ma, &n_a);
    bool have_b = last_records(dir_b, STEPS, mb, &n_b);
    EXPECT(have_a && have_b, "metrics files miss steps: %s / %s", path, path2);
    for (int s = 1; have_a && have_b && s <= STEPS; s++) {
        EXPECT(same_double(ma[s].loss, mb[s].loss), "step %d loss: straight %.17g, resumed %.17g",
               s, ma[s].loss, mb[s].loss);
        EXPECT(same_double(ma[s].grad_norm, mb[s].grad_norm),
               "step %d grad_norm: straight %.17g, resumed %.17g", s, ma[s].grad_norm,
               mb[s].grad_norm);
        EXPECT(same_double(ma[s].lr, mb[s].lr), "step %d lr: straight %.17g, resumed %.17g", s,
               ma[s].lr, mb[s].lr);
    }

    /* final checkpoints: parameters and both AdamW moments, bitwise */
    snprintf(path, sizeof path, "%s/checkpoint/step-%d/" GT_CHECKPOINT_TENSOR_FILE, dir_a, STEPS);
    snprintf(path2, sizeof path2, "%s/checkpoint/step-%d/" GT_CHECKPOINT_TENSOR_FILE, dir_b, STEPS);
    EXPECT(same_bytes(path, path2), "%s and %s differ", path, path2);

    /* resuming a finished run trains nothing, logs nothing and keeps the parameters */
    gt_train_result rf = {0};
    EXPECT_OK(gt_train(&cfg, &rf, &err), &err);
    EXPECT(rf.first_step > rf.last_step && rf.last_step == STEPS,
           "resuming the finished run trained %lld..%lld", (long long)rf.first_step,
           (long long)rf.last_step);
    EXPECT(rf.params_hash == ra.params_hash, "params after a no-op resume: %016llx vs %016llx",
           (unsigned long long)rf.params_hash, (unsigned long long)ra.params_hash);
    int64_t n_after = 0;
    EXPECT(last_records(dir_a, STEPS, ma, &n_after) && n_after == n_a,
           "the no-op resume changed the metrics file (%lld -> %lld records)", (long long)n_a,
           (long long)n_after);
    gt_config_free(&cfg);

    /* resuming with another model is refused, naming the checkpoint and both models */
    gt_config other;
    gt_error err2 = {0};
    EXPECT_OK(make_config(&other, dir_a, "test_gqa", &err2), &err2);
    gt_status st = gt_train(&other, NULL, &err2);
    char ckpt_a[512];
    snprintf(ckpt_a, sizeof ckpt_a, "%s/checkpoint/step-%d", dir_a, STEPS);
    EXPECT(st != GT_OK, "resuming a test_tiny checkpoint as test_gqa succeeded");
    EXPECT(strstr(err2.msg, ckpt_a) && strstr(err2.msg, "test_tiny") &&
               strstr(err2.msg, "test_gqa"),
           "the message should name %s, test_tiny and test_gqa: %s", ckpt_a, err2.msg);
    printf("flavor mismatch: %s\n", err2.msg);
    gt_config_free(&other);
    /* the refused run leaves the run's record alone: config.toml still describes test_tiny */
    gt_config written;
    gt_config_defaults(&written);
    snprintf(path, sizeof path, "%s/config.toml", dir_a);
    EXPECT_OK(gt_config_load_file(&written, path, &err2), &err2);
    EXPECT(!strcmp(written.model.flavor, "test_tiny"),
           "after the refused resume %s says model.flavor = %s", path, written.model.flavor);
    gt_config_free(&written);

    remove_tree(root);
    return gt_test_finish();
}
