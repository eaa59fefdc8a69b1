/* cpu_comm.c — the collective start/wait ops as CPU kernels.
 *
 * Collectives are not kernels: the executors run them through the communicator of their mesh
 * dim (src/runtime/exec.c, src/runtime/eager.c) and never call these. What a kernel can do alone
 * is the one case that needs no peer: over a group of size 1 (attribute group_size, i[1]) a
 * gather, a scatter and a sum are the identity, so a start copies its input and a wait copies
 * the start's result (nothing when the two share a buffer). Any larger group is refused with a
 * message that says where collectives do run. Bytes are copied as they are, in any dtype, except
 * by a widening reduce_scatter_start (bf16/f16 in, f32 out: gt_ops.def), whose one-rank sum is
 * its input widened: the cast kernel, exact. */
#include <string.h>

#include "cpu_internal.h"

static gt_status copy_identity(const gt_kernel_call *c, gt_error *err)
{
    const gt_tensor *in = c->in[0];
    gt_tensor *out = c->out[0];
    size_t nbytes = gt_tensor_nbytes(in);
    if (in->dtype != out->dtype || nbytes != gt_tensor_nbytes(out))
        return gt_error_set(err, GT_ERR_SHAPE,
                            "%s: input (%s, %zu bytes) and output (%s, %zu bytes) differ",
                            gt_kernel_op_name(c->op), gt_dtype_name(in->dtype), nbytes,
                            gt_dtype_name(out->dtype), gt_tensor_nbytes(out));
    if (nbytes && in->data != out->data) memmove(out->data, in->data, nbytes);
    return GT_OK;
}

static gt_status start(const gt_kernel_call *c, gt_error *err)
{
    int64_t group = c->ni >= 2 ? c->i[1] : -1;
    if (group != 1)
        return gt_error_set(err, GT_ERR_UNSUPPORTED,
                            "%s: a collective over a group of %lld ranks runs through a "
                            "communicator (gt_program_set_comms, gt_eager_run_comms), not as a "
                            "kernel",
                            gt_kernel_op_name(c->op), (long long)group);
    return copy_identity(c, err);
}

gt_status gt_cpu_all_gather_start(const gt_kernel_call *c, gt_error *err)
{
    return start(c, err);
}

gt_status gt_cpu_reduce_scatter_start(const gt_kernel_call *c, gt_error *err)
{
    gt_dtype out = c->out[0]->dtype;
    bool widen = gt_dtype_widens_to_f32(c->in[0]->dtype, out);
    if (!widen || c->ni < 2 || c->i[1] != 1) return start(c, err); /* refuses what it cannot do */
    int64_t dtype = (int64_t)out;
    gt_kernel_call cast = *c;
    cast.op = GT_OP_CAST;
    cast.i = &dtype;
    cast.ni = 1;
    return gt_cpu_cast(&cast, err);
}

gt_status gt_cpu_all_reduce_start(const gt_kernel_call *c, gt_error *err)
{
    return start(c, err);
}

gt_status gt_cpu_all_to_all_start(const gt_kernel_call *c, gt_error *err)
{
    return start(c, err);
}

/* A point-to-point start always has a peer: never a kernel. */
static gt_status p2p(const gt_kernel_call *c, gt_error *err)
{
    return gt_error_set(err, GT_ERR_UNSUPPORTED,
                        "%s: a point-to-point transfer runs through a communicator "
                        "(gt_program_set_comms, gt_eager_run_comms), not as a kernel",
                        gt_kernel_op_name(c->op));
}

gt_status gt_cpu_send_start(const gt_kernel_call *c, gt_error *err)
{
    return p2p(c, err);
}

gt_status gt_cpu_recv_start(const gt_kernel_call *c, gt_error *err)
{
    return p2p(c, err);
}

gt_status gt_cpu_wait(const gt_kernel_call *c, gt_error *err)
{
    return copy_identity(c, err);
}
