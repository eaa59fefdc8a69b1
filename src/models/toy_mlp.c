/* toy_mlp.c — a test-only model family: a language model of residual MLP blocks, no attention.
 * It exists to show (and test) that a family is one file plus one registry line.
 *
 *   h      = embed[tokens]                                    [b, s, D]
 *   per block i:  h = h + silu(rms_norm(h) · norm_i  W1ᵀ) W2ᵀ    (W1 [F, D], W2 [D, F])
 *   logits = rms_norm(h) · norm  Woutᵀ                        [b·s, V]
 *   loss   = mean cross-entropy(logits, labels) over labels != −100
 * Units: block i's nodes are unit i, the embedding GT_UNIT_EMBED, the rest GT_UNIT_REST; W1 is
 * column-wise and W2 row-wise under tensor parallelism, the embedding and output
 * vocabulary-parallel. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "graphtrain/gt_build.h"
#include "graphtrain/gt_model.h"

typedef struct {
    int64_t dim, hidden, n_layers, vocab_size;
} toy_config;

static const char *const toy_flavors[] = {"tiny", NULL};

static gt_status toy_flavor(const char *flavor, void *cfg, gt_error *err)
{
    if (!flavor || strcmp(flavor, "tiny") != 0)
        return gt_model_unknown_flavor("toy_mlp", flavor, toy_flavors, err);
    *(toy_config *)cfg = (toy_config){.dim = 32, .hidden = 64, .n_layers = 2, .vocab_size = 256};
    return GT_OK;
}

static void toy_info(const gt_model_config *mc, gt_model_info *info)
{
    const toy_config *c = (const toy_config *)mc->cfg;
    info->vocab_size = c->vocab_size;
    info->max_seq_len = 1 << 20;
    info->n_layers = c->n_layers;
    info->attention_flops_per_position = 0; /* no attention */
}

typedef struct {
    gt_graph *g;
    gt_model *m;
    gt_dtype dt;
} toy_ctx;

static gt_value_id toy_param(toy_ctx *c, const char *fqn, gt_param_plan plan, int64_t rows,
                             int64_t cols, gt_init_kind init, double std)
{
    gt_param_spec *p = &c->m->params[c->m->n_params++];
    memset(p, 0, sizeof *p);
    snprintf(p->fqn, sizeof p->fqn, "%s", fqn);
    p->dtype = GT_F32;
    p->ndim = cols > 0 ? 2 : 1;
    p->shape[0] = rows;
    p->shape[1] = cols;
    p->init = init;
    p->std = std;
    p->lo = -3.0 * std;
    p->hi = 3.0 * std;
    gt_expr dims[2] = {gt_c(c->g, rows), gt_c(c->g, cols)};
    gt_value_id v = gt_graph_add_input(c->g, GT_IN_PARAM, fqn, GT_F32, p->ndim, dims);
    plan.as_param = 1;
    gt_graph_set_input_plan(c->g, v, plan);
    return v;
}

/* The weight as the module reads it: cast where it is used under bf16 compute. */
static gt_value_id toy_weight(toy_ctx *c, gt_value_id w)
{
    return c->dt == GT_F32 ? w : gt_cast(c->g, w, c->dt);
}

static void toy_module(gt_graph *g, const char *fqn, int32_t unit)
{
    gt_graph_set_fqn(g, fqn);
    gt_graph_set_unit(g, unit);
}

static gt_status toy_build(gt_graph *g, const gt_model_config *mc, gt_model *model, gt_error *err)
{
    const toy_config *cfg = (const toy_config *)mc->cfg;
    int64_t D = cfg->dim, F = cfg->hidden, V = cfg->vocab_size, L = cfg->n_layers;
    memset(model, 0, sizeof *model);
    model->params = gt_xcalloc((size_t)(3 * L + 3), sizeof *model->params);
    toy_ctx c = {.g = g, .m = model, .dt = mc->compute_dtype};
    gt_expr b = gt_sym_var(g->sym, "batch"), s = gt_sym_var(g->sym, "seq");
    gt_expr bs = gt_sym_mul(g->sym, b, s), tok_dims[2] = {b, s};
    model->tokens = gt_graph_add_input(g, GT_IN_INPUT, "tokens", GT_I64, 2, tok_dims);
    model->labels = gt_graph_add_input(g, GT_IN_INPUT, "labels", GT_I64, 2, tok_dims);

    gt_param_plan embed = {.tp = GT_TP_COLWISE, .role = GT_ROLE_EMBEDDING, .unit = GT_UNIT_EMBED};
    gt_value_id emb = toy_param(&c, "embed.weight", embed, V, D, GT_INIT_NORMAL, 1.0);
    toy_module(g, "embed", GT_UNIT_EMBED);
    gt_value_id h = gt_embedding(g, toy_weight(&c, emb), model->tokens);
    for (int64_t i = 0; i < L; i++) {
        char fqn[64];
        int32_t u = (int32_t)i;
        snprintf(fqn, sizeof fqn, "blocks.%lld.norm.weight", (long long)i);
        gt_value_id nw = toy_param(&c, fqn, (gt_param_plan){.unit = u}, D, 0, GT_INIT_ONES, 0);
        snprintf(fqn, sizeof fqn, "blocks.%lld.w1.weight", (long long)i);
        gt_value_id w1 = toy_param(&c, fqn, (gt_param_plan){.tp = GT_TP_COLWISE, .unit = u}, F, D,
                                   GT_INIT_TRUNC_NORMAL, 0.02);
        snprintf(fqn, sizeof fqn, "blocks.%lld.w2.weight", (long long)i);
        gt_value_id w2 = toy_param(&c, fqn, (gt_param_plan){.tp = GT_TP_ROWWISE, .unit = u}, D, F,
                                   GT_INIT_TRUNC_NORMAL, 0.02 / sqrt(2.0 * (double)(i + 1)));
        snprintf(fqn, sizeof fqn, "blocks.%lld", (long long)i);
        toy_module(g, fqn, u);
        gt_value_id x = gt_rms_norm(g, h, toy_weight(&c, nw), 1e-5);
        x = gt_unary(g, GT_OP_SILU, gt_matmul(g, x, toy_weight(&c, w1), false, true));
        h = gt_add(g, h, gt_matmul(g, x, toy_weight(&c, w2), false, true));
    }
    gt_value_id nf =
        toy_param(&c, "norm.weight", (gt_param_plan){.unit = GT_UNIT_REST}, D, 0, GT_INIT_ONES, 0);
    gt_param_plan out = {.tp = GT_TP_COLWISE, .role = GT_ROLE_OUTPUT, .unit = GT_UNIT_REST};
    gt_value_id ow = toy_param(&c, "output.weight", out, V, D, GT_INIT_TRUNC_NORMAL, 0.02);
    toy_module(g, "output", GT_UNIT_REST);
    h = gt_rms_norm(g, h, toy_weight(&c, nf), 1e-5);
    gt_value_id logits = gt_matmul(g, h, toy_weight(&c, ow), false, true);
    gt_expr flat[2] = {bs, gt_c(g, V)};
    model->logits = gt_reshape(g, logits, 2, flat);
    toy_module(g, "loss", GT_UNIT_REST);
    gt_value_id labels = gt_reshape(g, model->labels, 1, &bs);
    model->loss = gt_cross_entropy(g, model->logits, labels, -100);
    toy_module(g, NULL, GT_UNIT_REST);
    if (g->err.code != GT_OK) {
        gt_status st = gt_error_set(err, g->err.code, "building toy_mlp: %s", g->err.msg);
        gt_model_free(model);
        return st;
    }
    gt_graph_add_output(g, GT_OUT_LOSS, "loss", model->loss);
    return GT_OK;
}

const gt_model_family gt_toy_mlp_family = {
    .name = "toy_mlp",
    .flavors = toy_flavors,
    .config_size = sizeof(toy_config),
    .flavor = toy_flavor,
    .info = toy_info,
    .build = toy_build,
};
