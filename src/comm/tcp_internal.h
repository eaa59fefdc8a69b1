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

/* A communicator over net (tcp.c): comm rank i is world rank world[i]. It takes over one of net's
 * references (the caller's) and the world array. */
gt_comm *gt_tcp_wrap(tcp_net *net, int *world, int rank, int size, uint32_t tag, const char *name);
/* Drops a reference to net; the last closes the sockets (tcp.c). */
void gt_tcp_net_release(tcp_net *net);

#endif
