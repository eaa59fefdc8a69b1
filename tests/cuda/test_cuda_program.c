/* test_cuda_program.c — the compiled program on the GPU against the compiled program on the CPU.
 *
 * For test_tiny, test_gqa and test_odd in fp32: the whole-step graph (forward, loss, backward,
 * AdamW with clipping, built as gt_train_build_graph does with one micro-batch) runs 5 steps with
 * gt_program_run on the CPU (the reference: bitwise equal to the eager executor, see
 * tests/numerics/test_program_exact.c) and 5 steps with the CUDA program, whose params and moments
 * stay on the device between steps (uploaded once; only tokens, labels and optim.scalars are
 * copied in per step; updates carried with gt_cuda_program_carry). Checked:
 *   - step 1 (both sides from the same state): loss, grad_norm, grads and moments within 1e-5 of
 *     the CPU's, max |gpu - cpu| relative to the tensor's max |cpu|: the kernels' accuracy;
 *   - the loss at every step within 1e-5 relative;
 *   - at every step and for the final state read back from the input buffers: all params together
 *     (one vector) and all moments together within 1e-5 in relative L2, ||gpu - cpu|| / ||cpu||;
 *     each output tensor (grads, params, moments) within 1e-4 in relative L2. Element-wise bounds
 *     do not hold past the first AdamW update, nor 1e-5 per tensor: the step lr·m/(sqrt(v) + eps)
 *     has derivative about lr/(4 eps) = 7.5e4 in g where |g| ~ eps, so a gradient element of ~1e-8
 *     that differs by 2e-10 (1e-7 of the gradient's scale) moves that param by ~1.5e-5, and later
 *     steps' grads inherit it; a tensor with many near-zero grads (test_odd's wo) shows it most;
 *   - a second GPU run (a fresh program, the same initial state) gives identical bits for every
 *     output at every step and for the final state;
 *   - test_tiny also with views and in-place sharing off, so carry is a device copy;
 *   - a wrongly shaped input is refused with GT_ERR_INVALID naming the input;
 *   - a plan larger than the GPU is refused before allocating, naming both sizes.
 * Without a CUDA device the test skips (exit 0). */
#include "cuda_test_util.h"
#include "graphtrain/gt_backend.h"
#include "graphtrain/gt_build.h"
#include "graphtrain/gt_cuda.h"
#include "graphtrain/gt_program.h"
#include "step_harness.h"

#define STEPS 5
#define BOUND 1e-5        /* loss, step-1 outputs element-wise, all params / moments in L2 */
#define TENSOR_BOUND 1e-4 /* each tensor in L2, every step */

static int32_t scalars_input(const gt_graph *g)
{
    for (int32_t k = 0; k < g->n_inputs; k++)
        if (!strcmp(gt_graph_str(g, g->inputs[k].fqn), GT_OPTIM_SCALARS_NAME)) return k;
    return -1;
}

/* Sums of squares of differences and of the reference, over several tensors. */
typedef struct {
    double d2, r2;
} l2_sum;

static double l2_rel(const l2_sum *s)
{
    return s->r2 > 0 ? sqrt(s->d2 / s->r2) : sqrt(s->d2);
}

/* *max_rel = max |got - ref| / max |ref|; returns ||got - ref|| / ||ref|| (both the absolute
 * figure when ref is all zero) and adds to *acc (may be NULL); NaN propagates. */
static double rel_err(const gt_tensor *got, const gt_tensor *ref, double *max_rel, l2_sum *acc)
{
    double err = 0, ref_max = 0, d2 = 0, r2 = 0;
    for (int64_t i = 0; i < gt_tensor_numel(ref); i++) {
        double r = gt_tensor_get_f32(ref, i), d = fabs((double)gt_tensor_get_f32(got, i) - r);
        if (!(d <= err)) err = d;
        if (fabs(r) > ref_max) ref_max = fabs(r);
        d2 += d * d;
        r2 += r * r;
    }
    *max_rel = ref_max > 0 ? err / ref_max : err;
    if (acc) acc->d2 += d2, acc->r2 += r2;
    return r2 > 0 ? sqrt(d2 / r2) : sqrt(d2);
}

/* One GPU run of STEPS steps from the initial state init: outputs of step s (1-based) go to
 * out[(s - 1) * n_outputs + k], the final state (every input buffer) to fin. */
static bool gpu_run(const step_graph *s, const gt_plan_options *opts, gt_tensor *init,
                    gt_tensor *out, gt_tensor *fin)
{
    const gt_graph *g = s->g;
    gt_error err = {0};
    gt_cuda_program *cp = NULL;
    EXPECT_OK(gt_cuda_program_build(g, &s->binding, opts, &cp, &err), &err);
    if (!cp) return false;
    const gt_program *lp = gt_cuda_program_lowered(cp);
    for (int a = 0; a < GT_ARENA_COUNT; a++)
        EXPECT(gt_cuda_program_allocated_bytes(cp, a) == lp->plan->arena_bytes[a],
               "arena %d: %zu bytes on the device, %zu planned", a,
               gt_cuda_program_allocated_bytes(cp, a), lp->plan->arena_bytes[a]);
    int32_t sk = scalars_input(g);
    EXPECT(sk >= 0, "no %s input", GT_OPTIM_SCALARS_NAME);
    /* state goes up once; per step only the INPUT kind (tokens, labels, scalars) is copied */
    cu_program_set_inputs(cp, g, init, false, &err);
    if (sk >= 0) cu_program_steps(cp, s, g, init, STEPS, out, &err);
    for (int32_t k = 0; k < g->n_inputs && !err.code; k++) {
        EXPECT_OK(gt_tensor_alloc(&fin[k], init[k].dtype, init[k].ndim, init[k].shape, &err), &err);
        if (!err.code) EXPECT_OK(gt_cuda_program_read_input(cp, k, &fin[k], &err), &err);
    }
    gt_cuda_program_free(cp);
    return err.code == GT_OK;
}

/* 5 steps CPU program vs 5 steps GPU program, twice on the GPU. */
static void check_flavor(const char *flavor, const gt_plan_options *opts)
{
    step_graph s;
    if (!step_graph_build(&s, flavor, 2, 16)) return; /* s freed */
    gt_error err = {0};
    const gt_graph *g = s.g;
    int32_t ni = g->n_inputs, no = g->n_outputs;
    gt_tensor *st_c = calloc((size_t)ni, sizeof(gt_tensor)),
              *init = calloc((size_t)ni, sizeof(gt_tensor)),
              *fin1 = calloc((size_t)ni, sizeof(gt_tensor)),
              *fin2 = calloc((size_t)ni, sizeof(gt_tensor));
    gt_tensor *out_c = calloc((size_t)no, sizeof(gt_tensor)),
              *out1 = calloc((size_t)(STEPS * no), sizeof(gt_tensor)),
              *out2 = calloc((size_t)(STEPS * no), sizeof(gt_tensor));
    bool ok = step_init_state(&s, st_c) && step_init_state(&s, init);
    ok = ok && gpu_run(&s, opts, init, out1, fin1) && gpu_run(&s, opts, init, out2, fin2);
    const char *mode = opts ? " (no sharing)" : "";

    gt_program *prog = NULL;
    if (ok) EXPECT_OK(gt_program_build_opts(g, &s.binding, opts, &prog, &err), &err);
    double worst = 0, worst_max = 0, worst_max_1 = 0, worst_all = 0;
    for (int64_t step = 1; ok && prog && step <= STEPS; step++) {
        step_set_scalars(&s, g, st_c, step);
        EXPECT_OK(gt_program_run(prog, st_c, out_c, &err), &err);
        if (err.code) break;
        const gt_tensor *o1 = out1 + (step - 1) * no, *o2 = out2 + (step - 1) * no;
        int differ = 0;
        l2_sum sum[2] = {{0, 0}, {0, 0}}; /* all params, all moments */
        for (int32_t k = 0; k < no; k++) {
            int kind_k = g->outputs[k].kind;
            l2_sum *acc = kind_k == GT_OUT_PARAM_UPDATE       ? &sum[0]
                          : kind_k == GT_OUT_OPT_STATE_UPDATE ? &sum[1]
                                                              : NULL;
            double mr, e = rel_err(&o1[k], &out_c[k], &mr, acc);
            if (!(e <= worst)) worst = e;
            if (!(mr <= worst_max)) worst_max = mr;
            const char *kind = gt_output_kind_name((gt_output_kind)g->outputs[k].kind);
            EXPECT(e <= (kind_k == GT_OUT_LOSS ? BOUND : TENSOR_BOUND),
                   "%s%s step %lld: output %s %s: GPU vs CPU relative L2 error %.3e", flavor, mode,
                   (long long)step, kind, gt_graph_str(g, g->outputs[k].fqn), e);
            if (step == 1 && g->outputs[k].kind != GT_OUT_PARAM_UPDATE) {
                if (!(mr <= worst_max_1)) worst_max_1 = mr;
                EXPECT(mr <= BOUND, "%s%s step 1: output %s %s: GPU vs CPU max error %.3e of max",
                       flavor, mode, kind, gt_graph_str(g, g->outputs[k].fqn), mr);
            }
            differ += !same_bits(&o1[k], &o2[k]);
            if (g->outputs[k].kind == GT_OUT_LOSS)
                printf("  %s%s step %lld loss cpu %.9g gpu %.9g (rel %.2e)\n", flavor, mode,
                       (long long)step, gt_tensor_get_f32(&out_c[k], 0),
                       gt_tensor_get_f32(&o1[k], 0), e);
        }
        for (int j = 0; j < 2; j++) {
            double e = l2_rel(&sum[j]);
            if (!(e <= worst_all)) worst_all = e;
            EXPECT(e <= BOUND, "%s%s step %lld: all %s: GPU vs CPU relative L2 error %.3e", flavor,
                   mode, (long long)step, j ? "moments" : "params", e);
        }
        EXPECT(differ == 0, "%s%s step %lld: %d of %d outputs differ between two GPU runs", flavor,
               mode, (long long)step, differ, no);
        /* the CPU reference feeds its updates back by hand */
        for (int32_t k = 0; k < no; k++) {
            int32_t in = gt_program_state_input(g, k);
            if (in < 0) continue;
            gt_tensor_free(&st_c[in]);
            st_c[in] = out_c[k];
            memset(&out_c[k], 0, sizeof out_c[k]);
        }
        free_tensors(out_c, no);
    }
    int state_differ = 0;
    l2_sum fsum[2] = {{0, 0}, {0, 0}};
    for (int32_t k = 0; ok && prog && k < ni; k++) {
        if (g->inputs[k].kind == GT_IN_INPUT) continue;
        double mr,
            e = rel_err(&fin1[k], &st_c[k], &mr, &fsum[g->inputs[k].kind == GT_IN_OPT_STATE]);
        if (!(e <= worst)) worst = e;
        if (!(mr <= worst_max)) worst_max = mr;
        EXPECT(e <= TENSOR_BOUND, "%s%s: final %s %s on the GPU vs CPU: relative L2 error %.3e",
               flavor, mode, gt_input_kind_name((gt_input_kind)g->inputs[k].kind),
               gt_graph_str(g, g->inputs[k].fqn), e);
        state_differ += !same_bits(&fin1[k], &fin2[k]);
    }
    for (int j = 0; ok && prog && j < 2; j++) {
        double e = l2_rel(&fsum[j]);
        if (!(e <= worst_all)) worst_all = e;
        EXPECT(e <= BOUND, "%s%s: final state, all %s: GPU vs CPU relative L2 error %.3e", flavor,
               mode, j ? "moments" : "params", e);
    }
    EXPECT(state_differ == 0, "%s%s: %d final state tensors differ between two GPU runs", flavor,
           mode, state_differ);
    printf("%s%s: %d steps; GPU vs CPU: step 1 outputs but params max error %.2e of max; all "
           "params / all moments relative L2 up to %.2e; per tensor relative L2 up to %.2e "
           "(element-wise %.2e of max); GPU rerun bitwise %s\n",
           flavor, mode, STEPS, worst_max_1, worst_all, worst, worst_max,
           state_differ ? "DIFFERENT" : "identical");

    gt_program_free(prog);
    free_tensors(st_c, ni);
    free_tensors(init, ni);
    free_tensors(fin1, ni);
    free_tensors(fin2, ni);
    free_tensors(out1, STEPS * no);
    free_tensors(out2, STEPS * no);
    free(st_c);
    free(init);
    free(fin1);
    free(fin2);
    free(out_c);
    free(out1);
    free(out2);
    step_graph_free(&s);
}

/* A tokens tensor of the wrong shape is refused, naming the input. */
static void check_errors(void)
{
    step_graph s;
    gt_error err = {0};
    if (!step_graph_build(&s, "test_tiny", 2, 16)) goto done;
    gt_cuda_program *cp = NULL;
    EXPECT_OK(gt_cuda_program_build(s.g, &s.binding, NULL, &cp, &err), &err);
    if (!cp) goto done;
    int32_t tk = -1;
    for (int32_t k = 0; k < s.g->n_inputs; k++)
        if (!strcmp(gt_graph_str(s.g, s.g->inputs[k].fqn), "tokens")) tk = k;
    EXPECT(tk >= 0, "no tokens input");
    gt_tensor bad;
    int64_t shape[2] = {3, 16};
    EXPECT_OK(gt_tensor_alloc(&bad, GT_I64, 2, shape, &err), &err);
    gt_error e = {0};
    gt_status st = gt_cuda_program_set_input(cp, tk, &bad, &e);
    EXPECT(st == GT_ERR_INVALID && strstr(e.msg, "tokens"), "wrong shape: %s", e.msg);
    gt_tensor_free(&bad);
    gt_cuda_program_free(cp);
done:
    step_graph_free(&s);
}

/* A plan larger than the GPU's free memory is refused before any allocation, with GT_ERR_NOMEM and
 * the plan's and the GPU's sizes in GiB; one that fits still builds. x[n] -> sigmoid -> neg: two
 * step buffers of 4n bytes. */
static void check_too_big(void)
{
    size_t free_b = 0, total_b = 0;
    gt_error err = {0};
    EXPECT_OK(gt_cuda_memory(&free_b, &total_b, &err), &err);
    EXPECT(free_b > 0 && free_b <= total_b, "device memory: %zu free of %zu", free_b, total_b);
    gt_graph *g = gt_graph_new();
    gt_expr d[1] = {gt_sym_var(g->sym, "n")};
    gt_value_id x = gt_graph_add_input(g, GT_IN_INPUT, "x", GT_F32, 1, d);
    gt_graph_set_fqn(g, "too_big");
    gt_value_id y = gt_unary(g, GT_OP_NEG, gt_unary(g, GT_OP_SIGMOID, x));
    gt_graph_add_output(g, GT_OUT_METRIC, "y", y);
    int64_t sizes[2] = {(int64_t)(total_b / 4), 1 << 20}; /* 2x the whole GPU; 8 MiB */
    for (int k = 0; k < 2; k++) {
        gt_sym_binding_entry e = {"n", sizes[k]};
        gt_sym_binding b = {&e, 1};
        gt_cuda_program *cp = NULL;
        gt_error e2 = {0};
        gt_status st = gt_cuda_program_build(g, &b, NULL, &cp, &e2);
        if (k == 0)
            EXPECT(st == GT_ERR_NOMEM && !cp && strstr(e2.msg, "GiB on the GPU") &&
                       strstr(e2.msg, "GiB free of"),
                   "a plan of twice the GPU: %s: %s", gt_status_name(st), e2.msg);
        else
            EXPECT(st == GT_OK && cp, "a plan of 8 MiB: %s", e2.msg);
        gt_cuda_program_free(cp);
    }
    gt_graph_free(g);
}

int main(void)
{
    gt_cuda_device_info info;
    int rc = cu_test_start(&info, NULL);
    if (rc >= 0) return rc;
    printf("device: %s\n", info.name);
    gt_cpu_set_threads(1);
    const gt_plan_options no_sharing = {.no_views = true, .no_in_place = true};
    check_flavor("test_tiny", NULL);
    check_flavor("test_tiny", &no_sharing);
    check_flavor("test_gqa", NULL);
    check_flavor("test_odd", NULL);
    check_errors();
    check_too_big();
    return gt_test_finish();
}
