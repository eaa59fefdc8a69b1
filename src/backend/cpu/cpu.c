/* cpu.c — the CPU backend's entry point: argument checks, dispatch, and the one generic
 * bf16/f16 wrapper.
 *
 * The arithmetic kernels are written for f32 only. When a float input or output of such a kernel
 * is bf16 or f16, the wrapper widens those inputs into f32 temporaries (exact), runs the f32
 * kernel into f32 temporaries, and rounds them into the real outputs (nearest even) — so a
 * low-precision op equals the f32 op on the same (already rounded) inputs, rounded once. Kernels
 * that only move elements (layout ops, embedding), and cast and full, work on the stored bytes of
 * any dtype and skip the wrapper: for them widening would change nothing but the cost. */
#include "cpu_internal.h"

#include <stdlib.h>
#include <string.h>

typedef gt_status (*gt_cpu_kernel)(const gt_kernel_call *c, gt_error *err);

typedef struct {
    gt_cpu_kernel fn;
    int n_in, n_out; /* -1: variadic / from attributes */
} gt_cpu_entry;

static const gt_cpu_entry gt_cpu_table[GT_OP_COUNT] = {
#define X(E, name, nin, nout, flags, schema) [GT_OP_##E] = {gt_cpu_##name, nin, nout},
#include "graphtrain/gt_ops.def"
#undef X
};

/* Ops whose kernels handle every dtype themselves (see the file comment). */
static bool gt_cpu_is_byte_kernel(gt_op op)
{
    switch (op) {
    case GT_OP_FULL:
    case GT_OP_CAST:
    case GT_OP_BROADCAST_TO:
    case GT_OP_RESHAPE:
    case GT_OP_TRANSPOSE:
    case GT_OP_PERMUTE:
    case GT_OP_SLICE:
    case GT_OP_SLICE_BACKWARD:
    case GT_OP_CONCAT:
    case GT_OP_SPLIT:
    case GT_OP_EMBEDDING:
    case GT_OP_EMBEDDING_SHARD:
    case GT_OP_ADD_RMS_NORM:            /* runs add and rms_norm, each widening for itself */
    case GT_OP_RMS_NORM_BACKWARD_ADD:   /* runs adds and rms_norm_backward likewise */
    case GT_OP_CROSS_ENTROPY_WITH_GRAD: /* runs cross_entropy and its backward likewise */
    case GT_OP_ALL_GATHER_START: /* collectives never run as kernels: keep NaN bits if called */
    case GT_OP_REDUCE_SCATTER_START:
    case GT_OP_ALL_REDUCE_START:
    case GT_OP_ALL_TO_ALL_START:
    case GT_OP_WAIT:
        return true;
    default:
        return false;
    }
}

static bool gt_cpu_is_half(gt_dtype dt)
{
    return dt == GT_BF16 || dt == GT_F16;
}

/* Widens a bf16/f16 tensor into a new f32 tensor of the same shape. */
static gt_status gt_cpu_widen(const gt_kernel_call *c, const gt_tensor *src, gt_tensor *dst,
                              bool copy, gt_error *err)
{
    int64_t n = gt_tensor_numel(src);
    float *data = malloc(n > 0 ? (size_t)n * sizeof(float) : 1);
    if (!data)
        return gt_error_set(err, GT_ERR_NOMEM, "%s: out of memory widening %lld %s elements to f32",
                            gt_kernel_op_name(c->op), (long long)n, gt_dtype_name(src->dtype));
    gt_tensor_wrap(dst, GT_F32, src->ndim, src->shape, data);
    dst->owns_data = true;
    if (!copy) return GT_OK;
    const uint16_t *h = src->data;
    if (src->dtype == GT_BF16) {
        gt_bf16_to_f32_n(h, data, n);
    } else {
        for (int64_t i = 0; i < n; i++)
            data[i] = gt_f16_to_f32(h[i]);
    }
    return GT_OK;
}

static void gt_cpu_narrow(const gt_tensor *src, gt_tensor *dst)
{
    int64_t n = gt_tensor_numel(dst);
    const float *f = src->data;
    uint16_t *h = dst->data;
    if (dst->dtype == GT_BF16) {
        gt_f32_to_bf16_n(f, h, n);
    } else {
        for (int64_t i = 0; i < n; i++)
            h[i] = gt_f32_to_f16(f[i]);
    }
}

static gt_status gt_cpu_run_widened(const gt_kernel_call *c, gt_cpu_kernel fn, gt_error *err)
{
    gt_kernel_call w = *c;
    gt_tensor tin[GT_MAX_IN], tout[GT_MAX_OUT];
    bool win[GT_MAX_IN] = {false}, wout[GT_MAX_OUT] = {false};
    gt_status st = GT_OK;
    for (int k = 0; k < c->n_in && st == GT_OK; k++) {
        if (!gt_cpu_is_half(c->in[k]->dtype)) continue;
        st = gt_cpu_widen(c, c->in[k], &tin[k], true, err);
        if (st == GT_OK) {
            win[k] = true;
            w.in[k] = &tin[k];
        }
    }
    for (int k = 0; k < c->n_out && st == GT_OK; k++) {
        if (!gt_cpu_is_half(c->out[k]->dtype)) continue;
        st = gt_cpu_widen(c, c->out[k], &tout[k], false, err);
        if (st == GT_OK) {
            wout[k] = true;
            w.out[k] = &tout[k];
        }
    }
    if (st == GT_OK) st = fn(&w, err);
    for (int k = 0; k < c->n_out; k++) {
        if (!wout[k]) continue;
        if (st == GT_OK) gt_cpu_narrow(&tout[k], c->out[k]);
        gt_tensor_free(&tout[k]);
    }
    for (int k = 0; k < c->n_in; k++)
        if (win[k]) gt_tensor_free(&tin[k]);
    return st;
}

gt_status gt_cpu_run_kernel(const gt_kernel_call *c, gt_error *err)
{
    if (!c || (unsigned)c->op >= GT_OP_COUNT)
        return gt_error_set(err, GT_ERR_INVALID, "cpu kernel: unknown op %d", c ? (int)c->op : -1);
    const gt_cpu_entry *e = &gt_cpu_table[c->op];
    GT_TRY(gt_kernel_check_call(c, e->n_in, e->n_out, err));
    bool any_half = false;
    for (int k = 0; k < c->n_in + c->n_out; k++)
        any_half |= gt_cpu_is_half(k < c->n_in ? c->in[k]->dtype : c->out[k - c->n_in]->dtype);
    if (!any_half || gt_cpu_is_byte_kernel(c->op)) return e->fn(c, err);
    return gt_cpu_run_widened(c, e->fn, err);
}
