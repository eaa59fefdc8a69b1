/* tcp_internal.h — what tcp.c (the collectives) and tcp_setup.c (joining the ranks) share: the
 * socket table, the per-communicator state and small socket helpers. Not public API. */
#ifndef GRAPHTRAIN_TCP_INTERNAL_H
#define GRAPHTRAIN_TCP_INTERNAL_H

#include "graphtrain/gt_comm.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define TC_MAGIC 0x47545443u /* "GTTC" */
#define TC_VERSION 1u
#define TC_MSG_MAGIC 0x4754434du /* "GTCM": a collective's message */
#define TC_HDR 24
#define TC_ADDR 64
#define TC_SETUP_DEFAULT_S 30.0
#define TC_KIND_U64 100u /* all_gather_u64's header kind */

/* The sockets of the world, shared by it and every communicator split from it. */
typedef struct {
    int refs;
    int rank, size; /* world */
    int *fd;        /* fd[w]: the stream to world rank w (-1 for this rank) */
    double timeout_s;
    bool broken;
    char why[GT_ERROR_MSG_MAX]; /* the first failure, repeated to later calls */
} tcp_net;

typedef struct {
    tcp_net *net;
    int *world; /* world[i]: the world rank of comm rank i */
    uint32_t tag;
    char members[96]; /* "world ranks 0,2" */
} tcp_impl;

static inline double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline int ms_left(double deadline)
{
    double left = deadline - now_s();
    if (left <= 0) return 0;
    return left > 1e6 ? 1000000000 : (int)(left * 1000.0) + 1;
}

static inline void set_nonblocking(int fd)
{
    int fl = fcntl(fd, F_GETFL, 0);
    if (fl >= 0) fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

static inline void set_nodelay(int fd)
{
    int on = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
}

static inline void put_u32(unsigned char *b, uint32_t v)
{
    uint32_t n = htonl(v);
    memcpy(b, &n, 4);
}

static inline uint32_t get_u32(const unsigned char *b)
{
    uint32_t n;
    memcpy(&n, b, 4);
    return ntohl(n);
}

static inline void put_u64(unsigned char *b, uint64_t v)
{
    put_u32(b, (uint32_t)(v >> 32));
    put_u32(b + 4, (uint32_t)v);
}

static inline uint64_t get_u64(const unsigned char *b)
{
    return ((uint64_t)get_u32(b) << 32) | get_u32(b + 4);
}

/* Sends or receives exactly n bytes on a non-blocking socket before the deadline. Returns 0, or -1
 * with errno (ETIMEDOUT past the deadline, EPIPE when the peer closed). */
static inline int xfer(int fd, void *buf, size_t n, bool out, double deadline)
{
    char *p = buf;
    while (n > 0) {
        ssize_t k = out ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
        if (k > 0) {
            p += k;
            n -= (size_t)k;
            continue;
        }
        if (k == 0) {
            errno = EPIPE;
            return -1;
        }
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) return -1;
        struct pollfd pf = {fd, out ? POLLOUT : POLLIN, 0};
        int ms = ms_left(deadline);
        if (ms == 0 || poll(&pf, 1, ms) == 0) {
            errno = ETIMEDOUT;
            return -1;
        }
    }
    return 0;
}

/* A communicator over net (tcp.c): comm rank i is world rank world[i]. It takes over one of net's
 * references (the caller's) and the world array. */
gt_comm *gt_tcp_wrap(tcp_net *net, int *world, int rank, int size, uint32_t tag, const char *name);
/* Drops a reference to net; the last closes the sockets (tcp.c). */
void gt_tcp_net_release(tcp_net *net);

#endif
