/* alloc.c — allocation helpers for small internal structures: out-of-memory there is not
 * recoverable in any useful way, so it panics. Large buffers (tensors, arenas) use plain malloc and
 * report GT_ERR_NOMEM instead. A request of 0 bytes still returns a unique non-NULL pointer, so a
 * NULL result never has to be told apart from "empty". */
#include "graphtrain/gt_core.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void gt_oom(const char *file, int line, size_t n)
{
    fprintf(stderr, "[graphtrain] out of memory allocating %zu bytes\n", n);
    gt_panic(file, line, "out of memory");
}

void *gt_xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) gt_oom(__FILE__, __LINE__, n);
    return p;
}

void *gt_xcalloc(size_t count, size_t size)
{
    if (count == 0 || size == 0) count = size = 1;
    void *p = calloc(count, size);
    if (!p) gt_oom(__FILE__, __LINE__, count * size); /* calloc also fails on count*size overflow */
    return p;
}

void *gt_xrealloc(void *p, size_t n)
{
    /* realloc(p, 0) may free p and return NULL; never ask for 0. */
    void *q = realloc(p, n ? n : 1);
    if (!q) gt_oom(__FILE__, __LINE__, n);
    return q;
}

char *gt_xstrdup(const char *s)
{
    if (!s) s = "";
    size_t n = strlen(s) + 1;
    char *d = gt_xmalloc(n);
    memcpy(d, s, n);
    return d;
}

gt_status gt_buffer_reserve(void **p, size_t *have, size_t bytes, gt_error *err)
{
    if (bytes <= *have && *p) return GT_OK;
    free(*p);
    *have = 0;
    *p = malloc(bytes ? bytes : 1);
    if (!*p) return gt_error_set(err, GT_ERR_NOMEM, "out of memory (a %zu-byte buffer)", bytes);
    *have = bytes;
    return GT_OK;
}
