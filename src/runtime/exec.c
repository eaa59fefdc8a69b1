/* exec.c — the program executor on the CPU backend (gt_program.h).
 *
 * A run: check and copy each graph input into its planned buffer; call gt_cpu_run_kernel for each
 * instruction with gt_tensor views (gt_tensor_wrap) onto the arenas; copy each graph output out
 * into a fresh tensor the caller owns. Kernels write every element of their outputs, so the
 * arenas are never cleared between runs.
 *
 * Collectives are not kernels: a start posts its collective on the communicator of its mesh dim
 * with views of its arena buffers kept in its slot (the request reads them until the wait), and
 * its wait completes the request; the wait's output is the start's buffer (the plan shares it), so
 * the wait moves no bytes. A group of size 1 is a copy at the start. Before the first instruction
 * the run checks that every collective has its communicator, so that a missing one fails on
 * every rank before anything is posted; a run that fails with collectives in flight completes
 * them before returning, so no request outlives the run. */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "graphtrain/gt_program.h"
#include "runtime_internal.h"

static void *ref_data(void *const *arena, const gt_buffer_ref *r)
{
    return arena[r->arena] ? (char *)arena[r->arena] + r->offset : NULL;
}

static void ref_tensor(void *const *arena, const gt_buffer_ref *r, gt_tensor *t)
{
    gt_tensor_wrap(t, r->dtype, r->ndim, r->shape, ref_data(arena, r));
}

static gt_status copy_input(gt_program *p, int32_t k, const gt_tensor *t, gt_error *err)
{
    const gt_graph *g = p->g;
    const gt_io *io = &g->inputs[k];
    const gt_buffer_ref *r = &p->inputs[k];
    char name[200];
    snprintf(name, sizeof name, "%s %s", gt_input_kind_name((gt_input_kind)io->kind),
             gt_graph_str(g, io->fqn));
    if (!gt_runtime_ref_matches(r, t, false))
        return gt_runtime_ref_type_error("graph input", k, name, r, t, err);
    size_t nbytes = gt_tensor_nbytes(t);
    if (!nbytes) return GT_OK;
    if (!t->data)
        return gt_error_set(err, GT_ERR_INVALID, "graph input %d (%s): tensor has no data", k,
                            name);
    /* memmove: the caller may pass a view of the arena */
    memmove(ref_data(p->arena, r), t->data, nbytes);
    return GT_OK;
}

void gt_program_kernel_call(const gt_instr *ins, void *const *arena, gt_kernel_call *call,
                            gt_tensor *in, gt_tensor *out)
{
    *call = (gt_kernel_call){
        .op = ins->op,
        .i = ins->i,
        .f = ins->f,
        .e = ins->e,
        .ni = ins->ni,
        .nf = ins->nf,
        .ne = ins->ne,
        .n_in = ins->n_in,
        .n_out = ins->n_out,
    };
    for (int j = 0; j < ins->n_in; j++) {
        ref_tensor(arena, &ins->in[j], &in[j]);
        call->in[j] = &in[j];
    }
    for (int j = 0; j < ins->n_out; j++) {
        ref_tensor(arena, &ins->out[j], &out[j]);
        call->out[j] = &out[j];
    }
}

void gt_program_wrap_kernel_error(const gt_graph *g, const gt_instr *ins, const char *suffix,
                                  gt_error *err)
{
    const gt_node *nd = &g->nodes[ins->node];
    const char *fqn = gt_graph_str(g, nd->fqn);
    gt_error_wrap(err, "node %%%d %s%s%s%s", ins->node, gt_op_get(nd->op)->name,
                  fqn && fqn[0] ? " at " : "", fqn ? fqn : "", suffix);
}

/* ---------------------------------------------------------------- collectives (eager.c too) */

gt_coll_kind gt_runtime_coll_kind(gt_op op)
{
    switch (op) {
    case GT_OP_ALL_GATHER_START:
        return GT_COLL_ALL_GATHER;
    case GT_OP_REDUCE_SCATTER_START:
        return GT_COLL_REDUCE_SCATTER;
    case GT_OP_ALL_TO_ALL_START:
        return GT_COLL_ALL_TO_ALL;
    case GT_OP_SEND_START:
        return GT_COLL_SEND;
    case GT_OP_RECV_START:
        return GT_COLL_RECV;
    default:
        GT_CHECK(op == GT_OP_ALL_REDUCE_START);
        return GT_COLL_ALL_REDUCE;
    }
}

void gt_runtime_mesh_dim_label(const gt_graph *g, int64_t dim, char *buf, size_t len)
{
    if (g->mesh.ndim > 0 && dim >= 0 && dim < g->mesh.ndim)
        snprintf(buf, len, "mesh dim %lld (%s)", (long long)dim,
                 gt_graph_str(g, g->mesh.name[dim]));
    else
        snprintf(buf, len, "mesh dim %lld", (long long)dim);
}

gt_status gt_runtime_comm_for(const gt_graph *g, int64_t dim, int64_t group_size,
                              gt_comm *const *comms, gt_comm **out, gt_error *err)
{
    *out = NULL;
    if (group_size == 1) return GT_OK;
    gt_comm *c = comms && dim >= 0 && dim < GT_MESH_MAX_DIMS ? comms[dim] : NULL;
    if (c && gt_comm_size(c) == group_size) { /* every start of a run comes here: no formatting */
        *out = c;
        return GT_OK;
    }
    char where[96];
    gt_runtime_mesh_dim_label(g, dim, where, sizeof where);
    if (!c)
        return gt_error_set(err, GT_ERR_INVALID,
                            "a collective over %s (group_size %lld) needs a communicator for that "
                            "dim, and none is set (gt_program_set_comms / gt_eager_run_comms)",
                            where, (long long)group_size);
    return gt_error_set(err, GT_ERR_INVALID,
                        "a collective over %s has group_size %lld, but its communicator '%s' has "
                        "%d ranks",
                        where, (long long)group_size, c->name, gt_comm_size(c));
}

gt_status gt_runtime_start(gt_op op, gt_comm *c, const int64_t *i, const gt_tensor *in,
                           gt_tensor *out, gt_comm_request **req, gt_error *err)
{
    *req = NULL;
    if (op == GT_OP_SEND_START || op == GT_OP_RECV_START) {
        if (!c) /* the shape rule keeps the peer inside the group: a group of one has none */
            return gt_error_set(err, GT_ERR_INVALID, "%s to rank %lld of a group of one",
                                gt_op_get(op)->name, (long long)i[2]);
        return op == GT_OP_SEND_START ? gt_comm_send_start(c, in, (int)i[2], (int)i[3], err)
                                      : gt_comm_recv(c, out, (int)i[2], (int)i[3], err);
    }
    if (!c) {
        /* a group of one rank: gather, scatter and sum over it are the identity */
        return gt_comm_one_rank(in, out, err);
    }
    switch (gt_runtime_coll_kind(op)) {
    case GT_COLL_ALL_GATHER:
        return gt_comm_all_gather_start(c, in, out, req, err);
    case GT_COLL_REDUCE_SCATTER:
        return gt_comm_reduce_scatter_start(c, in, out, req, err);
    case GT_COLL_ALL_TO_ALL:
        return gt_comm_all_to_all_start(c, in, out, req, err);
    default:
        return gt_comm_all_reduce_start(c, in, out, req, err);
    }
}

gt_status gt_runtime_check_comms(const gt_program *p, const char *suffix, gt_error *err)
{
    for (int32_t k = 0; k < p->n_instrs; k++) {
        const gt_instr *ins = &p->instrs[k];
        if (!gt_op_is_collective_start(ins->op)) continue;
        gt_comm *c;
        gt_status st = gt_runtime_comm_for(p->g, ins->i[0], ins->i[1], p->comms, &c, err);
        if (st != GT_OK) {
            gt_program_wrap_kernel_error(p->g, ins, suffix, err);
            return st;
        }
    }
    return GT_OK;
}

static gt_status run_collective(gt_program *p, const gt_instr *ins, gt_error *err)
{
    gt_program_slot *slot = &p->slots[ins->slot];
    gt_status st = GT_OK;
    if (ins->op == GT_OP_WAIT) {
        slot->t_wait = gt_now_seconds();
        if (slot->req) st = gt_comm_wait(slot->req, err); /* frees the request, also on error */
        if (slot->sent) st = gt_comm_send_wait_all(slot->sent, err);
        slot->req = NULL;
        slot->sent = NULL;
        slot->t_done = gt_now_seconds();
    } else {
        slot->t_start = gt_now_seconds();
        gt_comm *c;
        GT_CHECK(!slot->req);
        st = gt_runtime_comm_for(p->g, ins->i[0], ins->i[1], p->comms, &c, err);
        if (st == GT_OK) {
            if (ins->n_in > 0) ref_tensor(p->arena, &ins->in[0], &slot->in);
            ref_tensor(p->arena, &ins->out[0], &slot->out);
            st = gt_runtime_start(ins->op, c, ins->i, &slot->in, &slot->out, &slot->req, err);
            if (st == GT_OK && ins->op == GT_OP_SEND_START) slot->sent = c;
        }
    }
    if (st != GT_OK) gt_program_wrap_kernel_error(p->g, ins, "", err);
    return st;
}

/* Clock readings of a slot's last run: start posted, wait entered, wait returned. */
static void cpu_slot_times(void *user, int32_t slot, double *total_s, double *exposed_s)
{
    const gt_program_slot *s = &((const gt_program *)user)->slots[slot];
    *total_s = s->t_done > s->t_start ? s->t_done - s->t_start : 0.0;
    *exposed_s = s->t_done > s->t_wait ? s->t_done - s->t_wait : 0.0;
}

int32_t gt_program_comm_timings(const gt_program *p, gt_comm_timing *out, int32_t max)
{
    return gt_runtime_comm_timings(p, out, max, cpu_slot_times, (void *)p);
}

void gt_runtime_drain_slots(gt_program *p)
{
    for (int32_t k = 0; k < p->n_slots; k++) {
        gt_error ignored = {0};
        if (p->slots[k].sent) gt_comm_send_wait_all(p->slots[k].sent, &ignored);
        p->slots[k].sent = NULL;
        if (!p->slots[k].req) continue;
        gt_comm_wait(p->slots[k].req, &ignored);
        p->slots[k].req = NULL;
    }
}

static gt_status run_instr(gt_program *p, const gt_instr *ins, gt_error *err)
{
    if (ins->slot >= 0) return run_collective(p, ins, err);
    gt_tensor in[GT_MAX_IN], out[GT_MAX_OUT];
    gt_kernel_call call;
    gt_program_kernel_call(ins, p->arena, &call, in, out);
    gt_status st = gt_cpu_run_kernel(&call, err);
    if (st != GT_OK) gt_program_wrap_kernel_error(p->g, ins, "", err);
    return st;
}

gt_status gt_program_set_input(gt_program *p, int32_t k, const gt_tensor *t, gt_error *err)
{
    if (k < 0 || k >= p->n_inputs)
        return gt_error_set(err, GT_ERR_INVALID, "program: no graph input %d (it has %d)", k,
                            p->n_inputs);
    return copy_input(p, k, t, err);
}

/* The instructions of `part` in order (the communicators checked by the caller). */
static gt_status run_instrs(gt_program *p, gt_run_part part, gt_error *err)
{
    for (int32_t k = 0; k < p->n_instrs; k++) {
        if (part == GT_RUN_MICRO && !p->micro[k]) continue;
        gt_status st = run_instr(p, &p->instrs[k], err);
        if (st != GT_OK) {
            gt_runtime_drain_slots(p);
            return st;
        }
    }
    return GT_OK;
}

gt_status gt_program_exec(gt_program *p, gt_error *err)
{
    return gt_program_exec_part(p, GT_RUN_ALL, err);
}

gt_status gt_program_exec_part(gt_program *p, gt_run_part part, gt_error *err)
{
    GT_TRY(gt_runtime_check_comms(p, "", err));
    return run_instrs(p, part, err);
}

gt_status gt_program_zero_input(gt_program *p, int32_t k, gt_error *err)
{
    if (k < 0 || k >= p->n_inputs)
        return gt_error_set(err, GT_ERR_INVALID, "program: no graph input %d (it has %d)", k,
                            p->n_inputs);
    size_t n = gt_runtime_ref_bytes(&p->inputs[k]);
    if (n) memset(ref_data(p->arena, &p->inputs[k]), 0, n);
    return GT_OK;
}

gt_status gt_program_output(const gt_program *p, int32_t k, gt_tensor *view, gt_error *err)
{
    memset(view, 0, sizeof *view);
    if (k < 0 || k >= p->n_outputs)
        return gt_error_set(err, GT_ERR_INVALID, "program: no graph output %d (it has %d)", k,
                            p->n_outputs);
    ref_tensor(p->arena, &p->outputs[k], view);
    return GT_OK;
}

gt_status gt_program_carry(gt_program *p, int32_t out_k, int32_t in_k, gt_error *err)
{
    if (out_k < 0 || out_k >= p->n_outputs || in_k < 0 || in_k >= p->n_inputs)
        return gt_error_set(err, GT_ERR_INVALID,
                            "program: carry from output %d to input %d, but the graph has %d "
                            "outputs and %d inputs",
                            out_k, in_k, p->n_outputs, p->n_inputs);
    const gt_buffer_ref *o = &p->outputs[out_k], *i = &p->inputs[in_k];
    gt_tensor src;
    ref_tensor(p->arena, o, &src);
    if (!gt_runtime_ref_matches(i, &src, true))
        return gt_runtime_ref_type_error("carry into graph input", in_k,
                                         gt_graph_str(p->g, p->g->inputs[in_k].fqn), i, &src, err);
    void *dst = ref_data(p->arena, i);
    if (src.data != dst) memmove(dst, src.data, gt_runtime_ref_bytes(i));
    return GT_OK;
}

gt_status gt_program_read_input(const gt_program *p, int32_t k, gt_tensor *dst, gt_error *err)
{
    if (k < 0 || k >= p->n_inputs)
        return gt_error_set(err, GT_ERR_INVALID, "program: no graph input %d (it has %d)", k,
                            p->n_inputs);
    const gt_buffer_ref *r = &p->inputs[k];
    if (!gt_runtime_ref_matches(r, dst, false) || (!dst->data && gt_runtime_ref_bytes(r)))
        return gt_runtime_ref_type_error("reading graph input", k,
                                         gt_graph_str(p->g, p->g->inputs[k].fqn), r, dst, err);
    size_t nbytes = gt_runtime_ref_bytes(r);
    if (nbytes) memmove(dst->data, ref_data(p->arena, r), nbytes);
    return GT_OK;
}

gt_status gt_program_run(gt_program *p, const gt_tensor *inputs, gt_tensor *outputs, gt_error *err)
{
    if ((p->n_inputs > 0 && !inputs) || (p->n_outputs > 0 && !outputs))
        return gt_error_set(err, GT_ERR_INVALID,
                            "program run: the graph has %d inputs and %d outputs but got %s array",
                            p->n_inputs, p->n_outputs, inputs ? "no outputs" : "no inputs");
    for (int32_t k = 0; k < p->n_outputs; k++)
        memset(&outputs[k], 0, sizeof outputs[k]);
    GT_TRY(gt_runtime_check_comms(p, "", err));
    for (int32_t k = 0; k < p->n_inputs; k++)
        GT_TRY(copy_input(p, k, &inputs[k], err));
    GT_TRY(run_instrs(p, GT_RUN_ALL, err));
    for (int32_t k = 0; k < p->n_outputs; k++) {
        const gt_buffer_ref *r = &p->outputs[k];
        gt_status st = gt_tensor_alloc(&outputs[k], r->dtype, r->ndim, r->shape, err);
        if (st != GT_OK) {
            for (int32_t j = 0; j < k; j++)
                gt_tensor_free(&outputs[j]);
            return st;
        }
        size_t nbytes = gt_tensor_nbytes(&outputs[k]);
        if (nbytes) memcpy(outputs[k].data, ref_data(p->arena, r), nbytes);
    }
    return GT_OK;
}
