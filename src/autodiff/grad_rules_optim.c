/* grad_rules_optim.c — the optimizer ops have no gradient rule: they run after the backward pass,
 * on gradients, and nothing differentiates through a parameter update. Reaching one from a loss
 * is a graph-construction error, refused like the fused backward ops are. */
#include "autodiff/grad_rules.h"

gt_status gt_grad_clamp(gt_graph *g, gt_node_id n, const gt_value_id *dout, gt_value_id *din,
                        gt_error *err)
{
    (void)dout, (void)din;
    return gt_grad_unsupported(g, n, err);
}

gt_status gt_grad_adamw(gt_graph *g, gt_node_id n, const gt_value_id *dout, gt_value_id *din,
                        gt_error *err)
{
    (void)dout, (void)din;
    return gt_grad_unsupported(g, n, err);
}
