/* cpu_profile.c — GT_CPU_PROFILE: host time per op kind and per sgemm shape, printed at exit.
 *
 * Off unless the environment sets GT_CPU_PROFILE (to anything but "" or "0"); then every kernel
 * the CPU backend runs is timed, and at exit two tables go to stderr: wall time per op kind (the
 * outermost kernel only, so a fused op's parts count once, inside it; the widening of bf16/f16
 * operands counts with its op), and time per sgemm shape (the wall time of every gt_cpu_sgemm
 * call, a blocked product's threads inside it; attention calls sgemm from its own threads, whose
 * times add up, so with several threads the sum can exceed the wall time). The tables cover the
 * whole process, warm-up steps included; divide by the steps run for a per-step figure.
 * GT_CPU_PROFILE=cpu times with the calling thread's CPU clock instead of the wall clock: on a
 * machine shared with other work it leaves out the time the thread waited for a core, but also the
 * time of any other thread (use it at one thread). Timing never changes what a kernel computes. */
#include "cpu_internal.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* distinct sgemm shapes kept; the rest are summed into one "other shapes" line */
#define GT_CPU_PROF_SHAPES 256

typedef struct {
    bool ta, tb;
    int64_t m, n, k;
    int64_t calls;
    double s;
} gt_cpu_prof_shape;

static struct {
    int on; /* -1 unread, 0 off, 1 on */
    clockid_t clock;
    double op_s[GT_OP_COUNT];
    int64_t op_calls[GT_OP_COUNT];
    gt_cpu_prof_shape shape[GT_CPU_PROF_SHAPES];
    int n_shapes;
    gt_cpu_prof_shape other;
    pthread_mutex_t lock;
} gt_cpu_prof = {.on = -1, .lock = PTHREAD_MUTEX_INITIALIZER};
static pthread_once_t gt_cpu_prof_once = PTHREAD_ONCE_INIT;

double gt_cpu_prof_now(void)
{
    struct timespec ts;
    clock_gettime(gt_cpu_prof.clock, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int gt_cpu_prof_cmp_op(const void *x, const void *y)
{
    double a = gt_cpu_prof.op_s[*(const int *)x], b = gt_cpu_prof.op_s[*(const int *)y];
    return a < b ? 1 : a > b ? -1 : 0;
}

static int gt_cpu_prof_cmp_shape(const void *x, const void *y)
{
    double a = ((const gt_cpu_prof_shape *)x)->s, b = ((const gt_cpu_prof_shape *)y)->s;
    return a < b ? 1 : a > b ? -1 : 0;
}

static void gt_cpu_prof_print(void)
{
    pthread_mutex_lock(&gt_cpu_prof.lock);
    int order[GT_OP_COUNT], n = 0;
    double total = 0.0, blas = gt_cpu_prof.other.s;
    for (int op = 0; op < GT_OP_COUNT; op++) {
        if (!gt_cpu_prof.op_calls[op]) continue;
        order[n++] = op;
        total += gt_cpu_prof.op_s[op];
    }
    qsort(order, (size_t)n, sizeof order[0], gt_cpu_prof_cmp_op);
    const char *what = gt_cpu_prof.clock == CLOCK_MONOTONIC ? "wall" : "thread CPU";
    fprintf(stderr, "cpu profile: kernel %s time per op kind (whole process)\n", what);
    fprintf(stderr, "  %-28s %9s %11s %7s %10s\n", "op", "calls", "ms", "%", "us/call");
    for (int i = 0; i < n; i++) {
        int op = order[i];
        double s = gt_cpu_prof.op_s[op];
        fprintf(stderr, "  %-28s %9lld %11.1f %6.1f%% %10.1f\n", gt_kernel_op_name((gt_op)op),
                (long long)gt_cpu_prof.op_calls[op], 1e3 * s, total > 0 ? 100.0 * s / total : 0.0,
                1e6 * s / (double)gt_cpu_prof.op_calls[op]);
    }
    fprintf(stderr, "  %-28s %9s %11.1f\n", "all kernels", "", 1e3 * total);
    qsort(gt_cpu_prof.shape, (size_t)gt_cpu_prof.n_shapes, sizeof gt_cpu_prof.shape[0],
          gt_cpu_prof_cmp_shape);
    for (int i = 0; i < gt_cpu_prof.n_shapes; i++)
        blas += gt_cpu_prof.shape[i].s;
    fprintf(stderr,
            "cpu profile: sgemm %s time per shape (attention's threads summed), %.1f ms in all\n",
            what, 1e3 * blas);
    fprintf(stderr, "  %-5s %8s %8s %8s %9s %11s %7s %9s\n", "trans", "m", "n", "k", "calls", "ms",
            "%", "GFLOP/s");
    for (int i = 0; i <= gt_cpu_prof.n_shapes; i++) {
        const gt_cpu_prof_shape *p =
            i < gt_cpu_prof.n_shapes ? &gt_cpu_prof.shape[i] : &gt_cpu_prof.other;
        if (!p->calls) continue;
        double flop = 2.0 * (double)p->m * (double)p->n * (double)p->k * (double)p->calls;
        if (i < gt_cpu_prof.n_shapes)
            fprintf(stderr, "  %c%c    %8lld %8lld %8lld %9lld %11.1f %6.1f%% %9.1f\n",
                    p->ta ? 'T' : 'N', p->tb ? 'T' : 'N', (long long)p->m, (long long)p->n,
                    (long long)p->k, (long long)p->calls, 1e3 * p->s,
                    blas > 0 ? 100.0 * p->s / blas : 0.0, p->s > 0 ? flop / p->s * 1e-9 : 0.0);
        else
            fprintf(stderr, "  %-32s %9lld %11.1f %6.1f%%\n", "other shapes", (long long)p->calls,
                    1e3 * p->s, blas > 0 ? 100.0 * p->s / blas : 0.0);
    }
    pthread_mutex_unlock(&gt_cpu_prof.lock);
}

static void gt_cpu_prof_init(void)
{
    const char *v = getenv("GT_CPU_PROFILE");
    gt_cpu_prof.on = v && *v && strcmp(v, "0") != 0;
    gt_cpu_prof.clock = v && !strcmp(v, "cpu") ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC;
    if (gt_cpu_prof.on) atexit(gt_cpu_prof_print);
}

bool gt_cpu_prof_on(void)
{
    if (__builtin_expect(gt_cpu_prof.on < 0, 0)) pthread_once(&gt_cpu_prof_once, gt_cpu_prof_init);
    return gt_cpu_prof.on == 1;
}

/* A thread's depth of nested kernels: only the outermost adds its time. */
static _Thread_local int gt_cpu_prof_depth;

int gt_cpu_prof_enter(void)
{
    return gt_cpu_prof_depth++;
}

void gt_cpu_prof_op(gt_op op, int depth, double seconds)
{
    gt_cpu_prof_depth = depth;
    if (depth > 0 || (unsigned)op >= GT_OP_COUNT) return;
    pthread_mutex_lock(&gt_cpu_prof.lock);
    gt_cpu_prof.op_s[op] += seconds;
    gt_cpu_prof.op_calls[op]++;
    pthread_mutex_unlock(&gt_cpu_prof.lock);
}

void gt_cpu_prof_sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double seconds)
{
    pthread_mutex_lock(&gt_cpu_prof.lock);
    gt_cpu_prof_shape *p = NULL;
    for (int i = 0; i < gt_cpu_prof.n_shapes && !p; i++) {
        gt_cpu_prof_shape *q = &gt_cpu_prof.shape[i];
        if (q->ta == ta && q->tb == tb && q->m == m && q->n == n && q->k == k) p = q;
    }
    if (!p && gt_cpu_prof.n_shapes < GT_CPU_PROF_SHAPES) {
        p = &gt_cpu_prof.shape[gt_cpu_prof.n_shapes++];
        *p = (gt_cpu_prof_shape){.ta = ta, .tb = tb, .m = m, .n = n, .k = k};
    }
    if (!p) p = &gt_cpu_prof.other;
    p->calls++;
    p->s += seconds;
    pthread_mutex_unlock(&gt_cpu_prof.lock);
}
