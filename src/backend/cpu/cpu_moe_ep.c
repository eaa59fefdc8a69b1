/* cpu_moe_ep.c — CPU kernels of expert parallel's row moves (gt_ops.def gives the semantics):
 * moe_block_offsets, moe_pack, moe_unpack. Integer work and row copies of any dtype: exact.
 *
 * moe_pack checks every rank pair of the table, not only its own rows: the table is the same
 * on every rank (all-gathered), so an overflow fails every rank at the same node, before the
 * all_to_all that would carry the rows — no rank is left waiting in a collective. */
#include "cpu_internal.h"

#include <string.h>

static gt_status want_i32_rank(const gt_kernel_call *c, const gt_tensor *t, const char *what,
                               int ndim, gt_error *err)
{
    GT_TRY(gt_kernel_want_rank(c, t, what, ndim, err));
    if (t->dtype == GT_I32) return GT_OK;
    return gt_error_set(err, GT_ERR_SHAPE, "%s: %s is %s, expected i32", gt_kernel_op_name(c->op),
                        what, gt_dtype_name(t->dtype));
}

gt_status gt_cpu_moe_block_offsets(const gt_kernel_call *c, gt_error *err)
{
    GT_TRY(gt_kernel_want_attrs(c, 1, 0, 0, err));
    const gt_tensor *off = c->in[0];
    gt_tensor *out = c->out[0];
    GT_TRY(want_i32_rank(c, off, "offsets", 1, err));
    GT_TRY(want_i32_rank(c, out, "output", 2, err));
    int64_t n = c->i[0], e1 = out->shape[1];
    if (n < 1 || out->shape[0] != n || off->shape[0] != n * (e1 - 1) + 1)
        return gt_error_set(err, GT_ERR_SHAPE,
                            "moe_block_offsets: offsets of %lld entries, output [%lld, %lld], "
                            "%lld blocks",
                            (long long)off->shape[0], (long long)out->shape[0], (long long)e1,
                            (long long)n);
    const int32_t *o = off->data;
    int32_t *y = out->data;
    for (int64_t b = 0; b < n; b++)
        for (int64_t l = 0; l < e1; l++)
            y[b * e1 + l] = o[b * (e1 - 1) + l] - o[b * (e1 - 1)];
    return GT_OK;
}

/* The table's shape, the rank's first source row of each block (starts[n]) and each count, after
 * checking the rank's own counts fit `rows` rows of its tokens. */
static gt_status table_rows(const gt_kernel_call *c, const gt_tensor *table, int64_t n,
                            int64_t rank, int64_t rows, int64_t *starts, int64_t *counts,
                            gt_error *err)
{
    GT_TRY(want_i32_rank(c, table, "table", 2, err));
    if (table->shape[0] != n * n || table->shape[1] < 1 || rank < 0 || rank >= n)
        return gt_error_set(err, GT_ERR_SHAPE, "%s: table has %lld rows for %lld ranks (rank %lld)",
                            gt_kernel_op_name(c->op), (long long)table->shape[0], (long long)n,
                            (long long)rank);
    const int32_t *t = table->data;
    int64_t e1 = table->shape[1], run = 0;
    for (int64_t b = 0; b < n; b++) {
        int64_t cnt = t[(rank * n + b) * e1 + e1 - 1];
        if (cnt < 0 || run + cnt > rows)
            return gt_error_set(err, GT_ERR_INVALID,
                                "%s: rank %lld sends %lld rows to rank %lld after %lld, more than "
                                "its %lld",
                                gt_kernel_op_name(c->op), (long long)rank, (long long)cnt,
                                (long long)b, (long long)run, (long long)rows);
        starts[b] = run;
        counts[b] = cnt;
        run += cnt;
    }
    return GT_OK;
}

gt_status gt_kernel_moe_capacity_error(int64_t from, int64_t most, int64_t to, int64_t cap,
                                       int64_t worst, gt_error *err)
{
    double need = worst > 0 ? (double)most / (double)worst : 1.0;
    return gt_error_set(err, GT_ERR_INVALID,
                        "expert-parallel capacity overflow: rank %lld sends %lld rows to rank "
                        "%lld, capacity %lld rows per rank pair (worst case %lld); set "
                        "parallelism.expert_parallel_capacity_factor to at least %.3f (or 0: "
                        "the worst case)",
                        (long long)from, (long long)most, (long long)to, (long long)cap,
                        (long long)worst, need + 0.0005);
}

gt_status gt_cpu_moe_pack(const gt_kernel_call *c, gt_error *err)
{
    GT_TRY(gt_kernel_want_attrs(c, 1, 0, 3, err));
    const gt_tensor *x = c->in[0], *table = c->in[1];
    gt_tensor *out = c->out[0];
    GT_TRY(gt_kernel_want_rank(c, x, "x", 2, err));
    GT_TRY(gt_kernel_want_rank(c, out, "output", 2, err));
    GT_TRY(gt_kernel_want_same_dtype(c, x, "x", out, "output", err));
    int64_t n = c->i[0], cap = c->e[0], worst = c->e[1], rank = c->e[2];
    if (n < 1 || n > 4096 || cap < 0 || out->shape[0] != n * cap || out->shape[1] != x->shape[1])
        return gt_error_set(
            err, GT_ERR_SHAPE, "moe_pack: output [%lld, %lld] for %lld blocks of %lld",
            (long long)out->shape[0], (long long)out->shape[1], (long long)n, (long long)cap);
    int64_t starts[4096], counts[4096];
    GT_TRY(table_rows(c, table, n, rank, x->shape[0], starts, counts, err));
    /* every pair, on every rank alike: the largest count decides */
    const int32_t *t = table->data;
    int64_t e1 = table->shape[1], most = 0, from = 0, to = 0;
    for (int64_t p = 0; p < n * n; p++)
        if (t[p * e1 + e1 - 1] > most) {
            most = t[p * e1 + e1 - 1];
            from = p / n;
            to = p % n;
        }
    if (most > cap) return gt_kernel_moe_capacity_error(from, most, to, cap, worst, err);
    size_t row = (size_t)x->shape[1] * gt_dtype_size(x->dtype);
    const char *src = x->data;
    char *dst = out->data;
    for (int64_t b = 0; b < n; b++) {
        memcpy(dst + (size_t)(b * cap) * row, src + (size_t)starts[b] * row,
               (size_t)counts[b] * row);
        memset(dst + (size_t)(b * cap + counts[b]) * row, 0, (size_t)(cap - counts[b]) * row);
    }
    return GT_OK;
}

gt_status gt_cpu_moe_unpack(const gt_kernel_call *c, gt_error *err)
{
    GT_TRY(gt_kernel_want_attrs(c, 1, 0, 2, err));
    const gt_tensor *y = c->in[0], *table = c->in[1];
    gt_tensor *out = c->out[0];
    GT_TRY(gt_kernel_want_rank(c, y, "y", 2, err));
    GT_TRY(gt_kernel_want_rank(c, out, "output", 2, err));
    GT_TRY(gt_kernel_want_same_dtype(c, y, "y", out, "output", err));
    int64_t n = c->i[0], rows = c->e[0], rank = c->e[1];
    if (n < 1 || n > 4096 || y->shape[0] % n != 0 || out->shape[0] != rows ||
        out->shape[1] != y->shape[1])
        return gt_error_set(err, GT_ERR_SHAPE,
                            "moe_unpack: y has %lld rows, output %lld, %lld blocks",
                            (long long)y->shape[0], (long long)out->shape[0], (long long)n);
    int64_t starts[4096], counts[4096], cap = y->shape[0] / n;
    GT_TRY(table_rows(c, table, n, rank, rows, starts, counts, err));
    size_t row = (size_t)y->shape[1] * gt_dtype_size(y->dtype);
    const char *src = y->data;
    char *dst = out->data;
    int64_t covered = 0;
    for (int64_t b = 0; b < n; b++) {
        if (counts[b] > cap)
            return gt_error_set(err, GT_ERR_INVALID,
                                "moe_unpack: %lld rows from rank %lld, capacity %lld",
                                (long long)counts[b], (long long)b, (long long)cap);
        memcpy(dst + (size_t)starts[b] * row, src + (size_t)(b * cap) * row,
               (size_t)counts[b] * row);
        covered = starts[b] + counts[b];
    }
    memset(dst + (size_t)covered * row, 0, (size_t)(rows - covered) * row);
    return GT_OK;
}
