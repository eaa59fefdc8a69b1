/* test_graph_serialize.c — the graph's text form (gt_graph_write / gt_graph_read,
 * src/ir/serialize.c), the base of precompiled step artifacts.
 *
 * Round trip: debugmodel's compiled training step on one rank, and on FSDP2 x TP2 (a mesh,
 * placements, collectives, bucketed FSDP), is written, read back and
 *   - its listing (gt_graph_print: every node's op, attributes, output types, fqn, phase, tags,
 *     placements) is the original's, character for character once value ids are renumbered by
 *     first appearance (the reader numbers values in replay order);
 *   - a second round trip gives the text of the first.
 * Bad text: the text cut after every line, an unknown op, an output's recorded dtype changed, a
 * wrong version or magic word, counts larger than the text, a bad escape — each an error naming
 * the problem, never a graph. (tests/fuzz/fuzz_graph_text.c mutates it
 * further under ASan/UBSan.) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph_text.h"
#include "train_graph.h"

static char *write_text(const gt_graph *g, size_t *len)
{
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    gt_error err = {0};
    EXPECT_OK(gt_graph_write(g, f, &err), &err);
    fclose(f);
    if (len) *len = n;
    return buf;
}

/* The listing with value ids renumbered by first appearance ("%17" -> "%0", ...), so listings of
 * one structure with other value numberings compare equal. Frees text. */
static char *renumbered(char *text)
{
    size_t n = strlen(text), cap = 1024, used = 0;
    long *ids = malloc(cap * sizeof *ids);
    char *out = malloc(2 * n + 1), *w = out;
    for (const char *p = text; *p;) {
        if (*p == '%' && p[1] >= '0' && p[1] <= '9') {
            char *end;
            long id = strtol(p + 1, &end, 10);
            size_t k = 0;
            while (k < used && ids[k] != id)
                k++;
            if (k == used) {
                if (used == cap) ids = realloc(ids, (cap *= 2) * sizeof *ids);
                ids[used++] = id;
            }
            w += sprintf(w, "%%%zu", k);
            p = end;
        } else {
            *w++ = *p++;
        }
    }
    *w = 0;
    free(ids);
    free(text);
    return out;
}

static void round_trip(const char *what, const char *const *args, int n_args)
{
    gt_graph *g = train_graph_debugmodel(args, n_args);
    if (!g) return;
    size_t len = 0;
    char *text = write_text(g, &len);
    gt_graph *back = NULL;
    gt_error err = {0};
    EXPECT_OK(gt_graph_read(text, len, &back, &err), &err);
    if (back) {
        char *a = renumbered(graph_text(g)), *b = renumbered(graph_text(back));
        EXPECT(strcmp(a, b) == 0, "%s: the listing read back differs from the original", what);
        /* the reader numbers values in replay order: a second round trip changes nothing */
        size_t len2 = 0;
        char *again = write_text(back, &len2);
        gt_graph *back2 = NULL;
        EXPECT_OK(gt_graph_read(again, len2, &back2, &err), &err);
        char *third = back2 ? write_text(back2, NULL) : NULL;
        EXPECT(third && strcmp(again, third) == 0, "%s: a second round trip changed the text",
               what);
        free(third);
        gt_graph_free(back2);
        EXPECT(g->mesh.ndim == back->mesh.ndim && g->n_nodes == back->n_nodes &&
                   g->n_values == back->n_values,
               "%s: mesh rank %d/%d, nodes %d/%d, values %d/%d", what, g->mesh.ndim,
               back->mesh.ndim, g->n_nodes, back->n_nodes, g->n_values, back->n_values);
        printf("%s: %d nodes, %zu bytes of text, read back the same\n", what, g->n_nodes, len);
        free(a);
        free(b);
        free(again);
        gt_graph_free(back);
    }
    free(text);
    gt_graph_free(g);
}

/* text with its first occurrence of `from` replaced by `to`, read: must fail, message has want */
static void expect_refused(const char *what, const char *text, const char *from, const char *to,
                           const char *want)
{
    const char *at = strstr(text, from);
    EXPECT(at != NULL, "%s: '%s' not in the text", what, from);
    if (!at) return;
    size_t n = strlen(text), nf = strlen(from), nt = strlen(to);
    char *bad = malloc(n - nf + nt + 1);
    memcpy(bad, text, (size_t)(at - text));
    memcpy(bad + (at - text), to, nt);
    strcpy(bad + (at - text) + nt, at + nf);
    gt_graph *g = NULL;
    gt_error err = {0};
    gt_status st = gt_graph_read(bad, strlen(bad), &g, &err);
    EXPECT(st == GT_ERR_FORMAT && !g && strstr(err.msg, want),
           "%s: status %d, message '%s' (wanted '%s')", what, (int)st, err.msg, want);
    gt_graph_free(g);
    free(bad);
}

static void bad_text(void)
{
    gt_graph *g = train_graph_debugmodel(NULL, 0);
    if (!g) return;
    size_t len = 0;
    char *text = write_text(g, &len);
    /* cut after every line: never a graph (only the whole text ends with "end") */
    int lines = 0, refused = 0;
    for (size_t k = 0; k < len; k++) {
        if (text[k] != '\n' || k + 1 == len) continue;
        gt_graph *out = NULL;
        gt_error err = {0};
        lines++;
        refused += gt_graph_read(text, k + 1, &out, &err) == GT_ERR_FORMAT && !out;
        gt_graph_free(out);
    }
    EXPECT(lines > 100 && refused == lines, "cut text: %d of %d cuts refused", refused, lines);
    printf("cut after each of %d lines: %d refused\n", lines, refused);

    expect_refused("unknown op", text, " matmul ", " matmull ", "unknown op");
    expect_refused("version", text, "graphtrain-graph 2 ", "graphtrain-graph 1 ", "version 1");
    expect_refused("magic", text, "graphtrain-graph", "graphtrain-grapf", "not a graphtrain graph");
    char first[128];
    snprintf(first, sizeof first, "graphtrain-graph 2 %d ", g->n_values);
    expect_refused("counts", text, first, "graphtrain-graph 2 99999999 ", "larger");
    expect_refused("bad escape", text, "~", "%G1", "bad escape");
    free(text);
    gt_graph_free(g);
}

/* An output's recorded dtype changed: the reader's shape rule disagrees. */
static void bad_type(void)
{
    gt_graph *g = train_graph_debugmodel(NULL, 0);
    if (!g) return;
    /* the text of the graph with the last node's output dtype changed in memory */
    gt_value_id v = g->nodes[g->n_nodes - 1].out[0];
    gt_dtype was = g->values[v].type.dtype;
    g->values[v].type.dtype = was == GT_F32 ? GT_BF16 : GT_F32;
    char *bad = write_text(g, NULL);
    g->values[v].type.dtype = was;
    gt_graph *out = NULL;
    gt_error err = {0};
    gt_status st = gt_graph_read(bad, strlen(bad), &out, &err);
    EXPECT(st == GT_ERR_FORMAT && !out && strstr(err.msg, "recorded type"),
           "changed dtype: status %d, '%s'", (int)st, err.msg);
    gt_graph_free(out);
    free(bad);
    gt_graph_free(g);
}

int main(void)
{
    round_trip("debugmodel, one rank", NULL, 0);
    static const char *const fsdp_tp[] = {"--parallelism.data_parallel_shard_degree", "2",
                                          "--parallelism.tensor_parallel_degree", "2"};
    round_trip("debugmodel, FSDP2 x TP2", fsdp_tp, 4);
    bad_text();
    bad_type();
    return gt_test_finish();
}
