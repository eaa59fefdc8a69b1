/* region.c — gt_graph_copy_region: replay nodes [first, last) of src into dst with remapped
 * inputs; gt_graph_copy_nodes: the same for any list of nodes, optionally with one symbol of the
 * shapes replaced in their attributes. Remat copies a forward region inside the same graph
 * (dst == src) to recompute it; chunking copies a region once per chunk, the batch or sequence
 * symbol replaced by the chunk's size.
 *
 * Each copy keeps op, attributes, fqn, phase and tags; its output types are re-derived by the shape
 * rule from the remapped inputs (a chunk's inputs may be smaller than the original's), and each
 * output takes its original's placements (gt_value.place). When dst is another graph, strings are
 * re-interned and expressions imported into dst's pool, and a dst without a mesh takes src's (so
 * the collectives' mesh checks and the printed placements mean the same in the copy). */
#include <string.h>

#include "ir/ir_internal.h"

/* Moves an expression into dst's pool (a no-op within one graph). */
static gt_expr move_expr(gt_graph *dst, const gt_graph *src, gt_expr e)
{
    if (dst == src || e == GT_EXPR_INVALID) return e;
    return gt_sym_import(dst->sym, src->sym, e);
}

static gt_str move_str(gt_graph *dst, const gt_graph *src, gt_str s)
{
    if (dst == src) return s;
    return gt_graph_intern(dst, gt_graph_str(src, s));
}

/* Copies node id of src into dst (see gt_graph_copy_region); `first` and dst_first place the
 * copied range for origins across graphs; subst (optional) rewrites expression attributes. */
static gt_status copy_node(gt_graph *dst, const gt_graph *src, gt_node_id id, gt_node_id first,
                           gt_node_id dst_first, gt_value_id *map, const gt_sym_subst *subst,
                           gt_error *err)
{
    bool same = dst == src;
    /* A copy, not a pointer: appending to dst may move src's node array when dst == src. */
    gt_node n = src->nodes[id];
    char label[256];
    gt_node_label(src, &n, label, sizeof label);
    for (int k = 0; k < n.n_in && k < GT_MAX_IN; k++) {
        gt_value_id v = n.in[k];
        if (v < 0 || v >= src->n_values)
            return gt_error_set(err, GT_ERR_INVALID,
                                "copy region: node %d (%s): input %d is %%%d, not a value", id,
                                label, k, v);
        gt_value_id m = map[v];
        if (m == GT_NONE) {
            if (!same)
                return gt_error_set(err, GT_ERR_INVALID,
                                    "copy region: node %d (%s): input %%%d has no value in "
                                    "the destination graph (map entry is GT_NONE)",
                                    id, label, v);
            m = v;
        }
        if (m < 0 || m >= dst->n_values)
            return gt_error_set(err, GT_ERR_INVALID,
                                "copy region: node %d (%s): input %%%d maps to %%%d, not a "
                                "value of the destination",
                                id, label, v, m);
        n.in[k] = m;
    }
    n.fqn = move_str(dst, src, n.fqn);
    for (int k = 0; k < n.n_tags && k < GT_MAX_TAGS; k++)
        n.tags[k] = move_str(dst, src, n.tags[k]);
    for (int k = 0; k < n.attrs.ne && k < GT_MAX_EATTR; k++) {
        n.attrs.e[k] = move_expr(dst, src, n.attrs.e[k]);
        if (subst && n.attrs.e[k] != GT_EXPR_INVALID)
            n.attrs.e[k] = gt_sym_replace(dst->sym, n.attrs.e[k], subst->name, subst->repl);
    }
    /* origin names a node of src: keep it within one graph; across graphs only an origin
     * inside the region has a counterpart (its copy). */
    if (!same && n.origin != GT_NONE)
        n.origin = n.origin >= first && n.origin < id ? dst_first + (n.origin - first) : GT_NONE;
    gt_status st = gt_graph_append_node(dst, &n, err);
    if (st != GT_OK) return gt_error_wrap(err, "copy region: node %d", id);
    const gt_node *orig = &src->nodes[id];
    for (int k = 0; k < n.n_out; k++) {
        map[orig->out[k]] = n.out[k];
        memcpy(dst->values[n.out[k]].place, src->values[orig->out[k]].place,
               sizeof dst->values[n.out[k]].place);
    }
    return GT_OK;
}

static void take_mesh(gt_graph *dst, const gt_graph *src)
{
    if (dst != src && dst->mesh.ndim == 0 && src->mesh.ndim > 0) {
        dst->mesh = src->mesh;
        for (int d = 0; d < src->mesh.ndim && d < GT_MESH_MAX_DIMS; d++)
            dst->mesh.name[d] = move_str(dst, src, src->mesh.name[d]);
    }
}

gt_status gt_graph_copy_region(gt_graph *dst, const gt_graph *src, gt_node_id first,
                               gt_node_id last, gt_value_id *map, gt_error *err)
{
    if (first < 0 || last < first || last > src->n_nodes)
        return gt_error_set(err, GT_ERR_INVALID,
                            "copy region: [%d, %d) is not a node range of a graph with %d nodes",
                            first, last, src->n_nodes);
    if (!map && first < last)
        return gt_error_set(err, GT_ERR_INVALID, "copy region: no value map given");
    gt_node_id dst_first = dst->n_nodes;
    take_mesh(dst, src);
    for (gt_node_id id = first; id < last; id++)
        GT_TRY(copy_node(dst, src, id, first, dst_first, map, NULL, err));
    return GT_OK;
}

gt_status gt_graph_copy_nodes(gt_graph *dst, const gt_graph *src, const gt_node_id *ids, int n,
                              gt_value_id *map, const gt_sym_subst *subst, gt_error *err)
{
    if (!map && n > 0) return gt_error_set(err, GT_ERR_INVALID, "copy nodes: no value map given");
    take_mesh(dst, src);
    for (int k = 0; k < n; k++) {
        if (ids[k] < 0 || ids[k] >= src->n_nodes)
            return gt_error_set(err, GT_ERR_INVALID, "copy nodes: %d is not a node of a graph "
                                "with %d nodes", ids[k], src->n_nodes);
        /* origins kept within one graph; across graphs they have no counterpart here */
        GT_TRY(copy_node(dst, src, ids[k], src->n_nodes, dst->n_nodes, map, subst, err));
    }
    return GT_OK;
}
