/* trainer_pp.c — pipeline parallelism in the trainer (issue 39): the stage layout of a run from its
 * parallelism options and the report `graphtrain graph` prints for it (gt_train.h).
 *
 * The schedules themselves are data (src/runtime/pp_schedule.c); this file only reads the
 * options, names the one at fault, and prints. */
#include <stdio.h>
#include <stdlib.h>

#include "graphtrain/gt_pipeline.h"
#include "graphtrain/gt_pp_split.h"
#include "graphtrain/gt_train.h"

gt_status gt_train_pp_layout(const gt_config *cfg, const gt_model_config *mc, gt_pp_layout *out,
                             gt_error *err)
{
    const gt_cfg_parallelism *p = &cfg->parallelism;
    gt_model_info info;
    gt_model_info_of(mc, &info);
    return gt_pp_layout_init(
        p->pipeline_parallel_schedule, p->pipeline_parallel_degree, info.n_layers,
        p->pipeline_parallel_layers_per_stage, p->pipeline_parallel_first_stage_less_layers,
        p->pipeline_parallel_last_stage_less_layers, cfg->training.local_batch_size,
        p->pipeline_parallel_microbatch_size, out, err);
}

/* "tok_embeddings + layers 0..2", "layers 3..5 + norm, output", "norm, output" */
static void print_stage_modules(const gt_pp_layout *l, int32_t s, FILE *f)
{
    int64_t a = l->first_layer[s], b = l->first_layer[s + 1];
    const char *sep = "";
    if (s == 0) fprintf(f, "tok_embeddings"), sep = " + ";
    if (b > a + 1) fprintf(f, "%slayers %lld..%lld", sep, (long long)a, (long long)b - 1);
    if (b == a + 1) fprintf(f, "%slayers %lld", sep, (long long)a);
    if (b > a) sep = " + ";
    if (s == l->n_stages - 1) fprintf(f, "%snorm, output, loss", sep);
    if (s != 0 && s != l->n_stages - 1 && b == a) fprintf(f, "(no blocks)");
}

/* The stage split of the step graph: the one-rank graph with the layout's micro-batches of
 * accumulation after the passes that see the whole step (the graph each pipeline rank runs its
 * stages of), labelled by gt_pp_split_graph. */
static gt_status print_split(const gt_config *cfg, const gt_pp_layout *l, const gt_pp_schedule *s,
                             FILE *f, gt_error *err)
{
    gt_config one;
    gt_config_copy(&one, cfg);
    one.parallelism.pipeline_parallel_degree = 1;
    gt_train_layout layout;
    gt_graph *g = gt_graph_new();
    gt_model model = {0};
    gt_pp_split split = {0};
    gt_status st = gt_train_layout_init(&one, 0, 0, &layout, err);
    if (st == GT_OK) st = gt_train_build_global_graph(&one, &layout, g, &model, l->n_micro, err);
    /* the memory policy's recomputation decides what a stage saves (as the trainer splits) */
    if (st == GT_OK && one.compile.enable)
        st = gt_train_compile_graph_scope(&one, &layout, g, NULL, GT_PASS_SCOPE_WHOLE, err);
    if (st == GT_OK) st = gt_pp_split_graph(g, l->n_stages, l->first_layer, &split, err);
    if (st == GT_OK) {
        fprintf(f, "# step graph by stage (nodes; crossing values per micro-batch)\n");
        gt_pp_split_print(g, &split, f);
        /* the activations a rank holds at its peak: its stage micro-batches in flight */
        gt_sym_binding_entry entries[GT_TRAIN_BINDING_MAX];
        gt_sym_binding binding;
        gt_train_binding(&one, &layout, entries, &binding);
        int64_t *bytes = gt_xcalloc((size_t)l->n_stages, sizeof *bytes);
        int64_t *peak = gt_xcalloc((size_t)l->n_ranks, sizeof *peak);
        st = gt_pp_split_saved_bytes(g, &split, &binding, bytes, err);
        if (st == GT_OK) {
            gt_pp_schedule_peak_bytes(s, bytes, peak);
            fprintf(f, "saved per stage  ");
            for (int32_t i = 0; i < l->n_stages; i++)
                fprintf(f, "%s%.2f MiB", i ? ", " : "", (double)bytes[i] / (1 << 20));
            fprintf(f, " (one micro-batch, forward to backward)\npeak activations ");
            for (int32_t r = 0; r < l->n_ranks; r++)
                fprintf(f, "%srank %d %.2f MiB", r ? ", " : "", r, (double)peak[r] / (1 << 20));
            fprintf(f, " (by the schedule's micro-batches in flight)\n");
        }
        free(bytes);
        free(peak);
    }
    gt_pp_split_free(&split);
    gt_model_free(&model);
    gt_graph_free(g);
    gt_config_free(&one);
    return st;
}

gt_status gt_train_pp_print(const gt_config *cfg, const gt_model_config *mc, FILE *f, gt_error *err)
{
    gt_pp_layout l;
    GT_TRY(gt_train_pp_layout(cfg, mc, &l, err));
    gt_pp_schedule s;
    gt_pp_sim sim;
    gt_status st = gt_pp_schedule_build(l.kind, l.n_ranks, l.stages_per_rank, l.n_micro, &s, err);
    if (st != GT_OK) {
        gt_pp_layout_free(&l);
        return st;
    }
    st = gt_pp_schedule_simulate(&s, &sim, err);
    if (st != GT_OK) {
        gt_pp_schedule_free(&s);
        gt_pp_layout_free(&l);
        return gt_error_wrap(err, "schedule %s", gt_pp_schedule_name(l.kind));
    }
    fprintf(f,
            "# pipeline: %s, pipeline_parallel_degree %d, %d stages (%d per rank), %d "
            "micro-batches of %lld sequences\n",
            gt_pp_schedule_name(l.kind), l.n_ranks, l.n_stages, l.stages_per_rank, l.n_micro,
            (long long)cfg->parallelism.pipeline_parallel_microbatch_size);
    for (int32_t i = 0; i < l.n_stages; i++) {
        fprintf(f, "stage %-3d rank %-3d ", i, s.stage_rank[i]);
        print_stage_modules(&l, i, f);
        fputc('\n', f);
    }
    fprintf(f, "# schedule (STAGE KIND MICROBATCH; F forward, B backward, I input gradient, "
               "W weight gradient)\n");
    for (int32_t r = 0; r < s.n_ranks; r++)
        gt_pp_schedule_print_rank(&s, r, false, f);
    fprintf(f,
            "bubble           %.3f of %lld time units (simulated: F = I = W = 1, B = 2); by rank",
            sim.bubble, (long long)sim.makespan);
    for (int32_t r = 0; r < s.n_ranks; r++)
        fprintf(f, " %.3f", sim.rank_bubble[r]);
    fprintf(f, "\nin flight        peak %d stage micro-batches' activations held; by rank",
            sim.max_in_flight);
    for (int32_t r = 0; r < s.n_ranks; r++)
        fprintf(f, " %d", sim.peak_in_flight[r]);
    fputc('\n', f);
    st = print_split(cfg, &l, &s, f, err);
    gt_pp_sim_free(&sim);
    gt_pp_schedule_free(&s);
    gt_pp_layout_free(&l);
    return st;
}
