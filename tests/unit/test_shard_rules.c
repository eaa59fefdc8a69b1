/* test_shard_rules.c — every sharding rule (src/parallel/rules*.c) proved on data.
 *
 * For single-node global graphs covering every op that can appear in a global graph (several
 * shapes: matmul with each transpose flag, batched and with a parameter operand, broadcasting
 * elementwise ops, reshapes that merge and split, ...), and every combination of input
 * placements a 2-rank mesh dim allows (R, S(d) for each dim that splits in two, P for float
 * activations; a fixed random sample when there are more than MAX_COMBOS), on dp_shard, on tp,
 * and on tp with sequence parallel: gt_parallelize turns the graph into the SPMD graph
 * (converting inputs as each rule wants, expanding vocabulary-parallel ops), both ranks run it
 * with gt_eager_run_comms on threads joined by an in-process communicator (tests/shard_sim.h),
 * and the ranks' outputs, combined by their placements (R: the two ranks' bits are identical;
 * S: blocks concatenated; P: summed), must equal gt_eager_run of the global graph — bitwise for
 * ops that only move or map elements when no input is partial, else within 1e-5 relative. Local
 * inputs come from random global inputs: R the whole tensor, S the rank's block
 * (gt_placement_local_box), P rank 0 gets x - r and rank 1 gets r. Every op of gt_ops.def outside
 * the parallel ones must be covered. The rules' choices (which of the correct options they take)
 * are tests/unit/test_shard_decisions.c. */
#include <string.h>

#include "graphtrain/gt_backend.h"
#include "graphtrain/gt_build.h"
#include "graphtrain/gt_exec.h"
#include "graphtrain/gt_parallel.h"
#include "gt_test.h"
#include "parallel/parallel_internal.h"
#include "shard_sim.h"

#define NRANK SIM_RANKS
#define MAX_COMBOS 160 /* per case and mesh dim; beyond that a fixed random sample */
#define MAX_CASES 96
#define IGNORE (-100)

/* ---------------------------------------------------------------- PRNG (splitmix64) */

typedef struct {
    uint64_t s;
} rng;

static uint64_t rng_next(rng *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double rng_uniform(rng *r, double lo, double hi)
{
    return lo + (hi - lo) * (double)(rng_next(r) >> 11) * 0x1p-53;
}

/* ---------------------------------------------------------------- tensors */

static gt_tensor new_tensor(gt_dtype dt, int ndim, const int64_t *shape)
{
    gt_tensor t;
    gt_error err = {0};
    GT_CHECK(gt_tensor_alloc(&t, dt, ndim, shape, &err) == GT_OK);
    if (gt_tensor_nbytes(&t)) memset(t.data, 0, gt_tensor_nbytes(&t));
    return t;
}

static bool is_index(gt_dtype dt)
{
    return dt == GT_I32 || dt == GT_I64;
}

/* ---------------------------------------------------------------- cases */

typedef struct tcase tcase;
struct tcase {
    char name[64];
    gt_graph *g;
    int64_t batch;       /* value of the symbol "batch" (0: unused) */
    bool exact;          /* pure data movement / per-element: bitwise when no input is partial */
    bool positive;       /* float inputs in [0.5, 2) (log, sqrt, div) instead of [-1, 1) */
    int64_t int_hi;      /* index inputs uniform in [0, int_hi) */
    unsigned no_partial; /* bit k: input k is never given P (max_backward's y) */
    void (*fix)(const tcase *tc, gt_tensor *inputs); /* makes inputs consistent */
};

typedef struct {
    tcase c[MAX_CASES];
    int n;
} case_list;

static tcase *new_case(case_list *l, const char *name)
{
    GT_CHECK(l->n < MAX_CASES);
    tcase *tc = &l->c[l->n++];
    memset(tc, 0, sizeof *tc);
    snprintf(tc->name, sizeof tc->name, "%s", name);
    tc->g = gt_graph_new();
    tc->exact = true;
    tc->int_hi = 6;
    return tc;
}

static gt_value_id input(tcase *tc, gt_input_kind kind, const char *name, gt_dtype dt, int ndim,
                         const int64_t *dims)
{
    gt_expr e[GT_MAX_DIMS];
    for (int k = 0; k < ndim; k++)
        e[k] = dims[k] < 0 ? gt_sym_var(tc->g->sym, "batch") : gt_c(tc->g, dims[k]);
    return gt_graph_add_input(tc->g, kind, name, dt, ndim, e);
}
#define DIMS(...)                                                                                  \
    (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (int64_t[])                         \
    {                                                                                              \
        __VA_ARGS__                                                                                \
    }
#define X(tc, name, ...) input(tc, GT_IN_INPUT, name, GT_F32, DIMS(__VA_ARGS__))
#define IDS(tc, name, ...) input(tc, GT_IN_INPUT, name, GT_I64, DIMS(__VA_ARGS__))

static void output(tcase *tc, gt_value_id v)
{
    char name[16];
    snprintf(name, sizeof name, "out%d", tc->g->n_outputs);
    gt_graph_add_output(tc->g, GT_OUT_METRIC, name, v);
}

/* y = max of x over the node's dims, so that max_backward routes to real maxima. */
static void fix_max_backward(const tcase *tc, gt_tensor *in)
{
    const gt_node *n = &tc->g->nodes[tc->g->n_nodes - 1];
    const gt_tensor *x = &in[0];
    gt_tensor *y = &in[1];
    bool red[GT_MAX_DIMS] = {false};
    for (int k = 1; k < n->attrs.ni; k++)
        red[n->attrs.i[k]] = true;
    for (int64_t i = 0; i < gt_tensor_numel(y); i++)
        gt_tensor_set_f32(y, i, -INFINITY);
    int64_t idx[GT_MAX_DIMS] = {0};
    for (int64_t i = 0; i < gt_tensor_numel(x); i++) {
        int64_t rem = i, yo = 0;
        for (int d = x->ndim - 1; d >= 0; d--) {
            idx[d] = rem % x->shape[d];
            rem /= x->shape[d];
        }
        for (int d = 0; d < x->ndim; d++)
            yo = yo * (red[d] ? 1 : x->shape[d]) + (red[d] ? 0 : idx[d]);
        float v = gt_tensor_get_f32(x, i);
        if (v > gt_tensor_get_f32(y, yo)) gt_tensor_set_f32(y, yo, v);
    }
}

/* Targets: rows 1 and 3 of 4 ignored, so each half of a row split has the same count (the
 * data-parallel loss is a mean of per-rank means: exact only for equal counts). */
static void fix_targets(const tcase *tc, gt_tensor *in)
{
    (void)tc;
    int64_t *t = in[1].data;
    t[1] = t[3] = IGNORE;
}

/* adamw: v >= 0, scalars = {lr, 1 - beta1^t, 1 - beta2^t}, clip in (0, 1]. */
static void fix_adamw(const tcase *tc, gt_tensor *in)
{
    (void)tc;
    for (int64_t i = 0; i < gt_tensor_numel(&in[3]); i++)
        gt_tensor_set_f32(&in[3], i, 0.2f + fabsf(gt_tensor_get_f32(&in[3], i)));
    float s[3] = {0.01f, 0.19f, 0.0297f};
    memcpy(in[4].data, s, sizeof s);
    *(float *)in[5].data = 0.8f;
}

static void elementwise_cases(case_list *l)
{
    static const gt_op unary[] = {GT_OP_NEG,   GT_OP_EXP,  GT_OP_LOG,    GT_OP_SQRT,
                                  GT_OP_RSQRT, GT_OP_SILU, GT_OP_SIGMOID};
    for (size_t k = 0; k < sizeof unary / sizeof unary[0]; k++) {
        tcase *tc = new_case(l, gt_op_get(unary[k])->name);
        tc->positive = true;
        output(tc, gt_unary(tc->g, unary[k], X(tc, "x", 4, 6)));
    }
    tcase *tc = new_case(l, "scale");
    output(tc, gt_scale(tc->g, X(tc, "x", 4, 6), 1.5));
    tc = new_case(l, "add_scalar");
    output(tc, gt_add_scalar(tc->g, X(tc, "x", 4, 6), 0.25));
    tc = new_case(l, "clamp");
    output(tc, gt_clamp(tc->g, X(tc, "x", 4, 6), -0.5, 0.5));
    tc = new_case(l, "cast f32->bf16");
    output(tc, gt_cast(tc->g, X(tc, "x", 4, 6), GT_BF16));
    tc = new_case(l, "cast bf16->f32");
    output(tc, gt_cast(tc->g, input(tc, GT_IN_INPUT, "x", GT_BF16, DIMS(4, 6)), GT_F32));
    /* [b, s, D] activations: sequence parallel applies */
    tc = new_case(l, "add [2,4,6]+[2,4,6]");
    output(tc, gt_add(tc->g, X(tc, "a", 2, 4, 6), X(tc, "b", 2, 4, 6)));
    tc = new_case(l, "mul [2,4,6]*[6]");
    output(tc, gt_mul(tc->g, X(tc, "a", 2, 4, 6), X(tc, "b", 6)));
    tc = new_case(l, "silu [2,4,6]");
    output(tc, gt_unary(tc->g, GT_OP_SILU, X(tc, "x", 2, 4, 6)));
    tc = new_case(l, "silu_backward");
    output(tc, gt_silu_backward(tc->g, X(tc, "x", 4, 6), X(tc, "dy", 4, 6)));

    tc = new_case(l, "add [4,6]+[4,6]");
    output(tc, gt_add(tc->g, X(tc, "a", 4, 6), X(tc, "b", 4, 6)));
    tc = new_case(l, "add [2,4,6]+[4,1]");
    output(tc, gt_add(tc->g, X(tc, "a", 2, 4, 6), X(tc, "b", 4, 1)));
    tc = new_case(l, "sub [6]-[4,6]");
    output(tc, gt_sub(tc->g, X(tc, "a", 6), X(tc, "b", 4, 6)));
    tc = new_case(l, "mul [4,6]*[1,6]");
    output(tc, gt_mul(tc->g, X(tc, "a", 4, 6), X(tc, "b", 1, 6)));
    tc = new_case(l, "mul [4,6]*[4,6]");
    output(tc, gt_mul(tc->g, X(tc, "a", 4, 6), X(tc, "b", 4, 6)));
    tc = new_case(l, "div [4,6]/[4,6]");
    tc->positive = true;
    output(tc, gt_div(tc->g, X(tc, "a", 4, 6), X(tc, "b", 4, 6)));
    tc = new_case(l, "div [4,6]/[6]");
    tc->positive = true;
    output(tc, gt_div(tc->g, X(tc, "a", 4, 6), X(tc, "b", 6)));
}

static void reduce_cases(case_list *l)
{
    struct {
        gt_op op;
        int nd, dims[2], keep;
    } r[] = {{GT_OP_SUM, 1, {1}, 0},         {GT_OP_SUM, 2, {0, 2}, 1},
             {GT_OP_MEAN, 1, {0}, 0},        {GT_OP_MEAN, 2, {1, 2}, 1},
             {GT_OP_MAX, 1, {1}, 0},         {GT_OP_MAX, 1, {0}, 1},
             {GT_OP_SUM_SQUARES, 1, {1}, 0}, {GT_OP_SUM_SQUARES, 2, {0, 2}, 1}};
    for (size_t k = 0; k < sizeof r / sizeof r[0]; k++) {
        char name[64];
        snprintf(name, sizeof name, "%s dims %d%s keepdim %d", gt_op_get(r[k].op)->name,
                 r[k].dims[0], r[k].nd > 1 ? "+" : "", r[k].keep);
        tcase *tc = new_case(l, name);
        tc->exact = r[k].op == GT_OP_MAX;
        output(tc,
               gt_reduce(tc->g, r[k].op, X(tc, "x", 4, 6, 2), r[k].nd, r[k].dims, r[k].keep != 0));
    }
    for (int keep = 0; keep < 2; keep++) {
        tcase *tc = new_case(l, keep ? "max_backward dims 1 keepdim" : "max_backward dims 0");
        tc->fix = fix_max_backward;
        tc->no_partial = 3u; /* x and y exact: y must stay x's maximum */
        int dim = keep ? 1 : 0;
        gt_value_id x = X(tc, "x", 4, 6);
        gt_value_id y = keep ? X(tc, "y", 4, 1) : X(tc, "y", 6);
        gt_value_id dy = keep ? X(tc, "dy", 4, 1) : X(tc, "dy", 6);
        output(tc, gt_max_backward(tc->g, x, y, dy, 1, &dim, keep != 0));
    }
    tcase *tc = new_case(l, "sum_to [2,4,6]->[4,1]");
    tc->exact = false;
    output(tc,
           gt_sum_to(tc->g, X(tc, "x", 2, 4, 6), 2, (gt_expr[]){gt_c(tc->g, 4), gt_c(tc->g, 1)}));
    tc = new_case(l, "sum_to [4,6]->[6]");
    tc->exact = false;
    output(tc, gt_sum_to(tc->g, X(tc, "x", 4, 6), 1, (gt_expr[]){gt_c(tc->g, 6)}));
}

static gt_value_id reshape_to(tcase *tc, gt_value_id x, int nd, const int64_t *dims)
{
    gt_expr e[GT_MAX_DIMS];
    for (int k = 0; k < nd; k++)
        e[k] = gt_c(tc->g, dims[k]);
    return gt_reshape(tc->g, x, nd, e);
}

static void layout_cases(case_list *l)
{
    tcase *tc = new_case(l, "full");
    output(tc, gt_full(tc->g, GT_F32, 2, (gt_expr[]){gt_c(tc->g, 4), gt_c(tc->g, 6)}, 0.5));
    tc = new_case(l, "broadcast_to [4,1]->[2,4,6]");
    output(tc, gt_broadcast_to(tc->g, X(tc, "x", 4, 1), 3,
                               (gt_expr[]){gt_c(tc->g, 2), gt_c(tc->g, 4), gt_c(tc->g, 6)}));
    tc = new_case(l, "broadcast_to [6]->[4,6]");
    output(tc,
           gt_broadcast_to(tc->g, X(tc, "x", 6), 2, (gt_expr[]){gt_c(tc->g, 4), gt_c(tc->g, 6)}));

    struct {
        const char *name;
        int ni, no;
        int64_t in[4], out[4];
    } rs[] = {{"reshape merge [2,4,6]->[8,6]", 3, 2, {2, 4, 6}, {8, 6}},
              {"reshape split [8,6]->[2,4,6]", 2, 3, {8, 6}, {2, 4, 6}},
              {"reshape heads [2,4,6]->[2,4,2,3]", 3, 4, {2, 4, 6}, {2, 4, 2, 3}},
              {"reshape heads [2,4,2,3]->[2,4,6]", 4, 3, {2, 4, 2, 3}, {2, 4, 6}},
              {"reshape [2,4,6]->[2,24]", 3, 2, {2, 4, 6}, {2, 24}},
              {"reshape [4,6]->[6,4]", 2, 2, {4, 6}, {6, 4}},
              {"reshape [4,1,6]->[4,6]", 3, 2, {4, 1, 6}, {4, 6}}};
    for (size_t k = 0; k < sizeof rs / sizeof rs[0]; k++) {
        tc = new_case(l, rs[k].name);
        output(tc, reshape_to(tc, input(tc, GT_IN_INPUT, "x", GT_F32, rs[k].ni, rs[k].in), rs[k].no,
                              rs[k].out));
    }
    tc = new_case(l, "transpose [4,6,2] (0,2)");
    output(tc, gt_transpose(tc->g, X(tc, "x", 4, 6, 2), 0, 2));
    tc = new_case(l, "permute [2,4,6] (2,0,1)");
    output(tc, gt_permute(tc->g, X(tc, "x", 2, 4, 6), 3, (int[]){2, 0, 1}));
    tc = new_case(l, "slice dim 1 [1,5)");
    output(tc, gt_slice(tc->g, X(tc, "x", 4, 6), 1, gt_c(tc->g, 1), gt_c(tc->g, 5)));
    tc = new_case(l, "slice dim 0 [0,2)");
    output(tc, gt_slice(tc->g, X(tc, "x", 4, 6), 0, gt_c(tc->g, 0), gt_c(tc->g, 2)));
    tc = new_case(l, "slice_backward dim 1");
    output(tc, gt_slice_backward(tc->g, X(tc, "dy", 4, 2), 1, gt_c(tc->g, 2), gt_c(tc->g, 4),
                                 gt_c(tc->g, 6)));
    tc = new_case(l, "concat dim 1");
    output(tc, gt_concat(tc->g, 2, (gt_value_id[]){X(tc, "a", 4, 2), X(tc, "b", 4, 4)}, 1));
    tc = new_case(l, "concat dim 0");
    output(tc, gt_concat(tc->g, 2, (gt_value_id[]){X(tc, "a", 2, 6), X(tc, "b", 2, 6)}, 0));
    tc = new_case(l, "split dim 1 (2,4)");
    gt_value_id outs[2];
    gt_split(tc->g, X(tc, "x", 4, 6), 1, 2, (gt_expr[]){gt_c(tc->g, 2), gt_c(tc->g, 4)}, outs);
    output(tc, outs[0]);
    output(tc, outs[1]);
}

static void matmul_cases(case_list *l)
{
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            char name[64];
            snprintf(name, sizeof name, "matmul [4,6]@[6,8] trans_a=%d trans_b=%d", ta, tb);
            tcase *tc = new_case(l, name);
            tc->exact = false;
            gt_value_id a = ta ? X(tc, "a", 6, 4) : X(tc, "a", 4, 6);
            gt_value_id b = tb ? X(tc, "b", 8, 6) : X(tc, "b", 6, 8);
            output(tc, gt_matmul(tc->g, a, b, ta, tb));
        }
    tcase *tc = new_case(l, "matmul x@w^T, w a parameter");
    tc->exact = false;
    gt_value_id w = input(tc, GT_IN_PARAM, "w", GT_F32, DIMS(8, 6));
    output(tc, gt_matmul(tc->g, X(tc, "x", 4, 6), w, false, true));
    tc = new_case(l, "matmul w@x, w a parameter");
    tc->exact = false;
    w = input(tc, GT_IN_PARAM, "w", GT_F32, DIMS(4, 6));
    output(tc, gt_matmul(tc->g, w, X(tc, "x", 6, 8), false, false));
    tc = new_case(l, "matmul [2,4,6]@[6,8]");
    tc->exact = false;
    output(tc, gt_matmul(tc->g, X(tc, "a", 2, 4, 6), X(tc, "b", 6, 8), false, false));
    tc = new_case(l, "matmul [2,4,6]@[2,8,6]^T");
    tc->exact = false;
    output(tc, gt_matmul(tc->g, X(tc, "a", 2, 4, 6), X(tc, "b", 2, 8, 6), false, true));
    tc = new_case(l, "matmul [batch,6]@[8,6]^T");
    tc->exact = false;
    tc->batch = 4;
    output(tc, gt_matmul(tc->g, X(tc, "x", -1, 6), input(tc, GT_IN_PARAM, "w", GT_F32, DIMS(8, 6)),
                         false, true));
}

static void nn_cases(case_list *l)
{
    tcase *tc = new_case(l, "rms_norm");
    output(tc, gt_rms_norm(tc->g, X(tc, "x", 2, 4, 6), X(tc, "w", 6), 1e-5));
    tc = new_case(l, "rms_norm_backward");
    tc->exact = false;
    gt_value_id outs[3];
    outs[0] = gt_rms_norm_backward(tc->g, X(tc, "x", 4, 6), X(tc, "w", 6), X(tc, "dy", 4, 6), 1e-5,
                                   &outs[1]);
    output(tc, outs[0]);
    output(tc, outs[1]);
    tc = new_case(l, "rms_norm_backward [2,4,6]");
    tc->exact = false;
    outs[0] = gt_rms_norm_backward(tc->g, X(tc, "x", 2, 4, 6), X(tc, "w", 6), X(tc, "dy", 2, 4, 6),
                                   1e-5, &outs[1]);
    output(tc, outs[0]);
    output(tc, outs[1]);
    tc = new_case(l, "matmul [2,4,6]@w^T, w a parameter");
    tc->exact = false;
    output(tc, gt_matmul(tc->g, X(tc, "x", 2, 4, 6),
                         input(tc, GT_IN_PARAM, "w", GT_F32, DIMS(8, 6)), false, true));
    for (int inv = 0; inv < 2; inv++) {
        tc = new_case(l, inv ? "rope inverse" : "rope");
        gt_rope_params rp = {.theta = 10000.0};
        output(tc, gt_rope(tc->g, X(tc, "x", 2, 4, 2, 6), &rp, inv != 0));
    }
    tc = new_case(l, "sdpa causal hq=4 hkv=2");
    tc->exact = false;
    outs[0] = gt_sdpa(tc->g, X(tc, "q", 2, 4, 3, 3), X(tc, "k", 2, 2, 3, 3), X(tc, "v", 2, 2, 3, 3),
                      true, 0.5, &outs[1]);
    output(tc, outs[0]);
    output(tc, outs[1]);
    tc = new_case(l, "sdpa_backward causal hq=4 hkv=2");
    tc->exact = false;
    outs[0] =
        gt_sdpa_backward(tc->g, X(tc, "q", 2, 4, 3, 3), X(tc, "k", 2, 2, 3, 3),
                         X(tc, "v", 2, 2, 3, 3), X(tc, "out", 2, 4, 3, 3), X(tc, "lse", 2, 4, 3),
                         X(tc, "dout", 2, 4, 3, 3), true, 0.5, &outs[1], &outs[2]);
    for (int k = 0; k < 3; k++)
        output(tc, outs[k]);
    /* layout 1: q [b, s, hq, d], k, v [b, t, hkv, d]; heads at dim 2, lse [b, hq, s] (heads at
     * dim 1) */
    tc = new_case(l, "sdpa layout 1 causal hq=4 hkv=2");
    tc->exact = false;
    outs[0] = gt_sdpa_layout(tc->g, X(tc, "q", 2, 3, 4, 3), X(tc, "k", 2, 3, 2, 3),
                             X(tc, "v", 2, 3, 2, 3), true, 0.5, 1, &outs[1]);
    output(tc, outs[0]);
    output(tc, outs[1]);
    tc = new_case(l, "sdpa layout 1 hq=2 hkv=2 s=2 t=4");
    tc->exact = false;
    outs[0] = gt_sdpa_layout(tc->g, X(tc, "q", 2, 2, 2, 3), X(tc, "k", 2, 4, 2, 3),
                             X(tc, "v", 2, 4, 2, 2), false, 0.5, 1, &outs[1]);
    output(tc, outs[0]);
    output(tc, outs[1]);
    tc = new_case(l, "sdpa_backward layout 1 causal hq=4 hkv=2");
    tc->exact = false;
    outs[0] = gt_sdpa_backward_layout(tc->g, X(tc, "q", 2, 3, 4, 3), X(tc, "k", 2, 3, 2, 3),
                                      X(tc, "v", 2, 3, 2, 3), X(tc, "out", 2, 3, 4, 3),
                                      X(tc, "lse", 2, 4, 3), X(tc, "dout", 2, 3, 4, 3), true, 0.5,
                                      1, &outs[1], &outs[2]);
    for (int k = 0; k < 3; k++)
        output(tc, outs[k]);
    for (int dim = 0; dim < 2; dim++) {
        tc = new_case(l, dim ? "softmax dim 1" : "softmax dim 0");
        output(tc, gt_softmax(tc->g, X(tc, "x", 4, 6), dim));
        tc = new_case(l, dim ? "softmax_backward dim 1" : "softmax_backward dim 0");
        tc->exact = false;
        output(tc, gt_softmax_backward(tc->g, X(tc, "y", 4, 6), X(tc, "dy", 4, 6), dim));
    }
    tc = new_case(l, "cross_entropy");
    tc->exact = false;
    tc->fix = fix_targets;
    output(tc, gt_cross_entropy(tc->g, X(tc, "logits", 4, 6), IDS(tc, "targets", 4), IGNORE));
    tc = new_case(l, "cross_entropy_backward");
    tc->exact = false;
    tc->fix = fix_targets;
    output(tc, gt_cross_entropy_backward(tc->g, X(tc, "logits", 4, 6), IDS(tc, "targets", 4),
                                         input(tc, GT_IN_INPUT, "dloss", GT_F32, 0, NULL), IGNORE));
    tc = new_case(l, "embedding");
    output(tc, gt_embedding(tc->g, input(tc, GT_IN_PARAM, "emb", GT_F32, DIMS(6, 4)),
                            IDS(tc, "ids", 2, 3)));
    /* the gradient of a parameter "emb": it prefers emb's placement */
    tc = new_case(l, "embedding_backward");
    tc->exact = false;
    input(tc, GT_IN_PARAM, "emb", GT_F32, DIMS(6, 4));
    gt_value_id dw =
        gt_embedding_backward(tc->g, IDS(tc, "ids", 2, 3), X(tc, "dy", 2, 3, 4), gt_c(tc->g, 6));
    gt_graph_add_output(tc->g, GT_OUT_GRAD, "emb", dw);
    tc = new_case(l, "adamw");
    tc->exact = false;
    tc->fix = fix_adamw;
    tc->no_partial = 0x38u; /* v, scalars, clip: the fix sets them */
    gt_value_id p = input(tc, GT_IN_PARAM, "p", GT_F32, DIMS(4, 6));
    gt_value_id g = X(tc, "g", 4, 6);
    gt_value_id m = input(tc, GT_IN_OPT_STATE, "optim.exp_avg.p", GT_F32, DIMS(4, 6));
    gt_value_id v = input(tc, GT_IN_OPT_STATE, "optim.exp_avg_sq.p", GT_F32, DIMS(4, 6));
    gt_value_id sc = X(tc, "scalars", 3), clip = input(tc, GT_IN_INPUT, "clip", GT_F32, 0, NULL);
    outs[0] = gt_adamw(tc->g, p, g, m, v, sc, clip, 0.9, 0.95, 1e-8, 0.1, &outs[1], &outs[2]);
    gt_graph_add_output(tc->g, GT_OUT_PARAM_UPDATE, "p", outs[0]);
    gt_graph_add_output(tc->g, GT_OUT_OPT_STATE_UPDATE, "optim.exp_avg.p", outs[1]);
    gt_graph_add_output(tc->g, GT_OUT_OPT_STATE_UPDATE, "optim.exp_avg_sq.p", outs[2]);
}

/* ---------------------------------------------------------------- running one combination */

typedef struct {
    const gt_graph *g;
    const gt_sym_binding *bind;
    const gt_tensor *inputs;
    gt_tensor *outputs;
    gt_comm *comms[GT_MESH_MAX_DIMS];
    sim_exchange *x;
    int rank;
    gt_status st;
    gt_error err;
} rank_job;

static void *rank_main(void *arg)
{
    rank_job *j = arg;
    j->st = gt_eager_run_comms(j->g, j->bind, j->inputs, j->comms, j->outputs, &j->err);
    sim_finished(j->x);
    return NULL;
}

typedef struct {
    const tcase *tc;
    int mesh_dim;
    bool sequence_parallel;
    gt_tensor *in;  /* global inputs */
    gt_tensor *ref; /* global outputs */
    int64_t (*shape)[GT_MAX_DIMS];
} case_run;

static void format_combo(const tcase *tc, const gt_placement *pl, char *buf, size_t len)
{
    size_t off = (size_t)snprintf(buf, len, "%s [", tc->name);
    for (int k = 0; k < tc->g->n_inputs && off < len; k++) {
        char p[16];
        gt_placement_format(pl[k], p, sizeof p);
        off += (size_t)snprintf(buf + off, len - off, "%s%s", k ? ", " : "", p);
    }
    if (off < len) snprintf(buf + off, len - off, "]");
}

/* got vs ref: bitwise, or |got - ref| <= 1e-5 (|ref| + max|ref|). */
static bool close_to(const gt_tensor *got, const gt_tensor *ref, bool bitwise, char *why,
                     size_t len)
{
    if (got->dtype != ref->dtype || got->ndim != ref->ndim ||
        gt_tensor_numel(got) != gt_tensor_numel(ref)) {
        snprintf(why, len, "type differs");
        return false;
    }
    if (bitwise) {
        bool same = memcmp(got->data, ref->data, gt_tensor_nbytes(ref)) == 0;
        if (!same) snprintf(why, len, "not bitwise equal");
        return same;
    }
    int64_t n = gt_tensor_numel(ref);
    double mx = 0;
    for (int64_t i = 0; i < n; i++)
        mx = fmax(mx, fabs(gt_tensor_get_f32(ref, i)));
    double rtol = got->dtype == GT_BF16 ? 8e-3 : 1e-5;
    for (int64_t i = 0; i < n; i++) {
        double a = gt_tensor_get_f32(got, i), b = gt_tensor_get_f32(ref, i);
        if (!(fabs(a - b) <= rtol * (fabs(b) + mx)) && !(isnan(a) && isnan(b))) {
            snprintf(why, len, "element %lld: %.9g vs %.9g", (long long)i, a, b);
            return false;
        }
    }
    return true;
}

/* Local inputs of `rank`: R whole, S the rank's block, P x - r on rank 0 and r on rank 1 (with
 * the same r on both: `noise` holds it). */
static gt_tensor local_input(const case_run *cr, int k, const gt_placement *place, int rank,
                             const gt_tensor *noise, const gt_mesh *m)
{
    const gt_tensor *x = &cr->in[k];
    gt_placement pl = place[cr->mesh_dim];
    if (pl.kind == GT_PLACE_PARTIAL) {
        gt_tensor t = new_tensor(x->dtype, x->ndim, x->shape);
        for (int64_t i = 0; i < gt_tensor_numel(x); i++) {
            float r = gt_tensor_get_f32(noise, i);
            gt_tensor_set_f32(&t, i, rank == 0 ? gt_tensor_get_f32(x, i) - r : r);
        }
        return t;
    }
    int coords[GT_MESH_NDIMS] = {0};
    coords[cr->mesh_dim] = rank;
    int64_t start[GT_MAX_DIMS], size[GT_MAX_DIMS];
    gt_error err = {0};
    GT_CHECK(gt_placement_local_box(m, place, x->ndim, x->shape, coords, start, size, &err) ==
             GT_OK);
    gt_tensor t = new_tensor(x->dtype, x->ndim, size);
    sim_box_copy(x->data, x->shape, t.data, start, size, x->ndim, gt_dtype_size(x->dtype), true);
    return t;
}

/* Runs one placement combination; returns whether every check passed. */
static bool run_combo(const case_run *cr, const gt_placement *combo, rng *r)
{
    const tcase *tc = cr->tc;
    const gt_graph *g = tc->g;
    int md = cr->mesh_dim, n_in = g->n_inputs, n_out = g->n_outputs;
    char label[256];
    format_combo(tc, combo, label, sizeof label);
    gt_parallel_plan plan = {.sequence_parallel = cr->sequence_parallel};
    gt_error err = {0};
    GT_CHECK(gt_mesh_init(&plan.mesh, 1, md == GT_MESH_DP_SHARD ? NRANK : 1,
                          md == GT_MESH_TP ? NRANK : 1, &err) == GT_OK);
    const char *on = cr->sequence_parallel ? "tp (sequence parallel)" : gt_mesh_dim_name(md);
    gt_placement(*place)[GT_MESH_MAX_DIMS] = calloc((size_t)(n_in ? n_in : 1), sizeof *place);
    for (int k = 0; k < n_in; k++)
        place[k][md] = combo[k];
    gt_graph *lg = NULL;
    gt_status st =
        gt_parallelize(g, &plan, (const gt_placement(*)[GT_MESH_MAX_DIMS])place, &lg, &err);
    EXPECT(st == GT_OK, "%s on %s: parallelize: %s", label, on, err.msg);
    if (st != GT_OK) {
        free(place);
        return false;
    }

    /* inputs per rank */
    size_t n_in_alloc = n_in > 0 ? (size_t)n_in : 1, n_out_alloc = n_out > 0 ? (size_t)n_out : 1;
    gt_tensor *noise = calloc(n_in_alloc, sizeof *noise);
    gt_tensor *lin = calloc(NRANK * n_in_alloc, sizeof *lin);
    gt_tensor *lout = calloc(NRANK * n_out_alloc, sizeof *lout);
    for (int k = 0; k < n_in; k++) {
        const gt_tensor *x = &cr->in[k];
        if (combo[k].kind != GT_PLACE_PARTIAL) continue;
        noise[k] = new_tensor(x->dtype, x->ndim, x->shape);
        /* in bf16/f16, r = x/2 keeps x - r exact */
        for (int64_t i = 0; i < gt_tensor_numel(x); i++)
            gt_tensor_set_f32(&noise[k], i,
                              x->dtype == GT_F32 ? (float)rng_uniform(r, -1, 1)
                                                 : 0.5f * gt_tensor_get_f32(x, i));
    }
    for (int rank = 0; rank < NRANK; rank++)
        for (int k = 0; k < n_in; k++)
            lin[rank * n_in + k] = local_input(cr, k, place[k], rank, &noise[k], &plan.mesh);

    /* both ranks on threads */
    sim_exchange x;
    sim_exchange_init(&x);
    gt_comm comm[NRANK];
    gt_sym_binding_entry be[NRANK][4];
    gt_sym_binding bind[NRANK];
    rank_job job[NRANK];
    pthread_t th[NRANK];
    gt_graph *copy[NRANK];
    for (int rank = 0; rank < NRANK; rank++) {
        comm[rank] = sim_comm(&x, rank);
        int64_t batch = tc->batch / (md == GT_MESH_DP_SHARD ? NRANK : 1);
        be[rank][0] = (gt_sym_binding_entry){"rank.dp_replicate", 0};
        be[rank][1] = (gt_sym_binding_entry){"rank.dp_shard", md == GT_MESH_DP_SHARD ? rank : 0};
        be[rank][2] = (gt_sym_binding_entry){"rank.tp", md == GT_MESH_TP ? rank : 0};
        be[rank][3] = (gt_sym_binding_entry){"batch", batch};
        bind[rank] = (gt_sym_binding){be[rank], tc->batch ? 4 : 3};
        copy[rank] = gt_graph_copy(lg); /* each thread reads its own graph */
        job[rank] = (rank_job){.g = copy[rank],
                               .bind = &bind[rank],
                               .inputs = &lin[rank * n_in],
                               .outputs = &lout[rank * n_out],
                               .x = &x,
                               .rank = rank};
        job[rank].comms[md] = &comm[rank];
        GT_CHECK(pthread_create(&th[rank], NULL, rank_main, &job[rank]) == 0);
    }
    for (int rank = 0; rank < NRANK; rank++)
        pthread_join(th[rank], NULL);
    sim_exchange_destroy(&x);
    bool ok = true;
    for (int rank = 0; rank < NRANK; rank++) {
        EXPECT(job[rank].st == GT_OK, "%s on %s: rank %d: %s", label, on, rank, job[rank].err.msg);
        ok = ok && job[rank].st == GT_OK;
    }

    /* combine by the output placements and compare */
    bool any_partial = false;
    for (int k = 0; k < n_in; k++)
        any_partial |= combo[k].kind == GT_PLACE_PARTIAL;
    for (int o = 0; ok && o < n_out; o++) {
        const gt_tensor *ref = &cr->ref[o];
        gt_placement pl = lg->values[lg->outputs[o].value].place[md];
        gt_tensor full = new_tensor(ref->dtype, ref->ndim, ref->shape);
        char why[160] = "";
        bool bitwise = tc->exact && !any_partial;
        if (pl.kind == GT_PLACE_REPLICATE) {
            ok = gt_tensor_nbytes(&lout[o]) == gt_tensor_nbytes(&lout[n_out + o]) &&
                 memcmp(lout[o].data, lout[n_out + o].data, gt_tensor_nbytes(&lout[o])) == 0;
            EXPECT(ok, "%s on %s: output %d is replicate but the ranks' bits differ", label, on, o);
            memcpy(full.data, lout[o].data, gt_tensor_nbytes(&full));
        } else if (pl.kind == GT_PLACE_SHARD) {
            gt_placement op[GT_MESH_MAX_DIMS] = {{0}};
            op[md] = pl;
            for (int rank = 0; rank < NRANK; rank++) {
                int coords[GT_MESH_NDIMS] = {0};
                coords[md] = rank;
                int64_t start[GT_MAX_DIMS], size[GT_MAX_DIMS];
                GT_CHECK(gt_placement_local_box(&plan.mesh, op, ref->ndim, ref->shape, coords,
                                                start, size, &err) == GT_OK);
                sim_box_copy(full.data, ref->shape, lout[rank * n_out + o].data, start, size,
                             ref->ndim, gt_dtype_size(ref->dtype), false);
            }
        } else {
            bitwise = false;
            for (int64_t i = 0; i < gt_tensor_numel(ref); i++)
                gt_tensor_set_f32(&full, i,
                                  gt_tensor_get_f32(&lout[o], i) +
                                      gt_tensor_get_f32(&lout[n_out + o], i));
        }
        if (ok) {
            ok = close_to(&full, ref, bitwise, why, sizeof why);
            char ps[16];
            gt_placement_format(pl, ps, sizeof ps);
            EXPECT(ok, "%s on %s: output %d (%s%s): %s", label, on, o, ps,
                   bitwise ? ", bitwise" : "", why);
        }
        gt_tensor_free(&full);
    }
    if (!ok && getenv("GT_TEST_VERBOSE")) gt_graph_print(lg, stderr);

    for (int rank = 0; rank < NRANK; rank++) {
        gt_graph_free(copy[rank]);
        for (int k = 0; k < n_in; k++)
            gt_tensor_free(&lin[rank * n_in + k]);
        for (int o = 0; o < n_out; o++)
            gt_tensor_free(&lout[rank * n_out + o]);
    }
    for (int k = 0; k < n_in; k++)
        if (combo[k].kind == GT_PLACE_PARTIAL) gt_tensor_free(&noise[k]);
    free(noise);
    free(lin);
    free(lout);
    free(place);
    gt_graph_free(lg);
    return ok;
}

/* The placements input k may have: R, S(d) for each dim that splits in two, P for float
 * activations (state — parameters, optimizer state — is never partial: its update must come back
 * in its own placement). */
static int input_options(const tcase *tc, int k, const gt_tensor *x, gt_placement *opt)
{
    int n = 0;
    opt[n++] = gt_place_replicate();
    for (int d = 0; d < x->ndim; d++)
        if (x->shape[d] > 0 && x->shape[d] % NRANK == 0) opt[n++] = gt_place_shard(d, 0);
    bool state = tc->g->inputs[k].kind != GT_IN_INPUT;
    if (!is_index(x->dtype) && !state && !((tc->no_partial >> k) & 1u))
        opt[n++] = gt_place_partial();
    return n;
}

/* Every combination (or a fixed sample of MAX_COMBOS) on mesh dim md; returns the count run. */
static int run_case(const tcase *tc, int md, bool sp, rng *r, int *failed)
{
    const gt_graph *g = tc->g;
    int n_in = g->n_inputs, n_out = g->n_outputs;
    gt_error err = {0};
    EXPECT(g->err.code == GT_OK, "%s: building: %s", tc->name, g->err.msg);
    if (g->err.code != GT_OK) return 0;
    gt_sym_binding_entry be = {"batch", tc->batch};
    gt_sym_binding bind = {&be, tc->batch ? 1 : 0};
    case_run cr = {.tc = tc, .mesh_dim = md, .sequence_parallel = sp};
    cr.in = calloc((size_t)(n_in ? n_in : 1), sizeof *cr.in);
    cr.ref = calloc((size_t)(n_out ? n_out : 1), sizeof *cr.ref);
    for (int k = 0; k < n_in; k++) {
        const gt_value *v = &g->values[g->inputs[k].value];
        int64_t shape[GT_MAX_DIMS];
        GT_CHECK(gt_graph_eval_shape(g, g->inputs[k].value, &bind, shape, &err) == GT_OK);
        cr.in[k] = new_tensor(v->type.dtype, v->type.ndim, shape);
        for (int64_t i = 0; i < gt_tensor_numel(&cr.in[k]); i++) {
            if (is_index(v->type.dtype))
                ((int64_t *)cr.in[k].data)[i] = (int64_t)(rng_next(r) % (uint64_t)tc->int_hi);
            else
                gt_tensor_set_f32(
                    &cr.in[k], i,
                    (float)(tc->positive ? rng_uniform(r, 0.5, 2) : rng_uniform(r, -1, 1)));
        }
    }
    if (tc->fix) tc->fix(tc, cr.in);
    gt_status st = gt_eager_run(g, &bind, cr.in, cr.ref, &err);
    EXPECT(st == GT_OK, "%s: global run: %s", tc->name, err.msg);

    gt_placement opt[GT_MAX_IN][GT_MAX_DIMS + 2];
    int n_opt[GT_MAX_IN];
    int64_t total = 1;
    for (int k = 0; k < n_in; k++) {
        n_opt[k] = input_options(tc, k, &cr.in[k], opt[k]);
        total *= n_opt[k];
    }
    int count = 0;
    for (int64_t c = 0; st == GT_OK && c < total && c < MAX_COMBOS; c++) {
        int64_t code = total <= MAX_COMBOS ? c : (int64_t)(rng_next(r) % (uint64_t)total);
        gt_placement combo[GT_MAX_IN];
        for (int k = n_in - 1; k >= 0; k--) {
            combo[k] = opt[k][code % n_opt[k]];
            code /= n_opt[k];
        }
        if (!run_combo(&cr, combo, r)) ++*failed;
        count++;
    }
    for (int k = 0; k < n_in; k++)
        gt_tensor_free(&cr.in[k]);
    for (int o = 0; o < n_out; o++)
        gt_tensor_free(&cr.ref[o]);
    free(cr.in);
    free(cr.ref);
    return count;
}

int main(void)
{
    gt_cpu_set_threads(1);
    case_list *l = calloc(1, sizeof *l);
    elementwise_cases(l);
    reduce_cases(l);
    layout_cases(l);
    matmul_cases(l);
    nn_cases(l);
    /* a two-node graph: the backward reuses the forward's global log-sum-exp */
    tcase *tc = new_case(l, "cross_entropy + backward");
    tc->exact = false;
    tc->fix = fix_targets;
    gt_value_id lg = X(tc, "logits", 4, 6), tg = IDS(tc, "targets", 4);
    output(tc, gt_cross_entropy(tc->g, lg, tg, IGNORE));
    output(tc, gt_cross_entropy_backward(tc->g, lg, tg,
                                         input(tc, GT_IN_INPUT, "dloss", GT_F32, 0, NULL), IGNORE));

    int covered[GT_OP_COUNT] = {0}, total = 0, failed = 0;
    rng r = {20240611};
    for (int k = 0; k < l->n; k++) {
        int count = 0;
        count += run_case(&l->c[k], GT_MESH_DP_SHARD, false, &r, &failed);
        count += run_case(&l->c[k], GT_MESH_TP, false, &r, &failed);
        count += run_case(&l->c[k], GT_MESH_TP, true, &r, &failed);
        for (int i = 0; i < l->c[k].g->n_nodes; i++)
            covered[l->c[k].g->nodes[i].op] += count;
        total += count;
        printf("  %-44s %4d placement combinations\n", l->c[k].name, count);
    }
    printf("%d combinations over %d graphs, %d failed\n", total, l->n, failed);
    for (int op = 0; op < GT_OP_ALL_GATHER_START; op++)
        EXPECT(covered[op] > 0, "op %s is not covered by any graph", gt_op_get((gt_op)op)->name);
    for (int k = 0; k < l->n; k++)
        gt_graph_free(l->c[k].g);
    free(l);

    return gt_test_finish();
}
