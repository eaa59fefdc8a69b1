/* fusion.c — exact fusion of elementwise chains and trees into fused_elementwise nodes.
 *
 * Contract
 *   requires   a verified graph (nodes in topological order), without dead nodes (it runs after
 *              dce).
 *   guarantees groups of two or more elementwise nodes (add sub mul div neg exp log sqrt rsqrt
 *              silu sigmoid scale add_scalar silu_backward clamp, and float-to-float cast) are
 *              computed by one fused_elementwise node each, which takes the place, output value
 *              id, fqn, phase, origin and tags of the group's last node (the root). Every other
 *              member's value is read by a member of the group (the program computes it into a
 *              register, read once or more) and the member is either
 *                absorbed: its value is not a graph output, not read by a fused node built
 *                  before, and every node and input slot reading it is the root or an absorbed
 *                  member; the node and its value are removed; or
 *                duplicated: it has another reader (a node outside the group or a duplicated
 *                  member), and it is worth a copy: a unary op that does not narrow (arity 1,
 *                  not a cast to a smaller dtype: the copy reads the one input instead of the
 *                  output and adds no bytes) whose value is not a graph output and is read only
 *                  by fusable nodes of its phase (so that it may die; a node that stays anyway
 *                  gains nothing from copies). The node stays for its other readers, may be
 *                  duplicated into other groups too, and is removed at the end (with its value)
 *                  if no kept node and no graph output reads it any more.
 *              A node is absorbed by at most one group (a root is absorbed by its own). Members
 *              share the root's phase (a forward value the backward reads stays what
 *              memory_policy saved). Members may lie before collective starts and waits that
 *              precede the root (under FSDP a parameter's all-gather wait sits right before its
 *              first reader): an absorbed member's computation moves later, to the root, where
 *              its inputs exist, and its value had no reader but the group. A group has at most
 *              GT_FUSED_MAX_INS instructions, GT_MAX_IN distinct inputs and GT_FUSED_MAX_CONST
 *              scalar constants. Ids are compacted in order; nodes whose origin was a removed
 *              node get origin GT_NONE.
 *              First, an add whose sum an rms_norm reads becomes one add_rms_norm node with it
 *              (fusion_add_norm.c states when), an rms_norm_backward with the adds that sum its
 *              dy and the residual add of its dx one rms_norm_backward_add node
 *              (fusion_norm_backward.c), cross_entropy and its backward one
 *              cross_entropy_with_grad node (fusion_loss.c), and a widening cast (bf16/f16 -> f32)
 *              read only by slots that widen their input themselves (sum_squares' x, adamw's
 *              gradient) is removed and its readers read its input: the optimizer reads bf16
 *              gradients without an f32 copy. Last, sibling fused nodes that share an input merge
 *              into one node with several outputs (fusion_merge.c states when).
 *   numerics   exact: each instruction computes what its node's kernel computed and rounds to
 *              the dtype that node's output had (fused_program.h), so the root's value is
 *              bitwise the same (a duplicated copy computes its original's bits); the kernels
 *              evaluate it element by element in that order. A widening is exact wherever it
 *              happens.
 *
 * Groups grow from roots taken in reverse node order: the root tries, breadth first, the
 * producers of its members' inputs (fusable, same phase, not absorbed) and keeps each one with
 * which every member is still absorbed or duplicable and the limits hold, so each group is maximal
 * for the greedy order. Values read by a fused node are pinned: a later (earlier in node order)
 * group never absorbs their producer. A group tries at most 2 * GT_FUSED_MAX_INS producers, each
 * checked in O(GT_FUSED_MAX_INS^3): O(nodes * GT_FUSED_MAX_INS^4) at worst. */
#include <stdlib.h>
#include <string.h>

#include "ir/fused_program.h"
#include "passes/pass_internal.h"

/* A node that may be a member: a fusable op on float values, one output. */
static bool fusable(const gt_graph *g, const gt_node *nd)
{
    if (gt_fused_arity((int)nd->op) == 0 || nd->n_out != 1) return false;
    if (gt_fused_arity((int)nd->op) != nd->n_in) return false;
    if (!gt_fused_float_dtype(g->values[nd->out[0]].type.dtype)) return false;
    for (int k = 0; k < nd->n_in; k++)
        if (!gt_fused_float_dtype(g->values[nd->in[k]].type.dtype)) return false;
    return true;
}

typedef struct {
    gt_node_id node[GT_FUSED_MAX_INS]; /* members; [0] is the root */
    int n;
} fusion_group;

static bool in_group(const fusion_group *grp, gt_node_id n)
{
    for (int k = 0; k < grp->n; k++)
        if (grp->node[k] == n) return true;
    return false;
}

static int cmp_node(const void *a, const void *b)
{
    gt_node_id x = *(const gt_node_id *)a, y = *(const gt_node_id *)b;
    return (x > y) - (x < y);
}

/* Builds the fused node for grp (members sorted by node id; the root is the last) into *fused,
 * a copy of the root with the new op, inputs and attributes. False when the group exceeds a
 * limit (inputs or constants). */
static bool build_program(const gt_graph *g, const fusion_group *grp, gt_node *fused)
{
    const gt_node *root = &g->nodes[grp->node[grp->n - 1]];
    *fused = *root;
    fused->op = GT_OP_FUSED_ELEMENTWISE;
    fused->n_in = 0;
    memset(&fused->attrs, 0, sizeof fused->attrs);
    for (int k = 0; k < grp->n; k++) {
        const gt_node *m = &g->nodes[grp->node[k]];
        int src[2] = {0, 0};
        for (int s = 0; s < m->n_in; s++) {
            gt_value_id v = m->in[s];
            gt_node_id p = g->values[v].producer;
            int j = -1;
            for (int q = 0; q < k && j < 0; q++)
                if (grp->node[q] == p) j = q;
            if (j >= 0) {
                src[s] = GT_FUSED_TEMP + j;
                continue;
            }
            int slot = -1;
            for (int q = 0; q < fused->n_in && slot < 0; q++)
                if (fused->in[q] == v) slot = q;
            if (slot < 0) {
                if (fused->n_in == GT_MAX_IN) return false;
                slot = fused->n_in++;
                fused->in[slot] = v;
            }
            src[s] = slot;
        }
        int nc = gt_fused_n_const((int)m->op), fslot = 0;
        if (nc) {
            if (fused->attrs.nf + nc > GT_FUSED_MAX_CONST) return false;
            fslot = fused->attrs.nf;
            for (int c = 0; c < nc; c++)
                fused->attrs.f[fused->attrs.nf++] = m->attrs.f[c];
        }
        gt_dtype dt = g->values[m->out[0]].type.dtype;
        fused->attrs.i[fused->attrs.ni++] = gt_fused_encode(m->op, dt, src[0], src[1], fslot);
    }
    for (int k = fused->n_in; k < GT_MAX_IN; k++)
        fused->in[k] = 0;
    return true;
}

/* What the checks of a group read: the readers of each value (one entry per input slot, as in
 * the graph before fusion: a fused node built since reads only pinned values or values of nodes
 * it absorbed), the pinned values and the nodes worth duplicating. */
typedef struct {
    gt_pass_uses u;
    uint8_t *pinned; /* [value]: a graph output, or read by a fused node built so far */
    uint8_t *dup_ok; /* [node]: worth_duplicating */
} fusion_state;

/* A node worth duplicating: a unary op that does not narrow (a copy reads its one input, no
 * wider than its output: no byte added) whose value is not a graph output and is read only by
 * fusable nodes of its phase. Each reader may then get its own copy and the node die; a node that
 * stays anyway gains nothing from copies, and a copy would pin its input, so that the node's own
 * group could no longer absorb that input's producer. */
static bool worth_duplicating(const gt_graph *g, const fusion_state *fs, gt_node_id n)
{
    const gt_node *nd = &g->nodes[n];
    if (!fusable(g, nd) || gt_fused_arity((int)nd->op) != 1) return false;
    gt_value_id v = nd->out[0];
    if (gt_dtype_size(g->values[nd->in[0]].type.dtype) > gt_dtype_size(g->values[v].type.dtype) ||
        fs->pinned[v])
        return false;
    for (int32_t j = fs->u.first[v]; j < fs->u.first[v + 1]; j++) {
        const gt_node *rd = &g->nodes[fs->u.node[j]];
        if (!fusable(g, rd) || rd->phase != nd->phase) return false;
    }
    return true;
}

/* For grp sorted by node id (the root last): absorbed[k] when member k is the root or when its
 * value is not pinned and every slot reading it belongs to an absorbed member. Readers come after
 * their producer, so one sweep down from the root decides. The other members are duplicated:
 * false when one of them is not worth it. */
static bool classify(const gt_graph *g, const fusion_state *fs, const fusion_group *grp,
                     bool *absorbed)
{
    absorbed[grp->n - 1] = true;
    for (int k = grp->n - 2; k >= 0; k--) {
        gt_value_id v = g->nodes[grp->node[k]].out[0];
        bool all = !fs->pinned[v];
        for (int32_t j = fs->u.first[v]; j < fs->u.first[v + 1] && all; j++) {
            int q = k + 1;
            while (q < grp->n && grp->node[q] != fs->u.node[j])
                q++;
            all = q < grp->n && absorbed[q];
        }
        absorbed[k] = all;
        if (!all && !fs->dup_ok[grp->node[k]]) return false;
    }
    return true;
}

/* Whether grp (unsorted) can be one fused node: every member absorbed or duplicated, and the
 * program within the limits. */
static bool group_ok(const gt_graph *g, const fusion_state *fs, const fusion_group *grp)
{
    fusion_group sorted = *grp;
    qsort(sorted.node, (size_t)sorted.n, sizeof sorted.node[0], cmp_node);
    bool absorbed[GT_FUSED_MAX_INS];
    gt_node scratch;
    return classify(g, fs, &sorted, absorbed) && build_program(g, &sorted, &scratch);
}

/* Input slots whose kernels widen a bf16/f16 value to f32 themselves, exactly as cast does:
 * sum_squares' x and adamw's gradient. */
static bool widens_slot(const gt_node *nd, int slot)
{
    return (nd->op == GT_OP_SUM_SQUARES && slot == 0) || (nd->op == GT_OP_ADAMW && slot == 1);
}

/* A widening cast (bf16/f16 -> f32) all of whose readers widen the slot it feeds is dropped: they
 * read its input instead (the gradient norm and AdamW read a bf16 gradient with no f32 copy of
 * it). Bitwise: the widening is exact wherever it happens. Returns the number dropped. */
static int32_t absorb_widening_casts(gt_graph *g)
{
    int32_t nn = g->n_nodes, dropped = 0;
    uint8_t *is_out = gt_xcalloc((size_t)g->n_values + 1, 1);
    for (int32_t k = 0; k < g->n_outputs; k++)
        is_out[g->outputs[k].value] = 1;
    gt_pass_uses u;
    gt_pass_uses_build(g, &u);
    uint8_t *keep = gt_xmalloc((size_t)nn + 1);
    memset(keep, 1, (size_t)nn + 1);
    for (gt_node_id c = 0; c < nn; c++) {
        const gt_node *cn = &g->nodes[c];
        if (cn->op != GT_OP_CAST || cn->n_out != 1) continue;
        gt_value_id v = cn->out[0], x = cn->in[0];
        gt_dtype from = g->values[x].type.dtype;
        if (g->values[v].type.dtype != GT_F32 || (from != GT_BF16 && from != GT_F16) || is_out[v])
            continue;
        int32_t n_users = u.first[v + 1] - u.first[v];
        bool all = n_users > 0;
        for (int32_t j = u.first[v]; j < u.first[v + 1] && all; j++) {
            const gt_node *rd = &g->nodes[u.node[j]];
            for (int s = 0; s < rd->n_in; s++)
                if (rd->in[s] == v && !widens_slot(rd, s)) all = false;
        }
        if (!all) continue;
        for (int32_t j = u.first[v]; j < u.first[v + 1]; j++) {
            gt_node *rd = &g->nodes[u.node[j]];
            for (int s = 0; s < rd->n_in; s++)
                if (rd->in[s] == v) rd->in[s] = x;
        }
        keep[c] = 0;
        dropped++;
    }
    if (dropped > 0) gt_pass_compact(g, keep);
    free(keep);
    gt_pass_uses_free(&u);
    free(is_out);
    return dropped;
}

gt_status gt_pass_fusion(gt_graph *g, const gt_pass_ctx *ctx, gt_error *err)
{
    gt_fusion_add_norm(g);
    gt_fusion_norm_backward(g);
    GT_TRY(gt_fusion_loss(g, err));
    absorb_widening_casts(g);
    (void)ctx;
    int32_t nn = g->n_nodes;
    fusion_state fs;
    gt_pass_uses_build(g, &fs.u);
    fs.pinned = gt_xcalloc((size_t)g->n_values + 1, 1);
    for (int32_t k = 0; k < g->n_outputs; k++)
        fs.pinned[g->outputs[k].value] = 1;
    fs.dup_ok = gt_xcalloc((size_t)nn + 1, 1);
    for (gt_node_id n = 0; n < nn; n++)
        fs.dup_ok[n] = worth_duplicating(g, &fs, n);
    uint8_t *taken = gt_xcalloc((size_t)nn + 1, 1); /* absorbed by a group */
    uint8_t *dup = gt_xcalloc((size_t)nn + 1, 1);   /* duplicated into a group */
    uint8_t *keep = gt_xmalloc((size_t)nn + 1);
    memset(keep, 1, (size_t)nn + 1);
    int32_t n_groups = 0;
    gt_status st = GT_OK;

    for (gt_node_id r = nn - 1; r >= 0 && st == GT_OK; r--) {
        const gt_node *root = &g->nodes[r];
        if (taken[r] || !fusable(g, root)) continue;
        fusion_group grp = {.node = {r}, .n = 1};
        for (int w = 0; w < grp.n && grp.n < GT_FUSED_MAX_INS; w++) {
            const gt_node *m = &g->nodes[grp.node[w]];
            for (int s = 0; s < m->n_in && grp.n < GT_FUSED_MAX_INS; s++) {
                gt_node_id p = g->values[m->in[s]].producer;
                if (p == GT_NONE || taken[p] || in_group(&grp, p)) continue;
                const gt_node *pn = &g->nodes[p];
                if (!fusable(g, pn) || pn->phase != root->phase) continue;
                grp.node[grp.n++] = p;
                if (!group_ok(g, &fs, &grp)) grp.n--;
            }
        }
        if (grp.n < 2) continue;
        qsort(grp.node, (size_t)grp.n, sizeof grp.node[0], cmp_node);
        bool absorbed[GT_FUSED_MAX_INS];
        gt_node fused;
        if (!classify(g, &fs, &grp, absorbed) || !build_program(g, &grp, &fused)) continue;
        if (!gt_pass_shape_matches(g, &fused, root)) {
            char buf[512];
            gt_graph_format_node(g, r, buf, sizeof buf);
            st = gt_error_set(err, GT_ERR_INTERNAL,
                              "fusion: the fused program of %d nodes ending at node %d does not "
                              "reproduce its type (%s)",
                              grp.n, r, buf);
            break;
        }
        g->nodes[r] = fused;
        for (int k = 0; k < grp.n; k++) {
            gt_node_id m = grp.node[k];
            if (!absorbed[k]) {
                dup[m] = 1;
                continue;
            }
            taken[m] = 1;
            if (m != r) keep[m] = 0;
        }
        for (int k = 0; k < fused.n_in; k++)
            fs.pinned[fused.in[k]] = 1;
        n_groups++;
    }
    /* a duplicated node that no kept node and no graph output reads any more is dead; from the
     * last node down, so that a duplicated chain goes as a whole */
    int32_t *readers = gt_xcalloc((size_t)g->n_values + 1, sizeof *readers);
    for (int32_t k = 0; k < g->n_outputs; k++)
        readers[g->outputs[k].value]++;
    for (gt_node_id n = 0; n < nn; n++)
        for (int s = 0; s < g->nodes[n].n_in && keep[n]; s++)
            readers[g->nodes[n].in[s]]++;
    for (gt_node_id n = nn - 1; n >= 0; n--) {
        const gt_node *nd = &g->nodes[n];
        if (!dup[n] || !keep[n] || readers[nd->out[0]] > 0) continue;
        keep[n] = 0;
        for (int s = 0; s < nd->n_in; s++)
            readers[nd->in[s]]--;
    }
    if (st == GT_OK && n_groups > 0) gt_pass_compact(g, keep);
    if (st == GT_OK && n_groups > 0) gt_fusion_merge_siblings(g);
    free(readers);
    free(keep);
    free(dup);
    free(taken);
    free(fs.dup_ok);
    free(fs.pinned);
    gt_pass_uses_free(&fs.u);
    return st;
}
