/* grad_rules_fused.c — the gradient rule of fused_elementwise: none. The fusion pass makes the op
 * from a graph that autodiff has already differentiated, so a fused node never meets autodiff;
 * if one does (a graph built by hand), the refusal names the op. */
#include "autodiff/grad_rules.h"

gt_status gt_grad_fused_elementwise(gt_graph *g, gt_node_id n, const gt_value_id *dout,
                                    gt_value_id *din, gt_error *err)
{
    (void)dout, (void)din;
    return gt_grad_unsupported(g, n, err);
}
