/* fuzz_safetensors.c — libFuzzer target for the safetensors reader.
 *
 * Parses the input as a whole file; on success copies out every tensor. Then writes the input to
 * a file and opens it lazily (header only, tensors read on demand), which must accept and refuse
 * exactly what the in-memory parser does and read the same bytes. Besides crashes, leaks and
 * undefined behaviour (ASan/UBSan), it traps on broken promises of the reader: an error whose
 * message does not name the file, a tensor whose copy does not match its validated range, and the
 * two readers disagreeing. */
#include "graphtrain/gt_safetensors.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FUZZ_NAME "fuzz-input.safetensors"

/* The lazy reader on the same bytes, from a file: the same verdict and the same tensor bytes. */
static void check_lazy(const uint8_t *data, size_t size, const gt_safetensors *parsed,
                       gt_status want)
{
    char path[64];
    snprintf(path, sizeof path, "/tmp/gt-fuzz-safetensors-%ld", (long)getpid());
    FILE *f = fopen(path, "wb");
    if (!f) return; /* no scratch file here: nothing to compare */
    bool written = fwrite(data, 1, size, f) == size;
    if (fclose(f) != 0 || !written) {
        remove(path);
        return;
    }
    gt_safetensors st;
    gt_error err = {0};
    gt_status got = gt_safetensors_open_lazy(path, &st, &err);
    if (got != want) __builtin_trap();
    if (got != GT_OK && !strstr(err.msg, path)) __builtin_trap();
    for (int i = 0; got == GT_OK && i < st.n_entries; i++) {
        const gt_st_entry *e = &st.entries[i], *p = gt_safetensors_find(parsed, e->name);
        if (!p || p->begin != e->begin || p->end != e->end) __builtin_trap();
        size_t n = (size_t)(e->end - e->begin);
        uint8_t *buf = malloc(n ? n : 1);
        if (gt_safetensors_read(&st, e, buf, &err) != GT_OK) __builtin_trap();
        if (n && memcmp(buf, parsed->data + e->begin, n) != 0) __builtin_trap();
        free(buf);
    }
    gt_safetensors_close(&st);
    remove(path);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    gt_safetensors st;
    gt_error err = {0};
    gt_status parsed = gt_safetensors_parse(FUZZ_NAME, data, size, &st, &err);
    if (parsed != GT_OK) {
        if (!strstr(err.msg, FUZZ_NAME)) __builtin_trap();
        check_lazy(data, size, &st, parsed);
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
    check_lazy(data, size, &st, parsed);
    gt_safetensors_close(&st);
    return 0;
}
