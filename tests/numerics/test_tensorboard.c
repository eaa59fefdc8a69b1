/* test_tensorboard.c — --metrics.enable_tensorboard (issue 41, item 2): a 5-step run writes a
 * TensorBoard event file under DUMP/tb whose every step's loss is metrics.jsonl's.
 *
 * Two readers, both independent of the writer (src/train/tensorboard.c):
 *   - this file's own: the TFRecord framing (length, masked CRC32C of the length, data, masked
 *     CRC32C of the data: CRC32C computed bit by bit here, not with the writer's table), the first
 *     event's file_version "brain.Event:2", and every later event's step and "loss" simple_value,
 *     decoded from the protobuf wire format — always runs;
 *   - TensorBoard's own EventAccumulator (tools/read_tensorboard.py) when python3 and the
 *     tensorboard package are installed (pip install tensorboard); else that part is skipped with a
 *     message (CI machines are bare). */
#include "train_child.h" /* first: it defines _GNU_SOURCE */

#include <dirent.h>

#include "graphtrain/gt_metrics.h"
#include "gt_test.h"

#define STEPS 5

static uint32_t masked_crc32c_bitwise(const uint8_t *p, size_t n)
{
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++)
            c = (c >> 1) ^ (0x82f63b78u & (0u - (c & 1)));
    }
    c ^= 0xffffffffu;
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

static uint64_t le(const uint8_t *p, int bytes)
{
    uint64_t v = 0;
    for (int k = 0; k < bytes; k++)
        v |= (uint64_t)p[k] << (8 * k);
    return v;
}

/* protobuf wire format: a varint at *p (< end); false when it runs off */
static bool varint(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
    *v = 0;
    for (int shift = 0; *p < end && shift < 64; shift += 7) {
        uint8_t b = *(*p)++;
        *v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) return true;
    }
    return false;
}

/* One field: its number, wire type, and value (varint / fixed) or bytes (ptr, len). */
typedef struct {
    int field, wire;
    uint64_t v;
    const uint8_t *data;
    size_t len;
} pb_field;

static bool next_field(const uint8_t **p, const uint8_t *end, pb_field *f)
{
    uint64_t key;
    if (*p >= end || !varint(p, end, &key)) return false;
    f->field = (int)(key >> 3), f->wire = (int)(key & 7);
    switch (f->wire) {
    case 0:
        return varint(p, end, &f->v);
    case 1:
        if (end - *p < 8) return false;
        f->v = le(*p, 8), *p += 8;
        return true;
    case 5:
        if (end - *p < 4) return false;
        f->v = le(*p, 4), *p += 4;
        return true;
    case 2:
        if (!varint(p, end, &f->v) || (uint64_t)(end - *p) < f->v) return false;
        f->data = *p, f->len = (size_t)f->v, *p += f->len;
        return true;
    }
    return false;
}

/* The "loss" simple_value of a Summary, or NAN. */
static double summary_loss(const uint8_t *p, const uint8_t *end)
{
    pb_field f;
    while (next_field(&p, end, &f)) {
        if (f.field != 1 || f.wire != 2) continue;
        const uint8_t *q = f.data, *qe = f.data + f.len;
        pb_field g;
        bool is_loss = false;
        double value = NAN;
        while (next_field(&q, qe, &g)) {
            if (g.field == 1 && g.wire == 2) is_loss = g.len == 4 && !memcmp(g.data, "loss", 4);
            if (g.field == 2 && g.wire == 5) {
                uint32_t bits = (uint32_t)g.v;
                float x;
                memcpy(&x, &bits, sizeof x);
                value = x;
            }
        }
        if (is_loss) return value;
    }
    return NAN;
}

static bool find_event_file(const char *dir, char *out, size_t n)
{
    DIR *d = opendir(dir);
    if (!d) return false;
    struct dirent *e;
    bool found = false;
    while ((e = readdir(d)) && !found)
        if (strstr(e->d_name, "tfevents")) {
            snprintf(out, n, "%s/%s", dir, e->d_name);
            found = true;
        }
    closedir(d);
    return found;
}

/* this file's reader: every record's CRCs, the version event, the loss of each step */
static void check_framing(const char *path, const double *want)
{
    size_t len = 0;
    char *text = read_all(path, &len);
    EXPECT(text && len > 0, "%s: cannot read", path);
    if (!text) return;
    const uint8_t *p = (const uint8_t *)text, *end = p + len;
    int records = 0, steps_seen = 0;
    bool version = false;
    while (p < end) {
        EXPECT(end - p >= 12, "record %d: truncated header", records);
        if (end - p < 12) break;
        uint64_t n = le(p, 8);
        EXPECT((uint32_t)le(p + 8, 4) == masked_crc32c_bitwise(p, 8), "record %d: length CRC",
               records);
        EXPECT((uint64_t)(end - p) >= 16 + n, "record %d: %llu bytes of data run past the file",
               records, (unsigned long long)n);
        if ((uint64_t)(end - p) < 16 + n) break;
        const uint8_t *data = p + 12;
        EXPECT((uint32_t)le(data + n, 4) == masked_crc32c_bitwise(data, (size_t)n),
               "record %d: data CRC", records);
        /* Event */
        const uint8_t *q = data, *qe = data + n;
        pb_field f;
        int64_t step = -1;
        double loss = NAN;
        bool has_wall = false;
        while (next_field(&q, qe, &f)) {
            if (f.field == 1 && f.wire == 1) has_wall = true;
            if (f.field == 2 && f.wire == 0) step = (int64_t)f.v;
            if (f.field == 3 && f.wire == 2)
                version = records == 0 && f.len == 13 && !memcmp(f.data, "brain.Event:2", 13);
            if (f.field == 5 && f.wire == 2) loss = summary_loss(f.data, f.data + f.len);
        }
        EXPECT(q == qe, "record %d: the event does not parse to its end", records);
        EXPECT(has_wall, "record %d: no wall_time", records);
        if (records > 0) {
            EXPECT(step >= 1 && step <= STEPS, "record %d: step %lld", records, (long long)step);
            if (step >= 1 && step <= STEPS) {
                EXPECT(loss == (double)(float)want[step], "step %lld: loss %.9g, metrics %.9g",
                       (long long)step, loss, want[step]);
                steps_seen++;
            }
        }
        records++;
        p = data + n + 4;
    }
    EXPECT(version, "the first event is not file_version brain.Event:2");
    EXPECT(steps_seen == STEPS, "%d step events, want %d", steps_seen, STEPS);
    printf("framing: %d records, CRCs and %d step losses checked\n", records, steps_seen);
    free(text);
}

/* TensorBoard's reader, when installed */
static void check_with_tensorboard(const char *tb_dir, const double *want)
{
    char cmd[1500];
    snprintf(cmd, sizeof cmd, "python3 %s/tools/read_tensorboard.py '%s' 2>&1", GT_SOURCE_DIR,
             tb_dir);
    FILE *f = popen(cmd, "r");
    if (!f) {
        printf("tensorboard check skipped: cannot run python3\n");
        return;
    }
    char line[4096];
    int seen = 0;
    bool tags_line = false;
    while (fgets(line, sizeof line, f)) {
        long long step;
        double v;
        if (!strncmp(line, "tags ", 5)) tags_line = strstr(line, " loss") && strstr(line, " lr");
        if (sscanf(line, "loss %lld %lf", &step, &v) == 2 && step >= 1 && step <= STEPS) {
            EXPECT(v == (double)(float)want[step], "tensorboard: step %lld loss %.9g, metrics %.9g",
                   step, v, want[step]);
            seen++;
        }
        if (seen == 0 && !tags_line) fputs(line, stdout);
    }
    int rc = pclose(f);
    int code = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
    if (code == 3 || code == 127) {
        printf("tensorboard check skipped: python3 or the tensorboard package is missing "
               "(pip install tensorboard)\n");
        return;
    }
    EXPECT(code == 0, "tools/read_tensorboard.py exited %d", code);
    EXPECT(tags_line, "tensorboard found no loss and lr scalars");
    EXPECT(seen == STEPS, "tensorboard read %d step losses, want %d", seen, STEPS);
    printf("tensorboard's EventAccumulator read %d step losses\n", seen);
}

int main(void)
{
    char root[] = "/tmp/gt_tensorboard_XXXXXX";
    const char *binary = train_child_start(root);
    if (!binary) return 1;
    char dump[400], out_path[700], err_path[700], tb_dir[700], event_path[1000];
    snprintf(dump, sizeof dump, "%s/run", root);
    snprintf(out_path, sizeof out_path, "%s/out.txt", root);
    snprintf(err_path, sizeof err_path, "%s/err.txt", root);
    snprintf(tb_dir, sizeof tb_dir, "%s/tb", dump);
    const char *opts[] = {"model.flavor=test_tiny", "training.mixed_precision_param=float32",
                          "training.seq_len=16",    "training.local_batch_size=2",
                          "training.steps=5",       "metrics.log_freq=1",
                          "job.print_config=false", "metrics.enable_tensorboard=true"};
    pid_t pid =
        spawn_train(binary, opts, (int)(sizeof opts / sizeof opts[0]), dump, out_path, err_path);
    int rc = pid > 0 ? wait_child(pid, 300) : -1;
    EXPECT(rc == 0, "graphtrain train --metrics.enable_tensorboard=true exited %d", rc);
    if (rc != 0) {
        char *e = read_all(err_path, NULL);
        fprintf(stderr, "%s\n", e ? e : "");
        free(e);
    }
    double want[STEPS + 1];
    gt_metrics_step rec[STEPS + 1];
    bool have = rc == 0 && last_records(dump, STEPS, rec, NULL);
    EXPECT(have, "metrics.jsonl lacks steps 1..%d", STEPS);
    bool found = have && find_event_file(tb_dir, event_path, sizeof event_path);
    EXPECT(!have || found, "no events.out.tfevents.* file in %s", tb_dir);
    if (found) {
        for (int s = 1; s <= STEPS; s++)
            want[s] = rec[s].loss;
        check_framing(event_path, want);
        check_with_tensorboard(tb_dir, want);
    }
    if (!gt_test_failed_) remove_tree(root);
    return gt_test_finish();
}
