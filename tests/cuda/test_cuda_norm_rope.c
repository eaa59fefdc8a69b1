/* test_cuda_norm_rope.c — the CUDA rms_norm, rms_norm_backward and rope paths vs the CPU kernels.
 *
 * cuda_norm_rope.cu picks a path from the shape and alignment: 8-wide (16-byte) row kernels for
 * rms_norm when D % 8 == 0 (forward D <= 8192, backward D <= 4096), generic kernels otherwise;
 * rope groups 8 pairs per thread when d/2 % 8 == 0, else 1. Each case here forces one path
 * (including misaligned device pointers, which must fall back) and checks against the CPU backend
 * (gt_cpu_run_kernel on the same host data):
 *   - every element: |gpu - cpu| <= tol * (|cpu| + 1e-3 * max|cpu|), tol 1e-5 for f32, 1e-2
 *     for bf16 (the floor covers dx entries that cancel; both sides sum in double);
 *   - determinism: two runs (outputs pre-filled with different patterns) give identical bits;
 *   - rope in place (out aliasing x) gives the same bits as out of place.
 * `--bench` prints (asserts nothing) the llama3-1B sizes: [16384, 2048] rms_norm / backward and
 * rope on [8, 2048, 32 | 8, 64], bf16, and rms_norm / backward on debugmodel rows of 256. Without a
 * CUDA device the test skips (exit 0). */
#include "cuda_test_util.h"
#include "graphtrain/gt_backend.h"
#include "graphtrain/gt_cuda.h"
#include "gt_test.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SH(...) ((const int64_t[]){__VA_ARGS__})

static gt_cuda_stream *g_stream;
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static float get(const gt_tensor *t, int64_t i)
{
    if (t->dtype == GT_BF16) return gt_bf16_to_f32(((const uint16_t *)t->data)[i]);
    return ((const float *)t->data)[i];
}

static gt_tensor t_new(gt_dtype dt, int ndim, const int64_t *shape)
{
    gt_tensor t;
    gt_error err = {0};
    GT_CHECK(gt_tensor_alloc(&t, dt, ndim, shape, &err) == GT_OK);
    memset(t.data, 0, gt_tensor_nbytes(&t));
    return t;
}

static gt_tensor t_rand(gt_dtype dt, int ndim, const int64_t *shape, double lo, double hi)
{
    gt_tensor t = t_new(dt, ndim, shape);
    int64_t n = gt_tensor_numel(&t);
    for (int64_t i = 0; i < n; i++) {
        float v = (float)cu_urand(&rng_state, lo, hi);
        if (dt == GT_BF16)
            ((uint16_t *)t.data)[i] = gt_f32_to_bf16(v);
        else
            ((float *)t.data)[i] = v;
    }
    return t;
}

/* A device copy of host tensor h, its data `shift` bytes past a 256-byte aligned allocation
 * (shift 0: aligned; shift = element size: breaks 16-byte alignment). *base is what to free. */
static bool dev_copy(const gt_tensor *h, size_t shift, gt_tensor *d, void **base)
{
    gt_error err = {0};
    size_t nb = gt_tensor_nbytes(h);
    if (gt_cuda_malloc(base, nb + 64, &err) != GT_OK) return false;
    *d = *h;
    d->data = (char *)*base + shift;
    d->owns_data = false;
    return gt_cuda_memcpy_h2d(g_stream, d->data, h->data, nb, &err) == GT_OK;
}

typedef struct {
    const char *name;
    gt_op op;
    int n_in, n_out;
    gt_tensor in[6], out[2];
    int64_t i[2];
    double f[4];
    int ni, nf;
    size_t shift;     /* misalignment of every device tensor, bytes */
    bool in_place;    /* rope: also run with out == x */
    double floor_rel; /* of the relative error, times max|ref| (0: 1e-3) */
} tcase;

static gt_kernel_call call_of(tcase *c, gt_tensor *in, gt_tensor *out)
{
    return cu_kernel_call(c->op, c->i, c->ni, c->f, c->nf, NULL, 0, in, c->n_in, out, c->n_out);
}

/* Worst |gpu - ref| / (|ref| + floor_rel max|ref|) over the elements. */
static double rel_err(const gt_tensor *g, const gt_tensor *r, double floor_rel)
{
    int64_t n = gt_tensor_numel(r);
    double mx = 0.0, worst = 0.0;
    for (int64_t i = 0; i < n; i++)
        mx = fmax(mx, fabs(get(r, i)));
    for (int64_t i = 0; i < n; i++) {
        double a = get(g, i), b = get(r, i);
        double e = fabs(a - b) / (fabs(b) + floor_rel * mx + 1e-30);
        if (!(e <= worst)) worst = isnan(e) ? INFINITY : e;
    }
    return worst;
}

static void check(tcase *c)
{
    gt_error err = {0};
    double tol = c->in[0].dtype == GT_F32 ? 1e-5 : 1e-2;
    gt_kernel_call cpu = call_of(c, c->in, c->out);
    gt_status st = gt_cpu_run_kernel(&cpu, &err);
    EXPECT(st == GT_OK, "%s: CPU reference failed: %s", c->name, err.msg);
    gt_tensor din[6], dout[2], got[2][2];
    void *bin[6] = {0}, *bout[2] = {0};
    memset(got, 0, sizeof got);
    bool ok = st == GT_OK;
    for (int k = 0; k < c->n_in && ok; k++)
        ok = dev_copy(&c->in[k], c->shift, &din[k], &bin[k]);
    for (int k = 0; k < c->n_out && ok; k++) {
        ok = dev_copy(&c->out[k], c->shift, &dout[k], &bout[k]);
        got[0][k] = t_new(c->out[k].dtype, c->out[k].ndim, c->out[k].shape);
        got[1][k] = t_new(c->out[k].dtype, c->out[k].ndim, c->out[k].shape);
    }
    gt_kernel_call gpu = call_of(c, din, dout);
    for (int rep = 0; rep < 2 && ok; rep++) {
        for (int k = 0; k < c->n_out && ok; k++) {
            size_t nb = gt_tensor_nbytes(&dout[k]);
            unsigned char *pat = malloc(nb + 1);
            GT_CHECK(pat != NULL);
            memset(pat, rep == 0 ? 0xff : 0x5a, nb);
            ok = gt_cuda_memcpy_h2d(g_stream, dout[k].data, pat, nb, &err) == GT_OK &&
                 gt_cuda_stream_sync(g_stream, &err) == GT_OK;
            free(pat);
        }
        ok = ok && gt_cuda_run_kernel(&gpu, g_stream, &err) == GT_OK;
        for (int k = 0; k < c->n_out && ok; k++)
            ok = gt_cuda_memcpy_d2h(g_stream, got[rep][k].data, dout[k].data,
                                    gt_tensor_nbytes(&dout[k]), &err) == GT_OK;
        ok = ok && gt_cuda_stream_sync(g_stream, &err) == GT_OK;
        EXPECT(ok, "%s: CUDA run failed: %s", c->name, err.msg);
    }
    if (ok) {
        printf("%-40s", c->name);
        for (int k = 0; k < c->n_out; k++) {
            double e = rel_err(&got[0][k], &c->out[k], c->floor_rel > 0 ? c->floor_rel : 1e-3);
            printf(" out%d %.2e", k, e);
            EXPECT(e <= tol, "%s: output %d worst rel err %.3e above %.0e", c->name, k, e, tol);
            EXPECT(memcmp(got[0][k].data, got[1][k].data, gt_tensor_nbytes(&got[0][k])) == 0,
                   "%s: output %d differs between two runs", c->name, k);
        }
        printf("\n");
    }
    if (ok && c->in_place) {
        /* rope with out == x: the device input gets overwritten by the rotation. */
        gt_kernel_call ip = call_of(c, din, din);
        ok = gt_cuda_run_kernel(&ip, g_stream, &err) == GT_OK &&
             gt_cuda_memcpy_d2h(g_stream, got[1][0].data, din[0].data, gt_tensor_nbytes(&din[0]),
                                &err) == GT_OK &&
             gt_cuda_stream_sync(g_stream, &err) == GT_OK;
        EXPECT(ok, "%s: in-place CUDA run failed: %s", c->name, err.msg);
        EXPECT(ok && memcmp(got[0][0].data, got[1][0].data, gt_tensor_nbytes(&got[0][0])) == 0,
               "%s: in-place result differs from out-of-place", c->name);
    }
    for (int k = 0; k < c->n_in; k++) {
        gt_cuda_free(bin[k]);
        gt_tensor_free(&c->in[k]);
    }
    for (int k = 0; k < c->n_out; k++) {
        gt_cuda_free(bout[k]);
        gt_tensor_free(&c->out[k]);
        if (got[0][k].data) gt_tensor_free(&got[0][k]);
        if (got[1][k].data) gt_tensor_free(&got[1][k]);
    }
}

static void case_rms(gt_dtype ft, int64_t rows, int64_t d, size_t shift, const char *name)
{
    char nm[96];
    snprintf(nm, sizeof nm, "rms_norm %s [%lld,%lld]%s %s", gt_dtype_name(ft), (long long)rows,
             (long long)d, shift ? " misaligned" : "", name);
    tcase n = {.name = nm, .op = GT_OP_RMS_NORM, .n_in = 2, .n_out = 1, .nf = 1, .shift = shift};
    n.f[0] = 1e-5;
    n.in[0] = t_rand(ft, 2, SH(rows, d), -2, 2);
    n.in[1] = t_rand(ft, 1, SH(d), 0.5, 1.5);
    n.out[0] = t_new(ft, 2, SH(rows, d));
    check(&n);
    char nb[96];
    snprintf(nb, sizeof nb, "rms_norm_backward %s [%lld,%lld]%s %s", gt_dtype_name(ft),
             (long long)rows, (long long)d, shift ? " misaligned" : "", name);
    tcase b = {
        .name = nb, .op = GT_OP_RMS_NORM_BACKWARD, .n_in = 3, .n_out = 2, .nf = 1, .shift = shift};
    b.f[0] = 1e-5;
    b.in[0] = t_rand(ft, 2, SH(rows, d), -2, 2);
    b.in[1] = t_rand(ft, 1, SH(d), 0.5, 1.5);
    b.in[2] = t_rand(ft, 2, SH(rows, d), -1, 1);
    b.out[0] = t_new(ft, 2, SH(rows, d));
    b.out[1] = t_new(ft, 1, SH(d));
    check(&b);
}

/* add_rms_norm (a, b, w) -> (h, y): against the CPU (check), and bitwise against the GPU's own add
 * then rms_norm on the same device inputs (the one-pass kernel on the fast path's shapes, the
 * two kernels otherwise). */
static void case_add_rms(gt_dtype ft, int64_t rows, int64_t d, size_t shift, const char *name)
{
    char nm[96];
    snprintf(nm, sizeof nm, "add_rms_norm %s [%lld,%lld]%s %s", gt_dtype_name(ft), (long long)rows,
             (long long)d, shift ? " misaligned" : "", name);
    tcase c = {
        .name = nm, .op = GT_OP_ADD_RMS_NORM, .n_in = 3, .n_out = 2, .nf = 1, .shift = shift};
    c.f[0] = 1e-5;
    c.in[0] = t_rand(ft, 2, SH(rows, d), -2, 2);
    c.in[1] = t_rand(ft, 2, SH(rows, d), -2, 2);
    c.in[2] = t_rand(ft, 1, SH(d), 0.5, 1.5);
    c.out[0] = t_new(ft, 2, SH(rows, d));
    c.out[1] = t_new(ft, 2, SH(rows, d));
    gt_error err = {0};
    gt_tensor din[3], dout[4], got[4];
    void *bin[3] = {0}, *bout[4] = {0};
    bool ok = true;
    for (int k = 0; k < 3 && ok; k++)
        ok = dev_copy(&c.in[k], shift, &din[k], &bin[k]);
    for (int k = 0; k < 4 && ok; k++) {
        got[k] = t_new(ft, 2, SH(rows, d));
        ok = dev_copy(&got[k], shift, &dout[k], &bout[k]);
    }
    gt_kernel_call fused =
        cu_kernel_call(GT_OP_ADD_RMS_NORM, NULL, 0, c.f, 1, NULL, 0, din, 3, dout, 2);
    gt_tensor add_in[2] = {din[0], din[1]}, norm_in[2] = {dout[2], din[2]};
    gt_kernel_call add =
        cu_kernel_call(GT_OP_ADD, NULL, 0, NULL, 0, NULL, 0, add_in, 2, &dout[2], 1);
    gt_kernel_call norm =
        cu_kernel_call(GT_OP_RMS_NORM, NULL, 0, c.f, 1, NULL, 0, norm_in, 2, &dout[3], 1);
    ok = ok && gt_cuda_run_kernel(&fused, g_stream, &err) == GT_OK &&
         gt_cuda_run_kernel(&add, g_stream, &err) == GT_OK &&
         gt_cuda_run_kernel(&norm, g_stream, &err) == GT_OK;
    for (int k = 0; k < 4 && ok; k++)
        ok = gt_cuda_memcpy_d2h(g_stream, got[k].data, dout[k].data, gt_tensor_nbytes(&got[k]),
                                &err) == GT_OK;
    ok = ok && gt_cuda_stream_sync(g_stream, &err) == GT_OK;
    EXPECT(ok, "%s: CUDA runs failed: %s", nm, err.msg);
    size_t nb = gt_tensor_nbytes(&got[0]);
    EXPECT(ok && !memcmp(got[0].data, got[2].data, nb) && !memcmp(got[1].data, got[3].data, nb),
           "%s: h or y differs from add then rms_norm on the GPU", nm);
    for (int k = 0; k < 4; k++) {
        gt_cuda_free(bout[k]);
        gt_tensor_free(&got[k]);
    }
    for (int k = 0; k < 3; k++)
        gt_cuda_free(bin[k]);
    check(&c);
}

/* rms_norm_backward_add (x, w, r, d0..d[nd-1]) -> (dx, dw): against the CPU (check), and bitwise
 * against the GPU's own unfused ops on the same device inputs: the add chain ((d0 + d1) + d2),
 * rms_norm_backward of it, then r + its dx (the one-pass kernel on the fast path's shapes, the
 * generic kernels otherwise). */
static void case_norm_bwd_add(gt_dtype ft, int64_t rows, int64_t d, int nd, size_t shift,
                              const char *name)
{
    char nm[112];
    snprintf(nm, sizeof nm, "rms_norm_backward_add %s [%lld,%lld] %d terms%s %s", gt_dtype_name(ft),
             (long long)rows, (long long)d, nd, shift ? " misaligned" : "", name);
    tcase c = {.name = nm,
               .op = GT_OP_RMS_NORM_BACKWARD_ADD,
               .n_in = 3 + nd,
               .n_out = 2,
               .nf = 1,
               .shift = shift,
               /* dx = r + g cancels where r ~ -g: the norm's dx carries the GPU/CPU rounding
                * difference (double vs float math in bf16, 1 ulp of g) into a small sum, so dx
                * is bounded relative to its largest element */
               .floor_rel = 1.0};
    c.f[0] = 1e-5;
    c.in[0] = t_rand(ft, 2, SH(rows, d), -2, 2);
    c.in[1] = t_rand(ft, 1, SH(d), 0.5, 1.5);
    c.in[2] = t_rand(ft, 2, SH(rows, d), -1, 1);
    for (int e = 0; e < nd; e++)
        c.in[3 + e] = t_rand(ft, 2, SH(rows, d), -1, 1);
    c.out[0] = t_new(ft, 2, SH(rows, d));
    c.out[1] = t_new(ft, 1, SH(d));
    gt_error err = {0};
    /* device outputs: 0 dx, 1 dw (fused); 2 dx, 3 dw, 4 dy, 5 g (unfused) */
    gt_tensor din[6], dout[6], got[4];
    void *bin[6] = {0}, *bout[6] = {0};
    bool ok = true;
    for (int k = 0; k < c.n_in && ok; k++)
        ok = dev_copy(&c.in[k], shift, &din[k], &bin[k]);
    for (int k = 0; k < 6 && ok; k++) {
        gt_tensor h = k == 1 || k == 3 ? t_new(ft, 1, SH(d)) : t_new(ft, 2, SH(rows, d));
        ok = dev_copy(&h, shift, &dout[k], &bout[k]);
        if (k < 4)
            got[k] = h;
        else
            gt_tensor_free(&h);
    }
    gt_kernel_call fused =
        cu_kernel_call(GT_OP_RMS_NORM_BACKWARD_ADD, NULL, 0, c.f, 1, NULL, 0, din, c.n_in, dout, 2);
    ok = ok && gt_cuda_run_kernel(&fused, g_stream, &err) == GT_OK;
    gt_tensor dy = din[3];
    for (int e = 1; e < nd && ok; e++) {
        gt_tensor add_in[2] = {dy, din[3 + e]};
        gt_kernel_call add =
            cu_kernel_call(GT_OP_ADD, NULL, 0, NULL, 0, NULL, 0, add_in, 2, &dout[4], 1);
        ok = gt_cuda_run_kernel(&add, g_stream, &err) == GT_OK;
        dy = dout[4];
    }
    gt_tensor bwd_in[3] = {din[0], din[1], dy}, bwd_out[2] = {dout[5], dout[3]};
    gt_kernel_call bwd =
        cu_kernel_call(GT_OP_RMS_NORM_BACKWARD, NULL, 0, c.f, 1, NULL, 0, bwd_in, 3, bwd_out, 2);
    gt_tensor res_in[2] = {din[2], dout[5]};
    gt_kernel_call res =
        cu_kernel_call(GT_OP_ADD, NULL, 0, NULL, 0, NULL, 0, res_in, 2, &dout[2], 1);
    ok = ok && gt_cuda_run_kernel(&bwd, g_stream, &err) == GT_OK &&
         gt_cuda_run_kernel(&res, g_stream, &err) == GT_OK;
    for (int k = 0; k < 4 && ok; k++)
        ok = gt_cuda_memcpy_d2h(g_stream, got[k].data, dout[k].data, gt_tensor_nbytes(&got[k]),
                                &err) == GT_OK;
    ok = ok && gt_cuda_stream_sync(g_stream, &err) == GT_OK;
    EXPECT(ok, "%s: CUDA runs failed: %s", nm, err.msg);
    EXPECT(ok && !memcmp(got[0].data, got[2].data, gt_tensor_nbytes(&got[0])) &&
               !memcmp(got[1].data, got[3].data, gt_tensor_nbytes(&got[1])),
           "%s: dx or dw differs from the unfused adds and rms_norm_backward on the GPU", nm);
    for (int k = 0; k < 6; k++)
        gt_cuda_free(bout[k]);
    for (int k = 0; k < 4; k++)
        gt_tensor_free(&got[k]);
    for (int k = 0; k < c.n_in; k++)
        gt_cuda_free(bin[k]);
    check(&c);
}

static void case_rope(gt_dtype ft, const int64_t *shape, size_t shift, const char *name)
{
    const char *vn[3] = {"plain", "llama3.1 scaling", "inverse"};
    for (int v = 0; v < 3; v++) {
        char nm[128];
        snprintf(nm, sizeof nm, "rope %s [%lld,%lld,%lld,%lld]%s %s, %s", gt_dtype_name(ft),
                 (long long)shape[0], (long long)shape[1], (long long)shape[2], (long long)shape[3],
                 shift ? " misaligned" : "", name, vn[v]);
        tcase r = {.name = nm,
                   .op = GT_OP_ROPE,
                   .n_in = 1,
                   .n_out = 1,
                   .ni = 2,
                   .nf = 4,
                   .shift = shift,
                   .in_place = true};
        r.f[0] = 500000.0;
        r.f[1] = 8.0;
        r.f[2] = 1.0;
        r.f[3] = 4.0;
        r.i[0] = v == 2;
        r.i[1] = v == 1 ? 64 : 0;
        r.in[0] = t_rand(ft, 4, shape, -1, 1);
        r.out[0] = t_new(ft, 4, shape);
        check(&r);
    }
}

static void cases(void)
{
    const gt_dtype fts[2] = {GT_F32, GT_BF16};
    for (int k = 0; k < 2; k++) {
        gt_dtype ft = fts[k];
        size_t el = ft == GT_F32 ? 4 : 2;
        case_rms(ft, 96, 2048, 0, "(8-wide)");
        case_rms(ft, 37, 64, 0, "(8-wide, short rows)");
        case_rms(ft, 3000, 40, 0, "(8-wide, 1000 dw chunks)");
        case_rms(ft, 9, 8192, 0, "(fwd 8-wide, bwd generic)");
        case_rms(ft, 5, 12288, 0, "(generic, long rows)");
        case_rms(ft, 50, 36, 0, "(generic, D % 8 != 0)");
        case_rms(ft, 40, 2048, el, "(generic)");
        case_add_rms(ft, 96, 2048, 0, "(one pass)");
        case_add_rms(ft, 300, 256, 0, "(one pass, short rows)");
        case_add_rms(ft, 50, 36, 0, "(add, then generic norm)");
        case_add_rms(ft, 40, 2048, el, "(misaligned: add, then generic norm)");
        for (int nd = 1; nd <= 3; nd++) {
            case_norm_bwd_add(ft, 96, 2048, nd, 0, "(one pass)");
            case_norm_bwd_add(ft, 300, 256, nd, 0, "(one pass, short rows)");
            case_norm_bwd_add(ft, 50, 36, nd, 0, "(generic, D % 8 != 0)");
            case_norm_bwd_add(ft, 40, 2048, nd, el, "(generic, misaligned)");
        }
        case_rope(ft, SH(2, 64, 4, 64), 0, "(8-wide)");
        case_rope(ft, SH(2, 40, 3, 16), 0, "(8-wide, d/2 = 8)");
        case_rope(ft, SH(3, 33, 2, 128), 0, "(8-wide, many rows per block)");
        case_rope(ft, SH(1, 7, 3, 12), 0, "(scalar, d/2 = 6)");
        case_rope(ft, SH(2, 20, 4, 64), el, "(scalar)");
    }
}

/* Times one call (after a warm-up), averaged over 20; bytes = the traffic it must move. */
static void bench_one(const char *name, gt_kernel_call *k, double bytes)
{
    gt_error err = {0};
    int reps = 20;
    bool ok = gt_cuda_run_kernel(k, g_stream, &err) == GT_OK &&
              gt_cuda_stream_sync(g_stream, &err) == GT_OK;
    double t0 = gt_now_seconds();
    for (int r = 0; r < reps && ok; r++)
        ok = gt_cuda_run_kernel(k, g_stream, &err) == GT_OK;
    ok = ok && gt_cuda_stream_sync(g_stream, &err) == GT_OK;
    double dt = (gt_now_seconds() - t0) / reps;
    if (ok)
        printf("bench %-40s %8.1f us  %7.1f GB/s\n", name, dt * 1e6, bytes / dt / 1e9);
    else
        printf("bench %s: %s\n", name, err.msg);
}

static void bench(void)
{
    gt_error err = {0};
    gt_tensor x, w, dy, y, dw, q, kv;
    int64_t rows = 16384, d = 2048;
    if (gt_cuda_tensor_alloc(&x, GT_BF16, 2, SH(rows, d), &err) != GT_OK ||
        gt_cuda_tensor_alloc(&dy, GT_BF16, 2, SH(rows, d), &err) != GT_OK ||
        gt_cuda_tensor_alloc(&y, GT_BF16, 2, SH(rows, d), &err) != GT_OK ||
        gt_cuda_tensor_alloc(&w, GT_BF16, 1, SH(d), &err) != GT_OK ||
        gt_cuda_tensor_alloc(&dw, GT_BF16, 1, SH(d), &err) != GT_OK ||
        gt_cuda_tensor_alloc(&q, GT_BF16, 4, SH(8, 2048, 32, 64), &err) != GT_OK ||
        gt_cuda_tensor_alloc(&kv, GT_BF16, 4, SH(8, 2048, 8, 64), &err) != GT_OK) {
        printf("bench: %s\n", err.msg);
        return;
    }
    /* Zero-filled device memory would be fine for timing but rows of zeros are a corner case;
     * time on the values cudaMalloc gives (uninitialized bits may be NaN: timing only). */
    double mb = (double)rows * (double)d * 2.0;
    double eps = 1e-5;
    int64_t ri[2] = {0, 8192};
    double rf[4] = {500000.0, 32.0, 1.0, 4.0};
    gt_kernel_call k;
    memset(&k, 0, sizeof k);
    k.op = GT_OP_RMS_NORM;
    k.f = &eps;
    k.nf = 1;
    k.n_in = 2;
    k.n_out = 1;
    k.in[0] = &x;
    k.in[1] = &w;
    k.out[0] = &y;
    bench_one("rms_norm [16384,2048] bf16", &k, 2 * mb);
    k.op = GT_OP_RMS_NORM_BACKWARD;
    k.n_in = 3;
    k.n_out = 2;
    k.in[2] = &dy;
    k.out[1] = &dw;
    bench_one("rms_norm_backward [16384,2048] bf16", &k, 3 * mb);
    /* rms_norm_backward_add with r = y and the dy terms dy (and x): the ffn_norm (2 terms) and
     * attention_norm (3 terms) shapes of 1B; bytes: x, r, the terms and dx */
    for (int nd = 2; nd <= 3; nd++) {
        k.op = GT_OP_RMS_NORM_BACKWARD_ADD;
        k.n_in = 3 + nd;
        k.in[2] = &y;
        k.in[3] = &dy;
        k.in[4] = &x;
        k.in[5] = &dy;
        char nm[64];
        snprintf(nm, sizeof nm, "rms_norm_backward_add %d terms [16384,2048] bf16", nd);
        bench_one(nm, &k, (3.0 + nd) * mb);
    }
    k.in[2] = &dy;
    /* debugmodel rows: the same tensors viewed as [131072, 256] (8x the rows of its step) and
     * [16384, 256] */
    int64_t nrows[2] = {rows * d / 256, 16384};
    for (int v = 0; v < 2; v++) {
        gt_tensor xs = x, dys = dy, ys = y, ws = w, dws = dw;
        xs.shape[0] = dys.shape[0] = ys.shape[0] = nrows[v];
        xs.shape[1] = dys.shape[1] = ys.shape[1] = ws.shape[0] = dws.shape[0] = 256;
        double b = (double)nrows[v] * 256 * 2.0;
        char nm[64];
        k.op = GT_OP_RMS_NORM;
        k.n_in = 2;
        k.n_out = 1;
        k.in[0] = &xs;
        k.in[1] = &ws;
        k.out[0] = &ys;
        snprintf(nm, sizeof nm, "rms_norm [%lld,256] bf16", (long long)nrows[v]);
        bench_one(nm, &k, 2 * b);
        k.op = GT_OP_RMS_NORM_BACKWARD;
        k.n_in = 3;
        k.n_out = 2;
        k.in[2] = &dys;
        k.out[1] = &dws;
        snprintf(nm, sizeof nm, "rms_norm_backward [%lld,256] bf16", (long long)nrows[v]);
        bench_one(nm, &k, 3 * b);
    }
    memset(&k, 0, sizeof k);
    k.op = GT_OP_ROPE;
    k.i = ri;
    k.ni = 2;
    k.f = rf;
    k.nf = 4;
    k.n_in = 1;
    k.n_out = 1;
    k.in[0] = &q;
    k.out[0] = &q;
    bench_one("rope q [8,2048,32,64] bf16 in place", &k, 2.0 * (double)gt_tensor_nbytes(&q));
    k.in[0] = &kv;
    k.out[0] = &kv;
    bench_one("rope k [8,2048,8,64] bf16 in place", &k, 2.0 * (double)gt_tensor_nbytes(&kv));
    gt_cuda_tensor_free(&x);
    gt_cuda_tensor_free(&dy);
    gt_cuda_tensor_free(&y);
    gt_cuda_tensor_free(&w);
    gt_cuda_tensor_free(&dw);
    gt_cuda_tensor_free(&q);
    gt_cuda_tensor_free(&kv);
}

int main(int argc, char **argv)
{
    gt_cuda_device_info info;
    int rc = cu_test_start(&info, &g_stream);
    if (rc >= 0) return rc;
    if (argc > 1 && strcmp(argv[1], "--bench") == 0) {
        printf("device: %s (%d SMs)\n", info.name, info.sm_count);
        bench();
        gt_cuda_stream_destroy(g_stream);
        return 0;
    }
    cases();
    gt_cuda_stream_destroy(g_stream);
    return gt_test_finish();
}
