/* tcp_internal.h — what tcp.c (the collectives) and tcp_setup.c (joining the ranks) share: the
 * socket table, the per-communicator state and small socket helpers. Not public API. */
#ifndef GRAPHTRAIN_TCP_INTERNAL_H
#define GRAPHTRAIN_TCP_INTERNAL_H

#include "graphtrain/gt_comm.h"

#include "comm/socket_util.h"

#define TC_MAGIC 0x47545443u /* "GTTC" */
#define TC_VERSION 1u
#define TC_MSG_MAGIC 0x4754434du /* "GTCM": a collective's message */
#define TC_HDR 24
#define TC_ADDR 64
#define TC_SETUP_DEFAULT_S 30.0
#define TC_KIND_U64 100u         /* all_gather_u64's header kind */
#define TC_P2P_MAGIC 0x47545050u /* "GTPP": a point-to-point message */

/* A point-to-point message: queued to send (out: the caller's bytes) or arrived (in: owned). Its
 * header: magic, p2p tag, communicator tag, 0, payload bytes. */
typedef struct tc_msg {
    struct tc_msg *next;
    uint32_t ctag, tag;
    unsigned char hdr[TC_HDR];
    const char *out;
    char *in;
    size_t bytes, done; /* done: header and payload bytes sent, or payload bytes read */
} tc_msg;

/* What arrives from a peer next: a header not yet seen, a p2p payload being read, or a collective
 * message, left in the socket for the collective that expects it (tcp.c's exchange). */
typedef enum { TC_RX_IDLE = 0, TC_RX_P2P, TC_RX_COLL } tc_rx_state;

/* Point-to-point state per world peer: the sends queued to it (in order: one stream) and the
 * messages that arrived before their recv (the stash; matched in arrival order). */
typedef struct {
    tc_msg *out_head, *out_tail;
    tc_msg *stash_head, *stash_tail;
    tc_rx_state rx_state;
    tc_msg *rx;
    bool eof; /* the peer closed the stream between messages (it finished or died) */
} tc_peer;

/* The sockets of the world, shared by it and every communicator split from it. */
typedef struct {
    int refs;
    int rank, size; /* world */
    int *fd;        /* fd[w]: the stream to world rank w (-1 for this rank) */
    tc_peer *peer;  /* peer[w]: point-to-point with world rank w (tcp_p2p.c) */
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

/* A communicator over net (tcp.c): comm rank i is world rank world[i]. It takes over one of net's
 * references (the caller's) and the world array. */
gt_comm *gt_tcp_wrap(tcp_net *net, int *world, int rank, int size, uint32_t tag, const char *name);
/* Drops a reference to net; the last closes the sockets (tcp.c). */
void gt_tcp_net_release(tcp_net *net);

/* ---------------------------------------------------------------- point-to-point (tcp_p2p.c) */

/* Fails c's streams for good (the first failure is repeated to later calls); returns err->code. */
gt_status gt_tcp_fail(gt_comm *c, gt_error *err);
/* The errors of a call (`what`) on c: refused after an earlier failure; no byte moved with comm
 * rank `peer` for the timeout. */
gt_status gt_tcp_broken(gt_comm *c, const char *what, gt_error *err);
gt_status gt_tcp_stalled(gt_comm *c, const char *what, int peer, gt_error *err);
/* The poll events the p2p state of world rank w waits for: POLLOUT while sends are queued, POLLIN
 * unless a collective's message is next or the peer closed. */
short gt_tcp_p2p_events(const tcp_net *net, int w);
/* Moves p2p bytes with world rank w as far as the socket allows without blocking: the queued
 * sends, then arriving p2p messages into the stash, stopping at a collective's header (the state
 * becomes TC_RX_COLL). *moved is set when a byte moved. Errors name w and `what`. */
gt_status gt_tcp_p2p_pump(gt_comm *c, const char *what, int w, bool *moved, gt_error *err);
/* The vtable's point-to-point. */
gt_status gt_tcp_send_start(gt_comm *c, const void *buf, size_t bytes, int peer, int tag,
                            gt_error *err);
gt_status gt_tcp_recv(gt_comm *c, void *buf, size_t bytes, int peer, int tag, gt_error *err);
gt_status gt_tcp_send_wait_all(gt_comm *c, gt_error *err);
/* Frees net->peer's queues and stashes. */
void gt_tcp_p2p_free(tcp_net *net);

#endif
