/* test_autoparallel_policy.c — the autoparallel backend's FSDP pass policy (issue 40,
 * gt_autopar_pick_policy) on the solver's cost model, over the SPMD graphs of the hand plans
 * (llama3 8B on dp_shard 8 with the H100 model, debugmodel on dp_shard 2 x tp 2 with the CPU
 * model):
 *   - a tighter memory budget never picks a deeper prefetch or a larger bucket, and what it
 *     picks fits whenever the smallest bucket at depth 1 does;
 *   - a slower link (beta down, alpha up) never picks smaller buckets, and its exposed time
 *     never shrinks at the same knobs;
 *   - with room and a fast link the gathers are hidden (exposed <= 1% of compute); over a link a
 *     thousand times slower nothing hides and one bucket per block is taken;
 *   - the user's knobs are kept; the same input picks the same knobs.
 * And the prefetch depth it sets: fsdp_reorder at depth 1 is the default graph, and at depth 2
 * more FSDP all-gathers are in flight at once (starts posted, waits not reached). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "graph_text.h"
#include "graphtrain/gt_autoparallel.h"
#include "graphtrain/gt_train.h"
#include "gt_test.h"

typedef struct {
    gt_config cfg;
    gt_train_layout layout;
    gt_graph *g, *spmd;
    gt_sym_binding_entry entries[GT_TRAIN_BINDING_MAX];
    gt_sym_binding binding;
} setup;

/* The hand plan's SPMD graph of flavor on dp_shard x tp (rank 0), before the passes. */
static bool build(setup *s, const char *flavor, int seq, int batch, int dps, int tp)
{
    gt_error err = {0};
    char a[5][32];
    snprintf(a[0], 32, "%s", flavor);
    snprintf(a[1], 32, "%d", seq);
    snprintf(a[2], 32, "%d", batch);
    snprintf(a[3], 32, "%d", dps);
    snprintf(a[4], 32, "%d", tp);
    char *argv[] = {"--model.flavor",
                    a[0],
                    "--training.seq_len",
                    a[1],
                    "--training.local_batch_size",
                    a[2],
                    "--parallelism.data_parallel_shard_degree",
                    a[3],
                    "--parallelism.tensor_parallel_degree",
                    a[4],
                    "--compile.enable",
                    "false"};
    memset(s, 0, sizeof *s);
    gt_config_defaults(&s->cfg);
    s->g = gt_graph_new();
    gt_model model = {0};
    gt_status st = gt_config_apply_overrides(&s->cfg, 12, argv, &err);
    if (st == GT_OK) st = gt_train_layout_init(&s->cfg, dps * tp, 0, &s->layout, &err);
    if (st == GT_OK) st = gt_train_build_global_graph(&s->cfg, &s->layout, s->g, &model, 1, &err);
    gt_model_free(&model);
    gt_train_binding(&s->cfg, &s->layout, s->entries, &s->binding);
    gt_parallel_plan plan = {
        .mesh = s->layout.mesh, .sequence_parallel = true, .fsdp_reshard_after_forward = true};
    gt_placement(*place)[GT_MESH_MAX_DIMS] = gt_xcalloc((size_t)s->g->n_inputs + 1, sizeof *place);
    if (st == GT_OK) st = gt_parallel_input_layouts(&plan, s->g, place, &err);
    if (st == GT_OK)
        st = gt_parallelize(s->g, &plan, (const gt_placement(*)[GT_MESH_MAX_DIMS])place, &s->spmd,
                            &err);
    free(place);
    EXPECT(st == GT_OK, "%s graph: %s", flavor, err.msg);
    return st == GT_OK;
}

static void teardown(setup *s)
{
    gt_graph_free(s->g);
    gt_graph_free(s->spmd);
    gt_config_free(&s->cfg);
}

static gt_autopar_policy pick(setup *s, const gt_autopar_device *d, double allowance, double cap,
                              int depth)
{
    gt_autopar_policy p;
    gt_error err = {0};
    EXPECT_OK(gt_autopar_pick_policy(s->spmd, &s->binding, d, allowance, cap, depth, &p, &err),
              &err);
    return p;
}

/* Bucket caps ordered by size: 0 is one bucket per block, above every cap. */
static double cap_size(double cap_mb)
{
    return cap_mb > 0 ? cap_mb : INFINITY;
}

static void test_policy(const char *what, setup *s, const gt_autopar_device *d0)
{
    gt_autopar_policy free_p = pick(s, d0, -1, 0, 0);
    EXPECT(free_p.has_fsdp, "%s: the hand plan gathers parameters", what);
    EXPECT(!free_p.cap_fixed && !free_p.depth_fixed, "%s: nothing was fixed", what);
    EXPECT(!strcmp(free_p.why, "hides") && free_p.exposed_s <= 0.01 * free_p.compute_s,
           "%s: with room the gathers hide: %s, exposed %.3g s of %.3g s", what, free_p.why,
           free_p.exposed_s, free_p.compute_s);
    printf("%s: cap %g MiB, depth %d, %d buckets, in flight %.3f MiB, exposed %.3g of %.3g s\n",
           what, free_p.bucket_cap_mb, free_p.prefetch_depth, free_p.n_buckets,
           free_p.inflight_b / 1048576.0, free_p.exposed_s, free_p.compute_s);
    gt_autopar_policy again = pick(s, d0, -1, 0, 0);
    EXPECT(again.bucket_cap_mb == free_p.bucket_cap_mb &&
               again.prefetch_depth == free_p.prefetch_depth,
           "%s: the same input picked other knobs", what);

    /* budgets from what the preferred knobs need down to nothing */
    gt_autopar_policy least = pick(s, d0, 0, 0, 0);
    int last_depth = 1 << 20;
    double last_cap = INFINITY;
    for (int k = 0; k <= 40; k++) {
        double allowance = free_p.inflight_b * (1.0 - k / 40.0) * 1.0000001;
        gt_autopar_policy p = pick(s, d0, allowance, 0, 0);
        EXPECT(p.prefetch_depth <= last_depth && cap_size(p.bucket_cap_mb) <= last_cap,
               "%s: a budget of %.0f bytes picked depth %d, cap %g MiB after depth %d, cap %g",
               what, allowance, p.prefetch_depth, p.bucket_cap_mb, last_depth, last_cap);
        EXPECT(p.inflight_b <= allowance || least.inflight_b > allowance,
               "%s: a budget of %.0f bytes holds %.0f bytes of gathered buckets", what, allowance,
               p.inflight_b);
        last_depth = p.prefetch_depth, last_cap = cap_size(p.bucket_cap_mb);
    }
    EXPECT(least.prefetch_depth == 1 && !strcmp(least.why, "memory"), "%s: no room: depth %d (%s)",
           what, least.prefetch_depth, least.why);

    /* slower links: beta down, alpha up, one dim at a time and together */
    double budgets[] = {-1, free_p.inflight_b * 0.5};
    for (int bi = 0; bi < 2; bi++) {
        double prev_cap = 0, prev_exposed = 0;
        for (int k = 0; k <= 12; k++) {
            gt_autopar_device d = *d0;
            for (int md = 0; md < GT_MESH_NDIMS; md++) {
                d.beta[md] = d0->beta[md] / exp2(k);
                d.alpha[md] = d0->alpha[md] * exp2(k / 2.0);
            }
            gt_autopar_policy p = pick(s, &d, budgets[bi], 0, 0);
            EXPECT(k == 0 || cap_size(p.bucket_cap_mb) >= prev_cap,
                   "%s: a link 2^%d slower picked cap %g MiB after %g", what, k, p.bucket_cap_mb,
                   prev_cap);
            prev_cap = cap_size(p.bucket_cap_mb);
            /* at the same knobs as the faster link, the exposed time does not shrink */
            gt_autopar_policy fixed = pick(s, &d, -1, 8, 2);
            EXPECT(fixed.exposed_s >= prev_exposed,
                   "%s: a slower link exposes less: %.6g after %.6g s", what, fixed.exposed_s,
                   prev_exposed);
            prev_exposed = fixed.exposed_s;
            if (k == 12 && bi == 0)
                EXPECT(!strcmp(p.why, "exposed") && p.bucket_cap_mb == 0,
                       "%s: a link 4096x slower: %s, cap %g MiB", what, p.why, p.bucket_cap_mb);
        }
    }

    /* the user's knobs stay */
    gt_autopar_policy mine = pick(s, d0, 1.0, 3.5, 3);
    EXPECT(mine.cap_fixed && mine.depth_fixed && mine.bucket_cap_mb == 3.5 &&
               mine.prefetch_depth == 3,
           "%s: the user's 3.5 MiB and depth 3 became %g MiB and %d", what, mine.bucket_cap_mb,
           mine.prefetch_depth);
    gt_autopar_policy deep = pick(s, d0, -1, 1, 8), less = pick(s, d0, -1, 1, 4);
    EXPECT(deep.prefetch_depth == 8 && deep.inflight_b >= less.inflight_b &&
               deep.exposed_s <= less.exposed_s,
           "%s: depth 8 of 1 MiB buckets holds %.0f bytes, exposes %.6g s; depth 4 %.0f, %.6g",
           what, deep.inflight_b, deep.exposed_s, less.inflight_b, less.exposed_s);
    char line[512];
    gt_autopar_policy_format(&mine, line, sizeof line);
    EXPECT(strstr(line, "3.5 MiB (yours)") && strstr(line, "fsdp_prefetch_depth 3 (yours)"),
           "%s: the line says whose: %s", what, line);
    gt_autopar_policy_format(&free_p, line, sizeof line);
    EXPECT(strstr(line, "(chosen)") && !strstr(line, "yours"), "%s: %s", what, line);
}

/* The most FSDP all-gathers of the forward posted and not yet waited for, in node order. */
static int max_in_flight(const gt_graph *g)
{
    int now = 0, most = 0;
    for (gt_node_id i = 0; i < g->n_nodes; i++) {
        const gt_node *n = &g->nodes[i];
        if (n->phase != GT_PHASE_FORWARD) continue;
        if (n->op == GT_OP_ALL_GATHER_START && gt_node_has_tag(g, n, "fsdp.all_gather")) now++;
        if (n->op == GT_OP_WAIT) {
            gt_node_id p = g->values[n->in[0]].producer;
            if (p != GT_NONE && g->nodes[p].op == GT_OP_ALL_GATHER_START &&
                gt_node_has_tag(g, &g->nodes[p], "fsdp.all_gather"))
                now--;
        }
        if (now > most) most = now;
    }
    return most;
}

static gt_graph *compiled(setup *s, int depth, char **text)
{
    gt_graph *g = gt_graph_copy(s->spmd);
    gt_config cfg = s->cfg;
    cfg.compile.enable = true;
    cfg.compile.fsdp_prefetch_depth = depth;
    gt_error err = {0};
    EXPECT_OK(gt_train_compile_graph_layout(&cfg, &s->layout, g, NULL, &err), &err);
    *text = graph_text(g);
    return g;
}

static void test_depth(setup *s)
{
    char *t0, *t1, *t2;
    gt_graph *g0 = compiled(s, 0, &t0), *g1 = compiled(s, 1, &t1), *g2 = compiled(s, 2, &t2);
    EXPECT(t0 && t1 && !strcmp(t0, t1), "depth 1 is the default graph");
    int m1 = max_in_flight(g1), m2 = max_in_flight(g2);
    EXPECT(m2 > m1 && m1 >= 1, "gathers in flight: %d at depth 1, %d at depth 2", m1, m2);
    printf("debugmodel FSDP x TP: %d gathers in flight at depth 1, %d at depth 2\n", m1, m2);
    free(t0);
    free(t1);
    free(t2);
    gt_graph_free(g0);
    gt_graph_free(g1);
    gt_graph_free(g2);
}

int main(void)
{
    gt_autopar_device h100, cpu;
    gt_error err = {0};
    EXPECT_OK(gt_autopar_device_default("h100", &h100, &err), &err);
    EXPECT_OK(gt_autopar_device_default("cpu", &cpu, &err), &err);
    setup s;
    if (build(&s, "8B", 8192, 1, 8, 1)) test_policy("8B dp_shard 8 (h100)", &s, &h100);
    teardown(&s);
    if (build(&s, "debugmodel", 64, 2, 2, 2)) {
        test_policy("debugmodel dp_shard 2 x tp 2 (cpu)", &s, &cpu);
        test_depth(&s);
    }
    teardown(&s);
    return gt_test_finish();
}
