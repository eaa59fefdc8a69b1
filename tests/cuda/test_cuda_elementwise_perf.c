/* test_cuda_elementwise_perf.c — the vectorized fast paths of the CUDA elementwise / layout /
 * optimizer kernels, on sizes that exercise them (full 16-byte packs plus a ragged tail).
 *
 * Checks (no timing is asserted):
 *   - fast path == general path, bitwise: each op runs once on 16-byte aligned tensors (fast path)
 *     and once on views shifted by one element (misaligned: the general kernels), and the outputs
 *     must have identical bits — both evaluate the same per-element f32 formula;
 *   - CUDA vs the CPU reference: bitwise for moves, casts, AdamW (f32) and embedding_backward (f32:
 *     the same in-order sums); within 1e-5 (relative to the largest value) for the others;
 *   - layout moves on shapes that take each gather kernel: row copies ([b,s,h,d] -> [b,h,s,d]),
 *     32x32 tiles (2D transpose with partial edge tiles) and a broadcast.
 * With --bench it also times the llama3-1B shapes and prints GB/s (bytes read + written / time). */
#include "cuda_test_util.h"
#include "graphtrain/gt_cuda.h"
#include "gt_test.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SH(...) ((const int64_t[]){__VA_ARGS__})
#define MAXT 6

static gt_cuda_stream *g_stream;
static uint64_t rng_state = 0x2545f4914f6cdd1dull;

static gt_tensor h_rand(gt_dtype dt, int nd, const int64_t *shape, double lo, double hi)
{
    gt_tensor t;
    gt_error err = {0};
    GT_CHECK(gt_tensor_alloc(&t, dt, nd, shape, &err) == GT_OK);
    for (int64_t k = 0; k < gt_tensor_numel(&t); k++) {
        if (dt == GT_I64)
            ((int64_t *)t.data)[k] = (int64_t)cu_urand(&rng_state, lo, hi);
        else
            gt_tensor_set_f32(&t, k, (float)cu_urand(&rng_state, lo, hi));
    }
    return t;
}

static gt_tensor h_new(const gt_tensor *like)
{
    gt_tensor t;
    gt_error err = {0};
    GT_CHECK(gt_tensor_alloc(&t, like->dtype, like->ndim, like->shape, &err) == GT_OK);
    return t;
}

/* A device copy of host tensor h at byte offset `shift` * element size inside its allocation;
 * *base receives the allocation to free. */
static gt_tensor d_copy(const gt_tensor *h, int shift, void **base)
{
    gt_error err = {0};
    size_t es = gt_dtype_size(h->dtype), nb = gt_tensor_nbytes(h);
    GT_CHECK(gt_cuda_malloc(base, nb + 16, &err) == GT_OK);
    gt_tensor d;
    gt_tensor_wrap(&d, h->dtype, h->ndim, h->shape, (char *)*base + shift * es);
    if (nb) GT_CHECK(gt_cuda_memcpy_h2d(g_stream, d.data, h->data, nb, &err) == GT_OK);
    return d;
}

typedef struct {
    const char *name;
    gt_op op;
    int64_t i[GT_MAX_IATTR];
    double f[GT_MAX_FATTR];
    int64_t e[GT_MAX_EATTR];
    int ni, nf, ne, n_in, n_out;
    gt_tensor in[MAXT], out[MAXT];
    /* inputs whose outputs alias (adamw in place) are not used; scalars stay aligned */
    int fixed_in; /* inputs from this index on are never shifted */
} tcase;

static gt_kernel_call mk_call(tcase *c, gt_tensor *in, gt_tensor *out)
{
    return cu_kernel_call(c->op, c->i, c->ni, c->f, c->nf, c->e, c->ne, in, c->n_in, out, c->n_out);
}

/* Runs on the GPU with every tensor shifted by `shift` elements; results into res[]. */
static bool run_gpu(tcase *c, int shift, gt_tensor *res)
{
    gt_error err = {0};
    gt_tensor din[MAXT], dout[MAXT];
    void *bin[MAXT], *bout[MAXT];
    for (int k = 0; k < c->n_in; k++)
        din[k] = d_copy(&c->in[k], k >= c->fixed_in ? 0 : shift, &bin[k]);
    for (int k = 0; k < c->n_out; k++)
        dout[k] = d_copy(&c->out[k], shift, &bout[k]);
    gt_kernel_call call = mk_call(c, din, dout);
    gt_status st = gt_cuda_run_kernel(&call, g_stream, &err);
    if (st == GT_OK) st = gt_cuda_stream_sync(g_stream, &err);
    EXPECT(st == GT_OK, "%s: CUDA failed: %s", c->name, err.msg);
    for (int k = 0; k < c->n_out && st == GT_OK; k++) {
        res[k] = h_new(&c->out[k]);
        if (gt_tensor_nbytes(&res[k]))
            st = gt_cuda_memcpy_d2h(g_stream, res[k].data, dout[k].data, gt_tensor_nbytes(&res[k]),
                                    &err);
    }
    if (st == GT_OK) st = gt_cuda_stream_sync(g_stream, &err);
    for (int k = 0; k < c->n_in; k++)
        gt_cuda_free(bin[k]);
    for (int k = 0; k < c->n_out; k++)
        gt_cuda_free(bout[k]);
    return st == GT_OK;
}

/* CPU reference, GPU aligned, GPU shifted; tol < 0 means bitwise against the CPU. Frees c. */
static void check(tcase *c, double tol)
{
    gt_error err = {0};
    gt_tensor fast[MAXT], slow[MAXT];
    gt_kernel_call cpu = mk_call(c, c->in, c->out);
    /* out[] first serves as the device outputs' initial contents (zeros), then gets the CPU's. */
    for (int k = 0; k < c->n_out; k++)
        memset(c->out[k].data, 0, gt_tensor_nbytes(&c->out[k]));
    bool ok = run_gpu(c, 0, fast) && run_gpu(c, 1, slow);
    EXPECT(gt_cpu_run_kernel(&cpu, &err) == GT_OK, "%s: CPU: %s", c->name, err.msg);
    for (int k = 0; k < c->n_out && ok; k++) {
        bool same = memcmp(fast[k].data, slow[k].data, gt_tensor_nbytes(&fast[k])) == 0;
        double e = cu_rel_err(&fast[k], &c->out[k]);
        bool cpu_ok = tol < 0
                          ? memcmp(fast[k].data, c->out[k].data, gt_tensor_nbytes(&fast[k])) == 0
                          : e <= tol;
        printf("%-34s out %d: fast==general %s, vs CPU max rel %.2e (%s)\n", c->name, k,
               same ? "bitwise" : "DIFFER", e, tol < 0 ? "bitwise wanted" : "tolerance 1e-5");
        EXPECT(same, "%s: fast and general paths differ in output %d", c->name, k);
        EXPECT(cpu_ok, "%s: output %d differs from the CPU (rel %.3e)", c->name, k, e);
    }
    for (int k = 0; k < c->n_out && ok; k++) {
        gt_tensor_free(&fast[k]);
        gt_tensor_free(&slow[k]);
    }
    for (int k = 0; k < c->n_in; k++)
        gt_tensor_free(&c->in[k]);
    for (int k = 0; k < c->n_out; k++)
        gt_tensor_free(&c->out[k]);
}

static void cases(void)
{
    const gt_dtype fts[2] = {GT_F32, GT_BF16};
    const int64_t n = 100003; /* packs plus a ragged tail */
    for (int t = 0; t < 2; t++) {
        gt_dtype ft = fts[t];
        const gt_op bin[3] = {GT_OP_ADD, GT_OP_DIV, GT_OP_SILU_BACKWARD};
        for (int k = 0; k < 3; k++) {
            tcase c = {
                .name = gt_dtype_name(ft), .op = bin[k], .n_in = 2, .n_out = 1, .fixed_in = 9};
            c.name = k == 0   ? (t ? "add bf16" : "add f32")
                     : k == 1 ? (t ? "div bf16" : "div f32")
                              : (t ? "silu_backward bf16" : "silu_backward f32");
            c.in[0] = h_rand(ft, 2, SH(7, n / 7), -2, 2);
            c.in[1] = h_rand(ft, 2, SH(7, n / 7), 0.5, 2);
            c.out[0] = h_new(&c.in[0]);
            check(&c, ft == GT_F32 ? 1e-5 : 1e-2);
        }
        const gt_op un[4] = {GT_OP_SILU, GT_OP_EXP, GT_OP_SCALE, GT_OP_CLAMP};
        const char *un_f32[4] = {"silu f32", "exp f32", "scale f32", "clamp f32"};
        const char *un_bf[4] = {"silu bf16", "exp bf16", "scale bf16", "clamp bf16"};
        for (int k = 0; k < 4; k++) {
            tcase c = {.name = t ? un_bf[k] : un_f32[k],
                       .op = un[k],
                       .n_in = 1,
                       .n_out = 1,
                       .nf = un[k] == GT_OP_CLAMP ? 2 : 1,
                       .fixed_in = 9};
            c.f[0] = un[k] == GT_OP_CLAMP ? -0.5 : 0.37;
            c.f[1] = 0.5;
            c.in[0] = h_rand(ft, 1, SH(n), -3, 3);
            c.out[0] = h_new(&c.in[0]);
            check(&c, ft == GT_F32 ? 1e-5 : 1e-2);
        }
    }
    const gt_dtype casts[3][2] = {{GT_F32, GT_BF16}, {GT_BF16, GT_F32}, {GT_F32, GT_F16}};
    const char *cast_names[3] = {"cast f32->bf16", "cast bf16->f32", "cast f32->f16"};
    for (int k = 0; k < 3; k++) {
        tcase c = {
            .name = cast_names[k], .op = GT_OP_CAST, .n_in = 1, .n_out = 1, .ni = 1, .fixed_in = 9};
        c.i[0] = casts[k][1];
        c.in[0] = h_rand(casts[k][0], 1, SH(n), -100, 100);
        gt_tensor like = c.in[0];
        like.dtype = casts[k][1];
        c.out[0] = h_new(&like);
        check(&c, -1);
    }
    {
        tcase c = {.name = "full bf16",
                   .op = GT_OP_FULL,
                   .n_out = 1,
                   .ni = 1,
                   .nf = 1,
                   .ne = 1,
                   .fixed_in = 9};
        c.i[0] = GT_BF16;
        c.f[0] = 1.7;
        c.e[0] = n;
        gt_tensor like = h_rand(GT_BF16, 1, SH(n), 0, 1);
        c.out[0] = h_new(&like);
        gt_tensor_free(&like);
        check(&c, -1);
    }
    {
        /* AdamW in f32: bitwise equal to the CPU on both paths. scalars/clip stay aligned. The
         * same update from a bf16 gradient too (what the optimizer reads once the fusion pass
         * drops the gradient's widening cast): bitwise the CPU's, which widens it first. */
        for (int bf = 0; bf < 2; bf++) {
            tcase c = {.name = bf ? "adamw f32, bf16 grad" : "adamw f32",
                       .op = GT_OP_ADAMW,
                       .n_in = 6,
                       .n_out = 3,
                       .nf = 4,
                       .fixed_in = 4};
            c.f[0] = 0.9;
            c.f[1] = 0.95;
            c.f[2] = 1e-8;
            c.f[3] = 0.1;
            c.in[0] = h_rand(GT_F32, 2, SH(3, n / 3), -1, 1);
            c.in[1] = h_rand(bf ? GT_BF16 : GT_F32, 2, SH(3, n / 3), -1e-2, 1e-2);
            c.in[2] = h_rand(GT_F32, 2, SH(3, n / 3), -1e-3, 1e-3);
            c.in[3] = h_rand(GT_F32, 2, SH(3, n / 3), 0, 1e-5);
            c.in[4] = h_rand(GT_F32, 1, SH(3), 0, 1);
            gt_tensor_set_f32(&c.in[4], 0, 8e-4f);
            gt_tensor_set_f32(&c.in[4], 1, 0.19f);
            gt_tensor_set_f32(&c.in[4], 2, 0.0975f);
            c.in[5] = h_rand(GT_F32, 1, SH(1), 0.5, 0.5);
            for (int k = 0; k < 3; k++)
                c.out[k] = h_new(&c.in[0]);
            check(&c, -1);
        }
    }
    const gt_dtype lts[2] = {GT_BF16, GT_F32};
    for (int t = 0; t < 2; t++) {
        tcase a = {.name = t ? "transpose [b,s,h,d]->[b,h,s,d] f32" : "transpose [b,s,h,d] bf16",
                   .op = GT_OP_TRANSPOSE,
                   .n_in = 1,
                   .n_out = 1,
                   .ni = 2,
                   .i = {1, 2},
                   .fixed_in = 0};
        a.in[0] = h_rand(lts[t], 4, SH(2, 37, 5, 64), -1, 1);
        a.out[0] = h_rand(lts[t], 4, SH(2, 5, 37, 64), 0, 0);
        check(&a, -1);
        tcase b = {.name = t ? "transpose 2D (tiles) f32" : "transpose 2D (tiles) bf16",
                   .op = GT_OP_TRANSPOSE,
                   .n_in = 1,
                   .n_out = 1,
                   .ni = 2,
                   .i = {0, 1},
                   .fixed_in = 0};
        b.in[0] = h_rand(lts[t], 3, SH(67, 3, 45), -1, 1);
        b.i[1] = 2;
        b.out[0] = h_rand(lts[t], 3, SH(45, 3, 67), 0, 0);
        check(&b, -1);
        tcase p = {.name = t ? "permute (2,0,3,1) f32" : "permute (2,0,3,1) bf16",
                   .op = GT_OP_PERMUTE,
                   .n_in = 1,
                   .n_out = 1,
                   .ni = 4,
                   .i = {2, 0, 3, 1},
                   .fixed_in = 0};
        p.in[0] = h_rand(lts[t], 4, SH(3, 40, 6, 33), -1, 1);
        p.out[0] = h_rand(lts[t], 4, SH(6, 3, 33, 40), 0, 0);
        check(&p, -1);
        tcase bc = {.name = t ? "broadcast_to f32" : "broadcast_to bf16",
                    .op = GT_OP_BROADCAST_TO,
                    .n_in = 1,
                    .n_out = 1,
                    .ne = 3,
                    .e = {5, 40, 33},
                    .fixed_in = 0};
        bc.in[0] = h_rand(lts[t], 2, SH(40, 1), -1, 1);
        bc.out[0] = h_rand(lts[t], 3, SH(5, 40, 33), 0, 0);
        check(&bc, -1);
        const int64_t dims[2] = {64, 5};
        for (int k = 0; k < 2; k++) {
            tcase e = {.name = t ? "embedding f32" : "embedding bf16",
                       .op = GT_OP_EMBEDDING,
                       .n_in = 2,
                       .n_out = 1,
                       .fixed_in = 1};
            e.in[0] = h_rand(lts[t], 2, SH(300, dims[k]), -1, 1);
            e.in[1] = h_rand(GT_I64, 2, SH(4, 77), 0, 300);
            e.out[0] = h_rand(lts[t], 3, SH(4, 77, dims[k]), 0, 0);
            check(&e, -1);
        }
    }
    {
        /* Vocabulary 3000 -> 12-bit keys -> 2 radix passes; many repeats of each id. */
        tcase e = {.name = "embedding_backward f32",
                   .op = GT_OP_EMBEDDING_BACKWARD,
                   .n_in = 2,
                   .n_out = 1,
                   .ne = 1,
                   .e = {3000},
                   .fixed_in = 0};
        e.in[0] = h_rand(GT_I64, 2, SH(5, 1999), 0, 300);
        for (int64_t k = 0; k < 9995; k += 7)
            ((int64_t *)e.in[0].data)[k] = 2999 - k % 2000; /* spread over the vocabulary */
        e.in[1] = h_rand(GT_F32, 3, SH(5, 1999, 40), -1, 1);
        e.out[0] = h_rand(GT_F32, 2, SH(3000, 40), 0, 0);
        check(&e, -1);
        tcase b = {.name = "embedding_backward bf16",
                   .op = GT_OP_EMBEDDING_BACKWARD,
                   .n_in = 2,
                   .n_out = 1,
                   .ne = 1,
                   .e = {70000},
                   .fixed_in = 0};
        b.in[0] = h_rand(GT_I64, 1, SH(3000), 0, 70000); /* 17-bit keys: 3 passes */
        for (int64_t k = 0; k < 3000; k += 3)
            ((int64_t *)b.in[0].data)[k] = 69999 - k % 11;
        b.in[1] = h_rand(GT_BF16, 2, SH(3000, 24), -1, 1);
        b.out[0] = h_rand(GT_BF16, 2, SH(70000, 24), 0, 0);
        check(&b, 1e-2);
    }
}

/* ---------------------------------------------------------------- --bench (prints, never asserts)
 */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void dev_alloc(gt_tensor *t, gt_dtype dt, int nd, const int64_t *shape, double fill)
{
    gt_error err = {0};
    GT_CHECK(gt_cuda_tensor_alloc(t, dt, nd, shape, &err) == GT_OK);
    /* Fill through the full kernel so that values are finite. */
    int64_t e[GT_MAX_DIMS];
    memcpy(e, shape, sizeof(int64_t) * (size_t)nd);
    int64_t ia[1] = {dt};
    double fa[1] = {fill};
    gt_kernel_call k = {
        .op = GT_OP_FULL, .i = ia, .ni = 1, .f = fa, .nf = 1, .e = e, .ne = nd, .n_out = 1};
    k.out[0] = t;
    GT_CHECK(gt_cuda_run_kernel(&k, g_stream, &err) == GT_OK);
}

static void bench_call(const char *name, gt_kernel_call *k, double bytes)
{
    gt_error err = {0};
    GT_CHECK(gt_cuda_run_kernel(k, g_stream, &err) == GT_OK);
    GT_CHECK(gt_cuda_stream_sync(g_stream, &err) == GT_OK);
    int reps = 10;
    double t0 = now_s();
    for (int r = 0; r < reps; r++)
        GT_CHECK(gt_cuda_run_kernel(k, g_stream, &err) == GT_OK);
    GT_CHECK(gt_cuda_stream_sync(g_stream, &err) == GT_OK);
    double dt = (now_s() - t0) / reps;
    printf("BENCH %-52s %9.3f ms  %8.1f GB/s\n", name, dt * 1e3, bytes / dt * 1e-9);
}

static void bench(void)
{
    gt_tensor a, b, o, m, v, sc, cl, ids;
    /* adamw f32 over [2048, 8192] and [128256, 2048]: reads p g m v, writes p m v (in place). */
    const int64_t ad[2][2] = {{2048, 8192}, {128256, 2048}};
    for (int k = 0; k < 2; k++) {
        dev_alloc(&a, GT_F32, 2, ad[k], 0.5);
        dev_alloc(&b, GT_F32, 2, ad[k], 1e-3);
        dev_alloc(&m, GT_F32, 2, ad[k], 1e-4);
        dev_alloc(&v, GT_F32, 2, ad[k], 1e-6);
        dev_alloc(&sc, GT_F32, 1, SH(3), 0.5);
        dev_alloc(&cl, GT_F32, 1, SH(1), 1.0);
        double fa[4] = {0.9, 0.95, 1e-8, 0.1};
        gt_kernel_call c = {.op = GT_OP_ADAMW, .f = fa, .nf = 4, .n_in = 6, .n_out = 3};
        c.in[0] = &a;
        c.in[1] = &b;
        c.in[2] = &m;
        c.in[3] = &v;
        c.in[4] = &sc;
        c.in[5] = &cl;
        c.out[0] = &a;
        c.out[1] = &m;
        c.out[2] = &v;
        char name[96];
        snprintf(name, sizeof name, "adamw f32 [%lld, %lld]", (long long)ad[k][0],
                 (long long)ad[k][1]);
        bench_call(name, &c, 7.0 * 4 * (double)(ad[k][0] * ad[k][1]));
        gt_cuda_tensor_free(&a);
        gt_cuda_tensor_free(&b);
        gt_cuda_tensor_free(&m);
        gt_cuda_tensor_free(&v);
        gt_cuda_tensor_free(&sc);
        gt_cuda_tensor_free(&cl);
    }
    /* silu and mul over [16384, 8192] bf16, silu_backward too. */
    dev_alloc(&a, GT_BF16, 2, SH(16384, 8192), 0.5);
    dev_alloc(&b, GT_BF16, 2, SH(16384, 8192), 0.25);
    dev_alloc(&o, GT_BF16, 2, SH(16384, 8192), 0);
    double nel = 16384.0 * 8192.0;
    gt_kernel_call u = {.op = GT_OP_SILU, .n_in = 1, .n_out = 1};
    u.in[0] = &a;
    u.out[0] = &o;
    bench_call("silu bf16 [16384, 8192]", &u, 2 * 2 * nel);
    gt_kernel_call mm = {.op = GT_OP_MUL, .n_in = 2, .n_out = 1};
    mm.in[0] = &a;
    mm.in[1] = &b;
    mm.out[0] = &o;
    bench_call("mul bf16 [16384, 8192]", &mm, 3 * 2 * nel);
    mm.op = GT_OP_SILU_BACKWARD;
    bench_call("silu_backward bf16 [16384, 8192]", &mm, 3 * 2 * nel);
    gt_cuda_tensor_free(&a);
    gt_cuda_tensor_free(&b);
    gt_cuda_tensor_free(&o);
    /* cast f32 -> bf16 of [128256, 2048]. */
    dev_alloc(&a, GT_F32, 2, SH(128256, 2048), 0.3);
    dev_alloc(&o, GT_BF16, 2, SH(128256, 2048), 0);
    int64_t ci[1] = {GT_BF16};
    gt_kernel_call cc = {.op = GT_OP_CAST, .i = ci, .ni = 1, .n_in = 1, .n_out = 1};
    cc.in[0] = &a;
    cc.out[0] = &o;
    bench_call("cast f32->bf16 [128256, 2048]", &cc, 6.0 * 128256 * 2048);
    gt_cuda_tensor_free(&a);
    gt_cuda_tensor_free(&o);
    /* transpose [8,2048,32,64] -> [8,32,2048,64] bf16, and a 2D [8192, 2048] bf16 tile transpose */
    dev_alloc(&a, GT_BF16, 4, SH(8, 2048, 32, 64), 0.3);
    dev_alloc(&o, GT_BF16, 4, SH(8, 32, 2048, 64), 0);
    int64_t ti[2] = {1, 2};
    gt_kernel_call tc = {.op = GT_OP_TRANSPOSE, .i = ti, .ni = 2, .n_in = 1, .n_out = 1};
    tc.in[0] = &a;
    tc.out[0] = &o;
    bench_call("transpose bf16 [8,2048,32,64] dims 1,2", &tc, 4.0 * 8 * 2048 * 32 * 64);
    gt_cuda_tensor_free(&a);
    gt_cuda_tensor_free(&o);
    dev_alloc(&a, GT_BF16, 2, SH(8192, 2048), 0.3);
    dev_alloc(&o, GT_BF16, 2, SH(2048, 8192), 0);
    ti[0] = 0;
    ti[1] = 1;
    bench_call("transpose bf16 [8192, 2048] (tiles)", &tc, 4.0 * 8192 * 2048);
    gt_cuda_tensor_free(&a);
    gt_cuda_tensor_free(&o);
    /* embedding fwd / backward: ids 16384 (every 7th token the same id), vocab 128256, dim 2048. */
    gt_tensor hid;
    gt_error err = {0};
    GT_CHECK(gt_tensor_alloc(&hid, GT_I64, 2, SH(8, 2048), &err) == GT_OK);
    for (int64_t k = 0; k < 16384; k++)
        ((int64_t *)hid.data)[k] = k % 7 == 0 ? 128000 : (int64_t)cu_urand(&rng_state, 0, 128256);
    GT_CHECK(gt_cuda_tensor_upload(g_stream, &hid, &ids, &err) == GT_OK);
    dev_alloc(&a, GT_BF16, 2, SH(128256, 2048), 0.3);
    dev_alloc(&o, GT_BF16, 3, SH(8, 2048, 2048), 0);
    gt_kernel_call ef = {.op = GT_OP_EMBEDDING, .n_in = 2, .n_out = 1};
    ef.in[0] = &a;
    ef.in[1] = &ids;
    ef.out[0] = &o;
    bench_call("embedding bf16 ids [8,2048] dim 2048", &ef, 2.0 * 2 * 16384 * 2048);
    gt_cuda_tensor_free(&a);
    dev_alloc(&a, GT_F32, 2, SH(128256, 2048), 0);
    int64_t ee[1] = {128256};
    gt_kernel_call eb = {.op = GT_OP_EMBEDDING_BACKWARD, .e = ee, .ne = 1, .n_in = 2, .n_out = 1};
    eb.in[0] = &ids;
    eb.in[1] = &o;
    eb.out[0] = &a;
    bench_call("embedding_backward bf16 dy -> f32 dw [128256, 2048]", &eb,
               2.0 * 16384 * 2048 + 4.0 * 128256 * 2048);
    gt_cuda_tensor_free(&a);
    gt_cuda_tensor_free(&o);
    gt_cuda_tensor_free(&ids);
    gt_tensor_free(&hid);
}

int main(int argc, char **argv)
{
    if (gt_cuda_device_count() == 0) {
        printf("no CUDA device: skipped\n");
        return 0;
    }
    gt_error err = {0};
    EXPECT_OK(gt_cuda_init(0, NULL, &err), &err);
    EXPECT_OK(gt_cuda_stream_create(&g_stream, &err), &err);
    cases();
    if (argc > 1 && strcmp(argv[1], "--bench") == 0) bench();
    gt_cuda_stream_destroy(g_stream);
    return gt_test_finish();
}
