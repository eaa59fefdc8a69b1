/* cuda_parallel.cu — the parallel ops on CUDA: collectives run through the communicator, not as
 * kernels; the vocabulary-parallel local ops come with the NCCL work. */
#include "cuda_internal.h"

gt_status gt_cuda_all_gather_start(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    (void)s;
    return gt_error_set(err, GT_ERR_UNSUPPORTED, "%s: not available on CUDA yet", gt_op_get(c->op)->name);
}

gt_status gt_cuda_reduce_scatter_start(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    (void)s;
    return gt_error_set(err, GT_ERR_UNSUPPORTED, "%s: not available on CUDA yet", gt_op_get(c->op)->name);
}

gt_status gt_cuda_all_reduce_start(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    (void)s;
    return gt_error_set(err, GT_ERR_UNSUPPORTED, "%s: not available on CUDA yet", gt_op_get(c->op)->name);
}

gt_status gt_cuda_wait(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    (void)s;
    return gt_error_set(err, GT_ERR_UNSUPPORTED, "%s: not available on CUDA yet", gt_op_get(c->op)->name);
}

gt_status gt_cuda_embedding_shard(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    (void)s;
    return gt_error_set(err, GT_ERR_UNSUPPORTED, "%s: not available on CUDA yet", gt_op_get(c->op)->name);
}

gt_status gt_cuda_embedding_shard_backward(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    (void)s;
    return gt_error_set(err, GT_ERR_UNSUPPORTED, "%s: not available on CUDA yet", gt_op_get(c->op)->name);
}

gt_status gt_cuda_logsumexp(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    (void)s;
    return gt_error_set(err, GT_ERR_UNSUPPORTED, "%s: not available on CUDA yet", gt_op_get(c->op)->name);
}

gt_status gt_cuda_cross_entropy_shard(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    (void)s;
    return gt_error_set(err, GT_ERR_UNSUPPORTED, "%s: not available on CUDA yet", gt_op_get(c->op)->name);
}

gt_status gt_cuda_cross_entropy_shard_backward(gt_cuda_stream *s, const gt_kernel_call *c, gt_error *err)
{
    (void)s;
    return gt_error_set(err, GT_ERR_UNSUPPORTED, "%s: not available on CUDA yet", gt_op_get(c->op)->name);
}
