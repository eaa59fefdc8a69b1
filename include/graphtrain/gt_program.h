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
 *     is the same bytes under another shape), and so does a slice whose elements are one
 *     contiguous run of its input's (every dim before the sliced one of size 1; FSDP's unpacking
 *     of a reduce-scatter's flat output), at that run's byte offset when it is a multiple of
 *     GT_PLAN_ALIGN; the instruction is then dropped;
 *   - collectives: a wait's output is its start's output buffer (the collective writes it there),
 *     with or without no_views; that buffer is live from the start, and the start's input until
 *     the wait at least (the wait reads it), so nothing scheduled in between reuses either;
 *   - in place: an output may take its input's buffer when that input (with every view of it) has
 *     no reader after the node, is not a graph output, is not read by another input slot of the
 *     node, and has the same byte size. Ops allowed: adamw (p'->p, m'->m, v'->v: the kernel reads
 *     every input element i before it writes element i of any output; src/backend/cpu/cpu_optim.c);
 *     add and fused_elementwise when output and input are persistent state of one dtype (gradient
 *     accumulation's running sums; their kernels too compute output element i from input
 *     elements i, read first). No other op runs in place yet. In the persistent arena this writes
 *     the updated params, moments and sums over the old ones, so that arena holds one copy of the
 *     state.
 * Offsets: 64-byte aligned; greedy by size (largest first; ties by first use, then value id), each
 * value at the lowest offset that overlaps no already placed value whose live interval intersects
 * its own. Persistent values live for the whole step (no reuse but in place). */
#ifndef GRAPHTRAIN_GT_PROGRAM_H
#define GRAPHTRAIN_GT_PROGRAM_H

#include <stdio.h>

#include "gt_backend.h"
#include "gt_comm.h"
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
    bool no_views;    /* give every reshape and slice its own buffer */
    bool no_in_place; /* never alias an output with an input */
    /* Set by gt_cuda_program_build: the arenas are on the device, so none is allocated here. */
    bool no_host_arenas;
    /* Read by gt_cuda_program_build only: one launch per adamw instruction instead of one
     * multi-tensor launch per group of consecutive ones (bitwise the same; for the test that
     * says so). */
    bool no_adamw_groups;
    /* Read by gt_cuda_program_build only (--comm.nccl_buffers): REGISTRABLE and SYMMETRIC take
     * the arenas from gt_comm_nccl_mem_alloc; SYMMETRIC also registers them as symmetric windows
     * of the NCCL communicators that gt_cuda_program_set_comms sets (gt_comm.h). */
    gt_nccl_buffers nccl_buffers;
} gt_plan_options;

typedef struct {
    int64_t shape[GT_MAX_DIMS]; /* concrete under the binding */
    size_t nbytes;
    gt_value_id root;   /* value whose buffer this one uses (itself unless a view or in place) */
    int32_t first;      /* schedule position of the producer; -1 for a graph input */
    int32_t last;       /* last schedule position that reads it (n for graph outputs); of the
                         * root: the max over every value sharing its buffer */
    uint8_t arena;      /* gt_arena_kind */
    uint8_t category;   /* gt_mem_category */
    uint8_t shared;     /* 1: view of root; 2: in place over root; 3: a concat input computed in
                         * place inside root, the concat's output */
    size_t view_offset; /* bytes from the start of the root's buffer (a slice view's run) */
    size_t offset;      /* in its arena: the root's offset + view_offset */
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
    int32_t n_views, n_in_place, n_concat_in_place; /* concat inputs computed in its output */
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
    int32_t slot; /* collective start and its wait: their request slot; -1 for other ops */
} gt_instr;

/* One collective in flight between its start and its wait (defined in src/runtime). */
typedef struct gt_program_slot gt_program_slot;

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
    gt_comm *comms[GT_MESH_MAX_DIMS]; /* borrowed; set by gt_program_set_comms */
    gt_program_slot *slots;           /* one per collective start lowered */
    int32_t n_slots;
    uint8_t *micro; /* per instruction: 1 in the micro-batch part (gt_graph_micro_part) */
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

/* The same run in pieces, for a caller that keeps state in the arenas between runs (as the CUDA
 * program does; the trainer's compiled CPU step): a graph input's buffer keeps its bytes from run
 * to run, so only inputs that change need setting. The default plan puts adamw's updated params
 * and moments over the old ones, so carrying them is no copy; gt_program_carry copies when the
 * plan did not alias them (no_in_place). */
/* Copies t into input k's buffer (dtype and shape must match, or GT_ERR_INVALID names it). */
gt_status gt_program_set_input(gt_program *p, int32_t k, const gt_tensor *t, gt_error *err);
/* Runs the instructions on the buffers as they are. */
gt_status gt_program_exec(gt_program *p, gt_error *err);
/* A run of one part (gt_run_part, gt_graph.h): GT_RUN_MICRO skips the optimizer's instructions,
 * whose outputs keep their old bytes. */
gt_status gt_program_exec_part(gt_program *p, gt_run_part part, gt_error *err);
/* Sets input k's buffer to zero bytes (gradient accumulation's running sums, each step). */
gt_status gt_program_zero_input(gt_program *p, int32_t k, gt_error *err);
/* A view of output k's buffer (valid until the next exec; not owned). */
gt_status gt_program_output(const gt_program *p, int32_t k, gt_tensor *view, gt_error *err);
/* Output out_k becomes input in_k's value for the next exec (a copy unless they share bytes). */
gt_status gt_program_carry(gt_program *p, int32_t out_k, int32_t in_k, gt_error *err);
/* Copies input k's buffer into dst (dtype and shape must match). */
gt_status gt_program_read_input(const gt_program *p, int32_t k, gt_tensor *dst, gt_error *err);
/* Planned bytes of an arena, and bytes actually allocated for it. */
size_t gt_program_planned_bytes(const gt_program *p, gt_arena_kind a);
size_t gt_program_allocated_bytes(const gt_program *p, gt_arena_kind a);

/* ---------------------------------------------------------------- collectives in a program
 *
 * A collective start lowers to an instruction that posts the collective on the communicator of
 * its mesh dim (gt_comm_*_start on the arena buffers) and keeps the request in a slot; its wait
 * lowers to gt_comm_wait on that slot (its output is the start's buffer: the plan shares it). A
 * collective over a group of size 1 is the identity (a copy at the start) and needs no
 * communicator. Symbols such as "rank.dp_shard" are ordinary symbols of the binding. */

/* comms[k] serves mesh dim k of the graph's mesh (borrowed: it must outlive every run). Its size
 * must equal the dim's size (g->mesh.size[k]; for a graph without a mesh, the group_size of the
 * program's collectives over dim k). NULL is allowed for a dim of size 1, and comms == NULL
 * clears every entry. GT_ERR_INVALID names the dim otherwise. gt_program_run refuses a program
 * whose collectives over a group of size > 1 have no communicator, before it runs anything. */
gt_status gt_program_set_comms(gt_program *p, gt_comm *const comms[GT_MESH_MAX_DIMS],
                               gt_error *err);
/* The program's collectives in execution order, one entry per start: kind, group = gt_hash_str of
 * the mesh dim's name (g->mesh.name[k]; "mesh_dim<k>" without a mesh), bytes = the bytes each rank
 * contributes (the start's input), place = with_place ? a hash of the arenas' sizes and of where
 * the start's input and output lie : 0 (with NCCL symmetric windows every rank's buffers must lie
 * at the same offsets). Writes min(count, max) entries into out (may be NULL when max is 0) and
 * returns the count. For gt_comm_check_schedule before the first step. */
int32_t gt_program_collectives(const gt_program *p, bool with_place, gt_comm_sched_entry *out,
                               int32_t max);
/* The same read from a graph under a binding, in node order — the order the eager executor runs
 * them. *count gets the total; GT_ERR_* when a shape does not evaluate. */
gt_status gt_graph_collectives(const gt_graph *g, const gt_sym_binding *binding,
                               gt_comm_sched_entry *out, int32_t max, int32_t *count,
                               gt_error *err);
/* Test-only fault injection: removes the index-th collective of gt_program_collectives (its start
 * and its wait instructions), so that this rank's schedule differs from its peers'; the wait's
 * output keeps whatever bytes its buffer holds. GT_ERR_INVALID when index is out of range. */
gt_status gt_program_drop_collective(gt_program *p, int32_t index, gt_error *err);

/* Communication timing of the last run, one entry per collective in execution order (index as in
 * gt_program_collectives): kind, mesh dim, bytes each rank contributes, `total_s` from posting the
 * start to the wait's return, and `exposed_s`, the part of it the executor spent blocked in the
 * wait — communication not hidden behind the compute between start and wait. (Through MPI on the
 * CPU a transfer progresses mostly inside MPI calls, so most of it shows as exposed.) Returns the
 * count, writes min(count, max) entries. For --metrics.comm_report. */
typedef struct {
    gt_coll_kind kind;
    int32_t mesh_dim;
    uint64_t bytes;
    int32_t start_instr, wait_instr; /* positions in the instruction list */
    double total_s, exposed_s;
} gt_comm_timing;
int32_t gt_program_comm_timings(const gt_program *p, gt_comm_timing *out, int32_t max);

/* ---------------------------------------------------------------- the program on a CUDA device
 * (src/runtime/exec_cuda.c). Declared in every build; defined only when the library is built with
 * CUDA (GT_HAVE_CUDA), except gt_program_state_input, which is plain host code.
 *
 * The same gt_program as on the CPU — schedule, plan, lowering, instruction list — with both arenas
 * in device memory (cudaMalloc, once, at the planned sizes) and every instruction run in program
 * order by gt_cuda_run_kernel on the program's one stream. gt_program_build / gt_program_run are
 * untouched. Graph inputs live in their planned buffers between runs, so state can stay on the
 * device across steps: upload params and moments once, then set only the per-step inputs. With the
 * default plan adamw updates the persistent arena in place, so an update output shares its input's
 * buffer and gt_cuda_program_carry costs nothing; without in place it is one device copy. */
typedef struct gt_cuda_program gt_cuda_program;

/* Schedules, plans and lowers g as gt_program_build_opts (opts may be NULL), then allocates the
 * arenas on the current CUDA device and creates the stream. g must outlive the program. */
gt_status gt_cuda_program_build(const gt_graph *g, const gt_sym_binding *binding,
                                const gt_plan_options *opts, gt_cuda_program **out, gt_error *err);
void gt_cuda_program_free(gt_cuda_program *p);
/* The lowered program (plan, instructions, buffer refs). Its arena[] are NULL: the bytes are on
 * the device. */
const gt_program *gt_cuda_program_lowered(const gt_cuda_program *p);
/* The program's stream, a gt_cuda_stream * (gt_cuda.h). */
void *gt_cuda_program_stream(gt_cuda_program *p);
/* Device bytes allocated for an arena (equal to the planned bytes). */
size_t gt_cuda_program_allocated_bytes(const gt_cuda_program *p, gt_arena_kind a);
/* The optimizer tail: each run of consecutive adamw instructions that can share a launch
 * (gt_runtime_adamw_groups with gt_cuda_adamw_groupable: f32 state, f32 or bf16 gradients, the
 * same scalars, clip and hyper-parameters, weight decay 0 or the group's one value, no buffer of
 * one written by another) runs as one gt_cuda_adamw_multi launch whose per-tensor table is
 * uploaded by gt_cuda_program_build (the plan fixes every address, so it holds for every step and
 * replay), bitwise what one launch per instruction gives; plan option no_adamw_groups turns it
 * off. This is the number of launches the program's adamw instructions make: one per group plus
 * one per adamw instruction outside a group. */
int32_t gt_cuda_program_adamw_launches(const gt_cuda_program *p);

/* Collectives on the device: comms[k] serves mesh dim k, as gt_program_set_comms (same checks;
 * borrowed: they must outlive every run and the program's last host wait). A communicator of more
 * than one rank must be an NCCL one (gt_comm_nccl_create; GT_ERR_INVALID names the dim otherwise);
 * a group of size 1 needs none (its collectives are device copies). Set them before the warm-up
 * run: the communicators of a captured program cannot change (GT_ERR_INVALID). Starts and waits
 * run as stream work (gt_comm.h, "NCCL"), so exec queues the whole step without blocking and
 * gt_cuda_program_capture records the collectives into the step graph; the first uncaptured run
 * sizes the communicators' scratch. With NCCL communicators set, sync, step_wait, the reads and
 * run wait through gt_comm_nccl_wait_event: a dead or stuck peer makes them fail naming the
 * communicator within its timeout (and aborts it) instead of hanging. */
gt_status gt_cuda_program_set_comms(gt_cuda_program *p, gt_comm *const comms[GT_MESH_MAX_DIMS],
                                    gt_error *err);

/* Communication timing on the device (--metrics.comm_report): while on, every uncaptured exec
 * records CUDA events on the program's stream around each collective — before its start, before
 * its wait and after it — so gt_cuda_program_comm_timings (after that run has completed; it waits
 * for the events) gives, per collective, total_s = start to completion as the compute stream sees
 * it and exposed_s = the time the compute stream stalled at the wait (gt_comm_timing, as for the
 * CPU program). Captured replays record nothing: time a run before capturing. */
gt_status gt_cuda_program_set_comm_timing(gt_cuda_program *p, bool on, gt_error *err);
int32_t gt_cuda_program_comm_timings(gt_cuda_program *p, gt_comm_timing *out, int32_t max);
/* The device time of that timed run, from its first instruction to its last (0 if none). */
double gt_cuda_program_timed_run_seconds(gt_cuda_program *p);

/* Copies host tensor t into the buffer of graph input k (dtype and shape must match, or
 * GT_ERR_INVALID names the input). Ordered on the stream: t must stay valid until the next sync
 * (a read below, gt_cuda_program_sync or gt_cuda_program_run). */
gt_status gt_cuda_program_set_input(gt_cuda_program *p, int32_t k, const gt_tensor *t,
                                    gt_error *err);
/* Runs every instruction on the stream; returns once they are queued (kernel data errors come
 * back from the next sync). */
gt_status gt_cuda_program_exec(gt_cuda_program *p, gt_error *err);
/* As gt_program_exec_part and gt_program_zero_input (the zeroing is queued on the stream). */
gt_status gt_cuda_program_exec_part(gt_cuda_program *p, gt_run_part part, gt_error *err);
gt_status gt_cuda_program_zero_input(gt_cuda_program *p, int32_t k, gt_error *err);
/* Graph input k's buffer on the device (NULL when k is no input), for a kernel of the caller's
 * queued on the program's stream. */
void *gt_cuda_program_input_data(gt_cuda_program *p, int32_t k);
/* Makes graph output out_k's bytes graph input in_k's for the next run: nothing when they share a
 * buffer (in place), else a device-to-device copy on the stream. Shapes and dtypes must match. */
gt_status gt_cuda_program_carry(gt_cuda_program *p, int32_t out_k, int32_t in_k, gt_error *err);
/* Waits for the stream; reports a data error a kernel flagged. */
gt_status gt_cuda_program_sync(gt_cuda_program *p, gt_error *err);
/* Copies graph input k's buffer (its current value: after a run with in-place updates, the updated
 * state) into the allocated host tensor dst of the same dtype and element count; synchronous. */
gt_status gt_cuda_program_read_input(gt_cuda_program *p, int32_t k, gt_tensor *dst, gt_error *err);
/* Bytes [offset, offset + n) of graph input k's buffer, as gt_cuda_program_read_input sees it,
 * into host memory dst (pinned, gt_cuda_host_alloc, for the link's speed); synchronous. A range
 * outside the buffer is GT_ERR_INVALID naming the input. */
gt_status gt_cuda_program_read_input_bytes(gt_cuda_program *p, int32_t k, size_t offset, size_t n,
                                           void *dst, gt_error *err);
/* The reverse: host bytes src (pinned, for the link's speed) into bytes [offset, offset + n) of
 * graph input k's buffer, queued on the stream: src must stay valid until the next
 * gt_cuda_program_sync. */
gt_status gt_cuda_program_queue_input_bytes(gt_cuda_program *p, int32_t k, size_t offset, size_t n,
                                            const void *src, gt_error *err);
/* Copies graph output k into *out, allocated here and owned by the caller (gt_tensor_free);
 * synchronous. */
gt_status gt_cuda_program_read_output(gt_cuda_program *p, int32_t k, gt_tensor *out, gt_error *err);
/* As gt_program_run: every input copied in, the program run, every output copied out into
 * tensors the caller owns; synchronous. */
gt_status gt_cuda_program_run(gt_cuda_program *p, const gt_tensor *inputs, gt_tensor *outputs,
                              gt_error *err);

/* The step path without host stalls: one CUDA graph, asynchronous copies, results read a step
 * later.
 *
 * gt_cuda_program_capture records the instruction list once as a CUDA graph; from then on
 * gt_cuda_program_exec launches that graph (one launch, no per-kernel host work). Call it after
 * one gt_cuda_program_exec has run (the warm-up: it fills the backend's per-shape cuBLASLt
 * choices, sizes its scratch and sets kernel attributes, none of which may happen during a
 * capture). Capturing runs nothing. The graph reads and writes the same device buffers on every
 * replay, so a replay is bitwise the eager step; set the per-step inputs before each exec. On
 * failure (a kernel that would allocate or synchronise) the program stays uncaptured and exec
 * keeps running the instructions.
 *
 * Per step: gt_cuda_program_stage_input copies host tensor t into a pinned host buffer of the
 * program (t may be reused at once) and queues its copy into graph input k's buffer;
 * gt_cuda_program_fetch_output queues output k's copy into pinned host memory; both belong to the
 * current step, which gt_cuda_program_step_end closes (it also queues a copy of the stream's
 * data-error word) and numbers: *ticket = 0, 1, 2, ... gt_cuda_program_step_wait(ticket) waits
 * for that step only (not for steps queued after it) and returns a data error a kernel flagged up
 * to its end; gt_cuda_program_fetched then gives the bytes of an output fetched in that step (NULL
 * for a ticket no longer held). Two steps are held: a ticket's bytes stay valid until the step
 * two after it stages or fetches, which first waits for it. So the loop is: stage, exec, fetch,
 * end step n; then wait for and read step n - 1. */
gt_status gt_cuda_program_capture(gt_cuda_program *p, gt_error *err);
/* The same for one part (gt_run_part): each part is captured after its own warm-up run and
 * replayed by gt_cuda_program_exec_part. A pipeline rank's step, whose sends and receives go
 * through host memory (a host communicator), becomes one graph per run of device instructions
 * between them; a replay launches each in turn and runs the transfers on the host in between. */
gt_status gt_cuda_program_capture_part(gt_cuda_program *p, gt_run_part part, gt_error *err);
/* True once captured (the whole graph's part): exec replays the graph. */
bool gt_cuda_program_captured(const gt_cuda_program *p);
gt_status gt_cuda_program_stage_input(gt_cuda_program *p, int32_t k, const gt_tensor *t,
                                      gt_error *err);
gt_status gt_cuda_program_fetch_output(gt_cuda_program *p, int32_t k, gt_error *err);
gt_status gt_cuda_program_step_end(gt_cuda_program *p, int64_t *ticket, gt_error *err);
gt_status gt_cuda_program_step_wait(gt_cuda_program *p, int64_t ticket, gt_error *err);
const void *gt_cuda_program_fetched(const gt_cuda_program *p, int64_t ticket, int32_t k);
/* Marks: gt_cuda_program_mark(n) records timing event n on the program's stream (it completes
 * once everything queued before it has run); gt_cuda_program_mark_seconds waits for mark `to` and
 * gives the device time from mark `from` to it. GT_CUDA_MARKS are held in a ring: mark n is
 * overwritten by mark n + GT_CUDA_MARKS. The trainer marks each step's start and end. */
#define GT_CUDA_MARKS 8
gt_status gt_cuda_program_mark(gt_cuda_program *p, int64_t mark, gt_error *err);
gt_status gt_cuda_program_mark_seconds(gt_cuda_program *p, int64_t from, int64_t to, double *s,
                                       gt_error *err);

/* The graph input that output k carries state for — PARAM_UPDATE -> the PARAM, BUFFER_UPDATE ->
 * the BUFFER, OPT_STATE_UPDATE -> the OPT_STATE input of the same fqn — or -1 (any other output,
 * or no such input). */
int32_t gt_program_state_input(const gt_graph *g, int32_t k);

#ifdef __cplusplus
}
#endif
#endif
