/* test_ep_overlap.c — the EP overlap schedule interleaves the two chunks (issue 38, structure).
 *
 * DeepSeek-V3 test_dsv3_tiny, dp_shard 2 x ep 2, rank 0's compiled step graph with the MoE chunked
 * (compile.ep_overlap: each MoE along the sequence; each MoE block or each MoE along the batch,
 * each rank's own cut in two). In the MoE block's forward, chunk 1's first token all-to-all
 * (expert parallelism's exchange of packed rows; its chunk told by its size: the sequence of 33,
 * or the rank's batch of 5, is cut at 16, or 2) must start before chunk 0's first one is waited
 * for — chunk 0's experts then
 * run while chunk 1's tokens move — and in the backward (chunks in reverse) chunk 0's first must
 * start before chunk 1's first is waited for. Without the pass (compile.disable_passes ep_overlap)
 * the chunks run one after the other and the property fails, so the check is not vacuous. The
 * training runs in tests/numerics/test_ep_chunk.c and tests/distributed show the pass exact. */
#include <stdlib.h>
#include <string.h>

#include "graphtrain/gt_config.h"
#include "graphtrain/gt_pass.h"
#include "graphtrain/gt_train.h"
#include "gt_test.h"

/* The rank's batch and sequence the exchanges are sized at: an odd length along the chunked dim
 * (seq 33 cut at 16, or batch 5 at 2), so chunk 0's exchanges move fewer rows than chunk 1's (an
 * identification independent of the pass's tags). */
static int64_t at_batch = 4, at_seq = 33;

static int64_t rows_at(const gt_graph *g, gt_value_id v)
{
    gt_sym_binding_entry e[2] = {{"batch", at_batch}, {"seq", at_seq}};
    gt_sym_binding b = {e, 2};
    int64_t shape[GT_MAX_DIMS];
    gt_error err = {0};
    return gt_graph_eval_shape(g, v, &b, shape, &err) == GT_OK ? shape[0] : -1;
}

/* The first token exchange (expert parallelism's all-to-all) of chunk c in phase ph: its start
 * and its wait. */
static void first_exchange(gt_graph *g, int c, gt_phase ph, gt_node_id *start, gt_node_id *wait)
{
    *start = *wait = GT_NONE;
    int64_t lo = INT64_MAX, hi = -1;
    for (gt_node_id id = 0; id < g->n_nodes; id++) {
        const gt_node *n = &g->nodes[id];
        if (n->phase != ph || !gt_node_has_tag(g, n, GT_TAG_TOKEN_EXCHANGE)) continue;
        int64_t r = rows_at(g, n->out[0]);
        lo = r < lo ? r : lo, hi = r > hi ? r : hi;
    }
    if (hi < 0 || lo == hi) return; /* no exchange, or no two chunk sizes */
    for (gt_node_id id = 0; id < g->n_nodes && *start == GT_NONE; id++) {
        const gt_node *n = &g->nodes[id];
        if (n->phase != ph || !gt_node_has_tag(g, n, GT_TAG_TOKEN_EXCHANGE) ||
            rows_at(g, n->out[0]) != (c ? hi : lo))
            continue;
        *start = id;
        for (gt_node_id w = id + 1; w < g->n_nodes && *wait == GT_NONE; w++)
            if (g->nodes[w].n_in > 0 && g->nodes[w].in[0] == n->out[0]) *wait = w;
    }
}

/* Whether the compiled graph of the chunking has the interleaving (false also on no exchange). */
static bool interleaved(const char *flavor, const char *module, const char *dim, bool overlap)
{
    gt_config cfg;
    gt_config_defaults(&cfg);
    gt_error err = {0};
    const char *set[][2] = {{"model.name", "deepseek_v3"},
                            {"model.flavor", flavor},
                            {"training.mixed_precision_param", "float32"},
                            {"training.local_batch_size", "4"},
                            {"training.seq_len", "32"},
                            {"parallelism.data_parallel_shard_degree", "2"},
                            {"parallelism.expert_parallel_degree", "2"},
                            {"compile.ep_overlap.enabled", "true"},
                            {"compile.ep_overlap.module_fqn", module},
                            {"compile.ep_overlap.chunk_dim", dim},
                            {"compile.disable_passes", overlap ? "" : "ep_overlap"}};
    for (size_t k = 0; k < sizeof set / sizeof set[0]; k++)
        EXPECT_OK(gt_config_set(&cfg, set[k][0], set[k][1], &err), &err);
    gt_train_layout layout;
    gt_graph *g = gt_graph_new();
    gt_model model = {0};
    gt_status st = gt_train_layout_init(&cfg, 2, 0, &layout, &err);
    if (st == GT_OK) st = gt_train_build_graph_layout(&cfg, &layout, g, &model, 1, &err);
    EXPECT(st == GT_OK, "%s, %s x %s: the step graph: %s", flavor, module, dim, err.msg);
    bool ok = false;
    if (st == GT_OK) {
        gt_node_id s0, w0, s1, w1, b0, bw0, b1, bw1;
        first_exchange(g, 0, GT_PHASE_FORWARD, &s0, &w0);
        first_exchange(g, 1, GT_PHASE_FORWARD, &s1, &w1);
        first_exchange(g, 0, GT_PHASE_BACKWARD, &b0, &bw0);
        first_exchange(g, 1, GT_PHASE_BACKWARD, &b1, &bw1);
        EXPECT(s0 != GT_NONE && s1 != GT_NONE && b0 != GT_NONE && b1 != GT_NONE,
               "%s x %s: each chunk exchanges tokens in both phases", module, dim);
        printf(
            "  %-14s %-13s %-5s overlap %-3s fwd: chunk 0 start %d wait %d, chunk 1 start %d; bwd: "
            "chunk 1 start %d wait %d, chunk 0 start %d\n",
            flavor, module, dim, overlap ? "on" : "off", s0, w0, s1, b1, bw1, b0);
        ok =
            s0 != GT_NONE && s1 != GT_NONE && b0 != GT_NONE && b1 != GT_NONE && s1 < w0 && b0 < bw1;
    }
    gt_model_free(&model);
    gt_graph_free(g);
    gt_config_free(&cfg);
    return ok;
}

int main(void)
{
    const char *cases[][2] = {
        {"layers.*.moe", "seq"}, {"layers.*", "batch"}, {"layers.*.moe", "batch"}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        bool seq = !strcmp(cases[k][1], "seq");
        at_batch = seq ? 4 : 5, at_seq = seq ? 33 : 32;
        EXPECT(interleaved("test_dsv3_tiny", cases[k][0], cases[k][1], true),
               "%s x %s: chunk 1's exchange does not start before chunk 0's is waited for "
               "(forward), or the mirror (backward)",
               cases[k][0], cases[k][1]);
        EXPECT(!interleaved("test_dsv3_tiny", cases[k][0], cases[k][1], false),
               "%s x %s: the chunks interleave without the pass: the check proves nothing",
               cases[k][0], cases[k][1]);
    }
    /* debugmodel: five MoE blocks in a row, each one's backward next to its neighbours' (the
     * sums of the chunks' gradients, the weights gathered again and their FSDP buckets are no
     * chunk's, or the blocks' spans would collide and the pass refuse them) */
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        bool seq = !strcmp(cases[k][1], "seq");
        at_batch = seq ? 4 : 5, at_seq = seq ? 33 : 32;
        EXPECT(interleaved("debugmodel", cases[k][0], cases[k][1], true),
               "debugmodel, %s x %s: not interleaved", cases[k][0], cases[k][1]);
    }
    return gt_test_finish();
}
