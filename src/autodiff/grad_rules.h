/* grad_rules.h — what the files of src/autodiff share: one gradient rule per op of gt_ops.def
 * (gt_grad_<name>, defined in grad_rules*.c) and the small helpers the rules use. Not public.
 *
 * Rule contract (gt_autodiff.h, gt_grad_rule): the driver sets din[k] = GT_NONE for every input
 * before the call; a rule writes the gradient of each float input it can differentiate, with
 * exactly the input's type (dtype, rank and dim expressions), or leaves GT_NONE. Builder errors go
 * to the sticky g->err (the driver checks it after the rule); a rule returns a status of its own
 * only for what it refuses (GT_ERR_UNSUPPORTED). */
#ifndef GRAPHTRAIN_GRAD_RULES_H
#define GRAPHTRAIN_GRAD_RULES_H

#include "graphtrain/gt_autodiff.h"

#define X(E, name, nin, nout, flags, rule, alias, pairs, recompute, schema)                        \
    gt_status gt_grad_##name(gt_graph *g, gt_node_id n, const gt_value_id *dout, gt_value_id *din, \
                             gt_error *err);
#include "graphtrain/gt_ops.def"
#undef X

/* Refusal shared by the ops that have no rule (the fused backward ops). */
gt_status gt_grad_unsupported(gt_graph *g, gt_node_id n, gt_error *err);
/* Defines gt_grad_<name> as that refusal: for ops nothing differentiates through. */
#define GT_GRAD_NONE(name)                                                                         \
    gt_status gt_grad_##name(gt_graph *g, gt_node_id n, const gt_value_id *dout, gt_value_id *din, \
                             gt_error *err)                                                        \
    {                                                                                              \
        (void)dout, (void)din;                                                                     \
        return gt_grad_unsupported(g, n, err);                                                     \
    }

/* dy (the gradient of a broadcasting op's output) summed back to the type of input x; returns dy
 * itself when the dims already match. */
gt_value_id gt_grad_reduce_to(gt_graph *g, gt_value_id dy, gt_value_id x);

/* True when two types have the same dtype, rank and dim expressions (ids compare expressions). */
bool gt_grad_same_type(const gt_type *a, const gt_type *b);
/* True when two types have the same rank and dim expressions (any dtype). */
bool gt_grad_same_dims(const gt_type *a, const gt_type *b);

#endif
