/* checkpoint_load.c — gt_checkpoint_load: validate a checkpoint completely, then copy it out.
 *
 * Order of checks (cheapest and most telling first; nothing the caller owns is written until all
 * pass, so a refused checkpoint leaves the run's tensors as they were):
 *   1. the step directory exists and its manifest is valid and records that step;
 *   2. the model identity (name, flavor, fingerprint) equals the run's;
 *   3. every tensor the caller expects is in the manifest with the expected dtype and shape;
 *   4. every file in the manifest has the recorded size (a truncated file stops here);
 *   5. model.safetensors parses (gt_safetensors validates its own structure) and its header holds
 *      exactly the manifest's tensors with the same dtypes and shapes;
 *   6. each tensor's bytes hash to the manifest's xxh64 (a flipped data byte names its tensor);
 *   7. each file hashes to the manifest's xxh64 (catches damage outside tensor data): version 2's
 *      tensor file from its header bytes and the tensor hashes of 6, version 1's whole;
 * then the expected tensors are copied bitwise. The tensors are read from the file one at a time
 * into one buffer (gt_safetensors_open_lazy), never the whole file at once: a checkpoint larger
 * than memory loads, and the ranks of a run each hold one tensor, not the model. Each is read
 * twice (checked, then copied) and hashed again on the second read; a version-1 file is read a
 * third time for its whole-file hash. */
#include "checkpoint_internal.h"
#include "graphtrain/gt_safetensors.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static bool ckpt_same_type(gt_dtype dtype, int ndim, const int64_t *shape,
                           const gt_checkpoint_tensor *m)
{
    if (dtype != m->dtype || ndim != m->ndim) return false;
    for (int d = 0; d < ndim; d++)
        if (shape[d] != m->shape[d]) return false;
    return true;
}

static void ckpt_format_entry(const gt_checkpoint_tensor *m, char *buf, size_t cap)
{
    gt_tensor view;
    gt_tensor_wrap(&view, m->dtype, m->ndim, m->shape, NULL);
    gt_tensor_format_type(&view, buf, cap);
}

static gt_status ckpt_check_model(const char *dir, const gt_checkpoint_info *info,
                                  const gt_checkpoint_model *model, gt_error *err)
{
    if (!model) return GT_OK;
    const char *name = model->name ? model->name : "", *flavor = model->flavor ? model->flavor : "";
    if (strcmp(name, info->model_name) == 0 && strcmp(flavor, info->model_flavor) == 0 &&
        model->fingerprint == info->fingerprint)
        return GT_OK;
    return gt_error_set(
        err, GT_ERR_INVALID,
        "checkpoint %s is for model %.100s/%.100s (fingerprint %016llx), this run "
        "is %.100s/%.100s (fingerprint %016llx)%s",
        dir, info->model_name, info->model_flavor, (unsigned long long)info->fingerprint, name,
        flavor, (unsigned long long)model->fingerprint,
        strcmp(name, info->model_name) == 0 && strcmp(flavor, info->model_flavor) == 0
            ? ": the parameter names, dtypes or shapes differ"
            : "");
}

static gt_status ckpt_check_expected(const char *file, const gt_checkpoint_info *info, int n,
                                     const char *const *names, const gt_tensor *const *tensors,
                                     gt_error *err)
{
    for (int i = 0; i < n; i++) {
        const gt_checkpoint_tensor *m = ckpt_find_tensor(info, names[i]);
        if (!m)
            return gt_error_set(err, GT_ERR_INVALID,
                                "%s: tensor " CKPT_NAME_FMT " is missing (the checkpoint holds %d "
                                "tensors)",
                                file, names[i], info->n_tensors);
        const gt_tensor *t = tensors[i];
        if (!ckpt_same_type(t->dtype, t->ndim, t->shape, m)) {
            char want[160], found[160];
            gt_tensor_format_type(t, want, sizeof want);
            ckpt_format_entry(m, found, sizeof found);
            return gt_error_set(err, GT_ERR_SHAPE,
                                "%s: tensor " CKPT_NAME_FMT ": expected %s, found %s", file,
                                names[i], want, found);
        }
    }
    return GT_OK;
}

static gt_status ckpt_check_sizes(const char *dir, const gt_checkpoint_info *info, gt_error *err)
{
    for (int i = 0; i < info->n_files; i++) {
        char *path = gt_path_join(dir, info->files[i].name);
        struct stat sb;
        gt_status status = GT_OK;
        if (stat(path, &sb) != 0)
            status = gt_error_set(err, GT_ERR_IO, "%s: cannot stat: %s (listed in the manifest)",
                                  path, strerror(errno));
        else if (!S_ISREG(sb.st_mode))
            status = gt_error_set(err, GT_ERR_FORMAT, "%s: not a regular file", path);
        else if ((uint64_t)sb.st_size != info->files[i].bytes)
            status = gt_error_set(
                err, GT_ERR_FORMAT, "%s: file is %llu bytes, the manifest records %llu (%s)", path,
                (unsigned long long)sb.st_size, (unsigned long long)info->files[i].bytes,
                (uint64_t)sb.st_size < info->files[i].bytes ? "truncated" : "overwritten");
        free(path);
        GT_TRY(status);
    }
    return GT_OK;
}

/* Entry e's bytes, read from the file into *buf (grown to fit). */
static gt_status ckpt_read_entry(const gt_safetensors *st, const gt_st_entry *e, void **buf,
                                 size_t *have, gt_error *err)
{
    GT_TRY(gt_buffer_reserve(buf, have, (size_t)(e->end - e->begin), err));
    return gt_safetensors_read(st, e, *buf, err);
}

/* The safetensors header and the manifest must describe the same tensors. */
static gt_status ckpt_check_structure(const gt_safetensors *st, const gt_checkpoint_info *info,
                                      gt_error *err)
{
    if (st->n_entries != info->n_tensors)
        return gt_error_set(err, GT_ERR_FORMAT, "%s: holds %d tensors, the manifest records %d",
                            st->path, st->n_entries, info->n_tensors);
    for (int i = 0; i < info->n_tensors; i++) {
        const gt_checkpoint_tensor *m = &info->tensors[i];
        const gt_st_entry *e = gt_safetensors_find(st, m->name);
        if (!e)
            return gt_error_set(err, GT_ERR_FORMAT,
                                "%s: tensor " CKPT_NAME_FMT " of the manifest is not in the file",
                                st->path, m->name);
        if (!ckpt_same_type(e->dtype, e->ndim, e->shape, m)) {
            char want[160], found[160];
            ckpt_format_entry(m, want, sizeof want);
            gt_tensor view;
            gt_tensor_wrap(&view, e->dtype, e->ndim, e->shape, NULL);
            gt_tensor_format_type(&view, found, sizeof found);
            return gt_error_set(err, GT_ERR_FORMAT,
                                "%s: tensor " CKPT_NAME_FMT " is %s, the manifest records %s",
                                st->path, m->name, found, want);
        }
    }
    return GT_OK;
}

/* Manifest tensor m's bytes must hash to the recorded value. */
static gt_status ckpt_check_tensor_hash(const gt_safetensors *st, const gt_checkpoint_tensor *m,
                                        gt_error *err)
{
    const gt_st_entry *e = gt_safetensors_find(st, m->name);
    GT_CHECK(e != NULL); /* ckpt_check_structure */
    uint64_t h = 0;
    GT_TRY(gt_safetensors_hash(st, e, &h, err));
    if (h != m->xxh64)
        return gt_error_set(err, GT_ERR_FORMAT,
                            "%s: tensor " CKPT_NAME_FMT ": checksum mismatch (xxh64 %016llx, "
                            "the manifest records %016llx): the data is corrupt",
                            st->path, m->name, (unsigned long long)h, (unsigned long long)m->xxh64);
    return GT_OK;
}

/* st: the tensor file, open. */
static gt_status ckpt_check_file_hashes(const char *dir, const gt_checkpoint_info *info,
                                        const gt_safetensors *st, gt_error *err)
{
    for (int i = 0; i < info->n_files; i++) {
        char *path = gt_path_join(dir, info->files[i].name);
        uint64_t bytes = 0, h = 0;
        /* version 2: the tensor file's hash is of its header and its tensors' hashes, which the
         * tensors' checks compare with the file's bytes */
        gt_status status =
            info->version >= 2 && strcmp(info->files[i].name, GT_CHECKPOINT_TENSOR_FILE) == 0
                ? ckpt_hash_tensor_file(st, info, &bytes, &h, err)
                : ckpt_hash_file(path, &bytes, &h, err);
        if (status == GT_OK && (bytes != info->files[i].bytes || h != info->files[i].xxh64))
            status = gt_error_set(err, GT_ERR_FORMAT,
                                  "%s: checksum mismatch (%llu bytes, xxh64 %016llx; the manifest "
                                  "records %llu bytes, xxh64 %016llx): the file is corrupt",
                                  path, (unsigned long long)bytes, (unsigned long long)h,
                                  (unsigned long long)info->files[i].bytes,
                                  (unsigned long long)info->files[i].xxh64);
        free(path);
        GT_TRY(status);
    }
    return GT_OK;
}

static gt_status ckpt_check_args(const char *folder, int n, const char *const *names,
                                 const gt_tensor *const *tensors, bool need_data, gt_error *err)
{
    if (!folder || !folder[0])
        return gt_error_set(err, GT_ERR_INVALID, "checkpoint load: no folder given");
    if (n < 0 || (n > 0 && (!names || !tensors)))
        return gt_error_set(err, GT_ERR_INVALID,
                            "checkpoint load from %s: bad arguments (%d tensors or NULL arrays)",
                            folder, n);
    for (int i = 0; i < n; i++) {
        const gt_tensor *t = tensors[i];
        if (!names[i] || !t || t->dtype < 0 || t->dtype >= GT_DTYPE_COUNT || t->ndim < 0 ||
            t->ndim > GT_MAX_DIMS || gt_shape_numel(t->ndim, t->shape) < 0 ||
            (need_data && gt_tensor_nbytes(t) > 0 && !t->data))
            return gt_error_set(err, GT_ERR_INVALID,
                                "checkpoint load from %s: destination %d " CKPT_NAME_FMT
                                " is NULL or has a bad dtype, rank, shape or no data",
                                folder, i, names[i] ? names[i] : "(null)");
    }
    return GT_OK;
}

/* Resolves GT_CHECKPOINT_NONE to the latest step and checks that the step directory exists. */
static gt_status ckpt_resolve_step(const char *folder, int64_t *step, gt_error *err)
{
    if (*step == GT_CHECKPOINT_NONE) {
        GT_TRY(gt_checkpoint_find_latest(folder, step, err));
        if (*step == GT_CHECKPOINT_NONE)
            return gt_error_set(err, GT_ERR_INVALID,
                                "no checkpoint to load in %s (no complete step-<N> directory)",
                                folder);
        return GT_OK;
    }
    if (*step < 0)
        return gt_error_set(err, GT_ERR_INVALID,
                            "checkpoint load from %s: step %lld is negative (-1 means the latest)",
                            folder, (long long)*step);
    return ckpt_need_step_dir(folder, *step, err);
}

static gt_status ckpt_copy_into(int i, const void *bytes, void *user, gt_error *err)
{
    (void)err;
    gt_tensor *t = ((gt_tensor *const *)user)[i];
    size_t n = gt_tensor_nbytes(t);
    if (n) memcpy(t->data, bytes, n);
    return GT_OK;
}

/* The identity of the file a reader opened: a file replaced or rewritten since is refused. */
static void ckpt_identity(const struct stat *sb, int64_t id[4])
{
    id[0] = (int64_t)sb->st_dev;
    id[1] = (int64_t)sb->st_ino;
    id[2] = (int64_t)sb->st_size;
    id[3] = (int64_t)sb->st_mtim.tv_sec * 1000000000 + sb->st_mtim.tv_nsec;
}

gt_status gt_checkpoint_open(const char *folder, int64_t step, const gt_checkpoint_model *model,
                             int n, const char *const *names, const gt_tensor *const *descs,
                             gt_checkpoint_reader *r, gt_error *err)
{
    memset(r, 0, sizeof *r);
    r->st.fd = -1;
    GT_TRY(ckpt_check_args(folder, n, names, descs, false, err));
    GT_TRY(ckpt_resolve_step(folder, &step, err));
    r->dir = ckpt_step_dir(folder, step);
    r->path = gt_path_join(r->dir, GT_CHECKPOINT_TENSOR_FILE);
    gt_status status = ckpt_read_manifest(r->dir, step, &r->info, err);
    if (status != GT_OK) {
        gt_error_wrap(err, "checkpoint %s is incomplete or corrupt", r->dir);
        gt_checkpoint_close(r);
        return status;
    }
    status = ckpt_check_model(r->dir, &r->info, model, err);
    if (status == GT_OK) status = ckpt_check_expected(r->path, &r->info, n, names, descs, err);
    if (status == GT_OK) status = ckpt_check_sizes(r->dir, &r->info, err);
    if (status == GT_OK) status = gt_safetensors_open_lazy(r->path, &r->st, err);
    if (status == GT_OK) status = ckpt_check_structure(&r->st, &r->info, err);
    struct stat sb;
    if (status == GT_OK && fstat(r->st.fd, &sb) != 0)
        status = gt_error_set(err, GT_ERR_IO, "%s: cannot stat: %s", r->path, strerror(errno));
    if (status == GT_OK) {
        ckpt_identity(&sb, r->identity);
        r->entry = gt_xcalloc((size_t)n + 1, sizeof *r->entry);
        for (int i = 0; i < n; i++)
            r->entry[i] = gt_safetensors_find(&r->st, names[i]);
        r->n = n;
    }
    if (status != GT_OK) gt_checkpoint_close(r);
    return status;
}

gt_status gt_checkpoint_verify(gt_checkpoint_reader *r, int k, gt_error *err)
{
    GT_CHECK(k >= 0 && k < r->info.n_tensors);
    return ckpt_check_tensor_hash(&r->st, &r->info.tensors[k], err);
}

gt_status gt_checkpoint_verify_file(gt_checkpoint_reader *r, gt_error *err)
{
    return ckpt_check_file_hashes(r->dir, &r->info, &r->st, err);
}

gt_status gt_checkpoint_read(gt_checkpoint_reader *r, int i, uint64_t offset, void *dst, size_t len,
                             gt_error *err)
{
    GT_CHECK(i >= 0 && i < r->n);
    return gt_safetensors_read_range(&r->st, r->entry[i], offset, dst, len, err);
}

gt_status gt_checkpoint_unchanged(const gt_checkpoint_reader *r, gt_error *err)
{
    struct stat sb;
    int64_t now[4];
    if (stat(r->path, &sb) != 0)
        return gt_error_set(err, GT_ERR_IO, "%s: cannot stat: %s (it was being loaded)", r->path,
                            strerror(errno));
    ckpt_identity(&sb, now);
    if (memcmp(now, r->identity, sizeof now) != 0)
        return gt_error_set(err, GT_ERR_IO, "%s: changed while it was being loaded", r->path);
    return GT_OK;
}

void gt_checkpoint_close(gt_checkpoint_reader *r)
{
    gt_safetensors_close(&r->st);
    gt_checkpoint_info_free(&r->info);
    free(r->entry);
    free(r->buf);
    free(r->path);
    free(r->dir);
    memset(r, 0, sizeof *r);
}

static gt_status ckpt_load(const char *folder, int64_t step, const gt_checkpoint_model *model,
                           int n, const char *const *names, const gt_tensor *const *descs,
                           bool need_data, gt_tensor_sink sink, void *user,
                           gt_checkpoint_info *info_out, gt_error *err)
{
    GT_TRY(ckpt_check_args(folder, n, names, descs, need_data, err));
    gt_checkpoint_reader r;
    GT_TRY(gt_checkpoint_open(folder, step, model, n, names, descs, &r, err));
    gt_status status = GT_OK;
    for (int k = 0; k < r.info.n_tensors && status == GT_OK; k++)
        status = gt_checkpoint_verify(&r, k, err);
    if (status == GT_OK) status = gt_checkpoint_verify_file(&r, err);
    for (int i = 0; i < n && status == GT_OK; i++) {
        const gt_st_entry *e = r.entry[i];
        GT_CHECK(e && e->end - e->begin == gt_tensor_nbytes(descs[i]));
        status = ckpt_read_entry(&r.st, e, &r.buf, &r.have, err);
        /* the bytes were hashed above: a file changed since is refused, not loaded */
        if (status == GT_OK && gt_hash64(r.buf, (size_t)(e->end - e->begin), 0) !=
                                   ckpt_find_tensor(&r.info, names[i])->xxh64)
            status = gt_error_set(err, GT_ERR_IO,
                                  "%s: tensor " CKPT_NAME_FMT " changed while it was being loaded",
                                  r.path, names[i]);
        if (status == GT_OK) status = sink(i, r.buf, user, err);
    }
    if (status == GT_OK && info_out) {
        *info_out = r.info;
        memset(&r.info, 0, sizeof r.info);
    }
    gt_checkpoint_close(&r);
    return status;
}

gt_status gt_checkpoint_load(const char *folder, int64_t step, const gt_checkpoint_model *model,
                             int n, const char *const *names, gt_tensor *const *tensors,
                             gt_checkpoint_info *info_out, gt_error *err)
{
    return ckpt_load(folder, step, model, n, names, (const gt_tensor *const *)tensors, true,
                     ckpt_copy_into, (void *)tensors, info_out, err);
}

gt_status gt_checkpoint_load_with(const char *folder, int64_t step,
                                  const gt_checkpoint_model *model, int n, const char *const *names,
                                  const gt_tensor *const *descs, gt_tensor_sink sink, void *user,
                                  gt_checkpoint_info *info_out, gt_error *err)
{
    if (!sink) return gt_error_set(err, GT_ERR_INVALID, "checkpoint load: no tensor sink");
    return ckpt_load(folder, step, model, n, names, descs, false, sink, user, info_out, err);
}
