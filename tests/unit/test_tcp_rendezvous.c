/* test_tcp_rendezvous.c — the TCP rendezvous behind gt_comm_nccl_create_tcp, with forked
 * processes on the loopback interface:
 *   - 4 ranks: every peer receives rank 0's bytes exactly, whichever rank starts first (the
 *     peers start before rank 0 listens and must retry);
 *   - rank 0 whose peer never comes fails within its timeout naming the missing rank;
 *   - a peer with no rank 0 fails within its timeout naming the address;
 *   - a peer that claims another world size makes rank 0 fail naming both sizes;
 *   - bad arguments (rank outside the world, port 0) are errors, not hangs. */
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "comm/tcp_rendezvous.h"
#include "gt_test.h"

/* A port that was free a moment ago (bound to port 0, read, released). */
static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        if (fd >= 0) close(fd);
        return 0;
    }
    close(fd);
    return ntohs(a.sin_port);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void blob_of(unsigned char *b, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        b[i] = (unsigned char)(i * 37u + seed * 11u + 5u);
}

/* A child rank: exit 0 when it got the expected blob, 1 otherwise. */
static pid_t spawn_peer(int port, int rank, int size, unsigned seed, double timeout_s)
{
    pid_t pid = fork();
    if (pid != 0) return pid;
    unsigned char got[128] = {0}, want[128];
    blob_of(want, sizeof want, seed);
    gt_error err = {0};
    gt_status st =
        gt_tcp_rendezvous("127.0.0.1", port, rank, size, got, sizeof got, timeout_s, &err);
    if (st != GT_OK) fprintf(stderr, "peer %d: %s\n", rank, err.msg);
    _exit(st == GT_OK && memcmp(got, want, sizeof got) == 0 ? 0 : 1);
}

static int wait_exit(pid_t pid)
{
    int status = 0;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
    return WEXITSTATUS(status);
}

static void test_four_ranks(void)
{
    int port = free_port();
    EXPECT(port > 0, "a free port");
    pid_t kids[3];
    for (int r = 1; r < 4; r++)
        kids[r - 1] = spawn_peer(port, r, 4, 3, 20.0);
    struct timespec ts = {0, 300 * 1000 * 1000}; /* peers first: they retry */
    nanosleep(&ts, NULL);
    unsigned char blob[128];
    blob_of(blob, sizeof blob, 3);
    gt_error err = {0};
    EXPECT_OK(gt_tcp_rendezvous("127.0.0.1", port, 0, 4, blob, sizeof blob, 20.0, &err), &err);
    for (int k = 0; k < 3; k++)
        EXPECT(wait_exit(kids[k]) == 0, "rank %d received rank 0's bytes", k + 1);
}

static void test_missing_peer(void)
{
    int port = free_port();
    pid_t kid = spawn_peer(port, 1, 3, 4, 10.0); /* rank 2 never comes */
    unsigned char blob[128];
    blob_of(blob, sizeof blob, 4);
    gt_error err = {0};
    double t0 = now_s();
    gt_status st = gt_tcp_rendezvous("127.0.0.1", port, 0, 3, blob, sizeof blob, 1.0, &err);
    double took = now_s() - t0;
    EXPECT(st == GT_ERR_IO && strstr(err.msg, "missing rank(s) 2") && strstr(err.msg, "2 of 3"),
           "rank 0 names the missing rank: %s", err.msg);
    EXPECT(took < 5.0, "rank 0 gave up within its timeout (%.1f s)", took);
    EXPECT(wait_exit(kid) == 0, "the rank that came was served");
}

static void test_no_server(void)
{
    int port = free_port();
    unsigned char blob[16];
    gt_error err = {0};
    double t0 = now_s();
    gt_status st = gt_tcp_rendezvous("127.0.0.1", port, 1, 2, blob, sizeof blob, 0.5, &err);
    double took = now_s() - t0;
    EXPECT(st == GT_ERR_IO && strstr(err.msg, "no answer from rank 0") &&
               strstr(err.msg, "127.0.0.1"),
           "a peer without rank 0 fails naming the address: %s", err.msg);
    EXPECT(took < 4.0, "the peer gave up within its timeout (%.1f s)", took);
}

static void test_size_mismatch(void)
{
    int port = free_port();
    pid_t kid = spawn_peer(port, 1, 3, 5, 3.0); /* says WORLD_SIZE=3 */
    unsigned char blob[128];
    gt_error err = {0};
    gt_status st = gt_tcp_rendezvous("127.0.0.1", port, 0, 2, blob, sizeof blob, 3.0, &err);
    EXPECT(st == GT_ERR_INVALID && strstr(err.msg, "WORLD_SIZE=3") && strstr(err.msg, "has 2"),
           "rank 0 names both world sizes: %s", err.msg);
    EXPECT(wait_exit(kid) == 1, "the mismatched peer failed too");
}

static void test_bad_args(void)
{
    unsigned char b[4];
    gt_error err = {0};
    EXPECT(gt_tcp_rendezvous("127.0.0.1", 1234, 2, 2, b, 4, 1.0, &err) == GT_ERR_INVALID,
           "rank outside the world");
    EXPECT(gt_tcp_rendezvous("127.0.0.1", 0, 0, 2, b, 4, 1.0, &err) == GT_ERR_INVALID, "port 0");
    EXPECT_OK(gt_tcp_rendezvous("127.0.0.1", 1234, 0, 1, b, 4, 1.0, &err), &err); /* alone */
}

int main(void)
{
    test_four_ranks();
    test_missing_peer();
    test_no_server();
    test_size_mismatch();
    test_bad_args();
    return gt_test_finish();
}
