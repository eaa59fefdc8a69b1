/* cpu_loss.c — softmax, cross_entropy, embedding and their backwards.
 *
 * Softmax-like sums (softmax denominators, the log-sum-exp of cross entropy, sum y*dy, the
 * cross-entropy mean over rows) accumulate in double: they run over a whole vocabulary or batch.
 * exp itself is evaluated in f32 on x - max (<= 0, so never overflows). embedding_backward adds
 * rows in f32 in token order (deterministic; the order a serial scatter-add gives). The loss and
 * its gradient go by blocks of rows to the backend's threads, each row computed alone; the mean's
 * sum over rows stays in row order on one thread. */
#include "cpu_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* softmax / softmax_backward view x as [outer, n, inner] around dim. */
static gt_status gt_cpu_softmax_dims(const gt_kernel_call *c, const gt_tensor *x, int64_t *outer,
                                     int64_t *n, int64_t *inner, gt_error *err)
{
    GT_TRY(gt_kernel_want_attrs(c, 1, 0, 0, err));
    int dim;
    GT_TRY(gt_kernel_norm_dim(c, c->i[0], x->ndim, &dim, err));
    *outer = 1;
    *inner = 1;
    for (int d = 0; d < dim; d++)
        *outer *= x->shape[d];
    for (int d = dim + 1; d < x->ndim; d++)
        *inner *= x->shape[d];
    *n = x->shape[dim];
    return GT_OK;
}

gt_status gt_cpu_softmax(const gt_kernel_call *c, gt_error *err)
{
    const gt_tensor *x = c->in[0];
    gt_tensor *y = c->out[0];
    GT_TRY(gt_cpu_want_f32(c, x, "x", err));
    GT_TRY(gt_cpu_want_f32(c, y, "output", err));
    GT_TRY(gt_kernel_want_same_shape(c, x, "x", y, "output", err));
    int64_t outer, n, inner;
    GT_TRY(gt_cpu_softmax_dims(c, x, &outer, &n, &inner, err));
    /* y_j = exp(x_j - m) / sum_k exp(x_k - m), m = max_k x_k (NaN in x gives NaN, as torch); the
     * division is a multiply by the f32 reciprocal (within 1 ulp). */
    for (int64_t o = 0; o < outer; o++) {
        for (int64_t in = 0; in < inner; in++) {
            const float *xr = (const float *)x->data + o * n * inner + in;
            float *yr = (float *)y->data + o * n * inner + in;
            float m = -INFINITY;
            for (int64_t j = 0; j < n; j++)
                m = xr[j * inner] > m ? xr[j * inner] : m;
            double sum = 0.0;
            for (int64_t j = 0; j < n; j++) {
                float e = gt_cpu_expf(xr[j * inner] - m);
                yr[j * inner] = e;
                sum += e;
            }
            float inv = (float)(1.0 / sum);
            for (int64_t j = 0; j < n; j++)
                yr[j * inner] *= inv;
        }
    }
    return GT_OK;
}

gt_status gt_cpu_softmax_backward(const gt_kernel_call *c, gt_error *err)
{
    const gt_tensor *y = c->in[0], *dy = c->in[1];
    gt_tensor *dx = c->out[0];
    GT_TRY(gt_cpu_want_f32(c, y, "y", err));
    GT_TRY(gt_cpu_want_f32(c, dy, "dy", err));
    GT_TRY(gt_cpu_want_f32(c, dx, "dx", err));
    GT_TRY(gt_kernel_want_same_shape(c, y, "y", dy, "dy", err));
    GT_TRY(gt_kernel_want_same_shape(c, y, "y", dx, "dx", err));
    int64_t outer, n, inner;
    GT_TRY(gt_cpu_softmax_dims(c, y, &outer, &n, &inner, err));
    /* dx_j = y_j * (dy_j - sum_k y_k dy_k) */
    for (int64_t o = 0; o < outer; o++) {
        for (int64_t in = 0; in < inner; in++) {
            int64_t base = o * n * inner + in;
            const float *yr = (const float *)y->data + base, *gr = (const float *)dy->data + base;
            float *dr = (float *)dx->data + base;
            double dot = 0.0;
            for (int64_t j = 0; j < n; j++)
                dot += (double)yr[j * inner] * gr[j * inner];
            float df = (float)dot;
            for (int64_t j = 0; j < n; j++)
                dr[j * inner] = yr[j * inner] * (gr[j * inner] - df);
        }
    }
    return GT_OK;
}

/* Checks logits [N, V] and targets [N]; counts rows whose target is not ignore_index and rejects
 * targets outside [0, V) that are not ignored. */
static gt_status gt_cpu_ce_check(const gt_kernel_call *c, const gt_tensor *logits,
                                 const gt_tensor *targets, int64_t *n_valid, gt_error *err)
{
    GT_TRY(gt_kernel_want_attrs(c, 1, 0, 0, err));
    GT_TRY(gt_cpu_want_f32(c, logits, "logits", err));
    GT_TRY(gt_kernel_want_index(c, targets, "targets", err));
    GT_TRY(gt_kernel_want_rank(c, logits, "logits", 2, err));
    GT_TRY(gt_kernel_want_rank(c, targets, "targets", 1, err));
    if (targets->shape[0] != logits->shape[0]) {
        char bl[128], bt[128];
        return gt_error_set(err, GT_ERR_SHAPE, "%s: logits %s and targets %s: expected [N, V], [N]",
                            gt_kernel_op_name(c->op), gt_kernel_fmt(logits, bl, sizeof bl),
                            gt_kernel_fmt(targets, bt, sizeof bt));
    }
    int64_t rows = logits->shape[0], v = logits->shape[1], ignore = c->i[0];
    *n_valid = 0;
    for (int64_t i = 0; i < rows; i++) {
        int64_t t = gt_cpu_index_at(targets, i);
        if (t == ignore) continue;
        if (t < 0 || t >= v)
            return gt_error_set(err, GT_ERR_INVALID,
                                "%s: target at row %lld is %lld, expected in [0, %lld) or the "
                                "ignore_index %lld",
                                gt_kernel_op_name(c->op), (long long)i, (long long)t, (long long)v,
                                (long long)ignore);
        (*n_valid)++;
    }
    return GT_OK;
}

/* g_j = e_j * scale rounded to f32, vectorized (a double product per element, as the scalar loop)
 */
GT_CPU_ELEMENT_LOOP static void gt_cpu_ce_scale(float *g, int64_t n, double scale)
{
    for (int64_t j = 0; j < n; j++)
        g[j] = (float)(g[j] * scale);
}

/* Writes e_j = exp(x_j - max) into e (may be NULL) and returns m + log(sum e) in double. */
static double gt_cpu_row_lse(const float *x, int64_t v, float *e, double *sum_out)
{
    float m = gt_cpu_max_n(x, v);
    double sum = gt_cpu_exp_sum(x, e, v, m);
    if (sum_out) *sum_out = sum;
    return (double)m + log(sum);
}

typedef struct {
    const gt_kernel_call *c;
    int64_t v;
    double *term; /* cross_entropy: lse_i - x_i[t_i] per row (unset on ignored rows) */
    double coef;  /* cross_entropy_backward: dloss / n_valid */
    bool zero;    /* cross_entropy_backward: every row is 0 (no valid row) */
} gt_cpu_ce_call;

static void gt_cpu_ce_rows(int64_t lo, int64_t hi, void *user)
{
    const gt_cpu_ce_call *ce = user;
    const gt_kernel_call *c = ce->c;
    for (int64_t i = lo; i < hi; i++) {
        int64_t t = gt_cpu_index_at(c->in[1], i);
        if (t == c->i[0]) continue;
        const float *x = (const float *)c->in[0]->data + i * ce->v;
        ce->term[i] = gt_cpu_row_lse(x, ce->v, NULL, NULL) - (double)x[t];
    }
}

/* dlogits_ij = dloss / n_valid * (softmax_ij - [j == t_i]) for rows [lo, hi); 0 on ignored rows. */
static void gt_cpu_ce_grad_rows(int64_t lo, int64_t hi, void *user)
{
    const gt_cpu_ce_call *ce = user;
    const gt_kernel_call *c = ce->c;
    int64_t v = ce->v;
    for (int64_t i = lo; i < hi; i++) {
        int64_t t = gt_cpu_index_at(c->in[1], i);
        float *g = (float *)c->out[0]->data + i * v;
        if (t == c->i[0] || ce->zero) {
            memset(g, 0, (size_t)v * sizeof *g);
            continue;
        }
        double sum;
        gt_cpu_row_lse((const float *)c->in[0]->data + i * v, v, g, &sum);
        /* coef * softmax_j = e_j * (coef / sum); the target column subtracts coef. */
        double scale = ce->coef / sum;
        float et = g[t];
        gt_cpu_ce_scale(g, v, scale);
        g[t] = (float)(et * scale - ce->coef);
    }
}

gt_status gt_cpu_cross_entropy(const gt_kernel_call *c, gt_error *err)
{
    const gt_tensor *logits = c->in[0], *targets = c->in[1];
    gt_tensor *out = c->out[0];
    int64_t n_valid = 0;
    GT_TRY(gt_cpu_ce_check(c, logits, targets, &n_valid, err));
    GT_TRY(gt_cpu_want_f32(c, out, "output", err));
    GT_TRY(gt_kernel_want_rank(c, out, "output", 0, err));
    /* loss = (1/n_valid) sum_{valid i} (lse_i - x_i[t_i]); 0/0 = NaN when every row is ignored. */
    int64_t rows = logits->shape[0], v = logits->shape[1];
    /* the rows' terms on the threads, then their sum in row order on this one */
    double *term = malloc(rows > 0 ? (size_t)rows * sizeof *term : 1);
    if (!term)
        return gt_error_set(err, GT_ERR_NOMEM, "cross_entropy: out of memory for %lld rows",
                            (long long)rows);
    gt_cpu_ce_call ce = {.c = c, .v = v, .term = term};
    gt_cpu_parallel_for(rows, gt_cpu_grain_of(v), gt_cpu_ce_rows, &ce);
    double total = 0.0;
    for (int64_t i = 0; i < rows; i++)
        if (gt_cpu_index_at(targets, i) != c->i[0]) total += term[i];
    free(term);
    *(float *)out->data = (float)(total / (double)n_valid);
    return GT_OK;
}

gt_status gt_cpu_cross_entropy_backward(const gt_kernel_call *c, gt_error *err)
{
    const gt_tensor *logits = c->in[0], *targets = c->in[1], *dloss = c->in[2];
    gt_tensor *dx = c->out[0];
    int64_t n_valid = 0;
    GT_TRY(gt_cpu_ce_check(c, logits, targets, &n_valid, err));
    GT_TRY(gt_cpu_ce_grad_check(c, logits, dloss, dx, err));
    /* dlogits_ij = dloss / n_valid * (softmax_ij - [j == t_i]); 0 on ignored rows. */
    int64_t rows = logits->shape[0], v = logits->shape[1];
    double coef = n_valid > 0 ? (double)*(const float *)dloss->data / (double)n_valid : 0.0;
    gt_cpu_ce_call ce = {.c = c, .v = v, .coef = coef, .zero = n_valid == 0};
    gt_cpu_parallel_for(rows, gt_cpu_grain_of(v), gt_cpu_ce_grad_rows, &ce);
    return GT_OK;
}

/* cross_entropy_with_grad (logits, targets, dloss) -> (loss, dlogits): cross_entropy, then
 * cross_entropy_backward, each through gt_cpu_run_kernel on the tensors as given: the two ops'
 * bits. */
gt_status gt_cpu_cross_entropy_with_grad(const gt_kernel_call *c, gt_error *err)
{
    gt_kernel_call fwd = *c, bwd = *c;
    fwd.op = GT_OP_CROSS_ENTROPY;
    fwd.n_in = 2;
    fwd.n_out = 1;
    bwd.op = GT_OP_CROSS_ENTROPY_BACKWARD;
    bwd.n_out = 1;
    bwd.out[0] = c->out[1];
    GT_TRY(gt_cpu_run_kernel(&fwd, err));
    return gt_cpu_run_kernel(&bwd, err);
}

gt_status gt_cpu_embedding(const gt_kernel_call *c, gt_error *err)
{
    const gt_tensor *w = c->in[0], *ids = c->in[1];
    gt_tensor *out = c->out[0];
    GT_TRY(gt_kernel_want_embedding(c, err));
    int64_t vocab = w->shape[0], d = w->shape[1];
    /* Rows are copied as stored bytes: any float dtype, no widening. */
    size_t row = (size_t)d * gt_dtype_size(w->dtype);
    int64_t n = gt_tensor_numel(ids);
    for (int64_t p = 0; p < n; p++) {
        int64_t id = gt_cpu_index_at(ids, p);
        if (id < 0 || id >= vocab)
            return gt_error_set(err, GT_ERR_INVALID,
                                "embedding: id %lld at position %lld is outside [0, %lld)",
                                (long long)id, (long long)p, (long long)vocab);
        if (row)
            memcpy((char *)out->data + (size_t)p * row, (const char *)w->data + (size_t)id * row,
                   row);
    }
    return GT_OK;
}

gt_status gt_cpu_embedding_backward(const gt_kernel_call *c, gt_error *err)
{
    return gt_cpu_embedding_scatter(c, 0, true, err);
}
