/* grad_rules_fused.c — the gradient rule of fused_elementwise: none. The fusion pass makes the op
 * from a graph that autodiff has already differentiated, so a fused node never meets autodiff;
 * if one does (a graph built by hand), the refusal names the op. */
#include "autodiff/grad_rules.h"

GT_GRAD_NONE(fused_elementwise)
