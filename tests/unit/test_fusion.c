/* test_fusion.c — the fusion pass and fused_elementwise on the CPU: fused graphs compute the
 * unfused graphs' bits.
 *
 *   1. Random graphs of elementwise ops (f32 only, bf16 only, mixed f32/bf16/f16 with casts), on
 *      inputs of broadcasting shapes ([3, 5, 7], [5, 7], [7], [1, 7], [5, 1], []), with values
 *      read twice and graph outputs in the middle of chains (so that groups read registers more
 *      than once and copy unary nodes read elsewhere; both are counted and must occur): the
 *      graph after dce + fusion and the graph after dce alone run in the eager executor on the
 *      same inputs; every output must be memcmp-equal. The reference is the unfused graph run op
 *      by op.
 *   2. The pass's rules on hand-built graphs: the SwiGLU forward and backward chains fuse into one
 *      node each (with the expected programs), and the llama3 backward's one silu read by two
 *      products is copied into both and goes; a value read twice within a group is a register
 *      read twice; a graph output and a phase change stop a chain; no chain crosses a
 *      collective; at most 8 instructions per node, at least two ops per node. Duplication: a
 *      unary node read by a matmul is not copied; one copied into a reader but still read by
 *      another (across a collective) stays; a copied chain dies as a whole; a value a fused
 *      node reads is never absorbed later; a widening cast is copied, a narrowing one not. The
 *      fused graphs run against the unfused ones in the eager executor, bitwise.
 *   3. The shape rule refuses malformed programs (a forward reference, a wrong recorded dtype,
 *      operands that do not broadcast), naming the instruction. Several outputs: the OUTPUT flag
 *      (bit 40) and gt_fused_outputs; the SwiGLU backward triple as one node types as three
 *      outputs (bf16, f32), outputs keep their own dtypes, eight flagged instructions are eight
 *      outputs; a flagged register not of the node's shape and bits above 40 are refused.
 *   4. The kernel on a broadcast program against a naive per-element evaluation written here
 *      (f32 math, bf16 rounding by hand); the three-output triple likewise (bf16, f32, two
 *      chunks), and calls with the wrong output count or shape refused. A hand-built graph with a
 *      three-output node verifies, runs eager and compiled bitwise equal to the unfused graph,
 *      and prints its three outputs.
 *   5. The llama3 test_tiny and debugmodel whole-step graphs (bf16 and f32 compute, memory policy
 *      default): the full pipeline with fusion and with fusion disabled, both compiled and run 3
 *      steps, each feeding its updates back: every output bitwise equal at every step, and the
 *      fused graph has fewer nodes. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"
#include "fusion_graphs.h"
#include "graph_text.h"
#include "graphtrain/gt_backend.h"
#include "graphtrain/gt_build.h"
#include "graphtrain/gt_exec.h"
#include "graphtrain/gt_pass.h"
#include "graphtrain/gt_program.h"
#include "gt_test.h"
#include "ir/fused_program.h"
#include "step_harness.h"

/* ---------------------------------------------------------------- 1. random graphs */

static void test_random_graphs(void)
{
    static const char *const modes[3] = {"f32", "bf16", "mixed"};
    uint64_t s = 0x9e3779b97f4a7c15ull;
    int fused_nodes = 0, removed = 0, graphs = 0, max_ins = 0, with_bcast = 0;
    int copies = 0, reread = 0; /* duplicated instructions; registers read more than once */
    for (int mode = 0; mode < 3; mode++) {
        for (int trial = 0; trial < 40; trial++) {
            gt_error err = {0};
            gt_graph *ref = rg_build(&s, mode);
            EXPECT(ref->err.code == GT_OK, "%s graph %d built: %s", modes[mode], trial,
                   ref->err.msg);
            if (ref->err.code != GT_OK) {
                gt_graph_free(ref);
                continue;
            }
            static const char *const dce[] = {"dce"};
            EXPECT_OK(run_only(ref, dce, 1, &err), &err);
            gt_graph *fus = gt_graph_copy(ref);
            EXPECT_OK(run_fusion(fus, &err), &err);
            graphs++;
            fused_nodes += count_op(fus, GT_OP_FUSED_ELEMENTWISE);
            removed += ref->n_nodes - fus->n_nodes;
            /* every original node gone from the fused graph (absorbed, a root, or a duplicated
             * node that died) is at least one instruction: instructions beyond those are copies */
            int ins = 0,
                gone = ref->n_nodes - (fus->n_nodes - count_op(fus, GT_OP_FUSED_ELEMENTWISE));
            for (int32_t n = 0; n < fus->n_nodes; n++) {
                const gt_node *nd = &fus->nodes[n];
                if (nd->op != GT_OP_FUSED_ELEMENTWISE) continue;
                if (nd->attrs.ni > max_ins) max_ins = nd->attrs.ni;
                ins += nd->attrs.ni;
                int reads[GT_FUSED_MAX_INS] = {0};
                for (int k = 0; k < nd->attrs.ni; k++) {
                    gt_fused_ins fi = gt_fused_decode(nd->attrs.i[k]);
                    for (int a = 0; a < gt_fused_arity(fi.op); a++)
                        if (fi.src[a] >= GT_FUSED_TEMP) reads[fi.src[a] - GT_FUSED_TEMP]++;
                }
                for (int k = 0; k < nd->attrs.ni; k++)
                    reread += reads[k] > 1;
                EXPECT(nd->attrs.ni >= 2 && nd->attrs.ni <= GT_FUSED_MAX_INS,
                       "%d instructions in a fused node", nd->attrs.ni);
                const gt_type *to = gt_value_type(fus, nd->out[0]);
                for (int k = 0; k < nd->n_in; k++) {
                    const gt_type *ti = gt_value_type(fus, nd->in[k]);
                    with_bcast += ti->ndim != to->ndim;
                }
            }
            EXPECT(ins >= gone, "%s graph %d: %d instructions for %d nodes gone", modes[mode],
                   trial, ins, gone);
            copies += ins - gone;
            gt_tensor *in = rg_inputs(ref, &s);
            gt_tensor *o1 = calloc((size_t)ref->n_outputs, sizeof *o1);
            gt_tensor *o2 = calloc((size_t)ref->n_outputs, sizeof *o2);
            EXPECT_OK(gt_eager_run(ref, NULL, in, o1, &err), &err);
            EXPECT_OK(gt_eager_run(fus, NULL, in, o2, &err), &err);
            int bad = 0;
            for (int32_t k = 0; k < ref->n_outputs; k++)
                bad += !same_bits(&o1[k], &o2[k]);
            EXPECT(bad == 0, "%s graph %d: %d of %d outputs differ fused vs unfused", modes[mode],
                   trial, bad, ref->n_outputs);
            if (bad) gt_graph_print(fus, stderr);
            free_array(in, ref->n_inputs);
            free_array(o1, ref->n_outputs);
            free_array(o2, ref->n_outputs);
            gt_graph_free(ref);
            gt_graph_free(fus);
        }
    }
    printf("random graphs: %d graphs, %d fused nodes, %d nodes removed, up to %d instructions, "
           "%d broadcast inputs, %d duplicated instructions, %d registers read twice or more\n",
           graphs, fused_nodes, removed, max_ins, with_bcast, copies, reread);
    EXPECT(fused_nodes > graphs && removed > 2 * graphs && with_bcast > 0 && copies > 0 &&
               reread > 0,
           "the random graphs exercised fusion (%d fused nodes, %d removed, %d copies, %d "
           "registers read twice)",
           fused_nodes, removed, copies, reread);
}

/* ---------------------------------------------------------------- 2. the pass's rules */

/* The fused node producing value v, or NULL. */
static const gt_node *fused_producer(const gt_graph *g, gt_value_id v)
{
    gt_node_id p = g->values[v].producer;
    if (p == GT_NONE || g->nodes[p].op != GT_OP_FUSED_ELEMENTWISE) return NULL;
    return &g->nodes[p];
}

/* The fused node producing v reads value w as an input. */
static bool fused_reads(const gt_graph *g, gt_value_id v, gt_value_id w)
{
    const gt_node *f = fused_producer(g, v);
    for (int k = 0; f && k < f->n_in; k++)
        if (f->in[k] == w) return true;
    return false;
}

/* ref (the graph before fusion) and g (after) run in the eager executor on the same inputs: every
 * output must be bitwise equal. */
static void test_swiglu(void)
{
    gt_error err = {0};
    gt_graph *g = gt_graph_new();
    gt_value_id h1 = fg_input(g, "h1", GT_BF16, 4, 8), h3 = fg_input(g, "h3", GT_BF16, 4, 8);
    gt_value_id dy = fg_input(g, "dy", GT_BF16, 4, 8);
    gt_value_id y = gt_mul(g, gt_unary(g, GT_OP_SILU, h1), h3);
    g->cur_phase = GT_PHASE_BACKWARD;
    gt_value_id dh1 = gt_silu_backward(g, h1, gt_mul(g, dy, h3));
    gt_value_id dh3 = gt_mul(g, dy, gt_unary(g, GT_OP_SILU, h1));
    gt_graph_add_output(g, GT_OUT_METRIC, "y", y);
    gt_graph_add_output(g, GT_OUT_METRIC, "dh1", dh1);
    gt_graph_add_output(g, GT_OUT_METRIC, "dh3", dh3);
    EXPECT(g->err.code == GT_OK, "swiglu built: %s", g->err.msg);
    EXPECT_OK(run_fusion(g, &err), &err);
    /* the two backward nodes share h1 and dy: the sibling merge (fusion_merge.c, tested in
     * test_fusion_merge.c) makes them one node with two outputs, dh1's piece first */
    EXPECT(g->n_nodes == 2 && count_op(g, GT_OP_FUSED_ELEMENTWISE) == 2,
           "swiglu: 6 nodes -> 2 fused, got %d nodes", g->n_nodes);
    const gt_node *f = fused_producer(g, g->outputs[0].value);
    EXPECT(f && f->n_in == 2 && f->in[0] == h1 && f->in[1] == h3 && f->attrs.ni == 2 &&
               f->attrs.i[0] == gt_fused_encode(GT_OP_SILU, GT_BF16, 0, 0, 0) &&
               f->attrs.i[1] == gt_fused_encode(GT_OP_MUL, GT_BF16, GT_FUSED_TEMP, 1, 0) &&
               f->phase == GT_PHASE_FORWARD,
           "forward program: silu(h1) * h3");
    f = fused_producer(g, g->outputs[1].value);
    EXPECT(f && f == fused_producer(g, g->outputs[2].value) && f->n_out == 2 && f->n_in == 3 &&
               f->in[0] == dy && f->in[1] == h3 && f->in[2] == h1 && f->attrs.ni == 4 &&
               f->attrs.i[0] == gt_fused_encode(GT_OP_MUL, GT_BF16, 0, 1, 0) &&
               f->attrs.i[1] ==
                   gt_fused_encode_out(GT_OP_SILU_BACKWARD, GT_BF16, 2, GT_FUSED_TEMP, 0, true) &&
               f->attrs.i[2] == gt_fused_encode(GT_OP_SILU, GT_BF16, 2, 0, 0) &&
               f->attrs.i[3] ==
                   gt_fused_encode_out(GT_OP_MUL, GT_BF16, 0, GT_FUSED_TEMP + 2, 0, true) &&
               f->phase == GT_PHASE_BACKWARD,
           "backward program: silu_backward(h1, dy * h3), then dy * silu(h1)");
    char *buf = graph_text(g);
    EXPECT(buf && strstr(buf, "fused_elementwise("), "the printer names the op");
    free(buf);
    gt_graph_free(g);

    /* the backward as the llama3 graph has it after CSE and remat: ONE s = silu(h1) read by the
     * recomputed product y2 = s * h3 (read by the w2 gradient matmul) and by dh3 = dy * s; dh1 =
     * silu_backward(h1, dy * h3). s is duplicated into both products and then dies: no silu
     * kernel is left, each product reads h1 instead of s */
    g = gt_graph_new();
    h1 = fg_input(g, "h1", GT_BF16, 4, 8), h3 = fg_input(g, "h3", GT_BF16, 4, 8);
    dy = fg_input(g, "dy", GT_BF16, 4, 8);
    gt_value_id w2 = fg_input(g, "w2", GT_BF16, 8, 4);
    g->cur_phase = GT_PHASE_BACKWARD;
    gt_value_id s = gt_unary(g, GT_OP_SILU, h1);
    gt_value_id y2 = gt_mul(g, s, h3);
    dh3 = gt_mul(g, dy, s);
    dh1 = gt_silu_backward(g, h1, gt_mul(g, dy, h3));
    gt_graph_add_output(g, GT_OUT_METRIC, "dw2", gt_matmul(g, y2, w2, false, false));
    gt_graph_add_output(g, GT_OUT_METRIC, "dh3", dh3);
    gt_graph_add_output(g, GT_OUT_METRIC, "dh1", dh1);
    EXPECT(g->err.code == GT_OK, "swiglu backward built: %s", g->err.msg);
    gt_graph *ref = gt_graph_copy(g);
    EXPECT_OK(run_fusion(g, &err), &err);
    /* the three products then merge into one node of three outputs (programs: see
     * test_fusion_merge.c), in y2's place, before the matmul that reads y2 */
    EXPECT(g->n_nodes == 2 && count_op(g, GT_OP_SILU) == 0 && count_op(g, GT_OP_MUL) == 0 &&
               count_op(g, GT_OP_FUSED_ELEMENTWISE) == 1 && count_op(g, GT_OP_MATMUL) == 1,
           "swiglu backward: 6 nodes -> 1 fused + matmul, no silu left (%d nodes)", g->n_nodes);
    const gt_node *mm = &g->nodes[g->values[g->outputs[0].value].producer];
    f = mm->op == GT_OP_MATMUL ? fused_producer(g, mm->in[0]) : NULL;
    EXPECT(f && f->n_out == 3 && f == fused_producer(g, g->outputs[1].value) &&
               f == fused_producer(g, g->outputs[2].value) && f->attrs.ni == 6 &&
               f->attrs.i[0] == gt_fused_encode(GT_OP_SILU, GT_BF16, 0, 0, 0) &&
               f->attrs.i[1] == gt_fused_encode_out(GT_OP_MUL, GT_BF16, GT_FUSED_TEMP, 1, 0, true),
           "y2, dh3, dh1 from one node; y2's piece silu(h1) * h3 first");
    fg_expect_same_outputs("swiglu backward", ref, g);
    gt_graph_free(ref);
    gt_graph_free(g);
}

static void test_boundaries(void)
{
    gt_error err = {0};
    /* t = exp(x) read twice, by neg and by add, both in w's group: t becomes a register read
     * twice and exp is absorbed: w = fused(exp, neg, scale, add) reading x. u = sigmoid(x2) is a
     * graph output: it stays, and is not duplicated into z = mul(u, x) (the copy would gain
     * nothing), so mul stays alone */
    gt_graph *g = gt_graph_new();
    gt_value_id x = fg_input(g, "x", GT_F32, 3, 5), x2 = fg_input(g, "x2", GT_F32, 3, 5);
    gt_value_id t = gt_unary(g, GT_OP_EXP, x);
    gt_value_id u = gt_unary(g, GT_OP_SIGMOID, x2);
    gt_value_id w = gt_add(g, gt_scale(g, gt_unary(g, GT_OP_NEG, t), 0.5), t);
    gt_value_id z = gt_mul(g, u, x);
    gt_graph_add_output(g, GT_OUT_METRIC, "w", w);
    gt_graph_add_output(g, GT_OUT_METRIC, "u", u);
    gt_graph_add_output(g, GT_OUT_METRIC, "z", z);
    gt_graph *ref = gt_graph_copy(g);
    EXPECT_OK(run_fusion(g, &err), &err);
    /* sigmoid, fused(exp, neg, scale, add), mul */
    EXPECT(g->n_nodes == 3 && count_op(g, GT_OP_EXP) == 0 && count_op(g, GT_OP_SIGMOID) == 1 &&
               count_op(g, GT_OP_MUL) == 1 && count_op(g, GT_OP_FUSED_ELEMENTWISE) == 1,
           "read-twice value absorbed, output value stays: %d nodes", g->n_nodes);
    const int T = GT_FUSED_TEMP;
    const gt_node *f = fused_producer(g, g->outputs[0].value);
    EXPECT(f && f->attrs.ni == 4 && f->n_in == 1 && f->in[0] == x && f->attrs.nf == 1 &&
               f->attrs.f[0] == 0.5 &&
               f->attrs.i[0] == gt_fused_encode(GT_OP_EXP, GT_F32, 0, 0, 0) &&
               f->attrs.i[1] == gt_fused_encode(GT_OP_NEG, GT_F32, T + 0, 0, 0) &&
               f->attrs.i[2] == gt_fused_encode(GT_OP_SCALE, GT_F32, T + 1, 0, 0) &&
               f->attrs.i[3] == gt_fused_encode(GT_OP_ADD, GT_F32, T + 2, T + 0, 0),
           "w = exp, neg, scale, add(r2, r0): exp's register read twice");
    fg_expect_same_outputs("read twice", ref, g);
    gt_graph_free(ref);
    gt_graph_free(g);

    /* a phase change ends a chain: forward exp, backward neg */
    g = gt_graph_new();
    x = fg_input(g, "x", GT_F32, 3, 5);
    t = gt_unary(g, GT_OP_EXP, x);
    g->cur_phase = GT_PHASE_BACKWARD;
    gt_graph_add_output(g, GT_OUT_METRIC, "y", gt_unary(g, GT_OP_NEG, t));
    EXPECT_OK(run_fusion(g, &err), &err);
    EXPECT(g->n_nodes == 2 && count_op(g, GT_OP_FUSED_ELEMENTWISE) == 0, "phases stay apart");
    gt_graph_free(g);

    /* a chain crosses a collective: exp(x), all_reduce of x2, neg(exp) is one node after the
     * wait (the exp moves later, to its root), and the chain after the collective fuses too */
    g = gt_graph_new();
    x = fg_input(g, "x", GT_F32, 3, 5), x2 = fg_input(g, "x2", GT_F32, 3, 5);
    t = gt_unary(g, GT_OP_EXP, x);
    gt_attrs ca = {.i = {0, 2}, .ni = 2};
    gt_value_id st = gt_graph_add_node(g, GT_OP_ALL_REDUCE_START, &x2, 1, &ca, NULL);
    gt_value_id wi[2] = {st, x2};
    gt_value_id wv = gt_graph_add_node(g, GT_OP_WAIT, wi, 2, NULL, NULL);
    gt_graph_add_output(g, GT_OUT_METRIC, "y", gt_unary(g, GT_OP_NEG, t));
    gt_graph_add_output(g, GT_OUT_METRIC, "r", wv);
    gt_graph_add_output(g, GT_OUT_METRIC, "q", gt_unary(g, GT_OP_SQRT, gt_unary(g, GT_OP_EXP, wv)));
    EXPECT(g->err.code == GT_OK, "collective graph built: %s", g->err.msg);
    EXPECT_OK(run_fusion(g, &err), &err);
    gt_node_id wait_at = g->values[g->outputs[1].value].producer;
    gt_node_id y_at = g->values[g->outputs[0].value].producer;
    EXPECT(count_op(g, GT_OP_EXP) == 0 && count_op(g, GT_OP_NEG) == 0 &&
               count_op(g, GT_OP_FUSED_ELEMENTWISE) == 2 && g->n_nodes == 4 &&
               g->nodes[y_at].op == GT_OP_FUSED_ELEMENTWISE && y_at > wait_at &&
               fused_reads(g, g->outputs[0].value, x),
           "neg(exp(x)) fuses across the collective, after its wait; exp, sqrt after it fuse "
           "(%d nodes)",
           g->n_nodes);
    EXPECT_OK(gt_graph_verify(g, &err), &err);
    gt_graph_free(g);

    /* chains of 9, 16 and 17 ops (neg and add_scalar in turn): nodes of at most 8 instructions
     * and 4 constants, taken from the end; a single op left over is not fused */
    const int totals[3] = {9, 16, 17};
    for (int t3 = 0; t3 < 3; t3++) {
        int total = totals[t3];
        g = gt_graph_new();
        gt_value_id v = fg_input(g, "x", GT_F32, 2, 3);
        for (int k = 0; k < total; k++)
            v = k % 2 ? gt_add_scalar(g, v, 0.25 * k) : gt_unary(g, GT_OP_NEG, v);
        gt_graph_add_output(g, GT_OUT_METRIC, "y", v);
        EXPECT_OK(run_fusion(g, &err), &err);
        int fused = count_op(g, GT_OP_FUSED_ELEMENTWISE), ins = 0, ok_limits = 1;
        for (int32_t n = 0; n < g->n_nodes; n++)
            if (g->nodes[n].op == GT_OP_FUSED_ELEMENTWISE) {
                ins += g->nodes[n].attrs.ni;
                ok_limits &= g->nodes[n].attrs.ni >= 2 && g->nodes[n].attrs.ni <= 8 &&
                             g->nodes[n].attrs.nf <= GT_FUSED_MAX_CONST;
            }
        int plain = g->n_nodes - fused;
        EXPECT(ok_limits && ins + plain == total && fused == total / 8 && plain == total % 8,
               "chain of %d: %d fused nodes, %d instructions, %d unfused", total, fused, ins,
               plain);
        gt_graph_free(g);
    }
}

/* Fuses g (with dce), checks it against its unfused copy in the eager executor; returns g. */
static gt_graph *fuse_checked(const char *what, gt_graph *g)
{
    gt_error err = {0};
    EXPECT(g->err.code == GT_OK, "%s built: %s", what, g->err.msg);
    gt_graph *ref = gt_graph_copy(g);
    EXPECT_OK(run_fusion(g, &err), &err);
    fg_expect_same_outputs(what, ref, g);
    gt_graph_free(ref);
    return g;
}

static void test_duplication(void)
{
    /* s = silu(h1) read by mul(s, h3) and by a matmul: s stays for the matmul, so a copy in the
     * mul would gain nothing (the mul reads h1 instead of s, same bytes, same kernels) and s is
     * not duplicated; the lone mul is not fused */
    gt_graph *g = gt_graph_new();
    gt_value_id h1 = fg_input(g, "h1", GT_BF16, 4, 8), h3 = fg_input(g, "h3", GT_BF16, 4, 8);
    gt_value_id w = fg_input(g, "w", GT_BF16, 8, 4);
    gt_value_id s = gt_unary(g, GT_OP_SILU, h1);
    gt_graph_add_output(g, GT_OUT_METRIC, "y", gt_mul(g, s, h3));
    gt_graph_add_output(g, GT_OUT_METRIC, "m", gt_matmul(g, s, w, false, false));
    fuse_checked("silu read by a matmul", g);
    EXPECT(g->n_nodes == 3 && count_op(g, GT_OP_SILU) == 1 && count_op(g, GT_OP_MUL) == 1 &&
               count_op(g, GT_OP_FUSED_ELEMENTWISE) == 0,
           "silu read by a matmul stays, not duplicated (%d nodes)", g->n_nodes);
    gt_graph_free(g);

    /* a duplicated node that stays: s = silu(x) read by m1 = s * y and by m2 = s * x2, which
     * seven negations follow. Both readers are elementwise, so s is worth duplicating; m1 gets a
     * copy, m2's group is full (m2 and the negations: 8 instructions) and reads s: s stays */
    g = gt_graph_new();
    gt_value_id x = fg_input(g, "x", GT_F32, 3, 5), y = fg_input(g, "y", GT_F32, 3, 5);
    gt_value_id x2 = fg_input(g, "x2", GT_F32, 3, 5);
    s = gt_unary(g, GT_OP_SILU, x);
    gt_value_id m1 = gt_mul(g, s, y), m2 = gt_mul(g, s, x2);
    for (int k = 0; k < 7; k++)
        m2 = gt_unary(g, GT_OP_NEG, m2);
    gt_graph_add_output(g, GT_OUT_METRIC, "m1", m1);
    gt_graph_add_output(g, GT_OUT_METRIC, "m2", m2);
    fuse_checked("duplicated node that stays", g);
    const gt_node *f2 = &g->nodes[g->values[g->outputs[1].value].producer];
    EXPECT(g->n_nodes == 3 && count_op(g, GT_OP_SILU) == 1 &&
               count_op(g, GT_OP_FUSED_ELEMENTWISE) == 2 && fused_reads(g, g->outputs[0].value, x),
           "silu copied into m1 = fused(silu(x) * y) and kept for m2's group (%d nodes)",
           g->n_nodes);
    bool reads_silu = false;
    for (int k = 0; k < f2->n_in; k++)
        reads_silu |= g->values[f2->in[k]].producer != GT_NONE &&
                      g->nodes[g->values[f2->in[k]].producer].op == GT_OP_SILU;
    EXPECT(f2->op == GT_OP_FUSED_ELEMENTWISE && f2->attrs.ni == 8 && reads_silu,
           "m2's group of 8 instructions reads the original silu");
    gt_graph_free(g);

    /* a unary node read by two elementwise readers with a collective between them: both get a
     * copy and the original goes (the two copies then share x: the sibling merge makes them one
     * node of two outputs, after the wait) */
    g = gt_graph_new();
    x = fg_input(g, "x", GT_F32, 3, 5), y = fg_input(g, "y", GT_F32, 3, 5);
    x2 = fg_input(g, "x2", GT_F32, 3, 5);
    s = gt_unary(g, GT_OP_SILU, x);
    m1 = gt_mul(g, s, y);
    gt_attrs ca = {.i = {0, 2}, .ni = 2};
    gt_value_id st = gt_graph_add_node(g, GT_OP_ALL_REDUCE_START, &x2, 1, &ca, NULL);
    gt_value_id wi[2] = {st, x2};
    gt_value_id r = gt_graph_add_node(g, GT_OP_WAIT, wi, 2, NULL, NULL);
    gt_graph_add_output(g, GT_OUT_METRIC, "m1", m1);
    gt_graph_add_output(g, GT_OUT_METRIC, "m2", gt_mul(g, s, r));
    gt_error err = {0}; /* (value ids are compacted by the pass: r is not looked at after it) */
    EXPECT(g->err.code == GT_OK, "collective graph built: %s", g->err.msg);
    EXPECT_OK(run_fusion(g, &err), &err);
    EXPECT_OK(gt_graph_verify(g, &err), &err);
    EXPECT(
        g->n_nodes == 3 && count_op(g, GT_OP_SILU) == 0 &&
            count_op(g, GT_OP_FUSED_ELEMENTWISE) == 1 && fused_reads(g, g->outputs[0].value, x) &&
            fused_reads(g, g->outputs[1].value, x) && g->n_nodes == 3 &&
            g->nodes[1].op == GT_OP_WAIT && g->values[g->outputs[1].value].producer == 2,
        "silu copied into both readers across the collective and removed (%d nodes)", g->n_nodes);
    gt_graph_free(g);

    /* a duplicated chain dies as a whole: b = neg(exp(x)) read by b * y and b + y2: both get a
     * copy of exp and neg, and neither original is left */
    g = gt_graph_new();
    x = fg_input(g, "x", GT_F32, 3, 5), y = fg_input(g, "y", GT_F32, 3, 5);
    gt_value_id y2 = fg_input(g, "y2", GT_F32, 1, 5);
    gt_value_id b = gt_unary(g, GT_OP_NEG, gt_unary(g, GT_OP_EXP, x));
    gt_graph_add_output(g, GT_OUT_METRIC, "p", gt_mul(g, b, y));
    gt_graph_add_output(g, GT_OUT_METRIC, "q", gt_add(g, b, y2));
    fuse_checked("duplicated chain", g);
    EXPECT(g->n_nodes == 2 && count_op(g, GT_OP_FUSED_ELEMENTWISE) == 2 &&
               fused_reads(g, g->outputs[0].value, x) && fused_reads(g, g->outputs[1].value, x),
           "exp and neg copied into both readers and removed (%d nodes)", g->n_nodes);
    gt_graph_free(g);

    /* a value a fused node reads is never absorbed later: p = x + y, e = exp(p) read by e * z
     * and by neg(e). Both readers copy e (binary p cannot be copied, so they read p); e's own
     * group must then leave p alone, and e, unread, goes */
    g = gt_graph_new();
    x = fg_input(g, "x", GT_F32, 3, 5), y = fg_input(g, "y", GT_F32, 3, 5);
    gt_value_id z = fg_input(g, "z", GT_F32, 3, 5);
    gt_value_id p = gt_add(g, x, y), e = gt_unary(g, GT_OP_EXP, p);
    gt_graph_add_output(g, GT_OUT_METRIC, "a", gt_mul(g, e, z));
    gt_graph_add_output(g, GT_OUT_METRIC, "b", gt_unary(g, GT_OP_NEG, e));
    fuse_checked("pinned producer", g);
    p = g->n_nodes > 0 ? g->nodes[0].out[0] : GT_NONE;
    /* (the two copies then share p: the sibling merge makes them one node, two outputs) */
    EXPECT(g->n_nodes == 2 && count_op(g, GT_OP_ADD) == 1 && count_op(g, GT_OP_EXP) == 0 &&
               count_op(g, GT_OP_FUSED_ELEMENTWISE) == 1 &&
               fused_reads(g, g->outputs[0].value, p) && fused_reads(g, g->outputs[1].value, p),
           "add stays, read by both fused copies of exp (%d nodes)", g->n_nodes);
    gt_graph_free(g);

    /* casts: a widening cast read by two elementwise ops is copied into both (each reads the
     * narrower input) and goes; a narrowing one is not (a copy would read the wider input) */
    for (int narrow = 0; narrow < 2; narrow++) {
        g = gt_graph_new();
        x = fg_input(g, "x", narrow ? GT_F32 : GT_BF16, 3, 5);
        gt_value_id c = gt_cast(g, x, narrow ? GT_BF16 : GT_F32);
        gt_graph_add_output(g, GT_OUT_METRIC, "n", gt_unary(g, GT_OP_NEG, c));
        gt_graph_add_output(g, GT_OUT_METRIC, "e", gt_unary(g, GT_OP_EXP, c));
        fuse_checked(narrow ? "narrowing cast" : "widening cast", g);
        int fused = count_op(g, GT_OP_FUSED_ELEMENTWISE), casts = count_op(g, GT_OP_CAST);
        /* (the widening copies share x: merged into one node of two outputs) */
        EXPECT(narrow ? g->n_nodes == 3 && casts == 1 && fused == 0
                      : g->n_nodes == 1 && casts == 0 && fused == 1,
               "%s cast read twice: %d casts, %d fused nodes", narrow ? "narrowing" : "widening",
               casts, fused);
        gt_graph_free(g);
    }
}

/* ---------------------------------------------------------------- 3. the shape rule */

/* A fused node over a: bf16[4, 6] and b: bf16[b_rows, 6] with this program must be refused
 * with a message containing needle. */
static void expect_refused_b(const char *what, const int64_t *prog, int n_prog, const double *f,
                             int nf, const char *needle, int64_t b_rows)
{
    gt_graph *g = gt_graph_new();
    gt_value_id in[2] = {fg_input(g, "a", GT_BF16, 4, 6), fg_input(g, "b", GT_BF16, b_rows, 6)};
    gt_attrs at;
    memset(&at, 0, sizeof at);
    for (int k = 0; k < n_prog; k++)
        at.i[k] = prog[k];
    at.ni = (uint8_t)n_prog;
    for (int k = 0; k < nf; k++)
        at.f[k] = f[k];
    at.nf = (uint8_t)nf;
    gt_value_id v = gt_graph_add_node(g, GT_OP_FUSED_ELEMENTWISE, in, 2, &at, NULL);
    EXPECT(v == GT_NONE && g->err.code != GT_OK && strstr(g->err.msg, needle),
           "%s refused (%s): %s", what, needle, g->err.msg);
    gt_graph_free(g);
}

/* b: bf16[3, 6], which does not broadcast with a. */
static void expect_refused(const char *what, const int64_t *prog, int n_prog, const double *f,
                           int nf, const char *needle)
{
    expect_refused_b(what, prog, n_prog, f, nf, needle, 3);
}

static bool type_is(const gt_graph *g, const gt_type *t, gt_dtype dt, int64_t d0, int64_t d1)
{
    int64_t c0 = -1, c1 = -1;
    return t && t->dtype == dt && t->ndim == 2 && gt_sym_is_const(g->sym, t->dims[0], &c0) &&
           gt_sym_is_const(g->sym, t->dims[1], &c1) && c0 == d0 && c1 == d1;
}

/* The SwiGLU backward of h = silu(h1) * h3 on inputs (h1, h3, dy) as one node of three outputs:
 *   r0 = silu(h1); r1 = r0 * h3 (the recomputed h, OUT); r2 = dy * r0 (dh3, OUT);
 *   r3 = dy * h3; r4 = silu_backward(h1, r3) (dh1, the last: an output unflagged). */
static int swiglu_triple(gt_dtype dt, int64_t *prog)
{
    const int T = GT_FUSED_TEMP;
    prog[0] = gt_fused_encode(GT_OP_SILU, dt, 0, 0, 0);
    prog[1] = gt_fused_encode_out(GT_OP_MUL, dt, T + 0, 1, 0, true);
    prog[2] = gt_fused_with_out(gt_fused_encode(GT_OP_MUL, dt, 2, T + 0, 0));
    prog[3] = gt_fused_encode_out(GT_OP_MUL, dt, 2, 1, 0, false);
    prog[4] = gt_fused_encode(GT_OP_SILU_BACKWARD, dt, 0, T + 3, 0);
    return 5;
}

/* Several outputs: the encoding helpers, the triple typed (both dtypes), outputs of different
 * dtypes, and the refusals (a flagged register not of the node's shape, bits above the flag). */
static void test_shape_rule_outputs(void)
{
    const int T = GT_FUSED_TEMP;
    int64_t prog[GT_FUSED_MAX_INS];
    int n = swiglu_triple(GT_BF16, prog), reg[GT_FUSED_MAX_INS] = {0};
    uint64_t flag = (uint64_t)1 << 40;
    uint64_t plain1 = (uint64_t)gt_fused_encode(GT_OP_MUL, GT_BF16, T + 0, 1, 0);
    uint64_t plain2 = (uint64_t)gt_fused_encode(GT_OP_MUL, GT_BF16, 2, T + 0, 0);
    EXPECT(GT_FUSED_OUT_BIT == 40 && (uint64_t)prog[1] == (plain1 | flag) &&
               (uint64_t)prog[2] == (plain2 | flag) &&
               prog[3] == gt_fused_encode(GT_OP_MUL, GT_BF16, 2, 1, 0) &&
               !((uint64_t)prog[4] & flag),
           "the OUTPUT flag is bit 40, set by both helpers on the flagged words only");
    gt_fused_ins d1 = gt_fused_decode(prog[1]), d3 = gt_fused_decode(prog[3]);
    EXPECT(d1.out && !d3.out && d1.op == GT_OP_MUL && d1.dtype == GT_BF16 && d1.src[0] == T + 0 &&
               d1.src[1] == 1 && d1.fslot == 0 && !gt_fused_has_extra_bits(prog[1]),
           "decode: the flag, and the other fields untouched by it");
    EXPECT(gt_fused_has_extra_bits((int64_t)((uint64_t)prog[0] | (uint64_t)1 << 41)) &&
               gt_fused_has_extra_bits((int64_t)((uint64_t)prog[1] | (uint64_t)1 << 63)),
           "bits above 40 are extra");
    int no = gt_fused_outputs(prog, n, reg);
    EXPECT(no == 3 && reg[0] == 1 && reg[1] == 2 && reg[2] == 4,
           "outputs of the triple: registers 1, 2, 4 (got %d outputs)", no);
    int last_flagged = gt_fused_outputs(prog, 2, reg);
    EXPECT(last_flagged == 1 && reg[0] == 1, "a flagged last instruction is one output");
    EXPECT(gt_fused_outputs(prog, 1, reg) == 1 && reg[0] == 0 &&
               gt_fused_outputs(prog, 0, reg) == 0,
           "no flags: the last register alone; no instruction: none");

    /* the triple types as three outputs of the inputs' dtype, of the broadcast shape: h1, h3
     * [4, 6], dy [1, 6] */
    static const gt_dtype dts[2] = {GT_BF16, GT_F32};
    for (int t = 0; t < 2; t++) {
        gt_dtype dt = dts[t];
        swiglu_triple(dt, prog);
        gt_graph *g = gt_graph_new();
        gt_value_id in[3] = {fg_input(g, "h1", dt, 4, 6), fg_input(g, "h3", dt, 4, 6),
                             fg_input(g, "dy", dt, 1, 6)};
        gt_attrs at;
        memset(&at, 0, sizeof at);
        memcpy(at.i, prog, (size_t)n * sizeof *prog);
        at.ni = (uint8_t)n;
        gt_value_id outs[GT_MAX_OUT];
        gt_value_id v = gt_graph_add_node(g, GT_OP_FUSED_ELEMENTWISE, in, 3, &at, outs);
        const gt_node *nd = v == GT_NONE ? NULL : &g->nodes[g->n_nodes - 1];
        bool typed = nd && nd->n_out == 3;
        for (int j = 0; typed && j < 3; j++)
            typed = outs[j] == nd->out[j] && type_is(g, gt_value_type(g, outs[j]), dt, 4, 6);
        EXPECT(typed, "%s triple: 3 outputs of %s[4, 6]: %s", gt_dtype_name(dt), gt_dtype_name(dt),
               g->err.msg);
        gt_error err = {0};
        EXPECT_OK(gt_graph_verify(g, &err), &err);
        gt_graph_free(g);
    }

    /* outputs keep their own dtypes: r0 = exp(a) bf16 (OUT), r1 = cast(r0 -> f32), r2 = r1 * 2
     * (f32, OUT), r3 = cast(r2 -> f16) */
    gt_graph *g = gt_graph_new();
    gt_value_id a = fg_input(g, "a", GT_BF16, 4, 6);
    gt_attrs at = {.i = {gt_fused_encode_out(GT_OP_EXP, GT_BF16, 0, 0, 0, true),
                         gt_fused_encode(GT_OP_CAST, GT_F32, T + 0, 0, 0),
                         gt_fused_encode_out(GT_OP_SCALE, GT_F32, T + 1, 0, 0, true),
                         gt_fused_encode(GT_OP_CAST, GT_F16, T + 2, 0, 0)},
                   .f = {2.0},
                   .ni = 4,
                   .nf = 1};
    gt_value_id outs[GT_MAX_OUT];
    gt_value_id v = gt_graph_add_node(g, GT_OP_FUSED_ELEMENTWISE, &a, 1, &at, outs);
    EXPECT(v != GT_NONE && g->nodes[g->n_nodes - 1].n_out == 3 &&
               type_is(g, gt_value_type(g, outs[0]), GT_BF16, 4, 6) &&
               type_is(g, gt_value_type(g, outs[1]), GT_F32, 4, 6) &&
               type_is(g, gt_value_type(g, outs[2]), GT_F16, 4, 6),
           "outputs bf16, f32, f16 in instruction order: %s", g->err.msg);
    gt_graph_free(g);

    /* every instruction flagged: GT_FUSED_MAX_INS outputs, the most a node has (GT_MAX_OUT;
     * more than GT_MAX_OUT outputs cannot be encoded while GT_FUSED_MAX_INS <= GT_MAX_OUT) */
    g = gt_graph_new();
    a = fg_input(g, "a", GT_F32, 2, 3);
    memset(&at, 0, sizeof at);
    at.i[0] = gt_fused_encode_out(GT_OP_NEG, GT_F32, 0, 0, 0, true);
    for (int k = 1; k < GT_FUSED_MAX_INS; k++)
        at.i[k] = gt_fused_encode_out(GT_OP_NEG, GT_F32, T + k - 1, 0, 0, true);
    at.ni = GT_FUSED_MAX_INS;
    v = gt_graph_add_node(g, GT_OP_FUSED_ELEMENTWISE, &a, 1, &at, outs);
    EXPECT(GT_FUSED_MAX_INS <= GT_MAX_OUT && v != GT_NONE &&
               g->nodes[g->n_nodes - 1].n_out == GT_FUSED_MAX_INS,
           "%d flagged instructions: %d outputs", GT_FUSED_MAX_INS, GT_FUSED_MAX_INS);
    gt_graph_free(g);

    /* a flagged register of a smaller shape than the node's: neg(b) is [1, 6], the last
     * register a + neg(b) is [4, 6] */
    int64_t small[2] = {gt_fused_encode_out(GT_OP_NEG, GT_BF16, 1, 0, 0, true),
                        gt_fused_encode(GT_OP_ADD, GT_BF16, 0, T + 0, 0)};
    expect_refused_b("a flagged output of shape [1, 6] in a [4, 6] node", small, 2, NULL, 0,
                     "every output must have the node's output shape", 1);
    /* unflagged, the same register is a plain intermediate: accepted */
    g = gt_graph_new();
    gt_value_id in2[2] = {fg_input(g, "a", GT_BF16, 4, 6), fg_input(g, "b", GT_BF16, 1, 6)};
    memset(&at, 0, sizeof at);
    at.i[0] = gt_fused_encode(GT_OP_NEG, GT_BF16, 1, 0, 0);
    at.i[1] = small[1];
    at.ni = 2;
    v = gt_graph_add_node(g, GT_OP_FUSED_ELEMENTWISE, in2, 2, &at, NULL);
    EXPECT(v != GT_NONE && type_is(g, gt_value_type(g, v), GT_BF16, 4, 6),
           "the same program unflagged is one bf16[4, 6] output: %s", g->err.msg);
    gt_graph_free(g);
    /* bits above the flag */
    int64_t above[1] = {
        (int64_t)((uint64_t)gt_fused_encode(GT_OP_EXP, GT_BF16, 0, 0, 0) | (uint64_t)1 << 41)};
    expect_refused("bit 41 set", above, 1, NULL, 0, "not an elementwise op");
}

static void test_shape_rule(void)
{
    const int T = GT_FUSED_TEMP;
    int64_t fwd[2] = {gt_fused_encode(GT_OP_NEG, GT_BF16, T + 1, 0, 0),
                      gt_fused_encode(GT_OP_EXP, GT_BF16, 0, 0, 0)};
    expect_refused("a forward reference", fwd, 2, NULL, 0, "instruction 0");
    int64_t dt[1] = {gt_fused_encode(GT_OP_EXP, GT_F32, 0, 0, 0)};
    expect_refused("a wrong recorded dtype", dt, 1, NULL, 0, "records result dtype");
    int64_t bc[1] = {gt_fused_encode(GT_OP_ADD, GT_BF16, 0, 1, 0)};
    expect_refused("operands that do not broadcast", bc, 1, NULL, 0, "do not broadcast");
    int64_t sc[1] = {gt_fused_encode(GT_OP_SCALE, GT_BF16, 0, 0, 0)};
    expect_refused("a missing constant", sc, 1, NULL, 0, "constants");
    int64_t mm[1] = {gt_fused_encode(GT_OP_MATMUL, GT_BF16, 0, 1, 0)};
    expect_refused("a non-elementwise op", mm, 1, NULL, 0, "not an elementwise op");
    double bad[2] = {1.0, -1.0};
    int64_t cl[1] = {gt_fused_encode(GT_OP_CLAMP, GT_BF16, 0, 0, 0)};
    expect_refused("clamp with min > max", cl, 1, bad, 2, "min <= max");

    /* a well-formed program: cast(b) to f32, times 2, plus a's cast: [4, 6] f32 */
    gt_graph *g = gt_graph_new();
    gt_value_id in[2] = {fg_input(g, "a", GT_BF16, 4, 6), fg_input(g, "b", GT_BF16, 1, 6)};
    gt_attrs at = {.i = {gt_fused_encode(GT_OP_CAST, GT_F32, 1, 0, 0),
                         gt_fused_encode(GT_OP_SCALE, GT_F32, T + 0, 0, 0),
                         gt_fused_encode(GT_OP_CAST, GT_F32, 0, 0, 0),
                         gt_fused_encode(GT_OP_ADD, GT_F32, T + 1, T + 2, 0)},
                   .f = {2.0},
                   .ni = 4,
                   .nf = 1};
    gt_value_id v = gt_graph_add_node(g, GT_OP_FUSED_ELEMENTWISE, in, 2, &at, NULL);
    const gt_type *t = v == GT_NONE ? NULL : gt_value_type(g, v);
    int64_t d0 = 0, d1 = 0;
    if (t) gt_sym_is_const(g->sym, t->dims[0], &d0), gt_sym_is_const(g->sym, t->dims[1], &d1);
    EXPECT(t && t->dtype == GT_F32 && t->ndim == 2 && d0 == 4 && d1 == 6,
           "cast, scale, cast, add types as f32[4, 6]: %s", g->err.msg);
    gt_error err = {0};
    EXPECT_OK(gt_graph_verify(g, &err), &err);
    gt_graph_free(g);
}

/* ---------------------------------------------------------------- 4. the kernel, naively */

static float bf16_round(float v)
{
    return gt_bf16_to_f32(gt_f32_to_bf16(v));
}

static void test_kernel_naive(void)
{
    /* x: bf16 [2, 3, 5], w: f32 [5], s: bf16 [3, 1]
     * r0 = cast(w -> bf16); r1 = mul(x, r0); r2 = silu(r1); r3 = add_scalar(r2, 0.25)
     * r4 = div(r3, s); r5 = cast(r4 -> f32) */
    const int T = GT_FUSED_TEMP;
    int64_t sx[3] = {2, 3, 5}, sw[1] = {5}, ss[2] = {3, 1};
    gt_tensor x, w, s, out;
    gt_error err = {0};
    EXPECT_OK(gt_tensor_alloc(&x, GT_BF16, 3, sx, &err), &err);
    EXPECT_OK(gt_tensor_alloc(&w, GT_F32, 1, sw, &err), &err);
    EXPECT_OK(gt_tensor_alloc(&s, GT_BF16, 2, ss, &err), &err);
    EXPECT_OK(gt_tensor_alloc(&out, GT_F32, 3, sx, &err), &err);
    uint64_t r = 12345;
    for (int64_t i = 0; i < 30; i++)
        gt_tensor_set_f32(&x, i, (float)(4.0 * rng_unit(&r) - 2.0));
    for (int64_t i = 0; i < 5; i++)
        gt_tensor_set_f32(&w, i, (float)(rng_unit(&r) - 0.5) / 3.0f);
    for (int64_t i = 0; i < 3; i++)
        gt_tensor_set_f32(&s, i, (float)(0.5 + rng_unit(&r)));
    int64_t prog[6] = {gt_fused_encode(GT_OP_CAST, GT_BF16, 1, 0, 0),
                       gt_fused_encode(GT_OP_MUL, GT_BF16, 0, T + 0, 0),
                       gt_fused_encode(GT_OP_SILU, GT_BF16, T + 1, 0, 0),
                       gt_fused_encode(GT_OP_ADD_SCALAR, GT_BF16, T + 2, 0, 0),
                       gt_fused_encode(GT_OP_DIV, GT_BF16, T + 3, 2, 0),
                       gt_fused_encode(GT_OP_CAST, GT_F32, T + 4, 0, 0)};
    double f[1] = {0.25};
    gt_kernel_call call = {.op = GT_OP_FUSED_ELEMENTWISE,
                           .i = prog,
                           .ni = 6,
                           .f = f,
                           .nf = 1,
                           .n_in = 3,
                           .n_out = 1,
                           .in = {&x, &w, &s},
                           .out = {&out}};
    EXPECT_OK(gt_cpu_run_kernel(&call, &err), &err);
    int bad = 0;
    for (int64_t i = 0; i < 30; i++) {
        int64_t j = i % 5, row = (i / 5) % 3;
        float xv = gt_tensor_get_f32(&x, i), wv = bf16_round(gt_tensor_get_f32(&w, j));
        float m = bf16_round(xv * wv);
        float si = bf16_round(m * (1.0f / (1.0f + expf(-m))));
        float a = bf16_round(si + 0.25f);
        float want = bf16_round(a / gt_tensor_get_f32(&s, row));
        float got = gt_tensor_get_f32(&out, i);
        if (memcmp(&want, &got, sizeof got) != 0 && bad++ < 3)
            fprintf(stderr, "element %lld: got %.9g want %.9g\n", (long long)i, got, want);
    }
    EXPECT(bad == 0, "fused kernel vs naive per-element evaluation: %d of 30 differ", bad);
    /* a malformed program is refused by the kernel as well */
    int64_t badprog[1] = {gt_fused_encode(GT_OP_NEG, GT_F32, T + 3, 0, 0)};
    call.i = badprog;
    call.ni = 1;
    EXPECT(gt_cpu_run_kernel(&call, &err) == GT_ERR_INVALID && strstr(err.msg, "instruction 0"),
           "kernel refuses a forward reference: %s", err.msg);
    gt_tensor_free(&x);
    gt_tensor_free(&w);
    gt_tensor_free(&s);
    gt_tensor_free(&out);
}

static float round_to(gt_dtype dt, float v)
{
    return dt == GT_BF16 ? bf16_round(v) : v;
}

/* The CPU kernels' sigmoid: their exp is gt_cpu_expf (test_cpu_exp checks it against exp). */
static float naive_sigmoid(float x)
{
    return 1.0f / (1.0f + gt_cpu_expf(-x));
}

/* The SwiGLU backward triple (swiglu_triple) with three outputs on h1, h3: [3, 7, 67] and dy:
 * [7, 67] (1407 elements: two chunks of the kernel), in bf16 and f32, against the unfused math
 * per element: s = R(h1 sigmoid(h1)), h = R(s h3), dh3 = R(dy s), t = R(dy h3),
 * dh1 = R(t sigmoid(h1) (1 + h1 (1 - sigmoid(h1)))), R the rounding to the dtype. Then a call
 * with the wrong number of outputs and one with an output of another shape are refused. */
static void test_kernel_outputs(void)
{
    static const gt_dtype dts[2] = {GT_BF16, GT_F32};
    int64_t sh[3] = {3, 7, 67}, sd[2] = {7, 67}, sbad[2] = {7, 67};
    const int64_t n = 3 * 7 * 67, nd = 7 * 67;
    for (int t = 0; t < 2; t++) {
        gt_dtype dt = dts[t];
        gt_error err = {0};
        gt_tensor h1, h3, dy, o[3], bad_out;
        EXPECT_OK(gt_tensor_alloc(&h1, dt, 3, sh, &err), &err);
        EXPECT_OK(gt_tensor_alloc(&h3, dt, 3, sh, &err), &err);
        EXPECT_OK(gt_tensor_alloc(&dy, dt, 2, sd, &err), &err);
        for (int j = 0; j < 3; j++)
            EXPECT_OK(gt_tensor_alloc(&o[j], dt, 3, sh, &err), &err);
        EXPECT_OK(gt_tensor_alloc(&bad_out, dt, 2, sbad, &err), &err);
        uint64_t r = 777 + (uint64_t)t;
        for (int64_t i = 0; i < n; i++) {
            gt_tensor_set_f32(&h1, i, (float)(8.0 * rng_unit(&r) - 4.0));
            gt_tensor_set_f32(&h3, i, (float)(4.0 * rng_unit(&r) - 2.0));
        }
        for (int64_t i = 0; i < nd; i++)
            gt_tensor_set_f32(&dy, i, (float)(2.0 * rng_unit(&r) - 1.0));
        int64_t prog[GT_FUSED_MAX_INS];
        int ni = swiglu_triple(dt, prog);
        gt_kernel_call call = {.op = GT_OP_FUSED_ELEMENTWISE,
                               .i = prog,
                               .ni = ni,
                               .n_in = 3,
                               .n_out = 3,
                               .in = {&h1, &h3, &dy},
                               .out = {&o[0], &o[1], &o[2]}};
        EXPECT_OK(gt_cpu_run_kernel(&call, &err), &err);
        int bad = 0;
        for (int64_t i = 0; i < n; i++) {
            float x = gt_tensor_get_f32(&h1, i), y = gt_tensor_get_f32(&h3, i);
            float d = gt_tensor_get_f32(&dy, i % nd), sx = naive_sigmoid(x);
            float s = round_to(dt, x * sx);
            float tt = round_to(dt, d * y);
            float want[3] = {round_to(dt, s * y), round_to(dt, d * s),
                             round_to(dt, tt * sx * (1.0f + x * (1.0f - sx)))};
            for (int j = 0; j < 3; j++) {
                float got = gt_tensor_get_f32(&o[j], i);
                if (memcmp(&want[j], &got, sizeof got) != 0 && bad++ < 3)
                    fprintf(stderr, "%s output %d element %lld: got %.9g want %.9g\n",
                            gt_dtype_name(dt), j, (long long)i, got, want[j]);
            }
        }
        EXPECT(bad == 0, "%s three-output kernel vs naive evaluation: %d of %lld differ",
               gt_dtype_name(dt), bad, (long long)(3 * n));

        call.n_out = 1;
        EXPECT(gt_cpu_run_kernel(&call, &err) == GT_ERR_INVALID &&
                   strstr(err.msg, "fused_elementwise") && strstr(err.msg, "1 outputs") &&
                   strstr(err.msg, "has 3"),
               "one output for a program of three is refused: %s", err.msg);
        call.n_out = 3;
        call.out[1] = &bad_out;
        EXPECT(gt_cpu_run_kernel(&call, &err) == GT_ERR_SHAPE && strstr(err.msg, "output 1"),
               "an output of another shape is refused: %s", err.msg);
        gt_tensor_free(&h1);
        gt_tensor_free(&h3);
        gt_tensor_free(&dy);
        for (int j = 0; j < 3; j++)
            gt_tensor_free(&o[j]);
        gt_tensor_free(&bad_out);
    }
}

/* A graph with a three-output fused node built by hand (the triple on h1, h3: [6, 40] and
 * dy: [1, 40]; its second output also read by a later exp) against the same computation
 * unfused: the fused graph verifies, runs in the eager executor and as a compiled CPU program,
 * and every output equals the unfused graph's (eager), bitwise; the printer lists the three
 * outputs and their types. */
static void test_multi_output_graph(void)
{
    static const gt_dtype dts[2] = {GT_BF16, GT_F32};
    for (int t = 0; t < 2; t++) {
        gt_dtype dt = dts[t];
        const char *dn = gt_dtype_name(dt);
        gt_error err = {0};
        gt_graph *ref = gt_graph_new();
        gt_value_id h1 = fg_input(ref, "h1", dt, 6, 40), h3 = fg_input(ref, "h3", dt, 6, 40);
        gt_value_id dy = fg_input(ref, "dy", dt, 1, 40);
        gt_value_id s = gt_unary(ref, GT_OP_SILU, h1);
        gt_value_id dh3 = gt_mul(ref, dy, s);
        gt_graph_add_output(ref, GT_OUT_METRIC, "h", gt_mul(ref, s, h3));
        gt_graph_add_output(ref, GT_OUT_METRIC, "dh3", dh3);
        gt_graph_add_output(ref, GT_OUT_METRIC, "dh1",
                            gt_silu_backward(ref, h1, gt_mul(ref, dy, h3)));
        gt_graph_add_output(ref, GT_OUT_METRIC, "e", gt_unary(ref, GT_OP_EXP, dh3));
        EXPECT(ref->err.code == GT_OK, "%s unfused graph built: %s", dn, ref->err.msg);

        gt_graph *g = gt_graph_new();
        gt_value_id in[3] = {fg_input(g, "h1", dt, 6, 40), fg_input(g, "h3", dt, 6, 40),
                             fg_input(g, "dy", dt, 1, 40)};
        gt_attrs at;
        memset(&at, 0, sizeof at);
        at.ni = (uint8_t)swiglu_triple(dt, at.i);
        gt_value_id outs[GT_MAX_OUT];
        for (int j = 0; j < GT_MAX_OUT; j++)
            outs[j] = GT_NONE;
        gt_graph_add_node(g, GT_OP_FUSED_ELEMENTWISE, in, 3, &at, outs);
        gt_graph_add_output(g, GT_OUT_METRIC, "h", outs[0]);
        gt_graph_add_output(g, GT_OUT_METRIC, "dh3", outs[1]);
        gt_graph_add_output(g, GT_OUT_METRIC, "dh1", outs[2]);
        gt_graph_add_output(g, GT_OUT_METRIC, "e", gt_unary(g, GT_OP_EXP, outs[1]));
        EXPECT(g->err.code == GT_OK && g->n_nodes == 2 && g->nodes[0].n_out == 3 &&
                   outs[2] != GT_NONE && outs[3] == GT_NONE,
               "%s fused graph built: one node of 3 outputs: %s", dn, g->err.msg);
        if (ref->err.code != GT_OK || g->err.code != GT_OK) {
            gt_graph_free(ref);
            gt_graph_free(g);
            continue;
        }
        EXPECT_OK(gt_graph_verify(ref, &err), &err);
        EXPECT_OK(gt_graph_verify(g, &err), &err);

        uint64_t seed = 0x5bd1e995ull + (uint64_t)t;
        gt_tensor *inputs = rg_inputs(ref, &seed);
        int32_t no = ref->n_outputs;
        gt_tensor *want = calloc((size_t)no, sizeof *want);
        gt_tensor *eager = calloc((size_t)no, sizeof *eager);
        gt_tensor *compiled = calloc((size_t)no, sizeof *compiled);
        EXPECT_OK(gt_eager_run(ref, NULL, inputs, want, &err), &err);
        EXPECT_OK(gt_eager_run(g, NULL, inputs, eager, &err), &err);
        gt_program *prog = NULL;
        EXPECT_OK(gt_program_build(g, NULL, &prog, &err), &err);
        if (prog) EXPECT_OK(gt_program_run(prog, inputs, compiled, &err), &err);
        int bad_eager = 0, bad_prog = 0;
        for (int32_t k = 0; k < no && err.code == GT_OK; k++) {
            bad_eager += !same_bits(&want[k], &eager[k]);
            bad_prog += !same_bits(&want[k], &compiled[k]);
        }
        EXPECT(err.code == GT_OK && bad_eager == 0 && bad_prog == 0,
               "%s: of %d outputs, %d differ in the eager executor and %d in the program, "
               "fused vs unfused",
               dn, no, bad_eager, bad_prog);

        char *buf = graph_text(g);
        char head[96], ty[48], types[200];
        snprintf(head, sizeof head, "%%%d, %%%d, %%%d : ", outs[0], outs[1], outs[2]);
        snprintf(ty, sizeof ty, "%s[6, 40]", dn);
        snprintf(types, sizeof types, "%s, %s, %s = fused_elementwise(", ty, ty, ty);
        const char *line = buf ? strstr(buf, head) : NULL;
        EXPECT(line && strstr(line, types) == line + strlen(head),
               "the printer lists the three outputs and their types (%s%s):\n%s", head, types,
               buf ? buf : "");
        free(buf);
        gt_program_free(prog);
        free_array(inputs, ref->n_inputs);
        free_array(want, no);
        free_array(eager, no);
        free_array(compiled, no);
        gt_graph_free(ref);
        gt_graph_free(g);
    }
}

/* ---------------------------------------------------------------- 5. llama3 step graphs */

#define STEPS 3

static void check_step(const char *flavor, gt_dtype compute)
{
    step_graph s;
    if (!step_graph_build_in(&s, flavor, &compute, 2, 16)) return;
    gt_error err = {0};
    gt_graph *off = gt_graph_copy(s.g), *on = gt_graph_copy(s.g);
    compile_step(off, false);
    compile_step(on, true);
    int fused = count_op(on, GT_OP_FUSED_ELEMENTWISE);
    printf("%s %s: nodes %d unfused -> %d fused (%d fused_elementwise nodes)\n", flavor,
           gt_dtype_name(compute), off->n_nodes, on->n_nodes, fused);
    EXPECT(on->n_nodes < off->n_nodes && fused > 0, "%s %s: fusion removed nodes (%d -> %d)",
           flavor, gt_dtype_name(compute), off->n_nodes, on->n_nodes);
    EXPECT(on->n_inputs == off->n_inputs && on->n_outputs == off->n_outputs, "io kept");
    /* every forward rms_norm but the first block's attention_norm (it reads the embedding) reads
     * a residual add: each pair is one add_rms_norm */
    int norms = 0;
    for (gt_node_id n = 0; n < off->n_nodes; n++)
        norms += off->nodes[n].op == GT_OP_RMS_NORM && off->nodes[n].phase == GT_PHASE_FORWARD;
    int pairs = count_op(on, GT_OP_ADD_RMS_NORM);
    EXPECT(norms > 1 && pairs == norms - 1 && count_op(off, GT_OP_ADD_RMS_NORM) == 0,
           "%s %s: %d add_rms_norm nodes for %d forward norms", flavor, gt_dtype_name(compute),
           pairs, norms);
    /* every rms_norm_backward but the final norm's (its dx meets the last block's in an add that
     * the later norm takes) absorbs its residual add: one rms_norm_backward_add each */
    int bnorms = count_op(off, GT_OP_RMS_NORM_BACKWARD);
    int bfused = count_op(on, GT_OP_RMS_NORM_BACKWARD_ADD);
    EXPECT(bnorms > 1 && bfused == bnorms - 1 && count_op(on, GT_OP_RMS_NORM_BACKWARD) == 1,
           "%s %s: %d rms_norm_backward_add nodes for %d norm backwards", flavor,
           gt_dtype_name(compute), bfused, bnorms);
    /* the loss and its backward read the logits once, as one cross_entropy_with_grad */
    EXPECT(count_op(on, GT_OP_CROSS_ENTROPY_WITH_GRAD) == 1 &&
               count_op(on, GT_OP_CROSS_ENTROPY) + count_op(on, GT_OP_CROSS_ENTROPY_BACKWARD) ==
                   0 &&
               count_op(off, GT_OP_CROSS_ENTROPY) == 1,
           "%s %s: the loss and its backward are one node", flavor, gt_dtype_name(compute));
    /* the widening casts of the gradients are absorbed: AdamW and the norm read them as computed
     * (bf16 in mixed precision), without fusion they read an f32 copy */
    int adamw = 0, narrow_on = 0, narrow_off = 0;
    for (int32_t k = 0; k < on->n_nodes; k++)
        if (on->nodes[k].op == GT_OP_ADAMW) {
            adamw++;
            narrow_on += gt_value_type(on, on->nodes[k].in[1])->dtype == compute;
        }
    for (int32_t k = 0; k < off->n_nodes; k++)
        if (off->nodes[k].op == GT_OP_ADAMW)
            narrow_off += gt_value_type(off, off->nodes[k].in[1])->dtype == compute;
    EXPECT(adamw > 0 && narrow_on == adamw && (compute == GT_F32 || narrow_off == 0),
           "%s %s: %d adamw nodes, %d read a %s gradient with fusion (%d without)", flavor,
           gt_dtype_name(compute), adamw, narrow_on, gt_dtype_name(compute), narrow_off);
    gt_program *p_off = NULL, *p_on = NULL;
    EXPECT_OK(gt_program_build(off, &s.binding, &p_off, &err), &err);
    EXPECT_OK(gt_program_build(on, &s.binding, &p_on, &err), &err);
    step_run a, b;
    bool ok = step_run_init(&a, &s);
    ok = step_run_init(&b, &s) && ok && p_off && p_on;
    for (int64_t step = 1; ok && step <= STEPS; step++) {
        step_set_scalars(&s, off, a.state, step);
        step_set_scalars(&s, on, b.state, step);
        EXPECT_OK(gt_program_run(p_off, a.state, a.out, &err), &err);
        EXPECT_OK(gt_program_run(p_on, b.state, b.out, &err), &err);
        if (err.code) break;
        int bad = step_count_diffs(flavor, gt_dtype_name(compute), step, off, a.out, b.out);
        EXPECT(bad == 0, "%s %s step %lld: %d of %d outputs differ with fusion", flavor,
               gt_dtype_name(compute), (long long)step, bad, off->n_outputs);
        if (step == STEPS)
            printf("  step %d loss %.9g (fusion on and off)\n", STEPS, step_loss(on, b.out));
        step_run_next(&a, off);
        step_run_next(&b, on);
    }
    step_run_free(&a);
    step_run_free(&b);
    gt_program_free(p_off);
    gt_program_free(p_on);
    gt_graph_free(off);
    gt_graph_free(on);
    step_graph_free(&s);
}

/* The printer shows a program as its instructions (operands xK = input K, tJ = instruction J's
 * result, cK = constant K; dtype; "out" for a flagged output), and a word that is not an
 * instruction as its integer. */
static void test_printer(void)
{
    const int T = GT_FUSED_TEMP;
    gt_graph *g = gt_graph_new();
    gt_value_id a = fg_input(g, "a", GT_BF16, 4, 6), b = fg_input(g, "b", GT_BF16, 4, 6);
    gt_value_id in[2] = {a, b};
    gt_attrs at = {.i = {gt_fused_encode_out(GT_OP_EXP, GT_BF16, 0, 0, 0, true),
                         gt_fused_encode(GT_OP_MUL, GT_BF16, 1, T + 0, 0),
                         gt_fused_encode(GT_OP_CAST, GT_F32, T + 1, 0, 0),
                         gt_fused_encode(GT_OP_CLAMP, GT_F32, T + 2, 0, 1)},
                   .f = {9.0, -1.5, 2.0},
                   .ni = 4,
                   .nf = 3};
    gt_value_id outs[GT_MAX_OUT];
    gt_value_id v = gt_graph_add_node(g, GT_OP_FUSED_ELEMENTWISE, in, 2, &at, outs);
    EXPECT(v != GT_NONE, "printer graph: %s", g->err.msg);
    if (v != GT_NONE) {
        char text[1024];
        gt_node_id n = g->n_nodes - 1;
        gt_graph_format_node(g, n, text, sizeof text);
        const char *want = "prog=[t0 = exp(x0) bf16 out, t1 = mul(x1, t0) bf16, t2 = cast(t1) f32, "
                           "t3 = clamp(t2, c1, c2) f32], consts=[9, -1.5, 2]";
        EXPECT(strstr(text, want) != NULL, "fused node prints its program:\n  %s\nwanted\n  %s",
               text, want);
        g->nodes[n].attrs.i[2] = (int64_t)1 << 50 | 7; /* bits above the OUTPUT flag */
        gt_graph_format_node(g, n, text, sizeof text);
        char raw[64];
        snprintf(raw, sizeof raw, "t1 = mul(x1, t0) bf16, %lld, t3",
                 (long long)((int64_t)1 << 50 | 7));
        EXPECT(strstr(text, raw) != NULL, "a malformed word prints as its integer: %s", text);
    }
    gt_graph_free(g);
}

int main(void)
{
    gt_cpu_set_threads(1);
    gt_log_set_level(GT_LOG_WARN);
    test_random_graphs();
    test_swiglu();
    test_boundaries();
    test_duplication();
    test_shape_rule();
    test_shape_rule_outputs();
    test_kernel_naive();
    test_kernel_outputs();
    test_multi_output_graph();
    test_printer();
    check_step("test_tiny", GT_BF16);
    check_step("test_tiny", GT_F32);
    check_step("debugmodel", GT_BF16);
    check_step("debugmodel", GT_F32);
    return gt_test_finish();
}
