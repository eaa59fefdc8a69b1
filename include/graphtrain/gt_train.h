/* gt_train.h — the trainer: config in, a trained model (checkpoints, metrics) out. */
#ifndef GRAPHTRAIN_GT_TRAIN_H
#define GRAPHTRAIN_GT_TRAIN_H

#include "gt_autoparallel.h"
#include "gt_config.h"
#include "gt_model.h"
#include "gt_parallel.h"
#include "gt_pass.h"
#include "gt_pipeline.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Summary of a finished run (for tests and the command line). */
typedef struct {
    int64_t first_step, last_step; /* steps this process ran (first_step > last_step: none) */
    double final_loss;             /* loss of the last step run */
    double entropy_rate;           /* synthetic dataset: the corpus' loss floor; else NaN */
    uint64_t params_hash;          /* xxHash64 over every final parameter's bytes, in order (the
                                    * whole tensors, gathered, in a multi-rank run) */
    int rank, world_size;          /* this process in an MPI run; 0 and 1 otherwise */
    /* On error in a multi-rank run: false when every rank returns the same error (they agreed on
     * it: MPI may be finalised as usual); true when it may be this rank's alone, its peers
     * possibly waiting for it in a collective: exit without finalising MPI, which makes mpirun
     * stop the job. */
    bool error_is_local;
    /* The error aborted an NCCL communicator (a dead or stuck peer): the device may still hold
     * collective kernels that never end, so gt_train left the device state as it was (freeing it
     * would wait for them) and the caller should exit the process without further device or MPI
     * calls. */
    bool device_abandoned;
} gt_train_result;

/* ---------------------------------------------------------------- ranks and the mesh
 *
 * A multi-rank run is launched by mpirun (`mpirun -np 4 graphtrain train ...`); the device mesh
 * comes from the parallelism section: data_parallel_replicate_degree x data_parallel_shard_degree
 * x tensor_parallel_degree, with data_parallel_shard_degree -1 = world size / (replicate x tp). */

/* True when an MPI launcher started this process (Open MPI sets OMPI_COMM_WORLD_SIZE; PMIx and
 * PMI launchers set PMIX_RANK / PMI_SIZE). */
bool gt_train_launched_by_mpi(void);
/* True when a launcher without MPI (torchrun, Slurm, a shell loop) started this process as one of
 * several ranks: WORLD_SIZE is set and is not 1 (a bad value goes on to gt_comm_tcp_world, which
 * names it). */
bool gt_train_launched_by_env(void);

/* Where this process sits: the mesh and its coordinates on it (all zero for one rank). */
typedef struct {
    gt_mesh mesh;
    int coords[GT_MESH_NDIMS];
} gt_train_layout;

/* The layout of rank `rank` of world_size ranks as cfg's parallelism section says; world_size 0:
 * no launcher (`graphtrain graph`): data_parallel_shard_degree -1 means 1 and the mesh may have
 * any size. Errors: expert or pipeline degree > 1 (not supported yet), degrees that do not divide
 * the world, a mesh whose size is not the world size (the message says both and how to launch). */
gt_status gt_train_layout_init(const gt_config *cfg, int world_size, int rank, gt_train_layout *out,
                               gt_error *err);

/* Sequences of one (micro-)step over all ranks: local_batch_size x data-parallel degree
 * (dp_replicate x dp_shard); the value of the graph's "batch" symbol. */
int64_t gt_train_global_batch(const gt_config *cfg, const gt_train_layout *layout);
/* Micro-batches per optimizer step: training.global_batch_size over gt_train_global_batch (1 when
 * global_batch_size is -1); GT_ERR_INVALID naming the option when it is not a multiple. */
gt_status gt_train_micro_batches(const gt_config *cfg, const gt_train_layout *layout,
                                 int64_t *micro, gt_error *err);

/* The symbol binding the step graph a rank runs is planned and run under (gt_parallel.h: in the
 * SPMD graph `batch` is the per-rank batch): "batch" = local_batch_size, "seq" = seq_len, with
 * sequence parallelism "seq_shard" = seq_len / tp, and when the mesh has more than one rank
 * "rank.dp_replicate", "rank.dp_shard", "rank.tp" = layout's coordinates. entries: room for
 * GT_TRAIN_BINDING_MAX. */
#define GT_TRAIN_BINDING_MAX 6
void gt_train_binding(const gt_config *cfg, const gt_train_layout *layout,
                      gt_sym_binding_entry *entries, gt_sym_binding *out);

/* Builds the step graph of cfg's model on symbolic [batch, seq] for the global batch: forward,
 * loss, backward, clipping + AdamW (the whole-step graph). With micro_batches > 1 the batch is one
 * micro-batch's, the loss is divided by micro_batches before autodiff (as torchtitan rescales
 * it), every gradient is added to a BUFFER "grad_accum.<fqn>" running sum (a BUFFER_UPDATE output)
 * and the optimizer reads the sums: a run of the micro-batch part (gt_graph_micro_part) per
 * micro-batch but the last, then a run of the whole graph. */
/* When the layout's mesh has more than one rank the graph is then parallelized
 * (gt_train_parallelize) before the passes run. gt_train_build_graph uses the layout of rank 0 of
 * cfg's mesh with no launcher (gt_train_layout_init with world_size 0). */
gt_status gt_train_build_graph(const gt_config *cfg, gt_graph *g, gt_model *model,
                               int64_t micro_batches, gt_error *err);
gt_status gt_train_build_graph_layout(const gt_config *cfg, const gt_train_layout *layout,
                                      gt_graph *g, gt_model *model, int64_t micro_batches,
                                      gt_error *err);

/* The global graph of gt_train_build_graph_layout, before parallelize and the passes: one rank's
 * view of the global batch. The layout only orders the gradient norm's terms (per placement:
 * gt_adamw_config.norm_groups), so that the SPMD graph joins them with one all-reduce per mesh
 * dim; on one rank they are summed in param order. */
gt_status gt_train_build_global_graph(const gt_config *cfg, const gt_train_layout *layout,
                                      gt_graph *g, gt_model *model, int64_t micro_batches,
                                      gt_error *err);

/* Saves g, the compiled step graph of cfg under layout (gt_train_build_graph_layout with cfg's
 * micro-batches), as the precompiled step artifact DIR/step.graph — DIR/micro_step.graph with
 * gradient accumulation — (DIR = compile.precompile_artifact_dir) that a training run with the
 * same config and layout loads instead of compiling (src/train/artifact.c); *path (malloc'd) names
 * the file. */
gt_status gt_train_precompile(const gt_config *cfg, const gt_train_layout *layout,
                              const gt_graph *g, char **path, gt_error *err);

/* The model's parameters (gt_model) as gt_train_build_graph fills them, without a step graph (a
 * run that loads its compiled step from a precompiled artifact). */
gt_status gt_train_build_model(const gt_config *cfg, gt_model *model, gt_error *err);
/* The model cfg names (model.name, model.flavor) computing in training.mixed_precision_param. */
gt_status gt_train_model_config(const gt_config *cfg, gt_model_config *mc, gt_error *err);

/* Replaces global graph g by its SPMD graph for layout's mesh (gt_parallel_input_layouts +
 * gt_parallelize with sequence_parallel = parallelism.enable_sequence_parallel and
 * fsdp_reshard_after_forward != never); nothing when the mesh is one rank. */
gt_status gt_train_parallelize(const gt_config *cfg, const gt_train_layout *layout, gt_graph *g,
                               gt_error *err);
/* The same; with compile.enable_autoparallel the input placements and the sequence-parallel
 * choice come from the solver (gt_train_autoparallel) and, when explain is not NULL, its
 * explanation is printed there and *chosen (may be NULL) receives the chosen layout's modelled
 * cost and FSDP pass policy. */
gt_status gt_train_parallelize_explain(const gt_config *cfg, const gt_train_layout *layout,
                                       gt_graph *g, FILE *explain, gt_autopar_cost *chosen,
                                       gt_error *err);
/* AutoParallel's layout of global graph g for layout's mesh: the cost model of the run's device
 * (training.device; parallelism.autoparallel_comm_profile), its binding and
 * parallelism.autoparallel_memory_budget_gb (gt_autoparallel.h). */
gt_status gt_train_autoparallel(const gt_config *cfg, const gt_train_layout *layout,
                                const gt_graph *g, const gt_parallel_plan *plan,
                                gt_autopar_result **out, gt_error *err);
/* cfg as the pass pipeline should see it: with compile.autoparallel_backend = autoparallel, the
 * FSDP bucket cap and prefetch depth of the chosen layout's policy (gt_autopar_policy; the
 * user's nonzero values kept), and with a memory budget the memory policy `budget` with what the
 * budget leaves after the layout's parameters, gradients, optimizer state and gathered buckets
 * in flight (a shallow copy: do not free). */
void gt_train_autoparallel_compile_config(const gt_config *cfg, const gt_autopar_cost *chosen,
                                          gt_config *out);
/* With the autoparallel backend, one line into buf saying what it chose for the passes (the
 * explanation's and the train log's); false otherwise. */
bool gt_train_autoparallel_describe(const gt_config *cfg, const gt_config *compile_cfg,
                                    const gt_autopar_cost *chosen, char *buf, size_t len);

/* Runs the pass pipeline on a step graph as cfg's compile section says (disabled passes, memory
 * policy and budget at the configured batch and seq); dump_dir (may be NULL) receives every pass's
 * before/after listing, DOT and op-count diff. gt_train_build_graph calls it when
 * compile.enable. */
gt_status gt_train_compile_graph(const gt_config *cfg, gt_graph *g, const char *dump_dir,
                                 gt_error *err);
/* The same, measuring memory under layout's binding (gt_train_binding). */
gt_status gt_train_compile_graph_layout(const gt_config *cfg, const gt_train_layout *layout,
                                        gt_graph *g, const char *dump_dir, gt_error *err);
/* The same with only the passes of scope (gt_pass_scope): a pipeline runs GT_PASS_SCOPE_WHOLE on
 * the step graph before the stage split and GT_PASS_SCOPE_PART on each stage part after it. */
gt_status gt_train_compile_graph_scope(const gt_config *cfg, const gt_train_layout *layout,
                                       gt_graph *g, const char *dump_dir, gt_pass_scope scope,
                                       gt_error *err);

/* Runs training as cfg says: builds the whole-step graph (forward, loss, backward, AdamW),
 * resumes from the latest checkpoint when checkpointing is on, logs metrics every log_freq
 * steps, saves checkpoints every interval steps and at the end. result may be NULL.
 *
 * Under mpirun (gt_train_launched_by_mpi) every rank calls it: MPI is initialised if it is not
 * yet (the caller finalises it: gt_comm_mpi_finalize), the mesh must have as many ranks as the
 * world, every rank runs the same SPMD step graph on its block of the state, and only rank 0
 * logs metrics, writes metrics.jsonl, config.toml and checkpoints (whole tensors, readable by
 * any layout). */
gt_status gt_train(const gt_config *cfg, gt_train_result *result, gt_error *err);

/* Loads the parameters of checkpoint `step` (-1: the latest) of the run cfg describes and writes
 * them as a Hugging Face llama directory (dtype f32 or bf16). */
gt_status gt_train_export_hf(const gt_config *cfg, int64_t step, const char *dir, gt_dtype dtype,
                             gt_error *err);

/* Pipeline parallelism (trainer_pp.c, issue 39). The stage layout of cfg's parallelism options
 * for its model (gt_pp_layout_init; errors name the option at fault), and the report `graphtrain
 * graph` prints: the blocks of each stage, every rank's schedule in the text form and the
 * simulated bubble and micro-batches in flight (gt_pp_schedule_simulate). */
gt_status gt_train_pp_layout(const gt_config *cfg, const gt_model_config *mc, gt_pp_layout *out,
                             gt_error *err);
gt_status gt_train_pp_print(const gt_config *cfg, const gt_model_config *mc, FILE *f,
                            gt_error *err);

#ifdef __cplusplus
}
#endif
#endif
