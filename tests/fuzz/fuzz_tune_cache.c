/* fuzz_tune_cache.c — libFuzzer target for the matmul tuning cache file (src/backend/tune_cache.c).
 *
 * The input is a cache file's text. It is looked up with the key of its first line (what precedes
 * the first tab), with "k" and with an empty key, through an acceptor that parses values the way
 * cuda_matmul_tune.cu does (two runs of hex around a space) and accepts a value when both runs
 * decode. Traps on an offered value that holds a tab or a newline or is longer than the limit, and
 * on hex that does not round-trip. */
#include "backend/tune_cache.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define PAIR 8 /* bytes of each decoded run (the real algorithms are 64) */

static bool accept_pair(const char *value, void *user)
{
    size_t n = strlen(value);
    if (n > GT_TUNE_CACHE_MAX_VALUE || strpbrk(value, "\t\n")) __builtin_trap();
    unsigned char a[PAIR], b[PAIR];
    if (n < 4 * PAIR + 1 || value[2 * PAIR] != ' ' ||
        !gt_tune_cache_unhex(value, 2 * PAIR, a, PAIR) ||
        !gt_tune_cache_unhex(value + 2 * PAIR + 1, 2 * PAIR, b, PAIR))
        return false;
    char hex[2 * PAIR + 1];
    gt_tune_cache_hex(a, PAIR, hex);
    unsigned char back[PAIR];
    if (!gt_tune_cache_unhex(hex, 2 * PAIR, back, PAIR) || memcmp(a, back, PAIR) != 0)
        __builtin_trap();
    ++*(int *)user;
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *text = (const char *)data;
    char key[256];
    const char *tab = memchr(text, '\t', size);
    size_t klen = tab ? (size_t)(tab - text) : 0;
    if (klen >= sizeof key || memchr(text, '\0', klen) || memchr(text, '\n', klen)) klen = 0;
    memcpy(key, text, klen);
    key[klen] = '\0';
    int accepted = 0;
    (void)gt_tune_cache_find(text, size, key, accept_pair, &accepted);
    (void)gt_tune_cache_find(text, size, "k", accept_pair, &accepted);
    (void)gt_tune_cache_find(text, size, "", accept_pair, &accepted);
    /* any bytes round-trip through hex */
    size_t n = size < 64 ? size : 64;
    char hex[129];
    unsigned char back[64];
    gt_tune_cache_hex(data, n, hex);
    if (!gt_tune_cache_unhex(hex, 2 * n, back, n) || memcmp(data, back, n) != 0) __builtin_trap();
    return 0;
}
