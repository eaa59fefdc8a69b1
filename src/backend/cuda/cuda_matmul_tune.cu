/* cuda_matmul_tune.cu — timing cuBLASLt's candidate algorithms for one matmul shape.
 *
 * The heuristic's pick (cuda_matmul.cu: its first result without split-K) is the reference. Each
 * other candidate runs on the call's own operands; it qualifies only when its output has the
 * reference's bits (a 64-bit hash of every output word, summed with integer atomics), so it adds
 * the same products in the same order. The fastest qualifying one wins. Two runs may time the
 * candidates differently and choose different kernels, but any choice gives the reference's
 * bits: a step stays bitwise run to run. Runs only outside CUDA graph capture (the warm-up step).
 * Every candidate writes the call's own output; the caller then runs the chosen kernel, which
 * writes it for good. */
#include "cuda_internal.h"

#include <stdio.h>
#include <string.h>

static __device__ unsigned long long gt_mix64(unsigned long long x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

__global__ void gt_k_hash_words(int64_t n, const uint32_t *w, unsigned long long *out)
{
    unsigned long long h = 0;
    GT_GRID_STRIDE(i, n)
    {
        h += gt_mix64(((unsigned long long)i << 32) ^ w[i]);
    }
    atomicAdd(out, h); /* integer sum: the same whatever the order */
}

/* Every byte the gemm writes (its output is contiguous). */
static size_t out_bytes(const gt_gemm *g)
{
    return (size_t)(g->batch > 1 ? g->batch * g->stride_c : g->m * g->n) * gt_dtype_size(g->dt);
}

/* ------------------------------------------------------------------ the cache file
 * Key: the GPU model, its SM count, cuBLASLt's version and the workspace size (what the
 * heuristic's candidates depend on), then the gemm. Value: the reference algorithm and the chosen
 * one as hex (cublasLtMatmulAlgo_t is plain data, valid for the same cuBLASLt version), then the
 * two times for whoever reads the file. */
#define ALGO_HEX (2 * sizeof(cublasLtMatmulAlgo_t))

static void tune_key(gt_cuda_stream *s, const gt_gemm *g, char *key, size_t cap)
{
    if (!s->tune_device[0]) {
        int dev = 0;
        cudaDeviceProp p;
        if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&p, dev) != cudaSuccess) {
            memset(&p, 0, sizeof p);
            snprintf(p.name, sizeof p.name, "unknown");
        }
        snprintf(s->tune_device, sizeof s->tune_device, "%.120s sm%d%d %d SMs cublasLt %zu", p.name,
                 p.major, p.minor, p.multiProcessorCount, cublasLtGetVersion());
        for (char *c = s->tune_device; *c; c++)
            if (*c == '\t' || *c == '\n' || *c == '\r') *c = ' ';
    }
    snprintf(key, cap, "v1 %s, workspace %zu: %d %d %lld %lld %lld %lld %lld %lld %lld %s",
             s->tune_device, s->workspace_bytes, g->ta, g->tb, (long long)g->m, (long long)g->n,
             (long long)g->k, (long long)g->batch, (long long)g->stride_a, (long long)g->stride_b,
             (long long)g->stride_c, gt_dtype_name(g->dt));
}

/* A cached value names a usable choice when its reference is still the heuristic's pick and its
 * choice still one of the candidates. */
typedef struct {
    const cublasLtMatmulHeuristicResult_t *res;
    int nres, pick, chosen;
} tune_lookup;

static bool tune_accept(const char *value, void *user)
{
    tune_lookup *l = (tune_lookup *)user;
    cublasLtMatmulAlgo_t ref, chosen;
    if (strlen(value) < 2 * ALGO_HEX + 1 || value[ALGO_HEX] != ' ' ||
        !gt_tune_cache_unhex(value, ALGO_HEX, &ref, sizeof ref) ||
        !gt_tune_cache_unhex(value + ALGO_HEX + 1, ALGO_HEX, &chosen, sizeof chosen) ||
        memcmp(&ref, &l->res[l->pick].algo, sizeof ref) != 0)
        return false;
    for (int i = 0; i < l->nres; i++)
        if (memcmp(&chosen, &l->res[i].algo, sizeof chosen) == 0) {
            l->chosen = i;
            return true;
        }
    return false;
}

/* The candidate the cache names for this shape, or -1. */
static int tune_cached(gt_cuda_stream *s, const char *key,
                       const cublasLtMatmulHeuristicResult_t *res, int nres, int pick)
{
    tune_lookup l = {res, nres, pick, -1};
    return gt_tune_cache_lookup(s->tune_cache, key, tune_accept, &l) ? l.chosen : -1;
}

/* Appends this shape's choice, unless another rank's usable one is there by now. */
static void tune_remember(gt_cuda_stream *s, const char *key,
                          const cublasLtMatmulHeuristicResult_t *res, int nres, int pick,
                          int chosen, float ref_ms, float chosen_ms)
{
    if (tune_cached(s, key, res, nres, pick) >= 0) return;
    char value[2 * ALGO_HEX + 64];
    gt_tune_cache_hex(&res[pick].algo, sizeof res[pick].algo, value);
    value[ALGO_HEX] = ' ';
    gt_tune_cache_hex(&res[chosen].algo, sizeof res[chosen].algo, value + ALGO_HEX + 1);
    snprintf(value + 2 * ALGO_HEX + 1, sizeof value - 2 * ALGO_HEX - 1, " %.3f ms %.3f ms", ref_ms,
             chosen_ms);
    gt_error err = {};
    if (gt_tune_cache_append(s->tune_cache, key, value, &err) != GT_OK && s->tune_log)
        fprintf(stderr, "matmul tune: not cached: %s\n", err.msg);
}

/* GT_MATMUL_TUNE=log: the head of a shape's line on stderr. */
static void say_shape(const gt_gemm *g)
{
    fprintf(
        stderr, "matmul tune: %lld x %lld x %lld (ta %d tb %d batch %lld %s): ", (long long)g->m,
        (long long)g->n, (long long)g->k, g->ta, g->tb, (long long)g->batch, gt_dtype_name(g->dt));
}

/* ------------------------------------------------------------------ timing */

typedef struct {
    gt_cuda_stream *s;
    const gt_cuda_matmul_call *m;
    cudaEvent_t t0, t1;
} gt_tuner;

/* Runs algorithm `algo` reps times; *ms: the mean, *hash: the output's hash after the runs. */
static bool gt_tune_run(gt_tuner *t, const cublasLtMatmulAlgo_t *algo, int reps, float *ms,
                        unsigned long long *hash)
{
    const gt_cuda_matmul_call *m = t->m;
    cudaStream_t st = t->s->stream;
    if (cudaEventRecord(t->t0, st) != cudaSuccess) return false;
    for (int r = 0; r < reps; r++)
        if (gt_cuda_matmul_launch(t->s, m, algo) != CUBLAS_STATUS_SUCCESS) return false;
    if (cudaEventRecord(t->t1, st) != cudaSuccess) return false;
    unsigned long long *h = t->s->tune_hash;
    int64_t words = (int64_t)(out_bytes(m->g) / 4);
    if (cudaMemsetAsync(h, 0, sizeof *h, st) != cudaSuccess) return false;
    gt_k_hash_words<<<gt_cuda_blocks(words), GT_CUDA_THREADS, 0, st>>>(words,
                                                                       (const uint32_t *)m->out, h);
    if (cudaMemcpyAsync(hash, h, sizeof *h, cudaMemcpyDeviceToHost, st) != cudaSuccess)
        return false;
    if (cudaStreamSynchronize(st) != cudaSuccess) return false;
    if (cudaEventElapsedTime(ms, t->t0, t->t1) != cudaSuccess) return false;
    *ms /= (float)reps;
    return true;
}

int gt_cuda_matmul_tune(gt_cuda_stream *s, const gt_cuda_matmul_call *m,
                        const cublasLtMatmulHeuristicResult_t *res, int nres, int pick)
{
    /* Only large problems: they are where the time is, and the equal hash of an output of at
     * least 2^20 elements, each a sum of at least 256 products, is what shows two kernels add
     * in the same order (a small output could agree by chance on one input and not another). */
    const gt_gemm *g = m->g;
    double macs = (double)g->m * (double)g->n * (double)g->k * (double)g->batch;
    if (out_bytes(g) % 4 || nres < 2 || g->k < 256 || (double)g->m * g->n < 1048576.0 ||
        macs < 4294967296.0)
        return pick;
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(s->stream, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusNone)
        return pick;
    double t_start = gt_now_seconds();
    char key[512];
    if (s->tune_cache) {
        tune_key(s, g, key, sizeof key);
        int c = tune_cached(s, key, res, nres, pick);
        if (c >= 0) {
            s->tune_cached++;
            s->tune_seconds += gt_now_seconds() - t_start;
            if (s->tune_log) {
                say_shape(g);
                fprintf(stderr, "#%d, from the cache %s\n", c, s->tune_cache);
            }
            return c;
        }
    }
    if (!s->tune_hash && cudaMalloc((void **)&s->tune_hash, sizeof *s->tune_hash) != cudaSuccess) {
        cudaGetLastError();
        s->tune_hash = NULL;
        return pick;
    }
    /* every earlier kernel done, through the stream's drain (NCCL-aware in a program with
     * collectives: the syncs below then wait for the tuner's own kernels alone) */
    gt_error derr = {};
    if (gt_cuda_stream_drain(s, &derr) != GT_OK) return pick; /* the next wait reports it */
    gt_tuner t = {s, m, NULL, NULL};
    int chosen = pick;
    if (cudaEventCreate(&t.t0) != cudaSuccess || cudaEventCreate(&t.t1) != cudaSuccess) goto done;
    {
        float ref_ms = 0, ms = 0;
        unsigned long long ref_hash = 0, hash = 0;
        /* a first run warms the kernel; the reps give each candidate about 5 ms */
        if (!gt_tune_run(&t, &res[pick].algo, 1, &ref_ms, &ref_hash)) goto done;
        int reps = ref_ms > 0 ? (int)(5.0f / ref_ms) : 20;
        reps = reps < 2 ? 2 : reps > 20 ? 20 : reps;
        if (!gt_tune_run(&t, &res[pick].algo, reps, &ref_ms, &ref_hash)) goto done;
        s->tuned++;
        float best_ms = ref_ms, other_ms = 0;
        int same = 0, other = -1;
        for (int i = 0; i < nres; i++) {
            if (i == pick) continue;
            if (!gt_tune_run(&t, &res[i].algo, 1, &ms, &hash) ||
                !gt_tune_run(&t, &res[i].algo, reps, &ms, &hash)) {
                cudaGetLastError();
                continue;
            }
            if (hash != ref_hash) {
                if (other < 0 || ms < other_ms) other = i, other_ms = ms;
                continue;
            }
            same++;
            if (ms < best_ms) chosen = i, best_ms = ms;
        }
        if (s->tune_log) {
            say_shape(g);
            fprintf(stderr,
                    "heuristic #%d %.3f ms, chosen #%d %.3f ms (%d of %d others with its bits)",
                    pick, ref_ms, chosen, best_ms, same, nres - 1);
            if (other >= 0) fprintf(stderr, "; fastest other bits #%d %.3f ms", other, other_ms);
            fputc('\n', stderr);
        }
        if (s->tune_cache) tune_remember(s, key, res, nres, pick, chosen, ref_ms, best_ms);
    }
done:
    if (t.t0) cudaEventDestroy(t.t0);
    if (t.t1) cudaEventDestroy(t.t1);
    cudaGetLastError();
    s->tune_seconds += gt_now_seconds() - t_start;
    return chosen;
}
