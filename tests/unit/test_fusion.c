/* test_fusion.c — the fusion pass and fused_elementwise on the CPU: fused graphs compute the
 * unfused graphs' bits.
 *
 *   1. Random graphs of elementwise ops (f32 only, bf16 only, mixed f32/bf16/f16 with casts), on
 *      inputs of broadcasting shapes ([3, 5, 7], [5, 7], [7], [1, 7], [5, 1], []), with values
 *      read twice and graph outputs in the middle of chains: the graph after dce + fusion and the
 *      graph after dce alone run in the eager executor on the same inputs; every output must be
 *      memcmp-equal. The reference is the unfused graph run op by op.
 *   2. The pass's rules on hand-built graphs: the SwiGLU forward and backward chains fuse into one
 *      node each (with the expected programs), a value read twice, a graph output and a phase
 *      change each stop a chain, no chain crosses a collective, at most 8 instructions per node,
 *      at least two ops per node.
 *   3. The shape rule refuses malformed programs (a forward reference, a wrong recorded dtype,
 *      operands that do not broadcast), naming the instruction.
 *   4. The kernel on a broadcast program against a naive per-element evaluation written here
 *      (f32 math, bf16 rounding by hand).
 *   5. The llama3 test_tiny and debugmodel whole-step graphs (bf16 and f32 compute, memory policy
 *      default): the full pipeline with fusion and with fusion disabled, both compiled and run 3
 *      steps, each feeding its updates back: every output bitwise equal at every step, and the
 *      fused graph has fewer nodes. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusion_graphs.h"
#include "graphtrain/gt_backend.h"
#include "graphtrain/gt_build.h"
#include "graphtrain/gt_exec.h"
#include "graphtrain/gt_pass.h"
#include "graphtrain/gt_program.h"
#include "gt_test.h"
#include "ir/fused_program.h"
#include "step_harness.h"

/* ---------------------------------------------------------------- 1. random graphs */

static void test_random_graphs(void)
{
    static const char *const modes[3] = {"f32", "bf16", "mixed"};
    uint64_t s = 0x9e3779b97f4a7c15ull;
    int fused_nodes = 0, removed = 0, graphs = 0, max_ins = 0, with_bcast = 0;
    for (int mode = 0; mode < 3; mode++) {
        for (int trial = 0; trial < 40; trial++) {
            gt_error err = {0};
            gt_graph *ref = rg_build(&s, mode);
            EXPECT(ref->err.code == GT_OK, "%s graph %d built: %s", modes[mode], trial,
                   ref->err.msg);
            if (ref->err.code != GT_OK) {
                gt_graph_free(ref);
                continue;
            }
            static const char *const dce[] = {"dce"};
            EXPECT_OK(run_only(ref, dce, 1, &err), &err);
            gt_graph *fus = gt_graph_copy(ref);
            EXPECT_OK(run_fusion(fus, &err), &err);
            graphs++;
            fused_nodes += count_op(fus, GT_OP_FUSED_ELEMENTWISE);
            removed += ref->n_nodes - fus->n_nodes;
            for (int32_t n = 0; n < fus->n_nodes; n++) {
                const gt_node *nd = &fus->nodes[n];
                if (nd->op != GT_OP_FUSED_ELEMENTWISE) continue;
                if (nd->attrs.ni > max_ins) max_ins = nd->attrs.ni;
                EXPECT(nd->attrs.ni >= 2 && nd->attrs.ni <= GT_FUSED_MAX_INS,
                       "%d instructions in a fused node", nd->attrs.ni);
                const gt_type *to = gt_value_type(fus, nd->out[0]);
                for (int k = 0; k < nd->n_in; k++) {
                    const gt_type *ti = gt_value_type(fus, nd->in[k]);
                    with_bcast += ti->ndim != to->ndim;
                }
            }
            gt_tensor *in = rg_inputs(ref, &s);
            gt_tensor *o1 = calloc((size_t)ref->n_outputs, sizeof *o1);
            gt_tensor *o2 = calloc((size_t)ref->n_outputs, sizeof *o2);
            EXPECT_OK(gt_eager_run(ref, NULL, in, o1, &err), &err);
            EXPECT_OK(gt_eager_run(fus, NULL, in, o2, &err), &err);
            int bad = 0;
            for (int32_t k = 0; k < ref->n_outputs; k++)
                bad += !same_bits(&o1[k], &o2[k]);
            EXPECT(bad == 0, "%s graph %d: %d of %d outputs differ fused vs unfused", modes[mode],
                   trial, bad, ref->n_outputs);
            if (bad) gt_graph_print(fus, stderr);
            free_array(in, ref->n_inputs);
            free_array(o1, ref->n_outputs);
            free_array(o2, ref->n_outputs);
            gt_graph_free(ref);
            gt_graph_free(fus);
        }
    }
    printf("random graphs: %d graphs, %d fused nodes, %d nodes removed, up to %d instructions, "
           "%d broadcast inputs\n",
           graphs, fused_nodes, removed, max_ins, with_bcast);
    EXPECT(fused_nodes > graphs && removed > 2 * graphs && with_bcast > 0,
           "the random graphs exercised fusion (%d fused nodes, %d removed)", fused_nodes, removed);
}

/* ---------------------------------------------------------------- 2. the pass's rules */

static gt_value_id input(gt_graph *g, const char *name, gt_dtype dt, int64_t a, int64_t b)
{
    gt_expr dims[2] = {fg_const(g, a), fg_const(g, b)};
    return gt_graph_add_input(g, GT_IN_INPUT, name, dt, 2, dims);
}

/* The fused node producing value v, or NULL. */
static const gt_node *fused_producer(const gt_graph *g, gt_value_id v)
{
    gt_node_id p = g->values[v].producer;
    if (p == GT_NONE || g->nodes[p].op != GT_OP_FUSED_ELEMENTWISE) return NULL;
    return &g->nodes[p];
}

static void test_swiglu(void)
{
    gt_error err = {0};
    gt_graph *g = gt_graph_new();
    gt_value_id h1 = input(g, "h1", GT_BF16, 4, 8), h3 = input(g, "h3", GT_BF16, 4, 8);
    gt_value_id dy = input(g, "dy", GT_BF16, 4, 8);
    gt_value_id y = gt_mul(g, gt_unary(g, GT_OP_SILU, h1), h3);
    g->cur_phase = GT_PHASE_BACKWARD;
    gt_value_id dh1 = gt_silu_backward(g, h1, gt_mul(g, dy, h3));
    gt_value_id dh3 = gt_mul(g, dy, gt_unary(g, GT_OP_SILU, h1));
    gt_graph_add_output(g, GT_OUT_METRIC, "y", y);
    gt_graph_add_output(g, GT_OUT_METRIC, "dh1", dh1);
    gt_graph_add_output(g, GT_OUT_METRIC, "dh3", dh3);
    EXPECT(g->err.code == GT_OK, "swiglu built: %s", g->err.msg);
    EXPECT_OK(run_fusion(g, &err), &err);
    EXPECT(g->n_nodes == 3 && count_op(g, GT_OP_FUSED_ELEMENTWISE) == 3,
           "swiglu: 6 nodes -> 3 fused, got %d nodes", g->n_nodes);
    const gt_node *f = fused_producer(g, g->outputs[0].value);
    EXPECT(f && f->n_in == 2 && f->in[0] == h1 && f->in[1] == h3 && f->attrs.ni == 2 &&
               f->attrs.i[0] == gt_fused_encode(GT_OP_SILU, GT_BF16, 0, 0, 0) &&
               f->attrs.i[1] == gt_fused_encode(GT_OP_MUL, GT_BF16, GT_FUSED_TEMP, 1, 0) &&
               f->phase == GT_PHASE_FORWARD,
           "forward program: silu(h1) * h3");
    f = fused_producer(g, g->outputs[1].value);
    EXPECT(f && f->n_in == 3 && f->in[0] == dy && f->in[1] == h3 && f->in[2] == h1 &&
               f->attrs.i[0] == gt_fused_encode(GT_OP_MUL, GT_BF16, 0, 1, 0) &&
               f->attrs.i[1] ==
                   gt_fused_encode(GT_OP_SILU_BACKWARD, GT_BF16, 2, GT_FUSED_TEMP, 0) &&
               f->phase == GT_PHASE_BACKWARD,
           "backward program: silu_backward(h1, dy * h3)");
    char *buf = NULL;
    size_t len = 0;
    FILE *mf = open_memstream(&buf, &len);
    gt_graph_print(g, mf);
    fclose(mf);
    EXPECT(buf && strstr(buf, "fused_elementwise("), "the printer names the op");
    free(buf);
    gt_graph_free(g);
}

static void test_boundaries(void)
{
    gt_error err = {0};
    /* a value read twice, and a graph output, end chains: t = exp(x) is read by neg and by add;
     * u = sigmoid(x2) is an output; only w = scale(neg(t)) + ... fuse */
    gt_graph *g = gt_graph_new();
    gt_value_id x = input(g, "x", GT_F32, 3, 5), x2 = input(g, "x2", GT_F32, 3, 5);
    gt_value_id t = gt_unary(g, GT_OP_EXP, x);
    gt_value_id u = gt_unary(g, GT_OP_SIGMOID, x2);
    gt_value_id w = gt_add(g, gt_scale(g, gt_unary(g, GT_OP_NEG, t), 0.5), t);
    gt_value_id z = gt_mul(g, u, x);
    gt_graph_add_output(g, GT_OUT_METRIC, "w", w);
    gt_graph_add_output(g, GT_OUT_METRIC, "u", u);
    gt_graph_add_output(g, GT_OUT_METRIC, "z", z);
    EXPECT_OK(run_fusion(g, &err), &err);
    /* exp, sigmoid, fused(neg, scale, add), mul */
    EXPECT(g->n_nodes == 4 && count_op(g, GT_OP_EXP) == 1 && count_op(g, GT_OP_SIGMOID) == 1 &&
               count_op(g, GT_OP_MUL) == 1 && count_op(g, GT_OP_FUSED_ELEMENTWISE) == 1,
           "read-twice and output values stay: %d nodes", g->n_nodes);
    const gt_node *f = fused_producer(g, g->outputs[0].value);
    EXPECT(f && f->attrs.ni == 3 && f->attrs.nf == 1 && f->attrs.f[0] == 0.5 && f->n_in == 1,
           "neg, scale, add with t once as input");
    gt_graph_free(g);

    /* a phase change ends a chain: forward exp, backward neg */
    g = gt_graph_new();
    x = input(g, "x", GT_F32, 3, 5);
    t = gt_unary(g, GT_OP_EXP, x);
    g->cur_phase = GT_PHASE_BACKWARD;
    gt_graph_add_output(g, GT_OUT_METRIC, "y", gt_unary(g, GT_OP_NEG, t));
    EXPECT_OK(run_fusion(g, &err), &err);
    EXPECT(g->n_nodes == 2 && count_op(g, GT_OP_FUSED_ELEMENTWISE) == 0, "phases stay apart");
    gt_graph_free(g);

    /* no chain crosses a collective: exp(x), all_reduce of x2, neg(exp) */
    g = gt_graph_new();
    x = input(g, "x", GT_F32, 3, 5), x2 = input(g, "x2", GT_F32, 3, 5);
    t = gt_unary(g, GT_OP_EXP, x);
    gt_attrs ca = {.i = {0, 2}, .ni = 2};
    gt_value_id st = gt_graph_add_node(g, GT_OP_ALL_REDUCE_START, &x2, 1, &ca, NULL);
    gt_value_id wi[2] = {st, x2};
    gt_value_id wv = gt_graph_add_node(g, GT_OP_WAIT, wi, 2, NULL, NULL);
    gt_graph_add_output(g, GT_OUT_METRIC, "y", gt_unary(g, GT_OP_NEG, t));
    gt_graph_add_output(g, GT_OUT_METRIC, "r", wv);
    /* and a chain after the collective fuses */
    gt_graph_add_output(g, GT_OUT_METRIC, "q", gt_unary(g, GT_OP_SQRT, gt_unary(g, GT_OP_EXP, wv)));
    EXPECT(g->err.code == GT_OK, "collective graph built: %s", g->err.msg);
    EXPECT_OK(run_fusion(g, &err), &err);
    EXPECT(count_op(g, GT_OP_EXP) == 1 && count_op(g, GT_OP_NEG) == 1 &&
               count_op(g, GT_OP_FUSED_ELEMENTWISE) == 1 && g->n_nodes == 5,
           "exp and neg stay apart across the collective; exp, sqrt after it fuse (%d nodes)",
           g->n_nodes);
    gt_graph_free(g);

    /* chains of 9, 16 and 17 ops (neg and add_scalar in turn): nodes of at most 8 instructions
     * and 4 constants, taken from the end; a single op left over is not fused */
    const int totals[3] = {9, 16, 17};
    for (int t3 = 0; t3 < 3; t3++) {
        int total = totals[t3];
        g = gt_graph_new();
        gt_value_id v = input(g, "x", GT_F32, 2, 3);
        for (int k = 0; k < total; k++)
            v = k % 2 ? gt_add_scalar(g, v, 0.25 * k) : gt_unary(g, GT_OP_NEG, v);
        gt_graph_add_output(g, GT_OUT_METRIC, "y", v);
        EXPECT_OK(run_fusion(g, &err), &err);
        int fused = count_op(g, GT_OP_FUSED_ELEMENTWISE), ins = 0, ok_limits = 1;
        for (int32_t n = 0; n < g->n_nodes; n++)
            if (g->nodes[n].op == GT_OP_FUSED_ELEMENTWISE) {
                ins += g->nodes[n].attrs.ni;
                ok_limits &= g->nodes[n].attrs.ni >= 2 && g->nodes[n].attrs.ni <= 8 &&
                             g->nodes[n].attrs.nf <= GT_FUSED_MAX_CONST;
            }
        int plain = g->n_nodes - fused;
        EXPECT(ok_limits && ins + plain == total && fused == total / 8 && plain == total % 8,
               "chain of %d: %d fused nodes, %d instructions, %d unfused", total, fused, ins,
               plain);
        gt_graph_free(g);
    }
}

/* ---------------------------------------------------------------- 3. the shape rule */

static void expect_refused(const char *what, const int64_t *prog, int n_prog, const double *f,
                           int nf, const char *needle)
{
    gt_graph *g = gt_graph_new();
    gt_value_id in[2] = {input(g, "a", GT_BF16, 4, 6), input(g, "b", GT_BF16, 3, 6)};
    gt_attrs at;
    memset(&at, 0, sizeof at);
    for (int k = 0; k < n_prog; k++)
        at.i[k] = prog[k];
    at.ni = (uint8_t)n_prog;
    for (int k = 0; k < nf; k++)
        at.f[k] = f[k];
    at.nf = (uint8_t)nf;
    gt_value_id v = gt_graph_add_node(g, GT_OP_FUSED_ELEMENTWISE, in, 2, &at, NULL);
    EXPECT(v == GT_NONE && g->err.code != GT_OK && strstr(g->err.msg, needle),
           "%s refused (%s): %s", what, needle, g->err.msg);
    gt_graph_free(g);
}

static void test_shape_rule(void)
{
    const int T = GT_FUSED_TEMP;
    int64_t fwd[2] = {gt_fused_encode(GT_OP_NEG, GT_BF16, T + 1, 0, 0),
                      gt_fused_encode(GT_OP_EXP, GT_BF16, 0, 0, 0)};
    expect_refused("a forward reference", fwd, 2, NULL, 0, "instruction 0");
    int64_t dt[1] = {gt_fused_encode(GT_OP_EXP, GT_F32, 0, 0, 0)};
    expect_refused("a wrong recorded dtype", dt, 1, NULL, 0, "records result dtype");
    int64_t bc[1] = {gt_fused_encode(GT_OP_ADD, GT_BF16, 0, 1, 0)};
    expect_refused("operands that do not broadcast", bc, 1, NULL, 0, "do not broadcast");
    int64_t sc[1] = {gt_fused_encode(GT_OP_SCALE, GT_BF16, 0, 0, 0)};
    expect_refused("a missing constant", sc, 1, NULL, 0, "constants");
    int64_t mm[1] = {gt_fused_encode(GT_OP_MATMUL, GT_BF16, 0, 1, 0)};
    expect_refused("a non-elementwise op", mm, 1, NULL, 0, "not an elementwise op");
    double bad[2] = {1.0, -1.0};
    int64_t cl[1] = {gt_fused_encode(GT_OP_CLAMP, GT_BF16, 0, 0, 0)};
    expect_refused("clamp with min > max", cl, 1, bad, 2, "min <= max");

    /* a well-formed program: cast(b) to f32, times 2, plus a's cast: [4, 6] f32 */
    gt_graph *g = gt_graph_new();
    gt_value_id in[2] = {input(g, "a", GT_BF16, 4, 6), input(g, "b", GT_BF16, 1, 6)};
    gt_attrs at = {.i = {gt_fused_encode(GT_OP_CAST, GT_F32, 1, 0, 0),
                         gt_fused_encode(GT_OP_SCALE, GT_F32, T + 0, 0, 0),
                         gt_fused_encode(GT_OP_CAST, GT_F32, 0, 0, 0),
                         gt_fused_encode(GT_OP_ADD, GT_F32, T + 1, T + 2, 0)},
                   .f = {2.0},
                   .ni = 4,
                   .nf = 1};
    gt_value_id v = gt_graph_add_node(g, GT_OP_FUSED_ELEMENTWISE, in, 2, &at, NULL);
    const gt_type *t = v == GT_NONE ? NULL : gt_value_type(g, v);
    int64_t d0 = 0, d1 = 0;
    if (t) gt_sym_is_const(g->sym, t->dims[0], &d0), gt_sym_is_const(g->sym, t->dims[1], &d1);
    EXPECT(t && t->dtype == GT_F32 && t->ndim == 2 && d0 == 4 && d1 == 6,
           "cast, scale, cast, add types as f32[4, 6]: %s", g->err.msg);
    gt_error err = {0};
    EXPECT_OK(gt_graph_verify(g, &err), &err);
    gt_graph_free(g);
}

/* ---------------------------------------------------------------- 4. the kernel, naively */

static float bf16_round(float v)
{
    return gt_bf16_to_f32(gt_f32_to_bf16(v));
}

static void test_kernel_naive(void)
{
    /* x: bf16 [2, 3, 5], w: f32 [5], s: bf16 [3, 1]
     * r0 = cast(w -> bf16); r1 = mul(x, r0); r2 = silu(r1); r3 = add_scalar(r2, 0.25)
     * r4 = div(r3, s); r5 = cast(r4 -> f32) */
    const int T = GT_FUSED_TEMP;
    int64_t sx[3] = {2, 3, 5}, sw[1] = {5}, ss[2] = {3, 1};
    gt_tensor x, w, s, out;
    gt_error err = {0};
    EXPECT_OK(gt_tensor_alloc(&x, GT_BF16, 3, sx, &err), &err);
    EXPECT_OK(gt_tensor_alloc(&w, GT_F32, 1, sw, &err), &err);
    EXPECT_OK(gt_tensor_alloc(&s, GT_BF16, 2, ss, &err), &err);
    EXPECT_OK(gt_tensor_alloc(&out, GT_F32, 3, sx, &err), &err);
    uint64_t r = 12345;
    for (int64_t i = 0; i < 30; i++)
        gt_tensor_set_f32(&x, i, (float)(4.0 * rng_unit(&r) - 2.0));
    for (int64_t i = 0; i < 5; i++)
        gt_tensor_set_f32(&w, i, (float)(rng_unit(&r) - 0.5) / 3.0f);
    for (int64_t i = 0; i < 3; i++)
        gt_tensor_set_f32(&s, i, (float)(0.5 + rng_unit(&r)));
    int64_t prog[6] = {gt_fused_encode(GT_OP_CAST, GT_BF16, 1, 0, 0),
                       gt_fused_encode(GT_OP_MUL, GT_BF16, 0, T + 0, 0),
                       gt_fused_encode(GT_OP_SILU, GT_BF16, T + 1, 0, 0),
                       gt_fused_encode(GT_OP_ADD_SCALAR, GT_BF16, T + 2, 0, 0),
                       gt_fused_encode(GT_OP_DIV, GT_BF16, T + 3, 2, 0),
                       gt_fused_encode(GT_OP_CAST, GT_F32, T + 4, 0, 0)};
    double f[1] = {0.25};
    gt_kernel_call call = {.op = GT_OP_FUSED_ELEMENTWISE,
                           .i = prog,
                           .ni = 6,
                           .f = f,
                           .nf = 1,
                           .n_in = 3,
                           .n_out = 1,
                           .in = {&x, &w, &s},
                           .out = {&out}};
    EXPECT_OK(gt_cpu_run_kernel(&call, &err), &err);
    int bad = 0;
    for (int64_t i = 0; i < 30; i++) {
        int64_t j = i % 5, row = (i / 5) % 3;
        float xv = gt_tensor_get_f32(&x, i), wv = bf16_round(gt_tensor_get_f32(&w, j));
        float m = bf16_round(xv * wv);
        float si = bf16_round(m * (1.0f / (1.0f + expf(-m))));
        float a = bf16_round(si + 0.25f);
        float want = bf16_round(a / gt_tensor_get_f32(&s, row));
        float got = gt_tensor_get_f32(&out, i);
        if (memcmp(&want, &got, sizeof got) != 0 && bad++ < 3)
            fprintf(stderr, "element %lld: got %.9g want %.9g\n", (long long)i, got, want);
    }
    EXPECT(bad == 0, "fused kernel vs naive per-element evaluation: %d of 30 differ", bad);
    /* a malformed program is refused by the kernel as well */
    int64_t badprog[1] = {gt_fused_encode(GT_OP_NEG, GT_F32, T + 3, 0, 0)};
    call.i = badprog;
    call.ni = 1;
    EXPECT(gt_cpu_run_kernel(&call, &err) == GT_ERR_INVALID && strstr(err.msg, "instruction 0"),
           "kernel refuses a forward reference: %s", err.msg);
    gt_tensor_free(&x);
    gt_tensor_free(&w);
    gt_tensor_free(&s);
    gt_tensor_free(&out);
}

/* ---------------------------------------------------------------- 5. llama3 step graphs */

#define STEPS 3

static void check_step(const char *flavor, gt_dtype compute)
{
    step_graph s;
    if (!step_graph_build_in(&s, flavor, &compute, 2, 16)) return;
    gt_error err = {0};
    gt_graph *off = gt_graph_copy(s.g), *on = gt_graph_copy(s.g);
    compile_step(off, false);
    compile_step(on, true);
    int fused = count_op(on, GT_OP_FUSED_ELEMENTWISE);
    printf("%s %s: nodes %d unfused -> %d fused (%d fused_elementwise nodes)\n", flavor,
           gt_dtype_name(compute), off->n_nodes, on->n_nodes, fused);
    EXPECT(on->n_nodes < off->n_nodes && fused > 0, "%s %s: fusion removed nodes (%d -> %d)",
           flavor, gt_dtype_name(compute), off->n_nodes, on->n_nodes);
    EXPECT(on->n_inputs == off->n_inputs && on->n_outputs == off->n_outputs, "io kept");
    /* the widening casts of the gradients are absorbed: AdamW and the norm read them as computed
     * (bf16 in mixed precision), without fusion they read an f32 copy */
    int adamw = 0, narrow_on = 0, narrow_off = 0;
    for (int32_t k = 0; k < on->n_nodes; k++)
        if (on->nodes[k].op == GT_OP_ADAMW) {
            adamw++;
            narrow_on += gt_value_type(on, on->nodes[k].in[1])->dtype == compute;
        }
    for (int32_t k = 0; k < off->n_nodes; k++)
        if (off->nodes[k].op == GT_OP_ADAMW)
            narrow_off += gt_value_type(off, off->nodes[k].in[1])->dtype == compute;
    EXPECT(adamw > 0 && narrow_on == adamw && (compute == GT_F32 || narrow_off == 0),
           "%s %s: %d adamw nodes, %d read a %s gradient with fusion (%d without)", flavor,
           gt_dtype_name(compute), adamw, narrow_on, gt_dtype_name(compute), narrow_off);
    gt_program *p_off = NULL, *p_on = NULL;
    EXPECT_OK(gt_program_build(off, &s.binding, &p_off, &err), &err);
    EXPECT_OK(gt_program_build(on, &s.binding, &p_on, &err), &err);
    step_run a, b;
    bool ok = step_run_init(&a, &s);
    ok = step_run_init(&b, &s) && ok && p_off && p_on;
    for (int64_t step = 1; ok && step <= STEPS; step++) {
        step_set_scalars(&s, off, a.state, step);
        step_set_scalars(&s, on, b.state, step);
        EXPECT_OK(gt_program_run(p_off, a.state, a.out, &err), &err);
        EXPECT_OK(gt_program_run(p_on, b.state, b.out, &err), &err);
        if (err.code) break;
        int bad = step_count_diffs(flavor, gt_dtype_name(compute), step, off, a.out, b.out);
        EXPECT(bad == 0, "%s %s step %lld: %d of %d outputs differ with fusion", flavor,
               gt_dtype_name(compute), (long long)step, bad, off->n_outputs);
        if (step == STEPS)
            printf("  step %d loss %.9g (fusion on and off)\n", STEPS, step_loss(on, b.out));
        step_run_next(&a, off);
        step_run_next(&b, on);
    }
    step_run_free(&a);
    step_run_free(&b);
    gt_program_free(p_off);
    gt_program_free(p_on);
    gt_graph_free(off);
    gt_graph_free(on);
    step_graph_free(&s);
}

int main(void)
{
    gt_cpu_set_threads(1);
    gt_log_set_level(GT_LOG_WARN);
    test_random_graphs();
    test_swiglu();
    test_boundaries();
    test_shape_rule();
    test_kernel_naive();
    check_step("test_tiny", GT_BF16);
    check_step("test_tiny", GT_F32);
    check_step("debugmodel", GT_BF16);
    check_step("debugmodel", GT_F32);
    return gt_test_finish();
}
