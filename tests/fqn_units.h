/* fqn_units.h — for graphs the tests build by hand with torchtitan-like module paths: sets every
 * node's structural unit (and every PARAM input's plan.unit) from its fqn as a model builder would
 * ("layers.N[.*]" -> N, "tok_embeddings[.*]" -> GT_UNIT_EMBED, else GT_UNIT_REST), so the passes,
 * which read units and never fqns, see the structure such a builder gives. */
#ifndef GT_TEST_FQN_UNITS_H
#define GT_TEST_FQN_UNITS_H

#include <string.h>

#include "graphtrain/gt_graph.h"

static inline int32_t gt_test_unit_of_fqn(const char *fqn)
{
    size_t n = strlen("tok_embeddings");
    if (strncmp(fqn, "tok_embeddings", n) == 0 && (fqn[n] == 0 || fqn[n] == '.'))
        return GT_UNIT_EMBED;
    if (strncmp(fqn, "layers.", 7) != 0) return GT_UNIT_REST;
    const char *p = fqn + 7;
    int64_t v = 0;
    int digits = 0;
    while (*p >= '0' && *p <= '9' && digits < 9)
        v = v * 10 + (*p++ - '0'), digits++;
    return digits > 0 && (*p == 0 || *p == '.') ? (int32_t)v : GT_UNIT_REST;
}

static inline void gt_test_units_from_fqns(gt_graph *g)
{
    for (gt_node_id n = 0; n < g->n_nodes; n++)
        g->nodes[n].unit = gt_test_unit_of_fqn(gt_graph_str(g, g->nodes[n].fqn));
    for (int32_t k = 0; k < g->n_inputs; k++)
        if (g->inputs[k].kind == GT_IN_PARAM)
            g->inputs[k].plan.unit = gt_test_unit_of_fqn(gt_graph_str(g, g->inputs[k].fqn));
}

#endif
