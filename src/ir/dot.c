/* dot.c — the Graphviz DOT form of a graph (DESIGN.md §3, "the DOT writer").
 *
 * Layout of the text:
 *   digraph "title" {
 *     graph/node/edge defaults, a legend cluster
 *     graph inputs, nodes and outputs, each declared inside the cluster of its module
 *     edges, value producer -> consumer
 *   }
 *
 * Clusters nest by fqn prefix, one dot-separated component per level, at most three levels:
 * "layers.3.attention.wq" sits in "layers" > "layers.3" > "layers.3.attention", and the rest of its
 * fqn ("wq") goes into its label. Three levels keep dot's cluster layout tractable for 8B-sized
 * graphs (dot's cost grows with cluster nesting) while still separating blocks and sub-modules.
 * Backward and optimizer nodes carry the fqn of what they differentiate or update, so they sit in
 * the same cluster as their forward node; the fill colour tells the phases apart.
 *
 * Graph inputs go into the deepest existing cluster that prefixes their fqn (a PARAM
 * "layers.0.attention.wq.weight" sits by its matmul), never creating a cluster of their own;
 * outputs sit next to the value they name.
 *
 * Stability: everything written comes from the graph's contents, clusters are ordered by the first
 * node that mentions them and items inside a cluster by kind then index, so identical graphs give
 * identical text and dumps diff cleanly. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir_internal.h"

#define DOT_MAX_DEPTH 3
#define DOT_TYPE_CHARS 40 /* a label's type line is cut here; the tooltip has the whole node */

/* ---------------------------------------------------------------- growable text */

typedef struct {
    char *p;
    size_t len, cap;
} dot_text;

static void text_reserve(dot_text *t, size_t extra)
{
    if (t->len + extra + 1 <= t->cap) return;
    size_t cap = t->cap ? t->cap : 256;
    while (cap < t->len + extra + 1)
        cap *= 2;
    t->p = gt_xrealloc(t->p, cap);
    t->cap = cap;
}

static void text_printf(dot_text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void text_printf(dot_text *t, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char probe[1];
    int n = vsnprintf(probe, sizeof probe, fmt, ap);
    va_end(ap);
    if (n <= 0) return;
    text_reserve(t, (size_t)n);
    va_start(ap, fmt);
    vsnprintf(t->p + t->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    t->len += (size_t)n;
}

static void text_type(dot_text *t, const gt_graph *g, const gt_type *type)
{
    char probe[1];
    size_t n = (size_t)gt_graph_format_type(g, type, probe, sizeof probe);
    text_reserve(t, n);
    gt_graph_format_type(g, type, t->p + t->len, n + 1);
    t->len += n;
}

/* The type of value v, cut to DOT_TYPE_CHARS characters. */
static void text_short_type(dot_text *t, const gt_graph *g, gt_value_id v)
{
    if (v < 0 || v >= g->n_values) {
        text_printf(t, "?");
        return;
    }
    size_t start = t->len;
    text_type(t, g, &g->values[v].type);
    if (t->len - start > DOT_TYPE_CHARS) {
        t->len = start + DOT_TYPE_CHARS - 3;
        text_printf(t, "...");
    }
}

/* Length of the valid UTF-8 sequence at s (2-4 bytes, s[0] >= 0x80), or 0 when the bytes there
 * are not one: overlong forms, surrogates and code points past U+10FFFF are refused. Stops at the
 * first byte that is not a continuation, so it never reads past a string's NUL. */
static int utf8_len(const unsigned char *s)
{
    int n = s[0] >= 0xc2 && s[0] <= 0xdf   ? 2
            : s[0] >= 0xe0 && s[0] <= 0xef ? 3
            : s[0] >= 0xf0 && s[0] <= 0xf4 ? 4
                                           : 0;
    for (int k = 1; k < n; k++)
        if ((s[k] & 0xc0) != 0x80) return 0;
    if ((s[0] == 0xe0 && s[1] < 0xa0) || (s[0] == 0xed && s[1] >= 0xa0) ||
        (s[0] == 0xf0 && s[1] < 0x90) || (s[0] == 0xf4 && s[1] >= 0x90))
        return 0;
    return n;
}

/* s as the inside of a DOT double-quoted string. '"' and '\\' are escaped (a backslash starts
 * dot's own escapes such as \N); a newline becomes dot's "\n" line break; other control bytes and
 * invalid UTF-8 (which makes dot reject the file) become '?'. */
static void put_escaped(FILE *f, const char *s, size_t len)
{
    const unsigned char *u = (const unsigned char *)s;
    for (size_t k = 0; k < len; k++) {
        unsigned char c = u[k];
        if (c == '"' || c == '\\') {
            fputc('\\', f);
            fputc(c, f);
        } else if (c == '\n') {
            fputs("\\n", f);
        } else if (c < 0x20 || c == 0x7f) {
            fputc('?', f);
        } else if (c < 0x80) {
            fputc(c, f);
        } else {
            int n = utf8_len(u + k);
            if (n == 0 || k + (size_t)n > len) {
                fputc('?', f);
                continue;
            }
            fwrite(u + k, 1, (size_t)n, f);
            k += (size_t)n - 1;
        }
    }
}

static void put_quoted(FILE *f, const char *s)
{
    fputc('"', f);
    put_escaped(f, s, strlen(s));
    fputc('"', f);
}

static const char *safe_str(const gt_graph *g, gt_str s)
{
    return gt_graph_str_valid(g, s) ? gt_graph_str(g, s) : "";
}

/* ---------------------------------------------------------------- clusters */

typedef struct {
    char *name; /* the fqn prefix: "layers.3" */
    int32_t parent, depth;
    int32_t first_child, last_child, next_sibling;
} dot_cluster;

typedef struct {
    dot_cluster *c;
    int32_t n, cap;
    int32_t *index; /* open addressing over name, -1 empty */
    uint32_t index_mask;
    int32_t first_root, last_root;
} dot_clusters;

static int32_t cluster_find(const dot_clusters *cs, const char *s, size_t len, uint32_t *slot)
{
    uint32_t h = (uint32_t)gt_hash64(s, len, 0) & cs->index_mask;
    for (;; h = (h + 1) & cs->index_mask) {
        int32_t k = cs->index[h];
        if (k < 0 || (strlen(cs->c[k].name) == len && memcmp(cs->c[k].name, s, len) == 0)) {
            *slot = h;
            return k;
        }
    }
}

static int32_t cluster_add(dot_clusters *cs, const char *s, size_t len, int32_t parent,
                           uint32_t slot)
{
    if (cs->n == cs->cap) {
        cs->cap = cs->cap ? 2 * cs->cap : 16;
        cs->c = gt_xrealloc(cs->c, (size_t)cs->cap * sizeof *cs->c);
    }
    int32_t id = cs->n++;
    dot_cluster *c = &cs->c[id];
    c->name = gt_xmalloc(len + 1);
    memcpy(c->name, s, len);
    c->name[len] = '\0';
    c->parent = parent;
    c->depth = parent < 0 ? 1 : cs->c[parent].depth + 1;
    c->first_child = c->last_child = c->next_sibling = -1;
    /* Children in creation order, which is the order of the first node mentioning them. */
    int32_t *first = parent < 0 ? &cs->first_root : &cs->c[parent].first_child;
    int32_t *last = parent < 0 ? &cs->last_root : &cs->c[parent].last_child;
    if (*last < 0)
        *first = id;
    else
        cs->c[*last].next_sibling = id;
    *last = id;
    cs->index[slot] = id;
    return id;
}

/* The deepest cluster for fqn: its first DOT_MAX_DEPTH components. With create, missing levels are
 * made; without, the walk stops at the first missing one. -1 for "" (top level). */
static int32_t cluster_of(dot_clusters *cs, const char *fqn, bool create)
{
    int32_t cur = -1;
    size_t pos = 0, full = strlen(fqn);
    for (int depth = 1; depth <= DOT_MAX_DEPTH && full > 0; depth++) {
        const char *dot = memchr(fqn + pos, '.', full - pos);
        size_t len = dot ? (size_t)(dot - fqn) : full;
        uint32_t slot;
        int32_t k = cluster_find(cs, fqn, len, &slot);
        if (k < 0) {
            if (!create) break;
            k = cluster_add(cs, fqn, len, cur, slot);
        }
        cur = k;
        if (!dot) break;
        pos = len + 1;
    }
    return cur;
}

/* What is left of fqn after its cluster's prefix: "wq" for "layers.0.attention.wq" in
 * "layers.0.attention"; the whole fqn when the cluster is not a prefix of it. */
static const char *fqn_rest(const dot_clusters *cs, int32_t cluster, const char *fqn)
{
    if (cluster < 0) return fqn;
    const char *name = cs->c[cluster].name;
    size_t len = strlen(name);
    if (strncmp(fqn, name, len) != 0) return fqn;
    if (fqn[len] == '\0') return "";
    return fqn[len] == '.' ? fqn + len + 1 : fqn;
}

/* ---------------------------------------------------------------- items */

/* Everything declared as a DOT node, in declaration order: inputs, nodes, outputs. */
typedef struct {
    const gt_graph *g;
    dot_clusters cs;
    int32_t n_items;
    int32_t *item_cluster; /* per item */
    int32_t *order;        /* item ids grouped by cluster (stable) */
    int32_t *start;        /* per cluster + 1: its range in order; slot 0 is the top level */
    int32_t *input_of;     /* per value: first graph input index holding it, or -1 */
    dot_text label, tip;
} dot_writer;

static void style_of_node(const gt_graph *g, const gt_node *n, const char **fill,
                          const char **style)
{
    const gt_op_info *info = gt_op_get(n->op);
    *style = "rounded,filled";
    if (info && (info->flags & GT_OPF_COLLECTIVE)) {
        *fill = "#ffd966"; /* collective: amber, bold border */
        *style = "rounded,filled,bold";
    } else if (gt_node_has_tag(g, n, "recompute")) {
        *fill = "#d5c8ec"; /* recompute: lavender, dashed border */
        *style = "rounded,filled,dashed";
    } else if (n->phase == GT_PHASE_FORWARD) {
        *fill = "#c9def5"; /* forward: blue */
    } else if (n->phase == GT_PHASE_BACKWARD) {
        *fill = "#f8c9a0"; /* backward: orange */
    } else if (n->phase == GT_PHASE_OPTIMIZER) {
        *fill = "#bfe3b0"; /* optimizer: green */
    } else {
        *fill = "#ffffff";
    }
}

static void put_attr(FILE *f, const char *key, const char *value)
{
    fprintf(f, ", %s=", key);
    put_quoted(f, value);
}

static void write_node(dot_writer *w, FILE *f, gt_node_id id, int32_t cluster, const char *indent)
{
    const gt_graph *g = w->g;
    const gt_node *n = &g->nodes[id];
    const gt_op_info *info = gt_op_get(n->op);
    int n_out = n->n_out < GT_MAX_OUT ? n->n_out : GT_MAX_OUT;

    dot_text *l = &w->label;
    l->len = 0;
    if (n_out > 0)
        text_printf(l, "%%%d %s", n->out[0], info ? info->name : "?");
    else
        text_printf(l, "n%d %s", id, info ? info->name : "?");
    const char *rest = fqn_rest(&w->cs, cluster, safe_str(g, n->fqn));
    if (rest[0]) text_printf(l, "\n%s", rest);
    if (n_out > 0) {
        text_printf(l, "\n");
        text_short_type(l, g, n->out[0]);
        if (n_out > 1) text_printf(l, " +%d", n_out - 1);
    }
    text_printf(l, "%c", '\0');

    dot_text *t = &w->tip;
    char probe[1];
    size_t need = (size_t)gt_graph_format_node(g, id, probe, sizeof probe);
    t->len = 0;
    text_reserve(t, need);
    gt_graph_format_node(g, id, t->p, need + 1);

    const char *fill, *style;
    style_of_node(g, n, &fill, &style);
    fprintf(f, "%sn%d [label=", indent, id);
    put_quoted(f, l->p);
    fprintf(f, ", fillcolor=\"%s\", style=\"%s\"", fill, style);
    put_attr(f, "tooltip", t->p);
    fputs("];\n", f);
}

static void write_input(dot_writer *w, FILE *f, int32_t k, int32_t cluster, const char *indent)
{
    const gt_graph *g = w->g;
    const gt_io *io = &g->inputs[k];
    static const char *const shape[] = {"cylinder", "cylinder", "folder", "invhouse"};
    static const char *const style[] = {"filled", "filled,dashed", "filled", "filled"};
    int kind = io->kind >= GT_IN_PARAM && io->kind <= GT_IN_INPUT ? io->kind : GT_IN_INPUT;
    const char *kind_name = gt_input_kind_name((gt_input_kind)io->kind);

    dot_text *l = &w->label;
    l->len = 0;
    text_printf(l, "%%%d %s", io->value, kind_name ? kind_name : "?");
    const char *rest = fqn_rest(&w->cs, cluster, safe_str(g, io->fqn));
    if (rest[0]) text_printf(l, "\n%s", rest);
    text_printf(l, "\n");
    text_short_type(l, g, io->value);
    text_printf(l, "%c", '\0');

    fprintf(f, "%si%d [label=", indent, k);
    put_quoted(f, l->p);
    fprintf(f, ", shape=%s, fillcolor=\"#eeeeee\", style=\"%s\"", shape[kind], style[kind]);
    put_attr(f, "tooltip", safe_str(g, io->fqn));
    fputs("];\n", f);
}

static void write_output(dot_writer *w, FILE *f, int32_t k, int32_t cluster, const char *indent)
{
    const gt_graph *g = w->g;
    const gt_io *io = &g->outputs[k];
    const char *kind_name = gt_output_kind_name((gt_output_kind)io->kind);
    dot_text *l = &w->label;
    l->len = 0;
    text_printf(l, "%s", kind_name ? kind_name : "?");
    const char *rest = fqn_rest(&w->cs, cluster, safe_str(g, io->fqn));
    if (rest[0]) text_printf(l, "\n%s", rest);
    text_printf(l, "%c", '\0');

    fprintf(f, "%so%d [label=", indent, k);
    put_quoted(f, l->p);
    fprintf(f, ", shape=%s, fillcolor=\"#ffffff\", style=\"filled\"",
            io->kind == GT_OUT_LOSS ? "doubleoctagon" : "house");
    put_attr(f, "tooltip", safe_str(g, io->fqn));
    fputs("];\n", f);
}

static void write_item(dot_writer *w, FILE *f, int32_t item, const char *indent)
{
    const gt_graph *g = w->g;
    int32_t cluster = w->item_cluster[item];
    if (item < g->n_inputs)
        write_input(w, f, item, cluster, indent);
    else if (item < g->n_inputs + g->n_nodes)
        write_node(w, f, item - g->n_inputs, cluster, indent);
    else
        write_output(w, f, item - g->n_inputs - g->n_nodes, cluster, indent);
}

static void write_cluster(dot_writer *w, FILE *f, int32_t c)
{
    /* Deeper clusters get a darker background so nesting reads at a glance. */
    static const char *const fill[DOT_MAX_DEPTH] = {"#f7f7f7", "#eeeeee", "#e4e4e4"};
    static const char *const indents[DOT_MAX_DEPTH + 1] = {"  ", "    ", "      ", "        "};
    const dot_cluster *cl = &w->cs.c[c];
    int d = cl->depth <= DOT_MAX_DEPTH ? cl->depth : DOT_MAX_DEPTH;
    const char *in = indents[d - 1], *in2 = indents[d];
    fprintf(f, "%ssubgraph ", in);
    fputc('"', f);
    fputs("cluster_", f);
    put_escaped(f, cl->name, strlen(cl->name));
    fprintf(f, "\" {\n%sgraph [label=", in2);
    put_quoted(f, cl->name);
    fprintf(f, ", fillcolor=\"%s\"];\n", fill[d - 1]);
    for (int32_t k = w->start[c + 1]; k < w->start[c + 2]; k++)
        write_item(w, f, w->order[k], in2);
    for (int32_t ch = cl->first_child; ch >= 0; ch = w->cs.c[ch].next_sibling)
        write_cluster(w, f, ch);
    fprintf(f, "%s}\n", in);
}

/* Source of the edge carrying value v: its producer node, or the graph input holding it. Writes
 * nothing and returns false for a value that is neither (an unverified graph). */
static bool put_source(const dot_writer *w, FILE *f, gt_value_id v)
{
    const gt_graph *g = w->g;
    if (v < 0 || v >= g->n_values) return false;
    gt_node_id p = g->values[v].producer;
    if (p >= 0 && p < g->n_nodes) {
        fprintf(f, "  n%d -> ", p);
        return true;
    }
    if (w->input_of[v] >= 0) {
        fprintf(f, "  i%d -> ", w->input_of[v]);
        return true;
    }
    return false;
}

static void write_edges(const dot_writer *w, FILE *f)
{
    const gt_graph *g = w->g;
    for (gt_node_id id = 0; id < g->n_nodes; id++) {
        const gt_node *n = &g->nodes[id];
        int n_in = n->n_in < GT_MAX_IN ? n->n_in : GT_MAX_IN;
        for (int k = 0; k < n_in; k++) {
            bool seen = false; /* mul(x, x): one edge, not two on top of each other */
            for (int j = 0; j < k; j++)
                seen |= n->in[j] == n->in[k];
            if (!seen && put_source(w, f, n->in[k])) fprintf(f, "n%d;\n", id);
        }
    }
    for (int32_t k = 0; k < g->n_outputs; k++)
        if (put_source(w, f, g->outputs[k].value)) fprintf(f, "o%d;\n", k);
}

static void write_legend(FILE *f)
{
    static const char *const rows[][4] = {
        {"forward", "#c9def5", "rounded,filled", "fwd"},
        {"backward", "#f8c9a0", "rounded,filled", "bwd"},
        {"optimizer", "#bfe3b0", "rounded,filled", "opt"},
        {"recompute", "#d5c8ec", "rounded,filled,dashed", "recompute"},
        {"collective", "#ffd966", "rounded,filled,bold", "collective"},
    };
    fputs("  subgraph cluster_legend {\n    graph [label=\"legend\", fillcolor=\"#ffffff\"];\n", f);
    /* Declared last to first: dot lays out an edgeless rank right to left of declaration. */
    for (size_t k = sizeof rows / sizeof rows[0]; k-- > 0;)
        fprintf(f, "    legend_%s [label=\"%s\", fillcolor=\"%s\", style=\"%s\"];\n", rows[k][3],
                rows[k][0], rows[k][1], rows[k][2]);
    /* No edges: the five nodes share the top rank, a compact row above the graph. */
    fputs("  }\n", f);
}

/* Assigns every item its cluster, then groups the items by cluster with a stable counting sort. */
static void assign_clusters(dot_writer *w)
{
    const gt_graph *g = w->g;
    int32_t n_strs = g->n_strs > 0 ? g->n_strs : 1;
    /* Each distinct fqn string adds at most DOT_MAX_DEPTH clusters: size the index for that. */
    uint32_t cap = 16;
    while (cap < 2u * (uint32_t)n_strs * DOT_MAX_DEPTH + 2)
        cap *= 2;
    w->cs.index = gt_xmalloc(cap * sizeof *w->cs.index);
    memset(w->cs.index, 0xff, cap * sizeof *w->cs.index);
    w->cs.index_mask = cap - 1;
    w->cs.first_root = w->cs.last_root = -1;

    int32_t *by_str = gt_xmalloc((size_t)n_strs * sizeof *by_str);
    for (int32_t k = 0; k < n_strs; k++)
        by_str[k] = -2; /* not computed yet */
    int32_t ni = g->n_inputs, nn = g->n_nodes;
    for (gt_node_id id = 0; id < nn; id++) {
        gt_str s = g->nodes[id].fqn;
        int32_t c = -1;
        if (gt_graph_str_valid(g, s)) {
            if (by_str[s] == -2) by_str[s] = cluster_of(&w->cs, gt_graph_str(g, s), true);
            c = by_str[s];
        }
        w->item_cluster[ni + id] = c;
    }
    free(by_str);
    for (int32_t k = 0; k < ni; k++)
        w->item_cluster[k] = cluster_of(&w->cs, safe_str(g, g->inputs[k].fqn), false);
    for (int32_t k = 0; k < g->n_outputs; k++) {
        gt_value_id v = g->outputs[k].value;
        int32_t c = -1;
        if (v >= 0 && v < g->n_values) {
            gt_node_id p = g->values[v].producer;
            if (p >= 0 && p < nn)
                c = w->item_cluster[ni + p];
            else if (w->input_of[v] >= 0)
                c = w->item_cluster[w->input_of[v]];
        }
        w->item_cluster[ni + nn + k] = c;
    }

    w->start = gt_xcalloc((size_t)w->cs.n + 2, sizeof *w->start);
    for (int32_t k = 0; k < w->n_items; k++)
        w->start[w->item_cluster[k] + 2]++;
    for (int32_t c = 0; c <= w->cs.n; c++)
        w->start[c + 1] += w->start[c];
    int32_t *fill = gt_xmalloc(((size_t)w->cs.n + 1) * sizeof *fill);
    memcpy(fill, w->start, ((size_t)w->cs.n + 1) * sizeof *fill);
    for (int32_t k = 0; k < w->n_items; k++)
        w->order[fill[w->item_cluster[k] + 1]++] = k;
    free(fill);
}

void gt_graph_write_dot(const gt_graph *g, FILE *f, const char *title)
{
    dot_writer w = {0};
    w.g = g;
    w.n_items = g->n_inputs + g->n_nodes + g->n_outputs;
    size_t n_items = (size_t)w.n_items + 1;
    w.item_cluster = gt_xmalloc(n_items * sizeof *w.item_cluster);
    w.order = gt_xmalloc(n_items * sizeof *w.order);
    w.input_of = gt_xmalloc(((size_t)g->n_values + 1) * sizeof *w.input_of);
    for (int32_t v = 0; v < g->n_values; v++)
        w.input_of[v] = -1;
    for (int32_t k = g->n_inputs - 1; k >= 0; k--) {
        gt_value_id v = g->inputs[k].value;
        if (v >= 0 && v < g->n_values) w.input_of[v] = k;
    }
    assign_clusters(&w);

    if (!title) title = "graph";
    fputs("digraph ", f);
    put_quoted(f, title);
    fputs(" {\n  graph [label=", f);
    put_quoted(f, title);
    fputs(", labelloc=t, fontname=\"Helvetica\", fontsize=14, rankdir=TB, nodesep=0.2, "
          "ranksep=0.3, style=\"rounded,filled\", color=\"#999999\", labeljust=l];\n"
          "  node [shape=box, fontname=\"Helvetica\", fontsize=9, margin=\"0.08,0.03\", "
          "height=0.3, color=\"#555555\"];\n"
          "  edge [color=\"#777777\", arrowsize=0.5];\n",
          f);
    write_legend(f);
    for (int32_t k = w.start[0]; k < w.start[1]; k++)
        write_item(&w, f, w.order[k], "  ");
    for (int32_t c = w.cs.first_root; c >= 0; c = w.cs.c[c].next_sibling)
        write_cluster(&w, f, c);
    write_edges(&w, f);
    fputs("}\n", f);

    for (int32_t c = 0; c < w.cs.n; c++)
        free(w.cs.c[c].name);
    free(w.cs.c);
    free(w.cs.index);
    free(w.item_cluster);
    free(w.order);
    free(w.start);
    free(w.input_of);
    free(w.label.p);
    free(w.tip.p);
}
