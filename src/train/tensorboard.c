/* tensorboard.c — `--metrics.enable_tensorboard`: the per-step records as TensorBoard event files,
 * written by hand (no TensorFlow, no protobuf library).
 *
 * An event file is a sequence of TFRecords:
 *   u64 length (little-endian), u32 masked CRC32C of those 8 bytes, length bytes of data,
 *   u32 masked CRC32C of the data
 * with CRC32C the Castagnoli CRC and mask(c) = ((c >> 15) | (c << 17)) + 0xa282ead8. Each record
 * is a serialized tensorflow.Event protobuf:
 *   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
 *   Summary { repeated Value value = 1; }
 *   Value   { string tag = 1; float simple_value = 2; }
 * The first event holds file_version "brain.Event:2" (what TensorBoard's reader expects), then one
 * event per logged step with a simple_value per scalar of metrics.jsonl. The file name must
 * contain "tfevents" for TensorBoard to find it. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "graphtrain/gt_metrics.h"

/* ---------------------------------------------------------------- CRC32C */

static uint32_t crc_table[256];
static bool crc_ready;

static void crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1; /* Castagnoli, reflected */
        crc_table[i] = c;
    }
    crc_ready = true;
}

uint32_t gt_tb_masked_crc32c(const void *data, size_t n)
{
    if (!crc_ready) crc_init();
    const uint8_t *p = data;
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++)
        c = crc_table[(c ^ p[i]) & 0xff] ^ (c >> 8);
    c ^= 0xffffffffu;
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

/* ---------------------------------------------------------------- protobuf, by hand */

typedef struct {
    uint8_t *p;
    size_t n, cap;
} pbuf;

static void put(pbuf *b, const void *data, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = gt_xrealloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, data, n);
    b->n += n;
}

static void put_varint(pbuf *b, uint64_t v)
{
    uint8_t out[10];
    int k = 0;
    do {
        out[k] = (uint8_t)(v & 0x7f);
        v >>= 7;
        if (v) out[k] |= 0x80;
        k++;
    } while (v);
    put(b, out, (size_t)k);
}

static void put_le(pbuf *b, uint64_t v, int bytes)
{
    uint8_t out[8];
    for (int k = 0; k < bytes; k++)
        out[k] = (uint8_t)(v >> (8 * k));
    put(b, out, (size_t)bytes);
}

/* field `field` of wire type 2 (length-delimited) */
static void put_bytes(pbuf *b, int field, const void *data, size_t n)
{
    put_varint(b, (uint64_t)field << 3 | 2);
    put_varint(b, n);
    put(b, data, n);
}

/* Summary.Value {tag, simple_value} appended to summary as its field 1 */
static void put_scalar(pbuf *summary, const char *tag, float v)
{
    pbuf value = {0};
    put_bytes(&value, 1, tag, strlen(tag));
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    put_varint(&value, 2 << 3 | 5); /* fixed32 */
    put_le(&value, bits, 4);
    put_bytes(summary, 1, value.p, value.n);
    free(value.p);
}

/* Event {wall_time, step, then file_version (field 3) or summary (field 5)} */
static void put_event_head(pbuf *ev, double wall_time, int64_t step)
{
    uint64_t bits;
    memcpy(&bits, &wall_time, sizeof bits);
    put_varint(ev, 1 << 3 | 1); /* fixed64 */
    put_le(ev, bits, 8);
    put_varint(ev, 2 << 3 | 0);
    put_varint(ev, (uint64_t)step);
}

/* ---------------------------------------------------------------- records */

static gt_status write_record(gt_tb_writer *w, const pbuf *data, gt_error *err)
{
    pbuf rec = {0};
    put_le(&rec, data->n, 8);
    put_le(&rec, gt_tb_masked_crc32c(rec.p, 8), 4);
    put(&rec, data->p, data->n);
    put_le(&rec, gt_tb_masked_crc32c(data->p, data->n), 4);
    /* one fwrite of the whole record, then a flush: a killed run leaves whole records */
    bool ok = fwrite(rec.p, 1, rec.n, w->file) == rec.n && fflush(w->file) == 0;
    free(rec.p);
    if (!ok)
        return gt_error_set(err, GT_ERR_IO, "TensorBoard event file %s: write failed: %s", w->path,
                            strerror(errno));
    return GT_OK;
}

static double wall_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

gt_status gt_tb_writer_open(gt_tb_writer *w, const char *dir, gt_error *err)
{
    memset(w, 0, sizeof *w);
    GT_TRY(gt_make_dirs(dir, err));
    char host[128] = "localhost";
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = 0;
    char name[256];
    /* TensorBoard's own naming, with the pid so that two runs in one second differ */
    snprintf(name, sizeof name, "events.out.tfevents.%lld.%s.%ld", (long long)time(NULL), host,
             (long)getpid());
    w->path = gt_path_join(dir, name);
    w->file = fopen(w->path, "wb");
    if (!w->file) {
        gt_status st = gt_error_set(err, GT_ERR_IO, "TensorBoard event file %s: cannot create: %s",
                                    w->path, strerror(errno));
        free(w->path);
        w->path = NULL;
        return st;
    }
    pbuf ev = {0};
    put_event_head(&ev, wall_seconds(), 0);
    static const char version[] = "brain.Event:2";
    put_bytes(&ev, 3, version, sizeof version - 1);
    gt_status st = write_record(w, &ev, err);
    free(ev.p);
    return st;
}

gt_status gt_tb_writer_append(gt_tb_writer *w, const gt_metrics_step *m, gt_error *err)
{
    /* metrics.jsonl's scalars (the step is the event's); values a run does not know (MFU without
     * a peak, memory -1) are left out, a non-finite loss or norm is written as it is */
    struct {
        const char *tag;
        double v;
        bool known;
    } s[] = {
        {"loss", m->loss, true},
        {"grad_norm", m->grad_norm, true},
        {"lr", m->lr, true},
        {"tokens", (double)m->tokens, true},
        {"step_seconds", m->step_seconds, isfinite(m->step_seconds)},
        {"tokens_per_second", m->tokens_per_second, isfinite(m->tokens_per_second)},
        {"model_flops_per_step", m->model_flops_per_step, isfinite(m->model_flops_per_step)},
        {"hardware_flops_per_step", m->hardware_flops_per_step,
         isfinite(m->hardware_flops_per_step)},
        {"peak_flops", m->peak_flops, m->peak_flops > 0},
        {"mfu", m->mfu, isfinite(m->mfu)},
        {"hfu", m->hfu, isfinite(m->hfu)},
        {"peak_memory_bytes", (double)m->peak_memory_bytes, m->peak_memory_bytes >= 0},
    };
    pbuf summary = {0};
    for (size_t k = 0; k < sizeof s / sizeof s[0]; k++)
        if (s[k].known) put_scalar(&summary, s[k].tag, (float)s[k].v);
    pbuf ev = {0};
    put_event_head(&ev, wall_seconds(), m->step);
    put_bytes(&ev, 5, summary.p, summary.n);
    gt_status st = write_record(w, &ev, err);
    free(ev.p);
    free(summary.p);
    return st;
}

void gt_tb_writer_close(gt_tb_writer *w)
{
    if (w->file) fclose(w->file);
    free(w->path);
    memset(w, 0, sizeof *w);
}
