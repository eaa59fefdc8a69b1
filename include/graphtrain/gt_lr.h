/* gt_lr.h — the learning-rate schedule: torchtitan's linear warmup -> stable -> decay
 * (torchtitan/components/lr_scheduler.py, linear_warmup_stable_decay under LambdaLR).
 *
 * With S = training.steps, W = min(warmup_steps, S), D = round_half_even(S * decay_ratio) capped
 * at S - W (D = S - W when decay_ratio is unset) and a stable span T = S + 1 - W - D (torchtitan's
 * "virtual last step", so the last real step does not reach min_lr_factor), optimizer step t
 * (1-based; LambdaLR hands the lambda c = t - 1) gets lr * f(c):
 *   c < W:          f = (c + 1) / W
 *   c < W + T:      f = 1
 *   otherwise:      p = (c + 1 - (W + T)) / D;  f = m + (1 - m) * d(p), m = min_lr_factor,
 *                   d = 1 - p (linear), 1 - sqrt(p) (sqrt), (1 + cos(pi p)) / 2 (cosine).
 * Everything is computed in double, as Python does. */
#ifndef GRAPHTRAIN_GT_LR_H
#define GRAPHTRAIN_GT_LR_H

#include "gt_core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { GT_LR_DECAY_LINEAR = 0, GT_LR_DECAY_SQRT, GT_LR_DECAY_COSINE } gt_lr_decay;

const char *gt_lr_decay_name(gt_lr_decay d); /* "linear", "sqrt", "cosine" */
bool gt_lr_decay_from_name(const char *name, gt_lr_decay *out);

typedef struct {
    double lr;              /* optimizer.lr: the peak */
    int64_t training_steps; /* training.steps, >= 1 */
    int64_t warmup_steps;   /* lr_scheduler.warmup_steps, >= 0 (capped at training_steps) */
    bool has_decay_ratio;   /* false: decay over every step after warmup */
    double decay_ratio;     /* lr_scheduler.decay_ratio in [0, 1] */
    gt_lr_decay decay_type; /* lr_scheduler.decay_type */
    double min_lr_factor;   /* lr_scheduler.min_lr_factor in [0, 1] */
} gt_lr_config;

/* The resolved schedule (the spans above). */
typedef struct {
    double lr, min_lr_factor;
    int64_t training_steps, warmup_steps, stable_steps, decay_steps;
    gt_lr_decay decay_type;
} gt_lr_schedule;

/* Validates cfg (errors name the lr_scheduler / optimizer key) and resolves the spans. Like
 * torchtitan, a warmup longer than training, or warmup + decay longer than training, is shortened
 * with a warning, not refused. */
gt_status gt_lr_schedule_init(gt_lr_schedule *s, const gt_lr_config *cfg, gt_error *err);

/* The LambdaLR factor and the learning rate (lr * factor) of optimizer step `step` (1-based).
 * Steps 1..training_steps follow torchtitan exactly; later steps keep the final factor
 * (min_lr_factor after a decay) where torchtitan's formula would leave [0, 1]. step < 1 is a
 * caller bug (GT_CHECK). */
double gt_lr_factor(const gt_lr_schedule *s, int64_t step);
double gt_lr_at(const gt_lr_schedule *s, int64_t step);

#ifdef __cplusplus
}
#endif
#endif
