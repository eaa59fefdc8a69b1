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
 * Chunking the batch under data parallelism is refused naming the options (the global graph's
 * batch holds both ranks' rows). tests/unit/test_ep_overlap.c checks the interleaving itself. */
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

    launch_cmd c;
    launch_outcome o = {0};
    char out_path[700];
    launch_temp_dir(o.dump, sizeof o.dump, base, "batch_refused");
    snprintf(out_path, sizeof out_path, "%s/output.txt", o.dump);
    const char *b[] = {"--compile.ep_overlap.enabled=true", NULL};
    args(&c, o.dump, b);
    launch_run_outcome(&c, out_path, 120.0, &o);
    bool ok = true;
    LAUNCH_CHECK(o.rc > 0 && strstr(o.out, "compile.ep_overlap.chunk_dim = batch with 2 "
                                           "data-parallel ranks"),
                 "batch chunks on dp_shard 2: exit %d, expected the error naming the options",
                 o.rc);
    launch_outcome_free(&o, !ok);
    return gt_test_finish();
}
