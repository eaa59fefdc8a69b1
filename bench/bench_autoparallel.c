/* bench_autoparallel.c — AutoParallel's solve time, from the global step graph to the layout
 * (gt_autopar_solve: classes, probes, CBC, the exact check against the hand plans), for llama3
 * flavors on a mesh, on the H100 cost model. The reference (meta-pytorch/autoparallel, PuLP + CBC)
 * takes 35-60 s for llama3 8B; issue 40's target is 5 s on one core.
 *
 *   bench_autoparallel [FLAVOR[:DP_SHARD:TP] ...]     (default: 8B:4:2 70B:4:2 405B:4:2)
 *
 * Prints per case: the graph build time, the solve time (wall and this process's CPU), the
 * probes, the ILP's size and CBC's time, and the chosen layout's modelled step time against both
 * hand plans'. Run it pinned to one core for the figure: taskset -c 0 bench_autoparallel.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "graphtrain/gt_autoparallel.h"
#include "graphtrain/gt_train.h"

static double cpu_seconds(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int bench(const char *flavor, int dps, int tp)
{
    char a_flavor[32], a_dps[16], a_tp[16];
    snprintf(a_flavor, sizeof a_flavor, "%s", flavor);
    snprintf(a_dps, sizeof a_dps, "%d", dps);
    snprintf(a_tp, sizeof a_tp, "%d", tp);
    char *argv[] = {"--model.flavor",
                    a_flavor,
                    "--training.seq_len",
                    "8192",
                    "--training.local_batch_size",
                    "1",
                    "--parallelism.data_parallel_shard_degree",
                    a_dps,
                    "--parallelism.tensor_parallel_degree",
                    a_tp,
                    "--compile.enable",
                    "false"};
    gt_config cfg;
    gt_config_defaults(&cfg);
    gt_error err = {0};
    gt_graph *g = gt_graph_new();
    gt_model model = {0};
    gt_train_layout layout;
    gt_autopar_result *r = NULL;
    double t0 = gt_now_seconds();
    gt_status st = gt_config_apply_overrides(&cfg, 12, argv, &err);
    if (st == GT_OK) st = gt_train_layout_init(&cfg, dps * tp, 0, &layout, &err);
    if (st == GT_OK) st = gt_train_build_global_graph(&cfg, &layout, g, &model, 1, &err);
    double t_build = gt_now_seconds() - t0;
    gt_parallel_plan plan = {.mesh = layout.mesh,
                             .sequence_parallel = cfg.parallelism.enable_sequence_parallel,
                             .fsdp_reshard_after_forward = true};
    gt_autopar_options o = {0};
    gt_sym_binding_entry entries[GT_TRAIN_BINDING_MAX];
    gt_sym_binding binding;
    gt_train_binding(&cfg, &layout, entries, &binding);
    o.binding = &binding;
    if (st == GT_OK) st = gt_autopar_device_default("h100", &o.device, &err);
    double w0 = gt_now_seconds(), c0 = cpu_seconds();
    if (st == GT_OK) st = gt_autopar_solve(g, &plan, &o, &r, &err);
    double wall = gt_now_seconds() - w0, cpu = cpu_seconds() - c0;
    if (st != GT_OK) {
        fprintf(stderr, "bench_autoparallel: %s: %s\n", flavor, err.msg);
    } else {
        printf("llama3 %-5s dp_shard %d x tp %d: %5d nodes, build %.3f s; solve %.3f s wall, %.3f "
               "s CPU (%d probes %.3f s, ILP %d x %d, CBC %.3f s); step %.1f ms (%s) vs FSDP "
               "%.1f ms, FSDP x TP %.1f ms\n",
               flavor, dps, tp, g->n_nodes, t_build, wall, cpu, r->n_probes, r->probe_s,
               r->n_columns, r->n_rows, r->ilp_s, 1e3 * r->cost.total_s, r->picked,
               1e3 * r->fsdp.total_s, r->has_fsdp_tp ? 1e3 * r->fsdp_tp.total_s : 0.0);
    }
    gt_autopar_free(r);
    gt_model_free(&model);
    gt_graph_free(g);
    gt_config_free(&cfg);
    return st == GT_OK ? 0 : 1;
}

int main(int argc, char **argv)
{
    static char *defaults[] = {"8B:4:2", "70B:4:2", "405B:4:2"};
    char **cases = argc > 1 ? argv + 1 : defaults;
    int n = argc > 1 ? argc - 1 : 3, rc = 0;
    for (int k = 0; k < n; k++) {
        char flavor[32] = {0};
        int dps = 4, tp = 2;
        if (sscanf(cases[k], "%31[^:]:%d:%d", flavor, &dps, &tp) < 1 || dps < 1 || tp < 1) {
            fprintf(stderr, "bench_autoparallel: '%s': expected FLAVOR[:DP_SHARD:TP]\n", cases[k]);
            return 2;
        }
        rc |= bench(flavor, dps, tp);
    }
    return rc;
}
