/* export_hf_dsv3.c — deepseek_v3 as a Hugging Face transformers directory (DeepseekV3ForCausalLM,
 * the names transformers' save_pretrained writes), and the names the trainer reads one back by.
 *
 * Names (torchtitan's state_dict_adapter.py, reversed): tok_embeddings → model.embed_tokens,
 * norm → model.norm, lm_head → lm_head; per layer N (model.layers.N.): attention_norm →
 * input_layernorm, ffn_norm → post_attention_layernorm, attention.{wq, wq_a, q_norm, wq_b, wkv_a,
 * kv_norm, wkv_b, wo} → self_attn.{q_proj, q_a_proj, q_a_layernorm, q_b_proj, kv_a_proj_with_mqa,
 * kv_a_layernorm, kv_b_proj, o_proj}, feed_forward.{w1, w2, w3} → mlp.{gate, down, up}_proj,
 * moe.router.gate → mlp.gate, moe.shared_experts.{w1, w2, w3} → mlp.shared_experts.{gate, down,
 * up}_proj, the buffer moe.expert_bias_E → mlp.gate.e_score_correction_bias. The routed experts,
 * stacked here ([E, F, D] w1 / w3, [E, D, F] w2), are one tensor per expert there:
 * mlp.experts.j.{gate, up, down}_proj.weight = w1[j], w3[j], w2[j] (views, no copy). Linears are
 * [out, in] on both sides and RoPE pairs are interleaved on both (rope_interleave true), so the
 * export is a rename and a split.
 *
 * config.json: the DeepseekV3Config fields for the flavor; YaRN as rope_parameters with mscale =
 * mscale_all_dim = the flavor's mscale (attention_factor 1, the softmax scale as graphtrain's),
 * max_position_embeddings = original length · factor. Two things transformers cannot say:
 * softmax scores (debugmodel, 16B: its DeepseekV3 routes with sigmoid; the file records
 * "scoring_func": "softmax", which transformers ignores), and its q_a_layernorm / kv_a_layernorm
 * use eps 1e-6 whatever rms_norm_eps says (graphtrain, as torchtitan: 1e-5). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "export_hf_internal.h"
#include "graphtrain/gt_deepseek_v3.h"

typedef struct {
    const char *ours, *theirs; /* after "layers.N." / "model.layers.N."; '*' = the expert */
} name_row;

static const name_row layer_names[] = {
    {"attention_norm.weight", "input_layernorm.weight"},
    {"ffn_norm.weight", "post_attention_layernorm.weight"},
    {"attention.wq.weight", "self_attn.q_proj.weight"},
    {"attention.wq_a.weight", "self_attn.q_a_proj.weight"},
    {"attention.q_norm.weight", "self_attn.q_a_layernorm.weight"},
    {"attention.wq_b.weight", "self_attn.q_b_proj.weight"},
    {"attention.wkv_a.weight", "self_attn.kv_a_proj_with_mqa.weight"},
    {"attention.kv_norm.weight", "self_attn.kv_a_layernorm.weight"},
    {"attention.wkv_b.weight", "self_attn.kv_b_proj.weight"},
    {"attention.wo.weight", "self_attn.o_proj.weight"},
    {"feed_forward.w1.weight", "mlp.gate_proj.weight"},
    {"feed_forward.w2.weight", "mlp.down_proj.weight"},
    {"feed_forward.w3.weight", "mlp.up_proj.weight"},
    {"moe.router.gate.weight", "mlp.gate.weight"},
    {"moe.expert_bias_E", "mlp.gate.e_score_correction_bias"},
    {"moe.shared_experts.w1.weight", "mlp.shared_experts.gate_proj.weight"},
    {"moe.shared_experts.w2.weight", "mlp.shared_experts.down_proj.weight"},
    {"moe.shared_experts.w3.weight", "mlp.shared_experts.up_proj.weight"},
    {"moe.routed_experts.inner_experts.w1_EFD", "mlp.experts.*.gate_proj.weight"},
    {"moe.routed_experts.inner_experts.w2_EDF", "mlp.experts.*.down_proj.weight"},
    {"moe.routed_experts.inner_experts.w3_EFD", "mlp.experts.*.up_proj.weight"},
};
static const name_row global_names[] = {
    {"tok_embeddings.weight", "model.embed_tokens.weight"},
    {"norm.weight", "model.norm.weight"},
    {"lm_head.weight", "lm_head.weight"},
};
#define N_ROWS(a) ((int)(sizeof(a) / sizeof((a)[0])))

gt_status gt_export_hf_deepseek_v3_name(const char *fqn, char *out, size_t n, gt_error *err)
{
    for (int k = 0; fqn && k < N_ROWS(global_names); k++)
        if (!strcmp(fqn, global_names[k].ours)) {
            int w = snprintf(out, n, "%s", global_names[k].theirs);
            if (w < 0 || (size_t)w >= n) break;
            return GT_OK;
        }
    long long layer = -1;
    int used = 0;
    if (fqn && sscanf(fqn, "layers.%lld.%n", &layer, &used) == 1 && used > 0 && layer >= 0)
        for (int k = 0; k < N_ROWS(layer_names); k++)
            if (!strcmp(fqn + used, layer_names[k].ours)) {
                int w = snprintf(out, n, "model.layers.%lld.%s", layer, layer_names[k].theirs);
                if (w < 0 || (size_t)w >= n) break;
                return GT_OK;
            }
    return gt_error_set(err, GT_ERR_INVALID,
                        "'%.200s' has no Hugging Face DeepseekV3 name (or the name does not fit "
                        "%zu bytes)",
                        fqn ? fqn : "(null)", n);
}

/* ---------------------------------------------------------------- config.json */

static json_t *config_json(const gt_deepseek_v3_config *c, const gt_export_hf_options *o)
{
    json_t *j = json_object();
    json_object_set_new(j, "architectures", json_pack("[s]", "DeepseekV3ForCausalLM"));
    json_object_set_new(j, "model_type", json_string("deepseek_v3"));
    json_object_set_new(j, "vocab_size", json_integer(c->vocab_size));
    json_object_set_new(j, "hidden_size", json_integer(c->dim));
    json_object_set_new(j, "intermediate_size", json_integer(c->dense_hidden));
    json_object_set_new(j, "moe_intermediate_size", json_integer(c->moe_hidden));
    json_object_set_new(j, "num_hidden_layers", json_integer(c->n_layers));
    json_object_set_new(j, "num_attention_heads", json_integer(c->n_heads));
    json_object_set_new(j, "num_key_value_heads", json_integer(c->n_heads));
    json_object_set_new(j, "n_shared_experts", json_integer(c->n_shared_experts));
    json_object_set_new(j, "n_routed_experts", json_integer(c->n_experts));
    json_object_set_new(j, "routed_scaling_factor", json_real(c->route_scale));
    json_object_set_new(j, "kv_lora_rank", json_integer(c->kv_lora_rank));
    json_object_set_new(j, "q_lora_rank",
                        c->q_lora_rank > 0 ? json_integer(c->q_lora_rank) : json_null());
    json_object_set_new(j, "qk_rope_head_dim", json_integer(c->qk_rope_head_dim));
    json_object_set_new(j, "qk_nope_head_dim", json_integer(c->qk_nope_head_dim));
    json_object_set_new(j, "qk_head_dim", json_integer(c->qk_nope_head_dim + c->qk_rope_head_dim));
    json_object_set_new(j, "head_dim", json_integer(c->qk_rope_head_dim));
    json_object_set_new(j, "v_head_dim", json_integer(c->v_head_dim));
    json_object_set_new(j, "n_group",
                        json_integer(c->n_expert_groups > 0 ? c->n_expert_groups : 1));
    json_object_set_new(j, "topk_group",
                        json_integer(c->n_expert_groups > 0 ? c->n_limited_groups : 1));
    json_object_set_new(j, "num_experts_per_tok", json_integer(c->top_k));
    json_object_set_new(j, "first_k_dense_replace", json_integer(c->n_dense_layers));
    json_object_set_new(j, "norm_topk_prob", json_boolean(c->route_norm));
    json_object_set_new(
        j, "scoring_func",
        json_string(c->score_func == GT_DSV3_SCORE_SIGMOID ? "sigmoid" : "softmax"));
    json_object_set_new(j, "topk_method", json_string("noaux_tc"));
    json_object_set_new(j, "hidden_act", json_string("silu"));
    json_object_set_new(j, "rms_norm_eps", json_real(c->norm_eps));
    json_object_set_new(j, "tie_word_embeddings", json_false());
    json_object_set_new(j, "attention_bias", json_false());
    json_object_set_new(j, "attention_dropout", json_real(0.0));
    json_object_set_new(j, "rope_interleave", json_true());
    json_object_set_new(j, "num_nextn_predict_layers", json_integer(0));
    int64_t max_pos = c->max_seq_len;
    json_t *rope = json_object();
    json_object_set_new(rope, "rope_theta", json_real(c->rope_theta));
    if (c->rope_factor > 1.0) {
        max_pos = (int64_t)((double)c->rope_original_seq_len * c->rope_factor);
        json_object_set_new(rope, "rope_type", json_string("yarn"));
        json_object_set_new(rope, "factor", json_real(c->rope_factor));
        json_object_set_new(rope, "original_max_position_embeddings",
                            json_integer(c->rope_original_seq_len));
        json_object_set_new(rope, "beta_fast", json_real(c->rope_beta_fast));
        json_object_set_new(rope, "beta_slow", json_real(c->rope_beta_slow));
        json_object_set_new(rope, "mscale", json_real(c->mscale));
        json_object_set_new(rope, "mscale_all_dim", json_real(c->mscale));
        json_object_set_new(rope, "truncate", json_true());
    } else {
        json_object_set_new(rope, "rope_type", json_string("default"));
    }
    json_object_set_new(j, "rope_parameters", rope);
    json_object_set_new(j, "max_position_embeddings", json_integer(max_pos));
    json_object_set_new(j, "dtype", json_string(o->dtype == GT_BF16 ? "bfloat16" : "float32"));
    json_object_set_new(j, "use_cache", json_true());
    json_object_set_new(j, "bos_token_id",
                        o->bos_token_id < 0 ? json_null() : json_integer(o->bos_token_id));
    json_object_set_new(j, "eos_token_id",
                        o->eos_token_id < 0 ? json_null() : json_integer(o->eos_token_id));
    return j;
}

/* ---------------------------------------------------------------- export */

/* The expert-bias buffer of MoE layer `layer` among o's buffers, or NULL. */
static const gt_tensor *find_bias(const gt_export_hf_options *o, int64_t layer, int64_t E)
{
    char name[96];
    snprintf(name, sizeof name, "layers.%lld.moe.expert_bias_E", (long long)layer);
    for (int b = 0; o->buffers && o->buffer_names && b < o->n_buffers; b++)
        if (o->buffer_names[b] && !strcmp(o->buffer_names[b], name) &&
            o->buffers[b].dtype == GT_F32 && gt_tensor_numel(&o->buffers[b]) == E)
            return &o->buffers[b];
    return NULL;
}

gt_status gt_export_hf_deepseek_v3(const gt_deepseek_v3_config *cfg, const gt_model *m,
                                   const gt_tensor *params, const char *dir,
                                   const gt_export_hf_options *opts, gt_error *err)
{
    gt_export_hf_options o = {GT_F32, 0, -1, -1, NULL, NULL, 0};
    if (opts) o = *opts;
    if (!cfg || !m || !params || !dir || !dir[0])
        return gt_error_set(err, GT_ERR_INVALID, "Hugging Face export: missing %s",
                            !cfg      ? "config"
                            : !m      ? "model"
                            : !params ? "parameters"
                                      : "directory");
    if (o.dtype != GT_F32 && o.dtype != GT_BF16)
        return gt_error_set(err, GT_ERR_INVALID,
                            "Hugging Face export to %s: dtype %s, expected f32 or bf16", dir,
                            gt_dtype_name(o.dtype));
    int64_t E = cfg->n_experts, n_moe = cfg->n_layers - cfg->n_dense_layers;
    /* every parameter once, the stacked experts E times, and the biases */
    int cap = m->n_params * (int)(E > 1 ? E : 1) + (int)n_moe + 1;
    gt_tensor *ts = gt_xcalloc((size_t)cap, sizeof *ts);
    char(*names)[GT_HF_NAME_MAX] = gt_xcalloc((size_t)cap, sizeof *names);
    const char **ptrs = gt_xcalloc((size_t)cap, sizeof *ptrs);
    float *zeros = gt_xcalloc((size_t)(E > 0 ? E : 1), sizeof *zeros);
    int n = 0;
    gt_status st = GT_OK;
    for (int k = 0; k < m->n_params && st == GT_OK; k++) {
        const gt_param_spec *p = &m->params[k];
        const gt_tensor *t = &params[k];
        char hf[GT_HF_NAME_MAX];
        st = gt_export_hf_deepseek_v3_name(p->fqn, hf, sizeof hf, err);
        bool same = st == GT_OK && t->dtype == GT_F32 && t->data && t->ndim == p->ndim;
        for (int d = 0; same && d < p->ndim; d++)
            same = t->shape[d] == p->shape[d];
        if (st == GT_OK && !same) {
            char got[64];
            gt_tensor_format_type(t, got, sizeof got);
            st = gt_error_set(err, GT_ERR_SHAPE, "parameter '%s' is %s, not the flavor's f32 shape",
                              p->fqn, got);
        }
        if (st != GT_OK) break;
        char *star = strchr(hf, '*');
        if (!star) {
            ts[n] = *t;
            ts[n].owns_data = false;
            snprintf(names[n], sizeof names[n], "%s", hf);
            n++;
            continue;
        }
        /* one [d1, d2] view per expert of the stacked [E, d1, d2] */
        size_t slice = (size_t)(t->shape[1] * t->shape[2]);
        for (int64_t e = 0; e < t->shape[0]; e++, n++) {
            int64_t shape[2] = {t->shape[1], t->shape[2]};
            ts[n] = (gt_tensor){0};
            ts[n].dtype = GT_F32;
            ts[n].ndim = 2;
            memcpy(ts[n].shape, shape, sizeof shape);
            ts[n].data = (float *)t->data + (size_t)e * slice;
            ts[n].owns_data = false;
            snprintf(names[n], sizeof names[n], "%.*s%lld%s", (int)(star - hf), hf, (long long)e,
                     star + 1);
        }
    }
    for (int64_t j = 0; j < n_moe && st == GT_OK; j++, n++) {
        int64_t layer = cfg->n_dense_layers + j;
        const gt_tensor *b = find_bias(&o, layer, E);
        if (!b) /* a trained bias steers the routing: zeros route differently */
            gt_log(GT_LOG_WARN,
                   "deepseek_v3 export to %s: no expert bias given for layer %lld; its "
                   "e_score_correction_bias is written as zeros",
                   dir, (long long)layer);
        ts[n] = (gt_tensor){0};
        ts[n].dtype = GT_F32;
        ts[n].ndim = 1;
        ts[n].shape[0] = E;
        ts[n].data = b ? b->data : zeros;
        snprintf(names[n], sizeof names[n], "model.layers.%lld.mlp.gate.e_score_correction_bias",
                 (long long)layer);
    }
    for (int k = 0; k < n; k++)
        ptrs[k] = names[k];
    if (st == GT_OK) {
        json_t *config = config_json(cfg, &o);
        st = gt_hf_write_dir(dir, n, ptrs, ts, &o, config, err);
        json_decref(config);
    }
    if (st != GT_OK)
        gt_error_wrap(err, "exporting deepseek_v3 '%s' to Hugging Face directory %s", cfg->flavor,
                      dir);
    free(zeros);
    free(ptrs);
    free(names);
    free(ts);
    return st;
}
