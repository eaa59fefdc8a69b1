/* test_default_run.c — the README's main command trains close to the best possible loss
 * (issue 3, acceptance: "its final loss is within 0.15 nats of the synthetic corpus' entropy
 * rate").
 *
 * Runs `graphtrain train --config=configs/default.toml --job.dump_folder=TMP` as a child process
 * and reads the summary line it prints last,
 *   trained steps 1..N: final loss X, corpus entropy rate H (gap G nats); params xxh64 ...
 * The entropy rate H is the corpus' own (computed by the synthetic data module from its
 * generating process): no model can have an expected loss below it, so X − H measures how far
 * training is from the optimum. Asserts G <= 0.15 and G == X − H as printed, and prints the
 * numbers. Label "slow": about half a minute at -O2; not part of the ASan pass. */
#include "train_child.h" /* first: it defines _GNU_SOURCE for nftw */

#include <math.h>

#include "gt_test.h"

#define MAX_GAP 0.15        /* nats per token */
#define CHILD_SECONDS 840.0 /* below CTest's 900 s timeout */

int main(void)
{
    char root[] = "/tmp/gt_default_run_XXXXXX";
    const char *binary = train_child_start(root);
    EXPECT(binary, "no graphtrain program or no test folder (stderr says which)");
    if (!binary) return gt_test_finish();
    char config_opt[500], dump[128], out_path[128], err_path[128];
    snprintf(config_opt, sizeof config_opt, "config=%s/configs/default.toml", GT_SOURCE_DIR);
    snprintf(dump, sizeof dump, "%s/run", root);
    snprintf(out_path, sizeof out_path, "%s/stdout.txt", root);
    snprintf(err_path, sizeof err_path, "%s/stderr.txt", root);

    const char *options[] = {config_opt};
    double t0 = now_seconds();
    pid_t pid = spawn_train(binary, options, 1, dump, out_path, err_path);
    EXPECT(pid > 0, "fork failed");
    int rc = pid > 0 ? wait_child(pid, CHILD_SECONDS) : -1; /* bounded wait */
    double seconds = now_seconds() - t0;
    char *out = read_all(out_path, NULL);
    EXPECT(rc == 0, "graphtrain exited with %d after %.0f s (stderr in %s)", rc, seconds, err_path);

    /* the last line that starts the summary */
    const char *line = NULL;
    for (const char *p = out; p && (p = strstr(p, "trained steps ")); p++)
        if (p == out || p[-1] == '\n') line = p;
    long long first = 0, last = 0;
    double loss = NAN, entropy = NAN, gap = NAN;
    int got = line ? sscanf(line,
                            "trained steps %lld..%lld: final loss %lf, corpus entropy rate %lf "
                            "(gap %lf nats)",
                            &first, &last, &loss, &entropy, &gap)
                   : 0;
    EXPECT(got == 5, "no summary line with the entropy rate in the output:\n%s",
           out ? out : "(none)");
    if (got == 5) {
        printf("default config: trained steps %lld..%lld in %.1f s: final loss %.6f, corpus "
               "entropy rate %.6f, gap %.4f nats (limit %.2f)\n",
               first, last, seconds, loss, entropy, gap, MAX_GAP);
        EXPECT(first == 1 && last >= first, "trained steps %lld..%lld: expected a fresh run", first,
               last);
        EXPECT(isfinite(loss) && isfinite(entropy) && entropy > 0,
               "loss %g, entropy rate %g: expected finite, entropy rate > 0", loss, entropy);
        /* the printed gap is the printed loss minus the printed rate (each rounded to 1e-6) */
        EXPECT(fabs(gap - (loss - entropy)) <= 1e-4, "gap %.4f but loss - rate = %.6f", gap,
               loss - entropy);
        EXPECT(gap <= MAX_GAP,
               "final loss %.6f is %.4f nats above the entropy rate %.6f (limit "
               "%.2f)",
               loss, gap, entropy, MAX_GAP);
    }
    free(out);
    remove_tree(root);
    return gt_test_finish();
}
