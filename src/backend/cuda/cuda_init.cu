/* cuda_init.cu — parameter initialisation on the device, bitwise gt_param_init's (src/models/init.c
 * on the sampler of src/core/philox.c).
 *
 * Element k of a parameter is a pure function of (seed, stream = hash of its fqn, k); this file
 * repeats that function per element, step for step: Philox4x32-10 on (index, stream, round),
 * 53-bit uniforms, the sampler's own ln and cos(2 pi x) (the same polynomials, the same order of
 * operations), Box-Muller, the truncated normal's rejection rounds, and the rounding to f32. Every
 * floating-point step is an IEEE double add, multiply, divide or square root, rounded to nearest:
 * this file is compiled with --fmad=false (CMakeLists.txt), so no multiply and add are fused, as
 * philox.c is compiled with -ffp-contract=off. Integer steps are exact on both sides. */
#include "core/philox_rounds.h"
#include "cuda_internal.h"
#include "graphtrain/gt_model.h"

__device__ static void dev_philox(uint64_t seed, uint64_t stream, uint64_t index, uint32_t round,
                                  uint32_t w[4])
{
    w[0] = (uint32_t)index, w[1] = (uint32_t)(index >> 32);
    w[2] = (uint32_t)stream, w[3] = (uint32_t)(stream >> 32) + round;
    gt_philox_rounds(w, (uint32_t)seed, (uint32_t)(seed >> 32));
}

__device__ static double dev_small_int(uint64_t v)
{
    return __longlong_as_double((long long)(0x4330000000000000ull | v)) - 0x1p52;
}

__device__ static double dev_u53(uint32_t hi, uint32_t lo)
{
    uint64_t x = (((uint64_t)hi << 32) | lo) >> 11;
    double u = (dev_small_int(x >> 32) * 0x1p32 + dev_small_int(x & 0xFFFFFFFFull)) * 0x1p-53;
    return x == 0 ? 0x1p-54 : u;
}

__device__ static double dev_log(double x)
{
    const double inv_odd[] = {1.0 / 19, 1.0 / 17, 1.0 / 15, 1.0 / 13, 1.0 / 11,
                              1.0 / 9,  1.0 / 7,  1.0 / 5,  1.0 / 3};
    const double ln2_hi = 0x1.62e42fefa0000p-1, ln2_lo = 0x1.cf79abc9e3b3ap-40;
    uint64_t b = (uint64_t)__double_as_longlong(x);
    double m = __longlong_as_double((long long)((b & 0x000FFFFFFFFFFFFFull) | 0x3FF0000000000000ull));
    double big = m > 1.4142135623730951 ? 1.0 : 0.0;
    m = m - big * 0.5 * m;
    double e = (dev_small_int(b >> 52) - 1023.0) + big;
    double s = (m - 1.0) / (m + 1.0);
    double z = s * s;
    double p = 1.0 / 21;
    for (int k = 0; k < 9; k++)
        p = p * z + inv_odd[k];
    double ln_m = 2.0 * s + 2.0 * s * (z * p);
    return e * ln2_hi + (e * ln2_lo + ln_m);
}

__device__ static double dev_cos2pi(double x)
{
    const double cos_c[] = {-1.0 / 87178291200.0, 1.0 / 479001600.0, -1.0 / 3628800.0,
                            1.0 / 40320.0,        -1.0 / 720.0,      1.0 / 24.0,
                            -0.5,                 1.0};
    const double sin_c[] = {-1.0 / 1307674368000.0, 1.0 / 6227020800.0, -1.0 / 39916800.0,
                            1.0 / 362880.0,         -1.0 / 5040.0,      1.0 / 120.0,
                            -1.0 / 6.0};
    double big = 4.0 * x + 0x1.8p52;
    uint64_t q = (uint64_t)__double_as_longlong(big) & 3;
    double t = 6.283185307179586 * (x - 0.25 * (big - 0x1.8p52));
    double z = t * t;
    double c = 1.0 / 20922789888000.0;
    double sn = 1.0 / 355687428096000.0;
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
    dev_philox(seed, stream, index, round, w);
    double ln = dev_log(dev_u53(w[0], w[1]));
    return sqrt(-2.0 * ln) * dev_cos2pi(dev_u53(w[2], w[3]));
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
                                const int64_t *first, const int64_t *g, const int64_t *l, float *dst)
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
