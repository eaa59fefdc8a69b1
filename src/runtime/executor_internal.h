/* executor_internal.h — the table behind gt_executor (gt_exec.h) that each backend fills:
 * executor.c (eager, the CPU program, and the wrappers), executor_cuda.c (the CUDA program). */
#ifndef GRAPHTRAIN_EXECUTOR_INTERNAL_H
#define GRAPHTRAIN_EXECUTOR_INTERNAL_H

#include "graphtrain/gt_exec.h"
#include "graphtrain/gt_program.h"

/* An entry left NULL is an operation the backend lacks: the wrapper (executor.c) does the trivial
 * thing or returns GT_ERR_INVALID naming it. */
typedef struct {
    const char *name;
    unsigned caps; /* GT_EXEC_CAP_* */
    void (*free)(gt_executor *ex);
    gt_status (*set_comms)(gt_executor *ex, gt_comm *const comms[GT_MESH_MAX_DIMS], gt_error *err);
    gt_status (*set_input)(gt_executor *ex, int32_t k, gt_tensor *t, gt_error *err);
    gt_status (*stage_input)(gt_executor *ex, int32_t k, gt_tensor *t, gt_error *err);
    gt_status (*zero_input)(gt_executor *ex, int32_t k, gt_error *err);
    gt_status (*run_part)(gt_executor *ex, gt_run_part part, gt_error *err);
    gt_status (*carry)(gt_executor *ex, int32_t out_k, int32_t in_k, gt_error *err);
    gt_status (*fetch_output)(gt_executor *ex, int32_t k, gt_error *err);
    gt_status (*end_run)(gt_executor *ex, int64_t *ticket, gt_error *err);
    gt_status (*wait)(gt_executor *ex, int64_t ticket, gt_error *err);
    /* *t = a view of output k's value as run `ticket` left it; t->data NULL when it has none */
    gt_status (*output_view)(gt_executor *ex, int64_t ticket, int32_t k, gt_tensor *t,
                             gt_error *err);
    gt_status (*read_input)(gt_executor *ex, int32_t k, gt_tensor *dst, gt_error *err);
    gt_status (*read_input_bytes)(gt_executor *ex, int32_t k, size_t offset, size_t n, void *dst,
                                  gt_error *err);
    gt_status (*queue_input_bytes)(gt_executor *ex, int32_t k, size_t offset, size_t n,
                                   const void *src, gt_error *err);
    gt_status (*sync)(gt_executor *ex, gt_error *err);
    void *(*input_data)(gt_executor *ex, int32_t k);
    void *(*stream)(gt_executor *ex);
    gt_status (*capture_part)(gt_executor *ex, gt_run_part part, gt_error *err);
    gt_status (*drop_collective)(gt_executor *ex, int32_t index, gt_error *err);
    gt_status (*set_comm_timing)(gt_executor *ex, bool on, gt_error *err);
    int32_t (*comm_timings)(gt_executor *ex, gt_comm_timing *out, int32_t max);
    double (*timed_run_seconds)(gt_executor *ex);
    const gt_program *(*lowered)(const gt_executor *ex);
    size_t (*allocated_bytes)(const gt_executor *ex, gt_arena_kind a);
    gt_status (*mark)(gt_executor *ex, int64_t mark, gt_error *err);
    gt_status (*mark_seconds)(gt_executor *ex, int64_t from, int64_t to, double *s, gt_error *err);
} gt_executor_iface;

struct gt_executor {
    const gt_executor_iface *iface;
    gt_executor_kind kind;
    const gt_graph *g;             /* borrowed */
    const gt_sym_binding *binding; /* borrowed */
    int64_t runs[2];               /* runs of each gt_run_part */
    int64_t ended;                 /* runs ended (synchronous executors' tickets) */
    gt_run_part last_part;         /* the part of the last run */
    /* eager */
    gt_tensor **src; /* per input: the caller's tensor that holds its value (borrowed) */
    gt_tensor *in;   /* scratch: shallow copies of *src[k] for a run */
    gt_tensor *out;  /* the last run's outputs (owned until carried) */
    bool have_comms;
    gt_comm *comms[GT_MESH_MAX_DIMS];
    /* cpu */
    gt_program *prog;
    /* cuda */
    gt_cuda_program *dev;
    int tuned_said; /* matmul shapes whose tuning the log has reported */
};

/* executor_cuda.c: the CUDA program's table (NULL in a build without CUDA). */
extern const gt_executor_iface *const gt_executor_cuda_iface;
/* Builds ex->dev (executor_cuda.c). */
gt_status gt_executor_cuda_build(gt_executor *ex, const gt_plan_options *plan, gt_error *err);

#endif
