/* cpu_optim.c — f32 kernels of the optimizer ops: clamp and the fused AdamW step.
 *
 * Both are elementwise with no accumulation, so results do not depend on the walk order and are
 * identical run to run. AdamW follows torch.optim.AdamW's single-tensor path (foreach=False,
 * fused=False) operation by operation, in f32, with torch's scalar handling: scalars derived from
 * the hyper-parameters are computed in double (Python floats there) and rounded to f32 once, where
 * torch hands a Python float to an f32 tensor op. See gt_ops.def for the formulas. */
#include "cpu_internal.h"

#include <math.h>

gt_status gt_cpu_clamp(const gt_kernel_call *c, gt_error *err)
{
    const gt_tensor *x = c->in[0];
    gt_tensor *out = c->out[0];
    GT_TRY(gt_cpu_want_f32(c, x, "input", err));
    GT_TRY(gt_cpu_want_f32(c, out, "output", err));
    GT_TRY(gt_kernel_want_same_shape(c, x, "input", out, "output", err));
    GT_TRY(gt_kernel_want_attrs(c, 0, 2, 0, err));
    if (isnan(c->f[0]) || isnan(c->f[1]) || c->f[0] > c->f[1])
        return gt_error_set(err, GT_ERR_INVALID,
                            "clamp: bounds must satisfy min <= max, got [%g, %g]", c->f[0],
                            c->f[1]);
    /* Bounds are rounded to f32 first, as torch.clamp does with Python scalars on f32 tensors.
     * The comparisons are false for NaN, so NaN passes through (torch propagates it too). */
    float lo = (float)c->f[0], hi = (float)c->f[1];
    int64_t n = gt_tensor_numel(x);
    const float *xp = x->data;
    float *y = out->data;
    for (int64_t i = 0; i < n; i++) {
        float v = xp[i];
        y[i] = v < lo ? lo : v > hi ? hi : v;
    }
    return GT_OK;
}

/* The per-call constants of one AdamW step, each rounded to f32 from a double computation. */
typedef struct {
    float clip;     /* g' = g * clip */
    float decay;    /* 1 - lr * weight_decay */
    float w1;       /* lerp weight 1 - beta1 */
    float beta2;    /* v * beta2 */
    float w2;       /* 1 - beta2 */
    float neg_step; /* -(lr / bc1) */
    float bc2_sqrt; /* sqrt(bc2) */
    float eps;
    bool decays; /* weight_decay != 0 (torch skips the multiply otherwise) */
} gt_adamw_consts;

static gt_status gt_cpu_adamw_consts(const gt_kernel_call *c, const float *scalars, float clip,
                                     gt_adamw_consts *k, gt_error *err)
{
    double beta1 = c->f[0], beta2 = c->f[1], eps = c->f[2], wd = c->f[3];
    double lr = scalars[0], bc1 = scalars[1], bc2 = scalars[2];
    /* The scalars come from the host each step (gt_optim_scalars): refuse what would turn the
     * parameters into NaN or inf silently. bc = 1 - beta^t lies in (0, 1] for t >= 1. */
    if (!(lr >= 0.0) || isinf(lr) || !(bc1 > 0.0 && bc1 <= 1.0) || !(bc2 > 0.0 && bc2 <= 1.0))
        return gt_error_set(err, GT_ERR_INVALID,
                            "adamw: scalars {lr, bias_correction1, bias_correction2} = {%g, %g, "
                            "%g}: expected lr finite >= 0 and both corrections in (0, 1]",
                            lr, bc1, bc2);
    k->clip = clip;
    k->decay = (float)(1.0 - lr * wd);
    k->w1 = (float)(1.0 - beta1);
    k->beta2 = (float)beta2;
    k->w2 = (float)(1.0 - beta2);
    k->neg_step = (float)(-(lr / bc1));
    k->bc2_sqrt = (float)sqrt(bc2);
    k->eps = (float)eps;
    k->decays = wd != 0.0;
    return GT_OK;
}

/* The elements [0, n). Every input is read before any output is written, so a planner may alias
 * p' with p, m' with m and v' with v. Each line is one torch op, evaluated as torch's CPU kernels
 * do (checked against torch 2.x bit for bit; they fuse the multiply-add of lerp and addcmul):
 *   g.mul_(clip); p.mul_(1 - lr*wd)
 *   m.lerp_(g, w), w = 1 - beta1:  fma(w, g - m, m) for w < 0.5, else fma(w - 1, g - m, g)
 *   v.mul_(beta2).addcmul_(g, g, value=1 - beta2)  ->  fma((1 - beta2)*g, g, v*beta2)
 *   denom = (v.sqrt() / sqrt(bc2)).add_(eps)
 *   p.addcdiv_(m, denom, value=-lr/bc1)            ->  p + ((-lr/bc1)*m)/denom
 * fmaf is correctly rounded by the C standard, so these bits do not depend on the machine (it is a
 * libm call where the compiler may not emit an FMA instruction). `decays` and `small_w1`
 * (w < 0.5) are constants at each call, so every loop is free of branches; the constants sit in
 * locals, and ivdep says no element depends on another's outputs (an output array is its input
 * array or apart from every input): without these GCC kept the loop scalar (it wants more
 * overlap checks of the seven arrays than it makes). */
static inline __attribute__((always_inline)) void
gt_adamw_run(const gt_adamw_consts *k, bool decays, bool small_w1, int64_t n, const float *pp,
             const float *gp, const float *mp, const float *vp, float *po, float *mo, float *vo)
{
    const float clip = k->clip, decay = k->decay, w1 = k->w1, w1m = k->w1 - 1.0f;
    const float beta2 = k->beta2, w2 = k->w2, neg_step = k->neg_step, bc2_sqrt = k->bc2_sqrt;
    const float eps = k->eps;
#pragma GCC ivdep
    for (int64_t i = 0; i < n; i++) {
        float g = gp[i] * clip, p = pp[i], m = mp[i], v = vp[i];
        if (decays) p = p * decay;
        m = small_w1 ? fmaf(w1, g - m, m) : fmaf(w1m, g - m, g);
        v = fmaf(w2 * g, g, v * beta2);
        float denom = sqrtf(v) / bc2_sqrt + eps;
        po[i] = p + neg_step * m / denom;
        mo[i] = m;
        vo[i] = v;
    }
}

/* The element loop, also compiled for x86-64-v3 (AVX2, FMA) and picked at load time where the
 * CPU has it (GCC function multi-versioning). The clone computes the same bits: fmaf becomes the
 * FMA instruction, which rounds once as fmaf does; sqrt, div, mul and add are IEEE operations at
 * any vector width; contraction of other multiply-adds into FMAs is turned off, and nothing is
 * summed across elements. test_cpu_optim checks the kernel bit for bit against torch's f32 op
 * sequence restated element by element, on whichever version the machine picks. */
GT_CPU_ELEMENT_LOOP static void gt_adamw_loop(const gt_adamw_consts *k, int64_t n, const float *pp,
                                              const float *gp, const float *mp, const float *vp,
                                              float *po, float *mo, float *vo)
{
    bool small = k->w1 < 0.5f;
    if (k->decays && small)
        gt_adamw_run(k, true, true, n, pp, gp, mp, vp, po, mo, vo);
    else if (k->decays)
        gt_adamw_run(k, true, false, n, pp, gp, mp, vp, po, mo, vo);
    else if (small)
        gt_adamw_run(k, false, true, n, pp, gp, mp, vp, po, mo, vo);
    else
        gt_adamw_run(k, false, false, n, pp, gp, mp, vp, po, mo, vo);
}

typedef struct {
    gt_adamw_consts k;
    const float *pp, *gp, *mp, *vp;
    float *po, *mo, *vo;
} gt_adamw_call;

/* Elements [lo, hi): each element's update is alone, so blocks on threads keep the bits. */
static void gt_adamw_block(int64_t lo, int64_t hi, void *user)
{
    const gt_adamw_call *a = user;
    gt_adamw_loop(&a->k, hi - lo, a->pp + lo, a->gp + lo, a->mp + lo, a->vp + lo, a->po + lo,
                  a->mo + lo, a->vo + lo);
}

gt_status gt_cpu_adamw(const gt_kernel_call *c, gt_error *err)
{
    for (int k = 0; k < 6; k++)
        GT_TRY(gt_cpu_want_f32(c, c->in[k], gt_kernel_adamw_in[k], err));
    for (int k = 0; k < 3; k++)
        GT_TRY(gt_cpu_want_f32(c, c->out[k], gt_kernel_adamw_out[k], err));
    GT_TRY(gt_kernel_want_adamw(c, err));
    const gt_tensor *p = c->in[0];
    gt_adamw_consts k = {0};
    GT_TRY(gt_cpu_adamw_consts(c, c->in[4]->data, ((const float *)c->in[5]->data)[0], &k, err));

    int64_t n = gt_tensor_numel(p);
    gt_adamw_call a = {.k = k,
                       .pp = p->data,
                       .gp = c->in[1]->data,
                       .mp = c->in[2]->data,
                       .vp = c->in[3]->data,
                       .po = c->out[0]->data,
                       .mo = c->out[1]->data,
                       .vo = c->out[2]->data};
    gt_cpu_parallel_for(n, GT_CPU_GRAIN, gt_adamw_block, &a);
    return GT_OK;
}
