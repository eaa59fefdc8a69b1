/* cpu_moe.c — CPU kernels of DeepSeek-V3's mixture-of-experts ops (gt_ops.def gives the
 * semantics): sign, moe_topk, gather_last, gather_last_backward, moe_sort, moe_count,
 * grouped_matmul, grouped_matmul_dw.
 *
 * Numerics contract (every kernel: deterministic, no atomics, one thread, the same bits run to
 * run; float kernels see f32 only, the dispatcher widens bf16/f16 around them):
 *   sign, gather_last(_backward), moe_sort, moe_count, moe_topk: exact (copies, compares, integer
 *     counts; moe_count's f32 counts are exact below 2^24 rows per expert).
 *   moe_topk compares as torch.topk orders: NaN above every number; equal scores go to the lower
 *     expert (group) index. A group's score is its best plus its second best score, one f32 add.
 *   grouped_matmul: out[r, o] = fmaf chain over i = 0 .. Din-1 ascending, from 0:
 *       acc = fmaf(x[r, i], W_e[i, o], acc)   with W_e = w[e]^T (trans_b) or w[e]
 *     so a row's bits depend on that row of x and on w[e] only — not on R, the group sizes or the
 *     offsets (M-invariance). Rows outside [offsets[0], offsets[E]) are zero.
 *   grouped_matmul_dw: dw[e, o, i] = fmaf chain over the rows r of group e ascending, from 0:
 *       acc = fmaf(dy[r, o], x[r, i], acc)
 *     zeros for an empty group. */
#include "cpu_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- sign */

static GT_CPU_ELEMENT_LOOP void sign_n(const float *x, float *y, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        y[i] = v > 0.0f ? 1.0f : v < 0.0f ? -1.0f : v == 0.0f ? 0.0f : v; /* NaN stays */
    }
}

gt_status gt_cpu_sign(const gt_kernel_call *c, gt_error *err)
{
    GT_TRY(gt_cpu_want_f32(c, c->in[0], "x", err));
    GT_TRY(gt_cpu_want_f32(c, c->out[0], "output", err));
    GT_TRY(gt_kernel_want_same_shape(c, c->in[0], "x", c->out[0], "output", err));
    sign_n(c->in[0]->data, c->out[0]->data, gt_tensor_numel(c->in[0]));
    return GT_OK;
}

/* ---------------------------------------------------------------- shared checks */

static gt_status want_i32(const gt_kernel_call *c, const gt_tensor *t, const char *what, int ndim,
                          gt_error *err)
{
    GT_TRY(gt_kernel_want_rank(c, t, what, ndim, err));
    if (t->dtype == GT_I32) return GT_OK;
    return gt_error_set(err, GT_ERR_SHAPE, "%s: %s is %s, expected i32", gt_kernel_op_name(c->op),
                        what, gt_dtype_name(t->dtype));
}

/* Every id of idx (numel n) in [0, e). */
static gt_status want_ids(const gt_kernel_call *c, const int32_t *idx, int64_t n, int64_t e,
                          gt_error *err)
{
    for (int64_t p = 0; p < n; p++)
        if (idx[p] < 0 || idx[p] >= e)
            return gt_error_set(err, GT_ERR_INVALID,
                                "%s: expert id %d at position %lld is outside [0, %lld)",
                                gt_kernel_op_name(c->op), (int)idx[p], (long long)p, (long long)e);
    return GT_OK;
}

/* ---------------------------------------------------------------- moe_topk */

/* a ranks above b (torch.topk's order: NaN above every number); ties are the caller's. */
static bool above(float a, float b)
{
    if (isnan(a)) return !isnan(b);
    return !isnan(b) && a > b;
}

/* Index of the best of v[0..n) not yet taken (taken may be NULL): the lowest index among equals. */
static int64_t best_of(const float *v, const uint8_t *taken, int64_t n)
{
    int64_t best = -1;
    for (int64_t j = 0; j < n; j++)
        if (!(taken && taken[j]) && (best < 0 || above(v[j], v[best]))) best = j;
    return best;
}

gt_status gt_cpu_moe_topk(const gt_kernel_call *c, gt_error *err)
{
    GT_TRY(gt_kernel_want_attrs(c, 3, 0, 0, err));
    const gt_tensor *s = c->in[0];
    gt_tensor *out = c->out[0];
    GT_TRY(gt_cpu_want_f32(c, s, "scores", err));
    GT_TRY(gt_kernel_want_rank(c, s, "scores", 2, err));
    GT_TRY(want_i32(c, out, "output", 2, err));
    int64_t t = s->shape[0], e = s->shape[1], k = c->i[0], groups = c->i[1], lim = c->i[2];
    if (groups <= 1) groups = 1, lim = 1;
    if (k < 1 || k > e || out->shape[0] != t || out->shape[1] != k || e % groups != 0 || lim < 1 ||
        lim > groups || k > lim * (e / groups))
        return gt_error_set(err, GT_ERR_SHAPE,
                            "moe_topk: k %lld, n_groups %lld, n_limited %lld do not fit %lld "
                            "experts (output [%lld, %lld])",
                            (long long)k, (long long)c->i[1], (long long)c->i[2], (long long)e,
                            (long long)out->shape[0], (long long)out->shape[1]);
    int64_t gsize = e / groups;
    float *row = malloc((size_t)(e + groups) * sizeof *row + 1);
    uint8_t *taken = malloc((size_t)(e + groups) + 1);
    if (!row || !taken) {
        free(row);
        free(taken);
        return gt_error_set(err, GT_ERR_NOMEM, "moe_topk: out of memory for %lld experts",
                            (long long)e);
    }
    float *gscore = row + e;
    uint8_t *gtaken = taken + e;
    const float *sc = s->data;
    int32_t *ids = out->data;
    for (int64_t ti = 0; ti < t; ti++) {
        const float *x = sc + ti * e;
        memcpy(row, x, (size_t)e * sizeof *row);
        if (groups > 1) {
            /* group score: best + second best (torch: topk(2).sum, the larger first) */
            for (int64_t gi = 0; gi < groups; gi++) {
                memset(taken, 0, (size_t)gsize);
                int64_t b1 = best_of(x + gi * gsize, taken, gsize);
                float v = x[gi * gsize + b1];
                if (gsize > 1) {
                    taken[b1] = 1;
                    v = v + x[gi * gsize + best_of(x + gi * gsize, taken, gsize)];
                }
                gscore[gi] = v;
            }
            memset(gtaken, 0, (size_t)groups);
            for (int64_t m = 0; m < lim; m++)
                gtaken[best_of(gscore, gtaken, groups)] = 1;
            for (int64_t gi = 0; gi < groups; gi++)
                if (!gtaken[gi])
                    for (int64_t j = 0; j < gsize; j++)
                        row[gi * gsize + j] = -INFINITY;
        }
        memset(taken, 0, (size_t)e);
        for (int64_t m = 0; m < k; m++) {
            int64_t b = best_of(row, taken, e);
            taken[b] = 1;
            ids[ti * k + m] = (int32_t)b;
        }
    }
    free(row);
    free(taken);
    return GT_OK;
}

/* ---------------------------------------------------------------- gather_last */

/* The operands of gather_last and its backward: dense f32 [T, E], idx i32 [T, K] of ids below E,
 * flat f32 of idx's shape; sets t, k, e. */
static gt_status want_gather(const gt_kernel_call *c, const char *op, const gt_tensor *dense,
                             const char *dense_name, const gt_tensor *idx, const gt_tensor *flat,
                             const char *flat_name, int64_t *t, int64_t *k, int64_t *e,
                             gt_error *err)
{
    GT_TRY(gt_cpu_want_f32(c, dense, dense_name, err));
    GT_TRY(gt_cpu_want_f32(c, flat, flat_name, err));
    GT_TRY(gt_kernel_want_rank(c, dense, dense_name, 2, err));
    GT_TRY(want_i32(c, idx, "idx", 2, err));
    GT_TRY(gt_kernel_want_same_shape(c, idx, "idx", flat, flat_name, err));
    *t = idx->shape[0], *k = idx->shape[1], *e = dense->shape[1];
    if (dense->shape[0] != *t)
        return gt_error_set(err, GT_ERR_SHAPE, "%s: %s has %lld rows, idx %lld", op, dense_name,
                            (long long)dense->shape[0], (long long)*t);
    return want_ids(c, idx->data, *t * *k, *e, err);
}

gt_status gt_cpu_gather_last(const gt_kernel_call *c, gt_error *err)
{
    const gt_tensor *x = c->in[0], *idx = c->in[1];
    gt_tensor *out = c->out[0];
    int64_t t, k, e;
    GT_TRY(want_gather(c, "gather_last", x, "x", idx, out, "output", &t, &k, &e, err));
    const int32_t *id = idx->data;
    const float *xs = x->data;
    float *y = out->data;
    for (int64_t p = 0; p < t * k; p++)
        y[p] = xs[(p / k) * e + id[p]];
    return GT_OK;
}

gt_status gt_cpu_gather_last_backward(const gt_kernel_call *c, gt_error *err)
{
    const gt_tensor *idx = c->in[0], *dy = c->in[1];
    gt_tensor *dx = c->out[0];
    int64_t t, k, e;
    GT_TRY(want_gather(c, "gather_last_backward", dx, "dx", idx, dy, "dy", &t, &k, &e, err));
    const int32_t *id = idx->data;
    const float *g = dy->data;
    float *d = dx->data;
    if (t * e > 0) memset(d, 0, (size_t)(t * e) * sizeof *d);
    for (int64_t p = 0; p < t * k; p++)
        d[(p / k) * e + id[p]] = g[p];
    return GT_OK;
}

/* ---------------------------------------------------------------- moe_sort, moe_count */

/* counts[e] of the flat ids (n of them), after checking every id. */
static gt_status count_ids(const gt_kernel_call *c, const int32_t *id, int64_t n, int64_t e,
                           int64_t *counts, gt_error *err)
{
    GT_TRY(want_ids(c, id, n, e, err));
    memset(counts, 0, (size_t)e * sizeof *counts);
    for (int64_t p = 0; p < n; p++)
        counts[id[p]]++;
    return GT_OK;
}

gt_status gt_cpu_moe_sort(const gt_kernel_call *c, gt_error *err)
{
    GT_TRY(gt_kernel_want_attrs(c, 1, 0, 0, err));
    const gt_tensor *idx = c->in[0];
    GT_TRY(want_i32(c, idx, "idx", 2, err));
    int64_t t = idx->shape[0], k = idx->shape[1], n = t * k, e = c->i[0];
    for (int j = 0; j < 3; j++) {
        GT_TRY(want_i32(c, c->out[j], j == 0 ? "order" : j == 1 ? "token" : "offsets", 1, err));
        int64_t want = j < 2 ? n : e + 1;
        if (c->out[j]->shape[0] != want)
            return gt_error_set(err, GT_ERR_SHAPE,
                                "moe_sort: output %d has %lld rows, expected %lld", j,
                                (long long)c->out[j]->shape[0], (long long)want);
    }
    if (e < 1 || n > INT32_MAX)
        return gt_error_set(err, GT_ERR_SHAPE, "moe_sort: %lld experts, %lld rows (i32 offsets)",
                            (long long)e, (long long)n);
    int64_t *pos = malloc((size_t)e * sizeof *pos);
    if (!pos) return gt_error_set(err, GT_ERR_NOMEM, "moe_sort: out of memory");
    const int32_t *id = idx->data;
    gt_status st = count_ids(c, id, n, e, pos, err);
    if (st != GT_OK) {
        free(pos);
        return st;
    }
    /* counting sort: pos[e] = first row of expert e, then each flat index in order (stable) */
    int32_t *order = c->out[0]->data, *token = c->out[1]->data, *off = c->out[2]->data;
    int64_t run = 0;
    for (int64_t x = 0; x < e; x++) {
        off[x] = (int32_t)run;
        int64_t cnt = pos[x];
        pos[x] = run;
        run += cnt;
    }
    off[e] = (int32_t)run;
    for (int64_t p = 0; p < n; p++) {
        int64_t r = pos[id[p]]++;
        order[r] = (int32_t)p;
        token[r] = (int32_t)(p / k);
    }
    free(pos);
    return GT_OK;
}

gt_status gt_cpu_moe_count(const gt_kernel_call *c, gt_error *err)
{
    GT_TRY(gt_kernel_want_attrs(c, 1, 0, 0, err));
    const gt_tensor *idx = c->in[0];
    gt_tensor *out = c->out[0];
    GT_TRY(want_i32(c, idx, "idx", 2, err));
    GT_TRY(gt_cpu_want_f32(c, out, "output", err));
    GT_TRY(gt_kernel_want_rank(c, out, "output", 1, err));
    int64_t e = c->i[0];
    if (e < 1 || out->shape[0] != e)
        return gt_error_set(err, GT_ERR_SHAPE, "moe_count: output has %lld entries, n_experts %lld",
                            (long long)out->shape[0], (long long)e);
    int64_t *cnt = malloc((size_t)e * sizeof *cnt);
    if (!cnt) return gt_error_set(err, GT_ERR_NOMEM, "moe_count: out of memory");
    gt_status st = count_ids(c, idx->data, gt_tensor_numel(idx), e, cnt, err);
    float *y = out->data;
    for (int64_t x = 0; st == GT_OK && x < e; x++)
        y[x] = (float)cnt[x];
    free(cnt);
    return st;
}

/* ---------------------------------------------------------------- grouped matmul */

/* offsets (i32 [E + 1]) nondecreasing within [0, rows]. */
static gt_status want_offsets(const gt_kernel_call *c, const gt_tensor *off, int64_t e,
                              int64_t rows, gt_error *err)
{
    GT_TRY(want_i32(c, off, "offsets", 1, err));
    if (off->shape[0] != e + 1)
        return gt_error_set(err, GT_ERR_SHAPE, "%s: offsets has %lld entries, expected %lld",
                            gt_kernel_op_name(c->op), (long long)off->shape[0], (long long)e + 1);
    const int32_t *o = off->data;
    for (int64_t x = 0; x <= e; x++)
        if (o[x] < 0 || o[x] > rows || (x > 0 && o[x] < o[x - 1]))
            return gt_error_set(err, GT_ERR_INVALID,
                                "%s: offsets[%lld] = %d is not in [offsets[%lld], %lld]",
                                gt_kernel_op_name(c->op), (long long)x, (int)o[x],
                                (long long)(x > 0 ? x - 1 : 0), (long long)rows);
    return GT_OK;
}

/* y[o] = fmaf chain over i ascending of x[i] * wt[i * dout + o] (wt: [Din, Dout]). Vectorized
 * over o: each o's chain is the same sequence at any vector width. */
static GT_CPU_ELEMENT_LOOP void row_times(const float *x, const float *wt, float *y, int64_t din,
                                          int64_t dout)
{
    for (int64_t o = 0; o < dout; o++)
        y[o] = 0.0f;
    for (int64_t i = 0; i < din; i++) {
        float xi = x[i];
        const float *wr = wt + i * dout;
        for (int64_t o = 0; o < dout; o++)
            y[o] = fmaf(xi, wr[o], y[o]);
    }
}

gt_status gt_cpu_grouped_matmul(const gt_kernel_call *c, gt_error *err)
{
    GT_TRY(gt_kernel_want_attrs(c, 1, 0, 0, err));
    const gt_tensor *x = c->in[0], *w = c->in[1], *off = c->in[2];
    gt_tensor *out = c->out[0];
    GT_TRY(gt_cpu_want_f32(c, x, "x", err));
    GT_TRY(gt_cpu_want_f32(c, w, "w", err));
    GT_TRY(gt_cpu_want_f32(c, out, "output", err));
    GT_TRY(gt_kernel_want_rank(c, x, "x", 2, err));
    GT_TRY(gt_kernel_want_rank(c, w, "w", 3, err));
    GT_TRY(gt_kernel_want_rank(c, out, "output", 2, err));
    bool tb = c->i[0] != 0;
    int64_t r = x->shape[0], din = x->shape[1], e = w->shape[0];
    int64_t dout = tb ? w->shape[1] : w->shape[2];
    if ((tb ? w->shape[2] : w->shape[1]) != din || out->shape[0] != r || out->shape[1] != dout)
        return gt_error_set(err, GT_ERR_SHAPE,
                            "grouped_matmul: x [%lld, %lld], w [%lld, %lld, %lld] (trans_b %d), "
                            "output [%lld, %lld] do not fit",
                            (long long)r, (long long)din, (long long)e, (long long)w->shape[1],
                            (long long)w->shape[2], tb ? 1 : 0, (long long)out->shape[0],
                            (long long)out->shape[1]);
    GT_TRY(want_offsets(c, off, e, r, err));
    const int32_t *o = off->data;
    float *y = out->data;
    if (r * dout > 0) memset(y, 0, (size_t)(r * dout) * sizeof *y);
    float *wt = tb ? malloc((size_t)(din * dout) * sizeof *wt + 1) : NULL;
    if (tb && !wt) return gt_error_set(err, GT_ERR_NOMEM, "grouped_matmul: out of memory");
    for (int64_t g = 0; g < e; g++) {
        if (o[g + 1] == o[g]) continue;
        const float *we = (const float *)w->data + g * din * dout;
        if (tb) { /* w[e] is [Dout, Din]: its transpose, so every row runs the one loop */
            for (int64_t a = 0; a < dout; a++)
                for (int64_t i = 0; i < din; i++)
                    wt[i * dout + a] = we[a * din + i];
            we = wt;
        }
        for (int64_t row = o[g]; row < o[g + 1]; row++)
            row_times((const float *)x->data + row * din, we, y + row * dout, din, dout);
    }
    free(wt);
    return GT_OK;
}

/* acc[o * din + i] = fmaf(dy[o], x[i], acc[...]) for every (o, i): one row's update. */
static GT_CPU_ELEMENT_LOOP void outer_add(const float *dy, const float *x, float *acc, int64_t dout,
                                          int64_t din)
{
    for (int64_t a = 0; a < dout; a++) {
        float d = dy[a];
        float *ar = acc + a * din;
        for (int64_t i = 0; i < din; i++)
            ar[i] = fmaf(d, x[i], ar[i]);
    }
}

gt_status gt_cpu_grouped_matmul_dw(const gt_kernel_call *c, gt_error *err)
{
    const gt_tensor *x = c->in[0], *dy = c->in[1], *off = c->in[2];
    gt_tensor *dw = c->out[0];
    GT_TRY(gt_cpu_want_f32(c, x, "x", err));
    GT_TRY(gt_cpu_want_f32(c, dy, "dy", err));
    GT_TRY(gt_cpu_want_f32(c, dw, "dw", err));
    GT_TRY(gt_kernel_want_rank(c, x, "x", 2, err));
    GT_TRY(gt_kernel_want_rank(c, dy, "dy", 2, err));
    GT_TRY(gt_kernel_want_rank(c, dw, "dw", 3, err));
    int64_t r = x->shape[0], din = x->shape[1], dout = dy->shape[1], e = dw->shape[0];
    if (dy->shape[0] != r || dw->shape[1] != dout || dw->shape[2] != din)
        return gt_error_set(err, GT_ERR_SHAPE,
                            "grouped_matmul_dw: x [%lld, %lld], dy [%lld, %lld], dw [%lld, %lld, "
                            "%lld] do not fit",
                            (long long)r, (long long)din, (long long)dy->shape[0], (long long)dout,
                            (long long)e, (long long)dw->shape[1], (long long)dw->shape[2]);
    GT_TRY(want_offsets(c, off, e, r, err));
    const int32_t *o = off->data;
    float *d = dw->data;
    if (e * dout * din > 0) memset(d, 0, (size_t)(e * dout * din) * sizeof *d);
    for (int64_t g = 0; g < e; g++)
        for (int64_t row = o[g]; row < o[g + 1]; row++)
            outer_add((const float *)dy->data + row * dout, (const float *)x->data + row * din,
                      d + g * dout * din, dout, din);
    return GT_OK;
}
