/* test_cuda_fused.c — fused_elementwise and the fusion pass on the GPU (label cuda).
 *
 *   1. Random graphs of elementwise ops (tests/fusion_graphs.h: f32, bf16, mixed f32/bf16/f16
 *      with casts, broadcasting inputs): the CUDA program of the graph after dce + fusion and of
 *      the graph after dce alone, on the same inputs: every output bitwise equal (the fused kernel
 *      rounds where the unfused kernels rounded, with the same formulas).
 *   2. The kernel alone on programs that reach every path — SwiGLU forward and backward and an
 *      add chain (the two-op kernels), a broadcast weight cast and scaled, an f32 chain through
 * exp, log, sqrt, rsqrt, div, a row
 *      ([n, 1]) and a scalar broadcast, f16, lengths that leave a tail — with 16-byte aligned
 *      inputs (the two-op or the vector kernel) and with inputs one element off alignment (the
 *      general kernel):
 *      both bitwise equal, two runs bitwise equal, and against the CPU kernel within the op
 *      conformance bounds of test_cuda_ops (max |gpu - cpu| / max |cpu|: 1e-5 f32, 1e-2 bf16/f16).
 *   3. The llama3 test_tiny and debugmodel whole-step graphs in bf16 and f32 (memory policy
 *      default): the CUDA program with fusion and without, 3 steps each feeding its updates back:
 *      every output bitwise equal at every step; and step 1 with fusion against the CPU program
 *      with fusion: the loss within 1e-5 (f32) / 1e-2 (bf16) relative, all gradients together
 *      within 1e-4 / 1e-1 relative L2 (bf16: a last-bit difference of an f32 result before
 *      rounding moves a bf16 value by an ulp, 2^-8 relative, and the backward compounds it).
 * Without a CUDA device the test skips (exit 0). */
#include <math.h>

#include "cuda_test_util.h"
#include "fusion_graphs.h"
#include "graphtrain/gt_backend.h"
#include "graphtrain/gt_cuda.h"
#include "graphtrain/gt_program.h"
#include "ir/fused_program.h"
#include "step_harness.h"

static gt_cuda_stream *g_stream;

/* ---------------------------------------------------------------- 1. random graphs */

/* Runs g once as a CUDA program on host inputs in; outputs into out (allocated here). */
static bool cuda_run_graph(const gt_graph *g, const gt_tensor *in, gt_tensor *out)
{
    gt_error err = {0};
    gt_cuda_program *p = NULL;
    EXPECT_OK(gt_cuda_program_build(g, NULL, NULL, &p, &err), &err);
    if (!p) return false;
    EXPECT_OK(gt_cuda_program_run(p, in, out, &err), &err);
    gt_cuda_program_free(p);
    return err.code == GT_OK;
}

static void test_random_graphs(void)
{
    static const char *const modes[3] = {"f32", "bf16", "mixed"};
    uint64_t s = 0x2545f4914f6cdd1dull;
    int graphs = 0, fused_nodes = 0, differ = 0;
    for (int mode = 0; mode < 3; mode++) {
        for (int trial = 0; trial < 25; trial++) {
            gt_error err = {0};
            gt_graph *ref = rg_build(&s, mode);
            if (ref->err.code != GT_OK) {
                EXPECT(false, "graph built: %s", ref->err.msg);
                gt_graph_free(ref);
                continue;
            }
            static const char *const dce[] = {"dce"};
            EXPECT_OK(run_only(ref, dce, 1, &err), &err);
            gt_graph *fus = gt_graph_copy(ref);
            EXPECT_OK(run_fusion(fus, &err), &err);
            fused_nodes += count_op(fus, GT_OP_FUSED_ELEMENTWISE);
            gt_tensor *in = rg_inputs(ref, &s);
            gt_tensor *o1 = calloc((size_t)ref->n_outputs, sizeof *o1);
            gt_tensor *o2 = calloc((size_t)ref->n_outputs, sizeof *o2);
            if (cuda_run_graph(ref, in, o1) && cuda_run_graph(fus, in, o2)) {
                int bad = 0;
                for (int32_t k = 0; k < ref->n_outputs; k++)
                    bad += !same_bits(&o1[k], &o2[k]);
                EXPECT(bad == 0, "%s graph %d: %d of %d outputs differ fused vs unfused on the GPU",
                       modes[mode], trial, bad, ref->n_outputs);
                if (bad) gt_graph_print(fus, stderr);
                differ += bad;
                graphs++;
            }
            free_array(in, ref->n_inputs);
            free_array(o1, ref->n_outputs);
            free_array(o2, ref->n_outputs);
            gt_graph_free(ref);
            gt_graph_free(fus);
        }
    }
    printf("random graphs on the GPU: %d graphs, %d fused nodes, %d outputs differ\n", graphs,
           fused_nodes, differ);
    EXPECT(graphs == 75 && fused_nodes > graphs, "random graphs ran (%d) and fused (%d)", graphs,
           fused_nodes);
}

/* ---------------------------------------------------------------- 2. the kernel alone */

static uint64_t g_rng = 0x1234567887654321ull;

static double urand(double lo, double hi)
{
    return lo + (hi - lo) * rng_unit(&g_rng);
}

typedef struct {
    const char *name;
    int n_in;
    gt_tensor in[GT_MAX_IN];
    gt_dtype out_dt;
    int out_ndim;
    int64_t out_shape[GT_MAX_DIMS];
    int64_t prog[GT_FUSED_MAX_INS];
    int n_prog;
    double f[GT_MAX_FATTR];
    int nf;
} kcase;

static void kc_input(kcase *c, gt_dtype dt, int ndim, const int64_t *shape, double lo, double hi)
{
    gt_error err = {0};
    gt_tensor *t = &c->in[c->n_in++];
    GT_CHECK(gt_tensor_alloc(t, dt, ndim, shape, &err) == GT_OK);
    for (int64_t i = 0; i < gt_tensor_numel(t); i++)
        gt_tensor_set_f32(t, i, (float)urand(lo, hi));
}

static void kc_out(kcase *c, gt_dtype dt, int ndim, const int64_t *shape)
{
    c->out_dt = dt;
    c->out_ndim = ndim;
    for (int d = 0; d < ndim; d++)
        c->out_shape[d] = shape[d];
}

/* The fused_elementwise call of c's program with one output, *out. */
static gt_kernel_call kc_call(const kcase *c, const gt_tensor *in, gt_tensor *out)
{
    return cu_kernel_call(GT_OP_FUSED_ELEMENTWISE, c->prog, c->n_prog, c->f, c->nf, NULL, 0, in,
                          c->n_in, out, 1);
}

/* Device copy of host tensor h, `skew` elements past a 256-byte aligned allocation (skew 1 makes
 * every vector load misaligned); *base is what to free. */
static bool upload_skewed(const gt_tensor *h, int skew, gt_tensor *base, gt_tensor *dev)
{
    gt_error err = {0};
    int64_t n = gt_tensor_numel(h) + skew;
    int64_t shape[1] = {n > 0 ? n : 1};
    if (gt_cuda_tensor_alloc(base, h->dtype, 1, shape, &err) != GT_OK) return false;
    *dev = *h;
    dev->owns_data = false;
    dev->data = (char *)base->data + (size_t)skew * gt_dtype_size(h->dtype);
    return gt_cuda_memcpy_h2d(g_stream, dev->data, h->data, gt_tensor_nbytes(h), &err) == GT_OK;
}

/* One GPU run with inputs (and output) skewed by `skew` elements; result into host tensor res
 * (allocated here). The output is pre-filled with `fill` bytes, so a missed element shows. */
static bool gpu_kernel_run(const kcase *c, int skew, uint8_t fill, gt_tensor *res)
{
    gt_error err = {0};
    gt_tensor base[GT_MAX_IN + 1], dev[GT_MAX_IN + 1];
    memset(base, 0, sizeof base);
    bool ok = true;
    for (int k = 0; k < c->n_in && ok; k++)
        ok = upload_skewed(&c->in[k], skew, &base[k], &dev[k]);
    gt_tensor host_out;
    GT_CHECK(gt_tensor_alloc(&host_out, c->out_dt, c->out_ndim, c->out_shape, &err) == GT_OK);
    memset(host_out.data, fill, gt_tensor_nbytes(&host_out));
    ok = ok && upload_skewed(&host_out, skew, &base[c->n_in], &dev[c->n_in]);
    gt_kernel_call call = kc_call(c, dev, &dev[c->n_in]);
    if (ok) {
        gt_status st = gt_cuda_run_kernel(&call, g_stream, &err);
        if (st == GT_OK) st = gt_cuda_stream_sync(g_stream, &err);
        EXPECT(st == GT_OK, "%s: CUDA kernel failed: %s", c->name, err.msg);
        ok = st == GT_OK &&
             gt_cuda_memcpy_d2h(g_stream, host_out.data, dev[c->n_in].data,
                                gt_tensor_nbytes(&host_out), &err) == GT_OK &&
             gt_cuda_stream_sync(g_stream, &err) == GT_OK;
    }
    for (int k = 0; k <= c->n_in; k++)
        if (base[k].data) gt_cuda_tensor_free(&base[k]);
    *res = host_out;
    return ok;
}

static void kc_check(kcase *c)
{
    gt_error err = {0};
    gt_tensor cpu;
    GT_CHECK(gt_tensor_alloc(&cpu, c->out_dt, c->out_ndim, c->out_shape, &err) == GT_OK);
    gt_kernel_call call = kc_call(c, c->in, &cpu);
    EXPECT_OK(gt_cpu_run_kernel(&call, &err), &err);
    gt_tensor g1, g2, g3;
    bool ok = gpu_kernel_run(c, 0, 0xff, &g1) & gpu_kernel_run(c, 0, 0x5a, &g2) &
              gpu_kernel_run(c, 1, 0xa5, &g3);
    if (ok) {
        double tol = c->out_dt == GT_F32 ? 1e-5 : 1e-2;
        double e = cu_rel_err(&g1, &cpu);
        bool rerun = same_bits(&g1, &g2), skew = same_bits(&g1, &g3);
        printf("%-34s max rel err vs CPU %.2e (bound %.0e)  rerun %s  misaligned %s\n", c->name, e,
               tol, rerun ? "bitwise" : "DIFFER", skew ? "bitwise" : "DIFFER");
        EXPECT(e <= tol, "%s: GPU vs CPU %.3e above %.0e", c->name, e, tol);
        EXPECT(rerun, "%s: two GPU runs differ (or an element was not written)", c->name);
        EXPECT(skew, "%s: the general kernel (misaligned) differs from the vector kernel", c->name);
    }
    gt_tensor_free(&g1);
    gt_tensor_free(&g2);
    gt_tensor_free(&g3);
    gt_tensor_free(&cpu);
    for (int k = 0; k < c->n_in; k++)
        gt_tensor_free(&c->in[k]);
}

#define T GT_FUSED_TEMP
#define SH(...) ((const int64_t[]){__VA_ARGS__})

static void test_kernels(void)
{
    const int64_t lens[3] = {4096, 1003, 5};
    for (int li = 0; li < 3; li++) {
        int64_t n = lens[li];
        char name[64];
        kcase c;

        memset(&c, 0, sizeof c);
        snprintf(name, sizeof name, "swiglu fwd bf16 [%lld]", (long long)n);
        c.name = name;
        kc_input(&c, GT_BF16, 1, SH(n), -4, 4);
        kc_input(&c, GT_BF16, 1, SH(n), -2, 2);
        kc_out(&c, GT_BF16, 1, SH(n));
        c.prog[0] = gt_fused_encode(GT_OP_SILU, GT_BF16, 0, 0, 0);
        c.prog[1] = gt_fused_encode(GT_OP_MUL, GT_BF16, T, 1, 0);
        c.n_prog = 2;
        kc_check(&c);

        memset(&c, 0, sizeof c);
        snprintf(name, sizeof name, "swiglu bwd bf16 [%lld]", (long long)n);
        c.name = name;
        kc_input(&c, GT_BF16, 1, SH(n), -1, 1);
        kc_input(&c, GT_BF16, 1, SH(n), -2, 2);
        kc_input(&c, GT_BF16, 1, SH(n), -4, 4);
        kc_out(&c, GT_BF16, 1, SH(n));
        c.prog[0] = gt_fused_encode(GT_OP_MUL, GT_BF16, 0, 1, 0);
        c.prog[1] = gt_fused_encode(GT_OP_SILU_BACKWARD, GT_BF16, 2, T, 0);
        c.n_prog = 2;
        kc_check(&c);
    }

    kcase c;
    /* x bf16 [24, 64] * cast(w f32 [64] -> bf16), + 0.25, clamp, to f16 (trailing broadcast) */
    memset(&c, 0, sizeof c);
    c.name = "bcast weight bf16 -> f16 [24, 64]";
    kc_input(&c, GT_BF16, 2, SH(24, 64), -3, 3);
    kc_input(&c, GT_F32, 1, SH(64), -1, 1);
    kc_out(&c, GT_F16, 2, SH(24, 64));
    c.prog[0] = gt_fused_encode(GT_OP_CAST, GT_BF16, 1, 0, 0);
    c.prog[1] = gt_fused_encode(GT_OP_MUL, GT_BF16, 0, T + 0, 0);
    c.prog[2] = gt_fused_encode(GT_OP_ADD_SCALAR, GT_BF16, T + 1, 0, 0);
    c.prog[3] = gt_fused_encode(GT_OP_CLAMP, GT_BF16, T + 2, 0, 1);
    c.prog[4] = gt_fused_encode(GT_OP_CAST, GT_F16, T + 3, 0, 0);
    c.n_prog = 5;
    c.f[0] = 0.25, c.f[1] = -1.5, c.f[2] = 2.0;
    c.nf = 3;
    kc_check(&c);

    /* f32 chain: sqrt(a) - rsqrt(b) + log(a) / exp(-b) * 0.5 (three live temps: 8 slots) */
    memset(&c, 0, sizeof c);
    c.name = "f32 transcendental tree [999]";
    kc_input(&c, GT_F32, 1, SH(999), 0.1, 4);
    kc_input(&c, GT_F32, 1, SH(999), 0.1, 4);
    kc_out(&c, GT_F32, 1, SH(999));
    c.prog[0] = gt_fused_encode(GT_OP_SQRT, GT_F32, 0, 0, 0);
    c.prog[1] = gt_fused_encode(GT_OP_RSQRT, GT_F32, 1, 0, 0);
    c.prog[2] = gt_fused_encode(GT_OP_LOG, GT_F32, 0, 0, 0);
    c.prog[3] = gt_fused_encode(GT_OP_NEG, GT_F32, 1, 0, 0);
    c.prog[4] = gt_fused_encode(GT_OP_EXP, GT_F32, T + 3, 0, 0);
    c.prog[5] = gt_fused_encode(GT_OP_DIV, GT_F32, T + 2, T + 4, 0);
    c.prog[6] = gt_fused_encode(GT_OP_SUB, GT_F32, T + 0, T + 1, 0);
    c.prog[7] = gt_fused_encode(GT_OP_ADD, GT_F32, T + 6, T + 5, 0);
    c.n_prog = 8;
    kc_check(&c);

    /* row and scalar broadcast (the vector kernel reads one m element a pack): (x - m[rows]) * s[] */
    memset(&c, 0, sizeof c);
    c.name = "row + scalar bcast f32 [6, 40]";
    kc_input(&c, GT_F32, 2, SH(6, 40), -2, 2);
    kc_input(&c, GT_F32, 2, SH(6, 1), -1, 1);
    kc_input(&c, GT_F32, 0, SH(1), 0.5, 2);
    kc_out(&c, GT_F32, 2, SH(6, 40));
    c.prog[0] = gt_fused_encode(GT_OP_SUB, GT_F32, 0, 1, 0);
    c.prog[1] = gt_fused_encode(GT_OP_MUL, GT_F32, T, 2, 0);
    c.prog[2] = gt_fused_encode(GT_OP_SIGMOID, GT_F32, T + 1, 0, 0);
    c.n_prog = 3;
    kc_check(&c);

    /* the MoE combine: bf16 rows scaled by f32 per-row weights, back to bf16 (gt_k_row_scale),
     * and rows of 6 (packs of 4 straddle rows: the general kernel) */
    memset(&c, 0, sizeof c);
    c.name = "moe combine bf16 [10, 64] x f32 [10, 1]";
    kc_input(&c, GT_BF16, 2, SH(10, 64), -2, 2);
    kc_input(&c, GT_F32, 2, SH(10, 1), 0, 1);
    kc_out(&c, GT_BF16, 2, SH(10, 64));
    c.prog[0] = gt_fused_encode(GT_OP_CAST, GT_F32, 0, 0, 0);
    c.prog[1] = gt_fused_encode(GT_OP_MUL, GT_F32, T, 1, 0);
    c.prog[2] = gt_fused_encode(GT_OP_CAST, GT_BF16, T + 1, 0, 0);
    c.n_prog = 3;
    kc_check(&c);
    memset(&c, 0, sizeof c);
    c.name = "row bcast f32 [2, 3, 6] x [2, 3, 1]";
    kc_input(&c, GT_F32, 3, SH(2, 3, 6), -2, 2);
    kc_input(&c, GT_F32, 3, SH(2, 3, 1), -1, 1);
    kc_out(&c, GT_F32, 3, SH(2, 3, 6));
    c.prog[0] = gt_fused_encode(GT_OP_MUL, GT_F32, 0, 1, 0);
    c.n_prog = 1;
    kc_check(&c);

    /* f16 with a scalar: scale(silu(x)) + y * s */
    memset(&c, 0, sizeof c);
    c.name = "f16 silu scale [2048]";
    kc_input(&c, GT_F16, 1, SH(2048), -4, 4);
    kc_input(&c, GT_F16, 1, SH(2048), -4, 4);
    kc_input(&c, GT_F16, 0, SH(1), -1, 1);
    kc_out(&c, GT_F16, 1, SH(2048));
    c.prog[0] = gt_fused_encode(GT_OP_SILU, GT_F16, 0, 0, 0);
    c.prog[1] = gt_fused_encode(GT_OP_SCALE, GT_F16, T, 0, 0);
    c.prog[2] = gt_fused_encode(GT_OP_MUL, GT_F16, 1, 2, 0);
    c.prog[3] = gt_fused_encode(GT_OP_ADD, GT_F16, T + 1, T + 2, 0);
    c.n_prog = 4;
    c.f[0] = 0.7;
    c.nf = 1;
    kc_check(&c);

    /* f32 add chain with the temp second: x2 + (x0 + x1) (the two-op kernel, f32) */
    memset(&c, 0, sizeof c);
    c.name = "add+add f32 [4096]";
    kc_input(&c, GT_F32, 1, SH(4096), -3, 3);
    kc_input(&c, GT_F32, 1, SH(4096), -3, 3);
    kc_input(&c, GT_F32, 1, SH(4096), -3, 3);
    kc_out(&c, GT_F32, 1, SH(4096));
    c.prog[0] = gt_fused_encode(GT_OP_ADD, GT_F32, 0, 1, 0);
    c.prog[1] = gt_fused_encode(GT_OP_ADD, GT_F32, 2, T, 0);
    c.n_prog = 2;
    kc_check(&c);

    /* mixed: bf16 x, f32 y -> f32: cast(x) * y + y (vector kernel at 4 lanes) */
    memset(&c, 0, sizeof c);
    c.name = "bf16 + f32 mixed [4100]";
    kc_input(&c, GT_BF16, 1, SH(4100), -3, 3);
    kc_input(&c, GT_F32, 1, SH(4100), -3, 3);
    kc_out(&c, GT_F32, 1, SH(4100));
    c.prog[0] = gt_fused_encode(GT_OP_CAST, GT_F32, 0, 0, 0);
    c.prog[1] = gt_fused_encode(GT_OP_MUL, GT_F32, T, 1, 0);
    c.prog[2] = gt_fused_encode(GT_OP_ADD, GT_F32, T + 1, 1, 0);
    c.n_prog = 3;
    kc_check(&c);
}

/* ---------------------------------------------------------------- 3. llama3 step graphs */

#define STEPS 3

/* STEPS steps of g's CUDA program from state init (not modified); step s's outputs into
 * out[(s - 1) * n_outputs + k]. */
static bool gpu_steps(const step_graph *s, const gt_graph *g, const gt_tensor *init, gt_tensor *out)
{
    gt_error err = {0};
    gt_cuda_program *cp = NULL;
    EXPECT_OK(gt_cuda_program_build(g, &s->binding, NULL, &cp, &err), &err);
    if (!cp) return false;
    gt_tensor *st = calloc((size_t)g->n_inputs, sizeof *st);
    for (int32_t k = 0; k < g->n_inputs; k++)
        st[k] = init[k]; /* shallow: only the scalars input is rewritten, below */
    int32_t sk = -1;
    gt_tensor scal;
    memset(&scal, 0, sizeof scal);
    for (int32_t k = 0; k < g->n_inputs; k++)
        if (!strcmp(gt_graph_str(g, g->inputs[k].fqn), GT_OPTIM_SCALARS_NAME)) sk = k;
    EXPECT(sk >= 0, "no %s input", GT_OPTIM_SCALARS_NAME);
    if (sk >= 0) {
        GT_CHECK(gt_tensor_alloc(&scal, init[sk].dtype, init[sk].ndim, init[sk].shape, &err) ==
                 GT_OK);
        st[sk] = scal;
    }
    cu_program_set_inputs(cp, g, st, false, &err);
    if (sk >= 0) cu_program_steps(cp, s, g, st, STEPS, out, &err);
    gt_tensor_free(&scal);
    free(st);
    gt_cuda_program_free(cp);
    return err.code == GT_OK;
}

static void check_step(const char *flavor, gt_dtype compute)
{
    step_graph s;
    if (!step_graph_build_in(&s, flavor, &compute, 2, 16)) return;
    const char *dn = gt_dtype_name(compute);
    gt_error err = {0};
    gt_graph *off = gt_graph_copy(s.g), *on = gt_graph_copy(s.g);
    compile_step(off, false);
    compile_step(on, true);
    printf("%s %s: nodes %d unfused -> %d fused (%d fused_elementwise)\n", flavor, dn, off->n_nodes,
           on->n_nodes, count_op(on, GT_OP_FUSED_ELEMENTWISE));
    EXPECT(on->n_nodes < off->n_nodes, "%s %s: fusion removed nodes", flavor, dn);
    int32_t no = off->n_outputs;
    gt_tensor *init = calloc((size_t)s.g->n_inputs, sizeof *init);
    gt_tensor *o_off = calloc((size_t)(STEPS * no), sizeof *o_off);
    gt_tensor *o_on = calloc((size_t)(STEPS * no), sizeof *o_on);
    bool ok = step_init_state(&s, init);
    ok = ok && gpu_steps(&s, off, init, o_off) && gpu_steps(&s, on, init, o_on);
    for (int64_t step = 1; ok && step <= STEPS; step++) {
        int bad = step_count_diffs(flavor, dn, step, off, o_off + (step - 1) * no,
                                   o_on + (step - 1) * no);
        EXPECT(bad == 0, "%s %s step %lld on the GPU: %d of %d outputs differ with fusion", flavor,
               dn, (long long)step, bad, no);
    }
    /* step 1 with fusion: GPU against the CPU program */
    gt_program *cpu = NULL;
    gt_tensor *o_cpu = calloc((size_t)no, sizeof *o_cpu);
    if (ok) EXPECT_OK(gt_program_build(on, &s.binding, &cpu, &err), &err);
    if (ok && cpu) {
        step_set_scalars(&s, on, init, 1);
        EXPECT_OK(gt_program_run(cpu, init, o_cpu, &err), &err);
        double loss_c = step_loss(on, o_cpu), loss_g = step_loss(on, o_on);
        double loss_rel = fabs(loss_g - loss_c) / fabs(loss_c);
        double d2 = 0, r2 = 0;
        for (int32_t k = 0; k < no && !err.code; k++) {
            if (on->outputs[k].kind != GT_OUT_GRAD) continue;
            for (int64_t i = 0; i < gt_tensor_numel(&o_cpu[k]); i++) {
                double r = gt_tensor_get_f32(&o_cpu[k], i), g = gt_tensor_get_f32(&o_on[k], i);
                d2 += (g - r) * (g - r);
                r2 += r * r;
            }
        }
        double grad_rel = r2 > 0 ? sqrt(d2 / r2) : sqrt(d2);
        bool f32 = compute == GT_F32;
        printf("  step 1 with fusion, GPU vs CPU: loss %.9g vs %.9g (rel %.2e), all grads rel L2 "
               "%.2e\n",
               loss_g, loss_c, loss_rel, grad_rel);
        EXPECT(loss_rel <= (f32 ? 1e-5 : 1e-2), "%s %s: loss GPU vs CPU rel %.3e", flavor, dn,
               loss_rel);
        EXPECT(grad_rel <= (f32 ? 1e-4 : 1e-1), "%s %s: grads GPU vs CPU rel L2 %.3e", flavor, dn,
               grad_rel);
    }
    gt_program_free(cpu);
    free_array(o_cpu, no);
    free_array(o_off, STEPS * no);
    free_array(o_on, STEPS * no);
    free_array(init, s.g->n_inputs);
    gt_graph_free(off);
    gt_graph_free(on);
    step_graph_free(&s);
}

int main(void)
{
    if (gt_cuda_device_count() == 0) {
        printf("no CUDA device: skipped\n");
        return 0;
    }
    gt_error err = {0};
    gt_cpu_set_threads(1);
    gt_log_set_level(GT_LOG_WARN);
    EXPECT_OK(gt_cuda_init(0, NULL, &err), &err);
    EXPECT_OK(gt_cuda_stream_create(&g_stream, &err), &err);
    if (!g_stream) return gt_test_finish();
    test_random_graphs();
    test_kernels();
    check_step("test_tiny", GT_BF16);
    check_step("test_tiny", GT_F32);
    check_step("debugmodel", GT_BF16);
    check_step("debugmodel", GT_F32);
    gt_cuda_stream_destroy(g_stream);
    return gt_test_finish();
}
