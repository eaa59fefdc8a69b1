/* test_op_table.c — properties the columns of gt_ops.def must keep, now that the table is the
 * only place that says which ops move bytes, alias, cost what to recompute and shard by which
 * rule: alias pairs index existing slots, moves-bytes ops count no FLOPs, collective starts and
 * elementwise ops have the rules they should, the recompute classes agree with the flags. */
#include <string.h>

#include "graphtrain/gt_build.h"
#include "graphtrain/gt_flops.h"
#include "graphtrain/gt_graph.h"
#include "gt_test.h"
#include "parallel/parallel_internal.h"

/* A node of op with the table's arity; variadic counts get 3 slots (outputs 2). */
static gt_node fake_node(gt_op op)
{
    const gt_op_info *info = gt_op_get(op);
    gt_node n;
    memset(&n, 0, sizeof n);
    n.op = op;
    n.n_in = (uint8_t)(info->n_in < 0 ? 3 : info->n_in);
    n.n_out = (uint8_t)(info->n_out < 0 ? 2 : info->n_out);
    return n;
}

static void test_alias_pairs(void)
{
    for (int k = 0; k < GT_OP_COUNT; k++) {
        const gt_op_info *info = gt_op_get((gt_op)k);
        gt_node n = fake_node((gt_op)k);
        int pairs[GT_MAX_IN * GT_MAX_OUT][2];
        int np = gt_op_alias_pairs(&n, pairs);
        EXPECT((np == 0) == (info->alias == GT_ALIAS_NONE), "%s: pairs iff an alias kind",
               info->name);
        for (int j = 0; j < np; j++)
            EXPECT(pairs[j][0] >= 0 && pairs[j][0] < n.n_out && pairs[j][1] >= 0 &&
                       pairs[j][1] < n.n_in,
                   "%s: pair %d (%d=%d) indexes existing slots", info->name, j, pairs[j][0],
                   pairs[j][1]);
        switch (info->alias) {
        case GT_ALIAS_VIEW:
        case GT_ALIAS_VIEW_RUN:
        case GT_ALIAS_RESULT: /* plan.c shares one output's buffer with one input's */
            EXPECT(np == 1, "%s: one view pair", info->name);
            break;
        case GT_ALIAS_PACK: /* the inputs go inside output 0 */
            for (int j = 0; j < np; j++)
                EXPECT(pairs[j][0] == 0, "%s: packs into output 0", info->name);
            break;
        default:
            break;
        }
        /* an in-place kernel reads element i before it writes it: only where an output has
         * the input's shape, which a reduction or a collective does not keep */
        if (info->alias == GT_ALIAS_IN_PLACE || info->alias == GT_ALIAS_STATE)
            EXPECT(!(info->flags & (GT_OPF_REDUCTION | GT_OPF_COLLECTIVE)), "%s: in place",
                   info->name);
    }
    /* '*' expands over the node's own slots, outputs outer */
    gt_node n = fake_node(GT_OP_FUSED_ELEMENTWISE);
    n.n_in = 2, n.n_out = 2;
    int pairs[GT_MAX_IN * GT_MAX_OUT][2];
    EXPECT(gt_op_alias_pairs(&n, pairs) == 4 && pairs[1][0] == 0 && pairs[1][1] == 1 &&
               pairs[2][0] == 1 && pairs[2][1] == 0,
           "fused_elementwise: every output over every input");
    n = fake_node(GT_OP_ADAMW);
    EXPECT(gt_op_alias_pairs(&n, pairs) == 3 && pairs[1][0] == 1 && pairs[1][1] == 2 &&
               pairs[2][0] == 2 && pairs[2][1] == 3,
           "adamw: p' over p, m' over m, v' over v");
}

static void test_flags_and_classes(void)
{
    gt_shard_rule elementwise = gt_shard_rule_for(GT_OP_ADD);
    for (int k = 0; k < GT_OP_COUNT; k++) {
        gt_op op = (gt_op)k;
        const gt_op_info *info = gt_op_get(op);
        EXPECT(gt_shard_rule_for(op) != NULL, "%s has a sharding rule", info->name);
        if (info->flags & GT_OPF_ELEMENTWISE)
            EXPECT(gt_shard_rule_for(op) == elementwise, "%s: the elementwise rule", info->name);
        /* a start's collective writes its output while the input is still read, so the two
         * never share bytes; but a send's output is its input, which it only reads (RESULT) */
        if (gt_op_is_collective_start(op))
            EXPECT((info->flags & GT_OPF_COLLECTIVE) &&
                       info->alias == (op == GT_OP_SEND_START ? GT_ALIAS_RESULT : GT_ALIAS_NONE) &&
                       gt_shard_rule_for(op) != NULL,
                   "%s: a collective start, with a rule, never in place (a send: its input)",
                   info->name);
        if (info->flags & GT_OPF_COLLECTIVE)
            EXPECT(gt_op_is_collective_start(op) || op == GT_OP_WAIT, "%s: start or wait",
                   info->name);
        EXPECT(!((info->flags & GT_OPF_MOVES_BYTES) && (info->flags & GT_OPF_NO_WIDEN)),
               "%s: NO_WIDEN is for ops that are not MOVES_BYTES", info->name);
        /* a view moves nothing and recomputing it is free; nothing else is free */
        EXPECT(!(info->flags & GT_OPF_VIEW) || (info->flags & GT_OPF_MOVES_BYTES), "%s: view",
               info->name);
        EXPECT((info->recompute == GT_RECOMPUTE_FREE) == ((info->flags & GT_OPF_VIEW) != 0),
               "%s: FREE iff a view", info->name);
        if (info->alias == GT_ALIAS_VIEW)
            EXPECT(info->flags & GT_OPF_VIEW, "%s: a VIEW alias is a view op", info->name);
        EXPECT(info->recompute != GT_RECOMPUTE_FLOPS || !(info->flags & GT_OPF_MOVES_BYTES),
               "%s: FLOPS but moves bytes", info->name);
        EXPECT(info->recompute != GT_RECOMPUTE_KEEP_PARAM || info->n_in >= 1,
               "%s: KEEP_PARAM reads input 0", info->name);
    }
}

/* Every op flagged moves-bytes, built once: the FLOP counter gives the graph 0, and an op
 * without the flag counts one per output element. */
static void test_moves_bytes_counts_no_flops(void)
{
    gt_graph *g = gt_graph_new();
    gt_expr d4 = gt_c(g, 4), d8 = gt_c(g, 8), d2 = gt_c(g, 2);
    gt_value_id x = gt_graph_add_input(g, GT_IN_INPUT, "x", GT_F32, 2, (gt_expr[]){d4, d8});
    gt_value_id v[16];
    int nv = 0;
    v[nv++] = gt_full(g, GT_F32, 2, (gt_expr[]){d4, d8}, 1.0);
    v[nv++] = gt_cast(g, x, GT_BF16);
    v[nv++] = gt_broadcast_to(g, x, 3, (gt_expr[]){d2, d4, d8});
    v[nv++] = gt_reshape(g, x, 2, (gt_expr[]){d8, d4});
    v[nv++] = gt_regroup(g, x, 3, (gt_expr[]){d2, d2, d8});
    v[nv++] = gt_transpose(g, x, 0, 1);
    v[nv++] = gt_permute(g, x, 2, (int[]){1, 0});
    gt_value_id sl = gt_slice(g, x, 1, gt_c(g, 0), d4);
    v[nv++] = sl;
    v[nv++] = gt_slice_backward(g, sl, 1, gt_c(g, 0), d4, d8);
    v[nv++] = gt_concat(g, 2, (gt_value_id[]){x, x}, 0);
    gt_value_id parts[2];
    v[nv++] = gt_split(g, x, 1, 2, (gt_expr[]){d4, d4}, parts);
    /* expert parallel's row moves: 2 ranks, 2 experts each, 2 rows per rank pair */
    gt_value_id table =
        gt_graph_add_input(g, GT_IN_INPUT, "table", GT_I32, 2, (gt_expr[]){d4, gt_c(g, 3)});
    gt_value_id packed = gt_moe_pack(g, x, table, 2, d2, d2, gt_c(g, 0));
    v[nv++] = packed;
    v[nv++] = gt_moe_unpack(g, packed, table, 2, d4, gt_c(g, 0));
    EXPECT(g->err.code == GT_OK, "built: %s", g->err.msg);
    for (int k = 0; k < nv; k++)
        EXPECT(v[k] != GT_NONE, "moves-bytes value %d built", k);

    bool seen[GT_OP_COUNT] = {false};
    for (gt_node_id n = 0; n < g->n_nodes; n++)
        seen[g->nodes[n].op] = true;
    for (int k = 0; k < GT_OP_COUNT; k++)
        if (gt_op_get((gt_op)k)->flags & GT_OPF_MOVES_BYTES)
            EXPECT(seen[k], "%s is flagged moves-bytes: add it to this graph",
                   gt_op_get((gt_op)k)->name);

    gt_sym_binding none = {0};
    gt_flops f;
    gt_error err = {0};
    EXPECT_OK(gt_graph_count_flops(g, &none, &f, &err), &err);
    EXPECT(f.total == 0 && f.other == 0, "moves-bytes ops count no FLOPs (%g)", f.total);

    EXPECT(gt_unary(g, GT_OP_EXP, x) != GT_NONE, "exp built");
    EXPECT_OK(gt_graph_count_flops(g, &none, &f, &err), &err);
    EXPECT(f.total == 32 && f.other == 32, "exp counts one per element (%g)", f.total);
    gt_graph_free(g);
}

int main(void)
{
    test_alias_pairs();
    test_flags_and_classes();
    test_moves_bytes_counts_no_flops();
    return gt_test_finish();
}
