/* pp_split.c — the stage split of a whole-step graph and each stage's dI/dW split (gt_pp_split.h,
 * issue 39).
 *
 * The split only labels nodes: it copies and rewrites nothing, so a pipeline that runs the labelled
 * node sets computes every value from the same inputs as the whole graph. The labels come from
 * what every node already carries (phase, origin, unit) and from the parallel plan of the inputs a
 * node reads (the unit of a parameter and of the optimizer state given its plan). */
#include <stdlib.h>
#include <string.h>

#include "graphtrain/gt_pp_split.h"

static const char *node_fqn(const gt_graph *g, gt_node_id n)
{
    const char *f = gt_graph_str(g, g->nodes[n].fqn);
    return f && f[0] ? f : "-";
}

/* The stage of a structural unit; -2 when a block lies past the split. */
static int32_t stage_of_unit(int32_t unit, int32_t n_stages, const int64_t *first_layer)
{
    if (unit == GT_UNIT_EMBED) return 0;
    if (unit < 0) return n_stages - 1;
    for (int32_t s = 0; s < n_stages; s++)
        if (unit >= first_layer[s] && unit < first_layer[s + 1]) return s;
    return -2;
}

static void add_cross(gt_pp_split *s, gt_value_id v, int32_t from, int32_t to, bool gradient,
                      gt_node_id reader)
{
    for (int32_t k = 0; k < s->n_cross; k++)
        if (s->cross[k].value == v && s->cross[k].to == to) return;
    s->cross = gt_xrealloc(s->cross, ((size_t)s->n_cross + 1) * sizeof *s->cross);
    s->cross[s->n_cross++] = (gt_pp_cross){v, from, to, gradient, reader};
}

/* The micro-batch clock (clock[n] = 1): the nodes whose values depend on the micro-batch's index
 * within its step alone. Their inputs are clock values: a buffer fed back by a clock value (the
 * expert-bias accumulation's micro-batch counter, m' = m + 1 - A [m + 1 == A]) or another clock
 * node's output. A fixpoint: every fed-back buffer starts as a candidate and leaves when its
 * update reads anything else (a running gradient or token-count sum reads the micro-batch's
 * values). */
static void find_clock(const gt_graph *g, uint8_t *clock)
{
    uint8_t *val = gt_xcalloc((size_t)g->n_values + 1, 1);
    gt_value_id *update = gt_graph_buffer_updates(g);
    for (bool changed = true; changed;) {
        changed = false;
        memset(val, 0, (size_t)g->n_values + 1);
        for (int32_t k = 0; k < g->n_inputs; k++)
            if (update[k] != GT_NONE) val[g->inputs[k].value] = 1;
        for (gt_node_id n = 0; n < g->n_nodes; n++) {
            const gt_node *nd = &g->nodes[n];
            bool c = nd->n_in > 0;
            for (int i = 0; c && i < nd->n_in; i++)
                c = val[nd->in[i]] != 0;
            clock[n] = c;
            for (int j = 0; j < nd->n_out; j++)
                val[nd->out[j]] = c;
        }
        for (int32_t k = 0; k < g->n_inputs; k++)
            if (update[k] != GT_NONE && !val[update[k]]) update[k] = GT_NONE, changed = true;
    }
    free(val);
    free(update);
}

/* The nodes a micro-batch runs when its step's updates are left to the optimizer (step[n] = 1):
 * those the losses need, and the running sums that a backward node updates (gradient and token
 * count sums, the clock). A BUFFER_UPDATE that an optimizer node computes (the expert biases',
 * which the accumulation graph gates off until the last micro-batch) is a step's update: a
 * pipeline runs it once a step, as it runs the parameters'. */
static void step_micro_part(const gt_graph *g, uint8_t *step)
{
    uint8_t *needed = gt_xcalloc((size_t)g->n_values + 1, 1);
    for (int32_t k = 0; k < g->n_outputs; k++) {
        const gt_io *o = &g->outputs[k];
        gt_node_id p = g->values[o->value].producer;
        bool opt = p != GT_NONE && g->nodes[p].phase == GT_PHASE_OPTIMIZER;
        if (o->kind == GT_OUT_LOSS || (o->kind == GT_OUT_BUFFER_UPDATE && !opt))
            needed[o->value] = 1;
    }
    for (gt_node_id n = g->n_nodes - 1; n >= 0; n--) {
        const gt_node *nd = &g->nodes[n];
        step[n] = 0;
        for (int j = 0; j < nd->n_out && !step[n]; j++)
            step[n] = needed[nd->out[j]];
        for (int j = 0; step[n] && j < nd->n_in; j++)
            needed[nd->in[j]] = 1;
    }
    free(needed);
}

/* Stages of the nodes, in graph order (every node's inputs and its origin come before it). */
static gt_status assign_stages(const gt_graph *g, gt_pp_split *s, const int32_t *input_of,
                               const int64_t *first_layer, const uint8_t *micro,
                               const uint8_t *clock, gt_error *err)
{
    int32_t S = s->n_stages;
    for (gt_node_id n = 0; n < g->n_nodes; n++) {
        const gt_node *nd = &g->nodes[n];
        int32_t st;
        if (clock[n]) { /* every rank runs it for every micro-batch, before the schedule */
            s->stage[n] = GT_PP_STAGE_GLOBAL;
            s->part[n] = GT_PP_PART_CLOCK;
            continue;
        }
        if (nd->phase == GT_PHASE_FORWARD) {
            st = stage_of_unit(nd->unit, S, first_layer);
        } else if (nd->phase == GT_PHASE_BACKWARD) {
            st = nd->origin != GT_NONE && nd->origin < n ? s->stage[nd->origin]
                                                         : stage_of_unit(nd->unit, S, first_layer);
        } else {
            /* optimizer: its parameter's stage, else the one stage it reads, else global */
            int32_t param_stage = -3, read = -3;
            bool several = false;
            for (int i = 0; i < nd->n_in; i++) {
                gt_value_id v = nd->in[i];
                int32_t k = input_of[v];
                if (k >= 0 && g->inputs[k].plan.as_param)
                    param_stage = stage_of_unit(g->inputs[k].plan.unit, S, first_layer);
                gt_node_id p = g->values[v].producer;
                if (p == GT_NONE || clock[p]) continue; /* the clock is on every rank */
                int32_t ps = s->stage[p];
                if (ps == GT_PP_STAGE_GLOBAL || (read != -3 && read != ps)) several = true;
                read = ps;
            }
            st = param_stage != -3       ? param_stage
                 : several || read == -3 ? GT_PP_STAGE_GLOBAL
                                         : read;
        }
        if (st == -2)
            return gt_error_set(err, GT_ERR_INVALID,
                                "pipeline split: node %d (%s, %s) is in block %d, past the %lld "
                                "blocks the stages hold",
                                n, gt_op_get(nd->op)->name, node_fqn(g, n), nd->unit,
                                (long long)first_layer[S]);
        s->stage[n] = st;
        s->part[n] = nd->phase == GT_PHASE_FORWARD    ? GT_PP_PART_F
                     : nd->phase == GT_PHASE_BACKWARD ? GT_PP_PART_W
                     : st == GT_PP_STAGE_GLOBAL       ? GT_PP_PART_GLOBAL
                                                      : GT_PP_PART_OPT;
        if (s->part[n] == GT_PP_PART_OPT && micro[n]) {
            /* a node of the optimizer phase that every micro-batch runs (parallelize's all-reduce
             * of the loss over the data-parallel ranks; step_micro_part): in its stage's forward
             * when it reads forward values alone, else in its weight gradient */
            bool fwd = true;
            for (int i = 0; i < nd->n_in; i++) {
                gt_node_id p = g->values[nd->in[i]].producer;
                int32_t k = input_of[nd->in[i]];
                fwd = fwd && (p == GT_NONE ? k < 0 || !g->inputs[k].plan.as_param
                                           : s->part[p] == GT_PP_PART_F || clock[p]);
            }
            s->part[n] = fwd ? GT_PP_PART_F : GT_PP_PART_W;
        }
    }
    return GT_OK;
}

/* A stage's forward runs before its backward, so what a forward node reads of its own stage's
 * backward moves into the forward (the loss fusion's cross_entropy_with_grad computes the loss
 * the forward reports and the gradient the backward starts from). Reverse graph order carries it
 * up a chain. */
static void close_forward(const gt_graph *g, gt_pp_split *s)
{
    for (gt_node_id n = g->n_nodes - 1; n >= 0; n--) {
        if (s->part[n] != GT_PP_PART_F) continue;
        const gt_node *nd = &g->nodes[n];
        for (int i = 0; i < nd->n_in; i++) {
            gt_node_id p = g->values[nd->in[i]].producer;
            if (p != GT_NONE && s->stage[p] == s->stage[n] && s->part[p] == GT_PP_PART_W)
                s->part[p] = GT_PP_PART_F;
        }
    }
}

/* The values that cross stages; a crossing that no send or receive of a pipeline carries is an
 * error. */
static gt_status find_crossings(const gt_graph *g, gt_pp_split *s, gt_error *err)
{
    for (gt_node_id n = 0; n < g->n_nodes; n++) {
        const gt_node *nd = &g->nodes[n];
        int32_t b = s->stage[n];
        for (int i = 0; i < nd->n_in; i++) {
            gt_value_id v = nd->in[i];
            gt_node_id p = g->values[v].producer;
            if (p == GT_NONE) continue;
            int32_t a = s->stage[p];
            if (a == b || a == GT_PP_STAGE_GLOBAL) continue; /* global values are on every rank */
            bool grad = s->part[p] != GT_PP_PART_F;
            bool fwd_ok = !grad && b == a + 1;
            bool bwd_ok = grad && b == a - 1 && s->part[n] != GT_PP_PART_F;
            if (b == GT_PP_STAGE_GLOBAL || fwd_ok || bwd_ok) {
                add_cross(s, v, a, b, grad, n);
                continue;
            }
            return gt_error_set(err, GT_ERR_INVALID,
                                "pipeline split: node %d (%s, %s, %s) of stage %d reads value %d "
                                "of node %d (%s, %s, %s) of stage %d: only a forward value of the "
                                "stage before or a gradient of the stage after may cross",
                                n, gt_op_get(nd->op)->name, node_fqn(g, n),
                                gt_phase_name((gt_phase)nd->phase), b, v, p,
                                gt_op_get(g->nodes[p].op)->name, node_fqn(g, p),
                                gt_phase_name((gt_phase)g->nodes[p].phase), a);
        }
    }
    return GT_OK;
}

/* dI: the backward nodes of a stage that its outgoing gradients need (a walk up from them). */
static void mark_input_gradients(const gt_graph *g, gt_pp_split *s)
{
    gt_node_id *stack = gt_xmalloc(((size_t)g->n_nodes + 1) * sizeof *stack);
    int32_t top = 0;
    for (int32_t k = 0; k < s->n_cross; k++) {
        if (!s->cross[k].gradient || s->cross[k].to == GT_PP_STAGE_GLOBAL) continue;
        gt_node_id p = g->values[s->cross[k].value].producer;
        if (s->part[p] == GT_PP_PART_W) s->part[p] = GT_PP_PART_I, stack[top++] = p;
    }
    while (top > 0) {
        gt_node_id n = stack[--top];
        const gt_node *nd = &g->nodes[n];
        for (int i = 0; i < nd->n_in; i++) {
            gt_node_id p = g->values[nd->in[i]].producer;
            if (p == GT_NONE || s->part[p] != GT_PP_PART_W || s->stage[p] != s->stage[n]) continue;
            s->part[p] = GT_PP_PART_I;
            stack[top++] = p;
        }
    }
    free(stack);
}

const char *gt_pp_part_name(gt_pp_part p)
{
    static const char *const names[] = {"F", "I", "W", "OPT", "GLOBAL", "CLOCK"};
    return p >= GT_PP_PART_F && p <= GT_PP_PART_CLOCK ? names[p] : "?";
}

gt_status gt_pp_split_graph(const gt_graph *g, int32_t n_stages, const int64_t *first_layer,
                            gt_pp_split *out, gt_error *err)
{
    memset(out, 0, sizeof *out);
    if (n_stages < 1)
        return gt_error_set(err, GT_ERR_INVALID, "pipeline split: %d stages", n_stages);
    out->n_stages = n_stages;
    out->n_nodes = g->n_nodes;
    out->stage = gt_xcalloc((size_t)g->n_nodes + 1, sizeof *out->stage);
    out->part = gt_xcalloc((size_t)g->n_nodes + 1, 1);
    out->count = gt_xcalloc((size_t)n_stages, sizeof *out->count);
    int32_t *input_of = gt_xmalloc(((size_t)g->n_values + 1) * sizeof *input_of);
    for (gt_value_id v = 0; v < g->n_values; v++)
        input_of[v] = -1;
    for (int32_t k = 0; k < g->n_inputs; k++)
        input_of[g->inputs[k].value] = k;
    uint8_t *micro = gt_xcalloc((size_t)g->n_nodes + 1, 1);
    uint8_t *clock = gt_xcalloc((size_t)g->n_nodes + 1, 1);
    step_micro_part(g, micro);
    find_clock(g, clock);
    gt_status st = assign_stages(g, out, input_of, first_layer, micro, clock, err);
    free(micro);
    free(clock);
    free(input_of);
    if (st == GT_OK) close_forward(g, out);
    if (st == GT_OK) st = find_crossings(g, out, err);
    if (st != GT_OK) {
        gt_pp_split_free(out);
        return st;
    }
    mark_input_gradients(g, out);
    for (gt_node_id n = 0; n < g->n_nodes; n++) {
        if (out->part[n] == GT_PP_PART_CLOCK)
            out->n_clock++;
        else if (out->stage[n] == GT_PP_STAGE_GLOBAL)
            out->n_global++;
        else
            out->count[out->stage[n]][out->part[n]]++;
    }
    return GT_OK;
}

void gt_pp_split_free(gt_pp_split *s)
{
    if (!s) return;
    free(s->stage);
    free(s->part);
    free(s->cross);
    free(s->count);
    memset(s, 0, sizeof *s);
}

void gt_pp_split_pipeline_order(const gt_graph *g, const gt_pp_split *s, gt_node_id *order)
{
    int32_t k = 0;
    for (gt_node_id n = 0; n < g->n_nodes; n++)
        if (s->part[n] == GT_PP_PART_CLOCK) order[k++] = n;
    for (int32_t st = 0; st < s->n_stages; st++)
        for (gt_node_id n = 0; n < g->n_nodes; n++)
            if (s->stage[n] == st && s->part[n] == GT_PP_PART_F) order[k++] = n;
    for (int32_t st = s->n_stages - 1; st >= 0; st--)
        for (int p = GT_PP_PART_I; p <= GT_PP_PART_W; p++)
            for (gt_node_id n = 0; n < g->n_nodes; n++)
                if (s->stage[n] == st && s->part[n] == p) order[k++] = n;
    for (gt_node_id n = 0; n < g->n_nodes; n++)
        if (s->part[n] == GT_PP_PART_OPT || s->part[n] == GT_PP_PART_GLOBAL) order[k++] = n;
}

gt_status gt_pp_split_saved_bytes(const gt_graph *g, const gt_pp_split *s,
                                  const gt_sym_binding *binding, int64_t *bytes, gt_error *err)
{
    for (int32_t st = 0; st < s->n_stages; st++)
        bytes[st] = 0;
    /* [value][stage]: already counted for that stage (several readers count once) */
    uint8_t *counted = gt_xcalloc(((size_t)g->n_values + 1) * (size_t)s->n_stages, 1);
    gt_status status = GT_OK;
    for (gt_node_id n = 0; n < g->n_nodes && status == GT_OK; n++) {
        if (s->part[n] != GT_PP_PART_I && s->part[n] != GT_PP_PART_W) continue;
        int32_t st = s->stage[n];
        const gt_node *nd = &g->nodes[n];
        for (int i = 0; i < nd->n_in && status == GT_OK; i++) {
            gt_value_id v = nd->in[i];
            gt_node_id p = g->values[v].producer;
            if (p == GT_NONE || s->part[p] != GT_PP_PART_F) continue;
            if (s->stage[p] != st && s->stage[p] != st - 1) continue;
            uint8_t *c = &counted[(size_t)v * s->n_stages + st];
            if (*c) continue;
            *c = 1;
            int64_t shape[GT_MAX_DIMS];
            status = gt_graph_eval_shape(g, v, binding, shape, err);
            if (status != GT_OK) break;
            const gt_type *ty = gt_value_type(g, v);
            int64_t numel = 1;
            for (int d = 0; d < ty->ndim; d++)
                numel *= shape[d];
            bytes[st] += numel * (int64_t)gt_dtype_size(ty->dtype);
        }
    }
    free(counted);
    return status;
}

void gt_pp_split_print(const gt_graph *g, const gt_pp_split *s, FILE *f)
{
    fprintf(f,
            "stage  forward  dI  dW  optimizer  receives (fwd/grad)  sends (fwd/grad/gathered)\n");
    for (int32_t st = 0; st < s->n_stages; st++) {
        int rf = 0, rg = 0, sf = 0, sg = 0, sx = 0;
        for (int32_t k = 0; k < s->n_cross; k++) {
            const gt_pp_cross *c = &s->cross[k];
            if (c->to == st) c->gradient ? rg++ : rf++;
            if (c->from == st) c->to == GT_PP_STAGE_GLOBAL ? sx++ : c->gradient ? sg++ : sf++;
        }
        fprintf(f, "%-6d %-8d %-3d %-3d %-10d %d/%-18d %d/%d/%d\n", st, s->count[st][GT_PP_PART_F],
                s->count[st][GT_PP_PART_I], s->count[st][GT_PP_PART_W],
                s->count[st][GT_PP_PART_OPT], rf, rg, sf, sg, sx);
    }
    fprintf(f, "global %d nodes on every rank (gradient norm and clipping)\n", s->n_global);
    if (s->n_clock)
        fprintf(f, "clock %d nodes on every rank for every micro-batch (its index in the step)\n",
                s->n_clock);
    (void)g;
}
