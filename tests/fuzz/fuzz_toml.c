/* fuzz_toml.c — libFuzzer target for the TOML parser and the config loader.
 *
 * The input is a whole config file. Besides crashes, leaks and undefined behaviour (ASan/UBSan),
 * it traps on broken promises: an error message that does not start with the file name and a
 * position, a parsed tree whose strings are not NUL-terminated at their length, and a config that
 * loads but does not survive print → parse → equal. */
#include "graphtrain/gt_config.h"

#include <stdint.h>
#include <string.h>

#include "config/toml.h"
#include "fuzz_config_common.h"

#define FUZZ_NAME "fuzz.toml"

static void check_tree(const gt_toml_value *v)
{
    if (v->line < 1 || v->col < 1) __builtin_trap();
    if (v->type == GT_TOML_STRING && v->as.str.data[v->as.str.len] != '\0') __builtin_trap();
    if (v->type == GT_TOML_ARRAY)
        for (int i = 0; i < v->as.array.n; i++)
            check_tree(v->as.array.items[i]);
    if (v->type == GT_TOML_TABLE)
        for (int i = 0; i < v->as.table.n; i++) {
            const gt_toml_entry *e = v->as.table.entries[i];
            if (e->key[e->key_len] != '\0' || e->line < 1) __builtin_trap();
            /* every key is found again through the table's index */
            if (gt_toml_find(v, e->key, e->key_len) != e) __builtin_trap();
            check_tree(e->value);
        }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    gt_toml_value *root = NULL;
    gt_error err = {0};
    if (gt_toml_parse((const char *)data, size, FUZZ_NAME, &root, &err) != GT_OK) {
        if (strncmp(err.msg, FUZZ_NAME ":", sizeof FUZZ_NAME)) __builtin_trap();
        return 0;
    }
    check_tree(root);
    gt_toml_free(root);

    gt_config c;
    gt_config_defaults(&c);
    gt_error_clear(&err);
    if (gt_config_load_string(&c, (const char *)data, size, FUZZ_NAME, &err) == GT_OK)
        fuzz_check_print_round_trip(&c);
    else if (strncmp(err.msg, FUZZ_NAME ":", sizeof FUZZ_NAME))
        __builtin_trap();
    gt_config_free(&c);
    return 0;
}
