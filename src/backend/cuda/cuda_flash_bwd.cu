/* cuda_flash_bwd.cu — bf16 flash attention backward (see cuda_flash.cuh), deterministic.
 *
 * With P = exp(S - lse) recomputed tile by tile (x = S scale log2 e, p = 2^(x - lse log2 e)):
 *   D_i = sum_c dO_ic O_ic                           kernel 1, 8 lanes per row, fixed tree
 *   dP = dO V^T;  dS = P * (dP - D_i)
 *   dV_j = sum_i P_ij dO_i;  dK_j = scale sum_i dS_ij Q_i
 *        kernel 2: one block per (batch, kv head, 64 keys), warp w owns keys 16w..16w+15 and keeps
 *        dK, dV in registers (tile shapes: gt_flash_bwd_cfg); it loops over the group's query heads
 * in order, then query tiles in order (causal: from the diagonal on), so every dK/dV sum has one
 * owner and one order. dQ_i = scale sum_j dS_ij K_j kernel 3: one block per (batch, head, 64
 * queries), warp w owns 16 queries, key tiles in order; it recomputes S and dP (two more products
 * than FlashAttention-2's atomic dQ, the price of determinism without a dS buffer of size s x t).
 * Both kernels double-buffer the streamed tiles (Q, dO, lse, D resp. K, V) with cp.async, so tile
 * j + 1 loads while tile j is multiplied; fragments come from shared memory by ldmatrix.
 * Kernel 1 also writes lse2_i = lse_i log2 e (+inf for a row that saw no key, so that
 * p = 2^(x - lse2) is 0 there without a test), and only warp tiles that cross the causal diagonal
 * or the end of the queries / keys evaluate the mask (one uniform branch per tile): elsewhere P
 * and dS cost one fma, one exp2 and two multiply-adds per element.
 * Products use mma.sync m16n8k16 bf16 with f32 accumulation; P and dS are rounded to bf16 as
 * operands of the second product, as FlashAttention-2 does. */
#include "cuda_flash.cuh"

#include <math.h>

static constexpr float GT_LOG2E = 1.4426950408889634f;

/* D_i with 8 lanes per row (a warp does 4 rows): lane sums its 8 products in order, then a fixed
 * xor butterfly over the 8 lanes (row length D = 8 * 8 at most 128: lanes loop over columns).
 * blockIdx.y is the (batch, head) bh, so a row's O and dO are at one base plus i * row stride. */
template <int D> __global__ void gt_k_flash_dsum(gt_flash f, float *dsum, float *lse2)
{
    int64_t i = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 8;
    int64_t bh = blockIdx.y, bi = bh / f.hq, row = bh * f.s + i; /* row of lse, D, lse2 */
    int sub = threadIdx.x % 8;
    float acc = 0.0f;
    if (i < f.s) {
        int64_t at = gt_flash_at(f.sq, bi, bh - bi * f.hq) + i * f.sq.row;
        for (int c = sub * 8; c < D; c += 64) {
            uint4 a = *(const uint4 *)(f.o + at + c), b = *(const uint4 *)(f.g + at + c);
            const __nv_bfloat16 *pa = (const __nv_bfloat16 *)&a, *pb = (const __nv_bfloat16 *)&b;
#pragma unroll
            for (int e = 0; e < 8; e++)
                acc = fmaf(__bfloat162float(pb[e]), __bfloat162float(pa[e]), acc);
        }
    }
    acc += __shfl_xor_sync(0xffffffffu, acc, 1);
    acc += __shfl_xor_sync(0xffffffffu, acc, 2);
    acc += __shfl_xor_sync(0xffffffffu, acc, 4);
    if (i < f.s && sub == 0) {
        dsum[row] = acc;
        float l = f.lse[row];
        lse2[row] = l == -INFINITY ? INFINITY : l * GT_LOG2E;
    }
}

/* P and dS of a 16 x (8 NT) tile in C layout (sc holds S, dp holds dP on entry): sc becomes P and
 * dp becomes dS. The tile's rows start at r0 and its columns at c0 (absolute). KEYS_ARE_ROWS (the
 * dK/dV kernel): rows are keys, columns queries, and lse2 / D of query column ci are in shared
 * memory (lsm, dsm, and with documents their positions psm); otherwise rows are queries with this
 * thread's two rows' values in lr[2], dr[2] and, with documents, their starts in sr[2] (indexed
 * by constants once unrolled: they stay in registers). MASK: the tile may hold invisible pairs
 * (past the causal diagonal, past s or t), whose P and dS become 0; the tests run in 32-bit offsets
 * from the tile's corner. */
template <int NT, bool KEYS_ARE_ROWS, bool MASK>
__device__ __forceinline__ void gt_flash_p_ds(const gt_flash &f, float (*sc)[4], float (*dp)[4],
                                              int64_t r0, int64_t c0, int lane, const float *lsm,
                                              const float *dsm, const long long *psm,
                                              const float *lr, const float *dr, const int64_t *sr)
{
    /* rows at or past rlim and columns at or past clim do not exist; a pair is past the causal
     * diagonal when key - query > 0, i.e. (ri - ci) > dk for key rows, (ci - ri) > dk otherwise */
    int rlim = 0, clim = 0, dk = 0;
    if (MASK) {
        rlim = (int)min((KEYS_ARE_ROWS ? f.t : f.s) - r0, (int64_t)16);
        clim = (int)min((KEYS_ARE_ROWS ? f.s : f.t) - c0, (int64_t)NT * 8);
        dk = (int)(KEYS_ARE_ROWS ? c0 - r0 : r0 - c0);
    }
#pragma unroll
    for (int n = 0; n < NT; n++) {
        float2 lc = make_float2(0.0f, 0.0f), dc = lc;
        if (KEYS_ARE_ROWS) { /* columns n * 8 + 2 (lane % 4) + 0, 1: one 8-byte load each */
            lc = *(const float2 *)(lsm + n * 8 + (lane % 4) * 2);
            dc = *(const float2 *)(dsm + n * 8 + (lane % 4) * 2);
        }
#pragma unroll
        for (int e = 0; e < 4; e++) {
            float l2 = KEYS_ARE_ROWS ? ((e & 1) ? lc.y : lc.x) : lr[e >> 1];
            float dd = KEYS_ARE_ROWS ? ((e & 1) ? dc.y : dc.x) : dr[e >> 1];
            float p = gt_exp2(fmaf(sc[n][e], f.scale_log2, -l2));
            if (MASK) {
                int ri = lane / 4 + (e >> 1) * 8, ci = n * 8 + (lane % 4) * 2 + (e & 1);
                bool past = KEYS_ARE_ROWS ? ri - ci > dk : ci - ri > dk;
                bool vis = ri < rlim && ci < clim && !(f.causal && past);
                if (vis && f.pos) {    /* documents: a key before its query's document start */
                    if (KEYS_ARE_ROWS) /* query c0 + ci starts at c0 + ci - psm[ci] */
                        vis = r0 + ri >= c0 + ci - psm[ci];
                    else
                        vis = c0 + ci >= sr[e >> 1];
                }
                p = vis ? p : 0.0f;
            }
            sc[n][e] = p;
            dp[n][e] = p * (dp[n][e] - dd);
        }
    }
}

/* Tile shapes per head dim. dK/dV kernel: WARPS warps of 16 KMT keys each, query tiles of BQ.
 * dQ kernel: WARPS warps of 16 QMT queries each, key tiles of BK. A fragment read from shared
 * memory feeds MT products (MT = 2: half the shared-memory traffic per product, more registers).
 * keep_kv: the K and V A fragments of the dK/dV kernel stay in registers across the query loop.
 * Every sum keeps its order under any of these shapes (k-steps of 16 in index order), so they
 * change speed, not bits. */
template <int D> struct gt_flash_bwd_cfg {
    /* Measured on an H200 (scratch harness, bitwise the same results for every shape): d = 64 at
     * the 1B shape 64-wide tiles at 3 blocks per SM 2.19 ms (32-wide at 4 blocks: 2.35, 16-wide:
     * 2.74, 32 keys per warp: 2.60); d = 128: 32-query tiles at 2 blocks per SM for dK/dV and
     * 64-key tiles at 1 for dQ (2.47 ms; 32/32 at 1: 2.54); d = 16 and 32: 64-wide tiles with the
     * K and V fragments kept in registers. */
    static constexpr int kv_warps = 4, kmt = 1, bq = D == 128 ? 32 : 64;
    static constexpr bool keep_kv = D < 64;
    static constexpr int kv_min_blocks = D == 16 ? 4 : D == 128 ? 2 : 3;
    static constexpr int q_warps = 4, qmt = 1, bk = 64;
    static constexpr int q_min_blocks = D == 16 ? 4 : D == 128 ? 1 : 3;
};

/* Shared memory of the dK/dV kernel: K and V tiles, then two stages of (Q, dO, lse, D, and the
 * queries' document positions: masked tiles read a query's start there, not from global memory). */
template <int D, int WARPS, int MT, int BQ> struct gt_flash_dkdv_smem {
    static constexpr int bk = 16 * MT * WARPS, ld = D + GT_FLASH_PAD;
    static constexpr int stage = 2 * BQ * ld * 2 + 2 * BQ * 4 + BQ * 8; /* bytes, 16 | stage */
    static constexpr size_t bytes = (size_t)2 * bk * ld * 2 + 2 * (size_t)stage;
};

template <int D, int WARPS, int MT, int BQ, bool KEEP_KV, int MINB>
__global__ void __launch_bounds__(32 * WARPS, MINB) gt_k_flash_dkdv(gt_flash f)
{
    typedef gt_flash_dkdv_smem<D, WARPS, MT, BQ> sm_;
    constexpr int RK = 16 * MT, BK = sm_::bk, LD = sm_::ld, KV = KEEP_KV ? MT * (D / 16) : 1;
    extern __shared__ __align__(16) unsigned char gt_flash_sm[];
    __nv_bfloat16 *ks = (__nv_bfloat16 *)gt_flash_sm, *vs = ks + BK * LD;
    unsigned char *stages = (unsigned char *)(vs + BK * LD);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int64_t bkh = blockIdx.y, bi = bkh / f.hkv, kvh = bkh - bi * f.hkv, group = f.hq / f.hkv;
    int64_t k0 = (int64_t)(gridDim.x - 1 - blockIdx.x) * BK, kw = k0 + warp * RK;
    int64_t qstart = f.causal ? (k0 / BQ) * BQ : 0, qend = f.s;
    if (f.pos) { /* documents: no query after the last one whose document reaches these keys */
        __shared__ unsigned long long qlast;
        if (threadIdx.x == 0) qlast = 0;
        __syncthreads();
        unsigned long long mine = 0;
        for (int64_t i = qstart + threadIdx.x; i < f.s; i += blockDim.x)
            if (gt_flash_start(f, bi, i) <= k0 + BK - 1) mine = (unsigned long long)i + 1;
        atomicMax(&qlast, mine); /* a max: the same value whatever the order */
        __syncthreads();
        qend = (int64_t)qlast;
    }
    int64_t nq = qend > qstart ? (qend - qstart + BQ - 1) / BQ : 0, total = group * nq;
    /* Iteration it = (query head hh = it / nq of the group, query tile it % nq): its Q, dO, lse
     * and D go to stage it % 2 by cp.async (rows past s are zeros; p_ds masks them). */
    auto issue = [&](int64_t it) {
        unsigned char *sb = stages + (it & 1) * sm_::stage;
        __nv_bfloat16 *qs = (__nv_bfloat16 *)sb, *gs = qs + BQ * LD;
        float *lsm = (float *)(gs + BQ * LD), *dsm = lsm + BQ;
        long long *psm = (long long *)(dsm + BQ);
        int64_t h = kvh * group + it / nq, bh = bi * f.hq + h, q0 = qstart + (it % nq) * BQ;
        int64_t qo = gt_flash_at(f.sq, bi, h);
        gt_flash_load_async<BQ, D, 32 * WARPS>(qs, f.q + qo, q0, f.s, f.sq.row);
        gt_flash_load_async<BQ, D, 32 * WARPS>(gs, f.g + qo, q0, f.s, f.sq.row);
        for (int r = threadIdx.x; r < BQ; r += blockDim.x) {
            bool in = q0 + r < f.s;
            int64_t at = in ? bh * f.s + q0 + r : 0;
            gt_cp_async4(lsm + r, f.lse2 + at, in);
            gt_cp_async4(dsm + r, f.dsum + at, in);
            if (f.pos) gt_cp_async8(psm + r, f.pos + (in ? bi * f.s + q0 + r : 0), in);
        }
    };
    int64_t kvo = gt_flash_at(f.skv, bi, kvh);
    gt_flash_load_async<BK, D, 32 * WARPS>(ks, f.k + kvo, k0, f.t, f.skv.row);
    gt_flash_load_async<BK, D, 32 * WARPS>(vs, f.v + kvo, k0, f.t, f.skv.row);
    if (total > 0) issue(0);
    gt_cp_commit();
    gt_cp_wait<0>();
    __syncthreads();
    uint32_t kf[KV][4], vf[KV][4];
    if (KEEP_KV) {
#pragma unroll
        for (int i = 0; i < KV; i++) { /* i = mt * (D / 16) + kc */
            gt_frag_a(kf[i], ks, LD, warp * RK + (i / (D / 16)) * 16, (i % (D / 16)) * 16, lane);
            gt_frag_a(vf[i], vs, LD, warp * RK + (i / (D / 16)) * 16, (i % (D / 16)) * 16, lane);
        }
    }
    float dk[MT][D / 8][4], dv[MT][D / 8][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int n = 0; n < D / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                dk[mt][n][e] = dv[mt][n][e] = 0.0f;
    for (int64_t it = 0; it < total; it++) {
        if (it + 1 < total) issue(it + 1);
        gt_cp_commit(); /* possibly empty: one group per iteration */
        gt_cp_wait<1>();
        __syncthreads();
        int64_t q0 = qstart + (it % nq) * BQ;
        unsigned char *sb = stages + (it & 1) * sm_::stage;
        const __nv_bfloat16 *qs = (const __nv_bfloat16 *)sb, *gs = qs + BQ * LD;
        const float *lsm = (const float *)(gs + BQ * LD), *dsm = lsm + BQ;
        const long long *psm = (const long long *)(dsm + BQ);
        /* causal: every key of this warp is in the future of the tile (with MT = 2 the later 16
         * keys may be while the first are not: their P and dS are masked to 0, adding nothing) */
        int64_t qlo, qhi; /* the tile's queries' document starts (0, 0 without documents) */
        gt_flash_start_range(f, bi, q0, BQ, &qlo, &qhi);
        if (!(f.causal && kw > q0 + BQ - 1) && qlo <= kw + RK - 1) {
            /* S^T = K Q^T and dP^T = V dO^T: RK keys x BQ queries; k-steps outer, so the K and V
             * A fragments of step kc serve every column block (each accumulator still adds its
             * k-steps in index order). */
            float sc[MT][BQ / 8][4], dp[MT][BQ / 8][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int n = 0; n < BQ / 8; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        sc[mt][n][e] = dp[mt][n][e] = 0.0f;
#pragma unroll
            for (int kc = 0; kc < D / 16; kc++) {
                uint32_t ka[MT][4], va[MT][4];
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    if (KEEP_KV) {
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            ka[mt][e] = kf[KEEP_KV ? mt * (D / 16) + kc : 0][e];
                            va[mt][e] = vf[KEEP_KV ? mt * (D / 16) + kc : 0][e];
                        }
                    } else {
                        gt_frag_a(ka[mt], ks, LD, warp * RK + mt * 16, kc * 16, lane);
                        gt_frag_a(va[mt], vs, LD, warp * RK + mt * 16, kc * 16, lane);
                    }
                }
#pragma unroll
                for (int n = 0; n < BQ / 8; n += 2) {
                    uint32_t b[4];
                    gt_frag_bt2(b, qs, LD, n * 8, kc * 16, lane);
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        gt_mma_bf16x2(sc[mt][n], sc[mt][n + 1], ka[mt], b);
                    }
                    gt_frag_bt2(b, gs, LD, n * 8, kc * 16, lane);
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        gt_mma_bf16x2(dp[mt][n], dp[mt][n + 1], va[mt], b);
                    }
                }
            }
            bool mask =
                q0 + BQ > f.s || kw + RK > f.t || (f.causal && kw + RK - 1 > q0) || qhi > kw;
            /* one uniform branch: only tiles that need it test each pair */
            if (mask) {
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
                    gt_flash_p_ds<BQ / 8, true, true>(f, sc[mt], dp[mt], kw + mt * 16, q0, lane,
                                                      lsm, dsm, psm, nullptr, nullptr, nullptr);
            } else {
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
                    gt_flash_p_ds<BQ / 8, true, false>(f, sc[mt], dp[mt], kw + mt * 16, q0, lane,
                                                       lsm, dsm, psm, nullptr, nullptr, nullptr);
            }
            /* dV += P^T dO, dK += dS^T Q (k-steps over the tile's queries in order). */
#pragma unroll
            for (int kc = 0; kc < BQ / 16; kc++) {
                uint32_t pa[MT][4], sa[MT][4];
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    gt_c_to_a(pa[mt], sc[mt][2 * kc], sc[mt][2 * kc + 1]);
                    gt_c_to_a(sa[mt], dp[mt][2 * kc], dp[mt][2 * kc + 1]);
                }
#pragma unroll
                for (int n = 0; n < D / 8; n += 2) {
                    uint32_t b[4];
                    gt_frag_b2(b, gs, LD, kc * 16, n * 8, lane);
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        gt_mma_bf16x2(dv[mt][n], dv[mt][n + 1], pa[mt], b);
                    }
                    gt_frag_b2(b, qs, LD, kc * 16, n * 8, lane);
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        gt_mma_bf16x2(dk[mt][n], dk[mt][n + 1], sa[mt], b);
                    }
                }
            }
        }
        __syncthreads(); /* the next iteration's loads overwrite this stage */
    }
    int cq = (lane % 4) * 2;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int i = 0; i < 2; i++) {
            int64_t key = kw + mt * 16 + lane / 4 + i * 8;
            if (key >= f.t) continue;
            __nv_bfloat16 *kp = f.dk + kvo + key * f.skv.row + cq,
                          *vp = f.dv + kvo + key * f.skv.row + cq;
#pragma unroll
            for (int n = 0; n < D / 8; n++) {
                *(uint32_t *)(kp + n * 8) =
                    gt_packf(f.scale * dk[mt][n][2 * i], f.scale * dk[mt][n][2 * i + 1]);
                *(uint32_t *)(vp + n * 8) = gt_packf(dv[mt][n][2 * i], dv[mt][n][2 * i + 1]);
            }
        }
}

/* Shared memory of the dQ kernel: two stages of (K, V) tiles; Q and dO pass through first. */
template <int D, int WARPS, int MT, int BK> constexpr size_t gt_flash_dq_smem(void)
{
    return sizeof(__nv_bfloat16) * (D + GT_FLASH_PAD) *
           (4 * BK > 2 * 16 * MT * WARPS ? 4 * BK : 2 * 16 * MT * WARPS);
}

template <int D, int WARPS, int MT, int BK, int MINB>
__global__ void __launch_bounds__(32 * WARPS, MINB) gt_k_flash_dq(gt_flash f)
{
    constexpr int RW = 16 * MT, BQ = RW * WARPS, LD = D + GT_FLASH_PAD;
    extern __shared__ __align__(16) unsigned char gt_flash_sm[];
    __nv_bfloat16 *sm = (__nv_bfloat16 *)gt_flash_sm; /* stage st: K at sm + 2 st BK LD, V after */
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int64_t bh = blockIdx.y, bi = bh / f.hq, h = bh - bi * f.hq;
    int64_t kvo = gt_flash_at(f.skv, bi, h / (f.hq / f.hkv)), qo = gt_flash_at(f.sq, bi, h);
    int64_t q0 = (int64_t)(gridDim.x - 1 - blockIdx.x) * BQ, qw = q0 + warp * RW;
    const __nv_bfloat16 *kp = f.k + kvo, *vp = f.v + kvo;
    /* Q and dO fragments through shared memory (registers for the whole key loop). */
    uint32_t qf[MT][D / 16][4], gf[MT][D / 16][4];
    gt_flash_load<BQ, D>(sm, f.q + qo, q0, f.s, f.sq.row);
    gt_flash_load<BQ, D>(sm + BQ * LD, f.g + qo, q0, f.s, f.sq.row);
    __syncthreads();
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int kc = 0; kc < D / 16; kc++) {
            gt_frag_a(qf[mt][kc], sm, LD, warp * RW + mt * 16, kc * 16, lane);
            gt_frag_a(gf[mt][kc], sm + BQ * LD, LD, warp * RW + mt * 16, kc * 16, lane);
        }
    __syncthreads();
    float lse2[MT][2], dd[MT][2];
    int64_t sr[MT][2]; /* the rows' document starts: masked tiles test keys against them */
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int i = 0; i < 2; i++) {
            int64_t row = qw + mt * 16 + lane / 4 + i * 8;
            lse2[mt][i] = row < f.s ? f.lse2[bh * f.s + row] : INFINITY;
            dd[mt][i] = row < f.s ? f.dsum[bh * f.s + row] : 0.0f;
            sr[mt][i] = gt_flash_start(f, bi, row); /* 0 past s or without documents */
        }
    float dq[MT][D / 8][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int n = 0; n < D / 8; n++)
            dq[mt][n][0] = dq[mt][n][1] = dq[mt][n][2] = dq[mt][n][3] = 0.0f;
    int64_t kend = f.causal ? min(f.t, q0 + BQ) : f.t;
    /* documents: from the key tile of the block's first start; a warp's rows start at wlo..whi */
    int64_t blo, bhi, wlo, whi;
    gt_flash_start_range(f, bi, q0, BQ, &blo, &bhi);
    gt_flash_start_range(f, bi, qw, RW, &wlo, &whi);
    int64_t kbeg = min(blo / BK * BK, kend);
    /* Double buffer: key tile j + 1 streams in by cp.async while tile j is multiplied. */
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
        gt_cp_commit();
        gt_cp_wait<1>();
        __syncthreads();
        const __nv_bfloat16 *ks = sm + 2 * st * BK * LD, *vs = ks + BK * LD;
        /* causal: this warp's queries see none of these keys (with MT = 2 the first 16 may see
         * none while the others do: their P and dS are masked to 0, adding nothing) */
        if (!(f.causal && k0 > qw + RW - 1) && k0 + BK > wlo) {
            float sc[MT][BK / 8][4], dp[MT][BK / 8][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int n = 0; n < BK / 8; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        sc[mt][n][e] = dp[mt][n][e] = 0.0f;
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
                    gt_frag_bt2(b, vs, LD, n * 8, kc * 16, lane);
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        gt_mma_bf16x2(dp[mt][n], dp[mt][n + 1], gf[mt][kc], b);
                    }
                }
            bool mask =
                qw + RW > f.s || k0 + BK > f.t || (f.causal && k0 + BK - 1 > qw) || whi > k0;
            if (mask) {
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
                    gt_flash_p_ds<BK / 8, false, true>(f, sc[mt], dp[mt], qw + mt * 16, k0, lane,
                                                       nullptr, nullptr, nullptr, lse2[mt], dd[mt],
                                                       sr[mt]);
            } else {
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
                    gt_flash_p_ds<BK / 8, false, false>(f, sc[mt], dp[mt], qw + mt * 16, k0, lane,
                                                        nullptr, nullptr, nullptr, lse2[mt], dd[mt],
                                                        sr[mt]);
            }
            gt_flash_acc_cb<MT, BK, D>(dq, dp, ks, LD, lane);
        }
        __syncthreads(); /* the next iteration's loads overwrite this stage */
    }
    int cq = (lane % 4) * 2;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int i = 0; i < 2; i++) {
            int64_t row = qw + mt * 16 + lane / 4 + i * 8;
            if (row >= f.s) continue;
            __nv_bfloat16 *p = f.dq + qo + row * f.sq.row + cq;
#pragma unroll
            for (int n = 0; n < D / 8; n++)
                *(uint32_t *)(p + n * 8) =
                    gt_packf(f.scale * dq[mt][n][2 * i], f.scale * dq[mt][n][2 * i + 1]);
        }
}

/* ---------------------------------------------------------------- host side */

template <int D>
static gt_status gt_flash_dsum_launch(gt_cuda_stream *s, const gt_kernel_call *c, const gt_flash *f,
                                      gt_error *err)
{
    dim3 grid((unsigned)((f->s * 8 + 255) / 256), (unsigned)(f->b * f->hq));
    gt_k_flash_dsum<D><<<grid, 256, 0, s->stream>>>(*f, (float *)f->dsum, (float *)f->lse2);
    return gt_cuda_launched(c, err);
}

/* The three kernels with explicit tile shapes (the default shapes: gt_flash_bwd_launch). */
template <int D, int KW, int KMT, int BQ, bool KEEP_KV, int KMINB, int QW, int QMT, int BK,
          int QMINB>
static gt_status gt_flash_bwd_launch_cfg(gt_cuda_stream *s, const gt_kernel_call *c,
                                         const gt_flash *f, gt_error *err)
{
    GT_TRY(gt_flash_dsum_launch<D>(s, c, f, err));
    typedef gt_flash_dkdv_smem<D, KW, KMT, BQ> kv;
    const void *k1 = (const void *)gt_k_flash_dkdv<D, KW, KMT, BQ, KEEP_KV, KMINB>;
    GT_TRY(gt_cuda_smem_limit(s, c, k1, kv::bytes, err));
    dim3 g1((unsigned)((f->t + kv::bk - 1) / kv::bk), (unsigned)(f->b * f->hkv));
    gt_k_flash_dkdv<D, KW, KMT, BQ, KEEP_KV, KMINB><<<g1, 32 * KW, kv::bytes, s->stream>>>(*f);
    GT_TRY(gt_cuda_launched(c, err));
    constexpr size_t b2 = gt_flash_dq_smem<D, QW, QMT, BK>();
    constexpr int bq = 16 * QMT * QW;
    const void *k2 = (const void *)gt_k_flash_dq<D, QW, QMT, BK, QMINB>;
    GT_TRY(gt_cuda_smem_limit(s, c, k2, b2, err));
    dim3 g2((unsigned)((f->s + bq - 1) / bq), (unsigned)(f->b * f->hq));
    gt_k_flash_dq<D, QW, QMT, BK, QMINB><<<g2, 32 * QW, b2, s->stream>>>(*f);
    return gt_cuda_launched(c, err);
}

template <int D>
static gt_status gt_flash_bwd_launch(gt_cuda_stream *s, const gt_kernel_call *c, const gt_flash *f,
                                     gt_error *err)
{
    typedef gt_flash_bwd_cfg<D> g;
    return gt_flash_bwd_launch_cfg<D, g::kv_warps, g::kmt, g::bq, g::keep_kv, g::kv_min_blocks,
                                   g::q_warps, g::qmt, g::bk, g::q_min_blocks>(s, c, f, err);
}

gt_status gt_cuda_flash_bwd(gt_cuda_stream *s, const gt_kernel_call *c, const gt_flash *f,
                            gt_error *err)
{
    switch (f->d) {
    case 16:
        return gt_flash_bwd_launch<16>(s, c, f, err);
    case 32:
        return gt_flash_bwd_launch<32>(s, c, f, err);
    case 64:
        return gt_flash_bwd_launch<64>(s, c, f, err);
    default:
        return gt_flash_bwd_launch<128>(s, c, f, err);
    }
}
