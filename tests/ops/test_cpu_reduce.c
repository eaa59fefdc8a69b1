/* test_cpu_reduce.c — CPU kernels sum, mean, max (dims lists, keepdim), max_backward (first
 * maximum; finite differences), sum_to. Naive double references; 1e-5 relative for f32. */
#include "test_cpu_util.h"

typedef struct {
    int ndim;
    int64_t shape[4];
    int ndims;
    int dims[4]; /* ndims == 0: no dim (each group is one element, as the IR's shape rule) */
} reduce_case;

static const reduce_case cases[] = {
    {3, {3, 7, 5}, 1, {1}},       {3, {3, 7, 5}, 2, {0, 2}}, {3, {3, 7, 5}, 1, {2}},
    {3, {3, 7, 5}, 3, {0, 1, 2}}, {3, {3, 7, 5}, 0, {0}},    {1, {19}, 1, {0}},
    {4, {2, 1, 3, 4}, 2, {1, 3}}, {2, {19, 3}, 1, {-1}},     {2, {4, 19}, 1, {0}},
};

/* Reduced shape of a case; reduced[d] marks the reduced dims of x. */
static int reduced_shape(const reduce_case *rc, bool keepdim, bool *reduced, int64_t *out)
{
    int n = 0;
    for (int d = 0; d < rc->ndim; d++)
        reduced[d] = false;
    for (int k = 0; k < rc->ndims; k++)
        reduced[(rc->dims[k] + rc->ndim) % rc->ndim] = true;
    for (int d = 0; d < rc->ndim; d++) {
        if (!reduced[d])
            out[n++] = rc->shape[d];
        else if (keepdim)
            out[n++] = 1;
    }
    return n;
}

/* Index of x element xi's group in the (keepdim-less) reduced output. */
static int64_t group_of(const reduce_case *rc, const bool *reduced, int64_t xi)
{
    int64_t idx[4], g = 0;
    tt_unravel(xi, rc->ndim, rc->shape, idx);
    for (int d = 0; d < rc->ndim; d++)
        if (!reduced[d]) g = g * rc->shape[d] + idx[d];
    return g;
}

static void set_reduce_attrs(tt_call *k, const reduce_case *rc, bool keepdim)
{
    tt_i(k, keepdim);
    for (int j = 0; j < rc->ndims; j++)
        tt_i(k, rc->dims[j]);
}

static void test_reductions(tt_rng *r)
{
    const gt_op ops[] = {GT_OP_SUM, GT_OP_MEAN, GT_OP_MAX, GT_OP_SUM_SQUARES};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const reduce_case *rc = &cases[c];
        for (int keepdim = 0; keepdim < 2; keepdim++) {
            bool reduced[4];
            int64_t os[4];
            int on = reduced_shape(rc, keepdim, reduced, os);
            gt_tensor x = tt_rand(rc->ndim, rc->shape, r, -3, 3);
            gt_tensor y = tt_new(GT_F32, on, os);
            int64_t nx = gt_tensor_numel(&x), ny = gt_tensor_numel(&y);
            for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++) {
                double *ref = tt_doubles(ny);
                int64_t *cnt = calloc((size_t)ny, sizeof *cnt);
                for (int64_t g = 0; g < ny; g++)
                    ref[g] = ops[o] == GT_OP_MAX ? -INFINITY : 0.0;
                for (int64_t i = 0; i < nx; i++) {
                    int64_t g = group_of(rc, reduced, i);
                    double v = gt_tensor_get_f32(&x, i);
                    cnt[g]++;
                    if (ops[o] == GT_OP_SUM_SQUARES) v *= v; /* naive: in double */
                    ref[g] = ops[o] == GT_OP_MAX ? fmax(ref[g], v) : ref[g] + v;
                }
                if (ops[o] == GT_OP_MEAN)
                    for (int64_t g = 0; g < ny; g++)
                        ref[g] /= (double)cnt[g];
                tt_call k;
                tt_init(&k, ops[o]);
                tt_in(&k, &x);
                tt_out(&k, &y);
                set_reduce_attrs(&k, rc, keepdim);
                if (tt_run_ok(&k, "reduce"))
                    EXPECT(tt_close(&y, ref, 1e-6, 1e-7, "reduce"), "op %d case %zu keepdim %d",
                           ops[o], c, keepdim);
                EXPECT(tt_deterministic(&k), "reduce determinism op %d case %zu", ops[o], c);
                EXPECT(tt_half_path(&k, GT_BF16, 0), "reduce bf16 op %d case %zu", ops[o], c);
                free(ref);
                free(cnt);
            }
            gt_tensor_free(&x);
            gt_tensor_free(&y);
        }
    }
    /* A wrong output shape is an error. */
    gt_tensor x = tt_rand(2, TT_SHAPE(3, 4), r, -1, 1), y = tt_new(GT_F32, 1, TT_SHAPE(4));
    tt_call k;
    tt_init(&k, GT_OP_SUM);
    tt_in(&k, &x);
    tt_out(&k, &y);
    tt_i(&k, 0);
    tt_i(&k, 1); /* sum over dim 1 gives [3], not [4] */
    gt_error err = {0};
    EXPECT(tt_run(&k, &err) == GT_ERR_SHAPE, "sum with a wrong output shape must fail");
    gt_tensor_free(&x);
    gt_tensor_free(&y);
}

/* max_backward: L = sum_g dy_g * max(x in group g); dL/dx is dy at the group's argmax. */
typedef struct {
    const reduce_case *rc;
    const bool *reduced;
    double *x, *dy;
    int64_t nx, ny;
} maxb_ctx;

static double maxb_objective(void *p)
{
    maxb_ctx *c = p;
    double *m = tt_doubles(c->ny), l = 0.0;
    for (int64_t g = 0; g < c->ny; g++)
        m[g] = -INFINITY;
    for (int64_t i = 0; i < c->nx; i++) {
        int64_t g = group_of(c->rc, c->reduced, i);
        m[g] = fmax(m[g], c->x[i]);
    }
    for (int64_t g = 0; g < c->ny; g++)
        l += c->dy[g] * m[g];
    free(m);
    return l;
}

static void test_max_backward(tt_rng *r)
{
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const reduce_case *rc = &cases[c];
        for (int keepdim = 0; keepdim < 2; keepdim++) {
            bool reduced[4];
            int64_t os[4];
            int on = reduced_shape(rc, keepdim, reduced, os);
            gt_tensor x = tt_rand(rc->ndim, rc->shape, r, -3, 3);
            gt_tensor y = tt_new(GT_F32, on, os), dy = tt_rand(on, os, r, -1, 1);
            gt_tensor dx = tt_new(GT_F32, rc->ndim, rc->shape);
            tt_call km;
            tt_init(&km, GT_OP_MAX);
            tt_in(&km, &x);
            tt_out(&km, &y);
            set_reduce_attrs(&km, rc, keepdim);
            tt_run_ok(&km, "max");
            maxb_ctx ctx = {rc,
                            reduced,
                            tt_to_double(&x),
                            tt_to_double(&dy),
                            gt_tensor_numel(&x),
                            gt_tensor_numel(&y)};
            double *fd = tt_doubles(ctx.nx);
            tt_fd(ctx.x, ctx.nx, 1e-4, maxb_objective, &ctx, fd);
            tt_call k;
            tt_init(&k, GT_OP_MAX_BACKWARD);
            tt_in(&k, &x);
            tt_in(&k, &y);
            tt_in(&k, &dy);
            tt_out(&k, &dx);
            set_reduce_attrs(&k, rc, keepdim);
            if (tt_run_ok(&k, "max_backward"))
                EXPECT(tt_close(&dx, fd, 1e-4, 1e-6, "max_backward"), "case %zu keepdim %d", c,
                       keepdim);
            EXPECT(tt_deterministic(&k), "max_backward determinism case %zu", c);
            EXPECT(tt_half_path(&k, GT_BF16, 0), "max_backward bf16 case %zu", c);
            free(ctx.x);
            free(ctx.dy);
            free(fd);
            gt_tensor_free(&x);
            gt_tensor_free(&y);
            gt_tensor_free(&dy);
            gt_tensor_free(&dx);
        }
    }
    /* Ties: the gradient goes to the first maximum in row-major order of the group. Rows of
     * [3, 4] reduced over dim 0 (columns) and over dim 1 (rows). */
    const float xv[12] = {1, 5, 2, 5, 5, 0, 2, 5, 5, 5, 2, -1};
    const int64_t want_dim0[12] = {0, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0};
    const int64_t want_dim1[12] = {0, 1, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0};
    for (int dim = 0; dim < 2; dim++) {
        gt_tensor x = tt_new(GT_F32, 2, TT_SHAPE(3, 4));
        memcpy(x.data, xv, sizeof xv);
        int64_t ys = dim == 0 ? 4 : 3;
        gt_tensor y = tt_new(GT_F32, 1, &ys), dy = tt_new(GT_F32, 1, &ys);
        gt_tensor dx = tt_new(GT_F32, 2, TT_SHAPE(3, 4));
        for (int64_t g = 0; g < ys; g++)
            ((float *)dy.data)[g] = 1.0f;
        tt_call km, k;
        tt_init(&km, GT_OP_MAX);
        tt_in(&km, &x);
        tt_out(&km, &y);
        tt_i(&km, 0);
        tt_i(&km, dim);
        tt_run_ok(&km, "max ties");
        tt_init(&k, GT_OP_MAX_BACKWARD);
        tt_in(&k, &x);
        tt_in(&k, &y);
        tt_in(&k, &dy);
        tt_out(&k, &dx);
        tt_i(&k, 0);
        tt_i(&k, dim);
        if (tt_run_ok(&k, "max_backward ties")) {
            const int64_t *want = dim == 0 ? want_dim0 : want_dim1;
            for (int i = 0; i < 12; i++)
                EXPECT(((float *)dx.data)[i] == (float)want[i], "ties dim %d element %d", dim, i);
        }
        gt_tensor_free(&x);
        gt_tensor_free(&y);
        gt_tensor_free(&dy);
        gt_tensor_free(&dx);
    }
}

static void test_sum_to(tt_rng *r)
{
    struct {
        int xn, on;
        int64_t xs[4], os[4];
    } st[] = {
        {3, 2, {2, 3, 7}, {3, 1}},       {3, 1, {2, 3, 7}, {7}}, {3, 3, {2, 3, 7}, {1, 1, 7}},
        {3, 3, {2, 3, 7}, {2, 3, 7}},    {3, 0, {2, 3, 7}, {0}}, {2, 2, {19, 1}, {1, 1}},
        {4, 3, {2, 3, 1, 5}, {3, 1, 1}},
    };
    for (size_t c = 0; c < sizeof st / sizeof st[0]; c++) {
        gt_tensor x = tt_rand(st[c].xn, st[c].xs, r, -2, 2);
        gt_tensor y = tt_new(GT_F32, st[c].on, st[c].os);
        int64_t nx = gt_tensor_numel(&x), idx[4];
        double *ref = tt_doubles(gt_tensor_numel(&y));
        for (int64_t i = 0; i < nx; i++) {
            tt_unravel(i, st[c].xn, st[c].xs, idx);
            ref[tt_ravel_bcast(idx, st[c].xn, st[c].on, st[c].os)] += gt_tensor_get_f32(&x, i);
        }
        tt_call k;
        tt_init(&k, GT_OP_SUM_TO);
        tt_in(&k, &x);
        tt_out(&k, &y);
        for (int d = 0; d < st[c].on; d++)
            tt_e(&k, st[c].os[d]);
        if (tt_run_ok(&k, "sum_to")) EXPECT(tt_close(&y, ref, 1e-6, 1e-7, "sum_to"), "case %zu", c);
        EXPECT(tt_deterministic(&k), "sum_to determinism %zu", c);
        EXPECT(tt_half_path(&k, GT_BF16, 0), "sum_to bf16 %zu", c);
        free(ref);
        gt_tensor_free(&x);
        gt_tensor_free(&y);
    }
}

int main(void)
{
    tt_rng r = {7};
    test_reductions(&r);
    test_max_backward(&r);
    test_sum_to(&r);
    return gt_test_finish();
}
