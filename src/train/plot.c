/* plot.c — `graphtrain plot`: a standalone SVG of loss and throughput curves from a metrics file.
 *
 * Hand-written SVG 1.1 text, no external tools, so a run's curves can be looked at anywhere a
 * browser is. Two panels share the step axis: loss vs step and tokens/s vs step. Each panel is a
 * white plot area (class "plot-area") with grid lines at "nice" ticks (1, 2 or 5 × 10^k), tick
 * labels, axis labels, and one polyline (class "series") per run of finite values.
 *
 * Axes are linear. Data coordinates map to pixels by
 *   px = left + (step - x_lo) / (x_hi - x_lo) · width
 *   py = top + height - (v - y_lo) / (y_hi - y_lo) · height
 * where [x_lo, x_hi] is the data's step range and [y_lo, y_hi] the data's value range widened to
 * whole ticks (throughput also includes 0, so a dip is not exaggerated). */
#include "graphtrain/gt_metrics.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- a growable string */

typedef struct {
    char *buf;
    size_t len, cap;
} svg_text;

static void svg_printf(svg_text *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void svg_printf(svg_text *s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int need = vsnprintf(s->buf + s->len, s->cap - s->len, fmt, ap);
    va_end(ap);
    GT_CHECK(need >= 0);
    if ((size_t)need >= s->cap - s->len) {
        while ((size_t)need >= s->cap - s->len)
            s->cap *= 2;
        s->buf = gt_xrealloc(s->buf, s->cap);
        va_start(ap, fmt);
        vsnprintf(s->buf + s->len, s->cap - s->len, fmt, ap);
        va_end(ap);
    }
    s->len += (size_t)need;
}

/* Text content for XML: the five special characters escaped; bytes outside printable ASCII
 * become '?', so a title made from an odd file name cannot break the document's encoding. */
static void svg_escaped(svg_text *s, const char *text)
{
    for (const unsigned char *p = (const unsigned char *)text; *p; p++) {
        switch (*p) {
        case '&':
            svg_printf(s, "&amp;");
            break;
        case '<':
            svg_printf(s, "&lt;");
            break;
        case '>':
            svg_printf(s, "&gt;");
            break;
        case '"':
            svg_printf(s, "&quot;");
            break;
        case '\'':
            svg_printf(s, "&apos;");
            break;
        default:
            svg_printf(s, "%c", *p >= 0x20 && *p < 0x7f ? *p : '?');
        }
    }
}

/* ---------------------------------------------------------------- axes */

/* Values beyond this are clamped before plotting, so every span, tick and coordinate below stays
 * finite (such values only come from broken or hostile files). */
#define PLOT_LIMIT 1e300

typedef struct {
    double lo, hi; /* mapped to the two edges of the plot area */
    double tick;   /* distance between ticks */
    double first;  /* the first tick >= lo */
    int n_ticks;   /* ticks first, first + tick, … <= hi */
} axis;

/* 1, 2 or 5 × 10^k, the nearest to raw (raw > 0, finite). */
static double nice_step(double raw)
{
    double mag = pow(10, floor(log10(raw)));
    double f = raw / mag;
    return (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * mag;
}

/* An axis over [lo, hi] (finite, lo <= hi) with about five ticks. widen: move lo and hi out to
 * whole ticks; integer: ticks at whole numbers only (the step axis). */
static axis make_axis(double lo, double hi, bool widen, bool integer)
{
    /* A flat or nearly flat range gets room around it, so ticks are distinct and the curve sits
     * in the middle rather than on an edge. */
    double big = fmax(fabs(lo), fabs(hi));
    if (!(hi - lo >= 1e-9 * big) || hi - lo < 1e-200) {
        double pad = big * 0.05;
        if (pad < 1e-200) pad = 1;
        lo -= pad;
        hi += pad;
    }
    axis a;
    a.tick = nice_step((hi - lo) / 5);
    if (integer && a.tick < 1) a.tick = 1;
    if (widen) {
        lo = floor(lo / a.tick) * a.tick;
        hi = ceil(hi / a.tick) * a.tick;
    }
    a.lo = lo;
    a.hi = hi;
    a.first = ceil(lo / a.tick) * a.tick;
    /* (hi - first) / tick is about 5..12 by construction; the bound only guards rounding. */
    double n = floor((hi - a.first) / a.tick * (1 + 1e-12)) + 1;
    a.n_ticks = n >= 0 && n <= 50 ? (int)n : 0;
    return a;
}

/* A tick label: fixed decimals enough for the tick spacing, with one k/M/G suffix for the whole
 * axis (chosen by its largest magnitude), so labels of one axis read alike. */
static void tick_label(const axis *a, double v, char *buf, size_t n)
{
    double scale = 1;
    const char *suffix = "";
    double big = fmax(fabs(a->lo), fabs(a->hi));
    if (big >= 1e9) {
        scale = 1e9;
        suffix = "G";
    } else if (big >= 1e6) {
        scale = 1e6;
        suffix = "M";
    } else if (big >= 1e4) {
        scale = 1e3;
        suffix = "k";
    }
    double t = a->tick / scale;
    if (big / scale >= 1e6 || t < 1e-6) {
        snprintf(buf, n, "%.3g", v); /* beyond G, or absurdly fine ticks */
        return;
    }
    int decimals = t >= 1 ? 0 : (int)ceil(-log10(t) - 1e-9);
    if (fabs(v) < a->tick * 1e-9) {
        snprintf(buf, n, "0"); /* not "-0.0" from rounding, nor "0.0M" */
        return;
    }
    snprintf(buf, n, "%.*f%s", decimals, v / scale, suffix);
}

/* ---------------------------------------------------------------- panels */

typedef struct {
    int left, top, width, height; /* the plot area, in pixels */
} panel_box;

static double clamp_value(double v)
{
    return v > PLOT_LIMIT ? PLOT_LIMIT : v < -PLOT_LIMIT ? -PLOT_LIMIT : v;
}

static double px_of(const axis *a, const panel_box *b, double x)
{
    double p = b->left + (x - a->lo) / (a->hi - a->lo) * b->width;
    return fmin(fmax(p, b->left), b->left + b->width);
}

static double py_of(const axis *a, const panel_box *b, double y)
{
    double p = b->top + b->height - (y - a->lo) / (a->hi - a->lo) * b->height;
    return fmin(fmax(p, b->top), b->top + b->height);
}

/* One panel: frame, grid, ticks, labels and the curve of (steps[i], values[i]), i < n, with steps
 * increasing. Non-finite values break the curve; a lone finite point is drawn as a dot. */
static void draw_panel(svg_text *s, const panel_box *b, const char *id, const char *y_label,
                       const double *steps, const double *values, int64_t n, bool from_zero,
                       const axis *xa)
{
    double lo = INFINITY, hi = -INFINITY;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(values[i])) continue;
        lo = fmin(lo, clamp_value(values[i]));
        hi = fmax(hi, clamp_value(values[i]));
    }
    if (lo > hi) lo = hi = 0; /* nothing finite: an empty panel with a unit axis */
    if (from_zero && lo > 0) lo = 0;
    axis ya = make_axis(lo, hi, true, false);

    svg_printf(s, "<g class=\"panel\" id=\"%s\">\n", id);
    svg_printf(s,
               "<rect class=\"plot-area\" x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" "
               "fill=\"white\" stroke=\"#555\" stroke-width=\"1\"/>\n",
               b->left, b->top, b->width, b->height);
    char label[64];
    for (int i = 0; i < ya.n_ticks; i++) {
        double v = ya.first + i * ya.tick;
        double y = py_of(&ya, b, v);
        svg_printf(s,
                   "<line x1=\"%d\" y1=\"%.2f\" x2=\"%d\" y2=\"%.2f\" stroke=\"#ddd\"/>"
                   "<line x1=\"%d\" y1=\"%.2f\" x2=\"%d\" y2=\"%.2f\" stroke=\"#555\"/>",
                   b->left, y, b->left + b->width, y, b->left - 5, y, b->left, y);
        tick_label(&ya, v, label, sizeof label);
        svg_printf(s, "<text x=\"%d\" y=\"%.2f\" text-anchor=\"end\">%s</text>\n", b->left - 8,
                   y + 4, label);
    }
    for (int i = 0; i < xa->n_ticks; i++) {
        double v = xa->first + i * xa->tick;
        double x = px_of(xa, b, v);
        int bottom = b->top + b->height;
        svg_printf(s,
                   "<line x1=\"%.2f\" y1=\"%d\" x2=\"%.2f\" y2=\"%d\" stroke=\"#eee\"/>"
                   "<line x1=\"%.2f\" y1=\"%d\" x2=\"%.2f\" y2=\"%d\" stroke=\"#555\"/>",
                   x, b->top, x, bottom, x, bottom, x, bottom + 5);
        tick_label(xa, v, label, sizeof label);
        svg_printf(s, "<text x=\"%.2f\" y=\"%d\" text-anchor=\"middle\">%s</text>\n", x,
                   bottom + 18, label);
    }
    svg_printf(s, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">step</text>\n",
               b->left + b->width / 2, b->top + b->height + 36);
    int ly = b->top + b->height / 2;
    svg_printf(s,
               "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" transform=\"rotate(-90 %d %d)\">"
               "%s</text>\n",
               b->left - 62, ly, b->left - 62, ly, y_label);

    /* The curve: one polyline per run of consecutive finite values. */
    int64_t i = 0;
    while (i < n) {
        if (!isfinite(values[i])) {
            i++;
            continue;
        }
        int64_t j = i;
        while (j < n && isfinite(values[j]))
            j++;
        if (j - i == 1) {
            svg_printf(s, "<circle class=\"dot\" cx=\"%.2f\" cy=\"%.2f\" r=\"2.5\" fill=\"%s\"/>\n",
                       px_of(xa, b, steps[i]), py_of(&ya, b, clamp_value(values[i])), "#1f77b4");
        }
        svg_printf(s, "<polyline class=\"series\" fill=\"none\" stroke=\"#1f77b4\" "
                      "stroke-width=\"1.5\" stroke-linejoin=\"round\" points=\"");
        for (int64_t k = i; k < j; k++)
            svg_printf(s, "%s%.2f,%.2f", k > i ? " " : "", px_of(xa, b, steps[k]),
                       py_of(&ya, b, clamp_value(values[k])));
        svg_printf(s, "\"/>\n");
        i = j;
    }
    svg_printf(s, "</g>\n");
}

/* ---------------------------------------------------------------- the document */

typedef struct {
    int64_t step;
    int64_t index;
} step_ref;

static int step_ref_cmp(const void *a, const void *b)
{
    const step_ref *x = a, *y = b;
    if (x->step != y->step) return x->step < y->step ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index;
}

gt_status gt_metrics_plot_svg(const gt_metrics_log *log, const gt_plot_options *opt, char **svg_out,
                              gt_error *err)
{
    *svg_out = NULL;
    const char *title = opt && opt->title ? opt->title : "graphtrain metrics";
    int width = opt && opt->width ? opt->width : 900;
    int height = opt && opt->height ? opt->height : 640;
    if (width < 320 || width > 20000 || height < 320 || height > 20000)
        return gt_error_set(err, GT_ERR_INVALID,
                            "plot size %dx%d: width and height must be 320..20000 pixels", width,
                            height);
    if (log->n_steps <= 0)
        return gt_error_set(err, GT_ERR_INVALID, "plot: the metrics log has no records");

    /* Step order, the last record of a repeated step winning (a resumed run re-logs the steps
     * after its checkpoint). Sorting by (step, file position) makes that the last of each run. */
    step_ref *refs = gt_xmalloc((size_t)log->n_steps * sizeof *refs);
    for (int64_t i = 0; i < log->n_steps; i++)
        refs[i] = (step_ref){log->steps[i].step, i};
    qsort(refs, (size_t)log->n_steps, sizeof *refs, step_ref_cmp);
    double *steps = gt_xmalloc((size_t)log->n_steps * sizeof *steps);
    double *loss = gt_xmalloc((size_t)log->n_steps * sizeof *loss);
    double *tps = gt_xmalloc((size_t)log->n_steps * sizeof *tps);
    int64_t n = 0;
    for (int64_t i = 0; i < log->n_steps; i++) {
        if (i + 1 < log->n_steps && refs[i + 1].step == refs[i].step) continue;
        const gt_metrics_step *m = &log->steps[refs[i].index];
        steps[n] = (double)m->step;
        loss[n] = m->loss;
        tps[n] = m->tokens_per_second;
        n++;
    }

    /* Layout: a title band, then two equal panels, each with room left for tick and axis labels
     * and below for the step labels. */
    const int title_band = 48, left = 84, right = 28, above = 26, below = 46;
    int slot = (height - title_band) / 2;
    panel_box boxes[2];
    for (int p = 0; p < 2; p++)
        boxes[p] = (panel_box){left, title_band + p * slot + above, width - left - right,
                               slot - above - below};
    axis xa = make_axis(steps[0], steps[n - 1], false, true);

    svg_text s = {gt_xmalloc(1 << 14), 0, 1 << 14};
    s.buf[0] = '\0';
    svg_printf(&s, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    svg_printf(&s,
               "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"%d\" "
               "height=\"%d\" viewBox=\"0 0 %d %d\" font-family=\"DejaVu Sans, Helvetica, Arial, "
               "sans-serif\" font-size=\"12\" fill=\"#222\">\n",
               width, height, width, height);
    svg_printf(&s, "<title>");
    svg_escaped(&s, title);
    svg_printf(&s, "</title>\n<rect x=\"0\" y=\"0\" width=\"%d\" height=\"%d\" fill=\"white\"/>\n",
               width, height);
    svg_printf(&s,
               "<text x=\"%d\" y=\"30\" text-anchor=\"middle\" font-size=\"17\" "
               "font-weight=\"bold\">",
               width / 2);
    svg_escaped(&s, title);
    svg_printf(&s, "</text>\n");
    /* Panel headings with the latest finite value, the number a person looks for first. */
    const char *heads[2] = {"loss", "throughput"};
    const double *series[2] = {loss, tps};
    for (int p = 0; p < 2; p++) {
        svg_printf(
            &s, "<text x=\"%d\" y=\"%d\"><tspan font-size=\"13\" font-weight=\"bold\">%s</tspan>",
            boxes[p].left, boxes[p].top - 8, heads[p]);
        int64_t last = n - 1;
        while (last >= 0 && !isfinite(series[p][last]))
            last--;
        if (last >= 0 && fabs(series[p][last]) < 1e15) {
            svg_printf(&s, "<tspan dx=\"12\" fill=\"#666\">");
            if (p == 0)
                svg_printf(&s, "last %.4f at step %.0f", series[p][last], steps[last]);
            else
                svg_printf(&s, "last %.0f tokens/s at step %.0f", series[p][last], steps[last]);
            svg_printf(&s, "</tspan>");
        }
        svg_printf(&s, "</text>\n");
    }
    draw_panel(&s, &boxes[0], "loss", "loss (nats/token)", steps, loss, n, false, &xa);
    draw_panel(&s, &boxes[1], "throughput", "tokens/s", steps, tps, n, true, &xa);
    svg_printf(&s, "</svg>\n");

    free(refs);
    free(steps);
    free(loss);
    free(tps);
    *svg_out = s.buf;
    return GT_OK;
}

gt_status gt_metrics_plot_file(const char *metrics_path, const char *svg_path,
                               const gt_plot_options *opt, gt_error *err)
{
    gt_metrics_log log;
    GT_TRY(gt_metrics_read(metrics_path, &log, err));
    gt_plot_options o = opt ? *opt : (gt_plot_options){0};
    if (!o.title) o.title = metrics_path;
    char *svg;
    gt_status st = gt_metrics_plot_svg(&log, &o, &svg, err);
    gt_metrics_log_free(&log);
    if (st != GT_OK) return gt_error_wrap(err, "plot of %s", metrics_path);

    /* Temporary name, then rename: a browser reloading the file never sees half a plot. */
    size_t plen = strlen(svg_path);
    char *tmp = gt_xmalloc(plen + 5);
    memcpy(tmp, svg_path, plen);
    memcpy(tmp + plen, ".tmp", 5);
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        st = gt_error_set(err, GT_ERR_IO, "plot %s: cannot create %s: %s", svg_path, tmp,
                          strerror(errno));
    } else {
        size_t len = strlen(svg);
        bool ok = fwrite(svg, 1, len, f) == len;
        ok = (fclose(f) == 0) && ok;
        if (!ok)
            st = gt_error_set(err, GT_ERR_IO, "plot %s: write of %s failed: %s", svg_path, tmp,
                              strerror(errno));
        else if (rename(tmp, svg_path) != 0)
            st = gt_error_set(err, GT_ERR_IO, "plot %s: rename from %s failed: %s", svg_path, tmp,
                              strerror(errno));
        if (st != GT_OK) remove(tmp);
    }
    free(tmp);
    free(svg);
    return st;
}
