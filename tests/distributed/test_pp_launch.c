/* test_pp_launch.c — `graphtrain train` with pipeline parallelism (issue 39, acceptance), through
 * the real binary under `mpiexec -np 2` (and one schedule on 4 ranks).
 *
 * The reference is one rank accumulating 4 micro-batches of 1 sequence
 * (--training.local_batch_size=1 --training.global_batch_size=4), llama3 debugmodel, fp32. A
 * pipeline run takes a local batch of 4 in micro-batches of 1 and must be that run bit for bit:
 *   - every schedule (GPipe, 1F1B, Interleaved1F1B, ZBVZeroBubble, DualPipeV) on 2 ranks, and
 *     1F1B on 4 ranks: the loss and grad_norm of steps 1..10 the same doubles, the same final
 *     params xxh64, and the step-10 checkpoint (written by rank 0 after the stages' state is
 *     gathered) the same bytes as the one rank's;
 *   - pp 2 x dp_shard 2 (4 ranks, 1F1B) is bitwise dp_shard 2 accumulating the same micro-batches
 *     (losses, grad norms, hash, checkpoint bytes) while gathering each parameter once a step,
 *     its result serving every micro-batch; pp 2 x tp 2 (ZBVZeroBubble) is within 1e-5
 *     relative of one rank (loss and grad norm, every step);
 *   - the step-5 checkpoint of a 2-rank 1F1B run, resumed on one rank (the reference's options),
 *     trains steps 6..10 with the uninterrupted run's losses, bit for bit; the one rank's step-5
 *     checkpoint resumed by a 2-rank ZBVZeroBubble run does the same; and the pp 2 checkpoint
 *     resumed on dp_shard 2 (the same 4 sequences a step, unaccumulated) within 1e-5;
 *   - the runner frees each step value after its last read: a step holds under half of the
 *     values it computes, and GPipe's actions hold more than 1F1B's; rank 0's step 1 starts the
 *     collectives and holds the bytes its plan logged before step 1, exactly;
 *   - stage-local state: on 2 ranks each pipeline rank holds under 0.75 of the parameters,
 *     gradient sums and AdamW moments the one rank holds (16 bytes a parameter of the one rank's
 *     count), and the ranks together hold it exactly once (the "pipeline state" line, logged
 *     after setup, which frees nothing: a setup that drew or loaded the whole state would show
 *     it there), also after a resume;
 *   - per-stage programs (compile.enable, the default): rank 0 names a program for each part of
 *     its stages that has nodes, each with arenas allocated as its memory plan says, before step
 *     1, also on pp 2 x dp_shard 2 (the FSDP gathers outside them, once a step) and pp 2 x tp 2
 *     (their collectives inside); the bitwise checks above run through them;
 *   - compile.memory_policy (recomputation on the whole step before the stage split): pp 2 1F1B
 *     and ZBVZeroBubble under full are bitwise one rank under full, and against the same
 *     schedule under none (1F1B) or default (ZBVZeroBubble) the stages save under a quarter of
 *     the activations (the pipeline line) and rank 0's step holds less over the schedule's
 *     actions (its step plan);
 *   - compile on one rank: with compile.precompile_artifact_dir a pp 2 1F1B run saves one
 *     artifact a stage part and a second run loads its own, both bitwise the one rank; a GPipe
 *     run on those artifacts is refused naming the schedule, and a run under another
 *     compile.memory_policy naming that;
 *   - bad input is refused on every rank before any step, naming the option: a schedule that
 *     does not exist, layers per stage that do not divide as asked, too few micro-batches for
 *     DualPipeV, a local batch that is no multiple of the micro-batch size, and a pipeline degree
 *     that does not divide the processes launched. */
#include "launch.h" /* first: train_child.h defines _GNU_SOURCE */

#define RUN_SECONDS 300.0

/* The options of every run here: launch_common's (10 steps, checkpoints every 5) on debugmodel. */
static void common(launch_cmd *c, int np, const char *dump)
{
    launch_train(c, np);
    launch_common(c, "debugmodel", dump, 5);
}

/* The one-rank reference: 4 micro-batches of accumulation. */
static void one_rank(launch_cmd *c, const char *dump)
{
    common(c, 0, dump);
    launch_add(c, "--training.local_batch_size=1");
    launch_add(c, "--training.global_batch_size=4");
}

/* A pipeline of `degree` ranks on np processes: a local batch of 4 in micro-batches of 1. */
static void pipeline(launch_cmd *c, int np, int degree, const char *schedule, const char *dump)
{
    common(c, np, dump);
    launch_add(c, "--training.local_batch_size=4");
    launch_add(c, "--parallelism.pipeline_parallel_degree=%d", degree);
    launch_add(c, "--parallelism.pipeline_parallel_schedule=%s", schedule);
    launch_add(c, "--parallelism.pipeline_parallel_microbatch_size=1");
}

/* The one rank's parameter count (its "model ...: N parameters" line): its state is 16 bytes a
 * parameter (fp32 parameter, gradient sum, two AdamW moments). */
static long long one_rank_params;

/* The "pipeline state" line of a run of `degree` ranks: each rank holds less than `share` of the
 * one rank's state, and all of them together hold it once. */
static void check_state(const char *name, const char *out, int degree, double share)
{
    long long held[8] = {0}, sum = 0, whole = -1;
    bool found = launch_pp_state(out, degree, held, &whole);
    EXPECT(found, "%s: no \"pipeline state\" line with %d ranks", name, degree);
    if (!found) return;
    for (int r = 0; r < degree; r++)
        sum += held[r];
    long long want = 16 * one_rank_params;
    EXPECT(whole == want, "%s: %lld B without the pipeline, the one rank holds %lld", name, whole,
           want);
    EXPECT(sum == want, "%s: the ranks hold %lld B together, the one rank %lld", name, sum, want);
    for (int r = 0; r < degree; r++)
        EXPECT((double)held[r] < share * (double)want, "%s: rank %d holds %lld B of %lld", name, r,
               held[r], want);
    printf("  %-30s state per rank", name);
    for (int r = 0; r < degree; r++)
        printf(" %.3f", (double)held[r] / (double)want);
    printf(" of the one rank's %lld B\n", want);
}

/* The stats of rank 0's step: the plan logged before step 1 ("pipeline step plan on rank 0: ")
 * or step 1 as run ("pipeline step 1 on rank 0: "). */
typedef struct {
    long long started, gathers, reused, actions, peak, computed, arena;
    char text[600];
} step_stats;

static bool parse_stats(const char *out, const char *key, step_stats *st)
{
    memset(st, 0, sizeof *st);
    const char *line = out ? strstr(out, key) : NULL;
    if (!line) return false;
    line += strlen(key);
    size_t n = strcspn(line, "\n");
    snprintf(st->text, sizeof st->text, "%.*s", (int)n, line);
    return sscanf(line,
                  "%lld collectives started (%lld all-gathers), %lld more served by an earlier "
                  "micro-batch's or node's result; step values held at most %lld B (%*f MiB) "
                  "over the schedule's actions, %lld B (%*f MiB) with the optimizer's, of %lld B "
                  "(%*f MiB) computed; one arena of %lld B",
                  &st->started, &st->gathers, &st->reused, &st->actions, &st->peak, &st->computed,
                  &st->arena) == 7;
}

/* The runner frees each value after its last read, so the step holds well under all it
 * computes; and what step 1 did is what was planned before it, collectives and bytes. */
static void check_values(const char *name, const char *out, step_stats *run)
{
    step_stats plan;
    bool have = parse_stats(out, "pipeline step plan on rank 0: ", &plan) &&
                parse_stats(out, "pipeline step 1 on rank 0: ", run);
    EXPECT(have, "%s: no pipeline step plan or step 1 line of rank 0", name);
    if (!have) return;
    EXPECT(!strcmp(plan.text, run->text), "%s: step 1 on rank 0 was \"%s\", planned \"%s\"", name,
           run->text, plan.text);
    EXPECT(run->actions > 0 && run->actions <= run->peak && 2 * run->peak < run->computed,
           "%s: step values held at most %lld B (actions) and %lld B of %lld B computed", name,
           run->actions, run->peak, run->computed);
    /* the step's values in one arena, allocated as planned (the lines are equal) */
    EXPECT(run->arena >= run->peak && run->arena < run->computed,
           "%s: an arena of %lld B for a peak of %lld B of %lld B computed", name, run->arena,
           run->peak, run->computed);
    printf("  %-30s step values held at most %lld B (actions), %lld B, of %lld B, in an arena "
           "of %lld B; as planned\n",
           name, run->actions, run->peak, run->computed, run->arena);
}

/* The "pipeline program" lines of rank 0: a part with nodes is compiled, its arenas allocated as
 * planned ("arenas planned N B, allocated N B"). */
static void check_programs(const char *name, const char *out)
{
    int compiled = 0, parts = 0;
    for (const char *p = out; p && (p = strstr(p, "pipeline program rank 0 stage ")); p++) {
        const char *nodes = strstr(p, ": ");
        long long n = nodes ? strtoll(nodes + 2, NULL, 10) : 0;
        size_t len = strcspn(p, "\n");
        const char *pl = strstr(p, "arenas planned ");
        if (n > 0) parts++;
        if (!pl || pl > p + len) continue;
        long long planned = strtoll(pl + strlen("arenas planned "), NULL, 10), allocated = -1;
        const char *al = strstr(pl, "allocated ");
        if (al) allocated = strtoll(al + strlen("allocated "), NULL, 10);
        EXPECT(planned > 0 && planned == allocated, "%s: %.*s", name, (int)len, p);
        compiled++;
    }
    EXPECT(parts > 0 && compiled == parts, "%s: %d of rank 0's %d parts compiled", name, compiled,
           parts);
    printf("  %-30s rank 0: %d stage parts compiled, arenas as planned\n", name, compiled);
}

/* check_state, check_values and check_programs on the output of the run in dump. */
static double state_of(const char *dump, int degree, double share)
{
    char out_path[600];
    snprintf(out_path, sizeof out_path, "%s.txt", dump);
    char *out = read_all(out_path, NULL);
    const char *slash = strrchr(dump, '/');
    step_stats run;
    check_state(slash ? slash + 1 : dump, out, degree, share);
    check_values(slash ? slash + 1 : dump, out, &run);
    check_programs(slash ? slash + 1 : dump, out);
    free(out);
    return (double)run.actions;
}

/* FSDP under the pipeline gathers each parameter once a step: rank 0's step 1 line says how many
 * all-gathers it started and how many collectives an earlier result served; with 4
 * micro-batches each gather serves at least the 3 others. */
static void gathers_once(const char *dump)
{
    char out_path[600];
    snprintf(out_path, sizeof out_path, "%s.txt", dump);
    char *out = read_all(out_path, NULL);
    step_stats run;
    check_values("pp2 x dp_shard2", out, &run);
    check_programs("pp2 x dp_shard2", out);
    EXPECT(run.gathers > 0 && run.reused >= 3 * run.gathers,
           "pp2 x dp_shard2: %lld all-gathers started on rank 0, %lld collectives served by an "
           "earlier result (want >= 3 x the gathers)",
           run.gathers, run.reused);
    printf("  %-30s rank 0: %lld collectives a step, %lld of them all-gathers; %lld reused\n",
           "pp2 x dp_shard2 FSDP", run.started, run.gathers, run.reused);
    free(out);
}

/* The sum over the ranks of rank 0's "peak saved activations rank R X MiB" (the pipeline line,
 * logged before step 1): the activations the schedule's micro-batches in flight save from each
 * stage's forward to its backward. -1 without the line. */
static double saved_activations(const char *out)
{
    const char *p = out ? strstr(out, "peak saved activations") : NULL;
    if (!p) return -1;
    size_t len = strcspn(p, "\n");
    double sum = 0, mib = 0;
    int r = 0, used = 0;
    for (const char *q = p + strlen("peak saved activations");
         q < p + len && sscanf(q, "%*[ ,]rank %d %lf MiB%n", &r, &mib, &used) == 2; q += used)
        sum += mib;
    return sum;
}

/* compile.memory_policy under a pipeline: the run in dump_full (full) against the one in dump_none
 * (none, or default) of the same schedule. Recomputation runs on the whole step before the stage
 * split, so the stages' micro-batches save under a quarter of the activations (the pipeline line)
 * and rank 0's step holds less over the schedule's actions (its step plan, equal to step 1). */
static void check_policy(const char *name, const char *dump_none, const char *dump_full)
{
    char path[600];
    snprintf(path, sizeof path, "%s.txt", dump_none);
    char *none = read_all(path, NULL);
    snprintf(path, sizeof path, "%s.txt", dump_full);
    char *full = read_all(path, NULL);
    double sn = saved_activations(none), sf = saved_activations(full);
    step_stats hn, hf;
    bool have = parse_stats(none, "pipeline step plan on rank 0: ", &hn) &&
                parse_stats(full, "pipeline step plan on rank 0: ", &hf);
    EXPECT(have && sn > 0 && sf >= 0, "%s: no pipeline line or step plan (saved %.2f, %.2f MiB)",
           name, sn, sf);
    EXPECT(4 * sf < sn, "%s: the stages save %.2f MiB, %.2f MiB before", name, sf, sn);
    EXPECT(hf.actions < hn.actions, "%s: rank 0 holds %lld B over the actions, %lld B before", name,
           hf.actions, hn.actions);
    printf("  %-30s saved activations %.2f -> %.2f MiB, rank 0 holds %lld -> %lld B\n", name, sn,
           sf, hn.actions, hf.actions);
    free(none);
    free(full);
}

/* Runs c with its output into DUMP.txt; the records of steps 1..10 into r, *hash the final hash.
 */
static bool run(launch_cmd *c, const char *dump, launch_result *r, uint64_t *hash)
{
    char out_path[600];
    snprintf(out_path, sizeof out_path, "%s.txt", dump);
    snprintf(r->dump, sizeof r->dump, "%s", dump);
    double dt = 0;
    int rc = launch_run(c, out_path, RUN_SECONDS, &dt);
    char *out = read_all(out_path, NULL);
    long long first = 0, last = 0;
    r->ok = rc == 0 && out && parse_summary(out, &first, &last, hash) && first == 1 &&
            last == LAUNCH_STEPS && last_records(dump, LAUNCH_STEPS, r->steps, NULL);
    printf("%-48s exit %d, %.1f s\n", dump, rc, dt);
    if (!r->ok) launch_show_tail(out_path);
    const char *m = out ? strstr(out, " parameters; step graph") : NULL;
    if (!one_rank_params && m) { /* the first run: the one rank's */
        while (m > out && m[-1] >= '0' && m[-1] <= '9')
            m--;
        one_rank_params = strtoll(m, NULL, 10);
    }
    free(out);
    return r->ok;
}

static void compare(const char *name, const launch_result *ref, uint64_t ref_hash,
                    const launch_result *r, uint64_t hash)
{
    bool same_ckpt = false;
    int differ = launch_bitwise_diff(ref, r, LAUNCH_STEPS, &same_ckpt);
    EXPECT(differ == 0, "%s: %d of %d steps' loss or grad_norm differ from one rank's", name,
           differ, LAUNCH_STEPS);
    EXPECT(hash == ref_hash, "%s: params xxh64 %016llx, one rank's %016llx", name,
           (unsigned long long)hash, (unsigned long long)ref_hash);
    EXPECT(same_ckpt, "%s: the step-10 checkpoint differs from one rank's", name);
    printf("  %-30s loss 1..10 and grad_norm bitwise: %s; hash %016llx; checkpoint %s\n", name,
           differ ? "NO" : "yes", (unsigned long long)hash, same_ckpt ? "same" : "DIFFERS");
}

/* c (already set up on dump, seeded with a step-5 checkpoint) trains steps 6..10 with ref's
 * losses and grad norms, bitwise. */
static void resumed(const char *name, launch_cmd *c, const char *dump, const launch_result *ref,
                    double tolerance)
{
    char out_path[600];
    snprintf(out_path, sizeof out_path, "%s.txt", dump);
    double dt = 0;
    int rc = launch_run(c, out_path, RUN_SECONDS, &dt);
    printf("%-48s exit %d, %.1f s\n", dump, rc, dt);
    gt_metrics_step steps[LAUNCH_STEPS + 1];
    bool have = rc == 0 && launch_resumed_records(dump, steps);
    EXPECT(have, "%s: exit %d, or metrics.jsonl lacks steps 6..10 (or has 1..5)", name, rc);
    if (!have) {
        launch_show_tail(out_path);
        return;
    }
    if (tolerance > 0) {
        double d = launch_loss_diff(ref->steps, steps, 6, LAUNCH_STEPS);
        EXPECT(d <= tolerance, "%s: steps 6..10 differ from the uninterrupted run by %.3g", name,
               d);
        printf("  %-30s steps 6..10 loss within %.2e\n", name, d);
        return;
    }
    int differ = 0;
    for (int s = 6; s <= LAUNCH_STEPS; s++)
        differ +=
            steps[s].loss != ref->steps[s].loss || steps[s].grad_norm != ref->steps[s].grad_norm;
    EXPECT(differ == 0, "%s: %d of steps 6..10 differ from the uninterrupted run", name, differ);
    printf("  %-30s steps 6..10 bitwise: %s\n", name, differ ? "NO" : "yes");
}

/* A run that must fail on every rank (with up to two more options), saying `what`. */
static void refused(const char *base, const char *name, int np, const char *schedule,
                    const char *extra, const char *extra2, const char *what)
{
    char dump[512], out_path[600];
    snprintf(dump, sizeof dump, "%s/%s", base, name);
    snprintf(out_path, sizeof out_path, "%s.txt", dump);
    launch_cmd c;
    pipeline(&c, np, np == 4 ? 3 : np, schedule, dump); /* 4: a degree of 3 on 4 processes */
    if (extra) launch_add(&c, "%s", extra);
    if (extra2) launch_add(&c, "%s", extra2);
    int rc = launch_run(&c, out_path, 120.0, NULL);
    char *out = read_all(out_path, NULL);
    int says = 0;
    for (const char *p = out; p && (p = strstr(p, what)); p++)
        says++;
    EXPECT(rc != 0 && says >= np, "%s: exit %d, %d of %d ranks say \"%s\"", name, rc, says, np,
           what);
    if (rc == 0 || says < np) launch_show_tail(out_path);
    printf("  refused %-22s exit %d: %s\n", name, rc, what);
    free(out);
}

int main(void)
{
    char base[256], dump[400];
    if (!launch_begin(base, sizeof base, "gt_pp_launch")) return 1;
    launch_cmd c;
    static launch_result ref, r;
    uint64_t ref_hash = 0, hash = 0;
    snprintf(dump, sizeof dump, "%s/one_rank", base);
    one_rank(&c, dump);
    if (!run(&c, dump, &ref, &ref_hash)) {
        EXPECT(false, "the one-rank reference failed");
        return gt_test_finish();
    }
    EXPECT(one_rank_params > 0, "the one rank's output names no parameter count");
    static const char *const schedules[] = {"GPipe", "1F1B", "Interleaved1F1B", "ZBVZeroBubble",
                                            "DualPipeV"};
    double held[5] = {0};
    for (int k = 0; k < 5; k++) {
        snprintf(dump, sizeof dump, "%s/pp2_%s", base, schedules[k]);
        pipeline(&c, 2, 2, schedules[k], dump);
        if (run(&c, dump, &r, &hash)) {
            compare(dump + strlen(base) + 1, &ref, ref_hash, &r, hash);
            held[k] = state_of(dump, 2, 0.75);
        } else
            EXPECT(false, "%s failed", dump);
    }
    /* GPipe holds every micro-batch's activations before the first backward, 1F1B at most 2 */
    EXPECT(held[0] > held[1], "GPipe holds %.0f B over its actions, 1F1B %.0f: not more", held[0],
           held[1]);
    /* compile.memory_policy: full against one rank of the same policy, bitwise (recomputation
     * is exact), and against none of the same schedule, saving and holding less */
    static launch_result full_ref;
    uint64_t full_hash = 0;
    snprintf(dump, sizeof dump, "%s/one_rank_full", base);
    one_rank(&c, dump);
    launch_add(&c, "--compile.memory_policy=full");
    bool full_ok = run(&c, dump, &full_ref, &full_hash);
    EXPECT(full_ok, "the one-rank memory_policy full reference failed");
    /* 1F1B against none; ZBVZeroBubble (recomputation split between I and W) against the
     * default policy's run above (fewer runs: the launch tests share a 600 s limit) */
    static const char *const policy_schedules[2] = {"1F1B", "ZBVZeroBubble"};
    for (int k = 0; k < 2 && full_ok; k++) {
        char other[400], name[64];
        snprintf(other, sizeof other, "%s/pp2_%s%s", base, policy_schedules[k], k ? "" : "_none");
        for (int f = k; f < 2; f++) {
            snprintf(dump, sizeof dump, "%s/pp2_%s_%s", base, policy_schedules[k],
                     f ? "full" : "none");
            pipeline(&c, 2, 2, policy_schedules[k], dump);
            launch_add(&c, "--compile.memory_policy=%s", f ? "full" : "none");
            snprintf(name, sizeof name, "pp2 %s %s", policy_schedules[k], f ? "full" : "none");
            if (run(&c, dump, &r, &hash))
                compare(name, f ? &full_ref : &ref, f ? full_hash : ref_hash, &r, hash);
            else
                EXPECT(false, "%s failed", dump);
        }
        snprintf(name, sizeof name, "pp2 %s %s -> full", policy_schedules[k],
                 k ? "default" : "none");
        check_policy(name, other, dump);
    }

    snprintf(dump, sizeof dump, "%s/pp4_1F1B", base);
    pipeline(&c, 4, 4, "1F1B", dump);
    if (run(&c, dump, &r, &hash)) {
        compare("pp4_1F1B", &ref, ref_hash, &r, hash);
        state_of(dump, 4, 0.5);
    } else
        EXPECT(false, "%s failed", dump);

    /* compile on one rank: the first run saves every stage part's graph, the second loads its
     * own; both bitwise the one rank, and another schedule is refused naming the option */
    char art[512];
    snprintf(art, sizeof art, "%s/artifacts", base);
    static const char *const says[2] = {"stage parts on rank 0 in", "(not compiled here)"};
    for (int k = 0; k < 2; k++) {
        snprintf(dump, sizeof dump, "%s/pp2_1F1B_artifact%d", base, k);
        pipeline(&c, 2, 2, "1F1B", dump);
        launch_add(&c, "--compile.precompile_artifact_dir=%s", art);
        if (run(&c, dump, &r, &hash)) {
            compare(k ? "pp2 1F1B loaded" : "pp2 1F1B compiled", &ref, ref_hash, &r, hash);
            char out_path[600];
            snprintf(out_path, sizeof out_path, "%s.txt", dump);
            char *out = read_all(out_path, NULL);
            EXPECT(out && strstr(out, says[k]) && (k == 0 || !strstr(out, says[0])),
                   "%s: no \"%s\" line", dump, says[k]);
            free(out);
        } else
            EXPECT(false, "%s failed", dump);
    }
    char art_file[600];
    snprintf(art_file, sizeof art_file, "%s/pp_stage1_W.graph", art);
    EXPECT(access(art_file, R_OK) == 0, "no artifact %s", art_file);
    {
        char extra[600];
        snprintf(extra, sizeof extra, "--compile.precompile_artifact_dir=%s", art);
        refused(base, "artifact_of_1F1B", 2, "GPipe", extra, NULL,
                "'parallelism.pipeline_parallel_schedule = \"GPipe\"'");
        /* the parts hold what the memory policy recomputed: another policy compiles others */
        refused(base, "artifact_of_default", 2, "1F1B", extra, "--compile.memory_policy=full",
                "'compile.memory_policy = \"full\"'");
    }

    /* pp 2 x dp_shard 2 against dp_shard 2 accumulating the same 4 micro-batches a rank */
    static launch_result dp_ref;
    uint64_t dp_hash = 0;
    snprintf(dump, sizeof dump, "%s/dp_shard2", base);
    common(&c, 2, dump);
    launch_add(&c, "--training.local_batch_size=1");
    launch_add(&c, "--training.global_batch_size=8");
    launch_add(&c, "--parallelism.data_parallel_shard_degree=2");
    bool dp_ok = run(&c, dump, &dp_ref, &dp_hash);
    EXPECT(dp_ok, "the dp_shard 2 reference failed");
    snprintf(dump, sizeof dump, "%s/pp2_dp_shard2_1F1B", base);
    pipeline(&c, 4, 2, "1F1B", dump);
    launch_add(&c, "--parallelism.data_parallel_shard_degree=2");
    if (run(&c, dump, &r, &hash) && dp_ok) {
        compare("pp2 x dp_shard2 vs dp_shard2", &dp_ref, dp_hash, &r, hash);
        gathers_once(dump);
    } else
        EXPECT(false, "%s failed", dump);

    /* pp 2 x tp 2 against one rank: tp sums partial products in another order */
    snprintf(dump, sizeof dump, "%s/pp2_tp2_ZBVZeroBubble", base);
    pipeline(&c, 4, 2, "ZBVZeroBubble", dump);
    launch_add(&c, "--parallelism.tensor_parallel_degree=2");
    launch_add(&c, "--parallelism.data_parallel_shard_degree=1");
    if (run(&c, dump, &r, &hash)) {
        double d = launch_loss_diff(ref.steps, r.steps, 1, LAUNCH_STEPS), g = 0;
        for (int s = 1; s <= LAUNCH_STEPS; s++)
            g = fmax(g, launch_relative(ref.steps[s].grad_norm, r.steps[s].grad_norm));
        EXPECT(d <= 1e-5 && g <= 1e-5, "pp2 x tp2: loss differs by %.3g, grad norm by %.3g", d, g);
        char out_path[600];
        snprintf(out_path, sizeof out_path, "%s.txt", dump);
        char *out = read_all(out_path, NULL);
        check_programs("pp2 x tp2", out);
        free(out);
        printf("  %-30s loss 1..10 within %.2e, grad_norm within %.2e of one rank's\n",
               "pp2 x tp2 vs one rank", d, g);
    } else {
        EXPECT(false, "%s failed", dump);
    }

    /* resumes across layouts: pp 2 -> one rank, one rank -> pp 2 */
    char src[512];
    snprintf(src, sizeof src, "%s/pp2_1F1B", base);
    snprintf(dump, sizeof dump, "%s/resume_pp2_on_one_rank", base);
    EXPECT(launch_seed_dump(src, dump, 5), "cannot copy %s's step-5 checkpoint", src);
    one_rank(&c, dump);
    resumed("pp 2 -> one rank", &c, dump, &ref, 0);
    snprintf(dump, sizeof dump, "%s/resume_one_rank_on_pp2", base);
    EXPECT(launch_seed_dump(ref.dump, dump, 5), "cannot copy the one rank's step-5 checkpoint");
    pipeline(&c, 2, 2, "ZBVZeroBubble", dump);
    resumed("one rank -> pp 2 ZBV", &c, dump, &ref, 0);
    { /* the load, too, reads each rank's stages alone */
        char out_path[600];
        snprintf(out_path, sizeof out_path, "%s.txt", dump);
        char *out = read_all(out_path, NULL);
        check_state("one rank -> pp 2 ZBV", out, 2, 0.75);
        free(out);
    }
    /* pp 2 -> dp_shard 2 with the same 4 sequences a step (no accumulation: sums in another
     * order) */
    snprintf(dump, sizeof dump, "%s/resume_pp2_on_dp_shard2", base);
    EXPECT(launch_seed_dump(src, dump, 5), "cannot copy %s's step-5 checkpoint", src);
    common(&c, 2, dump);
    launch_add(&c, "--training.local_batch_size=2");
    launch_add(&c, "--parallelism.data_parallel_shard_degree=2");
    resumed("pp 2 -> dp_shard 2", &c, dump, &ref, 1e-5);

    /* bad input, on every rank */
    refused(base, "bad_schedule", 2, "Looped1F1B", NULL, NULL, "pipeline_parallel_schedule");
    refused(base, "bad_layers", 2, "Interleaved1F1B",
            "--parallelism.pipeline_parallel_layers_per_stage=3", NULL,
            "pipeline_parallel_layers_per_stage = 3");
    refused(base, "few_micro_batches", 2, "DualPipeV", "--training.local_batch_size=2", NULL,
            "DualPipeV needs at least as many micro-batches as stages");
    refused(base, "micro_batch_size", 2, "1F1B",
            "--parallelism.pipeline_parallel_microbatch_size=3", NULL,
            "pipeline_parallel_microbatch_size = 3");
    refused(base, "not_a_multiple", 4, "1F1B", NULL, NULL,
            "pipeline_parallel_degree = 3 but 4 processes were launched, not a multiple");
    launch_end(base);
    return gt_test_finish();
}
