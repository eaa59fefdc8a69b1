/* fuzz_metrics_jsonl.c — libFuzzer target for the JSON-lines metrics reader (and what reads its
 * output: the log line and the SVG plot).
 *
 * Parses the input as a whole metrics file. Besides crashes, leaks and undefined behaviour
 * (ASan/UBSan), it traps on broken promises: an error that does not name the file; a successful
 * parse with no records; a record that does not survive write → read bitwise (NaN as NaN); a plot
 * that fails or holds non-numbers. */
#include "graphtrain/gt_metrics.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_NAME "fuzz-input.jsonl"

static int same_double(double a, double b)
{
    if (isnan(a) || isnan(b)) return isnan(a) && isnan(b);
    return memcmp(&a, &b, sizeof a) == 0;
}

static int same_record(const gt_metrics_step *a, const gt_metrics_step *b)
{
    return a->step == b->step && a->tokens == b->tokens &&
           a->peak_memory_bytes == b->peak_memory_bytes && same_double(a->loss, b->loss) &&
           same_double(a->grad_norm, b->grad_norm) && same_double(a->lr, b->lr) &&
           same_double(a->step_seconds, b->step_seconds) &&
           same_double(a->tokens_per_second, b->tokens_per_second) &&
           same_double(a->model_flops_per_step, b->model_flops_per_step) &&
           same_double(a->hardware_flops_per_step, b->hardware_flops_per_step) &&
           same_double(a->peak_flops, b->peak_flops) && same_double(a->mfu, b->mfu) &&
           same_double(a->hfu, b->hfu);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    gt_metrics_log log;
    gt_error err = {0};
    if (gt_metrics_parse(FUZZ_NAME, (const char *)data, size, &log, &err) != GT_OK) {
        if (!strstr(err.msg, FUZZ_NAME) || log.steps || log.n_steps) __builtin_trap();
        return 0;
    }
    if (log.n_steps < 1) __builtin_trap();
    for (int64_t i = 0; i < log.n_steps; i++) {
        char line[2048];
        int len = gt_metrics_format_json(&log.steps[i], line, sizeof line);
        if (len <= 0 || (size_t)len >= sizeof line) __builtin_trap();
        gt_metrics_log back;
        gt_error_clear(&err);
        if (gt_metrics_parse(FUZZ_NAME, line, (size_t)len, &back, &err) != GT_OK) __builtin_trap();
        if (back.n_steps != 1 || !same_record(&back.steps[0], &log.steps[i])) __builtin_trap();
        gt_metrics_log_free(&back);
        char text[512];
        if (gt_metrics_format_line(&log.steps[i], 6, text, sizeof text) <= 0) __builtin_trap();
    }
    char *svg = NULL;
    gt_error_clear(&err);
    if (gt_metrics_plot_svg(&log, NULL, &svg, &err) != GT_OK) __builtin_trap();
    if (strstr(svg, "nan") || strstr(svg, "inf") || !strstr(svg, "</svg>")) __builtin_trap();
    free(svg);
    gt_metrics_log_free(&log);
    return 0;
}
