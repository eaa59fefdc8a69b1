/* collective_report.c — the collectives of a graph and what compute each one overlaps, plus the
 * facts about collectives that the FSDP passes share (which wait belongs to which start, FSDP
 * tags).
 *
 * A collective is a start node and its wait. Between them (in node order, which is the order the
 * program runs) the rank computes while the transfer is in flight; the report counts those nodes
 * and their matmul/attention FLOPs, with the conventions of gt_flops.h:
 *   matmul         2·M·N·K per batch element (out [..., M, N], K the contracted dim of a);
 *   sdpa           4·b·hq·s·t·d;   sdpa_backward 8·b·hq·s·t·d.
 * A collective with no node in between overlaps nothing: its transfer is fully exposed. */
#include <stdlib.h>
#include <string.h>

#include "graphtrain/gt_flops.h"
#include "passes/pass_internal.h"

const char *const gt_pass_fsdp_tags[3] = {GT_FSDP_TAG_ALL_GATHER, GT_FSDP_TAG_REDUCE_SCATTER,
                                          GT_FSDP_TAG_ALL_REDUCE};

gt_node_id *gt_pass_find_waits(const gt_graph *g)
{
    gt_node_id *wait_of = gt_xmalloc(((size_t)g->n_nodes + 1) * sizeof *wait_of);
    uint8_t *many = gt_xcalloc((size_t)g->n_nodes + 1, 1);
    for (gt_node_id n = 0; n < g->n_nodes; n++)
        wait_of[n] = GT_NONE;
    for (gt_node_id n = 0; n < g->n_nodes; n++) {
        const gt_node *nd = &g->nodes[n];
        if (nd->op != GT_OP_WAIT || nd->n_in < 1) continue;
        gt_node_id s = g->values[nd->in[0]].producer;
        if (s == GT_NONE || !gt_op_is_collective_start(g->nodes[s].op)) continue;
        if (wait_of[s] != GT_NONE) many[s] = 1;
        wait_of[s] = n;
    }
    for (gt_node_id n = 0; n < g->n_nodes; n++)
        if (many[n]) wait_of[n] = GT_NONE;
    free(many);
    return wait_of;
}

int gt_pass_fsdp_tag(const gt_graph *g, const gt_node *n)
{
    for (int k = 0; k < 3; k++)
        if (gt_node_has_tag(g, n, gt_pass_fsdp_tags[k])) return k;
    return -1;
}

bool gt_pass_is_bucketed(const gt_graph *g, const gt_node *n)
{
    size_t len = strlen(GT_FSDP_BUCKET_TAG_PREFIX);
    for (int k = 0; k < n->n_tags; k++)
        if (strncmp(gt_graph_str(g, n->tags[k]), GT_FSDP_BUCKET_TAG_PREFIX, len) == 0) return true;
    return false;
}

/* ---------------------------------------------------------------- sizes and FLOPs */

/* Concrete shape of v (under b when given, else only when every dim is constant). */
static bool concrete_shape(const gt_graph *g, gt_value_id v, const gt_sym_binding *b,
                           int64_t *shape)
{
    const gt_type *t = gt_value_type(g, v);
    if (b) {
        gt_error scratch = {0};
        return gt_graph_eval_shape(g, v, b, shape, &scratch) == GT_OK;
    }
    for (int d = 0; d < t->ndim; d++)
        if (!gt_sym_is_const(g->sym, t->dims[d], &shape[d])) return false;
    return true;
}

static int64_t value_bytes(const gt_graph *g, gt_value_id v, const gt_sym_binding *b)
{
    int64_t shape[GT_MAX_DIMS];
    if (!concrete_shape(g, v, b, shape)) return -1;
    const gt_type *t = gt_value_type(g, v);
    return gt_shape_numel(t->ndim, shape) * (int64_t)gt_dtype_size(t->dtype);
}

/* Matmul and attention FLOPs of one node (0 for every other op); -1 when a shape is unknown
 * (without a binding, any symbolic dim). */
static double node_model_flops(const gt_graph *g, gt_node_id n, const gt_sym_binding *b)
{
    double f = 0;
    gt_error scratch = {0};
    return gt_node_model_flops(g, n, b, &f, &scratch) == GT_OK ? f : -1;
}

int32_t gt_pass_collectives(const gt_graph *g, const gt_sym_binding *b, gt_collective_info *out,
                            int32_t max)
{
    gt_node_id *wait_of = gt_pass_find_waits(g);
    /* Prefix sums over the node order: non-collective nodes and model FLOPs before position k
     * (a FLOP count of -1 poisons every range that contains it). */
    int32_t *nodes_before = gt_xmalloc(((size_t)g->n_nodes + 1) * sizeof *nodes_before);
    double *flops_before = gt_xmalloc(((size_t)g->n_nodes + 1) * sizeof *flops_before);
    int32_t *unknown_before = gt_xmalloc(((size_t)g->n_nodes + 1) * sizeof *unknown_before);
    nodes_before[0] = 0, flops_before[0] = 0, unknown_before[0] = 0;
    for (gt_node_id n = 0; n < g->n_nodes; n++) {
        const gt_op_info *info = gt_op_get(g->nodes[n].op);
        bool coll = info && (info->flags & GT_OPF_COLLECTIVE);
        double f = coll ? 0 : node_model_flops(g, n, b);
        nodes_before[n + 1] = nodes_before[n] + !coll;
        flops_before[n + 1] = flops_before[n] + (f > 0 ? f : 0);
        unknown_before[n + 1] = unknown_before[n] + (f < 0);
    }
    int32_t count = 0;
    for (gt_node_id s = 0; s < g->n_nodes; s++) {
        const gt_node *nd = &g->nodes[s];
        if (!gt_op_is_collective_start(nd->op)) continue;
        if (count < max) {
            gt_collective_info *c = &out[count];
            memset(c, 0, sizeof *c);
            c->start = s;
            c->wait = wait_of[s];
            c->op = nd->op;
            c->mesh_dim = (int)nd->attrs.i[0];
            int64_t o = value_bytes(g, nd->out[0], b);
            int64_t in = nd->n_in ? value_bytes(g, nd->in[0], b) : o; /* recv_start: none */
            c->bytes = (in < 0 || o < 0) ? -1 : (in > o ? in : o);
            if (c->wait != GT_NONE) {
                c->overlap_nodes = nodes_before[c->wait] - nodes_before[s + 1];
                bool unknown = unknown_before[c->wait] - unknown_before[s + 1] > 0;
                c->overlap_flops = unknown ? -1 : flops_before[c->wait] - flops_before[s + 1];
            }
        }
        count++;
    }
    free(unknown_before);
    free(flops_before);
    free(nodes_before);
    free(wait_of);
    return count;
}

/* ---------------------------------------------------------------- the report */

/* The report's kinds, in its order, and their names. */
static const gt_op report_kinds[4] = {GT_OP_ALL_GATHER_START, GT_OP_REDUCE_SCATTER_START,
                                      GT_OP_ALL_REDUCE_START, GT_OP_ALL_TO_ALL_START};
static const char *const report_names[4] = {"all_gather", "reduce_scatter", "all_reduce",
                                            "all_to_all"};

static int kind_index(gt_op op)
{
    for (int k = 0; k < 4; k++)
        if (report_kinds[k] == op) return k;
    return 2; /* only starts are reported: not reached */
}

static const char *mesh_dim_name(const gt_graph *g, int dim, char *buf, size_t len)
{
    if (dim >= 0 && dim < g->mesh.ndim) return gt_graph_str(g, g->mesh.name[dim]);
    snprintf(buf, len, "dim%d", dim);
    return buf;
}

/* "12.50 MiB (13107200 B)" or "?" */
static const char *format_bytes(int64_t bytes, char *buf, size_t len)
{
    if (bytes < 0) {
        snprintf(buf, len, "?");
        return buf;
    }
    snprintf(buf, len, "%.2f MiB (%lld B)", (double)bytes / (1024.0 * 1024.0), (long long)bytes);
    return buf;
}

void gt_pass_collective_report(const gt_graph *g, const gt_sym_binding *b, FILE *f)
{
    /* a graph has no more collective starts than nodes: one walk fills them all */
    gt_collective_info *c = gt_xmalloc(((size_t)g->n_nodes + 1) * sizeof *c);
    int32_t n = gt_pass_collectives(g, b, c, g->n_nodes);
    fprintf(f,
            "collectives: %d (start -> wait node positions; overlap = nodes and matmul/sdpa "
            "FLOPs in between)\n",
            n);
    int64_t bytes[4] = {0, 0, 0, 0};
    int32_t count[4] = {0, 0, 0, 0}, unknown_bytes = 0, exposed = 0;
    for (int32_t k = 0; k < n; k++) {
        const gt_node *nd = &g->nodes[c[k].start];
        char dim[32], by[64], wait[16], flops[32];
        if (c[k].wait == GT_NONE)
            snprintf(wait, sizeof wait, "none");
        else
            snprintf(wait, sizeof wait, "%d", c[k].wait);
        if (c[k].overlap_flops < 0)
            snprintf(flops, sizeof flops, "?");
        else
            snprintf(flops, sizeof flops, "%.3g", c[k].overlap_flops);
        fprintf(f, "%6d -> %-6s %-14s %-12s %-26s overlap %5d nodes %10s FLOP  # %s %s\n",
                c[k].start, wait, report_names[kind_index(c[k].op)],
                mesh_dim_name(g, c[k].mesh_dim, dim, sizeof dim),
                format_bytes(c[k].bytes, by, sizeof by), c[k].overlap_nodes, flops,
                gt_graph_str(g, nd->fqn), gt_phase_name((gt_phase)nd->phase));
        int kind = kind_index(c[k].op);
        count[kind]++;
        if (c[k].bytes >= 0)
            bytes[kind] += c[k].bytes;
        else
            unknown_bytes++;
        exposed += c[k].overlap_nodes == 0;
    }
    for (int kind = 0; kind < 4; kind++) {
        if (!count[kind]) continue;
        char by[64];
        fprintf(f, "total %-14s %5d collectives %s\n", report_names[kind], count[kind],
                format_bytes(bytes[kind], by, sizeof by));
    }
    if (unknown_bytes)
        fprintf(f, "(%d collectives of unknown size left out of the bytes)\n", unknown_bytes);
    fprintf(f, "zero overlap: %d of %d collectives (%.1f%%)\n", exposed, n,
            n ? 100.0 * exposed / n : 0.0);
    free(c);
}
