/* test_artifact_launch.c — compile on one rank (--compile.precompile_artifact_dir) under mpiexec.
 *
 * test_tiny, FSDP2 x TP2 (4 ranks), 10 steps, fp32:
 *   - reference: no artifact;
 *   - an empty artifact folder: rank 0 says it compiled the step and saved it, no other rank
 *     compiles, DIR/step.graph exists, and every step's loss and grad norm and the step-10
 *     checkpoint are bitwise the reference's;
 *   - the same folder again: rank 0 says it loaded the step, the same bits again;
 *   - the artifact with another training.seq_len asked: the run fails, naming the artifact and
 *     the option that differs, and trains nothing; one rank instead of four (the same local
 *     batch): fails naming the first parallelism option that differs;
 *   - one byte of the graph changed: fails, calling the file corrupt;
 *   - precompiled without MPI by `graphtrain graph` with the same options: the 4-rank run loads it,
 *     bitwise the reference;
 *   - gradient accumulation on one rank (two micro-batches per step; the artifact is the
 *     accumulation step, micro_step.graph, whose nodes' origins can name later nodes): saved, then
 *     loaded, both bitwise the run without an artifact; and precompiled by `graphtrain graph` with
 *     the run's options, then loaded, bitwise too.
 * The artifact is left as it was by every failing run (no overwrite).
 */
#include "launch.h" /* first: train_child.h defines _GNU_SOURCE */

#define RUN_SECONDS 240.0

static const launch_layout fsdp2_tp2 = {"FSDP2xTP2", 1, 2, 2};

/* A run into base/name with the artifact folder art (NULL: none) and extra (NULL: none). */
static int run(const char *base, const char *name, const launch_layout *l, const char *art,
               const char *extra, launch_result *r, char **out)
{
    launch_cmd c;
    char out_path[600];
    launch_temp_dir(r->dump, sizeof r->dump, base, name);
    snprintf(out_path, sizeof out_path, "%s.txt", r->dump);
    launch_layout_run(&c, l, "test_tiny", r->dump, LAUNCH_STEPS);
    if (art) launch_add(&c, "--compile.precompile_artifact_dir=%s", art);
    if (extra) launch_add(&c, "%s", extra);
    double dt = 0;
    int rc = launch_run(&c, out_path, RUN_SECONDS, &dt);
    r->ok = rc == 0 && last_records(r->dump, LAUNCH_STEPS, r->steps, NULL);
    *out = read_all(out_path, NULL);
    if (!*out) *out = calloc(1, 1);
    printf("%-12s exit %d, %.1f s\n", name, rc, dt);
    return rc;
}

static int count(const char *text, const char *needle)
{
    int n = 0;
    for (const char *p = text; (p = strstr(p, needle)); p++)
        n++;
    return n;
}

static void same_bits(const launch_result *a, const launch_result *b, const char *what)
{
    if (!a->ok || !b->ok) {
        EXPECT(false, "%s: a run failed", what);
        return;
    }
    bool same = false;
    int differ = launch_bitwise_diff(a, b, LAUNCH_STEPS, &same);
    EXPECT(differ == 0 && same, "%s: %d steps differ, checkpoints %s", what, differ,
           same ? "equal" : "differ");
    printf("  %-34s bitwise: %s\n", what, differ == 0 && same ? "yes" : "NO");
}

/* A run that must fail with `want` in its output and no step trained. */
static void refused(const char *base, const char *name, const launch_layout *l, const char *art,
                    const char *extra, const char *want)
{
    static launch_result r;
    char *out = NULL;
    int rc = run(base, name, l, art, extra, &r, &out);
    EXPECT(rc != 0 && strstr(out, want) && !strstr(out, "final loss"),
           "%s: exit %d, wanted a failure saying '%s'", name, rc, want);
    if (rc == 0 || !strstr(out, want)) fprintf(stderr, "---- output:\n%s\n----\n", out);
    free(out);
}

/* `graphtrain graph` with a run's options (layout l, NULL: one rank; extra) and
 * --compile.precompile_artifact_dir=art, without a launcher: it must say it wrote art/file. */
static void precompile(const char *base, const char *name, const launch_layout *l,
                       const char *extra, const char *art, const char *file)
{
    launch_cmd c;
    char out_path[600], dump[512];
    launch_temp_dir(dump, sizeof dump, base, name);
    snprintf(out_path, sizeof out_path, "%s.txt", dump);
    launch_layout_run_np(&c, l, 0, "test_tiny", dump, LAUNCH_STEPS);
    snprintf(c.buf[1], sizeof c.buf[1], "graph"); /* BINARY graph, no launcher */
    launch_add(&c, "--graph.print=false");
    if (extra) launch_add(&c, "%s", extra);
    launch_add(&c, "--compile.precompile_artifact_dir=%s", art);
    double dt = 0;
    int rc = launch_run(&c, out_path, RUN_SECONDS, &dt);
    char *text = read_all(out_path, NULL);
    EXPECT(rc == 0 && text && strstr(text, "artifact ") && strstr(text, file),
           "%s: graphtrain graph --compile.precompile_artifact_dir: exit %d, no %s named:\n%s",
           name, rc, file, text ? text : "");
    printf("%-12s exit %d, %.1f s\n", name, rc, dt);
    free(text);
}

int main(void)
{
    char base[256];
    if (!launch_begin(base, sizeof base, "gt_artifact_launch")) return 1;
    char art[400], file[450];
    snprintf(art, sizeof art, "%s/artifact", base);
    snprintf(file, sizeof file, "%s/step.graph", art);
    static launch_result ref, first, second;
    char *out = NULL;
    run(base, "reference", &fsdp2_tp2, NULL, NULL, &ref, &out);
    free(out);

    run(base, "compile", &fsdp2_tp2, art, NULL, &first, &out);
    EXPECT(count(out, "compiled the step on rank 0") == 1 && !strstr(out, "loaded the compiled"),
           "first run: rank 0 should say once that it compiled and saved the step");
    free(out);
    struct stat sb;
    EXPECT(stat(file, &sb) == 0 && sb.st_size > 0, "%s was not written", file);
    same_bits(&ref, &first, "compiled on rank 0 vs reference");

    run(base, "load", &fsdp2_tp2, art, NULL, &second, &out);
    EXPECT(count(out, "loaded the compiled step") == 1 && !strstr(out, "compiled the step on"),
           "second run: rank 0 should say once that it loaded the step");
    free(out);
    same_bits(&ref, &second, "loaded vs reference");

    size_t n = 0;
    char *bytes = read_all(file, &n);
    refused(base, "stale_seq", &fsdp2_tp2, art, "--training.seq_len=16", "training.seq_len = 32");
    refused(base, "one_rank", NULL, art, "--training.local_batch_size=2",
            "parallelism.data_parallel_shard_degree = 2");
    size_t m = 0;
    char *after = read_all(file, &m);
    EXPECT(bytes && after && n == m && !memcmp(bytes, after, n),
           "the failing runs changed the artifact");
    free(after);
    /* one byte of the graph text changed (past the headers) */
    if (bytes && n > 100) {
        bytes[n - 20] = bytes[n - 20] == 'x' ? 'y' : 'x';
        FILE *f = fopen(file, "wb");
        EXPECT(f && fwrite(bytes, 1, n, f) == n, "rewriting the artifact");
        if (f) fclose(f);
        refused(base, "corrupt", &fsdp2_tp2, art, NULL, "corrupt");
    }
    free(bytes);

    /* precompiled without MPI by `graphtrain graph` with the run's options, loaded by 4 ranks */
    char art3[400];
    snprintf(art3, sizeof art3, "%s/artifact_graph", base);
    precompile(base, "graph_cmd", &fsdp2_tp2, NULL, art3, "step.graph");
    static launch_result from_graph;
    run(base, "graph_load", &fsdp2_tp2, art3, NULL, &from_graph, &out);
    EXPECT(count(out, "loaded the compiled step") == 1,
           "the artifact of `graphtrain graph` should be loaded, not compiled again");
    free(out);
    same_bits(&ref, &from_graph, "precompiled by graphtrain graph vs reference");

    /* gradient accumulation (one rank): the accumulation step is the artifact
     * (micro_step.graph) */
    char art2[400];
    snprintf(art2, sizeof art2, "%s/artifact_accum", base);
    static launch_result accum_ref, accum_first, accum_second;
    const char *accum = "--training.global_batch_size=8";
    run(base, "accum_ref", NULL, NULL, accum, &accum_ref, &out);
    free(out);
    run(base, "accum_save", NULL, art2, accum, &accum_first, &out);
    EXPECT(count(out, "micro_step.graph") == 1 && count(out, "compiled the step on rank 0") == 1,
           "accumulation: rank 0 should say once that it compiled and saved micro_step.graph");
    free(out);
    run(base, "accum_load", NULL, art2, accum, &accum_second, &out);
    EXPECT(count(out, "loaded the compiled step") == 1, "accumulation: the second run should load");
    free(out);
    same_bits(&accum_ref, &accum_first, "accumulation, compiled vs reference");
    same_bits(&accum_ref, &accum_second, "accumulation, loaded vs reference");
    /* ... and precompiled by `graphtrain graph` with the run's options */
    char art4[400];
    snprintf(art4, sizeof art4, "%s/artifact_accum_graph", base);
    precompile(base, "graph_cmd_accum", NULL, accum, art4, "micro_step.graph");
    static launch_result accum_graph;
    run(base, "accum_graph_load", NULL, art4, accum, &accum_graph, &out);
    EXPECT(count(out, "loaded the compiled step") == 1,
           "accumulation: the artifact of `graphtrain graph` should be loaded, not compiled again");
    free(out);
    same_bits(&accum_ref, &accum_graph, "accumulation, precompiled by graphtrain graph vs reference");
    launch_end(base);
    return gt_test_finish();
}
