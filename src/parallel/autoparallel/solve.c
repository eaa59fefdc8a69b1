/* solve.c — AutoParallel's driver (gt_autoparallel.h): the classes and their strategies, the
 * probes that price them on the SPMD graphs gt_parallelize makes, the ILP, and the exact check
 * of its layout against the hand plans.
 *
 * Probes. The base layout is the hand plan of the mesh (FSDP x TP with tp > 1, else FSDP), cost
 * t0. unary[c][s] = t(c <- s) - t0 prices one class moved, whatever the rules then do downstream
 * (gathers, reduce-scatters, partial sums, the activations' placements). Data-parallel placements
 * of different parameters do not interact (the rules gather a weight on the data-parallel dims,
 * never the activation), but tensor-parallel ones do (a colwise wq feeds a rowwise wo without a
 * collective), so each pair of classes of the same kind (both block parameters, or both not) gets
 * pair[i][j] = t(c <- i, d <- j) - t0 - unary[c][i] - unary[d][j] over their tp placements, and
 * the ILP adds them. Memory is additive per class (its parameters, gradients and state, plus
 * the activation change its probe measured). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/autoparallel/autopar_internal.h"
#include "parallel/parallel_internal.h"

#define GIB (1024.0 * 1024.0 * 1024.0)
/* objective unit: microseconds; a strategy other than the hand plan's pays this much more, so
 * that ties keep the hand plan */
#define US 1e6
#define TIE_BREAK_US 1e-3

typedef struct {
    const gt_graph *g;
    const gt_parallel_plan *plan;
    const gt_autopar_options *o;
    gt_placement (*base)[GT_MESH_MAX_DIMS];
    gt_placement (*work)[GT_MESH_MAX_DIMS];
    gt_autopar_class *cs;
    gt_ap_info *is;
    int nc;
    int *base_choice;
    int n_probes;
} solver;

/* The bytes the budget holds: everything, or without the activations when the memory policy
 * fits them afterwards (gt_autopar_options.budget_state_only). */
static double budgeted(const gt_autopar_options *o, const gt_autopar_cost *c)
{
    return o->budget_state_only ? c->params_b + c->grads_b + c->opt_b : c->memory_b;
}

static void fill_layout(solver *S, const int *choice, gt_placement (*out)[GT_MESH_MAX_DIMS])
{
    memcpy(out, S->base, (size_t)S->g->n_inputs * sizeof *out);
    for (int c = 0; c < S->nc; c++) {
        if (choice[c] < 0) continue;
        for (int i = 0; i < S->is[c].n_inputs; i++)
            memcpy(out[S->is[c].inputs[i]], S->cs[c].strategies[choice[c]], sizeof out[0]);
    }
}

/* The cost of a layout; *ok false when gt_parallelize refuses it (a rule or a split does not
 * take it). */
static gt_status probe_layout(solver *S, const gt_placement (*layout)[GT_MESH_MAX_DIMS],
                              gt_autopar_cost *c, bool *ok, gt_error *err)
{
    gt_graph *spmd = NULL;
    gt_error ignore = {0};
    S->n_probes++;
    *ok = false;
    if (gt_parallelize(S->g, S->plan, layout, &spmd, &ignore) != GT_OK) return GT_OK;
    gt_status st = gt_autopar_cost_graph(spmd, S->o->binding, &S->o->device, c, err);
    gt_graph_free(spmd);
    *ok = st == GT_OK;
    return st;
}

static gt_status probe(solver *S, const int *choice, gt_autopar_cost *c, bool *ok, gt_error *err)
{
    fill_layout(S, choice, S->work);
    return probe_layout(S, (const gt_placement(*)[GT_MESH_MAX_DIMS])S->work, c, ok, err);
}

/* The strategy standing for tp placement i of class c in pair probes: the base's data-parallel
 * placement with tp placement i, else the first feasible one with i; -1 when none. */
static int tp_representative(const solver *S, int c, int i)
{
    const gt_autopar_class *k = &S->cs[c];
    int b = S->base_choice[c], first = -1;
    for (int s = 0; s < k->n_strategies; s++) {
        if (S->is[c].tp_part[s] != i || !k->feasible[s]) continue;
        if (gt_place_equal(k->strategies[s][GT_MESH_DP_SHARD], k->strategies[b][GT_MESH_DP_SHARD]))
            return s;
        if (first < 0) first = s;
    }
    return first;
}

static gt_status hand_layouts(const gt_graph *g, const gt_parallel_plan *plan,
                              gt_placement (*fsdp)[GT_MESH_MAX_DIMS],
                              gt_placement (*fsdp_tp)[GT_MESH_MAX_DIMS], gt_error *err)
{
    GT_TRY(gt_parallel_input_layouts(plan, g, fsdp_tp, err));
    gt_parallel_plan no_tp = *plan;
    no_tp.mesh.size[GT_MESH_TP] = 1;
    return gt_parallel_input_layouts(&no_tp, g, fsdp, err);
}

static gt_status run_probes(solver *S, gt_autopar_cost *c0, double **unary, double **mem,
                            gt_ap_pair **pairs, int *n_pairs, gt_error *err)
{
    int *choice = gt_xmalloc((size_t)S->nc * sizeof *choice);
    for (int c = 0; c < S->nc; c++)
        choice[c] = -1;
    bool ok;
    gt_status st = probe(S, choice, c0, &ok, err);
    if (st == GT_OK && !ok)
        st = gt_error_set(err, GT_ERR_INVALID,
                          "autoparallel: the mesh's hand plan does not parallelize this graph "
                          "(gt_parallelize refuses it; check the parallelism degrees)");
    for (int c = 0; st == GT_OK && c < S->nc; c++) {
        gt_autopar_class *k = &S->cs[c];
        unary[c] = gt_xcalloc((size_t)k->n_strategies, sizeof **unary);
        mem[c] = gt_xcalloc((size_t)k->n_strategies, sizeof **mem);
        for (int s = 0; st == GT_OK && s < k->n_strategies; s++) {
            if (s == S->base_choice[c]) {
                k->feasible[s] = true;
                continue;
            }
            gt_autopar_cost x;
            choice[c] = s;
            st = probe(S, choice, &x, &ok, err);
            choice[c] = -1;
            k->feasible[s] = ok;
            if (!ok) continue;
            unary[c][s] = (x.total_s - c0->total_s) * US;
            mem[c][s] = budgeted(S->o, &x) - budgeted(S->o, c0);
        }
    }
    gt_ap_pair *ps = NULL;
    int np = 0;
    for (int c = 0; st == GT_OK && c < S->nc; c++)
        for (int d = c + 1; st == GT_OK && d < S->nc; d++) {
            const gt_ap_info *ic = &S->is[c], *id = &S->is[d];
            if (ic->block != id->block || ic->n_tp < 2 || id->n_tp < 2) continue;
            int ni = ic->n_tp, nj = id->n_tp;
            int bi = ic->tp_part[S->base_choice[c]], bj = id->tp_part[S->base_choice[d]];
            gt_ap_pair p = {c, d, gt_xcalloc((size_t)(ni * nj), sizeof(double)),
                            gt_xcalloc((size_t)(ni * nj), sizeof(bool))};
            bool any = false;
            for (int i = 0; st == GT_OK && i < ni; i++)
                for (int j = 0; st == GT_OK && j < nj; j++) {
                    int ri = tp_representative(S, c, i), rj = tp_representative(S, d, j);
                    if (ri < 0 || rj < 0) {
                        p.forbid[i * nj + j] = any = true;
                        continue;
                    }
                    if (i == bi || j == bj) continue;
                    gt_autopar_cost x;
                    choice[c] = ri, choice[d] = rj;
                    st = probe(S, choice, &x, &ok, err);
                    choice[c] = choice[d] = -1;
                    if (!ok) {
                        p.forbid[i * nj + j] = any = true;
                        continue;
                    }
                    double v = (x.total_s - c0->total_s) * US - unary[c][ri] - unary[d][rj];
                    p.cost[i * nj + j] = v;
                    if (fabs(v) > 1e-6) any = true;
                }
            if (!any) {
                free(p.cost);
                free(p.forbid);
                continue;
            }
            ps = gt_xrealloc(ps, (size_t)(np + 1) * sizeof *ps);
            ps[np++] = p;
        }
    free(choice);
    *pairs = ps;
    *n_pairs = np;
    return st;
}

/* The activations' decision: with tp > 1 and sequence parallelism allowed by the plan, the
 * chosen layout and both hand plans priced again with the activations between the
 * tensor-parallel regions replicated over tp instead of sharded by sequence; the cheapest that
 * fits wins (ties keep the layout and sequence parallelism). One binary for the whole step: per
 * block it would add a redistribution at every block boundary that changes it. (The ILP's
 * parameter placements already move the residual stream: a column-sharded embedding keeps it
 * sharded by hidden over tp, where the flag changes nothing.) */
static gt_status pick_activations(solver *S, gt_autopar_result *r, double budget,
                                  gt_placement (*fsdp)[GT_MESH_MAX_DIMS],
                                  gt_placement (*fsdp_tp)[GT_MESH_MAX_DIMS], gt_error *err)
{
    r->sequence_parallel = S->plan->sequence_parallel;
    r->sp_other_total_s = -1;
    if (!S->plan->sequence_parallel || S->plan->mesh.size[GT_MESH_TP] <= 1) return GT_OK;
    gt_parallel_plan off = *S->plan;
    off.sequence_parallel = false;
    const gt_parallel_plan *keep = S->plan;
    S->plan = &off;
    gt_placement(*cands[3])[GT_MESH_MAX_DIMS] = {r->layout, fsdp_tp, fsdp};
    static const char *const names[3] = {NULL, "fsdp_tp", "fsdp"};
    gt_autopar_cost best = r->cost;
    int won = -1;
    gt_status st = GT_OK;
    for (int k = 0; k < 3 && st == GT_OK; k++) {
        gt_autopar_cost x;
        bool ok = false;
        st = probe_layout(S, (const gt_placement(*)[GT_MESH_MAX_DIMS])cands[k], &x, &ok, err);
        if (st != GT_OK || !ok) continue;
        if (k == 0) r->sp_other_total_s = x.total_s;
        if (budgeted(S->o, &x) <= budget && x.total_s < best.total_s * (1 - 1e-12))
            best = x, won = k;
    }
    S->plan = keep;
    if (st != GT_OK || won < 0) return st;
    r->sp_other_total_s = r->cost.total_s;
    r->cost = best;
    r->sequence_parallel = false;
    if (won > 0) {
        r->picked = names[won];
        for (int c = 0; c < r->n_classes; c++)
            r->classes[c].chosen = won == 1 ? r->classes[c].hand_fsdp_tp : r->classes[c].hand_fsdp;
        memcpy(r->layout, cands[won], (size_t)r->n_inputs * sizeof *r->layout);
    }
    return GT_OK;
}

/* The backend's FSDP policy for the chosen layout: the gathered buckets get what the budget
 * leaves after parameters, gradients, optimizer state and the activations as saved. */
static gt_status pick_policy(solver *S, gt_autopar_result *r, gt_error *err)
{
    gt_graph *spmd = NULL;
    gt_parallel_plan plan = *S->plan;
    plan.sequence_parallel = r->sequence_parallel;
    GT_TRY(gt_parallelize(S->g, &plan, (const gt_placement(*)[GT_MESH_MAX_DIMS])r->layout, &spmd,
                          err));
    const gt_autopar_options *o = S->o;
    double allowance = -1;
    if (o->memory_budget_b > 0) {
        allowance = o->memory_budget_b - r->cost.memory_b;
        if (allowance < 0) allowance = 0;
    }
    gt_status st =
        gt_autopar_pick_policy(spmd, o->binding, &o->device, allowance, o->fsdp_bucket_cap_mb,
                               o->fsdp_prefetch_depth, &r->cost.policy, err);
    gt_graph_free(spmd);
    return st;
}

gt_status gt_autopar_solve(const gt_graph *g, const gt_parallel_plan *plan,
                           const gt_autopar_options *o, gt_autopar_result **out, gt_error *err)
{
    *out = NULL;
    if (!gt_autopar_available())
        return gt_error_set(err, GT_ERR_UNSUPPORTED,
                            "compile.enable_autoparallel: this build has no ILP solver; install "
                            "the Debian package coinor-libcbc-dev (scripts/deps.sh) and rebuild");
    double t_start = gt_now_seconds();
    size_t ni = (size_t)g->n_inputs + 1;
    gt_placement(*fsdp)[GT_MESH_MAX_DIMS] = gt_xcalloc(ni, sizeof *fsdp);
    gt_placement(*fsdp_tp)[GT_MESH_MAX_DIMS] = gt_xcalloc(ni, sizeof *fsdp_tp);
    gt_autopar_result *r = gt_xcalloc(1, sizeof *r);
    r->mesh = plan->mesh;
    r->n_inputs = g->n_inputs;
    r->layout = gt_xcalloc(ni, sizeof *r->layout);
    r->has_fsdp_tp = plan->mesh.size[GT_MESH_TP] > 1;
    solver S = {.g = g, .plan = plan, .o = o};
    S.work = gt_xcalloc(ni, sizeof *S.work);
    gt_ap_info *is = NULL;
    double **unary = NULL, **mem = NULL;
    bool **feasible = NULL;
    int *n_str = NULL, *choice = NULL;
    int *const *tp_part = NULL;
    int *n_tp = NULL;
    gt_ap_pair *pairs = NULL;
    int n_pairs = 0;
    gt_status st = hand_layouts(g, plan, fsdp, fsdp_tp, err);
    if (st == GT_OK)
        st = gt_ap_classes(g, plan, (const gt_placement(*)[GT_MESH_MAX_DIMS])fsdp,
                           (const gt_placement(*)[GT_MESH_MAX_DIMS])fsdp_tp, &r->classes, &is,
                           &r->n_classes, err);
    int nc = r->n_classes;
    S.cs = r->classes, S.is = is, S.nc = nc;
    S.base = r->has_fsdp_tp ? fsdp_tp : fsdp;
    S.base_choice = gt_xcalloc((size_t)nc + 1, sizeof *S.base_choice);
    for (int c = 0; st == GT_OK && c < nc; c++)
        S.base_choice[c] = r->has_fsdp_tp ? r->classes[c].hand_fsdp_tp : r->classes[c].hand_fsdp;
    gt_autopar_cost c0 = {0};
    unary = gt_xcalloc((size_t)nc + 1, sizeof *unary);
    mem = gt_xcalloc((size_t)nc + 1, sizeof *mem);
    if (st == GT_OK) st = run_probes(&S, &c0, unary, mem, &pairs, &n_pairs, err);
    r->probe_s = gt_now_seconds() - t_start;

    /* the memory row, and the smallest budget anything fits */
    double limit = -1;
    if (st == GT_OK && o->memory_budget_b > 0) {
        double least = budgeted(o, &c0);
        for (int c = 0; c < nc; c++) {
            double lo = INFINITY;
            for (int s = 0; s < r->classes[c].n_strategies; s++)
                if (r->classes[c].feasible[s] && mem[c][s] < lo) lo = mem[c][s];
            least += lo;
        }
        if (least > o->memory_budget_b)
            st = gt_error_set(err, GT_ERR_INVALID,
                              "autoparallel: no layout fits parallelism.autoparallel_memory_"
                              "budget_gb = %g GiB per rank; the smallest feasible budget is %.3f "
                              "GiB (every parameter class at its least memory)",
                              o->memory_budget_b / GIB, ceil(least / GIB * 1e3) / 1e3);
        limit = o->memory_budget_b - budgeted(o, &c0);
    }
    if (st == GT_OK) {
        n_str = gt_xmalloc((size_t)nc * sizeof *n_str);
        n_tp = gt_xmalloc((size_t)nc * sizeof *n_tp);
        feasible = gt_xmalloc((size_t)nc * sizeof *feasible);
        int **parts = gt_xmalloc((size_t)nc * sizeof *parts);
        for (int c = 0; c < nc; c++) {
            n_str[c] = r->classes[c].n_strategies;
            n_tp[c] = is[c].n_tp;
            feasible[c] = r->classes[c].feasible;
            parts[c] = is[c].tp_part;
            for (int s = 0; s < n_str[c]; s++)
                if (s != S.base_choice[c]) unary[c][s] += TIE_BREAK_US;
        }
        tp_part = parts;
    }
    /* Candidates, each priced exactly: the ILP with the pair terms, the ILP with the unary terms
     * alone (the pair terms are a second-order expansion around the base: several classes moved
     * at once can be priced far off), then a descent from the best of them over single moves
     * that their unary probes found cheaper. The cheapest that fits wins. */
    double budget = o->memory_budget_b > 0 ? o->memory_budget_b : INFINITY;
    choice = gt_xmalloc((size_t)(nc + 1) * sizeof *choice);
    int *cand = gt_xmalloc((size_t)(nc + 1) * sizeof *cand);
    bool have = false, ok = false;
    for (int pass = 0; st == GT_OK && pass < 2; pass++) {
        gt_ap_ilp ilp = {
            nc, n_str, unary, mem, feasible, tp_part, n_tp, pairs, pass ? 0 : n_pairs, limit};
        double t_ilp = gt_now_seconds(), obj = 0;
        int cols = 0, rows = 0;
        st = gt_ap_ilp_solve(&ilp, cand, &obj, &cols, &rows, err);
        r->ilp_s += gt_now_seconds() - t_ilp;
        if (st != GT_OK) break;
        if (pass == 0) {
            r->n_columns = cols, r->n_rows = rows;
            r->ilp_objective_s = c0.total_s + obj / US;
        }
        gt_autopar_cost x;
        fill_layout(&S, cand, S.work);
        st = probe_layout(&S, (const gt_placement(*)[GT_MESH_MAX_DIMS])S.work, &x, &ok, err);
        if (st != GT_OK || !ok || budgeted(o, &x) > budget) continue;
        if (!have || x.total_s < r->cost.total_s * (1 - 1e-12)) {
            have = true;
            r->cost = x;
            memcpy(choice, cand, (size_t)nc * sizeof *choice);
        }
    }
    for (int c = 0; st == GT_OK && have && c < nc; c++)
        for (int s = 0; st == GT_OK && s < n_str[c]; s++) {
            if (s == choice[c] || !feasible[c][s] || unary[c][s] >= 0) continue;
            memcpy(cand, choice, (size_t)nc * sizeof *cand);
            cand[c] = s;
            gt_autopar_cost x;
            fill_layout(&S, cand, S.work);
            st = probe_layout(&S, (const gt_placement(*)[GT_MESH_MAX_DIMS])S.work, &x, &ok, err);
            if (st == GT_OK && ok && budgeted(o, &x) <= budget &&
                x.total_s < r->cost.total_s * (1 - 1e-12)) {
                r->cost = x;
                choice[c] = s;
            }
        }
    free(cand);
    if (st == GT_OK) fill_layout(&S, choice, r->layout);
    bool ok_fsdp = false, ok_tp = false;
    if (st == GT_OK)
        st = probe_layout(&S, (const gt_placement(*)[GT_MESH_MAX_DIMS])fsdp, &r->fsdp, &ok_fsdp,
                          err);
    if (st == GT_OK && r->has_fsdp_tp) r->fsdp_tp = c0, ok_tp = true;
    if (st == GT_OK) {
        r->picked = "ilp";
        for (int c = 0; c < nc; c++)
            r->classes[c].chosen = have ? choice[c] : -1;
        const gt_autopar_cost *best = have ? &r->cost : NULL;
        for (int h = 0; h < 2; h++) {
            const gt_autopar_cost *hc = h ? &r->fsdp_tp : &r->fsdp;
            if (!(h ? ok_tp : ok_fsdp) || budgeted(o, hc) > budget) continue;
            if (best && hc->total_s >= best->total_s * (1 - 1e-12)) continue;
            best = hc;
            r->picked = h ? "fsdp_tp" : "fsdp";
            for (int c = 0; c < nc; c++)
                r->classes[c].chosen = h ? r->classes[c].hand_fsdp_tp : r->classes[c].hand_fsdp;
            memcpy(r->layout, h ? fsdp_tp : fsdp, (size_t)g->n_inputs * sizeof *r->layout);
            r->cost = *hc;
        }
        if (!best)
            st = gt_error_set(err, GT_ERR_INVALID,
                              "autoparallel: no layout the solver found fits "
                              "parallelism.autoparallel_memory_budget_gb = %g GiB per rank once "
                              "priced exactly; raise it",
                              o->memory_budget_b / GIB);
    }
    if (st == GT_OK) st = pick_activations(&S, r, budget, fsdp, fsdp_tp, err);
    if (st == GT_OK) st = pick_policy(&S, r, err);
    r->n_probes = S.n_probes;
    for (int c = 0; c < nc; c++) {
        if (unary) free(unary[c]);
        if (mem) free(mem[c]);
    }
    for (int q = 0; q < n_pairs; q++) {
        free(pairs[q].cost);
        free(pairs[q].forbid);
    }
    free(pairs);
    free(unary);
    free(mem);
    free(feasible);
    free(n_str);
    free(n_tp);
    free((void *)tp_part);
    free(choice);
    free(S.base_choice);
    free(S.work);
    free(fsdp);
    free(fsdp_tp);
    if (is) {
        for (int c = 0; c < nc; c++) {
            free(is[c].inputs);
            free(is[c].tp_part);
        }
        free(is);
    }
    if (st != GT_OK) {
        gt_autopar_free(r);
        return st;
    }
    *out = r;
    return GT_OK;
}

void gt_autopar_free(gt_autopar_result *r)
{
    if (!r) return;
    gt_ap_classes_free(r->classes, NULL, r->n_classes);
    free(r->layout);
    free(r);
}
