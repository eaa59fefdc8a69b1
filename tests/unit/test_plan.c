/* test_plan.c — schedule, memory plan and program on small handmade graphs.
 *
 * Checked against references computed here, not by the planner:
 *   - liveness: for every pair of distinct buffers of one arena that a naive scan of the graph
 *     finds live at a common position (defined at or before it, read by some member at or after
 *     it, or a graph output), their byte ranges are disjoint (brute force over all pairs);
 *   - every sharing is legal: a view is the output of a reshape of the same buffer; an in-place
 *     output is an adamw output over its own state input, with no reader of that buffer later;
 *   - 64-byte alignment of every offset; arena sizes cover every buffer;
 *   - a chain of equal-size unary ops needs exactly two buffers (the optimum for a chain);
 *   - adamw runs in place over p, m, v in the persistent arena, and refuses when p is read later;
 *   - programs equal gt_eager_run bit for bit on these graphs, and allocate what was planned;
 *   - the report names the largest live value's fqn; errors name the symbol, node or input. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graphtrain/gt_build.h"
#include "graphtrain/gt_exec.h"
#include "graphtrain/gt_program.h"
#include "gt_test.h"

static gt_sym_binding bind_n(gt_sym_binding_entry *e, int64_t n)
{
    e->name = "n";
    e->value = n;
    return (gt_sym_binding){e, 1};
}

/* Naive liveness of buffer groups: lo[r] / hi[r] over every member of root r. */
static void naive_intervals(const gt_plan *p, int32_t *lo, int32_t *hi)
{
    const gt_graph *g = p->g;
    int32_t n = p->n_order;
    for (gt_value_id v = 0; v < g->n_values; v++)
        lo[v] = n + 10, hi[v] = -10;
    for (int32_t k = 0; k < g->n_inputs; k++) {
        gt_value_id r = p->values[g->inputs[k].value].root;
        lo[r] = -1;
        if (hi[r] < -1) hi[r] = -1;
    }
    for (int32_t pos = 0; pos < n; pos++) {
        const gt_node *nd = &g->nodes[p->order[pos]];
        for (int j = 0; j < nd->n_in; j++) {
            gt_value_id r = p->values[nd->in[j]].root;
            if (hi[r] < pos) hi[r] = pos;
        }
        for (int j = 0; j < nd->n_out; j++) {
            gt_value_id r = p->values[nd->out[j]].root;
            if (lo[r] > pos) lo[r] = pos;
            if (hi[r] < pos) hi[r] = pos;
        }
    }
    for (int32_t k = 0; k < g->n_outputs; k++)
        hi[p->values[g->outputs[k].value].root] = n;
}

/* The brute-force checks shared by every plan. */
static void check_plan(const gt_plan *p, const char *what)
{
    const gt_graph *g = p->g;
    int32_t nv = g->n_values;
    int32_t *lo = calloc((size_t)nv, sizeof *lo), *hi = calloc((size_t)nv, sizeof *hi);
    naive_intervals(p, lo, hi);
    int overlaps = 0, misaligned = 0, outside = 0, bad_share = 0;
    for (gt_value_id a = 0; a < nv; a++) {
        const gt_value_plan *va = &p->values[a];
        if (va->offset % GT_PLAN_ALIGN) misaligned++;
        if (va->offset + va->nbytes > p->arena_bytes[va->arena]) outside++;
        if (va->root != a) {
            /* legal sharing: reshape or contiguous slice of the same buffer, or adamw output over
             * its state input */
            gt_node_id n = g->values[a].producer;
            const gt_node *nd = n >= 0 ? &g->nodes[n] : NULL;
            bool ok = false;
            if (nd && nd->op == GT_OP_RESHAPE) ok = p->values[nd->in[0]].root == va->root;
            if (nd && nd->op == GT_OP_SLICE) { /* a run inside the root's buffer */
                const gt_value_plan *vr = &p->values[va->root];
                ok = p->values[nd->in[0]].root == va->root && va->offset >= vr->offset &&
                     va->offset + va->nbytes <= vr->offset + vr->nbytes;
            }
            /* a concat input computed in place: inside the run of one of the concat's inputs
             * that shares the concat output's buffer */
            gt_node_id rn = g->values[va->root].producer;
            const gt_node *cat = rn >= 0 ? &g->nodes[rn] : NULL;
            if (!ok && cat && cat->op == GT_OP_CONCAT && va->shared != 1) {
                size_t at = p->values[va->root].offset;
                for (int j = 0; j < cat->n_in; at += p->values[cat->in[j]].nbytes, j++)
                    if (p->values[cat->in[j]].root == va->root && va->offset >= at &&
                        va->offset + va->nbytes <= at + p->values[cat->in[j]].nbytes)
                        ok = true;
            }
            if (nd && nd->op == GT_OP_ADAMW) {
                static const int in_of_out[3] = {0, 2, 3};
                int slot = g->values[a].producer_slot;
                ok = p->values[nd->in[in_of_out[slot]]].root == va->root;
                /* no member of the buffer is read after the adamw node */
                int32_t pos = -1;
                for (int32_t k = 0; k < p->n_order; k++)
                    if (p->order[k] == n) pos = k;
                for (int32_t k = pos + 1; ok && k < p->n_order; k++) {
                    const gt_node *later = &g->nodes[p->order[k]];
                    for (int j = 0; j < later->n_in; j++) {
                        gt_value_id u = later->in[j];
                        if (p->values[u].root == va->root && g->values[u].producer != n) ok = false;
                    }
                }
            }
            if (!ok) bad_share++;
            continue;
        }
        for (gt_value_id b = a + 1; b < nv; b++) {
            const gt_value_plan *vb = &p->values[b];
            if (vb->root != b || vb->arena != va->arena || !va->nbytes || !vb->nbytes) continue;
            if (lo[a] > hi[b] || lo[b] > hi[a]) continue;
            if (va->offset < vb->offset + vb->nbytes && vb->offset < va->offset + va->nbytes) {
                if (overlaps++ < 3)
                    fprintf(stderr, "  %s: %%%d [%zu, +%zu) and %%%d [%zu, +%zu) overlap\n", what,
                            a, va->offset, va->nbytes, b, vb->offset, vb->nbytes);
            }
        }
    }
    EXPECT(overlaps == 0, "%s: %d pairs of live buffers overlap", what, overlaps);
    EXPECT(misaligned == 0, "%s: %d offsets not %d-byte aligned", what, misaligned, GT_PLAN_ALIGN);
    EXPECT(outside == 0, "%s: %d buffers past their arena", what, outside);
    EXPECT(bad_share == 0, "%s: %d illegal shared buffers", what, bad_share);
    free(lo);
    free(hi);
}

static gt_plan *plan_of(const gt_graph *g, const gt_sym_binding *b, const gt_plan_options *o)
{
    gt_error err = {0};
    gt_node_id *order = NULL;
    int32_t n = 0;
    gt_plan *p = NULL;
    EXPECT_OK(gt_schedule_build(g, &order, &n, &err), &err);
    EXPECT_OK(gt_plan_memory(g, b, order, n, o, &p, &err), &err);
    free(order);
    return p;
}

/* Runs g by eager and by program with the given inputs; expects identical output bits. */
static void check_program(const gt_graph *g, const gt_sym_binding *b, const gt_tensor *in,
                          const char *what)
{
    gt_error err = {0};
    gt_program *prog = NULL;
    int32_t no = g->n_outputs;
    gt_tensor *oe = calloc((size_t)no, sizeof *oe), *op = calloc((size_t)no, sizeof *op);
    EXPECT_OK(gt_program_build(g, b, &prog, &err), &err);
    if (prog) {
        for (int a = 0; a < GT_ARENA_COUNT; a++)
            EXPECT(gt_program_allocated_bytes(prog, a) == gt_program_planned_bytes(prog, a),
                   "%s: arena %d allocated %zu planned %zu", what, a,
                   gt_program_allocated_bytes(prog, a), gt_program_planned_bytes(prog, a));
        EXPECT_OK(gt_eager_run(g, b, in, oe, &err), &err);
        for (int rep = 0; rep < 2; rep++) { /* twice: the reused arena gives the same bits */
            EXPECT_OK(gt_program_run(prog, in, op, &err), &err);
            for (int32_t k = 0; k < no; k++) {
                size_t nb = gt_tensor_nbytes(&oe[k]);
                EXPECT(nb == gt_tensor_nbytes(&op[k]) &&
                           (nb == 0 || !memcmp(oe[k].data, op[k].data, nb)),
                       "%s run %d: output %d differs from eager", what, rep, k);
                gt_tensor_free(&op[k]);
            }
        }
        for (int32_t k = 0; k < no; k++)
            gt_tensor_free(&oe[k]);
    }
    gt_program_free(prog);
    free(oe);
    free(op);
}

static void fill(gt_tensor *t, float base)
{
    for (int64_t i = 0; i < gt_tensor_numel(t); i++)
        gt_tensor_set_f32(t, i, base + 0.01f * (float)(i % 37) - 0.1f * (float)(i % 5));
}

/* check_program with the graph's one input an f32 tensor of this shape, filled from base. */
static void check_program_on(const gt_graph *g, const gt_sym_binding *b, int ndim,
                             const int64_t *shape, float base, const char *what)
{
    gt_tensor in;
    gt_error err = {0};
    EXPECT_OK(gt_tensor_alloc(&in, GT_F32, ndim, shape, &err), &err);
    fill(&in, base);
    check_program(g, b, &in, what);
    gt_tensor_free(&in);
}

/* x[n] -> a = exp(x) -> b = neg(a) -> c = sqrt... a chain of unary ops; output the last. */
static void test_chain(void)
{
    gt_graph *g = gt_graph_new();
    gt_expr d[1] = {gt_sym_var(g->sym, "n")};
    gt_value_id x = gt_graph_add_input(g, GT_IN_INPUT, "x", GT_F32, 1, d);
    gt_graph_set_fqn(g, "chain");
    gt_value_id v = x;
    for (int k = 0; k < 6; k++)
        v = gt_unary(g, k % 2 ? GT_OP_NEG : GT_OP_SIGMOID, v);
    gt_graph_add_output(g, GT_OUT_METRIC, "y", v);
    gt_sym_binding_entry e;
    gt_sym_binding b = bind_n(&e, 1000); /* 4000 bytes: 4032 aligned */
    gt_plan *p = plan_of(g, &b, NULL);
    if (p) {
        check_plan(p, "chain");
        size_t one = (4000 + GT_PLAN_ALIGN - 1) / GT_PLAN_ALIGN * GT_PLAN_ALIGN;
        EXPECT(p->arena_bytes[GT_ARENA_STEP] == 2 * one,
               "chain of 6 unary ops: step arena %zu, expected two buffers of %zu",
               p->arena_bytes[GT_ARENA_STEP], one);
        EXPECT(p->arena_bytes[GT_ARENA_PERSISTENT] == 0, "no persistent values");
        EXPECT(p->values[x].first == -1 && p->values[x].last == 0, "input x live [%d, %d]",
               p->values[x].first, p->values[x].last);
        EXPECT(p->values[v].last == p->n_order, "output live to the end");
    }
    gt_plan_free(p);
    check_program_on(g, &b, 1, (int64_t[]){1000}, 0.5f, "chain");
    gt_graph_free(g);
}

/* A diamond with reshapes (views) and odd sizes: x[n, 3] -> r = reshape(x, [3n]) ->
 * s = sigmoid(r), t = exp(r), u = add(s, t) -> w = reshape(u, [n, 3]); outputs w and s. */
static void test_views_and_alignment(void)
{
    gt_graph *g = gt_graph_new();
    gt_expr n = gt_sym_var(g->sym, "n");
    gt_expr d2[2] = {n, gt_sym_const(g->sym, 3)};
    gt_expr d1[1] = {gt_sym_mul(g->sym, n, gt_sym_const(g->sym, 3))};
    gt_value_id x = gt_graph_add_input(g, GT_IN_INPUT, "x", GT_F32, 2, d2);
    gt_value_id r = gt_reshape(g, x, 1, d1);
    gt_value_id s = gt_unary(g, GT_OP_SIGMOID, r);
    gt_value_id t = gt_unary(g, GT_OP_EXP, r);
    gt_value_id u = gt_add(g, s, t);
    gt_value_id w = gt_reshape(g, u, 2, d2);
    gt_value_id z = gt_mul(g, w, w);
    gt_graph_add_output(g, GT_OUT_METRIC, "w", w);
    gt_graph_add_output(g, GT_OUT_METRIC, "s", s);
    gt_graph_add_output(g, GT_OUT_METRIC, "z", z);
    gt_sym_binding_entry e;
    gt_sym_binding b = bind_n(&e, 7); /* 84-byte tensors: alignment matters */
    gt_plan *p = plan_of(g, &b, NULL);
    if (p) {
        check_plan(p, "views");
        EXPECT(p->values[r].root == x && p->values[w].root == u && p->n_views == 2,
               "reshapes share their input's buffer (%d views)", p->n_views);
        EXPECT(p->values[x].last >= p->values[t].first, "x lives while its view r is read");
    }
    gt_plan_free(p);
    gt_plan_options nv = {.no_views = true};
    p = plan_of(g, &b, &nv);
    if (p) {
        check_plan(p, "no views");
        EXPECT(p->values[r].root == r && p->n_views == 0, "views disabled");
    }
    gt_plan_free(p);
    check_program_on(g, &b, 2, (int64_t[]){7, 3}, -0.3f, "views");
    gt_graph_free(g);
}

/* Slices as views: x[4, 48] f32 -> r = reshape(x, [192]); slices of r at elements [0, 64),
 * [64, 80) and [80, 192) are runs at byte offsets 0, 256 and 320 (multiples of 64: views), [70,
 * 90) starts at byte 280 (a copy), and x[:, 16:32] is not one run (a copy). Every slice is read
 * after x's last other reader, so the views must keep x's buffer alive. */
static void test_slice_views(void)
{
    gt_graph *g = gt_graph_new();
    gt_sym_pool *sp = g->sym;
    gt_expr d2[2] = {gt_sym_const(sp, 4), gt_sym_const(sp, 48)};
    gt_expr d1[1] = {gt_sym_const(sp, 192)};
    gt_value_id x = gt_graph_add_input(g, GT_IN_INPUT, "x", GT_F32, 2, d2);
    gt_value_id r = gt_reshape(g, x, 1, d1);
    const int64_t runs[4][2] = {{0, 64}, {64, 80}, {80, 192}, {70, 90}};
    gt_value_id sl[4], out[5];
    for (int k = 0; k < 4; k++) {
        sl[k] = gt_slice(g, r, 0, gt_sym_const(sp, runs[k][0]), gt_sym_const(sp, runs[k][1]));
        out[k] = gt_unary(g, GT_OP_EXP, sl[k]);
    }
    gt_value_id cols = gt_slice(g, x, 1, gt_sym_const(sp, 16), gt_sym_const(sp, 32));
    out[4] = gt_unary(g, GT_OP_SIGMOID, cols);
    for (int k = 0; k < 5; k++)
        gt_graph_add_output(g, GT_OUT_METRIC, k == 4 ? "cols" : "run", out[k]);
    gt_sym_binding b = {NULL, 0};
    gt_plan *p = plan_of(g, &b, NULL);
    if (p) {
        check_plan(p, "slice views");
        const gt_value_plan *v = p->values;
        for (int k = 0; k < 3; k++)
            EXPECT(v[sl[k]].root == x && v[sl[k]].offset == v[x].offset + (size_t)runs[k][0] * 4,
                   "run %d: a view of x at byte %lld (root %%%d, offset %zu vs x %zu)", k,
                   (long long)runs[k][0] * 4, v[sl[k]].root, v[sl[k]].offset, v[x].offset);
        EXPECT(v[sl[3]].root == sl[3], "a run at a misaligned byte offset is copied");
        EXPECT(v[cols].root == cols, "columns of a [4, 48] tensor are copied");
        EXPECT(p->n_views == 4, "4 views (the reshape and three slices), got %d", p->n_views);
        for (int k = 0; k < 3; k++)
            EXPECT(v[x].last >= v[out[k]].first, "x lives while its slice view %d is read", k);
    }
    gt_plan_free(p);
    gt_plan_options nv = {.no_views = true};
    p = plan_of(g, &b, &nv);
    if (p) {
        check_plan(p, "no slice views");
        EXPECT(p->n_views == 0 && p->values[sl[0]].root == sl[0], "views disabled for slices");
    }
    gt_plan_free(p);
    check_program_on(g, &b, 2, (int64_t[]){4, 48}, 0.25f, "slice views");
    gt_graph_free(g);
}

/* Concat inputs computed in place inside the output. x[4, 48] f32 (a graph input), rx =
 * reshape(x, [192]); c1 = concat(ra, rs, rx, q, w) along dim 0 with
 *   ra = reshape(exp(x), [192])   768 bytes at 0: read only by c1, in place;
 *   rs = reshape(sigmoid(x))      at 768: sigmoid(x) is also a graph output (read later), copied;
 *   rx                            at 1536: a graph input, copied;
 *   q = exp(rx[0:5])              20 bytes at 2304: in place;
 *   w = sigmoid(rx)               at 2324, not a multiple of 64: copied;
 * c2 = concat(z, c1) with z = exp(rx): z in place at 0, and c1's whole buffer, with ra and q in
 * it, at 768. And d = concat(exp(x), sigmoid(x)) along dim 1 of [4, 48]: its inputs are not runs
 * of d (4 rows), so copied. */
static void test_concat_in_place(void)
{
    gt_graph *g = gt_graph_new();
    gt_sym_pool *sp = g->sym;
    gt_expr d2[2] = {gt_sym_const(sp, 4), gt_sym_const(sp, 48)};
    gt_expr d1[1] = {gt_sym_const(sp, 192)};
    gt_value_id x = gt_graph_add_input(g, GT_IN_INPUT, "x", GT_F32, 2, d2);
    gt_value_id rx = gt_reshape(g, x, 1, d1);
    gt_value_id ex = gt_unary(g, GT_OP_EXP, x), ra = gt_reshape(g, ex, 1, d1);
    gt_value_id sx = gt_unary(g, GT_OP_SIGMOID, x), rs = gt_reshape(g, sx, 1, d1);
    gt_value_id q =
        gt_unary(g, GT_OP_EXP, gt_slice(g, rx, 0, gt_sym_const(sp, 0), gt_sym_const(sp, 5)));
    gt_value_id w = gt_unary(g, GT_OP_SIGMOID, rx);
    gt_value_id c1 = gt_concat(g, 5, (gt_value_id[]){ra, rs, rx, q, w}, 0);
    gt_value_id z = gt_unary(g, GT_OP_EXP, rx);
    gt_value_id c2 = gt_concat(g, 2, (gt_value_id[]){z, c1}, 0);
    gt_value_id e2 = gt_unary(g, GT_OP_EXP, x), s2 = gt_unary(g, GT_OP_SIGMOID, x);
    gt_value_id d = gt_concat(g, 2, (gt_value_id[]){e2, s2}, 1);
    gt_graph_add_output(g, GT_OUT_METRIC, "c2", c2);
    gt_graph_add_output(g, GT_OUT_METRIC, "sigmoid", sx);
    gt_graph_add_output(g, GT_OUT_METRIC, "d", d);
    gt_sym_binding b = {NULL, 0};
    gt_plan *p = plan_of(g, &b, NULL);
    if (p) {
        check_plan(p, "concat in place");
        const gt_value_plan *v = p->values;
        size_t base = v[c2].offset;
        struct {
            gt_value_id id;
            size_t at;
            const char *name;
        } in_place[] = {{z, 0, "z"},
                        {c1, 768, "c1"},
                        {ex, 768, "exp(x)"},
                        {ra, 768, "ra"},
                        {q, 768 + 2304, "q"}};
        for (size_t k = 0; k < sizeof in_place / sizeof in_place[0]; k++)
            EXPECT(v[in_place[k].id].root == c2 &&
                       v[in_place[k].id].offset == base + in_place[k].at,
                   "%s: inside c2 at byte %zu (root %%%d, at %zu)", in_place[k].name,
                   in_place[k].at, v[in_place[k].id].root, v[in_place[k].id].offset - base);
        EXPECT(v[sx].root == sx && v[rs].root == sx, "an input read after the concat is copied");
        EXPECT(v[x].root == x && v[rx].root == x, "a graph input is copied");
        EXPECT(v[w].root == w, "an input at a misaligned offset is copied");
        EXPECT(v[e2].root == e2 && v[s2].root == s2, "inputs that are not runs of d are copied");
        EXPECT(p->n_concat_in_place == 4, "4 inputs moved (ra, q, z, c1), got %d",
               p->n_concat_in_place);
        EXPECT(v[c2].first <= v[ex].first, "c2's buffer lives from exp(x)'s producer on");
    }
    gt_plan_free(p);
    gt_plan_options nv = {.no_views = true};
    p = plan_of(g, &b, &nv);
    if (p) {
        check_plan(p, "no concat in place");
        EXPECT(p->n_concat_in_place == 0 && p->values[z].root == z, "off with views");
    }
    gt_plan_free(p);
    check_program_on(g, &b, 2, (int64_t[]){4, 48}, 0.125f, "concat in place");
    gt_graph_free(g);
}

/* ---------------------------------------------------------------- random graphs
 *
 * Random graphs of unary ops, adds, reshapes, slices and concats (along dim 0 of vectors, and
 * along either dim of matrices) over one input x[4, 48], with random outputs: sizes and offsets
 * both aligned and not, inputs read again after their concat or not, concats of concats. Every
 * plan passes check_plan's brute-force checks (no overlap of live buffers, every shared buffer a
 * legal one), with and without views, and the program gives the eager executor's bits. */

typedef struct {
    gt_value_id id;
    int ndim;
    int64_t d[2];
} rand_value;

static uint64_t rand_state = 0x9e3779b97f4a7c15ull;

static uint32_t rand_below(uint32_t n)
{
    rand_state ^= rand_state << 13;
    rand_state ^= rand_state >> 7;
    rand_state ^= rand_state << 17;
    return (uint32_t)(rand_state % n);
}

static int64_t rand_numel(const rand_value *v)
{
    return v->ndim == 1 ? v->d[0] : v->d[0] * v->d[1];
}

/* One random node over vals[0..*n), appended to vals; false when the pick does not apply. */
static bool rand_node(gt_graph *g, rand_value *vals, int *n)
{
    gt_sym_pool *sp = g->sym;
    rand_value a = vals[rand_below((uint32_t)*n)], r = a;
    switch (rand_below(6)) {
    case 0: {
        static const gt_op ops[3] = {GT_OP_EXP, GT_OP_SIGMOID, GT_OP_NEG};
        r.id = gt_unary(g, ops[rand_below(3)], a.id);
        break;
    }
    case 1: { /* add a value of the same shape (a itself if no other) */
        rand_value b = vals[rand_below((uint32_t)*n)];
        if (b.ndim != a.ndim || b.d[0] != a.d[0] || (a.ndim == 2 && b.d[1] != a.d[1])) b = a;
        r.id = gt_add(g, a.id, b.id);
        break;
    }
    case 2: { /* a vector becomes [1, n]; a matrix its vector */
        int64_t numel = rand_numel(&a);
        if (a.ndim == 1)
            r.ndim = 2, r.d[0] = 1, r.d[1] = numel;
        else
            r.ndim = 1, r.d[0] = numel;
        gt_expr dims[2] = {gt_sym_const(sp, r.d[0]), gt_sym_const(sp, r.d[1])};
        r.id = gt_reshape(g, a.id, r.ndim, dims);
        break;
    }
    case 3: {
        int dim = (int)rand_below((uint32_t)a.ndim);
        int64_t lo = rand_below((uint32_t)a.d[dim]),
                hi = lo + 1 + rand_below((uint32_t)(a.d[dim] - lo));
        r.d[dim] = hi - lo;
        r.id = gt_slice(g, a.id, dim, gt_sym_const(sp, lo), gt_sym_const(sp, hi));
        break;
    }
    default: { /* concat 2-4 values that fit along a dim */
        int dim = a.ndim == 1 ? 0 : (int)rand_below(2), k = 1, want = 2 + (int)rand_below(3);
        gt_value_id xs[4] = {a.id};
        for (int tries = 0; tries < 16 && k < want; tries++) {
            rand_value b = vals[rand_below((uint32_t)*n)];
            if (b.ndim != a.ndim || (a.ndim == 2 && b.d[1 - dim] != a.d[1 - dim])) continue;
            if (r.d[dim] + b.d[dim] > 4096) break;
            xs[k++] = b.id;
            r.d[dim] += b.d[dim];
        }
        if (k < 2) return false;
        r.id = gt_concat(g, k, xs, dim);
        break;
    }
    }
    if (r.id == GT_NONE || *n >= 48) return false;
    vals[(*n)++] = r;
    return true;
}

static void test_random_graphs(void)
{
    int concat_moves = 0;
    for (int t = 0; t < 200; t++) {
        gt_graph *g = gt_graph_new();
        gt_expr d2[2] = {gt_sym_const(g->sym, 4), gt_sym_const(g->sym, 48)};
        rand_value vals[48] = {
            {gt_graph_add_input(g, GT_IN_INPUT, "x", GT_F32, 2, d2), 2, {4, 48}}};
        int n = 1, steps = 6 + (int)rand_below(24);
        for (int k = 0; k < steps; k++)
            rand_node(g, vals, &n);
        gt_graph_add_output(g, GT_OUT_METRIC, "last", vals[n - 1].id);
        for (int k = 1; k < n - 1; k++)
            if (rand_below(5) == 0) gt_graph_add_output(g, GT_OUT_METRIC, "some", vals[k].id);
        char what[64];
        gt_sym_binding b = {NULL, 0};
        for (int views = 0; views < 2; views++) {
            gt_plan_options o = {.no_views = views == 1};
            gt_plan *p = plan_of(g, &b, &o);
            snprintf(what, sizeof what, "random graph %d%s", t, views ? ", no views" : "");
            if (p) {
                check_plan(p, what);
                concat_moves += p->n_concat_in_place;
                EXPECT(!views || p->n_concat_in_place == 0, "%s: no concat in place", what);
            }
            gt_plan_free(p);
        }
        snprintf(what, sizeof what, "random graph %d", t);
        check_program_on(g, &b, 2, (int64_t[]){4, 48}, 0.01f * (float)t, what);
        gt_graph_free(g);
    }
    EXPECT(concat_moves > 50, "the random graphs move concat inputs in place (%d)", concat_moves);
    printf("random graphs: 200, %d concat inputs computed in place\n", concat_moves);
}

/* One AdamW step on p[n]; when read_p_later, p is also read after the update (so p' cannot take
 * p's buffer, while m' and v' still can). */
static gt_graph *build_adamw(bool read_p_later, gt_value_id *p_out, gt_value_id *pn_out)
{
    gt_graph *g = gt_graph_new();
    gt_expr d[1] = {gt_sym_var(g->sym, "n")};
    gt_expr d3[1] = {gt_sym_const(g->sym, 3)};
    gt_value_id p = gt_graph_add_input(g, GT_IN_PARAM, "w", GT_F32, 1, d);
    gt_value_id gr = gt_graph_add_input(g, GT_IN_INPUT, "grad.w", GT_F32, 1, d);
    gt_value_id m = gt_graph_add_input(g, GT_IN_OPT_STATE, "optim.exp_avg.w", GT_F32, 1, d);
    gt_value_id v = gt_graph_add_input(g, GT_IN_OPT_STATE, "optim.exp_avg_sq.w", GT_F32, 1, d);
    gt_value_id sc = gt_graph_add_input(g, GT_IN_INPUT, "optim.scalars", GT_F32, 1, d3);
    gt_value_id clip = gt_full(g, GT_F32, 0, NULL, 0.5);
    gt_graph_set_fqn(g, "w");
    gt_value_id mo, vo;
    gt_value_id pn = gt_adamw(g, p, gr, m, v, sc, clip, 0.9, 0.95, 1e-8, 0.1, &mo, &vo);
    gt_graph_add_output(g, GT_OUT_PARAM_UPDATE, "w", pn);
    gt_graph_add_output(g, GT_OUT_OPT_STATE_UPDATE, "optim.exp_avg.w", mo);
    gt_graph_add_output(g, GT_OUT_OPT_STATE_UPDATE, "optim.exp_avg_sq.w", vo);
    if (read_p_later) gt_graph_add_output(g, GT_OUT_METRIC, "delta", gt_sub(g, pn, p));
    *p_out = p;
    *pn_out = pn;
    return g;
}

static void test_adamw_in_place(void)
{
    for (int later = 0; later < 2; later++) {
        gt_value_id p, pn;
        gt_graph *g = build_adamw(later, &p, &pn);
        EXPECT(g->err.code == GT_OK, "build adamw: %s", g->err.msg);
        gt_sym_binding_entry e;
        gt_sym_binding b = bind_n(&e, 33);
        gt_plan *pl = plan_of(g, &b, NULL);
        const char *what = later ? "adamw, p read later" : "adamw";
        if (pl) {
            check_plan(pl, what);
            gt_value_id pn_root = pl->values[pn].root;
            size_t buf = (33 * 4 + GT_PLAN_ALIGN - 1) / GT_PLAN_ALIGN * GT_PLAN_ALIGN;
            if (!later) {
                EXPECT(pn_root == p && pl->n_in_place == 3, "p', m', v' in place (%d)",
                       pl->n_in_place);
                EXPECT(pl->arena_bytes[GT_ARENA_PERSISTENT] == 3 * buf,
                       "persistent arena %zu, expected p, m, v once (%zu)",
                       pl->arena_bytes[GT_ARENA_PERSISTENT], 3 * buf);
            } else {
                EXPECT(pn_root == pn && pl->n_in_place == 2, "p' refused, m', v' in place (%d)",
                       pl->n_in_place);
                EXPECT(pl->arena_bytes[GT_ARENA_PERSISTENT] == 4 * buf,
                       "persistent arena %zu, expected %zu", pl->arena_bytes[GT_ARENA_PERSISTENT],
                       4 * buf);
            }
            EXPECT(pl->values[p].arena == GT_ARENA_PERSISTENT &&
                       pl->values[pn].arena == GT_ARENA_PERSISTENT,
                   "params in the persistent arena");
        }
        gt_plan_free(pl);
        gt_plan_options off = {.no_in_place = true};
        pl = plan_of(g, &b, &off);
        if (pl) {
            check_plan(pl, "adamw, in place off");
            EXPECT(pl->n_in_place == 0, "in place disabled");
        }
        gt_plan_free(pl);

        gt_error err = {0};
        gt_tensor in[5];
        for (int k = 0; k < 4; k++) {
            EXPECT_OK(gt_tensor_alloc(&in[k], GT_F32, 1, (int64_t[]){33}, &err), &err);
            fill(&in[k], k == 3 ? 0.2f : 0.1f * (float)(k + 1));
        }
        EXPECT_OK(gt_tensor_alloc(&in[4], GT_F32, 1, (int64_t[]){3}, &err), &err);
        float sc[3] = {1e-2f, 0.1f, 0.05f};
        memcpy(in[4].data, sc, sizeof sc);
        check_program(g, &b, in, what);
        for (int k = 0; k < 5; k++)
            gt_tensor_free(&in[k]);
        gt_graph_free(g);
    }
}

static void test_report(void)
{
    gt_value_id p, pn;
    gt_graph *g = build_adamw(false, &p, &pn);
    gt_sym_binding_entry e;
    gt_sym_binding b = bind_n(&e, 1000);
    gt_plan *pl = plan_of(g, &b, NULL);
    if (pl) {
        char *buf = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);
        gt_plan_print(pl, f);
        fclose(f);
        EXPECT(strstr(buf, "persistent arena") && strstr(buf, "step       arena"),
               "report gives both arenas:\n%s", buf);
        EXPECT(strstr(buf, "optimizer state") && strstr(buf, "params") &&
                   strstr(buf, "activations") && strstr(buf, "temporaries"),
               "report gives the categories:\n%s", buf);
        /* the largest live values are the 4000-byte tensors; p's is reported by its fqn "w" */
        char *top = strstr(buf, "ten largest");
        EXPECT(top && strstr(top, "4000 bytes") && strstr(top, " w\n"),
               "report lists the largest values with their fqn:\n%s", buf);
        free(buf);
    }
    gt_plan_free(pl);
    gt_graph_free(g);
}

static void test_errors(void)
{
    gt_value_id p, pn;
    gt_graph *g = build_adamw(false, &p, &pn);
    gt_error err = {0};
    gt_program *prog = NULL;
    gt_sym_binding none = {NULL, 0};
    EXPECT(gt_program_build(g, &none, &prog, &err) != GT_OK && strstr(err.msg, "n") && !prog,
           "unbound symbol: %s", err.msg);
    gt_error_clear(&err);

    /* a schedule that reads a value before it is defined */
    gt_node_id bad[2] = {1, 0};
    EXPECT(gt_schedule_check(g, bad, 2, &err) == GT_ERR_INVALID && strstr(err.msg, "before"),
           "bad schedule: %s", err.msg);
    gt_error_clear(&err);
    gt_node_id dup[2] = {0, 0};
    EXPECT(gt_schedule_check(g, dup, 2, &err) == GT_ERR_INVALID, "duplicate: %s", err.msg);
    gt_error_clear(&err);

    gt_sym_binding_entry e;
    gt_sym_binding b = bind_n(&e, 5);
    EXPECT_OK(gt_program_build(g, &b, &prog, &err), &err);
    if (prog) {
        gt_tensor in[5], out[3];
        for (int k = 0; k < 5; k++)
            EXPECT_OK(gt_tensor_alloc(&in[k], GT_F32, 1, (int64_t[]){k == 4 ? 3 : 5}, &err), &err);
        gt_tensor_free(&in[1]);
        EXPECT_OK(gt_tensor_alloc(&in[1], GT_F32, 1, (int64_t[]){6}, &err), &err);
        EXPECT(gt_program_run(prog, in, out, &err) == GT_ERR_INVALID && strstr(err.msg, "grad.w") &&
                   strstr(err.msg, "f32[5]"),
               "wrong input shape: %s", err.msg);
        gt_error_clear(&err);
        gt_tensor_free(&in[1]);
        EXPECT_OK(gt_tensor_alloc(&in[1], GT_F32, 1, (int64_t[]){5}, &err), &err);
        /* scalars all zero: bias corrections 0 are refused by the kernel, named by node */
        EXPECT(gt_program_run(prog, in, out, &err) == GT_ERR_INVALID && strstr(err.msg, "adamw") &&
                   strstr(err.msg, "at w"),
               "kernel error names the node: %s", err.msg);
        for (int k = 0; k < 5; k++)
            gt_tensor_free(&in[k]);
    }
    gt_program_free(prog);
    gt_graph_free(g);
}

int main(void)
{
    gt_cpu_set_threads(1);
    test_chain();
    test_views_and_alignment();
    test_slice_views();
    test_concat_in_place();
    test_random_graphs();
    test_adamw_in_place();
    test_report();
    test_errors();
    return gt_test_finish();
}
