/* train_child.h — helpers shared by the training tests (tests/numerics/test_train_*.c): temporary
 * folders, whole files, `graphtrain train` as a child process with every wait bounded, the CLI's
 * summary line, and the per-step records of a run's metrics.jsonl.
 *
 * Header-only and private to the tests: every function is static inline, so a test that uses only
 * some of them still compiles warning-free. nftw needs _GNU_SOURCE before the first system header:
 * define it at the top of the test (as the tests do) or include this header first. */
#ifndef GT_TRAIN_CHILD_H
#define GT_TRAIN_CHILD_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* nftw */
#endif
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "graphtrain/gt_config.h"
#include "graphtrain/gt_metrics.h"

/* A test's start: the graphtrain program (GT_BINARY, which CTest sets) and a fresh folder made
 * from root ("/tmp/name_XXXXXX", rewritten in place); NULL, with the reason on stderr, when
 * either is missing. */
static inline const char *train_child_start(char *root)
{
    const char *binary = getenv("GT_BINARY");
    if (!binary || !binary[0]) {
        fprintf(stderr, "GT_BINARY must name the graphtrain program (CTest sets it)\n");
        return NULL;
    }
    if (!mkdtemp(root)) {
        fprintf(stderr, "mkdtemp %s: %s\n", root, strerror(errno));
        return NULL;
    }
    return binary;
}

/* The config of spawn_train's options ("section.key=value") with job.dump_folder = dump, for
 * the same run in the test's own process (gt_train); validated. */
static inline gt_status train_child_config(gt_config *cfg, const char *const *options, int n,
                                           const char *dump, gt_error *err)
{
    gt_config_defaults(cfg);
    gt_status st = GT_OK;
    for (int k = 0; k < n && st == GT_OK; k++) {
        char name[128];
        const char *eq = strchr(options[k], '=');
        snprintf(name, sizeof name, "%.*s", eq ? (int)(eq - options[k]) : 0, options[k]);
        st = gt_config_set(cfg, name, eq ? eq + 1 : "", err);
    }
    if (st == GT_OK) st = gt_config_set(cfg, "job.dump_folder", dump, err);
    if (st == GT_OK) st = gt_config_validate(cfg, err);
    return st;
}

/* spawn_train takes at most this many options. */
#define TRAIN_CHILD_MAX_OPTIONS 32

/* ---------------------------------------------------------------- files */

static inline int train_child_remove_entry(const char *path, const struct stat *sb, int flag,
                                           struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

/* Removes path and everything below it (links are removed, not followed). */
static inline void remove_tree(const char *path)
{
    nftw(path, train_child_remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* The whole file, NUL-terminated (NULL if unreadable); its length in *len when len is not NULL. */
static inline char *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 4096, n = 0, got;
    char *buf = malloc(cap);
    while ((got = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += got;
        if (cap - n - 1 == 0) buf = realloc(buf, cap *= 2);
    }
    fclose(f);
    buf[n] = 0;
    if (len) *len = n;
    return buf;
}

/* Whether both files can be read and hold the same bytes. */
static inline bool same_bytes(const char *path_a, const char *path_b)
{
    size_t na = 0, nb = 0;
    char *a = read_all(path_a, &na), *b = read_all(path_b, &nb);
    bool same = a && b && na == nb && memcmp(a, b, na) == 0;
    free(a);
    free(b);
    return same;
}

/* ---------------------------------------------------------------- child processes */

static inline double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline void sleep_us(long us)
{
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

/* Starts `BINARY COMMAND --OPTION...` (options as `section.key=value`), stdout and stderr to files.
 * Returns the child's pid, or <= 0 when it could not be started. */
static inline pid_t spawn_graphtrain(const char *binary, const char *command,
                                     const char *const *options, int n_options,
                                     const char *out_path, const char *err_path)
{
    if (n_options < 0 || n_options > TRAIN_CHILD_MAX_OPTIONS + 1) return -1;
    char *argv[TRAIN_CHILD_MAX_OPTIONS + 4];
    char opts[TRAIN_CHILD_MAX_OPTIONS + 1][512];
    int a = 0;
    argv[a++] = (char *)binary;
    argv[a++] = (char *)command;
    for (int k = 0; k < n_options; k++) {
        snprintf(opts[k], sizeof opts[k], "--%s", options[k]);
        argv[a++] = opts[k];
    }
    argv[a] = NULL;
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        int out = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int err = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (out < 0 || err < 0 || dup2(out, 1) < 0 || dup2(err, 2) < 0) _exit(126);
        execv(binary, argv);
        _exit(127);
    }
    return pid;
}

/* Starts `BINARY train --OPTION... --job.dump_folder=DUMP` (spawn_graphtrain). */
static inline pid_t spawn_train(const char *binary, const char *const *options, int n_options,
                                const char *dump, const char *out_path, const char *err_path)
{
    if (n_options < 0 || n_options > TRAIN_CHILD_MAX_OPTIONS) return -1;
    const char *all[TRAIN_CHILD_MAX_OPTIONS + 1];
    char dump_opt[512];
    for (int k = 0; k < n_options; k++)
        all[k] = options[k];
    snprintf(dump_opt, sizeof dump_opt, "job.dump_folder=%s", dump);
    all[n_options] = dump_opt;
    return spawn_graphtrain(binary, "train", all, n_options + 1, out_path, err_path);
}

/* The exit code in a waitpid status; 128 + signal when a signal ended the child. */
static inline int exit_code(int ws)
{
    return WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
}

/* Waits for the child at most `seconds`; on timeout kills it. Returns its exit code, 128 + signal
 * when a signal ended it, -1 on timeout. */
static inline int wait_child(pid_t pid, double seconds)
{
    double deadline = now_seconds() + seconds;
    for (;;) {
        int ws;
        pid_t r = waitpid(pid, &ws, WNOHANG);
        if (r == pid) return exit_code(ws);
        if (r < 0 && errno != EINTR) return -1;
        if (now_seconds() > deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, &ws, 0);
            return -1;
        }
        sleep_us(1000);
    }
}

/* Runs `graphtrain train` with options into dump, at most `seconds`; *out gets its stdout then
 * stderr (malloc'd). Returns wait_child's code. */
static inline int train_child_run(const char *binary, const char *const *opts, int n,
                                  const char *dump, double seconds, char **out)
{
    char out_path[600], err_path[600];
    snprintf(out_path, sizeof out_path, "%s.out", dump);
    snprintf(err_path, sizeof err_path, "%s.err", dump);
    pid_t pid = spawn_train(binary, opts, n, dump, out_path, err_path);
    int rc = pid > 0 ? wait_child(pid, seconds) : -1;
    char *o = read_all(out_path, NULL), *e = read_all(err_path, NULL);
    size_t len = (o ? strlen(o) : 0) + (e ? strlen(e) : 0) + 1;
    *out = malloc(len);
    snprintf(*out, len, "%s%s", o ? o : "", e ? e : "");
    free(o);
    free(e);
    return rc;
}

/* The last 3000 characters of a run's output on stderr (a failed check's context). */
static inline void train_child_show_tail(const char *text)
{
    size_t n = strlen(text);
    fprintf(stderr, "--- output (tail) ---\n%s\n", n > 3000 ? text + n - 3000 : text);
}

/* Parses "trained steps A..B: ...; params xxh64 H" from the CLI's stdout. */
static inline bool parse_summary(const char *text, long long *first, long long *last,
                                 uint64_t *hash)
{
    const char *p = text ? strstr(text, "trained steps ") : NULL;
    const char *h = p ? strstr(p, "params xxh64 ") : NULL;
    unsigned long long hv;
    if (!p || !h || sscanf(p, "trained steps %lld..%lld:", first, last) != 2 ||
        sscanf(h, "params xxh64 %llx", &hv) != 1)
        return false;
    *hash = hv;
    return true;
}

/* ---------------------------------------------------------------- metrics */

/* Reads DUMP/metrics.jsonl into *log (the caller frees it); prints the error when it cannot. */
static inline bool read_metrics(const char *dump, gt_metrics_log *log)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dump);
    gt_error err = {0};
    if (gt_metrics_read(path, log, &err) == GT_OK) return true;
    fprintf(stderr, "%s\n", err.msg);
    return false;
}

/* The last record of each step 1..steps of DUMP/metrics.jsonl into out[1..steps] (a resumed run
 * appends: the later record wins); false unless every step has one. *n_records (when not NULL):
 * the number of records in the file. */
static inline bool last_records(const char *dump, int steps, gt_metrics_step *out,
                                int64_t *n_records)
{
    gt_metrics_log log = {0};
    if (!read_metrics(dump, &log)) return false;
    for (int s = 1; s <= steps; s++)
        out[s].step = 0; /* not seen */
    for (int64_t k = 0; k < log.n_steps; k++) {
        int64_t s = log.steps[k].step;
        if (s >= 1 && s <= steps) out[s] = log.steps[k];
    }
    if (n_records) *n_records = log.n_steps;
    gt_metrics_log_free(&log);
    for (int s = 1; s <= steps; s++)
        if (out[s].step != s) return false;
    return true;
}

#endif
