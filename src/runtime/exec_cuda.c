/* exec_cuda.c — the program executor on the CUDA backend (gt_program.h, "the program on a CUDA
 * device").
 *
 * Build: gt_program_build_opts gives the schedule, the plan and the instruction list exactly as on
 * the CPU; its host arenas are released at once (never touched, so never paged in) and the two
 * arenas are allocated in device memory at the planned sizes. A run then walks the same
 * instructions, wrapping each buffer reference as a gt_tensor onto the device arena and calling
 * gt_cuda_run_kernel on the program's one stream. Kernels write every element of their outputs,
 * so the arenas are never cleared; one stream and a fixed instruction order keep the run
 * deterministic (the kernels themselves use no floating-point atomics).
 *
 * Optimizer tail: the step ends in one adamw instruction per parameter. At build, each run of
 * them that gt_runtime_adamw_groups accepts (with gt_cuda_adamw_groupable deciding what the
 * backend can take) becomes one gt_cuda_adamw_multi launch, its table of device pointers uploaded
 * then: the plan fixes every buffer address, so the table is right for every run and for the
 * captured graph, and the step path neither allocates nor waits for it. A run launches the group
 * at its first instruction and skips the rest; results are bitwise those of one launch per
 * instruction (plan option no_adamw_groups keeps those).
 *
 * Collectives (gt_cuda_program_set_comms): a start posts its collective on the NCCL communicator of
 * its mesh dim, ordered with the program's stream (gt_comm.h, "NCCL": an event fork to the
 * communicator's stream, no host blocking), and keeps the request in the instruction's slot; its
 * wait makes the program's stream wait for the transfer. A group of size 1 is the cast kernel at
 * the start: a device copy, or a widening reduce_scatter's exact widening. All of it is stream
 * work, so gt_cuda_program_capture records the collectives into the step graph with everything
 * else. With NCCL communicators set, every host wait of the program (sync, step_wait, reads, run)
 * polls through gt_comm_nccl_wait_event: a dead or stuck peer becomes an error naming the
 * communicator within its timeout instead of a hang. Consecutive all-gather starts on one
 * communicator (a block's per-tensor gathers under --compile.fsdp_gathers grouped) are posted as
 * one NCCL group (gt_comm_nccl_group_begin / _end): one launch, no packing.
 *
 * State: a graph input's buffer keeps its bytes between runs. The default plan puts adamw's
 * updated params and moments over the old ones in the persistent arena, so after a run the input
 * buffers already hold the next step's state; gt_cuda_program_carry makes that explicit and copies
 * when the plan did not alias them (plan option no_in_place). */
#include <stdlib.h>
#include <string.h>

#include "graphtrain/gt_program.h"
#include "runtime_internal.h"

int32_t gt_program_state_input(const gt_graph *g, int32_t k)
{
    if (k < 0 || k >= g->n_outputs) return -1;
    int want;
    switch ((gt_output_kind)g->outputs[k].kind) {
    case GT_OUT_PARAM_UPDATE:
        want = GT_IN_PARAM;
        break;
    case GT_OUT_BUFFER_UPDATE:
        want = GT_IN_BUFFER;
        break;
    case GT_OUT_OPT_STATE_UPDATE:
        want = GT_IN_OPT_STATE;
        break;
    default:
        return -1;
    }
    const char *name = gt_graph_str(g, g->outputs[k].fqn);
    for (int32_t i = 0; i < g->n_inputs; i++)
        if (g->inputs[i].kind == want && !strcmp(gt_graph_str(g, g->inputs[i].fqn), name)) return i;
    return -1;
}

#ifdef GT_HAVE_CUDA

#include <cuda_runtime.h>

#include "graphtrain/gt_cuda.h"

/* Step slots: the asynchronous step path keeps two of everything the host touches (pinned
 * staging for per-step inputs, pinned landing space for fetched outputs and the error word, the
 * event that marks the step's end), so step n is queued while the host still reads step n - 1;
 * slot n & 1 is reused by step n + 2 only after step n has completed. */
#define GT_CUDA_SLOTS 2

/* Instructions first .. first + count - 1 (adamw) as one multi-tensor launch. */
typedef struct {
    int32_t first, count;
    gt_cuda_adamw_multi *launch;
} adamw_group;

/* A captured run of instructions from .. to - 1, none of which waits for the host; the host
 * instructions from `to` up to the next segment's `from` (or the end) run between replays. exec
 * is NULL for an empty run (a host instruction first, or two in a row). */
typedef struct {
    int32_t from, to;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
} captured_seg;

struct gt_cuda_program {
    gt_program *prog; /* arena[] NULL: the bytes are in dev[] */
    gt_cuda_stream *stream;
    void *dev[GT_ARENA_COUNT];
    size_t dev_bytes[GT_ARENA_COUNT];
    gt_nccl_buffers nccl_buffers; /* not DEFAULT: dev[] from gt_comm_nccl_mem_alloc */
    /* SYMMETRIC: dev[a] is the window win[k][a] of win_comm[k] (gt_cuda_program_set_comms) */
    gt_comm *win_comm[GT_MESH_MAX_DIMS];
    void *win[GT_MESH_MAX_DIMS][GT_ARENA_COUNT];
    /* the instructions of each part (gt_run_part) captured once (gt_cuda_program_capture_part):
     * one graph per run of device instructions between host ones */
    captured_seg *seg[2];
    int32_t n_seg[2];
    /* the asynchronous step path: pinned host memory per slot, allocated on first use */
    void **in_pin[GT_CUDA_SLOTS];  /* [n_inputs] */
    void **out_pin[GT_CUDA_SLOTS]; /* [n_outputs] */
    unsigned long long *error_word[GT_CUDA_SLOTS];
    cudaEvent_t done[GT_CUDA_SLOTS];
    cudaEvent_t mark[GT_CUDA_MARKS]; /* gt_cuda_program_mark: timing events, created on first use */
    int64_t mark_n[GT_CUDA_MARKS];   /* which mark each holds, once created */
    int64_t n_ended;   /* steps ended (gt_cuda_program_step_end); the current one is n_ended */
    bool slot_claimed; /* the current step has made sure its slot is free */
    /* collectives: some communicator of prog->comms is an NCCL one; the event host waits watch */
    bool nccl;
    cudaEvent_t sync_ev;
    /* --metrics.comm_report: while timing is on, each uncaptured run records per collective slot
     * three events on the program's stream: before the start, before the wait, after the wait */
    bool timing;
    cudaEvent_t *tev;      /* [3 * n_slots] */
    cudaEvent_t run_ev[2]; /* the timed run's start and end */
    /* a pipeline rank's point-to-point transfers over a host communicator: per slot, the host
     * bytes a send_start copies out of the device or a recv_start receives into (malloc'ed on
     * first use) */
    void **p2p_host;
    /* the optimizer tail's multi-tensor launches, in instruction order */
    adamw_group *groups;
    int32_t n_groups;
    int32_t adamw_launches; /* gt_cuda_program_adamw_launches */
};

static void *ref_data(const gt_cuda_program *p, const gt_buffer_ref *r)
{
    return p->dev[r->arena] ? (char *)p->dev[r->arena] + r->offset : NULL;
}

static void ref_tensor(const gt_cuda_program *p, const gt_buffer_ref *r, gt_tensor *t)
{
    gt_tensor_wrap(t, r->dtype, r->ndim, r->shape, ref_data(p, r));
}

/* "the multi-tensor adamw launch of nodes %A..%B (cuda)" before err's message. */
static void wrap_group_error(const gt_cuda_program *p, int32_t first, int32_t count, gt_error *err)
{
    const gt_instr *ins = p->prog->instrs;
    gt_error_wrap(err, "the multi-tensor adamw launch of nodes %%%d..%%%d (cuda)", ins[first].node,
                  ins[first + count - 1].node);
}

static bool adamw_fits(const gt_instr *ins, void *user)
{
    const gt_cuda_program *p = user;
    gt_tensor in[GT_MAX_IN], out[GT_MAX_OUT];
    gt_kernel_call call;
    gt_program_kernel_call(ins, p->dev, &call, in, out);
    return gt_cuda_adamw_groupable(&call);
}

/* The multi-tensor launches of the optimizer tail (see the top of the file), built once. */
static gt_status group_adamw(gt_cuda_program *p, bool on, gt_error *err)
{
    const gt_program *prog = p->prog;
    int32_t n = prog->n_instrs, n_adamw = 0;
    int32_t *len = gt_xcalloc((size_t)n + 1, sizeof *len);
    int32_t n_groups = on ? gt_runtime_adamw_groups(prog->instrs, n, adamw_fits, p, len) : 0;
    p->groups = gt_xcalloc((size_t)n_groups + 1, sizeof *p->groups);
    gt_status st = GT_OK;
    for (int32_t k = 0; k < n; k++)
        n_adamw += prog->instrs[k].op == GT_OP_ADAMW;
    p->adamw_launches = n_adamw;
    for (int32_t k = 0; k < n && n_groups > 0 && st == GT_OK; k++) {
        if (len[k] < 2) continue;
        gt_kernel_call *calls = gt_xcalloc((size_t)len[k], sizeof *calls);
        gt_tensor(*in)[GT_MAX_IN] = gt_xcalloc((size_t)len[k], sizeof *in);
        gt_tensor(*out)[GT_MAX_OUT] = gt_xcalloc((size_t)len[k], sizeof *out);
        for (int32_t j = 0; j < len[k]; j++)
            gt_program_kernel_call(&prog->instrs[k + j], p->dev, &calls[j], in[j], out[j]);
        adamw_group *grp = &p->groups[p->n_groups];
        st = gt_cuda_adamw_multi_create(calls, len[k], &grp->launch, err);
        if (st == GT_OK) {
            grp->first = k;
            grp->count = len[k];
            p->n_groups++;
            p->adamw_launches -= len[k] - 1;
        } else {
            wrap_group_error(p, k, len[k], err);
        }
        free(calls);
        free(in);
        free(out);
    }
    free(len);
    return st;
}

/* The plan's arenas against the device's free memory, before asking for them: a plan that cannot
 * fit says so with both numbers (the peak is known before step 1, and so is this). */
static gt_status check_fits(const gt_plan *plan, gt_error *err)
{
    size_t need = 0, free_b = 0, total_b = 0;
    for (int a = 0; a < GT_ARENA_COUNT; a++)
        need += plan->arena_bytes[a];
    gt_error ignored = {0};
    if (gt_cuda_memory(&free_b, &total_b, &ignored) != GT_OK || need <= free_b) return GT_OK;
    const double gib = 1024.0 * 1024.0 * 1024.0;
    return gt_error_set(err, GT_ERR_NOMEM,
                        "program: the memory plan needs %.2f GiB on the GPU (persistent %.2f, step "
                        "%.2f), which has %.2f GiB free of %.2f",
                        (double)need / gib, (double)plan->arena_bytes[GT_ARENA_PERSISTENT] / gib,
                        (double)plan->arena_bytes[GT_ARENA_STEP] / gib, (double)free_b / gib,
                        (double)total_b / gib);
}

gt_status gt_cuda_program_build(const gt_graph *g, const gt_sym_binding *binding,
                                const gt_plan_options *opts, gt_cuda_program **out, gt_error *err)
{
    *out = NULL;
    gt_cuda_program *p = gt_xcalloc(1, sizeof *p);
    gt_plan_options o = opts ? *opts : (gt_plan_options){0};
    o.no_host_arenas = true;
    gt_status st = gt_program_build_opts(g, binding, &o, &p->prog, err);
    p->nccl_buffers = o.nccl_buffers;
    if (st == GT_OK) st = check_fits(p->prog->plan, err);
    for (int a = 0; st == GT_OK && a < GT_ARENA_COUNT; a++) {
        size_t bytes = p->prog->plan->arena_bytes[a];
        st = p->nccl_buffers != GT_NCCL_BUFFERS_PLAIN
                 ? gt_comm_nccl_mem_alloc(&p->dev[a], bytes, err)
                 : gt_cuda_malloc(&p->dev[a], bytes, err);
        if (st != GT_OK)
            gt_error_wrap(err, "program: the %s arena on the device (%zu bytes)",
                          a == GT_ARENA_PERSISTENT ? "persistent" : "step", bytes);
        else
            p->dev_bytes[a] = bytes;
    }
    if (st == GT_OK) st = gt_cuda_stream_create(&p->stream, err);
    if (st == GT_OK) st = group_adamw(p, !(opts && opts->no_adamw_groups), err);
    if (st != GT_OK) {
        gt_cuda_program_free(p);
        return st;
    }
    *out = p;
    return GT_OK;
}

/* Drops part's captured graphs: exec runs its instructions again. */
static void free_segs(gt_cuda_program *p, gt_run_part part)
{
    for (int32_t i = 0; i < p->n_seg[part]; i++) {
        if (p->seg[part][i].exec) cudaGraphExecDestroy(p->seg[part][i].exec);
        if (p->seg[part][i].graph) cudaGraphDestroy(p->seg[part][i].graph);
    }
    free(p->seg[part]);
    p->seg[part] = NULL;
    p->n_seg[part] = 0;
}

void gt_cuda_program_free(gt_cuda_program *p)
{
    if (!p) return;
    if (p->stream) {
        gt_error ignored = {0};
        gt_cuda_stream_sync(p->stream, &ignored); /* no kernel may still use the arenas */
        gt_cuda_stream_destroy(p->stream);
    }
    for (int part = 0; part < 2; part++)
        free_segs(p, (gt_run_part)part);
    if (p->sync_ev) cudaEventDestroy(p->sync_ev);
    for (int32_t k = 0; p->p2p_host && k < p->prog->n_slots; k++)
        free(p->p2p_host[k]);
    free(p->p2p_host);
    for (int k = 0; k < GT_CUDA_MARKS; k++)
        if (p->mark[k]) cudaEventDestroy(p->mark[k]);
    for (int32_t k = 0; p->tev && k < 3 * p->prog->n_slots; k++)
        if (p->tev[k]) cudaEventDestroy(p->tev[k]);
    for (int k = 0; k < 2; k++)
        if (p->run_ev[k]) cudaEventDestroy(p->run_ev[k]);
    free(p->tev);
    for (int sl = 0; sl < GT_CUDA_SLOTS; sl++) {
        for (int32_t k = 0; p->in_pin[sl] && k < p->prog->n_inputs; k++)
            if (p->in_pin[sl][k]) cudaFreeHost(p->in_pin[sl][k]);
        for (int32_t k = 0; p->out_pin[sl] && k < p->prog->n_outputs; k++)
            if (p->out_pin[sl][k]) cudaFreeHost(p->out_pin[sl][k]);
        free(p->in_pin[sl]);
        free(p->out_pin[sl]);
        if (p->error_word[sl]) cudaFreeHost(p->error_word[sl]);
        if (p->done[sl]) cudaEventDestroy(p->done[sl]);
    }
    for (int32_t k = 0; k < p->n_groups; k++)
        gt_cuda_adamw_multi_free(p->groups[k].launch);
    free(p->groups);
    for (int k = 0; k < GT_MESH_MAX_DIMS; k++)
        for (int a = 0; a < GT_ARENA_COUNT; a++)
            gt_comm_nccl_window_deregister(p->win_comm[k], p->win[k][a]);
    for (int a = 0; a < GT_ARENA_COUNT; a++) {
        if (p->nccl_buffers != GT_NCCL_BUFFERS_PLAIN)
            gt_comm_nccl_mem_free(p->dev[a]);
        else
            gt_cuda_free(p->dev[a]);
    }
    gt_program_free(p->prog);
    free(p);
}

const gt_program *gt_cuda_program_lowered(const gt_cuda_program *p)
{
    return p->prog;
}

void *gt_cuda_program_stream(gt_cuda_program *p)
{
    return p->stream;
}

size_t gt_cuda_program_allocated_bytes(const gt_cuda_program *p, gt_arena_kind a)
{
    return (unsigned)a < GT_ARENA_COUNT ? p->dev_bytes[a] : 0;
}

int32_t gt_cuda_program_adamw_launches(const gt_cuda_program *p)
{
    return p->adamw_launches;
}

static const char *input_name(const gt_cuda_program *p, int32_t k)
{
    return gt_graph_str(p->prog->g, p->prog->g->inputs[k].fqn);
}

static const char *input_kind(const gt_cuda_program *p, int32_t k)
{
    return gt_input_kind_name((gt_input_kind)p->prog->g->inputs[k].kind);
}

gt_status gt_cuda_program_set_input(gt_cuda_program *p, int32_t k, const gt_tensor *t,
                                    gt_error *err)
{
    if (k < 0 || k >= p->prog->n_inputs)
        return gt_error_set(err, GT_ERR_INVALID, "program: no graph input %d (it has %d)", k,
                            p->prog->n_inputs);
    const gt_buffer_ref *r = &p->prog->inputs[k];
    char name[200];
    snprintf(name, sizeof name, "%s %s", input_kind(p, k), input_name(p, k));
    if (!gt_runtime_ref_matches(r, t, false))
        return gt_runtime_ref_type_error("graph input", k, name, r, t, err);
    size_t n = gt_runtime_ref_bytes(r);
    if (n && !t->data)
        return gt_error_set(err, GT_ERR_INVALID, "graph input %d (%s): tensor has no data", k,
                            name);
    return gt_cuda_memcpy_h2d(p->stream, ref_data(p, r), t->data, n, err);
}

static cudaStream_t stream_of(gt_cuda_program *p)
{
    return (cudaStream_t)gt_cuda_stream_handle(p->stream);
}

static gt_status cuda_error(cudaError_t e, const char *what, gt_error *err)
{
    if (e == cudaSuccess) return GT_OK;
    return gt_error_set(err, GT_ERR_INTERNAL, "program: %s: CUDA error %s", what,
                        cudaGetErrorString(e));
}

/* ---------------------------------------------------------------- collectives */

/* --comm.nccl_buffers symmetric: each arena a symmetric window of every NCCL communicator of more
 * than one rank (collective: every rank's program registers the same arenas in the same order),
 * once; the windows belong to those communicators until gt_cuda_program_free. */
static gt_status register_windows(gt_cuda_program *p, gt_error *err)
{
    for (int k = 0; k < GT_MESH_MAX_DIMS; k++) {
        gt_comm *c = p->prog->comms[k];
        if (c == p->win_comm[k]) continue;
        if (p->win_comm[k])
            return gt_error_set(err, GT_ERR_INVALID,
                                "program: the arenas are symmetric windows of the communicator "
                                "for mesh dim %d set first; it cannot be replaced",
                                k);
        if (!gt_comm_is_nccl(c) || gt_comm_size(c) < 2) continue;
        p->win_comm[k] = c;
        for (int a = 0; a < GT_ARENA_COUNT; a++)
            if (p->dev_bytes[a])
                GT_TRY(gt_comm_nccl_window_register(c, p->dev[a], p->dev_bytes[a], &p->win[k][a],
                                                    err));
    }
    return GT_OK;
}

static gt_status wait_queued(void *user, gt_error *err);

/* Whether every collective over mesh dim k is a send_start or recv_start (a pipeline's "pp" dim:
 * gt_pp_unroll), which host communicators carry through host memory. */
static bool p2p_only(const gt_cuda_program *p, int k)
{
    for (int32_t j = 0; j < p->prog->n_instrs; j++) {
        const gt_instr *ins = &p->prog->instrs[j];
        if (gt_op_is_collective_start(ins->op) && ins->i[0] == k && ins->op != GT_OP_SEND_START &&
            ins->op != GT_OP_RECV_START)
            return false;
    }
    return true;
}

gt_status gt_cuda_program_set_comms(gt_cuda_program *p, gt_comm *const comms[GT_MESH_MAX_DIMS],
                                    gt_error *err)
{
    for (int k = 0; k < GT_MESH_MAX_DIMS; k++) {
        gt_comm *c = comms ? comms[k] : NULL;
        if (c && gt_comm_size(c) > 1 && !gt_comm_is_nccl(c) && !p2p_only(p, k))
            return gt_error_set(err, GT_ERR_INVALID,
                                "program: the communicator '%s' for mesh dim %d is a %s "
                                "communicator; a CUDA program moves device buffers and needs NCCL "
                                "communicators (gt_comm_nccl_create)",
                                c->name, k, c->vt->name);
        if ((p->n_seg[0] || p->n_seg[1]) && c != p->prog->comms[k])
            return gt_error_set(err, GT_ERR_INVALID,
                                "program: the communicator for mesh dim %d changed after the step "
                                "was captured as a CUDA graph (the graph holds the old one): set "
                                "the communicators before the warm-up step",
                                k);
    }
    GT_TRY(gt_program_set_comms(p->prog, comms, err));
    p->nccl = false;
    for (int k = 0; k < GT_MESH_MAX_DIMS; k++)
        p->nccl |= gt_comm_is_nccl(p->prog->comms[k]);
    /* the backend's own host waits (tuning, checks, scratch growth) go through the same wait */
    gt_cuda_stream_set_drain(p->stream, p->nccl ? wait_queued : NULL, p);
    return p->nccl_buffers == GT_NCCL_BUFFERS_SYMMETRIC ? register_windows(p, err) : GT_OK;
}

/* A start posts its collective (over one rank: a device copy); a wait orders the program's stream
 * after it. Neither blocks the host. */
/* Timing event e (0 before the start, 1 before the wait, 2 after it) of a slot, when timing. */
static void record_timing(gt_cuda_program *p, int32_t slot, int e)
{
    if (!p->timing || !p->tev) return;
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    cudaStreamIsCapturing(stream_of(p), &cs);
    if (cs == cudaStreamCaptureStatusNone) cudaEventRecord(p->tev[3 * slot + e], stream_of(p));
}

/* A send_start or recv_start: over a host communicator (MPI, TCP) the bytes go through host
 * memory. A send copies the value out once the stream has computed it and posts it without
 * blocking (its wait completes the sends, at the end of the step); a receive blocks until the
 * bytes arrive and queues their copy to the device. Both wait for the device, so a captured step
 * runs them on the host between its graphs (gt_cuda_program_capture_part). */
static gt_status host_p2p(gt_cuda_program *p, const gt_instr *ins, gt_comm *c, gt_error *err)
{
    /* NCCL's send and receive block in the stream: posted in one stream in schedule order they
     * deadlock where two ranks send to each other first, so they need a stream per direction
     * (and two GPUs to test it) */
    if (gt_comm_is_nccl(c))
        return gt_error_set(err, GT_ERR_UNSUPPORTED,
                            "%s: a pipeline's point-to-point transfers run on host communicators "
                            "(MPI, TCP), not yet over NCCL",
                            gt_op_get(ins->op)->name);
    gt_program_slot *slot = &p->prog->slots[ins->slot];
    bool send = ins->op == GT_OP_SEND_START;
    gt_tensor h = send ? slot->in : slot->out;
    size_t nb = gt_tensor_nbytes(&h);
    if (!p->p2p_host) p->p2p_host = gt_xcalloc((size_t)p->prog->n_slots + 1, sizeof *p->p2p_host);
    if (!p->p2p_host[ins->slot]) p->p2p_host[ins->slot] = gt_xmalloc(nb ? nb : 1);
    void *dev = h.data;
    h.data = p->p2p_host[ins->slot];
    cudaStream_t st = stream_of(p);
    if (!send) {
        GT_TRY(gt_comm_recv(c, &h, (int)ins->i[2], (int)ins->i[3], err));
        /* from pageable memory: the call returns once the bytes are staged, so the next
         * receive into this slot's bytes cannot overtake it */
        return nb ? cuda_error(cudaMemcpyAsync(dev, h.data, nb, cudaMemcpyHostToDevice, st),
                               "copying received bytes to the device", err)
                  : GT_OK;
    }
    if (nb) {
        GT_TRY(cuda_error(cudaMemcpyAsync(h.data, dev, nb, cudaMemcpyDeviceToHost, st),
                          "copying a value to send to the host", err));
        GT_TRY(gt_cuda_stream_sync(p->stream, err));
    }
    GT_TRY(gt_comm_send_start(c, &h, (int)ins->i[2], (int)ins->i[3], err));
    slot->sent = c;
    return GT_OK;
}

static gt_status run_collective(gt_cuda_program *p, const gt_instr *ins, gt_error *err)
{
    gt_program_slot *slot = &p->prog->slots[ins->slot];
    gt_status st = GT_OK;
    if (ins->op == GT_OP_WAIT) {
        record_timing(p, ins->slot, 1);
        if (slot->req) st = gt_comm_wait(slot->req, err); /* frees the request, also on error */
        if (slot->sent && st == GT_OK) st = gt_comm_send_wait_all(slot->sent, err);
        slot->req = NULL;
        slot->sent = NULL;
        record_timing(p, ins->slot, 2);
    } else {
        record_timing(p, ins->slot, 0);
        gt_comm *c;
        GT_CHECK(!slot->req);
        st = gt_runtime_comm_for(p->prog->g, ins->i[0], ins->i[1], p->prog->comms, &c, err);
        if (st == GT_OK) {
            ref_tensor(p, &ins->in[0], &slot->in);
            ref_tensor(p, &ins->out[0], &slot->out);
            if (!c) {
                /* a collective over one rank is its input (widened by a widening reduce_scatter):
                 * the cast kernel to the output's dtype, a device copy or the exact widening */
                GT_CHECK(slot->in.dtype == slot->out.dtype ||
                         gt_dtype_widens_to_f32(slot->in.dtype, slot->out.dtype));
                int64_t dtype = (int64_t)slot->out.dtype;
                gt_kernel_call call = {
                    .op = GT_OP_CAST, .i = &dtype, .ni = 1, .n_in = 1, .n_out = 1};
                call.in[0] = &slot->in;
                call.out[0] = &slot->out;
                st = gt_cuda_run_kernel(&call, p->stream, err);
            } else if (ins->op == GT_OP_SEND_START || ins->op == GT_OP_RECV_START) {
                st = host_p2p(p, ins, c, err);
            } else { /* NCCL: gt_cuda_program_set_comms accepts no other communicator of > 1 rank */
                gt_comm_nccl_set_stream(c, stream_of(p));
                st = gt_runtime_start(ins->op, c, ins->i, &slot->in, &slot->out, &slot->req, err);
            }
        }
    }
    if (st != GT_OK) gt_program_wrap_kernel_error(p->prog->g, ins, " (cuda)", err);
    return st;
}

gt_status gt_cuda_program_set_comm_timing(gt_cuda_program *p, bool on, gt_error *err)
{
    for (int k = 0; on && k < 2; k++)
        if (!p->run_ev[k])
            GT_TRY(cuda_error(cudaEventCreate(&p->run_ev[k]), "creating a timing event", err));
    if (on && !p->tev && p->prog->n_slots > 0) {
        p->tev = gt_xcalloc((size_t)3 * (size_t)p->prog->n_slots, sizeof *p->tev);
        for (int32_t k = 0; k < 3 * p->prog->n_slots; k++)
            GT_TRY(cuda_error(cudaEventCreate(&p->tev[k]), "creating a timing event", err));
    }
    p->timing = on;
    return GT_OK;
}

double gt_cuda_program_timed_run_seconds(gt_cuda_program *p)
{
    float ms = 0;
    if (!p->run_ev[1] || cudaEventSynchronize(p->run_ev[1]) != cudaSuccess ||
        cudaEventElapsedTime(&ms, p->run_ev[0], p->run_ev[1]) != cudaSuccess) {
        cudaGetLastError();
        return 0.0;
    }
    return 1e-3 * ms;
}

/* A slot's timing events of the timed run: start, wait entered, wait passed (no figure, and no
 * sticky error, for an event never recorded). */
static void cuda_slot_times(void *user, int32_t slot, double *total_s, double *exposed_s)
{
    const gt_cuda_program *p = user;
    float total = 0, exposed = 0;
    if (p->tev && cudaEventSynchronize(p->tev[3 * slot + 2]) == cudaSuccess &&
        cudaEventElapsedTime(&total, p->tev[3 * slot], p->tev[3 * slot + 2]) == cudaSuccess &&
        cudaEventElapsedTime(&exposed, p->tev[3 * slot + 1], p->tev[3 * slot + 2]) == cudaSuccess) {
        *total_s = 1e-3 * total;
        *exposed_s = 1e-3 * exposed;
    } else {
        cudaGetLastError();
    }
}

int32_t gt_cuda_program_comm_timings(gt_cuda_program *p, gt_comm_timing *out, int32_t max)
{
    return gt_runtime_comm_timings(p->prog, out, max, cuda_slot_times, p);
}

/* Host waits: through the communicators' watchdog when the program has NCCL collectives. */
static gt_status wait_event(gt_cuda_program *p, cudaEvent_t ev, const char *what, gt_error *err)
{
    if (p->nccl) return gt_comm_nccl_wait_event(p->prog->comms, GT_MESH_MAX_DIMS, ev, err);
    return cuda_error(cudaEventSynchronize(ev), what, err);
}

/* Waits for everything queued on the stream, through the NCCL-aware event wait: the stream's
 * drain (gt_cuda_stream_set_drain) in a program with NCCL collectives. */
static gt_status wait_queued(void *user, gt_error *err)
{
    gt_cuda_program *p = user;
    if (!p->sync_ev)
        GT_TRY(cuda_error(cudaEventCreateWithFlags(&p->sync_ev, cudaEventDisableTiming),
                          "creating an event", err));
    GT_TRY(cuda_error(cudaEventRecord(p->sync_ev, stream_of(p)), "marking the stream", err));
    return wait_event(p, p->sync_ev, "waiting for the stream", err);
}

/* Waits for everything queued on the stream and reports a data error a kernel flagged. */
static gt_status wait_stream(gt_cuda_program *p, gt_error *err)
{
    if (p->nccl) GT_TRY(wait_queued(p, err));
    return gt_cuda_stream_sync(p->stream, err);
}

/* ---------------------------------------------------------------- running */

static gt_status run_instr(gt_cuda_program *p, const gt_instr *ins, gt_error *err)
{
    if (ins->slot >= 0) return run_collective(p, ins, err);
    gt_tensor in[GT_MAX_IN], out[GT_MAX_OUT];
    gt_kernel_call call;
    gt_program_kernel_call(ins, p->dev, &call, in, out);
    if (ins->op == GT_OP_MOE_PACK) gt_cuda_moe_pack_site(ins->node); /* its overflow names it */
    gt_status st = gt_cuda_run_kernel(&call, p->stream, err);
    if (st != GT_OK) gt_program_wrap_kernel_error(p->prog->g, ins, " (cuda)", err);
    return st;
}

/* The run's start or end event when timing (never inside a capture). */
static void record_run(gt_cuda_program *p, int e)
{
    if (!p->timing || !p->run_ev[e]) return;
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    cudaStreamIsCapturing(stream_of(p), &cs);
    if (cs == cudaStreamCaptureStatusNone) cudaEventRecord(p->run_ev[e], stream_of(p));
}

/* A multi-tensor adamw group, launched in place of its instructions. */
static gt_status run_group(gt_cuda_program *p, const adamw_group *grp, gt_error *err)
{
    gt_status st = gt_cuda_adamw_multi_run(grp->launch, p->stream, err);
    if (st != GT_OK) wrap_group_error(p, grp->first, grp->count, err);
    return st;
}

/* The NCCL communicator of instruction k when it is an all-gather start over more than one rank
 * that a run of `part` runs (k at or past `to`, skipped, or anything else: NULL). */
static gt_comm *gather_comm(const gt_cuda_program *p, int32_t k, int32_t to, gt_run_part part)
{
    if (k >= to || (part == GT_RUN_MICRO && !p->prog->micro[k])) return NULL;
    const gt_instr *ins = &p->prog->instrs[k];
    gt_comm *c = NULL;
    gt_error ignored = {0};
    if (ins->op != GT_OP_ALL_GATHER_START ||
        gt_runtime_comm_for(p->prog->g, ins->i[0], ins->i[1], p->prog->comms, &c, &ignored) !=
            GT_OK)
        return NULL;
    return gt_comm_is_nccl(c) ? c : NULL;
}

/* Runs instructions from .. to - 1 of `part` (an adamw group lies inside one range: its
 * instructions are consecutive device ones). */
static gt_status run_range(gt_cuda_program *p, gt_run_part part, int32_t from, int32_t to,
                           gt_error *err)
{
    int32_t next = 0;     /* the next adamw group */
    gt_comm *open = NULL; /* consecutive all-gathers on one communicator: one NCCL group */
    while (next < p->n_groups && p->groups[next].first < from)
        next++;
    for (int32_t k = from; k < to; k++) {
        if (part == GT_RUN_MICRO && !p->prog->micro[k]) { /* an adamw group is the optimizer's */
            if (next < p->n_groups && p->groups[next].first == k) k += p->groups[next++].count - 1;
            continue;
        }
        gt_status st = GT_OK;
        gt_comm *c = gather_comm(p, k, to, part);
        gt_comm *after = c ? gather_comm(p, k + 1, to, part) : NULL;
        if (c && !open && after == c) {
            st = gt_comm_nccl_group_begin(c, err);
            if (st == GT_OK) open = c;
        }
        if (st == GT_OK && next < p->n_groups && p->groups[next].first == k) {
            st = run_group(p, &p->groups[next], err);
            k += p->groups[next++].count - 1;
        } else if (st == GT_OK) {
            st = run_instr(p, &p->prog->instrs[k], err);
        }
        if (open && (st != GT_OK || after != open)) {
            gt_error ignored = {0};
            gt_status end = gt_comm_nccl_group_end(open, st == GT_OK ? err : &ignored);
            if (st == GT_OK) st = end;
            open = NULL;
        }
        if (st != GT_OK) {
            gt_runtime_drain_slots(p->prog);
            return st;
        }
    }
    return GT_OK;
}

static gt_status run_instrs(gt_cuda_program *p, gt_run_part part, gt_error *err)
{
    GT_TRY(gt_runtime_check_comms(p->prog, " (cuda)", err));
    record_run(p, 0);
    GT_TRY(run_range(p, part, 0, p->prog->n_instrs, err));
    record_run(p, 1);
    return GT_OK;
}

/* A replay: each segment's graph, then the host instructions after it, run as they come. */
static gt_status replay(gt_cuda_program *p, gt_run_part part, gt_error *err)
{
    const captured_seg *seg = p->seg[part];
    for (int32_t i = 0; i < p->n_seg[part]; i++) {
        if (seg[i].exec)
            GT_TRY(cuda_error(cudaGraphLaunch(seg[i].exec, stream_of(p)),
                              "launching the step graph", err));
        int32_t end = i + 1 < p->n_seg[part] ? seg[i + 1].from : p->prog->n_instrs;
        GT_TRY(run_range(p, part, seg[i].to, end, err));
    }
    return GT_OK;
}

gt_status gt_cuda_program_exec(gt_cuda_program *p, gt_error *err)
{
    return gt_cuda_program_exec_part(p, GT_RUN_ALL, err);
}

gt_status gt_cuda_program_exec_part(gt_cuda_program *p, gt_run_part part, gt_error *err)
{
    if (p->n_seg[part]) return replay(p, part, err);
    return run_instrs(p, part, err);
}

/* The runs of part's device instructions between host ones; the first starts at 0. */
static void find_segs(gt_cuda_program *p, gt_run_part part)
{
    int32_t n = p->prog->n_instrs;
    uint8_t *p2p_slot = gt_xcalloc((size_t)p->prog->n_slots + 1, 1);
    captured_seg *seg = gt_xcalloc((size_t)n + 1, sizeof *seg);
    int32_t n_seg = 1;
    bool in_host = false;
    for (int32_t k = 0; k < n; k++) {
        /* a host instruction: a send_start or recv_start (host_p2p) or the wait of its slot */
        const gt_instr *ins = &p->prog->instrs[k];
        if (ins->op == GT_OP_SEND_START || ins->op == GT_OP_RECV_START) p2p_slot[ins->slot] = 1;
        bool host = ins->slot >= 0 && p2p_slot[ins->slot];
        if (host && !in_host) seg[n_seg - 1].to = k;
        if (!host && in_host) seg[n_seg++].from = k;
        in_host = host;
    }
    if (!in_host) seg[n_seg - 1].to = n;
    free(p2p_slot);
    p->seg[part] = seg;
    p->n_seg[part] = n_seg;
}

/* Capture records the launches run_range makes without running them. Thread-local mode makes a
 * call that would synchronise or allocate from this thread (cudaMalloc, a stream sync) fail the
 * capture instead of happening: the backend's caches (cuBLASLt algorithm per shape, scratch size,
 * shared-memory limits) must already be filled by a warm-up run, and its scratch refuses to grow
 * while capturing. Every kernel then sees the same pointers and arguments as in the eager run,
 * so a replay is bitwise the eager step. */
static gt_status capture_seg(gt_cuda_program *p, gt_run_part part, captured_seg *seg, gt_error *err)
{
    cudaStream_t st = stream_of(p);
    GT_TRY(cuda_error(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal),
                      "beginning the step graph capture", err));
    gt_status s = run_range(p, part, seg->from, seg->to, err);
    cudaError_t e = cudaStreamEndCapture(st, &seg->graph);
    if (s == GT_OK && e != cudaSuccess) s = cuda_error(e, "capturing the step graph", err);
    if (s == GT_OK && !seg->graph)
        s = gt_error_set(err, GT_ERR_INTERNAL, "program: the step graph capture gave no graph");
    /* node priorities: the collectives' kernels keep their stream's high priority in the replay
     * (by default a graph runs every kernel at its launch stream's priority, so a gather queued
     * behind compute blocks started late and the next layer waited for it) */
    if (s == GT_OK)
        s = cuda_error(
            cudaGraphInstantiate(&seg->exec, seg->graph, cudaGraphInstantiateFlagUseNodePriority),
            "instantiating the step graph", err);
    /* upload now, so the first replay costs what every replay costs */
    if (s == GT_OK) s = cuda_error(cudaGraphUpload(seg->exec, st), "uploading", err);
    if (s != GT_OK) cudaGetLastError(); /* a failed capture leaves no sticky error */
    return s;
}

gt_status gt_cuda_program_capture(gt_cuda_program *p, gt_error *err)
{
    return gt_cuda_program_capture_part(p, GT_RUN_ALL, err);
}

/* One graph per segment (find_segs): a step without host transfers is one graph. */
gt_status gt_cuda_program_capture_part(gt_cuda_program *p, gt_run_part part, gt_error *err)
{
    if (p->n_seg[part]) return GT_OK;
    GT_TRY(gt_runtime_check_comms(p->prog, " (cuda)", err));
    find_segs(p, part);
    for (int32_t i = 0; i < p->n_seg[part]; i++) {
        captured_seg *seg = &p->seg[part][i];
        if (seg->from == seg->to || capture_seg(p, part, seg, err) == GT_OK) continue;
        int32_t from = seg->from, to = seg->to;
        free_segs(p, part);
        return gt_error_wrap(err, "program: capturing instructions %d..%d of %d as a CUDA graph",
                             from, to - 1, p->prog->n_instrs);
    }
    return GT_OK;
}

bool gt_cuda_program_captured(const gt_cuda_program *p)
{
    return p->n_seg[GT_RUN_ALL] > 0;
}

/* Makes the current step's slot free for the host to write: step n_ended - 2 used it last. */
static gt_status claim_slot(gt_cuda_program *p, gt_error *err)
{
    if (p->slot_claimed) return GT_OK;
    int sl = (int)(p->n_ended & 1);
    if (!p->done[sl])
        GT_TRY(cuda_error(cudaEventCreateWithFlags(&p->done[sl], cudaEventDisableTiming),
                          "creating a step event", err));
    else if (p->n_ended >= GT_CUDA_SLOTS)
        GT_TRY(wait_event(p, p->done[sl], "waiting for an earlier step", err));
    if (!p->in_pin[sl]) {
        p->in_pin[sl] = gt_xcalloc((size_t)p->prog->n_inputs + 1, sizeof(void *));
        p->out_pin[sl] = gt_xcalloc((size_t)p->prog->n_outputs + 1, sizeof(void *));
    }
    if (!p->error_word[sl])
        GT_TRY(cuda_error(cudaHostAlloc((void **)&p->error_word[sl],
                                        GT_CUDA_ERROR_WORDS * sizeof(unsigned long long),
                                        cudaHostAllocDefault),
                          "pinned host memory for the error word", err));
    p->slot_claimed = true;
    return GT_OK;
}

/* The pinned buffer *pin of n bytes, allocated on its first use (the warm-up step). */
static gt_status pinned(void **pin, size_t n, gt_error *err)
{
    if (*pin || n == 0) return GT_OK;
    cudaError_t e = cudaHostAlloc(pin, n, cudaHostAllocDefault);
    if (e != cudaSuccess) {
        *pin = NULL;
        return gt_error_set(err, GT_ERR_NOMEM, "program: %zu bytes of pinned host memory: %s", n,
                            cudaGetErrorString(e));
    }
    return GT_OK;
}

gt_status gt_cuda_program_stage_input(gt_cuda_program *p, int32_t k, const gt_tensor *t,
                                      gt_error *err)
{
    if (k < 0 || k >= p->prog->n_inputs)
        return gt_error_set(err, GT_ERR_INVALID, "program: no graph input %d (it has %d)", k,
                            p->prog->n_inputs);
    const gt_buffer_ref *r = &p->prog->inputs[k];
    if (!gt_runtime_ref_matches(r, t, false))
        return gt_runtime_ref_type_error("staged graph input", k, input_name(p, k), r, t, err);
    size_t n = gt_runtime_ref_bytes(r);
    if (n == 0) return GT_OK;
    if (!t->data)
        return gt_error_set(err, GT_ERR_INVALID, "graph input %d (%s): tensor has no data", k,
                            input_name(p, k));
    GT_TRY(claim_slot(p, err));
    void **pin = &p->in_pin[p->n_ended & 1][k];
    GT_TRY(pinned(pin, n, err));
    memcpy(*pin, t->data, n);
    return gt_cuda_memcpy_h2d(p->stream, ref_data(p, r), *pin, n, err);
}

gt_status gt_cuda_program_fetch_output(gt_cuda_program *p, int32_t k, gt_error *err)
{
    if (k < 0 || k >= p->prog->n_outputs)
        return gt_error_set(err, GT_ERR_INVALID, "program: no graph output %d (it has %d)", k,
                            p->prog->n_outputs);
    const gt_buffer_ref *r = &p->prog->outputs[k];
    size_t n = gt_runtime_ref_bytes(r);
    if (n == 0) return GT_OK;
    GT_TRY(claim_slot(p, err));
    void **pin = &p->out_pin[p->n_ended & 1][k];
    GT_TRY(pinned(pin, n, err));
    return gt_cuda_memcpy_d2h(p->stream, *pin, ref_data(p, r), n, err);
}

gt_status gt_cuda_program_step_end(gt_cuda_program *p, int64_t *ticket, gt_error *err)
{
    GT_TRY(claim_slot(p, err));
    int sl = (int)(p->n_ended & 1);
    GT_TRY(gt_cuda_stream_copy_error(p->stream, p->error_word[sl], err));
    GT_TRY(cuda_error(cudaEventRecord(p->done[sl], stream_of(p)), "marking the step's end", err));
    *ticket = p->n_ended++;
    p->slot_claimed = false;
    return GT_OK;
}

/* A ticket's slot holds its bytes while it is one of the last two steps ended. */
static bool ticket_live(const gt_cuda_program *p, int64_t ticket)
{
    return ticket >= 0 && ticket < p->n_ended && ticket >= p->n_ended - GT_CUDA_SLOTS &&
           !(ticket == p->n_ended - GT_CUDA_SLOTS && p->slot_claimed);
}

gt_status gt_cuda_program_step_wait(gt_cuda_program *p, int64_t ticket, gt_error *err)
{
    if (!ticket_live(p, ticket))
        return gt_error_set(err, GT_ERR_INVALID,
                            "program: step ticket %lld is not one of the last two steps ended "
                            "(%lld ended)",
                            (long long)ticket, (long long)p->n_ended);
    int sl = (int)(ticket & 1);
    GT_TRY(wait_event(p, p->done[sl], "waiting for a step", err));
    gt_status st = gt_cuda_error_report(p->error_word[sl], err);
    /* a moe_pack capacity overflow, checked on the device during the step: named by its node as
     * the CPU's error is */
    int64_t node = st == GT_OK ? -1 : gt_cuda_moe_overflow_node(p->error_word[sl]);
    for (int32_t k = 0; node >= 0 && k < p->prog->n_instrs; k++)
        if (p->prog->instrs[k].node == node) {
            gt_program_wrap_kernel_error(p->prog->g, &p->prog->instrs[k], " (cuda)", err);
            break;
        }
    return st;
}

const void *gt_cuda_program_fetched(const gt_cuda_program *p, int64_t ticket, int32_t k)
{
    if (!ticket_live(p, ticket) || k < 0 || k >= p->prog->n_outputs) return NULL;
    return p->out_pin[ticket & 1][k];
}

gt_status gt_cuda_program_mark(gt_cuda_program *p, int64_t mark, gt_error *err)
{
    if (mark < 0) return gt_error_set(err, GT_ERR_INVALID, "program: mark %lld", (long long)mark);
    int k = (int)(mark % GT_CUDA_MARKS);
    if (!p->mark[k])
        GT_TRY(cuda_error(cudaEventCreate(&p->mark[k]), "creating a timing event", err));
    p->mark_n[k] = mark;
    return cuda_error(cudaEventRecord(p->mark[k], stream_of(p)), "recording a mark", err);
}

gt_status gt_cuda_program_mark_seconds(gt_cuda_program *p, int64_t from, int64_t to, double *s,
                                       gt_error *err)
{
    int a = (int)(from % GT_CUDA_MARKS), b = (int)(to % GT_CUDA_MARKS);
    if (from < 0 || to < 0 || !p->mark[a] || !p->mark[b] || p->mark_n[a] != from ||
        p->mark_n[b] != to)
        return gt_error_set(err, GT_ERR_INVALID,
                            "program: marks %lld and %lld are not both among the last %d recorded",
                            (long long)from, (long long)to, GT_CUDA_MARKS);
    GT_TRY(wait_event(p, p->mark[b], "waiting for a mark", err));
    float ms = 0;
    GT_TRY(cuda_error(cudaEventElapsedTime(&ms, p->mark[a], p->mark[b]), "timing two marks", err));
    *s = ms / 1e3;
    return GT_OK;
}

gt_status gt_cuda_program_carry(gt_cuda_program *p, int32_t out_k, int32_t in_k, gt_error *err)
{
    if (out_k < 0 || out_k >= p->prog->n_outputs || in_k < 0 || in_k >= p->prog->n_inputs)
        return gt_error_set(err, GT_ERR_INVALID,
                            "program: carry from output %d to input %d, but the graph has %d "
                            "outputs and %d inputs",
                            out_k, in_k, p->prog->n_outputs, p->prog->n_inputs);
    const gt_buffer_ref *o = &p->prog->outputs[out_k], *i = &p->prog->inputs[in_k];
    gt_tensor src, dst;
    ref_tensor(p, o, &src);
    ref_tensor(p, i, &dst);
    if (!gt_runtime_ref_matches(i, &src, true))
        return gt_runtime_ref_type_error("carry into graph input", in_k, input_name(p, in_k), i,
                                         &src, err);
    if (o->arena == i->arena && o->offset == i->offset) return GT_OK; /* in place */
    /* a same-dtype cast is the backend's device-to-device copy (src viewed in dst's shape) */
    gt_tensor_wrap(&src, o->dtype, i->ndim, i->shape, ref_data(p, o));
    int64_t dtype = (int64_t)i->dtype;
    gt_kernel_call call = {.op = GT_OP_CAST, .i = &dtype, .ni = 1, .n_in = 1, .n_out = 1};
    call.in[0] = &src;
    call.out[0] = &dst;
    gt_status st = gt_cuda_run_kernel(&call, p->stream, err);
    if (st != GT_OK)
        gt_error_wrap(err, "program: carrying graph output %d into input %d (%s)", out_k, in_k,
                      input_name(p, in_k));
    return st;
}

gt_status gt_cuda_program_sync(gt_cuda_program *p, gt_error *err)
{
    return wait_stream(p, err);
}

static gt_status read_ref(gt_cuda_program *p, const gt_buffer_ref *r, gt_tensor *dst, gt_error *err)
{
    GT_TRY(gt_cuda_memcpy_d2h(p->stream, dst->data, ref_data(p, r), gt_runtime_ref_bytes(r), err));
    return wait_stream(p, err);
}

gt_status gt_cuda_program_read_input(gt_cuda_program *p, int32_t k, gt_tensor *dst, gt_error *err)
{
    if (k < 0 || k >= p->prog->n_inputs)
        return gt_error_set(err, GT_ERR_INVALID, "program: no graph input %d (it has %d)", k,
                            p->prog->n_inputs);
    const gt_buffer_ref *r = &p->prog->inputs[k];
    if (!gt_runtime_ref_matches(r, dst, true))
        return gt_runtime_ref_type_error("reading graph input", k, input_name(p, k), r, dst, err);
    return read_ref(p, r, dst, err);
}

/* *at: the device address of bytes [offset, offset + n) of graph input k; a range outside the
 * buffer is GT_ERR_INVALID naming the input. */
static gt_status input_bytes(gt_cuda_program *p, int32_t k, size_t offset, size_t n, char **at,
                             gt_error *err)
{
    if (k < 0 || k >= p->prog->n_inputs)
        return gt_error_set(err, GT_ERR_INVALID, "program: no graph input %d (it has %d)", k,
                            p->prog->n_inputs);
    const gt_buffer_ref *r = &p->prog->inputs[k];
    size_t have = gt_runtime_ref_bytes(r);
    if (offset > have || n > have - offset)
        return gt_error_set(err, GT_ERR_INVALID,
                            "program: bytes [%zu, %zu) of graph input %d (%s), which has %zu",
                            offset, offset + n, k, input_name(p, k), have);
    *at = (char *)ref_data(p, r) + offset;
    return GT_OK;
}

void *gt_cuda_program_input_data(gt_cuda_program *p, int32_t k)
{
    char *at = NULL;
    gt_error ignored = {0};
    return input_bytes(p, k, 0, 0, &at, &ignored) == GT_OK ? at : NULL;
}

gt_status gt_cuda_program_zero_input(gt_cuda_program *p, int32_t k, gt_error *err)
{
    char *at = NULL;
    GT_TRY(input_bytes(p, k, 0, 0, &at, err)); /* checks k */
    size_t n = gt_runtime_ref_bytes(&p->prog->inputs[k]);
    return cuda_error(cudaMemsetAsync(at, 0, n, stream_of(p)), "zeroing a graph input", err);
}

gt_status gt_cuda_program_read_input_bytes(gt_cuda_program *p, int32_t k, size_t offset, size_t n,
                                           void *dst, gt_error *err)
{
    char *at = NULL;
    GT_TRY(input_bytes(p, k, offset, n, &at, err));
    GT_TRY(gt_cuda_memcpy_d2h(p->stream, dst, at, n, err));
    return wait_stream(p, err);
}

gt_status gt_cuda_program_queue_input_bytes(gt_cuda_program *p, int32_t k, size_t offset, size_t n,
                                            const void *src, gt_error *err)
{
    char *at = NULL;
    GT_TRY(input_bytes(p, k, offset, n, &at, err));
    return gt_cuda_memcpy_h2d(p->stream, at, src, n, err);
}

gt_status gt_cuda_program_read_output(gt_cuda_program *p, int32_t k, gt_tensor *out, gt_error *err)
{
    memset(out, 0, sizeof *out);
    if (k < 0 || k >= p->prog->n_outputs)
        return gt_error_set(err, GT_ERR_INVALID, "program: no graph output %d (it has %d)", k,
                            p->prog->n_outputs);
    const gt_buffer_ref *r = &p->prog->outputs[k];
    GT_TRY(gt_tensor_alloc(out, r->dtype, r->ndim, r->shape, err));
    gt_status st = read_ref(p, r, out, err);
    if (st != GT_OK) gt_tensor_free(out);
    return st;
}

gt_status gt_cuda_program_run(gt_cuda_program *p, const gt_tensor *inputs, gt_tensor *outputs,
                              gt_error *err)
{
    const gt_program *prog = p->prog;
    if ((prog->n_inputs > 0 && !inputs) || (prog->n_outputs > 0 && !outputs))
        return gt_error_set(err, GT_ERR_INVALID,
                            "program run: the graph has %d inputs and %d outputs but got %s array",
                            prog->n_inputs, prog->n_outputs, inputs ? "no outputs" : "no inputs");
    for (int32_t k = 0; k < prog->n_outputs; k++)
        memset(&outputs[k], 0, sizeof outputs[k]);
    for (int32_t k = 0; k < prog->n_inputs; k++)
        GT_TRY(gt_cuda_program_set_input(p, k, &inputs[k], err));
    gt_status st = gt_cuda_program_exec(p, err);
    gt_error ignored = {0};
    /* on a queueing error, still wait: the host inputs must not be freed under a pending copy */
    if (st != GT_OK) {
        wait_stream(p, &ignored);
        return st;
    }
    GT_TRY(wait_stream(p, err));
    for (int32_t k = 0; k < prog->n_outputs; k++) {
        st = gt_cuda_program_read_output(p, k, &outputs[k], err);
        if (st != GT_OK) {
            for (int32_t j = 0; j < k; j++)
                gt_tensor_free(&outputs[j]);
            return st;
        }
    }
    return GT_OK;
}

#endif /* GT_HAVE_CUDA */
