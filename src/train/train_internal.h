/* train_internal.h — what the trainer's files share: the trainer (trainer.c runs the loop and owns
 * the step graph's executor, a gt_executor of gt_exec.h), its state (trainer_state.c: moving it
 * into the executor and back, the final hash, freeing it, the export), its data feed
 * (trainer_data.c), ranks and communicators (trainer_parallel.c, which also allocates each rank's
 * blocks of the state), the block of each tensor a rank holds, the moves between blocks and whole
 * tensors, and loading checkpoints (shard_io.c), saving them (checkpoint_save.c). */
#ifndef GRAPHTRAIN_TRAIN_INTERNAL_H
#define GRAPHTRAIN_TRAIN_INTERNAL_H

#include <pthread.h>
#include <string.h>

#include "graphtrain/gt_checkpoint.h"
#include "graphtrain/gt_comm.h"
#include "graphtrain/gt_cuda.h"
#include "graphtrain/gt_data.h"
#include "graphtrain/gt_exec.h"
#include "graphtrain/gt_flops.h"
#include "graphtrain/gt_lr.h"
#include "graphtrain/gt_metrics.h"
#include "graphtrain/gt_optim.h"
#include "graphtrain/gt_program.h"
#include "graphtrain/gt_train.h"

/* The dump folder's lock file: rank 0 holds it (flock) for the whole run. */
#define GT_TRAIN_LOCK_NAME ".graphtrain.lock"

/* DIR/NAME (NAME alone when absolute or DIR is empty); malloc'd. (trainer_data.c) */
char *gt_train_join_path(const char *dir, const char *name);
/* Reads a whole file into a malloc'd buffer (*len bytes; GT_ERR_IO naming path on failure). */
gt_status gt_train_read_file(const char *path, char **buf, size_t *len, gt_error *err);

/* ---------------------------------------------------------------- blocks (shard_io.c) */

/* The block of a global tensor that this rank holds: rows start[d] .. start[d] + size[d] of every
 * dim d, in a local tensor of shape local[] (= size, but for an FSDP-padded dim: ceil(D / n) rows
 * of which the first size[d] hold data, the rest zeros). One rank, or a replicated tensor:
 * start 0, size = local = global. */
typedef struct {
    int ndim;
    int64_t global[GT_MAX_DIMS];
    int64_t start[GT_MAX_DIMS];
    int64_t size[GT_MAX_DIMS];
    int64_t local[GT_MAX_DIMS];
    gt_placement place[GT_MESH_MAX_DIMS];
} gt_shard_box;

/* The whole tensor as the block (one rank, or nothing sharded). */
void gt_shard_box_whole(gt_shard_box *b, int ndim, const int64_t *global);
/* The block of `global` that the rank at coords holds under place (gt_placement_local_box). */
gt_status gt_shard_box_init(gt_shard_box *b, const gt_mesh *mesh,
                            const gt_placement place[GT_MESH_MAX_DIMS], int ndim,
                            const int64_t *global, const int coords[GT_MESH_NDIMS], gt_error *err);
bool gt_shard_box_is_whole(const gt_shard_box *b);
/* local = full[box] (local has the box's size, full the global shape; same dtype). */
void gt_shard_slice(const gt_shard_box *b, const gt_tensor *full, gt_tensor *local);
/* full[box] = local. */
void gt_shard_place(const gt_shard_box *b, const gt_tensor *local, gt_tensor *full);
/* Initialises the block of parameter p (seed) in local: gt_param_init on the global element
 * indices of each run of the block, so every layout holds the bits of the one-rank tensor. */
void gt_shard_init_param(const gt_shard_box *b, const gt_param_spec *p, uint64_t seed,
                         gt_tensor *local);
/* Buffers kept between gathers (free with gt_shard_buffers_free): a rank uses them only for the
 * tensors it is the root of. */
typedef struct {
    void *all, *full;
    size_t all_bytes, full_bytes;
} gt_shard_buffers;
/* One gather of the ranks' blocks of a tensor toward a root, in flight: the views it moves and its
 * request, kept by the caller until gt_shard_gather_finish. */
typedef struct {
    gt_tensor in, out;
    gt_comm_request *req;
    int root;
} gt_shard_gather;
/* Starts sending this rank's block (local) of a tensor to world rank root, a collective over world
 * (world->size > 1: every rank starts it with its own block, the same root, in the same order);
 * root's blocks arrive in buf. Several may be in flight, to different roots. */
gt_status gt_shard_gather_start(gt_comm *world, const gt_tensor *local, int root,
                                gt_shard_buffers *buf, gt_shard_gather *g, gt_error *err);
/* Completes g. On its root, *whole = the whole tensor's bytes (global shape, row-major): blocks
 * that lie in rank order (an FSDP split) are used as gathered, others placed into a whole tensor
 * first; either lives in buf until buf's next use. Elsewhere *whole = NULL. */
gt_status gt_shard_gather_finish(gt_comm *world, const gt_mesh *mesh, const gt_shard_box *mine,
                                 gt_shard_buffers *buf, gt_shard_gather *g, const void **whole,
                                 gt_error *err);
/* Bytes of the whole tensor of box b (its global shape) in dtype dt. */
size_t gt_shard_whole_bytes(const gt_shard_box *b, gt_dtype dt);
/* Start and finish in one (root 0 with one rank, or no world: the rank's tensor placed whole, or
 * local's own data when it is whole already). */
gt_status gt_shard_whole(gt_comm *world, const gt_mesh *mesh, const gt_shard_box *mine,
                         const gt_tensor *local, int root, gt_shard_buffers *buf,
                         const void **whole, gt_error *err);
/* *h = gt_hash64 of the whole tensor's bytes (seed 0) on world rank root (gt_shard_whole); the
 * others leave *h as it is. */
gt_status gt_shard_hash(gt_comm *world, const gt_mesh *mesh, const gt_shard_box *mine,
                        const gt_tensor *local, int root, gt_shard_buffers *buf, uint64_t *h,
                        gt_error *err);
void gt_shard_buffers_free(gt_shard_buffers *buf);

/* ---------------------------------------------------------------- ranks (trainer_parallel.c) */

typedef struct {
    gt_comm *world;                      /* NULL: one process, no MPI */
    gt_comm *dim_comm[GT_MESH_MAX_DIMS]; /* comm k: the ranks that differ only on mesh dim k */
    gt_train_layout layout;
    int rank, size; /* world rank and size: 0 and 1 without MPI */
    /* training.device = cuda with several ranks: one NCCL communicator per mesh dim of size > 1
     * (bootstrapped over that dim's MPI communicator), NULL elsewhere */
    gt_comm *nccl[GT_MESH_MAX_DIMS];
    gt_nccl_buffers
        nccl_buffers; /* --comm.nccl_buffers with auto decided (gt_train_dist_nccl_buffers) */
    bool nccl_buffers_known;
    bool error_agreed; /* the error being returned is every rank's (set by agree / share) */
} gt_train_dist;

/* Every communicator of d gets `seconds` as its timeout (gt_comm_set_timeout): the trainer's
 * switch from comm.init_timeout_seconds to comm.train_timeout_seconds once step 1 is done. */
void gt_train_dist_set_timeout(gt_train_dist *d, double seconds);

/* Joins the MPI world when launched by mpirun, sets the comm timeout, derives the layout and
 * splits one communicator per mesh dim. Errors are the same on every rank. */
gt_status gt_train_dist_init(const gt_config *cfg, gt_train_dist *d, gt_error *err);
void gt_train_dist_free(gt_train_dist *d);
/* More than one rank: collectives and agreement are needed. */
bool gt_train_dist_multi(const gt_train_dist *d);
/* One communicator per mesh dim (d->dim_comm[k]): the ranks whose coordinates differ from this
 * one's only in dim k, split from the world; named "dp_shard/group 2" in messages. */
gt_status gt_train_dist_dim_comms(gt_train_dist *d, gt_error *err);
/* Expert parallel's efsdp and ep communicators (d->dim_comm[GT_MESH_EFSDP], [GT_MESH_EP]) where
 * its mesh has them (trainer_ep_comms.c); nothing otherwise. */
gt_status gt_train_dist_expert_comms(const gt_config *cfg, gt_train_dist *d, gt_error *err);

/* Makes st the outcome on every rank (a collective over the world): when any rank failed, every
 * rank returns the error of the lowest failing rank, prefixed with "rank R: " on the others.
 * st is returned unchanged with one rank. */
gt_status gt_train_agree(gt_train_dist *d, gt_status st, gt_error *err);
/* Rank `root`'s status and message, broadcast: every rank returns it. */
gt_status gt_train_share_status(gt_train_dist *d, int root, gt_status st, gt_error *err);
/* The optimizer's settings from cfg (no norm groups). */
gt_adamw_config gt_train_adamw_config(const gt_config *cfg);
/* Broadcasts an int64 from rank 0. */
gt_status gt_train_share_i64(gt_train_dist *d, int64_t *value, gt_error *err);
/* v[0..n): each slot set by one rank and zero on the others (a collective); afterwards every rank
 * holds every slot (an exact integer sum over the ranks). */
gt_status gt_train_share_slots(gt_train_dist *d, uint64_t *v, int64_t n, gt_error *err);

/* Right after joining the world, before anything that depends on the options: rank 0's resolved
 * config (a hash per option, but for the per-rank ones: job.config_file, job.print_config,
 * job.description, training.cpu_threads) is compared on every rank; a rank whose options differ
 * stops every rank with the first differing option's name and its value there (a collective). */
gt_status gt_train_check_config(gt_train_dist *d, const gt_config *cfg, gt_error *err);

/* Before step 1: every rank's collective schedule (gt_executor_collectives of the executor that
 * runs the step: a program's in execution order, the eager executor's walked from the graph) is
 * compared over the world (gt_comm_check_schedule); a mismatch stops every rank with the first
 * differing collective. With NCCL symmetric windows the entries carry where their buffers lie, so
 * ranks whose memory plans differ stop too. With debug.test_drop_collective_rank = this rank the
 * executor first drops its first collective (fault injection for the test; the CPU program's
 * GT_EXEC_CAP_DROP_COLLECTIVE). */
gt_status gt_train_check_schedule(gt_train_dist *d, const gt_config *cfg, gt_executor *ex,
                                  gt_error *err);

/* Planned and allocated bytes of this rank's program (both arenas; bytes[0..1] planned persistent
 * and step, bytes[2..3] allocated), gathered to rank 0, which logs them per rank (one line when
 * every rank has the same figures). */
gt_status gt_train_report_memory(gt_train_dist *d, const int64_t bytes[4], gt_error *err);

/* The GPU this rank uses: its node-local rank (OMPI_COMM_WORLD_LOCAL_RANK, LOCAL_RANK,
 * MPI_LOCALRANKID or SLURM_LOCALID; else the world rank) modulo the visible devices. */
int gt_train_device_for_rank(const gt_train_dist *d, int n_devices);
/* Threads for this rank's CPU matmuls: training.cpu_threads, or when 0 the rank's CPUs (affinity
 * mask) divided by the ranks on its host (OMPI_COMM_WORLD_LOCAL_SIZE, LOCAL_WORLD_SIZE,
 * MPI_LOCALNRANKS or SLURM_NTASKS_PER_NODE; else every rank of the world), at least 1. The count
 * never changes a result's bits (gt_cpu_set_threads). */
int gt_train_cpu_threads(const gt_config *cfg, const gt_train_dist *d);
/* d->nccl_buffers from --comm.nccl_buffers, once (a collective over the world): auto becomes
 * symmetric when every rank's NCCL supports it and all ranks are on one host (the same kernel boot
 * id and host name), else plain; rank 0 logs the choice and why. An explicit choice that this
 * rank's NCCL cannot give is an error. */
gt_status gt_train_dist_nccl_buffers(gt_train_dist *d, const gt_config *cfg, gt_error *err);
/* The NCCL communicators of a multi-rank GPU run (one per mesh dim of size > 1, ordered with
 * compute_stream, a cudaStream_t as void *, buffers d->nccl_buffers), made once. */
gt_status gt_train_dist_nccl(gt_train_dist *d, const gt_config *cfg, int device,
                             void *compute_stream, gt_error *err);

/* Precompiled step artifacts (artifact.c, --compile.precompile_artifact_dir DIR): DIR/NAME
 * ("step.graph", or "micro_step.graph" with gradient accumulation), a compiled step graph with
 * the key it was compiled for. The key: every option the compiled graph depends on and the
 * layout, as "name = value" lines (malloc'd). save writes it atomically (temporary file, fsync,
 * rename, fsync of DIR); load and parse (the file's bytes, changed in place) check both checksums
 * and the key — another key is a GT_ERR_INVALID naming the first differing line — and read the
 * graph. */
char *gt_train_artifact_key(const gt_config *cfg, const gt_train_layout *layout);
char *gt_train_artifact_path(const char *dir, const char *name);
/* The artifact's name for a step of micro_batches micro-batches: "step.graph", or
 * "micro_step.graph" (the step graph with gradient accumulation's running sums). */
const char *gt_train_artifact_name(int64_t micro_batches);
bool gt_train_artifact_exists(const char *dir, const char *name);
gt_status gt_train_artifact_save(const char *dir, const char *name, const char *key,
                                 const gt_graph *g, gt_error *err);
gt_status gt_train_artifact_load(const char *dir, const char *name, const char *key, gt_graph **out,
                                 gt_error *err);
gt_status gt_train_artifact_parse(const char *path, char *data, size_t size, const char *key,
                                  gt_graph **out, gt_error *err);

/* --metrics.comm_report (comm_report.c), a collective over the world: every rank's timings of the
 * step just run (n collectives, the same schedule on every rank; step_s its step time) go to rank
 * 0, which prints to f one line per collective (kind, mesh dim, bytes, start-to-completion time,
 * exposed time, and the least and most exposed time over the ranks with the rank of the most),
 * totals, expert parallel's token exchange (bytes moved vs valid bytes, from the lowered program
 * prog; NULL: no such line), and each other rank's exposed time and step time. With the step graph
 * g (may be NULL) each line names its start node, and the token exchanges get a total of their
 * own. */
gt_status gt_train_comm_report(gt_train_dist *d, const gt_program *prog, const gt_comm_timing *t,
                               int32_t n, double step_s, const gt_graph *g, FILE *f, gt_error *err);

/* debug.test_kill_rank_at_step: the signal this rank sends itself at `step` ("R:S": SIGKILL, a
 * dead peer; "R:S:stop": SIGSTOP, a peer that hangs), or 0. */
int gt_train_kill_signal(const gt_train_dist *d, const gt_config *cfg, int64_t step);

/* ---------------------------------------------------------------- the trainer (trainer.c) */

/* One executable graph with the host tensors that feed each input. */
typedef struct {
    gt_graph *g;
    gt_tensor **feed;  /* per graph input: the host tensor that holds it (not owned) */
    gt_executor *ex;   /* runs g: eager, the CPU program or the CUDA program (chosen at setup) */
    bool state_loaded; /* ex holds the state (set, or updated there since) */
} gt_step_graph;

/* An asynchronous executor: the step whose loss and grad_norm are still on their way back. */
typedef struct {
    int64_t step; /* 0: none */
    int64_t ticket;
    double lr, t0;
    int64_t run;        /* which run of the whole step graph it was (1-based) */
    double loss_before; /* gradient accumulation: the losses of the micro-batches before the last */
} gt_pending_step;

typedef struct {
    const gt_config *cfg;
    gt_train_dist dist;
    gt_model_config model_cfg;
    gt_model_info model_info;
    gt_model model;
    int n_params;
    /* this rank's blocks: params, exp_avg, exp_avg_sq (n_params each); box[k], box[n + k],
     * box[2n + k] say which block of the whole tensor each holds */
    gt_tensor *params, *exp_avg, *exp_avg_sq;
    bool moments_zero;   /* exp_avg, exp_avg_sq still the zeros of a fresh run: the device zeroes
                            its copies instead of copying them up */
    bool params_pending; /* a fresh GPU run: params not drawn on the host; the first step draws
                            them on the device (gt_trainer_state_to_device) */
    bool device_draw_failed; /* a device draw differed from the CPU's: the host draws the rest */
    gt_shard_box *box;       /* n_ckpt: box[3 n_params + b] is buffer b's (whole) */
    gt_tensor *grads; /* accumulation only: the running gradient sums (BUFFER grad_accum.<fqn>) */
    /* The model's own state buffers (gt_train_is_model_buffer: a MoE layer's expert bias), in
     * step-graph input order: whole tensors on every rank, zeros at the start, carried from their
     * BUFFER_UPDATE each step, checkpointed and hashed after the parameters. */
    int n_bufs;
    gt_tensor *bufs;
    int n_ckpt; /* checkpoint tensors: params, exp_avg, exp_avg_sq (n_params each), the buffers */
    gt_tensor tokens, labels, scalars;    /* per-step inputs (tokens, labels: this rank's rows) */
    gt_tensor positions;                  /* per-token document positions of tokens' rows */
    int64_t doc_bos, doc_eos;             /* the tokens that delimit documents (-1: none) */
    gt_shard_box batch_box;               /* rows of the global batch this rank holds */
    int64_t global_batch;                 /* sequences the loader reads per micro-step */
    int64_t *window;                      /* loader output [global_batch][seq + 1] */
    int64_t *batch_tokens, *batch_labels; /* multi-rank: the global batch before slicing */
    int64_t accum;                        /* micro-batches per step */
    gt_step_graph whole; /* fwd + bwd + optimizer (with accumulation: + the running sums) */
    gt_adamw_config adamw;
    gt_lr_schedule lr;
    gt_synthetic *synthetic;
    gt_tokenizer *tokenizer;
    gt_token_shard shard;
    bool shard_open;
    gt_token_ids text_ids;
    gt_loader *loader;
    gt_sym_binding_entry bind_entries[GT_TRAIN_BINDING_MAX];
    gt_sym_binding binding;
    gt_flops flops; /* of one optimizer step (this rank's share) */
    char *ckpt_folder;
    int64_t resume_step; /* the checkpoint this run resumes from, or GT_CHECKPOINT_NONE */
    char **ckpt_names;   /* params, exp_avg, exp_avg_sq, the buffers (n_ckpt) */
    gt_tensor **ckpt_tensors;
    gt_metrics_writer metrics;
    bool metrics_open;
    gt_tb_writer tb;   /* --metrics.enable_tensorboard (rank 0): tb.file set when open */
    int dump_lock_fd;  /* rank 0: the dump folder's lock file descriptor + 1, or 0 */
    bool cuda;         /* training.device = cuda */
    int device;        /* its CUDA device (the node-local rank modulo the visible GPUs) */
    bool host_stale;   /* the step's executor holds newer state than params/exp_avg/exp_avg_sq */
    double setup_s[3]; /* seconds: graphs built, parameters initialised, step programs built */
    double end_s[2];   /* seconds: the parameters back to the host, their final hash */
    gt_pending_step pending;
    struct gt_ckpt_save *saving; /* checkpoint.async_mode: the save under way, or NULL */
    void *snapshot;              /* its copy of the state: one buffer, kept for the next save */
    size_t snapshot_bytes;
    pthread_t snapshot_thread; /* touching (and pinning) its pages while the first steps run */
    bool snapshot_touching, snapshot_pin, snapshot_pinned, snapshot_pin_failed;
    double snapshot_pin_s;     /* seconds the pinning took */
    gt_error snapshot_pin_err; /* why it failed */
    struct gt_trainer_pp *pp;  /* pipeline_parallel_degree > 1 (trainer_pp.h), else NULL */
} gt_trainer;

/* True when name is prefix followed by fqn ("optim.exp_avg." + "layers.0.attention.wq.weight"). */
bool gt_train_named(const char *name, const char *prefix, const char *fqn);
/* A BUFFER input is either gradient accumulation's running sum of a parameter, placed as that
 * parameter (plan.as_param; zeroed each step, never saved), or the model's own state (a MoE
 * layer's expert bias: carried between steps and saved like a parameter). */
static inline bool gt_train_is_grad_sum(const gt_io *in)
{
    return in->kind == GT_IN_BUFFER && in->plan.as_param;
}
static inline bool gt_train_is_model_buffer(const gt_io *in)
{
    return in->kind == GT_IN_BUFFER && !in->plan.as_param;
}
/* Whether output k of g is the optimizer's gradient norm (src/train/optim.c). */
static inline bool gt_train_is_grad_norm(const gt_graph *g, int32_t k)
{
    return g->outputs[k].kind == GT_OUT_METRIC &&
           !strcmp(gt_graph_str(g, g->outputs[k].fqn), GT_OPTIM_GRAD_NORM_NAME);
}
/* compile.cudagraphs: captures `part` of ex after its warm-up run(s) (gt_executor_capture_part);
 * a capture that fails is a warning naming `what`, and its kernels run one by one. Whether it was
 * captured. */
static inline bool gt_train_capture(gt_executor *ex, gt_run_part part, const char *what)
{
    gt_error cerr = {0};
    bool captured = false;
    if (gt_executor_capture_part(ex, part, &captured, &cerr) != GT_OK)
        gt_log(GT_LOG_WARN, "compile.cudagraphs: %s: %s; running the kernels one by one", what,
               cerr.msg);
    return captured;
}
/* This rank's blocks of the state (trainer_parallel.c): the box of each parameter, moment and of
 * the batch from the step graph's input placements (whole tensors with one rank), parameters
 * initialised (left to the checkpoint when resume_step names one), moments zero, the model's
 * buffers (whole, zeros), the per-step inputs and the checkpoint names. */
gt_status gt_trainer_alloc_state(gt_trainer *t, gt_error *err);

/* Calls fn(global_offset, local_offset, count) for each run of box b (shard_io.c), in row-major
 * order: its rows of the last dim, where rows that lie back to back both in the whole tensor and
 * in the block make one run, so an FSDP block of rows is one run. */
typedef void (*gt_shard_run_fn)(int64_t global_off, int64_t local_off, int64_t count, void *user);
void gt_shard_for_each_run(const gt_shard_box *b, gt_shard_run_fn fn, void *user);

/* Whole-tensor descriptors of the state (global shapes, no data): what the fingerprint and a
 * checkpoint's tensor list describe, whatever the layout. */
typedef struct {
    gt_tensor *desc;
    const gt_tensor **ptrs; /* ptrs[k] = &desc[k], as the checkpoint functions take them */
} gt_whole_descriptors;
gt_whole_descriptors gt_whole_descriptors_of(gt_trainer *t);
void gt_whole_descriptors_free(gt_whole_descriptors *w);
/* *input: the step graph's input that checkpoint tensor k (t->ckpt_tensors[k]) feeds. */
gt_status gt_trainer_ckpt_input(const gt_trainer *t, int k, int32_t *input, gt_error *err);
/* The pinned buffer through which a save's blocks go from the device to the file. */
#define GT_CKPT_BOUNCE_BYTES ((size_t)64 << 20)
/* The pieces a resume reads its blocks in (on the GPU, one pinned buffer of this size a thread). */
#define GT_CKPT_READ_PIECE ((size_t)16 << 20)
/* Threads a rank hashes its share of a checkpoint's tensors on (saving and loading), and reads its
 * blocks on (loading): its CPUs, at most 8. */
static inline int gt_ckpt_io_threads(void)
{
    int n = gt_cpu_count();
    return n < 8 ? n : 8;
}

/* Checkpoints: every rank takes part; whole tensors on disk whatever the layout. Loading in
 * shard_io.c, saving in checkpoint_save.c. With checkpoint.async_mode a save copies the state to
 * host memory and a thread writes it while training goes on: gt_trainer_save_poll (every rank,
 * after every step) finishes it once every rank's thread is done, or waits for it (wait: before
 * the next save, at the end); gt_trainer_save_abandon (teardown) joins the thread and publishes
 * nothing. */
uint64_t gt_trainer_fingerprint(gt_trainer *t);
gt_status gt_trainer_save_checkpoint(gt_trainer *t, int64_t step, gt_error *err);
gt_status gt_trainer_save_poll(gt_trainer *t, int64_t step, bool wait, gt_error *err);
void gt_trainer_save_abandon(gt_trainer *t);
/* checkpoint.async_mode: the snapshot's memory, allocated and touched by a thread (setup; freed
 * by gt_trainer_save_abandon at teardown). */
void gt_trainer_snapshot_prepare(gt_trainer *t);
/* Waits for that thread, which also pins the memory for async_with_pinned_mem on the GPU: at the
 * first save, and for the pinning once the run's first step is queued, so that its wait is part of
 * the warm-up step (pinning stalls the CUDA calls of the step loop while it runs: a step of 8B
 * took 10.3 s instead of 1.3). */
void gt_trainer_snapshot_wait(gt_trainer *t);
/* The state from the host tensors into the step executor's inputs (the device's, or eager's and
 * the CPU program's), before its first run (trainer_state.c; resumed: all but the checkpoint's
 * tensors, which the resume read there, and the gradient sums). On a device (GT_EXEC_CAP_DEVICE)
 * fresh moments and the sums are zeroed there and parameters left pending are drawn there; the host
 * copy is stale from then on. */
gt_status gt_trainer_state_to_device(gt_trainer *t, bool resumed, gt_error *err);
/* The state in the step's executor rather than in the host tensors: a device's (checkpoints then
 * read and write it there, through pinned buffers). */
static inline bool gt_trainer_state_on_device(const gt_trainer *t)
{
    return (gt_executor_caps(t->whole.ex) & GT_EXEC_CAP_DEVICE) != 0;
}
/* Sets resume_step: the latest (or the configured) checkpoint in ckpt_folder, chosen by rank 0
 * and shared, or GT_CHECKPOINT_NONE when there is none. Before the state is allocated, so that a
 * resumed run does not draw parameters the checkpoint replaces. */
gt_status gt_trainer_pick_resume(gt_trainer *t, gt_error *err);
/* Loads checkpoint resume_step into the state if there is one; *step = its step or 0. */
gt_status gt_trainer_resume(gt_trainer *t, int64_t *step, gt_error *err);
/* Refreshes the host state from the step's executor: params and the model's buffers, and unless
 * params_only the optimizer's moments (trainer_state.c). */
gt_status gt_trainer_state_to_host(gt_trainer *t, bool params_only, gt_error *err);
void gt_trainer_refresh_ckpt_tensors(gt_trainer *t);
/* The model's parameter count (elements of every parameter, whole). */
int64_t gt_trainer_param_count(const gt_trainer *t);
/* The final parameters' (and model buffers') hash, the same figure whatever the layout (a
 * collective over the world). */
gt_status gt_trainer_params_hash(gt_trainer *t, uint64_t *hash, gt_error *err);
/* Frees the state: params, moments, sums, boxes, checkpoint names, the scalars. */
void gt_trainer_state_free(gt_trainer *t);
/* Frees everything the trainer holds (trainer.c). */
void gt_trainer_teardown(gt_trainer *t);

/* Hugging Face folders (hf_load.c): a fresh run's parameters from
 * checkpoint.initial_load_path (config.json through the model's adapter; every tensor checked by
 * name, dtype and shape before this rank reads its block of each), and the parameters written as
 * CKPT/step-N-hf by rank 0 (checkpoint.last_save_in_hf; a collective, errors shared). */
gt_status gt_trainer_load_hf(gt_trainer *t, gt_error *err);
gt_status gt_trainer_save_hf(gt_trainer *t, int64_t step, gt_error *err);
/* A fresh run whose parameters come from checkpoint.initial_load_path (not drawn). */
static inline bool gt_trainer_loads_hf(const gt_trainer *t)
{
    return t->resume_step == GT_CHECKPOINT_NONE && t->cfg->checkpoint.initial_load_path[0];
}

/* The data feed (trainer_data.c): the dataset and its loader (every rank reads the whole global
 * batch: the loader sees one rank); the next micro-batch's tokens and labels, this rank's rows of
 * it; freeing both. */
gt_status gt_trainer_open_data(gt_trainer *t, gt_error *err);
gt_status gt_trainer_next_batch(gt_trainer *t, gt_error *err);
void gt_trainer_data_free(gt_trainer *t);

#endif
