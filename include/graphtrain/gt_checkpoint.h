/* gt_checkpoint.h — crash-safe training checkpoints: named tensors + a JSON manifest.
 *
 * A checkpoint of step N is the directory FOLDER/step-<N>/ holding
 *   model.safetensors   every tensor the caller passes (parameters under their fqn, optimizer
 *                       state under names the caller picks, e.g. "optim.exp_avg.<fqn>");
 *   manifest.json       {"format": "graphtrain-checkpoint", "version": 2, "step": N,
 *                        "model": {"name", "flavor", "fingerprint": "<16 hex>"},
 *                        "tensors": {name: {"dtype", "shape", "xxh64": "<16 hex>"}},
 *                        "files": {"model.safetensors": {"bytes": n, "xxh64": "<16 hex>"}},
 *                        "loader": {caller JSON object}, "rng": {"seed": i, "counters": {name: i}},
 *                        "extra": {string: string}}.
 * A tensor's xxh64 (seed 0) is of its bytes. model.safetensors' xxh64 (version 2) is of the file's
 * bytes before the data section (header length, header, padding) followed by its tensors' xxh64s
 * in the order their bytes lie in the file, each as 8 little-endian bytes: it covers every byte
 * of the file as a hash of the whole file does, and a save or a load that hashed the tensors
 * needs no further pass over the data. Version 1 (still read) recorded the whole file's xxh64.
 * The module knows nothing of models or graphs: the caller names the tensors, provides the model
 * identity (name, flavor, a 64-bit fingerprint of its parameter names/dtypes/shapes) and the
 * loader position as a JSON object.
 *
 * Atomicity: everything is written into FOLDER/.tmp-step-<N>-<pid>/ and fsynced, the directory is
 * renamed to step-<N> and FOLDER is fsynced. A kill at any moment leaves either the complete new
 * checkpoint or none of it; step-<N> directories without a valid manifest are never "complete".
 * Stale .tmp-* directories (their writer is dead) are removed by the next save and ignored by
 * everything else. One writer per folder at a time.
 *
 * Loading validates everything before touching the caller's tensors: manifest JSON (every field),
 * file sizes, xxh64 checksums of each tensor and of each file, the safetensors header against the
 * manifest, the model identity and every expected tensor's dtype and shape. A failed load changes
 * nothing the caller owns; its message names the checkpoint file and the mismatch. */
#ifndef GRAPHTRAIN_GT_CHECKPOINT_H
#define GRAPHTRAIN_GT_CHECKPOINT_H

#include "gt_core.h"
#include "gt_safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

/* find_latest's "there is no checkpoint" result (a step, not an error). */
#define GT_CHECKPOINT_NONE ((int64_t)-1)

#define GT_CHECKPOINT_FORMAT "graphtrain-checkpoint"
#define GT_CHECKPOINT_VERSION 2 /* written; 1 and 2 are read */
#define GT_CHECKPOINT_MANIFEST "manifest.json"
#define GT_CHECKPOINT_TENSOR_FILE "model.safetensors"

/* Which model a checkpoint belongs to. fingerprint: see gt_checkpoint_fingerprint. */
typedef struct {
    const char *name;   /* "llama3" */
    const char *flavor; /* "debugmodel" */
    uint64_t fingerprint;
} gt_checkpoint_model;

/* Everything but the tensors that one save writes. Pointers are borrowed for the call. */
typedef struct {
    const char *folder; /* created (with parents) if missing */
    int64_t step;       /* >= 0 */
    gt_checkpoint_model model;
    const char *loader_json; /* the loader position, a JSON object as text; NULL means {} */
    int64_t rng_seed;
    int n_rng_counters; /* named RNG counters (e.g. dropout offset); names unique */
    const char *const *rng_counter_names;
    const int64_t *rng_counters;
    int n_extra; /* free string metadata; keys unique */
    const char *const *extra_keys;
    const char *const *extra_values;
    int keep_last; /* after a successful save keep the keep_last highest steps; <= 0 keeps all */
    /* the pruned steps are renamed to .tmp-* names at once and removed by a thread, which the
     * next save or prune (or gt_checkpoint_prune_wait) joins: unlinking a large file that is
     * still in the page cache takes seconds (16.5 s for 96 GB on an H200 host) */
    bool prune_in_background;
} gt_checkpoint_desc;

/* One tensor / file recorded in a manifest. */
typedef struct {
    char *name;
    gt_dtype dtype;
    int ndim;
    int64_t shape[GT_MAX_DIMS];
    uint64_t xxh64; /* of the tensor's bytes, seed 0 */
} gt_checkpoint_tensor;

typedef struct {
    char *name;     /* a plain file name inside the step directory */
    uint64_t bytes; /* file size */
    uint64_t xxh64; /* of the whole file, seed 0 */
} gt_checkpoint_file;

/* A parsed manifest (all strings owned; free with gt_checkpoint_info_free). */
typedef struct {
    int version; /* the manifest's (a parsed one's: 1 or 2) */
    int64_t step;
    char *model_name, *model_flavor;
    uint64_t fingerprint;
    gt_checkpoint_tensor *tensors; /* manifest order */
    int n_tensors;
    gt_checkpoint_file *files;
    int n_files;
    char *loader_json; /* compact JSON object text */
    int64_t rng_seed;
    int n_rng_counters;
    char **rng_counter_names;
    int64_t *rng_counters;
    int n_extra;
    char **extra_keys, **extra_values;
} gt_checkpoint_info;

void gt_checkpoint_info_free(gt_checkpoint_info *info);
/* Value of a named counter / extra key in info; false / NULL when absent. */
bool gt_checkpoint_info_counter(const gt_checkpoint_info *info, const char *name, int64_t *out);
const char *gt_checkpoint_info_extra(const gt_checkpoint_info *info, const char *key);

/* xxh64 of the lines "<name> <dtype>[d0, d1, ...]\n" sorted by name (bytewise): independent of the
 * order of the list, changed by any name, dtype or shape. */
uint64_t gt_checkpoint_fingerprint(int n, const char *const *names,
                                   const gt_tensor *const *tensors);

/* Writes checkpoint d->step of the n named tensors atomically, replacing an existing step-<N>,
 * then keeps the last d->keep_last. Removes stale .tmp-* directories first. */
gt_status gt_checkpoint_save(const gt_checkpoint_desc *d, int n, const char *const *names,
                             const gt_tensor *const *tensors, gt_error *err);
/* As gt_checkpoint_save, with each tensor's dtype and shape from descs (their data unused) and its
 * bytes from src, one tensor at a time in order (gt_safetensors_write_from): the tensors need never
 * be in memory together. src is asked for a tensor only when the save gets that far (an earlier
 * failure, say of the folder, asks for none). */
gt_status gt_checkpoint_save_from(const gt_checkpoint_desc *d, int n, const char *const *names,
                                  const gt_tensor *const *descs, gt_tensor_source src, void *user,
                                  gt_error *err);

/* A save whose tensor file several writers (ranks) fill at once, with the crash safety of
 * gt_checkpoint_save:
 *   1. one writer calls gt_checkpoint_begin: the temporary step directory and the tensor file with
 *      its header and its data section sized (gt_safetensors_create); w->tensor_path names it
 *      (another process finds it with gt_checkpoint_tensor_path(folder, step, w->pid)), and its
 *      header says where each tensor's bytes go;
 *   2. every writer pwrites its bytes there and fsyncs;
 *   3. the first calls gt_checkpoint_finish with every tensor's xxh64 (of its whole bytes, seed
 *      0): the file is fsynced and hashed as it lies on disk, the manifest written, the directory
 *      published as step-<N> and the folder pruned;
 *   4. gt_checkpoint_writer_free in any case: a writer that was begun and not finished (another
 *      writer failed) removes its temporary directory.
 * d's strings must stay valid until finish. */
typedef struct {
    gt_checkpoint_desc desc;
    gt_checkpoint_info info;
    char tmp_name[96];
    long pid;
    char *tensor_path;
    bool open;
} gt_checkpoint_writer;

gt_status gt_checkpoint_begin(const gt_checkpoint_desc *d, int n, const char *const *names,
                              const gt_tensor *const *descs, gt_checkpoint_writer *w,
                              gt_error *err);
gt_status gt_checkpoint_finish(gt_checkpoint_writer *w, const uint64_t *xxh64, gt_error *err);
void gt_checkpoint_writer_free(gt_checkpoint_writer *w);
/* The tensor file of the save of `step` into folder begun by process writer_pid (malloc'd). */
char *gt_checkpoint_tensor_path(const char *folder, int64_t step, long writer_pid);

/* Complete checkpoints (step-<N> with a valid manifest of step N), ascending. *steps is malloc'd
 * (NULL when *n == 0; free it). A missing folder holds no checkpoint: GT_OK, *n = 0. */
gt_status gt_checkpoint_list(const char *folder, int64_t **steps, int *n, gt_error *err);
/* The highest complete step, or GT_CHECKPOINT_NONE (GT_OK) when there is none. */
gt_status gt_checkpoint_find_latest(const char *folder, int64_t *step, gt_error *err);
/* GT_OK when step is complete; otherwise an error listing the available steps. */
gt_status gt_checkpoint_find_step(const char *folder, int64_t step, gt_error *err);

/* Loads checkpoint `step` (GT_CHECKPOINT_NONE: the latest; none at all is an error) into the n
 * caller tensors, which give the expected dtype and shape of each named tensor (the checkpoint may
 * hold more tensors; they are checked, not loaded). model: the run's identity, compared with the
 * checkpoint's (NULL skips the comparison). info (may be NULL) receives the manifest. The tensors
 * and *info are written only when every check passed; bytes are copied bitwise (read again from
 * the file and hashed again: a file that changes during the copy is refused, after the tensors
 * copied before it). */
gt_status gt_checkpoint_load(const char *folder, int64_t step, const gt_checkpoint_model *model,
                             int n, const char *const *names, gt_tensor *const *tensors,
                             gt_checkpoint_info *info, gt_error *err);
/* Where a streaming load hands tensor i's bytes (gt_tensor_nbytes of its descriptor), valid only
 * during the call. An error stops the load and is returned as it is. */
typedef gt_status (*gt_tensor_sink)(int i, const void *bytes, void *user, gt_error *err);
/* As gt_checkpoint_load, with the expected dtypes and shapes from descs (their data unused) and
 * each tensor handed to sink, in order, once every check passed: the caller slices or copies it
 * where it wants (a rank's block of a whole tensor) without holding the whole state. */
gt_status gt_checkpoint_load_with(const char *folder, int64_t step,
                                  const gt_checkpoint_model *model, int n, const char *const *names,
                                  const gt_tensor *const *descs, gt_tensor_sink sink, void *user,
                                  gt_checkpoint_info *info_out, gt_error *err);

/* A checkpoint read by several readers (ranks), each checking a share of the tensors and reading
 * only the bytes it keeps:
 *   gt_checkpoint_open: the checks of gt_checkpoint_load that read no tensor data (manifest,
 *     model identity, the expected tensors' dtypes and shapes, file sizes, the safetensors header
 *     against the manifest); tensor i is names[i];
 *   gt_checkpoint_verify: manifest tensor k (0 .. info.n_tensors - 1)'s bytes hash to the
 *     manifest's xxh64;
 *   gt_checkpoint_verify_file: the files' hashes (gt_checkpoint.h: version 2's tensor file from its
 *     header and the manifest's tensor hashes — a proof of the data once every tensor is verified
 *     by some reader; version 1 hashes the whole file);
 *   gt_checkpoint_read: bytes [offset, offset + len) of tensor i (within it: a caller bug else);
 *   gt_checkpoint_unchanged: the tensor file is still the one opened (device, inode, size,
 *     modification time), for a reader that read after others verified;
 *   gt_checkpoint_close in any case. */
typedef struct {
    char *dir, *path;
    gt_checkpoint_info info;
    gt_safetensors st;
    const gt_st_entry **entry; /* per expected tensor */
    int n;
    void *buf;
    size_t have;
    int64_t identity[4];
} gt_checkpoint_reader;

gt_status gt_checkpoint_open(const char *folder, int64_t step, const gt_checkpoint_model *model,
                             int n, const char *const *names, const gt_tensor *const *descs,
                             gt_checkpoint_reader *r, gt_error *err);
gt_status gt_checkpoint_verify(gt_checkpoint_reader *r, int k, gt_error *err);
gt_status gt_checkpoint_verify_file(gt_checkpoint_reader *r, gt_error *err);
gt_status gt_checkpoint_read(gt_checkpoint_reader *r, int i, uint64_t offset, void *dst,
                             size_t len, gt_error *err);
gt_status gt_checkpoint_unchanged(const gt_checkpoint_reader *r, gt_error *err);
void gt_checkpoint_close(gt_checkpoint_reader *r);

/* Deletes all but the `keep` highest complete checkpoints (keep <= 0: deletes nothing). A deleted
 * checkpoint is first renamed to a .tmp-* name, so a kill midway never leaves a half-deleted
 * directory that looks complete. */
gt_status gt_checkpoint_prune(const char *folder, int keep, gt_error *err);
/* Waits for the removal a save with prune_in_background left running, if any; a failure there is
 * logged as a warning (the .tmp-* leftover goes with the next save). */
void gt_checkpoint_prune_wait(void);

/* ---------------------------------------------------------------- manifest text */

/* Parses and validates manifest text; name is used in messages. On error *info is empty. */
gt_status gt_checkpoint_manifest_parse(const char *name, const char *text, size_t len,
                                       gt_checkpoint_info *info, gt_error *err);
/* Serializes info (indented JSON, malloc'd text). Fails on invalid strings or loader JSON. */
gt_status gt_checkpoint_manifest_dump(const gt_checkpoint_info *info, char **text, gt_error *err);

#ifdef __cplusplus
}
#endif
#endif
