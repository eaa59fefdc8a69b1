/* test_cuda_graph.c — the whole step as one CUDA graph (gt_cuda_program_capture) and the
 * asynchronous step path (staged inputs, outputs fetched and read one step later), label cuda.
 *
 * For test_tiny and test_gqa, in f32 and bf16 compute, and test_hd64 and test_hd128 in bf16 (head
 * dims 64 and 128: the attention forward runs on cuDNN where graphtrain is built with it): the
 * whole-step graph (forward, loss, backward, clipping + AdamW) runs STEPS steps from the same
 * initial state, with tokens and labels that change every step (so a replay that kept step 1's
 * inputs would show):
 *   - eager: per step set_input, exec, read_output (synchronous), carry; the reference;
 *   - graph: per step stage_input, exec, fetch_output, step_end; step 1 runs the instructions
 *     (warm-up), then the program is captured and steps 2..STEPS replay the graph; step n's
 *     outputs are read after step n + 1 is queued.
 * Checked: every output of every step and the final state (params, moments read back from the
 * input buffers) bitwise equal between eager and graph, and between two graph runs; the program
 * reports itself captured; the loss changes from step to step (the inputs do reach the replays).
 * Also: capturing a program that never ran fails (its scratch would have to grow during the
 * capture) with a message, and the program still runs eagerly afterwards, bitwise as a fresh one.
 * And the trainer CLI on the GPU with compile.cudagraphs true vs false: the same per-step loss
 * and grad norm (metrics.jsonl, every step) and the same final params hash; and each step's loss
 * within 1e-4 relative of the same run on the CPU (fp32). The GPU runs draw their parameters on
 * the device (their logs say so, and that no parameter fell back to the host's draw). */
#define _GNU_SOURCE /* nftw (train_child.h) */
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "graphtrain/gt_cuda.h"
#include "graphtrain/gt_program.h"
#include "step_harness.h"
#include "train_child.h"

#define STEPS 6

/* Step `step`'s per-step inputs in state: optimizer scalars, and i64 INPUTs (tokens, labels)
 * from an xorshift64 sequence seeded by the step. */
static void set_step_inputs(const step_graph *s, gt_tensor *state, int64_t step)
{
    const gt_graph *g = s->g;
    step_set_scalars(s, g, state, step);
    uint64_t x = 0x9E3779B97F4A7C15ull * (uint64_t)step + 1;
    for (int32_t k = 0; k < g->n_inputs; k++) {
        if (g->inputs[k].kind != GT_IN_INPUT || state[k].dtype != GT_I64) continue;
        int64_t *d = state[k].data;
        for (int64_t i = 0; i < gt_tensor_numel(&state[k]); i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            d[i] = (int64_t)(x % (uint64_t)s->vocab);
        }
    }
}

/* Output k of the step with `ticket`, fetched into pinned memory, copied into a new tensor. */
static void copy_fetched(gt_cuda_program *cp, int64_t ticket, int32_t k, gt_tensor *out,
                         gt_error *err)
{
    const gt_buffer_ref *r = &gt_cuda_program_lowered(cp)->outputs[k];
    if (gt_tensor_alloc(out, r->dtype, r->ndim, r->shape, err) != GT_OK) return;
    const void *src = gt_cuda_program_fetched(cp, ticket, k);
    EXPECT(src || gt_tensor_nbytes(out) == 0, "output %d of step ticket %lld was fetched", k,
           (long long)ticket);
    if (src) memcpy(out->data, src, gt_tensor_nbytes(out));
}

/* The device time of step n (1-based), from its start mark 2n to its end mark 2n + 1. */
static double step_device_seconds(gt_cuda_program *cp, int64_t n, gt_error *err)
{
    double dt = -1;
    if (!err->code) EXPECT_OK(gt_cuda_program_mark_seconds(cp, 2 * n, 2 * n + 1, &dt, err), err);
    if (!err->code) EXPECT(dt > 0 && dt < 60, "step %lld: device time %g s", (long long)n, dt);
    return dt > 0 ? dt : 0;
}

/* One run of STEPS steps from init (not modified); outputs of step n (1-based) into
 * out[(n - 1) * n_outputs + k], the final state into fin. graph: the capture/async path. */
static bool run(const step_graph *s, const gt_tensor *init, bool graph, gt_tensor *out,
                gt_tensor *fin)
{
    const gt_graph *g = s->g;
    int32_t ni = g->n_inputs, no = g->n_outputs;
    gt_error err = {0};
    gt_cuda_program *cp = NULL;
    EXPECT_OK(gt_cuda_program_build(g, &s->binding, NULL, &cp, &err), &err);
    if (!cp) return false;
    gt_tensor *state = calloc((size_t)ni, sizeof *state);
    for (int32_t k = 0; k < ni && !err.code; k++) {
        EXPECT_OK(gt_tensor_alloc(&state[k], init[k].dtype, init[k].ndim, init[k].shape, &err),
                  &err);
        if (!err.code) memcpy(state[k].data, init[k].data, gt_tensor_nbytes(&init[k]));
        if (!err.code) EXPECT_OK(gt_cuda_program_set_input(cp, k, &state[k], &err), &err);
    }
    int64_t prev = -1;
    double t_first = 0, device_s = 0; /* graph: host time from step 2's start, device step times */
    for (int64_t step = 1; step <= STEPS && !err.code; step++) {
        if (graph && step == 2) t_first = gt_now_seconds();
        if (graph) EXPECT_OK(gt_cuda_program_mark(cp, 2 * step, &err), &err);
        set_step_inputs(s, state, step);
        gt_tensor *o = out + (step - 1) * no;
        for (int32_t k = 0; k < ni && !err.code; k++) {
            if (g->inputs[k].kind != GT_IN_INPUT) continue;
            EXPECT_OK(graph ? gt_cuda_program_stage_input(cp, k, &state[k], &err)
                            : gt_cuda_program_set_input(cp, k, &state[k], &err),
                      &err);
        }
        if (!err.code) EXPECT_OK(gt_cuda_program_exec(cp, &err), &err);
        if (graph && step == 1 && !err.code) {
            EXPECT(!gt_cuda_program_captured(cp), "not captured before capture");
            EXPECT_OK(gt_cuda_program_capture(cp, &err), &err);
            EXPECT(gt_cuda_program_captured(cp), "captured after capture");
        }
        for (int32_t k = 0; k < no && !err.code; k++)
            EXPECT_OK(graph ? gt_cuda_program_fetch_output(cp, k, &err)
                            : gt_cuda_program_read_output(cp, k, &o[k], &err),
                      &err);
        for (int32_t k = 0; k < no && !err.code; k++) {
            int32_t in = gt_program_state_input(g, k);
            if (in >= 0) EXPECT_OK(gt_cuda_program_carry(cp, k, in, &err), &err);
        }
        if (!graph || err.code) continue;
        int64_t ticket = -1;
        EXPECT_OK(gt_cuda_program_step_end(cp, &ticket, &err), &err);
        EXPECT(ticket == step - 1, "step %lld has ticket %lld", (long long)step, (long long)ticket);
        EXPECT_OK(gt_cuda_program_mark(cp, 2 * step + 1, &err), &err);
        if (prev >= 0 && !err.code) { /* step - 1 is read while step is queued */
            EXPECT_OK(gt_cuda_program_step_wait(cp, prev, &err), &err);
            if (step > 2) device_s += step_device_seconds(cp, step - 1, &err);
            for (int32_t k = 0; k < no && !err.code; k++)
                copy_fetched(cp, prev, k, &out[(step - 2) * no + k], &err);
        }
        prev = ticket;
    }
    if (graph && prev >= 0 && !err.code) {
        EXPECT_OK(gt_cuda_program_step_wait(cp, prev, &err), &err);
        for (int32_t k = 0; k < no && !err.code; k++)
            copy_fetched(cp, prev, k, &out[(STEPS - 1) * no + k], &err);
        device_s += step_device_seconds(cp, STEPS, &err);
        /* the steps' device times lie within the host's span of them */
        double host_s = gt_now_seconds() - t_first;
        EXPECT(device_s <= host_s, "device step times add to %g s, more than the %g s they took",
               device_s, host_s);
        /* marks are a ring: the first step's were overwritten */
        gt_error e = {0};
        EXPECT(gt_cuda_program_mark_seconds(cp, 2, 3, &device_s, &e) == GT_ERR_INVALID &&
                   strstr(e.msg, "marks 2 and 3"),
               "an overwritten mark: %s", e.msg);
    }
    for (int32_t k = 0; k < ni && !err.code; k++) {
        EXPECT_OK(gt_tensor_alloc(&fin[k], init[k].dtype, init[k].ndim, init[k].shape, &err), &err);
        if (!err.code) EXPECT_OK(gt_cuda_program_read_input(cp, k, &fin[k], &err), &err);
    }
    gt_cuda_program_free(cp);
    free_tensors(state, ni);
    free(state);
    return err.code == GT_OK;
}

/* Bitwise comparison of two runs; returns the number of differing tensors. */
static int compare(const char *what, const step_graph *s, const gt_tensor *ref_out,
                   const gt_tensor *ref_fin, const gt_tensor *out, const gt_tensor *fin)
{
    const gt_graph *g = s->g;
    int bad = 0;
    for (int64_t step = 1; step <= STEPS; step++)
        bad += step_count_diffs(what, NULL, step, g, ref_out + (step - 1) * g->n_outputs,
                                out + (step - 1) * g->n_outputs);
    for (int32_t k = 0; k < g->n_inputs; k++)
        if (!same_bits(&ref_fin[k], &fin[k]) && bad++ < 6)
            fprintf(stderr, "  %s: final state of input %s differs\n", what,
                    gt_graph_str(g, g->inputs[k].fqn));
    return bad;
}

/* A program that never ran cannot be captured (its scratch would grow mid-capture); it still
 * runs eagerly after the failed capture, bitwise as the reference's step 1. */
static void check_capture_before_warmup(const step_graph *s, const gt_tensor *init,
                                        const gt_tensor *ref_out, const char *what)
{
    const gt_graph *g = s->g;
    gt_error err = {0};
    gt_cuda_program *cp = NULL;
    EXPECT_OK(gt_cuda_program_build(g, &s->binding, NULL, &cp, &err), &err);
    if (!cp) return;
    gt_tensor *state = calloc((size_t)g->n_inputs, sizeof *state);
    for (int32_t k = 0; k < g->n_inputs && !err.code; k++) {
        EXPECT_OK(gt_tensor_alloc(&state[k], init[k].dtype, init[k].ndim, init[k].shape, &err),
                  &err);
        if (!err.code) memcpy(state[k].data, init[k].data, gt_tensor_nbytes(&init[k]));
    }
    if (!err.code) set_step_inputs(s, state, 1);
    for (int32_t k = 0; k < g->n_inputs && !err.code; k++)
        EXPECT_OK(gt_cuda_program_set_input(cp, k, &state[k], &err), &err);
    if (!err.code) {
        gt_error cerr = {0};
        gt_status st = gt_cuda_program_capture(cp, &cerr);
        EXPECT(st != GT_OK && cerr.msg[0], "%s: capture before any run fails with a message", what);
        EXPECT(!gt_cuda_program_captured(cp), "%s: not captured after a failed capture", what);
        if (st != GT_OK) fprintf(stderr, "  (expected) %s\n", cerr.msg);
    }
    if (!err.code) EXPECT_OK(gt_cuda_program_exec(cp, &err), &err);
    int bad = 0;
    for (int32_t k = 0; k < g->n_outputs && !err.code; k++) {
        gt_tensor o;
        EXPECT_OK(gt_cuda_program_read_output(cp, k, &o, &err), &err);
        if (!err.code && !same_bits(&o, &ref_out[k])) bad++;
        gt_tensor_free(&o);
    }
    EXPECT(bad == 0, "%s: after a failed capture, step 1 eager: %d outputs differ", what, bad);
    gt_cuda_program_free(cp);
    free_tensors(state, g->n_inputs);
    free(state);
}

static void check_flavor(const char *flavor, gt_dtype dtype)
{
    char what[64];
    snprintf(what, sizeof what, "%s %s", flavor, gt_dtype_name(dtype));
    step_graph s;
    if (!step_graph_build_in(&s, flavor, &dtype, 2, 32)) return; /* s freed */
    const gt_graph *g = s.g;
    int32_t ni = g->n_inputs, no = g->n_outputs;
    gt_tensor *init = calloc((size_t)ni, sizeof *init);
    gt_tensor *out[3], *fin[3];
    for (int r = 0; r < 3; r++) {
        out[r] = calloc((size_t)(STEPS * no), sizeof(gt_tensor));
        fin[r] = calloc((size_t)ni, sizeof(gt_tensor));
    }
    bool ok = step_init_state(&s, init);
    ok = ok && run(&s, init, false, out[0], fin[0]);
    ok = ok && run(&s, init, true, out[1], fin[1]);
    ok = ok && run(&s, init, true, out[2], fin[2]);
    if (ok) {
        int d1 = compare(what, &s, out[0], fin[0], out[1], fin[1]);
        EXPECT(d1 == 0, "%s: cudagraph on vs off: %d tensors differ", what, d1);
        int d2 = compare(what, &s, out[1], fin[1], out[2], fin[2]);
        EXPECT(d2 == 0, "%s: cudagraph run vs rerun: %d tensors differ", what, d2);
        int same_loss = 0;
        for (int64_t step = 2; step <= STEPS; step++) {
            float a = step_loss(g, out[1] + (step - 2) * no),
                  b = step_loss(g, out[1] + (step - 1) * no);
            EXPECT(isfinite(b), "%s step %lld: finite loss", what, (long long)step);
            same_loss += a == b;
        }
        EXPECT(same_loss == 0, "%s: the loss changes every step (%d repeats)", what, same_loss);
        check_capture_before_warmup(&s, init, out[0], what);
    }
    for (int r = 0; r < 3; r++) {
        free_tensors(out[r], STEPS * no);
        free_tensors(fin[r], ni);
        free(out[r]);
        free(fin[r]);
    }
    free_tensors(init, ni);
    free(init);
    step_graph_free(&s);
}

/* ---------------------------------------------------------------- the trainer */

static bool train(const char *binary, const char *dump, const char *device, bool graphs,
                  uint64_t *hash)
{
    char out_path[600], err_path[600], graphs_opt[64], device_opt[64];
    snprintf(out_path, sizeof out_path, "%s.out", dump);
    snprintf(err_path, sizeof err_path, "%s.err", dump);
    snprintf(graphs_opt, sizeof graphs_opt, "compile.cudagraphs=%s", graphs ? "true" : "false");
    snprintf(device_opt, sizeof device_opt, "training.device=%s", device);
    char config[4200];
    snprintf(config, sizeof config, "config=%s", gt_test_path("configs/default.toml"));
    const char *opts[] = {
        config,    device_opt, "training.steps=30", "metrics.log_freq=1", "metrics.save_jsonl=true",
        graphs_opt};
    remove_tree(dump);
    pid_t pid = spawn_train(binary, opts, 6, dump, out_path, err_path);
    int code = pid > 0 ? wait_child(pid, 300) : -1;
    char *text = read_all(out_path, NULL);
    long long first = 0, last = 0;
    bool ok = code == 0 && parse_summary(text, &first, &last, hash) && first == 1 && last == 30;
    char *e = read_all(err_path, NULL);
    if (ok && !strcmp(device, "cuda")) {
        /* a fresh GPU run draws its parameters on the device, and the CPU's spot check of every
         * parameter agrees: no fallback to the host's draw */
        bool left = e && strstr(e, "parameters left to the GPU's step 1");
        bool fell_back = e && strstr(e, "differs from the CPU's draw");
        EXPECT(left && !fell_back,
               "cudagraphs %d: parameters drawn on the device (log says so: %d) with the CPU's "
               "bits (no fallback: %d)",
               graphs, left, !fell_back);
    }
    if (!ok) {
        fprintf(stderr, "train (%s, cudagraphs %d) exited %d:\n%s\n%s\n", device, graphs, code,
                text ? text : "", e ? e : "");
    }
    free(e);
    free(text);
    return ok;
}

static void check_trainer(void)
{
    const char *binary = getenv("GT_BINARY");
    EXPECT(binary && binary[0], "GT_BINARY must name the graphtrain program (CTest sets it)");
    if (!binary || !binary[0]) return;
    char dump[3][256];
    uint64_t hash[3] = {0, 1, 2};
    bool ok = true;
    for (int r = 0; r < 3; r++) {
        snprintf(dump[r], sizeof dump[r], "/tmp/gt_test_cuda_graph_%d_%d", (int)getpid(), r);
        ok = ok && train(binary, dump[r], r == 2 ? "cpu" : "cuda", r == 1, &hash[r]);
    }
    EXPECT(ok, "the trainer runs (GPU with cudagraphs off and on, CPU) finish 30 steps");
    if (ok) {
        EXPECT(hash[0] == hash[1], "final params hash: cudagraphs off %016llx, on %016llx",
               (unsigned long long)hash[0], (unsigned long long)hash[1]);
        gt_metrics_step m[3][31];
        bool have = last_records(dump[0], 30, m[0], NULL) &&
                    last_records(dump[1], 30, m[1], NULL) && last_records(dump[2], 30, m[2], NULL);
        EXPECT(have, "the runs log every step");
        /* the GPU against the CPU (fp32, both fresh): the state the device starts from (params
         * drawn there, moments zeroed there) is the CPU's; kernels differ only in summation order
         */
        for (int s = 1; have && s <= 30; s++)
            EXPECT(fabs(m[0][s].loss - m[2][s].loss) <= 1e-4 * fabs(m[2][s].loss),
                   "step %d: loss %.9g on the GPU, %.9g on the CPU", s, m[0][s].loss, m[2][s].loss);
        for (int s = 1; have && s <= 30; s++) {
            EXPECT(!memcmp(&m[0][s].loss, &m[1][s].loss, sizeof(double)) &&
                       !memcmp(&m[0][s].grad_norm, &m[1][s].grad_norm, sizeof(double)),
                   "step %d: loss %.9g / %.9g, grad_norm %.9g / %.9g (off / on)", s, m[0][s].loss,
                   m[1][s].loss, m[0][s].grad_norm, m[1][s].grad_norm);
        }
    }
    for (int r = 0; r < 3; r++) {
        char p[sizeof dump + 8];
        remove_tree(dump[r]);
        snprintf(p, sizeof p, "%s.out", dump[r]);
        unlink(p);
        snprintf(p, sizeof p, "%s.err", dump[r]);
        unlink(p);
    }
}

int main(void)
{
    if (gt_cuda_device_count() == 0) {
        fprintf(stderr, "no CUDA device: skipped\n");
        return gt_test_finish();
    }
    gt_error err = {0};
    EXPECT_OK(gt_cuda_init(0, NULL, &err), &err);
    if (err.code) return gt_test_finish();
    const char *flavors[] = {"test_tiny", "test_gqa"};
    for (int f = 0; f < 2; f++) {
        check_flavor(flavors[f], GT_F32);
        check_flavor(flavors[f], GT_BF16);
    }
    /* head dims 64 and 128 in bf16: the attention forward on cuDNN where built with it, captured */
    check_flavor("test_hd64", GT_BF16);
    check_flavor("test_hd128", GT_BF16);
    check_trainer();
    return gt_test_finish();
}
