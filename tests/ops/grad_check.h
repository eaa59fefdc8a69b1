/* grad_check.h — gradient checking for the op tests: a tiny graph (PARAM inputs -> op -> outputs)
 * gets loss = sum_k sum(out_k * R_k) with fixed random R_k (every output element matters), then
 *   analytic: gt_autodiff + gt_eager_run of the whole graph (loss and one GRAD per PARAM);
 *   reference: central finite differences of the loss, (L(x + eps) - L(x - eps)) / (2 eps) per
 *              element, each L an eager run of the forward graph alone (f32).
 * Tolerance (stated per case, default 2e-3): |analytic - fd| <= tol * max(1, |fd|). With eps = 1e-2
 * the FD truncation error is O(eps^2 f''') ~ 1e-4 and the f32 rounding of L (|L| ~ 10, ulp ~ 1e-6)
 * contributes ~1e-4 after dividing by 2 eps, both far below the tolerance; a wrong rule is off by
 * O(1). Every case also runs the differentiated graph twice and requires identical bits. */
#ifndef GT_TESTS_GRAD_CHECK_H
#define GT_TESTS_GRAD_CHECK_H

#include <stdint.h>
#include <string.h>

#include "graphtrain/gt_autodiff.h"
#include "graphtrain/gt_build.h"
#include "graphtrain/gt_exec.h"
#include "gt_test.h"

#define GC_MAX_INPUTS 24

typedef struct {
    const char *label;
    gt_graph *g;
    int n_in;
    gt_tensor in[GC_MAX_INPUTS]; /* values of the graph inputs, in input order */
    bool is_param[GC_MAX_INPUTS];
    uint64_t rng;
    double eps, tol;
} gc_case;

static const gt_sym_binding gc_no_binding = {NULL, 0};

static inline uint64_t gc_next(uint64_t *s) /* splitmix64 */
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static inline double gc_uniform(uint64_t *s, double lo, double hi)
{
    return lo + (hi - lo) * ((double)(gc_next(s) >> 11) / 9007199254740992.0);
}

static inline void gc_begin(gc_case *c, const char *label, uint64_t seed)
{
    memset(c, 0, sizeof *c);
    c->label = label;
    c->g = gt_graph_new();
    c->rng = seed * 0x2545F4914F6CDD1Dull + 1;
    c->eps = 1e-2;
    c->tol = 2e-3;
}

static inline void gc_end(gc_case *c)
{
    for (int i = 0; i < c->n_in; i++)
        gt_tensor_free(&c->in[i]);
    gt_graph_free(c->g);
}

/* Adds a graph input with a zeroed tensor; returns its value. */
static inline gt_value_id gc_input(gc_case *c, gt_input_kind kind, gt_dtype dt, int ndim,
                                   const int64_t *shape)
{
    GT_CHECK(c->n_in < GC_MAX_INPUTS);
    gt_expr dims[GT_MAX_DIMS];
    for (int i = 0; i < ndim; i++)
        dims[i] = gt_c(c->g, shape[i]);
    char name[32];
    snprintf(name, sizeof name, "%s%d", kind == GT_IN_PARAM ? "p" : "in", c->n_in);
    gt_value_id v = gt_graph_add_input(c->g, kind, name, dt, ndim, dims);
    gt_error err = {0};
    GT_CHECK(gt_tensor_alloc(&c->in[c->n_in], dt, ndim, shape, &err) == GT_OK);
    c->is_param[c->n_in] = kind == GT_IN_PARAM;
    c->n_in++;
    return v;
}

/* A f32 PARAM with values uniform in [lo, hi). */
static inline gt_value_id gc_param(gc_case *c, int ndim, const int64_t *shape, double lo, double hi)
{
    gt_value_id v = gc_input(c, GT_IN_PARAM, GT_F32, ndim, shape);
    gt_tensor *t = &c->in[c->n_in - 1];
    for (int64_t i = 0; i < gt_tensor_numel(t); i++)
        gt_tensor_set_f32(t, i, (float)gc_uniform(&c->rng, lo, hi));
    return v;
}

/* A f32 PARAM whose values are a random permutation of {0.1 k}: distinct, 0.1 apart (> 2 eps), so
 * max has a unique argmax that a perturbation cannot move. */
static inline gt_value_id gc_param_distinct(gc_case *c, int ndim, const int64_t *shape)
{
    gt_value_id v = gc_input(c, GT_IN_PARAM, GT_F32, ndim, shape);
    gt_tensor *t = &c->in[c->n_in - 1];
    int64_t n = gt_tensor_numel(t);
    for (int64_t i = 0; i < n; i++)
        gt_tensor_set_f32(t, i, (float)(0.1 * (double)(i - n / 2)));
    for (int64_t i = n - 1; i > 0; i--) { /* Fisher–Yates */
        int64_t j = (int64_t)(gc_next(&c->rng) % (uint64_t)(i + 1));
        float a = gt_tensor_get_f32(t, i), b = gt_tensor_get_f32(t, j);
        gt_tensor_set_f32(t, i, b);
        gt_tensor_set_f32(t, j, a);
    }
    return v;
}

/* An integer INPUT (ids, targets) with the given values. */
static inline gt_value_id gc_ids(gc_case *c, gt_dtype dt, int ndim, const int64_t *shape,
                                 const int64_t *ids)
{
    gt_value_id v = gc_input(c, GT_IN_INPUT, dt, ndim, shape);
    gt_tensor *t = &c->in[c->n_in - 1];
    for (int64_t i = 0; i < gt_tensor_numel(t); i++) {
        if (dt == GT_I32)
            ((int32_t *)t->data)[i] = (int32_t)ids[i];
        else
            ((int64_t *)t->data)[i] = ids[i];
    }
    return v;
}

static inline float gc_loss(const gt_graph *fwd, gc_case *c, bool *ok)
{
    gt_error err = {0};
    gt_tensor out = {0};
    gt_status st = gt_eager_run(fwd, &gc_no_binding, c->in, &out, &err);
    if (st != GT_OK) {
        fprintf(stderr, "%s: forward run failed: %s\n", c->label, err.msg);
        *ok = false;
        return 0.0f;
    }
    float l = gt_tensor_get_f32(&out, 0);
    gt_tensor_free(&out);
    return l;
}

static inline bool gc_same_bits(const gt_tensor *a, const gt_tensor *b)
{
    return a->dtype == b->dtype && gt_tensor_nbytes(a) == gt_tensor_nbytes(b) &&
           memcmp(a->data, b->data, gt_tensor_nbytes(a)) == 0;
}

/* Builds the loss over the float outputs outs[0..n), differentiates, and compares every PARAM's
 * gradient with finite differences. When grads_out is non-NULL, the analytic gradients are copied
 * there (caller frees) for extra checks. Returns false when a step failed. */
static inline bool gc_check_keep(gc_case *c, int n_outs, const gt_value_id *outs,
                                 gt_tensor *grads_out)
{
    gt_graph *g = c->g;
    gt_error err = {0};
    gt_value_id loss = GT_NONE;
    for (int k = 0; k < n_outs; k++) {
        gt_type t = *gt_value_type(g, outs[k]);
        if (!gt_dtype_is_float(t.dtype)) continue;
        int64_t shape[GT_MAX_DIMS];
        for (int i = 0; i < t.ndim; i++)
            GT_CHECK(gt_sym_is_const(g->sym, t.dims[i], &shape[i]));
        gt_value_id r = gc_input(c, GT_IN_INPUT, t.dtype, t.ndim, shape);
        gt_tensor *rt = &c->in[c->n_in - 1];
        for (int64_t i = 0; i < gt_tensor_numel(rt); i++)
            gt_tensor_set_f32(rt, i, (float)gc_uniform(&c->rng, -1.0, 1.0));
        gt_value_id term = gt_mul(g, outs[k], r);
        int all[GT_MAX_DIMS];
        for (int i = 0; i < t.ndim; i++)
            all[i] = i;
        if (t.ndim > 0) term = gt_reduce(g, GT_OP_SUM, term, t.ndim, all, false);
        loss = loss == GT_NONE ? term : gt_add(g, loss, term);
    }
    gt_graph_add_output(g, GT_OUT_LOSS, "loss", loss);
    EXPECT(g->err.code == GT_OK, "%s: building: %s", c->label, g->err.msg);
    if (g->err.code != GT_OK) return false;

    gt_graph *fwd = gt_graph_copy(g);
    gt_status st = gt_autodiff(g, &err);
    EXPECT(st == GT_OK, "%s: autodiff: %s", c->label, err.msg);
    if (st != GT_OK) {
        gt_graph_free(fwd);
        return false;
    }
    EXPECT_OK(gt_graph_verify(g, &err), &err);

    int n_out = g->n_outputs;
    gt_tensor *run1 = calloc((size_t)n_out, sizeof(gt_tensor));
    gt_tensor *run2 = calloc((size_t)n_out, sizeof(gt_tensor));
    bool ok = gt_eager_run(g, &gc_no_binding, c->in, run1, &err) == GT_OK;
    EXPECT(ok, "%s: eager run: %s", c->label, err.msg);
    if (ok) {
        ok = gt_eager_run(g, &gc_no_binding, c->in, run2, &err) == GT_OK;
        EXPECT(ok, "%s: second eager run: %s", c->label, err.msg);
    }
    if (ok) {
        bool same = true;
        for (int k = 0; k < n_out; k++)
            same &= gc_same_bits(&run1[k], &run2[k]);
        EXPECT(same, "%s: two runs of the same graph differ", c->label);
    }

    /* Finite differences, one PARAM at a time; run1[1 + p] is the GRAD of the p-th PARAM. */
    int p = 0;
    for (int i = 0; ok && i < c->n_in; i++) {
        if (!c->is_param[i]) continue;
        gt_tensor *x = &c->in[i], *gr = &run1[1 + p];
        double worst = 0.0, worst_a = 0.0, worst_fd = 0.0;
        int64_t worst_j = -1;
        for (int64_t j = 0; ok && j < gt_tensor_numel(x); j++) {
            float orig = gt_tensor_get_f32(x, j);
            float xp = (float)(orig + c->eps), xm = (float)(orig - c->eps);
            gt_tensor_set_f32(x, j, xp);
            double lp = gc_loss(fwd, c, &ok);
            gt_tensor_set_f32(x, j, xm);
            double lm = gc_loss(fwd, c, &ok);
            gt_tensor_set_f32(x, j, orig);
            double fd = (lp - lm) / ((double)xp - (double)xm);
            double a = gt_tensor_get_f32(gr, j);
            double e = fabs(a - fd) / fmax(1.0, fabs(fd));
            if (!(e <= worst) || worst_j < 0) {
                worst = e, worst_a = a, worst_fd = fd, worst_j = j;
            }
        }
        if (getenv("GC_VERBOSE"))
            printf("%-48s PARAM %d: worst rel err %.2e (tol %.0e)\n", c->label, p, worst, c->tol);
        EXPECT(ok && worst <= c->tol,
               "%s: grad of PARAM %d, element %lld: autodiff %.6g vs finite difference %.6g "
               "(rel err %.3g > %.3g)",
               c->label, p, (long long)worst_j, worst_a, worst_fd, worst, c->tol);
        if (grads_out) {
            gt_tensor_alloc(&grads_out[p], gr->dtype, gr->ndim, gr->shape, &err);
            memcpy(grads_out[p].data, gr->data, gt_tensor_nbytes(gr));
        }
        p++;
    }
    for (int k = 0; k < n_out; k++) {
        gt_tensor_free(&run1[k]);
        gt_tensor_free(&run2[k]);
    }
    free(run1);
    free(run2);
    gt_graph_free(fwd);
    return ok;
}

static inline bool gc_check(gc_case *c, int n_outs, const gt_value_id *outs)
{
    return gc_check_keep(c, n_outs, outs, NULL);
}

/* The common case: one output; checks and frees the case. */
static inline void gc_run1(gc_case *c, gt_value_id out)
{
    gc_check(c, 1, &out);
    gc_end(c);
}

#endif
