/* test_model_toy.c — a second model family through the model interface: the test-only toy_mlp
 * (src/models/toy_mlp.c) is found by name, its graph carries the units and plans its builder sets,
 * and it trains through the ordinary trainer: the loss falls, and the compiled step (whose memory
 * policy and passes read those units) gives the eager executor's bits. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graphtrain/gt_config.h"
#include "graphtrain/gt_model.h"
#include "graphtrain/gt_train.h"
#include "gt_test.h"

static void test_registry(void)
{
    const gt_model_family *f = NULL;
    gt_error err = {0};
    EXPECT_OK(gt_model_family_find("toy_mlp", &f, &err), &err);
    EXPECT(f && !strcmp(f->name, "toy_mlp"), "found toy_mlp");
    gt_error e2 = {0};
    EXPECT(gt_model_family_find("gpt2", &f, &e2) == GT_ERR_INVALID &&
               strstr(e2.msg, "model.name") && strstr(e2.msg, "toy_mlp"),
           "unknown family named with the known ones: %s", e2.msg);
    gt_model_config mc;
    gt_error e3 = {0};
    EXPECT(gt_model_config_init("toy_mlp", "huge", GT_F32, &mc, &e3) == GT_ERR_INVALID &&
               strstr(e3.msg, "model.flavor") && strstr(e3.msg, "huge"),
           "unknown flavor named: %s", e3.msg);
}

/* Every node of block i has unit i; the embedding's nodes GT_UNIT_EMBED; the rest
 * GT_UNIT_REST; the parameters carry their plans. */
static void test_units(void)
{
    gt_model_config mc;
    gt_error err = {0};
    EXPECT_OK(gt_model_config_init("toy_mlp", "tiny", GT_F32, &mc, &err), &err);
    gt_graph *g = gt_graph_new();
    gt_model m;
    EXPECT_OK(gt_model_build(g, &mc, &m, &err), &err);
    int bad = 0;
    for (gt_node_id n = 0; n < g->n_nodes; n++) {
        const char *fqn = gt_graph_str(g, g->nodes[n].fqn);
        int32_t want = GT_UNIT_REST;
        if (!strcmp(fqn, "embed")) want = GT_UNIT_EMBED;
        if (!strncmp(fqn, "blocks.", 7)) want = atoi(fqn + 7);
        bad += g->nodes[n].unit != want;
    }
    EXPECT(bad == 0, "%d nodes with another unit than their block's", bad);
    gt_param_plan w1 = gt_graph_input_plan(g, g->inputs[4].value); /* blocks.0.w1.weight */
    EXPECT(!strcmp(gt_graph_str(g, g->inputs[4].fqn), "blocks.0.w1.weight") &&
               w1.tp == GT_TP_COLWISE && w1.unit == 0 && w1.as_param,
           "w1's plan");
    EXPECT(gt_model_param_count(&m) == 2 * 256 * 32 + 2 * (32 + 2 * 64 * 32) + 32,
           "parameter count %lld", (long long)gt_model_param_count(&m));
    gt_model_free(&m);
    gt_graph_free(g);
}

static void run(const char *dump, bool compile, gt_train_result *r)
{
    static const char *const options[][2] = {
        {"model.name", "toy_mlp"},
        {"model.flavor", "tiny"},
        {"training.dataset", "synthetic"},
        {"training.seq_len", "32"},
        {"training.local_batch_size", "4"},
        {"training.steps", "30"},
        {"training.mixed_precision_param", "float32"},
        {"compile.memory_policy", "full"},
        {"job.print_config", "false"},
        {"metrics.log_freq", "10"},
        {"optimizer.lr", "1e-2"},
    };
    gt_config cfg;
    gt_config_defaults(&cfg);
    gt_error err = {0};
    for (size_t k = 0; k < sizeof options / sizeof options[0]; k++)
        EXPECT_OK(gt_config_set(&cfg, options[k][0], options[k][1], &err), &err);
    EXPECT_OK(gt_config_set(&cfg, "job.dump_folder", dump, &err), &err);
    EXPECT_OK(gt_config_set(&cfg, "compile.enable", compile ? "true" : "false", &err), &err);
    EXPECT_OK(gt_train(&cfg, r, &err), &err);
    gt_config_free(&cfg);
}

static void test_trains(void)
{
    char root[] = "/tmp/gt_toy_XXXXXX";
    EXPECT(mkdtemp(root) != NULL, "mkdtemp");
    char a[128], b[128];
    snprintf(a, sizeof a, "%s/compiled", root);
    snprintf(b, sizeof b, "%s/eager", root);
    gt_train_result rc = {0}, re = {0};
    run(a, true, &rc);
    run(b, false, &re);
    /* a uniform guess over 256 tokens costs ln 256 = 5.55 nats */
    EXPECT(rc.final_loss < 5.0, "the loss fell: %.4f after 30 steps", rc.final_loss);
    EXPECT(rc.params_hash == re.params_hash && rc.final_loss == re.final_loss,
           "compiled (full recompute) %016llx, eager %016llx", (unsigned long long)rc.params_hash,
           (unsigned long long)re.params_hash);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    EXPECT(system(cmd) == 0, "cleanup");
}

int main(void)
{
    test_registry();
    test_units();
    test_trains();
    return gt_test_finish();
}
