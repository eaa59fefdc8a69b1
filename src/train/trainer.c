/* trainer.c — the training loop.
 *
 * One optimizer step runs the whole-step graph once: forward, loss, backward and AdamW, built by
 * the model builder, gt_autodiff and gt_optim_append_adamw. With gradient accumulation (global
 * batch > local batch) the graph's batch is one micro-batch and it also keeps a running sum of
 * each gradient as state (BUFFER grad_accum.<fqn>, zeroed at the start of each step): the
 * micro-batches before the last run only its micro-batch part (forward, backward, the sums:
 * gt_graph_micro_part), the last runs the whole graph, whose optimizer reads the sums. The same
 * one graph and program serve the eager executor, the compiled CPU step and the GPU.
 *
 * State that persists across steps — parameters, AdamW moments — lives in host tensors owned here;
 * the graph's PARAM_UPDATE / OPT_STATE_UPDATE outputs replace them after each step. With
 * training.device = cuda the step graph runs as a compiled program on the GPU
 * (gt_cuda_program): the state is copied into the program's persistent arena once, before the first
 * step, and stays there (adamw updates it in place); per step only tokens, labels and
 * optim.scalars are copied in and loss and grad_norm read back. The host tensors are refreshed from
 * the device only when they are read: checkpoints and the final parameter hash. On the GPU the
 * step path never waits for the device: per-step inputs go through pinned buffers
 * (gt_cuda_program_stage_input), loss and grad_norm come back into pinned memory and are read
 * one step later, once the next step is queued (its metrics line is printed then, in order; a
 * checkpoint or the last step first waits for the step); with compile.cudagraphs the program is
 * captured as one CUDA graph after step 1 is queued and every later step replays it, bitwise the
 * same as launching its kernels one by one. Everything a
 * step depends on (parameters, moments, loader position, step number) is in the checkpoint, and
 * every kernel is deterministic, so a resumed run repeats the uninterrupted one bit for bit. */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
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

char *gt_train_join_path(const char *dir, const char *name)
{
    return name[0] == '/' || !dir[0] ? gt_xstrdup(name) : gt_path_join(dir, name);
}

gt_status gt_train_read_file(const char *path, char **buf, size_t *len, gt_error *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) return gt_error_set(err, GT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    char *b = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n == cap) {
            cap = cap ? 2 * cap : 1 << 16;
            char *nb = realloc(b, cap);
            if (!nb) {
                free(b);
                fclose(f);
                return gt_error_set(err, GT_ERR_NOMEM, "%s: cannot hold %zu bytes", path, cap);
            }
            b = nb;
        }
        size_t got = fread(b + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
    }
    bool failed = ferror(f);
    fclose(f);
    if (failed) {
        free(b);
        return gt_error_set(err, GT_ERR_IO, "%s: read failed", path);
    }
    *buf = b;
    *len = n;
    return GT_OK;
}

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
        if (in->kind == GT_IN_BUFFER && t->grads &&
            gt_train_named(name, GT_OPTIM_GRAD_ACCUM_PREFIX, fqn))
            return &t->grads[k];
    }
    if (in->kind == GT_IN_INPUT && !strcmp(name, "tokens")) return &t->tokens;
    if (in->kind == GT_IN_INPUT && !strcmp(name, "labels")) return &t->labels;
    if (in->kind == GT_IN_INPUT && !strcmp(name, GT_OPTIM_SCALARS_NAME)) return &t->scalars;
    gt_error_set(err, GT_ERR_INTERNAL, "trainer: nothing feeds graph input %s %s",
                 gt_input_kind_name((gt_input_kind)in->kind), name);
    return NULL;
}

static gt_status step_graph_bind(gt_trainer *t, gt_step_graph *s, gt_error *err)
{
    gt_graph *g = s->g;
    GT_TRY(gt_graph_verify(g, err));
    s->feed = gt_xcalloc((size_t)g->n_inputs, sizeof *s->feed);
    s->inputs = gt_xcalloc((size_t)g->n_inputs, sizeof *s->inputs);
    s->outputs = gt_xcalloc((size_t)g->n_outputs, sizeof *s->outputs);
    for (int k = 0; k < g->n_inputs; k++)
        if (!(s->feed[k] = feed_for(t, g, &g->inputs[k], err))) return err->code;
#ifdef GT_HAVE_CUDA
    if (t->cuda) { /* the GPU runs only planned programs: arenas in device memory */
        /* --comm.nccl_buffers: arenas NCCL can register (every rank's at the same offsets, as
         * registration asks) */
        gt_plan_options o = {.nccl_buffers = GT_NCCL_BUFFERS_PLAIN};
        if (gt_train_dist_multi(&t->dist)) {
            GT_TRY(gt_train_dist_nccl_buffers(&t->dist, t->cfg, err));
            o.nccl_buffers = t->dist.nccl_buffers;
        }
        gt_status bst = gt_cuda_program_build(g, &t->binding, &o, &s->dev, err);
        if (bst == GT_ERR_NOMEM) {
            char msg[GT_ERROR_MSG_MAX];
            snprintf(msg, sizeof msg, "%s", err->msg);
            return gt_error_set(err, GT_ERR_NOMEM,
                                "%s; to fit, shard over more GPUs, recompute more "
                                "(--compile.memory_policy full) or lower "
                                "--training.local_batch_size",
                                msg);
        }
        GT_TRY(bst);
        if (gt_train_dist_multi(&t->dist)) {
            /* one NCCL communicator per mesh dim, ordered with the program's stream */
            void *stream = gt_cuda_stream_handle(gt_cuda_program_stream(s->dev));
            GT_TRY(gt_train_dist_nccl(&t->dist, t->cfg, t->device, stream, err));
            GT_TRY(gt_cuda_program_set_comms(s->dev, t->dist.nccl, err));
        }
        if (t->dist.rank == 0) gt_plan_print(gt_cuda_program_lowered(s->dev)->plan, stderr);
        return GT_OK;
    }
#endif
    if (!t->cfg->compile.enable) return GT_OK;
    /* compile: plan memory and lower; the plan (peak bytes before step 1) goes to the log */
    GT_TRY(gt_program_build(g, &t->binding, &s->prog, err));
    if (gt_train_dist_multi(&t->dist)) GT_TRY(gt_program_set_comms(s->prog, t->dist.dim_comm, err));
    if (t->dist.rank == 0) gt_plan_print(s->prog->plan, stderr);
    return GT_OK;
}

static void step_graph_free(gt_step_graph *s)
{
    if (s->g && s->outputs)
        for (int k = 0; k < s->g->n_outputs; k++)
            gt_tensor_free(&s->outputs[k]);
    free(s->feed);
    free(s->inputs);
    free(s->outputs);
    gt_program_free(s->prog);
#ifdef GT_HAVE_CUDA
    gt_cuda_program_free(s->dev);
#endif
    gt_graph_free(s->g);
    memset(s, 0, sizeof *s);
}

/* Runs part of the graph eagerly; its outputs stay in s->outputs until the next run. */
static gt_status step_graph_run(gt_trainer *t, gt_step_graph *s, gt_run_part part, gt_error *err)
{
    for (int k = 0; k < s->g->n_outputs; k++)
        gt_tensor_free(&s->outputs[k]);
    for (int k = 0; k < s->g->n_inputs; k++) {
        s->inputs[k] = *s->feed[k];
        s->inputs[k].owns_data = false;
    }
    gt_comm *const *comms = gt_train_dist_multi(&t->dist) ? t->dist.dim_comm : NULL;
    return gt_eager_run_part(s->g, &t->binding, s->inputs, comms, part, s->outputs, err);
}

/* Whether output k is computed by a run of `part`. */
static bool output_in_part(const gt_step_graph *s, int32_t k, gt_run_part part)
{
    return part == GT_RUN_ALL || gt_graph_micro_output(s->g->outputs[k].kind);
}

/* Gradient accumulation, before a step's first micro-batch: the running sums to zero, where the
 * step reads them (the host tensors until a program holds the state). */
static gt_status zero_sums(gt_step_graph *s, gt_error *err)
{
    for (int32_t k = 0; k < s->g->n_inputs; k++) {
        if (s->g->inputs[k].kind != GT_IN_BUFFER) continue;
        if (!s->state_loaded || (!s->prog && !s->dev)) {
            memset(s->feed[k]->data, 0, gt_tensor_nbytes(s->feed[k]));
            continue;
        }
#ifdef GT_HAVE_CUDA
        if (s->dev) GT_TRY(gt_cuda_program_zero_input(s->dev, k, err));
#endif
        if (s->prog) GT_TRY(gt_program_zero_input(s->prog, k, err));
    }
    return GT_OK;
}

/* Loss and grad norm of output k of g, when it is one of them: the double they go to. */
static double *step_result_slot(const gt_graph *g, int32_t k, double *loss, double *grad_norm)
{
    const gt_io *o = &g->outputs[k];
    if (o->kind == GT_OUT_LOSS) return loss;
    if (o->kind == GT_OUT_METRIC && !strcmp(gt_graph_str(g, o->fqn), GT_OPTIM_GRAD_NORM_NAME))
        return grad_norm;
    return NULL;
}

/* The compiled whole step on the CPU with the state kept in the program's arenas, as on the GPU:
 * the state (params, moments) goes in before the first run (after a resume has loaded it), then
 * only the INPUT kind (tokens, labels, optim.scalars) is copied in; the updated state stays in the
 * arenas (carry: nothing when adamw ran in place) until gt_trainer_state_to_host reads it back.
 * Copying all of it in and out every step (gt_program_run: memmove, and page faults on fresh
 * output tensors) made a debugmodel step ~10 % slower (288.9 against 261.6 ms, no remat). */
static gt_status step_graph_exec_cpu(gt_trainer *t, gt_step_graph *s, gt_run_part part,
                                     double *loss, double *grad_norm, gt_error *err)
{
    const gt_graph *g = s->g;
    for (int k = 0; k < g->n_inputs; k++)
        if (g->inputs[k].kind == GT_IN_INPUT || !s->state_loaded)
            GT_TRY(gt_program_set_input(s->prog, k, s->feed[k], err));
    s->state_loaded = true;
    t->host_stale = true;
    GT_TRY(gt_program_exec_part(s->prog, part, err));
    for (int k = 0; k < g->n_outputs; k++) {
        if (!output_in_part(s, k, part)) continue;
        int32_t in = gt_program_state_input(g, k);
        if (in >= 0) GT_TRY(gt_program_carry(s->prog, k, in, err));
        double *dst = step_result_slot(g, k, loss, grad_norm);
        if (!dst) continue;
        gt_tensor v;
        GT_TRY(gt_program_output(s->prog, k, &v, err));
        *dst = gt_tensor_get_f32(&v, 0);
    }
    return GT_OK;
}

/* This rank's block of parameter p, drawn by the CPU sampler into its host tensor. */
static void draw_on_host(gt_trainer *t, int p)
{
    gt_shard_init_param(&t->box[p], &t->model.params[p], (uint64_t)t->cfg->debug.seed,
                        &t->params[p]);
}

#ifdef GT_HAVE_CUDA
static bool is_checkpoint_tensor(const gt_trainer *t, const gt_tensor *x)
{
    for (int k = 0; k < 3 * t->n_params; k++)
        if (t->ckpt_tensors[k] == x) return true;
    return false;
}

/* The matmul shapes the warm-up run tuned (cuda_matmul_tune.cu), and what that cost. */
static void say_tuning(gt_step_graph *s)
{
    gt_cuda_tune_stats ts = gt_cuda_stream_tune_stats(gt_cuda_program_stream(s->dev));
    if (ts.timed + ts.cached <= s->tuned_said) return;
    gt_log(GT_LOG_INFO,
           "matmul tuning: %d shape(s) timed their cuBLASLt candidates, %d taken from %s; "
           "%.2f s (GT_MATMUL_TUNE=0: the heuristic's pick, untimed)",
           ts.timed, ts.cached, ts.cache ? ts.cache : "no cache file", ts.seconds);
    s->tuned_said = ts.timed + ts.cached;
}

/* Queues one step on the GPU without waiting for it: the state goes up before the first run (a GPU
 * resume has put it there already), then only the INPUT kind (tokens, labels, optim.scalars) is
 * staged into its planned buffer; the updated state stays on the device (carry: nothing when adamw
 * ran in place); loss and grad_norm are fetched into pinned memory under *ticket. After step 1 is
 * queued (it filled the backend's caches) the program is captured when compile.cudagraphs. With
 * gradient accumulation this queues one micro-batch's run of `part`; each part is captured after
 * its own first run. */
static gt_status step_graph_queue_cuda(gt_trainer *t, gt_step_graph *s, gt_run_part part,
                                       int64_t *ticket, gt_error *err)
{
    const gt_graph *g = s->g;
    if (!s->state_loaded) GT_TRY(gt_trainer_state_to_device(t, false, err));
    t->host_stale = true; /* the run updates the state on the device */
    for (int k = 0; k < g->n_inputs; k++)
        if (g->inputs[k].kind == GT_IN_INPUT)
            GT_TRY(gt_cuda_program_stage_input(s->dev, k, s->feed[k], err));
    /* --metrics.comm_report times the second run of the whole graph (the first warms up), so its
     * capture waits for it: captured replays record no timing events */
    bool report = t->cfg->metrics.comm_report && gt_train_dist_multi(&t->dist);
    int64_t n = ++s->part_runs[part];
    GT_TRY(gt_cuda_program_set_comm_timing(s->dev, report && part == GT_RUN_ALL && n == 2, err));
    GT_TRY(gt_cuda_program_exec_part(s->dev, part, err));
    if (n == 1) say_tuning(s);
    bool capture_now = report && part == GT_RUN_ALL ? n == 2 : n == 1;
    if (capture_now && t->cfg->compile.cudagraphs) {
        gt_error cerr = {0};
        const char *what = part == GT_RUN_ALL ? "the step" : "the micro-batch part";
        if (gt_cuda_program_capture_part(s->dev, part, &cerr) != GT_OK)
            gt_log(GT_LOG_WARN, "compile.cudagraphs: %s: %s; running the kernels one by one", what,
                   cerr.msg);
        else
            gt_log(GT_LOG_INFO,
                   "compile.cudagraphs: %s is one CUDA graph after %lld warm-up run(s)", what,
                   (long long)n);
    }
    for (int k = 0; k < g->n_outputs; k++) {
        const gt_io *o = &g->outputs[k];
        if (!output_in_part(s, k, part)) continue;
        int32_t in = gt_program_state_input(g, k);
        if (in >= 0) GT_TRY(gt_cuda_program_carry(s->dev, k, in, err));
        if (o->kind == GT_OUT_LOSS ||
            (o->kind == GT_OUT_METRIC && !strcmp(gt_graph_str(g, o->fqn), GT_OPTIM_GRAD_NORM_NAME)))
            GT_TRY(gt_cuda_program_fetch_output(s->dev, k, err));
    }
    return gt_cuda_program_step_end(s->dev, ticket, err);
}

/* ---------------------------------------------------------------- parameters drawn on the device
 */

typedef struct {
    int64_t *runs; /* (global element, local position, count) */
    int64_t n, cap;
} run_table;

static void add_run(int64_t global, int64_t local, int64_t count, void *user)
{
    run_table *r = user;
    if (r->n == r->cap) {
        r->cap = r->cap ? 2 * r->cap : 64;
        r->runs = gt_xrealloc(r->runs, (size_t)(3 * r->cap) * sizeof *r->runs);
    }
    r->runs[3 * r->n] = global, r->runs[3 * r->n + 1] = local, r->runs[3 * r->n + 2] = count;
    r->n++;
}

/* Elements [d, d + n) of run (global, local, count) of parameter p, read back from graph input k,
 * against gt_param_init's. */
static gt_status draw_matches(gt_trainer *t, gt_step_graph *s, int32_t k, int p, const int64_t *run,
                              int64_t d, int64_t n, bool *same, gt_error *err)
{
    float got[64], want[64];
    gt_tensor w;
    gt_tensor_wrap(&w, GT_F32, 1, &n, want);
    gt_param_init(&t->model.params[p], (uint64_t)t->cfg->debug.seed, run[0] + d, n, &w);
    GT_TRY(gt_cuda_program_read_input_bytes(s->dev, k, (size_t)(run[1] + d) * sizeof(float),
                                            (size_t)n * sizeof(float), got, err));
    *same = memcmp(got, want, (size_t)n * sizeof(float)) == 0;
    return GT_OK;
}

/* Parameter p, graph input k: drawn on the device into its buffer (padding rows zeroed), then its
 * first and last 64 elements compared with the CPU sampler's. On a difference, or a parameter
 * that is not f32, *drawn is false and the caller draws it on the host instead. */
static gt_status draw_on_device(gt_trainer *t, gt_step_graph *s, int32_t k, int p, bool *drawn,
                                gt_error *err)
{
    *drawn = false;
    const gt_param_spec *ps = &t->model.params[p];
    if (t->params[p].dtype != GT_F32) return GT_OK;
    run_table r = {0};
    gt_shard_for_each_run(&t->box[p], add_run, &r);
    gt_cuda_init_spec spec = {
        (int)ps->init, ps->std, ps->lo, ps->hi, (uint64_t)t->cfg->debug.seed, gt_hash_str(ps->fqn)};
    gt_status st = gt_cuda_program_zero_input(s->dev, k, err);
    if (st == GT_OK)
        st = gt_cuda_param_init(gt_cuda_program_stream(s->dev), &spec, r.runs, r.n,
                                gt_cuda_program_input_data(s->dev, k), err);
    bool same = true;
    if (st == GT_OK && r.n > 0) {
        const int64_t *first = r.runs, *last = r.runs + 3 * (r.n - 1);
        int64_t n0 = first[2] < 64 ? first[2] : 64, n1 = last[2] < 64 ? last[2] : 64;
        st = draw_matches(t, s, k, p, first, 0, n0, &same, err);
        if (st == GT_OK && same) st = draw_matches(t, s, k, p, last, last[2] - n1, n1, &same, err);
    }
    free(r.runs);
    *drawn = st == GT_OK && same;
    if (st == GT_OK && !same)
        gt_log(GT_LOG_WARN,
               "parameters: %s drawn on the GPU differs from the CPU's draw; the parameters are "
               "drawn on the host instead",
               ps->fqn);
    return st;
}

gt_status gt_trainer_state_to_device(gt_trainer *t, bool resumed, gt_error *err)
{
    gt_step_graph *s = &t->whole;
    const gt_graph *g = s->g;
    for (int k = 0; k < g->n_inputs; k++) {
        gt_input_kind kind = g->inputs[k].kind;
        if (kind == GT_IN_INPUT) continue;
        /* resumed: the checkpoint's tensors are there; the sums are zeroed on the device */
        if (resumed && (kind == GT_IN_BUFFER || is_checkpoint_tensor(t, s->feed[k]))) continue;
        /* a fresh run's moments and the gradient sums start at zero: zeroed there, not copied
         * (8B's moments are 64 GB of untouched host pages) */
        if (kind == GT_IN_BUFFER || (kind == GT_IN_OPT_STATE && t->moments_zero)) {
            GT_TRY(gt_cuda_program_zero_input(s->dev, k, err));
            continue;
        }
        int p = kind == GT_IN_PARAM && t->params_pending ? (int)(s->feed[k] - t->params) : -1;
        if (p >= 0) {
            bool drawn = false;
            if (!t->device_draw_failed) GT_TRY(draw_on_device(t, s, k, p, &drawn, err));
            if (drawn) continue;
            t->device_draw_failed = true; /* the rest on the host too */
            draw_on_host(t, p);
        }
        GT_TRY(gt_cuda_program_set_input(s->dev, k, s->feed[k], err));
    }
    t->params_pending = false;
    s->state_loaded = true;
    t->host_stale = true;
    return GT_OK;
}

/* Waits for the step with `ticket` and reads its loss and grad_norm. */
static gt_status step_graph_results_cuda(gt_step_graph *s, int64_t ticket, double *loss,
                                         double *grad_norm, gt_error *err)
{
    const gt_graph *g = s->g;
    GT_TRY(gt_cuda_program_step_wait(s->dev, ticket, err));
    for (int k = 0; k < g->n_outputs; k++) {
        double *dst = step_result_slot(g, k, loss, grad_norm);
        const void *bytes = dst ? gt_cuda_program_fetched(s->dev, ticket, k) : NULL;
        if (!bytes) continue;
        const gt_buffer_ref *r = &gt_cuda_program_lowered(s->dev)->outputs[k];
        gt_tensor v;
        gt_tensor_wrap(&v, r->dtype, r->ndim, r->shape, (void *)bytes);
        *dst = gt_tensor_get_f32(&v, 0);
    }
    return GT_OK;
}
#endif

/* Copies the state (params, and the moments unless params_only) from the whole-step program (the
 * device's, or the compiled CPU one's arenas) into the host tensors that feed it, when it has run
 * since. */
gt_status gt_trainer_state_to_host(gt_trainer *t, bool params_only, gt_error *err)
{
    if (t->params_pending) { /* the device never got them (no step ran): the host draws them */
        for (int p = 0; p < t->n_params; p++)
            draw_on_host(t, p);
        t->params_pending = false;
    }
    if (!t->host_stale) return GT_OK;
    gt_step_graph *s = &t->whole;
    for (int k = 0; s->g && k < s->g->n_inputs; k++) {
        gt_input_kind kind = s->g->inputs[k].kind;
        /* BUFFER: gradient accumulation's running sums, zeroed each step (not saved) */
        if (kind == GT_IN_INPUT || kind == GT_IN_BUFFER || (params_only && kind == GT_IN_OPT_STATE))
            continue;
#ifdef GT_HAVE_CUDA
        if (s->dev) GT_TRY(gt_cuda_program_read_input(s->dev, k, s->feed[k], err));
#endif
        if (s->prog) GT_TRY(gt_program_read_input(s->prog, k, s->feed[k], err));
    }
    t->host_stale = params_only;
    if (!params_only) t->moments_zero = false;
    return GT_OK;
}

/* Moves the outputs that carry state (updated params, moments, gradient sums) into place; returns
 * loss and grad norm when the run computed them. */
static gt_status step_graph_collect(gt_trainer *t, gt_step_graph *s, double *loss,
                                    double *grad_norm, gt_error *err)
{
    const gt_graph *g = s->g;
    for (int k = 0; k < g->n_outputs; k++) {
        const gt_io *o = &g->outputs[k];
        const char *name = gt_graph_str(g, o->fqn);
        gt_tensor *dst = NULL;
        if (!s->outputs[k].data) continue; /* not computed by this run's part */
        if (o->kind == GT_OUT_LOSS) {
            *loss = gt_tensor_get_f32(&s->outputs[k], 0);
            continue;
        }
        if (o->kind == GT_OUT_METRIC && !strcmp(name, GT_OPTIM_GRAD_NORM_NAME)) {
            *grad_norm = gt_tensor_get_f32(&s->outputs[k], 0);
            continue;
        }
        for (int p = 0; p < t->n_params && !dst; p++) {
            const char *fqn = t->model.params[p].fqn;
            if (o->kind == GT_OUT_PARAM_UPDATE && !strcmp(name, fqn)) dst = &t->params[p];
            if (o->kind == GT_OUT_BUFFER_UPDATE && t->grads &&
                gt_train_named(name, GT_OPTIM_GRAD_ACCUM_PREFIX, fqn))
                dst = &t->grads[p];
            if (o->kind == GT_OUT_OPT_STATE_UPDATE &&
                gt_train_named(name, GT_OPTIM_EXP_AVG_PREFIX, fqn))
                dst = &t->exp_avg[p];
            if (o->kind == GT_OUT_OPT_STATE_UPDATE &&
                gt_train_named(name, GT_OPTIM_EXP_AVG_SQ_PREFIX, fqn))
                dst = &t->exp_avg_sq[p];
        }
        if (o->kind == GT_OUT_OPT_STATE_UPDATE) t->moments_zero = false;
        if (!dst) continue;
        if (gt_tensor_nbytes(dst) != gt_tensor_nbytes(&s->outputs[k]))
            return gt_error_set(err, GT_ERR_INTERNAL, "trainer: output %s has %zu bytes, state %zu",
                                name, gt_tensor_nbytes(&s->outputs[k]), gt_tensor_nbytes(dst));
        gt_tensor_free(dst);
        *dst = s->outputs[k];
        memset(&s->outputs[k], 0, sizeof s->outputs[k]);
    }
    return GT_OK;
}

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
    t->whole.g = gt_graph_new();
    if (t->cfg->compile.precompile_artifact_dir[0])
        GT_TRY(step_graph_artifact(t, &t->whole.g, t->accum, err));
    else
        GT_TRY(gt_train_build_graph_layout(t->cfg, &t->dist.layout, t->whole.g, &t->model, t->accum,
                                           err));
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

/* ---------------------------------------------------------------- state */

/* ---------------------------------------------------------------- data */

static gt_status open_data(gt_trainer *t, gt_error *err)
{
    const gt_cfg_training *tr = &t->cfg->training;
    /* every rank reads the whole global batch (and keeps its rows): the loader sees one rank */
    gt_loader_config lc = {.seq_len = tr->seq_len,
                           .local_batch = t->global_batch,
                           .dp_rank = 0,
                           .dp_degree = 1,
                           .shuffle = false,
                           .seed = (uint64_t)t->cfg->debug.seed};
    if (tr->dataset == GT_CFG_DATASET_SYNTHETIC) {
        gt_synthetic_config sc;
        gt_synthetic_config_default(&sc);
        sc.vocab_size = (int32_t)t->model_info.vocab_size;
        GT_TRY(gt_synthetic_create(&sc, &t->synthetic, err));
        return gt_loader_create_synthetic(&lc, t->synthetic, &t->loader, err);
    }
    if (!tr->dataset_path[0])
        return gt_error_set(err, GT_ERR_INVALID, "training.dataset_path: dataset '%s' needs a path",
                            tr->dataset == GT_CFG_DATASET_TOKENS ? "tokens" : "text");
    if (tr->dataset == GT_CFG_DATASET_TOKENS) {
        GT_TRY(gt_token_shard_open(tr->dataset_path, &t->shard, err));
        t->shard_open = true;
        if (t->shard.vocab_size > (uint32_t)t->model_info.vocab_size)
            return gt_error_set(
                err, GT_ERR_INVALID,
                "%s: token ids go up to vocab size %u, the model's vocabulary is %lld",
                tr->dataset_path, t->shard.vocab_size, (long long)t->model_info.vocab_size);
        return gt_loader_create_shard(&lc, &t->shard, &t->loader, err);
    }
    /* text / jsonl: tokenize in memory */
    char *tok_path = tr->tokenizer_path[0]
                         ? gt_xstrdup(tr->tokenizer_path)
                         : gt_train_join_path(t->cfg->model.hf_assets_path, "tokenizer.json");
    gt_status st = gt_tokenizer_load(tok_path, &t->tokenizer, err);
    free(tok_path);
    if (st != GT_OK) return st;
    if (gt_tokenizer_vocab_size(t->tokenizer) > t->model_info.vocab_size)
        return gt_error_set(
            err, GT_ERR_INVALID, "the tokenizer has %d tokens, the model's vocabulary is %lld",
            gt_tokenizer_vocab_size(t->tokenizer), (long long)t->model_info.vocab_size);
    gt_tokenize_options o;
    gt_tokenize_options_default(&o);
    o.format = tr->dataset == GT_CFG_DATASET_JSONL ? GT_TEXT_JSONL : GT_TEXT_PLAIN;
    GT_TRY(gt_data_tokenize_file(t->tokenizer, tr->dataset_path, &o, &t->text_ids, NULL, err));
    return gt_loader_create_tokens(&lc, t->text_ids.ids, t->text_ids.n, tr->dataset_path,
                                   &t->loader, err);
}

static gt_status next_batch(gt_trainer *t, gt_error *err)
{
    GT_TRY(gt_loader_next(t->loader, t->window, err));
    int64_t b = t->global_batch, s = t->cfg->training.seq_len;
    if (!t->batch_tokens) {
        gt_loader_split_batch(t->window, b, s, t->tokens.data, t->labels.data);
        return GT_OK;
    }
    /* this rank's rows of the global batch */
    gt_loader_split_batch(t->window, b, s, t->batch_tokens, t->batch_labels);
    int64_t shape[2] = {b, s};
    gt_tensor all_tokens, all_labels;
    gt_tensor_wrap(&all_tokens, GT_I64, 2, shape, t->batch_tokens);
    gt_tensor_wrap(&all_labels, GT_I64, 2, shape, t->batch_labels);
    gt_shard_slice(&t->batch_box, &all_tokens, &t->tokens);
    gt_shard_slice(&t->batch_box, &all_labels, &t->labels);
    return GT_OK;
}

/* ---------------------------------------------------------------- one step */

/* One micro-batch's run of `part` on whichever executor holds the step; on the GPU only queued
 * (*ticket: its results come later). */
static gt_status run_part(gt_trainer *t, gt_run_part part, double *loss, double *grad_norm,
                          int64_t *ticket, gt_error *err)
{
    gt_step_graph *s = &t->whole;
#ifdef GT_HAVE_CUDA
    if (s->dev) return step_graph_queue_cuda(t, s, part, ticket, err);
#else
    (void)ticket;
#endif
    if (s->prog) return step_graph_exec_cpu(t, s, part, loss, grad_norm, err);
    GT_TRY(step_graph_run(t, s, part, err));
    return step_graph_collect(t, s, loss, grad_norm, err);
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
#ifdef GT_HAVE_CUDA
    /* its start: reached when it is queued, or when the step before ends if that is later */
    if (t->whole.dev) GT_TRY(gt_cuda_program_mark(t->whole.dev, 2 * step, err));
#endif
    if (t->accum > 1) GT_TRY(zero_sums(&t->whole, err));
    double loss_sum = 0;
#ifdef GT_HAVE_CUDA
    int64_t before = -1; /* GPU: the previous micro-batch's run, read once the next is queued */
#endif
    for (int64_t m = 0; m < t->accum; m++) {
        GT_TRY(next_batch(t, err));
        gt_run_part part = m + 1 < t->accum ? GT_RUN_MICRO : GT_RUN_ALL;
        double l = 0;
        GT_TRY(run_part(t, part, &l, grad_norm, ticket, err));
#ifdef GT_HAVE_CUDA
        if (t->whole.dev && part == GT_RUN_ALL) /* the step's end, for its device time */
            GT_TRY(gt_cuda_program_mark(t->whole.dev, 2 * step + 1, err));
#endif
        if (m == 0 && t->accum > 1) GT_TRY(report_pending(t, res, err));
#ifdef GT_HAVE_CUDA
        if (before >= 0) {
            double unused = 0;
            GT_TRY(step_graph_results_cuda(&t->whole, before, &l, &unused, err));
        }
        before = part == GT_RUN_MICRO ? *ticket : -1;
#endif
        loss_sum += l;
    }
    *loss = loss_sum;
    return GT_OK;
}

/* ---------------------------------------------------------------- setup and loop */

/* The model's parameter count (elements of every parameter, whole). */
static int64_t model_param_count(const gt_trainer *t)
{
    return gt_model_param_count(&t->model);
}

/* A rank bound to one CPU draws its parameters on that core alone (8B over 2 ranks on an H200
 * host: set up in 240 s bound, 35-40 s unbound): said once, by rank 0, for models of 1e8
 * parameters or more. */
static void warn_if_bound(const gt_trainer *t)
{
    long host = sysconf(_SC_NPROCESSORS_ONLN);
    int64_t n = model_param_count(t);
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
    /* the model first (a bad name or flavor is refused before anything starts), then the ranks:
     * a multi-rank GPU run is refused before any device is touched */
    GT_TRY(gt_train_model_config(cfg, &t->model_cfg, err));
    gt_model_info_of(&t->model_cfg, &t->model_info);
    /* ranks first: a multi-rank GPU run is refused before any device is touched */
    GT_TRY(gt_train_dist_init(cfg, &t->dist, err));
    t->cuda = cfg->training.device == GT_CFG_DEVICE_CUDA;
    if (!t->cuda) {
        gt_cpu_set_threads(gt_train_cpu_threads(cfg, &t->dist));
        if (t->dist.rank == 0)
            gt_log(GT_LOG_INFO, "cpu: %d thread(s) per rank for the matmuls (training.cpu_threads)",
                   gt_cpu_threads());
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
    gt_trainer_snapshot_prepare(t); /* checkpoint.async_mode: its pages touched meanwhile */
    double t2 = gt_now_seconds();
    /* the graph reads the state allocated above */
    GT_TRY(step_graph_bind(t, &t->whole, err));
    double t3 = gt_now_seconds();
    t->setup_s[1] = t2 - t1, t->setup_s[2] = t3 - t2;
    GT_TRY(open_data(t, err));
    return GT_OK;
}

/* The run's record: config.toml and the metrics file. Opened only after a checkpoint to resume
 * from has been accepted, so a refused resume (other model, corrupt checkpoint) leaves the
 * record of the run that wrote the checkpoint as it was. */
static gt_status open_outputs(gt_trainer *t, gt_error *err)
{
    const gt_config *cfg = t->cfg;
    if (t->dist.rank != 0) return GT_OK; /* rank 0 writes the run's files */
    GT_TRY(ckpt_mkdirs(cfg->job.dump_folder, err));
    char *config_path = gt_train_join_path(cfg->job.dump_folder, "config.toml");
    gt_status st = gt_config_write(cfg, config_path, err);
    free(config_path);
    if (st != GT_OK) return st;
    if (cfg->metrics.save_jsonl) {
        char *path = gt_train_join_path(cfg->job.dump_folder, "metrics.jsonl");
        st = gt_metrics_writer_open(&t->metrics, path, err);
        free(path);
        if (st != GT_OK) return st;
        t->metrics_open = true;
    }
    return GT_OK;
}

static void teardown(gt_trainer *t)
{
    gt_trainer_save_abandon(t); /* a save still under way (after a failure) is not published */
    gt_checkpoint_prune_wait();
    step_graph_free(&t->whole);
    for (int k = 0; k < t->n_params; k++) {
        if (t->params) gt_tensor_free(&t->params[k]);
        if (t->exp_avg) gt_tensor_free(&t->exp_avg[k]);
        if (t->exp_avg_sq) gt_tensor_free(&t->exp_avg_sq[k]);
        if (t->grads) gt_tensor_free(&t->grads[k]);
        if (t->ckpt_names) {
            free(t->ckpt_names[k]);
            free(t->ckpt_names[t->n_params + k]);
            free(t->ckpt_names[2 * t->n_params + k]);
        }
    }
    free(t->params);
    free(t->exp_avg);
    free(t->exp_avg_sq);
    free(t->grads);
    free(t->ckpt_names);
    free(t->ckpt_tensors);
    free(t->box);
    free(t->batch_tokens);
    free(t->batch_labels);
    gt_tensor_free(&t->tokens);
    gt_tensor_free(&t->labels);
    gt_tensor_free(&t->scalars);
    free(t->window);
    gt_loader_free(t->loader);
    gt_synthetic_free(t->synthetic);
    gt_tokenizer_free(t->tokenizer);
    gt_token_ids_free(&t->text_ids);
    if (t->shard_open) gt_token_shard_close(&t->shard);
    if (t->metrics_open) gt_metrics_writer_close(&t->metrics);
    free(t->ckpt_folder);
    gt_model_free(&t->model);
    gt_train_dist_free(&t->dist);
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
    gt_metrics_set_flops(&m, &t->flops, &t->flops);
    gt_error ignored = {0};
    if (gt_metrics_peak_rss_bytes(&m.peak_memory_bytes, &ignored) != GT_OK)
        m.peak_memory_bytes = -1;
    gt_metrics_derive(&m);
    char line[512];
    gt_metrics_format_line(&m, digits(cfg->training.steps), line, sizeof line);
    gt_log(GT_LOG_INFO, "%s", line);
    if (t->metrics_open) GT_TRY(gt_metrics_writer_append(&t->metrics, &m, err));
    return GT_OK;
}

/* cuda: waits for the queued step (if any) and reports it. Its step time is the device's
 * (gt_cuda_program_mark), from when it was queued or the step before it ended, whichever is
 * later, to its end: the host reads results late, and a step it noticed late would look long and
 * the next one short. The first step of a run (warm-up and capture) takes the host's time. */
static gt_status report_pending(gt_trainer *t, gt_train_result *res, gt_error *err)
{
    if (t->pending.step == 0) return GT_OK;
    gt_pending_step p = t->pending;
    t->pending.step = 0;
    double loss = NAN, grad_norm = NAN;
#ifdef GT_HAVE_CUDA
    GT_TRY(step_graph_results_cuda(&t->whole, p.ticket, &loss, &grad_norm, err));
#endif
    loss += p.loss_before;
    double dt = gt_now_seconds() - p.t0;
#ifdef GT_HAVE_CUDA
    if (p.step > res->first_step)
        GT_TRY(gt_cuda_program_mark_seconds(t->whole.dev, 2 * p.step, 2 * p.step + 1, &dt, err));
#endif
    GT_TRY(report_step(t, res, p.step, loss, grad_norm, p.lr, dt, err));
#ifdef GT_HAVE_CUDA
    /* the timed run: the whole step graph's second exec (see step_graph_queue_cuda) */
    if (t->cfg->metrics.comm_report && gt_train_dist_multi(&t->dist) && t->whole.dev &&
        p.run == 2) {
        int32_t n = gt_cuda_program_comm_timings(t->whole.dev, NULL, 0);
        gt_comm_timing *timings = gt_xcalloc((size_t)(n ? n : 1), sizeof *timings);
        gt_cuda_program_comm_timings(t->whole.dev, timings, n);
        /* the device's own time for the step: the host's dt of a pipelined step is not */
        gt_status st = gt_train_comm_report(
            &t->dist, timings, n, gt_cuda_program_timed_run_seconds(t->whole.dev), stderr, err);
        free(timings);
        GT_TRY(st);
    }
#endif
    return GT_OK;
}

/* Before step 1 of a multi-rank run: the memory figures of every rank and the schedule check. */
static gt_status check_ranks(gt_trainer *t, gt_error *err)
{
    gt_step_graph *s = &t->whole;
    const gt_program *lowered = s->prog;
    int64_t bytes[4] = {0};
#ifdef GT_HAVE_CUDA
    if (s->dev) {
        lowered = gt_cuda_program_lowered(s->dev);
        bytes[2] = (int64_t)gt_cuda_program_allocated_bytes(s->dev, GT_ARENA_PERSISTENT);
        bytes[3] = (int64_t)gt_cuda_program_allocated_bytes(s->dev, GT_ARENA_STEP);
    }
#endif
    if (lowered) {
        bytes[0] = (int64_t)gt_program_planned_bytes(lowered, GT_ARENA_PERSISTENT);
        bytes[1] = (int64_t)gt_program_planned_bytes(lowered, GT_ARENA_STEP);
        if (s->prog) {
            bytes[2] = (int64_t)gt_program_allocated_bytes(s->prog, GT_ARENA_PERSISTENT);
            bytes[3] = (int64_t)gt_program_allocated_bytes(s->prog, GT_ARENA_STEP);
        }
        GT_TRY(gt_train_report_memory(&t->dist, bytes, err));
    }
    return gt_train_check_schedule(&t->dist, t->cfg, s->g, s->prog, lowered, err);
}

/* One turn of the multi-rank hash: parameters k0 .. k0 + turn - 1 gathered to ranks 0 .. turn - 1,
 * all in flight together, then each root hashes its own into h. */
static gt_status hash_turn(gt_trainer *t, int k0, int turn, gt_shard_gather *g,
                           gt_shard_buffers *buf, uint64_t *h, gt_error *err)
{
    gt_train_dist *d = &t->dist;
    gt_status st = GT_OK;
    int started = 0;
    while (started < turn && st == GT_OK) {
        st = gt_shard_gather_start(d->world, &t->params[k0 + started], started, buf, &g[started],
                                   err);
        if (st == GT_OK) started++;
    }
    /* every gather in flight is finished, even after an error */
    for (int j = 0; j < started; j++) {
        int k = k0 + j;
        const void *whole = NULL;
        gt_error e = {0};
        gt_status s =
            gt_shard_gather_finish(d->world, &d->layout.mesh, &t->box[k], buf, &g[j], &whole, &e);
        if (s == GT_OK && whole)
            h[k] = gt_hash64(whole, gt_shard_whole_bytes(&t->box[k], t->params[k].dtype), 0);
        if (s != GT_OK && st == GT_OK) st = s, *err = e;
    }
    return st;
}

/* The final parameters' hash: xxh64 of the list of every whole parameter's xxh64 (seed 0, in
 * parameter order, as little-endian u64s), the same figure whatever the layout. With N ranks the
 * parameters go round in turns of N (hash_turn), so each rank receives and hashes about 1/N of the
 * model; a sum over the ranks then puts every hash on every rank. */
static gt_status final_params_hash(gt_trainer *t, uint64_t *hash, gt_error *err)
{
    gt_train_dist *d = &t->dist;
    int64_t n = t->n_params;
    uint64_t *hv = gt_xcalloc((size_t)n + 1, sizeof *hv);
    gt_shard_buffers buf = {0};
    gt_status st = GT_OK;
    if (!gt_train_dist_multi(d)) {
        for (int k = 0; k < n && st == GT_OK; k++)
            st = gt_shard_hash(NULL, &d->layout.mesh, &t->box[k], &t->params[k], 0, &buf, &hv[k],
                               err);
    } else {
        int w = d->world->size;
        gt_shard_gather *g = gt_xcalloc((size_t)w, sizeof *g);
        for (int k0 = 0; k0 < n && st == GT_OK; k0 += w)
            st = hash_turn(t, k0, n - k0 < w ? (int)(n - k0) : w, g, &buf, hv, err);
        free(g);
        if (st == GT_OK) st = gt_train_share_slots(d, hv, n, err); /* each on its root alone */
    }
    gt_shard_buffers_free(&buf);
    if (st == GT_OK) *hash = gt_hash64(hv, (size_t)n * sizeof *hv, 0);
    free(hv);
    return st;
}

static void log_start(gt_trainer *t, gt_train_result *res, double setup_s)
{
    const gt_config *cfg = t->cfg;
    int64_t n_params = model_param_count(t);
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

static gt_status comm_report(gt_trainer *t, double step_s, gt_error *err)
{
    int32_t n = gt_program_comm_timings(t->whole.prog, NULL, 0);
    gt_comm_timing *timings = gt_xcalloc((size_t)(n ? n : 1), sizeof *timings);
    gt_program_comm_timings(t->whole.prog, timings, n);
    gt_status st = gt_train_comm_report(&t->dist, timings, n, step_s, stderr, err);
    free(timings);
    return st;
}

static gt_status run(gt_trainer *t, gt_train_result *res, gt_error *err)
{
    const gt_config *cfg = t->cfg;
    double t_setup = gt_now_seconds();
    gt_status st = setup(t, err);
    res->rank = t->dist.rank;
    res->world_size = t->dist.size;
    /* a rank that failed alone (a file it cannot read) must not leave the others waiting */
    GT_TRY(gt_train_agree(&t->dist, st, err));
    t->resume_step = GT_CHECKPOINT_NONE;
    if (cfg->checkpoint.enable) GT_TRY(gt_trainer_pick_resume(t, err));
    GT_TRY(gt_train_agree(&t->dist, setup_state(t, err), err));
    int64_t start = 0;
    if (cfg->checkpoint.enable) GT_TRY(gt_trainer_resume(t, &start, err));
    GT_TRY(gt_train_share_status(&t->dist, 0, open_outputs(t, err), err));
    gt_trainer_refresh_ckpt_tensors(t);
    log_start(t, res, gt_now_seconds() - t_setup);
    GT_TRY(check_ranks(t, err));

    res->first_step = start + 1;
    res->last_step = start;
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
        GT_TRY(train_step(t, res, step, &loss, &grad_norm, &lr, &ticket, err));
        if (step == start + 1 && t->snapshot_pin)
            gt_trainer_snapshot_wait(t); /* the pinning: in the warm-up step's time */
        if (ticket < 0) {
            double step_s = gt_now_seconds() - t0;
            GT_TRY(report_step(t, res, step, loss, grad_norm, lr, step_s, err));
            if (cfg->metrics.comm_report && t->whole.prog &&
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
                                           .run = t->whole.part_runs[GT_RUN_ALL],
                                           .loss_before = loss};
        }
        bool ckpt = cfg->checkpoint.enable &&
                    (step % cfg->checkpoint.interval == 0 || step == cfg->training.steps);
        if (ckpt || step == cfg->training.steps) GT_TRY(report_pending(t, res, err));
        if (ckpt) GT_TRY(gt_trainer_save_checkpoint(t, step, err));
        GT_TRY(gt_trainer_save_poll(t, step, false, err)); /* an asynchronous save's progress */
    }
    GT_TRY(gt_trainer_save_poll(t, res->last_step, true, err));
    double t_end = gt_now_seconds();
    GT_TRY(gt_trainer_state_to_host(t, true, err)); /* the hash reads the parameters alone */
    double t_host = gt_now_seconds();
    GT_TRY(final_params_hash(t, &res->params_hash, err));
    t->end_s[0] = t_host - t_end, t->end_s[1] = gt_now_seconds() - t_host;
    return GT_OK;
}

gt_status gt_train(const gt_config *cfg, gt_train_result *result, gt_error *err)
{
    gt_trainer t;
    memset(&t, 0, sizeof t);
    t.cfg = cfg;
    gt_train_result local = {.first_step = 1, .last_step = 0, .entropy_rate = NAN, .world_size = 1};
    gt_status st = run(&t, &local, err);
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
    if (!local.device_abandoned) teardown(&t);
    if (st == GT_OK && local.rank == 0)
        gt_log(GT_LOG_INFO,
               "finished: parameters to the host %.1f s, their hash %.1f s, release %.1f s",
               t.end_s[0], t.end_s[1], gt_now_seconds() - t_free);
    if (result) *result = local;
    return st;
}

/* ---------------------------------------------------------------- export */

gt_status gt_train_export_hf(const gt_config *cfg, int64_t step, const char *dir, gt_dtype dtype,
                             gt_error *err)
{
    gt_trainer t;
    memset(&t, 0, sizeof t);
    t.cfg = cfg;
    t.accum = 1;
    t.dist.size = 1; /* one process reads the whole tensors */
    gt_status st = gt_mesh_init(&t.dist.layout.mesh, 1, 1, 1, err);
    t.global_batch = cfg->training.local_batch_size;
    /* the parameters as the flavor defines them (f32): the checkpoint holds f32 master weights */
    if (st == GT_OK)
        st = gt_model_config_init(cfg->model.name, cfg->model.flavor, GT_F32, &t.model_cfg, err);
    gt_graph *g = gt_graph_new();
    if (st == GT_OK) st = gt_model_build(g, &t.model_cfg, &t.model, err);
    t.n_params = t.model.n_params;
    t.ckpt_folder = gt_train_join_path(cfg->job.dump_folder, cfg->checkpoint.folder);
    int64_t want = step;
    if (st == GT_OK && want < 0) {
        st = gt_checkpoint_find_latest(t.ckpt_folder, &want, err);
        if (st == GT_OK && want == GT_CHECKPOINT_NONE)
            st = gt_error_set(err, GT_ERR_INVALID, "no checkpoint in %s to export", t.ckpt_folder);
    }
    t.resume_step = want; /* the parameters come from the checkpoint: none are drawn */
    if (st == GT_OK) st = gt_trainer_alloc_state(&t, err);
    if (st == GT_OK) {
        gt_checkpoint_model m = {cfg->model.name, cfg->model.flavor, 0};
        gt_checkpoint_info info;
        if (st == GT_OK) {
            m.fingerprint = gt_trainer_fingerprint(&t);
            /* the parameters alone (the moments are checked with the rest, not copied) */
            st = gt_checkpoint_load(t.ckpt_folder, want, &m, t.n_params,
                                    (const char *const *)t.ckpt_names, t.ckpt_tensors, &info, err);
            if (st == GT_OK) gt_checkpoint_info_free(&info);
        }
    }
    if (st == GT_OK) {
        gt_export_hf_options o = {.dtype = dtype, .bos_token_id = -1, .eos_token_id = -1};
        st = gt_model_export_hf(&t.model_cfg, &t.model, t.params, dir, &o, err);
    }
    gt_graph_free(g);
    teardown(&t);
    return st;
}
