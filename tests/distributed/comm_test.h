/* comm_test.h — what the tests of collectives share: the tests of the communicators (MPI, TCP,
 * NCCL: tests/distributed/test_comm_mpi.c, test_torchrun_launch.c, tests/cuda/test_nccl_mpi.c),
 * of programs with collectives (test_program_mpi.c, tests/unit/test_collective_ir.c) and of the
 * FSDP passes (test_bucketing_mpi.c, tests/unit/test_bucketing.c).
 *
 *   - inputs: every rank's values are a pure function of (rank, element, salt), so each rank can
 *     regenerate every other rank's input and compute a collective's result naively;
 *   - naive checks of the communicator's collectives against those inputs (sums as loops over
 *     the ranks in rank order, compared bit for bit: the communicator promises the rank-order
 *     sum);
 *   - hand-built graphs with a device mesh and start/wait collectives;
 *   - the environment of a TCP (torchrun-style) rendezvous, and the MPI world of a test run under
 *     mpirun.
 * Header-only (static inline) and private to the tests. Include after launch.h where both are
 * used (launch.h's train_child.h must come first: it defines _GNU_SOURCE). */
#ifndef GT_TESTS_DISTRIBUTED_COMM_TEST_H
#define GT_TESTS_DISTRIBUTED_COMM_TEST_H

#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "graph_text.h"
#include "graphtrain/gt_build.h"
#include "graphtrain/gt_comm.h"
#include "graphtrain/gt_config.h"
#include "gt_test.h"

/* ---------------------------------------------------------------- inputs */

/* Values of mixed magnitude (1e6 or 1e-3 times a number in [-0.5, 0.5)), so that another
 * summation order would change the bits. */
static inline float comm_test_value(int rank, int64_t i, int salt)
{
    uint64_t h = gt_hash64(&i, sizeof i, (uint64_t)(rank * 131 + salt));
    float mag = (h >> 60) & 1 ? 1e6f : 1e-3f;
    return mag * ((float)(h & 0xffff) / 65536.0f - 0.5f);
}

/* Rank `rank`'s input of `salt`: comm_test_value per element (i32 tensors: a hash of the element,
 * which wraps when summed). */
static inline void comm_test_fill(gt_tensor *t, int rank, int salt)
{
    for (int64_t i = 0; i < gt_tensor_numel(t); i++) {
        if (t->dtype == GT_I32)
            ((int32_t *)t->data)[i] = (int32_t)(gt_hash64(&i, sizeof i, (uint64_t)(rank + salt)));
        else
            gt_tensor_set_f32(t, i, comm_test_value(rank, i, salt));
    }
}

/* Same dtype, same size, same bytes. */
static inline bool comm_test_same_bits(const gt_tensor *a, const gt_tensor *b)
{
    size_t n = gt_tensor_nbytes(a);
    return a->data && b->data && a->dtype == b->dtype && n == gt_tensor_nbytes(b) &&
           memcmp(a->data, b->data, n) == 0;
}

/* ---------------------------------------------------------------- communicator checks */

/* All ranks of c hold identical bytes of t: gathered and compared against rank 0's copy. */
static inline bool comm_test_identical_on_all_ranks(gt_comm *c, const gt_tensor *t)
{
    gt_error err = {0};
    int64_t shape[1] = {(int64_t)gt_tensor_nbytes(t)}, all_shape[1] = {shape[0] * c->size};
    gt_tensor bytes, all;
    gt_tensor_wrap(&bytes, GT_BOOL, 1, shape, t->data);
    gt_tensor_alloc(&all, GT_BOOL, 1, all_shape, &err);
    bool ok = gt_comm_all_gather(c, &bytes, &all, &err) == GT_OK;
    for (int r = 1; ok && r < c->size; r++)
        ok = memcmp(all.data, (char *)all.data + r * shape[0], (size_t)shape[0]) == 0;
    gt_tensor_free(&all);
    return ok;
}

/* An all-reduce over c of numel elements of dt (out of place, or in place) of the inputs
 * comm_test_fill(rank, salt 1) (i64: rank * 1000003 + i * 7), against the naive rank-order sum:
 * f32 accumulation; for bf16 the sum of the bf16 inputs rounded once. identical: also check that
 * every rank holds the same bits. */
static inline void comm_test_all_reduce(gt_comm *c, gt_dtype dt, int64_t numel, bool in_place,
                                        bool identical)
{
    gt_error err = {0};
    int64_t shape[1] = {numel};
    gt_tensor in, out;
    gt_tensor_alloc(&in, dt, 1, shape, &err);
    gt_tensor_alloc(&out, dt, 1, shape, &err);
    if (dt == GT_I64)
        for (int64_t i = 0; i < numel; i++)
            ((int64_t *)in.data)[i] = c->rank * 1000003 + i * 7;
    else
        comm_test_fill(&in, c->rank, 1);
    gt_tensor *res = in_place ? &in : &out;
    EXPECT_OK(gt_comm_all_reduce(c, &in, res, &err), &err);
    int bad = 0;
    for (int64_t i = 0; i < numel; i++) {
        if (dt == GT_I64) {
            int64_t ref = 0;
            for (int r = 0; r < c->size; r++)
                ref += r * 1000003 + i * 7;
            bad += ((int64_t *)res->data)[i] != ref;
            continue;
        }
        float ref = 0.0f;
        for (int r = 0; r < c->size; r++) {
            float x = comm_test_value(r, i, 1);
            if (dt == GT_BF16) x = gt_bf16_to_f32(gt_f32_to_bf16(x));
            ref = r == 0 ? x : ref + x;
        }
        if (dt == GT_BF16)
            bad += ((uint16_t *)res->data)[i] != gt_f32_to_bf16(ref);
        else
            bad += memcmp(&ref, (float *)res->data + i, sizeof ref) != 0;
    }
    EXPECT(bad == 0,
           "rank %d: all_reduce %s numel %lld%s: %d elements differ from the rank-order sum",
           c->rank, gt_dtype_name(dt), (long long)numel, in_place ? " in place" : "", bad);
    if (identical)
        EXPECT(comm_test_identical_on_all_ranks(c, res), "all_reduce bits identical on every rank");
    gt_tensor_free(&in), gt_tensor_free(&out);
}

/* The collectives that move data, over c (n ranks), with [3, 5] blocks: all_gather (block r of
 * the output is rank r's input), reduce_scatter (my block of the rank-order sum), all_to_all
 * (block i of my output is block `rank` of rank i's input), broadcast from the last rank and
 * gather to every rank in turn. */
static inline void comm_test_moves(gt_comm *c)
{
    gt_error err = {0};
    int n = c->size, k = 3, cols = 5;
    int64_t s_small[2] = {k, cols}, s_big[2] = {(int64_t)n * k, cols}, blk = (int64_t)k * cols;
    gt_tensor small, big, big2;
    gt_tensor_alloc(&small, GT_F32, 2, s_small, &err);
    gt_tensor_alloc(&big, GT_F32, 2, s_big, &err);
    gt_tensor_alloc(&big2, GT_F32, 2, s_big, &err);

    comm_test_fill(&small, c->rank, 2);
    EXPECT_OK(gt_comm_all_gather(c, &small, &big, &err), &err);
    int bad = 0;
    for (int r = 0; r < n; r++)
        for (int64_t i = 0; i < blk; i++)
            bad += ((float *)big.data)[r * blk + i] != comm_test_value(r, i, 2);
    EXPECT(bad == 0, "rank %d: all_gather: %d elements differ", c->rank, bad);

    comm_test_fill(&big, c->rank, 3);
    EXPECT_OK(gt_comm_reduce_scatter(c, &big, &small, &err), &err);
    bad = 0;
    for (int64_t i = 0; i < blk; i++) {
        float ref = 0.0f;
        for (int r = 0; r < n; r++) {
            float x = comm_test_value(r, c->rank * blk + i, 3);
            ref = r == 0 ? x : ref + x;
        }
        bad += memcmp(&ref, (float *)small.data + i, sizeof ref) != 0;
    }
    EXPECT(bad == 0, "rank %d: reduce_scatter: %d elements differ from the rank-order sum", c->rank,
           bad);

    EXPECT_OK(gt_comm_all_to_all(c, &big, &big2, &err), &err);
    bad = 0;
    for (int i = 0; i < n; i++)
        for (int64_t e = 0; e < blk; e++)
            bad += ((float *)big2.data)[i * blk + e] != comm_test_value(i, c->rank * blk + e, 3);
    EXPECT(bad == 0, "rank %d: all_to_all: %d elements differ", c->rank, bad);

    int root = n - 1;
    comm_test_fill(&small, c->rank, 4);
    EXPECT_OK(gt_comm_broadcast(c, &small, root, &err), &err);
    bad = 0;
    for (int64_t i = 0; i < blk; i++)
        bad += ((float *)small.data)[i] != comm_test_value(root, i, 4);
    EXPECT(bad == 0, "rank %d: broadcast from %d: %d elements differ", c->rank, root, bad);

    /* gather to each root in turn: root's output has every rank's block in rank order; the
     * others' outputs have no storage (a gather's senders never touch theirs) */
    for (int g = 0; g < n; g++) {
        comm_test_fill(&small, c->rank, 5 + g);
        memset(big.data, 0, gt_tensor_nbytes(&big));
        gt_tensor out = big;
        if (c->rank != g) out.data = NULL;
        EXPECT_OK(gt_comm_gather(c, &small, &out, g, &err), &err);
        bad = 0;
        for (int r = 0; r < n && c->rank == g; r++)
            for (int64_t i = 0; i < blk; i++)
                bad += ((float *)big.data)[r * blk + i] != comm_test_value(r, i, 5 + g);
        EXPECT(bad == 0, "rank %d: gather to %d: %d elements differ", c->rank, g, bad);
    }
    gt_tensor_free(&small), gt_tensor_free(&big), gt_tensor_free(&big2);
}

/* The 16-bit inputs of the widening tests: rank r's element i is comm_test_value (salt 8), times
 * 1e-2 for f16 so that the 1e6 magnitudes stay finite, rounded to dt (bf16 or f16, nearest
 * even); comm_test_widen16 gives its exact f32 value. */
static inline uint16_t comm_test_value16(gt_dtype dt, int rank, int64_t i)
{
    float x = comm_test_value(rank, i, 8);
    return dt == GT_BF16 ? gt_f32_to_bf16(x) : gt_f32_to_f16(x * 1e-2f);
}

static inline float comm_test_widen16(gt_dtype dt, uint16_t h)
{
    return dt == GT_BF16 ? gt_bf16_to_f32(h) : gt_f16_to_f32(h);
}

/* A widening reduce_scatter over c (gt_comm.h): rank r's input [n*rows, cols] of dt (bf16 or f16,
 * comm_test_value16) into an f32 output [rows, cols]. Its bits must equal (a) the f32
 * reduce_scatter over c of the inputs widened on the host and (b) the naive rank-order f32 sum of
 * the widened inputs. Then the dtype pairs every communicator refuses, on every rank at the start
 * (so no rank is left waiting): f32 into bf16, bf16 into f16, and all_reduce / all_gather of bf16
 * into f32. */
static inline void comm_test_reduce_scatter_widen(gt_comm *c, gt_dtype dt, int64_t rows,
                                                  int64_t cols)
{
    gt_error err = {0};
    int n = c->size;
    int64_t s_in[2] = {n * rows, cols}, s_out[2] = {rows, cols}, blk = rows * cols;
    gt_tensor in, wide, got, ref;
    gt_tensor_alloc(&in, dt, 2, s_in, &err);
    gt_tensor_alloc(&wide, GT_F32, 2, s_in, &err);
    gt_tensor_alloc(&got, GT_F32, 2, s_out, &err);
    gt_tensor_alloc(&ref, GT_F32, 2, s_out, &err);
    for (int64_t i = 0; i < n * blk; i++) {
        uint16_t h = comm_test_value16(dt, c->rank, i);
        ((uint16_t *)in.data)[i] = h;
        ((float *)wide.data)[i] = comm_test_widen16(dt, h);
    }
    memset(got.data, 0xff, gt_tensor_nbytes(&got));
    EXPECT_OK(gt_comm_reduce_scatter(c, &in, &got, &err), &err);
    EXPECT_OK(gt_comm_reduce_scatter(c, &wide, &ref, &err), &err);
    int bad_ref = 0, bad_naive = 0;
    for (int64_t i = 0; i < blk; i++) {
        float naive = 0.0f;
        for (int r = 0; r < n; r++) {
            float x = comm_test_widen16(dt, comm_test_value16(dt, r, c->rank * blk + i));
            naive = r == 0 ? x : naive + x;
        }
        bad_ref += memcmp((float *)got.data + i, (float *)ref.data + i, sizeof(float)) != 0;
        bad_naive += memcmp((float *)got.data + i, &naive, sizeof naive) != 0;
    }
    EXPECT(bad_ref == 0 && bad_naive == 0,
           "rank %d: reduce_scatter %s -> f32 [%lld, %lld]: %d elements differ from the f32 "
           "reduce_scatter of the widened inputs, %d from the rank-order sum",
           c->rank, gt_dtype_name(dt), (long long)rows, (long long)cols, bad_ref, bad_naive);

    /* refused: any other dtype change, and any change by another collective */
    gt_tensor out16, out_other, wide_out;
    gt_tensor_alloc(&out16, dt, 2, s_out, &err);
    gt_tensor_alloc(&out_other, dt == GT_BF16 ? GT_F16 : GT_BF16, 2, s_out, &err);
    gt_tensor_alloc(&wide_out, GT_F32, 2, s_in, &err);
    char rank_s[32];
    snprintf(rank_s, sizeof rank_s, "rank %d", c->rank);
    struct {
        gt_coll_kind kind;
        const gt_tensor *in;
        gt_tensor *out;
        const char *what;
    } refused[3] = {{GT_COLL_REDUCE_SCATTER, &wide, &out16, "reduce_scatter f32 -> 16-bit"},
                    {GT_COLL_REDUCE_SCATTER, &in, &out_other, "reduce_scatter bf16 <-> f16"},
                    {GT_COLL_ALL_REDUCE, &in, &wide_out, "all_reduce 16-bit -> f32"}};
    for (int k = 0; k < 3; k++) {
        gt_error e = {0};
        gt_status st = refused[k].kind == GT_COLL_REDUCE_SCATTER
                           ? gt_comm_reduce_scatter(c, refused[k].in, refused[k].out, &e)
                           : gt_comm_all_reduce(c, refused[k].in, refused[k].out, &e);
        EXPECT(st == GT_ERR_SHAPE && strstr(e.msg, rank_s) &&
                   strstr(e.msg, gt_coll_kind_name(refused[k].kind)) && strstr(e.msg, "dtype"),
               "%s: refused with a message naming the rank, the collective and the dtypes (%s)",
               refused[k].what, e.msg);
    }
    gt_tensor gathered;
    int64_t s_gather[2] = {n * n * rows, cols};
    gt_tensor_alloc(&gathered, GT_F32, 2, s_gather, &err);
    gt_error e = {0};
    EXPECT(gt_comm_all_gather(c, &in, &gathered, &e) == GT_ERR_SHAPE &&
               strstr(e.msg, "all_gather") && strstr(e.msg, "dtype"),
           "all_gather 16-bit -> f32 refused: %s", e.msg);
    gt_tensor_free(&in), gt_tensor_free(&wide), gt_tensor_free(&got), gt_tensor_free(&ref);
    gt_tensor_free(&out16), gt_tensor_free(&out_other), gt_tensor_free(&wide_out);
    gt_tensor_free(&gathered);
}

/* ---------------------------------------------------------------- graphs with collectives */

/* The mesh dp_replicate x dp_shard x tp of the given sizes. */
static inline void comm_test_set_mesh(gt_graph *g, int replicate, int shard, int tp)
{
    static const char *const names[3] = {"dp_replicate", "dp_shard", "tp"};
    int sizes[3] = {replicate, shard, tp};
    g->mesh.ndim = 3;
    for (int d = 0; d < 3; d++) {
        g->mesh.size[d] = sizes[d];
        g->mesh.name[d] = gt_graph_intern(g, names[d]);
    }
}

/* A collective's start node over mesh dim `dim` (a group of `size` ranks); returns its output. */
static inline gt_value_id comm_test_start(gt_graph *g, gt_op op, gt_value_id x, int64_t dim,
                                          int64_t size)
{
    gt_attrs a = {0};
    a.i[0] = dim;
    a.i[1] = size;
    a.ni = 2;
    return gt_graph_add_node(g, op, &x, 1, &a, NULL);
}

/* start + wait (the wait also reads x, keeping the start's input alive); returns the wait's
 * output. */
static inline gt_value_id comm_test_coll(gt_graph *g, gt_op op, gt_value_id x, int64_t dim,
                                         int64_t size)
{
    gt_value_id s = comm_test_start(g, op, x, dim, size);
    gt_value_id in[2] = {s, x};
    return gt_graph_add_node(g, GT_OP_WAIT, in, 2, NULL, NULL);
}

/* ------------------------------------------------ 1-D mesh: dp_shard = world
 *
 * Per rank r (n ranks, b = 3 rows, 5 columns):
 *   x_r [b, 5], p_r [n*b, 5] (rank inputs), full [n*b, 5] (the same on every rank)
 *   x2 = x + full[r*b : r*b + b]     the slice's bounds use the symbol rank.dp_shard
 *   g  = all_gather(-x2)             [n*b, 5]
 *   h  = g * p
 *   s  = reduce_scatter(h)           [b, 5]: rows r*b.. of sum_q h_q
 *   u  = all_reduce(s + x)           [b, 5]
 *   v  = all_reduce(cast(x, bf16))   [b, 5] bf16
 *   a  = all_to_all(p)               [n*b, 5]: block q is rank q's p at block r
 * outputs g, s, u, v, a. Bind b = COMM_TEST_ROWS. */
enum { COMM_TEST_ROWS = 3, COMM_TEST_COLS = 5 };

static inline gt_graph *comm_test_build_1d(int n)
{
    gt_graph *g = gt_graph_new();
    comm_test_set_mesh(g, 1, n, 1);
    gt_expr b = gt_sym_var(g->sym, "b"), r = gt_sym_var(g->sym, "rank.dp_shard");
    gt_expr nb = gt_sym_mul(g->sym, gt_c(g, n), b);
    gt_expr dx[2] = {b, gt_c(g, COMM_TEST_COLS)}, dp[2] = {nb, gt_c(g, COMM_TEST_COLS)};
    gt_value_id x = gt_graph_add_input(g, GT_IN_INPUT, "x", GT_F32, 2, dx);
    gt_value_id p = gt_graph_add_input(g, GT_IN_INPUT, "p", GT_F32, 2, dp);
    gt_value_id full = gt_graph_add_input(g, GT_IN_INPUT, "full", GT_F32, 2, dp);
    gt_expr lo = gt_sym_mul(g->sym, r, b);
    gt_value_id x2 = gt_add(g, x, gt_slice(g, full, 0, lo, gt_sym_add(g->sym, lo, b)));
    gt_value_id gat = comm_test_coll(g, GT_OP_ALL_GATHER_START, gt_unary(g, GT_OP_NEG, x2), 1, n);
    gt_value_id s = comm_test_coll(g, GT_OP_REDUCE_SCATTER_START, gt_mul(g, gat, p), 1, n);
    gt_value_id u = comm_test_coll(g, GT_OP_ALL_REDUCE_START, gt_add(g, s, x), 1, n);
    gt_value_id v = comm_test_coll(g, GT_OP_ALL_REDUCE_START, gt_cast(g, x, GT_BF16), 1, n);
    gt_value_id a = comm_test_coll(g, GT_OP_ALL_TO_ALL_START, p, 1, n);
    gt_graph_add_output(g, GT_OUT_METRIC, "g", gat);
    gt_graph_add_output(g, GT_OUT_METRIC, "s", s);
    gt_graph_add_output(g, GT_OUT_METRIC, "u", u);
    gt_graph_add_output(g, GT_OUT_METRIC, "v", v);
    gt_graph_add_output(g, GT_OUT_METRIC, "a", a);
    return g;
}

/* ------------------------------------------------ 2-D mesh: dp_shard x tp
 *
 * n ranks = d x 2 (d = n / 2), rank = dp * 2 + tp (tp fastest). Per rank, x [2, 3]:
 *   a = all_gather over tp of x            [4, 3]: x of (dp, 0) then (dp, 1)
 *   s = reduce_scatter over dp_shard of a  [4/d, 3]: rows dp*4/d.. of sum over dp' of a(dp', tp)
 *   u = all_reduce over tp of s * 2        [4/d, 3]
 * outputs a, u. With d = 1 the dp_shard collectives run over one rank, with no communicator. */
static inline gt_graph *comm_test_build_2d(int d)
{
    gt_graph *g = gt_graph_new();
    comm_test_set_mesh(g, 1, d, 2);
    gt_expr dx[2] = {gt_c(g, 2), gt_c(g, 3)};
    gt_value_id x = gt_graph_add_input(g, GT_IN_INPUT, "x", GT_F32, 2, dx);
    gt_value_id a = comm_test_coll(g, GT_OP_ALL_GATHER_START, x, 2, 2);
    gt_value_id s = comm_test_coll(g, GT_OP_REDUCE_SCATTER_START, a, 1, d);
    gt_value_id u = comm_test_coll(g, GT_OP_ALL_REDUCE_START, gt_scale(g, s, 2.0), 2, 2);
    gt_graph_add_output(g, GT_OUT_METRIC, "a", a);
    gt_graph_add_output(g, GT_OUT_METRIC, "u", u);
    return g;
}

/* ---------------------------------------------------------------- configs */

#define COMM_TEST_TINY_MAX_EXTRA 16

/* Defaults, then test_tiny with 2 sequences of 8 tokens per rank, then `extra` (command-line
 * spelling: "--name", "value", ...). */
static inline gt_status comm_test_tiny_config(gt_config *cfg, char **extra, int n_extra,
                                              gt_error *err)
{
    char *argv[6 + COMM_TEST_TINY_MAX_EXTRA] = {
        "--model.flavor",     "test_tiny", "--training.local_batch_size", "2",
        "--training.seq_len", "8"};
    gt_config_defaults(cfg);
    if (n_extra < 0 || n_extra > COMM_TEST_TINY_MAX_EXTRA)
        return gt_error_set(err, GT_ERR_INVALID,
                            "comm_test_tiny_config: %d extra arguments (at "
                            "most %d)",
                            n_extra, COMM_TEST_TINY_MAX_EXTRA);
    for (int k = 0; k < n_extra; k++)
        argv[6 + k] = extra[k];
    return gt_config_apply_overrides(cfg, 6 + n_extra, argv, err);
}

/* ---------------------------------------------------------------- launching */

/* A TCP port nobody listens on now on the loopback interface (the kernel's pick for port 0), or
 * -1. */
static inline int comm_test_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    socklen_t len = sizeof a;
    int port = -1;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

/* The variables of a torchrun-style rendezvous in this process's environment: MASTER_ADDR,
 * MASTER_PORT, RANK, WORLD_SIZE. */
static inline void comm_test_set_rank_env(const char *addr, int port, int rank, int size)
{
    char v[32];
    setenv("MASTER_ADDR", addr, 1);
    snprintf(v, sizeof v, "%d", port);
    setenv("MASTER_PORT", v, 1);
    snprintf(v, sizeof v, "%d", rank);
    setenv("RANK", v, 1);
    snprintf(v, sizeof v, "%d", size);
    setenv("WORLD_SIZE", v, 1);
}

/* The MPI world of a test run under mpirun, which must have 2 ranks or more (and at most
 * max_size when max_size > 0). NULL when there is none: the caller returns gt_test_finish(). */
static inline gt_comm *comm_test_mpi_world(int *argc, char ***argv, int max_size)
{
    gt_error err = {0};
    gt_comm *world = NULL;
    EXPECT_OK(gt_comm_mpi_world(argc, argv, &world, &err), &err);
    if (!world) return NULL;
    int n = gt_comm_size(world);
    if (max_size > 0)
        EXPECT(n >= 2 && n <= max_size, "run under mpirun -np 2..%d (size %d)", max_size, n);
    else
        EXPECT(n >= 2, "run under mpirun -np >= 2 (size %d)", n);
    return world;
}

/* The end of an MPI test: destroys the world, finalizes MPI, returns gt_test_finish(). */
static inline int comm_test_mpi_end(gt_comm *world)
{
    gt_error err = {0};
    gt_comm_destroy(world);
    EXPECT_OK(gt_comm_mpi_finalize(&err), &err);
    return gt_test_finish();
}

#endif
