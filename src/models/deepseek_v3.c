/* deepseek_v3.c — the deepseek_v3 forward + loss graph (torchtitan 0.3.0's DeepSeekV3Model, no
 * MTP), on symbolic [batch, seq]; T = batch·seq tokens, E routed experts, K = top_k.
 *
 *   h = tok_embeddings[tokens]                                               [b, s, D]
 *   per layer i:  h = h + MLA(rms_norm(h) · attention_norm)
 *                 h = h + (i < n_dense_layers ? SwiGLU : MoE)(rms_norm(h) · ffn_norm)
 *   logits = (rms_norm(h) · norm) lm_headᵀ; loss = mean cross-entropy over labels != −100
 *
 * MLA: q = x wqᵀ (or (rms_norm(x wq_aᵀ) · q_norm) wq_bᵀ) as [b, s, H, nope + rope], its rope part
 * rotated (YaRN, interleaved pairs); x wkv_aᵀ splits into the latent kv (kv_lora_rank) and one
 * shared k_pe head (rotated); (rms_norm(kv) · kv_norm) wkv_bᵀ gives per head k_nope and v;
 * k = [k_nope, k_pe broadcast to the H heads]; causal sdpa (layout 1) with YaRN's softmax scale;
 * then wo.
 *
 * MoE (torchtitan's TokenChoiceTopKRouter, GroupedExperts, token dispatcher), in f32 up to the
 * routing weights whatever the compute dtype (torchtitan's router runs under an f32 autocast):
 *   scores = softmax|sigmoid(x gateᵀ); ids = moe_topk(scores + expert_bias) (group-limited when
 *   configured; round robin with --debug.moe_force_load_balance); w = gather_last(scores, ids),
 *   /= (Σ_k w + 1e-20) with route_norm, · route_scale;
 *   (order, token, offsets) = moe_sort(ids): rows in (expert, token, k) order;
 *   x_sorted = embedding(x, token); y = grouped_matmul(silu(x_s w1ᵀ) ⊙ x_s w3ᵀ, w2);
 *   routed = embedding_backward(token, cast(f32(y) · w[order])) summed back per token;
 *   out = routed + shared experts (SwiGLU of hidden moe_hidden · n_shared).
 * The routing ops are NONDIFF: gradients reach the gate only through w, so a recomputed forward
 * can never route differently from the one whose activations the backward reads, and moe_count
 * (the load-balancing counts, model->moe_counts) is read by the optimizer phase only.
 * Experts compute in the run's compute dtype (graphtrain's policy: f32 experts in an f32 run, as
 * Hugging Face's, where torchtitan always casts them to bf16).
 *
 * Node tags: "moe.dispatch" (routing, sort, gather of the tokens), "moe.experts" (the grouped
 * GEMMs), "moe.combine" (the weighting and the sum back per token). Units: layer N's nodes unit
 * N, the embedding GT_UNIT_EMBED, the rest GT_UNIT_REST. TP plans follow torchtitan's DeepSeek-V3
 * plan (wq / wq_b / wkv_b colwise, wo rowwise, dense and shared FFN as llama3's; the router, the
 * experts, wq_a and wkv_a replicated); the MoE ops are data parallel or, with
 * --parallelism.expert_parallel_degree, expert parallel (src/parallel/rules_moe*.c). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "graphtrain/gt_build.h"
#include "graphtrain/gt_deepseek_v3.h"

typedef struct {
    gt_graph *g;
    const gt_deepseek_v3_config *cfg;
    gt_model *model;
    gt_expr b, s, bs;
    /* the last MoE built: its expert-bias input and token counts (summed over the chunks) */
    gt_value_id bias_out, counts_out;
    gt_value_id positions; /* INPUT positions [b, s] (block_causal), else GT_NONE */
} dsv3_ctx;

/* The module path of what is built next, "layers.%lld.<...>" with the layer, and its unit. */
static void set_fqn(gt_graph *g, const char *fmt, int64_t layer)
{
    char fqn[160];
    snprintf(fqn, sizeof fqn, fmt, (long long)layer);
    gt_graph_set_fqn(g, fqn);
    gt_graph_set_unit(g, (int32_t)layer);
}

/* A parameter as the module reads it: the f32 PARAM, or its cast to the compute dtype. */
static gt_value_id weight(dsv3_ctx *c, gt_value_id p)
{
    return c->cfg->compute_dtype == GT_F32 ? p : gt_cast(c->g, p, c->cfg->compute_dtype);
}

/* Adds one f32 PARAM (ndim 1..3, dims d0, d1, d2) with its plan and init; trunc_normal is cut at
 * torch's default absolute [-2, 2] unless cut > 0 (then ±cut·std). */
/* The graph input of kind `kind` named fqn, GT_NONE when there is none. */
static gt_value_id find_input(const gt_graph *g, gt_input_kind kind, const char *fqn)
{
    for (int32_t k = 0; k < g->n_inputs; k++)
        if (g->inputs[k].kind == (int)kind && !strcmp(gt_graph_str(g, g->inputs[k].fqn), fqn))
            return g->inputs[k].value;
    return GT_NONE;
}

static gt_value_id param(dsv3_ctx *c, const char *fqn, gt_tp_style tp, int32_t unit, int ndim,
                         int64_t d0, int64_t d1, int64_t d2, gt_init_kind init, double std)
{
    /* a module built once per chunk (eager chunking) finds its parameters made by the first */
    gt_value_id have = c->cfg->chunk.enabled ? find_input(c->g, GT_IN_PARAM, fqn) : GT_NONE;
    if (have != GT_NONE) return have;
    gt_param_spec *p = &c->model->params[c->model->n_params++];
    memset(p, 0, sizeof *p);
    snprintf(p->fqn, sizeof p->fqn, "%s", fqn);
    p->dtype = GT_F32;
    p->ndim = ndim;
    p->shape[0] = d0, p->shape[1] = d1, p->shape[2] = d2;
    p->init = init;
    p->std = std;
    p->lo = init == GT_INIT_TRUNC_NORMAL ? -2.0 : 0.0;
    p->hi = init == GT_INIT_TRUNC_NORMAL ? 2.0 : 0.0;
    gt_expr dims[3] = {gt_c(c->g, d0), gt_c(c->g, d1), gt_c(c->g, d2)};
    gt_value_id v = gt_graph_add_input(c->g, GT_IN_PARAM, fqn, GT_F32, ndim, dims);
    gt_graph_set_input_plan(c->g, v,
                            (gt_param_plan){.tp = (uint8_t)tp, .as_param = 1, .unit = unit});
    return v;
}

#define NAME(buf, suffix, i) (snprintf(buf, sizeof buf, "layers.%lld." suffix, (long long)(i)), buf)

/* A Linear weight [out, in] of layer i, trunc_normal(std). */
static gt_value_id linear(dsv3_ctx *c, const char *fqn, gt_tp_style tp, int64_t i, int64_t out,
                          int64_t in, double std)
{
    return param(c, fqn, tp, (int32_t)i, 2, out, in, 0, GT_INIT_TRUNC_NORMAL, std);
}

static gt_value_id norm_param(dsv3_ctx *c, const char *fqn, int32_t unit, int64_t n)
{
    return param(c, fqn, GT_TP_NONE, unit, 1, n, 0, 0, GT_INIT_ONES, 0);
}

static double depth_std(const dsv3_ctx *c, int64_t i)
{
    return c->cfg->init_std / sqrt(2.0 * (double)(i + 1));
}

/* x [b, s, D] · Wᵀ under module fmt. */
static gt_value_id proj(dsv3_ctx *c, const char *fmt, int64_t i, gt_value_id x, gt_value_id w)
{
    set_fqn(c->g, fmt, i);
    return gt_matmul(c->g, x, weight(c, w), false, true);
}

/* RoPE on x [b, s, heads, qk_rope_head_dim]: YaRN, interleaved pairs. */
static gt_value_id rope(dsv3_ctx *c, int64_t i, gt_value_id x)
{
    const gt_deepseek_v3_config *cfg = c->cfg;
    set_fqn(c->g, "layers.%lld.attention.rope", i);
    gt_rope_params rp = {.theta = cfg->rope_theta,
                         .factor = cfg->rope_factor,
                         .low_freq_factor = cfg->rope_beta_fast,
                         .high_freq_factor = cfg->rope_beta_slow,
                         .original_max_position = cfg->rope_original_seq_len,
                         .scaling = GT_ROPE_YARN,
                         .interleaved = 1};
    return gt_rope_at(c->g, x, c->positions, &rp, false);
}

static gt_value_id attention(dsv3_ctx *c, int64_t i, gt_value_id x)
{
    gt_graph *g = c->g;
    const gt_deepseek_v3_config *cfg = c->cfg;
    int64_t D = cfg->dim, H = cfg->n_heads, nope = cfg->qk_nope_head_dim,
            rd = cfg->qk_rope_head_dim, vd = cfg->v_head_dim, qk = nope + rd, R = cfg->kv_lora_rank;
    int32_t u = (int32_t)i;
    double std = cfg->init_std;
    char n[160];
    gt_value_id wq = GT_NONE, wq_a = GT_NONE, q_norm = GT_NONE, wq_b = GT_NONE;
    if (cfg->q_lora_rank == 0) {
        wq = linear(c, NAME(n, "attention.wq.weight", i), GT_TP_COLWISE, i, H * qk, D, std);
    } else {
        wq_a =
            linear(c, NAME(n, "attention.wq_a.weight", i), GT_TP_NONE, i, cfg->q_lora_rank, D, std);
        q_norm = norm_param(c, NAME(n, "attention.q_norm.weight", i), u, cfg->q_lora_rank);
        wq_b = linear(c, NAME(n, "attention.wq_b.weight", i), GT_TP_COLWISE, i, H * qk,
                      cfg->q_lora_rank, std);
    }
    gt_value_id wkv_a =
        linear(c, NAME(n, "attention.wkv_a.weight", i), GT_TP_NONE, i, R + rd, D, std);
    gt_value_id kv_norm = norm_param(c, NAME(n, "attention.kv_norm.weight", i), u, R);
    gt_value_id wkv_b =
        linear(c, NAME(n, "attention.wkv_b.weight", i), GT_TP_COLWISE, i, H * (nope + vd), R, std);
    gt_value_id wo =
        linear(c, NAME(n, "attention.wo.weight", i), GT_TP_ROWWISE, i, D, H * vd, depth_std(c, i));

    gt_value_id q;
    if (cfg->q_lora_rank == 0) {
        q = proj(c, "layers.%lld.attention.wq", i, x, wq);
    } else {
        q = proj(c, "layers.%lld.attention.wq_a", i, x, wq_a);
        set_fqn(g, "layers.%lld.attention.q_norm", i);
        q = gt_rms_norm(g, q, weight(c, q_norm), cfg->norm_eps);
        q = proj(c, "layers.%lld.attention.wq_b", i, q, wq_b);
    }
    set_fqn(g, "layers.%lld.attention", i);
    gt_expr heads_qk[4] = {c->b, c->s, gt_c(g, H), gt_c(g, qk)};
    q = gt_reshape(g, q, 4, heads_qk);
    gt_value_id qs[2];
    gt_expr q_split[2] = {gt_c(g, nope), gt_c(g, rd)};
    gt_split(g, q, 3, 2, q_split, qs);
    qs[1] = rope(c, i, qs[1]);
    set_fqn(g, "layers.%lld.attention", i);
    q = gt_concat(g, 2, qs, 3);

    gt_value_id kv = proj(c, "layers.%lld.attention.wkv_a", i, x, wkv_a);
    set_fqn(g, "layers.%lld.attention", i);
    gt_value_id kvs[2];
    gt_expr kv_split[2] = {gt_c(g, R), gt_c(g, rd)};
    gt_split(g, kv, 2, 2, kv_split, kvs);
    gt_expr one_head[4] = {c->b, c->s, gt_c(g, 1), gt_c(g, rd)};
    gt_value_id k_pe = rope(c, i, gt_reshape(g, kvs[1], 4, one_head));
    set_fqn(g, "layers.%lld.attention.kv_norm", i);
    kv = gt_rms_norm(g, kvs[0], weight(c, kv_norm), cfg->norm_eps);
    kv = proj(c, "layers.%lld.attention.wkv_b", i, kv, wkv_b);
    set_fqn(g, "layers.%lld.attention", i);
    gt_expr heads_kv[4] = {c->b, c->s, gt_c(g, H), gt_c(g, nope + vd)};
    kv = gt_reshape(g, kv, 4, heads_kv);
    gt_value_id kn_v[2];
    gt_expr kv_heads_split[2] = {gt_c(g, nope), gt_c(g, vd)};
    gt_split(g, kv, 3, 2, kv_heads_split, kn_v);
    gt_expr pe_heads[4] = {c->b, c->s, gt_c(g, H), gt_c(g, rd)};
    gt_value_id ks[2] = {kn_v[0], gt_broadcast_to(g, k_pe, 4, pe_heads)};
    gt_value_id k = gt_concat(g, 2, ks, 3);

    set_fqn(g, "layers.%lld.attention.sdpa", i);
    gt_value_id a = gt_sdpa_docs(g, q, k, kn_v[1], c->positions, true,
                                 gt_deepseek_v3_softmax_scale(cfg), 1, NULL);
    set_fqn(g, "layers.%lld.attention.wo", i);
    gt_expr merged[3] = {c->b, c->s, gt_c(g, H * vd)};
    a = gt_reshape(g, a, 3, merged);
    return gt_matmul(g, a, weight(c, wo), false, true);
}

/* SwiGLU (silu(x w1ᵀ) ⊙ x w3ᵀ) w2ᵀ of module "layers.i.<mod>" (feed_forward or
 * moe.shared_experts): w1 trunc_normal(std), w2 and w3 depth-scaled, as torchtitan's
 * make_ffn_config. x: [..., D]. */
static gt_value_id swiglu(dsv3_ctx *c, int64_t i, const char *mod, gt_value_id x, int64_t hidden)
{
    gt_graph *g = c->g;
    int64_t D = c->cfg->dim;
    char n[160], m[160];
    snprintf(n, sizeof n, "layers.%lld.%s.w1.weight", (long long)i, mod);
    gt_value_id w1 = linear(c, n, GT_TP_COLWISE, i, hidden, D, c->cfg->init_std);
    snprintf(n, sizeof n, "layers.%lld.%s.w2.weight", (long long)i, mod);
    gt_value_id w2 = linear(c, n, GT_TP_ROWWISE, i, D, hidden, depth_std(c, i));
    snprintf(n, sizeof n, "layers.%lld.%s.w3.weight", (long long)i, mod);
    gt_value_id w3 = linear(c, n, GT_TP_COLWISE, i, hidden, D, depth_std(c, i));
    snprintf(m, sizeof m, "layers.%%lld.%s.w1", mod);
    gt_value_id gate = proj(c, m, i, x, w1);
    snprintf(m, sizeof m, "layers.%%lld.%s.w3", mod);
    gt_value_id up = proj(c, m, i, x, w3);
    snprintf(m, sizeof m, "layers.%%lld.%s", mod);
    set_fqn(g, m, i);
    gt_value_id act = gt_mul(g, gt_unary(g, GT_OP_SILU, gate), up);
    snprintf(m, sizeof m, "layers.%%lld.%s.w2", mod);
    return proj(c, m, i, act, w2);
}

/* Tags nodes [first, g->n_nodes) with tag. */
static void tag_since(gt_graph *g, int32_t first, const char *tag)
{
    for (int32_t n = first; n < g->n_nodes; n++)
        gt_graph_add_tag(g, n, tag);
}

/* --debug.moe_force_load_balance: torchtitan's _debug_force_load_balance_routing, ids[t, j] =
 * (t·K + j) mod E, exactly balanced. graphtrain has no iota op, so the arange comes from a stable
 * sort: moe_sort of E zero ids (one expert) orders them as 0 .. E − 1; that row, tiled over
 * ceil(T·K / E) rows, flattened and cut to T·K, is the round robin. */
static gt_value_id round_robin_ids(dsv3_ctx *c)
{
    gt_graph *g = c->g;
    int64_t E = c->cfg->n_experts, K = c->cfg->top_k;
    gt_expr e1[2] = {gt_c(g, E), gt_c(g, 1)};
    gt_value_id token, offsets;
    gt_value_id arange = gt_moe_sort(g, gt_full(g, GT_I32, 2, e1, 0.0), 1, &token, &offsets);
    gt_expr n = gt_sym_mul(g->sym, c->bs, gt_c(g, K));
    gt_expr rows = gt_sym_floordiv(g->sym, gt_sym_add(g->sym, n, gt_c(g, E - 1)), gt_c(g, E));
    gt_expr one_row[2] = {gt_c(g, 1), gt_c(g, E)}, tiled[2] = {rows, gt_c(g, E)};
    gt_expr flat = gt_sym_mul(g->sym, rows, gt_c(g, E)), tk[2] = {c->bs, gt_c(g, K)};
    gt_value_id ids = gt_broadcast_to(g, gt_reshape(g, arange, 2, one_row), 2, tiled);
    ids = gt_slice(g, gt_reshape(g, ids, 1, &flat), 0, gt_c(g, 0), n);
    return gt_reshape(g, ids, 2, tk);
}

/* The routing: ids i32[T, K] and their weights f32[T, K] from xf [T, D] (compute dtype). */
static gt_value_id route(dsv3_ctx *c, int64_t i, gt_value_id xf, gt_value_id gate, gt_value_id bias,
                         gt_value_id *weights)
{
    gt_graph *g = c->g;
    const gt_deepseek_v3_config *cfg = c->cfg;
    int64_t E = cfg->n_experts, K = cfg->top_k;
    set_fqn(g, "layers.%lld.moe.router.gate", i);
    gt_value_id x32 = cfg->compute_dtype == GT_F32 ? xf : gt_cast(g, xf, GT_F32);
    gt_value_id scores = gt_matmul(g, x32, gate, false, true); /* f32 gate: no cast */
    set_fqn(g, "layers.%lld.moe.router", i);
    scores = cfg->score_func == GT_DSV3_SCORE_SIGMOID ? gt_unary(g, GT_OP_SIGMOID, scores)
                                                      : gt_softmax(g, scores, -1);
    /* the bias steers the choice only; the weights come from the scores */
    gt_value_id ids = cfg->force_load_balance
                          ? round_robin_ids(c)
                          : gt_moe_topk(g, gt_add(g, scores, bias), (int)K,
                                        (int)cfg->n_expert_groups, (int)cfg->n_limited_groups);
    gt_value_id w = gt_gather_last(g, scores, ids);
    if (cfg->route_norm) {
        int last = 1;
        gt_value_id sum = gt_reduce(g, GT_OP_SUM, w, 1, &last, true);
        w = gt_div(g, w, gt_add_scalar(g, sum, 1e-20));
    }
    if (cfg->route_scale != 1.0) w = gt_scale(g, w, cfg->route_scale);
    (void)E;
    *weights = w;
    return ids;
}

/* MoE of layer i on x [b, s, D]; its bias input and counts into c->bias_out, c->counts_out. */
static gt_value_id moe_body(dsv3_ctx *c, int64_t i, gt_value_id x)
{
    gt_graph *g = c->g;
    const gt_deepseek_v3_config *cfg = c->cfg;
    int64_t D = cfg->dim, E = cfg->n_experts, K = cfg->top_k, F = cfg->moe_hidden;
    int32_t u = (int32_t)i;
    char n[160];
    gt_value_id gate = param(c, NAME(n, "moe.router.gate.weight", i), GT_TP_NONE, u, 2, E, D, 0,
                             GT_INIT_TRUNC_NORMAL, depth_std(c, i));
    gt_value_id w1 = param(c, NAME(n, "moe.routed_experts.inner_experts.w1_EFD", i), GT_TP_NONE, u,
                           3, E, F, D, GT_INIT_TRUNC_NORMAL, cfg->init_std);
    gt_value_id w2 = param(c, NAME(n, "moe.routed_experts.inner_experts.w2_EDF", i), GT_TP_NONE, u,
                           3, E, D, F, GT_INIT_TRUNC_NORMAL, depth_std(c, i));
    gt_value_id w3 = param(c, NAME(n, "moe.routed_experts.inner_experts.w3_EFD", i), GT_TP_NONE, u,
                           3, E, F, D, GT_INIT_TRUNC_NORMAL, depth_std(c, i));
    const gt_value_id experts[3] = {w1, w2, w3};
    for (int k = 0; k < 3; k++) { /* expert parallel stores them whole (parallel/layout.c) */
        gt_param_plan pl = gt_graph_input_plan(g, experts[k]);
        pl.role = GT_ROLE_EXPERT;
        gt_graph_set_input_plan(g, experts[k], pl);
    }
    /* the load-balancing bias: state carried between steps, zeros at the start (torchtitan's
     * persistent buffer expert_bias_E) */
    gt_expr e_dim = gt_c(g, E);
    gt_value_id bias = find_input(g, GT_IN_BUFFER, NAME(n, "moe.expert_bias_E", i));
    if (bias == GT_NONE) {
        bias = gt_graph_add_input(g, GT_IN_BUFFER, n, GT_F32, 1, &e_dim);
        gt_graph_set_input_plan(g, bias, (gt_param_plan){.unit = u});
    }

    set_fqn(g, "layers.%lld.moe", i);
    gt_expr flat[2] = {c->bs, gt_c(g, D)};
    gt_value_id xf = gt_reshape(g, x, 2, flat);

    int32_t first = g->n_nodes;
    gt_value_id w, ids = route(c, i, xf, gate, bias, &w);
    set_fqn(g, "layers.%lld.moe", i);
    c->bias_out = bias;
    c->counts_out = gt_moe_count(g, ids, (int)E);
    gt_value_id token, offsets, order = gt_moe_sort(g, ids, (int)E, &token, &offsets);
    set_fqn(g, "layers.%lld.moe.routed_experts", i);
    gt_value_id xs = gt_embedding(g, xf, token); /* [T·K, D] in (expert, token, k) order */
    tag_since(g, first, "moe.dispatch");

    first = g->n_nodes;
    set_fqn(g, "layers.%lld.moe.routed_experts.inner_experts", i);
    gt_value_id h1 = gt_grouped_matmul(g, xs, weight(c, w1), offsets, true);
    gt_value_id h3 = gt_grouped_matmul(g, xs, weight(c, w3), offsets, true);
    gt_value_id h = gt_mul(g, gt_unary(g, GT_OP_SILU, h1), h3);
    gt_value_id y = gt_grouped_matmul(g, h, weight(c, w2), offsets, true);
    tag_since(g, first, "moe.experts");

    first = g->n_nodes;
    set_fqn(g, "layers.%lld.moe.routed_experts", i);
    /* each sorted row's weight: w flattened [T·K] read at order (w as a [T·K, 1] table) */
    gt_expr tk1[2] = {gt_sym_mul(g->sym, c->bs, gt_c(g, K)), gt_c(g, 1)};
    gt_value_id ws = gt_embedding(g, gt_reshape(g, w, 2, tk1), order);
    gt_value_id y32 = cfg->compute_dtype == GT_F32 ? y : gt_cast(g, y, GT_F32);
    gt_value_id yw = gt_mul(g, y32, ws);
    if (cfg->compute_dtype != GT_F32) yw = gt_cast(g, yw, cfg->compute_dtype);
    gt_value_id routed = gt_embedding_backward(g, token, yw, c->bs); /* [T, D] */
    tag_since(g, first, "moe.combine");

    gt_value_id out = routed;
    if (cfg->n_shared_experts > 0) {
        gt_value_id shared = swiglu(c, i, "moe.shared_experts", xf, F * cfg->n_shared_experts);
        set_fqn(g, "layers.%lld.moe", i);
        out = gt_add(g, routed, shared);
    }
    set_fqn(g, "layers.%lld.moe", i);
    gt_expr back[3] = {c->b, c->s, gt_c(g, D)};
    return gt_reshape(g, out, 3, back);
}

typedef gt_value_id (*dsv3_module)(dsv3_ctx *c, int64_t i, gt_value_id x);

/* x [n, ...] cut in two along dim 0 (the batch) as the chunking pass cuts it: rows [0, n // 2)
 * and the rest; with groups G > 1 (data parallelism: n holds G ranks' batches of m = n // G rows)
 * each rank's block at m // 2 — regrouped to [G, m, ...], sliced along dim 1, each piece back to
 * [G·m_k, ...] (src/passes/ep_chunk.c says why regroup). part: the chunks' sizes. */
static void cut_batch(dsv3_ctx *c, gt_value_id x, const gt_expr part[2], gt_value_id xs[2])
{
    gt_graph *g = c->g;
    gt_type t = *gt_value_type(g, x);
    int64_t G = c->cfg->chunk.groups;
    if (G <= 1) {
        xs[0] = gt_slice(g, x, 0, gt_c(g, 0), part[0]);
        xs[1] = gt_slice(g, x, 0, part[0], t.dims[0]);
        return;
    }
    gt_expr m = gt_sym_floordiv(g->sym, t.dims[0], gt_c(g, G)), dims[GT_MAX_DIMS + 1];
    gt_expr edge[3] = {gt_c(g, 0), gt_sym_floordiv(g->sym, m, gt_c(g, 2)), m};
    dims[0] = gt_c(g, G), dims[1] = m;
    for (int j = 1; j < t.ndim; j++)
        dims[j + 1] = t.dims[j];
    gt_value_id blocks = gt_regroup(g, x, t.ndim + 1, dims);
    for (int k = 0; k < 2; k++) {
        t.dims[0] = part[k];
        xs[k] = gt_reshape(g, gt_slice(g, blocks, 1, edge[k], edge[k + 1]), t.ndim, t.dims);
    }
}

/* The inverse of cut_batch: the chunks' outputs joined into [n, ...]. */
static gt_value_id join_batch(dsv3_ctx *c, const gt_value_id ys[2], gt_expr n)
{
    gt_graph *g = c->g;
    int64_t G = c->cfg->chunk.groups;
    if (G <= 1) return gt_concat(g, 2, ys, 0);
    gt_type t = *gt_value_type(g, ys[0]);
    gt_expr dims[GT_MAX_DIMS + 1];
    dims[0] = gt_c(g, G);
    for (int j = 1; j < t.ndim; j++)
        dims[j + 1] = t.dims[j];
    gt_value_id blocks[2];
    for (int k = 0; k < 2; k++) {
        dims[1] = gt_sym_floordiv(g->sym, gt_value_type(g, ys[k])->dims[0], gt_c(g, G));
        blocks[k] = gt_reshape(g, ys[k], t.ndim + 1, dims);
    }
    t.dims[0] = n;
    return gt_regroup(g, gt_concat(g, 2, blocks, 1), t.ndim, t.dims);
}

/* Eager chunking (compile.ep_overlap, strategy eager): module fn of layer i built once per chunk
 * of x [b, s, D] — the batch in two (dim 0; each data-parallel rank's own, cut_batch) or, seq,
 * the sequence (dim 1), cut at n // 2 as the chunking pass cuts — the outputs joined along that
 * dim and the chunks' token counts added. */
static gt_value_id chunked(dsv3_ctx *c, int64_t i, gt_value_id x, bool seq, dsv3_module fn)
{
    gt_graph *g = c->g;
    gt_expr n = seq ? c->s : c->b, b = c->b, s = c->s, bs = c->bs;
    int64_t G = !seq && c->cfg->chunk.groups > 1 ? c->cfg->chunk.groups : 1;
    /* the chunks' sizes: n // 2 and the rest, or G·(m // 2) and G·(m - m // 2), m = n // G */
    gt_expr m = gt_sym_floordiv(g->sym, n, gt_c(g, G));
    gt_expr part[2] = {gt_sym_floordiv(g->sym, m, gt_c(g, 2)), GT_EXPR_INVALID};
    part[1] = G == 1 ? gt_sym_sub(g->sym, n, part[0])
                     : gt_sym_mul(g->sym, gt_c(g, G), gt_sym_sub(g->sym, m, part[0]));
    if (G > 1) part[0] = gt_sym_mul(g->sym, gt_c(g, G), part[0]);
    int dim = seq ? 1 : 0;
    gt_value_id xs[2];
    if (seq)
        xs[0] = gt_slice(g, x, dim, gt_c(g, 0), part[0]), xs[1] = gt_slice(g, x, dim, part[0], n);
    else
        cut_batch(c, x, part, xs);
    /* the documents' positions ([b, s], block_causal) go with their tokens */
    gt_value_id pos = c->positions, ps[2] = {GT_NONE, GT_NONE};
    if (pos != GT_NONE && seq)
        ps[0] = gt_slice(g, pos, dim, gt_c(g, 0), part[0]),
        ps[1] = gt_slice(g, pos, dim, part[0], n);
    else if (pos != GT_NONE)
        cut_batch(c, pos, part, ps);
    gt_value_id out[2], counts[2];
    for (int k = 0; k < 2; k++) {
        c->b = seq ? b : part[k];
        c->s = seq ? part[k] : s;
        c->bs = gt_sym_mul(g->sym, c->b, c->s);
        c->positions = ps[k];
        out[k] = fn(c, i, xs[k]);
        counts[k] = c->counts_out;
    }
    c->b = b, c->s = s, c->bs = bs, c->positions = pos;
    gt_value_id joined = seq ? gt_concat(g, 2, out, dim) : join_batch(c, out, n);
    c->counts_out = gt_add(g, counts[0], counts[1]);
    return joined;
}

/* The MoE of layer i, chunked under eager chunking of each MoE; its bias and counts recorded. */
static gt_value_id moe(dsv3_ctx *c, int64_t i, gt_value_id x)
{
    gt_model *m = c->model;
    const gt_model_chunking *ch = &c->cfg->chunk;
    gt_value_id out =
        ch->enabled && ch->moe_only ? chunked(c, i, x, ch->seq, moe_body) : moe_body(c, i, x);
    m->moe_bias[m->n_moe] = c->bias_out;
    m->moe_counts[m->n_moe++] = c->counts_out;
    return out;
}

static gt_value_id block_body(dsv3_ctx *c, int64_t i, gt_value_id h)
{
    gt_graph *g = c->g;
    const gt_deepseek_v3_config *cfg = c->cfg;
    char n[160];
    int32_t u = (int32_t)i;
    gt_value_id attn_norm = norm_param(c, NAME(n, "attention_norm.weight", i), u, cfg->dim);
    gt_value_id ffn_norm = norm_param(c, NAME(n, "ffn_norm.weight", i), u, cfg->dim);
    set_fqn(g, "layers.%lld.attention_norm", i);
    gt_value_id x = gt_rms_norm(g, h, weight(c, attn_norm), cfg->norm_eps);
    gt_value_id a = attention(c, i, x);
    set_fqn(g, "layers.%lld", i);
    h = gt_add(g, h, a);
    set_fqn(g, "layers.%lld.ffn_norm", i);
    x = gt_rms_norm(g, h, weight(c, ffn_norm), cfg->norm_eps);
    gt_value_id f = i < cfg->n_dense_layers ? swiglu(c, i, "feed_forward", x, cfg->dense_hidden)
                    : c->cfg->chunk.enabled && !c->cfg->chunk.moe_only ? moe_body(c, i, x)
                                                                       : moe(c, i, x);
    set_fqn(g, "layers.%lld", i);
    return gt_add(g, h, f);
}

/* Block i; under eager chunking of each MoE block (layers.*) a MoE block is built per chunk. */
static gt_value_id block(dsv3_ctx *c, int64_t i, gt_value_id h)
{
    const gt_model_chunking *ch = &c->cfg->chunk;
    if (!ch->enabled || ch->moe_only || i < c->cfg->n_dense_layers) return block_body(c, i, h);
    set_fqn(c->g, "layers.%lld", i);
    gt_value_id out = chunked(c, i, h, false, block_body);
    gt_model *m = c->model;
    m->moe_bias[m->n_moe] = c->bias_out;
    m->moe_counts[m->n_moe++] = c->counts_out;
    return out;
}

/* PARAM inputs the builder adds (the arrays' sizes). */
static int64_t n_param_inputs(const gt_deepseek_v3_config *cfg)
{
    /* wq or (wq_a, q_norm, wq_b); wkv_a, kv_norm, wkv_b, wo */
    int64_t attn = cfg->q_lora_rank == 0 ? 5 : 7;
    int64_t moe = 4 + (cfg->n_shared_experts > 0 ? 3 : 0); /* gate, w1/w2/w3, shared */
    return 3 + cfg->n_layers * (2 + attn) + cfg->n_dense_layers * 3 +
           (cfg->n_layers - cfg->n_dense_layers) * moe;
}

gt_status gt_deepseek_v3_build(gt_graph *g, const gt_deepseek_v3_config *cfg, gt_model *model,
                               gt_error *err)
{
    memset(model, 0, sizeof *model);
    GT_TRY(gt_deepseek_v3_check_config(cfg, err));
    int64_t n_params = n_param_inputs(cfg), n_moe = cfg->n_layers - cfg->n_dense_layers;
    model->params = gt_xcalloc((size_t)n_params, sizeof *model->params);
    model->moe_bias = gt_xcalloc((size_t)n_moe + 1, sizeof *model->moe_bias);
    model->moe_counts = gt_xcalloc((size_t)n_moe + 1, sizeof *model->moe_counts);
    model->moe_bias_coeff = cfg->load_balance_coeff;
    dsv3_ctx c = {.g = g, .cfg = cfg, .model = model};
    c.b = gt_sym_var(g->sym, "batch");
    c.s = gt_sym_var(g->sym, "seq");
    c.bs = gt_sym_mul(g->sym, c.b, c.s);
    int64_t D = cfg->dim, V = cfg->vocab_size;

    gt_expr tok_dims[2] = {c.b, c.s};
    model->tokens = gt_graph_add_input(g, GT_IN_INPUT, "tokens", GT_I64, 2, tok_dims);
    model->labels = gt_graph_add_input(g, GT_IN_INPUT, "labels", GT_I64, 2, tok_dims);
    c.positions = cfg->block_causal
                      ? gt_graph_add_input(g, GT_IN_INPUT, "positions", GT_I64, 2, tok_dims)
                      : GT_NONE;

    gt_value_id tok = param(&c, "tok_embeddings.weight", GT_TP_COLWISE, GT_UNIT_EMBED, 2, V, D, 0,
                            GT_INIT_NORMAL, 1.0);
    gt_graph_set_input_plan(
        g, tok,
        (gt_param_plan){
            .tp = GT_TP_COLWISE, .role = GT_ROLE_EMBEDDING, .as_param = 1, .unit = GT_UNIT_EMBED});
    gt_graph_set_fqn(g, "tok_embeddings");
    gt_graph_set_unit(g, GT_UNIT_EMBED);
    gt_value_id h = gt_embedding(g, weight(&c, tok), model->tokens);

    for (int64_t i = 0; i < cfg->n_layers; i++)
        h = block(&c, i, h);

    gt_value_id norm_w = norm_param(&c, "norm.weight", GT_UNIT_REST, D);
    /* lm_head: trunc_normal with std dim^-1/2 cut at ±3 std */
    double out_std = 1.0 / sqrt((double)D);
    gt_value_id out_w = param(&c, "lm_head.weight", GT_TP_COLWISE, GT_UNIT_REST, 2, V, D, 0,
                              GT_INIT_TRUNC_NORMAL, out_std);
    model->params[model->n_params - 1].lo = -3.0 * out_std;
    model->params[model->n_params - 1].hi = 3.0 * out_std;
    gt_graph_set_input_plan(
        g, out_w,
        (gt_param_plan){
            .tp = GT_TP_COLWISE, .role = GT_ROLE_OUTPUT, .as_param = 1, .unit = GT_UNIT_REST});
    GT_CHECK(model->n_params == n_params && model->n_moe == n_moe);

    gt_graph_set_fqn(g, "norm");
    gt_graph_set_unit(g, GT_UNIT_REST);
    h = gt_rms_norm(g, h, weight(&c, norm_w), cfg->norm_eps);
    gt_graph_set_fqn(g, "lm_head");
    gt_value_id logits = gt_matmul(g, h, weight(&c, out_w), false, true);
    gt_expr flat_logits[2] = {c.bs, gt_c(g, V)};
    model->logits = gt_reshape(g, logits, 2, flat_logits);
    gt_graph_set_fqn(g, "loss");
    gt_value_id labels = gt_reshape(g, model->labels, 1, &c.bs);
    model->loss = gt_cross_entropy(g, model->logits, labels, -100);
    gt_graph_set_fqn(g, NULL);

    return gt_model_finish_build(g, model, "deepseek_v3", cfg->flavor, err);
}

/* ---------------------------------------------------------------- the family (gt_model.h) */

static gt_status family_flavor(const char *flavor, void *cfg, gt_error *err)
{
    return gt_deepseek_v3_flavor(flavor, cfg, err);
}

static gt_deepseek_v3_config config_of(const gt_model_config *mc)
{
    gt_deepseek_v3_config cfg;
    memcpy(&cfg, mc->cfg, sizeof cfg);
    cfg.compute_dtype = mc->compute_dtype;
    cfg.force_load_balance = mc->moe_force_load_balance;
    cfg.chunk = mc->chunk;
    cfg.block_causal = mc->block_causal;
    return cfg;
}

static void family_info(const gt_model_config *mc, gt_model_info *info)
{
    gt_deepseek_v3_config cfg = config_of(mc);
    info->vocab_size = cfg.vocab_size;
    info->max_seq_len = cfg.max_seq_len;
    info->n_layers = cfg.n_layers;
    /* torchtitan's get_moe_model_nparams_and_flops: 12 · L · H · (qk_head_dim + v_head_dim) / 2 */
    info->attention_flops_per_position =
        6.0 * (double)cfg.n_layers * (double)cfg.n_heads *
        (double)(cfg.qk_nope_head_dim + cfg.qk_rope_head_dim + cfg.v_head_dim);
    info->active_params = gt_deepseek_v3_active_param_count(&cfg);
}

static gt_status family_build(gt_graph *g, const gt_model_config *mc, gt_model *model,
                              gt_error *err)
{
    gt_deepseek_v3_config cfg = config_of(mc);
    return gt_deepseek_v3_build(g, &cfg, model, err);
}

static gt_status family_hf_export(const gt_model_config *mc, const gt_model *m,
                                  const gt_tensor *params, const char *dir,
                                  const gt_export_hf_options *opts, gt_error *err)
{
    gt_deepseek_v3_config cfg = config_of(mc);
    return gt_export_hf_deepseek_v3(&cfg, m, params, dir, opts, err);
}

static gt_status family_hf_import(const gt_model_config *mc, const char *config_json, size_t len,
                                  const char *name, gt_error *err)
{
    gt_deepseek_v3_config cfg = config_of(mc);
    return gt_import_hf_deepseek_v3_check(&cfg, config_json, len, name, err);
}

const gt_model_family gt_deepseek_v3_family = {
    .name = "deepseek_v3",
    .flavors = gt_deepseek_v3_flavor_list,
    .config_size = sizeof(gt_deepseek_v3_config),
    .flavor = family_flavor,
    .info = family_info,
    .build = family_build,
    .hf_name = gt_export_hf_deepseek_v3_name,
    .hf_export = family_hf_export,
    .hf_import = family_hf_import,
};
