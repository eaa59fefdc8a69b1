/* gt_pp_split.h — the stage split of a whole-step graph for pipeline parallelism (issue 39), and
 * each stage's backward split into its input-gradient (dI) and weight-gradient (dW) parts.
 *
 * Which stage a node belongs to (gt_pp_split_graph), from gt_node.unit and the stage's first
 * block (first_layer, gt_pipeline.h's gt_pp_split_layers):
 *   forward: a block's nodes go to the block's stage, the embedding's to stage 0, the rest (final
 *            norm, output, loss) to the last stage;
 *   backward: a node follows its forward origin (one without an origin goes by its unit, as a
 *            forward node would: the loss gradient's seed is the last stage's);
 *   optimizer: a node that reads a parameter, its optimizer state or its gradient sum follows
 *            that parameter; one that reads the values of one stage only (a gradient's sum of
 *            squares) follows that stage; one that reads several stages (the global gradient
 *            norm's sum, the clip coefficient) is GT_PP_STAGE_GLOBAL: every pipeline rank computes
 *            it from the stages' partial results, gathered in stage order. One that every
 *            micro-batch runs (gt_graph_micro_part: parallelize's all-reduce of the loss over the
 *            data-parallel ranks) runs in its stage's forward when it reads forward values only,
 *            else in its weight gradient. A BUFFER_UPDATE that an optimizer node computes (the
 *            expert biases', gated off by the accumulation graph until the last micro-batch) is a
 *            step's update: its nodes run once a step like the parameters', and every
 *            micro-batch reads the buffer as the step began (the gated update leaves its bits).
 *   the micro-batch clock: a node whose values depend on nothing but the micro-batch's index in
 *            its step (it reads only buffers fed back by such values, the expert-bias
 *            accumulation's micro-batch counter, and such nodes' outputs) is
 *            GT_PP_PART_CLOCK: every rank runs it for every micro-batch in order, before the
 *            schedule, so no stage sends it (its readers sit in every stage).
 * A stage's forward is closed under its inputs within the stage: a backward node that a forward
 * node reads (the fused cross_entropy_with_grad, which gives the loss and its gradient) runs in
 * the forward part.
 * Values that cross stages: the forward output of stage s read by stage s + 1 (the activation
 * SEND_F/RECV_F carries), and the gradient a backward node of stage s + 1 produces for stage s,
 * read there by a backward node (SEND_B/RECV_B). Any other crossing (a forward value that skips a
 * stage, a gradient that goes forward) is an error naming both nodes.
 *
 * The dI/dW split: dI of stage s is every backward node of stage s that the gradients sent to stage
 * s - 1 need (their ancestors among the stage's backward nodes); dW is the stage's other backward
 * nodes (stage 0 sends nothing back: all of its backward is dW). No dI node reads a dW value, so
 * running a stage's forward, then dI, then dW computes each value from the same inputs as the
 * unsplit backward: exact by construction. */
#ifndef GRAPHTRAIN_GT_PP_SPLIT_H
#define GRAPHTRAIN_GT_PP_SPLIT_H

#include <stdio.h>

#include "gt_graph.h"

#ifdef __cplusplus
extern "C" {
#endif

#define GT_PP_STAGE_GLOBAL (-1)

/* The part of its stage a node runs in. */
typedef enum {
    GT_PP_PART_F = 0,  /* forward */
    GT_PP_PART_I,      /* backward, input gradient */
    GT_PP_PART_W,      /* backward, weight gradient */
    GT_PP_PART_OPT,    /* optimizer (once per step) */
    GT_PP_PART_GLOBAL, /* optimizer, on every rank (stage GT_PP_STAGE_GLOBAL) */
    GT_PP_PART_CLOCK   /* the micro-batch clock: on every rank for every micro-batch, before the
                        * schedule (stage GT_PP_STAGE_GLOBAL) */
} gt_pp_part;

/* "F", "I", "W", "OPT", "GLOBAL", "CLOCK" (the artifacts' file names and the log use them). */
const char *gt_pp_part_name(gt_pp_part p);

/* A value that crosses stages. */
typedef struct {
    gt_value_id value;
    int32_t from, to;  /* stages; to is GT_PP_STAGE_GLOBAL for a partial result all ranks gather */
    bool gradient;     /* produced by a backward node (SEND_B), else by a forward one (SEND_F) */
    gt_node_id reader; /* the first node of stage `to` that reads it */
} gt_pp_cross;

typedef struct {
    int32_t n_stages, n_nodes;
    int32_t *stage; /* [n_nodes]: stage, or GT_PP_STAGE_GLOBAL */
    uint8_t *part;  /* [n_nodes]: gt_pp_part */
    int32_t n_cross;
    gt_pp_cross *cross;
    int32_t (*count)[5]; /* [n_stages][gt_pp_part]: nodes of each stage in each part */
    int32_t n_global;    /* GT_PP_STAGE_GLOBAL nodes of the optimizer (GT_PP_PART_GLOBAL) */
    int32_t n_clock;     /* GT_PP_PART_CLOCK nodes */
} gt_pp_split;

/* Splits g (not changed) into n_stages stages by the rule above; first_layer has n_stages + 1
 * entries. Errors name the node or the crossing at fault. */
gt_status gt_pp_split_graph(const gt_graph *g, int32_t n_stages, const int64_t *first_layer,
                            gt_pp_split *out, gt_error *err);
void gt_pp_split_free(gt_pp_split *s);

/* An order of g's nodes that runs the stages as a pipeline would run one micro-batch: the clock
 * nodes, every stage's forward in stage order, then from the last stage to the first its dI and
 * then its dW, then the optimizer and global nodes in their graph order. order receives g->n_nodes
 * ids. */
void gt_pp_split_pipeline_order(const gt_graph *g, const gt_pp_split *s, gt_node_id *order);

/* The bytes one micro-batch of each stage holds from its forward to its backward under binding:
 * every value a forward node of the stage computes, or the stage receives from the stage before,
 * that a dI or dW node of the stage reads. bytes receives n_stages entries; an unbound symbol is
 * an error naming the value. */
gt_status gt_pp_split_saved_bytes(const gt_graph *g, const gt_pp_split *s,
                                  const gt_sym_binding *binding, int64_t *bytes, gt_error *err);

/* A table: per stage the node counts of each part and the values it receives and sends. */
void gt_pp_split_print(const gt_graph *g, const gt_pp_split *s, FILE *f);

#ifdef __cplusplus
}
#endif

#endif
