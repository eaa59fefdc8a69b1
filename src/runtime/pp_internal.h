/* pp_internal.h — what the pipeline runner (pp_exec.c) reads of the per-stage compiled programs
 * (pp_program.c, gt_pipeline.h's gt_pp_programs). Private to src/runtime. */
#ifndef GRAPHTRAIN_PP_INTERNAL_H
#define GRAPHTRAIN_PP_INTERNAL_H

#include "graphtrain/gt_pipeline.h"
#include "graphtrain/gt_program.h"

/* One stage's part (F, I or W) as a program of its own: a graph of the part's nodes whose inputs
 * are the values they read from outside the part, whose outputs are the values anything outside
 * the part reads (a later part, another micro-batch's W, the optimizer, a send, a graph output). */
typedef struct {
    gt_graph *g;       /* the part's graph (the program borrows it) */
    gt_program *prog;  /* NULL: the part runs node by node (why: gt_pp_part_info) */
    gt_node_id *nodes; /* [n_nodes]: the step graph's nodes it runs, in graph order */
    int32_t n_nodes;
    gt_value_id *in, *out; /* [n_in], [n_out]: step-graph values of its inputs, outputs */
    int32_t n_in, n_out;
    int64_t
        internal_bytes; /* its nodes' other outputs: computed in the arenas, never the runner's */
} gt_pp_part_program;

struct gt_pp_programs {
    int32_t n_stages;
    gt_pp_part_program (*part)[3]; /* [n_stages][GT_PP_PART_F .. GT_PP_PART_W] */
    gt_pp_part_info (*info)[3];
};

#endif
