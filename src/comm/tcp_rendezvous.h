/* tcp_rendezvous.h — a one-shot TCP rendezvous that hands rank 0's bytes (an NCCL unique id) to
 * every other rank, for launchers without MPI (torchrun, Slurm, a shell loop). Private to
 * src/comm. */
#ifndef GT_COMM_TCP_RENDEZVOUS_H
#define GT_COMM_TCP_RENDEZVOUS_H

#include "graphtrain/gt_core.h"

/* Rank 0 listens on `port` (every interface) until each of ranks 1 .. size-1 has connected once,
 * and sends each the `len` bytes at blob; every other rank connects to addr:port (retrying while
 * rank 0 is not listening yet) and receives them into blob. A connection that does not speak the
 * protocol is dropped; a peer that claims another world size or a rank already seen is an error.
 * Past timeout_s seconds (> 0) every rank fails with GT_ERR_IO naming the address and, on rank 0,
 * the ranks that never connected, so a missing or dead peer is an error instead of a hang. */
gt_status gt_tcp_rendezvous(const char *addr, int port, int rank, int size, void *blob, size_t len,
                            double timeout_s, gt_error *err);

#endif
