/* test_hf_load_launch.c — Hugging Face weights under any layout (issue 41, item 1): each rank
 * reads only its block of every tensor, and the last checkpoint gathered into an HF folder is the
 * same whatever the layout.
 *
 * One rank trains test_tiny for 10 steps and writes its last checkpoint as an HF folder
 * (checkpoint.last_save_in_hf). Then FSDP2 (mpiexec -np 2) and FSDP2xTP2 (-np 4) start from that
 * folder with lr 0 and weight decay 0, so the one step they run leaves the parameters as loaded:
 * their final parameter hash must be the one-rank run's, and the HF folders they save (gathered
 * from the ranks' blocks) must be byte for byte the one it loaded. So must pipeline parallel 2
 * (1F1B, 4 micro-batches), whose ranks read only their stages' tensors: the "pipeline setup" line
 * shows each rank's state during setup below 0.75 of the one rank's (16 bytes a parameter). */
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

/* Each of the 2 ranks' "pipeline setup" bytes below 0.75 of the whole state, 16 bytes for each
 * of the model's parameters (its "model llama3 test_tiny: N parameters" line). */
static void check_stage_local(const char *out_path)
{
    char *out = read_all(out_path, NULL);
    const char *m = out ? strstr(out, "model llama3 test_tiny: ") : NULL;
    long long n = m ? strtoll(m + strlen("model llama3 test_tiny: "), NULL, 10) : 0;
    const char *p = out ? strstr(out, "pipeline setup: ") : NULL;
    EXPECT(n > 0 && p, "PP2: no model line or no \"pipeline setup\" line");
    for (int r = 0; r < 2 && n > 0 && p; r++) {
        char key[32];
        snprintf(key, sizeof key, "rank %d ", r);
        p = strstr(p, key);
        EXPECT(p != NULL, "PP2: the pipeline setup line lacks rank %d", r);
        if (!p) break;
        long long b = strtoll(p + strlen(key), NULL, 10);
        EXPECT(b > 0 && b < 0.75 * 16.0 * (double)n,
               "PP2: rank %d set up %lld B of state from the HF folder; the whole is %lld B", r, b,
               16 * n);
    }
    free(out);
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
        const launch_layout *l = layouts[k];
        char d[512], a[800], b[800];
        launch_temp_dir(d, sizeof d, base, l->name);
        launch_layout_run(&c, l, "test_tiny", d, 1);
        launch_add(&c, "--training.steps=1");
        launch_add(&c, "--optimizer.lr=0");
        launch_add(&c, "--optimizer.weight_decay=0");
        launch_add(&c, "--checkpoint.initial_load_path=%s", hf);
        launch_add(&c, "--checkpoint.initial_load_in_hf=true");
        launch_add(&c, "--checkpoint.last_save_in_hf=true");
        uint64_t h = 0;
        int rc = run(&c, d, l->name, &h);
        EXPECT(rc == 0, "%s: exit %d", l->name, rc);
        EXPECT(h == one, "%s: the loaded parameters hash %016llx, one rank's %016llx", l->name,
               (unsigned long long)h, (unsigned long long)one);
        snprintf(a, sizeof a, "%s/model.safetensors", hf);
        snprintf(b, sizeof b, "%s/checkpoint/step-1-hf/model.safetensors", d);
        EXPECT(same_bytes(a, b), "%s: its HF folder's weights are not the ones it loaded", l->name);
    }
    if (one) { /* pipeline parallel 2 from the same folder */
        char d[512], a[800], b[800], out_path[700];
        launch_temp_dir(d, sizeof d, base, "PP2");
        launch_layout_run_np(&c, NULL, 2, "test_tiny", d, 1);
        launch_add(&c, "--training.steps=1");
        launch_add(&c, "--training.local_batch_size=4");
        launch_add(&c, "--parallelism.pipeline_parallel_degree=2");
        launch_add(&c, "--parallelism.pipeline_parallel_schedule=1F1B");
        launch_add(&c, "--parallelism.pipeline_parallel_microbatch_size=1");
        launch_add(&c, "--optimizer.lr=0");
        launch_add(&c, "--optimizer.weight_decay=0");
        launch_add(&c, "--checkpoint.initial_load_path=%s", hf);
        launch_add(&c, "--checkpoint.initial_load_in_hf=true");
        launch_add(&c, "--checkpoint.last_save_in_hf=true");
        uint64_t h = 0;
        int rc = run(&c, d, "PP2", &h);
        EXPECT(rc == 0, "PP2: exit %d", rc);
        EXPECT(h == one, "PP2: the loaded parameters hash %016llx, one rank's %016llx",
               (unsigned long long)h, (unsigned long long)one);
        snprintf(a, sizeof a, "%s/model.safetensors", hf);
        snprintf(b, sizeof b, "%s/checkpoint/step-1-hf/model.safetensors", d);
        EXPECT(same_bytes(a, b), "PP2: its HF folder's weights are not the ones it loaded");
        snprintf(out_path, sizeof out_path, "%s/output.txt", d);
        check_stage_local(out_path);
    }
    if (!gt_test_failed_) remove_tree(base);
    return gt_test_finish();
}
