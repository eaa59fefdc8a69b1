/* test_program_mpi.c — programs and the eager executor with collectives, under mpirun with 2 or
 * 4 ranks.
 *
 * Hand-built SPMD graphs with a device mesh and start/wait collectives between ordinary ops. Every
 * rank's inputs are a pure function of (rank, element, salt), so each rank regenerates every
 * rank's inputs and computes the whole collective computation naively: gathers by index
 * arithmetic, sums as a loop over the group's ranks in rank order (f32 accumulation; one rounding
 * for bf16), which is what the communicator promises. Checked:
 *   - gt_program_run and gt_eager_run_comms equal the reference bit for bit (gathers exactly,
 *     sums as the rank-order sum), and equal each other;
 *   - the rank coordinate enters through an ordinary symbol ("rank.dp_shard") of the binding;
 *   - a 2-D mesh (dp_shard = world / 2, tp = 2) with one sub-communicator per mesh dim (at 2
 *     ranks dp_shard has size 1 and runs with a NULL communicator: the identity);
 *   - gt_program_collectives gives the same list on every rank and gt_comm_check_schedule passes;
 *     after gt_program_drop_collective on the last rank, the check fails on every rank naming
 *     the first differing collective (#1), without hanging. */
#include <string.h>

#include "comm_test.h"
#include "graphtrain/gt_build.h"
#include "graphtrain/gt_comm.h"
#include "graphtrain/gt_exec.h"
#include "graphtrain/gt_program.h"
#include "gt_test.h"

static int count_bad(const gt_tensor *got, const float *ref, int64_t n)
{
    if (!got->data || got->dtype != GT_F32 || gt_tensor_numel(got) != n) return (int)n + 1;
    int bad = 0;
    for (int64_t i = 0; i < n; i++)
        bad += memcmp((const float *)got->data + i, &ref[i], sizeof(float)) != 0;
    return bad;
}

/* ---------------------------------------------------------------- 1-D mesh: dp_shard = world
 *
 * comm_test_build_1d (comm_test.h): per rank r of n, x2 = x + full[r*b ..] (the slice's bounds
 * use the symbol rank.dp_shard), g = all_gather(-x2), s = reduce_scatter(g * p),
 * u = all_reduce(s + x), v = all_reduce(cast(x, bf16)), a = all_to_all(p). */

/* The naive reference of comm_test_build_1d's outputs as seen by rank `me`. */
static void reference_1d(int n, int me, float *g_ref, float *s_ref, float *u_ref, uint16_t *v_ref,
                         float *a_ref)
{
    int64_t blk = COMM_TEST_ROWS * COMM_TEST_COLS, big = (int64_t)n * blk;
    float *gathered = gt_xmalloc((size_t)big * sizeof(float));
    float *s_all = gt_xmalloc((size_t)n * (size_t)blk * sizeof(float)); /* s of every rank */
    for (int q = 0; q < n; q++) /* block q: -(x_q + full[q*b..]) */
        for (int64_t i = 0; i < blk; i++)
            gathered[q * blk + i] =
                -(comm_test_value(q, i, 1) + comm_test_value(0, q * blk + i, 3));
    for (int q = 0; q < n; q++)
        for (int64_t i = 0; i < blk; i++) {
            float acc = 0;
            for (int t = 0; t < n; t++) { /* rank t's h at row block q */
                float h = gathered[q * blk + i] * comm_test_value(t, q * blk + i, 2);
                acc = t == 0 ? h : acc + h;
            }
            s_all[q * blk + i] = acc;
        }
    memcpy(g_ref, gathered, (size_t)big * sizeof(float));
    for (int q = 0; q < n; q++) /* block q: rank q's p at block me */
        for (int64_t i = 0; i < blk; i++)
            a_ref[q * blk + i] = comm_test_value(q, me * blk + i, 2);
    memcpy(s_ref, s_all + me * blk, (size_t)blk * sizeof(float));
    for (int64_t i = 0; i < blk; i++) {
        float acc = 0, accv = 0;
        for (int q = 0; q < n; q++) {
            float t = s_all[q * blk + i] + comm_test_value(q, i, 1);
            float xb = gt_bf16_to_f32(gt_f32_to_bf16(comm_test_value(q, i, 1)));
            acc = q == 0 ? t : acc + t;
            accv = q == 0 ? xb : accv + xb;
        }
        u_ref[i] = acc;
        v_ref[i] = gt_f32_to_bf16(accv);
    }
    free(gathered);
    free(s_all);
}

static void test_1d(gt_comm *world)
{
    int n = gt_comm_size(world), me = gt_comm_rank(world);
    gt_error err = {0};
    gt_graph *g = comm_test_build_1d(n);
    EXPECT(g->err.code == GT_OK, "build: %s", g->err.msg);
    EXPECT_OK(gt_graph_verify(g, &err), &err);
    gt_sym_binding_entry be[2] = {{"b", COMM_TEST_ROWS}, {"rank.dp_shard", me}};
    gt_sym_binding bind = {be, 2};

    int64_t sx[2] = {COMM_TEST_ROWS, COMM_TEST_COLS},
            sp[2] = {(int64_t)n * COMM_TEST_ROWS, COMM_TEST_COLS};
    gt_tensor in[3];
    gt_tensor_alloc(&in[0], GT_F32, 2, sx, &err);
    gt_tensor_alloc(&in[1], GT_F32, 2, sp, &err);
    gt_tensor_alloc(&in[2], GT_F32, 2, sp, &err);
    comm_test_fill(&in[0], me, 1);
    comm_test_fill(&in[1], me, 2);
    comm_test_fill(&in[2], 0, 3); /* replicated: rank 0's values everywhere */

    gt_comm *comms[GT_MESH_MAX_DIMS] = {NULL, world, NULL, NULL};
    gt_program *prog = NULL;
    gt_tensor po[5] = {0}, eo[5] = {0};
    EXPECT_OK(gt_program_build(g, &bind, &prog, &err), &err);
    if (prog) EXPECT_OK(gt_program_set_comms(prog, comms, &err), &err);
    if (prog) EXPECT_OK(gt_program_run(prog, in, po, &err), &err);
    EXPECT_OK(gt_eager_run_comms(g, &bind, in, comms, eo, &err), &err);

    int64_t blk = COMM_TEST_ROWS * COMM_TEST_COLS;
    float *g_ref = gt_xmalloc((size_t)(n * blk) * sizeof(float));
    float *a_ref = gt_xmalloc((size_t)(n * blk) * sizeof(float));
    float s_ref[COMM_TEST_ROWS * COMM_TEST_COLS], u_ref[COMM_TEST_ROWS * COMM_TEST_COLS];
    uint16_t v_ref[COMM_TEST_ROWS * COMM_TEST_COLS];
    reference_1d(n, me, g_ref, s_ref, u_ref, v_ref, a_ref);
    const gt_tensor *outs[2] = {po, eo};
    const char *who[2] = {"program", "eager"};
    for (int k = 0; k < 2; k++) {
        const gt_tensor *o = outs[k];
        EXPECT(count_bad(&o[0], g_ref, n * blk) == 0, "rank %d %s all_gather: %d differ", me,
               who[k], count_bad(&o[0], g_ref, n * blk));
        EXPECT(count_bad(&o[1], s_ref, blk) == 0, "rank %d %s reduce_scatter: %d differ", me,
               who[k], count_bad(&o[1], s_ref, blk));
        EXPECT(count_bad(&o[2], u_ref, blk) == 0, "rank %d %s all_reduce: %d differ", me, who[k],
               count_bad(&o[2], u_ref, blk));
        EXPECT(o[3].data && o[3].dtype == GT_BF16 && memcmp(o[3].data, v_ref, sizeof v_ref) == 0,
               "rank %d %s bf16 all_reduce = rank-order f32 sum rounded once", me, who[k]);
        EXPECT(count_bad(&o[4], a_ref, n * blk) == 0, "rank %d %s all_to_all: %d differ", me,
               who[k], count_bad(&o[4], a_ref, n * blk));
    }
    for (int k = 0; k < 5; k++)
        EXPECT(comm_test_same_bits(&po[k], &eo[k]), "rank %d output %d: program == eager", me, k);

    /* a second run reuses the arenas and slots: same bits */
    gt_tensor again[5] = {0};
    if (prog) EXPECT_OK(gt_program_run(prog, in, again, &err), &err);
    for (int k = 0; k < 5; k++) {
        EXPECT(comm_test_same_bits(&po[k], &again[k]), "rank %d output %d: run == rerun", me, k);
        gt_tensor_free(&again[k]);
        gt_tensor_free(&po[k]);
        gt_tensor_free(&eo[k]);
    }

    /* the schedule: the same on every rank; a dropped collective on the last rank is caught on
     * every rank, at index 1 */
    gt_comm_sched_entry sched[16];
    int32_t count = prog ? gt_program_collectives(prog, false, sched, 16) : 0;
    EXPECT(count == 5, "rank %d: 5 collectives, got %d", me, count);
    uint64_t mine[16 * 3] = {0}, all[16 * 3 * 64];
    for (int32_t k = 0; k < count && k < 16; k++) {
        mine[3 * k] = (uint64_t)sched[k].kind;
        mine[3 * k + 1] = sched[k].group;
        mine[3 * k + 2] = sched[k].bytes;
    }
    int64_t sm[1] = {(int64_t)sizeof mine}, sa[1] = {(int64_t)sizeof mine * n};
    gt_tensor tm, ta;
    gt_tensor_wrap(&tm, GT_BOOL, 1, sm, mine);
    gt_tensor_wrap(&ta, GT_BOOL, 1, sa, all);
    EXPECT_OK(gt_comm_all_gather(world, &tm, &ta, &err), &err);
    for (int q = 1; q < n && n <= 64; q++)
        EXPECT(memcmp(all, (char *)all + q * sizeof mine, sizeof mine) == 0,
               "rank %d: rank %d's collective list equals rank 0's", me, q);
    EXPECT(count >= 2 && sched[0].kind == GT_COLL_ALL_GATHER &&
               sched[1].kind == GT_COLL_REDUCE_SCATTER && sched[0].bytes == (uint64_t)blk * 4 &&
               sched[1].bytes == (uint64_t)n * blk * 4 && sched[0].group == gt_hash_str("dp_shard"),
           "rank %d: kinds, bytes and group of the first two", me);
    EXPECT_OK(gt_comm_check_schedule(world, sched, count, &err), &err);

    if (prog && me == n - 1) EXPECT_OK(gt_program_drop_collective(prog, 1, &err), &err);
    count = prog ? gt_program_collectives(prog, false, sched, 16) : 0;
    EXPECT(count == (me == n - 1 ? 4 : 5), "rank %d: %d collectives after the drop", me, count);
    gt_error e = {0};
    gt_status st = gt_comm_check_schedule(world, sched, count, &e);
    EXPECT(st == GT_ERR_INVALID && strstr(e.msg, "#1") && strstr(e.msg, "mismatch"),
           "rank %d: dropped collective found: %s", me, e.msg);
    EXPECT_OK(gt_comm_check_schedule(world, NULL, 0, &err), &err); /* still in step */

    free(g_ref);
    free(a_ref);
    for (int k = 0; k < 3; k++)
        gt_tensor_free(&in[k]);
    gt_program_free(prog);
    gt_graph_free(g);
}

/* ---------------------------------------------------------------- 2-D mesh: dp_shard x tp
 *
 * comm_test_build_2d (comm_test.h): n ranks = d x 2, rank = dp * 2 + tp; a = all_gather over tp
 * of x [2, 3], s = reduce_scatter over dp_shard of a, u = all_reduce over tp of s * 2. With d = 1
 * the dp_shard collectives run over one rank, with no communicator. */
static void test_2d(gt_comm *world)
{
    int n = gt_comm_size(world), me = gt_comm_rank(world);
    if (n % 2) return;
    int d = n / 2, dp = me / 2, tp = me % 2;
    gt_error err = {0};
    gt_comm *c_dp = NULL, *c_tp = NULL;
    /* dp_shard group: the ranks with my tp coordinate, ordered by dp; tp group: my dp row */
    EXPECT_OK(gt_comm_split(world, tp, dp, &c_dp, &err), &err);
    EXPECT_OK(gt_comm_split(world, dp, tp, &c_tp, &err), &err);
    gt_graph *g = comm_test_build_2d(d);
    EXPECT(g->err.code == GT_OK, "build: %s", g->err.msg);
    gt_comm *comms[GT_MESH_MAX_DIMS] = {NULL, d > 1 ? c_dp : NULL, c_tp, NULL};

    int64_t sx[2] = {2, 3};
    gt_tensor x;
    gt_tensor_alloc(&x, GT_F32, 2, sx, &err);
    comm_test_fill(&x, me, 9);
    gt_program *prog = NULL;
    gt_tensor po[2] = {0}, eo[2] = {0};
    EXPECT_OK(gt_program_build(g, NULL, &prog, &err), &err);
    if (prog) EXPECT_OK(gt_program_set_comms(prog, comms, &err), &err);
    if (prog) EXPECT_OK(gt_program_run(prog, &x, po, &err), &err);
    EXPECT_OK(gt_eager_run_comms(g, NULL, &x, comms, eo, &err), &err);

    /* reference: a(dp', t)[j] = x of rank dp'*2 + j/6 at element j%6 */
    float a_ref[12], u_ref[12];
    for (int j = 0; j < 12; j++)
        a_ref[j] = comm_test_value(dp * 2 + j / 6, j % 6, 9);
    int64_t rows = 4 / d, blk = rows * 3;
    float s_t[2][12]; /* s of the rank (dp, t) for t = 0, 1 */
    for (int t = 0; t < 2; t++)
        for (int64_t i = 0; i < blk; i++) {
            int64_t j = dp * blk + i; /* my rows of the gathered [4, 3] */
            float acc = 0;
            for (int q = 0; q < d; q++) {
                float v = comm_test_value(q * 2 + (int)(j / 6), j % 6, 9);
                acc = q == 0 ? v : acc + v;
            }
            s_t[t][i] = acc;
        }
    for (int64_t i = 0; i < blk; i++)
        u_ref[i] = s_t[0][i] * 2.0f + s_t[1][i] * 2.0f;
    const gt_tensor *outs[2] = {po, eo};
    for (int k = 0; k < 2; k++) {
        EXPECT(count_bad(&outs[k][0], a_ref, 12) == 0, "rank %d 2-D all_gather over tp (%s)", me,
               k ? "eager" : "program");
        EXPECT(count_bad(&outs[k][1], u_ref, blk) == 0,
               "rank %d 2-D reduce_scatter over dp_shard then all_reduce over tp (%s): %d differ",
               me, k ? "eager" : "program", count_bad(&outs[k][1], u_ref, blk));
    }
    for (int k = 0; k < 2; k++) {
        EXPECT(comm_test_same_bits(&po[k], &eo[k]), "rank %d 2-D output %d: program == eager", me,
               k);
        gt_tensor_free(&po[k]);
        gt_tensor_free(&eo[k]);
    }
    gt_tensor_free(&x);
    gt_program_free(prog);
    gt_graph_free(g);
    gt_comm_destroy(c_dp);
    gt_comm_destroy(c_tp);
}

int main(int argc, char **argv)
{
    gt_comm *world = comm_test_mpi_world(&argc, &argv, 64);
    if (!world) return gt_test_finish();
    test_1d(world);
    test_2d(world);
    return comm_test_mpi_end(world);
}
