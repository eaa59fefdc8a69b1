/* test_safety_launch.c — a multi-rank run never hangs: every failure stops every rank, promptly,
 * with a message that says what went wrong (issue 5, acceptance).
 *
 *   - schedule mismatch: rank 2 of FSDP2xTP2 drops the first collective of its program
 *     (debug.test_drop_collective_rank, test-only). The cross-rank check before step 1 must stop
 *     all 4 ranks, each naming collective #0, before any step ran (no metrics record).
 *   - a dead rank: rank 2 of FSDP4 SIGKILLs itself at step 3 (debug.test_kill_rank_at_step).
 *     mpiexec must return non-zero within 60 s and its output name rank 2.
 *   - a hung rank: rank 1 SIGSTOPs itself at step 3 ("1:3:stop"); the others' collective waits
 *     time out (comm.train_timeout_seconds = 3) with a message naming the collective and the
 *     group; the job ends non-zero within 60 s. The same at step 1 under
 *     comm.init_timeout_seconds = 4 (the bound of setup and step 1).
 *   - rank 0 cannot write its checkpoint (the step-5 name is taken by a file): every rank stops
 *     with rank 0's message, after step 5 and before step 6.
 *   - wrong launches, refused on every rank before any work: a mesh of 4 ranks under
 *     `mpiexec -np 2` (the message says both numbers and how to launch), a mesh of 2 without
 *     mpiexec, a pipeline over that mesh (4 ranks) under `mpiexec -np 2`, a global batch the
 *     ranks' micro-batches do not tile. */
#include "launch.h" /* first: train_child.h defines _GNU_SOURCE */

#define BOUND_SECONDS 60.0

static const launch_layout fsdp2 = {"FSDP2", 1, 2, 1};
static const launch_layout fsdp4 = {"FSDP4", 1, 4, 1};
static const launch_layout fsdp2_tp2 = {"FSDP2xTP2", 1, 2, 2};

/* Runs layout l under `mpiexec -np np` (np < 0: the layout's ranks; 0: the binary alone) with
 * extra options ("--a=b", NULL-terminated); pre_file: a path inside the dump to create as a file
 * first (or NULL). */
static void run_case(const char *base, const char *name, const launch_layout *l, int np,
                     const char *const *extra, const char *pre_file, launch_outcome *o)
{
    launch_cmd c;
    char out_path[600];
    launch_temp_dir(o->dump, sizeof o->dump, base, name);
    snprintf(out_path, sizeof out_path, "%s.txt", o->dump);
    if (pre_file) {
        char path[800], dir[800];
        snprintf(path, sizeof path, "%s/%s", o->dump, pre_file);
        snprintf(dir, sizeof dir, "%s", path);
        *strrchr(dir, '/') = 0;
        mkdir(dir, 0777);
        FILE *f = fopen(path, "w");
        if (f) fclose(f);
    }
    launch_layout_run_np(&c, l, np >= 0 ? np : launch_ranks(l), "test_tiny", o->dump, 5);
    for (int k = 0; extra && extra[k]; k++)
        launch_add(&c, "%s", extra[k]);
    launch_run_outcome(&c, out_path, BOUND_SECONDS + 30, o);
    printf("%-22s exit %d after %.1f s, %d metrics records\n", name, o->rc, o->seconds, o->records);
}

static int count(const char *text, const char *needle)
{
    int n = 0;
    for (const char *p = text; (p = strstr(p, needle)); p += strlen(needle))
        n++;
    return n;
}

/* Every one of `ranks` ranks printed a failure line containing `needle`. */
static bool every_rank_says(const launch_outcome *o, int ranks, const char *needle)
{
    for (int r = 0; r < ranks; r++) {
        char head[64];
        snprintf(head, sizeof head, "graphtrain train (rank %d of %d): ", r, ranks);
        const char *line = strstr(o->out, head);
        const char *end = line ? strchr(line, '\n') : NULL;
        const char *hit = line ? strstr(line, needle) : NULL;
        if (!line || !hit || (end && hit > end)) return false;
    }
    return true;
}

int main(void)
{
    char base[256];
    if (!launch_begin(base, sizeof base, "gt_safety_launch")) return 1;
    launch_outcome o;
    { /* schedule mismatch */
        static const char *const x[] = {"--debug.test_drop_collective_rank=2", NULL};
        run_case(base, "schedule_mismatch", &fsdp2_tp2, -1, x, NULL, &o);
        bool ok = true;
        LAUNCH_CHECK(o.rc != 0 && o.seconds < BOUND_SECONDS, "mismatch: exit %d after %.1f s", o.rc,
                     o.seconds);
        LAUNCH_CHECK(every_rank_says(&o, 4, "first differing collective is #0"),
                     "mismatch: not every rank names collective #0");
        LAUNCH_CHECK(o.records == 0 && !strstr(o.out, "INFO step  1"), "mismatch: a step ran");
        launch_outcome_free(&o, !ok);
    }
    { /* a dead rank */
        static const char *const x[] = {"--debug.test_kill_rank_at_step=2:3", NULL};
        run_case(base, "killed_rank", &fsdp4, -1, x, NULL, &o);
        bool ok = true;
        LAUNCH_CHECK(o.rc != 0 && o.rc != -1 && o.seconds < BOUND_SECONDS,
                     "killed rank: exit %d after %.1f s", o.rc, o.seconds);
        /* named by someone other than rank 2 itself (its own "rank 2 kills itself" line does
         * not count): mpiexec's "process rank 2 ... exited on signal 9" */
        LAUNCH_CHECK(strstr(o.out, "process rank 2") != NULL,
                     "killed rank: nobody but rank 2 itself names rank 2");
        LAUNCH_CHECK(o.records <= 2, "killed rank: %d steps recorded", o.records);
        launch_outcome_free(&o, !ok);
    }
    /* a hung rank: the others time out, at step 3 after comm.train_timeout_seconds and at step 1
     * after comm.init_timeout_seconds; the other bound is set beyond BOUND_SECONDS, so a run that
     * applied the wrong one would not end in time */
    static const struct {
        const char *name, *stop, *init, *train, *within;
    } hung[] = {
        {"hung_rank", "1:3:stop", "--comm.init_timeout_seconds=600",
         "--comm.train_timeout_seconds=3", "did not complete within 3 s"},
        {"hung_rank_step1", "1:1:stop", "--comm.init_timeout_seconds=4",
         "--comm.train_timeout_seconds=600", "did not complete within 4 s"},
    };
    for (int h = 0; h < 2; h++) {
        char stop[64];
        snprintf(stop, sizeof stop, "--debug.test_kill_rank_at_step=%s", hung[h].stop);
        const char *const x[] = {stop, hung[h].init, hung[h].train, NULL};
        run_case(base, hung[h].name, &fsdp4, -1, x, NULL, &o);
        bool ok = true;
        LAUNCH_CHECK(o.rc != 0 && o.rc != -1 && o.seconds < BOUND_SECONDS,
                     "%s: exit %d after %.1f s", hung[h].name, o.rc, o.seconds);
        LAUNCH_CHECK(strstr(o.out, hung[h].within) && strstr(o.out, "world ranks 0,1,2,3"),
                     "%s: no timeout message naming the group and %s", hung[h].name,
                     hung[h].within);
        launch_outcome_free(&o, !ok);
    }
    { /* rank 0 cannot save: every rank stops with its message */
        run_case(base, "save_fails", &fsdp2, -1, NULL, "checkpoint/step-5", &o);
        bool ok = true;
        LAUNCH_CHECK(o.rc != 0 && o.seconds < BOUND_SECONDS, "save fails: exit %d after %.1f s",
                     o.rc, o.seconds);
        LAUNCH_CHECK(every_rank_says(&o, 2, "checkpoint save of step 5"),
                     "save fails: not every rank reports rank 0's failed save");
        LAUNCH_CHECK(count(o.out, "(rank 1 of 2): rank 0: ") == 1,
                     "save fails: rank 1 does not say the "
                     "error is rank 0's");
        LAUNCH_CHECK(o.records == 5, "save fails: %d steps recorded, expected 5", o.records);
        launch_outcome_free(&o, !ok);
    }
    { /* a mesh of 4 under -np 2 */
        run_case(base, "mesh_vs_world", &fsdp4, 2, NULL, NULL, &o);
        bool ok = true;
        LAUNCH_CHECK(o.rc != 0 &&
                         every_rank_says(&o, 2, "has 4 ranks but 2 processes were launched"),
                     "mesh 4 on 2 processes: exit %d", o.rc);
        LAUNCH_CHECK(strstr(o.out, "mpirun -np 4") != NULL,
                     "mesh 4 on 2 processes: no launch hint");
        launch_outcome_free(&o, !ok);
    }
    { /* a mesh of 2 without mpiexec */
        run_case(base, "no_launcher", &fsdp2, 0, NULL, NULL, &o);
        bool ok = true;
        LAUNCH_CHECK(o.rc != 0 && strstr(o.out, "has 2 ranks but 1 process was launched") &&
                         strstr(o.out, "mpirun -np 2"),
                     "mesh 2 without mpiexec: exit %d", o.rc);
        launch_outcome_free(&o, !ok);
    }
    { /* a pipeline of 2 over FSDP 2 needs 4 processes */
        static const char *const pp[] = {"--parallelism.pipeline_parallel_degree=2", NULL};
        run_case(base, "pipeline", &fsdp2, -1, pp, NULL, &o);
        bool ok = true;
        LAUNCH_CHECK(o.rc != 0 && every_rank_says(&o, 2, "do not make the 2 processes launched") &&
                         strstr(o.out, "mpirun -np 4"),
                     "pipeline degree 2: exit %d", o.rc);
        launch_outcome_free(&o, !ok);
        /* a global batch that the ranks' micro-batches do not tile */
        static const char *const acc[] = {"--training.global_batch_size=6", NULL};
        run_case(base, "accumulation", &fsdp2, -1, acc, NULL, &o);
        ok = true;
        LAUNCH_CHECK(o.rc != 0 && every_rank_says(&o, 2, "must be a multiple of local_batch_size"),
                     "global batch 6 on 2 ranks of 2: exit %d", o.rc);
        launch_outcome_free(&o, !ok);
    }
    launch_end(base);
    return gt_test_finish();
}
