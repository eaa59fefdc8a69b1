/* test_cuda_adamw_multi.c — the multi-tensor AdamW launch (gt_cuda_adamw_multi_*, gt_cuda.h) and
 * the CUDA program's optimizer tail built on it (gt_cuda_program_build groups its adamw
 * instructions; plan option no_adamw_groups keeps one launch each), label cuda.
 *
 * Kernel level: 14 tensors of assorted sizes (1, 3, 4, 5, 7, 12, 1023, 2048, 4096, 4099 and four
 * near 1e6, whole packs and every tail length), gradients f32 and bf16 alternating, random data
 * from a seeded splitmix64 stream. Three launches are built once: weight decay 0.1 on two tensors
 * of three and 0 on the rest (out of place), 0 everywhere (out of place), and the mixed decays in
 * place (p', m', v' over p, m, v). Each runs for clip 1 and 0.37 and for the scalars of steps 1
 * and 7, written into the same device scalars / clip tensors between runs (the table holds their
 * pointers, so the launch must read each run's values). Reference: gt_cuda_run_kernel once per
 * tensor with the same attributes; p', m', v' must be bitwise equal for every tensor. Output
 * buffers are pre-filled with different byte patterns on the two sides, so an element the launch
 * skips shows. Also: gt_cuda_adamw_groupable refuses a bf16 param, a misaligned pointer and an
 * empty tensor; gt_cuda_adamw_multi_create refuses other scalars, two nonzero weight decays and a
 * call off the vector path, naming the call.
 *
 * Program level: llama3 test_tiny and test_odd in f32, and test_tiny with bf16 compute through
 * the pass pipeline (fusion: AdamW reads bf16 gradients), STEPS steps from one initial state with
 * grouping off (one launch per adamw), grouping on, and grouping on with the step captured as a
 * CUDA graph after step 1 (replays use the uploaded table): every output of every step and the
 * final state bitwise equal to grouping off; grouping on makes one launch for the whole tail where
 * off makes one per parameter (gt_cuda_program_adamw_launches).
 * Without a CUDA device the test skips (exit 0). */
#include "cuda_test_util.h"
#include "fusion_graphs.h"
#include "graphtrain/gt_cuda.h"
#include "graphtrain/gt_program.h"
#include "step_harness.h"

#include <string.h>

static gt_cuda_stream *g_stream;

/* ---------------------------------------------------------------- kernel level */

#define N_T 14
static const int64_t sizes[N_T] = {1, 3,  4,       5,       1023,   4099, 2048,
                                   7, 12, 1000003, 1048576, 999999, 4096, 1000000};

/* Host and device copies of one tensor's p, g, m, v; the reference's and the launch's outputs;
 * p, m, v again for the in-place launch. */
typedef struct {
    gt_tensor h[4], d[4];
    gt_tensor ref[3], out[3], inplace[3];
} tensor_set;

static double wd_mixed(int k)
{
    return k % 3 ? 0.1 : 0.0;
}

static gt_status upload_new(const gt_tensor *h, gt_tensor *d, gt_error *err)
{
    return gt_cuda_tensor_upload(g_stream, h, d, err);
}

/* Copies host tensor h into the existing device tensor d (same dtype and numel). */
static gt_status copy_in(const gt_tensor *h, gt_tensor *d, gt_error *err)
{
    return gt_cuda_memcpy_h2d(g_stream, d->data, h->data, gt_tensor_nbytes(h), err);
}

static gt_tensor download(const gt_tensor *d)
{
    gt_tensor h = cu_tensor_new(d->dtype, d->ndim, d->shape);
    gt_error err = {0};
    EXPECT_OK(gt_cuda_tensor_download(g_stream, d, &h, &err), &err);
    return h;
}

/* The adamw call of tensor set t: inputs its device p, g, m, v (or, in place, t->inplace), the
 * shared scalars and clip, outputs o; attributes f (four of them). */
static gt_kernel_call adamw_call(tensor_set *t, bool in_place, gt_tensor *sc, gt_tensor *cl,
                                 gt_tensor *o, const double *f)
{
    gt_kernel_call c;
    memset(&c, 0, sizeof c);
    c.op = GT_OP_ADAMW;
    c.f = f;
    c.nf = 4;
    c.n_in = 6;
    c.n_out = 3;
    c.in[0] = in_place ? &t->inplace[0] : &t->d[0];
    c.in[1] = &t->d[1];
    c.in[2] = in_place ? &t->inplace[1] : &t->d[2];
    c.in[3] = in_place ? &t->inplace[2] : &t->d[3];
    c.in[4] = sc;
    c.in[5] = cl;
    for (int j = 0; j < 3; j++)
        c.out[j] = &o[j];
    return c;
}

/* Number of the N_T tensors whose three updates (device, the reference's vs b_of's) differ. */
static int count_differing(tensor_set *ts, gt_tensor *(*b_of)(tensor_set *))
{
    int bad = 0;
    for (int k = 0; k < N_T; k++) {
        bool same = true;
        for (int j = 0; j < 3; j++) {
            gt_tensor a = download(&ts[k].ref[j]);
            gt_tensor b = download(&b_of(&ts[k])[j]);
            same = same && same_bits(&a, &b);
            gt_tensor_free(&a);
            gt_tensor_free(&b);
        }
        bad += !same;
    }
    return bad;
}

static gt_tensor *launch_out(tensor_set *t)
{
    return t->out;
}

static gt_tensor *launch_inplace(tensor_set *t)
{
    return t->inplace;
}

static void test_kernel(void)
{
    gt_error err = {0};
    uint64_t rng = 0x5eedada11ull;
    tensor_set *ts = calloc(N_T, sizeof *ts);
    for (int k = 0; k < N_T && !err.code; k++) {
        int64_t n = sizes[k];
        gt_dtype gd = k % 2 ? GT_BF16 : GT_F32;
        ts[k].h[0] = cu_tensor_rand(&rng, GT_F32, 1, &n, -1, 1);
        ts[k].h[1] = cu_tensor_rand(&rng, gd, 1, &n, -1, 1);
        ts[k].h[2] = cu_tensor_rand(&rng, GT_F32, 1, &n, -0.1, 0.1);
        ts[k].h[3] = cu_tensor_rand(&rng, GT_F32, 1, &n, 0, 0.01);
        for (int j = 0; j < 4 && !err.code; j++)
            EXPECT_OK(upload_new(&ts[k].h[j], &ts[k].d[j], &err), &err);
        for (int j = 0; j < 3 && !err.code; j++) {
            EXPECT_OK(gt_cuda_tensor_alloc(&ts[k].ref[j], GT_F32, 1, &n, &err), &err);
            EXPECT_OK(gt_cuda_tensor_alloc(&ts[k].out[j], GT_F32, 1, &n, &err), &err);
            EXPECT_OK(upload_new(&ts[k].h[j ? j + 1 : 0], &ts[k].inplace[j], &err), &err);
        }
    }
    gt_tensor sc, cl;
    EXPECT_OK(gt_cuda_tensor_alloc(&sc, GT_F32, 1, (const int64_t[]){3}, &err), &err);
    EXPECT_OK(gt_cuda_tensor_alloc(&cl, GT_F32, 0, NULL, &err), &err);
    if (err.code) return;

    /* attributes: beta1, beta2, eps, weight decay per tensor (mixed) or 0 (none) */
    double f_mixed[N_T][4], f_none[4] = {0.9, 0.95, 1e-8, 0.0};
    gt_kernel_call c_mixed[N_T], c_none[N_T], c_inplace[N_T];
    for (int k = 0; k < N_T; k++) {
        f_mixed[k][0] = 0.9, f_mixed[k][1] = 0.95, f_mixed[k][2] = 1e-8;
        f_mixed[k][3] = wd_mixed(k);
        c_mixed[k] = adamw_call(&ts[k], false, &sc, &cl, ts[k].out, f_mixed[k]);
        c_none[k] = adamw_call(&ts[k], false, &sc, &cl, ts[k].out, f_none);
        c_inplace[k] = adamw_call(&ts[k], true, &sc, &cl, ts[k].inplace, f_mixed[k]);
        EXPECT(gt_cuda_adamw_groupable(&c_mixed[k]) && gt_cuda_adamw_groupable(&c_inplace[k]),
               "tensor %d of %lld elements is groupable", k, (long long)sizes[k]);
    }
    gt_cuda_adamw_multi *m_mixed = NULL, *m_none = NULL, *m_inplace = NULL;
    EXPECT_OK(gt_cuda_adamw_multi_create(c_mixed, N_T, &m_mixed, &err), &err);
    EXPECT_OK(gt_cuda_adamw_multi_create(c_none, N_T, &m_none, &err), &err);
    EXPECT_OK(gt_cuda_adamw_multi_create(c_inplace, N_T, &m_inplace, &err), &err);

    const float clips[2] = {1.0f, 0.37f};
    const int steps[2] = {1, 7};
    for (int variant = 0; variant < 3 && !err.code; variant++) {
        const char *vname = variant == 0   ? "weight decay 0.1 / 0"
                            : variant == 1 ? "weight decay 0"
                                           : "weight decay 0.1 / 0, in place";
        for (int ci = 0; ci < 2 && !err.code; ci++) {
            for (int si = 0; si < 2 && !err.code; si++) {
                float scalars[3] = {1e-3f, (float)(1.0 - pow(0.9, steps[si])),
                                    (float)(1.0 - pow(0.95, steps[si]))};
                EXPECT_OK(gt_cuda_memcpy_h2d(g_stream, sc.data, scalars, sizeof scalars, &err),
                          &err);
                EXPECT_OK(gt_cuda_memcpy_h2d(g_stream, cl.data, &clips[ci], sizeof clips[ci], &err),
                          &err);
                for (int k = 0; k < N_T && !err.code; k++) {
                    for (int j = 0; j < 3; j++) {
                        EXPECT(cu_fill_pattern(g_stream, &ts[k].ref[j], 0x5a), "pattern");
                        EXPECT(cu_fill_pattern(g_stream, &ts[k].out[j], 0xa5), "pattern");
                    }
                    for (int j = 0; j < 3 && variant == 2; j++) /* fresh p, m, v */
                        EXPECT_OK(copy_in(&ts[k].h[j ? j + 1 : 0], &ts[k].inplace[j], &err), &err);
                    gt_kernel_call r = variant == 1 ? c_none[k] : c_mixed[k];
                    for (int j = 0; j < 3; j++)
                        r.out[j] = &ts[k].ref[j];
                    EXPECT_OK(gt_cuda_run_kernel(&r, g_stream, &err), &err);
                }
                const gt_cuda_adamw_multi *m = variant == 0   ? m_mixed
                                               : variant == 1 ? m_none
                                                              : m_inplace;
                EXPECT_OK(gt_cuda_adamw_multi_run(m, g_stream, &err), &err);
                EXPECT_OK(gt_cuda_stream_sync(g_stream, &err), &err);
                if (err.code) break;
                int bad = count_differing(ts, variant == 2 ? launch_inplace : launch_out);
                EXPECT(bad == 0,
                       "%s, clip %g, step %d: %d of %d tensors differ from one launch per tensor",
                       vname, clips[ci], steps[si], bad, N_T);
                printf("multi-tensor adamw, %s, clip %g, step %d: %d of %d tensors bitwise equal "
                       "to one launch each\n",
                       vname, clips[ci], steps[si], N_T - bad, N_T);
            }
        }
    }
    gt_cuda_adamw_multi_free(m_mixed);
    gt_cuda_adamw_multi_free(m_none);
    gt_cuda_adamw_multi_free(m_inplace);

    /* what cannot share a launch: a bf16 param, exp_avg one element off its 16-byte alignment
     * (a 1022-element view of tensor 4, every other operand at its start), an empty tensor */
    gt_kernel_call c = c_mixed[2];
    gt_tensor pb;
    int64_t n2 = sizes[2], n4 = sizes[4] - 1, zero = 0;
    EXPECT_OK(gt_cuda_tensor_alloc(&pb, GT_BF16, 1, &n2, &err), &err);
    c.in[0] = &pb;
    EXPECT(!gt_cuda_adamw_groupable(&c), "a bf16 param is not groupable");
    gt_tensor view_in[4], view_out[3];
    c = c_mixed[4];
    for (int j = 0; j < 4; j++) {
        char *base = ts[4].d[j].data;
        gt_tensor_wrap(&view_in[j], ts[4].d[j].dtype, 1, &n4, j == 2 ? base + 4 : base);
        c.in[j] = &view_in[j];
    }
    for (int j = 0; j < 3; j++) {
        gt_tensor_wrap(&view_out[j], GT_F32, 1, &n4, ts[4].out[j].data);
        c.out[j] = &view_out[j];
    }
    EXPECT(!gt_cuda_adamw_groupable(&c), "a misaligned exp_avg is not groupable");
    EXPECT_OK(gt_cuda_run_kernel(&c, g_stream, &err), &err); /* it runs alone */
    gt_tensor empty[7];
    c = c_mixed[0];
    for (int j = 0; j < 4; j++) {
        gt_tensor_wrap(&empty[j], ts[0].d[j].dtype, 1, &zero, NULL);
        c.in[j] = &empty[j];
    }
    for (int j = 0; j < 3; j++) {
        gt_tensor_wrap(&empty[4 + j], GT_F32, 1, &zero, NULL);
        c.out[j] = &empty[4 + j];
    }
    EXPECT(!gt_cuda_adamw_groupable(&c), "an empty tensor is not groupable");

    gt_tensor sc2;
    EXPECT_OK(gt_cuda_tensor_alloc(&sc2, GT_F32, 1, (const int64_t[]){3}, &err), &err);
    gt_kernel_call two[3] = {c_mixed[0], c_mixed[1], c_mixed[2]};
    gt_cuda_adamw_multi *bad = NULL;
    two[1].in[4] = &sc2;
    gt_error e = {0};
    gt_status st = gt_cuda_adamw_multi_create(two, 3, &bad, &e);
    EXPECT(st == GT_ERR_INVALID && !bad && strstr(e.msg, "call 1") && strstr(e.msg, "scalars"),
           "other scalars refused: %s", e.msg);
    double f_other[4] = {0.9, 0.95, 1e-8, 0.2};
    two[1] = c_mixed[1];
    two[2].f = f_other; /* call 1 decays by 0.1, call 2 by 0.2 */
    memset(&e, 0, sizeof e);
    st = gt_cuda_adamw_multi_create(two, 3, &bad, &e);
    EXPECT(st == GT_ERR_INVALID && !bad && strstr(e.msg, "call 2") && strstr(e.msg, "weight_decay"),
           "two weight decays refused: %s", e.msg);
    two[2] = c_mixed[2];
    two[2].in[0] = &pb; /* the same shape as tensor 2 */
    memset(&e, 0, sizeof e);
    st = gt_cuda_adamw_multi_create(two, 3, &bad, &e);
    EXPECT(st == GT_ERR_INVALID && !bad && strstr(e.msg, "call 2") && strstr(e.msg, "vector path"),
           "a bf16 param refused: %s", e.msg);

    gt_cuda_tensor_free(&pb);
    gt_cuda_tensor_free(&sc2);
    gt_cuda_tensor_free(&sc);
    gt_cuda_tensor_free(&cl);
    for (int k = 0; k < N_T; k++) {
        for (int j = 0; j < 4; j++) {
            gt_tensor_free(&ts[k].h[j]);
            gt_cuda_tensor_free(&ts[k].d[j]);
        }
        for (int j = 0; j < 3; j++) {
            gt_cuda_tensor_free(&ts[k].ref[j]);
            gt_cuda_tensor_free(&ts[k].out[j]);
            gt_cuda_tensor_free(&ts[k].inplace[j]);
        }
    }
    free(ts);
}

/* ---------------------------------------------------------------- program level */

#define STEPS 4

/* One run of STEPS steps of g's CUDA program from state (its scalars input is rewritten per step;
 * the rest is only read): outputs of step n into out[(n - 1) * n_outputs + k], the final state
 * (every input buffer) into fin; *launches = gt_cuda_program_adamw_launches. groups: the
 * multi-tensor tail on; capture: the step captured as a CUDA graph after step 1. */
static bool program_run(const step_graph *s, const gt_graph *g, gt_tensor *state, bool groups,
                        bool capture, gt_tensor *out, gt_tensor *fin, int32_t *launches)
{
    gt_error err = {0};
    gt_plan_options opts = {.no_adamw_groups = !groups};
    gt_cuda_program *cp = NULL;
    EXPECT_OK(gt_cuda_program_build(g, &s->binding, &opts, &cp, &err), &err);
    if (!cp) return false;
    *launches = gt_cuda_program_adamw_launches(cp);
    cu_program_set_inputs(cp, g, state, false, &err);
    cu_program_step_range(cp, s, g, state, 1, 1, out, &err);
    if (capture && !err.code) {
        EXPECT_OK(gt_cuda_program_capture(cp, &err), &err);
        EXPECT(gt_cuda_program_captured(cp), "the program is captured");
    }
    cu_program_step_range(cp, s, g, state, 2, STEPS, out, &err);
    for (int32_t k = 0; k < g->n_inputs && !err.code; k++) {
        EXPECT_OK(gt_tensor_alloc(&fin[k], state[k].dtype, state[k].ndim, state[k].shape, &err),
                  &err);
        if (!err.code) EXPECT_OK(gt_cuda_program_read_input(cp, k, &fin[k], &err), &err);
    }
    gt_cuda_program_free(cp);
    return err.code == GT_OK;
}

static void check_program(const char *what, const step_graph *s, const gt_graph *g)
{
    int32_t ni = g->n_inputs, no = g->n_outputs, n_adamw = 0;
    for (int32_t k = 0; k < g->n_nodes; k++)
        n_adamw += g->nodes[k].op == GT_OP_ADAMW;
    gt_tensor *init = calloc((size_t)ni, sizeof *init);
    gt_tensor *out[3], *fin[3];
    int32_t launches[3] = {0, 0, 0};
    const char *how[3] = {"groups off", "groups on", "groups on, captured"};
    bool ok = step_init_state(s, init);
    for (int r = 0; r < 3; r++) {
        out[r] = calloc((size_t)(STEPS * no), sizeof(gt_tensor));
        fin[r] = calloc((size_t)ni, sizeof(gt_tensor));
        ok = ok && program_run(s, g, init, r > 0, r == 2, out[r], fin[r], &launches[r]);
    }
    EXPECT(!ok || (launches[0] == n_adamw && launches[1] == 1 && launches[2] == 1),
           "%s: adamw launches %d with groups off (%d adamw nodes), %d with groups on", what,
           (int)launches[0], (int)n_adamw, (int)launches[1]);
    for (int r = 1; ok && r < 3; r++) {
        int bad_steps = 0, bad_state = 0;
        for (int64_t step = 1; step <= STEPS; step++)
            bad_steps += step_count_diffs(what, how[r], step, g, out[0] + (step - 1) * no,
                                          out[r] + (step - 1) * no) > 0;
        for (int32_t k = 0; k < ni; k++)
            bad_state += g->inputs[k].kind != GT_IN_INPUT && !same_bits(&fin[0][k], &fin[r][k]);
        EXPECT(bad_steps == 0 && bad_state == 0,
               "%s, %s vs groups off: %d of %d steps differ, %d final state tensors differ", what,
               how[r], bad_steps, STEPS, bad_state);
        printf("%s: %s vs off (%d adamw launches vs %d): %d steps, loss %.9g -> %.9g, %s\n", what,
               how[r], (int)launches[r], (int)launches[0], STEPS, step_loss(g, out[r]),
               step_loss(g, out[r] + (STEPS - 1) * no),
               bad_steps || bad_state ? "DIFFERENT" : "bitwise equal");
    }
    for (int r = 0; r < 3; r++) {
        free_tensors(out[r], STEPS * no);
        free_tensors(fin[r], ni);
        free(out[r]);
        free(fin[r]);
    }
    free_tensors(init, ni);
    free(init);
}

static void test_programs(void)
{
    const char *flavors[2] = {"test_tiny", "test_odd"};
    for (int f = 0; f < 2; f++) {
        step_graph s;
        if (!step_graph_build(&s, flavors[f], 2, 16)) continue;
        char what[64];
        snprintf(what, sizeof what, "%s f32", flavors[f]);
        check_program(what, &s, s.g);
        step_graph_free(&s);
    }
    step_graph s;
    gt_dtype bf = GT_BF16;
    if (!step_graph_build_in(&s, "test_tiny", &bf, 2, 16)) return;
    compile_step(s.g, true); /* fusion: AdamW reads the bf16 gradients */
    check_program("test_tiny bf16, compiled", &s, s.g);
    step_graph_free(&s);
}

/* ---------------------------------------------------------------- --bench (asserts nothing)
 *
 * The llama3 1B parameter set (16 blocks of wq, wk, wv, wo, w1, w2, w3 and two norms; embedding,
 * final norm, output: 1.5e9 elements), f32 params and moments, bf16 gradients, in place, weight
 * decay 0.1 on matrices and 0 on norms: one gt_cuda_run_kernel per tensor against one
 * multi-tensor launch, each timed over 10 runs after a warm-up (host clock around a sync).
 * Every byte of the tensors is 0x3c (0.0115 as f32 and bf16): not zeros, which can time faster. */
static void bench(void)
{
    enum { PER_LAYER = 9, LAYERS = 16, N = PER_LAYER * LAYERS + 3 };
    static const int64_t layer[PER_LAYER][2] = {{2048, 2048}, {512, 2048},  {512, 2048},
                                                {2048, 2048}, {8192, 2048}, {2048, 8192},
                                                {8192, 2048}, {2048, 1},    {2048, 1}};
    int64_t shape[N][2];
    for (int l = 0; l < LAYERS; l++)
        for (int j = 0; j < PER_LAYER; j++) {
            shape[l * PER_LAYER + j][0] = layer[j][0];
            shape[l * PER_LAYER + j][1] = layer[j][1];
        }
    int64_t tail[3][2] = {{128256, 2048}, {2048, 1}, {128256, 2048}};
    for (int j = 0; j < 3; j++) {
        shape[LAYERS * PER_LAYER + j][0] = tail[j][0];
        shape[LAYERS * PER_LAYER + j][1] = tail[j][1];
    }
    gt_error err = {0};
    gt_tensor t[N][4], sc, cl;
    gt_kernel_call calls[N];
    double f[2][4] = {{0.9, 0.95, 1e-8, 0.0}, {0.9, 0.95, 1e-8, 0.1}};
    double bytes = 0.0;
    bool ok = gt_cuda_tensor_alloc(&sc, GT_F32, 1, (int64_t[]){3}, &err) == GT_OK &&
              gt_cuda_tensor_alloc(&cl, GT_F32, 0, NULL, &err) == GT_OK;
    float hs[4] = {1e-4f, 0.1f, 0.05f, 1.0f};
    ok = ok && gt_cuda_memcpy_h2d(g_stream, sc.data, hs, 3 * sizeof(float), &err) == GT_OK &&
         gt_cuda_memcpy_h2d(g_stream, cl.data, &hs[3], sizeof(float), &err) == GT_OK;
    for (int k = 0; k < N && ok; k++) {
        int nd = shape[k][1] == 1 ? 1 : 2;
        for (int j = 0; j < 4 && ok; j++)
            ok = gt_cuda_tensor_alloc(&t[k][j], j == 1 ? GT_BF16 : GT_F32, nd, shape[k], &err) ==
                     GT_OK &&
                 cu_fill_pattern(g_stream, &t[k][j], 0x3c); /* ~0.0115 f32, bf16: not zeros */
        memset(&calls[k], 0, sizeof calls[k]);
        calls[k].op = GT_OP_ADAMW;
        calls[k].f = f[nd == 2];
        calls[k].nf = 4;
        calls[k].n_in = 6;
        calls[k].n_out = 3;
        for (int j = 0; j < 4; j++)
            calls[k].in[j] = &t[k][j];
        calls[k].in[4] = &sc;
        calls[k].in[5] = &cl;
        calls[k].out[0] = &t[k][0];
        calls[k].out[1] = &t[k][2];
        calls[k].out[2] = &t[k][3];
        bytes += 26.0 * (double)(shape[k][0] * shape[k][1]);
    }
    gt_cuda_adamw_multi *m = NULL;
    ok = ok && gt_cuda_adamw_multi_create(calls, N, &m, &err) == GT_OK;
    for (int v = 0; v < 2 && ok; v++) {
        double best = 0.0;
        for (int rep = 0; rep < 11 && ok; rep++) {
            double t0 = gt_now_seconds();
            if (v == 0)
                for (int k = 0; k < N && ok; k++)
                    ok = gt_cuda_run_kernel(&calls[k], g_stream, &err) == GT_OK;
            else
                ok = gt_cuda_adamw_multi_run(m, g_stream, &err) == GT_OK;
            ok = ok && gt_cuda_stream_sync(g_stream, &err) == GT_OK;
            double dt = gt_now_seconds() - t0;
            if (rep > 0) best += dt / 10.0;
        }
        if (ok)
            printf("bench adamw 1B (%d tensors) %-22s %8.2f ms  %7.1f GB/s\n", N,
                   v ? "one multi-tensor launch" : "one launch per tensor", best * 1e3,
                   bytes / best / 1e9);
    }
    if (!ok) printf("bench: %s\n", err.msg);
    gt_cuda_adamw_multi_free(m);
    for (int k = 0; k < N; k++)
        for (int j = 0; j < 4; j++)
            gt_cuda_tensor_free(&t[k][j]);
    gt_cuda_tensor_free(&sc);
    gt_cuda_tensor_free(&cl);
}

int main(int argc, char **argv)
{
    gt_cuda_device_info info;
    int rc = cu_test_start(&info, &g_stream);
    if (rc >= 0) return rc;
    printf("device: %s\n", info.name);
    if (argc > 1 && strcmp(argv[1], "--bench") == 0) {
        bench();
        gt_cuda_stream_destroy(g_stream);
        return 0;
    }
    gt_cpu_set_threads(1);
    test_kernel();
    test_programs();
    gt_cuda_stream_destroy(g_stream);
    return gt_test_finish();
}
