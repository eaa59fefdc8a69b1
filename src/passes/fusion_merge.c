/* fusion_merge.c — the fusion pass's last step: sibling fused_elementwise nodes that read a common
 * input become one node with several outputs (fused_program.h: output flags), so that the input
 * is read once.
 *
 * Why: after grouping, the SwiGLU backward of a llama3 block is three fused nodes over the same
 * [tokens, hidden] tensors h1, h3 and dy: y2 = silu(h1) h3 (recomputed for the w2 gradient),
 * dh3 = dy silu(h1) and dh1 = silu_backward(h1, dy h3). Separately they read 7 tensors and write
 * 3; merged they read 3 and write 3.
 *
 * Rule: fused nodes a < b (node order) merge when they are in the same phase, their outputs have
 * the same dims, they share an input value, neither reads the other's outputs, the merged program
 * keeps the limits (GT_FUSED_MAX_INS instructions, GT_MAX_IN inputs, GT_MAX_OUT outputs,
 * GT_FUSED_MAX_CONST constants), each is made of two-instruction pieces (at most 2 instructions per
 * output: the size the backends run at full bandwidth as several outputs, see cuda_fused.cu; a
 * larger program would be interpreted), and b lies at most GT_MERGE_WINDOW nodes after a. The
 * merged node takes the place of b when every reader of a's outputs comes after b, else of a when
 * every input of b is produced before a (otherwise they do not merge): either way every value is
 * still produced before it is read. Its program is a's followed by b's (inputs deduplicated, b's
 * temps renumbered), each piece's outputs flagged, and its outputs are a's then b's; it keeps the
 * fqn, phase, origin and tags of the node whose place it takes. Exact: each instruction is
 * unchanged, so each output has the bits it had. */
#include <stdlib.h>
#include <string.h>

#include "ir/fused_program.h"
#include "passes/pass_internal.h"

#define GT_MERGE_WINDOW 32

static bool is_fused(const gt_node *nd)
{
    return nd->op == GT_OP_FUSED_ELEMENTWISE;
}

static bool same_dims(const gt_type *a, const gt_type *b)
{
    if (a->ndim != b->ndim) return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->dims[d] != b->dims[d]) return false;
    return true;
}

/* Appends nd's program to m: inputs deduplicated, temps shifted past m's instructions, constants
 * appended, nd's outputs flagged and appended to m's outputs. False when a limit is exceeded (m
 * is then partly written: the caller drops it). */
static bool append_program(const gt_node *nd, gt_node *m)
{
    int base = m->attrs.ni, fbase = m->attrs.nf;
    if (base + nd->attrs.ni > GT_FUSED_MAX_INS || fbase + nd->attrs.nf > GT_FUSED_MAX_CONST)
        return false;
    int reg[GT_MAX_OUT];
    int no = gt_fused_outputs(nd->attrs.i, nd->attrs.ni, reg);
    if (m->n_out + no > GT_MAX_OUT) return false;
    int slot[GT_MAX_IN];
    for (int k = 0; k < nd->n_in; k++) {
        int s = -1;
        for (int q = 0; q < m->n_in && s < 0; q++)
            if (m->in[q] == nd->in[k]) s = q;
        if (s < 0) {
            if (m->n_in == GT_MAX_IN) return false;
            s = m->n_in++;
            m->in[s] = nd->in[k];
        }
        slot[k] = s;
    }
    int j = 0;
    for (int k = 0; k < nd->attrs.ni; k++) {
        gt_fused_ins in = gt_fused_decode(nd->attrs.i[k]);
        int src[2] = {0, 0};
        for (int s = 0; s < gt_fused_arity(in.op); s++)
            src[s] = in.src[s] >= GT_FUSED_TEMP ? in.src[s] + base : slot[in.src[s]];
        int fslot = gt_fused_n_const(in.op) > 0 ? in.fslot + fbase : 0;
        int64_t w = gt_fused_encode((gt_op)in.op, (gt_dtype)in.dtype, src[0], src[1], fslot);
        if (j < no && reg[j] == k) {
            w = gt_fused_with_out(w);
            j++;
        }
        m->attrs.i[m->attrs.ni++] = w;
    }
    for (int c = 0; c < nd->attrs.nf; c++)
        m->attrs.f[m->attrs.nf++] = nd->attrs.f[c];
    for (int k = 0; k < no; k++)
        m->out[m->n_out++] = nd->out[k];
    return true;
}

/* Node ids carry the nodes' computations: home[n] is the node now computing what n computed (n,
 * or the merged node that took it). The merge of a and b as described above, or false. */
static bool try_merge(gt_graph *g, const gt_pass_uses *u, gt_node_id *home, uint8_t *keep,
                      gt_node_id a, gt_node_id b)
{
    const gt_node *na = &g->nodes[a], *nb = &g->nodes[b];
    if (na->phase != nb->phase) return false;
    if (na->attrs.ni > 2 * na->n_out || nb->attrs.ni > 2 * nb->n_out) return false;
    if (!same_dims(&g->values[na->out[0]].type, &g->values[nb->out[0]].type)) return false;
    bool shared = false;
    for (int i = 0; i < na->n_in; i++)
        for (int k = 0; k < nb->n_in; k++)
            shared |= na->in[i] == nb->in[k];
    if (!shared) return false;
    /* where may the merged node sit? b: a's outputs all read after b (b itself reading one is
     * excluded too); a: b's inputs all produced before a */
    bool at_b = true, at_a = true;
    for (int k = 0; k < na->n_out && at_b; k++) {
        gt_value_id v = na->out[k];
        for (int32_t e = u->first[v]; e < u->first[v + 1] && at_b; e++)
            at_b = home[u->node[e]] > b;
    }
    for (int k = 0; k < nb->n_in && at_a; k++) {
        gt_node_id p = g->values[nb->in[k]].producer;
        at_a = p == GT_NONE || home[p] < a;
    }
    if (!at_b && !at_a) return false;
    gt_node_id at = at_b ? b : a, gone = at_b ? a : b;
    gt_node m = g->nodes[at];
    m.n_in = 0;
    m.n_out = 0;
    memset(&m.attrs, 0, sizeof m.attrs);
    if (!append_program(na, &m) || !append_program(nb, &m)) return false;
    for (int k = m.n_in; k < GT_MAX_IN; k++)
        m.in[k] = 0;
    if (!gt_pass_shape_matches(g, &m, &m)) return false;
    gt_pass_place_node(g, at, &m);
    keep[gone] = 0;
    for (gt_node_id n = 0; n < g->n_nodes; n++)
        if (home[n] == gone) home[n] = at;
    return true;
}

int32_t gt_fusion_merge_siblings(gt_graph *g)
{
    int32_t nn = g->n_nodes, merged = 0;
    gt_pass_uses u;
    gt_pass_uses_build(g, &u);
    gt_node_id *home = gt_xmalloc((size_t)(nn ? nn : 1) * sizeof *home);
    for (gt_node_id n = 0; n < nn; n++)
        home[n] = n;
    uint8_t *keep = gt_xmalloc((size_t)nn + 1);
    memset(keep, 1, (size_t)nn + 1);
    for (gt_node_id b = 0; b < nn; b++) {
        for (gt_node_id a = b - 1; a >= 0 && a >= b - GT_MERGE_WINDOW; a--) {
            if (!keep[b] || !is_fused(&g->nodes[b])) break;
            if (!keep[a] || !is_fused(&g->nodes[a])) continue;
            if (try_merge(g, &u, home, keep, a, b)) merged++;
        }
    }
    if (merged > 0) gt_pass_compact(g, keep);
    free(keep);
    free(home);
    gt_pass_uses_free(&u);
    return merged;
}
