/* gt_deepseek_v3.h — the deepseek_v3 family (torchtitan 0.3.0's DeepSeekV3Model, no MTP layers):
 * its config, flavors and builder. Callers outside src/models reach it through gt_model.h; tests
 * use it directly. Parameter names are torchtitan 0.3.0's (its state_dict_adapter.py):
 *   tok_embeddings.weight
 *   layers.N.attention_norm.weight, layers.N.ffn_norm.weight
 *   layers.N.attention.{wq | wq_a, q_norm, wq_b}.weight, layers.N.attention.{wkv_a, kv_norm,
 *     wkv_b, wo}.weight
 *   dense layers (N < n_dense_layers): layers.N.feed_forward.{w1, w2, w3}.weight
 *   MoE layers: layers.N.moe.router.gate.weight [E, D],
 *     layers.N.moe.routed_experts.inner_experts.{w1_EFD [E, F, D], w2_EDF [E, D, F], w3_EFD},
 *     layers.N.moe.shared_experts.{w1, w2, w3}.weight,
 *     BUFFER layers.N.moe.expert_bias_E f32[E] (the load-balancing bias, not a parameter)
 *   norm.weight, lm_head.weight */
#ifndef GRAPHTRAIN_GT_DEEPSEEK_V3_H
#define GRAPHTRAIN_GT_DEEPSEEK_V3_H

#include "gt_model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { GT_DSV3_SCORE_SOFTMAX = 0, GT_DSV3_SCORE_SIGMOID } gt_dsv3_score_func;

typedef struct {
    char flavor[32];
    int64_t dim, n_layers, n_dense_layers, vocab_size, n_heads;
    int64_t q_lora_rank; /* 0: one wq projection; > 0: wq_a, q_norm, wq_b */
    int64_t kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim;
    int64_t dense_hidden; /* the dense layers' SwiGLU hidden size */
    int64_t moe_hidden;   /* one expert's hidden size (shared experts: moe_hidden · n_shared) */
    int64_t n_experts, n_shared_experts, top_k;
    gt_dsv3_score_func score_func;
    int64_t n_expert_groups, n_limited_groups; /* 0, 0: no group-limited routing */
    int route_norm;                            /* weights /= their sum + 1e-20 */
    double route_scale;
    double mscale; /* YaRN's mscale_all_dim: folded into the softmax scale */
    /* YaRN RoPE on the qk_rope_head_dim part (interleaved pairs, as torchtitan's ComplexRoPE) */
    double rope_theta, rope_factor, rope_beta_fast, rope_beta_slow;
    int64_t rope_original_seq_len, max_seq_len;
    double norm_eps;           /* 1e-5 */
    double init_std;           /* 0.02 */
    double load_balance_coeff; /* 1e-3; 0 disables the bias update */
    int force_load_balance;    /* --debug.moe_force_load_balance: round-robin routing */
    gt_model_chunking chunk;   /* compile.ep_overlap, strategy eager: each MoE (block) per chunk */
    gt_dtype compute_dtype;    /* GT_F32 or GT_BF16, as llama3 */
    bool block_causal;         /* packed documents, as llama3 (gt_model_config.block_causal) */
} gt_deepseek_v3_config;

extern const gt_model_family gt_deepseek_v3_family;

/* Fills cfg for a named flavor: debugmodel, 16B, 236B, 671B and the test flavors (test_dsv3_tiny,
 * test_dsv3_tiny_sigmoid, test_dsv3_qlora). Unknown name: GT_ERR_INVALID listing the known ones. */
gt_status gt_deepseek_v3_flavor(const char *flavor, gt_deepseek_v3_config *cfg, gt_error *err);
extern const char *const gt_deepseek_v3_flavor_list[];
/* GT_OK when cfg describes a model the builder can build; else GT_ERR_INVALID naming the field. */
gt_status gt_deepseek_v3_check_config(const gt_deepseek_v3_config *cfg, gt_error *err);
/* Parameters (every routed expert), and those a token uses (top_k of n_experts routed experts;
 * torchtitan's active-parameter count), computed from the shapes alone. */
int64_t gt_deepseek_v3_param_count(const gt_deepseek_v3_config *cfg);
int64_t gt_deepseek_v3_active_param_count(const gt_deepseek_v3_config *cfg);
/* YaRN's softmax scale: (qk_nope + qk_rope)^-1/2 · m², m = 0.1·mscale·ln(rope_factor) + 1
 * (m = 1 when rope_factor <= 1). */
double gt_deepseek_v3_softmax_scale(const gt_deepseek_v3_config *cfg);

/* Builds the forward + loss graph on symbolic [batch, seq] (gt_model_family.build's contract)
 * plus, per MoE layer, the BUFFER expert_bias_E and the forward's routed-token counts in
 * model->moe_bias / moe_counts (the step graph appends their update, gt_optim.h). */
gt_status gt_deepseek_v3_build(gt_graph *g, const gt_deepseek_v3_config *cfg, gt_model *model,
                               gt_error *err);

/* Hugging Face (export_hf_dsv3.c, import_hf_dsv3.c). The transformers DeepseekV3 name of a
 * parameter or buffer fqn; for the stacked routed experts a name with '*' where the expert index
 * goes (the tensor's dim 0 is split over mlp.experts.0 .. E-1). */
gt_status gt_export_hf_deepseek_v3_name(const char *fqn, char *out, size_t n, gt_error *err);
/* The model as a DeepseekV3ForCausalLM directory (gt_export_hf_llama3_opts's files and rules):
 * params in m's order, the expert biases from opts->buffers by name (zeros when absent). */
gt_status gt_export_hf_deepseek_v3(const gt_deepseek_v3_config *cfg, const gt_model *m,
                                   const gt_tensor *params, const char *dir,
                                   const gt_export_hf_options *opts, gt_error *err);
/* A transformers config.json (text, len bytes; name for messages) checked against cfg: every
 * size the tensors depend on; a mismatch names the key. */
gt_status gt_import_hf_deepseek_v3_check(const gt_deepseek_v3_config *cfg, const char *text,
                                         size_t len, const char *name, gt_error *err);

#ifdef __cplusplus
}
#endif
#endif
