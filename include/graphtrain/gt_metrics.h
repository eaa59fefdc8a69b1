/* gt_metrics.h — training metrics: the per-step record, the log line, the JSON-lines metrics file
 * (writer and validating reader) and `graphtrain plot` (an SVG of loss and throughput curves).
 *
 * One record per log step. The trainer fills the measured fields (step, loss, grad_norm, lr,
 * tokens, step_seconds, the two FLOP counts, peak_flops, peak_memory_bytes) and calls
 * gt_metrics_derive for the rest:
 *
 *   tokens_per_second = tokens / step_seconds
 *   mfu = model_flops_per_step    / (step_seconds · peak_flops)
 *   hfu = hardware_flops_per_step / (step_seconds · peak_flops)
 *
 * FLOPs and peak refer to the same devices: per-rank FLOPs with one device's peak (as torchtitan
 * reports MFU), or world FLOPs with the world's peak. Model FLOPs are the matmul + attention FLOPs
 * of the whole-step graph before recomputation is added (torchtitan's 6·N + 12·L·H·Dh·S per token
 * when counted from the graph); hardware FLOPs are all FLOPs the executed graph performs,
 * recomputation and elementwise work included (PaLM's HFU). peak_flops is the device's dense peak,
 * e.g. 989e12 for H100/H200 bf16. On the CPU there is no honest peak: it comes from
 * `--metrics.peak_tflops` (default 0), and peak_flops == 0 means "not reported": mfu and hfu are
 * NaN, the log line leaves them out and the metrics file writes them as null. */
#ifndef GRAPHTRAIN_GT_METRICS_H
#define GRAPHTRAIN_GT_METRICS_H

#include <stdio.h>

#include "gt_core.h"
#include "gt_flops.h"
#include "gt_model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- the record */

typedef struct {
    int64_t step;                   /* 1-based optimizer step */
    double loss;                    /* mean cross-entropy of the step, nats per token */
    double grad_norm;               /* global L2 norm of the gradients before clipping */
    double lr;                      /* learning rate used by this step's update */
    int64_t tokens;                 /* tokens consumed by this step (same devices as the FLOPs) */
    double step_seconds;            /* wall time of the step */
    double tokens_per_second;       /* derived: tokens / step_seconds */
    double model_flops_per_step;    /* matmul + attention, without recomputation */
    double hardware_flops_per_step; /* everything executed, recomputation included */
    double peak_flops;              /* device peak FLOP/s; 0 = unknown, MFU/HFU not reported */
    double mfu, hfu;                /* derived: fractions (0.123 = 12.3 %); NaN if unknown */
    int64_t peak_memory_bytes;      /* process peak RSS on CPU, allocator peak on GPU; -1 unknown */
} gt_metrics_step;

/* Fills tokens_per_second, mfu and hfu from the measured fields. A non-positive step_seconds
 * gives NaN rates; peak_flops <= 0 (or a zero FLOP count) gives NaN mfu / hfu. */
void gt_metrics_derive(gt_metrics_step *m);

/* model_flops_per_step = model.matmul + model.attention (model: the graph before recomputation);
 * hardware_flops_per_step = executed.total (executed: the graph as it runs). Either may be NULL
 * to leave the field unchanged. */
void gt_metrics_set_flops(gt_metrics_step *m, const gt_flops *model, const gt_flops *executed);

/* For a mixture of experts (info->active_params > 0), model->matmul and model->attention of a
 * step of `tokens` tokens of seq_len become torchtitan's get_moe_model_nparams_and_flops count:
 * 6·(active parameters − embedding) + L·H·6·(qk + v head dims)·seq_len per token (the
 * parameters a token uses: top_k of the routed experts; "embedding" in a parameter's name is
 * torchtitan's test), so that a MoE run's MFU is torchtitan's. Dense models: unchanged. */
void gt_metrics_moe_model_flops(const gt_model *m, const gt_model_info *info, int64_t seq_len,
                                int64_t tokens, gt_flops *model);

/* Peak resident set size of this process in bytes: VmHWM of /proc/self/status, or getrusage's
 * ru_maxrss where /proc is absent. */
gt_status gt_metrics_peak_rss_bytes(int64_t *out, gt_error *err);

/* ---------------------------------------------------------------- the log line */

/* Writes one compact, aligned line (no newline), for example
 *   step  10  loss 5.1234  grad_norm 1.2345  lr 8.00e-04  tok/s 12,345  step 123.4 ms
 *   mfu 12.3%  hfu 14.0%  mem 1.23 GiB
 * (one line). step_digits pads the step number (pass the digit count of the last step so every
 * line of a run aligns). mfu/hfu are left out when not reported, mem when unknown. Returns what
 * snprintf returns: the length the full line needs. */
int gt_metrics_format_line(const gt_metrics_step *m, int step_digits, char *buf, size_t n);

/* ---------------------------------------------------------------- JSON lines */

/* One JSON object, no newline, keys in the order of gt_metrics_step:
 *   {"step":10,"loss":5.1234,...,"peak_memory_bytes":1320702443}
 * Numbers are JSON numbers, written with the fewest digits that read back to the same double.
 * JSON has no NaN or infinity: such a field is written as null and named in a note object,
 *   "nonfinite":{"mfu":"nan","loss":"inf"}   (values "nan", "inf", "-inf"),
 * which the reader uses to restore the exact value. Returns the length the text needs. */
int gt_metrics_format_json(const gt_metrics_step *m, char *buf, size_t n);

/* Appends records to a metrics file, one line each, flushed after every record so the file is
 * complete up to the last finished step even if the process is killed. */
typedef struct {
    FILE *file;
    char *path;
} gt_metrics_writer;

/* Opens path for appending (creates it): a resumed run continues the same file. */
gt_status gt_metrics_writer_open(gt_metrics_writer *w, const char *path, gt_error *err);
/* A resumed run from step `last`: the records of later steps are dropped from the file first (the
 * run repeats those steps), then it is opened for appending. */
gt_status gt_metrics_writer_open_resumed(gt_metrics_writer *w, const char *path, int64_t last,
                                         gt_error *err);
gt_status gt_metrics_writer_append(gt_metrics_writer *w, const gt_metrics_step *m, gt_error *err);
void gt_metrics_writer_close(gt_metrics_writer *w);

/* TensorBoard event files (tensorboard.c, --metrics.enable_tensorboard): TFRecords of Event
 * protobufs encoded by hand. open creates DIR (mkdir -p) and DIR/events.out.tfevents.<unix
 * seconds>.<host>.<pid> with the file_version event; append writes one event per record, step =
 * the record's step, a simple_value per scalar of metrics.jsonl (tag = its key; unknown values
 * such as MFU without a peak left out), flushed whole. */
typedef struct {
    FILE *file;
    char *path;
} gt_tb_writer;
gt_status gt_tb_writer_open(gt_tb_writer *w, const char *dir, gt_error *err);
gt_status gt_tb_writer_append(gt_tb_writer *w, const gt_metrics_step *m, gt_error *err);
void gt_tb_writer_close(gt_tb_writer *w);
/* TFRecord's checksum: CRC32C (Castagnoli) of data, masked ((c >> 15 | c << 17) + 0xa282ead8). */
uint32_t gt_tb_masked_crc32c(const void *data, size_t n);

/* The records of a metrics file, in file order (a resumed run may repeat steps). */
typedef struct {
    gt_metrics_step *steps;
    int64_t n_steps;
} gt_metrics_log;

/* Parses JSON-lines text. name (the file name) starts every error message, followed by the
 * 1-based line number: "metrics.jsonl:7: missing field \"loss\"". Every line must be an object
 * with every field of gt_metrics_step (integers for step, tokens and peak_memory_bytes; numbers
 * or null for the rest); unknown keys are ignored, blank lines skipped. A text with no record is
 * an error. On error *out is left empty. */
gt_status gt_metrics_parse(const char *name, const char *text, size_t len, gt_metrics_log *out,
                           gt_error *err);
gt_status gt_metrics_read(const char *path, gt_metrics_log *out, gt_error *err);
void gt_metrics_log_free(gt_metrics_log *log);

/* ---------------------------------------------------------------- plot */

typedef struct {
    const char *title; /* NULL: "graphtrain metrics" */
    int width;         /* pixels; 0: 900 */
    int height;        /* pixels; 0: 640 */
} gt_plot_options;

/* A standalone SVG document with two panels: loss vs step and tokens/s vs step (linear axes,
 * ticks, labels, a title). When a step appears more than once (a resumed run), its last record
 * wins; points are drawn in step order; non-finite values break the curve. *svg_out is malloc'd
 * and NUL-terminated; opt may be NULL. */
gt_status gt_metrics_plot_svg(const gt_metrics_log *log, const gt_plot_options *opt, char **svg_out,
                              gt_error *err);

/* `graphtrain plot METRICS [-o OUT.svg]`: reads metrics_path, writes svg_path (through a
 * temporary name and a rename, so a reader never sees half a file). */
gt_status gt_metrics_plot_file(const char *metrics_path, const char *svg_path,
                               const gt_plot_options *opt, gt_error *err);

#ifdef __cplusplus
}
#endif
#endif
