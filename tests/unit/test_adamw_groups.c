/* test_adamw_groups.c — which adamw instructions share a multi-tensor launch
 * (gt_runtime_adamw_groups, src/runtime/adamw_groups.c; the CUDA program launches each group as
 * one gt_cuda_adamw_multi), decided on the host from instruction descriptors, so it is checked
 * here without a GPU.
 *
 * On handmade instruction lists (f32 params of assorted sizes, updated in place in the persistent
 * arena, gradients in the step arena, one scalars and one clip buffer), each expected len[] is
 * written out by hand:
 *   - a run of adamw instructions is one group; another op, or an adamw the backend refuses,
 *     ends it, and a lone adamw runs alone;
 *   - other scalars or clip buffers, or another beta1 / beta2 / eps, end a group; weight decay 0
 *     mixes with one nonzero value, two nonzero values do not;
 *   - order matters, so it ends a group: a member reading another's update, or writing a buffer
 *     another reads; an output that partly overlaps its own input keeps an instruction alone;
 *     out-of-place updates into separate buffers still group.
 * And on the lowered llama3 step programs (test_tiny and test_odd in f32, test_tiny with bf16
 * compute after the pass pipeline, where AdamW reads bf16 gradients; also with in-place sharing
 * off): the whole optimizer tail — every adamw instruction, decayed matrices and undecayed norms
 * alike — is one group, given a backend that takes f32 state, f32 or bf16 gradients and
 * 16-byte aligned offsets. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusion_graphs.h"
#include "graphtrain/gt_program.h"
#include "gt_test.h"
#include "runtime/runtime_internal.h"
#include "step_harness.h"

#define N_MAX 16

/* A 1-d buffer of numel elements of dtype dt at offset in arena. */
static gt_buffer_ref ref(int arena, size_t offset, gt_dtype dt, int64_t numel)
{
    gt_buffer_ref r;
    memset(&r, 0, sizeof r);
    r.arena = (uint8_t)arena;
    r.dtype = dt;
    r.ndim = 1;
    r.shape[0] = numel;
    r.offset = offset;
    return r;
}

/* Buffers are laid out 4096 bytes apart per slot: param k's p, m, v at slots 3k .. 3k + 2 of the
 * persistent arena, its gradient at slot k + 1 of the step arena (slot 0 holds scalars and clip).
 * Sizes stay below 1024 f32 elements, so nothing overlaps unless a test makes it. */
#define SLOT 4096

/* adamw for param k (node k) of numel elements, in place, weight decay wd. */
static gt_instr adamw(int k, int64_t numel, double wd)
{
    gt_instr ins;
    memset(&ins, 0, sizeof ins);
    ins.op = GT_OP_ADAMW;
    ins.node = k;
    ins.n_in = 6;
    ins.n_out = 3;
    ins.nf = 4;
    ins.slot = -1;
    ins.f[0] = 0.9, ins.f[1] = 0.95, ins.f[2] = 1e-8, ins.f[3] = wd;
    ins.in[0] = ref(GT_ARENA_PERSISTENT, (size_t)(3 * k) * SLOT, GT_F32, numel);
    ins.in[1] = ref(GT_ARENA_STEP, (size_t)(k + 1) * SLOT, GT_F32, numel);
    ins.in[2] = ref(GT_ARENA_PERSISTENT, (size_t)(3 * k + 1) * SLOT, GT_F32, numel);
    ins.in[3] = ref(GT_ARENA_PERSISTENT, (size_t)(3 * k + 2) * SLOT, GT_F32, numel);
    ins.in[4] = ref(GT_ARENA_STEP, 0, GT_F32, 3);
    ins.in[5] = ref(GT_ARENA_STEP, 64, GT_F32, 1);
    ins.out[0] = ins.in[0];
    ins.out[1] = ins.in[2];
    ins.out[2] = ins.in[3];
    return ins;
}

/* Some other instruction (an add of two step buffers far from everything above). */
static gt_instr other(int node)
{
    gt_instr ins;
    memset(&ins, 0, sizeof ins);
    ins.op = GT_OP_ADD;
    ins.node = node;
    ins.n_in = 2;
    ins.n_out = 1;
    ins.slot = -1;
    ins.in[0] = ref(GT_ARENA_STEP, 1000 * SLOT, GT_F32, 8);
    ins.in[1] = ref(GT_ARENA_STEP, 1001 * SLOT, GT_F32, 8);
    ins.out[0] = ref(GT_ARENA_STEP, 1002 * SLOT, GT_F32, 8);
    return ins;
}

/* The backend of these tests: takes every adamw but the node *user names (-1: none). */
static bool fits_but(const gt_instr *ins, void *user)
{
    return ins->node != *(const int *)user;
}

/* Groups of instrs[0 .. n) with fits_but(refuse) against the expected len[] and group count. */
static void check(const char *what, const gt_instr *instrs, int32_t n, int refuse,
                  const int32_t *want, int32_t want_groups)
{
    int32_t len[N_MAX];
    memset(len, 0x7f, sizeof len);
    int32_t groups = gt_runtime_adamw_groups(instrs, n, fits_but, &refuse, len);
    char got[256] = "", exp[256] = "";
    bool same = groups == want_groups;
    for (int32_t k = 0; k < n; k++) {
        same = same && len[k] == want[k];
        snprintf(got + strlen(got), sizeof got - strlen(got), " %d", (int)len[k]);
        snprintf(exp + strlen(exp), sizeof exp - strlen(exp), " %d", (int)want[k]);
    }
    EXPECT(same, "%s: len[] =%s (%d groups), expected%s (%d groups)", what, got, (int)groups, exp,
           (int)want_groups);
}

static void test_runs(void)
{
    const int64_t sizes[6] = {1, 3, 1023, 4, 5, 1000};
    gt_instr ins[N_MAX];
    for (int k = 0; k < 5; k++)
        ins[k] = adamw(k, sizes[k], 0.1);
    check("five adamw", ins, 5, -1, (const int32_t[]){5, 0, 0, 0, 0}, 1);
    check("the backend refuses the third", ins, 5, 2, (const int32_t[]){2, 0, 1, 2, 0}, 2);
    check("the backend refuses the second", ins, 5, 1, (const int32_t[]){1, 1, 3, 0, 0}, 1);

    gt_instr mixed[6] = {adamw(0, 7, 0.1), adamw(1, 8, 0.1), other(10),
                         adamw(2, 9, 0.1), adamw(3, 1, 0.1), adamw(4, 2, 0.1)};
    check("another op in between", mixed, 6, -1, (const int32_t[]){2, 0, 1, 3, 0, 0}, 2);
    gt_instr lone[3] = {other(10), adamw(0, 7, 0.0), other(11)};
    check("a lone adamw", lone, 3, -1, (const int32_t[]){1, 1, 1}, 0);
    check("nothing", lone, 0, -1, (const int32_t[]){0}, 0);
}

static void test_constants(void)
{
    gt_instr ins[N_MAX];
    for (int k = 0; k < 4; k++)
        ins[k] = adamw(k, 16, 0.1);
    ins[2].in[4] = ref(GT_ARENA_STEP, 128, GT_F32, 3);
    check("other scalars from the third on", ins, 4, -1, (const int32_t[]){2, 0, 1, 1}, 1);
    ins[3].in[4] = ins[2].in[4];
    check("the last two share other scalars", ins, 4, -1, (const int32_t[]){2, 0, 2, 0}, 2);

    for (int k = 0; k < 4; k++)
        ins[k] = adamw(k, 16, 0.1);
    ins[1].in[5] = ref(GT_ARENA_STEP, 192, GT_F32, 1);
    check("another clip", ins, 4, -1, (const int32_t[]){1, 1, 2, 0}, 1);

    const char *names[3] = {"beta1", "beta2", "eps"};
    for (int f = 0; f < 3; f++) {
        for (int k = 0; k < 4; k++)
            ins[k] = adamw(k, 16, 0.1);
        for (int k = 1; k < 4; k++)
            ins[k].f[f] = 0.5 * ins[0].f[f];
        char what[64];
        snprintf(what, sizeof what, "another %s from the second on", names[f]);
        check(what, ins, 4, -1, (const int32_t[]){1, 3, 0, 0}, 1);
    }

    const double decays[5] = {0.1, 0.0, 0.1, 0.0, 0.0};
    for (int k = 0; k < 5; k++)
        ins[k] = adamw(k, 16, decays[k]);
    check("weight decay 0.1 and 0 mixed", ins, 5, -1, (const int32_t[]){5, 0, 0, 0, 0}, 1);
    ins[2].f[3] = 0.2;
    check("weight decays 0.1 then 0.2", ins, 5, -1, (const int32_t[]){2, 0, 3, 0, 0}, 2);
    const double late[4] = {0.0, 0.0, 0.2, 0.1};
    for (int k = 0; k < 4; k++)
        ins[k] = adamw(k, 16, late[k]);
    check("weight decays 0, 0, 0.2, 0.1", ins, 4, -1, (const int32_t[]){3, 0, 0, 1}, 1);
}

static void test_hazards(void)
{
    gt_instr ins[N_MAX];
    for (int k = 0; k < 3; k++)
        ins[k] = adamw(k, 64, 0.1);
    ins[1].in[1] = ins[0].out[0]; /* reads the first's updated param as its gradient */
    check("the second reads the first's update", ins, 3, -1, (const int32_t[]){1, 2, 0}, 1);

    for (int k = 0; k < 3; k++)
        ins[k] = adamw(k, 64, 0.1);
    ins[1].out[1] = ins[0].in[1]; /* writes its m' over the first's gradient */
    check("the second writes the first's gradient", ins, 3, -1, (const int32_t[]){1, 2, 0}, 1);

    for (int k = 0; k < 3; k++)
        ins[k] = adamw(k, 64, 0.1);
    ins[2].out[2] = ref(GT_ARENA_PERSISTENT, 3 * SLOT + 100, GT_F32, 64); /* into the second's p */
    check("the third writes into the second's param", ins, 3, -1, (const int32_t[]){2, 0, 1}, 1);

    for (int k = 0; k < 3; k++)
        ins[k] = adamw(k, 64, 0.1);
    ins[1].out[0].offset += 4; /* p' one element past p: the kernel's order would matter */
    check("an update shifted over its own input", ins, 3, -1, (const int32_t[]){1, 1, 1}, 0);

    for (int k = 0; k < 3; k++)
        ins[k] = adamw(k, 64, 0.1);
    ins[1].out[2] = ins[1].in[4]; /* v' over the scalars every thread reads */
    ins[1].out[2].shape[0] = 64;
    check("an update over the scalars", ins, 3, -1, (const int32_t[]){1, 1, 1}, 0);

    /* out of place: the updates in slots of their own (300 + k), nothing shared */
    for (int k = 0; k < 4; k++) {
        ins[k] = adamw(k, 64, 0.1);
        for (int o = 0; o < 3; o++)
            ins[k].out[o] = ref(GT_ARENA_PERSISTENT, (size_t)(300 + 3 * k + o) * SLOT, GT_F32, 64);
    }
    check("out of place", ins, 4, -1, (const int32_t[]){4, 0, 0, 0}, 1);
    /* the third's v' in place over its own gradient (exactly): still one element at a time */
    ins[2].out[2] = ins[2].in[1];
    check("an update exactly over its own gradient", ins, 4, -1, (const int32_t[]){4, 0, 0, 0}, 1);
}

/* A backend like the CUDA one on a planned program: f32 state and updates, f32 or bf16
 * gradients, 16-byte aligned offsets (the device arenas themselves are 256-byte aligned). */
static bool fits_vector(const gt_instr *ins, void *user)
{
    (void)user;
    for (int j = 0; j < 6; j++)
        if (ins->in[j].offset % 16 || (j != 1 && ins->in[j].dtype != GT_F32)) return false;
    for (int j = 0; j < 3; j++)
        if (ins->out[j].offset % 16 || ins->out[j].dtype != GT_F32) return false;
    return ins->in[1].dtype == GT_F32 || ins->in[1].dtype == GT_BF16;
}

/* The lowered step program of graph g: one group holding every adamw instruction, which are the
 * program's last instructions, one per param; *bf16_grads counts those reading bf16 gradients. */
static void check_program(const char *what, const gt_graph *g, const gt_sym_binding *b,
                          const gt_plan_options *opts, int32_t n_params, int *bf16_grads)
{
    gt_error err = {0};
    gt_program *p = NULL;
    EXPECT_OK(gt_program_build_opts(g, b, opts, &p, &err), &err);
    if (!p) return;
    int32_t *len = calloc((size_t)p->n_instrs + 1, sizeof *len);
    int32_t groups = gt_runtime_adamw_groups(p->instrs, p->n_instrs, fits_vector, NULL, len);
    int32_t n_adamw = 0, first = -1;
    *bf16_grads = 0;
    for (int32_t k = 0; k < p->n_instrs; k++) {
        if (p->instrs[k].op != GT_OP_ADAMW) continue;
        if (first < 0) first = k;
        n_adamw++;
        *bf16_grads += p->instrs[k].in[1].dtype == GT_BF16;
    }
    EXPECT(n_adamw == n_params, "%s: %d adamw instructions for %d params", what, (int)n_adamw,
           (int)n_params);
    EXPECT(groups == 1 && first >= 0 && len[first] == n_adamw,
           "%s: %d groups, the first adamw (instruction %d) starts one of %d, expected one of all "
           "%d",
           what, (int)groups, (int)first, first >= 0 ? (int)len[first] : -1, (int)n_adamw);
    printf("%s: %d instructions, the %d adamw (%d with bf16 gradients) in %d group(s)\n", what,
           (int)p->n_instrs, (int)n_adamw, *bf16_grads, (int)groups);
    free(len);
    gt_program_free(p);
}

static void test_step_programs(void)
{
    const char *flavors[2] = {"test_tiny", "test_odd"};
    int bf16 = 0;
    for (int f = 0; f < 2; f++) {
        step_graph s;
        if (!step_graph_build(&s, flavors[f], 2, 16)) continue;
        char what[96];
        snprintf(what, sizeof what, "%s f32", flavors[f]);
        check_program(what, s.g, &s.binding, NULL, s.model.n_params, &bf16);
        EXPECT(bf16 == 0, "%s: %d bf16 gradients in an f32 graph", what, bf16);
        if (f == 0) {
            gt_plan_options no_sharing = {.no_views = true, .no_in_place = true};
            snprintf(what, sizeof what, "%s f32, no sharing", flavors[f]);
            check_program(what, s.g, &s.binding, &no_sharing, s.model.n_params, &bf16);
        }
        step_graph_free(&s);
    }
    /* bf16 compute through the pipeline: fusion drops the gradients' widening casts */
    step_graph s;
    gt_dtype bf = GT_BF16;
    if (!step_graph_build_in(&s, "test_tiny", &bf, 2, 16)) return;
    compile_step(s.g, true);
    check_program("test_tiny bf16, compiled", s.g, &s.binding, NULL, s.model.n_params, &bf16);
    EXPECT(bf16 > 0, "test_tiny bf16, compiled: no adamw reads a bf16 gradient");
    step_graph_free(&s);
}

int main(void)
{
    test_runs();
    test_constants();
    test_hazards();
    test_step_programs();
    return gt_test_finish();
}
