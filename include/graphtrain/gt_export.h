/* gt_export.h — export a trained llama3 as a Hugging Face transformers directory.
 *
 * The directory holds config.json (LlamaForCausalLM) and the weights under transformers' names in
 * model.safetensors, or, past the shard limit, in model-0000k-of-0000n.safetensors files plus
 * model.safetensors.index.json; AutoModelForCausalLM.from_pretrained(DIR) loads it. */
#ifndef GRAPHTRAIN_GT_EXPORT_H
#define GRAPHTRAIN_GT_EXPORT_H

#include "gt_model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* transformers' default max_shard_size, "5GB" = 5·10⁹ bytes. */
#define GT_EXPORT_HF_SHARD_BYTES 5000000000ull

typedef struct {
    gt_dtype dtype;           /* GT_F32 or GT_BF16 (round to nearest even) */
    uint64_t max_shard_bytes; /* 0: GT_EXPORT_HF_SHARD_BYTES. A tensor larger than the limit
                                 gets a shard of its own, as in transformers. */
    int64_t bos_token_id;     /* < 0: unknown, written as null */
    int64_t eos_token_id;     /* < 0: unknown, written as null */
} gt_export_hf_options;

/* Writes the model to DIR: params[k] (f32, shape of m->params[k]) is the parameter m->params[k].
 * DIR is created with its parents when missing; an existing DIR must be an empty directory
 * (GT_ERR_INVALID otherwise: an export never overwrites or mixes with other files). Shapes are
 * checked against cfg so config.json describes the tensors. bos/eos token ids are written as null.
 * dtype: GT_F32 or GT_BF16. */
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
