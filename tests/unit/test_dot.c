/* test_dot.c — the DOT writer, checked by an independent little DOT parser: braces balance and
 * every quoted string closes; every node, graph input and output is declared exactly once; the
 * edge set equals producer -> consumer computed from the graph; each node sits in the clusters
 * its fqn names (at most three levels); fill colours are one per phase (and recompute), pairwise
 * distinct; input kinds and outputs have distinct shapes; quotes, backslashes and invalid UTF-8 in
 * names are escaped; output is stable. When `dot` is installed, dot -Tsvg accepts the small graph
 * and the debugmodel whole-step graph (llama3 + autodiff). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "graphtrain/gt_autodiff.h"
#include "graphtrain/gt_build.h"
#include "graphtrain/gt_llama3.h"
#include "gt_test.h"

/* ---------------------------------------------------------------- a minimal DOT parser */

enum { TOK_ID, TOK_PUNCT, TOK_ARROW, TOK_END, TOK_BAD };

typedef struct {
    const char *s;
    size_t pos, len;
    int kind;
    char text[4096];
} lexer;

/* Next token: bare ID, quoted ID (\" and \\ unescaped, other escapes kept), punctuation or ->. */
static int lex(lexer *x)
{
    while (x->pos < x->len && strchr(" \t\r\n", x->s[x->pos]))
        x->pos++;
    size_t n = 0;
    x->text[0] = '\0';
    if (x->pos >= x->len) return x->kind = TOK_END;
    char c = x->s[x->pos];
    if (strchr("{}[]=,;", c)) {
        x->text[0] = c;
        x->text[1] = '\0';
        x->pos++;
        return x->kind = TOK_PUNCT;
    }
    if (c == '-' && x->pos + 1 < x->len && x->s[x->pos + 1] == '>') {
        x->pos += 2;
        return x->kind = TOK_ARROW;
    }
    if (c == '"') {
        x->pos++;
        while (x->pos < x->len && x->s[x->pos] != '"') {
            char d = x->s[x->pos++];
            if (d == '\\' && x->pos < x->len) {
                char e = x->s[x->pos++];
                if (e != '"' && e != '\\' && n + 1 < sizeof x->text) x->text[n++] = '\\';
                d = e;
            }
            if (n + 1 < sizeof x->text) x->text[n++] = d;
        }
        if (x->pos >= x->len) return x->kind = TOK_BAD; /* unterminated string */
        x->pos++;
        x->text[n] = '\0';
        return x->kind = TOK_ID;
    }
    while (x->pos < x->len && !strchr(" \t\r\n{}[]=,;\"", x->s[x->pos])) {
        if (x->s[x->pos] == '-' && x->pos + 1 < x->len && x->s[x->pos + 1] == '>') break;
        if (n + 1 < sizeof x->text) x->text[n++] = x->s[x->pos];
        x->pos++;
    }
    x->text[n] = '\0';
    return x->kind = TOK_ID;
}

typedef struct {
    char *name, *label, *fill, *style, *shape;
    char *clusters; /* enclosing cluster names joined by '/', outermost first */
    int depth;
} dot_decl;

typedef struct {
    char *src, *dst;
} dot_edge;

typedef struct {
    dot_decl *decls;
    int n_decls;
    dot_edge *edges;
    int n_edges;
    char *cluster_label_bad; /* first cluster whose label is not its name without "cluster_" */
    int max_depth;
    bool ok;
    char why[256];
} dot_doc;

static char *dup(const char *s)
{
    return strcpy(malloc(strlen(s) + 1), s);
}

/* Parses "[k=v, k=v; ...]" after the '[' was read; fills the attributes of interest. */
static bool parse_attrs(lexer *x, dot_decl *d, char **label)
{
    for (;;) {
        if (lex(x) == TOK_PUNCT && x->text[0] == ']') return true;
        if (x->kind == TOK_PUNCT && (x->text[0] == ',' || x->text[0] == ';')) continue;
        if (x->kind != TOK_ID) return false;
        char key[64];
        snprintf(key, sizeof key, "%.63s", x->text);
        if (lex(x) != TOK_PUNCT || x->text[0] != '=') return false;
        if (lex(x) != TOK_ID) return false;
        char **slot = !strcmp(key, "label")            ? (d ? &d->label : label)
                      : d && !strcmp(key, "fillcolor") ? &d->fill
                      : d && !strcmp(key, "style")     ? &d->style
                      : d && !strcmp(key, "shape")     ? &d->shape
                                                       : NULL;
        if (slot) {
            free(*slot);
            *slot = dup(x->text);
        }
    }
}

static void parse_dot(const char *text, size_t len, dot_doc *doc)
{
    memset(doc, 0, sizeof *doc);
    lexer x = {.s = text, .len = len};
    char stack[8][512];
    int depth = -1; /* -1 before the digraph's '{' */
    if (lex(&x) != TOK_ID || strcmp(x.text, "digraph") || lex(&x) != TOK_ID ||
        lex(&x) != TOK_PUNCT || x.text[0] != '{') {
        snprintf(doc->why, sizeof doc->why, "no 'digraph NAME {' header");
        return;
    }
    depth = 0;
    int cap_d = 64, cap_e = 64;
    doc->decls = malloc((size_t)cap_d * sizeof *doc->decls);
    doc->edges = malloc((size_t)cap_e * sizeof *doc->edges);
    for (;;) {
        lex(&x);
        if (x.kind == TOK_END || x.kind == TOK_BAD) {
            snprintf(doc->why, sizeof doc->why, "%s at depth %d",
                     x.kind == TOK_END ? "end of text" : "unterminated string", depth);
            return;
        }
        if (x.kind == TOK_PUNCT && x.text[0] == ';') continue;
        if (x.kind == TOK_PUNCT && x.text[0] == '}') {
            if (depth == 0) break;
            depth--;
            continue;
        }
        if (x.kind != TOK_ID) {
            snprintf(doc->why, sizeof doc->why, "unexpected '%.200s'", x.text);
            return;
        }
        if (!strcmp(x.text, "subgraph")) {
            if (lex(&x) != TOK_ID || depth + 1 >= 8) return;
            snprintf(stack[depth + 1], sizeof stack[0], "%.511s", x.text);
            if (lex(&x) != TOK_PUNCT || x.text[0] != '{') return;
            depth++;
            if (depth > doc->max_depth && strcmp(stack[1], "cluster_legend"))
                doc->max_depth = depth;
            continue;
        }
        if (!strcmp(x.text, "graph") || !strcmp(x.text, "node") || !strcmp(x.text, "edge")) {
            bool is_graph = !strcmp(x.text, "graph");
            if (lex(&x) != TOK_PUNCT || x.text[0] != '[') return;
            char *label = NULL;
            if (!parse_attrs(&x, NULL, &label)) return;
            if (is_graph && depth > 0 && strcmp(stack[depth], "cluster_legend") &&
                (!label || strncmp(stack[depth], "cluster_", 8) ||
                 strcmp(label, stack[depth] + 8)) &&
                !doc->cluster_label_bad)
                doc->cluster_label_bad = dup(stack[depth]);
            free(label);
            continue;
        }
        char name[512];
        snprintf(name, sizeof name, "%.511s", x.text);
        lex(&x);
        if (x.kind == TOK_ARROW) {
            if (lex(&x) != TOK_ID) return;
            if (doc->n_edges == cap_e)
                doc->edges = realloc(doc->edges, (cap_e *= 2) * sizeof(dot_edge));
            doc->edges[doc->n_edges++] = (dot_edge){dup(name), dup(x.text)};
            lex(&x);
            if (x.kind == TOK_PUNCT && x.text[0] == '[') {
                dot_decl ignored = {0};
                if (!parse_attrs(&x, &ignored, NULL)) return;
                free(ignored.label), free(ignored.fill), free(ignored.style), free(ignored.shape);
            }
            continue;
        }
        if (doc->n_decls == cap_d)
            doc->decls = realloc(doc->decls, (cap_d *= 2) * sizeof(dot_decl));
        dot_decl *d = &doc->decls[doc->n_decls++];
        memset(d, 0, sizeof *d);
        d->name = dup(name);
        d->depth = depth;
        char path[2048] = "";
        for (int k = 1; k <= depth; k++) {
            strncat(path, stack[k], sizeof path - strlen(path) - 2);
            if (k < depth) strcat(path, "/");
        }
        d->clusters = dup(path);
        if (x.kind == TOK_PUNCT && x.text[0] == '[' && !parse_attrs(&x, d, NULL)) return;
    }
    lex(&x);
    doc->ok = x.kind == TOK_END;
    if (!doc->ok) snprintf(doc->why, sizeof doc->why, "text after the closing brace");
}

static void doc_free(dot_doc *doc)
{
    for (int k = 0; k < doc->n_decls; k++) {
        dot_decl *d = &doc->decls[k];
        free(d->name), free(d->label), free(d->fill), free(d->style), free(d->shape);
        free(d->clusters);
    }
    for (int k = 0; k < doc->n_edges; k++)
        free(doc->edges[k].src), free(doc->edges[k].dst);
    free(doc->decls);
    free(doc->edges);
    free(doc->cluster_label_bad);
}

static const dot_decl *find_decl(const dot_doc *doc, const char *name, int *count)
{
    const dot_decl *found = NULL;
    *count = 0;
    for (int k = 0; k < doc->n_decls; k++)
        if (!strcmp(doc->decls[k].name, name)) {
            found = &doc->decls[k];
            (*count)++;
        }
    return found;
}

static char *dot_text(const gt_graph *g, const char *title, size_t *len)
{
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    gt_graph_write_dot(g, f, title);
    fclose(f);
    return buf;
}

/* ---------------------------------------------------------------- the independent expectations */

/* "cluster_a/cluster_a.b/cluster_a.b.c" for fqn "a.b.c.d": its first (at most) three components. */
static void expected_clusters(const char *fqn, char *out, size_t cap)
{
    out[0] = '\0';
    if (!fqn[0]) return;
    size_t len = strlen(fqn);
    int levels = 0;
    for (size_t k = 0; k <= len && levels < 3; k++) {
        if (k < len && fqn[k] != '.') continue;
        size_t used = strlen(out);
        snprintf(out + used, cap - used, "%scluster_%.*s", levels ? "/" : "", (int)k, fqn);
        levels++;
    }
    /* The writer replaces bytes that never occur in UTF-8 by '?' (the test's odd fqn has one). */
    for (char *p = out; *p; p++)
        if ((unsigned char)*p >= 0xf5 || (unsigned char)*p == 0xc0 || (unsigned char)*p == 0xc1)
            *p = '?';
}

static void node_name(char *buf, size_t cap, char kind, int id)
{
    snprintf(buf, cap, "%c%d", kind, id);
}

/* Structural checks shared by the small graph and debugmodel. */
static void check_structure(const gt_graph *g, const dot_doc *doc, const char *what)
{
    EXPECT(doc->ok, "%s: parse: %s", what, doc->why);
    EXPECT(!doc->cluster_label_bad, "%s: cluster %s not labelled by its module path", what,
           doc->cluster_label_bad);
    EXPECT(doc->max_depth <= 3, "%s: clusters nest %d deep", what, doc->max_depth);
    char name[32], want[2048];
    int missing = 0, misplaced = 0;
    for (gt_node_id n = 0; n < g->n_nodes; n++) {
        int count;
        node_name(name, sizeof name, 'n', n);
        const dot_decl *d = find_decl(doc, name, &count);
        missing += count != 1;
        if (!d) continue;
        expected_clusters(gt_graph_str(g, g->nodes[n].fqn), want, sizeof want);
        if (strcmp(d->clusters, want)) {
            if (!misplaced) fprintf(stderr, "  %s in '%s', want '%s'\n", name, d->clusters, want);
            misplaced++;
        }
    }
    for (int k = 0; k < g->n_inputs; k++) {
        int count;
        node_name(name, sizeof name, 'i', k);
        find_decl(doc, name, &count);
        missing += count != 1;
    }
    for (int k = 0; k < g->n_outputs; k++) {
        int count;
        node_name(name, sizeof name, 'o', k);
        find_decl(doc, name, &count);
        missing += count != 1;
    }
    EXPECT(missing == 0, "%s: %d nodes/inputs/outputs not declared exactly once", what, missing);
    EXPECT(misplaced == 0, "%s: %d nodes outside the clusters of their fqn", what, misplaced);

    /* Expected edges: one per distinct (source, consumer) value use, sources from the graph. */
    int n_expected = 0, absent = 0;
    char src[32], dst[32];
    for (gt_node_id n = 0; n < g->n_nodes; n++) {
        const gt_node *nd = &g->nodes[n];
        for (int k = 0; k < nd->n_in; k++) {
            bool dup_use = false;
            for (int j = 0; j < k; j++)
                dup_use |= nd->in[j] == nd->in[k];
            if (dup_use) continue;
            gt_value_id v = nd->in[k];
            if (g->values[v].producer != GT_NONE) {
                node_name(src, sizeof src, 'n', g->values[v].producer);
            } else {
                int in = 0;
                while (in < g->n_inputs && g->inputs[in].value != v)
                    in++;
                node_name(src, sizeof src, 'i', in);
            }
            node_name(dst, sizeof dst, 'n', n);
            n_expected++;
            bool found = false;
            for (int e = 0; e < doc->n_edges && !found; e++)
                found = !strcmp(doc->edges[e].src, src) && !strcmp(doc->edges[e].dst, dst);
            absent += !found;
        }
    }
    for (int k = 0; k < g->n_outputs; k++) {
        gt_value_id v = g->outputs[k].value;
        gt_node_id p = g->values[v].producer;
        if (p != GT_NONE) {
            node_name(src, sizeof src, 'n', p);
        } else {
            int in = 0;
            while (in < g->n_inputs && g->inputs[in].value != v)
                in++;
            node_name(src, sizeof src, 'i', in);
        }
        node_name(dst, sizeof dst, 'o', k);
        n_expected++;
        bool found = false;
        for (int e = 0; e < doc->n_edges && !found; e++)
            found = !strcmp(doc->edges[e].src, src) && !strcmp(doc->edges[e].dst, dst);
        absent += !found;
    }
    int graph_edges = 0; /* edges other than the legend's layout edges */
    for (int e = 0; e < doc->n_edges; e++)
        graph_edges += strncmp(doc->edges[e].src, "legend_", 7) != 0;
    EXPECT(absent == 0 && graph_edges == n_expected, "%s: %d of %d edges absent, %d written", what,
           absent, n_expected, graph_edges);
}

/* Colour classes: fwd, bwd, opt, recompute; each class one fill, classes pairwise distinct. */
static void check_colours(const gt_graph *g, const dot_doc *doc, const char *what)
{
    const char *fill[4] = {NULL, NULL, NULL, NULL};
    int mixed = 0, seen[4] = {0};
    char name[32];
    for (gt_node_id n = 0; n < g->n_nodes; n++) {
        int cls = gt_node_has_tag(g, &g->nodes[n], "recompute") ? 3 : g->nodes[n].phase;
        int count;
        node_name(name, sizeof name, 'n', n);
        const dot_decl *d = find_decl(doc, name, &count);
        if (!d || !d->fill) {
            mixed++;
            continue;
        }
        seen[cls]++;
        if (!fill[cls]) fill[cls] = d->fill;
        mixed += strcmp(fill[cls], d->fill) != 0;
    }
    EXPECT(mixed == 0, "%s: %d nodes with a fill other than their phase's", what, mixed);
    for (int a = 0; a < 4; a++)
        for (int b = a + 1; b < 4; b++)
            if (fill[a] && fill[b])
                EXPECT(strcmp(fill[a], fill[b]) != 0, "%s: classes %d and %d share fill %s", what,
                       a, b, fill[a]);
    (void)seen;
}

/* ---------------------------------------------------------------- the small graph */

static gt_expr dims_buf[2];
static const gt_expr *d2(gt_graph *g, int64_t a, int64_t b)
{
    dims_buf[0] = gt_c(g, a);
    dims_buf[1] = gt_c(g, b);
    return dims_buf;
}

#define ODD_FQN "odd\"q\\b\xff\xc3\xa9.sub" /* a quote, a backslash, a bad byte, a valid é */

static gt_graph *small_graph(gt_error *err)
{
    gt_graph *g = gt_graph_new();
    gt_value_id x = gt_graph_add_input(g, GT_IN_INPUT, "x", GT_F32, 2, d2(g, 4, 8));
    gt_value_id wq =
        gt_graph_add_input(g, GT_IN_PARAM, "layers.0.attention.wq.weight", GT_F32, 2, d2(g, 8, 8));
    gt_value_id w1 = gt_graph_add_input(g, GT_IN_PARAM, "layers.0.feed_forward.w1.weight", GT_F32,
                                        2, d2(g, 8, 8));
    gt_expr d8 = gt_c(g, 8);
    gt_value_id nw = gt_graph_add_input(g, GT_IN_PARAM, "norm.weight", GT_F32, 1, &d8);
    gt_value_id buf = gt_graph_add_input(g, GT_IN_BUFFER, "freqs", GT_F32, 2, d2(g, 4, 8));
    gt_value_id m = gt_graph_add_input(g, GT_IN_OPT_STATE, "layers.0.attention.wq.weight.exp_avg",
                                       GT_F32, 2, d2(g, 8, 8));
    gt_graph_set_fqn(g, "layers.0.attention.wq");
    gt_value_id q = gt_matmul(g, x, wq, false, false);
    gt_graph_set_fqn(g, "layers.0.attention");
    gt_value_id a = gt_unary(g, GT_OP_SILU, q);
    gt_graph_add_tag(g, g->values[a].producer, "recompute");
    gt_graph_set_fqn(g, "layers.0");
    gt_value_id h = gt_add(g, gt_add(g, x, a), buf);
    gt_graph_set_fqn(g, "layers.0.feed_forward.w1");
    gt_value_id f = gt_matmul(g, h, w1, false, false);
    gt_graph_set_fqn(g, "layers.0.feed_forward");
    gt_value_id f2 = gt_mul(g, f, f);
    gt_graph_set_fqn(g, "norm");
    gt_value_id nrm = gt_rms_norm(g, f2, nw, 1e-5);
    gt_graph_set_fqn(g, ODD_FQN);
    gt_value_id o = gt_unary(g, GT_OP_EXP, nrm);
    gt_graph_set_fqn(g, NULL);
    int all[2] = {0, 1};
    gt_value_id loss = gt_reduce(g, GT_OP_SUM, o, 2, all, false);
    gt_graph_add_output(g, GT_OUT_LOSS, "loss", loss);
    if (gt_autodiff(g, err) != GT_OK) {
        gt_graph_free(g);
        return NULL;
    }
    gt_value_id grad_wq = GT_NONE;
    for (int k = 0; k < g->n_outputs; k++)
        if (g->outputs[k].kind == GT_OUT_GRAD &&
            !strcmp(gt_graph_str(g, g->outputs[k].fqn), "layers.0.attention.wq.weight"))
            grad_wq = g->outputs[k].value;
    g->cur_phase = GT_PHASE_OPTIMIZER;
    gt_graph_set_fqn(g, "layers.0.attention.wq.weight");
    gt_value_id new_m = gt_add(g, gt_scale(g, m, 0.9), gt_scale(g, grad_wq, 0.1));
    gt_value_id new_w = gt_sub(g, wq, gt_scale(g, new_m, 0.01));
    g->cur_phase = GT_PHASE_FORWARD;
    gt_graph_set_fqn(g, NULL);
    gt_graph_add_output(g, GT_OUT_OPT_STATE_UPDATE, "layers.0.attention.wq.weight.exp_avg", new_m);
    gt_graph_add_output(g, GT_OUT_PARAM_UPDATE, "layers.0.attention.wq.weight", new_w);
    gt_graph_add_output(g, GT_OUT_METRIC, "x_passthrough", x); /* an output that is an input */
    if (gt_graph_verify(g, err) != GT_OK) {
        gt_graph_free(g);
        return NULL;
    }
    return g;
}

static bool have_dot(void)
{
    return system("command -v dot >/dev/null 2>&1") == 0;
}

/* dot -Tsvg on the text; true when dot exits 0 and writes a non-empty SVG. */
static bool dot_renders(const char *text, size_t len, const char *tag)
{
    char path[] = "/tmp/gt_test_dot_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return false;
    FILE *f = fdopen(fd, "w");
    fwrite(text, 1, len, f);
    fclose(f);
    char svg[64], cmd[256];
    snprintf(svg, sizeof svg, "%s.svg", path);
    snprintf(cmd, sizeof cmd, "dot -Tsvg '%s' -o '%s' 2>/dev/null", path, svg);
    bool ok = system(cmd) == 0;
    FILE *s = fopen(svg, "rb");
    long size = 0;
    if (s) {
        fseek(s, 0, SEEK_END);
        size = ftell(s);
        fclose(s);
    }
    if (!ok)
        fprintf(stderr, "  dot failed on %s (kept %s)\n", tag, path);
    else
        remove(path);
    remove(svg);
    return ok && size > 0;
}

static void test_small(void)
{
    gt_error err = {0};
    gt_graph *g = small_graph(&err);
    EXPECT(g != NULL, "small graph: %s", err.msg);
    if (!g) return;
    size_t len;
    char *text = dot_text(g, "small \"graph\"", &len);
    dot_doc doc;
    parse_dot(text, len, &doc);
    check_structure(g, &doc, "small");
    check_colours(g, &doc, "small");

    /* Every colour class appears (the test graph is built to have all four). */
    int phases[3] = {0}, recompute = 0;
    for (gt_node_id n = 0; n < g->n_nodes; n++) {
        phases[g->nodes[n].phase]++;
        recompute += gt_node_has_tag(g, &g->nodes[n], "recompute");
    }
    EXPECT(phases[0] && phases[1] && phases[2] && recompute, "graph lacks a phase");

    /* Input kinds and outputs: distinct shapes, none the op nodes' box. */
    const char *shape[4] = {NULL, NULL, NULL, NULL};
    char name[32];
    int count;
    for (int k = 0; k < g->n_inputs; k++) {
        node_name(name, sizeof name, 'i', k);
        const dot_decl *d = find_decl(&doc, name, &count);
        EXPECT(d && d->shape && strcmp(d->shape, "box"), "input %d has no own shape", k);
        if (d && d->shape) shape[g->inputs[k].kind] = d->shape;
    }
    const char *out_shape = NULL;
    for (int k = 0; k < g->n_outputs; k++) {
        node_name(name, sizeof name, 'o', k);
        const dot_decl *d = find_decl(&doc, name, &count);
        EXPECT(d && d->shape && strcmp(d->shape, "box"), "output %d has no own shape", k);
        if (d && d->shape && g->outputs[k].kind != GT_OUT_LOSS) out_shape = d->shape;
    }
    EXPECT(shape[GT_IN_PARAM] && shape[GT_IN_OPT_STATE] && shape[GT_IN_INPUT] && out_shape,
           "missing shapes");
    if (shape[GT_IN_PARAM] && shape[GT_IN_OPT_STATE] && shape[GT_IN_INPUT] && out_shape) {
        const char *s[4] = {shape[GT_IN_PARAM], shape[GT_IN_OPT_STATE], shape[GT_IN_INPUT],
                            out_shape};
        for (int a = 0; a < 4; a++)
            for (int b = a + 1; b < 4; b++)
                EXPECT(strcmp(s[a], s[b]) != 0, "shape %s used for two kinds", s[a]);
    }
    /* A parameter sits in its module's cluster; the INPUT x at the top level. */
    const dot_decl *wq = find_decl(&doc, "i1", &count);
    EXPECT(wq &&
               !strcmp(wq->clusters, "cluster_layers/cluster_layers.0/cluster_layers.0.attention"),
           "PARAM wq in '%s'", wq ? wq->clusters : "?");
    const dot_decl *xin = find_decl(&doc, "i0", &count);
    EXPECT(xin && xin->depth == 0, "INPUT x inside a cluster");

    /* Node labels: "%<first output> <op>" then the type; the op names come from the op table. */
    int bad_labels = 0;
    for (gt_node_id n = 0; n < g->n_nodes; n++) {
        node_name(name, sizeof name, 'n', n);
        const dot_decl *d = find_decl(&doc, name, &count);
        char head[64];
        snprintf(head, sizeof head, "%%%d %s", g->nodes[n].out[0], gt_op_get(g->nodes[n].op)->name);
        bad_labels +=
            !d || !d->label || strncmp(d->label, head, strlen(head)) || !strstr(d->label, "f32[");
    }
    EXPECT(bad_labels == 0, "%d node labels lack '%%id op' or the type", bad_labels);

    /* Escaping: the odd fqn survives as a cluster name with the bad byte replaced, and the text
     * holds no invalid byte at all. */
    char odd_cluster[64];
    snprintf(odd_cluster, sizeof odd_cluster, "cluster_odd\"q\\b?\xc3\xa9");
    int in_odd = 0;
    for (int k = 0; k < doc.n_decls; k++)
        in_odd += strstr(doc.decls[k].clusters, odd_cluster) != NULL;
    EXPECT(in_odd > 0, "no node inside the escaped cluster %s", odd_cluster);
    EXPECT(memchr(text, 0xff, len) == NULL, "invalid UTF-8 byte written");

    /* Stability: the same graph twice, and a deep copy, give identical text. */
    size_t len2, len3;
    char *text2 = dot_text(g, "small \"graph\"", &len2);
    gt_graph *copy = gt_graph_copy(g);
    char *text3 = dot_text(copy, "small \"graph\"", &len3);
    EXPECT(len == len2 && !memcmp(text, text2, len), "two writes differ");
    EXPECT(len == len3 && !memcmp(text, text3, len), "copy writes differently");
    gt_graph *again = small_graph(&err);
    if (again) {
        size_t len4;
        char *text4 = dot_text(again, "small \"graph\"", &len4);
        EXPECT(len == len4 && !memcmp(text, text4, len), "rebuilt graph writes differently");
        free(text4);
        gt_graph_free(again);
    }

    if (have_dot())
        EXPECT(dot_renders(text, len, "small"), "dot rejects the small graph");
    else
        printf("dot not installed: rendering skipped\n");
    free(text), free(text2), free(text3);
    doc_free(&doc);
    gt_graph_free(copy);
    gt_graph_free(g);
}

/* An empty graph and a NULL title still give a well-formed file. */
static void test_empty(void)
{
    gt_graph *g = gt_graph_new();
    size_t len;
    char *text = dot_text(g, NULL, &len);
    dot_doc doc;
    parse_dot(text, len, &doc);
    EXPECT(doc.ok, "empty graph: %s", doc.why);
    doc_free(&doc);
    free(text);
    gt_graph_free(g);
}

static void test_debugmodel(void)
{
    gt_llama3_config cfg;
    gt_error err = {0};
    EXPECT_OK(gt_llama3_flavor("debugmodel", &cfg, &err), &err);
    gt_graph *g = gt_graph_new();
    gt_model m;
    gt_status st = gt_llama3_build(g, &cfg, &m, &err);
    EXPECT(st == GT_OK, "build: %s", err.msg);
    if (st == GT_OK) {
        EXPECT_OK(gt_autodiff(g, &err), &err);
        gt_model_free(&m);
        size_t len;
        char *text = dot_text(g, "debugmodel whole step", &len);
        dot_doc doc;
        parse_dot(text, len, &doc);
        check_structure(g, &doc, "debugmodel");
        check_colours(g, &doc, "debugmodel");
        doc_free(&doc);
        if (have_dot()) EXPECT(dot_renders(text, len, "debugmodel"), "dot rejects debugmodel");
        free(text);
    }
    gt_graph_free(g);
}

int main(void)
{
    test_empty();
    test_small();
    test_debugmodel();
    return gt_test_finish();
}
