/* shape_rules_comm.c — shape rules of the collective start/wait ops (gt_ops.def).
 *
 * Each start runs over one mesh dim (attrs i: mesh_dim, group_size = n, the dim's size) along
 * tensor dim 0:
 *   all_gather_start     x [k, ...]   -> [n*k, ...]      any dtype (bytes are only moved)
 *   reduce_scatter_start x [m, ...]   -> [m // n, ...]   float; m must divide by n when constant
 *                                                        (a symbolic m is trusted: parallelize
 *                                                        only scatters dims it made divisible);
 *                                                        output dtype = attr dtype (optional,
 *                                                        absent: x's): x's own, or f32 for a
 *                                                        bf16/f16 x (the widening scatter: the
 *                                                        sum is taken in f32 anyway, so this is
 *                                                        bitwise the scatter of cast(x, f32))
 *   all_reduce_start     x            -> x's type        float
 *   all_to_all_start     x [m, ...]   -> x's type        any dtype; m must divide by n when
 *                                                        constant. Block j (rows j*m/n..) goes
 *                                                        to rank j; block i of the output is
 *                                                        what rank i sent this rank
 *   send_start           x            -> x's type        any dtype; to rank `peer` of the mesh
 *                                                        dim under `tag` (a pipeline's
 *                                                        point-to-point, gt_pp_unroll); its
 *                                                        output is x's own bytes (alias RESULT)
 *   recv_start           ()           -> dtype[shape]    from rank `peer` under `tag`: the
 *                                                        attributes give the type
 *   wait(pending, x)                  -> pending's type  pending: the output of a start; x: that
 *                                                        start's input, listed only so that it
 *                                                        stays alive until the wait (a
 *                                                        recv_start has none: x is pending)
 * The mesh dim is checked against the graph's mesh when it has one (gt_graph.mesh, set by
 * parallelize): 0 <= mesh_dim < mesh.ndim and n == mesh.size[mesh_dim]. Without a mesh (a graph
 * built by hand) any mesh_dim in [0, GT_MESH_MAX_DIMS) and n >= 1 are accepted. */
#include "ir/ir_internal.h"

/* The attributes every start shares: a mesh dim of the graph's mesh and its size. */
static gt_status check_group(gt_graph *g, const gt_node *n, int64_t *group_size, gt_error *err)
{
    int64_t dim = n->attrs.i[0], size = n->attrs.i[1];
    int limit = g->mesh.ndim > 0 ? g->mesh.ndim : GT_MESH_MAX_DIMS;
    if (dim < 0 || dim >= limit)
        return gt_shape_fail(g, n, err, GT_ERR_INVALID, "mesh_dim %lld out of range [0, %d)%s",
                             (long long)dim, limit,
                             g->mesh.ndim > 0 ? " (the graph's mesh dims)" : "");
    if (size < 1)
        return gt_shape_fail(g, n, err, GT_ERR_INVALID, "group_size must be >= 1, got %lld",
                             (long long)size);
    if (g->mesh.ndim > 0 && size != g->mesh.size[dim])
        return gt_shape_fail(
            g, n, err, GT_ERR_INVALID,
            "group_size %lld differs from the size %d of mesh dim %lld (%s)", (long long)size,
            g->mesh.size[dim], (long long)dim,
            gt_graph_str_valid(g, g->mesh.name[dim]) ? gt_graph_str(g, g->mesh.name[dim]) : "?");
    *group_size = size;
    return GT_OK;
}

static gt_status need_rank1(gt_graph *g, const gt_node *n, gt_error *err)
{
    const gt_type *x = gt_shape_in(g, n, 0);
    if (x->ndim >= 1) return GT_OK;
    char ts[160];
    return gt_shape_fail(g, n, err, GT_ERR_SHAPE,
                         "input 0 must have rank >= 1 (the collective runs along dim 0), got %s",
                         gt_type_str(g, x, ts, sizeof ts));
}

/* Input 0's dim 0 splits into group_size blocks (a symbolic one is trusted: parallelize only
 * splits dims it made divisible). */
static gt_status need_rows_divide(gt_graph *g, const gt_node *n, int64_t size, gt_error *err)
{
    const gt_type *x = gt_shape_in(g, n, 0);
    int64_t m;
    if (!gt_sym_is_const(g->sym, x->dims[0], &m) || m % size == 0) return GT_OK;
    char ts[160];
    return gt_shape_fail(g, n, err, GT_ERR_SHAPE,
                         "input 0 dim 0 (%lld) must divide by group_size %lld, got %s",
                         (long long)m, (long long)size, gt_type_str(g, x, ts, sizeof ts));
}

gt_status gt_shape_all_gather_start(gt_graph *g, const gt_node *n, gt_type *out, int *n_out,
                                    gt_error *err)
{
    int64_t size = 1;
    GT_TRY(check_group(g, n, &size, err));
    GT_TRY(need_rank1(g, n, err));
    out[0] = *gt_shape_in(g, n, 0);
    out[0].dims[0] = gt_sym_mul(g->sym, gt_sym_const(g->sym, size), out[0].dims[0]);
    *n_out = 1;
    return GT_OK;
}

gt_status gt_shape_reduce_scatter_start(gt_graph *g, const gt_node *n, gt_type *out, int *n_out,
                                        gt_error *err)
{
    int64_t size = 1;
    GT_TRY(check_group(g, n, &size, err));
    GT_TRY(need_rank1(g, n, err));
    GT_TRY(gt_shape_need_float(g, n, 0, err));
    const gt_type *x = gt_shape_in(g, n, 0);
    GT_TRY(need_rows_divide(g, n, size, err));
    gt_dtype dt = x->dtype;
    if (n->attrs.ni >= 3) {
        int64_t want = n->attrs.i[2];
        bool widen = want == GT_F32 && gt_dtype_widens_to_f32(x->dtype, GT_F32);
        if (want != (int64_t)x->dtype && !widen) {
            char ts[160], ds[32];
            if (want >= 0 && want < GT_DTYPE_COUNT)
                snprintf(ds, sizeof ds, "%s", gt_dtype_name((gt_dtype)want));
            else
                snprintf(ds, sizeof ds, "%lld (not a dtype)", (long long)want);
            return gt_shape_fail(g, n, err, GT_ERR_SHAPE,
                                 "output dtype %s for input %s: expected the input's dtype, or "
                                 "f32 for a bf16/f16 input (a widening reduce-scatter)",
                                 ds, gt_type_str(g, x, ts, sizeof ts));
        }
        dt = (gt_dtype)want;
    }
    out[0] = *x;
    out[0].dtype = dt;
    out[0].dims[0] = gt_sym_floordiv(g->sym, x->dims[0], gt_sym_const(g->sym, size));
    *n_out = 1;
    return GT_OK;
}

gt_status gt_shape_all_reduce_start(gt_graph *g, const gt_node *n, gt_type *out, int *n_out,
                                    gt_error *err)
{
    int64_t size;
    GT_TRY(check_group(g, n, &size, err));
    GT_TRY(gt_shape_need_float(g, n, 0, err));
    out[0] = *gt_shape_in(g, n, 0);
    *n_out = 1;
    return GT_OK;
}

gt_status gt_shape_all_to_all_start(gt_graph *g, const gt_node *n, gt_type *out, int *n_out,
                                    gt_error *err)
{
    int64_t size = 1;
    GT_TRY(check_group(g, n, &size, err));
    GT_TRY(need_rank1(g, n, err));
    GT_TRY(need_rows_divide(g, n, size, err));
    out[0] = *gt_shape_in(g, n, 0);
    *n_out = 1;
    return GT_OK;
}

/* The peer and tag of a point-to-point start: a rank of the group, and a tag the communicators
 * carry (gt_comm_send_start: 0 .. 32767). */
static gt_status check_p2p(gt_graph *g, const gt_node *n, gt_error *err)
{
    int64_t size = 0;
    GT_TRY(check_group(g, n, &size, err));
    int64_t peer = n->attrs.i[2], tag = n->attrs.i[3];
    if (peer < 0 || peer >= size)
        return gt_shape_fail(g, n, err, GT_ERR_INVALID, "peer %lld is no rank of a group of %lld",
                             (long long)peer, (long long)size);
    if (tag < 0 || tag >= 32768)
        return gt_shape_fail(g, n, err, GT_ERR_INVALID, "tag %lld out of range [0, 32768)",
                             (long long)tag);
    return GT_OK;
}

gt_status gt_shape_send_start(gt_graph *g, const gt_node *n, gt_type *out, int *n_out,
                              gt_error *err)
{
    GT_TRY(check_p2p(g, n, err));
    out[0] = *gt_shape_in(g, n, 0);
    *n_out = 1;
    return GT_OK;
}

gt_status gt_shape_recv_start(gt_graph *g, const gt_node *n, gt_type *out, int *n_out,
                              gt_error *err)
{
    GT_TRY(check_p2p(g, n, err));
    int64_t dt = n->attrs.i[4];
    if (dt < 0 || dt >= GT_DTYPE_COUNT)
        return gt_shape_fail(g, n, err, GT_ERR_INVALID, "dtype %lld is not a dtype", (long long)dt);
    if (n->attrs.ne > GT_MAX_DIMS)
        return gt_shape_fail(g, n, err, GT_ERR_INVALID, "%d dims, at most %d", n->attrs.ne,
                             GT_MAX_DIMS);
    out[0] = (gt_type){.dtype = (gt_dtype)dt, .ndim = n->attrs.ne};
    for (int k = 0; k < n->attrs.ne; k++)
        out[0].dims[k] = n->attrs.e[k];
    *n_out = 1;
    return GT_OK;
}

gt_status gt_shape_wait(gt_graph *g, const gt_node *n, gt_type *out, int *n_out, gt_error *err)
{
    gt_node_id p = g->values[n->in[0]].producer;
    if (p == GT_NONE || p < 0 || p >= g->n_nodes || !gt_op_is_collective_start(g->nodes[p].op))
        return gt_shape_fail(g, n, err, GT_ERR_INVALID,
                             "input 0 (%%%d) must be the output of a collective start "
                             "(all_gather_start, reduce_scatter_start, all_reduce_start, "
                             "all_to_all_start, send_start, recv_start)",
                             n->in[0]);
    if (g->nodes[p].op == GT_OP_RECV_START) {
        if (n->in[1] != n->in[0])
            return gt_shape_fail(g, n, err, GT_ERR_INVALID,
                                 "input 1 (%%%d) must be input 0 (%%%d): a recv_start reads "
                                 "nothing to keep alive",
                                 n->in[1], n->in[0]);
    } else if (g->nodes[p].in[0] != n->in[1])
        return gt_shape_fail(g, n, err, GT_ERR_INVALID,
                             "input 1 (%%%d) must be the input of its start (node %%%d reads %%%d)",
                             n->in[1], p, g->nodes[p].in[0]);
    out[0] = *gt_shape_in(g, n, 0);
    *n_out = 1;
    return GT_OK;
}
