/* gt_autoparallel.h — AutoParallel: every parameter's placement on the mesh chosen by an ILP over
 * the sharding rules' strategies and a cost model, instead of the hand plans (FSDP, FSDP x TP).
 *
 * The decision variables are parameter classes: a PARAM input with the state that sits where it
 * does (AdamW's moments, gradient-accumulation sums), and the same parameter of every repeated
 * block tied to one class (same structural unit position, shape and plan). A strategy is one
 * placement per mesh dim (replicate, or shard of a dim that splits; FSDP's padded shard(0)). What
 * happens downstream of a strategy is what gt_parallelize's rules do with it, so the solver
 * measures strategies on the SPMD graphs the rules produce (probes), and the result applies by
 * handing its input layout to gt_parallelize: an ordinary SPMD graph comes out.
 *
 * Cost model (per rank, seconds): compute as a roofline per node, max(flops / (eff * peak),
 * bytes / (eff * bandwidth)) plus a launch floor; every collective alpha-beta over its mesh dim
 * (n ranks, B the full tensor's bytes): all_gather and reduce_scatter alpha (n-1) + (n-1)/n B /
 * beta, all_reduce twice that, all_to_all as all_gather; FSDP parameter gathers times a prefetch
 * discount (they overlap compute). Memory (per rank, bytes): parameters, gradients, optimizer
 * state and the forward values the backward reads.
 *
 * Solver: probes give each class-strategy a unary cost (one class moved off the base layout) and
 * each pair of classes of the same kind (block or not) an interaction cost over their
 * tensor-parallel placements (two moved together); the ILP minimises base + unaries + pairs
 * (one-hot y per class, pair variables z linearised by marginals) under the memory row, with CBC
 * on one thread and a fixed seed. The pair terms are a second-order expansion around the base,
 * so the candidates — the ILP's layout, the unary-only ILP's, a descent over single cheaper moves
 * from the better of them — and both hand plans are priced exactly, and the cheapest that fits
 * is the result (a strategy off the hand plan pays a tie-break: FSDP on a data-parallel mesh,
 * where nothing is cheaper, gives the hand plan's graph). Then the activations' one decision:
 * with tp > 1, sequence parallelism stays on unless the result is priced cheaper with the
 * activations replicated over tp (gt_autopar_result.sequence_parallel). */
#ifndef GRAPHTRAIN_GT_AUTOPARALLEL_H
#define GRAPHTRAIN_GT_AUTOPARALLEL_H

#include <stdio.h>

#include "gt_parallel.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    const char *name;
    double peak_flops;           /* FLOP/s of the compute dtype */
    double mem_bw;               /* bytes/s */
    double efficiency;           /* achieved fraction of both peaks (0.7) */
    double node_floor_s;         /* per kernel launch */
    double alpha[GT_MESH_NDIMS]; /* s per hop, per mesh dim */
    double beta[GT_MESH_NDIMS];  /* bytes/s per rank, per mesh dim */
    double prefetch_discount;    /* multiplies FSDP parameter gathers (0.5) */
} gt_autopar_device;

/* "h100" (989 TFLOP/s bf16, 3.35 TB/s, NVLink 450 GB/s, 8 us) or "cpu" (one host, MPI over
 * shared memory); anything else is GT_ERR_INVALID naming it. */
gt_status gt_autopar_device_default(const char *kind, gt_autopar_device *d, gt_error *err);
/* Reads a profile: lines `MESH_DIM ALPHA_S BETA_BYTES_PER_S` (mesh dim by name: dp_replicate,
 * dp_shard, tp), '#' comments; errors name the file and line. */
gt_status gt_autopar_device_load(const char *path, gt_autopar_device *d, gt_error *err);

/* The autoparallel backend's FSDP pass policy for one layout (policy.c): the bucket cap
 * (compile.fsdp_bucket_cap_mb) and prefetch depth (compile.fsdp_prefetch_depth).
 *
 * Model, per rank. The SPMD graph's FSDP all-gathers of each unit (a block, the embedding, the
 * rest) and phase (forward; backward re-gathers) are cut by a cap into buckets as fsdp_bucketing
 * cuts them (in node order, unsharded bytes); a bucket's compute is its unit's roofline compute
 * in that phase times its share of the unit's gathered bytes; its gather takes alpha (n-1) +
 * (n-1)/n B / beta of its mesh dim plus a launch floor. One link per phase, in order: bucket j's
 * gather is posted when bucket j - depth starts computing (at the phase's start for j < depth; the
 * first bucket was gathered ahead by the phase before) and waits for the link, the gradient
 * reduce-scatters of bucket j - depth follow it on the link, and bucket j computes once gathered
 * and bucket j - 1 is done. Exposed: the phases' end minus their compute. In flight: the most
 * gathered bytes of depth + 1 consecutive buckets.
 *
 * Choice, deterministic. Caps: powers of two MiB from the largest gathered tensor of a block up to
 * a whole unit, and 0 (one bucket per unit) above them; depths 1..4. "Hides": exposed <= 1% of the
 * modelled compute. The preferred cap is the smallest that hides at some depth (else 0: fewest
 * latencies), the preferred depth the smallest that hides at it (else the least exposed). Then
 * the memory (what the budget leaves after parameters, gradients, optimizer state and the
 * activations): first the depth shrinks, then, at depth 1, the cap, to the largest that fits.
 * So a tighter budget never picks a deeper prefetch, and a slower link (exposure only grows)
 * never picks smaller buckets. A value fixed by the options (the user's) is kept. */
typedef struct {
    bool has_fsdp;        /* the layout has FSDP all-gathers (else nothing was picked) */
    double bucket_cap_mb; /* 0: one bucket per unit */
    int prefetch_depth;
    bool cap_fixed, depth_fixed; /* given by gt_autopar_options (the user's), not picked */
    const char *why;             /* "hides", "exposed" (nothing hides), "memory" (cut to fit) */
    int n_buckets;               /* per step, gathers of both phases */
    double compute_s;            /* the modelled phases' compute */
    double gather_s, exposed_s;  /* the gathers' link time, and what compute does not hide */
    double inflight_b;           /* gathered bytes live at once */
    double allowance_b;          /* what the budget leaves them; < 0: no budget */
} gt_autopar_policy;

typedef struct {
    double compute_s, comm_s[GT_MESH_NDIMS];
    double comm_kind_s[4]; /* all_gather, reduce_scatter, all_reduce, all_to_all */
    double total_s;
    double params_b, grads_b, opt_b, act_b, memory_b; /* per rank */
    /* gt_autopar_solve's result only: the FSDP pass policy of its layout */
    gt_autopar_policy policy;
} gt_autopar_cost;

/* The cost of one SPMD graph (gt_parallelize's output) with every symbol bound by b. */
gt_status gt_autopar_cost_graph(const gt_graph *spmd, const gt_sym_binding *b,
                                const gt_autopar_device *d, gt_autopar_cost *out, gt_error *err);

typedef struct {
    gt_autopar_device device;
    const gt_sym_binding *binding; /* binds the SPMD graph's symbols (batch, seq, rank.*) */
    double memory_budget_b;        /* per rank; 0: none */
    /* the budget holds parameters, gradients and optimizer state only: the memory policy fits
     * the activations into what is left (compile.autoparallel_backend = autoparallel) */
    bool budget_state_only;
    /* the pass policy's knobs the user fixed (compile.fsdp_bucket_cap_mb,
     * compile.fsdp_prefetch_depth); 0: the solver picks */
    double fsdp_bucket_cap_mb;
    int fsdp_prefetch_depth;
} gt_autopar_options;

/* The FSDP pass policy (gt_autopar_policy) of SPMD graph spmd: allowance_b the bytes the gathered
 * buckets may hold (< 0: no limit), cap_mb and depth fixed when > 0. */
gt_status gt_autopar_pick_policy(const gt_graph *spmd, const gt_sym_binding *b,
                                 const gt_autopar_device *d, double allowance_b, double cap_mb,
                                 int depth, gt_autopar_policy *out, gt_error *err);
/* One line: the policy's knobs, whose they are, and its model (no newline). */
void gt_autopar_policy_format(const gt_autopar_policy *p, char *buf, size_t len);

typedef struct {
    char name[96]; /* the first member's fqn, its block index shown as '*' */
    int n_members; /* parameters tied to it (one per block) */
    int n_strategies, chosen, hand_fsdp, hand_fsdp_tp; /* strategy indices (-1: not in the list) */
    gt_placement (*strategies)[GT_MESH_MAX_DIMS];
    bool *feasible; /* per strategy: the rules took it (its probe parallelized) */
} gt_autopar_class;

typedef struct {
    gt_mesh mesh;
    int n_classes;
    gt_autopar_class *classes;
    int32_t n_inputs;
    gt_placement (*layout)[GT_MESH_MAX_DIMS]; /* per input of g: hand to gt_parallelize */
    gt_autopar_cost cost, fsdp, fsdp_tp;      /* exact: the result and both hand plans */
    bool has_fsdp_tp;                         /* tp > 1 */
    double ilp_objective_s;                   /* the ILP's modelled cost of its own layout */
    const char *picked; /* "ilp", or the hand plan that evaluated cheaper: "fsdp", "fsdp_tp" */
    /* the activations between tensor-parallel regions: sharded by sequence over tp (true) or
     * replicated; hand it to gt_parallelize with the layout (plan.sequence_parallel). Only
     * turned off when the plan allowed it and the layout is cheaper so. sp_other_total_s: the
     * layout's cost with the other choice (-1: not priced: tp = 1 or the plan had it off). */
    bool sequence_parallel;
    double sp_other_total_s;
    int n_probes, n_columns, n_rows;
    double probe_s, ilp_s; /* wall time of the probes and of CBC */
} gt_autopar_result;

/* True when this build has CBC (GT_HAVE_CBC). */
bool gt_autopar_available(void);
/* Chooses the layout of global graph g on plan's mesh (plan's flags as the run's). Without CBC:
 * GT_ERR_UNSUPPORTED naming the package. A budget nothing fits: GT_ERR_INVALID naming the
 * smallest feasible budget. *out is freed with gt_autopar_free. */
gt_status gt_autopar_solve(const gt_graph *g, const gt_parallel_plan *plan,
                           const gt_autopar_options *o, gt_autopar_result **out, gt_error *err);
/* The explanation: each class's chosen placement, activation placements of the SPMD graph spmd
 * (may be NULL), the cost breakdown and the hand plans' costs on the same model. */
void gt_autopar_print(const gt_autopar_result *r, const gt_graph *spmd, FILE *f);
void gt_autopar_free(gt_autopar_result *r);
/* "R", "S(0)", "S(1)p" (padded), "P" */
int gt_autopar_format_placement(gt_placement p, char *buf, size_t len);

#ifdef __cplusplus
}
#endif
#endif
