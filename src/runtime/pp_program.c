/* pp_program.c — each pipeline stage's forward, input-gradient and weight-gradient parts as
 * compiled programs of their own (gt_pp_programs, gt_pipeline.h), for the runner (pp_exec.c).
 *
 * A part's program is the program the trainer's compiled CPU step runs (gt_program_build: a
 * schedule, a memory plan over two arenas, lowered instructions on the CPU kernels), built on a
 * graph of the part's nodes alone: its inputs are the values those nodes read from outside the
 * part (parameters, the micro-batch's tokens, received activations and gradients, the running
 * gradient sums, values of the stage's earlier parts); its outputs are the values anything
 * outside the part reads (a later part, the next micro-batch's W, the optimizer, a send, a graph
 * output). No pass rewrites it, so every kernel runs on the same inputs as node by node: the same
 * bits (tests/numerics/test_pp_exec.c). One program per part serves every micro-batch: a run
 * copies the micro-batch's inputs into the arenas and its outputs out into tensors the runner
 * holds per micro-batch in flight and frees after their last read, so a part's intermediate
 * values live in its arenas only while it runs.
 *
 * A part stays node by node (said by gt_pp_part_info.why) when it holds a collective (the
 * runner's invariant reuse gathers each FSDP parameter once a step, which a program run per
 * micro-batch would repeat) or a node that only the last micro-batch runs (the program runs
 * the same instructions every time). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pp_internal.h"

/* Why the nodes of a part cannot be one program (NULL: they can). */
static const char *not_compiled(const gt_graph *g, const gt_node_id *nodes, int32_t n,
                                const uint8_t *micro)
{
    if (n == 0) return "no nodes";
    for (int32_t k = 0; k < n; k++) {
        gt_op op = g->nodes[nodes[k]].op;
        if (gt_op_is_collective_start(op) || op == GT_OP_WAIT) return "a collective";
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
            map[v] = gt_graph_add_input(d, GT_IN_INPUT, name, ty->dtype, ty->ndim, dims);
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

/* Stage st's part p: its nodes, and its program unless it must run node by node. */
static gt_status build_part(const gt_graph *g, const gt_sym_binding *binding,
                            const gt_pp_split *split, const uint8_t *micro, const uint8_t *crossing,
                            int32_t st, gt_pp_part p, gt_pp_part_program *pp, gt_pp_part_info *info,
                            gt_error *err)
{
    uint8_t *inset = gt_xcalloc((size_t)g->n_nodes + 1, 1);
    pp->nodes = gt_xcalloc((size_t)g->n_nodes + 1, sizeof *pp->nodes);
    for (gt_node_id n = 0; n < g->n_nodes; n++)
        if (split->stage[n] == st && split->part[n] == (uint8_t)p) {
            inset[n] = 1;
            pp->nodes[pp->n_nodes++] = n;
        }
    info->n_nodes = pp->n_nodes;
    info->why = not_compiled(g, pp->nodes, pp->n_nodes, micro);
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
        if (s == GT_OK) s = gt_program_build(pp->g, binding, &pp->prog, err);
        free(out_use);
        if (s != GT_OK)
            gt_error_wrap(err, "pipeline: the program of stage %d's %s part", st,
                          p == GT_PP_PART_F   ? "forward"
                          : p == GT_PP_PART_I ? "input-gradient"
                                              : "weight-gradient");
    }
    if (s == GT_OK && pp->prog) {
        const gt_program *q = pp->prog;
        info->compiled = true;
        info->n_in = pp->n_in;
        info->n_out = pp->n_out;
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
                               gt_pp_programs **out, gt_error *err)
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
    gt_status st = GT_OK;
    for (int32_t i = 0; i < ps->n_stages && st == GT_OK; i++) {
        bool mine = rank < 0 || s->stage_rank[i] == rank;
        for (int p = GT_PP_PART_F; p <= GT_PP_PART_W && st == GT_OK; p++) {
            gt_pp_part_info *info = &ps->info[i][p];
            info->why = "another rank's stage";
            if (mine)
                st = build_part(g, binding, split, micro, crossing, i, (gt_pp_part)p,
                                &ps->part[i][p], info, err);
        }
    }
    free(micro);
    free(crossing);
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
            free(pp->out);
        }
    free(ps->part);
    free(ps->info);
    free(ps);
}
