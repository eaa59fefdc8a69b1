/* trainer_pp_run.c — the pipeline-parallel training step of `graphtrain train` (issue 39;
 * trainer_pp.h says how it sits in the trainer).
 *
 * Why the one-rank accumulation config: the pipeline's micro-batches are the accumulation's. With
 * local_batch_size B, pipeline_parallel_microbatch_size b and global_batch_size G (B when unset),
 * a step is G / b micro-batches of b sequences, drawn in order from the same loader as a run of
 * local_batch_size b and global_batch_size G on one rank: the same graph (built for G / b
 * micro-batches: the loss of each divided by their number, the gradients summed into
 * grad_accum.<fqn> in micro-batch order), the same data, the same checkpoints.
 * gt_pp_eager_step_spmd runs that graph's nodes as the schedule orders them and keeps the sums in
 * micro-batch order, so losses, grad norm and parameters are bitwise the one-rank run's. With
 * other mesh dims (dp_replicate, dp_shard, tp, and ep inside dp_shard x tp) the same holds for
 * their SPMD graph: parallelize's graph for G / b micro-batches of b sequences a data-parallel
 * rank, whose collectives (the experts' all-to-alls among them) the runner starts on the mesh's
 * communicators in the schedule's order, the same on every rank of a mesh.
 *
 * The losses live on the rank of the last stage and are broadcast after the step (every rank
 * returns the same figure, rank 0 logs it); the gradient norm every rank computes from the
 * stages' partial sums, gathered in stage order by the runner. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trainer_pp.h"

static const char *const batch_names[3] = {"tokens", "labels", "positions"};

gt_status gt_trainer_pp_begin(gt_trainer *t, const gt_config *cfg, gt_error *err)
{
    const gt_cfg_parallelism *p = &cfg->parallelism;
    if (cfg->compile.precompile_artifact_dir[0] && !cfg->compile.enable)
        return gt_error_set(err, GT_ERR_INVALID,
                            "compile.precompile_artifact_dir with pipeline_parallel_degree = %lld "
                            "and compile.enable = false: the artifacts are the stages' programs; "
                            "enable compile or drop the directory",
                            (long long)p->pipeline_parallel_degree);
    if (cfg->compile.enable_autoparallel)
        return gt_error_set(err, GT_ERR_UNSUPPORTED,
                            "compile.enable_autoparallel with pipeline_parallel_degree = %lld: not "
                            "supported yet",
                            (long long)p->pipeline_parallel_degree);
    int64_t local = cfg->training.local_batch_size;
    if (cfg->training.global_batch_size >= 0 && local >= 1 &&
        cfg->training.global_batch_size % local != 0)
        return gt_error_set(err, GT_ERR_INVALID,
                            "training.global_batch_size = %lld must be a multiple of "
                            "local_batch_size = %lld (each local batch is one pass of the "
                            "pipeline)",
                            (long long)cfg->training.global_batch_size, (long long)local);
    gt_model_config mc;
    GT_TRY(gt_train_model_config(cfg, &mc, err));
    struct gt_trainer_pp *pp = gt_xcalloc(1, sizeof *pp);
    t->pp = pp;
    pp->user = cfg;
    gt_config_copy(&pp->one, cfg);
    /* the options, checked before any rank starts: the layout, and the schedule of one local
     * batch (a step with accumulation runs a multiple of its micro-batches: built in
     * gt_trainer_pp_build) */
    GT_TRY(gt_train_pp_layout(cfg, &mc, &pp->layout, err));
    gt_pp_schedule probe;
    GT_TRY(gt_pp_schedule_build(pp->layout.kind, pp->layout.n_ranks, pp->layout.stages_per_rank,
                                pp->layout.n_micro, &probe, err));
    gt_pp_schedule_free(&probe);
    gt_config *one = &pp->one;
    one->parallelism.pipeline_parallel_degree = 1;
    one->training.local_batch_size = p->pipeline_parallel_microbatch_size;
    t->cfg = one;
    return GT_OK;
}

/* World rank r is pipeline rank r / M at rank r % M of its mesh (M = the world over the degree:
 * pp is the outermost dim). The mesh's communicator and its dims' (split as gt_train_dist_init
 * splits them) go into t->dist; the pipeline's (the ranks of the same mesh rank) into pp->comm. */
gt_status gt_trainer_pp_dist_init(gt_trainer *t, gt_error *err)
{
    struct gt_trainer_pp *pp = t->pp;
    gt_train_dist *d = &t->dist;
    memset(d, 0, sizeof *d);
    d->size = 1;
    int degree = pp->layout.n_ranks;
    if (gt_train_launched_by_mpi()) {
        if (!gt_comm_mpi_available())
            return gt_error_set(err, GT_ERR_UNSUPPORTED,
                                "started by an MPI launcher (mpirun), but this graphtrain was "
                                "built without MPI (install libopenmpi-dev and reconfigure)");
        GT_TRY(gt_comm_mpi_world(NULL, NULL, &pp->world, err));
    } else if (gt_train_launched_by_env()) {
        /* torchrun-style, as gt_train_dist_init: the TCP world, whose point-to-point carries the
         * stages' activations and gradients */
        GT_TRY(gt_comm_tcp_world(t->cfg->comm.init_timeout_seconds, &pp->world, err));
    } else {
        return gt_error_set(err, GT_ERR_INVALID,
                            "parallelism.pipeline_parallel_degree = %d: launch one process per "
                            "rank, under MPI (`mpirun -np N graphtrain train ...`) or torchrun-"
                            "style (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set), N = %d x the "
                            "other degrees",
                            degree, degree);
    }
    /* the communicators split from it below inherit it */
    gt_comm_set_timeout(pp->world, t->cfg->comm.init_timeout_seconds);
    int world = gt_comm_size(pp->world), me = gt_comm_rank(pp->world);
    if (world % degree != 0)
        return gt_error_set(err, GT_ERR_INVALID,
                            "parallelism.pipeline_parallel_degree = %d but %d process%s launched, "
                            "not a multiple of it: `mpirun -np N graphtrain train ...`, N = %d x "
                            "the other degrees",
                            degree, world, world == 1 ? " was" : "es were", degree);
    int inner = world / degree;
    const gt_cfg_parallelism *up = &pp->user->parallelism;
    int64_t mesh_ranks = up->data_parallel_replicate_degree * up->tensor_parallel_degree *
                         (up->data_parallel_shard_degree > 0 ? up->data_parallel_shard_degree : 1);
    if ((up->data_parallel_shard_degree > 0 && mesh_ranks != inner) || inner % mesh_ranks != 0)
        return gt_error_set(
            err, GT_ERR_INVALID,
            "parallelism: pipeline_parallel_degree %d x data_parallel_replicate "
            "%lld x data_parallel_shard %lld x tensor_parallel %lld do not make the "
            "%d processes launched: `mpirun -np %lld graphtrain train ...` (or "
            "change the degrees)",
            degree, (long long)up->data_parallel_replicate_degree,
            (long long)up->data_parallel_shard_degree, (long long)up->tensor_parallel_degree, world,
            (long long)(degree * mesh_ranks));
    if (t->cfg->training.device == GT_CFG_DEVICE_CUDA && inner > 1)
        return gt_error_set(err, GT_ERR_UNSUPPORTED,
                            "parallelism.pipeline_parallel_degree = %d over %d processes on the "
                            "GPU: GPU pipelines run pp alone for now (the other degrees 1, one "
                            "process per pipeline rank)",
                            degree, world);
    pp->rank = me / inner;
    /* ranks launched with other options would run other schedules */
    gt_train_dist wd = {.world = pp->world, .rank = me, .size = world};
    gt_status st = gt_train_check_config(&wd, pp->user, err);
    d->error_agreed = wd.error_agreed;
    if (st != GT_OK) return st;
    GT_TRY(gt_comm_split(pp->world, pp->rank, me % inner, &d->world, err));
    GT_TRY(gt_comm_split(pp->world, me % inner, pp->rank, &pp->comm, err));
    snprintf(pp->comm->name, sizeof pp->comm->name, "pp/group %d", me % inner);
    d->rank = gt_comm_rank(d->world);
    d->size = gt_comm_size(d->world);
    st = gt_train_layout_init(t->cfg, d->size, d->rank, &d->layout, err);
    if (st != GT_OK)
        return gt_error_wrap(err,
                             "parallelism.pipeline_parallel_degree = %d of %d processes leaves %d "
                             "for the other dims",
                             degree, world, inner);
    /* the global batch: local_batch_size x the data-parallel degree unless set */
    const gt_mesh *mesh = &d->layout.mesh;
    int64_t dp = (int64_t)mesh->size[GT_MESH_DP_REPLICATE] * mesh->size[GT_MESH_DP_SHARD];
    if (pp->user->training.global_batch_size < 0)
        pp->one.training.global_batch_size = pp->user->training.local_batch_size * dp;
    if (!gt_train_dist_multi(d)) return GT_OK;
    return gt_train_dist_dim_comms(d, err);
}

gt_status gt_trainer_pp_agree(gt_trainer *t, gt_status st, gt_error *err)
{
    if (!t->pp || !t->pp->world) return st;
    gt_train_dist wd = {.world = t->pp->world,
                        .rank = gt_comm_rank(t->pp->world),
                        .size = gt_comm_size(t->pp->world)};
    st = gt_train_agree(&wd, st, err);
    t->dist.error_agreed |= wd.error_agreed;
    return st;
}

const gt_config *gt_trainer_pp_user_config(const gt_trainer *t)
{
    return t->pp ? t->pp->user : t->cfg;
}

bool gt_trainer_pp_writes(const gt_trainer *t)
{
    return !t->pp || t->pp->rank == 0;
}

/* What a step costs a rank: the collectives it starts and those an earlier result serves (an
 * FSDP gather runs once a step), and the bytes of step values it holds at most (each is freed
 * after its last read) against all it computes, and the arena its values are placed in. */
static void format_stats(const gt_pp_step_stats *s, char *text, size_t size)
{
    snprintf(text, size,
             "%lld collectives started (%lld all-gathers), %lld more served by an earlier "
             "micro-batch's or node's result; step values held at most %lld B (%.2f MiB) over "
             "the schedule's actions, %lld B (%.2f MiB) with the optimizer's, of %lld B (%.2f "
             "MiB) computed; one arena of %lld B (%.2f MiB) places them",
             (long long)s->collectives, (long long)s->gathers, (long long)s->collectives_reused,
             (long long)s->actions_peak_bytes, (double)s->actions_peak_bytes / (1 << 20),
             (long long)s->peak_bytes, (double)s->peak_bytes / (1 << 20),
             (long long)s->allocated_bytes, (double)s->allocated_bytes / (1 << 20),
             (long long)s->arena_bytes, (double)s->arena_bytes / (1 << 20));
}

/* compile.enable: this rank's stages' F, I and W parts as programs (gt_pp_programs), each with
 * its memory plan, said before step 1 by the rank's first mesh rank: the plan's peak and arenas,
 * and what the program allocated for them, which must be the plan's. */
static gt_status build_programs(gt_trainer *t, gt_error *err)
{
    struct gt_trainer_pp *pp = t->pp;
    gt_comm *const *dims = gt_train_dist_multi(&t->dist) ? t->dist.dim_comm : NULL;
    GT_TRY(gt_trainer_pp_programs(t, dims, err));
    for (int32_t s = 0; s < pp->layout.n_stages; s++) {
        if (pp->sched.stage_rank[s] != pp->rank) continue;
        for (int p = GT_PP_PART_F; p <= GT_PP_PART_W; p++) {
            const gt_pp_part_info *in = gt_pp_programs_info(pp->programs, s, (gt_pp_part)p);
            if (in->compiled && in->planned_bytes != in->allocated_bytes)
                return gt_error_set(err, GT_ERR_INTERNAL,
                                    "pipeline: stage %d's %s program planned %lld B of arenas "
                                    "but allocated %lld B",
                                    s, gt_pp_part_name((gt_pp_part)p), (long long)in->planned_bytes,
                                    (long long)in->allocated_bytes);
            if (t->dist.rank != 0) continue;
            if (!in->compiled)
                gt_log(GT_LOG_INFO,
                       "pipeline program rank %d stage %d %s: %d nodes, node by node "
                       "(%s)",
                       pp->rank, s, gt_pp_part_name((gt_pp_part)p), in->n_nodes, in->why);
            else
                gt_log(GT_LOG_INFO,
                       "pipeline program rank %d stage %d %s: %d nodes (%d run once a step "
                       "outside it), %d after the passes, %d collectives, %d inputs, %d "
                       "outputs; memory plan peak %lld B (%.2f MiB), arenas planned %lld B, "
                       "allocated %lld B",
                       pp->rank, s, gt_pp_part_name((gt_pp_part)p), in->n_nodes, in->n_invariant,
                       in->n_program_nodes, in->n_collectives, in->n_in, in->n_out,
                       (long long)in->live_peak_bytes, (double)in->live_peak_bytes / (1 << 20),
                       (long long)in->planned_bytes, (long long)in->allocated_bytes);
        }
    }
    return GT_OK;
}

/* The pipeline's line: its stages and what the schedule costs (simulated bubble, the peak of
 * saved activations per rank, from the stage split of this graph). */
static gt_status log_pipeline(gt_trainer *t, gt_error *err)
{
    struct gt_trainer_pp *pp = t->pp;
    const gt_pp_layout *l = &pp->layout;
    gt_pp_sim sim;
    GT_TRY(gt_pp_schedule_simulate(&pp->sched, &sim, err));
    int64_t *bytes = gt_xcalloc((size_t)l->n_stages, sizeof *bytes);
    int64_t *peak = gt_xcalloc((size_t)l->n_ranks, sizeof *peak);
    gt_status st = gt_pp_split_saved_bytes(t->whole.g, &pp->split, &t->binding, bytes, err);
    if (st == GT_OK) {
        gt_pp_schedule_peak_bytes(&pp->sched, bytes, peak);
        char text[512];
        int n = snprintf(text, sizeof text, "pipeline: %s over %d ranks, %d stages (blocks",
                         gt_pp_schedule_name(l->kind), l->n_ranks, l->n_stages);
        for (int32_t s = 0; s < l->n_stages && n < (int)sizeof text; s++)
            n += snprintf(text + n, sizeof text - (size_t)n, "%s%lld..%lld on rank %d",
                          s ? ", " : " ", (long long)l->first_layer[s],
                          (long long)l->first_layer[s + 1] - 1, pp->sched.stage_rank[s]);
        if (n < (int)sizeof text)
            n += snprintf(text + n, sizeof text - (size_t)n,
                          "), %d micro-batches; simulated bubble %.3f; peak saved activations",
                          pp->n_micro, sim.bubble);
        for (int32_t r = 0; r < l->n_ranks && n < (int)sizeof text; r++)
            n += snprintf(text + n, sizeof text - (size_t)n, "%s rank %d %.2f MiB", r ? "," : "", r,
                          (double)peak[r] / (1 << 20));
        gt_log(GT_LOG_INFO, "%s", text);
    }
    free(bytes);
    free(peak);
    gt_pp_sim_free(&sim);
    /* this rank's step, planned on sizes alone: what step 1 will start and hold (on the GPU the
     * program's memory plan, logged when it was built, says it) */
    gt_pp_step_stats plan;
    if (st == GT_OK && !pp->ex)
        st = gt_pp_step_plan_programs(t->whole.g, &t->binding, &pp->split, &pp->sched, 0,
                                      pp->programs, &plan, err);
    if (st == GT_OK && !pp->ex) {
        char text[512];
        format_stats(&plan, text, sizeof text);
        gt_log(GT_LOG_INFO, "pipeline step plan on rank 0: %s", text);
    }
    return st;
}

void gt_trainer_pp_set_timeout(gt_trainer *t, double seconds)
{
    gt_comm_set_timeout(t->pp->world, seconds);
    gt_comm_set_timeout(t->pp->comm, seconds);
}

gt_status gt_trainer_pp_build(gt_trainer *t, gt_error *err)
{
    struct gt_trainer_pp *pp = t->pp;
    int64_t local = pp->user->training.local_batch_size;
    int64_t dp = t->global_batch / t->cfg->training.local_batch_size;
    if (pp->user->training.global_batch_size >= 0 &&
        pp->user->training.global_batch_size % (local * dp) != 0)
        return gt_error_set(err, GT_ERR_INVALID,
                            "training.global_batch_size = %lld must be a multiple of "
                            "local_batch_size x data-parallel degree = %lld",
                            (long long)pp->user->training.global_batch_size,
                            (long long)(local * dp));
    if (t->accum > (1 << 20))
        return gt_error_set(err, GT_ERR_INVALID,
                            "training.global_batch_size: %lld micro-batches a step, at most 2^20",
                            (long long)t->accum);
    pp->n_micro = (int32_t)t->accum;
    GT_TRY(gt_pp_schedule_build(pp->layout.kind, pp->layout.n_ranks, pp->layout.stages_per_rank,
                                pp->n_micro, &pp->sched, err));
    pp->sched_built = true;
    /* the one-rank graph, parallelized over this rank's mesh (its stages' collectives included),
     * with the passes that see the whole step (recomputation) before the split; the parts get
     * the others */
    t->whole.g = gt_graph_new();
    GT_TRY(
        gt_train_build_global_graph(t->cfg, &t->dist.layout, t->whole.g, &t->model, t->accum, err));
    GT_TRY(gt_train_parallelize(t->cfg, &t->dist.layout, t->whole.g, err));
    GT_TRY(gt_trainer_pp_compile_step(t, err));
    const gt_graph *g = t->whole.g;
    GT_TRY(gt_pp_split_graph(g, pp->layout.n_stages, pp->layout.first_layer, &pp->split, err));
    pp->split_built = true;
    pp->owner = gt_xmalloc(((size_t)g->n_inputs + 1) * sizeof *pp->owner);
    for (int32_t k = 0; k < g->n_inputs; k++)
        pp->owner[k] = -1;
    pp->loss_output = -1;
    for (int32_t k = 0; k < g->n_outputs; k++) {
        if (g->outputs[k].kind == GT_OUT_LOSS) pp->loss_output = k;
        int32_t in = gt_program_state_input(g, k);
        gt_node_id p = g->values[g->outputs[k].value].producer;
        if (in < 0 || p == GT_NONE || gt_train_is_grad_sum(&g->inputs[in])) continue;
        int32_t st = pp->split.stage[p];
        if (st != GT_PP_STAGE_GLOBAL) pp->owner[in] = pp->sched.stage_rank[st];
    }
    if (pp->loss_output < 0)
        return gt_error_set(err, GT_ERR_INTERNAL, "pipeline: the step graph has no LOSS output");
    int32_t M = pp->n_micro;
    pp->inputs = gt_xcalloc((size_t)M, sizeof *pp->inputs);
    pp->batch = gt_xcalloc((size_t)M * 3, sizeof *pp->batch);
    pp->losses = gt_xcalloc((size_t)M, sizeof *pp->losses);
    pp->outputs = gt_xcalloc((size_t)g->n_outputs + 1, sizeof *pp->outputs);
    pp->n_outputs = g->n_outputs;
    for (int32_t m = 0; m < M; m++)
        pp->inputs[m] = gt_xcalloc((size_t)g->n_inputs + 1, sizeof **pp->inputs);
    if (t->cuda) {
        GT_TRY(gt_trainer_pp_device_build(t, err));
    } else if (pp->user->compile.enable) {
        GT_TRY(build_programs(t, err));
    }
    return pp->rank == 0 ? log_pipeline(t, err) : GT_OK;
}

int gt_trainer_pp_batch_slot(const gt_graph *g, int32_t k)
{
    if (g->inputs[k].kind != GT_IN_INPUT) return -1;
    for (int j = 0; j < 3; j++)
        if (!strcmp(gt_graph_str(g, g->inputs[k].fqn), batch_names[j])) return j;
    return -1;
}

static gt_tensor *batch_source(gt_trainer *t, int j)
{
    return j == 0 ? &t->tokens : j == 1 ? &t->labels : &t->positions;
}

static gt_status finish_step(gt_trainer *t, int64_t step, gt_status st, double norm, double *loss,
                             double *grad_norm, gt_error *err);

gt_status gt_trainer_pp_step(gt_trainer *t, int64_t step, double *loss, double *grad_norm,
                             double *lr, gt_error *err)
{
    struct gt_trainer_pp *pp = t->pp;
    const gt_graph *g = t->whole.g;
    int32_t M = pp->n_micro;
    *lr = gt_lr_at(&t->lr, step);
    gt_optim_scalars(&t->adamw, step, *lr, (float *)t->scalars.data);
    /* the running sums start at zero (the runner reads micro-batch 0's from the inputs; on the
     * GPU the executor zeroes its own) */
    for (int32_t k = 0; !pp->ex && k < g->n_inputs; k++)
        if (gt_train_is_grad_sum(&g->inputs[k]) && t->whole.feed[k]->data) /* this rank's */
            memset(t->whole.feed[k]->data, 0, gt_tensor_nbytes(t->whole.feed[k]));
    for (int32_t m = 0; m < M; m++) {
        GT_TRY(gt_trainer_next_batch(t, err));
        for (int32_t k = 0; k < g->n_inputs; k++) {
            int j = gt_trainer_pp_batch_slot(g, k);
            if (j < 0) {
                pp->inputs[m][k] = *t->whole.feed[k];
                pp->inputs[m][k].owns_data = false;
                continue;
            }
            const gt_tensor *src = batch_source(t, j);
            gt_tensor *dst = &pp->batch[3 * m + j];
            if (!dst->data) GT_TRY(gt_tensor_alloc(dst, src->dtype, src->ndim, src->shape, err));
            memcpy(dst->data, src->data, gt_tensor_nbytes(src));
            pp->inputs[m][k] = *dst;
            pp->inputs[m][k].owns_data = false;
        }
    }
    double norm = 0;
    gt_status st = GT_OK;
    if (pp->ex) { /* the GPU: the state stays in the executor */
        st = gt_trainer_pp_device_step(t, &norm, err);
        return finish_step(t, step, st, norm, loss, grad_norm, err);
    }
    const gt_tensor **in = gt_xcalloc((size_t)M, sizeof *in);
    for (int32_t m = 0; m < M; m++)
        in[m] = pp->inputs[m];
    /* an update lands in the state it updates, which the step reads no more once it hands its
     * outputs over: a view of it, not bytes allocated, paged in and copied again each step */
    for (int32_t k = 0; k < g->n_outputs; k++) {
        int32_t i = gt_program_state_input(g, k);
        if (i < 0 || gt_train_is_grad_sum(&g->inputs[i])) continue;
        gt_tensor_free(&pp->outputs[k]);
        pp->outputs[k] = *t->whole.feed[i]; /* no storage: another rank's stage */
        pp->outputs[k].owns_data = false;
    }
    gt_comm *const *dims = gt_train_dist_multi(&t->dist) ? t->dist.dim_comm : NULL;
    gt_pp_step_stats stats;
    st =
        gt_pp_step_programs_kept(g, &t->binding, &pp->split, &pp->sched, pp->comm, dims,
                                 pp->programs, in, pp->losses, pp->outputs, &stats, &pp->keep, err);
    free(in);
    /* once: the step as run, to set against the plan logged before step 1 */
    if (st == GT_OK && !pp->stats_logged && pp->rank == 0 && t->dist.rank == 0) {
        char text[512];
        format_stats(&stats, text, sizeof text);
        gt_log(GT_LOG_INFO, "pipeline step %lld on rank 0: %s", (long long)step, text);
    }
    pp->stats_logged = true;
    /* the gradient norm; this rank's stages' updates are in the host state already (the views
     * above), unless the runner's value did not fit its state */
    for (int32_t k = 0; st == GT_OK && k < g->n_outputs; k++) {
        const gt_tensor *out = &pp->outputs[k];
        if (gt_train_is_grad_norm(g, k) && out->data) norm = gt_tensor_get_f32(out, 0);
        int32_t i = gt_program_state_input(g, k);
        if (i < 0 || !out->data || gt_train_is_grad_sum(&g->inputs[i])) continue;
        const gt_tensor *dst = t->whole.feed[i];
        if (out->data != dst->data)
            st = gt_error_set(err, GT_ERR_INTERNAL,
                              "pipeline: the update %s (%zu B) does not fit its state (%zu B)",
                              gt_graph_str(g, g->outputs[k].fqn), gt_tensor_nbytes(out),
                              gt_tensor_nbytes(dst));
    }
    return finish_step(t, step, st, norm, loss, grad_norm, err);
}

gt_status gt_trainer_pp_loss_alloc(gt_trainer *t, gt_tensor *l, gt_error *err)
{
    const gt_graph *g = t->whole.g;
    gt_value_id v = g->outputs[t->pp->loss_output].value;
    const gt_type *ty = gt_value_type(g, v);
    int64_t shape[GT_MAX_DIMS];
    GT_TRY(gt_graph_eval_shape(g, v, &t->binding, shape, err));
    return gt_tensor_alloc(l, ty->dtype, ty->ndim, shape, err);
}

/* The step's end on every rank: the losses from the last stage's rank, summed in micro-batch
 * order as the one-rank trainer sums them. */
static gt_status finish_step(gt_trainer *t, int64_t step, gt_status st, double norm, double *loss,
                             double *grad_norm, gt_error *err)
{
    struct gt_trainer_pp *pp = t->pp;
    int32_t M = pp->n_micro;
    int root = pp->sched.stage_rank[pp->sched.n_stages - 1];
    double sum = 0;
    for (int32_t m = 0; st == GT_OK && m < M; m++) {
        gt_tensor *l = &pp->losses[m];
        if (pp->rank != root) st = gt_trainer_pp_loss_alloc(t, l, err);
        if (st == GT_OK) st = gt_comm_broadcast(pp->comm, l, root, err);
        if (st == GT_OK) sum += gt_tensor_get_f32(l, 0);
    }
    for (int32_t m = 0; m < M; m++)
        gt_tensor_free(&pp->losses[m]);
    if (st != GT_OK)
        return gt_error_wrap(err, "pipeline rank %d, step %lld", pp->rank, (long long)step);
    *loss = sum;
    *grad_norm = norm;
    return GT_OK;
}

void gt_trainer_pp_free(gt_trainer *t)
{
    struct gt_trainer_pp *pp = t->pp;
    if (!pp) return;
    for (int32_t m = 0; pp->inputs && m < pp->n_micro; m++)
        free(pp->inputs[m]);
    for (int32_t j = 0; pp->batch && j < 3 * pp->n_micro; j++)
        gt_tensor_free(&pp->batch[j]);
    free(pp->inputs);
    free(pp->batch);
    free(pp->losses);
    for (int32_t k = 0; pp->outputs && k < pp->n_outputs; k++)
        gt_tensor_free(&pp->outputs[k]);
    free(pp->outputs);
    gt_pp_step_keep_free(pp->keep);
    free(pp->owner);
    free(pp->param_owner);
    gt_pp_programs_free(pp->programs);
    gt_trainer_pp_device_free(t);
    if (pp->split_built) gt_pp_split_free(&pp->split);
    if (pp->sched_built) gt_pp_schedule_free(&pp->sched);
    gt_pp_layout_free(&pp->layout);
    gt_comm_destroy(pp->comm);
    gt_comm_destroy(pp->world);
    gt_config_free(&pp->one);
    free(pp);
    t->pp = NULL;
}
