/* test_bucketing_mpi.c — the FSDP passes on real ranks (mpirun -np 2 and -np 4).
 *
 * test_tiny's whole step (forward, loss, backward, clipping, AdamW; bf16 compute, so casts feed
 * the gathers) is built for the world's mesh — FSDP over every rank, and with 4 ranks also HSDP
 * (dp_replicate 2 x dp_shard 2) — parallelized, and compiled twice through the trainer's path:
 * with the default pipeline (fsdp_bucketing and fsdp_reorder on) and with
 * --compile.disable_passes fsdp_bucketing,fsdp_reorder; the default pipeline once with
 * --compile.fsdp_gathers bucketed and once with grouped (per-tensor gathers, bucketed gradient
 * reduce-scatters). Both programs of a pair run 3 AdamW steps over MPI
 * from the same state, the updated parameters and moments fed back each step. Reference: the
 * passes are exact, so every output of every step (loss, gradients, updated state) must be
 * bitwise the same on every rank, and the final state too. Also: the bucketed program has fewer
 * collectives, and every rank agrees on its collective schedule (gt_comm_check_schedule). */
#include <stdlib.h>
#include <string.h>

#include "comm_test.h"
#include "graphtrain/gt_comm.h"
#include "graphtrain/gt_config.h"
#include "graphtrain/gt_llama3.h"
#include "graphtrain/gt_program.h"
#include "graphtrain/gt_train.h"
#include "gt_test.h"

#define STEPS 3
#define VOCAB 256

typedef struct {
    gt_config cfg;
    gt_train_layout layout;
    gt_graph *g;
    gt_sym_binding_entry entries[GT_TRAIN_BINDING_MAX];
    gt_sym_binding binding;
    gt_program *prog;
} compiled;

/* fsdp_gathers NULL: without the FSDP passes; else with them, compile.fsdp_gathers as given. */
static gt_status compile(compiled *c, gt_comm *world, int replicate, int tp,
                         const char *fsdp_gathers, gt_error *err)
{
    memset(c, 0, sizeof *c);
    char rep[16], tps[16];
    snprintf(rep, sizeof rep, "%d", replicate);
    snprintf(tps, sizeof tps, "%d", tp);
    char *extra[] = {"--parallelism.data_parallel_replicate_degree",
                     rep,
                     "--parallelism.data_parallel_shard_degree",
                     "-1",
                     "--parallelism.tensor_parallel_degree",
                     tps,
                     "--compile.disable_passes",
                     fsdp_gathers ? "" : "fsdp_bucketing,fsdp_reorder",
                     "--compile.fsdp_gathers",
                     (char *)(fsdp_gathers ? fsdp_gathers : "bucketed")};
    GT_TRY(comm_test_tiny_config(&c->cfg, extra, (int)(sizeof extra / sizeof extra[0]), err));
    GT_TRY(gt_train_layout_init(&c->cfg, world->size, world->rank, &c->layout, err));
    c->g = gt_graph_new();
    gt_model model = {0};
    gt_status st = gt_train_build_graph_layout(&c->cfg, &c->layout, c->g, &model, 1, err);
    gt_model_free(&model);
    if (st != GT_OK) return st;
    gt_train_binding(&c->cfg, &c->layout, c->entries, &c->binding);
    return gt_program_build(c->g, &c->binding, &c->prog, err);
}

static void release(compiled *c)
{
    if (c->prog) gt_program_free(c->prog);
    if (c->g) gt_graph_free(c->g);
    gt_config_free(&c->cfg);
}

/* Communicator k: the ranks that differ from this one only on mesh dim k (NULL for size 1). */
static gt_status make_comms(gt_comm *world, const gt_train_layout *l, gt_comm **comms,
                            gt_error *err)
{
    for (int d = 0; d < GT_MESH_MAX_DIMS; d++)
        comms[d] = NULL;
    for (int d = 0; d < GT_MESH_NDIMS; d++) {
        if (l->mesh.size[d] == 1) continue;
        int others[GT_MESH_NDIMS];
        memcpy(others, l->coords, sizeof others);
        others[d] = 0;
        GT_TRY(gt_comm_split(world, gt_mesh_rank(&l->mesh, others), l->coords[d], &comms[d], err));
    }
    return GT_OK;
}

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33, x *= 0xff51afd7ed558ccdull, x ^= x >> 33, x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

/* The starting state of this rank: a value that is replicated on every mesh dim is the same on
 * every rank; anything sharded gets this rank's own numbers (it is this rank's block of some
 * global tensor). Moments start at zero, as AdamW's do. */
static gt_status init_state(const compiled *c, int rank, gt_tensor *in, gt_error *err)
{
    const gt_graph *g = c->g;
    for (int32_t k = 0; k < g->n_inputs; k++) {
        gt_value_id v = g->inputs[k].value;
        const gt_type *t = gt_value_type(g, v);
        int64_t shape[GT_MAX_DIMS];
        GT_TRY(gt_graph_eval_shape(g, v, &c->binding, shape, err));
        GT_TRY(gt_tensor_alloc(&in[k], t->dtype, t->ndim, shape, err));
        bool sharded = false;
        for (int d = 0; d < g->mesh.ndim; d++)
            sharded |= g->values[v].place[d].kind != GT_PLACE_REPLICATE;
        const char *name = gt_graph_str(g, g->inputs[k].fqn);
        bool moment = g->inputs[k].kind == GT_IN_OPT_STATE;
        for (int64_t i = 0; i < gt_tensor_numel(&in[k]); i++) {
            uint64_t h =
                mix(((uint64_t)k << 40) ^ ((uint64_t)(sharded ? rank + 1 : 0) << 32) ^ (uint64_t)i);
            if (t->dtype == GT_I64 || t->dtype == GT_I32) continue; /* per step, below */
            (void)name;
            gt_tensor_set_f32(
                &in[k], i,
                moment ? 0.0f : (float)((double)(h >> 11) / 9007199254740992.0 - 0.5) * 0.2f);
        }
    }
    return GT_OK;
}

/* Per-step inputs: tokens and labels (this rank's rows), AdamW's scalars for step t (1-based). */
static void step_inputs(const compiled *c, int rank, int t, gt_tensor *in)
{
    const gt_graph *g = c->g;
    for (int32_t k = 0; k < g->n_inputs; k++) {
        const gt_type *ty = gt_value_type(g, g->inputs[k].value);
        const char *name = gt_graph_str(g, g->inputs[k].fqn);
        for (int64_t i = 0; i < gt_tensor_numel(&in[k]); i++) {
            uint64_t h = mix(((uint64_t)t << 48) ^ ((uint64_t)rank << 40) ^ ((uint64_t)k << 32) ^
                             (uint64_t)i);
            if (strcmp(name, "positions") == 0) /* packed documents of 5 tokens */
                ((int64_t *)in[k].data)[i] = i % in[k].shape[1] % 5;
            else if (ty->dtype == GT_I64)
                ((int64_t *)in[k].data)[i] = (int64_t)(h % VOCAB);
            else if (ty->dtype == GT_I32)
                ((int32_t *)in[k].data)[i] = (int32_t)(h % VOCAB);
        }
        if (strcmp(name, "optim.scalars") == 0) {
            double b1 = 1.0, b2 = 1.0;
            for (int s = 0; s < t; s++)
                b1 *= 0.9, b2 *= 0.95;
            gt_tensor_set_f32(&in[k], 0, 1e-3f);
            gt_tensor_set_f32(&in[k], 1, (float)(1.0 - b1));
            gt_tensor_set_f32(&in[k], 2, (float)(1.0 - b2));
        }
    }
}

/* Moves every state update (PARAM_UPDATE, OPT_STATE_UPDATE) into its input for the next step. */
static void carry_state(const gt_graph *g, gt_tensor *in, gt_tensor *out)
{
    for (int32_t o = 0; o < g->n_outputs; o++) {
        int kind = g->outputs[o].kind;
        int in_kind = kind == GT_OUT_PARAM_UPDATE       ? GT_IN_PARAM
                      : kind == GT_OUT_OPT_STATE_UPDATE ? GT_IN_OPT_STATE
                                                        : -1;
        if (in_kind < 0) continue;
        for (int32_t k = 0; k < g->n_inputs; k++)
            if (g->inputs[k].kind == in_kind && g->inputs[k].fqn == g->outputs[o].fqn) {
                EXPECT(gt_tensor_nbytes(&in[k]) == gt_tensor_nbytes(&out[o]), "state size %s",
                       gt_graph_str(g, g->inputs[k].fqn));
                memcpy(in[k].data, out[o].data, gt_tensor_nbytes(&in[k]));
            }
    }
}

static int32_t count_collectives(const gt_program *p)
{
    return gt_program_collectives(p, false, NULL, 0);
}

static int32_t count_gathers(const gt_program *p)
{
    int32_t n = count_collectives(p), gathers = 0;
    gt_comm_sched_entry *e = calloc((size_t)n + 1, sizeof *e);
    gt_program_collectives(p, false, e, n);
    for (int32_t k = 0; k < n; k++)
        gathers += e[k].kind == GT_COLL_ALL_GATHER;
    free(e);
    return gathers;
}

/* *gathers: the all-gathers of the program with the FSDP passes. */
static void test_layout(gt_comm *world, int replicate, int tp, const char *fsdp_gathers,
                        int32_t *gathers)
{
    *gathers = -1;
    gt_error err = {0};
    compiled plain, bucketed;
    EXPECT_OK(compile(&plain, world, replicate, tp, NULL, &err), &err);
    EXPECT_OK(compile(&bucketed, world, replicate, tp, fsdp_gathers, &err), &err);
    if (!plain.prog || !bucketed.prog) {
        release(&plain);
        release(&bucketed);
        return;
    }
    const gt_graph *ga = plain.g, *gb = bucketed.g;
    EXPECT(ga->n_inputs == gb->n_inputs && ga->n_outputs == gb->n_outputs, "interfaces differ");
    int32_t na = count_collectives(plain.prog), nb = count_collectives(bucketed.prog);
    EXPECT(nb < na, "replicate %d tp %d, gathers %s: bucketing left %d of %d collectives",
           replicate, tp, fsdp_gathers, nb, na);
    *gathers = count_gathers(bucketed.prog);

    /* every rank agrees on the bucketed schedule */
    gt_comm_sched_entry *sched = calloc((size_t)nb + 1, sizeof *sched);
    gt_program_collectives(bucketed.prog, false, sched, nb);
    EXPECT_OK(gt_comm_check_schedule(world, sched, nb, &err), &err);
    free(sched);

    gt_comm *comms[GT_MESH_MAX_DIMS];
    EXPECT_OK(make_comms(world, &plain.layout, comms, &err), &err);
    EXPECT_OK(gt_program_set_comms(plain.prog, comms, &err), &err);
    EXPECT_OK(gt_program_set_comms(bucketed.prog, comms, &err), &err);

    int32_t ni = ga->n_inputs, no = ga->n_outputs;
    gt_tensor *in_a = calloc((size_t)ni, sizeof *in_a), *in_b = calloc((size_t)ni, sizeof *in_b);
    gt_tensor *out_a = calloc((size_t)no, sizeof *out_a),
              *out_b = calloc((size_t)no, sizeof *out_b);
    EXPECT_OK(init_state(&plain, world->rank, in_a, &err), &err);
    EXPECT_OK(init_state(&bucketed, world->rank, in_b, &err), &err);
    for (int t = 1; t <= STEPS; t++) {
        step_inputs(&plain, world->rank, t, in_a);
        step_inputs(&bucketed, world->rank, t, in_b);
        EXPECT_OK(gt_program_run(plain.prog, in_a, out_a, &err), &err);
        EXPECT_OK(gt_program_run(bucketed.prog, in_b, out_b, &err), &err);
        int bad = 0;
        for (int32_t o = 0; o < no; o++) {
            size_t n = gt_tensor_nbytes(&out_a[o]);
            bool same = n > 0 && n == gt_tensor_nbytes(&out_b[o]) &&
                        memcmp(out_a[o].data, out_b[o].data, n) == 0;
            if (!same && bad++ < 3)
                fprintf(stderr, "rank %d step %d: output %s %s differs\n", world->rank, t,
                        gt_output_kind_name((gt_output_kind)ga->outputs[o].kind),
                        gt_graph_str(ga, ga->outputs[o].fqn));
        }
        EXPECT(bad == 0, "rank %d replicate %d gathers %s step %d: %d outputs differ", world->rank,
               replicate, fsdp_gathers, t, bad);
        if (t == 1)
            for (int32_t o = 0; o < no; o++)
                if (ga->outputs[o].kind == GT_OUT_LOSS) {
                    float loss = ((float *)out_a[o].data)[0];
                    EXPECT(loss > 1.0f && loss < 20.0f, "step 1 loss %g", loss);
                }
        carry_state(ga, in_a, out_a);
        carry_state(gb, in_b, out_b);
        for (int32_t o = 0; o < no; o++) {
            gt_tensor_free(&out_a[o]);
            gt_tensor_free(&out_b[o]);
        }
    }
    int bad = 0;
    for (int32_t k = 0; k < ni; k++)
        bad += memcmp(in_a[k].data, in_b[k].data, gt_tensor_nbytes(&in_a[k])) != 0;
    EXPECT(bad == 0, "rank %d replicate %d: %d state tensors differ after %d steps", world->rank,
           replicate, bad, STEPS);
    for (int32_t k = 0; k < ni; k++) {
        gt_tensor_free(&in_a[k]);
        gt_tensor_free(&in_b[k]);
    }
    free(in_a);
    free(in_b);
    free(out_a);
    free(out_b);
    for (int d = 0; d < GT_MESH_MAX_DIMS; d++)
        if (comms[d]) gt_comm_destroy(comms[d]);
    release(&plain);
    release(&bucketed);
}

/* A layout with bucketed gathers and with grouped ones: grouped keeps one gather per tensor, so
 * more than bucketed's one per block. */
static void both_gathers(gt_comm *world, int replicate, int tp)
{
    int32_t bucketed = -1, grouped = -1;
    test_layout(world, replicate, tp, "bucketed", &bucketed);
    test_layout(world, replicate, tp, "grouped", &grouped);
    EXPECT(bucketed > 0 && grouped > bucketed,
           "replicate %d tp %d: %d all-gathers grouped against %d bucketed", replicate, tp, grouped,
           bucketed);
}

int main(int argc, char **argv)
{
    gt_comm *world = comm_test_mpi_world(&argc, &argv, 0);
    if (!world) return gt_test_finish();
    both_gathers(world, 1, 1); /* FSDP over every rank */
    if (world->size % 2 == 0 && world->size >= 4) {
        both_gathers(world, 2, 1); /* HSDP: dp_replicate 2 x dp_shard */
        both_gathers(world, 1, 2); /* FSDP x TP 2 */
    }
    return comm_test_mpi_end(world);
}
