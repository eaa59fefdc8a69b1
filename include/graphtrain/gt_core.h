/* gt_core.h — status and errors, logging, dtypes, host tensors, Philox RNG, hashing.
 *
 * Everything else in graphtrain builds on this header. No global mutable state except the log
 * sink (DESIGN.md §8). */
#ifndef GRAPHTRAIN_GT_CORE_H
#define GRAPHTRAIN_GT_CORE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- status and errors (§7) */

typedef enum {
    GT_OK = 0,
    GT_ERR_INVALID,     /* bad argument, flag, config value */
    GT_ERR_IO,          /* open/read/write/fsync/rename failed */
    GT_ERR_FORMAT,      /* a file's content is malformed (header, offsets, checksum) */
    GT_ERR_SHAPE,       /* shapes or dtypes do not fit an op */
    GT_ERR_NOMEM,       /* allocation failed */
    GT_ERR_UNSUPPORTED, /* valid request this build or backend cannot do */
    GT_ERR_INTERNAL,    /* a broken invariant that a user did not cause */
} gt_status;

#define GT_ERROR_MSG_MAX 1024

/* Filled by a failing function: the message names the thing (file, key, tensor, node) and what
 * was expected. The first error wins: gt_error_set on an already-set error appends context. */
typedef struct {
    gt_status code;
    char msg[GT_ERROR_MSG_MAX];
} gt_error;

/* Sets err (if non-NULL) and returns code, so callers write `return gt_error_set(err, ...)`. */
gt_status gt_error_set(gt_error *err, gt_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Prepends "context: " to an existing message (used while unwinding). Returns err->code. */
gt_status gt_error_wrap(gt_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void gt_error_clear(gt_error *err);
const char *gt_status_name(gt_status s);

/* Internal invariants only: never on anything a user can cause. Always on. */
void gt_panic(const char *file, int line, const char *what) __attribute__((noreturn));
#define GT_CHECK(cond)                                                                             \
    do {                                                                                           \
        if (!(cond)) gt_panic(__FILE__, __LINE__, #cond);                                          \
    } while (0)

#define GT_TRY(expr)                                                                               \
    do {                                                                                           \
        gt_status gt_try_status_ = (expr);                                                         \
        if (gt_try_status_ != GT_OK) return gt_try_status_;                                        \
    } while (0)

/* Allocation helpers that panic on out-of-memory for small internal structures. Large buffers
 * (tensors, arenas) use plain malloc and report GT_ERR_NOMEM. */
void *gt_xmalloc(size_t n);
void *gt_xcalloc(size_t count, size_t size);
void *gt_xrealloc(void *p, size_t n);
char *gt_xstrdup(const char *s);
/* A reusable large buffer: *p holds at least `bytes` afterwards (*have its size), grown by a fresh
 * malloc (old contents dropped), never shrunk, so a loop over tensors touches its pages once.
 * Out of memory: GT_ERR_NOMEM, *p NULL, *have 0. Free with free(*p). */
gt_status gt_buffer_reserve(void **p, size_t *have, size_t bytes, gt_error *err);

/* ---------------------------------------------------------------- logging */

typedef enum { GT_LOG_DEBUG, GT_LOG_INFO, GT_LOG_WARN, GT_LOG_ERROR } gt_log_level;
typedef void (*gt_log_sink)(gt_log_level level, const char *msg, void *user);
/* The one global: where log lines go. Default: stderr, level >= INFO. */
void gt_log_set_sink(gt_log_sink sink, void *user);
void gt_log_set_level(gt_log_level level);
void gt_log(gt_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---------------------------------------------------------------- dtypes */

typedef enum { GT_F32 = 0, GT_BF16, GT_F16, GT_I32, GT_I64, GT_BOOL, GT_DTYPE_COUNT } gt_dtype;

size_t gt_dtype_size(gt_dtype dt);
const char *gt_dtype_name(gt_dtype dt); /* "f32", "bf16", "f16", "i32", "i64", "bool" */
/* Accepts our names and the common aliases (float32, bfloat16, float16, int32, int64). */
bool gt_dtype_from_name(const char *name, gt_dtype *out);
bool gt_dtype_is_float(gt_dtype dt);
/* True when `from` is bf16 or f16 and `to` is f32: an exact widening (every bf16/f16 value is an
 * f32), so a sum of `from` values accumulated in f32 may be stored as `to` (the widening
 * reduce-scatter, gt_ops.def). */
bool gt_dtype_widens_to_f32(gt_dtype from, gt_dtype to);

/* An f32's bit pattern and back (no conversion: the same 32 bits). Always inlined: the vectorized
 * element loops (built with their own optimization options) call them. */
static inline __attribute__((always_inline)) uint32_t gt_f32_bits(float f)
{
    uint32_t u;
    __builtin_memcpy(&u, &f, sizeof u);
    return u;
}
static inline __attribute__((always_inline)) float gt_bits_f32(uint32_t u)
{
    float f;
    __builtin_memcpy(&f, &u, sizeof f);
    return f;
}

/* bf16/f16 are storage types; CPU compute is f32. Conversions round to nearest even; NaN stays
 * NaN, overflow gives inf. */
float gt_bf16_to_f32(uint16_t h);
uint16_t gt_f32_to_bf16(float f);
float gt_f16_to_f32(uint16_t h);
uint16_t gt_f32_to_f16(float f);
/* The same conversions over arrays (vectorized; bitwise the scalar ones element by element), and
 * v[i] = bf16-rounded v[i] in place (gt_bf16_to_f32(gt_f32_to_bf16(v[i]))). */
void gt_bf16_to_f32_n(const uint16_t *src, float *dst, int64_t n);
void gt_f32_to_bf16_n(const float *src, uint16_t *dst, int64_t n);
void gt_f32_round_bf16_n(float *v, int64_t n);

/* ---------------------------------------------------------------- host tensors */

#define GT_MAX_DIMS 8

/* A dense, contiguous, row-major host tensor with concrete shape. */
typedef struct {
    gt_dtype dtype;
    int ndim;
    int64_t shape[GT_MAX_DIMS];
    void *data;
    bool owns_data;
} gt_tensor;

int64_t gt_shape_numel(int ndim, const int64_t *shape);
int64_t gt_tensor_numel(const gt_tensor *t);
size_t gt_tensor_nbytes(const gt_tensor *t);
/* Allocates zeroed storage; GT_ERR_NOMEM with the byte count on failure. */
gt_status gt_tensor_alloc(gt_tensor *t, gt_dtype dt, int ndim, const int64_t *shape, gt_error *err);
/* Wraps caller-owned memory. */
void gt_tensor_wrap(gt_tensor *t, gt_dtype dt, int ndim, const int64_t *shape, void *data);
void gt_tensor_free(gt_tensor *t);
/* Element i as f32 / stored from f32 (any float or int dtype). For tests and slow paths. */
float gt_tensor_get_f32(const gt_tensor *t, int64_t i);
void gt_tensor_set_f32(gt_tensor *t, int64_t i, float v);
/* Converts src into dst (same numel, any dtypes). */
void gt_tensor_convert(const gt_tensor *src, gt_tensor *dst);
/* "f32[2, 3]" */
int gt_tensor_format_type(const gt_tensor *t, char *buf, size_t n);

/* ---------------------------------------------------------------- Philox RNG (§6) */

/* Philox4x32-10 (Salmon et al. 2011): counter-based, so element i of a stream is computable alone.
 * graphtrain keys every random tensor by (seed, stream, element index); stream is a 64-bit hash of
 * the parameter fqn, so a shard initialises exactly the slice of the full tensor it holds. */
void gt_philox4x32(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4]);

/* Four uniform 32-bit words for (seed, stream, index, round). round lets one element draw again
 * (rejection sampling) without touching the counters of its neighbours. */
void gt_rng_bits(uint64_t seed, uint64_t stream, uint64_t index, uint32_t round, uint32_t out[4]);
/* Uniform in (0, 1): never 0, never 1. */
double gt_rng_uniform(uint64_t seed, uint64_t stream, uint64_t index, uint32_t round);
/* ln x (x a positive normal double) and cos(2 pi x) (x in [0, 1]) from +, -, *, / alone in a
 * fixed order: the same bits on every machine, unlike libm's, within a few ulps of the truth. */
double gt_rng_log(double x);
double gt_rng_cos2pi(double x);
/* Standard normal: Box–Muller on two 53-bit uniforms of round `round` (words 0-1 and 2-3), with
 * gt_rng_log and gt_rng_cos2pi. */
double gt_rng_normal(uint64_t seed, uint64_t stream, uint64_t index, uint32_t round);
/* out[k] = gt_rng_normal(seed, stream, index + k, 0) for k < n, bit for bit, several times faster
 * (elements drawn side by side). */
void gt_rng_normal_n(uint64_t seed, uint64_t stream, uint64_t index, int64_t n, double *out);
/* Normal(mean, std) restricted to [lo, hi] by rejection (rounds 0, 1, 2, …), as
 * torch.nn.init.trunc_normal_ samples the same distribution. */
double gt_rng_trunc_normal(uint64_t seed, uint64_t stream, uint64_t index, double mean, double std,
                           double lo, double hi);

/* ---------------------------------------------------------------- hashing */

/* xxHash64 (libxxhash). Used for RNG streams, interning and checksums. */
uint64_t gt_hash64(const void *data, size_t n, uint64_t seed);
uint64_t gt_hash_str(const char *s);

/* Seconds on the monotonic clock (for durations and deadlines; src/core/clock.c). */
double gt_now_seconds(void);

/* mkdir -p DIR (src/core/dirs.c): every missing folder of the path; an error names the one that
 * cannot be made, or a part that exists and is no folder. */
gt_status gt_make_dirs(const char *dir, gt_error *err);
/* "dir/name", allocated (the caller frees it; src/core/dirs.c). */
char *gt_path_join(const char *dir, const char *name);

/* The CPUs this process may run on (its affinity mask; src/core/cpus.c). */
int gt_cpu_count(void);

/* Runs job(i, user, err) for every i in [0, n) on up to `threads` threads (this one included;
 * src/core/cpus.c), each taking the next index. Every job runs, whatever another returned. The
 * result is that of the failed job of lowest index (its message in err), so it does not depend on
 * the threads' timing; GT_OK when none failed. A thread that cannot be started leaves its share
 * to the others. */
typedef gt_status (*gt_job_fn)(int i, void *user, gt_error *err);
gt_status gt_run_jobs(int n, int threads, gt_job_fn job, void *user, gt_error *err);

#ifdef __cplusplus
}
#endif
#endif
