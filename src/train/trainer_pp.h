/* trainer_pp.h — pipeline parallelism in `graphtrain train` (issue 39): what trainer.c calls when
 * parallelism.pipeline_parallel_degree > 1 (trainer_pp_run.c). Private to src/train.
 *
 * The pipeline trainer is the gradient-accumulation trainer of the other mesh dims with another
 * step. pp is the outermost dim: every pipeline rank runs the trainer of the mesh
 * dp_replicate x dp_shard x tp (one rank without them) on the config that accumulates the run's
 * micro-batches (local_batch_size = pipeline_parallel_microbatch_size, global_batch_size = the
 * run's), holds its mesh rank's blocks of the whole state, draws the same batches, and runs only
 * its own actions of the schedule (gt_pp_eager_step_spmd), so the step is bitwise that of the
 * mesh's accumulation. Each pipeline rank updates only its stages' parameters; before a
 * checkpoint and the final hash the owners broadcast them over the pipeline, so the state that
 * pipeline rank 0's mesh saves and hashes is the whole, current one. */
#ifndef GRAPHTRAIN_TRAINER_PP_H
#define GRAPHTRAIN_TRAINER_PP_H

#include "train_internal.h"

/* Before setup: checks the pipeline options (errors name the option at fault: the schedule, the
 * layers per stage, the micro-batches), refuses what does not run yet (other mesh dims, the GPU,
 * precompiled artifacts), and points t->cfg at the one-rank accumulation config it keeps. cfg
 * must outlive t. */
gt_status gt_trainer_pp_begin(gt_trainer *t, const gt_config *cfg, gt_error *err);
/* Instead of gt_train_dist_init: joins the world (mpirun), whose ranks are the pipeline ranks;
 * t->dist stays a one-rank view (no world, layout of one rank) with dist.rank = the pipeline rank,
 * so rank 0 alone logs and writes the run's files. Checks that every rank has the same options. */
gt_status gt_trainer_pp_dist_init(gt_trainer *t, gt_error *err);
/* Instead of building the step graph: the one-rank global graph for t->accum micro-batches (no
 * passes: the stage split reads its forward, backward and optimizer nodes), its stage split, and
 * on rank 0 the pipeline's line (stages, bubble, peak saved activations per rank). */
gt_status gt_trainer_pp_build(gt_trainer *t, gt_error *err);
/* gt_train_agree over the pipeline ranks. */
gt_status gt_trainer_pp_agree(gt_trainer *t, gt_status st, gt_error *err);
/* One optimizer step: the micro-batches drawn in order, this rank's actions of the schedule, its
 * stages' updates into the host state. *loss (the sum of the micro-batches' losses, in order, as
 * the one-rank trainer sums them) and *grad_norm on every rank. */
gt_status gt_trainer_pp_step(gt_trainer *t, int64_t step, double *loss, double *grad_norm,
                             double *lr, gt_error *err);
/* Every parameter, moment and model buffer from the rank of its stage to every rank (a collective
 * over the pipeline ranks). */
gt_status gt_trainer_pp_sync(gt_trainer *t, gt_error *err);
/* The run's options as given: t->cfg, or a pipeline's own (gt_trainer_pp_begin's cfg). */
const gt_config *gt_trainer_pp_user_config(const gt_trainer *t);
/* Whether this rank writes the run's files and checkpoints: those of pipeline rank 0's mesh (the
 * others hold the same state after a sync). */
bool gt_trainer_pp_writes(const gt_trainer *t);
void gt_trainer_pp_free(gt_trainer *t);

#endif
