/* cuda_flash.cuh — bf16 tensor-core flash attention (FlashAttention-2 style) for sdpa and
 * sdpa_backward; private to src/backend/cuda.
 *
 * Used when q, k, v (and out / dout / the gradients) are bf16, lse is f32, d == dv is one of 16,
 * 32, 64, 128, t > 0 and every pointer is 16-byte aligned; otherwise the tiled f32 kernels of
 * cuda_attention.cu run. Both layouts of the op run here: a block computes its (batch, head)
 * base offset once (gt_flash_stride) and steps rows by the row stride (D in layout 0, heads * D
 * in layout 1); tiles and arithmetic are the same, so the layouts give the same bits. Matrix
 * products use mma.sync m16n8k16 (bf16 in, f32 accumulate); each warp owns 16 rows of the output
 * tile, so every sum has one owner and a fixed order (k-steps of the mma in index order, tiles in
 * index order, quad shuffles in a fixed butterfly): bitwise reproducible, no atomics. Softmax runs
 * in base 2: x = S * scale * log2(e), p = 2^(x - m), lse = (m + log2 l) * ln 2.
 *
 * Block-causal (packed documents, pos != NULL): query i sees keys start_i = i - pos[i] .. i. A
 * query tile starts its key loop at the tile holding its first start, a warp skips key tiles
 * before all of its rows' starts (or, in dK/dV, query tiles whose rows all start after its keys),
 * and the masked path (taken only where a tile crosses a document start, the diagonal or an
 * end) also masks keys before a row's start. Without documents every start is 0 and the loops and
 * tests are the causal ones: one document gives the causal call's bits. */
#ifndef GRAPHTRAIN_CUDA_FLASH_CUH
#define GRAPHTRAIN_CUDA_FLASH_CUH

#include "cuda_internal.h"

/* Where the rows of one (batch, head) of q, k, v (and out, dout, the gradients) sit, in elements:
 * row i of head h of batch bi is at bi * batch + h * head + i * row. Layout 0 [b, heads, n, D]:
 * head = n D, row = D; layout 1 [b, n, heads, D]: head = D, row = heads D. batch = heads n D in
 * both. lse, D and lse2 are [b, hq, s] whatever the layout. */
typedef struct {
    int64_t batch, head, row;
} gt_flash_stride;

typedef struct {
    const __nv_bfloat16 *q, *k, *v, *o, *g; /* o, g (= dout): backward only */
    __nv_bfloat16 *out, *dq, *dk, *dv;      /* out: forward; dq, dk, dv: backward */
    float *lse;                             /* written by the forward, read by the backward */
    const float *dsum;                      /* D_i = sum_c dO_ic O_ic (backward) */
    const float *lse2; /* backward: lse_i log2 e, +inf where lse_i = -inf (a row that saw no key:
                        * then p = 2^(x - lse2) = 0 with no test) */
    int64_t b, hq, hkv, s, t;
    gt_flash_stride sq, skv; /* sq: q, o, g, out, dq ([b, hq, s, D]); skv: k, v, dk, dv */
    int d, causal;
    float scale, scale_log2; /* scale and scale * log2(e) */
    const int64_t *pos;      /* document positions [b, s] (block-causal), or NULL */
} gt_flash;

/* True when the bf16 flash kernels can run this call (the caller validated the shapes). */
bool gt_cuda_flash_fits(const gt_kernel_call *c, int64_t d, int64_t dv, int64_t t);
/* True when the call's tensors are the flash kind whatever the head dims: bf16 (f32 lse), 16-byte
 * aligned. cuDNN takes such calls for head dims the flash kernels lack (d 192, dv 128). */
bool gt_cuda_flash_io(const gt_kernel_call *c);
/* Forward: out, lse. */
gt_status gt_cuda_flash_fwd(gt_cuda_stream *s, const gt_kernel_call *c, const gt_flash *f,
                            gt_error *err);
/* Backward: D and lse2 into f->dsum / f->lse2 (scratch of 2 b hq s floats, written here), then
 * dk/dv (one block per key tile) and dq (one block per query tile). */
gt_status gt_cuda_flash_bwd(gt_cuda_stream *s, const gt_kernel_call *c, const gt_flash *f,
                            gt_error *err);

#ifdef __CUDACC__
/* ---------------------------------------------------------------- device helpers
 * Fragments of mma.m16n8k16 (lane = 4 * g + q, g = lane / 4, q = lane % 4):
 *   A (16x16, row): a0 = A[g][2q..2q+1], a1 = A[g+8][2q..], a2 = A[g][2q+8..], a3 = A[g+8][2q+8..]
 *   B (16x8, col):  b0 = B[2q..2q+1][g],  b1 = B[2q+8..2q+9][g]
 *   C (16x8, f32):  c0, c1 = C[g][2q], C[g][2q+1];  c2, c3 = C[g+8][2q], C[g+8][2q+1]
 * Tiles sit in shared memory as [rows][D + 8] bf16: the 16-byte pad keeps rows 16-byte aligned and
 * puts the 8 rows a fragment load touches in different banks. */
#define GT_FLASH_PAD 8

__device__ __forceinline__ void gt_mma_bf16(float c[4], const uint32_t a[4], uint32_t b0,
                                            uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* c0 += a B0 and c1 += a B1, where b holds B0 (b[0], b[1]) and B1 (b[2], b[3]) as gt_frag_bt2 and
 * gt_frag_b2 load them: one A fragment against two adjacent 8-column blocks. */
__device__ __forceinline__ void gt_mma_bf16x2(float c0[4], float c1[4], const uint32_t a[4],
                                              const uint32_t b[4])
{
    gt_mma_bf16(c0, a, b[0], b[1]);
    gt_mma_bf16(c1, a, b[2], b[3]);
}

/* 2^x on the special-function unit with denormal results flushed to zero (ex2.approx.ftz: one
 * instruction; exp2f adds a range test and two multiplies to produce results below 2^-126,
 * which no softmax weight of a row whose largest weight is 1 can usefully carry). 2^-inf = 0. */
__device__ __forceinline__ float gt_exp2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

/* Two consecutive bf16 as one 32-bit word (the lower index in the low half). */
__device__ __forceinline__ uint32_t gt_ld2(const __nv_bfloat16 *p)
{
    return *(const uint32_t *)p;
}

/* Rounds two floats to bf16 (nearest even) and packs them, x in the low half. */
__device__ __forceinline__ uint32_t gt_packf(float x, float y)
{
    __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
    return *(uint32_t *)&h;
}

/* Four 8x8 bf16 matrices by ldmatrix: lanes 8i..8i+7 give the row addresses of matrix i (16 bytes
 * each); matrix i lands in r[i] in the mma fragment layout (lane 4g + q holds row g, cols 2q, 2q+1;
 * .trans: the transposed matrix). With the [rows][D + 8] layout the 8 rows of one matrix start in
 * 8 different 16-byte bank groups, so the loads are conflict-free. */
__device__ __forceinline__ void gt_ldsm4(uint32_t r[4], const __nv_bfloat16 *p)
{
    uint32_t addr = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void gt_ldsm4_t(uint32_t r[4], const __nv_bfloat16 *p)
{
    uint32_t addr = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

/* A fragment of the 16x16 block at sh[row0.., col0..] (leading dimension ld): matrices
 * (rows +0, cols +0), (+8, +0), (+0, +8), (+8, +8) are a0..a3. */
__device__ __forceinline__ void gt_frag_a(uint32_t a[4], const __nv_bfloat16 *sh, int ld, int row0,
                                          int col0, int lane)
{
    int mat = lane / 8;
    gt_ldsm4(a, sh + (row0 + (mat & 1) * 8 + lane % 8) * ld + col0 + (mat >> 1) * 8);
}

/* Two "M^T" B fragments (see gt_frag_bt) for columns n0..n0+7 (b[0], b[1]) and n0+8..n0+15 (b[2],
 * b[3]) in one ldmatrix: b0 of column block n is the 8x8 matrix M[n0 + 8n..][k0..k0+7]. */
__device__ __forceinline__ void gt_frag_bt2(uint32_t b[4], const __nv_bfloat16 *sh, int ld, int n0,
                                            int k0, int lane)
{
    int mat = lane / 8;
    gt_ldsm4(b, sh + (n0 + (mat >> 1) * 8 + lane % 8) * ld + k0 + (mat & 1) * 8);
}

/* Two B fragments as gt_frag_b (B[k][n] = M[k0 + k][n0 + n]) for columns n0.. (b[0], b[1]) and
 * n0 + 8.. (b[2], b[3]), by one ldmatrix .trans. */
__device__ __forceinline__ void gt_frag_b2(uint32_t b[4], const __nv_bfloat16 *sh, int ld, int k0,
                                           int n0, int lane)
{
    int mat = lane / 8;
    gt_ldsm4_t(b, sh + (k0 + (mat & 1) * 8 + lane % 8) * ld + n0 + (mat >> 1) * 8);
}

/* B fragment where B[k][n] = M[n0 + n][k0 + k] (M row-major in shared memory: "M^T"). */
__device__ __forceinline__ void gt_frag_bt(uint32_t &b0, uint32_t &b1, const __nv_bfloat16 *sh,
                                           int ld, int n0, int k0, int lane)
{
    const __nv_bfloat16 *p = sh + (n0 + lane / 4) * ld + k0 + (lane % 4) * 2;
    b0 = gt_ld2(p);
    b1 = gt_ld2(p + 8);
}

/* B fragment where B[k][n] = M[k0 + k][n0 + n] (M row-major: pairs run down a column), by
 * ldmatrix .trans: lanes 0-7 / 8-15 give the addresses of rows k0..k0+7 / k0+8..k0+15 (8 bf16 =
 * 16 bytes from column n0 each); the transposed 8x8 matrices land as b0 and b1. */
__device__ __forceinline__ void gt_frag_b(uint32_t &b0, uint32_t &b1, const __nv_bfloat16 *sh,
                                          int ld, int k0, int n0, int lane)
{
    uint32_t addr = (uint32_t)__cvta_generic_to_shared(sh + (k0 + lane % 16) * ld + n0);
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(b0), "=r"(b1)
                 : "r"(addr));
}

/* A fragment (16 rows x 16 cols, k-step kc) from two f32 C tiles (cols 16kc..+7 and +8..+15):
 * the C layout of an m16n8 product is the A layout of the next m16n8k16. */
__device__ __forceinline__ void gt_c_to_a(uint32_t a[4], const float c0[4], const float c1[4])
{
    a[0] = gt_packf(c0[0], c0[1]);
    a[1] = gt_packf(c0[2], c0[3]);
    a[2] = gt_packf(c1[0], c1[1]);
    a[3] = gt_packf(c1[2], c1[3]);
}

/* acc += C B for a warp's MT row blocks: C is an f32 product the warp holds ([MT][CN / 8][4], e.g.
 * P or dS over a key tile of CN columns), rounded to bf16 A fragments k-step by k-step, and B the
 * [CN][D] bf16 tile at bs (row stride ld) in shared memory: O += P V, dQ += dS K. */
template <int MT, int CN, int D>
__device__ __forceinline__ void gt_flash_acc_cb(float (&acc)[MT][D / 8][4],
                                                const float (&c)[MT][CN / 8][4],
                                                const __nv_bfloat16 *bs, int ld, int lane)
{
#pragma unroll
    for (int kc = 0; kc < CN / 16; kc++) {
        uint32_t a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
            gt_c_to_a(a[mt], c[mt][2 * kc], c[mt][2 * kc + 1]);
#pragma unroll
        for (int n = 0; n < D / 8; n += 2) {
            uint32_t b[4];
            gt_frag_b2(b, bs, ld, kc * 16, n * 8, lane);
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
                gt_mma_bf16x2(acc[mt][n], acc[mt][n + 1], a[mt], b);
        }
    }
}

/* Element offset of head h of batch bi (computed once per block; rows then add i * st.row). */
__device__ __forceinline__ int64_t gt_flash_at(const gt_flash_stride &st, int64_t bi, int64_t h)
{
    return bi * st.batch + h * st.head;
}

/* The first key query row i of batch bi sees: its document's start (0 without documents). The
 * positions are not checked on the device (the CPU kernel checks them; the loader makes them):
 * a position above i gives 0, never a key before the sequence. */
__device__ __forceinline__ int64_t gt_flash_start(const gt_flash &f, int64_t bi, int64_t i)
{
    int64_t st = f.pos && i < f.s ? i - f.pos[bi * f.s + i] : 0;
    return st > 0 ? st : 0;
}

/* The smallest and largest document start of query rows [r0, r0 + n) that exist (0 and 0 without
 * documents). A warp reduction: all 32 lanes of the calling warp take part (the callers run it in
 * warp-uniform code), each reads every 32nd row, and every lane gets the same values. Called per
 * tile in the dK/dV loop, so a serial scan of the rows would cost more than the tile's products. */
__device__ __forceinline__ void gt_flash_start_range(const gt_flash &f, int64_t bi, int64_t r0,
                                                     int n, int64_t *lo, int64_t *hi)
{
    if (!f.pos) {
        *lo = *hi = 0;
        return;
    }
    long long a = INT64_MAX, b = 0;
    for (int64_t i = r0 + threadIdx.x % 32; i < r0 + n && i < f.s; i += 32) {
        long long st = gt_flash_start(f, bi, i);
        a = st < a ? st : a;
        b = st > b ? st : b;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        long long x = __shfl_xor_sync(0xffffffffu, a, o), y = __shfl_xor_sync(0xffffffffu, b, o);
        a = x < a ? x : a;
        b = y > b ? y : b;
    }
    *lo = a == INT64_MAX ? r0 : a;
    *hi = b;
}

/* Copies rows [r0, r0 + ROWS) of a [rows, D] bf16 matrix whose rows are ld elements apart (D in
 * layout 0, heads * D in layout 1) into sh ([ROWS][D + PAD]) with 16-byte loads; rows at or past
 * `rows` become 0. (Once per block, for the Q and dO tiles: the row product is not in a loop.) */
template <int ROWS, int D>
__device__ __forceinline__ void gt_flash_load(__nv_bfloat16 *sh, const __nv_bfloat16 *g, int64_t r0,
                                              int64_t rows, int64_t ld)
{
    constexpr int VPR = D / 8; /* 16-byte vectors per row */
    for (int i = threadIdx.x; i < ROWS * VPR; i += blockDim.x) {
        int r = i / VPR, v = i - r * VPR;
        uint4 x = make_uint4(0, 0, 0, 0);
        if (r0 + r < rows) x = *(const uint4 *)(g + (r0 + r) * ld + v * 8);
        *(uint4 *)(sh + r * (D + GT_FLASH_PAD) + v * 8) = x;
    }
}

/* cp.async (sm_80+): 16 bytes global -> shared without a register round trip; src_size 0 fills
 * the 16 bytes with zeros (rows past the end). .cg bypasses L1 (tiles are read once per block). */
__device__ __forceinline__ void gt_cp_async16(void *sh, const void *g, bool valid)
{
    uint32_t addr = (uint32_t)__cvta_generic_to_shared(sh);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(addr), "l"(g),
                 "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void gt_cp_async4(void *sh, const void *g, bool valid)
{
    uint32_t addr = (uint32_t)__cvta_generic_to_shared(sh);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(addr), "l"(g),
                 "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void gt_cp_async8(void *sh, const void *g, bool valid)
{
    uint32_t addr = (uint32_t)__cvta_generic_to_shared(sh);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(addr), "l"(g),
                 "r"(valid ? 8 : 0));
}
__device__ __forceinline__ void gt_cp_commit(void)
{
    asm volatile("cp.async.commit_group;\n" ::);
}
/* Waits until at most N of this thread's committed groups are still in flight. */
template <int N> __device__ __forceinline__ void gt_cp_wait(void)
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

/* gt_flash_load by cp.async (not committed: the caller commits and waits); rows at or past `rows`
 * are zero-filled (their source address is clamped to row 0, which is not read). This one runs in
 * the streaming loops of blocks of THREADS threads: thread i moves 16-byte vector i % VPR of rows
 * i / VPR, + THREADS / VPR, ... (a fixed, unrolled count) by walking one pointer down its rows,
 * one 64-bit add per load. A product (r0 + r) * ld per row instead (which the compiler turns
 * into offsets j * step kept live across the callers' loops: registers, spills at d = 128)
 * measured sdpa fwd + bwd (H200, b 8, hq 32, hkv 8, s 2048, causal) 2.89 ms at d = 64 and 5.97 ms
 * at d = 128; this loop 2.61 and 5.12 ms, in both layouts (the layout-0-only kernels with the
 * constant row stride D before it: 2.81 and 5.72). */
template <int ROWS, int D, int THREADS>
__device__ __forceinline__ void gt_flash_load_async(__nv_bfloat16 *sh, const __nv_bfloat16 *g,
                                                    int64_t r0, int64_t rows, int64_t ld)
{
    constexpr int VPR = D / 8, RSTEP = THREADS / VPR; /* rows per pass of the block */
    static_assert(THREADS % VPR == 0 && ROWS % RSTEP == 0, "whole rows per pass, whole passes");
    int r = threadIdx.x / VPR, v = threadIdx.x % VPR;
    const __nv_bfloat16 *p = g + (r0 + r) * ld + v * 8;
    int64_t pstep = RSTEP * ld;
#pragma unroll
    for (int j = 0; j < ROWS / RSTEP; j++, r += RSTEP, p += pstep) {
        bool in = r0 + r < rows;
        gt_cp_async16(sh + r * (D + GT_FLASH_PAD) + v * 8, in ? p : g, in);
    }
}
#endif

#endif
