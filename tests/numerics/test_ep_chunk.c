/* test_ep_chunk.c — the EP chunking pass against eager chunking (issue 38), on one rank.
 *
 * DeepSeek-V3 test_dsv3_tiny (and its sigmoid-routing twin) on the CPU, batch 4 x 32, 4 steps,
 * `graphtrain train` as a child process. For each chunking — each MoE block along the batch
 * (module_fqn layers.*), each MoE along the batch, each MoE along the sequence (layers.*.moe) —
 * bit for bit (every step's loss and grad_norm, the final params hash with the expert biases):
 *   - f32: the pass (strategy graph) with early gradient accumulation off against the model
 *     built once per chunk (strategy eager); early accumulation on against off (in f32 no cast
 *     separates the two places where the chunks' gradients can be added);
 *   - bf16: graph with early accumulation off against eager. Early accumulation on adds the
 *     chunks' gradients in bf16 before the shared cast (numerics-changing, as torchtitan's
 *     optimize_grad_live_out): every step's loss within 1e-3 relative of early off;
 *   - chunked against unchunked: step 1's loss bitwise (every token's forward is the same
 *     arithmetic; the later steps differ: each weight gradient is then a sum of two products);
 *   - graph against eager under memory_policy full and under gradient accumulation (2
 *     micro-batches of 4);
 *   - the chunked step compiled and saved as an artifact, and loaded from it, against direct
 *     compilation (the loading run must say it loaded it).
 * Bad input: a module_fqn other than the two, seq chunks of whole blocks, a model without MoE, a
 * local batch of one row under batch chunks — each an error naming the option. */
#include "train_child.h" /* first: it defines _GNU_SOURCE */

#include <math.h>

#include "gt_test.h"

#define STEPS 4
#define MAX_OPTS 24

typedef struct {
    gt_metrics_step rec[STEPS + 1];
    uint64_t hash;
    bool ok;
} run_result;

static int g_runs;

/* One run of flavor with the options in extra (NULL-terminated). */
static run_result run(const char *binary, const char *root, const char *flavor, bool bf16,
                      const char *const *extra)
{
    run_result r = {.ok = false};
    char dump[400], fl[80];
    snprintf(dump, sizeof dump, "%s/run%d", root, g_runs++);
    snprintf(fl, sizeof fl, "model.flavor=%s", flavor);
    const char *opts[MAX_OPTS] = {"model.name=deepseek_v3",
                                  fl,
                                  bf16 ? "training.mixed_precision_param=bfloat16"
                                       : "training.mixed_precision_param=float32",
                                  "training.local_batch_size=4",
                                  "training.seq_len=32",
                                  "training.steps=4",
                                  "optimizer.lr=1e-2",
                                  "job.print_config=false",
                                  "metrics.log_freq=1"};
    int n = 9;
    for (int k = 0; extra && extra[k] && n < MAX_OPTS; k++)
        opts[n++] = extra[k];
    char *out = NULL;
    int rc = train_child_run(binary, opts, n, dump, 300, &out);
    long long first, last;
    bool parsed = rc == 0 && parse_summary(out, &first, &last, &r.hash);
    EXPECT(parsed, "%s run %d: exit %d, no summary line", flavor, g_runs - 1, rc);
    if (!parsed) train_child_show_tail(out);
    free(out);
    r.ok = parsed && last_records(dump, STEPS, r.rec, NULL);
    return r;
}

static void same(const char *what, const run_result *a, const run_result *b)
{
    if (!a->ok || !b->ok) return;
    bool eq = a->hash == b->hash;
    for (int s = 1; s <= STEPS; s++)
        eq = eq && a->rec[s].loss == b->rec[s].loss && a->rec[s].grad_norm == b->rec[s].grad_norm;
    EXPECT(eq, "%s: not bitwise (hash %016llx vs %016llx, final loss %.17g vs %.17g)", what,
           (unsigned long long)a->hash, (unsigned long long)b->hash, a->rec[STEPS].loss,
           b->rec[STEPS].loss);
    printf("  %-64s %s\n", what, eq ? "bitwise" : "DIFFERENT");
}

/* The options of one chunking (module, dim) with a strategy and the early flag. */
static void chunk_opts(const char **o, const char *module, const char *dim, const char *strategy,
                       bool early)
{
    static char m[64], d[64], s[64];
    snprintf(m, sizeof m, "compile.ep_overlap.module_fqn=%s", module);
    snprintf(d, sizeof d, "compile.ep_overlap.chunk_dim=%s", dim);
    snprintf(s, sizeof s, "compile.ep_overlap.strategy=%s", strategy);
    o[0] = "compile.ep_overlap.enabled=true";
    o[1] = m;
    o[2] = d;
    o[3] = s;
    o[4] = early ? "compile.ep_overlap.disable_early_grad_accumulation=false"
                 : "compile.ep_overlap.disable_early_grad_accumulation=true";
    o[5] = NULL;
}

static void check_chunking(const char *binary, const char *root, const char *flavor,
                           const char *module, const char *dim, const run_result *plain32)
{
    const char *o[8];
    char what[160];
    chunk_opts(o, module, dim, "eager", false);
    run_result eager = run(binary, root, flavor, false, o);
    chunk_opts(o, module, dim, "graph", false);
    run_result graph = run(binary, root, flavor, false, o);
    chunk_opts(o, module, dim, "graph", true);
    run_result early = run(binary, root, flavor, false, o);
    snprintf(what, sizeof what, "%s f32 %s x %s: graph vs eager", flavor, module, dim);
    same(what, &graph, &eager);
    snprintf(what, sizeof what, "%s f32 %s x %s: early accumulation on vs off", flavor, module,
             dim);
    same(what, &early, &graph);
    if (graph.ok && plain32->ok)
        EXPECT(graph.rec[1].loss == plain32->rec[1].loss,
               "%s %s x %s: step 1 loss %.17g chunked vs %.17g unchunked", flavor, module, dim,
               graph.rec[1].loss, plain32->rec[1].loss);

    chunk_opts(o, module, dim, "eager", false);
    run_result eager16 = run(binary, root, flavor, true, o);
    chunk_opts(o, module, dim, "graph", false);
    run_result graph16 = run(binary, root, flavor, true, o);
    chunk_opts(o, module, dim, "graph", true);
    run_result early16 = run(binary, root, flavor, true, o);
    snprintf(what, sizeof what, "%s bf16 %s x %s: graph vs eager", flavor, module, dim);
    same(what, &graph16, &eager16);
    for (int s = 1; s <= STEPS && early16.ok && graph16.ok; s++) {
        double a = early16.rec[s].loss, b = graph16.rec[s].loss;
        EXPECT(fabs(a - b) <= 1e-3 * fabs(b), "%s bf16 %s x %s: step %d loss %.9g early vs %.9g",
               flavor, module, dim, s, a, b);
    }
}

static void check_bad(const char *binary, const char *root)
{
    struct {
        const char *opts[4];
        const char *expect;
    } cases[] = {
        {{"compile.ep_overlap.enabled=true", "compile.ep_overlap.module_fqn=layers.*.attention"},
         "compile.ep_overlap.module_fqn"},
        {{"compile.ep_overlap.enabled=true", "compile.ep_overlap.chunk_dim=seq"},
         "compile.ep_overlap.chunk_dim = seq"},
        {{"compile.ep_overlap.enabled=true", "model.name=llama3", "model.flavor=test_tiny"},
         "has no MoE block"},
        {{"compile.ep_overlap.enabled=true", "training.local_batch_size=1"},
         "training.local_batch_size = 1 cannot be cut"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char dump[400];
        snprintf(dump, sizeof dump, "%s/bad%zu", root, k);
        const char *opts[8] = {"model.name=deepseek_v3", "model.flavor=test_dsv3_tiny",
                               "training.steps=1", "job.print_config=false"};
        int n = 4;
        for (int j = 0; j < 4 && cases[k].opts[j]; j++)
            opts[n++] = cases[k].opts[j];
        char *out = NULL;
        int rc = train_child_run(binary, opts, n, dump, 120, &out);
        EXPECT(rc != 0 && out && strstr(out, cases[k].expect),
               "bad case %zu: exit %d, no message with \"%s\"", k, rc, cases[k].expect);
        if (rc == 0 || !out || !strstr(out, cases[k].expect)) train_child_show_tail(out);
        free(out);
    }
}

int main(void)
{
    char root[] = "/tmp/gt_ep_chunk_XXXXXX";
    const char *binary = train_child_start(root);
    if (!binary) return 1;
    run_result plain = run(binary, root, "test_dsv3_tiny", false, NULL);
    check_chunking(binary, root, "test_dsv3_tiny", "layers.*", "batch", &plain);
    check_chunking(binary, root, "test_dsv3_tiny", "layers.*.moe", "batch", &plain);
    check_chunking(binary, root, "test_dsv3_tiny", "layers.*.moe", "seq", &plain);
    run_result plain_sig = run(binary, root, "test_dsv3_tiny_sigmoid", false, NULL);
    check_chunking(binary, root, "test_dsv3_tiny_sigmoid", "layers.*", "batch", &plain_sig);

    /* composed with full recomputation and with gradient accumulation */
    const char *o[10];
    const char *extra[][2] = {{"compile.memory_policy=full", "memory_policy full"},
                              {"training.global_batch_size=8", "2 micro-batches"}};
    for (int k = 0; k < 2; k++) {
        chunk_opts(o, "layers.*", "batch", "eager", false);
        o[5] = extra[k][0], o[6] = NULL;
        run_result eager = run(binary, root, "test_dsv3_tiny", false, o);
        chunk_opts(o, "layers.*", "batch", "graph", false);
        o[5] = extra[k][0], o[6] = NULL;
        run_result graph = run(binary, root, "test_dsv3_tiny", false, o);
        char what[160];
        snprintf(what, sizeof what, "test_dsv3_tiny f32 layers.* x batch, %s: graph vs eager",
                 extra[k][1]);
        same(what, &graph, &eager);
    }
    /* the chunked step precompiled (compile.precompile_artifact_dir): saved, then loaded */
    char dir[420], art[460];
    snprintf(dir, sizeof dir, "%s/artifact", root);
    snprintf(art, sizeof art, "compile.precompile_artifact_dir=%s", dir);
    chunk_opts(o, "layers.*.moe", "seq", "graph", true);
    run_result direct = run(binary, root, "test_dsv3_tiny", false, o);
    o[5] = art, o[6] = NULL;
    run_result saved = run(binary, root, "test_dsv3_tiny", false, o);
    char step[480];
    snprintf(step, sizeof step, "%s/step.graph", dir);
    struct stat sb;
    EXPECT(stat(step, &sb) == 0 && sb.st_size > 0, "%s: the artifact was not written", step);
    run_result loaded = run(binary, root, "test_dsv3_tiny", false, o);
    same("test_dsv3_tiny f32 layers.*.moe x seq: compiled and saved vs direct", &saved, &direct);
    same("test_dsv3_tiny f32 layers.*.moe x seq: artifact loaded vs direct", &loaded, &direct);
    check_bad(binary, root);
    remove_tree(root);
    return gt_test_finish();
}
