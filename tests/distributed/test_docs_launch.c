/* test_docs_launch.c — block-causal training on packed documents (issue 43): made-up prose in
 * paragraphs (a JSON-lines file, one document a line, tokenized with BOS / EOS by the fixture
 * tokenizer: documents of a few to a few hundred tokens, packed across the 32-token sequences),
 * debugmodel in fp32, 10 steps of 4 sequences, model.attn_mask_type = block_causal (the default):
 *   - one rank twice: bitwise the same losses and checkpoint (run to run);
 *   - FSDP2 (2 ranks), TP2 (2 ranks) and FSDP2 x TP2 (4 ranks, oversubscribed) train what one rank
 *     trains: losses within 1e-6 relative, step-10 parameters within 1e-5 (as
 *     test_layouts_launch.c; tensor parallelism keeps the positions whole on every rank);
 *   - model.attn_mask_type = causal on the same data trains something else (the mask is used);
 *   - on the synthetic corpus (one document per sequence) block_causal trains bitwise what causal
 *     trains: the same losses and checkpoint bytes.
 */
#include "launch.h" /* first: train_child.h defines _GNU_SOURCE */

#define RUN_SECONDS 240.0
#define LOSS_TOLERANCE 1e-6
#define PARAM_TOLERANCE 1e-5
#define TEXT_BYTES 24000

/* TEXT_BYTES of made-up prose as JSON lines, one paragraph a document: words drawn from a fixed
 * list by a fixed generator (xorshift), paragraphs of 3 to 400 words — documents of a few to a
 * few hundred tokens, with no file outside the repository needed. */
static bool write_documents(const char *path)
{
    static const char *const words[] = {
        "the",  "king",  "and",   "queen", "of",    "a",     "noble", "house", "speak",
        "now",  "my",    "lord",  "shall", "we",    "go",    "unto",  "thee",  "thou",
        "art",  "sweet", "night", "day",   "crown", "sword", "love",  "hate",  "death",
        "life", "o",     "what",  "is",    "this",  "that",  "here",  "there", "come"};
    const int n_words = (int)(sizeof words / sizeof words[0]);
    FILE *f = fopen(path, "w");
    if (!f) return false;
    uint64_t x = 0x9e3779b97f4a7c15ull;
    long bytes = 0;
    int docs = 0;
    while (bytes < TEXT_BYTES) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        int n = 3 + (int)(x % 398);
        bytes += fprintf(f, "{\"text\": \"");
        for (int w = 0; w < n; w++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            bytes += fprintf(f, "%s%s", w ? (x % 11 == 0 ? ",\\n" : " ") : "",
                             words[x % (uint64_t)n_words]);
        }
        bytes += fprintf(f, ".\"}\n");
        docs++;
    }
    fclose(f);
    printf("%d documents in %s\n", docs, path);
    return docs > 10;
}

/* data NULL: the synthetic corpus (launch_common's) */
static void run(const char *base, const char *name, const char *data, const launch_layout *l,
                const char *extra, launch_result *r)
{
    launch_cmd c;
    char out_path[600];
    launch_temp_dir(r->dump, sizeof r->dump, base, name);
    snprintf(out_path, sizeof out_path, "%s/output.txt", r->dump);
    launch_layout_run(&c, l, "debugmodel", r->dump, LAUNCH_STEPS);
    if (data) {
        launch_add(&c, "--training.dataset=jsonl");
        launch_add(&c, "--training.dataset_path=%s", data);
        launch_add(&c, "--training.tokenizer_path=%s",
                   gt_test_path("tests/fixtures/tokenizer/tokenizer.json"));
    }
    if (extra) launch_add(&c, "%s", extra);
    double dt = 0;
    int rc = launch_run(&c, out_path, RUN_SECONDS, &dt);
    r->ok = rc == 0 && last_records(r->dump, LAUNCH_STEPS, r->steps, NULL);
    printf("%-24s %d rank(s): exit %d, %.1f s\n", name, l ? launch_ranks(l) : 1, rc, dt);
    EXPECT(r->ok, "%s: exit %d or missing metrics", name, rc);
    if (!r->ok) launch_show_tail(out_path);
}

static void compare(const launch_result *ref, const launch_result *r, const char *what)
{
    if (!ref->ok || !r->ok) return;
    double dl = launch_loss_diff(ref->steps, r->steps, 1, LAUNCH_STEPS);
    EXPECT(dl <= LOSS_TOLERANCE, "%s: losses differ from one rank's by %.3g relative", what, dl);
    char a[700], b[700];
    launch_ckpt_path(a, sizeof a, ref->dump, LAUNCH_STEPS);
    launch_ckpt_path(b, sizeof b, r->dump, LAUNCH_STEPS);
    int missing = 0;
    double dp = launch_params_diff(a, b, &missing);
    EXPECT(dp >= 0 && dp <= PARAM_TOLERANCE && missing == 0,
           "%s: final parameters differ by %.3g (%d missing)", what, dp, missing);
    printf("  %-22s loss diff %.2e, param diff %.2e\n", what, dl, dp);
}

int main(void)
{
    char base[256], data[400];
    if (!launch_begin(base, sizeof base, "gt_docs_launch")) return 1;
    snprintf(data, sizeof data, "%s/docs.jsonl", base);
    EXPECT(write_documents(data), "documents written to %s", data);
    if (gt_test_failed_) return gt_test_finish();

    static const launch_layout layouts[] = {
        {"FSDP2", 1, 2, 1}, {"TP2", 1, 1, 2}, {"FSDP2xTP2", 1, 2, 2}};
    static launch_result ref, again, r, causal;
    run(base, "1rank", data, NULL, NULL, &ref);
    run(base, "1rank_again", data, NULL, NULL, &again);
    if (ref.ok && again.ok) {
        bool same = false;
        int differ = launch_bitwise_diff(&ref, &again, LAUNCH_STEPS, &same);
        EXPECT(differ == 0 && same, "rerun: %d steps differ, checkpoints %s", differ,
               same ? "equal" : "differ");
    }
    for (int k = 0; k < 3; k++) {
        run(base, layouts[k].name, data, &layouts[k], NULL, &r);
        compare(&ref, &r, layouts[k].name);
    }
    run(base, "1rank_causal", data, NULL, "--model.attn_mask_type=causal", &causal);
    if (ref.ok && causal.ok) {
        double dl = launch_loss_diff(ref.steps, causal.steps, 1, LAUNCH_STEPS);
        printf("  causal vs block_causal: loss diff %.2e\n", dl);
        EXPECT(dl > 1e-4, "causal and block_causal train the same losses (%.3g)", dl);
    }
    static launch_result syn_block, syn_causal;
    run(base, "synthetic_block_causal", NULL, NULL, NULL, &syn_block);
    run(base, "synthetic_causal", NULL, NULL, "--model.attn_mask_type=causal", &syn_causal);
    if (syn_block.ok && syn_causal.ok) {
        bool same = false;
        int differ = launch_bitwise_diff(&syn_block, &syn_causal, LAUNCH_STEPS, &same);
        EXPECT(differ == 0 && same,
               "synthetic: block_causal vs causal: %d steps differ, checkpoints %s", differ,
               same ? "equal" : "differ");
    }
    launch_end(base);
    return gt_test_finish();
}
