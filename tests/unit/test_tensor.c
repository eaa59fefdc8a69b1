/* test_tensor.c — host tensors (alloc, wrap, element access, conversion, type text) and the core
 * error and logging helpers they report through. */
#include "graphtrain/gt_core.h"
#include "gt_test.h"

#include <stdint.h>
#include <string.h>

/* Let a huge calloc fail with NULL under AddressSanitizer instead of aborting the test. */
const char *__asan_default_options(void);
const char *__asan_default_options(void)
{
    return "allocator_may_return_null=1";
}

static void test_alloc(void)
{
    gt_error err = {0};
    gt_tensor t;
    int64_t shape[3] = {2, 3, 4};
    EXPECT_OK(gt_tensor_alloc(&t, GT_F32, 3, shape, &err), &err);
    EXPECT(gt_tensor_numel(&t) == 24 && gt_tensor_nbytes(&t) == 96, "numel/nbytes");
    int nonzero = 0;
    for (int i = 0; i < 96; i++)
        nonzero += ((uint8_t *)t.data)[i] != 0;
    EXPECT(nonzero == 0 && t.owns_data, "zero-filled and owned");
    char buf[64];
    int n = gt_tensor_format_type(&t, buf, sizeof buf);
    EXPECT(strcmp(buf, "f32[2, 3, 4]") == 0 && n == (int)strlen(buf), "type text %s", buf);
    gt_tensor_free(&t);
    EXPECT(t.data == NULL, "free clears data");

    EXPECT_OK(gt_tensor_alloc(&t, GT_BOOL, 1, (int64_t[]){5}, &err), &err);
    EXPECT(gt_tensor_nbytes(&t) == 5, "bool is one byte");
    gt_tensor_free(&t);
    EXPECT_OK(gt_tensor_alloc(&t, GT_BF16, 0, NULL, &err), &err);
    EXPECT(gt_tensor_numel(&t) == 1 && gt_tensor_nbytes(&t) == 2, "scalar");
    gt_tensor_format_type(&t, buf, sizeof buf);
    EXPECT(strcmp(buf, "bf16[]") == 0, "scalar text %s", buf);
    gt_tensor_free(&t);
    EXPECT_OK(gt_tensor_alloc(&t, GT_I64, 2, (int64_t[]){3, 0}, &err), &err);
    EXPECT(gt_tensor_numel(&t) == 0 && t.data != NULL, "empty tensor");
    gt_tensor_free(&t);

    gt_error_clear(&err);
    EXPECT(gt_tensor_alloc(&t, GT_F32, 2, (int64_t[]){3, -1}, &err) == GT_ERR_INVALID &&
               strstr(err.msg, "dim 1") && strstr(err.msg, "-1"),
           "negative dim: %s", err.msg);
    gt_error_clear(&err);
    int64_t nine[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    EXPECT(gt_tensor_alloc(&t, GT_F32, 9, nine, &err) == GT_ERR_INVALID, "ndim 9: %s", err.msg);
    gt_error_clear(&err);
    EXPECT(gt_tensor_alloc(&t, GT_F32, -1, nine, &err) == GT_ERR_INVALID, "ndim -1");
    gt_error_clear(&err);
    EXPECT(gt_tensor_alloc(&t, GT_F32, 2, (int64_t[]){INT64_MAX / 2, 4}, &err) == GT_ERR_INVALID,
           "overflowing size: %s", err.msg);
    gt_error_clear(&err);
    /* 2^50 bytes: more than any address space here, so calloc fails */
    EXPECT(gt_tensor_alloc(&t, GT_F32, 2, (int64_t[]){(int64_t)1 << 40, 256}, &err) ==
                   GT_ERR_NOMEM &&
               strstr(err.msg, "1125899906842624"),
           "NOMEM names the byte count: %s", err.msg);
    EXPECT(t.data == NULL, "failed alloc leaves no data");

    EXPECT(gt_shape_numel(2, (int64_t[]){-2, 3}) == -1, "numel of a negative shape");
    EXPECT(gt_shape_numel(3, (int64_t[]){INT64_MAX, 2, 0}) == -1, "numel overflow");
    EXPECT(gt_shape_numel(0, NULL) == 1, "numel of a scalar");
}

static void test_access_convert(void)
{
    gt_error err = {0};
    float raw[6] = {0.5f, -1.25f, 3.0f, 1e10f, -7.9f, 0.1f};
    gt_tensor w;
    gt_tensor_wrap(&w, GT_F32, 2, (int64_t[]){2, 3}, raw);
    EXPECT(!w.owns_data && gt_tensor_get_f32(&w, 4) == -7.9f, "wrap reads caller memory");
    gt_tensor_free(&w); /* must not free raw (ASan would report it) */
    gt_tensor_wrap(&w, GT_F32, 2, (int64_t[]){2, 3}, raw);

    gt_tensor i32, bf, b, i64, back;
    EXPECT_OK(gt_tensor_alloc(&i32, GT_I32, 1, (int64_t[]){6}, &err), &err);
    EXPECT_OK(gt_tensor_alloc(&bf, GT_BF16, 2, (int64_t[]){3, 2}, &err), &err);
    EXPECT_OK(gt_tensor_alloc(&b, GT_BOOL, 1, (int64_t[]){6}, &err), &err);
    EXPECT_OK(gt_tensor_alloc(&i64, GT_I64, 1, (int64_t[]){6}, &err), &err);
    EXPECT_OK(gt_tensor_alloc(&back, GT_F32, 1, (int64_t[]){6}, &err), &err);
    gt_tensor_convert(&w, &i32);
    const int32_t want_i32[6] = {0, -1, 3, INT32_MAX, -7, 0}; /* truncation, saturation */
    for (int i = 0; i < 6; i++)
        EXPECT(((int32_t *)i32.data)[i] == want_i32[i], "f32->i32 [%d] = %d", i,
               ((int32_t *)i32.data)[i]);
    gt_tensor_convert(&w, &bf);
    for (int i = 0; i < 6; i++)
        EXPECT(((uint16_t *)bf.data)[i] == gt_f32_to_bf16(raw[i]), "f32->bf16 [%d]", i);
    gt_tensor_convert(&bf, &back);
    for (int i = 0; i < 6; i++)
        EXPECT(((float *)back.data)[i] == gt_bf16_to_f32(gt_f32_to_bf16(raw[i])), "bf16->f32");
    gt_tensor_convert(&w, &b);
    for (int i = 0; i < 6; i++)
        EXPECT(((uint8_t *)b.data)[i] == 1, "nonzero -> true");
    /* integer -> integer is exact beyond f32's 24-bit mantissa */
    ((int32_t *)i32.data)[0] = 16777217;
    ((int32_t *)i32.data)[1] = -2147483647;
    gt_tensor_convert(&i32, &i64);
    EXPECT(((int64_t *)i64.data)[0] == 16777217 && ((int64_t *)i64.data)[1] == -2147483647,
           "i32->i64 exact");
    gt_tensor_set_f32(&i64, 2, NAN);
    EXPECT(((int64_t *)i64.data)[2] == 0, "NaN -> 0 in integers");
    gt_tensor_set_f32(&i64, 3, -1e30f);
    EXPECT(((int64_t *)i64.data)[3] == INT64_MIN, "saturates at INT64_MIN");
    gt_tensor_set_f32(&b, 0, 0.0f);
    EXPECT(gt_tensor_get_f32(&b, 0) == 0.0f && gt_tensor_get_f32(&b, 1) == 1.0f, "bool get");
    gt_tensor f16;
    EXPECT_OK(gt_tensor_alloc(&f16, GT_F16, 1, (int64_t[]){6}, &err), &err);
    gt_tensor_convert(&bf, &f16); /* float -> float through f32 */
    for (int i = 0; i < 6; i++)
        EXPECT(((uint16_t *)f16.data)[i] == gt_f32_to_f16(gt_bf16_to_f32(((uint16_t *)bf.data)[i])),
               "bf16->f16 [%d]", i);
    gt_tensor_free(&i32), gt_tensor_free(&bf), gt_tensor_free(&b), gt_tensor_free(&i64);
    gt_tensor_free(&back), gt_tensor_free(&f16);
}

static void test_errors(void)
{
    gt_error err = {0};
    EXPECT(gt_error_set(&err, GT_ERR_IO, "open %s failed", "x.bin") == GT_ERR_IO, "returns code");
    EXPECT(err.code == GT_ERR_IO && strcmp(err.msg, "open x.bin failed") == 0, "%s", err.msg);
    gt_error_set(&err, GT_ERR_FORMAT, "second");
    EXPECT(err.code == GT_ERR_IO && strcmp(err.msg, "open x.bin failed; second") == 0,
           "first error wins, later appended: %s", err.msg);
    EXPECT(gt_error_wrap(&err, "loading %s", "ckpt") == GT_ERR_IO, "wrap keeps the code");
    EXPECT(strcmp(err.msg, "loading ckpt: open x.bin failed; second") == 0, "%s", err.msg);
    char big[3000];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    gt_error_wrap(&err, "%s", big);
    EXPECT(strlen(err.msg) == GT_ERROR_MSG_MAX - 1, "long messages truncate");
    gt_error_clear(&err);
    EXPECT(err.code == GT_OK && err.msg[0] == '\0', "clear");
    EXPECT(gt_error_set(NULL, GT_ERR_SHAPE, "ignored") == GT_ERR_SHAPE, "NULL err ok");
    EXPECT(strcmp(gt_status_name(GT_ERR_NOMEM), "nomem") == 0 &&
               strcmp(gt_status_name(GT_OK), "ok") == 0,
           "status names");
    char *s = gt_xstrdup("abc");
    EXPECT(strcmp(s, "abc") == 0, "xstrdup");
    free(s);
    EXPECT(gt_hash_str("abc") == gt_hash64("abc", 3, 0) && gt_hash_str("abc") != gt_hash_str("abd"),
           "hash");
    /* xxHash64 of the empty input with seed 0 (published value) */
    EXPECT(gt_hash64("", 0, 0) == 0xEF46DB3751D8E999ull, "xxh64 empty");
}

typedef struct {
    int count;
    gt_log_level last;
    char msg[128];
} log_capture;

static void capture(gt_log_level level, const char *msg, void *user)
{
    log_capture *c = user;
    c->count++;
    c->last = level;
    snprintf(c->msg, sizeof c->msg, "%s", msg);
}

static void test_log(void)
{
    log_capture c = {0};
    gt_log_set_sink(capture, &c);
    gt_log_set_level(GT_LOG_WARN);
    gt_log(GT_LOG_INFO, "dropped %d", 1);
    gt_log(GT_LOG_ERROR, "kept %d", 2);
    EXPECT(c.count == 1 && c.last == GT_LOG_ERROR && strcmp(c.msg, "kept 2") == 0, "level filter");
    gt_log_set_level(GT_LOG_INFO);
    gt_log_set_sink(NULL, NULL); /* back to stderr */
}

/* gt_buffer_reserve: grows to the request, keeps the buffer for smaller ones (its pages stay
 * touched), and its contents are the caller's to fill. */
static void test_buffer_reserve(void)
{
    gt_error err = {0};
    void *p = NULL;
    size_t have = 0;
    EXPECT_OK(gt_buffer_reserve(&p, &have, 100, &err), &err);
    EXPECT(p && have == 100, "reserve 100: have %zu", have);
    memset(p, 7, 100);
    void *first = p;
    EXPECT_OK(gt_buffer_reserve(&p, &have, 40, &err), &err);
    EXPECT(p == first && have == 100, "a smaller request must keep the buffer (have %zu)", have);
    EXPECT_OK(gt_buffer_reserve(&p, &have, 1000, &err), &err);
    EXPECT(p && have == 1000, "reserve 1000: have %zu", have);
    memset(p, 1, 1000); /* all of it is writable (ASan checks) */
    free(p);
}

int main(void)
{
    test_buffer_reserve();
    test_alloc();
    test_access_convert();
    test_errors();
    test_log();
    return gt_test_finish();
}
