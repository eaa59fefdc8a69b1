/* test_pp_mpi.c — pipeline parallelism over MPI processes, run under mpirun with 2 or 4 ranks
 * (gt_pp_eager_step_rank, src/runtime/pp_exec.c; point-to-point transfers of src/comm/mpi.c).
 *
 * The world is the pipeline: pipeline_parallel_degree = ranks. Each rank builds llama3
 * debugmodel's f32 step graph for 4 micro-batches of gradient accumulation (tests/pp_harness.h)
 * and computes the reference step on its own: the trainer's accumulation on one rank. Then, for
 * every schedule (DualPipeV only on 2 ranks: on 4 it needs 8 micro-batches), each rank runs its
 * own actions of 2 steps, sending the activations and gradients that cross ranks and broadcasting
 * the gradient-norm terms, feeding its updated parameters and moments back. Every output a rank
 * owns — the updates of its stages' parameters and moments, the grad norm every rank computes,
 * each micro-batch's loss on the rank of the last stage — is memcmp-equal to the reference, and
 * the outputs of other ranks' stages stay empty. */
#include "distributed/comm_test.h"
#include "pp_harness.h"

/* The pipeline rank that computes output k (-1: every rank). */
static int owner_of(const gt_graph *g, const gt_pp_split *split, const gt_pp_schedule *s, int k)
{
    gt_node_id p = g->values[g->outputs[k].value].producer;
    if (p == GT_NONE || split->stage[p] == GT_PP_STAGE_GLOBAL) return -1;
    return s->stage_rank[split->stage[p]];
}

static void check_schedule(setup *st, gt_comm *world, gt_pp_schedule_kind kind)
{
    const gt_graph *g = st->g;
    int pp = gt_comm_size(world), me = world->rank;
    gt_error err = {0};
    int32_t S;
    gt_pp_split split;
    gt_pp_schedule sched;
    if (!pp_split_schedule(st, kind, pp, &split, &sched, &S)) return;
    static gt_tensor ref_in[MICRO][PP_MAX_INPUTS], pp_in[MICRO][PP_MAX_INPUTS];
    init_inputs(st, ref_in);
    init_inputs(st, pp_in);
    int diffs = 0, misplaced = 0, owned = 0;
    for (int64_t step = 1; step <= 2 && err.code == GT_OK; step++) {
        gt_tensor rl[MICRO] = {{0}}, pl[MICRO] = {{0}};
        gt_tensor *ro = calloc((size_t)g->n_outputs, sizeof *ro);
        gt_tensor *po = calloc((size_t)g->n_outputs, sizeof *po);
        next_step(g, ref_in, NULL, step);
        next_step(g, pp_in, NULL, step);
        reference_step(st, ref_in, rl, ro);
        const gt_tensor *in_ptrs[MICRO];
        for (int m = 0; m < MICRO; m++)
            in_ptrs[m] = pp_in[m];
        EXPECT_OK(
            gt_pp_eager_step_rank(g, &st->binding, &split, &sched, world, in_ptrs, pl, po, &err),
            &err);
        if (err.code != GT_OK) break;
        bool last_rank = sched.stage_rank[S - 1] == me;
        for (int m = 0; m < MICRO; m++)
            EXPECT(last_rank ? same(&rl[m], &pl[m]) : pl[m].data == NULL,
                   "rank %d %s step %lld micro %d: loss", me, gt_pp_schedule_name(kind),
                   (long long)step, m);
        for (int32_t k = 0; k < g->n_outputs; k++) {
            int owner = owner_of(g, &split, &sched, k);
            bool mine = owner < 0 || owner == me;
            if (!mine) {
                misplaced += po[k].data != NULL;
                continue;
            }
            owned++;
            if (!same(&ro[k], &po[k]) && diffs++ < 3)
                fprintf(stderr, "  rank %d %s step %lld: output %d (%s) differs\n", me,
                        gt_pp_schedule_name(kind), (long long)step, k,
                        gt_graph_str(g, g->outputs[k].fqn));
        }
        if (step == 2 && me == 0)
            printf("%-16s pp %d (%d stages) step 2: loss %.7f, bitwise %s\n",
                   gt_pp_schedule_name(kind), pp, S,
                   gt_tensor_get_f32(&rl[0], 0) + gt_tensor_get_f32(&rl[1], 0) +
                       gt_tensor_get_f32(&rl[2], 0) + gt_tensor_get_f32(&rl[3], 0),
                   diffs ? "NO" : "yes");
        next_step(g, ref_in, ro, step + 1);
        next_step(g, pp_in, po, step + 1);
        free_outputs(rl, MICRO);
        free_outputs(pl, MICRO);
        free_outputs(ro, g->n_outputs);
        free_outputs(po, g->n_outputs);
        free(ro);
        free(po);
    }
    EXPECT(diffs == 0 && misplaced == 0 && owned > 0,
           "rank %d %s: %d outputs differ, %d of other ranks filled, %d owned", me,
           gt_pp_schedule_name(kind), diffs, misplaced, owned);
    for (int m = 0; m < MICRO; m++)
        for (int32_t k = 0; k < g->n_inputs; k++)
            gt_tensor_free(&ref_in[m][k]), gt_tensor_free(&pp_in[m][k]);
    gt_pp_schedule_free(&sched);
    gt_pp_split_free(&split);
}

int main(int argc, char **argv)
{
    gt_comm *world = comm_test_mpi_world(&argc, &argv, 4);
    if (!world) return gt_test_finish();
    setup st;
    if (build(&st) && st.g->n_inputs <= PP_MAX_INPUTS) {
        for (int k = 0; k < GT_PP_N_SCHEDULES; k++) {
            if (k == GT_PP_DUALPIPEV && gt_comm_size(world) > 2) continue;
            check_schedule(&st, world, (gt_pp_schedule_kind)k);
        }
    }
    gt_graph_free(st.g);
    gt_model_free(&st.model);
    gt_config_free(&st.cfg);
    return comm_test_mpi_end(world);
}
