/* placement.c — placement text for the printer and error messages: "R", "S(0)", "P"; a value's
 * placements over the graph's mesh as "{S(0)@dp_shard, P@tp}". */
#include <stdio.h>

#include "graphtrain/gt_graph.h"

int gt_placement_format(gt_placement p, char *buf, size_t len)
{
    switch ((gt_place_kind)p.kind) {
    case GT_PLACE_SHARD:
        if (p.order)
            return snprintf(buf, len, "S(%d)#%d%s", p.dim, p.order, p.padded ? "+pad" : "");
        return snprintf(buf, len, "S(%d)%s", p.dim, p.padded ? "+pad" : "");
    case GT_PLACE_PARTIAL:
        return snprintf(buf, len, "P");
    default:
        return snprintf(buf, len, "R");
    }
}

int gt_value_format_placement(const gt_graph *g, gt_value_id v, char *buf, size_t len)
{
    int n = 0;
    if (len) buf[0] = '\0';
    for (int md = 0; md < g->mesh.ndim && md < GT_MESH_MAX_DIMS; md++) {
        gt_placement p = g->values[v].place[md];
        if (p.kind == GT_PLACE_REPLICATE) continue;
        char one[32];
        gt_placement_format(p, one, sizeof one);
        n += snprintf(buf + (n < (int)len ? n : (int)len), n < (int)len ? len - (size_t)n : 0,
                      "%s%s@%s", n ? ", " : "{", one, gt_graph_str(g, g->mesh.name[md]));
    }
    if (n)
        n += snprintf(buf + (n < (int)len ? n : (int)len), n < (int)len ? len - (size_t)n : 0, "}");
    return n;
}
