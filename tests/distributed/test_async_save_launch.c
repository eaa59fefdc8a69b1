/* test_async_save_launch.c — checkpoint.async_mode over several ranks.
 *
 * test_tiny on HSDP 2x2 (4 ranks: each block is held by two ranks, and only the first of them
 * writes it, so each rank's snapshot holds the blocks it writes) and on FSDP3 (3 ranks: padded
 * blocks), 10 steps, a checkpoint every 3 (steps 3, 6, 9 and the last, 10), saved in the step
 * loop and with async_mode = async. Checked: the two runs' losses and grad norms are the same bits,
 * and every checkpoint is byte for byte the same file; the async run's log says steps 3, 6 and 9
 * were saved in the background.
 */
#include "launch.h" /* first: train_child.h defines _GNU_SOURCE */

#define RUN_SECONDS 240.0
#define INTERVAL 3
_Static_assert(3 * INTERVAL < LAUNCH_STEPS, "saves at INTERVAL, 2 and 3 x INTERVAL and the end");

static void run(const char *base, const char *name, const launch_layout *l, bool async,
                launch_result *r, char **log)
{
    launch_cmd c;
    char out_path[600];
    launch_temp_dir(r->dump, sizeof r->dump, base, name);
    snprintf(out_path, sizeof out_path, "%s/output.txt", r->dump);
    launch_layout_run(&c, l, "test_tiny", r->dump, INTERVAL); /* global batch 4 (3: FSDP3) */
    if (async) launch_add(&c, "--checkpoint.async_mode=async");
    double dt = 0;
    int rc = launch_run(&c, out_path, RUN_SECONDS, &dt);
    r->ok = rc == 0 && last_records(r->dump, LAUNCH_STEPS, r->steps, NULL);
    printf("%-22s %d ranks: exit %d, %.1f s\n", name, launch_ranks(l), rc, dt);
    EXPECT(r->ok, "%s: exit %d or missing metrics", name, rc);
    if (!r->ok) launch_show_tail(out_path);
    *log = read_all(out_path, NULL);
}

static void check(const char *base, const launch_layout *l)
{
    static launch_result sync_run, async_run;
    char name[64], *sync_log = NULL, *async_log = NULL;
    snprintf(name, sizeof name, "%s_step_loop", l->name);
    run(base, name, l, false, &sync_run, &sync_log);
    snprintf(name, sizeof name, "%s_async", l->name);
    run(base, name, l, true, &async_run, &async_log);
    if (sync_run.ok && async_run.ok) {
        bool last_same = false;
        int differ = launch_bitwise_diff(&sync_run, &async_run, LAUNCH_STEPS, &last_same);
        EXPECT(differ == 0, "%s: %d steps with other loss or grad_norm bits", l->name, differ);
        static const int saved[] = {INTERVAL, 2 * INTERVAL, 3 * INTERVAL, LAUNCH_STEPS};
        int files = 0;
        for (int i = 0; i < 4; i++) {
            int s = saved[i];
            char a[700], b[700], line[64];
            launch_ckpt_path(a, sizeof a, sync_run.dump, s);
            launch_ckpt_path(b, sizeof b, async_run.dump, s);
            bool same = same_bytes(a, b);
            files += same;
            EXPECT(same, "%s: step-%d checkpoints differ (%s, %s)", l->name, s, a, b);
            snprintf(line, sizeof line, "saved step %d to ", s);
            const char *at = async_log ? strstr(async_log, line) : NULL;
            const char *eol = at ? strchr(at, '\n') : NULL;
            const char *bg = at ? strstr(at, "in the background") : NULL;
            bool in_background = bg && (!eol || bg < eol);
            EXPECT(at && in_background == (s < LAUNCH_STEPS), "%s: step %d should be saved %s",
                   l->name, s, s < LAUNCH_STEPS ? "in the background" : "in the step loop");
        }
        printf("  %-20s steps bitwise: %s, checkpoints the same: %d of 4\n", l->name,
               differ == 0 ? "yes" : "NO", files);
    }
    free(sync_log);
    free(async_log);
}

int main(void)
{
    char base[256];
    if (!launch_begin(base, sizeof base, "gt_async_save_launch")) return 1;
    static const launch_layout hsdp = {"HSDP2x2", 2, 2, 1}, fsdp3 = {"FSDP3", 1, 3, 1};
    check(base, &hsdp);
    check(base, &fsdp3);
    launch_end(base);
    return gt_test_finish();
}
