/* test_cpus.c — gt_cpu_count follows the process's affinity mask (what a launcher that binds
 * ranks leaves it), and gt_param_init, which sizes its threads by it, gives the same bits on one
 * CPU as on all of them. */
#define _GNU_SOURCE
#include "graphtrain/gt_core.h"
#include "graphtrain/gt_model.h"
#include "gt_test.h"

#include <sched.h>
#include <string.h>

int main(void)
{
    cpu_set_t all;
    EXPECT(sched_getaffinity(0, sizeof all, &all) == 0, "sched_getaffinity failed");
    EXPECT(gt_cpu_count() == CPU_COUNT(&all), "gt_cpu_count %d, affinity mask %d CPUs",
           gt_cpu_count(), CPU_COUNT(&all));

    /* 2^20 elements: split over threads wherever more than one CPU is allowed */
    gt_param_spec p = {.fqn = "layers.0.feed_forward.w1.weight",
                       .dtype = GT_F32,
                       .ndim = 2,
                       .shape = {1024, 1024},
                       .init = GT_INIT_TRUNC_NORMAL,
                       .std = 0.02,
                       .lo = -0.04,
                       .hi = 0.04};
    const int64_t shape[2] = {1024, 1024};
    gt_error err = {0};
    gt_tensor wide, one;
    EXPECT_OK(gt_tensor_alloc(&wide, GT_F32, 2, shape, &err), &err);
    EXPECT_OK(gt_tensor_alloc(&one, GT_F32, 2, shape, &err), &err);
    gt_param_init(&p, 7, 0, 1 << 20, &wide);

    int first = 0;
    while (first < CPU_SETSIZE && !CPU_ISSET(first, &all))
        first++;
    cpu_set_t single;
    CPU_ZERO(&single);
    CPU_SET(first, &single);
    EXPECT(sched_setaffinity(0, sizeof single, &single) == 0, "binding to CPU %d failed", first);
    EXPECT(gt_cpu_count() == 1, "bound to one CPU, gt_cpu_count says %d", gt_cpu_count());
    gt_param_init(&p, 7, 0, 1 << 20, &one);
    EXPECT(sched_setaffinity(0, sizeof all, &all) == 0, "restoring the affinity failed");
    EXPECT(memcmp(wide.data, one.data, gt_tensor_nbytes(&wide)) == 0,
           "param init on one CPU differs from init on %d", CPU_COUNT(&all));
    gt_tensor_free(&wide);
    gt_tensor_free(&one);
    return gt_test_finish();
}
