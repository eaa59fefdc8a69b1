/* pp_program.c — each pipeline stage's forward, input-gradient and weight-gradient parts as
 * compiled programs of their own (gt_pp_programs, gt_pipeline.h), for the runner (pp_exec.c).
 *
 * A part's program is the program the trainer's compiled CPU step runs (gt_program_build: a
 * schedule, a memory plan over two arenas, lowered instructions on the CPU kernels), built on a
 * graph of the part's nodes alone: its inputs are the values those nodes read from outside the
 * part (parameters, the micro-batch's tokens, received activations and gradients, the running
 * gradient sums, values of the stage's earlier parts); its outputs are the values anything
 * outside the part reads (a later part, the next micro-batch's W, the optimizer, a send, a graph
 * output). Before its program is built the caller's compile step may rewrite it (the trainer runs
 * its pass pipeline, every pass exact); either way every output has the bits of the part node by
 * node (tests/numerics/test_pp_exec.c). One program per part serves every micro-batch: a run
 * copies the micro-batch's inputs into the arenas and its outputs out into tensors the runner
 * holds per micro-batch in flight and frees after their last read, so a part's intermediate
 * values live in its arenas only while it runs.
 *
 * A part's step-invariant nodes (gt_pp_find_invariant: an FSDP gather of a parameter, its wait)
 * stay out of its program: the runner runs them once a step, before the program's first run, and
 * hands their outputs in as inputs, so each parameter is still gathered once a step. The part's
 * other collectives (a gradient's reduce-scatter, a TP all-reduce) run in the program on the mesh
 * dims' communicators, in the program's order, which is the same on every rank of a mesh. A part
 * stays node by node (said by gt_pp_part_info.why) when it holds a collective and no
 * communicators are given (the in-process pipeline), or a node that only the last micro-batch
 * runs (the program runs the same instructions every time). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pp_internal.h"
#include "runtime_internal.h"

int32_t *gt_pp_update_of_input(const gt_graph *g, const gt_pp_split *split)
{
    gt_value_id *u = gt_graph_buffer_updates(g);
    for (int32_t k = 0; k < g->n_inputs; k++) {
        /* an update the optimizer makes once a step (the expert biases') is no running value:
         * every micro-batch reads the buffer as the step began */
        gt_node_id p = u[k] < 0 ? GT_NONE : g->values[u[k]].producer;
        if (p != GT_NONE &&
            (split->part[p] == GT_PP_PART_OPT || split->part[p] == GT_PP_PART_GLOBAL))
            u[k] = -1;
    }
    return u;
}

void gt_pp_find_invariant(const gt_graph *g, const gt_pp_split *split,
                          const int32_t *update_of_input, uint8_t *invariant, gt_node_id *same_as)
{
    uint8_t *val = gt_xcalloc((size_t)g->n_values + 1, 1);
    gt_value_id *canon = gt_xmalloc(((size_t)g->n_values + 1) * sizeof *canon);
    for (gt_value_id v = 0; v < g->n_values; v++)
        canon[v] = v;
    for (int32_t k = 0; k < g->n_inputs; k++) {
        const gt_io *in = &g->inputs[k];
        /* a buffer fed back (a gradient sum) changes from one micro-batch to the next */
        if (in->kind == GT_IN_PARAM || (in->kind == GT_IN_BUFFER && update_of_input[k] < 0))
            val[in->value] = 1;
    }
    for (gt_node_id n = 0; n < g->n_nodes; n++) {
        const gt_node *nd = &g->nodes[n];
        same_as[n] = n;
        invariant[n] = 0;
        gt_pp_part p = split->part[n];
        bool inv = nd->n_in > 0 && p <= GT_PP_PART_W;
        for (int j = 0; inv && j < nd->n_in; j++)
            inv = val[nd->in[j]] != 0;
        if (!inv) continue;
        invariant[n] = 1;
        for (int j = 0; j < nd->n_out; j++)
            val[nd->out[j]] = 1;
        for (gt_node_id e = 0; e < n; e++) {
            const gt_node *en = &g->nodes[e];
            if (!invariant[e] || same_as[e] != e || en->op != nd->op || en->n_in != nd->n_in ||
                en->n_out != nd->n_out || split->stage[e] != split->stage[n] ||
                !gt_attrs_equal(&en->attrs, &nd->attrs))
                continue;
            bool same = true;
            for (int j = 0; same && j < nd->n_in; j++)
                same = canon[en->in[j]] == canon[nd->in[j]];
            if (!same) continue;
            same_as[n] = e;
            for (int j = 0; j < nd->n_out; j++)
                canon[nd->out[j]] = canon[en->out[j]];
            break;
        }
    }
    free(val);
    free(canon);
}

/* Why the nodes of a part (its invariant ones left out) cannot be one program (NULL: they can). */
static const char *not_compiled(const gt_graph *g, const gt_node_id *nodes, int32_t n,
                                const uint8_t *micro, bool comms)
{
    if (n == 0) return "no nodes";
    for (int32_t k = 0; k < n; k++) {
        gt_op op = g->nodes[nodes[k]].op;
        if (!comms && (gt_op_is_collective_start(op) || op == GT_OP_WAIT))
            return "a collective, no communicators";
        if (!micro[nodes[k]]) return "a node of the last micro-batch only";
    }
    return NULL;
}

/* The part's graph: an input per value read from outside, the nodes, an output per value read
 * outside (out_use[v]: v is read outside the part or leaves the step). */
static gt_status part_graph(const gt_graph *g, gt_pp_part_program *pp, const uint8_t *inset,
                            const uint8_t *out_use, gt_error *err)
{
    gt_graph *d = gt_graph_new();
    pp->g = d;
    gt_value_id *map = gt_xmalloc(((size_t)g->n_values + 1) * sizeof *map);
    for (gt_value_id v = 0; v < g->n_values; v++)
        map[v] = GT_NONE;
    pp->in = gt_xcalloc((size_t)g->n_values + 1, sizeof *pp->in);
    pp->out = gt_xcalloc((size_t)g->n_values + 1, sizeof *pp->out);
    pp->bound = gt_xcalloc((size_t)g->n_values + 1, sizeof *pp->bound);
    for (int32_t k = 0; k < pp->n_nodes; k++) {
        const gt_node *nd = &g->nodes[pp->nodes[k]];
        for (int j = 0; j < nd->n_in; j++) {
            gt_value_id v = nd->in[j];
            gt_node_id p = g->values[v].producer;
            if ((p != GT_NONE && inset[p]) || map[v] != GT_NONE) continue;
            const gt_type *ty = gt_value_type(g, v);
            gt_expr dims[GT_MAX_DIMS];
            for (int a = 0; a < ty->ndim; a++)
                dims[a] = gt_sym_import(d->sym, g->sym, ty->dims[a]);
            char name[32];
            snprintf(name, sizeof name, "pp.in.%d", v);
            /* a parameter or model buffer keeps its kind, so the plan keeps its bytes between
             * runs (the persistent arena): the runner copies it in once a step (pp_exec.c) */
            gt_input_kind kind = GT_IN_INPUT;
            for (int32_t i = 0; p == GT_NONE && i < g->n_inputs; i++)
                if (g->inputs[i].value == v &&
                    (g->inputs[i].kind == GT_IN_PARAM || g->inputs[i].kind == GT_IN_BUFFER))
                    kind = (gt_input_kind)g->inputs[i].kind;
            map[v] = gt_graph_add_input(d, kind, name, ty->dtype, ty->ndim, dims);
            pp->in[pp->n_in++] = v;
        }
    }
    gt_status st = d->err.code != GT_OK ? gt_error_set(err, d->err.code, "%s", d->err.msg) : GT_OK;
    if (st == GT_OK) st = gt_graph_copy_nodes(d, g, pp->nodes, pp->n_nodes, map, NULL, err);
    for (int32_t k = 0; st == GT_OK && k < pp->n_nodes; k++) {
        const gt_node *nd = &g->nodes[pp->nodes[k]];
        for (int j = 0; j < nd->n_out; j++) {
            gt_value_id v = nd->out[j];
            if (!out_use[v]) continue;
            char name[32];
            snprintf(name, sizeof name, "pp.out.%d", v);
            gt_graph_add_output(d, GT_OUT_METRIC, name, map[v]);
            pp->out[pp->n_out++] = v;
        }
    }
    free(map);
    if (st == GT_OK) st = gt_graph_verify(d, err);
    return st;
}

/* The part's graph as an artifact gave it (compile on one rank) in place of the one just built
 * from the step graph, which it must match: inputs and outputs by name, in order (its nodes are
 * what the passes made of the part's). */
static gt_status adopt(gt_pp_part_program *pp, gt_graph *loaded, int32_t st, gt_pp_part p,
                       gt_error *err)
{
    const gt_graph *d = pp->g;
    if (!gt_graph_same_io(loaded, d))
        return gt_error_set(err, GT_ERR_INVALID,
                            "pipeline: the artifact of stage %d part %s has %d inputs and %d "
                            "outputs; this step graph's part %d and %d (or other names or kinds)",
                            st, gt_pp_part_name(p), loaded->n_inputs, loaded->n_outputs,
                            d->n_inputs, d->n_outputs);
    gt_graph_free(pp->g);
    pp->g = loaded;
    return GT_OK;
}

/* Stage st's part p: its nodes, and its program unless it must run node by node. */
static gt_status build_part(const gt_graph *g, const gt_sym_binding *binding,
                            const gt_pp_split *split, const uint8_t *micro, const uint8_t *crossing,
                            const uint8_t *invariant, const gt_pp_programs_opts *o, int32_t st,
                            gt_pp_part p, gt_pp_part_program *pp, gt_pp_part_info *info,
                            gt_error *err)
{
    uint8_t *inset = gt_xcalloc((size_t)g->n_nodes + 1, 1);
    pp->nodes = gt_xcalloc((size_t)g->n_nodes + 1, sizeof *pp->nodes);
    for (gt_node_id n = 0; n < g->n_nodes; n++) {
        if (split->stage[n] != st || split->part[n] != (uint8_t)p) continue;
        info->n_nodes++;
        if (invariant[n]) {
            info->n_invariant++;
            continue;
        }
        inset[n] = 1;
        pp->nodes[pp->n_nodes++] = n;
    }
    info->why =
        not_compiled(g, pp->nodes, pp->n_nodes, micro, o->dim_comms != NULL || o->graphs_only);
    gt_status s = GT_OK;
    if (!info->why) {
        uint8_t *out_use = gt_xcalloc((size_t)g->n_values + 1, 1);
        for (gt_node_id n = 0; n < g->n_nodes; n++)
            for (int j = 0; !inset[n] && j < g->nodes[n].n_in; j++)
                out_use[g->nodes[n].in[j]] = 1;
        for (int32_t k = 0; k < g->n_outputs; k++)
            out_use[g->outputs[k].value] = 1;
        for (gt_value_id v = 0; v < g->n_values; v++)
            out_use[v] |= crossing[v];
        s = part_graph(g, pp, inset, out_use, err);
        for (int32_t k = 0; k < pp->n_nodes && s == GT_OK; k++) {
            const gt_node *nd = &g->nodes[pp->nodes[k]];
            for (int j = 0; j < nd->n_out && s == GT_OK; j++) {
                int64_t shape[GT_MAX_DIMS];
                const gt_type *ty = gt_value_type(g, nd->out[j]);
                if (out_use[nd->out[j]]) continue;
                s = gt_graph_eval_shape(g, nd->out[j], binding, shape, err);
                if (s == GT_OK)
                    pp->internal_bytes +=
                        gt_shape_numel(ty->ndim, shape) * (int64_t)gt_dtype_size(ty->dtype);
            }
        }
        gt_graph **loaded = o->loaded ? &o->loaded[st * 3 + p] : NULL;
        if (s == GT_OK && loaded && *loaded) {
            s = adopt(pp, *loaded, st, p, err);
            if (s == GT_OK) *loaded = NULL; /* taken */
            info->loaded = s == GT_OK;
        } else if (s == GT_OK && o->compile) {
            s = o->compile(pp->g, o->compile_user, err);
        }
        /* the collectives the program starts: of the part as it runs (a pass may bucket them) */
        pp->n_coll = pp->n_gathers = 0;
        for (gt_node_id n = 0; s == GT_OK && n < pp->g->n_nodes; n++) {
            gt_op op = pp->g->nodes[n].op;
            if (!gt_op_is_collective_start(op)) continue;
            pp->n_coll++;
            pp->n_gathers += gt_runtime_coll_kind(op) == GT_COLL_ALL_GATHER;
        }
        if (s == GT_OK) info->n_program_nodes = pp->g->n_nodes;
        if (s == GT_OK && !o->graphs_only) s = gt_program_build(pp->g, binding, &pp->prog, err);
        if (s == GT_OK && pp->prog && o->dim_comms)
            s = gt_program_set_comms(pp->prog, o->dim_comms, err);
        free(out_use);
        if (s != GT_OK)
            gt_error_wrap(err, "pipeline: the program of stage %d's part %s", st,
                          gt_pp_part_name(p));
    }
    if (s == GT_OK && pp->prog) {
        const gt_program *q = pp->prog;
        info->compiled = true;
        info->n_in = pp->n_in;
        info->n_out = pp->n_out;
        info->n_collectives = pp->n_coll;
        info->live_peak_bytes = (int64_t)q->plan->live_peak_bytes;
        for (int a = 0; a < GT_ARENA_COUNT; a++) {
            info->planned_bytes += (int64_t)q->plan->arena_bytes[a];
            info->allocated_bytes += (int64_t)q->allocated_bytes[a];
        }
    }
    free(inset);
    return s;
}

gt_status gt_pp_programs_build(const gt_graph *g, const gt_sym_binding *binding,
                               const gt_pp_split *split, const gt_pp_schedule *s, int32_t rank,
                               const gt_pp_programs_opts *o, gt_pp_programs **out, gt_error *err)
{
    *out = NULL;
    if (split->n_nodes != g->n_nodes || split->n_stages != s->n_stages)
        return gt_error_set(err, GT_ERR_INVALID,
                            "pipeline programs: the split (%d nodes, %d stages) is not of this "
                            "graph and schedule (%d nodes, %d stages)",
                            split->n_nodes, split->n_stages, g->n_nodes, s->n_stages);
    gt_pp_programs *ps = gt_xcalloc(1, sizeof *ps);
    ps->n_stages = split->n_stages;
    ps->part = gt_xcalloc((size_t)ps->n_stages, sizeof *ps->part);
    ps->info = gt_xcalloc((size_t)ps->n_stages, sizeof *ps->info);
    uint8_t *micro = gt_xcalloc((size_t)g->n_nodes + 1, 1);
    gt_graph_micro_part(g, micro);
    uint8_t *crossing = gt_xcalloc((size_t)g->n_values + 1, 1);
    for (int32_t k = 0; k < split->n_cross; k++)
        crossing[split->cross[k].value] = 1;
    int32_t *update = gt_pp_update_of_input(g, split);
    uint8_t *invariant = gt_xcalloc((size_t)g->n_nodes + 1, 1);
    gt_node_id *same_as = gt_xcalloc((size_t)g->n_nodes + 1, sizeof *same_as);
    gt_pp_find_invariant(g, split, update, invariant, same_as);
    gt_status st = GT_OK;
    for (int32_t i = 0; i < ps->n_stages && st == GT_OK; i++) {
        bool mine = rank < 0 || s->stage_rank[i] == rank;
        for (int p = GT_PP_PART_F; p <= GT_PP_PART_W && st == GT_OK; p++) {
            gt_pp_part_info *info = &ps->info[i][p];
            info->why = "another rank's stage";
            if (mine)
                st = build_part(g, binding, split, micro, crossing, invariant, o, i, (gt_pp_part)p,
                                &ps->part[i][p], info, err);
        }
    }
    free(micro);
    free(crossing);
    free(update);
    free(invariant);
    free(same_as);
    if (st != GT_OK) {
        gt_pp_programs_free(ps);
        return st;
    }
    *out = ps;
    return GT_OK;
}

const gt_pp_part_info *gt_pp_programs_info(const gt_pp_programs *ps, int32_t stage, gt_pp_part part)
{
    if (!ps || stage < 0 || stage >= ps->n_stages || part > GT_PP_PART_W) return NULL;
    return &ps->info[stage][part];
}

const gt_graph *gt_pp_programs_graph(const gt_pp_programs *ps, int32_t stage, gt_pp_part part)
{
    if (!ps || stage < 0 || stage >= ps->n_stages || part > GT_PP_PART_W) return NULL;
    return ps->part[stage][part].g;
}

void gt_pp_programs_free(gt_pp_programs *ps)
{
    if (!ps) return;
    for (int32_t i = 0; i < ps->n_stages; i++)
        for (int p = 0; p < 3; p++) {
            gt_pp_part_program *pp = &ps->part[i][p];
            gt_program_free(pp->prog);
            gt_graph_free(pp->g);
            free(pp->nodes);
            free(pp->in);
            free(pp->bound);
            free(pp->out);
        }
    free(ps->part);
    free(ps->info);
    free(ps);
}
