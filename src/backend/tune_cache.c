/* tune_cache.c — the matmul tuning cache file (tune_cache.h). */
#include "backend/tune_cache.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

char *gt_tune_cache_default_path(void)
{
    const char *env = getenv("GT_MATMUL_TUNE_CACHE");
    if (env) return env[0] && strcmp(env, "0") != 0 ? gt_xstrdup(env) : NULL;
    const char *xdg = getenv("XDG_CACHE_HOME");
    if (xdg && xdg[0] == '/') return gt_path_join(xdg, "graphtrain/matmul_tune.tsv");
    const char *home = getenv("HOME");
    if (home && home[0] == '/') return gt_path_join(home, ".cache/graphtrain/matmul_tune.tsv");
    return NULL;
}

bool gt_tune_cache_find(const char *text, size_t len, const char *key, gt_tune_cache_accept accept,
                        void *user)
{
    size_t klen = strlen(key);
    char value[GT_TUNE_CACHE_MAX_VALUE + 1];
    for (size_t at = 0; at < len;) {
        const char *line = text + at;
        const char *nl = memchr(line, '\n', len - at);
        size_t n = nl ? (size_t)(nl - line) : len - at;
        at += n + 1;
        if (n <= klen || memcmp(line, key, klen) != 0 || line[klen] != '\t') continue;
        size_t vlen = n - klen - 1;
        const char *v = line + klen + 1;
        if (vlen > GT_TUNE_CACHE_MAX_VALUE || memchr(v, '\t', vlen) || memchr(v, '\0', vlen))
            continue;
        memcpy(value, v, vlen);
        value[vlen] = '\0';
        if (accept(value, user)) return true;
    }
    return false;
}

bool gt_tune_cache_lookup(const char *path, const char *key, gt_tune_cache_accept accept,
                          void *user)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    struct stat sb;
    bool found = false;
    if (fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_size > 0 &&
        (uint64_t)sb.st_size <= GT_TUNE_CACHE_MAX_BYTES) {
        size_t size = (size_t)sb.st_size, got = 0;
        char *text = gt_xmalloc(size);
        while (got < size) {
            ssize_t r = read(fd, text + got, size - got);
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) break;
            got += (size_t)r;
        }
        found = gt_tune_cache_find(text, got, key, accept, user);
        free(text);
    }
    close(fd);
    return found;
}

gt_status gt_tune_cache_append(const char *path, const char *key, const char *value, gt_error *err)
{
    if (strpbrk(key, "\t\n") || strpbrk(value, "\t\n"))
        return gt_error_set(err, GT_ERR_INVALID,
                            "matmul tuning cache %s: a key or value holds a tab or a newline",
                            path);
    const char *slash = strrchr(path, '/');
    if (slash && slash != path) {
        char *dir = gt_xstrdup(path);
        dir[slash - path] = '\0';
        gt_status st = gt_make_dirs(dir, err);
        free(dir);
        GT_TRY(st);
    }
    size_t n = strlen(key) + strlen(value) + 2;
    char *full = gt_xmalloc(n + 1);
    snprintf(full, n + 1, "%s\t%s\n", key, value);
    gt_status st = GT_OK;
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0666);
    if (fd < 0) {
        st = gt_error_set(err, GT_ERR_IO, "matmul tuning cache %s: cannot open: %s", path,
                          strerror(errno));
    } else {
        struct stat sb;
        ssize_t w = (ssize_t)n;
        if (fstat(fd, &sb) != 0 || (uint64_t)sb.st_size + n > GT_TUNE_CACHE_MAX_BYTES)
            st = gt_error_set(err, GT_ERR_IO,
                              "matmul tuning cache %s: full (%u bytes at most are read); remove it "
                              "to start a new one",
                              path, GT_TUNE_CACHE_MAX_BYTES);
        else
            do
                w = write(fd, full, n);
            while (w < 0 && errno == EINTR);
        if (st == GT_OK && w != (ssize_t)n)
            st = gt_error_set(err, GT_ERR_IO, "matmul tuning cache %s: cannot append: %s", path,
                              w < 0 ? strerror(errno) : "short write");
        if (close(fd) != 0 && st == GT_OK)
            st = gt_error_set(err, GT_ERR_IO, "matmul tuning cache %s: cannot close: %s", path,
                              strerror(errno));
    }
    free(full);
    return st;
}

void gt_tune_cache_hex(const void *bytes, size_t n, char *out)
{
    static const char digits[] = "0123456789abcdef";
    const unsigned char *b = bytes;
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[b[i] >> 4];
        out[2 * i + 1] = digits[b[i] & 15];
    }
    out[2 * n] = '\0';
}

static int hex_digit(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

bool gt_tune_cache_unhex(const char *text, size_t len, void *bytes, size_t n)
{
    if (len != 2 * n) return false;
    unsigned char *b = bytes;
    for (size_t i = 0; i < n; i++) {
        int hi = hex_digit(text[2 * i]), lo = hex_digit(text[2 * i + 1]);
        if (hi < 0 || lo < 0) return false;
        b[i] = (unsigned char)(hi << 4 | lo);
    }
    return true;
}
