/* test_nccl_mpi.c — the NCCL communicator and the CUDA program's collectives, under
 * `mpiexec -np 2` with one GPU per rank (rank r uses device r). Skips (exit 0, reason printed)
 * when there are fewer GPUs than ranks.
 *
 * Every rank's inputs are a pure function of (rank, element, salt) with values of mixed magnitude,
 * so another summation order would change the bits. The reference is the MPI communicator on the
 * same host data (its sums are the rank-order sums, checked in tests/distributed), and for the
 * 1-D graph also a naive loop. Checked:
 *   - each collective on device tensors through NCCL (all_reduce of f32 with numel divisible by
 *     the group or not, fewer elements than ranks, in place, bf16, i32; reduce_scatter f32 and
 *     bf16, and bf16 / f16 into f32 (widening: also equal to MPI's f32 scatter of the widened
 *     inputs); all_gather; broadcast; all_to_all) equals the MPI result bit for bit; host waits go
 *     through gt_comm_nccl_wait_event;
 *   - the hand-built SPMD graphs of tests/distributed/test_program_mpi.c (1-D mesh with the rank
 *     symbol, gather / scatter / sum / bf16 sum; 2-D mesh dp_shard x tp with split NCCL
 *     communicators and a size-1 group) as CUDA programs with NCCL communicators: bitwise equal to
 *     the CPU program with MPI communicators on the same inputs, rerun == run, and after
 *     gt_cuda_program_capture the replayed CUDA graph == the eager run, also on new inputs;
 *   - a CUDA program refuses a (size > 1) MPI communicator; gt_comm_check_schedule over NCCL;
 *   - the TCP rendezvous (MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE): a communicator made without
 *     MPI gives the same all_reduce bits;
 *   - a stuck peer: on a split communicator with a 3 s timeout, after one all_reduce together
 *     (so the peers are connected), rank 0 posts an all_reduce that rank 1 never joins; rank 0's
 *     host wait fails within the timeout naming the communicator (no hang), later calls on it
 *     fail saying it was aborted, and both ranks then destroy it without hanging. */
#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "distributed/comm_test.h"
#include "graphtrain/gt_build.h"
#include "graphtrain/gt_comm.h"
#include "graphtrain/gt_cuda.h"
#include "graphtrain/gt_exec.h"
#include "graphtrain/gt_program.h"
#include "gt_test.h"

static gt_cuda_stream *g_stream;
static cudaEvent_t g_ev;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *stream(void)
{
    return gt_cuda_stream_handle(g_stream);
}

/* True when `ok` holds on every rank (an MPI sum of the failures), so that all ranks skip the
 * same collectives after a failure instead of waiting for one another. */
static bool all_ok(gt_comm *mpi, bool ok)
{
    int32_t bad = ok ? 0 : 1, total = 1;
    int64_t one[1] = {1};
    gt_tensor a, b;
    gt_tensor_wrap(&a, GT_I32, 1, one, &bad);
    gt_tensor_wrap(&b, GT_I32, 1, one, &total);
    gt_error err = {0};
    return gt_comm_all_reduce(mpi, &a, &b, &err) == GT_OK && total == 0;
}

static void progress(gt_comm *mpi, const char *what)
{
    if (gt_comm_rank(mpi) == 0) printf("done: %s\n", what);
    fflush(stdout);
}

/* ---------------------------------------------------------------- collectives on device tensors */

/* out_h (allocated) = the collective of in_h through NCCL: upload, start, wait, event wait,
 * download. The device output is pre-filled with 0xff bytes. */
static gt_status nccl_coll(gt_comm *c, gt_coll_kind kind, const gt_tensor *in_h, gt_tensor *out_h,
                           bool in_place, gt_error *err)
{
    gt_tensor din, dout;
    GT_TRY(gt_cuda_tensor_upload(g_stream, in_h, &din, err));
    gt_tensor *o = &din;
    if (!in_place) {
        GT_TRY(gt_cuda_tensor_alloc(&dout, out_h->dtype, out_h->ndim, out_h->shape, err));
        cudaMemset(dout.data, 0xff, gt_tensor_nbytes(&dout));
        cudaDeviceSynchronize();
        o = &dout;
    }
    gt_comm_nccl_set_stream(c, stream());
    gt_comm_request *req = NULL;
    gt_status st;
    switch (kind) {
    case GT_COLL_ALL_REDUCE:
        st = gt_comm_all_reduce_start(c, &din, o, &req, err);
        break;
    case GT_COLL_REDUCE_SCATTER:
        st = gt_comm_reduce_scatter_start(c, &din, o, &req, err);
        break;
    case GT_COLL_ALL_GATHER:
        st = gt_comm_all_gather_start(c, &din, o, &req, err);
        break;
    case GT_COLL_BROADCAST:
        st = gt_comm_broadcast_start(c, &din, c->size - 1, &req, err);
        o = &din;
        break;
    default:
        st = gt_comm_all_to_all_start(c, &din, o, &req, err);
        break;
    }
    if (st == GT_OK) st = gt_comm_wait(req, err);
    if (st == GT_OK && cudaEventRecord(g_ev, (cudaStream_t)stream()) != cudaSuccess)
        st = gt_error_set(err, GT_ERR_INTERNAL, "cudaEventRecord");
    if (st == GT_OK) st = gt_comm_nccl_wait_event(&c, 1, g_ev, err);
    if (st == GT_OK) st = gt_cuda_tensor_download(g_stream, o, out_h, err);
    gt_cuda_tensor_free(&din);
    if (!in_place) gt_cuda_tensor_free(&dout);
    return st;
}

static void check_coll(gt_comm *mpi, gt_comm *nccl, gt_coll_kind kind, gt_dtype dt, int ndim,
                       const int64_t *in_shape, const int64_t *out_shape, bool in_place,
                       const char *what)
{
    int me = gt_comm_rank(mpi);
    gt_error err = {0};
    gt_tensor in, ref, got;
    gt_tensor_alloc(&in, dt, ndim, in_shape, &err);
    gt_tensor_alloc(&ref, dt, ndim, out_shape, &err);
    gt_tensor_alloc(&got, dt, ndim, out_shape, &err);
    comm_test_fill(&in, me, 7);
    gt_status st;
    switch (kind) {
    case GT_COLL_ALL_REDUCE:
        st = gt_comm_all_reduce(mpi, &in, &ref, &err);
        break;
    case GT_COLL_REDUCE_SCATTER:
        st = gt_comm_reduce_scatter(mpi, &in, &ref, &err);
        break;
    case GT_COLL_ALL_GATHER:
        st = gt_comm_all_gather(mpi, &in, &ref, &err);
        break;
    case GT_COLL_BROADCAST:
        memcpy(ref.data, in.data, gt_tensor_nbytes(&in));
        st = gt_comm_broadcast(mpi, &ref, mpi->size - 1, &err);
        break;
    default:
        st = gt_comm_all_to_all(mpi, &in, &ref, &err);
        break;
    }
    EXPECT(st == GT_OK, "rank %d %s: MPI reference: %s", me, what, err.msg);
    st = nccl_coll(nccl, kind, &in, &got, in_place, &err);
    EXPECT(st == GT_OK, "rank %d %s: NCCL: %s", me, what, err.msg);
    EXPECT(st == GT_OK && comm_test_same_bits(&got, &ref), "rank %d %s: NCCL bits == MPI bits", me,
           what);
    gt_tensor_free(&in);
    gt_tensor_free(&ref);
    gt_tensor_free(&got);
}

/* The widening reduce_scatter (dt = bf16 or f16 in, f32 out; inputs comm_test_value16) through
 * NCCL: bitwise the MPI communicator's widening scatter and its f32 scatter of the widened
 * inputs. */
static void check_widening(gt_comm *mpi, gt_comm *nccl, gt_dtype dt, int64_t rows, int64_t cols)
{
    int me = gt_comm_rank(mpi), n = gt_comm_size(mpi);
    gt_error err = {0};
    int64_t s_in[2] = {n * rows, cols}, s_out[2] = {rows, cols};
    gt_tensor in, wide, ref, ref_f32, got;
    gt_tensor_alloc(&in, dt, 2, s_in, &err);
    gt_tensor_alloc(&wide, GT_F32, 2, s_in, &err);
    gt_tensor_alloc(&ref, GT_F32, 2, s_out, &err);
    gt_tensor_alloc(&ref_f32, GT_F32, 2, s_out, &err);
    gt_tensor_alloc(&got, GT_F32, 2, s_out, &err);
    for (int64_t i = 0; i < n * rows * cols; i++) {
        ((uint16_t *)in.data)[i] = comm_test_value16(dt, me, i);
        ((float *)wide.data)[i] = comm_test_widen16(dt, ((uint16_t *)in.data)[i]);
    }
    EXPECT_OK(gt_comm_reduce_scatter(mpi, &in, &ref, &err), &err);
    EXPECT_OK(gt_comm_reduce_scatter(mpi, &wide, &ref_f32, &err), &err);
    gt_status st = nccl_coll(nccl, GT_COLL_REDUCE_SCATTER, &in, &got, false, &err);
    EXPECT(st == GT_OK, "rank %d reduce_scatter %s -> f32: NCCL: %s", me, gt_dtype_name(dt),
           err.msg);
    EXPECT(st == GT_OK && comm_test_same_bits(&got, &ref) && comm_test_same_bits(&got, &ref_f32),
           "rank %d reduce_scatter %s -> f32 [%lld, %lld]: NCCL bits == MPI bits (widening and "
           "f32 of the widened inputs)",
           me, gt_dtype_name(dt), (long long)rows, (long long)cols);
    gt_tensor_free(&in), gt_tensor_free(&wide), gt_tensor_free(&ref);
    gt_tensor_free(&ref_f32), gt_tensor_free(&got);
}

static void test_collectives(gt_comm *mpi, gt_comm *nccl)
{
    int64_t n = mpi->size;
    check_coll(mpi, nccl, GT_COLL_ALL_REDUCE, GT_F32, 1, (int64_t[]){1000 * n},
               (int64_t[]){1000 * n}, false, "all_reduce f32 (divisible)");
    check_coll(mpi, nccl, GT_COLL_ALL_REDUCE, GT_F32, 2, (int64_t[]){77, 13}, (int64_t[]){77, 13},
               false, "all_reduce f32 [77, 13] (padded chunks)");
    check_coll(mpi, nccl, GT_COLL_ALL_REDUCE, GT_F32, 1, (int64_t[]){1}, (int64_t[]){1}, false,
               "all_reduce f32 of 1 element");
    check_coll(mpi, nccl, GT_COLL_ALL_REDUCE, GT_F32, 1, (int64_t[]){64}, (int64_t[]){64}, true,
               "all_reduce f32 in place");
    check_coll(mpi, nccl, GT_COLL_ALL_REDUCE, GT_BF16, 1, (int64_t[]){777}, (int64_t[]){777}, false,
               "all_reduce bf16");
    check_coll(mpi, nccl, GT_COLL_ALL_REDUCE, GT_I32, 1, (int64_t[]){10}, (int64_t[]){10}, false,
               "all_reduce i32 (wrapping)");
    check_coll(mpi, nccl, GT_COLL_REDUCE_SCATTER, GT_F32, 2, (int64_t[]){7 * n, 3},
               (int64_t[]){7, 3}, false, "reduce_scatter f32");
    check_coll(mpi, nccl, GT_COLL_REDUCE_SCATTER, GT_BF16, 2, (int64_t[]){5 * n, 8},
               (int64_t[]){5, 8}, false, "reduce_scatter bf16");
    check_widening(mpi, nccl, GT_BF16, 5, 8); /* 40 per block: the 16-byte vector path */
    check_widening(mpi, nccl, GT_F16, 7, 3);  /* 21 per block: one element at a time */
    check_coll(mpi, nccl, GT_COLL_ALL_GATHER, GT_F32, 2, (int64_t[]){3, 5}, (int64_t[]){3 * n, 5},
               false, "all_gather");
    check_coll(mpi, nccl, GT_COLL_BROADCAST, GT_BF16, 1, (int64_t[]){41}, (int64_t[]){41}, true,
               "broadcast from the last rank");
    check_coll(mpi, nccl, GT_COLL_ALL_TO_ALL, GT_F32, 2, (int64_t[]){4 * n, 2},
               (int64_t[]){4 * n, 2}, false, "all_to_all");

    /* the schedule check's exchange runs over NCCL */
    gt_error err = {0};
    gt_comm_sched_entry e[2] = {{GT_COLL_ALL_GATHER, 1, 64, 0}, {GT_COLL_ALL_REDUCE, 2, 128, 0}};
    EXPECT_OK(gt_comm_check_schedule(nccl, e, 2, &err), &err);
    e[1].bytes = 128 + (uint64_t)mpi->rank;
    gt_error e2 = {0};
    EXPECT(gt_comm_check_schedule(nccl, e, 2, &e2) == GT_ERR_INVALID && strstr(e2.msg, "#1"),
           "rank %d: a schedule mismatch found over NCCL: %s", mpi->rank, e2.msg);
}

/* ---------------------------------------------------------------- graphs
 *
 * The hand-built graphs of test_program_mpi.c (comm_test.h): comm_test_build_1d(n): x2 = x +
 * full[r*b ..]; g = all_gather(-x2); s = reduce_scatter(g * p); u = all_reduce(s + x);
 * v = all_reduce(cast(x, bf16)); a = all_to_all(p); outputs g, s, u, v, a. comm_test_build_2d(d):
 * dp_shard x tp:
 * a = all_gather over tp; s = reduce_scatter over dp_shard; u = all_reduce over tp of s * 2;
 * outputs a, u. */

/* Naive u of comm_test_build_1d on rank `me` for inputs of salt base 0 (x: 1, p: 2, full: 3). */
static void reference_u(int n, int me, float *u_ref)
{
    int64_t blk = COMM_TEST_ROWS * COMM_TEST_COLS;
    (void)me;
    for (int64_t i = 0; i < blk; i++) {
        float acc = 0;
        for (int q = 0; q < n; q++) {
            int64_t j = q * blk + i; /* s of rank q at element i: rows q*b.. of sum_t h_t */
            float gq = -(comm_test_value(q, i, 1) + comm_test_value(0, j, 3)), s = 0;
            for (int t = 0; t < n; t++) {
                float h = gq * comm_test_value(t, j, 2);
                s = t == 0 ? h : s + h;
            }
            float t = s + comm_test_value(q, i, 1);
            acc = q == 0 ? t : acc + t;
        }
        u_ref[i] = acc;
    }
}

/* CPU program with MPI communicators vs CUDA program with NCCL ones on inputs a, then b: run,
 * rerun, capture, replay on a and on b. */
static void compare_programs(const char *what, gt_graph *g, const gt_sym_binding *bind,
                             gt_comm *const mpi[GT_MESH_MAX_DIMS],
                             gt_comm *const nccl[GT_MESH_MAX_DIMS], const gt_tensor *in_a,
                             const gt_tensor *in_b, gt_tensor *cpu_a_out)
{
    int me = 0;
    for (int k = 0; k < GT_MESH_MAX_DIMS; k++)
        if (mpi[k]) me = gt_comm_rank(mpi[k]);
    gt_error err = {0};
    int32_t no = g->n_outputs;
    gt_tensor cpu_b[8] = {0}, run[4][8];
    memset(run, 0, sizeof run);
    gt_program *cp = NULL;
    EXPECT_OK(gt_program_build(g, bind, &cp, &err), &err);
    if (cp) EXPECT_OK(gt_program_set_comms(cp, mpi, &err), &err);
    if (cp) EXPECT_OK(gt_program_run(cp, in_a, cpu_a_out, &err), &err);
    if (cp) EXPECT_OK(gt_program_run(cp, in_b, cpu_b, &err), &err);

    gt_cuda_program *gp = NULL;
    EXPECT_OK(gt_cuda_program_build(g, bind, NULL, &gp, &err), &err);
    if (gp) EXPECT_OK(gt_cuda_program_set_comms(gp, nccl, &err), &err);
    bool ok = gp != NULL;
    for (int r = 0; r < 4 && ok; r++) {
        if (r == 2) {
            gt_status st = gt_cuda_program_capture(gp, &err);
            EXPECT(st == GT_OK && gt_cuda_program_captured(gp),
                   "rank %d %s: captured with its collectives: %s", me, what, err.msg);
        }
        gt_status st = gt_cuda_program_run(gp, r == 3 ? in_b : in_a, run[r], &err);
        EXPECT(st == GT_OK, "rank %d %s run %d: %s", me, what, r, err.msg);
        ok = st == GT_OK;
    }
    for (int32_t k = 0; k < no && ok; k++) {
        EXPECT(comm_test_same_bits(&run[0][k], &cpu_a_out[k]),
               "rank %d %s output %d: CUDA+NCCL == CPU+MPI, bitwise", me, what, k);
        EXPECT(comm_test_same_bits(&run[1][k], &run[0][k]), "rank %d %s output %d: rerun == run",
               me, what, k);
        EXPECT(comm_test_same_bits(&run[2][k], &run[0][k]),
               "rank %d %s output %d: CUDA graph replay == eager run", me, what, k);
        EXPECT(comm_test_same_bits(&run[3][k], &cpu_b[k]),
               "rank %d %s output %d: replay on new inputs == CPU+MPI", me, what, k);
    }
    for (int32_t k = 0; k < no; k++) {
        gt_tensor_free(&cpu_b[k]);
        for (int r = 0; r < 4; r++)
            gt_tensor_free(&run[r][k]);
    }
    gt_cuda_program_free(gp);
    gt_program_free(cp);
}

static void test_1d(gt_comm *mpi, gt_comm *nccl)
{
    int n = gt_comm_size(mpi), me = gt_comm_rank(mpi);
    gt_error err = {0};
    gt_graph *g = comm_test_build_1d(n);
    EXPECT(g->err.code == GT_OK, "build: %s", g->err.msg);
    gt_sym_binding_entry be[2] = {{"b", COMM_TEST_ROWS}, {"rank.dp_shard", me}};
    gt_sym_binding bind = {be, 2};
    int64_t sx[2] = {COMM_TEST_ROWS, COMM_TEST_COLS},
            sp[2] = {(int64_t)n * COMM_TEST_ROWS, COMM_TEST_COLS};
    gt_tensor a[3], b[3];
    for (int s = 0; s < 2; s++) {
        gt_tensor *t = s ? b : a;
        gt_tensor_alloc(&t[0], GT_F32, 2, sx, &err);
        gt_tensor_alloc(&t[1], GT_F32, 2, sp, &err);
        gt_tensor_alloc(&t[2], GT_F32, 2, sp, &err);
        comm_test_fill(&t[0], me, 1 + 10 * s);
        comm_test_fill(&t[1], me, 2 + 10 * s);
        comm_test_fill(&t[2], 0, 3 + 10 * s);
    }
    gt_comm *mc[GT_MESH_MAX_DIMS] = {NULL, mpi, NULL, NULL};
    gt_comm *nc[GT_MESH_MAX_DIMS] = {NULL, nccl, NULL, NULL};

    /* a CUDA program refuses a host communicator */
    gt_cuda_program *gp = NULL;
    EXPECT_OK(gt_cuda_program_build(g, &bind, NULL, &gp, &err), &err);
    gt_error e2 = {0};
    EXPECT(gp && gt_cuda_program_set_comms(gp, mc, &e2) == GT_ERR_INVALID && strstr(e2.msg, "NCCL"),
           "rank %d: an MPI communicator is refused: %s", me, e2.msg);
    gt_cuda_program_free(gp);

    gt_tensor cpu[5] = {0};
    compare_programs("1-D", g, &bind, mc, nc, a, b, cpu);
    float u_ref[COMM_TEST_ROWS * COMM_TEST_COLS];
    reference_u(n, me, u_ref);
    EXPECT(cpu[2].data && memcmp(cpu[2].data, u_ref, sizeof u_ref) == 0,
           "rank %d: the CPU program's all_reduce is the naive rank-order sum", me);
    for (int k = 0; k < 5; k++)
        gt_tensor_free(&cpu[k]);
    for (int k = 0; k < 3; k++) {
        gt_tensor_free(&a[k]);
        gt_tensor_free(&b[k]);
    }
    gt_graph_free(g);
}

static void test_2d(gt_comm *mpi, gt_comm *nccl)
{
    int n = gt_comm_size(mpi), me = gt_comm_rank(mpi);
    if (n % 2) return;
    int d = n / 2, dp = me / 2, tp = me % 2;
    gt_error err = {0};
    gt_comm *m_dp = NULL, *m_tp = NULL, *n_dp = NULL, *n_tp = NULL;
    EXPECT_OK(gt_comm_split(mpi, tp, dp, &m_dp, &err), &err);
    EXPECT_OK(gt_comm_split(mpi, dp, tp, &m_tp, &err), &err);
    EXPECT_OK(gt_comm_split(nccl, tp, dp, &n_dp, &err), &err);
    EXPECT_OK(gt_comm_split(nccl, dp, tp, &n_tp, &err), &err);
    EXPECT(n_tp && gt_comm_size(n_tp) == 2 && gt_comm_rank(n_tp) == tp && gt_comm_is_nccl(n_tp),
           "rank %d: the tp split has 2 ranks, this one at %d", me, tp);
    if (!all_ok(mpi, m_dp && m_tp && n_dp && n_tp)) {
        gt_comm_destroy(n_dp);
        gt_comm_destroy(n_tp);
        gt_comm_destroy(m_dp);
        gt_comm_destroy(m_tp);
        return;
    }
    gt_graph *g = comm_test_build_2d(d);
    gt_comm *mc[GT_MESH_MAX_DIMS] = {NULL, d > 1 ? m_dp : NULL, m_tp, NULL};
    gt_comm *nc[GT_MESH_MAX_DIMS] = {NULL, d > 1 ? n_dp : NULL, n_tp, NULL};
    int64_t sx[2] = {2, 3};
    gt_tensor a, b, cpu[2] = {0};
    gt_tensor_alloc(&a, GT_F32, 2, sx, &err);
    gt_tensor_alloc(&b, GT_F32, 2, sx, &err);
    comm_test_fill(&a, me, 9);
    comm_test_fill(&b, me, 19);
    compare_programs("2-D", g, NULL, mc, nc, &a, &b, cpu);
    gt_tensor_free(&cpu[0]);
    gt_tensor_free(&cpu[1]);
    gt_tensor_free(&a);
    gt_tensor_free(&b);
    gt_graph_free(g);
    gt_comm_destroy(n_dp);
    gt_comm_destroy(n_tp);
    gt_comm_destroy(m_dp);
    gt_comm_destroy(m_tp);
}

/* ---------------------------------------------------------------- TCP rendezvous */

static void test_tcp(gt_comm *mpi)
{
    int me = gt_comm_rank(mpi), n = gt_comm_size(mpi);
    gt_error err = {0};
    int32_t port = me == 0 ? comm_test_free_port() : 0;
    int64_t one[1] = {1};
    gt_tensor pt;
    gt_tensor_wrap(&pt, GT_I32, 1, one, &port);
    EXPECT_OK(gt_comm_broadcast(mpi, &pt, 0, &err), &err);
    comm_test_set_rank_env("127.0.0.1", port, me, n);
    gt_comm *tcp = NULL;
    EXPECT_OK(gt_comm_nccl_create_tcp(me, stream(), 30.0, &tcp, &err), &err);
    if (tcp) {
        check_coll(mpi, tcp, GT_COLL_ALL_REDUCE, GT_F32, 1, (int64_t[]){301}, (int64_t[]){301},
                   false, "all_reduce over the TCP-bootstrapped communicator");
        gt_comm_destroy(tcp);
    }
    unsetenv("MASTER_PORT");
    gt_comm *none = NULL;
    gt_error e2 = {0};
    EXPECT(gt_comm_nccl_create_tcp(me, stream(), 1.0, &none, &e2) == GT_ERR_INVALID &&
               strstr(e2.msg, "MASTER_PORT"),
           "rank %d: a missing variable is named: %s", me, e2.msg);
}

/* ---------------------------------------------------------------- a peer that never comes */

static void test_stuck_peer(gt_comm *mpi, gt_comm *nccl)
{
    int me = gt_comm_rank(mpi);
    gt_error err = {0};
    gt_comm *sub = NULL;
    EXPECT_OK(gt_comm_split(nccl, 0, 0, &sub, &err), &err);
    if (!all_ok(mpi, sub != NULL)) {
        gt_comm_destroy(sub);
        return;
    }
    gt_comm_set_timeout(sub, 3.0);
    /* one all_reduce together first: NCCL connects peers lazily, on the host, at the first use;
     * a peer missing then is caught by the polled host call. The case here is the other one: the
     * transfer is queued and the device waits for a peer that never posts its half. */
    check_coll(mpi, sub, GT_COLL_ALL_REDUCE, GT_F32, 1, (int64_t[]){4096}, (int64_t[]){4096}, true,
               "all_reduce on the split communicator");
    if (me == 0) {
        int64_t shape[1] = {4096};
        gt_tensor h, d;
        gt_tensor_alloc(&h, GT_F32, 1, shape, &err);
        comm_test_fill(&h, me, 5);
        EXPECT_OK(gt_cuda_tensor_upload(g_stream, &h, &d, &err), &err);
        gt_comm_nccl_set_stream(sub, stream());
        gt_comm_request *req = NULL;
        double t0 = now_s();
        gt_error e = {0};
        gt_status st = gt_comm_all_reduce_start(sub, &d, &d, &req, &e);
        if (st == GT_OK) st = gt_comm_wait(req, &e);
        if (st == GT_OK) {
            cudaEventRecord(g_ev, (cudaStream_t)stream());
            st = gt_comm_nccl_wait_event(&sub, 1, g_ev, &e);
        }
        double took = now_s() - t0;
        printf("rank 0: all_reduce without its peer -> %s after %.1f s: %s\n", gt_status_name(st),
               took, e.msg);
        EXPECT(st == GT_ERR_IO && strstr(e.msg, "world/split(0)") && strstr(e.msg, "rank 0"),
               "the stuck collective is an error naming the communicator: %s", e.msg);
        EXPECT(took < 20.0, "it came within the timeout (3 s) plus the drain (%.1f s)", took);
        gt_error e3 = {0};
        EXPECT(gt_comm_all_reduce_start(sub, &d, &d, &req, &e3) == GT_ERR_IO &&
                   strstr(e3.msg, "aborted"),
               "an aborted communicator refuses later calls: %s", e3.msg);
        gt_cuda_tensor_free(&d);
        gt_tensor_free(&h);
    }
    all_ok(mpi, true); /* rank 1 stays alive (stuck elsewhere) until rank 0 has given up */
    double t0 = now_s();
    gt_comm_destroy(sub); /* rank 1: its peer aborted, so the finalize is bounded (3 s) */
    EXPECT(now_s() - t0 < 30.0, "rank %d: destroy after a peer's abort does not hang", me);
}

int main(int argc, char **argv)
{
    gt_error err = {0};
    gt_comm *mpi = NULL;
    EXPECT_OK(gt_comm_mpi_world(&argc, &argv, &mpi, &err), &err);
    if (!mpi) return gt_test_finish();
    int me = gt_comm_rank(mpi), n = gt_comm_size(mpi);
    int gpus = gt_cuda_device_count();
    if (gpus < n) {
        if (me == 0) printf("skipped: %d ranks need one GPU each, this machine has %d\n", n, gpus);
        gt_comm_destroy(mpi);
        gt_comm_mpi_finalize(&err);
        return 0;
    }
    EXPECT_OK(gt_cuda_init(me, NULL, &err), &err);
    EXPECT_OK(gt_cuda_stream_create(&g_stream, &err), &err);
    cudaEventCreateWithFlags(&g_ev, cudaEventDisableTiming);
    gt_comm *nccl = NULL;
    EXPECT_OK(gt_comm_nccl_create(mpi, me, stream(), 0, GT_NCCL_BUFFERS_PLAIN, &nccl, &err),
              &err);
    EXPECT(!nccl || (gt_comm_rank(nccl) == me && gt_comm_size(nccl) == n), "rank %d: world", me);
    if (nccl) {
        test_collectives(mpi, nccl);
        progress(mpi, "collectives on device tensors");
        test_1d(mpi, nccl);
        progress(mpi, "1-D program");
        test_2d(mpi, nccl);
        progress(mpi, "2-D program");
        test_tcp(mpi);
        progress(mpi, "TCP rendezvous");
        test_stuck_peer(mpi, nccl);
        progress(mpi, "stuck peer");
        gt_comm_destroy(nccl);
    }
    cudaEventDestroy(g_ev);
    gt_cuda_stream_destroy(g_stream);
    return comm_test_mpi_end(mpi);
}
