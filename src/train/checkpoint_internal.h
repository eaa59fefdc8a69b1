/* checkpoint_internal.h — file-system helpers shared by checkpoint.c, checkpoint_load.c and
 * artifact.c. */
#ifndef GRAPHTRAIN_CHECKPOINT_INTERNAL_H
#define GRAPHTRAIN_CHECKPOINT_INTERNAL_H

#include "graphtrain/gt_checkpoint.h"

/* Manifests are small (about 150 bytes per tensor); anything past this is not ours. */
#define CKPT_MAX_MANIFEST_BYTES ((size_t)256 << 20)

/* User strings (tensor names, keys) are clipped in messages so the file and reason always fit. */
#define CKPT_NAME_FMT "\"%.200s\""

/* "FOLDER/step-<N>", malloc'd. */
char *ckpt_step_dir(const char *folder, int64_t step);
/* True when name is exactly "step-<N>" with N a canonical decimal int64 (no sign, no leading 0). */
bool ckpt_parse_step_name(const char *name, int64_t *step);
/* Reads and validates DIR/manifest.json and checks that it records `step`. */
gt_status ckpt_read_manifest(const char *dir, int64_t step, gt_checkpoint_info *info,
                             gt_error *err);
/* Opens path (a directory) and fsyncs it (EINVAL, a filesystem that cannot, is not an error). */
gt_status ckpt_fsync_dir(const char *path, gt_error *err);
/* Creates path (and missing parents), fsyncing each parent whose entry was added. */
gt_status ckpt_mkdirs(const char *path, gt_error *err);
/* Writes a whole file and fsyncs it (its directory is the caller's to fsync). */
gt_status ckpt_write_file(const char *path, const char *data, size_t len, gt_error *err);
/* Size and xxh64 (seed 0) of a regular file, streamed in 1 MiB blocks. */
gt_status ckpt_hash_file(const char *path, uint64_t *bytes, uint64_t *xxh64, gt_error *err);
/* The manifest's entry of tensor `name`, or NULL. */
const gt_checkpoint_tensor *ckpt_find_tensor(const gt_checkpoint_info *info, const char *name);
/* The version-2 xxh64 of tensor file st (gt_checkpoint.h; opened lazily): the bytes before its
 * data section, then each tensor's xxh64 as the manifest info records it, in the order of the
 * tensors' bytes in the file; *bytes = the file's size. A tensor of the file missing from info is
 * a format error. */
gt_status ckpt_hash_tensor_file(const gt_safetensors *st, const gt_checkpoint_info *info,
                                uint64_t *bytes, uint64_t *xxh64, gt_error *err);
/* GT_OK when folder has a step-<step> directory; otherwise an error that lists the complete
 * checkpoints' steps ("10, 20, 30", at most the last 20). */
gt_status ckpt_need_step_dir(const char *folder, int64_t step, gt_error *err);

#endif
