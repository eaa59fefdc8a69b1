/* test_train_async_save.c — checkpoint.async_mode: a save written by a thread from a snapshot of
 * the state, while training goes on, is the save the step loop would have written.
 *
 *   a/  gt_train in this process: 20 steps, a checkpoint every 5 (kept), saves in the step loop.
 *   b/  `graphtrain train` with the same options and checkpoint.async_mode = async.
 *   c/  the same as b, killed (SIGKILL) as soon as step 10 is logged, so in or near the save of
 *       step 10 (its snapshot, or a thread still writing); then the same command again.
 *
 * Checked: b's steps (loss, grad_norm, lr) and final params hash are a's bit for bit; b's
 * checkpoints 5, 10, 15 and 20 are a's byte for byte (tensor file and manifest's tensor hashes);
 * b's log says steps 5, 10 and 15 were saved in the background, published after the step they
 * hold, and the last save (step 20) in the step loop. c: after the kill, every checkpoint listed
 * is complete and its tensor file is a's; the second process resumes from the latest of them
 * and ends with a's final params hash and step-20 file. */
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
#define INTERVAL 5
#define CHILD_SECONDS 300.0 /* every wait on a child is bounded by this */

static const char *const run_options[] = {
    "model.flavor=test_tiny",      "training.dataset=synthetic",
    "training.local_batch_size=4", "training.seq_len=32",
    "training.steps=20",           "training.mixed_precision_param=float32",
    "metrics.log_freq=1",          "metrics.save_jsonl=true",
    "checkpoint.enable=true",      "checkpoint.interval=5",
    "checkpoint.keep_latest_k=0",  "checkpoint.async_mode=async",
};
#define N_OPTIONS ((int)(sizeof run_options / sizeof run_options[0]))
#define N_SYNC_OPTIONS (N_OPTIONS - 1) /* all but async_mode */

static bool same_double(double a, double b)
{
    return memcmp(&a, &b, sizeof a) == 0;
}

static void ckpt_file(char *out, size_t cap, const char *dump, int64_t step)
{
    snprintf(out, cap, "%s/checkpoint/step-%lld/" GT_CHECKPOINT_TENSOR_FILE, dump, (long long)step);
}

/* Runs the CLI on dump (async saves) to the end, which must succeed: its log (malloc'd), the
 * last step it trained and its final params hash. */
static char *run_child(const char *binary, const char *dump, long long *last, uint64_t *hash)
{
    char out_path[512], err_path[512];
    snprintf(out_path, sizeof out_path, "%s.out", dump);
    snprintf(err_path, sizeof err_path, "%s.err", dump);
    pid_t pid = spawn_train(binary, run_options, N_OPTIONS, dump, out_path, err_path);
    int rc = pid > 0 ? wait_child(pid, CHILD_SECONDS) : -1;
    char *out = read_all(out_path, NULL), *log = read_all(err_path, NULL);
    EXPECT(rc == 0, "%s: exited with %d:\n%s", dump, rc, log ? log : "(no log)");
    long long first = 0;
    *last = 0;
    *hash = 0;
    EXPECT(parse_summary(out, &first, last, hash), "%s: no summary line:\n%s", dump,
           out ? out : "");
    free(out);
    return log;
}

/* b: the async run against a, step by step, file by file. */
static void check_async_run(const char *binary, const char *dir_a, const char *dir_b,
                            uint64_t hash_a)
{
    long long last = 0;
    uint64_t hash_b = 0;
    char *log = run_child(binary, dir_b, &last, &hash_b);
    EXPECT(hash_b == hash_a, "final params xxh64: step loop %016llx, async %016llx",
           (unsigned long long)hash_a, (unsigned long long)hash_b);
    gt_metrics_step ma[STEPS + 1], mb[STEPS + 1];
    int64_t n_a = 0, n_b = 0;
    bool have = last_records(dir_a, STEPS, ma, &n_a) && last_records(dir_b, STEPS, mb, &n_b);
    EXPECT(have, "metrics files miss steps");
    int differ = 0;
    for (int s = 1; have && s <= STEPS; s++)
        differ += !same_double(ma[s].loss, mb[s].loss) ||
                  !same_double(ma[s].grad_norm, mb[s].grad_norm) ||
                  !same_double(ma[s].lr, mb[s].lr);
    EXPECT(differ == 0, "%d of %d steps differ between the step-loop and the async run", differ,
           STEPS);
    for (int64_t s = INTERVAL; s <= STEPS; s += INTERVAL) {
        char pa[512], pb[512], line[96];
        ckpt_file(pa, sizeof pa, dir_a, s);
        ckpt_file(pb, sizeof pb, dir_b, s);
        EXPECT(same_bytes(pa, pb), "step %lld: %s and %s differ", (long long)s, pa, pb);
        snprintf(line, sizeof line, "saved step %lld to ", (long long)s);
        const char *at = log ? strstr(log, line) : NULL;
        const char *eol = at ? strchr(at, '\n') : NULL;
        char text[600] = "";
        if (at) snprintf(text, sizeof text, "%.*s", (int)(eol ? eol - at : 500), at);
        bool background = strstr(text, "in the background") != NULL;
        long long after = -1;
        const char *pub = strstr(text, "published after step ");
        if (pub) sscanf(pub, "published after step %lld", &after);
        if (s < STEPS)
            EXPECT(background && after >= s && after <= STEPS,
                   "step %lld: expected a background save published after it: %s", (long long)s,
                   text[0] ? text : "(no line)");
        else
            EXPECT(at && !background, "the last save should be in the step loop: %s",
                   text[0] ? text : "(no line)");
        printf("  %s\n", text[0] ? text : "(missing)");
    }
    free(log);
}

/* c: killed once step 10 is logged; every checkpoint left is whole; the resume ends as a did. */
static void check_kill(const char *binary, const char *dir_a, const char *dir_c, uint64_t hash_a)
{
    char out_path[512], err_path[512], ckpt[512];
    snprintf(out_path, sizeof out_path, "%s.out", dir_c);
    snprintf(err_path, sizeof err_path, "%s.err", dir_c);
    snprintf(ckpt, sizeof ckpt, "%s/checkpoint", dir_c);
    pid_t pid = spawn_train(binary, run_options, N_OPTIONS, dir_c, out_path, err_path);
    EXPECT(pid > 0, "fork failed");
    double deadline = now_seconds() + CHILD_SECONDS;
    bool begun = false, exited = false;
    int ws;
    while (pid > 0 && !begun && now_seconds() < deadline) {
        if (waitpid(pid, &ws, WNOHANG) == pid) {
            exited = true;
            break;
        }
        /* step 10's metrics line: its save is about to begin, the kill lands in or near it */
        char *log = read_all(err_path, NULL);
        begun = log && strstr(log, "step 10 ");
        free(log);
        if (!begun) sleep_us(200);
    }
    if (!exited) {
        kill(pid, SIGKILL);
        int rc = wait_child(pid, CHILD_SECONDS);
        EXPECT(rc == 128 + SIGKILL || rc == 0, "killed child ended with %d", rc);
    }
    int64_t *steps = NULL;
    int n = 0;
    gt_error err = {0};
    EXPECT_OK(gt_checkpoint_list(ckpt, &steps, &n, &err), &err);
    for (int k = 0; k < n; k++) {
        char pa[512], pc[512];
        ckpt_file(pa, sizeof pa, dir_a, steps[k]);
        ckpt_file(pc, sizeof pc, dir_c, steps[k]);
        EXPECT(same_bytes(pa, pc), "after the kill, checkpoint %lld is not a's",
               (long long)steps[k]);
    }
    printf("killed with %d complete checkpoint(s), the latest %lld\n", n,
           n ? (long long)steps[n - 1] : -1LL);
    free(steps);
    long long last = 0;
    uint64_t hash_c = 0;
    free(run_child(binary, dir_c, &last, &hash_c));
    EXPECT(last == STEPS && hash_c == hash_a,
           "resumed after the kill: last step %lld, params %016llx (a: %016llx)", last,
           (unsigned long long)hash_c, (unsigned long long)hash_a);
    char pa[512], pc[512];
    ckpt_file(pa, sizeof pa, dir_a, STEPS);
    ckpt_file(pc, sizeof pc, dir_c, STEPS);
    EXPECT(same_bytes(pa, pc), "step-%d after the kill and resume differs from a's", STEPS);
}

int main(void)
{
    gt_cpu_set_threads(1); /* as the CLI: bits must not depend on the core count */
    char root[] = "/tmp/gt_async_save_XXXXXX";
    const char *binary = train_child_start(root);
    EXPECT(binary, "no graphtrain program or no test folder (stderr says which)");
    if (!binary) return gt_test_finish();
    char dir_a[128], dir_b[128], dir_c[128];
    snprintf(dir_a, sizeof dir_a, "%s/a", root);
    snprintf(dir_b, sizeof dir_b, "%s/b", root);
    snprintf(dir_c, sizeof dir_c, "%s/c", root);

    /* a: the step loop's saves, in this process */
    gt_config cfg;
    gt_error err = {0};
    gt_train_result ra = {0};
    gt_status st = train_child_config(&cfg, run_options, N_SYNC_OPTIONS, dir_a, &err);
    EXPECT_OK(st, &err);
    if (st == GT_OK) EXPECT_OK(gt_train(&cfg, &ra, &err), &err);
    gt_config_free(&cfg);
    EXPECT(ra.last_step == STEPS, "the step-loop run trained to %lld", (long long)ra.last_step);

    check_async_run(binary, dir_a, dir_b, ra.params_hash);
    check_kill(binary, dir_a, dir_c, ra.params_hash);
    if (gt_test_failed_ == 0) remove_tree(root);
    return gt_test_finish();
}
