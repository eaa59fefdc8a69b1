/* tcp.c — a host communicator over plain TCP sockets, for launchers without MPI (torchrun, Slurm,
 * a shell loop) that set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT.
 *
 * Setup (gt_comm_tcp_world), integers big-endian:
 *   1. every rank but 0 listens on an ephemeral port; rank 0 listens on MASTER_PORT;
 *   2. rank r > 0 connects to MASTER_ADDR:MASTER_PORT (retrying while rank 0 is not up) and sends
 *      "GTTC", version, r, WORLD_SIZE, its listening port; rank 0 keeps that connection as its
 *      link to r and notes the address it came from;
 *   3. when all have come, rank 0 sends each the table (address, port) of every rank;
 *   4. rank i connects to every rank 0 < j < i (sending "GTTC", version, i, WORLD_SIZE) and
 *      accepts one connection from every rank j > i. Connects complete in the listener's backlog,
 *      so no rank waits for another to accept: the mesh cannot deadlock.
 * Every socket is non-blocking and every wait is a poll bounded by a deadline: a rank that never
 * comes is an error naming it (on rank 0, and on the ranks waiting to be connected by it), never a
 * hang.
 *
 * Collectives: start performs the whole collective and wait does nothing. Each collective is one
 * exchange: for every peer a message to send and one to receive, each led by a 24-byte header
 * (magic, collective, communicator tag, payload bytes) that the receiver checks, so ranks whose
 * collectives are out of order fail naming the peer instead of reading garbage. One poll loop
 * progresses every send and receive at once, so large messages cannot deadlock on full socket
 * buffers. Sums are those of the MPI communicator (src/comm/mpi.c), bit for bit:
 *   reduce_scatter: the n row blocks go to their ranks (in the input dtype); rank r sums the n
 *                   blocks it holds in rank order (gt_comm_sum_ordered) into the output dtype;
 *   all_reduce:     the flat tensor (N elements) is cut into n chunks of N/n (+1 for the first
 *                   N mod n); rank j receives chunk j of every rank, sums them in rank order, and
 *                   then every rank receives every reduced chunk.
 * Sub-communicators (split) share the world's sockets: one TCP stream per pair of world ranks
 * carries the collectives of every communicator containing both, in program order (the same on
 * every rank of an SPMD program).
 *
 * Point-to-point (src/comm/tcp_p2p.c) shares the streams: its messages carry their own magic, a
 * collective writes to a stream only after the p2p sends queued on it, and reads its message once
 * the p2p messages before it are stashed; the exchange progresses every peer's p2p traffic while
 * it waits.
 *
 * Hangs and deaths: a collective fails when no byte moves for the timeout (seconds; <= 0:
 * forever), naming this rank, the collective, the communicator, its world ranks and the peer it
 * waits for; a peer that closes its sockets (it died) fails at once naming it. After a failure the
 * streams are out of step, so every communicator over these sockets refuses further work. */
#include "comm/tcp_internal.h"

/* ---------------------------------------------------------------- the exchange */

gt_status gt_tcp_broken(gt_comm *c, const char *what, gt_error *err)
{
    tcp_impl *impl = c->impl;
    return gt_error_set(err, GT_ERR_IO,
                        "rank %d: %s on communicator '%s' (size %d, %s): refused, an earlier "
                        "collective or point-to-point transfer failed (%.300s)",
                        c->rank, what, c->name, c->size, impl->members, impl->net->why);
}

gt_status gt_tcp_stalled(gt_comm *c, const char *what, int peer, gt_error *err)
{
    tcp_impl *impl = c->impl;
    return gt_error_set(err, GT_ERR_IO,
                        "rank %d: %s on communicator '%s' (size %d, %s): no progress with rank %d "
                        "(world rank %d) for %.0f s: that rank died or is stuck "
                        "(comm.init_timeout_seconds / train_timeout_seconds)",
                        c->rank, what, c->name, c->size, impl->members, peer, impl->world[peer],
                        impl->net->timeout_s);
}

/* One peer's part of an exchange: an optional message out and an optional message in. */
typedef struct {
    const char *send;
    size_t send_n;
    bool has_send;
    char *recv;
    size_t recv_n;
    bool has_recv;
    /* progress */
    unsigned char hout[TC_HDR], hin[TC_HDR];
    size_t sent, got;
} tc_part;

static void make_header(unsigned char *h, uint32_t kind, uint32_t tag, uint64_t bytes)
{
    put_u32(h, TC_MSG_MAGIC);
    put_u32(h + 4, kind);
    put_u32(h + 8, tag);
    put_u32(h + 12, 0);
    put_u64(h + 16, bytes);
}

/* Fails the exchange: the communicator's streams are out of step from here on. */
gt_status gt_tcp_fail(gt_comm *c, gt_error *err)
{
    tcp_impl *impl = c->impl;
    if (!impl->net->broken) {
        impl->net->broken = true;
        snprintf(impl->net->why, sizeof impl->net->why, "%s", err->msg);
    }
    return err->code;
}

/* Moves every part's messages (p[i] is comm rank i's; p[c->rank] is ignored) until all are done,
 * progressing the point-to-point traffic with every world rank meanwhile (tcp_p2p.c): a part's
 * message goes out after the sends queued on its stream, and a part's message is read once the
 * p2p messages before it are stashed. Fails when no byte moves for the timeout, or a peer closes
 * its socket or sends a message that is not the one expected. */
static gt_status exchange(gt_comm *c, uint32_t kind, const char *what, tc_part *p, gt_error *err)
{
    tcp_impl *impl = c->impl;
    tcp_net *net = impl->net;
    if (net->broken) return gt_tcp_broken(c, what, err);
    int n = c->size, nw = net->size;
    struct pollfd *pf = gt_xmalloc(sizeof *pf * (size_t)nw);
    int *who = gt_xmalloc(sizeof *who * (size_t)nw * 2), *pos = who + nw;
    for (int w = 0; w < nw; w++)
        pos[w] = -1;
    for (int i = 0; i < n; i++) {
        if (i == c->rank) p[i].has_send = p[i].has_recv = false;
        make_header(p[i].hout, kind, impl->tag, p[i].send_n);
        p[i].sent = p[i].got = 0;
        pos[impl->world[i]] = i;
    }
    double last = gt_now_seconds();
    gt_status st = GT_OK;
    for (;;) {
        int m = 0;
        bool left = false;
        for (int w = 0; w < nw; w++) {
            if (w == net->rank) continue;
            int i = pos[w];
            bool s = i >= 0 && p[i].has_send && p[i].sent < TC_HDR + p[i].send_n;
            bool r = i >= 0 && p[i].has_recv && p[i].got < TC_HDR + p[i].recv_n;
            left |= s || r;
            short ev = (short)(gt_tcp_p2p_events(net, w) | (s ? POLLOUT : 0) | (r ? POLLIN : 0));
            if (!ev) continue;
            pf[m] = (struct pollfd){net->fd[w], ev, 0};
            who[m++] = w;
        }
        if (!left) break;
        int ms = net->timeout_s > 0 ? ms_left(last + net->timeout_s) : -1;
        int pr = ms == 0 ? 0 : poll(pf, (nfds_t)m, ms);
        if (pr < 0 && errno == EINTR) continue;
        if (pr <= 0) {
            /* name the first peer still owing data (or still not taking ours) */
            int i = -1;
            for (int k = 0; k < n && i < 0; k++)
                if (p[k].has_recv && p[k].got < TC_HDR + p[k].recv_n) i = k;
            for (int k = 0; k < n && i < 0; k++)
                if (p[k].has_send && p[k].sent < TC_HDR + p[k].send_n) i = k;
            st = gt_tcp_stalled(c, what, i, err);
            break;
        }
        for (int k = 0; k < m && st == GT_OK; k++) {
            if (!pf[k].revents) continue;
            int fd = pf[k].fd, w = who[k], peer = pos[w];
            bool moved = false;
            st = gt_tcp_p2p_pump(c, what, w, &moved, err);
            if (moved) last = gt_now_seconds();
            if (st != GT_OK || peer < 0) continue;
            tc_part *q = &p[peer];
            tc_peer *pe = &net->peer[w];
            while (!pe->out_head && q->has_send && q->sent < TC_HDR + q->send_n) {
                const char *src = q->sent < TC_HDR ? (const char *)q->hout + q->sent
                                                   : q->send + (q->sent - TC_HDR);
                size_t len = q->sent < TC_HDR ? TC_HDR - q->sent : q->send_n - (q->sent - TC_HDR);
                ssize_t x = send(fd, src, len, MSG_NOSIGNAL);
                if (x > 0) {
                    q->sent += (size_t)x;
                    last = gt_now_seconds();
                    continue;
                }
                if (x < 0 && (errno == EINTR)) continue;
                if (x < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
                st = gt_error_set(err, GT_ERR_IO,
                                  "rank %d: %s on communicator '%s' (size %d, %s): sending to "
                                  "rank %d (world rank %d) failed: %s (that rank died?)",
                                  c->rank, what, c->name, c->size, impl->members, peer,
                                  impl->world[peer], strerror(errno));
                break;
            }
            /* a collective's message is next on the stream once the p2p ones before it are
             * stashed (TC_RX_COLL), or the peer closed it (read below: an error) */
            bool ours = pe->rx_state == TC_RX_COLL || (pe->eof && pe->rx_state == TC_RX_IDLE);
            while (st == GT_OK && ours && q->has_recv && q->got < TC_HDR + q->recv_n) {
                char *dst = q->got < TC_HDR ? (char *)q->hin + q->got : q->recv + (q->got - TC_HDR);
                size_t len = q->got < TC_HDR ? TC_HDR - q->got : q->recv_n - (q->got - TC_HDR);
                ssize_t x = recv(fd, dst, len, 0);
                if (x < 0 && errno == EINTR) continue;
                if (x < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
                if (x <= 0) {
                    st = gt_error_set(err, GT_ERR_IO,
                                      "rank %d: %s on communicator '%s' (size %d, %s): rank %d "
                                      "(world rank %d) closed its connection%s%s: that rank died "
                                      "or stopped",
                                      c->rank, what, c->name, c->size, impl->members, peer,
                                      impl->world[peer], x < 0 ? ": " : "",
                                      x < 0 ? strerror(errno) : "");
                    break;
                }
                bool header_done = q->got < TC_HDR && q->got + (size_t)x >= TC_HDR;
                q->got += (size_t)x;
                last = gt_now_seconds();
                if (q->got == TC_HDR + q->recv_n) pe->rx_state = TC_RX_IDLE; /* message read */
                if (!header_done) continue;
                uint32_t hk = get_u32(q->hin + 4), ht = get_u32(q->hin + 8);
                uint64_t hb = get_u64(q->hin + 16);
                if (get_u32(q->hin) != TC_MSG_MAGIC || hk != kind || ht != impl->tag ||
                    hb != q->recv_n)
                    st = gt_error_set(
                        err, GT_ERR_INVALID,
                        "rank %d: %s on communicator '%s' (size %d, %s): rank %d "
                        "(world rank %d) sent collective kind %u of %llu bytes for "
                        "communicator tag %08x, expected kind %u of %zu bytes for tag "
                        "%08x: the ranks' collectives are out of order",
                        c->rank, what, c->name, c->size, impl->members, peer, impl->world[peer], hk,
                        (unsigned long long)hb, ht, kind, q->recv_n, impl->tag);
            }
        }
        if (st != GT_OK) break;
    }
    free(pf);
    free(who);
    return st == GT_OK ? GT_OK : gt_tcp_fail(c, err);
}

/* ---------------------------------------------------------------- collectives */

/* One b-byte block from every rank to every rank: rank i gets src + i * src_step and sends into
 * recv + i * b; this rank's own block is copied locally. */
static gt_status exchange_blocks(gt_comm *c, uint32_t kind, const char *what, tc_part *p,
                                 const char *src, size_t src_step, char *recv, size_t b,
                                 gt_error *err)
{
    int n = c->size, me = c->rank;
    for (int i = 0; i < n; i++)
        p[i] = (tc_part){.send = src + (size_t)i * src_step,
                         .send_n = b,
                         .has_send = true,
                         .recv = recv + (size_t)i * b,
                         .recv_n = b,
                         .has_recv = true};
    memcpy(recv + (size_t)me * b, src + (size_t)me * src_step, b);
    return exchange(c, kind, what, p, err);
}

static gt_status tcp_start(gt_comm *c, gt_coll_kind kind, const gt_tensor *in, gt_tensor *out,
                           int root, gt_comm_request *req, gt_error *err)
{
    (void)req;
    int n = c->size, me = c->rank;
    const char *what = gt_coll_kind_name(kind);
    if (kind != GT_COLL_BROADCAST && in->data == out->data && kind != GT_COLL_ALL_REDUCE)
        return gt_error_set(err, GT_ERR_INVALID,
                            "rank %d: %s on communicator '%s': input and output must not alias", me,
                            what, c->name);
    size_t es = gt_dtype_size(in->dtype);
    const char *src = in->data;
    char *dst = out->data;
    tc_part *p = gt_xcalloc((size_t)n, sizeof *p);
    gt_status st = GT_OK;
    switch (kind) {
    case GT_COLL_ALL_GATHER: {
        size_t b = gt_tensor_nbytes(in);
        st = exchange_blocks(c, (uint32_t)kind, what, p, src, 0, dst, b, err);
        break;
    }
    case GT_COLL_GATHER: { /* every block to root alone */
        size_t b = gt_tensor_nbytes(in);
        for (int i = 0; i < n; i++)
            p[i] = (tc_part){.send = src,
                             .send_n = b,
                             .has_send = i == root,
                             .recv = me == root ? dst + (size_t)i * b : NULL,
                             .recv_n = b,
                             .has_recv = me == root};
        if (me == root) memcpy(dst + (size_t)me * b, src, b);
        st = exchange(c, (uint32_t)kind, what, p, err);
        break;
    }
    case GT_COLL_BROADCAST: {
        size_t b = gt_tensor_nbytes(out);
        for (int i = 0; i < n; i++)
            p[i] = (tc_part){.send = dst,
                             .send_n = b,
                             .has_send = me == root,
                             .recv = dst,
                             .recv_n = b,
                             .has_recv = i == root};
        st = exchange(c, (uint32_t)kind, what, p, err);
        break;
    }
    case GT_COLL_ALL_TO_ALL: {
        size_t b = gt_tensor_nbytes(in) / (size_t)n;
        st = exchange_blocks(c, (uint32_t)kind, what, p, src, b, dst, b, err);
        break;
    }
    case GT_COLL_REDUCE_SCATTER: {
        /* block i of every rank to rank i; rank me sums the n blocks it holds in rank order.
         * Blocks are in the input dtype: out may be wider (f32 for bf16/f16, gt_comm.h). */
        size_t b = (size_t)gt_tensor_numel(out) * es;
        char *scratch = gt_xmalloc((size_t)n * b + 1);
        st = exchange_blocks(c, (uint32_t)kind, what, p, src, b, scratch, b, err);
        if (st == GT_OK) {
            const void **blocks = gt_xmalloc(sizeof(void *) * (size_t)n);
            for (int i = 0; i < n; i++)
                blocks[i] = scratch + (size_t)i * b;
            st = gt_comm_sum_ordered(in->dtype, out->dtype, gt_tensor_numel(out),
                                     (const void *const *)blocks, n, dst, err);
            free(blocks);
        }
        free(scratch);
        break;
    }
    case GT_COLL_ALL_REDUCE: {
        /* chunk j (gt_comm_chunk, as the MPI communicator) is reduced on rank j */
        int64_t numel = gt_tensor_numel(in);
        size_t *count = gt_xmalloc(sizeof(size_t) * 2 * (size_t)n), *off = count + n;
        for (int j = 0; j < n; j++) {
            int64_t first, len;
            gt_comm_chunk(numel, n, j, &first, &len);
            count[j] = (size_t)len * es;
            off[j] = (size_t)first * es;
        }
        size_t mine = count[me];
        char *scratch = gt_xmalloc((size_t)n * mine + 1);
        for (int i = 0; i < n; i++)
            p[i] = (tc_part){.send = src + off[i],
                             .send_n = count[i],
                             .has_send = true,
                             .recv = scratch + (size_t)i * mine,
                             .recv_n = mine,
                             .has_recv = true};
        memcpy(scratch + (size_t)me * mine, src + off[me], mine);
        st = exchange(c, (uint32_t)kind, what, p, err);
        if (st == GT_OK) {
            const void **blocks = gt_xmalloc(sizeof(void *) * (size_t)n);
            for (int i = 0; i < n; i++)
                blocks[i] = scratch + (size_t)i * mine;
            st = gt_comm_sum_ordered(in->dtype, out->dtype, (int64_t)(mine / es),
                                     (const void *const *)blocks, n, dst + off[me], err);
            free(blocks);
        }
        if (st == GT_OK) {
            /* phase 2: every rank's reduced chunk to every rank */
            for (int i = 0; i < n; i++)
                p[i] = (tc_part){.send = dst + off[me],
                                 .send_n = mine,
                                 .has_send = true,
                                 .recv = dst + off[i],
                                 .recv_n = count[i],
                                 .has_recv = true};
            st = exchange(c, (uint32_t)kind, what, p, err);
        }
        free(scratch);
        free(count);
        break;
    }
    default:
        GT_CHECK(!"unknown collective");
    }
    free(p);
    return st;
}

static gt_status tcp_wait(gt_comm *c, gt_comm_request *req, gt_error *err)
{
    (void)c, (void)req, (void)err; /* start did the whole collective */
    return GT_OK;
}

static gt_status tcp_all_gather_u64(gt_comm *c, const uint64_t *in, int64_t count, uint64_t *out,
                                    gt_error *err)
{
    int n = c->size;
    size_t b = (size_t)(count > 0 ? count : 0) * 8;
    /* big-endian on the wire, so mixed hosts agree */
    unsigned char *mine = gt_xmalloc(b + 1), *all = gt_xmalloc((size_t)n * b + 1);
    for (int64_t k = 0; k < count; k++)
        put_u64(mine + 8 * k, in[k]);
    tc_part *p = gt_xcalloc((size_t)n, sizeof *p);
    for (int i = 0; i < n; i++)
        p[i] = (tc_part){.send = (const char *)mine,
                         .send_n = b,
                         .has_send = true,
                         .recv = (char *)all + (size_t)i * b,
                         .recv_n = b,
                         .has_recv = true};
    memcpy(all + (size_t)c->rank * b, mine, b);
    gt_status st = exchange(c, TC_KIND_U64, "all_gather (u64)", p, err);
    if (st == GT_OK)
        for (size_t k = 0; k < (size_t)n * (size_t)(count > 0 ? count : 0); k++)
            out[k] = get_u64(all + 8 * k);
    free(p);
    free(mine);
    free(all);
    return st;
}

/* ---------------------------------------------------------------- communicators */

static void tcp_destroy(gt_comm *c);
static gt_status tcp_split(gt_comm *c, int color, int key, gt_comm **out, gt_error *err);

/* The sockets are the world's, shared by every communicator split from it: so is the timeout. */
static void tcp_set_timeout(gt_comm *c, double seconds)
{
    ((tcp_impl *)c->impl)->net->timeout_s = seconds;
}

static const gt_comm_vtable tcp_vtable = {
    .name = "tcp",
    .start = tcp_start,
    .wait = tcp_wait,
    .free_request = NULL,
    .split = tcp_split,
    .all_gather_u64 = tcp_all_gather_u64,
    .destroy = tcp_destroy,
    .send_start = gt_tcp_send_start,
    .recv = gt_tcp_recv,
    .send_wait_all = gt_tcp_send_wait_all,
    .set_timeout = tcp_set_timeout,
};

/* Takes one reference to net and ownership of world. */
gt_comm *gt_tcp_wrap(tcp_net *net, int *world, int rank, int size, uint32_t tag, const char *name)
{
    gt_comm *c = gt_xcalloc(1, sizeof *c);
    tcp_impl *impl = gt_xcalloc(1, sizeof *impl);
    impl->net = net;
    impl->world = world;
    impl->tag = tag;
    gt_comm_format_members(world, size, impl->members, sizeof impl->members);
    c->vt = &tcp_vtable;
    c->impl = impl;
    c->rank = rank;
    c->size = size;
    snprintf(c->name, sizeof c->name, "%s", name);
    return c;
}

void gt_tcp_net_release(tcp_net *net)
{
    if (--net->refs > 0) return;
    for (int r = 0; r < net->size; r++)
        if (net->fd[r] >= 0) close(net->fd[r]);
    gt_tcp_p2p_free(net);
    free(net->fd);
    free(net);
}

static void tcp_destroy(gt_comm *c)
{
    tcp_impl *impl = c->impl;
    gt_tcp_net_release(impl->net);
    free(impl->world);
    free(impl);
    free(c);
}

/* Ranks with the same color, ordered by (key, parent rank): an all-gather of (color, key), then
 * every rank picks its group locally — the same on every member. */
static gt_status tcp_split(gt_comm *c, int color, int key, gt_comm **out, gt_error *err)
{
    tcp_impl *impl = c->impl;
    int n = c->size;
    uint64_t mine[2] = {(uint64_t)(uint32_t)color, (uint64_t)(uint32_t)key};
    uint64_t *all = gt_xmalloc(sizeof *all * 2 * (size_t)n);
    gt_status st = tcp_all_gather_u64(c, mine, 2, all, err);
    if (st != GT_OK) {
        free(all);
        return st;
    }
    int *order = gt_xmalloc(sizeof *order * (size_t)n), m = 0;
    for (int r = 0; r < n; r++) {
        if ((int)(uint32_t)all[2 * r] != color) continue;
        /* insertion by (key, parent rank): r grows, so ties keep parent order */
        int k = m++;
        while (k > 0 && (int)(uint32_t)all[2 * order[k - 1] + 1] > (int)(uint32_t)all[2 * r + 1]) {
            order[k] = order[k - 1];
            k--;
        }
        order[k] = r;
    }
    int *world = gt_xmalloc(sizeof *world * (size_t)m), rank = 0;
    for (int i = 0; i < m; i++) {
        world[i] = impl->world[order[i]];
        if (order[i] == c->rank) rank = i;
    }
    free(order);
    free(all);
    uint32_t words[2] = {impl->tag, (uint32_t)color};
    uint32_t tag = (uint32_t)gt_hash64(words, sizeof words, 0x7463707370ull);
    char name[64];
    snprintf(name, sizeof name, "%.40s/split(%d)", c->name, color);
    impl->net->refs++;
    *out = gt_tcp_wrap(impl->net, world, rank, m, tag, name);
    return GT_OK;
}
