/* cpu_shard.c — CPU kernels of the vocabulary-parallel local ops (gt_ops.def): embedding_shard,
 * embedding_shard_backward, logsumexp, cross_entropy_shard, cross_entropy_shard_backward.
 *
 * A rank holds vocabulary rows [start, start + Vl) of the whole table / logits; the global
 * results are sums over the ranks (embedding_shard, cross_entropy_shard) or concatenations along
 * the vocabulary (embedding_shard_backward, cross_entropy_shard_backward) of these local pieces.
 *
 * Dtypes: the float kernels are "f32 kernels" (cpu.c widens bf16/f16 around them). embedding_shard
 * copies rows as stored bytes and writes zero bytes (0.0 in every float dtype) elsewhere, so it is
 * right both behind the widener and as a byte kernel. Sums follow cpu_loss.c: the log-sum-exp and
 * the loss accumulate in double in row order; embedding_shard_backward adds rows in f32 in token
 * order, exactly as embedding_backward does, so its blocks concatenated equal that op bitwise. */
#include "cpu_internal.h"

#include <math.h>
#include <string.h>

gt_status gt_cpu_embedding_shard(const gt_kernel_call *c, gt_error *err)
{
    const gt_tensor *w = c->in[0], *ids = c->in[1];
    gt_tensor *out = c->out[0];
    GT_TRY(gt_kernel_want_float(c, w, "w", err));
    GT_TRY(gt_kernel_want_embedding(c, err));
    int64_t vl = w->shape[0], d = w->shape[1], start = c->e[0];
    /* out[p] = w[id - start] when start <= id < start + Vl, else zeros. */
    size_t row = (size_t)d * gt_dtype_size(w->dtype);
    int64_t n = gt_tensor_numel(ids);
    for (int64_t p = 0; p < n; p++) {
        int64_t local = gt_cpu_index_at(ids, p) - start;
        char *dst = (char *)out->data + (size_t)p * row;
        if (row == 0) continue;
        if (local >= 0 && local < vl)
            memcpy(dst, (const char *)w->data + (size_t)local * row, row);
        else
            memset(dst, 0, row);
    }
    return GT_OK;
}

gt_status gt_cpu_embedding_shard_backward(const gt_kernel_call *c, gt_error *err)
{
    /* dw[id - start] += dy[p] over the tokens p in order whose id is one of this rank's rows */
    return gt_cpu_embedding_scatter(c, c->e[1], false, err);
}

/* log(sum_j exp(x_j)) = m + log(sum_j exp(x_j - m)), m = max_j x_j, the sum in double. A row of
 * -inf gives -inf and one with +inf gives +inf (x - m would be NaN there); NaN gives NaN. */
static double gt_cpu_lse_row(const float *x, int64_t v)
{
    float m = -INFINITY;
    bool nan = false;
    for (int64_t j = 0; j < v; j++) {
        m = x[j] > m ? x[j] : m;
        nan |= isnan(x[j]);
    }
    if (nan) return NAN;
    if (isinf(m)) return m;
    return (double)m + log(gt_cpu_exp_sum(x, NULL, v, m));
}

gt_status gt_cpu_logsumexp(const gt_kernel_call *c, gt_error *err)
{
    const gt_tensor *x = c->in[0];
    gt_tensor *out = c->out[0];
    GT_TRY(gt_cpu_want_f32(c, x, "x", err));
    GT_TRY(gt_cpu_want_f32(c, out, "output", err));
    bool ok = x->ndim >= 1 && out->ndim == x->ndim - 1;
    for (int k = 0; ok && k < out->ndim; k++)
        ok = out->shape[k] == x->shape[k];
    if (!ok) {
        char bx[128], bo[128];
        return gt_error_set(err, GT_ERR_SHAPE,
                            "logsumexp: x %s, output %s: expected [..., V], [...]",
                            gt_kernel_fmt(x, bx, sizeof bx), gt_kernel_fmt(out, bo, sizeof bo));
    }
    int64_t v = x->shape[x->ndim - 1], rows = gt_tensor_numel(out);
    for (int64_t i = 0; i < rows; i++)
        ((float *)out->data)[i] = (float)gt_cpu_lse_row((const float *)x->data + i * v, v);
    return GT_OK;
}

/* Checks logits [N, Vl], targets [N], lse [N] (f32) and counts the rows whose target is not
 * ignore_index; a negative target that is not ignored is an error (one rank cannot see V, so
 * targets >= V are not caught here). */
static gt_status gt_cpu_ce_shard_check(const gt_kernel_call *c, int64_t *n_valid, gt_error *err)
{
    GT_TRY(gt_kernel_want_attrs(c, 1, 0, 1, err));
    const gt_tensor *logits = c->in[0], *targets = c->in[1], *lse = c->in[2];
    GT_TRY(gt_cpu_want_f32(c, logits, "logits", err));
    GT_TRY(gt_kernel_want_index(c, targets, "targets", err));
    GT_TRY(gt_cpu_want_f32(c, lse, "lse", err));
    GT_TRY(gt_kernel_want_rank(c, logits, "logits", 2, err));
    GT_TRY(gt_kernel_want_rank(c, targets, "targets", 1, err));
    GT_TRY(gt_kernel_want_rank(c, lse, "lse", 1, err));
    if (targets->shape[0] != logits->shape[0] || lse->shape[0] != logits->shape[0]) {
        char bl[128], bt[128], bs[128];
        return gt_error_set(
            err, GT_ERR_SHAPE, "%s: logits %s, targets %s, lse %s: expected [N, Vl], [N], [N]",
            gt_kernel_op_name(c->op), gt_kernel_fmt(logits, bl, sizeof bl),
            gt_kernel_fmt(targets, bt, sizeof bt), gt_kernel_fmt(lse, bs, sizeof bs));
    }
    int64_t rows = logits->shape[0], ignore = c->i[0];
    *n_valid = 0;
    for (int64_t i = 0; i < rows; i++) {
        int64_t t = gt_cpu_index_at(targets, i);
        if (t == ignore) continue;
        if (t < 0)
            return gt_error_set(err, GT_ERR_INVALID,
                                "%s: target at row %lld is %lld, expected >= 0 or the "
                                "ignore_index %lld",
                                gt_kernel_op_name(c->op), (long long)i, (long long)t,
                                (long long)ignore);
        (*n_valid)++;
    }
    return GT_OK;
}

gt_status gt_cpu_cross_entropy_shard(const gt_kernel_call *c, gt_error *err)
{
    int64_t n_valid = 0;
    GT_TRY(gt_cpu_ce_shard_check(c, &n_valid, err));
    const gt_tensor *logits = c->in[0], *targets = c->in[1], *lse = c->in[2];
    gt_tensor *out = c->out[0];
    GT_TRY(gt_cpu_want_f32(c, out, "output", err));
    GT_TRY(gt_kernel_want_rank(c, out, "output", 0, err));
    /* (1/n_valid) * sum over valid rows whose target is local of (lse_i - x_i[t_i - start]);
     * 0/0 = NaN when every row is ignored, as cross_entropy. */
    int64_t rows = logits->shape[0], vl = logits->shape[1], start = c->e[0];
    const float *x = logits->data, *s = lse->data;
    double total = 0.0;
    for (int64_t i = 0; i < rows; i++) {
        int64_t t = gt_cpu_index_at(targets, i);
        if (t == c->i[0]) continue;
        int64_t local = t - start;
        if (local < 0 || local >= vl) continue;
        total += (double)s[i] - (double)x[i * vl + local];
    }
    *(float *)out->data = (float)(total / (double)n_valid);
    return GT_OK;
}

gt_status gt_cpu_cross_entropy_shard_backward(const gt_kernel_call *c, gt_error *err)
{
    int64_t n_valid = 0;
    GT_TRY(gt_cpu_ce_shard_check(c, &n_valid, err));
    const gt_tensor *logits = c->in[0], *targets = c->in[1], *lse = c->in[2], *dloss = c->in[3];
    gt_tensor *dx = c->out[0];
    GT_TRY(gt_cpu_ce_grad_check(c, logits, dloss, dx, err));
    /* dlogits_ij = dloss / n_valid * (exp(x_ij - lse_i) - [j == t_i - start]); 0 on ignored
     * rows. The softmax comes from the global log-sum-exp, so it is evaluated in double from the
     * f32 inputs. */
    int64_t rows = logits->shape[0], vl = logits->shape[1], start = c->e[0];
    double coef = n_valid > 0 ? (double)*(const float *)dloss->data / (double)n_valid : 0.0;
    const float *s = lse->data;
    for (int64_t i = 0; i < rows; i++) {
        int64_t t = gt_cpu_index_at(targets, i);
        const float *x = (const float *)logits->data + i * vl;
        float *g = (float *)dx->data + i * vl;
        if (t == c->i[0] || n_valid == 0) {
            if (vl > 0) memset(g, 0, (size_t)vl * sizeof *g);
            continue;
        }
        double li = s[i];
        for (int64_t j = 0; j < vl; j++)
            g[j] = (float)(coef * exp((double)x[j] - li));
        int64_t local = t - start;
        if (local >= 0 && local < vl) g[local] = (float)(coef * (exp((double)x[local] - li) - 1.0));
    }
    return GT_OK;
}
