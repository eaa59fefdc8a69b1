/* test_train_defects.c — the defects a new user met (issue 41, item 5), each a regression test
 * that failed before its fix:
 *   - --training.dataset tokens with a folder reads every shard in name order (it failed with
 *     "cannot map 4096 bytes: No such device"), and a dataset smaller than one batch warns with
 *     the numbers;
 *   - two runs in one dump folder at once: the second is refused naming the holder;
 *   - after a resume, metrics.jsonl holds each step once (the re-run steps' old records go);
 *   - training.seq_len above the flavor's max_seq_len is refused; a step arena too large for the
 *     host names training.local_batch_size, training.seq_len and the limit;
 *   - `graphtrain tokenize --out X X` is refused (it overwrote its input);
 *   - the OS reason in the messages of `plot` on a folder and of a config that cannot be written;
 *   - the precompiled artifact's key names the graphtrain build. */
#include "train_child.h" /* first: it defines _GNU_SOURCE */

#include "graphtrain/gt_config.h"
#include "graphtrain/gt_data.h"
#include "graphtrain/gt_metrics.h"
#include "graphtrain/gt_tokenizer.h"
#include "gt_test.h"
#include "train/train_internal.h"

#define BOUND 300.0

static int run_train(const char *binary, const char *const *opts, int n, const char *dump,
                     char **out)
{
    return train_child_run(binary, opts, n, dump, BOUND, out);
}

#define TINY                                                                                       \
    "model.flavor=test_tiny", "training.mixed_precision_param=float32", "job.print_config=false",  \
        "metrics.log_freq=1"

static void test_token_folder(const char *binary, const char *root)
{
    char dir[600], path[700], dump[600];
    snprintf(dir, sizeof dir, "%s/shards", root);
    mkdir(dir, 0755);
    /* two shards of 10 tokens: 20 tokens hold 2 samples of seq_len + 1 = 9, fewer than the
     * batch of 4 */
    int32_t a[10], b[10];
    for (int k = 0; k < 10; k++)
        a[k] = k + 1, b[k] = 100 + k;
    gt_error err = {0};
    snprintf(path, sizeof path, "%s/b.bin", dir);
    EXPECT_OK(gt_token_shard_write(path, b, 10, 256, &err), &err);
    snprintf(path, sizeof path, "%s/a.bin", dir);
    EXPECT_OK(gt_token_shard_write(path, a, 10, 256, &err), &err);
    snprintf(dump, sizeof dump, "%s/folder_run", root);
    char ds[700];
    snprintf(ds, sizeof ds, "training.dataset_path=%s", dir);
    const char *opts[] = {TINY,
                          "training.dataset=tokens",
                          ds,
                          "training.seq_len=8",
                          "training.local_batch_size=4",
                          "training.steps=2"};
    char *out = NULL;
    int rc = run_train(binary, opts, (int)(sizeof opts / sizeof opts[0]), dump, &out);
    EXPECT(rc == 0, "tokens folder: exit %d", rc);
    EXPECT(strstr(out, "2 shard(s) in name order, 20 tokens"), "tokens folder: shards not named");
    EXPECT(strstr(out, "holds 2 sample(s) of seq_len + 1 = 9 tokens, fewer than one batch of 4"),
           "small dataset: no warning with the numbers");
    if (rc != 0) train_child_show_tail(out);
    free(out);
}

static void test_dump_lock(const char *binary, const char *root)
{
    char dump[600], lock[700], out_a[700], err_a[700];
    snprintf(dump, sizeof dump, "%s/shared", root);
    snprintf(lock, sizeof lock, "%s/.graphtrain.lock", dump);
    snprintf(out_a, sizeof out_a, "%s/a.out", root);
    snprintf(err_a, sizeof err_a, "%s/a.err", root);
    const char *opts[] = {TINY, "training.seq_len=8", "training.local_batch_size=2",
                          "training.steps=100000000", "metrics.log_freq=1000"};
    int n = (int)(sizeof opts / sizeof opts[0]);
    pid_t a = spawn_train(binary, opts, n, dump, out_a, err_a);
    EXPECT(a > 0, "dump lock: run A not started");
    if (a <= 0) return;
    /* A holds the lock once its outputs are open */
    bool held = false;
    for (double t0 = now_seconds(); !held && now_seconds() - t0 < BOUND; sleep_us(50000)) {
        char *text = read_all(lock, NULL);
        held = text && strstr(text, "pid");
        free(text);
        int ws;
        if (waitpid(a, &ws, WNOHANG) == a) break;
    }
    EXPECT(held, "dump lock: run A never wrote %s", lock);
    if (held) {
        char *out = NULL;
        int rc = run_train(binary, opts, n, dump, &out);
        char pid_text[64];
        snprintf(pid_text, sizeof pid_text, "pid %ld", (long)a);
        EXPECT(rc != 0, "dump lock: the second run in one folder was not refused (exit %d)", rc);
        EXPECT(strstr(out, "is in use by another run") && strstr(out, pid_text),
               "dump lock: the refusal does not name the holder (%s)", pid_text);
        if (!strstr(out, "is in use")) train_child_show_tail(out);
        free(out);
    }
    kill(a, SIGKILL);
    waitpid(a, NULL, 0);
}

static void test_resume_metrics(const char *binary, const char *root)
{
    char dump[600];
    snprintf(dump, sizeof dump, "%s/resume", root);
    const char *first[] = {TINY,
                           "training.seq_len=16",
                           "training.local_batch_size=2",
                           "training.steps=6",
                           "checkpoint.enable=true",
                           "checkpoint.interval=3"};
    const char *again[] = {TINY,
                           "training.seq_len=16",
                           "training.local_batch_size=2",
                           "training.steps=6",
                           "checkpoint.enable=true",
                           "checkpoint.interval=3",
                           "checkpoint.load_step=3"};
    char *out = NULL;
    int rc = run_train(binary, first, (int)(sizeof first / sizeof first[0]), dump, &out);
    EXPECT(rc == 0, "resume: the first run exited %d", rc);
    free(out);
    rc = run_train(binary, again, (int)(sizeof again / sizeof again[0]), dump, &out);
    EXPECT(rc == 0 && strstr(out, "trained steps 4..6"), "resume: the run from step 3 exited %d",
           rc);
    if (rc != 0) train_child_show_tail(out);
    free(out);
    gt_metrics_log log = {0};
    if (!read_metrics(dump, &log)) {
        EXPECT(false, "resume: no metrics");
        return;
    }
    int seen[7] = {0};
    for (int64_t k = 0; k < log.n_steps; k++)
        if (log.steps[k].step >= 1 && log.steps[k].step <= 6) seen[log.steps[k].step]++;
    EXPECT(log.n_steps == 6, "resume: %lld records in metrics.jsonl, expected 6 (steps 1..6 once)",
           (long long)log.n_steps);
    for (int s = 1; s <= 6; s++)
        EXPECT(seen[s] == 1, "resume: step %d has %d records", s, seen[s]);
    gt_metrics_log_free(&log);
}

static void test_seq_len(const char *binary, const char *root)
{
    char dump[600];
    snprintf(dump, sizeof dump, "%s/seq", root);
    const char *opts[] = {TINY, "training.seq_len=131073", "training.local_batch_size=1",
                          "training.steps=1"};
    char *out = NULL;
    int rc = run_train(binary, opts, (int)(sizeof opts / sizeof opts[0]), dump, &out);
    EXPECT(rc > 0 && strstr(out, "training.seq_len = 131073 is above the max_seq_len 131072"),
           "seq_len above max_seq_len: exit %d, not refused naming both", rc);
    if (!strstr(out, "max_seq_len")) train_child_show_tail(out);
    free(out);
}

static void test_arena(const char *binary, const char *root)
{
    /* a step arena of more bytes than the host has (memory and swap): the allocation fails
     * whatever the host (not under overcommit_memory = 1, where it would succeed) */
    char *mode = read_all("/proc/sys/vm/overcommit_memory", NULL);
    bool always = mode && mode[0] == '1';
    free(mode);
    if (always) {
        printf("arena: skipped (vm.overcommit_memory = 1 grants any allocation)\n");
        return;
    }
    double bytes = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    char *meminfo = read_all("/proc/meminfo", NULL);
    const char *sw = meminfo ? strstr(meminfo, "SwapTotal:") : NULL;
    long long swap_kb = 0;
    if (sw) sscanf(sw, "SwapTotal: %lld", &swap_kb);
    free(meminfo);
    bytes += 1024.0 * (double)swap_kb;
    /* test_tiny's step keeps more than 1 KiB per token (f32 logits of 256): 4 x the host */
    long long tokens = (long long)(4 * bytes / 1024);
    long long seq = 65536, batch = tokens / seq + 1;
    char dump[600], b[64], s[64];
    snprintf(dump, sizeof dump, "%s/arena", root);
    snprintf(b, sizeof b, "training.local_batch_size=%lld", batch);
    snprintf(s, sizeof s, "training.seq_len=%lld", seq);
    const char *opts[] = {TINY, b, s, "training.steps=1"};
    char *out = NULL;
    int rc = run_train(binary, opts, (int)(sizeof opts / sizeof opts[0]), dump, &out);
    EXPECT(rc > 0 && strstr(out, "cannot allocate the step arena") &&
               strstr(out, "training.local_batch_size = ") &&
               strstr(out, "training.seq_len = 65536") && strstr(out, "GiB of memory"),
           "arena: exit %d, the message does not name both options and the limit", rc);
    if (!strstr(out, "training.local_batch_size = ")) train_child_show_tail(out);
    free(out);
}

static void test_tokenize_in_place(const char *root)
{
    gt_error err = {0};
    gt_tokenizer *tok = NULL;
    EXPECT_OK(
        gt_tokenizer_load(gt_test_path("tests/fixtures/tokenizer/tokenizer.json"), &tok, &err),
        &err);
    if (!tok) return;
    char path[600];
    snprintf(path, sizeof path, "%s/input.txt", root);
    FILE *f = fopen(path, "w");
    fputs("hello world, a text that must survive\n", f);
    fclose(f);
    const char *paths[] = {path};
    gt_status st = gt_data_tokenize_to_shard(tok, paths, 1, NULL, path, NULL, &err);
    EXPECT(st != GT_OK && strstr(err.msg, "also input file 1"),
           "tokenize --out X X: not refused (%s)", err.msg);
    char *text = read_all(path, NULL);
    EXPECT(text && !strcmp(text, "hello world, a text that must survive\n"),
           "tokenize --out X X: the input was overwritten");
    free(text);
    gt_tokenizer_free(tok);
}

static void test_messages(const char *root)
{
    gt_error err = {0};
    gt_metrics_log log = {0};
    gt_status st = gt_metrics_read(root, &log, &err); /* `graphtrain plot FOLDER` */
    EXPECT(st != GT_OK && strstr(err.msg, "Is a directory"), "plot on a folder: %s", err.msg);
    gt_metrics_log_free(&log);
    gt_config cfg;
    gt_config_defaults(&cfg);
    gt_error_clear(&err);
    st = gt_config_write(&cfg, "/dev/full", &err); /* a full disk */
    EXPECT(st != GT_OK && strstr(err.msg, "No space left"), "config on a full disk: %s", err.msg);
    gt_train_layout layout;
    gt_error_clear(&err);
    EXPECT_OK(gt_train_layout_init(&cfg, 1, 0, &layout, &err), &err);
    char *key = gt_train_artifact_key(&cfg, &layout);
    EXPECT(key && strstr(key, "\ngraphtrain.build = graphtrain "),
           "the artifact key does not name the build:\n%s", key ? key : "");
    free(key);
    gt_config_free(&cfg);
}

int main(void)
{
    char root[] = "/tmp/gt_defects_XXXXXX";
    const char *binary = train_child_start(root);
    if (!binary) return 1;
    test_messages(root);
    test_tokenize_in_place(root);
    test_seq_len(binary, root);
    test_token_folder(binary, root);
    test_resume_metrics(binary, root);
    test_dump_lock(binary, root);
    test_arena(binary, root);
    remove_tree(root);
    return gt_test_finish();
}
