/* gt_train.h — the trainer: config in, a trained model (checkpoints, metrics) out. */
#ifndef GRAPHTRAIN_GT_TRAIN_H
#define GRAPHTRAIN_GT_TRAIN_H

#include "gt_config.h"
#include "gt_model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Summary of a finished run (for tests and the command line). */
typedef struct {
    int64_t first_step, last_step; /* steps this process ran (first_step > last_step: none) */
    double final_loss;             /* loss of the last step run */
    double entropy_rate;           /* synthetic dataset: the corpus' loss floor; else NaN */
    uint64_t params_hash;          /* xxHash64 over every final parameter's bytes, in order */
} gt_train_result;

/* Builds the step graph of cfg's model on symbolic [batch, seq]: forward, loss, backward and, when
 * micro_batches == 1, clipping + AdamW (the whole-step graph). With micro_batches > 1 it builds
 * the micro-batch graph instead: the loss divided by micro_batches before autodiff (as torchtitan
 * rescales it), and every gradient added to an INPUT "grad_accum.<fqn>" running sum that the GRAD
 * outputs return; the optimizer then runs as its own graph (gt_train_build_optimizer_graph). */
gt_status gt_train_build_graph(const gt_config *cfg, gt_graph *g, gt_model *model,
                               int64_t micro_batches, gt_error *err);

/* Runs the pass pipeline on a step graph as cfg's compile section says (disabled passes, memory
 * policy and budget at the configured batch and seq); dump_dir (may be NULL) receives every pass's
 * before/after listing, DOT and op-count diff. gt_train_build_graph calls it when
 * compile.enable. */
gt_status gt_train_compile_graph(const gt_config *cfg, gt_graph *g, const char *dump_dir,
                                 gt_error *err);

/* Runs training as cfg says: builds the whole-step graph (forward, loss, backward, AdamW),
 * resumes from the latest checkpoint when checkpointing is on, logs metrics every log_freq
 * steps, saves checkpoints every interval steps and at the end. result may be NULL. */
gt_status gt_train(const gt_config *cfg, gt_train_result *result, gt_error *err);

/* Loads the parameters of checkpoint `step` (-1: the latest) of the run cfg describes and writes
 * them as a Hugging Face llama directory (dtype f32 or bf16). */
gt_status gt_train_export_hf(const gt_config *cfg, int64_t step, const char *dir, gt_dtype dtype,
                             gt_error *err);

#ifdef __cplusplus
}
#endif
#endif
