/* cuda_adamw.cu — the AdamW step (gt_ops.def, adamw): one launch per parameter
 * (gt_cuda_adamw, the op's kernel) and one launch for many parameters (gt_cuda_adamw_multi_*,
 * gt_cuda.h: the CUDA program's optimizer tail).
 *
 * Bits: every element goes through gt_adamw_elem, cpu_optim.c's formula with explicitly rounded
 * operations (__fmul_rn etc.) and fmaf exactly where the CPU kernel fuses, so that nvcc's
 * multiply-add contraction cannot change them; the constants come from gt_adamw_make. Every path
 * below (general, vector, multi-tensor) calls both, so they give the CPU kernel's bits whatever
 * thread or launch handles an element. */
#include "cuda_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The step's constants come from device tensors (scalars = {lr, bc1, bc2}, clip), so a captured
 * step replays with new values; each thread derives them as cpu_optim.c does: in double, rounded
 * to f32 once. Range checks of lr/bc1/bc2 cannot fail synchronously here: they are the host's
 * (gt_optim_scalars) responsibility; the hyper-parameters are checked with the call
 * (gt_kernel_want_adamw). */
typedef struct {
    float clip, decay, w1, b2, w2, neg_step, bc2_sqrt, eps;
    bool decays;
} gt_adamw_consts;

__device__ __forceinline__ gt_adamw_consts gt_adamw_make(const float *scalars, const float *clipp,
                                                         double beta1, double beta2, double eps,
                                                         double wd)
{
    double lr = scalars[0], bc1 = scalars[1], bc2 = scalars[2];
    gt_adamw_consts k;
    k.clip = clipp[0];
    k.decay = (float)(1.0 - lr * wd);
    k.w1 = (float)(1.0 - beta1);
    k.b2 = (float)beta2;
    k.w2 = (float)(1.0 - beta2);
    k.neg_step = (float)(-(lr / bc1));
    k.bc2_sqrt = (float)sqrt(bc2);
    k.eps = (float)eps;
    k.decays = wd != 0.0;
    return k;
}

/* One element, cpu_optim.c's formula with every rounding explicit; updates p, m, v in place. */
__device__ __forceinline__ void gt_adamw_elem(const gt_adamw_consts &k, float &pv, float gv,
                                              float &mv, float &vv)
{
    gv = __fmul_rn(gv, k.clip);
    if (k.decays) pv = __fmul_rn(pv, k.decay);
    float diff = __fsub_rn(gv, mv);
    mv = k.w1 < 0.5f ? fmaf(k.w1, diff, mv) : fmaf(__fsub_rn(k.w1, 1.0f), diff, gv);
    vv = fmaf(__fmul_rn(k.w2, gv), gv, __fmul_rn(vv, k.b2));
    float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vv), k.bc2_sqrt), k.eps);
    pv = __fadd_rn(pv, __fdiv_rn(__fmul_rn(k.neg_step, mv), denom));
}

__global__ void gt_k_adamw(int64_t n, const void *p, int dp, const void *g, int dg, const float *m,
                           const float *v, const float *scalars, const float *clipp, void *po,
                           int dpo, float *mo, float *vo, double beta1, double beta2, double eps,
                           double wd)
{
    gt_adamw_consts k = gt_adamw_make(scalars, clipp, beta1, beta2, eps, wd);
    GT_GRID_STRIDE(i, n)
    {
        float pv = gt_ld(p, dp, i), mv = m[i], vv = v[i];
        gt_adamw_elem(k, pv, gt_ld(g, dg, i), mv, vv);
        gt_st(po, dpo, i, pv);
        mo[i] = mv;
        vo[i] = vv;
    }
}

/* Four gradient elements from 4 i on: one 16-byte (f32) or 8-byte (bf16, widened exactly) load. */
__device__ __forceinline__ float4 gt_adamw_ld4(const float *g, int64_t i)
{
    return ((const float4 *)g)[i];
}
__device__ __forceinline__ float4 gt_adamw_ld4(const __nv_bfloat16 *g, int64_t i)
{
    uint2 r = ((const uint2 *)g)[i];
    float2 a = __bfloat1622float2(*(const __nv_bfloat162 *)&r.x);
    float2 b = __bfloat1622float2(*(const __nv_bfloat162 *)&r.y);
    return make_float4(a.x, a.y, b.x, b.y);
}

/* The vector path's operands: p, m, v and the outputs f32, the gradient f32 or bf16 (G), every
 * pointer 16-byte aligned. */
template <typename G> struct gt_adamw_vec_args {
    const float *p;
    const G *g;
    const float *m, *v;
    float *po, *mo, *vo;
};

/* Pack i (elements 4 i .. 4 i + 3) with 128-bit accesses: p, m, v in and p', m', v' out, 16 bytes
 * each; g 16 bytes in f32, 8 in bf16 (the gradient norm and AdamW read bf16 gradients directly
 * when the fusion pass drops their widening cast). Every input element is read before any output
 * element is written, so outputs may be the inputs (in place). */
template <typename G>
__device__ __forceinline__ void gt_adamw_pack(const gt_adamw_consts &k,
                                              const gt_adamw_vec_args<G> &a, int64_t i)
{
    float4 pv = ((const float4 *)a.p)[i], gv = gt_adamw_ld4(a.g, i);
    float4 mv = ((const float4 *)a.m)[i], vv = ((const float4 *)a.v)[i];
    gt_adamw_elem(k, pv.x, gv.x, mv.x, vv.x);
    gt_adamw_elem(k, pv.y, gv.y, mv.y, vv.y);
    gt_adamw_elem(k, pv.z, gv.z, mv.z, vv.z);
    gt_adamw_elem(k, pv.w, gv.w, mv.w, vv.w);
    ((float4 *)a.po)[i] = pv;
    ((float4 *)a.mo)[i] = mv;
    ((float4 *)a.vo)[i] = vv;
}

/* Element i past the last whole pack (the n % 4 tail), one at a time. */
template <typename G>
__device__ __forceinline__ void gt_adamw_tail(const gt_adamw_consts &k,
                                              const gt_adamw_vec_args<G> &a, int64_t i)
{
    float pv = a.p[i], mv = a.m[i], vv = a.v[i];
    gt_adamw_elem(k, pv, (float)a.g[i], mv, vv);
    a.po[i] = pv;
    a.mo[i] = mv;
    a.vo[i] = vv;
}

/* One tensor on the vector path: n4 packs over the grid, the tail (n % 4) to block 0. */
template <typename G>
__global__ void gt_k_adamw_vec(int64_t n4, int n_tail, gt_adamw_vec_args<G> a, const float *scalars,
                               const float *clipp, double beta1, double beta2, double eps,
                               double wd)
{
    gt_adamw_consts k = gt_adamw_make(scalars, clipp, beta1, beta2, eps, wd);
    GT_GRID_STRIDE(i, n4)
    {
        gt_adamw_pack(k, a, i);
    }
    if (blockIdx.x == 0 && (int)threadIdx.x < n_tail) gt_adamw_tail(k, a, n4 * 4 + threadIdx.x);
}

/* The argument checks of an adamw call (the op's contract, as the CPU kernel's) and whether it
 * takes the vector path. */
static gt_status gt_adamw_check(const gt_kernel_call *c, bool *vec, gt_error *err)
{
    *vec = false;
    GT_TRY(gt_kernel_want_float(c, c->in[0], gt_kernel_adamw_in[0], err));
    GT_TRY(gt_kernel_want_float(c, c->in[1], gt_kernel_adamw_in[1], err));
    GT_TRY(gt_kernel_want_float(c, c->out[0], gt_kernel_adamw_out[0], err));
    for (int k = 2; k < 6; k++)
        if (c->in[k]->dtype != GT_F32)
            return gt_error_set(err, GT_ERR_SHAPE, "adamw: %s is %s, expected f32",
                                gt_kernel_adamw_in[k], gt_dtype_name(c->in[k]->dtype));
    for (int k = 1; k < 3; k++)
        if (c->out[k]->dtype != GT_F32)
            return gt_error_set(err, GT_ERR_SHAPE, "adamw: %s is %s, expected f32",
                                gt_kernel_adamw_out[k], gt_dtype_name(c->out[k]->dtype));
    GT_TRY(gt_kernel_want_adamw(c, err));
    const gt_tensor *p = c->in[0];
    const void *ptrs[7] = {p->data,         c->in[1]->data,  c->in[2]->data, c->in[3]->data,
                           c->out[0]->data, c->out[1]->data, c->out[2]->data};
    gt_dtype gd = c->in[1]->dtype;
    bool v = p->dtype == GT_F32 && (gd == GT_F32 || gd == GT_BF16) && c->out[0]->dtype == GT_F32;
    for (int k = 0; k < 7; k++) /* a bf16 gradient needs 8-byte alignment; 16 is asked of all */
        v = v && gt_aligned16(ptrs[k]);
    *vec = v;
    return GT_OK;
}

template <typename G> static gt_adamw_vec_args<G> gt_adamw_vec_of(const gt_kernel_call *c)
{
    return gt_adamw_vec_args<G>{(const float *)c->in[0]->data, (const G *)c->in[1]->data,
                                (const float *)c->in[2]->data, (const float *)c->in[3]->data,
                                (float *)c->out[0]->data,      (float *)c->out[1]->data,
                                (float *)c->out[2]->data};
}

gt_status gt_cuda_adamw(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    bool vec;
    GT_TRY(gt_adamw_check(c, &vec, err));
    const gt_tensor *p = c->in[0];
    int64_t n = gt_tensor_numel(p);
    if (n == 0) return GT_OK;
    double beta1 = c->f[0], beta2 = c->f[1], eps = c->f[2], wd = c->f[3];
    const float *sc = (const float *)c->in[4]->data, *cl = (const float *)c->in[5]->data;
    if (vec) {
        int64_t n4 = n / 4;
        int tail = (int)(n - n4 * 4);
        if (c->in[1]->dtype == GT_F32)
            gt_k_adamw_vec<float><<<gt_pack_blocks(n4), GT_CUDA_THREADS, 0, s->stream>>>(
                n4, tail, gt_adamw_vec_of<float>(c), sc, cl, beta1, beta2, eps, wd);
        else
            gt_k_adamw_vec<__nv_bfloat16><<<gt_pack_blocks(n4), GT_CUDA_THREADS, 0, s->stream>>>(
                n4, tail, gt_adamw_vec_of<__nv_bfloat16>(c), sc, cl, beta1, beta2, eps, wd);
        return gt_cuda_launched(c, err);
    }
    gt_k_adamw<<<gt_cuda_blocks(n), GT_CUDA_THREADS, 0, s->stream>>>(
        n, p->data, p->dtype, c->in[1]->data, c->in[1]->dtype, (const float *)c->in[2]->data,
        (const float *)c->in[3]->data, sc, cl, c->out[0]->data, c->out[0]->dtype,
        (float *)c->out[1]->data, (float *)c->out[2]->data, beta1, beta2, eps, wd);
    return gt_cuda_launched(c, err);
}

/* ---------------------------------------------------------------- many tensors, one launch
 *
 * The tensors' packs are cut into chunks of GT_ADAMW_CHUNK_PACKS packs, one per block, one pack
 * per thread (a tensor's last chunk also holds its tail, and a tensor of fewer than 4 elements is
 * one chunk of tail alone), numbered tensor after tensor; chunk_tensor[c] is the tensor that chunk
 * c belongs to. That is the single-tensor kernel's shape: many short blocks, each thread with one
 * pack's loads in flight, so the block scheduler hides the latency as it does there (a
 * grid-stride loop of 4 packs per thread measured slower in the 1B step: 10.35 ms against 9.7 ms
 * for the per-tensor launches, H200). Each element is still one gt_adamw_elem with
 * gt_adamw_make's constants from the same scalars, clip and hyper-parameters, so the bits are
 * those of one launch per tensor; what goes is a launch, its ramp-up and its partly idle last wave
 * per tensor, and each thread's double-precision constants (one thread per block derives them). */

#define GT_ADAMW_CHUNK_PACKS GT_CUDA_THREADS

/* Chunks of a tensor of numel elements: its packs' chunks, or one for a tensor of tail alone. */
static int64_t gt_adamw_chunks(int64_t numel)
{
    int64_t n4 = numel / 4;
    return n4 > 0 ? (n4 + GT_ADAMW_CHUNK_PACKS - 1) / GT_ADAMW_CHUNK_PACKS : 1;
}

/* One tensor of a multi-tensor launch, as uploaded. */
typedef struct {
    const float *p, *m, *v;
    const void *g; /* f32 or bf16 (g_bf16) */
    float *po, *mo, *vo;
    int64_t n4;          /* whole packs */
    int64_t first_chunk; /* its first chunk in the launch's numbering */
    int32_t tail;        /* numel % 4 elements after the packs */
    uint8_t g_bf16;
    uint8_t decays; /* weight decay: the launch's (1) or none (0) */
} gt_adamw_multi_entry;

struct gt_cuda_adamw_multi {
    void *dev; /* one allocation: the n entries, then chunk_tensor[n_chunks] */
    const gt_adamw_multi_entry *entries;
    const int32_t *chunk_tensor;
    int64_t n_chunks;
    const float *scalars, *clip;
    double beta1, beta2, eps, wd; /* wd: the one nonzero weight decay, or 0 */
};

/* Pack lo + threadIdx.x of tensor t when below its n4; last: the chunk is t's last, which also
 * updates the tail. */
template <typename G>
__device__ __forceinline__ void
gt_adamw_multi_chunk(const gt_adamw_consts &k, const gt_adamw_multi_entry &t, int64_t lo, bool last)
{
    gt_adamw_vec_args<G> a = {t.p, (const G *)t.g, t.m, t.v, t.po, t.mo, t.vo};
    int64_t i = lo + threadIdx.x;
    if (i < t.n4) gt_adamw_pack(k, a, i);
    if (last && (int)threadIdx.x < t.tail) gt_adamw_tail(k, a, t.n4 * 4 + threadIdx.x);
}

__global__ void __launch_bounds__(GT_CUDA_THREADS)
    gt_k_adamw_multi(const gt_adamw_multi_entry *entries, const int32_t *chunk_tensor,
                     const float *scalars, const float *clipp, double beta1, double beta2,
                     double eps, double wd)
{
    /* the constants each per-tensor launch would derive, for the launch's weight decay and for
     * none (norms are not decayed): once per block */
    __shared__ gt_adamw_consts sk[2];
    if (threadIdx.x == 0) {
        sk[0] = gt_adamw_make(scalars, clipp, beta1, beta2, eps, 0.0);
        sk[1] = gt_adamw_make(scalars, clipp, beta1, beta2, eps, wd);
    }
    int64_t c = blockIdx.x;
    const gt_adamw_multi_entry t = entries[chunk_tensor[c]];
    __syncthreads();
    const gt_adamw_consts k = sk[t.decays];
    int64_t lo = (c - t.first_chunk) * GT_ADAMW_CHUNK_PACKS;
    bool last = lo + GT_ADAMW_CHUNK_PACKS >= t.n4; /* t's last chunk (lo < n4 before it) */
    if (t.g_bf16)
        gt_adamw_multi_chunk<__nv_bfloat16>(k, t, lo, last);
    else
        gt_adamw_multi_chunk<float>(k, t, lo, last);
}

/* Whether c passes gt_cuda_run_kernel's checks as an adamw call and takes the vector path with at
 * least one element; *why (may be NULL) says why not. */
static bool gt_adamw_fits(const gt_kernel_call *c, gt_error *why)
{
    gt_error ignored = {};
    if (!why) why = &ignored;
    bool vec = false;
    if (gt_cuda_check_call(c, why) != GT_OK) return false;
    if (c->op != GT_OP_ADAMW) {
        gt_error_set(why, GT_ERR_INVALID, "%s is not adamw", gt_kernel_op_name(c->op));
        return false;
    }
    if (gt_adamw_check(c, &vec, why) != GT_OK) return false;
    if (!vec) {
        gt_error_set(why, GT_ERR_INVALID,
                     "adamw: not on the vector path (param, moments and updates f32, grad f32 or "
                     "bf16, every pointer 16-byte aligned)");
        return false;
    }
    if (gt_tensor_numel(c->in[0]) == 0) {
        gt_error_set(why, GT_ERR_INVALID, "adamw: no elements");
        return false;
    }
    return true;
}

extern "C" bool gt_cuda_adamw_groupable(const gt_kernel_call *c)
{
    return gt_adamw_fits(c, NULL);
}

extern "C" gt_status gt_cuda_adamw_multi_create(const gt_kernel_call *calls, int32_t n,
                                                gt_cuda_adamw_multi **out, gt_error *err)
{
    *out = NULL;
    if (n < 1 || !calls)
        return gt_error_set(err, GT_ERR_INVALID, "adamw multi-tensor launch: no calls (n = %d)",
                            (int)n);
    const gt_kernel_call *c0 = &calls[0];
    double wd = 0.0;
    int64_t n_chunks = 0;
    for (int32_t j = 0; j < n; j++) {
        const gt_kernel_call *c = &calls[j];
        if (!gt_adamw_fits(c, err))
            return gt_error_wrap(err, "adamw multi-tensor launch: call %d of %d", (int)j, (int)n);
        if (c->in[4]->data != c0->in[4]->data || c->in[5]->data != c0->in[5]->data)
            return gt_error_set(err, GT_ERR_INVALID,
                                "adamw multi-tensor launch: call %d of %d reads other scalars or "
                                "clip tensors than call 0",
                                (int)j, (int)n);
        if (c->f[0] != c0->f[0] || c->f[1] != c0->f[1] || c->f[2] != c0->f[2])
            return gt_error_set(err, GT_ERR_INVALID,
                                "adamw multi-tensor launch: call %d of %d has beta1 %g, beta2 %g, "
                                "eps %g; call 0 has %g, %g, %g",
                                (int)j, (int)n, c->f[0], c->f[1], c->f[2], c0->f[0], c0->f[1],
                                c0->f[2]);
        if (c->f[3] != 0.0 && wd != 0.0 && c->f[3] != wd)
            return gt_error_set(err, GT_ERR_INVALID,
                                "adamw multi-tensor launch: call %d of %d has weight_decay %g, an "
                                "earlier call %g (one nonzero value per launch)",
                                (int)j, (int)n, c->f[3], wd);
        if (c->f[3] != 0.0) wd = c->f[3];
        n_chunks += gt_adamw_chunks(gt_tensor_numel(c->in[0]));
    }
    if (n_chunks > INT32_MAX)
        return gt_error_set(err, GT_ERR_INVALID,
                            "adamw multi-tensor launch: %lld chunks of %d packs exceed one grid",
                            (long long)n_chunks, GT_ADAMW_CHUNK_PACKS);
    size_t entry_bytes = (size_t)n * sizeof(gt_adamw_multi_entry);
    size_t bytes = entry_bytes + (size_t)n_chunks * sizeof(int32_t);
    char *host = (char *)gt_xmalloc(bytes);
    gt_adamw_multi_entry *entries = (gt_adamw_multi_entry *)host;
    int32_t *chunk_tensor = (int32_t *)(host + entry_bytes);
    int64_t chunk = 0;
    for (int32_t j = 0; j < n; j++) {
        const gt_kernel_call *c = &calls[j];
        int64_t numel = gt_tensor_numel(c->in[0]), n4 = numel / 4, chunks = gt_adamw_chunks(numel);
        gt_adamw_multi_entry *e = &entries[j];
        e->p = (const float *)c->in[0]->data;
        e->g = c->in[1]->data;
        e->m = (const float *)c->in[2]->data;
        e->v = (const float *)c->in[3]->data;
        e->po = (float *)c->out[0]->data;
        e->mo = (float *)c->out[1]->data;
        e->vo = (float *)c->out[2]->data;
        e->n4 = n4;
        e->first_chunk = chunk;
        e->tail = (int32_t)(numel - n4 * 4);
        e->g_bf16 = c->in[1]->dtype == GT_BF16;
        e->decays = c->f[3] != 0.0;
        for (int64_t k = 0; k < chunks; k++)
            chunk_tensor[chunk + k] = j;
        chunk += chunks;
    }
    gt_cuda_adamw_multi *m = (gt_cuda_adamw_multi *)gt_xcalloc(1, sizeof *m);
    gt_status st = gt_cuda_malloc(&m->dev, bytes, err);
    if (st == GT_OK)
        st = gt_cuda_check(c0, cudaMemcpy(m->dev, host, bytes, cudaMemcpyHostToDevice),
                           "uploading the multi-tensor table", err);
    free(host);
    if (st != GT_OK) {
        gt_cuda_adamw_multi_free(m);
        return gt_error_wrap(err, "adamw multi-tensor launch of %d tensors (%zu bytes of table)",
                             (int)n, bytes);
    }
    m->entries = (const gt_adamw_multi_entry *)m->dev;
    m->chunk_tensor = (const int32_t *)((const char *)m->dev + entry_bytes);
    m->n_chunks = n_chunks;
    m->scalars = (const float *)c0->in[4]->data;
    m->clip = (const float *)c0->in[5]->data;
    m->beta1 = c0->f[0];
    m->beta2 = c0->f[1];
    m->eps = c0->f[2];
    m->wd = wd;
    *out = m;
    return GT_OK;
}

extern "C" gt_status gt_cuda_adamw_multi_run(const gt_cuda_adamw_multi *m, void *stream,
                                             gt_error *err)
{
    gt_kernel_call c = {};
    c.op = GT_OP_ADAMW; /* names the launch in errors */
    if (!m || !stream)
        return gt_error_set(err, GT_ERR_INVALID, "adamw multi-tensor launch: no %s given",
                            m ? "gt_cuda_stream" : "launch");
    gt_k_adamw_multi<<<(unsigned)m->n_chunks, GT_CUDA_THREADS, 0,
                       ((gt_cuda_stream *)stream)->stream>>>(
        m->entries, m->chunk_tensor, m->scalars, m->clip, m->beta1, m->beta2, m->eps, m->wd);
    return gt_cuda_launched(&c, err);
}

extern "C" void gt_cuda_adamw_multi_free(gt_cuda_adamw_multi *m)
{
    if (!m) return;
    gt_cuda_free(m->dev);
    free(m);
}
