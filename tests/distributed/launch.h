/* launch.h — what the multi-rank training tests (tests/distributed/test_*_launch.c) share: running
 * `mpiexec -np N graphtrain train ...` (or the binary alone for one rank) with every wait bounded,
 * the options of the runs they compare, comparisons of two runs' losses and checkpoints, what a
 * run that must fail left behind (exit code, time, output, metrics records), and the reading of
 * --metrics.comm_report's lines.
 *
 * The tests run directly under CTest (not under mpiexec) and start mpiexec themselves, with
 * --oversubscribe (more ranks than cores) and --allow-run-as-root when root. GT_BINARY names the
 * graphtrain program and GT_MPIEXEC the launcher (default "mpiexec"); both come from CTest.
 * Each child runs in its own process group, so a timeout kills mpiexec and every rank it
 * started. Header-only and private to these tests. */
#ifndef GT_TESTS_DISTRIBUTED_LAUNCH_H
#define GT_TESTS_DISTRIBUTED_LAUNCH_H

#include "train_child.h" /* first: it defines _GNU_SOURCE */

#include <stdarg.h>

#include "graphtrain/gt_safetensors.h"
#include "gt_test.h"

#define LAUNCH_MAX_ARGS 64

/* A command line under construction. */
typedef struct {
    char buf[LAUNCH_MAX_ARGS][320];
    int n;
} launch_cmd;

static inline void launch_add(launch_cmd *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static inline void launch_add(launch_cmd *c, const char *fmt, ...)
{
    if (c->n >= LAUNCH_MAX_ARGS - 1) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->buf[c->n++], sizeof c->buf[0], fmt, ap);
    va_end(ap);
}

static inline const char *launch_binary(void)
{
    const char *b = getenv("GT_BINARY");
    return b && b[0] ? b : NULL;
}

/* `mpiexec -np N --oversubscribe [--allow-run-as-root] BINARY train` (np == 0: the binary alone,
 * no launcher: the one-rank reference). Options are added after it with launch_add. */
static inline void launch_train(launch_cmd *c, int np)
{
    c->n = 0;
    if (np > 0) {
        const char *mpiexec = getenv("GT_MPIEXEC");
        launch_add(c, "%s", mpiexec && mpiexec[0] ? mpiexec : "mpiexec");
        launch_add(c, "-np");
        launch_add(c, "%d", np);
        launch_add(c, "--oversubscribe");
        if (geteuid() == 0) launch_add(c, "--allow-run-as-root");
    }
    launch_add(c, "%s", launch_binary());
    launch_add(c, "train");
}

/* In a forked child: stdout and stderr into out_path, then exec the command (exit 126 when the
 * output cannot be opened, 127 when the command cannot be started). */
static inline void launch_exec(launch_cmd *c, const char *out_path) __attribute__((noreturn));
static inline void launch_exec(launch_cmd *c, const char *out_path)
{
    char *argv[LAUNCH_MAX_ARGS + 1];
    for (int k = 0; k < c->n; k++)
        argv[k] = c->buf[k];
    argv[c->n] = NULL;
    int out = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (out < 0 || dup2(out, 1) < 0 || dup2(out, 2) < 0) _exit(126);
    execvp(argv[0], argv);
    _exit(127);
}

/* Runs the command with stdout and stderr into out_path; returns its exit code (128 + signal),
 * or -1 when it ran past `seconds` (then it and its process group are killed). *elapsed: the
 * wall time it took. */
static inline int launch_run(launch_cmd *c, const char *out_path, double seconds, double *elapsed)
{
    fflush(NULL);
    double t0 = now_seconds();
    pid_t pid = fork();
    if (pid == 0) {
        setpgid(0, 0);
        launch_exec(c, out_path);
    }
    if (pid < 0) return -1;
    setpgid(pid, 0);
    int rc = -1;
    for (;;) {
        int ws;
        pid_t r = waitpid(pid, &ws, WNOHANG);
        if (r == pid) {
            rc = exit_code(ws);
            break;
        }
        if (r < 0 && errno != EINTR) break;
        if (now_seconds() - t0 > seconds) {
            kill(-pid, SIGKILL);
            waitpid(pid, &ws, 0);
            break;
        }
        sleep_us(2000);
    }
    kill(-pid, SIGKILL); /* anything the launcher left behind */
    if (elapsed) *elapsed = now_seconds() - t0;
    return rc;
}

/* ---------------------------------------------------------------- the runs */

/* Every run of these tests: test flavors, fp32, synthetic data, 10 steps, seq 32, a metrics record
 * per step and a checkpoint at step 10 (and every `interval` steps).
 *
 * AdamW's epsilon is 1e-5, not the default 1e-8: at step 1 AdamW moves each parameter by
 * lr * g / (|g| + eps), so for a gradient element of size ~eps the update depends on g's last
 * bits, and two layouts — which sum partial gradients in different orders — then differ by up to
 * a percent of a step in that one element (measured: 6e-6 absolute, 1.8e-4 relative to the
 * tensor's max, in test_tiny's layers.1.attention.wo at step 1, constant after). With eps = 1e-5
 * the amplification lr / eps is bounded and the same element differs by 2e-8. */
#define LAUNCH_STEPS 10
#define LAUNCH_GLOBAL_BATCH 4

/* The options above for `steps` steps, a checkpoint every `interval`. */
static inline void launch_common_steps(launch_cmd *c, const char *flavor, const char *dump,
                                       int steps, int interval)
{
    launch_add(c, "--model.flavor=%s", flavor);
    launch_add(c, "--training.dataset=synthetic");
    launch_add(c, "--training.seq_len=32");
    launch_add(c, "--training.steps=%d", steps);
    launch_add(c, "--training.mixed_precision_param=float32");
    launch_add(c, "--optimizer.eps=1e-5");
    launch_add(c, "--metrics.log_freq=1");
    launch_add(c, "--metrics.save_jsonl=true");
    launch_add(c, "--checkpoint.enable=true");
    launch_add(c, "--checkpoint.interval=%d", interval);
    launch_add(c, "--checkpoint.keep_latest_k=0");
    launch_add(c, "--job.print_config=false");
    launch_add(c, "--job.dump_folder=%s", dump);
}

static inline void launch_common(launch_cmd *c, const char *flavor, const char *dump, int interval)
{
    launch_common_steps(c, flavor, dump, LAUNCH_STEPS, interval);
}

/* A mesh: dp_replicate x dp_shard x tp ranks. */
typedef struct {
    const char *name;
    int rep, shard, tp;
} launch_layout;

static inline int launch_ranks(const launch_layout *l)
{
    return l->rep * l->shard * l->tp;
}

/* The run of `flavor` on layout l (NULL: one rank) with the same global batch, under
 * `mpiexec -np np` (np 0: the binary alone). */
static inline void launch_layout_run_np(launch_cmd *c, const launch_layout *l, int np,
                                        const char *flavor, const char *dump, int interval)
{
    launch_train(c, np);
    launch_common(c, flavor, dump, interval);
    int dp = l ? l->rep * l->shard : 1;
    launch_add(c, "--training.local_batch_size=%d", LAUNCH_GLOBAL_BATCH / dp);
    if (!l) return;
    launch_add(c, "--parallelism.data_parallel_replicate_degree=%d", l->rep);
    launch_add(c, "--parallelism.data_parallel_shard_degree=%d", l->shard);
    launch_add(c, "--parallelism.tensor_parallel_degree=%d", l->tp);
}

/* The same with as many processes as the layout has ranks. */
static inline void launch_layout_run(launch_cmd *c, const launch_layout *l, const char *flavor,
                                     const char *dump, int interval)
{
    launch_layout_run_np(c, l, l ? launch_ranks(l) : 0, flavor, dump, interval);
}

/* The "pipeline state" line of a pipeline run's output: the bytes of state each of its `degree`
 * ranks holds into held[], and those of the mesh rank without the pipeline into *whole (-1 when
 * the line lacks them); false when there is no such line or it lacks a rank. */
static inline bool launch_pp_state(const char *out, int degree, long long *held, long long *whole)
{
    const char *line = out ? strstr(out, "pipeline state (") : NULL;
    if (!line) return false;
    const char *p = line;
    for (int r = 0; r < degree; r++) {
        char key[32];
        snprintf(key, sizeof key, "rank %d ", r);
        p = strstr(p, key);
        if (!p) return false;
        held[r] = strtoll(p + strlen(key), NULL, 10);
    }
    const char *w = strstr(line, "without the pipeline ");
    *whole = w ? strtoll(w + strlen("without the pipeline "), NULL, 10) : -1;
    return true;
}

/* ---------------------------------------------------------------- comparisons */

static inline double launch_relative(double a, double b)
{
    double m = fmax(fabs(a), fabs(b));
    return m == 0 ? 0 : fabs(a - b) / m;
}

/* The largest relative loss difference over steps first..last of two runs' records. */
static inline double launch_loss_diff(const gt_metrics_step *a, const gt_metrics_step *b, int first,
                                      int last)
{
    double worst = 0;
    for (int s = first; s <= last; s++)
        worst = fmax(worst, launch_relative(a[s].loss, b[s].loss));
    return worst;
}

/* Every parameter (tensors not named "optim.*") of two model.safetensors: the largest
 * max|a - b| / max|a| over the tensors; *missing counts parameters absent from b or of another
 * shape. Returns -1 when a file cannot be read. */
static inline double launch_params_diff(const char *path_a, const char *path_b, int *missing)
{
    gt_safetensors a, b;
    gt_error err = {0};
    *missing = 0;
    if (gt_safetensors_open(path_a, &a, &err) != GT_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return -1;
    }
    if (gt_safetensors_open(path_b, &b, &err) != GT_OK) {
        fprintf(stderr, "%s\n", err.msg);
        gt_safetensors_close(&a);
        return -1;
    }
    double worst = 0;
    for (int k = 0; k < a.n_entries; k++) {
        const char *name = a.entries[k].name;
        if (!strncmp(name, "optim.", 6)) continue;
        gt_tensor ta, tb;
        if (gt_safetensors_get(&a, name, &ta, &err) != GT_OK) {
            (*missing)++;
            continue;
        }
        if (gt_safetensors_get(&b, name, &tb, &err) != GT_OK) {
            (*missing)++;
            gt_tensor_free(&ta);
            continue;
        }
        int64_t n = gt_tensor_numel(&ta);
        if (n != gt_tensor_numel(&tb)) {
            (*missing)++;
        } else {
            double diff = 0, scale = 0;
            for (int64_t i = 0; i < n; i++) {
                double x = gt_tensor_get_f32(&ta, i), y = gt_tensor_get_f32(&tb, i);
                diff = fmax(diff, fabs(x - y));
                scale = fmax(scale, fabs(x));
            }
            worst = fmax(worst, scale > 0 ? diff / scale : diff);
        }
        gt_tensor_free(&ta);
        gt_tensor_free(&tb);
    }
    gt_safetensors_close(&a);
    gt_safetensors_close(&b);
    return worst;
}

/* DUMP/checkpoint/step-N/model.safetensors */
static inline void launch_ckpt_path(char *buf, size_t n, const char *dump, int step)
{
    snprintf(buf, n, "%s/checkpoint/step-%d/model.safetensors", dump, step);
}

/* Prints the tail of a run's output (for a failing check). */
static inline void launch_show_tail(const char *out_path)
{
    size_t len = 0;
    char *text = read_all(out_path, &len);
    if (!text) return;
    size_t from = len > 3000 ? len - 3000 : 0;
    fprintf(stderr, "---- last output of %s:\n%s\n----\n", out_path, text + from);
    free(text);
}

/* A fresh temporary folder (removed first if it exists). */
static inline void launch_temp_dir(char *buf, size_t n, const char *base, const char *name)
{
    snprintf(buf, n, "%s/%s", base, name);
    remove_tree(buf);
    mkdir(buf, 0777);
}

/* The start of every launch test: false (after saying why) when GT_BINARY is not set, else base
 * is a fresh /tmp/NAME_PID for the runs' folders. */
static inline bool launch_begin(char *base, size_t n, const char *name)
{
    if (!launch_binary()) {
        fprintf(stderr, "GT_BINARY is not set (CTest sets it to the graphtrain program)\n");
        return false;
    }
    snprintf(base, n, "/tmp/%s_%d", name, (int)getpid());
    remove_tree(base);
    mkdir(base, 0777);
    return true;
}

static int launch_trim_entry(const char *path, const struct stat *sb, int type, struct FTW *ftw)
{
    (void)ftw;
    if (type == FTW_F && sb->st_size > (1 << 20)) remove(path);
    return 0;
}

/* The end of every launch test: its folder is removed when the test passed. After a failure the
 * runs' logs stay for a look, but no file above 1 MiB (checkpoints, artifacts, exports), so
 * failing runs cannot fill /tmp; GT_KEEP=1 keeps everything. */
static inline void launch_end(const char *base)
{
    if (getenv("GT_KEEP")) {
        printf("GT_KEEP: kept %s\n", base);
    } else if (gt_test_failed_ == 0) {
        remove_tree(base);
    } else {
        nftw(base, launch_trim_entry, 16, FTW_PHYS);
        printf("kept the failed runs' logs in %s (files above 1 MiB removed; GT_KEEP=1 keeps "
               "them)\n",
               base);
    }
}

/* ---------------------------------------------------------------- runs that must succeed */

#define LAUNCH_MAX_STEPS 20

/* A run's records (steps[s]: the last record of step s) and its folder; ok: it exited 0 and
 * recorded every step. */
typedef struct {
    gt_metrics_step steps[LAUNCH_MAX_STEPS + 1];
    char dump[512];
    bool ok;
} launch_result;

/* Two runs of the same steps 1..steps: the number of steps whose loss or grad_norm bits differ;
 * *same_ckpt: whether their step-`steps` checkpoints are the same bytes. */
static inline int launch_bitwise_diff(const launch_result *a, const launch_result *b, int steps,
                                      bool *same_ckpt)
{
    int differ = 0;
    for (int s = 1; s <= steps; s++)
        differ +=
            a->steps[s].loss != b->steps[s].loss || a->steps[s].grad_norm != b->steps[s].grad_norm;
    char pa[700], pb[700];
    launch_ckpt_path(pa, sizeof pa, a->dump, steps);
    launch_ckpt_path(pb, sizeof pb, b->dump, steps);
    *same_ckpt = same_bytes(pa, pb);
    return differ;
}

/* A fresh dump folder (its old contents removed) holding only a copy of src_dump's step-`step`
 * checkpoint: a resume that starts from it. */
static inline bool launch_seed_dump(const char *src_dump, const char *dump, int step)
{
    char dir[700], from[800], to[800];
    remove_tree(dump);
    mkdir(dump, 0777);
    snprintf(dir, sizeof dir, "%s/checkpoint", dump);
    mkdir(dir, 0777);
    snprintf(dir, sizeof dir, "%s/checkpoint/step-%d", dump, step);
    mkdir(dir, 0777);
    static const char *const files[] = {"model.safetensors", "manifest.json"};
    for (int k = 0; k < 2; k++) {
        snprintf(from, sizeof from, "%s/checkpoint/step-%d/%s", src_dump, step, files[k]);
        snprintf(to, sizeof to, "%s/%s", dir, files[k]);
        size_t n = 0;
        char *bytes = read_all(from, &n);
        FILE *f = bytes ? fopen(to, "wb") : NULL;
        bool ok = f && fwrite(bytes, 1, n, f) == n;
        if (f) ok = fclose(f) == 0 && ok;
        free(bytes);
        if (!ok) return false;
    }
    return true;
}

/* The last record of each step first..steps of DUMP/metrics.jsonl into out[first..]; false unless
 * each has one and no earlier step has (a resumed run starts after its checkpoint). */
static inline bool launch_records_from(const char *dump, int first, int steps, gt_metrics_step *out)
{
    gt_metrics_log log = {0};
    if (!read_metrics(dump, &log)) return false;
    for (int s = 0; s <= steps; s++)
        out[s].step = 0;
    for (int64_t k = 0; k < log.n_steps; k++) {
        int64_t s = log.steps[k].step;
        if (s >= 1 && s <= steps) out[s] = log.steps[k];
    }
    gt_metrics_log_free(&log);
    bool ok = true;
    for (int s = 1; s <= steps; s++)
        ok = ok && (s < first ? out[s].step == 0 : out[s].step == s);
    return ok;
}

/* A finished run whose output is at out_path and folder at dump: the records of steps
 * first..steps into r, *hash the final hash (0 when the output names none); r->ok when the output
 * says it trained exactly those steps and each has its record (else the output's tail is shown). */
static inline bool launch_collect(const char *out_path, const char *dump, int first, int steps,
                                  launch_result *r, uint64_t *hash)
{
    snprintf(r->dump, sizeof r->dump, "%s", dump);
    char *out = read_all(out_path, NULL);
    long long f = 0, l = 0;
    r->ok = out && parse_summary(out, &f, &l, hash) && f == first && l == steps &&
            launch_records_from(dump, first, steps, r->steps);
    if (!r->ok) launch_show_tail(out_path);
    free(out);
    return r->ok;
}

/* Runs c (at most `seconds`) with its output into DUMP.txt; the records of steps first..steps
 * into r, *hash the final hash (0 when the run names none). */
static inline bool launch_run_from(launch_cmd *c, const char *dump, int first, int steps,
                                   double seconds, launch_result *r, uint64_t *hash)
{
    char out_path[600];
    snprintf(out_path, sizeof out_path, "%s.txt", dump);
    double dt = 0;
    int rc = launch_run(c, out_path, seconds, &dt);
    printf("%-48s exit %d, %.1f s\n", dump, rc, dt);
    if (rc != 0) {
        snprintf(r->dump, sizeof r->dump, "%s", dump);
        launch_show_tail(out_path);
        return r->ok = false;
    }
    return launch_collect(out_path, dump, first, steps, r, hash);
}

/* Steps first..steps of r against ref: losses and grad norms bitwise, the last checkpoint's
 * bytes, and the hash when given. */
static inline void launch_compare_from(const char *name, const launch_result *ref,
                                       uint64_t ref_hash, const launch_result *r, uint64_t hash,
                                       int first, int steps)
{
    int differ = 0;
    for (int s = first; s <= steps; s++)
        differ += ref->steps[s].loss != r->steps[s].loss ||
                  ref->steps[s].grad_norm != r->steps[s].grad_norm;
    char pa[700], pb[700];
    launch_ckpt_path(pa, sizeof pa, ref->dump, steps);
    launch_ckpt_path(pb, sizeof pb, r->dump, steps);
    bool same_ckpt = same_bytes(pa, pb);
    EXPECT(differ == 0, "%s: %d of steps %d..%d differ from the reference's", name, differ, first,
           steps);
    EXPECT(hash == ref_hash, "%s: params xxh64 %016llx, the reference's %016llx", name,
           (unsigned long long)hash, (unsigned long long)ref_hash);
    EXPECT(same_ckpt, "%s: the step-%d checkpoint differs from the reference's", name, steps);
    printf("  %-30s loss %d..%d and grad_norm bitwise: %s; hash %016llx; checkpoint %s\n", name,
           first, steps, differ ? "NO" : "yes", (unsigned long long)hash,
           same_ckpt ? "same" : "DIFFERS");
}

/* The records of steps 6..LAUNCH_STEPS of a run resumed from the step-5 checkpoint into
 * out[6..]; false unless each of those steps has a record and steps 1..5 have none (the resumed
 * run started at step 6). */
static inline bool launch_resumed_records(const char *dump, gt_metrics_step *out)
{
    gt_metrics_log log = {0};
    if (!read_metrics(dump, &log)) return false;
    for (int s = 0; s <= LAUNCH_STEPS; s++)
        out[s].step = 0;
    for (int64_t k = 0; k < log.n_steps; k++) {
        int64_t s = log.steps[k].step;
        if (s >= 1 && s <= LAUNCH_STEPS) out[s] = log.steps[k];
    }
    gt_metrics_log_free(&log);
    bool ok = true;
    for (int s = 1; s <= LAUNCH_STEPS; s++)
        ok = ok && (s <= 5 ? out[s].step == 0 : out[s].step == s);
    return ok;
}

/* ---------------------------------------------------------------- runs that must fail */

/* EXPECT, and `ok` (a local of the caller) remembers a failure. */
#define LAUNCH_CHECK(cond, ...)                                                                    \
    do {                                                                                           \
        EXPECT(cond, __VA_ARGS__);                                                                 \
        ok = ok && (cond);                                                                         \
    } while (0)

/* How a run ended. */
typedef struct {
    int rc;         /* exit code; -1: still running at the bound (then killed) */
    double seconds; /* wall time */
    char *out;      /* everything the run printed (never NULL) */
    char dump[512]; /* its --job.dump_folder (set by the caller) */
    int records;    /* DUMP/metrics.jsonl records (0 without the file) */
} launch_outcome;

/* Runs c with its output into out_path, bounded by `seconds`, and fills o (but o->dump). */
static inline void launch_run_outcome(launch_cmd *c, const char *out_path, double seconds,
                                      launch_outcome *o)
{
    o->rc = launch_run(c, out_path, seconds, &o->seconds);
    o->out = read_all(out_path, NULL);
    if (!o->out) o->out = calloc(1, 1);
    gt_metrics_log log = {0};
    char mpath[600];
    snprintf(mpath, sizeof mpath, "%s/metrics.jsonl", o->dump);
    gt_error err = {0};
    o->records = gt_metrics_read(mpath, &log, &err) == GT_OK ? (int)log.n_steps : 0;
    gt_metrics_log_free(&log);
}

/* Frees o's output, printing it first when `show` (a check failed). */
static inline void launch_outcome_free(launch_outcome *o, bool show)
{
    if (show) fprintf(stderr, "---- output:\n%s\n----\n", o->out);
    free(o->out);
    o->out = NULL;
}

/* ---------------------------------------------------------------- --metrics.comm_report */

/* One line of the report: "  # kind mesh-dim bytes total-ms exposed-ms exposed% lo-hi rR" (lo
 * and hi: the least and most exposed ms over the ranks, R the rank of the most; -1 when the line
 * has no such columns). */
typedef struct {
    int index;
    char kind[32], dim[32];
    unsigned long long bytes;
    double total, exposed; /* ms */
    double lo, hi;
    int at;
} launch_report_row;

typedef struct {
    int scheduled;  /* N of "collective schedule: N" (-1: no such line) */
    int listed;     /* N of "collective report (rank 0, one step): N" (-1: no report) */
    int totals;     /* the sum of the per-kind "total KIND N collectives" lines */
    int rank_lines; /* "rank R: exposed X ms ..." lines (one per rank but 0) */
    int n_rows;
    launch_report_row *rows; /* the report's lines, in order (malloc'd) */
} launch_comm_report;

/* Reads rank 0's collective report out of a run's output (text may be NULL). Lines of the report
 * are read up to its closing "communication ..." line; other lines among them (the column header,
 * other ranks' output) are passed over. */
static inline void launch_read_comm_report(const char *text, launch_comm_report *r)
{
    memset(r, 0, sizeof *r);
    r->scheduled = r->listed = -1;
    const char *p = text ? strstr(text, "collective schedule: ") : NULL;
    if (p) sscanf(p, "collective schedule: %d", &r->scheduled);
    p = text ? strstr(text, "collective report (rank 0, one step): ") : NULL;
    if (p) sscanf(p, "collective report (rank 0, one step): %d", &r->listed);
    int cap = 0;
    for (const char *q = p ? strchr(p, '\n') : NULL; q && *q; q = strchr(q + 1, '\n')) {
        launch_report_row row;
        row.lo = row.hi = -1;
        row.at = -1;
        if (sscanf(q + 1, " %d %31s %31s %llu %lf %lf %*f%% %lf-%lf r%d", &row.index, row.kind,
                   row.dim, &row.bytes, &row.total, &row.exposed, &row.lo, &row.hi, &row.at) >= 6) {
            if (r->n_rows == cap) {
                cap = cap ? 2 * cap : 64;
                r->rows = gt_xrealloc(r->rows, (size_t)cap * sizeof *r->rows);
            }
            r->rows[r->n_rows++] = row;
            continue;
        }
        int count;
        char kind[32];
        if (sscanf(q + 1, " total %31s %d collectives", kind, &count) == 2) {
            r->totals += count;
            continue;
        }
        int rank;
        double ms;
        if (sscanf(q + 1, " rank %d: exposed %lf ms", &rank, &ms) == 2) {
            r->rank_lines++;
            continue;
        }
        if (strstr(q + 1, "communication ") == q + 1 + strspn(q + 1, " ")) break;
    }
}

static inline void launch_comm_report_free(launch_comm_report *r)
{
    free(r->rows);
    r->rows = NULL;
    r->n_rows = 0;
}

#endif
