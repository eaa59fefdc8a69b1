/* lr_schedule.c — torchtitan's linear warmup / stable / decay learning-rate schedule (gt_lr.h).
 *
 * The conventions matter for bitwise parity with a torchtitan run, so they are spelled out here:
 * LambdaLR evaluates its lambda at last_epoch, which is 0 when the optimizer takes its first step
 * (the constructor's initial step()) and grows by one after each; so step t uses c = t - 1.
 * torchtitan then adds the 1 back ("0-indexed step, hence + 1") in both the warmup and the decay
 * branches. Python's round() rounds half to even, which is nearbyint() under the default rounding
 * mode. */
#include <math.h>
#include <string.h>

#include "graphtrain/gt_lr.h"

const char *gt_lr_decay_name(gt_lr_decay d)
{
    switch (d) {
    case GT_LR_DECAY_LINEAR:
        return "linear";
    case GT_LR_DECAY_SQRT:
        return "sqrt";
    case GT_LR_DECAY_COSINE:
        return "cosine";
    }
    return "?";
}

bool gt_lr_decay_from_name(const char *name, gt_lr_decay *out)
{
    static const gt_lr_decay all[] = {GT_LR_DECAY_LINEAR, GT_LR_DECAY_SQRT, GT_LR_DECAY_COSINE};
    for (size_t k = 0; name && k < sizeof all / sizeof all[0]; k++) {
        if (strcmp(name, gt_lr_decay_name(all[k])) == 0) {
            if (out) *out = all[k];
            return true;
        }
    }
    return false;
}

gt_status gt_lr_schedule_init(gt_lr_schedule *s, const gt_lr_config *cfg, gt_error *err)
{
    if (!s || !cfg) return gt_error_set(err, GT_ERR_INVALID, "lr schedule: no config given");
    if (!(cfg->lr >= 0.0) || isinf(cfg->lr))
        return gt_error_set(err, GT_ERR_INVALID, "optimizer.lr must be finite and >= 0, got %g",
                            cfg->lr);
    if (cfg->training_steps < 1)
        return gt_error_set(err, GT_ERR_INVALID, "training.steps must be >= 1, got %lld",
                            (long long)cfg->training_steps);
    if (cfg->warmup_steps < 0)
        return gt_error_set(err, GT_ERR_INVALID, "lr_scheduler.warmup_steps must be >= 0, got %lld",
                            (long long)cfg->warmup_steps);
    if (cfg->has_decay_ratio && !(cfg->decay_ratio >= 0.0 && cfg->decay_ratio <= 1.0))
        return gt_error_set(err, GT_ERR_INVALID,
                            "lr_scheduler.decay_ratio must lie in [0, 1], got %g",
                            cfg->decay_ratio);
    if (!(cfg->min_lr_factor >= 0.0 && cfg->min_lr_factor <= 1.0))
        return gt_error_set(err, GT_ERR_INVALID,
                            "lr_scheduler.min_lr_factor must lie in [0, 1], got %g",
                            cfg->min_lr_factor);
    if ((unsigned)cfg->decay_type > GT_LR_DECAY_COSINE)
        return gt_error_set(err, GT_ERR_INVALID,
                            "lr_scheduler.decay_type %d is not linear, sqrt or cosine",
                            (int)cfg->decay_type);

    int64_t steps = cfg->training_steps, warmup = cfg->warmup_steps, decay;
    if (warmup > steps) {
        gt_log(GT_LOG_WARN,
               "lr_scheduler: warmup steps (%lld) exceed total training steps (%lld); using %lld",
               (long long)warmup, (long long)steps, (long long)steps);
        warmup = steps;
    }
    if (cfg->has_decay_ratio) {
        decay = (int64_t)nearbyint((double)steps * cfg->decay_ratio);
        if (warmup + decay > steps) {
            gt_log(GT_LOG_WARN,
                   "lr_scheduler: warmup (%lld) + decay (%lld) steps exceed total training steps "
                   "(%lld); using %lld decay steps",
                   (long long)warmup, (long long)decay, (long long)steps,
                   (long long)(steps - warmup));
            decay = steps - warmup;
        }
    } else {
        decay = steps - warmup;
    }
    *s = (gt_lr_schedule){
        .lr = cfg->lr,
        .min_lr_factor = cfg->min_lr_factor,
        .training_steps = steps,
        .warmup_steps = warmup,
        .stable_steps = steps + 1 - warmup - decay,
        .decay_steps = decay,
        .decay_type = cfg->decay_type,
    };
    return GT_OK;
}

double gt_lr_factor(const gt_lr_schedule *s, int64_t step)
{
    GT_CHECK(s && step >= 1);
    /* Past the end torchtitan's progress exceeds 1 (or divides by a zero decay span); hold the
     * value of the step after the last one, the virtual step where the decay completes. */
    int64_t c = step - 1;
    if (c > s->training_steps) c = s->training_steps;
    int64_t warmup_stable = s->warmup_steps + s->stable_steps;
    if (c < s->warmup_steps) return (double)(c + 1) / (double)s->warmup_steps;
    if (c < warmup_stable || s->decay_steps == 0) return 1.0;
    double progress = (double)(c + 1 - warmup_stable) / (double)s->decay_steps;
    double d = 0.0;
    switch (s->decay_type) {
    case GT_LR_DECAY_LINEAR:
        d = 1.0 - progress;
        break;
    case GT_LR_DECAY_SQRT:
        d = 1.0 - sqrt(progress);
        break;
    case GT_LR_DECAY_COSINE:
        d = 0.5 * (1.0 + cos(M_PI * progress));
        break;
    }
    return s->min_lr_factor + (1.0 - s->min_lr_factor) * d;
}

double gt_lr_at(const gt_lr_schedule *s, int64_t step)
{
    return s->lr * gt_lr_factor(s, step);
}
