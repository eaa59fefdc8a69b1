/* fusion_add_norm.c — the fusion pass's first step: a residual add whose sum an rms_norm reads
 * becomes, with that rms_norm, one add_rms_norm node (gt_ops.def) that normalizes the sum while
 * it is in registers instead of reading it back.
 *
 * Why: in a llama3 block the residual stream is h = x + attention(x), then ffn_norm(h), and the
 * block's output x' = h + feed_forward(h) goes to the next block's attention_norm (the last one
 * to the final norm): 2 L add -> rms_norm pairs in the forward, each re-reading a [tokens, dim]
 * tensor that the add has just written.
 *
 * Rule: rms_norm node m whose x input h is produced by an add node n merges with it when both
 * are in the same phase, the add's operands have h's type (no broadcasting) and every other
 * reader of h comes after m. The fused node takes m's place (its fqn, phase, origin and tags)
 * with inputs (a, b, w) and outputs (h, y) — the same values, so no reader changes — and n is
 * removed; so h is produced later than before but before its first reader. The add may move
 * past collective starts and waits between n and m (under FSDP the norm weight's all-gather
 * wait sits there): its operands exist at n already, and the readers of h, a collective start
 * among them, come after m. Exact: add_rms_norm's kernels round h to its dtype before the norm
 * reads it, so h and y have the unfused pair's bits. */
#include <stdlib.h>
#include <string.h>

#include "passes/pass_internal.h"

/* Fuses rms_norm node m with the add producing its x when the rule allows. Once fused, x's
 * producer is the fused node, so no add is taken twice. */
static bool fuse(gt_graph *g, gt_pass_fuse_ctx *cx, gt_node_id m)
{
    const gt_node *nm = &g->nodes[m];
    if (nm->op != GT_OP_RMS_NORM || nm->n_in != 2) return false;
    gt_value_id h = nm->in[0];
    gt_node_id n = g->values[h].producer;
    if (n == GT_NONE) return false;
    const gt_node *na = &g->nodes[n];
    if (na->op != GT_OP_ADD || na->phase != nm->phase) return false;
    const gt_type *th = &g->values[h].type;
    for (int k = 0; k < 2; k++)
        if (!gt_pass_type_equal(&g->values[na->in[k]].type, th)) return false;
    const gt_pass_uses *u = &cx->uses;
    for (int32_t e = u->first[h]; e < u->first[h + 1]; e++)
        if (u->node[e] < m) return false; /* a reader of h before m (n reads a, b only) */
    gt_node f = *nm;
    f.op = GT_OP_ADD_RMS_NORM;
    f.n_in = 3;
    f.in[0] = na->in[0];
    f.in[1] = na->in[1];
    f.in[2] = nm->in[1];
    f.n_out = 2;
    f.out[0] = h;
    f.out[1] = nm->out[0];
    if (!gt_pass_shape_matches(g, &f, &f)) return false; /* h and y keep their types */
    gt_pass_place_node(g, m, &f);
    cx->keep[n] = 0;
    return true;
}

int32_t gt_fusion_add_norm(gt_graph *g)
{
    return gt_pass_fuse_each(g, fuse);
}
