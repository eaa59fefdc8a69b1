/* cpu_fused.c — fused_elementwise on the CPU: the reference the CUDA kernel and the fusion pass's
 * exactness are checked against.
 *
 * The program runs over the output in chunks of GT_CPU_FUSED_CHUNK elements. For a chunk, every
 * input is gathered (broadcast to the output's index space by numpy rules) into an f32 buffer —
 * the dispatcher has already widened bf16/f16 inputs exactly and rounds the f32 result into the
 * real output — then each instruction runs the very f32 kernel its op runs unfused
 * (cpu_elementwise.c, cpu_optim.c: gt_cpu_add, gt_cpu_silu, ...) on the chunk, and its result is
 * rounded to the instruction's dtype and widened back. That is the unfused graph element by
 * element: the same f32 arithmetic on the same (already rounded) operands, rounded where each
 * unfused output was stored, so fused and unfused results are bitwise equal by construction.
 * Only the intermediates never leave the chunk buffers; the registers that are outputs of the
 * node (gt_fused_outputs: the flagged ones and the last) are copied to their outputs per chunk,
 * all of one shape (the shape rule's requirement), so one index space serves every output. */
#include "cpu_internal.h"
#include "ir/fused_program.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define GT_CPU_FUSED_CHUNK 1024
/* chunks per job on the backend's threads (a job computes each of its elements alone) */
#define GT_CPU_FUSED_BLOCK (GT_CPU_GRAIN / GT_CPU_FUSED_CHUNK)

/* The f32 kernel of an op of a program (cast has none: it is a rounding only). */
static gt_status gt_cpu_fused_run_op(int op, const gt_kernel_call *c, gt_error *err)
{
    switch (op) {
    case GT_OP_ADD:
        return gt_cpu_add(c, err);
    case GT_OP_SUB:
        return gt_cpu_sub(c, err);
    case GT_OP_MUL:
        return gt_cpu_mul(c, err);
    case GT_OP_DIV:
        return gt_cpu_div(c, err);
    case GT_OP_NEG:
        return gt_cpu_neg(c, err);
    case GT_OP_EXP:
        return gt_cpu_exp(c, err);
    case GT_OP_LOG:
        return gt_cpu_log(c, err);
    case GT_OP_SQRT:
        return gt_cpu_sqrt(c, err);
    case GT_OP_RSQRT:
        return gt_cpu_rsqrt(c, err);
    case GT_OP_SILU:
        return gt_cpu_silu(c, err);
    case GT_OP_SIGMOID:
        return gt_cpu_sigmoid(c, err);
    case GT_OP_SCALE:
        return gt_cpu_scale(c, err);
    case GT_OP_ADD_SCALAR:
        return gt_cpu_add_scalar(c, err);
    case GT_OP_SILU_BACKWARD:
        return gt_cpu_silu_backward(c, err);
    case GT_OP_CLAMP:
        return gt_cpu_clamp(c, err);
    default:
        return gt_error_set(err, GT_ERR_INVALID, "fused_elementwise: op %d is not fusable", op);
    }
}

/* Rounds n f32 values to dt and widens them back (the store and reload of an unfused output). */
static void gt_cpu_fused_round(float *v, int64_t n, int dt)
{
    if (dt == GT_BF16) {
        gt_f32_round_bf16_n(v, n);
    } else if (dt == GT_F16) {
        for (int64_t i = 0; i < n; i++)
            v[i] = gt_f16_to_f32(gt_f32_to_f16(v[i]));
    }
}

/* Checks the program against the call (the shape rule checked the graph; a kernel may also be
 * called directly) and decodes it. */
static gt_status gt_cpu_fused_decode(const gt_kernel_call *c, gt_fused_ins *ins, gt_error *err)
{
    if (c->ni < 1 || c->ni > GT_FUSED_MAX_INS)
        return gt_error_set(err, GT_ERR_INVALID,
                            "fused_elementwise: %d instructions, expected 1 to %d", c->ni,
                            GT_FUSED_MAX_INS);
    for (int k = 0; k < c->ni; k++) {
        ins[k] = gt_fused_decode(c->i[k]);
        int arity = gt_fused_arity(ins[k].op), nc = gt_fused_n_const(ins[k].op);
        bool ok = arity > 0 && !gt_fused_has_extra_bits(c->i[k]) &&
                  gt_fused_float_dtype(ins[k].dtype) && (nc == 0 || ins[k].fslot + nc <= c->nf);
        for (int s = 0; ok && s < arity; s++) {
            int src = ins[k].src[s];
            ok = src < c->n_in || (src >= GT_FUSED_TEMP && src - GT_FUSED_TEMP < k);
        }
        if (!ok)
            return gt_error_set(err, GT_ERR_INVALID,
                                "fused_elementwise: instruction %d (0x%llx) is malformed for %d "
                                "inputs and %d constants",
                                k, (unsigned long long)c->i[k], c->n_in, c->nf);
    }
    return GT_OK;
}

typedef struct {
    const gt_kernel_call *c;
    const gt_fused_ins *ins;
    const int *out_reg;
    int n_res;
    const int64_t (*stride)[GT_MAX_DIMS];
    const bool *same;
    bool broadcast; /* some input is gathered */
    int64_t n;
} gt_cpu_fused_job;

/* Block b: chunks [b GT_CPU_FUSED_BLOCK, (b + 1) GT_CPU_FUSED_BLOCK) of the output, with buffers
 * of its own. Every element is computed alone, so the blocks may run on any threads. */
static gt_status gt_cpu_fused_block(int b, void *user, gt_error *err)
{
    const gt_cpu_fused_job *jb = user;
    const gt_kernel_call *c = jb->c;
    const gt_fused_ins *ins = jb->ins;
    const gt_tensor *out = c->out[0];
    int nd = out->ndim, n_in = c->n_in;
    int64_t n = jb->n, lo = (int64_t)b * GT_CPU_FUSED_BLOCK * GT_CPU_FUSED_CHUNK;
    int64_t hi = n - lo < (int64_t)GT_CPU_FUSED_BLOCK * GT_CPU_FUSED_CHUNK
                     ? n
                     : lo + (int64_t)GT_CPU_FUSED_BLOCK * GT_CPU_FUSED_CHUNK;
    /* n_in gather buffers, then one register per instruction, each a chunk long */
    size_t chunk = GT_CPU_FUSED_CHUNK;
    float *buf = malloc((size_t)(n_in + c->ni) * chunk * sizeof(float));
    if (!buf)
        return gt_error_set(err, GT_ERR_NOMEM, "fused_elementwise: out of memory for %d buffers",
                            n_in + c->ni);
    float *gather[GT_MAX_IN], *reg[GT_FUSED_MAX_INS];
    for (int k = 0; k < n_in; k++)
        gather[k] = buf + (size_t)k * chunk;
    for (int k = 0; k < c->ni; k++)
        reg[k] = buf + (size_t)(n_in + k) * chunk;

    /* odometer over the output's index space for the broadcast inputs, from element lo (none:
     * inputs are read in place and the walk is skipped) */
    int64_t idx[GT_MAX_DIMS] = {0}, off[GT_MAX_IN] = {0};
    for (int64_t r = lo, d = nd - 1; jb->broadcast && d >= 0; d--) {
        idx[d] = r % out->shape[d];
        r /= out->shape[d];
        for (int k = 0; k < n_in; k++)
            off[k] += idx[d] * jb->stride[k][d];
    }
    gt_status st = GT_OK;
    for (int64_t i0 = lo; i0 < hi && st == GT_OK; i0 += (int64_t)chunk) {
        int64_t len = hi - i0 < (int64_t)chunk ? hi - i0 : (int64_t)chunk;
        const float *operand[GT_MAX_IN];
        for (int k = 0; k < n_in; k++)
            operand[k] = jb->same[k] ? (const float *)c->in[k]->data + i0 : gather[k];
        for (int64_t j = 0; jb->broadcast && j < len; j++) {
            for (int k = 0; k < n_in; k++)
                if (!jb->same[k]) gather[k][j] = ((const float *)c->in[k]->data)[off[k]];
            for (int d = nd - 1; d >= 0; d--) { /* next index, row-major */
                for (int k = 0; k < n_in; k++)
                    off[k] += jb->stride[k][d];
                if (++idx[d] < out->shape[d]) break;
                for (int k = 0; k < n_in; k++)
                    off[k] -= jb->stride[k][d] * idx[d];
                idx[d] = 0;
            }
        }
        for (int k = 0; k < c->ni && st == GT_OK; k++) {
            int op = ins[k].op, arity = gt_fused_arity(op);
            const float *src[2] = {NULL, NULL};
            for (int s = 0; s < arity; s++) {
                int o = ins[k].src[s];
                src[s] = o < GT_FUSED_TEMP ? operand[o] : reg[o - GT_FUSED_TEMP];
            }
            if (op == GT_OP_CAST) {
                memcpy(reg[k], src[0], (size_t)len * sizeof(float));
            } else {
                int64_t shape[1] = {len};
                gt_tensor a, b, r;
                gt_tensor_wrap(&a, GT_F32, 1, shape, (void *)src[0]);
                gt_tensor_wrap(&r, GT_F32, 1, shape, reg[k]);
                gt_kernel_call call = {.op = (gt_op)op, .n_in = arity, .n_out = 1};
                call.in[0] = &a;
                if (arity == 2) {
                    gt_tensor_wrap(&b, GT_F32, 1, shape, (void *)src[1]);
                    call.in[1] = &b;
                }
                call.out[0] = &r;
                int nc = gt_fused_n_const(op);
                if (nc) {
                    call.f = c->f + ins[k].fslot;
                    call.nf = nc;
                }
                st = gt_cpu_fused_run_op(op, &call, err);
            }
            gt_cpu_fused_round(reg[k], len, ins[k].dtype);
        }
        for (int j = 0; j < jb->n_res && st == GT_OK; j++)
            memcpy((float *)c->out[j]->data + i0, reg[jb->out_reg[j]], (size_t)len * sizeof(float));
    }
    free(buf);
    return st;
}

gt_status gt_cpu_fused_elementwise(const gt_kernel_call *c, gt_error *err)
{
    gt_fused_ins ins[GT_FUSED_MAX_INS];
    GT_TRY(gt_cpu_fused_decode(c, ins, err));
    int out_reg[GT_FUSED_MAX_INS];
    int n_res = gt_fused_outputs(c->i, c->ni, out_reg);
    if (c->n_out != n_res)
        return gt_error_set(err, GT_ERR_INVALID,
                            "fused_elementwise: called with %d outputs, its program has %d (the "
                            "flagged instructions and the last)",
                            c->n_out, n_res);
    gt_tensor *out = c->out[0];
    for (int j = 0; j < n_res; j++) {
        char what[32];
        snprintf(what, sizeof what, "output %d", j);
        GT_TRY(gt_cpu_want_f32(c, c->out[j], what, err));
        if (j > 0) GT_TRY(gt_kernel_want_same_shape(c, c->out[j], what, out, "output 0", err));
    }
    int nd = out->ndim, n_in = c->n_in;
    int64_t stride[GT_MAX_IN][GT_MAX_DIMS];
    bool same[GT_MAX_IN], broadcast = false; /* broadcast: some input is gathered */
    int64_t n = gt_tensor_numel(out);
    for (int k = 0; k < n_in; k++) {
        const gt_tensor *x = c->in[k];
        char what[32];
        snprintf(what, sizeof what, "input %d", k);
        GT_TRY(gt_cpu_want_f32(c, x, what, err));
        if (!gt_cpu_broadcast_strides(nd, out->shape, x->ndim, x->shape, stride[k])) {
            char bx[128], bo[128];
            return gt_error_set(
                err, GT_ERR_SHAPE,
                "fused_elementwise: input %d %s does not broadcast to the output %s", k,
                gt_kernel_fmt(x, bx, sizeof bx), gt_kernel_fmt(out, bo, sizeof bo));
        }
        same[k] = gt_tensor_numel(x) == n; /* then the strides are the output's own */
        broadcast = broadcast || !same[k];
    }
    if (n == 0) return GT_OK;
    gt_cpu_fused_job j = {.c = c,
                          .ins = ins,
                          .out_reg = out_reg,
                          .n_res = n_res,
                          .stride = stride,
                          .same = same,
                          .broadcast = broadcast,
                          .n = n};
    int64_t per = (int64_t)GT_CPU_FUSED_BLOCK * GT_CPU_FUSED_CHUNK, blocks = (n + per - 1) / per;
    if (blocks > INT32_MAX)
        return gt_error_set(err, GT_ERR_UNSUPPORTED, "fused_elementwise: %lld elements",
                            (long long)n);
    gt_status st = gt_cpu_run_jobs((int)blocks, gt_cpu_fused_block, &j, err);
    if (st != GT_OK) return gt_error_wrap(err, "fused_elementwise");
    return GT_OK;
}
