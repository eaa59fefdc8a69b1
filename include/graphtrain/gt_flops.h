/* gt_flops.h — FLOPs counted from a graph's nodes. */
#ifndef GRAPHTRAIN_GT_FLOPS_H
#define GRAPHTRAIN_GT_FLOPS_H

#include "gt_graph.h"

#ifdef __cplusplus
extern "C" {
#endif

/* FLOPs of one step, by kind, with every symbol bound. Conventions (one multiply-add = 2 FLOPs):
 *   matmul          2·M·N·K per batch element;
 *   sdpa            4·b·hq·s·t·d (QKᵀ and PV, counted dense as torchtitan's 12·L·H·Dh·S does);
 *   sdpa_backward   8·b·hq·s·t·d (dV, dP, dQ, dK; the recomputed P is not counted, so
 *                   attention backward = 2 × forward, as torchtitan's model FLOPs);
 *   everything else one FLOP per output element ("other"; views and copies count 0).
 * Phase totals let MFU use model FLOPs (matmul + attention) as torchtitan does. */
typedef struct {
    double matmul, attention, other;
    double by_phase[3]; /* forward, backward, optimizer: all kinds */
    double total;
} gt_flops;

gt_status gt_graph_count_flops(const gt_graph *g, const gt_sym_binding *b, gt_flops *out,
                               gt_error *err);
/* Model FLOPs of one node by the conventions above: matmul and attention (sdpa, sdpa_backward);
 * 0 for every other op. GT_ERR_* when a shape does not evaluate under b. */
gt_status gt_node_model_flops(const gt_graph *g, gt_node_id n, const gt_sym_binding *b,
                              double *flops, gt_error *err);

#ifdef __cplusplus
}
#endif
#endif
