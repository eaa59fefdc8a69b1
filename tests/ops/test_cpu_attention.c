/* test_cpu_attention.c — CPU sdpa (out and lse) vs a naive double softmax attention, causal and
 * not, multi-head, GQA and MQA, odd sizes, more than one 128-row query block; sdpa_backward vs
 * central finite differences of the naive forward on q, k and v; bf16 path; determinism; causal
 * with s != t is an error; the same bits on 3 threads as on 1. Forward tolerance 1e-5 relative;
 * gradients 1e-4 relative plus 1e-6 absolute (a single key makes dq, dk exactly 0, which f32
 * reaches only to rounding). Layout 1 ([b, s, heads, d]): sdpa and sdpa_backward on the tensors
 * transposed to [b, s, heads, d] must give bitwise the transposes of the layout-0 results (lse
 * bitwise the same), in f32 and bf16, causal and not, GQA, s != t, several 128-row blocks; a layout
 * other than 0/1 is an error. */
#include "test_cpu_util.h"

typedef struct {
    int64_t b, hq, hkv, s, t, d, dv;
    bool causal;
    double scale;
} attn_case;

/* out [b, hq, s, dv] and lse [b, hq, s] in double. */
static void ref_sdpa(const attn_case *a, const double *q, const double *k, const double *v,
                     double *out, double *lse)
{
    double *l = tt_doubles(a->t);
    for (int64_t bi = 0; bi < a->b; bi++)
        for (int64_t h = 0; h < a->hq; h++) {
            int64_t kh = bi * a->hkv + h / (a->hq / a->hkv), qh = bi * a->hq + h;
            for (int64_t i = 0; i < a->s; i++) {
                int64_t nk = a->causal ? i + 1 : a->t;
                double mx = -INFINITY, sum = 0.0;
                for (int64_t j = 0; j < nk; j++) {
                    double dot = 0.0;
                    for (int64_t c = 0; c < a->d; c++)
                        dot += q[(qh * a->s + i) * a->d + c] * k[(kh * a->t + j) * a->d + c];
                    l[j] = a->scale * dot;
                    mx = fmax(mx, l[j]);
                }
                for (int64_t j = 0; j < nk; j++)
                    sum += exp(l[j] - mx);
                double ls = mx + log(sum);
                if (lse) lse[qh * a->s + i] = ls;
                for (int64_t c = 0; c < a->dv; c++) {
                    double o = 0.0;
                    for (int64_t j = 0; j < nk; j++)
                        o += exp(l[j] - ls) * v[(kh * a->t + j) * a->dv + c];
                    out[(qh * a->s + i) * a->dv + c] = o;
                }
            }
        }
    free(l);
}

typedef struct {
    const attn_case *a;
    double *q, *k, *v, *dout, *out;
    int64_t nout;
} attn_ctx;

static double attn_objective(void *p)
{
    attn_ctx *c = p;
    ref_sdpa(c->a, c->q, c->k, c->v, c->out, NULL);
    double l = 0.0;
    for (int64_t i = 0; i < c->nout; i++)
        l += c->dout[i] * c->out[i];
    return l;
}

static void attn_attrs(tt_call *k, const attn_case *a)
{
    tt_i(k, a->causal);
    tt_f(k, a->scale);
}

/* The outputs k's last run left (on one thread) are the bits it gives on `threads` threads: the
 * kernels run one job per (batch, kv head), each in the one-thread order. */
static bool same_bits_on_threads(tt_call *k, int threads)
{
    gt_tensor first[GT_MAX_OUT];
    for (int o = 0; o < k->c.n_out; o++) {
        first[o] = tt_new(k->c.out[o]->dtype, k->c.out[o]->ndim, k->c.out[o]->shape);
        memcpy(first[o].data, k->c.out[o]->data, gt_tensor_nbytes(&first[o]));
    }
    gt_cpu_set_threads(threads);
    bool same = tt_deterministic(k);
    gt_cpu_set_threads(1);
    for (int o = 0; o < k->c.n_out; o++) {
        same = same && tt_same_bits(&first[o], k->c.out[o]);
        gt_tensor_free(&first[o]);
    }
    return same;
}

static void run_case(const attn_case *a, tt_rng *r, bool fd)
{
    int64_t qs[4] = {a->b, a->hq, a->s, a->d}, ks[4] = {a->b, a->hkv, a->t, a->d};
    int64_t vs[4] = {a->b, a->hkv, a->t, a->dv}, os[4] = {a->b, a->hq, a->s, a->dv};
    gt_tensor q = tt_rand(4, qs, r, -1.5, 1.5), k = tt_rand(4, ks, r, -1.5, 1.5);
    gt_tensor v = tt_rand(4, vs, r, -1, 1), dout = tt_rand(4, os, r, -1, 1);
    gt_tensor out = tt_new(GT_F32, 4, os), lse = tt_new(GT_F32, 3, os);
    gt_tensor dq = tt_new(GT_F32, 4, qs), dk = tt_new(GT_F32, 4, ks), dv = tt_new(GT_F32, 4, vs);
    attn_ctx ctx = {
        a,    tt_to_double(&q),     tt_to_double(&k), tt_to_double(&v), tt_to_double(&dout),
        NULL, gt_tensor_numel(&out)};
    ctx.out = tt_doubles(ctx.nout);
    double *ref_lse = tt_doubles(gt_tensor_numel(&lse));
    ref_sdpa(a, ctx.q, ctx.k, ctx.v, ctx.out, ref_lse);

    tt_call kf;
    tt_init(&kf, GT_OP_SDPA);
    tt_in(&kf, &q);
    tt_in(&kf, &k);
    tt_in(&kf, &v);
    tt_out(&kf, &out);
    tt_out(&kf, &lse);
    attn_attrs(&kf, a);
    if (tt_run_ok(&kf, "sdpa")) {
        EXPECT(tt_close(&out, ctx.out, 1e-5, 1e-5, "sdpa out"), "s %lld t %lld causal %d",
               (long long)a->s, (long long)a->t, a->causal);
        EXPECT(tt_close(&lse, ref_lse, 1e-5, 1e-6, "sdpa lse"), "s %lld", (long long)a->s);
    }
    EXPECT(tt_deterministic(&kf), "sdpa determinism");
    EXPECT(same_bits_on_threads(&kf, 3), "sdpa on 3 threads differs from 1");
    EXPECT(tt_half_path(&kf, GT_BF16, 1u << 1), "sdpa bf16 (lse kept f32)");

    tt_call kb;
    tt_init(&kb, GT_OP_SDPA_BACKWARD);
    tt_in(&kb, &q);
    tt_in(&kb, &k);
    tt_in(&kb, &v);
    tt_in(&kb, &out);
    tt_in(&kb, &lse);
    tt_in(&kb, &dout);
    tt_out(&kb, &dq);
    tt_out(&kb, &dk);
    tt_out(&kb, &dv);
    attn_attrs(&kb, a);
    if (fd && tt_run_ok(&kb, "sdpa_backward")) {
        double *g[3] = {tt_doubles(gt_tensor_numel(&q)), tt_doubles(gt_tensor_numel(&k)),
                        tt_doubles(gt_tensor_numel(&v))};
        tt_fd(ctx.q, gt_tensor_numel(&q), 1e-4, attn_objective, &ctx, g[0]);
        tt_fd(ctx.k, gt_tensor_numel(&k), 1e-4, attn_objective, &ctx, g[1]);
        tt_fd(ctx.v, gt_tensor_numel(&v), 1e-4, attn_objective, &ctx, g[2]);
        EXPECT(tt_close_abs(&dq, g[0], 1e-4, 1e-5, 1e-6, "sdpa_backward dq"), "s %lld",
               (long long)a->s);
        EXPECT(tt_close_abs(&dk, g[1], 1e-4, 1e-5, 1e-6, "sdpa_backward dk"), "s %lld",
               (long long)a->s);
        EXPECT(tt_close_abs(&dv, g[2], 1e-4, 1e-5, 1e-6, "sdpa_backward dv"), "s %lld",
               (long long)a->s);
        for (int j = 0; j < 3; j++)
            free(g[j]);
    }
    EXPECT(tt_deterministic(&kb), "sdpa_backward determinism");
    EXPECT(same_bits_on_threads(&kb, 3), "sdpa_backward on 3 threads differs from 1");
    EXPECT(tt_half_path(&kb, GT_BF16, 0), "sdpa_backward bf16");

    free(ctx.q);
    free(ctx.k);
    free(ctx.v);
    free(ctx.dout);
    free(ctx.out);
    free(ref_lse);
    gt_tensor *ts[] = {&q, &k, &v, &dout, &out, &lse, &dq, &dk, &dv};
    for (size_t j = 0; j < sizeof ts / sizeof ts[0]; j++)
        gt_tensor_free(ts[j]);
}

/* ---------------------------------------------------------------- layout 1 */

/* x [b, n1, n2, w] -> [b, n2, n1, w]: the CPU permute kernel (bits moved unchanged). */
static gt_tensor swap12(const gt_tensor *x)
{
    gt_tensor y = tt_new(x->dtype, 4, TT_SHAPE(x->shape[0], x->shape[2], x->shape[1], x->shape[3]));
    tt_call k;
    tt_init(&k, GT_OP_PERMUTE);
    tt_in(&k, x);
    tt_out(&k, &y);
    for (int d = 0; d < 4; d++)
        tt_i(&k, d == 1 ? 2 : d == 2 ? 1 : d);
    tt_run_ok(&k, "permute [0, 2, 1, 3]");
    return y;
}

/* Runs op with inputs in[] (n_in) into fresh outputs of the given dtypes and shapes. */
static bool run_op(gt_op op, const attn_case *a, int layout, gt_tensor *const *in, int n_in,
                   gt_tensor *out, int n_out)
{
    tt_call k;
    tt_init(&k, op);
    for (int j = 0; j < n_in; j++)
        tt_in(&k, in[j]);
    for (int j = 0; j < n_out; j++)
        tt_out(&k, &out[j]);
    tt_i(&k, a->causal);
    tt_i(&k, layout);
    tt_f(&k, a->scale);
    return tt_run_ok(&k, op == GT_OP_SDPA ? "sdpa" : "sdpa_backward");
}

/* Layout 1 on the transposed tensors vs layout 0, bit for bit, with tensors of dtype dt. */
static void run_layout_case(const attn_case *a, gt_dtype dt, tt_rng *r)
{
    int64_t qs[4] = {a->b, a->hq, a->s, a->d}, ks[4] = {a->b, a->hkv, a->t, a->d};
    int64_t vs[4] = {a->b, a->hkv, a->t, a->dv}, os[4] = {a->b, a->hq, a->s, a->dv};
    const int64_t *shapes[6] = {qs, ks, vs, os, os, os}; /* q k v (out lse) dout */
    gt_tensor x0[6], x1[6];                              /* inputs in layout 0 and layout 1 */
    for (int j = 0; j < 6; j++) {
        if (j == 3 || j == 4) continue; /* out and lse come from the forward */
        x0[j] = tt_new(dt, 4, shapes[j]);
        tt_fill(&x0[j], r, j == 2 || j == 5 ? -1 : -1.5, j == 2 || j == 5 ? 1 : 1.5);
        x1[j] = swap12(&x0[j]);
    }
    gt_tensor o0[2] = {tt_new(dt, 4, os), tt_new(GT_F32, 3, os)};
    gt_tensor o1[2] = {tt_new(dt, 4, TT_SHAPE(a->b, a->s, a->hq, a->dv)), tt_new(GT_F32, 3, os)};
    gt_tensor *in0[6] = {&x0[0], &x0[1], &x0[2], &o0[0], &o0[1], &x0[5]};
    gt_tensor *in1[6] = {&x1[0], &x1[1], &x1[2], NULL, &o0[1], &x1[5]};
    char what[96];
    snprintf(what, sizeof what, "b %lld hq %lld hkv %lld s %lld t %lld causal %d %s",
             (long long)a->b, (long long)a->hq, (long long)a->hkv, (long long)a->s, (long long)a->t,
             a->causal, gt_dtype_name(dt));
    if (run_op(GT_OP_SDPA, a, 0, in0, 3, o0, 2) && run_op(GT_OP_SDPA, a, 1, in1, 3, o1, 2)) {
        gt_tensor back = swap12(&o1[0]);
        EXPECT(tt_same_bits(&back, &o0[0]), "layout 1 sdpa out != layout 0 (%s)", what);
        EXPECT(tt_same_bits(&o1[1], &o0[1]), "layout 1 sdpa lse != layout 0 (%s)", what);
        gt_tensor_free(&back);
    }
    /* backward on the layout-0 forward's out and lse (moved to layout 1 for the layout-1 run) */
    gt_tensor out1 = swap12(&o0[0]);
    in1[3] = &out1;
    gt_tensor g0[3] = {tt_new(dt, 4, qs), tt_new(dt, 4, ks), tt_new(dt, 4, vs)};
    gt_tensor g1[3] = {tt_new(dt, 4, x1[0].shape), tt_new(dt, 4, x1[1].shape),
                       tt_new(dt, 4, x1[2].shape)};
    if (run_op(GT_OP_SDPA_BACKWARD, a, 0, in0, 6, g0, 3) &&
        run_op(GT_OP_SDPA_BACKWARD, a, 1, in1, 6, g1, 3)) {
        const char *names[3] = {"dq", "dk", "dv"};
        for (int j = 0; j < 3; j++) {
            gt_tensor back = swap12(&g1[j]);
            EXPECT(tt_same_bits(&back, &g0[j]), "layout 1 sdpa_backward %s != layout 0 (%s)",
                   names[j], what);
            gt_tensor_free(&back);
        }
    }
    for (int j = 0; j < 6; j++) {
        if (j == 3 || j == 4) continue;
        gt_tensor_free(&x0[j]);
        gt_tensor_free(&x1[j]);
    }
    for (int j = 0; j < 3; j++) {
        gt_tensor_free(&g0[j]);
        gt_tensor_free(&g1[j]);
    }
    gt_tensor_free(&o0[0]);
    gt_tensor_free(&o0[1]);
    gt_tensor_free(&o1[0]);
    gt_tensor_free(&o1[1]);
    gt_tensor_free(&out1);
}

static void test_layout(tt_rng *r)
{
    const attn_case cases[] = {
        {2, 4, 2, 7, 7, 3, 5, true, 0.57735},      /* GQA, causal, d != dv */
        {2, 4, 2, 5, 9, 4, 2, false, 0.5},         /* GQA, s != t */
        {1, 4, 2, 130, 130, 8, 8, true, 0.35355},  /* two 128-row blocks */
        {1, 3, 1, 131, 140, 5, 3, false, 0.44721}, /* MQA, s != t, two blocks */
        {1, 2, 2, 1, 1, 2, 2, true, 0.7},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        run_layout_case(&cases[c], GT_F32, r);
        run_layout_case(&cases[c], GT_BF16, r);
    }

    /* layout 2 does not exist: an error naming it, not a guess */
    attn_case a = {1, 1, 1, 2, 2, 2, 2, false, 1.0};
    gt_tensor q = tt_rand(4, TT_SHAPE(1, 1, 2, 2), r, -1, 1);
    gt_tensor out = tt_new(GT_F32, 4, TT_SHAPE(1, 1, 2, 2)),
              lse = tt_new(GT_F32, 3, TT_SHAPE(1, 1, 2));
    tt_call k;
    tt_init(&k, GT_OP_SDPA);
    tt_in(&k, &q);
    tt_in(&k, &q);
    tt_in(&k, &q);
    tt_out(&k, &out);
    tt_out(&k, &lse);
    tt_i(&k, a.causal);
    tt_i(&k, 2);
    tt_f(&k, a.scale);
    gt_error err = {0};
    EXPECT(tt_run(&k, &err) == GT_ERR_INVALID && strstr(err.msg, "layout"),
           "layout 2 must fail naming the layout: %s", err.msg);
    gt_tensor_free(&q);
    gt_tensor_free(&out);
    gt_tensor_free(&lse);
}

int main(void)
{
    tt_rng r = {13};
    test_layout(&r);
    const attn_case cases[] = {
        {1, 1, 1, 1, 1, 3, 3, true, 0.57735},  {2, 4, 2, 7, 7, 3, 5, true, 0.57735},
        {1, 3, 1, 5, 19, 4, 2, false, 0.5},    {2, 2, 2, 19, 19, 7, 7, true, 0.37796},
        {1, 6, 3, 3, 3, 1, 1, false, 1.3},     {1, 2, 1, 130, 130, 3, 2, true, 0.7},
        {1, 2, 2, 131, 140, 3, 3, false, 0.6},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        run_case(&cases[c], &r, true);

    /* causal attention with fewer queries than keys is not supported: an error, not a guess */
    attn_case bad = {1, 1, 1, 3, 5, 2, 2, true, 1.0};
    gt_tensor q = tt_rand(4, TT_SHAPE(1, 1, 3, 2), &r, -1, 1),
              k = tt_rand(4, TT_SHAPE(1, 1, 5, 2), &r, -1, 1);
    gt_tensor v = tt_rand(4, TT_SHAPE(1, 1, 5, 2), &r, -1, 1);
    gt_tensor out = tt_new(GT_F32, 4, TT_SHAPE(1, 1, 3, 2)),
              lse = tt_new(GT_F32, 3, TT_SHAPE(1, 1, 3));
    tt_call kf;
    tt_init(&kf, GT_OP_SDPA);
    tt_in(&kf, &q);
    tt_in(&kf, &k);
    tt_in(&kf, &v);
    tt_out(&kf, &out);
    tt_out(&kf, &lse);
    attn_attrs(&kf, &bad);
    gt_error err = {0};
    EXPECT(tt_run(&kf, &err) == GT_ERR_INVALID, "causal sdpa with s = 3, t = 5 must fail");
    EXPECT(strstr(err.msg, "s = 3") && strstr(err.msg, "t = 5"), "message names s and t: %s",
           err.msg);
    gt_tensor *ts[] = {&q, &k, &v, &out, &lse};
    for (size_t j = 0; j < 5; j++)
        gt_tensor_free(ts[j]);
    return gt_test_finish();
}
