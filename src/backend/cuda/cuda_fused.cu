/* cuda_fused.cu — fused_elementwise on the GPU: one kernel runs the node's program (encoding in
 * src/ir/fused_program.h) element by element, so the intermediates stay in registers.
 *
 * Bits. Each instruction computes exactly what its op's kernel in cuda_elementwise.cu computes —
 * the same formulas (gt_fk_sigmoid is gt_sigmoidf: 1 / (1 + expf(-x)); rsqrt is 1 / sqrtf(x);
 * silu_backward with the same explicitly rounded products) on the same f32 operands — and then
 * rounds to the dtype that op's output had (__float2bfloat16_rn / __float2half_rn and back), as
 * the unfused store and reload did. Products, sums and quotients between instructions use the
 * explicitly rounded intrinsics (__fmul_rn, __fadd_rn, __fsub_rn, __fdiv_rn): they give the
 * IEEE results the unfused kernels' plain operators give there (each stands alone in its kernel,
 * nothing to contract with), and they can never be contracted into a multiply-add with a
 * neighbouring instruction here, which would round once where the unfused graph rounded twice.
 *
 * Speed. These kernels are memory bound, and a program is interpreted at run time, so the
 * interpretation must be cheap per element and must not cost occupancy. The vector kernel gives
 * a thread a pack of V consecutive outputs (V = 8 when every tensor is 16-bit, else 4: one load
 * of at most 16 bytes per input); every branch on the program is uniform across the grid and is
 * paid once per pack. All inputs are loaded at the start of a pack (their loads are in flight
 * together), raw, and widened when an instruction reads them. Temporaries live in R register
 * slots (R = 2 allocated on the host by liveness, which chains and the usual trees need; 8
 * otherwise), indexed through constant-index selects so that they stay in registers; the
 * instantiation is the smallest that holds the node's inputs. A row input (one element per
 * output row, as the MoE combine's [rows, 1] weights) is read once a pack, as a scalar is: on
 * the general kernel the combine's 100 M-element products ran at a sixth of the bandwidth (11 of
 * the 16B_4layers step's 102 ms). Inputs that are none of these (a general broadcast, a
 * misaligned view), and the tail of fewer than V elements, go to the general kernel: one element
 * per thread, offsets through the broadcast strides as the general binary kernel computes them. The
 * interpreter's per-pack work costs it bandwidth (1.7 TB/s on an H200 for a three-op bf16 program,
 * about what the unfused kernels take together), so the hot two-op programs of the llama3 step get
 * compile-time kernels (gt_k_fused2, below) that run at the unfused kernels' 4+ TB/s. */
#include "cuda_internal.h"
#include "ir/fused_program.h"

#include <math.h>
#include <string.h>

/* Input access kinds (per input, chosen on the host). The vector kernel takes VEC, VEC_MOD,
 * SCALAR and ROW (when a pack never straddles two rows), the general kernel all. */
enum {
    GT_FK_VEC = 0, /* vector load at element i0 (same numel as the output), aligned */
    GT_FK_VEC_MOD, /* vector load at i0 % mod (a broadcast of the output's trailing dims) */
    GT_FK_SCALAR,  /* one element */
    GT_FK_FLAT,    /* element i (same numel, misaligned) */
    GT_FK_MOD,     /* element i % mod (trailing broadcast, misaligned or mod % V != 0) */
    GT_FK_GENERAL, /* through the broadcast strides */
    GT_FK_ROW,     /* element i / mod: x is the output's leading dims, its trailing ones
                    * broadcast (a per-row scale such as the MoE combine's [rows, 1] weights) */
};

typedef struct {
    const void *in[GT_MAX_IN];
    int64_t mod[GT_MAX_IN];
    int64_t stride[GT_MAX_IN][GT_MAX_DIMS];
    int64_t shape[GT_MAX_DIMS];
    int dt[GT_MAX_IN];
    int kind[GT_MAX_IN];
    int ndim, n_in, n_ins;
    /* per instruction: op, result dtype, operands (< GT_FUSED_TEMP: input; else temp slot +
     * GT_FUSED_TEMP), destination slot, constants */
    int op[GT_FUSED_MAX_INS], rdt[GT_FUSED_MAX_INS];
    int src0[GT_FUSED_MAX_INS], src1[GT_FUSED_MAX_INS], dst[GT_FUSED_MAX_INS];
    float c0[GT_FUSED_MAX_INS], c1[GT_FUSED_MAX_INS];
    void *out;
    int dout;
} gt_fused_args;

/* ---------------------------------------------------------------- per-element math */

/* gt_sigmoidf of cuda_elementwise.cu, verbatim. */
__device__ __forceinline__ float gt_fk_sigmoid(float x)
{
    return 1.0f / (1.0f + expf(-x));
}

/* r = op(a, b) lane by lane; the switch is uniform, the lane loops are unrolled. */
template <int V>
__device__ __forceinline__ void gt_fk_apply(int op, const float *a, const float *b, float c0,
                                            float c1, float *r)
{
    switch (op) {
    case GT_OP_ADD:
#pragma unroll
        for (int l = 0; l < V; l++)
            r[l] = __fadd_rn(a[l], b[l]);
        break;
    case GT_OP_SUB:
#pragma unroll
        for (int l = 0; l < V; l++)
            r[l] = __fsub_rn(a[l], b[l]);
        break;
    case GT_OP_MUL:
#pragma unroll
        for (int l = 0; l < V; l++)
            r[l] = __fmul_rn(a[l], b[l]);
        break;
    case GT_OP_DIV:
#pragma unroll
        for (int l = 0; l < V; l++)
            r[l] = __fdiv_rn(a[l], b[l]);
        break;
    case GT_OP_SILU_BACKWARD: /* dy * s * (1 + x * (1 - s)); x = a, dy = b */
#pragma unroll
        for (int l = 0; l < V; l++) {
            float x = a[l], s = gt_fk_sigmoid(x);
            r[l] = __fmul_rn(__fmul_rn(b[l], s), __fadd_rn(1.0f, __fmul_rn(x, 1.0f - s)));
        }
        break;
    case GT_OP_NEG:
#pragma unroll
        for (int l = 0; l < V; l++)
            r[l] = -a[l];
        break;
    case GT_OP_EXP:
#pragma unroll
        for (int l = 0; l < V; l++)
            r[l] = expf(a[l]);
        break;
    case GT_OP_LOG:
#pragma unroll
        for (int l = 0; l < V; l++)
            r[l] = logf(a[l]);
        break;
    case GT_OP_SQRT:
#pragma unroll
        for (int l = 0; l < V; l++)
            r[l] = sqrtf(a[l]);
        break;
    case GT_OP_RSQRT:
#pragma unroll
        for (int l = 0; l < V; l++)
            r[l] = 1.0f / sqrtf(a[l]);
        break;
    case GT_OP_SILU:
#pragma unroll
        for (int l = 0; l < V; l++)
            r[l] = __fmul_rn(a[l], gt_fk_sigmoid(a[l]));
        break;
    case GT_OP_SIGMOID:
#pragma unroll
        for (int l = 0; l < V; l++)
            r[l] = gt_fk_sigmoid(a[l]);
        break;
    case GT_OP_SCALE:
#pragma unroll
        for (int l = 0; l < V; l++)
            r[l] = __fmul_rn(c0, a[l]);
        break;
    case GT_OP_ADD_SCALAR:
#pragma unroll
        for (int l = 0; l < V; l++)
            r[l] = __fadd_rn(a[l], c0);
        break;
    case GT_OP_CLAMP: /* comparisons are false for NaN, so NaN passes through */
#pragma unroll
        for (int l = 0; l < V; l++)
            r[l] = a[l] < c0 ? c0 : a[l] > c1 ? c1 : a[l];
        break;
    default: /* cast: the value; the rounding to its dtype follows */
#pragma unroll
        for (int l = 0; l < V; l++)
            r[l] = a[l];
    }
}

/* ---------------------------------------------------------------- operands */

/* Loads V elements of dtype dt at element b of p (16-byte aligned pack of V * size bytes <= 16)
 * into w, raw. */
template <int V>
__device__ __forceinline__ void gt_fk_load(const void *p, int dt, int64_t b, uint4 &w)
{
    if (dt == GT_F32 || V == 8) {
        const size_t es = dt == GT_F32 ? 4 : 2;
        w = *(const uint4 *)((const char *)p + b * es);
    } else { /* V == 4, 16-bit: 8 bytes */
        uint2 h = *(const uint2 *)((const uint16_t *)p + b);
        w.x = h.x;
        w.y = h.y;
    }
}

/* Widens a raw pack (exact). */
template <int V> __device__ __forceinline__ void gt_fk_unpack(const uint4 &w, int dt, float *a)
{
    const uint32_t u[4] = {w.x, w.y, w.z, w.w};
    if (dt == GT_F32) {
#pragma unroll
        for (int l = 0; l < V && l < 4; l++)
            a[l] = __uint_as_float(u[l]);
    } else if (dt == GT_BF16) {
#pragma unroll
        for (int l = 0; l < V; l++)
            a[l] = __uint_as_float((l & 1 ? u[l >> 1] >> 16 : u[l >> 1] & 0xffffu) << 16);
    } else {
#pragma unroll
        for (int l = 0; l < V; l++)
            a[l] = __half2float(
                __ushort_as_half((unsigned short)(l & 1 ? u[l >> 1] >> 16 : u[l >> 1] & 0xffffu)));
    }
}

/* Element offset of input s at output index i (per-lane path). */
__device__ __forceinline__ int64_t gt_fk_offset(const gt_fused_args &P, int s, int64_t i)
{
    switch (P.kind[s]) {
    case GT_FK_SCALAR:
        return 0;
    case GT_FK_MOD:
    case GT_FK_VEC_MOD:
        return i % P.mod[s];
    case GT_FK_ROW:
        return i / P.mod[s];
    case GT_FK_GENERAL: {
        int64_t off = 0;
        for (int d = P.ndim - 1; d >= 0; d--) {
            int64_t q = i / P.shape[d];
            off += (i - q * P.shape[d]) * P.stride[s][d];
            i = q;
        }
        return off;
    }
    default:
        return i;
    }
}

template <int V, int R>
__device__ __forceinline__ void gt_fk_get_temp(const float (&t)[R][V], int slot, float *a)
{
#pragma unroll
    for (int q = 0; q < R; q++)
        if (q == slot) {
#pragma unroll
            for (int l = 0; l < V; l++)
                a[l] = t[q][l];
        }
}

template <int V, int R>
__device__ __forceinline__ void gt_fk_put_temp(float (&t)[R][V], int slot, const float *r)
{
#pragma unroll
    for (int q = 0; q < R; q++)
        if (q == slot) {
#pragma unroll
            for (int l = 0; l < V; l++)
                t[q][l] = r[l];
        }
}

/* Whether op reads two operands. */
static __host__ __device__ constexpr bool gt_fk_binary(int op)
{
    return op == GT_OP_ADD || op == GT_OP_SUB || op == GT_OP_MUL || op == GT_OP_DIV ||
           op == GT_OP_SILU_BACKWARD;
}

/* Operand src of the pack at i0 into a: a temp, a raw vector loaded at the pack's start, or one
 * element for every lane (a scalar input, or a row input: the pack lies in one row). */
template <int V, int NIN, int R>
__device__ __forceinline__ void gt_fk_fetch(const gt_fused_args &P, int src, int64_t i0,
                                            const uint4 (&raw)[NIN], const float (&t)[R][V],
                                            float *a)
{
    if (src >= GT_FUSED_TEMP) {
        gt_fk_get_temp<V, R>(t, src - GT_FUSED_TEMP, a);
        return;
    }
    int dt = P.dt[src];
    if (P.kind[src] == GT_FK_SCALAR || P.kind[src] == GT_FK_ROW) {
        float v = gt_ld(P.in[src], dt, P.kind[src] == GT_FK_ROW ? i0 / P.mod[src] : 0);
#pragma unroll
        for (int l = 0; l < V; l++)
            a[l] = v;
        return;
    }
#pragma unroll
    for (int q = 0; q < NIN; q++)
        if (q == src) gt_fk_unpack<V>(raw[q], dt, a);
}

/* The vector kernel: packs [0, n_packs) of V elements; every input is a vector (VEC, VEC_MOD)
 * or a scalar, the output 16-byte aligned. */
template <int V, int NIN, int R>
__global__ void __launch_bounds__(GT_CUDA_THREADS)
    gt_k_fused_vec(const __grid_constant__ gt_fused_args P, int64_t n_packs)
{
    GT_GRID_STRIDE(p, n_packs)
    {
        int64_t i0 = p * V;
        uint4 raw[NIN];
#pragma unroll
        for (int s = 0; s < NIN; s++) {
            raw[s] = make_uint4(0, 0, 0, 0);
            if (s < P.n_in && P.kind[s] != GT_FK_SCALAR && P.kind[s] != GT_FK_ROW)
                gt_fk_load<V>(P.in[s], P.dt[s], P.kind[s] == GT_FK_VEC ? i0 : i0 % P.mod[s],
                              raw[s]);
        }
        float t[R][V];
#pragma unroll
        for (int q = 0; q < R; q++)
#pragma unroll
            for (int l = 0; l < V; l++)
                t[q][l] = 0.0f;
        float r[V];
#pragma unroll 1
        for (int k = 0; k < P.n_ins; k++) {
            float a[V], b[V];
            int op = P.op[k];
            gt_fk_fetch<V, NIN, R>(P, P.src0[k], i0, raw, t, a);
            if (gt_fk_binary(op))
                gt_fk_fetch<V, NIN, R>(P, P.src1[k], i0, raw, t, b);
            else
#pragma unroll
                for (int l = 0; l < V; l++)
                    b[l] = 0.0f;
            gt_fk_apply<V>(op, a, b, P.c0[k], P.c1[k], r);
            int rdt = P.rdt[k];
#pragma unroll
            for (int l = 0; l < V; l++)
                r[l] = gt_round_dt(rdt, r[l]);
            if (k + 1 < P.n_ins) gt_fk_put_temp<V, R>(t, P.dst[k], r);
        }
        /* r holds the last instruction's result, already rounded to the output's dtype */
        uint32_t u[4] = {0, 0, 0, 0};
        if (P.dout == GT_F32) {
#pragma unroll
            for (int l = 0; l < V && l < 4; l++)
                u[l] = __float_as_uint(r[l]);
        } else {
#pragma unroll
            for (int l = 0; l < V; l++) {
                uint32_t h = P.dout == GT_BF16
                                 ? (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(r[l]))
                                 : (uint32_t)__half_as_ushort(__float2half_rn(r[l]));
                u[l >> 1] |= l & 1 ? h << 16 : h;
            }
        }
        if (P.dout == GT_F32 || V == 8) {
            const size_t es = P.dout == GT_F32 ? 4 : 2;
            *(uint4 *)((char *)P.out + i0 * es) = make_uint4(u[0], u[1], u[2], u[3]);
        } else {
            *(uint2 *)((uint16_t *)P.out + i0) = make_uint2(u[0], u[1]);
        }
    }
}

/* The general kernel: one element per thread, elements [start, n), every input through its
 * offset (any broadcast, any alignment); 8 temp slots. */
__global__ void __launch_bounds__(GT_CUDA_THREADS)
    gt_k_fused_any(const __grid_constant__ gt_fused_args P, int64_t start, int64_t n)
{
    GT_GRID_STRIDE(j, n - start)
    {
        int64_t i = start + j;
        float t[8][1];
#pragma unroll
        for (int q = 0; q < 8; q++)
            t[q][0] = 0.0f;
        float r = 0.0f;
#pragma unroll 1
        for (int k = 0; k < P.n_ins; k++) {
            int op = P.op[k];
            float a = 0.0f, b = 0.0f;
            for (int q = 0; q < 2; q++) {
                int src = q ? P.src1[k] : P.src0[k];
                if (q && !gt_fk_binary(op)) break;
                float v;
                if (src >= GT_FUSED_TEMP)
                    gt_fk_get_temp<1, 8>(t, src - GT_FUSED_TEMP, &v);
                else
                    v = gt_ld(P.in[src], P.dt[src], gt_fk_offset(P, src, i));
                if (q)
                    b = v;
                else
                    a = v;
            }
            gt_fk_apply<1>(op, &a, &b, P.c0[k], P.c1[k], &r);
            r = gt_round_dt(P.rdt[k], r);
            if (k + 1 < P.n_ins) gt_fk_put_temp<1, 8>(t, P.dst[k], &r);
        }
        gt_st(P.out, P.dout, i, r);
    }
}

/* ---------------------------------------------------------------- two-op patterns
 *
 * The programs the llama3 step graph fuses most often, and on its largest tensors, are two
 * instructions on one dtype: silu(x) * y (SwiGLU forward), silu_backward(x, dy * y) (its
 * backward) and a + b + c (gradient accumulation). For those, when every input has the output's
 * shape and alignment, a kernel with the two ops fixed at compile time does what the vector
 * kernel does without interpreting: 16-byte packs, the same per-element math (gt_fk_apply with a
 * constant op folds to one case) and the same rounding of the intermediate, so the bits are the
 * interpreter's, hence the unfused graph's. */

template <typename T> struct alignas(16) gt_fk_pack {
    T e[16 / sizeof(T)];
};

template <typename T> __device__ __forceinline__ float gt_fk_to_f(T v);
template <> __device__ __forceinline__ float gt_fk_to_f<float>(float v)
{
    return v;
}
template <> __device__ __forceinline__ float gt_fk_to_f<__nv_bfloat16>(__nv_bfloat16 v)
{
    return __bfloat162float(v);
}

template <typename T> __device__ __forceinline__ T gt_fk_from_f(float v);
template <> __device__ __forceinline__ float gt_fk_from_f<float>(float v)
{
    return v;
}
template <> __device__ __forceinline__ __nv_bfloat16 gt_fk_from_f<__nv_bfloat16>(float v)
{
    return __float2bfloat16_rn(v);
}

/* One pack of out = OP1(OP0(x, y), z) (T0_FIRST) or OP1(z, OP0(x, y)); y is used only when OP0
 * is binary. */
template <typename T, int OP0, int OP1, bool T0_FIRST>
__device__ __forceinline__ gt_fk_pack<T> gt_fk_two(const gt_fk_pack<T> &x, const gt_fk_pack<T> &y,
                                                   const gt_fk_pack<T> &z)
{
    const int V = 16 / sizeof(T);
    const int dt = sizeof(T) == 4 ? GT_F32 : GT_BF16;
    const bool bin0 = gt_fk_binary(OP0);
    gt_fk_pack<T> r;
#pragma unroll
    for (int l = 0; l < V; l++) {
        float u = gt_fk_to_f<T>(x.e[l]), w = bin0 ? gt_fk_to_f<T>(y.e[l]) : 0.0f, t, o;
        gt_fk_apply<1>(OP0, &u, &w, 0.0f, 0.0f, &t);
        t = gt_round_dt(dt, t);
        float v = gt_fk_to_f<T>(z.e[l]);
        if (T0_FIRST)
            gt_fk_apply<1>(OP1, &t, &v, 0.0f, 0.0f, &o);
        else
            gt_fk_apply<1>(OP1, &v, &t, 0.0f, 0.0f, &o);
        r.e[l] = gt_fk_from_f<T>(o);
    }
    return r;
}

/* out = OP1(OP0(a, b), c) (T0_FIRST) or OP1(c, OP0(a, b)), element by element over n_packs full
 * packs; b is read only when OP0 is binary. */
template <typename T, int OP0, int OP1, bool T0_FIRST>
__global__ void __launch_bounds__(GT_CUDA_THREADS)
    gt_k_fused2(int64_t n_packs, const T *a, const T *b, const T *c, T *out)
{
    const bool bin0 = gt_fk_binary(OP0);
    GT_GRID_STRIDE(i, n_packs)
    {
        gt_fk_pack<T> x = ((const gt_fk_pack<T> *)a)[i], z = ((const gt_fk_pack<T> *)c)[i], y = x;
        if (bin0) y = ((const gt_fk_pack<T> *)b)[i];
        ((gt_fk_pack<T> *)out)[i] = gt_fk_two<T, OP0, OP1, T0_FIRST>(x, y, z);
    }
}

/* The SwiGLU backward after fusion_merge.c: one program of three two-instruction pieces over
 * (h1, h3, dy) — y2 = silu(h1) h3, dh3 = dy silu(h1), dh1 = silu_backward(h1, dy h3) — as one
 * kernel that loads each input once per pack, takes sigmoid(h1) once per element for all three
 * pieces and stores the three outputs. Each result is computed with the formulas, operand order
 * and roundings of gt_fk_apply and gt_fk_two (silu(x) = x sigmoid(x) rounded to T; the product
 * dy h3 rounded to T; silu_backward(x, g) = (g s)(1 + x (1 - s))), so the bits are those of the
 * unfused kernels. (Reading each piece's operands through its own pointers, relying on L1 for
 * the repeats, moved 2.4 TB/s at the 1B shape; loading once but computing the sigmoid per piece,
 * 2.9 TB/s: the kernel was bound by the three accurate expf and divisions per element.) */
template <typename T>
__global__ void __launch_bounds__(GT_CUDA_THREADS)
    gt_k_swiglu_bwd(int64_t n_packs, const T *h1, const T *h3, const T *dy, T *y2, T *dh3, T *dh1)
{
    typedef gt_fk_pack<T> pk;
    const int V = 16 / sizeof(T), dt = sizeof(T) == 4 ? GT_F32 : GT_BF16;
    GT_GRID_STRIDE(i, n_packs)
    {
        pk a = ((const pk *)h1)[i], b = ((const pk *)h3)[i], d = ((const pk *)dy)[i], o0, o1, o2;
#pragma unroll
        for (int l = 0; l < V; l++) {
            float x = gt_fk_to_f<T>(a.e[l]), u = gt_fk_to_f<T>(b.e[l]), g = gt_fk_to_f<T>(d.e[l]);
            float s = gt_fk_sigmoid(x);
            float si = gt_round_dt(dt, __fmul_rn(x, s));
            float p = gt_round_dt(dt, __fmul_rn(g, u));
            o0.e[l] = gt_fk_from_f<T>(__fmul_rn(si, u));
            o1.e[l] = gt_fk_from_f<T>(__fmul_rn(g, si));
            o2.e[l] = gt_fk_from_f<T>(
                __fmul_rn(__fmul_rn(p, s), __fadd_rn(1.0f, __fmul_rn(x, 1.0f - s))));
        }
        ((pk *)y2)[i] = o0;
        ((pk *)dh3)[i] = o1;
        ((pk *)dh1)[i] = o2;
    }
}

/* The MoE combine, [cast(x) f32, mul(t0, w) f32, cast(t1) bf16] with x bf16 and w an f32 row
 * input: out = bf16(f32(x) w[row]), packs of 8, a row of inner_packs packs. The interpreter's
 * math (a product rounded to f32, then to bf16) without interpreting: it ran at ~1 TB/s on the
 * 16B_4layers combine, a third of the copy bandwidth. */
__global__ void __launch_bounds__(GT_CUDA_THREADS)
    gt_k_row_scale(int64_t n_packs, int64_t inner_packs, const __nv_bfloat16 *x, const float *w,
                   __nv_bfloat16 *out)
{
    typedef gt_fk_pack<__nv_bfloat16> pk;
    GT_GRID_STRIDE(i, n_packs)
    {
        pk a = ((const pk *)x)[i], o;
        const float sc = w[i / inner_packs];
#pragma unroll
        for (int l = 0; l < 8; l++)
            o.e[l] = __float2bfloat16_rn(__fmul_rn(__bfloat162float(a.e[l]), sc));
        ((pk *)out)[i] = o;
    }
}

/* ---------------------------------------------------------------- host side */

/* Temp slots by liveness: instruction k's result takes the lowest slot free after its operands
 * are read; a result's slot frees after its last reader. False when more than R are live. */
static bool gt_fk_alloc_slots(const gt_fused_ins *ins, int n_ins, int R, int *dst)
{
    int last[GT_FUSED_MAX_INS];
    for (int k = 0; k < n_ins; k++)
        last[k] = k; /* unread: free right after it is written */
    for (int k = 0; k < n_ins; k++)
        for (int s = 0; s < gt_fused_arity(ins[k].op); s++)
            if (ins[k].src[s] >= GT_FUSED_TEMP) last[ins[k].src[s] - GT_FUSED_TEMP] = k;
    int owner[8];
    for (int q = 0; q < 8; q++)
        owner[q] = -1;
    for (int k = 0; k < n_ins; k++) {
        for (int q = 0; q < R; q++)
            if (owner[q] >= 0 && last[owner[q]] <= k) owner[q] = -1;
        dst[k] = -1;
        for (int q = 0; q < R && dst[k] < 0; q++)
            if (owner[q] < 0) dst[k] = q;
        if (dst[k] < 0) return false;
        owner[dst[k]] = last[k] > k ? k : -1;
    }
    return true;
}

/* Trailing-dims broadcast: x's dims without its leading ones equal the output's last dims, so
 * element i of the output reads element i % numel(x). */
static bool gt_fk_trailing(const gt_tensor *x, const gt_tensor *out)
{
    int lead = 0;
    while (lead < x->ndim && x->shape[lead] == 1)
        lead++;
    int r = x->ndim - lead;
    if (r > out->ndim) return false;
    for (int d = 0; d < r; d++)
        if (x->shape[lead + d] != out->shape[out->ndim - r + d]) return false;
    return true;
}

/* Row broadcast: x's dims, aligned to the output's last ones, equal the output's up to some dim
 * and are 1 after it (x contiguous), so element i of the output reads element i / (the output's
 * elements per x element), returned in *inner (> 1); false otherwise. */
static bool gt_fk_row(const gt_tensor *x, const gt_tensor *out, int64_t *inner)
{
    int pad = out->ndim - x->ndim, k = 0;
    if (pad < 0) return false;
    for (int d = 0; d < x->ndim; d++)
        if (x->shape[d] != 1) k = pad + d + 1;
    for (int d = 0; d < k; d++)
        if ((d < pad ? 1 : x->shape[d - pad]) != out->shape[d]) return false;
    int64_t in = 1;
    for (int d = k; d < out->ndim; d++)
        in *= out->shape[d];
    *inner = in;
    return in > 1;
}

template <int V, int NIN, int R>
static void gt_fk_launch(cudaStream_t st, const gt_fused_args &P, int64_t n_packs)
{
    gt_k_fused_vec<V, NIN, R><<<gt_cuda_blocks(n_packs), GT_CUDA_THREADS, 0, st>>>(P, n_packs);
}

/* The vector kernel for the smallest instantiation that holds the inputs and temps. */
template <int V>
static void gt_fk_launch_v(cudaStream_t st, const gt_fused_args &P, int64_t n_packs, int R)
{
    if (R > 2)
        gt_fk_launch<V, 8, 8>(st, P, n_packs);
    else if (P.n_in <= 2)
        gt_fk_launch<V, 2, 2>(st, P, n_packs);
    else if (P.n_in <= 4)
        gt_fk_launch<V, 4, 2>(st, P, n_packs);
    else
        gt_fk_launch<V, 8, 2>(st, P, n_packs);
}

template <typename T, int OP0, int OP1>
static void gt_fk_launch2(cudaStream_t st, bool t0_first, int64_t n_packs, const void *a,
                          const void *b, const void *c, void *out)
{
    unsigned g = gt_cuda_blocks(n_packs);
    const T *x = (const T *)a, *y = (const T *)b, *z = (const T *)c;
    if (t0_first)
        gt_k_fused2<T, OP0, OP1, true><<<g, GT_CUDA_THREADS, 0, st>>>(n_packs, x, y, z, (T *)out);
    else
        gt_k_fused2<T, OP0, OP1, false><<<g, GT_CUDA_THREADS, 0, st>>>(n_packs, x, y, z, (T *)out);
}

template <typename T>
static void gt_fk_launch2_ops(cudaStream_t st, int pattern, bool t0_first, int64_t n_packs,
                              const void *a, const void *b, const void *c, void *out)
{
    if (pattern == 0)
        gt_fk_launch2<T, GT_OP_SILU, GT_OP_MUL>(st, t0_first, n_packs, a, b, c, out);
    else if (pattern == 1)
        gt_fk_launch2<T, GT_OP_MUL, GT_OP_SILU_BACKWARD>(st, t0_first, n_packs, a, b, c, out);
    else
        gt_fk_launch2<T, GT_OP_ADD, GT_OP_ADD>(st, t0_first, n_packs, a, b, c, out);
}

/* Instructions k0 and k0 + 1 as one of gt_k_fused2's patterns on dtype dt: k0 reads inputs only
 * (a, and b when binary), k0 + 1 reads k0's result once and an input c. */
typedef struct {
    int pattern, ia, ib, ic;
    bool t0_first;
} gt_fk_match;

static bool gt_fk_match2(const gt_fused_ins *ins, int k0, int dt, gt_fk_match *m)
{
    static const int pats[3][2] = {
        {GT_OP_SILU, GT_OP_MUL}, {GT_OP_MUL, GT_OP_SILU_BACKWARD}, {GT_OP_ADD, GT_OP_ADD}};
    const gt_fused_ins *i0 = &ins[k0], *i1 = &ins[k0 + 1];
    int pattern = -1;
    for (int k = 0; k < 3 && pattern < 0; k++)
        if (i0->op == pats[k][0] && i1->op == pats[k][1]) pattern = k;
    if (pattern < 0 || (dt != GT_F32 && dt != GT_BF16) || i0->dtype != dt || i1->dtype != dt)
        return false;
    int ia = i0->src[0], ib = gt_fused_arity(i0->op) == 2 ? i0->src[1] : ia;
    if (ia >= GT_FUSED_TEMP || ib >= GT_FUSED_TEMP) return false;
    int t = GT_FUSED_TEMP + k0;
    bool t0_first = i1->src[0] == t;
    int other = t0_first ? i1->src[1] : i1->src[0];
    if (!t0_first && i1->src[1] != t) return false;
    if (other >= GT_FUSED_TEMP) return false;
    *m = (gt_fk_match){pattern, ia, ib, other, t0_first};
    return true;
}

/* Launches gt_k_fused2 over the first n_main elements (whole packs) when the program is one of
 * its patterns on one dtype (bf16 or f32) with every input a same-shape aligned vector; false
 * (nothing launched) otherwise. */
static bool gt_fk_try_pattern(cudaStream_t st, const gt_kernel_call *c, const gt_fused_ins *ins,
                              const gt_fused_args *P, int64_t n_main)
{
    int dt = P->dout;
    gt_fk_match m;
    if (c->ni != 2 || !gt_fk_match2(ins, 0, dt, &m)) return false;
    const int used[3] = {m.ia, m.ib, m.ic};
    for (int k = 0; k < 3; k++)
        if (P->kind[used[k]] != GT_FK_VEC || P->dt[used[k]] != dt) return false;
    int64_t pv = dt == GT_F32 ? 4 : 8, n_packs = n_main / pv;
    if (n_packs * pv != n_main) return false; /* the vector kernel's pack is not ours */
    if (dt == GT_F32)
        gt_fk_launch2_ops<float>(st, m.pattern, m.t0_first, n_packs, P->in[m.ia], P->in[m.ib],
                                 P->in[m.ic], P->out);
    else
        gt_fk_launch2_ops<__nv_bfloat16>(st, m.pattern, m.t0_first, n_packs, P->in[m.ia],
                                         P->in[m.ib], P->in[m.ic], P->out);
    return true;
}

/* Launches gt_k_row_scale over all n elements when the program is its pattern (the product in
 * either operand order) on an aligned bf16 vector x and an f32 row input of whole packs; false
 * (nothing launched) otherwise. */
static bool gt_fk_try_row_scale(cudaStream_t st, const gt_kernel_call *c, const gt_fused_ins *ins,
                                const gt_fused_args *P, int64_t n)
{
    const int T = GT_FUSED_TEMP;
    if (c->ni != 3 || P->dout != GT_BF16 || !gt_aligned16(P->out) || n % 8) return false;
    const gt_fused_ins *i0 = &ins[0], *i1 = &ins[1], *i2 = &ins[2];
    if (i0->op != GT_OP_CAST || i0->dtype != GT_F32 || i0->src[0] >= T || i1->op != GT_OP_MUL ||
        i1->dtype != GT_F32 || i2->op != GT_OP_CAST || i2->dtype != GT_BF16 || i2->src[0] != T + 1)
        return false;
    int xi = i0->src[0], wi = i1->src[0] == T ? i1->src[1] : i1->src[0];
    if ((i1->src[0] != T && i1->src[1] != T) || wi >= T) return false;
    if (P->kind[xi] != GT_FK_VEC || P->dt[xi] != GT_BF16 || P->kind[wi] != GT_FK_ROW ||
        P->dt[wi] != GT_F32 || P->mod[wi] % 8)
        return false;
    int64_t n_packs = n / 8;
    gt_k_row_scale<<<gt_pack_blocks(n_packs), GT_CUDA_THREADS, 0, st>>>(
        n_packs, P->mod[wi] / 8, (const __nv_bfloat16 *)P->in[xi], (const float *)P->in[wi],
        (__nv_bfloat16 *)P->out);
    return true;
}

/* Whether the program's outputs are self-contained two-instruction pieces of gt_k_fused2's
 * patterns on dtype dt (output q is instruction 2q + 1 and reads only instruction 2q and inputs);
 * fills m[q]. */
static bool gt_fk_pieces(const gt_kernel_call *c, const gt_fused_ins *ins, const int *reg, int no,
                         int dt, gt_fk_match *m)
{
    if (c->ni != 2 * no) return false;
    for (int q = 0; q < no; q++)
        if (reg[q] != 2 * q + 1 || !gt_fk_match2(ins, 2 * q, dt, &m[q])) return false;
    return true;
}

/* Launches gt_k_swiglu_bwd when the program is the SwiGLU backward's three pieces over inputs
 * (h1, h3, dy) — silu(h1) * h3, dy * silu(h1), silu_backward(h1, dy * h3) in either order of the
 * last product's operands (bitwise the same) — on one dtype, every input and output the same
 * numel, a whole number of packs and 16-byte aligned; false (nothing launched) otherwise. */
static bool gt_fk_try_swiglu_bwd(cudaStream_t st, const gt_kernel_call *c, const gt_fused_ins *ins,
                                 const int *reg, int no)
{
    int dt = c->out[0]->dtype;
    int64_t n = gt_tensor_numel(c->out[0]), pv = dt == GT_F32 ? 4 : 8;
    gt_fk_match m[3];
    if (no != 3 || n % pv != 0 || !gt_fk_pieces(c, ins, reg, no, dt, m)) return false;
    if (m[0].pattern != 0 || !m[0].t0_first || m[1].pattern != 0 || m[1].t0_first ||
        m[2].pattern != 1 || m[2].t0_first)
        return false;
    int h1 = m[0].ia, h3 = m[0].ic, dy = m[1].ic;
    bool prod = (m[2].ia == dy && m[2].ib == h3) || (m[2].ia == h3 && m[2].ib == dy);
    if (m[1].ia != h1 || m[2].ic != h1 || !prod) return false;
    for (int k = 0; k < c->n_in; k++)
        if (c->in[k]->dtype != dt || gt_tensor_numel(c->in[k]) != n ||
            !gt_aligned16(c->in[k]->data))
            return false;
    for (int q = 0; q < 3; q++) {
        const gt_tensor *o = c->out[q];
        if (o->dtype != dt || gt_tensor_numel(o) != n || !gt_aligned16(o->data)) return false;
    }
    unsigned g = gt_cuda_blocks(n / pv);
#define GT_FK_SWIGLU_BWD(T)                                                                        \
    gt_k_swiglu_bwd<T><<<g, GT_CUDA_THREADS, 0, st>>>(                                             \
        n / pv, (const T *)c->in[h1]->data, (const T *)c->in[h3]->data,                            \
        (const T *)c->in[dy]->data, (T *)c->out[0]->data, (T *)c->out[1]->data,                    \
        (T *)c->out[2]->data)
    if (dt == GT_F32)
        GT_FK_SWIGLU_BWD(float);
    else
        GT_FK_SWIGLU_BWD(__nv_bfloat16);
#undef GT_FK_SWIGLU_BWD
    return true;
}

/* Checks the whole program against the call and decodes it (output flags are not looked at). */
static gt_status gt_fk_decode(const gt_kernel_call *c, gt_fused_ins *ins, gt_error *err)
{
    const char *name = "fused_elementwise";
    if (c->ni < 1 || c->ni > GT_FUSED_MAX_INS)
        return gt_error_set(err, GT_ERR_INVALID, "%s: %d instructions, expected 1 to %d", name,
                            c->ni, GT_FUSED_MAX_INS);
    for (int k = 0; k < c->ni; k++) {
        ins[k] = gt_fused_decode(c->i[k]);
        int arity = gt_fused_arity(ins[k].op), nc = gt_fused_n_const(ins[k].op);
        bool ok = arity > 0 && !gt_fused_has_extra_bits(c->i[k]) &&
                  gt_fused_float_dtype(ins[k].dtype) && (nc == 0 || ins[k].fslot + nc <= c->nf);
        for (int q = 0; ok && q < arity; q++) {
            int src = ins[k].src[q];
            ok = src < c->n_in || (src >= GT_FUSED_TEMP && src - GT_FUSED_TEMP < k);
        }
        if (!ok)
            return gt_error_set(err, GT_ERR_INVALID,
                                "%s: instruction %d (0x%llx) is malformed for %d inputs and %d "
                                "constants",
                                name, k, (unsigned long long)c->i[k], c->n_in, c->nf);
        if (ins[k].op == GT_OP_CLAMP) {
            double lo = c->f[ins[k].fslot], hi = c->f[ins[k].fslot + 1];
            if (isnan(lo) || isnan(hi) || lo > hi)
                return gt_error_set(err, GT_ERR_INVALID,
                                    "clamp: bounds must satisfy min <= max, got [%g, %g]", lo, hi);
        }
    }
    return GT_OK;
}

/* The program ins[0 .. c->ni) (decoded and checked by gt_fk_decode) with its last result into
 * c->out[0]. */
static gt_status gt_fk_run(gt_cuda_stream *s, const gt_kernel_call *c, const gt_fused_ins *ins,
                           gt_error *err)
{
    gt_fused_args P;
    memset(&P, 0, sizeof P);
    for (int k = 0; k < c->ni; k++) {
        int nc = gt_fused_n_const(ins[k].op);
        P.op[k] = ins[k].op;
        P.rdt[k] = ins[k].dtype;
        if (nc > 0) P.c0[k] = (float)c->f[ins[k].fslot]; /* rounded to f32 as the unfused ops */
        if (nc > 1) P.c1[k] = (float)c->f[ins[k].fslot + 1];
    }
    gt_tensor *out = c->out[0];
    GT_TRY(gt_kernel_want_float(c, out, "output", err));
    int64_t n = gt_tensor_numel(out);
    bool all16 = out->dtype != GT_F32, row[GT_MAX_IN];
    int64_t inner[GT_MAX_IN];
    for (int k = 0; k < c->n_in; k++) {
        char what[32];
        snprintf(what, sizeof what, "input %d", k);
        GT_TRY(gt_kernel_want_float(c, c->in[k], what, err));
        row[k] = gt_fk_row(c->in[k], out, &inner[k]);
        /* an f32 input read one element a pack (a scalar, a row of 8 or more) keeps packs of 8 */
        all16 = all16 && (c->in[k]->dtype != GT_F32 || gt_tensor_numel(c->in[k]) == 1 ||
                          (row[k] && inner[k] % 8 == 0));
    }
    const int V = all16 ? 8 : 4;
    P.ndim = out->ndim;
    memcpy(P.shape, out->shape, sizeof P.shape);
    P.n_in = c->n_in;
    P.n_ins = c->ni;
    for (int k = 0; k < c->n_in; k++) {
        const gt_tensor *x = c->in[k];
        if (!gt_cuda_broadcast_strides(out->ndim, out->shape, x->ndim, x->shape, P.stride[k]))
            return gt_cuda_shape_error(c, "an input does not broadcast to the output", err);
        int64_t m = gt_tensor_numel(x);
        P.in[k] = x->data;
        P.dt[k] = x->dtype;
        P.mod[k] = m > 0 ? m : 1;
        bool aligned = gt_aligned16(x->data);
        if (m == n)
            P.kind[k] = aligned ? GT_FK_VEC : GT_FK_FLAT;
        else if (m == 1)
            P.kind[k] = GT_FK_SCALAR;
        else if (gt_fk_trailing(x, out))
            P.kind[k] = aligned && m % V == 0 ? GT_FK_VEC_MOD : GT_FK_MOD;
        else if (row[k]) {
            P.kind[k] = GT_FK_ROW;
            P.mod[k] = inner[k];
        } else
            P.kind[k] = GT_FK_GENERAL;
    }
    if (n == 0) return GT_OK;
    int R = 2, dst[GT_FUSED_MAX_INS];
    if (!gt_fk_alloc_slots(ins, c->ni, 2, dst)) {
        R = 8;
        GT_CHECK(gt_fk_alloc_slots(ins, c->ni, 8, dst));
    }
    for (int k = 0; k < c->ni; k++) {
        P.dst[k] = dst[k];
        for (int q = 0; q < 2; q++) {
            int src = ins[k].src[q];
            int code = src >= GT_FUSED_TEMP ? GT_FUSED_TEMP + dst[src - GT_FUSED_TEMP] : src;
            if (q == 0)
                P.src0[k] = code;
            else
                P.src1[k] = code;
        }
    }
    P.out = out->data;
    P.dout = out->dtype;
    /* the vector kernel when every input is a vector or a scalar and the output is aligned; the
     * general kernel for the rest (and for the tail of fewer than V elements) */
    bool vec = gt_aligned16(out->data);
    for (int k = 0; k < c->n_in; k++)
        vec = vec && (P.kind[k] == GT_FK_VEC || P.kind[k] == GT_FK_VEC_MOD ||
                      P.kind[k] == GT_FK_SCALAR || (P.kind[k] == GT_FK_ROW && P.mod[k] % V == 0));
    int64_t n_packs = vec ? n / V : 0;
    if (vec && gt_fk_try_row_scale(s->stream, c, ins, &P, n)) return gt_cuda_launched(c, err);
    if (n_packs > 0 && gt_fk_try_pattern(s->stream, c, ins, &P, n_packs * V)) {
        GT_TRY(gt_cuda_launched(c, err));
    } else if (n_packs > 0) {
        if (V == 8)
            gt_fk_launch_v<8>(s->stream, P, n_packs, R);
        else
            gt_fk_launch_v<4>(s->stream, P, n_packs, R);
        GT_TRY(gt_cuda_launched(c, err));
    }
    int64_t start = n_packs * V;
    if (start < n) {
        gt_k_fused_any<<<gt_cuda_blocks(n - start), GT_CUDA_THREADS, 0, s->stream>>>(P, start, n);
        GT_TRY(gt_cuda_launched(c, err));
    }
    return GT_OK;
}

/* Several outputs (fused_program.h's output flags): the SwiGLU backward's kernel when the program
 * is that; else, when it is made of self-contained two-instruction pieces, each piece as its own
 * two-instruction program (gt_k_fused2 where it matches); else, output by output, the prefix of
 * the program that ends at its instruction. Every way gives each output the same bits: a piece or
 * a prefix computes its registers as the whole program does. */
gt_status gt_cuda_fused_elementwise(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    gt_fused_ins ins[GT_FUSED_MAX_INS];
    GT_TRY(gt_fk_decode(c, ins, err));
    int reg[GT_FUSED_MAX_INS];
    int no = gt_fused_outputs(c->i, c->ni, reg);
    if (no != c->n_out)
        return gt_error_set(err, GT_ERR_INVALID,
                            "fused_elementwise: the program has %d outputs, the call %d", no,
                            c->n_out);
    if (no == 1) return gt_fk_run(s, c, ins, err);
    for (int q = 0; q < no; q++)
        GT_TRY(gt_kernel_want_float(c, c->out[q], "output", err));
    if (gt_tensor_numel(c->out[0]) > 0 && gt_fk_try_swiglu_bwd(s->stream, c, ins, reg, no))
        return gt_cuda_launched(c, err);
    gt_fk_match m[GT_FUSED_MAX_INS];
    bool pieces = gt_fk_pieces(c, ins, reg, no, c->out[0]->dtype, m);
    for (int q = 0; q < no; q++) {
        gt_kernel_call one = *c;
        one.n_out = 1;
        one.out[0] = c->out[q];
        gt_fused_ins piece[2];
        const gt_fused_ins *prog = ins;
        if (pieces) { /* instructions 2q, 2q + 1 with the temp renumbered to 0 */
            piece[0] = ins[2 * q];
            piece[1] = ins[2 * q + 1];
            for (int k = 0; k < 2; k++)
                if (piece[1].src[k] == GT_FUSED_TEMP + 2 * q) piece[1].src[k] = GT_FUSED_TEMP;
            prog = piece;
            one.ni = 2;
        } else {
            one.ni = reg[q] + 1;
        }
        GT_TRY(gt_fk_run(s, &one, prog, err));
    }
    return GT_OK;
}
