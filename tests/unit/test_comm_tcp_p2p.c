/* test_comm_tcp_p2p.c — point-to-point on the TCP communicator (src/comm/tcp_p2p.c), over forked
 * copies of this test joined by gt_comm_tcp_world on the loopback interface. Payloads are a pure
 * function of (sender, tag, byte), so the receiver checks every byte.
 *   - 2 ranks: both send 24 MB (more than the socket buffers) before receiving, once with the recv
 *     first and once with send_wait_all first: neither may hang;
 *   - tags sent 1, 2, 3, 4 and received 3, 1, 4, 2, and one tag sent twice, received in order;
 *   - a large send still queued when both ranks enter a collective: the collective must not read
 *     the p2p bytes as its own nor hang, and the recv after it gets them;
 *   - 4 ranks: two "pipelines" on split communicators (ranks {0,2} and {1,3}) pass messages to
 *     their peer while world collectives run between the sends and the receives;
 *   - a recv whose sender never sends fails within the timeout naming the peer; a recv whose
 *     sender exited fails naming it too. */
#include "train_child.h" /* first: defines _GNU_SOURCE */

#include <time.h>

#include "distributed/comm_test.h"

#define BIG (24u << 20)

static unsigned char byte_of(int sender, int tag, size_t i)
{
    return (unsigned char)(i * 131u + (size_t)tag * 17u + (size_t)sender * 7u + (i >> 13));
}

static void fill(unsigned char *b, size_t n, int sender, int tag)
{
    for (size_t i = 0; i < n; i++)
        b[i] = byte_of(sender, tag, i);
}

static size_t bad_bytes(const unsigned char *b, size_t n, int sender, int tag)
{
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += b[i] != byte_of(sender, tag, i);
    return bad;
}

/* A flat tensor of 1-byte elements over buf (the communicator moves bytes). */
static gt_tensor bytes_tensor(void *buf, size_t n)
{
    gt_tensor t;
    int64_t shape[1] = {(int64_t)n};
    gt_tensor_wrap(&t, GT_BOOL, 1, shape, buf);
    return t;
}

static void send_bytes(gt_comm *c, unsigned char *buf, size_t n, int peer, int tag)
{
    gt_error err = {0};
    fill(buf, n, gt_comm_rank(c), tag);
    gt_tensor t = bytes_tensor(buf, n);
    EXPECT_OK(gt_comm_send_start(c, &t, peer, tag, &err), &err);
}

/* A recv under tag whose bytes must be the pattern of `pattern` (another tag's). */
static void recv_check_as(gt_comm *c, size_t n, int peer, int tag, int pattern)
{
    gt_error err = {0};
    unsigned char *buf = gt_xmalloc(n + 1);
    gt_tensor t = bytes_tensor(buf, n);
    EXPECT_OK(gt_comm_recv(c, &t, peer, tag, &err), &err);
    size_t bad = bad_bytes(buf, n, peer, pattern);
    EXPECT(bad == 0, "rank %d: %zu of %zu bytes wrong from rank %d under tag %d", gt_comm_rank(c),
           bad, n, peer, tag);
    free(buf);
}

static void recv_check(gt_comm *c, size_t n, int peer, int tag)
{
    recv_check_as(c, n, peer, tag, tag);
}

static void wait_sends(gt_comm *c)
{
    gt_error err = {0};
    EXPECT_OK(gt_comm_send_wait_all(c, &err), &err);
}

static int two_ranks(void)
{
    gt_error err = {0};
    gt_comm *w = NULL;
    EXPECT_OK(gt_comm_tcp_world(20, &w, &err), &err);
    if (!w) return 1;
    int me = gt_comm_rank(w), other = 1 - me;
    unsigned char *big = gt_xmalloc(BIG), *small[5];
    size_t small_n[5] = {0, 1000, 0, 70000, 5};
    for (int k = 0; k < 5; k++)
        small[k] = gt_xmalloc(small_n[k] + 1);

    /* both send first, then receive */
    send_bytes(w, big, BIG, other, 7);
    recv_check(w, BIG, other, 7);
    wait_sends(w);
    /* both send first, then wait for the sends */
    send_bytes(w, big, BIG, other, 8);
    wait_sends(w);
    recv_check(w, BIG, other, 8);

    /* tags out of order (tag 2 empty); tag 4 twice, the second with tag 5's bytes */
    if (me == 0) {
        for (int tag = 1; tag <= 4; tag++)
            send_bytes(w, small[tag], small_n[tag], 1, tag);
        unsigned char again[333];
        fill(again, sizeof again, 0, 5);
        gt_tensor t = bytes_tensor(again, sizeof again);
        EXPECT_OK(gt_comm_send_start(w, &t, 1, 4, &err), &err);
        wait_sends(w);
    } else {
        recv_check(w, small_n[3], 0, 3);
        recv_check(w, small_n[1], 0, 1);
        recv_check(w, small_n[4], 0, 4);
        recv_check_as(w, 333, 0, 4, 5);
        recv_check(w, small_n[2], 0, 2);
    }

    /* a large send queued across a collective */
    if (me == 0) send_bytes(w, big, BIG, 1, 9);
    comm_test_all_reduce(w, GT_F32, 100003, false, false);
    if (me == 1) recv_check(w, BIG, 0, 9);
    wait_sends(w);
    comm_test_all_reduce(w, GT_F32, 5, false, false);

    /* a recv that nothing matches: rank 0 times out naming rank 1, which waits, then exits */
    if (me == 0) {
        gt_comm_set_timeout(w, 1.0);
        unsigned char x[4];
        gt_tensor t = bytes_tensor(x, 4);
        double t0 = now_seconds();
        gt_status st = gt_comm_recv(w, &t, 1, 99, &err);
        double dt = now_seconds() - t0;
        EXPECT(st == GT_ERR_IO && strstr(err.msg, "rank 1") && strstr(err.msg, "tag 99"),
               "unmatched recv: status %d, '%s'", st, err.msg);
        EXPECT(dt < 10.0, "unmatched recv took %.1f s with a 1 s timeout", dt);
        st = gt_comm_send_start(w, &t, 1, 1, &err);
        EXPECT(st != GT_OK && strstr(err.msg, "refused"), "after a failure: %s", err.msg);
    } else {
        struct timespec ts = {3, 0};
        nanosleep(&ts, NULL);
    }
    free(big);
    for (int k = 0; k < 5; k++)
        free(small[k]);
    gt_comm_destroy(w);
    return gt_test_failed_;
}

/* 4 ranks: pipelines {0,2} and {1,3} on split communicators, world collectives in between. */
static int four_ranks(void)
{
    gt_error err = {0};
    gt_comm *w = NULL, *pipe = NULL;
    EXPECT_OK(gt_comm_tcp_world(20, &w, &err), &err);
    if (!w) return 1;
    int me = gt_comm_rank(w);
    EXPECT_OK(gt_comm_split(w, me % 2, me / 2, &pipe, &err), &err);
    if (!pipe) return 1;
    int stage = gt_comm_rank(pipe);
    unsigned char *buf[3];
    for (int k = 0; k < 3; k++)
        buf[k] = gt_xmalloc((1u << 20) + 4);
    for (int mb = 0; mb < 3; mb++) {
        /* the "activation" forward, the "gradient" back, a world collective in between */
        size_t fwd = (size_t)(1u << 20) + (size_t)(me % 2) * 3;
        if (stage == 0) send_bytes(pipe, buf[mb], fwd, 1, 2 * mb);
        comm_test_all_reduce(w, GT_F32, 1001, false, false);
        if (stage == 1) {
            recv_check(pipe, fwd, 0, 2 * mb);
            send_bytes(pipe, buf[mb], fwd / 2, 0, 2 * mb + 1);
        } else {
            recv_check(pipe, fwd / 2, 1, 2 * mb + 1);
        }
    }
    wait_sends(pipe);
    comm_test_all_reduce(w, GT_F32, 7, false, false);
    for (int k = 0; k < 3; k++)
        free(buf[k]);
    gt_comm_destroy(pipe);
    gt_comm_destroy(w);
    return gt_test_failed_;
}

static void run(int n, int (*rank_main)(void), const char *what)
{
    int port = comm_test_free_port();
    pid_t pid[4];
    fflush(NULL);
    for (int r = 0; r < n; r++) {
        pid[r] = fork();
        if (pid[r] == 0) {
            comm_test_set_rank_env("127.0.0.1", port, r, n);
            gt_test_failed_ = 0;
            int failed = rank_main();
            fflush(NULL);
            _exit(failed ? 1 : 0);
        }
    }
    double t0 = now_seconds();
    for (int r = 0; r < n; r++) {
        int rc = pid[r] > 0 ? wait_child(pid[r], 120.0 - (now_seconds() - t0)) : -1;
        EXPECT(rc == 0, "%s: rank %d exited %d (-1: still running)", what, r, rc);
    }
    printf("%s: %.1f s\n", what, now_seconds() - t0);
}

int main(void)
{
    run(2, two_ranks, "point-to-point, 2 ranks");
    run(4, four_ranks, "point-to-point on split communicators, 4 ranks");
    return gt_test_finish();
}
