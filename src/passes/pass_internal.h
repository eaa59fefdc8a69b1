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

/* Removes every node with keep[n] == 0, every value they produce, and nothing else; node and
 * value ids are compacted in order and every index (node inputs/outputs, value producers, node
 * origins, graph inputs/outputs) is remapped. An origin that pointed at a removed node becomes
 * GT_NONE. The caller guarantees no kept node or graph output reads a removed node's output. */
void gt_pass_compact(gt_graph *g, const uint8_t *keep);

#endif
