/* test_moe_ep.c — expert parallel's row moves (moe_block_offsets, moe_pack, moe_unpack; CPU
 * kernels) on simulated ranks, and the expert-parallel expansion's structure.
 *
 * Kernels: n = 3 simulated ranks, e = 2 experts each (E = 6), random routes per rank, including
 * empty pairs and one pair that takes every row. Each rank's table row block comes from
 * moe_block_offsets; the all-gather is their concatenation; the all_to_all is a block transpose.
 * Checked against a naive reference: block a of what rank b receives is exactly rank a's rows for
 * b's experts, in order, then zeros; the unpack of what comes back restores every rank's rows bit
 * for bit; <pack(x), y> == <x, unpack(y)> exactly (small integers: the two are adjoint, which is
 * what their gradient rules claim); a capacity below the largest pair fails on every rank with
 * the error naming the factor needed (largest count / worst case).
 * Expansion: a one-layer routed-experts graph parallelized on dp_shard 2 with
 * expert_parallel_degree 2 carries moe_pack / all_to_all / moe_unpack and no all-gather of the
 * expert weights; with ep 1 it gathers them and has no moe_pack. On dp_shard 4 with ep 2 the
 * graph's mesh gains efsdp and ep: rows move over ep only, the expert weights are gathered over
 * efsdp only and their gradient reduce-scattered over it, and the text form keeps both dims.
 * ep taking tp ranks (dp_shard 1 x tp 2 and x tp 4 with ep 2, dp_shard 2 x tp 2 with ep 4):
 * each rank stores E / (dp_shard x tp) experts, their gradient and AdamW moments, tp times fewer
 * bytes than ep 1's E / dp_shard (ep times on dp_shard 1 x tp 2, ep 2); gathered and
 * reduce-scattered over efsdp only.
 * Simulated ranks (2 threads, tests/shard_sim.h): a routed layer — routing on its own scores,
 * dispatch, grouped matmul, combine — and the expert weights' gradient, run on dp_shard 2 with
 * ep 2 and with ep 1: the combined rows and the gradient are bitwise equal between the two,
 * the rows bitwise the one-process graph's (M-invariance, expert-order combine), the gradient
 * within 1e-5 of it (one row-ordered chain there, a sum of the two ranks' chains here).
 * Layout: the trainer's checks of expert_parallel_degree and the capacity factor, each error
 * naming the option. */
#include <stdlib.h>
#include <string.h>

#include "graphtrain/gt_backend.h"
#include "graphtrain/gt_build.h"
#include "graphtrain/gt_config.h"
#include "graphtrain/gt_exec.h"
#include "graphtrain/gt_optim.h"
#include "graphtrain/gt_parallel.h"
#include "graphtrain/gt_train.h"
#include "gt_test.h"
#include "shard_sim.h"

#define N 3
#define EL 2
#define E (N * EL)
#define D 3

static gt_tensor tensor(gt_dtype dt, int ndim, int64_t d0, int64_t d1)
{
    gt_tensor t;
    gt_error err = {0};
    int64_t shape[2] = {d0, d1};
    GT_CHECK(gt_tensor_alloc(&t, dt, ndim, shape, &err) == GT_OK);
    return t;
}

static gt_status kernel(gt_op op, const int64_t *i, int ni, const int64_t *e, int ne,
                        const gt_tensor *const *in, int n_in, gt_tensor *out, gt_error *err)
{
    gt_kernel_call c = {.op = op, .i = i, .e = e, .ni = ni, .ne = ne, .n_in = n_in, .n_out = 1};
    for (int k = 0; k < n_in; k++)
        c.in[k] = in[k];
    c.out[0] = out;
    return gt_cpu_run_kernel(&c, err);
}

typedef struct {
    int rows;               /* T*K routed rows of the rank */
    int32_t offsets[E + 1]; /* expert offsets of its sorted rows */
    gt_tensor x;            /* [rows, D] */
} sim_rank;

static void test_kernels(void)
{
    srand(37);
    sim_rank r[N];
    int most = 0;
    for (int a = 0; a < N; a++) {
        int cnt[E] = {0};
        r[a].rows = a == 1 ? 8 : 4 + a * 3;
        for (int k = 0; k < r[a].rows; k++)
            cnt[a == 1 ? 4 + k % 2 : (a == 2 && k % 3 == 0) ? 0 : rand() % E]++;
        r[a].offsets[0] = 0;
        for (int x = 0; x < E; x++)
            r[a].offsets[x + 1] = r[a].offsets[x] + cnt[x];
        for (int b = 0; b < N; b++) {
            int c = r[a].offsets[(b + 1) * EL] - r[a].offsets[b * EL];
            most = c > most ? c : most;
        }
        r[a].x = tensor(GT_F32, 2, r[a].rows, D);
        float *xv = r[a].x.data;
        for (int k = 0; k < r[a].rows * D; k++)
            xv[k] = (float)(100 * a + k + 1);
    }
    /* the table: every rank's moe_block_offsets, concatenated (the all-gather) */
    gt_tensor table = tensor(GT_I32, 2, N * N, EL + 1);
    gt_error err = {0};
    for (int a = 0; a < N; a++) {
        gt_tensor off = tensor(GT_I32, 1, E + 1, 0), blk = tensor(GT_I32, 2, N, EL + 1);
        memcpy(off.data, r[a].offsets, sizeof r[a].offsets);
        int64_t nb = N;
        const gt_tensor *in[1] = {&off};
        EXPECT_OK(kernel(GT_OP_MOE_BLOCK_OFFSETS, &nb, 1, NULL, 0, in, 1, &blk, &err), &err);
        memcpy((int32_t *)table.data + a * N * (EL + 1), blk.data, gt_tensor_nbytes(&blk));
        gt_tensor_free(&off);
        gt_tensor_free(&blk);
    }
    const int32_t *tv = table.data;
    for (int a = 0; a < N; a++)
        for (int b = 0; b < N; b++)
            for (int l = 0; l <= EL; l++)
                EXPECT(tv[(a * N + b) * (EL + 1) + l] ==
                           r[a].offsets[b * EL + l] - r[a].offsets[b * EL],
                       "table row %d,%d entry %d", a, b, l);

    int64_t cap = most + 2, worst = 9;
    gt_tensor packed[N], recv[N], back[N];
    for (int a = 0; a < N; a++) {
        packed[a] = tensor(GT_F32, 2, N * cap, D);
        int64_t nb = N, e3[3] = {cap, worst, a};
        const gt_tensor *in[2] = {&r[a].x, &table};
        EXPECT_OK(kernel(GT_OP_MOE_PACK, &nb, 1, e3, 3, in, 2, &packed[a], &err), &err);
    }
    /* the all_to_all: rank b's block a = rank a's block b */
    for (int b = 0; b < N; b++) {
        recv[b] = tensor(GT_F32, 2, N * cap, D);
        for (int a = 0; a < N; a++)
            memcpy((float *)recv[b].data + a * cap * D, (float *)packed[a].data + b * cap * D,
                   (size_t)(cap * D) * sizeof(float));
        for (int a = 0; a < N; a++) {
            int start = r[a].offsets[b * EL], count = r[a].offsets[(b + 1) * EL] - start;
            const float *blk = (const float *)recv[b].data + a * cap * D;
            const float *src = (const float *)r[a].x.data + start * D;
            EXPECT(memcmp(blk, src, (size_t)(count * D) * sizeof(float)) == 0,
                   "rank %d receives rank %d's rows for its experts", b, a);
            for (int k = count * D; k < cap * D; k++)
                EXPECT(blk[k] == 0.0f, "rank %d block %d: zero tail", b, a);
        }
    }
    /* back the same way, then unpack: every rank's rows again, bit for bit */
    for (int a = 0; a < N; a++) {
        gt_tensor ret = tensor(GT_F32, 2, N * cap, D);
        for (int b = 0; b < N; b++)
            memcpy((float *)ret.data + b * cap * D, (float *)recv[b].data + a * cap * D,
                   (size_t)(cap * D) * sizeof(float));
        back[a] = tensor(GT_F32, 2, r[a].rows, D);
        int64_t nb = N, e2[2] = {r[a].rows, a};
        const gt_tensor *in[2] = {&ret, &table};
        EXPECT_OK(kernel(GT_OP_MOE_UNPACK, &nb, 1, e2, 2, in, 2, &back[a], &err), &err);
        EXPECT(memcmp(back[a].data, r[a].x.data, gt_tensor_nbytes(&r[a].x)) == 0,
               "rank %d: its rows come back in place", a);
        /* adjoint: <pack(x), y> == <x, unpack(y)> with y = ret (integers: exact) */
        double lhs = 0, rhs = 0;
        const float *pv = packed[a].data, *yv = ret.data, *xv = r[a].x.data, *uv = back[a].data;
        for (int k = 0; k < N * cap * D; k++)
            lhs += (double)pv[k] * yv[k];
        for (int k = 0; k < r[a].rows * D; k++)
            rhs += (double)xv[k] * uv[k];
        EXPECT(lhs == rhs, "rank %d: pack and unpack are adjoint (%g vs %g)", a, lhs, rhs);
        gt_tensor_free(&ret);
    }
    /* a capacity below the largest pair: the same error on every rank, naming the factor */
    for (int a = 0; a < N; a++) {
        gt_tensor small = tensor(GT_F32, 2, N * (most - 1), D);
        int64_t nb = N, e3[3] = {most - 1, worst, a};
        const gt_tensor *in[2] = {&r[a].x, &table};
        gt_error e2 = {0};
        gt_status st = kernel(GT_OP_MOE_PACK, &nb, 1, e3, 3, in, 2, &small, &e2);
        char want[64];
        snprintf(want, sizeof want, "at least %.3f", (double)most / (double)worst + 0.0005);
        EXPECT(st == GT_ERR_INVALID && strstr(e2.msg, "capacity overflow") &&
                   strstr(e2.msg, "expert_parallel_capacity_factor") && strstr(e2.msg, want),
               "rank %d: overflow error naming the factor (%s): %s", a, want, e2.msg);
        gt_tensor_free(&small);
    }
    for (int a = 0; a < N; a++) {
        gt_tensor_free(&r[a].x);
        gt_tensor_free(&packed[a]);
        gt_tensor_free(&recv[a]);
        gt_tensor_free(&back[a]);
    }
    gt_tensor_free(&table);
}

/* One routed-experts layer on [batch, 8] tokens, E = 4, K = 2: forward and a weight gradient,
 * parallelized on dp_shard `shard` x tp `tp` with expert_parallel_degree ep. */
static gt_graph *expand_mesh(int shard, int tp, int ep, bool adamw, int *packs, int *a2a,
                             int *gathers)
{
    gt_graph *g = gt_graph_new();
    gt_expr b = gt_sym_var(g->sym, "batch"), d8 = gt_c(g, 8), e4 = gt_c(g, 4);
    gt_value_id x = gt_graph_add_input(g, GT_IN_INPUT, "x", GT_F32, 2, (gt_expr[]){b, d8});
    gt_value_id w = gt_graph_add_input(g, GT_IN_PARAM, "w", GT_F32, 3, (gt_expr[]){e4, d8, d8});
    gt_graph_set_input_plan(g, w, (gt_param_plan){.role = GT_ROLE_EXPERT, .as_param = 1});
    gt_value_id ids = gt_moe_topk(g, x, 2, 0, 0);
    gt_value_id token, offsets;
    gt_moe_sort(g, ids, 4, &token, &offsets);
    gt_value_id xs = gt_embedding(g, x, token);
    gt_value_id y = gt_grouped_matmul(g, xs, w, offsets, true);
    gt_value_id out = gt_embedding_backward(g, token, y, b);
    gt_graph_add_output(g, GT_OUT_METRIC, "out",
                        gt_reduce(g, GT_OP_SUM, out, 2, (int[]){0, 1}, false));
    gt_value_id dw = gt_grouped_matmul_dw(g, xs, y, offsets);
    gt_graph_add_output(g, GT_OUT_GRAD, "w", dw);
    gt_error err = {0};
    if (adamw) { /* the moments ("optim.exp_avg.w", ...) must sit where w does */
        gt_adamw_config a = gt_adamw_config_default();
        EXPECT_OK(gt_optim_append_adamw(g, 1, &w, &dw, &a, &err), &err);
    }
    EXPECT(g->err.code == GT_OK, "building: %s", g->err.msg);
    gt_parallel_plan plan = {.expert_parallel_degree = ep};
    GT_CHECK(gt_mesh_init(&plan.mesh, 1, shard, tp, &err) == GT_OK);
    gt_placement(*place)[GT_MESH_MAX_DIMS] = gt_xcalloc((size_t)g->n_inputs, sizeof *place);
    EXPECT_OK(gt_parallel_input_layouts(&plan, g, place, &err), &err);
    if (shard > 1) place[0][GT_MESH_DP_SHARD] = (gt_placement){GT_PLACE_SHARD, 0, 0, 0};
    gt_graph *p = NULL;
    EXPECT_OK(gt_parallelize(g, &plan, (const gt_placement(*)[GT_MESH_MAX_DIMS])place, &p, &err),
              &err);
    free(place);
    gt_graph_free(g);
    *packs = *a2a = *gathers = 0;
    for (int32_t i = 0; p && i < p->n_nodes; i++) {
        *packs += p->nodes[i].op == GT_OP_MOE_PACK;
        *a2a += p->nodes[i].op == GT_OP_ALL_TO_ALL_START;
        *gathers += p->nodes[i].op == GT_OP_ALL_GATHER_START;
    }
    return p;
}

static gt_graph *expand_on(int shard, int ep, int *packs, int *a2a, int *gathers)
{
    return expand_mesh(shard, 1, ep, false, packs, a2a, gathers);
}

static gt_graph *expand(int ep, int *packs, int *a2a, int *gathers)
{
    return expand_on(2, ep, packs, a2a, gathers);
}

/* dp_shard 4 with ep 2 (efsdp 2 x ep 2, ep inner): the graph's mesh gains efsdp and ep; the rows
 * move over ep only, the expert weights are gathered over efsdp only (never over dp_shard: each
 * ep rank holds E / ep experts, not E) and their gradient is reduce-scattered over efsdp. */
static void test_expansion_split(void)
{
    int packs, a2a, gathers;
    gt_graph *p = expand_on(4, 2, &packs, &a2a, &gathers);
    if (!p) return;
    EXPECT(p->mesh.ndim == GT_MESH_EP_NDIMS && p->mesh.size[GT_MESH_EFSDP] == 2 &&
               p->mesh.size[GT_MESH_EP] == 2,
           "dp_shard 4 x ep 2: mesh of %d dims (efsdp %d, ep %d)", p->mesh.ndim,
           p->mesh.size[GT_MESH_EFSDP], p->mesh.size[GT_MESH_EP]);
    int a2a_ep = 0, gather_shard = 0, gather_efsdp = 0, rs_efsdp = 0;
    for (int32_t i = 0; i < p->n_nodes; i++) {
        const gt_node *n = &p->nodes[i];
        int md = (int)n->attrs.i[0], size = (int)n->attrs.i[1];
        if (n->op == GT_OP_ALL_TO_ALL_START) a2a_ep += md == GT_MESH_EP && size == 2;
        if (n->op == GT_OP_ALL_GATHER_START) {
            gather_shard += md == GT_MESH_DP_SHARD;
            gather_efsdp += md == GT_MESH_EFSDP && size == 2;
        }
        if (n->op == GT_OP_REDUCE_SCATTER_START) rs_efsdp += md == GT_MESH_EFSDP && size == 2;
    }
    EXPECT(packs == 2 && a2a == 3 && a2a_ep == 3,
           "dp_shard 4 x ep 2: %d moe_pack, %d all_to_all (%d over ep; want 2, 3, 3)", packs, a2a,
           a2a_ep);
    EXPECT(gather_shard == 1 && gather_efsdp == 1,
           "dp_shard 4 x ep 2: gathers over dp_shard %d (want 1: the offsets table), over efsdp "
           "%d (want 1: the experts)",
           gather_shard, gather_efsdp);
    EXPECT(rs_efsdp == 1, "dp_shard 4 x ep 2: %d reduce-scatter(s) over efsdp, want 1", rs_efsdp);
    /* the text form keeps the two dims (one artifact serves every rank) */
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    gt_error err = {0};
    EXPECT_OK(gt_graph_write(p, f, &err), &err);
    fclose(f);
    EXPECT(text && strstr(text, "efsdp") && strstr(text, "rank.dp_shard"),
           "the written graph names the efsdp dim and the rank coordinate");
    free(text);
    gt_graph_free(p);
}

static void test_expansion(void)
{
    int packs, a2a, gathers;
    gt_graph *p = expand(2, &packs, &a2a, &gathers);
    /* x sent once (memo) for the matmul and its dw, y once for the dw; results back once */
    EXPECT(packs == 2 && a2a == 3, "ep 2: %d moe_pack, %d all_to_all (want 2, 3)", packs, a2a);
    EXPECT(gathers == 1, "ep 2: one all-gather (the offsets table), got %d", gathers);
    if (p) gt_graph_free(p);
    p = expand(1, &packs, &a2a, &gathers);
    EXPECT(packs == 0 && a2a == 0 && gathers == 1,
           "ep 1: no rows move, the experts are gathered once (%d, %d, %d)", packs, a2a, gathers);
    if (p) gt_graph_free(p);
}

/* Bytes of a constant-shaped local value. */
static int64_t local_bytes(const gt_graph *p, gt_value_id v)
{
    const gt_type *t = gt_value_type(p, v);
    int64_t n = 4, d;
    for (int k = 0; k < t->ndim; k++)
        n *= gt_sym_is_const(p->sym, t->dims[k], &d) ? d : -1;
    return n;
}

/* The local bytes of expert weight w, of its gradient (AdamW's input) and of its two moments in
 * p. */
static void expert_bytes(const gt_graph *p, int64_t *w, int64_t *grad, int64_t *moments)
{
    *w = *grad = -1;
    *moments = 0;
    for (int32_t k = 0; k < p->n_inputs; k++) {
        if (p->inputs[k].kind == GT_IN_PARAM) *w = local_bytes(p, p->inputs[k].value);
        if (p->inputs[k].kind == GT_IN_OPT_STATE && gt_value_type(p, p->inputs[k].value)->ndim == 3)
            *moments += local_bytes(p, p->inputs[k].value);
    }
    for (int32_t i = 0; i < p->n_nodes; i++)
        if (p->nodes[i].op == GT_OP_ADAMW) *grad = local_bytes(p, p->nodes[i].in[1]);
}

/* Collectives over mesh dim md of group size `size` in p (0: any size) whose input has `bytes`
 * bytes (0: any). */
static int count_coll(const gt_graph *p, gt_op op, int md, int size, int64_t bytes)
{
    int n = 0;
    for (int32_t i = 0; i < p->n_nodes; i++) {
        const gt_node *nd = &p->nodes[i];
        n += nd->op == op && nd->attrs.i[0] == md && (!size || nd->attrs.i[1] == size) &&
             (!bytes || local_bytes(p, nd->in[0]) == bytes);
    }
    return n;
}

/* ep takes tp ranks (ETP 1): the expert weights (E = 4 of [8, 8] f32, 1024 bytes) are stored
 * over the flattened dp_shard x tp ranks, E / (dp_shard * tp) experts each, where the form
 * before stored them whole over tp (E / dp_shard: ep 1's storage on the same mesh), so a rank's
 * expert state and gradient shrink by tp: by ep on dp_shard 1 x tp 2, ep 2. The weights are
 * gathered and their gradient reduce-scattered over efsdp only (none with efsdp 1); no collective
 * over tp or dp_shard moves them. */
static void test_expansion_tp(void)
{
    static const struct {
        int shard, tp, ep;
    } cases[] = {{1, 2, 2}, {1, 4, 2}, {2, 2, 4}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int shard = cases[c].shard, tp = cases[c].tp, ep = cases[c].ep, efsdp = shard * tp / ep;
        int packs, a2a, gathers;
        int64_t w1, g1, m1, w, gw, m;
        gt_graph *p1 = expand_mesh(shard, tp, 1, true, &packs, &a2a, &gathers);
        gt_graph *p = expand_mesh(shard, tp, ep, true, &packs, &a2a, &gathers);
        if (!p || !p1) {
            EXPECT(false, "dp_shard %d x tp %d, ep %d: not parallelized", shard, tp, ep);
            gt_graph_free(p);
            gt_graph_free(p1);
            continue;
        }
        expert_bytes(p1, &w1, &g1, &m1);
        expert_bytes(p, &w, &gw, &m);
        printf("dp_shard %d x tp %d, ep %d: expert weight %lld bytes a rank, gradient %lld, "
               "moments %lld (ep 1: %lld, %lld, %lld)\n",
               shard, tp, ep, (long long)w, (long long)gw, (long long)m, (long long)w1,
               (long long)g1, (long long)m1);
        EXPECT(w == 1024 / (shard * tp) && gw == w && m == 2 * w,
               "dp_shard %d x tp %d, ep %d: a rank stores %lld bytes of the expert weights, %lld "
               "of their gradient and %lld of their moments, want %d, %d, %d (1 / (dp_shard x tp))",
               shard, tp, ep, (long long)w, (long long)gw, (long long)m, 1024 / (shard * tp),
               1024 / (shard * tp), 2048 / (shard * tp));
        EXPECT(w1 == 1024 / shard && m1 == 2 * w1,
               "dp_shard %d x tp %d, ep 1: %lld bytes, moments %lld, want %d, %d", shard, tp,
               (long long)w1, (long long)m1, 1024 / shard, 2048 / shard);
        /* by tp (the ranks the weights were whole on): ep itself on dp_shard 1 x tp 2, ep 2 */
        EXPECT(w * tp == w1 && gw * tp == g1 && m * tp == m1,
               "dp_shard %d x tp %d, ep %d: the expert state shrinks by tp (%lld -> %lld)", shard,
               tp, ep, (long long)w1, (long long)w);
        int g_efsdp = count_coll(p, GT_OP_ALL_GATHER_START, GT_MESH_EFSDP, efsdp, w);
        int rs_efsdp = count_coll(p, GT_OP_REDUCE_SCATTER_START, GT_MESH_EFSDP, efsdp, 0);
        /* the expert weights and their gradient are the graph's only 3-D values */
        int wide = 0;
        for (int32_t i = 0; i < p->n_nodes; i++) {
            const gt_node *nd = &p->nodes[i];
            bool coll = nd->op == GT_OP_ALL_GATHER_START || nd->op == GT_OP_ALL_REDUCE_START ||
                        nd->op == GT_OP_REDUCE_SCATTER_START;
            wide += coll && (nd->attrs.i[0] == GT_MESH_DP_SHARD || nd->attrs.i[0] == GT_MESH_TP) &&
                    gt_value_type(p, nd->in[0])->ndim == 3;
        }
        EXPECT(g_efsdp == (efsdp > 1) && rs_efsdp == (efsdp > 1),
               "dp_shard %d x tp %d, ep %d: %d gather(s) and %d reduce-scatter(s) over efsdp %d, "
               "want %d each",
               shard, tp, ep, g_efsdp, rs_efsdp, efsdp, efsdp > 1);
        EXPECT(wide == 0,
               "dp_shard %d x tp %d, ep %d: %d collective(s) over dp_shard or tp move the expert "
               "weights or their gradient",
               shard, tp, ep, wide);
        EXPECT(packs == 2 && a2a == 3, "dp_shard %d x tp %d, ep %d: %d moe_pack, %d all_to_all",
               shard, tp, ep, packs, a2a);
        gt_graph_free(p);
        gt_graph_free(p1);
    }
}

/* Routed layer: scores [T, 4] (E 4, K 2), x [T, 8], w [4, 8, 8]. */
static gt_graph *sim_graph(void)
{
    gt_graph *g = gt_graph_new();
    gt_expr b = gt_sym_var(g->sym, "batch"), d8 = gt_c(g, 8), e4 = gt_c(g, 4);
    gt_value_id sc = gt_graph_add_input(g, GT_IN_INPUT, "scores", GT_F32, 2, (gt_expr[]){b, e4});
    gt_value_id x = gt_graph_add_input(g, GT_IN_INPUT, "x", GT_F32, 2, (gt_expr[]){b, d8});
    gt_value_id w = gt_graph_add_input(g, GT_IN_PARAM, "w", GT_F32, 3, (gt_expr[]){e4, d8, d8});
    gt_value_id token, offsets;
    gt_moe_sort(g, gt_moe_topk(g, sc, 2, 0, 0), 4, &token, &offsets);
    gt_value_id xs = gt_embedding(g, x, token);
    gt_value_id y = gt_grouped_matmul(g, xs, w, offsets, true);
    gt_graph_add_output(g, GT_OUT_METRIC, "out", gt_embedding_backward(g, token, y, b));
    gt_graph_add_output(g, GT_OUT_GRAD, "w", gt_grouped_matmul_dw(g, xs, y, offsets));
    EXPECT(g->err.code == GT_OK, "building: %s", g->err.msg);
    return g;
}

typedef struct {
    const gt_graph *g;
    gt_sym_binding bind;
    gt_sym_binding_entry be[4];
    gt_tensor in[3], out[2];
    gt_comm comm;
    sim_exchange *x;
    gt_status st;
    gt_error err;
} sim_job;

static void *sim_thread(void *arg)
{
    sim_job *j = arg;
    gt_comm *comms[GT_MESH_MAX_DIMS] = {NULL};
    comms[GT_MESH_DP_SHARD] = &j->comm;
    j->st = gt_eager_run_comms(j->g, &j->bind, j->in, comms, j->out, &j->err);
    sim_finished(j->x);
    return NULL;
}

/* The global inputs' row block of rank r (dim 0 split in two). */
static gt_tensor half(const gt_tensor *t, int r)
{
    int64_t rows = t->shape[0] / 2, row = (int64_t)gt_tensor_nbytes(t) / t->shape[0];
    int64_t shape[GT_MAX_DIMS];
    for (int d = 0; d < t->ndim; d++)
        shape[d] = d == 0 ? rows : t->shape[d];
    gt_tensor h;
    gt_error err = {0};
    GT_CHECK(gt_tensor_alloc(&h, t->dtype, t->ndim, shape, &err) == GT_OK);
    memcpy(h.data, (const char *)t->data + (size_t)(r * rows * row), (size_t)(rows * row));
    return h;
}

/* Runs g parallelized with expert_parallel_degree ep on 2 simulated ranks; out: the combined rows
 * (replicate: rank 0's) and the whole weight gradient. */
static bool sim_run(const gt_graph *g, int ep, const gt_tensor *in, gt_tensor *rows, gt_tensor *dw)
{
    gt_parallel_plan plan = {.expert_parallel_degree = ep};
    gt_error err = {0};
    GT_CHECK(gt_mesh_init(&plan.mesh, 1, 2, 1, &err) == GT_OK);
    gt_placement place[3][GT_MESH_MAX_DIMS];
    EXPECT_OK(gt_parallel_input_layouts(&plan, g, place, &err), &err);
    place[0][GT_MESH_DP_SHARD] = place[1][GT_MESH_DP_SHARD] =
        (gt_placement){GT_PLACE_SHARD, 0, 0, 0};
    gt_graph *lg = NULL;
    EXPECT_OK(gt_parallelize(g, &plan, (const gt_placement(*)[GT_MESH_MAX_DIMS])place, &lg, &err),
              &err);
    if (!lg) return false;
    sim_exchange x;
    sim_exchange_init(&x);
    static sim_job job[2];
    pthread_t th[2];
    gt_graph *copy[2];
    for (int r = 0; r < 2; r++) {
        memset(&job[r], 0, sizeof job[r]);
        copy[r] = gt_graph_copy(lg);
        job[r].g = copy[r];
        job[r].x = &x;
        job[r].comm = sim_comm(&x, r);
        job[r].be[0] = (gt_sym_binding_entry){"rank.dp_replicate", 0};
        job[r].be[1] = (gt_sym_binding_entry){"rank.dp_shard", r};
        job[r].be[2] = (gt_sym_binding_entry){"rank.tp", 0};
        job[r].be[3] = (gt_sym_binding_entry){"batch", in[0].shape[0] / 2};
        job[r].bind = (gt_sym_binding){job[r].be, 4};
        for (int k = 0; k < 3; k++)
            job[r].in[k] = half(&in[k], r);
        GT_CHECK(pthread_create(&th[r], NULL, sim_thread, &job[r]) == 0);
    }
    for (int r = 0; r < 2; r++)
        pthread_join(th[r], NULL);
    sim_exchange_destroy(&x);
    bool ok = true;
    for (int r = 0; r < 2; r++) {
        EXPECT(job[r].st == GT_OK, "ep %d rank %d: %s", ep, r, job[r].err.msg);
        ok = ok && job[r].st == GT_OK;
    }
    if (ok) {
        *rows = job[0].out[0];
        job[0].out[0] = (gt_tensor){0};
        EXPECT(memcmp(rows->data, job[1].out[0].data, gt_tensor_nbytes(rows)) == 0,
               "ep %d: the replicate rows differ between ranks", ep);
        size_t part = gt_tensor_nbytes(&job[0].out[1]);
        int64_t shape[3] = {2 * job[0].out[1].shape[0], job[0].out[1].shape[1],
                            job[0].out[1].shape[2]};
        GT_CHECK(gt_tensor_alloc(dw, GT_F32, 3, shape, &err) == GT_OK);
        for (int r = 0; r < 2; r++)
            memcpy((char *)dw->data + (size_t)r * part, job[r].out[1].data, part);
    }
    for (int r = 0; r < 2; r++) {
        for (int k = 0; k < 3; k++)
            gt_tensor_free(&job[r].in[k]);
        for (int k = 0; k < 2; k++)
            gt_tensor_free(&job[r].out[k]);
        gt_graph_free(copy[r]);
    }
    gt_graph_free(lg);
    return ok;
}

static void test_simulated_ranks(void)
{
    gt_graph *g = sim_graph();
    gt_tensor in[3];
    in[0] = tensor(GT_F32, 2, 6, 4);
    in[1] = tensor(GT_F32, 2, 6, 8);
    gt_error err = {0};
    int64_t wshape[3] = {4, 8, 8};
    GT_CHECK(gt_tensor_alloc(&in[2], GT_F32, 3, wshape, &err) == GT_OK);
    srand(11);
    for (int k = 0; k < 3; k++)
        for (int64_t i = 0; i < gt_tensor_numel(&in[k]); i++)
            ((float *)in[k].data)[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    gt_sym_binding_entry be = {"batch", 6};
    gt_sym_binding bind = {&be, 1};
    gt_tensor ref[2];
    EXPECT_OK(gt_eager_run(g, &bind, in, ref, &err), &err);
    gt_tensor rows1 = {0}, dw1 = {0}, rows2 = {0}, dw2 = {0};
    bool ok = sim_run(g, 1, in, &rows1, &dw1) && sim_run(g, 2, in, &rows2, &dw2);
    if (ok) {
        EXPECT(memcmp(rows1.data, rows2.data, gt_tensor_nbytes(&rows1)) == 0,
               "combined rows: ep 2 bitwise ep 1");
        EXPECT(memcmp(dw1.data, dw2.data, gt_tensor_nbytes(&dw1)) == 0,
               "weight gradient: ep 2 bitwise ep 1");
        EXPECT(memcmp(rows2.data, ref[0].data, gt_tensor_nbytes(&rows2)) == 0,
               "combined rows: bitwise the one-process graph");
        double worst = 0, scale = 0;
        const float *a = dw2.data, *b = ref[1].data;
        for (int64_t i = 0; i < gt_tensor_numel(&dw2); i++) {
            double d = a[i] - b[i];
            worst = d < 0 ? (-d > worst ? -d : worst) : (d > worst ? d : worst);
            scale = b[i] < 0 ? (-b[i] > scale ? -b[i] : scale) : (b[i] > scale ? b[i] : scale);
        }
        EXPECT(worst <= 1e-5 * scale, "weight gradient vs the one-process graph: %g of %g", worst,
               scale);
    }
    gt_tensor_free(&rows1);
    gt_tensor_free(&rows2);
    gt_tensor_free(&dw1);
    gt_tensor_free(&dw2);
    for (int k = 0; k < 3; k++)
        gt_tensor_free(&in[k]);
    for (int k = 0; k < 2; k++)
        gt_tensor_free(&ref[k]);
    gt_graph_free(g);
}

/* The layout's expert-parallel checks, each error naming the option. g_sp: the
 * enable_sequence_parallel value to set, or NULL for the default. */
static const char *g_sp;

static void layout_case(const char *flavor, int shard, int tp, int ep, const char *factor,
                        const char *want)
{
    gt_config cfg;
    gt_config_defaults(&cfg);
    gt_error err = {0};
    char v[32];
    EXPECT_OK(gt_config_set(&cfg, "model.name", "deepseek_v3", &err), &err);
    EXPECT_OK(gt_config_set(&cfg, "model.flavor", flavor, &err), &err);
    snprintf(v, sizeof v, "%d", shard);
    EXPECT_OK(gt_config_set(&cfg, "parallelism.data_parallel_shard_degree", v, &err), &err);
    snprintf(v, sizeof v, "%d", tp);
    EXPECT_OK(gt_config_set(&cfg, "parallelism.tensor_parallel_degree", v, &err), &err);
    snprintf(v, sizeof v, "%d", ep);
    EXPECT_OK(gt_config_set(&cfg, "parallelism.expert_parallel_degree", v, &err), &err);
    if (factor)
        EXPECT_OK(gt_config_set(&cfg, "parallelism.expert_parallel_capacity_factor", factor, &err),
                  &err);
    if (g_sp)
        EXPECT_OK(gt_config_set(&cfg, "parallelism.enable_sequence_parallel", g_sp, &err), &err);
    gt_train_layout layout;
    gt_status st = gt_train_layout_init(&cfg, 0, 0, &layout, &err);
    if (!want)
        EXPECT(st == GT_OK, "%s shard %d tp %d ep %d: %s", flavor, shard, tp, ep, err.msg);
    else
        EXPECT(st != GT_OK && strstr(err.msg, want), "%s shard %d tp %d ep %d: want '%s', got %s",
               flavor, shard, tp, ep, want, st == GT_OK ? "success" : err.msg);
    gt_config_free(&cfg);
}

static void test_layout_checks(void)
{
    layout_case("test_dsv3_tiny", 2, 1, 2, NULL, NULL);
    layout_case("test_dsv3_tiny", 2, 1, 2, "0.5", NULL);
    layout_case("test_dsv3_tiny", 2, 1, 3, NULL,
                "parallelism.expert_parallel_degree = 3 must divide data_parallel_shard_degree");
    layout_case("test_dsv3_tiny", 3, 1, 3, NULL, "must divide the 8 routed experts");
    layout_case("test_dsv3_tiny", 4, 1, 2, NULL, NULL); /* efsdp 2 x ep 2 */
    layout_case("test_dsv3_tiny", 4, 2, 2, NULL, NULL); /* the same, MoE replicated over tp */
    layout_case("test_dsv3_tiny", 16, 1, 2, NULL,
                "8 routed experts of deepseek_v3 test_dsv3_tiny to divide by "
                "data_parallel_shard_degree");
    /* ep groups that take tp ranks, with or without sequence parallelism: whole experts per
     * rank of dp_shard x tp */
    layout_case("test_dsv3_tiny", 1, 2, 2, NULL, NULL);
    g_sp = "false";
    layout_case("test_dsv3_tiny", 1, 2, 2, NULL, NULL);
    layout_case("test_dsv3_tiny", 2, 2, 4, NULL, NULL);
    layout_case("test_dsv3_tiny", 3, 2, 2, NULL,
                "8 routed experts of deepseek_v3 test_dsv3_tiny to divide by "
                "data_parallel_shard_degree x tensor_parallel_degree = 6");
    layout_case("test_dsv3_tiny", 2, 2, 3, NULL,
                "parallelism.expert_parallel_degree = 3 must divide data_parallel_shard_degree x "
                "tensor_parallel_degree");
    g_sp = NULL;
    layout_case("test_dsv3_tiny", 2, 2, 2, NULL, NULL); /* the MoE replicated over tp */
    layout_case("test_dsv3_tiny", 2, 1, 2, "0.0001", "expert_parallel_capacity_factor");
}

int main(void)
{
    test_kernels();
    test_expansion();
    test_expansion_split();
    test_expansion_tp();
    test_simulated_ranks();
    test_layout_checks();
    return gt_test_finish();
}
