/* import_hf_dsv3.c — the deepseek_v3 side of reading a Hugging Face transformers directory (the
 * family's hf_import): its config.json checked against the flavor, every size the tensors depend
 * on, so that another model is refused naming the key before a tensor is read. The tensors are
 * then read by the trainer under their hf_name (export_hf_dsv3.c), the stacked routed experts one
 * expert at a time, and the expert biases from mlp.gate.e_score_correction_bias. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "graphtrain/gt_deepseek_v3.h"
#include "export_hf_internal.h"

static gt_status check_int(json_t *root, const char *key, int64_t want, int64_t def,
                           const char *name, const gt_deepseek_v3_config *cfg, gt_error *err)
{
    return gt_hf_check_int(root, key, want, def, name, "deepseek_v3", cfg->flavor, err);
}

static gt_status check_real(json_t *root, const char *key, double want, const char *name,
                            const gt_deepseek_v3_config *cfg, gt_error *err)
{
    return gt_hf_check_real(root, key, want, name, "deepseek_v3", cfg->flavor, err);
}

gt_status gt_import_hf_deepseek_v3_check(const gt_deepseek_v3_config *c, const char *text,
                                         size_t len, const char *name, gt_error *err)
{
    json_error_t je;
    json_t *root = json_loadb(text, len, 0, &je);
    if (!root)
        return gt_error_set(err, GT_ERR_FORMAT, "%s:%d:%d: %s", name, je.line, je.column, je.text);
    gt_status st = GT_OK;
    json_t *type = json_object_get(root, "model_type");
    if (!json_is_object(root))
        st = gt_error_set(err, GT_ERR_FORMAT, "%s: expected a JSON object", name);
    else if (type && (!json_is_string(type) || strcmp(json_string_value(type), "deepseek_v3")))
        st = gt_error_set(err, GT_ERR_INVALID, "%s: model_type %s is not \"deepseek_v3\"", name,
                          json_is_string(type) ? json_string_value(type) : "(not a string)");
    else if (json_is_true(json_object_get(root, "tie_word_embeddings")))
        st = gt_error_set(err, GT_ERR_UNSUPPORTED,
                          "%s: tie_word_embeddings = true: graphtrain's deepseek_v3 has an output "
                          "weight of its own",
                          name);
    const struct {
        const char *key;
        int64_t want, def;
    } ints[] = {
        {"hidden_size", c->dim, -1},
        {"num_hidden_layers", c->n_layers, -1},
        {"num_attention_heads", c->n_heads, -1},
        {"num_key_value_heads", c->n_heads, c->n_heads},
        {"vocab_size", c->vocab_size, -1},
        {"intermediate_size", c->dense_hidden, -1},
        {"moe_intermediate_size", c->moe_hidden, -1},
        {"n_routed_experts", c->n_experts, -1},
        {"n_shared_experts", c->n_shared_experts, -1},
        {"num_experts_per_tok", c->top_k, -1},
        {"first_k_dense_replace", c->n_dense_layers, -1},
        {"kv_lora_rank", c->kv_lora_rank, -1},
        {"q_lora_rank", c->q_lora_rank, 0}, /* null: no q compression */
        {"qk_nope_head_dim", c->qk_nope_head_dim, -1},
        {"qk_rope_head_dim", c->qk_rope_head_dim, -1},
        {"v_head_dim", c->v_head_dim, -1},
        {"n_group", c->n_expert_groups > 0 ? c->n_expert_groups : 1, 1},
        {"topk_group", c->n_expert_groups > 0 ? c->n_limited_groups : 1, 1},
    };
    for (size_t k = 0; st == GT_OK && k < sizeof ints / sizeof ints[0]; k++)
        st = check_int(root, ints[k].key, ints[k].want, ints[k].def, name, c, err);
    if (st == GT_OK) st = check_real(root, "rms_norm_eps", c->norm_eps, name, c, err);
    if (st == GT_OK) st = check_real(root, "routed_scaling_factor", c->route_scale, name, c, err);
    json_t *norm = json_object_get(root, "norm_topk_prob");
    if (st == GT_OK && norm && json_is_boolean(norm) && json_is_true(norm) != (c->route_norm != 0))
        st = gt_error_set(err, GT_ERR_INVALID,
                          "%s: norm_topk_prob = %s, but deepseek_v3 flavor %s "
                          "has route_norm %s",
                          name, json_is_true(norm) ? "true" : "false", c->flavor,
                          c->route_norm ? "on" : "off");
    json_decref(root);
    return st;
}
