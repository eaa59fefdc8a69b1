/* cost.c — AutoParallel's cost model of one SPMD graph (gt_autoparallel.h states the formulas):
 * roofline compute per node, alpha-beta collectives per mesh dim, per-rank memory; and the device
 * constants (defaults per kind, or a measured profile file). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "graphtrain/gt_flops.h"
#include "parallel/autoparallel/autopar_internal.h"

gt_status gt_autopar_device_default(const char *kind, gt_autopar_device *d, gt_error *err)
{
    memset(d, 0, sizeof *d);
    d->efficiency = 0.7;
    d->prefetch_discount = 0.5;
    if (!strcmp(kind, "h100")) {
        /* H100 SXM: 989 TFLOP/s dense bf16, 3.35 TB/s HBM3; NVLink 4 450 GB/s per direction
         * (NCCL reaches about that on 8 GPUs of a host), about 8 us per ring hop */
        d->name = "h100";
        d->peak_flops = 989e12;
        d->mem_bw = 3.35e12;
        d->node_floor_s = 7e-6;
        for (int md = 0; md < GT_MESH_NDIMS; md++) {
            d->alpha[md] = 8e-6;
            d->beta[md] = 450e9;
        }
        return GT_OK;
    }
    if (!strcmp(kind, "cpu")) {
        /* one host: OpenBLAS on a few cores, MPI over shared memory */
        d->name = "cpu";
        d->peak_flops = 100e9;
        d->mem_bw = 20e9;
        d->node_floor_s = 2e-6;
        for (int md = 0; md < GT_MESH_NDIMS; md++) {
            d->alpha[md] = 5e-6;
            d->beta[md] = 5e9;
        }
        return GT_OK;
    }
    return gt_error_set(err, GT_ERR_INVALID, "autoparallel: unknown device kind '%s' (h100, cpu)",
                        kind);
}

gt_status gt_autopar_device_load(const char *path, gt_autopar_device *d, gt_error *err)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return gt_error_set(err, GT_ERR_IO, "autoparallel: comm profile %s: %s", path,
                            strerror(errno));
    char line[512];
    int lineno = 0;
    gt_status st = GT_OK;
    while (st == GT_OK && fgets(line, sizeof line, f)) {
        lineno++;
        char *hash = strchr(line, '#');
        if (hash) *hash = '\0';
        char dim[64];
        double a, b;
        int n = sscanf(line, "%63s %lf %lf", dim, &a, &b);
        if (n <= 0) continue;
        int md = -1;
        for (int k = 0; k < GT_MESH_NDIMS; k++)
            if (n == 3 && !strcmp(dim, gt_mesh_dim_name(k))) md = k;
        if (md < 0 || !(a >= 0) || !(b > 0))
            st = gt_error_set(err, GT_ERR_FORMAT,
                              "autoparallel: comm profile %s line %d: expected `MESH_DIM "
                              "ALPHA_S BETA_BYTES_PER_S` (mesh dim dp_replicate, dp_shard or tp, "
                              "alpha >= 0, beta > 0)",
                              path, lineno);
        else
            d->alpha[md] = a, d->beta[md] = b;
    }
    fclose(f);
    return st;
}

gt_status gt_ap_value_bytes(const gt_graph *g, gt_value_id v, const gt_sym_binding *b, double *out,
                            gt_error *err)
{
    const gt_type *t = gt_value_type(g, v);
    double n = (double)gt_dtype_size(t->dtype);
    for (int d = 0; d < t->ndim; d++) {
        int64_t x;
        GT_TRY(gt_sym_eval(g->sym, t->dims[d], b, &x, err));
        n *= (double)x;
    }
    *out = n;
    return GT_OK;
}

int gt_ap_comm_kind(gt_op op)
{
    switch (op) {
    case GT_OP_ALL_GATHER_START:
        return 0;
    case GT_OP_REDUCE_SCATTER_START:
        return 1;
    case GT_OP_ALL_REDUCE_START:
        return 2;
    case GT_OP_ALL_TO_ALL_START:
        return 3;
    default:
        return -1;
    }
}

double gt_ap_collective_s(const gt_autopar_device *d, int md, int ranks, double full_b, int kind)
{
    if (ranks <= 1) return 0;
    double frac = (double)(ranks - 1) / ranks;
    double t = d->alpha[md] * (ranks - 1) + frac * full_b / d->beta[md];
    return kind == 2 ? 2 * t : t;
}

gt_status gt_ap_node_s(const gt_graph *g, gt_node_id i, const gt_sym_binding *b,
                       const gt_autopar_device *d, double *t, gt_error *err)
{
    const gt_node *n = &g->nodes[i];
    *t = 0;
    if (gt_op_get(n->op)->flags & (GT_OPF_VIEW | GT_OPF_COLLECTIVE)) return GT_OK;
    double eff = d->efficiency > 0 ? d->efficiency : 1.0;
    double flops = 0, bytes = 0, x, out_elems = 0;
    GT_TRY(gt_node_model_flops(g, i, b, &flops, err));
    for (int k = 0; k < n->n_in; k++) {
        GT_TRY(gt_ap_value_bytes(g, n->in[k], b, &x, err));
        bytes += x;
    }
    for (int k = 0; k < n->n_out; k++) {
        GT_TRY(gt_ap_value_bytes(g, n->out[k], b, &x, err));
        bytes += x;
        out_elems += x / (double)gt_dtype_size(gt_value_type(g, n->out[k])->dtype);
    }
    if (flops == 0) flops = out_elems;
    double tc = flops / (eff * d->peak_flops), tm = bytes / (eff * d->mem_bw);
    *t = (tc > tm ? tc : tm) + d->node_floor_s;
    return GT_OK;
}

gt_status gt_autopar_cost_graph(const gt_graph *g, const gt_sym_binding *b,
                                const gt_autopar_device *d, gt_autopar_cost *out, gt_error *err)
{
    memset(out, 0, sizeof *out);
    /* the forward values a backward node reads: what the step keeps between the two */
    uint8_t *saved = gt_xcalloc((size_t)g->n_values + 1, 1);
    gt_status st = GT_OK;
    for (int32_t i = 0; st == GT_OK && i < g->n_nodes; i++) {
        const gt_node *n = &g->nodes[i];
        const gt_op_info *info = gt_op_get(n->op);
        if (n->phase == GT_PHASE_BACKWARD)
            for (int k = 0; k < n->n_in; k++) {
                gt_node_id p = g->values[n->in[k]].producer;
                if (p != GT_NONE && g->nodes[p].phase == GT_PHASE_FORWARD) saved[n->in[k]] = 1;
            }
        int ck = gt_ap_comm_kind(n->op);
        if (ck >= 0) {
            /* B: the full (gathered / unreduced) tensor, n the group */
            int md = n->attrs.i[0], ranks = (int)n->attrs.i[1];
            double in_b, out_b;
            st = gt_ap_value_bytes(g, n->in[0], b, &in_b, err);
            if (st == GT_OK) st = gt_ap_value_bytes(g, n->out[0], b, &out_b, err);
            if (st != GT_OK || md < 0 || md >= GT_MESH_NDIMS || ranks <= 1) continue;
            double t = gt_ap_collective_s(d, md, ranks, in_b > out_b ? in_b : out_b, ck);
            if (ck == 0 && gt_node_has_tag(g, n, "fsdp.all_gather")) t *= d->prefetch_discount;
            out->comm_s[md] += t;
            out->comm_kind_s[ck] += t;
            continue;
        }
        if (info->flags & (GT_OPF_VIEW | GT_OPF_COLLECTIVE)) continue;
        double t = 0;
        if ((st = gt_ap_node_s(g, i, b, d, &t, err)) != GT_OK) break;
        out->compute_s += t;
    }
    for (int32_t k = 0; st == GT_OK && k < g->n_inputs; k++) {
        double x;
        st = gt_ap_value_bytes(g, g->inputs[k].value, b, &x, err);
        if (g->inputs[k].kind == GT_IN_PARAM) out->params_b += x;
        if (g->inputs[k].kind == GT_IN_OPT_STATE) out->opt_b += x;
    }
    for (int32_t k = 0; st == GT_OK && k < g->n_outputs; k++) {
        double x;
        if (g->outputs[k].kind != GT_OUT_GRAD) continue;
        if ((st = gt_ap_value_bytes(g, g->outputs[k].value, b, &x, err)) == GT_OK)
            out->grads_b += x;
    }
    for (int32_t v = 0; st == GT_OK && v < g->n_values; v++) {
        double x;
        if (saved[v] && (st = gt_ap_value_bytes(g, v, b, &x, err)) == GT_OK) out->act_b += x;
    }
    free(saved);
    out->total_s = out->compute_s;
    for (int md = 0; md < GT_MESH_NDIMS; md++)
        out->total_s += out->comm_s[md];
    out->memory_b = out->params_b + out->grads_b + out->opt_b + out->act_b;
    return st;
}
