/* train_graph.h — debugmodel's training step graph as the trainer compiles it
 * (gt_train_build_graph: parallelized by the layout the options give, then the pass pipeline), for
 * the tests that look at compiled graphs (tests/unit/test_reduce_scatter_narrow.c,
 * test_fusion_norm_loss.c). Header-only and private to the tests; the check counts in the including
 * test (gt_test.h). */
#ifndef GT_TRAIN_GRAPH_H
#define GT_TRAIN_GRAPH_H

#include "graphtrain/gt_config.h"
#include "graphtrain/gt_llama3.h"
#include "graphtrain/gt_train.h"
#include "gt_test.h"

/* debugmodel (local batch 2, seq 32) under the defaults and args (command-line spelling, at most
 * 10); NULL, after a failed check, on error. */
static inline gt_graph *train_graph_debugmodel(const char *const *args, int n_args)
{
    gt_error err = {0};
    gt_config cfg;
    gt_config_defaults(&cfg);
    char *argv[16] = {"--model.flavor",     "debugmodel", "--training.local_batch_size", "2",
                      "--training.seq_len", "32"};
    int argc = 6;
    for (int k = 0; k < n_args && argc < 16; k++)
        argv[argc++] = (char *)args[k];
    gt_graph *g = gt_graph_new();
    gt_model model = {0};
    gt_status st = gt_config_apply_overrides(&cfg, argc, argv, &err);
    if (st == GT_OK) st = gt_train_build_graph(&cfg, g, &model, 1, &err);
    EXPECT(st == GT_OK, "debugmodel step graph (%s ...): %s", n_args ? args[0] : "defaults",
           err.msg);
    gt_model_free(&model);
    gt_config_free(&cfg);
    if (st == GT_OK) return g;
    gt_graph_free(g);
    return NULL;
}

#endif
