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
    gt_node_id *nodes; /* [n_nodes]: the step graph's nodes it runs, in graph order (not the
                        * part's step-invariant nodes: the runner runs those) */
    int32_t n_nodes;
    gt_value_id *in, *out; /* [n_in], [n_out]: step-graph values of its inputs, outputs */
    int32_t n_in, n_out;
    /* [n_in]: the caller's bytes of a graph input the program's arena holds this step (pp_exec.c
     * run_program: the same step state is not copied in again for each micro-batch), or NULL */
    const void **bound;
    int64_t internal_bytes;    /* its nodes' other outputs: in the arenas, never the runner's */
    int32_t n_coll, n_gathers; /* collectives it starts a run (all-gathers among them) */
} gt_pp_part_program;

/* [g->n_inputs] (caller frees): the BUFFER_UPDATE value that feeds input k back from one
 * micro-batch to the next (a running gradient or token-count sum's, the micro-batch clock's), or
 * -1: none, or one the optimizer makes once a step (the expert biases': every micro-batch reads
 * the buffer as the step began). */
int32_t *gt_pp_update_of_input(const gt_graph *g, const gt_pp_split *split);
/* The nodes whose outputs are the same in every micro-batch of a step (invariant[n] = 1): those
 * of a stage's F, I or W that read only parameters, model buffers no update feeds back, and such
 * nodes' outputs (an FSDP gather, the cast before it, its wait); same_as[n]: the first invariant
 * node of the stage with n's op, attributes and inputs (n itself when none). The runner computes
 * each once a step (pp_exec.c find_invariant says why); a part's program leaves them out. */
void gt_pp_find_invariant(const gt_graph *g, const gt_pp_split *split,
                          const int32_t *update_of_input, uint8_t *invariant, gt_node_id *same_as);

/* One value a pipeline step's runner holds (pp_exec.c): its bytes and the events of the step
 * (allocations and frees, counted in the order the runner makes them) from its allocation to its
 * free, inclusive; INT64_MAX: kept until the step ends. */
typedef struct {
    int64_t size;
    int64_t first, last;
} gt_pp_slot;
/* offsets[k] (GT_PLAN_ALIGN-aligned) for slot k in one arena, where two slots share bytes only if
 * their spans do not meet; returns the arena's bytes (pp_arena.c: gt_plan_memory's greedy
 * assignment, or for very many slots a best fit in event order). Slots in allocation order. */
int64_t gt_pp_arena_place(const gt_pp_slot *slots, int32_t n, int64_t *offsets);

struct gt_pp_programs {
    int32_t n_stages;
    gt_pp_part_program (*part)[3]; /* [n_stages][GT_PP_PART_F .. GT_PP_PART_W] */
    gt_pp_part_info (*info)[3];
};

#endif
