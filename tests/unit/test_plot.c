/* test_plot.c — the SVG of `graphtrain plot`.
 *
 * Checks the document is well-formed XML (a small independent checker below: balanced tags,
 * quoted attributes, valid entities, one root), that each panel's curve has one point per step,
 * every point inside its plot area, and that points sit where a linear axis puts them (pixel
 * position an affine function of step and of value, larger values higher up). Also: a resumed
 * run's repeated steps, NaN gaps, a single record, hostile values, and error cases. */
#include "graphtrain/gt_metrics.h"
#include "gt_test.h"

#include <ctype.h>
#include <string.h>
#include <unistd.h>

/* ---------------------------------------------------------------- a tiny XML checker */

static bool entity_ok(const char *p)
{
    static const char *names[] = {"&amp;", "&lt;", "&gt;", "&quot;", "&apos;"};
    for (int i = 0; i < 5; i++)
        if (strncmp(p, names[i], strlen(names[i])) == 0) return true;
    return false;
}

static bool name_char(char c)
{
    return isalnum((unsigned char)c) || strchr("-_:.", c);
}

/* Returns true when doc is one well-formed element (after an optional <?xml ...?>). */
static bool xml_well_formed(const char *doc, char *why, size_t n)
{
    const char *p = doc;
    char stack[64][32];
    int depth = 0, roots = 0;
    if (strncmp(p, "<?xml", 5) == 0) {
        p = strstr(p, "?>");
        if (!p) return snprintf(why, n, "unterminated prolog"), false;
        p += 2;
    }
    while (*p) {
        if (*p != '<') {
            if (depth == 0 && !isspace((unsigned char)*p))
                return snprintf(why, n, "text outside the root at %td", p - doc), false;
            if (*p == '&' && !entity_ok(p))
                return snprintf(why, n, "bad entity at %td", p - doc), false;
            p++;
            continue;
        }
        if (strncmp(p, "</", 2) == 0) {
            p += 2;
            const char *s = p;
            while (name_char(*p))
                p++;
            if (depth == 0 || (size_t)(p - s) != strlen(stack[depth - 1]) ||
                strncmp(s, stack[depth - 1], (size_t)(p - s)) != 0 || *p != '>')
                return snprintf(why, n, "mismatched close tag at %td", s - doc), false;
            depth--;
            p++;
            continue;
        }
        p++;
        const char *s = p;
        while (name_char(*p))
            p++;
        if (p == s || p - s >= 32) return snprintf(why, n, "bad tag name at %td", s - doc), false;
        char name[32];
        memcpy(name, s, (size_t)(p - s));
        name[p - s] = '\0';
        for (;;) {
            while (isspace((unsigned char)*p))
                p++;
            if (*p == '>' || strncmp(p, "/>", 2) == 0) break;
            const char *a = p;
            while (name_char(*p))
                p++;
            if (p == a || *p != '=' || p[1] != '"')
                return snprintf(why, n, "bad attribute at %td", a - doc), false;
            p += 2;
            while (*p && *p != '"') {
                if (*p == '<') return snprintf(why, n, "'<' in attribute at %td", p - doc), false;
                if (*p == '&' && !entity_ok(p))
                    return snprintf(why, n, "bad entity at %td", p - doc), false;
                p++;
            }
            if (!*p) return snprintf(why, n, "unterminated attribute"), false;
            p++;
            if (!isspace((unsigned char)*p) && *p != '>' && *p != '/')
                return snprintf(why, n, "no space after attribute at %td", p - doc), false;
        }
        if (depth == 0) roots++;
        if (*p == '>') {
            if (depth == 64) return snprintf(why, n, "too deep"), false;
            strcpy(stack[depth++], name);
            p++;
        } else {
            p += 2;
        }
    }
    if (depth != 0) return snprintf(why, n, "%d unclosed elements", depth), false;
    if (roots != 1) return snprintf(why, n, "%d root elements", roots), false;
    return true;
}

/* ---------------------------------------------------------------- reading the plot back */

typedef struct {
    double x, y, w, h;         /* the plot area */
    int n_lines;               /* polylines */
    int n_points[8];           /* points of each polyline */
    double px[4096], py[4096]; /* all points, in order */
    int n;
    int n_dots;
} panel_view;

static double attr(const char *tag, const char *name)
{
    char key[64];
    snprintf(key, sizeof key, " %s=\"", name);
    const char *p = strstr(tag, key);
    return p ? strtod(p + strlen(key), NULL) : NAN;
}

/* Reads <g class="panel" id="ID"> … </g> of svg. */
static bool read_panel(const char *svg, const char *id, panel_view *v)
{
    memset(v, 0, sizeof *v);
    char open[64];
    snprintf(open, sizeof open, "<g class=\"panel\" id=\"%s\">", id);
    const char *g = strstr(svg, open);
    if (!g) return false;
    const char *end = strstr(g, "</g>");
    const char *r = strstr(g, "<rect class=\"plot-area\"");
    if (!end || !r || r > end) return false;
    v->x = attr(r, "x");
    v->y = attr(r, "y");
    v->w = attr(r, "width");
    v->h = attr(r, "height");
    for (const char *d = strstr(g, "<circle class=\"dot\""); d && d < end;
         d = strstr(d + 1, "<circle class=\"dot\""))
        v->n_dots++;
    for (const char *l = strstr(g, "<polyline class=\"series\""); l && l < end;
         l = strstr(l + 1, "<polyline class=\"series\"")) {
        const char *p = strstr(l, " points=\"") + 9;
        int k = 0;
        while (*p != '"') {
            char *q;
            double x = strtod(p, &q);
            if (*q != ',' || v->n >= 4096) return false;
            double y = strtod(q + 1, &q);
            v->px[v->n] = x;
            v->py[v->n] = y;
            v->n++;
            k++;
            p = q;
            while (*p == ' ')
                p++;
        }
        if (v->n_lines < 8) v->n_points[v->n_lines] = k;
        v->n_lines++;
    }
    return true;
}

static bool inside(const panel_view *v)
{
    for (int i = 0; i < v->n; i++)
        if (!(v->px[i] >= v->x && v->px[i] <= v->x + v->w && v->py[i] >= v->y &&
              v->py[i] <= v->y + v->h))
            return false;
    return true;
}

/* Pixel coordinates are written to 0.01 px, so an affine map is checked to 0.02 px. */
static bool affine(const double *pix, const double *data, int n, bool descending)
{
    int lo = 0, hi = 0;
    for (int i = 1; i < n; i++) {
        if (data[i] < data[lo]) lo = i;
        if (data[i] > data[hi]) hi = i;
    }
    if (data[hi] == data[lo]) return false;
    double k = (pix[hi] - pix[lo]) / (data[hi] - data[lo]);
    if (descending ? k >= 0 : k <= 0) return false;
    for (int i = 0; i < n; i++)
        if (fabs(pix[lo] + k * (data[i] - data[lo]) - pix[i]) > 0.02) return false;
    return true;
}

/* The panel's y-axis ticks: (value, pixel y) of each labelled tick, value read from its label
 * ("12k" = 12000) and y from the tick mark drawn just before the label. */
static int read_y_ticks(const char *svg, const char *id, double *val, double *py, int max)
{
    char open[64];
    snprintf(open, sizeof open, "<g class=\"panel\" id=\"%s\">", id);
    const char *g = strstr(svg, open);
    const char *end = g ? strstr(g, "</g>") : NULL;
    int n = 0;
    for (const char *t = g ? strstr(g, "text-anchor=\"end\">") : NULL; t && t < end && n < max;
         t = strstr(t + 1, "text-anchor=\"end\">")) {
        char *q;
        double v = strtod(t + strlen("text-anchor=\"end\">"), &q);
        v *= *q == 'k' ? 1e3 : *q == 'M' ? 1e6 : *q == 'G' ? 1e9 : 1;
        const char *line = NULL;
        for (const char *l = strstr(g, "<line "); l && l < t; l = strstr(l + 1, "<line "))
            line = l;
        if (!line) return -1;
        val[n] = v;
        py[n] = attr(line, "y1");
        n++;
    }
    return n;
}

static gt_metrics_step rec(int64_t step, double loss, double tps)
{
    return (gt_metrics_step){.step = step, .loss = loss, .tokens_per_second = tps};
}

/* ---------------------------------------------------------------- tests */

static void test_curves(void)
{
    enum { N = 60 };
    gt_metrics_step s[N];
    double steps[N], loss[N], tps[N];
    for (int i = 0; i < N; i++) {
        steps[i] = 5 * (i + 1);
        loss[i] = 8.0 * exp(-i / 12.0) + 2.3 + 0.05 * sin(i);
        tps[i] = 12000 + 800 * sin(i / 3.0) - (i == 0 ? 9000 : 0); /* slow first step */
        s[i] = rec((int64_t)steps[i], loss[i], tps[i]);
    }
    gt_metrics_log log = {s, N};
    char *svg;
    gt_error err = {0};
    EXPECT_OK(gt_metrics_plot_svg(&log, &(gt_plot_options){.title = "run <a> & \"b\""}, &svg, &err),
              &err);
    if (!svg) return;
    char why[128] = "";
    EXPECT(xml_well_formed(svg, why, sizeof why), "not well-formed: %s", why);
    EXPECT(strstr(svg, "<svg xmlns=\"http://www.w3.org/2000/svg\"") != NULL, "svg root");
    EXPECT(strstr(svg, "run &lt;a&gt; &amp; &quot;b&quot;") != NULL, "escaped title");
    EXPECT(!strstr(svg, "nan") && !strstr(svg, "inf"), "no non-numbers in the document");

    const char *ids[2] = {"loss", "throughput"};
    const double *values[2] = {loss, tps};
    for (int p = 0; p < 2; p++) {
        panel_view v;
        EXPECT(read_panel(svg, ids[p], &v), "panel %s", ids[p]);
        EXPECT(v.w > 100 && v.h > 100, "panel %s area %gx%g", ids[p], v.w, v.h);
        EXPECT(v.n_lines == 1 && v.n == N, "panel %s: %d polylines, %d points", ids[p], v.n_lines,
               v.n);
        EXPECT(inside(&v), "panel %s: a point lies outside the plot area", ids[p]);
        EXPECT(affine(v.px, steps, v.n, false), "panel %s: x not linear in step", ids[p]);
        EXPECT(affine(v.py, values[p], v.n, true), "panel %s: y not linear in value", ids[p]);
        /* The curve agrees with its own axis: a value sits where the ticks say it should, and
         * the ticks cover every value. */
        double tv[32], ty[32];
        int nt = read_y_ticks(svg, ids[p], tv, ty, 32);
        EXPECT(nt >= 3, "panel %s: %d y ticks", ids[p], nt);
        if (nt >= 3) {
            double k = (ty[nt - 1] - ty[0]) / (tv[nt - 1] - tv[0]);
            int off = 0;
            for (int i = 0; i < N; i++) {
                if (values[p][i] < tv[0] || values[p][i] > tv[nt - 1]) off++;
                if (fabs(ty[0] + k * (values[p][i] - tv[0]) - v.py[i]) > 0.05) off++;
            }
            EXPECT(off == 0, "panel %s: %d points disagree with the axis ticks", ids[p], off);
        }
        /* The curve spans the step axis edge to edge. */
        EXPECT(fabs(v.px[0] - v.x) < 0.01 && fabs(v.px[v.n - 1] - (v.x + v.w)) < 0.01,
               "panel %s x span %g..%g", ids[p], v.px[0], v.px[v.n - 1]);
    }
    /* Axis labels and ticks are there. */
    EXPECT(strstr(svg, ">step</text>") && strstr(svg, ">tokens/s</text>") &&
               strstr(svg, ">loss (nats/token)</text>"),
           "axis labels");
    EXPECT(strstr(svg, "text-anchor=\"end\">12k</text>") != NULL, "a throughput tick of 12k");
    EXPECT(strstr(svg, "text-anchor=\"middle\">300</text>") != NULL, "a step tick of 300");
    free(svg);
}

static void test_resumed_and_gaps(void)
{
    /* Steps 1..10, then a resume from step 5 that re-logs 6..12 with other values: the plot has
     * one point per step and the later values win. */
    gt_metrics_step s[17];
    double want_loss[12], steps[12];
    int k = 0;
    for (int i = 1; i <= 10; i++)
        s[k++] = rec(i, 100.0 + i, 1000);
    for (int i = 6; i <= 12; i++)
        s[k++] = rec(i, 50.0 - i, 1000 + i);
    for (int i = 1; i <= 12; i++) {
        steps[i - 1] = i;
        want_loss[i - 1] = i <= 5 ? 100.0 + i : 50.0 - i;
    }
    gt_metrics_log log = {s, k};
    char *svg;
    gt_error err = {0};
    EXPECT_OK(gt_metrics_plot_svg(&log, NULL, &svg, &err), &err);
    panel_view v;
    EXPECT(svg && read_panel(svg, "loss", &v), "loss panel");
    EXPECT(v.n == 12 && v.n_lines == 1, "%d points", v.n);
    EXPECT(affine(v.py, want_loss, 12, true) && affine(v.px, steps, 12, false),
           "later records must win");
    free(svg);

    /* A NaN loss breaks the curve into two polylines; an isolated point becomes a dot. */
    gt_metrics_step g[9];
    for (int i = 0; i < 9; i++)
        g[i] = rec(i + 1, 3.0 - 0.1 * i, 500);
    g[4].loss = NAN;
    g[7].loss = INFINITY;
    log = (gt_metrics_log){g, 9};
    EXPECT_OK(gt_metrics_plot_svg(&log, NULL, &svg, &err), &err);
    EXPECT(svg && read_panel(svg, "loss", &v), "loss panel");
    EXPECT(v.n_lines == 3 && v.n == 7 && v.n_points[0] == 4 && v.n_points[1] == 2 &&
               v.n_points[2] == 1 && v.n_dots == 1,
           "%d lines, %d points, %d dots", v.n_lines, v.n, v.n_dots);
    EXPECT(inside(&v), "points inside");
    char why[128] = "";
    EXPECT(xml_well_formed(svg, why, sizeof why), "not well-formed: %s", why);
    free(svg);
}

static void test_edge_values(void)
{
    /* One record; flat curves; hostile magnitudes. All must give a valid document with every
     * point inside its area. */
    gt_metrics_step one = rec(7, 2.5, 100);
    gt_metrics_step flat[3] = {rec(1, 4, 0), rec(2, 4, 0), rec(3, 4, 0)};
    gt_metrics_step wild[4] = {rec(0, 1e308, -1e308), rec(INT64_MAX / 2, -1e308, 5e-324),
                               rec(INT64_MAX, 5e-324, 1e300), rec(3, -0.0, 1e-300)};
    gt_metrics_log logs[3] = {{&one, 1}, {flat, 3}, {wild, 4}};
    for (int t = 0; t < 3; t++) {
        char *svg = NULL;
        gt_error err = {0};
        EXPECT_OK(gt_metrics_plot_svg(&logs[t], NULL, &svg, &err), &err);
        if (!svg) continue;
        char why[128] = "";
        EXPECT(xml_well_formed(svg, why, sizeof why), "case %d not well-formed: %s", t, why);
        EXPECT(!strstr(svg, "nan") && !strstr(svg, "inf"), "case %d has non-numbers", t);
        panel_view v;
        for (int p = 0; p < 2; p++) {
            EXPECT(read_panel(svg, p ? "throughput" : "loss", &v), "case %d panel", t);
            EXPECT(v.n == logs[t].n_steps && inside(&v), "case %d panel %d: %d points", t, p, v.n);
        }
        free(svg);
    }
}

static void test_errors_and_file(void)
{
    gt_error err = {0};
    char *svg;
    gt_metrics_log empty = {NULL, 0};
    EXPECT(gt_metrics_plot_svg(&empty, NULL, &svg, &err) == GT_ERR_INVALID && !svg, "empty log");
    gt_metrics_step one = rec(1, 1, 1);
    gt_metrics_log log = {&one, 1};
    gt_error_clear(&err);
    EXPECT(gt_metrics_plot_svg(&log, &(gt_plot_options){.width = 10}, &svg, &err) ==
                   GT_ERR_INVALID &&
               strstr(err.msg, "10x640"),
           "%s", err.msg);

    /* An empty metrics file: a clear error naming it. */
    char in[] = "/tmp/gt_test_plot_in_XXXXXX";
    int fd = mkstemp(in);
    close(fd);
    char out[64];
    snprintf(out, sizeof out, "%s.svg", in);
    gt_error_clear(&err);
    gt_status st = gt_metrics_plot_file(in, out, NULL, &err);
    EXPECT(st == GT_ERR_FORMAT && strstr(err.msg, in) && strstr(err.msg, "no metrics records"),
           "%s", err.msg);
    EXPECT(access(out, F_OK) != 0, "no SVG for an empty file");

    /* A real file written by the writer, plotted to a file. */
    gt_metrics_writer w;
    remove(in);
    EXPECT_OK(gt_metrics_writer_open(&w, in, &err), &err);
    for (int i = 1; i <= 20; i++) {
        gt_metrics_step m = {.step = i,
                             .loss = 5.0 / i,
                             .tokens = 4096,
                             .step_seconds = 0.1 + i,
                             .peak_memory_bytes = -1};
        gt_metrics_derive(&m);
        EXPECT_OK(gt_metrics_writer_append(&w, &m, &err), &err);
    }
    gt_metrics_writer_close(&w);
    EXPECT_OK(gt_metrics_plot_file(in, out, NULL, &err), &err);
    FILE *f = fopen(out, "r");
    static char doc[1 << 20];
    size_t len = f ? fread(doc, 1, sizeof doc - 1, f) : 0;
    doc[len] = '\0';
    if (f) fclose(f);
    char why[128] = "";
    EXPECT(len > 0 && xml_well_formed(doc, why, sizeof why), "file not well-formed: %s", why);
    EXPECT(strstr(doc, in) != NULL, "default title is the metrics path");
    panel_view v;
    EXPECT(read_panel(doc, "throughput", &v) && v.n == 20 && inside(&v), "20 points");
    remove(in);
    remove(out);
}

int main(void)
{
    test_curves();
    test_resumed_and_gaps();
    test_edge_values();
    test_errors_and_file();
    return gt_test_finish();
}
