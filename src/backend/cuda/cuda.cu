/* cuda.cu — the CUDA backend's runtime: devices, memory, streams (with their cuBLASLt handle,
 * workspace, scratch and data-error word), argument checks and the kernel dispatch. */
#include "cuda_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* cuBLASLt workspace: enough for the algorithms the heuristic offers at llama shapes. */
#define GT_CUDA_WORKSPACE (32u << 20)

typedef gt_status (*gt_cuda_kernel)(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err);

typedef struct {
    gt_cuda_kernel fn;
    int n_in, n_out;
} gt_cuda_entry;

static const gt_cuda_entry gt_cuda_table[GT_OP_COUNT] = {
#define X(E, name, nin, nout, flags, rule, alias, pairs, recompute, schema)                        \
    {gt_cuda_##name, nin, nout},
#include "graphtrain/gt_ops.def"
#undef X
};

/* ---------------------------------------------------------------- devices and memory */

extern "C" int gt_cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); /* clear the sticky "no device" error */
        return 0;
    }
    return n;
}

extern "C" gt_status gt_cuda_memory(size_t *free_bytes, size_t *total_bytes, gt_error *err)
{
    cudaError_t e = cudaMemGetInfo(free_bytes, total_bytes);
    if (e != cudaSuccess)
        return gt_error_set(err, GT_ERR_INTERNAL, "cuda: cudaMemGetInfo: %s",
                            cudaGetErrorString(e));
    return GT_OK;
}

extern "C" gt_status gt_cuda_init(int device, gt_cuda_device_info *info, gt_error *err)
{
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess)
        return gt_error_set(err, GT_ERR_UNSUPPORTED, "cuda: cannot use device %d: %s", device,
                            cudaGetErrorString(e));
    if (!info) return GT_OK;
    cudaDeviceProp p;
    e = cudaGetDeviceProperties(&p, device);
    if (e != cudaSuccess)
        return gt_error_set(err, GT_ERR_INTERNAL, "cuda: properties of device %d: %s", device,
                            cudaGetErrorString(e));
    memset(info, 0, sizeof *info);
    info->device = device;
    snprintf(info->name, sizeof info->name, "%s", p.name);
    info->cc_major = p.major;
    info->cc_minor = p.minor;
    info->sm_count = p.multiProcessorCount;
    info->total_mem = p.totalGlobalMem;
    info->smem_per_block_optin = p.sharedMemPerBlockOptin;
    info->l2_bytes = (size_t)p.l2CacheSize;
    return GT_OK;
}

extern "C" gt_status gt_cuda_malloc(void **p, size_t n, gt_error *err)
{
    *p = NULL;
    if (n == 0) return GT_OK;
    cudaError_t e = cudaMalloc(p, n);
    if (e != cudaSuccess) {
        *p = NULL;
        return gt_error_set(err, GT_ERR_NOMEM, "cuda: cudaMalloc of %zu bytes failed: %s", n,
                            cudaGetErrorString(e));
    }
    return GT_OK;
}

extern "C" void gt_cuda_free(void *p)
{
    if (p) cudaFree(p);
}

extern "C" gt_status gt_cuda_host_alloc(void **p, size_t n, gt_error *err)
{
    *p = NULL;
    if (n == 0) return GT_OK;
    cudaError_t e = cudaHostAlloc(p, n, cudaHostAllocDefault);
    if (e != cudaSuccess) {
        *p = NULL;
        return gt_error_set(err, GT_ERR_NOMEM, "cuda: cudaHostAlloc of %zu bytes failed: %s", n,
                            cudaGetErrorString(e));
    }
    return GT_OK;
}

extern "C" void gt_cuda_host_free(void *p)
{
    if (p) cudaFreeHost(p);
}

extern "C" gt_status gt_cuda_host_register(void *p, size_t n, gt_error *err)
{
    if (!p || n == 0) return GT_OK;
    cudaError_t e = cudaHostRegister(p, n, cudaHostRegisterDefault);
    if (e != cudaSuccess) {
        cudaGetLastError(); /* not sticky: clear it */
        return gt_error_set(err, GT_ERR_NOMEM, "cuda: cudaHostRegister of %zu bytes failed: %s", n,
                            cudaGetErrorString(e));
    }
    return GT_OK;
}

extern "C" void gt_cuda_host_unregister(void *p)
{
    if (p) cudaHostUnregister(p);
}

/* ---------------------------------------------------------------- streams */

extern "C" gt_status gt_cuda_stream_create(gt_cuda_stream **out, gt_error *err)
{
    *out = NULL;
    gt_cuda_stream *s = (gt_cuda_stream *)calloc(1, sizeof *s);
    if (!s) return gt_error_set(err, GT_ERR_NOMEM, "cuda: out of memory for a stream");
    cudaError_t e = cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        free(s);
        return gt_error_set(err, GT_ERR_UNSUPPORTED, "cuda: cudaStreamCreate: %s",
                            cudaGetErrorString(e));
    }
    /* GT_CUDNN=0: graphtrain's own attention kernels (to compare against cuDNN's) */
    const char *cudnn = getenv("GT_CUDNN");
    s->cudnn_off = cudnn && strcmp(cudnn, "0") == 0;
    /* GT_MATMUL_TUNE=0: the heuristic's pick for every matmul shape, untimed; =log: tune and
     * print each large shape's candidates (cuda_matmul_tune.cu) */
    const char *tune = getenv("GT_MATMUL_TUNE");
    s->tune_log = tune && strcmp(tune, "log") == 0;
    s->tune = !(tune && strcmp(tune, "0") == 0);
    s->tune_cache = gt_tune_cache_default_path(); /* GT_MATMUL_TUNE_CACHE, or the user's cache */
    gt_status st = GT_OK;
    if (cublasLtCreate(&s->lt) != CUBLAS_STATUS_SUCCESS) {
        s->lt = NULL;
        st = gt_error_set(err, GT_ERR_UNSUPPORTED, "cuda: cublasLtCreate failed");
    }
    if (st == GT_OK) st = gt_cuda_malloc(&s->workspace, GT_CUDA_WORKSPACE, err);
    if (st == GT_OK) s->workspace_bytes = GT_CUDA_WORKSPACE;
    if (st == GT_OK) st = gt_cuda_malloc((void **)&s->flag, 4 * sizeof *s->flag, err);
    if (st == GT_OK) {
        unsigned long long init[4] = {0, ~0ull, 0, 0};
        e = cudaMemcpy(s->flag, init, sizeof init, cudaMemcpyHostToDevice);
        int dev = 0;
        if (e == cudaSuccess) e = cudaGetDevice(&dev);
        if (e == cudaSuccess)
            e = cudaDeviceGetAttribute(&s->smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                       dev);
        if (e != cudaSuccess)
            st =
                gt_error_set(err, GT_ERR_INTERNAL, "cuda: stream setup: %s", cudaGetErrorString(e));
    }
    if (st != GT_OK) {
        gt_cuda_stream_destroy(s);
        return st;
    }
    *out = s;
    return GT_OK;
}

extern "C" void gt_cuda_stream_destroy(gt_cuda_stream *s)
{
    if (!s) return;
    if (s->stream) cudaStreamSynchronize(s->stream);
    gt_cudnn_free(s->cudnn);
    gt_cuda_free(s->scratch);
    gt_cuda_free(s->workspace);
    gt_cuda_free(s->flag);
    gt_cuda_free(s->tune_hash);
    if (s->lt) cublasLtDestroy(s->lt);
    if (s->stream) cudaStreamDestroy(s->stream);
    free(s->tune_cache);
    free(s);
}

extern "C" void gt_cuda_stream_set_drain(gt_cuda_stream *s, gt_cuda_drain_fn drain, void *user)
{
    s->drain = drain;
    s->drain_user = user;
}

gt_status gt_cuda_stream_drain(gt_cuda_stream *s, gt_error *err)
{
    if (s->drain) return s->drain(s->drain_user, err);
    cudaError_t e = cudaStreamSynchronize(s->stream);
    if (e != cudaSuccess)
        return gt_error_set(err, GT_ERR_INTERNAL, "cuda: waiting for the stream: %s",
                            cudaGetErrorString(e));
    return GT_OK;
}

extern "C" void gt_cuda_stream_set_matmul_tune(gt_cuda_stream *s, bool on)
{
    s->tune = on;
}

extern "C" void gt_cuda_stream_set_matmul_tune_cache(gt_cuda_stream *s, const char *path)
{
    free(s->tune_cache);
    s->tune_cache = path && path[0] ? gt_xstrdup(path) : NULL;
}

extern "C" gt_cuda_tune_stats gt_cuda_stream_tune_stats(const gt_cuda_stream *s)
{
    gt_cuda_tune_stats r = {s->tuned, s->tune_cached, s->tune_seconds, s->tune_cache};
    return r;
}

extern "C" void *gt_cuda_stream_handle(gt_cuda_stream *s)
{
    return (void *)s->stream;
}

extern "C" gt_status gt_cuda_stream_reserve(gt_cuda_stream *s, size_t bytes, gt_error *err)
{
    if (bytes <= s->scratch_bytes) return GT_OK;
    /* The old buffer may still be read by queued kernels: wait before freeing it. */
    GT_TRY(gt_cuda_stream_drain(s, err));
    gt_cuda_free(s->scratch);
    s->scratch = NULL;
    s->scratch_bytes = 0;
    GT_TRY(gt_cuda_malloc(&s->scratch, bytes, err));
    s->scratch_bytes = bytes;
    return GT_OK;
}

extern "C" gt_status gt_cuda_stream_sync(gt_cuda_stream *s, gt_error *err)
{
    cudaError_t e = cudaStreamSynchronize(s->stream);
    if (e != cudaSuccess)
        return gt_error_set(err, GT_ERR_INTERNAL, "cuda: stream synchronize: %s",
                            cudaGetErrorString(e));
    unsigned long long f[3];
    e = cudaMemcpy(f, s->flag, sizeof f, cudaMemcpyDeviceToHost);
    if (e != cudaSuccess)
        return gt_error_set(err, GT_ERR_INTERNAL, "cuda: reading the error word: %s",
                            cudaGetErrorString(e));
    if (f[0] == 0) return GT_OK;
    unsigned long long init[3] = {0, ~0ull, 0};
    cudaMemcpy(s->flag, init, sizeof init, cudaMemcpyHostToDevice);
    return gt_cuda_error_report(f, err);
}

extern "C" gt_status gt_cuda_stream_copy_error(gt_cuda_stream *s, unsigned long long *word,
                                               gt_error *err)
{
    cudaError_t e = cudaMemcpyAsync(word, s->flag, GT_CUDA_ERROR_WORDS * sizeof *word,
                                    cudaMemcpyDeviceToHost, s->stream);
    if (e != cudaSuccess)
        return gt_error_set(err, GT_ERR_INTERNAL, "cuda: copying the error word: %s",
                            cudaGetErrorString(e));
    return GT_OK;
}

extern "C" gt_status gt_cuda_error_report(const unsigned long long *f, gt_error *err)
{
    if (f[0] == 0) return GT_OK;
    gt_op op = (gt_op)((f[0] & 0xffffull) - 1); /* moe_pack packs more into the high bits */
    if (op == GT_OP_MOE_PACK) return gt_cuda_moe_overflow_report(f, err);
    bool target = op == GT_OP_CROSS_ENTROPY || op == GT_OP_CROSS_ENTROPY_BACKWARD ||
                  op == GT_OP_CROSS_ENTROPY_WITH_GRAD;
    return gt_error_set(err, GT_ERR_INVALID, "%s: %s %llu is outside [0, %llu)%s",
                        gt_kernel_op_name(op), target ? "target at row" : "id at position", f[1],
                        f[2], target ? " and not the ignore_index" : "");
}

extern "C" gt_status gt_cuda_memcpy_h2d(gt_cuda_stream *s, void *dst, const void *src, size_t n,
                                        gt_error *err)
{
    if (n == 0) return GT_OK;
    cudaError_t e = cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, s->stream);
    if (e != cudaSuccess)
        return gt_error_set(err, GT_ERR_INTERNAL, "cuda: host-to-device copy of %zu bytes: %s", n,
                            cudaGetErrorString(e));
    return GT_OK;
}

extern "C" gt_status gt_cuda_memcpy_d2h(gt_cuda_stream *s, void *dst, const void *src, size_t n,
                                        gt_error *err)
{
    if (n == 0) return GT_OK;
    cudaError_t e = cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, s->stream);
    if (e != cudaSuccess)
        return gt_error_set(err, GT_ERR_INTERNAL, "cuda: device-to-host copy of %zu bytes: %s", n,
                            cudaGetErrorString(e));
    return GT_OK;
}

extern "C" gt_status gt_cuda_tensor_alloc(gt_tensor *t, gt_dtype dt, int ndim, const int64_t *shape,
                                          gt_error *err)
{
    gt_tensor_wrap(t, dt, ndim, shape, NULL);
    void *p = NULL;
    GT_TRY(gt_cuda_malloc(&p, gt_tensor_nbytes(t), err));
    t->data = p;
    t->owns_data = false;
    return GT_OK;
}

extern "C" void gt_cuda_tensor_free(gt_tensor *t)
{
    gt_cuda_free(t->data);
    t->data = NULL;
}

extern "C" gt_status gt_cuda_tensor_upload(gt_cuda_stream *s, const gt_tensor *host, gt_tensor *dev,
                                           gt_error *err)
{
    GT_TRY(gt_cuda_tensor_alloc(dev, host->dtype, host->ndim, host->shape, err));
    gt_status st = gt_cuda_memcpy_h2d(s, dev->data, host->data, gt_tensor_nbytes(host), err);
    /* The host buffer may be freed right after: wait for the copy. */
    if (st == GT_OK) st = gt_cuda_stream_sync(s, err);
    if (st != GT_OK) gt_cuda_tensor_free(dev);
    return st;
}

extern "C" gt_status gt_cuda_tensor_download(gt_cuda_stream *s, const gt_tensor *dev,
                                             gt_tensor *host, gt_error *err)
{
    if (host->dtype != dev->dtype || gt_tensor_numel(host) != gt_tensor_numel(dev))
        return gt_error_set(err, GT_ERR_SHAPE,
                            "cuda: download of a %s tensor of %lld elements into %s of %lld",
                            gt_dtype_name(dev->dtype), (long long)gt_tensor_numel(dev),
                            gt_dtype_name(host->dtype), (long long)gt_tensor_numel(host));
    GT_TRY(gt_cuda_memcpy_d2h(s, host->data, dev->data, gt_tensor_nbytes(dev), err));
    return gt_cuda_stream_sync(s, err);
}

/* ---------------------------------------------------------------- helpers for the launchers */

gt_status gt_cuda_check(const gt_kernel_call *c, cudaError_t e, const char *what, gt_error *err)
{
    if (e == cudaSuccess) return GT_OK;
    return gt_error_set(err, GT_ERR_INTERNAL, "%s: %s: CUDA error %s", gt_kernel_op_name(c->op),
                        what, cudaGetErrorString(e));
}

gt_status gt_cuda_launched(const gt_kernel_call *c, gt_error *err)
{
    return gt_cuda_check(c, cudaGetLastError(), "kernel launch", err);
}

gt_status gt_cuda_smem_limit(gt_cuda_stream *s, const gt_kernel_call *c, const void *fn,
                             size_t bytes, gt_error *err)
{
    if (bytes > (size_t)s->smem_optin)
        return gt_error_set(err, GT_ERR_UNSUPPORTED,
                            "%s: a kernel needs %zu bytes of shared memory, the device allows %d",
                            gt_kernel_op_name(c->op), bytes, s->smem_optin);
    for (int i = 0; i < s->n_smem_raised; i++)
        if (s->smem_raised[i] == fn) return GT_OK;
    /* the dynamic limit is what the device allows a block less the kernel's static shared
     * memory (asking for more is an invalid argument) */
    cudaFuncAttributes fa;
    GT_TRY(gt_cuda_check(c, cudaFuncGetAttributes(&fa, fn), "shared-memory limit", err));
    int dyn = s->smem_optin - (int)fa.sharedSizeBytes;
    if (bytes > (size_t)(dyn > 0 ? dyn : 0))
        return gt_error_set(err, GT_ERR_UNSUPPORTED,
                            "%s: a kernel needs %zu bytes of shared memory beside its %zu static "
                            "ones, the device allows %d in all",
                            gt_kernel_op_name(c->op), bytes, (size_t)fa.sharedSizeBytes,
                            s->smem_optin);
    GT_TRY(gt_cuda_check(c,
                         cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, dyn),
                         "shared-memory limit", err));
    if (s->n_smem_raised < GT_CUDA_SMEM_KERNELS) s->smem_raised[s->n_smem_raised++] = fn;
    return GT_OK;
}

gt_status gt_cuda_scratch(gt_cuda_stream *s, const gt_kernel_call *c, size_t bytes, void **out,
                          gt_error *err)
{
    if (bytes > s->scratch_bytes) {
        /* Growing means a sync and a cudaMalloc: impossible inside a CUDA graph capture. The
         * warm-up step sizes the scratch, so this names a step that is not the captured one. */
        cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
        if (cudaStreamIsCapturing(s->stream, &cs) == cudaSuccess &&
            cs != cudaStreamCaptureStatusNone)
            return gt_error_set(err, GT_ERR_UNSUPPORTED,
                                "%s: needs %zu bytes of scratch during CUDA graph capture, %zu "
                                "reserved (run the step once before capturing it)",
                                gt_kernel_op_name(c->op), bytes, s->scratch_bytes);
        size_t grow = bytes > 2 * s->scratch_bytes ? bytes : 2 * s->scratch_bytes;
        gt_status st = gt_cuda_stream_reserve(s, grow, err);
        if (st != GT_OK) return gt_error_wrap(err, "%s: scratch", gt_kernel_op_name(c->op));
    }
    *out = s->scratch;
    return GT_OK;
}

unsigned gt_cuda_blocks(int64_t n)
{
    int64_t b = (n + GT_CUDA_THREADS - 1) / GT_CUDA_THREADS;
    if (b < 1) b = 1;
    if (b > 65536) b = 65536; /* grid-stride loops cover the rest */
    return (unsigned)b;
}

gt_status gt_cuda_shape_error(const gt_kernel_call *c, const char *what, gt_error *err)
{
    char bi[128] = "none", bo[128] = "none";
    if (c->n_in > 0) gt_kernel_fmt(c->in[0], bi, sizeof bi);
    if (c->n_out > 0) gt_kernel_fmt(c->out[0], bo, sizeof bo);
    return gt_error_set(err, GT_ERR_SHAPE, "%s: %s (input 0 %s, output 0 %s)",
                        gt_kernel_op_name(c->op), what, bi, bo);
}

bool gt_cuda_broadcast_strides(int on, const int64_t *out, int xn, const int64_t *xs,
                               int64_t *strides)
{
    if (xn > on) return false;
    int64_t xstr[GT_MAX_DIMS];
    gt_kernel_contig_strides(xn, xs, xstr);
    for (int d = 0; d < on; d++) {
        int xd = d - (on - xn);
        if (xd < 0 || (xs[xd] == 1 && out[d] != 1)) {
            strides[d] = 0;
        } else if (xs[xd] == out[d]) {
            strides[d] = xstr[xd];
        } else {
            return false;
        }
    }
    return true;
}

/* ---------------------------------------------------------------- dispatch */

gt_status gt_cuda_check_call(const gt_kernel_call *c, gt_error *err)
{
    if (!c || (unsigned)c->op >= GT_OP_COUNT)
        return gt_error_set(err, GT_ERR_INVALID, "cuda kernel: unknown op %d", c ? (int)c->op : -1);
    return gt_kernel_check_call(c, gt_cuda_table[c->op].n_in, gt_cuda_table[c->op].n_out, err);
}

extern "C" gt_status gt_cuda_run_kernel(const gt_kernel_call *c, void *stream, gt_error *err)
{
    GT_TRY(gt_cuda_check_call(c, err));
    if (!stream)
        return gt_error_set(err, GT_ERR_INVALID, "%s: no gt_cuda_stream given",
                            gt_kernel_op_name(c->op));
    return gt_cuda_table[c->op].fn((gt_cuda_stream *)stream, c, err);
}
