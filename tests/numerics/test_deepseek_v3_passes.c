/* test_deepseek_v3_passes.c — every exact pass, every memory policy and a rerun keep DeepSeek-V3's
 * training bits (issue 36's bitwise pairs for the MoE model).
 *
 * test_dsv3_tiny (softmax routing) and test_dsv3_tiny_sigmoid (sigmoid routing with expert
 * groups), f32 on the CPU, batch 4 x 32, 4 steps, `graphtrain train` as a child process. The
 * reference run uses the default pass pipeline. Against it, bit for bit (every step's loss and
 * grad_norm as the metrics file records them, and the final params hash, which covers the expert
 * bias buffers):
 *   - the same command again (run vs rerun);
 *   - each exact pass that runs on one rank removed (--compile.disable_passes NAME):
 *     canonicalize, cse, memory_policy, remat, dce, fusion;
 *   - each memory policy: full (recompute every layer's forward in the backward, the router, sort
 *     and counts included: a recomputed routing must be the same routing), eager, none.
 * A routing recomputed into another one, a pass that reorders a sum, a count read twice: any of
 * them changes the loss of a later step or the expert bias, so the hash. */
#include "train_child.h" /* first: it defines _GNU_SOURCE */

#include "gt_test.h"

#define STEPS 4

typedef struct {
    gt_metrics_step rec[STEPS + 1];
    uint64_t hash;
    bool ok;
} run_result;

static run_result run(const char *binary, const char *root, const char *flavor, const char *name,
                      const char *extra)
{
    run_result r = {.ok = false};
    char dump[400], fl[80];
    snprintf(dump, sizeof dump, "%s/%s_%s", root, flavor, name);
    snprintf(fl, sizeof fl, "model.flavor=%s", flavor);
    const char *opts[] = {"model.name=deepseek_v3",
                          fl,
                          "training.mixed_precision_param=float32",
                          "training.local_batch_size=4",
                          "training.seq_len=32",
                          "training.steps=4",
                          "optimizer.lr=1e-2",
                          "job.print_config=false",
                          "metrics.log_freq=1",
                          extra};
    int n = (int)(sizeof opts / sizeof opts[0]) - (extra ? 0 : 1);
    char *out = NULL;
    int rc = train_child_run(binary, opts, n, dump, 300, &out);
    long long first, last;
    bool parsed = rc == 0 && parse_summary(out, &first, &last, &r.hash);
    EXPECT(parsed, "%s %s: exit %d, no summary line", flavor, name, rc);
    if (!parsed) train_child_show_tail(out);
    free(out);
    r.ok = parsed && last_records(dump, STEPS, r.rec, NULL);
    EXPECT(r.ok || !parsed, "%s %s: metrics.jsonl lacks a step", flavor, name);
    return r;
}

static void same_bits(const char *flavor, const char *name, const run_result *ref,
                      const run_result *r)
{
    if (!ref->ok || !r->ok) return;
    for (int s = 1; s <= STEPS; s++)
        EXPECT(r->rec[s].loss == ref->rec[s].loss && r->rec[s].grad_norm == ref->rec[s].grad_norm,
               "%s %s: step %d loss %.17g grad_norm %.17g, reference %.17g %.17g", flavor, name, s,
               r->rec[s].loss, r->rec[s].grad_norm, ref->rec[s].loss, ref->rec[s].grad_norm);
    EXPECT(r->hash == ref->hash, "%s %s: params xxh64 %016llx, reference %016llx", flavor, name,
           (unsigned long long)r->hash, (unsigned long long)ref->hash);
    printf("  %-14s %-34s %016llx %s\n", flavor, name, (unsigned long long)r->hash,
           r->hash == ref->hash ? "same bits" : "DIFFERENT");
}

static void check_flavor(const char *binary, const char *root, const char *flavor)
{
    run_result ref = run(binary, root, flavor, "reference", NULL);
    run_result again = run(binary, root, flavor, "rerun", NULL);
    same_bits(flavor, "rerun", &ref, &again);
    static const char *const passes[] = {"canonicalize", "cse", "memory_policy",
                                         "remat",        "dce", "fusion"};
    for (size_t k = 0; k < sizeof passes / sizeof passes[0]; k++) {
        char opt[80], name[80];
        snprintf(opt, sizeof opt, "compile.disable_passes=%s", passes[k]);
        snprintf(name, sizeof name, "without %s", passes[k]);
        run_result r = run(binary, root, flavor, passes[k], opt);
        same_bits(flavor, name, &ref, &r);
    }
    static const char *const policies[] = {"full", "eager", "none"};
    for (size_t k = 0; k < sizeof policies / sizeof policies[0]; k++) {
        char opt[80], name[80], dir[40];
        snprintf(opt, sizeof opt, "compile.memory_policy=%s", policies[k]);
        snprintf(name, sizeof name, "memory_policy %s", policies[k]);
        snprintf(dir, sizeof dir, "policy_%s", policies[k]);
        run_result r = run(binary, root, flavor, dir, opt);
        same_bits(flavor, name, &ref, &r);
    }
    if (ref.ok)
        EXPECT(ref.rec[STEPS].loss < ref.rec[1].loss, "%s: the loss did not fall (%.6f -> %.6f)",
               flavor, ref.rec[1].loss, ref.rec[STEPS].loss);
}

int main(void)
{
    char root[] = "/tmp/gt_dsv3_passes_XXXXXX";
    const char *binary = train_child_start(root);
    if (!binary) return 1;
    check_flavor(binary, root, "test_dsv3_tiny");
    check_flavor(binary, root, "test_dsv3_tiny_sigmoid");
    remove_tree(root);
    return gt_test_finish();
}
