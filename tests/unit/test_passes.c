/* test_passes.c — the pass pipeline and the exact passes (dce, cse, canonicalize) on small
 * handmade graphs.
 *
 * References are independent of the passes: the expected result of each rewrite is built by hand
 * as its own graph and the two listings (gt_graph_print) must match line for line; the verifier
 * must accept every result; and rewritten graphs run by the eager executor must give the same
 * bits as the original graph (which the passes did not touch). */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "graph_text.h"
#include "graphtrain/gt_build.h"
#include "graphtrain/gt_exec.h"
#include "graphtrain/gt_pass.h"
#include "gt_test.h"

static bool same_listing(const gt_graph *a, const gt_graph *b)
{
    char *la = graph_text(a), *lb = graph_text(b);
    bool same = strcmp(la, lb) == 0;
    if (!same) fprintf(stderr, "--- got\n%s--- want\n%s", la, lb);
    free(la);
    free(lb);
    return same;
}

/* fusion (tests/unit/test_fusion.c) is left out: the graphs here check the other passes' counts */
static char *no_fusion[] = {"fusion"};

static gt_pass_options quiet_options(void)
{
    return (gt_pass_options){
        .verify_each = true, .quiet = true, .disable = no_fusion, .n_disable = 1};
}

/* Runs one pass (by name) and then, when with_dce, dce; verifies after each. */
static void run_passes(gt_graph *g, const char *only, bool with_dce)
{
    gt_error err = {0};
    int n;
    const gt_pass_info *reg = gt_pass_registry(&n);
    char *disable[GT_PASS_MAX];
    int nd = 0;
    for (int k = 0; k < n; k++)
        if (strcmp(reg[k].name, only) != 0 && !(with_dce && strcmp(reg[k].name, "dce") == 0))
            disable[nd++] = (char *)reg[k].name;
    gt_pass_options o = quiet_options();
    o.disable = disable;
    o.n_disable = nd;
    EXPECT_OK(gt_pass_run_pipeline(g, &o, NULL, &err), &err);
}

static int count_op(const gt_graph *g, gt_op op)
{
    int c = 0;
    for (int k = 0; k < g->n_nodes; k++)
        c += g->nodes[k].op == op;
    return c;
}

/* Feeds every input a deterministic pattern, runs eager, returns outputs (caller frees). */
static gt_tensor *run_eager(const gt_graph *g)
{
    gt_error err = {0};
    gt_tensor *in = calloc((size_t)g->n_inputs, sizeof *in);
    gt_tensor *out = calloc((size_t)g->n_outputs + 1, sizeof *out);
    gt_sym_binding_entry e[2] = {{"batch", 2}, {"seq", 3}};
    gt_sym_binding b = {e, 2};
    for (int k = 0; k < g->n_inputs; k++) {
        int64_t shape[GT_MAX_DIMS];
        gt_value_id v = g->inputs[k].value;
        EXPECT_OK(gt_graph_eval_shape(g, v, &b, shape, &err), &err);
        const gt_type *t = gt_value_type(g, v);
        EXPECT_OK(gt_tensor_alloc(&in[k], t->dtype, t->ndim, shape, &err), &err);
        for (int64_t i = 0; i < gt_tensor_numel(&in[k]); i++)
            gt_tensor_set_f32(&in[k], i, (float)((i * 7 + k * 3) % 11) * 0.25f - 1.0f);
    }
    EXPECT_OK(gt_eager_run(g, &b, in, out, &err), &err);
    for (int k = 0; k < g->n_inputs; k++)
        gt_tensor_free(&in[k]);
    free(in);
    return out;
}

static void expect_same_results(const gt_graph *a, const gt_graph *b, const char *what)
{
    EXPECT(a->n_outputs == b->n_outputs, "%s: output count", what);
    gt_tensor *ra = run_eager(a), *rb = run_eager(b);
    for (int k = 0; k < a->n_outputs && k < b->n_outputs; k++) {
        size_t na = gt_tensor_nbytes(&ra[k]), nb = gt_tensor_nbytes(&rb[k]);
        EXPECT(na == nb && ra[k].ndim == rb[k].ndim &&
                   memcmp(ra[k].shape, rb[k].shape, sizeof ra[k].shape) == 0,
               "%s: output %d shape", what, k);
        EXPECT(na == nb && (na == 0 || memcmp(ra[k].data, rb[k].data, na) == 0),
               "%s: output %d bits differ", what, k);
        gt_tensor_free(&ra[k]);
        gt_tensor_free(&rb[k]);
    }
    free(ra);
    free(rb);
}

/* ---------------------------------------------------------------- dce */

static void test_dce(void)
{
    gt_error err = {0};
    gt_graph *g = gt_graph_new();
    gt_expr d[2] = {gt_c(g, 4), gt_c(g, 8)};
    gt_value_id x = gt_graph_add_input(g, GT_IN_INPUT, "x", GT_F32, 2, d);
    gt_value_id w = gt_graph_add_input(g, GT_IN_PARAM, "w", GT_F32, 1, &d[1]);
    gt_graph_add_input(g, GT_IN_INPUT, "unused", GT_F32, 1, d); /* graph inputs stay */
    gt_graph_set_fqn(g, "a");
    gt_value_id a = gt_unary(g, GT_OP_EXP, x);
    gt_graph_set_fqn(g, "dead");
    gt_value_id dead = gt_unary(g, GT_OP_LOG, x);
    gt_unary(g, GT_OP_NEG, dead); /* a dead chain of two */
    gt_graph_set_fqn(g, "norm");
    gt_value_id dw;
    /* multi-output node with only its second output read: both outputs must stay */
    gt_rms_norm_backward(g, a, w, x, 1e-5, &dw);
    gt_node_id norm_node = g->n_nodes - 1;
    gt_graph_set_fqn(g, "bwd");
    g->cur_origin = norm_node; /* an origin that survives and moves */
    gt_value_id s = gt_scale(g, dw, 2.0);
    g->cur_origin = 1; /* the dead log: origin must become none */
    gt_value_id t = gt_unary(g, GT_OP_SQRT, s);
    g->cur_origin = GT_NONE;
    gt_graph_add_output(g, GT_OUT_GRAD, "w", t);
    gt_graph_add_output(g, GT_OUT_METRIC, "x_again", x); /* an output that is an input */
    EXPECT(g->err.code == GT_OK, "build: %s", g->err.msg);
    gt_graph *orig = gt_graph_copy(g);

    run_passes(g, "dce", false);
    EXPECT(g->n_nodes == 4, "dce leaves 4 nodes, got %d", g->n_nodes);
    EXPECT(g->n_values == 3 + 5, "3 inputs + 5 outputs of kept nodes, got %d", g->n_values);
    EXPECT(g->n_inputs == 3, "inputs kept");
    EXPECT(count_op(g, GT_OP_LOG) == 0 && count_op(g, GT_OP_NEG) == 0, "dead chain removed");
    EXPECT(g->n_nodes == 4 && g->nodes[2].origin == 1, "origin remapped to the norm node (now 1)");
    EXPECT(g->n_nodes == 4 && g->nodes[3].origin == GT_NONE, "origin of a removed node -> none");

    /* reference: the same graph built without the dead nodes */
    gt_graph *want = gt_graph_new();
    d[0] = gt_c(want, 4), d[1] = gt_c(want, 8);
    x = gt_graph_add_input(want, GT_IN_INPUT, "x", GT_F32, 2, d);
    w = gt_graph_add_input(want, GT_IN_PARAM, "w", GT_F32, 1, &d[1]);
    gt_graph_add_input(want, GT_IN_INPUT, "unused", GT_F32, 1, d);
    gt_graph_set_fqn(want, "a");
    a = gt_unary(want, GT_OP_EXP, x);
    gt_graph_set_fqn(want, "norm");
    gt_rms_norm_backward(want, a, w, x, 1e-5, &dw);
    gt_graph_set_fqn(want, "bwd");
    want->cur_origin = 1;
    s = gt_scale(want, dw, 2.0);
    want->cur_origin = GT_NONE;
    t = gt_unary(want, GT_OP_SQRT, s);
    gt_graph_add_output(want, GT_OUT_GRAD, "w", t);
    gt_graph_add_output(want, GT_OUT_METRIC, "x_again", x);
    EXPECT(same_listing(g, want), "dce result listing");
    expect_same_results(orig, g, "dce");

    /* nothing dead: unchanged */
    char *before = graph_text(g);
    run_passes(g, "dce", false);
    char *after = graph_text(g);
    EXPECT(strcmp(before, after) == 0, "dce is idempotent");
    free(before);
    free(after);
    (void)err;
    gt_graph_free(g);
    gt_graph_free(want);
    gt_graph_free(orig);
}

/* ---------------------------------------------------------------- cse */

static void test_cse(void)
{
    gt_graph *g = gt_graph_new();
    gt_expr d[3] = {gt_sym_var(g->sym, "batch"), gt_sym_var(g->sym, "seq"), gt_c(g, 4)};
    gt_expr flat[2] = {gt_sym_mul(g->sym, d[0], d[1]), d[2]};
    gt_expr wd[2] = {gt_c(g, 4), gt_c(g, 5)};
    gt_value_id x = gt_graph_add_input(g, GT_IN_INPUT, "x", GT_F32, 3, d);
    gt_value_id w = gt_graph_add_input(g, GT_IN_PARAM, "w", GT_F32, 2, wd);
    gt_graph_set_fqn(g, "fwd");
    gt_value_id r1 = gt_reshape(g, x, 2, flat);
    gt_value_id m1 = gt_matmul(g, r1, w, false, false);
    /* the backward flattens x again, three times, and repeats the matmul on it */
    g->cur_phase = GT_PHASE_BACKWARD;
    g->cur_origin = 0;
    gt_graph_set_fqn(g, "bwd");
    gt_value_id r2 = gt_reshape(g, x, 2, flat);
    gt_value_id r3 = gt_reshape(g, x, 2, flat);
    gt_value_id r4 = gt_reshape(g, x, 2, flat);
    gt_value_id m2 = gt_matmul(g, r2, w, false, false); /* same as m1 once r2 -> r1 */
    gt_value_id m3 = gt_matmul(g, r3, w, false, false);
    gt_value_id sum34 = gt_add(g, m3, gt_matmul(g, r4, w, false, false));
    /* must stay apart: different attribute, 0.0 vs -0.0, different tags */
    gt_value_id s1 = gt_scale(g, m2, 2.0);
    gt_value_id s2 = gt_scale(g, m2, 3.0);
    gt_value_id z1 = gt_scale(g, m2, 0.0);
    gt_value_id z2 = gt_scale(g, m2, -0.0);
    gt_value_id tagged = gt_scale(g, m2, 2.0);
    gt_graph_add_tag(g, g->n_nodes - 1, "recompute");
    g->cur_origin = GT_NONE;
    g->cur_phase = GT_PHASE_FORWARD;
    gt_value_id outs[] = {m1, m2, sum34, s1, s2, z1, z2, tagged};
    for (int k = 0; k < 8; k++) {
        char name[16];
        snprintf(name, sizeof name, "o%d", k);
        gt_graph_add_output(g, GT_OUT_METRIC, name, outs[k]);
    }
    EXPECT(g->err.code == GT_OK, "build: %s", g->err.msg);
    gt_graph *orig = gt_graph_copy(g);
    int32_t nodes_before = g->n_nodes;

    run_passes(g, "cse", false);
    EXPECT(g->n_nodes == nodes_before, "cse alone removes nothing (leaves dead nodes to dce)");
    EXPECT(g->outputs[1].value == g->outputs[0].value, "m2 merged into m1");
    EXPECT(g->nodes[g->values[g->outputs[1].value].producer].phase == GT_PHASE_FORWARD,
           "the first (forward) node is kept");
    EXPECT(g->outputs[3].value != g->outputs[7].value, "different tags are not merged");
    EXPECT(g->outputs[5].value != g->outputs[6].value, "0.0 and -0.0 are not merged");
    EXPECT(g->outputs[3].value != g->outputs[4].value, "different alpha not merged");
    run_passes(g, "dce", false);
    /* kept: reshape, matmul, add (of m1 + m1), 5 scales */
    EXPECT(g->n_nodes == 8, "cse + dce leaves 8 nodes, got %d", g->n_nodes);
    EXPECT(count_op(g, GT_OP_RESHAPE) == 1 && count_op(g, GT_OP_MATMUL) == 1,
           "one reshape and one matmul left");
    EXPECT(count_op(g, GT_OP_SCALE) == 5 && count_op(g, GT_OP_ADD) == 1, "scales and add stay");
    for (int k = 0; k < g->n_nodes; k++)
        EXPECT(g->nodes[k].origin == GT_NONE || g->nodes[k].origin == 0,
               "origins still name the reshape");
    expect_same_results(orig, g, "cse");
    gt_graph_free(g);
    gt_graph_free(orig);
}

/* ---------------------------------------------------------------- canonicalize */

typedef struct {
    gt_graph *g;
    gt_value_id x, y; /* x: f32[batch, seq, 4], y: f32[2, 3, 4, 5] */
} canon_case;

static canon_case canon_new(void)
{
    canon_case c;
    c.g = gt_graph_new();
    gt_graph *g = c.g;
    gt_expr d[3] = {gt_sym_var(g->sym, "batch"), gt_sym_var(g->sym, "seq"), gt_c(g, 4)};
    gt_expr e[4] = {gt_c(g, 2), gt_c(g, 3), gt_c(g, 4), gt_c(g, 5)};
    c.x = gt_graph_add_input(g, GT_IN_INPUT, "x", GT_F32, 3, d);
    c.y = gt_graph_add_input(g, GT_IN_INPUT, "y", GT_F32, 4, e);
    return c;
}

/* Runs canonicalize + dce on c.g and compares it to want (which has the same inputs), and the
 * results of the rewritten graph to the original's. */
static void canon_check(canon_case *c, canon_case *want, const char *what)
{
    EXPECT(c->g->err.code == GT_OK && want->g->err.code == GT_OK, "%s: build: %s %s", what,
           c->g->err.msg, want->g->err.msg);
    gt_graph *orig = gt_graph_copy(c->g);
    run_passes(c->g, "canonicalize", true);
    EXPECT(same_listing(c->g, want->g), "%s: listing", what);
    expect_same_results(orig, c->g, what);
    gt_graph_free(orig);
    gt_graph_free(c->g);
    gt_graph_free(want->g);
}

static void test_canonicalize(void)
{
    /* identity reshape, symbolic: [batch, seq, 4] -> [batch*seq, 4] -> [batch, seq, 4] -> x */
    {
        canon_case c = canon_new(), w = canon_new();
        gt_graph *g = c.g;
        gt_expr flat[2] = {
            gt_sym_mul(g->sym, gt_sym_var(g->sym, "batch"), gt_sym_var(g->sym, "seq")), gt_c(g, 4)};
        gt_value_id r = gt_reshape(g, c.x, 2, flat);
        r = gt_reshape(g, r, 3, g->values[c.x].type.dims);
        gt_graph_add_output(g, GT_OUT_METRIC, "o", gt_unary(g, GT_OP_EXP, r));
        gt_graph_add_output(w.g, GT_OUT_METRIC, "o", gt_unary(w.g, GT_OP_EXP, w.x));
        canon_check(&c, &w, "reshape chain back to identity");
    }
    /* reshape of reshape: y [2,3,4,5] -> [6,20] -> [120] becomes one reshape [120]; a direct
     * identity reshape disappears */
    {
        canon_case c = canon_new(), w = canon_new();
        gt_graph *g = c.g;
        gt_expr a[2] = {gt_c(g, 6), gt_c(g, 20)}, b[1] = {gt_c(g, 120)};
        gt_value_id id = gt_reshape(g, c.y, 4, g->values[c.y].type.dims);
        gt_value_id r = gt_reshape(g, gt_reshape(g, id, 2, a), 1, b);
        gt_graph_add_output(g, GT_OUT_METRIC, "o", r);
        gt_expr wb[1] = {gt_c(w.g, 120)};
        gt_graph_add_output(w.g, GT_OUT_METRIC, "o", gt_reshape(w.g, w.y, 1, wb));
        canon_check(&c, &w, "reshape of reshape");
    }
    /* transposes: (1,2) then (2,1) cancel; (0,1) then (1,2) stay; transpose(d, d) disappears */
    {
        canon_case c = canon_new(), w = canon_new();
        gt_graph *g = c.g;
        gt_value_id t = gt_transpose(g, gt_transpose(g, c.y, 1, 2), 2, 1);
        gt_graph_add_output(g, GT_OUT_METRIC, "cancel", gt_unary(g, GT_OP_NEG, t));
        gt_value_id k = gt_transpose(g, gt_transpose(g, c.y, 0, 1), 1, 2);
        gt_graph_add_output(g, GT_OUT_METRIC, "keep", k);
        gt_graph_add_output(g, GT_OUT_METRIC, "self", gt_transpose(g, c.y, 3, 3));
        gt_graph_add_output(w.g, GT_OUT_METRIC, "cancel", gt_unary(w.g, GT_OP_NEG, w.y));
        gt_graph_add_output(w.g, GT_OUT_METRIC, "keep",
                            gt_transpose(w.g, gt_transpose(w.g, w.y, 0, 1), 1, 2));
        gt_graph_add_output(w.g, GT_OUT_METRIC, "self", w.y);
        canon_check(&c, &w, "transposes");
    }
    /* permutes: p then q composes to c[k] = p[q[k]]; p then its inverse vanishes; a transpose
     * over a permute composes too; identity permute vanishes */
    {
        canon_case c = canon_new(), w = canon_new();
        gt_graph *g = c.g;
        int p[4] = {2, 0, 3, 1}, q[4] = {1, 3, 0, 2}, inv[4] = {1, 3, 0, 2},
            ident[4] = {0, 1, 2, 3};
        gt_value_id pq = gt_permute(g, gt_permute(g, c.y, 4, p), 4, q);
        gt_graph_add_output(g, GT_OUT_METRIC, "pq", pq);
        /* q happens to be p's inverse: p[q[k]] = k; use a second, non-inverse q2 as well */
        int q2[4] = {3, 2, 1, 0};
        gt_value_id pq2 = gt_permute(g, gt_permute(g, c.y, 4, p), 4, q2);
        gt_graph_add_output(g, GT_OUT_METRIC, "pq2", pq2);
        gt_value_id tp = gt_transpose(g, gt_permute(g, c.y, 4, p), 0, 3);
        gt_graph_add_output(g, GT_OUT_METRIC, "tp", tp);
        gt_graph_add_output(g, GT_OUT_METRIC, "id", gt_permute(g, c.y, 4, ident));
        (void)inv;
        /* want: pq -> y; pq2 = permute(y, [p[3], p[2], p[1], p[0]]) = [1,3,0,2];
         * tp = permute(y, [p[3], p[1], p[2], p[0]]) = [1,0,3,2] */
        gt_graph_add_output(w.g, GT_OUT_METRIC, "pq", w.y);
        int c2[4] = {1, 3, 0, 2}, c3[4] = {1, 0, 3, 2};
        gt_graph_add_output(w.g, GT_OUT_METRIC, "pq2", gt_permute(w.g, w.y, 4, c2));
        gt_graph_add_output(w.g, GT_OUT_METRIC, "tp", gt_permute(w.g, w.y, 4, c3));
        gt_graph_add_output(w.g, GT_OUT_METRIC, "id", w.y);
        canon_check(&c, &w, "permutes");
    }
    /* slices: full range (symbolic end = the dim itself) vanishes, a partial one stays */
    {
        canon_case c = canon_new(), w = canon_new();
        gt_graph *g = c.g;
        gt_value_id full = gt_slice(g, c.x, 1, gt_c(g, 0), g->values[c.x].type.dims[1]);
        gt_graph_add_output(g, GT_OUT_METRIC, "full", gt_unary(g, GT_OP_EXP, full));
        gt_graph_add_output(g, GT_OUT_METRIC, "part", gt_slice(g, c.y, 3, gt_c(g, 1), gt_c(g, 5)));
        gt_graph_add_output(g, GT_OUT_METRIC, "part0", gt_slice(g, c.y, 3, gt_c(g, 0), gt_c(g, 4)));
        gt_graph_add_output(w.g, GT_OUT_METRIC, "full", gt_unary(w.g, GT_OP_EXP, w.x));
        gt_graph_add_output(w.g, GT_OUT_METRIC, "part",
                            gt_slice(w.g, w.y, 3, gt_c(w.g, 1), gt_c(w.g, 5)));
        gt_graph_add_output(w.g, GT_OUT_METRIC, "part0",
                            gt_slice(w.g, w.y, 3, gt_c(w.g, 0), gt_c(w.g, 4)));
        canon_check(&c, &w, "slices");
    }
    /* casts: to the same dtype vanishes; to bf16 and back stays (it rounds) */
    {
        canon_case c = canon_new(), w = canon_new();
        gt_graph *g = c.g;
        gt_graph_add_output(g, GT_OUT_METRIC, "same", gt_cast(g, gt_cast(g, c.x, GT_F32), GT_F32));
        gt_graph_add_output(g, GT_OUT_METRIC, "round",
                            gt_cast(g, gt_cast(g, c.x, GT_BF16), GT_F32));
        gt_graph_add_output(w.g, GT_OUT_METRIC, "same", w.x);
        gt_graph_add_output(w.g, GT_OUT_METRIC, "round",
                            gt_cast(w.g, gt_cast(w.g, w.x, GT_BF16), GT_F32));
        canon_check(&c, &w, "casts");
    }
}

/* ---------------------------------------------------------------- pipeline */

static gt_graph *pipeline_graph(void)
{
    gt_graph *g = gt_graph_new();
    gt_expr d[2] = {gt_c(g, 3), gt_c(g, 4)}, f[1] = {gt_c(g, 12)};
    gt_value_id x = gt_graph_add_input(g, GT_IN_INPUT, "x", GT_F32, 2, d);
    gt_value_id a = gt_reshape(g, x, 1, f);
    gt_value_id b = gt_reshape(g, x, 1, f);
    gt_value_id t = gt_transpose(g, gt_transpose(g, x, 0, 1), 0, 1);
    gt_graph_add_output(g, GT_OUT_METRIC, "o", gt_add(g, gt_unary(g, GT_OP_EXP, a), b));
    gt_graph_add_output(g, GT_OUT_METRIC, "t", gt_unary(g, GT_OP_NEG, t));
    return g;
}

static char *read_text(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) return NULL;
    char *buf = calloc(1, 1 << 16);
    size_t n = fread(buf, 1, (1 << 16) - 1, f);
    buf[n] = 0;
    fclose(f);
    return buf;
}

static void test_pipeline(void)
{
    gt_error err = {0};
    int n;
    const gt_pass_info *reg = gt_pass_registry(&n);
    EXPECT(n == 10 && strcmp(reg[0].name, "canonicalize") == 0 && strcmp(reg[1].name, "cse") == 0 &&
               strcmp(reg[2].name, "memory_policy") == 0 && strcmp(reg[3].name, "remat") == 0 &&
               strcmp(reg[4].name, "dce") == 0 && strcmp(reg[5].name, "fusion") == 0 &&
               strcmp(reg[6].name, "fsdp_bucketing") == 0 &&
               strcmp(reg[7].name, "reduce_scatter_narrow") == 0 &&
               strcmp(reg[8].name, "fsdp_reorder") == 0 && strcmp(reg[9].name, "ep_overlap") == 0,
           "registry order");
    for (int k = 0; k < n; k++)
        EXPECT(reg[k].numerics == GT_PASS_EXACT && gt_pass_find(reg[k].name) == &reg[k],
               "%s is exact and found by name", reg[k].name);
    EXPECT(gt_pass_find("nope") == NULL, "unknown name");

    /* full pipeline: 7 nodes -> exp, add, neg (one reshape left) */
    gt_graph *g = pipeline_graph();
    gt_graph *orig = gt_graph_copy(g);
    gt_pass_options o = quiet_options();
    gt_pass_report rep;
    EXPECT_OK(gt_pass_run_pipeline(g, &o, &rep, &err), &err);
    EXPECT(rep.n_run == 5, "five passes ran");
    EXPECT(rep.pass[0].nodes_before == 7 && rep.pass[4].nodes_after == 4,
           "nodes 7 -> 4, got %d -> %d", rep.pass[0].nodes_before, rep.pass[4].nodes_after);
    EXPECT(count_op(g, GT_OP_RESHAPE) == 1 && count_op(g, GT_OP_TRANSPOSE) == 0, "ops left");
    expect_same_results(orig, g, "pipeline");
    gt_graph_free(g);

    /* disable list */
    char *off[] = {"cse", "memory_policy", "remat", "dce", "fusion"};
    o.disable = off;
    o.n_disable = 5;
    g = gt_graph_copy(orig);
    EXPECT_OK(gt_pass_run_pipeline(g, &o, &rep, &err), &err);
    EXPECT(rep.n_run == 1 && strcmp(rep.pass[0].name, "canonicalize") == 0, "only canonicalize");
    EXPECT(g->n_nodes == 7, "nothing removed without dce");
    gt_graph_free(g);

    /* unknown pass name: an error that names it and lists the known ones */
    char *bad[] = {"dce", "fuse_all"};
    o.disable = bad;
    g = gt_graph_copy(orig);
    gt_status st = gt_pass_run_pipeline(g, &o, &rep, &err);
    EXPECT(st == GT_ERR_INVALID, "unknown pass is an error");
    EXPECT(strstr(err.msg, "'fuse_all'") &&
               strstr(err.msg, "canonicalize, cse, memory_policy, remat, dce"),
           "message names it and the known passes: %s", err.msg);
    EXPECT(g->n_nodes == 7, "graph untouched on error");
    gt_graph_free(g);

    /* an invalid input graph is refused when verifying */
    g = gt_graph_copy(orig);
    g->nodes[1].in[0] = g->nodes[3].out[0]; /* used before defined */
    o = quiet_options();
    st = gt_pass_run_pipeline(g, &o, &rep, &err);
    EXPECT(st != GT_OK && strstr(err.msg, "invalid"), "bad input graph refused: %s", err.msg);
    gt_graph_free(g);

    /* dumps */
    char dir[] = "/tmp/gt_test_passes_XXXXXX";
    EXPECT(mkdtemp(dir) != NULL, "mkdtemp");
    char sub[256];
    snprintf(sub, sizeof sub, "%s/a/b", dir);
    o = quiet_options();
    o.dump_dir = sub;
    g = gt_graph_copy(orig);
    EXPECT_OK(gt_pass_run_pipeline(g, &o, &rep, &err), &err);
    const char *names[] = {"01-canonicalize", "02-cse", "03-memory_policy", "04-remat", "05-dce"};
    for (int k = 0; k < 5; k++) {
        const char *what[] = {"before", "after", "diff"};
        for (int j = 0; j < 3; j++) {
            char path[512];
            snprintf(path, sizeof path, "%s/%s.%s.txt", sub, names[k], what[j]);
            char *text = read_text(path);
            EXPECT(text && text[0], "dump %s written", path);
            free(text);
            unlink(path);
        }
    }
    char path[512];
    snprintf(path, sizeof path, "%s/01-canonicalize.before.txt", sub);
    char *before = NULL;
    {
        /* the before listing of the first pass is the original graph's listing */
        FILE *f = fopen(path, "r");
        EXPECT(f == NULL, "files were removed above");
        if (f) fclose(f);
    }
    /* run again to inspect contents */
    gt_graph_free(g);
    g = gt_graph_copy(orig);
    EXPECT_OK(gt_pass_run_pipeline(g, &o, &rep, &err), &err);
    before = read_text(path);
    char *want = graph_text(orig);
    EXPECT(before && strcmp(before, want) == 0, "before listing = printed original");
    free(before);
    free(want);
    snprintf(path, sizeof path, "%s/05-dce.after.txt", sub);
    char *after = read_text(path);
    want = graph_text(g);
    EXPECT(after && strcmp(after, want) == 0, "last after listing = printed result");
    free(after);
    free(want);
    snprintf(path, sizeof path, "%s/05-dce.diff.txt", sub);
    char *diff = read_text(path);
    EXPECT(diff && strstr(diff, "nodes 7 -> 4") && strstr(diff, "reshape 2 -> 1") &&
               strstr(diff, "transpose 2 -> 0") && !strstr(diff, "exp "),
           "dce diff: %s", diff ? diff : "(none)");
    free(diff);
    snprintf(path, sizeof path, "%s/01-canonicalize.diff.txt", sub);
    diff = read_text(path);
    EXPECT(diff && strstr(diff, "nodes 7 -> 7") && strstr(diff, "no op count changed"),
           "canonicalize diff: %s", diff ? diff : "(none)");
    free(diff);
    for (int k = 0; k < 3; k++) {
        const char *what[] = {"before", "after", "diff"};
        for (int j = 0; j < 3; j++) {
            snprintf(path, sizeof path, "%s/%s.%s.txt", sub, names[k], what[j]);
            unlink(path);
        }
    }
    snprintf(path, sizeof path, "%s/a/b", dir);
    rmdir(path);
    snprintf(path, sizeof path, "%s/a", dir);
    rmdir(path);
    rmdir(dir);

    /* a dump path that cannot be a directory */
    o.dump_dir = "/dev/null/x";
    gt_graph_free(g);
    g = gt_graph_copy(orig);
    st = gt_pass_run_pipeline(g, &o, &rep, &err);
    EXPECT(st == GT_ERR_IO && strstr(err.msg, "/dev/null/x"), "bad dump dir: %s", err.msg);
    gt_graph_free(g);
    gt_graph_free(orig);
}

int main(void)
{
    test_dce();
    test_cse();
    test_canonicalize();
    test_pipeline();
    return gt_test_finish();
}
