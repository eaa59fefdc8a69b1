/* test_remat.c — memory_policy tagging and remat on a small handmade two-block model.
 *
 * The model (fqns as a transformer's), f32, x: INPUT [4, 8]:
 *   h0 = x * we                                   embed          (outside every block)
 *   block i = 0, 1:
 *     a = rms_norm(h_i, nw_i)                     layers.i.attention_norm
 *     b = matmul(a, w_i^T)                        layers.i.feed_forward.w1
 *     c = silu(b)                                 layers.i.feed_forward
 *     d = c * b                                   layers.i.feed_forward
 *     e = matmul(d, v_i^T)                        layers.i.feed_forward.w2
 *     h_{i+1} = h_i + e                           layers.i
 *   n = rms_norm(h2, nf)                          norm
 *   loss = mean(n)                                loss
 * and gt_autodiff's backward. Block boundaries: h0, h1 (read by the next block) and h2 (read by
 * the final norm). The backward reads a (for dw), b (silu and mul grads), c, d (for dv) of each
 * block and the boundaries; it never reads e. By the policies' definitions, then:
 *   none     tags nothing;
 *   full     tags a, b, c, d of both blocks (e is not needed: only the forward add reads it);
 *   default  tags a, c, d (b and e are matmul outputs, saved).
 * These sets are written out by hand below, from the model, not from the pass.
 *
 * Remat is checked on the structure it promises (a copy per tagged node, phase bwd, origin the
 * original, tagged "recompute", placed in a run right before the first backward node that reads
 * it; every backward use rewired; forward nodes untouched and in their order; verifier passes)
 * and on the numbers (eager run of the rewritten graph: the same bits as the original). Refusals:
 * a tagged node that reads a backward value, and a node with no room for the tag. */
#include <stdlib.h>
#include <string.h>

#include "fqn_units.h"
#include "graphtrain/gt_autodiff.h"
#include "graphtrain/gt_build.h"
#include "graphtrain/gt_exec.h"
#include "graphtrain/gt_pass.h"
#include "gt_test.h"

typedef struct {
    gt_graph *g;
    gt_value_id a[2], b[2], c[2], d[2], e[2], h[3];
} model;

static void build_model(model *m)
{
    gt_graph *g = m->g = gt_graph_new();
    gt_expr d48[2] = {gt_c(g, 4), gt_c(g, 8)}, d8[1] = {gt_c(g, 8)},
            d88[2] = {gt_c(g, 8), gt_c(g, 8)};
    gt_value_id x = gt_graph_add_input(g, GT_IN_INPUT, "x", GT_F32, 2, d48);
    gt_value_id we = gt_graph_add_input(g, GT_IN_PARAM, "embed.weight", GT_F32, 1, d8);
    gt_graph_set_fqn(g, "embed");
    m->h[0] = gt_mul(g, x, we);
    for (int i = 0; i < 2; i++) {
        char name[64];
        snprintf(name, sizeof name, "layers.%d.attention_norm.weight", i);
        gt_value_id nw = gt_graph_add_input(g, GT_IN_PARAM, name, GT_F32, 1, d8);
        snprintf(name, sizeof name, "layers.%d.feed_forward.w1.weight", i);
        gt_value_id w = gt_graph_add_input(g, GT_IN_PARAM, name, GT_F32, 2, d88);
        snprintf(name, sizeof name, "layers.%d.feed_forward.w2.weight", i);
        gt_value_id v = gt_graph_add_input(g, GT_IN_PARAM, name, GT_F32, 2, d88);
        snprintf(name, sizeof name, "layers.%d.attention_norm", i);
        gt_graph_set_fqn(g, name);
        m->a[i] = gt_rms_norm(g, m->h[i], nw, 1e-5);
        snprintf(name, sizeof name, "layers.%d.feed_forward.w1", i);
        gt_graph_set_fqn(g, name);
        m->b[i] = gt_matmul(g, m->a[i], w, false, true);
        snprintf(name, sizeof name, "layers.%d.feed_forward", i);
        gt_graph_set_fqn(g, name);
        m->c[i] = gt_unary(g, GT_OP_SILU, m->b[i]);
        m->d[i] = gt_mul(g, m->c[i], m->b[i]);
        snprintf(name, sizeof name, "layers.%d.feed_forward.w2", i);
        gt_graph_set_fqn(g, name);
        m->e[i] = gt_matmul(g, m->d[i], v, false, true);
        snprintf(name, sizeof name, "layers.%d", i);
        gt_graph_set_fqn(g, name);
        m->h[i + 1] = gt_add(g, m->h[i], m->e[i]);
    }
    gt_value_id nf = gt_graph_add_input(g, GT_IN_PARAM, "norm.weight", GT_F32, 1, d8);
    gt_graph_set_fqn(g, "norm");
    gt_value_id n = gt_rms_norm(g, m->h[2], nf, 1e-5);
    gt_graph_set_fqn(g, "loss");
    int dims[2] = {0, 1};
    gt_value_id loss = gt_reduce(g, GT_OP_MEAN, n, 2, dims, false);
    gt_graph_set_fqn(g, NULL);
    gt_graph_add_output(g, GT_OUT_LOSS, "loss", loss);
    gt_error err = {0};
    EXPECT(g->err.code == GT_OK, "build: %s", g->err.msg);
    EXPECT_OK(gt_autodiff(g, &err), &err);
    EXPECT_OK(gt_graph_verify(g, &err), &err);
    gt_test_units_from_fqns(g);
}

static gt_pass_options options(gt_memory_policy p)
{
    return (gt_pass_options){.verify_each = true, .quiet = true, .memory_policy = p};
}

static gt_status run_one(gt_graph *g, gt_pass_fn pass, gt_memory_policy p, gt_error *err)
{
    gt_pass_options o = options(p);
    gt_pass_ctx ctx = {.options = &o, .index = 0};
    return pass(g, &ctx, err);
}

static bool tagged(const gt_graph *g, gt_node_id n)
{
    return gt_node_has_tag(g, &g->nodes[n], "recompute");
}

/* The set of tagged nodes equals exactly the producers of want[0..nw). */
static void expect_tagged(const model *m, const gt_value_id *want, int nw, const char *policy)
{
    const gt_graph *g = m->g;
    int n_tagged = 0;
    for (gt_node_id n = 0; n < g->n_nodes; n++)
        n_tagged += tagged(g, n);
    EXPECT(n_tagged == nw, "%s: %d nodes tagged, expected %d", policy, n_tagged, nw);
    for (int k = 0; k < nw; k++) {
        gt_node_id p = g->values[want[k]].producer;
        EXPECT(tagged(g, p), "%s: node of %%%d (%s) not tagged", policy, want[k],
               gt_op_get(g->nodes[p].op)->name);
    }
}

static void test_tagging(void)
{
    gt_error err = {0};
    static const gt_memory_policy policies[] = {GT_MEMORY_POLICY_NONE, GT_MEMORY_POLICY_FULL,
                                                GT_MEMORY_POLICY_DEFAULT};
    for (int p = 0; p < 3; p++) {
        model m;
        build_model(&m);
        /* a stale tag on a node no policy recomputes must go */
        gt_graph_add_tag(m.g, m.g->values[m.h[0]].producer, "recompute");
        gt_value_id want[8];
        int nw = 0;
        for (int i = 0; i < 2 && policies[p] != GT_MEMORY_POLICY_NONE; i++) {
            want[nw++] = m.a[i];
            if (policies[p] == GT_MEMORY_POLICY_FULL) want[nw++] = m.b[i];
            want[nw++] = m.c[i];
            want[nw++] = m.d[i];
        }
        int32_t nodes = m.g->n_nodes;
        EXPECT_OK(run_one(m.g, gt_pass_memory_policy, policies[p], &err), &err);
        EXPECT(m.g->n_nodes == nodes, "memory_policy changed the node count");
        expect_tagged(&m, want, nw, gt_memory_policy_name(policies[p]));
        EXPECT_OK(gt_graph_verify(m.g, &err), &err);
        gt_graph_free(m.g);
    }
}

/* ---------------------------------------------------------------- remat */

static gt_tensor *inputs_for(const gt_graph *g)
{
    gt_tensor *in = calloc((size_t)g->n_inputs, sizeof *in);
    gt_error err = {0};
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (int32_t k = 0; k < g->n_inputs; k++) {
        const gt_type *t = gt_value_type(g, g->inputs[k].value);
        int64_t shape[GT_MAX_DIMS];
        EXPECT_OK(gt_graph_eval_shape(g, g->inputs[k].value, NULL, shape, &err), &err);
        EXPECT_OK(gt_tensor_alloc(&in[k], t->dtype, t->ndim, shape, &err), &err);
        float *d = in[k].data;
        for (int64_t i = 0; i < gt_tensor_numel(&in[k]); i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            d[i] = (float)((double)(x >> 11) / 9007199254740992.0 - 0.5);
        }
    }
    return in;
}

/* Eager runs of a and b on the same inputs give the same bits on every output. */
static void expect_same_results(const gt_graph *a, const gt_graph *b, const char *what)
{
    gt_error err = {0};
    gt_tensor *in = inputs_for(a);
    gt_tensor *oa = calloc((size_t)a->n_outputs, sizeof *oa),
              *ob = calloc((size_t)b->n_outputs, sizeof *ob);
    EXPECT_OK(gt_eager_run(a, NULL, in, oa, &err), &err);
    EXPECT_OK(gt_eager_run(b, NULL, in, ob, &err), &err);
    EXPECT(a->n_outputs == b->n_outputs, "%s: output count", what);
    for (int32_t k = 0; k < a->n_outputs && k < b->n_outputs && err.code == GT_OK; k++)
        EXPECT(gt_tensor_nbytes(&oa[k]) == gt_tensor_nbytes(&ob[k]) &&
                   memcmp(oa[k].data, ob[k].data, gt_tensor_nbytes(&oa[k])) == 0,
               "%s: output %d differs", what, k);
    for (int32_t k = 0; k < a->n_inputs; k++)
        gt_tensor_free(&in[k]);
    for (int32_t k = 0; k < a->n_outputs; k++)
        gt_tensor_free(&oa[k]), gt_tensor_free(&ob[k]);
    free(in);
    free(oa);
    free(ob);
}

static bool is_copy(const gt_graph *g, gt_node_id n)
{
    return g->nodes[n].phase == GT_PHASE_BACKWARD && tagged(g, n);
}

/* Structure promised by remat (see the header comment), against the graph before remat. */
static void check_remat_structure(const gt_graph *before, const gt_graph *g, const char *policy)
{
    int32_t n_tagged = 0, n_copies = 0;
    for (gt_node_id n = 0; n < before->n_nodes; n++)
        n_tagged += before->nodes[n].phase == GT_PHASE_FORWARD && tagged(before, n);
    /* the originals keep their relative order and their inputs; the forward never reads a copy */
    gt_node_id k = 0;
    for (gt_node_id n = 0; n < g->n_nodes; n++) {
        const gt_node *nd = &g->nodes[n];
        if (is_copy(g, n)) {
            n_copies++;
            continue;
        }
        const gt_node *od = &before->nodes[k++];
        EXPECT(nd->op == od->op && nd->phase == od->phase, "%s: node %d is not original %d", policy,
               n, k - 1);
        for (int j = 0; j < nd->n_in; j++) {
            gt_node_id p = g->values[nd->in[j]].producer;
            if (nd->phase == GT_PHASE_FORWARD)
                EXPECT(nd->in[j] == od->in[j], "%s: forward node %d input %d rewired", policy, n,
                       j);
            else if (p != GT_NONE)
                EXPECT(!(g->nodes[p].phase == GT_PHASE_FORWARD && tagged(g, p)),
                       "%s: backward node %d still reads %%%d of tagged forward node %d", policy, n,
                       nd->in[j], p);
        }
    }
    EXPECT(k == before->n_nodes, "%s: %d originals, expected %d", policy, k, before->n_nodes);
    EXPECT(n_copies == n_tagged, "%s: %d copies for %d tagged nodes", policy, n_copies, n_tagged);
    /* each copy: same op and attributes as its origin, a tagged forward node; each origin copied
     * once; each run of copies ends right before a non-copy node that reads one of them */
    uint8_t *seen = calloc((size_t)g->n_nodes + 1, 1);
    for (gt_node_id n = 0; n < g->n_nodes; n++) {
        if (!is_copy(g, n)) continue;
        const gt_node *c = &g->nodes[n];
        gt_node_id o = c->origin;
        EXPECT(o >= 0 && o < n && g->nodes[o].phase == GT_PHASE_FORWARD && tagged(g, o) &&
                   g->nodes[o].op == c->op &&
                   memcmp(&g->nodes[o].attrs, &c->attrs, sizeof c->attrs) == 0 &&
                   g->nodes[o].fqn == c->fqn,
               "%s: copy %d has a bad origin %d", policy, n, o);
        if (o >= 0 && o < g->n_nodes) {
            EXPECT(!seen[o], "%s: node %d copied twice", policy, o);
            seen[o] = 1;
        }
        for (int j = 0; j < c->n_in; j++) {
            gt_node_id p = g->values[c->in[j]].producer;
            EXPECT(p == GT_NONE || is_copy(g, p) || g->nodes[p].phase == GT_PHASE_FORWARD,
                   "%s: copy %d reads a backward value", policy, n);
            EXPECT(p == GT_NONE || !(g->nodes[p].phase == GT_PHASE_FORWARD && tagged(g, p)),
                   "%s: copy %d reads the original of a recomputed value", policy, n);
        }
        if (n + 1 < g->n_nodes && !is_copy(g, n + 1)) {
            /* the run [first, n] ends here: node n + 1 must read one of its copies */
            gt_node_id first = n;
            while (first > 0 && is_copy(g, first - 1))
                first--;
            bool reads = false;
            const gt_node *u = &g->nodes[n + 1];
            for (int j = 0; j < u->n_in; j++) {
                gt_node_id p = g->values[u->in[j]].producer;
                reads |= p >= first && p <= n;
            }
            EXPECT(reads && u->phase != GT_PHASE_FORWARD,
                   "%s: copies %d..%d are not right before a backward node that reads them", policy,
                   first, n);
            /* and no earlier backward node reads a value of the run's origins */
            for (gt_node_id q = 0; q < first; q++) {
                const gt_node *qd = &g->nodes[q];
                if (qd->phase == GT_PHASE_FORWARD || is_copy(g, q)) continue;
                for (int j = 0; j < qd->n_in; j++) {
                    gt_node_id p = g->values[qd->in[j]].producer;
                    EXPECT(!(p >= first && p <= n), "%s: node %d reads copy %d before", policy, q,
                           p);
                }
            }
        }
    }
    free(seen);
}

static void test_remat(void)
{
    gt_error err = {0};
    static const gt_memory_policy policies[] = {GT_MEMORY_POLICY_NONE, GT_MEMORY_POLICY_FULL,
                                                GT_MEMORY_POLICY_DEFAULT};
    for (int p = 0; p < 3; p++) {
        const char *name = gt_memory_policy_name(policies[p]);
        model m;
        build_model(&m);
        gt_graph *orig = gt_graph_copy(m.g);
        EXPECT_OK(run_one(m.g, gt_pass_memory_policy, policies[p], &err), &err);
        gt_graph *tagged_graph = gt_graph_copy(m.g);
        EXPECT_OK(run_one(m.g, gt_pass_remat, policies[p], &err), &err);
        EXPECT_OK(gt_graph_verify(m.g, &err), &err);
        check_remat_structure(tagged_graph, m.g, name);
        expect_same_results(orig, m.g, name);
        /* then dce: still exact and valid */
        EXPECT_OK(run_one(m.g, gt_pass_dce, policies[p], &err), &err);
        EXPECT_OK(gt_graph_verify(m.g, &err), &err);
        expect_same_results(orig, m.g, name);
        gt_graph_free(tagged_graph);
        gt_graph_free(orig);
        gt_graph_free(m.g);
    }
    /* full: block 1's copies come before its first backward use, which precedes block 0's */
    model m;
    build_model(&m);
    EXPECT_OK(run_one(m.g, gt_pass_memory_policy, GT_MEMORY_POLICY_FULL, &err), &err);
    EXPECT_OK(run_one(m.g, gt_pass_remat, GT_MEMORY_POLICY_FULL, &err), &err);
    gt_node_id first_copy[2] = {-1, -1};
    for (gt_node_id n = 0; n < m.g->n_nodes; n++) {
        if (!is_copy(m.g, n)) continue;
        const char *fqn = gt_graph_str(m.g, m.g->nodes[n].fqn);
        int layer = strncmp(fqn, "layers.1", 8) == 0 ? 1 : 0;
        if (first_copy[layer] < 0) first_copy[layer] = n;
    }
    EXPECT(first_copy[1] >= 0 && first_copy[0] > first_copy[1],
           "full: block 1 recomputed at %d, block 0 at %d", first_copy[1], first_copy[0]);
    gt_graph_free(m.g);
}

/* ---------------------------------------------------------------- refusals */

static void test_refusals(void)
{
    gt_error err = {0};
    /* a forward-phase node inside a block that reads a backward value (the last gradient), read
     * in turn by the backward: no policy may tag it, and remat refuses it when tagged by hand */
    model m;
    build_model(&m);
    gt_graph *g = m.g;
    gt_value_id grad = g->nodes[g->n_nodes - 1].out[0];
    gt_graph_set_fqn(g, "layers.0.feed_forward");
    gt_graph_set_unit(g, 0);
    g->cur_phase = GT_PHASE_FORWARD;
    gt_value_id z = gt_unary(g, GT_OP_SILU, grad);
    g->cur_phase = GT_PHASE_BACKWARD;
    gt_value_id w = gt_scale(g, z, 2.0);
    gt_graph_add_output(g, GT_OUT_METRIC, "w", w);
    EXPECT(g->err.code == GT_OK, "build: %s", g->err.msg);
    gt_node_id zn = g->values[z].producer;
    EXPECT_OK(run_one(g, gt_pass_memory_policy, GT_MEMORY_POLICY_FULL, &err), &err);
    EXPECT(!tagged(g, zn), "full tagged a node that reads a backward value");
    EXPECT(tagged(g, g->values[m.c[0]].producer), "full did not tag silu of block 0");
    gt_graph_add_tag(g, zn, "recompute");
    gt_status st = run_one(g, gt_pass_remat, GT_MEMORY_POLICY_FULL, &err);
    EXPECT(st == GT_ERR_INVALID && strstr(err.msg, "cannot be recomputed") &&
               strstr(err.msg, "outside the forward") && strstr(err.msg, "silu"),
           "remat accepted a node that reads a backward value: %s", err.msg);
    printf("refused as expected: %s\n", err.msg);
    gt_graph_free(g);

    /* a node the policy must tag but that has no room for another tag */
    build_model(&m);
    g = m.g;
    gt_node_id cn = g->values[m.c[1]].producer;
    for (int k = 0; k < GT_MAX_TAGS; k++) {
        char t[16];
        snprintf(t, sizeof t, "t%d", k);
        gt_graph_add_tag(g, cn, t);
    }
    memset(&err, 0, sizeof err);
    st = run_one(g, gt_pass_memory_policy, GT_MEMORY_POLICY_DEFAULT, &err);
    EXPECT(st == GT_ERR_INVALID && strstr(err.msg, "recompute") && strstr(err.msg, "silu"),
           "memory_policy: expected a refusal naming the node: %s", err.msg);
    printf("refused as expected: %s\n", err.msg);
    gt_graph_free(g);

    /* the pipeline: memory_policy and remat sit between cse and dce; fusion after dce; the FSDP
     * passes (and reduce_scatter_narrow, which rewrites the buckets) last */
    int n = 0;
    const gt_pass_info *reg = gt_pass_registry(&n);
    static const char *const want[] = {
        "canonicalize", "cse",       "memory_policy",  "remat",
        "dce",          "fusion",    "fsdp_bucketing", "reduce_scatter_narrow",
        "fsdp_reorder", "ep_overlap"};
    EXPECT(n == 10, "registry has %d passes", n);
    for (int k = 0; k < n && k < 10; k++)
        EXPECT(strcmp(reg[k].name, want[k]) == 0 && reg[k].numerics == GT_PASS_EXACT,
               "registry[%d] = %s", k, reg[k].name);
}

int main(void)
{
    test_tagging();
    test_remat();
    test_refusals();
    return gt_test_finish();
}
