/* test_pp_split.c — the stage split of the whole-step graph and the dI/dW split
 * (src/passes/pp_split.c, gt_pp_split.h).
 *
 * On llama3 debugmodel's step graph (6 blocks; forward, loss, backward, clipping, AdamW, as
 * gt_train_build_graph builds it without passes), split into 2 and 4 stages by torchtitan's rule
 * (gt_pp_split_layers):
 *   - every node has a stage; every backward node with an origin is in its origin's stage; every
 *     adamw is in the stage of the block its parameter belongs to (embedding: 0, norm and output:
 *     the last); the nodes on every rank are the gradient norm's cross-stage sum and what follows;
 *   - values cross only from a stage's forward to the next stage and from a stage's backward to
 *     the previous one (the split refuses anything else), each boundary carries forward values and
 *     gradients, and the sums of squares are gathered;
 *   - the saved bytes of each stage (gt_pp_split_saved_bytes) equal a naive count;
 *   - no dI node reads a dW value; stage 0 has no dI; every other stage's dI is not empty and
 *     is smaller than its backward;
 *   - fwd + dI + dW is the unsplit backward, bitwise: the graph reordered as a pipeline runs one
 *     micro-batch (stages' forwards in order, then from the last stage to the first its dI then its
 *     dW, then the optimizer) gives every output memcmp-equal to the graph in its own order, over
 *     2 steps of gt_eager_run feeding the updates back.
 * On the SPMD graph that parallelize makes of it for dp_shard 2 and for tp 2 with 4 micro-batches
 * of accumulation (what a pipeline rank of pp x dp or pp x tp runs), split into 2 stages:
 *   - every node that each micro-batch runs (gt_graph_micro_part) is in a stage's forward, dI or
 *     dW, which the runner runs per micro-batch, never in the once-a-step optimizer: the loss's
 *     all-reduce over dp is in the last stage's forward, the gradients' reduce-scatters in dW;
 *   - every collective of a stage is in that stage's forward, dI, dW or optimizer, and the
 *     gradient norm's all-reduce runs on every rank. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graphtrain/gt_pipeline.h"
#include "graphtrain/gt_pp_split.h"
#include "graphtrain/gt_train.h"
#include "passes/pass_internal.h"
#include "step_harness.h"

static int32_t stage_of_block(int32_t unit, int32_t n_stages, const int64_t *fl)
{
    if (unit == GT_UNIT_EMBED) return 0;
    if (unit < 0) return n_stages - 1;
    for (int32_t s = 0; s < n_stages; s++)
        if (unit >= fl[s] && unit < fl[s + 1]) return s;
    return -9;
}

static void check_split(const step_graph *sg, int32_t n_stages)
{
    const gt_graph *g = sg->g;
    int64_t fl[9];
    gt_error err = {0};
    EXPECT_OK(gt_pp_split_layers(6, n_stages, 1, 1, fl, &err), &err);
    gt_pp_split s;
    EXPECT_OK(gt_pp_split_graph(g, n_stages, fl, &s, &err), &err);
    if (err.code != GT_OK) return;
    printf("debugmodel, %d stages:\n", n_stages);
    gt_pp_split_print(g, &s, stdout);
    int bad_origin = 0, bad_adamw = 0, n_adamw = 0;
    for (gt_node_id n = 0; n < g->n_nodes; n++) {
        const gt_node *nd = &g->nodes[n];
        EXPECT(s.stage[n] == GT_PP_STAGE_GLOBAL || (s.stage[n] >= 0 && s.stage[n] < n_stages),
               "node %d stage %d", n, s.stage[n]);
        if (nd->phase == GT_PHASE_BACKWARD && nd->origin != GT_NONE &&
            s.stage[n] != s.stage[nd->origin])
            bad_origin++;
        if (!strcmp(gt_op_get(nd->op)->name, "adamw")) {
            n_adamw++;
            /* input 0 is the parameter */
            gt_param_plan plan = gt_graph_input_plan(g, nd->in[0]);
            if (s.stage[n] != stage_of_block(plan.unit, n_stages, fl)) bad_adamw++;
        }
        if (s.part[n] == GT_PP_PART_I)
            for (int i = 0; i < nd->n_in; i++) {
                gt_node_id p = g->values[nd->in[i]].producer;
                EXPECT(p == GT_NONE || s.part[p] != GT_PP_PART_W, "dI node %d reads dW node %d", n,
                       p);
            }
    }
    EXPECT(bad_origin == 0, "%d backward nodes not in their origin's stage", bad_origin);
    EXPECT(n_adamw > 0 && bad_adamw == 0, "%d of %d adamw not in their parameter's stage",
           bad_adamw, n_adamw);
    EXPECT(s.n_global > 0, "no global nodes");
    EXPECT(s.count[0][GT_PP_PART_I] == 0, "stage 0 dI %d", s.count[0][GT_PP_PART_I]);
    for (int32_t st = 1; st < n_stages; st++)
        EXPECT(s.count[st][GT_PP_PART_I] > 0 && s.count[st][GT_PP_PART_W] > 0,
               "stage %d: dI %d dW %d", st, s.count[st][GT_PP_PART_I], s.count[st][GT_PP_PART_W]);
    for (int32_t st = 0; st + 1 < n_stages; st++) {
        int fwd = 0, grad = 0;
        for (int32_t k = 0; k < s.n_cross; k++) {
            if (s.cross[k].from == st && s.cross[k].to == st + 1 && !s.cross[k].gradient) fwd++;
            if (s.cross[k].from == st + 1 && s.cross[k].to == st && s.cross[k].gradient) grad++;
        }
        EXPECT(fwd > 0 && grad > 0, "boundary %d|%d: %d forward values, %d gradients", st, st + 1,
               fwd, grad);
    }
    int gathered = 0;
    for (int32_t k = 0; k < s.n_cross; k++)
        gathered += s.cross[k].to == GT_PP_STAGE_GLOBAL;
    EXPECT(gathered > 0, "no partial result gathered");

    /* saved bytes per stage: the naive count (values of F nodes of the stage or the stage
     * before, read by I or W nodes of the stage, each once per stage) */
    int64_t bytes[8], naive[8] = {0};
    EXPECT_OK(gt_pp_split_saved_bytes(g, &s, &sg->binding, bytes, &err), &err);
    for (int32_t st = 0; st < n_stages; st++) {
        for (gt_value_id v = 0; v < g->n_values; v++) {
            gt_node_id p = g->values[v].producer;
            if (p == GT_NONE || s.part[p] != GT_PP_PART_F) continue;
            if (s.stage[p] != st && s.stage[p] != st - 1) continue;
            bool read = false;
            for (gt_node_id n = 0; n < g->n_nodes && !read; n++) {
                if (s.stage[n] != st || (s.part[n] != GT_PP_PART_I && s.part[n] != GT_PP_PART_W))
                    continue;
                for (int i = 0; i < g->nodes[n].n_in; i++)
                    read |= g->nodes[n].in[i] == v;
            }
            if (!read) continue;
            int64_t shape[GT_MAX_DIMS];
            EXPECT_OK(gt_graph_eval_shape(g, v, &sg->binding, shape, &err), &err);
            int64_t numel = 1;
            for (int d = 0; d < gt_value_type(g, v)->ndim; d++)
                numel *= shape[d];
            naive[st] += numel * (int64_t)gt_dtype_size(gt_value_type(g, v)->dtype);
        }
        EXPECT(bytes[st] == naive[st] && bytes[st] > 0, "stage %d saved %lld, naive %lld", st,
               (long long)bytes[st], (long long)naive[st]);
    }

    /* fwd + dI + dW = the unsplit backward, bitwise */
    gt_graph *piped = gt_graph_copy(g);
    gt_node_id *order = malloc((size_t)g->n_nodes * sizeof *order);
    gt_pp_split_pipeline_order(g, &s, order);
    gt_pass_apply_order(piped, order);
    free(order);
    EXPECT_OK(gt_graph_verify(piped, &err), &err);
    step_run a, b;
    bool ok = step_run_init(&a, sg) & step_run_init(&b, sg);
    for (int64_t step = 1; ok && step <= 2 && err.code == GT_OK; step++) {
        step_set_scalars(sg, g, a.state, step);
        step_set_scalars(sg, piped, b.state, step);
        EXPECT_OK(gt_eager_run(g, &sg->binding, a.state, a.out, &err), &err);
        EXPECT_OK(gt_eager_run(piped, &sg->binding, b.state, b.out, &err), &err);
        int diffs = step_count_diffs("debugmodel", "pipeline order", step, g, a.out, b.out);
        EXPECT(diffs == 0, "%d stages step %lld: %d outputs differ", n_stages, (long long)step,
               diffs);
        step_run_next(&a, g);
        step_run_next(&b, piped);
    }
    step_run_free(&a);
    step_run_free(&b);
    gt_graph_free(piped);
    gt_pp_split_free(&s);
}

/* A graph the rule cannot split: more blocks than the stages hold. */
static void check_refusal(const step_graph *sg)
{
    int64_t fl[3] = {0, 2, 4}; /* 4 of debugmodel's 6 blocks */
    gt_pp_split s;
    gt_error err = {0};
    EXPECT(gt_pp_split_graph(sg->g, 2, fl, &s, &err) == GT_ERR_INVALID &&
               strstr(err.msg, "past the 4 blocks"),
           "%s", err.msg);
}

/* The split of debugmodel's SPMD graph for a mesh (one override: "--parallelism.X=N"). */
static void check_spmd_split(const char *degree)
{
    gt_error err = {0};
    gt_config cfg;
    gt_config_defaults(&cfg);
    char *argv[] = {"--model.flavor=debugmodel", "--training.seq_len=32",
                    "--training.mixed_precision_param=float32", (char *)degree,
                    "--parallelism.data_parallel_shard_degree=-1"};
    EXPECT_OK(gt_config_apply_overrides(&cfg, 5, argv, &err), &err);
    gt_train_layout layout;
    EXPECT_OK(gt_train_layout_init(&cfg, 2, 0, &layout, &err), &err);
    gt_graph *g = gt_graph_new();
    gt_model model = {0};
    if (err.code == GT_OK)
        EXPECT_OK(gt_train_build_global_graph(&cfg, &layout, g, &model, 4, &err), &err);
    if (err.code == GT_OK) EXPECT_OK(gt_train_parallelize(&cfg, &layout, g, &err), &err);
    int64_t fl[3];
    gt_pp_split s = {0};
    if (err.code == GT_OK) EXPECT_OK(gt_pp_split_layers(6, 2, 1, 1, fl, &err), &err);
    if (err.code == GT_OK) EXPECT_OK(gt_pp_split_graph(g, 2, fl, &s, &err), &err);
    if (err.code == GT_OK) {
        uint8_t *micro = calloc((size_t)g->n_nodes + 1, 1);
        gt_graph_micro_part(g, micro);
        int once = 0, collectives = 0, global_collectives = 0;
        for (gt_node_id n = 0; n < g->n_nodes; n++) {
            bool per_micro =
                s.part[n] == GT_PP_PART_F || s.part[n] == GT_PP_PART_I || s.part[n] == GT_PP_PART_W;
            if (micro[n] && !per_micro && once++ < 3)
                fprintf(stderr, "  %s: node %d (%s) of the micro-batch part is in part %d\n",
                        degree, n, gt_op_get(g->nodes[n].op)->name, s.part[n]);
            if (!gt_op_is_collective_start(g->nodes[n].op)) continue;
            collectives++;
            global_collectives += s.stage[n] == GT_PP_STAGE_GLOBAL;
        }
        EXPECT(once == 0, "%s: %d nodes of the micro-batch part run once a step", degree, once);
        int32_t loss = -1;
        for (int32_t k = 0; k < g->n_outputs; k++)
            if (g->outputs[k].kind == GT_OUT_LOSS) loss = g->values[g->outputs[k].value].producer;
        EXPECT(loss >= 0 && s.stage[loss] == 1 && s.part[loss] == GT_PP_PART_F,
               "%s: the loss is in stage %d part %d", degree, loss >= 0 ? s.stage[loss] : -9,
               loss >= 0 ? s.part[loss] : -9);
        EXPECT(collectives > 0 && global_collectives > 0, "%s: %d collectives, %d on every rank",
               degree, collectives, global_collectives);
        printf("debugmodel SPMD (%s), 2 stages: %d collectives (%d on every rank)\n", degree,
               collectives, global_collectives);
        gt_pp_split_print(g, &s, stdout);
        free(micro);
    }
    gt_pp_split_free(&s);
    gt_model_free(&model);
    gt_graph_free(g);
    gt_config_free(&cfg);
}

int main(void)
{
    step_graph sg;
    if (!step_graph_build(&sg, "debugmodel", 2, 16)) return gt_test_finish();
    check_split(&sg, 2);
    check_split(&sg, 4);
    check_refusal(&sg);
    step_graph_free(&sg);
    check_spmd_split("--parallelism.tensor_parallel_degree=1");
    check_spmd_split("--parallelism.tensor_parallel_degree=2");
    return gt_test_finish();
}
