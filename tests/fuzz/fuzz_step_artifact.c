/* fuzz_step_artifact.c — precompiled step artifacts (src/train/artifact.c) and the graph text
 * inside them (src/ir/serialize.c).
 *
 * Each input is read three ways: as graph text (gt_graph_read, no checksum in the way, so every
 * mutation reaches the line parser, the builder and the verifier); as an artifact whose key is the
 * one the input carries (every header and checksum check, then the graph); and as an artifact
 * checked against another key (the key comparison and its message). A graph that reads is written
 * again and must read again. Seeds: tests/fuzz/make_step_artifact_corpus.sh. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graphtrain/gt_graph.h"
#include "train/train_internal.h"

static void read_graph(const char *data, size_t size)
{
    gt_graph *g = NULL;
    gt_error err = {0};
    if (gt_graph_read(data, size, &g, &err) != GT_OK) return;
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    gt_graph_write(g, f, &err);
    fclose(f);
    gt_graph *again = NULL;
    if (gt_graph_read(text, len, &again, &err) != GT_OK) abort(); /* what it wrote must read */
    gt_graph_free(again);
    free(text);
    gt_graph_free(g);
}

/* The key the input carries: the bytes after its "key ..." line, as many as that line says. */
static char *own_key(const char *data, size_t size)
{
    const char *nl = memchr(data, '\n', size);
    if (!nl) return NULL;
    const char *line = nl + 1, *end = data + size;
    const char *nl2 = memchr(line, '\n', (size_t)(end - line));
    if (!nl2) return NULL;
    size_t klen = 0;
    char head[96];
    size_t hn = (size_t)(nl2 - line) < sizeof head - 1 ? (size_t)(nl2 - line) : sizeof head - 1;
    memcpy(head, line, hn);
    head[hn] = 0;
    if (sscanf(head, "key %zu", &klen) != 1 || klen > (size_t)(end - nl2 - 1))
        return NULL;
    char *k = malloc(klen + 1);
    memcpy(k, nl2 + 1, klen);
    k[klen] = 0;
    return k;
}

static void read_artifact(const uint8_t *data, size_t size, const char *key)
{
    char *copy = malloc(size + 1);
    memcpy(copy, data, size);
    copy[size] = 0;
    gt_graph *g = NULL;
    gt_error err = {0};
    if (gt_train_artifact_parse("fuzz/step.graph", copy, size, key, &g, &err) == GT_OK)
        gt_graph_free(g);
    free(copy);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    read_graph((const char *)data, size);
    char *key = own_key((const char *)data, size);
    if (key && !memchr(key, 0, strlen(key))) read_artifact(data, size, key);
    free(key);
    read_artifact(data, size, "model.flavor = \"other\"\n");
    return 0;
}
