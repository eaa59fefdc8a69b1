/* test_parallelize.c — the mesh, input placements, local blocks and the parallelize engine's
 * invariants that do not depend on the sharding rules (those are tests/unit/test_shard_rules.c;
 * whole runs against one rank are tests/distributed). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graphtrain/gt_config.h"
#include "graphtrain/gt_exec.h"
#include "graphtrain/gt_llama3.h"
#include "graphtrain/gt_parallel.h"
#include "graphtrain/gt_pass.h"
#include "graphtrain/gt_train.h"
#include "gt_test.h"

static void test_mesh(void)
{
    gt_error err = {0};
    gt_mesh m;
    EXPECT_OK(gt_mesh_init(&m, 2, 3, 4, &err), &err);
    EXPECT(gt_mesh_world_size(&m) == 24, "world %d", gt_mesh_world_size(&m));
    /* tp fastest: ranks 0..3 share dp coordinates and differ in tp */
    int c[GT_MESH_NDIMS];
    gt_mesh_coords(&m, 1, c);
    EXPECT(c[0] == 0 && c[1] == 0 && c[2] == 1, "rank 1 -> %d %d %d", c[0], c[1], c[2]);
    gt_mesh_coords(&m, 4, c);
    EXPECT(c[0] == 0 && c[1] == 1 && c[2] == 0, "rank 4 -> %d %d %d", c[0], c[1], c[2]);
    bool seen[24] = {0};
    for (int r = 0; r < 24; r++) {
        gt_mesh_coords(&m, r, c);
        int back = gt_mesh_rank(&m, c);
        EXPECT(back == r, "round trip %d -> %d", r, back);
        if (back >= 0 && back < 24) seen[back] = true;
    }
    for (int r = 0; r < 24; r++)
        EXPECT(seen[r], "rank %d never produced", r);
    EXPECT(gt_mesh_init(&m, 1, 0, 1, &err) == GT_ERR_INVALID, "degree 0 accepted");
    EXPECT(strstr(err.msg, "dp_shard") != NULL, "message: %s", err.msg);
    char buf[64];
    gt_mesh_init(&m, 1, 2, 2, &err);
    gt_mesh_format(&m, buf, sizeof buf);
    EXPECT(strcmp(buf, "dp_shard 2 x tp 2") == 0, "format: %s", buf);
}

/* Nested shards of one dim: tp outermost (order 0), dp_shard inside (order 1). Rank (i, j) on
 * (dp_shard, tp) holds rows j*d/2 + i*d/4 .. + d/4, so gathering over dp_shard (i = 0, 1) gives
 * back tp's block j; and the blocks of all ranks tile the tensor exactly once. */
static void test_local_box(void)
{
    gt_error err = {0};
    gt_mesh m;
    gt_mesh_init(&m, 1, 2, 2, &err);
    gt_placement place[GT_MESH_MAX_DIMS] = {{0}};
    place[GT_MESH_TP] = (gt_placement){GT_PLACE_SHARD, 0, 0, 0};
    place[GT_MESH_DP_SHARD] = (gt_placement){GT_PLACE_SHARD, 0, 1, 0};
    int64_t global[2] = {16, 6};
    int cover[16] = {0};
    for (int r = 0; r < 4; r++) {
        int c[GT_MESH_NDIMS];
        gt_mesh_coords(&m, r, c);
        int64_t start[2], size[2];
        EXPECT_OK(gt_placement_local_box(&m, place, 2, global, c, start, size, &err), &err);
        int i = c[GT_MESH_DP_SHARD], j = c[GT_MESH_TP];
        EXPECT(start[0] == j * 8 + i * 4 && size[0] == 4, "rank %d rows %lld+%lld", r,
               (long long)start[0], (long long)size[0]);
        EXPECT(start[1] == 0 && size[1] == 6, "rank %d cols %lld+%lld", r, (long long)start[1],
               (long long)size[1]);
        for (int64_t k = start[0]; k < start[0] + size[0] && k < 16; k++)
            cover[k]++;
    }
    for (int k = 0; k < 16; k++)
        EXPECT(cover[k] == 1, "row %d covered %d times", k, cover[k]);
    /* replicate on dp_replicate: both replicas hold the same block */
    gt_mesh_init(&m, 2, 2, 1, &err);
    gt_placement dp[GT_MESH_MAX_DIMS] = {{0}};
    dp[GT_MESH_DP_SHARD] = (gt_placement){GT_PLACE_SHARD, 1, 0, 0};
    int c0[3] = {0, 1, 0}, c1[3] = {1, 1, 0};
    int64_t s0[2], z0[2], s1[2], z1[2];
    gt_placement_local_box(&m, dp, 2, global, c0, s0, z0, &err);
    gt_placement_local_box(&m, dp, 2, global, c1, s1, z1, &err);
    EXPECT(s0[1] == 3 && z0[1] == 3 && s1[1] == 3 && z1[1] == 3, "replicas %lld %lld",
           (long long)s0[1], (long long)s1[1]);
    int64_t odd[2] = {15, 6};
    EXPECT(gt_placement_local_box(&m, dp, 2, odd, c0, s0, z0, &err) == GT_OK, "dim 1 divides");
    dp[GT_MESH_DP_SHARD].dim = 0;
    EXPECT(gt_placement_local_box(&m, dp, 2, odd, c0, s0, z0, &err) == GT_ERR_INVALID,
           "15 rows split 2 ways accepted");
}

static gt_graph *step_graph(const char *flavor, gt_error *err)
{
    gt_config cfg;
    gt_config_defaults(&cfg);
    char *argv[] = {"--model.flavor", (char *)flavor,     "--training.mixed_precision_param",
                    "float32",        "--compile.enable", "false"};
    gt_graph *g = gt_graph_new();
    gt_model model = {0};
    gt_status st = gt_config_apply_overrides(&cfg, 6, argv, err);
    if (st == GT_OK) st = gt_train_build_graph(&cfg, g, &model, 1, err);
    gt_model_free(&model);
    gt_config_free(&cfg);
    if (st != GT_OK) {
        gt_graph_free(g);
        return NULL;
    }
    return g;
}

/* reshard: the fsdp_reshard_after_forward policy (GT_CFG_RESHARD_*). */
static gt_graph *parallelize_plan(const gt_graph *g, int dpr, int dps, int tp, bool sp,
                                  gt_cfg_reshard reshard, gt_error *err)
{
    gt_parallel_plan plan = {.sequence_parallel = sp,
                             .fsdp_reshard_after_forward = reshard != GT_CFG_RESHARD_NEVER,
                             .fsdp_reshard_last = reshard == GT_CFG_RESHARD_ALWAYS};
    if (gt_mesh_init(&plan.mesh, dpr, dps, tp, err) != GT_OK) return NULL;
    gt_placement(*pl)[GT_MESH_MAX_DIMS] = calloc((size_t)g->n_inputs, sizeof *pl);
    gt_graph *out = NULL;
    if (gt_parallel_input_layouts(&plan, g, pl, err) == GT_OK)
        gt_parallelize(g, &plan, (const gt_placement(*)[GT_MESH_MAX_DIMS])pl, &out, err);
    free(pl);
    return out;
}

static gt_graph *parallelize(const gt_graph *g, int dpr, int dps, int tp, bool sp, gt_error *err)
{
    return parallelize_plan(g, dpr, dps, tp, sp, GT_CFG_RESHARD_DEFAULT, err);
}

/* Runs g eagerly on seeded inputs (batch 2, seq 8; ids below 64; Adam step 1) and returns the
 * outputs (n_outputs tensors, caller frees). */
static gt_tensor *run(const gt_graph *g, gt_error *err)
{
    static const gt_sym_binding_entry e[] = {{"batch", 2}, {"seq", 8}};
    gt_sym_binding b = {e, 2};
    gt_tensor *in = calloc((size_t)g->n_inputs, sizeof *in);
    gt_tensor *out = calloc((size_t)g->n_outputs, sizeof *out);
    gt_status st = GT_OK;
    uint64_t x = 88172645463325252ull;
    for (int32_t k = 0; st == GT_OK && k < g->n_inputs; k++) {
        const gt_type *t = gt_value_type(g, g->inputs[k].value);
        int64_t shape[GT_MAX_DIMS];
        st = gt_graph_eval_shape(g, g->inputs[k].value, &b, shape, err);
        if (st == GT_OK) st = gt_tensor_alloc(&in[k], t->dtype, t->ndim, shape, err);
        const char *name = gt_graph_str(g, g->inputs[k].fqn);
        for (int64_t i = 0; st == GT_OK && i < gt_tensor_numel(&in[k]); i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            if (strcmp(name, "positions") == 0) /* packed documents of 5 tokens */
                ((int64_t *)in[k].data)[i] = i % shape[1] % 5;
            else if (t->dtype == GT_I64)
                ((int64_t *)in[k].data)[i] = (int64_t)(x % 64);
            else if (strcmp(name, "optim.scalars") == 0)
                gt_tensor_set_f32(&in[k], i, i == 0 ? 1e-3f : i == 1 ? 0.1f : 0.05f);
            else if (strncmp(name, "optim.exp_avg_sq.", 17) == 0)
                gt_tensor_set_f32(&in[k], i, 0.0f);
            else
                gt_tensor_set_f32(&in[k], i, (float)((double)(x >> 11) / 9007199254740992.0 - 0.5));
        }
    }
    if (st == GT_OK) st = gt_eager_run(g, &b, in, out, err);
    for (int32_t k = 0; k < g->n_inputs; k++)
        gt_tensor_free(&in[k]);
    free(in);
    if (st != GT_OK) {
        free(out);
        return NULL;
    }
    return out;
}

static int count_tag(const gt_graph *g, const char *tag)
{
    int n = 0;
    for (int32_t i = 0; i < g->n_nodes; i++)
        if (gt_node_has_tag(g, &g->nodes[i], tag)) n++;
    return n;
}

static void test_input_layouts(const gt_graph *g)
{
    gt_error err = {0};
    gt_parallel_plan plan = {0};
    gt_mesh_init(&plan.mesh, 2, 2, 2, &err);
    gt_placement(*pl)[GT_MESH_MAX_DIMS] = calloc((size_t)g->n_inputs, sizeof *pl);
    EXPECT_OK(gt_parallel_input_layouts(&plan, g, pl, &err), &err);
    int checked = 0;
    for (int32_t k = 0; k < g->n_inputs; k++) {
        const char *fqn = gt_graph_str(g, g->inputs[k].fqn);
        const gt_placement *p = pl[k];
        if (strcmp(fqn, "layers.0.attention.wq.weight") == 0 ||
            strcmp(fqn, "optim.exp_avg_sq.layers.0.attention.wq.weight") == 0) {
            EXPECT(p[GT_MESH_TP].kind == GT_PLACE_SHARD && p[GT_MESH_TP].dim == 0 &&
                       p[GT_MESH_DP_SHARD].kind == GT_PLACE_SHARD && p[GT_MESH_DP_SHARD].dim == 0 &&
                       p[GT_MESH_DP_SHARD].order > p[GT_MESH_TP].order &&
                       p[GT_MESH_DP_REPLICATE].kind == GT_PLACE_REPLICATE,
                   "%s: colwise inside tp", fqn);
            checked++;
        } else if (strcmp(fqn, "layers.1.feed_forward.w2.weight") == 0) {
            EXPECT(p[GT_MESH_TP].kind == GT_PLACE_SHARD && p[GT_MESH_TP].dim == 1 &&
                       p[GT_MESH_DP_SHARD].kind == GT_PLACE_SHARD && p[GT_MESH_DP_SHARD].dim == 0,
                   "%s: rowwise", fqn);
            checked++;
        } else if (strcmp(fqn, "norm.weight") == 0) {
            EXPECT(p[GT_MESH_TP].kind == GT_PLACE_REPLICATE &&
                       p[GT_MESH_DP_SHARD].kind == GT_PLACE_SHARD,
                   "%s", fqn);
            checked++;
        } else if (strcmp(fqn, "tokens") == 0) {
            EXPECT(p[GT_MESH_DP_REPLICATE].kind == GT_PLACE_SHARD &&
                       p[GT_MESH_DP_SHARD].kind == GT_PLACE_SHARD &&
                       p[GT_MESH_DP_SHARD].order > p[GT_MESH_DP_REPLICATE].order &&
                       p[GT_MESH_TP].kind == GT_PLACE_REPLICATE,
                   "tokens: batch over both data-parallel dims");
            checked++;
        } else if (strcmp(fqn, "optim.scalars") == 0) {
            for (int md = 0; md < GT_MESH_NDIMS; md++)
                EXPECT(p[md].kind == GT_PLACE_REPLICATE, "optim.scalars replicated");
            checked++;
        }
    }
    EXPECT(checked == 6, "checked %d inputs", checked);
    free(pl);
}

static void test_engine(const gt_graph *g)
{
    gt_error err = {0};
    /* one rank: the same computation, bit for bit */
    gt_graph *one = parallelize(g, 1, 1, 1, false, &err);
    EXPECT(one != NULL, "1x1x1: %s", err.msg);
    if (one) {
        EXPECT(one->n_nodes == g->n_nodes, "nodes %d vs %d", one->n_nodes, g->n_nodes);
        EXPECT(one->n_outputs == g->n_outputs, "outputs %d vs %d", one->n_outputs, g->n_outputs);
        gt_tensor *a = run(g, &err), *b = a ? run(one, &err) : NULL;
        EXPECT(a && b, "eager: %s", err.msg);
        for (int32_t k = 0; a && b && k < g->n_outputs; k++) {
            EXPECT(gt_tensor_nbytes(&a[k]) == gt_tensor_nbytes(&b[k]) &&
                       memcmp(a[k].data, b[k].data, gt_tensor_nbytes(&a[k])) == 0,
                   "output %d differs", k);
        }
        for (int32_t k = 0; k < g->n_outputs; k++) {
            if (a) gt_tensor_free(&a[k]);
            if (b) gt_tensor_free(&b[k]);
        }
        free(a);
        free(b);
        gt_graph_free(one);
    }
    /* FSDP: every parameter but the token embedding (stored on dim 1: test_embedding_columns) is
     * gathered in forward and, resharded, again in backward; every gradient is reduce-scattered;
     * the graph keeps `batch` as the per-rank batch */
    gt_graph *fsdp = parallelize(g, 1, 2, 1, false, &err);
    EXPECT(fsdp != NULL, "FSDP2: %s", err.msg);
    if (fsdp) {
        int n_params = 0;
        for (int32_t k = 0; k < g->n_inputs; k++)
            n_params += g->inputs[k].kind == GT_IN_PARAM;
        EXPECT(count_tag(fsdp, "fsdp.all_gather") >= 2 * (n_params - 1), "gathers %d for %d params",
               count_tag(fsdp, "fsdp.all_gather"), n_params);
        EXPECT(gt_graph_verify(fsdp, &err) == GT_OK, "verify: %s", err.msg);
        gt_graph_free(fsdp);
    }
    /* FSDP over a degree that does not divide dim 0: padded blocks (ceil rows, zeros past D) */
    gt_graph *padded = parallelize(g, 1, 3, 1, false, &err);
    EXPECT(padded != NULL, "FSDP3: %s", err.msg);
    if (padded) {
        int n_padded = 0;
        for (int32_t k = 0; k < padded->n_inputs; k++) {
            const gt_placement *pl = padded->values[padded->inputs[k].value].place;
            if (padded->inputs[k].kind == GT_IN_PARAM && pl[GT_MESH_DP_SHARD].padded) {
                n_padded++;
                /* 64 rows over 3 ranks: 22 each */
                const gt_type *t = gt_value_type(padded, padded->inputs[k].value);
                int64_t rows = -1;
                gt_sym_is_const(padded->sym, t->dims[0], &rows);
                EXPECT(rows == 22 || rows == 86 || rows == 64, "%s: %lld local rows",
                       gt_graph_str(padded, padded->inputs[k].fqn), (long long)rows);
            }
        }
        EXPECT(n_padded > 0, "FSDP3: no padded parameter");
        gt_graph_free(padded);
    }
    /* tensor parallel is never padded: a degree that does not divide is refused, naming it */
    gt_graph *bad = parallelize(g, 1, 1, 3, false, &err);
    EXPECT(bad == NULL && strstr(err.msg, "does not split evenly") != NULL, "TP3: %s", err.msg);
    gt_graph_free(bad);
    /* parallelizing twice is refused */
    gt_graph *twice = parallelize(g, 1, 2, 1, false, &err);
    if (twice) {
        gt_graph *again = parallelize(twice, 1, 2, 1, false, &err);
        EXPECT(again == NULL && strstr(err.msg, "already") != NULL, "twice: %s", err.msg);
        gt_graph_free(again);
        gt_graph_free(twice);
    }
}

/* Collective starts of op `op` built for the token embedding (fqn "tok_embeddings..."). */
static int embedding_collectives(const gt_graph *g, gt_op op)
{
    int n = 0;
    for (int32_t i = 0; i < g->n_nodes; i++)
        n += g->nodes[i].op == op &&
             strncmp(gt_graph_str(g, g->nodes[i].fqn), "tok_embeddings", 14) == 0;
    return n;
}

/* FSDP stores the token embedding on dim 1 (columns): the step gathers the token ids, looks up
 * its columns of every rank's tokens and hands each rank its own tokens' rows by an all_to_all;
 * the backward all_to_alls dy the other way and computes the gradient in its shard: no gather of
 * the table, no reduce-scatter of its gradient. With tp, the vocabulary-parallel S(0) layout
 * stays, FSDP nested inside it. (The numbers: test_shard_rules' all_to_all conversions,
 * test_bucketing's two simulated ranks, tests/distributed's layouts against one rank.) */
static void test_embedding_columns(const gt_graph *g)
{
    gt_error err = {0};
    for (int tp = 1; tp <= 2; tp++) {
        gt_graph *f = parallelize(g, 1, 2, tp, false, &err);
        EXPECT(f != NULL, "FSDP2 x TP%d: %s", tp, err.msg);
        if (!f) continue;
        int32_t k = 0;
        while (k < f->n_inputs &&
               strcmp(gt_graph_str(f, f->inputs[k].fqn), "tok_embeddings.weight"))
            k++;
        EXPECT(k < f->n_inputs, "no tok_embeddings.weight input");
        if (k < f->n_inputs) {
            gt_placement dp = f->values[f->inputs[k].value].place[GT_MESH_DP_SHARD];
            EXPECT(dp.kind == GT_PLACE_SHARD && dp.dim == (tp == 1 ? 1 : 0),
                   "TP%d: tok_embeddings stored on dim %d over dp_shard", tp, dp.dim);
        }
        int a2a = embedding_collectives(f, GT_OP_ALL_TO_ALL_START);
        int rs = embedding_collectives(f, GT_OP_REDUCE_SCATTER_START);
        int ag = embedding_collectives(f, GT_OP_ALL_GATHER_START);
        if (tp == 1)
            EXPECT(a2a == 2 && rs == 0 && ag == 1,
                   "FSDP2: tok_embeddings has %d all_to_alls (want 2), %d reduce-scatters (0), %d "
                   "gathers (1: the ids)",
                   a2a, rs, ag);
        else
            EXPECT(a2a == 0 && rs > 0, "FSDP2 x TP2: %d all_to_alls, %d reduce-scatters", a2a, rs);
        EXPECT(gt_graph_verify(f, &err) == GT_OK, "verify: %s", err.msg);
        gt_graph_free(f);
    }
}

/* Module class of a node for the reshard policy: 1 for the last block (layers.1 of test_tiny's
 * two) and the modules after it (norm, output, loss), else 0. */
static int kept_class(const gt_graph *g, const gt_node *n)
{
    const char *f = gt_graph_str(g, n->fqn);
    return strncmp(f, "layers.1", 8) == 0 ||
           (strncmp(f, "layers.", 7) != 0 && strncmp(f, "tok_embeddings", 14) != 0);
}

/* Backward reads of a weight gathered in the forward (through views of the gathered value) and
 * backward gathers, each counted by the reading / gathering node's kept_class, after the pass
 * pipeline with memory policy `full`. */
static void fsdp_backward_use(const gt_graph *g, gt_cfg_reshard reshard, int reads[2],
                              int bwd_gathers[2], gt_error *err)
{
    reads[0] = reads[1] = bwd_gathers[0] = bwd_gathers[1] = -1;
    gt_graph *pg = parallelize_plan(g, 1, 2, 1, false, reshard, err);
    if (!pg) return;
    static const gt_sym_binding_entry e[] = {{"batch", 2}, {"seq", 8}};
    gt_sym_binding b = {e, 2};
    gt_pass_options o = {.memory_policy = GT_MEMORY_POLICY_FULL, .binding = &b};
    if (gt_pass_run_pipeline(pg, &o, NULL, err) != GT_OK) {
        gt_graph_free(pg);
        return;
    }
    uint8_t *gathered = calloc((size_t)pg->n_values + 1, 1);
    reads[0] = reads[1] = bwd_gathers[0] = bwd_gathers[1] = 0;
    for (int32_t i = 0; i < pg->n_nodes; i++) {
        const gt_node *n = &pg->nodes[i];
        bool fwd = n->phase == GT_PHASE_FORWARD;
        if (n->op == GT_OP_ALL_GATHER_START && gt_node_has_tag(pg, n, "fsdp.all_gather") && !fwd)
            bwd_gathers[kept_class(pg, n)]++;
        if (fwd && n->op == GT_OP_WAIT && gt_node_has_tag(pg, n, "fsdp.all_gather")) {
            gathered[n->out[0]] = 1;
            continue;
        }
        bool view = n->op == GT_OP_RESHAPE || n->op == GT_OP_SLICE || n->op == GT_OP_SPLIT ||
                    n->op == GT_OP_CAST;
        bool reads_gathered = false;
        for (int k = 0; k < n->n_in; k++)
            reads_gathered |= gathered[n->in[k]] != 0;
        if (fwd && view && reads_gathered)
            for (int k = 0; k < n->n_out; k++)
                gathered[n->out[k]] = 1;
        if (!fwd && reads_gathered) reads[kept_class(pg, n)]++;
    }
    free(gathered);
    gt_graph_free(pg);
}

/* Reshard after forward under full recomputation. Policy always: the recomputed forward nodes
 * read a gather made again in the backward (remat copies the tagged gather; bucketing drops the
 * backward duplicate), so no forward-gathered weight stays alive into the backward. Policy
 * default: the same for the first block, while the last block, the final norm and the output keep
 * their forward-gathered weights for their backward, which gathers nothing for them. Never: the
 * backward reads the forward's gathered weights and gathers nothing. */
static void test_reshard(const gt_graph *g)
{
    gt_error err = {0};
    int reads[2], gathers[2];
    fsdp_backward_use(g, GT_CFG_RESHARD_ALWAYS, reads, gathers, &err);
    EXPECT(reads[0] + reads[1] == 0 && gathers[0] > 0 && gathers[1] > 0,
           "reshard always: %d + %d backward reads, %d + %d backward gathers (%s)", reads[0],
           reads[1], gathers[0], gathers[1], err.msg);
    fsdp_backward_use(g, GT_CFG_RESHARD_DEFAULT, reads, gathers, &err);
    EXPECT(reads[0] == 0 && reads[1] > 0 && gathers[0] > 0 && gathers[1] == 0,
           "reshard default: first block %d backward reads, %d backward gathers; last block and "
           "after %d reads, %d gathers (%s)",
           reads[0], gathers[0], reads[1], gathers[1], err.msg);
    fsdp_backward_use(g, GT_CFG_RESHARD_NEVER, reads, gathers, &err);
    EXPECT(reads[0] > 0 && reads[1] > 0 && gathers[0] + gathers[1] == 0,
           "no reshard: %d + %d backward reads, %d + %d backward gathers (%s)", reads[0], reads[1],
           gathers[0], gathers[1], err.msg);
}

static void test_sym_replace(void)
{
    gt_sym_pool *p = gt_sym_pool_new();
    gt_expr b = gt_sym_var(p, "batch"), s = gt_sym_var(p, "seq");
    gt_expr e = gt_sym_add(p, gt_sym_mul(p, b, s), gt_sym_const(p, 3)); /* batch*seq + 3 */
    gt_expr two_b = gt_sym_mul(p, gt_sym_const(p, 2), b);
    gt_expr r = gt_sym_replace(p, e, "batch", two_b); /* 2*batch*seq + 3 */
    gt_expr want = gt_sym_add(p, gt_sym_mul(p, two_b, s), gt_sym_const(p, 3));
    EXPECT(r == want, "replace");
    gt_expr half = gt_sym_floordiv(p, r == want ? gt_sym_mul(p, two_b, s) : r, gt_sym_const(p, 2));
    EXPECT(half == gt_sym_mul(p, b, s), "(2*batch*seq) // 2 is batch*seq");
    gt_sym_pool_free(p);
}

int main(void)
{
    test_mesh();
    test_local_box();
    test_sym_replace();
    gt_error err = {0};
    gt_graph *g = step_graph("test_tiny", &err);
    EXPECT(g != NULL, "step graph: %s", err.msg);
    if (g) {
        test_input_layouts(g);
        test_engine(g);
        test_embedding_columns(g);
        test_reshard(g);
        gt_graph_free(g);
    }
    return gt_test_finish();
}
