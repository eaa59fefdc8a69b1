/* tcp_rendezvous.c — rank 0 hands a blob to every other rank over TCP (tcp_rendezvous.h).
 *
 * Protocol (integers big-endian):
 *   peer -> rank 0:  "GTRV" magic, version 1, rank, world size      (4 x u32)
 *   rank 0 -> peer:  "GTRV" magic, blob length, blob bytes
 * Rank 0 keeps one listening socket (IPv6 dual-stack, or IPv4 when the host has no IPv6) and a
 * poll loop over it and the connections still sending their hello; it answers each valid hello at
 * once and closes that connection. Every socket is non-blocking and every wait is a poll bounded
 * by the one deadline, so nothing here can block past timeout_s. */
#include "tcp_rendezvous.h"

#include "comm/socket_util.h"

#define RV_MAGIC 0x47545256u /* "GTRV" */
#define RV_VERSION 1u
#define RV_MAX_PENDING 64

/* ---------------------------------------------------------------- rank 0 */

/* Reads a hello from a new connection and, when it is valid, answers it. Returns 1 when a new
 * rank was served, 0 for a connection to drop silently, -1 with err set for a fatal mismatch. */
static int serve_one(int fd, int size, bool *seen, const void *blob, size_t len, double deadline,
                     int port, gt_error *err)
{
    /* a hello is 16 bytes; a stray client gets at most one second to send it */
    double hello_deadline = gt_now_seconds() + 1.0 < deadline ? gt_now_seconds() + 1.0 : deadline;
    unsigned char h[16];
    if (xfer(fd, h, sizeof h, false, hello_deadline) != 0) return 0;
    if (get_u32(h) != RV_MAGIC || get_u32(h + 4) != RV_VERSION) return 0;
    uint32_t r = get_u32(h + 8), n = get_u32(h + 12);
    if ((int)n != size) {
        gt_error_set(err, GT_ERR_INVALID,
                     "rank 0: TCP rendezvous on port %d: rank %u says WORLD_SIZE=%u, rank 0 has "
                     "%d",
                     port, r, n, size);
        return -1;
    }
    if (r == 0 || (int)r >= size || seen[r]) {
        gt_error_set(err, GT_ERR_INVALID,
                     "rank 0: TCP rendezvous on port %d: a peer says it is rank %u, which is %s",
                     port, r,
                     r == 0 || (int)r >= size ? "out of range"
                                              : "already connected (two ranks "
                                                "with the same RANK?)");
        return -1;
    }
    unsigned char head[8];
    put_u32(head, RV_MAGIC);
    put_u32(head + 4, (uint32_t)len);
    if (xfer(fd, head, sizeof head, true, deadline) != 0 ||
        xfer(fd, (void *)blob, len, true, deadline) != 0)
        return 0; /* it went away: it will retry or time out on its side */
    seen[r] = true;
    return 1;
}

static gt_status rank0(int port, int size, const void *blob, size_t len, double timeout_s,
                       gt_error *err)
{
    char why[160] = "";
    int lfd = gt_socket_listen(port, RV_MAX_PENDING, why, sizeof why);
    if (lfd < 0)
        return gt_error_set(err, GT_ERR_IO, "rank 0: TCP rendezvous: %s (MASTER_PORT)", why);
    bool *seen = gt_xcalloc((size_t)size, sizeof *seen);
    int served = 0;
    gt_status st = GT_OK;
    double deadline = gt_now_seconds() + timeout_s;
    while (served < size - 1) {
        int fd = gt_socket_accept(lfd, deadline);
        if (fd < 0) break;
        int r = serve_one(fd, size, seen, blob, len, deadline, port, err);
        close(fd);
        if (r < 0) {
            st = GT_ERR_INVALID;
            break;
        }
        served += r;
    }
    close(lfd);
    if (st == GT_OK && served < size - 1) {
        char missing[160] = "";
        size_t used = 0;
        for (int r = 1; r < size && used + 12 < sizeof missing; r++)
            if (!seen[r])
                used += (size_t)snprintf(missing + used, sizeof missing - used, "%s%d",
                                         used ? "," : "", r);
        st = gt_error_set(err, GT_ERR_IO,
                          "rank 0: TCP rendezvous on port %d: %d of %d ranks connected within %.0f "
                          "s; missing rank(s) %s (did they start, with MASTER_ADDR pointing here?)",
                          port, served + 1, size, timeout_s, missing);
    }
    free(seen);
    return st;
}

/* ---------------------------------------------------------------- other ranks */

static gt_status peer(const char *addr, int port, int rank, int size, void *blob, size_t len,
                      double timeout_s, gt_error *err)
{
    double deadline = gt_now_seconds() + timeout_s;
    char why[160] = "no attempt";
    for (;;) {
        int fd = gt_socket_connect(addr, port, deadline, why, sizeof why);
        if (fd >= 0) {
            unsigned char h[16], head[8];
            put_u32(h, RV_MAGIC);
            put_u32(h + 4, RV_VERSION);
            put_u32(h + 8, (uint32_t)rank);
            put_u32(h + 12, (uint32_t)size);
            int rc = xfer(fd, h, sizeof h, true, deadline);
            if (rc == 0) rc = xfer(fd, head, sizeof head, false, deadline);
            if (rc == 0 && (get_u32(head) != RV_MAGIC || get_u32(head + 4) != len)) {
                close(fd);
                return gt_error_set(err, GT_ERR_INVALID,
                                    "rank %d: TCP rendezvous with %s:%d: the server is not a "
                                    "graphtrain rank 0 of this job (bad reply)",
                                    rank, addr, port);
            }
            if (rc == 0) rc = xfer(fd, blob, len, false, deadline);
            int e = errno;
            close(fd);
            if (rc == 0) return GT_OK;
            snprintf(why, sizeof why, "%s", strerror(e));
        }
        if (ms_left(deadline) == 0) break;
        struct timespec ts = {0, 100 * 1000 * 1000}; /* rank 0 may not listen yet: retry */
        nanosleep(&ts, NULL);
        if (ms_left(deadline) == 0) break;
    }
    return gt_error_set(err, GT_ERR_IO,
                        "rank %d: TCP rendezvous: no answer from rank 0 at %s:%d within %.0f s "
                        "(last error: %s; is rank 0 running, are MASTER_ADDR/MASTER_PORT right?)",
                        rank, addr, port, timeout_s, why);
}

gt_status gt_tcp_rendezvous(const char *addr, int port, int rank, int size, void *blob, size_t len,
                            double timeout_s, gt_error *err)
{
    if (size < 1 || rank < 0 || rank >= size)
        return gt_error_set(err, GT_ERR_INVALID,
                            "TCP rendezvous: RANK %d is outside [0, WORLD_SIZE %d)", rank, size);
    if (port <= 0 || port > 65535)
        return gt_error_set(err, GT_ERR_INVALID, "TCP rendezvous: MASTER_PORT %d is not a port",
                            port);
    if (len > UINT32_MAX)
        return gt_error_set(err, GT_ERR_INVALID, "TCP rendezvous: %zu bytes is too much", len);
    if (timeout_s <= 0) timeout_s = 1e9;
    if (size == 1) return GT_OK;
    if (rank == 0) return rank0(port, size, blob, len, timeout_s, err);
    return peer(addr, port, rank, size, blob, len, timeout_s, err);
}
