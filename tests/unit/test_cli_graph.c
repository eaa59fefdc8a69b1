/* test_cli_graph.c — `graphtrain graph --graph.dump_dir DIR` as a child process.
 *
 *   1. llama3 1B (1795 nodes as built): without --graph.svg, the listings and DOT files are
 *      written, no SVG is attempted (Graphviz's dot takes over 20 minutes on a graph this size),
 *      and stderr says so, naming --graph.svg true.
 *   2. test_tiny (small): --graph.svg false writes no SVG; without the option an SVG is written
 *      exactly when `dot` is installed.
 *   3. --graph.svg with a value that is not a boolean is refused with a message naming it.
 *   4. gradient accumulation (global batch 4 x the local batch): the graph dumped is the one the
 *      trainer runs — its listing has the running sums (BUFFER grad_accum.<fqn>) — and the summary
 *      says 4 micro-batches; a global batch that is not a multiple is refused naming the option. */
#include "train_child.h" /* first: it defines _GNU_SOURCE for nftw */

#include "gt_test.h"

#define CHILD_SECONDS 300.0

static bool exists(const char *dir, const char *name)
{
    char path[600];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    struct stat st;
    return stat(path, &st) == 0 && st.st_size > 0;
}

static bool dot_installed(void)
{
    return system("dot -V > /dev/null 2>&1") == 0;
}

/* Runs `graphtrain graph --graph.print=false --graph.dump_dir=ROOT/NAME OPTIONS...`; returns the
 * exit code, stderr into *err_text (caller frees). */
static int run_graph(const char *binary, const char *root, const char *name,
                     const char *const *extra, int n_extra, char **err_text)
{
    char dump_opt[300], out_path[300], err_path[300];
    snprintf(dump_opt, sizeof dump_opt, "graph.dump_dir=%s/%s", root, name);
    snprintf(out_path, sizeof out_path, "%s/%s.out", root, name);
    snprintf(err_path, sizeof err_path, "%s/%s.err", root, name);
    const char *options[8] = {"graph.print=false", dump_opt};
    int n = 2;
    for (int k = 0; k < n_extra && n < 8; k++)
        options[n++] = extra[k];
    pid_t pid = spawn_graphtrain(binary, "graph", options, n, out_path, err_path);
    EXPECT(pid > 0, "fork failed");
    int rc = pid > 0 ? wait_child(pid, CHILD_SECONDS) : -1;
    *err_text = read_all(err_path, NULL);
    return rc;
}

int main(void)
{
    char root[] = "/tmp/gt_cli_graph_XXXXXX";
    const char *binary = train_child_start(root);
    EXPECT(binary, "no graphtrain program or no test folder (stderr says which)");
    if (!binary) return gt_test_finish();
    char dir[400], *err = NULL;

    /* 1. a large graph: no SVG unless asked */
    const char *big[] = {"model.flavor=1B"};
    int rc = run_graph(binary, root, "big", big, 1, &err);
    EXPECT(rc == 0, "graph 1B exited with %d:\n%s", rc, err ? err : "");
    snprintf(dir, sizeof dir, "%s/big/rank_0", root);
    EXPECT(exists(dir, "built.txt") && exists(dir, "built.dot") && exists(dir, "compiled.txt") &&
               exists(dir, "compiled.dot"),
           "graph 1B: listings and DOT files written in %s", dir);
    EXPECT(!exists(dir, "built.svg") && !exists(dir, "compiled.svg"),
           "graph 1B: no SVG without --graph.svg true");
    EXPECT(err && strstr(err, "no SVG") && strstr(err, "--graph.svg true"),
           "graph 1B: stderr says why there is no SVG and how to get one:\n%s", err ? err : "");
    free(err);

    /* 2. a small graph */
    const char *off[] = {"model.flavor=test_tiny", "graph.svg=false"};
    rc = run_graph(binary, root, "small_off", off, 2, &err);
    EXPECT(rc == 0, "graph test_tiny --graph.svg=false exited with %d:\n%s", rc, err ? err : "");
    snprintf(dir, sizeof dir, "%s/small_off/rank_0", root);
    EXPECT(exists(dir, "built.dot") && !exists(dir, "built.svg") && !exists(dir, "compiled.svg"),
           "graph test_tiny --graph.svg=false: DOT, no SVG");
    free(err);
    const char *dflt[] = {"model.flavor=test_tiny"};
    rc = run_graph(binary, root, "small", dflt, 1, &err);
    EXPECT(rc == 0, "graph test_tiny exited with %d:\n%s", rc, err ? err : "");
    snprintf(dir, sizeof dir, "%s/small/rank_0", root);
    bool dot = dot_installed();
    EXPECT(exists(dir, "compiled.svg") == dot, "graph test_tiny: SVG written %s dot is installed",
           dot ? "since" : "although no");
    EXPECT(!err || !strstr(err, "no SVG"), "graph test_tiny: no size note:\n%s", err ? err : "");
    printf("dot installed: %s\n", dot ? "yes" : "no");
    free(err);

    /* 3. a bad value */
    const char *bad[] = {"model.flavor=test_tiny", "graph.svg=maybe"};
    rc = run_graph(binary, root, "bad", bad, 2, &err);
    EXPECT(rc != 0 && err && strstr(err, "graph.svg") && strstr(err, "expected true or false"),
           "graph --graph.svg=maybe refused naming the option (exit %d):\n%s", rc, err ? err : "");
    free(err);

    /* 4. gradient accumulation */
    const char *accum[] = {"model.flavor=test_tiny", "graph.svg=false", "training.local_batch_size=2",
                           "training.global_batch_size=8"};
    rc = run_graph(binary, root, "accum", accum, 4, &err);
    EXPECT(rc == 0, "graph with accumulation exited with %d:\n%s", rc, err ? err : "");
    free(err);
    char path[600];
    snprintf(path, sizeof path, "%s/accum/rank_0/compiled.txt", root);
    char *listing = read_all(path, NULL);
    EXPECT(listing && strstr(listing, "grad_accum.tok_embeddings.weight"),
           "accumulation: the listing %s has the running sums", path);
    free(listing);
    snprintf(path, sizeof path, "%s/accum.out", root);
    char *out = read_all(path, NULL);
    EXPECT(out && strstr(out, "micro-batches    4 per step"),
           "accumulation: the summary says 4 micro-batches:\n%s", out ? out : "");
    free(out);
    const char *odd[] = {"model.flavor=test_tiny", "training.local_batch_size=2",
                         "training.global_batch_size=7"};
    rc = run_graph(binary, root, "odd", odd, 3, &err);
    EXPECT(rc != 0 && err && strstr(err, "training.global_batch_size"),
           "graph with global batch 7 over local 2 refused naming the option (exit %d):\n%s", rc,
           err ? err : "");
    free(err);

    remove_tree(root);
    return gt_test_finish();
}
