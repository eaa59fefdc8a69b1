/* fuzz_overrides.c — libFuzzer target for command-line overrides.
 *
 * The input is split on newlines into argv strings (at most 64) and applied on top of the
 * defaults with gt_config_apply_overrides (which never opens files; --config only records the
 * path), then validated. Traps on an error message that does not start with "command line: " or
 * "config: ", and on a resulting config that does not survive print → parse → equal. */
#include "graphtrain/gt_config.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_config_common.h"

#define MAX_ARGS 64

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *copy = malloc(size + 1);
    if (size) memcpy(copy, data, size);
    copy[size] = '\0';
    char *argv[MAX_ARGS + 1];
    int argc = 0;
    char *s = copy;
    while (argc < MAX_ARGS && s < copy + size) {
        char *nl = memchr(s, '\n', (size_t)(copy + size - s));
        if (nl) *nl = '\0';
        argv[argc++] = s;
        if (!nl) break;
        s = nl + 1;
    }
    argv[argc] = NULL;

    gt_config c;
    gt_config_defaults(&c);
    gt_error err = {0};
    gt_status st = gt_config_apply_overrides(&c, argc, argv, &err);
    if (st == GT_OK) st = gt_config_validate(&c, &err);
    if (st != GT_OK) {
        if (strncmp(err.msg, "command line: ", 14) && strncmp(err.msg, "config: ", 8))
            __builtin_trap();
    } else {
        fuzz_check_print_round_trip(&c);
    }
    gt_config_free(&c);
    free(copy);
    return 0;
}
