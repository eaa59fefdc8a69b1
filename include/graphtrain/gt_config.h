/* gt_config.h — the training configuration: one schema declares every option; a run's config is
 * resolved as  defaults ← TOML file ← command-line overrides  into the typed struct gt_config.
 *
 * Sections and keys are spelled as torchtitan spells them (job, model, training, optimizer,
 * lr_scheduler, parallelism, compile, checkpoint, metrics, debug), so `--training.steps 20` and
 * `[training] steps = 20` mean what they mean there. docs/CONFIG.md lists every option and the
 * exact format of every error message.
 *
 *   gt_config cfg;
 *   gt_error err = {0};
 *   if (gt_config_resolve(argc, argv, &cfg, &err) != GT_OK) { print err.msg; exit 1 }
 *   ... cfg.training.steps, cfg.optimizer.lr ...
 *   gt_config_free(&cfg);
 *
 * All errors about the content of a config or a flag are GT_ERR_INVALID; a file that cannot be
 * read is GT_ERR_IO. */
#ifndef GRAPHTRAIN_GT_CONFIG_H
#define GRAPHTRAIN_GT_CONFIG_H

#include <stdio.h>

#include "gt_core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- enumerated options
 * Each enum's order is the order of the allowed names in the schema (first = index 0). */

typedef enum {
    GT_CFG_DATASET_SYNTHETIC = 0, /* "synthetic": built-in corpus, needs no files */
    GT_CFG_DATASET_TEXT,          /* "text": a UTF-8 text file, tokenized */
    GT_CFG_DATASET_JSONL,         /* "jsonl": JSON lines, the "text" field of each, tokenized */
    GT_CFG_DATASET_TOKENS,        /* "tokens": pre-tokenized binary shards (graphtrain tokenize) */
} gt_cfg_dataset;

typedef enum { GT_CFG_PRECISION_BFLOAT16 = 0, GT_CFG_PRECISION_FLOAT32 } gt_cfg_precision;
typedef enum { GT_CFG_DEVICE_CPU = 0, GT_CFG_DEVICE_CUDA } gt_cfg_device;
/* model.attn_mask_type (torchtitan's spelling): "causal" over the whole packed sequence, or
 * "block_causal": each token attends to the earlier tokens of its own document, RoPE positions
 * restart at every document (the default, as torchtitan). */
typedef enum { GT_CFG_ATTN_MASK_CAUSAL = 0, GT_CFG_ATTN_MASK_BLOCK_CAUSAL } gt_cfg_attn_mask;
typedef enum { GT_CFG_OPTIMIZER_ADAMW = 0 } gt_cfg_optimizer;
typedef enum { GT_CFG_DECAY_LINEAR = 0, GT_CFG_DECAY_COSINE } gt_cfg_decay_type;
typedef enum {
    GT_CFG_RESHARD_DEFAULT = 0,
    GT_CFG_RESHARD_ALWAYS,
    GT_CFG_RESHARD_NEVER,
} gt_cfg_reshard;
/* compile.fsdp_gathers: how a block's FSDP all-gathers are posted. */
typedef enum {
    GT_CFG_FSDP_GATHERS_BUCKETED = 0, /* packed into one buffer, one all-gather, unpacked */
    GT_CFG_FSDP_GATHERS_GROUPED,      /* one all-gather per tensor, adjacent: one NCCL group */
} gt_cfg_fsdp_gathers;
typedef enum {
    GT_CFG_MEMORY_DEFAULT = 0,
    GT_CFG_MEMORY_FULL,
    GT_CFG_MEMORY_EAGER,
    GT_CFG_MEMORY_NONE,
    GT_CFG_MEMORY_BUDGET,
} gt_cfg_memory_policy;

/* compile.autoparallel_backend: what the solver decides besides placements. */
typedef enum {
    GT_CFG_AUTOPAR_NATIVE = 0,   /* placements; the configured pass pipeline compiles them */
    GT_CFG_AUTOPAR_AUTOPARALLEL, /* placements and the memory policy from the cost model */
} gt_cfg_autoparallel_backend;

/* checkpoint.async_mode (torchtitan's values): where a save's writes happen. */
typedef enum {
    GT_CFG_ASYNC_DISABLED = 0, /* in the step loop: training waits for the save */
    GT_CFG_ASYNC_ASYNC,        /* a snapshot in host memory, written by a thread while training */
    GT_CFG_ASYNC_PINNED,       /* "async_with_pinned_mem": the same, pinned on the GPU */
} gt_cfg_async_mode;

/* A list of strings (e.g. compile.disable_passes). */
typedef struct {
    char **items;
    int n;
} gt_cfg_strings;

/* ---------------------------------------------------------------- the resolved config
 * Strings are heap-allocated, never NULL (empty = ""); gt_config_free releases them. */

typedef struct {
    char *config_file; /* the TOML file that was loaded ("" = none) */
    char *dump_folder; /* outputs of the run: resolved config, metrics, checkpoints */
    char *description;
    bool print_config; /* print the resolved config at start */
} gt_cfg_job;

typedef struct {
    char *name;           /* model family: "llama3" */
    char *flavor;         /* named size: debugmodel, 1B, 8B, ... */
    char *hf_assets_path; /* folder with tokenizer.json (and Hugging Face weights) */
    gt_cfg_attn_mask attn_mask_type;
} gt_cfg_model;

typedef struct {
    gt_cfg_device device;
    gt_cfg_dataset dataset;
    char *dataset_path;
    char *tokenizer_path;      /* "" = hf_assets_path/tokenizer.json */
    int64_t local_batch_size;  /* sequences per rank per micro-step */
    int64_t global_batch_size; /* -1 = local_batch_size × data-parallel degree */
    int64_t seq_len;
    int64_t steps;
    double max_norm; /* gradient clipping; 0 = off */
    gt_cfg_precision mixed_precision_param;
    gt_cfg_precision mixed_precision_reduce;
    int64_t cpu_threads; /* CPU matmul threads; 0 = the rank's CPUs / ranks on its host */
} gt_cfg_training;

typedef struct {
    gt_cfg_optimizer name;
    double lr, beta1, beta2, eps, weight_decay;
    bool weight_decay_matrices_only; /* decay params of rank >= 2 only (false: every param) */
} gt_cfg_optimizer_section;

typedef struct {
    int64_t warmup_steps;
    /* Fraction of the steps spent decaying, at the end; the steps between warmup and decay keep
     * the peak lr. Unset (has_decay_ratio false): decay over all steps after warmup. */
    bool has_decay_ratio;
    double decay_ratio;
    gt_cfg_decay_type decay_type;
    double min_lr_factor; /* the lr decays to lr × min_lr_factor */
} gt_cfg_lr_scheduler;

typedef struct {
    int64_t data_parallel_replicate_degree;
    int64_t data_parallel_shard_degree; /* -1 = all ranks left over by the other degrees */
    int64_t tensor_parallel_degree;
    bool enable_sequence_parallel;
    int64_t expert_parallel_degree;
    double expert_parallel_capacity_factor; /* 0: worst case */
    int64_t pipeline_parallel_degree;
    char *pipeline_parallel_schedule; /* GPipe, 1F1B, Interleaved1F1B, ZBVZeroBubble, DualPipeV */
    int64_t pipeline_parallel_microbatch_size;
    int64_t pipeline_parallel_layers_per_stage; /* -1: unset */
    int64_t pipeline_parallel_first_stage_less_layers;
    int64_t pipeline_parallel_last_stage_less_layers;
    gt_cfg_reshard fsdp_reshard_after_forward;
    double autoparallel_memory_budget_gb; /* compile.enable_autoparallel; 0: no limit */
    char *autoparallel_comm_profile;      /* measured alpha-beta per mesh dim; "": defaults */
} gt_cfg_parallelism;

/* In the order of gt_nccl_buffers (gt_comm.h), then auto: symmetric where every rank's NCCL
 * supports it and all ranks are on one host, else plain (the trainer decides, one choice for all
 * ranks). */
typedef enum {
    GT_CFG_NCCL_BUFFERS_PLAIN = 0,
    GT_CFG_NCCL_BUFFERS_REGISTRABLE,
    GT_CFG_NCCL_BUFFERS_SYMMETRIC,
    GT_CFG_NCCL_BUFFERS_AUTO
} gt_cfg_nccl_buffers;

/* Communicators (MPI runs). */
typedef struct {
    /* A collective that has not completed after this many seconds fails, naming the rank, the
     * collective and the group (a peer died or is stuck); 0 waits forever. torchtitan's pair:
     * init bounds setup (rendezvous, NCCL, state, the schedule check) and step 1, train every
     * later step. */
    double init_timeout_seconds;
    double train_timeout_seconds;
    /* GPU runs over NCCL: where the collectives' buffers live (gt_nccl_buffers, gt_comm.h):
     * registrable and symmetric put the program's arenas and the communicators' scratch in
     * ncclMemAlloc memory; symmetric also registers them as symmetric windows; auto (the
     * default) is symmetric on one host with NCCL 2.28 or later, else plain. */
    gt_cfg_nccl_buffers nccl_buffers;
} gt_cfg_comm;

typedef enum { GT_CFG_EP_EAGER = 0, GT_CFG_EP_GRAPH } gt_cfg_ep_strategy;
typedef enum { GT_CFG_EP_BATCH = 0, GT_CFG_EP_SEQ } gt_cfg_ep_dim;

/* compile.ep_overlap: torchtitan's EP chunking (docs/TRAINING.md "Chunking the MoE"). */
typedef struct {
    bool enabled;
    gt_cfg_ep_strategy strategy;
    gt_cfg_ep_dim chunk_dim;
    char *module_fqn; /* "layers.*" or "layers.*.moe" */
    bool disable_early_grad_accumulation;
} gt_cfg_ep_overlap;

typedef struct {
    bool enable;
    gt_cfg_memory_policy memory_policy;
    double activation_memory_budget_gb; /* memory_policy = budget */
    double fsdp_bucket_cap_mb;          /* 0: one FSDP bucket per transformer block */
    int64_t fsdp_prefetch_depth;        /* FSDP buckets gathered ahead; 0: one */
    gt_cfg_fsdp_gathers fsdp_gathers;
    gt_cfg_strings disable_passes;
    bool debug_graph_passes;
    char *precompile_artifact_dir;
    bool cudagraphs;          /* training.device = cuda: replay the step as one CUDA graph */
    bool enable_autoparallel; /* placements from the ILP (src/parallel/autoparallel) */
    gt_cfg_autoparallel_backend autoparallel_backend;
    gt_cfg_ep_overlap ep_overlap;
} gt_cfg_compile;

typedef struct {
    bool enable;
    char *folder; /* relative to job.dump_folder unless absolute */
    int64_t interval;
    int64_t keep_latest_k; /* 0 = keep all */
    int64_t load_step;     /* -1 = the latest */
    gt_cfg_async_mode async_mode;
    char *initial_load_path; /* a fresh run's parameters from this Hugging Face folder */
    bool initial_load_in_hf; /* initial_load_path is a Hugging Face folder (the only kind read) */
    bool last_save_in_hf;    /* the last checkpoint also as a Hugging Face folder */
} gt_cfg_checkpoint;

typedef struct {
    int64_t log_freq;
    bool save_jsonl;
    bool enable_tensorboard; /* accepted for torchtitan configs; true is refused */
    double peak_tflops;      /* one device's dense peak for MFU/HFU; 0 = not reported */
    bool comm_report;        /* print the collective timing report after step 2 */
} gt_cfg_metrics;

typedef struct {
    int64_t seed;
    bool deterministic;
    bool moe_force_load_balance; /* MoE models route round-robin (torchtitan's debug option) */
    /* Test-only fault injection for multi-rank runs (docs/CONFIG.md): */
    int64_t test_drop_collective_rank; /* this rank drops its first collective; -1: none */
    char *test_kill_rank_at_step; /* "R:S": rank R kills itself (SIGKILL) at step S; "R:S:stop":
                                   * stops itself (SIGSTOP); "": off */
} gt_cfg_debug;

typedef struct {
    gt_cfg_job job;
    gt_cfg_model model;
    gt_cfg_training training;
    gt_cfg_optimizer_section optimizer;
    gt_cfg_lr_scheduler lr_scheduler;
    gt_cfg_parallelism parallelism;
    gt_cfg_comm comm;
    gt_cfg_compile compile;
    gt_cfg_checkpoint checkpoint;
    gt_cfg_metrics metrics;
    gt_cfg_debug debug;
} gt_config;

/* ---------------------------------------------------------------- the schema */

typedef enum {
    GT_CFG_BOOL,    /* bool */
    GT_CFG_INT,     /* int64_t */
    GT_CFG_FLOAT,   /* double (an integer is accepted and converted) */
    GT_CFG_STRING,  /* char * */
    GT_CFG_ENUM,    /* the option's gt_cfg_* enum: index into choices */
    GT_CFG_STRINGS, /* gt_cfg_strings */
} gt_cfg_type;

typedef struct {
    const char *section, *key;
    gt_cfg_type type;
    size_t offset;               /* of the value in gt_config */
    const char *default_value;   /* as written on the command line; NULL: optional, unset */
    int64_t int_min, int_max;    /* GT_CFG_INT: inclusive range */
    double float_min, float_max; /* GT_CFG_FLOAT: inclusive range */
    const char *const *choices;  /* GT_CFG_ENUM: NULL-terminated allowed names */
    size_t has_offset; /* optional options (default_value NULL): offset of their `bool has_X` */
    const char *help;
} gt_cfg_option;

/* Every option, in section order. */
const gt_cfg_option *gt_config_options(int *n);
/* The option named "section.key", or NULL. */
const gt_cfg_option *gt_config_find_option(const char *name);

/* ---------------------------------------------------------------- resolution */

/* Every option at its default (on a zeroed or freed struct: it does not free what c held). */
void gt_config_defaults(gt_config *c);
void gt_config_free(gt_config *c);
/* Deep copy into dst (dst's old contents are not freed). */
void gt_config_copy(gt_config *dst, const gt_config *src);
/* Same value for every option (floats compared bit for bit). */
bool gt_config_equal(const gt_config *a, const gt_config *b);

/* Applies the options a TOML file sets (on top of what c holds) and records the path in
 * job.config_file. */
gt_status gt_config_load_file(gt_config *c, const char *path, gt_error *err);
/* The same for TOML text in memory; name is used in messages in place of a file name. */
gt_status gt_config_load_string(gt_config *c, const char *text, size_t len, const char *name,
                                gt_error *err);
/* Applies command-line overrides: every argv[i] must be one of
 *   --section.key=value   --section.key value   --section.key (booleans: true)
 *   --config FILE  / --config=FILE   (sets job.config_file; the file is not loaded here)
 * Later occurrences win. Lists take "a,b,c" or a TOML array "[\"a\", \"b\"]". */
gt_status gt_config_apply_overrides(gt_config *c, int argc, char **argv, gt_error *err);
/* Sets one option from its command-line spelling: gt_config_set(c, "training.steps", "20"). */
gt_status gt_config_set(gt_config *c, const char *name, const char *value, gt_error *err);
/* Checks the rules that tie options together (e.g. memory_policy = budget needs a budget). */
gt_status gt_config_validate(const gt_config *c, gt_error *err);
/* All of it: defaults, then the file named by the last --config / --job.config_file (if any),
 * then every override in order, then gt_config_validate. On failure c is freed. */
gt_status gt_config_resolve(int argc, char **argv, gt_config *c, gt_error *err);

/* ---------------------------------------------------------------- output */

/* The config as TOML that parses back to an equal config (every option, one section each). */
void gt_config_print(const gt_config *c, FILE *f);
/* gt_config_print into a file (e.g. DUMP_FOLDER/config.toml). */
gt_status gt_config_write(const gt_config *c, const char *path, gt_error *err);
/* Every option: --section.key, type, default, range or allowed values, help. */
void gt_config_help(FILE *f);
/* The value of one option as TOML text ("8", "0.0008", "\"llama3\"", "[\"a\"]"). */
void gt_config_format_value(const gt_config *c, const gt_cfg_option *o, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif
#endif
