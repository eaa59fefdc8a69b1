/* test_pp_unroll_mpi.c — one pipeline rank's step unrolled into one graph (gt_pp_unroll with a
 * rank: send_start / recv_start nodes over mesh dim "pp"), run under mpirun with 2 or 4 ranks.
 *
 * The setup of test_pp_mpi.c (pp_harness.h: llama3 debugmodel f32, 4 micro-batches, the world is
 * the pipeline). Each rank computes the reference step on its own (the trainer's accumulation on
 * one rank), then for every schedule (DualPipeV only on 2 ranks) unrolls its own step and runs it
 * for 2 steps, feeding its updated parameters and moments back: as the CPU program (gt_program
 * with the world as the pp dim's communicator); ZBVZeroBubble also node by node
 * (gt_eager_run_comms), and 1F1B as the CPU program after the trainer's pass pipeline on the
 * unrolled graph. Every output a rank
 * computes (its stages' updates, the grad norm, each micro-batch's loss on the rank of the last
 * stage) is memcmp-equal to the reference, and the rank's graph has no output of another rank's
 * stages. The graph's mesh gains the pp dim with the world's size. */
#include "distributed/comm_test.h"
#include "graphtrain/gt_program.h"
#include "pp_harness.h"

enum { EAGER = 0, PROGRAM, COMPILED };
static const char *const way_name[] = {"eager", "program", "compiled program"};

static int owner_of(const gt_graph *g, const gt_pp_split *split, const gt_pp_schedule *s, int k)
{
    gt_node_id p = g->values[g->outputs[k].value].producer;
    if (p == GT_NONE || split->stage[p] == GT_PP_STAGE_GLOBAL) return -1;
    return s->stage_rank[split->stage[p]];
}

static void run_rank(setup *st, const gt_pp_unrolled *u, gt_comm *world, int way,
                     gt_tensor inputs[MICRO][PP_MAX_INPUTS], gt_tensor *losses, gt_tensor *outputs,
                     gt_error *err)
{
    const gt_graph *d = u->g;
    gt_comm *comms[GT_MESH_MAX_DIMS] = {NULL};
    comms[d->mesh.ndim - 1] = world;
    gt_tensor *in = pp_unrolled_inputs(u, inputs);
    gt_tensor *out = calloc((size_t)d->n_outputs + 1, sizeof *out);
    if (way == EAGER) {
        EXPECT_OK(gt_eager_run_comms(d, &st->binding, in, comms, out, err), err);
    } else {
        gt_program *p = NULL;
        EXPECT_OK(gt_program_build(d, &st->binding, &p, err), err);
        if (p) EXPECT_OK(gt_program_set_comms(p, comms, err), err);
        if (p && !err->code) EXPECT_OK(gt_program_run(p, in, out, err), err);
        gt_program_free(p);
    }
    if (!err->code) pp_unrolled_outputs(st->g, u, out, losses, outputs);
    free(in);
    free(out);
}

/* The reference, the same for every check: 2 steps of the one-rank accumulation, computed once
 * (under ASan the test ran close to its 120 s bound recomputing it per check). */
static gt_tensor ref_l[2][MICRO], *ref_o[2];

static void reference(setup *st)
{
    static gt_tensor ref_in[MICRO][PP_MAX_INPUTS];
    init_inputs(st, ref_in);
    for (int64_t step = 1; step <= 2; step++) {
        ref_o[step - 1] = calloc((size_t)st->g->n_outputs, sizeof **ref_o);
        next_step(st->g, ref_in, NULL, step);
        reference_step(st, ref_in, ref_l[step - 1], ref_o[step - 1]);
        next_step(st->g, ref_in, ref_o[step - 1], step + 1);
    }
    for (int m = 0; m < MICRO; m++)
        for (int32_t k = 0; k < st->g->n_inputs; k++)
            gt_tensor_free(&ref_in[m][k]);
}

static void check_schedule(setup *st, gt_comm *world, gt_pp_schedule_kind kind, int way)
{
    const gt_graph *g = st->g;
    int pp = gt_comm_size(world), me = world->rank;
    gt_error err = {0};
    int32_t S;
    gt_pp_split split;
    gt_pp_schedule sched;
    if (!pp_split_schedule(st, kind, pp, &split, &sched, &S)) return;
    uint8_t per_micro[PP_MAX_INPUTS] = {0};
    pp_per_micro(g, per_micro);
    gt_pp_unrolled u;
    EXPECT_OK(gt_pp_unroll(g, &split, &sched, me, per_micro, &u, &err), &err);
    if (err.code == GT_OK) {
        const gt_graph_mesh *mesh = &u.g->mesh;
        EXPECT(mesh->ndim == 1 && mesh->size[0] == pp &&
                   !strcmp(gt_graph_str(u.g, mesh->name[0]), "pp"),
               "rank %d: the unrolled graph's mesh has %d dims", me, mesh->ndim);
        for (int32_t j = 0; j < u.g->n_outputs; j++) {
            int owner = owner_of(g, &split, &sched, u.output_of[j]);
            EXPECT(owner < 0 || owner == me, "rank %d has output %s of rank %d", me,
                   gt_graph_str(u.g, u.g->outputs[j].fqn), owner);
        }
    }
    if (err.code == GT_OK && way == COMPILED)
        EXPECT_OK(gt_train_compile_graph(&st->cfg, u.g, NULL, &err), &err);
    static gt_tensor pp_in[MICRO][PP_MAX_INPUTS];
    init_inputs(st, pp_in);
    int diffs = 0, owned = 0;
    for (int64_t step = 1; step <= 2 && err.code == GT_OK; step++) {
        gt_tensor pl[MICRO] = {{0}}, *rl = ref_l[step - 1], *ro = ref_o[step - 1];
        gt_tensor *po = calloc((size_t)g->n_outputs, sizeof *po);
        next_step(g, pp_in, NULL, step);
        run_rank(st, &u, world, way, pp_in, pl, po, &err);
        if (err.code != GT_OK) break;
        bool last_rank = sched.stage_rank[S - 1] == me;
        for (int m = 0; m < MICRO; m++)
            EXPECT(last_rank ? pl[m].data && same(&rl[m], &pl[m]) : pl[m].data == NULL,
                   "rank %d %s %s step %lld micro %d: loss", me, gt_pp_schedule_name(kind),
                   way_name[way], (long long)step, m);
        for (int32_t k = 0; k < g->n_outputs; k++) {
            int owner = owner_of(g, &split, &sched, k);
            if (owner >= 0 && owner != me) continue;
            owned++;
            if (!(po[k].data && same(&ro[k], &po[k])) && diffs++ < 3)
                fprintf(stderr, "  rank %d %s %s step %lld: output %d (%s) differs\n", me,
                        gt_pp_schedule_name(kind), way_name[way], (long long)step, k,
                        gt_graph_str(g, g->outputs[k].fqn));
        }
        if (step == 2 && me == 0)
            printf("%-16s pp %d (%d stages), %s: rank 0 runs %d nodes, bitwise %s\n",
                   gt_pp_schedule_name(kind), pp, S, way_name[way], u.g->n_nodes,
                   diffs ? "NO" : "yes");
        next_step(g, pp_in, po, step + 1);
        free_outputs(pl, MICRO);
        free_outputs(po, g->n_outputs);
        free(po);
    }
    EXPECT(diffs == 0 && owned > 0, "rank %d %s %s: %d outputs differ, %d owned", me,
           gt_pp_schedule_name(kind), way_name[way], diffs, owned);
    for (int m = 0; m < MICRO; m++)
        for (int32_t k = 0; k < g->n_inputs; k++)
            gt_tensor_free(&pp_in[m][k]);
    gt_pp_unrolled_free(&u);
    gt_pp_schedule_free(&sched);
    gt_pp_split_free(&split);
}

int main(int argc, char **argv)
{
    gt_comm *world = comm_test_mpi_world(&argc, &argv, 4);
    if (!world) return gt_test_finish();
    setup st;
    if (build(&st) && st.g->n_inputs <= PP_MAX_INPUTS) {
        reference(&st);
        for (int k = 0; k < GT_PP_N_SCHEDULES; k++) {
            if (k == GT_PP_DUALPIPEV && gt_comm_size(world) > 2) continue;
            check_schedule(&st, world, (gt_pp_schedule_kind)k, PROGRAM);
        }
        check_schedule(&st, world, GT_PP_ZBV_ZERO_BUBBLE, EAGER);
        check_schedule(&st, world, GT_PP_1F1B, COMPILED);
        for (int s = 0; s < 2; s++) {
            free_outputs(ref_l[s], MICRO);
            free_outputs(ref_o[s], st.g->n_outputs);
            free(ref_o[s]);
        }
    }
    gt_graph_free(st.g);
    gt_model_free(&st.model);
    gt_config_free(&st.cfg);
    return comm_test_mpi_end(world);
}
