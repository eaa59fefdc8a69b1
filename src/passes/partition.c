/* partition.c — forward/backward partition of a whole-step graph (gt_partition.h).
 *
 * Contract: requires a verified graph in topological order whose forward nodes read no value of a
 * backward, optimizer or recompute-copy node (gt_partition.h says which node goes where);
 * guarantees two verified graphs whose composition (fwd, then bwd fed with fwd's saved outputs)
 * computes every whole-graph output with the same nodes on the same values: exact, bitwise. The
 * whole graph is not changed.
 *
 * Each node is replayed into its part with gt_graph_copy_region over the one-node range [n, n+1),
 * through a value map from whole-graph ids to the part's ids, so node order (a valid topological
 * order in the whole graph) is kept in each part. Inputs are created first with their dims
 * imported into the part's symbol pool, so the shape rules re-derive the very same types. Both
 * parts carry the whole graph's device mesh and every value keeps its placements. */
#include <stdlib.h>
#include <string.h>

#include "graphtrain/gt_partition.h"
#include "passes/pass_internal.h"

/* Working state shared by the two builds. */
typedef struct {
    const gt_graph *whole;
    uint8_t *node_part;   /* per whole node: gt_part */
    int8_t *value_part;   /* per whole value: -1 graph input, else the producer's gt_part */
    int32_t *input_index; /* per whole value: its index in whole->inputs, or -1 */
    int32_t *saved_index; /* per whole value: its index in the saved list, or -1 */
    gt_value_id *saved;   /* whole ids of the saved values, in interface order */
    int32_t n_saved;
    uint8_t *input_used[2]; /* per whole input: read by a node or an output of part p */
    uint8_t *output_part;   /* per whole output: gt_part */
} split_state;

static const char *whole_fqn(const gt_graph *g, gt_node_id n)
{
    return gt_graph_str(g, g->nodes[n].fqn);
}

static const char *op_name(const gt_graph *g, gt_node_id n)
{
    const gt_op_info *info = gt_op_get(g->nodes[n].op);
    return info ? info->name : "?";
}

gt_part gt_partition_node_part(const gt_graph *g, const gt_node *n)
{
    /* remat gives its copies phase bwd; a forward-phase copy is told from the tagged original by
     * its origin (forward nodes have none) */
    bool copy = n->origin != GT_NONE && gt_node_has_tag(g, n, "recompute");
    return n->phase == GT_PHASE_FORWARD && !copy ? GT_PART_FWD : GT_PART_BWD;
}

/* Fills node_part, value_part, the saved list and which inputs each part reads. */
static gt_status classify(split_state *s, gt_error *err)
{
    const gt_graph *g = s->whole;
    for (gt_value_id v = 0; v < g->n_values; v++) {
        s->value_part[v] = -1;
        s->input_index[v] = -1;
        s->saved_index[v] = -1;
    }
    for (int32_t k = 0; k < g->n_inputs; k++) {
        gt_value_id v = g->inputs[k].value;
        if (v < 0 || v >= g->n_values)
            return gt_error_set(err, GT_ERR_INVALID,
                                "partition: graph input %d is %%%d, not a value", k, v);
        s->input_index[v] = k;
    }
    for (gt_node_id n = 0; n < g->n_nodes; n++) {
        const gt_node *node = &g->nodes[n];
        gt_part p = gt_partition_node_part(g, node);
        s->node_part[n] = (uint8_t)p;
        for (int k = 0; k < node->n_in; k++) {
            gt_value_id v = node->in[k];
            if (v < 0 || v >= g->n_values)
                return gt_error_set(err, GT_ERR_INVALID,
                                    "partition: node %d (%s at %s): input %d is %%%d, not a value",
                                    n, op_name(g, n), whole_fqn(g, n), k, v);
            if (s->value_part[v] == GT_PART_BWD && p == GT_PART_FWD) {
                gt_node_id prod = g->values[v].producer;
                return gt_error_set(
                    err, GT_ERR_INVALID,
                    "partition: forward node %d (%s at %s) reads %%%d of node %d "
                    "(%s at %s, %s%s); a forward node must not depend on the "
                    "backward part",
                    n, op_name(g, n), whole_fqn(g, n), v, prod, op_name(g, prod),
                    whole_fqn(g, prod), gt_phase_name((gt_phase)g->nodes[prod].phase),
                    gt_node_has_tag(g, &g->nodes[prod], "recompute") ? ", recompute" : "");
            }
            if (s->value_part[v] == -1 && s->input_index[v] < 0)
                return gt_error_set(err, GT_ERR_INVALID,
                                    "partition: node %d (%s at %s) reads %%%d, which is neither a "
                                    "graph input nor defined before it",
                                    n, op_name(g, n), whole_fqn(g, n), v);
            if (s->value_part[v] == -1)
                s->input_used[p][s->input_index[v]] = 1;
            else if (s->value_part[v] == GT_PART_FWD && p == GT_PART_BWD && s->saved_index[v] < 0)
                s->saved_index[v] = 0; /* marked; numbered below in value order */
        }
        for (int k = 0; k < node->n_out; k++)
            s->value_part[node->out[k]] = (int8_t)p;
    }
    for (gt_value_id v = 0; v < g->n_values; v++)
        if (s->saved_index[v] == 0) {
            s->saved_index[v] = s->n_saved;
            s->saved[s->n_saved++] = v;
        }
    for (int32_t k = 0; k < g->n_outputs; k++) {
        const gt_io *io = &g->outputs[k];
        if (io->value < 0 || io->value >= g->n_values)
            return gt_error_set(err, GT_ERR_INVALID,
                                "partition: graph output %d (%s %s) is %%%d, "
                                "not a value",
                                k, gt_output_kind_name((gt_output_kind)io->kind),
                                gt_graph_str(g, io->fqn), io->value);
        int vp = s->value_part[io->value];
        gt_part p;
        if (vp >= 0)
            p = (gt_part)vp;
        else
            p = io->kind == GT_OUT_LOSS || io->kind == GT_OUT_METRIC ? GT_PART_FWD : GT_PART_BWD;
        s->output_part[k] = (uint8_t)p;
        if (vp < 0) {
            if (s->input_index[io->value] < 0)
                return gt_error_set(err, GT_ERR_INVALID,
                                    "partition: graph output %d (%s) is %%%d, which no node "
                                    "produces and is not a graph input",
                                    k, gt_graph_str(g, io->fqn), io->value);
            s->input_used[p][s->input_index[io->value]] = 1;
        }
    }
    return GT_OK;
}

/* Adds an input of the part with the type and placements of whole value v (dims imported into
 * dst's pool). */
static gt_value_id add_input_like(gt_graph *dst, const gt_graph *whole, gt_input_kind kind,
                                  const char *name, gt_value_id v)
{
    const gt_type *t = gt_value_type(whole, v);
    gt_expr dims[GT_MAX_DIMS];
    for (int d = 0; d < t->ndim; d++)
        dims[d] = gt_sym_import(dst->sym, whole->sym, t->dims[d]);
    gt_value_id in = gt_graph_add_input(dst, kind, name, t->dtype, t->ndim, dims);
    if (in != GT_NONE) {
        memcpy(dst->values[in].place, whole->values[v].place, sizeof dst->values[in].place);
        if (kind != GT_IN_INPUT) gt_graph_set_input_plan(dst, in, gt_graph_input_plan(whole, v));
    }
    return in;
}

/* A part runs on the same device mesh as the whole graph (names re-interned into the part). */
static void copy_mesh(gt_graph *dst, const gt_graph *whole)
{
    dst->mesh = whole->mesh;
    for (int d = 0; d < whole->mesh.ndim && d < GT_MESH_MAX_DIMS; d++)
        dst->mesh.name[d] = gt_graph_intern(dst, gt_graph_str(whole, whole->mesh.name[d]));
}

/* Replays the nodes of part p into dst through map, then fixes origins that stay within the part
 * (copy_region drops them across graphs, since a one-node region holds no origin). */
static gt_status copy_nodes(gt_graph *dst, const split_state *s, gt_part p, gt_value_id *map,
                            gt_node_id *node_map, gt_error *err)
{
    const gt_graph *g = s->whole;
    for (gt_node_id n = 0; n < g->n_nodes; n++) {
        node_map[n] = GT_NONE;
        if (s->node_part[n] != p) continue;
        gt_node_id at = dst->n_nodes;
        GT_TRY(gt_graph_copy_region(dst, g, n, n + 1, map, err));
        node_map[n] = at;
        gt_node_id o = g->nodes[n].origin;
        dst->nodes[at].origin = o >= 0 && o < n ? node_map[o] : GT_NONE;
        for (int k = 0; k < g->nodes[n].n_out; k++) {
            gt_str name = g->values[g->nodes[n].out[k]].name;
            if (name)
                dst->values[map[g->nodes[n].out[k]]].name =
                    gt_graph_intern(dst, gt_graph_str(g, name));
        }
    }
    return GT_OK;
}

static gt_status finish_part(gt_graph *dst, const char *what, gt_error *err)
{
    if (dst->err.code != GT_OK) {
        *err = dst->err;
        return gt_error_wrap(err, "partition: building the %s graph", what);
    }
    gt_status st = gt_graph_verify(dst, err);
    if (st != GT_OK) return gt_error_wrap(err, "partition: the %s graph does not verify", what);
    return GT_OK;
}

/* Part p's share of the whole graph into dst: the whole inputs it reads (their whole-graph
 * indices appended to input_of), its nodes, then the whole outputs it computes. */
static gt_status copy_part(gt_graph *dst, const split_state *s, gt_part p, gt_partition_info *info,
                           int32_t *input_of, int32_t *n_inputs, gt_value_id *map,
                           gt_node_id *node_map, gt_error *err)
{
    const gt_graph *g = s->whole;
    for (int32_t k = 0; k < g->n_inputs; k++) {
        if (!s->input_used[p][k]) continue;
        const gt_io *io = &g->inputs[k];
        map[io->value] =
            add_input_like(dst, g, (gt_input_kind)io->kind, gt_graph_str(g, io->fqn), io->value);
        input_of[(*n_inputs)++] = k;
    }
    GT_TRY(copy_nodes(dst, s, p, map, node_map, err));
    for (int32_t k = 0; k < g->n_outputs; k++) {
        if (s->output_part[k] != p) continue;
        const gt_io *io = &g->outputs[k];
        info->output_of[k] = (gt_partition_ref){p, dst->n_outputs};
        gt_graph_add_output(dst, (gt_output_kind)io->kind, gt_graph_str(g, io->fqn),
                            map[io->value]);
    }
    return GT_OK;
}

static gt_status build_fwd(const split_state *s, gt_graph *dst, gt_partition_info *info,
                           gt_value_id *map, gt_node_id *node_map, gt_error *err)
{
    const gt_graph *g = s->whole;
    for (gt_value_id v = 0; v < g->n_values; v++)
        map[v] = GT_NONE;
    GT_TRY(copy_part(dst, s, GT_PART_FWD, info, info->fwd_input_of, &info->n_fwd_inputs, map,
                     node_map, err));
    for (int32_t k = 0; k < s->n_saved; k++) {
        gt_partition_saved *sv = &info->saved[k];
        sv->fwd_output = dst->n_outputs;
        gt_graph_add_output(dst, GT_OUT_METRIC, sv->name, map[s->saved[k]]);
    }
    return finish_part(dst, "forward", err);
}

static gt_status build_bwd(const split_state *s, gt_graph *dst, gt_partition_info *info,
                           gt_value_id *map, gt_node_id *node_map, gt_error *err)
{
    const gt_graph *g = s->whole;
    for (gt_value_id v = 0; v < g->n_values; v++)
        map[v] = GT_NONE;
    for (int32_t k = 0; k < s->n_saved; k++) {
        gt_partition_saved *sv = &info->saved[k];
        sv->bwd_input = dst->n_inputs;
        map[s->saved[k]] = add_input_like(dst, g, GT_IN_INPUT, sv->name, s->saved[k]);
        info->bwd_input_of[info->n_bwd_inputs++] = -1 - k;
    }
    GT_TRY(copy_part(dst, s, GT_PART_BWD, info, info->bwd_input_of, &info->n_bwd_inputs, map,
                     node_map, err));
    return finish_part(dst, "backward", err);
}

/* The interface entries: names, producer fqn, type text. */
static void describe_saved(const split_state *s, gt_partition_info *info)
{
    const gt_graph *g = s->whole;
    info->n_saved = s->n_saved;
    info->saved = gt_xcalloc((size_t)(s->n_saved ? s->n_saved : 1), sizeof *info->saved);
    for (int32_t k = 0; k < s->n_saved; k++) {
        gt_partition_saved *sv = &info->saved[k];
        gt_value_id v = s->saved[k];
        const gt_type *t = gt_value_type(g, v);
        snprintf(sv->name, sizeof sv->name, GT_PARTITION_SAVED_PREFIX "%d", k);
        sv->fqn = gt_xstrdup(whole_fqn(g, g->values[v].producer));
        int len = gt_graph_format_type(g, t, NULL, 0);
        sv->type = gt_xmalloc((size_t)len + 1);
        gt_graph_format_type(g, t, sv->type, (size_t)len + 1);
        sv->dtype = t->dtype;
        sv->whole_value = v;
        sv->fwd_output = sv->bwd_input = -1;
        sv->bytes = -1;
    }
}

gt_status gt_partition_fwd_bwd(const gt_graph *whole, gt_graph **fwd, gt_graph **bwd,
                               gt_partition_info *info, gt_error *err)
{
    if (!whole || !fwd || !bwd)
        return gt_error_set(err, GT_ERR_INVALID, "partition: no graph given");
    *fwd = *bwd = NULL;
    size_t nv = (size_t)(whole->n_values ? whole->n_values : 1);
    size_t nn = (size_t)(whole->n_nodes ? whole->n_nodes : 1);
    size_t ni = (size_t)(whole->n_inputs ? whole->n_inputs : 1);
    size_t no = (size_t)(whole->n_outputs ? whole->n_outputs : 1);
    split_state s = {.whole = whole};
    s.node_part = gt_xcalloc(nn, 1);
    s.value_part = gt_xcalloc(nv, 1);
    s.input_index = gt_xcalloc(nv, sizeof(int32_t));
    s.saved_index = gt_xcalloc(nv, sizeof(int32_t));
    s.saved = gt_xcalloc(nv, sizeof(gt_value_id));
    s.input_used[0] = gt_xcalloc(ni, 1);
    s.input_used[1] = gt_xcalloc(ni, 1);
    s.output_part = gt_xcalloc(no, 1);
    gt_value_id *map = gt_xcalloc(nv, sizeof *map);
    gt_node_id *node_map = gt_xcalloc(nn, sizeof *node_map);
    gt_partition_info local;
    gt_partition_info *in = info ? info : &local;
    memset(in, 0, sizeof *in);
    in->saved_bytes = -1;

    gt_graph *f = NULL, *b = NULL;
    gt_status st = classify(&s, err);
    if (st == GT_OK) {
        describe_saved(&s, in);
        in->fwd_input_of = gt_xcalloc(ni, sizeof(int32_t));
        in->bwd_input_of = gt_xcalloc(ni + (size_t)s.n_saved, sizeof(int32_t));
        in->n_whole_outputs = whole->n_outputs;
        in->output_of = gt_xcalloc(no, sizeof *in->output_of);
        f = gt_graph_new();
        b = gt_graph_new();
        copy_mesh(f, whole);
        copy_mesh(b, whole);
        st = build_fwd(&s, f, in, map, node_map, err);
    }
    if (st == GT_OK) st = build_bwd(&s, b, in, map, node_map, err);
    if (st == GT_OK) {
        in->n_fwd_nodes = f->n_nodes;
        in->n_bwd_nodes = b->n_nodes;
        *fwd = f;
        *bwd = b;
    } else {
        gt_graph_free(f);
        gt_graph_free(b);
    }
    if (st != GT_OK || !info) gt_partition_info_free(in);
    free(s.node_part);
    free(s.value_part);
    free(s.input_index);
    free(s.saved_index);
    free(s.saved);
    free(s.input_used[0]);
    free(s.input_used[1]);
    free(s.output_part);
    free(map);
    free(node_map);
    return st;
}

void gt_partition_info_free(gt_partition_info *info)
{
    if (!info) return;
    for (int32_t k = 0; k < info->n_saved; k++) {
        free(info->saved[k].fqn);
        free(info->saved[k].type);
    }
    free(info->saved);
    free(info->fwd_input_of);
    free(info->bwd_input_of);
    free(info->output_of);
    memset(info, 0, sizeof *info);
}

gt_status gt_partition_eval_bytes(gt_partition_info *info, const gt_graph *fwd,
                                  const gt_sym_binding *binding, gt_error *err)
{
    int64_t total = 0;
    for (int32_t k = 0; k < info->n_saved; k++) {
        gt_partition_saved *sv = &info->saved[k];
        if (sv->fwd_output < 0 || sv->fwd_output >= fwd->n_outputs)
            return gt_error_set(err, GT_ERR_INVALID,
                                "partition: saved value %s has no output in the forward graph",
                                sv->name);
        gt_value_id v = fwd->outputs[sv->fwd_output].value;
        int64_t shape[GT_MAX_DIMS];
        gt_status st = gt_graph_eval_shape(fwd, v, binding, shape, err);
        if (st != GT_OK) return gt_error_wrap(err, "partition: size of %s", sv->name);
        int64_t n = (int64_t)gt_dtype_size(gt_value_type(fwd, v)->dtype);
        for (int d = 0; d < gt_value_type(fwd, v)->ndim; d++)
            n *= shape[d];
        sv->bytes = n;
        total += n;
    }
    info->saved_bytes = total;
    return GT_OK;
}

void gt_partition_print(const gt_partition_info *info, FILE *f)
{
    fprintf(f, "forward/backward partition: %d forward nodes, %d backward nodes, %d saved values\n",
            info->n_fwd_nodes, info->n_bwd_nodes, info->n_saved);
    fprintf(f, "  %-10s %-32s %14s  %s\n", "name", "type", "bytes", "produced by");
    for (int32_t k = 0; k < info->n_saved; k++) {
        const gt_partition_saved *sv = &info->saved[k];
        char bytes[32];
        if (sv->bytes >= 0)
            snprintf(bytes, sizeof bytes, "%lld", (long long)sv->bytes);
        else
            snprintf(bytes, sizeof bytes, "-");
        fprintf(f, "  %-10s %-32s %14s  %s\n", sv->name, sv->type, bytes,
                sv->fqn[0] ? sv->fqn : "(no fqn)");
    }
    if (info->saved_bytes >= 0)
        fprintf(f, "  total saved: %lld bytes (%.2f MiB)\n", (long long)info->saved_bytes,
                (double)info->saved_bytes / (1024.0 * 1024.0));
}
