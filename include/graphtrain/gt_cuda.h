/* gt_cuda.h — the CUDA backend's C API (DESIGN.md §5): device, device memory, streams, and the
 * kernel entry point. Plain C; usable from .c files. Declared in every build; in a build without
 * CUDA (GT_HAVE_CUDA undefined) the library does not define these functions.
 *
 * A gt_cuda_stream owns a cudaStream_t plus what kernels need on it: the cuBLASLt handle and its
 * workspace, a scratch buffer for kernels with temporaries (grown with cudaMalloc when a call needs
 * more; reserve it up front to keep the step path free of allocation), a cache of the cuBLASLt
 * algorithm chosen per matmul shape (fixed once chosen: deterministic), and a device word where
 * kernels report data errors (an embedding id or a cross-entropy target out of range) — those are
 * returned by the next gt_cuda_stream_sync, since a kernel cannot fail synchronously. */
#ifndef GRAPHTRAIN_GT_CUDA_H
#define GRAPHTRAIN_GT_CUDA_H

#include "gt_backend.h"
#include "gt_core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int device;
    char name[256];
    int cc_major, cc_minor;
    int sm_count;
    size_t total_mem;
    size_t smem_per_block_optin; /* the most dynamic shared memory a block may opt into */
    size_t l2_bytes;
} gt_cuda_device_info;

/* Number of usable CUDA devices; 0 when there is none or no driver (never an error). */
int gt_cuda_device_count(void);
/* Selects `device` for the calling thread and fills info (may be NULL). */
gt_status gt_cuda_init(int device, gt_cuda_device_info *info, gt_error *err);
/* The current device's free and total memory in bytes (cudaMemGetInfo). */
gt_status gt_cuda_memory(size_t *free_bytes, size_t *total_bytes, gt_error *err);

/* Device memory (cudaMalloc / cudaFree). n == 0 gives NULL. */
gt_status gt_cuda_malloc(void **p, size_t n, gt_error *err);
void gt_cuda_free(void *p);
/* Pinned host memory (cudaHostAlloc / cudaFreeHost): device copies into it run at the link's
 * speed (39 GB/s against 13 GB/s into touched pageable memory and 1.3 GB/s into fresh pages on
 * an H200 host, 4 ranks at once). n == 0 gives NULL. */
gt_status gt_cuda_host_alloc(void **p, size_t n, gt_error *err);
void gt_cuda_host_free(void *p);
/* Pins n bytes of host memory already allocated (cudaHostRegister / cudaHostUnregister). Pages
 * touched before pin at 20-35 GB/s a process, where cudaHostAlloc of fresh memory ran at 1.2 GB/s
 * (4 processes on an H200 host); copies into it run as into gt_cuda_host_alloc's. */
gt_status gt_cuda_host_register(void *p, size_t n, gt_error *err);
void gt_cuda_host_unregister(void *p);

typedef struct gt_cuda_stream gt_cuda_stream;

gt_status gt_cuda_stream_create(gt_cuda_stream **out, gt_error *err);
void gt_cuda_stream_destroy(gt_cuda_stream *s);
/* Whether this graphtrain was built with cuDNN. Where it was, the sdpa forward of bf16 heads of 64
 * to 128 runs on cuDNN's fused flash attention (deterministic engines only), unless the stream says
 * otherwise: gt_cuda_stream_set_cudnn(s, false), or GT_CUDNN=0 in the environment when the stream
 * is created. The two paths give different bits (both deterministic): set it before a run whose
 * steps must agree bit for bit, not between them. */
bool gt_cuda_have_cudnn(void);
void gt_cuda_stream_set_cudnn(gt_cuda_stream *s, bool on);
/* Parameter initialisation on the device (cuda_init.cu): element k of a parameter as
 * gt_param_init draws it (kind: a gt_init_kind; stream: gt_hash_str of the fqn), bit for bit.
 * runs holds n_runs triples (global element, local position, count): each run's elements go to
 * dst (f32, on the device) at its local positions. Queued on s. */
typedef struct {
    int kind;
    double std, lo, hi;
    uint64_t seed, stream;
} gt_cuda_init_spec;
gt_status gt_cuda_param_init(gt_cuda_stream *s, const gt_cuda_init_spec *spec, const int64_t *runs,
                             int64_t n_runs, float *dst, gt_error *err);

/* cuBLASLt's algorithm for a large matmul shape is timed on its first call: the fastest of the
 * heuristic's candidates whose output has the bits of its first pick (cuda_matmul_tune.cu), so
 * tuning never changes a result. On unless GT_MATMUL_TUNE=0 in the environment when the stream is
 * created, or gt_cuda_stream_set_matmul_tune(s, false).
 * Each choice is appended to a cache file that later runs on the same GPU model, cuBLASLt version
 * and workspace size read instead of timing again; a cached choice is taken only when the
 * heuristic offers it still, next to the same first pick. The file: GT_MATMUL_TUNE_CACHE (empty or
 * "0": none), else $XDG_CACHE_HOME/graphtrain/matmul_tune.tsv, else
 * $HOME/.cache/graphtrain/matmul_tune.tsv; gt_cuda_stream_set_matmul_tune_cache(s, path) sets
 * another (NULL: none). A cache that cannot be read or written only costs the timing. */
void gt_cuda_stream_set_matmul_tune(gt_cuda_stream *s, bool on);
void gt_cuda_stream_set_matmul_tune_cache(gt_cuda_stream *s, const char *path);
typedef struct {
    int timed;         /* shapes whose candidates were timed */
    int cached;        /* shapes whose choice came from the cache file */
    double seconds;    /* host time the timing and the cache took */
    const char *cache; /* the cache file, or NULL */
} gt_cuda_tune_stats;
gt_cuda_tune_stats gt_cuda_stream_tune_stats(const gt_cuda_stream *s);
/* How the backend waits for the work queued on the stream before a host wait of its own (a matmul
 * shape's tuning, cuDNN's first-call check, growing the scratch): by default
 * cudaStreamSynchronize. A program whose steps hold collectives sets its NCCL-aware wait, so that
 * a dead or stuck peer becomes an error there instead of a hang; drain(NULL) restores the
 * default. */
typedef gt_status (*gt_cuda_drain_fn)(void *user, gt_error *err);
void gt_cuda_stream_set_drain(gt_cuda_stream *s, gt_cuda_drain_fn drain, void *user);
/* The underlying cudaStream_t, as void *. */
void *gt_cuda_stream_handle(gt_cuda_stream *s);
/* Ensures at least `bytes` of scratch so later kernel calls do not allocate. */
gt_status gt_cuda_stream_reserve(gt_cuda_stream *s, size_t bytes, gt_error *err);
/* Waits for the stream, then reports (and clears) a data error a kernel flagged since the last
 * sync, e.g. "embedding: id at position 7 is outside [0, 100)". */
gt_status gt_cuda_stream_sync(gt_cuda_stream *s, gt_error *err);

/* The data-error word without waiting for the whole stream: gt_cuda_stream_copy_error queues a
 * copy of it into host memory `word` (GT_CUDA_ERROR_WORDS values; pinned memory keeps the copy
 * asynchronous; it may be captured into a CUDA graph); once the copy is complete (an event after
 * it), gt_cuda_error_report(word, err) returns what gt_cuda_stream_sync would (the device word is
 * cleared only by gt_cuda_stream_sync). */
#define GT_CUDA_ERROR_WORDS 3
gt_status gt_cuda_stream_copy_error(gt_cuda_stream *s, unsigned long long *word, gt_error *err);
gt_status gt_cuda_error_report(const unsigned long long *word, gt_error *err);
/* Expert parallel's capacity overflow (cuda_moe.cu): moe_pack below the worst case checks its
 * table on the device and flags the data-error word instead of failing inside the step (CUDA
 * graphs). gt_cuda_moe_pack_site(node) tells the launcher which node it is about to launch (-1:
 * none); gt_cuda_moe_overflow_node(word) gives the flagged node back (-1: the word is not a
 * moe_pack overflow or names none), so the executor can name its layer; gt_cuda_error_report
 * gives the CPU kernel's message (the pair, the capacity and the factor needed). */
void gt_cuda_moe_pack_site(int64_t node);
int64_t gt_cuda_moe_overflow_node(const unsigned long long *word);
gt_status gt_cuda_moe_overflow_report(const unsigned long long *word, gt_error *err);

/* Copies, ordered on the stream (the host side of d2h is valid after gt_cuda_stream_sync). */
gt_status gt_cuda_memcpy_h2d(gt_cuda_stream *s, void *dst, const void *src, size_t n,
                             gt_error *err);
gt_status gt_cuda_memcpy_d2h(gt_cuda_stream *s, void *dst, const void *src, size_t n,
                             gt_error *err);

/* Tensors whose data is device memory (gt_tensor with owns_data = false; free with
 * gt_cuda_tensor_free, never gt_tensor_free). */
gt_status gt_cuda_tensor_alloc(gt_tensor *t, gt_dtype dt, int ndim, const int64_t *shape,
                               gt_error *err);
void gt_cuda_tensor_free(gt_tensor *t);
/* Device copy of a host tensor (allocates dev), and the synchronous way back into an allocated
 * host tensor of the same dtype and numel. */
gt_status gt_cuda_tensor_upload(gt_cuda_stream *s, const gt_tensor *host, gt_tensor *dev,
                                gt_error *err);
gt_status gt_cuda_tensor_download(gt_cuda_stream *s, const gt_tensor *dev, gt_tensor *host,
                                  gt_error *err);

/* Runs one kernel on `stream`, which is a gt_cuda_stream * (not a bare cudaStream_t: the stream
 * object carries the cuBLASLt handle, workspace and scratch). The tensors of `call` hold device
 * pointers; semantics are exactly those of gt_cpu_run_kernel (gt_ops.def). f32 kernels compute in
 * f32; bf16/f16 tensors are stored narrow and computed in f32 (loads widen, stores round to
 * nearest even), so mixed dtypes work as the CPU backend's widening wrapper. Asynchronous: shape
 * and attribute errors return at once; CUDA errors come back naming the op and the CUDA error. */
gt_status gt_cuda_run_kernel(const gt_kernel_call *call, void *stream, gt_error *err);

/* Multi-tensor AdamW: one launch for many adamw calls (the CUDA program's optimizer tail, whose
 * per-tensor table can be built once because the memory plan fixes every buffer address).
 *
 * gt_cuda_adamw_groupable: c is an adamw call that gt_cuda_run_kernel accepts and runs on its
 * vector path — param, moments and updates f32, the gradient f32 or bf16, every pointer 16-byte
 * aligned — with at least one element; only such calls can share a launch.
 *
 * gt_cuda_adamw_multi_create builds the launch of calls[0 .. n): each groupable, all reading the
 * same scalars and clip tensors (the same device pointers) with the same beta1, beta2 and eps,
 * each weight_decay 0 or the one nonzero value they share (GT_ERR_INVALID naming the first call
 * that is not). It keeps the calls' device pointers (the gt_tensor structs may go) in a table it
 * uploads here with a synchronous copy, so build it once, off the step path and before a CUDA
 * graph capture; the scalars and clip are read on the device at every run, so a replay sees each
 * step's values.
 *
 * gt_cuda_adamw_multi_run queues the launch on stream (a gt_cuda_stream *) without allocating or
 * synchronising (capturable). Its results are bitwise those of gt_cuda_run_kernel on each call in
 * turn as long as no call writes bytes that another call reads or writes (the caller's to ensure;
 * each call's own in-place updates are fine). */
typedef struct gt_cuda_adamw_multi gt_cuda_adamw_multi;
bool gt_cuda_adamw_groupable(const gt_kernel_call *c);
gt_status gt_cuda_adamw_multi_create(const gt_kernel_call *calls, int32_t n,
                                     gt_cuda_adamw_multi **out, gt_error *err);
gt_status gt_cuda_adamw_multi_run(const gt_cuda_adamw_multi *m, void *stream, gt_error *err);
void gt_cuda_adamw_multi_free(gt_cuda_adamw_multi *m);

#ifdef __cplusplus
}
#endif
#endif
