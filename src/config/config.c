/* config.c — the option schema, config resolution (defaults ← TOML file ← command line),
 * validation, printing and --help.
 *
 * One table (options[] below) declares every option: its section and key as torchtitan spells
 * them, its type, default, range and help. Everything else — defaults, TOML loading, overrides,
 * printing, help, copy, equality — walks that table and reaches the typed field in gt_config
 * through its offset, so adding an option is one row here plus one field in gt_config.h.
 *
 * Error messages have one fixed shape (docs/CONFIG.md):
 *   WHERE: NAME: PROBLEM
 * WHERE is "FILE:LINE:COL" or "command line"; NAME is "section.key" in a file and "--section.key"
 * on the command line; PROBLEM is "unknown option; did you mean training.steps?", "expected an
 * integer, got string \"ten\"", "out of range: expected an integer >= 1, got 0", "expected one of
 * bfloat16, float32; got \"fp8\"". */
#include "graphtrain/gt_config.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/toml.h"

_Static_assert(
    sizeof(gt_cfg_dataset) == sizeof(int) && sizeof(gt_cfg_precision) == sizeof(int) &&
        sizeof(gt_cfg_device) == sizeof(int) && sizeof(gt_cfg_optimizer) == sizeof(int) &&
        sizeof(gt_cfg_decay_type) == sizeof(int) && sizeof(gt_cfg_reshard) == sizeof(int) &&
        sizeof(gt_cfg_memory_policy) == sizeof(int) && sizeof(gt_cfg_async_mode) == sizeof(int) &&
        sizeof(gt_cfg_ep_strategy) == sizeof(int) && sizeof(gt_cfg_ep_dim) == sizeof(int),
    "enum options are stored and read as int");

/* ---------------------------------------------------------------- the schema */

static const char *const devices[] = {"cpu", "cuda", NULL};
static const char *const attn_masks[] = {"causal", "block_causal", NULL};
static const char *const datasets[] = {"synthetic", "text", "jsonl", "tokens", NULL};
static const char *const precisions[] = {"bfloat16", "float32", NULL};
static const char *const optimizers[] = {"AdamW", NULL};
static const char *const decay_types[] = {"linear", "cosine", NULL};
static const char *const reshards[] = {"default", "always", "never", NULL};
static const char *const fsdp_gathers[] = {"bucketed", "grouped", NULL};
static const char *const nccl_buffers[] = {"plain", "registrable", "symmetric", "auto", NULL};
static const char *const memory_policies[] = {"default", "full", "eager", "none", "budget", NULL};
static const char *const autoparallel_backends[] = {"native", "autoparallel", NULL};
static const char *const async_modes[] = {"disabled", "async", "async_with_pinned_mem", NULL};
static const char *const ep_overlap_strategies[] = {"eager", "graph", NULL};
static const char *const ep_overlap_dims[] = {"batch", "seq", NULL};

#define OPT(sec, k, t) .section = #sec, .key = #k, .type = t, .offset = offsetof(gt_config, sec.k)
#define INT_RANGE(lo, hi) .int_min = (lo), .int_max = (hi)
#define FLOAT_RANGE(lo, hi) .float_min = (lo), .float_max = (hi)
#define MAX_DEGREE ((int64_t)1 << 20)
#define MAX_STEPS ((int64_t)1 << 40)

static const gt_cfg_option options[] = {
    /* job */
    {OPT(job, config_file, GT_CFG_STRING), .default_value = "",
     .help = "TOML file loaded before the command-line overrides (also --config FILE)"},
    {OPT(job, dump_folder, GT_CFG_STRING), .default_value = "./outputs",
     .help = "folder for the run's outputs: config.toml, metrics.jsonl, checkpoint.folder"},
    {OPT(job, description, GT_CFG_STRING), .default_value = "default job",
     .help = "free text describing the run"},
    {OPT(job, print_config, GT_CFG_BOOL), .default_value = "true",
     .help = "print the resolved config at start (it is also written to dump_folder/config.toml)"},
    /* model */
    {OPT(model, name, GT_CFG_STRING), .default_value = "llama3",
     .help = "model family (the registry: src/models/registry.c)"},
    {OPT(model, flavor, GT_CFG_STRING), .default_value = "debugmodel",
     .help = "named model size: debugmodel, 1B, 8B, 70B, 405B, test_tiny, ..."},
    {OPT(model, hf_assets_path, GT_CFG_STRING), .default_value = "",
     .help = "folder of Hugging Face assets: tokenizer.json (and weights)"},
    {OPT(model, attn_mask_type, GT_CFG_ENUM), .default_value = "block_causal",
     .choices = attn_masks,
     .help = "causal: every token sees the whole causal prefix of its sequence; block_causal: "
             "only the earlier tokens of its own document (documents start at BOS), with RoPE "
             "positions restarting at 0 in each"},
    /* training */
    {OPT(training, device, GT_CFG_ENUM), .default_value = "cpu", .choices = devices,
     .help = "where the step runs"},
    {OPT(training, dataset, GT_CFG_ENUM), .default_value = "synthetic", .choices = datasets,
     .help = "synthetic (built in, no files), text (a text file), jsonl (the \"text\" field of "
             "each line), tokens (shards written by graphtrain tokenize)"},
    {OPT(training, dataset_path, GT_CFG_STRING), .default_value = "",
     .help = "dataset file (text, jsonl) or shard file or folder (tokens)"},
    {OPT(training, tokenizer_path, GT_CFG_STRING), .default_value = "",
     .help = "tokenizer.json for text and jsonl data; empty: model.hf_assets_path/tokenizer.json"},
    {OPT(training, local_batch_size, GT_CFG_INT), .default_value = "8",
     INT_RANGE(1, (int64_t)1 << 20), .help = "sequences per rank per micro-step"},
    {OPT(training, global_batch_size, GT_CFG_INT), .default_value = "-1",
     INT_RANGE(-1, (int64_t)1 << 30),
     .help = "sequences per optimizer step over all ranks; -1: local_batch_size x data-parallel "
             "degree; a multiple of that accumulates gradients"},
    {OPT(training, seq_len, GT_CFG_INT), .default_value = "2048", INT_RANGE(1, (int64_t)1 << 24),
     .help = "tokens per sequence"},
    {OPT(training, steps, GT_CFG_INT), .default_value = "10", INT_RANGE(1, MAX_STEPS),
     .help = "optimizer steps to train"},
    {OPT(training, max_norm, GT_CFG_FLOAT), .default_value = "1.0", FLOAT_RANGE(0, INFINITY),
     .help = "clip the global gradient norm to this; 0: no clipping"},
    {OPT(training, mixed_precision_param, GT_CFG_ENUM), .default_value = "bfloat16",
     .choices = precisions,
     .help = "compute dtype of parameters (master weights and optimizer state stay float32); "
             "float32 is faster on CPU"},
    {OPT(training, mixed_precision_reduce, GT_CFG_ENUM), .default_value = "float32",
     .choices = precisions, .help = "dtype of the gradient reduction across data-parallel ranks"},
    {OPT(training, cpu_threads, GT_CFG_INT), .default_value = "0", INT_RANGE(0, 1024),
     .help = "threads for the CPU matmuls of a rank (the same bits on any count); 0: the rank's "
             "CPUs over the ranks sharing its host"},
    /* optimizer */
    {OPT(optimizer, name, GT_CFG_ENUM), .default_value = "AdamW", .choices = optimizers,
     .help = "optimizer"},
    {OPT(optimizer, lr, GT_CFG_FLOAT), .default_value = "8e-4", FLOAT_RANGE(0, INFINITY),
     .help = "peak learning rate"},
    {OPT(optimizer, beta1, GT_CFG_FLOAT), .default_value = "0.9", FLOAT_RANGE(0, 1),
     .help = "AdamW first-moment decay (< 1)"},
    {OPT(optimizer, beta2, GT_CFG_FLOAT), .default_value = "0.95", FLOAT_RANGE(0, 1),
     .help = "AdamW second-moment decay (< 1)"},
    {OPT(optimizer, eps, GT_CFG_FLOAT), .default_value = "1e-8", FLOAT_RANGE(0, 1),
     .help = "AdamW epsilon"},
    {OPT(optimizer, weight_decay, GT_CFG_FLOAT), .default_value = "0.1", FLOAT_RANGE(0, INFINITY),
     .help = "decoupled weight decay (p -= lr x weight_decay x p), applied to every parameter "
             "as torchtitan's AdamW does (norm weights too)"},
    {OPT(optimizer, weight_decay_matrices_only, GT_CFG_BOOL), .default_value = "false",
     .help = "decay only the parameters of rank >= 2 (embeddings and linear weights), not the "
             "norm weights"},
    /* lr_scheduler */
    {OPT(lr_scheduler, warmup_steps, GT_CFG_INT), .default_value = "2", INT_RANGE(0, MAX_STEPS),
     .help = "steps of linear warmup from 0 to the peak lr"},
    {OPT(lr_scheduler, decay_ratio, GT_CFG_FLOAT), .default_value = NULL, FLOAT_RANGE(0, 1),
     .has_offset = offsetof(gt_config, lr_scheduler.has_decay_ratio),
     .help = "fraction of the steps spent decaying, at the end (between warmup and decay the lr "
             "stays at its peak); unset: decay over all steps after warmup"},
    {OPT(lr_scheduler, decay_type, GT_CFG_ENUM), .default_value = "linear", .choices = decay_types,
     .help = "shape of the decay"},
    {OPT(lr_scheduler, min_lr_factor, GT_CFG_FLOAT), .default_value = "0.0", FLOAT_RANGE(0, 1),
     .help = "the lr decays to lr x min_lr_factor"},
    /* parallelism */
    {OPT(parallelism, data_parallel_replicate_degree, GT_CFG_INT), .default_value = "1",
     INT_RANGE(1, MAX_DEGREE), .help = "ranks that hold full replicas (DDP / HSDP replicas)"},
    {OPT(parallelism, data_parallel_shard_degree, GT_CFG_INT), .default_value = "-1",
     INT_RANGE(-1, MAX_DEGREE),
     .help = "ranks that shard parameters (FSDP); -1: every rank the other degrees leave"},
    {OPT(parallelism, tensor_parallel_degree, GT_CFG_INT), .default_value = "1",
     INT_RANGE(1, MAX_DEGREE), .help = "tensor-parallel ranks"},
    {OPT(parallelism, enable_sequence_parallel, GT_CFG_BOOL), .default_value = "true",
     .help = "with tensor parallelism, shard norms and residuals along the sequence"},
    {OPT(parallelism, expert_parallel_degree, GT_CFG_INT), .default_value = "1",
     INT_RANGE(1, MAX_DEGREE), .help = "expert-parallel ranks (MoE models)"},
    {OPT(parallelism, expert_parallel_capacity_factor, GT_CFG_FLOAT), .default_value = "0",
     FLOAT_RANGE(0, INFINITY),
     .help = "expert parallel: rows per rank pair as a fraction of the worst case (0: the worst "
             "case; an overflow is an error naming the factor needed)"},
    {OPT(parallelism, pipeline_parallel_degree, GT_CFG_INT), .default_value = "1",
     INT_RANGE(1, MAX_DEGREE), .help = "pipeline-parallel ranks (the outermost mesh dim)"},
    {OPT(parallelism, pipeline_parallel_schedule, GT_CFG_STRING), .default_value = "1F1B",
     .help = "pipeline schedule: GPipe, 1F1B, Interleaved1F1B, ZBVZeroBubble, DualPipeV "
             "(`graphtrain graph` prints each rank's actions and the simulated bubble)"},
    {OPT(parallelism, pipeline_parallel_microbatch_size, GT_CFG_INT), .default_value = "1",
     INT_RANGE(1, MAX_DEGREE),
     .help = "sequences per pipeline micro-batch; training.local_batch_size / this many "
             "micro-batches per step"},
    {OPT(parallelism, pipeline_parallel_layers_per_stage, GT_CFG_INT), .default_value = "-1",
     INT_RANGE(-1, MAX_DEGREE),
     .help = "transformer blocks per stage, which sets the stage count; -1: 1 stage per rank "
             "(GPipe, 1F1B) or 2 (the others)"},
    {OPT(parallelism, pipeline_parallel_first_stage_less_layers, GT_CFG_INT), .default_value = "1",
     INT_RANGE(0, MAX_DEGREE),
     .help = "the token embedding counts as this many blocks when blocks are split into stages"},
    {OPT(parallelism, pipeline_parallel_last_stage_less_layers, GT_CFG_INT), .default_value = "1",
     INT_RANGE(0, MAX_DEGREE),
     .help = "the final norm and output count as this many blocks when blocks are split into "
             "stages"},
    {OPT(parallelism, fsdp_reshard_after_forward, GT_CFG_ENUM), .default_value = "default",
     .choices = reshards,
     .help = "free gathered parameters after forward and gather them again for the backward: "
             "default (yes, except the last transformer block, the final norm and the output, "
             "whose backward follows at once), always, never"},
    {OPT(parallelism, autoparallel_memory_budget_gb, GT_CFG_FLOAT), .default_value = "0.0",
     FLOAT_RANGE(0, 1e9),
     .help = "compile.enable_autoparallel: the memory per rank (GiB) the chosen layout's "
             "parameters, gradients, optimizer state and activations must fit; 0: no limit"},
    {OPT(parallelism, autoparallel_comm_profile, GT_CFG_STRING), .default_value = "",
     .help = "compile.enable_autoparallel: a file of measured collective costs (lines "
             "`MESH_DIM alpha_seconds beta_bytes_per_second`); empty: the device's defaults"},
    /* comm */
    {OPT(comm, init_timeout_seconds, GT_CFG_FLOAT), .default_value = "300.0", FLOAT_RANGE(0, 1e9),
     .help = "multi-rank runs, setup and step 1: a collective that has not completed after this "
             "many seconds fails with a message naming the rank, the collective and its group (a "
             "peer died, is stuck, or is still setting up); 0: wait forever"},
    {OPT(comm, train_timeout_seconds, GT_CFG_FLOAT), .default_value = "100.0", FLOAT_RANGE(0, 1e9),
     .help = "multi-rank runs, every step after the first: as init_timeout_seconds, usually a "
             "tighter bound"},
    {OPT(comm, nccl_buffers, GT_CFG_ENUM), .default_value = "auto", .choices = nccl_buffers,
     .help = "GPU runs over NCCL: plain allocates the program's arenas with cudaMalloc; "
             "registrable with ncclMemAlloc, so NCCL can register them for zero-copy transfers "
             "between the GPUs of a host; symmetric also registers them and NCCL's scratch as "
             "symmetric windows (NCCL 2.28) and runs all-gathers and exchanges on the copy "
             "engines (NCCL's zero-CTA policy); auto: symmetric when every rank's NCCL is 2.28 or "
             "later and all ranks are on one host, else plain"},
    /* compile */
    {OPT(compile, enable, GT_CFG_BOOL), .default_value = "true",
     .help = "run the pass pipeline on the step graph; false runs the unoptimised graph"},
    {OPT(compile, memory_policy, GT_CFG_ENUM), .default_value = "default",
     .choices = memory_policies,
     .help = "activation recomputation: default, full (recompute every layer), eager (save what "
             "eager mode saves), none (save everything), budget (fit activation_memory_budget_gb)"},
    {OPT(compile, activation_memory_budget_gb, GT_CFG_FLOAT), .default_value = "0.0",
     FLOAT_RANGE(0, 1e6), .help = "activation memory budget in GiB for memory_policy = budget"},
    {OPT(compile, fsdp_bucket_cap_mb, GT_CFG_FLOAT), .default_value = "0.0", FLOAT_RANGE(0, 1e6),
     .help = "fsdp_bucketing: split each transformer block's bucket into pieces of at most this "
             "many MiB (unsharded sizes); 0: one bucket per block (with "
             "compile.autoparallel_backend = autoparallel: the solver's pick)"},
    {OPT(compile, fsdp_prefetch_depth, GT_CFG_INT), .default_value = "0", INT_RANGE(0, 8),
     .help = "fsdp_reorder: how many FSDP buckets are gathered ahead of the one computing; 0: "
             "one (with compile.autoparallel_backend = autoparallel: the solver's pick)"},
    {OPT(compile, fsdp_gathers, GT_CFG_ENUM), .default_value = "bucketed", .choices = fsdp_gathers,
     .help = "FSDP parameter all-gathers: bucketed gathers a block's shards as one buffer (cast "
             "straight into it, reused by the backward's re-gather) and unpacks the tensors "
             "(copies on the compute stream); grouped gathers "
             "each tensor into place, a block's gathers posted together (one NCCL group on "
             "GPUs); gradient reduce-scatters stay bucketed either way"},
    {OPT(compile, disable_passes, GT_CFG_STRINGS), .default_value = "",
     .help = "passes to remove from the pipeline, by name (a,b)"},
    {OPT(compile, debug_graph_passes, GT_CFG_BOOL), .default_value = "false",
     .help = "dump the graph before and after every pass into dump_folder"},
    {OPT(compile, cudagraphs, GT_CFG_BOOL), .default_value = "true",
     .help = "training.device = cuda: capture the whole step as one CUDA graph after a warm-up "
             "step and replay it (bitwise the same as without)"},
    {OPT(compile, enable_autoparallel, GT_CFG_BOOL), .default_value = "false",
     .help = "choose every parameter's placement on the mesh the degrees give with an ILP over "
             "the sharding rules' strategies and a cost model (CBC; docs/DISTRIBUTED.md)"},
    {OPT(compile, autoparallel_backend, GT_CFG_ENUM), .default_value = "native",
     .choices = autoparallel_backends,
     .help = "compile.enable_autoparallel: native compiles the chosen layout with the configured "
             "passes; autoparallel also takes the memory policy, the FSDP bucket size and the "
             "prefetch depth from the solver's cost model and "
             "parallelism.autoparallel_memory_budget_gb (a nonzero fsdp_bucket_cap_mb or "
             "fsdp_prefetch_depth of yours wins)"},
    {OPT(compile, precompile_artifact_dir, GT_CFG_STRING), .default_value = "",
     .help = "folder of the precompiled step (DIR/step.graph; micro_step.graph with gradient "
             "accumulation): every rank loads it when it is there and was compiled for this "
             "run's model, layout and compile options (another is an error naming the option); "
             "else rank 0 compiles the step and saves it there and the other ranks load it"},
    /* checkpoint */
    /* the EP chunking of torchtitan's graph trainer (compile.ep_overlap.*): the MoE regions split
     * in two along the batch or the sequence */
    {.section = "compile.ep_overlap",
     .key = "enabled",
     .type = GT_CFG_BOOL,
     .offset = offsetof(gt_config, compile.ep_overlap.enabled),
     .default_value = "false",
     .help = "split the selected modules' tokens in two chunks (DeepSeek-V3's MoE blocks)"},
    {.section = "compile.ep_overlap",
     .key = "strategy",
     .type = GT_CFG_ENUM,
     .offset = offsetof(gt_config, compile.ep_overlap.strategy),
     .default_value = "graph",
     .choices = ep_overlap_strategies,
     .help = "graph: a pass over the forward graph splits the regions; eager: the model builder "
             "builds each module once per chunk (the numerical reference)"},
    {.section = "compile.ep_overlap",
     .key = "chunk_dim",
     .type = GT_CFG_ENUM,
     .offset = offsetof(gt_config, compile.ep_overlap.chunk_dim),
     .default_value = "batch",
     .choices = ep_overlap_dims,
     .help = "batch, or seq (only with module_fqn layers.*.moe: attention needs whole sequences)"},
    {.section = "compile.ep_overlap",
     .key = "module_fqn",
     .type = GT_CFG_STRING,
     .offset = offsetof(gt_config, compile.ep_overlap.module_fqn),
     .default_value = "layers.*",
     .help = "the chunked modules: layers.* (each MoE block) or layers.*.moe (each MoE)"},
    {.section = "compile.ep_overlap",
     .key = "disable_early_grad_accumulation",
     .type = GT_CFG_BOOL,
     .offset = offsetof(gt_config, compile.ep_overlap.disable_early_grad_accumulation),
     .default_value = "false",
     .help = "graph strategy: each chunk casts the parameters itself and their f32 gradients are "
             "added after the casts, as eager chunking does (bitwise equal to it); false: one "
             "cast shared by the chunks, gradients added before it"},
    {OPT(checkpoint, enable, GT_CFG_BOOL), .default_value = "false",
     .help = "save checkpoints and resume from the latest one"},
    {OPT(checkpoint, folder, GT_CFG_STRING), .default_value = "checkpoint",
     .help = "checkpoint folder, inside job.dump_folder unless absolute"},
    {OPT(checkpoint, interval, GT_CFG_INT), .default_value = "500", INT_RANGE(1, MAX_STEPS),
     .help = "steps between checkpoints (one is also written at the end)"},
    {OPT(checkpoint, keep_latest_k, GT_CFG_INT), .default_value = "10",
     INT_RANGE(0, (int64_t)1 << 30),
     .help = "checkpoints kept; older ones are deleted; 0: keep all"},
    {OPT(checkpoint, load_step, GT_CFG_INT), .default_value = "-1", INT_RANGE(-1, MAX_STEPS),
     .help = "step to resume from; -1: the latest checkpoint"},
    {OPT(checkpoint, async_mode, GT_CFG_ENUM), .default_value = "disabled", .choices = async_modes,
     .help = "disabled: training waits for each save; async: the state is copied to host memory "
             "and written by a thread while training goes on; async_with_pinned_mem: the same "
             "through pinned memory on the GPU (fast copies, locked host memory)"},
    {OPT(checkpoint, initial_load_path, GT_CFG_STRING), .default_value = "",
     .help = "a run with no checkpoint to resume starts from this model instead of drawing its "
             "parameters (fine-tuning): a Hugging Face folder (config.json checked against the "
             "flavor, model.safetensors or model-0000k-of-0000n.safetensors with their index, "
             "float32 or bfloat16); needs checkpoint.initial_load_in_hf"},
    {OPT(checkpoint, initial_load_in_hf, GT_CFG_BOOL), .default_value = "false",
     .help = "initial_load_path is in the Hugging Face format (the only one read)"},
    {OPT(checkpoint, last_save_in_hf, GT_CFG_BOOL), .default_value = "false",
     .help = "also write the last checkpoint as a Hugging Face folder, "
             "checkpoint.folder/step-N-hf (config.json, float32 safetensors)"},
    /* metrics */
    {OPT(metrics, log_freq, GT_CFG_INT), .default_value = "10", INT_RANGE(1, MAX_STEPS),
     .help = "steps between metric lines"},
    {OPT(metrics, save_jsonl, GT_CFG_BOOL), .default_value = "true",
     .help = "append every metric line to dump_folder/metrics.jsonl"},
    {OPT(metrics, enable_tensorboard, GT_CFG_BOOL), .default_value = "false",
     .help = "also write every metric line as TensorBoard scalars into dump_folder/tb "
             "(events.out.tfevents.* files; `tensorboard --logdir DUMP_FOLDER/tb`)"},
    {OPT(metrics, peak_tflops, GT_CFG_FLOAT), .default_value = "0.0", FLOAT_RANGE(0, 1e9),
     .help = "dense peak TFLOP/s of one device, for MFU and HFU (989 for H100/H200 bf16); 0: MFU "
             "is not reported (CPU)"},
    {OPT(metrics, comm_report, GT_CFG_BOOL), .default_value = "false",
     .help = "after step 2 (step 1 warms up), rank 0 prints every collective of its step: bytes, "
             "time from start to completion, the part not hidden behind compute (exposed), and "
             "the least and most exposed time over all ranks (with the rank of the most); then "
             "each other rank's exposed and step time"},
    /* debug */
    {OPT(debug, seed, GT_CFG_INT), .default_value = "0", INT_RANGE(0, INT64_MAX),
     .help = "seed of initialisation, data order and dropout-like randomness (torchtitan's None "
             "is 0 here)"},
    {OPT(debug, deterministic, GT_CFG_BOOL), .default_value = "false",
     .help = "also fix choices that could vary between runs (e.g. GPU algorithm selection); "
             "kernels are deterministic in any case"},
    {OPT(debug, moe_force_load_balance, GT_CFG_BOOL), .default_value = "false",
     .help = "mixture-of-experts models route tokens round-robin over the experts (torchtitan's "
             "_debug_force_load_balance): balanced loads for tests and benchmarks"},
    {OPT(debug, test_drop_collective_rank, GT_CFG_INT), .default_value = "-1",
     INT_RANGE(-1, MAX_DEGREE),
     .help = "TEST ONLY: this rank drops the first collective of its step program, so the "
             "cross-rank schedule check must stop every rank before step 1; -1: off"},
    {OPT(debug, test_kill_rank_at_step, GT_CFG_STRING), .default_value = "",
     .help = "TEST ONLY: \"R:S\" makes rank R kill itself with SIGKILL at the start of step S "
             "(a dead peer); \"R:S:stop\" stops it with SIGSTOP instead (a hung peer, for the "
             "comm timeout); empty: off"},
};

#define N_OPTIONS ((int)(sizeof options / sizeof options[0]))

const gt_cfg_option *gt_config_options(int *n)
{
    if (n) *n = N_OPTIONS;
    return options;
}

static const gt_cfg_option *find_option(const char *name, size_t len)
{
    for (int i = 0; i < N_OPTIONS; i++) {
        size_t ls = strlen(options[i].section), lk = strlen(options[i].key);
        if (len == ls + 1 + lk && !memcmp(name, options[i].section, ls) && name[ls] == '.' &&
            !memcmp(name + ls + 1, options[i].key, lk))
            return &options[i];
    }
    return NULL;
}

const gt_cfg_option *gt_config_find_option(const char *name)
{
    return name ? find_option(name, strlen(name)) : NULL;
}

static bool is_section(const char *name, size_t len)
{
    for (int i = 0; i < N_OPTIONS; i++)
        if (strlen(options[i].section) == len && !memcmp(options[i].section, name, len))
            return true;
    return false;
}

/* ---------------------------------------------------------------- suggestions */

/* Levenshtein distance (unit costs) of the first 100 bytes of each string. */
static int edit_distance(const char *a, size_t la, const char *b, size_t lb)
{
    int row[101], prev[101];
    if (la > 100) la = 100;
    if (lb > 100) lb = 100;
    for (size_t j = 0; j <= lb; j++)
        prev[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        row[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int best = prev[j - 1] + (a[i - 1] != b[j - 1]);
            if (prev[j] + 1 < best) best = prev[j] + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            row[j] = best;
        }
        memcpy(prev, row, (lb + 1) * sizeof *row);
    }
    return prev[lb];
}

/* The valid option nearest to an unknown name: an option with the same key in another section
 * (training.lr → optimizer.lr) first, else the smallest edit distance over "section.key". */
static const gt_cfg_option *suggest_option(const char *name, size_t len)
{
    const char *dot = memchr(name, '.', len);
    const char *key = dot ? dot + 1 : name;
    size_t klen = len - (size_t)(key - name);
    for (int i = 0; i < N_OPTIONS; i++)
        if (strlen(options[i].key) == klen && !memcmp(options[i].key, key, klen))
            return &options[i];
    const gt_cfg_option *best = &options[0];
    int best_d = 1 << 30;
    for (int i = 0; i < N_OPTIONS; i++) {
        char full[128];
        int n = snprintf(full, sizeof full, "%s.%s", options[i].section, options[i].key);
        int d = edit_distance(name, len, full, (size_t)n);
        if (d < best_d) best_d = d, best = &options[i];
    }
    return best;
}

static const char *suggest_section(const char *name, size_t len)
{
    const char *best = options[0].section;
    int best_d = 1 << 30;
    for (int i = 0; i < N_OPTIONS; i++) {
        int d = edit_distance(name, len, options[i].section, strlen(options[i].section));
        if (d < best_d) best_d = d, best = options[i].section;
    }
    return best;
}

/* A key or "section.key" for messages: as is when printable, else as a quoted string. */
static void show_name(const char *s, size_t len, char *buf, size_t cap)
{
    bool plain = len > 0 && len <= 80;
    for (size_t i = 0; plain && i < len; i++)
        plain = s[i] > 0x20 && s[i] < 0x7f && s[i] != '"';
    if (plain)
        snprintf(buf, cap, "%.*s", (int)len, s);
    else
        gt_toml_quote(s, len, 60, buf, cap);
}

/* ---------------------------------------------------------------- setting values */

/* Where a value came from, for messages: where = "FILE:LINE:COL" or "command line". */
typedef struct {
    const char *where;
    bool cli; /* names are shown as --section.key; string values without the word "string" */
} origin;

static void *field(gt_config *c, const gt_cfg_option *o)
{
    return (char *)c + o->offset;
}

static const void *cfield(const gt_config *c, const gt_cfg_option *o)
{
    return (const char *)c + o->offset;
}

static gt_status fail(const origin *org, const gt_cfg_option *o, gt_error *err, const char *fmt,
                      ...) __attribute__((format(printf, 4, 5)));

static gt_status fail(const origin *org, const gt_cfg_option *o, gt_error *err, const char *fmt,
                      ...)
{
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return gt_error_set(err, GT_ERR_INVALID, "%s: %s%s.%s: %s", org->where, org->cli ? "--" : "",
                        o->section, o->key, msg);
}

static gt_status unknown_option(const origin *org, const char *name, size_t len, gt_error *err)
{
    char shown[200];
    show_name(name, len, shown, sizeof shown);
    const gt_cfg_option *s = suggest_option(name, len);
    const char *dash = org->cli ? "--" : "";
    return gt_error_set(err, GT_ERR_INVALID, "%s: %s%s: unknown option; did you mean %s%s.%s?",
                        org->where, dash, shown, dash, s->section, s->key);
}

static void describe(const gt_toml_value *v, const origin *org, char *buf, size_t cap)
{
    if (org->cli && v->type == GT_TOML_STRING)
        gt_toml_quote(v->as.str.data, v->as.str.len, 60, buf, cap);
    else
        gt_toml_describe(v, buf, cap);
}

static char *dup_bytes(const char *s, size_t len)
{
    char *d = gt_xmalloc(len + 1);
    memcpy(d, s, len);
    d[len] = '\0';
    return d;
}

static void strings_free(gt_cfg_strings *l)
{
    for (int i = 0; i < l->n; i++)
        free(l->items[i]);
    free(l->items);
    l->items = NULL;
    l->n = 0;
}

static void range_text(const gt_cfg_option *o, char *buf, size_t cap)
{
    char lo[48], hi[48];
    if (o->type == GT_CFG_INT) {
        if (o->int_max == INT64_MAX)
            snprintf(buf, cap, ">= %lld", (long long)o->int_min);
        else
            snprintf(buf, cap, "in [%lld, %lld]", (long long)o->int_min, (long long)o->int_max);
        return;
    }
    gt_toml_format_float(o->float_min, lo, sizeof lo);
    gt_toml_format_float(o->float_max, hi, sizeof hi);
    if (isinf(o->float_max))
        snprintf(buf, cap, ">= %s", lo);
    else
        snprintf(buf, cap, "in [%s, %s]", lo, hi);
}

static void choices_text(const gt_cfg_option *o, char *buf, size_t cap)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; o->choices[i] && used < cap; i++)
        used += (size_t)snprintf(buf + used, cap - used, "%s%s", i ? ", " : "", o->choices[i]);
}

/* Type-checks v against o and stores it. */
static gt_status set_value(gt_config *c, const gt_cfg_option *o, const gt_toml_value *v,
                           const origin *org, gt_error *err)
{
    char got[200], text[200];
    describe(v, org, got, sizeof got);
    void *dst = field(c, o);
    switch (o->type) {
    case GT_CFG_BOOL:
        if (v->type != GT_TOML_BOOLEAN)
            return fail(org, o, err, "expected true or false, got %s", got);
        *(bool *)dst = v->as.boolean;
        break;
    case GT_CFG_INT:
        if (v->type != GT_TOML_INTEGER)
            return fail(org, o, err, "expected an integer, got %s", got);
        if (v->as.integer < o->int_min || v->as.integer > o->int_max) {
            range_text(o, text, sizeof text);
            return fail(org, o, err, "out of range: expected an integer %s, got %lld", text,
                        (long long)v->as.integer);
        }
        *(int64_t *)dst = v->as.integer;
        break;
    case GT_CFG_FLOAT: {
        double d;
        if (v->type == GT_TOML_FLOAT)
            d = v->as.number;
        else if (v->type == GT_TOML_INTEGER)
            d = (double)v->as.integer;
        else
            return fail(org, o, err, "expected a number, got %s", got);
        if (!(d >= o->float_min && d <= o->float_max)) { /* also catches nan */
            char shown[48];
            range_text(o, text, sizeof text);
            gt_toml_format_float(d, shown, sizeof shown);
            return fail(org, o, err, "out of range: expected a number %s, got %s", text, shown);
        }
        *(double *)dst = d;
        if (o->has_offset) *(bool *)((char *)c + o->has_offset) = true;
        break;
    }
    case GT_CFG_STRING:
        if (v->type != GT_TOML_STRING) return fail(org, o, err, "expected a string, got %s", got);
        if (strlen(v->as.str.data) != v->as.str.len)
            return fail(org, o, err, "the string contains a NUL character (\\u0000)");
        free(*(char **)dst);
        *(char **)dst = dup_bytes(v->as.str.data, v->as.str.len);
        break;
    case GT_CFG_ENUM: {
        if (v->type == GT_TOML_STRING)
            for (int i = 0; o->choices[i]; i++)
                if (strlen(o->choices[i]) == v->as.str.len &&
                    !memcmp(o->choices[i], v->as.str.data, v->as.str.len)) {
                    *(int *)dst = i;
                    return GT_OK;
                }
        choices_text(o, text, sizeof text);
        return fail(org, o, err, "expected one of %s; got %s", text, got);
    }
    case GT_CFG_STRINGS: {
        if (v->type != GT_TOML_ARRAY)
            return fail(org, o, err, "expected an array of strings, got %s", got);
        for (int i = 0; i < v->as.array.n; i++) {
            const gt_toml_value *item = v->as.array.items[i];
            gt_toml_describe(item, got, sizeof got);
            if (item->type != GT_TOML_STRING)
                return fail(org, o, err, "expected an array of strings, element %d is %s", i + 1,
                            got);
            if (strlen(item->as.str.data) != item->as.str.len)
                return fail(org, o, err, "element %d contains a NUL character (\\u0000)", i + 1);
        }
        gt_cfg_strings *l = dst;
        strings_free(l);
        l->n = v->as.array.n;
        l->items = gt_xcalloc((size_t)(l->n ? l->n : 1), sizeof *l->items);
        for (int i = 0; i < l->n; i++)
            l->items[i] =
                dup_bytes(v->as.array.items[i]->as.str.data, v->as.array.items[i]->as.str.len);
        break;
    }
    }
    return GT_OK;
}

static gt_toml_value *string_value(const char *s, size_t len)
{
    gt_toml_value *v = gt_xcalloc(1, sizeof *v);
    v->type = GT_TOML_STRING;
    v->as.str.data = dup_bytes(s, len);
    v->as.str.len = len;
    return v;
}

/* A command-line value, as typed: converted to the TOML value it stands for, so that files and
 * flags share one checking path. Text that does not read as the expected type stays a string,
 * which set_value then refuses with "expected ..., got \"text\"". */
static gt_status set_from_text(gt_config *c, const gt_cfg_option *o, const char *text,
                               const origin *org, gt_error *err)
{
    size_t len = strlen(text);
    if (gt_utf8_invalid_at(text, len) < len)
        return fail(org, o, err, "the value is not valid UTF-8");
    if (o->has_offset && (!strcmp(text, "none") || !strcmp(text, "None"))) {
        *(bool *)((char *)c + o->has_offset) = false;
        *(double *)field(c, o) = 0.0;
        return GT_OK;
    }
    gt_toml_value *v = NULL;
    gt_error ignored = {0};
    switch (o->type) {
    case GT_CFG_BOOL:
        if (!strcmp(text, "true") || !strcmp(text, "True") || !strcmp(text, "1") ||
            !strcmp(text, "false") || !strcmp(text, "False") || !strcmp(text, "0")) {
            v = gt_xcalloc(1, sizeof *v);
            v->type = GT_TOML_BOOLEAN;
            v->as.boolean = text[0] == 't' || text[0] == 'T' || text[0] == '1';
        }
        break;
    case GT_CFG_INT:
    case GT_CFG_FLOAT:
        if (gt_toml_parse_value(text, len, "value", &v, &ignored) != GT_OK) v = NULL;
        if (v && v->type != GT_TOML_INTEGER && v->type != GT_TOML_FLOAT) {
            gt_toml_free(v);
            v = NULL;
        }
        if (!v && o->type == GT_CFG_FLOAT && len > 0 && !strchr(" \t\n", text[0])) {
            /* Also the C spellings TOML lacks (".5", "1.", "1E5"): strtod must read all. */
            char *end;
            double d = strtod(text, &end);
            if (*end == '\0') {
                v = gt_xcalloc(1, sizeof *v);
                v->type = GT_TOML_FLOAT;
                v->as.number = d;
            }
        }
        break;
    case GT_CFG_STRINGS: {
        size_t i = 0;
        while (text[i] == ' ' || text[i] == '\t')
            i++;
        if (text[i] == '[') {
            gt_error perr = {0};
            if (gt_toml_parse_value(text, len, "TOML array", &v, &perr) != GT_OK)
                return fail(org, o, err, "%s", perr.msg);
            break;
        }
        /* "a,b,c": names separated by commas, spaces around them dropped, empty names skipped. */
        v = gt_xcalloc(1, sizeof *v);
        v->type = GT_TOML_ARRAY;
        const char *s = text;
        while (*s) {
            const char *e = strchr(s, ',');
            if (!e) e = s + strlen(s);
            const char *a = s, *b = e;
            while (a < b && (*a == ' ' || *a == '\t'))
                a++;
            while (b > a && (b[-1] == ' ' || b[-1] == '\t'))
                b--;
            if (b > a) {
                if (v->as.array.n == v->as.array.cap) {
                    v->as.array.cap = v->as.array.cap ? 2 * v->as.array.cap : 4;
                    v->as.array.items = gt_xrealloc(
                        v->as.array.items, (size_t)v->as.array.cap * sizeof *v->as.array.items);
                }
                v->as.array.items[v->as.array.n++] = string_value(a, (size_t)(b - a));
            }
            s = *e ? e + 1 : e;
        }
        break;
    }
    default:
        break;
    }
    if (!v) v = string_value(text, len);
    gt_status st = set_value(c, o, v, org, err);
    gt_toml_free(v);
    return st;
}

/* ---------------------------------------------------------------- defaults, copy, equality */

void gt_config_defaults(gt_config *c)
{
    memset(c, 0, sizeof *c);
    origin org = {"default", false};
    for (int i = 0; i < N_OPTIONS; i++) {
        const gt_cfg_option *o = &options[i];
        if (o->type == GT_CFG_STRING) *(char **)field(c, o) = gt_xstrdup("");
        if (!o->default_value) continue; /* optional: unset (zeroed above) */
        gt_error err = {0};
        gt_status st = set_from_text(c, o, o->default_value, &org, &err);
        if (st != GT_OK) gt_panic(__FILE__, __LINE__, err.msg); /* a broken row of the schema */
    }
}

void gt_config_free(gt_config *c)
{
    if (!c) return;
    for (int i = 0; i < N_OPTIONS; i++) {
        const gt_cfg_option *o = &options[i];
        if (o->type == GT_CFG_STRING) free(*(char **)field(c, o));
        if (o->type == GT_CFG_STRINGS) strings_free(field(c, o));
    }
    memset(c, 0, sizeof *c);
}

void gt_config_copy(gt_config *dst, const gt_config *src)
{
    memcpy(dst, src, sizeof *dst);
    for (int i = 0; i < N_OPTIONS; i++) {
        const gt_cfg_option *o = &options[i];
        if (o->type == GT_CFG_STRING) {
            *(char **)field(dst, o) = gt_xstrdup(*(char *const *)cfield(src, o));
        } else if (o->type == GT_CFG_STRINGS) {
            const gt_cfg_strings *s = cfield(src, o);
            gt_cfg_strings *d = field(dst, o);
            d->items = gt_xcalloc((size_t)(s->n ? s->n : 1), sizeof *d->items);
            for (int k = 0; k < s->n; k++)
                d->items[k] = gt_xstrdup(s->items[k]);
        }
    }
}

static bool option_equal(const gt_config *a, const gt_config *b, const gt_cfg_option *o)
{
    const void *x = cfield(a, o), *y = cfield(b, o);
    if (o->has_offset) {
        bool hx = *(const bool *)((const char *)a + o->has_offset);
        bool hy = *(const bool *)((const char *)b + o->has_offset);
        if (hx != hy) return false;
        if (!hx) return true;
    }
    switch (o->type) {
    case GT_CFG_BOOL:
        return *(const bool *)x == *(const bool *)y;
    case GT_CFG_INT:
        return *(const int64_t *)x == *(const int64_t *)y;
    case GT_CFG_FLOAT:
        return !memcmp(x, y, sizeof(double));
    case GT_CFG_ENUM:
        return *(const int *)x == *(const int *)y;
    case GT_CFG_STRING:
        return !strcmp(*(char *const *)x, *(char *const *)y);
    case GT_CFG_STRINGS: {
        const gt_cfg_strings *l = x, *m = y;
        if (l->n != m->n) return false;
        for (int i = 0; i < l->n; i++)
            if (strcmp(l->items[i], m->items[i])) return false;
        return true;
    }
    }
    return false;
}

bool gt_config_equal(const gt_config *a, const gt_config *b)
{
    for (int i = 0; i < N_OPTIONS; i++)
        if (!option_equal(a, b, &options[i])) return false;
    return true;
}

/* ---------------------------------------------------------------- TOML files */

/* The entries of table t, the section named sec (len sl; known: a section of the schema). A
 * table inside a section is a subsection ([compile.ep_overlap]) when the schema has one of that
 * name. */
static gt_status apply_section(gt_config *c, const char *sec, size_t sl, bool known,
                               const gt_toml_table *t, const char *name, gt_error *err)
{
    char where[600];
    for (int k = 0; k < t->n; k++) {
        const gt_toml_entry *e = t->entries[k];
        snprintf(where, sizeof where, "%s:%d:%d", name, e->line, e->col);
        origin org = {where, false};
        /* "section.key" (capped: a key longer than any option cannot match anyway) */
        char full[256];
        size_t kl = e->key_len < 200 ? e->key_len : 200;
        size_t cl = sl < 50 ? sl : 50;
        memcpy(full, sec, cl);
        full[cl] = '.';
        memcpy(full + cl + 1, e->key, kl);
        size_t fl = cl + 1 + kl;
        bool whole = known && kl == e->key_len && cl == sl;
        if (whole && e->value->type == GT_TOML_TABLE && is_section(full, fl)) {
            GT_TRY(apply_section(c, full, fl, true, &e->value->as.table, name, err));
            continue;
        }
        const gt_cfg_option *o = whole ? find_option(full, fl) : NULL;
        if (!o) return unknown_option(&org, full, fl, err);
        GT_TRY(set_value(c, o, e->value, &org, err));
    }
    return GT_OK;
}

static gt_status apply_tree(gt_config *c, const gt_toml_value *root, const char *name,
                            gt_error *err)
{
    char where[600];
    for (int i = 0; i < root->as.table.n; i++) {
        const gt_toml_entry *s = root->as.table.entries[i];
        snprintf(where, sizeof where, "%s:%d:%d", name, s->line, s->col);
        origin org = {where, false};
        bool known = is_section(s->key, s->key_len);
        char shown[200], got[200];
        show_name(s->key, s->key_len, shown, sizeof shown);
        if (s->value->type != GT_TOML_TABLE) {
            if (!known) return unknown_option(&org, s->key, s->key_len, err);
            gt_toml_describe(s->value, got, sizeof got);
            return gt_error_set(err, GT_ERR_INVALID,
                                "%s: %s: expected a table (section [%s]), got %s", where, shown,
                                shown, got);
        }
        const gt_toml_table *t = &s->value->as.table;
        if (!known && t->n == 0)
            return gt_error_set(err, GT_ERR_INVALID, "%s: [%s]: unknown section; did you mean %s?",
                                where, shown, suggest_section(s->key, s->key_len));
        GT_TRY(apply_section(c, s->key, s->key_len, known, t, name, err));
    }
    return GT_OK;
}

gt_status gt_config_load_string(gt_config *c, const char *text, size_t len, const char *name,
                                gt_error *err)
{
    gt_toml_value *root;
    GT_TRY(gt_toml_parse(text, len, name, &root, err));
    gt_status st = apply_tree(c, root, name, err);
    gt_toml_free(root);
    return st;
}

gt_status gt_config_load_file(gt_config *c, const char *path, gt_error *err)
{
    gt_toml_value *root;
    GT_TRY(gt_toml_parse_file(path, &root, err));
    gt_status st = apply_tree(c, root, path, err);
    gt_toml_free(root);
    if (st != GT_OK) return st;
    free(c->job.config_file);
    c->job.config_file = gt_xstrdup(path);
    return GT_OK;
}

/* ---------------------------------------------------------------- command line */

gt_status gt_config_set(gt_config *c, const char *name, const char *value, gt_error *err)
{
    origin org = {"command line", true};
    const gt_cfg_option *o = gt_config_find_option(name);
    if (!o) return unknown_option(&org, name ? name : "", name ? strlen(name) : 0, err);
    return set_from_text(c, o, value ? value : "", &org, err);
}

gt_status gt_config_apply_overrides(gt_config *c, int argc, char **argv, gt_error *err)
{
    origin org = {"command line", true};
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i];
        if (!arg) continue;
        char shown[200];
        if (strncmp(arg, "--", 2) != 0) {
            show_name(arg, strlen(arg), shown, sizeof shown);
            return gt_error_set(err, GT_ERR_INVALID,
                                "command line: unexpected argument %s "
                                "(options look like --section.key=value)",
                                shown);
        }
        const char *name = arg + 2, *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        const gt_cfg_option *o;
        if (len == 6 && !memcmp(name, "config", 6))
            o = gt_config_find_option("job.config_file");
        else if (!(o = find_option(name, len)))
            return unknown_option(&org, name, len, err);
        const char *value;
        if (eq) {
            value = eq + 1;
        } else if (o->type == GT_CFG_BOOL) {
            /* A bare boolean flag means true; an explicit true/false may follow it. */
            value = "true";
            if (i + 1 < argc && argv[i + 1] &&
                (!strcmp(argv[i + 1], "true") || !strcmp(argv[i + 1], "false")))
                value = argv[++i];
        } else if (i + 1 < argc && argv[i + 1] && strncmp(argv[i + 1], "--", 2) != 0) {
            value = argv[++i];
        } else {
            show_name(name, len, shown, sizeof shown);
            return gt_error_set(err, GT_ERR_INVALID, "command line: --%s: needs a value", shown);
        }
        GT_TRY(set_from_text(c, o, value, &org, err));
    }
    return GT_OK;
}

gt_status gt_config_validate(const gt_config *c, gt_error *err)
{
    const gt_cfg_training *t = &c->training;
    const gt_cfg_ep_overlap *ep = &c->compile.ep_overlap;
    bool moe_root = !strcmp(ep->module_fqn, "layers.*.moe");
    if (!moe_root && strcmp(ep->module_fqn, "layers.*"))
        return gt_error_set(err, GT_ERR_INVALID,
                            "config: compile.ep_overlap.module_fqn: expected \"layers.*\" (each "
                            "MoE block) or \"layers.*.moe\" (each MoE), got \"%s\"",
                            ep->module_fqn);
    if (ep->chunk_dim == GT_CFG_EP_SEQ && !moe_root)
        return gt_error_set(err, GT_ERR_INVALID,
                            "config: compile.ep_overlap.chunk_dim = seq needs module_fqn = "
                            "\"layers.*.moe\" (attention in %s needs whole sequences)",
                            ep->module_fqn);
    if (t->mixed_precision_reduce != GT_CFG_PRECISION_FLOAT32)
        return gt_error_set(err, GT_ERR_UNSUPPORTED,
                            "config: training.mixed_precision_reduce: only \"float32\" is "
                            "supported (gradients are reduced across ranks in float32)");
    if (t->global_batch_size == 0)
        return gt_error_set(err, GT_ERR_INVALID,
                            "config: training.global_batch_size: expected -1 "
                            "(local_batch_size x data-parallel degree) or a "
                            "positive integer, got 0");
    if (t->global_batch_size > 0 && t->global_batch_size % t->local_batch_size != 0)
        return gt_error_set(err, GT_ERR_INVALID,
                            "config: training.global_batch_size = %lld is not a multiple of "
                            "training.local_batch_size = %lld",
                            (long long)t->global_batch_size, (long long)t->local_batch_size);
    if (c->parallelism.data_parallel_shard_degree == 0)
        return gt_error_set(err, GT_ERR_INVALID,
                            "config: parallelism.data_parallel_shard_degree: "
                            "expected -1 (every rank left) or a positive "
                            "integer, got 0");
    if (c->optimizer.beta1 >= 1 || c->optimizer.beta2 >= 1)
        return gt_error_set(err, GT_ERR_INVALID,
                            "config: optimizer.beta1 and optimizer.beta2 must "
                            "be < 1 (AdamW divides by 1 - beta^step)");
    if (t->dataset != GT_CFG_DATASET_SYNTHETIC && !t->dataset_path[0])
        return gt_error_set(err, GT_ERR_INVALID,
                            "config: training.dataset = \"%s\" needs "
                            "training.dataset_path",
                            datasets[t->dataset]);
    if ((t->dataset == GT_CFG_DATASET_TEXT || t->dataset == GT_CFG_DATASET_JSONL) &&
        !t->tokenizer_path[0] && !c->model.hf_assets_path[0])
        return gt_error_set(err, GT_ERR_INVALID,
                            "config: training.dataset = \"%s\" needs a "
                            "tokenizer: set training.tokenizer_path or "
                            "model.hf_assets_path",
                            datasets[t->dataset]);
    if (c->compile.memory_policy == GT_CFG_MEMORY_BUDGET &&
        !(c->compile.activation_memory_budget_gb > 0))
        return gt_error_set(err, GT_ERR_INVALID,
                            "config: compile.memory_policy = \"budget\" needs "
                            "compile.activation_memory_budget_gb > 0");
    const gt_cfg_checkpoint *ck = &c->checkpoint;
    if (ck->initial_load_path[0] && !ck->initial_load_in_hf)
        return gt_error_set(err, GT_ERR_UNSUPPORTED,
                            "config: checkpoint.initial_load_path needs "
                            "checkpoint.initial_load_in_hf = true (only Hugging Face folders are "
                            "read; a graphtrain checkpoint resumes through checkpoint.folder)");
    if (ck->initial_load_in_hf && !ck->initial_load_path[0])
        return gt_error_set(err, GT_ERR_INVALID,
                            "config: checkpoint.initial_load_in_hf needs "
                            "checkpoint.initial_load_path (the Hugging Face folder)");
    if (ck->last_save_in_hf && !ck->enable)
        return gt_error_set(err, GT_ERR_INVALID,
                            "config: checkpoint.last_save_in_hf needs checkpoint.enable = true");
    const char *kill = c->debug.test_kill_rank_at_step;
    if (kill[0]) {
        long long r = -1, step = 0;
        int used = 0;
        if (sscanf(kill, "%lld:%lld%n", &r, &step, &used) != 2 ||
            (kill[used] && strcmp(kill + used, ":stop") != 0) || r < 0 || step < 1)
            return gt_error_set(err, GT_ERR_INVALID,
                                "config: debug.test_kill_rank_at_step: expected \"RANK:STEP\" or "
                                "\"RANK:STEP:stop\" (rank >= 0, step >= 1), got \"%s\"",
                                kill);
    }
    return GT_OK;
}

gt_status gt_config_resolve(int argc, char **argv, gt_config *c, gt_error *err)
{
    /* The overrides are read twice: once to learn which file to load (and to report a bad flag
     * before touching files), then again on top of the file so that they win. */
    gt_config probe;
    gt_config_defaults(&probe);
    gt_status st = gt_config_apply_overrides(&probe, argc, argv, err);
    char *path = gt_xstrdup(probe.job.config_file);
    gt_config_free(&probe);
    gt_config_defaults(c);
    if (st == GT_OK && path[0]) st = gt_config_load_file(c, path, err);
    if (st == GT_OK) st = gt_config_apply_overrides(c, argc, argv, err);
    if (st == GT_OK) st = gt_config_validate(c, err);
    free(path);
    if (st != GT_OK) gt_config_free(c);
    return st;
}

/* ---------------------------------------------------------------- printing and help */

/* The value as TOML text; the caller frees it. */
static char *format_alloc(const gt_config *c, const gt_cfg_option *o)
{
    const void *x = cfield(c, o);
    char small[64];
    switch (o->type) {
    case GT_CFG_BOOL:
        return gt_xstrdup(*(const bool *)x ? "true" : "false");
    case GT_CFG_INT:
        snprintf(small, sizeof small, "%lld", (long long)*(const int64_t *)x);
        break;
    case GT_CFG_FLOAT:
        gt_toml_format_float(*(const double *)x, small, sizeof small);
        break;
    case GT_CFG_ENUM: {
        int k = *(const int *)x, n = 0;
        while (o->choices[n])
            n++;
        GT_CHECK(k >= 0 && k < n); /* the caller stored a value outside the option's enum */
        snprintf(small, sizeof small, "\"%s\"", o->choices[k]);
        break;
    }
    case GT_CFG_STRING: {
        const char *s = *(char *const *)x;
        size_t cap = 6 * strlen(s) + 3;
        char *q = gt_xmalloc(cap);
        gt_toml_quote(s, strlen(s), 0, q, cap);
        return q;
    }
    case GT_CFG_STRINGS: {
        const gt_cfg_strings *l = x;
        size_t cap = 3;
        for (int i = 0; i < l->n; i++)
            cap += 6 * strlen(l->items[i]) + 4;
        char *q = gt_xmalloc(cap);
        size_t used = 0;
        q[used++] = '[';
        for (int i = 0; i < l->n; i++) {
            if (i) q[used++] = ',', q[used++] = ' ';
            used += gt_toml_quote(l->items[i], strlen(l->items[i]), 0, q + used, cap - used);
        }
        q[used++] = ']';
        q[used] = '\0';
        return q;
    }
    }
    return gt_xstrdup(small);
}

void gt_config_format_value(const gt_config *c, const gt_cfg_option *o, char *buf, size_t cap)
{
    char *s = format_alloc(c, o);
    snprintf(buf, cap, "%s", s);
    free(s);
}

void gt_config_print(const gt_config *c, FILE *f)
{
    fprintf(f, "# graphtrain config: every option, resolved (defaults <- file <- command line)\n");
    const char *section = NULL;
    for (int i = 0; i < N_OPTIONS; i++) {
        const gt_cfg_option *o = &options[i];
        if (!section || strcmp(section, o->section)) {
            section = o->section;
            fprintf(f, "\n[%s]\n", section);
        }
        if (o->has_offset && !*(const bool *)((const char *)c + o->has_offset)) {
            fprintf(f, "# %s is unset\n", o->key);
            continue;
        }
        char *v = format_alloc(c, o);
        fprintf(f, "%s = %s\n", o->key, v);
        free(v);
    }
}

gt_status gt_config_write(const gt_config *c, const char *path, gt_error *err)
{
    FILE *f = fopen(path, "w");
    if (!f) return gt_error_set(err, GT_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    gt_config_print(c, f);
    int e = ferror(f) ? errno : 0;
    if (fclose(f) != 0 && !e) e = errno;
    if (e)
        return gt_error_set(err, GT_ERR_IO, "%s: cannot write the config: %s", path, strerror(e));
    return GT_OK;
}

static const char *type_word(const gt_cfg_option *o)
{
    switch (o->type) {
    case GT_CFG_BOOL:
        return "BOOL";
    case GT_CFG_INT:
        return "INT";
    case GT_CFG_FLOAT:
        return "FLOAT";
    case GT_CFG_STRING:
        return "STRING";
    case GT_CFG_ENUM:
        return "NAME";
    case GT_CFG_STRINGS:
        return "LIST";
    }
    return "VALUE";
}

/* Prints text indented, broken at spaces so that lines stay within width columns. */
static void print_wrapped(FILE *f, const char *text, int indent, int width)
{
    const char *s = text;
    while (*s) {
        int room = width - indent, n = (int)strlen(s);
        if (n > room) {
            n = room;
            while (n > 0 && s[n] != ' ')
                n--;
            if (n == 0) n = room; /* one long word */
        }
        fprintf(f, "%*s%.*s\n", indent, "", n, s);
        s += n;
        while (*s == ' ')
            s++;
    }
}

void gt_config_help(FILE *f)
{
    fprintf(f, "options (--section.key=VALUE or --section.key VALUE; a BOOL alone means true;\n"
               "a TOML file given with --config FILE sets the same options as [section] key = "
               "value):\n");
    gt_config d;
    gt_config_defaults(&d);
    const char *section = NULL;
    for (int i = 0; i < N_OPTIONS; i++) {
        const gt_cfg_option *o = &options[i];
        if (!section || strcmp(section, o->section)) {
            section = o->section;
            fprintf(f, "\n[%s]\n", section);
        }
        char head[128], extra[256] = "";
        snprintf(head, sizeof head, "--%s.%s=%s", o->section, o->key, type_word(o));
        if (o->type == GT_CFG_INT || o->type == GT_CFG_FLOAT) {
            char r[160];
            range_text(o, r, sizeof r);
            snprintf(extra, sizeof extra, "; %s", r);
        } else if (o->type == GT_CFG_ENUM) {
            char ch[200];
            choices_text(o, ch, sizeof ch);
            snprintf(extra, sizeof extra, "; one of %s", ch);
        }
        if (o->has_offset) {
            fprintf(f, "  %-44s default unset%s\n", head, extra);
        } else {
            char *v = format_alloc(&d, o);
            fprintf(f, "  %-44s default %s%s\n", head, v, extra);
            free(v);
        }
        print_wrapped(f, o->help, 6, 100);
    }
    gt_config_free(&d);
}
