/* tcp_setup.c — joining the ranks of a TCP communicator (gt_comm_tcp_world); the protocol is
 * described at the top of tcp.c. */
#include "comm/tcp_internal.h"

/* ---------------------------------------------------------------- setup */

static int bound_port(int fd)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &len) != 0) return -1;
    if (ss.ss_family == AF_INET6) return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    return ntohs(((struct sockaddr_in *)&ss)->sin_port);
}

/* The numeric address a connection came from ("10.0.0.2"; IPv4-mapped IPv6 shown as IPv4). */
static void peer_address(int fd, char *buf, size_t cap)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    snprintf(buf, cap, "127.0.0.1");
    if (getpeername(fd, (struct sockaddr *)&ss, &len) != 0) return;
    if (ss.ss_family == AF_INET6) {
        struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&ss;
        if (IN6_IS_ADDR_V4MAPPED(&a6->sin6_addr))
            inet_ntop(AF_INET, &a6->sin6_addr.s6_addr[12], buf, (socklen_t)cap);
        else
            inet_ntop(AF_INET6, &a6->sin6_addr, buf, (socklen_t)cap);
    } else {
        inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, buf, (socklen_t)cap);
    }
}

/* Connects to addr:port and sends the hello (rank, size[, listening port]), retrying until the
 * deadline while the other side is not listening yet. Returns the fd or -1 with why filled. */
static int connect_hello(const char *addr, int port, int rank, int size, int my_port,
                         double deadline, char *why, size_t why_len)
{
    for (;;) {
        int fd = gt_socket_connect(addr, port, deadline, why, why_len);
        if (fd >= 0) {
            unsigned char h[20];
            put_u32(h, TC_MAGIC);
            put_u32(h + 4, TC_VERSION);
            put_u32(h + 8, (uint32_t)rank);
            put_u32(h + 12, (uint32_t)size);
            put_u32(h + 16, (uint32_t)my_port);
            if (xfer(fd, h, sizeof h, true, deadline) == 0) return fd;
            snprintf(why, why_len, "%s", strerror(errno));
            close(fd);
        }
        if (ms_left(deadline) == 0) return -1;
        struct timespec ts = {0, 100 * 1000 * 1000}; /* not listening yet: retry */
        nanosleep(&ts, NULL);
        if (ms_left(deadline) == 0) return -1;
    }
}

/* Lists the ranks in [lo, hi) whose fd is still -1: "1,3". */
static void format_missing(const int *fd, int lo, int hi, char *buf, size_t cap)
{
    size_t used = 0;
    buf[0] = 0;
    for (int r = lo; r < hi && used + 12 < cap; r++)
        if (fd[r] < 0) used += (size_t)snprintf(buf + used, cap - used, "%s%d", used ? "," : "", r);
}

/* Accepts hellos on lfd until every rank in [lo, hi) has one connection in fd[]. Connections that
 * do not speak the protocol are dropped; a wrong world size or a rank seen twice is an error. */
static gt_status accept_ranks(int lfd, int me, int size, int lo, int hi, int *fd, int *ports,
                              char (*addrs)[TC_ADDR], double deadline, double timeout_s,
                              const char *where, gt_error *err)
{
    int missing = 0;
    for (int r = lo; r < hi; r++)
        missing += fd[r] < 0;
    while (missing > 0) {
        int cfd = gt_socket_accept(lfd, deadline);
        if (cfd < 0) break;
        unsigned char h[20];
        /* a stray client gets at most one second to send its hello */
        double hd = gt_now_seconds() + 1.0 < deadline ? gt_now_seconds() + 1.0 : deadline;
        if (xfer(cfd, h, sizeof h, false, hd) != 0 || get_u32(h) != TC_MAGIC ||
            get_u32(h + 4) != TC_VERSION) {
            close(cfd);
            continue;
        }
        uint32_t r = get_u32(h + 8), n = get_u32(h + 12);
        if ((int)n != size || (int)r < lo || (int)r >= hi || fd[r] >= 0) {
            close(cfd);
            return gt_error_set(err, GT_ERR_INVALID,
                                "rank %d: TCP communicator (%s): a peer says it is rank %u of "
                                "WORLD_SIZE %u; expected one of ranks %d..%d of WORLD_SIZE %d not "
                                "yet connected (two processes with the same RANK?)",
                                me, where, r, n, lo, hi - 1, size);
        }
        fd[r] = cfd;
        if (ports) ports[r] = (int)get_u32(h + 16);
        if (addrs) peer_address(cfd, addrs[r], TC_ADDR);
        missing--;
    }
    if (missing == 0) return GT_OK;
    char list[160];
    format_missing(fd, lo, hi, list, sizeof list);
    return gt_error_set(err, GT_ERR_IO,
                        "rank %d: TCP communicator (%s): rank(s) %s did not connect within %.0f s "
                        "(did they start, with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set for "
                        "this job?)",
                        me, where, list, timeout_s);
}

static gt_status env_int(const char *name, int lo, int hi, int *out, gt_error *err)
{
    const char *v = getenv(name);
    if (!v || !v[0])
        return gt_error_set(err, GT_ERR_INVALID,
                            "TCP communicator: environment variable %s is not set (launchers such "
                            "as torchrun set RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)",
                            name);
    char *end = NULL;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi)
        return gt_error_set(err, GT_ERR_INVALID,
                            "TCP communicator: environment variable %s='%s' is not an integer in "
                            "[%d, %d]",
                            name, v, lo, hi);
    *out = (int)x;
    return GT_OK;
}

/* Rank 0: the peers' hellos on MASTER_PORT, then the table of every rank's address. */
static gt_status setup_rank0(int port, tcp_net *net, double deadline, double timeout_s,
                             gt_error *err)
{
    int size = net->size;
    char why[160] = "";
    int lfd = gt_socket_listen(port, SOMAXCONN, why, sizeof why);
    if (lfd < 0)
        return gt_error_set(err, GT_ERR_IO, "rank 0: TCP communicator: %s (MASTER_PORT)", why);
    int *ports = gt_xcalloc((size_t)size, sizeof *ports);
    char(*addrs)[TC_ADDR] = gt_xcalloc((size_t)size, TC_ADDR);
    char where[64];
    snprintf(where, sizeof where, "rendezvous on MASTER_PORT %d", port);
    gt_status st =
        accept_ranks(lfd, 0, size, 1, size, net->fd, ports, addrs, deadline, timeout_s, where, err);
    close(lfd);
    if (st == GT_OK) {
        size_t tb = (size_t)size * (4 + TC_ADDR);
        unsigned char *table = gt_xcalloc(tb, 1);
        for (int r = 0; r < size; r++) {
            put_u32(table + (size_t)r * (4 + TC_ADDR), (uint32_t)ports[r]);
            memcpy(table + (size_t)r * (4 + TC_ADDR) + 4, addrs[r], TC_ADDR);
        }
        for (int r = 1; r < size && st == GT_OK; r++)
            if (xfer(net->fd[r], table, tb, true, deadline) != 0)
                st = gt_error_set(err, GT_ERR_IO,
                                  "rank 0: TCP communicator: sending the address table to rank %d "
                                  "failed: %s (that rank died?)",
                                  r, strerror(errno));
        free(table);
    }
    free(ports);
    free(addrs);
    return st;
}

/* Rank r > 0: hello to rank 0, the table, connect to ranks 1..r-1, accept ranks r+1..size-1. */
static gt_status setup_peer(const char *addr, int port, tcp_net *net, double deadline,
                            double timeout_s, gt_error *err)
{
    int me = net->rank, size = net->size;
    char why[160] = "no attempt";
    int lfd = gt_socket_listen(0, SOMAXCONN, why, sizeof why);
    if (lfd < 0) return gt_error_set(err, GT_ERR_IO, "rank %d: TCP communicator: %s", me, why);
    gt_status st = GT_OK;
    net->fd[0] = connect_hello(addr, port, me, size, bound_port(lfd), deadline, why, sizeof why);
    if (net->fd[0] < 0) {
        close(lfd);
        return gt_error_set(err, GT_ERR_IO,
                            "rank %d: TCP communicator: no answer from rank 0 at %s:%d within %.0f "
                            "s (last error: %s; is rank 0 running, are MASTER_ADDR/MASTER_PORT "
                            "right?)",
                            me, addr, port, timeout_s, why);
    }
    size_t tb = (size_t)size * (4 + TC_ADDR);
    unsigned char *table = gt_xmalloc(tb);
    if (xfer(net->fd[0], table, tb, false, deadline) != 0)
        st = gt_error_set(err, GT_ERR_IO,
                          "rank %d: TCP communicator: rank 0 at %s:%d did not send the address "
                          "table within %.0f s (%s): some rank never connected to it, or rank 0 "
                          "failed",
                          me, addr, port, timeout_s, strerror(errno));
    for (int j = 1; j < me && st == GT_OK; j++) {
        const unsigned char *e = table + (size_t)j * (4 + TC_ADDR);
        char host[TC_ADDR];
        memcpy(host, e + 4, TC_ADDR);
        host[TC_ADDR - 1] = 0;
        int jp = (int)get_u32(e);
        net->fd[j] = connect_hello(host, jp, me, size, 0, deadline, why, sizeof why);
        if (net->fd[j] < 0)
            st = gt_error_set(err, GT_ERR_IO,
                              "rank %d: TCP communicator: cannot connect to rank %d at %s:%d "
                              "within %.0f s (%s): that rank died?",
                              me, j, host, jp, timeout_s, why);
    }
    free(table);
    if (st == GT_OK)
        st = accept_ranks(lfd, me, size, me + 1, size, net->fd, NULL, NULL, deadline, timeout_s,
                          "mesh", err);
    close(lfd);
    return st;
}

gt_status gt_comm_tcp_world(double timeout_seconds, gt_comm **out, gt_error *err)
{
    *out = NULL;
    int rank = 0, size = 0, port = 0;
    GT_TRY(env_int("WORLD_SIZE", 1, 1 << 20, &size, err));
    GT_TRY(env_int("RANK", 0, size - 1, &rank, err));
    const char *addr = getenv("MASTER_ADDR");
    if (size > 1 && (!addr || !addr[0]))
        return gt_error_set(err, GT_ERR_INVALID,
                            "TCP communicator: environment variable MASTER_ADDR is not set "
                            "(launchers such as torchrun set RANK, WORLD_SIZE, MASTER_ADDR, "
                            "MASTER_PORT)");
    if (size > 1) GT_TRY(env_int("MASTER_PORT", 1, 65535, &port, err));
    tcp_net *net = gt_xcalloc(1, sizeof *net);
    net->refs = 1;
    net->rank = rank;
    net->size = size;
    net->timeout_s = timeout_seconds;
    net->fd = gt_xmalloc(sizeof *net->fd * (size_t)size);
    net->peer = gt_xcalloc((size_t)size, sizeof *net->peer);
    for (int r = 0; r < size; r++)
        net->fd[r] = -1;
    double setup_s = timeout_seconds > 0 ? timeout_seconds : TC_SETUP_DEFAULT_S;
    double deadline = gt_now_seconds() + setup_s;
    gt_status st = GT_OK;
    if (size > 1)
        st = rank == 0 ? setup_rank0(port, net, deadline, setup_s, err)
                       : setup_peer(addr, port, net, deadline, setup_s, err);
    if (st != GT_OK) {
        gt_tcp_net_release(net);
        return st;
    }
    for (int r = 0; r < size; r++) /* already non-blocking (connect or accept) */
        if (net->fd[r] >= 0) set_nodelay(net->fd[r]);
    int *world = gt_xmalloc(sizeof *world * (size_t)size);
    for (int r = 0; r < size; r++)
        world[r] = r;
    *out = gt_tcp_wrap(net, world, rank, size, 0x77726c64u /* "wrld" */, "world");
    return GT_OK;
}
