/* test_pp_moe_launch.c — `graphtrain train` with pipeline parallelism on DeepSeek-V3 (issue 39),
 * through the real binary under `mpiexec -np 2`.
 *
 * DeepSeek-V3's MoE blocks carry values from one micro-batch to the next that llama3 has not: the
 * token counts of each MoE block summed over the step's micro-batches (a running sum of the
 * block's stage), the micro-batch clock that restarts those sums and lets the expert-bias update
 * through in the last micro-batch (every rank runs it, gt_pp_split.h), and the expert biases
 * themselves, updated once a step on their block's stage and read by every micro-batch's forward.
 *
 * The reference is one rank accumulating 4 micro-batches of 1 sequence (local_batch_size 1,
 * global_batch_size 4), deepseek_v3 debugmodel, fp32, seq 32, STEPS steps. A pipeline run takes a
 * local batch of 4 in micro-batches of 1 and must be that run bit for bit:
 *   - every schedule (GPipe, 1F1B, Interleaved1F1B, ZBVZeroBubble, DualPipeV) on 2 ranks, with
 *     per-stage programs (compile.enable, the default), and 1F1B node by node
 *     (--compile.enable false): the loss and grad_norm of every step the same doubles, the same
 *     final params xxh64 (parameters and model buffers), and the last step's checkpoint the same
 *     bytes as the one rank's (the expert biases and the MoE accumulation's buffers are in it,
 *     gathered from their stage's rank);
 *   - the checkpoint of a 2-rank 1F1B run after step CKPT, resumed on one rank (the reference's
 *     options), trains the later steps with the uninterrupted run's losses and grad norms, bit
 *     for bit, and ends on its checkpoint bytes. */
#include "launch.h" /* first: train_child.h defines _GNU_SOURCE */

#define RUN_SECONDS 300.0
#define STEPS 2
#define CKPT 1

static void common(launch_cmd *c, int np, const char *dump)
{
    launch_train(c, np);
    launch_common(c, "debugmodel", dump, CKPT);
    launch_add(c, "--model.name=deepseek_v3");
    launch_add(c, "--training.steps=%d", STEPS); /* after launch_common's: the later one holds */
}

static void one_rank(launch_cmd *c, const char *dump)
{
    common(c, 0, dump);
    launch_add(c, "--training.local_batch_size=1");
    launch_add(c, "--training.global_batch_size=4");
}

static void pipeline(launch_cmd *c, const char *schedule, const char *dump)
{
    common(c, 2, dump);
    launch_add(c, "--training.local_batch_size=4");
    launch_add(c, "--parallelism.pipeline_parallel_degree=2");
    launch_add(c, "--parallelism.pipeline_parallel_schedule=%s", schedule);
    launch_add(c, "--parallelism.pipeline_parallel_microbatch_size=1");
}

/* The last record of each step first..STEPS of DUMP/metrics.jsonl into out[first..]; false unless
 * each has one and no earlier step has (a resumed run starts after its checkpoint). */
static bool records(const char *dump, int first, gt_metrics_step *out)
{
    gt_metrics_log log = {0};
    if (!read_metrics(dump, &log)) return false;
    for (int s = 0; s <= STEPS; s++)
        out[s].step = 0;
    for (int64_t k = 0; k < log.n_steps; k++) {
        int64_t s = log.steps[k].step;
        if (s >= 1 && s <= STEPS) out[s] = log.steps[k];
    }
    gt_metrics_log_free(&log);
    bool ok = true;
    for (int s = 1; s <= STEPS; s++)
        ok = ok && (s < first ? out[s].step == 0 : out[s].step == s);
    return ok;
}

/* Runs c with its output into DUMP.txt; the records of steps first..STEPS into r, *hash the final
 * hash (0 when the run names none). */
static bool run(launch_cmd *c, const char *dump, int first, launch_result *r, uint64_t *hash)
{
    char out_path[600];
    snprintf(out_path, sizeof out_path, "%s.txt", dump);
    snprintf(r->dump, sizeof r->dump, "%s", dump);
    double dt = 0;
    int rc = launch_run(c, out_path, RUN_SECONDS, &dt);
    char *out = read_all(out_path, NULL);
    long long f = 0, l = 0;
    r->ok = rc == 0 && out && parse_summary(out, &f, &l, hash) && f == first && l == STEPS &&
            records(dump, first, r->steps);
    printf("%-48s exit %d, %.1f s\n", dump, rc, dt);
    if (!r->ok) launch_show_tail(out_path);
    free(out);
    return r->ok;
}

/* Steps first..STEPS of r against ref: losses and grad norms bitwise, the last checkpoint's
 * bytes, and the hash when given. */
static void compare(const char *name, const launch_result *ref, uint64_t ref_hash,
                    const launch_result *r, uint64_t hash, int first)
{
    int differ = 0;
    for (int s = first; s <= STEPS; s++)
        differ += ref->steps[s].loss != r->steps[s].loss ||
                  ref->steps[s].grad_norm != r->steps[s].grad_norm;
    char pa[700], pb[700];
    launch_ckpt_path(pa, sizeof pa, ref->dump, STEPS);
    launch_ckpt_path(pb, sizeof pb, r->dump, STEPS);
    bool same_ckpt = same_bytes(pa, pb);
    EXPECT(differ == 0, "%s: %d of steps %d..%d differ from one rank's", name, differ, first,
           STEPS);
    EXPECT(hash == ref_hash, "%s: params xxh64 %016llx, one rank's %016llx", name,
           (unsigned long long)hash, (unsigned long long)ref_hash);
    EXPECT(same_ckpt, "%s: the step-%d checkpoint differs from one rank's", name, STEPS);
    printf("  %-30s loss %d..%d and grad_norm bitwise: %s; hash %016llx; checkpoint %s\n", name,
           first, STEPS, differ ? "NO" : "yes", (unsigned long long)hash,
           same_ckpt ? "same" : "DIFFERS");
}

static bool copy_file(const char *from, const char *to)
{
    size_t n = 0;
    char *bytes = read_all(from, &n);
    if (!bytes) return false;
    FILE *f = fopen(to, "wb");
    bool ok = f && fwrite(bytes, 1, n, f) == n;
    if (f) ok = fclose(f) == 0 && ok;
    free(bytes);
    return ok;
}

/* A fresh dump folder holding only a copy of src_dump's step-CKPT checkpoint. */
static bool seed_dump(const char *src_dump, const char *dump)
{
    char dir[700], from[800], to[800];
    remove_tree(dump);
    mkdir(dump, 0777);
    snprintf(dir, sizeof dir, "%s/checkpoint", dump);
    mkdir(dir, 0777);
    snprintf(dir, sizeof dir, "%s/checkpoint/step-%d", dump, CKPT);
    mkdir(dir, 0777);
    static const char *const files[] = {"model.safetensors", "manifest.json"};
    for (int k = 0; k < 2; k++) {
        snprintf(from, sizeof from, "%s/checkpoint/step-%d/%s", src_dump, CKPT, files[k]);
        snprintf(to, sizeof to, "%s/%s", dir, files[k]);
        if (!copy_file(from, to)) return false;
    }
    return true;
}

int main(void)
{
    char base[256], dump[400];
    if (!launch_begin(base, sizeof base, "gt_pp_moe_launch")) return 1;
    launch_cmd c;
    static launch_result ref, r;
    uint64_t ref_hash = 0, hash = 0;
    snprintf(dump, sizeof dump, "%s/one_rank", base);
    one_rank(&c, dump);
    if (!run(&c, dump, 1, &ref, &ref_hash)) {
        EXPECT(false, "the one-rank reference failed");
        return gt_test_finish();
    }
    static const char *const schedules[] = {"GPipe", "1F1B", "Interleaved1F1B", "ZBVZeroBubble",
                                            "DualPipeV"};
    for (int k = 0; k < 5; k++) {
        snprintf(dump, sizeof dump, "%s/pp2_%s", base, schedules[k]);
        pipeline(&c, schedules[k], dump);
        if (run(&c, dump, 1, &r, &hash))
            compare(dump + strlen(base) + 1, &ref, ref_hash, &r, hash, 1);
        else
            EXPECT(false, "%s failed", dump);
    }
    snprintf(dump, sizeof dump, "%s/pp2_1F1B_node_by_node", base);
    pipeline(&c, "1F1B", dump);
    launch_add(&c, "--compile.enable=false");
    if (run(&c, dump, 1, &r, &hash))
        compare("pp2_1F1B --compile.enable false", &ref, ref_hash, &r, hash, 1);
    else
        EXPECT(false, "%s failed", dump);

    /* the pp 2 checkpoint, resumed on one rank */
    char src[512];
    snprintf(src, sizeof src, "%s/pp2_1F1B", base);
    snprintf(dump, sizeof dump, "%s/resume_pp2_on_one_rank", base);
    EXPECT(seed_dump(src, dump), "cannot copy %s's step-%d checkpoint", src, CKPT);
    one_rank(&c, dump);
    if (run(&c, dump, CKPT + 1, &r, &hash))
        compare("pp 2 -> one rank", &ref, ref_hash, &r, hash, CKPT + 1);
    else
        EXPECT(false, "%s failed", dump);
    if (gt_test_failed_ == 0) remove_tree(base);
    return gt_test_finish();
}
