/* optim.c — gradient clipping and AdamW appended to the whole-step graph (gt_optim.h).
 *
 * What torchtitan's step does after backward, as graph nodes:
 *   total = ||[||g_1||, ..., ||g_n||]||_2            (clip_grad_norm_, norm_type 2)
 *   clip  = min(1, max_norm / (total + 1e-6))
 *   per param: AdamW(p, g * clip, exp_avg, exp_avg_sq) with weight decay (every param; with
 *   decay_matrices_only, those of rank >= 2)
 * The norm: per param sum_squares over all dims (each square in f32, double accumulator,
 * row-major order), the per-param sums added in param order, one sqrt. Mathematically that is
 * torch's norm of norms; it skips torch's sqrt-then-square per param, which only removes a
 * rounding. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graphtrain/gt_build.h"
#include "graphtrain/gt_optim.h"

#define GT_OPTIM_NAME_MAX 512

gt_adamw_config gt_adamw_config_default(void)
{
    return (gt_adamw_config){
        .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1, .max_norm = 1.0};
}

void gt_optim_scalars(const gt_adamw_config *cfg, int64_t step, double lr, float out[3])
{
    GT_CHECK(cfg && step >= 1);
    /* torch: bias_correction = 1 - beta ** step with step a float; pow in double here too. */
    out[0] = (float)lr;
    out[1] = (float)(1.0 - pow(cfg->beta1, (double)step));
    out[2] = (float)(1.0 - pow(cfg->beta2, (double)step));
}

int gt_optim_find_params(const gt_graph *g, gt_value_id *params, int max)
{
    int count = 0;
    for (int32_t k = 0; k < g->n_inputs; k++) {
        if (g->inputs[k].kind != GT_IN_PARAM) continue;
        if (count < max) params[count] = g->inputs[k].value;
        count++;
    }
    return count;
}

/* The graph input index of value v when it is an input of the given kind, else -1. */
static int32_t input_index(const gt_graph *g, gt_value_id v, gt_input_kind kind)
{
    for (int32_t k = 0; k < g->n_inputs; k++)
        if (g->inputs[k].value == v && g->inputs[k].kind == (int)kind) return k;
    return -1;
}

static bool has_input_named(const gt_graph *g, const char *name)
{
    for (int32_t k = 0; k < g->n_inputs; k++)
        if (strcmp(gt_graph_str(g, g->inputs[k].fqn), name) == 0) return true;
    return false;
}

static bool same_dims(const gt_type *a, const gt_type *b)
{
    if (a->ndim != b->ndim) return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->dims[d] != b->dims[d]) return false;
    return true;
}

/* Checks params (distinct PARAM inputs) and grads (float values with the param's dims); fills the
 * fqns (pointers into g's string table: copy before interning anything). */
static gt_status check_pairs(const gt_graph *g, int n, const gt_value_id *params,
                             const gt_value_id *grads, const char *who, gt_error *err)
{
    if (n < 1 || !params || !grads)
        return gt_error_set(err, GT_ERR_INVALID,
                            "%s: needs at least one (param, grad) pair, got %d", who, n);
    for (int k = 0; k < n; k++) {
        int32_t in =
            params[k] >= 0 && params[k] < g->n_values ? input_index(g, params[k], GT_IN_PARAM) : -1;
        if (in < 0)
            return gt_error_set(err, GT_ERR_INVALID, "%s: params[%d] (%%%d) is not a PARAM input",
                                who, k, params[k]);
        const char *fqn = gt_graph_str(g, g->inputs[in].fqn);
        for (int j = 0; j < k; j++)
            if (params[j] == params[k])
                return gt_error_set(err, GT_ERR_INVALID, "%s: param '%s' is listed twice", who,
                                    fqn);
        if (grads[k] < 0 || grads[k] >= g->n_values)
            return gt_error_set(err, GT_ERR_INVALID, "%s: gradient of '%s' is %%%d, not a value",
                                who, fqn, grads[k]);
        const gt_type *pt = gt_value_type(g, params[k]), *gt = gt_value_type(g, grads[k]);
        if (!gt_dtype_is_float(gt->dtype) || !same_dims(pt, gt)) {
            char ps[160], gs[160];
            gt_graph_format_type(g, pt, ps, sizeof ps);
            gt_graph_format_type(g, gt, gs, sizeof gs);
            return gt_error_set(err, GT_ERR_INVALID,
                                "%s: gradient of '%s' is %s, expected a float tensor with the "
                                "param's dims (%s)",
                                who, fqn, gs, ps);
        }
    }
    return GT_OK;
}

static gt_status check_config(const gt_adamw_config *cfg, gt_error *err)
{
    if (!cfg) return gt_error_set(err, GT_ERR_INVALID, "adamw: no config given");
    if (!(cfg->beta1 >= 0.0 && cfg->beta1 < 1.0) || !(cfg->beta2 >= 0.0 && cfg->beta2 < 1.0))
        return gt_error_set(err, GT_ERR_INVALID, "adamw: betas must lie in [0, 1), got (%g, %g)",
                            cfg->beta1, cfg->beta2);
    if (!(cfg->eps >= 0.0) || isinf(cfg->eps))
        return gt_error_set(err, GT_ERR_INVALID, "adamw: eps must be finite and >= 0, got %g",
                            cfg->eps);
    if (!(cfg->weight_decay >= 0.0) || isinf(cfg->weight_decay))
        return gt_error_set(err, GT_ERR_INVALID,
                            "adamw: weight_decay must be finite and >= 0, got %g",
                            cfg->weight_decay);
    if (isnan(cfg->max_norm) || isinf(cfg->max_norm))
        return gt_error_set(err, GT_ERR_INVALID,
                            "adamw: max_norm must be finite (<= 0 disables clipping), got %g",
                            cfg->max_norm);
    return GT_OK;
}

/* Saved builder metadata, restored on every exit. */
static gt_builder_state builder_enter(gt_graph *g, gt_phase phase)
{
    gt_builder_state s = gt_graph_builder_save(g);
    g->cur_phase = phase;
    g->cur_origin = GT_NONE;
    return s;
}

static gt_status builder_leave(gt_graph *g, gt_builder_state s, const char *who, gt_error *err)
{
    gt_graph_builder_restore(g, s);
    if (g->err.code == GT_OK) return GT_OK;
    gt_error_set(err, g->err.code, "%s", g->err.msg);
    return gt_error_wrap(err, "%s", who);
}

/* Sum of squares of x over all its elements: f32 []. One sum_squares over every dim (row-major
 * order, as a flattened sum; each square in f32 from x widened), without a reshape, so a gradient
 * sharded on any dim reduces locally to a partial sum under parallelize. One pass over x: no
 * f32 copy and no tensor of squares. */
static gt_value_id sum_of_squares(gt_graph *g, gt_value_id x)
{
    gt_type t = *gt_value_type(g, x);
    gt_value_id v = x;
    if (t.ndim == 0) {
        gt_expr one = gt_c(g, 1);
        v = gt_reshape(g, v, 1, &one);
        t.ndim = 1;
    }
    int dims[GT_MAX_DIMS];
    for (int d = 0; d < t.ndim; d++)
        dims[d] = d;
    return gt_reduce(g, GT_OP_SUM_SQUARES, v, t.ndim, dims, false);
}

/* clip_grad_norm_: returns the pre-clip total norm; *clip gets the coefficient (1 when off).
 * group (NULL: one group): the terms summed per group, the groups in order of first appearance —
 * under parallelize, a sum of terms that are all partial (sharded gradients) or all replicated
 * over a mesh dim needs no collective until the groups meet, where a mixed chain needs one
 * all-reduce per term. */
static gt_value_id clip_coefficient(gt_graph *g, int n, const gt_value_id *grads, const int *group,
                                    double max_norm, gt_value_id *clip)
{
    gt_graph_set_fqn(g, "optim.clip_grad_norm");
    gt_graph_set_unit(g, GT_UNIT_REST);
    gt_value_id total_sq = GT_NONE;
    uint8_t *done = gt_xcalloc((size_t)n + 1, 1);
    for (int first = 0; first < n; first++) {
        if (done[first]) continue;
        gt_value_id part = GT_NONE;
        for (int k = first; k < n; k++) {
            if (done[k] || (group && group[k] != group[first])) continue;
            done[k] = 1;
            gt_value_id s = sum_of_squares(g, grads[k]);
            part = part == GT_NONE ? s : gt_add(g, part, s);
        }
        total_sq = total_sq == GT_NONE ? part : gt_add(g, total_sq, part);
    }
    free(done);
    gt_value_id total = gt_unary(g, GT_OP_SQRT, total_sq);
    if (max_norm > 0.0) {
        /* torch: clip_coef = max_norm / (total + 1e-6), evaluated as (total + 1e-6).reciprocal()
         * * max_norm; then clamp(max=1). */
        gt_value_id denom = gt_add_scalar(g, total, 1e-6);
        gt_value_id one = gt_full(g, GT_F32, 0, NULL, 1.0);
        gt_value_id coef = gt_scale(g, gt_div(g, one, denom), max_norm);
        *clip = gt_clamp(g, coef, -INFINITY, 1.0);
    } else {
        *clip = gt_full(g, GT_F32, 0, NULL, 1.0);
    }
    return total;
}

gt_status gt_optim_append_adamw(gt_graph *g, int n, const gt_value_id *params,
                                const gt_value_id *grads, const gt_adamw_config *cfg, gt_error *err)
{
    const char *who = "adamw";
    if (!g) return gt_error_set(err, GT_ERR_INVALID, "%s: no graph", who);
    if (g->err.code != GT_OK)
        return gt_error_set(err, g->err.code, "%s: the graph already carries an error: %s", who,
                            g->err.msg);
    GT_TRY(check_config(cfg, err));
    GT_TRY(check_pairs(g, n, params, grads, who, err));
    if (has_input_named(g, GT_OPTIM_SCALARS_NAME))
        return gt_error_set(err, GT_ERR_INVALID,
                            "%s: the graph already has an input '%s' (optimizer appended twice?)",
                            who, GT_OPTIM_SCALARS_NAME);

    /* Names first: interning below may move the string table that gt_graph_str points into. */
    char(*fqn)[GT_OPTIM_NAME_MAX] = gt_xcalloc((size_t)n, sizeof *fqn);
    for (int k = 0; k < n; k++) {
        const char *name = gt_graph_str(g, g->inputs[input_index(g, params[k], GT_IN_PARAM)].fqn);
        if (strlen(name) + strlen(GT_OPTIM_EXP_AVG_SQ_PREFIX) >= GT_OPTIM_NAME_MAX) {
            free(fqn);
            return gt_error_set(err, GT_ERR_INVALID, "%s: param name '%.64s...' is too long", who,
                                name);
        }
        snprintf(fqn[k], sizeof fqn[k], "%s", name);
    }
    for (int k = 0; k < n; k++) {
        char name[GT_OPTIM_NAME_MAX + 32];
        snprintf(name, sizeof name, "%s%s", GT_OPTIM_EXP_AVG_PREFIX, fqn[k]);
        bool dup = has_input_named(g, name);
        snprintf(name, sizeof name, "%s%s", GT_OPTIM_EXP_AVG_SQ_PREFIX, fqn[k]);
        if (dup || has_input_named(g, name)) {
            gt_status st =
                gt_error_set(err, GT_ERR_INVALID,
                             "%s: the graph already has optimizer state for '%s'", who, fqn[k]);
            free(fqn);
            return st;
        }
    }

    gt_value_id *m = gt_xcalloc((size_t)n, sizeof *m), *v = gt_xcalloc((size_t)n, sizeof *v);
    for (int k = 0; k < n; k++) {
        gt_type pt = *gt_value_type(g, params[k]);
        char name[GT_OPTIM_NAME_MAX + 32];
        snprintf(name, sizeof name, "%s%s", GT_OPTIM_EXP_AVG_PREFIX, fqn[k]);
        m[k] = gt_graph_add_input(g, GT_IN_OPT_STATE, name, GT_F32, pt.ndim, pt.dims);
        snprintf(name, sizeof name, "%s%s", GT_OPTIM_EXP_AVG_SQ_PREFIX, fqn[k]);
        v[k] = gt_graph_add_input(g, GT_IN_OPT_STATE, name, GT_F32, pt.ndim, pt.dims);
        /* the moments are placed as their parameter */
        gt_param_plan plan = gt_graph_input_plan(g, params[k]);
        gt_graph_set_input_plan(g, m[k], plan);
        gt_graph_set_input_plan(g, v[k], plan);
    }
    gt_expr three = gt_c(g, 3);
    gt_value_id scalars =
        gt_graph_add_input(g, GT_IN_INPUT, GT_OPTIM_SCALARS_NAME, GT_F32, 1, &three);

    gt_builder_state saved = builder_enter(g, GT_PHASE_OPTIMIZER);
    gt_value_id clip = GT_NONE;
    gt_value_id total = clip_coefficient(g, n, grads, cfg->norm_groups, cfg->max_norm, &clip);
    gt_graph_add_output(g, GT_OUT_METRIC, GT_OPTIM_GRAD_NORM_NAME, total);
    for (int k = 0; k < n; k++) {
        gt_graph_set_fqn(g, fqn[k]);
        gt_graph_set_unit(g, gt_graph_input_plan(g, params[k]).unit);
        /* torchtitan's AdamW decays every parameter; decay_matrices_only spares the vectors
         * (norm weights, biases) */
        bool decays = !cfg->decay_matrices_only || gt_value_type(g, params[k])->ndim >= 2;
        double wd = decays ? cfg->weight_decay : 0.0;
        gt_value_id m_new = GT_NONE, v_new = GT_NONE;
        gt_value_id p_new = gt_adamw(g, params[k], grads[k], m[k], v[k], scalars, clip, cfg->beta1,
                                     cfg->beta2, cfg->eps, wd, &m_new, &v_new);
        char name[GT_OPTIM_NAME_MAX + 32];
        gt_graph_add_output(g, GT_OUT_PARAM_UPDATE, fqn[k], p_new);
        snprintf(name, sizeof name, "%s%s", GT_OPTIM_EXP_AVG_PREFIX, fqn[k]);
        gt_graph_add_output(g, GT_OUT_OPT_STATE_UPDATE, name, m_new);
        snprintf(name, sizeof name, "%s%s", GT_OPTIM_EXP_AVG_SQ_PREFIX, fqn[k]);
        gt_graph_add_output(g, GT_OUT_OPT_STATE_UPDATE, name, v_new);
    }
    /* the step consumes the gradients: outputs would keep them alive (in f32) to its end */
    int32_t kept = 0;
    for (int32_t k = 0; k < g->n_outputs; k++) {
        bool grad = false;
        for (int j = 0; j < n && g->outputs[k].kind == GT_OUT_GRAD && !grad; j++)
            grad = g->outputs[k].value == grads[j];
        if (!grad) g->outputs[kept++] = g->outputs[k];
    }
    g->n_outputs = kept;
    free(v);
    free(m);
    free(fqn);
    return builder_leave(g, saved, who, err);
}

gt_status gt_optim_append_grad_accum(gt_graph *g, int n, const gt_value_id *params,
                                     gt_value_id *grads, gt_error *err)
{
    const char *who = "gradient accumulation";
    if (!g) return gt_error_set(err, GT_ERR_INVALID, "%s: no graph", who);
    if (g->err.code != GT_OK)
        return gt_error_set(err, g->err.code, "%s: the graph already carries an error: %s", who,
                            g->err.msg);
    GT_TRY(check_pairs(g, n, params, grads, who, err));
    gt_builder_state saved = builder_enter(g, GT_PHASE_BACKWARD);
    for (int k = 0; k < n; k++) {
        char fqn[GT_OPTIM_NAME_MAX], name[GT_OPTIM_NAME_MAX + 32];
        snprintf(fqn, sizeof fqn, "%s",
                 gt_graph_str(g, g->inputs[input_index(g, params[k], GT_IN_PARAM)].fqn));
        snprintf(name, sizeof name, "%s%s", GT_OPTIM_GRAD_ACCUM_PREFIX, fqn);
        if (has_input_named(g, name)) {
            builder_leave(g, saved, who, err);
            return gt_error_set(err, GT_ERR_INVALID, "%s: the graph already has an input '%s'", who,
                                name);
        }
        gt_type pt = *gt_value_type(g, params[k]);
        gt_value_id acc = gt_graph_add_input(g, GT_IN_BUFFER, name, GT_F32, pt.ndim, pt.dims);
        /* the running sum is placed as its parameter */
        gt_param_plan plan = gt_graph_input_plan(g, params[k]);
        gt_graph_set_input_plan(g, acc, plan);
        gt_graph_set_fqn(g, fqn);
        gt_graph_set_unit(g, plan.unit);
        gt_value_id gk =
            gt_value_type(g, grads[k])->dtype == GT_F32 ? grads[k] : gt_cast(g, grads[k], GT_F32);
        grads[k] = gt_add(g, acc, gk);
        gt_graph_add_output(g, GT_OUT_BUFFER_UPDATE, name, grads[k]);
    }
    return builder_leave(g, saved, who, err);
}

/* Checks bias[k] (a BUFFER f32[E]) against counts[k] (f32[E]). */
static gt_status check_moe_pair(const gt_graph *g, int k, gt_value_id bias, gt_value_id counts,
                                const char *who, gt_error *err)
{
    int32_t in = input_index(g, bias, GT_IN_BUFFER);
    const gt_type *bt = gt_value_type(g, bias), *ct = gt_value_type(g, counts);
    if (in < 0 || bt->ndim != 1 || !gt_type_equal(bt, ct) || bt->dtype != GT_F32)
        return gt_error_set(err, GT_ERR_INVALID,
                            "%s: pair %d is not a BUFFER f32[E] bias with f32[E] counts", who, k);
    return GT_OK;
}

/* The update of one bias from its counts (phase optimizer, tag "moe.bias_update"); gate GT_NONE:
 * bias' = bias + d, else bias' = bias + d·gate (gate f32[1], 0 or 1). */
static void append_bias_update(gt_graph *g, gt_value_id bias, gt_value_id counts, double coeff,
                               gt_value_id gate)
{
    char fqn[GT_OPTIM_NAME_MAX];
    snprintf(fqn, sizeof fqn, "%s",
             gt_graph_str(g, g->inputs[input_index(g, bias, GT_IN_BUFFER)].fqn));
    gt_graph_set_fqn(g, fqn);
    gt_graph_set_unit(g, gt_graph_input_plan(g, bias).unit);
    int32_t first = g->n_nodes;
    /* torchtitan's _update_expert_bias: d = coeff·sign(mean(c) − c); d −= mean(d) */
    int dim0 = 0;
    gt_value_id mean_c = gt_reduce(g, GT_OP_MEAN, counts, 1, &dim0, true);
    gt_value_id d = gt_scale(g, gt_sign(g, gt_sub(g, mean_c, counts)), coeff);
    d = gt_sub(g, d, gt_reduce(g, GT_OP_MEAN, d, 1, &dim0, true));
    /* d·0 is ±0 and b + ±0 = b for every b the update reaches (it starts at +0 and a sum is −0
     * only when both terms are): the gated-off runs keep the bias's bits */
    if (gate != GT_NONE) d = gt_mul(g, d, gate);
    gt_value_id next = gt_add(g, bias, d);
    for (int32_t m = first; m < g->n_nodes; m++)
        gt_graph_add_tag(g, m, "moe.bias_update");
    gt_graph_add_output(g, GT_OUT_BUFFER_UPDATE, fqn, next);
}

gt_status gt_optim_append_moe_bias_update(gt_graph *g, int n, const gt_value_id *bias,
                                          const gt_value_id *counts, double coeff, gt_error *err)
{
    const char *who = "expert-bias update";
    if (n == 0) return GT_OK;
    if (g->err.code != GT_OK)
        return gt_error_set(err, g->err.code, "%s: the graph already carries an error: %s", who,
                            g->err.msg);
    for (int k = 0; k < n; k++)
        GT_TRY(check_moe_pair(g, k, bias[k], counts[k], who, err));
    gt_builder_state saved = builder_enter(g, GT_PHASE_OPTIMIZER);
    for (int k = 0; k < n; k++)
        append_bias_update(g, bias[k], counts[k], coeff, GT_NONE);
    return builder_leave(g, saved, who, err);
}

gt_status gt_optim_append_moe_bias_update_accum(gt_graph *g, int n, const gt_value_id *bias,
                                                const gt_value_id *counts, double coeff,
                                                int64_t micro_batches, gt_error *err)
{
    const char *who = "expert-bias update with gradient accumulation";
    if (n == 0) return GT_OK;
    if (g->err.code != GT_OK)
        return gt_error_set(err, g->err.code, "%s: the graph already carries an error: %s", who,
                            g->err.msg);
    if (micro_batches < 2 || micro_batches > (1 << 24))
        return gt_error_set(err, GT_ERR_INVALID, "%s: %lld micro-batches (want 2 .. 2^24)", who,
                            (long long)micro_batches);
    for (int k = 0; k < n; k++)
        GT_TRY(check_moe_pair(g, k, bias[k], counts[k], who, err));
    if (has_input_named(g, GT_OPTIM_MOE_MICRO_NAME))
        return gt_error_set(err, GT_ERR_INVALID, "%s: the graph already has an input '%s'", who,
                            GT_OPTIM_MOE_MICRO_NAME);

    /* The micro-batch index m of this run within its step (f32, exact): every run of the step
     * graph, micro-batch part or whole, advances it, so it needs no help from the trainer:
     * first = [m == 0] restarts the sums, last = [m + 1 == A] lets the update through, and
     * m' = m + 1 − A·last. All of it lies in the micro-batch part (the BUFFER_UPDATEs read it). */
    gt_builder_state saved = builder_enter(g, GT_PHASE_BACKWARD);
    double a = (double)micro_batches;
    gt_expr one = gt_c(g, 1);
    gt_value_id m = gt_graph_add_input(g, GT_IN_BUFFER, GT_OPTIM_MOE_MICRO_NAME, GT_F32, 1, &one);
    gt_graph_set_input_plan(g, m, (gt_param_plan){.unit = GT_UNIT_REST});
    gt_graph_set_fqn(g, GT_OPTIM_MOE_MICRO_NAME);
    gt_graph_set_unit(g, GT_UNIT_REST);
    gt_value_id next = gt_add_scalar(g, m, 1.0);
    gt_value_id last = gt_clamp(g, gt_add_scalar(g, next, -(a - 1.0)), 0.0, 1.0);
    gt_value_id keep = gt_clamp(g, m, 0.0, 1.0); /* 0 in a step's first run */
    gt_graph_add_output(g, GT_OUT_BUFFER_UPDATE, GT_OPTIM_MOE_MICRO_NAME,
                        gt_sub(g, next, gt_scale(g, last, a)));

    gt_value_id *sums = gt_xcalloc((size_t)n, sizeof *sums);
    for (int k = 0; k < n; k++) {
        char fqn[GT_OPTIM_NAME_MAX], name[GT_OPTIM_NAME_MAX + 32];
        snprintf(fqn, sizeof fqn, "%s",
                 gt_graph_str(g, g->inputs[input_index(g, bias[k], GT_IN_BUFFER)].fqn));
        snprintf(name, sizeof name, "%s%s", GT_OPTIM_MOE_COUNTS_PREFIX, fqn);
        gt_type ct = *gt_value_type(g, counts[k]);
        gt_param_plan plan = gt_graph_input_plan(g, bias[k]);
        gt_value_id acc = gt_graph_add_input(g, GT_IN_BUFFER, name, GT_F32, 1, ct.dims);
        gt_graph_set_input_plan(g, acc, (gt_param_plan){.unit = plan.unit});
        gt_graph_set_fqn(g, name);
        gt_graph_set_unit(g, plan.unit);
        /* acc·0 = +0 exactly (counts are finite and >= 0) */
        sums[k] = gt_add(g, gt_mul(g, acc, keep), counts[k]);
        gt_graph_add_output(g, GT_OUT_BUFFER_UPDATE, name, sums[k]);
    }
    g->cur_phase = GT_PHASE_OPTIMIZER;
    for (int k = 0; k < n; k++)
        append_bias_update(g, bias[k], sums[k], coeff, last);
    free(sums);
    return builder_leave(g, saved, who, err);
}
