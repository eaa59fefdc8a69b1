/* test_train_kill.c — a `kill -9` at any moment leaves the last complete checkpoint loadable, and
 * resuming from it reproduces the uninterrupted run bit for bit (issue 3, acceptance).
 *
 * A 30-step test_tiny run with a checkpoint every 2 steps and keep_latest_k 3, so most of its time
 * is spent saving and pruning checkpoints. The reference is one uninterrupted `graphtrain train`.
 * Then rounds, each in a fresh folder: the same command is started and killed with SIGKILL, twice
 * (the second kill hits the resumed process), at points drawn from a fixed seed:
 *   - after a delay spread over the length of the reference run (anywhere: start-up, a step, a
 *     save, a prune);
 *   - as soon as a checkpoint write of step >= K has begun (a .tmp-step-* directory exists);
 *   - as soon as a prune has begun (a .tmp-prune-* directory exists).
 * After the kills: the latest complete checkpoint (if any) passes gt_checkpoint_load's full
 * validation (manifest, sizes, checksums); the same command resumes from it (the summary says it
 * trained latest+1..30) and ends with the reference's parameter hash, the reference's step-30
 * model.safetensors byte for byte (parameters and AdamW moments), and the reference's loss for
 * every step 1..30 (last record of each step in metrics.jsonl).
 *
 * Whether a kill lands inside a write is up to timing, so every round that stopped before the
 * last step also plants what a kill during a write leaves behind — a .tmp-step directory of a dead
 * writer with a truncated tensor file — which the resume must ignore and its next save remove.
 * Every wait on a child is bounded. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* nftw */
#endif
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "graphtrain/gt_checkpoint.h"
#include "graphtrain/gt_metrics.h"
#include "gt_test.h"
#include "train_child.h"

#define STEPS 30
#define ROUNDS 8
#define KILLS_PER_ROUND 2
#define CHILD_SECONDS 300.0  /* bound on every wait for a child */
#define SEED 0x6b696c6c39ull /* the kill points */

/* The run's options, as `section.key=value`; dump_folder is added per run. */
static const char *const run_options[] = {
    "model.flavor=test_tiny",      "training.dataset=synthetic",
    "training.local_batch_size=4", "training.seq_len=32",
    "training.steps=30",           "training.mixed_precision_param=float32",
    "metrics.log_freq=1",          "metrics.save_jsonl=true",
    "checkpoint.enable=true",      "checkpoint.interval=2",
    "checkpoint.keep_latest_k=3",
};
#define N_OPTIONS ((int)(sizeof run_options / sizeof run_options[0]))

typedef enum { KILL_AFTER_DELAY, KILL_IN_WRITE, KILL_IN_PRUNE } kill_kind;
static const char *const kind_names[] = {"after delay", "in checkpoint write", "in prune"};

/* ---------------------------------------------------------------- files */

static bool write_all(const char *path, const char *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (!f) return false;
    bool ok = fwrite(data, 1, len, f) == len;
    return fclose(f) == 0 && ok;
}

/* Whether folder holds an entry starting with prefix; with min_step >= 0, only one whose name
 * continues with a step number >= min_step. */
static bool has_entry(const char *folder, const char *prefix, long long min_step)
{
    DIR *d = opendir(folder);
    if (!d) return false;
    bool found = false;
    size_t n = strlen(prefix);
    struct dirent *e;
    while (!found && (e = readdir(d))) {
        if (strncmp(e->d_name, prefix, n) != 0) continue;
        found = min_step < 0 || atoll(e->d_name + n) >= min_step;
    }
    closedir(d);
    return found;
}

/* ---------------------------------------------------------------- kill points */

static uint64_t splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double uniform(uint64_t *state)
{
    return (double)(splitmix64(state) >> 11) * 0x1.0p-53;
}

typedef struct {
    kill_kind kind;
    double delay;   /* KILL_AFTER_DELAY: seconds after the start */
    long long step; /* KILL_IN_WRITE: the checkpoint step whose write triggers the kill */
} kill_point;

/* Runs the command and kills it at the point. Returns what happened, for the log. */
static const char *run_and_kill(const char *binary, const char *dump, const char *ckpt,
                                const char *out_path, const char *err_path, kill_point kp,
                                pid_t *dead_pid)
{
    pid_t pid = spawn_train(binary, run_options, N_OPTIONS, dump, out_path, err_path);
    if (pid <= 0) return "fork failed";
    *dead_pid = pid;
    double start = now_seconds(), deadline = start + CHILD_SECONDS;
    for (;;) {
        int ws;
        if (waitpid(pid, &ws, WNOHANG) == pid)
            return exit_code(ws) == 0 ? "finished before the kill point" : "failed on its own";
        double t = now_seconds();
        bool fire = t > deadline;
        if (kp.kind == KILL_AFTER_DELAY) fire = fire || t - start >= kp.delay;
        if (kp.kind == KILL_IN_WRITE) fire = fire || has_entry(ckpt, ".tmp-step-", kp.step);
        if (kp.kind == KILL_IN_PRUNE) fire = fire || has_entry(ckpt, ".tmp-prune-", -1);
        if (fire) break;
        sleep_us(kp.kind == KILL_AFTER_DELAY ? 100 : 10);
    }
    kill(pid, SIGKILL);
    int rc = wait_child(pid, CHILD_SECONDS);
    if (rc == 0) return "finished before the kill landed";
    if (rc != 128 + SIGKILL) return "ended by something else";
    return has_entry(ckpt, ".tmp-", -1) ? "killed (a .tmp-* directory was left)" : "killed";
}

/* What a kill during a write leaves: .tmp-step-<N>-<pid of a dead writer>/ holding half of a
 * tensor file and no manifest (N: the step after the latest complete one). */
static void plant_torn_write(const char *ckpt, long long latest, pid_t dead_pid)
{
    char dir[768], src[1024], dst[1024];
    long long next = latest == GT_CHECKPOINT_NONE ? 2 : latest + 2;
    mkdir(ckpt, 0777);
    snprintf(dir, sizeof dir, "%s/.tmp-step-%lld-%ld", ckpt, next, (long)dead_pid);
    EXPECT(mkdir(dir, 0777) == 0 || errno == EEXIST, "cannot create %s", dir);
    snprintf(src, sizeof src, "%s/step-%lld/" GT_CHECKPOINT_TENSOR_FILE, ckpt, latest);
    snprintf(dst, sizeof dst, "%s/" GT_CHECKPOINT_TENSOR_FILE, dir);
    size_t n = 0;
    char *bytes = latest == GT_CHECKPOINT_NONE ? NULL : read_all(src, &n);
    if (!bytes) bytes = calloc(1, n = 4096);
    EXPECT(write_all(dst, bytes, n / 2), "cannot plant %s", dst);
    free(bytes);
}

/* ---------------------------------------------------------------- the test */

int main(void)
{
    char root[] = "/tmp/gt_train_kill_XXXXXX";
    const char *binary = train_child_start(root);
    EXPECT(binary, "no graphtrain program or no test folder (stderr says which)");
    if (!binary) return gt_test_finish();
    char ref[128], ref_ckpt[256], ref_final[512], out_path[256], err_path[256];
    snprintf(ref, sizeof ref, "%s/ref", root);
    snprintf(ref_ckpt, sizeof ref_ckpt, "%s/checkpoint", ref);
    snprintf(ref_final, sizeof ref_final, "%s/step-%d/" GT_CHECKPOINT_TENSOR_FILE, ref_ckpt, STEPS);
    snprintf(out_path, sizeof out_path, "%s/stdout.txt", root);
    snprintf(err_path, sizeof err_path, "%s/stderr.txt", root);

    /* the uninterrupted reference; its length spreads the timed kills over a whole run */
    double t0 = now_seconds();
    pid_t pid = spawn_train(binary, run_options, N_OPTIONS, ref, out_path, err_path);
    int rc = wait_child(pid, CHILD_SECONDS);
    double run_seconds = now_seconds() - t0;
    char *out = read_all(out_path, NULL);
    long long first = 0, last = 0;
    uint64_t ref_hash = 0;
    bool ok =
        rc == 0 && parse_summary(out, &first, &last, &ref_hash) && first == 1 && last == STEPS;
    EXPECT(ok, "reference run: exit %d, output:\n%s", rc, out ? out : "(none)");
    free(out);
    gt_metrics_step ref_rec[STEPS + 1]; /* the last record of each step */
    ok = ok && last_records(ref, STEPS, ref_rec, NULL);
    EXPECT(ok, "reference metrics incomplete");
    if (!ok) {
        remove_tree(root);
        return gt_test_finish();
    }
    printf("reference: %.3f s, params xxh64 %016llx\n", run_seconds, (unsigned long long)ref_hash);

    uint64_t rng = SEED;
    int planted = 0;
    for (int r = 0; r < ROUNDS; r++) {
        char dump[128], ckpt[256];
        snprintf(dump, sizeof dump, "%s/round%d", root, r);
        snprintf(ckpt, sizeof ckpt, "%s/checkpoint", dump);
        pid_t dead_pid = 0;
        for (int k = 0; k < KILLS_PER_ROUND; k++) {
            /* kinds in turn: delay, write, delay, prune, ... */
            int slot = r * KILLS_PER_ROUND + k;
            kill_point kp = {.kind = slot % 2 == 0   ? KILL_AFTER_DELAY
                                     : slot % 4 == 1 ? KILL_IN_WRITE
                                                     : KILL_IN_PRUNE};
            kp.delay = uniform(&rng) * 1.1 * run_seconds;
            kp.step = 2 + 2 * (long long)(uniform(&rng) * STEPS / 2);
            const char *what = run_and_kill(binary, dump, ckpt, out_path, err_path, kp, &dead_pid);
            int64_t latest = GT_CHECKPOINT_NONE;
            gt_error err = {0};
            EXPECT_OK(gt_checkpoint_find_latest(ckpt, &latest, &err), &err);
            printf("round %d kill %d (%s", r, k, kind_names[kp.kind]);
            if (kp.kind == KILL_AFTER_DELAY) printf(" %.1f ms", 1e3 * kp.delay);
            if (kp.kind == KILL_IN_WRITE) printf(" of step >= %lld", kp.step);
            printf("): %s; latest complete checkpoint %lld\n", what, (long long)latest);
        }

        /* the last complete checkpoint passes the full validation */
        int64_t latest = GT_CHECKPOINT_NONE;
        gt_error err = {0};
        EXPECT_OK(gt_checkpoint_find_latest(ckpt, &latest, &err), &err);
        if (latest != GT_CHECKPOINT_NONE) {
            gt_checkpoint_info info;
            gt_status st = gt_checkpoint_load(ckpt, latest, NULL, 0, NULL, NULL, &info, &err);
            EXPECT(st == GT_OK, "round %d: checkpoint %lld does not load: %s", r, (long long)latest,
                   err.msg);
            if (st == GT_OK) {
                EXPECT(info.step == latest, "manifest step %lld in step-%lld", (long long)info.step,
                       (long long)latest);
                gt_checkpoint_info_free(&info);
            }
        }
        if (latest < STEPS) {
            plant_torn_write(ckpt, latest, dead_pid);
            planted++;
        }

        /* resume to the end */
        pid = spawn_train(binary, run_options, N_OPTIONS, dump, out_path, err_path);
        rc = wait_child(pid, CHILD_SECONDS);
        EXPECT(rc == 0, "round %d: the resumed run exited with %d (stderr in %s)", r, rc, err_path);
        out = read_all(out_path, NULL);
        long long expect_first = latest == GT_CHECKPOINT_NONE ? 1 : latest + 1;
        if (expect_first > STEPS) {
            EXPECT(out && strstr(out, "nothing to train"),
                   "round %d: resuming at the last step should train nothing:\n%s", r,
                   out ? out : "(none)");
        } else {
            uint64_t hash = 0;
            bool parsed = parse_summary(out, &first, &last, &hash);
            EXPECT(parsed && first == expect_first && last == STEPS,
                   "round %d: expected to train %lld..%d, output:\n%s", r, expect_first, STEPS,
                   out ? out : "(none)");
            EXPECT(hash == ref_hash, "round %d: params xxh64 %016llx, uninterrupted %016llx", r,
                   (unsigned long long)hash, (unsigned long long)ref_hash);
            /* the final save removed every stale .tmp-* and kept the last 3 */
            EXPECT(!has_entry(ckpt, ".tmp-", -1), "round %d: a .tmp-* directory is left in %s", r,
                   ckpt);
            int64_t *steps = NULL;
            int n = 0;
            EXPECT_OK(gt_checkpoint_list(ckpt, &steps, &n, &err), &err);
            EXPECT(n == 3 && steps[0] == STEPS - 4 && steps[2] == STEPS,
                   "round %d: %d checkpoints kept, expected steps %d, %d, %d", r, n, STEPS - 4,
                   STEPS - 2, STEPS);
            free(steps);
        }
        free(out);
        char final[512];
        snprintf(final, sizeof final, "%s/step-%d/" GT_CHECKPOINT_TENSOR_FILE, ckpt, STEPS);
        EXPECT(same_bytes(final, ref_final), "round %d: %s differs from the uninterrupted run's", r,
               final);
        gt_metrics_step rec[STEPS + 1];
        bool have = last_records(dump, STEPS, rec, NULL);
        EXPECT(have, "round %d: metrics of steps 1..%d incomplete", r, STEPS);
        for (int s = 1; have && s <= STEPS; s++)
            EXPECT(memcmp(&rec[s].loss, &ref_rec[s].loss, sizeof rec[s].loss) == 0,
                   "round %d step %d: loss %.17g, uninterrupted %.17g", r, s, rec[s].loss,
                   ref_rec[s].loss);
    }

    EXPECT(planted > 0, "no round left a checkpoint before the last step to plant a torn write");
    printf("%d of %d rounds resumed past a planted torn write\n", planted, ROUNDS);
    remove_tree(root);
    return gt_test_finish();
}
