/* grad_rules_parallel.c — the parallel ops (collectives and the local pieces of vocabulary-parallel
 * ops) have no gradient rule: parallelize (src/parallel/) runs after autodiff and the optimizer, on
 * the whole step graph, so nothing differentiates through them. */
#include "autodiff/grad_rules.h"

GT_GRAD_NONE(all_gather_start)
GT_GRAD_NONE(reduce_scatter_start)
GT_GRAD_NONE(all_reduce_start)
GT_GRAD_NONE(all_to_all_start)
GT_GRAD_NONE(send_start)
GT_GRAD_NONE(recv_start)
GT_GRAD_NONE(wait)
GT_GRAD_NONE(embedding_shard)
GT_GRAD_NONE(embedding_shard_backward)
GT_GRAD_NONE(logsumexp)
GT_GRAD_NONE(cross_entropy_shard)
GT_GRAD_NONE(cross_entropy_shard_backward)
