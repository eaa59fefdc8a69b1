/* test_cuda_moe_ep.c — the CUDA kernels of expert parallel's row moves (cuda_moe.cu:
 * moe_block_offsets, moe_pack, moe_unpack) vs the CPU kernels (cpu_moe_ep.c) and a naive
 * reference here, on simulated ranks.
 *
 * n_blocks 1, 2, 4 ranks of e experts each; random routes with empty experts and (n > 1) an empty
 * rank pair; x with rows past the rank's sent rows (unpack leaves them zero); f32 and bf16 rows of
 * D 5, 8 and 13 (row bytes not a multiple of 16, odd bf16 widths); rank 0 and rank n - 1; the
 * worst-case capacity, a tight one (the largest pair count) with worst == capacity, and the tight
 * one below the worst case (parallelism.expert_parallel_capacity_factor < 1 with no overflow: the
 * same bits as the worst case's blocks, cut to C rows). Every device run is made twice, the output
 * pre-filled with 0xff then 0x5a, and both runs must give the same bytes (deterministic, every
 * element written). Then:
 *   - moe_block_offsets of every rank's offsets (first offset non-zero): bitwise the CPU's and
 *     the reference; the table is their concatenation, as the all-gather makes it;
 *   - moe_pack: bitwise the CPU's and the reference (block b = the rank's rows for b, then zeros);
 *   - moe_unpack of the device's pack: bitwise the CPU's, and the round trip restores the rows the
 *     blocks cover bit for bit, the rows past them zero; moe_unpack of random y (non-zero padding
 *     rows, which it must not read): bitwise the CPU's;
 *   - a capacity below the largest pair: the CPU fails with its overflow error naming the factor;
 *     the device launches (nothing syncs inside a step), flags the overflow in the stream's
 *     data-error word, and the next stream sync reports the CPU's message word for word (the
 *     pair, the capacity, the worst case and the factor needed); it wrote only C rows per block.
 *     The flag is cleared by that sync: the next run is clean.
 * Without a CUDA device the test skips (exit 0). */
#include "cuda_test_util.h"
#include "graphtrain/gt_backend.h"
#include "graphtrain/gt_cuda.h"
#include "gt_test.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SH(...) ((const int64_t[]){__VA_ARGS__})
#define MAXN 4
#define MAXE 3

static gt_cuda_stream *g_s;
static uint64_t g_rng = 0x13198a2e03707344ull;

typedef struct {
    gt_op op;
    int64_t i[1];
    int64_t e[3];
    int ne;
} ep_attrs;

/* The op on the device (inputs in[0..n_in), one output) with the output pre-filled with `fill`;
 * the output's bytes into got (a host tensor already shaped). Returns the run's status. */
static gt_status gpu_once(const ep_attrs *a, const gt_tensor *in, int n_in, gt_tensor *got,
                          uint8_t fill, gt_error *err)
{
    gt_tensor din[2], dout;
    memset(din, 0, sizeof din);
    memset(&dout, 0, sizeof dout);
    gt_status st = GT_OK;
    for (int k = 0; k < n_in && st == GT_OK; k++)
        st = gt_cuda_tensor_upload(g_s, &in[k], &din[k], err);
    if (st == GT_OK) st = gt_cuda_tensor_alloc(&dout, got->dtype, got->ndim, got->shape, err);
    if (st == GT_OK && !cu_fill_pattern(g_s, &dout, fill))
        st = gt_error_set(err, GT_ERR_INVALID, "pre-filling the output failed");
    gt_kernel_call c = cu_kernel_call(a->op, a->i, 1, NULL, 0, a->e, a->ne, din, n_in, &dout, 1);
    gt_status run = st == GT_OK ? gt_cuda_run_kernel(&c, g_s, err) : st;
    /* the output is read back even after a refused run: it must be left as pre-filled */
    if (st == GT_OK) {
        gt_error derr = {0};
        st = gt_cuda_tensor_download(g_s, &dout, got, &derr);
        if (st != GT_OK && run == GT_OK) {
            *err = derr;
            run = st;
        }
    }
    for (int k = 0; k < n_in; k++)
        gt_cuda_tensor_free(&din[k]);
    gt_cuda_tensor_free(&dout);
    return run;
}

/* The op on the device twice (pre-filled 0xff, then 0x5a) into got; false (counted) on an error
 * or when the runs differ. */
static bool gpu_run(const char *name, const ep_attrs *a, const gt_tensor *in, int n_in,
                    gt_tensor *got)
{
    gt_error err = {0};
    gt_tensor second = cu_tensor_new(got->dtype, got->ndim, got->shape);
    bool ok = gpu_once(a, in, n_in, got, 0xff, &err) == GT_OK &&
              gpu_once(a, in, n_in, &second, 0x5a, &err) == GT_OK;
    bool same = ok && same_bits(got, &second);
    EXPECT(ok, "%s: CUDA run failed: %s", name, err.msg);
    EXPECT(!ok || same, "%s: two CUDA runs differ (nondeterministic or unwritten output)", name);
    gt_tensor_free(&second);
    return ok && same;
}

static bool cpu_run(const char *name, const ep_attrs *a, const gt_tensor *in, int n_in,
                    gt_tensor *out)
{
    gt_error err = {0};
    gt_kernel_call c = cu_kernel_call(a->op, a->i, 1, NULL, 0, a->e, a->ne, in, n_in, out, 1);
    gt_status st = gt_cpu_run_kernel(&c, &err);
    EXPECT(st == GT_OK, "%s: CPU kernel failed: %s", name, err.msg);
    return st == GT_OK;
}

static gt_tensor zeros(gt_dtype dt, int64_t r, int64_t c)
{
    gt_tensor t = cu_tensor_new(dt, 2, SH(r, c));
    memset(t.data, 0, gt_tensor_nbytes(&t));
    return t;
}

/* Routes of n ranks, e experts each: cnt[a][x] rows of rank a go to expert x (of rank x / e);
 * every third expert of a rank empty, and (n > 1) rank 0 sends rank n - 1 nothing. */
typedef struct {
    int n, e;
    int32_t cnt[MAXN][MAXN * MAXE];
    int64_t sent[MAXN][MAXN]; /* rows rank a sends rank b */
    int64_t rows[MAXN];       /* rank a's x rows: what it sends and `slack` more */
    int64_t most;             /* the largest pair count */
    gt_tensor table;          /* i32 [n*n, e + 1] */
} routes;

static void routes_make(routes *r, int n, int e, int slack, const char *name)
{
    memset(r, 0, sizeof *r);
    r->n = n;
    r->e = e;
    int E = n * e;
    for (int a = 0; a < n; a++) {
        for (int x = 0; x < E; x++) {
            int32_t v = (int32_t)cu_urand(&g_rng, 0.0, 6.0);
            if ((x + a) % 3 == 0 || (a == 0 && n > 1 && x / e == n - 1)) v = 0;
            r->cnt[a][x] = v;
            r->sent[a][x / e] += v;
        }
        for (int b = 0; b < n; b++) {
            r->rows[a] += r->sent[a][b];
            if (r->sent[a][b] > r->most) r->most = r->sent[a][b];
        }
        r->rows[a] += slack;
    }
    r->table = cu_tensor_new(GT_I32, 2, SH((int64_t)n * n, e + 1));
    for (int a = 0; a < n; a++) {
        /* rank a's offsets, starting at 3a (moe_block_offsets makes each block relative) */
        gt_tensor off = cu_tensor_new(GT_I32, 1, SH(E + 1));
        int32_t *o = off.data;
        o[0] = 3 * a;
        for (int x = 0; x < E; x++)
            o[x + 1] = o[x] + r->cnt[a][x];
        gt_tensor got = zeros(GT_I32, n, e + 1), cpu = zeros(GT_I32, n, e + 1),
                  ref = zeros(GT_I32, n, e + 1);
        for (int b = 0; b < n; b++)
            for (int l = 0; l <= e; l++)
                ((int32_t *)ref.data)[b * (e + 1) + l] = o[b * e + l] - o[b * e];
        char what[128];
        snprintf(what, sizeof what, "%s moe_block_offsets rank %d", name, a);
        ep_attrs at = {.op = GT_OP_MOE_BLOCK_OFFSETS, .i = {n}};
        if (gpu_run(what, &at, &off, 1, &got))
            EXPECT(same_bits(&got, &ref), "%s: != reference", what);
        if (cpu_run(what, &at, &off, 1, &cpu)) EXPECT(same_bits(&cpu, &got), "%s: != CPU", what);
        /* the all-gather: rank a's block rows a*n .. a*n + n - 1 */
        memcpy((int32_t *)r->table.data + (size_t)a * n * (e + 1), ref.data,
               gt_tensor_nbytes(&ref));
        gt_tensor_free(&off);
        gt_tensor_free(&got);
        gt_tensor_free(&cpu);
        gt_tensor_free(&ref);
    }
}

/* Pack then unpack rank `rank`'s rows at capacity cap (worst-case attribute worst). */
static void test_rank(const routes *r, const char *name, int rank, gt_dtype dt, int64_t D,
                      int64_t cap, int64_t worst)
{
    int n = r->n;
    int64_t R = r->rows[rank];
    size_t row = (size_t)D * gt_dtype_size(dt);
    char what[160];
    gt_tensor in[2];
    in[0] = cu_tensor_rand(&g_rng, dt, 2, SH(R, D), -4.0, 4.0);
    in[1] = r->table;

    /* the reference: block b = the rank's rows for b in order, then zeros */
    gt_tensor ref = zeros(dt, n * cap, D), got = zeros(dt, n * cap, D), cpu = zeros(dt, n * cap, D);
    int64_t start = 0;
    for (int b = 0; b < n; b++) {
        memcpy((char *)ref.data + (size_t)(b * cap) * row, (char *)in[0].data + (size_t)start * row,
               (size_t)r->sent[rank][b] * row);
        start += r->sent[rank][b];
    }
    int64_t covered = start;
    snprintf(what, sizeof what, "%s %s D%lld C%lld rank %d moe_pack", name, gt_dtype_name(dt),
             (long long)D, (long long)cap, rank);
    ep_attrs pa = {.op = GT_OP_MOE_PACK, .i = {n}, .e = {cap, worst, rank}, .ne = 3};
    bool packed = gpu_run(what, &pa, in, 2, &got);
    if (packed) EXPECT(same_bits(&got, &ref), "%s: != reference", what);
    if (cpu_run(what, &pa, in, 2, &cpu)) EXPECT(same_bits(&cpu, &got), "%s: != CPU", what);

    /* unpack of the device's pack: the CPU's bits, and x's covered rows back */
    ep_attrs ua = {.op = GT_OP_MOE_UNPACK, .i = {n}, .e = {R, rank}, .ne = 2};
    gt_tensor back = zeros(dt, R, D), bcpu = zeros(dt, R, D);
    snprintf(what, sizeof what, "%s %s D%lld C%lld rank %d moe_unpack", name, gt_dtype_name(dt),
             (long long)D, (long long)cap, rank);
    gt_tensor uin[2] = {got, r->table};
    if (packed && gpu_run(what, &ua, uin, 2, &back)) {
        bool rows_back = memcmp(back.data, in[0].data, (size_t)covered * row) == 0;
        bool rest_zero = true;
        for (size_t k = (size_t)covered * row; k < (size_t)R * row; k++)
            rest_zero = rest_zero && ((uint8_t *)back.data)[k] == 0;
        EXPECT(rows_back, "%s: the round trip changed the %lld rows the blocks cover", what,
               (long long)covered);
        EXPECT(rest_zero, "%s: rows past the blocks not zero", what);
        if (cpu_run(what, &ua, uin, 2, &bcpu)) EXPECT(same_bits(&bcpu, &back), "%s: != CPU", what);
    }

    /* unpack of random y: the padding rows of each block hold values it must not read */
    gt_tensor yin[2] = {cu_tensor_rand(&g_rng, dt, 2, SH(n * cap, D), -4.0, 4.0), r->table};
    gt_tensor yg = zeros(dt, R, D), yc = zeros(dt, R, D);
    snprintf(what, sizeof what, "%s %s D%lld C%lld rank %d moe_unpack of random y", name,
             gt_dtype_name(dt), (long long)D, (long long)cap, rank);
    if (gpu_run(what, &ua, yin, 2, &yg) && cpu_run(what, &ua, yin, 2, &yc))
        EXPECT(same_bits(&yg, &yc), "%s: != CPU", what);

    gt_tensor_free(&in[0]);
    gt_tensor_free(&ref);
    gt_tensor_free(&got);
    gt_tensor_free(&cpu);
    gt_tensor_free(&back);
    gt_tensor_free(&bcpu);
    gt_tensor_free(&yin[0]);
    gt_tensor_free(&yg);
    gt_tensor_free(&yc);
}

static void test_routes(int n, int e, int slack)
{
    char name[64];
    snprintf(name, sizeof name, "n%d e%d slack%d", n, e, slack);
    routes r;
    routes_make(&r, n, e, slack, name);
    int64_t worst = 0; /* the worst case: all of a rank's rows to one rank */
    for (int a = 0; a < n; a++)
        if (r.rows[a] > worst) worst = r.rows[a];
    const gt_dtype dts[2] = {GT_F32, GT_BF16};
    const int64_t Ds[3] = {5, 8, 13};
    for (int d = 0; d < 2; d++)
        for (int k = 0; k < 3; k++)
            for (int ra = 0; ra < (n > 1 ? 2 : 1); ra++) {
                int rank = ra ? n - 1 : 0;
                test_rank(&r, name, rank, dts[d], Ds[k], worst, worst);
                test_rank(&r, name, rank, dts[d], Ds[k], r.most, r.most);
                test_rank(&r, name, rank, dts[d], Ds[k], r.most, worst + 1);
            }
    gt_tensor_free(&r.table);
}

/* A capacity one below the largest pair: the CPU's overflow error, and the device's, reported by
 * the stream sync after the launch with the same message; below the worst case with no pair over
 * it: both run, bitwise. */
static void test_overflow(void)
{
    routes r;
    routes_make(&r, 2, 2, 0, "overflow");
    for (int tries = 0; tries < 64 && r.most < 2; tries++) { /* a capacity of at least 1 row */
        gt_tensor_free(&r.table);
        routes_make(&r, 2, 2, 0, "overflow");
    }
    int64_t cap = r.most - 1, worst = r.most + 2; /* any worst case above both capacities */
    GT_CHECK(cap >= 1);
    int64_t D = 5;
    gt_tensor in[2] = {cu_tensor_rand(&g_rng, GT_BF16, 2, SH(r.rows[0], D), -4.0, 4.0), r.table};
    gt_tensor out = zeros(GT_BF16, 2 * cap, D);
    ep_attrs pa = {.op = GT_OP_MOE_PACK, .i = {2}, .e = {cap, worst, 0}, .ne = 3};

    gt_error err = {0}, gerr = {0};
    gt_kernel_call c = cu_kernel_call(pa.op, pa.i, 1, NULL, 0, pa.e, pa.ne, in, 2, &out, 1);
    gt_status st = gt_cpu_run_kernel(&c, &err);
    EXPECT(st == GT_ERR_INVALID && strstr(err.msg, "capacity overflow") &&
               strstr(err.msg, "expert_parallel_capacity_factor to at least"),
           "overflow: CPU gave status %d '%s', expected the capacity overflow error", (int)st,
           err.msg);

    gt_status gst = gpu_once(&pa, in, 2, &out, 0x5a, &gerr);
    EXPECT(gst == GT_ERR_INVALID && strcmp(gerr.msg, err.msg) == 0,
           "overflow: CUDA gave status %d '%s', expected the CPU's '%s'", (int)gst, gerr.msg,
           err.msg);
    printf("overflow: CUDA reported after the launch: %s\n", gerr.msg);

    /* the flag was cleared by that sync: a run that fits is clean, and bitwise the CPU's */
    pa.e[0] = r.most;
    gt_tensor fits = zeros(GT_BF16, 2 * r.most, D), fcpu = zeros(GT_BF16, 2 * r.most, D);
    if (gpu_run("capacity below the worst case, no overflow", &pa, in, 2, &fits) &&
        cpu_run("capacity below the worst case, no overflow", &pa, in, 2, &fcpu))
        EXPECT(same_bits(&fits, &fcpu), "capacity %lld < worst %lld: CUDA != CPU",
               (long long)r.most, (long long)worst);

    gt_tensor_free(&in[0]);
    gt_tensor_free(&out);
    gt_tensor_free(&fits);
    gt_tensor_free(&fcpu);
    gt_tensor_free(&r.table);
}

int main(void)
{
    int rc = cu_test_start(NULL, &g_s);
    if (rc >= 0) return rc;
    test_routes(1, 3, 0);
    test_routes(1, 2, 2);
    test_routes(2, 2, 0);
    test_routes(2, 3, 3);
    test_routes(4, 2, 1);
    test_routes(4, 3, 0);
    test_overflow();
    gt_cuda_stream_destroy(g_s);
    return gt_test_finish();
}
