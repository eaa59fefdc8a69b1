/* grad_rules_fused.c — the gradient rules of fused_elementwise, add_rms_norm,
 * rms_norm_backward_add and cross_entropy_with_grad: none. The fusion pass makes these ops from a
 * graph that autodiff has already differentiated, so a fused node never meets autodiff; if one
 * does (a graph built by hand), the refusal names the op. */
#include "autodiff/grad_rules.h"

GT_GRAD_NONE(fused_elementwise)
GT_GRAD_NONE(add_rms_norm)
GT_GRAD_NONE(rms_norm_backward_add)
GT_GRAD_NONE(cross_entropy_with_grad)
