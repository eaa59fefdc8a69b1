/* gt_exec.h — the eager reference executor: runs a graph node by node, a fresh buffer per value. */
#ifndef GRAPHTRAIN_GT_EXEC_H
#define GRAPHTRAIN_GT_EXEC_H

#include "gt_graph.h"

#ifdef __cplusplus
extern "C" {
#endif

/* inputs[k] feeds g->inputs[k] (dtype and shape must match the input's type under the binding, or
 * GT_ERR_INVALID names the input). outputs[k] receives g->outputs[k]: allocated here, owned by the
 * caller (gt_tensor_free). Buffers of intermediate values are freed after their last use. */
gt_status gt_eager_run(const gt_graph *g, const gt_sym_binding *binding, const gt_tensor *inputs,
                       gt_tensor *outputs, gt_error *err);

#ifdef __cplusplus
}
#endif
#endif
