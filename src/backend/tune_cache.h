/* tune_cache.h — the file in which tuned matmul algorithms outlive the run
 * (cuda_matmul_tune.cu reads and appends it; src/backend/tune_cache.c).
 *
 * Format: text, one entry a line, `KEY '\t' VALUE '\n'`; neither holds a tab or a newline. A
 * lookup offers the caller each line whose KEY equals the key asked for, in file order, until the
 * caller accepts a VALUE; lines it cannot use (no tab, a value too long, one the caller refuses)
 * are passed over, so a torn, stale or foreign line costs that line, never the run. Appends
 * are one write(2) of a whole line to a file opened O_APPEND: ranks appending at once do not
 * interleave on a local file system. */
#ifndef GT_BACKEND_TUNE_CACHE_H
#define GT_BACKEND_TUNE_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "graphtrain/gt_core.h"

#ifdef __cplusplus
extern "C" {
#endif

#define GT_TUNE_CACHE_MAX_BYTES (16u << 20) /* a larger file is not read */

/* The cache file to use: GT_MATMUL_TUNE_CACHE when set (empty or "0": none, NULL is returned),
 * else $XDG_CACHE_HOME/graphtrain/matmul_tune.tsv, else $HOME/.cache/graphtrain/matmul_tune.tsv,
 * else none. The caller frees it. */
char *gt_tune_cache_default_path(void);

/* Offers accept(value, user) the VALUE (NUL-terminated) of each line of text[0, len) whose KEY is
 * key, in file order, until it returns true; returns whether one did. Values longer than
 * GT_TUNE_CACHE_MAX_VALUE bytes are passed over. */
#define GT_TUNE_CACHE_MAX_VALUE 1023
typedef bool (*gt_tune_cache_accept)(const char *value, void *user);
bool gt_tune_cache_find(const char *text, size_t len, const char *key, gt_tune_cache_accept accept,
                        void *user);

/* gt_tune_cache_find over the file at path; false when it is missing, unreadable or larger than
 * GT_TUNE_CACHE_MAX_BYTES. */
bool gt_tune_cache_lookup(const char *path, const char *key, gt_tune_cache_accept accept,
                          void *user);

/* Appends "key\tvalue\n", making the file's folders first; refused (GT_ERR_IO) when the file would
 * grow past GT_TUNE_CACHE_MAX_BYTES, which no lookup reads. */
gt_status gt_tune_cache_append(const char *path, const char *key, const char *value, gt_error *err);

/* Writes n bytes as 2n lowercase hex digits and a NUL (out: 2n + 1 bytes). */
void gt_tune_cache_hex(const void *bytes, size_t n, char *out);

/* Reads exactly 2n hex digits from text into n bytes; false on anything else (a wrong length, a
 * character that is no hex digit). */
bool gt_tune_cache_unhex(const char *text, size_t len, void *bytes, size_t n);

#ifdef __cplusplus
}
#endif

#endif
