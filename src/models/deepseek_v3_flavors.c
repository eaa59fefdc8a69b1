/* deepseek_v3_flavors.c — the named deepseek_v3 configurations (torchtitan 0.3.0's
 * models/deepseek_v3/__init__.py: debugmodel, 16B, 236B, 671B, without MTP layers), the small test
 * flavors of the fixtures (tools/gen_dsv3_fixtures.py's TINY and QLORA shapes), the config checks
 * and the parameter counts.
 *
 * Every flavor shares qk_nope 128 / qk_rope 64 / v 128 head dims (the test flavors shrink them),
 * kv_lora_rank 512, YaRN RoPE (θ 10000, factor 40, beta_fast 32, beta_slow 1, original length
 * 4096, max_seq_len 4096·4), RMSNorm eps 1e-5, init std 0.02 and load_balance_coeff 1e-3. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "graphtrain/gt_deepseek_v3.h"

typedef struct {
    const char *name;
    int64_t dim, n_layers, n_dense_layers, vocab_size, n_heads;
    int64_t q_lora_rank, kv_lora_rank, qk_nope, qk_rope, v_head;
    int64_t dense_hidden, moe_hidden, n_experts, n_shared, top_k;
    gt_dsv3_score_func score;
    int64_t n_groups, n_limited;
    int route_norm;
    double route_scale, mscale;
} dsv3_row;

#define SOFTMAX GT_DSV3_SCORE_SOFTMAX
#define SIGMOID GT_DSV3_SCORE_SIGMOID
static const dsv3_row dsv3_rows[] = {
    /* name, dim, layers, dense layers, vocab, heads, q_lora, kv_lora, nope, rope, v,
     * dense hidden, moe hidden, experts, shared, top_k, scores, groups, kept groups,
     * route_norm, route_scale, mscale */
    {"debugmodel", 256, 6, 1, 2048, 16,      0, 512, 128, 64,  128,
     1024,         256, 8, 2, 3,    SOFTMAX, 0, 0,   0,   1.0, 0.70},
    {"16B", 2048, 27, 1, 102400, 16,      0, 512, 128, 64,  128,
     10944, 1408, 64, 2, 6,      SOFTMAX, 0, 0,   0,   1.0, 0.70},
    /* 16B cut to its first 4 layers (1 dense + 3 MoE): the one-GPU benchmark shape, as the
     * torchtitan peer (../shared/peers/torchtitan_deepseek_v3.py 16B 4 ...) */
    {"16B_4layers", 2048, 4,  1, 102400, 16,      0, 512, 128, 64,  128,
     10944,         1408, 64, 2, 6,      SOFTMAX, 0, 0,   0,   1.0, 0.70},
    {"236B", 5120, 60,  1, 102400, 128,     1536, 512, 128, 64,   128,
     12288,  1536, 160, 2, 6,      SOFTMAX, 8,    3,   0,   16.0, 1.0},
    {"671B", 7168, 61,  3, 129280, 128,     1536, 512, 128, 64,  128,
     18432,  2048, 256, 1, 8,      SIGMOID, 8,    4,   1,   2.5, 1.0},
    /* fixtures: q_lora 0 with softmax routing; q_lora > 0 with sigmoid, group-limited routing,
     * route_norm and route_scale after a dense first layer (671B's router at tiny size). The
     * rope dim 8 puts YaRN's ramp (low 1, high 3) inside the pairs, so every regime is hit. */
    {"test_dsv3_tiny", 32, 2, 1, 128, 4,   0, 32, 16, 8, 16, 64, 16, 8, 1, 2,
     SOFTMAX,          0,  0, 0, 1.0, 0.70},
    /* test_dsv3_tiny routed by sigmoid: what Hugging Face's DeepseekV3 can express */
    {"test_dsv3_tiny_sigmoid",
     32,
     2,
     1,
     128,
     4,
     0,
     32,
     16,
     8,
     16,
     64,
     16,
     8,
     1,
     2,
     SIGMOID,
     0,
     0,
     0,
     1.0,
     0.70},
    {"test_dsv3_qlora", 32, 3, 1, 128, 4,  16, 32, 16, 8, 16, 64, 16, 8, 1, 3,
     SIGMOID,           4,  2, 1, 2.5, 1.0},
};
#undef SOFTMAX
#undef SIGMOID
#define DSV3_N_ROWS ((int)(sizeof dsv3_rows / sizeof dsv3_rows[0]))

const char *const gt_deepseek_v3_flavor_list[] = {
    "debugmodel",
    "16B",
    "16B_4layers",
    "236B",
    "671B",
    "test_dsv3_tiny",
    "test_dsv3_tiny_sigmoid",
    "test_dsv3_qlora",
    NULL,
};

gt_status gt_deepseek_v3_flavor(const char *flavor, gt_deepseek_v3_config *cfg, gt_error *err)
{
    const dsv3_row *r = NULL;
    for (int k = 0; flavor && k < DSV3_N_ROWS; k++)
        if (strcmp(flavor, dsv3_rows[k].name) == 0) r = &dsv3_rows[k];
    if (!r) return gt_model_unknown_flavor("deepseek_v3", flavor, gt_deepseek_v3_flavor_list, err);
    memset(cfg, 0, sizeof *cfg);
    snprintf(cfg->flavor, sizeof cfg->flavor, "%s", r->name);
    cfg->dim = r->dim;
    cfg->n_layers = r->n_layers;
    cfg->n_dense_layers = r->n_dense_layers;
    cfg->vocab_size = r->vocab_size;
    cfg->n_heads = r->n_heads;
    cfg->q_lora_rank = r->q_lora_rank;
    cfg->kv_lora_rank = r->kv_lora_rank;
    cfg->qk_nope_head_dim = r->qk_nope;
    cfg->qk_rope_head_dim = r->qk_rope;
    cfg->v_head_dim = r->v_head;
    cfg->dense_hidden = r->dense_hidden;
    cfg->moe_hidden = r->moe_hidden;
    cfg->n_experts = r->n_experts;
    cfg->n_shared_experts = r->n_shared;
    cfg->top_k = r->top_k;
    cfg->score_func = r->score;
    cfg->n_expert_groups = r->n_groups;
    cfg->n_limited_groups = r->n_limited;
    cfg->route_norm = r->route_norm;
    cfg->route_scale = r->route_scale;
    cfg->mscale = r->mscale;
    cfg->rope_theta = 10000.0;
    cfg->rope_factor = 40.0;
    cfg->rope_beta_fast = 32.0;
    cfg->rope_beta_slow = 1.0;
    cfg->rope_original_seq_len = 4096;
    cfg->max_seq_len = 4096 * 4;
    cfg->norm_eps = 1e-5;
    cfg->init_std = 0.02;
    cfg->load_balance_coeff = 1e-3;
    return GT_OK;
}

#define BAD(...) gt_error_set(err, GT_ERR_INVALID, __VA_ARGS__)

gt_status gt_deepseek_v3_check_config(const gt_deepseek_v3_config *c, gt_error *err)
{
    const char *f = c->flavor[0] ? c->flavor : "(unnamed)";
    const struct {
        const char *key;
        int64_t v;
    } pos[] = {{"dim", c->dim},
               {"n_layers", c->n_layers},
               {"vocab_size", c->vocab_size},
               {"n_heads", c->n_heads},
               {"kv_lora_rank", c->kv_lora_rank},
               {"qk_nope_head_dim", c->qk_nope_head_dim},
               {"qk_rope_head_dim", c->qk_rope_head_dim},
               {"v_head_dim", c->v_head_dim}};
    for (size_t k = 0; k < sizeof pos / sizeof pos[0]; k++)
        if (pos[k].v <= 0)
            return BAD("deepseek_v3 flavor '%s': %s %lld must be > 0", f, pos[k].key,
                       (long long)pos[k].v);
    if (c->n_layers > 100000)
        return BAD("deepseek_v3 flavor '%s': n_layers %lld is too large", f,
                   (long long)c->n_layers);
    if (c->n_dense_layers < 0 || c->n_dense_layers > c->n_layers)
        return BAD("deepseek_v3 flavor '%s': n_dense_layers %lld must lie in [0, n_layers %lld]", f,
                   (long long)c->n_dense_layers, (long long)c->n_layers);
    if (c->q_lora_rank < 0)
        return BAD("deepseek_v3 flavor '%s': q_lora_rank %lld must be >= 0", f,
                   (long long)c->q_lora_rank);
    if (c->qk_rope_head_dim % 2 != 0)
        return BAD("deepseek_v3 flavor '%s': qk_rope_head_dim %lld must be even (RoPE rotates "
                   "pairs)",
                   f, (long long)c->qk_rope_head_dim);
    if (c->n_dense_layers > 0 && c->dense_hidden <= 0)
        return BAD("deepseek_v3 flavor '%s': dense_hidden %lld must be > 0", f,
                   (long long)c->dense_hidden);
    if (c->n_dense_layers < c->n_layers) { /* MoE layers */
        if (c->moe_hidden <= 0 || c->n_experts <= 0 || c->n_shared_experts < 0)
            return BAD("deepseek_v3 flavor '%s': moe_hidden %lld and n_experts %lld must be > 0, "
                       "n_shared_experts %lld >= 0",
                       f, (long long)c->moe_hidden, (long long)c->n_experts,
                       (long long)c->n_shared_experts);
        if (c->top_k <= 0 || c->top_k > c->n_experts)
            return BAD("deepseek_v3 flavor '%s': top_k %lld must lie in [1, n_experts %lld]", f,
                       (long long)c->top_k, (long long)c->n_experts);
        if (c->score_func != GT_DSV3_SCORE_SOFTMAX && c->score_func != GT_DSV3_SCORE_SIGMOID)
            return BAD("deepseek_v3 flavor '%s': score_func %d is neither softmax nor sigmoid", f,
                       (int)c->score_func);
        if (c->n_expert_groups < 0 || (c->n_expert_groups > 1 && c->n_limited_groups <= 0))
            return BAD("deepseek_v3 flavor '%s': n_expert_groups %lld needs n_limited_groups > 0",
                       f, (long long)c->n_expert_groups);
        if (c->n_expert_groups > 1) {
            if (c->n_experts % c->n_expert_groups != 0)
                return BAD("deepseek_v3 flavor '%s': n_experts %lld is not divisible by "
                           "n_expert_groups %lld",
                           f, (long long)c->n_experts, (long long)c->n_expert_groups);
            if (c->n_experts / c->n_expert_groups < 2)
                return BAD("deepseek_v3 flavor '%s': n_expert_groups %lld leaves fewer than 2 "
                           "experts per group (n_experts %lld)",
                           f, (long long)c->n_expert_groups, (long long)c->n_experts);
            if (c->n_limited_groups > c->n_expert_groups)
                return BAD("deepseek_v3 flavor '%s': n_limited_groups %lld exceeds "
                           "n_expert_groups %lld",
                           f, (long long)c->n_limited_groups, (long long)c->n_expert_groups);
            if (c->top_k > c->n_limited_groups * (c->n_experts / c->n_expert_groups))
                return BAD("deepseek_v3 flavor '%s': top_k %lld exceeds the %lld experts of the "
                           "n_limited_groups %lld kept groups",
                           f, (long long)c->top_k,
                           (long long)(c->n_limited_groups * (c->n_experts / c->n_expert_groups)),
                           (long long)c->n_limited_groups);
        }
        if (!(c->route_scale > 0.0))
            return BAD("deepseek_v3 flavor '%s': route_scale must be > 0", f);
        if (!(c->load_balance_coeff >= 0.0))
            return BAD("deepseek_v3 flavor '%s': load_balance_coeff must be >= 0", f);
    }
    if (!(c->norm_eps > 0.0) || !(c->rope_theta > 0.0) || !(c->init_std > 0.0))
        return BAD("deepseek_v3 flavor '%s': norm_eps, rope_theta and init_std must be > 0", f);
    if (!(c->rope_factor > 0.0) || !(c->rope_beta_fast > c->rope_beta_slow) ||
        !(c->rope_beta_slow > 0.0) || c->rope_original_seq_len <= 0)
        return BAD("deepseek_v3 flavor '%s': YaRN needs rope_factor > 0, rope_beta_fast > "
                   "rope_beta_slow > 0 and rope_original_seq_len > 0",
                   f);
    if (c->compute_dtype != GT_F32 && c->compute_dtype != GT_BF16)
        return BAD("deepseek_v3 flavor '%s': compute dtype %s is not supported (f32 or bf16)", f,
                   gt_dtype_name(c->compute_dtype));
    return GT_OK;
}
#undef BAD

/* One layer's attention (MLA) parameters and its two norms. */
static int64_t attention_params(const gt_deepseek_v3_config *c)
{
    int64_t D = c->dim, H = c->n_heads, qk = c->qk_nope_head_dim + c->qk_rope_head_dim;
    int64_t q = c->q_lora_rank == 0 ? D * H * qk
                                    : D * c->q_lora_rank + c->q_lora_rank + c->q_lora_rank * H * qk;
    return q + D * (c->kv_lora_rank + c->qk_rope_head_dim) + c->kv_lora_rank +
           c->kv_lora_rank * H * (c->qk_nope_head_dim + c->v_head_dim) + H * c->v_head_dim * D +
           2 * D;
}

/* routed: how many routed experts to count per MoE layer (n_experts, or top_k for the active
 * count). */
static int64_t count(const gt_deepseek_v3_config *c, int64_t routed)
{
    int64_t D = c->dim, L = c->n_layers, Ld = c->n_dense_layers;
    int64_t moe = D * c->n_experts /* the router gate */ + routed * 3 * c->moe_hidden * D +
                  3 * c->moe_hidden * c->n_shared_experts * D;
    return 2 * c->vocab_size * D + D + L * attention_params(c) + Ld * 3 * c->dense_hidden * D +
           (L - Ld) * moe;
}

int64_t gt_deepseek_v3_param_count(const gt_deepseek_v3_config *c)
{
    return count(c, c->n_experts);
}

int64_t gt_deepseek_v3_active_param_count(const gt_deepseek_v3_config *c)
{
    return count(c, c->top_k);
}

double gt_deepseek_v3_softmax_scale(const gt_deepseek_v3_config *c)
{
    double scale = 1.0 / sqrt((double)(c->qk_nope_head_dim + c->qk_rope_head_dim));
    if (c->rope_factor > 1.0) {
        double m = 0.1 * c->mscale * log(c->rope_factor) + 1.0;
        scale *= m * m;
    }
    return scale;
}
