/* test_cpu_layout.c — CPU kernels broadcast_to, reshape, regroup, transpose, permute, slice,
 * slice_backward (finite differences), concat, split, in f32, bf16 and i64 (the layout kernels copy
 * stored bytes, so every dtype must come through exactly). References index naively. */
#include "test_cpu_util.h"

static const gt_dtype dtypes[] = {GT_F32, GT_BF16, GT_I64};

/* A tensor of dtype dt with distinct, exactly representable values (small integers and halves). */
static gt_tensor make(gt_dtype dt, int ndim, const int64_t *shape, tt_rng *r)
{
    gt_tensor t = tt_new(dt, ndim, shape);
    int64_t n = gt_tensor_numel(&t);
    for (int64_t i = 0; i < n; i++)
        gt_tensor_set_f32(&t, i, (float)((int64_t)(tt_next(r) % 200) - 100));
    return t;
}

/* got[i] == src[map[i]] for all i (map given by the reference indexing). */
static bool same_gather(const gt_tensor *got, const gt_tensor *src, const int64_t *map)
{
    int64_t n = gt_tensor_numel(got);
    for (int64_t i = 0; i < n; i++)
        if (gt_tensor_get_f32(got, i) != gt_tensor_get_f32(src, map[i])) return false;
    return true;
}

static void test_broadcast_reshape(tt_rng *r)
{
    struct {
        int xn, on;
        int64_t xs[4], os[4];
    } bc[] = {{2, 3, {3, 1}, {2, 3, 5}},
              {1, 2, {7}, {4, 7}},
              {0, 2, {0}, {2, 2}},
              {2, 2, {1, 19}, {3, 19}},
              {3, 3, {2, 3, 5}, {2, 3, 5}}};
    for (size_t d = 0; d < 3; d++) {
        for (size_t c = 0; c < sizeof bc / sizeof bc[0]; c++) {
            gt_tensor x = make(dtypes[d], bc[c].xn, bc[c].xs, r);
            gt_tensor y = tt_new(dtypes[d], bc[c].on, bc[c].os);
            int64_t n = gt_tensor_numel(&y), idx[4];
            int64_t *map = calloc((size_t)n, sizeof *map);
            for (int64_t i = 0; i < n; i++) {
                tt_unravel(i, bc[c].on, bc[c].os, idx);
                map[i] = tt_ravel_bcast(idx, bc[c].on, bc[c].xn, bc[c].xs);
            }
            tt_call k;
            tt_init(&k, GT_OP_BROADCAST_TO);
            tt_in(&k, &x);
            tt_out(&k, &y);
            for (int j = 0; j < bc[c].on; j++)
                tt_e(&k, bc[c].os[j]);
            if (tt_run_ok(&k, "broadcast_to"))
                EXPECT(same_gather(&y, &x, map), "broadcast_to %s case %zu",
                       gt_dtype_name(dtypes[d]), c);
            EXPECT(tt_deterministic(&k), "broadcast_to determinism");
            free(map);
            gt_tensor_free(&x);
            gt_tensor_free(&y);
        }
        /* reshape keeps row-major element order */
        gt_tensor x = make(dtypes[d], 3, TT_SHAPE(3, 7, 5), r),
                  y = tt_new(dtypes[d], 2, TT_SHAPE(21, 5));
        int64_t map[105];
        for (int i = 0; i < 105; i++)
            map[i] = i;
        tt_call k;
        tt_init(&k, GT_OP_RESHAPE);
        tt_in(&k, &x);
        tt_out(&k, &y);
        tt_e(&k, 21);
        tt_e(&k, 5);
        if (tt_run_ok(&k, "reshape")) EXPECT(same_gather(&y, &x, map), "reshape");
        gt_tensor bad = tt_new(dtypes[d], 2, TT_SHAPE(20, 5));
        k.c.out[0] = &bad;
        k.e[0] = 20;
        gt_error err = {0};
        EXPECT(tt_run(&k, &err) == GT_ERR_SHAPE, "reshape to a different numel must fail");
        gt_tensor_free(&bad);
        /* regroup: a batch of 3 rows as 3 ranks' blocks of 1, row-major order kept; its numel is
         * checked here, at the kernel (the shape rule takes the attributes on trust) */
        gt_tensor blocks = tt_new(dtypes[d], 4, TT_SHAPE(3, 1, 7, 5));
        tt_init(&k, GT_OP_REGROUP);
        tt_in(&k, &x);
        tt_out(&k, &blocks);
        tt_e(&k, 3);
        tt_e(&k, 1);
        tt_e(&k, 7);
        tt_e(&k, 5);
        if (tt_run_ok(&k, "regroup")) EXPECT(same_gather(&blocks, &x, map), "regroup");
        gt_tensor short_ = tt_new(dtypes[d], 4, TT_SHAPE(2, 1, 7, 5));
        k.c.out[0] = &short_;
        k.e[0] = 2;
        EXPECT(tt_run(&k, &err) == GT_ERR_SHAPE, "regroup to a different numel must fail");
        gt_tensor_free(&short_);
        gt_tensor_free(&blocks);
        gt_tensor_free(&x);
        gt_tensor_free(&y);
    }
}

static void check_permute(tt_rng *r, gt_dtype dt, int ndim, const int64_t *xs, const int *perm,
                          bool as_transpose, int t0, int t1)
{
    gt_tensor x = make(dt, ndim, xs, r);
    int64_t os[4], idx[4], xi[4];
    for (int k = 0; k < ndim; k++)
        os[k] = xs[perm[k]];
    gt_tensor y = tt_new(dt, ndim, os);
    int64_t n = gt_tensor_numel(&y);
    int64_t *map = calloc((size_t)n, sizeof *map);
    for (int64_t i = 0; i < n; i++) {
        tt_unravel(i, ndim, os, idx);
        for (int k = 0; k < ndim; k++)
            xi[perm[k]] = idx[k];
        map[i] = tt_ravel_bcast(xi, ndim, ndim, xs);
    }
    tt_call k;
    tt_init(&k, as_transpose ? GT_OP_TRANSPOSE : GT_OP_PERMUTE);
    tt_in(&k, &x);
    tt_out(&k, &y);
    if (as_transpose) {
        tt_i(&k, t0);
        tt_i(&k, t1);
    } else {
        for (int j = 0; j < ndim; j++)
            tt_i(&k, perm[j]);
    }
    if (tt_run_ok(&k, "permute"))
        EXPECT(same_gather(&y, &x, map), "%s %s", as_transpose ? "transpose" : "permute",
               gt_dtype_name(dt));
    EXPECT(tt_deterministic(&k), "permute determinism");
    free(map);
    gt_tensor_free(&x);
    gt_tensor_free(&y);
}

static void test_transpose_permute(tt_rng *r)
{
    for (size_t d = 0; d < 3; d++) {
        const int64_t s3[3] = {3, 7, 5}, s2[2] = {19, 3}, s4[4] = {2, 3, 5, 7};
        check_permute(r, dtypes[d], 3, s3, (const int[]){2, 1, 0}, true, 0, 2);
        check_permute(r, dtypes[d], 3, s3, (const int[]){0, 2, 1}, true, 1, 2);
        check_permute(r, dtypes[d], 3, s3, (const int[]){1, 0, 2}, true, 0, 1);
        check_permute(r, dtypes[d], 3, s3, (const int[]){0, 2, 1}, true, -1, -2);
        check_permute(r, dtypes[d], 2, s2, (const int[]){1, 0}, true, 0, 1);
        check_permute(r, dtypes[d], 4, s4, (const int[]){3, 1, 0, 2}, false, 0, 0);
        check_permute(r, dtypes[d], 4, s4, (const int[]){0, 2, 1, 3}, false, 0, 0);
        check_permute(r, dtypes[d], 4, s4, (const int[]){0, 1, 2, 3}, false, 0, 0);
    }
}

/* Slice [start, end) of dim `dim` of a [5, 7, 3] tensor. */
static int64_t slice_src(const int64_t *os, int dim, int64_t start, int64_t i)
{
    const int64_t xs[3] = {5, 7, 3};
    int64_t idx[3];
    tt_unravel(i, 3, os, idx);
    idx[dim] += start;
    return tt_ravel_bcast(idx, 3, 3, xs);
}

typedef struct {
    double *x, *dy;
    int dim;
    int64_t start, ny;
    const int64_t *os;
} slice_ctx;

static double slice_objective(void *p)
{
    slice_ctx *c = p;
    double l = 0.0;
    for (int64_t i = 0; i < c->ny; i++)
        l += c->dy[i] * c->x[slice_src(c->os, c->dim, c->start, i)];
    return l;
}

static void test_slice(tt_rng *r)
{
    const int64_t xs[3] = {5, 7, 3};
    struct {
        int dim;
        int64_t start, end;
    } sc[] = {{1, 2, 6}, {0, 0, 5}, {2, 1, 2}, {1, 3, 3}, {0, 4, 5}};
    for (size_t d = 0; d < 3; d++) {
        for (size_t c = 0; c < sizeof sc / sizeof sc[0]; c++) {
            int64_t os[3] = {5, 7, 3};
            os[sc[c].dim] = sc[c].end - sc[c].start;
            gt_tensor x = make(dtypes[d], 3, xs, r), y = tt_new(dtypes[d], 3, os);
            int64_t n = gt_tensor_numel(&y);
            int64_t *map = calloc((size_t)(n ? n : 1), sizeof *map);
            for (int64_t i = 0; i < n; i++)
                map[i] = slice_src(os, sc[c].dim, sc[c].start, i);
            tt_call k;
            tt_init(&k, GT_OP_SLICE);
            tt_in(&k, &x);
            tt_out(&k, &y);
            tt_i(&k, sc[c].dim);
            tt_e(&k, sc[c].start);
            tt_e(&k, sc[c].end);
            if (tt_run_ok(&k, "slice")) EXPECT(same_gather(&y, &x, map), "slice case %zu", c);
            EXPECT(tt_deterministic(&k), "slice determinism");

            /* slice_backward: dy placed at [start, end), zeros elsewhere; checked as the
             * gradient of L(x) = sum dy * slice(x) by central differences. */
            gt_tensor dy = make(dtypes[d], 3, os, r), dx = tt_new(dtypes[d], 3, xs);
            tt_call kb;
            tt_init(&kb, GT_OP_SLICE_BACKWARD);
            tt_in(&kb, &dy);
            tt_out(&kb, &dx);
            tt_i(&kb, sc[c].dim);
            tt_e(&kb, sc[c].start);
            tt_e(&kb, sc[c].end);
            tt_e(&kb, xs[sc[c].dim]);
            if (dtypes[d] == GT_F32) {
                slice_ctx ctx = {
                    tt_to_double(&x), tt_to_double(&dy), sc[c].dim, sc[c].start, n, os};
                double *fd = tt_doubles(105);
                tt_fd(ctx.x, 105, 1e-3, slice_objective, &ctx, fd);
                if (tt_run_ok(&kb, "slice_backward"))
                    EXPECT(tt_close(&dx, fd, 1e-6, 1e-9, "slice_backward"), "case %zu", c);
                free(ctx.x);
                free(ctx.dy);
                free(fd);
            } else if (tt_run_ok(&kb, "slice_backward")) {
                bool ok = true;
                for (int64_t i = 0; i < 105; i++) {
                    double want = 0.0;
                    for (int64_t j = 0; j < n; j++)
                        if (map[j] == i) want = gt_tensor_get_f32(&dy, j);
                    ok = ok && gt_tensor_get_f32(&dx, i) == want;
                }
                EXPECT(ok, "slice_backward %s case %zu", gt_dtype_name(dtypes[d]), c);
            }
            EXPECT(tt_deterministic(&kb), "slice_backward determinism");
            free(map);
            gt_tensor_free(&x);
            gt_tensor_free(&y);
            gt_tensor_free(&dy);
            gt_tensor_free(&dx);
        }
    }
    gt_tensor x = tt_rand(3, xs, r, -1, 1), y = tt_new(GT_F32, 3, TT_SHAPE(5, 3, 3));
    tt_call k;
    tt_init(&k, GT_OP_SLICE);
    tt_in(&k, &x);
    tt_out(&k, &y);
    tt_i(&k, 1);
    tt_e(&k, 5);
    tt_e(&k, 8); /* past the end of a dim of 7 */
    gt_error err = {0};
    EXPECT(tt_run(&k, &err) == GT_ERR_INVALID, "slice past the end must fail");
    gt_tensor_free(&x);
    gt_tensor_free(&y);
}

static void test_concat_split(tt_rng *r)
{
    for (size_t d = 0; d < 3; d++) {
        for (int dim = 0; dim < 3; dim++) {
            /* parts of extent 3, 1, 4 along dim; other dims 2 and 5 */
            const int64_t ext[3] = {3, 1, 4};
            gt_tensor parts[3], back[3];
            int64_t total[3] = {2, 8, 5};
            if (dim == 0) total[0] = 8, total[1] = 2;
            if (dim == 2) total[1] = 2, total[2] = 8;
            for (int p = 0; p < 3; p++) {
                int64_t s[3] = {total[0], total[1], total[2]};
                s[dim] = ext[p];
                parts[p] = make(dtypes[d], 3, s, r);
                back[p] = tt_new(dtypes[d], 3, s);
            }
            gt_tensor y = tt_new(dtypes[d], 3, total);
            tt_call k;
            tt_init(&k, GT_OP_CONCAT);
            for (int p = 0; p < 3; p++)
                tt_in(&k, &parts[p]);
            tt_out(&k, &y);
            tt_i(&k, dim);
            if (tt_run_ok(&k, "concat")) {
                bool ok = true;
                int64_t idx[3];
                for (int64_t i = 0; i < gt_tensor_numel(&y); i++) {
                    tt_unravel(i, 3, total, idx);
                    int p = 0;
                    while (idx[dim] >= ext[p])
                        idx[dim] -= ext[p++];
                    ok = ok && gt_tensor_get_f32(&y, i) ==
                                   gt_tensor_get_f32(&parts[p],
                                                     tt_ravel_bcast(idx, 3, 3, parts[p].shape));
                }
                EXPECT(ok, "concat %s dim %d", gt_dtype_name(dtypes[d]), dim);
            }
            EXPECT(tt_deterministic(&k), "concat determinism");
            tt_call ks;
            tt_init(&ks, GT_OP_SPLIT);
            tt_in(&ks, &y);
            for (int p = 0; p < 3; p++)
                tt_out(&ks, &back[p]);
            tt_i(&ks, dim);
            for (int p = 0; p < 3; p++)
                tt_e(&ks, ext[p]);
            if (tt_run_ok(&ks, "split"))
                for (int p = 0; p < 3; p++)
                    EXPECT(tt_same_bits(&back[p], &parts[p]), "split undoes concat, part %d", p);
            EXPECT(tt_deterministic(&ks), "split determinism");
            for (int p = 0; p < 3; p++) {
                gt_tensor_free(&parts[p]);
                gt_tensor_free(&back[p]);
            }
            gt_tensor_free(&y);
        }
    }
}

int main(void)
{
    tt_rng r = {11};
    test_broadcast_reshape(&r);
    test_transpose_permute(&r);
    test_slice(&r);
    test_concat_split(&r);
    return gt_test_finish();
}
