/* pp_exec.c — one training step run as a pipeline schedule runs it, in one process, on the CPU
 * kernels (gt_pp_eager_step, gt_pipeline.h).
 *
 * Every rank's action list is followed the way the simulator follows it (pp_simulate.c): a rank
 * runs its actions in order and stops at a receive whose send has not run yet, and the ranks take
 * turns until all are done. An action runs its node set of the step graph for its micro-batch: F
 * the stage's forward nodes, I its input-gradient nodes, W its weight-gradient nodes, B both I and
 * W (gt_pp_split). Every micro-batch has its own value store; sends and receives move nothing,
 * because all stages share the process, but they gate the order as they would between ranks.
 *
 * Gradient accumulation is the step graph's own: the graph is built for n_micro micro-batches
 * (gt_optim_append_grad_accum), so each micro-batch's W adds its gradient to the running sum that
 * the previous micro-batch's W left, in micro-batch order, whatever order the schedule runs the
 * micro-batches' other actions in. A W that comes before the previous micro-batch's W of its
 * stage is an error naming it. The optimizer and the nodes every rank runs (the gradient norm) run
 * once, after the last action, on the last micro-batch's values. Micro-batches before the last run
 * only the nodes of the graph's micro-batch part (gt_graph_micro_part), as the trainer's
 * accumulation runs them. The result is therefore bitwise that of gt_eager_run_part over the
 * micro-batches in order (tests/numerics/test_pp_exec.c). The other values a micro-batch hands the
 * next (gt_pp_split.h): the micro-batch clock runs on every rank for every micro-batch before the
 * schedule (run_clock), its buffers carried along; a buffer the optimizer updates once a step
 * (DeepSeek-V3's expert biases) is read by every micro-batch as the step began
 * (gt_pp_update_of_input names no update for it; tests/numerics/test_pp_moe_exec.c).
 *
 * With a communicator (gt_pp_eager_step_rank) the process is one pipeline rank: it runs only its
 * own actions; a send posts the crossing values of its stage and micro-batch to the peer rank
 * without blocking, a receive waits for them (gt_comm_send_start / gt_comm_recv, tag = crossing
 * x micro-batches + micro-batch); the optimizer runs for its own stages, and before each node that
 * every rank runs, the stage values it reads are broadcast from their stage's rank
 * (tests/distributed/test_pp_mpi.c).
 *
 * An SPMD step graph (gt_pp_eager_step_spmd: parallelize's, for the mesh inside a pipeline rank)
 * also holds collectives: a start runs its collective to completion on the mesh dim's
 * communicator, its wait copies the result, as the eager executor runs them. Every rank of a mesh
 * follows the same action list, so their collectives come in the same order.
 *
 * Two things keep the step small without changing its bits: a node whose inputs are the same in
 * every micro-batch (an FSDP gather of a parameter) runs once a step and serves the others
 * (find_invariant), and each value is freed after its last read on the rank (plan_frees), so the
 * activations held follow the schedule's micro-batches in flight. Those values live in one arena
 * a step, at offsets the dry run plans (place_value, pp_arena.c).
 *
 * With programs (gt_pp_step_programs, pp_program.c) a stage part that has one runs its invariant
 * nodes node by node (once a step, then reused), then its program on the micro-batch's values;
 * the program's outputs become values the runner holds and frees as above. */
#include <stdlib.h>
#include <string.h>

#include "graphtrain/gt_backend.h"
#include "graphtrain/gt_comm.h"
#include "graphtrain/gt_pipeline.h"
#include "pp_internal.h"
#include "runtime_internal.h"

typedef struct {
    const gt_graph *g;
    const gt_sym_binding *binding;
    const gt_pp_split *split;
    const gt_pp_schedule *sched;
    int32_t n_micro;
    gt_tensor **vals;  /* [n_micro][n_values] */
    uint8_t **defined; /* [n_micro][n_values]: 1 borrowed, 2 owned */
    uint8_t *micro_part;
    int32_t *update_of_input; /* [n_inputs]: the BUFFER_UPDATE value feeding it back, or -1 */
    uint8_t *step_input;      /* [n_values]: a graph input whose bytes hold for the step (no running
                               * sum): a part's program need not take them in again (run_program) */
    gt_comm *comm;     /* one rank of a multi-process pipeline (its pipeline rank is comm->rank), or
                        * NULL: every rank in this process */
    uint8_t *gathered; /* [n_values]: broadcast to the pipeline ranks already (global inputs) */
    gt_comm *const *dim_comms; /* an SPMD step graph's communicators per mesh dim, or NULL */
    uint8_t *invariant;        /* [n_nodes]: its outputs are the same in every micro-batch */
    gt_node_id *same_as;       /* [n_nodes]: the first node computing the same (invariant) */
    int32_t *done_mb; /* [n_nodes]: for a node e = same_as[e], the micro-batch in which holder[e]
                       * computed its outputs, or -1 */
    gt_node_id *holder;
    gt_pp_step_stats *stats;
    int32_t me;     /* the pipeline rank this process runs, or -1: every rank (no communicator) */
    bool dry;       /* sizes only: no kernel, no transfer, values without data (gt_pp_step_plan) */
    int32_t **refs; /* [n_micro][n_values]: reads of the value still to come on this rank */
    uint8_t *pin;   /* [n_values]: 1 kept until the step ends, 2 kept in the last micro-batch */
    int64_t held, peak; /* bytes of values this runner owns now, and at most */
    int64_t total;      /* bytes it allocated over the step (what it held when nothing was freed) */
    const gt_pp_programs *progs; /* the parts that run as programs (pp_program.c), or NULL */
    /* the arena (see "placing values" below) */
    int32_t **slot_of; /* [n_micro][n_values]: the slot of an owned value */
    gt_pp_slot *slots; /* [n_slots]: a dry run records them, a run places by them */
    int32_t n_slots, cap_slots;
    int64_t clock;          /* events so far: allocations and frees */
    const int64_t *offsets; /* a run's: [n_planned] offsets in arena */
    int32_t n_planned;
    uint8_t *arena;
} pp_run;

/* ---------------------------------------------------------------- freeing values after use
 *
 * A micro-batch's values live from the node that computes them to their last read on this rank,
 * so the activations held follow the micro-batches in flight, as the schedule's simulator counts
 * them. Kept until the step ends: the values other nodes borrow (an invariant node's outputs),
 * those a send posts (their buffers are read until gt_comm_send_wait_all), the losses, and in the
 * last micro-batch the outputs (the optimizer's reads count like the others'). A running
 * gradient sum is released by the next micro-batch's W of its stage, which reads it. A value
 * freed too early is undefined again, so a read after it is the runner's error, not garbage. */

static void add_reads(pp_run *r, int32_t m, int32_t st, gt_pp_part p)
{
    const gt_graph *g = r->g;
    bool last = m == r->n_micro - 1;
    for (gt_node_id n = 0; n < g->n_nodes; n++) {
        if (r->split->stage[n] != st || r->split->part[n] != p) continue;
        if (!last && !r->micro_part[n]) continue;
        for (int j = 0; j < g->nodes[n].n_in; j++)
            r->refs[m][g->nodes[n].in[j]]++;
    }
}

static void plan_frees(pp_run *r, const gt_pp_schedule *s)
{
    const gt_graph *g = r->g;
    for (int32_t rk = 0; rk < s->n_ranks; rk++) {
        if (r->me >= 0 && rk != r->me) continue;
        for (int32_t i = 0; i < s->n_actions[rk]; i++) {
            gt_pp_action a = s->actions[rk][i];
            if (a.kind == GT_PP_F) add_reads(r, a.mb, a.stage, GT_PP_PART_F);
            if (a.kind == GT_PP_I || a.kind == GT_PP_B) add_reads(r, a.mb, a.stage, GT_PP_PART_I);
            if (a.kind == GT_PP_W || a.kind == GT_PP_B) add_reads(r, a.mb, a.stage, GT_PP_PART_W);
        }
    }
    for (int32_t k = 0; k < r->split->n_cross; k++)
        r->pin[r->split->cross[k].value] = 1;
    for (gt_node_id n = 0; n < g->n_nodes; n++) {
        const gt_node *nd = &g->nodes[n];
        gt_pp_part p = r->split->part[n];
        for (int j = 0; r->invariant[n] && j < nd->n_out; j++)
            r->pin[nd->out[j]] = 1;
        /* the optimizer and the global nodes: once, on the last micro-batch's values */
        bool once =
            p == GT_PP_PART_GLOBAL ||
            (p == GT_PP_PART_OPT && (r->me < 0 || s->stage_rank[r->split->stage[n]] == r->me));
        for (int j = 0; once && j < nd->n_in; j++)
            r->refs[r->n_micro - 1][nd->in[j]]++;
    }
    for (int32_t k = 0; k < g->n_outputs; k++) {
        gt_value_id v = g->outputs[k].value;
        if (g->outputs[k].kind == GT_OUT_LOSS)
            r->pin[v] = 1;
        else if (!r->pin[v])
            r->pin[v] = 2;
    }
    for (int32_t k = 0; k < g->n_inputs; k++)
        if (r->update_of_input[k] >= 0) r->pin[r->update_of_input[k]] = 1;
}

/* ---------------------------------------------------------------- placing values
 *
 * Every value the runner owns (what a node, a program or a receive computes, a broadcast's copy)
 * lives in one arena a step, at an offset planned before the step: the dry run on sizes alone
 * (gt_pp_step_plan) makes the same allocations and frees in the same order, and records each
 * value's bytes and the span of events it lives over (a slot); gt_pp_arena_place packs the slots
 * and the run takes its k-th allocation at slot k's offset. Only the addresses change, so the
 * bits do not. The losses and outputs the step hands out are copies the caller owns; a
 * program's inner values stay in its own arenas. */

/* A value micro-batch m owns from now: in a dry run its dtype and shape alone (a slot recorded),
 * in a run at its slot's offset; the bytes held now, at most, and over the step. */
static gt_status place_value(pp_run *r, int32_t m, gt_value_id v, gt_dtype dt, int ndim,
                             const int64_t *shape, gt_error *err)
{
    gt_tensor *t = &r->vals[m][v];
    gt_tensor_wrap(t, dt, ndim, shape, NULL);
    int64_t b = (int64_t)gt_tensor_nbytes(t);
    int32_t k = r->n_slots++;
    if (r->dry) {
        if (k == r->cap_slots) {
            r->cap_slots = r->cap_slots ? 2 * r->cap_slots : 256;
            r->slots = gt_xrealloc(r->slots, (size_t)r->cap_slots * sizeof *r->slots);
        }
        r->slots[k] = (gt_pp_slot){b, r->clock, INT64_MAX};
    } else if (k >= r->n_planned || r->slots[k].size != b) {
        return gt_error_set(err, GT_ERR_INTERNAL,
                            "pipeline step: %%%d of micro-batch %d (%lld B) is allocation %d, "
                            "which the step's plan does not have",
                            v, m, (long long)b, k);
    } else {
        t->data = r->arena + r->offsets[k];
    }
    r->slot_of[m][v] = k;
    r->clock++;
    r->defined[m][v] = 2;
    r->held += b;
    r->total += b;
    if (r->held > r->peak) r->peak = r->held;
    return GT_OK;
}

static void drop(pp_run *r, int32_t m, gt_value_id v)
{
    if (r->defined[m][v] != 2) return; /* borrowed */
    if (r->dry) r->slots[r->slot_of[m][v]].last = r->clock;
    r->clock++;
    r->held -= (int64_t)gt_tensor_nbytes(&r->vals[m][v]);
    gt_tensor_free(&r->vals[m][v]);
    r->defined[m][v] = 0;
}

/* After node n of micro-batch m ran (or took an earlier result): its inputs read once less, and
 * those and its outputs freed when nothing on this rank reads them any more. */
static void release_after(pp_run *r, int32_t m, gt_node_id n)
{
    const gt_node *nd = &r->g->nodes[n];
    bool last = m == r->n_micro - 1;
    for (int j = 0; j < nd->n_in; j++) {
        gt_value_id v = nd->in[j];
        if (r->refs[m][v] > 0) r->refs[m][v]--;
        bool kept = r->pin[v] == 1 || (r->pin[v] == 2 && last);
        if (r->refs[m][v] == 0 && !kept) drop(r, m, v);
    }
    for (int j = 0; j < nd->n_out; j++) {
        gt_value_id v = nd->out[j];
        bool kept = r->pin[v] == 1 || (r->pin[v] == 2 && last);
        if (r->refs[m][v] == 0 && !kept) drop(r, m, v);
    }
}

/* Which nodes compute the same values in every micro-batch, and which compute what an earlier
 * one does: the parameters and the model's buffers that no update feeds back are the same for
 * every micro-batch of a step, and so is every node of a stage reading only them (an FSDP gather
 * of a parameter, the cast before it, its wait). Running such a node once a step and handing its
 * outputs to the other micro-batches gives the same bits (the same kernel on the same inputs) and
 * issues each gather once per step, as torchtitan's reshard_after_forward=False does for
 * pipelines; a node with the op, attributes and inputs of an earlier invariant one (a gather
 * repeated for the backward) takes that one's outputs as well. Every rank of a mesh sees the same
 * graph and actions, so all of them skip the same collectives. */
static void find_invariant(pp_run *r)
{
    gt_pp_find_invariant(r->g, r->split, r->update_of_input, r->invariant, r->same_as);
    for (gt_node_id n = 0; n < r->g->n_nodes; n++) {
        r->holder[n] = n;
        r->done_mb[n] = -1;
    }
}

/* An invariant node already run this step (for another micro-batch, or as the node it repeats):
 * its outputs for micro-batch m, borrowed. */
static bool reuse(pp_run *r, int32_t m, gt_node_id n)
{
    if (!r->invariant[n]) return false;
    gt_node_id e = r->same_as[n], h = r->holder[e];
    int32_t m0 = r->done_mb[e];
    if (m0 < 0) return false;
    const gt_node *nd = &r->g->nodes[n], *hn = &r->g->nodes[h];
    for (int j = 0; j < nd->n_out; j++)
        if (!r->defined[m0][hn->out[j]]) return false;
    for (int j = 0; j < nd->n_out; j++) {
        r->vals[m][nd->out[j]] = r->vals[m0][hn->out[j]];
        r->vals[m][nd->out[j]].owns_data = false;
        r->defined[m][nd->out[j]] = 1;
    }
    if (r->stats && gt_op_is_collective_start(nd->op)) r->stats->collectives_reused++;
    return true;
}

static gt_status run_node(pp_run *r, int32_t m, gt_node_id n, gt_error *err)
{
    const gt_graph *g = r->g;
    const gt_node *nd = &g->nodes[n];
    bool collective = gt_op_is_collective_start(nd->op) || nd->op == GT_OP_WAIT;
    if (reuse(r, m, n)) return GT_OK;
    if (r->invariant[n]) { /* the first of its kind this step: the others take its outputs */
        r->done_mb[r->same_as[n]] = m;
        r->holder[r->same_as[n]] = n;
    }
    if (r->stats && gt_op_is_collective_start(nd->op)) {
        r->stats->collectives++;
        r->stats->gathers += gt_runtime_coll_kind(nd->op) == GT_COLL_ALL_GATHER;
    }
    if (collective && r->me < 0 && !r->dim_comms && !r->dry)
        return gt_error_set(err, GT_ERR_UNSUPPORTED,
                            "pipeline step: node %d (%s) is a collective; the in-process pipeline "
                            "runs one-rank step graphs",
                            n, gt_op_get(nd->op)->name);
    gt_kernel_call call = {
        .op = nd->op,
        .i = nd->attrs.i,
        .f = nd->attrs.f,
        .ni = nd->attrs.ni,
        .nf = nd->attrs.nf,
        .ne = nd->attrs.ne,
        .n_in = nd->n_in,
        .n_out = nd->n_out,
    };
    int64_t e[GT_MAX_EATTR];
    for (int j = 0; j < nd->attrs.ne; j++)
        GT_TRY(gt_sym_eval(g->sym, nd->attrs.e[j], r->binding, &e[j], err));
    call.e = e;
    for (int j = 0; j < nd->n_in; j++) {
        gt_value_id v = nd->in[j];
        if (!r->defined[m][v])
            return gt_error_set(err, GT_ERR_INVALID,
                                "pipeline step: node %d (%s, stage %d) of micro-batch %d reads "
                                "%%%d before it is computed",
                                n, gt_op_get(nd->op)->name, r->split->stage[n], m, v);
        call.in[j] = &r->vals[m][v];
    }
    for (int j = 0; j < nd->n_out; j++) {
        gt_value_id v = nd->out[j];
        const gt_type *ty = gt_value_type(g, v);
        int64_t shape[GT_MAX_DIMS];
        GT_TRY(gt_graph_eval_shape(g, v, r->binding, shape, err));
        GT_TRY(place_value(r, m, v, ty->dtype, ty->ndim, shape, err));
        call.out[j] = &r->vals[m][v];
    }
    if (r->dry) return GT_OK;
    if (nd->op == GT_OP_WAIT) { /* the start ran to completion: its result, copied */
        size_t nbytes = gt_tensor_nbytes(call.in[0]);
        if (nbytes != gt_tensor_nbytes(call.out[0]))
            return gt_error_set(err, GT_ERR_INTERNAL,
                                "pipeline step: wait node %d: %zu bytes in, %zu out", n, nbytes,
                                gt_tensor_nbytes(call.out[0]));
        if (nbytes) memcpy(call.out[0]->data, call.in[0]->data, nbytes);
        return GT_OK;
    }
    if (collective) { /* blocking, on the mesh dim's communicator (a group of 1 copies) */
        gt_comm *c;
        GT_TRY(gt_runtime_comm_for(g, nd->attrs.i[0], nd->attrs.i[1], r->dim_comms, &c, err));
        gt_comm_request *req;
        GT_TRY(gt_runtime_start(nd->op, c, nd->attrs.i, call.in[0], call.out[0], &req, err));
        return req ? gt_comm_wait(req, err) : GT_OK;
    }
    return gt_cpu_run_kernel(&call, err);
}

/* Stage st's part p for micro-batch m by its program: the inputs from the micro-batch's values,
 * the outputs into values the runner holds; then each node's reads counted off, as node by node
 * (its intermediate values were never the runner's). */
static gt_status run_program(pp_run *r, int32_t m, const gt_pp_part_program *pp, gt_error *err)
{
    const gt_graph *g = r->g;
    gt_status st = GT_OK;
    /* the inputs into the program's arena; a step input already there from an earlier
     * micro-batch of this step (the same caller bytes: the stage's parameters) stays */
    for (int32_t k = 0; k < pp->n_in && st == GT_OK; k++) {
        gt_value_id v = pp->in[k];
        if (!r->defined[m][v])
            return gt_error_set(err, GT_ERR_INVALID,
                                "pipeline step: a program of stage %d reads %%%d of micro-batch "
                                "%d before it is computed",
                                r->split->stage[pp->nodes[0]], v, m);
        if (r->dry) continue;
        const gt_tensor *in = &r->vals[m][v];
        bool step_input =
            r->step_input[v] && in->data && pp->prog->inputs[k].arena == GT_ARENA_PERSISTENT;
        if (step_input && pp->bound[k] == in->data) continue;
        st = gt_program_set_input(pp->prog, k, in, err);
        pp->bound[k] = st == GT_OK && step_input ? in->data : NULL;
    }
    if (st == GT_OK && !r->dry) st = gt_program_exec(pp->prog, err);
    /* each output copied from the program's arena into its place */
    for (int32_t k = 0; k < pp->n_out && st == GT_OK; k++) {
        gt_value_id v = pp->out[k];
        const gt_type *ty = gt_value_type(g, v);
        int64_t shape[GT_MAX_DIMS];
        st = gt_graph_eval_shape(g, v, r->binding, shape, err);
        if (st == GT_OK) st = place_value(r, m, v, ty->dtype, ty->ndim, shape, err);
        size_t nb = st == GT_OK && !r->dry ? gt_tensor_nbytes(&r->vals[m][v]) : 0;
        gt_tensor view = {0};
        if (nb) st = gt_program_output(pp->prog, k, &view, err);
        if (st == GT_OK && nb && nb != gt_tensor_nbytes(&view))
            st = gt_error_set(err, GT_ERR_INTERNAL,
                              "pipeline step: a program's output %%%d has %zu B, its value %zu", v,
                              gt_tensor_nbytes(&view), nb);
        else if (st == GT_OK && nb)
            memcpy(r->vals[m][v].data, view.data, nb);
    }
    r->total += pp->internal_bytes; /* computed too, in the program's arenas */
    if (r->stats && st == GT_OK) {
        r->stats->collectives += pp->n_coll;
        r->stats->gathers += pp->n_gathers;
    }
    for (int32_t k = 0; k < pp->n_nodes && st == GT_OK; k++)
        release_after(r, m, pp->nodes[k]);
    return st;
}

/* The nodes of stage st in part p for micro-batch m, in graph order (or its program). A
 * micro-batch's W first takes the running sums the previous micro-batch's W left. */
static gt_status run_part(pp_run *r, int32_t m, int32_t st, gt_pp_part p, gt_error *err)
{
    const gt_graph *g = r->g;
    if (p == GT_PP_PART_W && m > 0) {
        for (int32_t k = 0; k < g->n_inputs; k++) {
            gt_value_id u = r->update_of_input[k], v = g->inputs[k].value;
            if (u < 0) continue;
            gt_node_id pn = g->values[u].producer;
            if (pn == GT_NONE || r->split->stage[pn] != st) continue;
            if (!r->defined[m - 1][u])
                return gt_error_set(err, GT_ERR_INVALID,
                                    "pipeline step: %dW%d runs before %dW%d: the gradient sums "
                                    "are added in micro-batch order",
                                    st, m, st, m - 1);
            r->vals[m][v] = r->vals[m - 1][u];
            r->vals[m][v].owns_data = false;
            r->defined[m][v] = 1;
        }
    }
    bool last = m == r->n_micro - 1;
    const gt_pp_part_program *pp = r->progs && p <= GT_PP_PART_W ? &r->progs->part[st][p] : NULL;
    bool compiled = pp && pp->prog;
    /* with a program: its invariant nodes here (once a step, then reused), then the program */
    for (gt_node_id n = 0; n < g->n_nodes; n++) {
        if (r->split->stage[n] != st || r->split->part[n] != p) continue;
        if (!last && !r->micro_part[n]) continue;
        if (compiled && !r->invariant[n]) continue;
        gt_status s = run_node(r, m, n, err);
        if (s != GT_OK) return s;
        release_after(r, m, n);
    }
    if (compiled) GT_TRY(run_program(r, m, pp, err));
    /* the sums micro-batch m - 1 left are read: this W's are the running ones now */
    for (int32_t k = 0; p == GT_PP_PART_W && m > 0 && k < g->n_inputs; k++) {
        gt_value_id u = r->update_of_input[k];
        gt_node_id pn = u < 0 ? GT_NONE : g->values[u].producer;
        if (pn == GT_NONE || r->split->stage[pn] != st) continue;
        r->defined[m][g->inputs[k].value] = 0;
        drop(r, m - 1, u);
    }
    return GT_OK;
}

/* The crossing values a send or receive moves: forward values from stage `from` to `to`, or
 * gradients; each is allocated on the receiving side and moved under tag cross x n_micro + mb. */
static gt_status transfer(pp_run *r, gt_pp_action a, const gt_pp_schedule *s, gt_error *err)
{
    const gt_graph *g = r->g;
    bool send = a.kind == GT_PP_SEND_F || a.kind == GT_PP_SEND_B;
    bool grad = a.kind == GT_PP_SEND_B || a.kind == GT_PP_RECV_B;
    int32_t from = send ? a.stage : grad ? a.stage + 1 : a.stage - 1;
    int32_t to = send ? (grad ? a.stage - 1 : a.stage + 1) : a.stage;
    int peer = s->stage_rank[send ? to : from];
    for (int32_t k = 0; k < r->split->n_cross; k++) {
        const gt_pp_cross *c = &r->split->cross[k];
        if (c->from != from || c->to != to || c->gradient != grad) continue;
        int64_t tag = (int64_t)k * r->n_micro + a.mb;
        gt_value_id v = c->value;
        gt_tensor *t = &r->vals[a.mb][v];
        if (tag >= 32768)
            return gt_error_set(err, GT_ERR_UNSUPPORTED,
                                "pipeline step: %d crossing values x %d micro-batches exceed the "
                                "point-to-point tags",
                                r->split->n_cross, r->n_micro);
        if (send) {
            if (!r->defined[a.mb][v])
                return gt_error_set(err, GT_ERR_INVALID,
                                    "pipeline step: sends %%%d before it is computed", v);
            if (!r->dry) GT_TRY(gt_comm_send_start(r->comm, t, peer, (int)tag, err));
            continue;
        }
        const gt_type *ty = gt_value_type(g, v);
        int64_t shape[GT_MAX_DIMS];
        GT_TRY(gt_graph_eval_shape(g, v, r->binding, shape, err));
        GT_TRY(place_value(r, a.mb, v, ty->dtype, ty->ndim, shape, err));
        if (!r->dry) GT_TRY(gt_comm_recv(r->comm, t, peer, (int)tag, err));
    }
    return GT_OK;
}

static gt_status run_action(pp_run *r, gt_pp_action a, const gt_pp_schedule *s, gt_error *err)
{
    if (r->me >= 0 && a.kind >= GT_PP_SEND_F) return transfer(r, a, s, err);
    switch (a.kind) {
    case GT_PP_F:
        return run_part(r, a.mb, a.stage, GT_PP_PART_F, err);
    case GT_PP_I:
        return run_part(r, a.mb, a.stage, GT_PP_PART_I, err);
    case GT_PP_W:
        return run_part(r, a.mb, a.stage, GT_PP_PART_W, err);
    case GT_PP_B:
        GT_TRY(run_part(r, a.mb, a.stage, GT_PP_PART_I, err));
        return run_part(r, a.mb, a.stage, GT_PP_PART_W, err);
    default:
        return GT_OK; /* one process: the values are already where the receiver reads */
    }
}

/* The micro-batch clock (gt_pp_split.h), on every rank before the schedule: its nodes for each
 * micro-batch in order, the buffers it feeds back carried from one micro-batch to the next, so
 * every stage reads each micro-batch's value where the one-rank accumulation computes it. */
static gt_status run_clock(pp_run *r, gt_error *err)
{
    const gt_graph *g = r->g;
    if (r->split->n_clock == 0) return GT_OK;
    for (int32_t m = 0; m < r->n_micro; m++) {
        for (int32_t k = 0; m > 0 && k < g->n_inputs; k++) {
            gt_value_id u = r->update_of_input[k], v = g->inputs[k].value;
            gt_node_id pn = u < 0 ? GT_NONE : g->values[u].producer;
            if (pn == GT_NONE || r->split->part[pn] != GT_PP_PART_CLOCK) continue;
            r->vals[m][v] = r->vals[m - 1][u];
            r->vals[m][v].owns_data = false;
            r->defined[m][v] = 1;
        }
        for (gt_node_id n = 0; n < g->n_nodes; n++)
            if (r->split->part[n] == GT_PP_PART_CLOCK) GT_TRY(run_node(r, m, n, err));
    }
    return GT_OK;
}

/* One action of the schedule (gt_pp_schedule_each's callback). */
static gt_status run_one(void *user, gt_pp_action a, gt_error *err)
{
    pp_run *r = user;
    return run_action(r, a, r->sched, err);
}

/* dst ready to take a copy of src: its own bytes when it has them in src's dtype and shape (the
 * caller's buffer, or the last step's), else fresh ones. */
static gt_status out_place(gt_tensor *dst, const gt_tensor *src, gt_error *err)
{
    bool fits = dst->data && dst->dtype == src->dtype && dst->ndim == src->ndim;
    for (int d = 0; fits && d < src->ndim; d++)
        fits = dst->shape[d] == src->shape[d];
    if (fits) return GT_OK;
    gt_tensor_free(dst);
    return gt_tensor_alloc(dst, src->dtype, src->ndim, src->shape, err);
}

/* outputs[k] <- a copy of the last micro-batch's value of g->outputs[k]; losses[m] <- micro-batch
 * m's LOSS output. */
static gt_status hand_outputs(pp_run *r, gt_tensor *losses, gt_tensor *outputs, gt_error *err)
{
    const gt_graph *g = r->g;
    for (int32_t m = 0; m < r->n_micro; m++) {
        for (int32_t k = 0; k < g->n_outputs; k++) {
            bool want = m == r->n_micro - 1 || g->outputs[k].kind == GT_OUT_LOSS;
            if (!want) continue;
            gt_value_id v = g->outputs[k].value;
            if (!r->defined[m][v] && r->me >= 0) continue; /* another rank's */
            if (!r->defined[m][v])
                return gt_error_set(err, GT_ERR_INVALID,
                                    "pipeline step: output %d (%s) of micro-batch %d was not "
                                    "computed",
                                    k, gt_graph_str(g, g->outputs[k].fqn), m);
            gt_tensor *dst =
                g->outputs[k].kind == GT_OUT_LOSS && m < r->n_micro - 1 ? &losses[m] : &outputs[k];
            const gt_tensor *src = &r->vals[m][v];
            GT_TRY(out_place(dst, src, err));
            size_t nb = gt_tensor_nbytes(src);
            if (nb) memcpy(dst->data, src->data, nb);
            if (g->outputs[k].kind == GT_OUT_LOSS && m == r->n_micro - 1) {
                GT_TRY(out_place(&losses[m], src, err));
                if (nb) memcpy(losses[m].data, src->data, nb);
            }
        }
    }
    return GT_OK;
}

/* Before global node n on a multi-process pipeline: each stage value it reads comes from the
 * rank of that stage, broadcast over the pipeline ranks (every rank reaches the global nodes in
 * the same graph order, so the broadcasts match). */
static gt_status gather_global_inputs(pp_run *r, const gt_pp_schedule *s, gt_node_id n,
                                      gt_error *err)
{
    const gt_graph *g = r->g;
    int32_t m = r->n_micro - 1;
    for (int i = 0; i < g->nodes[n].n_in; i++) {
        gt_value_id v = g->nodes[n].in[i];
        gt_node_id p = g->values[v].producer;
        if (p == GT_NONE || r->split->stage[p] == GT_PP_STAGE_GLOBAL) continue;
        int root = s->stage_rank[r->split->stage[p]];
        bool mine = root == r->me;
        if (r->gathered[v]) continue; /* for an earlier global node */
        r->gathered[v] = 1;
        if (!mine) {
            const gt_type *ty = gt_value_type(g, v);
            int64_t shape[GT_MAX_DIMS];
            GT_TRY(gt_graph_eval_shape(g, v, r->binding, shape, err));
            GT_TRY(place_value(r, m, v, ty->dtype, ty->ndim, shape, err));
        }
        if (!r->dry) GT_TRY(gt_comm_broadcast(r->comm, &r->vals[m][v], root, err));
    }
    return GT_OK;
}

gt_status gt_pp_eager_step(const gt_graph *g, const gt_sym_binding *binding,
                           const gt_pp_split *split, const gt_pp_schedule *s,
                           const gt_tensor *const *inputs, gt_tensor *losses, gt_tensor *outputs,
                           gt_error *err)
{
    return gt_pp_eager_step_rank(g, binding, split, s, NULL, inputs, losses, outputs, err);
}

gt_status gt_pp_eager_step_rank(const gt_graph *g, const gt_sym_binding *binding,
                                const gt_pp_split *split, const gt_pp_schedule *s, gt_comm *comm,
                                const gt_tensor *const *inputs, gt_tensor *losses,
                                gt_tensor *outputs, gt_error *err)
{
    return gt_pp_eager_step_spmd(g, binding, split, s, comm, NULL, inputs, losses, outputs, NULL,
                                 err);
}

/* A step's arena: the slots a dry run recorded, their offsets, its bytes, and a run's memory. */
typedef struct {
    gt_pp_slot *slots;
    int64_t *offsets;
    int32_t n;
    int64_t bytes;
    uint8_t *memory;
} arena_plan;

/* The step of gt_pp_eager_step_spmd as pipeline rank `me` (-1: all of them, in this process);
 * dry (gt_pp_step_plan): the same control flow on sizes alone, inputs, losses and outputs NULL,
 * its slots and their offsets into *ap when given; a run places its values by *ap. */
static gt_status run_step(const gt_graph *g, const gt_sym_binding *binding,
                          const gt_pp_split *split, const gt_pp_schedule *s, gt_comm *comm,
                          int32_t me, bool dry, gt_comm *const *dim_comms,
                          const gt_pp_programs *progs, const gt_tensor *const *inputs,
                          gt_tensor *losses, gt_tensor *outputs, gt_pp_step_stats *stats,
                          arena_plan *ap, gt_error *err)
{
    if (progs && progs->n_stages != split->n_stages)
        return gt_error_set(err, GT_ERR_INVALID,
                            "pipeline step: programs of %d stages for a split of %d",
                            progs->n_stages, split->n_stages);
    if (comm && comm->size != s->n_ranks)
        return gt_error_set(err, GT_ERR_INVALID,
                            "pipeline step: the communicator '%s' has %d ranks, the schedule %d",
                            comm->name, comm->size, s->n_ranks);
    if (split->n_nodes != g->n_nodes || split->n_stages != s->n_stages)
        return gt_error_set(err, GT_ERR_INVALID,
                            "pipeline step: the split (%d nodes, %d stages) is not of this graph "
                            "and schedule (%d nodes, %d stages)",
                            split->n_nodes, split->n_stages, g->n_nodes, s->n_stages);
    int32_t M = s->n_micro, nv = g->n_values;
    pp_run r = {.g = g,
                .binding = binding,
                .split = split,
                .sched = s,
                .n_micro = M,
                .comm = comm,
                .dim_comms = dim_comms,
                .stats = stats,
                .me = me,
                .dry = dry,
                .progs = progs};
    if (stats) memset(stats, 0, sizeof *stats);
    if (!dry) {
        r.slots = ap->slots;
        r.offsets = ap->offsets;
        r.n_planned = ap->n;
        r.arena = ap->memory;
    }
    r.slot_of = gt_xcalloc((size_t)M, sizeof *r.slot_of);
    for (int32_t m = 0; m < M; m++)
        r.slot_of[m] = gt_xcalloc((size_t)nv + 1, sizeof **r.slot_of);
    r.gathered = gt_xcalloc((size_t)nv + 1, 1);
    r.vals = gt_xcalloc((size_t)M, sizeof *r.vals);
    r.defined = gt_xcalloc((size_t)M, sizeof *r.defined);
    r.micro_part = gt_xcalloc((size_t)g->n_nodes + 1, 1);
    gt_graph_micro_part(g, r.micro_part);
    r.update_of_input = gt_pp_update_of_input(g, split);
    r.step_input = gt_xcalloc((size_t)nv + 1, 1);
    for (int32_t k = 0; k < g->n_inputs; k++)
        r.step_input[g->inputs[k].value] = r.update_of_input[k] < 0;
    /* a new step: the callers' step inputs may hold other bytes than the last step's */
    for (int32_t stage = 0; progs && stage < progs->n_stages; stage++)
        for (int p = 0; p < 3; p++) {
            const gt_pp_part_program *pp = &progs->part[stage][p];
            if (pp->bound) memset(pp->bound, 0, (size_t)pp->n_in * sizeof *pp->bound);
        }
    size_t nn = (size_t)g->n_nodes + 1;
    r.invariant = gt_xcalloc(nn, 1);
    r.same_as = gt_xcalloc(nn, sizeof *r.same_as);
    r.holder = gt_xcalloc(nn, sizeof *r.holder);
    r.done_mb = gt_xcalloc(nn, sizeof *r.done_mb);
    find_invariant(&r);
    r.pin = gt_xcalloc((size_t)nv + 1, 1);
    r.refs = gt_xcalloc((size_t)M, sizeof *r.refs);
    for (int32_t m = 0; m < M; m++)
        r.refs[m] = gt_xcalloc((size_t)nv + 1, sizeof **r.refs);
    plan_frees(&r, s);
    for (int32_t m = 0; m < M; m++) {
        r.vals[m] = gt_xcalloc((size_t)nv + 1, sizeof **r.vals);
        r.defined[m] = gt_xcalloc((size_t)nv + 1, 1);
        for (int32_t k = 0; k < g->n_inputs; k++) {
            if (m > 0 && r.update_of_input[k] >= 0) continue; /* the running sum: from m - 1 */
            gt_value_id v = g->inputs[k].value;
            if (!dry) r.vals[m][v] = inputs[m][k];
            r.vals[m][v].owns_data = false;
            r.defined[m][v] = 1;
        }
    }
    for (int32_t m = 0; !dry && m < M; m++)
        memset(&losses[m], 0, sizeof losses[m]);
    gt_status st = run_clock(&r, err);
    if (st == GT_OK) st = gt_pp_schedule_each(s, me, run_one, &r, err);
    int64_t actions_peak = r.peak;
    /* once per step: the optimizer and the nodes every rank runs, on the last micro-batch */
    for (gt_node_id n = 0; st == GT_OK && n < g->n_nodes; n++) {
        bool global = split->part[n] == GT_PP_PART_GLOBAL;
        if (!global && split->part[n] != GT_PP_PART_OPT) continue;
        if (me >= 0 && !global && s->stage_rank[split->stage[n]] != me) continue;
        if (me >= 0 && global) st = gather_global_inputs(&r, s, n, err);
        if (st == GT_OK) st = run_node(&r, M - 1, n, err);
        if (st == GT_OK) release_after(&r, M - 1, n);
    }
    gt_status sst = dry ? GT_OK : gt_comm_send_wait_all(comm, err);
    if (st == GT_OK) st = sst;
    if (st == GT_OK && !dry && r.n_slots != r.n_planned)
        st = gt_error_set(err, GT_ERR_INTERNAL,
                          "pipeline step: %d values allocated, the plan's arena has %d", r.n_slots,
                          r.n_planned);
    if (st == GT_OK && !dry) st = hand_outputs(&r, losses, outputs, err);
    if (st != GT_OK && !dry) {
        for (int32_t k = 0; k < g->n_outputs; k++)
            gt_tensor_free(&outputs[k]);
        for (int32_t m = 0; m < M; m++)
            gt_tensor_free(&losses[m]);
    }
    for (int32_t m = 0; m < M; m++) {
        for (gt_value_id v = 0; v < nv; v++)
            if (r.defined[m][v] == 2) gt_tensor_free(&r.vals[m][v]);
        free(r.vals[m]);
        free(r.defined[m]);
    }
    free(r.vals);
    free(r.defined);
    free(r.micro_part);
    free(r.update_of_input);
    free(r.step_input);
    free(r.gathered);
    free(r.invariant);
    for (int32_t m = 0; m < M; m++)
        free(r.refs[m]);
    free(r.refs);
    free(r.pin);
    for (int32_t m = 0; m < M; m++)
        free(r.slot_of[m]);
    free(r.slot_of);
    int64_t arena_bytes = dry ? 0 : ap->bytes;
    if (dry) { /* the values' places: a run's arena */
        int64_t *offsets = gt_xcalloc((size_t)r.n_slots + 1, sizeof *offsets);
        arena_bytes = gt_pp_arena_place(r.slots, r.n_slots, offsets);
        if (ap && st == GT_OK) {
            *ap = (arena_plan){r.slots, offsets, r.n_slots, arena_bytes, NULL};
        } else {
            free(r.slots);
            free(offsets);
        }
    }
    if (stats) {
        stats->arena_bytes = arena_bytes;
        stats->peak_bytes = r.peak;
        stats->actions_peak_bytes = actions_peak;
        stats->allocated_bytes = r.total;
    }
    free(r.same_as);
    free(r.holder);
    free(r.done_mb);
    return st;
}

/* A run is its dry run first (the same arguments: it moves nothing), whose slots place the
 * values in one arena allocated before the first action; a dry run alone is the plan. With keep,
 * the plan and the arena of the first run serve the later ones (the dry run is on sizes alone,
 * the same every step; every value is written before it is read, as in fresh memory). */
struct gt_pp_step_keep {
    arena_plan ap;
};

static void free_plan(arena_plan *ap)
{
    free(ap->memory);
    free(ap->slots);
    free(ap->offsets);
    *ap = (arena_plan){0};
}

static gt_status step(const gt_graph *g, const gt_sym_binding *binding, const gt_pp_split *split,
                      const gt_pp_schedule *s, gt_comm *comm, int32_t me, bool dry,
                      gt_comm *const *dim_comms, const gt_pp_programs *progs,
                      const gt_tensor *const *inputs, gt_tensor *losses, gt_tensor *outputs,
                      gt_pp_step_stats *stats, gt_pp_step_keep *keep, gt_error *err)
{
    if (dry)
        return run_step(g, binding, split, s, comm, me, true, dim_comms, progs, NULL, NULL, NULL,
                        stats, NULL, err);
    arena_plan ap = keep ? keep->ap : (arena_plan){0};
    gt_status st = GT_OK;
    if (!ap.memory) {
        st = run_step(g, binding, split, s, comm, me, true, dim_comms, progs, NULL, NULL, NULL,
                      NULL, &ap, err);
        if (st == GT_OK)
            ap.memory = aligned_alloc(GT_PLAN_ALIGN, (size_t)(ap.bytes ? ap.bytes : GT_PLAN_ALIGN));
        if (st == GT_OK && !ap.memory)
            st = gt_error_set(err, GT_ERR_NOMEM, "pipeline step: the arena of %lld B",
                              (long long)ap.bytes);
    }
    if (st == GT_OK)
        st = run_step(g, binding, split, s, comm, me, false, dim_comms, progs, inputs, losses,
                      outputs, stats, &ap, err);
    if (keep && st == GT_OK) {
        keep->ap = ap;
        return GT_OK;
    }
    free_plan(&ap); /* a failed step plans afresh */
    if (keep) keep->ap = (arena_plan){0};
    return st;
}

void gt_pp_step_keep_free(gt_pp_step_keep *keep)
{
    if (!keep) return;
    free_plan(&keep->ap);
    free(keep);
}

gt_status gt_pp_eager_step_spmd(const gt_graph *g, const gt_sym_binding *binding,
                                const gt_pp_split *split, const gt_pp_schedule *s, gt_comm *comm,
                                gt_comm *const *dim_comms, const gt_tensor *const *inputs,
                                gt_tensor *losses, gt_tensor *outputs, gt_pp_step_stats *stats,
                                gt_error *err)
{
    return gt_pp_step_programs(g, binding, split, s, comm, dim_comms, NULL, inputs, losses, outputs,
                               stats, err);
}

gt_status gt_pp_step_programs_kept(const gt_graph *g, const gt_sym_binding *binding,
                                   const gt_pp_split *split, const gt_pp_schedule *s, gt_comm *comm,
                                   gt_comm *const *dim_comms, const gt_pp_programs *programs,
                                   const gt_tensor *const *inputs, gt_tensor *losses,
                                   gt_tensor *outputs, gt_pp_step_stats *stats,
                                   gt_pp_step_keep **keep, gt_error *err)
{
    if (!*keep) *keep = gt_xcalloc(1, sizeof **keep);
    return step(g, binding, split, s, comm, comm ? comm->rank : -1, false, dim_comms, programs,
                inputs, losses, outputs, stats, *keep, err);
}

gt_status gt_pp_step_programs(const gt_graph *g, const gt_sym_binding *binding,
                              const gt_pp_split *split, const gt_pp_schedule *s, gt_comm *comm,
                              gt_comm *const *dim_comms, const gt_pp_programs *programs,
                              const gt_tensor *const *inputs, gt_tensor *losses, gt_tensor *outputs,
                              gt_pp_step_stats *stats, gt_error *err)
{
    return step(g, binding, split, s, comm, comm ? comm->rank : -1, false, dim_comms, programs,
                inputs, losses, outputs, stats, NULL, err);
}

gt_status gt_pp_step_plan(const gt_graph *g, const gt_sym_binding *binding,
                          const gt_pp_split *split, const gt_pp_schedule *s, int32_t rank,
                          gt_pp_step_stats *stats, gt_error *err)
{
    return gt_pp_step_plan_programs(g, binding, split, s, rank, NULL, stats, err);
}

gt_status gt_pp_step_plan_programs(const gt_graph *g, const gt_sym_binding *binding,
                                   const gt_pp_split *split, const gt_pp_schedule *s, int32_t rank,
                                   const gt_pp_programs *programs, gt_pp_step_stats *stats,
                                   gt_error *err)
{
    if (rank < -1 || rank >= s->n_ranks)
        return gt_error_set(err, GT_ERR_INVALID, "pipeline step plan: rank %d of %d", rank,
                            s->n_ranks);
    return step(g, binding, split, s, NULL, rank, true, NULL, programs, NULL, NULL, NULL, stats,
                NULL, err);
}
