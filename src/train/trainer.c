/* trainer.c — the training loop (the state and its moves: trainer_state.c; the data feed:
 * trainer_data.c; ranks: trainer_parallel.c; checkpoints: shard_io.c, checkpoint_save.c).
 *
 * One optimizer step runs the whole-step graph once: forward, loss, backward and AdamW, built by
 * the model builder, gt_autodiff and gt_optim_append_adamw. With gradient accumulation (global
 * batch > local batch) the graph's batch is one micro-batch and it also keeps a running sum of
 * each gradient as state (BUFFER grad_accum.<fqn>, zeroed at the start of each step): the
 * micro-batches before the last run only its micro-batch part (forward, backward, the sums:
 * gt_graph_micro_part), the last runs the whole graph, whose optimizer reads the sums. The same
 * one graph serves every executor: the step graph runs behind one gt_executor (gt_exec.h) — eager,
 * the compiled CPU program (compile.enable) or the CUDA program (training.device = cuda), chosen
 * at setup — and the step path below never asks which.
 *
 * State that persists across steps — parameters, AdamW moments, the model's own BUFFERs (a MoE
 * layer's expert bias, updated by the optimizer phase) — lives in host tensors owned here
 * until the first run puts it into the executor (eager borrows the host tensors themselves, and a
 * carry replaces them with the updated ones); a compiled program keeps it in its persistent arena
 * from then on (adamw updates it in place); per step only tokens, labels and optim.scalars go in
 * and loss and grad_norm come back. The host tensors are refreshed from
 * the executor only when they are read: checkpoints and the final hash (parameters, buffers). An
 * asynchronous executor (the GPU: GT_EXEC_CAP_ASYNC) never makes the step path wait: per-step
 * inputs go through pinned buffers, loss and grad_norm come back into pinned memory and are read
 * one step later, once the next step is queued (its metrics line is printed then, in order; a
 * checkpoint or the last step first waits for the step); with compile.cudagraphs the program is
 * captured as one CUDA graph after step 1 is queued and every later step replays it, bitwise the
 * same as launching its kernels one by one. Everything a step depends on (parameters, moments,
 * loader position, step number) is in the checkpoint, and every kernel is deterministic, so a
 * resumed run repeats the uninterrupted one bit for bit. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <unistd.h>

#include "checkpoint_internal.h"
#include "graphtrain/gt_checkpoint.h"
#include "graphtrain/gt_cuda.h"
#include "graphtrain/gt_data.h"
#include "graphtrain/gt_exec.h"
#include "graphtrain/gt_flops.h"
#include "graphtrain/gt_lr.h"
#include "graphtrain/gt_metrics.h"
#include "graphtrain/gt_model.h"
#include "graphtrain/gt_optim.h"
#include "graphtrain/gt_program.h"
#include "graphtrain/gt_train.h"
#include "train_internal.h"
#include "trainer_pp.h"

/* ---------------------------------------------------------------- graphs */

static gt_tensor *feed_for(gt_trainer *t, const gt_graph *g, const gt_io *in, gt_error *err)
{
    const char *name = gt_graph_str(g, in->fqn);
    for (int k = 0; k < t->n_params; k++) {
        const char *fqn = t->model.params[k].fqn;
        if (in->kind == GT_IN_PARAM && !strcmp(name, fqn)) return &t->params[k];
        if (in->kind == GT_IN_OPT_STATE && gt_train_named(name, GT_OPTIM_EXP_AVG_PREFIX, fqn))
            return &t->exp_avg[k];
        if (in->kind == GT_IN_OPT_STATE && gt_train_named(name, GT_OPTIM_EXP_AVG_SQ_PREFIX, fqn))
            return &t->exp_avg_sq[k];
        if (gt_train_is_grad_sum(in) && t->grads &&
            gt_train_named(name, GT_OPTIM_GRAD_ACCUM_PREFIX, fqn))
            return &t->grads[k];
    }
    for (int b = 0; gt_train_is_model_buffer(in) && b < t->n_bufs; b++)
        if (!strcmp(name, t->ckpt_names[3 * t->n_params + b])) return &t->bufs[b];
    if (in->kind == GT_IN_INPUT && !strcmp(name, "tokens")) return &t->tokens;
    if (in->kind == GT_IN_INPUT && !strcmp(name, "labels")) return &t->labels;
    if (in->kind == GT_IN_INPUT && !strcmp(name, "positions")) return &t->positions;
    if (in->kind == GT_IN_INPUT && !strcmp(name, GT_OPTIM_SCALARS_NAME)) return &t->scalars;
    gt_error_set(err, GT_ERR_INTERNAL, "trainer: nothing feeds graph input %s %s",
                 gt_input_kind_name((gt_input_kind)in->kind), name);
    return NULL;
}
/* The step graph's executor: the GPU runs only planned programs (arenas in device memory); on
 * the CPU compile.enable plans and lowers it, else it runs eagerly. */
static gt_status step_graph_bind(gt_trainer *t, gt_step_graph *s, gt_error *err)
{
    gt_graph *g = s->g;
    GT_TRY(gt_graph_verify(g, err));
    s->feed = gt_xcalloc((size_t)g->n_inputs, sizeof *s->feed);
    for (int k = 0; k < g->n_inputs; k++)
        if (!(s->feed[k] = feed_for(t, g, &g->inputs[k], err))) return err->code;
    bool multi = gt_train_dist_multi(&t->dist);
    /* a pipeline runs the graph's nodes itself (gt_pp_eager_step_rank), or on the GPU its rank's
     * unrolled step (trainer_pp_device.c): eager holds the host state */
    gt_executor_kind kind = t->cuda && !t->pp                  ? GT_EXECUTOR_CUDA
                            : t->cfg->compile.enable && !t->pp ? GT_EXECUTOR_CPU
                                                               : GT_EXECUTOR_EAGER;
    /* --comm.nccl_buffers: arenas NCCL can register (every rank's at the same offsets, as
     * registration asks) */
    gt_plan_options o = {.nccl_buffers = GT_NCCL_BUFFERS_PLAIN};
    if (kind == GT_EXECUTOR_CUDA && multi) {
        GT_TRY(gt_train_dist_nccl_buffers(&t->dist, t->cfg, err));
        o.nccl_buffers = t->dist.nccl_buffers;
    }
    gt_status bst = gt_executor_create(g, &t->binding, kind, &o, &s->ex, err);
    if (bst == GT_ERR_NOMEM) {
        /* the sizes come from the batch: name the options that set it, and the limit */
        char msg[GT_ERROR_MSG_MAX], limit[160] = "";
        snprintf(msg, sizeof msg, "%s", err->msg);
        if (kind != GT_EXECUTOR_CUDA) {
            long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
            struct rlimit as;
            if (pages > 0 && page > 0)
                snprintf(limit, sizeof limit, "; this host has %.3g GiB of memory",
                         (double)pages * (double)page / 1073741824.0);
            if (getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY)
                snprintf(limit + strlen(limit), sizeof limit - strlen(limit),
                         "; this process may map %.3g GiB (ulimit -v)",
                         (double)as.rlim_cur / 1073741824.0);
        }
        return gt_error_set(err, GT_ERR_NOMEM,
                            "%s for training.local_batch_size = %lld, training.seq_len = %lld "
                            "(%lld micro-batch(es))%s; to fit, lower them, %srecompute more "
                            "(--compile.memory_policy full)",
                            msg, (long long)t->cfg->training.local_batch_size,
                            (long long)t->cfg->training.seq_len, (long long)t->accum, limit,
                            kind == GT_EXECUTOR_CUDA ? "shard over more GPUs, " : "");
    }
    GT_TRY(bst);
    if (multi) {
        gt_comm *const *comms = t->dist.dim_comm;
        if (gt_executor_caps(s->ex) & GT_EXEC_CAP_DEVICE) {
            /* one NCCL communicator per mesh dim, ordered with the executor's stream */
            void *stream = NULL;
#ifdef GT_HAVE_CUDA
            stream = gt_cuda_stream_handle(gt_executor_stream(s->ex));
#endif
            GT_TRY(gt_train_dist_nccl(&t->dist, t->cfg, t->device, stream, err));
            comms = t->dist.nccl;
        }
        GT_TRY(gt_executor_set_comms(s->ex, comms, err));
    }
    /* a planned program: the plan (peak bytes before step 1) goes to the log */
    const gt_program *lowered = gt_executor_lowered(s->ex);
    if (t->dist.rank == 0 && lowered) gt_plan_print(lowered->plan, stderr);
    return GT_OK;
}

static void step_graph_free(gt_step_graph *s)
{
    free(s->feed);
    gt_executor_free(s->ex);
    gt_graph_free(s->g);
    memset(s, 0, sizeof *s);
}

/* ---------------------------------------------------------------- one step */

/* Whether output k is computed by a run of `part`. */
static bool output_in_part(const gt_step_graph *s, int32_t k, gt_run_part part)
{
    return part == GT_RUN_ALL || gt_graph_micro_output(s->g->outputs[k].kind);
}

/* Gradient accumulation, before a step's first micro-batch: the running sums to zero, where the
 * step reads them (the host tensors until the executor holds the state). The model's buffers
 * carry on. */
static gt_status zero_sums(gt_step_graph *s, gt_error *err)
{
    for (int32_t k = 0; k < s->g->n_inputs; k++) {
        if (!gt_train_is_grad_sum(&s->g->inputs[k])) continue;
        if (!s->state_loaded)
            memset(s->feed[k]->data, 0, gt_tensor_nbytes(s->feed[k]));
        else
            GT_TRY(gt_executor_zero_input(s->ex, k, err));
    }
    return GT_OK;
}

/* Loss and grad norm of output k of g, when it is one of them: the double they go to. */
static double *step_result_slot(const gt_graph *g, int32_t k, double *loss, double *grad_norm)
{
    const gt_io *o = &g->outputs[k];
    if (o->kind == GT_OUT_LOSS) return loss;
    if (gt_train_is_grad_norm(g, k)) return grad_norm;
    return NULL;
}

/* Waits for run `ticket` (an asynchronous executor's) and reads its loss and grad_norm. */
static gt_status step_results(gt_step_graph *s, int64_t ticket, double *loss, double *grad_norm,
                              gt_error *err)
{
    GT_TRY(gt_executor_wait(s->ex, ticket, err));
    for (int32_t k = 0; k < s->g->n_outputs; k++) {
        double *dst = step_result_slot(s->g, k, loss, grad_norm);
        if (dst) GT_TRY(gt_executor_read_scalar(s->ex, ticket, k, dst, err));
    }
    return GT_OK;
}

/* One micro-batch's run of `part`: the state goes into the executor before the first run (a GPU
 * resume has put it there already), then only the INPUT kind (tokens, labels, optim.scalars) is
 * staged; the updated state stays in the executor (carry: nothing when adamw ran in place) until
 * gt_trainer_state_to_host reads it back. Copying all of it in and out every step (on the CPU:
 * gt_program_run's memmove, and page faults on fresh output tensors) made a debugmodel step ~10 %
 * slower (288.9 against 261.6 ms, no remat). On an asynchronous executor the run is only queued,
 * loss and grad_norm fetched under *ticket; else *ticket = -1 and they are read here. After the
 * first run of a part (it filled the backend's caches) the part is captured when
 * compile.cudagraphs (nothing is, but on the GPU). */
static gt_status run_part(gt_trainer *t, gt_run_part part, double *loss, double *grad_norm,
                          int64_t *ticket, gt_error *err)
{
    gt_step_graph *s = &t->whole;
    const gt_graph *g = s->g;
    if (!s->state_loaded) GT_TRY(gt_trainer_state_to_device(t, false, err));
    t->host_stale = true; /* the run updates the state in the executor */
    for (int k = 0; k < g->n_inputs; k++)
        if (g->inputs[k].kind == GT_IN_INPUT)
            GT_TRY(gt_executor_stage_input(s->ex, k, s->feed[k], err));
    /* --metrics.comm_report on the GPU times the second run of the whole graph (the first warms
     * up), so its capture waits for it: captured replays record no timing events */
    bool report = t->cfg->metrics.comm_report && gt_train_dist_multi(&t->dist);
    int64_t n = gt_executor_runs(s->ex, part) + 1;
    GT_TRY(gt_executor_set_comm_timing(s->ex, report && part == GT_RUN_ALL && n == 2, err));
    GT_TRY(gt_executor_run_part(s->ex, part, err));
    bool capture_now = report && part == GT_RUN_ALL ? n == 2 : n == 1;
    const char *what = part == GT_RUN_ALL ? "the step" : "the micro-batch part";
    if (capture_now && t->cfg->compile.cudagraphs && gt_train_capture(s->ex, part, what))
        gt_log(GT_LOG_INFO, "compile.cudagraphs: %s is one CUDA graph after %lld warm-up run(s)",
               what, (long long)n);
    for (int k = 0; k < g->n_outputs; k++) {
        if (!output_in_part(s, k, part)) continue;
        int32_t in = gt_program_state_input(g, k);
        if (in >= 0) GT_TRY(gt_executor_carry(s->ex, k, in, err));
        double unused = 0;
        if (step_result_slot(g, k, &unused, &unused))
            GT_TRY(gt_executor_fetch_output(s->ex, k, err));
    }
    int64_t run = -1;
    GT_TRY(gt_executor_end_run(s->ex, &run, err));
    if (gt_executor_caps(s->ex) & GT_EXEC_CAP_ASYNC) {
        *ticket = run;
        return GT_OK;
    }
    *ticket = -1;
    return step_results(s, run, loss, grad_norm, err);
}

static gt_status report_pending(gt_trainer *t, gt_train_result *res, gt_error *err);

/* Runs step `step`; on the GPU only queues it (*ticket >= 0: the results of its last run come
 * later; *loss holds the micro-batches' before it). With gradient accumulation the running sums
 * start at zero and the micro-batches add their (loss-scaled) gradients in order: all but the
 * last run the micro-batch part, the last the whole graph, whose optimizer reads the sums. The
 * step's loss is the sum of the micro-batches' (each divided by their number in the graph). On
 * the GPU the step before is reported once this one's first run is queued: the program holds the
 * results of two runs, so the second run would take its place. */
static gt_status train_step(gt_trainer *t, gt_train_result *res, int64_t step, double *loss,
                            double *grad_norm, double *lr, int64_t *ticket, gt_error *err)
{
    *ticket = -1;
    *lr = gt_lr_at(&t->lr, step);
    gt_optim_scalars(&t->adamw, step, *lr, (float *)t->scalars.data);
    /* its start (where the executor keeps marks): reached when it is queued, or when the step
     * before ends if that is later */
    GT_TRY(gt_executor_mark(t->whole.ex, 2 * step, err));
    if (t->accum > 1) GT_TRY(zero_sums(&t->whole, err));
    double loss_sum = 0;
    int64_t before = -1; /* asynchronous: the previous micro-batch's run, read once the next is
                          * queued */
    for (int64_t m = 0; m < t->accum; m++) {
        GT_TRY(gt_trainer_next_batch(t, err));
        gt_run_part part = m + 1 < t->accum ? GT_RUN_MICRO : GT_RUN_ALL;
        double l = 0;
        GT_TRY(run_part(t, part, &l, grad_norm, ticket, err));
        if (part == GT_RUN_ALL) /* the step's end, for its device time */
            GT_TRY(gt_executor_mark(t->whole.ex, 2 * step + 1, err));
        if (m == 0 && t->accum > 1) GT_TRY(report_pending(t, res, err));
        if (before >= 0) {
            double unused = 0;
            GT_TRY(step_results(&t->whole, before, &l, &unused, err));
        }
        before = part == GT_RUN_MICRO ? *ticket : -1;
        loss_sum += l;
    }
    *loss = loss_sum;
    return GT_OK;
}

/* ---------------------------------------------------------------- the step graph */

/* --compile.precompile_artifact_dir DIR: the compiled step graph (*g: the whole step, or the
 * micro-batch step when micro_batches > 1) from DIR/gt_train_artifact_name(micro_batches) when
 * rank 0 finds it there; else rank 0 builds and compiles it and saves it there (compile on one
 * rank). Then every rank, rank 0 too, runs what it loads from the artifact: the same graph down to
 * its value numbering, so every rank's memory plan is the same (NCCL symmetric windows need that;
 * the schedule check compares the collectives' places). Every rank ends with the same graph, or
 * the same error. */
static gt_status step_graph_artifact(gt_trainer *t, gt_graph **g, int64_t micro_batches,
                                     gt_error *err)
{
    const char *dir = t->cfg->compile.precompile_artifact_dir;
    const char *name = gt_train_artifact_name(micro_batches);
    char *key = gt_train_artifact_key(t->cfg, &t->dist.layout);
    char *path = gt_train_artifact_path(dir, name);
    int64_t have = t->dist.rank == 0 ? gt_train_artifact_exists(dir, name) : 0;
    gt_status st = gt_train_share_i64(&t->dist, &have, err);
    bool compiled = false;
    if (st == GT_OK && !have && t->dist.rank == 0) {
        double t0 = gt_now_seconds();
        st =
            gt_train_build_graph_layout(t->cfg, &t->dist.layout, *g, &t->model, micro_batches, err);
        if (st == GT_OK) st = gt_train_artifact_save(dir, name, key, *g, err);
        if (st == GT_OK)
            gt_log(GT_LOG_INFO, "compiled the step on rank 0 in %.3f s and saved it to %s",
                   gt_now_seconds() - t0, path);
        compiled = true;
    }
    /* the other ranks wait here for rank 0's artifact */
    if (!have) st = gt_train_agree(&t->dist, st, err);
    if (st == GT_OK) {
        double t0 = gt_now_seconds();
        gt_graph *loaded = NULL;
        st = gt_train_artifact_load(dir, name, key, &loaded, err);
        if (st == GT_OK && !compiled) st = gt_train_build_model(t->cfg, &t->model, err);
        if (st == GT_OK) {
            gt_graph_free(*g);
            *g = loaded;
            if (t->dist.rank == 0 && !compiled)
                gt_log(GT_LOG_INFO, "loaded the compiled step from %s in %.3f s (not compiled)",
                       path, gt_now_seconds() - t0);
        } else {
            gt_graph_free(loaded);
        }
    }
    free(path);
    free(key);
    return gt_train_agree(&t->dist, st, err);
}

static gt_status build_graphs(gt_trainer *t, gt_error *err)
{
    /* with accumulation the graph also keeps the running gradient sums (its micro-batch part
     * runs once per micro-batch, the optimizer once per step) */
    if (t->pp) { /* the one-rank graph its stages split (trainer_pp.h) */
        GT_TRY(gt_trainer_pp_build(t, err));
    } else {
        t->whole.g = gt_graph_new();
        if (t->cfg->compile.precompile_artifact_dir[0])
            GT_TRY(step_graph_artifact(t, &t->whole.g, t->accum, err));
        else
            GT_TRY(gt_train_build_graph_layout(t->cfg, &t->dist.layout, t->whole.g, &t->model,
                                               t->accum, err));
    }
    t->n_params = t->model.n_params;
    GT_TRY(gt_graph_count_flops(t->whole.g, &t->binding, &t->flops, err));
    if (t->accum == 1) return GT_OK;
    /* the step's FLOPs: every forward and backward accum times, the optimizer once */
    double m = (double)t->accum;
    t->flops.matmul *= m;
    t->flops.attention *= m;
    double opt = t->flops.by_phase[GT_PHASE_OPTIMIZER];
    t->flops.other = (t->flops.other - opt) * m + opt;
    for (int p = 0; p < 3; p++)
        if (p != GT_PHASE_OPTIMIZER) t->flops.by_phase[p] *= m;
    t->flops.total = t->flops.matmul + t->flops.attention + t->flops.other;
    return GT_OK;
}

/* ---------------------------------------------------------------- setup and loop */

/* A rank bound to one CPU draws its parameters on that core alone (8B over 2 ranks on an H200
 * host: set up in 240 s bound, 35-40 s unbound): said once, by rank 0, for models of 1e8
 * parameters or more. */
static void warn_if_bound(const gt_trainer *t)
{
    long host = sysconf(_SC_NPROCESSORS_ONLN);
    int64_t n = gt_trainer_param_count(t);
    if (t->dist.rank != 0 || gt_cpu_count() > 1 || host < 2 || n < 100000000) return;
    gt_log(GT_LOG_WARN,
           "this rank may run on 1 of the host's %ld CPUs (the launcher bound it: mpirun binds "
           "each rank to one core when -np <= 2), so it draws its share of the %lld parameters on "
           "one core; `mpirun --bind-to none` (or --map-by numa) gives it more",
           host, (long long)n);
}

static gt_status setup(gt_trainer *t, gt_error *err)
{
    const gt_config *cfg = t->cfg;
    /* the model first: a bad name or flavor is refused before anything starts */
    GT_TRY(gt_train_model_config(cfg, &t->model_cfg, err));
    gt_model_info_of(&t->model_cfg, &t->model_info);
    if (cfg->training.seq_len > t->model_info.max_seq_len)
        return gt_error_set(err, GT_ERR_INVALID,
                            "training.seq_len = %lld is above the max_seq_len %lld of model %s "
                            "flavor %s (its rotary embeddings go no further)",
                            (long long)cfg->training.seq_len, (long long)t->model_info.max_seq_len,
                            cfg->model.name, cfg->model.flavor);
    /* ranks first: a multi-rank GPU run is refused before any device is touched */
    GT_TRY(t->pp ? gt_trainer_pp_dist_init(t, err) : gt_train_dist_init(cfg, &t->dist, err));
    /* ranks launched with other options would train an inconsistent model */
    GT_TRY(gt_train_check_config(&t->dist, cfg, err));
    t->cuda = cfg->training.device == GT_CFG_DEVICE_CUDA;
    if (!t->cuda) {
        gt_cpu_set_threads(gt_train_cpu_threads(cfg, &t->dist));
        if (t->dist.rank == 0) {
            char blas[512];
            gt_cpu_blas_describe(blas, sizeof blas);
            gt_log(GT_LOG_INFO, "%s", blas);
            gt_log(GT_LOG_INFO, "cpu: %d thread(s) per rank for the kernels (training.cpu_threads)",
                   gt_cpu_threads());
        }
    }
#ifdef GT_HAVE_CUDA
    if (t->cuda && gt_cuda_device_count() == 0)
        return gt_error_set(err, GT_ERR_UNSUPPORTED,
                            "training.device = cuda: no CUDA device is visible (or no driver)");
    if (t->cuda) {
        t->device = gt_train_device_for_rank(&t->dist, gt_cuda_device_count());
        GT_TRY(gt_cuda_init(t->device, NULL, err));
    }
#else
    if (t->cuda)
        return gt_error_set(err, GT_ERR_UNSUPPORTED,
                            "training.device = cuda: this graphtrain was built without CUDA "
                            "(nvcc was not found at configure time)");
#endif
    if (!t->cuda && cfg->training.mixed_precision_param != GT_CFG_PRECISION_FLOAT32 &&
        t->dist.rank == 0)
        gt_log(GT_LOG_WARN, "training.mixed_precision_param = bfloat16 on the CPU: each op widens "
                            "bf16 to float32 and rounds its output to bf16 (slower than float32)");
    GT_TRY(gt_train_micro_batches(cfg, &t->dist.layout, &t->accum, err));
    /* the graph's batch is one micro-step of every data-parallel rank: the global batch */
    t->global_batch = gt_train_global_batch(cfg, &t->dist.layout);
    gt_train_binding(cfg, &t->dist.layout, t->bind_entries, &t->binding);

    t->adamw = gt_train_adamw_config(cfg);
    gt_lr_config lc = {.lr = cfg->optimizer.lr,
                       .training_steps = cfg->training.steps,
                       .warmup_steps = cfg->lr_scheduler.warmup_steps,
                       .has_decay_ratio = cfg->lr_scheduler.has_decay_ratio,
                       .decay_ratio = cfg->lr_scheduler.decay_ratio,
                       .decay_type = cfg->lr_scheduler.decay_type == GT_CFG_DECAY_COSINE
                                         ? GT_LR_DECAY_COSINE
                                         : GT_LR_DECAY_LINEAR,
                       .min_lr_factor = cfg->lr_scheduler.min_lr_factor};
    GT_TRY(gt_lr_schedule_init(&t->lr, &lc, err));
    t->ckpt_folder = gt_train_join_path(cfg->job.dump_folder, cfg->checkpoint.folder);
    double t0 = gt_now_seconds();
    GT_TRY(build_graphs(t, err));
    warn_if_bound(t);
    t->setup_s[0] = gt_now_seconds() - t0;
    return GT_OK;
}

/* The state (parameters drawn unless resume_step names a checkpoint, which replaces them), the
 * step programs that read it, and the data. */
static gt_status setup_state(gt_trainer *t, gt_error *err)
{
    double t1 = gt_now_seconds();
    GT_TRY(gt_trainer_alloc_state(t, err));
    if (gt_trainer_loads_hf(t)) GT_TRY(gt_trainer_load_hf(t, err));
    /* checkpoint.async_mode: its pages touched meanwhile (by the ranks that write: a pipeline's
     * other ranks hold their stages alone and never save) */
    if (gt_trainer_pp_writes(t)) gt_trainer_snapshot_prepare(t);
    double t2 = gt_now_seconds();
    /* the graph reads the state allocated above */
    GT_TRY(step_graph_bind(t, &t->whole, err));
    double t3 = gt_now_seconds();
    t->setup_s[1] = t2 - t1, t->setup_s[2] = t3 - t2;
    GT_TRY(gt_trainer_open_data(t, err));
    return GT_OK;
}

/* The run's record: config.toml and the metrics file. Opened only after a checkpoint to resume
 * from has been accepted, so a refused resume (other model, corrupt checkpoint) leaves the
 * record of the run that wrote the checkpoint as it was. */
/* The dump folder's lock (rank 0's, held until teardown): two runs writing one folder at once
 * would interleave their checkpoints and metrics. flock, so a run that dies releases it; the file
 * says who holds it. */
static gt_status lock_dump_folder(gt_trainer *t, gt_error *err)
{
    const char *dir = t->cfg->job.dump_folder;
    char *path = gt_train_join_path(dir, GT_TRAIN_LOCK_NAME);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        gt_status st = gt_error_set(err, GT_ERR_IO, "%s: cannot open the dump folder's lock: %s",
                                    path, strerror(errno));
        free(path);
        return st;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        char holder[256] = "";
        ssize_t got = pread(fd, holder, sizeof holder - 1, 0);
        holder[got > 0 ? got : 0] = 0;
        holder[strcspn(holder, "\n")] = 0;
        close(fd);
        gt_status st =
            e == EWOULDBLOCK
                ? gt_error_set(err, GT_ERR_INVALID,
                               "job.dump_folder %s is in use by another run (%s; lock %s): two "
                               "runs in one folder would interleave their checkpoints and "
                               "metrics; give this run another --job.dump_folder or wait",
                               dir, holder[0] ? holder : "holder unknown", path)
                : gt_error_set(err, GT_ERR_IO, "%s: cannot lock: %s", path, strerror(e));
        free(path);
        return st;
    }
    char host[128] = "?", text[256];
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = 0;
    int n = snprintf(text, sizeof text, "graphtrain pid %ld on host %s\n", (long)getpid(), host);
    if (ftruncate(fd, 0) != 0 || pwrite(fd, text, (size_t)n, 0) != n)
        gt_log(GT_LOG_WARN, "%s: cannot record this run as the holder: %s", path, strerror(errno));
    free(path);
    t->dump_lock_fd = fd + 1;
    return GT_OK;
}

static gt_status open_outputs(gt_trainer *t, int64_t start, gt_error *err)
{
    const gt_config *cfg = t->cfg;
    /* rank 0 writes the run's files (of a pipeline: rank 0 of pipeline rank 0's mesh) */
    if (t->dist.rank != 0 || !gt_trainer_pp_writes(t)) return GT_OK;
    GT_TRY(ckpt_mkdirs(cfg->job.dump_folder, err));
    GT_TRY(lock_dump_folder(t, err));
    char *config_path = gt_train_join_path(cfg->job.dump_folder, "config.toml");
    /* the options as given (a pipeline runs a config of its own: trainer_pp.h) */
    gt_status st = gt_config_write(gt_trainer_pp_user_config(t), config_path, err);
    free(config_path);
    if (st != GT_OK) return st;
    if (cfg->metrics.save_jsonl) {
        char *path = gt_train_join_path(cfg->job.dump_folder, "metrics.jsonl");
        /* a resumed run repeats the steps after its checkpoint: their old records go */
        st = t->resume_step != GT_CHECKPOINT_NONE
                 ? gt_metrics_writer_open_resumed(&t->metrics, path, start, err)
                 : gt_metrics_writer_open(&t->metrics, path, err);
        free(path);
        if (st != GT_OK) return st;
        t->metrics_open = true;
    }
    if (cfg->metrics.enable_tensorboard) {
        char *dir = gt_train_join_path(cfg->job.dump_folder, "tb");
        st = gt_tb_writer_open(&t->tb, dir, err);
        free(dir);
        if (st != GT_OK) return st;
    }
    return GT_OK;
}

void gt_trainer_teardown(gt_trainer *t)
{
    gt_trainer_save_abandon(t); /* a save still under way (after a failure) is not published */
    gt_checkpoint_prune_wait();
    step_graph_free(&t->whole);
    gt_trainer_state_free(t);
    gt_trainer_data_free(t);
    if (t->metrics_open) gt_metrics_writer_close(&t->metrics);
    gt_tb_writer_close(&t->tb);
    if (t->dump_lock_fd) close(t->dump_lock_fd - 1); /* releases the lock */
    free(t->ckpt_folder);
    gt_model_free(&t->model);
    gt_train_dist_free(&t->dist);
    gt_trainer_pp_free(t); /* last: t->cfg may be its config */
}

static int digits(int64_t v)
{
    int d = 1;
    while (v >= 10)
        v /= 10, d++;
    return d;
}

static gt_status log_metrics(gt_trainer *t, int64_t step, double loss, double grad_norm, double lr,
                             double dt, gt_error *err);

/* The record of one finished step: the stop on a non-finite loss, the metrics line and record
 * every log_freq steps (and at steps 1 and last). */
static gt_status report_step(gt_trainer *t, gt_train_result *res, int64_t step, double loss,
                             double grad_norm, double lr, double dt, gt_error *err)
{
    const gt_config *cfg = t->cfg;
    res->last_step = step;
    res->final_loss = loss;
    gt_trainer_refresh_ckpt_tensors(t);
    if (!isfinite(loss)) {
        t->dist.error_agreed = true; /* the loss is replicated: every rank stops here */
        return gt_error_set(err, GT_ERR_INVALID, "step %lld: the loss is %g; stopping",
                            (long long)step, loss);
    }
    if (step % cfg->metrics.log_freq == 0 || step == 1 || step == cfg->training.steps) {
        gt_status st =
            t->dist.rank == 0 ? log_metrics(t, step, loss, grad_norm, lr, dt, err) : GT_OK;
        /* rank 0 may fail to write (disk full): every rank stops with its message */
        return gt_train_share_status(&t->dist, 0, st, err);
    }
    return GT_OK;
}

/* Rank 0: the metrics line and record of one step. */
static gt_status log_metrics(gt_trainer *t, int64_t step, double loss, double grad_norm, double lr,
                             double dt, gt_error *err)
{
    const gt_config *cfg = t->cfg;
    gt_metrics_step m = {.step = step,
                         .loss = loss,
                         .grad_norm = grad_norm,
                         .lr = lr,
                         .tokens =
                             t->accum * cfg->training.local_batch_size * cfg->training.seq_len,
                         .step_seconds = dt,
                         .peak_flops = cfg->metrics.peak_tflops * 1e12,
                         .peak_memory_bytes = -1};
    /* a mixture of experts: torchtitan's MoE count (active parameters) */
    gt_flops model = t->flops;
    gt_metrics_moe_model_flops(&t->model, &t->model_info, cfg->training.seq_len, m.tokens, &model);
    gt_metrics_set_flops(&m, &model, &t->flops);
    gt_error ignored = {0};
    if (gt_metrics_peak_rss_bytes(&m.peak_memory_bytes, &ignored) != GT_OK)
        m.peak_memory_bytes = -1;
    gt_metrics_derive(&m);
    char line[512];
    gt_metrics_format_line(&m, digits(cfg->training.steps), line, sizeof line);
    gt_log(GT_LOG_INFO, "%s", line);
    if (t->metrics_open) GT_TRY(gt_metrics_writer_append(&t->metrics, &m, err));
    if (t->tb.file) GT_TRY(gt_tb_writer_append(&t->tb, &m, err));
    return GT_OK;
}

/* The collectives' timings of the timed run (--metrics.comm_report; step_s: its step time). */
static gt_status comm_report(gt_trainer *t, double step_s, gt_error *err)
{
    int32_t n = gt_executor_comm_timings(t->whole.ex, NULL, 0);
    if (n < 0) n = 0;
    gt_comm_timing *timings = gt_xcalloc((size_t)(n ? n : 1), sizeof *timings);
    gt_executor_comm_timings(t->whole.ex, timings, n);
    gt_status st = gt_train_comm_report(&t->dist, gt_executor_lowered(t->whole.ex), timings, n,
                                        step_s, t->whole.g, stderr, err);
    free(timings);
    return st;
}

/* An asynchronous executor: waits for the queued step (if any) and reports it. Its step time is
 * the device's (gt_executor_mark), from when it was queued or the step before it ended, whichever
 * is later, to its end: the host reads results late, and a step it noticed late would look long
 * and the next one short. The first step of a run (warm-up and capture) takes the host's time. */
static gt_status report_pending(gt_trainer *t, gt_train_result *res, gt_error *err)
{
    if (t->pending.step == 0) return GT_OK;
    gt_pending_step p = t->pending;
    t->pending.step = 0;
    double loss = NAN, grad_norm = NAN;
    GT_TRY(step_results(&t->whole, p.ticket, &loss, &grad_norm, err));
    loss += p.loss_before;
    double dt = gt_now_seconds() - p.t0;
    if (p.step > res->first_step)
        GT_TRY(gt_executor_mark_seconds(t->whole.ex, 2 * p.step, 2 * p.step + 1, &dt, err));
    GT_TRY(report_step(t, res, p.step, loss, grad_norm, p.lr, dt, err));
    /* the timed run: the whole step graph's second run (see run_part), timed by the device: the
     * host's dt of a pipelined step is not its time */
    if (t->cfg->metrics.comm_report && gt_train_dist_multi(&t->dist) && p.run == 2)
        GT_TRY(comm_report(t, gt_executor_timed_run_seconds(t->whole.ex), err));
    return GT_OK;
}

/* Before step 1 of a multi-rank run: the memory figures of every rank (a planned program's) and
 * the schedule check. */
static gt_status check_ranks(gt_trainer *t, gt_error *err)
{
    const gt_executor *ex = t->whole.ex;
    if (gt_executor_lowered(ex)) {
        int64_t bytes[4] = {(int64_t)gt_executor_planned_bytes(ex, GT_ARENA_PERSISTENT),
                            (int64_t)gt_executor_planned_bytes(ex, GT_ARENA_STEP),
                            (int64_t)gt_executor_allocated_bytes(ex, GT_ARENA_PERSISTENT),
                            (int64_t)gt_executor_allocated_bytes(ex, GT_ARENA_STEP)};
        GT_TRY(gt_train_report_memory(&t->dist, bytes, err));
    }
    return gt_train_check_schedule(&t->dist, t->cfg, t->whole.ex, err);
}

static void log_start(gt_trainer *t, gt_train_result *res, double setup_s)
{
    const gt_config *cfg = t->cfg;
    int64_t n_params = gt_trainer_param_count(t);
    const gt_graph *shown = t->whole.g;
    if (t->synthetic) res->entropy_rate = gt_synthetic_entropy_rate(t->synthetic);
    if (t->dist.rank != 0) return;
    char mesh[160] = "";
    if (gt_mesh_world_size(&t->dist.layout.mesh) > 1) {
        char m[80];
        gt_mesh_format(&t->dist.layout.mesh, m, sizeof m);
        snprintf(mesh, sizeof mesh, "; mesh %s (%d ranks), FLOPs per rank", m, t->dist.size);
    }
    char params[64] = "parameters"; /* drawn, or left to the checkpoint a resume loads */
    if (t->params_pending) snprintf(params, sizeof params, "parameters left to the GPU's step 1,");
    if (t->resume_step != GT_CHECKPOINT_NONE)
        snprintf(params, sizeof params, "parameters from step-%lld, not drawn,",
                 (long long)t->resume_step);
    else if (gt_trainer_loads_hf(t))
        snprintf(params, sizeof params, "parameters from Hugging Face, not drawn,");
    gt_log(GT_LOG_INFO,
           "model %s %s: %lld parameters; step graph %d nodes; batch %lld x %lld tokens, "
           "%lld micro-batch(es); %.3e FLOPs/step%s; set up in %.1f s (graphs %.1f s, "
           "%s %.1f s, step programs %.1f s)",
           t->model_cfg.family->name, cfg->model.flavor, (long long)n_params, shown->n_nodes,
           (long long)t->global_batch, (long long)cfg->training.seq_len, (long long)t->accum,
           t->flops.total, mesh, setup_s, t->setup_s[0], params, t->setup_s[1], t->setup_s[2]);
    if (t->synthetic)
        gt_log(GT_LOG_INFO,
               "dataset synthetic: vocab %lld, entropy rate %.4f nats/token (the "
               "best possible loss)",
               (long long)t->model_info.vocab_size, res->entropy_rate);
}

static gt_status run(gt_trainer *t, gt_train_result *res, gt_error *err)
{
    const gt_config *cfg = t->cfg;
    double t_setup = gt_now_seconds();
    gt_status st = setup(t, err);
    res->rank = t->dist.rank;
    res->world_size = t->dist.size;
    /* a rank that failed alone (a file it cannot read) must not leave the others waiting */
    GT_TRY(gt_trainer_pp_agree(t, gt_train_agree(&t->dist, st, err), err));
    t->resume_step = GT_CHECKPOINT_NONE;
    if (cfg->checkpoint.enable) GT_TRY(gt_trainer_pick_resume(t, err));
    GT_TRY(gt_trainer_pp_agree(t, gt_train_agree(&t->dist, setup_state(t, err), err), err));
    int64_t start = 0;
    if (cfg->checkpoint.enable) GT_TRY(gt_trainer_resume(t, &start, err));
    if (t->pp) GT_TRY(gt_trainer_pp_agree(t, gt_trainer_pp_own_state(t, err), err));
    GT_TRY(gt_train_share_status(&t->dist, 0, open_outputs(t, start, err), err));
    gt_trainer_refresh_ckpt_tensors(t);
    log_start(t, res, gt_now_seconds() - t_setup);
    GT_TRY(check_ranks(t, err));

    res->first_step = start + 1;
    res->last_step = start;
    bool train_timeout = false; /* comm.init_timeout_seconds until step 1 is reported */
    for (int64_t step = start + 1; step <= cfg->training.steps; step++) {
        int sig = gt_train_kill_signal(&t->dist, cfg, step);
        if (sig) { /* test-only: a peer that dies (SIGKILL) or hangs (SIGSTOP) */
            gt_log(GT_LOG_WARN, "debug.test_kill_rank_at_step: rank %d %s itself at step %lld",
                   t->dist.rank, sig == SIGKILL ? "kills" : "stops", (long long)step);
            fflush(NULL);
            raise(sig);
        }
        double t0 = gt_now_seconds(), loss = NAN, grad_norm = NAN, lr = 0;
        int64_t ticket = -1;
        if (t->pp)
            GT_TRY(gt_trainer_pp_step(t, step, &loss, &grad_norm, &lr, err));
        else
            GT_TRY(train_step(t, res, step, &loss, &grad_norm, &lr, &ticket, err));
        if (step == start + 1 && t->snapshot_pin)
            gt_trainer_snapshot_wait(t); /* the pinning: in the warm-up step's time */
        if (ticket < 0) {
            double step_s = gt_now_seconds() - t0;
            GT_TRY(report_step(t, res, step, loss, grad_norm, lr, step_s, err));
            if (cfg->metrics.comm_report &&
                (gt_executor_caps(t->whole.ex) & GT_EXEC_CAP_COMM_TIMINGS) &&
                (step == start + 2 || (step == cfg->training.steps && step < start + 2)))
                GT_TRY(comm_report(t, step_s, err));
        } else {
            /* the GPU: step is queued; report the one before it, then this one when it must be
             * complete (a checkpoint, the last step) */
            GT_TRY(report_pending(t, res, err));
            t->pending = (gt_pending_step){.step = step,
                                           .ticket = ticket,
                                           .lr = lr,
                                           .t0 = t0,
                                           .run = gt_executor_runs(t->whole.ex, GT_RUN_ALL),
                                           .loss_before = loss};
        }
        bool ckpt = cfg->checkpoint.enable &&
                    (step % cfg->checkpoint.interval == 0 || step == cfg->training.steps);
        if (ckpt || step == cfg->training.steps) GT_TRY(report_pending(t, res, err));
        if (ckpt && !t->pp) GT_TRY(gt_trainer_save_checkpoint(t, step, err));
        if (ckpt && t->pp) { /* the stages' state to rank 0, which writes it */
            gt_status cst = gt_trainer_pp_gather(t, true, err);
            if (cst == GT_OK && gt_trainer_pp_writes(t))
                cst = gt_trainer_save_checkpoint(t, step, err);
            gt_trainer_pp_release(t);
            GT_TRY(gt_trainer_pp_agree(t, cst, err));
        }
        GT_TRY(gt_trainer_save_poll(t, step, false, err)); /* an asynchronous save's progress */
        if (!train_timeout && res->last_step > start) {    /* step 1 is done: torchtitan's switch */
            train_timeout = true;
            gt_train_dist_set_timeout(&t->dist, cfg->comm.train_timeout_seconds);
            if (t->pp) gt_trainer_pp_set_timeout(t, cfg->comm.train_timeout_seconds);
        }
    }
    GT_TRY(gt_trainer_save_poll(t, res->last_step, true, err));
    double t_end = gt_now_seconds();
    GT_TRY(gt_trainer_state_to_host(t, true, err)); /* the hash reads the parameters alone */
    if (t->pp) GT_TRY(gt_trainer_pp_gather(t, false, err)); /* to rank 0: it writes, hashes */
    if (cfg->checkpoint.enable && cfg->checkpoint.last_save_in_hf && res->last_step > start &&
        gt_trainer_pp_writes(t))
        GT_TRY(gt_trainer_save_hf(t, res->last_step, err));
    double t_host = gt_now_seconds();
    GT_TRY(t->pp ? gt_trainer_pp_hash(t, &res->params_hash, err)
                 : gt_trainer_params_hash(t, &res->params_hash, err));
    t->end_s[0] = t_host - t_end, t->end_s[1] = gt_now_seconds() - t_host;
    return GT_OK;
}

gt_status gt_train(const gt_config *cfg, gt_train_result *result, gt_error *err)
{
    gt_trainer t;
    memset(&t, 0, sizeof t);
    t.cfg = cfg;
    gt_train_result local = {.first_step = 1, .last_step = 0, .entropy_rate = NAN, .world_size = 1};
    gt_status st =
        cfg->parallelism.pipeline_parallel_degree > 1 ? gt_trainer_pp_begin(&t, cfg, err) : GT_OK;
    if (st == GT_OK) st = run(&t, &local, err);
    local.error_is_local = st != GT_OK && gt_train_dist_multi(&t.dist) && !t.dist.error_agreed;
    /* A failure of this rank alone (a host collective timed out, a peer died) may leave device
     * collectives waiting for a peer that never comes: abort them so their kernels end. */
    bool any_nccl = false;
    for (int k = 0; k < GT_MESH_NDIMS; k++)
        any_nccl |= t.dist.nccl[k] != NULL && !gt_comm_nccl_aborted(t.dist.nccl[k]);
    if (local.error_is_local && any_nccl) /* said first: the abort may wait on a stuck peer */
        gt_log(GT_LOG_ERROR, "aborting the NCCL communicators after: %s", err->msg);
    for (int k = 0; k < GT_MESH_NDIMS && local.error_is_local; k++)
        gt_comm_nccl_abort(t.dist.nccl[k], err->msg);
    for (int k = 0; k < GT_MESH_NDIMS && st != GT_OK; k++)
        local.device_abandoned |= gt_comm_nccl_aborted(t.dist.nccl[k]);
    /* after an abort, freeing device memory or destroying the program synchronises with device
     * work that may never end (kernels captured in the step's CUDA graph before the abort); the
     * process is about to exit and the driver reclaims everything. With a stopped (not dead) peer
     * ncclCommAbort itself may never return: gt_comm_nccl_abort waits for it a bounded time. */
    double t_free = gt_now_seconds();
    if (!local.device_abandoned) gt_trainer_teardown(&t);
    if (st == GT_OK && local.rank == 0)
        gt_log(GT_LOG_INFO,
               "finished: parameters to the host %.1f s, their hash %.1f s, release %.1f s",
               t.end_s[0], t.end_s[1], gt_now_seconds() - t_free);
    if (result) *result = local;
    return st;
}
