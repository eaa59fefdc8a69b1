/* cuda_flash_fwd.cu — bf16 flash attention forward (see cuda_flash.cuh).
 *
 * One block of 8 warps (4 for d = 128) per (batch * head, tile of 16 x warps queries); warp w owns
 * query rows 16w..16w+15 and keeps its Q fragments, the running max m, partial sum l and the output
 * accumulator O in registers. Key tiles of 64 go through shared memory in index order (causal: only
 * tiles up to the diagonal), double-buffered: cp.async brings tile j + 1 while tile j is
 * multiplied. Per tile, with x = S * scale * log2 e: m' = max(m, max_j x_j);  p_j = 2^(x_j - m');
 * l' = l 2^(m - m') + sum_j p_j; O' = O 2^(m - m') + P V   (P rounded to bf16 for the tensor cores,
 * as FlashAttention-2). Each thread holds a quarter of two rows; l stays a per-thread partial until
 * the end, then the quad adds it by a fixed butterfly. out = O / l, lse = (m + log2 l) ln 2. The
 * query head h reads kv head h / (hq / hkv) directly (GQA without repeating k, v). Query tiles run
 * last-first so the long causal rows start early. */
#include "cuda_flash.cuh"

#include <math.h>

#define GT_FWD_BK 64

/* Warps per block (each owns 16 query rows): 8 (128-query tiles) for d <= 64, where K/V tiles are
 * shared by more rows per shared-memory byte; 4 for d = 128 (register-bound). */
template <int D> struct gt_flash_fwd_cfg {
    static constexpr int warps = D <= 64 ? 8 : 4;
    static constexpr int bq = 16 * warps; /* launch bounds ask for 2 blocks per SM (<= 128 regs) */
    static constexpr int ld = D + GT_FLASH_PAD;
    /* two stages of K and V tiles; the Q tile goes through the K stages first */
    static constexpr size_t smem = sizeof(__nv_bfloat16) * 4 * GT_FWD_BK * ld;
};

template <int D>
__global__ void __launch_bounds__(32 * gt_flash_fwd_cfg<D>::warps, 2) gt_k_flash_fwd(gt_flash f)
{
    constexpr int BQ = gt_flash_fwd_cfg<D>::bq, BK = GT_FWD_BK, LD = D + GT_FLASH_PAD;
    extern __shared__ __align__(16) unsigned char gt_flash_sm[];
    /* stage st: K tile at sm + 2 st BK LD, V tile right after it */
    __nv_bfloat16 *sm = (__nv_bfloat16 *)gt_flash_sm;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int64_t bh = blockIdx.y, bi = bh / f.hq, h = bh - bi * f.hq;
    int64_t kh = bi * f.hkv + h / (f.hq / f.hkv);
    int64_t q0 = (int64_t)(gridDim.x - 1 - blockIdx.x) * BQ;
    const __nv_bfloat16 *kp = f.k + kh * f.t * D, *vp = f.v + kh * f.t * D;

    /* Q tile through shared memory (BQ <= 2 BK rows: the K and V of stage 0) into A fragments. */
    gt_flash_load<BQ, D>(sm, f.q + bh * f.s * D, q0, f.s);
    __syncthreads();
    uint32_t qf[D / 16][4];
#pragma unroll
    for (int kc = 0; kc < D / 16; kc++)
        gt_frag_a(qf[kc], sm, LD, warp * 16, kc * 16, lane);
    __syncthreads();

    float o[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; n++)
        o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    int64_t rw = q0 + warp * 16 + lane / 4; /* this thread's rows: rw and rw + 8 */
    int cq = (lane % 4) * 2;
    int64_t kend = f.causal ? min(f.t, q0 + BQ) : f.t;
    /* Double buffer: tile j + 1 streams in by cp.async while tile j is multiplied. */
    gt_flash_load_async<BK, D>(sm, kp, 0, f.t);
    gt_flash_load_async<BK, D>(sm + BK * LD, vp, 0, f.t);
    gt_cp_commit();
    int st = 0;
    for (int64_t k0 = 0; k0 < kend; k0 += BK, st ^= 1) {
        if (k0 + BK < kend) {
            __nv_bfloat16 *nx = sm + 2 * (st ^ 1) * BK * LD;
            gt_flash_load_async<BK, D>(nx, kp, k0 + BK, f.t);
            gt_flash_load_async<BK, D>(nx + BK * LD, vp, k0 + BK, f.t);
        }
        gt_cp_commit(); /* possibly empty: keeps one group per iteration */
        gt_cp_wait<1>();
        __syncthreads();
        const __nv_bfloat16 *ks = sm + 2 * st * BK * LD, *vs = ks + BK * LD;
        /* Causal: a warp whose rows all precede the tile skips it (every key masked: the update
         * would be the identity, m, l and O keep their bits). */
        if (!(f.causal && k0 > q0 + warp * 16 + 15)) {
            float sc[BK / 8][4];
#pragma unroll
            for (int n = 0; n < BK / 8; n++)
                sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
#pragma unroll
            for (int n = 0; n < BK / 8; n += 2)
#pragma unroll
                for (int kc = 0; kc < D / 16; kc++) {
                    uint32_t b[4];
                    gt_frag_bt2(b, ks, LD, n * 8, kc * 16, lane);
                    gt_mma_bf16(sc[n], qf[kc], b[0], b[1]);
                    gt_mma_bf16(sc[n + 1], qf[kc], b[2], b[3]);
                }
            /* Masks only where the tile crosses the diagonal or the end of the keys. */
            bool mask = k0 + BK > f.t || (f.causal && k0 + BK - 1 > q0 + warp * 16);
            float mx[2] = {m[0], m[1]};
#pragma unroll
            for (int n = 0; n < BK / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float x = sc[n][e] * f.scale_log2;
                    if (mask) {
                        int64_t key = k0 + n * 8 + cq + (e & 1), row = rw + (e >> 1) * 8;
                        if (key >= f.t || (f.causal && key > row)) x = -INFINITY;
                    }
                    sc[n][e] = x;
                    mx[e >> 1] = fmaxf(mx[e >> 1], x);
                }
            float alpha[2], ref[2];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
                mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
                ref[i] = mx[i] == -INFINITY ? 0.0f : mx[i]; /* a row that has seen nothing: p = 0 */
                alpha[i] = exp2f(m[i] - ref[i]);            /* 0 while m = -inf */
                m[i] = mx[i];
            }
            float sum[2] = {0.0f, 0.0f};
#pragma unroll
            for (int n = 0; n < BK / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float p = exp2f(sc[n][e] - ref[e >> 1]);
                    sc[n][e] = p;
                    sum[e >> 1] += p;
                }
#pragma unroll
            for (int i = 0; i < 2; i++)
                l[i] = l[i] * alpha[i] + sum[i];
#pragma unroll
            for (int n = 0; n < D / 8; n++) {
                o[n][0] *= alpha[0];
                o[n][1] *= alpha[0];
                o[n][2] *= alpha[1];
                o[n][3] *= alpha[1];
            }
#pragma unroll
            for (int kc = 0; kc < BK / 16; kc++) {
                uint32_t pa[4];
                gt_c_to_a(pa, sc[2 * kc], sc[2 * kc + 1]);
#pragma unroll
                for (int n = 0; n < D / 8; n += 2) {
                    uint32_t b[4];
                    gt_frag_b2(b, vs, LD, kc * 16, n * 8, lane);
                    gt_mma_bf16(o[n], pa, b[0], b[1]);
                    gt_mma_bf16(o[n + 1], pa, b[2], b[3]);
                }
            }
        }
        __syncthreads(); /* the next iteration's loads overwrite this stage */
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
        /* (l0 + l1) + (l2 + l3) in every lane of the quad: same bits everywhere */
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
        int64_t row = rw + i * 8;
        if (row >= f.s) continue;
        float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
        __nv_bfloat16 *op = f.out + (bh * f.s + row) * D + cq;
#pragma unroll
        for (int n = 0; n < D / 8; n++)
            *(uint32_t *)(op + n * 8) = gt_packf(o[n][2 * i] * inv, o[n][2 * i + 1] * inv);
        if (lane % 4 == 0)
            f.lse[bh * f.s + row] =
                l[i] > 0.0f ? (m[i] + log2f(l[i])) * 0.69314718055994531f : -INFINITY;
    }
}

/* ---------------------------------------------------------------- host side */

bool gt_cuda_flash_fits(const gt_kernel_call *c, int64_t d, int64_t dv, int64_t t)
{
    if (d != dv || !(d == 16 || d == 32 || d == 64 || d == 128) || t <= 0) return false;
    for (int k = 0; k < c->n_in; k++) {
        if (((uintptr_t)c->in[k]->data & 15) != 0) return false;
        if (c->in[k]->dtype != (c->in[k]->ndim == 3 ? GT_F32 : GT_BF16)) return false;
    }
    for (int k = 0; k < c->n_out; k++) {
        if (((uintptr_t)c->out[k]->data & 15) != 0) return false;
        if (c->out[k]->dtype != (c->out[k]->ndim == 3 ? GT_F32 : GT_BF16)) return false;
    }
    return true;
}

template <int D>
static gt_status gt_flash_fwd_launch(gt_cuda_stream *s, const gt_kernel_call *c, const gt_flash *f,
                                     gt_error *err)
{
    typedef gt_flash_fwd_cfg<D> cfg;
    GT_TRY(gt_cuda_smem_limit(s, c, (const void *)gt_k_flash_fwd<D>, cfg::smem, err));
    dim3 grid((unsigned)((f->s + cfg::bq - 1) / cfg::bq), (unsigned)(f->b * f->hq));
    gt_k_flash_fwd<D><<<grid, 32 * cfg::warps, cfg::smem, s->stream>>>(*f);
    return gt_cuda_launched(c, err);
}

gt_status gt_cuda_flash_fwd(gt_cuda_stream *s, const gt_kernel_call *c, const gt_flash *f,
                            gt_error *err)
{
    switch (f->d) {
    case 16:
        return gt_flash_fwd_launch<16>(s, c, f, err);
    case 32:
        return gt_flash_fwd_launch<32>(s, c, f, err);
    case 64:
        return gt_flash_fwd_launch<64>(s, c, f, err);
    default:
        return gt_flash_fwd_launch<128>(s, c, f, err);
    }
}
