/* test_graph.c — the IR container: op table, string interning, graph inputs/outputs, printer
 * format and stability, deep copy, verifier (on hand-corrupted graphs), copy_region, use counts,
 * eval_shape, and a llama-style graph built end to end. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph_text.h"
#include "graphtrain/gt_build.h"
#include "graphtrain/gt_graph.h"
#include "gt_test.h"
#include "ir/ir_internal.h"

static void test_op_table(void)
{
    for (int k = 0; k < GT_OP_COUNT; k++) {
        const gt_op_info *info = gt_op_get((gt_op)k);
        EXPECT(info && info->name && info->name[0] && info->shape && info->schema, "op %d", k);
        if (!info) continue;
        gt_op back = GT_OP_COUNT;
        EXPECT(gt_op_from_name(info->name, &back) && back == (gt_op)k, "name %s round-trips",
               info->name);
        EXPECT(info->n_in == -1 || (info->n_in >= 0 && info->n_in <= GT_MAX_IN), "%s n_in",
               info->name);
        EXPECT(info->n_out == -1 || (info->n_out >= 1 && info->n_out <= GT_MAX_OUT), "%s n_out",
               info->name);
        gt_schema s;
        gt_schema_parse(info->schema, &s); /* panics on a malformed schema */
        for (int c = 0; c < GT_ATTR_CLASSES; c++)
            EXPECT(gt_schema_fixed(&s, c) <= gt_attr_class_max(c), "%s schema", info->name);
    }
    EXPECT(gt_op_get((gt_op)GT_OP_COUNT) == NULL, "out-of-range op");
    EXPECT(!gt_op_from_name("no_such_op", NULL), "unknown name");
    EXPECT(strcmp(gt_phase_name(GT_PHASE_BACKWARD), "bwd") == 0, "phase name");
    EXPECT(strcmp(gt_input_kind_name(GT_IN_OPT_STATE), "OPT_STATE") == 0, "input kind name");
    EXPECT(strcmp(gt_output_kind_name(GT_OUT_PARAM_UPDATE), "PARAM_UPDATE") == 0, "output kind");

    /* schema text "i:keepdim,dims*": one fixed int slot and an int list */
    gt_schema s;
    gt_schema_parse("i:keepdim,dims*", &s);
    EXPECT(s.n_classes == 1 && s.n_names[GT_ATTR_I] == 2 && s.has_list[GT_ATTR_I] &&
               gt_schema_fixed(&s, GT_ATTR_I) == 1 && s.name_len[GT_ATTR_I][1] == 4 &&
               strncmp(s.name[GT_ATTR_I][1], "dims", 4) == 0,
           "schema parse");
    gt_schema_parse("i:inverse,original_max_position f:theta,factor,low_freq_factor,"
                    "high_freq_factor",
                    &s);
    EXPECT(s.n_classes == 2 && s.order[1] == GT_ATTR_F && s.n_names[GT_ATTR_F] == 4 &&
               !s.has_list[GT_ATTR_F],
           "rope schema parse");

    /* a trailing optional slot ('?'): 2 or 3 ints; left out, it stays out (no zero fill) */
    gt_schema_parse("i:mesh_dim,group_size,dtype?", &s);
    EXPECT(s.n_names[GT_ATTR_I] == 3 && s.n_optional[GT_ATTR_I] == 1 && !s.has_list[GT_ATTR_I] &&
               gt_schema_fixed(&s, GT_ATTR_I) == 3 && gt_schema_required(&s, GT_ATTR_I) == 2 &&
               s.name_len[GT_ATTR_I][2] == 5 && strncmp(s.name[GT_ATTR_I][2], "dtype", 5) == 0,
           "optional slot parse");
    gt_error e = {0};
    gt_attrs a2 = {.ni = 2}, a3 = {.ni = 3}, a1 = {.ni = 1}, a1f = {.ni = 1}, a4 = {.ni = 4};
    EXPECT(gt_attrs_fit(GT_OP_REDUCE_SCATTER_START, &a2, true, "rs", &e) == GT_OK && a2.ni == 2,
           "optional slot left out stays out: %s", e.msg);
    EXPECT(gt_attrs_fit(GT_OP_REDUCE_SCATTER_START, &a3, false, "rs", &e) == GT_OK && a3.ni == 3,
           "optional slot given: %s", e.msg);
    EXPECT(gt_attrs_fit(GT_OP_REDUCE_SCATTER_START, &a1f, true, "rs", &e) == GT_OK && a1f.ni == 2,
           "fill adds the required slots only: ni %d", a1f.ni);
    EXPECT(gt_attrs_fit(GT_OP_REDUCE_SCATTER_START, &a1, false, "rs", &e) == GT_ERR_INVALID &&
               strstr(e.msg, "needs 2"),
           "a required slot missing: %s", e.msg);
    gt_error e4 = {0};
    EXPECT(gt_attrs_fit(GT_OP_REDUCE_SCATTER_START, &a4, true, "rs", &e4) == GT_ERR_INVALID &&
               strstr(e4.msg, "at most 3"),
           "one slot too many: %s", e4.msg);
}

static void test_strings(void)
{
    gt_graph *g = gt_graph_new();
    EXPECT(gt_graph_intern(g, "") == 0 && gt_graph_intern(g, NULL) == 0, "empty string is 0");
    gt_str a = gt_graph_intern(g, "layers.0.attention.wq");
    gt_str b = gt_graph_intern(g, "layers.0.attention.wk");
    EXPECT(a != b && a > 0 && b > 0, "distinct ids");
    EXPECT(gt_graph_intern(g, "layers.0.attention.wq") == a, "same string, same id");
    /* enough strings to grow the table and its hash index several times */
    char name[64];
    gt_str ids[5000];
    for (int k = 0; k < 5000; k++) {
        snprintf(name, sizeof name, "layers.%d.feed_forward.w%d", k / 3, k % 3);
        ids[k] = gt_graph_intern(g, name);
    }
    bool ok = true;
    for (int k = 0; k < 5000; k++) {
        snprintf(name, sizeof name, "layers.%d.feed_forward.w%d", k / 3, k % 3);
        ok = ok && strcmp(gt_graph_str(g, ids[k]), name) == 0 && gt_graph_intern(g, name) == ids[k];
        ok = ok && (k == 0 || ids[k] == ids[k - 1] + 1);
    }
    EXPECT(ok, "5000 strings round-trip with dense ids");
    EXPECT(strcmp(gt_graph_str(g, a), "layers.0.attention.wq") == 0, "early string survives");
    gt_graph_free(g);
}

/* A small graph whose text is written out by hand below from the format in gt_graph.h. */
static gt_graph *small_graph(void)
{
    gt_graph *g = gt_graph_new();
    gt_expr b = gt_sym_var(g->sym, "batch"), s = gt_sym_var(g->sym, "seq");
    gt_expr bs = gt_sym_mul(g->sym, b, s);
    gt_value_id emb = gt_graph_add_input(g, GT_IN_PARAM, "tok_embeddings.weight", GT_F32, 2,
                                         (gt_expr[]){gt_c(g, 2048), gt_c(g, 256)});
    gt_value_id tok = gt_graph_add_input(g, GT_IN_INPUT, "tokens", GT_I64, 2, (gt_expr[]){b, s});
    gt_value_id w1 = gt_graph_add_input(g, GT_IN_PARAM, "layers.0.feed_forward.w1.weight", GT_F32,
                                        2, (gt_expr[]){gt_c(g, 768), gt_c(g, 256)});
    gt_value_id tgt = gt_graph_add_input(g, GT_IN_INPUT, "labels", GT_I64, 1, &bs);
    gt_graph_set_fqn(g, "tok_embeddings");
    gt_value_id h = gt_embedding(g, emb, tok);
    h = gt_reshape(g, h, 2, (gt_expr[]){bs, gt_c(g, 256)});
    gt_graph_set_fqn(g, "layers.0.feed_forward.w1");
    gt_value_id y = gt_matmul(g, h, w1, false, true);
    gt_value_id parts[2];
    gt_split(g, y, -1, 2, (gt_expr[]){gt_c(g, 512), gt_c(g, 256)}, parts);
    gt_graph_set_fqn(g, NULL);
    gt_value_id loss = gt_cross_entropy(g, parts[0], tgt, -100);
    gt_graph_add_tag(g, g->n_nodes - 1, "loss");
    gt_value_id m = gt_reduce(g, GT_OP_MEAN, parts[1], 1, (int[]){-1}, true);
    g->cur_phase = GT_PHASE_BACKWARD;
    g->cur_origin = 2;
    gt_value_id d = gt_scale(g, m, 0.1);
    gt_graph_add_tag(g, g->n_nodes - 1, "recompute");
    gt_graph_add_tag(g, g->n_nodes - 1, "bucket:4");
    gt_graph_add_tag(g, g->n_nodes - 1, "recompute"); /* already there: no-op */
    g->cur_phase = GT_PHASE_FORWARD;
    g->cur_origin = GT_NONE;
    gt_graph_add_output(g, GT_OUT_LOSS, "loss", loss);
    gt_graph_add_output(g, GT_OUT_METRIC, "mean_h", d);
    return g;
}

static const char *small_graph_text =
    "input %0 : f32[2048, 256] PARAM tok_embeddings.weight\n"
    "input %1 : i64[batch, seq] INPUT tokens\n"
    "input %2 : f32[768, 256] PARAM layers.0.feed_forward.w1.weight\n"
    "input %3 : i64[batch*seq] INPUT labels\n"
    "%4 : f32[batch, seq, 256] = embedding(%0, %1)  # tok_embeddings fwd\n"
    "%5 : f32[batch*seq, 256] = reshape(%4; shape=[batch*seq, 256])  # tok_embeddings fwd\n"
    "%6 : f32[batch*seq, 768] = matmul(%5, %2; trans_a=0, trans_b=1)  "
    "# layers.0.feed_forward.w1 fwd\n"
    "%7, %8 : f32[batch*seq, 512], f32[batch*seq, 256] = split(%6; dim=1, sizes=[512, 256])  "
    "# layers.0.feed_forward.w1 fwd\n"
    "%9 : f32[] = cross_entropy(%7, %3; ignore_index=-100)  # fwd [loss]\n"
    "%10 : f32[batch*seq, 1] = mean(%8; keepdim=1, dims=[1])  # fwd\n"
    "%11 : f32[batch*seq, 1] = scale(%10; alpha=0.1)  # bwd [recompute,bucket:4] <- n2\n"
    "output LOSS loss = %9\n"
    "output METRIC mean_h = %11\n";

static void test_print_and_copy(void)
{
    gt_graph *g = small_graph();
    EXPECT(g->err.code == GT_OK, "small graph builds: %s", g->err.msg);
    gt_error err = {0};
    EXPECT_OK(gt_graph_verify(g, &err), &err);
    char *text = graph_text(g);
    EXPECT(strcmp(text, small_graph_text) == 0, "printed:\n%s\nexpected:\n%s", text,
           small_graph_text);

    /* format_node reports the length it needed, like snprintf */
    char tiny[8];
    char full[256];
    int need = gt_graph_format_node(g, 2, tiny, sizeof tiny);
    int got = gt_graph_format_node(g, 2, full, sizeof full);
    EXPECT(need == got && (size_t)got == strlen(full) && strlen(tiny) == sizeof tiny - 1 &&
               strncmp(tiny, full, sizeof tiny - 1) == 0,
           "truncation: need %d got %d '%s'", need, got, tiny);

    /* fqn, phase, tags and origin are what the builder state said */
    EXPECT(gt_node_has_tag(g, &g->nodes[6], "bucket:4") &&
               !gt_node_has_tag(g, &g->nodes[6], "loss") && g->nodes[6].origin == 2 &&
               g->nodes[6].phase == GT_PHASE_BACKWARD && g->nodes[0].origin == GT_NONE,
           "metadata");

    gt_graph *c = gt_graph_copy(g);
    EXPECT_OK(gt_graph_verify(c, &err), &err);
    char *ctext = graph_text(c);
    EXPECT(strcmp(text, ctext) == 0, "copy prints like the original");
    /* the copy is deep: growing the original leaves it alone, and vice versa */
    gt_graph_set_fqn(g, "extra");
    gt_unary(g, GT_OP_EXP, 5);
    gt_graph_intern(g, "only.in.original");
    gt_sym_var(g->sym, "only_in_original");
    char *ctext2 = graph_text(c);
    EXPECT(strcmp(ctext, ctext2) == 0 && c->n_nodes == 7 && g->n_nodes == 8, "copy is deep");
    gt_unary(c, GT_OP_NEG, 5);
    EXPECT(g->nodes[7].op == GT_OP_EXP && c->nodes[7].op == GT_OP_NEG, "independent nodes");
    char *again = graph_text(g);
    char *again2 = graph_text(g);
    EXPECT(strcmp(again, again2) == 0, "printing twice gives the same text");
    free(text);
    free(ctext);
    free(ctext2);
    free(again);
    free(again2);
    gt_graph_free(c);
    gt_graph_free(g);
}

/* The verifier must reject each corruption, naming the node or value. */
static void expect_verify_fails(gt_graph *g, const char *needle, const char *what)
{
    gt_error err = {0};
    gt_status st = gt_graph_verify(g, &err);
    EXPECT(st != GT_OK && strstr(err.msg, needle), "%s: want '%s', got %s '%s'", what, needle,
           gt_status_name(st), err.msg);
}

static void test_verifier(void)
{
    gt_graph *base = small_graph();
    gt_error err = {0};
    EXPECT_OK(gt_graph_verify(base, &err), &err);
    gt_graph *g;

    /* use before def: node 4 (mean) reads %10, its own output, produced later than use */
    g = gt_graph_copy(base);
    g->nodes[5].in[0] = 11;
    expect_verify_fails(g, "node 5 (mean)", "use before def");
    gt_graph_free(g);

    /* wrong stored shape */
    g = gt_graph_copy(base);
    g->values[6].type.dims[1] = gt_c(g, 769);
    expect_verify_fails(g, "node 2 (matmul at layers.0.feed_forward.w1)", "wrong shape");
    gt_graph_free(g);

    /* wrong stored dtype */
    g = gt_graph_copy(base);
    g->values[9].type.dtype = GT_BF16;
    expect_verify_fails(g, "cross_entropy", "wrong dtype");
    gt_graph_free(g);

    /* bad graph output id, bad graph input id */
    g = gt_graph_copy(base);
    g->outputs[1].value = 999;
    expect_verify_fails(g, "graph output 1", "bad output id");
    gt_graph_free(g);
    g = gt_graph_copy(base);
    g->inputs[2].value = -7;
    expect_verify_fails(g, "graph input 2", "bad input id");
    gt_graph_free(g);

    /* a value produced twice (node 6 claims node 5's output) */
    g = gt_graph_copy(base);
    g->nodes[6].out[0] = 10;
    expect_verify_fails(g, "%11", "produced twice");
    gt_graph_free(g);

    /* producer/slot inconsistent */
    g = gt_graph_copy(base);
    g->values[8].producer_slot = 0;
    expect_verify_fails(g, "%8", "slot");
    gt_graph_free(g);

    /* arity and attribute counts */
    g = gt_graph_copy(base);
    g->nodes[2].n_in = 3;
    expect_verify_fails(g, "node 2 (matmul", "arity");
    gt_graph_free(g);
    g = gt_graph_copy(base);
    g->nodes[2].attrs.ni = 1;
    expect_verify_fails(g, "node 2", "attribute count");
    gt_graph_free(g);
    g = gt_graph_copy(base);
    g->nodes[3].attrs.ne = 1; /* split now claims one output */
    expect_verify_fails(g, "split at layers.0.feed_forward.w1: sizes", "split sizes");
    gt_graph_free(g);

    /* an attribute that breaks the shape rule */
    g = gt_graph_copy(base);
    g->nodes[2].attrs.i[1] = 0;
    expect_verify_fails(g, "matmul", "attribute value");
    gt_graph_free(g);

    /* unknown op, bad phase, bad origin, dangling string id */
    g = gt_graph_copy(base);
    g->nodes[1].op = (gt_op)200;
    expect_verify_fails(g, "node 1", "unknown op");
    gt_graph_free(g);
    g = gt_graph_copy(base);
    g->nodes[1].phase = 9;
    expect_verify_fails(g, "node 1", "phase");
    gt_graph_free(g);
    g = gt_graph_copy(base);
    g->nodes[6].origin = 70;
    expect_verify_fails(g, "node 6", "origin");
    gt_graph_free(g);
    g = gt_graph_copy(base);
    g->nodes[6].tags[1] = 100000;
    expect_verify_fails(g, "node 6", "tag id");
    gt_graph_free(g);

    /* a value without producer that is not a graph input */
    g = gt_graph_copy(base);
    g->n_inputs = 3;
    expect_verify_fails(g, "%3", "orphan value");
    gt_graph_free(g);
    gt_graph_free(base);
}

/* Nodes [first, last) copied within one graph (remat), then into another graph with a smaller
 * batch (chunking): copies keep op, attrs and metadata, types follow the new inputs. */
static void test_copy_region(void)
{
    gt_graph *g = gt_graph_new();
    gt_expr b = gt_sym_var(g->sym, "batch");
    gt_value_id x = gt_graph_add_input(g, GT_IN_INPUT, "x", GT_F32, 2, (gt_expr[]){b, gt_c(g, 16)});
    gt_value_id w =
        gt_graph_add_input(g, GT_IN_PARAM, "w", GT_F32, 2, (gt_expr[]){gt_c(g, 32), gt_c(g, 16)});
    gt_value_id nw =
        gt_graph_add_input(g, GT_IN_PARAM, "norm.weight", GT_F32, 1, (gt_expr[]){gt_c(g, 16)});
    gt_graph_set_fqn(g, "block");
    gt_value_id n0 = gt_rms_norm(g, x, nw, 1e-6);                        /* node 0 */
    gt_value_id h = gt_matmul(g, n0, w, false, true);                    /* node 1 */
    gt_value_id a = gt_unary(g, GT_OP_SILU, h);                          /* node 2 */
    gt_value_id s = gt_slice(g, a, 1, gt_c(g, 4), gt_c(g, 20));          /* node 3 */
    gt_value_id r = gt_reduce(g, GT_OP_SUM, s, 2, (int[]){0, 1}, false); /* node 4 */
    gt_graph_add_tag(g, 2, "act");
    gt_graph_add_output(g, GT_OUT_LOSS, "loss", r);
    EXPECT(g->err.code == GT_OK, "%s", g->err.msg);

    gt_value_id *map = malloc(sizeof *map * (size_t)g->n_values);
    for (int k = 0; k < g->n_values; k++)
        map[k] = GT_NONE;
    gt_error err = {0};
    int32_t before = g->n_nodes;
    EXPECT_OK(gt_graph_copy_region(g, g, 1, 4, map, &err), &err);
    EXPECT(g->n_nodes == before + 3, "three nodes copied");
    EXPECT_OK(gt_graph_verify(g, &err), &err);
    for (int k = 0; k < 3; k++) {
        const gt_node *o = &g->nodes[1 + k], *c = &g->nodes[before + k];
        EXPECT(o->op == c->op && memcmp(&o->attrs, &c->attrs, sizeof o->attrs) == 0 &&
                   o->fqn == c->fqn && o->phase == c->phase && o->n_tags == c->n_tags &&
                   (o->n_tags == 0 || o->tags[0] == c->tags[0]),
               "copy %d keeps op, attrs, metadata", k);
        EXPECT(c->out[0] != o->out[0] && map[o->out[0]] == c->out[0], "map points at copy %d", k);
        EXPECT(gt_type_equal(gt_value_type(g, o->out[0]), gt_value_type(g, c->out[0])),
               "copy %d has the same type", k);
    }
    /* the first copied node still reads the original's inputs (n0, w map to themselves) */
    EXPECT(g->nodes[before].in[0] == n0 && g->nodes[before].in[1] == w, "unmapped inputs");
    EXPECT(g->nodes[before + 1].in[0] == map[h], "inputs inside the region are remapped");

    /* into a second graph whose x has a constant batch of 4: shapes are re-derived */
    gt_graph *d = gt_graph_new();
    gt_value_id *map2 = malloc(sizeof *map2 * (size_t)g->n_values);
    for (int k = 0; k < g->n_values; k++)
        map2[k] = GT_NONE;
    map2[x] = gt_graph_add_input(d, GT_IN_INPUT, "x.chunk", GT_F32, 2,
                                 (gt_expr[]){gt_c(d, 4), gt_c(d, 16)});
    map2[w] =
        gt_graph_add_input(d, GT_IN_PARAM, "w", GT_F32, 2, (gt_expr[]){gt_c(d, 32), gt_c(d, 16)});
    EXPECT(gt_graph_copy_region(d, g, 0, 3, map2, &err) == GT_ERR_INVALID &&
               strstr(err.msg, "rms_norm at block"),
           "unmapped input across graphs is an error: %s", err.msg);
    gt_error_clear(&err);
    map2[nw] =
        gt_graph_add_input(d, GT_IN_PARAM, "norm.weight", GT_F32, 1, (gt_expr[]){gt_c(d, 16)});
    EXPECT_OK(gt_graph_copy_region(d, g, 0, 5, map2, &err), &err);
    EXPECT_OK(gt_graph_verify(d, &err), &err);
    EXPECT(d->n_nodes == 5, "five nodes in the chunk graph");
    const gt_type *ht = gt_value_type(d, map2[h]), *st = gt_value_type(d, map2[s]);
    int64_t c0 = 0, c1 = 0;
    EXPECT(ht->ndim == 2 && gt_sym_is_const(d->sym, ht->dims[0], &c0) && c0 == 4 &&
               gt_sym_is_const(d->sym, ht->dims[1], &c1) && c1 == 32,
           "matmul copy is [4, 32]");
    EXPECT(st->ndim == 2 && gt_sym_is_const(d->sym, st->dims[1], &c1) && c1 == 16,
           "slice copy keeps its bounds [4, 20) -> 16 wide");
    EXPECT(strcmp(gt_graph_str(d, d->nodes[0].fqn), "block") == 0 &&
               gt_node_has_tag(d, &d->nodes[2], "act"),
           "strings re-interned in the destination");
    /* a slice whose bounds no longer fit is reported, not copied */
    gt_graph *e = gt_graph_new();
    for (int k = 0; k < g->n_values; k++)
        map2[k] = GT_NONE;
    map2[a] =
        gt_graph_add_input(e, GT_IN_INPUT, "a", GT_F32, 2, (gt_expr[]){gt_c(e, 4), gt_c(e, 8)});
    EXPECT(gt_graph_copy_region(e, g, 3, 4, map2, &err) == GT_ERR_SHAPE &&
               strstr(err.msg, "copy region: node 3") && strstr(err.msg, "slice at block"),
           "%s", err.msg);
    EXPECT(e->n_nodes == 0, "nothing appended on error");
    gt_error_clear(&err);
    EXPECT(gt_graph_copy_region(g, g, 3, 99, map, &err) == GT_ERR_INVALID, "bad range");
    gt_error_clear(&err);
    free(map);
    free(map2);
    gt_graph_free(e);
    gt_graph_free(d);
    gt_graph_free(g);
}

static void test_use_counts_and_eval(void)
{
    gt_graph *g = gt_graph_new();
    gt_expr b = gt_sym_var(g->sym, "batch"), s = gt_sym_var(g->sym, "seq");
    gt_value_id x = gt_graph_add_input(g, GT_IN_INPUT, "x", GT_F32, 2,
                                       (gt_expr[]){gt_sym_mul(g->sym, b, s), gt_c(g, 8)});
    gt_value_id y = gt_mul(g, x, x); /* one node reading x twice */
    gt_value_id z = gt_add(g, y, x); /* x again, y once */
    gt_value_id u = gt_unary(g, GT_OP_EXP, z);
    gt_graph_add_output(g, GT_OUT_METRIC, "z", z);
    gt_graph_add_output(g, GT_OUT_METRIC, "u", u);
    int32_t *uc = gt_graph_use_counts(g);
    EXPECT(uc[x] == 2 && uc[y] == 1 && uc[z] == 2 && uc[u] == 1, "use counts %d %d %d %d", uc[x],
           uc[y], uc[z], uc[u]);
    free(uc);

    gt_sym_binding_entry ent[2] = {{"batch", 2}, {"seq", 3}};
    gt_sym_binding bind = {ent, 2};
    int64_t shape[GT_MAX_DIMS];
    gt_error err = {0};
    EXPECT_OK(gt_graph_eval_shape(g, u, &bind, shape, &err), &err);
    EXPECT(shape[0] == 6 && shape[1] == 8, "eval shape [6, 8]");
    gt_sym_binding half = {ent, 1};
    EXPECT(gt_graph_eval_shape(g, u, &half, shape, &err) != GT_OK && strstr(err.msg, "seq"),
           "unbound symbol named: %s", err.msg);
    gt_error_clear(&err);
    EXPECT(gt_graph_eval_shape(g, 42, &bind, shape, &err) == GT_ERR_INVALID, "bad value id");

    /* bad graph inputs/outputs and tags are recorded, not crashes */
    EXPECT(gt_graph_add_input(g, GT_IN_INPUT, "bad", GT_F32, 9, NULL) == GT_NONE &&
               g->err.code == GT_ERR_INVALID && strstr(g->err.msg, "bad"),
           "rank 9 input: %s", g->err.msg);
    gt_error_clear(&g->err);
    gt_graph_add_output(g, GT_OUT_LOSS, "loss", 1234);
    EXPECT(g->err.code == GT_ERR_INVALID && strstr(g->err.msg, "loss"), "%s", g->err.msg);
    gt_error_clear(&g->err);
    for (int k = 0; k < 5; k++) {
        char t[16];
        snprintf(t, sizeof t, "t%d", k);
        gt_graph_add_tag(g, 0, t);
    }
    EXPECT(g->err.code == GT_ERR_INVALID && g->nodes[0].n_tags == GT_MAX_TAGS, "fifth tag: %s",
           g->err.msg);
    gt_error_clear(&g->err);
    gt_graph_free(g);
}

/* One llama3-style block on symbolic batch/seq: exercises most ops together. */
static gt_value_id llama_block(gt_graph *g, int layer, gt_value_id x, gt_expr b, gt_expr s)
{
    const int64_t dim = 64, heads = 4, kv_heads = 2, head_dim = 16, hidden = 128;
    char fqn[96];
    gt_expr bs = gt_sym_mul(g->sym, b, s);
#define PARAM(name, ...)                                                                           \
    (snprintf(fqn, sizeof fqn, "layers.%d.%s", layer, name),                                       \
     gt_graph_add_input(g, GT_IN_PARAM, fqn, GT_F32,                                               \
                        (int)(sizeof((gt_expr[]){__VA_ARGS__}) / sizeof(gt_expr)),                 \
                        (gt_expr[]){__VA_ARGS__}))
#define FQN(name) (snprintf(fqn, sizeof fqn, "layers.%d.%s", layer, name), gt_graph_set_fqn(g, fqn))
    gt_value_id an = PARAM("attention_norm.weight", gt_c(g, dim));
    gt_value_id wq = PARAM("attention.wq.weight", gt_c(g, heads * head_dim), gt_c(g, dim));
    gt_value_id wk = PARAM("attention.wk.weight", gt_c(g, kv_heads * head_dim), gt_c(g, dim));
    gt_value_id wv = PARAM("attention.wv.weight", gt_c(g, kv_heads * head_dim), gt_c(g, dim));
    gt_value_id wo = PARAM("attention.wo.weight", gt_c(g, dim), gt_c(g, heads * head_dim));
    gt_value_id fn = PARAM("ffn_norm.weight", gt_c(g, dim));
    gt_value_id w1 = PARAM("feed_forward.w1.weight", gt_c(g, hidden), gt_c(g, dim));
    gt_value_id w2 = PARAM("feed_forward.w2.weight", gt_c(g, dim), gt_c(g, hidden));
    gt_value_id w3 = PARAM("feed_forward.w3.weight", gt_c(g, hidden), gt_c(g, dim));
    gt_rope_params rp = {.theta = 500000};
    FQN("attention_norm");
    gt_value_id h = gt_rms_norm(g, x, an, 1e-5);
    FQN("attention");
    gt_value_id q = gt_reshape(g, gt_matmul(g, h, wq, false, true), 4,
                               (gt_expr[]){b, s, gt_c(g, heads), gt_c(g, head_dim)});
    gt_value_id k = gt_reshape(g, gt_matmul(g, h, wk, false, true), 4,
                               (gt_expr[]){b, s, gt_c(g, kv_heads), gt_c(g, head_dim)});
    gt_value_id v = gt_reshape(g, gt_matmul(g, h, wv, false, true), 4,
                               (gt_expr[]){b, s, gt_c(g, kv_heads), gt_c(g, head_dim)});
    q = gt_transpose(g, gt_rope(g, q, &rp, false), 1, 2);
    k = gt_transpose(g, gt_rope(g, k, &rp, false), 1, 2);
    v = gt_transpose(g, v, 1, 2);
    gt_value_id o = gt_sdpa(g, q, k, v, true, 0.25, NULL);
    o = gt_reshape(g, gt_transpose(g, o, 1, 2), 2, (gt_expr[]){bs, gt_c(g, heads * head_dim)});
    x = gt_add(g, x, gt_matmul(g, o, wo, false, true));
    FQN("ffn_norm");
    h = gt_rms_norm(g, x, fn, 1e-5);
    FQN("feed_forward");
    gt_value_id a = gt_unary(g, GT_OP_SILU, gt_matmul(g, h, w1, false, true));
    a = gt_mul(g, a, gt_matmul(g, h, w3, false, true));
    x = gt_add(g, x, gt_matmul(g, a, w2, false, true));
    gt_graph_set_fqn(g, NULL);
#undef PARAM
#undef FQN
    return x;
}

static void test_llama_graph(void)
{
    gt_graph *g = gt_graph_new();
    gt_expr b = gt_sym_var(g->sym, "batch"), s = gt_sym_var(g->sym, "seq");
    gt_expr bs = gt_sym_mul(g->sym, b, s);
    gt_value_id tok = gt_graph_add_input(g, GT_IN_INPUT, "tokens", GT_I32, 2, (gt_expr[]){b, s});
    gt_value_id lab = gt_graph_add_input(g, GT_IN_INPUT, "labels", GT_I64, 1, &bs);
    gt_value_id emb = gt_graph_add_input(g, GT_IN_PARAM, "tok_embeddings.weight", GT_F32, 2,
                                         (gt_expr[]){gt_c(g, 500), gt_c(g, 64)});
    gt_value_id out = gt_graph_add_input(g, GT_IN_PARAM, "output.weight", GT_F32, 2,
                                         (gt_expr[]){gt_c(g, 500), gt_c(g, 64)});
    gt_graph_set_fqn(g, "tok_embeddings");
    gt_value_id x = gt_reshape(g, gt_embedding(g, emb, tok), 2, (gt_expr[]){bs, gt_c(g, 64)});
    for (int l = 0; l < 16; l++)
        x = llama_block(g, l, x, b, s);
    gt_graph_set_fqn(g, "output");
    gt_value_id logits = gt_matmul(g, x, out, false, true);
    gt_value_id loss = gt_cross_entropy(g, logits, lab, -100);
    gt_graph_add_output(g, GT_OUT_LOSS, "loss", loss);
    EXPECT(g->err.code == GT_OK, "llama graph builds: %s", g->err.msg);
    EXPECT(g->n_nodes == 4 + 16 * 24, "node count %d", g->n_nodes);
    gt_error err = {0};
    EXPECT_OK(gt_graph_verify(g, &err), &err);
    gt_graph *c = gt_graph_copy(g);
    char *t1 = graph_text(g), *t2 = graph_text(c);
    EXPECT(strcmp(t1, t2) == 0, "copy of the llama graph prints identically");
    EXPECT(strstr(t1, "= sdpa(") && strstr(t1, "# layers.15.feed_forward fwd"), "printed nodes");
    free(t1);
    free(t2);
    gt_graph_free(c);
    gt_graph_free(g);
}

int main(void)
{
    test_op_table();
    test_strings();
    test_print_and_copy();
    test_verifier();
    test_copy_region();
    test_use_counts_and_eval();
    test_llama_graph();
    return gt_test_finish();
}
