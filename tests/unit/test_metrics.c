/* test_metrics.c — metrics record arithmetic, the log line, the JSON-lines writer and reader.
 *
 * MFU/HFU are checked against values worked out by hand from torchtitan's FLOP formula; the log
 * line against the line the issue specifies; the JSON-lines file by a bitwise round trip (NaN and
 * infinities included) and by a table of malformed files whose errors must name the line. */
#include "graphtrain/gt_metrics.h"
#include "gt_test.h"
#include "metrics_common.h"

#include <float.h>
#include <stdint.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

static bool close_rel(double a, double b, double rel)
{
    return fabs(a - b) <= rel * fabs(b);
}

static void test_mfu_arithmetic(void)
{
    /* torchtitan's model FLOPs per token: 6·N + 12·L·H·Dh·S. A model with N = 1e9 non-embedding
     * parameters, L = 16 layers, H = 32 heads of Dh = 64, S = 2048:
     *   6e9 + 12·16·32·64·2048 = 6e9 + 805,306,368 = 6,805,306,368 FLOPs per token;
     * 8 × 2048 = 16,384 tokens per step → 111,498,139,533,312 FLOPs per step. At 0.5 s per step
     * on a 989 TFLOP/s device: MFU = 1.11498e14 / (0.5 · 989e12) = 0.22547652079537311,
     * tokens/s = 32,768. With 30 % more executed (recomputation): HFU = 0.293119477033985. */
    double per_token = 6e9 + 12.0 * 16 * 32 * 64 * 2048;
    gt_metrics_step m = {0};
    m.tokens = 8 * 2048;
    m.step_seconds = 0.5;
    m.model_flops_per_step = per_token * (double)m.tokens;
    m.hardware_flops_per_step = 1.3 * m.model_flops_per_step;
    m.peak_flops = 989e12;
    gt_metrics_derive(&m);
    EXPECT(m.model_flops_per_step == 111498139533312.0, "flops %.17g", m.model_flops_per_step);
    EXPECT(m.tokens_per_second == 32768.0, "tok/s %g", m.tokens_per_second);
    EXPECT(close_rel(m.mfu, 0.22547652079537311, 1e-14), "mfu %.17g", m.mfu);
    EXPECT(close_rel(m.hfu, 0.293119477033985, 1e-14), "hfu %.17g", m.hfu);

    /* Round numbers: 1e12 FLOPs in 0.25 s on a 1e13 FLOP/s device is 40 %. */
    gt_metrics_step r = {.tokens = 1000,
                         .step_seconds = 0.25,
                         .model_flops_per_step = 1e12,
                         .hardware_flops_per_step = 1.25e12,
                         .peak_flops = 1e13};
    gt_metrics_derive(&r);
    EXPECT(r.mfu == 0.4 && r.hfu == 0.5 && r.tokens_per_second == 4000, "%g %g %g", r.mfu, r.hfu,
           r.tokens_per_second);

    /* CPU default: peak 0 means not reported. */
    r.peak_flops = 0;
    gt_metrics_derive(&r);
    EXPECT(isnan(r.mfu) && isnan(r.hfu), "peak 0 must give NaN mfu/hfu");
    EXPECT(r.tokens_per_second == 4000, "tok/s %g", r.tokens_per_second);
    r.step_seconds = 0;
    gt_metrics_derive(&r);
    EXPECT(isnan(r.tokens_per_second), "zero step time must give NaN tok/s");

    /* From counted graph FLOPs: model = matmul + attention of the graph before recomputation,
     * hardware = everything the executed graph does. */
    gt_flops model = {.matmul = 300, .attention = 20, .other = 7, .total = 327};
    gt_flops executed = {.matmul = 400, .attention = 30, .other = 9, .total = 439};
    gt_metrics_step f = {0};
    gt_metrics_set_flops(&f, &model, &executed);
    EXPECT(f.model_flops_per_step == 320 && f.hardware_flops_per_step == 439, "%g %g",
           f.model_flops_per_step, f.hardware_flops_per_step);
    gt_metrics_set_flops(&f, NULL, &model);
    EXPECT(f.model_flops_per_step == 320 && f.hardware_flops_per_step == 327, "NULL keeps");
}

static void test_log_line(void)
{
    /* The line of the issue, value for value. 1.23 GiB = 1.23 · 2^30 bytes. */
    gt_metrics_step m = {.step = 10,
                         .loss = 5.1234,
                         .grad_norm = 1.2345,
                         .lr = 8e-4,
                         .tokens_per_second = 12345,
                         .step_seconds = 0.1234,
                         .mfu = 0.123,
                         .hfu = 0.14,
                         .peak_memory_bytes = 1320702444};
    char line[512];
    gt_metrics_format_line(&m, 3, line, sizeof line);
    const char *want = "step  10  loss 5.1234  grad_norm 1.2345  lr 8.00e-04  tok/s 12,345  "
                       "step 123.4 ms  mfu 12.3%  hfu 14.0%  mem 1.23 GiB";
    EXPECT(strcmp(line, want) == 0, "\n got  '%s'\n want '%s'", line, want);

    /* Not reported: no mfu/hfu without a peak, no mem when unknown; small memory in MiB. */
    gt_metrics_step c = m;
    c.mfu = c.hfu = NAN;
    c.peak_memory_bytes = -1;
    gt_metrics_format_line(&c, 3, line, sizeof line);
    EXPECT(!strstr(line, "mfu") && !strstr(line, "hfu") && !strstr(line, "mem"), "'%s'", line);
    c.peak_memory_bytes = 300 * 1024 * 1024 + 512 * 1024; /* 300.5 MiB */
    gt_metrics_format_line(&c, 3, line, sizeof line);
    EXPECT(strstr(line, "mem 300.5 MiB") != NULL, "'%s'", line);

    /* Thousands separators. */
    c.tokens_per_second = 1234567.4;
    gt_metrics_format_line(&c, 3, line, sizeof line);
    EXPECT(strstr(line, "tok/s 1,234,567  ") != NULL, "'%s'", line);

    /* Lines of one run align: same length and the same column for every field. */
    gt_metrics_step a = m, b = m;
    a.step = 9;
    a.loss = 5.9;
    a.tokens_per_second = 998;
    b.step = 100;
    b.tokens_per_second = 10001;
    char la[512], lb[512];
    gt_metrics_format_line(&a, 3, la, sizeof la);
    gt_metrics_format_line(&b, 3, lb, sizeof lb);
    EXPECT(strlen(la) == strlen(lb), "\n'%s'\n'%s'", la, lb);
    EXPECT(strstr(la, "loss") - la == strstr(lb, "loss") - lb &&
               strstr(la, "mem") - la == strstr(lb, "mem") - lb,
           "\n'%s'\n'%s'", la, lb);

    /* The return value is the needed length, and a small buffer is never overrun. */
    char small[16];
    int need = gt_metrics_format_line(&m, 3, small, sizeof small);
    EXPECT(need == (int)strlen(want) && strlen(small) == sizeof small - 1, "need %d", need);
}

static gt_metrics_step sample(int64_t step)
{
    gt_metrics_step m = {.step = step,
                         .loss = 10.0 / (double)(step + 1),
                         .grad_norm = 0.1 * step,
                         .lr = 8e-4 * (double)step / 7.0,
                         .tokens = 16384,
                         .step_seconds = 0.3,
                         .model_flops_per_step = 1.1e14,
                         .hardware_flops_per_step = 1.4e14,
                         .peak_flops = 989e12,
                         .peak_memory_bytes = 123456789};
    gt_metrics_derive(&m);
    return m;
}

static void test_roundtrip(void)
{
    char path[] = "/tmp/gt_test_metrics_XXXXXX";
    int fd = mkstemp(path);
    EXPECT(fd >= 0, "mkstemp");
    close(fd);
    remove(path); /* the writer creates it */

    enum { N = 9 };
    gt_metrics_step recs[N];
    for (int i = 0; i < N; i++)
        recs[i] = sample(i + 1);
    /* Values whose text form is easy to get wrong. */
    recs[1].loss = 0.1;
    recs[1].lr = 1.0 / 3.0;
    recs[2].loss = 1e-300;
    recs[2].grad_norm = 5e-324; /* the smallest denormal */
    recs[3].loss = DBL_MAX;
    recs[3].grad_norm = -0.0;
    recs[4].loss = NAN;
    recs[4].grad_norm = INFINITY;
    recs[4].lr = -INFINITY;
    recs[5].peak_flops = 0; /* CPU: mfu/hfu not reported */
    gt_metrics_derive(&recs[5]);
    recs[6].tokens_per_second = 123456789012345678.0;
    recs[7].peak_memory_bytes = -1;
    recs[8].step = INT64_MAX;
    recs[8].tokens = INT64_MAX;

    gt_error err = {0};
    gt_metrics_writer w;
    EXPECT_OK(gt_metrics_writer_open(&w, path, &err), &err);
    for (int i = 0; i < 5; i++)
        EXPECT_OK(gt_metrics_writer_append(&w, &recs[i], &err), &err);
    gt_metrics_writer_close(&w);
    /* A resumed run appends to the same file. */
    EXPECT_OK(gt_metrics_writer_open(&w, path, &err), &err);
    for (int i = 5; i < N; i++)
        EXPECT_OK(gt_metrics_writer_append(&w, &recs[i], &err), &err);
    gt_metrics_writer_close(&w);

    /* The file: N lines, each one object. */
    FILE *f = fopen(path, "r");
    char line[4096];
    int lines = 0;
    while (f && fgets(line, sizeof line, f)) {
        size_t n = strlen(line);
        EXPECT(n > 2 && line[0] == '{' && line[n - 2] == '}' && line[n - 1] == '\n', "line '%s'",
               line);
        if (lines == 4)
            EXPECT(strstr(line, "\"loss\":null") &&
                       strstr(line, "\"nonfinite\":{\"loss\":\"nan\",\"grad_norm\":\"inf\","
                                    "\"lr\":\"-inf\"}"),
                   "nonfinite line '%s'", line);
        if (lines == 1) EXPECT(strstr(line, "\"loss\":0.1,") != NULL, "shortest form '%s'", line);
        lines++;
    }
    if (f) fclose(f);
    EXPECT(lines == N, "%d lines", lines);

    gt_metrics_log log;
    EXPECT_OK(gt_metrics_read(path, &log, &err), &err);
    EXPECT(log.n_steps == N, "%lld records", (long long)log.n_steps);
    for (int i = 0; i < N && i < log.n_steps; i++)
        EXPECT(metrics_same_record(&log.steps[i], &recs[i]),
               "record %d differs after the round trip", i);
    gt_metrics_log_free(&log);
    remove(path);
}

typedef struct {
    const char *text;
    const char *want; /* substring of the error message */
} bad_case;

#define GOOD                                                                                       \
    "{\"step\":1,\"loss\":2.5,\"grad_norm\":1,\"lr\":0.001,\"tokens\":64,\"step_seconds\":0.1,"    \
    "\"tokens_per_second\":640,\"model_flops_per_step\":1e9,\"hardware_flops_per_step\":1e9,"      \
    "\"peak_flops\":0,\"mfu\":null,\"hfu\":null,\"peak_memory_bytes\":1000"
#define GOOD_LINE GOOD "}\n"

static void test_reader_errors(void)
{
    const bad_case cases[] = {
        {GOOD_LINE GOOD_LINE "{\"step\":3,\"loss\":\n", "m.jsonl:3: not valid JSON"},
        {GOOD_LINE "{\"step\":2}\n", "m.jsonl:2: missing field \"loss\""},
        {GOOD_LINE "\n\n" GOOD ",\"loss\":1}\n", "m.jsonl:4: not valid JSON"}, /* duplicate */
        {"{\"step\":1,\"loss\":\"low\"}\n", "m.jsonl:1: field \"loss\" must be a number or null"},
        {"{\"step\":1.5}\n", "m.jsonl:1: field \"step\" must be an integer, got a real number"},
        {"{\"step\":-3}\n", "m.jsonl:1: field \"step\" must be >= 0"},
        {"[1,2,3]\n", "m.jsonl:1: expected a JSON object"},
        {GOOD ",\"nonfinite\":{\"mfu\":\"huge\"}}\n", "m.jsonl:1: \"nonfinite\".\"mfu\" must be"},
        {GOOD ",\"nonfinite\":{\"loss\":\"nan\"}}\n", "m.jsonl:1: \"nonfinite\" names \"loss\""},
        {GOOD ",\"nonfinite\":{\"step\":\"nan\"}}\n", "not a real metrics field"},
        {GOOD ",\"nonfinite\":[]}\n", "m.jsonl:1: \"nonfinite\" must be an object"},
        {GOOD_LINE "garbage\n" GOOD_LINE, "m.jsonl:2: not valid JSON"},
        {GOOD_LINE GOOD "}", NULL},                  /* no final newline: fine */
        {"\r\n" GOOD "}\r\n\t \n", NULL},            /* CRLF and blank lines */
        {GOOD ",\"extra\":{\"a\":[1]}}\n", NULL},    /* unknown keys ignored */
        {"", "m.jsonl: no metrics records"},         /* empty file */
        {"\n  \n\n", "m.jsonl: no metrics records"}, /* only blank lines */
        {GOOD_LINE "{\"step\":1,\"loss\":1e999}\n", "m.jsonl:2: not valid JSON"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        gt_metrics_log log;
        gt_error err = {0};
        gt_status st =
            gt_metrics_parse("m.jsonl", cases[i].text, strlen(cases[i].text), &log, &err);
        if (!cases[i].want) {
            EXPECT(st == GT_OK && log.n_steps >= 1, "case %zu: %s", i, err.msg);
            if (st == GT_OK) {
                EXPECT(log.steps[0].loss == 2.5 && isnan(log.steps[0].mfu), "case %zu values", i);
                gt_metrics_log_free(&log);
            }
        } else {
            EXPECT(st == GT_ERR_FORMAT && strstr(err.msg, cases[i].want),
                   "case %zu: got %s '%s', want '%s'", i, gt_status_name(st), err.msg,
                   cases[i].want);
            EXPECT(log.steps == NULL && log.n_steps == 0, "case %zu leaves the log empty", i);
        }
    }

    /* Files: a missing file and an empty file name the path. */
    gt_metrics_log log;
    gt_error err = {0};
    gt_status st = gt_metrics_read("/nonexistent/dir/metrics.jsonl", &log, &err);
    EXPECT(st == GT_ERR_IO && strstr(err.msg, "/nonexistent/dir/metrics.jsonl"), "%s", err.msg);
    char path[] = "/tmp/gt_test_metrics_empty_XXXXXX";
    int fd = mkstemp(path);
    close(fd);
    gt_error_clear(&err);
    st = gt_metrics_read(path, &log, &err);
    EXPECT(st == GT_ERR_FORMAT && strstr(err.msg, path) && strstr(err.msg, "no metrics records"),
           "%s", err.msg);
    remove(path);
}

static int64_t read_vm_rss(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %lld kB", &kb) == 1) break;
    if (f) fclose(f);
    return kb * 1024;
}

static void test_peak_memory(void)
{
    gt_error err = {0};
    int64_t before = 0, after = 0;
    EXPECT_OK(gt_metrics_peak_rss_bytes(&before, &err), &err);
    /* Touch 96 MiB: the peak must cover the resident set at that moment. */
    size_t n = 96u << 20;
    volatile char *p = malloc(n);
    for (size_t i = 0; i < n; i += 4096)
        p[i] = (char)i;
    int64_t rss_now = read_vm_rss();
    EXPECT_OK(gt_metrics_peak_rss_bytes(&after, &err), &err);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    free((void *)p);
    EXPECT(before > 0 && after >= before, "peak %lld then %lld", (long long)before,
           (long long)after);
    EXPECT(after >= rss_now && after >= (int64_t)n, "peak %lld < rss %lld", (long long)after,
           (long long)rss_now);
    /* getrusage keeps the same high-water mark (in KiB), read before free touches anything. */
    double ru_bytes = (double)ru.ru_maxrss * 1024;
    EXPECT(fabs(ru_bytes - (double)after) <= 0.05 * (double)after + (4 << 20),
           "VmHWM %lld vs ru_maxrss %.0f", (long long)after, ru_bytes);
}

int main(void)
{
    test_mfu_arithmetic();
    test_log_line();
    test_roundtrip();
    test_reader_errors();
    test_peak_memory();
    return gt_test_finish();
}
