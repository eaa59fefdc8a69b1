/* trainer_pp_state.c — stage-local ownership of the training state under pipeline parallelism
 * (issue 39; trainer_pp.h): each pipeline rank draws, loads, holds and updates the parameters,
 * gradient sums and AdamW moments of its own stages only, and the whole state meets on pipeline
 * rank 0 when it is saved or hashed.
 *
 * Why no rank sets up the whole state: gt_trainer_alloc_state gives another rank's tensors their
 * dtype and shape but no storage (gt_trainer_pp_elsewhere), so nothing is drawn into them, and
 * the checkpoint loader reads only tensors with storage. The draw stays bitwise the one-rank
 * run's: gt_shard_init_param draws each element from the parameter's spec, the seed and its
 * global index, whichever tensors are drawn. The step reads only its stages' inputs
 * (gt_pp_eager_step_spmd runs only this rank's actions and its stages' optimizer nodes). A run
 * that starts from a Hugging Face folder checks every tensor there and reads only those with
 * storage (hf_load.c), as the checkpoint loader does.
 *
 * Why pipeline rank 0 gathers for saving and hashing: a checkpoint holds whole tensors in the
 * format of every other layout, written by pipeline rank 0's mesh (each mesh rank its blocks, as
 * without the pipeline); the owners send their blocks point-to-point and rank 0 frees them again
 * after the save, so between saves it too holds its own stages only. */
#include <stdlib.h>
#include <string.h>

#include "trainer_pp.h"

/* The pipeline rank whose stage updates parameter p (-1: none does, every rank holds it): that
 * of the step graph's input of p (read by name: the inputs are not bound yet at setup). */
static int32_t owner_of(const gt_trainer *t, int p)
{
    const gt_graph *g = t->whole.g;
    const char *fqn = t->model.params[p].fqn;
    for (int32_t k = 0; k < g->n_inputs; k++)
        if (g->inputs[k].kind == GT_IN_PARAM && !strcmp(gt_graph_str(g, g->inputs[k].fqn), fqn))
            return t->pp->owner[k];
    return -1;
}

/* param_owner, once: after gt_trainer_pp_build (pp->owner) and before the state is set up. */
static void find_owners(gt_trainer *t)
{
    struct gt_trainer_pp *pp = t->pp;
    if (pp->param_owner) return;
    pp->param_owner = gt_xcalloc((size_t)t->n_params + 1, sizeof *pp->param_owner);
    for (int p = 0; p < t->n_params; p++)
        pp->param_owner[p] = owner_of(t, p);
}

static bool holds(const gt_trainer *t, int p)
{
    int32_t o = t->pp->param_owner[p];
    return o < 0 || o == t->pp->rank;
}

/* Parameter p's tensors: the parameter, its two moments, its gradient sum (accumulation). */
static int param_tensors(gt_trainer *t, int p, gt_tensor **x)
{
    int n = 0;
    x[n++] = &t->params[p];
    x[n++] = &t->exp_avg[p];
    x[n++] = &t->exp_avg_sq[p];
    if (t->grads) x[n++] = &t->grads[p];
    return n;
}

/* The bytes of parameters, gradient sums and moments this rank holds (all: those of every stage,
 * as the mesh rank without the pipeline holds them). */
static int64_t state_bytes(gt_trainer *t, bool all)
{
    int64_t bytes = 0;
    for (int p = 0; p < t->n_params; p++) {
        gt_tensor *x[4];
        int n = param_tensors(t, p, x);
        for (int j = 0; j < n; j++)
            if (all || x[j]->data) bytes += (int64_t)gt_tensor_nbytes(x[j]);
    }
    return bytes;
}

bool gt_trainer_pp_elsewhere(gt_trainer *t, int p)
{
    find_owners(t);
    if (holds(t, p)) return false;
    int n = t->n_params;
    const gt_shard_box *pb = &t->box[p], *mb = &t->box[n + p], *vb = &t->box[2 * n + p];
    /* dtype and shape, as gt_trainer_alloc_state gives them: the checkpoint's names and
     * descriptors, and gt_trainer_pp_gather's receive buffers on rank 0, come from them */
    gt_tensor_wrap(&t->params[p], t->model.params[p].dtype, pb->ndim, pb->local, NULL);
    gt_tensor_wrap(&t->exp_avg[p], GT_F32, mb->ndim, mb->local, NULL);
    gt_tensor_wrap(&t->exp_avg_sq[p], GT_F32, vb->ndim, vb->local, NULL);
    if (t->grads) gt_tensor_wrap(&t->grads[p], GT_F32, pb->ndim, pb->local, NULL);
    return true;
}

/* Frees the tensors of the parameters of other ranks' stages. */
static void free_others(gt_trainer *t)
{
    for (int p = 0; p < t->n_params; p++) {
        if (holds(t, p)) continue;
        gt_tensor *x[4];
        int n = param_tensors(t, p, x);
        for (int j = 0; j < n; j++)
            gt_tensor_free(x[j]); /* keeps dtype and shape: gt_trainer_pp_gather reallocates */
    }
}

gt_status gt_trainer_pp_own_state(gt_trainer *t, gt_error *err)
{
    struct gt_trainer_pp *pp = t->pp;
    find_owners(t);
    /* nothing of other stages was allocated (gt_trainer_pp_elsewhere), so what a rank holds now
     * is also the most it held during setup */
    int64_t whole = state_bytes(t, true);
    int n = pp->layout.n_ranks;
    int64_t *held = gt_xcalloc((size_t)n, sizeof *held);
    gt_status st = GT_OK;
    for (int r = 0; r < n && st == GT_OK; r++) {
        int64_t one = 1;
        gt_tensor x;
        gt_tensor_wrap(&x, GT_I64, 1, &one, &held[r]);
        if (r == pp->rank) held[r] = state_bytes(t, false);
        st = gt_comm_broadcast(pp->comm, &x, r, err);
    }
    if (st == GT_OK && pp->rank == 0 && t->dist.rank == 0) {
        char text[512];
        int len = snprintf(text, sizeof text,
                           "pipeline state (parameters, gradient sums, AdamW moments of the "
                           "rank's stages):");
        for (int r = 0; r < n && len < (int)sizeof text; r++)
            len += snprintf(text + len, sizeof text - (size_t)len, "%s rank %d %lld B (%.2f MiB)",
                            r ? "," : "", r, (long long)held[r], (double)held[r] / (1 << 20));
        if (len < (int)sizeof text)
            snprintf(text + len, sizeof text - (size_t)len,
                     "; without the pipeline %lld B (%.2f MiB)", (long long)whole,
                     (double)whole / (1 << 20));
        gt_log(GT_LOG_INFO, "%s", text);
    }
    free(held);
    if (st != GT_OK) return gt_error_wrap(err, "pipeline: the state bytes of each rank");
    return GT_OK;
}

gt_status gt_trainer_pp_gather(gt_trainer *t, bool moments, gt_error *err)
{
    struct gt_trainer_pp *pp = t->pp;
    gt_status st = gt_trainer_pp_device_to_host(t, err); /* the GPU's state is the current one */
    int tag = 0;
    for (int p = 0; p < t->n_params && st == GT_OK; p++) {
        int32_t o = pp->param_owner[p];
        if (o <= 0) continue; /* rank 0's own, or every rank's */
        gt_tensor *x[3] = {&t->params[p], &t->exp_avg[p], &t->exp_avg_sq[p]};
        for (int j = 0; j < (moments ? 3 : 1) && st == GT_OK; j++, tag = (tag + 1) % 32768) {
            /* one source, one tag at a time: MPI keeps their order (tags may wrap) */
            if (pp->rank == o) {
                st = gt_comm_send_start(pp->comm, x[j], 0, tag, err);
            } else if (pp->rank == 0) {
                int64_t shape[GT_MAX_DIMS];
                memcpy(shape, x[j]->shape, sizeof shape);
                if (!x[j]->data) st = gt_tensor_alloc(x[j], x[j]->dtype, x[j]->ndim, shape, err);
                if (st == GT_OK) st = gt_comm_recv(pp->comm, x[j], o, tag, err);
            }
            if (st != GT_OK)
                gt_error_wrap(err, "pipeline: %s of stage rank %d to rank 0",
                              t->ckpt_names[j * t->n_params + p], o);
        }
    }
    /* the model's buffers (expert biases, the MoE accumulation's counts): every rank holds them
     * whole, but only the rank of the stage that updates one has its current value */
    const gt_graph *g = t->whole.g;
    for (int32_t k = 0; k < g->n_inputs && st == GT_OK; k++) {
        int32_t o = pp->owner[k];
        if (o <= 0 || !gt_train_is_model_buffer(&g->inputs[k])) continue;
        const char *name = gt_graph_str(g, g->inputs[k].fqn);
        for (int b = 0; b < t->n_bufs && st == GT_OK; b++) {
            if (strcmp(name, t->ckpt_names[3 * t->n_params + b])) continue;
            if (pp->rank == o)
                st = gt_comm_send_start(pp->comm, &t->bufs[b], 0, tag, err);
            else if (pp->rank == 0)
                st = gt_comm_recv(pp->comm, &t->bufs[b], o, tag, err);
            if (st != GT_OK) gt_error_wrap(err, "pipeline: %s of stage rank %d to rank 0", name, o);
            tag = (tag + 1) % 32768;
        }
    }
    gt_status sst = gt_comm_send_wait_all(pp->comm, err);
    return st != GT_OK ? st : sst;
}

void gt_trainer_pp_release(gt_trainer *t)
{
    if (t->pp && t->pp->param_owner) free_others(t);
}

gt_status gt_trainer_pp_hash(gt_trainer *t, uint64_t *hash, gt_error *err)
{
    struct gt_trainer_pp *pp = t->pp;
    uint64_t h = 0;
    gt_status st = pp->rank == 0 ? gt_trainer_params_hash(t, &h, err) : GT_OK;
    st = gt_trainer_pp_agree(t, st, err);
    if (st != GT_OK) return st;
    int64_t one = 1;
    gt_tensor x;
    gt_tensor_wrap(&x, GT_I64, 1, &one, &h);
    GT_TRY(gt_comm_broadcast(pp->comm, &x, 0, err));
    *hash = h;
    return GT_OK;
}
