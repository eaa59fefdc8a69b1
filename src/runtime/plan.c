/* plan.c — memory plan: concrete sizes, buffer sharing, liveness and offsets (gt_program.h).
 *
 * Steps, each over the schedule:
 *   1. sizes: every value's shape under the binding; nbytes = numel * dtype size.
 *   2. own liveness: first = producer position (-1 for a graph input), last = last reading
 *      position (n for a graph output, so its bytes survive until they are copied out; a value
 *      nobody reads lives at its producer only — the kernel still writes it).
 *   3. sharing, in schedule order, as each op's alias column in gt_ops.def allows (VIEW, VIEW_RUN,
 *      RESULT, IN_PLACE, STATE, PACK; the conditions are checked here): a reshape output joins
 *      its input's buffer (a view), as does a
 *      slice of one contiguous run of its input (a view at the run's byte offset, when that is a
 *      multiple of GT_PLAN_ALIGN), and so
 *      does a wait's output its start's output (the collective's result; see below); an adamw
 *      output joins its input's buffer (in place) when the input's buffer group has no reader
 *      after this node, is read by no other slot of the node, has the output's size and arena;
 *      so does an add's or fused_elementwise's output that is persistent state (gradient
 *      accumulation's running sum) over a persistent input of its dtype.
 *      And the other way round, a concat's inputs are computed in place inside its output when
 *      they are runs of it (every dim before the concat dim has size 1, as FSDP's bucket packing):
 *      input j's whole buffer group moves into the output's at input j's byte offset, when that
 *      is a multiple of GT_PLAN_ALIGN, the group was computed by the step (not a graph input,
 *      nor persistent, nor a collective's buffer), the concat is its last reader, and the input
 *      is the group's whole buffer. The concat then copies only the inputs not already in place;
 *      the output's buffer lives from its first input's producer on.
 *      A group's last use is the max over its members; since a member is only created by a node
 *      that reads another member, "group last == this position" at the time the node is visited
 *      means no member is read later.
 *   4. arenas: a group is persistent when any member is a PARAM/BUFFER/OPT_STATE input or a
 *      *_UPDATE output; persistent groups live for the whole step [-1, n].
 *   5. offsets: greedy by size per arena (see gt_program.h), 64-byte aligned.
 *   6. report: bytes live at each position (difference array over group intervals); the peak.
 *
 * Collectives (start/wait pairs, gt_ops.def): between its start and its wait a collective reads
 * the start's input and writes the start's output asynchronously, so neither buffer may be handed
 * to any node scheduled in between. Both follow from the liveness above without a special case:
 * the start's output is live from the start's position (its producer) and is read by the wait
 * (input 0); the start's input is read by the wait too (input 1), so it lives until the wait at
 * least; and the wait's output joins the start output's buffer, extending it to the last reader
 * of the result. Collectives never run in place (their alias column in gt_ops.def is NONE, the
 * wait's RESULT aside): MPI forbids an input that aliases the output. */
#include <stdlib.h>
#include <string.h>

#include "graphtrain/gt_program.h"
#include "runtime_internal.h"

const char *gt_mem_category_name(gt_mem_category c)
{
    static const char *const names[GT_MEM_COUNT] = {"params",      "grads",       "optimizer state",
                                                    "activations", "temporaries", "inputs"};
    return (unsigned)c < GT_MEM_COUNT ? names[c] : "?";
}

static size_t align_up(size_t x)
{
    return (x + GT_PLAN_ALIGN - 1) / GT_PLAN_ALIGN * GT_PLAN_ALIGN;
}

static gt_value_id find_root(const gt_value_plan *vp, gt_value_id v)
{
    while (vp[v].root != v)
        v = vp[v].root;
    return v;
}

/* Per-value role flags from the graph's io descriptors. */
enum {
    ROLE_PERSISTENT = 1 << 0,
    ROLE_PARAM = 1 << 1,
    ROLE_OPT_STATE = 1 << 2,
    ROLE_GRAD = 1 << 3,
    ROLE_INPUT = 1 << 4,
    ROLE_OUTPUT = 1 << 5,
};

static uint8_t *value_roles(const gt_graph *g)
{
    uint8_t *r = gt_xcalloc((size_t)g->n_values + 1, 1);
    for (int32_t k = 0; k < g->n_inputs; k++) {
        const gt_io *io = &g->inputs[k];
        uint8_t f = ROLE_INPUT;
        if (io->kind == GT_IN_PARAM || io->kind == GT_IN_BUFFER)
            f = ROLE_PERSISTENT | ROLE_PARAM;
        else if (io->kind == GT_IN_OPT_STATE)
            f = ROLE_PERSISTENT | ROLE_OPT_STATE;
        r[io->value] |= f;
    }
    for (int32_t k = 0; k < g->n_outputs; k++) {
        const gt_io *io = &g->outputs[k];
        uint8_t f = ROLE_OUTPUT;
        if (io->kind == GT_OUT_PARAM_UPDATE || io->kind == GT_OUT_BUFFER_UPDATE)
            f |= ROLE_PERSISTENT | ROLE_PARAM;
        else if (io->kind == GT_OUT_OPT_STATE_UPDATE)
            f |= ROLE_PERSISTENT | ROLE_OPT_STATE;
        else if (io->kind == GT_OUT_GRAD)
            f |= ROLE_GRAD;
        r[io->value] |= f;
    }
    return r;
}

/* A slice whose elements are one contiguous run of its input's (every dim before the sliced one
 * has size 1) is a view at byte offset *at, when that offset keeps the plan's alignment. */
static bool slice_view_offset(const gt_plan *p, const gt_sym_binding *binding, const gt_node *nd,
                              size_t *at)
{
    const gt_graph *g = p->g;
    const gt_value_plan *x = &p->values[nd->in[0]];
    int ndim = gt_value_type(g, nd->in[0])->ndim;
    int dim = (int)nd->attrs.i[0];
    if (dim < 0) dim += ndim;
    if (dim < 0 || dim >= ndim) return false;
    int64_t inner = 1;
    for (int d = 0; d < ndim; d++) {
        if (d < dim && x->shape[d] != 1) return false;
        if (d > dim) inner *= x->shape[d];
    }
    int64_t start;
    gt_error err = {0};
    if (gt_sym_eval(g->sym, nd->attrs.e[0], binding, &start, &err) != GT_OK) return false;
    size_t off = (size_t)(start * inner) * gt_dtype_size(gt_value_type(g, nd->in[0])->dtype);
    if (off % GT_PLAN_ALIGN) return false;
    *at = off;
    return true;
}

/* Buffer groups as lists, to move a whole group: next[v] is the member after v (-1 at the end),
 * tail[r] the last member of root r's group. */
typedef struct {
    gt_value_id *next, *tail;
} group_lists;

static void group_add(group_lists *gl, gt_value_id r, gt_value_id v)
{
    gl->next[gl->tail[r]] = v;
    gl->tail[r] = v;
}

/* Moves concat node nd's inputs into its output's buffer where they qualify (see the header). */
static void concat_in_place(gt_plan *p, const gt_node *nd, int32_t pos, const uint8_t *roles,
                            int32_t *group_last, group_lists *gl)
{
    const gt_graph *g = p->g;
    gt_value_plan *vp = p->values;
    gt_value_id out = nd->out[0];
    int ndim = gt_value_type(g, out)->ndim;
    int dim = (int)nd->attrs.i[0];
    if (dim < 0) dim += ndim;
    if (dim < 0 || dim >= ndim || (roles[out] & ROLE_PERSISTENT) || vp[out].root != out) return;
    for (int d = 0; d < dim; d++)
        if (vp[out].shape[d] != 1) return;
    size_t at = 0;
    for (int j = 0; j < nd->n_in; at += vp[nd->in[j]].nbytes, j++) {
        gt_value_id in = nd->in[j], r = find_root(vp, in);
        bool ok = r != out && vp[r].first >= 0 && group_last[r] == pos && at % GT_PLAN_ALIGN == 0 &&
                  vp[in].view_offset == 0 && vp[in].nbytes == vp[r].nbytes && vp[in].nbytes > 0;
        gt_node_id maker = g->values[r].producer;
        ok = ok && maker >= 0 && !(gt_op_get(g->nodes[maker].op)->flags & GT_OPF_COLLECTIVE);
        for (gt_value_id m = r; ok && m >= 0; m = gl->next[m])
            if (roles[m] & (ROLE_PERSISTENT | ROLE_INPUT)) ok = false;
        if (!ok) continue;
        for (gt_value_id m = r; m >= 0; m = gl->next[m])
            vp[m].view_offset += at;
        vp[r].root = out;
        vp[r].shared = 3;
        gl->next[gl->tail[out]] = r;
        gl->tail[out] = gl->tail[r];
        if (vp[r].first < vp[out].first) vp[out].first = vp[r].first;
        p->n_concat_in_place++;
    }
}

/* Step 3: views and in place. group_last[r] = max last over the members of root r so far. */
static void share_buffers(gt_plan *p, const gt_sym_binding *binding, const uint8_t *roles,
                          const gt_plan_options *opts, int32_t *group_last)
{
    const gt_graph *g = p->g;
    gt_value_plan *vp = p->values;
    group_lists gl = {gt_xmalloc(((size_t)g->n_values + 1) * sizeof *gl.next),
                      gt_xmalloc(((size_t)g->n_values + 1) * sizeof *gl.tail)};
    for (gt_value_id v = 0; v < g->n_values; v++)
        gl.next[v] = -1, gl.tail[v] = v;
    for (int32_t pos = 0; pos < p->n_order; pos++) {
        const gt_node *nd = &g->nodes[p->order[pos]];
        /* Which output may share which input's buffer, and when: gt_ops.def's alias column. */
        gt_alias_kind alias = gt_op_get(nd->op)->alias;
        if (alias == GT_ALIAS_NONE) continue;
        if (alias == GT_ALIAS_PACK) {
            if (!opts->no_views) concat_in_place(p, nd, pos, roles, group_last, &gl);
            continue;
        }
        int pairs[GT_MAX_IN * GT_MAX_OUT][2];
        int np = gt_op_alias_pairs(nd, pairs);
        /* A wait hands over the bytes its start's collective wrote: always the start's buffer,
         * whatever the options, since the executor writes it there. */
        size_t at = 0;
        if (alias == GT_ALIAS_RESULT || (alias == GT_ALIAS_VIEW && !opts->no_views) ||
            (alias == GT_ALIAS_VIEW_RUN && !opts->no_views &&
             slice_view_offset(p, binding, nd, &at))) {
            gt_value_id out = nd->out[pairs[0][0]], in = nd->in[pairs[0][1]];
            gt_value_id r = find_root(vp, in);
            vp[out].root = r;
            vp[out].shared = 1;
            vp[out].view_offset = vp[in].view_offset + at;
            if (vp[out].last > group_last[r]) group_last[r] = vp[out].last;
            group_add(&gl, r, out);
            p->n_views++;
            continue;
        }
        if (opts->no_in_place || (alias != GT_ALIAS_IN_PLACE && alias != GT_ALIAS_STATE)) continue;
        bool state_only = alias == GT_ALIAS_STATE;
        for (int k = 0; k < np; k++) {
            gt_value_id out = nd->out[pairs[k][0]], in = nd->in[pairs[k][1]];
            gt_value_id r = find_root(vp, in);
            if (vp[out].root != out) continue; /* placed by an earlier pair */
            bool ok = group_last[r] == pos && vp[out].nbytes == vp[r].nbytes &&
                      !(roles[out] & ROLE_PERSISTENT) == !(roles[r] & ROLE_PERSISTENT);
            if (state_only)
                ok = ok && (roles[out] & ROLE_PERSISTENT) &&
                     gt_value_type(g, out)->dtype == gt_value_type(g, in)->dtype;
            for (int j = 0; ok && j < nd->n_in; j++)
                if (j != pairs[k][1] && find_root(vp, nd->in[j]) == r) ok = false;
            if (!ok) continue;
            vp[out].root = r;
            vp[out].shared = 2;
            vp[out].view_offset = vp[in].view_offset;
            group_last[r] = vp[out].last;
            group_add(&gl, r, out);
            p->n_in_place++;
        }
    }
    free(gl.next);
    free(gl.tail);
}

static int cmp_interval(const void *a, const void *b)
{
    const gt_plan_interval *x = a, *y = b;
    if (x->size != y->size) return x->size > y->size ? -1 : 1;
    if (x->first != y->first) return x->first < y->first ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

typedef struct {
    int64_t begin, end;
} span;

static int cmp_span(const void *a, const void *b)
{
    const span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

int64_t gt_plan_place_intervals(gt_plan_interval *items, int32_t n, int64_t *offsets)
{
    qsort(items, (size_t)n, sizeof *items, cmp_interval);
    span *busy = gt_xmalloc(((size_t)n + 1) * sizeof *busy);
    int64_t *placed_off = gt_xmalloc(((size_t)n + 1) * sizeof *placed_off);
    int64_t top = 0;
    for (int32_t k = 0; k < n; k++) {
        const gt_plan_interval *it = &items[k];
        int32_t nb = 0;
        for (int32_t j = 0; j < k; j++) {
            const gt_plan_interval *o = &items[j];
            if (o->size && o->first <= it->last && it->first <= o->last)
                busy[nb++] = (span){placed_off[j], placed_off[j] + o->size};
        }
        qsort(busy, (size_t)nb, sizeof *busy, cmp_span);
        int64_t off = 0;
        if (it->size)
            for (int32_t j = 0; j < nb; j++) {
                if (busy[j].begin >= off + it->size) break;
                if (busy[j].end > off) off = busy[j].end;
            }
        placed_off[k] = off;
        offsets[it->id] = off;
        if (off + it->size > top) top = off + it->size;
    }
    free(busy);
    free(placed_off);
    return top;
}

/* Category of a buffer group (root r): by the strongest role of any member, else activation when
 * the group's last reader is outside the forward phase while its producer is in it. */
static gt_mem_category group_category(const gt_plan *p, const uint8_t *group_roles, gt_value_id r,
                                      int32_t last)
{
    uint8_t f = group_roles[r];
    if (f & ROLE_PARAM) return GT_MEM_PARAM;
    if (f & ROLE_OPT_STATE) return GT_MEM_OPT_STATE;
    if (f & ROLE_GRAD) return GT_MEM_GRAD;
    if (f & ROLE_INPUT) return GT_MEM_INPUT;
    const gt_graph *g = p->g;
    int32_t first = p->values[r].first;
    if (first >= 0 && last < p->n_order && g->nodes[p->order[first]].phase == GT_PHASE_FORWARD &&
        g->nodes[p->order[last]].phase != GT_PHASE_FORWARD)
        return GT_MEM_ACTIVATION;
    return GT_MEM_TEMPORARY;
}

static void compute_peak(gt_plan *p)
{
    int32_t n = p->n_order;
    /* live[k + 1] = bytes live at position k, k in [-1, n] */
    int64_t *diff = gt_xcalloc((size_t)n + 3, sizeof *diff);
    for (gt_value_id v = 0; v < p->n_values; v++) {
        const gt_value_plan *vp = &p->values[v];
        if (vp->root != v || vp->arena != GT_ARENA_STEP) continue;
        diff[vp->first + 1] += (int64_t)vp->nbytes;
        diff[vp->last + 2] -= (int64_t)vp->nbytes;
    }
    int64_t cur = 0, best = -1;
    for (int32_t k = -1; k <= n; k++) {
        cur += diff[k + 1];
        if (cur > best) best = cur, p->peak_pos = k;
    }
    p->live_peak_bytes = (size_t)best;
    free(diff);
    for (gt_value_id v = 0; v < p->n_values; v++) {
        const gt_value_plan *vp = &p->values[v];
        if (vp->root == v && vp->first <= p->peak_pos && p->peak_pos <= vp->last)
            p->peak_by_category[vp->category] += vp->nbytes;
    }
}

gt_status gt_plan_memory(const gt_graph *g, const gt_sym_binding *binding, const gt_node_id *order,
                         int32_t n_order, const gt_plan_options *opts, gt_plan **out, gt_error *err)
{
    *out = NULL;
    GT_TRY(gt_schedule_check(g, order, n_order, err));
    gt_plan_options none = {0};
    if (!opts) opts = &none;
    gt_plan *p = gt_xcalloc(1, sizeof *p);
    p->g = g;
    p->n_order = n_order;
    p->order = gt_xmalloc(((size_t)n_order + 1) * sizeof *p->order);
    if (n_order) memcpy(p->order, order, (size_t)n_order * sizeof *order);
    p->n_values = g->n_values;
    p->values = gt_xcalloc((size_t)g->n_values + 1, sizeof *p->values);
    gt_value_plan *vp = p->values;

    /* 1-2. sizes and own liveness (unreached values: first = last = -2, no buffer) */
    for (gt_value_id v = 0; v < g->n_values; v++)
        vp[v].root = v, vp[v].first = vp[v].last = -2;
    for (int32_t k = 0; k < g->n_inputs; k++)
        vp[g->inputs[k].value].first = vp[g->inputs[k].value].last = -1;
    for (int32_t pos = 0; pos < n_order; pos++) {
        const gt_node *nd = &g->nodes[order[pos]];
        for (int j = 0; j < nd->n_in; j++)
            vp[nd->in[j]].last = pos;
        for (int j = 0; j < nd->n_out; j++)
            vp[nd->out[j]].first = vp[nd->out[j]].last = pos;
    }
    for (int32_t k = 0; k < g->n_outputs; k++) {
        gt_value_id v = g->outputs[k].value;
        if (v < 0 || v >= g->n_values || vp[v].first == -2) {
            gt_plan_free(p);
            return gt_error_set(err, GT_ERR_INVALID,
                                "plan: graph output %d (%s %s) names value %%%d, which nothing "
                                "defines",
                                k, gt_output_kind_name((gt_output_kind)g->outputs[k].kind),
                                gt_graph_str(g, g->outputs[k].fqn), v);
        }
        vp[v].last = n_order;
    }
    for (gt_value_id v = 0; v < g->n_values; v++) {
        if (vp[v].first == -2) continue;
        const gt_type *ty = gt_value_type(g, v);
        gt_status st = gt_graph_eval_shape(g, v, binding, vp[v].shape, err);
        if (st != GT_OK) {
            gt_plan_free(p);
            return gt_error_wrap(err, "plan: value %%%d", v);
        }
        int64_t numel = gt_shape_numel(ty->ndim, vp[v].shape);
        if (numel < 0 || (uint64_t)numel > (SIZE_MAX >> 8) / gt_dtype_size(ty->dtype)) {
            gt_plan_free(p);
            return gt_error_set(err, GT_ERR_INVALID, "plan: value %%%d has %lld elements", v,
                                (long long)numel);
        }
        vp[v].nbytes = (size_t)numel * gt_dtype_size(ty->dtype);
    }

    /* 3. sharing */
    uint8_t *roles = value_roles(g);
    int32_t *group_last = gt_xmalloc(((size_t)g->n_values + 1) * sizeof *group_last);
    for (gt_value_id v = 0; v < g->n_values; v++)
        group_last[v] = vp[v].last;
    share_buffers(p, binding, roles, opts, group_last);

    /* 4. group roles, intervals and arenas, on the roots */
    uint8_t *group_roles = gt_xcalloc((size_t)g->n_values + 1, 1);
    for (gt_value_id v = 0; v < g->n_values; v++) {
        gt_value_id r = find_root(vp, v);
        vp[v].root = r; /* path compression: every member names its root directly */
        group_roles[r] |= roles[v];
    }
    for (gt_value_id v = 0; v < g->n_values; v++) {
        if (vp[v].root != v || vp[v].first == -2) continue;
        vp[v].category = (uint8_t)group_category(p, group_roles, v, group_last[v]);
        vp[v].arena = (group_roles[v] & ROLE_PERSISTENT) ? GT_ARENA_PERSISTENT : GT_ARENA_STEP;
        vp[v].last = group_last[v];
        if (vp[v].arena == GT_ARENA_PERSISTENT) vp[v].first = -1, vp[v].last = n_order;
    }

    /* 5. offsets per arena */
    gt_plan_interval *items = gt_xmalloc(((size_t)g->n_values + 1) * sizeof *items);
    int64_t *offsets = gt_xcalloc((size_t)g->n_values + 1, sizeof *offsets);
    for (int a = 0; a < GT_ARENA_COUNT; a++) {
        int32_t n = 0;
        for (gt_value_id v = 0; v < g->n_values; v++)
            if (vp[v].root == v && vp[v].first != -2 && vp[v].arena == a) {
                items[n++] = (gt_plan_interval){(int64_t)align_up(vp[v].nbytes), vp[v].first,
                                                vp[v].last, v};
                p->total_value_bytes[a] += align_up(vp[v].nbytes);
            }
        p->arena_bytes[a] = (size_t)gt_plan_place_intervals(items, n, offsets);
    }
    for (gt_value_id v = 0; v < g->n_values; v++) {
        gt_value_id r = vp[v].root;
        vp[v].offset = (size_t)offsets[r] + vp[v].view_offset;
        if (r != v) {
            vp[v].arena = vp[r].arena;
            vp[v].category = vp[r].category;
        }
    }
    free(items);
    free(offsets);
    free(group_roles);
    free(group_last);
    free(roles);

    /* 6. report figures */
    compute_peak(p);
    *out = p;
    return GT_OK;
}

void gt_plan_free(gt_plan *p)
{
    if (!p) return;
    free(p->order);
    free(p->values);
    free(p);
}

/* fqn of the value: of its producer node, else of the graph input. */
static const char *value_fqn(const gt_graph *g, gt_value_id v)
{
    gt_node_id n = g->values[v].producer;
    if (n >= 0) return gt_graph_str(g, g->nodes[n].fqn);
    for (int32_t k = 0; k < g->n_inputs; k++)
        if (g->inputs[k].value == v) return gt_graph_str(g, g->inputs[k].fqn);
    return "";
}

typedef struct {
    gt_value_id v;
    size_t nbytes;
} sized_value;

static int cmp_sized_desc(const void *a, const void *b)
{
    const sized_value *x = a, *y = b;
    if (x->nbytes != y->nbytes) return x->nbytes > y->nbytes ? -1 : 1;
    return x->v < y->v ? -1 : x->v > y->v;
}

void gt_plan_print(const gt_plan *p, FILE *f)
{
    const gt_graph *g = p->g;
    const double mib = 1024.0 * 1024.0;
    fprintf(f,
            "memory plan: %d nodes, %d values (%d views, %d in place, %d concat inputs computed "
            "in place)\n",
            p->n_order, p->n_values, p->n_views, p->n_in_place, p->n_concat_in_place);
    static const char *const arena_names[GT_ARENA_COUNT] = {"persistent", "step"};
    for (int a = 0; a < GT_ARENA_COUNT; a++)
        fprintf(f, "  %-10s arena %14zu bytes (%10.2f MiB); sum of its buffers %14zu bytes\n",
                arena_names[a], p->arena_bytes[a], p->arena_bytes[a] / mib,
                p->total_value_bytes[a]);
    fprintf(f, "  step arena live peak %zu bytes (%.2f MiB) at position %d", p->live_peak_bytes,
            p->live_peak_bytes / mib, p->peak_pos);
    if (p->peak_pos >= 0 && p->peak_pos < p->n_order) {
        const gt_node *nd = &g->nodes[p->order[p->peak_pos]];
        fprintf(f, " (node %%%d %s %s %s)", p->order[p->peak_pos], gt_op_get(nd->op)->name,
                gt_graph_str(g, nd->fqn), gt_phase_name((gt_phase)nd->phase));
    }
    fprintf(f, "\n  live at the peak, both arenas, by category:\n");
    for (int c = 0; c < GT_MEM_COUNT; c++)
        fprintf(f, "    %-16s %14zu bytes (%10.2f MiB)\n", gt_mem_category_name((gt_mem_category)c),
                p->peak_by_category[c], p->peak_by_category[c] / mib);
    sized_value *live = gt_xmalloc(((size_t)p->n_values + 1) * sizeof *live);
    int32_t n = 0;
    for (gt_value_id v = 0; v < p->n_values; v++) {
        const gt_value_plan *vp = &p->values[v];
        if (vp->root == v && vp->first != -2 && vp->first <= p->peak_pos && p->peak_pos <= vp->last)
            live[n++] = (sized_value){v, vp->nbytes};
    }
    qsort(live, (size_t)n, sizeof *live, cmp_sized_desc);
    fprintf(f, "  ten largest values live at the peak:\n");
    for (int32_t k = 0; k < n && k < 10; k++) {
        gt_value_id v = live[k].v;
        const gt_value_plan *vp = &p->values[v];
        char ty[160];
        gt_graph_format_type(g, gt_value_type(g, v), ty, sizeof ty);
        const char *fqn = value_fqn(g, v);
        fprintf(f, "    %%%-6d %12zu bytes  %-11s %-10s %-16s %s\n", v, vp->nbytes,
                gt_mem_category_name((gt_mem_category)vp->category), arena_names[vp->arena], ty,
                fqn && fqn[0] ? fqn : "-");
    }
    free(live);
}
