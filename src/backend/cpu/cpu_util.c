/* cpu_util.c — argument checks, op names and the strided iterator shared by the CPU kernels. */
#include "cpu_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

gt_status gt_cpu_want_f32(const gt_kernel_call *c, const gt_tensor *t, const char *what,
                          gt_error *err)
{
    if (t->dtype == GT_F32) return GT_OK;
    char b[128];
    return gt_error_set(err, GT_ERR_SHAPE, "%s: %s is %s, expected a float tensor",
                        gt_kernel_op_name(c->op), what, gt_kernel_fmt(t, b, sizeof b));
}

bool gt_cpu_broadcast_strides(int on, const int64_t *out, int xn, const int64_t *xs,
                              int64_t *strides)
{
    if (xn > on) return false;
    int64_t xstr[GT_MAX_DIMS];
    gt_kernel_contig_strides(xn, xs, xstr);
    for (int d = 0; d < on; d++) {
        int xd = d - (on - xn);
        if (xd < 0) {
            strides[d] = 0;
        } else if (xs[xd] == out[d]) {
            strides[d] = out[d] == 1 ? 0 : xstr[xd];
        } else if (xs[xd] == 1) {
            strides[d] = 0;
        } else {
            return false;
        }
    }
    return true;
}

void gt_cpu_iter_init(gt_cpu_iter *it, int ndim, const int64_t *shape, int nops,
                      const int64_t *const *strides)
{
    GT_CHECK(nops >= 1 && nops <= GT_CPU_ITER_MAX && ndim >= 0 && ndim <= GT_MAX_DIMS);
    memset(it, 0, sizeof *it);
    it->nops = nops;
    int64_t numel = 1;
    for (int d = 0; d < ndim; d++)
        numel *= shape[d];
    if (numel == 0) {
        it->ndim = 1;
        it->shape[0] = 0;
        return; /* rows = len = 0 */
    }
    /* Keep dims of size > 1, merging an outer dim into the kept inner one when every operand
     * steps through them as one run: stride[outer] == stride[inner] * shape[inner]. Built from the
     * innermost dim outwards, then reversed. */
    int64_t rs[GT_MAX_DIMS], rstr[GT_CPU_ITER_MAX][GT_MAX_DIMS];
    int n = 0;
    for (int d = ndim - 1; d >= 0; d--) {
        if (shape[d] == 1) continue;
        bool merge = n > 0;
        for (int k = 0; merge && k < nops; k++)
            merge = strides[k][d] == rstr[k][n - 1] * rs[n - 1];
        if (merge) {
            rs[n - 1] *= shape[d];
        } else {
            rs[n] = shape[d];
            for (int k = 0; k < nops; k++)
                rstr[k][n] = strides[k][d];
            n++;
        }
    }
    if (n == 0) {
        rs[0] = 1;
        for (int k = 0; k < nops; k++)
            rstr[k][0] = 0;
        n = 1;
    }
    it->ndim = n;
    for (int d = 0; d < n; d++) {
        it->shape[d] = rs[n - 1 - d];
        for (int k = 0; k < nops; k++)
            it->stride[k][d] = rstr[k][n - 1 - d];
    }
    it->len = it->shape[n - 1];
    it->rows = numel / it->len;
    for (int k = 0; k < nops; k++)
        it->inner[k] = it->stride[k][n - 1];
}

void gt_cpu_iter_next(gt_cpu_iter *it)
{
    for (int d = it->ndim - 2; d >= 0; d--) {
        for (int k = 0; k < it->nops; k++)
            it->off[k] += it->stride[k][d];
        if (++it->idx[d] < it->shape[d]) return;
        for (int k = 0; k < it->nops; k++)
            it->off[k] -= it->stride[k][d] * it->shape[d];
        it->idx[d] = 0;
    }
}

void gt_cpu_iter_seek(gt_cpu_iter *it, int64_t r)
{
    for (int k = 0; k < it->nops; k++)
        it->off[k] = 0;
    for (int d = it->ndim - 2; d >= 0; d--) {
        it->idx[d] = r % it->shape[d];
        r /= it->shape[d];
        for (int k = 0; k < it->nops; k++)
            it->off[k] += it->idx[d] * it->stride[k][d];
    }
}

void gt_cpu_iter_reduce(gt_cpu_iter *it, const gt_tensor *x, const int64_t *ostride)
{
    int64_t xstr[GT_MAX_DIMS];
    gt_kernel_contig_strides(x->ndim, x->shape, xstr);
    const int64_t *strides[2] = {xstr, ostride};
    gt_cpu_iter_init(it, x->ndim, x->shape, 2, strides);
}

gt_status gt_cpu_sum_strided(const gt_kernel_call *c, const gt_tensor *x, const int64_t *ostride,
                             float *out, int64_t out_numel, double divisor, gt_error *err)
{
    /* Walking x in memory order and adding into acc[out offset] gives every output element its
     * terms in row-major order of the reduced indices: a fixed order, whatever the layout, while
     * reading x contiguously. */
    double *acc = calloc(out_numel > 0 ? (size_t)out_numel : 1, sizeof *acc);
    if (!acc)
        return gt_error_set(err, GT_ERR_NOMEM, "%s: out of memory for a %lld-element accumulator",
                            gt_kernel_op_name(c->op), (long long)out_numel);
    gt_cpu_iter it;
    gt_cpu_iter_reduce(&it, x, ostride);
    const float *xp = x->data;
    for (int64_t r = 0; r < it.rows; r++) {
        const float *xr = xp + it.off[0];
        double *ar = acc + it.off[1];
        int64_t xs = it.inner[0], os = it.inner[1];
        if (os == 0) {
            double s = *ar;
            for (int64_t j = 0; j < it.len; j++)
                s += xr[j * xs];
            *ar = s;
        } else {
            for (int64_t j = 0; j < it.len; j++)
                ar[j * os] += xr[j * xs];
        }
        gt_cpu_iter_next(&it);
    }
    for (int64_t i = 0; i < out_numel; i++)
        out[i] = (float)(acc[i] / divisor);
    free(acc);
    return GT_OK;
}

typedef struct {
    const gt_tensor *ids;
    int64_t n, d, start;
    const float *dy;
    float *dw;
} gt_cpu_scatter_call;

/* Rows [lo, hi) of dw: zeroed, then every token of theirs added in token order (each block reads
 * all ids and keeps its own: a row's sum has the same terms in the same order on any threads). */
static void gt_cpu_scatter_rows(int64_t lo, int64_t hi, void *user)
{
    const gt_cpu_scatter_call *sc = user;
    int64_t d = sc->d;
    if ((hi - lo) * d > 0) memset(sc->dw + lo * d, 0, (size_t)((hi - lo) * d) * sizeof(float));
    for (int64_t p = 0; p < sc->n; p++) {
        int64_t local = gt_cpu_index_at(sc->ids, p) - sc->start;
        if (local < lo || local >= hi) continue;
        float *dst = sc->dw + local * d;
        const float *r = sc->dy + p * d;
        for (int64_t j = 0; j < d; j++)
            dst[j] += r[j];
    }
}

gt_status gt_cpu_embedding_scatter(const gt_kernel_call *c, int64_t start, bool all_in_range,
                                   gt_error *err)
{
    const gt_tensor *ids = c->in[0], *dy = c->in[1];
    gt_tensor *dw = c->out[0];
    GT_TRY(gt_cpu_want_f32(c, dy, "dy", err));
    GT_TRY(gt_cpu_want_f32(c, dw, "dw", err));
    GT_TRY(gt_kernel_want_embedding_backward(c, err));
    int64_t rows = dw->shape[0], d = dw->shape[1], n = gt_tensor_numel(ids);
    for (int64_t p = 0; all_in_range && p < n; p++) {
        int64_t id = gt_cpu_index_at(ids, p);
        if (id < 0 || id >= rows)
            return gt_error_set(err, GT_ERR_INVALID,
                                "embedding_backward: id %lld at position %lld is outside [0, %lld)",
                                (long long)id, (long long)p, (long long)rows);
    }
    gt_cpu_scatter_call sc = {
        .ids = ids, .n = n, .d = d, .start = start, .dy = dy->data, .dw = dw->data};
    gt_cpu_parallel_for(rows, gt_cpu_grain_of(d + n / 8), gt_cpu_scatter_rows, &sc);
    return GT_OK;
}

gt_status gt_cpu_ce_grad_check(const gt_kernel_call *c, const gt_tensor *logits,
                               const gt_tensor *dloss, const gt_tensor *dx, gt_error *err)
{
    GT_TRY(gt_cpu_want_f32(c, dloss, "dloss", err));
    GT_TRY(gt_cpu_want_f32(c, dx, "dlogits", err));
    GT_TRY(gt_kernel_want_same_shape(c, logits, "logits", dx, "dlogits", err));
    if (gt_tensor_numel(dloss) != 1) {
        char b[128];
        return gt_error_set(err, GT_ERR_SHAPE, "%s: dloss is %s, expected a scalar",
                            gt_kernel_op_name(c->op), gt_kernel_fmt(dloss, b, sizeof b));
    }
    return GT_OK;
}
