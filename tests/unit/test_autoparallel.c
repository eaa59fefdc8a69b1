/* test_autoparallel.c — AutoParallel's solver (issue 40, acceptance without execution):
 *   - on a 1-D data-parallel mesh (llama3 8B shapes, dp_shard 8, the H100 model) it chooses the
 *     hand FSDP plan: the same placement for every parameter class and the same graph text;
 *   - on 2-D meshes (debugmodel dp_shard 2 x tp 2, 8B dp_shard 4 x tp 2) the chosen layout's
 *     modelled cost is <= both hand plans' (FSDP, FSDP x TP) on the same model, the activation
 *     decision (sequence parallel or replicated over tp) is the cheaper of the two, and the
 *     chosen layout parallelized with it prices what the result says;
 *   - the same input gives the same layout (twice in one process); the explanation names every
 *     parameter class, both hand plans and the collectives;
 *   - a budget below the unconstrained layout's memory flips parameters to sharded placements,
 *     and a budget nothing fits is an error naming the smallest feasible budget, which solves;
 *   - a build without CBC refuses with a message naming coinor-libcbc-dev.
 * Timings are the bench's (bench/bench_autoparallel.c), never asserted here. */
#include <stdlib.h>
#include <string.h>

#include "graph_text.h"
#include "graphtrain/gt_autoparallel.h"
#include "graphtrain/gt_train.h"
#include "gt_test.h"

typedef struct {
    gt_config cfg;
    gt_train_layout layout;
    gt_graph *g;
    gt_parallel_plan plan;
    gt_sym_binding_entry entries[GT_TRAIN_BINDING_MAX];
    gt_sym_binding binding;
} setup;

/* The global step graph of flavor on dp_shard x tp (rank 0). */
static bool build(setup *s, const char *flavor, int seq, int batch, int dps, int tp)
{
    gt_error err = {0};
    char a[6][32];
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
    gt_config_defaults(&s->cfg);
    s->g = gt_graph_new();
    gt_model model = {0};
    gt_status st = gt_config_apply_overrides(&s->cfg, 12, argv, &err);
    if (st == GT_OK) st = gt_train_layout_init(&s->cfg, dps * tp, 0, &s->layout, &err);
    if (st == GT_OK) st = gt_train_build_global_graph(&s->cfg, &s->layout, s->g, &model, 1, &err);
    gt_model_free(&model);
    EXPECT(st == GT_OK, "%s graph: %s", flavor, err.msg);
    s->plan = (gt_parallel_plan){
        .mesh = s->layout.mesh, .sequence_parallel = true, .fsdp_reshard_after_forward = true};
    gt_train_binding(&s->cfg, &s->layout, s->entries, &s->binding);
    return st == GT_OK;
}

static void teardown(setup *s)
{
    gt_graph_free(s->g);
    gt_config_free(&s->cfg);
}

static gt_status solve(setup *s, const gt_autopar_device *d, double budget_b, gt_autopar_result **r,
                       gt_error *err)
{
    gt_autopar_options o = {.device = *d, .binding = &s->binding, .memory_budget_b = budget_b};
    return gt_autopar_solve(s->g, &s->plan, &o, r, err);
}

static char *spmd_text(setup *s, const gt_placement (*layout)[GT_MESH_MAX_DIMS])
{
    gt_graph *spmd = NULL;
    gt_error err = {0};
    if (gt_parallelize(s->g, &s->plan, layout, &spmd, &err) != GT_OK) {
        EXPECT(false, "parallelize: %s", err.msg);
        return NULL;
    }
    char *t = graph_text(spmd);
    gt_graph_free(spmd);
    return t;
}

static void test_fsdp_on_1d(const gt_autopar_device *h100)
{
    setup s;
    if (!build(&s, "8B", 8192, 1, 8, 1)) return teardown(&s);
    gt_autopar_result *r = NULL;
    gt_error err = {0};
    EXPECT_OK(solve(&s, h100, 0, &r, &err), &err);
    if (r) {
        for (int c = 0; c < r->n_classes; c++)
            EXPECT(r->classes[c].chosen == r->classes[c].hand_fsdp,
                   "8B dp_shard 8: %s is not placed as FSDP places it", r->classes[c].name);
        gt_placement(*hand)[GT_MESH_MAX_DIMS] = gt_xcalloc((size_t)s.g->n_inputs, sizeof *hand);
        EXPECT_OK(gt_parallel_input_layouts(&s.plan, s.g, hand, &err), &err);
        char *a = spmd_text(&s, (const gt_placement(*)[GT_MESH_MAX_DIMS])r->layout);
        char *b = spmd_text(&s, (const gt_placement(*)[GT_MESH_MAX_DIMS])hand);
        EXPECT(a && b && !strcmp(a, b), "8B dp_shard 8: the SPMD graph differs from FSDP's");
        free(a);
        free(b);
        free(hand);
    }
    gt_autopar_free(r);
    teardown(&s);
}

static void test_2d(const char *flavor, int seq, int batch, int dps, int tp,
                    const gt_autopar_device *d, bool twice)
{
    setup s;
    if (!build(&s, flavor, seq, batch, dps, tp)) return teardown(&s);
    gt_autopar_result *r = NULL, *again = NULL;
    gt_error err = {0};
    EXPECT_OK(solve(&s, d, 0, &r, &err), &err);
    if (r) {
        EXPECT(r->has_fsdp_tp, "%s: a 2-D mesh has an FSDP x TP plan", flavor);
        EXPECT(r->cost.total_s <= r->fsdp.total_s && r->cost.total_s <= r->fsdp_tp.total_s,
               "%s dp_shard %d x tp %d: chosen %.6g s, FSDP %.6g s, FSDP x TP %.6g s", flavor, dps,
               tp, r->cost.total_s, r->fsdp.total_s, r->fsdp_tp.total_s);
        printf("%s dp_shard %d x tp %d: chosen %.3f ms (%s, %s), FSDP %.3f ms, FSDP x TP %.3f "
               "ms\n",
               flavor, dps, tp, 1e3 * r->cost.total_s, r->picked,
               r->sequence_parallel ? "sequence parallel" : "activations replicated over tp",
               1e3 * r->fsdp.total_s, 1e3 * r->fsdp_tp.total_s);
        /* the activation decision: priced both ways, the cheaper taken, and the chosen layout
         * with the chosen activations is what the model priced */
        EXPECT(r->sp_other_total_s >= r->cost.total_s,
               "%s: the other activation choice costs "
               "%.6g s, less than the chosen %.6g s",
               flavor, r->sp_other_total_s, r->cost.total_s);
        gt_parallel_plan keep = s.plan;
        s.plan.sequence_parallel = r->sequence_parallel;
        gt_graph *spmd = NULL;
        gt_autopar_cost again_cost;
        EXPECT_OK(gt_parallelize(s.g, &s.plan, (const gt_placement(*)[GT_MESH_MAX_DIMS])r->layout,
                                 &spmd, &err),
                  &err);
        if (spmd) {
            EXPECT_OK(gt_autopar_cost_graph(spmd, &s.binding, d, &again_cost, &err), &err);
            EXPECT(again_cost.total_s == r->cost.total_s,
                   "%s: the chosen layout prices %.9g s, the result says %.9g s", flavor,
                   again_cost.total_s, r->cost.total_s);
        }
        gt_graph_free(spmd);
        s.plan = keep;
    }
    if (r && twice) { /* the explanation names every class and both hand plans */
        char *text = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&text, &len);
        gt_autopar_print(r, NULL, f);
        fclose(f);
        for (int c = 0; c < r->n_classes; c++)
            EXPECT(strstr(text, r->classes[c].name), "the explanation names %s",
                   r->classes[c].name);
        EXPECT(strstr(text, "\n  fsdp ") && strstr(text, "\n  fsdp_tp ") &&
                   strstr(text, "all_gather"),
               "the explanation prices both hand plans and the collectives:\n%s", text);
        free(text);
    }
    if (r && twice) {
        EXPECT_OK(solve(&s, d, 0, &again, &err), &err);
        EXPECT(again &&
                   !memcmp(again->layout, r->layout, (size_t)s.g->n_inputs * sizeof *r->layout),
               "%s: the same input gave another layout", flavor);
    }
    gt_autopar_free(r);
    gt_autopar_free(again);
    teardown(&s);
}

/* The mesh dims that shard class c's chosen placement. */
static int sharded_dims(const gt_autopar_result *r, int c)
{
    const gt_autopar_class *k = &r->classes[c];
    int n = 0;
    for (int md = 0; md < GT_MESH_NDIMS; md++)
        n += k->strategies[k->chosen][md].kind == GT_PLACE_SHARD;
    return n;
}

/* debugmodel on dp_shard 2 x tp 2: unconstrained, the norms' weights are replicated over tp; a
 * budget below that layout's memory shards more (and fits), a budget nothing fits names the
 * smallest feasible one, which solves. (A latency-bound 1-D mesh would be the cleaner case, but
 * the global graph groups the clip norm's terms by the hand plan's placements, which prices a
 * replicated gradient among sharded ones with extra all-reduces.) */
static void test_budget(const gt_autopar_device *cpu)
{
    setup s;
    if (!build(&s, "debugmodel", 64, 2, 2, 2)) return teardown(&s);
    gt_autopar_result *free_r = NULL, *tight = NULL, *least = NULL;
    gt_error err = {0};
    EXPECT_OK(solve(&s, cpu, 0, &free_r, &err), &err);
    if (!free_r) return teardown(&s);
    int before = 0;
    for (int c = 0; c < free_r->n_classes; c++)
        before += sharded_dims(free_r, c) * free_r->classes[c].n_members;
    double budget = free_r->cost.memory_b - 1024;
    EXPECT_OK(solve(&s, cpu, budget, &tight, &err), &err);
    if (tight) {
        int now = 0;
        for (int c = 0; c < tight->n_classes; c++)
            now += sharded_dims(tight, c) * tight->classes[c].n_members;
        EXPECT(now > before && tight->cost.memory_b <= budget,
               "a budget of %.0f bytes: %d sharded placements (%d before), %.0f bytes", budget, now,
               before, tight->cost.memory_b);
    }
    gt_error e2 = {0};
    gt_status st = solve(&s, cpu, 1024, &least, &e2);
    const char *at = strstr(e2.msg, "smallest feasible budget is ");
    EXPECT(st == GT_ERR_INVALID && at, "an infeasible budget: %s", e2.msg);
    gt_autopar_free(least);
    least = NULL;
    if (at) {
        double gib = atof(at + strlen("smallest feasible budget is "));
        gt_error e3 = {0};
        EXPECT_OK(solve(&s, cpu, gib * 1073741824.0, &least, &e3), &e3);
    }
    gt_autopar_free(free_r);
    gt_autopar_free(tight);
    gt_autopar_free(least);
    teardown(&s);
}

int main(void)
{
    gt_autopar_device h100, cpu;
    gt_error err = {0};
    EXPECT_OK(gt_autopar_device_default("h100", &h100, &err), &err);
    EXPECT_OK(gt_autopar_device_default("cpu", &cpu, &err), &err);
    if (!gt_autopar_available()) {
        setup s;
        if (build(&s, "debugmodel", 64, 2, 2, 1)) {
            gt_autopar_result *r = NULL;
            gt_status st = solve(&s, &cpu, 0, &r, &err);
            EXPECT(st == GT_ERR_UNSUPPORTED && strstr(err.msg, "coinor-libcbc-dev"),
                   "without CBC: %s", err.msg);
        }
        teardown(&s);
        return gt_test_finish();
    }
    test_fsdp_on_1d(&h100);
    test_2d("debugmodel", 64, 2, 2, 2, &cpu, true);
    test_2d("8B", 8192, 1, 4, 2, &h100, false);
    test_budget(&cpu);
    return gt_test_finish();
}
