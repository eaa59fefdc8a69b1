/* gt_parallel.h — device mesh, placements and parallelize: the whole-step graph of one global
 * training step becomes one SPMD graph that every rank runs (DESIGN.md §1, §3).
 *
 * The mesh has three named dims, outermost first, with the rank's tensor-parallel coordinate
 * fastest (torchtitan's order): dp_replicate (full replicas: DDP / the replica dim of HSDP),
 * dp_shard (FSDP) and tp (tensor parallel). A size-1 dim changes nothing.
 *
 * gt_parallelize takes the global graph — shapes of the whole step (the global batch), built by
 * the model, autodiff and the optimizer exactly as for one rank — and a placement per graph input,
 * and walks the nodes in order. Each op's sharding rule (src/parallel/rules*.c) looks at its
 * inputs' placements, per mesh dim, and says which placements it computes on and what its outputs
 * get; where an input has another placement the pass inserts the collective that converts it
 * (shard -> replicate: all_gather; partial -> replicate: all_reduce; partial -> shard:
 * reduce_scatter; replicate -> shard: a local slice), as start/wait pairs over that mesh dim.
 * The result's value types are local (per-rank) and its shapes stay symbolic. The global graph's
 * symbol `batch` (the global batch) becomes dp * batch, so `batch` in the result is the per-rank
 * batch (training.local_batch_size), dp = dp_replicate * dp_shard; with sequence parallel, `seq`
 * becomes tp * seq_shard (bind seq_shard = seq_len / tp). Rank coordinates appear as the symbols
 * "rank.dp_replicate", "rank.dp_shard", "rank.tp" (bound when the program is built), so every rank
 * runs the same graph.
 *
 * What falls out of the rules, with the input placements of gt_parallel_input_layouts:
 *   - SimpleFSDP: a parameter stored shard(0) on dp_shard meets its use (a matmul whose other
 *     operand is batch-sharded) and is all-gathered there, after its cast to the compute dtype;
 *     its gradient comes out partial over the data-parallel dims and is reduce-scattered to the
 *     parameter's placement (all-reduced over dp_replicate: HSDP), in the gradient's dtype (f32);
 *     AdamW then updates the shard. With fsdp_reshard_after_forward the backward gathers again
 *     instead of keeping the forward's gathered copy.
 *   - Tensor parallel with the model's plan (gt_param_plan on each parameter: torchtitan's
 *     column-wise and row-wise Linears, vocabulary-parallel embedding and loss, never gathering
 *     the logits); with
 *     sequence parallel the norms and residual stream are shard(1) (sequence) on tp.
 *   - Losses and metrics are made replicate; a gradient output takes its parameter's placement.
 * Requirements (else GT_ERR_INVALID naming the tensor, dim and degree): every sharded dim divides
 * evenly by the product of the degrees that shard it, except a parameter's FSDP dim 0, which is
 * padded to ceil(D / dp_shard) rows per rank (zeros past D: gathers drop them, gradients are
 * zero-padded before their reduce-scatter, AdamW keeps them zero); tp divides the query and
 * key/value heads. */
#ifndef GRAPHTRAIN_GT_PARALLEL_H
#define GRAPHTRAIN_GT_PARALLEL_H

#include "gt_graph.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    GT_MESH_DP_REPLICATE = 0,
    GT_MESH_DP_SHARD = 1,
    GT_MESH_TP = 2,
    GT_MESH_NDIMS = 3
} gt_mesh_dim;

typedef struct {
    int size[GT_MESH_NDIMS];
} gt_mesh;

/* Expert parallel with ep a proper divisor of dp_shard: torchtitan's sparse mesh [dp_replicate,
 * efsdp, ep] over the dp_shard ranks, ep the inner dim (rank.dp_shard = efsdp * ep + ep coord).
 * The parallelized graph's mesh (gt_graph.mesh) then has two more dims, communicator groups only
 * (no value is placed on them): efsdp, the dp_shard / ep ranks that hold the same experts (the
 * expert weights are gathered and their gradients reduce-scattered over them), and ep, the ranks
 * that exchange tokens. Their coordinates are expressions of rank.dp_shard (rank.dp_shard // ep
 * and rank.dp_shard mod ep), so one graph still serves every rank. */
#define GT_MESH_EFSDP 3
#define GT_MESH_EP 4
#define GT_MESH_EP_NDIMS 5

/* True when expert parallel degree ep splits the dp_shard dim into efsdp x ep groups
 * (1 < ep < dp_shard, ep divides dp_shard); ep = dp_shard runs on the dp_shard dim itself. */
bool gt_mesh_expert_split(const gt_mesh *m, int ep);
/* True when ep takes tensor-parallel ranks (tp > 1, ep does not divide dp_shard but divides
 * dp_shard x tp): the efsdp x ep groups then split the flattened dp_shard x tp group, whose
 * index is rank.dp_shard * tp + rank.tp (torchtitan's efsdp = dp_shard * tp / ep, ETP = 1), and
 * the MoE tokens, replicated over tp, are split over the tp ranks first (rules_moe.c). */
bool gt_mesh_expert_tp(const gt_mesh *m, int ep);
/* The index the efsdp x ep split cuts: coords' dp_shard coordinate, or with gt_mesh_expert_tp
 * its flattened dp_shard x tp one. */
int gt_mesh_expert_flat(const gt_mesh *m, int ep, const int coords[GT_MESH_NDIMS]);

/* Each size >= 1, else GT_ERR_INVALID naming the dim. */
gt_status gt_mesh_init(gt_mesh *m, int dp_replicate, int dp_shard, int tp, gt_error *err);
int gt_mesh_world_size(const gt_mesh *m);
/* Coordinates of a world rank (row-major over the dims, tp fastest), and back. */
void gt_mesh_coords(const gt_mesh *m, int rank, int coords[GT_MESH_NDIMS]);
int gt_mesh_rank(const gt_mesh *m, const int coords[GT_MESH_NDIMS]);
const char *gt_mesh_dim_name(int dim);     /* "dp_replicate", "dp_shard", "tp", "efsdp", "ep" */
const char *gt_mesh_coord_symbol(int dim); /* "rank.dp_replicate", ... */
/* "dp_shard 2 x tp 2" (dims of size 1 left out; "1 rank" when all are). Returns the length. */
int gt_mesh_format(const gt_mesh *m, char *buf, size_t len);

typedef struct {
    gt_mesh mesh;
    bool sequence_parallel;          /* with tp > 1 */
    bool fsdp_reshard_after_forward; /* with dp_shard > 1: gather again in backward */
    bool fsdp_reshard_last; /* that too for the last block, final norm and output (else kept) */
    /* Expert parallel (DeepSeek-V3's routed experts): 0 or 1 off; else the ep group size, a
     * divisor of dp_shard (with tp > 1 the MoE runs replicated over tp), or of dp_shard x tp
     * (gt_mesh_expert_tp: the tokens split over tp, the expert weights stored over the flattened
     * dp_shard x tp ranks, E / (dp_shard x tp) whole experts each). ep =
     * dp_shard: the ep group is the dp_shard dim. A proper divisor: the efsdp x ep groups of
     * gt_mesh_expert_split. The expert weights keep their dp_shard S(0) storage (E/dp_shard whole
     * experts per rank); they are gathered over efsdp only, and the routed rows go to their
     * experts' ranks in the ep group (all_to_all of capacity blocks) instead of every expert being
     * gathered. */
    int expert_parallel_degree;
    /* Rows per rank pair, as a fraction of the worst case T_local * min(top_k, E/ep); 0 (or >= 1)
     * the worst case, where no overflow is possible. */
    double expert_parallel_capacity_factor;
} gt_parallel_plan;

/* A placement per mesh dim for each of g's inputs (out: g->n_inputs rows), from the plan:
 *   PARAM            tp: the input's gt_param_plan (colwise shard(0), rowwise shard(1), none
 *                    replicate); dp_shard: shard(0), nested inside tp's shard when both split
 *                    dim 0 (the embedding's role without tp: shard(1)); dp_replicate: replicate.
 *   OPT_STATE, and   placed as their parameter (the optimizer gives them its plan).
 *   BUFFER as_param
 *   INPUT of rank>=1 the batch: shard(0) over dp_replicate (outer) and dp_shard; replicate on tp.
 *   anything else    replicate (optimizer scalars, other buffers).
 * Pure: reads the inputs' plans, kinds and shapes only. */
gt_status gt_parallel_input_layouts(const gt_parallel_plan *plan, const gt_graph *g,
                                    gt_placement (*out)[GT_MESH_MAX_DIMS], gt_error *err);

/* The SPMD graph of global graph g (unchanged) with input k placed as in_place[k]. The result
 * carries the mesh (gt_graph.mesh) and every value's placement; *out is freed by the caller. */
gt_status gt_parallelize(const gt_graph *g, const gt_parallel_plan *plan,
                         const gt_placement (*in_place)[GT_MESH_MAX_DIMS], gt_graph **out,
                         gt_error *err);

/* The block of a global tensor of concrete shape `global` that the rank at `coords` holds under
 * `place` (one per mesh dim): start and size per tensor dim. GT_ERR_INVALID when a sharded dim
 * does not divide. A padded shard (gt_placement.padded) gives the rows that hold data: the local
 * tensor has ceil(D / n) rows along that dim, `size` of them valid (fewer, or none, on the last
 * ranks), the rest zeros. */
gt_status gt_placement_local_box(const gt_mesh *m, const gt_placement place[GT_MESH_MAX_DIMS],
                                 int ndim, const int64_t *global, const int coords[GT_MESH_NDIMS],
                                 int64_t *start, int64_t *size, gt_error *err);
/* The local tensor's shape: global divided by the degrees that shard each dim (ceil for a padded
 * shard). Assumes the divisions gt_placement_local_box checks. */
void gt_placement_local_shape(const gt_mesh *m, const gt_placement place[GT_MESH_MAX_DIMS],
                              int ndim, const int64_t *global, int64_t *local);

#ifdef __cplusplus
}
#endif
#endif
