/* gt_exec.h — the eager reference executor (runs a graph node by node, a fresh buffer per value),
 * and gt_executor: one interface over the three ways a graph runs (eager, the CPU program, the
 * CUDA program), for callers such as the trainer that must not care which one runs it. */
#ifndef GRAPHTRAIN_GT_EXEC_H
#define GRAPHTRAIN_GT_EXEC_H

#include "gt_comm.h"
#include "gt_graph.h"
#include "gt_program.h"

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

/* ---------------------------------------------------------------- gt_executor
 *
 * One graph, planned (or not) and ready to run again and again, behind a table of functions (in
 * the spirit of ggml's backend interface) implemented three times:
 *
 *   GT_EXECUTOR_EAGER  gt_eager_run_part: no plan; the inputs are the caller's host tensors,
 *                      borrowed (set_input keeps a pointer, not a copy), and a carry moves the
 *                      output tensor into the caller's tensor of that input (its old bytes freed);
 *   GT_EXECUTOR_CPU    gt_program (gt_program.h): both arenas on the host, inputs copied in;
 *   GT_EXECUTOR_CUDA   gt_cuda_program: arenas on the device, every call queued on its stream,
 *                      results fetched into pinned memory and read a step later (with
 *                      GT_EXEC_CAP_ASYNC); only in a build with CUDA (GT_HAVE_CUDA).
 *
 * The state stays in the executor between runs: set every input once, then per run only those
 * that change (stage_input), run a part, carry each output that updates state into its input, and
 * read the results. A run is numbered by end_run (its ticket); a synchronous executor's results are
 * readable at once and until the next run, an asynchronous one's after gt_executor_wait(ticket),
 * for the last two tickets. An operation a backend does not have is the trivial thing where there
 * is one (capture: nothing captured; marks: none; sync: nothing to wait for) and otherwise
 * GT_ERR_INVALID naming the operation and the backend. */

typedef enum { GT_EXECUTOR_EAGER = 0, GT_EXECUTOR_CPU, GT_EXECUTOR_CUDA } gt_executor_kind;

/* What an executor can do beyond the common operations (gt_executor_caps). */
enum {
    /* results come back later: read them after gt_executor_wait(ticket) */
    GT_EXEC_CAP_ASYNC = 1u << 0,
    /* inputs live in device memory: read_input_bytes, queue_input_bytes, input_data, stream */
    GT_EXEC_CAP_DEVICE = 1u << 1,
    /* gt_executor_comm_timings gives the last (timed) run's collectives */
    GT_EXEC_CAP_COMM_TIMINGS = 1u << 2,
    /* gt_executor_drop_collective (a test's fault injection) */
    GT_EXEC_CAP_DROP_COLLECTIVE = 1u << 3,
};

typedef struct gt_executor gt_executor;

/* "eager", "cpu" or "cuda". */
const char *gt_executor_kind_name(gt_executor_kind kind);
/* Builds the executor of g under binding (both borrowed: they must outlive it). plan: the CUDA
 * program's plan options (NULL = defaults; the CPU program takes the defaults, eager none).
 * GT_ERR_UNSUPPORTED for GT_EXECUTOR_CUDA in a build without CUDA. */
gt_status gt_executor_create(const gt_graph *g, const gt_sym_binding *binding,
                             gt_executor_kind kind, const gt_plan_options *plan, gt_executor **out,
                             gt_error *err);
void gt_executor_free(gt_executor *ex);
gt_executor_kind gt_executor_kind_of(const gt_executor *ex);
unsigned gt_executor_caps(const gt_executor *ex); /* 0 for NULL */
/* The communicators of the graph's collectives, comms[k] for mesh dim k (borrowed), as
 * gt_program_set_comms: MPI ones for eager and cpu, NCCL ones ordered with gt_executor_stream
 * for cuda. NULL clears them. */
gt_status gt_executor_set_comms(gt_executor *ex, gt_comm *const comms[GT_MESH_MAX_DIMS],
                                gt_error *err);

/* Input k's value becomes t's bytes: copied in (cpu; cuda: queued, t valid until the next sync),
 * or for eager t itself, borrowed until the executor is freed or the input set again. */
gt_status gt_executor_set_input(gt_executor *ex, int32_t k, gt_tensor *t, gt_error *err);
/* The same for a per-run input: t may be reused at once (cuda: through pinned memory; eager:
 * still borrowed). */
gt_status gt_executor_stage_input(gt_executor *ex, int32_t k, gt_tensor *t, gt_error *err);
/* Input k's bytes to zero (eager: the borrowed tensor's). */
gt_status gt_executor_zero_input(gt_executor *ex, int32_t k, gt_error *err);
/* Runs one part of the graph (gt_run_part); cuda only queues it. */
gt_status gt_executor_run_part(gt_executor *ex, gt_run_part part, gt_error *err);
/* Runs of `part` so far. */
int64_t gt_executor_runs(const gt_executor *ex, gt_run_part part);
/* Output out_k becomes input in_k's value for the next run (nothing when they share bytes). */
gt_status gt_executor_carry(gt_executor *ex, int32_t out_k, int32_t in_k, gt_error *err);
/* Asks for output k of the run under way as a result (cuda: its copy to pinned memory, queued;
 * elsewhere nothing: the outputs stay readable). */
gt_status gt_executor_fetch_output(gt_executor *ex, int32_t k, gt_error *err);
/* Ends the run under way: *ticket numbers it (0, 1, 2, ...). */
gt_status gt_executor_end_run(gt_executor *ex, int64_t *ticket, gt_error *err);
/* Waits for run `ticket` (asynchronous executors; a data error a kernel flagged comes back here).
 */
gt_status gt_executor_wait(gt_executor *ex, int64_t ticket, gt_error *err);
/* *v = element 0 of output k of run `ticket` (fetched, or for a synchronous executor the last run),
 * as a double; *v is left as it is when that run did not compute (or fetch) output k. */
gt_status gt_executor_read_scalar(gt_executor *ex, int64_t ticket, int32_t k, double *v,
                                  gt_error *err);

/* Copies input k's current value into dst (same dtype and shape; synchronous). */
gt_status gt_executor_read_input(gt_executor *ex, int32_t k, gt_tensor *dst, gt_error *err);
/* GT_EXEC_CAP_DEVICE: bytes [offset, offset + n) of input k to host memory dst (synchronous), and
 * host bytes src into them (queued: src valid until the next sync). */
gt_status gt_executor_read_input_bytes(gt_executor *ex, int32_t k, size_t offset, size_t n,
                                       void *dst, gt_error *err);
gt_status gt_executor_queue_input_bytes(gt_executor *ex, int32_t k, size_t offset, size_t n,
                                        const void *src, gt_error *err);
/* Waits for everything queued. */
gt_status gt_executor_sync(gt_executor *ex, gt_error *err);
/* GT_EXEC_CAP_DEVICE: input k's device buffer and the stream (a gt_cuda_stream *) that orders
 * work on it; NULL elsewhere. */
void *gt_executor_input_data(gt_executor *ex, int32_t k);
void *gt_executor_stream(gt_executor *ex);

/* Records `part` as one CUDA graph after its warm-up run (gt_cuda_program_capture_part);
 * *captured says whether it was. Elsewhere nothing is captured (GT_OK, *captured false). */
gt_status gt_executor_capture_part(gt_executor *ex, gt_run_part part, bool *captured,
                                   gt_error *err);

/* The collectives of one run in execution order (gt_program_collectives; eager: the graph's, in
 * node order, gt_graph_collectives): min(count, max) entries into out, *count the total. */
gt_status gt_executor_collectives(const gt_executor *ex, bool with_place, gt_comm_sched_entry *out,
                                  int32_t max, int32_t *count, gt_error *err);
/* GT_EXEC_CAP_DROP_COLLECTIVE: gt_program_drop_collective. */
gt_status gt_executor_drop_collective(gt_executor *ex, int32_t index, gt_error *err);
/* Times the collectives of the following runs (cuda: uncaptured ones; cpu: always timed; eager:
 * never). */
gt_status gt_executor_set_comm_timing(gt_executor *ex, bool on, gt_error *err);
/* GT_EXEC_CAP_COMM_TIMINGS: as gt_program_comm_timings; -1 without timings. */
int32_t gt_executor_comm_timings(gt_executor *ex, gt_comm_timing *out, int32_t max);
/* The device time of the timed run (cuda), else 0. */
double gt_executor_timed_run_seconds(gt_executor *ex);

/* The lowered program (plan, instructions; cuda: its arenas are on the device), NULL for eager. */
const gt_program *gt_executor_lowered(const gt_executor *ex);
/* Bytes planned and allocated for an arena (0 for eager). */
size_t gt_executor_planned_bytes(const gt_executor *ex, gt_arena_kind a);
size_t gt_executor_allocated_bytes(const gt_executor *ex, gt_arena_kind a);

/* Timing marks (cuda: events on the stream, gt_cuda_program_mark; elsewhere none: mark does
 * nothing and mark_seconds leaves *s as it is). */
gt_status gt_executor_mark(gt_executor *ex, int64_t mark, gt_error *err);
gt_status gt_executor_mark_seconds(gt_executor *ex, int64_t from, int64_t to, double *s,
                                   gt_error *err);

#ifdef __cplusplus
}
#endif
#endif
