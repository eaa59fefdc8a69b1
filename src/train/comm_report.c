/* comm_report.c — --metrics.comm_report: what each collective of one step cost and how much of
 * it the step waited for, on every rank. The timings come from the executor
 * (gt_program_comm_timings): total = start posted to completion, exposed = time blocked in the
 * wait. Every rank's figures are gathered to rank 0, which prints its own and, per collective, the
 * least and the most any rank waited: a collective that one rank waits for and the others do not
 * is that rank being ahead (the others' compute was slower), not the transfer. Expert parallel's
 * token exchange gets a line of its own: the bytes its all_to_alls moved against the valid rows'
 * bytes in them.
 *
 * Given the step graph, each line also names its collective's start node (module, phase and EP
 * chunk): the k-th collective the program ran is the
 * graph's k-th start node, since the program runs the nodes in graph order (checked by kind: no
 * names when they disagree). The expert-parallel token exchanges (all-to-alls,
 * GT_TAG_TOKEN_EXCHANGE) then get a total line of their own: their exposed time is what the EP
 * overlap schedule (compile.ep_overlap) is there to hide. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graphtrain/gt_parallel.h"
#include "graphtrain/gt_pass.h"
#include "train_internal.h"

/* The collective kind a start op runs. */
static int kind_of(gt_op op)
{
    switch (op) {
    case GT_OP_ALL_GATHER_START:
        return GT_COLL_ALL_GATHER;
    case GT_OP_REDUCE_SCATTER_START:
        return GT_COLL_REDUCE_SCATTER;
    case GT_OP_ALL_TO_ALL_START:
        return GT_COLL_ALL_TO_ALL;
    case GT_OP_ALL_REDUCE_START:
        return GT_COLL_ALL_REDUCE;
    default:
        return -1;
    }
}

/* The start node of each of the n collectives in graph g (NULL when g is NULL or its starts do
 * not match the timings' kinds one for one). */
static gt_node_id *starts_of(const gt_graph *g, const gt_comm_timing *t, int32_t n)
{
    if (!g) return NULL;
    gt_node_id *at = gt_xmalloc((size_t)(n ? n : 1) * sizeof *at);
    int32_t k = 0;
    for (gt_node_id id = 0; id < g->n_nodes; id++) {
        int kind = kind_of(g->nodes[id].op);
        if (kind < 0) continue;
        if (k == n || kind != (int)t[k].kind) k = n + 1;
        if (k > n) break;
        at[k++] = id;
    }
    if (k != n) {
        free(at);
        return NULL;
    }
    return at;
}

/* "  layers.1.moe.routed_experts.inner_experts bwd chunk 1": what start node id is, for its
 * report line. A backward node's chunk is its origin's (ep_overlap.c reads chunks alike). */
static void describe(const gt_graph *g, gt_node_id id, char *buf, size_t cap)
{
    const gt_node *nd = &g->nodes[id];
    const char *fqn = gt_graph_str(g, nd->fqn);
    int len = snprintf(buf, cap, "  %s %s", fqn && fqn[0] ? fqn : "-", gt_phase_name(nd->phase));
    for (const gt_node *n = nd; n && len >= 0 && (size_t)len < cap;
         n = n == nd && n->origin != GT_NONE ? &g->nodes[n->origin] : NULL) {
        int c = gt_node_has_tag(g, n, GT_CHUNK_TAG_0)   ? 0
                : gt_node_has_tag(g, n, GT_CHUNK_TAG_1) ? 1
                                                        : -1;
        if (c >= 0) {
            snprintf(buf + len, cap - (size_t)len, " chunk %d", c);
            break;
        }
    }
}

/* rank r's figures in the gathered array: per collective total and exposed (ns), then the step */
typedef struct {
    const int64_t *all;
    int32_t n;
} gathered;

static double ms_at(const gathered *g, int r, int64_t k)
{
    return 1e-6 * (double)g->all[(int64_t)r * (2 * g->n + 1) + k];
}

/* Expert parallel's token exchange (an all_to_all that parallelize tagged GT_TAG_TOKEN_EXCHANGE):
 * the bytes of its valid rows, averaged over the ranks, else 0. Every routed row of a rank crosses
 * each such all_to_all once (its fixed C-row blocks hold the rows, then zeros), so the valid rows
 * average the R rows of the layer's moe_pack input: the last moe_pack of the same module before
 * it (a chunked layer's chunks have equal rows). */
static uint64_t token_valid_bytes(const gt_program *p, const gt_comm_timing *t)
{
    if (!p || !p->g || t->kind != GT_COLL_ALL_TO_ALL || t->start_instr < 0 ||
        t->start_instr >= p->n_instrs)
        return 0;
    const gt_instr *s = &p->instrs[t->start_instr];
    const gt_node *n = &p->g->nodes[s->node];
    if (!gt_node_has_tag(p->g, n, GT_TAG_TOKEN_EXCHANGE) || s->in[0].shape[0] <= 0) return 0;
    for (int32_t j = t->start_instr - 1; j >= 0; j--) {
        const gt_instr *q = &p->instrs[j];
        if (q->op != GT_OP_MOE_PACK || p->g->nodes[q->node].fqn != n->fqn) continue;
        return t->bytes / (uint64_t)s->in[0].shape[0] * (uint64_t)q->in[0].shape[0];
    }
    return 0;
}

static void print_report(const gt_program *prog, const gt_comm_timing *t, const gathered *g,
                         int size, const gt_graph *graph, FILE *f)
{
    uint64_t moved = 0, valid = 0;
    int exchanges = 0;
    int32_t n = g->n;
    double total = 0, exposed = 0;
    uint64_t bytes[GT_COLL_KIND_COUNT] = {0};
    int count[GT_COLL_KIND_COUNT] = {0};
    double kind_ms[GT_COLL_KIND_COUNT][2] = {{0}}; /* total, exposed */
    double token_ms[2] = {0, 0};
    int tokens = 0;
    gt_node_id *start = starts_of(graph, t, n);
    fprintf(f, "collective report (rank 0, one step): %d collectives\n", (int)n);
    fprintf(f, "  %4s %-15s %-13s %12s %11s %11s %8s  %s\n", "#", "kind", "mesh dim", "bytes",
            "total ms", "exposed ms", "exposed", "exposed over ranks: least-most ms, rank of most");
    for (int32_t k = 0; k < n; k++) {
        const gt_comm_timing *c = &t[k];
        /* rank 0's own columns from the gathered nanoseconds too, so that its exposed time is
         * printed from the very value the least and the most are taken over (two roundings of
         * one time can print 0.001 apart) */
        double tot = ms_at(g, 0, 2 * k), ex = ms_at(g, 0, 2 * k + 1);
        double lo = ex, hi = ex;
        int at = 0;
        for (int r = 1; r < size; r++) {
            double e = ms_at(g, r, 2 * k + 1);
            lo = e < lo ? e : lo;
            if (e > hi) hi = e, at = r;
        }
        char what[192] = "";
        if (start) describe(graph, start[k], what, sizeof what);
        fprintf(f, "  %4d %-15s %-13s %12llu %11.3f %11.3f %7.1f%%  %.3f-%.3f r%d%s\n", (int)k,
                gt_coll_kind_name(c->kind), gt_mesh_dim_name(c->mesh_dim),
                (unsigned long long)c->bytes, tot, ex, tot > 0 ? 100.0 * ex / tot : 0.0, lo, hi, at,
                what);
        total += tot;
        exposed += ex;
        if ((int)c->kind >= 0 && c->kind < GT_COLL_KIND_COUNT) {
            bytes[c->kind] += c->bytes;
            count[c->kind]++;
            kind_ms[c->kind][0] += tot;
            kind_ms[c->kind][1] += ex;
        }
        uint64_t v = token_valid_bytes(prog, c);
        if (v) exchanges++, moved += c->bytes, valid += v;
        if (start && gt_node_has_tag(graph, &graph->nodes[start[k]], GT_TAG_TOKEN_EXCHANGE)) {
            tokens++;
            token_ms[0] += tot;
            token_ms[1] += ex;
        }
    }
    for (int k = 0; k < GT_COLL_KIND_COUNT; k++)
        if (count[k])
            fprintf(f, "  total %-15s %4d collectives %14llu bytes %11.3f ms, exposed %.3f ms\n",
                    gt_coll_kind_name((gt_coll_kind)k), count[k], (unsigned long long)bytes[k],
                    kind_ms[k][0], kind_ms[k][1]);
    if (tokens)
        fprintf(f,
                "  token exchanges (expert parallelism's all-to-alls): %d, %.3f ms, exposed "
                "%.3f ms\n",
                tokens, token_ms[0], token_ms[1]);
    if (exchanges)
        fprintf(f,
                "  token exchange %d all_to_all: %llu bytes moved, %llu valid on average over "
                "the ranks (%.1f%%; the rest pads each rank pair's block to its capacity)\n",
                exchanges, (unsigned long long)moved, (unsigned long long)valid,
                100.0 * (double)valid / (double)moved);
    free(start);
    for (int r = 1; r < size; r++) {
        double e = 0;
        for (int32_t k = 0; k < n; k++)
            e += ms_at(g, r, 2 * k + 1);
        fprintf(f, "  rank %d: exposed %.3f ms", r, e);
        double step = ms_at(g, r, 2 * n);
        if (step > 0) fprintf(f, " of its %.3f ms step", step);
        fprintf(f, "\n");
    }
    double step = ms_at(g, 0, 2 * n);
    fprintf(f, "  communication %.3f ms (sum of start-to-completion times), exposed %.3f ms", total,
            exposed);
    if (step > 0) fprintf(f, " = %.1f%% of the %.3f ms step", 100.0 * exposed / step, step);
    fprintf(f, "\n");
}

gt_status gt_train_comm_report(gt_train_dist *d, const gt_program *prog, const gt_comm_timing *t,
                               int32_t n, double step_s, const gt_graph *g, FILE *f, gt_error *err)
{
    int size = gt_train_dist_multi(d) ? d->size : 1;
    int64_t per = 2 * (int64_t)n + 1, total = per * size;
    int64_t *mine = gt_xcalloc((size_t)per, sizeof *mine);
    int64_t *all = gt_xcalloc((size_t)total, sizeof *all);
    for (int32_t k = 0; k < n; k++) {
        mine[2 * k] = llround(1e9 * t[k].total_s);
        mine[2 * k + 1] = llround(1e9 * t[k].exposed_s);
    }
    mine[2 * n] = llround(1e9 * step_s);
    gt_status st = GT_OK;
    if (size > 1) {
        gt_tensor in, out;
        gt_tensor_wrap(&in, GT_I64, 1, &per, mine);
        gt_tensor_wrap(&out, GT_I64, 1, &total, all);
        st = gt_comm_all_gather(d->world, &in, &out, err);
    } else {
        memcpy(all, mine, (size_t)per * sizeof *mine);
    }
    if (st == GT_OK && d->rank == 0) print_report(prog, t, &(gathered){all, n}, size, g, f);
    free(mine);
    free(all);
    return st;
}
