/* fusion_norm_backward.c — the fusion pass's step for the RMSNorm backward: an rms_norm_backward,
 * the add chain that summed its dy and the residual add that reads its dx become one
 * rms_norm_backward_add node (gt_ops.def), one pass over the rows instead of three to five.
 *
 * Why: in a llama3 block's backward the gradient of the residual stream at a norm's input is
 * dh = dh_residual + rms_norm_backward(x, w, dy).dx, and dy is itself a sum of branch gradients:
 * the w1 and w3 input gradients (ffn_norm) or the wq, wk and wv ones (attention_norm). Unfused,
 * each add writes a [tokens, dim] tensor that the next node reads back: at 1B, 3 adds per block,
 * 48 per step, plus the norm's own dx round trip.
 *
 * Rule, for an rms_norm_backward node m with inputs (x, w, dy) and outputs (g, dw):
 *   residual  g's only reader is one add node n (g is no graph output), of m's phase, whose
 *             other operand r has g's type and is produced before m (or is a graph input); n's
 *             output becomes the fused node's dx;
 *   dy terms  dy, when produced by an add of m's phase read only by m (and no graph output),
 *             with operands of dy's type, is replaced by its operands; an operand that is itself
 *             such an add (read only by that add) is expanded the same way, at most 3 terms in
 *             all. The terms keep the chain's order of evaluation: t = ((d0 + d1) + d2), so d0,
 *             d1 are the operands of the innermost add (an add's operands commute bitwise, so
 *             which side an inner add sat on does not matter).
 * The fused node (x, w, r, d0[, d1[, d2]]) -> (dx, dw) takes m's place (fqn, phase, origin,
 * tags); n and the absorbed adds are removed. Every input is produced before m, so the order
 * stays topological; dx is produced earlier than before, before all of its readers. Collective
 * starts and waits between the nodes do not matter (under FSDP the re-gathered weights' waits
 * sit there): what the fused node reads exists at m, and what it writes is read after m.
 * Exact: the kernels round each partial sum of dy and the norm's dx to the dtype before the
 * next add reads them, as the unfused adds' outputs were rounded. */
#include <stdlib.h>
#include <string.h>

#include "passes/pass_internal.h"

#define MAX_TERMS 3

/* The one node reading v through one slot, or GT_NONE. */
static gt_node_id sole_reader(const gt_pass_fuse_ctx *cx, gt_value_id v)
{
    const gt_pass_uses *u = &cx->uses;
    if (cx->is_out[v] || u->first[v + 1] - u->first[v] != 1) return GT_NONE;
    return u->node[u->first[v]];
}

/* True when v is produced by an add that may be absorbed into node m: m's phase, v read only by
 * `reader`, operands of v's type, not taken already. */
static bool absorbable_add(const gt_graph *g, const gt_pass_fuse_ctx *cx, gt_value_id v,
                           gt_node_id reader, gt_node_id m)
{
    gt_node_id p = g->values[v].producer;
    if (p == GT_NONE || !cx->keep[p]) return false;
    const gt_node *np = &g->nodes[p];
    if (np->op != GT_OP_ADD || np->n_in != 2 || np->phase != g->nodes[m].phase) return false;
    if (sole_reader(cx, v) != reader) return false;
    for (int k = 0; k < 2; k++)
        if (!gt_pass_type_equal(&g->values[np->in[k]].type, &g->values[v].type)) return false;
    return true;
}

/* Expands dy (read by m) into its chain's terms: terms[0..*n), the adds absorbed into adds[]. */
static void dy_terms(const gt_graph *g, const gt_pass_fuse_ctx *cx, gt_node_id m, gt_value_id dy,
                     gt_value_id *terms, int *n, gt_node_id *adds, int *n_adds)
{
    /* Walk down the chain from the add producing dy: each step keeps one operand as the last
     * term still to add and descends into the other when it is an absorbable add. */
    gt_value_id tail[MAX_TERMS];
    int n_tail = 0;
    gt_value_id v = dy;
    gt_node_id reader = m;
    while (n_tail + 2 <= MAX_TERMS && absorbable_add(g, cx, v, reader, m)) {
        gt_node_id p = g->values[v].producer;
        const gt_node *np = &g->nodes[p];
        adds[(*n_adds)++] = p;
        /* the left operand, unless only the right one is an add to take */
        int inner =
            !absorbable_add(g, cx, np->in[0], p, m) && absorbable_add(g, cx, np->in[1], p, m) ? 1
                                                                                              : 0;
        tail[n_tail++] = np->in[1 - inner];
        v = np->in[inner];
        reader = p;
    }
    terms[0] = v;
    *n = 1;
    for (int k = n_tail - 1; k >= 0; k--)
        terms[(*n)++] = tail[k];
}

/* Fuses rms_norm_backward node m when the rule allows. */
static bool fuse(gt_graph *g, gt_pass_fuse_ctx *cx, gt_node_id m)
{
    const gt_node *nm = &g->nodes[m];
    if (nm->op != GT_OP_RMS_NORM_BACKWARD || nm->n_in != 3 || nm->n_out != 2) return false;
    gt_value_id gx = nm->out[0];
    gt_node_id n = sole_reader(cx, gx);
    if (n == GT_NONE || !cx->keep[n]) return false;
    const gt_node *nn = &g->nodes[n];
    if (nn->op != GT_OP_ADD || nn->n_in != 2 || nn->phase != nm->phase) return false;
    gt_value_id r = nn->in[0] == gx ? nn->in[1] : nn->in[0];
    if (r == gx) return false; /* g + g */
    gt_node_id rp = g->values[r].producer;
    if (rp != GT_NONE && rp > m) return false;
    if (!gt_pass_type_equal(&g->values[r].type, &g->values[gx].type)) return false;

    gt_value_id terms[MAX_TERMS];
    gt_node_id adds[MAX_TERMS];
    int n_terms = 0, n_adds = 0;
    dy_terms(g, cx, m, nm->in[2], terms, &n_terms, adds, &n_adds);

    gt_node f = *nm;
    f.op = GT_OP_RMS_NORM_BACKWARD_ADD;
    f.n_in = 3 + n_terms;
    f.in[0] = nm->in[0];
    f.in[1] = nm->in[1];
    f.in[2] = r;
    for (int k = 0; k < n_terms; k++)
        f.in[3 + k] = terms[k];
    f.out[0] = nn->out[0];
    f.out[1] = nm->out[1];
    if (!gt_pass_shape_matches(g, &f, &f)) return false; /* dx and dw keep their types */
    gt_pass_place_node(g, m, &f);
    g->values[gx].producer = n; /* g is no one's output now: it goes with the add */
    cx->keep[n] = 0;
    for (int k = 0; k < n_adds; k++)
        cx->keep[adds[k]] = 0;
    return true;
}

int32_t gt_fusion_norm_backward(gt_graph *g)
{
    return gt_pass_fuse_each(g, fuse);
}
