/* export_hf_internal.h — the Hugging Face directory writer shared by the families' exports
 * (export_hf.c: files, shards, index, config.json; export_hf_dsv3.c) and the config.json checks
 * shared by their imports (import_hf.c, import_hf_dsv3.c). */
#ifndef GRAPHTRAIN_EXPORT_HF_INTERNAL_H
#define GRAPHTRAIN_EXPORT_HF_INTERNAL_H

#include <jansson.h>

#include "graphtrain/gt_model.h"

#define GT_HF_NAME_MAX 160

/* mkdir -p, then require DIR to be an empty directory. */
gt_status gt_hf_prepare_dir(const char *dir, gt_error *err);
/* root as DIR/<path> (sorted keys, 2-space indent, a final newline), written atomically. */
gt_status gt_hf_write_json(const char *dir, const char *path, json_t *root, gt_error *err);
/* Writes tensors[0..n) under names[0..n) into DIR (which must be new or empty), cast to
 * opts->dtype, in shards of at most opts->max_shard_bytes (0: the default) in order, with
 * model.safetensors.index.json when there are several, then config (not consumed) as
 * config.json, last. On failure the files written so far are removed. */
gt_status gt_hf_write_dir(const char *dir, int n, const char *const *names,
                          const gt_tensor *tensors, const gt_export_hf_options *opts,
                          json_t *config, gt_error *err);

/* Checks of a transformers config.json against a flavor (import_hf.c): key an integer equal to
 * want (absent or null: def, an error when def < 0), or, when present, a number within 1e-6
 * relative of want; errors name the file, the key and the family's flavor. */
gt_status gt_hf_check_int(json_t *root, const char *key, int64_t want, int64_t def,
                          const char *name, const char *family, const char *flavor, gt_error *err);
gt_status gt_hf_check_real(json_t *root, const char *key, double want, const char *name,
                           const char *family, const char *flavor, gt_error *err);

#endif
