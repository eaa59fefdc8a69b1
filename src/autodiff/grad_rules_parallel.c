/* grad_rules_parallel.c — the parallel ops (collectives and the local pieces of vocabulary-parallel
 * ops) have no gradient rule: parallelize (src/parallel/) runs after autodiff and the optimizer, on
 * the whole step graph, so nothing differentiates through them. */
#include "autodiff/grad_rules.h"

gt_status gt_grad_all_gather_start(gt_graph *g, gt_node_id n, const gt_value_id *dout, gt_value_id *din,
                                  gt_error *err)
{
    (void)dout, (void)din;
    return gt_grad_unsupported(g, n, err);
}

gt_status gt_grad_reduce_scatter_start(gt_graph *g, gt_node_id n, const gt_value_id *dout, gt_value_id *din,
                                      gt_error *err)
{
    (void)dout, (void)din;
    return gt_grad_unsupported(g, n, err);
}

gt_status gt_grad_all_reduce_start(gt_graph *g, gt_node_id n, const gt_value_id *dout, gt_value_id *din,
                                  gt_error *err)
{
    (void)dout, (void)din;
    return gt_grad_unsupported(g, n, err);
}

gt_status gt_grad_wait(gt_graph *g, gt_node_id n, const gt_value_id *dout, gt_value_id *din,
                      gt_error *err)
{
    (void)dout, (void)din;
    return gt_grad_unsupported(g, n, err);
}

gt_status gt_grad_embedding_shard(gt_graph *g, gt_node_id n, const gt_value_id *dout, gt_value_id *din,
                                 gt_error *err)
{
    (void)dout, (void)din;
    return gt_grad_unsupported(g, n, err);
}

gt_status gt_grad_embedding_shard_backward(gt_graph *g, gt_node_id n, const gt_value_id *dout, gt_value_id *din,
                                          gt_error *err)
{
    (void)dout, (void)din;
    return gt_grad_unsupported(g, n, err);
}

gt_status gt_grad_logsumexp(gt_graph *g, gt_node_id n, const gt_value_id *dout, gt_value_id *din,
                           gt_error *err)
{
    (void)dout, (void)din;
    return gt_grad_unsupported(g, n, err);
}

gt_status gt_grad_cross_entropy_shard(gt_graph *g, gt_node_id n, const gt_value_id *dout, gt_value_id *din,
                                     gt_error *err)
{
    (void)dout, (void)din;
    return gt_grad_unsupported(g, n, err);
}

gt_status gt_grad_cross_entropy_shard_backward(gt_graph *g, gt_node_id n, const gt_value_id *dout, gt_value_id *din,
                                              gt_error *err)
{
    (void)dout, (void)din;
    return gt_grad_unsupported(g, n, err);
}
