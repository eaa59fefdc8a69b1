/* safetensors.c — read and write the safetensors format (Hugging Face).
 *
 * Layout: bytes [0, 8) hold N, the header length, as a little-endian u64; bytes [8, 8 + N) hold a
 * JSON object (UTF-8, possibly padded with trailing spaces); bytes [8 + N, file end) are the data
 * section. Each tensor's "data_offsets" [begin, end) are relative to the data section.
 *
 * Reader. gt_safetensors_open reads the whole file into memory; gt_safetensors_open_lazy reads
 * only the header and gt_safetensors_read preads one entry's bytes when asked (checkpoints: one
 * tensor in memory at a time; a file that shrinks meanwhile is an IO error, not a crash, which an
 * mmap would make it). Everything is validated before a single tensor byte is touched:
 *   - the file holds the 8-byte length; N <= 100 MB (the limit Hugging Face uses) and N <= size-8;
 *   - the header is valid JSON (jansson, with duplicate keys rejected) and a JSON object;
 *   - every entry is an object with a known dtype string, a shape array of at most GT_MAX_DIMS
 *     non-negative integers whose byte count numel × dtype size fits in 64 bits, and data_offsets
 *     [begin, end] with begin <= end <= data section length and end − begin == the byte count;
 *   - "__metadata__", if present, is an object of string → string;
 *   - other keys inside an entry are ignored, as Hugging Face's reader ignores them;
 *   - no two tensors share a byte: ranges sorted by begin must not overlap.
 * The spec also asks that the tensors cover the data section without holes. We accept holes
 * (they are harmless for reading: unreferenced bytes are never used) but reject overlaps, which
 * would let one tensor alias another. An empty range (a tensor with zero elements) holds no byte,
 * so it never overlaps anything.
 *
 * Writer. Tensors go in the given order with contiguous offsets; the header is padded with spaces
 * to a multiple of 8 bytes so the data section starts 8-byte aligned; "__metadata__" comes first
 * when there is metadata. Hugging Face's writer sorts tensors by dtype alignment, then name; the
 * spec does not require it, and keeping the caller's order keeps files diffable. The write is
 * atomic: "<path>.tmp.<pid>" is written, flushed, fsynced, renamed over path, and the directory is
 * fsynced so the rename itself survives a crash.
 *
 * Byte order: tensor bytes are copied as they are, which is correct on a little-endian host only;
 * the #error below makes that assumption explicit. */
#define _GNU_SOURCE /* fallocate */
#include "graphtrain/gt_safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c copies tensor bytes verbatim and needs a little-endian host"
#endif

#define ST_MAX_HEADER_LEN 100000000ull /* 100 MB, as Hugging Face's reader */
#define ST_METADATA_KEY "__metadata__"

/* Tensor names and other user strings are clipped in messages so one absurd name cannot push the
 * file path and the reason out of the fixed-size error buffer. */
#define ST_NAME_FMT "\"%.200s\""

/* The safetensors dtype strings we read and write. Others (F64, U8, F8_E4M3, …) are valid
 * safetensors but not graphtrain dtypes: reading them is an "unsupported dtype" error. */
static const struct {
    const char *name;
    gt_dtype dtype;
} st_dtypes[] = {
    {"F32", GT_F32}, {"BF16", GT_BF16}, {"F16", GT_F16},
    {"I32", GT_I32}, {"I64", GT_I64},   {"BOOL", GT_BOOL},
};
#define ST_N_DTYPES ((int)(sizeof st_dtypes / sizeof st_dtypes[0]))

static bool st_dtype_from_name(const char *s, gt_dtype *out)
{
    for (int i = 0; i < ST_N_DTYPES; i++) {
        if (strcmp(s, st_dtypes[i].name) == 0) {
            *out = st_dtypes[i].dtype;
            return true;
        }
    }
    return false;
}

static const char *st_dtype_name(gt_dtype dt)
{
    for (int i = 0; i < ST_N_DTYPES; i++)
        if (st_dtypes[i].dtype == dt) return st_dtypes[i].name;
    return NULL;
}

/* ---------------------------------------------------------------- reader: header */

/* A JSON integer that must be >= 0 (offsets, dims). */
static bool st_json_nonneg(const json_t *v, uint64_t *out)
{
    if (!json_is_integer(v)) return false;
    json_int_t x = json_integer_value(v);
    if (x < 0) return false;
    *out = (uint64_t)x;
    return true;
}

static gt_status st_parse_metadata(const char *file, const json_t *meta, gt_safetensors *st,
                                   gt_error *err)
{
    if (!json_is_object(meta))
        return gt_error_set(err, GT_ERR_FORMAT,
                            "%s: \"__metadata__\" must be a JSON object of string values", file);
    size_t n = json_object_size(meta);
    st->meta_keys = gt_xcalloc(n, sizeof *st->meta_keys);
    st->meta_values = gt_xcalloc(n, sizeof *st->meta_values);
    const char *key;
    json_t *value;
    json_object_foreach((json_t *)meta, key, value)
    {
        if (!json_is_string(value))
            return gt_error_set(err, GT_ERR_FORMAT,
                                "%s: \"__metadata__\" key " ST_NAME_FMT " must have a string value",
                                file, key);
        st->meta_keys[st->n_meta] = gt_xstrdup(key);
        st->meta_values[st->n_meta] = gt_xstrdup(json_string_value(value));
        st->n_meta++;
    }
    return GT_OK;
}

/* Field key of tensor name's header entry v: a format error when it is missing. */
static gt_status st_entry_field(const char *file, const char *name, const json_t *v,
                                const char *key, const json_t **out, gt_error *err)
{
    *out = json_object_get(v, key);
    if (!*out)
        return gt_error_set(err, GT_ERR_FORMAT, "%s: tensor " ST_NAME_FMT ": missing \"%s\"", file,
                            name, key);
    return GT_OK;
}

/* Fills e from one header entry; data_len bounds the offsets. */
static gt_status st_parse_entry(const char *file, const char *name, const json_t *v,
                                uint64_t data_len, gt_st_entry *e, gt_error *err)
{
    if (!json_is_object(v))
        return gt_error_set(err, GT_ERR_FORMAT,
                            "%s: tensor " ST_NAME_FMT ": entry must be a JSON object", file, name);

    const json_t *dtype, *shape, *offsets;
    GT_TRY(st_entry_field(file, name, v, "dtype", &dtype, err));
    if (!json_is_string(dtype))
        return gt_error_set(err, GT_ERR_FORMAT,
                            "%s: tensor " ST_NAME_FMT ": \"dtype\" must be a string", file, name);
    if (!st_dtype_from_name(json_string_value(dtype), &e->dtype))
        return gt_error_set(err, GT_ERR_FORMAT,
                            "%s: tensor " ST_NAME_FMT ": unsupported dtype \"%.40s\" (expected "
                            "F32, BF16, F16, I32, I64 or BOOL)",
                            file, name, json_string_value(dtype));

    GT_TRY(st_entry_field(file, name, v, "shape", &shape, err));
    if (!json_is_array(shape))
        return gt_error_set(err, GT_ERR_FORMAT,
                            "%s: tensor " ST_NAME_FMT ": \"shape\" must be an array of integers",
                            file, name);
    size_t rank = json_array_size(shape);
    if (rank > GT_MAX_DIMS)
        return gt_error_set(err, GT_ERR_FORMAT,
                            "%s: tensor " ST_NAME_FMT ": rank %zu exceeds the maximum of %d dims",
                            file, name, rank, GT_MAX_DIMS);
    e->ndim = (int)rank;
    for (size_t d = 0; d < rank; d++) {
        const json_t *dim = json_array_get(shape, d);
        if (!json_is_integer(dim))
            return gt_error_set(err, GT_ERR_FORMAT,
                                "%s: tensor " ST_NAME_FMT ": shape[%zu] must be an integer", file,
                                name, d);
        if (json_integer_value(dim) < 0)
            return gt_error_set(err, GT_ERR_FORMAT,
                                "%s: tensor " ST_NAME_FMT ": shape[%zu] = %lld is negative", file,
                                name, d, (long long)json_integer_value(dim));
        e->shape[d] = (int64_t)json_integer_value(dim);
    }
    /* nbytes = prod(shape) × dtype size, each step checked for 64-bit overflow. */
    int64_t numel = gt_shape_numel(e->ndim, e->shape);
    uint64_t nbytes;
    if (numel < 0 ||
        __builtin_mul_overflow((uint64_t)numel, (uint64_t)gt_dtype_size(e->dtype), &nbytes))
        return gt_error_set(err, GT_ERR_FORMAT,
                            "%s: tensor " ST_NAME_FMT ": shape overflows (its byte count does not "
                            "fit in 64 bits)",
                            file, name);

    GT_TRY(st_entry_field(file, name, v, "data_offsets", &offsets, err));
    if (!json_is_array(offsets) || json_array_size(offsets) != 2 ||
        !st_json_nonneg(json_array_get(offsets, 0), &e->begin) ||
        !st_json_nonneg(json_array_get(offsets, 1), &e->end))
        return gt_error_set(err, GT_ERR_FORMAT,
                            "%s: tensor " ST_NAME_FMT ": \"data_offsets\" must be an array of 2 "
                            "non-negative integers [begin, end]",
                            file, name);
    if (e->begin > e->end)
        return gt_error_set(err, GT_ERR_FORMAT,
                            "%s: tensor " ST_NAME_FMT ": data_offsets begin %llu > end %llu", file,
                            name, (unsigned long long)e->begin, (unsigned long long)e->end);
    if (e->end > data_len)
        return gt_error_set(err, GT_ERR_FORMAT,
                            "%s: tensor " ST_NAME_FMT ": data_offsets end %llu is past the end of "
                            "the data section (%llu bytes)",
                            file, name, (unsigned long long)e->end, (unsigned long long)data_len);
    if (e->end - e->begin != nbytes)
        return gt_error_set(err, GT_ERR_FORMAT,
                            "%s: tensor " ST_NAME_FMT ": data_offsets span %llu bytes but shape x "
                            "dtype size is %llu bytes",
                            file, name, (unsigned long long)(e->end - e->begin),
                            (unsigned long long)nbytes);
    e->name = gt_xstrdup(name);
    return GT_OK;
}

static int st_cmp_range(const void *pa, const void *pb)
{
    const gt_st_entry *a = *(const gt_st_entry *const *)pa, *b = *(const gt_st_entry *const *)pb;
    if (a->begin != b->begin) return a->begin < b->begin ? -1 : 1;
    if (a->end != b->end) return a->end < b->end ? -1 : 1;
    return 0;
}

/* Sorted by begin, ranges [b_i, e_i) are disjoint iff every b_i >= max(e_j, j < i). Empty ranges
 * hold no bytes and are skipped. */
static gt_status st_check_overlaps(const char *file, const gt_safetensors *st, gt_error *err)
{
    if (st->n_entries < 2) return GT_OK;
    const gt_st_entry **order = gt_xcalloc((size_t)st->n_entries, sizeof *order);
    for (int i = 0; i < st->n_entries; i++)
        order[i] = &st->entries[i];
    qsort(order, (size_t)st->n_entries, sizeof *order, st_cmp_range);
    const gt_st_entry *last = NULL; /* the non-empty range reaching furthest so far */
    gt_status status = GT_OK;
    for (int i = 0; i < st->n_entries; i++) {
        const gt_st_entry *e = order[i];
        if (e->begin == e->end) continue;
        if (last && e->begin < last->end) {
            status = gt_error_set(err, GT_ERR_FORMAT,
                                  "%s: tensors " ST_NAME_FMT " [%llu, %llu) and " ST_NAME_FMT
                                  " [%llu, %llu) overlap in the data section",
                                  file, last->name, (unsigned long long)last->begin,
                                  (unsigned long long)last->end, e->name,
                                  (unsigned long long)e->begin, (unsigned long long)e->end);
            break;
        }
        if (!last || e->end > last->end) last = e;
    }
    free(order);
    return status;
}

/* Validates buf (a whole file) and fills everything in st except path and data. *data_offset and
 * st->data_len locate the data section inside buf. On error st may be partly filled: the caller
 * closes it. */
static gt_status st_parse_header(const char *file, const uint8_t *buf, size_t len,
                                 gt_safetensors *st, size_t *data_offset, gt_error *err)
{
    if (len < 8)
        return gt_error_set(err, GT_ERR_FORMAT,
                            "%s: file is %zu bytes, shorter than the 8-byte header length field",
                            file, len);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | buf[i];
    if (hlen > ST_MAX_HEADER_LEN)
        return gt_error_set(err, GT_ERR_FORMAT,
                            "%s: header length %llu exceeds the limit of %llu bytes (corrupt or "
                            "not a safetensors file)",
                            file, (unsigned long long)hlen, ST_MAX_HEADER_LEN);
    if (hlen > len - 8)
        return gt_error_set(err, GT_ERR_FORMAT,
                            "%s: header length %llu runs past the end of the file (%zu bytes "
                            "follow the length field; truncated?)",
                            file, (unsigned long long)hlen, len - 8);
    *data_offset = 8 + (size_t)hlen;
    st->data_len = (uint64_t)(len - *data_offset);

    /* jansson allows trailing whitespace (the spec's space padding) and rejects NUL bytes, invalid
     * UTF-8 and nesting deeper than its parser limit. */
    json_error_t jerr;
    json_t *root = json_loadb((const char *)buf + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return gt_error_set(err, GT_ERR_FORMAT, "%s: invalid JSON header at line %d, column %d: %s",
                            file, jerr.line, jerr.column, jerr.text);
    gt_status status = GT_OK;
    if (!json_is_object(root)) {
        status = gt_error_set(err, GT_ERR_FORMAT, "%s: header is not a JSON object", file);
        goto done;
    }
    size_t n = json_object_size(root);
    if (json_object_get(root, ST_METADATA_KEY)) n--;
    st->entries = gt_xcalloc(n, sizeof *st->entries);
    const char *key;
    json_t *value;
    json_object_foreach(root, key, value)
    {
        if (strcmp(key, ST_METADATA_KEY) == 0) {
            status = st_parse_metadata(file, value, st, err);
        } else {
            status =
                st_parse_entry(file, key, value, st->data_len, &st->entries[st->n_entries], err);
            if (status == GT_OK) st->n_entries++;
        }
        if (status != GT_OK) goto done;
    }
    status = st_check_overlaps(file, st, err);
done:
    json_decref(root);
    return status;
}

/* ---------------------------------------------------------------- reader: public */

gt_status gt_safetensors_parse(const char *name, const uint8_t *buf, size_t len, gt_safetensors *st,
                               gt_error *err)
{
    memset(st, 0, sizeof *st);
    if (!name) name = "<memory>";
    if (!buf && len > 0)
        return gt_error_set(err, GT_ERR_INVALID, "%s: NULL buffer of %zu bytes", name, len);
    size_t data_offset = 0;
    gt_status status = st_parse_header(name, buf, len, st, &data_offset, err);
    if (status != GT_OK) {
        gt_safetensors_close(st);
        return status;
    }
    st->data = malloc(st->data_len ? (size_t)st->data_len : 1);
    if (!st->data) {
        status = gt_error_set(err, GT_ERR_NOMEM, "%s: out of memory for the %llu-byte data section",
                              name, (unsigned long long)st->data_len);
        gt_safetensors_close(st);
        return status;
    }
    if (st->data_len) memcpy(st->data, buf + data_offset, (size_t)st->data_len);
    st->path = gt_xstrdup(name);
    return GT_OK;
}

/* Opens a regular file for reading: *fd and its length. */
static gt_status st_open_regular(const char *path, int *fd_out, size_t *len, gt_error *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return gt_error_set(err, GT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return gt_error_set(err, GT_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return gt_error_set(err, GT_ERR_IO, "%s: not a regular file", path);
    }
    *fd_out = fd;
    *len = (size_t)sb.st_size;
    return GT_OK;
}

/* Reads a whole regular file into a malloc'd buffer. */
static gt_status st_read_file(const char *path, uint8_t **out, size_t *out_len, gt_error *err)
{
    int fd;
    size_t len;
    GT_TRY(st_open_regular(path, &fd, &len, err));
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf) {
        close(fd);
        return gt_error_set(err, GT_ERR_NOMEM, "%s: out of memory reading %zu bytes", path, len);
    }
    size_t got = 0;
    while (got < len) {
        ssize_t r = read(fd, buf + got, len - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            int e = errno;
            free(buf);
            close(fd);
            if (r == 0)
                return gt_error_set(err, GT_ERR_IO,
                                    "%s: file shrank while reading (%zu of %zu "
                                    "bytes)",
                                    path, got, len);
            return gt_error_set(err, GT_ERR_IO, "%s: read failed: %s", path, strerror(e));
        }
        got += (size_t)r;
    }
    close(fd);
    *out = buf;
    *out_len = len;
    return GT_OK;
}

gt_status gt_safetensors_open(const char *path, gt_safetensors *st, gt_error *err)
{
    memset(st, 0, sizeof *st);
    if (!path) return gt_error_set(err, GT_ERR_INVALID, "safetensors open: NULL path");
    uint8_t *buf = NULL;
    size_t len = 0;
    GT_TRY(st_read_file(path, &buf, &len, err));
    size_t data_offset = 0;
    gt_status status = st_parse_header(path, buf, len, st, &data_offset, err);
    if (status != GT_OK) {
        free(buf);
        gt_safetensors_close(st);
        return status;
    }
    /* Keep the file buffer as the data section: slide the data to its start instead of copying,
     * so a large checkpoint is held once. */
    if (st->data_len) memmove(buf, buf + data_offset, (size_t)st->data_len);
    uint8_t *shrunk = realloc(buf, st->data_len ? (size_t)st->data_len : 1);
    st->data = shrunk ? shrunk : buf;
    st->path = gt_xstrdup(path);
    return GT_OK;
}

/* Reads len bytes at offset of fd into buf; a short read is a file that shrank. */
static gt_status st_pread(const char *path, int fd, void *buf, size_t len, uint64_t offset,
                          gt_error *err)
{
    size_t got = 0;
    while (got < len) {
        ssize_t r = pread(fd, (char *)buf + got, len - got, (off_t)(offset + got));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0)
            return gt_error_set(err, GT_ERR_IO, "%s: read failed: %s", path, strerror(errno));
        if (r == 0)
            return gt_error_set(err, GT_ERR_IO,
                                "%s: file shrank while reading (%zu of %zu bytes at offset %llu)",
                                path, got, len, (unsigned long long)offset);
        got += (size_t)r;
    }
    return GT_OK;
}

gt_status gt_safetensors_open_lazy(const char *path, gt_safetensors *st, gt_error *err)
{
    memset(st, 0, sizeof *st);
    if (!path) return gt_error_set(err, GT_ERR_INVALID, "safetensors open: NULL path");
    int fd;
    size_t len;
    GT_TRY(st_open_regular(path, &fd, &len, err));
    /* the length field, then (when it is plausible) the header it announces: st_parse_header
     * checks the length against the file's before it reads past the first 8 bytes */
    size_t head = len < 8 ? len : 8;
    uint8_t lenbuf[8] = {0};
    gt_status status = st_pread(path, fd, lenbuf, head, 0, err);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | lenbuf[i];
    if (len >= 8 && hlen <= ST_MAX_HEADER_LEN && hlen <= len - 8) head = 8 + (size_t)hlen;
    uint8_t *buf = status == GT_OK ? malloc(head ? head : 1) : NULL;
    if (status == GT_OK && !buf)
        status = gt_error_set(err, GT_ERR_NOMEM, "%s: out of memory for the header", path);
    if (status == GT_OK) status = st_pread(path, fd, buf, head, 0, err);
    size_t data_offset = 0;
    if (status == GT_OK) status = st_parse_header(path, buf, len, st, &data_offset, err);
    free(buf);
    if (status != GT_OK) {
        close(fd);
        gt_safetensors_close(st);
        return status;
    }
    st->lazy = true;
    st->fd = fd;
    st->data_offset = data_offset;
    st->path = gt_xstrdup(path);
    return GT_OK;
}

gt_status gt_safetensors_read_range(const gt_safetensors *st, const gt_st_entry *e, uint64_t offset,
                                    void *dst, size_t len, gt_error *err)
{
    GT_CHECK(offset <= e->end - e->begin && len <= e->end - e->begin - offset);
    if (len == 0) return GT_OK;
    if (!st->lazy) {
        memcpy(dst, st->data + e->begin + offset, len);
        return GT_OK;
    }
    return st_pread(st->path, st->fd, dst, len, st->data_offset + e->begin + offset, err);
}

gt_status gt_safetensors_read(const gt_safetensors *st, const gt_st_entry *e, void *dst,
                              gt_error *err)
{
    return gt_safetensors_read_range(st, e, 0, dst, (size_t)(e->end - e->begin), err);
}

gt_status gt_safetensors_read_head(const gt_safetensors *st, void *dst, gt_error *err)
{
    GT_CHECK(st->lazy);
    return st_pread(st->path, st->fd, dst, (size_t)st->data_offset, 0, err);
}

gt_status gt_safetensors_hash(const gt_safetensors *st, const gt_st_entry *e, uint64_t *xxh64,
                              gt_error *err)
{
    uint64_t n = e->end - e->begin;
    if (!st->lazy) {
        *xxh64 = gt_hash64(st->data + e->begin, (size_t)n, 0);
        return GT_OK;
    }
    enum { BLOCK = 8 << 20 };
    char *buf = gt_xmalloc(BLOCK);
    XXH64_state_t *state = XXH64_createState();
    GT_CHECK(state != NULL);
    XXH64_reset(state, 0);
    gt_status status = GT_OK;
    for (uint64_t done = 0; done < n && status == GT_OK; done += BLOCK) {
        size_t len = n - done < BLOCK ? (size_t)(n - done) : BLOCK;
        status = gt_safetensors_read_range(st, e, done, buf, len, err);
        if (status == GT_OK) XXH64_update(state, buf, len);
    }
    if (status == GT_OK) *xxh64 = (uint64_t)XXH64_digest(state);
    XXH64_freeState(state);
    free(buf);
    return status;
}

void gt_safetensors_close(gt_safetensors *st)
{
    if (!st) return;
    if (st->lazy) close(st->fd);
    for (int i = 0; i < st->n_entries; i++)
        free(st->entries[i].name);
    free(st->entries);
    for (int i = 0; i < st->n_meta; i++) {
        free(st->meta_keys[i]);
        free(st->meta_values[i]);
    }
    free(st->meta_keys);
    free(st->meta_values);
    free(st->data);
    free(st->path);
    memset(st, 0, sizeof *st);
}

/* Linear scan: headers hold at most a few thousand names and lookups are once per load. */
const gt_st_entry *gt_safetensors_find(const gt_safetensors *st, const char *name)
{
    if (!st || !name) return NULL;
    for (int i = 0; i < st->n_entries; i++)
        if (strcmp(st->entries[i].name, name) == 0) return &st->entries[i];
    return NULL;
}

gt_status gt_safetensors_get(const gt_safetensors *st, const char *name, gt_tensor *out,
                             gt_error *err)
{
    memset(out, 0, sizeof *out);
    const gt_st_entry *e = gt_safetensors_find(st, name);
    if (!e)
        return gt_error_set(err, GT_ERR_INVALID, "%s: no tensor named " ST_NAME_FMT,
                            st && st->path ? st->path : "<safetensors>", name ? name : "(null)");
    gt_status status = gt_tensor_alloc(out, e->dtype, e->ndim, e->shape, err);
    if (status != GT_OK) return gt_error_wrap(err, "%s: tensor " ST_NAME_FMT, st->path, name);
    /* Validated when the header was parsed. */
    GT_CHECK(gt_tensor_nbytes(out) == e->end - e->begin && e->end <= st->data_len);
    if (e->end > e->begin) memcpy(out->data, st->data + e->begin, (size_t)(e->end - e->begin));
    return GT_OK;
}

const char *gt_safetensors_meta(const gt_safetensors *st, const char *key)
{
    if (!st || !key) return NULL;
    for (int i = 0; i < st->n_meta; i++)
        if (strcmp(st->meta_keys[i], key) == 0) return st->meta_values[i];
    return NULL;
}

/* ---------------------------------------------------------------- writer */

/* Builds the JSON header of n tensors (contiguous offsets in the given order) from their dtypes and
 * shapes (need_data: each non-empty one must have data). */
static gt_status st_build_header(const char *path, int n, const char *const *names,
                                 const gt_tensor *const *tensors, bool need_data, int n_meta,
                                 const char *const *meta_keys, const char *const *meta_values,
                                 json_t **out, gt_error *err)
{
    json_t *root = json_object();
    gt_status status = GT_OK;
    if (n_meta > 0) {
        json_t *meta = json_object();
        json_object_set_new(root, ST_METADATA_KEY, meta);
        for (int i = 0; i < n_meta; i++) {
            const char *k = meta_keys[i], *v = meta_values[i];
            if (!k || !v) {
                status = gt_error_set(err, GT_ERR_INVALID,
                                      "%s: metadata entry %d has a NULL key or value", path, i);
                goto fail;
            }
            if (json_object_get(meta, k)) {
                status = gt_error_set(err, GT_ERR_INVALID,
                                      "%s: duplicate metadata key " ST_NAME_FMT, path, k);
                goto fail;
            }
            json_t *js = json_string(v);
            if (!js || json_object_set_new(meta, k, js) != 0) {
                status = gt_error_set(
                    err, GT_ERR_INVALID,
                    "%s: metadata key " ST_NAME_FMT " or its value is not valid UTF-8", path, k);
                goto fail;
            }
        }
    }
    uint64_t offset = 0;
    for (int i = 0; i < n; i++) {
        const char *name = names[i];
        const gt_tensor *t = tensors[i];
        if (!name || !name[0]) {
            status = gt_error_set(err, GT_ERR_INVALID, "%s: tensor %d has an empty name", path, i);
            goto fail;
        }
        if (strcmp(name, ST_METADATA_KEY) == 0 || json_object_get(root, name)) {
            status = gt_error_set(err, GT_ERR_INVALID,
                                  "%s: tensor name " ST_NAME_FMT " is used twice or is reserved",
                                  path, name);
            goto fail;
        }
        const char *dtype = t ? st_dtype_name(t->dtype) : NULL;
        if (!t || !dtype || t->ndim < 0 || t->ndim > GT_MAX_DIMS) {
            status = gt_error_set(err, GT_ERR_INVALID,
                                  "%s: tensor " ST_NAME_FMT " is NULL or has a bad dtype or rank",
                                  path, name);
            goto fail;
        }
        int64_t numel = gt_shape_numel(t->ndim, t->shape);
        uint64_t nbytes;
        if (numel < 0 ||
            __builtin_mul_overflow((uint64_t)numel, (uint64_t)gt_dtype_size(t->dtype), &nbytes) ||
            nbytes > (uint64_t)INT64_MAX - offset || (need_data && nbytes > 0 && !t->data)) {
            status = gt_error_set(err, GT_ERR_INVALID,
                                  "%s: tensor " ST_NAME_FMT
                                  " has a negative or overflowing shape, or no data",
                                  path, name);
            goto fail;
        }
        json_t *shape = json_array();
        for (int d = 0; d < t->ndim; d++)
            json_array_append_new(shape, json_integer(t->shape[d]));
        json_t *entry = json_object();
        json_object_set_new(entry, "dtype", json_string(dtype));
        json_object_set_new(entry, "shape", shape);
        json_object_set_new(entry, "data_offsets",
                            json_pack("[II]", (json_int_t)offset, (json_int_t)(offset + nbytes)));
        if (json_object_set_new(root, name, entry) != 0) {
            status = gt_error_set(err, GT_ERR_INVALID,
                                  "%s: tensor name " ST_NAME_FMT " is not valid UTF-8", path, name);
            goto fail;
        }
        offset += nbytes;
    }
    *out = root;
    return GT_OK;
fail:
    json_decref(root);
    return status;
}

/* fsync of the directory makes the rename durable. Some filesystems cannot fsync a directory
 * (EINVAL); that is not an error there. */
static gt_status st_fsync_dir(const char *path, gt_error *err)
{
    const char *slash = strrchr(path, '/');
    char *dir;
    if (!slash) {
        dir = gt_xstrdup(".");
    } else {
        size_t n = slash == path ? 1 : (size_t)(slash - path);
        dir = gt_xmalloc(n + 1);
        memcpy(dir, path, n);
        dir[n] = '\0';
    }
    gt_status status = GT_OK;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0 || (fsync(fd) != 0 && errno != EINVAL)) {
        status = gt_error_set(err, GT_ERR_IO, "%s: cannot fsync directory %s: %s", path, dir,
                              strerror(errno));
    }
    if (fd >= 0) close(fd);
    free(dir);
    return status;
}

/* The file's prefix: the 8-byte little-endian header length, the JSON header, spaces up to a
 * multiple of 8 (so the data section starts 8-byte aligned); *head is malloc'd. `verb` names the
 * operation in the messages. */
static gt_status st_head(const char *path, const char *verb, int n, const char *const *names,
                         const gt_tensor *const *tensors, bool need_data, int n_meta,
                         const char *const *meta_keys, const char *const *meta_values, char **head,
                         size_t *head_len, gt_error *err)
{
    if (!path || !path[0])
        return gt_error_set(err, GT_ERR_INVALID, "safetensors %s: empty path", verb);
    if (n < 0 || n_meta < 0 || (n > 0 && (!names || !tensors)) ||
        (n_meta > 0 && (!meta_keys || !meta_values)))
        return gt_error_set(err, GT_ERR_INVALID,
                            "%s: bad arguments (n = %d, n_meta = %d, or NULL arrays)", path, n,
                            n_meta);
    json_t *root = NULL;
    GT_TRY(st_build_header(path, n, names, tensors, need_data, n_meta, meta_keys, meta_values,
                           &root, err));
    char *header = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    if (!header) return gt_error_set(err, GT_ERR_NOMEM, "%s: cannot serialize the header", path);
    size_t hlen = strlen(header), padded = (hlen + 7) / 8 * 8;
    char *h = gt_xmalloc(8 + padded);
    for (int i = 0; i < 8; i++)
        h[i] = (char)(uint8_t)((uint64_t)padded >> (8 * i));
    memcpy(h + 8, header, hlen);
    memset(h + 8 + hlen, ' ', padded - hlen);
    free(header);
    *head = h;
    *head_len = 8 + padded;
    return GT_OK;
}

gt_status gt_safetensors_create(const char *path, int n, const char *const *names,
                                const gt_tensor *const *descs, int n_meta,
                                const char *const *meta_keys, const char *const *meta_values,
                                gt_error *err)
{
    char *head = NULL;
    size_t head_len = 0;
    GT_TRY(st_head(path, "create", n, names, descs, false, n_meta, meta_keys, meta_values, &head,
                   &head_len, err));
    uint64_t total = 0; /* st_build_header checked every size and the sum */
    for (int i = 0; i < n; i++)
        total += gt_tensor_nbytes(descs[i]);
    gt_status status = GT_OK;
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    const char *what = "create";
    size_t done = 0;
    if (fd < 0) goto io_fail;
    what = "write the header of";
    while (done < head_len) {
        ssize_t w = write(fd, head + done, head_len - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) goto io_fail;
        done += (size_t)w;
    }
    /* the data section's blocks allocated now: a full disk fails here, before anyone writes, and
     * writers filling it at once do not interleave their allocations; sparse where the filesystem
     * cannot allocate ahead */
    what = "size";
    off_t size = (off_t)(head_len + total);
    if (fallocate(fd, 0, 0, size) != 0) {
        if (errno != EOPNOTSUPP && errno != ENOSYS && errno != EINVAL) goto io_fail; /* ENOSPC */
        if (ftruncate(fd, size) != 0) goto io_fail;
    }
    what = "close";
    int closing = fd;
    fd = -1;
    if (close(closing) != 0) goto io_fail;
    free(head);
    return GT_OK;
io_fail:
    status =
        gt_error_set(err, GT_ERR_IO, "%s: cannot %s the file: %s", path, what, strerror(errno));
    if (fd >= 0) close(fd);
    if (strcmp(what, "create") != 0) unlink(path);
    free(head);
    return status;
}

static gt_status st_write(const char *path, int n, const char *const *names,
                          const gt_tensor *const *tensors, bool need_data, gt_tensor_source src,
                          void *user, int n_meta, const char *const *meta_keys,
                          const char *const *meta_values, gt_error *err)
{
    char *header = NULL;
    size_t head_len = 0;
    GT_TRY(st_head(path, "write", n, names, tensors, need_data, n_meta, meta_keys, meta_values,
                   &header, &head_len, err));
    size_t tmp_cap = strlen(path) + 32;
    char *tmp = gt_xmalloc(tmp_cap);
    snprintf(tmp, tmp_cap, "%s.tmp.%ld", path, (long)getpid());
    gt_status status = GT_OK;
    const char *what = "create";
    FILE *f = fopen(tmp, "wb");
    if (!f) goto io_fail;
    what = "write";
    if (fwrite(header, 1, head_len, f) != head_len) goto io_fail;
    for (int i = 0; i < n; i++) {
        size_t nbytes = gt_tensor_nbytes(tensors[i]);
        const void *data = NULL;
        status = src(i, &data, user, err);
        if (status == GT_OK && nbytes > 0 && !data)
            status = gt_error_set(err, GT_ERR_INVALID, "%s: tensor " ST_NAME_FMT " has no data",
                                  path, names[i]);
        if (status != GT_OK) goto fail; /* the source's error, not a file's */
        if (nbytes && fwrite(data, 1, nbytes, f) != nbytes) goto io_fail;
    }
    if (fflush(f) != 0) goto io_fail;
    what = "fsync";
    if (fsync(fileno(f)) != 0) goto io_fail;
    what = "close";
    FILE *closing = f;
    f = NULL;
    if (fclose(closing) != 0) goto io_fail;
    what = "rename";
    if (rename(tmp, path) != 0) goto io_fail;
    status = st_fsync_dir(path, err);
    free(tmp);
    free(header);
    return status;

io_fail:;
    int e = errno;
    status = gt_error_set(err, GT_ERR_IO, "%s: cannot %s temporary file %s: %s", path, what, tmp,
                          strerror(e));
fail:
    if (f) fclose(f);
    remove(tmp);
    free(tmp);
    free(header);
    return status;
}

gt_status gt_tensor_array_source(int i, const void **data, void *user, gt_error *err)
{
    (void)err;
    *data = ((const gt_tensor *const *)user)[i]->data;
    return GT_OK;
}

gt_status gt_safetensors_write(const char *path, int n, const char *const *names,
                               const gt_tensor *const *tensors, int n_meta,
                               const char *const *meta_keys, const char *const *meta_values,
                               gt_error *err)
{
    return st_write(path, n, names, tensors, true, gt_tensor_array_source, (void *)tensors, n_meta,
                    meta_keys, meta_values, err);
}

gt_status gt_safetensors_write_from(const char *path, int n, const char *const *names,
                                    const gt_tensor *const *descs, gt_tensor_source src, void *user,
                                    int n_meta, const char *const *meta_keys,
                                    const char *const *meta_values, gt_error *err)
{
    if (!src) return gt_error_set(err, GT_ERR_INVALID, "%s: no tensor source", path ? path : "");
    return st_write(path, n, names, descs, false, src, user, n_meta, meta_keys, meta_values, err);
}
