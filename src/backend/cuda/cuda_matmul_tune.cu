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
            fprintf(stderr,
                    "matmul tune: %lld x %lld x %lld (ta %d tb %d batch %lld %s): heuristic #%d "
                    "%.3f ms, chosen #%d %.3f ms (%d of %d others with its bits)",
                    (long long)g->m, (long long)g->n, (long long)g->k, g->ta, g->tb,
                    (long long)g->batch, gt_dtype_name(g->dt), pick, ref_ms, chosen, best_ms, same,
                    nres - 1);
            if (other >= 0) fprintf(stderr, "; fastest other bits #%d %.3f ms", other, other_ms);
            fputc('\n', stderr);
        }
    }
done:
    if (t.t0) cudaEventDestroy(t.t0);
    if (t.t1) cudaEventDestroy(t.t1);
    cudaGetLastError();
    return chosen;
}
