/* test_fusion_merge.c — the fusion pass's sibling merge (src/passes/fusion_merge.c): fused nodes
 * that share an input become one node with several outputs, and every output keeps its bits.
 *
 *   1. The SwiGLU backward (one silu(h1) read by y2 = silu(h1) h3, which a matmul reads, and by
 *      dh3 = dy silu(h1); dh1 = silu_backward(h1, dy h3)), bf16 and f32: one fused node with
 *      three outputs (y2, dh3, dh1 in that order, its program the three two-instruction pieces),
 *      nothing else but the matmul; the graph after dce + fusion and after dce alone run in the
 *      eager executor on the same inputs give memcmp-equal outputs.
 *   2. Where the merged node may sit: a reader of the first node's output before the second node
 *      and an input of the second produced after the first keep them apart; with the second's
 *      inputs all earlier the merged node takes the first's place, before that reader; a
 *      collective between them does not matter; a phase change, no shared input, or different
 *      output dims keep them apart. Every merged graph is also checked bitwise against the unfused
 * one. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusion_graphs.h"
#include "graphtrain/gt_build.h"
#include "graphtrain/gt_exec.h"
#include "gt_test.h"
#include "ir/fused_program.h"

static const gt_node *producer(const gt_graph *g, gt_value_id v)
{
    gt_node_id p = g->values[v].producer;
    return p == GT_NONE ? NULL : &g->nodes[p];
}

/* ---------------------------------------------------------------- 1. SwiGLU backward */

static void test_swiglu_backward(gt_dtype dt)
{
    const char *what = dt == GT_BF16 ? "swiglu backward bf16" : "swiglu backward f32";
    gt_graph *g = gt_graph_new();
    g->cur_phase = GT_PHASE_BACKWARD;
    gt_value_id h1 = fg_input(g, "h1", dt, 16, 24), h3 = fg_input(g, "h3", dt, 16, 24);
    gt_value_id dy = fg_input(g, "dy", dt, 16, 24), w = fg_input(g, "w", dt, 24, 8);
    gt_value_id s = gt_unary(g, GT_OP_SILU, h1);
    gt_value_id y2 = gt_mul(g, s, h3);
    gt_value_id dw = gt_matmul(g, y2, w, false, false);
    gt_value_id dh3 = gt_mul(g, dy, s);
    gt_value_id dh1 = gt_silu_backward(g, h1, gt_mul(g, dy, h3));
    gt_graph_add_output(g, GT_OUT_METRIC, "dw", dw);
    gt_graph_add_output(g, GT_OUT_METRIC, "dh3", dh3);
    gt_graph_add_output(g, GT_OUT_METRIC, "dh1", dh1);
    gt_graph *f = fg_fuse_and_compare(g, what);
    EXPECT(f->n_nodes == 2 && count_op(f, GT_OP_FUSED_ELEMENTWISE) == 1 &&
               count_op(f, GT_OP_MATMUL) == 1,
           "%s: one fused node and the matmul, got %d nodes", what, f->n_nodes);
    const gt_node *m = producer(f, f->outputs[1].value);
    EXPECT(m && m->op == GT_OP_FUSED_ELEMENTWISE && m->n_out == 3 && m->n_in == 3 &&
               m->attrs.ni == 6,
           "%s: 3 inputs, 3 outputs, 6 instructions", what);
    if (m && m->n_out == 3) {
        const gt_node *mm = producer(f, f->outputs[0].value);
        EXPECT(mm && mm->op == GT_OP_MATMUL && producer(f, mm->in[0]) == m &&
                   m->out[0] == mm->in[0] && m->out[1] == f->outputs[1].value &&
                   m->out[2] == f->outputs[2].value,
               "%s: outputs in order y2 (read by the matmul), dh3, dh1", what);
        int reg[GT_FUSED_MAX_INS];
        int no = gt_fused_outputs(m->attrs.i, m->attrs.ni, reg);
        EXPECT(no == 3 && reg[0] == 1 && reg[1] == 3 && reg[2] == 5,
               "%s: outputs are instructions 1, 3, 5 (got %d outputs)", what, no);
        const int ops[6] = {GT_OP_SILU, GT_OP_MUL, GT_OP_SILU,
                            GT_OP_MUL,  GT_OP_MUL, GT_OP_SILU_BACKWARD};
        for (int k = 0; k < 6 && k < m->attrs.ni; k++)
            EXPECT(gt_fused_decode(m->attrs.i[k]).op == ops[k], "%s: instruction %d is %s", what, k,
                   gt_op_get((gt_op)ops[k])->name);
    }
    gt_graph_free(f);
    gt_graph_free(g);
}

/* ---------------------------------------------------------------- 2. placement and limits */

/* Two fused nodes over x: a = silu(x) * y, then `between`, then b = silu(x) * z. */
typedef enum {
    BETWEEN_NONE,
    BETWEEN_READER,
    BETWEEN_READER_AND_PRODUCER,
    BETWEEN_COLLECTIVE,
    BETWEEN_PHASE
} between_kind;

static gt_graph *two_siblings(between_kind k, bool other_dims, gt_value_id *a_out,
                              gt_value_id *b_out, gt_value_id *reader)
{
    gt_graph *g = gt_graph_new();
    gt_value_id x = fg_input(g, "x", GT_F32, 6, 10), y = fg_input(g, "y", GT_F32, 6, 10);
    gt_value_id z = fg_input(g, "z", GT_F32, 6, 10), w = fg_input(g, "w", GT_F32, 10, 10);
    gt_value_id x2 = fg_input(g, "x2", GT_F32, 1, 10);
    /* other_dims: a = silu(x2) y is [6, 10] (broadcast), b = silu(x2) x2 is [1, 10] */
    *a_out = gt_mul(g, gt_unary(g, GT_OP_SILU, other_dims ? x2 : x), y);
    *reader = GT_NONE;
    gt_value_id zz = z;
    if (k == BETWEEN_READER || k == BETWEEN_READER_AND_PRODUCER)
        *reader = gt_matmul(g, *a_out, w, false, false);
    if (k == BETWEEN_READER_AND_PRODUCER) zz = gt_matmul(g, z, w, false, false);
    if (k == BETWEEN_COLLECTIVE) {
        gt_attrs ca = {.i = {0, 1}, .ni = 2}; /* a group of one: the eager run copies */
        gt_value_id st = gt_graph_add_node(g, GT_OP_ALL_REDUCE_START, &w, 1, &ca, NULL);
        gt_value_id wi[2] = {st, w};
        gt_graph_add_output(g, GT_OUT_METRIC, "r",
                            gt_graph_add_node(g, GT_OP_WAIT, wi, 2, NULL, NULL));
    }
    if (k == BETWEEN_PHASE) g->cur_phase = GT_PHASE_BACKWARD;
    *b_out = other_dims ? gt_mul(g, gt_unary(g, GT_OP_SILU, x2), x2)
                        : gt_mul(g, gt_unary(g, GT_OP_SILU, x), zz);
    gt_graph_add_output(g, GT_OUT_METRIC, "a", *a_out);
    gt_graph_add_output(g, GT_OUT_METRIC, "b", *b_out);
    if (*reader != GT_NONE) gt_graph_add_output(g, GT_OUT_METRIC, "reader", *reader);
    return g;
}

static void test_placement(void)
{
    static const struct {
        between_kind k;
        bool other_dims;
        int fused; /* fused nodes after the pass */
        const char *what;
    } cases[] = {
        {BETWEEN_NONE, false, 1, "adjacent siblings merge"},
        {BETWEEN_READER, false, 1, "a reader of a in between: merged in a's place"},
        {BETWEEN_READER_AND_PRODUCER, false, 2, "a reader of a and a producer of b's input"},
        {BETWEEN_COLLECTIVE, false, 1, "a collective in between: merged across it"},
        {BETWEEN_PHASE, false, 2, "different phases"},
        {BETWEEN_NONE, true, 2, "different output dims"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        gt_value_id a, b, reader;
        gt_graph *g = two_siblings(cases[c].k, cases[c].other_dims, &a, &b, &reader);
        gt_graph *f = fg_fuse_and_compare(g, cases[c].what);
        int fused = count_op(f, GT_OP_FUSED_ELEMENTWISE);
        EXPECT(fused == cases[c].fused, "%s: %d fused nodes, expected %d", cases[c].what, fused,
               cases[c].fused);
        /* outputs keep their order: a, b (and the reader) */
        gt_value_id fa = f->outputs[cases[c].k == BETWEEN_COLLECTIVE ? 1 : 0].value;
        if (fused == 1) {
            gt_node_id m = f->values[fa].producer;
            EXPECT(f->nodes[m].n_out == 2, "%s: the merged node has 2 outputs", cases[c].what);
            for (gt_node_id n = 0; n < f->n_nodes; n++)
                for (int s = 0; s < f->nodes[n].n_in; s++)
                    if (f->values[f->nodes[n].in[s]].producer == m)
                        EXPECT(n > m, "%s: node %d reads the merged node %d before it",
                               cases[c].what, n, m);
        }
        gt_graph_free(f);
        gt_graph_free(g);
    }
    /* no shared input: two fused nodes stay two */
    gt_graph *g = gt_graph_new();
    gt_value_id x = fg_input(g, "x", GT_F32, 4, 4), y = fg_input(g, "y", GT_F32, 4, 4);
    gt_value_id p = fg_input(g, "p", GT_F32, 4, 4), q = fg_input(g, "q", GT_F32, 4, 4);
    gt_graph_add_output(g, GT_OUT_METRIC, "a", gt_mul(g, gt_unary(g, GT_OP_SILU, x), y));
    gt_graph_add_output(g, GT_OUT_METRIC, "b", gt_mul(g, gt_unary(g, GT_OP_SILU, p), q));
    gt_graph *f = fg_fuse_and_compare(g, "no shared input");
    EXPECT(count_op(f, GT_OP_FUSED_ELEMENTWISE) == 2, "no shared input: no merge");
    gt_graph_free(f);
    gt_graph_free(g);
}

int main(void)
{
    test_swiglu_backward(GT_BF16);
    test_swiglu_backward(GT_F32);
    test_placement();
    return gt_test_finish();
}
