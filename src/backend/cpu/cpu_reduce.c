/* cpu_reduce.c — sum, mean, sum_squares, max, max_backward and sum_to.
 *
 * All of them walk x once in memory order and address the reduced output through strides that are
 * 0 on the reduced dims (gt_cpu_sum_strided). Each output element therefore receives its terms in
 * row-major order of the reduced indices — a fixed order, independent of threads and layout.
 * Sums and means accumulate in double (reductions over long rows: a vocabulary, a batch of
 * tokens) and round to f32 once at the end; max needs no accumulator precision. */
#include "cpu_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Reads the reduction attributes (i[0] = keepdim, i[1..] = dims; no dims reduces nothing, as the
 * IR's shape rule says: every group is one element), checks the
 * output shape they imply against `red` (the reduced tensor: the output, or y/dy of max_backward),
 * and fills `ostride`: the element stride of the reduced tensor along each dim of x, 0 on reduced
 * dims. `count` receives the number of x elements per output element. */
static gt_status gt_cpu_reduce_layout(const gt_kernel_call *c, const gt_tensor *x,
                                      const gt_tensor *red, const char *what, int64_t *ostride,
                                      int64_t *count, gt_error *err)
{
    GT_TRY(gt_kernel_want_attrs(c, 1, 0, 0, err));
    bool keepdim = c->i[0] != 0;
    bool reduced[GT_MAX_DIMS] = {false};
    for (int k = 1; k < c->ni; k++) {
        int d;
        GT_TRY(gt_kernel_norm_dim(c, c->i[k], x->ndim, &d, err));
        if (reduced[d])
            return gt_error_set(err, GT_ERR_INVALID, "%s: dim %d listed twice",
                                gt_kernel_op_name(c->op), d);
        reduced[d] = true;
    }
    int64_t kshape[GT_MAX_DIMS], kstride[GT_MAX_DIMS];
    int64_t expect[GT_MAX_DIMS];
    int ne = 0;
    *count = 1;
    for (int d = 0; d < x->ndim; d++) {
        kshape[d] = reduced[d] ? 1 : x->shape[d];
        if (reduced[d]) *count *= x->shape[d];
        if (!reduced[d] || keepdim) expect[ne++] = kshape[d];
    }
    bool ok = red->ndim == ne;
    for (int d = 0; ok && d < ne; d++)
        ok = red->shape[d] == expect[d];
    if (!ok) {
        char bx[128], br[128];
        return gt_error_set(err, GT_ERR_SHAPE, "%s: %s is %s, expected the reduction of %s",
                            gt_kernel_op_name(c->op), what, gt_kernel_fmt(red, br, sizeof br),
                            gt_kernel_fmt(x, bx, sizeof bx));
    }
    gt_kernel_contig_strides(x->ndim, kshape, kstride);
    for (int d = 0; d < x->ndim; d++)
        ostride[d] = reduced[d] ? 0 : kstride[d];
    return GT_OK;
}

typedef struct {
    const float *x;
    float *q;
} gt_cpu_squares_call;

static void gt_cpu_squares(int64_t lo, int64_t hi, void *user)
{
    const gt_cpu_squares_call *s = user;
    for (int64_t i = lo; i < hi; i++)
        s->q[i] = s->x[i] * s->x[i];
}

/* sum, mean and sum_squares. sum_squares sums the squares, each rounded to f32 as mul's kernel
 * rounds it, exactly as sum sums: bitwise sum(mul(x, x)) (a bf16 x was widened, exactly, by the
 * dispatcher). */
static gt_status gt_cpu_sum_or_mean(const gt_kernel_call *c, gt_error *err)
{
    const gt_tensor *x = c->in[0];
    gt_tensor *out = c->out[0];
    GT_TRY(gt_cpu_want_f32(c, x, "input", err));
    GT_TRY(gt_cpu_want_f32(c, out, "output", err));
    int64_t ostride[GT_MAX_DIMS], count;
    GT_TRY(gt_cpu_reduce_layout(c, x, out, "output", ostride, &count, err));
    /* mean of an empty group is 0/0 = NaN, as torch */
    double divisor = c->op == GT_OP_MEAN ? (double)count : 1.0;
    if (c->op != GT_OP_SUM_SQUARES)
        return gt_cpu_sum_strided(c, x, ostride, out->data, gt_tensor_numel(out), divisor, err);
    int64_t n = gt_tensor_numel(x);
    gt_tensor sq = *x;
    sq.data = malloc(n > 0 ? (size_t)n * sizeof(float) : 1);
    if (!sq.data)
        return gt_error_set(err, GT_ERR_NOMEM, "sum_squares: out of memory for %lld squares",
                            (long long)n);
    gt_cpu_squares_call q = {.x = x->data, .q = sq.data};
    gt_cpu_parallel_for(n, GT_CPU_GRAIN, gt_cpu_squares, &q);
    /* the ordered sum stays on one thread: its order is the bits' contract */
    gt_status st = gt_cpu_sum_strided(c, &sq, ostride, out->data, gt_tensor_numel(out), 1.0, err);
    free(sq.data);
    return st;
}

gt_status gt_cpu_sum(const gt_kernel_call *c, gt_error *err)
{
    return gt_cpu_sum_or_mean(c, err);
}
gt_status gt_cpu_mean(const gt_kernel_call *c, gt_error *err)
{
    return gt_cpu_sum_or_mean(c, err);
}
gt_status gt_cpu_sum_squares(const gt_kernel_call *c, gt_error *err)
{
    return gt_cpu_sum_or_mean(c, err);
}

gt_status gt_cpu_max(const gt_kernel_call *c, gt_error *err)
{
    const gt_tensor *x = c->in[0];
    gt_tensor *out = c->out[0];
    GT_TRY(gt_cpu_want_f32(c, x, "input", err));
    GT_TRY(gt_cpu_want_f32(c, out, "output", err));
    int64_t ostride[GT_MAX_DIMS], count;
    GT_TRY(gt_cpu_reduce_layout(c, x, out, "output", ostride, &count, err));
    int64_t on = gt_tensor_numel(out);
    if (count == 0 && on > 0)
        return gt_error_set(err, GT_ERR_INVALID, "max: reduces an empty dim (no maximum exists)");
    float *m = out->data;
    for (int64_t i = 0; i < on; i++)
        m[i] = -INFINITY;
    gt_cpu_iter it;
    gt_cpu_iter_reduce(&it, x, ostride);
    const float *xp = x->data;
    for (int64_t r = 0; r < it.rows; r++) {
        const float *xr = xp + it.off[0];
        float *mr = m + it.off[1];
        for (int64_t j = 0; j < it.len; j++) {
            /* NaN propagates (as torch.amax): once the maximum is NaN nothing replaces it. */
            float v = xr[j * it.inner[0]], *mp = &mr[j * it.inner[1]];
            if (v > *mp || isnan(v)) *mp = v;
        }
        gt_cpu_iter_next(&it);
    }
    return GT_OK;
}

gt_status gt_cpu_max_backward(const gt_kernel_call *c, gt_error *err)
{
    const gt_tensor *x = c->in[0], *y = c->in[1], *dy = c->in[2];
    gt_tensor *dx = c->out[0];
    GT_TRY(gt_cpu_want_f32(c, x, "x", err));
    GT_TRY(gt_cpu_want_f32(c, y, "y", err));
    GT_TRY(gt_cpu_want_f32(c, dy, "dy", err));
    GT_TRY(gt_cpu_want_f32(c, dx, "dx", err));
    GT_TRY(gt_kernel_want_same_shape(c, x, "x", dx, "dx", err));
    GT_TRY(gt_kernel_want_same_shape(c, y, "y", dy, "dy", err));
    int64_t ostride[GT_MAX_DIMS], count;
    GT_TRY(gt_cpu_reduce_layout(c, x, y, "y", ostride, &count, err));
    int64_t on = gt_tensor_numel(y);
    uint8_t *routed = calloc(on > 0 ? (size_t)on : 1, 1);
    if (!routed)
        return gt_error_set(err, GT_ERR_NOMEM, "max_backward: out of memory for %lld flags",
                            (long long)on);
    /* Memory order of x is row-major order within each group, so the first match seen is the
     * first maximum. */
    gt_cpu_iter it;
    gt_cpu_iter_reduce(&it, x, ostride);
    const float *xp = x->data, *yp = y->data, *gp = dy->data;
    float *dxp = dx->data;
    for (int64_t r = 0; r < it.rows; r++) {
        for (int64_t j = 0; j < it.len; j++) {
            int64_t xi = it.off[0] + j * it.inner[0], oi = it.off[1] + j * it.inner[1];
            float v = xp[xi], m = yp[oi];
            bool hit = !routed[oi] && (v == m || (isnan(v) && isnan(m)));
            dxp[xi] = hit ? gp[oi] : 0.0f;
            routed[oi] |= hit;
        }
        gt_cpu_iter_next(&it);
    }
    free(routed);
    return GT_OK;
}

gt_status gt_cpu_sum_to(const gt_kernel_call *c, gt_error *err)
{
    const gt_tensor *x = c->in[0];
    gt_tensor *out = c->out[0];
    GT_TRY(gt_cpu_want_f32(c, x, "input", err));
    GT_TRY(gt_cpu_want_f32(c, out, "output", err));
    /* numpy broadcasting in reverse: out aligns with x at the right; x's extra leading dims and
     * the dims where out has 1 and x does not are summed. */
    int64_t ostride[GT_MAX_DIMS], ocontig[GT_MAX_DIMS];
    bool ok = out->ndim <= x->ndim && c->ne == out->ndim;
    int lead = x->ndim - out->ndim;
    gt_kernel_contig_strides(out->ndim, out->shape, ocontig);
    for (int d = 0; ok && d < x->ndim; d++) {
        int od = d - lead;
        if (od < 0) {
            ostride[d] = 0;
        } else if (c->e[od] != out->shape[od]) {
            ok = false;
        } else if (out->shape[od] == x->shape[d]) {
            ostride[d] = ocontig[od];
        } else if (out->shape[od] == 1) {
            ostride[d] = 0;
        } else {
            ok = false;
        }
    }
    if (!ok) {
        char bx[128], bo[128];
        return gt_error_set(err, GT_ERR_SHAPE, "sum_to: cannot sum %s down to %s",
                            gt_kernel_fmt(x, bx, sizeof bx), gt_kernel_fmt(out, bo, sizeof bo));
    }
    return gt_cpu_sum_strided(c, x, ostride, out->data, gt_tensor_numel(out), 1.0, err);
}
