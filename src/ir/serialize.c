/* serialize.c — a graph as text and back (gt_graph_write / gt_graph_read), for precompiled step
 * artifacts: one rank compiles, every rank loads.
 *
 * Format (version 2), one record per line, tokens separated by one space:
 *   graphtrain-graph 2 N_VALUES N_NODES N_INPUTS N_OUTPUTS
 *   mesh NDIM (SIZE NAME)*
 *   input ID KIND FQN TP ROLE AS_PARAM UNIT VALUE
 *                                           one per graph input, in order (TP ROLE AS_PARAM UNIT:
 *                                           its gt_param_plan)
 *   node ID OP PHASE ORIGIN UNIT FQN NTAGS TAG* NIN IN* NI I* NF F* NE E* NOUT (VID VALUE)*
 *                                           one per node, in order (UNIT: gt_node.unit)
 *   output KIND FQN VID                     one per graph output, in order
 *   end
 * where VALUE is DTYPE NDIM DIM* PLACE* NAME. A string token is the string with bytes <= ' ',
 * >= 0x7f, '%' and '~' written as %XX; the empty string is "~". Dims and expression attributes
 * are gt_sym_format text (as string tokens); doubles are C99 hex floats (exact); a placement is
 * KIND,DIM,ORDER,PADDED per mesh dim.
 *
 * Reading replays the graph through the builder (gt_graph_add_input / gt_graph_add_node): every
 * node's output types come from its shape rule again and must equal the recorded ones, and the
 * result passes gt_graph_verify. Value ids are remapped (the reader numbers values in replay
 * order); node ids are kept. Anything malformed is an error naming the line; never a crash. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graphtrain/gt_graph.h"
#include "graphtrain/gt_sym.h"

#define GT_GRAPH_TEXT_VERSION 2

/* ---------------------------------------------------------------- writing */

static void put_str(FILE *f, const char *s)
{
    fputc(' ', f);
    if (!s || !*s) {
        fputc('~', f);
        return;
    }
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        if (*p <= ' ' || *p >= 0x7f || *p == '%' || *p == '~')
            fprintf(f, "%%%02X", *p);
        else
            fputc(*p, f);
}

static void put_expr(FILE *f, const gt_graph *g, gt_expr e)
{
    char small[256];
    int n = gt_sym_format(g->sym, e, small, sizeof small);
    if (n < (int)sizeof small) {
        put_str(f, small);
        return;
    }
    char *big = gt_xmalloc((size_t)n + 1);
    gt_sym_format(g->sym, e, big, (size_t)n + 1);
    put_str(f, big);
    free(big);
}

/* DTYPE NDIM DIM* PLACE* NAME of value v */
static void put_value(FILE *f, const gt_graph *g, gt_value_id v)
{
    const gt_value *val = &g->values[v];
    fprintf(f, " %d %d", (int)val->type.dtype, val->type.ndim);
    for (int d = 0; d < val->type.ndim; d++)
        put_expr(f, g, val->type.dims[d]);
    for (int d = 0; d < g->mesh.ndim; d++) {
        gt_placement p = val->place[d];
        fprintf(f, " %u,%d,%u,%u", p.kind, p.dim, p.order, p.padded);
    }
    put_str(f, gt_graph_str(g, val->name));
}

gt_status gt_graph_write(const gt_graph *g, FILE *f, gt_error *err)
{
    fprintf(f, "graphtrain-graph %d %d %d %d %d\n", GT_GRAPH_TEXT_VERSION, g->n_values, g->n_nodes,
            g->n_inputs, g->n_outputs);
    fprintf(f, "mesh %d", g->mesh.ndim);
    for (int d = 0; d < g->mesh.ndim; d++) {
        fprintf(f, " %d", g->mesh.size[d]);
        put_str(f, gt_graph_str(g, g->mesh.name[d]));
    }
    fputc('\n', f);
    for (int32_t k = 0; k < g->n_inputs; k++) {
        const gt_param_plan *pl = &g->inputs[k].plan;
        fprintf(f, "input %d %d", g->inputs[k].value, g->inputs[k].kind);
        put_str(f, gt_graph_str(g, g->inputs[k].fqn));
        fprintf(f, " %u %u %u %d", pl->tp, pl->role, pl->as_param, pl->unit);
        put_value(f, g, g->inputs[k].value);
        fputc('\n', f);
    }
    for (gt_node_id n = 0; n < g->n_nodes; n++) {
        const gt_node *nd = &g->nodes[n];
        fprintf(f, "node %d %s %d %d %d", n, gt_op_get(nd->op)->name, nd->phase, nd->origin,
                nd->unit);
        put_str(f, gt_graph_str(g, nd->fqn));
        fprintf(f, " %d", nd->n_tags);
        for (int t = 0; t < nd->n_tags; t++)
            put_str(f, gt_graph_str(g, nd->tags[t]));
        fprintf(f, " %d", nd->n_in);
        for (int k = 0; k < nd->n_in; k++)
            fprintf(f, " %d", nd->in[k]);
        fprintf(f, " %d", nd->attrs.ni);
        for (int k = 0; k < nd->attrs.ni; k++)
            fprintf(f, " %lld", (long long)nd->attrs.i[k]);
        fprintf(f, " %d", nd->attrs.nf);
        for (int k = 0; k < nd->attrs.nf; k++)
            fprintf(f, " %a", nd->attrs.f[k]);
        fprintf(f, " %d", nd->attrs.ne);
        for (int k = 0; k < nd->attrs.ne; k++)
            put_expr(f, g, nd->attrs.e[k]);
        fprintf(f, " %d", nd->n_out);
        for (int k = 0; k < nd->n_out; k++) {
            fprintf(f, " %d", nd->out[k]);
            put_value(f, g, nd->out[k]);
        }
        fputc('\n', f);
    }
    for (int32_t k = 0; k < g->n_outputs; k++) {
        fprintf(f, "output %d", g->outputs[k].kind);
        put_str(f, gt_graph_str(g, g->outputs[k].fqn));
        fprintf(f, " %d\n", g->outputs[k].value);
    }
    fputs("end\n", f);
    if (fflush(f) != 0 || ferror(f))
        return gt_error_set(err, GT_ERR_IO, "writing a graph: %s", strerror(errno));
    return GT_OK;
}

/* ---------------------------------------------------------------- reading */

typedef struct {
    char *p;    /* the rest of the current line (NUL-terminated in place) */
    int line;   /* 1-based */
    char *next; /* start of the next line, NULL at the end */
    gt_error *err;
    gt_graph *g;
    gt_value_id *map; /* recorded value id -> the reader's */
    int32_t n_map, n_nodes;
    gt_node_id *origin; /* per node, as recorded */
    size_t len;
} reader;

static gt_status bad(reader *r, const char *what)
{
    return gt_error_set(r->err, GT_ERR_FORMAT, "graph text line %d: %s", r->line, what);
}

static bool next_line(reader *r)
{
    if (!r->next) return false;
    r->p = r->next;
    r->line++;
    char *nl = strchr(r->p, '\n');
    if (nl) {
        *nl = 0;
        r->next = nl + 1;
    } else {
        r->next = NULL;
    }
    return true;
}

/* The next token of the line (NUL-terminated in place), or NULL when the line has no more. */
static char *tok(reader *r)
{
    if (!r->p || !*r->p) return NULL;
    char *t = r->p;
    char *sp = strchr(t, ' ');
    if (sp) {
        *sp = 0;
        r->p = sp + 1;
    } else {
        r->p = t + strlen(t);
    }
    return *t ? t : NULL;
}

static gt_status get_i64(reader *r, const char *what, int64_t lo, int64_t hi, int64_t *out)
{
    char *t = tok(r), *end = NULL;
    if (!t)
        return gt_error_set(r->err, GT_ERR_FORMAT, "graph text line %d: %s missing", r->line, what);
    errno = 0;
    long long v = strtoll(t, &end, 10);
    if (errno || *end || v < lo || v > hi)
        return gt_error_set(
            r->err, GT_ERR_FORMAT,
            "graph text line %d: %s: expected an integer in [%lld, %lld], got '%.40s'", r->line,
            what, (long long)lo, (long long)hi, t);
    *out = v;
    return GT_OK;
}

static gt_status get_int(reader *r, const char *what, int lo, int hi, int *out)
{
    int64_t v = 0;
    GT_TRY(get_i64(r, what, lo, hi, &v));
    *out = (int)v;
    return GT_OK;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

/* A string token decoded in place. */
static gt_status get_str(reader *r, const char *what, char **out)
{
    char *t = tok(r);
    if (!t)
        return gt_error_set(r->err, GT_ERR_FORMAT, "graph text line %d: %s missing", r->line, what);
    if (!strcmp(t, "~")) {
        *out = t + 1; /* "" */
        return GT_OK;
    }
    char *w = t;
    for (char *s = t; *s; s++) {
        if (*s != '%') {
            *w++ = *s;
            continue;
        }
        int hi = hexval(s[1]), lo = hi >= 0 ? hexval(s[2]) : -1;
        if (hi < 0 || lo < 0 || (hi == 0 && lo == 0))
            return gt_error_set(r->err, GT_ERR_FORMAT, "graph text line %d: %s: bad escape",
                                r->line, what);
        *w++ = (char)(hi * 16 + lo);
        s += 2;
    }
    *w = 0;
    *out = t;
    return GT_OK;
}

static gt_status get_expr(reader *r, const char *what, gt_expr *out)
{
    char *s = NULL;
    GT_TRY(get_str(r, what, &s));
    gt_error e = {0};
    if (gt_sym_parse(r->g->sym, s, out, &e) != GT_OK)
        return gt_error_set(r->err, GT_ERR_FORMAT, "graph text line %d: %s: %s", r->line, what,
                            e.msg);
    return GT_OK;
}

/* A recorded value id, already defined. */
static gt_status get_use(reader *r, const char *what, gt_value_id *out)
{
    int64_t v = 0;
    GT_TRY(get_i64(r, what, 0, r->n_map - 1, &v));
    if (r->map[v] == GT_NONE)
        return gt_error_set(r->err, GT_ERR_FORMAT,
                            "graph text line %d: %s: value %lld is used before it is defined",
                            r->line, what, (long long)v);
    *out = r->map[v];
    return GT_OK;
}

/* A recorded value id not yet defined: it becomes `now`. */
static gt_status define(reader *r, int64_t recorded, gt_value_id now)
{
    if (r->map[recorded] != GT_NONE)
        return gt_error_set(r->err, GT_ERR_FORMAT, "graph text line %d: value %lld defined twice",
                            r->line, (long long)recorded);
    r->map[recorded] = now;
    return GT_OK;
}

/* DTYPE NDIM DIM*. */
static gt_status get_type(reader *r, gt_type *t)
{
    int dtype = 0, ndim = 0;
    GT_TRY(get_int(r, "dtype", 0, GT_DTYPE_COUNT - 1, &dtype));
    GT_TRY(get_int(r, "rank", 0, GT_MAX_DIMS, &ndim));
    t->dtype = (gt_dtype)dtype;
    t->ndim = ndim;
    for (int d = 0; d < ndim; d++)
        GT_TRY(get_expr(r, "dim", &t->dims[d]));
    return GT_OK;
}

/* PLACE* NAME of value v. */
static gt_status get_place_name(reader *r, gt_value_id v)
{
    gt_graph *g = r->g;
    gt_value *val = &g->values[v];
    for (int d = 0; d < g->mesh.ndim; d++) {
        char *t = tok(r);
        unsigned kind = 9, order = 0, padded = 9;
        int dim = -99, used = 0;
        if (!t || sscanf(t, "%u,%d,%u,%u%n", &kind, &dim, &order, &padded, &used) != 4 || t[used] ||
            kind > GT_PLACE_PARTIAL || dim < -1 || dim >= GT_MAX_DIMS ||
            (kind == GT_PLACE_SHARD && (dim < 0 || dim >= val->type.ndim)) || order > 255 ||
            padded > 1)
            return bad(r, "malformed placement");
        val->place[d] = (gt_placement){(uint8_t)kind, (int8_t)dim, (uint8_t)order, (uint8_t)padded};
    }
    char *name = NULL;
    GT_TRY(get_str(r, "value name", &name));
    val->name = gt_graph_intern(g, name);
    return GT_OK;
}

static gt_status read_header(reader *r, int32_t counts[4])
{
    if (!next_line(r)) return bad(r, "empty");
    char *magic = tok(r);
    if (!magic || strcmp(magic, "graphtrain-graph") != 0)
        return bad(r, "not a graphtrain graph (expected 'graphtrain-graph VERSION ...')");
    int version = 0;
    GT_TRY(get_int(r, "version", 0, 1 << 30, &version));
    if (version != GT_GRAPH_TEXT_VERSION)
        return gt_error_set(r->err, GT_ERR_FORMAT,
                            "graph text: version %d, this graphtrain reads version %d", version,
                            GT_GRAPH_TEXT_VERSION);
    static const char *const what[4] = {"value count", "node count", "input count", "output count"};
    for (int k = 0; k < 4; k++)
        GT_TRY(get_int(r, what[k], 0, 1 << 28, &counts[k]));
    if (tok(r)) return bad(r, "extra tokens");
    return GT_OK;
}

static gt_status read_mesh(reader *r)
{
    gt_graph *g = r->g;
    if (!next_line(r)) return bad(r, "truncated before the mesh");
    char *t = tok(r);
    if (!t || strcmp(t, "mesh") != 0) return bad(r, "expected 'mesh'");
    int ndim = 0;
    GT_TRY(get_int(r, "mesh rank", 0, GT_MESH_MAX_DIMS, &ndim));
    g->mesh.ndim = ndim;
    for (int d = 0; d < ndim; d++) {
        char *name = NULL;
        GT_TRY(get_int(r, "mesh size", 1, 1 << 20, &g->mesh.size[d]));
        GT_TRY(get_str(r, "mesh dim name", &name));
        g->mesh.name[d] = gt_graph_intern(g, name);
    }
    if (tok(r)) return bad(r, "extra tokens");
    return GT_OK;
}

static gt_status read_input(reader *r)
{
    gt_graph *g = r->g;
    int64_t id = 0;
    int kind = 0;
    char *fqn = NULL;
    gt_type t;
    GT_TRY(get_i64(r, "value id", 0, r->n_map - 1, &id));
    GT_TRY(get_int(r, "input kind", 0, GT_IN_INPUT, &kind));
    GT_TRY(get_str(r, "input name", &fqn));
    int tp = 0, role = 0, as_param = 0, unit = 0;
    GT_TRY(get_int(r, "input tp style", 0, GT_TP_ROWWISE, &tp));
    GT_TRY(get_int(r, "input role", 0, GT_ROLE_EXPERT, &role));
    GT_TRY(get_int(r, "input as_param", 0, 1, &as_param));
    GT_TRY(get_int(r, "input unit", GT_UNIT_REST, 1 << 28, &unit));
    GT_TRY(get_type(r, &t));
    g->err = (gt_error){0};
    gt_value_id v = gt_graph_add_input(g, (gt_input_kind)kind, fqn, t.dtype, t.ndim, t.dims);
    if (v == GT_NONE)
        return gt_error_set(r->err, GT_ERR_FORMAT, "graph text line %d: %s", r->line, g->err.msg);
    g->inputs[g->n_inputs - 1].plan = (gt_param_plan){
        .tp = (uint8_t)tp, .role = (uint8_t)role, .as_param = (uint8_t)as_param, .unit = unit};
    GT_TRY(define(r, id, v));
    GT_TRY(get_place_name(r, v));
    if (tok(r)) return bad(r, "extra tokens");
    return GT_OK;
}

static gt_status read_node(reader *r, gt_node_id want_id)
{
    gt_graph *g = r->g;
    int id = 0, phase = 0, origin = 0, unit = 0, n_tags = 0, n_in = 0, n_out = 0;
    char *op_name = NULL, *fqn = NULL, *tags[GT_MAX_TAGS];
    gt_op op;
    gt_attrs a;
    memset(&a, 0, sizeof a);
    GT_TRY(get_int(r, "node id", 0, 1 << 28, &id));
    if (id != want_id) return bad(r, "nodes out of order");
    op_name = tok(r);
    if (!op_name || !gt_op_from_name(op_name, &op)) return bad(r, "unknown op");
    GT_TRY(get_int(r, "phase", 0, GT_PHASE_OPTIMIZER, &phase));
    GT_TRY(get_int(r, "origin", -1, r->n_nodes - 1, &origin));
    GT_TRY(get_int(r, "unit", GT_UNIT_REST, 1 << 28, &unit));
    GT_TRY(get_str(r, "fqn", &fqn));
    GT_TRY(get_int(r, "tag count", 0, GT_MAX_TAGS, &n_tags));
    for (int k = 0; k < n_tags; k++)
        GT_TRY(get_str(r, "tag", &tags[k]));
    GT_TRY(get_int(r, "input count", 0, GT_MAX_IN, &n_in));
    gt_value_id in[GT_MAX_IN];
    for (int k = 0; k < n_in; k++)
        GT_TRY(get_use(r, "input", &in[k]));
    int ni = 0, nf = 0, ne = 0;
    GT_TRY(get_int(r, "int attribute count", 0, GT_MAX_IATTR, &ni));
    for (int k = 0; k < ni; k++)
        GT_TRY(get_i64(r, "int attribute", INT64_MIN, INT64_MAX, &a.i[k]));
    GT_TRY(get_int(r, "float attribute count", 0, GT_MAX_FATTR, &nf));
    for (int k = 0; k < nf; k++) {
        char *t = tok(r), *end = NULL;
        if (!t) return bad(r, "float attribute missing");
        a.f[k] = strtod(t, &end);
        if (*end) return bad(r, "malformed float attribute");
    }
    GT_TRY(get_int(r, "expression attribute count", 0, GT_MAX_EATTR, &ne));
    for (int k = 0; k < ne; k++)
        GT_TRY(get_expr(r, "expression attribute", &a.e[k]));
    a.ni = (uint8_t)ni, a.nf = (uint8_t)nf, a.ne = (uint8_t)ne;
    GT_TRY(get_int(r, "output count", 0, GT_MAX_OUT, &n_out));

    gt_graph_set_fqn(g, fqn);
    gt_graph_set_unit(g, unit);
    g->cur_phase = (gt_phase)phase;
    g->cur_origin = GT_NONE; /* may name a later node: set once every node exists */
    r->origin[want_id] = origin;
    gt_value_id outs[GT_MAX_OUT];
    g->err = (gt_error){0};
    gt_graph_add_node(g, op, in, n_in, &a, outs);
    if (g->n_nodes != want_id + 1 || g->err.code != GT_OK)
        return gt_error_set(r->err, GT_ERR_FORMAT, "graph text line %d: %s: %s", r->line, op_name,
                            g->err.code != GT_OK ? g->err.msg : "the node was refused");
    const gt_node *nd = &g->nodes[want_id];
    if (nd->n_out != n_out) return bad(r, "output count differs from the op's");
    for (int k = 0; k < n_tags; k++)
        gt_graph_add_tag(g, want_id, tags[k]);
    for (int k = 0; k < n_out; k++) {
        int64_t vid = 0;
        gt_type t;
        GT_TRY(get_i64(r, "output value id", 0, r->n_map - 1, &vid));
        GT_TRY(define(r, vid, nd->out[k]));
        GT_TRY(get_type(r, &t));
        const gt_type *now = &g->values[nd->out[k]].type;
        bool same = now->dtype == t.dtype && now->ndim == t.ndim;
        for (int d = 0; same && d < t.ndim; d++)
            same = now->dims[d] == t.dims[d]; /* hash-consed: equal forms have one id */
        if (!same) return bad(r, "an output's recorded type is not what its shape rule gives");
        GT_TRY(get_place_name(r, nd->out[k]));
    }
    if (tok(r)) return bad(r, "extra tokens");
    return GT_OK;
}

static gt_status read_output(reader *r)
{
    int kind = 0;
    char *fqn = NULL;
    gt_value_id v = GT_NONE; /* set by get_use, or the function returns */
    GT_TRY(get_int(r, "output kind", 0, GT_OUT_OPT_STATE_UPDATE, &kind));
    GT_TRY(get_str(r, "output name", &fqn));
    GT_TRY(get_use(r, "output value", &v));
    if (tok(r)) return bad(r, "extra tokens");
    gt_graph_add_output(r->g, (gt_output_kind)kind, fqn, v);
    return GT_OK;
}

/* Reads the next line, which must start with `word`. */
static gt_status expect_line(reader *r, const char *word)
{
    if (!next_line(r))
        return gt_error_set(r->err, GT_ERR_FORMAT,
                            "graph text: truncated after line %d (expected '%s')", r->line, word);
    char *t = tok(r);
    if (!t || strcmp(t, word) != 0) {
        char what[64];
        snprintf(what, sizeof what, "expected '%s'", word);
        return bad(r, what);
    }
    return GT_OK;
}

static gt_status read_all(reader *r)
{
    int32_t counts[4];
    GT_TRY(read_header(r, counts));
    for (int k = 0; k < 4; k++) /* every item takes a line of the text */
        if ((size_t)counts[k] > r->len) return bad(r, "counts larger than the text");
    r->n_map = counts[0];
    r->n_nodes = counts[1];
    r->origin = gt_xmalloc(((size_t)r->n_nodes + 1) * sizeof *r->origin);
    r->map = gt_xmalloc(((size_t)r->n_map + 1) * sizeof *r->map);
    for (int32_t k = 0; k < r->n_map; k++)
        r->map[k] = GT_NONE;
    GT_TRY(read_mesh(r));
    for (int32_t k = 0; k < counts[2]; k++) {
        GT_TRY(expect_line(r, "input"));
        GT_TRY(read_input(r));
    }
    for (int32_t k = 0; k < counts[1]; k++) {
        GT_TRY(expect_line(r, "node"));
        GT_TRY(read_node(r, k));
    }
    for (int32_t k = 0; k < counts[3]; k++) {
        GT_TRY(expect_line(r, "output"));
        GT_TRY(read_output(r));
    }
    GT_TRY(expect_line(r, "end"));
    if (tok(r)) return bad(r, "extra tokens");
    while (next_line(r))
        if (*r->p) return bad(r, "text after 'end'");
    if (r->g->n_values != r->n_map) return bad(r, "fewer values than the header says");
    for (gt_node_id n = 0; n < r->n_nodes; n++) /* in range: checked when read */
        r->g->nodes[n].origin = r->origin[n];
    return GT_OK;
}

gt_status gt_graph_read(const char *text, size_t len, gt_graph **out, gt_error *err)
{
    *out = NULL;
    if (!text || len == 0) return gt_error_set(err, GT_ERR_FORMAT, "graph text: empty");
    if (memchr(text, 0, len))
        return gt_error_set(err, GT_ERR_FORMAT, "graph text: contains a NUL byte");
    char *copy = gt_xmalloc(len + 1);
    memcpy(copy, text, len);
    copy[len] = 0;
    reader r = {.next = copy, .err = err, .g = gt_graph_new(), .len = len};
    gt_status st = read_all(&r);
    if (st == GT_OK) st = gt_graph_verify(r.g, err);
    free(r.map);
    free(r.origin);
    free(copy);
    if (st != GT_OK) {
        gt_graph_free(r.g);
        return st;
    }
    *out = r.g;
    return GT_OK;
}
