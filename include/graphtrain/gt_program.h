/* gt_program.h — schedule, memory plan, lowering to a flat program, and the program executor
 * (DESIGN.md §5).
 *
 *   gt_schedule_build   a topological order of the nodes, as an explicit array (the graph's own
 *                       node order today; later passes may constrain it)
 *   gt_plan_memory      concrete sizes under a symbol binding, liveness over the schedule, and an
 *                       (arena, offset) for every value in one of two arenas:
 *                         persistent: PARAM, BUFFER and OPT_STATE inputs and the outputs that
 * update them (PARAM_UPDATE, BUFFER_UPDATE, OPT_STATE_UPDATE); step:       everything else
 * (per-step INPUTs, activations, temporaries, grads and the other outputs). gt_program_build
 * schedule + plan + lowering into instructions with resolved attributes and buffer references; no
 * graph walking at run time gt_program_run      runs it on the CPU kernels with each arena
 * allocated once.
 *
 * Buffer sharing (all exact: the program's results are bitwise those of gt_eager_run):
 *   - views: the output of reshape shares its input's bytes (tensors are contiguous, so a reshape
 *     is the same bytes under another shape); the reshape instruction is then dropped;
 *   - in place: an output may take its input's buffer when that input (with every view of it) has
 *     no reader after the node, is not a graph output, is not read by another input slot of the
 *     node, and has the same byte size. Ops allowed: adamw (p'->p, m'->m, v'->v: the kernel reads
 *     every input element i before it writes element i of any output; src/backend/cpu/cpu_optim.c).
 *     No other op runs in place yet. In the persistent arena this writes the updated params and
 *     moments over the old ones, so that arena holds one copy of the state.
 * Offsets: 64-byte aligned; greedy by size (largest first; ties by first use, then value id), each
 * value at the lowest offset that overlaps no already placed value whose live interval intersects
 * its own. Persistent values live for the whole step (no reuse but in place). */
#ifndef GRAPHTRAIN_GT_PROGRAM_H
#define GRAPHTRAIN_GT_PROGRAM_H

#include <stdio.h>

#include "gt_backend.h"
#include "gt_graph.h"

#ifdef __cplusplus
extern "C" {
#endif

#define GT_PLAN_ALIGN 64

typedef enum { GT_ARENA_PERSISTENT = 0, GT_ARENA_STEP, GT_ARENA_COUNT } gt_arena_kind;

/* Report categories. activation: a forward value read by a backward or optimizer node (saved for
 * backward); temporary: any other intermediate; input: per-step INPUTs (tokens, scalars). */
typedef enum {
    GT_MEM_PARAM = 0, /* PARAM and BUFFER inputs and their updates */
    GT_MEM_GRAD,      /* values that are GRAD outputs */
    GT_MEM_OPT_STATE, /* OPT_STATE inputs and their updates */
    GT_MEM_ACTIVATION,
    GT_MEM_TEMPORARY,
    GT_MEM_INPUT,
    GT_MEM_COUNT
} gt_mem_category;
const char *gt_mem_category_name(gt_mem_category c);

/* ---------------------------------------------------------------- schedule */

/* order[k] = the k-th node to run; checks that it is topological. Caller frees *order. */
gt_status gt_schedule_build(const gt_graph *g, gt_node_id **order, int32_t *n, gt_error *err);
/* GT_OK when order is a permutation of the nodes in which every input is defined before use. */
gt_status gt_schedule_check(const gt_graph *g, const gt_node_id *order, int32_t n, gt_error *err);

/* ---------------------------------------------------------------- memory plan */

typedef struct {
    bool no_views;    /* give every reshape its own buffer */
    bool no_in_place; /* never alias an output with an input */
} gt_plan_options;

typedef struct {
    int64_t shape[GT_MAX_DIMS]; /* concrete under the binding */
    size_t nbytes;
    gt_value_id root; /* value whose buffer this one uses (itself unless a view or in place) */
    int32_t first;    /* schedule position of the producer; -1 for a graph input */
    int32_t last;     /* last schedule position that reads it (n for graph outputs); of the
                       * root: the max over every value sharing its buffer */
    uint8_t arena;    /* gt_arena_kind */
    uint8_t category; /* gt_mem_category */
    uint8_t shared;   /* 1: view of root; 2: in place over root */
    size_t offset;    /* in its arena (the root's offset) */
} gt_value_plan;

typedef struct {
    const gt_graph *g; /* borrowed */
    gt_node_id *order;
    int32_t n_order;
    int32_t n_values;
    gt_value_plan *values;
    size_t arena_bytes[GT_ARENA_COUNT]; /* planned size of each arena */
    size_t live_peak_bytes;             /* max over positions of the bytes live in the step arena */
    int32_t peak_pos;                   /* the position where it is reached */
    size_t peak_by_category[GT_MEM_COUNT];    /* both arenas' live bytes at peak_pos, by category */
    size_t total_value_bytes[GT_ARENA_COUNT]; /* sum of the sizes of the buffers (roots) */
    int32_t n_views, n_in_place;
} gt_plan;

/* Plans memory for g under binding over the schedule order (copied). opts may be NULL. */
gt_status gt_plan_memory(const gt_graph *g, const gt_sym_binding *binding, const gt_node_id *order,
                         int32_t n_order, const gt_plan_options *opts, gt_plan **out,
                         gt_error *err);
void gt_plan_free(gt_plan *p);
/* Arena sizes, live peak by category, and the ten largest values live at the peak with the fqn
 * of the node that produced them (or of the graph input). */
void gt_plan_print(const gt_plan *p, FILE *f);

/* ---------------------------------------------------------------- program */

typedef struct {
    uint8_t arena; /* gt_arena_kind */
    gt_dtype dtype;
    int ndim;
    int64_t shape[GT_MAX_DIMS];
    size_t offset;
} gt_buffer_ref;

typedef struct {
    gt_op op;
    gt_node_id node; /* for error messages */
    uint8_t n_in, n_out, ni, nf, ne;
    int64_t i[GT_MAX_IATTR];
    double f[GT_MAX_FATTR];
    int64_t e[GT_MAX_EATTR]; /* evaluated under the binding */
    gt_buffer_ref in[GT_MAX_IN];
    gt_buffer_ref out[GT_MAX_OUT];
} gt_instr;

typedef struct {
    const gt_graph *g; /* borrowed: names in error messages only */
    gt_plan *plan;
    gt_instr *instrs;
    int32_t n_instrs;
    gt_buffer_ref *inputs; /* one per graph input */
    int32_t n_inputs;
    gt_buffer_ref *outputs; /* one per graph output */
    int32_t n_outputs;
    void *arena[GT_ARENA_COUNT]; /* allocated once, by gt_program_build */
    size_t allocated_bytes[GT_ARENA_COUNT];
} gt_program;

/* Schedules, plans and lowers g under binding, and allocates both arenas (once, at the planned
 * sizes). g must outlive the program. */
gt_status gt_program_build(const gt_graph *g, const gt_sym_binding *binding, gt_program **out,
                           gt_error *err);
/* The same with plan options (NULL = defaults). */
gt_status gt_program_build_opts(const gt_graph *g, const gt_sym_binding *binding,
                                const gt_plan_options *opts, gt_program **out, gt_error *err);
void gt_program_free(gt_program *p);
/* inputs[k] feeds g->inputs[k] (dtype and shape must match, or GT_ERR_INVALID names the input);
 * it is copied into the arena. outputs[k] receives g->outputs[k]: allocated here, owned by the
 * caller (gt_tensor_free), as gt_eager_run. Every run reuses the arenas. */
gt_status gt_program_run(gt_program *p, const gt_tensor *inputs, gt_tensor *outputs, gt_error *err);
/* Planned bytes of an arena, and bytes actually allocated for it. */
size_t gt_program_planned_bytes(const gt_program *p, gt_arena_kind a);
size_t gt_program_allocated_bytes(const gt_program *p, gt_arena_kind a);

#ifdef __cplusplus
}
#endif
#endif
