/* test_padded_launch.c — FSDP over a degree that does not divide the parameters' dim 0.
 *
 * Such a parameter is stored in ceil(D / n)-row blocks, the last ones padded with zero rows
 * (gt_placement.padded): gathers drop the padding, gradients are zero-padded before their
 * reduce-scatter, AdamW keeps the padding zero. Against one rank with the same global batch
 * (fp32, 10 steps, as test_layouts_launch.c):
 *   - test_odd (dim 72, ffn 249, vocab 301) on FSDP2: every parameter but the norms has an odd
 *     dim 0;
 *   - test_tiny (dim 64, ffn 192, vocab 256) on FSDP3, global batch 3: nothing divides by 3;
 * per-step losses within 1e-6 relative, step-10 parameters (gathered into whole tensors, padding
 * dropped) within 1e-5; a rerun is bitwise; and the FSDP3 step-5 checkpoint resumes on one rank
 * with the uninterrupted one-rank run's losses (padded blocks slice in and out of whole tensors).
 */
#include "launch.h" /* first: train_child.h defines _GNU_SOURCE */

static void run(const char *base, const char *name, const char *flavor, int np, int batch,
                int interval, const char *extra, launch_result *r, bool fresh)
{
    launch_cmd c;
    char out_path[600];
    if (fresh) launch_temp_dir(r->dump, sizeof r->dump, base, name);
    snprintf(out_path, sizeof out_path, "%s/output_%s.txt", r->dump, extra ? "resume" : "run");
    launch_train(&c, np);
    launch_common(&c, flavor, r->dump, interval);
    launch_add(&c, "--training.local_batch_size=%d", batch);
    if (np > 0) launch_add(&c, "--parallelism.data_parallel_shard_degree=%d", np);
    if (extra) launch_add(&c, "%s", extra);
    double dt = 0;
    int rc = launch_run(&c, out_path, 240.0, &dt);
    r->ok = rc == 0 && (extra ? launch_resumed_records(r->dump, r->steps)
                              : last_records(r->dump, LAUNCH_STEPS, r->steps, NULL));
    printf("%-24s %d rank(s): exit %d, %.1f s\n", name, np ? np : 1, rc, dt);
    EXPECT(r->ok, "%s: exit %d or missing metrics", name, rc);
    if (!r->ok) launch_show_tail(out_path);
}

static void compare(const launch_result *ref, const launch_result *r, const char *what)
{
    if (!ref->ok || !r->ok) return;
    double dl = launch_loss_diff(ref->steps, r->steps, 1, LAUNCH_STEPS);
    char a[700], b[700];
    launch_ckpt_path(a, sizeof a, ref->dump, LAUNCH_STEPS);
    launch_ckpt_path(b, sizeof b, r->dump, LAUNCH_STEPS);
    int missing = 0;
    double dp = launch_params_diff(a, b, &missing);
    printf("  %-22s loss diff %.2e, param diff %.2e\n", what, dl, dp);
    EXPECT(dl <= 1e-6, "%s: losses differ by %.3g relative", what, dl);
    EXPECT(dp >= 0 && dp <= 1e-5 && missing == 0, "%s: parameters differ by %.3g (%d missing)",
           what, dp, missing);
}

static void compare_bitwise(const launch_result *a, const launch_result *b, const char *what)
{
    if (!a->ok || !b->ok) return;
    int differ = 0;
    for (int s = 1; s <= LAUNCH_STEPS; s++)
        differ += a->steps[s].loss != b->steps[s].loss;
    char pa[700], pb[700];
    launch_ckpt_path(pa, sizeof pa, a->dump, LAUNCH_STEPS);
    launch_ckpt_path(pb, sizeof pb, b->dump, LAUNCH_STEPS);
    EXPECT(differ == 0 && same_bytes(pa, pb), "%s: %d losses differ or checkpoints differ", what,
           differ);
}

int main(void)
{
    char base[256];
    if (!launch_begin(base, sizeof base, "gt_padded_launch")) return 1;
    static launch_result ref, r, again, resumed;

    run(base, "odd_1rank", "test_odd", 0, 4, LAUNCH_STEPS, NULL, &ref, true);
    run(base, "odd_FSDP2", "test_odd", 2, 2, LAUNCH_STEPS, NULL, &r, true);
    compare(&ref, &r, "test_odd FSDP2");
    run(base, "odd_FSDP2_again", "test_odd", 2, 2, LAUNCH_STEPS, NULL, &again, true);
    compare_bitwise(&r, &again, "test_odd FSDP2 rerun");

    /* test_tiny on FSDP3 (global batch 3), checkpoints every 5 steps */
    run(base, "tiny_1rank", "test_tiny", 0, 3, 5, NULL, &ref, true);
    run(base, "tiny_FSDP3", "test_tiny", 3, 1, 5, NULL, &r, true);
    compare(&ref, &r, "test_tiny FSDP3");
    /* the FSDP3 run's step-5 checkpoint, resumed on one rank: steps 6..10 as the one-rank run */
    launch_temp_dir(resumed.dump, sizeof resumed.dump, base, "tiny_resume_1rank");
    char src[700], cmd[2400];
    snprintf(src, sizeof src, "%s/checkpoint", r.dump);
    snprintf(cmd, sizeof cmd, "mkdir -p '%s/checkpoint' && cp -r '%s/step-5' '%s/checkpoint/'",
             resumed.dump, src, resumed.dump);
    EXPECT(system(cmd) == 0, "copying the step-5 checkpoint");
    run(base, "tiny_resume_1rank", "test_tiny", 0, 3, 5, "--checkpoint.load_step=5", &resumed,
        false);
    if (ref.ok && resumed.ok) {
        double dl = launch_loss_diff(ref.steps, resumed.steps, 6, LAUNCH_STEPS);
        printf("  %-22s loss diff %.2e (steps 6..10)\n", "FSDP3 -> 1 rank resume", dl);
        EXPECT(dl <= 1e-6, "FSDP3 checkpoint resumed on one rank: losses differ by %.3g", dl);
    }
    launch_end(base);
    return gt_test_finish();
}
