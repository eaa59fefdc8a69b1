/* gt_partition.h — split a whole-step graph into a forward graph and a backward graph joined by an
 * explicit saved-values interface (issue 4; pipeline parallelism runs the two on different
 * schedules).
 *
 * Which node goes where (gt_partition_node_part):
 *   fwd: nodes of phase forward, including the originals that the memory policy tagged
 *        "recompute" (they still run in the forward);
 *   bwd: every other node: backward, optimizer, and the recompute copies made by remat (phase bwd;
 *        a forward-phase node tagged "recompute" that has an origin is a copy too).
 * The saved set is every value produced by a fwd node and read by a bwd node, in value-id order
 * (the order the whole graph defines them). Saved value k leaves fwd as output GT_OUT_METRIC
 * "saved.<k>" and enters bwd as input GT_IN_INPUT "saved.<k>"; no new io kind is needed, and the
 * memory planner then treats a saved value as a per-step value (step arena) on both sides.
 *
 * Inputs: fwd gets the whole graph's inputs that its nodes (or its outputs) read, in the whole
 * graph's order; bwd gets the saved inputs first, in interface order, then the whole graph's inputs
 * that its nodes or outputs read (params, optimizer state, labels, scalars...), in the whole
 * graph's order. An input nobody reads is dropped. Outputs: a whole-graph output goes to the part
 * whose node produces it (loss and metrics to fwd; grads, updates and grad_norm to bwd), keeping
 * kind, name and relative order; fwd's saved outputs follow its own. An output that is directly a
 * graph input goes to fwd when it is LOSS or METRIC, else to bwd.
 *
 * Running fwd, then bwd with each "saved.<k>" fed from fwd's output info.saved[k].fwd_output, gives
 * every output of the whole graph bitwise: each node is copied with its op, attributes, fqn, phase
 * and tags and reads the same values. A fwd node that reads a value of a bwd node cannot be split
 * and is an error naming both nodes. */
#ifndef GRAPHTRAIN_GT_PARTITION_H
#define GRAPHTRAIN_GT_PARTITION_H

#include <stdio.h>

#include "gt_graph.h"

#ifdef __cplusplus
extern "C" {
#endif

#define GT_PARTITION_SAVED_PREFIX "saved."

typedef enum { GT_PART_FWD = 0, GT_PART_BWD = 1 } gt_part;

/* One value of the interface. */
typedef struct {
    char name[32]; /* "saved.<k>": fwd output and bwd input name */
    char *fqn;     /* fqn of the forward node that produced it ("" when none) */
    char *type;    /* as the printer writes it: "f32[batch*seq, 256]" */
    gt_dtype dtype;
    gt_value_id whole_value; /* in the whole graph */
    int32_t fwd_output;      /* index into fwd->outputs */
    int32_t bwd_input;       /* index into bwd->inputs (== k) */
    int64_t bytes;           /* under the binding of gt_partition_eval_bytes; -1 before */
} gt_partition_saved;

/* Where a whole-graph output went. */
typedef struct {
    gt_part part;
    int32_t index; /* into that part's outputs */
} gt_partition_ref;

typedef struct {
    int32_t n_saved;
    gt_partition_saved *saved;
    int32_t n_fwd_nodes, n_bwd_nodes;
    /* fwd_input_of[k]: the whole-graph input index that fwd->inputs[k] is (n_fwd_inputs entries).
     * bwd_input_of[k]: likewise for bwd->inputs[k], or -1 - s for saved value s. */
    int32_t n_fwd_inputs, n_bwd_inputs;
    int32_t *fwd_input_of;
    int32_t *bwd_input_of;
    /* output_of[k]: where whole->outputs[k] went (n_whole_outputs entries). */
    int32_t n_whole_outputs;
    gt_partition_ref *output_of;
    int64_t saved_bytes; /* sum of saved[k].bytes; -1 before gt_partition_eval_bytes */
} gt_partition_info;

/* Builds *fwd and *bwd (new graphs, caller frees with gt_graph_free) from whole, which is not
 * changed. info may be NULL; else it is filled (free with gt_partition_info_free). Both parts are
 * verified. On error nothing is returned and err names the node or value at fault. */
gt_status gt_partition_fwd_bwd(const gt_graph *whole, gt_graph **fwd, gt_graph **bwd,
                               gt_partition_info *info, gt_error *err);
/* The part node n of g belongs to (see the rule above). */
gt_part gt_partition_node_part(const gt_graph *g, const gt_node *n);

void gt_partition_info_free(gt_partition_info *info);

/* Fills saved[k].bytes and saved_bytes from the concrete shapes of fwd's saved outputs under
 * binding (an unbound symbol is an error naming the saved value). */
gt_status gt_partition_eval_bytes(gt_partition_info *info, const gt_graph *fwd,
                                  const gt_sym_binding *binding, gt_error *err);

/* A readable table: one line per saved value (name, type, bytes when evaluated, producing fqn),
 * then the node counts and the total. */
void gt_partition_print(const gt_partition_info *info, FILE *f);

#ifdef __cplusplus
}
#endif
#endif
