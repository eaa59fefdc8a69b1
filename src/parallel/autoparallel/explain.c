/* explain.c — what `graphtrain graph --compile.enable_autoparallel` prints: the chosen placement
 * of every parameter class, the placements of the activations (block 0's and the rest's forward
 * values, one line per producing module and op), the cost breakdown, and how far each hand plan
 * is on the same cost model. */
#include <string.h>

#include "parallel/autoparallel/autopar_internal.h"

int gt_autopar_format_placement(gt_placement p, char *buf, size_t len)
{
    switch ((gt_place_kind)p.kind) {
    case GT_PLACE_SHARD:
        return snprintf(buf, len, "S(%d)%s", p.dim, p.padded ? "p" : "");
    case GT_PLACE_PARTIAL:
        return snprintf(buf, len, "P");
    default:
        return snprintf(buf, len, "R");
    }
}

/* "dp_shard S(0) tp S(1)" over the mesh dims of size > 1 */
static void format_layout(const gt_mesh *m, const gt_placement *s, char *buf, size_t len)
{
    size_t at = 0;
    buf[0] = '\0';
    for (int md = 0; md < GT_MESH_NDIMS && at < len; md++) {
        if (m->size[md] == 1) continue;
        char p[24];
        gt_autopar_format_placement(s[md], p, sizeof p);
        at +=
            (size_t)snprintf(buf + at, len - at, "%s%s %s", at ? " " : "", gt_mesh_dim_name(md), p);
    }
}

static void print_cost(FILE *f, const char *what, const gt_autopar_cost *c,
                       const gt_autopar_cost *ref)
{
    fprintf(f, "  %-10s total %10.3f ms  compute %10.3f ms  comm", what, 1e3 * c->total_s,
            1e3 * c->compute_s);
    static const char *kinds[4] = {"all_gather", "reduce_scatter", "all_reduce", "all_to_all"};
    for (int k = 0; k < 4; k++)
        if (c->comm_kind_s[k] > 0) fprintf(f, " %s %.3f ms", kinds[k], 1e3 * c->comm_kind_s[k]);
    fprintf(f, "  memory %.3f GiB (params %.3f, grads %.3f, optimizer %.3f, activations %.3f)",
            c->memory_b / 1073741824.0, c->params_b / 1073741824.0, c->grads_b / 1073741824.0,
            c->opt_b / 1073741824.0, c->act_b / 1073741824.0);
    if (ref && ref->total_s > 0)
        fprintf(f, "  %+.2f%% vs chosen", 100.0 * (c->total_s - ref->total_s) / ref->total_s);
    fprintf(f, "\n");
}

void gt_autopar_print(const gt_autopar_result *r, const gt_graph *spmd, FILE *f)
{
    char mesh[96];
    gt_mesh_format(&r->mesh, mesh, sizeof mesh);
    fprintf(f,
            "\n# autoparallel: mesh %s, %d parameter classes, %d probes (%.3f s), ILP %d columns "
            "x %d rows (CBC %.3f s); layout from %s\n",
            mesh, r->n_classes, r->n_probes, r->probe_s, r->n_columns, r->n_rows, r->ilp_s,
            !strcmp(r->picked, "ilp") ? "the ILP" : r->picked);
    fprintf(f, "parameters (class x members: chosen | fsdp | fsdp_tp)\n");
    for (int c = 0; c < r->n_classes; c++) {
        const gt_autopar_class *k = &r->classes[c];
        char ch[96] = "-", a[96] = "-", b[96] = "-";
        if (k->chosen >= 0) format_layout(&r->mesh, k->strategies[k->chosen], ch, sizeof ch);
        if (k->hand_fsdp >= 0) format_layout(&r->mesh, k->strategies[k->hand_fsdp], a, sizeof a);
        if (k->hand_fsdp_tp >= 0)
            format_layout(&r->mesh, k->strategies[k->hand_fsdp_tp], b, sizeof b);
        int feasible = 0;
        for (int s = 0; s < k->n_strategies; s++)
            feasible += k->feasible[s];
        fprintf(f, "  %-40s x%-3d %-28s | %-24s | %s  (%d of %d strategies feasible)\n", k->name,
                k->n_members, ch, a, r->has_fsdp_tp ? b : "-", feasible, k->n_strategies);
    }
    if (r->sp_other_total_s >= 0)
        fprintf(f, "activations between tp regions: %s (chosen, %.3f ms; %s: %.3f ms)\n",
                r->sequence_parallel ? "sharded by sequence (sequence parallel)"
                                     : "replicated over tp",
                1e3 * r->cost.total_s, r->sequence_parallel ? "replicated" : "sequence parallel",
                1e3 * r->sp_other_total_s);
    if (spmd) {
        /* activation classes: forward values of block 0 and of the modules outside the blocks,
         * one line per (module, op) */
        fprintf(f, "activations (forward outputs of block 0 and the rest: module op: placement)\n");
        gt_str last_fqn = -1;
        gt_op last_op = (gt_op)-1;
        for (int32_t i = 0; i < spmd->n_nodes; i++) {
            const gt_node *n = &spmd->nodes[i];
            const gt_op_info *info = gt_op_get(n->op);
            if (n->phase != GT_PHASE_FORWARD || (n->unit > 0) ||
                (info->flags & (GT_OPF_VIEW | GT_OPF_COLLECTIVE | GT_OPF_SOURCE)) ||
                n->op == GT_OP_WAIT || n->op == GT_OP_CAST)
                continue;
            if (n->fqn == last_fqn && n->op == last_op) continue;
            last_fqn = n->fqn, last_op = n->op;
            char pl[96];
            format_layout(&r->mesh, spmd->values[n->out[0]].place, pl, sizeof pl);
            const char *fqn = gt_graph_str(spmd, n->fqn);
            fprintf(f, "  %-40s %-24s %s\n", fqn[0] ? fqn : "(step)", info->name, pl);
        }
    }
    fprintf(f, "cost per rank and step (model: roofline compute, alpha-beta collectives)\n");
    print_cost(f, "chosen", &r->cost, NULL);
    fprintf(f, "  %-10s total %10.3f ms  (the ILP's own estimate of its layout)\n", "ilp model",
            1e3 * r->ilp_objective_s);
    print_cost(f, "fsdp", &r->fsdp, &r->cost);
    if (r->has_fsdp_tp) print_cost(f, "fsdp_tp", &r->fsdp_tp, &r->cost);
}
