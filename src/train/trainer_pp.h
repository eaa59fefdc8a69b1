/* trainer_pp.h — pipeline parallelism in `graphtrain train` (issue 39): what trainer.c calls when
 * parallelism.pipeline_parallel_degree > 1 (trainer_pp_run.c). Private to src/train.
 *
 * The pipeline trainer is the gradient-accumulation trainer of the other mesh dims with another
 * step. pp is the outermost dim: every pipeline rank runs the trainer of the mesh
 * dp_replicate x dp_shard x tp, expert parallelism inside it (one rank without them), on the config
 * that accumulates the run's micro-batches (local_batch_size = pipeline_parallel_microbatch_size,
 * global_batch_size = the run's), holds its mesh rank's blocks of the whole state, draws the same
 * batches, and runs only its own actions of the schedule (gt_pp_eager_step_spmd), so the step is
 * bitwise that of the mesh's accumulation. Each pipeline rank holds, updates and stores only its
 * stages' parameters, gradient sums and AdamW moments (trainer_pp_state.c): the others' are never
 * drawn or loaded. Before a checkpoint and the final hash the owners send theirs to pipeline rank
 * 0, whose mesh saves and hashes the whole, current state, then frees them again. On the GPU
 * (training.device = cuda, pp alone) the rank's step is one unrolled graph on a CUDA executor
 * that keeps the rank's state on the device (trainer_pp_device.c). */
#ifndef GRAPHTRAIN_TRAINER_PP_H
#define GRAPHTRAIN_TRAINER_PP_H

#include "graphtrain/gt_pipeline.h"
#include "graphtrain/gt_pp_split.h"
#include "train_internal.h"

struct gt_trainer_pp {
    const gt_config *user; /* the run's options (pipeline_parallel_degree > 1) */
    gt_config one;         /* the accumulation config of the mesh the trainer runs (t->cfg) */
    gt_pp_layout layout;
    gt_pp_schedule sched;
    bool sched_built;
    gt_pp_split split;
    bool split_built;
    gt_comm *world; /* every rank */
    gt_comm *comm;  /* the pipeline ranks of this rank's mesh coordinates */
    int rank;
    int32_t n_micro;
    gt_tensor **inputs; /* [n_micro][n_inputs]: views of the state, the micro-batch's tokens */
    gt_tensor *batch;   /* [n_micro][3]: tokens, labels, positions of each micro-batch */
    gt_tensor *losses;  /* [n_micro] */
    gt_tensor *outputs; /* [n_outputs], kept between steps; a state update: a view of its state */
    int32_t n_outputs;
    gt_pp_step_keep *keep; /* the runner's plan and arena, from step 1 on (the CPU) */
    int32_t *owner;        /* [n_inputs]: the pipeline rank that updates input k, or -1 */
    int32_t loss_output;
    bool stats_logged;        /* the collectives of a step, logged once */
    int32_t *param_owner;     /* [n_params]: the pipeline rank of parameter p's stage, or -1 (every
                               * rank holds it); set by gt_trainer_pp_own_state */
    gt_pp_programs *programs; /* this rank's stages' parts as programs (compile.enable), or NULL */
    /* training.device = cuda (trainer_pp_device.c): the rank's step as one graph and the CUDA
     * executor that holds its state between steps */
    gt_pp_unrolled unrolled;
    gt_executor *ex;
    bool dev_loaded; /* the state is in the executor */
    bool dev_ahead;  /* a step ran since the host copies were last refreshed */
};

/* Before setup: checks the pipeline options (errors name the option at fault: the schedule, the
 * layers per stage, the micro-batches), refuses what does not run yet (the GPU, AutoParallel;
 * artifacts without compile.enable), and points t->cfg at the one-rank
 * accumulation config it keeps. cfg must outlive t. */
gt_status gt_trainer_pp_begin(gt_trainer *t, const gt_config *cfg, gt_error *err);
/* Instead of gt_train_dist_init: joins the world (mpirun), whose ranks are the pipeline ranks;
 * t->dist stays a one-rank view (no world, layout of one rank) with dist.rank = the pipeline rank,
 * so rank 0 alone logs and writes the run's files. Checks that every rank has the same options. */
gt_status gt_trainer_pp_dist_init(gt_trainer *t, gt_error *err);
/* The pipeline's own communicators (every rank, and this rank's pipeline) get `seconds`. */
void gt_trainer_pp_set_timeout(gt_trainer *t, double seconds);
/* Instead of building the step graph: the one-rank global graph for t->accum micro-batches, with
 * the passes that see the whole step (gt_trainer_pp_compile_step), its stage split, and
 * on rank 0 the pipeline's line (stages, bubble, peak saved activations per rank). */
gt_status gt_trainer_pp_build(gt_trainer *t, gt_error *err);
/* compile.enable: the passes that see the whole step (GT_PASS_SCOPE_WHOLE: the memory policy and
 * recomputation, CSE, DCE) on t->whole.g, before its stage split (trainer_pp_artifact.c); without
 * it nothing. */
gt_status gt_trainer_pp_compile_step(gt_trainer *t, gt_error *err);
/* compile.enable: this rank's stages' part programs into pp->programs, their collectives on
 * dims (the mesh's communicators, or NULL); with compile.precompile_artifact_dir compiled on one
 * rank, one artifact a stage part (trainer_pp_artifact.c). A collective over the world when the
 * artifacts are used. */
gt_status gt_trainer_pp_programs(gt_trainer *t, gt_comm *const *dims, gt_error *err);
/* gt_train_agree over the pipeline ranks. */
gt_status gt_trainer_pp_agree(gt_trainer *t, gt_status st, gt_error *err);
/* training.device = cuda: this rank's step unrolled into pp->unrolled (gt_pp_unroll), after the
 * passes local to a part (compile.enable); *unrolled_nodes its nodes before them. With
 * compile.precompile_artifact_dir compiled on one rank: world rank 0 saves every pipeline rank's
 * compiled step, DIR/pp_rank<R>_step.graph (key: the run's options and layout, the rank, the
 * micro-batches), and each rank adopts its own in place of the graph it unrolled, whose inputs and
 * outputs it must match. A collective over the world when the artifacts are used. */
gt_status gt_trainer_pp_unrolled_step(gt_trainer *t, int32_t *unrolled_nodes, gt_error *err);
/* One optimizer step: the micro-batches drawn in order, this rank's actions of the schedule, its
 * stages' updates into the host state. *loss (the sum of the micro-batches' losses, in order, as
 * the one-rank trainer sums them) and *grad_norm on every rank. */
gt_status gt_trainer_pp_step(gt_trainer *t, int64_t step, double *loss, double *grad_norm,
                             double *lr, gt_error *err);
/* Stage-local setup (trainer_pp_state.c), called by gt_trainer_alloc_state for parameter p:
 * whether p belongs to another pipeline rank's stage. If so its parameter, AdamW moments and
 * gradient sum get their dtype and shape but no storage, so nothing is drawn or loaded into
 * them (a checkpoint or a Hugging Face folder). */
bool gt_trainer_pp_elsewhere(gt_trainer *t, int p);
/* Stage-local ownership (trainer_pp_state.c), once the state is set up (drawn or loaded): logs on
 * rank 0 the bytes each pipeline rank holds next to those of the mesh rank without the pipeline
 * (setup frees nothing: also the most each held before step 1). A collective over the pipeline
 * ranks. */
gt_status gt_trainer_pp_own_state(gt_trainer *t, gt_error *err);
/* Every stage's parameters (and their AdamW moments with moments) from the rank of their stage to
 * pipeline rank 0, which allocates them to receive, and the model buffers a stage updates (the
 * expert biases, the MoE token-count sums) into rank 0's copies: the whole state, for its mesh to
 * save or hash.
 * A collective over the pipeline ranks. */
gt_status gt_trainer_pp_gather(gt_trainer *t, bool moments, gt_error *err);
/* Pipeline rank 0 frees again what gt_trainer_pp_gather gave it. */
void gt_trainer_pp_release(gt_trainer *t);
/* The final params hash (gt_trainer_params_hash) of the whole state, on every rank: after
 * gt_trainer_pp_gather, pipeline rank 0's mesh hashes it and broadcasts it over the pipeline. */
gt_status gt_trainer_pp_hash(gt_trainer *t, uint64_t *hash, gt_error *err);
/* The run's options as given: t->cfg, or a pipeline's own (gt_trainer_pp_begin's cfg). */
const gt_config *gt_trainer_pp_user_config(const gt_trainer *t);
/* Whether this rank writes the run's files and checkpoints: those of pipeline rank 0's mesh (the
 * others hold the same state after a sync). */
bool gt_trainer_pp_writes(const gt_trainer *t);
void gt_trainer_pp_free(gt_trainer *t);
/* A tensor for one micro-batch's loss (the step graph's LOSS output's dtype and shape). */
gt_status gt_trainer_pp_loss_alloc(gt_trainer *t, gt_tensor *l, gt_error *err);
/* Which of tokens, labels, positions graph input k is (-1: none): a micro-batch's own inputs. */
int gt_trainer_pp_batch_slot(const gt_graph *g, int32_t k);

/* ---------------------------------------------------------------- on the GPU
 * (trainer_pp_device.c: training.device = cuda) */
/* From gt_trainer_pp_build: this rank's step unrolled (gt_pp_unroll) and compiled, its CUDA
 * executor with the pipeline's communicator on the pp dim; its memory plan to the log. */
gt_status gt_trainer_pp_device_build(gt_trainer *t, gt_error *err);
/* The step on the GPU from pp->inputs (the state read from them before step 1 only): each
 * micro-batch's loss into pp->losses on the last stage's rank, the gradient norm into
 * *grad_norm; the updates stay in the executor. */
gt_status gt_trainer_pp_device_step(gt_trainer *t, double *grad_norm, gt_error *err);
/* The executor's state into the host tensors that fed it, when a step ran since (nothing off
 * the GPU). Before a checkpoint or the hash reads them. */
gt_status gt_trainer_pp_device_to_host(gt_trainer *t, gt_error *err);
void gt_trainer_pp_device_free(gt_trainer *t);

#endif
