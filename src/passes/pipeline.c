/* pipeline.c — the pass registry and the pipeline that runs it (DESIGN.md §4).
 *
 * The registry is one constant table in pipeline order. The order matters:
 *   canonicalize  first, so that reshape chains and identity views collapse to the forms CSE can
 *                 match (two flattenings of one value through different view chains);
 *   cse           then merges identical nodes, leaving the duplicates dead;
 *   memory_policy tags the forward nodes the backward recomputes (after CSE, so that merged
 *                 nodes are judged once);
 *   remat         duplicates the tagged chains into the backward (after CSE, which would merge
 *                 the copies back into the originals, and before DCE, which then drops the
 *                 originals nothing in the forward reads);
 *   dce           then removes the duplicates and whatever the others made dead, and compacts
 *                 ids;
 *   fusion        then fuses elementwise chains into fused_elementwise nodes: after remat, so
 *                 that recomputed chains fuse with the backward ops that read them (and remat's
 *                 copies are never hidden inside a fused node it would have to copy), after dce,
 *                 so that use counts are those of live readers only; before the FSDP passes,
 *                 which then place whole fused nodes (it never moves work across a collective);
 *   fsdp_bucketing after those (parallelized graphs only): it merges the FSDP collectives of each
 *                 block, so it must see the final set of gathers (remat never copies one, DCE
 *                 may drop some) and leaves no dead nodes behind;
 *   reduce_scatter_narrow  after bucketing (it rewrites a bucket's whole concat tree over the
 *                 gradients' casts, or a lone gradient's when bucketing is off) and before the
 *                 reorder, which then places the widening reduce-scatters like any other;
 *   fsdp_reorder  it only moves nodes, placing the (bucketed) starts and waits for overlap;
 *   ep_overlap    last: it only moves nodes inside each chunked block (ep_chunk.c's chunks),
 *                 interleaving the two chunks around their collectives.
 * Under a pipeline (issue 39) the table is cut in two by gt_pass_info.whole_step: the passes up to
 * dce see the forward and the backward together (recomputation copies a stage's forward into its
 * backward, CSE and DCE must see every reader of a value, and remat must run before the copies
 * are split off from their originals), so they run once on the whole step before the stage
 * split (GT_PASS_SCOPE_WHOLE); fusion and the FSDP and EP passes are local to the nodes they
 * rewrite and run on each stage part (GT_PASS_SCOPE_PART): fusion on the whole step could fuse
 * nodes of two parts or stages into one.
 * The pipeline drops the passes the options disable (and, on a graph without a mesh, the
 * mesh-only ones), verifies the graph before the first pass and after each one (verify_each),
 * times each pass, logs one line per pass and writes the debug dumps; for a parallelized graph the
 * dumps end with collectives.txt (gt_pass_collective_report of the final graph under
 * options->binding). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "passes/pass_internal.h"

static const gt_pass_info gt_passes[] = {
    {"canonicalize", gt_pass_canonicalize, GT_PASS_EXACT,
     "fold identity reshape/slice/cast/transpose/permute, compose view chains", false, true},
    {"cse", gt_pass_cse, GT_PASS_EXACT, "merge identical pure nodes", false, true},
    {"memory_policy", gt_pass_memory_policy, GT_PASS_EXACT,
     "tag forward nodes to recompute per compile.memory_policy", false, true},
    {"remat", gt_pass_remat, GT_PASS_EXACT,
     "recompute tagged forward chains right before their first backward use", false, true},
    {"dce", gt_pass_dce, GT_PASS_EXACT, "remove nodes that reach no output; compact ids", false,
     true},
    {"fusion", gt_pass_fusion, GT_PASS_EXACT,
     "fuse chains and trees of elementwise ops into one fused_elementwise kernel each", false,
     false},
    {"fsdp_bucketing", gt_pass_fsdp_bucketing, GT_PASS_EXACT,
     "merge the FSDP collectives of each block into one", true, false},
    {"reduce_scatter_narrow", gt_pass_reduce_scatter_narrow, GT_PASS_EXACT,
     "reduce-scatter bf16/f16 gradients into f32 instead of casting them to f32 first", true,
     false},
    {"fsdp_reorder", gt_pass_fsdp_reorder, GT_PASS_EXACT,
     "prefetch FSDP all-gathers one block ahead, start reduce-scatters early, defer waits", true,
     false},
    {"ep_overlap", gt_pass_ep_overlap, GT_PASS_EXACT,
     "interleave each chunked MoE block's two chunks: one's all-to-all over the other's compute",
     true, false},
};
#define GT_N_PASSES ((int)(sizeof gt_passes / sizeof gt_passes[0]))

const gt_pass_info *gt_pass_registry(int *n)
{
    *n = GT_N_PASSES;
    return gt_passes;
}

const gt_pass_info *gt_pass_find(const char *name)
{
    for (int k = 0; name && k < GT_N_PASSES; k++)
        if (strcmp(gt_passes[k].name, name) == 0) return &gt_passes[k];
    return NULL;
}

static void known_passes(char *buf, size_t cap)
{
    size_t len = 0;
    buf[0] = 0;
    for (int k = 0; k < GT_N_PASSES && len < cap; k++) {
        int w = snprintf(buf + len, cap - len, "%s%s", k ? ", " : "", gt_passes[k].name);
        if (w < 0) break;
        len += (size_t)w;
    }
}

bool gt_pass_enabled(const gt_pass_options *o, const char *name)
{
    for (int j = 0; o && o->disable && j < o->n_disable; j++)
        if (o->disable[j] && strcmp(o->disable[j], name) == 0) return false;
    return true;
}

gt_status gt_pass_pipeline_init(gt_pass_pipeline *p, const gt_pass_options *options, gt_error *err)
{
    memset(p, 0, sizeof *p);
    if (options) p->options = *options;
    for (int k = 0; k < p->options.n_disable; k++) {
        const char *name = p->options.disable ? p->options.disable[k] : NULL;
        if (gt_pass_find(name)) continue;
        char known[512];
        known_passes(known, sizeof known);
        return gt_error_set(err, GT_ERR_INVALID,
                            "compile.disable_passes: unknown pass '%s' (known passes: %s)",
                            name ? name : "(null)", known);
    }
    for (int k = 0; k < GT_N_PASSES; k++) {
        bool in_scope = p->options.scope == GT_PASS_SCOPE_ALL ||
                        gt_passes[k].whole_step == (p->options.scope == GT_PASS_SCOPE_WHOLE);
        if (in_scope && gt_pass_enabled(&p->options, gt_passes[k].name)) {
            GT_CHECK(p->n < GT_PASS_MAX);
            p->pass[p->n++] = &gt_passes[k];
        }
    }
    return GT_OK;
}

/* ---------------------------------------------------------------- dumps */

static FILE *open_dump(const char *dir, int nn, const char *pass, const char *what, const char *ext,
                       gt_error *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%02d-%s.%s.%s", dir, nn, pass, what, ext);
    FILE *f = fopen(path, "w");
    if (!f)
        gt_error_set(err, GT_ERR_IO, "graph dump '%s': cannot open for writing: %s", path,
                     strerror(errno));
    return f;
}

static gt_status close_dump(FILE *f, const char *dir, int nn, const char *pass, const char *what,
                            const char *ext, gt_error *err)
{
    bool bad = ferror(f) != 0;
    bad |= fclose(f) != 0;
    if (bad)
        return gt_error_set(err, GT_ERR_IO, "graph dump '%s/%02d-%s.%s.%s': write failed", dir, nn,
                            pass, what, ext);
    return GT_OK;
}

static gt_status dump_listing(const gt_graph *g, const char *dir, int nn, const char *pass,
                              const char *what, gt_error *err)
{
    FILE *f = open_dump(dir, nn, pass, what, "txt", err);
    if (!f) return err->code;
    gt_graph_print(g, f);
    return close_dump(f, dir, nn, pass, what, "txt", err);
}

/* The graph after a pass as Graphviz DOT (grouped by module, coloured by phase). */
static gt_status dump_dot(const gt_graph *g, const char *dir, int nn, const char *pass,
                          gt_error *err)
{
    FILE *f = open_dump(dir, nn, pass, "after", "dot", err);
    if (!f) return err->code;
    char title[128];
    snprintf(title, sizeof title, "after %02d-%s", nn, pass);
    gt_graph_write_dot(g, f, title);
    return close_dump(f, dir, nn, pass, "after", "dot", err);
}

static void count_ops(const gt_graph *g, int32_t *counts)
{
    memset(counts, 0, GT_OP_COUNT * sizeof *counts);
    for (gt_node_id n = 0; n < g->n_nodes; n++)
        if ((int)g->nodes[n].op >= 0 && g->nodes[n].op < GT_OP_COUNT) counts[g->nodes[n].op]++;
}

/* "nodes 812 -> 790" then one line per op whose count changed: "reshape 300 -> 250". */
static gt_status dump_diff(const int32_t *before, const gt_graph *g, int32_t nodes_before,
                           const char *dir, int nn, const char *pass, gt_error *err)
{
    int32_t after[GT_OP_COUNT];
    count_ops(g, after);
    FILE *f = open_dump(dir, nn, pass, "diff", "txt", err);
    if (!f) return err->code;
    fprintf(f, "nodes %d -> %d\n", nodes_before, g->n_nodes);
    int changed = 0;
    for (int op = 0; op < GT_OP_COUNT; op++) {
        if (before[op] == after[op]) continue;
        fprintf(f, "%s %d -> %d\n", gt_op_get((gt_op)op)->name, before[op], after[op]);
        changed++;
    }
    if (!changed) fprintf(f, "(no op count changed)\n");
    return close_dump(f, dir, nn, pass, "diff", "txt", err);
}

/* The collectives of the final graph: positions, sizes, overlap (collective_report.c). */
static gt_status dump_collectives(const gt_graph *g, const gt_pass_options *o, gt_error *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/collectives.txt", o->dump_dir);
    FILE *f = fopen(path, "w");
    if (!f)
        return gt_error_set(err, GT_ERR_IO, "graph dump '%s': cannot open for writing: %s", path,
                            strerror(errno));
    gt_pass_collective_report(g, o->binding, f);
    bool bad = ferror(f) != 0;
    bad |= fclose(f) != 0;
    if (bad) return gt_error_set(err, GT_ERR_IO, "graph dump '%s': write failed", path);
    return GT_OK;
}

/* ---------------------------------------------------------------- running */

gt_status gt_pass_pipeline_run(const gt_pass_pipeline *p, gt_graph *g, gt_pass_report *report,
                               gt_error *err)
{
    const gt_pass_options *o = &p->options;
    if (report) memset(report, 0, sizeof *report);
    if (o->verify_each && gt_graph_verify(g, err) != GT_OK)
        return gt_error_wrap(err, "pass pipeline: the input graph is invalid");
    gt_error derr = {0};
    if (o->dump_dir && gt_make_dirs(o->dump_dir, &derr) != GT_OK)
        return gt_error_set(err, GT_ERR_IO, "graph dump directory '%s': %s", o->dump_dir, derr.msg);
    for (int k = 0; k < p->n; k++) {
        const gt_pass_info *pass = p->pass[k];
        if (pass->mesh_only && g->mesh.ndim == 0) continue; /* nothing to do, nothing to log */
        gt_pass_ctx ctx = {.options = o, .index = k};
        int nn = k + 1;
        int32_t before_ops[GT_OP_COUNT];
        int32_t nodes_before = g->n_nodes;
        if (o->dump_dir) {
            count_ops(g, before_ops);
            GT_TRY(dump_listing(g, o->dump_dir, nn, pass->name, "before", err));
        }
        double t0 = (1e3 * gt_now_seconds());
        gt_status st = pass->run(g, &ctx, err);
        double ms = (1e3 * gt_now_seconds()) - t0;
        if (st != GT_OK) return gt_error_wrap(err, "pass '%s'", pass->name);
        if (o->verify_each && gt_graph_verify(g, err) != GT_OK)
            return gt_error_wrap(err, "pass '%s' left an invalid graph", pass->name);
        if (!o->quiet)
            gt_log(GT_LOG_INFO, "pass %-14s %9.3f ms  nodes %d -> %d", pass->name, ms, nodes_before,
                   g->n_nodes);
        if (report) {
            report->pass[report->n_run++] = (gt_pass_stat){.name = pass->name,
                                                           .ms = ms,
                                                           .nodes_before = nodes_before,
                                                           .nodes_after = g->n_nodes};
        }
        if (o->dump_dir) {
            GT_TRY(dump_listing(g, o->dump_dir, nn, pass->name, "after", err));
            GT_TRY(dump_dot(g, o->dump_dir, nn, pass->name, err));
            GT_TRY(dump_diff(before_ops, g, nodes_before, o->dump_dir, nn, pass->name, err));
        }
    }
    if (o->dump_dir && g->mesh.ndim > 0) GT_TRY(dump_collectives(g, o, err));
    return GT_OK;
}

gt_status gt_pass_run_pipeline(gt_graph *g, const gt_pass_options *options, gt_pass_report *report,
                               gt_error *err)
{
    gt_pass_pipeline p;
    GT_TRY(gt_pass_pipeline_init(&p, options, err));
    return gt_pass_pipeline_run(&p, g, report, err);
}
