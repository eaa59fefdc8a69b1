/* trainer_pp_device.c — a pipeline rank's step on the GPU (training.device = cuda; trainer_pp.h).
 *
 * The rank's actions of the schedule become one graph (gt_pp_unroll: its stages' F, I and W
 * nodes copied per micro-batch in the order its actions run them, the optimizer of its stages
 * once at the end, send_start / recv_start nodes for the values that cross ranks), run by one
 * CUDA executor like any step graph: one memory plan for the micro-batches in flight, printed
 * before step 1. Its transfers go through host memory on the pipeline's communicator (MPI or
 * TCP: NCCL's point-to-point is not built yet). Under compile.cudagraphs, step 1 runs kernel by
 * kernel (the warm-up) and the step is then captured as one CUDA graph per run of kernels between
 * two transfers; later steps replay those graphs with the transfers on the host in between.
 *
 * The rank's state (its stages' parameters, AdamW moments, model buffers) moves into the
 * executor before step 1 and stays there: each step stages only the micro-batches' tokens,
 * labels and positions and the optimizer's scalars, zeroes the running gradient sums, and
 * carries the updates back into their inputs. The host copies are refreshed
 * (gt_trainer_pp_device_to_host) before anything reads them: a checkpoint, the final hash. The
 * kernels are the single-GPU step's, in the same order per micro-batch, so the run is bitwise
 * the one GPU accumulating the same micro-batches (tests/cuda/test_cuda_pp_launch.c). */
#include <stdlib.h>
#include <string.h>

#include "trainer_pp.h"

/* Whether output j of the unrolled graph is micro-batch m's loss, or the gradient norm. */
static bool is_loss(const struct gt_trainer_pp *pp, int32_t j)
{
    return pp->unrolled.output_of[j] == pp->loss_output;
}

gt_status gt_trainer_pp_device_build(gt_trainer *t, gt_error *err)
{
    struct gt_trainer_pp *pp = t->pp;
    int32_t unrolled_nodes = 0;
    GT_TRY(gt_trainer_pp_unrolled_step(t, &unrolled_nodes, err));
    gt_graph *d = pp->unrolled.g;
    GT_TRY(gt_executor_create(d, &t->binding, GT_EXECUTOR_CUDA, NULL, &pp->ex, err));
    gt_comm *comms[GT_MESH_MAX_DIMS] = {NULL};
    comms[d->mesh.ndim - 1] = pp->comm; /* the pp dim gt_pp_unroll adds last */
    GT_TRY(gt_executor_set_comms(pp->ex, comms, err));
    size_t persistent = gt_executor_planned_bytes(pp->ex, GT_ARENA_PERSISTENT);
    size_t step = gt_executor_planned_bytes(pp->ex, GT_ARENA_STEP);
    const gt_program *lowered = gt_executor_lowered(pp->ex);
    gt_log(GT_LOG_INFO,
           "pipeline rank %d on the GPU: its step is one program of %d nodes (%d unrolled: %d "
           "micro-batches), %d inputs, %d outputs; memory plan peak %lld B (%.2f MiB), arenas "
           "%zu B state + %zu B step (%.2f MiB), allocated %zu B",
           pp->rank, d->n_nodes, unrolled_nodes, pp->n_micro, d->n_inputs, d->n_outputs,
           lowered ? (long long)lowered->plan->live_peak_bytes : 0LL,
           lowered ? (double)lowered->plan->live_peak_bytes / (1 << 20) : 0.0, persistent, step,
           (double)(persistent + step) / (1 << 20),
           gt_executor_allocated_bytes(pp->ex, GT_ARENA_PERSISTENT) +
               gt_executor_allocated_bytes(pp->ex, GT_ARENA_STEP));
    return GT_OK;
}

gt_status gt_trainer_pp_device_step(gt_trainer *t, double *grad_norm, gt_error *err)
{
    struct gt_trainer_pp *pp = t->pp;
    const gt_pp_unrolled *u = &pp->unrolled;
    const gt_graph *d = u->g;
    gt_executor *ex = pp->ex;
    /* the state once, before step 1 (drawn or loaded on the host); then the per-step inputs */
    for (int32_t j = 0; j < d->n_inputs; j++) {
        gt_tensor *src = &pp->inputs[u->input_mb[j] < 0 ? 0 : u->input_mb[j]][u->input_of[j]];
        if (d->inputs[j].kind == GT_IN_INPUT)
            GT_TRY(gt_executor_stage_input(ex, j, src, err));
        else if (!pp->dev_loaded)
            GT_TRY(gt_executor_set_input(ex, j, src, err));
        else if (gt_train_is_grad_sum(&d->inputs[j]))
            GT_TRY(gt_executor_zero_input(ex, j, err));
    }
    pp->dev_loaded = true;
    GT_TRY(gt_executor_run_part(ex, GT_RUN_ALL, err));
    pp->dev_ahead = true;
    if (t->cfg->compile.cudagraphs && gt_executor_runs(ex, GT_RUN_ALL) == 1 &&
        gt_train_capture(ex, GT_RUN_ALL, "a pipeline rank's step") && pp->rank == 0)
        gt_log(GT_LOG_INFO, "compile.cudagraphs: a pipeline rank's step is CUDA graphs between "
                            "its sends and receives after 1 warm-up run");
    for (int32_t j = 0; j < d->n_outputs; j++) {
        int32_t in = gt_program_state_input(d, j);
        if (in >= 0 && !gt_train_is_grad_sum(&d->inputs[in]))
            GT_TRY(gt_executor_carry(ex, j, in, err));
        if (is_loss(pp, j) || gt_train_is_grad_norm(d, j))
            GT_TRY(gt_executor_fetch_output(ex, j, err));
    }
    int64_t ticket = -1;
    GT_TRY(gt_executor_end_run(ex, &ticket, err));
    GT_TRY(gt_executor_wait(ex, ticket, err));
    for (int32_t j = 0; j < d->n_outputs; j++) {
        double v = 0;
        if (gt_train_is_grad_norm(d, j))
            GT_TRY(gt_executor_read_scalar(ex, ticket, j, grad_norm, err));
        if (!is_loss(pp, j)) continue;
        /* micro-batch m's loss, on the last stage's rank, as the runner hands it over */
        GT_TRY(gt_executor_read_scalar(ex, ticket, j, &v, err));
        gt_tensor *l = &pp->losses[u->output_mb[j]];
        GT_TRY(gt_trainer_pp_loss_alloc(t, l, err));
        if (l->dtype != GT_F32 || gt_tensor_numel(l) != 1)
            return gt_error_set(err, GT_ERR_INTERNAL, "pipeline: the loss is not one f32");
        *(float *)l->data = (float)v; /* an f32 read as a double: exact both ways */
    }
    return GT_OK;
}

gt_status gt_trainer_pp_device_to_host(gt_trainer *t, gt_error *err)
{
    struct gt_trainer_pp *pp = t->pp;
    if (!pp || !pp->ex || !pp->dev_ahead) return GT_OK;
    const gt_graph *d = pp->unrolled.g;
    for (int32_t j = 0; j < d->n_inputs; j++) {
        const gt_io *in = &d->inputs[j];
        if (in->kind == GT_IN_INPUT || gt_train_is_grad_sum(in)) continue;
        GT_TRY(gt_executor_read_input(pp->ex, j, t->whole.feed[pp->unrolled.input_of[j]], err));
    }
    pp->dev_ahead = false;
    return GT_OK;
}

void gt_trainer_pp_device_free(gt_trainer *t)
{
    struct gt_trainer_pp *pp = t->pp;
    gt_executor_free(pp->ex);
    pp->ex = NULL;
    gt_pp_unrolled_free(&pp->unrolled);
}
