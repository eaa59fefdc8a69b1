/* cpu_blas.c — which OpenBLAS kernels run on this CPU, and the right ones where OpenBLAS's own
 * detection falls back.
 *
 * Debian's OpenBLAS is built for every x86 core (DYNAMIC_ARCH) and picks one from the CPUID
 * family/model when the library loads. A VM that hides the model ("Intel(R) Xeon(R) Processor")
 * can make it fall back to Prescott's SSE3 kernels on a CPU with AVX-512: measured on such a VM,
 * debugmodel's CPU step took 739.7 ms against 242.6 ms with OPENBLAS_CORETYPE=SkylakeX. The CPU's
 * features (which __builtin_cpu_supports reads with the OS's XSAVE state) say what it can run, so
 * the core is chosen from them here: SkylakeX for AVX-512 F/BW/VL/DQ, Haswell for AVX2 + FMA,
 * Sandybridge for AVX. OpenBLAS reads OPENBLAS_CORETYPE only when it loads, so the program sets it
 * and starts itself again (cli/main.c); a user's OPENBLAS_CORETYPE always wins.
 *
 * The kernels decide the bits of every CPU matmul: the same core gives the same bits on any
 * thread count, another core (another CPU generation) other bits. */
#include "cpu_internal.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* How wide a core's kernels are: 0 SSE, 1 AVX, 2 AVX2, 3 AVX-512. Unknown names count as wide
 * (never replaced: a core this table does not know, e.g. a newer one, is left to OpenBLAS). */
static int core_rank(const char *core)
{
    static const char *const sse[] = {
        "Katmai",       "Coppermine", "Northwood",  "Prescott", "Banias", "Atom",
        "Core2",        "Penryn",     "Dunnington", "Nehalem",  "Athlon", "Opteron",
        "Opteron_SSE3", "Barcelona",  "Nano",       "Bobcat",   "Unknown"};
    static const char *const avx[] = {"Sandybridge", "Bulldozer", "Piledriver"};
    static const char *const avx2[] = {"Haswell", "Steamroller", "Excavator", "Zen"};
    for (size_t i = 0; i < sizeof sse / sizeof sse[0]; i++)
        if (!strcasecmp(core, sse[i])) return 0;
    for (size_t i = 0; i < sizeof avx / sizeof avx[0]; i++)
        if (!strcasecmp(core, avx[i])) return 1;
    for (size_t i = 0; i < sizeof avx2 / sizeof avx2[0]; i++)
        if (!strcasecmp(core, avx2[i])) return 2;
    return 3;
}

void gt_cpu_features_detect(gt_cpu_features *f)
{
    memset(f, 0, sizeof *f);
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    f->avx = __builtin_cpu_supports("avx");
    f->avx2 = __builtin_cpu_supports("avx2");
    f->fma = __builtin_cpu_supports("fma");
    f->avx512f = __builtin_cpu_supports("avx512f");
    f->avx512bw = __builtin_cpu_supports("avx512bw");
    f->avx512vl = __builtin_cpu_supports("avx512vl");
    f->avx512dq = __builtin_cpu_supports("avx512dq");
#endif
    FILE *fp = fopen("/proc/cpuinfo", "r");
    char line[512];
    while (fp && fgets(line, sizeof line, fp)) {
        if (strncmp(line, "model name", 10) != 0) continue;
        const char *v = strchr(line, ':');
        if (!v) break;
        v++;
        while (*v == ' ' || *v == '\t')
            v++;
        snprintf(f->model, sizeof f->model, "%s", v);
        f->model[strcspn(f->model, "\n")] = 0;
        break;
    }
    if (fp) fclose(fp);
}

const char *gt_cpu_blas_core_for(const char *chosen, const gt_cpu_features *f)
{
    const char *want = NULL;
    int want_rank = 0;
    if (f->avx512f && f->avx512bw && f->avx512vl && f->avx512dq)
        want = "SkylakeX", want_rank = 3;
    else if (f->avx2 && f->fma)
        want = "Haswell", want_rank = 2;
    else if (f->avx)
        want = "Sandybridge", want_rank = 1;
    if (!want || !chosen || core_rank(chosen) >= want_rank) return NULL;
    return want;
}

const char *gt_cpu_blas_core(void)
{
    /* the test hook: pretend OpenBLAS's detection chose this core */
    const char *fake = getenv("GT_TEST_BLAS_CORE");
    if (fake && *fake && !getenv("OPENBLAS_CORETYPE")) return fake;
    return openblas_get_corename();
}

void gt_cpu_blas_describe(char *buf, size_t n)
{
    gt_cpu_features f;
    gt_cpu_features_detect(&f);
    const char *set = getenv("OPENBLAS_CORETYPE"), *was = getenv("GT_BLAS_CORE_DETECTED");
    char why[160];
    if (set && was)
        snprintf(why, sizeof why,
                 "chosen by graphtrain from the CPU's features: OpenBLAS's "
                 "detection chose %s",
                 was);
    else if (set)
        snprintf(why, sizeof why, "OPENBLAS_CORETYPE=%s", set);
    else
        snprintf(why, sizeof why, "OpenBLAS's detection");
    const char *config = openblas_get_config();
    snprintf(buf, n, "blas: %s, core %s (%s); cpu \"%s\":%s%s%s%s%s", config ? config : "OpenBLAS",
             openblas_get_corename(), why, f.model[0] ? f.model : "unknown", f.avx ? " avx" : "",
             f.avx2 ? " avx2" : "", f.fma ? " fma" : "", f.avx512f ? " avx512f" : "",
             f.avx512bw ? " avx512bw" : "");
}
