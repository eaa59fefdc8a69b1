/* gt_model.h — model builders (llama3) and parameter initialisation. Models depend on the IR only.
 */
#ifndef GRAPHTRAIN_GT_MODEL_H
#define GRAPHTRAIN_GT_MODEL_H

#include "gt_graph.h"

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
} gt_llama3_config;

/* Fills cfg for a named flavor: debugmodel, 1B, 8B, 70B, 405B and the test flavors
 * (test_tiny, test_gqa, test_odd). Unknown name: GT_ERR_INVALID listing the known ones. */
gt_status gt_llama3_flavor(const char *flavor, gt_llama3_config *cfg, gt_error *err);
/* NULL-terminated list of flavor names. */
const char *const *gt_llama3_flavor_names(void);
/* Computes ffn_hidden from dim, multiple_of, ffn_dim_multiplier (torchtitan's rule). */
int64_t gt_llama3_ffn_hidden(int64_t dim, int64_t multiple_of, double ffn_dim_multiplier);

typedef enum { GT_INIT_ONES = 0, GT_INIT_ZEROS, GT_INIT_NORMAL, GT_INIT_TRUNC_NORMAL } gt_init_kind;

/* How one parameter is initialised. Element k of the flattened tensor is drawn from Philox keyed
 * by (seed, gt_hash_str(fqn), k) alone, so any slice initialises independently of the rest. */
typedef struct {
    char fqn[128];
    gt_dtype dtype;
    int ndim;
    int64_t shape[GT_MAX_DIMS];
    gt_init_kind init;
    double std, lo, hi; /* trunc_normal: [lo, hi] absolute */
} gt_param_spec;

/* Writes elements [start, start + count) of the flattened parameter into dst (count elements of
 * dst's dtype, any float dtype). */
void gt_param_init(const gt_param_spec *p, uint64_t seed, int64_t start, int64_t count,
                   gt_tensor *dst);

typedef struct {
    gt_param_spec *params; /* one per PARAM input, in graph input order */
    int n_params;
    gt_value_id tokens, labels, logits, loss; /* logits: [batch*seq, vocab] in compute_dtype */
} gt_model;

/* Builds the llama3 forward + loss graph on symbolic shapes [batch, seq] (symbols "batch" and
 * "seq"): INPUT tokens (i64), INPUT labels (i64, ignore_index -100), PARAMs with torchtitan's fqns
 * (tok_embeddings.weight, layers.N.attention.wq.weight, ..., norm.weight, output.weight), and the
 * LOSS output (mean cross-entropy, f32 whatever cfg->compute_dtype). cfg->compute_dtype must be
 * GT_F32 or GT_BF16 (else GT_ERR_INVALID). */
gt_status gt_llama3_build(gt_graph *g, const gt_llama3_config *cfg, gt_model *model, gt_error *err);
void gt_model_free(gt_model *m);

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
