/* tensor.c — dense, contiguous, row-major host tensors with a concrete shape. */
#include "graphtrain/gt_core.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Product of the dims; -1 when a dim is negative or the product overflows int64. A 0-dim tensor
 * (scalar) has one element. */
int64_t gt_shape_numel(int ndim, const int64_t *shape)
{
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0) return -1;
        if (shape[d] != 0 && n > INT64_MAX / shape[d]) return -1;
        n *= shape[d];
    }
    return n;
}

int64_t gt_tensor_numel(const gt_tensor *t)
{
    return gt_shape_numel(t->ndim, t->shape);
}

size_t gt_tensor_nbytes(const gt_tensor *t)
{
    int64_t n = gt_tensor_numel(t);
    return n < 0 ? 0 : (size_t)n * gt_dtype_size(t->dtype);
}

gt_status gt_tensor_alloc(gt_tensor *t, gt_dtype dt, int ndim, const int64_t *shape, gt_error *err)
{
    memset(t, 0, sizeof *t);
    if ((unsigned)dt >= GT_DTYPE_COUNT)
        return gt_error_set(err, GT_ERR_INVALID, "tensor alloc: unknown dtype %d", (int)dt);
    if (ndim < 0 || ndim > GT_MAX_DIMS)
        return gt_error_set(err, GT_ERR_INVALID, "tensor alloc: ndim %d outside [0, %d]", ndim,
                            GT_MAX_DIMS);
    for (int d = 0; d < ndim; d++)
        if (shape[d] < 0)
            return gt_error_set(err, GT_ERR_INVALID, "tensor alloc: dim %d is %lld, expected >= 0",
                                d, (long long)shape[d]);
    int64_t numel = gt_shape_numel(ndim, shape);
    size_t esize = gt_dtype_size(dt);
    if (numel < 0 || (uint64_t)numel > SIZE_MAX / esize)
        return gt_error_set(err, GT_ERR_INVALID, "tensor alloc: %s tensor of %d dims is too large",
                            gt_dtype_name(dt), ndim);
    size_t nbytes = (size_t)numel * esize;
    void *data = calloc(nbytes ? nbytes : 1, 1);
    if (!data)
        return gt_error_set(err, GT_ERR_NOMEM,
                            "tensor alloc: out of memory for %zu bytes (%s, %lld "
                            "elements)",
                            nbytes, gt_dtype_name(dt), (long long)numel);
    gt_tensor_wrap(t, dt, ndim, shape, data);
    t->owns_data = true;
    return GT_OK;
}

void gt_tensor_wrap(gt_tensor *t, gt_dtype dt, int ndim, const int64_t *shape, void *data)
{
    GT_CHECK(ndim >= 0 && ndim <= GT_MAX_DIMS);
    memset(t, 0, sizeof *t);
    t->dtype = dt;
    t->ndim = ndim;
    for (int d = 0; d < ndim; d++)
        t->shape[d] = shape[d];
    t->data = data;
    t->owns_data = false;
}

void gt_tensor_free(gt_tensor *t)
{
    if (!t) return;
    if (t->owns_data) free(t->data);
    t->data = NULL;
    t->owns_data = false;
}

/* Float -> integer without undefined behaviour: truncate toward zero (as a C cast and torch's
 * .to(int) do), saturate at the type's range, NaN -> 0. */
static int64_t gt_f64_to_i64_sat(double v, int64_t lo, int64_t hi)
{
    if (isnan(v)) return 0;
    if (v <= (double)lo) return lo;
    if (v >= (double)hi) return hi; /* (double)INT64_MAX rounds up to 2^63, so >= is the bound */
    return (int64_t)v;
}

float gt_tensor_get_f32(const gt_tensor *t, int64_t i)
{
    const char *p = (const char *)t->data;
    switch (t->dtype) {
    case GT_F32:
        return ((const float *)p)[i];
    case GT_BF16:
        return gt_bf16_to_f32(((const uint16_t *)p)[i]);
    case GT_F16:
        return gt_f16_to_f32(((const uint16_t *)p)[i]);
    case GT_I32:
        return (float)((const int32_t *)p)[i];
    case GT_I64:
        return (float)((const int64_t *)p)[i];
    case GT_BOOL:
        return ((const uint8_t *)p)[i] ? 1.0f : 0.0f;
    case GT_DTYPE_COUNT:
        break;
    }
    GT_CHECK(!"gt_tensor_get_f32: bad dtype");
    return 0.0f;
}

void gt_tensor_set_f32(gt_tensor *t, int64_t i, float v)
{
    char *p = (char *)t->data;
    switch (t->dtype) {
    case GT_F32:
        ((float *)p)[i] = v;
        return;
    case GT_BF16:
        ((uint16_t *)p)[i] = gt_f32_to_bf16(v);
        return;
    case GT_F16:
        ((uint16_t *)p)[i] = gt_f32_to_f16(v);
        return;
    case GT_I32:
        ((int32_t *)p)[i] = (int32_t)gt_f64_to_i64_sat(v, INT32_MIN, INT32_MAX);
        return;
    case GT_I64:
        ((int64_t *)p)[i] = gt_f64_to_i64_sat(v, INT64_MIN, INT64_MAX);
        return;
    case GT_BOOL:
        ((uint8_t *)p)[i] = (v != 0.0f);
        return; /* NaN != 0: true, as torch */
    case GT_DTYPE_COUNT:
        break;
    }
    GT_CHECK(!"gt_tensor_set_f32: bad dtype");
}

static bool gt_dtype_is_int(gt_dtype dt)
{
    return dt == GT_I32 || dt == GT_I64 || dt == GT_BOOL;
}

static int64_t gt_tensor_get_i64(const gt_tensor *t, int64_t i)
{
    switch (t->dtype) {
    case GT_I32:
        return ((const int32_t *)t->data)[i];
    case GT_I64:
        return ((const int64_t *)t->data)[i];
    case GT_BOOL:
        return ((const uint8_t *)t->data)[i] != 0;
    default:
        break;
    }
    GT_CHECK(!"gt_tensor_get_i64: not an integer dtype");
    return 0;
}

static void gt_tensor_set_i64(gt_tensor *t, int64_t i, int64_t v)
{
    switch (t->dtype) {
    case GT_I32: /* wraps modulo 2^32 like a C/torch narrowing cast, without UB */
        ((int32_t *)t->data)[i] = (int32_t)(uint32_t)(uint64_t)v;
        return;
    case GT_I64:
        ((int64_t *)t->data)[i] = v;
        return;
    case GT_BOOL:
        ((uint8_t *)t->data)[i] = (v != 0);
        return;
    default:
        break;
    }
    GT_CHECK(!"gt_tensor_set_i64: not an integer dtype");
}

/* Same dtype: a byte copy. Integer -> integer: exact through int64. Anything involving a float:
 * through f32, which holds every bf16/f16 value exactly. */
void gt_tensor_convert(const gt_tensor *src, gt_tensor *dst)
{
    int64_t n = gt_tensor_numel(src);
    GT_CHECK(n >= 0 && n == gt_tensor_numel(dst));
    if (src->dtype == dst->dtype) {
        if (n > 0 && src->data != dst->data) memcpy(dst->data, src->data, gt_tensor_nbytes(src));
        return;
    }
    if (gt_dtype_is_int(src->dtype) && gt_dtype_is_int(dst->dtype)) {
        for (int64_t i = 0; i < n; i++)
            gt_tensor_set_i64(dst, i, gt_tensor_get_i64(src, i));
        return;
    }
    for (int64_t i = 0; i < n; i++)
        gt_tensor_set_f32(dst, i, gt_tensor_get_f32(src, i));
}

int gt_tensor_format_type(const gt_tensor *t, char *buf, size_t n)
{
    /* Builds the text piecewise; returns the full length even when buf is too small (snprintf). */
    char tmp[32 + GT_MAX_DIMS * 24];
    int len = snprintf(tmp, sizeof tmp, "%s[", gt_dtype_name(t->dtype));
    for (int d = 0; d < t->ndim && d < GT_MAX_DIMS; d++)
        len += snprintf(tmp + len, sizeof tmp - (size_t)len, "%s%lld", d ? ", " : "",
                        (long long)t->shape[d]);
    len += snprintf(tmp + len, sizeof tmp - (size_t)len, "]");
    if (buf && n) snprintf(buf, n, "%s", tmp);
    return len;
}
