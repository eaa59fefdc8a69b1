/* cpu_cast.c — full and cast: the two kernels that produce a dtype of their own choosing, so they
 * write the stored representation of every dtype directly (no f32 wrapper).
 *
 * Conversions round to nearest even (float -> narrower float); float -> integer truncates toward
 * zero and saturates, NaN -> 0 (core's gt_tensor_set_f32 rules); bool is value != 0. A bf16/f16
 * value fits f32 exactly, so bf16 <-> f16 rounds once. */
#include "cpu_internal.h"

#include <math.h>
#include <string.h>

gt_status gt_cpu_full(const gt_kernel_call *c, gt_error *err)
{
    gt_tensor *out = c->out[0];
    uint8_t bits[8]; /* the value once in the output's representation, then replicated */
    GT_TRY(gt_kernel_want_full(c, bits, err));
    int64_t n = gt_tensor_numel(out);
    if (n == 0) return GT_OK;
    size_t es = gt_dtype_size(out->dtype), total = (size_t)n * es;
    uint8_t *p = out->data;
    /* One element, then the filled prefix copied after itself (doubling) until all n are set. */
    memcpy(p, bits, es);
    for (size_t done = es; done < total; done *= 2)
        memcpy(p + done, p, done < total - done ? done : total - done);
    return GT_OK;
}

gt_status gt_cpu_cast(const gt_kernel_call *c, gt_error *err)
{
    const gt_tensor *x = c->in[0];
    gt_tensor *out = c->out[0];
    GT_TRY(gt_kernel_want_cast(c, err));
    int64_t n = gt_tensor_numel(x);
    if (n == 0) return GT_OK;
    if (x->dtype == out->dtype) {
        if (x->data != out->data) memmove(out->data, x->data, gt_tensor_nbytes(x));
        return GT_OK;
    }
    /* The hot conversions of mixed precision get plain loops; the rest go element by element
     * through core's converter. */
    if (x->dtype == GT_F32 && out->dtype == GT_BF16) {
        gt_f32_to_bf16_n(x->data, out->data, n);
    } else if (x->dtype == GT_BF16 && out->dtype == GT_F32) {
        gt_bf16_to_f32_n(x->data, out->data, n);
    } else if (x->dtype == GT_F32 && out->dtype == GT_F16) {
        const float *s = x->data;
        uint16_t *d = out->data;
        for (int64_t k = 0; k < n; k++)
            d[k] = gt_f32_to_f16(s[k]);
    } else if (x->dtype == GT_F16 && out->dtype == GT_F32) {
        const uint16_t *s = x->data;
        float *d = out->data;
        for (int64_t k = 0; k < n; k++)
            d[k] = gt_f16_to_f32(s[k]);
    } else {
        gt_tensor_convert(x, out);
    }
    return GT_OK;
}
