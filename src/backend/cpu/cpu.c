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

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef gt_status (*gt_cpu_kernel)(const gt_kernel_call *c, gt_error *err);

typedef struct {
    gt_cpu_kernel fn;
    int n_in, n_out; /* -1: variadic / from attributes */
    bool bytes;      /* the kernel handles every dtype itself (see the file comment) */
} gt_cpu_entry;

/* bytes: GT_OPF_MOVES_BYTES (layout ops, cast, full) or GT_OPF_NO_WIDEN (gathers, fused ops that
 * run their parts' kernels, each widening for itself, collectives) in gt_ops.def. Read from the
 * table's flags, not gt_op_get: backends depend on core only. */
enum { GT_CPU_OWN_DTYPE = GT_OPF_MOVES_BYTES | GT_OPF_NO_WIDEN };

static const gt_cpu_entry gt_cpu_table[GT_OP_COUNT] = {
#define X(E, name, nin, nout, flags, rule, alias, pairs, recompute, schema)                        \
    [GT_OP_##E] = {gt_cpu_##name, nin, nout, ((flags)&GT_CPU_OWN_DTYPE) != 0},
#include "graphtrain/gt_ops.def"
#undef X
};

static bool gt_cpu_is_half(gt_dtype dt)
{
    return dt == GT_BF16 || dt == GT_F16;
}

/* The f32 temporaries are kept between calls: the largest few, up to GT_CPU_KEPT_BYTES in all.
 * Fresh ones of a step's sizes came from the kernel as zeroed pages at every call (the allocator
 * returns freed large blocks to it): page faults and clearing took about 4 % of a debugmodel step
 * on the CPU. Process-wide, under a lock (ranks of a test may be threads of one process); what is
 * kept stays reachable from here until exit. */
#define GT_CPU_KEPT 8
#define GT_CPU_KEPT_BYTES ((size_t)512 << 20)

static struct {
    void *p;
    size_t cap;
} gt_cpu_kept[GT_CPU_KEPT];
static size_t gt_cpu_kept_bytes;
static pthread_mutex_t gt_cpu_kept_lock = PTHREAD_MUTEX_INITIALIZER;

/* A block of at least `bytes`: the smallest kept one that fits, else a new one; *cap its size. */
static void *gt_cpu_scratch_take(size_t bytes, size_t *cap)
{
    pthread_mutex_lock(&gt_cpu_kept_lock);
    int best = -1;
    for (int k = 0; k < GT_CPU_KEPT; k++)
        if (gt_cpu_kept[k].p && gt_cpu_kept[k].cap >= bytes &&
            (best < 0 || gt_cpu_kept[k].cap < gt_cpu_kept[best].cap))
            best = k;
    void *p = NULL;
    if (best >= 0) {
        p = gt_cpu_kept[best].p;
        *cap = gt_cpu_kept[best].cap;
        gt_cpu_kept_bytes -= *cap;
        gt_cpu_kept[best].p = NULL;
    }
    pthread_mutex_unlock(&gt_cpu_kept_lock);
    if (!p) {
        p = malloc(bytes);
        *cap = bytes;
    }
    return p;
}

/* Gives a block back: kept in place of smaller ones while the budget allows, else freed. */
static void gt_cpu_scratch_give(void *p, size_t cap)
{
    void *drop[GT_CPU_KEPT + 1];
    int n_drop = 0;
    pthread_mutex_lock(&gt_cpu_kept_lock);
    for (;;) {
        int empty = -1, small = -1;
        for (int k = 0; k < GT_CPU_KEPT; k++) {
            if (!gt_cpu_kept[k].p)
                empty = k;
            else if (small < 0 || gt_cpu_kept[k].cap < gt_cpu_kept[small].cap)
                small = k;
        }
        if (empty >= 0 && gt_cpu_kept_bytes + cap <= GT_CPU_KEPT_BYTES) {
            gt_cpu_kept[empty].p = p;
            gt_cpu_kept[empty].cap = cap;
            gt_cpu_kept_bytes += cap;
            p = NULL;
            break;
        }
        if (small < 0 || gt_cpu_kept[small].cap >= cap || cap > GT_CPU_KEPT_BYTES) break;
        drop[n_drop++] = gt_cpu_kept[small].p; /* a smaller kept block makes room */
        gt_cpu_kept_bytes -= gt_cpu_kept[small].cap;
        gt_cpu_kept[small].p = NULL;
    }
    pthread_mutex_unlock(&gt_cpu_kept_lock);
    for (int k = 0; k < n_drop; k++)
        free(drop[k]);
    free(p);
}

/* Widens a bf16/f16 tensor into an f32 temporary of the same shape (*cap: its block's size, for
 * gt_cpu_scratch_give). */
static gt_status gt_cpu_widen(const gt_kernel_call *c, const gt_tensor *src, gt_tensor *dst,
                              bool copy, size_t *cap, gt_error *err)
{
    int64_t n = gt_tensor_numel(src);
    float *data = gt_cpu_scratch_take(n > 0 ? (size_t)n * sizeof(float) : 1, cap);
    if (!data)
        return gt_error_set(err, GT_ERR_NOMEM, "%s: out of memory widening %lld %s elements to f32",
                            gt_kernel_op_name(c->op), (long long)n, gt_dtype_name(src->dtype));
    gt_tensor_wrap(dst, GT_F32, src->ndim, src->shape, data);
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
    size_t cin[GT_MAX_IN], cout[GT_MAX_OUT];
    gt_status st = GT_OK;
    for (int k = 0; k < c->n_in && st == GT_OK; k++) {
        if (!gt_cpu_is_half(c->in[k]->dtype)) continue;
        st = gt_cpu_widen(c, c->in[k], &tin[k], true, &cin[k], err);
        if (st == GT_OK) {
            win[k] = true;
            w.in[k] = &tin[k];
        }
    }
    for (int k = 0; k < c->n_out && st == GT_OK; k++) {
        if (!gt_cpu_is_half(c->out[k]->dtype)) continue;
        st = gt_cpu_widen(c, c->out[k], &tout[k], false, &cout[k], err);
        if (st == GT_OK) {
            wout[k] = true;
            w.out[k] = &tout[k];
        }
    }
    if (st == GT_OK) st = fn(&w, err);
    for (int k = 0; k < c->n_out; k++) {
        if (!wout[k]) continue;
        if (st == GT_OK) gt_cpu_narrow(&tout[k], c->out[k]);
        gt_cpu_scratch_give(tout[k].data, cout[k]);
    }
    for (int k = 0; k < c->n_in; k++)
        if (win[k]) gt_cpu_scratch_give(tin[k].data, cin[k]);
    return st;
}

static gt_status gt_cpu_run_entry(const gt_cpu_entry *e, const gt_kernel_call *c, gt_error *err)
{
    bool any_half = false;
    for (int k = 0; k < c->n_in + c->n_out; k++)
        any_half |= gt_cpu_is_half(k < c->n_in ? c->in[k]->dtype : c->out[k - c->n_in]->dtype);
    if (!any_half || e->bytes) return e->fn(c, err);
    return gt_cpu_run_widened(c, e->fn, err);
}

gt_status gt_cpu_run_kernel(const gt_kernel_call *c, gt_error *err)
{
    if (!c || (unsigned)c->op >= GT_OP_COUNT)
        return gt_error_set(err, GT_ERR_INVALID, "cpu kernel: unknown op %d", c ? (int)c->op : -1);
    const gt_cpu_entry *e = &gt_cpu_table[c->op];
    GT_TRY(gt_kernel_check_call(c, e->n_in, e->n_out, err));
    if (!gt_cpu_prof_on()) return gt_cpu_run_entry(e, c, err);
    int depth = gt_cpu_prof_enter();
    double t0 = gt_cpu_prof_now();
    gt_status st = gt_cpu_run_entry(e, c, err);
    gt_cpu_prof_op(c->op, depth, gt_cpu_prof_now() - t0);
    return st;
}
