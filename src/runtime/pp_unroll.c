/* pp_unroll.c — a pipeline step as one graph (gt_pp_unroll, gt_pipeline.h): the nodes every action
 * of a schedule runs, copied per micro-batch in the order the actions run them, so that any
 * executor (eager, the CPU program, the CUDA program and its CUDA graph) runs a pipeline step as
 * it runs any step graph, with its memory plan placing each micro-batch's saved activations.
 *
 * The copies follow pp_exec.c's runner rule for rule, so the unrolled step computes every value
 * from the same inputs with the same op as the runner does (tests/numerics/test_pp_unroll.c):
 *   - the micro-batch clock's nodes for every micro-batch first, in order;
 *   - then the actions: F, I and W copy their stage part's nodes for their micro-batch in graph
 *     order (B is I then W), a micro-batch before the last only the nodes of the graph's
 *     micro-batch part (gt_graph_micro_part);
 *   - a buffer fed back from one micro-batch to the next (a running gradient sum) is read in
 *     micro-batch m > 0 as the update micro-batch m - 1 made; the update must be copied by then
 *     (a W before the previous micro-batch's W of its stage is an error naming both);
 *   - a step-invariant node (gt_pp_find_invariant: an FSDP gather of a parameter) is copied once
 *     a step, its later runs (other micro-batches, a repeat in the backward) read that copy;
 *   - the optimizer and the nodes every rank runs once, after the actions, on the last
 *     micro-batch's values.
 * With every stage in one graph (rank -1) the ranks' actions are merged in the order the
 * in-process runner takes them (each rank in turn up to a receive whose send has not run), and
 * sends and receives copy nothing: the receiving stage reads the sender's value.
 *
 * One rank's step (rank >= 0) holds its own actions, in its order, and the optimizer of its own
 * stages. A send is a send_start of each crossing value to the peer's rank on mesh dim "pp"
 * (added to the graph's mesh), under the runner's tag (crossing x micro-batches + micro-batch);
 * its wait comes at the end of the step, as the runner completes its sends then, so no rank
 * blocks on a send (two ranks that send to each other first would deadlock otherwise). A receive
 * is a recv_start and its wait at once. Before the nodes every rank runs (the gradient norm's
 * sum), each stage value they read goes from its stage's rank to every other rank, as the
 * runner's broadcast does, under tags after the crossings'. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graphtrain/gt_pipeline.h"
#include "pp_internal.h"

typedef struct {
    const gt_graph *g;
    const gt_pp_split *split;
    const uint8_t *per_micro;
    int32_t M;
    gt_graph *d;
    gt_value_id **map;   /* [M][n_values]: the value of micro-batch m in d, or GT_NONE */
    int32_t *input_of;   /* [n_values]: the step graph's input k whose value it is, or -1 */
    gt_value_id *shared; /* [n_inputs]: d's input of an input every micro-batch shares */
    int32_t *update;     /* [n_inputs]: gt_pp_update_of_input */
    uint8_t *micro;      /* [n_nodes]: gt_graph_micro_part */
    uint8_t *invariant;  /* [n_nodes] */
    gt_node_id *same_as; /* [n_nodes] */
    gt_node_id *holder;  /* [n_nodes]: for e = same_as[n], the node copied for it, or GT_NONE */
    int32_t *holder_mb;  /* [n_nodes]: that copy's micro-batch */
    gt_pp_unrolled *out;
    /* one rank's step (rank >= 0) */
    int32_t rank, n_ranks, pp_dim;
    const int32_t *stage_rank;
    gt_value_id *sent; /* [n_sent][2]: a send_start's output and input, waited at the end */
    int32_t n_sent;
    int32_t next_tag;  /* the next tag of a value the global nodes read */
    uint8_t *gathered; /* [n_values]: a value the global nodes read, moved already */
} unroll;

static void record_input(unroll *u, int32_t k, int32_t m)
{
    gt_pp_unrolled *o = u->out;
    o->input_of = gt_xrealloc(o->input_of, (size_t)o->g->n_inputs * sizeof *o->input_of);
    o->input_mb = gt_xrealloc(o->input_mb, (size_t)o->g->n_inputs * sizeof *o->input_mb);
    o->input_of[o->g->n_inputs - 1] = k;
    o->input_mb[o->g->n_inputs - 1] = m;
}

/* d's input for step-graph input k in micro-batch m (added when first read): its own per
 * micro-batch (per_micro[k]), else one every micro-batch shares. */
static gt_value_id input_value(unroll *u, int32_t k, int32_t m)
{
    const gt_io *in = &u->g->inputs[k];
    if (!u->per_micro[k] && u->shared[k] != GT_NONE) return u->shared[k];
    const gt_type *ty = gt_value_type(u->g, in->value);
    gt_expr dims[GT_MAX_DIMS];
    for (int a = 0; a < ty->ndim; a++)
        dims[a] = gt_sym_import(u->d->sym, u->g->sym, ty->dims[a]);
    char name[512];
    const char *fqn = gt_graph_str(u->g, in->fqn);
    if (u->per_micro[k])
        snprintf(name, sizeof name, "%s.mb%d", fqn, m);
    else
        snprintf(name, sizeof name, "%s", fqn);
    gt_value_id v =
        gt_graph_add_input(u->d, (gt_input_kind)in->kind, name, ty->dtype, ty->ndim, dims);
    gt_graph_set_input_plan(u->d, v, in->plan);
    record_input(u, k, u->per_micro[k] ? m : -1);
    if (!u->per_micro[k]) u->shared[k] = v;
    return v;
}

/* Value v of the step graph as micro-batch m reads it in d. */
static gt_status resolve(unroll *u, int32_t m, gt_value_id v, gt_node_id reader, gt_error *err)
{
    if (u->map[m][v] != GT_NONE) return GT_OK;
    int32_t k = u->input_of[v];
    if (k >= 0 && (m == 0 || u->update[k] < 0)) {
        u->map[m][v] = input_value(u, k, m);
        return GT_OK;
    }
    if (k >= 0 && u->map[m - 1][u->update[k]] != GT_NONE) { /* fed back by micro-batch m - 1 */
        u->map[m][v] = u->map[m - 1][u->update[k]];
        return GT_OK;
    }
    int32_t st = u->split->stage[reader];
    if (k >= 0)
        return gt_error_set(err, GT_ERR_INVALID,
                            "pipeline unroll: micro-batch %d of stage %d reads %s before "
                            "micro-batch %d updates it (the running sums are added in "
                            "micro-batch order: %dW%d runs before %dW%d)",
                            m, st, gt_graph_str(u->g, u->g->inputs[k].fqn), m - 1, st, m, st,
                            m - 1);
    return gt_error_set(err, GT_ERR_INVALID,
                        "pipeline unroll: node %d (%s, stage %d) of micro-batch %d reads %%%d "
                        "before it is computed",
                        reader, gt_op_get(u->g->nodes[reader].op)->name, st, m, v);
}

/* Node n of micro-batch m into d (or, for an invariant node copied already, its copy's values). */
static gt_status emit(unroll *u, int32_t m, gt_node_id n, gt_error *err)
{
    const gt_node *nd = &u->g->nodes[n];
    if (u->invariant[n]) {
        gt_node_id e = u->same_as[n], h = u->holder[e];
        if (h != GT_NONE) {
            const gt_node *hn = &u->g->nodes[h];
            for (int j = 0; j < nd->n_out; j++)
                u->map[m][nd->out[j]] = u->map[u->holder_mb[e]][hn->out[j]];
            return GT_OK;
        }
        u->holder[e] = n;
        u->holder_mb[e] = m;
    }
    for (int j = 0; j < nd->n_in; j++)
        GT_TRY(resolve(u, m, nd->in[j], n, err));
    return gt_graph_copy_nodes(u->d, u->g, &n, 1, u->map[m], NULL, err);
}

static gt_status emit_part(unroll *u, int32_t m, int32_t st, gt_pp_part p, gt_error *err)
{
    bool last = m == u->M - 1;
    for (gt_node_id n = 0; n < u->g->n_nodes; n++) {
        if (u->split->stage[n] != st || u->split->part[n] != (uint8_t)p) continue;
        if (!last && !u->micro[n]) continue;
        GT_TRY(emit(u, m, n, err));
    }
    return GT_OK;
}

/* A point-to-point tag the communicators carry (gt_comm_send_start: below 32768). */
static gt_status check_tag(int64_t tag, gt_error *err)
{
    if (tag < 32768) return GT_OK;
    return gt_error_set(err, GT_ERR_UNSUPPORTED,
                        "pipeline unroll: tag %lld: the crossing values x micro-batches exceed the "
                        "point-to-point tags (32768)",
                        (long long)tag);
}

/* A send_start of x to `peer` under `tag`; its wait comes at the end of the step. */
static gt_status send_value(unroll *u, gt_value_id x, int32_t peer, int64_t tag, gt_error *err)
{
    GT_TRY(check_tag(tag, err));
    gt_attrs a = {.ni = 4, .i = {u->pp_dim, u->n_ranks, peer, tag}};
    gt_value_id s = gt_graph_add_node(u->d, GT_OP_SEND_START, &x, 1, &a, NULL);
    if (s == GT_NONE)
        return gt_error_set(err, u->d->err.code, "pipeline unroll: %s", u->d->err.msg);
    u->sent = gt_xrealloc(u->sent, ((size_t)u->n_sent + 1) * 2 * sizeof *u->sent);
    u->sent[2 * u->n_sent] = s;
    u->sent[2 * u->n_sent + 1] = x;
    u->n_sent++;
    return GT_OK;
}

/* Value v of the step graph received from `peer` under `tag` into micro-batch m's map. */
static gt_status recv_value(unroll *u, int32_t m, gt_value_id v, int32_t peer, int64_t tag,
                            gt_error *err)
{
    GT_TRY(check_tag(tag, err));
    const gt_type *ty = gt_value_type(u->g, v);
    gt_attrs a = {.ni = 5, .i = {u->pp_dim, u->n_ranks, peer, tag, ty->dtype}, .ne = ty->ndim};
    for (int k = 0; k < ty->ndim; k++)
        a.e[k] = gt_sym_import(u->d->sym, u->g->sym, ty->dims[k]);
    gt_value_id r = gt_graph_add_node(u->d, GT_OP_RECV_START, NULL, 0, &a, NULL);
    gt_value_id in[2] = {r, r};
    gt_value_id w = r == GT_NONE ? GT_NONE : gt_graph_add_node(u->d, GT_OP_WAIT, in, 2, NULL, NULL);
    if (w == GT_NONE)
        return gt_error_set(err, u->d->err.code, "pipeline unroll: %s", u->d->err.msg);
    u->map[m][v] = w;
    return GT_OK;
}

/* A send or receive of rank u->rank: each crossing value of its stages and micro-batch. */
static gt_status transfer(unroll *u, gt_pp_action a, gt_error *err)
{
    bool send = a.kind == GT_PP_SEND_F || a.kind == GT_PP_SEND_B;
    bool grad = a.kind == GT_PP_SEND_B || a.kind == GT_PP_RECV_B;
    int32_t from = send ? a.stage : grad ? a.stage + 1 : a.stage - 1;
    int32_t to = send ? (grad ? a.stage - 1 : a.stage + 1) : a.stage;
    int32_t peer = u->stage_rank[send ? to : from];
    for (int32_t k = 0; k < u->split->n_cross; k++) {
        const gt_pp_cross *c = &u->split->cross[k];
        if (c->from != from || c->to != to || c->gradient != grad) continue;
        int64_t tag = (int64_t)k * u->M + a.mb;
        if (!send) {
            GT_TRY(recv_value(u, a.mb, c->value, peer, tag, err));
            continue;
        }
        gt_value_id x = u->map[a.mb][c->value];
        if (x == GT_NONE)
            return gt_error_set(err, GT_ERR_INVALID,
                                "pipeline unroll: sends %%%d of micro-batch %d before it is "
                                "computed",
                                c->value, a.mb);
        GT_TRY(send_value(u, x, peer, tag, err));
    }
    return GT_OK;
}

/* Before global node n on one rank: each stage value it reads goes from its stage's rank to the
 * others (every rank reaches the global nodes in graph order: the tags match). */
static gt_status gather_global_inputs(unroll *u, gt_node_id n, gt_error *err)
{
    const gt_graph *g = u->g;
    int32_t m = u->M - 1;
    for (int j = 0; j < g->nodes[n].n_in; j++) {
        gt_value_id v = g->nodes[n].in[j];
        gt_node_id p = g->values[v].producer;
        if (p == GT_NONE || u->split->stage[p] == GT_PP_STAGE_GLOBAL || u->gathered[v]) continue;
        u->gathered[v] = 1;
        int32_t root = u->stage_rank[u->split->stage[p]];
        int64_t tag = (int64_t)u->split->n_cross * u->M + u->next_tag++;
        if (root != u->rank) {
            GT_TRY(recv_value(u, m, v, root, tag, err));
            continue;
        }
        if (u->map[m][v] == GT_NONE)
            return gt_error_set(err, GT_ERR_INVALID,
                                "pipeline unroll: node %d (%s) reads %%%d of stage %d, which this "
                                "rank does not compute",
                                n, gt_op_get(g->nodes[n].op)->name, v, u->split->stage[p]);
        for (int32_t q = 0; q < u->n_ranks; q++)
            if (q != u->rank) GT_TRY(send_value(u, u->map[m][v], q, tag, err));
    }
    return GT_OK;
}

static gt_status emit_action(unroll *u, gt_pp_action a, gt_error *err)
{
    if (u->rank >= 0 && a.kind >= GT_PP_SEND_F) return transfer(u, a, err);
    switch (a.kind) {
    case GT_PP_F:
        return emit_part(u, a.mb, a.stage, GT_PP_PART_F, err);
    case GT_PP_I:
        return emit_part(u, a.mb, a.stage, GT_PP_PART_I, err);
    case GT_PP_W:
        return emit_part(u, a.mb, a.stage, GT_PP_PART_W, err);
    case GT_PP_B:
        GT_TRY(emit_part(u, a.mb, a.stage, GT_PP_PART_I, err));
        return emit_part(u, a.mb, a.stage, GT_PP_PART_W, err);
    default:
        return GT_OK; /* one graph: the receiver reads the sender's value */
    }
}

/* One action of the schedule (gt_pp_schedule_each's callback). */
static gt_status emit_one(void *user, gt_pp_action a, gt_error *err)
{
    return emit_action(user, a, err);
}

/* d's outputs: each micro-batch's loss, and the last micro-batch's outputs of the step graph. */
static void add_outputs(unroll *u)
{
    const gt_graph *g = u->g;
    gt_pp_unrolled *o = u->out;
    int32_t cap = g->n_outputs * u->M + 1;
    o->output_of = gt_xcalloc((size_t)cap, sizeof *o->output_of);
    o->output_mb = gt_xcalloc((size_t)cap, sizeof *o->output_mb);
    for (int32_t m = 0; m < u->M; m++)
        for (int32_t k = 0; k < g->n_outputs; k++) {
            bool last = m == u->M - 1;
            if (!last && g->outputs[k].kind != GT_OUT_LOSS) continue;
            if (u->map[m][g->outputs[k].value] == GT_NONE) continue; /* another rank's */
            char name[512];
            const char *fqn = gt_graph_str(g, g->outputs[k].fqn);
            if (last)
                snprintf(name, sizeof name, "%s", fqn);
            else
                snprintf(name, sizeof name, "%s.mb%d", fqn, m);
            /* an earlier micro-batch's loss is a metric: the step's LOSS is the last one's */
            gt_graph_add_output(u->d, last ? (gt_output_kind)g->outputs[k].kind : GT_OUT_METRIC,
                                name, u->map[m][g->outputs[k].value]);
            o->output_of[o->g->n_outputs - 1] = k;
            o->output_mb[o->g->n_outputs - 1] = m;
        }
}

static gt_status run(unroll *u, const gt_pp_schedule *s, gt_error *err)
{
    const gt_graph *g = u->g;
    /* the micro-batch clock, every micro-batch in order */
    for (int32_t m = 0; m < u->M; m++)
        for (gt_node_id n = 0; n < g->n_nodes; n++)
            if (u->split->part[n] == GT_PP_PART_CLOCK) GT_TRY(emit(u, m, n, err));
    GT_TRY(gt_pp_schedule_each(s, u->rank, emit_one, u, err));
    /* once a step: the optimizer and the nodes every rank runs, on the last micro-batch */
    for (gt_node_id n = 0; n < g->n_nodes; n++) {
        gt_pp_part p = (gt_pp_part)u->split->part[n];
        if (p != GT_PP_PART_OPT && p != GT_PP_PART_GLOBAL) continue;
        bool mine =
            p == GT_PP_PART_GLOBAL || u->rank < 0 || u->stage_rank[u->split->stage[n]] == u->rank;
        if (!mine) continue;
        if (u->rank >= 0 && p == GT_PP_PART_GLOBAL) GT_TRY(gather_global_inputs(u, n, err));
        GT_TRY(emit(u, u->M - 1, n, err));
    }
    for (int32_t k = 0; k < u->n_sent; k++) { /* the sends complete at the end of the step */
        if (gt_graph_add_node(u->d, GT_OP_WAIT, &u->sent[2 * k], 2, NULL, NULL) == GT_NONE)
            return gt_error_set(err, u->d->err.code, "pipeline unroll: %s", u->d->err.msg);
    }
    for (int32_t k = 0; u->rank < 0 && k < g->n_outputs; k++) {
        gt_value_id v = g->outputs[k].value;
        for (int32_t m = 0; m < u->M; m++) {
            if (m < u->M - 1 && g->outputs[k].kind != GT_OUT_LOSS) continue;
            if (u->map[m][v] == GT_NONE)
                return gt_error_set(err, GT_ERR_INVALID,
                                    "pipeline unroll: output %d (%s) of micro-batch %d is not "
                                    "computed by the schedule's actions",
                                    k, gt_graph_str(g, g->outputs[k].fqn), m);
        }
    }
    add_outputs(u);
    if (u->d->err.code != GT_OK)
        return gt_error_set(err, u->d->err.code, "pipeline unroll: %s", u->d->err.msg);
    return gt_graph_verify(u->d, err);
}

gt_status gt_pp_unroll(const gt_graph *g, const gt_pp_split *split, const gt_pp_schedule *s,
                       int32_t rank, const uint8_t *per_micro, gt_pp_unrolled *out, gt_error *err)
{
    memset(out, 0, sizeof *out);
    if (split->n_nodes != g->n_nodes || split->n_stages != s->n_stages)
        return gt_error_set(err, GT_ERR_INVALID,
                            "pipeline unroll: the split (%d nodes, %d stages) is not of this graph "
                            "and schedule (%d nodes, %d stages)",
                            split->n_nodes, split->n_stages, g->n_nodes, s->n_stages);
    if (rank < -1 || rank >= s->n_ranks)
        return gt_error_set(err, GT_ERR_INVALID, "pipeline unroll: rank %d of %d", rank,
                            s->n_ranks);
    if (rank >= 0 && g->mesh.ndim >= GT_MESH_MAX_DIMS)
        return gt_error_set(err, GT_ERR_UNSUPPORTED,
                            "pipeline unroll: the step graph's mesh has %d dims, no room for pp",
                            g->mesh.ndim);
    int32_t M = s->n_micro, nv = g->n_values, nn = g->n_nodes;
    unroll u = {.g = g,
                .split = split,
                .per_micro = per_micro,
                .M = M,
                .out = out,
                .rank = rank,
                .n_ranks = s->n_ranks,
                .stage_rank = s->stage_rank};
    out->n_micro = M;
    out->g = u.d = gt_graph_new();
    if (rank >= 0) { /* the graph's mesh and pp outermost (its dim the last: the others keep
                      * their numbers) */
        u.d->mesh = g->mesh;
        for (int k = 0; k < g->mesh.ndim; k++)
            u.d->mesh.name[k] = gt_graph_intern(u.d, gt_graph_str(g, g->mesh.name[k]));
        u.pp_dim = g->mesh.ndim;
        u.d->mesh.size[u.pp_dim] = s->n_ranks;
        u.d->mesh.name[u.pp_dim] = gt_graph_intern(u.d, "pp");
        u.d->mesh.ndim++;
    }
    u.gathered = gt_xcalloc((size_t)nv + 1, 1);
    u.map = gt_xcalloc((size_t)M, sizeof *u.map);
    for (int32_t m = 0; m < M; m++) {
        u.map[m] = gt_xmalloc(((size_t)nv + 1) * sizeof **u.map);
        for (gt_value_id v = 0; v < nv; v++)
            u.map[m][v] = GT_NONE;
    }
    u.input_of = gt_xmalloc(((size_t)nv + 1) * sizeof *u.input_of);
    for (gt_value_id v = 0; v < nv; v++)
        u.input_of[v] = -1;
    u.shared = gt_xmalloc(((size_t)g->n_inputs + 1) * sizeof *u.shared);
    for (int32_t k = 0; k < g->n_inputs; k++) {
        u.input_of[g->inputs[k].value] = k;
        u.shared[k] = GT_NONE;
    }
    u.update = gt_pp_update_of_input(g, split);
    u.micro = gt_xcalloc((size_t)nn + 1, 1);
    gt_graph_micro_part(g, u.micro);
    u.invariant = gt_xcalloc((size_t)nn + 1, 1);
    u.same_as = gt_xcalloc((size_t)nn + 1, sizeof *u.same_as);
    gt_pp_find_invariant(g, split, u.update, u.invariant, u.same_as);
    u.holder = gt_xmalloc(((size_t)nn + 1) * sizeof *u.holder);
    u.holder_mb = gt_xcalloc((size_t)nn + 1, sizeof *u.holder_mb);
    for (gt_node_id n = 0; n < nn; n++)
        u.holder[n] = GT_NONE;
    gt_status st = run(&u, s, err);
    for (int32_t m = 0; m < M; m++)
        free(u.map[m]);
    free(u.map);
    free(u.input_of);
    free(u.shared);
    free(u.update);
    free(u.micro);
    free(u.invariant);
    free(u.same_as);
    free(u.holder);
    free(u.holder_mb);
    free(u.gathered);
    free(u.sent);
    if (st != GT_OK) gt_pp_unrolled_free(out);
    return st;
}

void gt_pp_unrolled_free(gt_pp_unrolled *u)
{
    if (!u) return;
    gt_graph_free(u->g);
    free(u->input_of);
    free(u->input_mb);
    free(u->output_of);
    free(u->output_mb);
    memset(u, 0, sizeof *u);
}
