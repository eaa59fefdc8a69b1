/* registry.c — the model families graphtrain knows (gt_model.h), and the calls that dispatch to
 * them. Adding a family is one line here plus its own file. */
#include <stdio.h>
#include <string.h>

#include "graphtrain/gt_deepseek_v3.h"
#include "graphtrain/gt_llama3.h"
#include "graphtrain/gt_model.h"

extern const gt_model_family gt_toy_mlp_family; /* test-only (toy_mlp.c) */

static const gt_model_family *const families[] = {
    &gt_llama3_family,
    &gt_deepseek_v3_family,
    &gt_toy_mlp_family,
    NULL,
};

const gt_model_family *const *gt_model_families(void)
{
    return families;
}

/* "a, b, c" from a NULL-terminated list, cut to n bytes. */
static void join_names(const char *const *names, char *buf, size_t n)
{
    size_t len = 0;
    buf[0] = '\0';
    for (int k = 0; names[k] && len < n; k++) {
        int w = snprintf(buf + len, n - len, "%s%s", k ? ", " : "", names[k]);
        if (w > 0) len += (size_t)w;
    }
}

gt_status gt_model_family_find(const char *name, const gt_model_family **out, gt_error *err)
{
    *out = NULL;
    const char *names[16];
    int n = 0;
    for (int k = 0; families[k]; k++) {
        if (name && strcmp(name, families[k]->name) == 0) {
            *out = families[k];
            return GT_OK;
        }
        if (n < 15) names[n++] = families[k]->name;
    }
    names[n] = NULL;
    char known[256];
    join_names(names, known, sizeof known);
    return gt_error_set(err, GT_ERR_INVALID, "model.name: unknown model '%s' (known: %s)",
                        name ? name : "(null)", known);
}

gt_status gt_model_unknown_flavor(const char *family, const char *flavor, const char *const *known,
                                  gt_error *err)
{
    char names[256];
    join_names(known, names, sizeof names);
    return gt_error_set(err, GT_ERR_INVALID, "unknown %s flavor '%s' (known: %s)", family,
                        flavor ? flavor : "(null)", names);
}

/* Here, not in each family, so that every family's build ends the same way. */
gt_status gt_model_finish_build(gt_graph *g, gt_model *m, const char *family, const char *flavor,
                                gt_error *err)
{
    if (g->err.code != GT_OK) {
        gt_status st = gt_error_set(err, g->err.code, "%s", g->err.msg);
        gt_error_wrap(err, "building %s flavor '%s'", family, flavor);
        gt_model_free(m);
        return st;
    }
    gt_graph_add_output(g, GT_OUT_LOSS, "loss", m->loss);
    return GT_OK;
}

gt_status gt_model_config_init(const char *name, const char *flavor, gt_dtype compute_dtype,
                               gt_model_config *mc, gt_error *err)
{
    memset(mc, 0, sizeof *mc);
    GT_TRY(gt_model_family_find(name, &mc->family, err));
    GT_CHECK(mc->family->config_size <= sizeof mc->cfg);
    if (compute_dtype != GT_F32 && compute_dtype != GT_BF16)
        return gt_error_set(err, GT_ERR_INVALID,
                            "model %s: compute dtype %s is not supported (f32 or bf16)", name,
                            gt_dtype_name(compute_dtype));
    gt_status st = mc->family->flavor(flavor, mc->cfg, err);
    if (st != GT_OK) return gt_error_wrap(err, "model.flavor");
    snprintf(mc->flavor, sizeof mc->flavor, "%s", flavor);
    mc->compute_dtype = compute_dtype;
    return GT_OK;
}

gt_status gt_model_build(gt_graph *g, const gt_model_config *mc, gt_model *model, gt_error *err)
{
    return mc->family->build(g, mc, model, err);
}

void gt_model_info_of(const gt_model_config *mc, gt_model_info *info)
{
    memset(info, 0, sizeof *info);
    mc->family->info(mc, info);
}

gt_status gt_model_export_hf(const gt_model_config *mc, const gt_model *m, const gt_tensor *params,
                             const char *dir, const gt_export_hf_options *opts, gt_error *err)
{
    if (!mc->family->hf_export)
        return gt_error_set(err, GT_ERR_INVALID, "model %s has no Hugging Face adapter",
                            mc->family->name);
    return mc->family->hf_export(mc, m, params, dir, opts, err);
}

gt_status gt_model_hf_import(const gt_model_config *mc, const char *config_json, size_t len,
                             const char *name, gt_error *err)
{
    if (!mc->family->hf_import)
        return gt_error_set(err, GT_ERR_INVALID,
                            "model %s has no Hugging Face adapter: %s cannot be read",
                            mc->family->name, name);
    return mc->family->hf_import(mc, config_json, len, name, err);
}

int64_t gt_model_param_count(const gt_model *m)
{
    int64_t n = 0;
    for (int k = 0; k < m->n_params; k++)
        n += gt_shape_numel(m->params[k].ndim, m->params[k].shape);
    return n;
}
