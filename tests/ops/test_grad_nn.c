/* test_grad_nn.c — gradient rules of matmul, rms_norm, rope, sdpa (both layouts), softmax,
 * cross_entropy and embedding vs central finite differences (harness and tolerance:
 * grad_check.h); plus accumulation through a value used three times and a parameter the loss does
 * not use. */
#include "grad_check.h"

#define S(...) ((const int64_t[]){__VA_ARGS__})

/* ---------------------------------------------------------------- matmul */

/* op(A) is [.., 3, 5], op(B) is [5, 4] (or batched [2, 5, 4]); the stored shapes are transposed
 * when the flag is set. */
static void test_matmul_case(int rank_a, int rank_b, bool ta, bool tb)
{
    char label[96];
    snprintf(label, sizeof label, "matmul rank %d x rank %d trans_a=%d trans_b=%d", rank_a, rank_b,
             ta, tb);
    gc_case c;
    gc_begin(&c, label, 400 + (uint64_t)(rank_a * 8 + rank_b * 4 + ta * 2 + tb));
    int64_t sa[4], sb[3];
    int64_t m = 3, k = 5, n = 4;
    for (int i = 0; i < rank_a - 2; i++)
        sa[i] = 2;
    sa[rank_a - 2] = ta ? k : m;
    sa[rank_a - 1] = ta ? m : k;
    for (int i = 0; i < rank_b - 2; i++)
        sb[i] = 2;
    sb[rank_b - 2] = tb ? n : k;
    sb[rank_b - 1] = tb ? k : n;
    gt_value_id a = gc_param(&c, rank_a, sa, -1, 1);
    gt_value_id b = gc_param(&c, rank_b, sb, -1, 1);
    gc_run1(&c, gt_matmul(c.g, a, b, ta, tb));
}

static void test_matmul(void)
{
    for (int t = 0; t < 4; t++) {
        bool ta = t & 2, tb = t & 1;
        test_matmul_case(2, 2, ta, tb); /* plain */
        test_matmul_case(3, 2, ta, tb); /* b broadcast over a's leading dim */
        test_matmul_case(3, 3, ta, tb); /* batched */
    }
    test_matmul_case(4, 2, true, false);
    test_matmul_case(4, 2, false, true);
}

/* ---------------------------------------------------------------- rms_norm, rope */

static void test_rms_norm(void)
{
    gc_case c;
    gc_begin(&c, "rms_norm [3,7]", 500);
    gt_value_id x = gc_param(&c, 2, S(3, 7), -1, 1);
    gt_value_id w = gc_param(&c, 1, S(7), 0.5, 1.5);
    gc_run1(&c, gt_rms_norm(c.g, x, w, 1e-5));

    gc_begin(&c, "rms_norm [2,3,9]", 501);
    x = gc_param(&c, 3, S(2, 3, 9), -2, 2);
    w = gc_param(&c, 1, S(9), -1.5, 1.5);
    gc_run1(&c, gt_rms_norm(c.g, x, w, 1e-5));
}

static void test_rope(void)
{
    /* d = 8, theta = 10000: inv_freq = 1, 0.1, 0.01, 0.001, wavelengths 2π/inv_freq = 6.3, 63,
     * 628, 6283. With original_max_position 64, low/high factor 1/4: the high-frequency wavelength
     * bound is 16 and the low one 64, so pair 0 is kept, pair 1 is smoothed and pairs 2, 3 are
     * divided by factor: every branch of the llama3.1 scaling is exercised. */
    gt_rope_params plain = {.theta = 10000.0};
    gt_rope_params scaled = {.theta = 10000.0,
                             .factor = 8.0,
                             .low_freq_factor = 1.0,
                             .high_freq_factor = 4.0,
                             .original_max_position = 64};
    const gt_rope_params *ps[2] = {&plain, &scaled};
    const char *labels[2][2] = {{"rope", "rope inverse"},
                                {"rope llama3.1 scaling", "rope llama3.1 scaling inverse"}};
    for (int s = 0; s < 2; s++) {
        for (int inv = 0; inv < 2; inv++) {
            gc_case c;
            gc_begin(&c, labels[s][inv], 600 + (uint64_t)(s * 2 + inv));
            gt_value_id x = gc_param(&c, 4, S(2, 5, 3, 8), -1, 1);
            gc_run1(&c, gt_rope(c.g, x, ps[s], inv));
        }
    }
}

/* ---------------------------------------------------------------- attention */

static void test_sdpa_case(const char *label, int64_t hq, int64_t hkv, int64_t s, int64_t t,
                           bool causal, bool weight_lse)
{
    gc_case c;
    gc_begin(&c, label, 700 + (uint64_t)(hq * 31 + hkv * 7 + s + t * 3 + causal * 2 + weight_lse));
    gt_value_id q = gc_param(&c, 4, S(2, hq, s, 3), -1, 1);
    gt_value_id k = gc_param(&c, 4, S(2, hkv, t, 3), -1, 1);
    gt_value_id v = gc_param(&c, 4, S(2, hkv, t, 4), -1, 1);
    gt_value_id outs[2];
    outs[0] = gt_sdpa(c.g, q, k, v, causal, 1.0 / sqrt(3.0), &outs[1]);
    gc_check(&c, weight_lse ? 2 : 1, outs);
    gc_end(&c);
}

static void test_sdpa(void)
{
    test_sdpa_case("sdpa gqa hq=4 hkv=2, out only", 4, 2, 5, 5, false, false);
    test_sdpa_case("sdpa gqa hq=4 hkv=2, out and lse", 4, 2, 5, 5, false, true);
    test_sdpa_case("sdpa gqa causal, out only", 4, 2, 5, 5, true, false);
    test_sdpa_case("sdpa gqa causal, out and lse", 4, 2, 5, 5, true, true);
    test_sdpa_case("sdpa mha causal", 2, 2, 3, 3, true, true);
    test_sdpa_case("sdpa s=3 t=5", 2, 1, 3, 5, false, true);

    /* Only lse reaches the loss: dout of out is absent and the rule substitutes zeros. */
    gc_case c;
    gc_begin(&c, "sdpa lse only", 790);
    gt_value_id q = gc_param(&c, 4, S(1, 2, 4, 3), -1, 1);
    gt_value_id k = gc_param(&c, 4, S(1, 1, 4, 3), -1, 1);
    gt_value_id v = gc_param(&c, 4, S(1, 1, 4, 2), -1, 1);
    gt_value_id lse;
    gt_sdpa(c.g, q, k, v, true, 0.5, &lse);
    /* v does not reach lse: its gradient is a zero full, which FD agrees with. */
    gc_run1(&c, lse);
}

/* Layout 1: q [2, s, hq, 3], k [2, t, hkv, 3], v [2, t, hkv, 4]; lse stays [2, hq, s], so the
 * lse path's -dlse column goes through the rule's transpose to [b, s, h, 1]. */
static void test_sdpa_layout1_case(const char *label, int64_t hq, int64_t hkv, int64_t s, int64_t t,
                                   bool causal, bool weight_lse)
{
    gc_case c;
    gc_begin(&c, label, 740 + (uint64_t)(hq * 31 + hkv * 7 + s + t * 3 + causal * 2 + weight_lse));
    gt_value_id q = gc_param(&c, 4, S(2, s, hq, 3), -1, 1);
    gt_value_id k = gc_param(&c, 4, S(2, t, hkv, 3), -1, 1);
    gt_value_id v = gc_param(&c, 4, S(2, t, hkv, 4), -1, 1);
    gt_value_id outs[2];
    outs[0] = gt_sdpa_layout(c.g, q, k, v, causal, 1.0 / sqrt(3.0), 1, &outs[1]);
    gc_check(&c, weight_lse ? 2 : 1, outs);
    gc_end(&c);
}

static void test_sdpa_layout1(void)
{
    test_sdpa_layout1_case("sdpa layout 1 gqa, out only", 4, 2, 5, 5, false, false);
    test_sdpa_layout1_case("sdpa layout 1 gqa, out and lse", 4, 2, 5, 5, false, true);
    test_sdpa_layout1_case("sdpa layout 1 gqa causal, out and lse", 4, 2, 5, 5, true, true);
    test_sdpa_layout1_case("sdpa layout 1 s=3 t=5, out and lse", 2, 1, 3, 5, false, true);

    /* Only lse reaches the loss (dout of out absent: zeros in layout 1's shape). */
    gc_case c;
    gc_begin(&c, "sdpa layout 1 lse only", 791);
    gt_value_id q = gc_param(&c, 4, S(1, 4, 2, 3), -1, 1);
    gt_value_id k = gc_param(&c, 4, S(1, 4, 1, 3), -1, 1);
    gt_value_id v = gc_param(&c, 4, S(1, 4, 1, 2), -1, 1);
    gt_value_id lse;
    gt_sdpa_layout(c.g, q, k, v, true, 0.5, 1, &lse);
    gc_run1(&c, lse);
}

/* ---------------------------------------------------------------- softmax, loss, embedding */

static void test_softmax(void)
{
    gc_case c;
    gc_begin(&c, "softmax [3,5] dim -1", 800);
    gc_run1(&c, gt_softmax(c.g, gc_param(&c, 2, S(3, 5), -2, 2), -1));
    gc_begin(&c, "softmax [4,3,2] dim 1", 801);
    gc_run1(&c, gt_softmax(c.g, gc_param(&c, 3, S(4, 3, 2), -2, 2), 1));
}

static void test_cross_entropy(void)
{
    gc_case c;
    gc_begin(&c, "cross_entropy [5,7] i64 targets, one ignored", 900);
    gt_value_id logits = gc_param(&c, 2, S(5, 7), -2, 2);
    gt_value_id targets = gc_ids(&c, GT_I64, 1, S(5), S(1, -100, 6, 0, 3));
    gc_run1(&c, gt_cross_entropy(c.g, logits, targets, -100));

    gc_begin(&c, "cross_entropy [4,3] i32 targets, ignore_index 2", 901);
    logits = gc_param(&c, 2, S(4, 3), -2, 2);
    targets = gc_ids(&c, GT_I32, 1, S(4), S(2, 0, 1, 2));
    gc_run1(&c, gt_cross_entropy(c.g, logits, targets, 2));
}

static void test_embedding(void)
{
    gt_dtype dts[2] = {GT_I32, GT_I64};
    for (int i = 0; i < 2; i++) {
        gc_case c;
        gc_begin(&c, i ? "embedding [7,4] i64 ids" : "embedding [7,4] i32 ids", 1000 + (uint64_t)i);
        gt_value_id w = gc_param(&c, 2, S(7, 4), -1, 1);
        /* repeated ids: their rows' gradients must add up */
        gt_value_id ids = gc_ids(&c, dts[i], 2, S(2, 3), S(1, 4, 1, 6, 0, 4));
        gc_run1(&c, gt_embedding(c.g, w, ids));
    }
    gc_case c;
    gc_begin(&c, "embedding_backward [2,3,4] -> [7,4]", 1010);
    gt_value_id dy = gc_param(&c, 3, S(2, 3, 4), -1, 1);
    gt_value_id ids = gc_ids(&c, GT_I32, 2, S(2, 3), S(1, 4, 1, 6, 0, 4));
    gc_run1(&c, gt_embedding_backward(c.g, ids, dy, gt_c(c.g, 7)));
}

/* ---------------------------------------------------------------- accumulation, unused params */

static void test_accumulation(void)
{
    /* x feeds three input slots (both of mul, and exp): its gradient is 2x + exp(x), summed from
     * three contributions. */
    gc_case c;
    gc_begin(&c, "x used three times: x*x + exp(x)", 1100);
    gt_value_id x = gc_param(&c, 2, S(3, 5), -1, 1);
    gc_run1(&c, gt_add(c.g, gt_mul(c.g, x, x), gt_unary(c.g, GT_OP_EXP, x)));

    /* A chain where one value is used by consumers at different depths. */
    gc_begin(&c, "diamond: h = silu(x); h*w + sigmoid(h)", 1101);
    x = gc_param(&c, 2, S(3, 5), -1, 1);
    gt_value_id w = gc_param(&c, 1, S(5), -1, 1);
    gt_value_id h = gt_unary(c.g, GT_OP_SILU, x);
    gc_run1(&c, gt_add(c.g, gt_mul(c.g, h, w), gt_unary(c.g, GT_OP_SIGMOID, h)));

    /* p1 is a PARAM the loss never touches: its gradient must be exactly zero. */
    gc_begin(&c, "unused param", 1102);
    gt_value_id p0 = gc_param(&c, 2, S(3, 5), -1, 1);
    gc_param(&c, 2, S(2, 2), -1, 1);
    gt_value_id y = gt_unary(c.g, GT_OP_EXP, p0);
    gt_tensor grads[2] = {{0}};
    gc_check_keep(&c, 1, &y, grads);
    bool zero = grads[1].data != NULL;
    for (int i = 0; zero && i < 4; i++)
        zero = gt_tensor_get_f32(&grads[1], i) == 0.0f;
    EXPECT(zero, "unused param: gradient is not exactly zero");
    gt_tensor_free(&grads[0]);
    gt_tensor_free(&grads[1]);
    gc_end(&c);
}

int main(void)
{
    test_matmul();
    test_rms_norm();
    test_rope();
    test_sdpa();
    test_sdpa_layout1();
    test_softmax();
    test_cross_entropy();
    test_embedding();
    test_accumulation();
    return gt_test_finish();
}
