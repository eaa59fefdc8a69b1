/* cuda_flash_fwd.cu — bf16 flash attention forward (see cuda_flash.cuh).
 *
 * One block of warps per (batch * head, tile of queries); each warp owns 16 (d = 16: 32) query
 * rows and keeps their Q fragments, the running max m, partial sum l and the output accumulator O
 * in registers (gt_flash_fwd_cfg gives the shapes). Key tiles of 64 go through shared memory in
 * index order (causal: only tiles up to the diagonal), double-buffered: cp.async brings tile j + 1
 * while tile j is multiplied. Per tile, with x = S * scale * log2 e: m' = max(m, max_j x_j);  p_j =
 * 2^(x_j - m'); l' = l 2^(m - m') + sum_j p_j; O' = O 2^(m - m') + P V   (P rounded to bf16 for the
 * tensor cores, as FlashAttention-2). Each thread holds a quarter of two rows; l stays a per-thread
 * partial until the end, then the quad adds it by a fixed butterfly. out = O / l, lse = (m + log2
 * l) ln 2. The query head h reads kv head h / (hq / hkv) directly (GQA without repeating k, v).
 * Query tiles run last-first so the long causal rows start early. Only tiles that cross the
 * diagonal or the end of the keys test each score (one uniform branch per tile: a per-element test
 * compiled to predicated instructions cost the unmasked tiles a third of their issue slots). */
#include "cuda_flash.cuh"

#include <math.h>

/* Tile shape per head dim: WARPS warps of 16 MT query rows each (a key or value fragment read
 * from shared memory feeds MT products: MT = 2 halves the shared-memory traffic per product, at
 * the price of registers), BK keys per tile. */
template <int D> struct gt_flash_fwd_cfg {
    /* d = 16: 4 warps of 32 rows at 4 blocks per SM (H200, debugmodel heads: 0.184 -> 0.173 ms
     * against 8 warps of 16 rows); d = 64: 8 warps of 16 rows (32 rows per warp needs ~250
     * registers and was slower: 0.95 vs 0.85 ms at the 1B shape) */
    static constexpr int warps = D <= 64 && D != 16 ? 8 : 4;
    static constexpr int mt = D == 16 ? 2 : 1;
    static constexpr int bk = 64;
    static constexpr int min_blocks = D == 16 ? 4 : D == 128 ? 3 : 2; /* d 128: 0.71 -> 0.63 ms */
};

/* Shared memory: two stages of K and V tiles; the Q tile passes through them first. */
template <int D, int WARPS, int MT, int BK> constexpr size_t gt_flash_fwd_smem(void)
{
    return sizeof(__nv_bfloat16) * (D + GT_FLASH_PAD) *
           (4 * BK > 16 * MT * WARPS ? 4 * BK : 16 * MT * WARPS);
}

/* One key tile for a warp's 16 MT query rows: S = Q K^T, the online softmax update of m, l and O,
 * then O += P V. MASK: the tile crosses the causal diagonal or the end of the keys, and masked
 * scores become -inf (tested in 32-bit offsets from the tile's first key). */
template <int D, int MT, int BK, bool MASK>
__device__ __forceinline__ void
gt_flash_fwd_tile(const gt_flash &f, const uint32_t (&qf)[MT][D / 16][4], float (&o)[MT][D / 8][4],
                  float (&m)[MT][2], float (&l)[MT][2], const __nv_bfloat16 *ks,
                  const __nv_bfloat16 *vs, int64_t k0, int64_t qw, int lane, int64_t bi)
{
    constexpr int LD = D + GT_FLASH_PAD;
    int cq = (lane % 4) * 2;
    float sc[MT][BK / 8][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int n = 0; n < BK / 8; n++)
            sc[mt][n][0] = sc[mt][n][1] = sc[mt][n][2] = sc[mt][n][3] = 0.0f;
#pragma unroll
    for (int n = 0; n < BK / 8; n += 2)
#pragma unroll
        for (int kc = 0; kc < D / 16; kc++) {
            uint32_t b[4];
            gt_frag_bt2(b, ks, LD, n * 8, kc * 16, lane);
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                gt_mma_bf16x2(sc[mt][n], sc[mt][n + 1], qf[mt][kc], b);
            }
        }
    /* keys at or past lim (relative to k0) do not exist */
    int lim = MASK ? (int)min(f.t - k0, (int64_t)BK) : BK;
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        int rel = MASK ? (int)(qw + mt * 16 - k0) + lane / 4 : 0; /* row - k0, first row */
        /* documents: keys before a row's start (relative to k0) are masked too */
        int lo[2] = {0, 0};
        if (MASK && f.pos)
            for (int i = 0; i < 2; i++)
                lo[i] = (int)(gt_flash_start(f, bi, qw + mt * 16 + lane / 4 + i * 8) - k0);
        float mx[2] = {m[mt][0], m[mt][1]};
#pragma unroll
        for (int n = 0; n < BK / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float x = sc[mt][n][e] * f.scale_log2;
                if (MASK) {
                    int col = n * 8 + cq + (e & 1);
                    if (col >= lim || (f.causal && col > rel + (e >> 1) * 8) || col < lo[e >> 1])
                        x = -INFINITY;
                }
                sc[mt][n][e] = x;
                mx[e >> 1] = fmaxf(mx[e >> 1], x);
            }
        float alpha[2], ref[2];
#pragma unroll
        for (int i = 0; i < 2; i++) {
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
            /* a row that has seen nothing: p = 0 */
            ref[i] = mx[i] == -INFINITY ? 0.0f : mx[i];
            alpha[i] = gt_exp2(m[mt][i] - ref[i]); /* 0 while m = -inf */
            m[mt][i] = mx[i];
        }
        float sum[2] = {0.0f, 0.0f};
#pragma unroll
        for (int n = 0; n < BK / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float p = gt_exp2(sc[mt][n][e] - ref[e >> 1]);
                sc[mt][n][e] = p;
                sum[e >> 1] += p;
            }
#pragma unroll
        for (int i = 0; i < 2; i++)
            l[mt][i] = l[mt][i] * alpha[i] + sum[i];
#pragma unroll
        for (int n = 0; n < D / 8; n++) {
            o[mt][n][0] *= alpha[0];
            o[mt][n][1] *= alpha[0];
            o[mt][n][2] *= alpha[1];
            o[mt][n][3] *= alpha[1];
        }
    }
    gt_flash_acc_cb<MT, BK, D>(o, sc, vs, LD, lane);
}

template <int D, int WARPS, int MT, int BK, int MINB>
__global__ void __launch_bounds__(32 * WARPS, MINB) gt_k_flash_fwd(gt_flash f)
{
    constexpr int RW = 16 * MT, BQ = RW * WARPS, LD = D + GT_FLASH_PAD;
    extern __shared__ __align__(16) unsigned char gt_flash_sm[];
    /* stage st: K tile at sm + 2 st BK LD, V tile right after it */
    __nv_bfloat16 *sm = (__nv_bfloat16 *)gt_flash_sm;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int64_t bh = blockIdx.y, bi = bh / f.hq, h = bh - bi * f.hq;
    int64_t kvo = gt_flash_at(f.skv, bi, h / (f.hq / f.hkv)), qo = gt_flash_at(f.sq, bi, h);
    int64_t q0 = (int64_t)(gridDim.x - 1 - blockIdx.x) * BQ, qw = q0 + warp * RW;
    const __nv_bfloat16 *kp = f.k + kvo, *vp = f.v + kvo;

    /* Q tile through shared memory into A fragments (registers for the whole key loop). */
    gt_flash_load<BQ, D>(sm, f.q + qo, q0, f.s, f.sq.row);
    __syncthreads();
    uint32_t qf[MT][D / 16][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int kc = 0; kc < D / 16; kc++)
            gt_frag_a(qf[mt][kc], sm, LD, warp * RW + mt * 16, kc * 16, lane);
    __syncthreads();

    float o[MT][D / 8][4], m[MT][2], l[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int n = 0; n < D / 8; n++)
            o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.0f;
        m[mt][0] = m[mt][1] = -INFINITY;
        l[mt][0] = l[mt][1] = 0.0f;
    }
    int cq = (lane % 4) * 2;
    int64_t kend = f.causal ? min(f.t, q0 + BQ) : f.t;
    /* documents: the block starts at the key tile of its rows' first start; a warp's rows start
     * at wlo .. whi */
    int64_t blo, bhi, wlo, whi;
    gt_flash_start_range(f, bi, q0, BQ, &blo, &bhi);
    gt_flash_start_range(f, bi, qw, RW, &wlo, &whi);
    int64_t kbeg = min(blo / BK * BK, kend);
    /* Double buffer: tile j + 1 streams in by cp.async while tile j is multiplied. */
    gt_flash_load_async<BK, D, 32 * WARPS>(sm, kp, kbeg, f.t, f.skv.row);
    gt_flash_load_async<BK, D, 32 * WARPS>(sm + BK * LD, vp, kbeg, f.t, f.skv.row);
    gt_cp_commit();
    int st = 0;
    for (int64_t k0 = kbeg; k0 < kend; k0 += BK, st ^= 1) {
        if (k0 + BK < kend) {
            __nv_bfloat16 *nx = sm + 2 * (st ^ 1) * BK * LD;
            gt_flash_load_async<BK, D, 32 * WARPS>(nx, kp, k0 + BK, f.t, f.skv.row);
            gt_flash_load_async<BK, D, 32 * WARPS>(nx + BK * LD, vp, k0 + BK, f.t, f.skv.row);
        }
        gt_cp_commit(); /* possibly empty: keeps one group per iteration */
        gt_cp_wait<1>();
        __syncthreads();
        const __nv_bfloat16 *ks = sm + 2 * st * BK * LD, *vs = ks + BK * LD;
        /* Causal: a warp whose rows all precede the tile skips it (every key masked: the update
         * would be the identity). With MT = 2 the first 16 rows may precede the tile while the
         * others do not: for them every p is 0, alpha is 1 and the update leaves m, l and O as
         * they were. */
        if (!(f.causal && k0 > qw + RW - 1) && k0 + BK > wlo) {
            /* Masks only where the tile crosses the diagonal, the end of the keys or a document
             * start: one uniform branch per tile, so the common unmasked tiles carry no
             * per-element tests. */
            if (k0 + BK > f.t || (f.causal && k0 + BK - 1 > qw) || whi > k0)
                gt_flash_fwd_tile<D, MT, BK, true>(f, qf, o, m, l, ks, vs, k0, qw, lane, bi);
            else
                gt_flash_fwd_tile<D, MT, BK, false>(f, qf, o, m, l, ks, vs, k0, qw, lane, bi);
        }
        __syncthreads(); /* the next iteration's loads overwrite this stage */
    }
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int i = 0; i < 2; i++) {
            /* (l0 + l1) + (l2 + l3) in every lane of the quad: same bits everywhere */
            float li = l[mt][i];
            li += __shfl_xor_sync(0xffffffffu, li, 1);
            li += __shfl_xor_sync(0xffffffffu, li, 2);
            int64_t row = qw + mt * 16 + lane / 4 + i * 8;
            if (row >= f.s) continue;
            float inv = li > 0.0f ? 1.0f / li : 0.0f;
            __nv_bfloat16 *op = f.out + qo + row * f.sq.row + cq;
#pragma unroll
            for (int n = 0; n < D / 8; n++)
                *(uint32_t *)(op + n * 8) =
                    gt_packf(o[mt][n][2 * i] * inv, o[mt][n][2 * i + 1] * inv);
            if (lane % 4 == 0)
                f.lse[bh * f.s + row] =
                    li > 0.0f ? (m[mt][i] + log2f(li)) * 0.69314718055994531f : -INFINITY;
        }
}

/* ---------------------------------------------------------------- host side */

/* Either layout fits: a row starts (b, head, row) * D elements from the base in both, and with
 * D a multiple of 16 every row of an aligned tensor is 16-byte aligned. */
bool gt_cuda_flash_fits(const gt_kernel_call *c, int64_t d, int64_t dv, int64_t t)
{
    if (d != dv || !(d == 16 || d == 32 || d == 64 || d == 128) || t <= 0) return false;
    return gt_cuda_flash_io(c);
}

bool gt_cuda_flash_io(const gt_kernel_call *c)
{
    for (int k = 0; k < c->n_in; k++) {
        if (c->in[k]->dtype == GT_I64) continue; /* document positions: read as they are */
        if (!gt_aligned16(c->in[k]->data)) return false;
        if (c->in[k]->dtype != (c->in[k]->ndim == 3 ? GT_F32 : GT_BF16)) return false;
    }
    for (int k = 0; k < c->n_out; k++) {
        if (!gt_aligned16(c->out[k]->data)) return false;
        if (c->out[k]->dtype != (c->out[k]->ndim == 3 ? GT_F32 : GT_BF16)) return false;
    }
    return true;
}

template <int D, int WARPS, int MT, int BK, int MINB>
static gt_status gt_flash_fwd_launch_cfg(gt_cuda_stream *s, const gt_kernel_call *c,
                                         const gt_flash *f, gt_error *err)
{
    constexpr size_t smem = gt_flash_fwd_smem<D, WARPS, MT, BK>();
    constexpr int bq = 16 * MT * WARPS;
    const void *k = (const void *)gt_k_flash_fwd<D, WARPS, MT, BK, MINB>;
    GT_TRY(gt_cuda_smem_limit(s, c, k, smem, err));
    dim3 grid((unsigned)((f->s + bq - 1) / bq), (unsigned)(f->b * f->hq));
    gt_k_flash_fwd<D, WARPS, MT, BK, MINB><<<grid, 32 * WARPS, smem, s->stream>>>(*f);
    return gt_cuda_launched(c, err);
}

template <int D>
static gt_status gt_flash_fwd_launch(gt_cuda_stream *s, const gt_kernel_call *c, const gt_flash *f,
                                     gt_error *err)
{
    typedef gt_flash_fwd_cfg<D> cfg;
    return gt_flash_fwd_launch_cfg<D, cfg::warps, cfg::mt, cfg::bk, cfg::min_blocks>(s, c, f, err);
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
