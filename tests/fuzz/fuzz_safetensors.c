/* fuzz_safetensors.c — libFuzzer target for the safetensors reader.
 *
 * Parses the input as a whole file; on success copies out every tensor. Besides crashes, leaks and
 * undefined behaviour (ASan/UBSan), it traps on two broken promises of the reader: an error whose
 * message does not name the file, and a tensor whose copy does not match its validated range. */
#include "graphtrain/gt_safetensors.h"

#include <stdint.h>
#include <string.h>

#define FUZZ_NAME "fuzz-input.safetensors"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    gt_safetensors st;
    gt_error err = {0};
    if (gt_safetensors_parse(FUZZ_NAME, data, size, &st, &err) != GT_OK) {
        if (!strstr(err.msg, FUZZ_NAME)) __builtin_trap();
        return 0;
    }
    for (int i = 0; i < st.n_entries; i++) {
        const gt_st_entry *e = &st.entries[i];
        if (e->end > st.data_len || e->begin > e->end) __builtin_trap();
        gt_tensor t;
        gt_error_clear(&err);
        if (gt_safetensors_get(&st, e->name, &t, &err) != GT_OK) __builtin_trap();
        size_t n = gt_tensor_nbytes(&t);
        if (n != e->end - e->begin) __builtin_trap();
        if (n && memcmp(t.data, st.data + e->begin, n) != 0) __builtin_trap();
        gt_tensor_free(&t);
    }
    gt_safetensors_close(&st);
    return 0;
}
