/* llama3.c — the llama3 forward + loss graph (torchtitan's Transformer), on symbolic [batch, seq].
 *
 *   h      = tok_embeddings[tokens]                                   [b, s, D]
 *   per layer i (a pre-norm block):
 *     x    = rms_norm(h) · attention_norm
 *     q    = rope(x Wqᵀ as [b, s, H, hd]),  k = rope(x Wkᵀ as [b, s, Hkv, hd]),  v = x Wvᵀ
 *     a    = sdpa(q, k, v; causal, scale 1/sqrt(hd)) over [b, s, heads, hd]  (GQA inside the op;
 *            block_causal: RoPE at the INPUT positions and each token sees its own document only;
 *            layout 1: the op reads the projections' [b, s, heads, hd] in place, so there is no
 *            transpose before it, none after it, and none in the backward)
 *     h    = h + (a as [b, s, H·hd]) Woᵀ
 *     x    = rms_norm(h) · ffn_norm
 *     h    = h + (silu(x W1ᵀ) ⊙ x W3ᵀ) W2ᵀ                                 (SwiGLU)
 *   logits = (rms_norm(h) · norm) Woutputᵀ                              [b·s, V]
 *   loss   = mean cross-entropy(logits, labels) over labels != −100
 *
 * Linear weights are stored [out, in] as in torch, so every projection is matmul(x, W, trans_b).
 * RoPE uses the Hugging Face half-rotation layout, so the weights load into transformers'
 * LlamaForCausalLM without the q/k permutation Meta's checkpoints need. Every node carries the fqn
 * of the torchtitan module that computes it, so passes and dumps can group by module.
 *
 * Mixed precision (cfg->compute_dtype = GT_BF16) follows torchtitan's FSDP2 policy
 * (param_dtype bf16, reduce_dtype fp32), which casts parameters, not activations:
 *   - PARAM inputs stay f32: they are the master weights that AdamW reads and writes, next to its
 *     f32 moments.
 *   - each parameter is cast to bf16 once, at its (one) use, under the fqn of the module using it
 *     (FSDP casts when it gathers a module's parameters);
 *   - so the whole module computes in bf16, norms included: embedding rows, RMSNorm (statistics
 *     are accumulated in f32 inside the op, as torch's bf16 rms_norm kernels do, then rounded
 *     once), projections, RoPE, attention, SwiGLU and the residual stream are bf16 values. There
 *     are no autocast-style f32 islands, because FSDP does not add any. The one f32 value inside
 *     the forward is sdpa's logsumexp (the op's rule).
 *   - the loss: torchtitan computes cross_entropy(logits.float()). cross_entropy here reads bf16
 *     logits widened to f32 (exact) and returns an f32 loss, so the numbers are those of the cast
 *     without materialising f32 logits; its gradient is computed in f32 and rounded once to bf16,
 *     as .float()'s backward rounds torch's f32 dlogits.
 *   - backward: activation gradients are bf16 (as torch autograd on bf16 tensors); a weight's
 *     gradient leaves bf16 through the cast's gradient rule (cast back), so every GRAD output, the
 *     micro-batch gradient sums, the gradient norm and the AdamW update are f32.
 * With GT_F32 the graph has no cast at all (the all-f32 parity run). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "graphtrain/gt_build.h"
#include "graphtrain/gt_llama3.h"

typedef struct {
    gt_graph *g;
    const gt_llama3_config *cfg;
    gt_model *model;
    gt_expr b, s, bs;      /* batch, seq, batch*seq */
    gt_value_id positions; /* INPUT positions [b, s] (block_causal), else GT_NONE */
} gt_llama3_ctx;

/* A parameter as the module using it reads it: the f32 PARAM itself, or its bf16 cast. Called at
 * the use, after the module's fqn is set, so the cast is stamped with that module. */
static gt_value_id gt_llama3_weight(gt_llama3_ctx *c, gt_value_id param)
{
    if (c->cfg->compute_dtype == GT_F32) return param;
    return gt_cast(c->g, param, c->cfg->compute_dtype);
}

/* The module path of what is built next inside layer `layer`, which is also its structural unit. */
static void gt_llama3_set_fqn(gt_graph *g, const char *fmt, int64_t layer)
{
    char fqn[128];
    snprintf(fqn, sizeof fqn, fmt, (long long)layer);
    gt_graph_set_fqn(g, fqn);
    gt_graph_set_unit(g, (int32_t)layer);
}

/* A module outside the layers: the embedding's own unit, or the rest (norm, output, loss). */
static void gt_llama3_set_outer(gt_graph *g, const char *fqn, int32_t unit)
{
    gt_graph_set_fqn(g, fqn);
    gt_graph_set_unit(g, unit);
}

/* Adds one f32 PARAM input with its parallel plan and its init spec; the spec's fqn is the
 * parameter's ("layers.3.attention.wq.weight"). */
static gt_value_id gt_llama3_param(gt_llama3_ctx *c, const char *fqn, gt_param_plan plan,
                                   int64_t rows, int64_t cols, gt_init_kind init, double std,
                                   double lo, double hi)
{
    gt_model *m = c->model;
    gt_param_spec *p = &m->params[m->n_params++];
    memset(p, 0, sizeof *p);
    snprintf(p->fqn, sizeof p->fqn, "%s", fqn);
    p->dtype = GT_F32;
    p->ndim = cols > 0 ? 2 : 1;
    p->shape[0] = rows;
    p->shape[1] = cols > 0 ? cols : 0;
    p->init = init;
    p->std = std;
    p->lo = lo;
    p->hi = hi;

    gt_expr dims[2] = {gt_c(c->g, rows), gt_c(c->g, cols)};
    gt_value_id v = gt_graph_add_input(c->g, GT_IN_PARAM, fqn, GT_F32, p->ndim, dims);
    plan.as_param = 1;
    gt_graph_set_input_plan(c->g, v, plan);
    return v;
}

/* torchtitan's llama3 tensor-parallel plan, per parameter of block `unit`. */
static gt_param_plan gt_llama3_plan(gt_tp_style tp, int32_t unit)
{
    return (gt_param_plan){.tp = (uint8_t)tp, .unit = unit};
}

typedef struct {
    gt_value_id wq, wk, wv, wo, attention_norm, w1, w2, w3, ffn_norm;
} gt_llama3_layer_params;

/* torchtitan's init for one block: wq/wk/wv/w1 trunc_normal(0.02) and the output projections
 * wo/w2/w3 depth-scaled, std = 0.02 / sqrt(2 (i + 1)), both cut at torch's default absolute
 * [-2, 2]; norms ones. */
static void gt_llama3_layer_inputs(gt_llama3_ctx *c, int64_t i, gt_llama3_layer_params *lp)
{
    const gt_llama3_config *cfg = c->cfg;
    int64_t D = cfg->dim, F = cfg->ffn_hidden, hd = cfg->dim / cfg->n_heads;
    int64_t q_out = cfg->n_heads * hd, kv_out = cfg->n_kv_heads * hd;
    double std = cfg->depth_init_base_std, depth_std = std / sqrt(2.0 * (double)(i + 1));
    char fqn[128];

    /* torchtitan's llama3 tensor-parallel plan and init, one row per parameter of the block:
     * rows and cols (0: a vector) of D, F, the q or the kv projection's width */
    const struct {
        const char *suffix;
        gt_value_id *out;
        gt_tp_style tp;
        int64_t rows, cols;
        gt_init_kind init;
        double std;
    } rows[] = {
        {"attention.wq.weight", &lp->wq, GT_TP_COLWISE, q_out, D, GT_INIT_TRUNC_NORMAL, std},
        {"attention.wk.weight", &lp->wk, GT_TP_COLWISE, kv_out, D, GT_INIT_TRUNC_NORMAL, std},
        {"attention.wv.weight", &lp->wv, GT_TP_COLWISE, kv_out, D, GT_INIT_TRUNC_NORMAL, std},
        {"attention.wo.weight", &lp->wo, GT_TP_ROWWISE, D, q_out, GT_INIT_TRUNC_NORMAL, depth_std},
        {"attention_norm.weight", &lp->attention_norm, GT_TP_NONE, D, 0, GT_INIT_ONES, 0},
        {"feed_forward.w1.weight", &lp->w1, GT_TP_COLWISE, F, D, GT_INIT_TRUNC_NORMAL, std},
        {"feed_forward.w2.weight", &lp->w2, GT_TP_ROWWISE, D, F, GT_INIT_TRUNC_NORMAL, depth_std},
        {"feed_forward.w3.weight", &lp->w3, GT_TP_COLWISE, F, D, GT_INIT_TRUNC_NORMAL, depth_std},
        {"ffn_norm.weight", &lp->ffn_norm, GT_TP_NONE, D, 0, GT_INIT_ONES, 0},
    };
    for (size_t k = 0; k < sizeof rows / sizeof rows[0]; k++) {
        snprintf(fqn, sizeof fqn, "layers.%lld.%s", (long long)i, rows[k].suffix);
        bool ones = rows[k].init == GT_INIT_ONES;
        *rows[k].out = gt_llama3_param(c, fqn, gt_llama3_plan(rows[k].tp, (int32_t)i), rows[k].rows,
                                       rows[k].cols, rows[k].init, rows[k].std, ones ? 0 : -2.0,
                                       ones ? 0 : 2.0);
    }
}

/* x: [b, s, D] → [b, s, heads, hd]: project, split heads, and (for q and k) rotate. */
static gt_value_id gt_llama3_heads(gt_llama3_ctx *c, int64_t i, const char *proj, gt_value_id x,
                                   gt_value_id w, int64_t heads, bool rotate)
{
    gt_graph *g = c->g;
    const gt_llama3_config *cfg = c->cfg;
    int64_t hd = cfg->dim / cfg->n_heads;
    char fqn[128];
    snprintf(fqn, sizeof fqn, "layers.%lld.attention.%s", (long long)i, proj);
    gt_graph_set_fqn(g, fqn);
    gt_value_id y = gt_matmul(g, x, gt_llama3_weight(c, w), false, true);
    gt_expr split[4] = {c->b, c->s, gt_c(g, heads), gt_c(g, hd)};
    y = gt_reshape(g, y, 4, split);
    if (rotate) {
        gt_llama3_set_fqn(g, "layers.%lld.attention.rope", i);
        gt_rope_params rp = {
            .theta = cfg->rope_theta,
            .factor = cfg->rope_factor,
            .low_freq_factor = cfg->rope_low_freq_factor,
            .high_freq_factor = cfg->rope_high_freq_factor,
            .original_max_position = cfg->rope_original_max_position,
        };
        y = gt_rope_at(g, y, c->positions, &rp, false);
    }
    return y;
}

static gt_value_id gt_llama3_block(gt_llama3_ctx *c, int64_t i, gt_value_id h)
{
    gt_graph *g = c->g;
    const gt_llama3_config *cfg = c->cfg;
    int64_t hd = cfg->dim / cfg->n_heads;
    gt_llama3_layer_params lp;
    gt_llama3_layer_inputs(c, i, &lp);

    gt_llama3_set_fqn(g, "layers.%lld.attention_norm", i);
    gt_value_id x = gt_rms_norm(g, h, gt_llama3_weight(c, lp.attention_norm), cfg->norm_eps);
    gt_value_id q = gt_llama3_heads(c, i, "wq", x, lp.wq, cfg->n_heads, true);
    gt_value_id k = gt_llama3_heads(c, i, "wk", x, lp.wk, cfg->n_kv_heads, true);
    gt_value_id v = gt_llama3_heads(c, i, "wv", x, lp.wv, cfg->n_kv_heads, false);

    gt_llama3_set_fqn(g, "layers.%lld.attention.sdpa", i);
    gt_value_id a = gt_sdpa_docs(g, q, k, v, c->positions, true, 1.0 / sqrt((double)hd), 1, NULL);
    gt_llama3_set_fqn(g, "layers.%lld.attention.wo", i); /* a: [b, s, H, hd], merged by a view */
    gt_expr merged[3] = {c->b, c->s, gt_c(g, cfg->n_heads * hd)};
    a = gt_reshape(g, a, 3, merged);
    a = gt_matmul(g, a, gt_llama3_weight(c, lp.wo), false, true);
    gt_llama3_set_fqn(g, "layers.%lld", i);
    h = gt_add(g, h, a);

    gt_llama3_set_fqn(g, "layers.%lld.ffn_norm", i);
    x = gt_rms_norm(g, h, gt_llama3_weight(c, lp.ffn_norm), cfg->norm_eps);
    gt_llama3_set_fqn(g, "layers.%lld.feed_forward.w1", i);
    gt_value_id gate = gt_matmul(g, x, gt_llama3_weight(c, lp.w1), false, true);
    gt_llama3_set_fqn(g, "layers.%lld.feed_forward.w3", i);
    gt_value_id up = gt_matmul(g, x, gt_llama3_weight(c, lp.w3), false, true);
    gt_llama3_set_fqn(g, "layers.%lld.feed_forward", i);
    gt_value_id act = gt_mul(g, gt_unary(g, GT_OP_SILU, gate), up);
    gt_llama3_set_fqn(g, "layers.%lld.feed_forward.w2", i);
    gt_value_id ffn = gt_matmul(g, act, gt_llama3_weight(c, lp.w2), false, true);
    gt_llama3_set_fqn(g, "layers.%lld", i);
    return gt_add(g, h, ffn);
}

static gt_status gt_llama3_check_config(const gt_llama3_config *cfg, gt_error *err)
{
    const char *name = cfg->flavor[0] ? cfg->flavor : "(unnamed)";
    if (cfg->dim <= 0 || cfg->n_layers <= 0 || cfg->n_heads <= 0 || cfg->n_kv_heads <= 0 ||
        cfg->vocab_size <= 0 || cfg->ffn_hidden <= 0) {
        return gt_error_set(err, GT_ERR_INVALID,
                            "llama3 flavor '%s': dim %lld, n_layers %lld, n_heads %lld, "
                            "n_kv_heads %lld, vocab_size %lld, ffn_hidden %lld must all be > 0",
                            name, (long long)cfg->dim, (long long)cfg->n_layers,
                            (long long)cfg->n_heads, (long long)cfg->n_kv_heads,
                            (long long)cfg->vocab_size, (long long)cfg->ffn_hidden);
    }
    if (cfg->n_layers > 100000) {
        return gt_error_set(err, GT_ERR_INVALID, "llama3 flavor '%s': n_layers %lld is too large",
                            name, (long long)cfg->n_layers);
    }
    if (cfg->dim % cfg->n_heads != 0 || (cfg->dim / cfg->n_heads) % 2 != 0) {
        return gt_error_set(err, GT_ERR_INVALID,
                            "llama3 flavor '%s': dim %lld must split into %lld heads of an even "
                            "head dim (RoPE rotates pairs)",
                            name, (long long)cfg->dim, (long long)cfg->n_heads);
    }
    if (cfg->n_heads % cfg->n_kv_heads != 0) {
        return gt_error_set(
            err, GT_ERR_INVALID,
            "llama3 flavor '%s': n_heads %lld must be a multiple of n_kv_heads %lld", name,
            (long long)cfg->n_heads, (long long)cfg->n_kv_heads);
    }
    if (!(cfg->norm_eps > 0.0) || !(cfg->rope_theta > 0.0) || !(cfg->depth_init_base_std > 0.0)) {
        return gt_error_set(err, GT_ERR_INVALID,
                            "llama3 flavor '%s': norm_eps, rope_theta and depth_init_base_std "
                            "must be > 0",
                            name);
    }
    if (cfg->rope_original_max_position < 0 ||
        (cfg->rope_original_max_position > 0 &&
         !(cfg->rope_factor > 0.0 && cfg->rope_high_freq_factor > cfg->rope_low_freq_factor &&
           cfg->rope_low_freq_factor > 0.0))) {
        return gt_error_set(err, GT_ERR_INVALID,
                            "llama3 flavor '%s': RoPE scaling needs factor > 0 and "
                            "high_freq_factor > low_freq_factor > 0",
                            name);
    }
    if (cfg->compute_dtype != GT_F32 && cfg->compute_dtype != GT_BF16) {
        return gt_error_set(err, GT_ERR_INVALID,
                            "llama3 flavor '%s': compute dtype %s is not supported (f32 or bf16)",
                            name, gt_dtype_name(cfg->compute_dtype));
    }
    return GT_OK;
}

gt_status gt_llama3_build(gt_graph *g, const gt_llama3_config *cfg, gt_model *model, gt_error *err)
{
    memset(model, 0, sizeof *model);
    GT_TRY(gt_llama3_check_config(cfg, err));

    /* tok_embeddings + 9 per layer + norm + output */
    int n_params = (int)(1 + 9 * cfg->n_layers + 2);
    model->params = gt_xcalloc((size_t)n_params, sizeof *model->params);
    gt_llama3_ctx c = {.g = g, .cfg = cfg, .model = model};
    c.b = gt_sym_var(g->sym, "batch");
    c.s = gt_sym_var(g->sym, "seq");
    c.bs = gt_sym_mul(g->sym, c.b, c.s);
    int64_t D = cfg->dim, V = cfg->vocab_size;

    gt_expr tokens_dims[2] = {c.b, c.s};
    model->tokens = gt_graph_add_input(g, GT_IN_INPUT, "tokens", GT_I64, 2, tokens_dims);
    model->labels = gt_graph_add_input(g, GT_IN_INPUT, "labels", GT_I64, 2, tokens_dims);
    c.positions = cfg->block_causal
                      ? gt_graph_add_input(g, GT_IN_INPUT, "positions", GT_I64, 2, tokens_dims)
                      : GT_NONE;

    /* Embedding N(0, 1), as torchtitan's nn.init.normal_. */
    gt_param_plan embed_plan = {
        .tp = GT_TP_COLWISE, .role = GT_ROLE_EMBEDDING, .unit = GT_UNIT_EMBED};
    gt_value_id tok =
        gt_llama3_param(&c, "tok_embeddings.weight", embed_plan, V, D, GT_INIT_NORMAL, 1.0, 0, 0);
    gt_llama3_set_outer(g, "tok_embeddings", GT_UNIT_EMBED);
    gt_value_id h = gt_embedding(g, gt_llama3_weight(&c, tok), model->tokens);

    for (int64_t i = 0; i < cfg->n_layers; i++)
        h = gt_llama3_block(&c, i, h);

    /* The final projection: trunc_normal with std dim^-1/2 cut at ±3 std (torchtitan). */
    gt_value_id norm_w = gt_llama3_param(
        &c, "norm.weight", gt_llama3_plan(GT_TP_NONE, GT_UNIT_REST), D, 0, GT_INIT_ONES, 0, 0, 0);
    double out_std = 1.0 / sqrt((double)D);
    gt_param_plan out_plan = {.tp = GT_TP_COLWISE, .role = GT_ROLE_OUTPUT, .unit = GT_UNIT_REST};
    gt_value_id out_w = gt_llama3_param(&c, "output.weight", out_plan, V, D, GT_INIT_TRUNC_NORMAL,
                                        out_std, -3.0 * out_std, 3.0 * out_std);
    GT_CHECK(model->n_params == n_params);

    gt_llama3_set_outer(g, "norm", GT_UNIT_REST);
    h = gt_rms_norm(g, h, gt_llama3_weight(&c, norm_w), cfg->norm_eps);
    gt_llama3_set_outer(g, "output", GT_UNIT_REST);
    gt_value_id logits = gt_matmul(g, h, gt_llama3_weight(&c, out_w), false, true);
    gt_expr flat_logits[2] = {c.bs, gt_c(g, V)};
    model->logits = gt_reshape(g, logits, 2, flat_logits);

    gt_llama3_set_outer(g, "loss", GT_UNIT_REST);
    gt_expr flat_labels[1] = {c.bs};
    gt_value_id labels = gt_reshape(g, model->labels, 1, flat_labels);
    model->loss = gt_cross_entropy(g, model->logits, labels, -100);
    gt_llama3_set_outer(g, NULL, GT_UNIT_REST);

    return gt_model_finish_build(g, model, "llama3", cfg->flavor, err);
}

/* ---------------------------------------------------------------- the family (gt_model.h) */

static gt_status family_flavor(const char *flavor, void *cfg, gt_error *err)
{
    return gt_llama3_flavor(flavor, cfg, err);
}

/* The family's config with the run's compute dtype. */
static gt_llama3_config config_of(const gt_model_config *mc)
{
    gt_llama3_config cfg;
    memcpy(&cfg, mc->cfg, sizeof cfg);
    cfg.compute_dtype = mc->compute_dtype;
    cfg.block_causal = mc->block_causal;
    return cfg;
}

static void family_info(const gt_model_config *mc, gt_model_info *info)
{
    gt_llama3_config cfg = config_of(mc);
    double head_dim = (double)cfg.dim / (double)cfg.n_heads;
    info->vocab_size = cfg.vocab_size;
    info->max_seq_len = cfg.max_seq_len;
    info->n_layers = cfg.n_layers;
    info->attention_flops_per_position =
        12.0 * (double)cfg.n_layers * (double)cfg.n_heads * head_dim;
}

static gt_status family_build(gt_graph *g, const gt_model_config *mc, gt_model *model,
                              gt_error *err)
{
    gt_llama3_config cfg = config_of(mc);
    return gt_llama3_build(g, &cfg, model, err);
}

static gt_status family_hf_export(const gt_model_config *mc, const gt_model *m,
                                  const gt_tensor *params, const char *dir,
                                  const gt_export_hf_options *opts, gt_error *err)
{
    gt_llama3_config cfg = config_of(mc);
    return gt_export_hf_llama3_opts(&cfg, m, params, dir, opts, err);
}

static gt_status family_hf_import(const gt_model_config *mc, const char *config_json, size_t len,
                                  const char *name, gt_error *err)
{
    gt_llama3_config cfg = config_of(mc);
    return gt_import_hf_llama3_check(&cfg, config_json, len, name, err);
}

const gt_model_family gt_llama3_family = {
    .name = "llama3",
    .flavors = gt_llama3_flavor_list,
    .config_size = sizeof(gt_llama3_config),
    .flavor = family_flavor,
    .info = family_info,
    .build = family_build,
    .hf_name = gt_export_hf_llama3_name,
    .hf_export = family_hf_export,
    .hf_import = family_hf_import,
};
