/* tcp_p2p.c — point-to-point on the TCP communicator (pipeline parallelism): tag-matched sends
 * and receives over the same streams as the collectives (src/comm/tcp.c).
 *
 * A message is a 24-byte header (magic "GTPP", p2p tag, communicator tag, payload bytes) and its
 * payload. send_start queues it on the peer's stream and writes what the socket takes at once;
 * the rest moves whenever this rank waits on the communicator: in recv, in send_wait_all and in
 * every collective's exchange (as MPI progresses its sends in any call), so two ranks that both
 * send before receiving, or a send larger than the socket buffers followed by a collective,
 * cannot deadlock. A collective writes to a stream only after the sends queued there.
 *
 * Arriving p2p messages are read whenever this rank waits, into a stash per peer, and a recv takes
 * the first stashed message of its peer, communicator and tag: tags may come out of order, and
 * messages with one tag are received in the order they were sent (as MPI's). Reading stops at a
 * collective's header, which stays in the socket for the collective that expects it.
 *
 * Waits are bounded by the communicator's timeout (no byte moving for that long) and fail naming
 * the peer; a peer that closed its stream fails a recv from it at once. After a failure the
 * streams are out of step and every communicator over them refuses further work. */
#include "comm/tcp_internal.h"

short gt_tcp_p2p_events(const tcp_net *net, int w)
{
    const tc_peer *pe = &net->peer[w];
    short ev = pe->out_head ? POLLOUT : 0;
    if (pe->rx_state != TC_RX_COLL && !pe->eof) ev |= POLLIN;
    return ev;
}

/* Writes the queued sends to w until the socket is full or the queue empty. */
static gt_status pump_out(gt_comm *c, const char *what, int w, bool *moved, gt_error *err)
{
    tcp_impl *impl = c->impl;
    tc_peer *pe = &impl->net->peer[w];
    int fd = impl->net->fd[w];
    while (pe->out_head) {
        tc_msg *m = pe->out_head;
        const char *src =
            m->done < TC_HDR ? (const char *)m->hdr + m->done : m->out + (m->done - TC_HDR);
        size_t len = m->done < TC_HDR ? TC_HDR - m->done : m->bytes - (m->done - TC_HDR);
        ssize_t x = len ? send(fd, src, len, MSG_NOSIGNAL) : 0;
        if (x < 0 && errno == EINTR) continue;
        if (x < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return GT_OK;
        if (x < 0)
            return gt_error_set(err, GT_ERR_IO,
                                "rank %d: %s on communicator '%s' (%s): sending %zu bytes under "
                                "tag %u to world rank %d failed: %s (that rank died?)",
                                c->rank, what, c->name, impl->members, m->bytes, m->tag, w,
                                strerror(errno));
        m->done += (size_t)x;
        *moved = true;
        if (m->done < TC_HDR + m->bytes) continue;
        pe->out_head = m->next;
        if (!pe->out_head) pe->out_tail = NULL;
        free(m);
    }
    return GT_OK;
}

static gt_status closed_error(gt_comm *c, const char *what, int w, const char *why, gt_error *err)
{
    tcp_impl *impl = c->impl;
    return gt_error_set(err, GT_ERR_IO,
                        "rank %d: %s on communicator '%s' (%s): world rank %d closed its "
                        "connection%s%s: that rank died or stopped",
                        c->rank, what, c->name, impl->members, w, why ? ": " : "", why ? why : "");
}

/* Reads arriving p2p messages from w into its stash until the socket is empty or a collective's
 * message is next. */
static gt_status pump_in(gt_comm *c, const char *what, int w, bool *moved, gt_error *err)
{
    tcp_impl *impl = c->impl;
    tc_peer *pe = &impl->net->peer[w];
    int fd = impl->net->fd[w];
    while (!pe->eof && pe->rx_state != TC_RX_COLL) {
        if (pe->rx_state == TC_RX_IDLE) {
            unsigned char h[TC_HDR];
            ssize_t x = recv(fd, h, TC_HDR, MSG_PEEK);
            if (x < 0 && errno == EINTR) continue;
            if (x < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return GT_OK;
            if (x == 0) { /* between messages: an error only for whoever needs w */
                pe->eof = true;
                return GT_OK;
            }
            if (x < 0) return closed_error(c, what, w, strerror(errno), err);
            if (x < TC_HDR) return GT_OK; /* the rest of the header is on its way */
            uint32_t magic = get_u32(h);
            if (magic == TC_MSG_MAGIC) {
                pe->rx_state = TC_RX_COLL;
                return GT_OK;
            }
            if (magic != TC_P2P_MAGIC)
                return gt_error_set(err, GT_ERR_INVALID,
                                    "rank %d: %s on communicator '%s' (%s): world rank %d sent a "
                                    "message that is neither a collective nor a point-to-point "
                                    "one (magic %08x)",
                                    c->rank, what, c->name, impl->members, w, magic);
            if (recv(fd, h, TC_HDR, 0) != TC_HDR) /* peeked: it is there */
                return closed_error(c, what, w, strerror(errno), err);
            tc_msg *m = gt_xcalloc(1, sizeof *m);
            m->tag = get_u32(h + 4);
            m->ctag = get_u32(h + 8);
            m->bytes = (size_t)get_u64(h + 16);
            m->in = gt_xmalloc(m->bytes + 1);
            pe->rx = m;
            pe->rx_state = TC_RX_P2P;
            *moved = true;
        }
        tc_msg *m = pe->rx;
        while (m->done < m->bytes) {
            ssize_t x = recv(fd, m->in + m->done, m->bytes - m->done, 0);
            if (x < 0 && errno == EINTR) continue;
            if (x < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return GT_OK;
            if (x <= 0) return closed_error(c, what, w, x < 0 ? strerror(errno) : NULL, err);
            m->done += (size_t)x;
            *moved = true;
        }
        if (pe->stash_tail)
            pe->stash_tail->next = m;
        else
            pe->stash_head = m;
        pe->stash_tail = m;
        pe->rx = NULL;
        pe->rx_state = TC_RX_IDLE;
    }
    return GT_OK;
}

gt_status gt_tcp_p2p_pump(gt_comm *c, const char *what, int w, bool *moved, gt_error *err)
{
    GT_TRY(pump_out(c, what, w, moved, err));
    return pump_in(c, what, w, moved, err);
}

/* The first stashed message from w on this communicator under tag, unlinked; NULL if none. */
static tc_msg *stash_take(tcp_net *net, int w, uint32_t ctag, uint32_t tag)
{
    tc_peer *pe = &net->peer[w];
    tc_msg *prev = NULL;
    for (tc_msg *m = pe->stash_head; m; prev = m, m = m->next) {
        if (m->ctag != ctag || m->tag != tag) continue;
        if (prev)
            prev->next = m->next;
        else
            pe->stash_head = m->next;
        if (pe->stash_tail == m) pe->stash_tail = prev;
        m->next = NULL;
        return m;
    }
    return NULL;
}

/* Until done(c, arg) holds: progresses every peer's point-to-point traffic. Past the timeout with
 * no byte moving, fails naming `stuck` (a world rank) as what it waits for. */
typedef bool (*p2p_done_fn)(gt_comm *c, const void *arg);

static gt_status p2p_wait(gt_comm *c, const char *what, p2p_done_fn done, const void *arg,
                          int stuck_rank, gt_error *err)
{
    tcp_impl *impl = c->impl;
    tcp_net *net = impl->net;
    int n = net->size;
    struct pollfd *pf = gt_xmalloc(sizeof *pf * (size_t)n);
    int *who = gt_xmalloc(sizeof *who * (size_t)n);
    double last = gt_now_seconds();
    gt_status st = GT_OK;
    while (!done(c, arg)) {
        int m = 0;
        for (int w = 0; w < n; w++) {
            short ev = w == net->rank ? 0 : gt_tcp_p2p_events(net, w);
            if (!ev) continue;
            pf[m] = (struct pollfd){net->fd[w], ev, 0};
            who[m++] = w;
        }
        int ms = net->timeout_s > 0 ? ms_left(last + net->timeout_s) : -1;
        int pr = ms == 0 ? 0 : poll(pf, (nfds_t)m, ms);
        if (pr < 0 && errno == EINTR) continue;
        if (pr <= 0) {
            st = gt_tcp_stalled(c, what, stuck_rank, err);
            break;
        }
        for (int k = 0; k < m && st == GT_OK; k++) {
            if (!pf[k].revents) continue;
            bool moved = false;
            st = gt_tcp_p2p_pump(c, what, who[k], &moved, err);
            if (moved) last = gt_now_seconds();
        }
        if (st != GT_OK) break;
    }
    free(pf);
    free(who);
    return st == GT_OK ? GT_OK : gt_tcp_fail(c, err);
}

gt_status gt_tcp_send_start(gt_comm *c, const void *buf, size_t bytes, int peer, int tag,
                            gt_error *err)
{
    tcp_impl *impl = c->impl;
    tcp_net *net = impl->net;
    if (net->broken) return gt_tcp_broken(c, "send", err);
    int w = impl->world[peer];
    tc_msg *m = gt_xcalloc(1, sizeof *m);
    m->ctag = impl->tag;
    m->tag = (uint32_t)tag;
    m->out = buf;
    m->bytes = bytes;
    put_u32(m->hdr, TC_P2P_MAGIC);
    put_u32(m->hdr + 4, (uint32_t)tag);
    put_u32(m->hdr + 8, impl->tag);
    put_u32(m->hdr + 12, 0);
    put_u64(m->hdr + 16, (uint64_t)bytes);
    tc_peer *pe = &net->peer[w];
    if (pe->out_tail)
        pe->out_tail->next = m;
    else
        pe->out_head = m;
    pe->out_tail = m;
    /* what the socket takes now; the rest moves while this rank waits on the communicator */
    bool moved = false;
    gt_status st = pump_out(c, "send", w, &moved, err);
    return st == GT_OK ? GT_OK : gt_tcp_fail(c, err);
}

typedef struct {
    int w;
    uint32_t tag;
    tc_msg *got;
} recv_want;

static bool recv_done(gt_comm *c, const void *arg)
{
    recv_want *r = (recv_want *)arg;
    tcp_impl *impl = c->impl;
    if (!r->got) r->got = stash_take(impl->net, r->w, impl->tag, r->tag);
    /* nothing more can come from a peer that closed its stream */
    return r->got || impl->net->peer[r->w].eof;
}

gt_status gt_tcp_recv(gt_comm *c, void *buf, size_t bytes, int peer, int tag, gt_error *err)
{
    tcp_impl *impl = c->impl;
    if (impl->net->broken) return gt_tcp_broken(c, "recv", err);
    char what[96];
    snprintf(what, sizeof what, "recv of %zu bytes under tag %d from rank %d", bytes, tag, peer);
    recv_want r = {impl->world[peer], (uint32_t)tag, NULL};
    GT_TRY(p2p_wait(c, what, recv_done, &r, peer, err));
    if (!r.got) { /* nothing more can come: the peer closed its stream */
        closed_error(c, what, r.w, NULL, err);
        return gt_tcp_fail(c, err);
    }
    gt_status st = GT_OK;
    if (r.got->bytes != bytes)
        st = gt_error_set(err, GT_ERR_INVALID,
                          "rank %d: %s on communicator '%s' (%s): rank %d sent %zu bytes under "
                          "that tag: the stages disagree on the tensor",
                          c->rank, what, c->name, impl->members, peer, r.got->bytes);
    else
        memcpy(buf, r.got->in, bytes);
    free(r.got->in);
    free(r.got);
    return st == GT_OK ? GT_OK : gt_tcp_fail(c, err);
}

/* The first member of c with sends still queued to it, or -1. */
static int first_sending(gt_comm *c)
{
    tcp_impl *impl = c->impl;
    for (int i = 0; i < c->size; i++)
        if (i != c->rank && impl->net->peer[impl->world[i]].out_head) return i;
    return -1;
}

static bool sends_done(gt_comm *c, const void *arg)
{
    (void)arg;
    return first_sending(c) < 0;
}

gt_status gt_tcp_send_wait_all(gt_comm *c, gt_error *err)
{
    tcp_impl *impl = c->impl;
    int i = first_sending(c);
    if (i < 0) return GT_OK;
    if (impl->net->broken) return gt_tcp_broken(c, "send", err);
    /* the sends queued to c's members, whichever communicator queued them (one stream each) */
    return p2p_wait(c, "send (waiting for the sends to complete)", sends_done, NULL, i, err);
}

static void free_list(tc_msg *m, bool owned)
{
    while (m) {
        tc_msg *next = m->next;
        if (owned) free(m->in);
        free(m);
        m = next;
    }
}

void gt_tcp_p2p_free(tcp_net *net)
{
    if (!net->peer) return;
    for (int w = 0; w < net->size; w++) {
        tc_peer *pe = &net->peer[w];
        free_list(pe->out_head, false);
        free_list(pe->stash_head, true);
        if (pe->rx) free_list(pe->rx, true);
    }
    free(net->peer);
}
