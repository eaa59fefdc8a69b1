/* test_cpu_matmul.c — CPU matmul: rank-2, a's leading dims with a rank-2 b (trans_a both ways),
 * equal-rank batches, every trans combination, odd and degenerate sizes (1, K = 0), products cut
 * into blocks, bf16/f16, determinism, and the same bits on 1, 2, 3, 5 and 16 threads. Reference:
 * double loops; tolerance 1e-5 relative (plus 1e-5 of the largest entry for cancellation). */
#include "test_cpu_util.h"

typedef struct {
    int nbatch_a, nbatch_b; /* leading dims of a / b (b: 0 = rank 2) */
    int64_t batch[2];
    int64_t m, n, k;
} mm_case;

/* Stored shape of an operand: [batch..., rows, cols], rows/cols swapped when transposed. */
static int stored(int nb, const int64_t *batch, int64_t rows, int64_t cols, bool trans,
                  int64_t *shape)
{
    for (int d = 0; d < nb; d++)
        shape[d] = batch[d];
    shape[nb] = trans ? cols : rows;
    shape[nb + 1] = trans ? rows : cols;
    return nb + 2;
}

/* A case's random operands and output, and the matmul call over them (k). */
static void make_call(const mm_case *mc, bool ta, bool tb, tt_rng *r, gt_tensor *a, gt_tensor *b,
                      gt_tensor *out, tt_call *k)
{
    int64_t as[4], bs[4], os[4];
    int an = stored(mc->nbatch_a, mc->batch, mc->m, mc->k, ta, as);
    int bn = stored(mc->nbatch_b, mc->batch, mc->k, mc->n, tb, bs);
    int on = stored(mc->nbatch_a, mc->batch, mc->m, mc->n, false, os);
    *a = tt_rand(an, as, r, -1, 1);
    *b = tt_rand(bn, bs, r, -1, 1);
    *out = tt_new(GT_F32, on, os);
    tt_init(k, GT_OP_MATMUL);
    tt_in(k, a);
    tt_in(k, b);
    tt_out(k, out);
    tt_i(k, ta);
    tt_i(k, tb);
}

static void run_case(const mm_case *mc, bool ta, bool tb, tt_rng *r, bool half)
{
    gt_tensor a, b, out;
    tt_call k;
    make_call(mc, ta, tb, r, &a, &b, &out, &k);
    int64_t nbatch = 1;
    for (int d = 0; d < mc->nbatch_a; d++)
        nbatch *= mc->batch[d];
    double *ref = tt_doubles(nbatch * mc->m * mc->n);
    const float *ap = a.data, *bp = b.data;
    for (int64_t z = 0; z < nbatch; z++) {
        const float *az = ap + z * mc->m * mc->k;
        const float *bz = bp + (mc->nbatch_b ? z * mc->k * mc->n : 0);
        for (int64_t i = 0; i < mc->m; i++)
            for (int64_t j = 0; j < mc->n; j++) {
                double s = 0.0;
                for (int64_t p = 0; p < mc->k; p++) {
                    double av = ta ? az[p * mc->m + i] : az[i * mc->k + p];
                    double bv = tb ? bz[j * mc->k + p] : bz[p * mc->n + j];
                    s += av * bv;
                }
                ref[(z * mc->m + i) * mc->n + j] = s;
            }
    }
    if (tt_run_ok(&k, "matmul"))
        EXPECT(tt_close(&out, ref, 1e-5, 1e-5, "matmul"), "m %lld n %lld k %lld ta %d tb %d",
               (long long)mc->m, (long long)mc->n, (long long)mc->k, ta, tb);
    EXPECT(tt_deterministic(&k), "matmul determinism");
    if (half) {
        EXPECT(tt_half_path(&k, GT_BF16, 0), "matmul bf16 ta %d tb %d", ta, tb);
        EXPECT(tt_half_path(&k, GT_F16, 0), "matmul f16 ta %d tb %d", ta, tb);
    }
    free(ref);
    gt_tensor_free(&a);
    gt_tensor_free(&b);
    gt_tensor_free(&out);
}

static void test_matmul(tt_rng *r)
{
    const mm_case cases[] = {
        {0, 0, {0}, 3, 5, 7},       {0, 0, {0}, 1, 1, 1},     {0, 0, {0}, 19, 1, 3},
        {0, 0, {0}, 1, 19, 7},      {0, 0, {0}, 4, 3, 0},     {2, 0, {2, 3}, 3, 5, 7},
        {1, 0, {3}, 19, 7, 3},      {1, 1, {2}, 3, 5, 7},     {2, 2, {2, 3}, 7, 1, 19},
        {1, 1, {3}, 1, 7, 19},      {0, 0, {0}, 67, 71, 129}, {1, 0, {2}, 33, 65, 17},
        {0, 0, {0}, 600, 131, 263}, /* cut into blocks of rows (cpu_matmul.c) */
        {0, 0, {0}, 37, 1100, 500}, /* ... of columns */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                run_case(&cases[c], ta, tb, r, c % 3 == 0);

    /* Mismatched inner dims are an error. */
    gt_tensor a = tt_rand(2, TT_SHAPE(3, 4), r, -1, 1), b = tt_rand(2, TT_SHAPE(5, 2), r, -1, 1);
    gt_tensor out = tt_new(GT_F32, 2, TT_SHAPE(3, 2));
    tt_call k;
    tt_init(&k, GT_OP_MATMUL);
    tt_in(&k, &a);
    tt_in(&k, &b);
    tt_out(&k, &out);
    tt_i(&k, 0);
    tt_i(&k, 0);
    gt_error err = {0};
    EXPECT(tt_run(&k, &err) == GT_ERR_SHAPE, "matmul [3,4] @ [5,2] must fail");
    gt_tensor_free(&a);
    gt_tensor_free(&b);
    gt_tensor_free(&out);
}

/* A product's bits do not depend on the thread count (cpu_matmul.c cuts a large sgemm into blocks
 * of its output by its shape alone). OpenBLAS's own threads would fail this: its split moves
 * which micro-kernel (full tile or edge) computes an element, and those round differently (~10%
 * of the elements of a 256^3 product between 1 and 2 threads, OpenBLAS 0.3.21). Cases: blocks
 * of rows (m >= n) and of columns, every transpose, a blocked batch, an odd size that leaves a
 * short last block, the largest block count, and a product too small to be cut. Every output is
 * pre-filled with a pattern (tt_deterministic), so a block left unwritten fails too. */
static void test_threads(tt_rng *r)
{
    const mm_case cases[] = {
        {0, 0, {0}, 600, 131, 263},  /* 20.7 M multiply-adds: 2 blocks of rows, the last short */
        {0, 0, {0}, 37, 1100, 500},  /* 2 blocks of columns */
        {1, 1, {2}, 520, 97, 400},   /* a batch of two, each blocked */
        {0, 0, {0}, 4100, 517, 130}, /* 16 blocks (the most), a short last one */
        {0, 0, {0}, 33, 40, 50},     /* too small: one call */
    };
    const int counts[] = {2, 3, 5, 16};
    int differ = 0, runs = 0;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int t = 0; t < 4; t++) {
            const mm_case *mc = &cases[c];
            bool ta = t & 1, tb = t >> 1;
            gt_tensor a, b, one;
            tt_call k;
            make_call(mc, ta, tb, r, &a, &b, &one, &k);
            gt_tensor many = tt_new(GT_F32, one.ndim, one.shape);
            gt_cpu_set_threads(1);
            tt_run_ok(&k, "matmul on 1 thread");
            k.c.out[0] = &many;
            for (int q = 0; q < 4; q++) {
                gt_cpu_set_threads(counts[q]);
                EXPECT(tt_deterministic(&k), "matmul on %d threads is not deterministic",
                       counts[q]);
                runs++;
                if (!tt_same_bits(&one, &many)) {
                    differ++;
                    fprintf(stderr, "  %lldx%lldx%lld ta %d tb %d: %d threads differ from 1\n",
                            (long long)mc->m, (long long)mc->n, (long long)mc->k, ta, tb,
                            counts[q]);
                }
            }
            gt_cpu_set_threads(1);
            gt_tensor_free(&a);
            gt_tensor_free(&b);
            gt_tensor_free(&one);
            gt_tensor_free(&many);
        }
    EXPECT(differ == 0, "%d of %d (case, thread count) products differ from one thread's bits",
           differ, runs);
}

int main(void)
{
    tt_rng r = {3};
    test_matmul(&r);
    test_threads(&r);
    return gt_test_finish();
}
