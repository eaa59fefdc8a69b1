/* socket_util.h — small helpers for non-blocking TCP sockets with deadlines, shared by the TCP
 * communicator (tcp.c, tcp_setup.c) and the NCCL id rendezvous (tcp_rendezvous.c). Every wait is
 * a poll bounded by a deadline (CLOCK_MONOTONIC seconds), so nothing here blocks past it. */
#ifndef GRAPHTRAIN_SOCKET_UTIL_H
#define GRAPHTRAIN_SOCKET_UTIL_H

#include "graphtrain/gt_core.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static inline int ms_left(double deadline)
{
    double left = deadline - gt_now_seconds();
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

/* The next connection on the listening socket lfd, accepted before the deadline and made
 * non-blocking; -1 when the deadline passes (or poll fails) first. */
static inline int gt_socket_accept(int lfd, double deadline)
{
    for (;;) {
        struct pollfd pf = {lfd, POLLIN, 0};
        int ms = ms_left(deadline);
        if (ms == 0) return -1;
        int pr = poll(&pf, 1, ms);
        if (pr < 0 && errno != EINTR) return -1;
        if (pr <= 0) continue;
        int fd = accept(lfd, NULL, NULL);
        if (fd < 0) continue;
        set_nonblocking(fd);
        return fd;
    }
}

/* A non-blocking listening socket on port (0: any free port) on every interface, with the given
 * backlog: IPv6 dual-stack, or IPv4 when the host has no IPv6. -1 with why filled on failure. */
int gt_socket_listen(int port, int backlog, char *why, size_t why_len);
/* One non-blocking connect to any address of addr:port before the deadline; the socket is left
 * non-blocking. -1 with why filled when none answers. */
int gt_socket_connect(const char *addr, int port, double deadline, char *why, size_t why_len);

#endif
