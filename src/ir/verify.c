/* verify.c — the IR verifier: everything a pass could break, checked in one linear walk.
 *
 *   values   producer/slot consistency: value v with producer p is p's output slot; a value without
 *            producer is a graph input, listed exactly once;
 *   nodes    known op, arity, attribute counts fit the schema, metadata ids in range; SSA in order:
 *            every input is defined (a graph input or an output of an earlier node) and every
 *            output is produced exactly once;
 *   shapes   each shape rule re-run on the stored inputs gives the stored output types;
 *   io       graph input/output ids and kinds in range.
 *
 * The first problem found is reported, naming the node index, op and fqn. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir_internal.h"

typedef struct {
    const gt_graph *g;
    gt_error *err;
    uint8_t *defined; /* per value: 0 = not yet, 1 = defined */
} gt_verifier;

static gt_status node_fail(gt_verifier *vf, gt_node_id id, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static gt_status node_fail(gt_verifier *vf, gt_node_id id, const char *fmt, ...)
{
    char label[256], msg[512];
    gt_node_label(vf->g, &vf->g->nodes[id], label, sizeof label);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return gt_error_set(vf->err, GT_ERR_INVALID, "verify: node %d (%s): %s", id, label, msg);
}

static gt_status check_values(gt_verifier *vf)
{
    const gt_graph *g = vf->g;
    for (gt_value_id v = 0; v < g->n_values; v++) {
        const gt_value *val = &g->values[v];
        if (val->type.ndim < 0 || val->type.ndim > GT_MAX_DIMS || (int)val->type.dtype < 0 ||
            val->type.dtype >= GT_DTYPE_COUNT)
            return gt_error_set(vf->err, GT_ERR_INVALID, "verify: value %%%d has a bad type", v);
        if (!gt_graph_str_valid(g, val->name))
            return gt_error_set(vf->err, GT_ERR_INVALID, "verify: value %%%d name id out of range",
                                v);
        if (val->producer == GT_NONE) continue;
        gt_node_id p = val->producer;
        if (p < 0 || p >= g->n_nodes)
            return gt_error_set(vf->err, GT_ERR_INVALID,
                                "verify: value %%%d: producer node %d out of range [0, %d)", v, p,
                                g->n_nodes);
        const gt_node *n = &g->nodes[p];
        if (val->producer_slot < 0 || val->producer_slot >= n->n_out ||
            val->producer_slot >= GT_MAX_OUT || n->out[val->producer_slot] != v)
            return gt_error_set(vf->err, GT_ERR_INVALID,
                                "verify: value %%%d claims to be output %d of node %d, which "
                                "does not list it",
                                v, val->producer_slot, p);
    }
    return GT_OK;
}

static gt_status check_graph_inputs(gt_verifier *vf)
{
    const gt_graph *g = vf->g;
    for (int32_t k = 0; k < g->n_inputs; k++) {
        const gt_io *io = &g->inputs[k];
        if (io->value < 0 || io->value >= g->n_values)
            return gt_error_set(vf->err, GT_ERR_INVALID,
                                "verify: graph input %d: value %%%d out of range [0, %d)", k,
                                io->value, g->n_values);
        if (io->kind < 0 || io->kind > GT_IN_INPUT || !gt_graph_str_valid(g, io->fqn))
            return gt_error_set(vf->err, GT_ERR_INVALID,
                                "verify: graph input %d (%%%d): bad kind %d or name id %d", k,
                                io->value, io->kind, io->fqn);
        if (g->values[io->value].producer != GT_NONE)
            return gt_error_set(vf->err, GT_ERR_INVALID,
                                "verify: graph input %d (%%%d, %s) is also produced by node %d", k,
                                io->value, gt_graph_str(g, io->fqn), g->values[io->value].producer);
        if (vf->defined[io->value])
            return gt_error_set(vf->err, GT_ERR_INVALID,
                                "verify: value %%%d is listed twice as a graph input", io->value);
        vf->defined[io->value] = 1;
    }
    for (gt_value_id v = 0; v < g->n_values; v++) {
        if (g->values[v].producer == GT_NONE && !vf->defined[v])
            return gt_error_set(vf->err, GT_ERR_INVALID,
                                "verify: value %%%d has no producer and is not a graph input", v);
    }
    return GT_OK;
}

static gt_status check_node(gt_verifier *vf, gt_node_id id)
{
    const gt_graph *g = vf->g;
    const gt_node *n = &g->nodes[id];
    const gt_op_info *info = gt_op_get(n->op);
    if (!info) return node_fail(vf, id, "unknown op id %d", (int)n->op);
    bool arity_ok = info->n_in >= 0 ? n->n_in == info->n_in : n->n_in >= 1 && n->n_in <= GT_MAX_IN;
    if (!arity_ok && info->n_in >= 0)
        return node_fail(vf, id, "has %d inputs, the op takes %d", n->n_in, info->n_in);
    if (!arity_ok)
        return node_fail(vf, id, "has %d inputs, the op takes 1..%d", n->n_in, GT_MAX_IN);
    if (n->n_out < 1 || n->n_out > GT_MAX_OUT)
        return node_fail(vf, id, "has %d outputs, outside [1, %d]", n->n_out, GT_MAX_OUT);
    if (!gt_graph_str_valid(g, n->fqn) || n->n_tags > GT_MAX_TAGS)
        return node_fail(vf, id, "bad fqn id %d or tag count %d", n->fqn, n->n_tags);
    for (int k = 0; k < n->n_tags; k++)
        if (!gt_graph_str_valid(g, n->tags[k]))
            return node_fail(vf, id, "tag %d has bad string id %d", k, n->tags[k]);
    if (n->phase > GT_PHASE_OPTIMIZER) return node_fail(vf, id, "unknown phase %d", n->phase);
    if (n->origin != GT_NONE && (n->origin < 0 || n->origin >= g->n_nodes))
        return node_fail(vf, id, "origin node %d out of range [0, %d)", n->origin, g->n_nodes);
    for (int k = 0; k < n->n_in; k++) {
        gt_value_id v = n->in[k];
        if (v < 0 || v >= g->n_values)
            return node_fail(vf, id, "input %d is %%%d, not a value", k, v);
        if (!vf->defined[v])
            return node_fail(vf, id, "input %d (%%%d) is used before it is defined", k, v);
    }
    char label[256];
    gt_node_label(g, n, label, sizeof label);
    gt_attrs attrs = n->attrs;
    gt_status st = gt_attrs_fit(n->op, &attrs, false, label, vf->err);
    if (st != GT_OK) return gt_error_wrap(vf->err, "verify: node %d", id);

    /* Shape rules intern the expressions they build (end - start, products) in the pool; that
     * adds entries but changes no existing one, so the graph is unchanged as far as anyone can
     * observe. Hence the cast. */
    gt_type types[GT_MAX_OUT];
    memset(types, 0, sizeof types);
    int n_out = 0;
    st = info->shape((gt_graph *)g, n, types, &n_out, vf->err);
    if (st != GT_OK) return gt_error_wrap(vf->err, "verify: node %d", id);
    if (n_out != n->n_out)
        return node_fail(vf, id, "stores %d outputs, its shape rule gives %d", n->n_out, n_out);
    for (int k = 0; k < n->n_out; k++) {
        gt_value_id v = n->out[k];
        if (v < 0 || v >= g->n_values)
            return node_fail(vf, id, "output %d is %%%d, not a value", k, v);
        if (vf->defined[v])
            return node_fail(vf, id, "output %d (%%%d) is defined a second time", k, v);
        if (g->values[v].producer != id || g->values[v].producer_slot != k)
            return node_fail(vf, id, "output %d (%%%d) names another producer", k, v);
        if (!gt_type_equal(&g->values[v].type, &types[k])) {
            char have[160], want[160];
            gt_type_str(g, &g->values[v].type, have, sizeof have);
            gt_type_str(g, &types[k], want, sizeof want);
            return gt_error_set(vf->err, GT_ERR_INVALID,
                                "verify: node %d (%s): output %d (%%%d) is stored as %s, its shape "
                                "rule gives %s",
                                id, label, k, v, have, want);
        }
        vf->defined[v] = 1;
    }
    return GT_OK;
}

static gt_status check_graph_outputs(gt_verifier *vf)
{
    const gt_graph *g = vf->g;
    for (int32_t k = 0; k < g->n_outputs; k++) {
        const gt_io *io = &g->outputs[k];
        if (io->value < 0 || io->value >= g->n_values)
            return gt_error_set(vf->err, GT_ERR_INVALID,
                                "verify: graph output %d: value %%%d out of range [0, %d)", k,
                                io->value, g->n_values);
        if (io->kind < 0 || io->kind > GT_OUT_OPT_STATE_UPDATE || !gt_graph_str_valid(g, io->fqn))
            return gt_error_set(vf->err, GT_ERR_INVALID,
                                "verify: graph output %d (%%%d): bad kind %d or name id %d", k,
                                io->value, io->kind, io->fqn);
        if (!vf->defined[io->value])
            return gt_error_set(vf->err, GT_ERR_INVALID,
                                "verify: graph output %d (%s) reads %%%d, which nothing defines", k,
                                gt_graph_str(g, io->fqn), io->value);
    }
    return GT_OK;
}

bool gt_graph_same_io(const gt_graph *a, const gt_graph *b)
{
    if (a->n_inputs != b->n_inputs || a->n_outputs != b->n_outputs) return false;
    for (int32_t k = 0; k < a->n_inputs; k++)
        if (a->inputs[k].kind != b->inputs[k].kind ||
            strcmp(gt_graph_str(a, a->inputs[k].fqn), gt_graph_str(b, b->inputs[k].fqn)))
            return false;
    for (int32_t k = 0; k < a->n_outputs; k++)
        if (a->outputs[k].kind != b->outputs[k].kind ||
            strcmp(gt_graph_str(a, a->outputs[k].fqn), gt_graph_str(b, b->outputs[k].fqn)))
            return false;
    return true;
}

gt_status gt_graph_verify(const gt_graph *g, gt_error *err)
{
    if (g->n_strs < 1 || g->n_values < 0 || g->n_nodes < 0)
        return gt_error_set(err, GT_ERR_INVALID, "verify: graph has a broken header");
    gt_verifier vf = {.g = g, .err = err};
    vf.defined = gt_xcalloc((size_t)(g->n_values ? g->n_values : 1), 1);
    gt_status st = check_values(&vf);
    if (st == GT_OK) st = check_graph_inputs(&vf);
    for (gt_node_id id = 0; st == GT_OK && id < g->n_nodes; id++)
        st = check_node(&vf, id);
    if (st == GT_OK) st = check_graph_outputs(&vf);
    free(vf.defined);
    return st;
}
