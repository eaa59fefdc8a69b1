/* test_cpu_optim.c — CPU kernels clamp and adamw against naive double references (written from
 * the formulas of torch.clamp and torch.optim.AdamW, not from the kernels); NaN and infinite
 * bounds; both branches of torch's lerp; in-place aliasing; the bf16/f16 wrapper; determinism;
 * errors for bad scalars and shapes. adamw also bitwise against torch's f32 op sequence restated
 * element by element (ref_adamw_f32), whatever vector clone of its loop the machine runs. */
#include "test_cpu_util.h"

static void test_clamp(tt_rng *r)
{
    const double bounds[][2] = {{-0.5, 0.25},          {-INFINITY, 1.0}, {0.0, INFINITY},
                                {-INFINITY, INFINITY}, {0.3, 0.3},       {-0.1, 0.1}};
    const int64_t shape[] = {3, 17};
    for (size_t b = 0; b < sizeof bounds / sizeof bounds[0]; b++) {
        gt_tensor x = tt_rand(2, shape, r, -2, 2), y = tt_new(GT_F32, 2, shape);
        gt_tensor_set_f32(&x, 5, NAN);
        gt_tensor_set_f32(&x, 6, INFINITY);
        gt_tensor_set_f32(&x, 7, -INFINITY);
        tt_call k;
        tt_init(&k, GT_OP_CLAMP);
        tt_in(&k, &x);
        tt_out(&k, &y);
        tt_f(&k, bounds[b][0]);
        tt_f(&k, bounds[b][1]);
        if (!tt_run_ok(&k, "clamp")) continue;
        /* Reference: the bound when x lies outside [lo, hi], else x; NaN stays NaN. */
        double lo = (float)bounds[b][0], hi = (float)bounds[b][1];
        bool ok = true;
        for (int64_t i = 0; i < gt_tensor_numel(&x); i++) {
            double xv = gt_tensor_get_f32(&x, i), want = xv < lo ? lo : xv > hi ? hi : xv;
            double got = gt_tensor_get_f32(&y, i);
            ok &= isnan(xv) ? isnan(got) : got == want;
        }
        EXPECT(ok, "clamp [%g, %g] matches the reference", bounds[b][0], bounds[b][1]);
        EXPECT(tt_deterministic(&k), "clamp determinism %zu", b);
        EXPECT(tt_half_path(&k, GT_BF16, 0), "clamp bf16 path %zu", b);
        EXPECT(tt_half_path(&k, GT_F16, 0), "clamp f16 path %zu", b);
        gt_tensor_free(&x);
        gt_tensor_free(&y);
    }

    /* min > max is an error, not a silent choice */
    gt_tensor x = tt_rand(1, TT_SHAPE(4), r, -1, 1), y = tt_new(GT_F32, 1, TT_SHAPE(4));
    tt_call k;
    tt_init(&k, GT_OP_CLAMP);
    tt_in(&k, &x);
    tt_out(&k, &y);
    tt_f(&k, 1.0);
    tt_f(&k, -1.0);
    gt_error err = {0};
    EXPECT(tt_run(&k, &err) == GT_ERR_INVALID && strstr(err.msg, "clamp"), "clamp min > max: %s",
           err.msg);
    gt_tensor_free(&x);
    gt_tensor_free(&y);
}

typedef struct {
    double beta1, beta2, eps, wd, lr, clip;
    int64_t t; /* step, for the bias corrections */
} adamw_case;

/* torch.optim.AdamW's update for one element, in double:
 *   g' = g clip; p1 = p (1 - lr wd); m' = m + (1 - b1)(g' - m); v' = b2 v + (1 - b2) g'^2
 *   p' = p1 - lr / (1 - b1^t) * m' / (sqrt(v') / sqrt(1 - b2^t) + eps) */
static void ref_adamw(const adamw_case *c, double lr, double bc1, double bc2, double p, double g,
                      double m, double v, double *po, double *mo, double *vo)
{
    g *= c->clip;
    p *= 1.0 - lr * c->wd;
    m = m + (1.0 - c->beta1) * (g - m);
    v = c->beta2 * v + (1.0 - c->beta2) * g * g;
    *po = p - lr / bc1 * m / (sqrt(v) / sqrt(bc2) + c->eps);
    *mo = m;
    *vo = v;
}

/* torch's single-tensor AdamW step for one element as its CPU kernels compute it in f32, one op at
 * a time (lerp and addcmul as fused multiply-adds; scalars from Python floats rounded to f32
 * once): g.mul_(clip); p.mul_(1 - lr wd); m.lerp_(g, 1 - b1);
 * v.mul_(b2).addcmul_(g, g, 1 - b2); p.addcdiv_(m, v.sqrt() / sqrt(bc2) + eps, -lr / bc1). */
static void ref_adamw_f32(const adamw_case *c, float lr, float bc1, float bc2, float clip, float p,
                          float g, float m, float v, float *po, float *mo, float *vo)
{
    g = g * clip;
    if (c->wd != 0.0) p = p * (float)(1.0 - (double)lr * c->wd);
    float w = (float)(1.0 - c->beta1), w2 = (float)(1.0 - c->beta2);
    m = w < 0.5f ? fmaf(w, g - m, m) : fmaf(w - 1.0f, g - m, g); /* torch's lerp, both branches */
    v = fmaf(w2 * g, g, v * (float)c->beta2);
    float denom = sqrtf(v) / (float)sqrt((double)bc2) + (float)c->eps;
    *po = p + (float)(-((double)lr / bc1)) * m / denom;
    *mo = m;
    *vo = v;
}

/* Call k with its tensors replaced: p, g, m, v in; p', m', v' out. */
static tt_call adamw_on(const tt_call *k, gt_tensor *p, gt_tensor *g, gt_tensor *m, gt_tensor *v,
                        gt_tensor *po, gt_tensor *mo, gt_tensor *vo)
{
    tt_call on = *k;
    gt_tensor *in[4] = {p, g, m, v}, *out[3] = {po, mo, vo};
    for (int j = 0; j < 4; j++)
        on.c.in[j] = in[j];
    for (int j = 0; j < 3; j++)
        on.c.out[j] = out[j];
    return on;
}

/* Call k (case c, scalars sc) on a longer tensor, bitwise against torch's f32 op sequence: the
 * kernel's loop may run a clone built for the machine's vector unit (cpu_optim.c), which must not
 * change a bit. */
static void check_f32_sequence(tt_rng *r, const adamw_case *c, const tt_call *k, const float *sc,
                               size_t ci)
{
    const int64_t big[] = {1003}; /* mostly the loop's vector body */
    gt_tensor p = tt_rand(1, big, r, -1, 1), g = tt_rand(1, big, r, -1, 1);
    gt_tensor m = tt_rand(1, big, r, -0.1, 0.1), v = tt_rand(1, big, r, 0, 0.01);
    gt_tensor po = tt_new(GT_F32, 1, big), mo = tt_new(GT_F32, 1, big);
    gt_tensor vo = tt_new(GT_F32, 1, big);
    tt_call kb = adamw_on(k, &p, &g, &m, &v, &po, &mo, &vo);
    if (tt_run_ok(&kb, "adamw f32 sequence")) {
        int64_t differ = 0;
        for (int64_t i = 0; i < big[0]; i++) {
            float want[3];
            ref_adamw_f32(c, sc[0], sc[1], sc[2], (float)c->clip, gt_tensor_get_f32(&p, i),
                          gt_tensor_get_f32(&g, i), gt_tensor_get_f32(&m, i),
                          gt_tensor_get_f32(&v, i), &want[0], &want[1], &want[2]);
            float got[3] = {gt_tensor_get_f32(&po, i), gt_tensor_get_f32(&mo, i),
                            gt_tensor_get_f32(&vo, i)};
            differ += memcmp(got, want, sizeof got) != 0;
        }
        EXPECT(differ == 0,
               "adamw case %zu: %lld of %lld elements differ from torch's f32 op "
               "sequence",
               ci, (long long)differ, (long long)big[0]);
    }
    gt_tensor *all[] = {&p, &g, &m, &v, &po, &mo, &vo};
    for (int j = 0; j < 7; j++)
        gt_tensor_free(all[j]);
}

static void test_adamw(tt_rng *r)
{
    const adamw_case cases[] = {
        {0.9, 0.95, 1e-8, 0.1, 1e-2, 0.7, 3},  /* torchtitan's betas, clipped gradient */
        {0.9, 0.999, 1e-8, 0.0, 3e-3, 1.0, 1}, /* no weight decay, first step */
        {0.3, 0.9, 1e-6, 0.05, 5e-2, 1.0, 7},  /* lerp weight 0.7 >= 0.5: torch's other branch */
        {0.0, 0.0, 1e-3, 0.2, 1e-1, 0.25, 2},  /* betas 0: m' = g', v' = g'^2 */
    };
    const int64_t shape[] = {4, 9};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const adamw_case *c = &cases[ci];
        float sc[3] = {(float)c->lr, (float)(1.0 - pow(c->beta1, (double)c->t)),
                       (float)(1.0 - pow(c->beta2, (double)c->t))};
        gt_tensor p = tt_rand(2, shape, r, -1, 1), g = tt_rand(2, shape, r, -1, 1);
        gt_tensor m = tt_rand(2, shape, r, -0.1, 0.1), v = tt_rand(2, shape, r, 0, 0.01);
        gt_tensor scal = tt_new(GT_F32, 1, TT_SHAPE(3)), clip = tt_new(GT_F32, 0, NULL);
        for (int j = 0; j < 3; j++)
            gt_tensor_set_f32(&scal, j, sc[j]);
        gt_tensor_set_f32(&clip, 0, (float)c->clip);
        gt_tensor po = tt_new(GT_F32, 2, shape), mo = tt_new(GT_F32, 2, shape);
        gt_tensor vo = tt_new(GT_F32, 2, shape);
        tt_call k;
        tt_init(&k, GT_OP_ADAMW);
        tt_in(&k, &p);
        tt_in(&k, &g);
        tt_in(&k, &m);
        tt_in(&k, &v);
        tt_in(&k, &scal);
        tt_in(&k, &clip);
        tt_out(&k, &po);
        tt_out(&k, &mo);
        tt_out(&k, &vo);
        tt_f(&k, c->beta1);
        tt_f(&k, c->beta2);
        tt_f(&k, c->eps);
        tt_f(&k, c->wd);
        if (!tt_run_ok(&k, "adamw")) continue;

        int64_t n = gt_tensor_numel(&p);
        double *rp = tt_doubles(n), *rm = tt_doubles(n), *rv = tt_doubles(n);
        for (int64_t i = 0; i < n; i++)
            ref_adamw(c, sc[0], sc[1], sc[2], gt_tensor_get_f32(&p, i), gt_tensor_get_f32(&g, i),
                      gt_tensor_get_f32(&m, i), gt_tensor_get_f32(&v, i), &rp[i], &rm[i], &rv[i]);
        /* f32 arithmetic vs double: a few ulps, judged against the tensor's magnitude where
         * m' = 0.9 m + 0.1 g' cancels. The lr is fed as f32, so the reference uses it too. */
        EXPECT(tt_close(&po, rp, 1e-6, 1e-6, "adamw param"), "adamw case %zu param", ci);
        EXPECT(tt_close(&mo, rm, 1e-6, 1e-6, "adamw exp_avg"), "adamw case %zu exp_avg", ci);
        EXPECT(tt_close(&vo, rv, 1e-6, 1e-6, "adamw exp_avg_sq"), "adamw case %zu exp_avg_sq", ci);
        EXPECT(tt_deterministic(&k), "adamw determinism case %zu", ci);

        check_f32_sequence(r, c, &k, sc, ci);
        EXPECT(tt_half_path(&k, GT_BF16, 0), "adamw bf16 path case %zu", ci);
        EXPECT(tt_half_path(&k, GT_F16, 0), "adamw f16 path case %zu", ci);

        /* In place (p' over p, m' over m, v' over v): what a memory planner may do. */
        gt_tensor pa = tt_new(GT_F32, 2, shape), ma = tt_new(GT_F32, 2, shape);
        gt_tensor va = tt_new(GT_F32, 2, shape);
        memcpy(pa.data, p.data, gt_tensor_nbytes(&p));
        memcpy(ma.data, m.data, gt_tensor_nbytes(&m));
        memcpy(va.data, v.data, gt_tensor_nbytes(&v));
        tt_call ka = adamw_on(&k, &pa, &g, &ma, &va, &pa, &ma, &va);
        if (tt_run_ok(&ka, "adamw in place"))
            EXPECT(tt_same_bits(&pa, &po) && tt_same_bits(&ma, &mo) && tt_same_bits(&va, &vo),
                   "adamw in place equals out of place, case %zu", ci);
        gt_tensor_free(&pa);
        gt_tensor_free(&ma);
        gt_tensor_free(&va);
        free(rp);
        free(rm);
        free(rv);
        gt_tensor_free(&p);
        gt_tensor_free(&g);
        gt_tensor_free(&m);
        gt_tensor_free(&v);
        gt_tensor_free(&scal);
        gt_tensor_free(&clip);
        gt_tensor_free(&po);
        gt_tensor_free(&mo);
        gt_tensor_free(&vo);
    }
}

/* Bad scalars (a bias correction of 0: step 0), a wrong scalars size, and mismatched shapes are
 * refused with messages naming adamw. */
static void test_adamw_errors(tt_rng *r)
{
    const int64_t shape[] = {5};
    gt_tensor p = tt_rand(1, shape, r, -1, 1), g = tt_rand(1, shape, r, -1, 1);
    gt_tensor m = tt_new(GT_F32, 1, shape), v = tt_new(GT_F32, 1, shape);
    gt_tensor g_bad = tt_rand(1, TT_SHAPE(6), r, -1, 1);
    gt_tensor scal = tt_new(GT_F32, 1, TT_SHAPE(3)), scal2 = tt_new(GT_F32, 1, TT_SHAPE(2));
    gt_tensor clip = tt_new(GT_F32, 0, NULL);
    gt_tensor po = tt_new(GT_F32, 1, shape), mo = tt_new(GT_F32, 1, shape);
    gt_tensor vo = tt_new(GT_F32, 1, shape);
    gt_tensor_set_f32(&clip, 0, 1.0f);
    gt_tensor_set_f32(&scal, 0, 1e-3f);
    gt_tensor_set_f32(&scal, 1, 0.0f); /* 1 - beta1^0 */
    gt_tensor_set_f32(&scal, 2, 0.05f);
    tt_call k;
    tt_init(&k, GT_OP_ADAMW);
    const gt_tensor *ins[6] = {&p, &g, &m, &v, &scal, &clip};
    for (int j = 0; j < 6; j++)
        tt_in(&k, ins[j]);
    tt_out(&k, &po);
    tt_out(&k, &mo);
    tt_out(&k, &vo);
    tt_f(&k, 0.9);
    tt_f(&k, 0.95);
    tt_f(&k, 1e-8);
    tt_f(&k, 0.1);
    gt_error err = {0};
    EXPECT(tt_run(&k, &err) == GT_ERR_INVALID && strstr(err.msg, "adamw"), "bc1 = 0: %s", err.msg);
    gt_tensor_set_f32(&scal, 1, 0.1f);
    EXPECT(tt_run(&k, &err) == GT_OK, "valid scalars: %s", err.msg);
    k.c.in[4] = &scal2;
    EXPECT(tt_run(&k, &err) == GT_ERR_SHAPE && strstr(err.msg, "scalars"), "scalars f32[2]: %s",
           err.msg);
    k.c.in[4] = &scal;
    k.c.in[1] = &g_bad;
    EXPECT(tt_run(&k, &err) == GT_ERR_SHAPE && strstr(err.msg, "grad"), "grad shape: %s", err.msg);
    k.c.in[1] = &g;
    k.f[0] = 1.0; /* beta1 = 1 */
    EXPECT(tt_run(&k, &err) == GT_ERR_INVALID && strstr(err.msg, "beta1"), "beta1 = 1: %s",
           err.msg);
    gt_tensor *all[] = {&p, &g, &m, &v, &g_bad, &scal, &scal2, &clip, &po, &mo, &vo};
    for (size_t j = 0; j < sizeof all / sizeof all[0]; j++)
        gt_tensor_free(all[j]);
}

int main(void)
{
    tt_rng r = {0x0971};
    test_clamp(&r);
    test_adamw(&r);
    test_adamw_errors(&r);
    return gt_test_finish();
}
