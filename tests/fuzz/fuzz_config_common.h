/* fuzz_config_common.h — the promise both config fuzz targets (fuzz_toml.c, fuzz_overrides.c)
 * check on a config that loaded: it survives print → parse → equal. */
#ifndef GT_FUZZ_CONFIG_COMMON_H
#define GT_FUZZ_CONFIG_COMMON_H

#include <stdio.h>
#include <stdlib.h>

#include "graphtrain/gt_config.h"

/* Prints c as TOML, loads the text onto fresh defaults and traps unless the result equals c. */
static inline void fuzz_check_print_round_trip(const gt_config *c)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    gt_config_print(c, f);
    fclose(f);
    gt_config back;
    gt_config_defaults(&back);
    gt_error err = {0};
    if (gt_config_load_string(&back, text, len, "printed", &err) != GT_OK) __builtin_trap();
    if (!gt_config_equal(c, &back)) __builtin_trap();
    gt_config_free(&back);
    free(text);
}

#endif
