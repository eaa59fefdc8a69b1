/* cuda_attention.cu — sdpa and sdpa_backward: tiled, deterministic, flash-style.
 *
 *   q: [b, hq, s, d], k: [b, hkv, t, d], v: [b, hkv, t, dv]; query head h reads kv head
 *   h / (hq / hkv). S = scale * q k^T; causal masks key j > query i (needs s == t).
 *   Layout 1 (attribute 1): q, k, v, out and the gradients are [b, s, heads, d] instead; the
 *   kernels read and write them in place: a (batch, head) starts at bi * heads * n * w + h * w
 *   and its rows are heads * w apart (layout 0: + h * n * w, rows w apart). Only the addresses
 *   differ, so the results are bitwise those of layout 0 on the transposed tensors. lse (and D)
 *   are [b, hq, s] in both layouts.
 *
 * Forward, one block per (batch, head, tile of GT_ATT_BQ queries), key tiles of GT_ATT_BK in order,
 * online softmax per row:  m' = max(m, max_j S_j);  l' = l e^(m - m') + sum_j e^(S_j - m');
 * O' = O e^(m - m') + sum_j e^(S_j - m') V_j;  at the end out = O / l, lse = m + log l (lse = -inf
 * and out = 0 for a row that sees no key).
 *
 * Backward recomputes P = exp(S - lse) tile by tile (nothing of size s x t is stored):
 *   D_i = sum_c dO_ic O_ic  (kernel 1);  dP = dO V^T;  dS = P * (dP - D_i);
 *   dK_j = scale * sum_i dS_ij Q_i and dV_j = sum_i P_ij dO_i — kernel 2, one block per (batch, kv
 *   head, key tile), looping over the group's query heads in order, then query tiles in order;
 *   dQ_i = scale * sum_j dS_ij K_j — kernel 3, one block per (batch, head, query tile).
 * No atomics: each output tile belongs to one block, and every sum runs in a fixed order (dot
 * products over d in index order, tiles in index order), so results are bitwise reproducible.
 * Tiles live in shared memory as f32 (loads widen bf16/f16). These kernels serve f32/f16 and odd
 * head dims; bf16 calls run first on cuDNN where it takes them (cuda_cudnn.cu: head dims 64 to
 * 256, d and dv apart, e.g. MLA's 192/128), else with d = dv in {16, 32, 64, 128} on the
 * tensor-core kernels of cuda_flash_*.cu.
 */
#include "cuda_flash.cuh"

#include <math.h>
#include <string.h>

#define GT_ATT_BQ 32
#define GT_ATT_BK 32
#define GT_ATT_THREADS 128

typedef struct {
    int64_t b, hq, hkv, s, t, d, dv;
    int causal;
    float scale;
    int layout;         /* 0: [b, heads, n, w]; 1: [b, n, heads, w] */
    const int64_t *pos; /* document positions [b, s] (block-causal), or NULL */
} gt_att;

/* Element offset of head h of batch bi in a tensor of `heads` heads of n rows of width w. */
__device__ __forceinline__ int64_t gt_att_at(const gt_att &a, int64_t bi, int64_t h, int64_t heads,
                                             int64_t n, int64_t w)
{
    return bi * heads * n * w + h * (a.layout ? w : n * w);
}

/* Elements between consecutive rows of one head of such a tensor. */
__device__ __forceinline__ int64_t gt_att_ld(const gt_att &a, int64_t heads, int64_t w)
{
    return a.layout ? heads * w : w;
}

/* The first key query row i of batch bi sees: its document's start i - positions[bi, i] with
 * documents, else 0. */
__device__ __forceinline__ int64_t gt_att_start(const gt_att &a, int64_t bi, int64_t i)
{
    return a.pos && i < a.s ? i - a.pos[bi * a.s + i] : 0;
}

/* True when query row i (absolute) of batch bi may see key j (absolute). */
__device__ __forceinline__ bool gt_att_visible(const gt_att &a, int64_t bi, int64_t i, int64_t j)
{
    return i < a.s && j < a.t && !(a.causal && j > i) && j >= gt_att_start(a, bi, i);
}

/* The first key tile any query of tile [q0, q0 + GT_ATT_BQ) sees (0 without documents); every
 * thread computes the same value. Tiles before it hold no visible key: skipped, so one document
 * (every start 0) runs exactly the causal loops. */
__device__ __forceinline__ int64_t gt_att_first_tile(const gt_att &a, int64_t bi, int64_t q0)
{
    if (!a.pos) return 0;
    int64_t m = q0;
    for (int64_t i = q0; i < q0 + GT_ATT_BQ && i < a.s; i++)
        m = min(m, max(gt_att_start(a, bi, i), (int64_t)0));
    return m / GT_ATT_BK * GT_ATT_BK;
}

/* Loads rows [r0, r0 + n) of a [rows, w] matrix at p + base whose rows are ld elements apart into
 * sh ([n, w]); rows past `rows` are 0. */
__device__ __forceinline__ void gt_att_load(float *sh, const void *p, int dt, int64_t base,
                                            int64_t r0, int n, int64_t rows, int64_t w, int64_t ld)
{
    for (int64_t idx = threadIdx.x; idx < n * w; idx += blockDim.x) {
        int64_t r = idx / w, c = idx - r * w;
        sh[idx] = r0 + r < rows ? gt_ld(p, dt, base + (r0 + r) * ld + c) : 0.0f;
    }
}

__global__ void __launch_bounds__(GT_ATT_THREADS)
    gt_k_sdpa_fwd(gt_att a, const void *q, int dq, const void *k, int dk, const void *v, int dv,
                  void *out, int dout, void *lse, int dlse)
{
    extern __shared__ float sm[];
    float *qs = sm, *ks = qs + GT_ATT_BQ * a.d, *vs = ks + GT_ATT_BK * a.d;
    float *os = vs + GT_ATT_BK * a.dv, *ss = os + GT_ATT_BQ * a.dv;
    float *mrow = ss + GT_ATT_BQ * GT_ATT_BK, *lrow = mrow + GT_ATT_BQ, *arow = lrow + GT_ATT_BQ;
    int64_t bh = blockIdx.y, bi = bh / a.hq, h = bh - bi * a.hq;
    int64_t kvh = h / (a.hq / a.hkv), q0 = (int64_t)blockIdx.x * GT_ATT_BQ;
    int64_t ko = gt_att_at(a, bi, kvh, a.hkv, a.t, a.d),
            vo = gt_att_at(a, bi, kvh, a.hkv, a.t, a.dv);
    int64_t kld = gt_att_ld(a, a.hkv, a.d), vld = gt_att_ld(a, a.hkv, a.dv);
    gt_att_load(qs, q, dq, gt_att_at(a, bi, h, a.hq, a.s, a.d), q0, GT_ATT_BQ, a.s, a.d,
                gt_att_ld(a, a.hq, a.d));
    for (int idx = threadIdx.x; idx < GT_ATT_BQ * a.dv; idx += blockDim.x)
        os[idx] = 0.0f;
    for (int r = threadIdx.x; r < GT_ATT_BQ; r += blockDim.x) {
        mrow[r] = -INFINITY;
        lrow[r] = 0.0f;
    }
    int64_t kend = a.causal ? min(a.t, q0 + GT_ATT_BQ) : a.t;
    for (int64_t k0 = gt_att_first_tile(a, bi, q0); k0 < kend; k0 += GT_ATT_BK) {
        __syncthreads();
        gt_att_load(ks, k, dk, ko, k0, GT_ATT_BK, a.t, a.d, kld);
        gt_att_load(vs, v, dv, vo, k0, GT_ATT_BK, a.t, a.dv, vld);
        __syncthreads();
        for (int idx = threadIdx.x; idx < GT_ATT_BQ * GT_ATT_BK; idx += blockDim.x) {
            int r = idx / GT_ATT_BK, j = idx - r * GT_ATT_BK;
            float dot = 0.0f;
            for (int64_t c = 0; c < a.d; c++)
                dot = fmaf(qs[r * a.d + c], ks[j * a.d + c], dot);
            ss[idx] = gt_att_visible(a, bi, q0 + r, k0 + j) ? a.scale * dot : -INFINITY;
        }
        __syncthreads();
        for (int r = threadIdx.x; r < GT_ATT_BQ; r += blockDim.x) {
            float m = mrow[r], mx = m;
            for (int j = 0; j < GT_ATT_BK; j++)
                mx = fmaxf(mx, ss[r * GT_ATT_BK + j]);
            if (mx == -INFINITY) { /* nothing visible yet: P = 0, state unchanged */
                for (int j = 0; j < GT_ATT_BK; j++)
                    ss[r * GT_ATT_BK + j] = 0.0f;
                arow[r] = 1.0f;
                continue;
            }
            float alpha = m == -INFINITY ? 0.0f : expf(m - mx), sum = 0.0f;
            for (int j = 0; j < GT_ATT_BK; j++) {
                float p = expf(ss[r * GT_ATT_BK + j] - mx); /* exp(-inf) = 0 where masked */
                ss[r * GT_ATT_BK + j] = p;
                sum += p;
            }
            mrow[r] = mx;
            lrow[r] = lrow[r] * alpha + sum;
            arow[r] = alpha;
        }
        __syncthreads();
        for (int idx = threadIdx.x; idx < GT_ATT_BQ * a.dv; idx += blockDim.x) {
            int r = idx / (int)a.dv, c = idx - r * (int)a.dv;
            float acc = os[idx] * arow[r];
            for (int j = 0; j < GT_ATT_BK; j++)
                acc = fmaf(ss[r * GT_ATT_BK + j], vs[j * a.dv + c], acc);
            os[idx] = acc;
        }
    }
    __syncthreads();
    int64_t oo = gt_att_at(a, bi, h, a.hq, a.s, a.dv), old = gt_att_ld(a, a.hq, a.dv);
    for (int idx = threadIdx.x; idx < GT_ATT_BQ * a.dv; idx += blockDim.x) {
        int r = idx / (int)a.dv, c = idx - r * (int)a.dv;
        if (q0 + r >= a.s) continue;
        float l = lrow[r];
        gt_st(out, dout, oo + (q0 + r) * old + c, l > 0.0f ? os[idx] / l : 0.0f);
    }
    for (int r = threadIdx.x; r < GT_ATT_BQ; r += blockDim.x) {
        if (q0 + r >= a.s) continue;
        float l = lrow[r];
        gt_st(lse, dlse, bh * a.s + q0 + r, l > 0.0f ? mrow[r] + logf(l) : -INFINITY);
    }
}

/* D_i = sum_c dO_ic O_ic, one thread per row i of [b, hq, s] (f32, index order). */
__global__ void gt_k_sdpa_dsum(gt_att a, int64_t rows, const void *o, int dto, const void *g,
                               int dtg, float *dsum)
{
    GT_GRID_STRIDE(i, rows)
    {
        int64_t bh = i / a.s, r = i - bh * a.s, bi = bh / a.hq;
        int64_t at =
            gt_att_at(a, bi, bh - bi * a.hq, a.hq, a.s, a.dv) + r * gt_att_ld(a, a.hq, a.dv);
        float acc = 0.0f;
        for (int64_t c = 0; c < a.dv; c++)
            acc = fmaf(gt_ld(g, dtg, at + c), gt_ld(o, dto, at + c), acc);
        dsum[i] = acc;
    }
}

/* For the tile (queries q0.., keys k0..) already in shared memory, writes P into ps and
 * dS = P * (dP - D) into dss. */
__device__ __forceinline__ void gt_att_tile_grads(const gt_att &a, int64_t bi, int64_t q0,
                                                  int64_t k0, const float *qs, const float *gs,
                                                  const float *ks, const float *vs, const float *ls,
                                                  const float *ds, float *ps, float *dss)
{
    for (int idx = threadIdx.x; idx < GT_ATT_BQ * GT_ATT_BK; idx += blockDim.x) {
        int r = idx / GT_ATT_BK, j = idx - r * GT_ATT_BK;
        float l = ls[r], p = 0.0f, dp = 0.0f;
        if (gt_att_visible(a, bi, q0 + r, k0 + j) && l != -INFINITY) {
            float dot = 0.0f;
            for (int64_t c = 0; c < a.d; c++)
                dot = fmaf(qs[r * a.d + c], ks[j * a.d + c], dot);
            p = expf(a.scale * dot - l);
            for (int64_t c = 0; c < a.dv; c++)
                dp = fmaf(gs[r * a.dv + c], vs[j * a.dv + c], dp);
        }
        ps[idx] = p;
        dss[idx] = p * (dp - ds[r]);
    }
}

/* Loads lse and D of query rows [q0, q0 + BQ) of head bh (rows past s: lse = -inf, D = 0). */
__device__ __forceinline__ void gt_att_load_rows(const gt_att &a, int64_t bh, int64_t q0,
                                                 const void *lse, int dlse, const float *dsum,
                                                 float *ls, float *ds)
{
    for (int r = threadIdx.x; r < GT_ATT_BQ; r += blockDim.x) {
        bool in = q0 + r < a.s;
        ls[r] = in ? gt_ld(lse, dlse, bh * a.s + q0 + r) : -INFINITY;
        ds[r] = in ? dsum[bh * a.s + q0 + r] : 0.0f;
    }
}

__global__ void __launch_bounds__(GT_ATT_THREADS)
    gt_k_sdpa_dkdv(gt_att a, const void *q, int dq, const void *k, int dk, const void *v, int dv,
                   const void *lse, int dlse, const void *g, int dg, const float *dsum, void *dkout,
                   int ddk, void *dvout, int ddv)
{
    extern __shared__ float sm[];
    float *ks = sm, *vs = ks + GT_ATT_BK * a.d, *dks = vs + GT_ATT_BK * a.dv;
    float *dvs = dks + GT_ATT_BK * a.d, *qs = dvs + GT_ATT_BK * a.dv, *gs = qs + GT_ATT_BQ * a.d;
    float *ps = gs + GT_ATT_BQ * a.dv, *dss = ps + GT_ATT_BQ * GT_ATT_BK;
    float *ls = dss + GT_ATT_BQ * GT_ATT_BK, *ds = ls + GT_ATT_BQ;
    int64_t bkh = blockIdx.y, bi = bkh / a.hkv, kvh = bkh - bi * a.hkv;
    int64_t k0 = (int64_t)blockIdx.x * GT_ATT_BK, group = a.hq / a.hkv;
    int64_t ko = gt_att_at(a, bi, kvh, a.hkv, a.t, a.d),
            vo = gt_att_at(a, bi, kvh, a.hkv, a.t, a.dv);
    int64_t kld = gt_att_ld(a, a.hkv, a.d), vld = gt_att_ld(a, a.hkv, a.dv);
    int64_t qld = gt_att_ld(a, a.hq, a.d), gld = gt_att_ld(a, a.hq, a.dv);
    gt_att_load(ks, k, dk, ko, k0, GT_ATT_BK, a.t, a.d, kld);
    gt_att_load(vs, v, dv, vo, k0, GT_ATT_BK, a.t, a.dv, vld);
    for (int idx = threadIdx.x; idx < GT_ATT_BK * a.d; idx += blockDim.x)
        dks[idx] = 0.0f;
    for (int idx = threadIdx.x; idx < GT_ATT_BK * a.dv; idx += blockDim.x)
        dvs[idx] = 0.0f;
    /* With causal masking, query tiles wholly before k0 see none of these keys. */
    int64_t qstart = a.causal ? (k0 / GT_ATT_BQ) * GT_ATT_BQ : 0;
    for (int64_t hh = 0; hh < group; hh++) {
        int64_t h = kvh * group + hh, bh = bi * a.hq + h;
        int64_t qo = gt_att_at(a, bi, h, a.hq, a.s, a.d), go = gt_att_at(a, bi, h, a.hq, a.s, a.dv);
        for (int64_t q0 = qstart; q0 < a.s; q0 += GT_ATT_BQ) {
            /* documents: a query tile whose rows all start after these keys sees none of them */
            if (gt_att_first_tile(a, bi, q0) > k0) continue;
            __syncthreads();
            gt_att_load(qs, q, dq, qo, q0, GT_ATT_BQ, a.s, a.d, qld);
            gt_att_load(gs, g, dg, go, q0, GT_ATT_BQ, a.s, a.dv, gld);
            gt_att_load_rows(a, bh, q0, lse, dlse, dsum, ls, ds);
            __syncthreads();
            gt_att_tile_grads(a, bi, q0, k0, qs, gs, ks, vs, ls, ds, ps, dss);
            __syncthreads();
            for (int idx = threadIdx.x; idx < GT_ATT_BK * a.dv; idx += blockDim.x) {
                int j = idx / (int)a.dv, c = idx - j * (int)a.dv;
                float acc = dvs[idx];
                for (int r = 0; r < GT_ATT_BQ; r++)
                    acc = fmaf(ps[r * GT_ATT_BK + j], gs[r * a.dv + c], acc);
                dvs[idx] = acc;
            }
            for (int idx = threadIdx.x; idx < GT_ATT_BK * a.d; idx += blockDim.x) {
                int j = idx / (int)a.d, c = idx - j * (int)a.d;
                float acc = dks[idx];
                for (int r = 0; r < GT_ATT_BQ; r++)
                    acc = fmaf(dss[r * GT_ATT_BK + j], qs[r * a.d + c], acc);
                dks[idx] = acc;
            }
        }
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < GT_ATT_BK * a.d; idx += blockDim.x) {
        int j = idx / (int)a.d, c = idx - j * (int)a.d;
        if (k0 + j < a.t) gt_st(dkout, ddk, ko + (k0 + j) * kld + c, a.scale * dks[idx]);
    }
    for (int idx = threadIdx.x; idx < GT_ATT_BK * a.dv; idx += blockDim.x) {
        int j = idx / (int)a.dv, c = idx - j * (int)a.dv;
        if (k0 + j < a.t) gt_st(dvout, ddv, vo + (k0 + j) * vld + c, dvs[idx]);
    }
}

__global__ void __launch_bounds__(GT_ATT_THREADS)
    gt_k_sdpa_dq(gt_att a, const void *q, int dq, const void *k, int dk, const void *v, int dv,
                 const void *lse, int dlse, const void *g, int dg, const float *dsum, void *dqout,
                 int ddq)
{
    extern __shared__ float sm[];
    float *qs = sm, *gs = qs + GT_ATT_BQ * a.d, *dqs = gs + GT_ATT_BQ * a.dv;
    float *ks = dqs + GT_ATT_BQ * a.d, *vs = ks + GT_ATT_BK * a.d, *ps = vs + GT_ATT_BK * a.dv;
    float *dss = ps + GT_ATT_BQ * GT_ATT_BK, *ls = dss + GT_ATT_BQ * GT_ATT_BK,
          *ds = ls + GT_ATT_BQ;
    int64_t bh = blockIdx.y, bi = bh / a.hq, h = bh - bi * a.hq;
    int64_t kvh = h / (a.hq / a.hkv), q0 = (int64_t)blockIdx.x * GT_ATT_BQ;
    int64_t ko = gt_att_at(a, bi, kvh, a.hkv, a.t, a.d),
            vo = gt_att_at(a, bi, kvh, a.hkv, a.t, a.dv);
    int64_t kld = gt_att_ld(a, a.hkv, a.d), vld = gt_att_ld(a, a.hkv, a.dv);
    int64_t qo = gt_att_at(a, bi, h, a.hq, a.s, a.d), qld = gt_att_ld(a, a.hq, a.d);
    gt_att_load(qs, q, dq, qo, q0, GT_ATT_BQ, a.s, a.d, qld);
    gt_att_load(gs, g, dg, gt_att_at(a, bi, h, a.hq, a.s, a.dv), q0, GT_ATT_BQ, a.s, a.dv,
                gt_att_ld(a, a.hq, a.dv));
    gt_att_load_rows(a, bh, q0, lse, dlse, dsum, ls, ds);
    for (int idx = threadIdx.x; idx < GT_ATT_BQ * a.d; idx += blockDim.x)
        dqs[idx] = 0.0f;
    int64_t kend = a.causal ? min(a.t, q0 + GT_ATT_BQ) : a.t;
    for (int64_t k0 = gt_att_first_tile(a, bi, q0); k0 < kend; k0 += GT_ATT_BK) {
        __syncthreads();
        gt_att_load(ks, k, dk, ko, k0, GT_ATT_BK, a.t, a.d, kld);
        gt_att_load(vs, v, dv, vo, k0, GT_ATT_BK, a.t, a.dv, vld);
        __syncthreads();
        gt_att_tile_grads(a, bi, q0, k0, qs, gs, ks, vs, ls, ds, ps, dss);
        __syncthreads();
        for (int idx = threadIdx.x; idx < GT_ATT_BQ * a.d; idx += blockDim.x) {
            int r = idx / (int)a.d, c = idx - r * (int)a.d;
            float acc = dqs[idx];
            for (int j = 0; j < GT_ATT_BK; j++)
                acc = fmaf(dss[r * GT_ATT_BK + j], ks[j * a.d + c], acc);
            dqs[idx] = acc;
        }
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < GT_ATT_BQ * a.d; idx += blockDim.x) {
        int r = idx / (int)a.d, c = idx - r * (int)a.d;
        if (q0 + r < a.s) gt_st(dqout, ddq, qo + (q0 + r) * qld + c, a.scale * dqs[idx]);
    }
}

/* ---------------------------------------------------------------- host side */

static gt_status gt_cuda_att_shapes(const gt_kernel_call *c, gt_att *a, gt_error *err)
{
    gt_kernel_attn k;
    GT_TRY(gt_kernel_want_attn(c, &k, err));
    GT_TRY(gt_kernel_want_float(c, c->in[0], "q", err));
    GT_TRY(gt_kernel_want_float(c, c->in[1], "k", err));
    GT_TRY(gt_kernel_want_float(c, c->in[2], "v", err));
    *a = (gt_att){k.b, k.hq, k.hkv, k.s, k.t, k.d, k.dv, k.causal, k.scale, k.layout, k.positions};
    if (a->b * a->hq > 65535 || a->b * a->hkv > 65535)
        return gt_error_set(err, GT_ERR_UNSUPPORTED, "%s: batch * heads above 65535",
                            gt_kernel_op_name(c->op));
    return GT_OK;
}

static gt_status gt_cuda_att_want(const gt_kernel_call *c, const gt_tensor *t, const char *what,
                                  const gt_att *a, int64_t h, int64_t n, int64_t last,
                                  gt_error *err)
{
    GT_TRY(gt_kernel_want_float(c, t, what, err));
    gt_kernel_attn k = {a->b,  a->hq,     a->hkv,         a->s,     a->t,  a->d,
                        a->dv, a->layout, a->causal != 0, a->scale, a->pos};
    return gt_kernel_want_attn_tensor(c, t, what, &k, h, n, last, err);
}

/* Raises the kernel's dynamic shared-memory limit to `bytes` (or fails naming the head dims). */
static gt_status gt_cuda_att_smem(gt_cuda_stream *s, const gt_kernel_call *c, const void *fn,
                                  size_t bytes, const gt_att *a, gt_error *err)
{
    if (bytes > (size_t)s->smem_optin)
        return gt_error_set(err, GT_ERR_UNSUPPORTED,
                            "%s: head dims d = %lld, dv = %lld need %zu bytes of shared memory, "
                            "the device allows %d",
                            gt_kernel_op_name(c->op), (long long)a->d, (long long)a->dv, bytes,
                            s->smem_optin);
    return gt_cuda_smem_limit(s, c, fn, bytes, err);
}

/* The flash kernels' arguments for call c (pointers of the op's inputs and outputs). */
static gt_flash gt_cuda_att_flash(const gt_kernel_call *c, const gt_att *a)
{
    gt_flash f;
    memset(&f, 0, sizeof f);
    f.q = (const __nv_bfloat16 *)c->in[0]->data;
    f.k = (const __nv_bfloat16 *)c->in[1]->data;
    f.v = (const __nv_bfloat16 *)c->in[2]->data;
    f.b = a->b;
    f.hq = a->hq;
    f.hkv = a->hkv;
    f.s = a->s;
    f.t = a->t;
    /* d == dv on the flash path: q, o, g, out, dq share one set of strides, k, v, dk, dv another */
    int64_t d = a->d;
    f.sq = a->layout ? gt_flash_stride{a->hq * a->s * d, d, a->hq * d}
                     : gt_flash_stride{a->hq * a->s * d, a->s * d, d};
    f.skv = a->layout ? gt_flash_stride{a->hkv * a->t * d, d, a->hkv * d}
                      : gt_flash_stride{a->hkv * a->t * d, a->t * d, d};
    f.d = (int)a->d;
    f.causal = a->causal;
    f.scale = a->scale;
    f.scale_log2 = a->scale * 1.4426950408889634f;
    f.pos = a->pos;
    return f;
}

gt_status gt_cuda_sdpa(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    gt_att a;
    GT_TRY(gt_cuda_att_shapes(c, &a, err));
    GT_TRY(gt_cuda_att_want(c, c->out[0], "out", &a, a.hq, a.s, a.dv, err));
    GT_TRY(gt_cuda_att_want(c, c->out[1], "lse", &a, a.hq, a.s, -1, err));
    if (a.b * a.hq * a.s == 0) return GT_OK;
    if (a.t > 0 && gt_cuda_flash_io(c)) {
        gt_cudnn_sdpa cd = {c->in[0]->data,
                            c->in[1]->data,
                            c->in[2]->data,
                            c->out[0]->data,
                            (float *)c->out[1]->data,
                            NULL,
                            NULL,
                            NULL,
                            NULL,
                            a.b,
                            a.hq,
                            a.hkv,
                            a.s,
                            a.t,
                            a.d,
                            a.dv,
                            a.layout,
                            a.causal,
                            a.scale,
                            a.pos};
        bool ran = false;
        GT_TRY(gt_cudnn_sdpa_forward(s, &cd, &ran, err));
        if (ran) return GT_OK;
    }
    if (gt_cuda_flash_fits(c, a.d, a.dv, a.t)) {
        gt_flash f = gt_cuda_att_flash(c, &a);
        f.out = (__nv_bfloat16 *)c->out[0]->data;
        f.lse = (float *)c->out[1]->data;
        return gt_cuda_flash_fwd(s, c, &f, err);
    }
    size_t bytes =
        sizeof(float) * (size_t)(GT_ATT_BQ * a.d + GT_ATT_BK * a.d + GT_ATT_BK * a.dv +
                                 GT_ATT_BQ * a.dv + GT_ATT_BQ * GT_ATT_BK + 3 * GT_ATT_BQ);
    GT_TRY(gt_cuda_att_smem(s, c, (const void *)gt_k_sdpa_fwd, bytes, &a, err));
    dim3 grid((unsigned)((a.s + GT_ATT_BQ - 1) / GT_ATT_BQ), (unsigned)(a.b * a.hq));
    const gt_tensor *q = c->in[0], *k = c->in[1], *v = c->in[2];
    gt_k_sdpa_fwd<<<grid, GT_ATT_THREADS, bytes, s->stream>>>(
        a, q->data, q->dtype, k->data, k->dtype, v->data, v->dtype, c->out[0]->data,
        c->out[0]->dtype, c->out[1]->data, c->out[1]->dtype);
    return gt_cuda_launched(c, err);
}

__global__ void gt_k_att_zero(int64_t n, void *y, int dy)
{
    GT_GRID_STRIDE(i, n)
    {
        gt_st(y, dy, i, 0.0f);
    }
}

gt_status gt_cuda_sdpa_backward(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    gt_att a;
    GT_TRY(gt_cuda_att_shapes(c, &a, err));
    GT_TRY(gt_cuda_att_want(c, c->in[3], "out", &a, a.hq, a.s, a.dv, err));
    GT_TRY(gt_cuda_att_want(c, c->in[4], "lse", &a, a.hq, a.s, -1, err));
    GT_TRY(gt_cuda_att_want(c, c->in[5], "dout", &a, a.hq, a.s, a.dv, err));
    GT_TRY(gt_cuda_att_want(c, c->out[0], "dq", &a, a.hq, a.s, a.d, err));
    GT_TRY(gt_cuda_att_want(c, c->out[1], "dk", &a, a.hkv, a.t, a.d, err));
    GT_TRY(gt_cuda_att_want(c, c->out[2], "dv", &a, a.hkv, a.t, a.dv, err));
    const gt_tensor *q = c->in[0], *k = c->in[1], *v = c->in[2], *o = c->in[3], *l = c->in[4];
    const gt_tensor *g = c->in[5];
    gt_tensor *dq = c->out[0], *dk = c->out[1], *dv = c->out[2];
    int64_t qrows = a.b * a.hq * a.s;
    if (qrows == 0) { /* no queries: dk = dv = 0 */
        int64_t nk = gt_tensor_numel(dk), nv = gt_tensor_numel(dv);
        if (nk > 0)
            gt_k_att_zero<<<gt_cuda_blocks(nk), GT_CUDA_THREADS, 0, s->stream>>>(nk, dk->data,
                                                                                 dk->dtype);
        if (nv > 0)
            gt_k_att_zero<<<gt_cuda_blocks(nv), GT_CUDA_THREADS, 0, s->stream>>>(nv, dv->data,
                                                                                 dv->dtype);
        return gt_cuda_launched(c, err);
    }
    if (a.t > 0 && gt_cuda_flash_io(c)) { /* cuDNN's, where it takes the call */
        gt_cudnn_sdpa cd = {q->data, k->data,  v->data,  o->data,  (float *)l->data,
                            g->data, dq->data, dk->data, dv->data, a.b,
                            a.hq,    a.hkv,    a.s,      a.t,      a.d,
                            a.dv,    a.layout, a.causal, a.scale,  a.pos};
        bool ran = false;
        GT_TRY(gt_cudnn_sdpa_backward(s, c, &cd, &ran, err));
        if (ran) return GT_OK;
    }
    void *scr; /* D; the flash kernels also keep lse log2 e after it */
    GT_TRY(gt_cuda_scratch(s, c, 2 * (size_t)qrows * sizeof(float), &scr, err));
    float *dsum = (float *)scr;
    if (gt_cuda_flash_fits(c, a.d, a.dv, a.t)) {
        gt_flash f = gt_cuda_att_flash(c, &a);
        f.o = (const __nv_bfloat16 *)o->data;
        f.g = (const __nv_bfloat16 *)g->data;
        f.lse = (float *)l->data;
        f.dsum = dsum;
        f.lse2 = dsum + qrows;
        f.dq = (__nv_bfloat16 *)dq->data;
        f.dk = (__nv_bfloat16 *)dk->data;
        f.dv = (__nv_bfloat16 *)dv->data;
        return gt_cuda_flash_bwd(s, c, &f, err);
    }
    gt_k_sdpa_dsum<<<gt_cuda_blocks(qrows), GT_CUDA_THREADS, 0, s->stream>>>(
        a, qrows, o->data, o->dtype, g->data, g->dtype, dsum);
    GT_TRY(gt_cuda_launched(c, err));
    size_t tile = (size_t)(GT_ATT_BQ * GT_ATT_BK);
    if (a.t > 0) {
        size_t bytes =
            sizeof(float) * (size_t)(2 * GT_ATT_BK * a.d + 2 * GT_ATT_BK * a.dv + GT_ATT_BQ * a.d +
                                     GT_ATT_BQ * a.dv + 2 * tile + 2 * GT_ATT_BQ);
        GT_TRY(gt_cuda_att_smem(s, c, (const void *)gt_k_sdpa_dkdv, bytes, &a, err));
        dim3 grid((unsigned)((a.t + GT_ATT_BK - 1) / GT_ATT_BK), (unsigned)(a.b * a.hkv));
        gt_k_sdpa_dkdv<<<grid, GT_ATT_THREADS, bytes, s->stream>>>(
            a, q->data, q->dtype, k->data, k->dtype, v->data, v->dtype, l->data, l->dtype, g->data,
            g->dtype, dsum, dk->data, dk->dtype, dv->data, dv->dtype);
        GT_TRY(gt_cuda_launched(c, err));
    }
    size_t bytes =
        sizeof(float) * (size_t)(2 * GT_ATT_BQ * a.d + GT_ATT_BQ * a.dv + GT_ATT_BK * a.d +
                                 GT_ATT_BK * a.dv + 2 * tile + 2 * GT_ATT_BQ);
    GT_TRY(gt_cuda_att_smem(s, c, (const void *)gt_k_sdpa_dq, bytes, &a, err));
    dim3 grid((unsigned)((a.s + GT_ATT_BQ - 1) / GT_ATT_BQ), (unsigned)(a.b * a.hq));
    gt_k_sdpa_dq<<<grid, GT_ATT_THREADS, bytes, s->stream>>>(
        a, q->data, q->dtype, k->data, k->dtype, v->data, v->dtype, l->data, l->dtype, g->data,
        g->dtype, dsum, dq->data, dq->dtype);
    return gt_cuda_launched(c, err);
}
