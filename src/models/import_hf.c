/* import_hf.c — the llama3 side of reading a Hugging Face transformers directory (the family's
 * hf_import): its config.json checked against the flavor, so that a model of another size is
 * refused by the key that differs before any tensor is read. The tensors themselves are read by
 * the trainer under their hf_name (export_hf.c's table), whose shapes it checks one by one. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "graphtrain/gt_llama3.h"
#include "export_hf_internal.h"

/* key must be an integer equal to want (absent or null: def, or an error when def < 0); the
 * error names the family's flavor (export_hf_internal.h) */
gt_status gt_hf_check_int(json_t *root, const char *key, int64_t want, int64_t def,
                          const char *name, const char *family, const char *flavor, gt_error *err)
{
    json_t *v = json_object_get(root, key);
    int64_t got = def;
    if (v && !json_is_null(v)) {
        if (!json_is_integer(v))
            return gt_error_set(err, GT_ERR_FORMAT, "%s: %s: expected an integer", name, key);
        got = (int64_t)json_integer_value(v);
    } else if (def < 0) {
        return gt_error_set(err, GT_ERR_FORMAT, "%s: %s is missing", name, key);
    }
    if (got != want)
        return gt_error_set(err, GT_ERR_INVALID,
                            "%s: %s = %lld, but %s flavor %s has %lld (choose the flavor of this "
                            "model with --model.flavor)",
                            name, key, (long long)got, family, flavor, (long long)want);
    return GT_OK;
}

/* key, when present, must be a number within 1e-6 (relative) of want */
gt_status gt_hf_check_real(json_t *root, const char *key, double want, const char *name,
                           const char *family, const char *flavor, gt_error *err)
{
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) return GT_OK;
    if (!json_is_number(v))
        return gt_error_set(err, GT_ERR_FORMAT, "%s: %s: expected a number", name, key);
    double got = json_number_value(v);
    if (!(fabs(got - want) <= 1e-6 * fabs(want)))
        return gt_error_set(err, GT_ERR_INVALID, "%s: %s = %g, but %s flavor %s has %g", name,
                            key, got, family, flavor, want);
    return GT_OK;
}

static gt_status check_int(json_t *root, const char *key, int64_t want, int64_t def,
                           const char *name, const gt_llama3_config *cfg, gt_error *err)
{
    return gt_hf_check_int(root, key, want, def, name, "llama3", cfg->flavor, err);
}

static gt_status check_real(json_t *root, const char *key, double want, const char *name,
                            const gt_llama3_config *cfg, gt_error *err)
{
    return gt_hf_check_real(root, key, want, name, "llama3", cfg->flavor, err);
}

gt_status gt_import_hf_llama3_check(const gt_llama3_config *cfg, const char *text, size_t len,
                                    const char *name, gt_error *err)
{
    json_error_t je;
    json_t *root = json_loadb(text, len, 0, &je);
    if (!root)
        return gt_error_set(err, GT_ERR_FORMAT, "%s:%d:%d: %s", name, je.line, je.column, je.text);
    gt_status st = GT_OK;
    json_t *type = json_object_get(root, "model_type");
    if (!json_is_object(root))
        st = gt_error_set(err, GT_ERR_FORMAT, "%s: expected a JSON object", name);
    else if (type && (!json_is_string(type) || strcmp(json_string_value(type), "llama")))
        st = gt_error_set(err, GT_ERR_INVALID, "%s: model_type %s%s%s is not \"llama\"", name,
                          json_is_string(type) ? "\"" : "",
                          json_is_string(type) ? json_string_value(type) : "(not a string)",
                          json_is_string(type) ? "\"" : "");
    else if (json_is_true(json_object_get(root, "tie_word_embeddings")))
        st = gt_error_set(err, GT_ERR_UNSUPPORTED,
                          "%s: tie_word_embeddings = true: graphtrain's llama3 has an output "
                          "weight of its own",
                          name);
    if (st == GT_OK) st = check_int(root, "hidden_size", cfg->dim, -1, name, cfg, err);
    if (st == GT_OK) st = check_int(root, "num_hidden_layers", cfg->n_layers, -1, name, cfg, err);
    if (st == GT_OK) st = check_int(root, "num_attention_heads", cfg->n_heads, -1, name, cfg, err);
    if (st == GT_OK)
        st = check_int(root, "num_key_value_heads", cfg->n_kv_heads, cfg->n_heads, name, cfg, err);
    if (st == GT_OK) st = check_int(root, "intermediate_size", cfg->ffn_hidden, -1, name, cfg, err);
    if (st == GT_OK) st = check_int(root, "vocab_size", cfg->vocab_size, -1, name, cfg, err);
    if (st == GT_OK)
        st = check_int(root, "head_dim", cfg->dim / cfg->n_heads, cfg->dim / cfg->n_heads, name,
                       cfg, err);
    if (st == GT_OK) st = check_real(root, "rms_norm_eps", cfg->norm_eps, name, cfg, err);
    if (st == GT_OK) st = check_real(root, "rope_theta", cfg->rope_theta, name, cfg, err);
    json_decref(root);
    return st;
}
