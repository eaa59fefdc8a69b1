/* param_init.c — parameter initialisation from counter-based random numbers (DESIGN.md §6).
 *
 * Element k of parameter p is a pure function of (seed, gt_hash_str(p->fqn), k): it never depends
 * on which other elements are drawn, by whom, or in what order. A rank holding any shard — rows,
 * columns flattened to ranges, or a single element — initialises exactly the values of the full
 * tensor at those positions, whatever the parallel layout. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "graphtrain/gt_init.h"

static double gt_param_draw(const gt_param_spec *p, uint64_t seed, uint64_t stream, int64_t k)
{
    switch (p->init) {
    case GT_INIT_ONES:
        return 1.0;
    case GT_INIT_ZEROS:
        return 0.0;
    case GT_INIT_NORMAL:
        return p->std * gt_rng_normal(seed, stream, (uint64_t)k, 0);
    case GT_INIT_TRUNC_NORMAL:
        return gt_rng_trunc_normal(seed, stream, (uint64_t)k, 0.0, p->std, p->lo, p->hi);
    }
    GT_CHECK(!"unknown gt_init_kind");
    return 0.0;
}

/* Element k into dst's element `at`: rounded through f32 first, so a bf16 shard equals the bf16
 * cast of the f32 tensor. */
static void put(gt_tensor *dst, int64_t at, double v)
{
    if (dst->dtype == GT_F32)
        ((float *)dst->data)[at] = (float)v;
    else
        gt_tensor_set_f32(dst, at, (float)v);
}

/* Elements [start, start + count) into dst[offset .. offset + count). Normal draws come in
 * batches (gt_rng_normal_n, several times faster than one at a time); a truncated normal keeps
 * round 0 of its batch where it lands inside [lo, hi] and draws the rest one by one, which is
 * gt_rng_trunc_normal's value either way. */
#define GT_INIT_BATCH 256

static void init_range(const gt_param_spec *p, uint64_t seed, int64_t start, int64_t count,
                       gt_tensor *dst, int64_t offset)
{
    uint64_t stream = gt_hash_str(p->fqn);
    if (p->init != GT_INIT_NORMAL && p->init != GT_INIT_TRUNC_NORMAL) {
        for (int64_t k = 0; k < count; k++)
            put(dst, offset + k, gt_param_draw(p, seed, stream, start + k));
        return;
    }
    double z[GT_INIT_BATCH];
    for (int64_t k = 0; k < count; k += GT_INIT_BATCH) {
        int64_t n = count - k < GT_INIT_BATCH ? count - k : GT_INIT_BATCH;
        gt_rng_normal_n(seed, stream, (uint64_t)(start + k), n, z);
        for (int64_t j = 0; j < n; j++) {
            double v = p->std * z[j];
            if (p->init == GT_INIT_TRUNC_NORMAL) {
                v = 0.0 + v; /* gt_rng_trunc_normal's round 0, mean + std z (mean 0) */
                if (!(p->std > 0.0) || v < p->lo || v > p->hi)
                    v = gt_param_draw(p, seed, stream, start + k + j);
            }
            put(dst, offset + k + j, v);
        }
    }
}

typedef struct {
    const gt_param_spec *p;
    uint64_t seed;
    int64_t start, count, offset;
    gt_tensor *dst;
} init_job;

static void *init_job_run(void *arg)
{
    init_job *j = arg;
    init_range(j->p, j->seed, j->start, j->count, j->dst, j->offset);
    return NULL;
}

/* Large ranges are split over threads: each element is a pure function of its index, so the bits
 * do not depend on the split (a 1B model's 1.5 G elements take a minute on one core). */
#define GT_INIT_MAX_THREADS 32
#define GT_INIT_MIN_PER_THREAD (1 << 16)

void gt_param_init(const gt_param_spec *p, uint64_t seed, int64_t start, int64_t count,
                   gt_tensor *dst)
{
    GT_CHECK(start >= 0 && count >= 0);
    GT_CHECK(start + count <= gt_shape_numel(p->ndim, p->shape));
    GT_CHECK(gt_tensor_numel(dst) >= count && gt_dtype_is_float(dst->dtype));
    int cpus = gt_cpu_count();
    int64_t n = count / GT_INIT_MIN_PER_THREAD;
    if (n > cpus) n = cpus;
    if (n > GT_INIT_MAX_THREADS) n = GT_INIT_MAX_THREADS;
    if (n < 2) {
        init_range(p, seed, start, count, dst, 0);
        return;
    }
    init_job jobs[GT_INIT_MAX_THREADS];
    pthread_t threads[GT_INIT_MAX_THREADS];
    bool started[GT_INIT_MAX_THREADS] = {0};
    int64_t per = (count + n - 1) / n;
    for (int64_t t = 0; t < n; t++) {
        int64_t off = t * per, len = off + per > count ? count - off : per;
        jobs[t] = (init_job){p, seed, start + off, len, off, dst};
        /* a thread that cannot start leaves its part to this one */
        started[t] = t > 0 && pthread_create(&threads[t], NULL, init_job_run, &jobs[t]) == 0;
    }
    for (int64_t t = 0; t < n; t++)
        if (!started[t]) init_job_run(&jobs[t]);
    for (int64_t t = 0; t < n; t++)
        if (started[t]) pthread_join(threads[t], NULL);
}
