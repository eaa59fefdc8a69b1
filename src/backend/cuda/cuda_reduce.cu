/* cuda_reduce.cu — sum, mean, max, sum_squares, max_backward, sum_to and softmax (+backward);
 * cross_entropy is in cuda_loss.cu.
 *
 * Reductions split x's dims into kept dims (the output's index space) and reduced dims, whose
 * elements are visited in row-major order. Short groups get one thread that sums in order; kept
 * dims innermost (sum over leading dims) get a column split, thread per (chunk of rows, column);
 * otherwise a group gets one block per split — thread t sums the terms t, t + T, ... of the
 * split's contiguous chunk, then a fixed shared-memory tree — and a long reduction over few groups
 * (a full sum: the gradient norm's sum of g*g) is cut into enough splits to fill the GPU, with a
 * second pass adding the per-split double partials in a fixed order. Path and split sizes depend
 * only on the shape, so results are identical run to run and GPU to GPU. As on the CPU, sums,
 * means and the softmax / log-sum-exp denominators accumulate in double (long rows: a vocabulary,
 * a batch of tokens); exp is f32. */
#include "cuda_internal.h"

#include <string.h>

#define GT_RED_SMALL 32 /* groups of at most this many terms: one thread per group */

/* ---------------------------------------------------------------- sum / mean / max / sum_to */

/* Shape-only tuning of the split paths (never the SM count: the order of a sum must be the same
 * on every GPU). A row split gives each block at least GT_RED_CHUNK_MIN terms and aims at about
 * GT_RED_TARGET blocks in all (a few per SM on any current GPU); a column split gives each thread
 * at least GT_RED_COL_MIN rows and at most GT_RED_COL_MAX chunks per column. */
#define GT_RED_CHUNK_MIN 8192
#define GT_RED_TARGET 1024
#define GT_RED_COL_MIN 64
#define GT_RED_COL_MAX 1024

typedef struct {
    gt_cuda_index kept; /* shape: kept dims; stride[0]: x strides */
    gt_cuda_index red;  /* shape: reduced dims; stride[0]: x strides */
    int64_t groups, count;
} gt_cuda_reduce;

/* Offset of row-major index i of ix (operand 0); merged contiguous dims make 1-d the usual case,
 * which needs no division. */
__device__ __forceinline__ int64_t gt_red_off(const gt_cuda_index &ix, int64_t i)
{
    if (ix.ndim == 0) return 0;
    if (ix.ndim == 1) return i * ix.stride[0][0];
    int64_t off[1];
    gt_index_offsets(ix, i, 1, off);
    return off[0];
}

/* kind 0 = sum (divided by `divisor`), 1 = max, 2 = sum of squares: the term v becomes v * v
 * rounded to f32 (as mul's kernel rounds it) before the double accumulation, and the rest is
 * kind 0's arithmetic, so sum_squares(x) is bitwise sum(mul(x, x)). The kind is uniform per
 * launch: the branch costs nothing next to the load. */
#define GT_RED_SUM 0
#define GT_RED_MAX 1
#define GT_RED_SUMSQ 2
__device__ __forceinline__ float gt_red_term(int kind, float v)
{
    return kind == GT_RED_SUMSQ ? __fmul_rn(v, v) : v;
}

__device__ __forceinline__ float gt_reduce_group_serial(const gt_cuda_reduce &r, int kind,
                                                        const void *x, int dx, int64_t base,
                                                        double divisor)
{
    double acc = 0.0;
    float m = -INFINITY;
    for (int64_t k = 0; k < r.count; k++) {
        float v = gt_red_term(kind, gt_ld(x, dx, base + gt_red_off(r.red, k)));
        if (kind != GT_RED_MAX)
            acc += v;
        else
            m = gt_nanmax(v, m);
    }
    return kind != GT_RED_MAX ? (float)(acc / divisor) : m;
}

__global__ void gt_k_reduce_serial(gt_cuda_reduce r, int kind, const void *x, int dx, void *out,
                                   int dout, double divisor)
{
    GT_GRID_STRIDE(g, r.groups)
    {
        gt_st(out, dout, g, gt_reduce_group_serial(r, kind, x, dx, gt_red_off(r.kept, g), divisor));
    }
}

/* Row split: block b = (group g, split p) reduces terms [p * chunk, min((p + 1) * chunk, count))
 * of group g — thread t the terms start + t, start + t + T, ... in order, then the fixed tree.
 * With splits == 1 it writes out[g] (divided by `divisor`); otherwise the double partial
 * part[g * splits + p] (a max is a float, held exactly in the double). */
__global__ void __launch_bounds__(GT_CUDA_THREADS)
    gt_k_reduce_block(gt_cuda_reduce r, int kind, const void *x, int dx, int64_t splits,
                      int64_t chunk, double *part, void *out, int dout, double divisor)
{
    __shared__ double shd[GT_CUDA_THREADS];
    __shared__ float shf[GT_CUDA_THREADS];
    for (int64_t b = blockIdx.x; b < r.groups * splits; b += gridDim.x) {
        int64_t g = b / splits, p = b - g * splits;
        int64_t base = gt_red_off(r.kept, g), k0 = p * chunk;
        int64_t k1 = k0 + chunk < r.count ? k0 + chunk : r.count;
        double acc = 0.0;
        float m = -INFINITY;
        for (int64_t k = k0 + threadIdx.x; k < k1; k += blockDim.x) {
            float v = gt_red_term(kind, gt_ld(x, dx, base + gt_red_off(r.red, k)));
            if (kind != GT_RED_MAX)
                acc += v;
            else
                m = gt_nanmax(v, m);
        }
        double t = kind != GT_RED_MAX ? gt_block_sum(acc, shd) : (double)gt_block_max(m, shf);
        if (threadIdx.x == 0) {
            if (splits > 1)
                part[b] = t;
            else
                gt_st(out, dout, g, kind != GT_RED_MAX ? (float)(t / divisor) : (float)t);
        }
    }
}

/* The row split over a contiguous run of terms (reduced dims one run of stride 1, x 16-byte
 * aligned): the same blocks, chunks and output, with 16-byte loads of T — 4 (f32) or 8 (bf16 / f16)
 * terms, four vectors in flight per thread — and the few terms before the first aligned vector and
 * after the last one singly. Thread t takes vectors t, t + T, ... of its block's chunk (the terms
 * of a vector in index order, in double), then the same fixed tree: a fixed order given the shape.
 */
template <typename T>
__global__ void __launch_bounds__(GT_CUDA_THREADS)
    gt_k_reduce_vec(gt_cuda_reduce r, int kind, const void *x, int dx, int64_t splits,
                    int64_t chunk, double *part, void *out, int dout, double divisor)
{
    typedef gt_vec16<T> io;
    constexpr int V = io::n, U = 4, NT = GT_CUDA_THREADS;
    __shared__ double shd[GT_CUDA_THREADS];
    __shared__ float shf[GT_CUDA_THREADS];
    int tid = threadIdx.x;
    for (int64_t b = blockIdx.x; b < r.groups * splits; b += gridDim.x) {
        int64_t g = b / splits, p = b - g * splits, k0 = p * chunk;
        int64_t n = (k0 + chunk < r.count ? k0 + chunk : r.count) - k0;
        int64_t s0 = gt_red_off(r.kept, g) + k0; /* first term; the run has stride 1 */
        int64_t head = (V - s0 % V) % V;
        if (head > n) head = n;
        int64_t nvec = (n - head) / V, tail0 = head + nvec * V;
        double acc = 0.0;
        float m = -INFINITY;
        if (tid < head) {
            float v = gt_red_term(kind, gt_ld(x, dx, s0 + tid));
            acc += v;
            m = gt_nanmax(v, m);
        }
        int64_t k = tid;
        for (; k + (U - 1) * NT < nvec; k += U * NT) {
            typename io::raw raw[U];
#pragma unroll
            for (int u = 0; u < U; u++)
                raw[u] = io::ld(x, dx, s0 + head + (k + u * NT) * V);
#pragma unroll
            for (int u = 0; u < U; u++) {
                float f[V];
                io::to_f32(raw[u], f);
#pragma unroll
                for (int e = 0; e < V; e++) {
                    f[e] = gt_red_term(kind, f[e]);
                    acc += f[e];
                    m = gt_nanmax(f[e], m);
                }
            }
        }
        for (; k < nvec; k += NT) {
            float f[V];
            io::to_f32(io::ld(x, dx, s0 + head + k * V), f);
#pragma unroll
            for (int e = 0; e < V; e++) {
                f[e] = gt_red_term(kind, f[e]);
                acc += f[e];
                m = gt_nanmax(f[e], m);
            }
        }
        if (tail0 + tid < n) {
            float v = gt_red_term(kind, gt_ld(x, dx, s0 + tail0 + tid));
            acc += v;
            m = gt_nanmax(v, m);
        }
        double t = kind != GT_RED_MAX ? gt_block_sum(acc, shd) : (double)gt_block_max(m, shf);
        if (tid == 0) {
            if (splits > 1)
                part[b] = t;
            else
                gt_st(out, dout, g, kind != GT_RED_MAX ? (float)(t / divisor) : (float)t);
        }
    }
}

/* Second pass of the row split: one block per group adds (or maxes) its `splits` partials —
 * thread t the partials t, t + T, ... in order, then the fixed tree. */
__global__ void __launch_bounds__(GT_CUDA_THREADS)
    gt_k_reduce_finish(int64_t groups, int64_t splits, int kind, const double *part, void *out,
                       int dout, double divisor)
{
    __shared__ double shd[GT_CUDA_THREADS];
    __shared__ float shf[GT_CUDA_THREADS];
    for (int64_t g = blockIdx.x; g < groups; g += gridDim.x) {
        double acc = 0.0;
        float m = -INFINITY;
        for (int64_t p = threadIdx.x; p < splits; p += blockDim.x) {
            double v = part[g * splits + p];
            if (kind != GT_RED_MAX)
                acc += v;
            else
                m = gt_nanmax((float)v, m);
        }
        if (kind != GT_RED_MAX) {
            double t = gt_block_sum(acc, shd);
            if (threadIdx.x == 0) gt_st(out, dout, g, (float)(t / divisor));
        } else {
            float t = gt_block_max(m, shf);
            if (threadIdx.x == 0) gt_st(out, dout, g, t);
        }
    }
}

/* Column split, for kept dims that are x's contiguous innermost run (sum over leading dims, e.g.
 * [rows, D] -> [D]): thread (chunk c, group g) reduces terms [c * rows_per, (c + 1) * rows_per) of
 * group g in order; adjacent threads read adjacent groups, so loads coalesce (one block per group
 * would read a column at stride D). With chunks == 1 it writes out[g], else part[c * groups + g].
 */
__global__ void gt_k_reduce_cols(gt_cuda_reduce r, int kind, const void *x, int dx, int64_t chunks,
                                 int64_t rows_per, double *part, void *out, int dout,
                                 double divisor)
{
    GT_GRID_STRIDE(i, chunks * r.groups)
    {
        int64_t c = i / r.groups, g = i - c * r.groups, k0 = c * rows_per;
        int64_t k1 = k0 + rows_per < r.count ? k0 + rows_per : r.count;
        double acc = 0.0;
        float m = -INFINITY;
        for (int64_t k = k0; k < k1; k++) {
            float v = gt_red_term(kind, gt_ld(x, dx, g + gt_red_off(r.red, k)));
            if (kind != GT_RED_MAX)
                acc += v;
            else
                m = gt_nanmax(v, m);
        }
        double t = kind != GT_RED_MAX ? acc : (double)m;
        if (chunks > 1)
            part[i] = t;
        else
            gt_st(out, dout, g, kind != GT_RED_MAX ? (float)(t / divisor) : (float)t);
    }
}

/* Second pass of the column split: thread g adds (or maxes) part[c * groups + g], c in order. */
__global__ void gt_k_reduce_cols_finish(int64_t groups, int64_t chunks, int kind,
                                        const double *part, void *out, int dout, double divisor)
{
    GT_GRID_STRIDE(g, groups)
    {
        double acc = 0.0;
        float m = -INFINITY;
        for (int64_t c = 0; c < chunks; c++) {
            double v = part[c * groups + g];
            if (kind != GT_RED_MAX)
                acc += v;
            else
                m = gt_nanmax((float)v, m);
        }
        gt_st(out, dout, g, kind != GT_RED_MAX ? (float)(acc / divisor) : m);
    }
}

/* Appends dim (size n, x stride st) to ix, merging it into the previous dim when the two are one
 * contiguous run (prev stride == n * st): row-major order over the pair is then k * st. */
static void gt_cuda_index_push(gt_cuda_index *ix, int64_t n, int64_t st)
{
    int last = ix->ndim - 1;
    if (last >= 0 && ix->stride[0][last] == n * st) {
        ix->shape[last] *= n;
        ix->stride[0][last] = st;
        return;
    }
    ix->shape[ix->ndim] = n;
    ix->stride[0][ix->ndim] = st;
    ix->ndim++;
}

/* Splits x's dims by `reduced` into r; size-1 dims are dropped and contiguous runs merged (neither
 * changes the row-major order of groups or of terms). */
static void gt_cuda_reduce_plan(const gt_tensor *x, const bool *reduced, gt_cuda_reduce *r)
{
    memset(r, 0, sizeof *r);
    int64_t xstr[GT_MAX_DIMS];
    gt_kernel_contig_strides(x->ndim, x->shape, xstr);
    r->groups = 1;
    r->count = 1;
    for (int d = 0; d < x->ndim; d++) {
        if (reduced[d])
            r->count *= x->shape[d];
        else
            r->groups *= x->shape[d];
        if (x->shape[d] != 1)
            gt_cuda_index_push(reduced[d] ? &r->red : &r->kept, x->shape[d], xstr[d]);
    }
}

static int64_t gt_ceil_div(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
}

static unsigned gt_red_grid(int64_t blocks)
{
    return (unsigned)(blocks < 65536 ? blocks : 65536);
}

/* Picks a path from the shape alone:
 *  - count <= GT_RED_SMALL: one thread per group, serial;
 *  - kept dims contiguous innermost, >= 32 groups: column split (coalesced), chunks of rows;
 *  - else one block per (group, split); a long reduction over few groups is split so about
 *    GT_RED_TARGET blocks share it, and a second one-block-per-group pass adds the partials. */
static gt_status gt_cuda_reduce_run(gt_cuda_stream *s, const gt_kernel_call *c,
                                    const gt_cuda_reduce *r, int kind, const gt_tensor *x,
                                    gt_tensor *out, double divisor, gt_error *err)
{
    if (r->groups == 0) return GT_OK;
    if (r->count <= GT_RED_SMALL) {
        gt_k_reduce_serial<<<gt_cuda_blocks(r->groups), GT_CUDA_THREADS, 0, s->stream>>>(
            *r, kind, x->data, x->dtype, out->data, out->dtype, divisor);
        return gt_cuda_launched(c, err);
    }
    void *scr = NULL;
    bool cols = r->kept.ndim == 1 && r->kept.stride[0][0] == 1 && r->groups >= 32;
    if (cols) {
        int64_t rows_per = gt_ceil_div(r->count, GT_RED_COL_MAX);
        if (rows_per < GT_RED_COL_MIN) rows_per = GT_RED_COL_MIN;
        int64_t chunks = gt_ceil_div(r->count, rows_per);
        if (chunks > 1)
            GT_TRY(gt_cuda_scratch(s, c, (size_t)(chunks * r->groups) * sizeof(double), &scr, err));
        gt_k_reduce_cols<<<gt_cuda_blocks(chunks * r->groups), GT_CUDA_THREADS, 0, s->stream>>>(
            *r, kind, x->data, x->dtype, chunks, rows_per, (double *)scr, out->data, out->dtype,
            divisor);
        GT_TRY(gt_cuda_launched(c, err));
        if (chunks == 1) return GT_OK;
        gt_k_reduce_cols_finish<<<gt_cuda_blocks(r->groups), GT_CUDA_THREADS, 0, s->stream>>>(
            r->groups, chunks, kind, (const double *)scr, out->data, out->dtype, divisor);
        return gt_cuda_launched(c, err);
    }
    int64_t splits = 1;
    if (r->groups < GT_RED_TARGET) {
        splits = gt_ceil_div(r->count, GT_RED_CHUNK_MIN);
        int64_t want = gt_ceil_div(GT_RED_TARGET, r->groups);
        if (splits > want) splits = want;
    }
    int64_t chunk = gt_ceil_div(r->count, splits);
    splits = gt_ceil_div(r->count, chunk);
    if (splits > 1)
        GT_TRY(gt_cuda_scratch(s, c, (size_t)(r->groups * splits) * sizeof(double), &scr, err));
    /* a contiguous run (one reduced dim of stride 1) in a 16-byte aligned tensor: vector loads */
    bool vec = r->red.ndim == 1 && r->red.stride[0][0] == 1 && gt_aligned16(x->data);
    unsigned grid = gt_red_grid(r->groups * splits);
    double *part = (double *)scr;
    if (vec && x->dtype == GT_F32)
        gt_k_reduce_vec<float><<<grid, GT_CUDA_THREADS, 0, s->stream>>>(
            *r, kind, x->data, x->dtype, splits, chunk, part, out->data, out->dtype, divisor);
    else if (vec && x->dtype == GT_BF16)
        gt_k_reduce_vec<__nv_bfloat16><<<grid, GT_CUDA_THREADS, 0, s->stream>>>(
            *r, kind, x->data, x->dtype, splits, chunk, part, out->data, out->dtype, divisor);
    else if (vec && x->dtype == GT_F16)
        gt_k_reduce_vec<__half><<<grid, GT_CUDA_THREADS, 0, s->stream>>>(
            *r, kind, x->data, x->dtype, splits, chunk, part, out->data, out->dtype, divisor);
    else
        gt_k_reduce_block<<<grid, GT_CUDA_THREADS, 0, s->stream>>>(
            *r, kind, x->data, x->dtype, splits, chunk, part, out->data, out->dtype, divisor);
    GT_TRY(gt_cuda_launched(c, err));
    if (splits == 1) return GT_OK;
    gt_k_reduce_finish<<<gt_red_grid(r->groups), GT_CUDA_THREADS, 0, s->stream>>>(
        r->groups, splits, kind, (const double *)scr, out->data, out->dtype, divisor);
    return gt_cuda_launched(c, err);
}

/* Reads keepdim and dims, checks `red` (the reduced tensor) has the implied shape. */
static gt_status gt_cuda_reduce_layout(const gt_kernel_call *c, const gt_tensor *x,
                                       const gt_tensor *red, bool *reduced, gt_error *err)
{
    GT_TRY(gt_kernel_want_attrs(c, 1, 0, 0, err));
    bool keepdim = c->i[0] != 0;
    for (int d = 0; d < GT_MAX_DIMS; d++)
        reduced[d] = false;
    for (int k = 1; k < c->ni; k++) {
        int d;
        GT_TRY(gt_kernel_norm_dim(c, c->i[k], x->ndim, &d, err));
        if (reduced[d])
            return gt_error_set(err, GT_ERR_INVALID, "%s: dim %d listed twice",
                                gt_kernel_op_name(c->op), d);
        reduced[d] = true;
    }
    int64_t expect[GT_MAX_DIMS];
    int ne = 0;
    for (int d = 0; d < x->ndim; d++)
        if (!reduced[d] || keepdim) expect[ne++] = reduced[d] ? 1 : x->shape[d];
    bool ok = red->ndim == ne;
    for (int d = 0; ok && d < ne; d++)
        ok = red->shape[d] == expect[d];
    if (!ok) return gt_cuda_shape_error(c, "the reduced tensor's shape does not fit", err);
    return GT_OK;
}

static gt_status gt_cuda_sum_mean_max(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    const gt_tensor *x = c->in[0];
    gt_tensor *out = c->out[0];
    GT_TRY(gt_kernel_want_float(c, x, "input", err));
    GT_TRY(gt_kernel_want_float(c, out, "output", err));
    bool reduced[GT_MAX_DIMS];
    GT_TRY(gt_cuda_reduce_layout(c, x, out, reduced, err));
    gt_cuda_reduce r;
    gt_cuda_reduce_plan(x, reduced, &r);
    if (c->op == GT_OP_MAX && r.count == 0 && r.groups > 0)
        return gt_error_set(err, GT_ERR_INVALID, "max: reduces an empty dim (no maximum exists)");
    double divisor = c->op == GT_OP_MEAN ? (double)r.count : 1.0;
    int kind = c->op == GT_OP_MAX           ? GT_RED_MAX
               : c->op == GT_OP_SUM_SQUARES ? GT_RED_SUMSQ
                                            : GT_RED_SUM;
    return gt_cuda_reduce_run(s, c, &r, kind, x, out, divisor, err);
}

gt_status gt_cuda_sum(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    return gt_cuda_sum_mean_max(s, c, err);
}
gt_status gt_cuda_mean(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    return gt_cuda_sum_mean_max(s, c, err);
}
gt_status gt_cuda_max(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    return gt_cuda_sum_mean_max(s, c, err);
}
gt_status gt_cuda_sum_squares(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    return gt_cuda_sum_mean_max(s, c, err);
}

gt_status gt_cuda_sum_to(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    const gt_tensor *x = c->in[0];
    gt_tensor *out = c->out[0];
    GT_TRY(gt_kernel_want_float(c, x, "input", err));
    GT_TRY(gt_kernel_want_float(c, out, "output", err));
    bool reduced[GT_MAX_DIMS] = {false};
    bool ok = out->ndim <= x->ndim && c->ne == out->ndim && (c->ne == 0 || c->e);
    int lead = x->ndim - out->ndim;
    for (int d = 0; ok && d < x->ndim; d++) {
        int od = d - lead;
        if (od < 0)
            reduced[d] = true;
        else if (c->e[od] != out->shape[od])
            ok = false;
        else if (out->shape[od] == x->shape[d])
            reduced[d] = false;
        else if (out->shape[od] == 1)
            reduced[d] = true;
        else
            ok = false;
    }
    if (!ok) return gt_cuda_shape_error(c, "cannot sum the input down to the output", err);
    /* Kept dims of x are exactly out's dims that are not summed, in order: out's row-major index
     * space minus its size-1 summed dims, so group g is out element g. */
    gt_cuda_reduce r;
    gt_cuda_reduce_plan(x, reduced, &r);
    return gt_cuda_reduce_run(s, c, &r, 0, x, out, 1.0, err);
}

/* dx = dy at the first (row-major) maximum of each group, 0 elsewhere: one thread per group. */
__global__ void gt_k_max_backward(gt_cuda_reduce r, const void *x, int dx_t, const void *y, int dyt,
                                  const void *dy, int ddy, void *dx, int ddx)
{
    GT_GRID_STRIDE(g, r.groups)
    {
        int64_t base[1];
        gt_index_offsets(r.kept, g, 1, base);
        float m = gt_ld(y, dyt, g), grad = gt_ld(dy, ddy, g);
        bool routed = false;
        for (int64_t k = 0; k < r.count; k++) {
            int64_t off[1];
            gt_index_offsets(r.red, k, 1, off);
            int64_t xi = base[0] + off[0];
            float v = gt_ld(x, dx_t, xi);
            bool hit = !routed && (v == m || (v != v && m != m));
            gt_st(dx, ddx, xi, hit ? grad : 0.0f);
            routed |= hit;
        }
    }
}

gt_status gt_cuda_max_backward(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    const gt_tensor *x = c->in[0], *y = c->in[1], *dy = c->in[2];
    gt_tensor *dx = c->out[0];
    GT_TRY(gt_kernel_want_float(c, x, "x", err));
    GT_TRY(gt_kernel_want_float(c, y, "y", err));
    GT_TRY(gt_kernel_want_float(c, dy, "dy", err));
    GT_TRY(gt_kernel_want_float(c, dx, "dx", err));
    GT_TRY(gt_kernel_want_same_shape(c, x, "x", dx, "dx", err));
    GT_TRY(gt_kernel_want_same_shape(c, y, "y", dy, "dy", err));
    bool reduced[GT_MAX_DIMS];
    GT_TRY(gt_cuda_reduce_layout(c, x, y, reduced, err));
    gt_cuda_reduce r;
    gt_cuda_reduce_plan(x, reduced, &r);
    if (r.groups == 0 || r.count == 0) return GT_OK;
    gt_k_max_backward<<<gt_cuda_blocks(r.groups), GT_CUDA_THREADS, 0, s->stream>>>(
        r, x->data, x->dtype, y->data, y->dtype, dy->data, dy->dtype, dx->data, dx->dtype);
    return gt_cuda_launched(c, err);
}

/* ---------------------------------------------------------------- softmax */

/* One block per line (outer o, inner i) of n elements at stride `inner`. */
__global__ void __launch_bounds__(GT_CUDA_THREADS)
    gt_k_softmax(int backward, int64_t lines, int64_t n, int64_t inner, const void *a, int da,
                 const void *b, int db, void *out, int dout)
{
    __shared__ double shd[GT_CUDA_THREADS];
    __shared__ float shf[GT_CUDA_THREADS];
    for (int64_t line = blockIdx.x; line < lines; line += gridDim.x) {
        int64_t o = line / inner, in = line - o * inner, base = o * n * inner + in;
        if (!backward) {
            /* y_j = exp(x_j - m) * f32(1 / sum_k exp(x_k - m)) */
            float m = -INFINITY;
            for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
                m = gt_nanmax(gt_ld(a, da, base + j * inner), m);
            m = gt_block_max(m, shf);
            double sum = 0.0;
            for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
                sum += expf(gt_ld(a, da, base + j * inner) - m);
            sum = gt_block_sum(sum, shd);
            float inv = (float)(1.0 / sum);
            for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
                gt_st(out, dout, base + j * inner, expf(gt_ld(a, da, base + j * inner) - m) * inv);
        } else {
            /* dx_j = y_j * (dy_j - f32(sum_k y_k dy_k)); a = y, b = dy */
            double dot = 0.0;
            for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
                dot += (double)gt_ld(a, da, base + j * inner) * gt_ld(b, db, base + j * inner);
            float df = (float)gt_block_sum(dot, shd);
            for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
                int64_t k = base + j * inner;
                gt_st(out, dout, k, gt_ld(a, da, k) * (gt_ld(b, db, k) - df));
            }
        }
    }
}

static gt_status gt_cuda_softmax_any(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    bool bwd = c->op == GT_OP_SOFTMAX_BACKWARD;
    const gt_tensor *a = c->in[0], *b = bwd ? c->in[1] : c->in[0];
    gt_tensor *out = c->out[0];
    GT_TRY(gt_kernel_want_float(c, a, bwd ? "y" : "x", err));
    GT_TRY(gt_kernel_want_float(c, b, "dy", err));
    GT_TRY(gt_kernel_want_float(c, out, "output", err));
    GT_TRY(gt_kernel_want_same_shape(c, a, "input", out, "output", err));
    GT_TRY(gt_kernel_want_same_shape(c, b, "dy", out, "output", err));
    GT_TRY(gt_kernel_want_attrs(c, 1, 0, 0, err));
    int dim;
    GT_TRY(gt_kernel_norm_dim(c, c->i[0], a->ndim, &dim, err));
    int64_t outer = 1, inner = 1, n = a->shape[dim];
    for (int d = 0; d < dim; d++)
        outer *= a->shape[d];
    for (int d = dim + 1; d < a->ndim; d++)
        inner *= a->shape[d];
    int64_t lines = outer * inner;
    if (lines == 0 || n == 0) return GT_OK;
    gt_k_softmax<<<(unsigned)(lines < 65536 ? lines : 65536), GT_CUDA_THREADS, 0, s->stream>>>(
        bwd, lines, n, inner, a->data, a->dtype, b->data, b->dtype, out->data, out->dtype);
    return gt_cuda_launched(c, err);
}

gt_status gt_cuda_softmax(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    return gt_cuda_softmax_any(s, c, err);
}
gt_status gt_cuda_softmax_backward(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    return gt_cuda_softmax_any(s, c, err);
}
