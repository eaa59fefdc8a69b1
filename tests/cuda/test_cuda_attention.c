/* test_cuda_attention.c — the bf16 tensor-core flash attention (cuda_flash_*.cu) against
 * independent references.
 *
 * For each case (causal or not, GQA, head dims 16/32/64/128, odd lengths, and the debugmodel and
 * 1B shapes at seq 2048) with random bf16 q, k, v, dout:
 *   - the flash forward (bf16) against the tiled fp32 kernels run on the same values widened to f32
 *     (a different algorithm: scalar f32 dot products, no bf16 rounding of P): out within
 *     max |diff| / max |ref| <= 1e-2 (two bf16 ulps at the top of the range: out is rounded to
 *     bf16 and P to bf16 before P V) and rms(diff) / rms(ref) <= 5e-3; lse (f32 on both sides,
 *     exact bf16 products, only the summation order differs) within 1e-4 relative;
 *   - the flash backward against the fp32 kernels fed the same (q, k, v, out, lse, dout): dq, dk,
 * dv within max-rel 2e-2 and rms-rel 1e-2 (P and dS are rounded to bf16 before their second
 *     product, and the gradients to bf16 at the end);
 *   - small cases also against the CPU kernels on the same bf16 tensors (the CPU's bf16 path is the
 *     reference of the GPU's), with the conformance bounds 1e-2 (out) and 2e-2 (gradients);
 *   - determinism and coverage: every GPU output is pre-filled with a different byte pattern for
 *     each of two runs, and the two runs must agree bitwise.
 * Layout 1 ([b, s, heads, d]): forward and backward on q, k, v, out, dout transposed on the host
 * to [b, s, heads, d] must give bitwise the host-transposed layout-0 results (lse bitwise the
 * same): the flash path (bf16, d = 16, 64, 128, causal, ragged s = 1000, GQA, s != t) and the
 * generic kernels (f32, and bf16 with an odd head dim, d != dv), each run twice with different
 * output pre-fills (every element written).
 * Built with cuDNN, the bf16 forwards of head dims 64 to 256 with as many keys as queries run on
 * cuDNN's fused attention: the cases above test that path, and test_cudnn compares it with
 * graphtrain's kernel on the same inputs (MLA's d 192, dv 128 included).
 * Without a CUDA device the test skips (exit 0). */
#include "cuda_test_util.h"
#include "graphtrain/gt_cuda.h"
#include "gt_test.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define SH(...) ((const int64_t[]){__VA_ARGS__})

static uint64_t rng_state = 0x5eed0f1a5ba77e57ull;
static gt_cuda_stream *g_stream;

/* bf16, uniform in [lo, hi) from this test's stream. */
static gt_tensor t_rand(int ndim, const int64_t *shape, double lo, double hi)
{
    return cu_tensor_rand(&rng_state, GT_BF16, ndim, shape, lo, hi);
}

/* Same values in dtype dt (bf16 -> f32 is exact). */
static gt_tensor t_as(const gt_tensor *x, gt_dtype dt)
{
    gt_tensor t = cu_tensor_new(dt, x->ndim, x->shape);
    for (int64_t k = 0; k < gt_tensor_numel(x); k++)
        gt_tensor_set_f32(&t, k, gt_tensor_get_f32(x, k));
    return t;
}

typedef struct {
    double max_rel, rms_rel;
} gt_diff;

/* max |a - r| / max |r| and rms(a - r) / rms(r); any non-finite value gives inf. */
static gt_diff diff_of(const gt_tensor *a, const gt_tensor *r)
{
    double num = 0.0, den = 0.0, s2 = 0.0, r2 = 0.0;
    for (int64_t k = 0; k < gt_tensor_numel(r); k++) {
        double x = gt_tensor_get_f32(a, k), y = gt_tensor_get_f32(r, k);
        if (!isfinite(x) || !isfinite(y)) return (gt_diff){INFINITY, INFINITY};
        num = fmax(num, fabs(x - y));
        den = fmax(den, fabs(y));
        s2 += (x - y) * (x - y);
        r2 += y * y;
    }
    return (gt_diff){den > 0 ? num / den : num, r2 > 0 ? sqrt(s2 / r2) : sqrt(s2)};
}

static gt_kernel_call att_call(gt_op op, const int64_t *iattr, const double *fattr, gt_tensor **in,
                               int n_in, gt_tensor **out, int n_out)
{
    gt_kernel_call c;
    memset(&c, 0, sizeof c);
    c.op = op;
    c.i = iattr;
    c.f = fattr;
    c.ni = 2; /* causal, layout */
    c.nf = 1;
    c.n_in = n_in;
    c.n_out = n_out;
    for (int k = 0; k < n_in; k++)
        c.in[k] = in[k];
    for (int k = 0; k < n_out; k++)
        c.out[k] = out[k];
    return c;
}

/* Runs op on the GPU with host inputs `in`; host outputs `out` (allocated, dtypes chosen by the
 * caller) receive the result. reps = 2 runs twice (outputs pre-filled with 0xff, then 0x5a) and
 * returns whether both runs gave the same bits. */
static bool gpu_run(gt_op op, const int64_t *ia, const double *fa, gt_tensor *in, int n_in,
                    gt_tensor *out, int n_out, int reps, const char *name)
{
    gt_error err = {0};
    gt_tensor din[6], dout[3], first[3];
    gt_tensor *pin[6], *pout[3];
    for (int k = 0; k < n_in; k++) {
        GT_CHECK(gt_cuda_tensor_upload(g_stream, &in[k], &din[k], &err) == GT_OK);
        pin[k] = &din[k];
    }
    for (int k = 0; k < n_out; k++) {
        GT_CHECK(gt_cuda_tensor_alloc(&dout[k], out[k].dtype, out[k].ndim, out[k].shape, &err) ==
                 GT_OK);
        first[k] = cu_tensor_new(out[k].dtype, out[k].ndim, out[k].shape);
        pout[k] = &dout[k];
    }
    gt_kernel_call c = att_call(op, ia, fa, pin, n_in, pout, n_out);
    bool same = true;
    for (int rep = 0; rep < reps; rep++) {
        for (int k = 0; k < n_out; k++) {
            size_t nb = gt_tensor_nbytes(&out[k]);
            memset(out[k].data, rep == 0 ? 0xff : 0x5a, nb);
            GT_CHECK(gt_cuda_memcpy_h2d(g_stream, dout[k].data, out[k].data, nb, &err) == GT_OK);
        }
        gt_status st = gt_cuda_run_kernel(&c, g_stream, &err);
        if (st == GT_OK) st = gt_cuda_stream_sync(g_stream, &err);
        EXPECT(st == GT_OK, "%s: CUDA kernel failed: %s", name, err.msg);
        for (int k = 0; k < n_out; k++) {
            GT_CHECK(gt_cuda_tensor_download(g_stream, &dout[k], &out[k], &err) == GT_OK);
            if (rep == 0)
                memcpy(first[k].data, out[k].data, gt_tensor_nbytes(&out[k]));
            else if (memcmp(first[k].data, out[k].data, gt_tensor_nbytes(&out[k])) != 0) {
                if (same) printf("  %s: run %d differs from run 0 in output %d\n", name, rep, k);
                same = false;
            }
        }
    }
    for (int k = 0; k < n_in; k++)
        gt_cuda_tensor_free(&din[k]);
    for (int k = 0; k < n_out; k++) {
        gt_cuda_tensor_free(&dout[k]);
        gt_tensor_free(&first[k]);
    }
    return same;
}

typedef struct {
    const char *name;
    int causal;
    int64_t b, hq, hkv, s, t, d;
    bool cpu; /* small enough for the CPU reference */
} acase;

static void expect_close(const char *name, const char *what, const gt_tensor *x,
                         const gt_tensor *ref, double max_bound, double rms_bound)
{
    gt_diff e = diff_of(x, ref);
    printf("  %-16s %-10s max-rel %.2e rms-rel %.2e (bounds %.0e, %.0e)\n", name, what, e.max_rel,
           e.rms_rel, max_bound, rms_bound);
    EXPECT(e.max_rel <= max_bound && e.rms_rel <= rms_bound,
           "%s: %s max-rel %.3e (bound %.0e), rms-rel %.3e (bound %.0e)", name, what, e.max_rel,
           max_bound, e.rms_rel, rms_bound);
}

static void run_case(const acase *a)
{
    int64_t ia[2] = {a->causal, 0};
    double fa[1] = {1.0 / sqrt((double)a->d)};
    const int64_t *qs = SH(a->b, a->hq, a->s, a->d), *ks = SH(a->b, a->hkv, a->t, a->d);
    const int64_t *ls = SH(a->b, a->hq, a->s);
    gt_tensor in[6], in32[6];
    in[0] = t_rand(4, qs, -2, 2);
    in[1] = t_rand(4, ks, -2, 2);
    in[2] = t_rand(4, ks, -1, 1);
    for (int k = 0; k < 3; k++)
        in32[k] = t_as(&in[k], GT_F32);

    /* forward: flash (bf16) twice, fp32 reference */
    gt_tensor fo[2] = {cu_tensor_new(GT_BF16, 4, qs), cu_tensor_new(GT_F32, 3, ls)};
    gt_tensor ro[2] = {cu_tensor_new(GT_F32, 4, qs), cu_tensor_new(GT_F32, 3, ls)};
    bool same = gpu_run(GT_OP_SDPA, ia, fa, in, 3, fo, 2, 2, a->name);
    EXPECT(same, "%s: two flash forward runs differ (or an element is not written)", a->name);
    gpu_run(GT_OP_SDPA, ia, fa, in32, 3, ro, 2, 1, a->name);
    expect_close(a->name, "out", &fo[0], &ro[0], 1e-2, 5e-3);
    expect_close(a->name, "lse", &fo[1], &ro[1], 1e-4, 1e-4);

    /* backward on (q, k, v, flash out, flash lse, dout) */
    in[3] = fo[0];
    in[4] = fo[1];
    in[5] = t_rand(4, qs, -1, 1);
    for (int k = 3; k < 6; k++)
        in32[k] = t_as(&in[k], GT_F32);
    gt_tensor fg[3] = {cu_tensor_new(GT_BF16, 4, qs), cu_tensor_new(GT_BF16, 4, ks),
                       cu_tensor_new(GT_BF16, 4, ks)};
    gt_tensor rg[3] = {cu_tensor_new(GT_F32, 4, qs), cu_tensor_new(GT_F32, 4, ks),
                       cu_tensor_new(GT_F32, 4, ks)};
    same = gpu_run(GT_OP_SDPA_BACKWARD, ia, fa, in, 6, fg, 3, 2, a->name);
    EXPECT(same, "%s: two flash backward runs differ (or an element is not written)", a->name);
    gpu_run(GT_OP_SDPA_BACKWARD, ia, fa, in32, 6, rg, 3, 1, a->name);
    const char *gn[3] = {"dq", "dk", "dv"};
    for (int k = 0; k < 3; k++)
        expect_close(a->name, gn[k], &fg[k], &rg[k], 2e-2, 1e-2);
    printf("  %-16s flash runs bitwise identical: %s\n", a->name, same ? "yes" : "NO");

    if (a->cpu) { /* the CPU kernels on the same bf16 tensors */
        gt_error err = {0};
        gt_tensor co[2] = {cu_tensor_new(GT_BF16, 4, qs), cu_tensor_new(GT_F32, 3, ls)};
        gt_tensor *pi[6] = {&in[0], &in[1], &in[2], &in[3], &in[4], &in[5]};
        gt_tensor *po[2] = {&co[0], &co[1]};
        gt_kernel_call c = att_call(GT_OP_SDPA, ia, fa, pi, 3, po, 2);
        EXPECT_OK(gt_cpu_run_kernel(&c, &err), &err);
        expect_close(a->name, "out vs cpu", &fo[0], &co[0], 1e-2, 5e-3);
        expect_close(a->name, "lse vs cpu", &fo[1], &co[1], 1e-4, 1e-4);
        gt_tensor cg[3] = {cu_tensor_new(GT_BF16, 4, qs), cu_tensor_new(GT_BF16, 4, ks),
                           cu_tensor_new(GT_BF16, 4, ks)};
        gt_tensor *pg[3] = {&cg[0], &cg[1], &cg[2]};
        c = att_call(GT_OP_SDPA_BACKWARD, ia, fa, pi, 6, pg, 3);
        EXPECT_OK(gt_cpu_run_kernel(&c, &err), &err);
        const char *cn[3] = {"dq vs cpu", "dk vs cpu", "dv vs cpu"};
        for (int k = 0; k < 3; k++) {
            expect_close(a->name, cn[k], &fg[k], &cg[k], 2e-2, 1e-2);
            gt_tensor_free(&cg[k]);
        }
        gt_tensor_free(&co[0]);
        gt_tensor_free(&co[1]);
    }
    for (int k = 0; k < 6; k++) {
        gt_tensor_free(&in[k]);
        gt_tensor_free(&in32[k]);
    }
    for (int k = 0; k < 3; k++) {
        gt_tensor_free(&fg[k]);
        gt_tensor_free(&rg[k]);
    }
    gt_tensor_free(&ro[0]);
    gt_tensor_free(&ro[1]);
}

/* ---------------------------------------------------------------- layout 1 */

/* x [b, n1, n2, w] -> [b, n2, n1, w] on the host: the CPU permute kernel (bits moved unchanged). */
static gt_tensor swap12(const gt_tensor *x)
{
    static const int64_t perm[4] = {0, 2, 1, 3};
    gt_tensor y =
        cu_tensor_new(x->dtype, 4, SH(x->shape[0], x->shape[2], x->shape[1], x->shape[3]));
    gt_kernel_call k = cu_kernel_call(GT_OP_PERMUTE, perm, 4, NULL, 0, NULL, 0, x, 1, &y, 1);
    gt_error err = {0};
    EXPECT_OK(gt_cpu_run_kernel(&k, &err), &err);
    return y;
}

typedef struct {
    const char *name;
    gt_dtype dt;
    int causal;
    int64_t b, hq, hkv, s, t, d, dv;
} lcase;

/* Layout 1 on host-transposed tensors vs layout 0, forward and backward, bit for bit. */
static void run_layout_case(const lcase *a)
{
    int64_t i0[2] = {a->causal, 0}, i1[2] = {a->causal, 1};
    double fa[1] = {1.0 / sqrt((double)a->d)};
    const int64_t *qs = SH(a->b, a->hq, a->s, a->d), *ks = SH(a->b, a->hkv, a->t, a->d);
    const int64_t *vs = SH(a->b, a->hkv, a->t, a->dv), *os = SH(a->b, a->hq, a->s, a->dv);
    const int64_t *ls = SH(a->b, a->hq, a->s);
    gt_tensor x0[6], x1[6]; /* q k v out lse dout, layout 0 and layout 1 */
    x0[0] = cu_tensor_rand(&rng_state, a->dt, 4, qs, -2, 2);
    x0[1] = cu_tensor_rand(&rng_state, a->dt, 4, ks, -2, 2);
    x0[2] = cu_tensor_rand(&rng_state, a->dt, 4, vs, -1, 1);
    x0[5] = cu_tensor_rand(&rng_state, a->dt, 4, os, -1, 1);
    for (int k = 0; k < 3; k++)
        x1[k] = swap12(&x0[k]);
    x1[5] = swap12(&x0[5]);

    /* forward: both layouts twice (different pre-fills), outputs compared after moving back */
    gt_tensor f0[2] = {cu_tensor_new(a->dt, 4, os), cu_tensor_new(GT_F32, 3, ls)};
    gt_tensor f1[2] = {cu_tensor_new(a->dt, 4, SH(a->b, a->s, a->hq, a->dv)),
                       cu_tensor_new(GT_F32, 3, ls)};
    bool same0 = gpu_run(GT_OP_SDPA, i0, fa, x0, 3, f0, 2, 2, a->name);
    bool same1 = gpu_run(GT_OP_SDPA, i1, fa, x1, 3, f1, 2, 2, a->name);
    EXPECT(same0 && same1, "%s: forward runs differ (or an element is not written)", a->name);
    gt_tensor back = swap12(&f1[0]);
    bool fwd_out = same_bits(&back, &f0[0]), fwd_lse = same_bits(&f1[1], &f0[1]);
    EXPECT(fwd_out, "%s: layout 1 out != layout 0 out", a->name);
    EXPECT(fwd_lse, "%s: layout 1 lse != layout 0 lse", a->name);
    gt_tensor_free(&back);

    /* backward on the layout-0 forward's out and lse */
    x0[3] = f0[0];
    x0[4] = f0[1];
    x1[3] = swap12(&f0[0]);
    x1[4] = f0[1];
    gt_tensor g0[3] = {cu_tensor_new(a->dt, 4, qs), cu_tensor_new(a->dt, 4, ks),
                       cu_tensor_new(a->dt, 4, vs)};
    gt_tensor g1[3] = {cu_tensor_new(a->dt, 4, x1[0].shape), cu_tensor_new(a->dt, 4, x1[1].shape),
                       cu_tensor_new(a->dt, 4, x1[2].shape)};
    same0 = gpu_run(GT_OP_SDPA_BACKWARD, i0, fa, x0, 6, g0, 3, 2, a->name);
    same1 = gpu_run(GT_OP_SDPA_BACKWARD, i1, fa, x1, 6, g1, 3, 2, a->name);
    EXPECT(same0 && same1, "%s: backward runs differ (or an element is not written)", a->name);
    const char *gn[3] = {"dq", "dk", "dv"};
    bool bwd = true;
    for (int k = 0; k < 3; k++) {
        back = swap12(&g1[k]);
        bool eq = same_bits(&back, &g0[k]);
        EXPECT(eq, "%s: layout 1 %s != layout 0 %s", a->name, gn[k], gn[k]);
        bwd = bwd && eq;
        gt_tensor_free(&back);
    }
    printf("  %-24s layout 1 == layout 0 bitwise: out %s, lse %s, dq/dk/dv %s\n", a->name,
           fwd_out ? "yes" : "NO", fwd_lse ? "yes" : "NO", bwd ? "yes" : "NO");
    for (int k = 0; k < 6; k++)
        gt_tensor_free(&x0[k]);
    for (int k = 0; k < 4; k++)
        gt_tensor_free(&x1[k]);
    gt_tensor_free(&x1[5]);
    gt_tensor_free(&f1[0]);
    gt_tensor_free(&f1[1]);
    for (int k = 0; k < 3; k++) {
        gt_tensor_free(&g0[k]);
        gt_tensor_free(&g1[k]);
    }
}

static void test_layout(void)
{
    const lcase cases[] = {
        /* name, dtype, causal, b, hq, hkv, s, t, d, dv */
        {"flash-d16-gqa-1000", GT_BF16, 1, 2, 4, 2, 1000, 1000, 16, 16},
        {"flash-d64-mqa-1000", GT_BF16, 1, 1, 4, 1, 1000, 1000, 64, 64},
        {"flash-d128-gqa-333", GT_BF16, 1, 1, 4, 2, 333, 333, 128, 128},
        {"flash-d32-cross", GT_BF16, 0, 2, 4, 2, 77, 150, 32, 32},
        {"generic-f32-d16-1000", GT_F32, 1, 1, 4, 2, 1000, 1000, 16, 16},
        {"generic-f32-cross", GT_F32, 0, 2, 4, 2, 45, 70, 24, 40},
        {"generic-bf16-d24", GT_BF16, 1, 1, 6, 3, 131, 131, 24, 24},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
        run_layout_case(&cases[k]);
}

/* ---------------------------------------------------------------- cuDNN */

/* Where graphtrain is built with cuDNN, bf16 forwards of head dim 64 and 128 run on cuDNN's fused
 * attention, forward and backward (the cases above test those paths against the fp32 kernels).
 * Here the same inputs run both ways, layout 1, causal, GQA and not, up to the 1B's and 8B's heads
 * at s 2048, and MLA's d 192 / dv 128 (whose other way is graphtrain's generic kernels): cuDNN's out and lse within the bounds above of graphtrain's flash kernel, three cuDNN
 * runs bitwise the same, and not bitwise graphtrain's (else the cuDNN path was not taken); cuDNN's
 * dq, dk, dv within the bounds of graphtrain's backward, five runs bitwise the same, and not
 * bitwise graphtrain's (a backward plan whose first call's two runs differ falls back to
 * graphtrain's kernels, which this catches). */
static void test_cudnn(void)
{
    if (!gt_cuda_have_cudnn()) {
        printf("cudnn: not built with cuDNN, skipped\n");
        return;
    }
    const int64_t cases[][6] = {/* d, b, hq, hkv, s, dv */
                                {64, 2, 8, 2, 1000, 64},
                                {128, 2, 8, 2, 1000, 128},
                                {64, 2, 4, 4, 1000, 64},
                                {64, 1, 32, 8, 2048, 64},
                                {128, 1, 32, 8, 2048, 128},
                                /* DeepSeek-V3's MLA: q and k 192 wide, v 128 */
                                {192, 2, 4, 4, 1000, 128},
                                {192, 1, 16, 16, 2048, 128}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        int64_t d = cases[k][0], b = cases[k][1], hq = cases[k][2], hkv = cases[k][3],
                s = cases[k][4], dv = cases[k][5];
        int64_t ia[2] = {1, 1};
        double fa[1] = {1.0 / sqrt((double)d)};
        const int64_t *qs = SH(b, s, hq, d), *ks = SH(b, s, hkv, d), *ls = SH(b, hq, s);
        const int64_t *vs = SH(b, s, hkv, dv), *os = SH(b, s, hq, dv);
        gt_tensor in[3] = {t_rand(4, qs, -2, 2), t_rand(4, ks, -2, 2), t_rand(4, vs, -1, 1)};
        gt_tensor on[2] = {cu_tensor_new(GT_BF16, 4, os), cu_tensor_new(GT_F32, 3, ls)};
        gt_tensor off[2] = {cu_tensor_new(GT_BF16, 4, os), cu_tensor_new(GT_F32, 3, ls)};
        char name[48];
        snprintf(name, sizeof name, "cudnn-d%lld/%lld-h%lld/%lld-s%lld", (long long)d,
                 (long long)dv, (long long)hq, (long long)hkv, (long long)s);
        bool same = gpu_run(GT_OP_SDPA, ia, fa, in, 3, on, 2, 3, name);
        EXPECT(same, "%s: two cuDNN forward runs differ (or an element is not written)", name);
        gt_cuda_stream_set_cudnn(g_stream, false);
        gpu_run(GT_OP_SDPA, ia, fa, in, 3, off, 2, 1, name);
        gt_cuda_stream_set_cudnn(g_stream, true);
        expect_close(name, "out", &on[0], &off[0], 1e-2, 5e-3);
        expect_close(name, "lse", &on[1], &off[1], 1e-4, 1e-4);
        bool bitwise = memcmp(on[0].data, off[0].data, gt_tensor_nbytes(&on[0])) == 0;
        printf("  %-24s cuDNN out bitwise graphtrain's: %s (expected no: another kernel)\n", name,
               bitwise ? "yes" : "no");
        EXPECT(!bitwise, "%s: cuDNN's forward gave graphtrain's bits: the cuDNN path did not run",
               name);

        /* backward on (q, k, v, graphtrain's out and lse, dout): cuDNN's against graphtrain's */
        gt_tensor bin[6] = {in[0], in[1], in[2], off[0], off[1], t_rand(4, os, -1, 1)};
        gt_tensor gon[3] = {cu_tensor_new(GT_BF16, 4, qs), cu_tensor_new(GT_BF16, 4, ks),
                            cu_tensor_new(GT_BF16, 4, vs)};
        gt_tensor goff[3] = {cu_tensor_new(GT_BF16, 4, qs), cu_tensor_new(GT_BF16, 4, ks),
                             cu_tensor_new(GT_BF16, 4, vs)};
        same = gpu_run(GT_OP_SDPA_BACKWARD, ia, fa, bin, 6, gon, 3, 5, name);
        EXPECT(same, "%s: two backward runs differ (or an element is not written)", name);
        gt_cuda_stream_set_cudnn(g_stream, false);
        gpu_run(GT_OP_SDPA_BACKWARD, ia, fa, bin, 6, goff, 3, 1, name);
        gt_cuda_stream_set_cudnn(g_stream, true);
        const char *gn[3] = {"dq", "dk", "dv"};
        int differ = 0;
        for (int j = 0; j < 3; j++) {
            expect_close(name, gn[j], &gon[j], &goff[j], 2e-2, 1e-2);
            differ += memcmp(gon[j].data, goff[j].data, gt_tensor_nbytes(&gon[j])) != 0;
            gt_tensor_free(&gon[j]);
            gt_tensor_free(&goff[j]);
        }
        printf("  %-24s backward bitwise graphtrain's: %s (expected no: cuDNN's)\n", name,
               differ ? "no" : "yes");
        EXPECT(differ,
               "%s: cuDNN's backward gave graphtrain's bits: the cuDNN path did not run "
               "(GT_CUDNN_VERBOSE=1 says why)",
               name);
        gt_tensor_free(&bin[5]);
        for (int j = 0; j < 3; j++)
            gt_tensor_free(&in[j]);
        for (int j = 0; j < 2; j++) {
            gt_tensor_free(&on[j]);
            gt_tensor_free(&off[j]);
        }
    }
}

int main(void)
{
    gt_cuda_device_info info;
    int rc = cu_test_start(&info, &g_stream);
    if (rc >= 0) return rc;
    printf("device: %s\n", info.name);
    const acase cases[] = {
        /* name, causal, b, hq, hkv, s, t, d, cpu */
        {"tiny-causal", 1, 1, 2, 1, 1, 1, 16, true},
        {"odd-causal-d32", 1, 2, 4, 2, 45, 45, 32, true},
        {"odd-cross-d64", 0, 1, 3, 1, 37, 70, 64, true},
        {"odd-causal-d16", 1, 1, 2, 2, 133, 133, 16, true},
        {"odd-cross-d128", 0, 1, 2, 1, 77, 150, 128, true},
        {"odd-causal-d128", 1, 1, 2, 1, 1037, 1037, 128, false},
        {"odd-causal-d64", 1, 1, 4, 1, 999, 999, 64, false},
        {"debugmodel-2048", 1, 2, 16, 16, 2048, 2048, 16, false},
        {"1B-2048", 1, 1, 32, 8, 2048, 2048, 64, false},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        printf("%s: causal %d b %lld hq %lld hkv %lld s %lld t %lld d %lld\n", cases[k].name,
               cases[k].causal, (long long)cases[k].b, (long long)cases[k].hq,
               (long long)cases[k].hkv, (long long)cases[k].s, (long long)cases[k].t,
               (long long)cases[k].d);
        run_case(&cases[k]);
    }
    test_layout();
    test_cudnn();
    gt_cuda_stream_destroy(g_stream);
    return gt_test_finish();
}
