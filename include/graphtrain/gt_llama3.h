/* gt_llama3.h — the llama3 family (torchtitan's Transformer): its config, flavors, builder and
 * Hugging Face export. Callers outside src/models reach it through gt_model.h; tests use it
 * directly. */
#ifndef GRAPHTRAIN_GT_LLAMA3_H
#define GRAPHTRAIN_GT_LLAMA3_H

#include "gt_model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    char flavor[32];
    int64_t dim, n_layers, n_heads, n_kv_heads, vocab_size;
    int64_t multiple_of;       /* ffn hidden rounding */
    double ffn_dim_multiplier; /* 0 = none */
    int64_t ffn_hidden;        /* derived: round_up(int(m * int(8 * dim / 3)), multiple_of) */
    double norm_eps;           /* 1e-5 */
    double rope_theta;         /* 500000 */
    /* llama3.1 RoPE scaling; original_max_position 0 disables it */
    double rope_factor, rope_low_freq_factor, rope_high_freq_factor;
    int64_t rope_original_max_position;
    int64_t max_seq_len;
    double depth_init_base_std; /* 0.02 */
    /* Dtype the model computes in: GT_F32 (the zero value, so a flavor's default) or GT_BF16.
     * Parameters stay f32 PARAM inputs either way; with GT_BF16 each is cast to bf16 once, where
     * it is used, and every activation is bf16 (torchtitan's FSDP param_dtype; llama3.c says
     * exactly what stays f32). */
    gt_dtype compute_dtype;
    /* Packed documents (false, the zero value: causal over the whole sequence): an INPUT
     * "positions" drives RoPE and a block-causal sdpa (gt_model_config.block_causal). */
    bool block_causal;
} gt_llama3_config;

extern const gt_model_family gt_llama3_family;
/* A transformers config.json (text; name for messages) against cfg (import_hf.c): model_type
 * "llama" and every size the weights depend on; an error names the key, its value and the
 * flavor's. */
gt_status gt_import_hf_llama3_check(const gt_llama3_config *cfg, const char *text, size_t len,
                                    const char *name, gt_error *err);

/* Fills cfg for a named flavor: debugmodel, 1B, 8B, 70B, 405B and the test flavors
 * (test_tiny, test_gqa, test_odd). Unknown name: GT_ERR_INVALID listing the known ones. */
gt_status gt_llama3_flavor(const char *flavor, gt_llama3_config *cfg, gt_error *err);
/* NULL-terminated list of flavor names (gt_llama3_flavor_list is the same array). */
const char *const *gt_llama3_flavor_names(void);
extern const char *const gt_llama3_flavor_list[];
/* Computes ffn_hidden from dim, multiple_of, ffn_dim_multiplier (torchtitan's rule). */
int64_t gt_llama3_ffn_hidden(int64_t dim, int64_t multiple_of, double ffn_dim_multiplier);

/* Builds the llama3 forward + loss graph on symbolic shapes [batch, seq] (symbols "batch" and
 * "seq"): INPUT tokens (i64), INPUT labels (i64, ignore_index -100), PARAMs with torchtitan's fqns
 * (tok_embeddings.weight, layers.N.attention.wq.weight, ..., norm.weight, output.weight), and the
 * LOSS output (mean cross-entropy, f32 whatever cfg->compute_dtype). cfg->compute_dtype must be
 * GT_F32 or GT_BF16 (else GT_ERR_INVALID). Each node's unit is its layer (GT_UNIT_EMBED for the
 * embedding, GT_UNIT_REST after the layers); each parameter carries torchtitan's tensor-parallel
 * plan (wq/wk/wv/w1/w3 colwise, wo/w2 rowwise, embedding and output vocabulary-parallel). */
gt_status gt_llama3_build(gt_graph *g, const gt_llama3_config *cfg, gt_model *model, gt_error *err);

/* Writes the model to DIR as a transformers LlamaForCausalLM: config.json and the weights under
 * transformers' names in model.safetensors, or, past the shard limit, in
 * model-0000k-of-0000n.safetensors files plus model.safetensors.index.json;
 * AutoModelForCausalLM.from_pretrained(DIR) loads it. params[k] (f32, shape of m->params[k]) is
 * the parameter m->params[k]. DIR is created with its parents when missing; an existing DIR must
 * be an empty directory (GT_ERR_INVALID otherwise: an export never overwrites or mixes with other
 * files). Shapes are checked against cfg so config.json describes the tensors. bos/eos token ids
 * are written as null. dtype: GT_F32 or GT_BF16. */
gt_status gt_export_hf_llama3(const gt_llama3_config *cfg, const gt_model *m,
                              const gt_tensor *params, const char *dir, gt_dtype dtype,
                              gt_error *err);
/* The same with every option (shard limit, token ids). opts NULL: f32, default shard limit, token
 * ids unknown. */
gt_status gt_export_hf_llama3_opts(const gt_llama3_config *cfg, const gt_model *m,
                                   const gt_tensor *params, const char *dir,
                                   const gt_export_hf_options *opts, gt_error *err);
/* The transformers name of a graphtrain (torchtitan) parameter fqn, e.g.
 *   tok_embeddings.weight            → model.embed_tokens.weight
 *   layers.N.attention.wq.weight     → model.layers.N.self_attn.q_proj.weight
 *   layers.N.feed_forward.w1.weight  → model.layers.N.mlp.gate_proj.weight
 *   output.weight                    → lm_head.weight
 * An unknown fqn or a name that does not fit in n bytes: GT_ERR_INVALID naming it. */
gt_status gt_export_hf_llama3_name(const char *fqn, char *out, size_t n, gt_error *err);

#ifdef __cplusplus
}
#endif
#endif
