/* gt_pass.h — graph passes and the pass pipeline (DESIGN.md §4).
 *
 * A pass rewrites a graph in place: gt_status gt_pass_NAME(gt_graph *g, const gt_pass_ctx *ctx,
 * gt_error *err). Each pass file states its contract (what it requires, what it guarantees,
 * whether it may change numerics). The pipeline is an ordered table of passes, filtered by the
 * options (compile.disable_passes), that verifies the graph after every pass when asked, times
 * each pass (one log line per pass) and, with a dump directory, writes for pass NN:
 *   NN-<pass>.before.txt, NN-<pass>.after.txt   gt_graph_print listings
 *   NN-<pass>.diff.txt                          node count and per-op counts that changed
 *                                               ("matmul 120 -> 118").
 *
 * Usage (the trainer and CLI):
 *   gt_pass_options o = {.disable = cfg->compile.disable_passes.items,
 *                        .n_disable = cfg->compile.disable_passes.n,
 *                        .dump_dir = debug ? dir : NULL, .verify_each = debug_build};
 *   GT_TRY(gt_pass_run_pipeline(g, &o, NULL, err)); */
#ifndef GRAPHTRAIN_GT_PASS_H
#define GRAPHTRAIN_GT_PASS_H

#include "gt_graph.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Numerics class of a pass: exact = results bitwise identical with and without it. */
typedef enum { GT_PASS_EXACT = 0, GT_PASS_CHANGES_NUMERICS } gt_pass_numerics;

/* Which forward values the backward reads from memory and which it recomputes (memory_policy.c).
 * Zero (the default of a zeroed gt_pass_options) saves everything, so the pipeline changes no
 * schedule unless asked. The trainer maps compile.memory_policy: none and eager -> NONE. */
typedef enum {
    GT_MEMORY_POLICY_NONE = 0, /* save every activation */
    GT_MEMORY_POLICY_FULL,     /* recompute every block node; save block boundaries only */
    GT_MEMORY_POLICY_DEFAULT,  /* save matmul and sdpa outputs, parameter casts, block boundaries */
    GT_MEMORY_POLICY_BUDGET,   /* min-cut choice that fits memory_budget_bytes */
} gt_memory_policy;
const char *gt_memory_policy_name(gt_memory_policy p); /* "none", "full", "default", "budget" */

/* For GT_MEMORY_POLICY_BUDGET: the planned size of g's step memory under the caller's schedule
 * and planner (the trainer passes the runtime's gt_plan_memory step arena; passes do not depend
 * on the runtime). */
typedef gt_status (*gt_pass_measure_fn)(const gt_graph *g, void *user, size_t *bytes,
                                        gt_error *err);

/* Which passes of the registry a pipeline runs, for a step split into pipeline stages (issue
 * 39): the passes that must see the forward and the backward together (gt_pass_info.whole_step:
 * recomputation copies forward nodes into the backward) run once on the whole step graph before
 * the stage split; the others on each stage part's graph after it. */
typedef enum {
    GT_PASS_SCOPE_ALL = 0, /* every pass: a step that is not split */
    GT_PASS_SCOPE_WHOLE,   /* the whole_step passes only: the step graph before the split */
    GT_PASS_SCOPE_PART,    /* the other passes only: a stage part's graph after the split */
} gt_pass_scope;

typedef struct {
    char *const *disable; /* pass names to leave out (compile.disable_passes); may be NULL */
    int n_disable;
    const char
        *dump_dir; /* write listings, DOT after each pass, op-count diffs (created); NULL = none */
    bool verify_each; /* run gt_graph_verify before the first pass and after every pass */
    bool quiet;       /* no per-pass log line (tests) */
    gt_memory_policy memory_policy; /* compile.memory_policy (memory_policy pass) */
    /* GT_MEMORY_POLICY_BUDGET only: the step memory to fit, in bytes
     * (compile.activation_memory_budget_gb * 2^30), the symbol binding that makes sizes concrete,
     * and the measure of the planned step memory (see gt_pass_measure_fn). */
    int64_t memory_budget_bytes;
    const gt_sym_binding *binding;
    gt_pass_measure_fn measure;
    void *measure_user;
    /* fsdp_bucketing: split a block's bucket into pieces of at most this many bytes (each
     * member counted at its unsharded size, the larger of its collective's input and output);
     * 0 = one bucket per block. */
    int64_t bucket_cap_bytes;
    /* fsdp_bucketing: leave the all-gathers one per tensor (reduce-scatters and all-reduces are
     * still bucketed); fsdp_reorder keeps a block's gathers adjacent, which the CUDA executor
     * posts as one NCCL group. */
    bool gathers_unbucketed;
    /* fsdp_reorder: how many FSDP buckets are gathered ahead of the one computing; 0 or 1: one */
    int fsdp_prefetch_depth;
    /* the passes to run of those not disabled (zero: all of them) */
    gt_pass_scope scope;
} gt_pass_options;

/* What a pass is given besides the graph. */
typedef struct {
    const gt_pass_options *options;
    int index; /* position in the pipeline, 0-based (the NN of the dump files is index + 1) */
} gt_pass_ctx;

typedef gt_status (*gt_pass_fn)(gt_graph *g, const gt_pass_ctx *ctx, gt_error *err);

typedef struct {
    const char *name;
    gt_pass_fn run;
    gt_pass_numerics numerics;
    const char *summary; /* one line, for --help and error messages */
    bool mesh_only; /* runs only on a parallelized graph (g->mesh.ndim > 0); skipped otherwise */
    /* needs the whole step (forward and backward together): under a pipeline it runs before the
     * stage split (GT_PASS_SCOPE_WHOLE), never on one stage part */
    bool whole_step;
} gt_pass_info;

/* The registry, in pipeline order. *n receives the count. */
const gt_pass_info *gt_pass_registry(int *n);
/* Looks a pass up by name; NULL when unknown. */
const gt_pass_info *gt_pass_find(const char *name);

/* ---------------------------------------------------------------- the passes (all exact) */

/* Folds identity views and casts, composes reshape/transpose/permute chains (canonicalize.c). */
gt_status gt_pass_canonicalize(gt_graph *g, const gt_pass_ctx *ctx, gt_error *err);
/* Merges identical pure nodes (cse.c). */
gt_status gt_pass_cse(gt_graph *g, const gt_pass_ctx *ctx, gt_error *err);
/* Tags the forward nodes the backward will recompute with "recompute", per
 * options->memory_policy (memory_policy.c; budget: mincut.c). Changes no computation. */
gt_status gt_pass_memory_policy(gt_graph *g, const gt_pass_ctx *ctx, gt_error *err);
/* Duplicates each chain of "recompute" forward nodes right before its first backward use and
 * rewires the backward uses to the copies (remat.c). */
gt_status gt_pass_remat(gt_graph *g, const gt_pass_ctx *ctx, gt_error *err);
/* Removes nodes that reach no graph output; compacts node and value ids (dce.c). */
gt_status gt_pass_dce(gt_graph *g, const gt_pass_ctx *ctx, gt_error *err);
/* Replaces each chain or tree of two or more elementwise nodes whose intermediates have one reader
 * (same phase, no collective in between) with one fused_elementwise node that computes the same
 * bits (fusion.c). */
gt_status gt_pass_fusion(gt_graph *g, const gt_pass_ctx *ctx, gt_error *err);
/* Merges the FSDP collectives of one bucket (a transformer block, tok_embeddings, the rest) into
 * one collective over a flat buffer (bucketing.c). No-op without a mesh. */
gt_status gt_pass_fsdp_bucketing(gt_graph *g, const gt_pass_ctx *ctx, gt_error *err);
/* Makes each reduce-scatter of f32 values that are casts of bf16/f16 ones (through reshapes,
 * concats and zero padding: a mixed-precision gradient, or a bucket of them) a widening
 * reduce-scatter of the 16-bit values, which sums in f32 all the same: the same bits, half the
 * bytes moved, no casts (reduce_scatter_narrow.c). No-op without a mesh. */
gt_status gt_pass_reduce_scatter_narrow(gt_graph *g, const gt_pass_ctx *ctx, gt_error *err);
/* Prefetch: moves the FSDP all-gather starts one bucket ahead of their use, issues gradient
 * reduce-scatters (and HSDP all-reduces) as soon as their inputs exist and defers every FSDP wait
 * to its first use, a gradient's no later than right after the next gradient bucket starts
 * (reorder.c). Only the node order changes. No-op without a mesh. */
gt_status gt_pass_fsdp_reorder(gt_graph *g, const gt_pass_ctx *ctx, gt_error *err);

/* ---------------------------------------------------------------- EP chunking (ep_chunk.c) */

/* The tags of the two chunks' forward nodes (their backward nodes reach them through origin). */
#define GT_CHUNK_TAG_0 "chunk.0"
#define GT_CHUNK_TAG_1 "chunk.1"

/* compile.ep_overlap's choices for the chunking pass. */
typedef struct {
    bool moe_only;   /* layers.*.moe: each MoE; else layers.*: each MoE block */
    bool seq;        /* chunk along the sequence (MoE only); else along the batch */
    bool early_grad; /* one cast per parameter for both chunks (gradients added before it) */
    /* batch: the data-parallel ranks whose batches the graph's batch holds, each cut in two (0
     * or 1: one) */
    int64_t groups;
} gt_chunk_options;

/* Splits each MoE block (or MoE) of the forward graph g into two chunks of the batch or the
 * sequence, exact against the model built once per chunk (ep_chunk.c says how). It runs on the
 * forward graph, before autodiff; value ids change, and the n_track ids in track (the model's
 * loss, logits, token counts, ...) are rewritten to the new graph's. */
gt_status gt_pass_ep_chunk(gt_graph *g, const gt_chunk_options *o, gt_value_id *track, int n_track,
                           gt_error *err);

/* The EP overlap schedule (ep_overlap.c): in each chunked block, per phase, the two chunks' nodes
 * interleaved so that each chunk's collectives start while the other chunk computes — forward
 * chunk 0 first, backward chunk 1 first. Only the order changes (exact). No-op without chunks;
 * the chunks' collectives must match (same ops, same count) or the block is refused by name. */
gt_status gt_pass_ep_overlap(gt_graph *g, const gt_pass_ctx *ctx, gt_error *err);

/* ---------------------------------------------------------------- collective report
 * (collective_report.c) */

/* One collective (a start and its wait) of a graph, in node order. */
typedef struct {
    gt_node_id start, wait; /* node ids = positions in the node order; wait GT_NONE if missing */
    gt_op op;               /* GT_OP_ALL_GATHER_START, ... */
    int mesh_dim;
    int64_t bytes; /* the larger of the input and output sizes under the binding; -1 unknown */
    int32_t overlap_nodes; /* non-collective nodes strictly between start and wait */
    double overlap_flops;  /* their matmul + sdpa (+ backward) FLOPs (gt_flops.h); -1 unknown */
} gt_collective_info;

/* Fills out[0 .. min(count, max)) with g's collectives in node order and returns their count.
 * b may be NULL (bytes and FLOPs then known only for constant shapes). */
int32_t gt_pass_collectives(const gt_graph *g, const gt_sym_binding *b, gt_collective_info *out,
                            int32_t max);
/* One line per collective in node order (start and wait positions, kind, mesh dim name, bytes,
 * the nodes and matmul/sdpa FLOPs it overlaps, the start's fqn and phase), then totals: bytes
 * and count by kind and the fraction of collectives that overlap no node. The pipeline writes it
 * to dump_dir/collectives.txt for a graph with a mesh. */
void gt_pass_collective_report(const gt_graph *g, const gt_sym_binding *b, FILE *f);

/* ---------------------------------------------------------------- the pipeline */

#define GT_PASS_MAX 32

typedef struct {
    const char *name;
    double ms;
    int32_t nodes_before, nodes_after;
} gt_pass_stat;

typedef struct {
    int n_run;
    gt_pass_stat pass[GT_PASS_MAX];
} gt_pass_report;

typedef struct {
    int n;
    const gt_pass_info *pass[GT_PASS_MAX];
    gt_pass_options options;
} gt_pass_pipeline;

/* Builds the ordered pass list: the registry minus options->disable, those of options->scope. An
 * unknown name in the disable list is GT_ERR_INVALID naming it and listing the known passes.
 * options (and the strings it points to) must outlive the pipeline. */
gt_status gt_pass_pipeline_init(gt_pass_pipeline *p, const gt_pass_options *options, gt_error *err);
/* Runs every pass of p on g in order. report may be NULL. A failing pass or verification names
 * the pass in the error. */
gt_status gt_pass_pipeline_run(const gt_pass_pipeline *p, gt_graph *g, gt_pass_report *report,
                               gt_error *err);
/* gt_pass_pipeline_init then gt_pass_pipeline_run. */
gt_status gt_pass_run_pipeline(gt_graph *g, const gt_pass_options *options, gt_pass_report *report,
                               gt_error *err);

#ifdef __cplusplus
}
#endif
#endif
