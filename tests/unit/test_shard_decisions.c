/* test_shard_decisions.c — what the sharding rules (src/parallel/rules*.c) choose on the patterns
 * that make parallelism cheap, asked directly through gt_shard_rule_for on a 2-way mesh dim:
 * FSDP gathers the weight and keeps the batch split; tensor-parallel matmuls stay local, and on
 * the tp dim a conflict gathers the activation, never the weight; reshapes keep a split of the
 * outermost dim of a merge or split; a mean over a split dim is partial times 1/n; sequence
 * parallel reduce-scatters partial [b, s, D] activations along s for norms and non-linear ops
 * while sums of partials stay partial; a widening cast keeps a partial (gradients reduce-scatter
 * in f32); vocabulary-parallel embedding, embedding gradient and loss; an embedding stored by
 * columns gathers the ids, not the table, and its gradient is the shard; adamw follows its
 * parameter; sdpa splits by batch or heads in both layouts (heads at their own dim in each
 * operand). And the parallelized vocabulary-parallel loss + backward: one global log-sum-exp
 * shared by both, and the only gather before the loss is of the per-rank log-sum-exps — the
 * logits are never gathered.
 *
 * Correctness of every rule on data is tests/unit/test_shard_rules.c; this file pins the choices
 * that correctness alone does not (gathering everything is always correct, just slow). */
#include <string.h>

#include "graphtrain/gt_build.h"
#include "graphtrain/gt_parallel.h"
#include "gt_test.h"
#include "parallel/parallel_internal.h"

#define NRANK 2
#define IGNORE (-100)

static gt_value_id input(gt_graph *g, gt_input_kind kind, const char *name, gt_dtype dt, int ndim,
                         const int64_t *dims)
{
    gt_expr e[GT_MAX_DIMS];
    for (int k = 0; k < ndim; k++)
        e[k] = gt_c(g, dims[k]);
    return gt_graph_add_input(g, kind, name, dt, ndim, e);
}
#define DIMS(...)                                                                                  \
    (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (int64_t[])                         \
    {                                                                                              \
        __VA_ARGS__                                                                                \
    }
#define X(g, name, ...) input(g, GT_IN_INPUT, name, GT_F32, DIMS(__VA_ARGS__))
#define IDS(g, name, ...) input(g, GT_IN_INPUT, name, GT_I64, DIMS(__VA_ARGS__))

static void output(gt_graph *g, gt_value_id v)
{
    char name[16];
    snprintf(name, sizeof name, "out%d", g->n_outputs);
    gt_graph_add_output(g, GT_OUT_METRIC, name, v);
}

static gt_value_id reshape_to(gt_graph *g, gt_value_id x, int nd, const int64_t *dims)
{
    gt_expr e[GT_MAX_DIMS];
    for (int k = 0; k < nd; k++)
        e[k] = gt_c(g, dims[k]);
    return gt_reshape(g, x, nd, e);
}

/* A new graph, remembered for freeing. */
static gt_graph *track(gt_graph **gs, int *n)
{
    GT_CHECK(*n < 32);
    return gs[(*n)++] = gt_graph_new();
}

typedef struct {
    gt_shard_ctx c;
    gt_placement in[GT_MAX_IN], prefer[GT_MAX_OUT];
    bool weight[GT_MAX_IN];
} asked;

/* Asks the rule of g's last node on mesh dim md of size 2 with input placements in. */
static void ask_on(asked *a, const gt_graph *g, int md, bool sp, const gt_placement *in,
                   const bool *weight, gt_placement prefer)
{
    const gt_node *n = &g->nodes[g->n_nodes - 1];
    memset(a, 0, sizeof *a);
    for (int k = 0; k < n->n_in; k++) {
        a->in[k] = in[k];
        a->weight[k] = weight && weight[k];
    }
    for (int j = 0; j < n->n_out; j++)
        a->prefer[j] = prefer;
    a->c = (gt_shard_ctx){.g = g,
                          .n = n,
                          .mesh_dim = md,
                          .group_size = NRANK,
                          .in = a->in,
                          .weight = a->weight,
                          .prefer = a->prefer,
                          .sequence_parallel = sp,
                          .out_scale = 1.0};
    for (int k = 0; k < n->n_in; k++) {
        a->c.want[k] = in[k];
        a->c.in_scale[k] = 1.0;
    }
    for (int j = 0; j < n->n_out; j++)
        a->c.settle[j] = (gt_placement){GT_PLACE_NONE, 0, 0, 0};
    gt_error err = {0};
    EXPECT_OK(gt_shard_rule_for(n->op)(&a->c, &err), &err);
}

/* The same on dp_shard. */
static void ask(asked *a, const gt_graph *g, const gt_placement *in, const bool *weight,
                gt_placement prefer)
{
    ask_on(a, g, GT_MESH_DP_SHARD, false, in, weight, prefer);
}

static bool same(gt_placement a, gt_placement b)
{
    return gt_place_equal(a, b);
}

#define R gt_place_replicate()
#define P gt_place_partial()
#define S(d) gt_place_shard(d, 0)
static const gt_placement NONE = {GT_PLACE_NONE, 0, 0, 0};

static void test_decisions(void)
{
    asked a;
    gt_graph *gs[32], *g;
    int ng = 0;

    /* FSDP: activation rows split, weight stored S(0): gather the weight, keep the rows */
    g = track(gs, &ng);
    gt_matmul(g, X(g, "x", 4, 6), input(g, GT_IN_PARAM, "w", GT_F32, DIMS(8, 6)), false, true);
    ask(&a, g, (gt_placement[]){S(0), S(0)}, (bool[]){false, true}, NONE);
    EXPECT(same(a.c.want[0], S(0)) && same(a.c.want[1], R) && same(a.c.out[0], S(0)),
           "FSDP matmul gathers the weight only");
    /* column-wise tensor parallel: x R, w S(0) (N) -> S(last), nothing moves */
    ask(&a, g, (gt_placement[]){R, S(0)}, (bool[]){false, true}, NONE);
    EXPECT(same(a.c.want[1], S(0)) && same(a.c.out[0], S(1)), "column-wise matmul stays local");
    /* row-wise: x S(K), w S(K) -> P */
    ask(&a, g, (gt_placement[]){S(1), S(1)}, (bool[]){false, true}, NONE);
    EXPECT(same(a.c.out[0], P) && same(a.c.want[0], S(1)), "row-wise matmul gives P");
    /* a shard's nesting order passes through */
    ask(&a, g, (gt_placement[]){gt_place_shard(0, 1), R}, (bool[]){false, true}, NONE);
    EXPECT(same(a.c.out[0], gt_place_shard(0, 1)), "order kept through matmul");

    /* on tp the weight keeps its shard: a sequence-split activation is gathered instead */
    g = track(gs, &ng);
    gt_matmul(g, X(g, "x", 2, 4, 6), input(g, GT_IN_PARAM, "w", GT_F32, DIMS(8, 6)), false, true);
    ask_on(&a, g, GT_MESH_TP, true, (gt_placement[]){S(1), S(0)}, (bool[]){false, true}, NONE);
    EXPECT(same(a.c.want[0], R) && same(a.c.want[1], S(0)) && same(a.c.out[0], S(2)),
           "tp matmul gathers the activation, keeps the column-wise weight");
    ask_on(&a, g, GT_MESH_TP, true, (gt_placement[]){S(1), S(1)}, (bool[]){false, true}, NONE);
    EXPECT(same(a.c.want[0], S(2)) && same(a.c.want[1], S(1)) && same(a.c.out[0], P),
           "tp matmul meets a row-wise weight with the activation's K block");
    ask_on(&a, g, GT_MESH_DP_SHARD, false, (gt_placement[]){S(1), S(0)}, (bool[]){false, true},
           NONE);
    EXPECT(same(a.c.want[0], S(1)) && same(a.c.want[1], R), "dp_shard matmul gathers the weight");

    /* sequence parallel: a partial [b, s, D] is reduce-scattered along s for a norm or a
     * non-linear op, and stays partial through a sum */
    g = track(gs, &ng);
    gt_rms_norm(g, X(g, "x", 2, 4, 6), X(g, "w", 6), 1e-5);
    ask_on(&a, g, GT_MESH_TP, true, (gt_placement[]){P, R}, NULL, NONE);
    EXPECT(same(a.c.want[0], S(1)) && same(a.c.out[0], S(1)), "sequence-parallel norm: S(1)");
    ask_on(&a, g, GT_MESH_TP, false, (gt_placement[]){P, R}, NULL, NONE);
    EXPECT(same(a.c.want[0], R) && same(a.c.out[0], R), "plain tensor-parallel norm: R");
    g = track(gs, &ng);
    gt_value_id h = X(g, "h", 2, 4, 6);
    gt_add(g, h, X(g, "o", 2, 4, 6));
    ask_on(&a, g, GT_MESH_TP, true, (gt_placement[]){P, P}, NULL, NONE);
    EXPECT(same(a.c.out[0], P), "a sum of partials stays partial");
    ask_on(&a, g, GT_MESH_TP, true, (gt_placement[]){R, P}, NULL, NONE);
    EXPECT(same(a.c.want[0], S(1)) && same(a.c.want[1], S(1)) && same(a.c.out[0], S(1)),
           "replicate + partial under sequence parallel: S(1)");
    gt_unary(g, GT_OP_SILU, h);
    ask_on(&a, g, GT_MESH_TP, true, (gt_placement[]){P}, NULL, NONE);
    EXPECT(same(a.c.want[0], S(1)) && same(a.c.out[0], S(1)), "silu of a partial: S(1)");

    /* a widening cast of a partial stays partial (FSDP reduce-scatters in f32); narrowing gathers
     */
    g = track(gs, &ng);
    gt_cast(g, input(g, GT_IN_INPUT, "g", GT_BF16, DIMS(4, 6)), GT_F32);
    ask(&a, g, (gt_placement[]){P}, NULL, NONE);
    EXPECT(same(a.c.out[0], P), "bf16 -> f32 cast keeps P");
    gt_cast(g, X(g, "x", 4, 6), GT_BF16);
    ask(&a, g, (gt_placement[]){P}, NULL, NONE);
    EXPECT(same(a.c.want[0], R), "f32 -> bf16 cast of P gathers");

    /* weight gradient dy^T @ x with both rows split: P */
    g = track(gs, &ng);
    gt_matmul(g, X(g, "dy", 4, 8), X(g, "x", 4, 6), true, false);
    ask(&a, g, (gt_placement[]){S(0), S(0)}, NULL, NONE);
    EXPECT(same(a.c.out[0], P) && same(a.c.want[0], S(0)) && same(a.c.want[1], S(0)),
           "dW = dy^T x over split rows is P");

    /* reshapes */
    g = track(gs, &ng);
    reshape_to(g, X(g, "x", 2, 4, 6), 2, (int64_t[]){8, 6});
    ask(&a, g, (gt_placement[]){S(0)}, NULL, NONE);
    EXPECT(same(a.c.out[0], S(0)) && same(a.c.want[0], S(0)), "[b,s,D] S(0) -> [b*s,D] S(0)");
    ask(&a, g, (gt_placement[]){S(1)}, NULL, NONE);
    EXPECT(same(a.c.want[0], R), "[b,s,D] S(1) -> [b*s,D] gathers");
    g = track(gs, &ng);
    reshape_to(g, X(g, "x", 2, 4, 6), 4, (int64_t[]){2, 4, 2, 3});
    ask(&a, g, (gt_placement[]){S(2)}, NULL, NONE);
    EXPECT(same(a.c.out[0], S(2)) && same(a.c.want[0], S(2)), "[b,s,H*hd] S(2) -> [b,s,H,hd] S(2)");

    /* a mean over a split dim: P scaled by 1/n */
    g = track(gs, &ng);
    gt_reduce(g, GT_OP_MEAN, X(g, "x", 4, 6), 1, (int[]){0}, false);
    ask(&a, g, (gt_placement[]){S(0)}, NULL, NONE);
    EXPECT(same(a.c.out[0], P) && a.c.out_scale == 0.5, "mean over a split dim: P * 1/2");

    /* vocabulary parallel */
    g = track(gs, &ng);
    gt_embedding(g, input(g, GT_IN_PARAM, "emb", GT_F32, DIMS(6, 4)), IDS(g, "ids", 2, 3));
    ask(&a, g, (gt_placement[]){S(0), R}, (bool[]){true, false}, NONE);
    EXPECT(a.c.vocab && same(a.c.out[0], P) && same(a.c.want[0], S(0)),
           "embedding w S(0), ids R: vocabulary-parallel P");
    ask(&a, g, (gt_placement[]){S(0), S(0)}, (bool[]){true, false}, NONE);
    EXPECT(!a.c.vocab && same(a.c.want[0], R) && same(a.c.out[0], S(0)),
           "embedding w S(0), ids S(0): gather the table");
    ask(&a, g, (gt_placement[]){S(1), S(0)}, (bool[]){true, false}, NONE);
    EXPECT(!a.c.vocab && same(a.c.want[0], S(1)) && same(a.c.want[1], R) &&
               same(a.c.out[0], S(2)) && same(a.c.settle[0], S(0)),
           "embedding w S(1), ids S(0): gather the ids, look up columns, settle to the tokens' "
           "split");
    g = track(gs, &ng);
    gt_embedding_backward(g, IDS(g, "ids", 2, 3), X(g, "dy", 2, 3, 4), gt_c(g, 6));
    ask(&a, g, (gt_placement[]){R, R}, NULL, gt_place_shard(0, 1));
    EXPECT(a.c.vocab && same(a.c.out[0], gt_place_shard(0, 1)),
           "embedding_backward to a S(0) parameter: vocabulary-parallel, keeps the order");
    ask(&a, g, (gt_placement[]){R, S(1)}, NULL, S(0));
    EXPECT(a.c.vocab && same(a.c.want[1], R), "embedding_backward gathers dy rather than P [V, D]");
    ask(&a, g, (gt_placement[]){S(0), S(0)}, NULL, S(0));
    EXPECT(!a.c.vocab && same(a.c.out[0], P), "data-parallel embedding_backward: P");
    ask(&a, g, (gt_placement[]){S(0), S(0)}, NULL, S(1));
    EXPECT(!a.c.vocab && same(a.c.want[0], R) && same(a.c.want[1], S(2)) && same(a.c.out[0], S(1)),
           "embedding_backward to a S(1) parameter: ids gathered, dy by columns, S(1) not P");
    g = track(gs, &ng);
    gt_value_id lg = X(g, "logits", 4, 6), tg = IDS(g, "targets", 4);
    gt_cross_entropy(g, lg, tg, IGNORE);
    ask(&a, g, (gt_placement[]){S(1), R}, NULL, NONE);
    EXPECT(a.c.vocab && same(a.c.out[0], P) && same(a.c.want[0], S(1)),
           "cross_entropy logits S(1): vocabulary-parallel, logits not gathered");
    ask(&a, g, (gt_placement[]){S(0), S(0)}, NULL, NONE);
    EXPECT(same(a.c.out[0], P) && a.c.out_scale == 0.5, "data-parallel cross_entropy: P * 1/2");
    gt_cross_entropy_backward(g, lg, tg, input(g, GT_IN_INPUT, "dl", GT_F32, 0, NULL), IGNORE);
    ask(&a, g, (gt_placement[]){S(1), R, R}, NULL, NONE);
    EXPECT(a.c.vocab && same(a.c.out[0], S(1)), "cross_entropy_backward: vocabulary S(1)");
    ask(&a, g, (gt_placement[]){S(0), S(0), R}, NULL, NONE);
    EXPECT(same(a.c.out[0], S(0)) && a.c.in_scale[2] == 0.5,
           "data-parallel cross_entropy_backward scales dloss by 1/2");

    /* adamw follows the parameter; the parallel ops only gather */
    g = track(gs, &ng);
    gt_value_id p = input(g, GT_IN_PARAM, "p", GT_F32, DIMS(4, 6));
    gt_adamw(g, p, X(g, "g", 4, 6), X(g, "m", 4, 6), X(g, "v", 4, 6), X(g, "s", 3),
             input(g, GT_IN_INPUT, "clip", GT_F32, 0, NULL), 0.9, 0.95, 1e-8, 0.1, NULL, NULL);
    ask(&a, g, (gt_placement[]){S(0), P, S(0), S(0), R, R}, NULL, NONE);
    EXPECT(same(a.c.want[1], S(0)) && same(a.c.out[0], S(0)) && same(a.c.out[2], S(0)),
           "adamw: the partial gradient is reduce-scattered to the parameter's shard");
    g = track(gs, &ng);
    gt_attrs none = {0};
    gt_value_id xin = X(g, "x", 4, 6);
    gt_graph_add_node(g, GT_OP_LOGSUMEXP, &xin, 1, &none, NULL);
    ask(&a, g, (gt_placement[]){S(0)}, NULL, NONE);
    EXPECT(same(a.c.want[0], R) && same(a.c.out[0], R), "a parallel op in a global graph gathers");

    for (int k = 0; k < ng; k++)
        gt_graph_free(gs[k]);
}

/* The vocabulary-parallel loss and its backward share one global log-sum-exp, and the only
 * gather in the forward is of the per-rank log-sum-exps ([1, N]), never of the logits. */
static void test_vocab_structure(void)
{
    gt_graph *g = gt_graph_new();
    gt_value_id lg = X(g, "logits", 4, 6), tg = IDS(g, "targets", 4);
    output(g, gt_cross_entropy(g, lg, tg, IGNORE));
    output(g, gt_cross_entropy_backward(g, lg, tg, input(g, GT_IN_INPUT, "dl", GT_F32, 0, NULL),
                                        IGNORE));
    gt_parallel_plan plan = {0};
    gt_error err = {0};
    GT_CHECK(gt_mesh_init(&plan.mesh, 1, 1, NRANK, &err) == GT_OK);
    gt_placement place[3][GT_MESH_MAX_DIMS] = {{{0}}};
    place[0][GT_MESH_TP] = S(1);
    gt_graph *lgph = NULL;
    EXPECT_OK(gt_parallelize(g, &plan, (const gt_placement(*)[GT_MESH_MAX_DIMS])place, &lgph, &err),
              &err);
    if (lgph) {
        int lse = 0, gathers = 0, shard_ops = 0;
        bool logits_gathered_before_loss = false;
        for (int i = 0; i < lgph->n_nodes; i++) {
            const gt_node *n = &lgph->nodes[i];
            lse += n->op == GT_OP_LOGSUMEXP;
            shard_ops +=
                n->op == GT_OP_CROSS_ENTROPY_SHARD || n->op == GT_OP_CROSS_ENTROPY_SHARD_BACKWARD;
            if (n->op != GT_OP_ALL_GATHER_START) continue;
            gathers++;
            const gt_type *t = gt_value_type(lgph, n->in[0]);
            int64_t rows;
            /* the gather of [1, N]; the output conversion of dlogits comes after the loss */
            if (gathers == 1)
                logits_gathered_before_loss =
                    !(t->ndim == 2 && gt_sym_is_const(lgph->sym, t->dims[0], &rows) && rows == 1);
        }
        EXPECT(lse == 2, "one global log-sum-exp for loss and backward (%d logsumexp nodes)", lse);
        EXPECT(shard_ops == 2, "cross_entropy_shard and its backward (%d)", shard_ops);
        EXPECT(!logits_gathered_before_loss, "the first gather is of the [1, N] log-sum-exps");
        gt_graph_free(lgph);
    }
    gt_graph_free(g);
}

/* sdpa splits along batch or heads, in either layout: heads are dim 1 of q, k, v, out in layout
 * 0 and dim 2 in layout 1, while lse ([b, h, s]) has them at dim 1 in both; a split sequence
 * gathers, and so does a head split when the kv heads do not divide. */
static void test_sdpa_decisions(void)
{
    asked a;
    gt_graph *gs[32], *g;
    int ng = 0;
    for (int layout = 0; layout < 2; layout++) {
        int hd = layout ? 2 : 1, sd = layout ? 1 : 2; /* heads and sequence dims of q, k, v, out */
        /* q [2, 4 heads, 3, 3], k, v [2, 2 heads, 3, 3] in layout 0; heads and seq swapped in 1 */
        g = track(gs, &ng);
        gt_value_id q = layout ? X(g, "q", 2, 3, 4, 3) : X(g, "q", 2, 4, 3, 3);
        gt_value_id k = layout ? X(g, "k", 2, 3, 2, 3) : X(g, "k", 2, 2, 3, 3);
        gt_value_id v = layout ? X(g, "v", 2, 3, 2, 3) : X(g, "v", 2, 2, 3, 3);
        gt_sdpa_layout(g, q, k, v, true, 0.5, layout, NULL);
        ask(&a, g, (gt_placement[]){S(hd), R, R}, NULL, NONE);
        EXPECT(same(a.c.want[0], S(hd)) && same(a.c.want[1], S(hd)) && same(a.c.want[2], S(hd)) &&
                   same(a.c.out[0], S(hd)) && same(a.c.out[1], S(1)),
               "layout %d sdpa: q split by heads -> k, v follow at dim %d, lse at dim 1", layout,
               hd);
        ask(&a, g, (gt_placement[]){R, R, S(0)}, NULL, NONE);
        EXPECT(same(a.c.want[0], S(0)) && same(a.c.want[1], S(0)) && same(a.c.out[0], S(0)) &&
                   same(a.c.out[1], S(0)),
               "layout %d sdpa: v split by batch -> all by batch", layout);
        ask(&a, g, (gt_placement[]){S(sd), R, R}, NULL, NONE);
        EXPECT(same(a.c.want[0], R) && same(a.c.out[0], R) && same(a.c.out[1], R),
               "layout %d sdpa: a split sequence gathers", layout);
        /* nesting order passes through to the moved dims */
        ask(&a, g, (gt_placement[]){R, gt_place_shard(hd, 1), R}, NULL, NONE);
        EXPECT(same(a.c.want[0], gt_place_shard(hd, 1)) && same(a.c.out[1], gt_place_shard(1, 1)),
               "layout %d sdpa: order kept", layout);

        /* backward: the lse input (index 4) split by heads drives the others to their heads dim */
        g = track(gs, &ng);
        q = layout ? X(g, "q", 2, 3, 4, 3) : X(g, "q", 2, 4, 3, 3);
        k = layout ? X(g, "k", 2, 3, 2, 3) : X(g, "k", 2, 2, 3, 3);
        v = layout ? X(g, "v", 2, 3, 2, 3) : X(g, "v", 2, 2, 3, 3);
        gt_value_id o = layout ? X(g, "out", 2, 3, 4, 3) : X(g, "out", 2, 4, 3, 3);
        gt_value_id dout = layout ? X(g, "dout", 2, 3, 4, 3) : X(g, "dout", 2, 4, 3, 3);
        gt_sdpa_backward_layout(g, q, k, v, o, X(g, "lse", 2, 4, 3), dout, true, 0.5, layout, NULL,
                                NULL);
        ask(&a, g, (gt_placement[]){R, R, R, R, S(1), R}, NULL, NONE);
        bool ok = same(a.c.want[4], S(1));
        for (int j = 0; j < 6; j++)
            ok = ok && (j == 4 || same(a.c.want[j], S(hd)));
        for (int j = 0; j < 3; j++)
            ok = ok && same(a.c.out[j], S(hd));
        EXPECT(ok, "layout %d sdpa_backward: lse split by heads -> the rest at dim %d", layout, hd);
        /* lse's dim 2 is its sequence in both layouts: gathers */
        ask(&a, g, (gt_placement[]){R, R, R, R, S(2), R}, NULL, NONE);
        EXPECT(same(a.c.want[4], R) && same(a.c.out[0], R),
               "layout %d sdpa_backward: lse split by sequence gathers", layout);

        /* one kv head does not split in two: a head split gathers */
        g = track(gs, &ng);
        q = layout ? X(g, "q", 2, 3, 4, 3) : X(g, "q", 2, 4, 3, 3);
        k = layout ? X(g, "k", 2, 3, 1, 3) : X(g, "k", 2, 1, 3, 3);
        v = layout ? X(g, "v", 2, 3, 1, 3) : X(g, "v", 2, 1, 3, 3);
        gt_sdpa_layout(g, q, k, v, true, 0.5, layout, NULL);
        ask(&a, g, (gt_placement[]){S(hd), R, R}, NULL, NONE);
        EXPECT(same(a.c.want[0], R) && same(a.c.out[0], R),
               "layout %d sdpa: heads split with hkv = 1 gathers", layout);
    }
    for (int k = 0; k < ng; k++)
        gt_graph_free(gs[k]);
}

int main(void)
{
    test_decisions();
    test_sdpa_decisions();
    test_vocab_structure();
    return gt_test_finish();
}
