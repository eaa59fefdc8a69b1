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
 * that figure.
 *
 * Parameter casts (model computing in bf16, params f32): the expected sets come from the graph's
 * block PARAM inputs, each cast once to bf16 in the forward. default tags none of those casts, the
 * backward reads every forward cast and casts no parameter again; full tags all of them and the
 * backward reads only its own copies (one per parameter, origin the forward cast). Under FSDP
 * (dp_shard 2, reshard after forward) the casts read the local shards, so default saves them and
 * the backward's re-gathers read them. Both policies stay bitwise exact in bf16 (test_tiny). On
 * debugmodel bf16 8 x 2048 the saved casts cost at most their own bf16 bytes in the live peak
 * against the same graph with the casts tagged for recomputation, and default stays <= 0.7 x
 * none. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graphtrain/gt_parallel.h"
#include "graphtrain/gt_pass.h"
#include "graphtrain/gt_program.h"
#include "gt_test.h"
#include "passes/memory_policy_internal.h"
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
    EXPECT(gt_graph_same_io(s->g, cg), "%s %s: graph inputs/outputs changed", flavor, pname);

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

static planned plan_graph(const gt_graph *g, const gt_sym_binding *b, gt_error *err)
{
    planned r = {0};
    gt_node_id *order = NULL;
    int32_t n = 0;
    gt_plan *plan = NULL;
    if (gt_schedule_build(g, &order, &n, err) == GT_OK &&
        gt_plan_memory(g, b, order, n, NULL, &plan, err) == GT_OK) {
        r.step_arena = plan->arena_bytes[GT_ARENA_STEP];
        r.live_peak = plan->live_peak_bytes;
        r.activations_at_peak = plan->peak_by_category[GT_MEM_ACTIVATION];
        r.ok = true;
    }
    gt_plan_free(plan);
    free(order);
    return r;
}

static planned plan_policy(const step_graph *s, gt_memory_policy policy, int64_t budget,
                           gt_error *err)
{
    planned r = {0};
    gt_graph *cg = compiled_graph(s, policy, budget, err);
    if (!cg) return r;
    r = plan_graph(cg, &s->binding, err);
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

/* ---------------------------------------------------------------- parameter casts (bf16)
 *
 * With the model computing in bf16 each block parameter (an f32 PARAM input named "layers.N...")
 * is cast to bf16 once in the forward, and the backward reads that bf16 copy (the matmul
 * backward for the input gradient, the norm backward). By the policies' definitions:
 *   default  a cast whose input is a PARAM is saved: no such cast is tagged, the backward reads
 *            the forward's casts and casts no parameter itself;
 *   full     every block node but the block boundaries is recomputed: every parameter cast is
 *            tagged, and the backward reads only its own copies, one per parameter.
 * The expected sets come from the graph's input list (the block PARAM inputs), not from the pass.
 */

/* bp[v] = 1 for every PARAM input of g inside a block; *count of them, *elems their elements. */
static uint8_t *block_params(const gt_graph *g, int32_t *count, int64_t *elems)
{
    uint8_t *bp = calloc((size_t)g->n_values + 1, 1);
    *count = 0;
    *elems = 0;
    for (int32_t k = 0; k < g->n_inputs; k++) {
        const gt_io *io = &g->inputs[k];
        if (io->kind != GT_IN_PARAM || strncmp(gt_graph_str(g, io->fqn), "layers.", 7) != 0)
            continue;
        bp[io->value] = 1;
        (*count)++;
        int64_t shape[GT_MAX_DIMS];
        gt_error err = {0};
        EXPECT_OK(gt_graph_eval_shape(g, io->value, NULL, shape, &err), &err);
        *elems += gt_shape_numel(gt_value_type(g, io->value)->ndim, shape);
    }
    return bp;
}

static bool is_param_cast(const gt_graph *g, const uint8_t *bp, gt_node_id n)
{
    return g->nodes[n].op == GT_OP_CAST && bp[g->nodes[n].in[0]];
}

/* Copy of s->g through canonicalize, cse and memory_policy only (tagged, nothing rewritten). */
static gt_graph *policy_tagged(const step_graph *s, gt_memory_policy policy, gt_error *err)
{
    char *off[] = {"remat", "dce", "fusion"};
    gt_graph *g = gt_graph_copy(s->g);
    gt_pass_options o = policy_options(policy, &s->binding, 0);
    o.disable = off;
    o.n_disable = 3;
    if (gt_pass_run_pipeline(g, &o, NULL, err) != GT_OK) {
        gt_graph_free(g);
        return NULL;
    }
    return g;
}

/* remat then dce on a tagged graph (no fusion: the test is about what the backward reads). */
static bool remat_dce(gt_graph *g, const gt_sym_binding *b, gt_error *err)
{
    gt_pass_options o = policy_options(GT_MEMORY_POLICY_NONE, b, 0);
    gt_pass_ctx ctx = {.options = &o, .index = 0};
    return gt_pass_remat(g, &ctx, err) == GT_OK && gt_pass_dce(g, &ctx, err) == GT_OK &&
           gt_graph_verify(g, err) == GT_OK;
}

/* Whether value v is read by a backward node (readers: backward reads per value), directly or
 * through forward reshapes and concats of it (a gather bucket's pack, which the backward's
 * re-gather of the block reads). */
static bool reaches_backward(const gt_graph *g, const int32_t *readers, gt_value_id v)
{
    if (readers[v] > 0) return true;
    for (gt_node_id n = g->values[v].producer + 1; n < g->n_nodes; n++) {
        const gt_node *nd = &g->nodes[n];
        if (nd->phase != GT_PHASE_FORWARD || (nd->op != GT_OP_RESHAPE && nd->op != GT_OP_CONCAT))
            continue;
        for (int k = 0; k < nd->n_in; k++)
            if (nd->in[k] == v && reaches_backward(g, readers, nd->out[0])) return true;
    }
    return false;
}

static void check_param_casts_policy(const step_graph *s, gt_memory_policy policy)
{
    const char *pname = gt_memory_policy_name(policy);
    bool full = policy == GT_MEMORY_POLICY_FULL;
    gt_error err = {0};
    gt_graph *g = policy_tagged(s, policy, &err);
    EXPECT(g != NULL, "bf16 %s: passes failed: %s", pname, err.msg);
    if (!g) return;
    int32_t np = 0;
    int64_t elems = 0;
    uint8_t *bp = block_params(g, &np, &elems);
    int32_t casts = 0, tagged = 0;
    for (gt_node_id n = 0; n < g->n_nodes; n++) {
        if (g->nodes[n].phase != GT_PHASE_FORWARD || !is_param_cast(g, bp, n)) continue;
        casts++;
        tagged += gt_node_has_tag(g, &g->nodes[n], "recompute");
    }
    EXPECT(np > 0 && casts == np, "bf16 %s: %d forward casts of %d block params", pname, casts, np);
    EXPECT(tagged == (full ? casts : 0), "bf16 %s: %d of %d parameter casts tagged recompute",
           pname, tagged, casts);
    free(bp);

    EXPECT(remat_dce(g, &s->binding, &err), "bf16 %s: remat/dce: %s", pname, err.msg);
    bp = block_params(g, &np, &elems); /* dce renumbered the values */
    /* readers[v]: non-forward nodes that read v */
    int32_t *readers = calloc((size_t)g->n_values + 1, sizeof *readers);
    int32_t bwd_casts = 0, bad_copies = 0;
    for (gt_node_id n = 0; n < g->n_nodes; n++) {
        const gt_node *nd = &g->nodes[n];
        if (nd->phase == GT_PHASE_FORWARD) continue;
        for (int k = 0; k < nd->n_in; k++)
            readers[nd->in[k]]++;
        if (!is_param_cast(g, bp, n)) continue;
        bwd_casts++;
        /* a copy of the forward cast of the same parameter */
        gt_node_id o = nd->origin;
        bad_copies += !(gt_node_has_tag(g, nd, "recompute") && o >= 0 && o < n &&
                        g->nodes[o].phase == GT_PHASE_FORWARD && is_param_cast(g, bp, o) &&
                        g->nodes[o].in[0] == nd->in[0]);
    }
    int32_t fwd_casts = 0, read_by_bwd = 0;
    for (gt_node_id n = 0; n < g->n_nodes; n++) {
        if (g->nodes[n].phase != GT_PHASE_FORWARD || !is_param_cast(g, bp, n)) continue;
        fwd_casts++;
        read_by_bwd += readers[g->nodes[n].out[0]] > 0;
    }
    EXPECT(fwd_casts == np, "bf16 %s: %d forward parameter casts after remat, %d params", pname,
           fwd_casts, np);
    EXPECT(bwd_casts == (full ? np : 0) && bad_copies == 0,
           "bf16 %s: %d backward parameter casts (%d not a copy of the forward cast), expected %d",
           pname, bwd_casts, bad_copies, full ? np : 0);
    EXPECT(read_by_bwd == (full ? 0 : np),
           "bf16 %s: the backward reads %d of the %d forward parameter casts, expected %d", pname,
           read_by_bwd, np, full ? 0 : np);
    printf("test_tiny bf16 %-7s %d block params: %d forward casts read by the backward, %d "
           "recast in the backward\n",
           pname, np, read_by_bwd, bwd_casts);
    free(readers);
    free(bp);
    gt_graph_free(g);
}

/* FSDP (dp_shard 2, reshard after forward for every block: policy always), default memory
 * policy, whole pipeline but fusion: parallelize
 * casts each parameter's local f32 shard (the PARAM input itself) before gathering it, so every
 * block parameter cast still reads a PARAM input and is saved: the bf16 shard, half the weight.
 * The backward gathers again (reshard) from that saved shard and casts no parameter. */
static void check_param_casts_fsdp(const step_graph *s)
{
    gt_error err = {0};
    gt_parallel_plan plan = {.fsdp_reshard_after_forward = true, .fsdp_reshard_last = true};
    EXPECT_OK(gt_mesh_init(&plan.mesh, 1, 2, 1, &err), &err);
    gt_placement(*pl)[GT_MESH_MAX_DIMS] = calloc((size_t)s->g->n_inputs, sizeof *pl);
    gt_graph *g = NULL;
    EXPECT_OK(gt_parallel_input_layouts(&plan, s->g, pl, &err), &err);
    if (err.code == GT_OK)
        EXPECT_OK(
            gt_parallelize(s->g, &plan, (const gt_placement(*)[GT_MESH_MAX_DIMS])pl, &g, &err),
            &err);
    free(pl);
    if (!g) return;
    char *off[] = {"fusion"};
    gt_pass_options o = policy_options(GT_MEMORY_POLICY_DEFAULT, &s->binding, 0);
    o.disable = off;
    o.n_disable = 1;
    EXPECT_OK(gt_pass_run_pipeline(g, &o, NULL, &err), &err);
    int32_t np = 0;
    int64_t elems = 0;
    uint8_t *bp = block_params(g, &np, &elems);
    int32_t *readers = calloc((size_t)g->n_values + 1, sizeof *readers);
    int32_t bwd_casts = 0, bwd_gathers = 0, fwd_casts = 0, tagged = 0, read_by_bwd = 0;
    for (gt_node_id n = 0; n < g->n_nodes; n++) {
        const gt_node *nd = &g->nodes[n];
        if (nd->phase == GT_PHASE_FORWARD) continue;
        for (int k = 0; k < nd->n_in; k++)
            readers[nd->in[k]]++;
        bwd_casts += is_param_cast(g, bp, n);
        bwd_gathers += nd->op == GT_OP_ALL_GATHER_START;
    }
    for (gt_node_id n = 0; n < g->n_nodes; n++) {
        if (g->nodes[n].phase != GT_PHASE_FORWARD || !is_param_cast(g, bp, n)) continue;
        fwd_casts++;
        tagged += gt_node_has_tag(g, &g->nodes[n], "recompute");
        read_by_bwd += reaches_backward(g, readers, g->nodes[n].out[0]);
    }
    EXPECT(np > 0 && fwd_casts == np && tagged == 0,
           "fsdp default: %d forward casts of %d block param shards, %d tagged recompute",
           fwd_casts, np, tagged);
    EXPECT(bwd_casts == 0 && read_by_bwd == np && bwd_gathers > 0,
           "fsdp default: %d backward parameter casts, %d of %d shard casts read by the backward "
           "(or packed into a forward gather's buffer that a backward gather reads), "
           "%d backward gathers",
           bwd_casts, read_by_bwd, np, bwd_gathers);
    printf("test_tiny bf16 fsdp 2 default: %d shard casts saved and read by the backward, %d "
           "backward gathers, %d recast\n",
           read_by_bwd, bwd_gathers, bwd_casts);
    free(readers);
    free(bp);
    gt_graph_free(g);
}

/* debugmodel bf16 at 8 x 2048 (planning only): the saved casts cost at most their own bytes. The
 * reference is the default policy as it would be with the parameter casts recomputed: the same
 * tagged graph with "recompute" added to every forward block parameter cast (each is read by the
 * backward and reads only a parameter, so tagging it changes nothing else). The live peak may grow
 * by at most the bf16 copies, 2 bytes per block parameter element (plus 64-byte alignment each). */
static void check_param_cast_memory(void)
{
    step_graph s;
    const gt_dtype bf16 = GT_BF16;
    gt_error err = {0};
    if (!step_graph_build_in(&s, "debugmodel", &bf16, 8, 2048)) return;
    gt_graph *saved = policy_tagged(&s, GT_MEMORY_POLICY_DEFAULT, &err);
    gt_graph *recast = policy_tagged(&s, GT_MEMORY_POLICY_DEFAULT, &err);
    EXPECT(saved && recast, "bf16 debugmodel: passes failed: %s", err.msg);
    if (saved && recast) {
        int32_t np = 0, tagged = 0;
        int64_t elems = 0;
        uint8_t *bp = block_params(recast, &np, &elems);
        for (gt_node_id n = 0; n < recast->n_nodes; n++)
            if (recast->nodes[n].phase == GT_PHASE_FORWARD && is_param_cast(recast, bp, n)) {
                gt_graph_add_tag(recast, n, "recompute");
                tagged++;
            }
        free(bp);
        EXPECT(tagged == np && np > 0, "bf16 debugmodel: %d parameter casts for %d params", tagged,
               np);
        EXPECT(remat_dce(saved, &s.binding, &err), "remat/dce: %s", err.msg);
        EXPECT(remat_dce(recast, &s.binding, &err), "remat/dce: %s", err.msg);
        planned ps = plan_graph(saved, &s.binding, &err);
        planned pr = plan_graph(recast, &s.binding, &err);
        planned none = plan_policy(&s, GT_MEMORY_POLICY_NONE, 0, &err);
        EXPECT(ps.ok && pr.ok && none.ok, "bf16 debugmodel: planning failed: %s", err.msg);
        if (ps.ok && pr.ok && none.ok) {
            size_t bound = pr.live_peak + (size_t)(2 * elems) + 64u * (size_t)np;
            const double mib = 1024.0 * 1024.0;
            printf("debugmodel bf16 8x2048 default: step arena %.2f MiB, live peak %.2f MiB "
                   "(casts recomputed instead: %.2f, %.2f MiB; %d block params, %.2f MiB in "
                   "bf16; none: %.2f MiB)\n",
                   ps.step_arena / mib, ps.live_peak / mib, pr.step_arena / mib, pr.live_peak / mib,
                   np, (double)(2 * elems) / mib, none.step_arena / mib);
            EXPECT(ps.live_peak <= bound,
                   "saving the parameter casts grew the live peak from %zu to %zu bytes, more "
                   "than their %lld bf16 bytes",
                   pr.live_peak, ps.live_peak, (long long)(2 * elems));
            EXPECT((double)ps.step_arena <= 0.7 * (double)none.step_arena,
                   "bf16 default plans %zu bytes, more than 0.7 x none's %zu", ps.step_arena,
                   none.step_arena);
        }
    }
    gt_graph_free(saved);
    gt_graph_free(recast);
    step_graph_free(&s);
}

/* Forward node n is a rope, or an add of block L whose output no forward node of another block
 * (or outside every block) reads: the inner residual add, not the block's output. */
static bool is_inner_rope_or_add(const gt_graph *g, gt_node_id n)
{
    const gt_node *nd = &g->nodes[n];
    int layer = gt_node_block(nd);
    if (nd->phase != GT_PHASE_FORWARD || layer < 0) return false;
    if (nd->op == GT_OP_ROPE) return true;
    if (nd->op != GT_OP_ADD) return false;
    for (gt_node_id r = n + 1; r < g->n_nodes; r++) {
        const gt_node *rd = &g->nodes[r];
        if (rd->phase != GT_PHASE_FORWARD) continue;
        for (int k = 0; k < rd->n_in; k++)
            if (rd->in[k] == nd->out[0] && gt_node_block(rd) != layer) return false;
    }
    return true;
}

/* debugmodel bf16 at 8 x 2048 (planning only): default saves the outputs of rope and of each
 * block's inner residual add (it tags none of them, so the backward recomputes neither), and that
 * costs no memory: the live peak and the step arena are no larger than with those nodes tagged for
 * recomputation, as the policy did before (each output replaces an input of its size that nothing
 * else in the backward reads: the q / k projection, the attention output projection). */
static void check_saved_rope_add(void)
{
    step_graph s;
    const gt_dtype bf16 = GT_BF16;
    gt_error err = {0};
    if (!step_graph_build_in(&s, "debugmodel", &bf16, 8, 2048)) return;
    gt_graph *saved = policy_tagged(&s, GT_MEMORY_POLICY_DEFAULT, &err);
    gt_graph *recomp = policy_tagged(&s, GT_MEMORY_POLICY_DEFAULT, &err);
    EXPECT(saved && recomp, "bf16 debugmodel: passes failed: %s", err.msg);
    if (saved && recomp) {
        int ropes = 0, adds = 0, tagged_before = 0;
        for (gt_node_id n = 0; n < saved->n_nodes; n++) {
            if (!is_inner_rope_or_add(saved, n)) continue;
            tagged_before += gt_node_has_tag(saved, &saved->nodes[n], "recompute");
            ropes += saved->nodes[n].op == GT_OP_ROPE;
            adds += saved->nodes[n].op == GT_OP_ADD;
            gt_graph_add_tag(recomp, n, "recompute");
        }
        int layers = 0;
        for (gt_node_id n = 0; n < saved->n_nodes; n++) {
            int l = gt_node_block(&saved->nodes[n]);
            if (l + 1 > layers) layers = l + 1;
        }
        EXPECT(ropes == 2 * layers && adds == layers && layers > 0,
               "bf16 debugmodel: %d ropes and %d inner adds for %d blocks", ropes, adds, layers);
        EXPECT(tagged_before == 0, "default tags %d rope / inner add nodes for recomputation",
               tagged_before);
        EXPECT(remat_dce(saved, &s.binding, &err), "remat/dce: %s", err.msg);
        EXPECT(remat_dce(recomp, &s.binding, &err), "remat/dce: %s", err.msg);
        int copies = 0; /* rope / add nodes of the backward that recompute a forward one */
        for (gt_node_id n = 0; n < saved->n_nodes; n++)
            copies += saved->nodes[n].phase != GT_PHASE_FORWARD &&
                      gt_node_has_tag(saved, &saved->nodes[n], "recompute") &&
                      (saved->nodes[n].op == GT_OP_ROPE || saved->nodes[n].op == GT_OP_ADD);
        EXPECT(copies == 0, "the backward recomputes %d rope / add nodes", copies);
        planned ps = plan_graph(saved, &s.binding, &err);
        planned pr = plan_graph(recomp, &s.binding, &err);
        EXPECT(ps.ok && pr.ok, "bf16 debugmodel: planning failed: %s", err.msg);
        if (ps.ok && pr.ok) {
            const double mib = 1024.0 * 1024.0;
            printf("debugmodel bf16 8x2048 default, rope and inner adds saved: step arena %.2f "
                   "MiB, live peak %.2f MiB (recomputed instead: %.2f, %.2f MiB)\n",
                   ps.step_arena / mib, ps.live_peak / mib, pr.step_arena / mib,
                   pr.live_peak / mib);
            EXPECT(ps.live_peak <= pr.live_peak && ps.step_arena <= pr.step_arena,
                   "saving rope / add outputs grew the plan: live peak %zu -> %zu, step arena "
                   "%zu -> %zu bytes",
                   pr.live_peak, ps.live_peak, pr.step_arena, ps.step_arena);
        }
    }
    gt_graph_free(saved);
    gt_graph_free(recomp);
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
    /* parameter casts under mixed precision: tagging, what the backward reads, exactness */
    step_graph s;
    const gt_dtype bf16 = GT_BF16;
    if (step_graph_build_in(&s, "test_tiny", &bf16, 2, 16)) {
        check_param_casts_policy(&s, GT_MEMORY_POLICY_DEFAULT);
        check_param_casts_policy(&s, GT_MEMORY_POLICY_FULL);
        check_param_casts_fsdp(&s);
        check_exact(&s, "test_tiny bf16", GT_MEMORY_POLICY_DEFAULT, 0);
        check_exact(&s, "test_tiny bf16", GT_MEMORY_POLICY_FULL, 0);
        step_graph_free(&s);
    }
    check_param_cast_memory();
    check_saved_rope_add();
    size_t full = 0, none = 0;
    check_debugmodel_memory(&full, &none);
    if (full && none) check_debugmodel_budget(full, none);
    return gt_test_finish();
}
