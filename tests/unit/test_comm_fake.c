/* test_comm_fake.c — the fake communicator: size 1 collectives are identities (checked against the
 * input itself), a widening reduce_scatter (bf16 / f16 into f32) widens, simulated sizes check
 * shapes and leave outputs alone, errors name the rank and collective, the ordered sum matches a
 * naive loop (also summing 16-bit blocks into f32), and the schedule check passes on one rank. */
#include "distributed/comm_test.h"
#include "graphtrain/gt_comm.h"
#include "gt_test.h"

#include <string.h>

static void fill(gt_tensor *t, float base)
{
    for (int64_t i = 0; i < gt_tensor_numel(t); i++)
        gt_tensor_set_f32(t, i, base + (float)i * 0.5f);
}

static bool equal_bytes(const gt_tensor *a, const gt_tensor *b)
{
    return gt_tensor_nbytes(a) == gt_tensor_nbytes(b) &&
           memcmp(a->data, b->data, gt_tensor_nbytes(a)) == 0;
}

static void test_size_one(void)
{
    gt_error err = {0};
    gt_comm *c;
    EXPECT_OK(gt_comm_fake_create(1, 0, &c, &err), &err);
    EXPECT(gt_comm_rank(c) == 0 && gt_comm_size(c) == 1, "rank/size");
    int64_t shape[2] = {4, 3};
    gt_tensor in, out;
    gt_tensor_alloc(&in, GT_BF16, 2, shape, &err);
    gt_tensor_alloc(&out, GT_BF16, 2, shape, &err);
    fill(&in, 1.0f);
    EXPECT_OK(gt_comm_all_reduce(c, &in, &out, &err), &err);
    EXPECT(equal_bytes(&in, &out), "all_reduce on one rank is the identity");
    memset(out.data, 0, gt_tensor_nbytes(&out));
    EXPECT_OK(gt_comm_all_gather(c, &in, &out, &err), &err);
    EXPECT(equal_bytes(&in, &out), "all_gather on one rank is the identity");
    memset(out.data, 0, gt_tensor_nbytes(&out));
    EXPECT_OK(gt_comm_reduce_scatter(c, &in, &out, &err), &err);
    EXPECT(equal_bytes(&in, &out), "reduce_scatter on one rank is the identity");
    memset(out.data, 0, gt_tensor_nbytes(&out));
    gt_comm_request *req;
    EXPECT_OK(gt_comm_all_to_all_start(c, &in, &out, &req, &err), &err);
    EXPECT_OK(gt_comm_wait(req, &err), &err);
    EXPECT(equal_bytes(&in, &out), "all_to_all on one rank is the identity");
    gt_tensor copy;
    gt_tensor_alloc(&copy, GT_BF16, 2, shape, &err);
    memcpy(copy.data, in.data, gt_tensor_nbytes(&in));
    EXPECT_OK(gt_comm_broadcast(c, &in, 0, &err), &err);
    EXPECT(equal_bytes(&in, &copy), "broadcast on one rank leaves buf");

    /* Errors: dtype mismatch and a bad root name the rank and the collective. */
    gt_tensor f32;
    gt_tensor_alloc(&f32, GT_F32, 2, shape, &err);
    gt_error e2 = {0};
    EXPECT(gt_comm_all_reduce(c, &in, &f32, &e2) == GT_ERR_SHAPE, "dtype mismatch rejected");
    EXPECT(strstr(e2.msg, "rank 0") && strstr(e2.msg, "all_reduce"), "message: %s", e2.msg);
    gt_error e3 = {0};
    EXPECT(gt_comm_broadcast(c, &in, 1, &e3) == GT_ERR_INVALID, "root out of range");
    EXPECT(strstr(e3.msg, "broadcast") && strstr(e3.msg, "root 1"), "message: %s", e3.msg);

    gt_comm *sub;
    EXPECT_OK(gt_comm_split(c, 0, 0, &sub, &err), &err);
    EXPECT(gt_comm_size(sub) == 1, "split of size 1");
    gt_comm_destroy(sub);

    gt_comm_sched_entry sched[2] = {{GT_COLL_ALL_GATHER, 1, 64, 0}, {GT_COLL_REDUCE_SCATTER, 1, 64, 0}};
    EXPECT_OK(gt_comm_check_schedule(c, sched, 2, &err), &err);

    /* the widening reduce_scatter over one rank: the input widened */
    comm_test_reduce_scatter_widen(c, GT_BF16, 4, 3);
    comm_test_reduce_scatter_widen(c, GT_F16, 4, 3);

    gt_tensor_free(&in), gt_tensor_free(&out), gt_tensor_free(&copy), gt_tensor_free(&f32);
    gt_comm_destroy(c);
}

static void test_simulated(void)
{
    gt_error err = {0};
    gt_comm *c;
    EXPECT_OK(gt_comm_fake_create(4, 2, &c, &err), &err);
    EXPECT(gt_comm_rank(c) == 2 && gt_comm_size(c) == 4, "simulated rank/size");
    int64_t s_in[2] = {3, 5}, s_out[2] = {12, 5}, s_bad[2] = {9, 5};
    gt_tensor in, out, bad;
    gt_tensor_alloc(&in, GT_F32, 2, s_in, &err);
    gt_tensor_alloc(&out, GT_F32, 2, s_out, &err);
    gt_tensor_alloc(&bad, GT_F32, 2, s_bad, &err);
    fill(&in, 2.0f);
    gt_tensor_set_f32(&out, 0, 42.0f);
    EXPECT_OK(gt_comm_all_gather(c, &in, &out, &err), &err);
    EXPECT(gt_tensor_get_f32(&out, 0) == 42.0f, "simulated size leaves out untouched");
    EXPECT_OK(gt_comm_reduce_scatter(c, &out, &in, &err), &err);
    gt_error e = {0};
    EXPECT(gt_comm_all_gather(c, &in, &bad, &e) == GT_ERR_SHAPE, "all_gather 3 -> 9 on size 4");
    EXPECT(strstr(e.msg, "rank 2") && strstr(e.msg, "all_gather") && strstr(e.msg, "[9, 5]"),
           "message: %s", e.msg);
    gt_error e2 = {0};
    EXPECT(gt_comm_reduce_scatter(c, &bad, &in, &e2) == GT_ERR_SHAPE, "9 rows not 4 * 3");
    gt_error e3 = {0};
    EXPECT(gt_comm_all_to_all(c, &bad, &bad, &e3) == GT_ERR_SHAPE, "9 rows not divisible by 4");
    /* the shape check lets a bf16 scatter into f32 through, and not an f32 one into bf16 */
    gt_tensor out16, in16;
    gt_tensor_alloc(&out16, GT_BF16, 2, s_out, &err);
    gt_tensor_alloc(&in16, GT_BF16, 2, s_in, &err);
    EXPECT_OK(gt_comm_reduce_scatter(c, &out16, &in, &err), &err);
    gt_error e5 = {0};
    EXPECT(gt_comm_reduce_scatter(c, &out, &in16, &e5) == GT_ERR_SHAPE &&
               strstr(e5.msg, "differ in dtype"),
           "f32 into bf16 refused: %s", e5.msg);
    gt_tensor_free(&out16), gt_tensor_free(&in16);
    gt_error e4 = {0};
    gt_comm *bad_comm = NULL;
    EXPECT(gt_comm_fake_create(2, 2, &bad_comm, &e4) == GT_ERR_INVALID && !bad_comm,
           "rank outside size");
    gt_tensor_free(&in), gt_tensor_free(&out), gt_tensor_free(&bad);
    gt_comm_destroy(c);
}

static void test_sum_ordered(void)
{
    gt_error err = {0};
    enum { N = 257, R = 5 };
    float a[R][N], got[N];
    uint16_t b[R][N], gotb[N];
    const void *src[R], *srcb[R];
    for (int r = 0; r < R; r++) {
        for (int i = 0; i < N; i++) {
            a[r][i] = (float)((i * 7919 + r * 104729) % 1000) / 7.0f - 60.0f;
            b[r][i] = gt_f32_to_bf16(a[r][i]);
        }
        src[r] = a[r];
        srcb[r] = b[r];
    }
    EXPECT_OK(gt_comm_sum_ordered(GT_F32, GT_F32, N, src, R, got, &err), &err);
    EXPECT_OK(gt_comm_sum_ordered(GT_BF16, GT_BF16, N, srcb, R, gotb, &err), &err);
    int bad = 0, badb = 0;
    for (int i = 0; i < N; i++) {
        float ref = 0.0f, refb = 0.0f;
        for (int r = 0; r < R; r++) {
            ref = r == 0 ? a[r][i] : ref + a[r][i];
            refb = r == 0 ? gt_bf16_to_f32(b[r][i]) : refb + gt_bf16_to_f32(b[r][i]);
        }
        bad += memcmp(&ref, &got[i], sizeof ref) != 0;
        badb += gt_f32_to_bf16(refb) != gotb[i]; /* one rounding at the end: f32 accumulation */
    }
    EXPECT(bad == 0 && badb == 0, "%d f32 / %d bf16 sums differ from rank-order loop", bad, badb);
    /* 16-bit blocks into f32: the f32 sum of the widened blocks, not rounded back; f16 too */
    float gotw[N];
    uint16_t h[R][N];
    const void *srch[R];
    for (int r = 0; r < R; r++) {
        for (int i = 0; i < N; i++)
            h[r][i] = gt_f32_to_f16(a[r][i]);
        srch[r] = h[r];
    }
    for (int pass = 0; pass < 2; pass++) {
        gt_dtype dt = pass == 0 ? GT_BF16 : GT_F16;
        EXPECT_OK(gt_comm_sum_ordered(dt, GT_F32, N, pass == 0 ? srcb : srch, R, gotw, &err), &err);
        int badw = 0;
        for (int i = 0; i < N; i++) {
            float ref = 0.0f;
            for (int r = 0; r < R; r++) {
                float x = pass == 0 ? gt_bf16_to_f32(b[r][i]) : gt_f16_to_f32(h[r][i]);
                ref = r == 0 ? x : ref + x;
            }
            badw += memcmp(&ref, &gotw[i], sizeof ref) != 0;
        }
        EXPECT(badw == 0, "%s -> f32: %d sums differ from the rank-order loop", gt_dtype_name(dt),
               badw);
    }
    gt_error e1 = {0};
    EXPECT(gt_comm_sum_ordered(GT_F32, GT_BF16, N, src, R, gotb, &e1) == GT_ERR_UNSUPPORTED &&
               strstr(e1.msg, "f32") && strstr(e1.msg, "bf16"),
           "f32 blocks into bf16 refused: %s", e1.msg);
    int8_t junk[4];
    const void *js[1] = {junk};
    EXPECT(gt_comm_sum_ordered(GT_BOOL, GT_BOOL, 4, js, 1, junk, &err) == GT_ERR_UNSUPPORTED,
           "bool sum");
}

int main(void)
{
    test_size_one();
    test_simulated();
    test_sum_ordered();
    return gt_test_finish();
}
