/* init.c — a model's parameters drawn whole (gt_model_init_params) or saved as a safetensors file
 * (gt_model_save_init); the draw itself is src/core/param_init.c. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "graphtrain/gt_model.h"
#include "graphtrain/gt_safetensors.h"

void gt_model_free(gt_model *m)
{
    if (!m) return;
    free(m->params);
    free(m->moe_bias);
    free(m->moe_counts);
    m->params = NULL;
    m->moe_bias = m->moe_counts = NULL;
    m->n_params = m->n_moe = 0;
}

gt_status gt_model_init_params(const gt_model *m, uint64_t seed, gt_tensor *params, gt_error *err)
{
    for (int k = 0; k < m->n_params; k++) {
        const gt_param_spec *p = &m->params[k];
        gt_status st = gt_tensor_alloc(&params[k], p->dtype, p->ndim, p->shape, err);
        if (st != GT_OK) {
            for (int j = 0; j < k; j++)
                gt_tensor_free(&params[j]);
            return gt_error_wrap(err, "initialising parameter '%s'", p->fqn);
        }
        gt_param_init(p, seed, 0, gt_tensor_numel(&params[k]), &params[k]);
    }
    return GT_OK;
}

gt_status gt_model_save_init(const gt_model *m, const char *flavor, uint64_t seed, const char *path,
                             gt_error *err)
{
    gt_tensor *params = gt_xcalloc((size_t)m->n_params + 1, sizeof *params);
    const char **names = gt_xcalloc((size_t)m->n_params + 1, sizeof *names);
    const gt_tensor **ptrs = gt_xcalloc((size_t)m->n_params + 1, sizeof *ptrs);
    gt_status st = gt_model_init_params(m, seed, params, err);
    if (st == GT_OK) {
        for (int k = 0; k < m->n_params; k++) {
            names[k] = m->params[k].fqn;
            ptrs[k] = &params[k];
        }
        char seed_text[32];
        snprintf(seed_text, sizeof seed_text, "%" PRIu64, seed);
        const char *keys[3] = {"format", "seed", "flavor"};
        const char *values[3] = {"graphtrain", seed_text, flavor ? flavor : ""};
        st = gt_safetensors_write(path, m->n_params, names, ptrs, 3, keys, values, err);
        for (int k = 0; k < m->n_params; k++)
            gt_tensor_free(&params[k]);
    }
    free(params);
    free(names);
    free(ptrs);
    return st;
}
