/* strategies.c — AutoParallel's decision groups: parameter classes (a parameter with the state
 * that sits where it does; the same parameter of every repeated block tied into one class by the
 * structure: its position among its unit's parameters, shape and plan) and each class's
 * strategies: a placement per mesh dim of size > 1 — replicate, or shard of a dim that splits
 * (nested inside tp's split when both take the same dim, as the hand plans nest them; FSDP's
 * padded shard(0) where dim 0 does not divide) — over dp_shard and tp; dp_replicate replicates
 * (it is the replica dim by definition). Which of these the rules take is found by the probes. */
#include <stdlib.h>
#include <string.h>

#include "parallel/autoparallel/autopar_internal.h"
#include "parallel/parallel_internal.h"

static bool layout_equal(const gt_placement *a, const gt_placement *b)
{
    for (int md = 0; md < GT_MESH_NDIMS; md++)
        if (!gt_place_equal(a[md], b[md])) return false;
    return true;
}

/* The class name: fqn with the block index (the unit) shown as '*'. */
static void class_name(const char *fqn, int32_t unit, char *buf, size_t len)
{
    char idx[24];
    snprintf(idx, sizeof idx, ".%d.", (int)unit);
    const char *at = unit >= 0 ? strstr(fqn, idx) : NULL;
    if (!at) {
        snprintf(buf, len, "%s", fqn);
        return;
    }
    snprintf(buf, len, "%.*s.*.%s", (int)(at - fqn), fqn, at + strlen(idx));
}

static void add_input(gt_ap_info *in, int32_t k)
{
    for (int i = 0; i < in->n_inputs; i++)
        if (in->inputs[i] == k) return;
    in->inputs = gt_xrealloc(in->inputs, (size_t)(in->n_inputs + 1) * sizeof *in->inputs);
    in->inputs[in->n_inputs++] = k;
}

static void add_strategy(gt_autopar_class *c, gt_ap_info *in, const gt_placement *s, int tp_part)
{
    for (int i = 0; i < c->n_strategies; i++)
        if (layout_equal(c->strategies[i], s)) return;
    c->strategies =
        gt_xrealloc(c->strategies, (size_t)(c->n_strategies + 1) * sizeof *c->strategies);
    in->tp_part = gt_xrealloc(in->tp_part, (size_t)(c->n_strategies + 1) * sizeof *in->tp_part);
    memcpy(c->strategies[c->n_strategies], s, sizeof c->strategies[0]);
    in->tp_part[c->n_strategies++] = tp_part;
}

/* The index of tp placement p among the class's tp options (added when new). */
static int tp_index(gt_ap_info *in, gt_placement p)
{
    for (int i = 0; i < in->n_tp; i++)
        if (gt_place_equal(in->tp_options[i], p)) return i;
    in->tp_options[in->n_tp] = p;
    return in->n_tp++;
}

static void enumerate(const gt_graph *g, const gt_mesh *m, gt_autopar_class *c, gt_ap_info *in)
{
    const gt_type *t = gt_value_type(g, g->inputs[in->first].value);
    int64_t dims[GT_MAX_DIMS];
    bool known = true;
    for (int d = 0; d < t->ndim; d++)
        if (!gt_sym_is_const(g->sym, t->dims[d], &dims[d])) known = false;
    int tp = m->size[GT_MESH_TP], dps = m->size[GT_MESH_DP_SHARD];
    gt_placement tp_opts[GT_MAX_DIMS + 1], dp_opts[GT_MAX_DIMS + 2];
    int n_tp = 0;
    tp_opts[n_tp++] = gt_place_replicate();
    for (int d = 0; tp > 1 && known && d < t->ndim; d++)
        if (dims[d] % tp == 0) tp_opts[n_tp++] = gt_place_shard(d, 0);
    in->n_tp = 0;
    for (int i = 0; i < n_tp; i++) {
        int n_dp = 0;
        dp_opts[n_dp++] = gt_place_replicate();
        for (int d = 0; dps > 1 && known && d < t->ndim; d++) {
            bool nested = tp > 1 && tp_opts[i].kind == GT_PLACE_SHARD && tp_opts[i].dim == d;
            /* two mesh dims splitting one tensor dim: only dim 0, FSDP inside TP's block (the
             * nesting the hand plans use; a nested split of dim 1 trains off one rank's numbers
             * on debugmodel's embedding, 1.6e-4 after 10 steps) */
            if (nested && d != 0) continue;
            int64_t rows = nested ? dims[d] / tp : dims[d];
            gt_placement s = gt_place_shard(d, nested ? 1 : 0);
            if (rows % dps == 0)
                dp_opts[n_dp++] = s;
            else if (d == 0 && rows >= dps) { /* FSDP2's padding, for dim 0 only */
                s.padded = 1;
                dp_opts[n_dp++] = s;
            }
        }
        for (int j = 0; j < n_dp; j++) {
            gt_placement s[GT_MESH_MAX_DIMS] = {{0}};
            if (tp > 1) s[GT_MESH_TP] = tp_opts[i];
            if (dps > 1) s[GT_MESH_DP_SHARD] = dp_opts[j];
            add_strategy(c, in, s, tp_index(in, s[GT_MESH_TP]));
        }
    }
}

static int find_strategy(const gt_autopar_class *c, const gt_placement *s)
{
    for (int i = 0; i < c->n_strategies; i++)
        if (layout_equal(c->strategies[i], s)) return i;
    return -1;
}

gt_status gt_ap_classes(const gt_graph *g, const gt_parallel_plan *plan,
                        const gt_placement (*fsdp)[GT_MESH_MAX_DIMS],
                        const gt_placement (*fsdp_tp)[GT_MESH_MAX_DIMS], gt_autopar_class **classes,
                        gt_ap_info **info, int *n, gt_error *err)
{
    gt_autopar_class *cs = NULL;
    gt_ap_info *is = NULL;
    int nc = 0;
    int32_t *class_of = gt_xmalloc((size_t)(g->n_inputs + 1) * sizeof *class_of);
    int32_t *pos = gt_xcalloc((size_t)(g->n_inputs + 1), sizeof *pos);
    /* per unit, the number of PARAMs seen (units: blocks >= 0, then EMBED and REST) */
    int32_t max_unit = 0;
    for (int32_t k = 0; k < g->n_inputs; k++)
        if (g->inputs[k].plan.unit > max_unit) max_unit = g->inputs[k].plan.unit;
    int32_t *seen = gt_xcalloc((size_t)max_unit + 4, sizeof *seen);
    for (int32_t k = 0; k < g->n_inputs; k++) {
        class_of[k] = -1;
        const gt_io *io = &g->inputs[k];
        if (io->kind != GT_IN_PARAM) continue;
        int32_t u = io->plan.unit;
        pos[k] = seen[u + 2]++;
        int found = -1;
        for (int c = 0; u >= 0 && found < 0 && c < nc; c++) {
            const gt_io *f = &g->inputs[is[c].first];
            if (!is[c].block || pos[is[c].first] != pos[k] || f->plan.tp != io->plan.tp ||
                f->plan.role != io->plan.role)
                continue;
            const gt_type *a = gt_value_type(g, f->value), *b = gt_value_type(g, io->value);
            bool same = a->dtype == b->dtype && a->ndim == b->ndim;
            for (int d = 0; same && d < a->ndim; d++)
                same = a->dims[d] == b->dims[d];
            if (same) found = c;
        }
        if (found < 0) {
            cs = gt_xrealloc(cs, (size_t)(nc + 1) * sizeof *cs);
            is = gt_xrealloc(is, (size_t)(nc + 1) * sizeof *is);
            memset(&cs[nc], 0, sizeof cs[nc]);
            memset(&is[nc], 0, sizeof is[nc]);
            is[nc].first = k;
            is[nc].block = u >= 0;
            class_name(gt_graph_str(g, io->fqn), u, cs[nc].name, sizeof cs[nc].name);
            found = nc++;
        }
        cs[found].n_members++;
        add_input(&is[found], k);
        class_of[k] = found;
    }
    free(seen);
    free(pos);
    /* AdamW's moments sit where its parameter does */
    for (int32_t i = 0; i < g->n_nodes; i++) {
        const gt_node *nd = &g->nodes[i];
        if (nd->op != GT_OP_ADAMW) continue;
        int32_t pk = -1;
        for (int32_t k = 0; k < g->n_inputs; k++)
            if (g->inputs[k].value == nd->in[0] && class_of[k] >= 0) pk = k;
        if (pk < 0) continue;
        for (int a = 2; a <= 3; a++)
            for (int32_t k = 0; k < g->n_inputs; k++)
                if (g->inputs[k].value == nd->in[a] && g->inputs[k].kind == GT_IN_OPT_STATE) {
                    class_of[k] = class_of[pk];
                    add_input(&is[class_of[pk]], k);
                }
    }
    /* the rest placed as a parameter (gradient-accumulation sums, other state): the parameter
     * whose fqn its name ends with (the optimizer and the trainer name them "<what>.<fqn>") */
    gt_status st = GT_OK;
    for (int32_t k = 0; k < g->n_inputs; k++) {
        const gt_io *io = &g->inputs[k];
        if (class_of[k] >= 0 || io->kind == GT_IN_INPUT || !io->plan.as_param) continue;
        const char *name = gt_graph_str(g, io->fqn);
        size_t ln = strlen(name);
        for (int32_t j = 0; j < g->n_inputs && class_of[k] < 0; j++) {
            if (g->inputs[j].kind != GT_IN_PARAM) continue;
            const char *pf = gt_graph_str(g, g->inputs[j].fqn);
            size_t lp = strlen(pf);
            if (ln > lp && name[ln - lp - 1] == '.' && !strcmp(name + ln - lp, pf)) {
                class_of[k] = class_of[j];
                add_input(&is[class_of[j]], k);
            }
        }
        if (class_of[k] < 0)
            st = gt_error_set(err, GT_ERR_UNSUPPORTED,
                              "autoparallel: input '%s' is placed as a parameter but no "
                              "parameter's name ends its name",
                              name);
    }
    free(class_of);
    for (int c = 0; st == GT_OK && c < nc; c++) {
        enumerate(g, &plan->mesh, &cs[c], &is[c]);
        const gt_placement *hand[2] = {fsdp[is[c].first], fsdp_tp[is[c].first]};
        for (int h = 0; h < 2; h++) {
            gt_placement s[GT_MESH_MAX_DIMS];
            memcpy(s, hand[h], sizeof s);
            if (find_strategy(&cs[c], s) < 0)
                add_strategy(&cs[c], &is[c], s, tp_index(&is[c], s[GT_MESH_TP]));
        }
        cs[c].hand_fsdp = find_strategy(&cs[c], hand[0]);
        cs[c].hand_fsdp_tp = find_strategy(&cs[c], hand[1]);
        cs[c].feasible = gt_xcalloc((size_t)cs[c].n_strategies, sizeof *cs[c].feasible);
        cs[c].chosen = -1;
    }
    *classes = cs;
    *info = is;
    *n = nc;
    if (st != GT_OK) gt_ap_classes_free(cs, is, nc), *classes = NULL, *info = NULL, *n = 0;
    return st;
}

void gt_ap_classes_free(gt_autopar_class *classes, gt_ap_info *info, int n)
{
    for (int c = 0; c < n; c++) {
        if (classes) {
            free(classes[c].strategies);
            free(classes[c].feasible);
        }
        if (info) {
            free(info[c].inputs);
            free(info[c].tp_part);
        }
    }
    free(classes);
    free(info);
}
