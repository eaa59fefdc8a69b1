/* test_resume_launch.c — a checkpoint written by one layout resumes in any other (issue 5,
 * acceptance).
 *
 * Checkpoints hold whole tensors whatever the layout that wrote them, and every rank reads the
 * whole tensors and keeps its block, so:
 *   - the step-5 checkpoint of an FSDP2xTP2 run (4 ranks) resumed as FSDP4 (4 ranks) and as one
 *     rank trains steps 6..10 with losses within 1e-6 relative of the uninterrupted one-rank
 *     run's steps 6..10 (the layouts differ only in summation order);
 *   - the other way, one rank's step-5 checkpoint resumed as FSDP2xTP2 does the same;
 *   - the checkpoint's manifest records the layout that saved it (informational), and the resumed
 *     run says it trained steps 6..10.
 * The resumed runs start from a copy of the one checkpoint (a fresh dump folder holding only
 * step-5), with the same config as the run that wrote it (the lr schedule spans 10 steps), and
 * read it in pieces of 1000 bytes (GT_CKPT_READ_PIECE_BYTES). */
#include "launch.h" /* first: train_child.h defines _GNU_SOURCE */

#define RUN_SECONDS 240.0
#define LOSS_TOLERANCE 1e-6

static const launch_layout fsdp2_tp2 = {"FSDP2xTP2", 1, 2, 2};
static const launch_layout fsdp4 = {"FSDP4", 1, 4, 1};

/* Runs layout l (NULL: one rank) into dump (created by the caller), its output into DUMP.txt
 * and *out. Returns the exit code. */
static int run(const launch_layout *l, const char *dump, char **out)
{
    launch_cmd c;
    char out_path[600];
    snprintf(out_path, sizeof out_path, "%s.txt", dump);
    launch_layout_run(&c, l, "test_tiny", dump, 5);
    double dt = 0;
    int rc = launch_run(&c, out_path, RUN_SECONDS, &dt);
    *out = read_all(out_path, NULL);
    printf("%-40s exit %d, %.1f s\n", dump, rc, dt);
    if (rc != 0) launch_show_tail(out_path);
    return rc;
}

/* Resumes src_dump's step-5 checkpoint on layout l and compares steps 6..10 with ref. */
static void resume_and_compare(const char *base, const char *name, const char *src_dump,
                               const launch_layout *l, const gt_metrics_step *ref)
{
    char dump[512];
    snprintf(dump, sizeof dump, "%s/%s", base, name);
    remove_tree(dump);
    EXPECT(launch_seed_dump(src_dump, dump, 5), "%s: cannot copy the step-5 checkpoint", name);
    gt_metrics_step steps[LAUNCH_STEPS + 1];
    char *out = NULL;
    int rc = run(l, dump, &out);
    long long first = 0, last = 0;
    uint64_t hash = 0;
    EXPECT(rc == 0 && parse_summary(out, &first, &last, &hash) && first == 6 && last == 10,
           "%s: exit %d, trained %lld..%lld (expected 6..10)", name, rc, first, last);
    bool have = launch_resumed_records(dump, steps);
    EXPECT(have, "%s: metrics.jsonl lacks steps 6..10 (or has steps 1..5)", name);
    if (have) {
        double d = launch_loss_diff(ref, steps, 6, LAUNCH_STEPS);
        EXPECT(d <= LOSS_TOLERANCE, "%s: steps 6..10 differ from the uninterrupted run by %.3g",
               name, d);
        printf("  %-38s steps 6..10 loss diff %.2e\n", name, d);
    }
    free(out);
}

int main(void)
{
    char base[256], ref_dump[400], tp_dump[400];
    if (!launch_begin(base, sizeof base, "gt_resume_launch")) return 1;
    /* every resume reads its blocks in pieces of 1000 bytes, on threads: a TP block's runs and
     * an FSDP block's rows split across pieces, and pieces across elements */
    setenv("GT_CKPT_READ_PIECE_BYTES", "1000", 1);

    /* the uninterrupted runs: one rank, and FSDP2xTP2 (checkpoints at 5 and 10) */
    gt_metrics_step ref[LAUNCH_STEPS + 1], tp[LAUNCH_STEPS + 1];
    char *out = NULL;
    launch_temp_dir(ref_dump, sizeof ref_dump, base, "one_rank");
    int rc = run(NULL, ref_dump, &out);
    free(out);
    bool ref_ok = rc == 0 && last_records(ref_dump, LAUNCH_STEPS, ref, NULL);
    EXPECT(ref_ok, "one-rank run: exit %d or missing metrics", rc);
    launch_temp_dir(tp_dump, sizeof tp_dump, base, "fsdp2_tp2");
    rc = run(&fsdp2_tp2, tp_dump, &out);
    free(out);
    EXPECT(rc == 0 && last_records(tp_dump, LAUNCH_STEPS, tp, NULL),
           "FSDP2xTP2 run: exit %d or missing metrics", rc);
    if (!ref_ok || rc != 0) return gt_test_finish();

    char manifest[600];
    snprintf(manifest, sizeof manifest, "%s/checkpoint/step-5/manifest.json", tp_dump);
    char *text = read_all(manifest, NULL);
    EXPECT(text && strstr(text, "\"saved_by_layout\": \"dp_shard 2 x tp 2\""),
           "the step-5 manifest does not record the saving layout");
    free(text);

    resume_and_compare(base, "fsdp2_tp2_to_fsdp4", tp_dump, &fsdp4, ref);
    resume_and_compare(base, "fsdp2_tp2_to_one_rank", tp_dump, NULL, ref);
    resume_and_compare(base, "one_rank_to_fsdp2_tp2", ref_dump, &fsdp2_tp2, ref);
    launch_end(base);
    return gt_test_finish();
}
