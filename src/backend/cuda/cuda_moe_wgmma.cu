/* cuda_moe_wgmma.cu — the bf16 grouped GEMMs of the mixture of experts on Hopper's warpgroup
 * MMA (wgmma.mma_async, sm_90a), operands read by the tensor cores straight from shared memory,
 * 128 x 256 output tiles (m64n256k16, two consumer warpgroups of 64 rows), k tiles of 64.
 * Two feeds, the same sums:
 *   TMA (gt_k_gm_tma, gt_k_gmdw_tma; the default): a producer warpgroup's bulk tensor copies
 *     into four mbarrier stages, one wgmma group kept in flight;
 *   cp.async (gt_k_gm_wgmma, gt_k_gmdw_wgmma; where no tensor map can be made): three stages
 *     loaded by every thread, a barrier and a wgmma wait per k tile (the dw kernel at 128 x 128).
 * Measured on one H100 (DeepSeek-V3 16B cut to 4 layers, 4 x 2048 tokens, docs/BENCHMARKS.md),
 * ms a step for forward / input gradient / weight gradient: mma.sync 10.9 / 11.7 / 13.8, cp.async
 * 8.8 / 9.2 / 10.1, TMA 6.0 / 6.2 / 9.0, with paired epilogue stores 5.3 / 5.4 / 6.5 (a
 * persistent grid that overlaps a tile's stores with the next tile's loads measured the same:
 * 5.5 / 5.5 / 6.3). Contracts:
 *   grouped_matmul: a block computes a tile of rows of ONE group with one k-loop from column 0
 *     (k tiles of 64 in order, each four wgmma k-steps of 16 in order), so a row's bits do not
 *     depend on the tile it falls in, its group's size or offset: M-invariant. Rows outside the
 *     groups are zeros.
 *   grouped_matmul_dw: a block per (expert, tile of dw[e]) runs the group's rows from
 *     offsets[e] in chunks of 64 in row order (rows past the group zeroed), each chunk four
 *     wgmma k-steps of 16.
 * The k-steps are those of the mma.sync kernels, and the step's parameters come out bitwise the
 * same on every version (16B_4layers, 12 steps: params xxh64 0c230f6bf7c51e40).
 * Every sum has one owner (no atomics, no split-K): bitwise reproducible.
 *
 * Shared memory tiles are in the 128-byte swizzle wgmma reads (a 16-byte chunk c of a 128-byte
 * row r of an 8-row, 1024-byte atom sits at chunk c ^ (r % 8); atoms 1024-aligned):
 *   K-major [rows][64 k] (x rows; w[e] rows when it is [Dout, Din]): row r at atom r / 8;
 *     descriptor stride 1024 between 8-row groups, a k-step of 16 advances the start 32 bytes;
 *   MN-major [64 k][columns] (w[e] as [Din, Dout], dy and x in the weight gradient): column
 *     block h (64 columns, 128 bytes) at h * 8192, k row k at atom k / 8 of it; descriptor
 *     leading offset 8192 (to the next 64 columns), stride 1024 (to the next 8 k), read
 *     transposed. */
#include "cuda_flash.cuh"
#include "cuda_gm.cuh"

#include <cuda.h>
#include <cudaTypedefs.h>

#define WG_BM 128
#define WG_BK 64
#define WG_THREADS 256
#define WG_TILE 16384 /* bytes of one operand's stage */
#define WG_STAGES 3
/* an A stage is WG_TILE bytes, a B stage N / 128 of them; + the alignment slack */
#define WG_SMEM(N) (WG_STAGES * WG_TILE * (1 + (N) / 128) + 1024)

typedef __nv_bfloat16 bf16;

/* byte offset of chunk c (8 elements) of row r in a K-major tile */
__device__ __forceinline__ uint32_t gt_wg_kmaj(int r, int c)
{
    return (uint32_t)((r >> 3) * 1024 + (r & 7) * 128 + ((c ^ (r & 7)) << 4));
}
/* byte offset of chunk c (0..15: columns 8c..8c+7) of k row k in an MN-major tile */
__device__ __forceinline__ uint32_t gt_wg_mnmaj(int k, int c)
{
    return (uint32_t)((c >> 3) * 8192 + (k >> 3) * 1024 + (k & 7) * 128 +
                      (((c & 7) ^ (k & 7)) << 4));
}

/* A shared-memory matrix descriptor: start address, leading and stride byte offsets (all in
 * 16-byte units), 128-byte swizzle (bits 62-63 = 1). */
__device__ __forceinline__ uint64_t gt_wg_desc(uint32_t saddr, uint32_t lbo, uint32_t sbo)
{
    return (uint64_t)((saddr & 0x3FFFF) >> 4) | (uint64_t)((lbo >> 4) & 0x3FFF) << 16 |
           (uint64_t)((sbo >> 4) & 0x3FFF) << 32 | (uint64_t)1 << 62;
}

/* d (64 x N f32 per warpgroup: d[4 j + 2 h + c] is row 16 warp + lane / 4 + 8 h, column
 * 8 j + 2 (lane % 4) + c) += A B, A 64 x 16 and B 16 x N from their descriptors; TA / TB: the
 * operand is MN-major (read transposed). */
template <int TA, int TB>
__device__ __forceinline__ void gt_wgmma_n128(float (&d)[64], uint64_t da, uint64_t db)
{
    asm volatile(
        "{\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "
        "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, "
        "%37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, "
        "%55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, 1, 1, 1, %66, %67;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
          "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
          "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
          "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
          "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
          "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
          "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
          "+f"(d[63])
        : "l"(da), "l"(db), "n"(TA), "n"(TB));
}
template <int TA, int TB>
__device__ __forceinline__ void gt_wgmma_n256(float (&d)[128], uint64_t da, uint64_t db)
{
    asm volatile(
        "{\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "
        "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, "
        "%37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, "
        "%55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, "
        "%73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, "
        "%91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, "
        "%107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, "
        "%122, %123, %124, %125, %126, %127}, %128, %129, 1, 1, 1, %130, %131;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
          "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
          "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
          "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
          "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
          "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
          "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
          "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]),
          "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]),
          "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]),
          "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]),
          "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]),
          "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
          "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]),
          "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]),
          "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]),
          "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "l"(da), "l"(db), "n"(TA), "n"(TB));
}
template <int TA, int TB, int N>
__device__ __forceinline__ void gt_wgmma(float (&d)[N / 2], uint64_t da, uint64_t db)
{
    if constexpr (N == 128)
        gt_wgmma_n128<TA, TB>(d, da, db);
    else
        gt_wgmma_n256<TA, TB>(d, da, db);
}

/* The accumulators are written by the asynchronous wgmma: keep the compiler from moving their
 * reads and writes across the fences. */
template <int NR> __device__ __forceinline__ void gt_wg_hold(float (&d)[NR])
{
#pragma unroll
    for (int i = 0; i < NR; i++)
        asm volatile("" : "+f"(d[i])::"memory");
}

__device__ __forceinline__ uint32_t gt_smem_addr(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* The k-loop both kernels share: d zeroed, then nk tiles of WG_BK through WG_STAGES cp.async
 * stages (load(stage, k0) fills one stage's A and B), each WG_BK / 16 wgmma k-steps in order
 * whose descriptors descs(stage, kk, &da, &db) gives: a sum's order depends on neither the tile
 * nor the kernel. cp.async writes through the generic proxy and wgmma reads through the async
 * one: each writer fences (fence.proxy.async) before the barrier that publishes the stage. */
template <int TA, int TB, int N, typename Load, typename Descs>
__device__ __forceinline__ void gt_wg_mainloop(float (&d)[N / 2], int64_t nk, Load load,
                                               Descs descs)
{
#pragma unroll
    for (int i = 0; i < N / 2; i++)
        d[i] = 0.0f;
#pragma unroll
    for (int st = 0; st < WG_STAGES - 1; st++) {
        if (st < nk) load(st, st * WG_BK);
        gt_cp_commit();
    }
    for (int64_t kt = 0; kt < nk; kt++) {
        gt_cp_wait<WG_STAGES - 2>();
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads(); /* stage kt landed; every warpgroup is done with stage kt - 1 */
        if (kt + WG_STAGES - 1 < nk)
            load((int)((kt + WG_STAGES - 1) % WG_STAGES), (kt + WG_STAGES - 1) * WG_BK);
        gt_cp_commit();
        const int stage = (int)(kt % WG_STAGES);
        gt_wg_hold(d);
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int kk = 0; kk < WG_BK; kk += 16) {
            uint64_t da, db;
            descs(stage, kk, &da, &db);
            gt_wgmma<TA, TB, N>(d, da, db);
        }
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        gt_wg_hold(d);
    }
    gt_cp_wait<0>();
}

/* d (a warpgroup's 64 x N) to out rows r0 + .. (below r1), columns n0 + .. (below ncols); out
 * row stride ld (elements), base ob. A thread's two adjacent columns go in one store where the
 * offsets are even (the epilogue is a large part of the weight gradient's short tiles). */
template <int N>
__device__ __forceinline__ void gt_wg_store(const float (&d)[N / 2], void *out, int dot, int64_t ob,
                                            int64_t ld, int64_t r0, int64_t r1, int64_t n0,
                                            int64_t ncols)
{
    const int lane = threadIdx.x % 32, w = (threadIdx.x / 32) % 4, g = lane / 4, q = lane % 4;
    const bool pair = ((ob | ld | ncols | n0) & 1) == 0 && ((uintptr_t)out & 7) == 0;
#pragma unroll
    for (int j = 0; j < N / 8; j++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int64_t r = r0 + w * 16 + g + 8 * h, n = n0 + j * 8 + 2 * q;
            if (r >= r1) continue;
            if (pair) {
                if (n < ncols)
                    gt_st2(out, dot, ob + r * ld + n, d[4 * j + 2 * h], d[4 * j + 2 * h + 1]);
                continue;
            }
            if (n < ncols) gt_st(out, dot, ob + r * ld + n, d[4 * j + 2 * h]);
            if (n + 1 < ncols) gt_st(out, dot, ob + r * ld + n + 1, d[4 * j + 2 * h + 1]);
        }
}

__device__ __forceinline__ unsigned char *gt_wg_smem_base(unsigned char *raw)
{
    uint32_t a = gt_smem_addr(raw);
    return raw + ((1024 - (a & 1023)) & 1023);
}

/* out[r0 .. r0 + 127 of group e, n0 .. n0 + N - 1] = x[rows] w[e]^T (TB: w[e] [Dout, Din]) or
 * x w[e] ([Din, Dout]). */
template <bool TB, int N>
__global__ void __launch_bounds__(WG_THREADS, N == 128 ? 2 : 1)
    gt_k_gm_wgmma(int64_t R, int64_t Din, int64_t Dout, int E, const bf16 *x, const bf16 *w,
                  const int32_t *offsets, void *out, int dot, unsigned long long *flag, int op)
{
    extern __shared__ __align__(16) unsigned char wg_smem[];
    unsigned char *As = gt_wg_smem_base(wg_smem), *Bs = As + WG_STAGES * WG_TILE;
    const int tid = threadIdx.x, wg = tid / 128;
    const gt_gm_tile tile = gt_gm_find(offsets, E, R, blockIdx.x, WG_BM);
    if (blockIdx.x == 0 && blockIdx.y == 0 && tid == 0) gt_gm_check(offsets, E, R, flag, op);
    const int e = tile.e;
    const int64_t r0 = tile.r0, r1 = tile.r1, n0 = (int64_t)blockIdx.y * N;
    if (e < 0) return;
    if (e == E) { /* rows outside the groups: zeros */
        gt_gm_zero_tile(out, dot, r0, r1, n0, WG_BM, N, Dout);
        return;
    }
    const bf16 *we = w + (int64_t)e * Din * Dout;
    /* a stage: A's 1024 16-byte chunks (four per thread), B's 8 N (N / 32 per thread) */
    auto load = [&](int stage, int64_t k0) {
        unsigned char *as = As + stage * WG_TILE, *bs = Bs + stage * (WG_TILE * N / 128);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int v = tid + WG_THREADS * j, rr = v / 8, c = v % 8;
            int64_t r = r0 + rr, k = k0 + c * 8;
            bool in = r < r1 && k < Din;
            gt_cp_async16(as + gt_wg_kmaj(rr, c), in ? x + r * Din + k : x, in);
        }
#pragma unroll
        for (int j = 0; j < N / 32; j++) {
            int v = tid + WG_THREADS * j;
            if constexpr (TB) {
                int rr = v / 8, c = v % 8;
                int64_t n = n0 + rr, k = k0 + c * 8;
                bool inb = n < Dout && k < Din;
                gt_cp_async16(bs + gt_wg_kmaj(rr, c), inb ? we + n * Din + k : we, inb);
            } else {
                int kb = v / (N / 8), cn = v % (N / 8);
                int64_t kg = k0 + kb, n = n0 + cn * 8;
                bool inb = kg < Din && n < Dout;
                gt_cp_async16(bs + gt_wg_mnmaj(kb, cn), inb ? we + kg * Dout + n : we, inb);
            }
        }
    };
    float d[N / 2];
    gt_wg_mainloop<0, TB ? 0 : 1, N>(
        d, (Din + WG_BK - 1) / WG_BK, load, [&](int stage, int kk, uint64_t *da, uint64_t *db) {
            uint32_t as = gt_smem_addr(As + stage * WG_TILE),
                     bs = gt_smem_addr(Bs + stage * (WG_TILE * N / 128));
            *da = gt_wg_desc(as + wg * 8192 + kk * 2, 16, 1024);
            *db = TB ? gt_wg_desc(bs + kk * 2, 16, 1024)
                     : gt_wg_desc(bs + (kk / 8) * 1024, 8192, 1024);
        });
    gt_wg_store<N>(d, out, dot, 0, Dout, r0 + wg * 64, r1, n0, Dout);
}

/* dw[e][m0 .., n0 ..] = sum over group e's rows r of dy[r][m] x[r][n]: A[m][r] from dy's rows
 * ([64 r][128 m], M-major), B[r][n] from x's rows ([64 r][N n], N-major). */
template <int N>
__global__ void __launch_bounds__(WG_THREADS, N == 128 ? 2 : 1)
    gt_k_gmdw_wgmma(int64_t R, int64_t Din, int64_t Dout, int E, const bf16 *x, const bf16 *dy,
                    const int32_t *offsets, void *out, int dot, unsigned long long *flag, int op)
{
    extern __shared__ __align__(16) unsigned char wg_smem[];
    unsigned char *As = gt_wg_smem_base(wg_smem), *Bs = As + WG_STAGES * WG_TILE;
    const int tid = threadIdx.x, wg = tid / 128, e = blockIdx.z;
    if (blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 && tid == 0)
        gt_gm_check(offsets, E, R, flag, op);
    int64_t lo, hi;
    gt_gm_group(offsets, e, R, &lo, &hi);
    const int64_t m0 = (int64_t)blockIdx.y * WG_BM, n0 = (int64_t)blockIdx.x * N;
    auto load = [&](int stage, int64_t k0) {
        unsigned char *as = As + stage * WG_TILE, *bs = Bs + stage * (WG_TILE * N / 128);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int v = tid + WG_THREADS * j, rr = v / 16, c = v % 16;
            int64_t r = lo + k0 + rr, m = m0 + c * 8;
            bool ina = r < hi && m < Dout;
            gt_cp_async16(as + gt_wg_mnmaj(rr, c), ina ? dy + r * Dout + m : dy, ina);
        }
#pragma unroll
        for (int j = 0; j < N / 32; j++) {
            int v = tid + WG_THREADS * j, rr = v / (N / 8), c = v % (N / 8);
            int64_t r = lo + k0 + rr, n = n0 + c * 8;
            bool inb = r < hi && n < Din;
            gt_cp_async16(bs + gt_wg_mnmaj(rr, c), inb ? x + r * Din + n : x, inb);
        }
    };
    float d[N / 2];
    gt_wg_mainloop<1, 1, N>(d, (hi - lo + WG_BK - 1) / WG_BK, load,
                            [&](int stage, int kk, uint64_t *da, uint64_t *db) {
                                uint32_t as = gt_smem_addr(As + stage * WG_TILE),
                                         bs = gt_smem_addr(Bs + stage * (WG_TILE * N / 128));
                                *da = gt_wg_desc(as + wg * 8192 + (kk / 8) * 1024, 8192, 1024);
                                *db = gt_wg_desc(bs + (kk / 8) * 1024, 8192, 1024);
                            });
    gt_wg_store<N>(d, out, dot, (int64_t)e * Dout * Din, Din, m0 + wg * 64, Dout, n0, Din);
}

/* ---------------------------------------------------------------- grouped_matmul on TMA
 * The same products and k-step order as gt_k_gm_wgmma, fed by the bulk tensor copy engine: a
 * producer warpgroup (one thread) loads k tiles of A (x rows, [128 rows][64 k]) and B (w[e]) into
 * TM_STAGES shared-memory stages, each completing on a `full` mbarrier; two consumer warpgroups
 * (64 rows each) run the wgmmas of a stage, keep one wgmma group in flight and hand the stage
 * before it back on its `empty` mbarrier. The tensor maps zero-fill what lies outside x, w[e]
 * or Din (as cp.async's zero-fill did); A rows of the next group are read and multiplied but not
 * stored, so a row's bits are still its own sum alone. Column tiles vary fastest over the grid,
 * so a row tile's x rows are read from memory once and reused from L2 by the others. */
#define TM_STAGES 4
#define TM_THREADS 384
#define TM_SMEM(N) (TM_STAGES * WG_TILE * (1 + (N) / 128) + 1024 + 2 * TM_STAGES * 8)

__device__ __forceinline__ void gt_mb_init(uint32_t bar, int count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void gt_mb_expect(uint32_t bar, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void gt_mb_arrive(uint32_t bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
/* waits for the completion of the barrier's phase of parity `parity` */
__device__ __forceinline__ void gt_mb_wait(uint32_t bar, uint32_t parity)
{
    asm volatile("{\n"
                 ".reg .pred p;\n"
                 "WAIT:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 "@p bra.uni DONE;\n"
                 "bra.uni WAIT;\n"
                 "DONE:\n"
                 "}\n" ::"r"(bar),
                 "r"(parity)
                 : "memory");
}
__device__ __forceinline__ void gt_tma2(uint32_t dst, const CUtensorMap *m, int c0, int c1,
                                        uint32_t bar)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes "
                 "[%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
                 "l"((uint64_t)m), "r"(c0), "r"(c1), "r"(bar)
                 : "memory");
}
__device__ __forceinline__ void gt_tma3(uint32_t dst, const CUtensorMap *m, int c0, int c1, int c2,
                                        uint32_t bar)
{
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes "
                 "[%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
                 "l"((uint64_t)m), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
                 : "memory");
}

template <bool TB, int N>
__global__ void __launch_bounds__(TM_THREADS, 1)
    gt_k_gm_tma(const __grid_constant__ CUtensorMap tx, const __grid_constant__ CUtensorMap tw,
                int64_t R, int64_t Din, int64_t Dout, int E, const int32_t *offsets, void *out,
                int dot, unsigned long long *flag, int op)
{
    extern __shared__ __align__(16) unsigned char wg_smem[];
    unsigned char *As = gt_wg_smem_base(wg_smem), *Bs = As + TM_STAGES * WG_TILE;
    const uint32_t bars = gt_smem_addr(Bs + TM_STAGES * (WG_TILE * N / 128));
    const int tid = threadIdx.x, wg = tid / 128;
    const unsigned rt = blockIdx.y, ct = blockIdx.x;
    const gt_gm_tile tile = gt_gm_find(offsets, E, R, rt, WG_BM);
    if (rt == 0 && ct == 0 && tid == 0) gt_gm_check(offsets, E, R, flag, op);
    const int e = tile.e;
    const int64_t r0 = tile.r0, r1 = tile.r1, n0 = (int64_t)ct * N;
    if (e < 0) return;
    if (e == E) { /* rows outside the groups: zeros */
        gt_gm_zero_tile(out, dot, r0, r1, n0, WG_BM, N, Dout);
        return;
    }
    /* full[s] at bars + 8 s (one arrival: the producer's, plus the bytes), empty[s] after them
     * (one arrival per consumer thread) */
    if (tid == 0) {
        for (int st = 0; st < TM_STAGES; st++) {
            gt_mb_init(bars + 8 * st, 1);
            gt_mb_init(bars + 8 * (TM_STAGES + st), 256);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    const int64_t nk = (Din + WG_BK - 1) / WG_BK;
    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
        if (tid != 0) return;
        for (int64_t kt = 0; kt < nk; kt++) {
            const int st = (int)(kt % TM_STAGES);
            const uint32_t full = bars + 8 * st;
            if (kt >= TM_STAGES)
                gt_mb_wait(bars + 8 * (TM_STAGES + st), (uint32_t)((kt / TM_STAGES) & 1) ^ 1u);
            gt_mb_expect(full, WG_TILE * (1 + N / 128));
            const int k0 = (int)(kt * WG_BK);
            const uint32_t a = gt_smem_addr(As + st * WG_TILE),
                           b = gt_smem_addr(Bs + st * (WG_TILE * N / 128));
            gt_tma2(a, &tx, k0, (int)r0, full);
            if constexpr (TB)
                gt_tma3(b, &tw, k0, (int)n0, e, full);
            else
#pragma unroll
                for (int h = 0; h < N / 64; h++)
                    gt_tma3(b + h * 8192, &tw, (int)n0 + 64 * h, k0, e, full);
        }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
    const int cw = wg - 1;
    float d[N / 2];
#pragma unroll
    for (int i = 0; i < N / 2; i++)
        d[i] = 0.0f;
    for (int64_t kt = 0; kt < nk; kt++) {
        const int st = (int)(kt % TM_STAGES);
        gt_mb_wait(bars + 8 * st, (uint32_t)((kt / TM_STAGES) & 1));
        const uint32_t as = gt_smem_addr(As + st * WG_TILE),
                       bs = gt_smem_addr(Bs + st * (WG_TILE * N / 128));
        gt_wg_hold(d);
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int kk = 0; kk < WG_BK; kk += 16) {
            uint64_t da = gt_wg_desc(as + cw * 8192 + kk * 2, 16, 1024);
            uint64_t db = TB ? gt_wg_desc(bs + kk * 2, 16, 1024)
                             : gt_wg_desc(bs + (kk / 8) * 1024, 8192, 1024);
            gt_wgmma<0, TB ? 0 : 1, N>(d, da, db);
        }
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
        gt_wg_hold(d);
        if (kt > 0) gt_mb_arrive(bars + 8 * (TM_STAGES + (int)((kt - 1) % TM_STAGES)));
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    gt_wg_hold(d);
    gt_wg_store<N>(d, out, dot, 0, Dout, r0 + cw * 64, r1, n0, Dout);
}

/* cuTensorMapEncodeTiled through the runtime (no link against the driver library) */
static PFN_cuTensorMapEncodeTiled_v12000 gt_tma_encoder(void)
{
    static PFN_cuTensorMapEncodeTiled_v12000 fn;
    if (!fn) {
        cudaDriverEntryPointQueryResult q;
        void *p = NULL;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000,
                                             cudaEnableDefault, &q) == cudaSuccess &&
            q == cudaDriverEntryPointSuccess)
            fn = (PFN_cuTensorMapEncodeTiled_v12000)p;
    }
    return fn;
}

/* a bf16 tensor map of `rank` dims (innermost first, element strides of the outer dims), box
 * `box`, 128-byte swizzle, zeros outside */
static bool gt_tma_map(CUtensorMap *m, const void *base, int rank, const uint64_t *dims,
                       const uint64_t *strides, const uint32_t *box)
{
    PFN_cuTensorMapEncodeTiled_v12000 enc = gt_tma_encoder();
    if (!enc) return false;
    cuuint64_t gd[3], gs[2];
    cuuint32_t bx[3], es[3] = {1, 1, 1};
    for (int i = 0; i < rank; i++) {
        gd[i] = dims[i];
        bx[i] = box[i];
        if (i + 1 < rank) gs[i] = strides[i] * 2;
    }
    return enc(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, (cuuint32_t)rank, (void *)base, gd, gs, bx, es,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
               CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

template <bool TB, int N>
static gt_status gt_gm_tma_n(gt_cuda_stream *s, const gt_kernel_call *c, int64_t R, int64_t Din,
                             int64_t Dout, int E, bool *done, gt_error *err)
{
    *done = false;
    int64_t tiles = (R + WG_BM - 1) / WG_BM + E + 2, ntiles = (Dout + N - 1) / N;
    if (tiles > 65535 || ntiles > 65535 || R > INT32_MAX || Dout > INT32_MAX) return GT_OK;
    const void *x = c->in[0]->data, *w = c->in[1]->data;
    CUtensorMap tx, tw;
    uint64_t xd[2] = {(uint64_t)Din, (uint64_t)R}, xs[1] = {(uint64_t)Din};
    uint32_t xb[2] = {64, 128};
    uint64_t wd[3] = {(uint64_t)(TB ? Din : Dout), (uint64_t)(TB ? Dout : Din), (uint64_t)E};
    uint64_t ws[2] = {wd[0], wd[0] * wd[1]};
    uint32_t wb[3] = {64, TB ? (uint32_t)N : 64u, 1};
    if (!gt_tma_map(&tx, x, 2, xd, xs, xb) || !gt_tma_map(&tw, w, 3, wd, ws, wb)) return GT_OK;
    dim3 grid((unsigned)ntiles, (unsigned)tiles);
    GT_TRY(gt_cuda_smem_limit(s, c, (const void *)gt_k_gm_tma<TB, N>, TM_SMEM(N), err));
    gt_tensor *o = c->out[0];
    gt_k_gm_tma<TB, N><<<grid, TM_THREADS, TM_SMEM(N), s->stream>>>(
        tx, tw, R, Din, Dout, E, (const int32_t *)c->in[2]->data, o->data, o->dtype, s->flag,
        (int)c->op);
    *done = true;
    return gt_cuda_launched(c, err);
}

template <int N>
static gt_status gt_gm_wgmma_n(gt_cuda_stream *s, const gt_kernel_call *c, bool tb, int64_t R,
                               int64_t Din, int64_t Dout, int E, gt_error *err)
{
    int64_t tiles = (R + WG_BM - 1) / WG_BM + E + 2, ntiles = (Dout + N - 1) / N;
    if (tiles > INT32_MAX || ntiles > 65535)
        return gt_error_set(err, GT_ERR_UNSUPPORTED, "grouped_matmul: [%lld, %lld] above the grid",
                            (long long)R, (long long)Dout);
    dim3 grid((unsigned)tiles, (unsigned)ntiles);
    const bf16 *x = (const bf16 *)c->in[0]->data, *w = (const bf16 *)c->in[1]->data;
    const int32_t *off = (const int32_t *)c->in[2]->data;
    gt_tensor *o = c->out[0];
    if (tb) {
        GT_TRY(gt_cuda_smem_limit(s, c, (const void *)gt_k_gm_wgmma<true, N>, WG_SMEM(N), err));
        gt_k_gm_wgmma<true, N><<<grid, WG_THREADS, WG_SMEM(N), s->stream>>>(
            R, Din, Dout, E, x, w, off, o->data, o->dtype, s->flag, (int)c->op);
    } else {
        GT_TRY(gt_cuda_smem_limit(s, c, (const void *)gt_k_gm_wgmma<false, N>, WG_SMEM(N), err));
        gt_k_gm_wgmma<false, N><<<grid, WG_THREADS, WG_SMEM(N), s->stream>>>(
            R, Din, Dout, E, x, w, off, o->data, o->dtype, s->flag, (int)c->op);
    }
    return gt_cuda_launched(c, err);
}

gt_status gt_gm_wgmma(gt_cuda_stream *s, const gt_kernel_call *c, bool tb, int64_t R, int64_t Din,
                      int64_t Dout, int E, gt_error *err)
{
    bool done; /* false where no tensor map can be made: the cp.async kernel, the same bits */
    gt_status st = tb ? gt_gm_tma_n<true, 256>(s, c, R, Din, Dout, E, &done, err)
                      : gt_gm_tma_n<false, 256>(s, c, R, Din, Dout, E, &done, err);
    if (st != GT_OK || done) return st;
    return gt_gm_wgmma_n<256>(s, c, tb, R, Din, Dout, E, err);
}

/* grouped_matmul_dw on TMA: gt_k_gmdw_wgmma's sums in its order, fed as gt_k_gm_tma is. A k tile
 * is 64 rows of the group; the rows of its last, partial tile that belong to the next group are
 * zeroed in shared memory by the consumers before their wgmmas (cp.async zero-filled them). */
template <int N>
__global__ void __launch_bounds__(TM_THREADS, 1)
    gt_k_gmdw_tma(const __grid_constant__ CUtensorMap tx, const __grid_constant__ CUtensorMap tdy,
                  int64_t R, int64_t Din, int64_t Dout, int E, const int32_t *offsets, void *out,
                  int dot, unsigned long long *flag, int op)
{
    extern __shared__ __align__(16) unsigned char wg_smem[];
    unsigned char *As = gt_wg_smem_base(wg_smem), *Bs = As + TM_STAGES * WG_TILE;
    const uint32_t bars = gt_smem_addr(Bs + TM_STAGES * (WG_TILE * N / 128));
    const int tid = threadIdx.x, wg = tid / 128, e = blockIdx.z;
    if (blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 && tid == 0)
        gt_gm_check(offsets, E, R, flag, op);
    int64_t lo, hi;
    gt_gm_group(offsets, e, R, &lo, &hi);
    const int64_t m0 = (int64_t)blockIdx.y * WG_BM, n0 = (int64_t)blockIdx.x * N;
    if (tid == 0) {
        for (int st = 0; st < TM_STAGES; st++) {
            gt_mb_init(bars + 8 * st, 1);
            gt_mb_init(bars + 8 * (TM_STAGES + st), 256);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    const int64_t nk = (hi - lo + WG_BK - 1) / WG_BK;
    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
        if (tid != 0) return;
        for (int64_t kt = 0; kt < nk; kt++) {
            const int st = (int)(kt % TM_STAGES);
            const uint32_t full = bars + 8 * st;
            if (kt >= TM_STAGES)
                gt_mb_wait(bars + 8 * (TM_STAGES + st), (uint32_t)((kt / TM_STAGES) & 1) ^ 1u);
            gt_mb_expect(full, WG_TILE * (1 + N / 128));
            const int r = (int)(lo + kt * WG_BK);
            const uint32_t a = gt_smem_addr(As + st * WG_TILE),
                           b = gt_smem_addr(Bs + st * (WG_TILE * N / 128));
#pragma unroll
            for (int h = 0; h < 2; h++)
                gt_tma2(a + h * 8192, &tdy, (int)m0 + 64 * h, r, full);
#pragma unroll
            for (int h = 0; h < N / 64; h++)
                gt_tma2(b + h * 8192, &tx, (int)n0 + 64 * h, r, full);
        }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
    const int cw = wg - 1, ct = tid - 128;
    float d[N / 2];
#pragma unroll
    for (int i = 0; i < N / 2; i++)
        d[i] = 0.0f;
    for (int64_t kt = 0; kt < nk; kt++) {
        const int st = (int)(kt % TM_STAGES);
        gt_mb_wait(bars + 8 * st, (uint32_t)((kt / TM_STAGES) & 1));
        unsigned char *ap = As + st * WG_TILE, *bp = Bs + st * (WG_TILE * N / 128);
        const int valid = (int)(hi - lo - kt * WG_BK);
        if (valid < WG_BK) { /* the group's last tile: rows [valid, 64) are the next group's */
            const int nz = WG_BK - valid, blocks = 2 + N / 64;
            for (int l = ct; l < blocks * nz * 8; l += 256) {
                int blk = l / (nz * 8), row = valid + (l / 8) % nz, c = l % 8;
                unsigned char *base = blk < 2 ? ap + blk * 8192 : bp + (blk - 2) * 8192;
                *(uint4 *)(base + (row >> 3) * 1024 + (row & 7) * 128 + c * 16) =
                    make_uint4(0, 0, 0, 0);
            }
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
            asm volatile("bar.sync 1, 256;\n" ::: "memory");
        }
        const uint32_t as = gt_smem_addr(ap), bs = gt_smem_addr(bp);
        gt_wg_hold(d);
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int kk = 0; kk < WG_BK; kk += 16) {
            uint64_t da = gt_wg_desc(as + cw * 8192 + (kk / 8) * 1024, 8192, 1024);
            uint64_t db = gt_wg_desc(bs + (kk / 8) * 1024, 8192, 1024);
            gt_wgmma<1, 1, N>(d, da, db);
        }
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
        gt_wg_hold(d);
        if (kt > 0) gt_mb_arrive(bars + 8 * (TM_STAGES + (int)((kt - 1) % TM_STAGES)));
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    gt_wg_hold(d);
    gt_wg_store<N>(d, out, dot, (int64_t)e * Dout * Din, Din, m0 + cw * 64, Dout, n0, Din);
}

template <int N>
static gt_status gt_gmdw_tma_n(gt_cuda_stream *s, const gt_kernel_call *c, int64_t R, int64_t Din,
                               int64_t Dout, int E, bool *done, gt_error *err)
{
    *done = false;
    int64_t nt = (Din + N - 1) / N, mt = (Dout + WG_BM - 1) / WG_BM;
    if (nt > INT32_MAX || mt > 65535 || E > 65535 || R > INT32_MAX || Din > INT32_MAX ||
        Dout > INT32_MAX)
        return GT_OK;
    CUtensorMap tx, tdy;
    uint64_t xd[2] = {(uint64_t)Din, (uint64_t)R}, xs[1] = {(uint64_t)Din};
    uint64_t yd[2] = {(uint64_t)Dout, (uint64_t)R}, ys[1] = {(uint64_t)Dout};
    uint32_t box[2] = {64, 64};
    if (!gt_tma_map(&tx, c->in[0]->data, 2, xd, xs, box) ||
        !gt_tma_map(&tdy, c->in[1]->data, 2, yd, ys, box))
        return GT_OK;
    dim3 grid((unsigned)nt, (unsigned)mt, (unsigned)E);
    GT_TRY(gt_cuda_smem_limit(s, c, (const void *)gt_k_gmdw_tma<N>, TM_SMEM(N), err));
    gt_k_gmdw_tma<N><<<grid, TM_THREADS, TM_SMEM(N), s->stream>>>(
        tx, tdy, R, Din, Dout, E, (const int32_t *)c->in[2]->data, c->out[0]->data,
        c->out[0]->dtype, s->flag, (int)c->op);
    *done = true;
    return gt_cuda_launched(c, err);
}

template <int N>
static gt_status gt_gmdw_wgmma_n(gt_cuda_stream *s, const gt_kernel_call *c, int64_t R, int64_t Din,
                                 int64_t Dout, int E, gt_error *err)
{
    int64_t nt = (Din + N - 1) / N, mt = (Dout + WG_BM - 1) / WG_BM;
    if (nt > INT32_MAX || mt > 65535 || E > 65535)
        return gt_error_set(err, GT_ERR_UNSUPPORTED,
                            "grouped_matmul_dw: [%lld, %lld, %lld] above the grid", (long long)E,
                            (long long)Dout, (long long)Din);
    dim3 grid((unsigned)nt, (unsigned)mt, (unsigned)E);
    GT_TRY(gt_cuda_smem_limit(s, c, (const void *)gt_k_gmdw_wgmma<N>, WG_SMEM(N), err));
    gt_k_gmdw_wgmma<N><<<grid, WG_THREADS, WG_SMEM(N), s->stream>>>(
        R, Din, Dout, E, (const bf16 *)c->in[0]->data, (const bf16 *)c->in[1]->data,
        (const int32_t *)c->in[2]->data, c->out[0]->data, c->out[0]->dtype, s->flag, (int)c->op);
    return gt_cuda_launched(c, err);
}

gt_status gt_gmdw_wgmma(gt_cuda_stream *s, const gt_kernel_call *c, int64_t R, int64_t Din,
                        int64_t Dout, int E, gt_error *err)
{
    bool done; /* as gt_gm_wgmma */
    gt_status st = gt_gmdw_tma_n<256>(s, c, R, Din, Dout, E, &done, err);
    if (st != GT_OK || done) return st;
    return gt_gmdw_wgmma_n<128>(s, c, R, Din, Dout, E, err);
}
