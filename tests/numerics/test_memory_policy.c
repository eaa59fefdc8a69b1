/* test_memory_policy.c — memory policies with rematerialization are exact, and save memory.
 *
 * Exactness: for every policy (none, full, default, budget with a feasible budget) and the llama3
 * flavors test_tiny, test_gqa, test_odd (2 x 16 tokens) and debugmodel (1 x 32 tokens), the
 * whole-step graph (forward, loss, backward, clipping, AdamW) goes through the pass pipeline
 * (canonicalize, cse, memory_policy, remat, dce) and runs 5 steps as a compiled program
 * (gt_program_build / gt_program_run), feeding its updated params and moments back. The
 * reference is the eager executor on the graph as built, without passes, fed the same way. Every
 * output — loss, grad_norm, gradients, params, moments — must be memcmp-equal at every step. full
 * and default must really recompute (backward copies exist), so the comparison is not vacuous.
 *
 * Memory (planning only, no execution): debugmodel at 8 x 2048 tokens. "Planned activation
 * bytes" here is the planned size of the step arena (gt_plan.arena_bytes[GT_ARENA_STEP]): the
 * bytes the program allocates, once, for everything that is not params or optimizer state —
 * saved activations, the values recomputed in the backward, temporaries, grads and the token
 * batch. It is the honest figure: it is what the process really pays, and it counts the
 * recomputed values (which live in the backward as temporaries). The narrower "activations
 * category at the peak" would drop the recomputed values from the count and flatter full and
 * default; it is printed beside, as is the live peak. Asserted: full <= 0.35 x none and
 * default <= 0.7 x none.
 *
 * Budget: a budget halfway between full's and none's planned step arena is met (planned <=
 * budget); a budget below the smallest reachable figure is refused with a message that states
 * that figure. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graphtrain/gt_pass.h"
#include "graphtrain/gt_program.h"
#include "gt_test.h"
#include "step_harness.h"

#define STEPS 5

/* The step arena the runtime would plan for g: the measure the budget policy is given. */
static gt_status measure_step_arena(const gt_graph *g, void *user, size_t *bytes, gt_error *err)
{
    const gt_sym_binding *b = user;
    gt_node_id *order = NULL;
    int32_t n = 0;
    gt_plan *plan = NULL;
    GT_TRY(gt_schedule_build(g, &order, &n, err));
    gt_status st = gt_plan_memory(g, b, order, n, NULL, &plan, err);
    free(order);
    if (st != GT_OK) return st;
    *bytes = plan->arena_bytes[GT_ARENA_STEP];
    gt_plan_free(plan);
    return GT_OK;
}

static gt_pass_options policy_options(gt_memory_policy policy, const gt_sym_binding *b,
                                      int64_t budget)
{
    gt_pass_options o = {.verify_each = true, .quiet = true, .memory_policy = policy};
    o.memory_budget_bytes = budget;
    o.binding = b;
    o.measure = measure_step_arena;
    o.measure_user = (void *)b;
    return o;
}

/* Copy of s->g through the pipeline under the policy; NULL on failure (err filled). */
static gt_graph *compiled_graph(const step_graph *s, gt_memory_policy policy, int64_t budget,
                                gt_error *err)
{
    gt_graph *g = gt_graph_copy(s->g);
    gt_pass_options o = policy_options(policy, &s->binding, budget);
    if (gt_pass_run_pipeline(g, &o, NULL, err) != GT_OK) {
        gt_graph_free(g);
        return NULL;
    }
    return g;
}

static int32_t count_recompute_copies(const gt_graph *g)
{
    int32_t n = 0;
    for (gt_node_id k = 0; k < g->n_nodes; k++)
        if (g->nodes[k].phase == GT_PHASE_BACKWARD && gt_node_has_tag(g, &g->nodes[k], "recompute"))
            n++;
    return n;
}

/* ---------------------------------------------------------------- steps */

/* The passes keep graph inputs and outputs in order and kind: the two graphs' io lists match. */
static bool same_io(const gt_graph *a, const gt_graph *b)
{
    if (a->n_inputs != b->n_inputs || a->n_outputs != b->n_outputs) return false;
    for (int32_t k = 0; k < a->n_inputs; k++)
        if (a->inputs[k].kind != b->inputs[k].kind ||
            strcmp(gt_graph_str(a, a->inputs[k].fqn), gt_graph_str(b, b->inputs[k].fqn)))
            return false;
    for (int32_t k = 0; k < a->n_outputs; k++)
        if (a->outputs[k].kind != b->outputs[k].kind ||
            strcmp(gt_graph_str(a, a->outputs[k].fqn), gt_graph_str(b, b->outputs[k].fqn)))
            return false;
    return true;
}

/* 5 steps: eager on the graph as built vs the compiled program of the passed graph. */
static void check_exact(const step_graph *s, const char *flavor, gt_memory_policy policy,
                        int64_t budget)
{
    const char *pname = gt_memory_policy_name(policy);
    gt_error err = {0};
    gt_graph *cg = compiled_graph(s, policy, budget, &err);
    EXPECT(cg != NULL, "%s %s: pipeline failed: %s", flavor, pname, err.msg);
    if (!cg) return;
    int32_t copies = count_recompute_copies(cg);
    if (policy == GT_MEMORY_POLICY_FULL || policy == GT_MEMORY_POLICY_DEFAULT)
        EXPECT(copies > 0, "%s %s: no recomputed node in the backward", flavor, pname);
    if (policy == GT_MEMORY_POLICY_NONE)
        EXPECT(copies == 0, "%s none: %d recomputed nodes", flavor, copies);
    EXPECT(same_io(s->g, cg), "%s %s: graph inputs/outputs changed", flavor, pname);

    const gt_graph *g = s->g;
    step_run e, p; /* eager on g, program of cg */
    bool ok = step_run_init(&e, s);
    ok = step_run_init(&p, s) && ok;
    gt_program *prog = NULL;
    EXPECT_OK(gt_program_build(cg, &s->binding, &prog, &err), &err);
    ok = ok && prog;
    int bad_steps = 0;
    for (int64_t step = 1; ok && step <= STEPS; step++) {
        step_set_scalars(s, g, e.state, step);
        step_set_scalars(s, cg, p.state, step);
        EXPECT_OK(gt_eager_run(g, &s->binding, e.state, e.out, &err), &err);
        EXPECT_OK(gt_program_run(prog, p.state, p.out, &err), &err);
        if (err.code) break;
        int bad = step_count_diffs(flavor, pname, step, g, e.out, p.out);
        EXPECT(bad == 0, "%s %s step %lld: %d of %d outputs differ", flavor, pname, (long long)step,
               bad, g->n_outputs);
        bad_steps += bad != 0;
        if (step == STEPS)
            printf("%-10s %-7s %4d recomputed nodes; step %d loss %.9g, %s\n", flavor, pname,
                   copies, STEPS, step_loss(g, p.out),
                   bad_steps ? "DIFFERS" : "bitwise equal to eager at every step");
        step_run_next(&e, g);
        step_run_next(&p, cg);
    }
    gt_program_free(prog);
    step_run_free(&e);
    step_run_free(&p);
    gt_graph_free(cg);
}

/* ---------------------------------------------------------------- planned memory */

typedef struct {
    size_t step_arena, live_peak, activations_at_peak;
    bool ok;
} planned;

static planned plan_policy(const step_graph *s, gt_memory_policy policy, int64_t budget,
                           gt_error *err)
{
    planned r = {0};
    gt_graph *cg = compiled_graph(s, policy, budget, err);
    if (!cg) return r;
    gt_node_id *order = NULL;
    int32_t n = 0;
    gt_plan *plan = NULL;
    if (gt_schedule_build(cg, &order, &n, err) == GT_OK &&
        gt_plan_memory(cg, &s->binding, order, n, NULL, &plan, err) == GT_OK) {
        r.step_arena = plan->arena_bytes[GT_ARENA_STEP];
        r.live_peak = plan->live_peak_bytes;
        r.activations_at_peak = plan->peak_by_category[GT_MEM_ACTIVATION];
        r.ok = true;
    }
    gt_plan_free(plan);
    free(order);
    gt_graph_free(cg);
    return r;
}

static void print_planned(const char *name, planned p, size_t none)
{
    const double mib = 1024.0 * 1024.0;
    printf("debugmodel 8x2048 %-8s step arena %10.1f MiB (%.3f x none)  live peak %10.1f MiB  "
           "activations at the peak %10.1f MiB\n",
           name, p.step_arena / mib, none ? (double)p.step_arena / (double)none : 0.0,
           p.live_peak / mib, p.activations_at_peak / mib);
}

static void check_debugmodel_memory(size_t *full_out, size_t *none_out)
{
    step_graph s;
    gt_error err = {0};
    *full_out = *none_out = 0;
    if (!step_graph_build(&s, "debugmodel", 8, 2048)) return;
    planned none = plan_policy(&s, GT_MEMORY_POLICY_NONE, 0, &err);
    EXPECT(none.ok, "none: %s", err.msg);
    planned full = plan_policy(&s, GT_MEMORY_POLICY_FULL, 0, &err);
    EXPECT(full.ok, "full: %s", err.msg);
    planned def = plan_policy(&s, GT_MEMORY_POLICY_DEFAULT, 0, &err);
    EXPECT(def.ok, "default: %s", err.msg);
    if (none.ok && full.ok && def.ok) {
        print_planned("none", none, none.step_arena);
        print_planned("full", full, none.step_arena);
        print_planned("default", def, none.step_arena);
        EXPECT((double)full.step_arena <= 0.35 * (double)none.step_arena,
               "full plans %zu bytes, more than 0.35 x none's %zu", full.step_arena,
               none.step_arena);
        EXPECT((double)def.step_arena <= 0.7 * (double)none.step_arena,
               "default plans %zu bytes, more than 0.7 x none's %zu", def.step_arena,
               none.step_arena);
        EXPECT(full.step_arena < def.step_arena && def.step_arena < none.step_arena,
               "expected full < default < none: %zu, %zu, %zu", full.step_arena, def.step_arena,
               none.step_arena);
        *full_out = full.step_arena;
        *none_out = none.step_arena;
    }
    step_graph_free(&s);
}

/* debugmodel 8 x 2048: a budget between full and none is met; one below full is refused with
 * the smallest reachable figure, which must be no more than full's. */
static void check_debugmodel_budget(size_t full, size_t none)
{
    step_graph s;
    gt_error err = {0};
    if (!step_graph_build(&s, "debugmodel", 8, 2048)) return;
    size_t mid = full + (none - full) / 2;
    planned b = plan_policy(&s, GT_MEMORY_POLICY_BUDGET, (int64_t)mid, &err);
    EXPECT(b.ok && b.step_arena <= mid, "budget %zu: planned %zu (%s)", mid, b.step_arena, err.msg);
    if (b.ok) print_planned("budget", b, none);
    printf("debugmodel 8x2048 budget   %zu bytes given, %zu planned\n", mid, b.step_arena);
    memset(&err, 0, sizeof err);
    gt_graph *cg = compiled_graph(&s, GT_MEMORY_POLICY_BUDGET, (int64_t)(full / 2), &err);
    EXPECT(cg == NULL && err.code == GT_ERR_INVALID && strstr(err.msg, "cannot be met") &&
               strstr(err.msg, "smallest planned step memory"),
           "budget %zu below full's %zu: expected a refusal, got: %s", full / 2, full, err.msg);
    const char *p = strstr(err.msg, "reachable by recomputation is ");
    size_t smallest =
        p ? (size_t)strtoull(p + strlen("reachable by recomputation is "), NULL, 10) : 0;
    EXPECT(smallest > full / 2 && smallest <= full, "stated minimum %zu, full plans %zu", smallest,
           full);
    printf("budget %zu refused as expected: %s\n", full / 2, err.msg);
    gt_graph_free(cg);
    step_graph_free(&s);
}

int main(void)
{
    static const char *const flavors[] = {"test_tiny", "test_gqa", "test_odd", "debugmodel"};
    static const gt_memory_policy policies[] = {GT_MEMORY_POLICY_NONE, GT_MEMORY_POLICY_FULL,
                                                GT_MEMORY_POLICY_DEFAULT};
    for (int f = 0; f < 4; f++) {
        step_graph s;
        bool small = f < 3;
        if (!step_graph_build(&s, flavors[f], small ? 2 : 1, small ? 16 : 32)) continue;
        for (int p = 0; p < 3; p++)
            check_exact(&s, flavors[f], policies[p], 0);
        /* budget: halfway between full's and none's planned step arena at this size */
        gt_error err = {0};
        planned none = plan_policy(&s, GT_MEMORY_POLICY_NONE, 0, &err);
        planned full = plan_policy(&s, GT_MEMORY_POLICY_FULL, 0, &err);
        EXPECT(none.ok && full.ok, "%s: planning failed: %s", flavors[f], err.msg);
        size_t mid = (none.step_arena + full.step_arena) / 2;
        planned b = plan_policy(&s, GT_MEMORY_POLICY_BUDGET, (int64_t)mid, &err);
        EXPECT(b.ok && b.step_arena <= mid, "%s budget %zu: planned %zu (%s)", flavors[f], mid,
               b.step_arena, err.msg);
        check_exact(&s, flavors[f], GT_MEMORY_POLICY_BUDGET, (int64_t)mid);
        step_graph_free(&s);
    }
    size_t full = 0, none = 0;
    check_debugmodel_memory(&full, &none);
    if (full && none) check_debugmodel_budget(full, none);
    return gt_test_finish();
}
