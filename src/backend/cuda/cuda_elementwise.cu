/* cuda_elementwise.cu — elementwise kernels: add sub mul div silu_backward (numpy broadcasting),
 * the unary functions, scale, add_scalar, clamp, cast and full (AdamW: cuda_adamw.cu).
 *
 * Each element is computed alone in f32, so results are deterministic and independent of the
 * launch shape. Scalars from attributes are rounded to f32 first (as the CPU backend).
 *
 * Speed: these kernels are memory bound, so the common case — operands of one float dtype, the
 * same shape, 16-byte aligned — runs a vectorized path: one 16-byte load per operand per thread
 * (4 f32 or 8 bf16/f16 lanes) and one 16-byte store, with the op and dtype as template parameters.
 * Every lane goes through the same per-element function as the general path (gt_binary_op,
 * gt_unary_op), so the fast and general paths give identical bits. Everything else
 * (broadcasting, mixed dtypes, misaligned views) keeps the general index-mapped kernels. */
#include "cuda_internal.h"

#include <math.h>
#include <string.h>

__device__ __forceinline__ float gt_sigmoidf(float x)
{
    return 1.0f / (1.0f + expf(-x));
}

/* ---------------------------------------------------------------- 16-byte packs */

/* 16 bytes of T; loads/stores of a pack compile to one 128-bit access. */
template <typename T> struct alignas(16) gt_pack {
    T e[16 / sizeof(T)];
};

template <typename T> __device__ __forceinline__ float gt_to_f(T v);
template <> __device__ __forceinline__ float gt_to_f<float>(float v)
{
    return v;
}
template <> __device__ __forceinline__ float gt_to_f<__nv_bfloat16>(__nv_bfloat16 v)
{
    return __bfloat162float(v);
}
template <> __device__ __forceinline__ float gt_to_f<__half>(__half v)
{
    return __half2float(v);
}

/* Rounds to nearest even, as gt_st. */
template <typename T> __device__ __forceinline__ T gt_from_f(float v);
template <> __device__ __forceinline__ float gt_from_f<float>(float v)
{
    return v;
}
template <> __device__ __forceinline__ __nv_bfloat16 gt_from_f<__nv_bfloat16>(float v)
{
    return __float2bfloat16_rn(v);
}
template <> __device__ __forceinline__ __half gt_from_f<__half>(float v)
{
    return __float2half_rn(v);
}

/* ---------------------------------------------------------------- binary with broadcasting */

__device__ __forceinline__ float gt_binary_op(int op, float x, float y)
{
    switch (op) {
    case GT_OP_ADD:
        return x + y;
    case GT_OP_SUB:
        return x - y;
    case GT_OP_MUL:
        return x * y;
    case GT_OP_DIV:
        return x / y;
    default: { /* silu_backward: dy * s * (1 + x * (1 - s)); x = a, dy = b */
        float s = gt_sigmoidf(x);
        return __fmul_rn(__fmul_rn(y, s), __fadd_rn(1.0f, __fmul_rn(x, 1.0f - s)));
    }
    }
}

__global__ void gt_k_binary(int op, gt_cuda_index ix, int64_t n, const void *a, int da,
                            const void *b, int db, void *out, int dout)
{
    GT_GRID_STRIDE(i, n)
    {
        int64_t off[2];
        gt_index_offsets(ix, i, 2, off);
        gt_st(out, dout, i, gt_binary_op(op, gt_ld(a, da, off[0]), gt_ld(b, db, off[1])));
    }
}

/* No broadcasting beyond a one-element operand: element i of a is a[i * sa] (sa 0 or 1). */
__global__ void gt_k_binary_flat(int op, int64_t n, const void *a, int da, int64_t sa,
                                 const void *b, int db, int64_t sb, void *out, int dout)
{
    GT_GRID_STRIDE(i, n)
    gt_st(out, dout, i, gt_binary_op(op, gt_ld(a, da, i * sa), gt_ld(b, db, i * sb)));
}

/* Same shape, one dtype, 16-byte aligned: n_packs full packs, then the tail of n_tail elements
 * (fewer than one pack) by the first threads of block 0. */
template <typename T, int OP>
__global__ void gt_k_binary_vec(int64_t n_packs, int n_tail, const T *a, const T *b, T *out)
{
    const int V = 16 / sizeof(T);
    GT_GRID_STRIDE(i, n_packs)
    {
        gt_pack<T> x = ((const gt_pack<T> *)a)[i], y = ((const gt_pack<T> *)b)[i], r;
#pragma unroll
        for (int k = 0; k < V; k++)
            r.e[k] = gt_from_f<T>(gt_binary_op(OP, gt_to_f<T>(x.e[k]), gt_to_f<T>(y.e[k])));
        ((gt_pack<T> *)out)[i] = r;
    }
    if (blockIdx.x == 0 && (int)threadIdx.x < n_tail) {
        int64_t i = n_packs * V + threadIdx.x;
        out[i] = gt_from_f<T>(gt_binary_op(OP, gt_to_f<T>(a[i]), gt_to_f<T>(b[i])));
    }
}

template <typename T>
static void gt_launch_binary_vec(cudaStream_t st, int op, int64_t n, const void *a, const void *b,
                                 void *out)
{
    const int V = 16 / sizeof(T);
    int64_t np = n / V;
    int tail = (int)(n - np * V);
    unsigned blocks = gt_pack_blocks(np);
    const T *x = (const T *)a, *y = (const T *)b;
    T *o = (T *)out;
    switch (op) {
    case GT_OP_ADD:
        gt_k_binary_vec<T, GT_OP_ADD><<<blocks, GT_CUDA_THREADS, 0, st>>>(np, tail, x, y, o);
        break;
    case GT_OP_SUB:
        gt_k_binary_vec<T, GT_OP_SUB><<<blocks, GT_CUDA_THREADS, 0, st>>>(np, tail, x, y, o);
        break;
    case GT_OP_MUL:
        gt_k_binary_vec<T, GT_OP_MUL><<<blocks, GT_CUDA_THREADS, 0, st>>>(np, tail, x, y, o);
        break;
    case GT_OP_DIV:
        gt_k_binary_vec<T, GT_OP_DIV><<<blocks, GT_CUDA_THREADS, 0, st>>>(np, tail, x, y, o);
        break;
    default:
        gt_k_binary_vec<T, GT_OP_SILU_BACKWARD>
            <<<blocks, GT_CUDA_THREADS, 0, st>>>(np, tail, x, y, o);
    }
}

static bool gt_same_shape(const gt_tensor *a, const gt_tensor *b)
{
    if (a->ndim != b->ndim) return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d]) return false;
    return true;
}

static gt_status gt_cuda_binary(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    const gt_tensor *a = c->in[0], *b = c->in[1];
    gt_tensor *out = c->out[0];
    GT_TRY(gt_kernel_want_float(c, a, "input 0", err));
    GT_TRY(gt_kernel_want_float(c, b, "input 1", err));
    GT_TRY(gt_kernel_want_float(c, out, "output", err));
    gt_cuda_index ix;
    memset(&ix, 0, sizeof ix);
    int rank = a->ndim > b->ndim ? a->ndim : b->ndim;
    if (out->ndim != rank ||
        !gt_cuda_broadcast_strides(out->ndim, out->shape, a->ndim, a->shape, ix.stride[0]) ||
        !gt_cuda_broadcast_strides(out->ndim, out->shape, b->ndim, b->shape, ix.stride[1]))
        return gt_cuda_shape_error(c, "inputs do not broadcast to the output", err);
    ix.ndim = out->ndim;
    memcpy(ix.shape, out->shape, sizeof ix.shape);
    int64_t n = gt_tensor_numel(out);
    if (n == 0) return GT_OK;
    int op = (int)c->op;
    bool same_a = gt_tensor_numel(a) == n, same_b = gt_tensor_numel(b) == n;
    if (same_a && same_b && gt_same_shape(a, out) && gt_same_shape(b, out) &&
        a->dtype == out->dtype && b->dtype == out->dtype && gt_aligned16(a->data) &&
        gt_aligned16(b->data) && gt_aligned16(out->data)) {
        if (out->dtype == GT_F32)
            gt_launch_binary_vec<float>(s->stream, op, n, a->data, b->data, out->data);
        else if (out->dtype == GT_BF16)
            gt_launch_binary_vec<__nv_bfloat16>(s->stream, op, n, a->data, b->data, out->data);
        else
            gt_launch_binary_vec<__half>(s->stream, op, n, a->data, b->data, out->data);
        return gt_cuda_launched(c, err);
    }
    /* Same numel as the output (equal shapes up to leading ones) or a single element. */
    if ((same_a || gt_tensor_numel(a) == 1) && (same_b || gt_tensor_numel(b) == 1)) {
        gt_k_binary_flat<<<gt_cuda_blocks(n), GT_CUDA_THREADS, 0, s->stream>>>(
            op, n, a->data, a->dtype, same_a ? 1 : 0, b->data, b->dtype, same_b ? 1 : 0, out->data,
            out->dtype);
        return gt_cuda_launched(c, err);
    }
    gt_k_binary<<<gt_cuda_blocks(n), GT_CUDA_THREADS, 0, s->stream>>>(
        op, ix, n, a->data, a->dtype, b->data, b->dtype, out->data, out->dtype);
    return gt_cuda_launched(c, err);
}

#define GT_BINARY(name)                                                                            \
    gt_status gt_cuda_##name(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)            \
    {                                                                                              \
        return gt_cuda_binary(s, c, err);                                                          \
    }
GT_BINARY(add)
GT_BINARY(sub)
GT_BINARY(mul)
GT_BINARY(div)
GT_BINARY(silu_backward)

/* ---------------------------------------------------------------- unary */

__device__ __forceinline__ float gt_unary_op(int op, float v, float a, float lo, float hi)
{
    switch (op) {
    case GT_OP_NEG:
        return -v;
    case GT_OP_EXP:
        return expf(v);
    case GT_OP_LOG:
        return logf(v);
    case GT_OP_SQRT:
        return sqrtf(v);
    case GT_OP_RSQRT:
        return 1.0f / sqrtf(v);
    case GT_OP_SILU:
        return v * gt_sigmoidf(v);
    case GT_OP_SIGMOID:
        return gt_sigmoidf(v);
    case GT_OP_SCALE:
        return a * v;
    case GT_OP_ADD_SCALAR:
        return v + a;
    default: /* clamp: comparisons are false for NaN, so NaN passes through */
        return v < lo ? lo : v > hi ? hi : v;
    }
}

__global__ void gt_k_unary(int op, int64_t n, const void *x, int dx, void *y, int dy, float a,
                           float lo, float hi)
{
    GT_GRID_STRIDE(i, n)
    gt_st(y, dy, i, gt_unary_op(op, gt_ld(x, dx, i), a, lo, hi));
}

template <typename T, int OP>
__global__ void gt_k_unary_vec(int64_t n_packs, int n_tail, const T *x, T *y, float a, float lo,
                               float hi)
{
    const int V = 16 / sizeof(T);
    GT_GRID_STRIDE(i, n_packs)
    {
        gt_pack<T> v = ((const gt_pack<T> *)x)[i], r;
#pragma unroll
        for (int k = 0; k < V; k++)
            r.e[k] = gt_from_f<T>(gt_unary_op(OP, gt_to_f<T>(v.e[k]), a, lo, hi));
        ((gt_pack<T> *)y)[i] = r;
    }
    if (blockIdx.x == 0 && (int)threadIdx.x < n_tail) {
        int64_t i = n_packs * V + threadIdx.x;
        y[i] = gt_from_f<T>(gt_unary_op(OP, gt_to_f<T>(x[i]), a, lo, hi));
    }
}

template <typename T>
static void gt_launch_unary_vec(cudaStream_t st, int op, int64_t n, const void *xp, void *yp,
                                float a, float lo, float hi)
{
    const int V = 16 / sizeof(T);
    int64_t np = n / V;
    int tail = (int)(n - np * V);
    unsigned g = gt_pack_blocks(np);
    const T *x = (const T *)xp;
    T *y = (T *)yp;
#define GT_UNARY_CASE(OPC)                                                                         \
    case OPC:                                                                                      \
        gt_k_unary_vec<T, OPC><<<g, GT_CUDA_THREADS, 0, st>>>(np, tail, x, y, a, lo, hi);          \
        break;
    switch (op) {
        GT_UNARY_CASE(GT_OP_NEG)
        GT_UNARY_CASE(GT_OP_EXP)
        GT_UNARY_CASE(GT_OP_LOG)
        GT_UNARY_CASE(GT_OP_SQRT)
        GT_UNARY_CASE(GT_OP_RSQRT)
        GT_UNARY_CASE(GT_OP_SILU)
        GT_UNARY_CASE(GT_OP_SIGMOID)
        GT_UNARY_CASE(GT_OP_SCALE)
        GT_UNARY_CASE(GT_OP_ADD_SCALAR)
    default:
        gt_k_unary_vec<T, GT_OP_CLAMP><<<g, GT_CUDA_THREADS, 0, st>>>(np, tail, x, y, a, lo, hi);
    }
#undef GT_UNARY_CASE
}

static gt_status gt_cuda_unary(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    const gt_tensor *x = c->in[0];
    gt_tensor *out = c->out[0];
    GT_TRY(gt_kernel_want_float(c, x, "input", err));
    GT_TRY(gt_kernel_want_float(c, out, "output", err));
    GT_TRY(gt_kernel_want_same_shape(c, x, "input", out, "output", err));
    float a = 0.0f, lo = 0.0f, hi = 0.0f;
    if (c->op == GT_OP_SCALE || c->op == GT_OP_ADD_SCALAR) {
        GT_TRY(gt_kernel_want_attrs(c, 0, 1, 0, err));
        a = (float)c->f[0];
    }
    if (c->op == GT_OP_CLAMP) {
        GT_TRY(gt_kernel_want_attrs(c, 0, 2, 0, err));
        if (isnan(c->f[0]) || isnan(c->f[1]) || c->f[0] > c->f[1])
            return gt_error_set(err, GT_ERR_INVALID,
                                "clamp: bounds must satisfy min <= max, got [%g, %g]", c->f[0],
                                c->f[1]);
        lo = (float)c->f[0];
        hi = (float)c->f[1];
    }
    int64_t n = gt_tensor_numel(x);
    if (n == 0) return GT_OK;
    int op = (int)c->op;
    if (x->dtype == out->dtype && gt_aligned16(x->data) && gt_aligned16(out->data)) {
        if (x->dtype == GT_F32)
            gt_launch_unary_vec<float>(s->stream, op, n, x->data, out->data, a, lo, hi);
        else if (x->dtype == GT_BF16)
            gt_launch_unary_vec<__nv_bfloat16>(s->stream, op, n, x->data, out->data, a, lo, hi);
        else
            gt_launch_unary_vec<__half>(s->stream, op, n, x->data, out->data, a, lo, hi);
        return gt_cuda_launched(c, err);
    }
    gt_k_unary<<<gt_cuda_blocks(n), GT_CUDA_THREADS, 0, s->stream>>>(
        op, n, x->data, x->dtype, out->data, out->dtype, a, lo, hi);
    return gt_cuda_launched(c, err);
}

#define GT_UNARY(name)                                                                             \
    gt_status gt_cuda_##name(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)            \
    {                                                                                              \
        return gt_cuda_unary(s, c, err);                                                           \
    }
GT_UNARY(neg)
GT_UNARY(exp)
GT_UNARY(log)
GT_UNARY(sqrt)
GT_UNARY(rsqrt)
GT_UNARY(silu)
GT_UNARY(sigmoid)
GT_UNARY(scale)
GT_UNARY(add_scalar)
GT_UNARY(clamp)

/* ---------------------------------------------------------------- cast and full */

/* Float -> integer truncates toward zero and saturates, NaN -> 0; bool is v != 0 (core's
 * gt_tensor_set_f32 rules). Integer -> integer goes through int64 (i32 wraps). Anything with a
 * float goes through f32. */
__device__ __forceinline__ int64_t gt_f2i_sat(float v, int64_t lo, int64_t hi)
{
    double d = v;
    if (d != d) return 0;
    if (d <= (double)lo) return lo;
    if (d >= (double)hi) return hi;
    return (int64_t)d;
}

__global__ void gt_k_cast(int64_t n, const void *x, int dx, void *y, int dy)
{
    bool xi = dx == GT_I32 || dx == GT_I64 || dx == GT_BOOL;
    bool yi = dy == GT_I32 || dy == GT_I64 || dy == GT_BOOL;
    GT_GRID_STRIDE(i, n)
    {
        if (xi && yi) {
            int64_t v = dx == GT_I32   ? ((const int32_t *)x)[i]
                        : dx == GT_I64 ? ((const int64_t *)x)[i]
                                       : (int64_t)(((const uint8_t *)x)[i] != 0);
            if (dy == GT_I32)
                ((int32_t *)y)[i] = (int32_t)(uint32_t)(uint64_t)v;
            else if (dy == GT_I64)
                ((int64_t *)y)[i] = v;
            else
                ((uint8_t *)y)[i] = v != 0;
            continue;
        }
        float v = dx == GT_I32    ? (float)((const int32_t *)x)[i]
                  : dx == GT_I64  ? (float)((const int64_t *)x)[i]
                  : dx == GT_BOOL ? (((const uint8_t *)x)[i] ? 1.0f : 0.0f)
                                  : gt_ld(x, dx, i);
        if (dy == GT_I32)
            ((int32_t *)y)[i] = (int32_t)gt_f2i_sat(v, INT32_MIN, INT32_MAX);
        else if (dy == GT_I64)
            ((int64_t *)y)[i] = gt_f2i_sat(v, INT64_MIN, INT64_MAX);
        else if (dy == GT_BOOL)
            ((uint8_t *)y)[i] = v != 0.0f;
        else
            gt_st(y, dy, i, v);
    }
}

/* Float -> float between f32/bf16/f16, both 16-byte aligned: eight elements per thread (one or
 * two 128-bit loads, one or two stores), the same widen-then-round as gt_k_cast. */
template <typename TS, typename TD>
__global__ void gt_k_cast_vec(int64_t n8, int n_tail, const TS *x, TD *y)
{
    const int VS = 16 / sizeof(TS), VD = 16 / sizeof(TD);
    GT_GRID_STRIDE(i, n8)
    {
        gt_pack<TS> in[8 / VS];
        gt_pack<TD> out[8 / VD];
#pragma unroll
        for (int k = 0; k < 8 / VS; k++)
            in[k] = ((const gt_pack<TS> *)x)[i * (8 / VS) + k];
#pragma unroll
        for (int k = 0; k < 8; k++)
            out[k / VD].e[k % VD] = gt_from_f<TD>(gt_to_f<TS>(in[k / VS].e[k % VS]));
#pragma unroll
        for (int k = 0; k < 8 / VD; k++)
            ((gt_pack<TD> *)y)[i * (8 / VD) + k] = out[k];
    }
    if (blockIdx.x == 0 && (int)threadIdx.x < n_tail) {
        int64_t i = n8 * 8 + threadIdx.x;
        y[i] = gt_from_f<TD>(gt_to_f<TS>(x[i]));
    }
}

template <typename TS>
static void gt_launch_cast_vec(cudaStream_t st, int64_t n, const void *x, void *y, int dy)
{
    int64_t n8 = n / 8;
    int tail = (int)(n - n8 * 8);
    unsigned g = gt_pack_blocks(n8);
    if (dy == GT_F32)
        gt_k_cast_vec<TS, float>
            <<<g, GT_CUDA_THREADS, 0, st>>>(n8, tail, (const TS *)x, (float *)y);
    else if (dy == GT_BF16)
        gt_k_cast_vec<TS, __nv_bfloat16>
            <<<g, GT_CUDA_THREADS, 0, st>>>(n8, tail, (const TS *)x, (__nv_bfloat16 *)y);
    else
        gt_k_cast_vec<TS, __half>
            <<<g, GT_CUDA_THREADS, 0, st>>>(n8, tail, (const TS *)x, (__half *)y);
}

static bool gt_is_float_dt(int dt)
{
    return dt == GT_F32 || dt == GT_BF16 || dt == GT_F16;
}

gt_status gt_cuda_cast(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    const gt_tensor *x = c->in[0];
    gt_tensor *out = c->out[0];
    GT_TRY(gt_kernel_want_cast(c, err));
    int64_t n = gt_tensor_numel(x);
    if (n == 0) return GT_OK;
    if (x->dtype == out->dtype) {
        if (x->data == out->data) return GT_OK;
        int64_t bytes = (int64_t)gt_tensor_nbytes(x);
        return gt_cuda_copy_2d(s, c, out->data, bytes, x->data, bytes, bytes, 1, err);
    }
    if (gt_is_float_dt(x->dtype) && gt_is_float_dt(out->dtype) && gt_aligned16(x->data) &&
        gt_aligned16(out->data)) {
        if (x->dtype == GT_F32)
            gt_launch_cast_vec<float>(s->stream, n, x->data, out->data, out->dtype);
        else if (x->dtype == GT_BF16)
            gt_launch_cast_vec<__nv_bfloat16>(s->stream, n, x->data, out->data, out->dtype);
        else
            gt_launch_cast_vec<__half>(s->stream, n, x->data, out->data, out->dtype);
        return gt_cuda_launched(c, err);
    }
    gt_k_cast<<<gt_cuda_blocks(n), GT_CUDA_THREADS, 0, s->stream>>>(n, x->data, x->dtype, out->data,
                                                                    out->dtype);
    return gt_cuda_launched(c, err);
}

/* Replicates one element of es bytes (its bits in `w`). Aligned outputs store 16 bytes per thread
 * (the element's bytes repeated: es divides 16), the last n_tail bytes one at a time. */
__global__ void gt_k_fill(int64_t n, int es, unsigned long long w, void *out)
{
    GT_GRID_STRIDE(i, n)
    {
        if (es == 1)
            ((uint8_t *)out)[i] = (uint8_t)w;
        else if (es == 2)
            ((uint16_t *)out)[i] = (uint16_t)w;
        else if (es == 4)
            ((uint32_t *)out)[i] = (uint32_t)w;
        else
            ((unsigned long long *)out)[i] = w;
    }
}

__global__ void gt_k_fill_vec(int64_t n16, int n_tail, uint4 pattern, uint8_t *out)
{
    GT_GRID_STRIDE(i, n16)
    ((uint4 *)out)[i] = pattern;
    if (blockIdx.x == 0 && (int)threadIdx.x < n_tail)
        out[n16 * 16 + threadIdx.x] = ((const uint8_t *)&pattern)[threadIdx.x];
}

gt_status gt_cuda_full(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    gt_tensor *out = c->out[0];
    uint8_t bits[8]; /* the element's bytes, made on the host exactly as the CPU kernel's */
    GT_TRY(gt_kernel_want_full(c, bits, err));
    int64_t n = gt_tensor_numel(out);
    if (n == 0) return GT_OK;
    unsigned long long w = 0;
    memcpy(&w, bits, sizeof w); /* little endian: the element's bytes are w's low bytes */
    if (gt_aligned16(out->data)) {
        size_t es = gt_dtype_size(out->dtype), nb = (size_t)n * es;
        uint8_t rep[16];
        for (size_t k = 0; k < 16; k++)
            rep[k] = bits[k % es];
        uint4 pattern;
        memcpy(&pattern, rep, sizeof pattern);
        int64_t n16 = (int64_t)(nb / 16);
        gt_k_fill_vec<<<gt_pack_blocks(n16), GT_CUDA_THREADS, 0, s->stream>>>(
            n16, (int)(nb - (size_t)n16 * 16), pattern, (uint8_t *)out->data);
        return gt_cuda_launched(c, err);
    }
    gt_k_fill<<<gt_cuda_blocks(n), GT_CUDA_THREADS, 0, s->stream>>>(
        n, (int)gt_dtype_size(out->dtype), w, out->data);
    return gt_cuda_launched(c, err);
}
