/* cmd_graph.c — `graphtrain graph`: build the whole-step graph, print it and a summary, and with
 * --graph.dump_dir write per rank the listing and Graphviz DOT (and SVG when `dot` is installed)
 * of the graph as built and as compiled, plus the pass pipeline's before/after listings.
 *
 * With parallelism degrees > 1 the printed graph is the SPMD graph every rank runs (rank
 * coordinates stay symbols; the summary and memory plan are rank 0's, or this rank's under
 * mpirun), and the dump also holds the global graph it came from (global.txt). Without mpirun it
 * is built for the configured mesh (data_parallel_shard_degree -1 counts as 1); under mpirun
 * every rank builds its own and dumps into DUMP_DIR/rank_R, and rank 0 prints. */
#include <dirent.h>
#include <errno.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "commands.h"
#include "graphtrain/gt_comm.h"
#include "graphtrain/gt_flops.h"
#include "graphtrain/gt_graph.h"
#include "graphtrain/gt_program.h"
#include "graphtrain/gt_train.h"

extern char **environ;

static int parse_bool(const char *name, const char *v, bool *out)
{
    if (!v) return 0;
    if (!strcmp(v, "true")) return *out = true, 0;
    if (!strcmp(v, "false")) return *out = false, 0;
    fprintf(stderr, "graphtrain graph: --%s=%s: expected true or false\n", name, v);
    return 1;
}

/* Runs `dot -Tsvg in -o out`; returns its exit status, or -1 when dot cannot be started. */
static int run_dot(const char *in, const char *out)
{
    char *argv[] = {"dot", "-Tsvg", (char *)in, "-o", (char *)out, NULL};
    pid_t pid;
    if (posix_spawnp(&pid, "dot", NULL, NULL, argv, environ) != 0) return -1;
    int status = 0;
    if (waitpid(pid, &status, 0) < 0) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* Graphs above this many nodes get no SVG unless --graph.svg true asks for it: dot takes minutes
 * on them (llama3 1B's step graph, ~1500 nodes: over 20 minutes). */
#define GT_GRAPH_SVG_AUTO_NODES 400

/* svg: 1 always, 0 never, -1 (--graph.svg not given) when the graph is small enough. */
static bool want_svg(const gt_graph *g, int svg)
{
    return svg >= 0 ? svg == 1 : g->n_nodes <= GT_GRAPH_SVG_AUTO_NODES;
}

/* DIR/STEM.txt, DIR/STEM.dot and, when want_svg and dot is installed, DIR/STEM.svg. */
static int write_graph_files(const gt_graph *g, const char *dir, const char *stem, int svg)
{
    char path[4096], dot_path[4096], svg_path[4096];
    snprintf(path, sizeof path, "%s/%s.txt", dir, stem);
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "graphtrain graph: cannot write %s: %s\n", path, strerror(errno));
        return 1;
    }
    gt_graph_print(g, f);
    fclose(f);
    snprintf(dot_path, sizeof dot_path, "%s/%s.dot", dir, stem);
    f = fopen(dot_path, "w");
    if (!f) {
        fprintf(stderr, "graphtrain graph: cannot write %s: %s\n", dot_path, strerror(errno));
        return 1;
    }
    gt_graph_write_dot(g, f, stem);
    fclose(f);
    if (!want_svg(g, svg)) {
        if (svg < 0)
            fprintf(stderr,
                    "graphtrain graph: %s graph has %d nodes (more than %d): no SVG, dot would "
                    "take minutes (--graph.svg true renders it anyway)\n",
                    stem, g->n_nodes, GT_GRAPH_SVG_AUTO_NODES);
        return 0;
    }
    snprintf(svg_path, sizeof svg_path, "%s/%s.svg", dir, stem);
    int rc = run_dot(dot_path, svg_path);
    if (rc < 0)
        fprintf(stderr,
                "graphtrain graph: `dot` (Graphviz) is not installed: wrote %s without "
                "an SVG\n",
                dot_path);
    else if (rc > 0)
        fprintf(stderr, "graphtrain graph: dot failed on %s (exit %d)\n", dot_path, rc);
    return 0;
}

/* An SVG beside every per-pass DOT file of dir (when dot is installed). */
static void render_pass_dots(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (n < 5 || strcmp(e->d_name + n - 4, ".dot") != 0) continue;
        char in[4600], out[4600];
        snprintf(in, sizeof in, "%s/%s", dir, e->d_name);
        snprintf(out, sizeof out, "%s/%.*s.svg", dir, (int)(n - 4), e->d_name);
        if (run_dot(in, out) < 0) break; /* dot is not installed: said once already */
    }
    closedir(d);
}

/* This process's rank and the world size under mpirun; 0 of 1 otherwise. */
static int world_of(int *rank, int *size)
{
    *rank = 0, *size = 1;
    if (!gt_train_launched_by_mpi() || !gt_comm_mpi_available()) return 0;
    gt_error err = {0};
    gt_comm *world = NULL;
    if (gt_comm_mpi_world(NULL, NULL, &world, &err) != GT_OK) {
        fprintf(stderr, "graphtrain graph: %s\n", err.msg);
        return 1;
    }
    *rank = gt_comm_rank(world);
    *size = gt_comm_size(world);
    gt_comm_destroy(world);
    return 0;
}

/* batch: the global batch; flops: one rank's; ranks: the mesh size (each rank computes about
 * 1/ranks of the step, so flops x ranks / tokens is the step's FLOPs per token). */
/* True when the graph's PARAM input named fqn plays the embedding's role. */
static bool is_embedding(const gt_graph *g, const char *fqn)
{
    for (int32_t k = 0; k < g->n_inputs; k++)
        if (g->inputs[k].kind == GT_IN_PARAM && !strcmp(gt_graph_str(g, g->inputs[k].fqn), fqn))
            return g->inputs[k].plan.role == GT_ROLE_EMBEDDING;
    return false;
}

static void print_summary(const gt_graph *g, const gt_model *model, const gt_model_config *mc,
                          int64_t batch, int64_t seq, int ranks, const gt_flops *flops,
                          double t_build, double t_verify)
{
    int64_t n_params = 0, n_embed = 0;
    for (int k = 0; k < model->n_params; k++) {
        const gt_param_spec *ps = &model->params[k];
        int64_t n = gt_shape_numel(ps->ndim, ps->shape);
        n_params += n;
        if (is_embedding(g, ps->fqn)) n_embed += n;
    }
    gt_model_info info;
    gt_model_info_of(mc, &info);
    int nodes_by_phase[3] = {0, 0, 0};
    for (int n = 0; n < g->n_nodes; n++)
        nodes_by_phase[g->nodes[n].phase % 3]++;
    double tokens = (double)batch * (double)seq / (double)ranks;
    /* torchtitan's MFU numerator per token: 6·N(non-embedding) + 12·L·H·Dh·S */
    /* a mixture of experts counts the parameters a token uses (torchtitan's active count) */
    int64_t n_matmul = (info.active_params > 0 ? info.active_params : n_params) - n_embed;
    double titan = 6.0 * (double)n_matmul + info.attention_flops_per_position * (double)seq;

    printf("\n# summary: %s %s, batch %lld x seq %lld\n", mc->family->name, mc->flavor,
           (long long)batch, (long long)seq);
    printf("nodes            %d (forward %d, backward %d, optimizer %d)\n", g->n_nodes,
           nodes_by_phase[0], nodes_by_phase[1], nodes_by_phase[2]);
    printf("values           %d\n", g->n_values);
    printf("parameters       %lld (%.3f B; %lld without the embedding)\n", (long long)n_params,
           (double)n_params / 1e9, (long long)(n_params - n_embed));
    if (info.active_params > 0)
        printf("active params    %lld (%.3f B) per token\n", (long long)info.active_params,
               (double)info.active_params / 1e9);
    printf("flops/step       %.4e (matmul %.4e, attention %.4e, other %.4e)\n", flops->total,
           flops->matmul, flops->attention, flops->other);
    printf("flops/step phase forward %.4e, backward %.4e, optimizer %.4e\n", flops->by_phase[0],
           flops->by_phase[1], flops->by_phase[2]);
    printf("model flops/tok  %.4e from the graph (matmul + attention); torchtitan's formula "
           "6N+12LHDS gives %.4e\n",
           (flops->matmul + flops->attention) / tokens, titan);
    printf("build            %.2f ms (forward + autodiff + optimizer + passes), verify %.2f ms\n",
           1e3 * t_build, 1e3 * t_verify);
}

int gt_cli_graph(const command_spec *cmd, split_args *sa)
{
    bool print = true, svg_on = false;
    const char *dump_dir = sa->local[1];
    if (parse_bool("graph.print", sa->local[0], &print) ||
        parse_bool("graph.svg", sa->local[2], &svg_on))
        return 1;
    int svg = sa->local[2] ? svg_on : -1; /* not given: by graph size (want_svg) */
    gt_config cfg;
    gt_model_config mcfg;
    if (gt_cli_resolve_config(cmd, sa, &cfg)) return 1;
    int rc = 1;
    gt_graph *g = gt_graph_new();
    gt_model model = {0};
    gt_error err = {0};
    char rank_dir[4096] = {0};
    int rank = 0, world = 1;
    gt_train_layout layout;
    FILE *explain = NULL;
    char *explain_text = NULL;
    size_t explain_len = 0;
    if (gt_cli_model_config(&cfg, &mcfg) || world_of(&rank, &world)) goto done;
    if (cfg.parallelism.pipeline_parallel_degree > 1) {
        /* the schedule and the stage split; the trainer does not run pipelines yet */
        if (rank == 0 && gt_train_pp_print(&cfg, &mcfg, stdout, &err) != GT_OK) {
            fprintf(stderr, "graphtrain graph: %s\n", err.msg);
            goto done;
        }
        if (rank == 0)
            printf("train            not wired yet: `graphtrain train` refuses "
                   "pipeline_parallel_degree > 1 (issue 39)\n");
        rc = 0;
        goto done;
    }
    /* without mpirun: the configured mesh, seen from rank 0 */
    if (gt_train_layout_init(&cfg, gt_train_launched_by_mpi() ? world : 0, rank, &layout, &err) !=
        GT_OK) {
        fprintf(stderr, "graphtrain graph: %s\n", err.msg);
        goto done;
    }
    bool parallel = gt_mesh_world_size(&layout.mesh) > 1;
    int64_t batch = gt_train_global_batch(&cfg, &layout), seq = cfg.training.seq_len, micro = 1;
    if (gt_train_micro_batches(&cfg, &layout, &micro, &err) != GT_OK) {
        fprintf(stderr, "graphtrain graph: %s\n", err.msg);
        goto done;
    }

    if (dump_dir) {
        snprintf(rank_dir, sizeof rank_dir, "%s/rank_%d", dump_dir, rank);
        if (gt_make_dirs(rank_dir, &err) != GT_OK) {
            fprintf(stderr, "graphtrain graph: %s\n", err.msg);
            goto done;
        }
    }
    double t0 = gt_now_seconds();
    bool compile = cfg.compile.enable;
    cfg.compile.enable = false; /* build as written first; the passes run below */
    /* the global graph (one rank's view of the global batch), then the SPMD graph */
    if (gt_train_build_global_graph(&cfg, &layout, g, &model, micro, &err) != GT_OK) {
        fprintf(stderr, "graphtrain graph: %s\n", err.msg);
        goto done;
    }
    double t_dump = gt_now_seconds();
    if (dump_dir && parallel && write_graph_files(g, rank_dir, "global", svg)) goto done;
    t_dump = gt_now_seconds() - t_dump;
    /* --compile.enable_autoparallel: the solver's explanation, printed after the summary */
    explain = cfg.compile.enable_autoparallel ? open_memstream(&explain_text, &explain_len) : NULL;
    gt_autopar_cost chosen = {0};
    if (gt_train_parallelize_explain(&cfg, &layout, g, explain, &chosen, &err) != GT_OK) {
        fprintf(stderr, "graphtrain graph: parallelize: %s\n", err.msg);
        goto done;
    }
    if (explain) fflush(explain);
    double t1 = gt_now_seconds();
    if (dump_dir && write_graph_files(g, rank_dir, "built", svg)) goto done;
    t_dump += gt_now_seconds() - t1; /* dumps are not part of the build time */
    if (compile) {
        char passes_dir[4200];
        snprintf(passes_dir, sizeof passes_dir, "%s/passes", rank_dir);
        gt_config compile_cfg; /* the autoparallel backend picks the memory policy and FSDP knobs */
        gt_train_autoparallel_compile_config(&cfg, &chosen, &compile_cfg);
        char line[1024];
        if (explain &&
            gt_train_autoparallel_describe(&cfg, &compile_cfg, &chosen, line, sizeof line)) {
            fprintf(explain, "%s\n", line);
            fflush(explain);
        }
        if (gt_train_compile_graph_layout(&compile_cfg, &layout, g, dump_dir ? passes_dir : NULL,
                                          &err) != GT_OK) {
            fprintf(stderr, "graphtrain graph: %s\n", err.msg);
            goto done;
        }
        double t2 = gt_now_seconds();
        if (dump_dir && write_graph_files(g, rank_dir, "compiled", svg)) goto done;
        /* the pass dumps are the size of the compiled graph */
        if (dump_dir && want_svg(g, svg)) render_pass_dots(passes_dir);
        t_dump += gt_now_seconds() - t2;
    }
    double t_build = gt_now_seconds() - t0 - t_dump;
    if (gt_graph_verify(g, &err) != GT_OK) {
        fprintf(stderr, "graphtrain graph: the built graph is invalid: %s\n", err.msg);
        goto done;
    }
    double t_verify = gt_now_seconds() - t0 - t_dump - t_build;
    /* --compile.precompile_artifact_dir: the compiled step saved for training runs to load */
    char *artifact = NULL;
    cfg.compile.enable = compile;
    if (rank == 0 && cfg.compile.precompile_artifact_dir[0]) {
        if (!compile) {
            fprintf(stderr, "graphtrain graph: compile.precompile_artifact_dir needs "
                            "compile.enable (the artifact is the compiled step)\n");
            goto done;
        }
        if (gt_train_precompile(&cfg, &layout, g, &artifact, &err) != GT_OK) {
            fprintf(stderr, "graphtrain graph: %s\n", err.msg);
            goto done;
        }
    }

    gt_sym_binding_entry entries[GT_TRAIN_BINDING_MAX];
    gt_sym_binding binding;
    gt_train_binding(&cfg, &layout, entries, &binding);
    gt_flops flops;
    if (gt_graph_count_flops(g, &binding, &flops, &err) != GT_OK) {
        fprintf(stderr, "graphtrain graph: %s\n", err.msg);
        goto done;
    }
    /* the memory plan: the peak is known before step 1 (planning allocates nothing) */
    double t2 = gt_now_seconds();
    gt_node_id *order = NULL;
    int32_t n_order = 0;
    gt_plan *plan = NULL;
    if (gt_schedule_build(g, &order, &n_order, &err) != GT_OK ||
        gt_plan_memory(g, &binding, order, n_order, NULL, &plan, &err) != GT_OK) {
        fprintf(stderr, "graphtrain graph: memory plan: %s\n", err.msg);
        free(order);
        goto done;
    }
    double t_plan = gt_now_seconds() - t2;
    free(order);
    if (rank == 0) {
        if (print) gt_graph_print(g, stdout);
        print_summary(g, &model, &mcfg, batch, seq, gt_mesh_world_size(&layout.mesh), &flops,
                      t_build, t_verify);
        if (micro > 1) {
            uint8_t *part = gt_xcalloc((size_t)g->n_nodes + 1, 1);
            int32_t n_part = gt_graph_micro_part(g, part);
            free(part);
            printf("micro-batches    %lld per step (gradient accumulation): the first %lld run "
                   "the micro-batch part, %d of the %d nodes (forward, backward, running "
                   "sums); the last runs the whole graph; the figures above are one micro-batch's "
                   "graph\n",
                   (long long)micro, (long long)micro - 1, n_part, g->n_nodes);
        }
        if (parallel) {
            char mesh[96];
            gt_mesh_format(&layout.mesh, mesh, sizeof mesh);
            printf("mesh             %s (%d ranks); figures below are rank %d's, flops per rank\n",
                   mesh, gt_mesh_world_size(&layout.mesh), rank);
        }
        printf("plan             %.2f ms (schedule + liveness + offsets)\n", 1e3 * t_plan);
        gt_plan_print(plan, stdout);
        if (explain_text && explain_len) fputs(explain_text, stdout);
    }
    gt_plan_free(plan);
    if (dump_dir && rank == 0)
        printf("dumps            %s/rank_*/ (%sbuilt, compiled, passes/)\n", dump_dir,
               parallel ? "global, " : "");
    if (artifact) printf("artifact         %s (the compiled step, for training runs)\n", artifact);
    free(artifact);
    rc = 0;
done:
    if (explain) fclose(explain);
    free(explain_text);
    return gt_cli_finish(rc, &model, g, &cfg);
}
