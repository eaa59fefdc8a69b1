/* trainer_state.c — the trainer's state (parameters, AdamW moments, the model's buffers, the
 * gradient sums) and its moves: into the step's executor before the first run (on the GPU
 * parameters drawn there, moments and sums zeroed there), back to the host tensors when they are
 * read (checkpoints, the final hash), the final hash over every rank, and freeing it. Allocating
 * the blocks of each rank is in trainer_parallel.c (gt_trainer_alloc_state). */
#include <stdlib.h>
#include <string.h>

#include "graphtrain/gt_checkpoint.h"
#include "graphtrain/gt_cuda.h"
#include "graphtrain/gt_exec.h"
#include "graphtrain/gt_model.h"
#include "graphtrain/gt_train.h"
#include "train_internal.h"

int64_t gt_trainer_param_count(const gt_trainer *t)
{
    return gt_model_param_count(&t->model);
}

/* This rank's block of parameter p, drawn by the CPU sampler into its host tensor. */
static void draw_on_host(gt_trainer *t, int p)
{
    gt_shard_init_param(&t->box[p], &t->model.params[p], (uint64_t)t->cfg->debug.seed,
                        &t->params[p]);
}

/* ---------------------------------------------------------------- the device draws parameters */
#ifdef GT_HAVE_CUDA

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
    GT_TRY(gt_executor_read_input_bytes(s->ex, k, (size_t)(run[1] + d) * sizeof(float),
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
    gt_status st = gt_executor_zero_input(s->ex, k, err);
    if (st == GT_OK)
        st = gt_cuda_param_init(gt_executor_stream(s->ex), &spec, r.runs, r.n,
                                gt_executor_input_data(s->ex, k), err);
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
#endif

static bool is_checkpoint_tensor(const gt_trainer *t, const gt_tensor *x)
{
    for (int k = 0; k < t->n_ckpt; k++)
        if (t->ckpt_tensors[k] == x) return true;
    return false;
}

/* ---------------------------------------------------------------- to and from the executor */

gt_status gt_trainer_state_to_device(gt_trainer *t, bool resumed, gt_error *err)
{
    gt_step_graph *s = &t->whole;
    const gt_graph *g = s->g;
    bool device = gt_executor_caps(s->ex) & GT_EXEC_CAP_DEVICE;
    for (int k = 0; k < g->n_inputs; k++) {
        gt_input_kind kind = g->inputs[k].kind;
        bool sum = gt_train_is_grad_sum(&g->inputs[k]);
        if (kind == GT_IN_INPUT) continue;
        /* resumed: the checkpoint's tensors are there; the sums are zeroed there */
        if (resumed && (sum || is_checkpoint_tensor(t, s->feed[k]))) continue;
        /* on a device a fresh run's moments and the gradient sums start at zero: zeroed there,
         * not copied (8B's moments are 64 GB of untouched host pages) */
        if (device && (sum || (kind == GT_IN_OPT_STATE && t->moments_zero))) {
            GT_TRY(gt_executor_zero_input(s->ex, k, err));
            continue;
        }
        int p = kind == GT_IN_PARAM && t->params_pending ? (int)(s->feed[k] - t->params) : -1;
        if (p >= 0) {
            bool drawn = false;
#ifdef GT_HAVE_CUDA
            if (!t->device_draw_failed) GT_TRY(draw_on_device(t, s, k, p, &drawn, err));
#endif
            if (drawn) continue;
            t->device_draw_failed = true; /* the rest on the host too */
            draw_on_host(t, p);
        }
        GT_TRY(gt_executor_set_input(s->ex, k, s->feed[k], err));
    }
    t->params_pending = false;
    s->state_loaded = true;
    t->host_stale = true;
    return GT_OK;
}

/* Copies the state (params and the model's buffers, and the moments unless params_only) from the
 * whole step's executor into the host tensors that feed it, when it has run since (eager: they
 * are its own already). */
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
        /* gradient accumulation's running sums are zeroed each step (not saved); the model's
         * buffers go with the parameters (the final hash covers them) */
        if (kind == GT_IN_INPUT || gt_train_is_grad_sum(&s->g->inputs[k]) ||
            (params_only && kind == GT_IN_OPT_STATE))
            continue;
        GT_TRY(gt_executor_read_input(s->ex, k, s->feed[k], err));
    }
    t->host_stale = params_only;
    if (!params_only) t->moments_zero = false;
    return GT_OK;
}

/* ---------------------------------------------------------------- the final hash */

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
 * parameter order, as little-endian u64s), then each model buffer's (in step-graph input order;
 * none in dense models, whose figure is the parameters' alone), the same figure whatever the
 * layout. With N ranks the parameters go round in turns of N (hash_turn), so each rank receives
 * and hashes about 1/N of the model; a sum over the ranks then puts every hash on every rank. The
 * buffers are whole on every rank: rank 0 hashes them. */
gt_status gt_trainer_params_hash(gt_trainer *t, uint64_t *hash, gt_error *err)
{
    gt_train_dist *d = &t->dist;
    int64_t n = t->n_params, nb = t->n_bufs;
    uint64_t *hv = gt_xcalloc((size_t)(n + nb) + 1, sizeof *hv);
    for (int64_t b = 0; b < nb && d->rank == 0; b++)
        hv[n + b] = gt_hash64(t->bufs[b].data, gt_tensor_nbytes(&t->bufs[b]), 0);
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
        if (st == GT_OK) st = gt_train_share_slots(d, hv, n + nb, err); /* each on its root alone */
    }
    gt_shard_buffers_free(&buf);
    if (st == GT_OK) *hash = gt_hash64(hv, (size_t)(n + nb) * sizeof *hv, 0);
    free(hv);
    return st;
}

/* ---------------------------------------------------------------- freeing */

void gt_trainer_state_free(gt_trainer *t)
{
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
    for (int b = 0; b < t->n_bufs; b++) {
        gt_tensor_free(&t->bufs[b]);
        if (t->ckpt_names) free(t->ckpt_names[3 * t->n_params + b]);
    }
    free(t->bufs);
    free(t->ckpt_names);
    free(t->ckpt_tensors);
    free(t->box);
    gt_tensor_free(&t->scalars);
}

/* ---------------------------------------------------------------- export
 *
 * gt_train_export_hf (gt_train.h): one process allocates the whole state, loads a checkpoint's
 * parameters into it and writes them out; no step graph runs. */

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
    /* the model graph's buffer inputs give the buffers to read (model_buffers) */
    t.whole.g = g;
    if (st == GT_OK) st = gt_trainer_alloc_state(&t, err);
    if (st == GT_OK) {
        gt_checkpoint_model m = {cfg->model.name, cfg->model.flavor, 0};
        gt_checkpoint_info info;
        if (st == GT_OK) {
            m.fingerprint = gt_trainer_fingerprint(&t);
            /* the parameters and the model's buffers (deepseek_v3's trained expert biases, which
             * steer its routing); the moments are checked with the rest, not copied */
            int n = t.n_params, nb = t.n_bufs;
            const char **names = gt_xcalloc((size_t)(n + nb), sizeof *names);
            gt_tensor **tensors = gt_xcalloc((size_t)(n + nb), sizeof *tensors);
            for (int k = 0; k < n; k++) {
                names[k] = t.ckpt_names[k];
                tensors[k] = t.ckpt_tensors[k];
            }
            for (int b = 0; b < nb; b++) {
                names[n + b] = t.ckpt_names[3 * n + b];
                tensors[n + b] = &t.bufs[b];
            }
            st = gt_checkpoint_load(t.ckpt_folder, want, &m, n + nb, names, tensors, &info, err);
            free(names);
            free(tensors);
            if (st == GT_OK) gt_checkpoint_info_free(&info);
        }
    }
    if (st == GT_OK) {
        gt_export_hf_options o = {.dtype = dtype,
                                  .bos_token_id = -1,
                                  .eos_token_id = -1,
                                  .buffers = t.bufs,
                                  .buffer_names =
                                      (const char *const *)t.ckpt_names + 3 * t.n_params,
                                  .n_buffers = t.n_bufs};
        st = gt_model_export_hf(&t.model_cfg, &t.model, t.params, dir, &o, err);
    }
    t.whole.g = NULL; /* g is freed here, not by the teardown */
    gt_graph_free(g);
    gt_trainer_teardown(&t);
    return st;
}
