/* test_hf_load_launch.c — Hugging Face weights under any layout (issue 41, item 1): each rank
 * reads only its block of every tensor, and the last checkpoint gathered into an HF folder is the
 * same whatever the layout.
 *
 * One rank trains test_tiny for 10 steps and writes its last checkpoint as an HF folder
 * (checkpoint.last_save_in_hf). Then FSDP2 (mpiexec -np 2) and FSDP2xTP2 (-np 4) start from that
 * folder with lr 0 and weight decay 0, so the one step they run leaves the parameters as loaded:
 * their final parameter hash must be the one-rank run's, and the HF folders they save (gathered
 * from the ranks' blocks) must be byte for byte the one it loaded. So must pipeline parallel 2
 * (1F1B, 4 micro-batches), whose ranks read only their stages' tensors: the "pipeline state" line
 * shows each rank holding less than 0.75 of the whole state after setup. */
#include "launch.h" /* first: train_child.h defines _GNU_SOURCE */

#define RUN_SECONDS 240.0

static const launch_layout fsdp2 = {"FSDP2", 1, 2, 1};
static const launch_layout fsdp2_tp2 = {"FSDP2xTP2", 1, 2, 2};

/* runs c into dump; *hash: the final parameter hash (0 when it failed) */
static int run(launch_cmd *c, const char *dump, const char *name, uint64_t *hash)
{
    char out_path[700];
    snprintf(out_path, sizeof out_path, "%s/output.txt", dump);
    double dt = 0;
    int rc = launch_run(c, out_path, RUN_SECONDS, &dt);
    char *out = read_all(out_path, NULL);
    long long first = 0, last = 0;
    if (rc != 0 || !out || !parse_summary(out, &first, &last, hash)) *hash = 0;
    printf("%-12s exit %d after %.1f s, params xxh64 %016llx\n", name, rc, dt,
           (unsigned long long)*hash);
    if (rc != 0) launch_show_tail(out_path);
    free(out);
    return rc;
}

/* c (a run of the layout in dump d) started from the HF folder with lr 0 for one step: its
 * parameters hash as the one rank's (`one`), and the HF folder it saves is the one it loaded. */
static void check_loaded(launch_cmd *c, const char *name, const char *d, const char *hf,
                         uint64_t one)
{
    char a[800], b[800];
    launch_add(c, "--training.steps=1");
    launch_add(c, "--optimizer.lr=0");
    launch_add(c, "--optimizer.weight_decay=0");
    launch_add(c, "--checkpoint.initial_load_path=%s", hf);
    launch_add(c, "--checkpoint.initial_load_in_hf=true");
    launch_add(c, "--checkpoint.last_save_in_hf=true");
    uint64_t h = 0;
    int rc = run(c, d, name, &h);
    EXPECT(rc == 0, "%s: exit %d", name, rc);
    EXPECT(h == one, "%s: the loaded parameters hash %016llx, one rank's %016llx", name,
           (unsigned long long)h, (unsigned long long)one);
    snprintf(a, sizeof a, "%s/model.safetensors", hf);
    snprintf(b, sizeof b, "%s/checkpoint/step-1-hf/model.safetensors", d);
    EXPECT(same_bytes(a, b), "%s: its HF folder's weights are not the ones it loaded", name);
}

int main(void)
{
    char base[256], dump[512], hf[700];
    if (!launch_begin(base, sizeof base, "gt_hf_load")) return 1;
    launch_cmd c;
    uint64_t one = 0;
    launch_temp_dir(dump, sizeof dump, base, "one_rank");
    launch_layout_run_np(&c, NULL, 0, "test_tiny", dump, LAUNCH_STEPS);
    launch_add(&c, "--checkpoint.last_save_in_hf=true");
    EXPECT(run(&c, dump, "one rank", &one) == 0, "the one-rank run failed");
    snprintf(hf, sizeof hf, "%s/checkpoint/step-%d-hf", dump, LAUNCH_STEPS);
    const launch_layout *layouts[] = {&fsdp2, &fsdp2_tp2};
    for (int k = 0; k < 2 && one; k++) {
        char d[512];
        launch_temp_dir(d, sizeof d, base, layouts[k]->name);
        launch_layout_run(&c, layouts[k], "test_tiny", d, 1);
        check_loaded(&c, layouts[k]->name, d, hf, one);
    }
    if (one) { /* pipeline parallel 2: each rank reads only its stages (the "pipeline state" line,
                * logged after a setup that frees nothing) */
        char d[512], out_path[700];
        launch_temp_dir(d, sizeof d, base, "PP2");
        launch_layout_run_np(&c, NULL, 2, "test_tiny", d, 1);
        launch_add(&c, "--training.local_batch_size=4");
        launch_add(&c, "--parallelism.pipeline_parallel_degree=2");
        launch_add(&c, "--parallelism.pipeline_parallel_schedule=1F1B");
        launch_add(&c, "--parallelism.pipeline_parallel_microbatch_size=1");
        check_loaded(&c, "PP2", d, hf, one);
        snprintf(out_path, sizeof out_path, "%s/output.txt", d);
        char *out = read_all(out_path, NULL);
        long long held[2] = {0, 0}, whole = -1;
        EXPECT(launch_pp_state(out, 2, held, &whole) && whole > 0,
               "PP2: no \"pipeline state\" line with both ranks and the whole");
        for (int r = 0; r < 2; r++)
            EXPECT(held[r] > 0 && (double)held[r] < 0.75 * (double)whole,
                   "PP2: rank %d holds %lld B of state after starting from the HF folder; the "
                   "whole is %lld B",
                   r, held[r], whole);
        free(out);
    }
    launch_end(base);
    return gt_test_finish();
}
