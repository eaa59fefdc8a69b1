/* metrics_common.h — the bitwise record comparison shared by the metrics tests
 * (tests/unit/test_metrics.c and the fuzz target tests/fuzz/fuzz_metrics_jsonl.c): a record that
 * goes through write → read must come back with every field the same bits (NaN as NaN).
 *
 * Header-only and private to the tests: every function is static inline. */
#ifndef GT_METRICS_COMMON_H
#define GT_METRICS_COMMON_H

#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "graphtrain/gt_metrics.h"

/* Bitwise equal, except that any NaN equals any NaN: -0.0 is not 0.0. */
static inline bool metrics_same_double(double a, double b)
{
    if (isnan(a) || isnan(b)) return isnan(a) && isnan(b);
    return memcmp(&a, &b, sizeof a) == 0;
}

/* Every field of the two records the same (doubles as metrics_same_double). */
static inline bool metrics_same_record(const gt_metrics_step *a, const gt_metrics_step *b)
{
    return a->step == b->step && a->tokens == b->tokens &&
           a->peak_memory_bytes == b->peak_memory_bytes && metrics_same_double(a->loss, b->loss) &&
           metrics_same_double(a->grad_norm, b->grad_norm) && metrics_same_double(a->lr, b->lr) &&
           metrics_same_double(a->step_seconds, b->step_seconds) &&
           metrics_same_double(a->tokens_per_second, b->tokens_per_second) &&
           metrics_same_double(a->model_flops_per_step, b->model_flops_per_step) &&
           metrics_same_double(a->hardware_flops_per_step, b->hardware_flops_per_step) &&
           metrics_same_double(a->peak_flops, b->peak_flops) &&
           metrics_same_double(a->mfu, b->mfu) && metrics_same_double(a->hfu, b->hfu);
}

#endif
