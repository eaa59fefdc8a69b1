/* metrics.c — the per-step metrics record: MFU/HFU arithmetic, peak memory, the log line, and the
 * JSON-lines metrics file (writer and validating reader). The SVG plot is in plot.c.
 *
 * The metrics file is the interface between a training run and whatever reads it later (plot,
 * scripts, a person with jq), so the reader validates every line as strictly as any other input
 * (DESIGN.md §7) and is fuzzed (tests/fuzz/fuzz_metrics_jsonl.c). */
#include "graphtrain/gt_metrics.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

/* ---------------------------------------------------------------- the fields, once */

typedef enum { FIELD_INT, FIELD_REAL } field_kind;

/* Every field of gt_metrics_step in file order. Integers must be JSON integers >= min_int; reals
 * are JSON numbers, or null for NaN/inf (see gt_metrics_format_json). */
typedef struct {
    const char *key;
    field_kind kind;
    size_t offset;
    int64_t min_int;
} field_spec;

#define INT_FIELD(name, min)                                                                       \
    {                                                                                              \
#name, FIELD_INT, offsetof(gt_metrics_step, name), min                                     \
    }
#define REAL_FIELD(name)                                                                           \
    {                                                                                              \
#name, FIELD_REAL, offsetof(gt_metrics_step, name), 0                                      \
    }
static const field_spec fields[] = {
    INT_FIELD(step, 0),
    REAL_FIELD(loss),
    REAL_FIELD(grad_norm),
    REAL_FIELD(lr),
    INT_FIELD(tokens, 0),
    REAL_FIELD(step_seconds),
    REAL_FIELD(tokens_per_second),
    REAL_FIELD(model_flops_per_step),
    REAL_FIELD(hardware_flops_per_step),
    REAL_FIELD(peak_flops),
    REAL_FIELD(mfu),
    REAL_FIELD(hfu),
    INT_FIELD(peak_memory_bytes, -1),
};
#define N_FIELDS ((int)(sizeof fields / sizeof fields[0]))

static int64_t *int_at(gt_metrics_step *m, const field_spec *f)
{
    return (int64_t *)(void *)((char *)m + f->offset);
}
static double *real_at(gt_metrics_step *m, const field_spec *f)
{
    return (double *)(void *)((char *)m + f->offset);
}
static double real_of(const gt_metrics_step *m, const field_spec *f)
{
    return *(const double *)(const void *)((const char *)m + f->offset);
}
static int64_t int_of(const gt_metrics_step *m, const field_spec *f)
{
    return *(const int64_t *)(const void *)((const char *)m + f->offset);
}

/* ---------------------------------------------------------------- arithmetic */

void gt_metrics_derive(gt_metrics_step *m)
{
    double secs = m->step_seconds;
    bool timed = secs > 0 && isfinite(secs);
    m->tokens_per_second = timed ? (double)m->tokens / secs : NAN;
    /* MFU = achieved model FLOP/s over peak FLOP/s = (flops / seconds) / peak. */
    bool peak_known = m->peak_flops > 0 && isfinite(m->peak_flops);
    m->mfu = timed && peak_known && m->model_flops_per_step > 0
                 ? m->model_flops_per_step / secs / m->peak_flops
                 : NAN;
    m->hfu = timed && peak_known && m->hardware_flops_per_step > 0
                 ? m->hardware_flops_per_step / secs / m->peak_flops
                 : NAN;
}

void gt_metrics_set_flops(gt_metrics_step *m, const gt_flops *model, const gt_flops *executed)
{
    /* Model FLOPs are what the model needs (torchtitan counts matmuls and attention only);
     * hardware FLOPs are what the machine did, recomputation and elementwise work included. */
    if (model) m->model_flops_per_step = model->matmul + model->attention;
    if (executed) m->hardware_flops_per_step = executed->total;
}

void gt_metrics_moe_model_flops(const gt_model *m, const gt_model_info *info, int64_t seq_len,
                                int64_t tokens, gt_flops *model)
{
    if (info->active_params <= 0) return;
    int64_t embedding = 0;
    for (int k = 0; k < m->n_params; k++)
        if (strstr(m->params[k].fqn, "embedding"))
            embedding += gt_shape_numel(m->params[k].ndim, m->params[k].shape);
    model->matmul = 6.0 * (double)(info->active_params - embedding) * (double)tokens;
    model->attention = info->attention_flops_per_position * (double)seq_len * (double)tokens;
}

gt_status gt_metrics_peak_rss_bytes(int64_t *out, gt_error *err)
{
    /* VmHWM ("high water mark") is the peak RSS in kB; Linux keeps it per process. */
    FILE *f = fopen("/proc/self/status", "r");
    if (f) {
        char line[256];
        long long kb = -1;
        while (fgets(line, sizeof line, f)) {
            if (strncmp(line, "VmHWM:", 6) == 0) {
                char *end;
                errno = 0;
                kb = strtoll(line + 6, &end, 10);
                if (errno || end == line + 6 || kb < 0) kb = -1;
                break;
            }
        }
        fclose(f);
        if (kb >= 0) {
            *out = (int64_t)kb * 1024;
            return GT_OK;
        }
    }
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0)
        return gt_error_set(err, GT_ERR_IO,
                            "peak memory: neither /proc/self/status VmHWM nor "
                            "getrusage is available (%s)",
                            strerror(errno));
    *out = (int64_t)ru.ru_maxrss * 1024; /* kilobytes on Linux */
    return GT_OK;
}

/* ---------------------------------------------------------------- the log line */

/* "12,345": the rounded value with thousands separators; "-" when unknown. */
static void format_grouped(double v, char *buf, size_t n)
{
    if (!isfinite(v) || v < 0 || v >= 1e18) {
        if (isfinite(v))
            snprintf(buf, n, "%.3g", v);
        else
            snprintf(buf, n, "-");
        return;
    }
    char digits[32];
    int len = snprintf(digits, sizeof digits, "%" PRId64, (int64_t)llround(v));
    char tmp[48];
    int o = 0;
    for (int i = 0; i < len; i++) {
        if (i > 0 && (len - i) % 3 == 0) tmp[o++] = ',';
        tmp[o++] = digits[i];
    }
    tmp[o] = '\0';
    snprintf(buf, n, "%s", tmp);
}

int gt_metrics_format_line(const gt_metrics_step *m, int step_digits, char *buf, size_t n)
{
    if (step_digits < 1) step_digits = 1;
    if (step_digits > 20) step_digits = 20;
    char tps[48];
    format_grouped(m->tokens_per_second, tps, sizeof tps);
    /* Field widths match typical values ("loss 5.1234", "tok/s 12,345", "step 123.4 ms") so lines
     * of one run line up without padding the common case. */
    char head[320];
    snprintf(head, sizeof head,
             "step %*" PRId64 "  loss %6.4f  grad_norm %6.4f  lr %.2e  tok/s %6s  step %5.1f ms",
             step_digits, m->step, m->loss, m->grad_norm, m->lr, tps, m->step_seconds * 1e3);
    char flops[64] = "";
    if (isfinite(m->mfu) || isfinite(m->hfu))
        snprintf(flops, sizeof flops, "  mfu %4.1f%%  hfu %4.1f%%", m->mfu * 100, m->hfu * 100);
    char mem[64] = "";
    if (m->peak_memory_bytes >= 0) {
        double b = (double)m->peak_memory_bytes;
        if (b >= 1024.0 * 1024 * 1024)
            snprintf(mem, sizeof mem, "  mem %4.2f GiB", b / (1024.0 * 1024 * 1024));
        else
            snprintf(mem, sizeof mem, "  mem %5.1f MiB", b / (1024.0 * 1024));
    }
    return snprintf(buf, n, "%s%s%s", head, flops, mem);
}

/* ---------------------------------------------------------------- JSON lines: writing */

/* The shortest "%.*g" text that strtod reads back to exactly v (v finite). -0 keeps its sign as
 * "-0.0": a bare "-0" would parse as the integer 0. */
static void format_real(double v, char *buf, size_t n)
{
    if (v == 0) {
        snprintf(buf, n, "%s", signbit(v) ? "-0.0" : "0");
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, n, "%.*g", prec, v);
        if (strtod(buf, NULL) == v) return;
    }
}

/* snprintf-style appender: keeps counting the needed length after the buffer is full. */
typedef struct {
    char *buf;
    size_t cap;
    size_t len;
} text_out;

static void out_puts(text_out *o, const char *s)
{
    size_t k = strlen(s);
    if (o->len < o->cap) {
        size_t room = o->cap - o->len - 1;
        memcpy(o->buf + o->len, s, k < room ? k : room);
        o->buf[o->len + (k < room ? k : room)] = '\0';
    }
    o->len += k;
}

int gt_metrics_format_json(const gt_metrics_step *m, char *buf, size_t n)
{
    text_out o = {buf, n, 0};
    if (n) buf[0] = '\0';
    out_puts(&o, "{");
    char num[40];
    for (int i = 0; i < N_FIELDS; i++) {
        const field_spec *f = &fields[i];
        if (i) out_puts(&o, ",");
        out_puts(&o, "\"");
        out_puts(&o, f->key);
        out_puts(&o, "\":");
        if (f->kind == FIELD_INT) {
            snprintf(num, sizeof num, "%" PRId64, int_of(m, f));
            out_puts(&o, num);
        } else if (isfinite(real_of(m, f))) {
            format_real(real_of(m, f), num, sizeof num);
            out_puts(&o, num);
        } else {
            out_puts(&o, "null");
        }
    }
    /* JSON has no NaN or infinity: say which nulls stand for which, so nothing is lost. */
    bool any = false;
    for (int i = 0; i < N_FIELDS; i++) {
        const field_spec *f = &fields[i];
        if (f->kind != FIELD_REAL || isfinite(real_of(m, f))) continue;
        double v = real_of(m, f);
        out_puts(&o, any ? ",\"" : ",\"nonfinite\":{\"");
        out_puts(&o, f->key);
        out_puts(&o, isnan(v) ? "\":\"nan\"" : v > 0 ? "\":\"inf\"" : "\":\"-inf\"");
        any = true;
    }
    if (any) out_puts(&o, "}");
    out_puts(&o, "}");
    return (int)o.len;
}

gt_status gt_metrics_writer_open(gt_metrics_writer *w, const char *path, gt_error *err)
{
    w->file = fopen(path, "a");
    w->path = NULL;
    if (!w->file)
        return gt_error_set(err, GT_ERR_IO, "metrics file %s: cannot open for appending: %s", path,
                            strerror(errno));
    w->path = gt_xstrdup(path);
    return GT_OK;
}

/* The whole of f (closed here) into *buf (the caller frees it), read to the end in chunks: the
 * file may be growing while a run writes it. */
static gt_status read_all(FILE *f, const char *path, char **buf, size_t *len, gt_error *err)
{
    size_t cap = 1 << 16, n = 0;
    char *b = gt_xmalloc(cap);
    for (;;) {
        if (n == cap) b = gt_xrealloc(b, cap *= 2);
        size_t got = fread(b + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
    }
    int read_errno = ferror(f) ? errno : 0;
    fclose(f);
    if (read_errno) {
        free(b);
        return gt_error_set(err, GT_ERR_IO, "metrics file %s: read failed: %s", path,
                            strerror(read_errno));
    }
    *buf = b;
    *len = n;
    return GT_OK;
}

/* The lines of text whose record's step is at most `last` (a line whose step cannot be read is
 * kept), into *out (malloc'd, *out_len bytes). */
static char *records_through(const char *text, size_t len, int64_t last, size_t *out_len)
{
    char *out = gt_xmalloc(len + 1);
    size_t used = 0, pos = 0;
    while (pos < len) {
        const char *nl = memchr(text + pos, '\n', len - pos);
        size_t end = nl ? (size_t)(nl - text) + 1 : len;
        const char *p = text + pos;
        static const char head[] = "{\"step\":";
        bool keep = true;
        if (end - pos > sizeof head && !memcmp(p, head, sizeof head - 1)) {
            char *stop = NULL;
            long long step = strtoll(p + sizeof head - 1, &stop, 10);
            if (stop != p + sizeof head - 1 && step > last) keep = false;
        }
        if (keep) memcpy(out + used, p, end - pos), used += end - pos;
        pos = end;
    }
    *out_len = used;
    return out;
}

gt_status gt_metrics_writer_open_resumed(gt_metrics_writer *w, const char *path, int64_t last,
                                         gt_error *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (errno == ENOENT) return gt_metrics_writer_open(w, path, err);
        return gt_error_set(err, GT_ERR_IO, "metrics file %s: cannot open: %s", path,
                            strerror(errno));
    }
    size_t len;
    char *buf;
    GT_TRY(read_all(f, path, &buf, &len, err));
    size_t kept_len = 0;
    char *kept = records_through(buf, len, last, &kept_len);
    free(buf);
    gt_status st = GT_OK;
    if (kept_len != len) { /* the records of steps after `last` go: the resumed run repeats them */
        size_t n = strlen(path) + 8;
        char *tmp = gt_xmalloc(n);
        snprintf(tmp, n, "%s.tmp", path);
        FILE *o = fopen(tmp, "wb");
        bool ok = o && fwrite(kept, 1, kept_len, o) == kept_len && fflush(o) == 0 &&
                  fsync(fileno(o)) == 0;
        int e = errno;
        if (o && fclose(o) != 0 && ok) ok = false, e = errno;
        if (ok && rename(tmp, path) != 0) ok = false, e = errno;
        if (!ok) {
            remove(tmp);
            st = gt_error_set(err, GT_ERR_IO,
                              "metrics file %s: cannot drop the records after step %lld: %s", path,
                              (long long)last, strerror(e));
        }
        free(tmp);
    }
    free(kept);
    if (st != GT_OK) return st;
    return gt_metrics_writer_open(w, path, err);
}

gt_status gt_metrics_writer_append(gt_metrics_writer *w, const gt_metrics_step *m, gt_error *err)
{
    char line[2048];
    int len = gt_metrics_format_json(m, line, sizeof line - 1);
    GT_CHECK(len > 0 && (size_t)len < sizeof line - 1); /* 13 numbers fit with room to spare */
    line[len++] = '\n';
    /* One fwrite of the whole line, then a flush: a killed run leaves whole lines behind. */
    if (fwrite(line, 1, (size_t)len, w->file) != (size_t)len || fflush(w->file) != 0)
        return gt_error_set(err, GT_ERR_IO, "metrics file %s: write of step %" PRId64 " failed: %s",
                            w->path, m->step, strerror(errno));
    return GT_OK;
}

void gt_metrics_writer_close(gt_metrics_writer *w)
{
    if (w->file) fclose(w->file);
    free(w->path);
    w->file = NULL;
    w->path = NULL;
}

/* ---------------------------------------------------------------- JSON lines: reading */

static const char *json_type_name(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "an object";
    case JSON_ARRAY:
        return "an array";
    case JSON_STRING:
        return "a string";
    case JSON_INTEGER:
        return "an integer";
    case JSON_REAL:
        return "a real number";
    case JSON_TRUE:
    case JSON_FALSE:
        return "a boolean";
    case JSON_NULL:
        return "null";
    }
    return "an unknown JSON value";
}

/* The nonfinite note of one line: which null means nan, inf or -inf. */
static gt_status parse_nonfinite(const char *name, int64_t line_no, json_t *obj, gt_metrics_step *m,
                                 gt_error *err)
{
    json_t *note = json_object_get(obj, "nonfinite");
    if (!note) return GT_OK;
    if (!json_is_object(note))
        return gt_error_set(err, GT_ERR_FORMAT,
                            "%s:%" PRId64 ": \"nonfinite\" must be an object, got %s", name,
                            line_no, json_type_name(note));
    const char *key;
    json_t *val;
    json_object_foreach(note, key, val)
    {
        const field_spec *f = NULL;
        for (int i = 0; i < N_FIELDS; i++)
            if (fields[i].kind == FIELD_REAL && strcmp(fields[i].key, key) == 0) f = &fields[i];
        if (!f)
            return gt_error_set(err, GT_ERR_FORMAT,
                                "%s:%" PRId64 ": \"nonfinite\" names \"%s\", which is not a real "
                                "metrics field",
                                name, line_no, key);
        if (!json_is_null(json_object_get(obj, key)))
            return gt_error_set(err, GT_ERR_FORMAT,
                                "%s:%" PRId64 ": \"nonfinite\" names \"%s\" but its value is not "
                                "null",
                                name, line_no, key);
        const char *s = json_string_value(val);
        double v;
        if (s && strcmp(s, "nan") == 0)
            v = NAN;
        else if (s && strcmp(s, "inf") == 0)
            v = INFINITY;
        else if (s && strcmp(s, "-inf") == 0)
            v = -INFINITY;
        else
            return gt_error_set(err, GT_ERR_FORMAT,
                                "%s:%" PRId64 ": \"nonfinite\".\"%s\" must be \"nan\", \"inf\" or "
                                "\"-inf\"",
                                name, line_no, key);
        *real_at(m, f) = v;
    }
    return GT_OK;
}

static gt_status parse_record(const char *name, int64_t line_no, const char *text, size_t len,
                              gt_metrics_step *m, gt_error *err)
{
    json_error_t jerr;
    /* Duplicate keys are refused: which of two "loss" values is meant cannot be known. */
    json_t *obj = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!obj)
        return gt_error_set(err, GT_ERR_FORMAT, "%s:%" PRId64 ": not valid JSON at column %d: %s",
                            name, line_no, jerr.column, jerr.text);
    gt_status st = GT_OK;
    if (!json_is_object(obj)) {
        st = gt_error_set(err, GT_ERR_FORMAT,
                          "%s:%" PRId64 ": expected a JSON object (one metrics record), got %s",
                          name, line_no, json_type_name(obj));
        goto done;
    }
    memset(m, 0, sizeof *m);
    for (int i = 0; i < N_FIELDS && st == GT_OK; i++) {
        const field_spec *f = &fields[i];
        json_t *v = json_object_get(obj, f->key);
        if (!v) {
            st = gt_error_set(err, GT_ERR_FORMAT, "%s:%" PRId64 ": missing field \"%s\"", name,
                              line_no, f->key);
        } else if (f->kind == FIELD_INT) {
            if (!json_is_integer(v))
                st = gt_error_set(err, GT_ERR_FORMAT,
                                  "%s:%" PRId64 ": field \"%s\" must be an integer, got %s", name,
                                  line_no, f->key, json_type_name(v));
            else if (json_integer_value(v) < f->min_int)
                st = gt_error_set(err, GT_ERR_FORMAT,
                                  "%s:%" PRId64 ": field \"%s\" must be >= %" PRId64
                                  ", got %" JSON_INTEGER_FORMAT,
                                  name, line_no, f->key, f->min_int, json_integer_value(v));
            else
                *int_at(m, f) = (int64_t)json_integer_value(v);
        } else if (json_is_number(v)) {
            *real_at(m, f) = json_number_value(v);
        } else if (json_is_null(v)) {
            *real_at(m, f) = NAN; /* the nonfinite note, if any, refines this below */
        } else {
            st = gt_error_set(err, GT_ERR_FORMAT,
                              "%s:%" PRId64 ": field \"%s\" must be a number or null, got %s", name,
                              line_no, f->key, json_type_name(v));
        }
    }
    if (st == GT_OK) st = parse_nonfinite(name, line_no, obj, m, err);
done:
    json_decref(obj);
    return st;
}

static bool is_blank(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r') return false;
    return true;
}

gt_status gt_metrics_parse(const char *name, const char *text, size_t len, gt_metrics_log *out,
                           gt_error *err)
{
    out->steps = NULL;
    out->n_steps = 0;
    int64_t cap = 0;
    int64_t line_no = 0;
    size_t pos = 0;
    while (pos < len) {
        const char *nl = memchr(text + pos, '\n', len - pos);
        size_t end = nl ? (size_t)(nl - text) : len;
        line_no++;
        if (!is_blank(text + pos, end - pos)) {
            if (out->n_steps == cap) {
                cap = cap ? 2 * cap : 64;
                out->steps = gt_xrealloc(out->steps, (size_t)cap * sizeof *out->steps);
            }
            gt_status st =
                parse_record(name, line_no, text + pos, end - pos, &out->steps[out->n_steps], err);
            if (st != GT_OK) {
                gt_metrics_log_free(out);
                return st;
            }
            out->n_steps++;
        }
        pos = end + 1;
    }
    if (out->n_steps == 0)
        return gt_error_set(err, GT_ERR_FORMAT,
                            "%s: no metrics records (the file is empty or has only blank lines); "
                            "expected one JSON object per line, as `graphtrain train` writes with "
                            "--metrics.save_jsonl",
                            name);
    return GT_OK;
}

gt_status gt_metrics_read(const char *path, gt_metrics_log *out, gt_error *err)
{
    out->steps = NULL;
    out->n_steps = 0;
    FILE *f = fopen(path, "rb");
    if (!f)
        return gt_error_set(err, GT_ERR_IO, "metrics file %s: cannot open: %s", path,
                            strerror(errno));
    size_t len;
    char *buf;
    GT_TRY(read_all(f, path, &buf, &len, err));
    gt_status st = gt_metrics_parse(path, buf, len, out, err);
    free(buf);
    return st;
}

void gt_metrics_log_free(gt_metrics_log *log)
{
    free(log->steps);
    log->steps = NULL;
    log->n_steps = 0;
}
