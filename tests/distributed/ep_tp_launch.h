/* ep_tp_launch.h — the body of test_ep_tp_launch and test_ep_tp4_launch: expert parallelism
 * whose ep groups take tensor-parallel ranks (issue 37, Deliver 1's rule "ep divides dp_shard x
 * tp"; torchtitan's ETP = 1), on the CPU, fp32, debugmodel, through the real binary under
 * mpiexec (oversubscribed). The MoE tokens, replicated over tp, are split over the tp ranks, the
 * efsdp x ep groups cut the flattened dp_shard x tp ranks (ep inner), and the combined rows are
 * all-gathered back over tp. For the layout the including file names (EPT_SHARD x EPT_TP ranks,
 * ep EPT_EP):
 *   - 10 steps within 1e-5 relative of one rank with the same global batch, at every step (not
 *     bitwise: an expert's weight gradient adds the source ranks' parts in the ep groups' order,
 *     and the rest of the step sums tp and dp partials in other orders than one rank);
 *   - run vs rerun: bitwise (losses, gradient norms, final parameters hash);
 *   - the routing of step 1 is the one-rank run's: every layer's expert_bias after step 1 (a
 *     function of the step's per-expert counts only, from zero) is bitwise equal;
 *   - its step-5 checkpoint resumes on one rank with the uninterrupted one-rank losses (1e-5);
 *   - the step artifact saved on rank 0 and then loaded by every rank: bitwise the run without;
 *   - EPT_FULL (the 2-rank test): a capacity factor of 0.05 fails with the error naming the
 *     layer and the factor needed, before any step.
 * EPT_SP: sequence parallelism on (the MoE input, sequence-sharded over tp, is gathered where the
 * block flattens its tokens and split over tp again where routing starts) or off. */
#include "launch.h" /* first: train_child.h defines _GNU_SOURCE */

#define EPT_SECONDS 300.0
#define EPT_LAYERS 6 /* debugmodel: layer 0 dense, layers 1..5 MoE */
#define EPT_GLOBAL 4

typedef struct {
    launch_result r;
    char hash[32];
} ept_run;

static void ept_hash(const char *out_path, char *hash, size_t n)
{
    hash[0] = 0;
    char *text = read_all(out_path, NULL);
    const char *p = text ? strstr(text, "params xxh64 ") : NULL;
    if (p) snprintf(hash, n, "%.16s", p + strlen("params xxh64 "));
    free(text);
}

/* The layout (multi) or one rank with the same global batch; a checkpoint every `interval`
 * steps (0: none). */
static void ept_args(launch_cmd *c, const char *dump, bool multi, int steps, int interval)
{
    int np = EPT_SHARD * EPT_TP;
    launch_train(c, multi ? np : 0);
    launch_common(c, "debugmodel", dump, interval ? interval : 5);
    launch_add(c, "--model.name=deepseek_v3");
    launch_add(c, "--training.steps=%d", steps);
    if (!interval) launch_add(c, "--checkpoint.enable=false");
    launch_add(c, "--training.local_batch_size=%d", multi ? EPT_GLOBAL / EPT_SHARD : EPT_GLOBAL);
    if (!multi) return;
    launch_add(c, "--parallelism.data_parallel_shard_degree=%d", EPT_SHARD);
    launch_add(c, "--parallelism.tensor_parallel_degree=%d", EPT_TP);
    launch_add(c, "--parallelism.expert_parallel_degree=%d", EPT_EP);
    launch_add(c, "--parallelism.enable_sequence_parallel=%s", EPT_SP ? "true" : "false");
}

static void ept_run_x(const char *base, const char *name, bool multi, int steps, int interval,
                      const char *extra, ept_run *out, char **out_text)
{
    launch_cmd c;
    char out_path[700];
    bool resumed = extra && strstr(extra, "load_step");
    if (!resumed) launch_temp_dir(out->r.dump, sizeof out->r.dump, base, name);
    snprintf(out_path, sizeof out_path, "%s/output_%s.txt", out->r.dump, name);
    ept_args(&c, out->r.dump, multi, steps, interval);
    if (extra) launch_add(&c, "%s", extra);
    double dt = 0;
    int rc = launch_run(&c, out_path, EPT_SECONDS, &dt);
    out->r.ok = rc == 0 && (resumed ? launch_resumed_records(out->r.dump, out->r.steps)
                                    : last_records(out->r.dump, steps, out->r.steps, NULL));
    if (out_text) *out_text = read_all(out_path, NULL);
    ept_hash(out_path, out->hash, sizeof out->hash);
    printf("%-22s exit %d, %.1f s, params xxh64 %s\n", name, rc, dt, out->hash);
    EXPECT(out->r.ok && out->hash[0], "%s: exit %d, metrics or hash missing", name, rc);
    if (!out->r.ok) launch_show_tail(out_path);
}

static void ept_bitwise(const ept_run *a, const ept_run *b, const char *what)
{
    if (!a->r.ok || !b->r.ok) return;
    int differ = 0;
    for (int s = 1; s <= LAUNCH_STEPS; s++)
        differ += a->r.steps[s].loss != b->r.steps[s].loss ||
                  a->r.steps[s].grad_norm != b->r.steps[s].grad_norm;
    printf("  %-40s %d step(s) differ; hashes %s %s\n", what, differ, a->hash, b->hash);
    EXPECT(differ == 0, "%s: %d steps' loss or grad_norm bits differ", what, differ);
    EXPECT(strcmp(a->hash, b->hash) == 0, "%s: final params hash %s vs %s", what, a->hash, b->hash);
}

static void ept_close(const ept_run *a, const ept_run *b, int first, const char *what)
{
    if (!a->r.ok || !b->r.ok) return;
    double dl = launch_loss_diff(a->r.steps, b->r.steps, first, LAUNCH_STEPS);
    printf("  %-40s loss diff %.2e (steps %d..%d)\n", what, dl, first, LAUNCH_STEPS);
    EXPECT(dl <= 1e-5, "%s: losses differ by %.3g relative (> 1e-5)", what, dl);
}

/* Step 1's routing: every MoE layer's expert_bias in the two runs' step-1 checkpoints. */
static void ept_same_routing(const ept_run *a, const ept_run *b)
{
    if (!a->r.ok || !b->r.ok) return;
    char pa[700], pb[700];
    launch_ckpt_path(pa, sizeof pa, a->r.dump, 1);
    launch_ckpt_path(pb, sizeof pb, b->r.dump, 1);
    gt_safetensors fa, fb;
    gt_error err = {0};
    EXPECT_OK(gt_safetensors_open(pa, &fa, &err), &err);
    EXPECT_OK(gt_safetensors_open(pb, &fb, &err), &err);
    int same = 0, nonzero = 0;
    for (int l = 1; l < EPT_LAYERS; l++) {
        char name[64];
        snprintf(name, sizeof name, "layers.%d.moe.expert_bias_E", l);
        gt_tensor ta = {0}, tb = {0};
        EXPECT_OK(gt_safetensors_get(&fa, name, &ta, &err), &err);
        EXPECT_OK(gt_safetensors_get(&fb, name, &tb, &err), &err);
        if (ta.data && tb.data && gt_tensor_nbytes(&ta) == gt_tensor_nbytes(&tb)) {
            same += memcmp(ta.data, tb.data, gt_tensor_nbytes(&ta)) == 0;
            for (int64_t i = 0; i < gt_tensor_numel(&ta); i++)
                nonzero += gt_tensor_get_f32(&ta, i) != 0.0;
        }
        gt_tensor_free(&ta);
        gt_tensor_free(&tb);
    }
    gt_safetensors_close(&fa);
    gt_safetensors_close(&fb);
    printf("  %-40s %d of %d layers' expert_bias bitwise (%d nonzero entries)\n",
           "step-1 routing vs one rank", same, EPT_LAYERS - 1, nonzero);
    EXPECT(same == EPT_LAYERS - 1, "step 1: %d of %d layers route as one rank", same,
           EPT_LAYERS - 1);
    EXPECT(nonzero > 0, "step 1: every expert_bias is still zero (the check would be empty)");
}

/* The layout's step-5 checkpoint resumed on one rank: steps 6..10 as the uninterrupted one. */
static void ept_resume(const char *base, const ept_run *one, const ept_run *ep)
{
    if (!one->r.ok || !ep->r.ok) return;
    static ept_run back;
    launch_temp_dir(back.r.dump, sizeof back.r.dump, base, "resume_1rank");
    char cmd[2400];
    snprintf(cmd, sizeof cmd,
             "mkdir -p '%s/checkpoint' && cp -r '%s/checkpoint/step-5' '%s/checkpoint/'",
             back.r.dump, ep->r.dump, back.r.dump);
    EXPECT(system(cmd) == 0, "copying the step-5 checkpoint");
    ept_run_x(base, "resume_1rank", false, LAUNCH_STEPS, 5, "--checkpoint.load_step=5", &back,
              NULL);
    ept_close(one, &back, 6, "ep over tp ranks -> 1 rank resume");
}

/* Saved by rank 0, then loaded by every rank: bitwise `ref`. */
static void ept_artifact(const char *base, const ept_run *ref)
{
    static ept_run saved, loaded;
    char art[400], opt[460], *out = NULL;
    snprintf(art, sizeof art, "%s/artifact", base);
    snprintf(opt, sizeof opt, "--compile.precompile_artifact_dir=%s", art);
    ept_run_x(base, "save", true, LAUNCH_STEPS, 0, opt, &saved, &out);
    EXPECT(out && strstr(out, "compiled the step on rank 0"), "the artifact was not saved");
    free(out);
    ept_bitwise(ref, &saved, "artifact saved vs none");
    ept_run_x(base, "load", true, LAUNCH_STEPS, 0, opt, &loaded, &out);
    EXPECT(out && strstr(out, "loaded the compiled step"), "the artifact was not loaded");
    free(out);
    ept_bitwise(ref, &loaded, "artifact loaded vs none");
}

#ifdef EPT_FULL
/* A layout run that must fail before any step with every needle in its output. */
static void ept_refused(const char *base, const char *name, const char *extra, const char *n1,
                        const char *n2)
{
    launch_cmd c;
    launch_outcome o = {0};
    char out_path[700];
    launch_temp_dir(o.dump, sizeof o.dump, base, name);
    snprintf(out_path, sizeof out_path, "%s/output.txt", o.dump);
    ept_args(&c, o.dump, true, 2, 0);
    launch_add(&c, "%s", extra);
    launch_run_outcome(&c, out_path, EPT_SECONDS, &o);
    bool ok = true;
    printf("%-22s exit %d, %.1f s\n", name, o.rc, o.seconds);
    LAUNCH_CHECK(o.rc > 0, "%s: exit %d, expected a failure (not a hang)", name, o.rc);
    LAUNCH_CHECK(strstr(o.out, n1) && strstr(o.out, n2), "%s: the error names '%s' and '%s'", name,
                 n1, n2);
    LAUNCH_CHECK(o.records == 0, "%s: %d steps recorded", name, o.records);
    launch_outcome_free(&o, !ok);
}
#endif

static int ept_main(const char *test_name)
{
    char base[256];
    if (!launch_begin(base, sizeof base, test_name)) return 1;
    static ept_run one, ep, again, one_s1, ep_s1;
    printf("dp_shard %d x tp %d, expert_parallel_degree %d, sequence parallel %s\n", EPT_SHARD,
           EPT_TP, EPT_EP, EPT_SP ? "on" : "off");
    ept_run_x(base, "1rank", false, LAUNCH_STEPS, 5, NULL, &one, NULL);
    ept_run_x(base, "layout", true, LAUNCH_STEPS, 5, NULL, &ep, NULL);
    ept_close(&one, &ep, 1, "ep over tp ranks vs 1 rank");
    ept_run_x(base, "layout_again", true, LAUNCH_STEPS, 0, NULL, &again, NULL);
    ept_bitwise(&ep, &again, "run vs rerun");
    ept_run_x(base, "1rank_step1", false, 1, 1, NULL, &one_s1, NULL);
    ept_run_x(base, "layout_step1", true, 1, 1, NULL, &ep_s1, NULL);
    ept_same_routing(&one_s1, &ep_s1);
    ept_resume(base, &one, &ep);
    ept_artifact(base, &again);
#ifdef EPT_FULL
    ept_refused(base, "f0.05", "--parallelism.expert_parallel_capacity_factor=0.05",
                "expert-parallel capacity overflow", "expert_parallel_capacity_factor to at least");
#endif
    if (gt_test_failed_ == 0 && !getenv("GT_KEEP")) remove_tree(base);
    return gt_test_finish();
}
