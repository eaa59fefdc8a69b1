/* program.c — lowering: schedule + memory plan -> a flat array of instructions (gt_program.h).
 *
 * Each instruction carries what gt_cpu_run_kernel needs and nothing that needs the graph: the op,
 * its int and float attributes copied, its expression attributes evaluated under the binding, and
 * a buffer reference (arena, offset, dtype, concrete shape) per input and output. A reshape whose
 * output shares its input's bytes (a planned view) emits no instruction: the bytes are already
 * where its readers look. Both arenas are allocated here, once, at the planned sizes.
 *
 * Collectives: each start gets a request slot (instr.slot, numbered in schedule order) and its wait
 * the same slot, found through the wait's input 0 (the start's output). The communicators are
 * attached later (gt_program_set_comms): lowering needs only the mesh dim and group size, which
 * are the start's attributes, so one lowered program serves any communicator of the right size. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graphtrain/gt_program.h"
#include "runtime_internal.h"

static gt_buffer_ref buffer_ref(const gt_plan *p, gt_value_id v)
{
    const gt_value_plan *vp = &p->values[v];
    const gt_type *ty = gt_value_type(p->g, v);
    gt_buffer_ref r = {
        .arena = vp->arena, .dtype = ty->dtype, .ndim = ty->ndim, .offset = vp->offset};
    for (int d = 0; d < ty->ndim; d++)
        r.shape[d] = vp->shape[d];
    return r;
}

static gt_status lower_node(const gt_graph *g, const gt_plan *p, gt_node_id n,
                            const gt_sym_binding *binding, gt_instr *ins, gt_error *err)
{
    const gt_node *nd = &g->nodes[n];
    memset(ins, 0, sizeof *ins);
    ins->op = nd->op;
    ins->node = n;
    ins->n_in = nd->n_in;
    ins->n_out = nd->n_out;
    ins->ni = nd->attrs.ni;
    ins->nf = nd->attrs.nf;
    ins->ne = nd->attrs.ne;
    memcpy(ins->i, nd->attrs.i, sizeof ins->i);
    memcpy(ins->f, nd->attrs.f, sizeof ins->f);
    for (int j = 0; j < nd->attrs.ne; j++)
        if (gt_sym_eval(g->sym, nd->attrs.e[j], binding, &ins->e[j], err) != GT_OK)
            return gt_error_wrap(err, "lowering node %%%d (%s), attribute e[%d]", n,
                                 gt_op_get(nd->op)->name, j);
    for (int j = 0; j < nd->n_in; j++)
        ins->in[j] = buffer_ref(p, nd->in[j]);
    for (int j = 0; j < nd->n_out; j++)
        ins->out[j] = buffer_ref(p, nd->out[j]);
    ins->slot = -1;
    return GT_OK;
}

gt_status gt_program_build_opts(const gt_graph *g, const gt_sym_binding *binding,
                                const gt_plan_options *opts, gt_program **out, gt_error *err)
{
    *out = NULL;
    gt_node_id *order = NULL;
    int32_t n_order = 0;
    GT_TRY(gt_schedule_build(g, &order, &n_order, err));
    gt_plan *plan = NULL;
    gt_status st = gt_plan_memory(g, binding, order, n_order, opts, &plan, err);
    free(order);
    if (st != GT_OK) return st;

    gt_program *p = gt_xcalloc(1, sizeof *p);
    p->g = g;
    p->plan = plan;
    p->instrs = gt_xcalloc((size_t)n_order + 1, sizeof *p->instrs);
    int32_t *slot_of = gt_xmalloc(((size_t)g->n_nodes + 1) * sizeof *slot_of);
    for (int32_t k = 0; k < n_order && st == GT_OK; k++) {
        gt_node_id n = plan->order[k];
        const gt_node *nd = &g->nodes[n];
        slot_of[n] = -1;
        if ((nd->op == GT_OP_RESHAPE || nd->op == GT_OP_SLICE) &&
            plan->values[nd->out[0]].shared == 1)
            continue; /* a view: no instruction */
        gt_instr *ins = &p->instrs[p->n_instrs];
        st = lower_node(g, plan, n, binding, ins, err);
        if (st != GT_OK) break;
        if (gt_op_is_collective_start(nd->op)) {
            ins->slot = slot_of[n] = p->n_slots++;
        } else if (nd->op == GT_OP_WAIT) {
            /* the shape rule guarantees input 0 is a start's output; the schedule is
             * topological, so the start is lowered already */
            gt_node_id start = g->values[nd->in[0]].producer;
            GT_CHECK(start >= 0 && slot_of[start] >= 0);
            ins->slot = slot_of[start];
        }
        p->n_instrs++;
    }
    free(slot_of);
    p->slots = gt_xcalloc((size_t)p->n_slots + 1, sizeof *p->slots);
    /* Every start needs its wait: without one nothing would read the start's buffer, so the plan
     * would hand it to the next node while the collective still writes it. */
    uint8_t *waited = gt_xcalloc((size_t)p->n_slots + 1, 1);
    for (int32_t k = 0; k < p->n_instrs; k++)
        if (p->instrs[k].op == GT_OP_WAIT) waited[p->instrs[k].slot] = 1;
    for (int32_t k = 0; k < p->n_instrs && st == GT_OK; k++) {
        const gt_instr *ins = &p->instrs[k];
        if (ins->slot >= 0 && ins->op != GT_OP_WAIT && !waited[ins->slot])
            st = gt_error_set(err, GT_ERR_INVALID,
                              "program: node %%%d (%s at '%s') starts a collective that no wait "
                              "completes",
                              ins->node, gt_op_get(ins->op)->name,
                              gt_graph_str(g, g->nodes[ins->node].fqn));
    }
    free(waited);
    /* gradient accumulation: which instructions a run of the micro-batch part runs */
    uint8_t *part = gt_xcalloc((size_t)g->n_nodes + 1, 1);
    gt_graph_micro_part(g, part);
    p->micro = gt_xcalloc((size_t)p->n_instrs + 1, 1);
    for (int32_t k = 0; k < p->n_instrs; k++)
        p->micro[k] = part[p->instrs[k].node];
    free(part);
    p->n_inputs = g->n_inputs;
    p->inputs = gt_xcalloc((size_t)g->n_inputs + 1, sizeof *p->inputs);
    for (int32_t k = 0; k < g->n_inputs; k++)
        p->inputs[k] = buffer_ref(plan, g->inputs[k].value);
    p->n_outputs = g->n_outputs;
    p->outputs = gt_xcalloc((size_t)g->n_outputs + 1, sizeof *p->outputs);
    for (int32_t k = 0; k < g->n_outputs; k++)
        p->outputs[k] = buffer_ref(plan, g->outputs[k].value);

    for (int a = 0; a < GT_ARENA_COUNT && st == GT_OK && !(opts && opts->no_host_arenas); a++) {
        size_t bytes = plan->arena_bytes[a]; /* a multiple of GT_PLAN_ALIGN */
        if (!bytes) continue;
        p->arena[a] = aligned_alloc(GT_PLAN_ALIGN, bytes);
        if (!p->arena[a])
            st =
                gt_error_set(err, GT_ERR_NOMEM, "program: cannot allocate the %s arena (%zu bytes)",
                             a == GT_ARENA_PERSISTENT ? "persistent" : "step", bytes);
        else
            p->allocated_bytes[a] = bytes;
    }
    if (st != GT_OK) {
        gt_program_free(p);
        return st;
    }
    *out = p;
    return GT_OK;
}

gt_status gt_program_build(const gt_graph *g, const gt_sym_binding *binding, gt_program **out,
                           gt_error *err)
{
    return gt_program_build_opts(g, binding, NULL, out, err);
}

void gt_program_free(gt_program *p)
{
    if (!p) return;
    for (int a = 0; a < GT_ARENA_COUNT; a++)
        free(p->arena[a]);
    gt_plan_free(p->plan);
    free(p->slots);
    free(p->instrs);
    free(p->micro);
    free(p->inputs);
    free(p->outputs);
    free(p);
}

size_t gt_program_planned_bytes(const gt_program *p, gt_arena_kind a)
{
    return (unsigned)a < GT_ARENA_COUNT ? p->plan->arena_bytes[a] : 0;
}

size_t gt_program_allocated_bytes(const gt_program *p, gt_arena_kind a)
{
    return (unsigned)a < GT_ARENA_COUNT ? p->allocated_bytes[a] : 0;
}

/* ---------------------------------------------------------------- collectives */

gt_status gt_program_set_comms(gt_program *p, gt_comm *const comms[GT_MESH_MAX_DIMS], gt_error *err)
{
    const gt_graph *g = p->g;
    gt_comm *want[GT_MESH_MAX_DIMS] = {NULL};
    if (comms)
        for (int k = 0; k < GT_MESH_MAX_DIMS; k++)
            want[k] = comms[k];
    for (int k = 0; k < GT_MESH_MAX_DIMS; k++) {
        char dim[96];
        gt_runtime_mesh_dim_label(g, k, dim, sizeof dim);
        gt_comm *c = want[k];
        if (g->mesh.ndim > 0 && k >= g->mesh.ndim) {
            if (c)
                return gt_error_set(err, GT_ERR_INVALID,
                                    "program: communicator given for mesh dim %d, but the "
                                    "graph's mesh has %d dims",
                                    k, g->mesh.ndim);
            continue;
        }
        if (g->mesh.ndim > 0 && comms) {
            int size = g->mesh.size[k];
            if (!c && size != 1)
                return gt_error_set(err, GT_ERR_INVALID,
                                    "program: %s has %d ranks and needs a communicator (NULL is "
                                    "allowed for a dim of size 1 only)",
                                    dim, size);
            if (c && gt_comm_size(c) != size)
                return gt_error_set(err, GT_ERR_INVALID,
                                    "program: the communicator '%s' for %s has %d ranks, the "
                                    "mesh dim has %d",
                                    c->name, dim, gt_comm_size(c), size);
        }
        /* the collectives themselves: their group size is the one that must match */
        for (int32_t j = 0; j < p->n_instrs && comms; j++) {
            const gt_instr *ins = &p->instrs[j];
            if (!gt_op_is_collective_start(ins->op) || ins->i[0] != k || ins->i[1] == 1) continue;
            if (!c)
                return gt_error_set(err, GT_ERR_INVALID,
                                    "program: node %%%d %s runs over %s with group_size %lld "
                                    "and needs a communicator for it",
                                    ins->node, gt_op_get(ins->op)->name, dim, (long long)ins->i[1]);
            if (gt_comm_size(c) != ins->i[1])
                return gt_error_set(err, GT_ERR_INVALID,
                                    "program: node %%%d %s runs over %s with group_size %lld, "
                                    "but the communicator '%s' for it has %d ranks",
                                    ins->node, gt_op_get(ins->op)->name, dim, (long long)ins->i[1],
                                    c->name, gt_comm_size(c));
        }
    }
    for (int k = 0; k < GT_MESH_MAX_DIMS; k++)
        p->comms[k] = want[k];
    return GT_OK;
}

size_t gt_runtime_ref_bytes(const gt_buffer_ref *r)
{
    return (size_t)gt_shape_numel(r->ndim, r->shape) * gt_dtype_size(r->dtype);
}

bool gt_runtime_ref_matches(const gt_buffer_ref *r, const gt_tensor *t, bool numel_only)
{
    if (t->dtype != r->dtype) return false;
    if (numel_only) return gt_tensor_numel(t) == gt_shape_numel(r->ndim, r->shape);
    if (t->ndim != r->ndim) return false;
    for (int d = 0; d < r->ndim; d++)
        if (t->shape[d] != r->shape[d]) return false;
    return true;
}

gt_status gt_runtime_ref_type_error(const char *what, int32_t k, const char *name,
                                    const gt_buffer_ref *r, const gt_tensor *t, gt_error *err)
{
    gt_tensor want;
    char w[160], got[160];
    gt_tensor_wrap(&want, r->dtype, r->ndim, r->shape, NULL);
    gt_tensor_format_type(&want, w, sizeof w);
    gt_tensor_format_type(t, got, sizeof got);
    return gt_error_set(err, GT_ERR_INVALID, "%s %d (%s): expected %s, got %s", what, k, name, w,
                        got);
}

/* The schedule-check group of a collective over mesh dim `dim`: the dim's name, hashed. */
static uint64_t group_of(const gt_graph *g, int64_t dim)
{
    if (g->mesh.ndim > 0 && dim >= 0 && dim < g->mesh.ndim)
        return gt_hash_str(gt_graph_str(g, g->mesh.name[dim]));
    char name[32];
    snprintf(name, sizeof name, "mesh_dim%lld", (long long)dim);
    return gt_hash_str(name);
}

/* Where a collective's buffers lie: the arenas' sizes and its input's and output's arena and
 * offset, hashed (never 0). */
static uint64_t place_of(const gt_program *p, const gt_instr *ins)
{
    uint64_t words[GT_ARENA_COUNT + 4];
    for (int a = 0; a < GT_ARENA_COUNT; a++)
        words[a] = (uint64_t)p->plan->arena_bytes[a];
    words[GT_ARENA_COUNT] = ins->in[0].arena;
    words[GT_ARENA_COUNT + 1] = (uint64_t)ins->in[0].offset;
    words[GT_ARENA_COUNT + 2] = ins->out[0].arena;
    words[GT_ARENA_COUNT + 3] = (uint64_t)ins->out[0].offset;
    uint64_t h = gt_hash64(words, sizeof words, 0x706c616365ull); /* "place" */
    return h ? h : 1;
}

int32_t gt_program_collectives(const gt_program *p, bool with_place, gt_comm_sched_entry *out,
                               int32_t max)
{
    int32_t count = 0;
    for (int32_t j = 0; j < p->n_instrs; j++) {
        const gt_instr *ins = &p->instrs[j];
        if (!gt_op_is_collective_start(ins->op)) continue;
        if (out && count < max)
            out[count] = (gt_comm_sched_entry){
                .kind = gt_runtime_coll_kind(ins->op),
                .group = group_of(p->g, ins->i[0]),
                .bytes = gt_runtime_ref_bytes(ins->n_in ? &ins->in[0] : &ins->out[0]),
                .place = with_place ? place_of(p, ins) : 0};
        count++;
    }
    return count;
}

gt_status gt_graph_collectives(const gt_graph *g, const gt_sym_binding *binding,
                               gt_comm_sched_entry *out, int32_t max, int32_t *count, gt_error *err)
{
    *count = 0;
    for (int32_t i = 0; i < g->n_nodes; i++) {
        const gt_node *n = &g->nodes[i];
        if (!gt_op_is_collective_start(n->op)) continue;
        if (out && *count < max) {
            int64_t shape[GT_MAX_DIMS];
            gt_value_id v = n->n_in ? n->in[0] : n->out[0]; /* a recv_start reads nothing */
            GT_TRY(gt_graph_eval_shape(g, v, binding, shape, err));
            const gt_type *t = gt_value_type(g, v);
            out[*count] = (gt_comm_sched_entry){.kind = gt_runtime_coll_kind(n->op),
                                                .group = group_of(g, n->attrs.i[0]),
                                                .bytes = (uint64_t)gt_shape_numel(t->ndim, shape) *
                                                         gt_dtype_size(t->dtype)};
        }
        (*count)++;
    }
    return GT_OK;
}

int32_t gt_runtime_comm_timings(const gt_program *p, gt_comm_timing *out, int32_t max,
                                gt_runtime_slot_times times, void *user)
{
    int32_t n = 0;
    for (int32_t k = 0; k < p->n_instrs; k++) {
        const gt_instr *ins = &p->instrs[k];
        if (!gt_op_is_collective_start(ins->op)) continue;
        if (n < max && out) {
            gt_comm_timing *t = &out[n];
            memset(t, 0, sizeof *t);
            t->kind = gt_runtime_coll_kind(ins->op);
            t->mesh_dim = (int32_t)ins->i[0];
            t->bytes = gt_runtime_ref_bytes(ins->n_in ? &ins->in[0] : &ins->out[0]);
            t->start_instr = k;
            t->wait_instr = -1;
            for (int32_t j = k + 1; j < p->n_instrs && t->wait_instr < 0; j++)
                if (p->instrs[j].slot == ins->slot && p->instrs[j].op == GT_OP_WAIT)
                    t->wait_instr = j;
            times(user, ins->slot, &t->total_s, &t->exposed_s);
        }
        n++;
    }
    return n;
}

gt_status gt_program_drop_collective(gt_program *p, int32_t index, gt_error *err)
{
    int32_t count = 0, slot = -1;
    for (int32_t j = 0; j < p->n_instrs && slot < 0; j++)
        if (gt_op_is_collective_start(p->instrs[j].op) && count++ == index)
            slot = p->instrs[j].slot;
    if (index < 0 || slot < 0)
        return gt_error_set(err, GT_ERR_INVALID,
                            "program: cannot drop collective #%d: the program has %d", index,
                            gt_program_collectives(p, false, NULL, 0));
    int32_t w = 0;
    for (int32_t j = 0; j < p->n_instrs; j++)
        if (p->instrs[j].slot != slot) p->instrs[w++] = p->instrs[j];
    p->n_instrs = w;
    return GT_OK;
}
