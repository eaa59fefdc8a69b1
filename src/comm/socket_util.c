/* socket_util.c — listening and connecting with deadlines (socket_util.h). */
#include "comm/socket_util.h"

int gt_socket_listen(int port, int backlog, char *why, size_t why_len)
{
    int fd = socket(AF_INET6, SOCK_STREAM, 0);
    if (fd >= 0) {
        int off = 0, on = 1;
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off);
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
        struct sockaddr_in6 a6;
        memset(&a6, 0, sizeof a6);
        a6.sin6_family = AF_INET6;
        a6.sin6_addr = in6addr_any;
        a6.sin6_port = htons((uint16_t)port);
        if (bind(fd, (struct sockaddr *)&a6, sizeof a6) == 0 && listen(fd, backlog) == 0) {
            set_nonblocking(fd);
            return fd;
        }
        close(fd);
    }
    fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) {
        snprintf(why, why_len, "socket: %s", strerror(errno));
        return -1;
    }
    int on = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
    struct sockaddr_in a4;
    memset(&a4, 0, sizeof a4);
    a4.sin_family = AF_INET;
    a4.sin_addr.s_addr = htonl(INADDR_ANY);
    a4.sin_port = htons((uint16_t)port);
    if (bind(fd, (struct sockaddr *)&a4, sizeof a4) != 0 || listen(fd, backlog) != 0) {
        snprintf(why, why_len, "cannot listen on port %d: %s", port, strerror(errno));
        close(fd);
        return -1;
    }
    set_nonblocking(fd);
    return fd;
}

int gt_socket_connect(const char *addr, int port, double deadline, char *why, size_t why_len)
{
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int gai = getaddrinfo(addr, ps, &hints, &res);
    if (gai != 0) {
        snprintf(why, why_len, "cannot resolve '%s': %s", addr, gai_strerror(gai));
        return -1;
    }
    int fd = -1;
    for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if (fd < 0) continue;
        set_nonblocking(fd);
        if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) break;
        if (errno == EINPROGRESS) {
            struct pollfd pf = {fd, POLLOUT, 0};
            double d = gt_now_seconds() + 2.0 < deadline ? gt_now_seconds() + 2.0 : deadline;
            int soerr = 0;
            socklen_t sl = sizeof soerr;
            if (poll(&pf, 1, ms_left(d)) == 1 &&
                getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) == 0 && soerr == 0)
                break;
            if (soerr) errno = soerr;
        }
        snprintf(why, why_len, "%s", strerror(errno ? errno : ETIMEDOUT));
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    return fd;
}
