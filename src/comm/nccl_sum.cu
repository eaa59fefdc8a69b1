/* nccl_sum.cu — the ordered sum behind the NCCL communicator's all_reduce and reduce_scatter
 * (nccl_sum.h).
 *
 * After the all-to-all of chunks, rank r holds the n contributions to its chunk back to back in a
 * scratch buffer, block q from rank q (its own block it reads from its input, where it lies).
 * Each output element is one thread's left-to-right sum over
 * the n blocks, so its rounding sequence is that of gt_comm_sum_ordered on the CPU:
 *     acc = x_0;  acc = acc + x_1;  …  acc = acc + x_{n-1}     (f32; no FMA: only additions)
 * and the result is the same bits on the CPU (MPI communicator) and on the device. bf16 and f16
 * are widened exactly and rounded once (nearest even), or not at all when the output is f32 (the
 * widening reduce-scatter: blocks of the input dtype, output f32); integers wrap through unsigned
 * arithmetic. Elements move in 16-byte vectors when every block and dst are 16-byte aligned and
 * numel is a multiple of the vector width (the usual case for parameter buckets), else one at a
 * time; a widening sum loads V = 8 16-bit elements and stores them as two 16-byte f32 vectors. */
#include "graphtrain/gt_comm.h"
#include "nccl_sum.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#include <type_traits>

/* Accumulator type of each storage type and the exact conversions in and out. */
template <typename T> struct gt_sum_traits;

template <> struct gt_sum_traits<float> {
    typedef float acc;
    static __device__ __forceinline__ float in(float v) { return v; }
    static __device__ __forceinline__ float out(float a) { return a; }
};
template <> struct gt_sum_traits<__nv_bfloat16> {
    typedef float acc;
    static __device__ __forceinline__ float in(__nv_bfloat16 v) { return __bfloat162float(v); }
    static __device__ __forceinline__ __nv_bfloat16 out(float a) { return __float2bfloat16_rn(a); }
};
template <> struct gt_sum_traits<__half> {
    typedef float acc;
    static __device__ __forceinline__ float in(__half v) { return __half2float(v); }
    static __device__ __forceinline__ __half out(float a) { return __float2half_rn(a); }
};
template <> struct gt_sum_traits<int32_t> {
    typedef uint32_t acc;
    static __device__ __forceinline__ uint32_t in(int32_t v) { return (uint32_t)v; }
    static __device__ __forceinline__ int32_t out(uint32_t a) { return (int32_t)a; }
};
template <> struct gt_sum_traits<int64_t> {
    typedef uint64_t acc;
    static __device__ __forceinline__ uint64_t in(int64_t v) { return (uint64_t)v; }
    static __device__ __forceinline__ int64_t out(uint64_t a) { return (int64_t)a; }
};

/* Block r of the sum: own_src for r == own (this rank's block, read where it already is),
 * else the r-th block of src. */
template <typename T>
__device__ __forceinline__ const T *gt_comm_block(const T *src, int64_t numel, int r, int own,
                                                  const T *own_src)
{
    return r == own ? own_src : src + (int64_t)r * numel;
}

/* Group g of V consecutive elements: dst[gV .. gV+V) = sum over blocks in order, blocks of T,
 * dst of U (T itself, or f32 for a 16-bit T). V = 1 is the scalar path; V > 1 loads 16 bytes of
 * every block at a time and stores V * sizeof(U) bytes as 16-byte vectors. */
template <typename T, typename U, int V>
__global__ void gt_k_comm_sum(int64_t groups, int64_t numel, const T *src, int n, int own,
                              const T *own_src, U *dst)
{
    typedef gt_sum_traits<T> tr;
    typedef typename tr::acc A;
    static_assert(std::is_same<typename gt_sum_traits<U>::acc, A>::value, "one accumulator type");
    for (int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; g < groups;
         g += (int64_t)gridDim.x * blockDim.x) {
        int64_t i = g * V;
        T v[V];
        A acc[V];
        const T *b0 = gt_comm_block(src, numel, 0, own, own_src) + i;
        if (V > 1)
            *(uint4 *)v = *(const uint4 *)b0;
        else
            v[0] = b0[0];
#pragma unroll
        for (int k = 0; k < V; k++)
            acc[k] = tr::in(v[k]);
        for (int r = 1; r < n; r++) {
            const T *b = gt_comm_block(src, numel, r, own, own_src) + i;
            if (V > 1)
                *(uint4 *)v = *(const uint4 *)b;
            else
                v[0] = b[0];
#pragma unroll
            for (int k = 0; k < V; k++)
                acc[k] = acc[k] + tr::in(v[k]);
        }
        __align__(16) U w[V];
#pragma unroll
        for (int k = 0; k < V; k++)
            w[k] = gt_sum_traits<U>::out(acc[k]);
        if (V > 1) {
#pragma unroll
            for (int q = 0; q < (int)(V * sizeof(U) / 16); q++)
                ((uint4 *)(dst + i))[q] = ((const uint4 *)w)[q];
        } else {
            dst[i] = w[0];
        }
    }
}

typedef struct {
    int64_t numel;
    const void *src, *own_src;
    int n, own;
    void *dst;
} gt_comm_sum_args;

template <typename T, typename U>
static cudaError_t gt_launch_comm_sum(const gt_comm_sum_args &a, cudaStream_t st)
{
    constexpr int V = (int)(16 / sizeof(T));
    bool vec = a.numel % V == 0 && ((uintptr_t)a.src % 16) == 0 &&
               ((uintptr_t)a.own_src % 16) == 0 && ((uintptr_t)a.dst % 16) == 0;
    int64_t groups = vec ? a.numel / V : a.numel;
    int64_t blocks = (groups + 255) / 256;
    if (blocks > 8192) blocks = 8192; /* grid-stride over the rest */
    if (blocks < 1) blocks = 1;
    const T *src = (const T *)a.src, *own_src = (const T *)a.own_src;
    if (vec)
        gt_k_comm_sum<T, U, V><<<(unsigned)blocks, 256, 0, st>>>(groups, a.numel, src, a.n, a.own,
                                                                 own_src, (U *)a.dst);
    else
        gt_k_comm_sum<T, U, 1><<<(unsigned)blocks, 256, 0, st>>>(groups, a.numel, src, a.n, a.own,
                                                                 own_src, (U *)a.dst);
    return cudaGetLastError();
}

extern "C" gt_status gt_comm_nccl_sum(gt_dtype dt, gt_dtype out_dt, int64_t numel, const void *src,
                                      int n, int own, const void *own_src, void *dst, void *stream,
                                      gt_error *err)
{
    if (numel <= 0) return GT_OK;
    if (n < 1) return gt_error_set(err, GT_ERR_INVALID, "ordered sum over %d blocks", n);
    cudaStream_t st = (cudaStream_t)stream;
    if (own < 0 || own >= n || !own_src) own = -1, own_src = src;
    gt_comm_sum_args a = {numel, src, own_src, n, own, dst};
    cudaError_t e;
    bool widen;
    GT_TRY(gt_comm_sum_check_dtypes(dt, out_dt, &widen, err));
    switch (dt) {
    case GT_F32:
        e = gt_launch_comm_sum<float, float>(a, st);
        break;
    case GT_BF16:
        e = widen ? gt_launch_comm_sum<__nv_bfloat16, float>(a, st)
                  : gt_launch_comm_sum<__nv_bfloat16, __nv_bfloat16>(a, st);
        break;
    case GT_F16:
        e = widen ? gt_launch_comm_sum<__half, float>(a, st)
                  : gt_launch_comm_sum<__half, __half>(a, st);
        break;
    case GT_I32:
        e = gt_launch_comm_sum<int32_t, int32_t>(a, st);
        break;
    case GT_I64:
        e = gt_launch_comm_sum<int64_t, int64_t>(a, st);
        break;
    default:
        return gt_error_set(err, GT_ERR_UNSUPPORTED, "sum of dtype %s is not supported",
                            gt_dtype_name(dt));
    }
    if (e != cudaSuccess)
        return gt_error_set(
            err, GT_ERR_INTERNAL, "ordered sum of %lld %s elements into %s over %d ranks: %s",
            (long long)numel, gt_dtype_name(dt), gt_dtype_name(out_dt), n, cudaGetErrorString(e));
    return GT_OK;
}
