/* test_fusion_norm_loss.c — the fusion pass's steps for the RMSNorm backward
 * (src/passes/fusion_norm_backward.c: rms_norm_backward, the add chain that sums its dy and the
 * residual add of its dx become one rms_norm_backward_add node) and for the loss
 * (src/passes/fusion_loss.c: cross_entropy and its backward become one cross_entropy_with_grad
 * node); every output keeps its bits.
 *
 *   1. Chains, bf16 and f32, the residual on either side of its add: dy alone, d0 + d1,
 *      (d0 + d1) + d2 and d2 + (d0 + d1) (the inner add on the other side) become one node with
 *      the terms in evaluation order; a four-term chain keeps its innermost add (3 terms at
 *      most). Each fused graph runs in the eager executor on the same inputs as the unfused one:
 *      memcmp-equal outputs.
 *   2. Boundaries: the norm's dx read twice or a graph output, a residual operand produced after
 *      the norm, one that broadcasts, and a phase change leave the norm unfused; a dy add read
 *      elsewhere stays a node of its own (dy is one term).
 *   3. The loss: cross_entropy + cross_entropy_backward of the same logits and targets become one
 *      node whose outputs are the loss and dlogits, bitwise, also with a reader of the loss
 *      between the two (it moves after the fused node: the graph verifies) or a collective
 *      between them; a dloss computed from the loss, other targets or another ignore_index keep
 *      them apart.
 *   4. debugmodel's training step graph (bf16 mixed precision, the trainer's pipeline) sharded by
 *      FSDP over 2 and 4 ranks and by HSDP 2 x 2 has the fused nodes of the one-rank graph: as
 *      many add_rms_norm, rms_norm_backward_add, cross_entropy_with_grad and fused_elementwise
 *      nodes, and of fused outputs (FSDP's all-gather waits sit between the nodes these fuse).
 *      (Tensor parallelism changes what there is to fuse: its reduce-scatter sits between a
 *      residual add and the norm reading the sum.) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusion_graphs.h"
#include "graphtrain/gt_backend.h"
#include "graphtrain/gt_build.h"
#include "gt_test.h"
#include "train_graph.h"

enum { D = 40, ROWS = 6 };

static gt_value_id weight(gt_graph *g, gt_dtype dt)
{
    gt_expr dims[1] = {fg_const(g, D)};
    return gt_graph_add_input(g, GT_IN_INPUT, "w", dt, 1, dims);
}

static const gt_node *find_op(const gt_graph *g, gt_op op)
{
    for (int32_t k = 0; k < g->n_nodes; k++)
        if (g->nodes[k].op == op) return &g->nodes[k];
    return NULL;
}

/* The index of graph input value v of g. */
static int32_t input_index(const gt_graph *g, gt_value_id v)
{
    for (int32_t k = 0; k < g->n_inputs; k++)
        if (g->inputs[k].value == v) return k;
    return 0;
}

/* The input slots 3.. of the fused node read exactly `want` (n values), in order. */
static bool terms_are(const gt_node *f, const gt_value_id *want, int n)
{
    if (!f || f->n_in != 3 + n) return false;
    for (int k = 0; k < n; k++)
        if (f->in[3 + k] != want[k]) return false;
    return true;
}

static void test_chains(void)
{
    static const gt_dtype dts[2] = {GT_BF16, GT_F32};
    for (int t = 0; t < 2; t++)
        for (int shape = 0; shape < 5; shape++)
            for (int side = 0; side < 2; side++) {
                gt_dtype dt = dts[t];
                char what[96];
                snprintf(what, sizeof what, "%s chain %d, residual %s", gt_dtype_name(dt), shape,
                         side ? "second" : "first");
                gt_graph *g = gt_graph_new();
                gt_value_id x = fg_input(g, "x", dt, ROWS, D), w = weight(g, dt);
                gt_value_id r = fg_input(g, "r", dt, ROWS, D), d[4];
                for (int k = 0; k < 4; k++) {
                    char nm[8];
                    snprintf(nm, sizeof nm, "d%d", k);
                    d[k] = fg_input(g, nm, dt, ROWS, D);
                }
                gt_value_id dy = d[0], inner = GT_NONE;
                int n_terms = 1, adds_left = 0;
                gt_value_id want[3] = {d[0], d[1], d[2]};
                if (shape == 1) {
                    dy = gt_add(g, d[0], d[1]);
                    n_terms = 2;
                } else if (shape == 2) {
                    dy = gt_add(g, gt_add(g, d[0], d[1]), d[2]);
                    n_terms = 3;
                } else if (shape == 3) {
                    dy = gt_add(g, d[2], gt_add(g, d[0], d[1]));
                    n_terms = 3;
                } else if (shape == 4) {
                    inner = gt_add(g, d[0], d[1]);
                    dy = gt_add(g, gt_add(g, inner, d[2]), d[3]);
                    want[0] = inner;
                    want[1] = d[2];
                    want[2] = d[3];
                    n_terms = 3;
                    adds_left = 1;
                }
                gt_value_id dw;
                gt_value_id gx = gt_rms_norm_backward(g, x, w, dy, 1e-5, &dw);
                gt_value_id dx = side ? gt_add(g, gx, r) : gt_add(g, r, gx);
                gt_graph_add_output(g, GT_OUT_METRIC, "dx", dx);
                gt_graph_add_output(g, GT_OUT_METRIC, "dw", dw);
                gt_graph *fus = fg_fuse_and_compare(g, what);
                /* ids are compacted: name values by graph input / output index, and the add
                 * left (shape 4) by its node */
                const gt_node *f = find_op(fus, GT_OP_RMS_NORM_BACKWARD_ADD);
                const gt_node *left = find_op(fus, GT_OP_ADD);
                for (int k = 0; k < 3; k++)
                    want[k] = want[k] == inner ? (left ? left->out[0] : GT_NONE)
                                               : fus->inputs[input_index(g, want[k])].value;
                EXPECT(f && f->in[0] == fus->inputs[0].value && f->in[1] == fus->inputs[1].value &&
                           f->in[2] == fus->inputs[2].value && terms_are(f, want, n_terms) &&
                           f->out[0] == fus->outputs[0].value && f->out[1] == fus->outputs[1].value,
                       "%s: one rms_norm_backward_add (x, w, r, %d terms in order) -> (dx, dw)",
                       what, n_terms);
                EXPECT(count_op(fus, GT_OP_RMS_NORM_BACKWARD) == 0 &&
                           count_op(fus, GT_OP_ADD) == adds_left && fus->n_nodes == 1 + adds_left,
                       "%s: %d nodes left, %d adds (want %d)", what, fus->n_nodes,
                       count_op(fus, GT_OP_ADD), adds_left);
                gt_graph_free(fus);
                gt_graph_free(g);
            }
}

/* One norm backward whose dy is d0 + d1 and whose dx goes through a residual add; `variant`
 * breaks one condition of the rule. Returns the fused graph's count of rms_norm_backward_add. */
static int boundary(int variant, int *n_in, int *adds)
{
    const char *names[] = {
        "plain",        "dx read twice", "dx a graph output",    "r produced later",
        "r broadcasts", "phase change",  "dy add read elsewhere"};
    gt_dtype dt = GT_BF16;
    gt_graph *g = gt_graph_new();
    gt_value_id x = fg_input(g, "x", dt, ROWS, D), w = weight(g, dt);
    gt_value_id r = variant == 4 ? fg_input(g, "r", dt, 1, D) : fg_input(g, "r", dt, ROWS, D);
    gt_value_id d0 = fg_input(g, "d0", dt, ROWS, D), d1 = fg_input(g, "d1", dt, ROWS, D);
    gt_value_id dy = gt_add(g, d0, d1);
    if (variant == 6) gt_graph_add_output(g, GT_OUT_METRIC, "dy", gt_unary(g, GT_OP_EXP, dy));
    gt_value_id dw;
    gt_value_id gx = gt_rms_norm_backward(g, x, w, dy, 1e-5, &dw);
    if (variant == 3) r = gt_unary(g, GT_OP_NEG, r);
    if (variant == 5) g->cur_phase = GT_PHASE_OPTIMIZER;
    gt_value_id dx = gt_add(g, r, gx);
    if (variant == 1) gt_graph_add_output(g, GT_OUT_METRIC, "e", gt_unary(g, GT_OP_EXP, gx));
    if (variant == 2) gt_graph_add_output(g, GT_OUT_METRIC, "g", gx);
    gt_graph_add_output(g, GT_OUT_METRIC, "dx", dx);
    gt_graph_add_output(g, GT_OUT_METRIC, "dw", dw);
    gt_graph *fus = fg_fuse_and_compare(g, names[variant]);
    const gt_node *f = find_op(fus, GT_OP_RMS_NORM_BACKWARD_ADD);
    int fused = count_op(fus, GT_OP_RMS_NORM_BACKWARD_ADD);
    *n_in = f ? f->n_in : 0;
    *adds = count_op(fus, GT_OP_ADD);
    gt_graph_free(fus);
    gt_graph_free(g);
    return fused;
}

static void test_boundaries(void)
{
    int n_in, adds;
    EXPECT(boundary(0, &n_in, &adds) == 1 && n_in == 5 && adds == 0,
           "plain: fused with both terms (%d inputs, %d adds left)", n_in, adds);
    for (int v = 1; v <= 5; v++)
        EXPECT(boundary(v, &n_in, &adds) == 0, "variant %d: the norm stays unfused", v);
    EXPECT(boundary(6, &n_in, &adds) == 1 && n_in == 4 && adds == 1,
           "dy add read elsewhere: fused with dy as one term (%d inputs, %d adds left)", n_in,
           adds);
}

/* logits [ROWS, D] and targets [ROWS] (i32); the loss (a graph output) and dlogits of the loss
 * scaled by dloss. variant 1: a node reading the loss sits between the two ops; 2: the backward
 * reads other targets; 3: another ignore_index. Returns the fused graph's count of
 * cross_entropy_with_grad (and checks it bitwise against the unfused graph). */
static int loss_case(int variant, gt_dtype dt)
{
    const char *names[] = {"loss",
                           "loss read before its backward",
                           "other targets",
                           "other ignore_index",
                           "dloss computed from the loss",
                           "a collective between the two"};
    gt_graph *g = gt_graph_new();
    /* rg_inputs fills inputs 2, 5, ... from [0.1, 3): the targets go there (ids 0 .. 2) */
    gt_value_id logits = fg_input(g, "logits", dt, ROWS, D);
    gt_value_id dl = gt_graph_add_input(g, GT_IN_INPUT, "dloss", GT_F32, 0, NULL);
    gt_expr rows[1] = {fg_const(g, ROWS)};
    gt_value_id t = gt_graph_add_input(g, GT_IN_INPUT, "targets", GT_I32, 1, rows);
    fg_input(g, "unused3", dt, 1, 1);
    fg_input(g, "unused4", dt, 1, 1);
    gt_value_id t2 = gt_graph_add_input(g, GT_IN_INPUT, "targets2", GT_I32, 1, rows);
    gt_value_id loss = gt_cross_entropy(g, logits, t, -100);
    if (variant == 1) gt_graph_add_output(g, GT_OUT_METRIC, "e", gt_unary(g, GT_OP_EXP, loss));
    if (variant == 4) dl = gt_add(g, dl, gt_unary(g, GT_OP_EXP, loss));
    if (variant == 5) {
        gt_attrs ca = {.i = {0, 1}, .ni = 2}; /* a group of one: the eager run copies */
        gt_value_id st = gt_graph_add_node(g, GT_OP_ALL_REDUCE_START, &dl, 1, &ca, NULL);
        gt_value_id wi[2] = {st, dl};
        dl = gt_graph_add_node(g, GT_OP_WAIT, wi, 2, NULL, NULL);
    }
    gt_value_id dx =
        gt_cross_entropy_backward(g, logits, variant == 2 ? t2 : t, dl, variant == 3 ? -1 : -100);
    gt_graph_add_output(g, GT_OUT_METRIC, "loss", loss);
    gt_graph_add_output(g, GT_OUT_METRIC, "dlogits", dx);
    char what[96];
    snprintf(what, sizeof what, "%s %s", gt_dtype_name(dt), names[variant]);
    gt_graph *fus = fg_fuse_and_compare(g, what);
    int fused = count_op(fus, GT_OP_CROSS_ENTROPY_WITH_GRAD);
    const gt_node *f = find_op(fus, GT_OP_CROSS_ENTROPY_WITH_GRAD);
    int32_t no = fus->n_outputs;
    gt_error err = {0};
    EXPECT_OK(gt_graph_verify(fus, &err), &err); /* topological: the loss's readers follow it */
    EXPECT(!f || (f->out[0] == fus->outputs[no - 2].value &&
                  f->out[1] == fus->outputs[no - 1].value &&
                  count_op(fus, GT_OP_CROSS_ENTROPY) == 0 &&
                  count_op(fus, GT_OP_CROSS_ENTROPY_BACKWARD) == 0),
           "%s: the fused node gives the loss and dlogits, and neither op is left", what);
    gt_graph_free(fus);
    gt_graph_free(g);
    return fused;
}

static void test_loss(void)
{
    static const gt_dtype dts[2] = {GT_BF16, GT_F32};
    for (int k = 0; k < 2; k++) {
        for (int v = 0; v <= 5; v++) {
            int want = v == 0 || v == 1 || v == 5; /* a reader or a collective in between: fused */
            EXPECT(loss_case(v, dts[k]) == want, "%s variant %d: the pair is %s",
                   gt_dtype_name(dts[k]), v, want ? "fused" : "kept apart");
        }
    }
}

/* ---------------------------------------------------------------- 4. sharded step graphs */

typedef struct {
    int add_norm, norm_bwd, loss, fused, fused_outputs, waits;
} fusion_census;

/* debugmodel's compiled step graph under `layout` (command-line spelling), counted; false on
 * error. */
static bool census_of(const char *const *layout, int n_layout, fusion_census *c)
{
    gt_graph *g = train_graph_debugmodel(layout, n_layout);
    memset(c, 0, sizeof *c);
    for (int32_t n = 0; g && n < g->n_nodes; n++) {
        const gt_node *nd = &g->nodes[n];
        c->add_norm += nd->op == GT_OP_ADD_RMS_NORM;
        c->norm_bwd += nd->op == GT_OP_RMS_NORM_BACKWARD_ADD;
        c->loss += nd->op == GT_OP_CROSS_ENTROPY_WITH_GRAD;
        c->waits += nd->op == GT_OP_WAIT;
        if (nd->op == GT_OP_FUSED_ELEMENTWISE) {
            c->fused++;
            c->fused_outputs += nd->n_out;
        }
    }
    bool ok = g != NULL;
    gt_graph_free(g);
    return ok;
}

static void test_sharded_steps(void)
{
    fusion_census one, sh;
    if (!census_of(NULL, 0, &one)) return;
    printf("one rank: %d add_rms_norm, %d rms_norm_backward_add, %d cross_entropy_with_grad, "
           "%d fused_elementwise (%d outputs)\n",
           one.add_norm, one.norm_bwd, one.loss, one.fused, one.fused_outputs);
    EXPECT(one.add_norm > 0 && one.norm_bwd > 0 && one.loss == 1 && one.fused > 0,
           "the one-rank graph has every kind of fused node");
    static const char *const layouts[][4] = {
        {"--parallelism.data_parallel_shard_degree", "2"},
        {"--parallelism.data_parallel_shard_degree", "4"},
        {"--parallelism.data_parallel_shard_degree", "2",
         "--parallelism.data_parallel_replicate_degree", "2"},
    };
    static const int n_args[] = {2, 2, 4};
    for (int k = 0; k < 3; k++) {
        if (!census_of(layouts[k], n_args[k], &sh)) continue;
        const char *what = k == 0 ? "FSDP2" : k == 1 ? "FSDP4" : "HSDP2x2";
        printf("%s: %d add_rms_norm, %d rms_norm_backward_add, %d cross_entropy_with_grad, %d "
               "fused_elementwise (%d outputs), %d waits\n",
               what, sh.add_norm, sh.norm_bwd, sh.loss, sh.fused, sh.fused_outputs, sh.waits);
        EXPECT(sh.waits > 0, "%s: the graph has collectives", what);
        EXPECT(sh.add_norm == one.add_norm && sh.norm_bwd == one.norm_bwd && sh.loss == 1 &&
                   sh.fused == one.fused && sh.fused_outputs == one.fused_outputs,
               "%s: the fused nodes of one rank", what);
    }
}

int main(void)
{
    gt_cpu_set_threads(1);
    gt_log_set_level(GT_LOG_WARN);
    test_chains();
    test_boundaries();
    test_loss();
    test_sharded_steps();
    return gt_test_finish();
}
