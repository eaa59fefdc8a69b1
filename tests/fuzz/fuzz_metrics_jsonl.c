/* fuzz_metrics_jsonl.c — libFuzzer target for the JSON-lines metrics reader (and what reads its
 * output: the log line and the SVG plot).
 *
 * Parses the input as a whole metrics file. Besides crashes, leaks and undefined behaviour
 * (ASan/UBSan), it traps on broken promises: an error that does not name the file; a successful
 * parse with no records; a record that does not survive write → read bitwise (NaN as NaN); a plot
 * that fails or holds non-numbers. */
#include "graphtrain/gt_metrics.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "metrics_common.h"

#define FUZZ_NAME "fuzz-input.jsonl"

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
        if (back.n_steps != 1 || !metrics_same_record(&back.steps[0], &log.steps[i]))
            __builtin_trap();
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
