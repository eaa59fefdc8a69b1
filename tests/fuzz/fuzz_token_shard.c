/* fuzz_token_shard.c — GTTOKENS shard validation, and a loader over whatever validates.
 *
 * Each input is parsed as is, then again with both checksums recomputed, so that mutations of
 * the header fields and the payload get past the checksums to the later checks (dtype, count,
 * vocab, ids) and to the loader. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "graphtrain/gt_data.h"

static void gt_fuzz_parse(const uint8_t *data, size_t size, bool shuffle)
{
    gt_token_shard sh;
    gt_error err = {0};
    if (gt_token_shard_parse(data, size, "fuzz.gttokens", &sh, &err) != GT_OK) return;
    uint64_t sum = 0;
    for (uint64_t i = 0; i < sh.count; i++)
        sum += gt_token_shard_get(&sh, i);
    (void)sum;
    gt_loader_config c = {.seq_len = 3,
                          .local_batch = 2,
                          .dp_rank = 1,
                          .dp_degree = 2,
                          .shuffle = shuffle,
                          .seed = 1};
    gt_loader *l = NULL;
    if (gt_loader_create_shard(&c, &sh, &l, &err) == GT_OK) {
        int64_t batch[2 * 4];
        for (int i = 0; i < 3; i++)
            (void)gt_loader_next(l, batch, &err);
        gt_loader_free(l);
    }
}

static void gt_fuzz_put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    gt_fuzz_parse(data, size, size % 2 == 0);
    if (size < GT_TOKEN_SHARD_HEADER_BYTES) return 0;
    uint8_t *fixed = malloc(size);
    memcpy(fixed, data, size);
    gt_fuzz_put64(fixed + 32, XXH64(fixed + 64, size - 64, 0));
    gt_fuzz_put64(fixed + 56, XXH64(fixed, 56, 0));
    gt_fuzz_parse(fixed, size, size % 2 == 1);
    free(fixed);
    return 0;
}
