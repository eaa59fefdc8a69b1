/* cse.c — common-subexpression elimination of identical pure nodes.
 *
 * Contract
 *   requires   a verified graph (nodes in topological order).
 *   guarantees when two nodes have the same op, the same inputs (after earlier merges), the same
 *              attributes and the same set of tags, every use of the later one's outputs (node
 *              inputs and graph outputs) reads the earlier one's instead. Nodes whose op is
 *              random, has side effects or is a collective are never merged (two identical
 *              all_gathers, one in the forward and one in the backward, are FSDP's reshard on
 *              purpose; every rank must run each start/wait it was given). Tags must match so
 *              that deliberate duplicates (a "recompute" copy made by remat) survive. Origins that
 *              named a merged node name the kept one. The merged duplicates are left in place,
 *              dead, for DCE; no id changes.
 *   numerics   exact: a pure op on identical inputs and attributes gives identical bits (every
 *              kernel is deterministic, DESIGN.md §6).
 *
 * The kept node is the first in graph order, whatever its phase: a backward reshape of a forward
 * value merges into the forward reshape. Attributes are compared slot by slot up to each class's
 * count (unused slots are ignored, so stale bytes there never block a merge), floats bytewise (so
 * 0.0 and -0.0 stay distinct, as they may behave differently).
 *
 * One forward sweep with a hash table of the nodes kept so far: O(nodes). */
#include <stdlib.h>
#include <string.h>

#include "passes/pass_internal.h"

static uint64_t node_key_hash(const gt_node *n)
{
    /* Hash the fields that node_equal compares, packed so that padding never enters the hash. */
    int64_t buf[2 + GT_MAX_IN + GT_MAX_IATTR + GT_MAX_FATTR + GT_MAX_EATTR];
    int m = 0;
    buf[m++] = (int64_t)n->op;
    buf[m++] = ((int64_t)n->n_in << 24) | ((int64_t)n->attrs.ni << 16) |
               ((int64_t)n->attrs.nf << 8) | n->attrs.ne;
    for (int k = 0; k < n->n_in; k++)
        buf[m++] = n->in[k];
    for (int k = 0; k < n->attrs.ni && k < GT_MAX_IATTR; k++)
        buf[m++] = n->attrs.i[k];
    for (int k = 0; k < n->attrs.nf && k < GT_MAX_FATTR; k++)
        memcpy(&buf[m++], &n->attrs.f[k], sizeof(double));
    for (int k = 0; k < n->attrs.ne && k < GT_MAX_EATTR; k++)
        buf[m++] = n->attrs.e[k];
    return gt_hash64(buf, (size_t)m * sizeof buf[0], 0x6373650a);
}

static bool tags_equal(const gt_node *a, const gt_node *b)
{
    if (a->n_tags != b->n_tags) return false;
    /* Tags are interned and unique per node, so equal sets = each of a's tags is among b's. */
    for (int i = 0; i < a->n_tags; i++) {
        bool found = false;
        for (int j = 0; j < b->n_tags && !found; j++)
            found = a->tags[i] == b->tags[j];
        if (!found) return false;
    }
    return true;
}

static bool node_equal(const gt_node *a, const gt_node *b)
{
    if (a->op != b->op || a->n_in != b->n_in || a->n_out != b->n_out) return false;
    for (int k = 0; k < a->n_in; k++)
        if (a->in[k] != b->in[k]) return false;
    return gt_attrs_equal(&a->attrs, &b->attrs) && tags_equal(a, b);
}

static bool mergeable(const gt_node *n)
{
    const gt_op_info *info = gt_op_get(n->op);
    if (!info) return false;
    if (info->flags & (GT_OPF_RANDOM | GT_OPF_SIDE_EFFECT | GT_OPF_COLLECTIVE)) return false;
    return n->attrs.ni <= GT_MAX_IATTR && n->attrs.nf <= GT_MAX_FATTR &&
           n->attrs.ne <= GT_MAX_EATTR;
}

gt_status gt_pass_cse(gt_graph *g, const gt_pass_ctx *ctx, gt_error *err)
{
    (void)ctx;
    (void)err;
    gt_value_id *repl = gt_pass_repl_new(g);
    gt_node_id *node_repl = gt_xmalloc((size_t)(g->n_nodes ? g->n_nodes : 1) * sizeof *node_repl);
    uint32_t cap = 64;
    while (cap < 2u * (uint32_t)g->n_nodes)
        cap *= 2;
    gt_node_id *table = gt_xmalloc(cap * sizeof *table);
    for (uint32_t k = 0; k < cap; k++)
        table[k] = GT_NONE;

    for (gt_node_id n = 0; n < g->n_nodes; n++) {
        node_repl[n] = n;
        gt_pass_repl_node_inputs(g, n, repl);
        const gt_node *node = &g->nodes[n];
        if (!mergeable(node)) continue;
        uint32_t h = (uint32_t)node_key_hash(node) & (cap - 1);
        for (; table[h] != GT_NONE; h = (h + 1) & (cap - 1)) {
            if (node_equal(&g->nodes[table[h]], node)) break;
        }
        if (table[h] == GT_NONE) {
            table[h] = n;
            continue;
        }
        const gt_node *kept = &g->nodes[table[h]];
        for (int k = 0; k < node->n_out; k++)
            repl[node->out[k]] = kept->out[k];
        node_repl[n] = table[h];
    }
    gt_pass_repl_outputs(g, repl);
    for (gt_node_id n = 0; n < g->n_nodes; n++)
        if (g->nodes[n].origin != GT_NONE) g->nodes[n].origin = node_repl[g->nodes[n].origin];
    free(table);
    free(node_repl);
    free(repl);
    return GT_OK;
}
