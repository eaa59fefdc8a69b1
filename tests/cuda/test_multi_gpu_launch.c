/* test_multi_gpu_launch.c — training on several GPUs through NCCL (issue 7, acceptance), label
 * cuda. Skipped (exit 0, with the reason) on a machine with fewer than 2 GPUs.
 *
 * llama3 debugmodel, 20 steps of a global batch of 4 x 128 tokens on synthetic data, one process
 * per GPU under `mpiexec -np N`, against the same run on one GPU:
 *   - fp32 (training.mixed_precision_param = float32): per-step losses within 1e-5 relative of
 *     the one-GPU run, for FSDP2 and TP2 (2 GPUs) and FSDP4, FSDP2xTP2, HSDP 2x2 (4 GPUs);
 *   - each layout run twice: bitwise identical losses and step-20 checkpoint (whole parameters
 *     and AdamW moments gathered from the ranks);
 *   - CUDA graphs on vs off (compile.cudagraphs): bitwise identical, FSDP2;
 *   - resume (FSDP2, TP2 whose blocks are strided rows, and FSDP3 whose blocks are padded, 3
 *     GPUs): saving at steps 10 and 20 changes no bit, nor does saving step 10 asynchronously
 *     (checkpoint.async_mode = async_with_pinned_mem: the same step-10 file), and the step-10
 *     checkpoint resumed in a fresh folder (read in 1000-byte pieces) repeats steps 11..20 and
 *     the step-20 checkpoint bit for bit;
 *   - --metrics.comm_report (FSDP2): one line per collective of the logged schedule, exposed time
 *     within [0, total], and the same bits as without the report;
 *   - --comm.nccl_buffers: the default (auto) is logged as symmetric where this NCCL supports it
 *     (the ranks are on one host), else plain; plain (cudaMalloc), registrable (ncclMemAlloc
 *     arenas NCCL registers) and symmetric (symmetric windows, ncclAlltoAll exchanges, zero-CTA
 *     collectives on the copy engines), FSDP2: the same bits as the default;
 *   - --compile.fsdp_gathers grouped (per-tensor gathers, a block's posted as one NCCL group),
 *     FSDP2: the same bits as the bucketed gathers;
 *   - --compile.precompile_artifact_dir, FSDP2: the run that compiles on rank 0 and saves the
 *     step, and the run that loads it, give the bits of the compiled run;
 *   - bf16 mixed precision (the default): FSDP2's loss curve within 1 % of the one-GPU bf16 run;
 *   - gradient accumulation (fp32, global batch 8): 2 micro-batches on one GPU and over FSDP2
 *     within 1e-5 relative of one batch of 8; CUDA graphs on vs off bitwise.
 * Every rank's program allocates what it planned (the memory lines of the log). */
#include "distributed/launch.h" /* first: train_child.h defines _GNU_SOURCE */
#include "graphtrain/gt_comm.h"
#include "graphtrain/gt_cuda.h"

#define STEPS 20
#define GLOBAL_BATCH 4
#define RUN_SECONDS 300.0

_Static_assert(STEPS <= LAUNCH_MAX_STEPS, "launch_result holds the records of every step");

/* Records of steps first..STEPS in r->steps: false when one is missing. */
static bool records_from(const char *dump, int first, launch_result *r)
{
    gt_metrics_log log = {0};
    if (!read_metrics(dump, &log)) return false;
    for (int s = 1; s <= STEPS; s++)
        r->steps[s].step = 0;
    for (int64_t k = 0; k < log.n_steps; k++)
        if (log.steps[k].step >= first && log.steps[k].step <= STEPS)
            r->steps[log.steps[k].step] = log.steps[k];
    gt_metrics_log_free(&log);
    for (int s = first; s <= STEPS; s++)
        if (r->steps[s].step != s) return false;
    return true;
}

/* Runs the 20 steps (from step first: a checkpoint in r->dump is resumed) into r->dump, which
 * exists. */
static void run_in_dump(const char *name, const launch_layout *l, bool fp32, const char *extra,
                        int first, launch_result *r)
{
    launch_cmd c;
    char out_path[600];
    snprintf(out_path, sizeof out_path, "%s/output.txt", r->dump);
    launch_train(&c, l ? launch_ranks(l) : 0);
    launch_add(&c, "--model.flavor=debugmodel");
    launch_add(&c, "--training.device=cuda");
    launch_add(&c, "--training.dataset=synthetic");
    launch_add(&c, "--training.seq_len=128");
    launch_add(&c, "--training.steps=%d", STEPS);
    if (fp32) launch_add(&c, "--training.mixed_precision_param=float32");
    launch_add(&c, "--metrics.log_freq=1");
    launch_add(&c, "--checkpoint.enable=true");
    launch_add(&c, "--checkpoint.interval=%d", STEPS);
    launch_add(&c, "--checkpoint.keep_latest_k=0");
    launch_add(&c, "--job.print_config=false");
    launch_add(&c, "--job.dump_folder=%s", r->dump);
    int dp = l ? l->rep * l->shard : 1;
    launch_add(&c, "--training.local_batch_size=%d", GLOBAL_BATCH / dp);
    if (l) {
        launch_add(&c, "--parallelism.data_parallel_replicate_degree=%d", l->rep);
        launch_add(&c, "--parallelism.data_parallel_shard_degree=%d", l->shard);
        launch_add(&c, "--parallelism.tensor_parallel_degree=%d", l->tp);
    }
    /* extra: options separated by spaces */
    for (const char *e = extra; e && *e;) {
        size_t n = strcspn(e, " ");
        if (n) launch_add(&c, "%.*s", (int)n, e);
        e += n + (e[n] == ' ');
    }
    double dt = 0;
    int rc = launch_run(&c, out_path, RUN_SECONDS, &dt);
    r->ok = rc == 0 && records_from(r->dump, first, r);
    printf("%-24s %d GPU(s): exit %d, %.1f s\n", name, l ? launch_ranks(l) : 1, rc, dt);
    EXPECT(r->ok, "%s: exit %d or missing metrics", name, rc);
    if (!r->ok) launch_show_tail(out_path);
    if (r->ok && l) { /* planned == allocated on every rank */
        char *text = read_all(out_path, NULL);
        int bad = 0, lines = 0;
        for (const char *p = text; p && (p = strstr(p, "INFO memory ")); p++) {
            long long planned = -1, allocated = -2;
            const char *pl = strstr(p, "planned "), *al = strstr(p, "allocated ");
            if (pl) sscanf(pl, "planned %lld", &planned);
            if (al) sscanf(al, "allocated %lld", &allocated);
            bad += planned != allocated || planned <= 0;
            lines++;
        }
        EXPECT(lines > 0 && bad == 0, "%s: %d memory lines, %d with planned != allocated", name,
               lines, bad);
        free(text);
    }
}

static void run(const char *base, const char *name, const launch_layout *l, bool fp32,
                const char *extra, launch_result *r)
{
    launch_temp_dir(r->dump, sizeof r->dump, base, name);
    run_in_dump(name, l, fp32, extra, 1, r);
}

static void compare_losses(const launch_result *ref, const launch_result *r, double tol,
                           const char *what)
{
    if (!ref->ok || !r->ok) return;
    double d = launch_loss_diff(ref->steps, r->steps, 1, STEPS);
    printf("  %-30s loss diff %.2e (bound %.0e)\n", what, d, tol);
    EXPECT(d <= tol, "%s: losses differ from one GPU's by %.3g relative", what, d);
}

/* The comm report of a run's output: as many lines as the logged schedule, exposed <= total. */
static void check_comm_report(const launch_result *r)
{
    if (!r->ok) return;
    char path[600];
    snprintf(path, sizeof path, "%s/output.txt", r->dump);
    char *text = read_all(path, NULL);
    launch_comm_report rep;
    launch_read_comm_report(text, &rep);
    int bad = 0;
    double exposed_sum = 0;
    for (int k = 0; k < rep.n_rows; k++) {
        const launch_report_row *row = &rep.rows[k];
        bad += !(row->exposed >= 0 && row->exposed <= row->total + 1e-3 && row->total > 0 &&
                 row->bytes > 0);
        exposed_sum += row->exposed;
    }
    printf("  FSDP2 comm report: %d of %d collectives, %d bad, %.3f ms exposed\n", rep.n_rows,
           rep.scheduled, bad, exposed_sum);
    EXPECT(rep.scheduled > 0 && rep.listed == rep.scheduled && rep.n_rows == rep.scheduled &&
               bad == 0,
           "comm report: schedule %d, header %d, %d lines, %d bad", rep.scheduled, rep.listed,
           rep.n_rows, bad);
    launch_comm_report_free(&rep);
    free(text);
}

/* The default --comm.nccl_buffers (auto) of a run of ranks on this one host: symmetric where this
 * NCCL has symmetric buffers, else plain, as rank 0's log line says. */
static void check_auto_buffers(const launch_result *r)
{
    if (!r->ok) return;
    gt_error why = {0};
    bool symmetric = gt_comm_nccl_check_buffers(GT_NCCL_BUFFERS_SYMMETRIC, &why) == GT_OK;
    const char *want = symmetric ? "NCCL buffers: symmetric (auto" : "NCCL buffers: plain (auto";
    char path[600];
    snprintf(path, sizeof path, "%s/output.txt", r->dump);
    char *text = read_all(path, NULL);
    bool found = text && strstr(text, want);
    printf("  FSDP2 default NCCL buffers: '%s...' logged: %s\n", want, found ? "yes" : "NO");
    EXPECT(found, "FSDP2: no '%s' line in %s", want, path);
    free(text);
}

static void compare_bitwise(const launch_result *a, const launch_result *b, const char *what)
{
    if (!a->ok || !b->ok) return;
    bool same = false;
    int differ = launch_bitwise_diff(a, b, STEPS, &same);
    EXPECT(differ == 0, "%s: %d steps with other loss or grad_norm bits", what, differ);
    EXPECT(same, "%s: step-%d checkpoints differ", what, STEPS);
    printf("  %-30s bitwise: %s\n", what, differ == 0 && same ? "yes" : "NO");
}

/* Bitwise resume on the GPU: a run saving at steps 10 and 20 has the uninterrupted run's bits;
 * its step-10 checkpoint, alone in a fresh dump folder, resumes to steps 11..20 and a step-20
 * checkpoint with those bits too. The saves take the state straight from the device (shard_io.c,
 * write_blocks) and the resume puts it straight there (read_blocks), so a block written to or
 * read from the wrong place would show here; under FSDP3 the blocks are padded. */
static void check_resume(const char *base, const launch_layout *l, const launch_result *whole)
{
    static launch_result ck10, resumed;
    char name[64], what[96];
    snprintf(name, sizeof name, "%s_fp32_ckpt10", l->name);
    snprintf(what, sizeof what, "%s saving at steps 10 and 20", l->name);
    run(base, name, l, true, "--checkpoint.interval=10", &ck10);
    compare_bitwise(whole, &ck10, what);
    if (!ck10.ok) return;
    /* the step-10 save written from a pinned snapshot by a thread while steps 11.. run */
    static launch_result async_ck;
    snprintf(name, sizeof name, "%s_fp32_ckpt10_async", l->name);
    snprintf(what, sizeof what, "%s saving step 10 asynchronously", l->name);
    run(base, name, l, true,
        "--checkpoint.interval=10 --checkpoint.async_mode=async_with_pinned_mem", &async_ck);
    compare_bitwise(whole, &async_ck, what);
    char p10[700], a10[700];
    launch_ckpt_path(p10, sizeof p10, ck10.dump, 10);
    launch_ckpt_path(a10, sizeof a10, async_ck.dump, 10);
    EXPECT(!async_ck.ok || same_bytes(p10, a10), "%s: step-10 files differ", what);
    snprintf(name, sizeof name, "%s_fp32_resumed", l->name);
    launch_temp_dir(resumed.dump, sizeof resumed.dump, base, name);
    char from[700], dir[700], to[760];
    snprintf(from, sizeof from, "%s/checkpoint/step-10", ck10.dump);
    snprintf(dir, sizeof dir, "%s/checkpoint", resumed.dump);
    snprintf(to, sizeof to, "%s/step-10", dir);
    EXPECT(mkdir(dir, 0777) == 0 && rename(from, to) == 0, "moving %s to %s: %s", from, to,
           strerror(errno));
    /* read in 1000-byte pieces: many rounds through the pinned buffers, elements split across
     * pieces, and copies of back-to-back pieces merged (shard_io.c, read_to_device) */
    setenv("GT_CKPT_READ_PIECE_BYTES", "1000", 1);
    run_in_dump(name, l, true, NULL, 11, &resumed);
    unsetenv("GT_CKPT_READ_PIECE_BYTES");
    if (!resumed.ok) return;
    int differ = 0;
    for (int s = 11; s <= STEPS; s++)
        differ += whole->steps[s].loss != resumed.steps[s].loss ||
                  whole->steps[s].grad_norm != resumed.steps[s].grad_norm;
    char pa[700], pb[700];
    launch_ckpt_path(pa, sizeof pa, whole->dump, STEPS);
    launch_ckpt_path(pb, sizeof pb, resumed.dump, STEPS);
    bool same = same_bytes(pa, pb);
    snprintf(what, sizeof what, "%s resumed at step 10", l->name);
    printf("  %-30s bitwise: %s\n", what, differ == 0 && same ? "yes" : "NO");
    EXPECT(differ == 0, "%s: %d of steps 11..%d with other bits", what, differ, STEPS);
    EXPECT(same, "%s: step-%d checkpoints differ", what, STEPS);
}

int main(void)
{
    int gpus = gt_cuda_device_count();
    if (gpus < 2) {
        printf("skipped: %d GPU(s) visible, this test needs 2 or more\n", gpus);
        return 0;
    }
    char base[256];
    if (!launch_begin(base, sizeof base, "gt_multi_gpu_launch")) return 1;

    static const launch_layout layouts[] = {
        {"FSDP2", 1, 2, 1},     {"TP2", 1, 1, 2},     {"FSDP4", 1, 4, 1},
        {"FSDP2xTP2", 1, 2, 2}, {"HSDP2x2", 2, 2, 1},
    };
    static launch_result ref, ref_bf16, r, again, nograph, bf16, report, grouped, saved, loaded,
        plain, registrable, symmetric;
    run(base, "1gpu_fp32", NULL, true, NULL, &ref);
    for (size_t k = 0; k < sizeof layouts / sizeof layouts[0]; k++) {
        const launch_layout *l = &layouts[k];
        if (launch_ranks(l) > gpus) {
            printf("  %s: needs %d GPUs, %d visible: not run\n", l->name, launch_ranks(l), gpus);
            continue;
        }
        char name[64], what[96];
        snprintf(name, sizeof name, "%s_fp32", l->name);
        run(base, name, l, true, NULL, &r);
        snprintf(what, sizeof what, "%s fp32 vs 1 GPU", l->name);
        compare_losses(&ref, &r, 1e-5, what);
        snprintf(name, sizeof name, "%s_fp32_again", l->name);
        run(base, name, l, true, NULL, &again);
        snprintf(what, sizeof what, "%s rerun", l->name);
        compare_bitwise(&r, &again, what);
        if (k == 1) check_resume(base, l, &r); /* TP2: blocks of rows (S(1)), row by row */
        if (k == 0) {
            check_resume(base, l, &r);
            run(base, "FSDP2_fp32_nograph", l, true, "--compile.cudagraphs=false", &nograph);
            compare_bitwise(&r, &nograph, "FSDP2 CUDA graphs on vs off");
            run(base, "FSDP2_fp32_report", l, true, "--metrics.comm_report=true", &report);
            compare_bitwise(&r, &report, "FSDP2 comm report on vs off");
            check_comm_report(&report);
            check_auto_buffers(&r);
            run(base, "FSDP2_fp32_grouped", l, true, "--compile.fsdp_gathers=grouped", &grouped);
            compare_bitwise(&r, &grouped, "FSDP2 grouped gathers vs bucketed");
            /* compile on one rank: rank 0 compiles and saves, rank 1 loads; then both load */
            char art[400];
            snprintf(art, sizeof art, "--compile.precompile_artifact_dir=%s/artifact", base);
            run(base, "FSDP2_fp32_artifact_save", l, true, art, &saved);
            compare_bitwise(&r, &saved, "FSDP2 artifact saved vs compiled");
            run(base, "FSDP2_fp32_artifact_load", l, true, art, &loaded);
            compare_bitwise(&r, &loaded, "FSDP2 artifact loaded vs compiled");
            run(base, "FSDP2_fp32_plain", l, true, "--comm.nccl_buffers=plain", &plain);
            compare_bitwise(&r, &plain, "FSDP2 plain NCCL buffers vs auto");
            run(base, "FSDP2_fp32_registrable", l, true, "--comm.nccl_buffers=registrable",
                &registrable);
            compare_bitwise(&r, &registrable, "FSDP2 registrable NCCL buffers vs auto");
            gt_error why = {0};
            if (gt_comm_nccl_check_buffers(GT_NCCL_BUFFERS_SYMMETRIC, &why) == GT_OK) {
                run(base, "FSDP2_fp32_symmetric", l, true, "--comm.nccl_buffers=symmetric",
                    &symmetric);
                compare_bitwise(&r, &symmetric, "FSDP2 symmetric NCCL buffers vs auto");
            } else {
                printf("  FSDP2 symmetric NCCL buffers: not run: %s\n", why.msg);
            }
        }
    }
    /* FSDP3 pads debugmodel's 256-row parameters to 258 (local batch 1, global 3): its own
     * uninterrupted run against saving and resuming, all on the GPU */
    static const launch_layout fsdp3 = {"FSDP3", 1, 3, 1};
    static launch_result padded;
    if (gpus >= 3) {
        run(base, "FSDP3_fp32", &fsdp3, true, NULL, &padded);
        if (padded.ok) check_resume(base, &fsdp3, &padded);
    } else {
        printf("  FSDP3: needs 3 GPUs, %d visible: not run\n", gpus);
    }
    /* gradient accumulation: 2 micro-batches of the global batch of 8 on one GPU and over FSDP2
     * against one batch of 8 (the same steps up to summation order), and CUDA graphs (one per
     * part: the micro-batch part, the whole step) on vs off bitwise */
    static launch_result big, accum, accum_nograph, accum_fsdp2;
    run(base, "1gpu_fp32_batch8", NULL, true, "--training.local_batch_size=8", &big);
    run(base, "1gpu_fp32_accum", NULL, true, "--training.global_batch_size=8", &accum);
    compare_losses(&big, &accum, 1e-5, "1 GPU accumulation 2 x 4 vs 8");
    run(base, "1gpu_fp32_accum_nograph", NULL, true,
        "--training.global_batch_size=8 --compile.cudagraphs=false", &accum_nograph);
    compare_bitwise(&accum, &accum_nograph, "accumulation CUDA graphs on vs off");
    run(base, "FSDP2_fp32_accum", &layouts[0], true, "--training.global_batch_size=8",
        &accum_fsdp2);
    compare_losses(&big, &accum_fsdp2, 1e-5, "FSDP2 accumulation 2 x (2 x 2) vs 8");
    run(base, "1gpu_bf16", NULL, false, NULL, &ref_bf16);
    run(base, "FSDP2_bf16", &layouts[0], false, NULL, &bf16);
    compare_losses(&ref_bf16, &bf16, 1e-2, "FSDP2 bf16 vs 1 GPU bf16");
    launch_end(base);
    return gt_test_finish();
}
