/* ep_tp_launch.h — the expert-parallel launch tests' runs and checks on the CPU, fp32, through
 * the real binary under mpiexec (oversubscribed): deepseek_v3 on a layout `epl` (dp_replicate x
 * dp_shard x tp, global batch, sequence parallel) with an expert_parallel_degree, or one rank
 * with the same global batch; the checks bitwise, within 1e-5, step-1 routing, resume on one
 * rank, the artifact saved and loaded, and a run refused with a named error.
 * test_ep_efsdp_launch.c uses them for `dp_shard 4, ep 2`; with EPT_EP defined, ept_main is the
 * body of test_ep_tp_launch and test_ep_tp4_launch: expert parallelism whose ep groups take
 * tensor-parallel ranks (issue 37, Deliver 1's rule "ep divides dp_shard x tp"; torchtitan's
 * ETP = 1). The MoE tokens, replicated over tp, are split over the tp ranks, the efsdp x ep
 * groups cut the flattened dp_shard x tp ranks (ep inner), the expert weights are stored over
 * them (E / (dp_shard x tp) experts a rank), and the combined rows are all-gathered back over tp.
 * For the layout the including file names (EPT_SHARD x EPT_TP ranks, ep EPT_EP):
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
 * block flattens its tokens and split over tp again where routing starts) or off. EPT_MORE(base,
 * one): a function of the including file run last, given the one-rank run. */
#include "launch.h" /* first: train_child.h defines _GNU_SOURCE */

#define EPL_SECONDS 300.0
#define EPL_LAYERS 6 /* debugmodel: layer 0 dense, layers 1..5 MoE */

typedef struct {
    launch_result r;
    char hash[32];
} epl_run;

/* The runs' layout: the flavor, the mesh of the runs with ep > 0 (dp_replicate x dp_shard x tp),
 * the global batch (the one-rank reference's too) and enable_sequence_parallel (-1: not set). */
typedef struct {
    const char *flavor;
    int rep, shard, tp, global, sp;
} epl_layout;

static epl_layout epl = {"debugmodel", 1, 1, 1, 4, -1};

static inline void epl_hash(const char *out_path, char *hash, size_t n)
{
    hash[0] = 0;
    char *text = read_all(out_path, NULL);
    const char *p = text ? strstr(text, "params xxh64 ") : NULL;
    if (p) snprintf(hash, n, "%.16s", p + strlen("params xxh64 "));
    free(text);
}

/* The layout with expert_parallel_degree ep (ep 0: one rank, the same global batch), `steps`
 * steps, a checkpoint every `interval` steps (0: none). */
static inline void epl_args(launch_cmd *c, const char *dump, int ep, int steps, int interval)
{
    int dp = epl.rep * epl.shard;
    launch_train(c, ep ? dp * epl.tp : 0);
    launch_common(c, epl.flavor, dump, interval ? interval : 5);
    launch_add(c, "--model.name=deepseek_v3");
    launch_add(c, "--training.steps=%d", steps);
    if (!interval) launch_add(c, "--checkpoint.enable=false");
    launch_add(c, "--training.local_batch_size=%d", ep ? epl.global / dp : epl.global);
    if (!ep) return;
    launch_add(c, "--parallelism.data_parallel_replicate_degree=%d", epl.rep);
    launch_add(c, "--parallelism.data_parallel_shard_degree=%d", epl.shard);
    launch_add(c, "--parallelism.tensor_parallel_degree=%d", epl.tp);
    launch_add(c, "--parallelism.expert_parallel_degree=%d", ep);
    if (epl.sp >= 0)
        launch_add(c, "--parallelism.enable_sequence_parallel=%s", epl.sp ? "true" : "false");
}

/* extra: one more option or NULL; a resumed run (extra --checkpoint.load_step=5, its dump folder
 * already made) records steps 6.. only. out_text: the output, or NULL. */
static inline void epl_run_x(const char *base, const char *name, int ep, int steps, int interval,
                             const char *extra, epl_run *out, char **out_text)
{
    launch_cmd c;
    char out_path[700];
    bool resumed = extra && strstr(extra, "load_step");
    if (!resumed) launch_temp_dir(out->r.dump, sizeof out->r.dump, base, name);
    snprintf(out_path, sizeof out_path, "%s/output_%s.txt", out->r.dump, name);
    epl_args(&c, out->r.dump, ep, steps, interval);
    if (extra) launch_add(&c, "%s", extra);
    double dt = 0;
    int rc = launch_run(&c, out_path, EPL_SECONDS, &dt);
    out->r.ok = rc == 0 && (resumed ? launch_resumed_records(out->r.dump, out->r.steps)
                                    : last_records(out->r.dump, steps, out->r.steps, NULL));
    if (out_text) *out_text = read_all(out_path, NULL);
    epl_hash(out_path, out->hash, sizeof out->hash);
    printf("%-22s exit %d, %.1f s, params xxh64 %s\n", name, rc, dt, out->hash);
    EXPECT(out->r.ok && out->hash[0], "%s: exit %d, metrics or hash missing", name, rc);
    if (!out->r.ok) launch_show_tail(out_path);
}

static inline void epl_bitwise(const epl_run *a, const epl_run *b, const char *what)
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

/* Losses of steps first..last within 1e-5 relative. */
static inline void epl_close_n(const epl_run *a, const epl_run *b, int first, int last,
                               const char *what)
{
    if (!a->r.ok || !b->r.ok) return;
    double dl = launch_loss_diff(a->r.steps, b->r.steps, first, last);
    printf("  %-40s loss diff %.2e (steps %d..%d)\n", what, dl, first, last);
    EXPECT(dl <= 1e-5, "%s: losses differ by %.3g relative (> 1e-5)", what, dl);
}

static inline void epl_close(const epl_run *a, const epl_run *b, int first, const char *what)
{
    epl_close_n(a, b, first, LAUNCH_STEPS, what);
}

/* Step 1's routing: every MoE layer's expert_bias in the two runs' step-1 checkpoints. */
static inline void epl_same_routing(const epl_run *a, const epl_run *b)
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
    for (int l = 1; l < EPL_LAYERS; l++) {
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
           "step-1 routing vs one rank", same, EPL_LAYERS - 1, nonzero);
    EXPECT(same == EPL_LAYERS - 1, "step 1: %d of %d layers route as one rank", same,
           EPL_LAYERS - 1);
    EXPECT(nonzero > 0, "step 1: every expert_bias is still zero (the check would be empty)");
}

/* The step-5 checkpoint of `run` resumed on one rank: steps 6..10 as the uninterrupted `one`. */
static inline void epl_resume(const char *base, const epl_run *one, const epl_run *run,
                              const char *what)
{
    if (!one->r.ok || !run->r.ok) return;
    static epl_run back;
    launch_temp_dir(back.r.dump, sizeof back.r.dump, base, "resume_1rank");
    char cmd[2400];
    snprintf(cmd, sizeof cmd,
             "mkdir -p '%s/checkpoint' && cp -r '%s/checkpoint/step-5' '%s/checkpoint/'",
             back.r.dump, run->r.dump, back.r.dump);
    EXPECT(system(cmd) == 0, "copying the step-5 checkpoint");
    epl_run_x(base, "resume_1rank", 0, LAUNCH_STEPS, 5, "--checkpoint.load_step=5", &back, NULL);
    epl_close(one, &back, 6, what);
}

/* The artifact in `art`, saved by rank 0 of an ep run (name prefix `name`), then loaded by every
 * rank: each bitwise `ref`. */
static inline void epl_artifact(const char *base, const char *art, const char *name, int ep,
                                const epl_run *ref)
{
    static epl_run saved, loaded;
    char opt[460], run[64], *out = NULL;
    snprintf(opt, sizeof opt, "--compile.precompile_artifact_dir=%s", art);
    snprintf(run, sizeof run, "%ssave", name);
    epl_run_x(base, run, ep, LAUNCH_STEPS, 0, opt, &saved, &out);
    EXPECT(out && strstr(out, "compiled the step on rank 0"), "ep %d: the artifact was not saved",
           ep);
    free(out);
    epl_bitwise(ref, &saved, "artifact saved vs none");
    snprintf(run, sizeof run, "%sload", name);
    epl_run_x(base, run, ep, LAUNCH_STEPS, 0, opt, &loaded, &out);
    EXPECT(out && strstr(out, "loaded the compiled step"), "ep %d: the artifact was not loaded",
           ep);
    free(out);
    epl_bitwise(ref, &loaded, "artifact loaded vs none");
}

/* An ep run of 2 steps with option `extra` that must fail before any step with every needle
 * (n3 may be NULL) in its output. */
static inline void epl_refused(const char *base, const char *name, int ep, const char *extra,
                               const char *n1, const char *n2, const char *n3)
{
    launch_cmd c;
    launch_outcome o = {0};
    char out_path[700];
    launch_temp_dir(o.dump, sizeof o.dump, base, name);
    snprintf(out_path, sizeof out_path, "%s/output.txt", o.dump);
    epl_args(&c, o.dump, ep, 2, 0);
    launch_add(&c, "%s", extra);
    launch_run_outcome(&c, out_path, EPL_SECONDS, &o);
    bool ok = true;
    printf("%-22s exit %d, %.1f s\n", name, o.rc, o.seconds);
    LAUNCH_CHECK(o.rc > 0, "%s: exit %d, expected a failure (not a hang)", name, o.rc);
    LAUNCH_CHECK(strstr(o.out, n1) && strstr(o.out, n2) && (!n3 || strstr(o.out, n3)),
                 "%s: the error names '%s', '%s' and '%s'", name, n1, n2, n3 ? n3 : "");
    LAUNCH_CHECK(o.records == 0, "%s: %d steps recorded", name, o.records);
    launch_outcome_free(&o, !ok);
}

#ifdef EPT_EP
#ifdef EPT_MORE
static void EPT_MORE(const char *base, const epl_run *one); /* defined by the including file */
#endif

static int ept_main(const char *test_name)
{
    char base[256], art[400];
    if (!launch_begin(base, sizeof base, test_name)) return 1;
    epl = (epl_layout){"debugmodel", 1, EPT_SHARD, EPT_TP, 4, EPT_SP};
    static epl_run one, ep, again, one_s1, ep_s1;
    printf("dp_shard %d x tp %d, expert_parallel_degree %d, sequence parallel %s\n", EPT_SHARD,
           EPT_TP, EPT_EP, EPT_SP ? "on" : "off");
    epl_run_x(base, "1rank", 0, LAUNCH_STEPS, 5, NULL, &one, NULL);
    epl_run_x(base, "layout", EPT_EP, LAUNCH_STEPS, 5, NULL, &ep, NULL);
    epl_close(&one, &ep, 1, "ep over tp ranks vs 1 rank");
    epl_run_x(base, "layout_again", EPT_EP, LAUNCH_STEPS, 0, NULL, &again, NULL);
    epl_bitwise(&ep, &again, "run vs rerun");
    epl_run_x(base, "1rank_step1", 0, 1, 1, NULL, &one_s1, NULL);
    epl_run_x(base, "layout_step1", EPT_EP, 1, 1, NULL, &ep_s1, NULL);
    epl_same_routing(&one_s1, &ep_s1);
    epl_resume(base, &one, &ep, "ep over tp ranks -> 1 rank resume");
    snprintf(art, sizeof art, "%s/artifact", base);
    epl_artifact(base, art, "", EPT_EP, &again);
#ifdef EPT_FULL
    epl_refused(base, "f0.05", EPT_EP, "--parallelism.expert_parallel_capacity_factor=0.05",
                "expert-parallel capacity overflow", "expert_parallel_capacity_factor to at least",
                NULL);
#endif
#ifdef EPT_MORE
    EPT_MORE(base, &one); /* the including test's further layouts against the one-rank run */
#endif
    launch_end(base);
    return gt_test_finish();
}
#endif
