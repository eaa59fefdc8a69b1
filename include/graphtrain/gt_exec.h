/* gt_exec.h — the eager reference executor: runs a graph node by node, a fresh buffer per value. */
#ifndef GRAPHTRAIN_GT_EXEC_H
#define GRAPHTRAIN_GT_EXEC_H

#include "gt_comm.h"
#include "gt_graph.h"

#ifdef __cplusplus
extern "C" {
#endif

/* inputs[k] feeds g->inputs[k] (dtype and shape must match the input's type under the binding, or
 * GT_ERR_INVALID names the input). outputs[k] receives g->outputs[k]: allocated here, owned by the
 * caller (gt_tensor_free). Buffers of intermediate values are freed after their last use. */
gt_status gt_eager_run(const gt_graph *g, const gt_sym_binding *binding, const gt_tensor *inputs,
                       gt_tensor *outputs, gt_error *err);

/* The same for a graph with collectives: comms[k] serves mesh dim k (as gt_program_set_comms;
 * comms or an entry may be NULL where every collective over that dim has group_size 1). Each
 * start runs its collective to completion (the blocking gt_comm_* call) into a fresh buffer; its
 * wait copies that result. A collective over a group of size 1 is a copy. gt_eager_run is this
 * with no communicators, so it refuses a collective over a group of size > 1 (GT_ERR_INVALID
 * naming the node and mesh dim). */
gt_status gt_eager_run_comms(const gt_graph *g, const gt_sym_binding *binding,
                             const gt_tensor *inputs, gt_comm *const comms[GT_MESH_MAX_DIMS],
                             gt_tensor *outputs, gt_error *err);
/* The same for one part of the graph (gt_run_part, gt_graph.h): GT_RUN_MICRO runs only the
 * micro-batch part's nodes (gt_graph_micro_part) and leaves the other outputs empty. */
gt_status gt_eager_run_part(const gt_graph *g, const gt_sym_binding *binding,
                            const gt_tensor *inputs, gt_comm *const comms[GT_MESH_MAX_DIMS],
                            gt_run_part part, gt_tensor *outputs, gt_error *err);

#ifdef __cplusplus
}
#endif
#endif
