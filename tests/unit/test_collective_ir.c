/* test_collective_ir.c — collective start/wait ops through the IR, the passes, the planner and
 * both executors, on one rank.
 *
 * References are independent of the code under test:
 *   - shape rules: output dims evaluated under a binding against the op's definition (gather:
 *     n*k rows, scatter: m/n rows); bad shapes, dtypes and mesh attributes give errors naming the
 *     op and the numbers; reduce_scatter's optional dtype: absent or the input's keeps it, f32
 *     widens a bf16/f16 input, every other pair (f32 into bf16, bf16 into f16, into i32, a number
 *     that is no dtype) is refused naming the node and both dtypes; the printer shows the slot
 *     only when it is there;
 *   - printer: the exact line the format promises for a placed value, the mesh line, and the
 *     listing of the same graph without a mesh equal to the parallel listing with the mesh line
 *     and the " {...}" placements cut out (unparallelized graphs print as before);
 *   - placements and the mesh survive gt_graph_copy, gt_graph_copy_region into another graph,
 *     CSE + DCE (with compaction) and remat;
 *   - CSE keeps two identical gathers (FSDP's reshard) while it still merges two identical negs;
 *   - plan: the wait's output is the start's buffer; the start's input and output buffers are live
 *     over the whole [start, wait] interval and no value produced in between overlaps them in
 *     bytes (checked from offsets and sizes);
 *   - size-1 groups: gt_program_run and gt_eager_run of a graph with
 * gather/scatter/all-to-all/all-reduce over one rank give the bits of the same graph without the
 * collectives (f32 and bf16); a widening reduce_scatter over one rank (and its CPU kernel) gives
 * the bits of cast(x, f32);
 *   - a program with a collective over 2 ranks and no communicator fails naming the mesh dim, and
 *     gt_program_set_comms checks communicator sizes; gt_program_collectives lists kind, group
 *     (hash of the mesh dim name) and bytes (from the shapes), and gt_program_drop_collective
 *     removes exactly one entry. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "distributed/comm_test.h"
#include "graphtrain/gt_backend.h"
#include "graphtrain/gt_build.h"
#include "graphtrain/gt_comm.h"
#include "graphtrain/gt_exec.h"
#include "graphtrain/gt_pass.h"
#include "graphtrain/gt_program.h"
#include "gt_test.h"

static int64_t eval_dim(gt_graph *g, gt_value_id v, int d, const gt_sym_binding *b)
{
    int64_t shape[GT_MAX_DIMS] = {0};
    gt_error err = {0};
    if (gt_graph_eval_shape(g, v, b, shape, &err) != GT_OK) return -999;
    return shape[d];
}

/* The recorded builder error must have `code` and name every string of want; then clear it. */
static void expect_error(gt_graph *g, gt_value_id got, gt_status code, const char *const *want,
                         int n_want, const char *what)
{
    EXPECT(got == GT_NONE && g->err.code == code, "%s: expected %s, got value %d, %s (%s)", what,
           gt_status_name(code), got, gt_status_name(g->err.code), g->err.msg);
    for (int k = 0; k < n_want; k++)
        EXPECT(strstr(g->err.msg, want[k]) != NULL, "%s: message lacks '%s': %s", what, want[k],
               g->err.msg);
    memset(&g->err, 0, sizeof g->err);
}

/* ---------------------------------------------------------------- shape rules */

/* reduce_scatter_start with its optional dtype slot set. */
static gt_value_id scatter_to(gt_graph *g, gt_value_id x, int64_t dim, int64_t size, int64_t dtype)
{
    gt_attrs a = {0};
    a.i[0] = dim;
    a.i[1] = size;
    a.i[2] = dtype;
    a.ni = 3;
    return gt_graph_add_node(g, GT_OP_REDUCE_SCATTER_START, &x, 1, &a, NULL);
}

/* The widening reduce_scatter (gt_ops.def): only a bf16/f16 input may become f32. */
static void test_widening_rules(void)
{
    gt_graph *g = gt_graph_new();
    gt_expr d[2] = {gt_c(g, 6), gt_c(g, 5)};
    gt_value_id x = gt_graph_add_input(g, GT_IN_INPUT, "x", GT_F32, 2, d);
    gt_value_id xb = gt_graph_add_input(g, GT_IN_INPUT, "xb", GT_BF16, 2, d);
    gt_value_id xh = gt_graph_add_input(g, GT_IN_INPUT, "xh", GT_F16, 2, d);
    struct {
        gt_value_id in;
        int64_t dtype;
        gt_dtype want;
    } ok[4] = {
        {xb, GT_F32, GT_F32}, {xh, GT_F32, GT_F32}, {xb, GT_BF16, GT_BF16}, {x, GT_F32, GT_F32}};
    for (int k = 0; k < 4; k++) {
        gt_value_id r = scatter_to(g, ok[k].in, 1, 2, ok[k].dtype);
        EXPECT(r != GT_NONE && gt_value_type(g, r)->dtype == ok[k].want &&
                   eval_dim(g, r, 0, NULL) == 3 && eval_dim(g, r, 1, NULL) == 5,
               "reduce_scatter of %s [6, 5] with dtype=%s -> %s [3, 5]: %s",
               gt_dtype_name(gt_value_type(g, ok[k].in)->dtype),
               gt_dtype_name((gt_dtype)ok[k].dtype), gt_dtype_name(ok[k].want), g->err.msg);
    }
    /* the printer shows the slot when it is set, and nothing when it is not */
    gt_value_id plain = comm_test_start(g, GT_OP_REDUCE_SCATTER_START, xb, 1, 2);
    gt_value_id wide = scatter_to(g, xb, 1, 2, GT_F32);
    char a[512], b[512];
    gt_graph_format_node(g, g->values[plain].producer, a, sizeof a);
    gt_graph_format_node(g, g->values[wide].producer, b, sizeof b);
    EXPECT(strstr(a, "reduce_scatter_start(%1; mesh_dim=1, group_size=2)") && !strstr(a, "dtype"),
           "printed without the slot: %s", a);
    EXPECT(strstr(b, "f32[3, 5] = reduce_scatter_start(%1; mesh_dim=1, group_size=2, dtype=f32)"),
           "printed with the slot: %s", b);
    gt_error err = {0};
    EXPECT_OK(gt_graph_verify(g, &err), &err);

    const char *w1[] = {"reduce_scatter_start", "output dtype bf16", "f32[6, 5]"};
    expect_error(g, scatter_to(g, x, 1, 2, GT_BF16), GT_ERR_SHAPE, w1, 3, "f32 into bf16");
    const char *w2[] = {"reduce_scatter_start", "output dtype f16", "bf16[6, 5]"};
    expect_error(g, scatter_to(g, xb, 1, 2, GT_F16), GT_ERR_SHAPE, w2, 3, "bf16 into f16");
    const char *w3[] = {"reduce_scatter_start", "output dtype i32", "f16[6, 5]"};
    expect_error(g, scatter_to(g, xh, 1, 2, GT_I32), GT_ERR_SHAPE, w3, 3, "f16 into i32");
    const char *w4[] = {"reduce_scatter_start", "99 (not a dtype)"};
    expect_error(g, scatter_to(g, xb, 1, 2, 99), GT_ERR_SHAPE, w4, 2, "dtype 99");
    gt_attrs four = {0};
    four.i[1] = 2;
    four.i[2] = GT_F32;
    four.ni = 4;
    const char *w5[] = {"reduce_scatter_start", "4 int attributes", "at most 3"};
    expect_error(g, gt_graph_add_node(g, GT_OP_REDUCE_SCATTER_START, &xb, 1, &four, NULL),
                 GT_ERR_INVALID, w5, 3, "a fourth int attribute");
    gt_graph_free(g);
}

static void test_shape_rules(void)
{
    gt_graph *g = gt_graph_new();
    gt_expr b = gt_sym_var(g->sym, "b"), s = gt_sym_var(g->sym, "s");
    gt_expr d35[2] = {gt_c(g, 3), gt_c(g, 5)}, d75[2] = {gt_c(g, 7), gt_c(g, 5)};
    gt_expr dbs[2] = {gt_sym_mul(g->sym, b, s), gt_c(g, 4)};
    gt_value_id x = gt_graph_add_input(g, GT_IN_INPUT, "x", GT_F32, 2, d35);
    gt_value_id x7 = gt_graph_add_input(g, GT_IN_INPUT, "x7", GT_F32, 2, d75);
    gt_value_id xs = gt_graph_add_input(g, GT_IN_INPUT, "xs", GT_BF16, 2, dbs);
    gt_value_id ids = gt_graph_add_input(g, GT_IN_INPUT, "ids", GT_I32, 2, d35);
    gt_value_id sc = gt_graph_add_input(g, GT_IN_INPUT, "scalar", GT_F32, 0, NULL);
    gt_sym_binding_entry be[2] = {{"b", 3}, {"s", 4}};
    gt_sym_binding bind = {be, 2};

    /* gather: [k, ...] -> [n*k, ...], any dtype */
    gt_value_id ag = comm_test_start(g, GT_OP_ALL_GATHER_START, x, 1, 4);
    EXPECT(ag != GT_NONE && gt_value_type(g, ag)->dtype == GT_F32 &&
               eval_dim(g, ag, 0, &bind) == 12 && eval_dim(g, ag, 1, &bind) == 5,
           "all_gather [3, 5] over 4 ranks -> [12, 5]: %s", g->err.msg);
    gt_value_id agi = comm_test_start(g, GT_OP_ALL_GATHER_START, ids, 0, 2);
    EXPECT(agi != GT_NONE && gt_value_type(g, agi)->dtype == GT_I32 &&
               eval_dim(g, agi, 0, &bind) == 6,
           "all_gather of i32 ids: %s", g->err.msg);
    gt_value_id ags = comm_test_start(g, GT_OP_ALL_GATHER_START, xs, 2, 2);
    EXPECT(ags != GT_NONE && eval_dim(g, ags, 0, &bind) == 24 &&
               gt_value_type(g, ags)->dtype == GT_BF16,
           "all_gather of symbolic [b*s, 4] over 2 at b=3 s=4 -> 24 rows: %s", g->err.msg);

    /* wait: the pending value's type */
    gt_value_id win[2] = {ag, x};
    gt_value_id w = gt_graph_add_node(g, GT_OP_WAIT, win, 2, NULL, NULL);
    EXPECT(w != GT_NONE && eval_dim(g, w, 0, &bind) == 12 && gt_value_type(g, w)->ndim == 2,
           "wait gives the gathered type: %s", g->err.msg);

    /* reduce_scatter: [m, ...] -> [m/n, ...], float, m divisible when constant */
    gt_value_id rs = comm_test_start(g, GT_OP_REDUCE_SCATTER_START, ag, 1, 4);
    EXPECT(rs != GT_NONE && eval_dim(g, rs, 0, &bind) == 3 && eval_dim(g, rs, 1, &bind) == 5,
           "reduce_scatter [12, 5] over 4 -> [3, 5]: %s", g->err.msg);
    gt_value_id rss = comm_test_start(g, GT_OP_REDUCE_SCATTER_START, xs, 1, 2);
    EXPECT(rss != GT_NONE && eval_dim(g, rss, 0, &bind) == 6,
           "reduce_scatter of symbolic [b*s, 4] over 2 at b=3 s=4 -> 6 rows: %s", g->err.msg);
    const char *w7[] = {"reduce_scatter_start", "7", "group_size 2"};
    expect_error(g, comm_test_start(g, GT_OP_REDUCE_SCATTER_START, x7, 0, 2), GT_ERR_SHAPE, w7, 3,
                 "reduce_scatter of 7 rows over 2");
    const char *wi[] = {"reduce_scatter_start", "float", "i32"};
    expect_error(g, comm_test_start(g, GT_OP_REDUCE_SCATTER_START, ids, 0, 1), GT_ERR_SHAPE, wi, 3,
                 "reduce_scatter of i32");

    /* all_to_all: same type, any dtype, rows divisible when constant */
    gt_value_id aa = comm_test_start(g, GT_OP_ALL_TO_ALL_START, ag, 1, 4);
    EXPECT(aa != GT_NONE && eval_dim(g, aa, 0, &bind) == 12 && eval_dim(g, aa, 1, &bind) == 5 &&
               gt_value_type(g, aa)->dtype == GT_F32,
           "all_to_all [12, 5] over 4 -> [12, 5]: %s", g->err.msg);
    gt_value_id aai = comm_test_start(g, GT_OP_ALL_TO_ALL_START, ids, 0, 3);
    EXPECT(aai != GT_NONE && gt_value_type(g, aai)->dtype == GT_I32 &&
               eval_dim(g, aai, 0, &bind) == 3,
           "all_to_all of i32 ids: %s", g->err.msg);
    const char *wt[] = {"all_to_all_start", "7", "group_size 2"};
    expect_error(g, comm_test_start(g, GT_OP_ALL_TO_ALL_START, x7, 0, 2), GT_ERR_SHAPE, wt, 3,
                 "all_to_all of 7 rows over 2");
    const char *wts[] = {"all_to_all_start", "rank >= 1"};
    expect_error(g, comm_test_start(g, GT_OP_ALL_TO_ALL_START, sc, 0, 2), GT_ERR_SHAPE, wts, 2,
                 "all_to_all of a scalar");

    /* all_reduce: same type, float */
    gt_value_id ar = comm_test_start(g, GT_OP_ALL_REDUCE_START, sc, 0, 3);
    EXPECT(ar != GT_NONE && gt_value_type(g, ar)->ndim == 0, "all_reduce of a scalar: %s",
           g->err.msg);
    const char *wa[] = {"all_reduce_start", "float"};
    expect_error(g, comm_test_start(g, GT_OP_ALL_REDUCE_START, ids, 0, 2), GT_ERR_SHAPE, wa, 2,
                 "all_reduce of i32");
    const char *wr[] = {"all_gather_start", "rank >= 1"};
    expect_error(g, comm_test_start(g, GT_OP_ALL_GATHER_START, sc, 0, 2), GT_ERR_SHAPE, wr, 2,
                 "all_gather of a scalar");

    /* attributes without a mesh: mesh_dim in [0, GT_MESH_MAX_DIMS), group_size >= 1 */
    char dim_text[32];
    snprintf(dim_text, sizeof dim_text, "mesh_dim %d out of range", GT_MESH_MAX_DIMS);
    const char *wd[] = {"all_gather_start", dim_text};
    expect_error(g, comm_test_start(g, GT_OP_ALL_GATHER_START, x, GT_MESH_MAX_DIMS, 2),
                 GT_ERR_INVALID, wd, 2, "mesh_dim out of range");
    const char *wg[] = {"all_reduce_start", "group_size", "0"};
    expect_error(g, comm_test_start(g, GT_OP_ALL_REDUCE_START, x, 0, 0), GT_ERR_INVALID, wg, 3,
                 "group_size 0");

    /* wait's input 0 must be a start's output, input 1 that start's input */
    gt_value_id bad[2] = {x, x};
    const char *ww[] = {"wait", "collective start"};
    expect_error(g, gt_graph_add_node(g, GT_OP_WAIT, bad, 2, NULL, NULL), GT_ERR_INVALID, ww, 2,
                 "wait on a graph input");
    gt_value_id bad1[2] = {ag, x7};
    const char *w1[] = {"wait", "input 1"};
    expect_error(g, gt_graph_add_node(g, GT_OP_WAIT, bad1, 2, NULL, NULL), GT_ERR_INVALID, w1, 2,
                 "wait whose input 1 is not the start's input");

    gt_error err = {0};
    EXPECT_OK(gt_graph_verify(g, &err), &err);

    /* with a mesh: mesh_dim < ndim and group_size == the dim's size */
    comm_test_set_mesh(g, 1, 2, 4);
    const char *wm[] = {"all_gather_start", "mesh_dim 3", "[0, 3)"};
    expect_error(g, comm_test_start(g, GT_OP_ALL_GATHER_START, x, 3, 2), GT_ERR_INVALID, wm, 3,
                 "mesh_dim past the mesh");
    const char *ws[] = {"all_gather_start", "group_size 2", "tp", "4"};
    expect_error(g, comm_test_start(g, GT_OP_ALL_GATHER_START, x, 2, 2), GT_ERR_INVALID, ws, 4,
                 "group_size differs from the mesh dim");
    EXPECT(comm_test_start(g, GT_OP_ALL_GATHER_START, x, 2, 4) != GT_NONE, "matching group: %s",
           g->err.msg);
    /* the verifier re-runs the rules: the earlier gather over 4 ranks of dim 1 no longer fits */
    gt_error e = {0};
    EXPECT(gt_graph_verify(g, &e) != GT_OK && strstr(e.msg, "group_size 4") &&
               strstr(e.msg, "dp_shard"),
           "verify against the mesh: %s", e.msg);
    gt_graph_free(g);
}

/* ---------------------------------------------------------------- printer */

/* x [8, 4] -> neg -> gather over dp_shard -> exp; the neg output placed {S(0)@dp_shard, P@tp}. */
static gt_graph *build_print_graph(bool parallel, gt_value_id *neg_out)
{
    gt_graph *g = gt_graph_new();
    if (parallel) comm_test_set_mesh(g, 1, 2, 2);
    gt_expr d[2] = {gt_c(g, 8), gt_c(g, 4)};
    gt_value_id x = gt_graph_add_input(g, GT_IN_INPUT, "x", GT_F32, 2, d);
    gt_value_id a = gt_unary(g, GT_OP_NEG, x);
    gt_value_id w = comm_test_coll(g, GT_OP_ALL_GATHER_START, a, 1, 2);
    gt_value_id y = gt_unary(g, GT_OP_EXP, w);
    gt_graph_add_output(g, GT_OUT_METRIC, "y", y);
    if (parallel) {
        g->values[x].place[1] = (gt_placement){GT_PLACE_SHARD, 0, 0, 0};
        g->values[a].place[1] = (gt_placement){GT_PLACE_SHARD, 0, 0, 0};
        g->values[a].place[2] = (gt_placement){GT_PLACE_PARTIAL, 0, 0, 0};
    }
    *neg_out = a;
    return g;
}

/* The listing without its "mesh:" line and without every " {...}" group. */
static char *strip_parallel(const char *s)
{
    char *out = gt_xmalloc(strlen(s) + 1), *o = out;
    if (strncmp(s, "mesh:", 5) == 0) s = strchr(s, '\n') + 1;
    while (*s) {
        if (s[0] == ' ' && s[1] == '{') {
            s = strchr(s, '}') + 1;
            continue;
        }
        *o++ = *s++;
    }
    *o = 0;
    return out;
}

static void test_printer(void)
{
    gt_value_id a;
    gt_graph *gp = build_print_graph(true, &a), *g0 = build_print_graph(false, &a);
    EXPECT(gp->err.code == GT_OK && g0->err.code == GT_OK, "build: %s %s", gp->err.msg,
           g0->err.msg);
    char line[512];
    gt_graph_format_node(gp, gp->values[a].producer, line, sizeof line);
    char want[128];
    snprintf(want, sizeof want, "%%%d : f32[8, 4] {S(0)@dp_shard, P@tp} = neg(%%0)  # fwd", a);
    EXPECT(strcmp(line, want) == 0, "placed node line:\n  got  %s\n  want %s", line, want);

    char *lp = graph_text(gp), *l0 = graph_text(g0);
    EXPECT(strncmp(lp, "mesh: dp_replicate=1 dp_shard=2 tp=2\n", 37) == 0, "mesh line: %.60s", lp);
    EXPECT(strstr(lp, "input %0 : f32[8, 4] {S(0)@dp_shard} INPUT x\n") != NULL,
           "placed input line in:\n%s", lp);
    EXPECT(strstr(l0, "mesh:") == NULL && strchr(l0, '{') == NULL,
           "an unparallelized listing has no mesh or placements:\n%s", l0);
    char *stripped = strip_parallel(lp);
    EXPECT(strcmp(stripped, l0) == 0, "parallel listing minus placements:\n%s\nvs plain:\n%s",
           stripped, l0);
    free(stripped);
    free(lp);
    free(l0);

    /* copies keep the mesh and the placements */
    gt_graph *c = gt_graph_copy(gp);
    char *lc = graph_text(c), *lp2 = graph_text(gp);
    EXPECT(strcmp(lc, lp2) == 0, "gt_graph_copy prints like its original");
    free(lc);
    free(lp2);
    gt_graph_free(c);

    gt_graph *dst = gt_graph_new();
    gt_expr d[2] = {gt_c(dst, 8), gt_c(dst, 4)};
    gt_value_id *map = gt_xmalloc((size_t)gp->n_values * sizeof *map);
    for (gt_value_id v = 0; v < gp->n_values; v++)
        map[v] = GT_NONE;
    map[gp->inputs[0].value] = gt_graph_add_input(dst, GT_IN_INPUT, "x", GT_F32, 2, d);
    gt_error err = {0};
    EXPECT_OK(gt_graph_copy_region(dst, gp, 0, gp->n_nodes, map, &err), &err);
    EXPECT(dst->mesh.ndim == 3 && dst->mesh.size[1] == 2 && dst->mesh.size[2] == 2 &&
               strcmp(gt_graph_str(dst, dst->mesh.name[2]), "tp") == 0,
           "copy_region into another graph takes the mesh");
    EXPECT(memcmp(dst->values[map[a]].place, gp->values[a].place, sizeof gp->values[a].place) == 0,
           "copy_region copies each output's placements");
    EXPECT_OK(gt_graph_verify(dst, &err), &err);
    free(map);
    gt_graph_free(dst);
    gt_graph_free(gp);
    gt_graph_free(g0);
}

/* ---------------------------------------------------------------- CSE and DCE */

static int count_op(const gt_graph *g, gt_op op)
{
    int n = 0;
    for (gt_node_id k = 0; k < g->n_nodes; k++)
        n += g->nodes[k].op == op;
    return n;
}

static void test_cse_keeps_gathers(void)
{
    gt_graph *g = gt_graph_new();
    comm_test_set_mesh(g, 1, 1, 1);
    gt_expr d[2] = {gt_c(g, 4), gt_c(g, 4)};
    gt_value_id x = gt_graph_add_input(g, GT_IN_PARAM, "w", GT_F32, 2, d);
    g->values[x].place[1] = (gt_placement){GT_PLACE_SHARD, 0, 0, 0};
    gt_value_id w1 = comm_test_coll(g, GT_OP_ALL_GATHER_START, x, 1, 1);
    gt_value_id n1 = gt_unary(g, GT_OP_NEG, x);
    gt_value_id y1 = gt_mul(g, w1, n1);
    g->values[y1].place[2] = (gt_placement){GT_PLACE_PARTIAL, 0, 0, 0};
    gt_unary(g, GT_OP_EXP, x); /* dead: DCE removes it and compacts the ids */
    g->cur_phase = GT_PHASE_BACKWARD;
    gt_value_id w2 = comm_test_coll(g, GT_OP_ALL_GATHER_START, x, 1, 1);
    gt_value_id n2 = gt_unary(g, GT_OP_NEG, x);
    gt_value_id y2 = gt_add(g, w2, n2);
    g->values[y2].place[1] = (gt_placement){GT_PLACE_SHARD, 1, 0, 0};
    gt_graph_add_output(g, GT_OUT_METRIC, "y1", y1);
    gt_graph_add_output(g, GT_OUT_METRIC, "y2", y2);
    EXPECT(g->err.code == GT_OK, "build: %s", g->err.msg);

    gt_error err = {0};
    gt_pass_options opts = {.quiet = true};
    gt_pass_ctx ctx = {.options = &opts};
    EXPECT_OK(gt_pass_cse(g, &ctx, &err), &err);
    EXPECT_OK(gt_pass_dce(g, &ctx, &err), &err);
    EXPECT_OK(gt_graph_verify(g, &err), &err);
    EXPECT(count_op(g, GT_OP_ALL_GATHER_START) == 2 && count_op(g, GT_OP_WAIT) == 2,
           "both gathers and waits kept: %d starts, %d waits", count_op(g, GT_OP_ALL_GATHER_START),
           count_op(g, GT_OP_WAIT));
    EXPECT(count_op(g, GT_OP_NEG) == 1 && count_op(g, GT_OP_EXP) == 0,
           "CSE merged the two negs (%d) and DCE removed the exp (%d)", count_op(g, GT_OP_NEG),
           count_op(g, GT_OP_EXP));
    /* the two consumers still read different waits */
    gt_value_id o1 = g->outputs[0].value, o2 = g->outputs[1].value;
    const gt_node *m1 = &g->nodes[g->values[o1].producer], *m2 = &g->nodes[g->values[o2].producer];
    gt_node_id p1 = g->values[m1->in[0]].producer, p2 = g->values[m2->in[0]].producer;
    EXPECT(g->nodes[p1].op == GT_OP_WAIT && g->nodes[p2].op == GT_OP_WAIT && p1 != p2,
           "forward and backward read their own gather");
    EXPECT(g->values[o1].place[2].kind == GT_PLACE_PARTIAL &&
               g->values[o2].place[1].kind == GT_PLACE_SHARD && g->values[o2].place[1].dim == 1 &&
               g->values[g->inputs[0].value].place[1].kind == GT_PLACE_SHARD,
           "placements survive CSE and DCE compaction");
    EXPECT(g->mesh.ndim == 3 && strcmp(gt_graph_str(g, g->mesh.name[1]), "dp_shard") == 0,
           "mesh survives");
    gt_graph_free(g);
}

/* ---------------------------------------------------------------- plan */

/* The program of g (no binding), after checking that g was built without an error. NULL, with g
 * freed, when the program does not build. */
static gt_program *build_program(gt_graph *g)
{
    EXPECT(g->err.code == GT_OK, "build: %s", g->err.msg);
    gt_error err = {0};
    gt_program *prog = NULL;
    EXPECT_OK(gt_program_build(g, NULL, &prog, &err), &err);
    if (!prog) gt_graph_free(g);
    return prog;
}

/* Byte ranges [off, off + n) of two values of one arena intersect. */
static bool bytes_overlap(const gt_value_plan *a, const gt_value_plan *b)
{
    if (a->arena != b->arena || !a->nbytes || !b->nbytes) return false;
    return a->offset < b->offset + b->nbytes && b->offset < a->offset + a->nbytes;
}

static int32_t position_of(const gt_plan *p, gt_node_id n)
{
    for (int32_t k = 0; k < p->n_order; k++)
        if (p->order[k] == n) return k;
    return -1;
}

static void test_plan(void)
{
    /* x -> a = neg(x); start(a); b = exp(x); c = neg(b); d = exp(c); w = wait; y = w + d.
     * Without the wait keeping a, a's buffer (last read by the start) would be free for b, c or
     * d, all of a's size; the start's output would be free for them too if it lived from the
     * wait only. */
    gt_graph *g = gt_graph_new();
    gt_expr dims[2] = {gt_c(g, 16), gt_c(g, 8)};
    gt_value_id x = gt_graph_add_input(g, GT_IN_INPUT, "x", GT_F32, 2, dims);
    gt_value_id a = gt_unary(g, GT_OP_NEG, x);
    gt_value_id s = comm_test_start(g, GT_OP_ALL_REDUCE_START, a, 0, 1);
    gt_value_id b = gt_unary(g, GT_OP_EXP, x);
    gt_value_id c = gt_unary(g, GT_OP_NEG, b);
    gt_value_id d = gt_unary(g, GT_OP_EXP, c);
    gt_value_id win[2] = {s, a};
    gt_value_id w = gt_graph_add_node(g, GT_OP_WAIT, win, 2, NULL, NULL);
    gt_value_id y = gt_add(g, w, d);
    gt_graph_add_output(g, GT_OUT_METRIC, "y", y);
    gt_program *prog = build_program(g);
    if (!prog) return;
    gt_error err = {0};
    const gt_plan *p = prog->plan;
    const gt_value_plan *vp = p->values;
    int32_t ps = position_of(p, g->values[s].producer), pw = position_of(p, g->values[w].producer);
    EXPECT(ps >= 0 && pw > ps, "start at %d before wait at %d", ps, pw);
    EXPECT(vp[w].root == vp[s].root && vp[w].offset == vp[s].offset && vp[w].shared == 1,
           "the wait's output is the start's buffer (root %d vs %d)", vp[w].root, vp[s].root);
    const gt_value_plan *rs = &vp[vp[s].root], *ra = &vp[vp[a].root];
    EXPECT(rs->first <= ps && rs->last >= pw, "start output live over [%d, %d]: [%d, %d]", ps, pw,
           rs->first, rs->last);
    EXPECT(ra->first <= ps && ra->last >= pw, "start input live over [%d, %d]: [%d, %d]", ps, pw,
           ra->first, ra->last);
    EXPECT(!bytes_overlap(rs, ra), "the start's input and output do not alias");
    int checked = 0;
    for (gt_value_id v = 0; v < g->n_values; v++) {
        gt_node_id n = g->values[v].producer;
        if (n == GT_NONE || v == s) continue;
        int32_t pos = position_of(p, n);
        if (pos <= ps || pos >= pw) continue;
        checked++;
        EXPECT(!bytes_overlap(&vp[vp[v].root], rs) && !bytes_overlap(&vp[vp[v].root], ra),
               "value %%%d made at %d (between start %d and wait %d) overlaps the collective's "
               "buffers",
               v, pos, ps, pw);
    }
    EXPECT(checked == 3, "three values made between start and wait, got %d", checked);
    EXPECT(prog->n_slots == 1, "one request slot");

    /* the program equals eager on it (a group of one: the identity) */
    int64_t shape[2] = {16, 8};
    gt_tensor in;
    gt_tensor_alloc(&in, GT_F32, 2, shape, &err);
    for (int64_t i = 0; i < 128; i++)
        gt_tensor_set_f32(&in, i, (float)(i % 13) * 0.25f - 1.5f);
    gt_tensor o1 = {0}, o2 = {0};
    EXPECT_OK(gt_program_run(prog, &in, &o1, &err), &err);
    EXPECT_OK(gt_eager_run(g, NULL, &in, &o2, &err), &err);
    bool same = o1.data && o2.data && memcmp(o1.data, o2.data, gt_tensor_nbytes(&o1)) == 0;
    int bad = 0;
    for (int64_t i = 0; same && i < 128; i++) {
        float xv = gt_tensor_get_f32(&in, i);
        float ref = -xv + expf(-expf(xv));
        bad += fabsf(gt_tensor_get_f32(&o1, i) - ref) > 1e-6f * (1.0f + fabsf(ref));
    }
    EXPECT(same && bad == 0, "program == eager (bitwise), both -x + exp(-exp(x)) (%d differ)", bad);
    gt_tensor_free(&o1);
    gt_tensor_free(&o2);
    gt_tensor_free(&in);
    gt_program_free(prog);
    gt_graph_free(g);
}

/* ---------------------------------------------------------------- size-1 groups */

/* y = exp(reduce_scatter(all_gather(neg(x)))) * all_reduce(x) over groups of one rank, or the same
 * without the collectives. The mesh (1, 1, 1) uses every mesh dim once. */
static gt_graph *build_identity_graph(bool with_colls, gt_dtype dt)
{
    gt_graph *g = gt_graph_new();
    if (with_colls) comm_test_set_mesh(g, 1, 1, 1);
    gt_expr d[2] = {gt_c(g, 6), gt_c(g, 5)};
    gt_value_id x = gt_graph_add_input(g, GT_IN_INPUT, "x", dt, 2, d);
    gt_value_id a = gt_unary(g, GT_OP_NEG, x);
    if (with_colls) a = comm_test_coll(g, GT_OP_ALL_GATHER_START, a, 1, 1);
    if (with_colls) a = comm_test_coll(g, GT_OP_REDUCE_SCATTER_START, a, 2, 1);
    if (with_colls) a = comm_test_coll(g, GT_OP_ALL_TO_ALL_START, a, 1, 1);
    gt_value_id e = gt_unary(g, GT_OP_EXP, a);
    gt_value_id r = with_colls ? comm_test_coll(g, GT_OP_ALL_REDUCE_START, x, 0, 1) : x;
    gt_value_id y = gt_mul(g, e, r);
    gt_graph_add_output(g, GT_OUT_METRIC, "y", y);
    gt_graph_add_output(g, GT_OUT_METRIC, "a", a);
    return g;
}

static void test_identity(gt_dtype dt)
{
    gt_graph *g1 = build_identity_graph(true, dt), *g0 = build_identity_graph(false, dt);
    EXPECT(g1->err.code == GT_OK && g0->err.code == GT_OK, "build: %s", g1->err.msg);
    gt_error err = {0};
    int64_t shape[2] = {6, 5};
    gt_tensor in;
    gt_tensor_alloc(&in, dt, 2, shape, &err);
    for (int64_t i = 0; i < 30; i++)
        gt_tensor_set_f32(&in, i, (float)((i * 7) % 11) * 0.3f - 1.7f);
    gt_tensor ref[2] = {0}, ea[2] = {0}, pr[2] = {0};
    EXPECT_OK(gt_eager_run(g0, NULL, &in, ref, &err), &err);
    EXPECT_OK(gt_eager_run(g1, NULL, &in, ea, &err), &err);
    gt_program *prog = NULL;
    EXPECT_OK(gt_program_build(g1, NULL, &prog, &err), &err);
    if (prog) {
        EXPECT(gt_program_collectives(prog, false, NULL, 0) == 4, "four collectives");
        /* twice: the second run reuses the arenas and the request slots */
        gt_tensor first[2] = {0};
        EXPECT_OK(gt_program_run(prog, &in, first, &err), &err);
        EXPECT_OK(gt_program_run(prog, &in, pr, &err), &err);
        for (int k = 0; k < 2; k++) {
            EXPECT(first[k].data && pr[k].data &&
                       !memcmp(first[k].data, pr[k].data, gt_tensor_nbytes(&pr[k])),
                   "run == rerun, output %d", k);
            gt_tensor_free(&first[k]);
        }
    }
    for (int k = 0; k < 2; k++) {
        size_t nb = gt_tensor_nbytes(&ref[k]);
        EXPECT(ea[k].data && nb == gt_tensor_nbytes(&ea[k]) && !memcmp(ea[k].data, ref[k].data, nb),
               "%s output %d: eager with size-1 collectives == without", gt_dtype_name(dt), k);
        EXPECT(pr[k].data && nb == gt_tensor_nbytes(&pr[k]) && !memcmp(pr[k].data, ref[k].data, nb),
               "%s output %d: program with size-1 collectives == eager without", gt_dtype_name(dt),
               k);
        gt_tensor_free(&ref[k]);
        gt_tensor_free(&ea[k]);
        gt_tensor_free(&pr[k]);
    }
    gt_tensor_free(&in);
    gt_program_free(prog);
    gt_graph_free(g0);
    gt_graph_free(g1);
}

/* A widening reduce_scatter over one rank (gt_ops.def) is its input widened: eager, the program
 * (run twice) and the CPU kernel give the bits of cast(x, f32). */
static void test_widening_identity(gt_dtype dt)
{
    gt_graph *g1 = gt_graph_new(), *g0 = gt_graph_new();
    comm_test_set_mesh(g1, 1, 1, 1);
    gt_expr d[2] = {gt_c(g1, 6), gt_c(g1, 5)}, d0[2] = {gt_c(g0, 6), gt_c(g0, 5)};
    gt_value_id x1 = gt_graph_add_input(g1, GT_IN_INPUT, "x", dt, 2, d);
    gt_value_id s = scatter_to(g1, x1, 1, 1, GT_F32);
    gt_value_id win[2] = {s, x1};
    gt_graph_add_output(g1, GT_OUT_METRIC, "y",
                        gt_graph_add_node(g1, GT_OP_WAIT, win, 2, NULL, NULL));
    gt_value_id x0 = gt_graph_add_input(g0, GT_IN_INPUT, "x", dt, 2, d0);
    gt_graph_add_output(g0, GT_OUT_METRIC, "y", gt_cast(g0, x0, GT_F32));
    EXPECT(g1->err.code == GT_OK && g0->err.code == GT_OK, "build: %s %s", g1->err.msg,
           g0->err.msg);
    gt_error err = {0};
    int64_t shape[2] = {6, 5};
    gt_tensor in, ref = {0}, ea = {0}, pr = {0}, ker;
    gt_tensor_alloc(&in, dt, 2, shape, &err);
    gt_tensor_alloc(&ker, GT_F32, 2, shape, &err);
    for (int64_t i = 0; i < 30; i++)
        gt_tensor_set_f32(&in, i, (float)((i * 7) % 11) * 0.3f - 1.7f + (float)i * 1e-4f);
    EXPECT_OK(gt_eager_run(g0, NULL, &in, &ref, &err), &err);
    EXPECT_OK(gt_eager_run(g1, NULL, &in, &ea, &err), &err);
    gt_program *prog = NULL;
    EXPECT_OK(gt_program_build(g1, NULL, &prog, &err), &err);
    for (int run = 0; prog && run < 2; run++) {
        gt_tensor_free(&pr);
        EXPECT_OK(gt_program_run(prog, &in, &pr, &err), &err);
    }
    int64_t attrs[3] = {1, 1, GT_F32};
    gt_kernel_call call = {
        .op = GT_OP_REDUCE_SCATTER_START, .i = attrs, .ni = 3, .n_in = 1, .n_out = 1};
    call.in[0] = &in;
    call.out[0] = &ker;
    EXPECT_OK(gt_cpu_run_kernel(&call, &err), &err);
    size_t nb = gt_tensor_nbytes(&ref);
    EXPECT(ref.dtype == GT_F32 && nb == 30 * 4, "reference is f32");
    EXPECT(ea.data && ea.dtype == GT_F32 && !memcmp(ea.data, ref.data, nb),
           "%s: eager widening scatter over one rank == cast", gt_dtype_name(dt));
    EXPECT(pr.data && pr.dtype == GT_F32 && !memcmp(pr.data, ref.data, nb),
           "%s: program widening scatter over one rank == cast", gt_dtype_name(dt));
    EXPECT(!memcmp(ker.data, ref.data, nb), "%s: CPU kernel over one rank == cast",
           gt_dtype_name(dt));
    gt_tensor_free(&in), gt_tensor_free(&ref), gt_tensor_free(&ea), gt_tensor_free(&pr);
    gt_tensor_free(&ker);
    gt_program_free(prog);
    gt_graph_free(g0);
    gt_graph_free(g1);
}

/* ---------------------------------------------------------------- remat */

/* A backward all_reduce of a recomputed forward value: remat rewires the start, and the wait's
 * input 1 follows it (the graph verifies and computes the same bits). */
static void test_remat(void)
{
    gt_graph *g = gt_graph_new();
    gt_expr d[2] = {gt_c(g, 4), gt_c(g, 4)};
    gt_value_id x = gt_graph_add_input(g, GT_IN_INPUT, "x", GT_F32, 2, d);
    gt_graph_set_fqn(g, "layers.0");
    gt_value_id a = gt_unary(g, GT_OP_NEG, x);
    gt_graph_add_tag(g, g->values[a].producer, "recompute");
    gt_value_id y = gt_unary(g, GT_OP_EXP, a);
    g->cur_phase = GT_PHASE_BACKWARD;
    gt_value_id w = comm_test_coll(g, GT_OP_ALL_REDUCE_START, a, 0, 1);
    gt_value_id z = gt_mul(g, w, y);
    gt_graph_add_output(g, GT_OUT_METRIC, "z", z);
    EXPECT(g->err.code == GT_OK, "build: %s", g->err.msg);
    gt_error err = {0};
    int64_t shape[2] = {4, 4};
    gt_tensor in, before = {0}, after = {0};
    gt_tensor_alloc(&in, GT_F32, 2, shape, &err);
    for (int64_t i = 0; i < 16; i++)
        gt_tensor_set_f32(&in, i, (float)i * 0.1f - 0.8f);
    EXPECT_OK(gt_eager_run(g, NULL, &in, &before, &err), &err);
    gt_pass_ctx ctx = {0};
    EXPECT_OK(gt_pass_remat(g, &ctx, &err), &err);
    EXPECT_OK(gt_graph_verify(g, &err), &err);
    const gt_node *wait = NULL, *start = NULL;
    for (gt_node_id n = 0; n < g->n_nodes; n++)
        if (g->nodes[n].op == GT_OP_WAIT) wait = &g->nodes[n];
    if (wait) start = &g->nodes[g->values[wait->in[0]].producer];
    EXPECT(start && start->in[0] != a && wait->in[1] == start->in[0],
           "the start reads the recomputed copy and its wait keeps that copy alive");
    gt_program *prog = NULL;
    EXPECT_OK(gt_program_build(g, NULL, &prog, &err), &err);
    if (prog) EXPECT_OK(gt_program_run(prog, &in, &after, &err), &err);
    EXPECT(after.data && before.data && !memcmp(after.data, before.data, 64),
           "remat program == eager before remat");
    gt_program_free(prog);
    gt_tensor_free(&in);
    gt_tensor_free(&before);
    gt_tensor_free(&after);
    gt_graph_free(g);
}

/* ---------------------------------------------------------------- communicators and schedule */

static bool same_entry(const gt_comm_sched_entry *a, const gt_comm_sched_entry *b)
{
    return a->kind == b->kind && a->group == b->group && a->bytes == b->bytes &&
           a->place == b->place;
}

static void test_comms_and_schedule(void)
{
    /* mesh (1, 2, 2): gather over dp_shard, scatter over tp, all_reduce over dp_shard */
    gt_graph *g = gt_graph_new();
    comm_test_set_mesh(g, 1, 2, 2);
    gt_expr d[2] = {gt_c(g, 8), gt_c(g, 4)};
    gt_value_id x = gt_graph_add_input(g, GT_IN_INPUT, "x", GT_F32, 2, d);
    gt_value_id a = comm_test_coll(g, GT_OP_ALL_GATHER_START, x, 1, 2);     /* [16, 4] */
    gt_value_id b = comm_test_coll(g, GT_OP_REDUCE_SCATTER_START, a, 2, 2); /* [8, 4] */
    gt_value_id c = comm_test_coll(g, GT_OP_ALL_REDUCE_START, b, 1, 2);
    gt_graph_add_output(g, GT_OUT_METRIC, "c", c);
    gt_program *prog = build_program(g);
    if (!prog) return;
    gt_error err = {0};
    int64_t shape[2] = {8, 4};
    gt_tensor in, out = {0};
    gt_tensor_alloc(&in, GT_F32, 2, shape, &err);
    memset(in.data, 0, gt_tensor_nbytes(&in));
    gt_error e = {0};
    EXPECT(gt_program_run(prog, &in, &out, &e) == GT_ERR_INVALID &&
               strstr(e.msg, "needs a communicator") && strstr(e.msg, "dp_shard") &&
               strstr(e.msg, "all_gather_start"),
           "run with no communicator: %s", e.msg);
    gt_error e2 = {0};
    EXPECT(gt_eager_run(g, NULL, &in, &out, &e2) == GT_ERR_INVALID &&
               strstr(e2.msg, "needs a communicator") && strstr(e2.msg, "all_gather_start"),
           "eager with no communicator: %s", e2.msg);

    gt_comm *two = NULL, *three = NULL;
    EXPECT_OK(gt_comm_fake_create(2, 0, &two, &err), &err);
    EXPECT_OK(gt_comm_fake_create(3, 0, &three, &err), &err);
    gt_comm *ok[GT_MESH_MAX_DIMS] = {NULL, two, two, NULL};
    gt_comm *missing[GT_MESH_MAX_DIMS] = {NULL, two, NULL, NULL};
    gt_comm *wrong[GT_MESH_MAX_DIMS] = {NULL, two, three, NULL};
    gt_error e3 = {0}, e4 = {0};
    EXPECT(gt_program_set_comms(prog, missing, &e3) == GT_ERR_INVALID && strstr(e3.msg, "tp"),
           "missing communicator for tp: %s", e3.msg);
    EXPECT(gt_program_set_comms(prog, wrong, &e4) == GT_ERR_INVALID && strstr(e4.msg, "tp") &&
               strstr(e4.msg, "3"),
           "3-rank communicator for tp of 2: %s", e4.msg);
    EXPECT_OK(gt_program_set_comms(prog, ok, &err), &err);
    EXPECT(prog->comms[1] == two && prog->comms[2] == two, "communicators attached");

    gt_comm_sched_entry s[8];
    int32_t n = gt_program_collectives(prog, false, s, 8);
    uint64_t h_shard = gt_hash_str("dp_shard"), h_tp = gt_hash_str("tp");
    EXPECT(n == 3, "three collectives, got %d", n);
    if (n == 3) {
        EXPECT(s[0].kind == GT_COLL_ALL_GATHER && s[0].group == h_shard && s[0].bytes == 8 * 4 * 4,
               "entry 0: all_gather over dp_shard, 128 bytes (%llu)",
               (unsigned long long)s[0].bytes);
        EXPECT(s[1].kind == GT_COLL_REDUCE_SCATTER && s[1].group == h_tp &&
                   s[1].bytes == 16 * 4 * 4,
               "entry 1: reduce_scatter over tp, 256 bytes (%llu)", (unsigned long long)s[1].bytes);
        EXPECT(s[2].kind == GT_COLL_ALL_REDUCE && s[2].group == h_shard && s[2].bytes == 8 * 4 * 4,
               "entry 2: all_reduce over dp_shard, 128 bytes");
    }
    /* with places (symmetric windows): every entry names where its buffers lie, and a buffer
     * planned elsewhere gives another place */
    gt_comm_sched_entry sp[8], moved[8];
    int32_t np = gt_program_collectives(prog, true, sp, 8);
    gt_instr *first = NULL;
    for (int32_t k = 0; k < prog->n_instrs && !first; k++)
        if (gt_op_is_collective_start(prog->instrs[k].op)) first = &prog->instrs[k];
    if (first) first->out[0].offset += 256;
    gt_program_collectives(prog, true, moved, 8);
    if (first) first->out[0].offset -= 256;
    EXPECT(np == 3 && s[0].place == 0 && sp[0].place != 0 && sp[1].place != 0 && sp[2].place != 0 &&
               sp[0].bytes == s[0].bytes && moved[0].place != sp[0].place &&
               moved[1].place == sp[1].place,
           "places: %d entries, %016llx %016llx %016llx; output moved: %016llx", np,
           (unsigned long long)sp[0].place, (unsigned long long)sp[1].place,
           (unsigned long long)sp[2].place, (unsigned long long)moved[0].place);
    int32_t n_instrs = prog->n_instrs;
    gt_error e5 = {0};
    EXPECT(gt_program_drop_collective(prog, 3, &e5) == GT_ERR_INVALID && strstr(e5.msg, "#3"),
           "drop out of range: %s", e5.msg);
    EXPECT_OK(gt_program_drop_collective(prog, 1, &err), &err);
    gt_comm_sched_entry t[8];
    int32_t m = gt_program_collectives(prog, false, t, 8);
    EXPECT(m == 2 && prog->n_instrs == n_instrs - 2 && n == 3 && same_entry(&t[0], &s[0]) &&
               same_entry(&t[1], &s[2]),
           "after dropping #1: %d collectives, %d instructions (was %d)", m, prog->n_instrs,
           n_instrs);
    for (int32_t k = 0; k < prog->n_instrs; k++)
        EXPECT(prog->instrs[k].op != GT_OP_REDUCE_SCATTER_START,
               "the reduce_scatter's start is gone");
    EXPECT_OK(gt_program_set_comms(prog, NULL, &err), &err);
    EXPECT(prog->comms[1] == NULL, "comms cleared");

    gt_tensor_free(&in);
    gt_comm_destroy(two);
    gt_comm_destroy(three);
    gt_program_free(prog);
    gt_graph_free(g);
}

int main(void)
{
    test_shape_rules();
    test_widening_rules();
    test_printer();
    test_cse_keeps_gathers();
    test_plan();
    test_identity(GT_F32);
    test_identity(GT_BF16);
    test_widening_identity(GT_BF16);
    test_widening_identity(GT_F16);
    test_remat();
    test_comms_and_schedule();
    return gt_test_finish();
}
