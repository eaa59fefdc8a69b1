/* test_cuda_init.c — parameters drawn on the device (gt_cuda_param_init, cuda_init.cu) are bitwise
 * what gt_param_init draws on the CPU (src/models/init.c on src/core/philox.c), label cuda.
 *
 * For each init kind — normal, truncated normal at torch's ±2 std, a truncated normal at ±0.1 std
 * (about 92 % of round-0 draws rejected: many redraw rounds), ones, zeros — the same elements are
 * drawn both ways into a local block of runs and compared byte for byte:
 *   - one run starting past 2^32 (64-bit element indices, the counter's high word);
 *   - 300 runs of 1000 elements, 4000 apart, at local positions out of order with the global ones
 *     (the row runs of a column-sharded block, and the binary search over the run table).
 * Without a CUDA device the test skips (exit 0). */
#include "cuda_test_util.h"
#include "graphtrain/gt_cuda.h"
#include "graphtrain/gt_llama3.h"
#include "gt_test.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define SEED 0x5eedull

typedef struct {
    const char *name;
    gt_init_kind kind;
    double std, lo, hi;
} init_case;

/* The CPU's values of the runs into host (float[n]), each run through gt_param_init. */
static void cpu_draw(const gt_param_spec *p, const int64_t *runs, int n_runs, float *host)
{
    for (int r = 0; r < n_runs; r++) {
        gt_tensor t;
        int64_t count = runs[3 * r + 2];
        gt_tensor_wrap(&t, GT_F32, 1, &count, host + runs[3 * r + 1]);
        gt_param_init(p, SEED, runs[3 * r], count, &t);
    }
}

static void check_case(gt_cuda_stream *s, const init_case *c, const int64_t *runs, int n_runs,
                       int64_t n_local, int64_t numel, const char *layout)
{
    gt_param_spec p = {
        .dtype = GT_F32, .ndim = 1, .init = c->kind, .std = c->std, .lo = c->lo, .hi = c->hi};
    snprintf(p.fqn, sizeof p.fqn, "layers.0.test.%s", c->name);
    p.shape[0] = numel;
    float *want = calloc((size_t)n_local, sizeof *want);
    cpu_draw(&p, runs, n_runs, want);
    gt_error err = {0};
    gt_tensor dev, got;
    GT_CHECK(gt_cuda_tensor_alloc(&dev, GT_F32, 1, &n_local, &err) == GT_OK);
    GT_CHECK(cu_fill_pattern(s, &dev, 0) == true);
    gt_cuda_init_spec spec = {c->kind, c->std, c->lo, c->hi, SEED, gt_hash_str(p.fqn)};
    gt_status st = gt_cuda_param_init(s, &spec, runs, n_runs, (float *)dev.data, &err);
    got = cu_tensor_new(GT_F32, 1, &n_local);
    if (st == GT_OK) st = gt_cuda_tensor_download(s, &dev, &got, &err);
    if (st == GT_OK) st = gt_cuda_stream_sync(s, &err);
    EXPECT(st == GT_OK, "%s, %s: %s", c->name, layout, err.msg);
    int64_t bad = 0, first = -1;
    const float *g = got.data;
    for (int64_t i = 0; st == GT_OK && i < n_local; i++)
        if (memcmp(&g[i], &want[i], sizeof(float)) != 0) bad++, first = first < 0 ? i : first;
    EXPECT(st == GT_OK && bad == 0,
           "%s, %s: %lld of %lld elements differ from the CPU's; the first at %lld: %.9g vs %.9g",
           c->name, layout, (long long)bad, (long long)n_local, (long long)first,
           first >= 0 ? g[first] : 0.0, first >= 0 ? want[first] : 0.0);
    printf("%-22s %-34s %lld elements bitwise the CPU's\n", c->name, layout, (long long)n_local);
    gt_tensor_free(&got);
    gt_cuda_tensor_free(&dev);
    free(want);
}

int main(void)
{
    gt_cuda_stream *s = NULL;
    int rc = cu_test_start(NULL, &s);
    if (rc >= 0) return rc;
    const init_case cases[] = {
        {"normal", GT_INIT_NORMAL, 0.02, 0, 0},
        {"trunc_normal_2std", GT_INIT_TRUNC_NORMAL, 0.02, -0.04, 0.04},
        {"trunc_normal_0.1std", GT_INIT_TRUNC_NORMAL, 0.02, -0.002, 0.002},
        {"ones", GT_INIT_ONES, 0, 0, 0},
        {"zeros", GT_INIT_ZEROS, 0, 0, 0},
    };
    /* one run of 1 M elements from global element 2^32 + 12345 */
    int64_t one[3] = {(1ll << 32) + 12345, 0, 1 << 20};
    /* 300 rows of 1000 elements, 4000 apart, stored in reverse row order */
    enum { ROWS = 300, COLS = 1000 };
    static int64_t rows[3 * ROWS];
    for (int r = 0; r < ROWS; r++) {
        rows[3 * r] = (int64_t)r * 4000 + 1500;
        rows[3 * r + 1] = (int64_t)(ROWS - 1 - r) * COLS;
        rows[3 * r + 2] = COLS;
    }
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        check_case(s, &cases[k], one, 1, one[2], (1ll << 32) + 12345 + one[2], "one run past 2^32");
        check_case(s, &cases[k], rows, ROWS, (int64_t)ROWS * COLS, (int64_t)ROWS * 4000,
                   "300 row runs, local order reversed");
    }
    gt_cuda_stream_destroy(s);
    return gt_test_finish();
}
