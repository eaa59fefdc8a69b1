/* hash.c — xxHash64 (libxxhash) for RNG streams, interning and checksums. */
#include "graphtrain/gt_core.h"

#include <string.h>
#include <xxhash.h>

uint64_t gt_hash64(const void *data, size_t n, uint64_t seed)
{
    return (uint64_t)XXH64(n ? data : "", n, (XXH64_hash_t)seed);
}

uint64_t gt_hash_str(const char *s)
{
    if (!s) s = "";
    return gt_hash64(s, strlen(s), 0);
}
