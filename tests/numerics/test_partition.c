/* test_partition.c — forward program then backward program equals the whole-step program bitwise.
 *
 * Handmade graphs first: the saved set of a small graph with a recompute-tagged copy is exactly the
 * forward values the backward part reads (counted by hand), the recompute copy lands in the
 * backward part, and a forward node that reads a backward or recompute value is refused with an
 * error naming it.
 *
 * Then test_tiny, test_gqa and test_odd whole-step graphs (forward, loss, backward, clipping,
 * AdamW; as gt_train_build_graph builds them without passes): the reference is gt_eager_run of the
 * whole graph; against it, over 3 steps each feeding its own updated params and moments back,
 *   (a) gt_eager_run of fwd, then of bwd with each "saved.<k>" input fed from fwd's output, and
 *   (b) gt_program_run of the programs built from fwd and bwd, likewise,
 * must give every whole-graph output memcmp-equal. The saved set is also checked against a naive
 * scan of the whole graph (forward, non-recompute producer; backward/optimizer/recompute reader).
 * Last, debugmodel at 8 x 2048 tokens is partitioned (not run) and its saved-value table and bytes
 * printed; the bytes are checked against the naive sum over the whole graph's values. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graphtrain/gt_backend.h"
#include "graphtrain/gt_build.h"
#include "graphtrain/gt_partition.h"
#include "graphtrain/gt_program.h"
#include "gt_test.h"
#include "step_harness.h"

#define STEPS 3

/* ---------------------------------------------------------------- helpers */

/* The rule of gt_partition.h: backward and optimizer nodes, and recompute copies (tagged, with an
 * origin; remat gives them phase bwd too); a tagged original stays forward. */
static bool in_bwd_part(const gt_graph *g, const gt_node *n)
{
    return n->phase != GT_PHASE_FORWARD ||
           (gt_node_has_tag(g, n, "recompute") && n->origin != GT_NONE);
}

/* Naive saved set: flags[v] = 1 when v is produced by a forward part node and some backward part
 * node reads it. Returns the count. */
static int32_t naive_saved(const gt_graph *g, uint8_t *flags)
{
    memset(flags, 0, (size_t)g->n_values);
    for (gt_node_id n = 0; n < g->n_nodes; n++) {
        if (!in_bwd_part(g, &g->nodes[n])) continue;
        for (int k = 0; k < g->nodes[n].n_in; k++) {
            gt_value_id v = g->nodes[n].in[k];
            gt_node_id p = g->values[v].producer;
            if (p != GT_NONE && !in_bwd_part(g, &g->nodes[p])) flags[v] = 1;
        }
    }
    int32_t c = 0;
    for (gt_value_id v = 0; v < g->n_values; v++)
        c += flags[v];
    return c;
}

/* Shallow views of the whole-graph state and fwd outputs as the inputs of one part. */
static void gather_inputs(const gt_partition_info *info, gt_part part, const gt_tensor *state,
                          const gt_tensor *fwd_out, gt_tensor *in)
{
    int32_t n = part == GT_PART_FWD ? info->n_fwd_inputs : info->n_bwd_inputs;
    const int32_t *of = part == GT_PART_FWD ? info->fwd_input_of : info->bwd_input_of;
    for (int32_t k = 0; k < n; k++)
        in[k] = of[k] >= 0 ? state[of[k]] : fwd_out[info->saved[-1 - of[k]].fwd_output];
}

/* Runs fwd then bwd (eager, or the two programs when progs is set) and places each whole output
 * into out[k] (moved out of the parts' outputs). */
static gt_status run_split(const gt_graph *f, const gt_graph *b, gt_program **progs,
                           const gt_partition_info *info, const gt_sym_binding *binding,
                           const gt_tensor *state, gt_tensor *out, gt_error *err)
{
    gt_tensor *fin = calloc((size_t)f->n_inputs + 1, sizeof(gt_tensor));
    gt_tensor *bin = calloc((size_t)b->n_inputs + 1, sizeof(gt_tensor));
    gt_tensor *fout = calloc((size_t)f->n_outputs + 1, sizeof(gt_tensor));
    gt_tensor *bout = calloc((size_t)b->n_outputs + 1, sizeof(gt_tensor));
    gather_inputs(info, GT_PART_FWD, state, NULL, fin);
    gt_status st =
        progs ? gt_program_run(progs[0], fin, fout, err) : gt_eager_run(f, binding, fin, fout, err);
    if (st == GT_OK) {
        gather_inputs(info, GT_PART_BWD, state, fout, bin);
        st = progs ? gt_program_run(progs[1], bin, bout, err)
                   : gt_eager_run(b, binding, bin, bout, err);
    }
    if (st == GT_OK)
        for (int32_t k = 0; k < info->n_whole_outputs; k++) {
            gt_partition_ref r = info->output_of[k];
            gt_tensor *src = r.part == GT_PART_FWD ? &fout[r.index] : &bout[r.index];
            out[k] = *src;
            memset(src, 0, sizeof *src);
        }
    if (st == GT_OK) free_tensors(fout, f->n_outputs);
    if (st == GT_OK) free_tensors(bout, b->n_outputs);
    free(fin);
    free(bin);
    free(fout);
    free(bout);
    return st;
}

/* ---------------------------------------------------------------- handmade graphs */

/* x: INPUT [4], w: PARAM [4].
 *   fwd:  a = x*w;  b = exp(a) (tagged "recompute": an original)       -> LOSS b
 *   bwd:  c = b*a;  e = exp(a) (forward-phase recompute copy of b's node, origin set);
 *         d = e + w                                                    -> METRIC c, GRAD w = d
 * saved = {a, b}; x is read by no backward node, w is a graph input (not saved). */
static void check_handmade(void)
{
    gt_graph *g = gt_graph_new();
    gt_error err = {0};
    gt_expr d4 = gt_sym_const(g->sym, 4);
    gt_value_id x = gt_graph_add_input(g, GT_IN_INPUT, "x", GT_F32, 1, &d4);
    gt_value_id w = gt_graph_add_input(g, GT_IN_PARAM, "w", GT_F32, 1, &d4);
    gt_graph_set_fqn(g, "layer");
    gt_value_id a = gt_mul(g, x, w);
    gt_value_id b = gt_unary(g, GT_OP_EXP, a);
    gt_graph_add_tag(g, g->values[b].producer, "recompute");
    g->cur_phase = GT_PHASE_BACKWARD;
    gt_value_id c = gt_mul(g, b, a);
    g->cur_phase = GT_PHASE_FORWARD;
    gt_value_id e = gt_unary(g, GT_OP_EXP, a);
    gt_graph_add_tag(g, g->values[e].producer, "recompute");
    g->nodes[g->values[e].producer].origin = g->values[b].producer;
    g->cur_phase = GT_PHASE_BACKWARD;
    gt_value_id d = gt_add(g, e, w);
    gt_graph_add_output(g, GT_OUT_METRIC, "c", c);
    gt_graph_add_output(g, GT_OUT_LOSS, "loss", b);
    gt_graph_add_output(g, GT_OUT_GRAD, "w", d);
    EXPECT(g->err.code == GT_OK, "handmade graph: %s", g->err.msg);
    EXPECT_OK(gt_graph_verify(g, &err), &err);

    gt_graph *f = NULL, *bw = NULL;
    gt_partition_info info;
    EXPECT_OK(gt_partition_fwd_bwd(g, &f, &bw, &info, &err), &err);
    if (!f) {
        gt_graph_free(g);
        return;
    }
    EXPECT(info.n_saved == 2 && info.saved[0].whole_value == a && info.saved[1].whole_value == b,
           "saved set: %d values", info.n_saved);
    EXPECT(f->n_nodes == 2 && bw->n_nodes == 3, "fwd %d nodes, bwd %d nodes", f->n_nodes,
           bw->n_nodes);
    EXPECT(bw->n_nodes == 3 && gt_node_has_tag(bw, &bw->nodes[1], "recompute") &&
               bw->nodes[1].op == GT_OP_EXP,
           "the recompute copy is not the second backward node");
    /* fwd reads x and w; bwd reads saved.0, saved.1 then w (x is not needed there) */
    EXPECT(f->n_inputs == 2 && bw->n_inputs == 3 && info.bwd_input_of[0] == -1 &&
               info.bwd_input_of[1] == -2 && info.bwd_input_of[2] == 1,
           "inputs: fwd %d, bwd %d", f->n_inputs, bw->n_inputs);
    EXPECT(info.output_of[0].part == GT_PART_BWD && info.output_of[1].part == GT_PART_FWD &&
               info.output_of[2].part == GT_PART_BWD,
           "output placement");
    EXPECT(f->n_outputs == 3 && !strcmp(gt_graph_str(f, f->outputs[1].fqn), "saved.0") &&
               !strcmp(gt_graph_str(bw, bw->inputs[1].fqn), "saved.1"),
           "interface names");

    /* bitwise whole vs split on concrete values */
    float xv[4] = {0.5f, -1.25f, 2.0f, 0.125f}, wv[4] = {1.5f, 0.75f, -0.5f, 3.0f};
    int64_t shape[1] = {4};
    gt_tensor st[2];
    gt_tensor_alloc(&st[0], GT_F32, 1, shape, &err);
    gt_tensor_alloc(&st[1], GT_F32, 1, shape, &err);
    memcpy(st[0].data, xv, sizeof xv);
    memcpy(st[1].data, wv, sizeof wv);
    gt_tensor ow[3] = {0}, os[3] = {0};
    EXPECT_OK(gt_eager_run(g, NULL, st, ow, &err), &err);
    EXPECT_OK(run_split(f, bw, NULL, &info, NULL, st, os, &err), &err);
    for (int k = 0; k < 3; k++)
        EXPECT(same_bits(&ow[k], &os[k]), "handmade output %d differs", k);
    free_tensors(ow, 3);
    free_tensors(os, 3);
    free_tensors(st, 2);
    gt_partition_print(&info, stdout);
    gt_partition_info_free(&info);
    gt_graph_free(f);
    gt_graph_free(bw);
    gt_graph_free(g);
}

/* A forward node reading a backward value (or a recompute copy) cannot be split. Nodes: 0 an
 * original exp tagged "recompute", 1 its copy (or a backward exp), 2 the forward add reading 1. */
static void check_refused(bool via_recompute)
{
    gt_graph *g = gt_graph_new();
    gt_error err = {0};
    gt_expr d4 = gt_sym_const(g->sym, 4);
    gt_value_id x = gt_graph_add_input(g, GT_IN_INPUT, "x", GT_F32, 1, &d4);
    gt_value_id o = gt_unary(g, GT_OP_EXP, x);
    gt_graph_add_tag(g, g->values[o].producer, "recompute");
    if (!via_recompute) g->cur_phase = GT_PHASE_BACKWARD;
    gt_value_id y = gt_unary(g, GT_OP_EXP, x);
    if (via_recompute) {
        gt_graph_add_tag(g, g->values[y].producer, "recompute");
        g->nodes[g->values[y].producer].origin = g->values[o].producer;
    }
    g->cur_phase = GT_PHASE_FORWARD;
    gt_graph_set_fqn(g, "bad.node");
    gt_value_id z = gt_add(g, y, x);
    gt_graph_add_output(g, GT_OUT_LOSS, "loss", z);
    gt_graph_add_output(g, GT_OUT_METRIC, "o", o);
    gt_graph *f = (gt_graph *)1, *b = (gt_graph *)1;
    gt_status st = gt_partition_fwd_bwd(g, &f, &b, NULL, &err);
    EXPECT(st == GT_ERR_INVALID && strstr(err.msg, "forward node 2") &&
               strstr(err.msg, "bad.node") && !f && !b,
           "refusal (%s): status %d, message '%s'", via_recompute ? "recompute" : "backward", st,
           err.msg);
    gt_graph_free(g);
}

/* ---------------------------------------------------------------- whole-step graphs */

/* Structure: node counts add up, each part holds only its phases, the saved set is the naive one.
 */
static void check_structure(const char *flavor, const gt_graph *g, const gt_graph *f,
                            const gt_graph *b, const gt_partition_info *info)
{
    EXPECT(f->n_nodes + b->n_nodes == g->n_nodes, "%s: %d + %d nodes, whole has %d", flavor,
           f->n_nodes, b->n_nodes, g->n_nodes);
    int wrong = 0;
    for (gt_node_id n = 0; n < f->n_nodes; n++)
        wrong += in_bwd_part(f, &f->nodes[n]);
    for (gt_node_id n = 0; n < b->n_nodes; n++)
        wrong += !in_bwd_part(b, &b->nodes[n]);
    EXPECT(wrong == 0, "%s: %d nodes in the wrong part", flavor, wrong);
    uint8_t *flags = malloc((size_t)g->n_values);
    int32_t want = naive_saved(g, flags);
    int bad = 0;
    for (int32_t k = 0; k < info->n_saved; k++)
        bad += !flags[info->saved[k].whole_value];
    EXPECT(info->n_saved == want && bad == 0, "%s: %d saved values, naive scan finds %d (%d odd)",
           flavor, info->n_saved, want, bad);
    EXPECT(f->n_outputs + b->n_outputs == g->n_outputs + info->n_saved &&
               b->n_inputs >= info->n_saved,
           "%s: outputs %d + %d for %d whole and %d saved", flavor, f->n_outputs, b->n_outputs,
           g->n_outputs, info->n_saved);
    free(flags);
}

static void compare(const char *flavor, const char *how, int64_t step, const gt_graph *g,
                    const gt_tensor *ref, const gt_tensor *got)
{
    int bad = step_count_diffs(flavor, how, step, g, ref, got);
    EXPECT(bad == 0, "%s %s step %lld: %d of %d outputs differ", flavor, how, (long long)step, bad,
           g->n_outputs);
}

static void check_flavor(const char *flavor)
{
    step_graph s;
    if (!step_graph_build(&s, flavor, 2, 16)) return;
    gt_error err = {0};
    const gt_graph *g = s.g;
    gt_graph *f = NULL, *b = NULL;
    gt_partition_info info;
    EXPECT_OK(gt_partition_fwd_bwd(g, &f, &b, &info, &err), &err);
    if (!f) {
        step_graph_free(&s);
        return;
    }
    check_structure(flavor, g, f, b, &info);
    gt_program *progs[2] = {NULL, NULL};
    EXPECT_OK(gt_program_build(f, &s.binding, &progs[0], &err), &err);
    EXPECT_OK(gt_program_build(b, &s.binding, &progs[1], &err), &err);

    step_run run[3]; /* whole eager, split eager, split program */
    bool ok = progs[0] && progs[1];
    for (int r = 0; r < 3; r++)
        ok = step_run_init(&run[r], &s) && ok;
    for (int64_t step = 1; ok && step <= STEPS; step++) {
        for (int r = 0; r < 3; r++)
            step_set_scalars(&s, g, run[r].state, step);
        EXPECT_OK(gt_eager_run(g, &s.binding, run[0].state, run[0].out, &err), &err);
        EXPECT_OK(run_split(f, b, NULL, &info, &s.binding, run[1].state, run[1].out, &err), &err);
        EXPECT_OK(run_split(f, b, progs, &info, &s.binding, run[2].state, run[2].out, &err), &err);
        if (err.code) break;
        compare(flavor, "eager fwd+bwd", step, g, run[0].out, run[1].out);
        compare(flavor, "program fwd+bwd", step, g, run[0].out, run[2].out);
        if (step == STEPS)
            printf("%s step %lld loss %.9g (whole, fwd+bwd eager and program)\n", flavor,
                   (long long)step, step_loss(g, run[2].out));
        for (int r = 0; r < 3; r++)
            step_run_next(&run[r], g);
    }
    printf("%s: %d forward nodes, %d backward nodes, %d saved values\n", flavor, info.n_fwd_nodes,
           info.n_bwd_nodes, info.n_saved);
    for (int r = 0; r < 3; r++)
        step_run_free(&run[r]);
    gt_program_free(progs[0]);
    gt_program_free(progs[1]);
    gt_partition_info_free(&info);
    gt_graph_free(f);
    gt_graph_free(b);
    step_graph_free(&s);
}

/* Partition only: debugmodel at 8 x 2048 tokens; the saved bytes against a naive sum. */
static void report_debugmodel(void)
{
    step_graph s;
    gt_error err = {0};
    if (!step_graph_build(&s, "debugmodel", 8, 2048)) return;
    gt_graph *f = NULL, *b = NULL;
    gt_partition_info info;
    EXPECT_OK(gt_partition_fwd_bwd(s.g, &f, &b, &info, &err), &err);
    if (f) {
        EXPECT_OK(gt_partition_eval_bytes(&info, f, &s.binding, &err), &err);
        gt_partition_print(&info, stdout);
        uint8_t *flags = malloc((size_t)s.g->n_values);
        naive_saved(s.g, flags);
        int64_t want = 0;
        for (gt_value_id v = 0; v < s.g->n_values; v++) {
            if (!flags[v]) continue;
            int64_t shape[GT_MAX_DIMS], n = (int64_t)gt_dtype_size(gt_value_type(s.g, v)->dtype);
            EXPECT_OK(gt_graph_eval_shape(s.g, v, &s.binding, shape, &err), &err);
            for (int d = 0; d < gt_value_type(s.g, v)->ndim; d++)
                n *= shape[d];
            want += n;
        }
        free(flags);
        EXPECT(info.saved_bytes == want, "debugmodel saved bytes %lld, naive sum %lld",
               (long long)info.saved_bytes, (long long)want);
        printf("debugmodel 8x2048: %d saved values, %lld bytes (%.1f MiB)\n", info.n_saved,
               (long long)info.saved_bytes, (double)info.saved_bytes / (1024.0 * 1024.0));
    }
    gt_partition_info_free(&info);
    gt_graph_free(f);
    gt_graph_free(b);
    step_graph_free(&s);
}

int main(void)
{
    gt_cpu_set_threads(1);
    check_handmade();
    check_refused(false);
    check_refused(true);
    check_flavor("test_tiny");
    check_flavor("test_gqa");
    check_flavor("test_odd");
    report_debugmodel();
    return gt_test_finish();
}
