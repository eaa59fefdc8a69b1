/* clock.c — the monotonic clock every duration and deadline is measured on. */
#include <time.h>

#include "graphtrain/gt_core.h"

double gt_now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
