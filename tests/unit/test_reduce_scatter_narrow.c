/* test_reduce_scatter_narrow.c — the reduce_scatter_narrow pass on the trainer's step graphs.
 *
 * Graphs: debugmodel's whole training step (bf16 mixed precision, the default) parallelized over
 * dp_shard 2 — and over dp_replicate 2 x dp_shard 2 (HSDP), and dp_shard 3 (parameters padded to
 * a multiple of 3 rows: zero padding in the gradients' trees) — and compiled by the trainer's
 * pipeline (gt_train_build_graph), with the pass on, with it disabled (--compile.disable_passes),
 * and with fsdp_bucketing disabled (one reduce-scatter per gradient). Checked against the graphs
 * alone (numerics are checked elsewhere: test_bucketing's simulated ranks and
 * tests/distributed/test_narrow_launch.c):
 *   - with the pass, no reduce_scatter_start reads an f32 value made from a cast through
 *     reshapes, concats or zero padding (walked here from the start's input), and every FSDP
 *     reduce-scatter reads bf16 and gives f32 (dtype=f32), keeping its tags and the partial
 *     placement of its input; without the pass each reads f32;
 *   - casts to f32 drop by one per parameter (each gradient's widening cast goes), and the bytes
 *     the reduce-scatters read halve;
 *   - per-tensor (bucketing off): one widening reduce-scatter per parameter;
 *   - in f32 mode and on one rank (no mesh) the compiled listing is the same with and without
 *     the pass.
 * And on small hand-built graphs (mesh 1 x 2 x 1), the pass called directly: a cast that something
 * else also reads stays (its reshape goes); a reduce-scatter over casts of bf16 and f16 values
 * together, over a cast through a non-view op (scale), or over an f32 value with no cast, is left
 * as it is. */
#include <stdlib.h>
#include <string.h>

#include "distributed/comm_test.h"
#include "graph_text.h"
#include "graphtrain/gt_build.h"
#include "graphtrain/gt_pass.h"
#include "gt_test.h"
#include "passes/pass_internal.h"
#include "train_graph.h"

/* True when v is computed from a cast through reshape, concat and slice_backward nodes only. */
static bool from_cast(const gt_graph *g, gt_value_id v)
{
    gt_node_id p = g->values[v].producer;
    if (p == GT_NONE) return false;
    const gt_node *nd = &g->nodes[p];
    if (nd->op == GT_OP_CAST) return true;
    if (nd->op != GT_OP_RESHAPE && nd->op != GT_OP_CONCAT && nd->op != GT_OP_SLICE_BACKWARD)
        return false;
    for (int k = 0; k < nd->n_in; k++)
        if (from_cast(g, nd->in[k])) return true;
    return false;
}

typedef struct {
    int starts, fsdp, widening, f32_from_cast; /* reduce_scatter_starts */
    /* params: those whose gradient a reduce-scatter makes — every parameter but the token
     * embedding, stored on dim 1 over dp_shard (layout.c), whose gradient is computed in its
     * shard */
    int casts_to_f32, params;
    int64_t bytes_read; /* sum of the starts' input bytes (-1: a symbolic shape) */
    int bad_meta;       /* widening FSDP starts without their tags or the partial input */
} census;

static census count(const gt_graph *g)
{
    census c = {0};
    for (int32_t k = 0; k < g->n_inputs; k++) {
        gt_placement dp = g->values[g->inputs[k].value].place[GT_MESH_DP_SHARD];
        c.params += g->inputs[k].kind == GT_IN_PARAM && !(dp.kind == GT_PLACE_SHARD && dp.dim == 1);
    }
    for (gt_node_id n = 0; n < g->n_nodes; n++) {
        const gt_node *nd = &g->nodes[n];
        if (nd->op == GT_OP_CAST && nd->attrs.i[0] == GT_F32) c.casts_to_f32++;
        if (nd->op != GT_OP_REDUCE_SCATTER_START) continue;
        const gt_type *in = gt_value_type(g, nd->in[0]), *out = gt_value_type(g, nd->out[0]);
        bool fsdp = gt_pass_fsdp_tag(g, nd) == 1;
        bool widening = in->dtype == GT_BF16 && out->dtype == GT_F32 && nd->attrs.ni == 3 &&
                        nd->attrs.i[2] == GT_F32;
        c.starts++;
        c.fsdp += fsdp;
        c.widening += fsdp && widening;
        c.f32_from_cast += in->dtype == GT_F32 && from_cast(g, nd->in[0]);
        int mesh_dim = (int)nd->attrs.i[0];
        if (fsdp && widening &&
            (g->values[nd->in[0]].place[mesh_dim].kind != GT_PLACE_PARTIAL ||
             !gt_node_has_tag(g, nd, GT_FSDP_TAG_REDUCE_SCATTER)))
            c.bad_meta++;
        int64_t bytes = (int64_t)gt_dtype_size(in->dtype), d;
        for (int k = 0; k < in->ndim; k++)
            bytes = bytes >= 0 && gt_sym_is_const(g->sym, in->dims[k], &d) ? bytes * d : -1;
        c.bytes_read = c.bytes_read < 0 || bytes < 0 ? -1 : c.bytes_read + bytes;
    }
    return c;
}

/* With and without the pass, on the layout of args (+ bucketing off when per_tensor). */
static void check_layout(const char *what, const char *const *layout, int n_layout, bool per_tensor)
{
    const char *on_args[8], *off_args[8];
    int n_on = 0, n_off = 0;
    for (int k = 0; k < n_layout; k++)
        on_args[n_on++] = off_args[n_off++] = layout[k];
    if (per_tensor)
        on_args[n_on++] = "--compile.disable_passes", on_args[n_on++] = "fsdp_bucketing";
    off_args[n_off++] = "--compile.disable_passes";
    off_args[n_off++] =
        per_tensor ? "fsdp_bucketing,reduce_scatter_narrow" : "reduce_scatter_narrow";
    gt_graph *on = train_graph_debugmodel(on_args, n_on);
    gt_graph *off = train_graph_debugmodel(off_args, n_off);
    if (!on || !off) {
        gt_graph_free(on);
        gt_graph_free(off);
        return;
    }
    census a = count(on), b = count(off);
    printf("%-22s reduce-scatters %d (fsdp %d, widening %d), casts to f32 %d -> %d, bytes read "
           "%lld -> %lld\n",
           what, a.starts, a.fsdp, a.widening, b.casts_to_f32, a.casts_to_f32,
           (long long)b.bytes_read, (long long)a.bytes_read);
    EXPECT(a.fsdp > 0 && a.fsdp == b.fsdp && a.starts == b.starts,
           "%s: the pass keeps the reduce-scatters (%d fsdp of %d, off: %d of %d)", what, a.fsdp,
           a.starts, b.fsdp, b.starts);
    EXPECT(a.f32_from_cast == 0, "%s: %d reduce-scatters still read an f32 value made from a cast",
           what, a.f32_from_cast);
    EXPECT(a.widening == a.fsdp, "%s: %d of %d FSDP reduce-scatters read bf16 into f32", what,
           a.widening, a.fsdp);
    EXPECT(b.widening == 0 && b.f32_from_cast == b.fsdp,
           "%s without the pass: %d widening, %d of %d read an f32 cast", what, b.widening,
           b.f32_from_cast, b.fsdp);
    EXPECT(a.bad_meta == 0, "%s: %d widening reduce-scatters lost their tag or partial input", what,
           a.bad_meta);
    EXPECT(a.casts_to_f32 + a.params == b.casts_to_f32 && a.params > 0,
           "%s: casts to f32 %d -> %d, want one fewer per parameter (%d)", what, b.casts_to_f32,
           a.casts_to_f32, a.params);
    EXPECT(a.bytes_read > 0 && 2 * a.bytes_read == b.bytes_read,
           "%s: reduce-scatters read %lld bytes, half of %lld", what, (long long)a.bytes_read,
           (long long)b.bytes_read);
    if (per_tensor)
        EXPECT(a.fsdp == a.params, "%s: %d per-tensor reduce-scatters for %d parameters", what,
               a.fsdp, a.params);
    gt_error err = {0};
    EXPECT_OK(gt_graph_verify(on, &err), &err);
    gt_graph_free(on);
    gt_graph_free(off);
}

/* The listing with and without the pass is the same. */
static void check_untouched(const char *what, const char *const *args, int n_args)
{
    const char *off_args[8];
    int n = 0;
    for (int k = 0; k < n_args; k++)
        off_args[n++] = args[k];
    off_args[n++] = "--compile.disable_passes";
    off_args[n++] = "reduce_scatter_narrow";
    gt_graph *on = train_graph_debugmodel(args, n_args), *off = train_graph_debugmodel(off_args, n);
    if (on && off) {
        char *a = graph_text(on), *b = graph_text(off);
        EXPECT(strcmp(a, b) == 0, "%s: the pass changed the graph", what);
        free(a);
        free(b);
    }
    gt_graph_free(on);
    gt_graph_free(off);
}

/* reduce_scatter over dp_shard 2 of x (rows even), start + wait; returns the start's node. */
static gt_node_id scatter(gt_graph *g, gt_value_id x, const char *name)
{
    gt_value_id w = comm_test_coll(g, GT_OP_REDUCE_SCATTER_START, x, 1, 2);
    gt_graph_add_output(g, GT_OUT_METRIC, name, w);
    return g->values[g->nodes[g->values[w].producer].in[0]].producer;
}

static int count_op(const gt_graph *g, gt_op op)
{
    int c = 0;
    for (gt_node_id n = 0; n < g->n_nodes; n++)
        c += g->nodes[n].op == op;
    return c;
}

/* The start reading input `name`'s scatter: its input dtype and whether it widens. */
static gt_dtype start_input_dtype(const gt_graph *g, const char *name, bool *widening)
{
    for (int32_t k = 0; k < g->n_outputs; k++) {
        if (strcmp(gt_graph_str(g, g->outputs[k].fqn), name) != 0) continue;
        const gt_node *w = &g->nodes[g->values[g->outputs[k].value].producer];
        const gt_node *st = &g->nodes[g->values[w->in[0]].producer];
        *widening = st->attrs.ni == 3 && st->attrs.i[2] == GT_F32;
        return gt_value_type(g, st->in[0])->dtype;
    }
    *widening = false;
    return GT_DTYPE_COUNT;
}

static void test_hand_built(void)
{
    gt_graph *g = gt_graph_new();
    comm_test_set_mesh(g, 1, 2, 1);
    gt_expr d[2] = {gt_c(g, 4), gt_c(g, 3)}, flat = gt_c(g, 12), d2[2] = {gt_c(g, 2), gt_c(g, 6)};
    gt_value_id xb = gt_graph_add_input(g, GT_IN_INPUT, "xb", GT_BF16, 2, d);
    gt_value_id xh = gt_graph_add_input(g, GT_IN_INPUT, "xh", GT_F16, 2, d);
    gt_value_id xf = gt_graph_add_input(g, GT_IN_INPUT, "xf", GT_F32, 2, d);
    /* shared: the cast is also summed; the scatter reads reshape(cast) */
    gt_value_id c = gt_cast(g, xb, GT_F32);
    int all[2] = {0, 1};
    gt_graph_add_output(g, GT_OUT_METRIC, "sum", gt_reduce(g, GT_OP_SUM, c, 2, all, false));
    scatter(g, gt_reshape(g, c, 1, &flat), "shared");
    /* mixed: bf16 and f16 casts concatenated */
    gt_value_id mix[2] = {gt_reshape(g, gt_cast(g, xb, GT_F32), 2, d2),
                          gt_reshape(g, gt_cast(g, xh, GT_F32), 2, d2)};
    scatter(g, gt_concat(g, 2, mix, 1), "mixed");
    /* through a non-view op, and no cast at all */
    scatter(g, gt_scale(g, gt_cast(g, xb, GT_F32), 2.0), "scaled");
    scatter(g, xf, "plain");
    EXPECT(g->err.code == GT_OK, "build: %s", g->err.msg);
    int casts = count_op(g, GT_OP_CAST), reshapes = count_op(g, GT_OP_RESHAPE);
    gt_error err = {0};
    EXPECT_OK(gt_pass_reduce_scatter_narrow(g, NULL, &err), &err);
    EXPECT_OK(gt_graph_verify(g, &err), &err);
    bool widening;
    gt_dtype dt = start_input_dtype(g, "shared", &widening);
    EXPECT(dt == GT_BF16 && widening, "shared cast: the scatter reads bf16 into f32 (%s)",
           gt_dtype_name(dt));
    EXPECT(count_op(g, GT_OP_CAST) == casts && count_op(g, GT_OP_RESHAPE) == reshapes,
           "the summed cast stays, the old reshape gives way to the new one (casts %d -> %d, "
           "reshapes %d -> %d)",
           casts, count_op(g, GT_OP_CAST), reshapes, count_op(g, GT_OP_RESHAPE));
    const char *left[3] = {"mixed", "scaled", "plain"};
    for (int k = 0; k < 3; k++) {
        dt = start_input_dtype(g, left[k], &widening);
        EXPECT(dt == GT_F32 && !widening, "%s: left alone (%s input)", left[k], gt_dtype_name(dt));
    }
    gt_graph_free(g);
}

int main(void)
{
    test_hand_built();
    const char *fsdp2[] = {"--parallelism.data_parallel_shard_degree", "2"};
    const char *hsdp[] = {"--parallelism.data_parallel_shard_degree", "2",
                          "--parallelism.data_parallel_replicate_degree", "2"};
    check_layout("FSDP2", fsdp2, 2, false);
    check_layout("FSDP2 per tensor", fsdp2, 2, true);
    check_layout("HSDP 2x2", hsdp, 4, false);
    const char *fsdp3[] = {"--parallelism.data_parallel_shard_degree", "3"};
    check_layout("FSDP3 (padded)", fsdp3, 2, false); /* 256 rows pad to 258: slice_backward */

    const char *f32[] = {"--parallelism.data_parallel_shard_degree", "2",
                         "--training.mixed_precision_param", "float32"};
    check_untouched("FSDP2 float32", f32, 4);
    check_untouched("one rank (no mesh)", NULL, 0);
    return gt_test_finish();
}
