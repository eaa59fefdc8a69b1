/* token_shard.c — GTTOKENS binary token shards (layout in gt_data.h): validating reader over a
 * read-only mapping, and a streaming writer that is atomic (temporary file, fsync, rename, fsync
 * of the directory). */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "graphtrain/gt_data.h"

static uint32_t gt_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t gt_le64(const uint8_t *p)
{
    return gt_le32(p) | (uint64_t)gt_le32(p + 4) << 32;
}

static void gt_put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void gt_put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* ---------------------------------------------------------------- reader */

gt_status gt_token_shard_parse(const void *data, size_t size, const char *name, gt_token_shard *out,
                               gt_error *err)
{
    memset(out, 0, sizeof *out);
    const uint8_t *p = data;
    if (size < GT_TOKEN_SHARD_HEADER_BYTES)
        return gt_error_set(err, GT_ERR_FORMAT,
                            "%s: truncated: %zu bytes, a token shard header alone is %d", name,
                            size, GT_TOKEN_SHARD_HEADER_BYTES);
    if (memcmp(p, GT_TOKEN_SHARD_MAGIC, 8) != 0)
        return gt_error_set(err, GT_ERR_FORMAT, "%s: bad magic: not a GTTOKENS token shard", name);
    uint64_t head_sum = gt_le64(p + 56);
    if (XXH64(p, 56, 0) != head_sum)
        return gt_error_set(err, GT_ERR_FORMAT,
                            "%s: header checksum mismatch: the header is corrupt", name);
    uint32_t version = gt_le32(p + 8), dtype = gt_le32(p + 12), vocab = gt_le32(p + 24);
    uint64_t count = gt_le64(p + 16), sum = gt_le64(p + 32);
    if (version != GT_TOKEN_SHARD_VERSION)
        return gt_error_set(err, GT_ERR_FORMAT, "%s: version %u, this build reads version %d", name,
                            version, GT_TOKEN_SHARD_VERSION);
    if (dtype != 2 && dtype != 4)
        return gt_error_set(err, GT_ERR_FORMAT,
                            "%s: dtype %u: expected 2 (uint16) or 4 (uint32) bytes per token", name,
                            dtype);
    if (gt_le32(p + 28) != 0)
        return gt_error_set(err, GT_ERR_FORMAT, "%s: reserved header bytes are not zero", name);
    for (int i = 40; i < 56; i++)
        if (p[i] != 0)
            return gt_error_set(err, GT_ERR_FORMAT, "%s: reserved header bytes are not zero", name);
    if (vocab == 0) return gt_error_set(err, GT_ERR_FORMAT, "%s: vocab_size is 0", name);
    size_t payload = size - GT_TOKEN_SHARD_HEADER_BYTES;
    if (count > payload / dtype || count * dtype != payload)
        return gt_error_set(err, GT_ERR_FORMAT,
                            "%s: count mismatch: the header says %llu tokens (%llu payload bytes) "
                            "but the file has %zu payload bytes (%s)",
                            name, (unsigned long long)count,
                            (unsigned long long)(count <= UINT64_MAX / dtype ? count * dtype : 0),
                            payload, count * dtype > payload ? "truncated" : "trailing bytes");
    const uint8_t *data8 = p + GT_TOKEN_SHARD_HEADER_BYTES;
    uint64_t got = XXH64(data8, payload, 0);
    if (got != sum)
        return gt_error_set(err, GT_ERR_FORMAT,
                            "%s: payload checksum mismatch (header %016llx, payload %016llx): the "
                            "tokens are corrupt",
                            name, (unsigned long long)sum, (unsigned long long)got);
    out->dtype = dtype;
    out->count = count;
    out->vocab_size = vocab;
    out->checksum = sum;
    out->payload = data8;
    for (uint64_t i = 0; i < count; i++) {
        uint32_t id = gt_token_shard_get(out, i);
        if (id >= vocab) {
            memset(out, 0, sizeof *out);
            return gt_error_set(err, GT_ERR_FORMAT,
                                "%s: token %llu is id %u, not below vocab_size %u", name,
                                (unsigned long long)i, id, vocab);
        }
    }
    return GT_OK;
}

gt_status gt_token_shard_open(const char *path, gt_token_shard *out, gt_error *err)
{
    memset(out, 0, sizeof *out);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return gt_error_set(err, GT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return gt_error_set(err, GT_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    size_t size = (size_t)sb.st_size;
    void *map = NULL;
    if (size > 0) {
        map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            int e = errno;
            close(fd);
            return gt_error_set(err, GT_ERR_IO, "%s: cannot map %zu bytes: %s", path, size,
                                strerror(e));
        }
    }
    close(fd);
    static const uint8_t empty[1];
    gt_status st = gt_token_shard_parse(map ? map : empty, size, path, out, err);
    if (st != GT_OK) {
        if (map) munmap(map, size);
        return st;
    }
    out->map = map;
    out->map_len = size;
    return GT_OK;
}

void gt_token_shard_close(gt_token_shard *s)
{
    if (s->map) munmap(s->map, s->map_len);
    memset(s, 0, sizeof *s);
}

/* ---------------------------------------------------------------- writer */

struct gt_token_shard_writer {
    char *path, *tmp_path;
    int fd;
    uint32_t vocab, dtype;
    uint64_t count;
    XXH64_state_t *hash;
    uint8_t buf[1 << 16];
    size_t buf_n;
};

static gt_status gt_shard_write_all(gt_token_shard_writer *w, const uint8_t *p, size_t n,
                                    gt_error *err)
{
    while (n > 0) {
        ssize_t k = write(w->fd, p, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0)
            return gt_error_set(err, GT_ERR_IO, "%s: write failed: %s", w->tmp_path,
                                k < 0 ? strerror(errno) : "no progress");
        p += k;
        n -= (size_t)k;
    }
    return GT_OK;
}

static gt_status gt_shard_flush(gt_token_shard_writer *w, gt_error *err)
{
    if (w->buf_n == 0) return GT_OK;
    XXH64_update(w->hash, w->buf, w->buf_n);
    gt_status st = gt_shard_write_all(w, w->buf, w->buf_n, err);
    w->buf_n = 0;
    return st;
}

gt_status gt_token_shard_writer_open(const char *path, uint32_t vocab_size,
                                     gt_token_shard_writer **out, gt_error *err)
{
    *out = NULL;
    if (vocab_size == 0)
        return gt_error_set(err, GT_ERR_INVALID, "%s: vocab_size must be at least 1", path);
    gt_token_shard_writer *w = gt_xcalloc(1, sizeof *w);
    w->path = gt_xstrdup(path);
    size_t n = strlen(path) + 16;
    w->tmp_path = gt_xmalloc(n);
    snprintf(w->tmp_path, n, "%s.tmp.XXXXXX", path);
    w->fd = mkstemp(w->tmp_path);
    if (w->fd < 0) {
        gt_status st = gt_error_set(err, GT_ERR_IO, "%s: cannot create %s: %s", path, w->tmp_path,
                                    strerror(errno));
        free(w->path);
        free(w->tmp_path);
        free(w);
        return st;
    }
    /* mkstemp makes the file 0600; a dataset is meant to be shared like any output file */
    (void)fchmod(w->fd, 0644);
    w->vocab = vocab_size;
    w->dtype = vocab_size <= 65536 ? 2 : 4;
    w->hash = XXH64_createState();
    GT_CHECK(w->hash);
    XXH64_reset(w->hash, 0);
    uint8_t zero[GT_TOKEN_SHARD_HEADER_BYTES] = {0};
    gt_status st = gt_shard_write_all(w, zero, sizeof zero, err);
    if (st != GT_OK) {
        gt_token_shard_writer_abort(w);
        return st;
    }
    *out = w;
    return GT_OK;
}

gt_status gt_token_shard_writer_append(gt_token_shard_writer *w, const int32_t *ids, size_t n,
                                       gt_error *err)
{
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || (uint32_t)ids[i] >= w->vocab)
            return gt_error_set(err, GT_ERR_INVALID,
                                "%s: token %llu is id %d, not in [0, vocab_size %u)", w->path,
                                (unsigned long long)(w->count + i), ids[i], w->vocab);
    }
    for (size_t i = 0; i < n; i++) {
        if (w->buf_n + w->dtype > sizeof w->buf) GT_TRY(gt_shard_flush(w, err));
        uint32_t v = (uint32_t)ids[i];
        w->buf[w->buf_n++] = (uint8_t)v;
        w->buf[w->buf_n++] = (uint8_t)(v >> 8);
        if (w->dtype == 4) {
            w->buf[w->buf_n++] = (uint8_t)(v >> 16);
            w->buf[w->buf_n++] = (uint8_t)(v >> 24);
        }
    }
    w->count += n;
    return GT_OK;
}

static gt_status gt_shard_fsync_dir(const char *path, gt_error *err)
{
    char *copy = gt_xstrdup(path);
    const char *dir = dirname(copy);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    gt_status st = GT_OK;
    if (fd < 0 || fsync(fd) != 0)
        st = gt_error_set(err, GT_ERR_IO, "%s: cannot fsync directory %s: %s", path, dir,
                          strerror(errno));
    if (fd >= 0) close(fd);
    free(copy);
    return st;
}

gt_status gt_token_shard_writer_commit(gt_token_shard_writer *w, gt_error *err)
{
    gt_status st = gt_shard_flush(w, err);
    if (st == GT_OK) {
        uint8_t h[GT_TOKEN_SHARD_HEADER_BYTES] = {0};
        memcpy(h, GT_TOKEN_SHARD_MAGIC, 8);
        gt_put32(h + 8, GT_TOKEN_SHARD_VERSION);
        gt_put32(h + 12, w->dtype);
        gt_put64(h + 16, w->count);
        gt_put32(h + 24, w->vocab);
        gt_put64(h + 32, XXH64_digest(w->hash));
        gt_put64(h + 56, XXH64(h, 56, 0));
        ssize_t k;
        do
            k = pwrite(w->fd, h, sizeof h, 0);
        while (k < 0 && errno == EINTR);
        if (k != (ssize_t)sizeof h)
            st = gt_error_set(err, GT_ERR_IO, "%s: header write failed: %s", w->tmp_path,
                              k < 0 ? strerror(errno) : "short write");
    }
    if (st == GT_OK && fsync(w->fd) != 0)
        st = gt_error_set(err, GT_ERR_IO, "%s: fsync failed: %s", w->tmp_path, strerror(errno));
    if (st == GT_OK && close(w->fd) != 0)
        st = gt_error_set(err, GT_ERR_IO, "%s: close failed: %s", w->tmp_path, strerror(errno));
    else if (st != GT_OK)
        close(w->fd);
    w->fd = -1;
    if (st == GT_OK && rename(w->tmp_path, w->path) != 0)
        st = gt_error_set(err, GT_ERR_IO, "%s: cannot rename %s into place: %s", w->path,
                          w->tmp_path, strerror(errno));
    if (st == GT_OK)
        st = gt_shard_fsync_dir(w->path, err);
    else
        unlink(w->tmp_path);
    XXH64_freeState(w->hash);
    free(w->path);
    free(w->tmp_path);
    free(w);
    return st;
}

void gt_token_shard_writer_abort(gt_token_shard_writer *w)
{
    if (!w) return;
    if (w->fd >= 0) close(w->fd);
    unlink(w->tmp_path);
    if (w->hash) XXH64_freeState(w->hash);
    free(w->path);
    free(w->tmp_path);
    free(w);
}

gt_status gt_token_shard_write(const char *path, const int32_t *ids, size_t n, uint32_t vocab_size,
                               gt_error *err)
{
    gt_token_shard_writer *w;
    GT_TRY(gt_token_shard_writer_open(path, vocab_size, &w, err));
    gt_status st = gt_token_shard_writer_append(w, ids, n, err);
    if (st != GT_OK) {
        gt_token_shard_writer_abort(w);
        return st;
    }
    return gt_token_shard_writer_commit(w, err);
}
