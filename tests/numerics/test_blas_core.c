/* test_blas_core.c — the BLAS core where OpenBLAS's own detection falls back (issue 44).
 *
 * The choice: a fallback core (Prescott's SSE3 kernels, as Debian's OpenBLAS 0.3.21 picks on VMs
 * that hide the CPU model) on a CPU with AVX-512 F/BW/VL/DQ gives SkylakeX, with AVX2 + FMA
 * Haswell, with AVX Sandybridge; a core as wide as the features, or one the table does not know,
 * is left alone.
 * The run: `graphtrain train` with GT_TEST_BLAS_CORE=Prescott (OpenBLAS's detection pretends to
 * fall back) restarts itself with the core this CPU's features allow and says so in the header
 * (when the CPU has no AVX the header keeps OpenBLAS's own choice); with the user's
 * OPENBLAS_CORETYPE set, that core runs and the header names the variable. */
#include "train_child.h" /* first: it defines _GNU_SOURCE */

#include "graphtrain/gt_backend.h"
#include "gt_test.h"

static void test_choice(void)
{
    gt_cpu_features none = {0}, avx = {.avx = true},
                    avx2 = {.avx = true, .avx2 = true, .fma = true};
    gt_cpu_features avx512 = avx2;
    avx512.avx512f = avx512.avx512bw = avx512.avx512vl = avx512.avx512dq = true;
    struct {
        const char *chosen;
        const gt_cpu_features *f;
        const char *want; /* NULL: keep */
    } cases[] = {
        {"Prescott", &avx512, "SkylakeX"},
        {"Nehalem", &avx512, "SkylakeX"},
        {"Haswell", &avx512, "SkylakeX"},
        {"SkylakeX", &avx512, NULL},
        {"Cooperlake", &avx512, NULL},
        {"Prescott", &avx2, "Haswell"},
        {"Zen", &avx2, NULL},
        {"Core2", &avx, "Sandybridge"},
        {"Prescott", &none, NULL},
        {"SomeFutureCore", &avx512, NULL},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const char *got = gt_cpu_blas_core_for(cases[k].chosen, cases[k].f);
        bool ok = cases[k].want ? got && !strcmp(got, cases[k].want) : got == NULL;
        EXPECT(ok, "core for %s: got %s, expected %s", cases[k].chosen, got ? got : "(keep)",
               cases[k].want ? cases[k].want : "(keep)");
    }
}

static void test_run(const char *binary, const char *root)
{
    const char *opts[] = {"model.flavor=test_tiny", "training.mixed_precision_param=float32",
                          "job.print_config=false", "training.steps=1"};
    gt_cpu_features f;
    gt_cpu_features_detect(&f);
    const char *want = gt_cpu_blas_core_for("Prescott", &f);
    char dump[600], line[200];
    snprintf(dump, sizeof dump, "%s/fallback", root);
    setenv("GT_TEST_BLAS_CORE", "Prescott", 1);
    unsetenv("OPENBLAS_CORETYPE");
    char *out = NULL;
    int rc = train_child_run(binary, opts, 4, dump, 300, &out);
    EXPECT(rc == 0, "fallback run: exit %d", rc);
    if (want)
        snprintf(line, sizeof line,
                 "core %s (chosen by graphtrain from the CPU's features: OpenBLAS's detection "
                 "chose Prescott)",
                 want);
    else
        snprintf(line, sizeof line, "(OpenBLAS's detection)");
    EXPECT(out && strstr(out, line), "fallback run: no header line with \"%s\"", line);
    if (rc != 0 || !strstr(out, line)) train_child_show_tail(out);
    free(out);

    snprintf(dump, sizeof dump, "%s/user", root);
    setenv("OPENBLAS_CORETYPE", "Prescott", 1);
    rc = train_child_run(binary, opts, 4, dump, 300, &out);
    EXPECT(rc == 0, "user core run: exit %d", rc);
    EXPECT(out && strstr(out, "core Prescott (OPENBLAS_CORETYPE=Prescott)"),
           "user core run: the user's OPENBLAS_CORETYPE did not win");
    if (rc != 0) train_child_show_tail(out);
    free(out);
    unsetenv("OPENBLAS_CORETYPE");
    unsetenv("GT_TEST_BLAS_CORE");
}

int main(void)
{
    char root[] = "/tmp/gt_blas_XXXXXX";
    const char *binary = train_child_start(root);
    if (!binary) return 1;
    test_choice();
    test_run(binary, root);
    remove_tree(root);
    return gt_test_finish();
}
