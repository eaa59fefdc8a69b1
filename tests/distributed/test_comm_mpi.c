/* test_comm_mpi.c — MPI communicator, run under mpirun with 2 or 4 ranks.
 *
 * Every rank's input is a pure function of (rank, element), so each rank computes the reference
 * for every collective locally: sums as a naive loop over ranks in rank order (f32 accumulation,
 * one rounding for bf16), gathers and all-to-alls as index arithmetic. Sums are compared bit for
 * bit: the communicator promises the rank-order sum. The widening reduce_scatter (bf16 / f16 in,
 * f32 out) also equals the f32 reduce_scatter of the inputs widened on the host, and the dtype
 * pairs it does not allow are refused (comm_test_reduce_scatter_widen). */
#include <string.h>

#include "comm_test.h"
#include "graphtrain/gt_comm.h"
#include "gt_test.h"

/* Moves (comm_test_moves), then an all_gather into a buffer of the wrong size: a shape error on
 * every rank, naming the rank and the collective. */
static void test_gather_scatter_a2a(gt_comm *c)
{
    comm_test_moves(c);
    gt_error err = {0};
    int64_t s_big[2] = {(int64_t)c->size * 3, 5};
    gt_tensor big;
    gt_tensor_alloc(&big, GT_F32, 2, s_big, &err);
    comm_test_fill(&big, c->rank, 3);
    gt_error e = {0};
    EXPECT(gt_comm_all_gather(c, &big, &big, &e) == GT_ERR_SHAPE, "all_gather shape error");
    char want[32];
    snprintf(want, sizeof want, "rank %d", c->rank);
    EXPECT(strstr(e.msg, want) && strstr(e.msg, "all_gather"), "message: %s", e.msg);
    gt_tensor_free(&big);
}

/* Three collectives in flight at once, local work in between, waits in reverse order. */
static void test_async(gt_comm *c)
{
    gt_error err = {0};
    int n = c->size;
    int64_t s1[1] = {1000}, sn[1] = {1000 * (int64_t)n};
    gt_tensor a_in, a_out, g_in, g_out, r_in, r_out;
    gt_tensor_alloc(&a_in, GT_F32, 1, s1, &err), gt_tensor_alloc(&a_out, GT_F32, 1, s1, &err);
    gt_tensor_alloc(&g_in, GT_F32, 1, s1, &err), gt_tensor_alloc(&g_out, GT_F32, 1, sn, &err);
    gt_tensor_alloc(&r_in, GT_F32, 1, sn, &err), gt_tensor_alloc(&r_out, GT_F32, 1, s1, &err);
    comm_test_fill(&a_in, c->rank, 5), comm_test_fill(&g_in, c->rank, 6),
        comm_test_fill(&r_in, c->rank, 7);
    gt_comm_request *ra, *rg, *rr;
    EXPECT_OK(gt_comm_all_reduce_start(c, &a_in, &a_out, &ra, &err), &err);
    EXPECT_OK(gt_comm_all_gather_start(c, &g_in, &g_out, &rg, &err), &err);
    EXPECT_OK(gt_comm_reduce_scatter_start(c, &r_in, &r_out, &rr, &err), &err);
    double busy = 0; /* overlapping compute */
    for (int i = 0; i < 200000; i++)
        busy += (double)i * 1e-9;
    EXPECT(busy > 0, "busy");
    EXPECT_OK(gt_comm_wait(rr, &err), &err);
    EXPECT_OK(gt_comm_wait(rg, &err), &err);
    EXPECT_OK(gt_comm_wait(ra, &err), &err);
    int bad = 0;
    for (int64_t i = 0; i < 1000; i++) {
        float ra_ref = 0, rr_ref = 0;
        for (int r = 0; r < n; r++) {
            ra_ref = r == 0 ? comm_test_value(r, i, 5) : ra_ref + comm_test_value(r, i, 5);
            rr_ref = r == 0 ? comm_test_value(r, c->rank * 1000 + i, 7)
                            : rr_ref + comm_test_value(r, c->rank * 1000 + i, 7);
            bad += ((float *)g_out.data)[r * 1000 + i] != comm_test_value(r, i, 6);
        }
        bad += memcmp(&ra_ref, (float *)a_out.data + i, 4) != 0;
        bad += memcmp(&rr_ref, (float *)r_out.data + i, 4) != 0;
    }
    EXPECT(bad == 0, "async overlapped collectives: %d elements differ", bad);
    gt_tensor_free(&a_in), gt_tensor_free(&a_out), gt_tensor_free(&g_in);
    gt_tensor_free(&g_out), gt_tensor_free(&r_in), gt_tensor_free(&r_out);
}

/* Split by rank parity with reversed keys: sub rank order is descending world rank. */
static void test_split(gt_comm *c)
{
    gt_error err = {0};
    int n = c->size, color = c->rank % 2;
    gt_comm *sub;
    EXPECT_OK(gt_comm_split(c, color, -c->rank, &sub, &err), &err);
    int members[64], m = 0;
    for (int r = n - 1; r >= 0; r--)
        if (r % 2 == color) members[m++] = r;
    int my_pos = -1;
    for (int i = 0; i < m; i++)
        if (members[i] == c->rank) my_pos = i;
    EXPECT(gt_comm_size(sub) == m && gt_comm_rank(sub) == my_pos, "sub rank %d/%d, expected %d/%d",
           gt_comm_rank(sub), gt_comm_size(sub), my_pos, m);
    int64_t shape[1] = {37};
    gt_tensor in, out;
    gt_tensor_alloc(&in, GT_F32, 1, shape, &err), gt_tensor_alloc(&out, GT_F32, 1, shape, &err);
    comm_test_fill(&in, c->rank, 8);
    EXPECT_OK(gt_comm_all_reduce(sub, &in, &out, &err), &err);
    int bad = 0;
    for (int64_t i = 0; i < 37; i++) {
        float ref = 0;
        for (int j = 0; j < m; j++)
            ref = j == 0 ? comm_test_value(members[j], i, 8)
                         : ref + comm_test_value(members[j], i, 8);
        bad += memcmp(&ref, (float *)out.data + i, 4) != 0;
    }
    EXPECT(bad == 0, "sub-communicator all_reduce: %d elements differ", bad);
    gt_tensor_free(&in), gt_tensor_free(&out);
    gt_comm_destroy(sub);
}

static void test_schedule(gt_comm *c)
{
    gt_error err = {0};
    gt_comm_sched_entry s[4] = {{GT_COLL_ALL_GATHER, 11, 4096, 0},
                                {GT_COLL_REDUCE_SCATTER, 11, 4096, 0},
                                {GT_COLL_ALL_REDUCE, 12, 64, 0},
                                {GT_COLL_ALL_GATHER, 11, 1024, 0}};
    EXPECT_OK(gt_comm_check_schedule(c, s, 4, &err), &err);

    /* Rank 1 skips collective #2: every rank must fail, naming #2 — and not hang. */
    gt_comm_sched_entry skip[3] = {s[0], s[1], s[3]};
    gt_error e = {0};
    gt_status st =
        c->rank == 1 ? gt_comm_check_schedule(c, skip, 3, &e) : gt_comm_check_schedule(c, s, 4, &e);
    EXPECT(st == GT_ERR_INVALID && strstr(e.msg, "#2") && strstr(e.msg, "mismatch"),
           "skipped collective: %s", e.msg);

    /* Last rank's collective #1 has other bytes. */
    gt_comm_sched_entry other[4] = {s[0], s[1], s[2], s[3]};
    if (c->rank == c->size - 1) other[1].bytes = 2048;
    gt_error e2 = {0};
    EXPECT(gt_comm_check_schedule(c, other, 4, &e2) == GT_ERR_INVALID && strstr(e2.msg, "#1"),
           "different bytes: %s", e2.msg);

    /* Rank 0 has one collective more: first difference is #4. */
    gt_comm_sched_entry more[5] = {s[0], s[1], s[2], s[3], s[0]};
    gt_error e3 = {0};
    EXPECT(gt_comm_check_schedule(c, more, c->rank == 0 ? 5 : 4, &e3) == GT_ERR_INVALID &&
               strstr(e3.msg, "#4"),
           "extra collective: %s", e3.msg);
    EXPECT_OK(gt_comm_check_schedule(c, s, 4, &err), &err); /* still in step afterwards */
}

int main(int argc, char **argv)
{
    gt_comm *world = comm_test_mpi_world(&argc, &argv, 0);
    if (!world) return gt_test_finish();
    comm_test_all_reduce(world, GT_F32, 1001, false, true);
    comm_test_all_reduce(world, GT_F32, 3, false, true); /* fewer elements than ranks with -np 4 */
    comm_test_all_reduce(world, GT_F32, 64, true, true);
    comm_test_all_reduce(world, GT_BF16, 515, false, true);
    comm_test_all_reduce(world, GT_I64, 99, false, true);
    test_gather_scatter_a2a(world);
    comm_test_reduce_scatter_widen(world, GT_BF16, 5, 8); /* 40 per block: 16-byte vectors */
    comm_test_reduce_scatter_widen(world, GT_F16, 7, 3);
    comm_test_reduce_scatter_widen(world, GT_BF16, 1, 1);
    test_async(world);
    test_split(world);
    test_schedule(world);
    return comm_test_mpi_end(world);
}
