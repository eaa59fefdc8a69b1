/* gt_optim.h — the optimizer inside the whole-step graph (DESIGN.md §1): global-norm gradient
 * clipping and AdamW, appended after the backward pass, plus the pieces the trainer needs for
 * gradient accumulation.
 *
 * Semantics are torchtitan's: torch.nn.utils.clip_grad_norm_(max_norm) then torch.optim.AdamW
 * (decoupled weight decay, single-tensor math) with weight decay on every parameter, as
 * torchtitan's build_optimizers gives it (decay_matrices_only: on params of rank >= 2 only, the
 * usual GPT recipe); see gt_ops.def (adamw) for the per-element formulas. The learning rate and the
 * bias corrections change every step, so they enter as a graph INPUT ("optim.scalars", filled by
 * gt_optim_scalars) and the graph itself is the same for every step.
 *
 * Names the appended graph uses (the trainer and the checkpoint pair inputs and outputs by them):
 *   OPT_STATE "optim.exp_avg.<fqn>", "optim.exp_avg_sq.<fqn>"   f32, the param's dims; zeros at
 *                                                               step 1, as torch's lazy init
 *   INPUT     "optim.scalars"                                   f32[3] = {lr, 1-beta1^t, 1-beta2^t}
 *   METRIC    "grad_norm"                                       f32 [], the pre-clip total norm
 *   PARAM_UPDATE "<fqn>", OPT_STATE_UPDATE "optim.exp_avg.<fqn>", "optim.exp_avg_sq.<fqn>"
 * Gradient accumulation (gt_optim_append_grad_accum): BUFFER "grad_accum.<fqn>" and its
 * BUFFER_UPDATE; with a mixture of experts also BUFFERs "moe_counts.<bias fqn>" and
 * "moe_counts.micro_batch" (gt_optim_append_moe_bias_update_accum). */
#ifndef GRAPHTRAIN_GT_OPTIM_H
#define GRAPHTRAIN_GT_OPTIM_H

#include "gt_graph.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    double beta1, beta2;    /* in [0, 1) */
    double eps;             /* >= 0 */
    double weight_decay;    /* >= 0; decoupled (p *= 1 - lr*wd), on every param (torchtitan's) */
    double max_norm;        /* clip the global L2 norm to this; <= 0 disables clipping (the norm is
                             * still computed and reported as the "grad_norm" metric) */
    const int *norm_groups; /* NULL, or per param the group of its term of the norm: the terms
                             * are summed per group, groups in order of first appearance (a
                             * sharded step sums the terms of one placement before a collective
                             * joins them) */
    bool decay_matrices_only; /* weight decay on params of rank >= 2 only */
} gt_adamw_config;

/* torchtitan's defaults: betas (0.9, 0.95), eps 1e-8, weight_decay 0.1, max_norm 1.0. */
gt_adamw_config gt_adamw_config_default(void);

#define GT_OPTIM_SCALARS_NAME "optim.scalars"
#define GT_OPTIM_EXP_AVG_PREFIX "optim.exp_avg."
#define GT_OPTIM_EXP_AVG_SQ_PREFIX "optim.exp_avg_sq."
#define GT_OPTIM_GRAD_NORM_NAME "grad_norm"
#define GT_OPTIM_GRAD_ACCUM_PREFIX "grad_accum."
#define GT_OPTIM_MOE_COUNTS_PREFIX "moe_counts."
#define GT_OPTIM_MOE_MICRO_NAME "moe_counts.micro_batch"

/* Appends clipping and one AdamW update per parameter to g. params[k] must be a PARAM input of g;
 * grads[k] a float value with that param's dims (a GRAD output's value, or an INPUT). Adds the
 * inputs and outputs listed above, in param order: both OPT_STATE inputs of every param, then
 * "optim.scalars"; the "grad_norm" METRIC, then per param its PARAM_UPDATE, exp_avg and exp_avg_sq
 * OPT_STATE_UPDATEs. GRAD outputs whose value is one of grads are removed: the step consumes its
 * gradients, and as outputs they would stay live to its end in full (f32) form while nothing
 * reads them. Nodes get phase optimizer; per-param nodes carry the param's fqn, the global
 * norm and clip nodes "optim.clip_grad_norm".
 *
 * Clipping, as torch.nn.utils.clip_grad_norm_ (norm_type 2): total = sqrt(sum_k sum_i g_k,i^2),
 * each sum of squares accumulated in double and the per-param sums added in param order (with
 * cfg->norm_groups: in param order within each group, then the groups' sums in group order);
 * clip = min(1, max_norm * (1 / (total + 1e-6))) in f32 (torch evaluates max_norm / x as
 * x.reciprocal() * max_norm). Errors (not a PARAM, dims differ, the state names already exist,
 * hyper-parameters out of range) name the param; nothing useful is left in g after an error. */
gt_status gt_optim_append_adamw(gt_graph *g, int n, const gt_value_id *params,
                                const gt_value_id *grads, const gt_adamw_config *cfg,
                                gt_error *err);

/* The "optim.scalars" input for optimizer step `step` (1-based: the first update is step 1) at
 * learning rate lr: {lr, 1 - beta1^step, 1 - beta2^step}, computed in double and rounded to f32.
 * step < 1 is a caller bug (GT_CHECK). */
void gt_optim_scalars(const gt_adamw_config *cfg, int64_t step, double lr, float out[3]);

/* Gradient accumulation, in the graph. For each k adds BUFFER "grad_accum.<fqn>" (f32, the param's
 * dims: the running sum, state kept between runs like a parameter) and replaces grads[k] by
 * grad_accum + grads[k] (phase backward; grads[k] cast to f32 first when it is not), which the
 * BUFFER_UPDATE output "grad_accum.<fqn>" returns. Each micro-batch's run carries the new sum into
 * the input for the next; the sums start at zeros, so they are ((g_1 + g_2) + g_3) + ..., the
 * order torch's .grad accumulation uses. The loss of each micro-batch must be divided by the
 * number of micro-batches before autodiff, as torchtitan rescales it. */
gt_status gt_optim_append_grad_accum(gt_graph *g, int n, const gt_value_id *params,
                                     gt_value_id *grads, gt_error *err);

/* Mixture-of-experts load balancing (torchtitan's _update_expert_bias, auxiliary-loss-free): for
 * each k, bias[k] a BUFFER input f32[E] and counts[k] the step's f32[E] routed-token counts,
 * appends (phase optimizer, tag "moe.bias_update", the bias's fqn)
 *   d = coeff·sign(mean(c) − c);  d −= mean(d);  bias' = bias + d
 * (means accumulated in double, rounded once: exact for counts below 2^53) and the BUFFER_UPDATE
 * output named as the bias that returns bias'. The update reads counts only, never the
 * backward, so remat cannot count a token twice. A step with gradient accumulation must pass
 * the counts summed over its micro-batches. n = 0 appends nothing. */
gt_status gt_optim_append_moe_bias_update(gt_graph *g, int n, const gt_value_id *bias,
                                          const gt_value_id *counts, double coeff, gt_error *err);

/* The same update under gradient accumulation (micro_batches >= 2 runs per step, the last the
 * whole graph): the counts are summed over the step's micro-batches into BUFFER
 * "moe_counts.<bias fqn>" (f32[E]; its BUFFER_UPDATE returns the running sum, so after a step it
 * holds that step's summed counts), and the bias moves once per step, from the sum. The step
 * graph's micro-batch part is everything the BUFFER_UPDATEs depend on, bias update included, so
 * the graph counts its own runs: BUFFER "moe_counts.micro_batch" (f32[1], the run's index within
 * its step, 0 .. A − 1, back to 0 after the last) restarts the sums in a step's first run and
 * lets the update through (d·1) only in its last; in the others the bias keeps its bits (d·0).
 * The counts are read by these sums only, never by the backward, so a recomputed forward cannot
 * count a token twice. All three are model buffers to the trainer (carried, checkpointed; the
 * index is 0 at every step boundary). n = 0 appends nothing. */
gt_status gt_optim_append_moe_bias_update_accum(gt_graph *g, int n, const gt_value_id *bias,
                                                const gt_value_id *counts, double coeff,
                                                int64_t micro_batches, gt_error *err);

/* The PARAM inputs of g in input order: writes up to max value ids to params and returns how many
 * PARAM inputs g has (call with max 0 to size the array). */
int gt_optim_find_params(const gt_graph *g, gt_value_id *params, int max);

#ifdef __cplusplus
}
#endif
#endif
