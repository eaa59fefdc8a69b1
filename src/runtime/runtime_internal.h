/* runtime_internal.h — what the program executors share (private to src/runtime): exec.c (the
 * CPU) and exec_cuda.c (a CUDA device) walk the same instruction list and differ only in where
 * the arenas live and which backend runs the kernel. */
#ifndef GT_RUNTIME_INTERNAL_H
#define GT_RUNTIME_INTERNAL_H

#include "graphtrain/gt_program.h"

/* ---------------------------------------------------------------- offsets in one arena (plan.c)
 *
 * An item of `size` bytes (already aligned) living over positions [first, last] of some order;
 * id indexes the caller's offsets. */
typedef struct {
    int64_t size;
    int64_t first, last;
    int32_t id;
} gt_plan_interval;
/* offsets[id] for every item: largest first (then the earlier first, then the lower id), each at
 * the lowest offset whose bytes no placed item with an intersecting interval uses. Sorts items;
 * O(n^2 log n) at worst. Returns the arena's bytes. The memory plan's step 5 (gt_plan_memory)
 * and the pipeline runner's arena (pp_arena.c). */
int64_t gt_plan_place_intervals(gt_plan_interval *items, int32_t n, int64_t *offsets);

/* The kernel call of instruction ins: its attributes, and in[j] / out[j] as gt_tensor views of
 * its buffers in the arenas whose base addresses are arena[0 .. GT_ARENA_COUNT) (a NULL base
 * gives views with NULL data). call->in / call->out point into in[] and out[]. */
void gt_program_kernel_call(const gt_instr *ins, void *const *arena, gt_kernel_call *call,
                            gt_tensor *in, gt_tensor *out);

/* Wraps err (a failed kernel of instruction ins in the graph g) with the node it came from:
 * "node %N op[ at fqn]" followed by suffix (e.g. " (cuda)"; "" for none). */
void gt_program_wrap_kernel_error(const gt_graph *g, const gt_instr *ins, const char *suffix,
                                  gt_error *err);

/* Bytes of the buffer r refers to: its element count times its dtype's size. */
size_t gt_runtime_ref_bytes(const gt_buffer_ref *r);
/* True when tensor t has the buffer's dtype and shape (exact) or, with numel_only, its dtype and
 * element count. */
bool gt_runtime_ref_matches(const gt_buffer_ref *r, const gt_tensor *t, bool numel_only);
/* GT_ERR_INVALID "WHAT K (NAME): expected <r's type>, got <t's type>". */
gt_status gt_runtime_ref_type_error(const char *what, int32_t k, const char *name,
                                    const gt_buffer_ref *r, const gt_tensor *t, gt_error *err);

/* ---------------------------------------------------------------- multi-tensor adamw
 * (adamw_groups.c; exec_cuda.c launches each group as one gt_cuda_adamw_multi) */

/* Whether a backend can put adamw instruction ins into a multi-tensor launch (on CUDA:
 * gt_cuda_adamw_groupable of its kernel call). */
typedef bool (*gt_runtime_adamw_fits)(const gt_instr *ins, void *user);

/* Groups of the n instructions that one multi-tensor AdamW launch can run. A group is a run of at
 * least two consecutive adamw instructions, each accepted by fits, that read the same scalars and
 * clip buffers, have the same beta1, beta2 and eps, and weight decays that are 0 or one shared
 * nonzero value — and that do not need their order: no member writes bytes another member reads
 * or writes, and a member's outputs overlap its own inputs only where one is exactly the other
 * (in place: each element is read before it is written, in the single-tensor kernel as in the
 * multi-tensor one). len[k] (for every k < n) gets the group's size when instruction k starts a
 * group, 0 for the other members, and 1 for an instruction that runs alone. Returns the number of
 * groups. Pure host code over the descriptors (buffer refs, attributes), so a CPU test covers it.
 */
int32_t gt_runtime_adamw_groups(const gt_instr *instrs, int32_t n, gt_runtime_adamw_fits fits,
                                void *user, int32_t *len);

/* ---------------------------------------------------------------- collectives (exec.c) */

/* One collective in flight in a program run: the gt_tensor views of its start's buffers (the
 * request points at them until the wait) and the request; req is NULL when nothing is posted
 * (no run yet, already waited, or a size-1 group done at the start). */
struct gt_program_slot {
    gt_tensor in, out;
    gt_comm_request *req;
    gt_comm *sent; /* a send_start's communicator: its wait completes the sends posted on it */
    /* the last run's clock readings (CLOCK_MONOTONIC seconds): start posted, wait entered,
     * wait returned (gt_program_comm_timings) */
    double t_start, t_wait, t_done;
};

/* gt_program_comm_timings and its CUDA twin: every start of p in order with its kind, mesh dim,
 * bytes and wait position filled here, and the two times by times(user, slot, ...). */
typedef void (*gt_runtime_slot_times)(void *user, int32_t slot, double *total_s, double *exposed_s);
int32_t gt_runtime_comm_timings(const gt_program *p, gt_comm_timing *out, int32_t max,
                                gt_runtime_slot_times times, void *user);

/* Every collective of a group > 1 must have its communicator: checked before a run starts, so a
 * missing one fails on every rank before any rank posts a collective. suffix goes after the node
 * in the message (" (cuda)"). */
gt_status gt_runtime_check_comms(const gt_program *p, const char *suffix, gt_error *err);
/* After a failed run: completes every collective still in flight (their buffers are the arenas',
 * which must not be reused while a transfer may touch them; on CUDA this joins the communicators'
 * streams back). Errors are dropped: the run's own error is the one reported. */
void gt_runtime_drain_slots(gt_program *p);

/* The communicator collective a start op runs. */
gt_coll_kind gt_runtime_coll_kind(gt_op op);
/* "mesh dim 1 (dp_shard)" for messages; "mesh dim 1" for a graph without a mesh. */
void gt_runtime_mesh_dim_label(const gt_graph *g, int64_t dim, char *buf, size_t len);
/* The communicator a start over mesh dim `dim` with `group_size` ranks runs on: NULL when
 * group_size is 1 (the identity), else comms[dim] (comms may be NULL), which must exist and have
 * group_size ranks (GT_ERR_INVALID naming the dim otherwise; the caller adds the node). */
gt_status gt_runtime_comm_for(const gt_graph *g, int64_t dim, int64_t group_size,
                              gt_comm *const *comms, gt_comm **out, gt_error *err);
/* Posts the collective of start op `op` (attributes i) from in to out on c (async; *req to wait
 * on), or, when c is NULL (a group of size 1), copies in to out and sets *req = NULL. A
 * point-to-point start has no request: send_start posts in to rank i[2] under tag i[3] without
 * blocking (complete it with gt_comm_send_wait_all before in's bytes change), recv_start
 * receives out from rank i[2] under tag i[3], blocking; in is NULL for it. */
gt_status gt_runtime_start(gt_op op, gt_comm *c, const int64_t *i, const gt_tensor *in,
                           gt_tensor *out, gt_comm_request **req, gt_error *err);

#endif
