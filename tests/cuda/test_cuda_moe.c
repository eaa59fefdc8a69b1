/* test_cuda_moe.c — the CUDA kernels of the DeepSeek-V3 ops (cuda_moe.cu, cuda_moe_gemm.cu) and the
 * rope attributes `scaling` / `interleaved` vs the CPU kernels and a naive reference here.
 *
 * Every device run is made twice, the outputs pre-filled with different byte patterns, and both
 * runs must give the same bytes (deterministic, every element written). Then:
 *   - sign, moe_topk, gather_last, gather_last_backward, moe_sort, moe_count: bitwise equal to the
 *     CPU kernel and to the naive reference (ties in topk forced by quantized scores; sort and
 *     count over several chunks of ids and empty experts);
 *   - grouped_matmul / grouped_matmul_dw (f32, bf16, f16; trans_b 0 / 1; 16-byte and scalar
 *     paths — bf16 16-byte is cuda_moe_wgmma.cu's wgmma kernel, at 96 x 80 and 264 x 200 (several
 *     tiles, a k tail); an empty group, rows before offsets[0] and past offsets[E]): max|gpu - ref|
 * / max|ref|
 *     <= 1e-5 (f32) or 1e-2 (16-bit) against the double reference and the CPU kernel, f32 also
 *     bitwise the CPU's (the same fmaf chains); rows outside the groups exactly +0;
 *   - grouped_matmul M-invariance on the device: one group's rows computed inside the full split
 *     and alone at another row offset (another tile alignment) give the same bits;
 *   - rope: interleaved equals the half-rotation kernel on the de-interleaved head dim (bitwise,
 *     device only), and CUDA vs CPU (llama3, interleaved, YaRN) within 1e-6 of max|ref|.
 * Without a CUDA device the test skips (exit 0). */
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

static gt_cuda_stream *g_s;
static uint64_t g_rng = 0x243f6a8885a308d3ull;

typedef struct {
    gt_op op;
    int64_t i[4];
    int ni;
    double f[4];
    int nf;
    int64_t e[1];
    int ne;
} attrs;

/* The op on the device, twice (outputs pre-filled with 0xff, then 0x5a): the first run's outputs
 * into got[] (host tensors already shaped), false (counted) on an error or when the runs differ. */
static bool gpu_run(const char *name, const attrs *a, const gt_tensor *in, int n_in, gt_tensor *got,
                    int n_out)
{
    gt_error err = {0};
    gt_tensor din[4], dout[3];
    memset(din, 0, sizeof din);
    memset(dout, 0, sizeof dout);
    bool ok = true, same = true;
    for (int k = 0; k < n_in && ok; k++)
        ok = gt_cuda_tensor_upload(g_s, &in[k], &din[k], &err) == GT_OK;
    for (int k = 0; k < n_out && ok; k++)
        ok = gt_cuda_tensor_alloc(&dout[k], got[k].dtype, got[k].ndim, got[k].shape, &err) == GT_OK;
    gt_kernel_call c =
        cu_kernel_call(a->op, a->i, a->ni, a->f, a->nf, a->e, a->ne, din, n_in, dout, n_out);
    for (int rep = 0; rep < 2 && ok; rep++) {
        for (int k = 0; k < n_out && ok; k++)
            ok = cu_fill_pattern(g_s, &dout[k], rep == 0 ? 0xff : 0x5a);
        ok = ok && gt_cuda_run_kernel(&c, g_s, &err) == GT_OK;
        for (int k = 0; k < n_out && ok; k++) {
            gt_tensor h = cu_tensor_new(got[k].dtype, got[k].ndim, got[k].shape);
            ok = gt_cuda_tensor_download(g_s, &dout[k], &h, &err) == GT_OK;
            if (ok && rep == 0) memcpy(got[k].data, h.data, gt_tensor_nbytes(&h));
            if (ok && rep == 1)
                same = same && memcmp(got[k].data, h.data, gt_tensor_nbytes(&h)) == 0;
            gt_tensor_free(&h);
        }
    }
    EXPECT(ok, "%s: CUDA run failed: %s", name, err.msg);
    EXPECT(!ok || same, "%s: two CUDA runs differ (nondeterministic or unwritten output)", name);
    for (int k = 0; k < n_in; k++)
        gt_cuda_tensor_free(&din[k]);
    for (int k = 0; k < n_out; k++)
        gt_cuda_tensor_free(&dout[k]);
    return ok && same;
}

static bool cpu_run(const char *name, const attrs *a, const gt_tensor *in, int n_in, gt_tensor *out,
                    int n_out)
{
    gt_error err = {0};
    gt_kernel_call c =
        cu_kernel_call(a->op, a->i, a->ni, a->f, a->nf, a->e, a->ne, in, n_in, out, n_out);
    gt_status st = gt_cpu_run_kernel(&c, &err);
    EXPECT(st == GT_OK, "%s: CPU kernel failed: %s", name, err.msg);
    return st == GT_OK;
}

static gt_tensor like(const gt_tensor *t)
{
    gt_tensor r = cu_tensor_new(t->dtype, t->ndim, t->shape);
    memset(r.data, 0, gt_tensor_nbytes(&r));
    return r;
}

/* ---------------------------------------------------------------- sign */

static void test_sign(gt_dtype dt)
{
    const float special[] = {0.0f, -0.0f, NAN, INFINITY, -INFINITY, 1e-30f, -1e-30f, 3.0f};
    gt_tensor x = cu_tensor_rand(&g_rng, dt, 1, SH(1003), -2.0, 2.0);
    for (int k = 0; k < 8; k++)
        gt_tensor_set_f32(&x, 100 * k + 1, special[k]);
    gt_tensor got = like(&x), cpu = like(&x);
    attrs a = {.op = GT_OP_SIGN};
    if (gpu_run("sign", &a, &x, 1, &got, 1) && cpu_run("sign", &a, &x, 1, &cpu, 1)) {
        int bad = 0;
        for (int64_t k = 0; k < 1003; k++) {
            float v = gt_tensor_get_f32(&x, k), g = gt_tensor_get_f32(&got, k);
            float want = v > 0 ? 1.0f : (v < 0 ? -1.0f : v), c = gt_tensor_get_f32(&cpu, k);
            bool eq = isnan(want) ? isnan(g) && isnan(c) : g == want && c == want;
            if (!eq) bad++;
        }
        EXPECT(bad == 0, "sign %s: %d elements differ from -1/0/+1 (or CPU)", gt_dtype_name(dt),
               bad);
    }
    gt_tensor_free(&x);
    gt_tensor_free(&got);
    gt_tensor_free(&cpu);
}

/* ---------------------------------------------------------------- moe_topk, gather_last */

static bool better(float a, int ia, float b, int ib)
{
    if (ia < 0) return false;
    if (ib < 0) return true;
    if (isnan(a) != isnan(b)) return isnan(a);
    if (!isnan(a) && a != b) return a > b;
    return ia < ib;
}

/* The spec's moe_topk, one row at a time. */
static void topk_ref(const float *sc, int64_t T, int E, int K, int G, int L, int32_t *out)
{
    float *row = malloc(sizeof(float) * (size_t)E);
    GT_CHECK(row);
    for (int64_t t = 0; t < T; t++) {
        memcpy(row, sc + t * E, sizeof(float) * (size_t)E);
        if (G > 1) {
            int per = E / G;
            float gs[64];
            bool keep[64] = {0};
            for (int g = 0; g < G; g++) {
                int i1 = -1, i2 = -1;
                for (int e = g * per; e < (g + 1) * per; e++) {
                    if (i1 < 0 || better(row[e], e, row[i1], i1)) {
                        i2 = i1;
                        i1 = e;
                    } else if (i2 < 0 || better(row[e], e, row[i2], i2)) {
                        i2 = e;
                    }
                }
                gs[g] = i2 >= 0 ? row[i1] + row[i2] : row[i1];
            }
            for (int r = 0; r < L; r++) {
                int best = -1;
                for (int g = 0; g < G; g++)
                    if (!keep[g] && (best < 0 || better(gs[g], g, gs[best], best))) best = g;
                keep[best] = true;
            }
            for (int e = 0; e < E; e++)
                if (!keep[e / per]) row[e] = -INFINITY;
        }
        bool taken[1024] = {0};
        for (int r = 0; r < K; r++) {
            int best = -1;
            for (int e = 0; e < E; e++)
                if (!taken[e] && (best < 0 || better(row[e], e, row[best], best))) best = e;
            taken[best] = true;
            out[t * K + r] = best;
        }
    }
    free(row);
}

static void test_topk_gather(int64_t T, int E, int K, int G, int L)
{
    char name[96];
    snprintf(name, sizeof name, "moe_topk T%lld E%d K%d G%d L%d", (long long)T, E, K, G, L);
    gt_tensor sc = cu_tensor_new(GT_F32, 2, SH(T, E));
    float *s = sc.data;
    for (int64_t k = 0; k < T * E; k++) /* eighths: many ties */
        s[k] = (float)floor(cu_urand(&g_rng, 0.0, 8.0)) / 8.0f;
    s[3] = NAN;
    gt_tensor got = cu_tensor_new(GT_I32, 2, SH(T, K)), cpu = like(&got), ref = like(&got);
    attrs a = {.op = GT_OP_MOE_TOPK, .i = {K, G, L}, .ni = 3};
    topk_ref(s, T, E, K, G, L, ref.data);
    if (gpu_run(name, &a, &sc, 1, &got, 1)) EXPECT(same_bits(&got, &ref), "%s: != reference", name);
    if (cpu_run(name, &a, &sc, 1, &cpu, 1)) EXPECT(same_bits(&cpu, &ref), "%s: CPU != ref", name);

    /* gather_last of x by these ids, and its backward */
    for (int d = 0; d < 2; d++) {
        gt_dtype dt = d ? GT_BF16 : GT_F32;
        gt_tensor in[2] = {cu_tensor_rand(&g_rng, dt, 2, SH(T, E), -3.0, 3.0), ref};
        gt_tensor g = cu_tensor_new(dt, 2, SH(T, K)), c = like(&g), r = like(&g);
        size_t es = gt_dtype_size(dt);
        for (int64_t k = 0; k < T * K; k++)
            memcpy((char *)r.data + k * es,
                   (char *)in[0].data + ((k / K) * E + ((int32_t *)ref.data)[k]) * es, es);
        attrs ga = {.op = GT_OP_GATHER_LAST};
        if (gpu_run("gather_last", &ga, in, 2, &g, 1))
            EXPECT(same_bits(&g, &r), "gather_last %s: != reference", gt_dtype_name(dt));
        if (cpu_run("gather_last", &ga, in, 2, &c, 1))
            EXPECT(same_bits(&c, &r), "gather_last %s: CPU != reference", gt_dtype_name(dt));
        gt_tensor bin[2] = {ref, r};
        gt_tensor bg = cu_tensor_new(dt, 2, SH(T, E)), bc = like(&bg), br = like(&bg);
        for (int64_t k = 0; k < T * K; k++)
            memcpy((char *)br.data + ((k / K) * E + ((int32_t *)ref.data)[k]) * es,
                   (char *)r.data + k * es, es);
        attrs ba = {.op = GT_OP_GATHER_LAST_BACKWARD, .e = {E}, .ne = 1};
        if (gpu_run("gather_last_backward", &ba, bin, 2, &bg, 1))
            EXPECT(same_bits(&bg, &br), "gather_last_backward %s: != reference", gt_dtype_name(dt));
        if (cpu_run("gather_last_backward", &ba, bin, 2, &bc, 1))
            EXPECT(same_bits(&bc, &br), "gather_last_backward %s: CPU != ref", gt_dtype_name(dt));
        gt_tensor_free(&in[0]);
        gt_tensor_free(&g);
        gt_tensor_free(&c);
        gt_tensor_free(&r);
        gt_tensor_free(&bg);
        gt_tensor_free(&bc);
        gt_tensor_free(&br);
    }
    gt_tensor_free(&sc);
    gt_tensor_free(&got);
    gt_tensor_free(&cpu);
    gt_tensor_free(&ref);
}

/* ---------------------------------------------------------------- moe_sort, moe_count */

static void test_sort(int64_t T, int K, int E, int skip_every)
{
    char name[64];
    snprintf(name, sizeof name, "moe_sort T%lld K%d E%d", (long long)T, K, E);
    int64_t n = T * K;
    gt_tensor idx = cu_tensor_new(GT_I32, 2, SH(T, K));
    int32_t *id = idx.data;
    for (int64_t k = 0; k < n; k++) { /* experts e % skip_every == 1 stay empty */
        int v = (int)cu_urand(&g_rng, 0.0, (double)E);
        if (skip_every > 0 && v % skip_every == 1) v = (v + 1) % E;
        id[k] = v;
    }
    gt_tensor ro = cu_tensor_new(GT_I32, 1, SH(n)), rt = like(&ro);
    gt_tensor rf = cu_tensor_new(GT_I32, 1, SH(E + 1));
    gt_tensor rc = cu_tensor_new(GT_F32, 1, SH(E));
    int64_t r = 0;
    for (int e = 0; e < E; e++) {
        ((int32_t *)rf.data)[e] = (int32_t)r;
        for (int64_t k = 0; k < n; k++)
            if (id[k] == e) {
                ((int32_t *)ro.data)[r] = (int32_t)k;
                ((int32_t *)rt.data)[r++] = (int32_t)(k / K);
            }
        ((float *)rc.data)[e] = (float)(r - ((int32_t *)rf.data)[e]);
    }
    ((int32_t *)rf.data)[E] = (int32_t)r;
    gt_tensor ref[3] = {ro, rt, rf};
    gt_tensor got[3] = {like(&ro), like(&rt), like(&rf)},
              cpu[3] = {like(&ro), like(&rt), like(&rf)};
    attrs a = {.op = GT_OP_MOE_SORT, .i = {E}, .ni = 1};
    if (gpu_run(name, &a, &idx, 1, got, 3))
        for (int k = 0; k < 3; k++)
            EXPECT(same_bits(&got[k], &ref[k]), "%s: output %d != stable sort", name, k);
    if (cpu_run(name, &a, &idx, 1, cpu, 3))
        for (int k = 0; k < 3; k++)
            EXPECT(same_bits(&cpu[k], &ref[k]), "%s: CPU output %d != stable sort", name, k);
    attrs ca = {.op = GT_OP_MOE_COUNT, .i = {E}, .ni = 1};
    gt_tensor gc = like(&rc), cc = like(&rc);
    if (gpu_run("moe_count", &ca, &idx, 1, &gc, 1))
        EXPECT(same_bits(&gc, &rc), "moe_count E%d: != reference", E);
    if (cpu_run("moe_count", &ca, &idx, 1, &cc, 1))
        EXPECT(same_bits(&cc, &rc), "moe_count E%d: CPU != reference", E);
    for (int k = 0; k < 3; k++) {
        gt_tensor_free(&got[k]);
        gt_tensor_free(&cpu[k]);
        gt_tensor_free(&ref[k]);
    }
    gt_tensor_free(&idx);
    gt_tensor_free(&rc);
    gt_tensor_free(&gc);
    gt_tensor_free(&cc);
}

/* An id outside [0, E) (moe_sort, moe_count, gather_last) or a decreasing offset
 * (grouped_matmul) comes back as an error naming the op at the stream's next sync. */
static void test_bad_data(void)
{
    gt_tensor ids = cu_tensor_new(GT_I32, 2, SH(4, 2));
    for (int k = 0; k < 8; k++)
        ((int32_t *)ids.data)[k] = k == 5 ? 9 : k % 4;
    gt_tensor off = cu_tensor_new(GT_I32, 1, SH(4));
    const int32_t o[4] = {0, 3, 2, 4};
    memcpy(off.data, o, sizeof o);
    gt_tensor x = cu_tensor_rand(&g_rng, GT_F32, 2, SH(4, 8), -1.0, 1.0);
    gt_tensor w = cu_tensor_rand(&g_rng, GT_F32, 3, SH(3, 8, 8), -1.0, 1.0);
    struct {
        const char *name;
        attrs a;
        gt_tensor in[3];
        int n_in;
        gt_tensor out[3];
        int n_out;
    } cs[3] = {
        {"moe_sort",
         {.op = GT_OP_MOE_SORT, .i = {4}, .ni = 1},
         {ids},
         1,
         {cu_tensor_new(GT_I32, 1, SH(8)), cu_tensor_new(GT_I32, 1, SH(8)),
          cu_tensor_new(GT_I32, 1, SH(5))},
         3},
        {"moe_count",
         {.op = GT_OP_MOE_COUNT, .i = {4}, .ni = 1},
         {ids},
         1,
         {cu_tensor_new(GT_F32, 1, SH(4))},
         1},
        {"grouped_matmul",
         {.op = GT_OP_GROUPED_MATMUL, .i = {1}, .ni = 1},
         {x, w, off},
         3,
         {cu_tensor_new(GT_F32, 2, SH(4, 8))},
         1},
    };
    for (int k = 0; k < 3; k++) {
        gt_error err = {0};
        gt_tensor din[3], dout[3];
        memset(din, 0, sizeof din);
        memset(dout, 0, sizeof dout);
        bool ok = true;
        for (int j = 0; j < cs[k].n_in && ok; j++)
            ok = gt_cuda_tensor_upload(g_s, &cs[k].in[j], &din[j], &err) == GT_OK;
        for (int j = 0; j < cs[k].n_out && ok; j++)
            ok = gt_cuda_tensor_alloc(&dout[j], cs[k].out[j].dtype, cs[k].out[j].ndim,
                                      cs[k].out[j].shape, &err) == GT_OK;
        EXPECT(ok, "%s: setup failed: %s", cs[k].name, err.msg);
        gt_kernel_call c = cu_kernel_call(cs[k].a.op, cs[k].a.i, cs[k].a.ni, NULL, 0, NULL, 0, din,
                                          cs[k].n_in, dout, cs[k].n_out);
        gt_status st = ok ? gt_cuda_run_kernel(&c, g_s, &err) : GT_ERR_INTERNAL;
        if (st == GT_OK) st = gt_cuda_stream_sync(g_s, &err);
        EXPECT(ok && st != GT_OK && strstr(err.msg, cs[k].name) != NULL,
               "%s: bad data not reported (status %d: %s)", cs[k].name, (int)st, err.msg);
        for (int j = 0; j < cs[k].n_in; j++)
            gt_cuda_tensor_free(&din[j]);
        for (int j = 0; j < cs[k].n_out; j++) {
            gt_cuda_tensor_free(&dout[j]);
            gt_tensor_free(&cs[k].out[j]);
        }
    }
    gt_tensor_free(&ids);
    gt_tensor_free(&off);
    gt_tensor_free(&x);
    gt_tensor_free(&w);
}

/* ---------------------------------------------------------------- grouped GEMMs */

/* max |a - ref| / max |ref| */
static double rel_err(const gt_tensor *a, const gt_tensor *ref)
{
    return cu_rel_err(a, ref);
}

/* Element k of t is +0 (all bits clear). */
static bool is_pos_zero(const gt_tensor *t, int64_t k)
{
    size_t es = gt_dtype_size(t->dtype);
    static const unsigned char zero[8];
    return memcmp((const char *)t->data + (size_t)k * es, zero, es) == 0;
}

static gt_tensor offsets_of(int first, const int *sizes, int E)
{
    gt_tensor o = cu_tensor_new(GT_I32, 1, SH(E + 1));
    int32_t *p = o.data;
    p[0] = first;
    for (int e = 0; e < E; e++)
        p[e + 1] = p[e] + sizes[e];
    return o;
}

static void gm_ref(const gt_tensor *x, const gt_tensor *w, const int32_t *off, int E, bool tb,
                   gt_tensor *out)
{
    int64_t R = x->shape[0], Din = x->shape[1], Dout = out->shape[1];
    for (int64_t r = 0; r < R; r++)
        for (int64_t n = 0; n < Dout; n++) {
            double s = 0.0;
            int e = -1;
            for (int g = 0; g < E; g++)
                if (r >= off[g] && r < off[g + 1]) e = g;
            for (int64_t k = 0; e >= 0 && k < Din; k++) {
                int64_t wi = tb ? (e * Dout + n) * Din + k : (e * Din + k) * Dout + n;
                s += (double)gt_tensor_get_f32(x, r * Din + k) * gt_tensor_get_f32(w, wi);
            }
            gt_tensor_set_f32(out, r * Dout + n, (float)s);
        }
}

static void test_gm(gt_dtype dt, bool tb, int64_t Din, int64_t Dout)
{
    enum { E = 5 };
    const int sizes[E] = {70, 0, 131, 1, 64};
    int64_t R = 300; /* rows 3 .. 269 in groups; 0 .. 2 and 269 .. 299 zero */
    char name[96];
    snprintf(name, sizeof name, "grouped_matmul %s trans_b %d [%lld, %lld]", gt_dtype_name(dt), tb,
             (long long)Din, (long long)Dout);
    double tol = dt == GT_F32 ? 1e-5 : 1e-2;
    gt_tensor in[3] = {cu_tensor_rand(&g_rng, dt, 2, SH(R, Din), -1.0, 1.0),
                       tb ? cu_tensor_rand(&g_rng, dt, 3, SH(E, Dout, Din), -1.0, 1.0)
                          : cu_tensor_rand(&g_rng, dt, 3, SH(E, Din, Dout), -1.0, 1.0),
                       offsets_of(3, sizes, E)};
    const int32_t *off = in[2].data;
    gt_tensor got = cu_tensor_new(dt, 2, SH(R, Dout)), cpu = like(&got), ref = like(&got);
    gm_ref(&in[0], &in[1], off, E, tb, &ref);
    attrs a = {.op = GT_OP_GROUPED_MATMUL, .i = {tb}, .ni = 1};
    if (gpu_run(name, &a, in, 3, &got, 1)) {
        double e = rel_err(&got, &ref);
        EXPECT(e <= tol, "%s: rel err %.3g vs reference (tol %g)", name, e, tol);
        bool zero = true;
        for (int64_t k = 0; k < R * Dout; k++)
            if (k < off[0] * Dout || k >= off[E] * Dout) zero = zero && is_pos_zero(&got, k);
        EXPECT(zero, "%s: rows outside [offsets[0], offsets[E]) are not +0", name);
    }
    if (cpu_run(name, &a, in, 3, &cpu, 1)) {
        double e = rel_err(&got, &cpu);
        EXPECT(e <= tol, "%s: rel err %.3g vs CPU (tol %g)", name, e, tol);
        /* f32: the CPU's fmaf chain over Din, bit for bit */
        if (dt == GT_F32) EXPECT(same_bits(&got, &cpu), "%s: f32 not bitwise the CPU's", name);
    }
    /* M-invariance: group 2's rows (73 .. 204) again at rows 5 .. 136 after 5 rows of group 0 */
    int64_t R2 = 140;
    const int sizes2[E] = {5, 0, 131, 0, 0};
    gt_tensor in2[3] = {cu_tensor_rand(&g_rng, dt, 2, SH(R2, Din), -1.0, 1.0), in[1],
                        offsets_of(0, sizes2, E)};
    size_t es = gt_dtype_size(dt);
    memcpy((char *)in2[0].data + 5 * Din * es, (char *)in[0].data + 73 * Din * es,
           (size_t)(131 * Din) * es);
    gt_tensor got2 = cu_tensor_new(dt, 2, SH(R2, Dout));
    if (gpu_run(name, &a, in2, 3, &got2, 1))
        EXPECT(memcmp((char *)got2.data + 5 * Dout * es, (char *)got.data + 73 * Dout * es,
                      (size_t)(131 * Dout) * es) == 0,
               "%s: not M-invariant (group 2's rows differ under another split)", name);
    for (int k = 0; k < 3; k++)
        gt_tensor_free(&in[k]);
    gt_tensor_free(&in2[0]);
    gt_tensor_free(&in2[2]);
    gt_tensor_free(&got);
    gt_tensor_free(&got2);
    gt_tensor_free(&cpu);
    gt_tensor_free(&ref);
}

static void test_gmdw(gt_dtype dt, int64_t Din, int64_t Dout)
{
    enum { E = 5 };
    const int sizes[E] = {70, 0, 131, 1, 64};
    int64_t R = 300;
    char name[96];
    snprintf(name, sizeof name, "grouped_matmul_dw %s [%lld, %lld]", gt_dtype_name(dt),
             (long long)Dout, (long long)Din);
    double tol = dt == GT_F32 ? 1e-5 : 1e-2;
    gt_tensor in[3] = {cu_tensor_rand(&g_rng, dt, 2, SH(R, Din), -1.0, 1.0),
                       cu_tensor_rand(&g_rng, dt, 2, SH(R, Dout), -1.0, 1.0),
                       offsets_of(3, sizes, E)};
    const int32_t *off = in[2].data;
    gt_tensor got = cu_tensor_new(dt, 3, SH(E, Dout, Din)), cpu = like(&got), ref = like(&got);
    for (int e = 0; e < E; e++)
        for (int64_t m = 0; m < Dout; m++)
            for (int64_t k = 0; k < Din; k++) {
                double s = 0.0;
                for (int64_t r = off[e]; r < off[e + 1]; r++)
                    s += (double)gt_tensor_get_f32(&in[1], r * Dout + m) *
                         gt_tensor_get_f32(&in[0], r * Din + k);
                gt_tensor_set_f32(&ref, (e * Dout + m) * Din + k, (float)s);
            }
    attrs a = {.op = GT_OP_GROUPED_MATMUL_DW};
    if (gpu_run(name, &a, in, 3, &got, 1)) {
        double e = rel_err(&got, &ref);
        EXPECT(e <= tol, "%s: rel err %.3g vs reference (tol %g)", name, e, tol);
        bool zero = true; /* group 1 is empty */
        for (int64_t k = Dout * Din; k < 2 * Dout * Din; k++)
            zero = zero && gt_tensor_get_f32(&got, k) == 0.0f;
        EXPECT(zero, "%s: the empty group's gradient is not zero", name);
    }
    if (cpu_run(name, &a, in, 3, &cpu, 1)) {
        double e = rel_err(&got, &cpu);
        EXPECT(e <= tol, "%s: rel err %.3g vs CPU (tol %g)", name, e, tol);
        /* f32: the CPU's fmaf chain over the group's rows, bit for bit */
        if (dt == GT_F32) EXPECT(same_bits(&got, &cpu), "%s: f32 not bitwise the CPU's", name);
    }
    for (int k = 0; k < 3; k++)
        gt_tensor_free(&in[k]);
    gt_tensor_free(&got);
    gt_tensor_free(&cpu);
    gt_tensor_free(&ref);
}

/* ---------------------------------------------------------------- rope */

static void test_rope(const char *what, int64_t omp, int64_t scaling, double factor, double lo,
                      double hi)
{
    int64_t b = 2, s = 33, h = 3, d = 64, half = d / 2;
    gt_tensor x = cu_tensor_rand(&g_rng, GT_F32, 4, SH(b, s, h, d), -2.0, 2.0);
    gt_tensor il = like(&x), hr = like(&x), xp = like(&x), cpu = like(&x);
    attrs a = {.op = GT_OP_ROPE,
               .i = {0, omp, scaling, 1},
               .ni = 4,
               .f = {10000.0, factor, lo, hi},
               .nf = 4};
    char name[96];
    snprintf(name, sizeof name, "rope interleaved %s", what);
    bool ok = gpu_run(name, &a, &x, 1, &il, 1);
    /* the same rotation with half-rotation pairs on the de-interleaved head dim */
    const float *px = x.data;
    float *pp = xp.data;
    for (int64_t r = 0; r < b * s * h; r++)
        for (int64_t j = 0; j < half; j++) {
            pp[r * d + j] = px[r * d + 2 * j];
            pp[r * d + half + j] = px[r * d + 2 * j + 1];
        }
    attrs ah = a;
    ah.i[3] = 0;
    if (ok && gpu_run(name, &ah, &xp, 1, &hr, 1)) {
        const float *ph = hr.data, *pi = il.data;
        int bad = 0;
        for (int64_t r = 0; r < b * s * h; r++)
            for (int64_t j = 0; j < half; j++)
                bad += ph[r * d + j] != pi[r * d + 2 * j] ||
                       ph[r * d + half + j] != pi[r * d + 2 * j + 1];
        EXPECT(bad == 0, "%s: %d values differ from the half-rotation kernel's", name, bad);
    }
    if (ok && cpu_run(name, &a, &x, 1, &cpu, 1)) {
        double e = rel_err(&il, &cpu);
        EXPECT(e <= 1e-6, "%s: rel err %.3g vs CPU", name, e);
        printf("%s: CUDA vs CPU %s\n", name, same_bits(&il, &cpu) ? "bitwise" : "not bitwise");
    }
    gt_tensor_free(&x);
    gt_tensor_free(&il);
    gt_tensor_free(&hr);
    gt_tensor_free(&xp);
    gt_tensor_free(&cpu);
}

int main(void)
{
    int rc = cu_test_start(NULL, &g_s);
    if (rc >= 0) return rc;
    test_sign(GT_F32);
    test_sign(GT_BF16);
    test_topk_gather(37, 64, 6, 1, 1);
    test_topk_gather(37, 64, 8, 8, 3);
    test_topk_gather(5, 256, 8, 8, 4);
    test_sort(3000, 8, 64, 7); /* 24000 ids: 24 chunks */
    test_sort(5, 8, 256, 0);
    test_sort(1, 1, 1, 0);
    test_bad_data();
    for (int tb = 0; tb < 2; tb++) {
        test_gm(GT_F32, tb, 96, 80);
        test_gm(GT_F32, tb, 37, 50);
        test_gm(GT_BF16, tb, 96, 80);   /* 16-byte loads: the wgmma kernel */
        test_gm(GT_BF16, tb, 264, 200); /* several 128-wide tiles, a k tail of 8 */
        test_gm(GT_BF16, tb, 37, 50);   /* scalar loads */
        test_gm(GT_F16, tb, 96, 80);
    }
    test_gmdw(GT_F32, 96, 80);
    test_gmdw(GT_F32, 37, 50);
    test_gmdw(GT_BF16, 96, 80);
    test_gmdw(GT_BF16, 264, 200);
    test_gmdw(GT_BF16, 37, 50);
    test_gmdw(GT_F16, 96, 80);
    test_rope("plain", 0, 0, 1.0, 1.0, 4.0);
    test_rope("llama3", 8192, 0, 8.0, 1.0, 4.0);
    test_rope("yarn", 4096, 2, 40.0, 32.0, 1.0);
    gt_cuda_stream_destroy(g_s);
    return gt_test_finish();
}
