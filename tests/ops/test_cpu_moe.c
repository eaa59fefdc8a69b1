/* test_cpu_moe.c — DeepSeek-V3's MoE ops on the CPU: each kernel against a naive reference written
 * here (sign, moe_topk with groups and ties, gather_last and its backward, moe_sort against a
 * naive stable sort, moe_count, grouped_matmul and grouped_matmul_dw in double), grouped_matmul's
 * M-invariance (a row's bits whatever the group split, offsets or R), YaRN / interleaved rope
 * against a double reference and finite differences, and the gradient rules (gather_last,
 * grouped_matmul both ways, grouped_matmul_dw, embedding_backward, a NONDIFF router) against
 * finite differences (grad_check.h). */
#include <math.h>
#include <stdlib.h>

#include "grad_check.h"
#include "graphtrain/gt_parallel.h"
#include "test_cpu_util.h"

#define S(...) ((const int64_t[]){__VA_ARGS__})

static gt_tensor ids_tensor(int ndim, const int64_t *shape, const int32_t *v)
{
    gt_tensor t = tt_new(GT_I32, ndim, shape);
    memcpy(t.data, v, gt_tensor_nbytes(&t));
    return t;
}

/* ---------------------------------------------------------------- sign */

static void test_sign(void)
{
    const float v[] = {-2.5f, -0.0f, 0.0f, 3.0f, NAN, -INFINITY, INFINITY, 1e-30f};
    const float want[] = {-1, 0, 0, 1, NAN, -1, 1, 1};
    gt_tensor x = tt_new(GT_F32, 1, S(8)), y = tt_new(GT_F32, 1, S(8));
    memcpy(x.data, v, sizeof v);
    tt_call k;
    tt_init(&k, GT_OP_SIGN);
    tt_in(&k, &x);
    tt_out(&k, &y);
    if (tt_run_ok(&k, "sign"))
        for (int i = 0; i < 8; i++) {
            float g = ((float *)y.data)[i];
            EXPECT(isnan(want[i]) ? isnan(g) : g == want[i], "sign[%d] = %g", i, g);
        }
    EXPECT(tt_half_path(&k, GT_BF16, 0), "sign bf16");
    gt_tensor_free(&x);
    gt_tensor_free(&y);
}

/* ---------------------------------------------------------------- moe_topk */

/* Indices 0..n-1 of v sorted by (value descending, index ascending): insertion sort. */
static void rank_desc(const float *v, int n, int *out)
{
    for (int i = 0; i < n; i++) {
        int j = i;
        while (j > 0 && v[out[j - 1]] < v[i])
            j--;
        for (int m = i; m > j; m--)
            out[m] = out[m - 1];
        out[j] = i;
    }
}

static void ref_topk(const float *x, int e, int k, int groups, int lim, int32_t *ids)
{
    float row[64], gs[16];
    int ord[64];
    memcpy(row, x, (size_t)e * sizeof *row);
    if (groups > 1) {
        int gsz = e / groups;
        for (int g = 0; g < groups; g++) {
            rank_desc(x + g * gsz, gsz, ord);
            gs[g] = gsz > 1 ? x[g * gsz + ord[0]] + x[g * gsz + ord[1]] : x[g * gsz + ord[0]];
        }
        rank_desc(gs, groups, ord);
        for (int m = lim; m < groups; m++)
            for (int j = 0; j < gsz; j++)
                row[ord[m] * gsz + j] = -INFINITY;
    }
    rank_desc(row, e, ord);
    for (int m = 0; m < k; m++)
        ids[m] = ord[m];
}

static void test_topk(tt_rng *r)
{
    const int cfg[][4] = {{8, 2, 1, 1}, {8, 3, 4, 2}, {16, 4, 4, 2}, {6, 6, 1, 1}, {12, 3, 3, 1}};
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        int e = cfg[c][0], k = cfg[c][1], groups = cfg[c][2], lim = cfg[c][3], t = 9;
        gt_tensor s = tt_new(GT_F32, 2, S(t, e)), y = tt_new(GT_I32, 2, S(t, k));
        /* values on a grid of 8 so that ties (also between group scores) are common */
        for (int i = 0; i < t * e; i++)
            ((float *)s.data)[i] = (float)(int)tt_uniform(r, 0, 8) * 0.25f;
        tt_call kc;
        tt_init(&kc, GT_OP_MOE_TOPK);
        tt_in(&kc, &s);
        tt_out(&kc, &y);
        tt_i(&kc, k);
        tt_i(&kc, groups);
        tt_i(&kc, lim);
        if (tt_run_ok(&kc, "moe_topk")) {
            for (int ti = 0; ti < t; ti++) {
                int32_t want[64];
                ref_topk((float *)s.data + ti * e, e, k, groups, lim, want);
                EXPECT(memcmp(want, (int32_t *)y.data + ti * k, (size_t)k * 4) == 0,
                       "moe_topk case %zu row %d", c, ti);
            }
        }
        EXPECT(tt_deterministic(&kc), "moe_topk determinism");
        gt_tensor_free(&s);
        gt_tensor_free(&y);
    }
    /* ties by lower expert index, explicitly: all equal -> 0, 1, 2 */
    gt_tensor s = tt_new(GT_F32, 2, S(1, 4)), y = tt_new(GT_I32, 2, S(1, 3));
    for (int i = 0; i < 4; i++)
        ((float *)s.data)[i] = i == 3 ? 0.5f : 1.0f;
    tt_call kc;
    tt_init(&kc, GT_OP_MOE_TOPK);
    tt_in(&kc, &s);
    tt_out(&kc, &y);
    tt_i(&kc, 3);
    tt_i(&kc, 0);
    tt_i(&kc, 0);
    if (tt_run_ok(&kc, "moe_topk ties")) {
        int32_t *o = y.data;
        EXPECT(o[0] == 0 && o[1] == 1 && o[2] == 2, "ties: %d %d %d", o[0], o[1], o[2]);
    }
    gt_tensor_free(&s);
    gt_tensor_free(&y);
}

/* ---------------------------------------------------------------- gather_last, sort, count */

static void test_gather_sort_count(tt_rng *r)
{
    const int t = 7, e = 5, k = 3;
    int32_t id[7 * 3];
    for (int ti = 0; ti < t; ti++) /* distinct ids per row */
        for (int j = 0; j < k; j++)
            id[ti * k + j] = (int32_t)((ti * 2 + j * (1 + ti % 2)) % e);
    gt_tensor idx = ids_tensor(2, S(t, k), id);
    gt_tensor x = tt_rand(2, S(t, e), r, -1, 1), y = tt_new(GT_F32, 2, S(t, k));
    tt_call kc;
    tt_init(&kc, GT_OP_GATHER_LAST);
    tt_in(&kc, &x);
    tt_in(&kc, &idx);
    tt_out(&kc, &y);
    if (tt_run_ok(&kc, "gather_last"))
        for (int p = 0; p < t * k; p++)
            EXPECT(((float *)y.data)[p] == ((float *)x.data)[(p / k) * e + id[p]], "gather %d", p);
    EXPECT(tt_half_path(&kc, GT_BF16, 0), "gather_last bf16");

    gt_tensor dx = tt_new(GT_F32, 2, S(t, e));
    tt_init(&kc, GT_OP_GATHER_LAST_BACKWARD);
    tt_in(&kc, &idx);
    tt_in(&kc, &y);
    tt_out(&kc, &dx);
    tt_e(&kc, e);
    if (tt_run_ok(&kc, "gather_last_backward"))
        for (int p = 0; p < t * e; p++) {
            float want = 0.0f;
            for (int j = 0; j < k; j++)
                if (id[(p / e) * k + j] == p % e) want = ((float *)x.data)[p];
            EXPECT(((float *)dx.data)[p] == want, "scatter %d", p);
        }
    EXPECT(tt_deterministic(&kc), "gather_last_backward writes every element");

    /* moe_sort vs a naive stable sort: for each expert, the flat positions holding it */
    gt_tensor order = tt_new(GT_I32, 1, S(t * k)), token = tt_new(GT_I32, 1, S(t * k));
    gt_tensor off = tt_new(GT_I32, 1, S(e + 1)), cnt = tt_new(GT_F32, 1, S(e));
    tt_init(&kc, GT_OP_MOE_SORT);
    tt_in(&kc, &idx);
    tt_out(&kc, &order);
    tt_out(&kc, &token);
    tt_out(&kc, &off);
    tt_i(&kc, e);
    if (tt_run_ok(&kc, "moe_sort")) {
        int row = 0;
        for (int ex = 0; ex < e; ex++) {
            EXPECT(((int32_t *)off.data)[ex] == row, "offsets[%d]", ex);
            for (int p = 0; p < t * k; p++)
                if (id[p] == ex) {
                    EXPECT(((int32_t *)order.data)[row] == p &&
                               ((int32_t *)token.data)[row] == p / k,
                           "sorted row %d", row);
                    row++;
                }
        }
        EXPECT(((int32_t *)off.data)[e] == t * k, "offsets[E]");
    }
    EXPECT(tt_deterministic(&kc), "moe_sort determinism");
    tt_init(&kc, GT_OP_MOE_COUNT);
    tt_in(&kc, &idx);
    tt_out(&kc, &cnt);
    tt_i(&kc, e);
    if (tt_run_ok(&kc, "moe_count"))
        for (int ex = 0; ex < e; ex++) {
            int n = 0;
            for (int p = 0; p < t * k; p++)
                n += id[p] == ex;
            EXPECT(((float *)cnt.data)[ex] == (float)n, "count[%d]", ex);
        }
    /* an id outside [0, E) is an error naming it */
    ((int32_t *)idx.data)[4] = e;
    gt_error err = {0};
    EXPECT(tt_run(&kc, &err) == GT_ERR_INVALID && strstr(err.msg, "outside"), "bad id: %s",
           err.msg);
    gt_tensor *all[] = {&idx, &x, &y, &dx, &order, &token, &off, &cnt};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        gt_tensor_free(all[i]);
}

/* ---------------------------------------------------------------- grouped matmul */

static void gmm_call(tt_call *k, const gt_tensor *x, const gt_tensor *w, const gt_tensor *off,
                     gt_tensor *y, bool tb)
{
    tt_init(k, GT_OP_GROUPED_MATMUL);
    tt_in(k, x);
    tt_in(k, w);
    tt_in(k, off);
    tt_out(k, y);
    tt_i(k, tb);
}

static void test_grouped_matmul(tt_rng *r)
{
    const int64_t e = 4, din = 13, dout = 9, rows = 12;
    const int32_t offs[] = {1, 4, 4, 9, 10}; /* row 0 and rows 10.. are outside every group */
    for (int tb = 0; tb < 2; tb++) {
        gt_tensor x = tt_rand(2, S(rows, din), r, -1, 1);
        gt_tensor w =
            tb ? tt_rand(3, S(e, dout, din), r, -1, 1) : tt_rand(3, S(e, din, dout), r, -1, 1);
        gt_tensor off = ids_tensor(1, S(e + 1), offs), y = tt_new(GT_F32, 2, S(rows, dout));
        double *ref = tt_doubles(rows * dout);
        for (int64_t g = 0; g < e; g++)
            for (int64_t rr = offs[g]; rr < offs[g + 1]; rr++)
                for (int64_t o = 0; o < dout; o++)
                    for (int64_t i = 0; i < din; i++) {
                        int64_t wi = tb ? (g * dout + o) * din + i : (g * din + i) * dout + o;
                        ref[rr * dout + o] +=
                            (double)((float *)x.data)[rr * din + i] * (double)((float *)w.data)[wi];
                    }
        tt_call k;
        gmm_call(&k, &x, &w, &off, &y, tb);
        if (tt_run_ok(&k, "grouped_matmul"))
            EXPECT(tt_close_abs(&y, ref, 1e-5, 1e-6, 0.0, "grouped_matmul"), "trans_b %d", tb);
        EXPECT(tt_deterministic(&k), "grouped_matmul determinism");
        EXPECT(tt_half_path(&k, GT_BF16, 0), "grouped_matmul bf16");

        /* M-invariance: each row alone (R = 1, its group the only non-empty one), and all rows in
         * one shifted layout (R = 20, rows moved down by 5, other group sizes), give its bits. */
        gt_tensor x1 = tt_new(GT_F32, 2, S(1, din)), y1 = tt_new(GT_F32, 2, S(1, dout));
        gt_tensor x2 = tt_rand(2, S(20, din), r, -1, 1), y2 = tt_new(GT_F32, 2, S(20, dout));
        int32_t o2[5];
        for (int g = 0; g <= e; g++)
            o2[g] = offs[g] + 5;
        for (int64_t rr = 0; rr < rows; rr++)
            memcpy((float *)x2.data + (rr + 5) * din, (float *)x.data + rr * din, din * 4);
        gt_tensor off2 = ids_tensor(1, S(e + 1), o2);
        gmm_call(&k, &x2, &w, &off2, &y2, tb);
        bool ok2 = tt_run_ok(&k, "grouped_matmul shifted");
        for (int64_t g = 0; g < e; g++)
            for (int64_t rr = offs[g]; rr < offs[g + 1]; rr++) {
                int32_t o1[5];
                for (int m = 0; m <= e; m++)
                    o1[m] = m > g;
                gt_tensor off1 = ids_tensor(1, S(e + 1), o1);
                memcpy(x1.data, (float *)x.data + rr * din, din * 4);
                gmm_call(&k, &x1, &w, &off1, &y1, tb);
                if (tt_run_ok(&k, "grouped_matmul one row"))
                    EXPECT(memcmp(y1.data, (float *)y.data + rr * dout, dout * 4) == 0,
                           "row %lld alone differs (trans_b %d)", (long long)rr, tb);
                if (ok2)
                    EXPECT(memcmp((float *)y2.data + (rr + 5) * dout, (float *)y.data + rr * dout,
                                  dout * 4) == 0,
                           "row %lld shifted differs (trans_b %d)", (long long)rr, tb);
                gt_tensor_free(&off1);
            }
        free(ref);
        gt_tensor *all[] = {&x, &w, &off, &y, &x1, &y1, &x2, &y2, &off2};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            gt_tensor_free(all[i]);
    }

    /* dw[e] = sum over the group's rows of dy^T x; the empty group is zeros */
    gt_tensor x = tt_rand(2, S(rows, din), r, -1, 1), dy = tt_rand(2, S(rows, dout), r, -1, 1);
    gt_tensor off = ids_tensor(1, S(e + 1), offs), dw = tt_new(GT_F32, 3, S(e, dout, din));
    double *ref = tt_doubles(e * dout * din);
    for (int64_t g = 0; g < e; g++)
        for (int64_t rr = offs[g]; rr < offs[g + 1]; rr++)
            for (int64_t o = 0; o < dout; o++)
                for (int64_t i = 0; i < din; i++)
                    ref[(g * dout + o) * din + i] += (double)((float *)dy.data)[rr * dout + o] *
                                                     (double)((float *)x.data)[rr * din + i];
    tt_call k;
    tt_init(&k, GT_OP_GROUPED_MATMUL_DW);
    tt_in(&k, &x);
    tt_in(&k, &dy);
    tt_in(&k, &off);
    tt_out(&k, &dw);
    if (tt_run_ok(&k, "grouped_matmul_dw"))
        EXPECT(tt_close_abs(&dw, ref, 1e-5, 1e-6, 0.0, "grouped_matmul_dw"), "dw");
    EXPECT(tt_deterministic(&k), "grouped_matmul_dw determinism");
    EXPECT(tt_half_path(&k, GT_BF16, 0), "grouped_matmul_dw bf16");
    /* decreasing offsets are an error */
    ((int32_t *)off.data)[2] = 2;
    gt_error err = {0};
    EXPECT(tt_run(&k, &err) == GT_ERR_INVALID, "bad offsets: %s", err.msg);
    free(ref);
    gt_tensor_free(&x);
    gt_tensor_free(&dy);
    gt_tensor_free(&off);
    gt_tensor_free(&dw);
}

/* ---------------------------------------------------------------- rope: YaRN, interleaved */

/* YaRN from the formula (gt_ops.def / torchtitan's ComplexRoPE), in double. */
static void ref_yarn(double theta, double factor, double bf, double bs, double orig, int64_t d,
                     double *inv)
{
    const double pi = 3.14159265358979323846;
    double low = floor(d * log(orig / (bf * 2 * pi)) / (2 * log(theta)));
    double high = ceil(d * log(orig / (bs * 2 * pi)) / (2 * log(theta)));
    low = fmax(low, 0.0);
    high = fmin(high, (double)(d - 1));
    if (low == high) high += 0.001;
    for (int64_t j = 0; j < d / 2; j++) {
        double f = pow(theta, -2.0 * (double)j / (double)d);
        double ramp = fmin(fmax(((double)j - low) / (high - low), 0.0), 1.0);
        inv[j] = f / factor * ramp + f * (1.0 - ramp);
    }
}

static void ref_rope_pairs(const double *x, const int64_t *sh, const double *inv, bool inter,
                           double *y)
{
    int64_t half = sh[3] / 2;
    for (int64_t row = 0; row < sh[0] * sh[1] * sh[2]; row++) {
        int64_t p = (row / sh[2]) % sh[1], o = row * sh[3];
        for (int64_t j = 0; j < half; j++) {
            int64_t a = inter ? 2 * j : j, b = inter ? 2 * j + 1 : j + half;
            double c = cos((double)p * inv[j]), s = sin((double)p * inv[j]);
            y[o + a] = x[o + a] * c - x[o + b] * s;
            y[o + b] = x[o + b] * c + x[o + a] * s;
        }
    }
}

static void test_rope_yarn(tt_rng *r)
{
    const int64_t sh[4] = {2, 40, 3, 16};
    /* DeepSeek-V3's YaRN (theta 1e4, factor 40, beta 32 / 1, original 4096) and a setting whose
     * ramp is shorter; interleaved and not */
    const double ps[][5] = {{10000, 40, 32, 1, 4096}, {10000, 4, 32, 1, 64}, {500, 8, 4, 2, 16}};
    for (size_t pi = 0; pi < 3; pi++)
        for (int inter = 0; inter < 2; inter++) {
            gt_tensor x = tt_rand(4, sh, r, -1, 1), y = tt_new(GT_F32, 4, sh);
            int64_t n = gt_tensor_numel(&x);
            double *xd = tt_to_double(&x), *ref = tt_doubles(n), inv[8];
            ref_yarn(ps[pi][0], ps[pi][1], ps[pi][2], ps[pi][3], ps[pi][4], sh[3], inv);
            ref_rope_pairs(xd, sh, inv, inter, ref);
            tt_call k;
            tt_init(&k, GT_OP_ROPE);
            tt_in(&k, &x);
            tt_out(&k, &y);
            tt_i(&k, 0);
            tt_i(&k, (int64_t)ps[pi][4]);
            tt_i(&k, 2);
            tt_i(&k, inter);
            for (int f = 0; f < 4; f++)
                tt_f(&k, f == 0 ? ps[pi][0] : ps[pi][f]);
            if (tt_run_ok(&k, "rope yarn"))
                EXPECT(tt_close(&y, ref, 2e-5, 2e-5, "rope yarn"), "params %zu inter %d", pi,
                       inter);
            EXPECT(tt_half_path(&k, GT_BF16, 0), "rope yarn bf16");
            /* the inverse undoes it (orthogonal): rope^-1(rope(x)) = x */
            gt_tensor back = tt_new(GT_F32, 4, sh);
            k.c.in[0] = &y;
            k.c.out[0] = &back;
            k.i[0] = 1;
            if (tt_run_ok(&k, "rope yarn inverse"))
                EXPECT(tt_close(&back, xd, 1e-5, 1e-5, "rope yarn inverse"), "params %zu", pi);
            free(xd);
            free(ref);
            gt_tensor_free(&x);
            gt_tensor_free(&y);
            gt_tensor_free(&back);
        }
}

/* ---------------------------------------------------------------- gradient rules */

static void test_grads(void)
{
    gc_case c;
    const int32_t id[] = {2, 0, 4, 1, 3, 0, 0, 4, 2, 1, 2, 3};
    int64_t id64[12];
    for (int i = 0; i < 12; i++)
        id64[i] = id[i];

    gc_begin(&c, "gather_last [4,5] k 3", 3600);
    gt_value_id x = gc_param(&c, 2, S(4, 5), -1, 1);
    gc_run1(&c, gt_gather_last(c.g, x, gc_ids(&c, GT_I32, 2, S(4, 3), id64)));

    gc_begin(&c, "gather_last_backward [4,3] -> [4,5]", 3601);
    gt_value_id dy = gc_param(&c, 2, S(4, 3), -1, 1);
    gc_run1(&c,
            gt_gather_last_backward(c.g, gc_ids(&c, GT_I32, 2, S(4, 3), id64), dy, gt_c(c.g, 5)));

    const int64_t offs[] = {0, 3, 3, 7, 8}; /* an empty group and a trailing row outside */
    for (int tb = 0; tb < 2; tb++) {
        gc_begin(&c, tb ? "grouped_matmul trans_b" : "grouped_matmul", 3610 + (uint64_t)tb);
        gt_value_id xx = gc_param(&c, 2, S(9, 5), -1, 1);
        gt_value_id w =
            tb ? gc_param(&c, 3, S(4, 6, 5), -1, 1) : gc_param(&c, 3, S(4, 5, 6), -1, 1);
        gt_value_id off = gc_ids(&c, GT_I32, 1, S(5), offs);
        gc_run1(&c, gt_grouped_matmul(c.g, xx, w, off, tb));
    }
    gc_begin(&c, "grouped_matmul_dw", 3620);
    gt_value_id xx = gc_param(&c, 2, S(9, 5), -1, 1), d2 = gc_param(&c, 2, S(9, 6), -1, 1);
    gc_run1(&c, gt_grouped_matmul_dw(c.g, xx, d2, gc_ids(&c, GT_I32, 1, S(5), offs)));

    /* the MoE combine: embedding_backward(token, y) with num_embeddings = T, differentiated */
    gc_begin(&c, "embedding_backward combine", 3630);
    gt_value_id ys = gc_param(&c, 2, S(12, 3), -1, 1);
    const int64_t tok[] = {0, 0, 1, 1, 1, 2, 3, 3, 2, 0, 1, 3};
    gc_run1(&c, gt_embedding_backward(c.g, gc_ids(&c, GT_I32, 1, S(12), tok), ys, gt_c(c.g, 4)));

    /* rope with YaRN and interleaved pairs: its gradient is the same rope, inverse */
    for (int inter = 0; inter < 2; inter++) {
        gc_begin(&c, inter ? "rope yarn interleaved" : "rope yarn", 3650 + (uint64_t)inter);
        gt_rope_params rp = {.theta = 500,
                             .factor = 8,
                             .low_freq_factor = 4,
                             .high_freq_factor = 2,
                             .original_max_position = 16,
                             .scaling = GT_ROPE_YARN,
                             .interleaved = inter};
        gc_run1(&c, gt_rope(c.g, gc_param(&c, 4, S(1, 6, 2, 8), -1, 1), &rp, false));
    }

    /* a router: ids = moe_topk(x) (NONDIFF), w = gather_last(softmax(x), ids); the gradient flows
     * through gather_last and softmax only; scores 0.1 apart keep the routing under FD steps (group
     * sums could tie, so no groups here: test_topk covers them) */
    gc_begin(&c, "router topk + gather_last", 3640);
    gt_value_id s = gc_param_distinct(&c, 2, S(5, 8));
    gt_value_id ids = gt_moe_topk(c.g, s, 3, 0, 0);
    gt_value_id sm = gt_softmax(c.g, s, -1);
    gt_value_id wts = gt_gather_last(c.g, sm, ids);
    gt_value_id cnt = gt_moe_count(c.g, ids, 8);
    gt_value_id sg = gt_sign(c.g, gt_reduce(c.g, GT_OP_SUM, wts, 1, (const int[]){1}, true));
    gt_value_id outs[2] = {gt_mul(c.g, wts, sg), cnt};
    gc_check(&c, 2, outs);
    gc_end(&c);
}

/* ---------------------------------------------------------------- parallelize */

/* On a mesh dim of two ranks that splits the tokens, the routing runs on each rank's own tokens:
 * moe_topk keeps the row split, moe_count is partial (each rank counts its own rows), and the
 * counts metric, made replicate, is their all-reduce; sign (elementwise) keeps the split. */
static void test_parallel_tokens(void)
{
    gt_graph *g = gt_graph_new();
    gt_expr dims[2] = {gt_c(g, 4), gt_c(g, 8)};
    gt_value_id x = gt_graph_add_input(g, GT_IN_INPUT, "x", GT_F32, 2, dims);
    gt_graph_add_output(g, GT_OUT_METRIC, "sign", gt_sign(g, x));
    gt_graph_add_output(g, GT_OUT_METRIC, "counts", gt_moe_count(g, gt_moe_topk(g, x, 2, 0, 0), 8));
    EXPECT(g->err.code == GT_OK, "building: %s", g->err.msg);
    gt_parallel_plan plan = {0};
    gt_error err = {0};
    GT_CHECK(gt_mesh_init(&plan.mesh, 1, 2, 1, &err) == GT_OK);
    gt_placement place[1][GT_MESH_MAX_DIMS];
    EXPECT_OK(gt_parallel_input_layouts(&plan, g, place, &err), &err);
    place[0][GT_MESH_DP_SHARD] = (gt_placement){GT_PLACE_SHARD, 0, 0, 0}; /* the tokens split */
    gt_graph *out = NULL;
    gt_status st =
        gt_parallelize(g, &plan, (const gt_placement(*)[GT_MESH_MAX_DIMS])place, &out, &err);
    EXPECT(st == GT_OK, "parallelize: %s: %s", gt_status_name(st), err.msg);
    if (out) {
        int topk = 0, reduce = 0;
        for (int32_t i = 0; i < out->n_nodes; i++) {
            const gt_node *n = &out->nodes[i];
            if (n->op == GT_OP_MOE_TOPK) {
                int64_t rows = 0;
                topk += gt_sym_is_const(out->sym, gt_value_type(out, n->in[0])->dims[0], &rows) &&
                        rows == 2;
            }
            reduce += n->op == GT_OP_ALL_REDUCE_START;
        }
        EXPECT(topk == 1, "moe_topk routes the rank's 2 of 4 tokens");
        EXPECT(reduce == 1, "the counts are all-reduced once (%d)", reduce);
        gt_graph_free(out);
    }
    gt_graph_free(g);
}

int main(void)
{
    tt_rng r = {36};
    test_sign();
    test_topk(&r);
    test_gather_sort_count(&r);
    test_grouped_matmul(&r);
    test_rope_yarn(&r);
    test_grads();
    test_parallel_tokens();
    return gt_test_finish();
}
