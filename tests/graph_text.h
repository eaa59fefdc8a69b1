/* graph_text.h — a graph's printed listing (gt_graph_print) as a string, for tests that compare
 * listings or look for text in them. */
#ifndef GRAPHTRAIN_TESTS_GRAPH_TEXT_H
#define GRAPHTRAIN_TESTS_GRAPH_TEXT_H

#include <stdio.h>

#include "graphtrain/gt_graph.h"

/* The text of gt_graph_print(g); the caller frees it. */
static inline char *graph_text(const gt_graph *g)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    gt_graph_print(g, f);
    fclose(f);
    return buf;
}

#endif
