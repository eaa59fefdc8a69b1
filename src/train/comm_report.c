/* comm_report.c — --metrics.comm_report: what each collective of one step cost and how much of
 * it the step waited for. The timings come from the executor (gt_program_comm_timings): total =
 * start posted to completion, exposed = time blocked in the wait. */
#include <stdio.h>

#include "graphtrain/gt_parallel.h"
#include "train_internal.h"

void gt_train_print_comm_report(const gt_comm_timing *t, int32_t n, double step_s, int rank,
                                FILE *f)
{
    double total = 0, exposed = 0;
    uint64_t bytes[GT_COLL_KIND_COUNT] = {0};
    int count[GT_COLL_KIND_COUNT] = {0};
    fprintf(f, "collective report (rank %d, one step): %d collectives\n", rank, (int)n);
    fprintf(f, "  %4s %-15s %-13s %12s %11s %11s %8s\n", "#", "kind", "mesh dim", "bytes",
            "total ms", "exposed ms", "exposed");
    for (int32_t k = 0; k < n; k++) {
        const gt_comm_timing *c = &t[k];
        fprintf(f, "  %4d %-15s %-13s %12llu %11.3f %11.3f %7.1f%%\n", (int)k,
                gt_coll_kind_name(c->kind), gt_mesh_dim_name(c->mesh_dim),
                (unsigned long long)c->bytes, 1e3 * c->total_s, 1e3 * c->exposed_s,
                c->total_s > 0 ? 100.0 * c->exposed_s / c->total_s : 0.0);
        total += c->total_s;
        exposed += c->exposed_s;
        if ((int)c->kind >= 0 && c->kind < GT_COLL_KIND_COUNT) {
            bytes[c->kind] += c->bytes;
            count[c->kind]++;
        }
    }
    for (int k = 0; k < GT_COLL_KIND_COUNT; k++)
        if (count[k])
            fprintf(f, "  total %-15s %4d collectives %14llu bytes\n",
                    gt_coll_kind_name((gt_coll_kind)k), count[k], (unsigned long long)bytes[k]);
    fprintf(f, "  communication %.3f ms (sum of start-to-completion times), exposed %.3f ms",
            1e3 * total, 1e3 * exposed);
    if (step_s > 0)
        fprintf(f, " = %.1f%% of the %.3f ms step", 100.0 * exposed / step_s, 1e3 * step_s);
    fprintf(f, "\n");
}
