/* cuda_init.cu — parameter initialisation on the device, bitwise gt_param_init's (src/models/init.c
 * on the sampler of src/core/philox.c).
 *
 * Element k of a parameter is a pure function of (seed, stream = hash of its fqn, k); this file
 * computes it per element, step for step: Philox4x32-10 on (index, stream, round) and the 53-bit
 * uniforms from src/core/rng_shared.h (philox.c's own), the sampler's ln and cos(2 pi x) one
 * element at a time (philox.c runs them over vector lanes: the same coefficients, from that
 * header, in the same order of operations), Box-Muller, the truncated normal's rejection rounds,
 * and the rounding to f32. Every
 * floating-point step is an IEEE double add, multiply, divide or square root, rounded to nearest:
 * this file is compiled with --fmad=false (CMakeLists.txt), so no multiply and add are fused, as
 * philox.c is compiled with -ffp-contract=off. Integer steps are exact on both sides. */
#include "core/rng_shared.h"
#include "cuda_internal.h"
#include "graphtrain/gt_init.h"

/* philox.c's log_lanes, one element */
__device__ static double dev_log(double x)
{
    const double inv_odd[] = GT_RNG_LOG_INV_ODD;
    uint64_t b = gt_rng_to_bits(x);
    double m = gt_rng_from_bits((b & 0x000FFFFFFFFFFFFFull) | 0x3FF0000000000000ull);
    double big = m > 1.4142135623730951 ? 1.0 : 0.0;
    m = m - big * 0.5 * m;
    double e = (gt_rng_small_int(b >> 52) - 1023.0) + big;
    double s = (m - 1.0) / (m + 1.0);
    double z = s * s;
    double p = GT_RNG_LOG_FIRST;
    for (int k = 0; k < 9; k++)
        p = p * z + inv_odd[k];
    double ln_m = 2.0 * s + 2.0 * s * (z * p);
    return e * GT_RNG_LN2_HI + (e * GT_RNG_LN2_LO + ln_m);
}

/* philox.c's cos2pi_lanes, one element */
__device__ static double dev_cos2pi(double x)
{
    const double cos_c[] = GT_RNG_COS_C;
    const double sin_c[] = GT_RNG_SIN_C;
    double big = 4.0 * x + 0x1.8p52;
    uint64_t q = gt_rng_to_bits(big) & 3;
    double t = 6.283185307179586 * (x - 0.25 * (big - 0x1.8p52));
    double z = t * t;
    double c = GT_RNG_COS_FIRST;
    double sn = GT_RNG_SIN_FIRST;
    for (int k = 0; k < 8; k++)
        c = c * z + cos_c[k];
    for (int k = 0; k < 7; k++)
        sn = sn * z + sin_c[k];
    double sv = t + t * (z * sn);
    double v = q & 1 ? sv : c;
    return (q + 1) & 2 ? -v : v;
}

__device__ static double dev_normal(uint64_t seed, uint64_t stream, uint64_t index, uint32_t round)
{
    uint32_t w[4];
    gt_philox_bits(seed, stream, index, round, w);
    double ln = dev_log(gt_u53(w[0], w[1]));
    return sqrt(-2.0 * ln) * dev_cos2pi(gt_u53(w[2], w[3]));
}

/* gt_param_init's value of element k, before its rounding to f32 */
__device__ static double dev_draw(const gt_cuda_init_spec &p, uint64_t k)
{
    switch (p.kind) {
    case GT_INIT_ONES:
        return 1.0;
    case GT_INIT_ZEROS:
        return 0.0;
    case GT_INIT_NORMAL:
        return p.std * dev_normal(p.seed, p.stream, k, 0);
    default: /* GT_INIT_TRUNC_NORMAL: gt_rng_trunc_normal with mean 0 */
        break;
    }
    if (!(p.std > 0.0)) return 0.0 < p.lo ? p.lo : (0.0 > p.hi ? p.hi : 0.0);
    double x = 0.0;
    for (uint32_t round = 0; round < 1000u; round++) {
        x = 0.0 + p.std * dev_normal(p.seed, p.stream, k, round);
        if (x >= p.lo && x <= p.hi) return x;
    }
    return x < p.lo ? p.lo : (x > p.hi ? p.hi : x);
}

/* Element i of the runs laid end to end: run r holds [first[r], first[r + 1]) of them, global
 * element g[r] + (i - first[r]) of the parameter at local position l[r] + (i - first[r]). */
__global__ void gt_k_param_init(gt_cuda_init_spec p, int64_t total, int64_t n_runs,
                                const int64_t *first, const int64_t *g, const int64_t *l,
                                float *dst)
{
    GT_GRID_STRIDE(i, total)
    {
        int64_t lo = 0, hi = n_runs - 1; /* the last run whose first <= i */
        while (lo < hi) {
            int64_t mid = (lo + hi + 1) / 2;
            if (first[mid] <= i)
                lo = mid;
            else
                hi = mid - 1;
        }
        int64_t d = i - first[lo];
        dst[l[lo] + d] = (float)dev_draw(p, (uint64_t)(g[lo] + d));
    }
}

extern "C" gt_status gt_cuda_param_init(gt_cuda_stream *s, const gt_cuda_init_spec *spec,
                                        const int64_t *runs, int64_t n_runs, float *dst,
                                        gt_error *err)
{
    if (n_runs <= 0) return GT_OK;
    /* the table on the device: first[n_runs + 1], g[n_runs], l[n_runs] */
    size_t words = (size_t)(3 * n_runs + 1);
    int64_t *host = (int64_t *)gt_xmalloc(words * sizeof *host);
    int64_t *first = host, *g = host + n_runs + 1, *l = g + n_runs;
    first[0] = 0;
    for (int64_t r = 0; r < n_runs; r++) {
        g[r] = runs[3 * r];
        l[r] = runs[3 * r + 1];
        first[r + 1] = first[r] + runs[3 * r + 2];
    }
    int64_t total = first[n_runs];
    int64_t *dev = NULL;
    cudaError_t e = cudaMallocAsync((void **)&dev, words * sizeof *dev, s->stream);
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(dev, host, words * sizeof *dev, cudaMemcpyHostToDevice, s->stream);
    if (e == cudaSuccess && total > 0) {
        gt_k_param_init<<<gt_cuda_blocks(total), GT_CUDA_THREADS, 0, s->stream>>>(
            *spec, total, n_runs, dev, dev + n_runs + 1, dev + 2 * n_runs + 1, dst);
        e = cudaGetLastError();
    }
    if (dev) {
        cudaError_t f = cudaFreeAsync(dev, s->stream);
        if (e == cudaSuccess) e = f;
    }
    /* the pageable source of cudaMemcpyAsync is read before it returns */
    free(host);
    if (e != cudaSuccess)
        return gt_error_set(err, GT_ERR_INTERNAL, "cuda: parameter initialisation: %s",
                            cudaGetErrorString(e));
    return GT_OK;
}
