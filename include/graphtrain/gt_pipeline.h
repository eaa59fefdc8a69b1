/* gt_pipeline.h — pipeline-parallel schedules as data (issue 39): per rank, the list of actions
 * (forward, backward, input-gradient, weight-gradient, send, receive) of one step, a text form
 * for diffing, a simulator that checks them, and the split of a model's blocks into stages.
 *
 * Stages and ranks. A schedule runs n_stages stages on n_ranks pipeline ranks. GPipe and 1F1B
 * put one stage on each rank; Interleaved1F1B puts stages_per_rank stages on each, looped (stage
 * s on rank s mod n_ranks); ZBVZeroBubble and DualPipeV put two on each in a V (rank r holds
 * stages r and 2 n_ranks - 1 - r, so the first and the last stage share rank 0). Stage 0 holds
 * the token embedding, the last stage the final norm, the output and the loss.
 *
 * Actions. F(s, m): stage s's forward of micro-batch m. B(s, m): its whole backward. I(s, m): the
 * input-gradient part of the backward (what stage s - 1 needs); W(s, m): the weight-gradient part
 * (zero-bubble schedules run it later to fill bubbles). SEND_F(s, m) sends stage s's forward
 * output to stage s + 1, RECV_F(s, m) receives stage s's forward input from stage s - 1;
 * SEND_B(s, m) sends the gradient of stage s's input to stage s - 1, RECV_B(s, m) receives the
 * gradient of stage s's output from stage s + 1. Stages on the same rank hand values over locally
 * (no send or receive). Sends do not block; a receive waits for its send.
 *
 * Text form: torch.distributed.pipelining's spelling, STAGE KIND MICROBATCH with no spaces, e.g.
 * "1F0", "0SEND_F3", "3W2"; one line per rank, "rank R: A A A ...". */
#ifndef GRAPHTRAIN_GT_PIPELINE_H
#define GRAPHTRAIN_GT_PIPELINE_H

#include <stdint.h>
#include <stdio.h>

#include "graphtrain/gt_comm.h"
#include "graphtrain/gt_core.h"
#include "graphtrain/gt_graph.h"
#include "graphtrain/gt_pp_split.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    GT_PP_GPIPE = 0,
    GT_PP_1F1B,
    GT_PP_INTERLEAVED_1F1B,
    GT_PP_ZBV_ZERO_BUBBLE,
    GT_PP_DUALPIPEV,
    GT_PP_N_SCHEDULES
} gt_pp_schedule_kind;

typedef enum {
    GT_PP_F = 0,
    GT_PP_B,
    GT_PP_I,
    GT_PP_W,
    GT_PP_SEND_F,
    GT_PP_RECV_F,
    GT_PP_SEND_B,
    GT_PP_RECV_B,
    GT_PP_N_ACTION_KINDS
} gt_pp_action_kind;

typedef struct {
    gt_pp_action_kind kind;
    int32_t stage;
    int32_t mb; /* micro-batch */
} gt_pp_action;

typedef struct {
    gt_pp_schedule_kind kind;
    int32_t n_ranks, n_stages, n_micro;
    int32_t *stage_rank;    /* [n_stages]: the pipeline rank that runs each stage */
    gt_pp_action **actions; /* [n_ranks][n_actions[r]] in the order rank r runs them */
    int32_t *n_actions;     /* [n_ranks] */
} gt_pp_schedule;

/* The option's spelling (torchtitan's): "GPipe", "1F1B", "Interleaved1F1B", "ZBVZeroBubble",
 * "DualPipeV". */
const char *gt_pp_schedule_name(gt_pp_schedule_kind kind);
/* Errors: a name that is no schedule, naming --parallelism.pipeline_parallel_schedule and the
 * schedules there are. */
gt_status gt_pp_schedule_from_name(const char *name, gt_pp_schedule_kind *out, gt_error *err);
/* Stages per rank when pipeline_parallel_layers_per_stage is unset: 1 for GPipe and 1F1B, 2 for
 * the others (torchtitan's default). */
int gt_pp_default_stages_per_rank(gt_pp_schedule_kind kind);
/* The rank that runs stage s of n_stages on n_ranks for this schedule (looped or V). */
int32_t gt_pp_stage_rank(gt_pp_schedule_kind kind, int32_t n_ranks, int32_t n_stages, int32_t s);
const char *gt_pp_action_kind_name(gt_pp_action_kind kind);

/* Builds every rank's action list: the schedule's compute order (ported from
 * torch.distributed.pipelining; OVERLAP_F_B of DualPipeV is its forward then its backward), then
 * a receive right before each action that needs a value from another rank and a send right after
 * each action that produces one. Errors name the option: too few stages per rank for the schedule
 * (ZBVZeroBubble and DualPipeV need exactly 2; GPipe and 1F1B exactly 1), too few micro-batches
 * (DualPipeV needs at least n_stages; Interleaved1F1B needs a multiple of its rounds). */
gt_status gt_pp_schedule_build(gt_pp_schedule_kind kind, int32_t n_ranks, int32_t stages_per_rank,
                               int32_t n_micro, gt_pp_schedule *out, gt_error *err);
void gt_pp_schedule_free(gt_pp_schedule *s);

/* "1F0", "0SEND_F3" into buf (at least 32 bytes). */
void gt_pp_action_format(gt_pp_action a, char *buf, size_t size);
/* Parses one action of the text form; errors name the text. */
gt_status gt_pp_action_parse(const char *text, gt_pp_action *out, gt_error *err);
/* "rank R: A A ...\n"; with compute_only, the F, B, I and W actions alone (the order the
 * generators produce, comparable with torch's pipeline_order). */
void gt_pp_schedule_print_rank(const gt_pp_schedule *s, int32_t rank, bool compute_only, FILE *f);

/* What the simulator finds, costing F, I and W one time unit each and B two (I + W), with sends
 * and receives free: the step's makespan, each rank's idle fraction of it (its bubble) and over
 * all ranks, and each rank's peak of micro-batches in flight (forwards run whose activations are
 * still held: not yet released by B or W; a micro-batch counts once per stage). */
typedef struct {
    int32_t n_ranks;
    int64_t makespan;
    double bubble;           /* idle time / (n_ranks x makespan) */
    double *rank_bubble;     /* [n_ranks] */
    int32_t *peak_in_flight; /* [n_ranks] */
    int32_t max_in_flight;
} gt_pp_sim;

/* Checks s and runs it: every stage's micro-batches each get one F and one B (or one I and one
 * W) on the stage's rank; every action's input comes from an action earlier on its rank (a local
 * stage's action or a receive), never from a later one; every send has its receive on the peer
 * rank and every receive its send; and the ranks together finish (no receive waits forever: no
 * deadlock). Errors name the rank, the position and the action, and what it waits for. */
gt_status gt_pp_schedule_simulate(const gt_pp_schedule *s, gt_pp_sim *out, gt_error *err);
/* The peak bytes of saved activations each rank holds, replaying its list: F(st, m) adds
 * stage_bytes[st], B(st, m) or W(st, m) releases them (gt_pp_split_saved_bytes gives the bytes of
 * one stage micro-batch). peak receives n_ranks entries. */
void gt_pp_schedule_peak_bytes(const gt_pp_schedule *s, const int64_t *stage_bytes, int64_t *peak);
void gt_pp_sim_free(gt_pp_sim *sim);
/* Calls fn on the actions of pipeline rank `rank` in the order a process runs them: its own
 * list; for -1 (every rank in one process) all ranks' lists merged, the ranks in turn, each up to
 * a receive whose send has not run yet (the runner's and gt_pp_unroll's order). Stops at the
 * first error, wrapped with "rank R action I (A)"; a rank whose receive never gets its send is an
 * error naming the rank and the action (GT_ERR_INVALID). */
gt_status gt_pp_schedule_each(const gt_pp_schedule *s, int32_t rank,
                              gt_status (*fn)(void *user, gt_pp_action a, gt_error *err),
                              void *user, gt_error *err);

/* ---------------------------------------------------------------- stages of a model */

/* The transformer blocks of each stage by torchtitan's rule (generate_llm_fqn_per_model_part):
 * n_layers + first_less + last_less "effective layers" split evenly over n_stages, the first
 * stages taking one more when it does not divide; the embedding counts as first_less layers of
 * stage 0 and the norm and output as last_less of the last. first_layer[s] .. first_layer[s+1] - 1
 * are stage s's blocks (first_layer has n_stages + 1 entries). */
gt_status gt_pp_split_layers(int64_t n_layers, int32_t n_stages, int64_t first_less,
                             int64_t last_less, int64_t *first_layer, gt_error *err);

/* The whole pipeline layout of a run, from the parallelism options. */
typedef struct {
    gt_pp_schedule_kind kind;
    int32_t n_ranks;         /* pipeline_parallel_degree */
    int32_t stages_per_rank; /* from pipeline_parallel_layers_per_stage, or the default */
    int32_t n_stages;
    int32_t n_micro;      /* local_batch_size / pipeline_parallel_microbatch_size */
    int64_t *first_layer; /* [n_stages + 1], gt_pp_split_layers */
} gt_pp_layout;

/* layers_per_stage -1: unset (gt_pp_default_stages_per_rank). Errors name the option at fault:
 * pipeline_parallel_schedule unknown, local_batch_size not a multiple of
 * pipeline_parallel_microbatch_size, a layers_per_stage that does not give a stage count
 * divisible by the degree or the schedule's stages per rank, less_layers that do not fit. */
gt_status gt_pp_layout_init(const char *schedule, int64_t degree, int64_t n_layers,
                            int64_t layers_per_stage, int64_t first_less, int64_t last_less,
                            int64_t local_batch_size, int64_t microbatch_size, gt_pp_layout *out,
                            gt_error *err);
void gt_pp_layout_free(gt_pp_layout *l);

/* ---------------------------------------------------------------- running a step (pp_exec.c) */

/* One training step of g, a one-rank whole-step graph built for s->n_micro micro-batches of
 * gradient accumulation, run in this process as schedule s runs it: each rank's actions in order,
 * the ranks in turn, a receive waiting for its send; F, I, W and B run their stage's node sets of
 * split for their micro-batch, and the optimizer once at the end. inputs[m] holds g->n_inputs
 * tensors for micro-batch m (its tokens and labels; the same parameters and state); the running
 * gradient sums are taken from inputs[0] (zeros) and then from the previous micro-batch. losses[m]
 * receives micro-batch m's LOSS output, outputs[k] g->outputs[k] of the last micro-batch (the
 * updates, the metrics): each given as an empty tensor, which gets bytes of its own, or one with
 * bytes in the value's dtype and shape (a view of the caller's, the last step's), written in
 * place; one this rank does not compute is left as it is. Bitwise the gradient accumulation of
 * gt_eager_run_part over the micro-batches in order. Errors name the rank and action; a W that
 * comes before the previous micro-batch's W of its stage is one. */
gt_status gt_pp_eager_step(const gt_graph *g, const gt_sym_binding *binding,
                           const gt_pp_split *split, const gt_pp_schedule *s,
                           const gt_tensor *const *inputs, gt_tensor *losses, gt_tensor *outputs,
                           gt_error *err);
/* The same step as one rank of a multi-process pipeline: comm's ranks are the pipeline ranks
 * (comm->rank runs s->actions[comm->rank]); crossing values move by gt_comm_send_start /
 * gt_comm_recv, the partial results every rank needs (gradient norm terms) by broadcasts from
 * their stage's rank. Only this rank's outputs are filled (its stages' updates; the losses on the
 * rank of the last stage; the metrics every rank computes); the others stay empty. comm NULL is
 * gt_pp_eager_step. */
gt_status gt_pp_eager_step_rank(const gt_graph *g, const gt_sym_binding *binding,
                                const gt_pp_split *split, const gt_pp_schedule *s, gt_comm *comm,
                                const gt_tensor *const *inputs, gt_tensor *losses,
                                gt_tensor *outputs, gt_error *err);
/* What a step's runner did on this rank: the collectives it started (all-gathers among them)
 * and those it did not need to start because an earlier micro-batch's (or an earlier node's)
 * result served (gt_pp_eager_step_spmd). */
typedef struct {
    int64_t collectives;
    int64_t gathers;
    int64_t collectives_reused;
    int64_t peak_bytes; /* the most bytes of the step's values (activations, gradients, gathered
                         * parameters) held at once; each is freed after its last read here */
    int64_t actions_peak_bytes; /* the same over the schedule's actions, before the optimizer */
    int64_t allocated_bytes;    /* all the step's values together (held if none were freed) */
    int64_t arena_bytes;        /* the one arena the step's values are placed in (offsets planned on
                                 * sizes by gt_pp_step_plan's dry run): >= peak_bytes, the difference
                                 * being fragmentation and GT_PLAN_ALIGN padding */
} gt_pp_step_stats;

/* The same for an SPMD step graph (parallelize's, for a mesh of dp_replicate x dp_shard x tp
 * inside each pipeline stage): its collectives run on dim_comms (per mesh dim, the ranks of this
 * pipeline rank's mesh; a start runs to completion, its wait copies the result), in the order
 * this rank's actions run them, which is the same on every rank of the mesh. comm is the pipeline
 * ranks that share this rank's mesh coordinates. dim_comms NULL is gt_pp_eager_step_rank.
 *
 * Every runner computes a node whose inputs are the same in every micro-batch (parameters, model
 * buffers, and what only they feed: an FSDP gather and its wait) once a step and hands its
 * outputs to the other micro-batches, and to any later node of its stage with the same op,
 * attributes and inputs: the same bits, with each FSDP gather run once a step, its result kept
 * until the step ends. stats (NULL: not wanted) receives the counts. */
gt_status gt_pp_eager_step_spmd(const gt_graph *g, const gt_sym_binding *binding,
                                const gt_pp_split *split, const gt_pp_schedule *s, gt_comm *comm,
                                gt_comm *const *dim_comms, const gt_tensor *const *inputs,
                                gt_tensor *losses, gt_tensor *outputs, gt_pp_step_stats *stats,
                                gt_error *err);

/* The plan of gt_pp_eager_step_spmd's step for pipeline rank `rank` (-1: every rank in one
 * process, gt_pp_eager_step): the same actions, reuse and frees on sizes alone, without running a
 * kernel or moving a byte; stats receives the counts, the peaks and the arena the step will have,
 * equal to the run's (a run places its values by this plan). */
gt_status gt_pp_step_plan(const gt_graph *g, const gt_sym_binding *binding,
                          const gt_pp_split *split, const gt_pp_schedule *s, int32_t rank,
                          gt_pp_step_stats *stats, gt_error *err);

/* ---------------------------------------------------------------- per-stage programs
 * (pp_program.c)
 *
 * Each stage's forward, input-gradient and weight-gradient parts (gt_pp_split) as a compiled
 * program of its own: gt_program_build's schedule, memory plan and lowered instructions on a
 * graph of the part's nodes, whose inputs are the values they read from outside the part and
 * whose outputs are those read outside it, rewritten before that by gt_pp_programs_opts.compile
 * when given (the exact passes): bitwise the part node by node.
 * One program per part serves every micro-batch (its inputs copied in, its outputs copied out to
 * the runner, which holds them per micro-batch in flight). A part's step-invariant nodes (an FSDP
 * gather of a parameter) stay out of it: the runner runs them once a step and hands their outputs
 * in. Its other collectives run in the program on dim_comms. A part with a node only the last
 * micro-batch runs, or with a collective when dim_comms is NULL, stays node by node
 * (gt_pp_part_info.why). */
typedef struct gt_pp_programs gt_pp_programs;

typedef struct {
    int32_t n_nodes;         /* the part's nodes in the step graph */
    int32_t n_invariant;     /* of them, run once a step by the runner, outside the program */
    int32_t n_collectives;   /* the collectives the program starts a run */
    bool loaded;             /* its graph came from an artifact (gt_pp_programs_opts.loaded) */
    int32_t n_program_nodes; /* the nodes its program runs (after gt_pp_programs_opts.compile) */
    bool compiled;           /* false: node by node, for `why` */
    const char *why;         /* static text; NULL when compiled */
    int32_t n_in, n_out;     /* the program's inputs and outputs */
    int64_t live_peak_bytes; /* the memory plan's peak of live bytes in its step arena */
    int64_t planned_bytes;   /* the plan's arenas, both */
    int64_t allocated_bytes; /* what the program allocated for them */
} gt_pp_part_info;

/* Options of gt_pp_programs_build. */
typedef struct {
    /* per mesh dim, as gt_pp_eager_step_spmd's (NULL: none); they must outlive the programs */
    gt_comm *const *dim_comms;
    /* compile on one rank (--compile.precompile_artifact_dir): [n_stages * 3] (stage * 3 + part)
     * or NULL: part graphs read from artifacts; a part that has one runs it (the build takes it
     * over and sets the entry to NULL) once it matches the part built here (nodes, inputs and
     * outputs by name), else the build fails naming it */
    gt_graph **loaded;
    /* the parts' graphs only, no program: what one rank saves for the others (a part with
     * collectives gets its graph even without communicators) */
    bool graphs_only;
    /* NULL, or run on each part graph built here (not on a loaded one, compiled already) before
     * its program: the trainer's exact passes (gt_train_compile_graph_layout) */
    gt_status (*compile)(gt_graph *g, void *user, gt_error *err);
    void *compile_user;
} gt_pp_programs_opts;
/* The programs of the stages pipeline rank `rank` runs (-1: every stage) of g, split by split,
 * under binding (g and binding must outlive them). */
gt_status gt_pp_programs_build(const gt_graph *g, const gt_sym_binding *binding,
                               const gt_pp_split *split, const gt_pp_schedule *s, int32_t rank,
                               const gt_pp_programs_opts *o, gt_pp_programs **out, gt_error *err);
/* Stage `stage`'s part graph (NULL: none: no nodes, node by node, another rank's stage). */
const gt_graph *gt_pp_programs_graph(const gt_pp_programs *p, int32_t stage, gt_pp_part part);
/* Stage `stage`'s part (GT_PP_PART_F, _I or _W): NULL for another part or stage. */
const gt_pp_part_info *gt_pp_programs_info(const gt_pp_programs *p, int32_t stage, gt_pp_part part);
void gt_pp_programs_free(gt_pp_programs *p);

/* gt_pp_eager_step_spmd with each part that has a program in programs run by it (NULL: every
 * part node by node); the same bits, losses and outputs. stats count the values the runner holds
 * (a compiled part's outputs; its intermediate values live in its program's arenas). */
gt_status gt_pp_step_programs(const gt_graph *g, const gt_sym_binding *binding,
                              const gt_pp_split *split, const gt_pp_schedule *s, gt_comm *comm,
                              gt_comm *const *dim_comms, const gt_pp_programs *programs,
                              const gt_tensor *const *inputs, gt_tensor *losses, gt_tensor *outputs,
                              gt_pp_step_stats *stats, gt_error *err);
/* What gt_pp_step_programs_kept keeps from one step to the next: the plan of the runner's arena
 * (its dry run) and the arena. */
typedef struct gt_pp_step_keep gt_pp_step_keep;
/* gt_pp_step_programs for a rank that runs many steps of the same g, binding, split, schedule,
 * communicators and programs: *keep (NULL before the first; gt_pp_step_keep_free after the last)
 * holds the plan and arena of the first step for the next, so a later step runs no dry run and
 * finds its arena paged in. The same bits. */
gt_status gt_pp_step_programs_kept(const gt_graph *g, const gt_sym_binding *binding,
                                   const gt_pp_split *split, const gt_pp_schedule *s, gt_comm *comm,
                                   gt_comm *const *dim_comms, const gt_pp_programs *programs,
                                   const gt_tensor *const *inputs, gt_tensor *losses,
                                   gt_tensor *outputs, gt_pp_step_stats *stats,
                                   gt_pp_step_keep **keep, gt_error *err);
void gt_pp_step_keep_free(gt_pp_step_keep *keep);
/* gt_pp_step_plan of that step. */
gt_status gt_pp_step_plan_programs(const gt_graph *g, const gt_sym_binding *binding,
                                   const gt_pp_split *split, const gt_pp_schedule *s, int32_t rank,
                                   const gt_pp_programs *programs, gt_pp_step_stats *stats,
                                   gt_error *err);

/* ---------------------------------------------------------------- the step as one graph
 * (pp_unroll.c)
 *
 * gt_pp_eager_step's step as a graph of its own that any executor runs (the CUDA program, its
 * CUDA graph): the nodes each action of the schedule runs, copied per micro-batch in the order
 * the actions run, the micro-batch clock first and the optimizer once at the end; a running sum
 * fed from one micro-batch to the next becomes an edge, a step-invariant node (an FSDP gather) is
 * copied once. Its memory plan places every micro-batch's saved activations as the schedule
 * holds them. Bitwise gt_pp_eager_step (tests/numerics/test_pp_unroll.c). One pipeline rank's
 * step moves its crossing values with send_start / recv_start nodes over a mesh dim "pp" added
 * after the graph's own (comms[that dim] = the pipeline ranks' communicator, a host one: MPI or
 * TCP), the values the gradient norm reads from their stage's rank to the others; bitwise
 * gt_pp_eager_step_rank (tests/distributed/test_pp_unroll_mpi.c). */
typedef struct {
    gt_graph *g;
    int32_t n_micro;
    /* [g->n_inputs]: the step graph's input each input is, and its micro-batch (-1: one input
     * every micro-batch reads) */
    int32_t *input_of, *input_mb;
    /* [g->n_outputs]: the step graph's output each output is, and its micro-batch: every
     * micro-batch's LOSS (named "<loss>.mb<m>", a METRIC, before the last), the last one's
     * outputs under their own names and kinds */
    int32_t *output_of, *output_mb;
} gt_pp_unrolled;

/* Unrolls g (a one-rank whole-step graph for s->n_micro micro-batches of accumulation, split by
 * split) for pipeline rank `rank`; -1: every stage in one graph, the ranks' actions merged in
 * the order the in-process runner takes them. per_micro[k] (g->n_inputs entries): input k is a
 * micro-batch's own (its tokens, labels, positions: one input "<name>.mb<m>" per micro-batch);
 * the others are read by every micro-batch. Only inputs some copied node reads become inputs.
 * Errors name the action, node or value at fault (a W before the previous micro-batch's W of its
 * stage among them). For rank >= 0 the outputs are those the rank computes (its stages'
 * updates, the losses on the last stage's rank, the metrics every rank computes). */
gt_status gt_pp_unroll(const gt_graph *g, const gt_pp_split *split, const gt_pp_schedule *s,
                       int32_t rank, const uint8_t *per_micro, gt_pp_unrolled *out, gt_error *err);
void gt_pp_unrolled_free(gt_pp_unrolled *u);

#ifdef __cplusplus
}
#endif

#endif
