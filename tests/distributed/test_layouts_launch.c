/* test_layouts_launch.c — every parallel layout trains what one rank trains (issue 5, acceptance).
 *
 * The reference is `graphtrain train` on one rank with the global batch (4 sequences of 32 tokens,
 * 10 steps, fp32, synthetic data). Each layout runs the same global batch under
 * `mpiexec -np N`: FSDP2, FSDP4, TP2, TP4, FSDP2xTP2, HSDP 2x2 and HSDP 2x2xTP2 (8 ranks) on
 * test_tiny, and those with tp <= 2 on test_gqa (2 key/value heads). A layout computes the same
 * step up to the summation order of its collectives (rank-order sums of partial gradients, norms
 * split over ranks), so:
 *   - the loss of every step (metrics.jsonl, rank 0) is within 1e-6 relative of the reference's;
 *   - every parameter of the step-10 checkpoint (whole tensors gathered from the ranks) is within
 *     1e-5 of the reference's (max |a - b| over a tensor relative to max |a|);
 *   - every rank's program allocates exactly the bytes it planned (the "memory ..." lines rank 0
 *     logs for every rank, or once for all ranks when they agree).
 * Determinism across processes: every test_tiny layout run twice gives the same losses bit for bit
 * and the same checkpoint file byte for byte (parameters and AdamW moments); and the eager executor
 * (compile.enable = false, collectives run blocking) gives bitwise what the compiled program does.
 * Gradient accumulation over several ranks: FSDP2, TP2 and FSDP2xTP2 with the global batch in two
 * micro-batches train what one rank does on the whole batch (the same tolerances), FSDP2xTP2
 * bitwise run to run and bitwise on the eager executor.
 */
#include "launch.h" /* first: train_child.h defines _GNU_SOURCE */

#define RUN_SECONDS 240.0
#define LOSS_TOLERANCE 1e-6
#define PARAM_TOLERANCE 1e-5

static const launch_layout layouts[] = {
    {"FSDP2", 1, 2, 1},     {"FSDP4", 1, 4, 1},   {"TP2", 1, 1, 2},         {"TP4", 1, 1, 4},
    {"FSDP2xTP2", 1, 2, 2}, {"HSDP2x2", 2, 2, 1}, {"HSDP2x2xTP2", 2, 2, 2},
};
#define N_LAYOUTS ((int)(sizeof layouts / sizeof layouts[0]))

/* Checks the "memory ..." lines of a run's output: planned == allocated on every line, and the
 * lines cover all `ranks` ranks (one "per rank (all N)" line, or one "rank R" line per rank). */
static void check_memory_lines(const char *out_path, int ranks, const char *what)
{
    char *text = read_all(out_path, NULL);
    int covered = 0, lines = 0;
    for (const char *p = text; p && (p = strstr(p, "INFO memory ")); p++) {
        long long planned = -1, allocated = -2;
        int all = 0, rank = -1;
        const char *q = p + strlen("INFO memory ");
        if (sscanf(q, "per rank (all %d)", &all) == 1)
            covered += all;
        else if (sscanf(q, "rank %d", &rank) == 1)
            covered += 1;
        const char *pl = strstr(q, "planned "), *al = strstr(q, "allocated ");
        if (pl) sscanf(pl, "planned %lld", &planned);
        if (al) sscanf(al, "allocated %lld", &allocated);
        lines++;
        EXPECT(planned == allocated && planned > 0,
               "%s: a rank planned %lld bytes but allocated %lld", what, planned, allocated);
    }
    EXPECT(lines > 0 && covered == ranks, "%s: memory lines cover %d of %d ranks (%d lines)", what,
           covered, ranks, lines);
    free(text);
}

/* Runs flavor on layout l (NULL: one rank) into base/NAME; ok when it finished and recorded
 * every step. extra: one more option or NULL. micro > 1: the same global batch of
 * LAUNCH_GLOBAL_BATCH sequences in `micro` micro-batches per data-parallel rank (gradient
 * accumulation), which the run must report. */
static void run_layout_micro(const char *base, const char *name, const char *flavor,
                             const launch_layout *l, const char *extra, int micro,
                             launch_result *r)
{
    launch_cmd c;
    char out_path[600];
    launch_temp_dir(r->dump, sizeof r->dump, base, name);
    snprintf(out_path, sizeof out_path, "%s/output.txt", r->dump);
    launch_layout_run(&c, l, flavor, r->dump, LAUNCH_STEPS);
    if (extra) launch_add(&c, "%s", extra);
    char batches[64];
    snprintf(batches, sizeof batches, "%d micro-batch(es)", micro);
    if (micro > 1) {
        int dp = l ? l->rep * l->shard : 1;
        launch_add(&c, "--training.local_batch_size=%d", LAUNCH_GLOBAL_BATCH / dp / micro);
        launch_add(&c, "--training.global_batch_size=%d", LAUNCH_GLOBAL_BATCH);
    }
    double dt = 0;
    int rc = launch_run(&c, out_path, RUN_SECONDS, &dt);
    char *text = read_all(out_path, NULL);
    r->ok = rc == 0 && last_records(r->dump, LAUNCH_STEPS, r->steps, NULL) && text &&
            strstr(text, batches);
    free(text);
    printf("%-28s %-12s %d rank(s): exit %d, %.1f s\n", name, flavor, l ? launch_ranks(l) : 1, rc,
           dt);
    EXPECT(r->ok, "%s on %s: exit %d, missing metrics, or not %s", name, flavor, rc, batches);
    if (!r->ok) launch_show_tail(out_path);
    if (l && r->ok && !extra && micro == 1) check_memory_lines(out_path, launch_ranks(l), name);
}

static void run_layout(const char *base, const char *name, const char *flavor,
                       const launch_layout *l, const char *extra, launch_result *r)
{
    run_layout_micro(base, name, flavor, l, extra, 1, r);
}

static void compare_to_reference(const launch_result *ref, const launch_result *r, const char *what)
{
    if (!ref->ok || !r->ok) return;
    double dl = launch_loss_diff(ref->steps, r->steps, 1, LAUNCH_STEPS);
    EXPECT(dl <= LOSS_TOLERANCE, "%s: losses differ from one rank's by %.3g relative", what, dl);
    char a[700], b[700];
    launch_ckpt_path(a, sizeof a, ref->dump, LAUNCH_STEPS);
    launch_ckpt_path(b, sizeof b, r->dump, LAUNCH_STEPS);
    int missing = 0;
    double dp = launch_params_diff(a, b, &missing);
    EXPECT(dp >= 0 && dp <= PARAM_TOLERANCE && missing == 0,
           "%s: final parameters differ by %.3g (%d missing)", what, dp, missing);
    printf("  %-26s loss diff %.2e, param diff %.2e\n", what, dl, dp);
}

static void compare_bitwise(const launch_result *a, const launch_result *b, const char *what)
{
    if (!a->ok || !b->ok) return;
    bool same = false;
    int differ = launch_bitwise_diff(a, b, LAUNCH_STEPS, &same);
    EXPECT(differ == 0, "%s: %d steps with other loss or grad_norm bits", what, differ);
    EXPECT(same, "%s: step-%d checkpoints differ", what, LAUNCH_STEPS);
}

int main(void)
{
    char base[256];
    if (!launch_begin(base, sizeof base, "gt_layouts_launch")) return 1;

    static const char *const flavors[] = {"test_tiny", "test_gqa"};
    static launch_result ref, runs[N_LAYOUTS];
    for (int f = 0; f < 2; f++) {
        char name[64];
        snprintf(name, sizeof name, "%s_1rank", flavors[f]);
        run_layout(base, name, flavors[f], NULL, NULL, &ref);
        for (int k = 0; k < N_LAYOUTS; k++) {
            const launch_layout *l = &layouts[k];
            if (f == 1 && l->tp > 2) continue; /* test_gqa has 2 key/value heads */
            snprintf(name, sizeof name, "%s_%s", flavors[f], l->name);
            run_layout(base, name, flavors[f], l, NULL, &runs[k]);
            compare_to_reference(&ref, &runs[k], name);
        }
        if (f != 0) continue;
        /* every test_tiny layout again: bitwise run to run; FSDP2xTP2 (runs[4]) also with the
         * eager executor */
        static launch_result again, eager;
        for (int k = 0; k < N_LAYOUTS; k++) {
            char what[96];
            snprintf(name, sizeof name, "test_tiny_%s_again", layouts[k].name);
            snprintf(what, sizeof what, "%s rerun", layouts[k].name);
            run_layout(base, name, flavors[f], &layouts[k], NULL, &again);
            compare_bitwise(&runs[k], &again, what);
        }
        run_layout(base, "test_tiny_FSDP2xTP2_eager", flavors[f], &layouts[4],
                   "--compile.enable=false", &eager);
        compare_bitwise(&runs[4], &eager, "FSDP2xTP2 eager vs compiled");
        /* gradient accumulation over several ranks (2 micro-batches): what one rank trains on
         * the whole batch at once; FSDP2 x TP2 also bitwise run to run */
        static const int accum_layouts[] = {0, 2, 4}; /* FSDP2, TP2, FSDP2xTP2 */
        static launch_result acc, acc_again;
        for (int a = 0; a < 3; a++) {
            const launch_layout *l = &layouts[accum_layouts[a]];
            snprintf(name, sizeof name, "test_tiny_%s_accum2", l->name);
            run_layout_micro(base, name, "test_tiny", l, NULL, 2, &acc);
            compare_to_reference(&ref, &acc, name);
        }
        run_layout_micro(base, "test_tiny_FSDP2xTP2_accum2_again", "test_tiny", &layouts[4], NULL,
                         2, &acc_again);
        compare_bitwise(&acc, &acc_again, "FSDP2xTP2 with accumulation rerun");
        /* the eager executor runs the micro-batch part and then the whole graph with blocking
         * collectives: the compiled program's bits */
        run_layout_micro(base, "test_tiny_FSDP2xTP2_accum2_eager", "test_tiny", &layouts[4],
                         "--compile.enable=false", 2, &acc_again);
        compare_bitwise(&acc, &acc_again, "FSDP2xTP2 with accumulation eager vs compiled");
    }
    launch_end(base);
    return gt_test_finish();
}
