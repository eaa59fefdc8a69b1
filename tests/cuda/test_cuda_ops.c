/* test_cuda_ops.c — CUDA vs CPU conformance for every op in gt_ops.def.
 *
 * Each case builds random inputs, runs the CPU kernel (the reference: itself tested against naive
 * double references in tests/ops) and the CUDA kernel twice, and checks:
 *   - accuracy: max |gpu - cpu| / max |cpu| over each output within the stated bound: 1e-5 for
 *     f32; for bf16 (same bf16 inputs on both sides, outputs rounded to bf16) 1e-2, i.e. about two
 *     bf16 ulps at the largest value: a last-bit difference of the f32 computations can move a
 *     rounded bf16 output by one ulp;
 *   - determinism: the two GPU runs give identical bits;
 *   - coverage: the device outputs are pre-filled with different byte patterns before each run,
 *     so identical bits also prove that every output element was written.
 * Every case prints one line: op, dtype, max relative error per output, the bound, and whether the
 * runs were bitwise identical. Without a CUDA device the test skips (exit 0). */
#include "cuda_test_util.h"
#include "graphtrain/gt_cuda.h"
#include "gt_test.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define SH(...) ((const int64_t[]){__VA_ARGS__})

static uint64_t rng_state = 0x1234567887654321ull;

/* One kernel call with host tensors. */
typedef struct {
    const char *name;
    gt_op op;
    int64_t i[GT_MAX_IATTR];
    double f[GT_MAX_FATTR];
    int64_t e[GT_MAX_EATTR];
    int ni, nf, ne;
    int n_in, n_out;
    gt_tensor in[GT_MAX_IN], out[GT_MAX_OUT];
} tcase;

static gt_cuda_stream *g_stream;

/* Uniform in [lo, hi) from this test's stream. */
static gt_tensor t_rand(gt_dtype dt, int ndim, const int64_t *shape, double lo, double hi)
{
    return cu_tensor_rand(&rng_state, dt, ndim, shape, lo, hi);
}

/* Ids in [lo, hi) from this test's stream. */
static gt_tensor t_ids(gt_dtype dt, int ndim, const int64_t *shape, int64_t lo, int64_t hi)
{
    return cu_tensor_ids(&rng_state, dt, ndim, shape, lo, hi, 0, 0);
}

static void tc_free(tcase *c)
{
    for (int k = 0; k < c->n_in; k++)
        gt_tensor_free(&c->in[k]);
    for (int k = 0; k < c->n_out; k++)
        gt_tensor_free(&c->out[k]);
}

static gt_kernel_call tc_call(const tcase *c, gt_tensor *in, gt_tensor *out)
{
    return cu_kernel_call(c->op, c->i, c->ni, c->f, c->nf, c->e, c->ne, in, c->n_in, out, c->n_out);
}

/* Runs the case on CPU and twice on GPU and checks it; frees the case. */
static void check(tcase *c, double tol)
{
    gt_error err = {0};
    gt_kernel_call cpu = tc_call(c, c->in, c->out);
    gt_status st = gt_cpu_run_kernel(&cpu, &err);
    EXPECT(st == GT_OK, "%s: CPU reference failed: %s", c->name, err.msg);
    if (st != GT_OK) {
        tc_free(c);
        return;
    }
    gt_tensor din[GT_MAX_IN], dout[GT_MAX_OUT], run1[GT_MAX_OUT], run2[GT_MAX_OUT];
    for (int k = 0; k < c->n_in; k++)
        GT_CHECK(gt_cuda_tensor_upload(g_stream, &c->in[k], &din[k], &err) == GT_OK);
    for (int k = 0; k < c->n_out; k++) {
        GT_CHECK(gt_cuda_tensor_alloc(&dout[k], c->out[k].dtype, c->out[k].ndim, c->out[k].shape,
                                      &err) == GT_OK);
        run1[k] = cu_tensor_new(c->out[k].dtype, c->out[k].ndim, c->out[k].shape);
        run2[k] = cu_tensor_new(c->out[k].dtype, c->out[k].ndim, c->out[k].shape);
    }
    gt_kernel_call gpu = tc_call(c, din, dout);
    bool ran = true;
    for (int rep = 0; rep < 2 && ran; rep++) {
        for (int k = 0; k < c->n_out; k++)
            ran &= cu_fill_pattern(g_stream, &dout[k], rep == 0 ? 0xff : 0x5a);
        st = gt_cuda_run_kernel(&gpu, g_stream, &err);
        if (st == GT_OK) st = gt_cuda_stream_sync(g_stream, &err);
        EXPECT(st == GT_OK, "%s: CUDA kernel failed: %s", c->name, err.msg);
        ran &= st == GT_OK;
        for (int k = 0; k < c->n_out && ran; k++)
            ran &= gt_cuda_tensor_download(g_stream, &dout[k], rep == 0 ? &run1[k] : &run2[k],
                                           &err) == GT_OK;
    }
    if (ran) {
        bool bitwise = true;
        char line[512];
        int len = snprintf(line, sizeof line, "%-28s", c->name);
        for (int k = 0; k < c->n_out; k++) {
            bitwise &= memcmp(run1[k].data, run2[k].data, gt_tensor_nbytes(&run1[k])) == 0;
            bool is_int = !gt_dtype_is_float(c->out[k].dtype);
            double e = is_int
                           ? (memcmp(run1[k].data, c->out[k].data, gt_tensor_nbytes(&run1[k])) == 0
                                  ? 0.0
                                  : INFINITY)
                           : cu_rel_err(&run1[k], &c->out[k]);
            if (len < (int)sizeof line - 40)
                len += snprintf(line + len, sizeof line - (size_t)len, " out%d %.2e", k, e);
            EXPECT(e <= tol, "%s: output %d max rel err %.3e above %.1e", c->name, k, e, tol);
        }
        printf("%s  (bound %.0e)  %s\n", line, tol, bitwise ? "bitwise-identical" : "DIFFER");
        EXPECT(bitwise, "%s: two GPU runs differ (or an output element is not written)", c->name);
    }
    for (int k = 0; k < c->n_in; k++)
        gt_cuda_tensor_free(&din[k]);
    for (int k = 0; k < c->n_out; k++) {
        gt_cuda_tensor_free(&dout[k]);
        gt_tensor_free(&run1[k]);
        gt_tensor_free(&run2[k]);
    }
    tc_free(c);
}

static double tol_of(gt_dtype ft)
{
    return ft == GT_F32 ? 1e-5 : 1e-2;
}

/* "op dtype" in one of a ring of buffers (a case's name must outlive the next case built). */
static const char *nm(const char *op, gt_dtype ft)
{
    static char names[8][64];
    static int next;
    char *b = names[next++ % 8];
    snprintf(b, 64, "%s %s", op, gt_dtype_name(ft));
    return b;
}

/* ---------------------------------------------------------------- cases */

static void case_elementwise(gt_dtype ft)
{
    const gt_op bin[5] = {GT_OP_ADD, GT_OP_SUB, GT_OP_MUL, GT_OP_DIV, GT_OP_SILU_BACKWARD};
    const char *bn[5] = {"add", "sub", "mul", "div", "silu_backward"};
    for (int k = 0; k < 5; k++) {
        tcase c = {.name = nm(bn[k], ft), .op = bin[k], .n_in = 2, .n_out = 1};
        c.in[0] = t_rand(ft, 3, SH(4, 1, 6), -2, 2);
        c.in[1] = t_rand(ft, 2, SH(3, 6), 0.5, 2);
        c.out[0] = cu_tensor_new(ft, 3, SH(4, 3, 6));
        check(&c, tol_of(ft));
    }
    const gt_op un[10] = {GT_OP_NEG,  GT_OP_EXP,     GT_OP_LOG,   GT_OP_SQRT,       GT_OP_RSQRT,
                          GT_OP_SILU, GT_OP_SIGMOID, GT_OP_SCALE, GT_OP_ADD_SCALAR, GT_OP_CLAMP};
    const char *un_n[10] = {"neg",  "exp",     "log",   "sqrt",       "rsqrt",
                            "silu", "sigmoid", "scale", "add_scalar", "clamp"};
    for (int k = 0; k < 10; k++) {
        tcase c = {.name = nm(un_n[k], ft), .op = un[k], .n_in = 1, .n_out = 1, .nf = 2};
        c.f[0] = un[k] == GT_OP_CLAMP ? -0.5 : 0.37;
        c.f[1] = 0.5;
        bool pos = un[k] == GT_OP_LOG || un[k] == GT_OP_SQRT || un[k] == GT_OP_RSQRT;
        c.in[0] = t_rand(ft, 2, SH(33, 65), pos ? 0.1 : -3, 3);
        c.out[0] = cu_tensor_new(ft, 2, SH(33, 65));
        check(&c, tol_of(ft));
    }
    tcase c = {.name = nm("full", ft), .op = GT_OP_FULL, .n_out = 1, .ni = 1, .nf = 1, .ne = 2};
    c.i[0] = ft;
    c.f[0] = 1.7;
    c.e[0] = 3;
    c.e[1] = 5;
    c.out[0] = cu_tensor_new(ft, 2, SH(3, 5));
    check(&c, 0.0);
}

static void case_cast(void)
{
    const gt_dtype pairs[6][2] = {{GT_F32, GT_BF16}, {GT_BF16, GT_F32}, {GT_F32, GT_F16},
                                  {GT_F32, GT_I32},  {GT_I64, GT_F32},  {GT_I32, GT_I64}};
    for (int k = 0; k < 6; k++) {
        char name[64];
        snprintf(name, sizeof name, "cast %s->%s", gt_dtype_name(pairs[k][0]),
                 gt_dtype_name(pairs[k][1]));
        tcase c = {.name = name, .op = GT_OP_CAST, .n_in = 1, .n_out = 1, .ni = 1};
        c.i[0] = pairs[k][1];
        c.in[0] = gt_dtype_is_float(pairs[k][0]) ? t_rand(pairs[k][0], 2, SH(7, 9), -100, 100)
                                                 : t_ids(pairs[k][0], 2, SH(7, 9), -1000, 1000);
        c.out[0] = cu_tensor_new(pairs[k][1], 2, SH(7, 9));
        check(&c, 0.0); /* conversions are exact functions of the input: bitwise */
    }
}

static void case_reduce(gt_dtype ft)
{
    const gt_op ops[3] = {GT_OP_SUM, GT_OP_MEAN, GT_OP_MAX};
    const char *names[3] = {"sum", "mean", "max"};
    for (int k = 0; k < 3; k++) {
        tcase c = {.name = nm(names[k], ft), .op = ops[k], .n_in = 1, .n_out = 1, .ni = 2};
        c.i[0] = 0;
        c.i[1] = 1;
        c.in[0] = t_rand(ft, 3, SH(5, 37, 6), -1, 1);
        c.out[0] = cu_tensor_new(ft, 2, SH(5, 6));
        check(&c, tol_of(ft));
        tcase d = {.name = nm(names[k], ft), .op = ops[k], .n_in = 1, .n_out = 1, .ni = 3};
        d.i[0] = 1;
        d.i[1] = 0;
        d.i[2] = 2;
        d.in[0] = t_rand(ft, 3, SH(50, 3, 40), -1, 1);
        d.out[0] = cu_tensor_new(ft, 3, SH(1, 3, 1));
        check(&d, tol_of(ft));
    }
    tcase m = {
        .name = nm("max_backward", ft), .op = GT_OP_MAX_BACKWARD, .n_in = 3, .n_out = 1, .ni = 2};
    m.i[0] = 1;
    m.i[1] = 1;
    m.in[0] = t_rand(ft, 2, SH(9, 50), -1, 1);
    /* y = max of x from the CPU kernel, so both sides route to the same element. */
    m.in[1] = cu_tensor_new(ft, 2, SH(9, 1));
    {
        gt_error err = {0};
        gt_kernel_call k = {.op = GT_OP_MAX, .i = m.i, .ni = 2, .n_in = 1, .n_out = 1};
        k.in[0] = &m.in[0];
        k.out[0] = &m.in[1];
        GT_CHECK(gt_cpu_run_kernel(&k, &err) == GT_OK);
    }
    m.in[2] = t_rand(ft, 2, SH(9, 1), -1, 1);
    m.out[0] = cu_tensor_new(ft, 2, SH(9, 50));
    check(&m, tol_of(ft));
    tcase b = {.name = nm("broadcast_to", ft),
               .op = GT_OP_BROADCAST_TO,
               .n_in = 1,
               .n_out = 1,
               .ne = 3,
               .e = {2, 3, 4}};
    b.in[0] = t_rand(ft, 2, SH(3, 1), -1, 1);
    b.out[0] = cu_tensor_new(ft, 3, SH(2, 3, 4));
    check(&b, 0.0);
    tcase s = {
        .name = nm("sum_to", ft), .op = GT_OP_SUM_TO, .n_in = 1, .n_out = 1, .ne = 2, .e = {3, 1}};
    s.in[0] = t_rand(ft, 3, SH(20, 3, 40), -1, 1);
    s.out[0] = cu_tensor_new(ft, 2, SH(3, 1));
    check(&s, tol_of(ft));
}

static void case_layout(gt_dtype ft)
{
    tcase r = {.name = nm("reshape", ft),
               .op = GT_OP_RESHAPE,
               .n_in = 1,
               .n_out = 1,
               .ne = 2,
               .e = {3, 4}};
    r.in[0] = t_rand(ft, 2, SH(2, 6), -1, 1);
    r.out[0] = cu_tensor_new(ft, 2, SH(3, 4));
    check(&r, 0.0);
    /* regroup: the batch of 6 rows as 2 blocks of 3 (the numel checked by the kernel) */
    tcase rg = {.name = nm("regroup", ft),
                .op = GT_OP_REGROUP,
                .n_in = 1,
                .n_out = 1,
                .ne = 3,
                .e = {2, 3, 4}};
    rg.in[0] = t_rand(ft, 2, SH(6, 4), -1, 1);
    rg.out[0] = cu_tensor_new(ft, 3, SH(2, 3, 4));
    check(&rg, 0.0);
    tcase t = {.name = nm("transpose", ft),
               .op = GT_OP_TRANSPOSE,
               .n_in = 1,
               .n_out = 1,
               .ni = 2,
               .i = {0, 2}};
    t.in[0] = t_rand(ft, 3, SH(2, 3, 4), -1, 1);
    t.out[0] = cu_tensor_new(ft, 3, SH(4, 3, 2));
    check(&t, 0.0);
    tcase p = {.name = nm("permute", ft),
               .op = GT_OP_PERMUTE,
               .n_in = 1,
               .n_out = 1,
               .ni = 4,
               .i = {2, 0, 3, 1}};
    p.in[0] = t_rand(ft, 4, SH(2, 3, 4, 5), -1, 1);
    p.out[0] = cu_tensor_new(ft, 4, SH(4, 2, 5, 3));
    check(&p, 0.0);
    tcase sl = {.name = nm("slice", ft),
                .op = GT_OP_SLICE,
                .n_in = 1,
                .n_out = 1,
                .ni = 1,
                .i = {1},
                .ne = 2,
                .e = {1, 4}};
    sl.in[0] = t_rand(ft, 3, SH(2, 5, 3), -1, 1);
    sl.out[0] = cu_tensor_new(ft, 3, SH(2, 3, 3));
    check(&sl, 0.0);
    tcase sb = {.name = nm("slice_backward", ft),
                .op = GT_OP_SLICE_BACKWARD,
                .n_in = 1,
                .n_out = 1,
                .ni = 1,
                .i = {1},
                .ne = 3,
                .e = {1, 4, 5}};
    sb.in[0] = t_rand(ft, 3, SH(2, 3, 3), -1, 1);
    sb.out[0] = cu_tensor_new(ft, 3, SH(2, 5, 3));
    check(&sb, 0.0);
    tcase cc = {
        .name = nm("concat", ft), .op = GT_OP_CONCAT, .n_in = 3, .n_out = 1, .ni = 1, .i = {1}};
    cc.in[0] = t_rand(ft, 3, SH(2, 1, 3), -1, 1);
    cc.in[1] = t_rand(ft, 3, SH(2, 4, 3), -1, 1);
    cc.in[2] = t_rand(ft, 3, SH(2, 2, 3), -1, 1);
    cc.out[0] = cu_tensor_new(ft, 3, SH(2, 7, 3));
    check(&cc, 0.0);
    tcase sp = {.name = nm("split", ft),
                .op = GT_OP_SPLIT,
                .n_in = 1,
                .n_out = 3,
                .ni = 1,
                .i = {2},
                .ne = 3,
                .e = {2, 3, 1}};
    sp.in[0] = t_rand(ft, 3, SH(2, 3, 6), -1, 1);
    sp.out[0] = cu_tensor_new(ft, 3, SH(2, 3, 2));
    sp.out[1] = cu_tensor_new(ft, 3, SH(2, 3, 3));
    sp.out[2] = cu_tensor_new(ft, 3, SH(2, 3, 1));
    check(&sp, 0.0);
    /* Wide copies: 16-byte units with row pitches (FSDP's bucket concat and unpack), and a
     * contiguous copy of many blocks. */
    tcase cw = {.name = nm("concat wide", ft),
                .op = GT_OP_CONCAT,
                .n_in = 2,
                .n_out = 1,
                .ni = 1,
                .i = {1}};
    cw.in[0] = t_rand(ft, 2, SH(4, 1024), -1, 1);
    cw.in[1] = t_rand(ft, 2, SH(4, 3072), -1, 1);
    cw.out[0] = cu_tensor_new(ft, 2, SH(4, 4096));
    check(&cw, 0.0);
    tcase sw = {.name = nm("slice wide", ft),
                .op = GT_OP_SLICE,
                .n_in = 1,
                .n_out = 1,
                .ni = 1,
                .i = {1},
                .ne = 2,
                .e = {1024, 3072}};
    sw.in[0] = t_rand(ft, 2, SH(3, 4096), -1, 1);
    sw.out[0] = cu_tensor_new(ft, 2, SH(3, 2048));
    check(&sw, 0.0);
    tcase rw = {.name = nm("reshape wide", ft),
                .op = GT_OP_RESHAPE,
                .n_in = 1,
                .n_out = 1,
                .ne = 2,
                .e = {2048, 512}};
    rw.in[0] = t_rand(ft, 2, SH(512, 2048), -1, 1);
    rw.out[0] = cu_tensor_new(ft, 2, SH(2048, 512));
    check(&rw, 0.0);
    tcase em = {.name = nm("embedding", ft), .op = GT_OP_EMBEDDING, .n_in = 2, .n_out = 1};
    em.in[0] = t_rand(ft, 2, SH(50, 24), -1, 1);
    em.in[1] = t_ids(GT_I32, 2, SH(3, 7), 0, 50);
    em.out[0] = cu_tensor_new(ft, 3, SH(3, 7, 24));
    check(&em, 0.0);
    tcase eb = {.name = nm("embedding_backward", ft),
                .op = GT_OP_EMBEDDING_BACKWARD,
                .n_in = 2,
                .n_out = 1,
                .ne = 1,
                .e = {40}};
    eb.in[0] = t_ids(GT_I64, 2, SH(3, 300), 0, 40); /* many repeats, > one 256-id chunk */
    eb.in[1] = t_rand(ft, 3, SH(3, 300, 24), -1, 1);
    eb.out[0] = cu_tensor_new(ft, 2, SH(40, 24));
    check(&eb, tol_of(ft));
}

static void case_matmul(gt_dtype ft)
{
    struct {
        int ta, tb, ra, rb;
        int64_t as[4], bs[4], os[4];
    } m[7] = {
        {0, 0, 4, 4, {2, 3, 17, 33}, {2, 3, 33, 19}, {2, 3, 17, 19}},
        {1, 1, 3, 3, {2, 33, 17}, {2, 19, 33}, {2, 17, 19}},
        {0, 1, 3, 2, {3, 17, 64}, {40, 64}, {3, 17, 40}},
        {1, 0, 3, 2, {3, 64, 17}, {64, 40}, {3, 17, 40}},
        {0, 0, 2, 2, {128, 96}, {96, 80}, {128, 80}},
        /* the MoE router's weight gradient (f32: split along k, cuda_matmul.cu), and a k that
         * no chunk count divides into runs of 256 (unsplit) */
        {1, 0, 2, 2, {16384, 8}, {16384, 256}, {8, 256}},
        {1, 0, 2, 2, {8209, 8}, {8209, 24}, {8, 24}},
    };
    for (int k = 0; k < 7; k++) {
        tcase c = {.name = nm("matmul", ft), .op = GT_OP_MATMUL, .n_in = 2, .n_out = 1, .ni = 2};
        c.i[0] = m[k].ta;
        c.i[1] = m[k].tb;
        c.in[0] = t_rand(ft, m[k].ra, m[k].as, -1, 1);
        c.in[1] = t_rand(ft, m[k].rb, m[k].bs, -1, 1);
        c.out[0] = cu_tensor_new(ft, m[k].ra, m[k].os);
        check(&c, tol_of(ft));
    }
}

static int g_drains;

/* A stream drain that counts its calls (gt_cuda_stream_set_drain). */
static gt_status counting_drain(void *user, gt_error *err)
{
    g_drains++;
    return gt_cuda_stream_sync((gt_cuda_stream *)user, err);
}

/* Runs the matmul `call` (output dout) on stream s into a fresh host tensor. */
static gt_tensor tune_run(gt_cuda_stream *s, const gt_kernel_call *call, gt_tensor *dout, int r)
{
    gt_error err = {0};
    gt_tensor host = cu_tensor_new(GT_BF16, 2, dout->shape);
    GT_CHECK(cu_fill_pattern(s, dout, (unsigned char)(0x11 * (r + 1))));
    gt_status st = gt_cuda_run_kernel(call, s, &err);
    if (st == GT_OK) st = gt_cuda_stream_sync(s, &err);
    if (st == GT_OK) st = gt_cuda_tensor_download(s, dout, &host, &err);
    EXPECT(st == GT_OK, "matmul tune: run %d failed: %s", r, err.msg);
    return host;
}

/* A stream with tuning on and the given cache file, its drain counted. */
static gt_cuda_stream *tune_stream(const char *cache)
{
    gt_error err = {0};
    gt_cuda_stream *s = NULL;
    GT_CHECK(gt_cuda_stream_create(&s, &err) == GT_OK);
    gt_cuda_stream_set_matmul_tune(s, true);
    gt_cuda_stream_set_matmul_tune_cache(s, cache);
    gt_cuda_stream_set_drain(s, counting_drain, s);
    return s;
}

static int file_lines(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    int n = 0, c;
    while ((c = fgetc(f)) != EOF)
        n += c == '\n';
    fclose(f);
    return n;
}

/* A matmul large enough to be tuned (cuda_matmul_tune.cu) gives, on a tuning stream, the bits of
 * a stream that takes the heuristic's first pick untimed, on its tuning call and after it; the
 * tuner waits for the earlier work through the stream's drain (in a program with collectives, the
 * NCCL-aware wait). The choice goes to the cache file (its folders made), where a new stream finds
 * it instead of timing, with the same bits and no wait; lines with that key that cannot be used
 * (torn, or naming another reference algorithm) are passed over, a later good one still found. */
static void case_matmul_tune(void)
{
    gt_error err = {0};
    char dir[] = "/tmp/gt_tune_XXXXXX";
    GT_CHECK(mkdtemp(dir) != NULL);
    char cache[256];
    snprintf(cache, sizeof cache, "%s/new/matmul_tune.tsv", dir);
    gt_cuda_stream *plain = NULL;
    GT_CHECK(gt_cuda_stream_create(&plain, &err) == GT_OK);
    gt_cuda_stream_set_matmul_tune(plain, false);
    gt_cuda_stream *tuning = tune_stream(cache);
    /* [4096, 1024] @ [2048, 1024]^T: 2^23 outputs, 2^33 products, bf16 as in training */
    int64_t i[GT_MAX_IATTR] = {0, 1};
    gt_tensor a = t_rand(GT_BF16, 2, SH(4096, 1024), -1, 1);
    gt_tensor b = t_rand(GT_BF16, 2, SH(2048, 1024), -1, 1);
    gt_tensor da, db, dout;
    GT_CHECK(gt_cuda_tensor_upload(plain, &a, &da, &err) == GT_OK);
    GT_CHECK(gt_cuda_tensor_upload(plain, &b, &db, &err) == GT_OK);
    GT_CHECK(gt_cuda_tensor_alloc(&dout, GT_BF16, 2, SH(4096, 2048), &err) == GT_OK);
    gt_tensor in[2] = {da, db};
    gt_kernel_call call = cu_kernel_call(GT_OP_MATMUL, i, 2, NULL, 0, NULL, 0, in, 2, &dout, 1);
    gt_tensor ref = tune_run(plain, &call, &dout, 0);
    size_t n = gt_tensor_nbytes(&ref);
    gt_tensor got[2] = {tune_run(tuning, &call, &dout, 1), tune_run(tuning, &call, &dout, 2)};
    gt_cuda_tune_stats ps = gt_cuda_stream_tune_stats(plain),
                       ts = gt_cuda_stream_tune_stats(tuning);
    EXPECT(ps.timed == 0 && ps.cached == 0, "matmul tune: the plain stream tuned a shape");
    EXPECT(ts.timed == 1 && ts.cached == 0,
           "matmul tune: the tuning stream timed %d shapes and took %d from the cache, expected "
           "1 and 0",
           ts.timed, ts.cached);
    EXPECT(ts.seconds > 0, "matmul tune: the tuning took %g s, expected a positive time",
           ts.seconds);
    EXPECT(g_drains >= 1, "matmul tune: the tuner did not wait through the stream's drain");
    for (int r = 0; r < 2; r++)
        EXPECT(memcmp(ref.data, got[r].data, n) == 0,
               "matmul tune: the tuning stream's call %d differs from the untuned pick's", r + 1);
    EXPECT(file_lines(cache) == 1, "matmul tune: the cache %s has %d lines, expected 1", cache,
           file_lines(cache));
    for (int r = 0; r < 2; r++)
        gt_tensor_free(&got[r]);

    /* a new stream: the choice from the cache, no timing and no wait */
    int drains = g_drains;
    gt_cuda_stream *again = tune_stream(cache);
    got[0] = tune_run(again, &call, &dout, 3);
    ts = gt_cuda_stream_tune_stats(again);
    EXPECT(ts.timed == 0 && ts.cached == 1,
           "matmul tune: a new stream timed %d shapes and took %d from the cache, expected 0 and 1",
           ts.timed, ts.cached);
    EXPECT(g_drains == drains, "matmul tune: a cached choice waited for the stream");
    EXPECT(memcmp(ref.data, got[0].data, n) == 0,
           "matmul tune: the cached choice's output differs from the untuned pick's");
    gt_tensor_free(&got[0]);
    gt_cuda_stream_destroy(again);

    /* unusable lines with the same key ahead of the good one: passed over */
    FILE *f = fopen(cache, "r");
    GT_CHECK(f != NULL);
    char line[2048];
    GT_CHECK(fgets(line, sizeof line, f) != NULL);
    fclose(f);
    char *tab = strchr(line, '\t');
    GT_CHECK(tab != NULL);
    *tab = '\0';
    f = fopen(cache, "w");
    GT_CHECK(f != NULL);
    fprintf(f, "%s\t%s\n", line, "zz not hex");
    fprintf(f, "%s\t", line);
    for (int k = 0; k < 2; k++) /* well-formed, but another reference algorithm */
        fprintf(f, "%0128d%s", 0, k ? "\n" : " ");
    fprintf(f, "%s\t%s", line, tab + 1);
    fclose(f);
    gt_cuda_stream *third = tune_stream(cache);
    got[0] = tune_run(third, &call, &dout, 4);
    ts = gt_cuda_stream_tune_stats(third);
    EXPECT(ts.timed == 0 && ts.cached == 1,
           "matmul tune: past two unusable lines, %d shapes timed and %d taken from the cache, "
           "expected 0 and 1",
           ts.timed, ts.cached);
    EXPECT(memcmp(ref.data, got[0].data, n) == 0,
           "matmul tune: the cached choice's output differs from the untuned pick's");
    gt_tensor_free(&got[0]);
    gt_cuda_stream_destroy(third);

    /* only unusable lines: timed again, and the good choice appended */
    f = fopen(cache, "w");
    GT_CHECK(f != NULL);
    fprintf(f, "%s\t%s\n", line, "zz not hex");
    fclose(f);
    gt_cuda_stream *fourth = tune_stream(cache);
    got[0] = tune_run(fourth, &call, &dout, 5);
    ts = gt_cuda_stream_tune_stats(fourth);
    EXPECT(ts.timed == 1 && ts.cached == 0 && file_lines(cache) == 2,
           "matmul tune: with only an unusable line, %d shapes timed, %d cached, %d lines, "
           "expected 1, 0 and 2",
           ts.timed, ts.cached, file_lines(cache));
    gt_tensor_free(&got[0]);
    gt_cuda_stream_destroy(fourth);
    printf("matmul tune                   4096x2048x1024 bf16: tuned on its first call, the "
           "untuned bits on both calls; the choice cached, found by a new stream past bad lines\n");
    char sub[300];
    snprintf(sub, sizeof sub, "%s/new", dir);
    remove(cache);
    rmdir(sub);
    rmdir(dir);
    gt_tensor_free(&ref);
    gt_cuda_tensor_free(&da);
    gt_cuda_tensor_free(&db);
    gt_cuda_tensor_free(&dout);
    gt_tensor_free(&a);
    gt_tensor_free(&b);
    gt_cuda_stream_destroy(tuning);
    gt_cuda_stream_destroy(plain);
}

static void case_norm_rope(gt_dtype ft)
{
    tcase n = {.name = nm("rms_norm", ft),
               .op = GT_OP_RMS_NORM,
               .n_in = 2,
               .n_out = 1,
               .nf = 1,
               .f = {1e-5}};
    n.in[0] = t_rand(ft, 3, SH(3, 7, 64), -2, 2);
    n.in[1] = t_rand(ft, 1, SH(64), 0.5, 1.5);
    n.out[0] = cu_tensor_new(ft, 3, SH(3, 7, 64));
    check(&n, tol_of(ft));
    tcase b = {.name = nm("rms_norm_backward", ft),
               .op = GT_OP_RMS_NORM_BACKWARD,
               .n_in = 3,
               .n_out = 2,
               .nf = 1,
               .f = {1e-5}};
    b.in[0] = t_rand(ft, 2, SH(200, 48), -2, 2); /* 200 rows: several dw chunks */
    b.in[1] = t_rand(ft, 1, SH(48), 0.5, 1.5);
    b.in[2] = t_rand(ft, 2, SH(200, 48), -1, 1);
    b.out[0] = cu_tensor_new(ft, 2, SH(200, 48));
    b.out[1] = cu_tensor_new(ft, 1, SH(48));
    check(&b, tol_of(ft));
    for (int v = 0; v < 3; v++) {
        /* plain; llama3.1 scaling; inverse */
        tcase r = {.name = nm("rope", ft),
                   .op = GT_OP_ROPE,
                   .n_in = 1,
                   .n_out = 1,
                   .ni = 2,
                   .nf = 4,
                   .f = {10000.0, 8.0, 1.0, 4.0}};
        r.i[0] = v == 2;
        r.i[1] = v == 1 ? 8 : 0;
        r.in[0] = t_rand(ft, 4, SH(2, 40, 3, 16), -1, 1);
        r.out[0] = cu_tensor_new(ft, 4, SH(2, 40, 3, 16));
        check(&r, tol_of(ft));
    }
}

/* Runs the CPU sdpa to make consistent (out, lse) inputs for sdpa_backward. */
static void cpu_sdpa(tcase *fwd, gt_tensor *out, gt_tensor *lse)
{
    gt_error err = {0};
    gt_kernel_call k = tc_call(fwd, fwd->in, fwd->out);
    k.out[0] = out;
    k.out[1] = lse;
    GT_CHECK(gt_cpu_run_kernel(&k, &err) == GT_OK);
}

static gt_tensor t_copy(const gt_tensor *x)
{
    gt_tensor t = cu_tensor_new(x->dtype, x->ndim, x->shape);
    memcpy(t.data, x->data, gt_tensor_nbytes(x));
    return t;
}

static void case_attention(gt_dtype ft)
{
    struct {
        int causal;
        int64_t b, hq, hkv, s, t, d, dv;
    } a[3] = {{1, 2, 4, 2, 45, 45, 16, 16}, {0, 1, 3, 1, 37, 70, 32, 24}, {1, 1, 2, 2, 5, 5, 8, 8}};
    for (int k = 0; k < 3; k++) {
        tcase f = {
            .name = nm("sdpa", ft), .op = GT_OP_SDPA, .n_in = 3, .n_out = 2, .ni = 1, .nf = 1};
        f.i[0] = a[k].causal;
        f.f[0] = 1.0 / sqrt((double)a[k].d);
        f.in[0] = t_rand(ft, 4, SH(a[k].b, a[k].hq, a[k].s, a[k].d), -2, 2);
        f.in[1] = t_rand(ft, 4, SH(a[k].b, a[k].hkv, a[k].t, a[k].d), -2, 2);
        f.in[2] = t_rand(ft, 4, SH(a[k].b, a[k].hkv, a[k].t, a[k].dv), -1, 1);
        f.out[0] = cu_tensor_new(ft, 4, SH(a[k].b, a[k].hq, a[k].s, a[k].dv));
        f.out[1] = cu_tensor_new(GT_F32, 3, SH(a[k].b, a[k].hq, a[k].s));
        tcase g = {.name = nm("sdpa_backward", ft),
                   .op = GT_OP_SDPA_BACKWARD,
                   .n_in = 6,
                   .n_out = 3,
                   .ni = 1,
                   .nf = 1};
        g.i[0] = f.i[0];
        g.f[0] = f.f[0];
        for (int j = 0; j < 3; j++)
            g.in[j] = t_copy(&f.in[j]);
        g.in[3] = cu_tensor_new(ft, 4, f.out[0].shape);
        g.in[4] = cu_tensor_new(GT_F32, 3, f.out[1].shape);
        cpu_sdpa(&f, &g.in[3], &g.in[4]);
        g.in[5] = t_rand(ft, 4, f.out[0].shape, -1, 1);
        g.out[0] = cu_tensor_new(ft, 4, f.in[0].shape);
        g.out[1] = cu_tensor_new(ft, 4, f.in[1].shape);
        g.out[2] = cu_tensor_new(ft, 4, f.in[2].shape);
        check(&f, tol_of(ft));
        check(&g, tol_of(ft));
    }
}

/* cross_entropy_with_grad on the GPU gives the bits of the GPU's cross_entropy and
 * cross_entropy_backward on the same device inputs (loss and dlogits). */
static void expect_ce_with_grad_bitwise(const tcase *w)
{
    gt_error err = {0};
    gt_tensor din[3], dout[4], got[4];
    for (int k = 0; k < 3; k++)
        GT_CHECK(gt_cuda_tensor_upload(g_stream, &w->in[k], &din[k], &err) == GT_OK);
    for (int k = 0; k < 4; k++) {
        const gt_tensor *o = &w->out[k % 2];
        GT_CHECK(gt_cuda_tensor_alloc(&dout[k], o->dtype, o->ndim, o->shape, &err) == GT_OK);
        got[k] = cu_tensor_new(o->dtype, o->ndim, o->shape);
    }
    gt_kernel_call fused = tc_call(w, din, dout);
    gt_kernel_call fwd =
        cu_kernel_call(GT_OP_CROSS_ENTROPY, w->i, 1, NULL, 0, NULL, 0, din, 2, &dout[2], 1);
    gt_kernel_call bwd = cu_kernel_call(GT_OP_CROSS_ENTROPY_BACKWARD, w->i, 1, NULL, 0, NULL, 0,
                                        din, 3, &dout[3], 1);
    bool ok = gt_cuda_run_kernel(&fused, g_stream, &err) == GT_OK &&
              gt_cuda_run_kernel(&fwd, g_stream, &err) == GT_OK &&
              gt_cuda_run_kernel(&bwd, g_stream, &err) == GT_OK &&
              gt_cuda_stream_sync(g_stream, &err) == GT_OK;
    for (int k = 0; k < 4 && ok; k++)
        ok = gt_cuda_tensor_download(g_stream, &dout[k], &got[k], &err) == GT_OK;
    EXPECT(ok, "%s: CUDA runs failed: %s", w->name, err.msg);
    EXPECT(ok && !memcmp(got[0].data, got[2].data, gt_tensor_nbytes(&got[0])) &&
               !memcmp(got[1].data, got[3].data, gt_tensor_nbytes(&got[1])),
           "%s: loss or dlogits differ from cross_entropy and its backward on the GPU", w->name);
    for (int k = 0; k < 3; k++)
        gt_cuda_tensor_free(&din[k]);
    for (int k = 0; k < 4; k++) {
        gt_cuda_tensor_free(&dout[k]);
        gt_tensor_free(&got[k]);
    }
}

static void case_loss(gt_dtype ft)
{
    for (int v = 0; v < 2; v++) {
        tcase s = {.name = nm("softmax", ft), .op = GT_OP_SOFTMAX, .n_in = 1, .n_out = 1, .ni = 1};
        s.i[0] = v ? 1 : -1;
        const int64_t *shape = v ? SH(3, 7, 5) : SH(6, 300);
        int nd = v ? 3 : 2;
        s.in[0] = t_rand(ft, nd, shape, -4, 4);
        s.out[0] = cu_tensor_new(ft, nd, shape);
        check(&s, tol_of(ft));
        tcase b = {.name = nm("softmax_backward", ft),
                   .op = GT_OP_SOFTMAX_BACKWARD,
                   .n_in = 2,
                   .n_out = 1,
                   .ni = 1};
        b.i[0] = s.i[0];
        b.in[0] = t_rand(ft, nd, shape, 0, 0.2);
        b.in[1] = t_rand(ft, nd, shape, -1, 1);
        b.out[0] = cu_tensor_new(ft, nd, shape);
        check(&b, tol_of(ft));
    }
    for (int v = 0; v < 2; v++) {
        gt_dtype it = v ? GT_I32 : GT_I64;
        tcase c = {.name = nm("cross_entropy", ft),
                   .op = GT_OP_CROSS_ENTROPY,
                   .n_in = 2,
                   .n_out = 1,
                   .ni = 1,
                   .i = {-100}};
        c.in[0] = t_rand(ft, 2, SH(37, 500), -5, 5);
        c.in[1] = t_ids(it, 1, SH(37), 0, 500);
        for (int r = 0; r < 37; r += 5) { /* some ignored rows */
            if (it == GT_I32)
                ((int32_t *)c.in[1].data)[r] = -100;
            else
                ((int64_t *)c.in[1].data)[r] = -100;
        }
        c.out[0] = cu_tensor_new(GT_F32, 0, NULL);
        tcase b = {.name = nm("cross_entropy_backward", ft),
                   .op = GT_OP_CROSS_ENTROPY_BACKWARD,
                   .n_in = 3,
                   .n_out = 1,
                   .ni = 1,
                   .i = {-100}};
        b.in[0] = t_copy(&c.in[0]);
        b.in[1] = t_copy(&c.in[1]);
        b.in[2] = t_rand(GT_F32, 0, NULL, 0.5, 2);
        b.out[0] = cu_tensor_new(ft, 2, SH(37, 500));
        tcase w = {.name = nm("cross_entropy_with_grad", ft),
                   .op = GT_OP_CROSS_ENTROPY_WITH_GRAD,
                   .n_in = 3,
                   .n_out = 2,
                   .ni = 1,
                   .i = {-100}};
        for (int k = 0; k < 3; k++)
            w.in[k] = t_copy(&b.in[k]);
        w.out[0] = cu_tensor_new(GT_F32, 0, NULL);
        w.out[1] = cu_tensor_new(ft, 2, SH(37, 500));
        expect_ce_with_grad_bitwise(&w);
        check(&c, tol_of(ft));
        check(&b, tol_of(ft));
        check(&w, tol_of(ft));
    }
}

static void case_adamw(gt_dtype ft)
{
    tcase c = {.name = nm("adamw", ft),
               .op = GT_OP_ADAMW,
               .n_in = 6,
               .n_out = 3,
               .nf = 4,
               .f = {0.9, 0.95, 1e-8, 0.1}};
    c.in[0] = t_rand(ft, 2, SH(37, 29), -1, 1);
    c.in[1] = t_rand(ft, 2, SH(37, 29), -1, 1);
    c.in[2] = t_rand(GT_F32, 2, SH(37, 29), -0.1, 0.1);
    c.in[3] = t_rand(GT_F32, 2, SH(37, 29), 0, 0.01);
    c.in[4] = cu_tensor_new(GT_F32, 1, SH(3));
    ((float *)c.in[4].data)[0] = 1e-3f;
    ((float *)c.in[4].data)[1] = 0.271f;
    ((float *)c.in[4].data)[2] = 0.0297f;
    c.in[5] = cu_tensor_new(GT_F32, 0, NULL);
    ((float *)c.in[5].data)[0] = 0.7f;
    c.out[0] = cu_tensor_new(ft, 2, SH(37, 29));
    c.out[1] = cu_tensor_new(GT_F32, 2, SH(37, 29));
    c.out[2] = cu_tensor_new(GT_F32, 2, SH(37, 29));
    /* written with torch's rounding op by op on both sides: bitwise in f32 */
    check(&c, ft == GT_F32 ? 0.0 : tol_of(ft));
}

static void case_errors(void)
{
    /* An embedding id out of range comes back from the next sync, naming the position. */
    gt_error err = {0};
    gt_tensor w = t_rand(GT_F32, 2, SH(10, 4), -1, 1), ids = t_ids(GT_I32, 1, SH(6), 0, 10);
    ((int32_t *)ids.data)[4] = 10;
    gt_tensor dw, di, dout;
    GT_CHECK(gt_cuda_tensor_upload(g_stream, &w, &dw, &err) == GT_OK);
    GT_CHECK(gt_cuda_tensor_upload(g_stream, &ids, &di, &err) == GT_OK);
    GT_CHECK(gt_cuda_tensor_alloc(&dout, GT_F32, 2, SH(6, 4), &err) == GT_OK);
    gt_kernel_call k = {.op = GT_OP_EMBEDDING, .n_in = 2, .n_out = 1};
    k.in[0] = &dw;
    k.in[1] = &di;
    k.out[0] = &dout;
    gt_status st = gt_cuda_run_kernel(&k, g_stream, &err);
    if (st == GT_OK) st = gt_cuda_stream_sync(g_stream, &err);
    EXPECT(st == GT_ERR_INVALID && strstr(err.msg, "position 4"), "bad id: %s", err.msg);
    gt_error_clear(&err);
    EXPECT(gt_cuda_stream_sync(g_stream, &err) == GT_OK, "error word not cleared: %s", err.msg);
    /* A shape mismatch is refused before any launch. */
    gt_tensor bad;
    GT_CHECK(gt_cuda_tensor_alloc(&bad, GT_F32, 2, SH(5, 4), &err) == GT_OK);
    k.out[0] = &bad;
    st = gt_cuda_run_kernel(&k, g_stream, &err);
    EXPECT(st == GT_ERR_SHAPE && strstr(err.msg, "embedding"), "shape: %s", err.msg);
    gt_error_clear(&err);
    /* embedding_backward flags the same id (dy [6, 4] -> dw [10, 4]): the position again */
    int64_t rows = 10;
    gt_kernel_call kb = {
        .op = GT_OP_EMBEDDING_BACKWARD, .n_in = 2, .n_out = 1, .e = &rows, .ne = 1};
    kb.in[0] = &di;
    kb.in[1] = &dout;
    kb.out[0] = &dw;
    st = gt_cuda_run_kernel(&kb, g_stream, &err);
    if (st == GT_OK) st = gt_cuda_stream_sync(g_stream, &err);
    EXPECT(st == GT_ERR_INVALID && strstr(err.msg, "position 4"), "backward bad id: %s", err.msg);
    gt_error_clear(&err);
    EXPECT(gt_cuda_stream_sync(g_stream, &err) == GT_OK, "error word not cleared: %s", err.msg);
    gt_cuda_tensor_free(&bad);
    gt_cuda_tensor_free(&dw);
    gt_cuda_tensor_free(&di);
    gt_cuda_tensor_free(&dout);
    gt_tensor_free(&w);
    gt_tensor_free(&ids);
}

int main(void)
{
    gt_cuda_device_info info;
    int rc = cu_test_start(&info, &g_stream);
    if (rc >= 0) return rc;
    printf("device: %s (sm_%d%d, %d SMs)\n", info.name, info.cc_major, info.cc_minor,
           info.sm_count);
    case_cast();
    case_errors();
    case_matmul_tune();
    const gt_dtype fts[2] = {GT_F32, GT_BF16};
    for (int k = 0; k < 2; k++) {
        case_elementwise(fts[k]);
        case_reduce(fts[k]);
        case_layout(fts[k]);
        case_matmul(fts[k]);
        case_norm_rope(fts[k]);
        case_attention(fts[k]);
        case_loss(fts[k]);
        case_adamw(fts[k]);
    }
    gt_cuda_stream_destroy(g_stream);
    return gt_test_finish();
}
