/* test_comm_report_launch.c — --metrics.comm_report under mpiexec (issue 7 item 3 on the CPU).
 *
 * FSDP2xTP2 on test_tiny with the report on: rank 0 prints one line per collective of step 2,
 * as many as the collective schedule it logged before step 1 ("collective schedule: N
 * collectives per step"); every line has 0 <= exposed <= total; the per-kind totals add up to
 * the number of lines; each line's least-most exposed time over the 4 ranks contains rank 0's,
 * the rank of the most is one of the run's, and ranks 1-3 each get a line of their exposed time;
 * and the run's losses are bitwise those of the same run without the report
 * (timing changes nothing it computes). */
#include "launch.h" /* first: train_child.h defines _GNU_SOURCE */

#define RANKS 4 /* FSDP2xTP2 */

static int run(const char *base, const char *name, bool report, char *out_path, size_t n,
               char *dump, size_t dn)
{
    static const launch_layout l = {"FSDP2xTP2", 1, 2, 2};
    launch_temp_dir(dump, dn, base, name);
    snprintf(out_path, n, "%s.log", dump);
    launch_cmd c;
    launch_layout_run(&c, &l, "test_tiny", dump, LAUNCH_STEPS);
    if (report) launch_add(&c, "--metrics.comm_report=true");
    double secs = 0;
    int rc = launch_run(&c, out_path, 240.0, &secs);
    if (rc != 0) launch_show_tail(out_path);
    return rc;
}

int main(void)
{
    char base[256];
    if (!launch_begin(base, sizeof base, "gt_comm_report_launch")) return 1;
    char out_a[700], out_b[700], dump_a[600], dump_b[600];
    EXPECT(run(base, "report", true, out_a, sizeof out_a, dump_a, sizeof dump_a) == 0,
           "run with the report failed");
    EXPECT(run(base, "plain", false, out_b, sizeof out_b, dump_b, sizeof dump_b) == 0,
           "run without the report failed");

    char *text = read_all(out_a, NULL);
    launch_comm_report rep;
    launch_read_comm_report(text, &rep);
    int bad = 0, bad_ranks = 0;
    for (int k = 0; k < rep.n_rows; k++) {
        const launch_report_row *row = &rep.rows[k];
        EXPECT(row->index == k, "line %d has index %d", k, row->index);
        bad += !(row->exposed >= 0 && row->exposed <= row->total + 1e-6 && row->bytes > 0);
        /* every rank's exposed time: rank 0's among them (exactly: the report prints all of
         * them from the same gathered values), the most at a rank of the run, and rank 0's own
         * figure where the most is rank 0's */
        bad_ranks +=
            !(row->lo >= 0 && row->lo <= row->exposed && row->exposed <= row->hi && row->at >= 0 &&
              row->at < RANKS && (row->at != 0 || row->hi == row->exposed));
    }
    EXPECT(bad_ranks == 0, "%d lines whose least-most exposed over ranks leaves out rank 0's",
           bad_ranks);
    EXPECT(rep.rank_lines == RANKS - 1, "%d 'rank R: exposed' lines for %d ranks", rep.rank_lines,
           RANKS);
    EXPECT(rep.scheduled > 0 && rep.listed == rep.scheduled && rep.n_rows == rep.scheduled,
           "schedule %d collectives, report header %d, %d lines", rep.scheduled, rep.listed,
           rep.n_rows);
    EXPECT(rep.totals == rep.n_rows, "per-kind totals %d vs %d lines", rep.totals, rep.n_rows);
    EXPECT(bad == 0, "%d lines with exposed outside [0, total] or no bytes", bad);
    launch_comm_report_free(&rep);
    free(text);

    gt_metrics_log a = {0}, b = {0};
    if (read_metrics(dump_a, &a) && read_metrics(dump_b, &b)) {
        EXPECT(a.n_steps == b.n_steps && a.n_steps == LAUNCH_STEPS, "records %d and %d",
               (int)a.n_steps, (int)b.n_steps);
        for (int64_t k = 0; k < a.n_steps && k < b.n_steps; k++)
            EXPECT(a.steps[k].loss == b.steps[k].loss, "step %lld loss differs with the report",
                   (long long)a.steps[k].step);
    }
    gt_metrics_log_free(&a);
    gt_metrics_log_free(&b);
    launch_end(base);
    return gt_test_finish();
}
