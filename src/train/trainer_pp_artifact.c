/* trainer_pp_artifact.c — the pipeline's per-stage programs in `graphtrain train`, compiled on one
 * rank under --compile.precompile_artifact_dir (issue 39; trainer_pp.h).
 *
 * The passes run in two scopes of one pipeline (gt_pass.h's gt_pass_scope): those that must see a
 * stage's forward and backward together (the memory policy and recomputation, CSE, DCE) on the
 * whole step graph before the stage split (gt_trainer_pp_compile_step), so that a stage's
 * backward parts recompute its forward as the one-rank step does; the local ones on each part's
 * graph (compile_part). The artifacts are the parts after both; a loading rank still runs the
 * whole-step passes, since its split of the step graph names the parts it loads.
 *
 * Without the option each pipeline rank builds its stages' part programs itself
 * (gt_pp_programs_build). With it, the parts' graphs are the artifacts: one file a stage part,
 * DIR/pp_stage<S>_<F|I|W>.graph, whose key is the run's options and mesh layout (those of
 * gt_train_artifact_key, the schedule among them) and the stage, the part and the micro-batches.
 * When DIR lacks stage 0's forward (every pipeline has one), world rank 0 builds every stage's
 * part graphs and saves them while the other ranks wait; then every rank loads its own stages'
 * and builds their programs from what it loaded, which must match the part it splits from its
 * step graph (gt_pp_programs_opts.loaded). A part that compiles without an artifact is an error
 * naming it, so a run either compiles on one rank or fails. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trainer_pp.h"

/* gt_pp_programs_opts.compile: the passes local to a part (every pass is exact); those that see
 * the whole step ran before the split (gt_trainer_pp_compile_step) */
static gt_status compile_part(gt_graph *g, void *user, gt_error *err)
{
    const gt_trainer *t = user;
    return gt_train_compile_graph_scope(t->cfg, &t->dist.layout, g, NULL, GT_PASS_SCOPE_PART, err);
}

gt_status gt_trainer_pp_compile_step(gt_trainer *t, gt_error *err)
{
    if (!t->pp->user->compile.enable) return GT_OK; /* node by node, as one rank runs it */
    /* one rank of the run writes the listings (every rank passes the same graph) */
    char *dump = t->cfg->compile.debug_graph_passes && gt_trainer_pp_writes(t) && t->dist.rank == 0
                     ? gt_train_join_path(t->cfg->job.dump_folder, "graph_passes_pipeline")
                     : NULL;
    gt_status st = gt_train_compile_graph_scope(t->cfg, &t->dist.layout, t->whole.g, dump,
                                                GT_PASS_SCOPE_WHOLE, err);
    free(dump);
    return st;
}

static void artifact_name(int32_t s, int p, char *buf, size_t n)
{
    snprintf(buf, n, "pp_stage%d_%s.graph", s, gt_pp_part_name((gt_pp_part)p));
}

/* The run's artifact key (gt_train_artifact_key), then `what` (key lines naming the artifact),
 * then the micro-batches. */
static char *key_of(const gt_trainer *t, const char *what)
{
    char *base = gt_train_artifact_key(t->pp->user, &t->dist.layout);
    size_t n = strlen(base) + strlen(what) + 64;
    char *key = gt_xmalloc(n);
    snprintf(key, n, "%s%spipeline.micro_batches = %d\n", base, what, t->pp->n_micro);
    free(base);
    return key;
}

static char *artifact_key(const gt_trainer *t, int32_t s, int p)
{
    char what[96];
    snprintf(what, sizeof what, "pipeline.stage = %d\npipeline.part = %s\n", s,
             gt_pp_part_name((gt_pp_part)p));
    return key_of(t, what);
}

/* World rank 0: every stage's part graphs, saved to dir. */
static gt_status compile_all(gt_trainer *t, const char *dir, gt_error *err)
{
    struct gt_trainer_pp *pp = t->pp;
    double t0 = gt_now_seconds();
    gt_pp_programs_opts o = {.graphs_only = true, .compile = compile_part, .compile_user = t};
    gt_pp_programs *all = NULL;
    GT_TRY(
        gt_pp_programs_build(t->whole.g, &t->binding, &pp->split, &pp->sched, -1, &o, &all, err));
    gt_status st = GT_OK;
    int saved = 0;
    for (int32_t s = 0; s < pp->layout.n_stages && st == GT_OK; s++)
        for (int p = GT_PP_PART_F; p <= GT_PP_PART_W && st == GT_OK; p++) {
            const gt_graph *pg = gt_pp_programs_graph(all, s, (gt_pp_part)p);
            if (!pg) continue;
            char name[64];
            artifact_name(s, p, name, sizeof name);
            char *key = artifact_key(t, s, p);
            st = gt_train_artifact_save(dir, name, key, pg, err);
            free(key);
            saved += st == GT_OK;
        }
    gt_pp_programs_free(all);
    if (st == GT_OK)
        gt_log(GT_LOG_INFO,
               "pipeline: compiled %d stage parts on rank 0 in %.3f s and saved them to %s", saved,
               gt_now_seconds() - t0, dir);
    return st;
}

/* This rank's stages' part graphs from dir (an entry stays NULL where there is no file). */
static gt_status load_mine(gt_trainer *t, const char *dir, gt_graph **loaded, gt_error *err)
{
    struct gt_trainer_pp *pp = t->pp;
    for (int32_t s = 0; s < pp->layout.n_stages; s++) {
        if (pp->sched.stage_rank[s] != pp->rank) continue;
        for (int p = GT_PP_PART_F; p <= GT_PP_PART_W; p++) {
            char name[64];
            artifact_name(s, p, name, sizeof name);
            if (!gt_train_artifact_exists(dir, name)) continue;
            char *key = artifact_key(t, s, p);
            gt_status st = gt_train_artifact_load(dir, name, key, &loaded[s * 3 + p], err);
            free(key);
            if (st != GT_OK) return st;
        }
    }
    return GT_OK;
}

/* Makes sure dir holds the run's artifacts: world rank 0 looks for `first` and, when it is not
 * there, makes them all with make() while the other ranks wait. A collective over the world. */
static gt_status ensure_artifacts(gt_trainer *t, const char *dir, const char *first,
                                  gt_status (*make)(gt_trainer *, const char *, gt_error *),
                                  gt_error *err)
{
    gt_train_dist wd = {.world = t->pp->world,
                        .rank = gt_comm_rank(t->pp->world),
                        .size = gt_comm_size(t->pp->world)};
    int64_t have = wd.rank == 0 ? gt_train_artifact_exists(dir, first) : 0;
    GT_TRY(gt_train_share_i64(&wd, &have, err));
    if (have) return GT_OK;
    gt_status st = wd.rank == 0 ? make(t, dir, err) : GT_OK;
    return gt_trainer_pp_agree(t, st, err); /* the other ranks wait here for rank 0's */
}

gt_status gt_trainer_pp_programs(gt_trainer *t, gt_comm *const *dims, gt_error *err)
{
    struct gt_trainer_pp *pp = t->pp;
    const char *dir = pp->user->compile.precompile_artifact_dir;
    if (!dir[0]) {
        gt_pp_programs_opts o = {.dim_comms = dims, .compile = compile_part, .compile_user = t};
        return gt_pp_programs_build(t->whole.g, &t->binding, &pp->split, &pp->sched, pp->rank, &o,
                                    &pp->programs, err);
    }
    char first[64];
    artifact_name(0, GT_PP_PART_F, first, sizeof first);
    GT_TRY(ensure_artifacts(t, dir, first, compile_all, err));
    gt_status st = GT_OK;
    int32_t n = pp->layout.n_stages * 3;
    gt_graph **loaded = gt_xcalloc((size_t)n, sizeof *loaded);
    double t0 = gt_now_seconds();
    st = load_mine(t, dir, loaded, err);
    gt_pp_programs_opts o = {
        .dim_comms = dims, .loaded = loaded, .compile = compile_part, .compile_user = t};
    if (st == GT_OK)
        st = gt_pp_programs_build(t->whole.g, &t->binding, &pp->split, &pp->sched, pp->rank, &o,
                                  &pp->programs, err);
    int from_file = 0;
    for (int32_t s = 0; st == GT_OK && s < pp->layout.n_stages; s++)
        for (int p = GT_PP_PART_F; st == GT_OK && p <= GT_PP_PART_W; p++) {
            const gt_pp_part_info *in = gt_pp_programs_info(pp->programs, s, (gt_pp_part)p);
            from_file += in->loaded;
            if (in->compiled && !in->loaded)
                st = gt_error_set(err, GT_ERR_INVALID,
                                  "compile.precompile_artifact_dir %s: no artifact for stage %d "
                                  "part %s, which this rank compiles (saved by a run of another "
                                  "layout?)",
                                  dir, s, gt_pp_part_name((gt_pp_part)p));
        }
    for (int32_t k = 0; k < n; k++)
        gt_graph_free(loaded[k]); /* those the build did not take */
    free(loaded);
    if (st == GT_OK && t->dist.rank == 0)
        gt_log(GT_LOG_INFO,
               "pipeline: loaded %d stage parts of rank %d from %s in %.3f s (not compiled here)",
               from_file, pp->rank, dir, gt_now_seconds() - t0);
    return st;
}

/* ---------------------------------------------------------------- the GPU: one artifact a rank */

/* Pipeline rank r's step as one graph (gt_pp_unroll: each micro-batch's tokens, labels and
 * positions inputs of their own), after the passes local to a part when `compile`. */
static gt_status unroll_rank(gt_trainer *t, int32_t r, bool compile, gt_pp_unrolled *u,
                             gt_error *err)
{
    const gt_graph *g = t->whole.g;
    uint8_t *per_micro = gt_xcalloc((size_t)g->n_inputs + 1, 1);
    for (int32_t k = 0; k < g->n_inputs; k++)
        per_micro[k] = gt_trainer_pp_batch_slot(g, k) >= 0;
    gt_status st = gt_pp_unroll(g, &t->pp->split, &t->pp->sched, r, per_micro, u, err);
    free(per_micro);
    if (st == GT_OK && compile) st = compile_part(u->g, t, err);
    return st;
}

static void step_artifact_name(int32_t r, char *buf, size_t n)
{
    snprintf(buf, n, "pp_rank%d_step.graph", r);
}

static char *step_artifact_key(const gt_trainer *t, int32_t r)
{
    char what[96];
    snprintf(what, sizeof what, "pipeline.rank = %d\npipeline.unrolled = true\n", r);
    return key_of(t, what);
}

/* World rank 0: every pipeline rank's unrolled, compiled step, saved to dir. */
static gt_status compile_steps(gt_trainer *t, const char *dir, gt_error *err)
{
    double t0 = gt_now_seconds();
    int32_t n = (int32_t)t->pp->user->parallelism.pipeline_parallel_degree;
    gt_status st = GT_OK;
    for (int32_t r = 0; r < n && st == GT_OK; r++) {
        gt_pp_unrolled u = {0};
        st = unroll_rank(t, r, true, &u, err);
        char name[64];
        step_artifact_name(r, name, sizeof name);
        char *key = step_artifact_key(t, r);
        if (st == GT_OK) st = gt_train_artifact_save(dir, name, key, u.g, err);
        free(key);
        gt_pp_unrolled_free(&u);
    }
    if (st == GT_OK)
        gt_log(GT_LOG_INFO,
               "pipeline: compiled the steps of %d ranks on rank 0 in %.3f s and saved them to %s",
               n, gt_now_seconds() - t0, dir);
    return st;
}

gt_status gt_trainer_pp_unrolled_step(gt_trainer *t, int32_t *unrolled_nodes, gt_error *err)
{
    struct gt_trainer_pp *pp = t->pp;
    const char *dir = pp->user->compile.precompile_artifact_dir;
    gt_pp_unrolled *u = &pp->unrolled;
    GT_TRY(unroll_rank(t, pp->rank, false, u, err)); /* its maps of inputs and outputs */
    *unrolled_nodes = u->g->n_nodes;
    if (!dir[0]) return pp->user->compile.enable ? compile_part(u->g, t, err) : GT_OK;
    char name[64];
    step_artifact_name(0, name, sizeof name);
    GT_TRY(ensure_artifacts(t, dir, name, compile_steps, err));
    double t0 = gt_now_seconds();
    step_artifact_name(pp->rank, name, sizeof name);
    if (!gt_train_artifact_exists(dir, name))
        return gt_error_set(err, GT_ERR_INVALID,
                            "compile.precompile_artifact_dir %s: no %s for pipeline rank %d "
                            "(saved by a run of another pipeline_parallel_degree?)",
                            dir, name, pp->rank);
    char *key = step_artifact_key(t, pp->rank);
    gt_graph *loaded = NULL;
    gt_status st = gt_train_artifact_load(dir, name, key, &loaded, err);
    free(key);
    if (st == GT_OK && !gt_graph_same_io(loaded, u->g))
        st = gt_error_set(err, GT_ERR_INVALID,
                          "compile.precompile_artifact_dir %s: %s has %d inputs and %d outputs; "
                          "pipeline rank %d's step has %d and %d (or other names or kinds)",
                          dir, name, loaded->n_inputs, loaded->n_outputs, pp->rank, u->g->n_inputs,
                          u->g->n_outputs);
    if (st != GT_OK) {
        gt_graph_free(loaded);
        return st;
    }
    gt_graph_free(u->g);
    u->g = loaded;
    if (t->dist.rank == 0)
        gt_log(GT_LOG_INFO, "pipeline: loaded rank %d's step from %s in %.3f s (not compiled here)",
               pp->rank, dir, gt_now_seconds() - t0);
    return GT_OK;
}
