/* test_narrow_launch.c — reduce_scatter_narrow and fusion are exact in whole multi-rank
 * training runs.
 *
 * The runs of launch.h (test_tiny, synthetic data, 10 steps, a checkpoint at step 10) but with
 * bf16 mixed precision, so that every gradient is produced in bf16 and widened before its
 * reduce-scatter: `mpiexec -np N graphtrain train` with the pass (the default pipeline) and with
 * --compile.disable_passes=reduce_scatter_narrow, on FSDP2 (2 ranks; with fsdp_bucketing and,
 * per tensor, without it), FSDP3 (3 ranks: test_tiny's 256 and 64 rows pad to 258 and 66, so
 * zero padding sits in the gradients' trees), HSDP 2x2 (4 ranks: the reduce-scatter over dp_shard,
 * then the all-reduce over dp_replicate) and FSDP2xTP2 (4 ranks: tensor parallel's own bf16
 * reduce-scatters stay as they are). And the fusion pass the same way (disabled:
 * --compile.disable_passes=fusion) on FSDP2 and HSDP 2x2, whose all-gather waits sit between the
 * residual adds and the norms, the norm backwards and their adds, and the loss and its backward
 * that it fuses, and on FSDP2xTP2. For each pair:
 *   - the pass ran and removed nodes in the run with it (rank 0's "pass NAME ... nodes A -> B"
 *     line, B < A) and did not run in the other;
 *   - every step's loss and grad norm are the same bits, and the step-10 checkpoints (parameters
 *     and AdamW moments) are the same bytes. */
#include "launch.h" /* first: train_child.h defines _GNU_SOURCE */

#define RUN_SECONDS 240.0

/* Runs layout l with bf16 mixed precision and `disable` (NULL: none) into base/name. *nodes: the
 * node counts rank 0 logged for `pass` ({-1, -1} when it did not run). */
static void run(const char *base, const char *name, const launch_layout *l, const char *disable,
                const char *pass, launch_result *r, int nodes[2])
{
    launch_cmd c;
    char out_path[600];
    launch_temp_dir(r->dump, sizeof r->dump, base, name);
    snprintf(out_path, sizeof out_path, "%s/output.txt", r->dump);
    launch_layout_run(&c, l, "test_tiny", r->dump, LAUNCH_STEPS);
    launch_add(&c, "--training.mixed_precision_param=bfloat16");
    if (disable) launch_add(&c, "--compile.disable_passes=%s", disable);
    double dt = 0;
    int rc = launch_run(&c, out_path, RUN_SECONDS, &dt);
    r->ok = rc == 0 && last_records(r->dump, LAUNCH_STEPS, r->steps, NULL);
    printf("%-28s %d ranks: exit %d, %.1f s\n", name, launch_ranks(l), rc, dt);
    EXPECT(r->ok, "%s: exit %d or missing metrics", name, rc);
    nodes[0] = nodes[1] = -1;
    char *text = read_all(out_path, NULL);
    char key[64];
    snprintf(key, sizeof key, "pass %s ", pass);
    const char *p = text ? strstr(text, key) : NULL;
    if (p) p = strstr(p, "nodes ");
    if (p) sscanf(p, "nodes %d -> %d", &nodes[0], &nodes[1]);
    free(text);
    if (!r->ok) launch_show_tail(out_path);
}

static void compare(const char *base, const char *name, const launch_layout *l,
                    const char *also_disabled, const char *pass)
{
    static launch_result on, off;
    char n_on[96], n_off[96], disable_off[96];
    snprintf(n_on, sizeof n_on, "%s_%s", name, pass);
    snprintf(n_off, sizeof n_off, "%s_no_%s", name, pass);
    snprintf(disable_off, sizeof disable_off, "%s%s%s", also_disabled ? also_disabled : "",
             also_disabled ? "," : "", pass);
    int nodes_on[2], nodes_off[2];
    run(base, n_on, l, also_disabled, pass, &on, nodes_on);
    run(base, n_off, l, disable_off, pass, &off, nodes_off);
    EXPECT(nodes_on[0] > 0 && nodes_on[1] > 0 && nodes_on[1] < nodes_on[0],
           "%s: the pass ran and removed nodes (%d -> %d)", n_on, nodes_on[0], nodes_on[1]);
    EXPECT(nodes_off[0] == -1, "%s: the pass did not run when disabled", n_on);
    if (!on.ok || !off.ok) return;
    bool same = false;
    int differ = launch_bitwise_diff(&on, &off, LAUNCH_STEPS, &same);
    EXPECT(differ == 0, "%s: %d steps with other loss or grad_norm bits with the pass", n_on,
           differ);
    EXPECT(same, "%s: the step-%d checkpoints differ with the pass", n_on, LAUNCH_STEPS);
    printf("  %-32s pass nodes %d -> %d; losses, grad norms, checkpoint: %s\n", n_on, nodes_on[0],
           nodes_on[1], differ == 0 && same ? "bitwise equal" : "DIFFER");
}

int main(void)
{
    char base[256];
    if (!launch_begin(base, sizeof base, "gt_narrow_launch")) return 1;
    static const launch_layout fsdp2 = {"FSDP2", 1, 2, 1}, fsdp3 = {"FSDP3", 1, 3, 1},
                               hsdp = {"HSDP2x2", 2, 2, 1}, fsdp_tp = {"FSDP2xTP2", 1, 2, 2};
    compare(base, "FSDP2", &fsdp2, NULL, "reduce_scatter_narrow");
    compare(base, "FSDP2_per_tensor", &fsdp2, "fsdp_bucketing", "reduce_scatter_narrow");
    compare(base, "FSDP3_padded", &fsdp3, NULL, "reduce_scatter_narrow");
    compare(base, "HSDP2x2", &hsdp, NULL, "reduce_scatter_narrow");
    compare(base, "FSDP2xTP2", &fsdp_tp, NULL, "reduce_scatter_narrow");
    compare(base, "FSDP2", &fsdp2, NULL, "fusion");
    compare(base, "HSDP2x2", &hsdp, NULL, "fusion");
    compare(base, "FSDP2xTP2", &fsdp_tp, NULL, "fusion");
    launch_end(base);
    return gt_test_finish();
}
