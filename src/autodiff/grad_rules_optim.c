/* grad_rules_optim.c — the optimizer ops have no gradient rule: they run after the backward pass,
 * on gradients, and nothing differentiates through a parameter update. Reaching one from a loss
 * is a graph-construction error, refused like the fused backward ops are. */
#include "autodiff/grad_rules.h"

GT_GRAD_NONE(clamp)
GT_GRAD_NONE(adamw)
