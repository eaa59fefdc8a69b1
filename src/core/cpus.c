/* cpus.c — how many CPUs this process may run on. */
#define _GNU_SOURCE
#include <sched.h>
#include <unistd.h>

#include "graphtrain/gt_core.h"

int gt_cpu_count(void)
{
    /* the affinity mask, not the host's count: a launcher that binds a rank to some cores
     * (mpirun binds each rank to one core when -np <= 2) leaves it only those */
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}
