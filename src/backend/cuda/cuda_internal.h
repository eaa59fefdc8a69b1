/* cuda_internal.h — shared pieces of the CUDA backend (private to src/backend/cuda; CUDA C++).
 *
 * Every op in gt_ops.def has a launcher gt_cuda_<name>(stream, call, err). Kernels take the dtype
 * of each float tensor as a run-time code and load/store through gt_ld / gt_st: one instantiation
 * per kernel serves f32, bf16 and f16 (the branch is uniform across a warp, and compile time stays
 * small), and any mix of dtypes behaves as the CPU backend's widening wrapper: load widens exactly,
 * compute in f32, store rounds to nearest even.
 *
 * Determinism: every reduction has a fixed order — a thread sums a fixed strided subset, then a
 * fixed shared-memory tree (gt_block_sum) combines them; no floating-point atomics anywhere. */
#ifndef GRAPHTRAIN_CUDA_INTERNAL_H
#define GRAPHTRAIN_CUDA_INTERNAL_H

#include "backend/kernel_check.h"
#include "backend/tune_cache.h"
#include "graphtrain/gt_cuda.h"

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#define GT_CUDA_THREADS 256
#define GT_CUDA_ALGO_CACHE 64
#define GT_CUDA_ALGO_CANDIDATES 32 /* heuristic results a tuned shape times */
#define GT_CUDA_SMEM_KERNELS 32

/* One cached cuBLASLt choice: the key is every parameter of the call that shapes the plan. */
typedef struct {
    int64_t key[10];
    cublasLtMatmulAlgo_t algo;
    bool used;
} gt_cuda_algo_entry;

struct gt_cuda_stream {
    cudaStream_t stream;
    cublasLtHandle_t lt;
    void *workspace;
    size_t workspace_bytes;
    void *scratch;
    size_t scratch_bytes;
    /* Device error word: [0] = op + 1 of the first kernel that flagged bad data, [1] = the lowest
     * flagged position, [2] = the valid bound. Written with integer atomics (CAS/min), so the
     * report is the same whatever the thread order. */
    unsigned long long *flag;
    int smem_optin;
    /* Kernels whose dynamic shared-memory limit this stream has raised (to smem_optin, once: a
     * CUDA graph replays launches captured under the limit in force then, so it never changes
     * after the warm-up step). */
    const void *smem_raised[GT_CUDA_SMEM_KERNELS];
    int n_smem_raised;
    int next_slot;
    gt_cuda_algo_entry cache[GT_CUDA_ALGO_CACHE];
    unsigned long long *tune_hash; /* device word for gt_cuda_matmul_tune's output hashes */
    bool tune, tune_log;           /* GT_MATMUL_TUNE: unset or 1 (tune), log (and print), 0 (not) */
    int tuned;                     /* shapes whose candidates were timed */
    int tune_cached;               /* shapes whose choice came from the cache file */
    double tune_seconds;           /* host time the timings and the cache took */
    char *tune_cache;              /* the cache file (backend/tune_cache.h), or NULL */
    char tune_device[192];         /* the cache key's device part, made on first use */
    gt_cuda_drain_fn drain;        /* gt_cuda_stream_set_drain (NULL: cudaStreamSynchronize) */
    void *drain_user;
    struct gt_cudnn *cudnn; /* cuDNN handle and plans, made on first use (cuda_cudnn.cu) */
    bool cudnn_off;         /* gt_cuda_stream_set_cudnn(s, false), or GT_CUDNN=0 at creation */
};

/* Waits for everything queued on the stream through its drain (gt_cuda_stream_set_drain): what
 * the backend calls before a host wait of its own. */
gt_status gt_cuda_stream_drain(gt_cuda_stream *s, gt_error *err);

/* One matmul's shape (cuda_matmul.cu): out = op(a) @ op(b), row-major. */
typedef struct {
    bool ta, tb;
    int64_t m, n, k, batch;
    int64_t stride_a, stride_b, stride_c; /* elements between batch matrices (b: 0 = shared) */
    gt_dtype dt;
} gt_gemm;

/* A gemm as cuda_matmul.cu hands it to cuBLASLt: its descriptors and device pointers, in
 * cuBLASLt's operand order (its A is our b). */
typedef struct {
    const gt_gemm *g;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    const void *a, *b;
    void *out;
} gt_cuda_matmul_call;

/* Queues the call with algorithm algo (cuda_matmul.cu): out = a·b, beta 0, the stream's
 * workspace. */
cublasStatus_t gt_cuda_matmul_launch(gt_cuda_stream *s, const gt_cuda_matmul_call *m,
                                     const cublasLtMatmulAlgo_t *algo);

/* Times the heuristic's nres candidates on the call's operands (cuda_matmul_tune.cu) and returns
 * the fastest whose output has the bits of candidate `pick`, or `pick` where none is faster or
 * the stream is capturing. Overwrites the call's output. */
int gt_cuda_matmul_tune(gt_cuda_stream *s, const gt_cuda_matmul_call *m,
                        const cublasLtMatmulHeuristicResult_t *res, int nres, int pick);

/* The sdpa forward on cuDNN (cuda_cudnn.cu): the device pointers and shape of a call whose
 * tensors gt_cuda_flash_io accepts (bf16 q, k, v, out; f32 lse; 16-byte aligned). */
typedef struct {
    const void *q, *k, *v;
    void *out;          /* forward: written; backward: read (o) */
    float *lse;         /* forward: written; backward: read */
    const void *g;      /* backward: dout */
    void *dq, *dk, *dv; /* backward */
    int64_t b, hq, hkv, s, t, d, d_v; /* d: head dim of q and k; d_v: of v and out */
    int layout, causal;
    float scale;
    const int64_t *positions; /* block-causal documents: cuDNN declines (graphtrain's kernels) */
} gt_cudnn_sdpa;

/* Runs the call on cuDNN's fused flash attention when graphtrain was built with cuDNN, the stream
 * allows it and cuDNN has a deterministic engine for the shape (head dims 64 to 256, s == t);
 * *ran says whether it did (else the caller runs graphtrain's kernel). Every run of a shape takes
 * the same decision and the same plan. */
gt_status gt_cudnn_sdpa_forward(gt_cuda_stream *s, const gt_cudnn_sdpa *a, bool *ran,
                                gt_error *err);
/* The backward of such a call on cuDNN (dq, dk, dv from q, k, v, out, lse, dout), under the same
 * conditions, where its plan gave the same bits on two runs of its first call (cuda_cudnn.cu);
 * *ran as above. Call c names the op in errors; its scratch holds cuDNN's f32 row sums (and, on
 * the first call, the second run's outputs). */
gt_status gt_cudnn_sdpa_backward(gt_cuda_stream *s, const gt_kernel_call *c, const gt_cudnn_sdpa *a,
                                 bool *ran, gt_error *err);
void gt_cudnn_free(struct gt_cudnn *c);

/* dw[v, :] = sum of dy[p, :] over the positions p with ids[p] - row0 == v, in increasing p, for the
 * dw->shape[0] rows v (cuda_layout.cu). Ids outside them add nowhere; with flag_foreign they are
 * flagged on the stream's error word (embedding_backward), without it they are another rank's
 * (embedding_shard_backward). The caller checked shapes, and ids and rows below 2^31 - 1. */
gt_status gt_cuda_embedding_grad(gt_cuda_stream *s, const gt_kernel_call *c, const gt_tensor *ids,
                                 const gt_tensor *dy, gt_tensor *dw, int64_t row0,
                                 bool flag_foreign, gt_error *err);

/* One prototype per op: gt_cuda_full, gt_cuda_add, ... */
#define X(E, name, nin, nout, flags, rule, alias, pairs, recompute, schema)                        \
    gt_status gt_cuda_##name(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err);
#include "graphtrain/gt_ops.def"
#undef X

/* ---------------------------------------------------------------- host-side helpers */

/* GT_ERR_INTERNAL "<op>: <what>: <cuda error string>" unless e == cudaSuccess. */
gt_status gt_cuda_check(const gt_kernel_call *c, cudaError_t e, const char *what, gt_error *err);
/* Checks the launch just made (cudaGetLastError). */
gt_status gt_cuda_launched(const gt_kernel_call *c, gt_error *err);
/* Device-to-device copy of `rows` rows of `width` bytes by a kernel (cuda_layout.cu). */
gt_status gt_cuda_copy_2d(gt_cuda_stream *s, const gt_kernel_call *c, void *dst, int64_t dpitch,
                          const void *src, int64_t spitch, int64_t width, int64_t rows,
                          gt_error *err);
/* Scratch of at least `bytes` (256-byte aligned), grown if needed. */
gt_status gt_cuda_scratch(gt_cuda_stream *s, const gt_kernel_call *c, size_t bytes, void **out,
                          gt_error *err);
/* Lets kernel fn launch with `bytes` of dynamic shared memory: GT_ERR_UNSUPPORTED when the device
 * allows less; the first call per kernel raises its limit to the device maximum, later calls do no
 * CUDA work (capture-safe). */
gt_status gt_cuda_smem_limit(gt_cuda_stream *s, const gt_kernel_call *c, const void *fn,
                             size_t bytes, gt_error *err);
/* Blocks for a grid-stride loop over n items. */
unsigned gt_cuda_blocks(int64_t n);
/* Blocks for a grid-stride loop over n 16-byte packs: the 65536 cap of gt_cuda_blocks, at least
 * one (a kernel whose packs are all in its tail still runs). */
static inline unsigned gt_pack_blocks(int64_t n)
{
    return gt_cuda_blocks(n > 0 ? n : 1);
}
/* A 16-byte aligned address: the vector paths load and store 128 bits at a time. */
static inline bool gt_aligned16(const void *p)
{
    return ((uintptr_t)p & 15u) == 0;
}
/* The checks gt_cuda_run_kernel makes before it dispatches: a known op, its input and output
 * counts, attribute counts in range, every tensor present and well formed (data unless empty). */
gt_status gt_cuda_check_call(const gt_kernel_call *c, gt_error *err);

gt_status gt_cuda_shape_error(const gt_kernel_call *c, const char *what, gt_error *err);
bool gt_cuda_broadcast_strides(int on, const int64_t *out, int xn, const int64_t *xs,
                               int64_t *strides);

/* ---------------------------------------------------------------- device-side helpers */

/* An index space of up to GT_MAX_DIMS dims and the element strides of up to 3 operands in it. */
typedef struct {
    int ndim;
    int64_t shape[GT_MAX_DIMS];
    int64_t stride[3][GT_MAX_DIMS];
} gt_cuda_index;

#ifdef __CUDACC__
__device__ __forceinline__ float gt_ld(const void *p, int dt, int64_t i)
{
    if (dt == GT_BF16) return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    if (dt == GT_F16) return __half2float(((const __half *)p)[i]);
    return ((const float *)p)[i];
}

__device__ __forceinline__ void gt_st(void *p, int dt, int64_t i, float v)
{
    if (dt == GT_BF16)
        ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v);
    else if (dt == GT_F16)
        ((__half *)p)[i] = __float2half_rn(v);
    else
        ((float *)p)[i] = v;
}

/* Elements i and i + 1 of p (i even, p 8-byte aligned) in one 4- or 8-byte store, each rounded
 * as gt_st rounds it. */
__device__ __forceinline__ void gt_st2(void *p, int dt, int64_t i, float a, float b)
{
    if (dt == GT_BF16)
        *(__nv_bfloat162 *)((__nv_bfloat16 *)p + i) = __floats2bfloat162_rn(a, b);
    else if (dt == GT_F16)
        *(__half2 *)((__half *)p + i) = __floats2half2_rn(a, b);
    else
        *(float2 *)((float *)p + i) = make_float2(a, b);
}

/* v rounded to dtype dt (nearest even) and widened back: what gt_st then gt_ld give. */
__device__ __forceinline__ float gt_round_dt(int dt, float v)
{
    if (dt == GT_BF16) return __bfloat162float(__float2bfloat16_rn(v));
    if (dt == GT_F16) return __half2float(__float2half_rn(v));
    return v;
}

__device__ __forceinline__ int64_t gt_ld_index(const void *p, int dt, int64_t i)
{
    return dt == GT_I32 ? (int64_t)((const int32_t *)p)[i] : ((const int64_t *)p)[i];
}

/* Offsets of linear index i (row-major in ix's shape) for operands 0..n-1. */
__device__ __forceinline__ void gt_index_offsets(const gt_cuda_index &ix, int64_t i, int n,
                                                 int64_t *off)
{
    for (int k = 0; k < n; k++)
        off[k] = 0;
    for (int d = ix.ndim - 1; d >= 0; d--) {
        int64_t q = i / ix.shape[d], r = i - q * ix.shape[d];
        for (int k = 0; k < n; k++)
            off[k] += r * ix.stride[k][d];
        i = q;
    }
}

/* Fixed-order block reduction of one value per thread (float or double; blockDim.x a power of two
 * <= 1024); every thread gets the result. `sh` holds blockDim.x values. */
template <typename T> __device__ __forceinline__ T gt_block_sum(T v, T *sh)
{
    sh[threadIdx.x] = v;
    __syncthreads();
    for (unsigned w = blockDim.x / 2; w > 0; w >>= 1) {
        if (threadIdx.x < w) sh[threadIdx.x] += sh[threadIdx.x + w];
        __syncthreads();
    }
    T r = sh[0];
    __syncthreads();
    return r;
}

/* max with NaN propagation (fmaxf would drop NaN). */
__device__ __forceinline__ float gt_nanmax(float a, float b)
{
    return (a > b || a != a) ? a : b;
}

__device__ __forceinline__ float gt_block_max(float v, float *sh)
{
    sh[threadIdx.x] = v;
    __syncthreads();
    for (unsigned w = blockDim.x / 2; w > 0; w >>= 1) {
        if (threadIdx.x < w) sh[threadIdx.x] = gt_nanmax(sh[threadIdx.x], sh[threadIdx.x + w]);
        __syncthreads();
    }
    float r = sh[0];
    __syncthreads();
    return r;
}

/* Reports bad data at `pos` (bound `limit`) for op; the lowest position wins. */
__device__ __forceinline__ void gt_flag(unsigned long long *flag, int op, int64_t pos,
                                        int64_t limit)
{
    unsigned long long prev = atomicCAS(&flag[0], 0ull, (unsigned long long)op + 1);
    if (prev == 0 || prev == (unsigned long long)op + 1) {
        atomicMin(&flag[1], (unsigned long long)pos);
        flag[2] = (unsigned long long)limit;
    }
}

/* 16-byte vectors of T (element i, a multiple of n, of a 16-byte aligned tensor): n values, loaded
 * widened to f32 (exact) and stored rounded to nearest even with the streaming hint (evict-first:
 * outputs of bandwidth-bound passes that are not read again soon). The void case is the generic
 * path (mixed dtypes, unaligned pointers): one value through gt_ld / gt_st with the run-time
 * dtype. */
template <typename T> struct gt_vec16;

template <> struct gt_vec16<__nv_bfloat16> {
    static constexpr int n = 8;
    typedef uint4 raw;
    static __device__ __forceinline__ raw ld(const void *p, int, int64_t i)
    {
        return *(const uint4 *)((const __nv_bfloat16 *)p + i);
    }
    static __device__ __forceinline__ void to_f32(const raw &r, float *f)
    {
        const __nv_bfloat162 *h = (const __nv_bfloat162 *)&r;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            float2 x = __bfloat1622float2(h[k]);
            f[2 * k] = x.x;
            f[2 * k + 1] = x.y;
        }
    }
    static __device__ __forceinline__ void st(void *p, int, int64_t i, const float *f)
    {
        uint4 r;
        __nv_bfloat162 *h = (__nv_bfloat162 *)&r;
#pragma unroll
        for (int k = 0; k < 4; k++)
            h[k] = __floats2bfloat162_rn(f[2 * k], f[2 * k + 1]);
        __stcs((uint4 *)((__nv_bfloat16 *)p + i), r);
    }
};

template <> struct gt_vec16<__half> {
    static constexpr int n = 8;
    typedef uint4 raw;
    static __device__ __forceinline__ raw ld(const void *p, int, int64_t i)
    {
        return *(const uint4 *)((const __half *)p + i);
    }
    static __device__ __forceinline__ void to_f32(const raw &r, float *f)
    {
        const __half2 *h = (const __half2 *)&r;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            float2 x = __half22float2(h[k]);
            f[2 * k] = x.x;
            f[2 * k + 1] = x.y;
        }
    }
    static __device__ __forceinline__ void st(void *p, int, int64_t i, const float *f)
    {
        uint4 r;
        __half2 *h = (__half2 *)&r;
#pragma unroll
        for (int k = 0; k < 4; k++)
            h[k] = __floats2half2_rn(f[2 * k], f[2 * k + 1]);
        __stcs((uint4 *)((__half *)p + i), r);
    }
};

template <> struct gt_vec16<float> {
    static constexpr int n = 4;
    typedef float4 raw;
    static __device__ __forceinline__ raw ld(const void *p, int, int64_t i)
    {
        return *(const float4 *)((const float *)p + i);
    }
    static __device__ __forceinline__ void to_f32(const raw &r, float *f)
    {
        f[0] = r.x;
        f[1] = r.y;
        f[2] = r.z;
        f[3] = r.w;
    }
    static __device__ __forceinline__ void st(void *p, int, int64_t i, const float *f)
    {
        __stcs((float4 *)((float *)p + i), make_float4(f[0], f[1], f[2], f[3]));
    }
};

template <> struct gt_vec16<void> {
    static constexpr int n = 1;
    typedef float raw;
    static __device__ __forceinline__ raw ld(const void *p, int dt, int64_t i)
    {
        return gt_ld(p, dt, i);
    }
    static __device__ __forceinline__ void to_f32(const raw &r, float *f) { f[0] = r; }
    static __device__ __forceinline__ void st(void *p, int dt, int64_t i, const float *f)
    {
        gt_st(p, dt, i, f[0]);
    }
};

#define GT_GRID_STRIDE(i, n)                                                                       \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                      \
         i += (int64_t)gridDim.x * blockDim.x)
#endif

#endif
