/* checkpoint_manifest.c — the checkpoint manifest: JSON text <-> gt_checkpoint_info.
 *
 * The manifest is what makes a step directory a checkpoint, so its reader trusts nothing: the text
 * is parsed with duplicate keys rejected, every object must hold exactly its known keys (a missing
 * or unknown key is an error naming it), every value has its type checked, 64-bit hashes are
 * exactly 16 hex digits, shapes are at most GT_MAX_DIMS non-negative dims whose byte count fits in
 * 64 bits, and file names are plain names inside the step directory (no '/', ".", ".." or the
 * manifest itself). The writer refuses anything the reader would refuse, so dump -> parse is a
 * round trip (the fuzz target checks it). Every message starts with the manifest's name. */
#include "checkpoint_internal.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#define KEYS_END NULL

/* ---------------------------------------------------------------- info helpers */

void gt_checkpoint_info_free(gt_checkpoint_info *info)
{
    if (!info) return;
    free(info->model_name);
    free(info->model_flavor);
    for (int i = 0; i < info->n_tensors; i++)
        free(info->tensors[i].name);
    free(info->tensors);
    for (int i = 0; i < info->n_files; i++)
        free(info->files[i].name);
    free(info->files);
    free(info->loader_json);
    for (int i = 0; i < info->n_rng_counters; i++)
        free(info->rng_counter_names[i]);
    free(info->rng_counter_names);
    free(info->rng_counters);
    for (int i = 0; i < info->n_extra; i++) {
        free(info->extra_keys[i]);
        free(info->extra_values[i]);
    }
    free(info->extra_keys);
    free(info->extra_values);
    memset(info, 0, sizeof *info);
}

bool gt_checkpoint_info_counter(const gt_checkpoint_info *info, const char *name, int64_t *out)
{
    if (!info || !name) return false;
    for (int i = 0; i < info->n_rng_counters; i++) {
        if (strcmp(info->rng_counter_names[i], name) == 0) {
            if (out) *out = info->rng_counters[i];
            return true;
        }
    }
    return false;
}

const char *gt_checkpoint_info_extra(const gt_checkpoint_info *info, const char *key)
{
    if (!info || !key) return NULL;
    for (int i = 0; i < info->n_extra; i++)
        if (strcmp(info->extra_keys[i], key) == 0) return info->extra_values[i];
    return NULL;
}

/* ---------------------------------------------------------------- shared rules */

static bool ckpt_valid_file_name(const char *s)
{
    return s[0] && !strchr(s, '/') && strcmp(s, ".") != 0 && strcmp(s, "..") != 0 &&
           strcmp(s, GT_CHECKPOINT_MANIFEST) != 0 && strlen(s) <= 255;
}

/* "__metadata__" is the safetensors header's own key, so it cannot name a tensor. */
static bool ckpt_valid_tensor_name(const char *s)
{
    return s[0] && strcmp(s, "__metadata__") != 0;
}

static bool ckpt_shape_ok(gt_dtype dtype, int ndim, const int64_t *shape)
{
    if (dtype < 0 || dtype >= GT_DTYPE_COUNT || ndim < 0 || ndim > GT_MAX_DIMS) return false;
    uint64_t bytes = gt_dtype_size(dtype);
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0 || __builtin_mul_overflow(bytes, (uint64_t)shape[d], &bytes)) return false;
    }
    return bytes <= (uint64_t)INT64_MAX;
}

static void ckpt_hex64(uint64_t v, char out[17])
{
    static const char digits[] = "0123456789abcdef";
    for (int i = 15; i >= 0; i--, v >>= 4)
        out[i] = digits[v & 15];
    out[16] = '\0';
}

static bool ckpt_parse_hex64(const char *s, uint64_t *out)
{
    uint64_t v = 0;
    int i = 0;
    for (; s[i]; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0 || i >= 16) return false;
        v = v << 4 | (uint64_t)d;
    }
    if (i != 16) return false;
    *out = v;
    return true;
}

/* ---------------------------------------------------------------- parse */

static gt_status ckpt_need_object(const char *file, const char *where, const json_t *obj,
                                  gt_error *err)
{
    if (!json_is_object(obj))
        return gt_error_set(err, GT_ERR_FORMAT, "%s: %s must be a JSON object", file, where);
    return GT_OK;
}

/* obj must be an object holding exactly the keys listed (NULL-terminated). */
static gt_status ckpt_check_keys(const char *file, const char *where, const json_t *obj,
                                 const char *const *keys, gt_error *err)
{
    GT_TRY(ckpt_need_object(file, where, obj, err));
    size_t n_keys = 0;
    for (; keys[n_keys]; n_keys++) {
        if (!json_object_get(obj, keys[n_keys]))
            return gt_error_set(err, GT_ERR_FORMAT, "%s: %s is missing \"%s\"", file, where,
                                keys[n_keys]);
    }
    if (json_object_size(obj) == n_keys) return GT_OK;
    const char *key;
    json_t *value;
    json_object_foreach((json_t *)obj, key, value)
    {
        bool known = false;
        for (size_t i = 0; i < n_keys && !known; i++)
            known = strcmp(key, keys[i]) == 0;
        if (!known)
            return gt_error_set(err, GT_ERR_FORMAT, "%s: %s has unknown key " CKPT_NAME_FMT, file,
                                where, key);
    }
    return GT_OK;
}

static gt_status ckpt_get_hex64(const char *file, const char *where, const json_t *v, uint64_t *out,
                                gt_error *err)
{
    if (!json_is_string(v) || !ckpt_parse_hex64(json_string_value(v), out))
        return gt_error_set(err, GT_ERR_FORMAT, "%s: %s must be a string of 16 hex digits", file,
                            where);
    return GT_OK;
}

static gt_status ckpt_parse_model(const char *file, const json_t *m, gt_checkpoint_info *info,
                                  gt_error *err)
{
    static const char *const keys[] = {"name", "flavor", "fingerprint", KEYS_END};
    GT_TRY(ckpt_check_keys(file, "\"model\"", m, keys, err));
    const json_t *name = json_object_get(m, "name"), *flavor = json_object_get(m, "flavor");
    if (!json_is_string(name) || !json_is_string(flavor))
        return gt_error_set(err, GT_ERR_FORMAT,
                            "%s: \"model\".\"name\" and \"model\".\"flavor\" must be strings",
                            file);
    GT_TRY(ckpt_get_hex64(file, "\"model\".\"fingerprint\"", json_object_get(m, "fingerprint"),
                          &info->fingerprint, err));
    info->model_name = gt_xstrdup(json_string_value(name));
    info->model_flavor = gt_xstrdup(json_string_value(flavor));
    return GT_OK;
}

static gt_status ckpt_parse_tensor(const char *file, const char *name, const json_t *v,
                                   gt_checkpoint_tensor *t, gt_error *err)
{
    char where[256];
    snprintf(where, sizeof where, "tensor " CKPT_NAME_FMT, name);
    static const char *const keys[] = {"dtype", "shape", "xxh64", KEYS_END};
    GT_TRY(ckpt_check_keys(file, where, v, keys, err));
    if (!ckpt_valid_tensor_name(name))
        return gt_error_set(err, GT_ERR_FORMAT, "%s: %s: empty or reserved tensor name", file,
                            where);
    const json_t *dtype = json_object_get(v, "dtype");
    if (!json_is_string(dtype) || !gt_dtype_from_name(json_string_value(dtype), &t->dtype))
        return gt_error_set(err, GT_ERR_FORMAT,
                            "%s: %s: \"dtype\" must be one of f32, bf16, f16, i32, i64, bool", file,
                            where);
    const json_t *shape = json_object_get(v, "shape");
    if (!json_is_array(shape) || json_array_size(shape) > GT_MAX_DIMS)
        return gt_error_set(err, GT_ERR_FORMAT,
                            "%s: %s: \"shape\" must be an array of at most %d integers", file,
                            where, GT_MAX_DIMS);
    t->ndim = (int)json_array_size(shape);
    for (int d = 0; d < t->ndim; d++) {
        const json_t *dim = json_array_get(shape, (size_t)d);
        if (!json_is_integer(dim) || json_integer_value(dim) < 0)
            return gt_error_set(err, GT_ERR_FORMAT,
                                "%s: %s: shape[%d] must be a non-negative integer", file, where, d);
        t->shape[d] = (int64_t)json_integer_value(dim);
    }
    if (!ckpt_shape_ok(t->dtype, t->ndim, t->shape))
        return gt_error_set(err, GT_ERR_FORMAT,
                            "%s: %s: shape overflows (its byte count does not fit in 63 bits)",
                            file, where);
    char hwhere[300];
    snprintf(hwhere, sizeof hwhere, "%s: \"xxh64\"", where);
    GT_TRY(ckpt_get_hex64(file, hwhere, json_object_get(v, "xxh64"), &t->xxh64, err));
    t->name = gt_xstrdup(name);
    return GT_OK;
}

static gt_status ckpt_parse_tensors(const char *file, const json_t *ts, gt_checkpoint_info *info,
                                    gt_error *err)
{
    GT_TRY(ckpt_need_object(file, "\"tensors\"", ts, err));
    info->tensors = gt_xcalloc(json_object_size(ts) + 1, sizeof *info->tensors);
    const char *key;
    json_t *value;
    json_object_foreach((json_t *)ts, key, value)
    {
        GT_TRY(ckpt_parse_tensor(file, key, value, &info->tensors[info->n_tensors], err));
        info->n_tensors++;
    }
    return GT_OK;
}

static gt_status ckpt_parse_files(const char *file, const json_t *fs, gt_checkpoint_info *info,
                                  gt_error *err)
{
    GT_TRY(ckpt_need_object(file, "\"files\"", fs, err));
    if (!json_object_get(fs, GT_CHECKPOINT_TENSOR_FILE))
        return gt_error_set(err, GT_ERR_FORMAT, "%s: \"files\" does not list \"%s\"", file,
                            GT_CHECKPOINT_TENSOR_FILE);
    info->files = gt_xcalloc(json_object_size(fs) + 1, sizeof *info->files);
    static const char *const keys[] = {"bytes", "xxh64", KEYS_END};
    const char *key;
    json_t *value;
    json_object_foreach((json_t *)fs, key, value)
    {
        char where[256];
        snprintf(where, sizeof where, "file " CKPT_NAME_FMT, key);
        if (!ckpt_valid_file_name(key))
            return gt_error_set(err, GT_ERR_FORMAT,
                                "%s: %s is not a plain file name inside the checkpoint", file,
                                where);
        GT_TRY(ckpt_check_keys(file, where, value, keys, err));
        gt_checkpoint_file *f = &info->files[info->n_files];
        const json_t *bytes = json_object_get(value, "bytes");
        if (!json_is_integer(bytes) || json_integer_value(bytes) < 0)
            return gt_error_set(err, GT_ERR_FORMAT,
                                "%s: %s: \"bytes\" must be a non-negative integer", file, where);
        f->bytes = (uint64_t)json_integer_value(bytes);
        char hwhere[300];
        snprintf(hwhere, sizeof hwhere, "%s: \"xxh64\"", where);
        GT_TRY(ckpt_get_hex64(file, hwhere, json_object_get(value, "xxh64"), &f->xxh64, err));
        f->name = gt_xstrdup(key);
        info->n_files++;
    }
    return GT_OK;
}

static gt_status ckpt_parse_rng(const char *file, const json_t *rng, gt_checkpoint_info *info,
                                gt_error *err)
{
    static const char *const keys[] = {"seed", "counters", KEYS_END};
    GT_TRY(ckpt_check_keys(file, "\"rng\"", rng, keys, err));
    const json_t *seed = json_object_get(rng, "seed");
    if (!json_is_integer(seed))
        return gt_error_set(err, GT_ERR_FORMAT, "%s: \"rng\".\"seed\" must be an integer", file);
    info->rng_seed = (int64_t)json_integer_value(seed);
    const json_t *counters = json_object_get(rng, "counters");
    GT_TRY(ckpt_need_object(file, "\"rng\".\"counters\"", counters, err));
    size_t n = json_object_size(counters);
    info->rng_counter_names = gt_xcalloc(n + 1, sizeof *info->rng_counter_names);
    info->rng_counters = gt_xcalloc(n + 1, sizeof *info->rng_counters);
    const char *key;
    json_t *value;
    json_object_foreach((json_t *)counters, key, value)
    {
        if (!json_is_integer(value))
            return gt_error_set(err, GT_ERR_FORMAT,
                                "%s: \"rng\".\"counters\"." CKPT_NAME_FMT " must be an integer",
                                file, key);
        info->rng_counter_names[info->n_rng_counters] = gt_xstrdup(key);
        info->rng_counters[info->n_rng_counters] = (int64_t)json_integer_value(value);
        info->n_rng_counters++;
    }
    return GT_OK;
}

static gt_status ckpt_parse_extra(const char *file, const json_t *extra, gt_checkpoint_info *info,
                                  gt_error *err)
{
    GT_TRY(ckpt_need_object(file, "\"extra\"", extra, err));
    size_t n = json_object_size(extra);
    info->extra_keys = gt_xcalloc(n + 1, sizeof *info->extra_keys);
    info->extra_values = gt_xcalloc(n + 1, sizeof *info->extra_values);
    const char *key;
    json_t *value;
    json_object_foreach((json_t *)extra, key, value)
    {
        if (!json_is_string(value))
            return gt_error_set(err, GT_ERR_FORMAT,
                                "%s: \"extra\"." CKPT_NAME_FMT " must be a string", file, key);
        info->extra_keys[info->n_extra] = gt_xstrdup(key);
        info->extra_values[info->n_extra] = gt_xstrdup(json_string_value(value));
        info->n_extra++;
    }
    return GT_OK;
}

static gt_status ckpt_parse_root(const char *file, const json_t *root, gt_checkpoint_info *info,
                                 gt_error *err)
{
    static const char *const keys[] = {"format", "version", "step", "model", "tensors",
                                       "files",  "loader",  "rng",  "extra", KEYS_END};
    GT_TRY(ckpt_check_keys(file, "the manifest", root, keys, err));
    const json_t *format = json_object_get(root, "format");
    if (!json_is_string(format) || strcmp(json_string_value(format), GT_CHECKPOINT_FORMAT) != 0)
        return gt_error_set(err, GT_ERR_FORMAT, "%s: \"format\" must be \"%s\"", file,
                            GT_CHECKPOINT_FORMAT);
    const json_t *version = json_object_get(root, "version");
    if (!json_is_integer(version) || json_integer_value(version) < 1 ||
        json_integer_value(version) > GT_CHECKPOINT_VERSION)
        return gt_error_set(err, GT_ERR_FORMAT,
                            "%s: \"version\" must be 1 to %d (this build reads those)", file,
                            GT_CHECKPOINT_VERSION);
    info->version = (int)json_integer_value(version);
    const json_t *step = json_object_get(root, "step");
    if (!json_is_integer(step) || json_integer_value(step) < 0)
        return gt_error_set(err, GT_ERR_FORMAT, "%s: \"step\" must be a non-negative integer",
                            file);
    info->step = (int64_t)json_integer_value(step);
    GT_TRY(ckpt_parse_model(file, json_object_get(root, "model"), info, err));
    GT_TRY(ckpt_parse_tensors(file, json_object_get(root, "tensors"), info, err));
    GT_TRY(ckpt_parse_files(file, json_object_get(root, "files"), info, err));
    const json_t *loader = json_object_get(root, "loader");
    GT_TRY(ckpt_need_object(file, "\"loader\"", loader, err));
    info->loader_json = json_dumps(loader, JSON_COMPACT);
    if (!info->loader_json)
        return gt_error_set(err, GT_ERR_NOMEM, "%s: cannot re-serialize \"loader\"", file);
    GT_TRY(ckpt_parse_rng(file, json_object_get(root, "rng"), info, err));
    return ckpt_parse_extra(file, json_object_get(root, "extra"), info, err);
}

gt_status gt_checkpoint_manifest_parse(const char *name, const char *text, size_t len,
                                       gt_checkpoint_info *info, gt_error *err)
{
    memset(info, 0, sizeof *info);
    if (!name) name = "<manifest>";
    if (!text && len > 0)
        return gt_error_set(err, GT_ERR_INVALID, "%s: NULL text of %zu bytes", name, len);
    if (len > CKPT_MAX_MANIFEST_BYTES)
        return gt_error_set(err, GT_ERR_FORMAT, "%s: %zu bytes exceeds the manifest limit of %zu",
                            name, len, CKPT_MAX_MANIFEST_BYTES);
    json_error_t jerr;
    json_t *root = json_loadb(text ? text : "", len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return gt_error_set(err, GT_ERR_FORMAT, "%s: invalid JSON at line %d, column %d: %s", name,
                            jerr.line, jerr.column, jerr.text);
    gt_status status = ckpt_parse_root(name, root, info, err);
    json_decref(root);
    if (status != GT_OK) gt_checkpoint_info_free(info);
    return status;
}

/* ---------------------------------------------------------------- dump */

/* Sets key in obj to v (stolen); false when the key repeats or a string was not valid UTF-8
 * (json_string returned NULL). */
static bool ckpt_set_new_unique(json_t *obj, const char *key, json_t *v)
{
    if (!v || !key || json_object_get(obj, key)) {
        json_decref(v);
        return false;
    }
    return json_object_set_new(obj, key, v) == 0;
}

static json_t *ckpt_hex_json(uint64_t v)
{
    char hex[17];
    ckpt_hex64(v, hex);
    return json_string(hex);
}

static gt_status ckpt_dump_tensors(const gt_checkpoint_info *info, json_t *root, gt_error *err)
{
    json_t *tensors = json_object();
    json_object_set_new(root, "tensors", tensors);
    for (int i = 0; i < info->n_tensors; i++) {
        const gt_checkpoint_tensor *t = &info->tensors[i];
        if (!t->name || !ckpt_valid_tensor_name(t->name) ||
            !ckpt_shape_ok(t->dtype, t->ndim, t->shape))
            return gt_error_set(err, GT_ERR_INVALID,
                                "manifest: tensor %d " CKPT_NAME_FMT
                                " has an empty or reserved name, or a bad dtype or shape",
                                i, t->name ? t->name : "(null)");
        json_t *shape = json_array();
        for (int d = 0; d < t->ndim; d++)
            json_array_append_new(shape, json_integer((json_int_t)t->shape[d]));
        json_t *entry = json_pack("{s:s, s:o, s:o}", "dtype", gt_dtype_name(t->dtype), "shape",
                                  shape, "xxh64", ckpt_hex_json(t->xxh64));
        if (!ckpt_set_new_unique(tensors, t->name, entry))
            return gt_error_set(err, GT_ERR_INVALID,
                                "manifest: tensor name " CKPT_NAME_FMT
                                " is used twice or is not valid UTF-8",
                                t->name);
    }
    return GT_OK;
}

static gt_status ckpt_dump_files(const gt_checkpoint_info *info, json_t *root, gt_error *err)
{
    json_t *files = json_object();
    json_object_set_new(root, "files", files);
    for (int i = 0; i < info->n_files; i++) {
        const gt_checkpoint_file *f = &info->files[i];
        if (!f->name || !ckpt_valid_file_name(f->name) || f->bytes > (uint64_t)INT64_MAX)
            return gt_error_set(err, GT_ERR_INVALID,
                                "manifest: file %d " CKPT_NAME_FMT
                                " is not a plain file name or has an absurd size",
                                i, f->name ? f->name : "(null)");
        json_t *entry = json_pack("{s:I, s:o}", "bytes", (json_int_t)f->bytes, "xxh64",
                                  ckpt_hex_json(f->xxh64));
        if (!ckpt_set_new_unique(files, f->name, entry))
            return gt_error_set(err, GT_ERR_INVALID,
                                "manifest: file name " CKPT_NAME_FMT
                                " is used twice or is not valid UTF-8",
                                f->name);
    }
    if (!json_object_get(files, GT_CHECKPOINT_TENSOR_FILE))
        return gt_error_set(err, GT_ERR_INVALID, "manifest: \"files\" does not list \"%s\"",
                            GT_CHECKPOINT_TENSOR_FILE);
    return GT_OK;
}

static gt_status ckpt_dump_rng_extra(const gt_checkpoint_info *info, json_t *root, gt_error *err)
{
    json_t *counters = json_object();
    json_object_set_new(
        root, "rng",
        json_pack("{s:I, s:o}", "seed", (json_int_t)info->rng_seed, "counters", counters));
    for (int i = 0; i < info->n_rng_counters; i++) {
        const char *name = info->rng_counter_names[i];
        if (!ckpt_set_new_unique(counters, name, json_integer((json_int_t)info->rng_counters[i])))
            return gt_error_set(err, GT_ERR_INVALID,
                                "manifest: RNG counter " CKPT_NAME_FMT
                                " is NULL, used twice or not valid UTF-8",
                                name ? name : "(null)");
    }
    json_t *extra = json_object();
    json_object_set_new(root, "extra", extra);
    for (int i = 0; i < info->n_extra; i++) {
        const char *key = info->extra_keys[i], *value = info->extra_values[i];
        if (!ckpt_set_new_unique(extra, key, value ? json_string(value) : NULL))
            return gt_error_set(err, GT_ERR_INVALID,
                                "manifest: extra key " CKPT_NAME_FMT
                                " is NULL, used twice, or it or its value is not valid UTF-8",
                                key ? key : "(null)");
    }
    return GT_OK;
}

static gt_status ckpt_dump_root(const gt_checkpoint_info *info, json_t *root, gt_error *err)
{
    if (info->step < 0)
        return gt_error_set(err, GT_ERR_INVALID, "manifest: step %lld is negative",
                            (long long)info->step);
    json_t *model_name = info->model_name ? json_string(info->model_name) : NULL;
    json_t *model_flavor = info->model_flavor ? json_string(info->model_flavor) : NULL;
    if (!model_name || !model_flavor) {
        json_decref(model_name);
        json_decref(model_flavor);
        return gt_error_set(err, GT_ERR_INVALID,
                            "manifest: model name or flavor is NULL or not valid UTF-8");
    }
    json_object_set_new(root, "format", json_string(GT_CHECKPOINT_FORMAT));
    json_object_set_new(root, "version", json_integer(GT_CHECKPOINT_VERSION));
    json_object_set_new(root, "step", json_integer((json_int_t)info->step));
    json_object_set_new(root, "model",
                        json_pack("{s:o, s:o, s:o}", "name", model_name, "flavor", model_flavor,
                                  "fingerprint", ckpt_hex_json(info->fingerprint)));
    GT_TRY(ckpt_dump_tensors(info, root, err));
    GT_TRY(ckpt_dump_files(info, root, err));
    const char *loader_text = info->loader_json ? info->loader_json : "{}";
    json_error_t jerr;
    json_t *loader = json_loads(loader_text, JSON_REJECT_DUPLICATES, &jerr);
    if (!json_is_object(loader)) {
        json_decref(loader);
        return gt_error_set(err, GT_ERR_INVALID,
                            "manifest: the loader state must be a JSON object (%s)",
                            loader ? "it is another JSON value" : jerr.text);
    }
    json_object_set_new(root, "loader", loader);
    return ckpt_dump_rng_extra(info, root, err);
}

gt_status gt_checkpoint_manifest_dump(const gt_checkpoint_info *info, char **text, gt_error *err)
{
    *text = NULL;
    if (!info) return gt_error_set(err, GT_ERR_INVALID, "manifest: NULL info");
    json_t *root = json_object();
    gt_status status = ckpt_dump_root(info, root, err);
    if (status == GT_OK) {
        /* Indented so a person can read it; one level keeps thousands of tensors compact. */
        *text = json_dumps(root, JSON_INDENT(1));
        if (!*text) status = gt_error_set(err, GT_ERR_NOMEM, "manifest: cannot serialize");
    }
    json_decref(root);
    return status;
}
