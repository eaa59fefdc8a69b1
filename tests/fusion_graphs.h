/* fusion_graphs.h — random graphs of elementwise ops for the fusion tests (tests/unit/test_fusion.c
 * on the CPU, tests/cuda/test_cuda_fused.c on the GPU), and the helpers both use.
 *
 * rg_build makes a graph of 4 to 6 inputs of broadcasting shapes ([3, 5, 7], [5, 7], [7],
 * [1, 7], [5, 1], []) and 10 to 21 elementwise ops drawn at random (unary ops with constants,
 * binary ops on broadcast-compatible partners, silu_backward on identical types, casts), each
 * preferring recent values so that chains grow long; some values are read twice and some outputs
 * sit in the middle of chains, so that the fusion pass meets every boundary. log, sqrt and rsqrt
 * only read values known positive. Header-only and private to the tests. */
#ifndef GT_FUSION_GRAPHS_H
#define GT_FUSION_GRAPHS_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graphtrain/gt_build.h"
#include "graphtrain/gt_exec.h"
#include "graphtrain/gt_pass.h"
#include "gt_test.h"
#include "step_harness.h"

/* ---------------------------------------------------------------- helpers */

static inline uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return *s;
}

static inline double rng_unit(uint64_t *s)
{
    return (double)(rng_next(s) >> 11) * 0x1p-53;
}

static inline int count_op(const gt_graph *g, gt_op op)
{
    int c = 0;
    for (int32_t k = 0; k < g->n_nodes; k++)
        c += g->nodes[k].op == op;
    return c;
}

/* Runs the named passes only (in pipeline order), verifying after each. */
static inline gt_status run_only(gt_graph *g, const char *const *names, int n_names, gt_error *err)
{
    int n;
    const gt_pass_info *reg = gt_pass_registry(&n);
    char *disable[GT_PASS_MAX];
    int nd = 0;
    for (int k = 0; k < n; k++) {
        bool on = false;
        for (int j = 0; j < n_names; j++)
            on |= strcmp(reg[k].name, names[j]) == 0;
        if (!on) disable[nd++] = (char *)reg[k].name;
    }
    gt_pass_options o = {.disable = disable, .n_disable = nd, .verify_each = true, .quiet = true};
    return gt_pass_run_pipeline(g, &o, NULL, err);
}

static inline gt_status run_fusion(gt_graph *g, gt_error *err)
{
    static const char *const names[] = {"dce", "fusion"};
    return run_only(g, names, 2, err);
}

static inline gt_expr fg_const(gt_graph *g, int64_t v)
{
    return gt_sym_const(g->sym, v);
}

/* ---------------------------------------------------------------- random graphs */

#define RG_MAX_VALUES 64

typedef struct {
    gt_value_id v[RG_MAX_VALUES];
    bool positive[RG_MAX_VALUES];
    int n;
} rg_pool;

static inline void rg_push(rg_pool *p, gt_value_id v, bool positive)
{
    if (p->n < RG_MAX_VALUES && v != GT_NONE) {
        p->v[p->n] = v;
        p->positive[p->n] = positive;
        p->n++;
    }
}

/* Whether two concrete-shape types broadcast (numpy rules). */
static inline bool rg_broadcasts(const gt_graph *g, const gt_type *a, const gt_type *b)
{
    int r = a->ndim > b->ndim ? a->ndim : b->ndim;
    for (int d = 0; d < r; d++) {
        int ia = d - (r - a->ndim), ib = d - (r - b->ndim);
        if (ia < 0 || ib < 0) continue;
        int64_t x = 0, y = 0;
        gt_sym_is_const(g->sym, a->dims[ia], &x);
        gt_sym_is_const(g->sym, b->dims[ib], &y);
        if (x != y && x != 1 && y != 1) return false;
    }
    return true;
}

static inline bool rg_same_type(const gt_type *a, const gt_type *b)
{
    if (a->dtype != b->dtype || a->ndim != b->ndim) return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->dims[d] != b->dims[d]) return false;
    return true;
}

/* mode 0: f32 only; 1: bf16 only; 2: f32, bf16 and f16 with casts between them. */
static inline gt_graph *rg_build(uint64_t *s, int mode)
{
    gt_graph *g = gt_graph_new();
    const int64_t shapes[6][4] = {{3, 3, 5, 7}, {2, 5, 7, 0}, {1, 7, 0, 0},
                                  {2, 1, 7, 0}, {2, 5, 1, 0}, {0, 0, 0, 0}};
    const gt_dtype dts[3] = {GT_F32, GT_BF16, GT_F16};
    rg_pool p = {.n = 0};
    int n_inputs = 4 + (int)(rng_next(s) % 3);
    for (int k = 0; k < n_inputs; k++) {
        const int64_t *sh = shapes[k == 0 ? 0 : rng_next(s) % 6];
        gt_expr dims[3];
        for (int d = 0; d < sh[0]; d++)
            dims[d] = fg_const(g, sh[1 + d]);
        gt_dtype dt = mode == 0 ? GT_F32 : mode == 1 ? GT_BF16 : dts[rng_next(s) % 3];
        char name[16];
        snprintf(name, sizeof name, "x%d", k);
        rg_push(&p, gt_graph_add_input(g, GT_IN_INPUT, name, dt, (int)sh[0], dims), k % 3 == 2);
    }
    int n_ops = 10 + (int)(rng_next(s) % 12);
    static const gt_op unary[] = {GT_OP_NEG,        GT_OP_EXP,  GT_OP_LOG,     GT_OP_SQRT,
                                  GT_OP_RSQRT,      GT_OP_SILU, GT_OP_SIGMOID, GT_OP_SCALE,
                                  GT_OP_ADD_SCALAR, GT_OP_CLAMP};
    static const gt_op binary[] = {GT_OP_ADD, GT_OP_SUB, GT_OP_MUL, GT_OP_DIV, GT_OP_SILU_BACKWARD};
    for (int k = 0; k < n_ops; k++) {
        /* prefer recent values, so chains grow long */
        int ia = p.n - 1 - (int)(rng_next(s) % (uint64_t)(p.n < 4 ? p.n : 4));
        gt_value_id a = p.v[ia];
        const gt_type *ta = gt_value_type(g, a);
        uint64_t kind = rng_next(s) % 10;
        if (kind < 4) {
            gt_op op = unary[rng_next(s) % 10];
            bool pos_op = op == GT_OP_LOG || op == GT_OP_SQRT || op == GT_OP_RSQRT;
            if (pos_op && !p.positive[ia]) op = GT_OP_EXP; /* keep log/sqrt in their domain */
            gt_value_id r;
            if (op == GT_OP_SCALE)
                r = gt_scale(g, a, 0.1 + 2.0 * rng_unit(s));
            else if (op == GT_OP_ADD_SCALAR)
                r = gt_add_scalar(g, a, rng_unit(s) - 0.3);
            else if (op == GT_OP_CLAMP)
                r = gt_clamp(g, a, -0.75, 0.5 + rng_unit(s));
            else
                r = gt_unary(g, op, a);
            rg_push(&p, r,
                    op == GT_OP_EXP || op == GT_OP_SIGMOID || op == GT_OP_SQRT ||
                        op == GT_OP_RSQRT);
        } else if (kind < 8) {
            gt_op op = binary[rng_next(s) % 5];
            /* a partner of the same dtype that broadcasts (same type for silu_backward) */
            int cand[RG_MAX_VALUES], nc = 0;
            for (int j = 0; j < p.n; j++) {
                const gt_type *tb = gt_value_type(g, p.v[j]);
                bool ok = op == GT_OP_SILU_BACKWARD
                              ? rg_same_type(ta, tb)
                              : tb->dtype == ta->dtype && rg_broadcasts(g, ta, tb);
                if (ok) cand[nc++] = j;
            }
            int jb = cand[rng_next(s) % (uint64_t)nc]; /* a itself always qualifies */
            gt_value_id b = p.v[jb];
            gt_value_id r = op == GT_OP_SILU_BACKWARD ? gt_silu_backward(g, a, b)
                            : op == GT_OP_ADD         ? gt_add(g, a, b)
                            : op == GT_OP_SUB         ? gt_sub(g, a, b)
                            : op == GT_OP_MUL         ? gt_mul(g, a, b)
                                                      : gt_div(g, a, b);
            rg_push(&p, r,
                    (op == GT_OP_MUL || op == GT_OP_DIV || op == GT_OP_ADD) && p.positive[ia] &&
                        p.positive[jb]);
        } else if (mode == 2) {
            gt_dtype to = dts[rng_next(s) % 3];
            rg_push(&p, gt_cast(g, a, to == ta->dtype ? dts[(to + 1) % 3] : to), p.positive[ia]);
        } else {
            /* one value made to match another's dtype through a pair of casts */
            gt_dtype mid = ta->dtype == GT_F32 ? GT_BF16 : GT_F32;
            rg_push(&p, gt_cast(g, gt_cast(g, a, mid), ta->dtype), p.positive[ia]);
        }
    }
    /* outputs: the last value, and a few random ones (some in the middle of chains) */
    gt_graph_add_output(g, GT_OUT_METRIC, "last", p.v[p.n - 1]);
    int extra = (int)(rng_next(s) % 4);
    for (int k = 0; k < extra; k++) {
        char name[16];
        snprintf(name, sizeof name, "o%d", k);
        gt_graph_add_output(g, GT_OUT_METRIC, name,
                            p.v[n_inputs + (int)(rng_next(s) % (uint64_t)(p.n - n_inputs))]);
    }
    return g;
}

/* Inputs of g with values in [-2, 2] (x2, x5: (0.1, 3]), rounded to each input's dtype. */
static inline gt_tensor *rg_inputs(const gt_graph *g, uint64_t *s)
{
    gt_tensor *in = calloc((size_t)g->n_inputs, sizeof *in);
    gt_error err = {0};
    for (int32_t k = 0; k < g->n_inputs; k++) {
        int64_t shape[GT_MAX_DIMS];
        const gt_type *t = gt_value_type(g, g->inputs[k].value);
        EXPECT_OK(gt_graph_eval_shape(g, g->inputs[k].value, NULL, shape, &err), &err);
        EXPECT_OK(gt_tensor_alloc(&in[k], t->dtype, t->ndim, shape, &err), &err);
        for (int64_t i = 0; i < gt_tensor_numel(&in[k]); i++) {
            double u = rng_unit(s);
            gt_tensor_set_f32(&in[k], i, (float)(k % 3 == 2 ? 0.1 + 2.9 * u : 4.0 * u - 2.0));
        }
    }
    return in;
}

static inline void free_array(gt_tensor *t, int32_t n)
{
    for (int32_t k = 0; k < n; k++)
        gt_tensor_free(&t[k]);
    free(t);
}

/* A graph input [a, b] of dtype dt. */
static inline gt_value_id fg_input(gt_graph *g, const char *name, gt_dtype dt, int64_t a, int64_t b)
{
    gt_expr dims[2] = {fg_const(g, a), fg_const(g, b)};
    return gt_graph_add_input(g, GT_IN_INPUT, name, dt, 2, dims);
}

/* ref and g (ref after fusion) run in the eager executor on the same inputs: every output
 * memcmp-equal. */
static inline void fg_expect_same_outputs(const char *what, const gt_graph *ref, const gt_graph *g)
{
    uint64_t s = 0x2545f4914f6cdd1dull;
    gt_error err = {0};
    gt_tensor *in = rg_inputs(ref, &s);
    gt_tensor *o1 = calloc((size_t)ref->n_outputs, sizeof *o1);
    gt_tensor *o2 = calloc((size_t)ref->n_outputs, sizeof *o2);
    EXPECT_OK(gt_eager_run(ref, NULL, in, o1, &err), &err);
    EXPECT_OK(gt_eager_run(g, NULL, in, o2, &err), &err);
    int bad = 0;
    for (int32_t k = 0; k < ref->n_outputs && err.code == GT_OK; k++)
        bad += !same_bits(&o1[k], &o2[k]);
    EXPECT(bad == 0 && err.code == GT_OK, "%s: %d of %d outputs differ fused vs unfused", what, bad,
           ref->n_outputs);
    free_array(in, ref->n_inputs);
    free_array(o1, ref->n_outputs);
    free_array(o2, ref->n_outputs);
}

/* ref after dce, and a copy of it after dce + fusion (returned; the caller frees it), whose
 * outputs must be bitwise ref's in the eager executor. */
static inline gt_graph *fg_fuse_and_compare(gt_graph *ref, const char *what)
{
    gt_error err = {0};
    EXPECT(ref->err.code == GT_OK, "%s: built: %s", what, ref->err.msg);
    static const char *const dce[] = {"dce"};
    EXPECT_OK(run_only(ref, dce, 1, &err), &err);
    gt_graph *fus = gt_graph_copy(ref);
    EXPECT_OK(run_fusion(fus, &err), &err);
    fg_expect_same_outputs(what, ref, fus);
    return fus;
}

/* The llama3 step tests' pipeline: every pass (the default memory policy, verified after each),
 * with or without fusion. */
static inline void compile_step(gt_graph *g, bool fusion)
{
    gt_error err = {0};
    char *off[1] = {"fusion"};
    gt_pass_options o = {.disable = fusion ? NULL : off,
                         .n_disable = fusion ? 0 : 1,
                         .verify_each = true,
                         .quiet = true,
                         .memory_policy = GT_MEMORY_POLICY_DEFAULT};
    EXPECT_OK(gt_pass_run_pipeline(g, &o, NULL, &err), &err);
}

#endif
