/* step_graph.c — the step graph a training run executes: the model's forward and loss, autodiff,
 * clipping + AdamW (or, with gradient accumulation, the micro-batch graph) for the global batch;
 * with a mesh of more than one rank, parallelize (the SPMD graph every rank runs); then the pass
 * pipeline as the config's compile section says. Used by the trainer and by `graphtrain graph`.
 *
 * The global graph is exactly the one-rank graph of the global batch (local_batch_size x dp
 * sequences), so N ranks compute what one rank computes on that batch, up to the summation order
 * of the collectives. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graphtrain/gt_autodiff.h"
#include "graphtrain/gt_build.h"
#include "graphtrain/gt_optim.h"
#include "graphtrain/gt_pass.h"
#include "graphtrain/gt_program.h"
#include "graphtrain/gt_train.h"
#include "train_internal.h"

/* compile.memory_policy = budget: the budget is judged on the planned step arena. */
static gt_status measure_step_arena(const gt_graph *g, void *user, size_t *bytes, gt_error *err)
{
    gt_node_id *order = NULL;
    int32_t n = 0;
    gt_plan *plan = NULL;
    GT_TRY(gt_schedule_build(g, &order, &n, err));
    gt_status st = gt_plan_memory(g, user, order, n, NULL, &plan, err);
    free(order);
    if (st == GT_OK) *bytes = plan->arena_bytes[GT_ARENA_STEP];
    gt_plan_free(plan);
    return st;
}

/* The layout of `graphtrain graph` and of callers without ranks: rank 0, no launcher. */
static gt_status default_layout(const gt_config *cfg, gt_train_layout *layout, gt_error *err)
{
    return gt_train_layout_init(cfg, 0, 0, layout, err);
}

gt_status gt_train_build_graph(const gt_config *cfg, gt_graph *g, gt_model *model,
                               int64_t micro_batches, gt_error *err)
{
    gt_train_layout layout;
    GT_TRY(default_layout(cfg, &layout, err));
    return gt_train_build_graph_layout(cfg, &layout, g, model, micro_batches, err);
}

static gt_parallel_plan parallel_plan(const gt_config *cfg, const gt_train_layout *layout)
{
    return (gt_parallel_plan){
        .mesh = layout->mesh,
        .sequence_parallel = cfg->parallelism.enable_sequence_parallel,
        .fsdp_reshard_after_forward =
            cfg->parallelism.fsdp_reshard_after_forward != GT_CFG_RESHARD_NEVER,
        .fsdp_reshard_last = cfg->parallelism.fsdp_reshard_after_forward == GT_CFG_RESHARD_ALWAYS,
        .expert_parallel_degree = (int)cfg->parallelism.expert_parallel_degree,
        .expert_parallel_capacity_factor = cfg->parallelism.expert_parallel_capacity_factor,
    };
}

/* Per param (params[0..n), inputs of g), its clip-norm group: the set of mesh dims its placement
 * shards, so the norm sums the terms that parallelize makes partial over the same dims before
 * one all-reduce joins them (NULL on one rank: one group, the one-rank order). */
static gt_status norm_groups(const gt_config *cfg, const gt_train_layout *layout, const gt_graph *g,
                             int n, const gt_value_id *params, int **out, gt_error *err)
{
    *out = NULL;
    if (gt_mesh_world_size(&layout->mesh) == 1) return GT_OK;
    gt_parallel_plan plan = parallel_plan(cfg, layout);
    gt_placement(*place)[GT_MESH_MAX_DIMS] = gt_xcalloc((size_t)g->n_inputs + 1, sizeof *place);
    gt_status st = gt_parallel_input_layouts(&plan, g, place, err);
    int *group = gt_xcalloc((size_t)n + 1, sizeof *group);
    for (int32_t i = 0; st == GT_OK && i < g->n_inputs; i++)
        for (int k = 0; k < n; k++)
            if (params[k] == g->inputs[i].value)
                for (int d = 0; d < GT_MESH_NDIMS; d++)
                    group[k] |= (place[i][d].kind == GT_PLACE_SHARD) << d;
    free(place);
    if (st != GT_OK) {
        free(group);
        return st;
    }
    *out = group;
    return GT_OK;
}

gt_adamw_config gt_train_adamw_config(const gt_config *cfg)
{
    return (gt_adamw_config){.beta1 = cfg->optimizer.beta1,
                             .beta2 = cfg->optimizer.beta2,
                             .eps = cfg->optimizer.eps,
                             .weight_decay = cfg->optimizer.weight_decay,
                             .decay_matrices_only = cfg->optimizer.weight_decay_matrices_only,
                             .max_norm = cfg->training.max_norm};
}

/* Clipping and AdamW as cfg configures them, the norm's terms grouped per placement. */
static gt_status append_adamw(const gt_config *cfg, const gt_train_layout *layout, gt_graph *g,
                              int n, const gt_value_id *params, const gt_value_id *grads,
                              gt_error *err)
{
    gt_adamw_config a = gt_train_adamw_config(cfg);
    int *groups = NULL;
    gt_status st = norm_groups(cfg, layout, g, n, params, &groups, err);
    a.norm_groups = groups;
    if (st == GT_OK) st = gt_optim_append_adamw(g, n, params, grads, &a, err);
    free(groups);
    return st;
}

gt_status gt_train_parallelize(const gt_config *cfg, const gt_train_layout *layout, gt_graph *g,
                               gt_error *err)
{
    return gt_train_parallelize_explain(cfg, layout, g, NULL, NULL, err);
}

gt_status gt_train_parallelize_explain(const gt_config *cfg, const gt_train_layout *layout,
                                       gt_graph *g, FILE *explain, gt_autopar_cost *chosen,
                                       gt_error *err)
{
    if (gt_mesh_world_size(&layout->mesh) == 1) return GT_OK;
    gt_parallel_plan plan = parallel_plan(cfg, layout);
    gt_placement(*place)[GT_MESH_MAX_DIMS] = gt_xcalloc((size_t)g->n_inputs + 1, sizeof *place);
    gt_graph *spmd = NULL;
    gt_autopar_result *ap = NULL;
    gt_status st = gt_parallel_input_layouts(&plan, g, place, err);
    if (st == GT_OK && cfg->compile.enable_autoparallel) {
        st = gt_train_autoparallel(cfg, layout, g, &plan, &ap, err);
        if (st == GT_OK) memcpy(place, ap->layout, (size_t)g->n_inputs * sizeof *place);
        if (st == GT_OK) plan.sequence_parallel = ap->sequence_parallel;
    }
    if (st == GT_OK)
        st = gt_parallelize(g, &plan, (const gt_placement(*)[GT_MESH_MAX_DIMS])place, &spmd, err);
    free(place);
    if (ap && st == GT_OK && explain) gt_autopar_print(ap, spmd, explain);
    if (ap && chosen) *chosen = ap->cost;
    gt_autopar_free(ap);
    if (st != GT_OK) return st;
    /* the SPMD graph takes g's place: swap the contents (a graph is plain owned arrays) */
    gt_graph tmp = *g;
    *g = *spmd;
    *spmd = tmp;
    gt_graph_free(spmd);
    return GT_OK;
}

gt_status gt_train_model_config(const gt_config *cfg, gt_model_config *mc, gt_error *err)
{
    /* f32 master params and optimizer state either way; bf16 compute unless float32 is asked */
    gt_dtype compute =
        cfg->training.mixed_precision_param == GT_CFG_PRECISION_FLOAT32 ? GT_F32 : GT_BF16;
    GT_TRY(gt_model_config_init(cfg->model.name, cfg->model.flavor, compute, mc, err));
    mc->moe_force_load_balance = cfg->debug.moe_force_load_balance;
    const gt_cfg_ep_overlap *ep = &cfg->compile.ep_overlap;
    if (ep->enabled && ep->strategy == GT_CFG_EP_EAGER)
        mc->chunk = (gt_model_chunking){.enabled = true,
                                        .moe_only = !strcmp(ep->module_fqn, "layers.*.moe"),
                                        .seq = ep->chunk_dim == GT_CFG_EP_SEQ};
    /* the synthetic corpus has one document per sequence, where block-causal is causal bit for
     * bit: its graph needs no positions (and keeps cuDNN's attention, which takes no document
     * masks, on the GPU) */
    mc->block_causal = cfg->model.attn_mask_type == GT_CFG_ATTN_MASK_BLOCK_CAUSAL &&
                       cfg->training.dataset != GT_CFG_DATASET_SYNTHETIC;
    return GT_OK;
}

/* The data-parallel blocks of the global batch (the ranks that each hold a part of it). */
static int64_t chunk_groups(const gt_train_layout *layout)
{
    return (int64_t)layout->mesh.size[GT_MESH_DP_REPLICATE] * layout->mesh.size[GT_MESH_DP_SHARD];
}

/* With compile.debug_graph_passes, the forward graph's listing as DUMP_FOLDER/graph_passes/NAME
 * (the chunking pass's before and after). */
static gt_status dump_forward(const gt_config *cfg, const gt_graph *g, const char *name,
                              gt_error *err)
{
    if (!cfg->compile.debug_graph_passes) return GT_OK;
    char *dir = gt_train_join_path(cfg->job.dump_folder, "graph_passes");
    char *path = gt_train_join_path(dir, name);
    gt_status st = gt_make_dirs(dir, err);
    FILE *f = st == GT_OK ? fopen(path, "w") : NULL;
    if (st == GT_OK && !f)
        st = gt_error_set(err, GT_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
    if (f) {
        gt_graph_print(g, f);
        if (fclose(f) != 0)
            st = gt_error_set(err, GT_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
    }
    free(path);
    free(dir);
    return st;
}

/* compile.ep_overlap: the chunking pass over the forward graph (strategy graph), or a check that
 * the builder chunked something (strategy eager). The model's value ids follow the rewrite. */
static gt_status chunk_forward(const gt_config *cfg, const gt_train_layout *layout, gt_graph *g,
                               gt_model *model, gt_error *err)
{
    const gt_cfg_ep_overlap *ep = &cfg->compile.ep_overlap;
    if (!ep->enabled) return GT_OK;
    /* the step graph is the global one: with sequence parallelism its sequence holds every tp
     * rank's piece, so a chunk of it would be other ranks' tokens (its batch holds every
     * data-parallel rank's rows: those are cut rank by rank, chunk_groups) */
    if (ep->chunk_dim == GT_CFG_EP_SEQ && cfg->parallelism.enable_sequence_parallel &&
        layout->mesh.size[GT_MESH_TP] > 1)
        return gt_error_set(err, GT_ERR_UNSUPPORTED,
                            "compile.ep_overlap.chunk_dim = seq with "
                            "parallelism.enable_sequence_parallel: each rank holds a piece of the "
                            "sequence, so it cannot be cut in two chunks");
    if (model->n_moe == 0)
        return gt_error_set(err, GT_ERR_UNSUPPORTED,
                            "compile.ep_overlap.enabled: model %s (flavor %s) has no MoE block to "
                            "chunk",
                            cfg->model.name, cfg->model.flavor);
    /* each rank cuts its own micro-batch (or sequence) at n // 2: one row would leave chunk 0
     * empty, an overlap of nothing */
    bool seq = ep->chunk_dim == GT_CFG_EP_SEQ;
    int64_t rows = seq ? cfg->training.seq_len : cfg->training.local_batch_size;
    if (rows < 2)
        return gt_error_set(err, GT_ERR_INVALID,
                            "compile.ep_overlap.chunk_dim = %s: training.%s = %lld cannot be cut "
                            "in two chunks (at least 2)",
                            seq ? "seq" : "batch", seq ? "seq_len" : "local_batch_size",
                            (long long)rows);
    if (ep->strategy == GT_CFG_EP_EAGER) return GT_OK;
    gt_chunk_options o = {.moe_only = !strcmp(ep->module_fqn, "layers.*.moe"),
                          .seq = ep->chunk_dim == GT_CFG_EP_SEQ,
                          .early_grad = !ep->disable_early_grad_accumulation,
                          .groups = chunk_groups(layout)};
    int n = 4 + 2 * model->n_moe;
    gt_value_id *track = gt_xmalloc((size_t)n * sizeof *track);
    track[0] = model->tokens, track[1] = model->labels, track[2] = model->logits;
    track[3] = model->loss;
    for (int k = 0; k < model->n_moe; k++)
        track[4 + 2 * k] = model->moe_bias[k], track[5 + 2 * k] = model->moe_counts[k];
    gt_status st = dump_forward(cfg, g, "00-ep_chunk.before.txt", err);
    if (st == GT_OK) st = gt_pass_ep_chunk(g, &o, track, n, err);
    if (st == GT_OK) st = dump_forward(cfg, g, "00-ep_chunk.after.txt", err);
    model->tokens = track[0], model->labels = track[1], model->logits = track[2];
    model->loss = track[3];
    for (int k = 0; k < model->n_moe; k++)
        model->moe_bias[k] = track[4 + 2 * k], model->moe_counts[k] = track[5 + 2 * k];
    free(track);
    return st;
}

gt_status gt_train_build_model(const gt_config *cfg, gt_model *model, gt_error *err)
{
    gt_model_config mc;
    GT_TRY(gt_train_model_config(cfg, &mc, err));
    gt_graph *g = gt_graph_new();
    gt_status st = gt_model_build(g, &mc, model, err);
    gt_graph_free(g);
    return st;
}

gt_status gt_train_build_graph_layout(const gt_config *cfg, const gt_train_layout *layout,
                                      gt_graph *g, gt_model *model, int64_t micro_batches,
                                      gt_error *err)
{
    GT_TRY(gt_train_build_global_graph(cfg, layout, g, model, micro_batches, err));
    gt_autopar_cost chosen = {0};
    gt_status st = gt_train_parallelize_explain(cfg, layout, g, NULL, &chosen, err);
    if (st != GT_OK || !cfg->compile.enable) return st;
    gt_config compile_cfg; /* the autoparallel backend picks the memory policy and FSDP knobs */
    gt_train_autoparallel_compile_config(cfg, &chosen, &compile_cfg);
    char line[1024];
    if (gt_train_autoparallel_describe(cfg, &compile_cfg, &chosen, line, sizeof line))
        gt_log(GT_LOG_INFO, "%s", line);
    cfg = &compile_cfg;

    /* with compile.debug_graph_passes, listings, DOT and op-count diffs per pass go to
     * DUMP_FOLDER/graph_passes */
    char *dump = cfg->compile.debug_graph_passes
                     ? gt_train_join_path(cfg->job.dump_folder,
                                          micro_batches > 1 ? "graph_passes_micro" : "graph_passes")
                     : NULL;
    st = gt_train_compile_graph_layout(cfg, layout, g, dump, err);
    free(dump);
    return st;
}

gt_status gt_train_build_global_graph(const gt_config *cfg, const gt_train_layout *layout,
                                      gt_graph *g, gt_model *model, int64_t micro_batches,
                                      gt_error *err)
{
    gt_model_config mc;
    GT_TRY(gt_train_model_config(cfg, &mc, err));
    mc.chunk.groups = chunk_groups(layout); /* eager batch chunks: each rank's batch in two */
    GT_TRY(gt_model_build(g, &mc, model, err));
    GT_TRY(chunk_forward(cfg, layout, g, model, err));
    if (micro_batches > 1) {
        /* each micro-batch contributes loss / micro_batches: the step's loss is their sum */
        for (int k = 0; k < g->n_outputs; k++)
            if (g->outputs[k].kind == GT_OUT_LOSS) {
                gt_graph_set_fqn(g, "loss");
                g->outputs[k].value = gt_scale(g, g->outputs[k].value, 1.0 / (double)micro_batches);
                if (g->err.code != GT_OK) {
                    *err = g->err;
                    return err->code;
                }
            }
    }
    GT_TRY(gt_autodiff(g, err));
    int n = gt_optim_find_params(g, NULL, 0);
    gt_value_id *params = gt_xcalloc((size_t)n, sizeof *params);
    gt_value_id *grads = gt_xcalloc((size_t)n, sizeof *grads);
    gt_optim_find_params(g, params, n);
    int ng = 0;
    int *grad_out = gt_xcalloc((size_t)n, sizeof *grad_out);
    for (int k = 0; k < g->n_outputs && ng < n; k++)
        if (g->outputs[k].kind == GT_OUT_GRAD) grad_out[ng] = k, grads[ng++] = g->outputs[k].value;
    gt_status st =
        ng == n ? GT_OK : gt_error_set(err, GT_ERR_INTERNAL, "%d params but %d grads", n, ng);
    if (st == GT_OK && micro_batches > 1) {
        /* the running sums; the optimizer reads them (and consumes the GRAD outputs, moved onto
         * them) in the run of the last micro-batch: gt_graph_micro_part */
        st = gt_optim_append_grad_accum(g, n, params, grads, err);
        for (int k = 0; st == GT_OK && k < n; k++)
            g->outputs[grad_out[k]].value = grads[k];
    }
    if (st == GT_OK) st = append_adamw(cfg, layout, g, n, params, grads, err);
    /* MoE load balancing: the expert biases move after the optimizer, once per step, from the
     * step's counts (summed over its micro-batches under accumulation) */
    if (st == GT_OK && model->moe_bias_coeff > 0 && micro_batches <= 1)
        st = gt_optim_append_moe_bias_update(g, model->n_moe, model->moe_bias, model->moe_counts,
                                             model->moe_bias_coeff, err);
    else if (st == GT_OK && model->moe_bias_coeff > 0)
        st = gt_optim_append_moe_bias_update_accum(g, model->n_moe, model->moe_bias,
                                                   model->moe_counts, model->moe_bias_coeff,
                                                   micro_batches, err);
    free(params);
    free(grads);
    free(grad_out);
    return st;
}

gt_status gt_train_compile_graph(const gt_config *cfg, gt_graph *g, const char *dump_dir,
                                 gt_error *err)
{
    gt_train_layout layout;
    GT_TRY(default_layout(cfg, &layout, err));
    return gt_train_compile_graph_layout(cfg, &layout, g, dump_dir, err);
}

gt_status gt_train_compile_graph_layout(const gt_config *cfg, const gt_train_layout *layout,
                                        gt_graph *g, const char *dump_dir, gt_error *err)
{
    return gt_train_compile_graph_scope(cfg, layout, g, dump_dir, GT_PASS_SCOPE_ALL, err);
}

gt_status gt_train_compile_graph_scope(const gt_config *cfg, const gt_train_layout *layout,
                                       gt_graph *g, const char *dump_dir, gt_pass_scope scope,
                                       gt_error *err)
{
    /* the verifier runs after every pass in debug builds and when dumping; release builds verify
     * the result once, below */
#ifdef NDEBUG
    const bool debug_build = false;
#else
    const bool debug_build = true;
#endif
    gt_pass_options o = {.disable = cfg->compile.disable_passes.items,
                         .n_disable = cfg->compile.disable_passes.n,
                         .dump_dir = dump_dir,
                         .verify_each = debug_build || cfg->compile.debug_graph_passes,
                         .scope = scope};
    switch (cfg->compile.memory_policy) {
    case GT_CFG_MEMORY_FULL:
        o.memory_policy = GT_MEMORY_POLICY_FULL;
        break;
    case GT_CFG_MEMORY_DEFAULT:
        o.memory_policy = GT_MEMORY_POLICY_DEFAULT;
        break;
    case GT_CFG_MEMORY_BUDGET:
        o.memory_policy = GT_MEMORY_POLICY_BUDGET;
        break;
    default: /* none, eager: save everything */
        o.memory_policy = GT_MEMORY_POLICY_NONE;
        break;
    }
    /* the global batch and this rank's coordinates: what the program will be built under */
    gt_sym_binding_entry bind[GT_TRAIN_BINDING_MAX];
    gt_sym_binding binding;
    gt_train_binding(cfg, layout, bind, &binding);
    o.memory_budget_bytes = (int64_t)(cfg->compile.activation_memory_budget_gb * 1073741824.0);
    o.bucket_cap_bytes = (int64_t)(cfg->compile.fsdp_bucket_cap_mb * 1048576.0);
    o.gathers_unbucketed = cfg->compile.fsdp_gathers == GT_CFG_FSDP_GATHERS_GROUPED;
    o.fsdp_prefetch_depth = (int)cfg->compile.fsdp_prefetch_depth;
    o.binding = &binding;
    o.measure = measure_step_arena;
    o.measure_user = &binding;
    GT_TRY(gt_pass_run_pipeline(g, &o, NULL, err));
    return o.verify_each ? GT_OK : gt_graph_verify(g, err);
}
