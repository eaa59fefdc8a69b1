/* fuzz_checkpoint_manifest.c — libFuzzer target for the checkpoint manifest reader.
 *
 * Besides crashes, leaks and undefined behaviour (ASan/UBSan), it traps on broken promises:
 *   - an error whose message does not name the manifest;
 *   - a manifest the reader accepts but the writer refuses (dump must accept whatever parse does);
 *   - a round trip that changes anything: parse(dump(parse(x))) equals parse(x) field by field, and
 *     dumping it again gives the same text. */
#include "graphtrain/gt_checkpoint.h"

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_NAME "fuzz-input/manifest.json"

static bool same_str(const char *a, const char *b)
{
    return a && b && strcmp(a, b) == 0;
}

static bool same_json_text(const char *a, const char *b)
{
    json_t *ja = json_loads(a, 0, NULL), *jb = json_loads(b, 0, NULL);
    bool same = ja && jb && json_equal(ja, jb);
    json_decref(ja);
    json_decref(jb);
    return same;
}

static bool same_info(const gt_checkpoint_info *a, const gt_checkpoint_info *b)
{
    if (a->step != b->step || !same_str(a->model_name, b->model_name) ||
        !same_str(a->model_flavor, b->model_flavor) || a->fingerprint != b->fingerprint ||
        a->n_tensors != b->n_tensors || a->n_files != b->n_files || a->rng_seed != b->rng_seed ||
        a->n_rng_counters != b->n_rng_counters || a->n_extra != b->n_extra ||
        !same_json_text(a->loader_json, b->loader_json))
        return false;
    for (int i = 0; i < a->n_tensors; i++) {
        const gt_checkpoint_tensor *x = &a->tensors[i], *y = &b->tensors[i];
        if (!same_str(x->name, y->name) || x->dtype != y->dtype || x->ndim != y->ndim ||
            x->xxh64 != y->xxh64 || memcmp(x->shape, y->shape, sizeof(int64_t) * (size_t)x->ndim))
            return false;
    }
    for (int i = 0; i < a->n_files; i++) {
        const gt_checkpoint_file *x = &a->files[i], *y = &b->files[i];
        if (!same_str(x->name, y->name) || x->bytes != y->bytes || x->xxh64 != y->xxh64)
            return false;
    }
    for (int i = 0; i < a->n_rng_counters; i++)
        if (!same_str(a->rng_counter_names[i], b->rng_counter_names[i]) ||
            a->rng_counters[i] != b->rng_counters[i])
            return false;
    for (int i = 0; i < a->n_extra; i++)
        if (!same_str(a->extra_keys[i], b->extra_keys[i]) ||
            !same_str(a->extra_values[i], b->extra_values[i]))
            return false;
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    gt_checkpoint_info a, b;
    gt_error err = {0};
    if (gt_checkpoint_manifest_parse(FUZZ_NAME, (const char *)data, size, &a, &err) != GT_OK) {
        if (!strstr(err.msg, FUZZ_NAME)) __builtin_trap();
        if (a.n_tensors || a.model_name || a.loader_json) __builtin_trap(); /* left empty */
        return 0;
    }
    char *text = NULL, *text2 = NULL;
    if (gt_checkpoint_manifest_dump(&a, &text, &err) != GT_OK) __builtin_trap();
    if (gt_checkpoint_manifest_parse("round-trip", text, strlen(text), &b, &err) != GT_OK)
        __builtin_trap();
    if (!same_info(&a, &b)) __builtin_trap();
    if (gt_checkpoint_manifest_dump(&b, &text2, &err) != GT_OK || strcmp(text, text2) != 0)
        __builtin_trap();
    free(text);
    free(text2);
    gt_checkpoint_info_free(&a);
    gt_checkpoint_info_free(&b);
    return 0;
}
