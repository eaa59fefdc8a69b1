/* gt_autodiff.h — reverse-mode automatic differentiation over the IR. */
#ifndef GRAPHTRAIN_GT_AUTODIFF_H
#define GRAPHTRAIN_GT_AUTODIFF_H

#include "gt_graph.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Gradient rule of one op: given the node and the gradients of its outputs (dout[k] == GT_NONE when
 * no gradient reaches output k), append nodes computing the gradient of each input into din[k]
 * (GT_NONE for an input that gets none: integer inputs, or no dependence). New nodes may reallocate
 * g->nodes: copy the node before adding. */
typedef gt_status (*gt_grad_rule)(gt_graph *g, gt_node_id n, const gt_value_id *dout,
                                  gt_value_id *din, gt_error *err);

/* Differentiates the scalar `loss` with respect to each of wrt[0..n) and writes the gradient value
 * ids to grads (GT_NONE when the loss does not depend on it). The backward nodes are appended to g
 * with phase backward and origin set to the forward node they differentiate. Contributions to one
 * gradient are summed in a fixed order (consumers in reverse node order, then by input slot), so
 * results are deterministic. */
gt_status gt_autodiff_wrt(gt_graph *g, gt_value_id loss, int n, const gt_value_id *wrt,
                          gt_value_id *grads, gt_error *err);

/* The whole-step convenience: the graph's LOSS output w.r.t. every PARAM input; adds one GRAD
 * output (fqn of the param) per PARAM, in input order. A param the loss does not use gets a zero
 * gradient. */
gt_status gt_autodiff(gt_graph *g, gt_error *err);

#ifdef __cplusplus
}
#endif
#endif
