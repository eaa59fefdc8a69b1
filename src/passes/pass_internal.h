/* pass_internal.h — graph-editing helpers the passes share (graph_edit.c). Not public API.
 *
 * Passes rewrite by value replacement: repl[v] = w means "every use of v now reads w" (w has v's
 * type and is defined before any use of v). Passes walk nodes in order and resolve each input
 * through repl as they go, so chains of replacements compose; the graph outputs are resolved at
 * the end. Replaced nodes stay in place, dead, until DCE removes them. */
#ifndef GRAPHTRAIN_PASS_INTERNAL_H
#define GRAPHTRAIN_PASS_INTERNAL_H

#include "graphtrain/gt_pass.h"

/* A replacement map over g's values: repl[v] = v for every v (caller frees). */
gt_value_id *gt_pass_repl_new(const gt_graph *g);
/* Follows repl from v to a value that is not replaced. */
gt_value_id gt_pass_repl_find(const gt_value_id *repl, gt_value_id v);
/* Rewrites node n's inputs through repl; returns true when one changed. */
bool gt_pass_repl_node_inputs(gt_graph *g, gt_node_id n, const gt_value_id *repl);
/* Rewrites every graph output through repl. */
void gt_pass_repl_outputs(gt_graph *g, const gt_value_id *repl);

/* Same dtype, rank and dims (expressions are interned canonically, so equal ids = equal dims). */
bool gt_pass_type_equal(const gt_type *a, const gt_type *b);
/* Re-runs the shape rule of a proposed node (inputs and attributes as the caller wants them) and
 * says whether it gives exactly the stored output types of the node it would replace, `stored`.
 * A rewrite is committed only when this holds, so a pass never changes any value's type. */
bool gt_pass_shape_matches(gt_graph *g, const gt_node *proposed, const gt_node *stored);

/* Stores node nd at position at and makes it the producer of each of its outputs (slot k for its
 * output k): a rewrite's new node taking an old node's place. */
void gt_pass_place_node(gt_graph *g, gt_node_id at, const gt_node *nd);

/* Removes every node with keep[n] == 0, every value they produce, and nothing else; node and
 * value ids are compacted in order and every index (node inputs/outputs, value producers, node
 * origins, graph inputs/outputs) is remapped. An origin that pointed at a removed node becomes
 * GT_NONE. The caller guarantees no kept node or graph output reads a removed node's output. */
void gt_pass_compact(gt_graph *g, const uint8_t *keep);

/* Reorders g's nodes into `order`, a permutation of all node ids (old ids) that is topological:
 * moves the nodes and remaps value producers, node origins and the builder's current origin.
 * Value ids do not change. */
void gt_pass_apply_order(gt_graph *g, const gt_node_id *order);

/* ---------------------------------------------------------------- collectives
 * (collective_report.c) — what the FSDP passes and the report share. */

#define GT_FSDP_TAG_ALL_GATHER "fsdp.all_gather"
#define GT_FSDP_TAG_REDUCE_SCATTER "fsdp.reduce_scatter"
#define GT_FSDP_TAG_ALL_REDUCE "fsdp.all_reduce"
/* Tag prefix of a bucketed collective's start and wait: "bucket:block.3". */
#define GT_FSDP_BUCKET_TAG_PREFIX "bucket:"

/* False when o's disable list names the pass (pipeline.c). */
bool gt_pass_enabled(const gt_pass_options *o, const char *name);
/* wait_of[n] for a collective start n: its wait node, GT_NONE when it has none or more than one
 * (and for every other node). Array of g->n_nodes; caller frees. */
gt_node_id *gt_pass_find_waits(const gt_graph *g);
/* Index of the start's FSDP tag: 0 all_gather, 1 reduce_scatter, 2 all_reduce; -1 for none. */
int gt_pass_fsdp_tag(const gt_graph *g, const gt_node *n);
extern const char *const gt_pass_fsdp_tags[3];
/* True when the node carries a "bucket:..." tag (made by fsdp_bucketing). */
bool gt_pass_is_bucketed(const gt_graph *g, const gt_node *n);

/* ---------------------------------------------------------------- node order by keys
 * (reorder.c) — how the FSDP passes move nodes.
 *
 * Every node gets a key; the new order is the topological order that takes, at each step, the
 * ready node (all producers placed) with the smallest key. When sorting the nodes by key is
 * already topological, that is exactly the new order, so a pass states where it wants a node as
 * a key: (p, GT_KEY_STAY) keeps a node at position p; (p, m) with m < GT_KEY_STAY puts it right
 * before the node at position p, after the ones with a smaller m. A key that would break a
 * dependency only delays its node until its inputs exist. */
typedef struct {
    int64_t major, minor;
} gt_pass_key;
#define GT_KEY_STAY INT64_MAX

static inline bool gt_pass_key_less(gt_pass_key a, gt_pass_key b)
{
    return a.major < b.major || (a.major == b.major && a.minor < b.minor);
}

/* Users of each value, one entry per input slot that reads it: the users of v are
 * node[first[v] .. first[v + 1]). */
typedef struct {
    int32_t *first;
    gt_node_id *node;
} gt_pass_uses;
void gt_pass_uses_build(const gt_graph *g, gt_pass_uses *u);
void gt_pass_uses_free(gt_pass_uses *u);

/* The node-at-a-time fusion steps: what a step's rule reads (users as before the step, graph
 * outputs) and keep[n] = 0 for every node it has absorbed. */
typedef struct {
    gt_pass_uses uses;
    uint8_t *is_out; /* is_out[v]: v is a graph output */
    uint8_t *keep;
} gt_pass_fuse_ctx;
/* Tries to fuse node m (kept) with its neighbours; on success places the fused node, clears keep
 * of the nodes it absorbed and returns true. */
typedef bool (*gt_pass_fuse_fn)(gt_graph *g, gt_pass_fuse_ctx *cx, gt_node_id m);
/* Calls fuse on every node in order, then removes the absorbed nodes (and their values);
 * returns the number of fusions. */
int32_t gt_pass_fuse_each(gt_graph *g, gt_pass_fuse_fn fuse);

/* The fusion pass's first step (fusion_add_norm.c): an add whose sum an rms_norm reads becomes,
 * with it, one add_rms_norm node. Returns the number of pairs fused. */
int32_t gt_fusion_add_norm(gt_graph *g);

/* The fusion pass's step for the RMSNorm backward (fusion_norm_backward.c): rms_norm_backward,
 * the add chain summing its dy and the residual add reading its dx become one
 * rms_norm_backward_add node. Returns the number of norms fused. */
int32_t gt_fusion_norm_backward(gt_graph *g);

/* The fusion pass's step for the loss (fusion_loss.c): cross_entropy and the
 * cross_entropy_backward of the same logits become one cross_entropy_with_grad node; the graph
 * is then reordered so that the loss's readers follow it. */
gt_status gt_fusion_loss(gt_graph *g, gt_error *err);

/* The fusion pass's last step (fusion_merge.c): sibling fused_elementwise nodes that share an
 * input become one node with several outputs. Returns the number of merges. */
int32_t gt_fusion_merge_siblings(gt_graph *g);

/* hoist[v] = 1 when v is a graph input or computed from graph inputs only, by nodes that are
 * neither collective, random nor side-effecting: parameter casts and views, which may move
 * earlier freely. Array of g->n_values; caller frees. */
uint8_t *gt_pass_hoistable(const gt_graph *g);

/* Reorders g's nodes as described above (keys: one per node) and writes the permutation to
 * order (order[k] = old id of the node now at k; may be NULL). Value producers, origins and the
 * builder's current origin follow. GT_ERR_INTERNAL naming `who` if the graph has a cycle (then g
 * is unchanged). */
gt_status gt_pass_order_by_keys(gt_graph *g, const gt_pass_key *keys, gt_node_id *order,
                                const char *who, gt_error *err);

#endif
