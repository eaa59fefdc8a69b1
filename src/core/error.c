/* error.c — gt_error: the status + message every fallible function fills (DESIGN.md §7).
 *
 * The first error wins: its code is kept, later messages are appended as context, so the report a
 * user sees starts with the root cause. Messages are truncated (never overflowed) at
 * GT_ERROR_MSG_MAX - 1 bytes. */
#include "graphtrain/gt_core.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Appends s to buf (capacity cap, current length *len), truncating; keeps buf NUL-terminated. */
static void gt_msg_append(char *buf, size_t cap, size_t *len, const char *s)
{
    size_t n = strlen(s);
    if (*len + n > cap - 1) n = cap - 1 - *len;
    memcpy(buf + *len, s, n);
    *len += n;
    buf[*len] = '\0';
}

gt_status gt_error_set(gt_error *err, gt_status code, const char *fmt, ...)
{
    if (!err) return code;
    char tmp[GT_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (err->code == GT_OK) {
        err->code = code;
        memcpy(err->msg, tmp, sizeof tmp);
    } else {
        /* Already set: keep the first code and message, append the new one as context. */
        err->msg[sizeof err->msg - 1] = '\0';
        size_t used = strlen(err->msg);
        gt_msg_append(err->msg, sizeof err->msg, &used, "; ");
        gt_msg_append(err->msg, sizeof err->msg, &used, tmp);
    }
    return code;
}

gt_status gt_error_wrap(gt_error *err, const char *fmt, ...)
{
    if (!err) return GT_ERR_INTERNAL; /* nothing to wrap: the caller lost the error */
    char ctx[GT_ERROR_MSG_MAX];
    char old[GT_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx, sizeof ctx, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    old[sizeof old - 1] = '\0';
    size_t used = 0;
    err->msg[0] = '\0';
    gt_msg_append(err->msg, sizeof err->msg, &used, ctx);
    gt_msg_append(err->msg, sizeof err->msg, &used, ": ");
    gt_msg_append(err->msg, sizeof err->msg, &used, old);
    return err->code;
}

void gt_error_clear(gt_error *err)
{
    if (!err) return;
    err->code = GT_OK;
    err->msg[0] = '\0';
}

const char *gt_status_name(gt_status s)
{
    switch (s) {
    case GT_OK:
        return "ok";
    case GT_ERR_INVALID:
        return "invalid";
    case GT_ERR_IO:
        return "io";
    case GT_ERR_FORMAT:
        return "format";
    case GT_ERR_SHAPE:
        return "shape";
    case GT_ERR_NOMEM:
        return "nomem";
    case GT_ERR_UNSUPPORTED:
        return "unsupported";
    case GT_ERR_INTERNAL:
        return "internal";
    }
    return "unknown";
}

void gt_panic(const char *file, int line, const char *what)
{
    fprintf(stderr, "[graphtrain] PANIC %s:%d: internal invariant failed: %s\n", file, line,
            what ? what : "(null)");
    fflush(stderr);
    abort();
}
