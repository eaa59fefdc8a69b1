/* graph.c — the graph container: values, nodes, graph inputs/outputs, the string table, node
 * appends with shape inference, deep copy, use counts.
 *
 * Every array grows by doubling, so appends are amortised O(1); strings are interned through an
 * open-addressing hash index, so building a 10k-node graph stays linear. */
#include <stdlib.h>
#include <string.h>

#include "ir/ir_internal.h"

/* Grows *arr (element size elem) so that it holds at least need elements. */
static void gt_grow(void **arr, int32_t *cap, int32_t need, size_t elem)
{
    if (need <= *cap) return;
    int64_t c = *cap ? *cap : 16;
    while (c < need)
        c *= 2;
    GT_CHECK(c <= INT32_MAX);
    *arr = gt_xrealloc(*arr, (size_t)c * elem);
    *cap = (int32_t)c;
}

/* ---------------------------------------------------------------- strings */

static uint32_t gt_str_slot(const char *s, int32_t cap)
{
    return (uint32_t)(gt_hash_str(s) & (uint64_t)(cap - 1));
}

/* Rebuilds the hash index at capacity cap (a power of two). */
static void gt_str_reindex(gt_graph *g, int32_t cap)
{
    free(g->str_index);
    g->str_index = gt_xmalloc((size_t)cap * sizeof *g->str_index);
    for (int32_t k = 0; k < cap; k++)
        g->str_index[k] = -1;
    g->str_index_cap = cap;
    for (int32_t id = 0; id < g->n_strs; id++) {
        uint32_t h = gt_str_slot(g->str_data + g->str_offsets[id], cap);
        while (g->str_index[h] >= 0)
            h = (h + 1) & (uint32_t)(cap - 1);
        g->str_index[h] = id;
    }
}

gt_str gt_graph_intern(gt_graph *g, const char *s)
{
    if (!s) s = "";
    uint32_t mask = (uint32_t)(g->str_index_cap - 1);
    uint32_t h = gt_str_slot(s, g->str_index_cap);
    for (; g->str_index[h] >= 0; h = (h + 1) & mask) {
        int32_t id = g->str_index[h];
        if (strcmp(g->str_data + g->str_offsets[id], s) == 0) return id;
    }
    size_t n = strlen(s) + 1;
    GT_CHECK(n < (size_t)INT32_MAX - (size_t)g->str_len);
    gt_grow((void **)&g->str_data, &g->str_cap, g->str_len + (int32_t)n, 1);
    memcpy(g->str_data + g->str_len, s, n);
    gt_grow((void **)&g->str_offsets, &g->cap_strs, g->n_strs + 1, sizeof *g->str_offsets);
    int32_t id = g->n_strs++;
    g->str_offsets[id] = g->str_len;
    g->str_len += (int32_t)n;
    g->str_index[h] = id;
    /* Keep the load factor under 1/2 so probes stay short. */
    if (2 * g->n_strs > g->str_index_cap) gt_str_reindex(g, 2 * g->str_index_cap);
    return id;
}

bool gt_graph_str_valid(const gt_graph *g, gt_str s)
{
    return s >= 0 && s < g->n_strs;
}

const char *gt_graph_str(const gt_graph *g, gt_str s)
{
    GT_CHECK(gt_graph_str_valid(g, s));
    return g->str_data + g->str_offsets[s];
}

/* ---------------------------------------------------------------- lifetime */

gt_graph *gt_graph_new(void)
{
    gt_graph *g = gt_xcalloc(1, sizeof *g);
    g->sym = gt_sym_pool_new();
    GT_CHECK(g->sym);
    g->cur_phase = GT_PHASE_FORWARD;
    g->cur_origin = GT_NONE;
    g->cur_unit = GT_UNIT_REST;
    g->str_index = NULL;
    gt_str_reindex(g, 64);
    gt_str empty = gt_graph_intern(g, "");
    GT_CHECK(empty == 0);
    return g;
}

void gt_graph_free(gt_graph *g)
{
    if (!g) return;
    free(g->nodes);
    free(g->values);
    free(g->inputs);
    free(g->outputs);
    gt_sym_pool_free(g->sym);
    free(g->str_data);
    free(g->str_offsets);
    free(g->str_index);
    free(g);
}

static void *gt_dup_array(const void *src, int32_t n, int32_t *cap, size_t elem)
{
    /* Copies keep room to grow, but only as much as they hold. */
    *cap = n;
    void *dst = gt_xmalloc((size_t)(n ? n : 1) * elem);
    if (n) memcpy(dst, src, (size_t)n * elem);
    return dst;
}

gt_graph *gt_graph_copy(const gt_graph *g)
{
    gt_graph *c = gt_xmalloc(sizeof *c);
    *c = *g;
    c->nodes = gt_dup_array(g->nodes, g->n_nodes, &c->cap_nodes, sizeof *g->nodes);
    c->values = gt_dup_array(g->values, g->n_values, &c->cap_values, sizeof *g->values);
    c->inputs = gt_dup_array(g->inputs, g->n_inputs, &c->cap_inputs, sizeof *g->inputs);
    c->outputs = gt_dup_array(g->outputs, g->n_outputs, &c->cap_outputs, sizeof *g->outputs);
    c->str_data = gt_dup_array(g->str_data, g->str_len, &c->str_cap, 1);
    c->str_offsets = gt_dup_array(g->str_offsets, g->n_strs, &c->cap_strs, sizeof *g->str_offsets);
    int32_t icap;
    c->str_index = gt_dup_array(g->str_index, g->str_index_cap, &icap, sizeof *g->str_index);
    c->sym = gt_sym_pool_copy(g->sym);
    GT_CHECK(c->sym);
    return c;
}

/* ---------------------------------------------------------------- errors and labels */

void gt_graph_record_error(gt_graph *g, const gt_error *err)
{
    if (g->err.code != GT_OK || err->code == GT_OK) return;
    g->err = *err;
}

void gt_node_label(const gt_graph *g, const gt_node *n, char *buf, size_t len)
{
    const gt_op_info *info = gt_op_get(n->op);
    const char *name = info ? info->name : "unknown-op";
    const char *fqn = gt_graph_str_valid(g, n->fqn) ? gt_graph_str(g, n->fqn) : "";
    if (fqn[0])
        snprintf(buf, len, "%s at %s", name, fqn);
    else
        snprintf(buf, len, "%s", name);
}

/* ---------------------------------------------------------------- graph inputs and outputs */

static gt_value_id gt_new_value(gt_graph *g, const gt_type *t, gt_node_id producer, int32_t slot)
{
    gt_grow((void **)&g->values, &g->cap_values, g->n_values + 1, sizeof *g->values);
    gt_value_id v = g->n_values++;
    gt_value *val = &g->values[v];
    memset(val, 0, sizeof *val);
    val->type = *t;
    for (int k = t->ndim; k < GT_MAX_DIMS; k++)
        val->type.dims[k] = 0;
    val->producer = producer;
    val->producer_slot = slot;
    val->name = 0;
    return v;
}

gt_value_id gt_graph_add_input(gt_graph *g, gt_input_kind kind, const char *fqn, gt_dtype dt,
                               int ndim, const gt_expr *dims)
{
    gt_error e = {0};
    const char *name = fqn ? fqn : "";
    if ((int)kind < 0 || kind > GT_IN_INPUT)
        gt_error_set(&e, GT_ERR_INVALID, "graph input '%s': unknown kind %d", name, (int)kind);
    else if ((int)dt < 0 || dt >= GT_DTYPE_COUNT)
        gt_error_set(&e, GT_ERR_INVALID, "graph input '%s': unknown dtype %d", name, (int)dt);
    else if (ndim < 0 || ndim > GT_MAX_DIMS)
        gt_error_set(&e, GT_ERR_INVALID, "graph input '%s': rank %d outside [0, %d]", name, ndim,
                     GT_MAX_DIMS);
    else if (ndim > 0 && !dims)
        gt_error_set(&e, GT_ERR_INVALID, "graph input '%s': rank %d but no dims", name, ndim);
    for (int k = 0; e.code == GT_OK && k < ndim; k++) {
        int64_t c;
        if (dims[k] == GT_EXPR_INVALID)
            gt_error_set(&e, GT_ERR_SHAPE, "graph input '%s': dim %d is an invalid expression",
                         name, k);
        else if (gt_sym_is_const(g->sym, dims[k], &c) && c < 0)
            gt_error_set(&e, GT_ERR_SHAPE, "graph input '%s': dim %d is negative (%lld)", name, k,
                         (long long)c);
    }
    if (e.code != GT_OK) {
        gt_graph_record_error(g, &e);
        return GT_NONE;
    }
    gt_type t = {.dtype = dt, .ndim = ndim};
    for (int k = 0; k < ndim; k++)
        t.dims[k] = dims[k];
    gt_value_id v = gt_new_value(g, &t, GT_NONE, 0);
    g->values[v].name = gt_graph_intern(g, name);
    gt_grow((void **)&g->inputs, &g->cap_inputs, g->n_inputs + 1, sizeof *g->inputs);
    g->inputs[g->n_inputs++] = (gt_io){
        .value = v,
        .kind = (int)kind,
        .fqn = g->values[v].name,
        .plan = {.as_param = kind == GT_IN_PARAM, .unit = GT_UNIT_REST},
    };
    return v;
}

void gt_graph_add_output(gt_graph *g, gt_output_kind kind, const char *fqn, gt_value_id v)
{
    gt_error e = {0};
    const char *name = fqn ? fqn : "";
    if (v == GT_NONE) {
        /* The producer failed and recorded why; only say something if nothing was recorded. */
        gt_error_set(&e, GT_ERR_INVALID, "graph output '%s': value is GT_NONE", name);
        gt_graph_record_error(g, &e);
        return;
    }
    if ((int)kind < 0 || kind > GT_OUT_OPT_STATE_UPDATE)
        gt_error_set(&e, GT_ERR_INVALID, "graph output '%s': unknown kind %d", name, (int)kind);
    else if (v < 0 || v >= g->n_values)
        gt_error_set(&e, GT_ERR_INVALID, "graph output '%s': value %%%d out of range [0, %d)", name,
                     v, g->n_values);
    if (e.code != GT_OK) {
        gt_graph_record_error(g, &e);
        return;
    }
    gt_str s = gt_graph_intern(g, name);
    gt_grow((void **)&g->outputs, &g->cap_outputs, g->n_outputs + 1, sizeof *g->outputs);
    g->outputs[g->n_outputs++] = (gt_io){.value = v, .kind = (int)kind, .fqn = s};
}

/* ---------------------------------------------------------------- nodes */

gt_status gt_graph_append_node(gt_graph *g, gt_node *p, gt_error *err)
{
    const gt_op_info *info = gt_op_get(p->op);
    if (!info) return gt_error_set(err, GT_ERR_INVALID, "unknown op id %d", (int)p->op);
    char label[256];
    gt_node_label(g, p, label, sizeof label);
    if (!gt_graph_str_valid(g, p->fqn))
        return gt_error_set(err, GT_ERR_INVALID, "%s: fqn string id %d out of range", label,
                            p->fqn);
    if (info->n_in >= 0 && p->n_in != info->n_in)
        return gt_error_set(err, GT_ERR_INVALID, "%s: takes %d inputs, got %d", label, info->n_in,
                            p->n_in);
    if (info->n_in < 0 && (p->n_in < 1 || p->n_in > GT_MAX_IN))
        return gt_error_set(err, GT_ERR_INVALID, "%s: takes 1..%d inputs, got %d", label, GT_MAX_IN,
                            p->n_in);
    for (int k = 0; k < p->n_in; k++) {
        if (p->in[k] < 0 || p->in[k] >= g->n_values)
            return gt_error_set(err, GT_ERR_INVALID, "%s: input %d is %%%d, not a value (have %d)",
                                label, k, p->in[k], g->n_values);
    }
    if (p->phase > GT_PHASE_OPTIMIZER)
        return gt_error_set(err, GT_ERR_INVALID, "%s: unknown phase %d", label, p->phase);
    if (p->origin != GT_NONE && (p->origin < 0 || p->origin >= g->n_nodes))
        return gt_error_set(err, GT_ERR_INVALID, "%s: origin node %d out of range [0, %d)", label,
                            p->origin, g->n_nodes);
    if (p->n_tags > GT_MAX_TAGS)
        return gt_error_set(err, GT_ERR_INVALID, "%s: %d tags, at most %d", label, p->n_tags,
                            GT_MAX_TAGS);
    for (int k = 0; k < p->n_tags; k++) {
        if (!gt_graph_str_valid(g, p->tags[k]))
            return gt_error_set(err, GT_ERR_INVALID, "%s: tag string id %d out of range", label,
                                p->tags[k]);
    }
    for (int k = p->n_tags; k < GT_MAX_TAGS; k++)
        p->tags[k] = 0;
    for (int k = p->n_in; k < GT_MAX_IN; k++)
        p->in[k] = GT_NONE;
    GT_TRY(gt_attrs_fit(p->op, &p->attrs, true, label, err));

    gt_type types[GT_MAX_OUT];
    memset(types, 0, sizeof types);
    int n_out = 0;
    GT_TRY(info->shape(g, p, types, &n_out, err));
    GT_CHECK(n_out >= 1 && n_out <= GT_MAX_OUT);
    for (int k = 0; k < n_out; k++) {
        GT_CHECK(types[k].ndim >= 0 && types[k].ndim <= GT_MAX_DIMS);
        GT_CHECK((int)types[k].dtype >= 0 && types[k].dtype < GT_DTYPE_COUNT);
        for (int d = 0; d < types[k].ndim; d++)
            GT_CHECK(types[k].dims[d] != GT_EXPR_INVALID);
    }

    gt_grow((void **)&g->nodes, &g->cap_nodes, g->n_nodes + 1, sizeof *g->nodes);
    gt_node_id id = g->n_nodes;
    p->n_out = (uint8_t)n_out;
    for (int k = 0; k < GT_MAX_OUT; k++)
        p->out[k] = k < n_out ? gt_new_value(g, &types[k], id, k) : GT_NONE;
    g->nodes[g->n_nodes++] = *p;
    return GT_OK;
}

gt_value_id gt_graph_add_node(gt_graph *g, gt_op op, const gt_value_id *in, int n_in,
                              const gt_attrs *attrs, gt_value_id *outs)
{
    int expect_out = gt_op_n_out(op, attrs);
    if (outs)
        for (int k = 0; k < expect_out; k++)
            outs[k] = GT_NONE;
    gt_node p;
    memset(&p, 0, sizeof p);
    p.op = op;
    p.fqn = g->cur_fqn;
    p.phase = (uint8_t)g->cur_phase;
    p.origin = g->cur_origin;
    p.unit = g->cur_unit;
    if (attrs) p.attrs = *attrs;
    gt_error e = {0};
    char label[256];
    gt_node_label(g, &p, label, sizeof label);
    if (n_in < 0 || n_in > GT_MAX_IN || (n_in > 0 && !in)) {
        gt_error_set(&e, GT_ERR_INVALID,
                     "%s: %d inputs given (a node takes at most %d) or no input array", label, n_in,
                     GT_MAX_IN);
        gt_graph_record_error(g, &e);
        return GT_NONE;
    }
    for (int k = 0; k < n_in; k++) {
        if (in[k] == GT_NONE) {
            /* An earlier failure produced this GT_NONE and recorded why; stay quiet then. */
            gt_error_set(&e, GT_ERR_INVALID, "%s: input %d is GT_NONE", label, k);
            gt_graph_record_error(g, &e);
            return GT_NONE;
        }
        p.in[k] = in[k];
    }
    p.n_in = (uint8_t)n_in;
    if ((int)g->cur_phase < 0 || g->cur_phase > GT_PHASE_OPTIMIZER) p.phase = 0xff;
    if (gt_graph_append_node(g, &p, &e) != GT_OK) {
        gt_graph_record_error(g, &e);
        return GT_NONE;
    }
    if (outs)
        for (int k = 0; k < p.n_out; k++)
            outs[k] = p.out[k];
    return p.out[0];
}

void gt_graph_set_fqn(gt_graph *g, const char *fqn)
{
    g->cur_fqn = (fqn && fqn[0]) ? gt_graph_intern(g, fqn) : 0;
}

gt_builder_state gt_graph_builder_save(const gt_graph *g)
{
    return (gt_builder_state){g->cur_fqn, g->cur_phase, g->cur_origin, g->cur_unit};
}

void gt_graph_builder_restore(gt_graph *g, gt_builder_state s)
{
    g->cur_fqn = s.fqn;
    g->cur_phase = s.phase;
    g->cur_origin = s.origin;
    g->cur_unit = s.unit;
}

void gt_graph_node_label(const gt_graph *g, gt_node_id n, char *buf, size_t len)
{
    const gt_node *nd = &g->nodes[n];
    const char *fqn = gt_graph_str(g, nd->fqn);
    if (fqn && fqn[0])
        snprintf(buf, len, "node %%%d %s at %s", n, gt_op_get(nd->op)->name, fqn);
    else
        snprintf(buf, len, "node %%%d %s", n, gt_op_get(nd->op)->name);
}

void gt_graph_set_unit(gt_graph *g, int32_t unit)
{
    g->cur_unit = unit;
}

void gt_graph_set_input_plan(gt_graph *g, gt_value_id v, gt_param_plan plan)
{
    for (int32_t k = 0; k < g->n_inputs; k++)
        if (g->inputs[k].value == v) g->inputs[k].plan = plan;
}

gt_param_plan gt_graph_input_plan(const gt_graph *g, gt_value_id v)
{
    for (int32_t k = 0; k < g->n_inputs; k++)
        if (g->inputs[k].value == v) return g->inputs[k].plan;
    return (gt_param_plan){.unit = GT_UNIT_REST};
}

void gt_graph_add_tag(gt_graph *g, gt_node_id n, const char *tag)
{
    gt_error e = {0};
    if (n < 0 || n >= g->n_nodes) {
        gt_error_set(&e, GT_ERR_INVALID, "tag '%s': node %d out of range [0, %d)", tag ? tag : "",
                     n, g->n_nodes);
        gt_graph_record_error(g, &e);
        return;
    }
    if (!tag || !tag[0] || gt_node_has_tag(g, &g->nodes[n], tag)) return;
    gt_node *node = &g->nodes[n];
    if (node->n_tags >= GT_MAX_TAGS) {
        char label[256];
        gt_node_label(g, node, label, sizeof label);
        gt_error_set(&e, GT_ERR_INVALID, "node %d (%s): cannot add tag '%s', it has %d already", n,
                     label, tag, GT_MAX_TAGS);
        gt_graph_record_error(g, &e);
        return;
    }
    gt_str s = gt_graph_intern(g, tag);
    node = &g->nodes[n];
    node->tags[node->n_tags++] = s;
}

bool gt_attrs_equal(const gt_attrs *a, const gt_attrs *b)
{
    return a->ni == b->ni && a->nf == b->nf && a->ne == b->ne &&
           memcmp(a->i, b->i, (size_t)a->ni * sizeof a->i[0]) == 0 &&
           memcmp(a->f, b->f, (size_t)a->nf * sizeof a->f[0]) == 0 &&
           memcmp(a->e, b->e, (size_t)a->ne * sizeof a->e[0]) == 0;
}

bool gt_node_has_tag(const gt_graph *g, const gt_node *n, const char *tag)
{
    if (!tag) return false;
    for (int k = 0; k < n->n_tags && k < GT_MAX_TAGS; k++) {
        if (gt_graph_str_valid(g, n->tags[k]) && strcmp(gt_graph_str(g, n->tags[k]), tag) == 0)
            return true;
    }
    return false;
}

/* ---------------------------------------------------------------- queries */

gt_status gt_graph_eval_shape(const gt_graph *g, gt_value_id v, const gt_sym_binding *b,
                              int64_t *shape, gt_error *err)
{
    if (v < 0 || v >= g->n_values)
        return gt_error_set(err, GT_ERR_INVALID, "eval shape: value %%%d out of range [0, %d)", v,
                            g->n_values);
    const gt_type *t = &g->values[v].type;
    for (int k = 0; k < t->ndim; k++) {
        gt_status st = gt_sym_eval(g->sym, t->dims[k], b, &shape[k], err);
        if (st != GT_OK) return gt_error_wrap(err, "value %%%d dim %d", v, k);
        if (shape[k] < 0)
            return gt_error_set(err, GT_ERR_SHAPE, "value %%%d dim %d evaluates to %lld < 0", v, k,
                                (long long)shape[k]);
    }
    return GT_OK;
}

int32_t *gt_graph_use_counts(const gt_graph *g)
{
    int32_t *counts = gt_xcalloc((size_t)(g->n_values ? g->n_values : 1), sizeof *counts);
    for (gt_node_id n = 0; n < g->n_nodes; n++) {
        const gt_node *node = &g->nodes[n];
        /* A node that reads a value twice (mul(x, x)) is one user: count distinct values. */
        for (int k = 0; k < node->n_in; k++) {
            gt_value_id v = node->in[k];
            bool seen = false;
            for (int j = 0; j < k; j++)
                seen = seen || node->in[j] == v;
            if (!seen && v >= 0 && v < g->n_values) counts[v]++;
        }
    }
    for (int32_t k = 0; k < g->n_outputs; k++) {
        gt_value_id v = g->outputs[k].value;
        if (v >= 0 && v < g->n_values) counts[v]++;
    }
    return counts;
}

gt_value_id *gt_graph_buffer_updates(const gt_graph *g)
{
    gt_value_id *u = gt_xmalloc(((size_t)g->n_inputs + 1) * sizeof *u);
    for (int32_t k = 0; k < g->n_inputs; k++) {
        u[k] = GT_NONE;
        if (g->inputs[k].kind != GT_IN_BUFFER) continue;
        const char *name = gt_graph_str(g, g->inputs[k].fqn);
        for (int32_t j = 0; j < g->n_outputs; j++)
            if (g->outputs[j].kind == GT_OUT_BUFFER_UPDATE &&
                !strcmp(gt_graph_str(g, g->outputs[j].fqn), name))
                u[k] = g->outputs[j].value;
    }
    return u;
}

bool gt_graph_micro_output(int kind)
{
    return kind == GT_OUT_LOSS || kind == GT_OUT_BUFFER_UPDATE;
}

int32_t gt_graph_micro_part(const gt_graph *g, uint8_t *part)
{
    uint8_t *needed = gt_xcalloc((size_t)g->n_values + 1, 1);
    for (int32_t k = 0; k < g->n_outputs; k++)
        if (gt_graph_micro_output(g->outputs[k].kind)) needed[g->outputs[k].value] = 1;
    int32_t count = 0;
    for (gt_node_id n = g->n_nodes - 1; n >= 0; n--) { /* node order is topological */
        const gt_node *nd = &g->nodes[n];
        part[n] = 0;
        for (int j = 0; j < nd->n_out && !part[n]; j++)
            part[n] = needed[nd->out[j]];
        if (!part[n]) continue;
        count++;
        for (int j = 0; j < nd->n_in; j++)
            if (nd->in[j] >= 0) needed[nd->in[j]] = 1;
    }
    free(needed);
    return count;
}
