/* cuda_moe_mma.cu — the bf16 grouped GEMMs of the mixture of experts on mma.sync m16n8k16 with a
 * three-stage cp.async pipeline: 128 x 128 output tiles, 8 warps of 64 x 32, k steps of 64, two
 * blocks per SM.
 *
 * These take the calls cuda_moe_gemm.cu's wmma kernels took before for bf16 (measured on one H100,
 * DeepSeek-V3 16B cut to 4 layers, 4 x 2048 tokens: the wmma kernels' 64 x 64 tiles with one
 * register stage ran the step's grouped products in 75 ms, half the step). Same contracts:
 *   grouped_matmul: a block computes a 128 x 128 tile of rows of ONE group with one k-loop from
 *     column 0 (k tiles of 64 in order, each four mma k-steps of 16 in order), so a row's bits do
 *     not depend on the tile it falls in, its group's size or offset: M-invariant. Rows outside
 *     the groups are zeros.
 *   grouped_matmul_dw: a block per (expert, 128 x 128 tile of dw[e]) runs the group's rows from
 *     offsets[e] in chunks of 64 in row order (rows past the group zero-filled), each chunk four
 *     mma k-steps of 16.
 * Every sum has one owner (no atomics, no split-K): bitwise reproducible. */
#include "cuda_flash.cuh"
#include "cuda_gm.cuh"

#define MM_BM 128
#define MM_BN 128
#define MM_BK 64
#define MM_STAGES 3
#define MM_THREADS 256
#define MM_LDK (MM_BK + GT_FLASH_PAD) /* [rows][k] tiles */
#define MM_LDN (MM_BN + GT_FLASH_PAD) /* [k][n] tiles (and [k][m]) */
#define MM_TILE_K (MM_BM * MM_LDK)    /* elements of a [128][64 + 8] stage */
#define MM_TILE_N (MM_BK * MM_LDN)    /* elements of a [64][128 + 8] stage */
#define MM_VK (MM_BK / 8)             /* 16-byte vectors in a row of a [rows][k] stage */
#define MM_VN (MM_BN / 8)             /* ... of a [k][n] stage */
#define MM_LOADS (MM_BM * MM_BK / 8 / MM_THREADS) /* vectors per thread per operand and stage */

typedef __nv_bfloat16 bf16;

/* acc (the warp's 64 x 32: 4 row blocks x 4 column blocks of m16n8) to out rows r0 + .., columns
 * n0 + .., for rows below r1 and columns below ncols; out row stride ld (elements), base ob. */
__device__ __forceinline__ void gt_mm_store(const float (&acc)[4][4][4], void *out, int dot,
                                            int64_t ob, int64_t ld, int64_t r0, int64_t r1,
                                            int64_t n0, int64_t ncols, int lane)
{
    const int g = lane / 4, q = lane % 4;
#pragma unroll
    for (int mt = 0; mt < 4; mt++)
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                int64_t r = r0 + mt * 16 + g + 8 * h, n = n0 + nt * 8 + 2 * q;
                if (r >= r1) continue;
                if (n < ncols) gt_st(out, dot, ob + r * ld + n, acc[mt][nt][2 * h]);
                if (n + 1 < ncols) gt_st(out, dot, ob + r * ld + n + 1, acc[mt][nt][2 * h + 1]);
            }
}

/* The k-loop both kernels share: acc zeroed, then nk tiles of MM_BK through MM_STAGES cp.async
 * stages (load(stage, k0) fills one), each MM_BK / 16 mma k-steps in order whose A and B fragments
 * frags(stage, kk, a, b) loads — so a sum's order depends on neither the tile nor the kernel. */
template <typename Load, typename Frags>
__device__ __forceinline__ void gt_mm_mainloop(float (&acc)[4][4][4], int64_t nk, Load load,
                                               Frags frags)
{
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int c = 0; c < 4; c++)
                acc[i][j][c] = 0.0f;
#pragma unroll
    for (int st = 0; st < MM_STAGES - 1; st++) {
        if (st < nk) load(st, st * MM_BK);
        gt_cp_commit();
    }
    for (int64_t kt = 0; kt < nk; kt++) {
        gt_cp_wait<MM_STAGES - 2>();
        __syncthreads(); /* stage kt landed; every warp is done with stage kt - 1 */
        if (kt + MM_STAGES - 1 < nk)
            load((int)((kt + MM_STAGES - 1) % MM_STAGES), (kt + MM_STAGES - 1) * MM_BK);
        gt_cp_commit();
        const int stage = (int)(kt % MM_STAGES);
#pragma unroll
        for (int kk = 0; kk < MM_BK; kk += 16) {
            uint32_t a[4][4], b[2][4];
            frags(stage, kk, a, b);
#pragma unroll
            for (int mt = 0; mt < 4; mt++)
#pragma unroll
                for (int nb = 0; nb < 2; nb++)
                    gt_mma_bf16x2(acc[mt][2 * nb], acc[mt][2 * nb + 1], a[mt], b[nb]);
        }
    }
    gt_cp_wait<0>();
}

/* out[r0 .. r0 + 127 of group e] = x[rows] w[e]^T (TB: w[e] [Dout, Din]) or x w[e] ([Din, Dout]).
 */
template <bool TB>
__global__ void __launch_bounds__(MM_THREADS, 2)
    gt_k_gm_mma(int64_t R, int64_t Din, int64_t Dout, int E, const bf16 *x, const bf16 *w,
                const int32_t *offsets, void *out, int dot, unsigned long long *flag, int op)
{
    extern __shared__ __align__(128) unsigned char mm_smem[];
    bf16 *As = (bf16 *)mm_smem, *Bs = As + MM_STAGES * MM_TILE_K;
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    /* every warp finds the tile itself: no static shared memory beside the dynamic stages (the
     * dynamic limit is raised to the device's whole opt-in size) */
    const gt_gm_tile tile = gt_gm_find(offsets, E, R, blockIdx.x, MM_BM);
    if (blockIdx.x == 0 && blockIdx.y == 0 && tid == 0) gt_gm_check(offsets, E, R, flag, op);
    const int e = tile.e;
    const int64_t r0 = tile.r0, r1 = tile.r1, n0 = (int64_t)blockIdx.y * MM_BN;
    if (e < 0) return;
    if (e == E) { /* rows outside the groups: zeros */
        for (int l = tid; l < MM_BM * MM_BN; l += MM_THREADS) {
            int64_t r = r0 + l / MM_BN, n = n0 + l % MM_BN;
            if (r < r1 && n < Dout) gt_st(out, dot, r * Dout + n, 0.0f);
        }
        return;
    }
    const bf16 *we = w + (int64_t)e * Din * Dout;
    constexpr int BT = TB ? MM_TILE_K : MM_TILE_N; /* a B stage's elements */
    /* a stage: A [128 rows][64 k], B [128 n][64 k] (TB) or [64 k][128 n]: 1024 16-byte vectors
     * each, four per thread */
    auto load = [&](int stage, int64_t k0) {
        bf16 *as = As + stage * MM_TILE_K, *bs = Bs + stage * BT;
#pragma unroll
        for (int j = 0; j < MM_LOADS; j++) {
            int v = tid + MM_THREADS * j;
            int rr = v / MM_VK, kk = (v % MM_VK) * 8;
            int64_t r = r0 + rr, k = k0 + kk;
            bool in = r < r1 && k < Din;
            gt_cp_async16(as + rr * MM_LDK + kk, in ? x + r * Din + k : x, in);
            if constexpr (TB) {
                int64_t n = n0 + rr;
                bool inb = n < Dout && k < Din;
                gt_cp_async16(bs + rr * MM_LDK + kk, inb ? we + n * Din + k : we, inb);
            } else {
                int kb = v / MM_VN, nn = (v % MM_VN) * 8;
                int64_t kg = k0 + kb, n = n0 + nn;
                bool inb = kg < Din && n < Dout;
                gt_cp_async16(bs + kb * MM_LDN + nn, inb ? we + kg * Dout + n : we, inb);
            }
        }
    };
    const int wm = warp >> 2, wn = warp & 3; /* 2 x 4 warps: rows wm * 64, columns wn * 32 */
    float acc[4][4][4];
    gt_mm_mainloop(acc, (Din + MM_BK - 1) / MM_BK, load,
                   [&](int stage, int kk, uint32_t(&a)[4][4], uint32_t(&b)[2][4]) {
                       const bf16 *as = As + stage * MM_TILE_K, *bs = Bs + stage * BT;
#pragma unroll
                       for (int mt = 0; mt < 4; mt++)
                           gt_frag_a(a[mt], as, MM_LDK, wm * 64 + mt * 16, kk, lane);
#pragma unroll
                       for (int nb = 0; nb < 2; nb++) {
                           if constexpr (TB)
                               gt_frag_bt2(b[nb], bs, MM_LDK, wn * 32 + nb * 16, kk, lane);
                           else
                               gt_frag_b2(b[nb], bs, MM_LDN, kk, wn * 32 + nb * 16, lane);
                       }
                   });
    gt_mm_store(acc, out, dot, 0, Dout, r0 + wm * 64, r1, n0 + wn * 32, Dout, lane);
}

/* dw[e][m0 .., n0 ..] = sum over group e's rows r of dy[r][m] x[r][n]: A[m][r] from dy's rows
 * ([64 r][128 m] tiles, transposed by ldmatrix), B[r][n] from x's rows ([64 r][128 n]). */
__global__ void __launch_bounds__(MM_THREADS, 2)
    gt_k_gmdw_mma(int64_t R, int64_t Din, int64_t Dout, int E, const bf16 *x, const bf16 *dy,
                  const int32_t *offsets, void *out, int dot, unsigned long long *flag, int op)
{
    extern __shared__ __align__(128) unsigned char mm_smem[];
    bf16 *As = (bf16 *)mm_smem, *Bs = As + MM_STAGES * MM_TILE_N;
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, e = blockIdx.z;
    if (blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 && tid == 0)
        gt_gm_check(offsets, E, R, flag, op);
    int64_t lo, hi;
    gt_gm_group(offsets, e, R, &lo, &hi);
    const int64_t m0 = (int64_t)blockIdx.y * MM_BM, n0 = (int64_t)blockIdx.x * MM_BN;
    auto load = [&](int stage, int64_t k0) {
        bf16 *as = As + stage * MM_TILE_N, *bs = Bs + stage * MM_TILE_N;
#pragma unroll
        for (int j = 0; j < MM_LOADS; j++) {
            int v = tid + MM_THREADS * j;
            int rr = v / MM_VN, cc = (v % MM_VN) * 8;
            int64_t r = lo + k0 + rr, m = m0 + cc, n = n0 + cc;
            bool ina = r < hi && m < Dout, inb = r < hi && n < Din;
            gt_cp_async16(as + rr * MM_LDN + cc, ina ? dy + r * Dout + m : dy, ina);
            gt_cp_async16(bs + rr * MM_LDN + cc, inb ? x + r * Din + n : x, inb);
        }
    };
    const int wm = warp >> 2, wn = warp & 3;
    float acc[4][4][4];
    gt_mm_mainloop(acc, (hi - lo + MM_BK - 1) / MM_BK, load,
                   [&](int stage, int kk, uint32_t(&a)[4][4], uint32_t(&b)[2][4]) {
                       const bf16 *as = As + stage * MM_TILE_N, *bs = Bs + stage * MM_TILE_N;
#pragma unroll
                       for (int mt = 0; mt < 4; mt++) { /* A[m][k] = as[k][m]: transposed 8 x 8s */
                           int mat = lane / 8, m = wm * 64 + mt * 16 + (mat & 1) * 8;
                           gt_ldsm4_t(a[mt], as + (kk + (mat >> 1) * 8 + lane % 8) * MM_LDN + m);
                       }
#pragma unroll
                       for (int nb = 0; nb < 2; nb++)
                           gt_frag_b2(b[nb], bs, MM_LDN, kk, wn * 32 + nb * 16, lane);
                   });
    gt_mm_store(acc, out, dot, (int64_t)e * Dout * Din, Din, m0 + wm * 64, Dout, n0 + wn * 32, Din,
                lane);
}

gt_status gt_gm_mma(gt_cuda_stream *s, const gt_kernel_call *c, bool tb, int64_t R, int64_t Din,
                    int64_t Dout, int E, gt_error *err)
{
    int64_t tiles = (R + MM_BM - 1) / MM_BM + E + 2, ntiles = (Dout + MM_BN - 1) / MM_BN;
    if (tiles > INT32_MAX || ntiles > 65535)
        return gt_error_set(err, GT_ERR_UNSUPPORTED, "grouped_matmul: [%lld, %lld] above the grid",
                            (long long)R, (long long)Dout);
    dim3 grid((unsigned)tiles, (unsigned)ntiles);
    const size_t smem = sizeof(bf16) * MM_STAGES * (MM_TILE_K + (tb ? MM_TILE_K : MM_TILE_N));
    const bf16 *x = (const bf16 *)c->in[0]->data, *w = (const bf16 *)c->in[1]->data;
    const int32_t *off = (const int32_t *)c->in[2]->data;
    gt_tensor *o = c->out[0];
    if (tb) {
        GT_TRY(gt_cuda_smem_limit(s, c, (const void *)gt_k_gm_mma<true>, smem, err));
        gt_k_gm_mma<true><<<grid, MM_THREADS, smem, s->stream>>>(
            R, Din, Dout, E, x, w, off, o->data, o->dtype, s->flag, (int)c->op);
    } else {
        GT_TRY(gt_cuda_smem_limit(s, c, (const void *)gt_k_gm_mma<false>, smem, err));
        gt_k_gm_mma<false><<<grid, MM_THREADS, smem, s->stream>>>(
            R, Din, Dout, E, x, w, off, o->data, o->dtype, s->flag, (int)c->op);
    }
    return gt_cuda_launched(c, err);
}

gt_status gt_gmdw_mma(gt_cuda_stream *s, const gt_kernel_call *c, int64_t R, int64_t Din,
                      int64_t Dout, int E, gt_error *err)
{
    int64_t nt = (Din + MM_BN - 1) / MM_BN, mt = (Dout + MM_BM - 1) / MM_BM;
    if (nt > INT32_MAX || mt > 65535 || E > 65535)
        return gt_error_set(err, GT_ERR_UNSUPPORTED,
                            "grouped_matmul_dw: [%lld, %lld, %lld] above the grid", (long long)E,
                            (long long)Dout, (long long)Din);
    dim3 grid((unsigned)nt, (unsigned)mt, (unsigned)E);
    const size_t smem = sizeof(bf16) * MM_STAGES * 2 * MM_TILE_N;
    GT_TRY(gt_cuda_smem_limit(s, c, (const void *)gt_k_gmdw_mma, smem, err));
    gt_k_gmdw_mma<<<grid, MM_THREADS, smem, s->stream>>>(
        R, Din, Dout, E, (const bf16 *)c->in[0]->data, (const bf16 *)c->in[1]->data,
        (const int32_t *)c->in[2]->data, c->out[0]->data, c->out[0]->dtype, s->flag, (int)c->op);
    return gt_cuda_launched(c, err);
}
