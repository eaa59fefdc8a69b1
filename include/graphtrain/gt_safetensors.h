/* gt_safetensors.h — read and write the safetensors format (Hugging Face).
 *
 * File layout: u64 little-endian header length N, then N bytes of JSON
 * {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ..., "__metadata__":
 * {str: str}}, then the data section; offsets are relative to it. Everything is validated before
 * use: header length against the file size, JSON syntax, dtype names, shape × dtype size == end −
 * begin, offsets inside the data section, no two tensors overlapping. Every error names the file
 * and the tensor or field at fault. */
#ifndef GRAPHTRAIN_GT_SAFETENSORS_H
#define GRAPHTRAIN_GT_SAFETENSORS_H

#include "gt_core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    char *name;
    gt_dtype dtype;
    int ndim;
    int64_t shape[GT_MAX_DIMS];
    uint64_t begin, end; /* byte range inside the data section */
} gt_st_entry;

typedef struct {
    char *path;
    gt_st_entry *entries; /* in header order */
    int n_entries;
    char **meta_keys, **meta_values; /* __metadata__ */
    int n_meta;
    uint8_t *data; /* the data section, read into memory (NULL when opened lazily) */
    uint64_t data_len;
    bool lazy;            /* gt_safetensors_open_lazy: data stays in the file, read on demand */
    int fd;               /* lazy: the open file */
    uint64_t data_offset; /* lazy: where the data section starts in the file */
} gt_safetensors;

gt_status gt_safetensors_open(const char *path, gt_safetensors *st, gt_error *err);
/* Parses an in-memory file (buf is copied; name is used in messages and as st->path). */
gt_status gt_safetensors_parse(const char *name, const uint8_t *buf, size_t len, gt_safetensors *st,
                               gt_error *err);
/* As gt_safetensors_open, reading and validating only the header: tensor bytes stay in the file
 * and gt_safetensors_read fetches them, so a file larger than memory can be read a tensor at a
 * time. */
gt_status gt_safetensors_open_lazy(const char *path, gt_safetensors *st, gt_error *err);
/* Entry e's bytes (e->end - e->begin of them) into dst, from memory or, lazily, from the file (a
 * file that shrank since it was opened: GT_ERR_IO naming it). */
gt_status gt_safetensors_read(const gt_safetensors *st, const gt_st_entry *e, void *dst,
                              gt_error *err);
/* Bytes [offset, offset + len) of entry e (within it: a caller bug else), as gt_safetensors_read. */
gt_status gt_safetensors_read_range(const gt_safetensors *st, const gt_st_entry *e,
                                    uint64_t offset, void *dst, size_t len, gt_error *err);
/* xxh64 (seed 0) of entry e's bytes, read a block at a time when lazy (never the whole entry in
 * memory). */
gt_status gt_safetensors_hash(const gt_safetensors *st, const gt_st_entry *e, uint64_t *xxh64,
                              gt_error *err);
/* The file's data_offset bytes before its data section (length, header, padding) into dst; files
 * opened lazily only. */
gt_status gt_safetensors_read_head(const gt_safetensors *st, void *dst, gt_error *err);
void gt_safetensors_close(gt_safetensors *st);
const gt_st_entry *gt_safetensors_find(const gt_safetensors *st, const char *name);
/* A copy of the named tensor (allocated; caller frees). Missing name: GT_ERR_INVALID naming it. */
gt_status gt_safetensors_get(const gt_safetensors *st, const char *name, gt_tensor *out,
                             gt_error *err);
const char *gt_safetensors_meta(const gt_safetensors *st, const char *key); /* NULL if absent */

/* Writes n tensors atomically (temporary name, fsync, rename). meta: n_meta key/value pairs. */
gt_status gt_safetensors_write(const char *path, int n, const char *const *names,
                               const gt_tensor *const *tensors, int n_meta,
                               const char *const *meta_keys, const char *const *meta_values,
                               gt_error *err);

/* Creates path (it must not exist) as the safetensors file of the tensors descs (dtypes and shapes;
 * data unused) whose bytes are yet to be written: the header as gt_safetensors_write writes it,
 * then the data section allocated (fallocate; sized and sparse where the filesystem cannot) but
 * unwritten. Writers find each tensor's place from the header (gt_safetensors_open_lazy: its
 * entry's data_offset + begin) and fill it in any order (pwrite); whoever finishes fsyncs. Errors
 * as gt_safetensors_write's (a full disk fails here); a failed create leaves no file. */
gt_status gt_safetensors_create(const char *path, int n, const char *const *names,
                                const gt_tensor *const *descs, int n_meta,
                                const char *const *meta_keys, const char *const *meta_values,
                                gt_error *err);

/* Where a streaming write finds tensor i's bytes (gt_tensor_nbytes of its descriptor): asked once
 * per tensor, in order 0 .. n-1; *data need only stay valid until the next call. An error stops
 * the write (nothing is left behind) and is returned as it is. */
typedef gt_status (*gt_tensor_source)(int i, const void **data, void *user, gt_error *err);
/* The source of tensors that are in memory: user is the `const gt_tensor *const *` array, and
 * tensor i's bytes are its data. */
gt_status gt_tensor_array_source(int i, const void **data, void *user, gt_error *err);
/* As gt_safetensors_write, with each tensor's dtype and shape from descs (their data unused) and
 * its bytes from src, one tensor at a time: the tensors need never be in memory together. */
gt_status gt_safetensors_write_from(const char *path, int n, const char *const *names,
                                    const gt_tensor *const *descs, gt_tensor_source src, void *user,
                                    int n_meta, const char *const *meta_keys,
                                    const char *const *meta_values, gt_error *err);

#ifdef __cplusplus
}
#endif
#endif
