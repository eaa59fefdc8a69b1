/* test_ep_chunk_launch.c — EP chunking and the overlap schedule on two ranks (issue 38; CPU, fp32,
 * mpiexec -np 2, dp_shard 2 x ep 2, test_dsv3_tiny, 5 steps).
 *
 * Each MoE chunked along the sequence (module_fqn layers.*.moe: every rank cuts its own
 * sequences), each pair bitwise (every step's loss and grad_norm, the final params hash with the
 * expert biases):
 *   - the chunking pass (strategy graph, early gradient accumulation off) against the model built
 *     once per chunk (strategy eager);
 *   - the overlap schedule on (the default pipeline) against off (compile.disable_passes
 *     ep_overlap): it only reorders;
 *   - early accumulation on against off (f32: no cast between the two places).
 * The batch chunked under data parallelism (each rank's own batch cut in two: regroup), for each
 * block (layers.*) and each MoE (layers.*.moe), early accumulation off, each pair bitwise:
 *   - graph against eager;
 *   - the overlap schedule on against off;
 *   - the chunked step saved as an artifact on rank 0 (compile.precompile_artifact_dir), then
 *     loaded by both ranks, against the direct compile.
 * tests/unit/test_ep_overlap.c checks the interleaving itself. */
#include "launch.h" /* first: train_child.h defines _GNU_SOURCE */

#define STEPS 5

typedef struct {
    launch_result r;
    char hash[32];
} run_out;

static void read_hash(const char *out_path, char *hash, size_t n)
{
    hash[0] = 0;
    char *text = read_all(out_path, NULL);
    const char *p = text ? strstr(text, "params xxh64 ") : NULL;
    if (p) snprintf(hash, n, "%.16s", p + strlen("params xxh64 "));
    free(text);
}

static void args(launch_cmd *c, const char *dump, const char *const *extra)
{
    launch_train(c, 2);
    launch_common(c, "test_dsv3_tiny", dump, 5);
    launch_add(c, "--model.name=deepseek_v3");
    launch_add(c, "--training.steps=%d", STEPS);
    launch_add(c, "--checkpoint.enable=false");
    launch_add(c, "--training.local_batch_size=2");
    launch_add(c, "--parallelism.data_parallel_shard_degree=2");
    launch_add(c, "--parallelism.expert_parallel_degree=2");
    for (int k = 0; extra[k]; k++)
        launch_add(c, "%s", extra[k]);
}

static void run(const char *base, const char *name, const char *const *extra, run_out *out)
{
    launch_cmd c;
    char out_path[700];
    launch_temp_dir(out->r.dump, sizeof out->r.dump, base, name);
    snprintf(out_path, sizeof out_path, "%s/output.txt", out->r.dump);
    args(&c, out->r.dump, extra);
    double dt = 0;
    int rc = launch_run(&c, out_path, 300.0, &dt);
    out->r.ok = rc == 0 && last_records(out->r.dump, STEPS, out->r.steps, NULL);
    read_hash(out_path, out->hash, sizeof out->hash);
    printf("%-22s exit %d, %.1f s, params xxh64 %s\n", name, rc, dt, out->hash);
    EXPECT(out->r.ok && out->hash[0], "%s: exit %d, metrics or hash missing", name, rc);
    if (!out->r.ok) launch_show_tail(out_path);
}

static void bitwise(const run_out *a, const run_out *b, const char *what)
{
    if (!a->r.ok || !b->r.ok) return;
    int differ = 0;
    for (int s = 1; s <= STEPS; s++)
        differ += a->r.steps[s].loss != b->r.steps[s].loss ||
                  a->r.steps[s].grad_norm != b->r.steps[s].grad_norm;
    printf("  %-48s %d step(s) differ; hashes %s %s\n", what, differ, a->hash, b->hash);
    EXPECT(differ == 0, "%s: %d steps' loss or grad_norm bits differ", what, differ);
    EXPECT(strcmp(a->hash, b->hash) == 0, "%s: final params hash %s vs %s", what, a->hash, b->hash);
}

#define CHUNK                                                                                      \
    "--compile.ep_overlap.enabled=true", "--compile.ep_overlap.module_fqn=layers.*.moe",           \
        "--compile.ep_overlap.chunk_dim=seq"

/* The batch chunks: every run cuts each rank's own two sequences in two, one per chunk. */
static void batch(const char *base)
{
    static run_out eager[2], graph[2], no_overlap[2], saved, loaded;
    static const char *const module[2] = {"layers.*", "layers.*.moe"};
    for (int m = 0; m < 2; m++) {
        char fqn[64], name[3][32], pair[96];
        snprintf(fqn, sizeof fqn, "--compile.ep_overlap.module_fqn=%s", module[m]);
        const char *e[] = {"--compile.ep_overlap.enabled=true", fqn,
                           "--compile.ep_overlap.strategy=eager",
                           "--compile.ep_overlap.disable_early_grad_accumulation=true", NULL};
        const char *g[] = {"--compile.ep_overlap.enabled=true", fqn,
                           "--compile.ep_overlap.disable_early_grad_accumulation=true", NULL};
        const char *n[] = {"--compile.ep_overlap.enabled=true", fqn,
                           "--compile.ep_overlap.disable_early_grad_accumulation=true",
                           "--compile.disable_passes=ep_overlap", NULL};
        const char *what = m ? "moe" : "block";
        snprintf(name[0], sizeof name[0], "batch_%s_eager", what);
        snprintf(name[1], sizeof name[1], "batch_%s_graph", what);
        snprintf(name[2], sizeof name[2], "batch_%s_no_overlap", what);
        run(base, name[0], e, &eager[m]);
        run(base, name[1], g, &graph[m]);
        run(base, name[2], n, &no_overlap[m]);
        snprintf(pair, sizeof pair, "dp_shard 2 x ep 2, %s x batch: graph vs eager", module[m]);
        bitwise(&graph[m], &eager[m], pair);
        snprintf(pair, sizeof pair, "dp_shard 2 x ep 2, %s x batch: overlap on vs off", module[m]);
        bitwise(&graph[m], &no_overlap[m], pair);
    }
    /* compile on one rank: saved by rank 0, then loaded by both */
    char art[600], opt[700], path[700];
    snprintf(art, sizeof art, "%s/artifact", base);
    snprintf(opt, sizeof opt, "--compile.precompile_artifact_dir=%s", art);
    const char *a[] = {"--compile.ep_overlap.enabled=true",
                       "--compile.ep_overlap.module_fqn=layers.*.moe",
                       "--compile.ep_overlap.disable_early_grad_accumulation=true", opt, NULL};
    run(base, "batch_saved", a, &saved);
    snprintf(path, sizeof path, "%s/step.graph", art);
    EXPECT(access(path, R_OK) == 0, "%s: the artifact was not written", path);
    run(base, "batch_loaded", a, &loaded);
    bitwise(&saved, &graph[1], "dp_shard 2 x ep 2, layers.*.moe x batch: saved vs direct");
    bitwise(&loaded, &graph[1], "dp_shard 2 x ep 2, layers.*.moe x batch: loaded vs direct");
}

int main(void)
{
    char base[256];
    if (!launch_begin(base, sizeof base, "gt_ep_chunk_launch")) return 1;
    static run_out eager, graph, no_overlap, early;
    const char *e[] = {CHUNK, "--compile.ep_overlap.strategy=eager",
                       "--compile.ep_overlap.disable_early_grad_accumulation=true", NULL};
    const char *g[] = {CHUNK, "--compile.ep_overlap.disable_early_grad_accumulation=true", NULL};
    const char *n[] = {CHUNK, "--compile.ep_overlap.disable_early_grad_accumulation=true",
                       "--compile.disable_passes=ep_overlap", NULL};
    const char *a[] = {CHUNK, NULL};
    run(base, "eager", e, &eager);
    run(base, "graph", g, &graph);
    run(base, "graph_no_overlap", n, &no_overlap);
    run(base, "graph_early", a, &early);
    bitwise(&graph, &eager, "dp_shard 2 x ep 2, moe x seq: graph vs eager");
    bitwise(&graph, &no_overlap, "dp_shard 2 x ep 2, moe x seq: overlap on vs off");
    bitwise(&early, &graph, "dp_shard 2 x ep 2, moe x seq: early accumulation");

    batch(base);
    return gt_test_finish();
}
