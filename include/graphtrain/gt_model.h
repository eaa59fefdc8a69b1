/* gt_model.h — the model interface. Every model family (llama3, ...) is one gt_model_family in the
 * registry (src/models/registry.c): its flavors, config, graph builder, parameter specs and
 * parallel plan (set on the graph it builds: units on nodes, gt_param_plan on parameters), Hugging
 * Face adapter and FLOP count. The trainer, the command line, parallelize and export reach a family
 * only through this interface; none of them names one. Models depend on the IR only. */
#ifndef GRAPHTRAIN_GT_MODEL_H
#define GRAPHTRAIN_GT_MODEL_H

#include "gt_graph.h"
#include "gt_init.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A built model: the parameters' init specs (in graph input order) and its graph's key values. */
typedef struct {
    gt_param_spec *params; /* one per PARAM input, in graph input order */
    int n_params;
    gt_value_id tokens, labels, logits, loss; /* logits: [batch*seq, vocab] in compute_dtype */
    /* Mixture-of-experts load balancing (none in dense models): per MoE layer the BUFFER input of
     * its expert bias (f32[E], carried between steps like a parameter) and this forward's count
     * of the tokens routed to each expert (f32[E]); the step graph appends the bias update after
     * the optimizer with coefficient moe_bias_coeff (gt_optim_append_moe_bias_update). */
    int n_moe;
    gt_value_id *moe_bias, *moe_counts;
    double moe_bias_coeff;
} gt_model;

/* Eager chunking (compile.ep_overlap, strategy eager): what the builder splits in two. */
typedef struct {
    bool enabled;
    bool moe_only;  /* each MoE (layers.*.moe); else each MoE block (layers.*) */
    bool seq;       /* along the sequence (MoE only); else along the batch */
    int64_t groups; /* batch: the data-parallel ranks whose batches the batch holds, each cut in
                     * two (0 or 1: one) */
} gt_model_chunking;

/* Bytes a family's config struct may take inside gt_model_config. */
#define GT_MODEL_CONFIG_BYTES 1024

typedef struct gt_model_family gt_model_family;

/* A model chosen by name and flavor: its family, the flavor, the dtype it computes in and the
 * family's own config struct (opaque here; the family casts it). */
typedef struct {
    const gt_model_family *family;
    char flavor[32];
    /* GT_F32 or GT_BF16. Parameters stay f32 PARAM inputs either way; with GT_BF16 each is cast to
     * bf16 where it is used and activations are bf16 (torchtitan's FSDP param_dtype). */
    gt_dtype compute_dtype;
    /* --debug.moe_force_load_balance: mixture-of-experts families route round-robin */
    bool moe_force_load_balance;
    /* compile.ep_overlap with strategy eager: a mixture-of-experts family builds each MoE block
     * (or each MoE) once per chunk of the batch (or of the sequence) */
    gt_model_chunking chunk;
    /* --model.attn_mask_type block_causal: an INPUT "positions" (i64 [batch, seq], restarting at 0
     * at every document of a packed sequence) drives RoPE and a block-causal attention mask */
    bool block_causal;
    _Alignas(16) unsigned char cfg[GT_MODEL_CONFIG_BYTES];
} gt_model_config;

/* What callers need to know of a model without knowing its family. */
typedef struct {
    int64_t vocab_size;
    int64_t max_seq_len;
    int64_t n_layers;
    /* torchtitan's attention term of the FLOP count: 12 * n_layers * n_heads * head_dim FLOPs per
     * token per position of the sequence (times seq_len for a token's share) */
    double attention_flops_per_position;
    /* Parameters one token uses (a mixture of experts counts top_k of its routed experts); 0 when
     * every parameter is active (dense models). */
    int64_t active_params;
} gt_model_info;

/* Options of a Hugging Face export (gt_model_export_hf). */
typedef struct {
    gt_dtype dtype;           /* GT_F32 or GT_BF16 (round to nearest even) */
    uint64_t max_shard_bytes; /* 0: GT_EXPORT_HF_SHARD_BYTES. A tensor larger than the limit gets a
                                 shard of its own, as in transformers. */
    int64_t bos_token_id;     /* < 0: unknown, written as null */
    int64_t eos_token_id;     /* < 0: unknown, written as null */
    /* The model's state buffers, whole (NULL / 0: none given): a family that exports some
     * (deepseek_v3's expert biases, as e_score_correction_bias) finds them by name, and writes
     * its default (zeros) for one that is not given. */
    const gt_tensor *buffers;
    const char *const *buffer_names;
    int n_buffers;
} gt_export_hf_options;

/* transformers' default max_shard_size, "5GB" = 5·10⁹ bytes. */
#define GT_EXPORT_HF_SHARD_BYTES 5000000000ull

struct gt_model_family {
    const char *name;           /* model.name: "llama3" */
    const char *const *flavors; /* model.flavor values, NULL-terminated */
    size_t config_size;         /* <= GT_MODEL_CONFIG_BYTES */
    /* Fills cfg (config_size bytes) for a flavor; an unknown one is GT_ERR_INVALID listing them. */
    gt_status (*flavor)(const char *flavor, void *cfg, gt_error *err);
    void (*info)(const gt_model_config *mc, gt_model_info *info);
    /* The forward + loss graph on symbolic [batch, seq] (symbols "batch" and "seq"): INPUT tokens
     * and labels (i64; labels -100 are ignored), the PARAMs with their plans and units, the nodes
     * with their units, and the LOSS output (mean cross-entropy, f32). */
    gt_status (*build)(gt_graph *g, const gt_model_config *mc, gt_model *model, gt_error *err);
    /* Hugging Face adapter (NULL when the family has none): a parameter's (or a model buffer's)
     * transformers name — with '*' where an index goes when the parameter's dim 0 is split over
     * one tensor per index (stacked experts) — and the model written as a transformers directory
     * (config.json + safetensors). */
    gt_status (*hf_name)(const char *fqn, char *out, size_t n, gt_error *err);
    gt_status (*hf_export)(const gt_model_config *mc, const gt_model *m, const gt_tensor *params,
                           const char *dir, const gt_export_hf_options *opts, gt_error *err);
    /* Reading a transformers directory (NULL when the family has none): its config.json (text,
     * len bytes; name for messages) checked against mc, every size the tensors depend on; the
     * tensors are then read under their hf_name. */
    gt_status (*hf_import)(const gt_model_config *mc, const char *config_json, size_t len,
                           const char *name, gt_error *err);
};

/* The registered families, NULL-terminated. */
const gt_model_family *const *gt_model_families(void);
/* The family called name; GT_ERR_INVALID naming model.name and the known families otherwise. */
gt_status gt_model_family_find(const char *name, const gt_model_family **out, gt_error *err);
/* mc for family `name`, flavor `flavor`, computing in compute_dtype (GT_F32 or GT_BF16). Errors
 * name model.name or model.flavor. */
gt_status gt_model_config_init(const char *name, const char *flavor, gt_dtype compute_dtype,
                               gt_model_config *mc, gt_error *err);
/* Builds mc's forward + loss graph into g (family->build). */
gt_status gt_model_build(gt_graph *g, const gt_model_config *mc, gt_model *model, gt_error *err);
void gt_model_info_of(const gt_model_config *mc, gt_model_info *info);
/* Writes the model as a Hugging Face transformers directory (GT_ERR_INVALID when the family has
 * no adapter). opts NULL: f32, default shard limit, token ids unknown. */
gt_status gt_model_export_hf(const gt_model_config *mc, const gt_model *m, const gt_tensor *params,
                             const char *dir, const gt_export_hf_options *opts, gt_error *err);
/* family->hf_import (GT_ERR_INVALID when the family has no adapter). */
gt_status gt_model_hf_import(const gt_model_config *mc, const char *config_json, size_t len,
                             const char *name, gt_error *err);
void gt_model_free(gt_model *m);
/* For a family's flavor(): GT_ERR_INVALID "unknown <family> flavor '<flavor>' (known: a, b)",
 * known NULL-terminated. */
gt_status gt_model_unknown_flavor(const char *family, const char *flavor, const char *const *known,
                                  gt_error *err);
/* The end of a family's build(): g's sticky error, wrapped with "building <family> flavor
 * '<flavor>'", frees m; otherwise m->loss becomes g's GT_OUT_LOSS output. */
gt_status gt_model_finish_build(gt_graph *g, gt_model *m, const char *family, const char *flavor,
                                gt_error *err);
/* Sum of the parameters' element counts. */
int64_t gt_model_param_count(const gt_model *m);

/* Allocates and initialises every parameter (params[k] for model->params[k]). */
gt_status gt_model_init_params(const gt_model *m, uint64_t seed, gt_tensor *params, gt_error *err);
/* Writes the initialised parameters to a safetensors file under their fqns, with metadata
 * {"format": "graphtrain", "seed": "<seed>", "flavor": "<flavor>"}. */
gt_status gt_model_save_init(const gt_model *m, const char *flavor, uint64_t seed, const char *path,
                             gt_error *err);

#ifdef __cplusplus
}
#endif
#endif
