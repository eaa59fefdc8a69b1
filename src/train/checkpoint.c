/* checkpoint.c — save, list, find and prune checkpoints (gt_checkpoint.h); loading is in
 * checkpoint_load.c, the manifest text in checkpoint_manifest.c.
 *
 * Crash safety rests on one rule: a directory named step-<N> appears only by rename(2) of a fully
 * written and fsynced directory, and disappears only by rename(2) to a .tmp-* name before its files
 * are deleted. The save sequence is
 *   1. remove stale FOLDER/.tmp-* (their writer is dead, or is us);
 *   2. mkdir FOLDER/.tmp-step-<N>-<pid>; write model.safetensors (its writer fsyncs the file and
 *      the directory), hash the file as it lies on disk, write manifest.json and fsync it;
 *   3. fsync the temporary directory, rename it to step-<N> (if step-<N> exists, swap the two with
 *      RENAME_EXCHANGE so some step-<N> exists at every instant, then delete the old one), fsync
 *      FOLDER so the rename is durable;
 *   4. prune to the last K.
 * A kill -9 between any two system calls therefore leaves the previous complete checkpoints intact
 * and at most a .tmp-* directory, which nothing reads and the next save deletes. */
#define _GNU_SOURCE /* renameat2 */
#include "checkpoint_internal.h"
#include "graphtrain/gt_safetensors.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#define CKPT_TMP_PREFIX ".tmp-"

/* ---------------------------------------------------------------- paths and small file helpers */

char *ckpt_step_dir(const char *folder, int64_t step)
{
    char name[32];
    snprintf(name, sizeof name, "step-%lld", (long long)step);
    return gt_path_join(folder, name);
}

bool ckpt_parse_step_name(const char *name, int64_t *step)
{
    if (strncmp(name, "step-", 5) != 0) return false;
    const char *p = name + 5;
    if (!*p || (p[0] == '0' && p[1])) return false;
    int64_t v = 0;
    for (; *p; p++) {
        if (*p < '0' || *p > '9') return false;
        if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, *p - '0', &v))
            return false;
    }
    *step = v;
    return true;
}

/* Opens path (a directory) and fsyncs it. Filesystems that cannot fsync a directory return
 * EINVAL; the rename is as durable as they make it, so that is not an error. */
gt_status ckpt_fsync_dir(const char *path, gt_error *err)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return gt_error_set(err, GT_ERR_IO, "%s: cannot open directory: %s", path, strerror(errno));
    gt_status status = GT_OK;
    if (fsync(fd) != 0 && errno != EINVAL)
        status =
            gt_error_set(err, GT_ERR_IO, "%s: cannot fsync directory: %s", path, strerror(errno));
    close(fd);
    return status;
}

/* Creates path (and missing parents), fsyncing each parent whose entry we added. */
gt_status ckpt_mkdirs(const char *path, gt_error *err)
{
    struct stat sb;
    if (stat(path, &sb) == 0) {
        if (S_ISDIR(sb.st_mode)) return GT_OK;
        return gt_error_set(err, GT_ERR_IO, "%s: exists and is not a directory", path);
    }
    char *parent = gt_xstrdup(path);
    char *slash = strrchr(parent, '/');
    while (slash && slash > parent && slash[1] == '\0') { /* "a/b/" -> "a/b" */
        *slash = '\0';
        slash = strrchr(parent, '/');
    }
    gt_status status = GT_OK;
    if (slash && slash != parent) {
        *slash = '\0';
        status = ckpt_mkdirs(parent, err);
    } else {
        strcpy(parent, slash ? "/" : ".");
    }
    if (status == GT_OK && mkdir(path, 0755) != 0 && errno != EEXIST)
        status =
            gt_error_set(err, GT_ERR_IO, "%s: cannot create directory: %s", path, strerror(errno));
    if (status == GT_OK) status = ckpt_fsync_dir(parent, err);
    free(parent);
    return status;
}

/* Removes a directory tree without following symlinks. Checkpoint directories are flat; depth is
 * bounded anyway so a hostile tree cannot exhaust the stack. */
static gt_status ckpt_remove_tree_at(int parent_fd, const char *name, const char *shown, int depth,
                                     gt_error *err)
{
    if (unlinkat(parent_fd, name, 0) == 0 || errno == ENOENT) return GT_OK;
    if (errno != EISDIR && errno != EPERM)
        return gt_error_set(err, GT_ERR_IO, "%s: cannot remove %s: %s", shown, name,
                            strerror(errno));
    if (depth > 16) return gt_error_set(err, GT_ERR_IO, "%s: directory tree too deep", shown);
    int fd = openat(parent_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return gt_error_set(err, GT_ERR_IO, "%s: cannot open %s: %s", shown, name, strerror(errno));
    DIR *d = fdopendir(fd);
    if (!d) {
        close(fd);
        return gt_error_set(err, GT_ERR_IO, "%s: cannot list %s", shown, name);
    }
    gt_status status = GT_OK;
    struct dirent *e;
    while (status == GT_OK && (e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        status = ckpt_remove_tree_at(dirfd(d), e->d_name, shown, depth + 1, err);
    }
    closedir(d);
    if (status == GT_OK && unlinkat(parent_fd, name, AT_REMOVEDIR) != 0 && errno != ENOENT)
        status = gt_error_set(err, GT_ERR_IO, "%s: cannot remove directory %s: %s", shown, name,
                              strerror(errno));
    return status;
}

static gt_status ckpt_remove_tree(const char *folder, const char *name, gt_error *err)
{
    char *shown = gt_path_join(folder, name);
    int fd = open(folder, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    gt_status status;
    if (fd < 0) {
        status =
            gt_error_set(err, GT_ERR_IO, "%s: cannot open directory: %s", folder, strerror(errno));
    } else {
        status = ckpt_remove_tree_at(fd, name, shown, 0, err);
        close(fd);
    }
    free(shown);
    return status;
}

/* Writes a whole file and fsyncs it (its directory is fsynced by the caller). */
gt_status ckpt_write_file(const char *path, const char *data, size_t len, gt_error *err)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return gt_error_set(err, GT_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    size_t done = 0;
    while (done < len) {
        ssize_t w = write(fd, data + done, len - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int e = errno;
            close(fd);
            return gt_error_set(err, GT_ERR_IO, "%s: write failed: %s", path, strerror(e));
        }
        done += (size_t)w;
    }
    if (fsync(fd) != 0) {
        int e = errno;
        close(fd);
        return gt_error_set(err, GT_ERR_IO, "%s: fsync failed: %s", path, strerror(e));
    }
    if (close(fd) != 0)
        return gt_error_set(err, GT_ERR_IO, "%s: close failed: %s", path, strerror(errno));
    return GT_OK;
}

gt_status ckpt_hash_file(const char *path, uint64_t *bytes, uint64_t *xxh64, gt_error *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return gt_error_set(err, GT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return gt_error_set(err, GT_ERR_IO, "%s: not a readable regular file", path);
    }
    enum { BLOCK = 1 << 20 };
    char *buf = gt_xmalloc(BLOCK);
    XXH64_state_t *state = XXH64_createState();
    GT_CHECK(state != NULL);
    XXH64_reset(state, 0);
    uint64_t total = 0;
    gt_status status = GT_OK;
    for (;;) {
        ssize_t r = read(fd, buf, BLOCK);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            status = gt_error_set(err, GT_ERR_IO, "%s: read failed: %s", path, strerror(errno));
            break;
        }
        if (r == 0) break;
        XXH64_update(state, buf, (size_t)r);
        total += (uint64_t)r;
    }
    if (status == GT_OK) {
        *bytes = total;
        *xxh64 = (uint64_t)XXH64_digest(state);
    }
    XXH64_freeState(state);
    free(buf);
    close(fd);
    return status;
}

/* Entry order in the file: by first byte, an empty tensor before a tensor starting where it
 * does (empty tensors all hash alike, so their order among themselves does not matter). */
static int ckpt_cmp_entry(const void *pa, const void *pb)
{
    const gt_st_entry *a = *(const gt_st_entry *const *)pa, *b = *(const gt_st_entry *const *)pb;
    if (a->begin != b->begin) return a->begin < b->begin ? -1 : 1;
    return (a->end > b->end) - (a->end < b->end);
}

const gt_checkpoint_tensor *ckpt_find_tensor(const gt_checkpoint_info *info, const char *name)
{
    for (int i = 0; i < info->n_tensors; i++)
        if (strcmp(info->tensors[i].name, name) == 0) return &info->tensors[i];
    return NULL;
}

gt_status ckpt_hash_tensor_file(const gt_safetensors *st, const gt_checkpoint_info *info,
                                uint64_t *bytes, uint64_t *xxh64, gt_error *err)
{
    const gt_st_entry **order = gt_xcalloc((size_t)st->n_entries + 1, sizeof *order);
    for (int i = 0; i < st->n_entries; i++)
        order[i] = &st->entries[i];
    qsort(order, (size_t)st->n_entries, sizeof *order, ckpt_cmp_entry);
    XXH64_state_t *state = XXH64_createState();
    GT_CHECK(state != NULL);
    XXH64_reset(state, 0);
    char *head = gt_xmalloc((size_t)st->data_offset + 1);
    gt_status status = gt_safetensors_read_head(st, head, err);
    if (status == GT_OK) XXH64_update(state, head, (size_t)st->data_offset);
    for (int i = 0; i < st->n_entries && status == GT_OK; i++) {
        const gt_checkpoint_tensor *m = ckpt_find_tensor(info, order[i]->name);
        if (!m) {
            status = gt_error_set(err, GT_ERR_FORMAT,
                                  "%s: tensor " CKPT_NAME_FMT " is not in the manifest", st->path,
                                  order[i]->name);
            break;
        }
        uint8_t le[8];
        for (int b = 0; b < 8; b++)
            le[b] = (uint8_t)(m->xxh64 >> (8 * b));
        XXH64_update(state, le, 8);
    }
    struct stat sb;
    if (status == GT_OK && fstat(st->fd, &sb) != 0)
        status = gt_error_set(err, GT_ERR_IO, "%s: cannot stat: %s", st->path, strerror(errno));
    if (status == GT_OK) {
        *bytes = (uint64_t)sb.st_size;
        *xxh64 = (uint64_t)XXH64_digest(state);
    }
    XXH64_freeState(state);
    free(head);
    free(order);
    return status;
}

gt_status ckpt_read_manifest(const char *dir, int64_t step, gt_checkpoint_info *info, gt_error *err)
{
    memset(info, 0, sizeof *info);
    char *path = gt_path_join(dir, GT_CHECKPOINT_MANIFEST);
    gt_status status = GT_OK;
    char *text = NULL;
    size_t len = 0;
    struct stat sb;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        status = gt_error_set(err, GT_ERR_IO, "%s: cannot open: %s (the checkpoint is incomplete)",
                              path, strerror(errno));
        goto done;
    }
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        status = gt_error_set(err, GT_ERR_IO, "%s: not a readable regular file", path);
        goto done;
    }
    if ((uint64_t)sb.st_size > CKPT_MAX_MANIFEST_BYTES) {
        status =
            gt_error_set(err, GT_ERR_FORMAT, "%s: %llu bytes exceeds the manifest limit of %zu",
                         path, (unsigned long long)sb.st_size, CKPT_MAX_MANIFEST_BYTES);
        goto done;
    }
    text = gt_xmalloc((size_t)sb.st_size + 1);
    while (len < (size_t)sb.st_size) {
        ssize_t r = read(fd, text + len, (size_t)sb.st_size - len);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            status = gt_error_set(err, GT_ERR_IO, "%s: read failed after %zu bytes: %s", path, len,
                                  r == 0 ? "file shrank" : strerror(errno));
            goto done;
        }
        len += (size_t)r;
    }
    status = gt_checkpoint_manifest_parse(path, text, len, info, err);
    if (status == GT_OK && info->step != step) {
        status = gt_error_set(err, GT_ERR_FORMAT,
                              "%s: records step %lld but lies in the directory of step %lld", path,
                              (long long)info->step, (long long)step);
        gt_checkpoint_info_free(info);
    }
done:
    if (fd >= 0) close(fd);
    free(text);
    free(path);
    return status;
}

/* ---------------------------------------------------------------- fingerprint */

typedef struct {
    const char *name;
    int index;
} ckpt_named;

static int ckpt_cmp_named(const void *pa, const void *pb)
{
    const ckpt_named *a = pa, *b = pb;
    int c = strcmp(a->name, b->name);
    return c ? c : (a->index > b->index) - (a->index < b->index);
}

uint64_t gt_checkpoint_fingerprint(int n, const char *const *names, const gt_tensor *const *tensors)
{
    ckpt_named *order = gt_xcalloc(n > 0 ? (size_t)n : 1, sizeof *order);
    for (int i = 0; i < n; i++)
        order[i] = (ckpt_named){names[i] ? names[i] : "", i};
    qsort(order, n > 0 ? (size_t)n : 0, sizeof *order, ckpt_cmp_named);
    XXH64_state_t *state = XXH64_createState();
    GT_CHECK(state != NULL);
    XXH64_reset(state, 0);
    for (int i = 0; i < n; i++) {
        char type[256];
        const gt_tensor *t = tensors[order[i].index];
        if (t && t->dtype >= 0 && t->dtype < GT_DTYPE_COUNT && t->ndim >= 0 &&
            t->ndim <= GT_MAX_DIMS)
            gt_tensor_format_type(t, type, sizeof type);
        else
            snprintf(type, sizeof type, "?");
        XXH64_update(state, order[i].name, strlen(order[i].name));
        XXH64_update(state, " ", 1);
        XXH64_update(state, type, strlen(type));
        XXH64_update(state, "\n", 1);
    }
    uint64_t h = (uint64_t)XXH64_digest(state);
    XXH64_freeState(state);
    free(order);
    return h;
}

/* ---------------------------------------------------------------- list and find */

static int ckpt_cmp_i64(const void *pa, const void *pb)
{
    int64_t a = *(const int64_t *)pa, b = *(const int64_t *)pb;
    return (a > b) - (a < b);
}

gt_status gt_checkpoint_list(const char *folder, int64_t **steps, int *n, gt_error *err)
{
    *steps = NULL;
    *n = 0;
    if (!folder || !folder[0])
        return gt_error_set(err, GT_ERR_INVALID, "checkpoint list: empty folder name");
    DIR *d = opendir(folder);
    if (!d) {
        if (errno == ENOENT) return GT_OK;
        return gt_error_set(err, GT_ERR_IO, "checkpoint folder %s: cannot list: %s", folder,
                            strerror(errno));
    }
    int cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        int64_t step;
        if (!ckpt_parse_step_name(e->d_name, &step)) continue;
        char *dir = gt_path_join(folder, e->d_name);
        gt_checkpoint_info info;
        gt_error why = {0};
        if (ckpt_read_manifest(dir, step, &info, &why) == GT_OK) {
            if (*n == cap) {
                cap = cap ? 2 * cap : 16;
                *steps = gt_xrealloc(*steps, (size_t)cap * sizeof **steps);
            }
            (*steps)[(*n)++] = step;
            gt_checkpoint_info_free(&info);
        } else {
            /* Never produced by a crash (step-<N> appears only complete), so say so loudly. */
            gt_log(GT_LOG_WARN, "ignoring checkpoint %s: %s", dir, why.msg);
        }
        free(dir);
    }
    closedir(d);
    if (*n > 0) qsort(*steps, (size_t)*n, sizeof **steps, ckpt_cmp_i64);
    return GT_OK;
}

gt_status gt_checkpoint_find_latest(const char *folder, int64_t *step, gt_error *err)
{
    *step = GT_CHECKPOINT_NONE;
    int64_t *steps;
    int n;
    GT_TRY(gt_checkpoint_list(folder, &steps, &n, err));
    if (n > 0) *step = steps[n - 1];
    free(steps);
    return GT_OK;
}

/* "10, 20, 30" (at most the last 20 steps) of the complete checkpoints, for error messages. */
static void ckpt_format_available(const char *folder, char *buf, size_t cap)
{
    int64_t *steps = NULL;
    int n = 0;
    gt_error ignored = {0};
    buf[0] = '\0';
    if (gt_checkpoint_list(folder, &steps, &n, &ignored) != GT_OK || n == 0) {
        snprintf(buf, cap, "none");
        free(steps);
        return;
    }
    size_t used = 0;
    int first = n > 20 ? n - 20 : 0;
    if (first > 0) used += (size_t)snprintf(buf, cap, "..., ");
    for (int i = first; i < n && used < cap; i++)
        used += (size_t)snprintf(buf + used, cap - used, "%s%lld", i > first ? ", " : "",
                                 (long long)steps[i]);
    free(steps);
}

gt_status gt_checkpoint_find_step(const char *folder, int64_t step, gt_error *err)
{
    if (!folder || !folder[0])
        return gt_error_set(err, GT_ERR_INVALID, "checkpoint find: empty folder name");
    if (step < 0)
        return gt_error_set(err, GT_ERR_INVALID, "checkpoint find: step %lld is negative",
                            (long long)step);
    GT_TRY(ckpt_need_step_dir(folder, step, err));
    char *dir = ckpt_step_dir(folder, step);
    gt_checkpoint_info info;
    gt_status status = ckpt_read_manifest(dir, step, &info, err);
    if (status == GT_OK)
        gt_checkpoint_info_free(&info);
    else
        gt_error_wrap(err, "checkpoint %s is incomplete or corrupt", dir);
    free(dir);
    return status;
}

gt_status ckpt_need_step_dir(const char *folder, int64_t step, gt_error *err)
{
    char *dir = ckpt_step_dir(folder, step);
    struct stat sb;
    gt_status status = GT_OK;
    if (stat(dir, &sb) != 0) {
        char avail[512];
        ckpt_format_available(folder, avail, sizeof avail);
        status = gt_error_set(err, GT_ERR_INVALID,
                              "no checkpoint of step %lld in %s (available steps: %s)",
                              (long long)step, folder, avail);
    }
    free(dir);
    return status;
}

/* ---------------------------------------------------------------- prune and stale cleanup */

/* A .tmp-* name ends in "-<pid>" of its writer. It is stale when that writer is us (a leftover
 * of an earlier failed save) or no longer runs; names we cannot parse are stale too. */
static bool ckpt_tmp_is_stale(const char *name)
{
    const char *dash = strrchr(name, '-');
    if (!dash || !dash[1]) return true;
    long long pid = 0;
    for (const char *p = dash + 1; *p; p++) {
        if (*p < '0' || *p > '9' || pid > 1000000000LL) return true;
        pid = pid * 10 + (*p - '0');
    }
    if (pid <= 0 || pid == (long long)getpid()) return true;
    return kill((pid_t)pid, 0) != 0 && errno == ESRCH;
}

static gt_status ckpt_remove_stale(const char *folder, gt_error *err)
{
    DIR *d = opendir(folder);
    if (!d)
        return gt_error_set(err, GT_ERR_IO, "checkpoint folder %s: cannot list: %s", folder,
                            strerror(errno));
    /* Collect first: removing entries while readdir walks the same directory is unspecified. */
    char **names = NULL;
    int n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, CKPT_TMP_PREFIX, strlen(CKPT_TMP_PREFIX)) != 0) continue;
        if (!ckpt_tmp_is_stale(e->d_name)) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 8;
            names = gt_xrealloc(names, (size_t)cap * sizeof *names);
        }
        names[n++] = gt_xstrdup(e->d_name);
    }
    closedir(d);
    gt_status status = GT_OK;
    for (int i = 0; i < n; i++) {
        if (status == GT_OK) status = ckpt_remove_tree(folder, names[i], err);
        free(names[i]);
    }
    free(names);
    return status;
}

/* The removal of the pruned checkpoints that a save hands to a thread (keep_last with
 * prune_in_background): one at a time per process; gt_checkpoint_prune_wait joins it. */
static struct {
    pthread_t thread;
    bool live;
    char *folder;
    char **names;
    int n;
    gt_status st;
    gt_error err;
} pruner;

static void *pruner_run(void *arg)
{
    (void)arg;
    for (int i = 0; i < pruner.n && pruner.st == GT_OK; i++)
        pruner.st = ckpt_remove_tree(pruner.folder, pruner.names[i], &pruner.err);
    return NULL;
}

static void free_names(char **names, int n)
{
    for (int i = 0; i < n; i++)
        free(names[i]);
    free(names);
}

void gt_checkpoint_prune_wait(void)
{
    if (!pruner.live) return;
    pthread_join(pruner.thread, NULL);
    if (pruner.st != GT_OK)
        gt_log(GT_LOG_WARN, "checkpoint: removing an old checkpoint: %s (the next save retries)",
               pruner.err.msg);
    free(pruner.folder);
    free_names(pruner.names, pruner.n);
    memset(&pruner, 0, sizeof pruner);
}

/* Removes the renamed directories doomed[0..n) of folder (takes doomed): here, or in the
 * background when asked and a thread starts. */
static gt_status remove_doomed(const char *folder, char **doomed, int n, bool background,
                               gt_error *err)
{
    if (background && n > 0) {
        pruner.folder = gt_xstrdup(folder);
        pruner.names = doomed;
        pruner.n = n;
        pruner.st = GT_OK;
        pruner.live = pthread_create(&pruner.thread, NULL, pruner_run, NULL) == 0;
        if (pruner.live) return GT_OK;
        free(pruner.folder);
        memset(&pruner, 0, sizeof pruner);
    }
    gt_status status = GT_OK;
    for (int i = 0; i < n && status == GT_OK; i++)
        status = ckpt_remove_tree(folder, doomed[i], err);
    free_names(doomed, n);
    return status;
}

static gt_status prune(const char *folder, int keep, bool background, gt_error *err)
{
    gt_checkpoint_prune_wait();
    if (keep <= 0) return GT_OK;
    int64_t *steps;
    int n;
    GT_TRY(gt_checkpoint_list(folder, &steps, &n, err));
    gt_status status = GT_OK;
    int n_drop = n > keep ? n - keep : 0;
    char **doomed = gt_xcalloc((size_t)n_drop + 1, sizeof *doomed);
    /* Rename all first, then one fsync of FOLDER, then delete: a kill midway leaves .tmp-* names,
     * never a half-deleted step-<N>. */
    int n_renamed = 0;
    for (int i = 0; i < n_drop && status == GT_OK; i++) {
        char *dir = ckpt_step_dir(folder, steps[i]);
        char name[96];
        snprintf(name, sizeof name, CKPT_TMP_PREFIX "prune-step-%lld-%ld", (long long)steps[i],
                 (long)getpid());
        char *tmp = gt_path_join(folder, name);
        if (rename(dir, tmp) != 0)
            status = gt_error_set(err, GT_ERR_IO, "checkpoint %s: cannot rename to %s: %s", dir,
                                  tmp, strerror(errno));
        else
            doomed[n_renamed++] = gt_xstrdup(name);
        free(tmp);
        free(dir);
    }
    if (n_renamed > 0) {
        gt_status s = ckpt_fsync_dir(folder, err);
        if (status == GT_OK) status = s;
    }
    free(steps);
    if (status != GT_OK) {
        free_names(doomed, n_renamed);
        return status;
    }
    return remove_doomed(folder, doomed, n_renamed, background, err);
}

gt_status gt_checkpoint_prune(const char *folder, int keep, gt_error *err)
{
    return prune(folder, keep, false, err);
}

/* ---------------------------------------------------------------- save */

/* Moves the finished temporary directory FOLDER/tmp_name onto step-<N>. */
static gt_status ckpt_publish(const char *folder, const char *tmp_name, int64_t step, gt_error *err)
{
    char *tmp_dir = gt_path_join(folder, tmp_name), *final_dir = ckpt_step_dir(folder, step);
    char *aside = NULL, aside_name[96];
    gt_status status = GT_OK;
    if (rename(tmp_dir, final_dir) == 0) {
        status = ckpt_fsync_dir(folder, err);
        goto done;
    }
    if (errno != ENOTEMPTY && errno != EEXIST) {
        status = gt_error_set(err, GT_ERR_IO, "%s: cannot rename %s to it: %s", final_dir, tmp_dir,
                              strerror(errno));
        goto done;
    }
    /* step-<N> exists (a re-save of the same step): swap the two atomically, so some step-<N>
     * exists at every instant; the old one then lives under the temporary name. */
    if (renameat2(AT_FDCWD, tmp_dir, AT_FDCWD, final_dir, RENAME_EXCHANGE) == 0) {
        status = ckpt_fsync_dir(folder, err);
        if (status == GT_OK) status = ckpt_remove_tree(folder, tmp_name, err);
        goto done;
    }
    if (errno != EINVAL && errno != ENOSYS) {
        status = gt_error_set(err, GT_ERR_IO, "%s: cannot exchange it with %s: %s", final_dir,
                              tmp_dir, strerror(errno));
        goto done;
    }
    /* No RENAME_EXCHANGE on this filesystem: move the old one aside first. For a moment step-<N>
     * is absent; the earlier checkpoints remain, and a kill leaves the old one as a .tmp-*. */
    snprintf(aside_name, sizeof aside_name, CKPT_TMP_PREFIX "old-step-%lld-%ld", (long long)step,
             (long)getpid());
    aside = gt_path_join(folder, aside_name);
    if (rename(final_dir, aside) != 0 || rename(tmp_dir, final_dir) != 0) {
        status = gt_error_set(err, GT_ERR_IO, "%s: cannot replace it with %s: %s", final_dir,
                              tmp_dir, strerror(errno));
        goto done;
    }
    status = ckpt_fsync_dir(folder, err);
    if (status == GT_OK) status = ckpt_remove_tree(folder, aside_name, err);
done:
    free(aside);
    free(tmp_dir);
    free(final_dir);
    return status;
}

/* The manifest's tensor entries (need_data: each non-empty tensor must have data). Their xxh64 is
 * filled in as the bytes are written (ckpt_hashing_source). */
static gt_status ckpt_describe_tensors(int n, const char *const *names,
                                       const gt_tensor *const *tensors, bool need_data,
                                       gt_checkpoint_info *info, gt_error *err)
{
    info->tensors = gt_xcalloc((size_t)n + 1, sizeof *info->tensors);
    for (int i = 0; i < n; i++) {
        const gt_tensor *t = tensors[i];
        const char *name = names[i] ? names[i] : "(null)";
        if (!names[i] || !t || t->dtype < 0 || t->dtype >= GT_DTYPE_COUNT || t->ndim < 0 ||
            t->ndim > GT_MAX_DIMS || gt_shape_numel(t->ndim, t->shape) < 0 ||
            (need_data && gt_tensor_nbytes(t) > 0 && !t->data))
            return gt_error_set(err, GT_ERR_INVALID,
                                "tensor %d " CKPT_NAME_FMT
                                " has no name, is NULL, or has a bad dtype, rank, shape or no data",
                                i, name);
        gt_checkpoint_tensor *m = &info->tensors[info->n_tensors++];
        m->name = gt_xstrdup(name);
        m->dtype = t->dtype;
        m->ndim = t->ndim;
        memcpy(m->shape, t->shape, sizeof m->shape);
    }
    return GT_OK;
}

/* Everything in the manifest but the file entry, copied from d. */
static gt_status ckpt_describe(const gt_checkpoint_desc *d, int n, const char *const *names,
                               const gt_tensor *const *tensors, bool need_data,
                               gt_checkpoint_info *info, gt_error *err)
{
    memset(info, 0, sizeof *info);
    info->version = GT_CHECKPOINT_VERSION;
    info->step = d->step;
    info->model_name = d->model.name ? gt_xstrdup(d->model.name) : NULL;
    info->model_flavor = d->model.flavor ? gt_xstrdup(d->model.flavor) : NULL;
    info->fingerprint = d->model.fingerprint;
    info->loader_json = gt_xstrdup(d->loader_json ? d->loader_json : "{}");
    info->rng_seed = d->rng_seed;
    int nc = d->n_rng_counters > 0 ? d->n_rng_counters : 0;
    int ne = d->n_extra > 0 ? d->n_extra : 0;
    if ((nc > 0 && (!d->rng_counter_names || !d->rng_counters)) ||
        (ne > 0 && (!d->extra_keys || !d->extra_values)))
        return gt_error_set(err, GT_ERR_INVALID, "NULL RNG counter or extra arrays");
    info->rng_counter_names = gt_xcalloc((size_t)nc + 1, sizeof(char *));
    info->rng_counters = gt_xcalloc((size_t)nc + 1, sizeof(int64_t));
    for (int i = 0; i < nc; i++, info->n_rng_counters++) {
        const char *s = d->rng_counter_names[i];
        info->rng_counter_names[i] = s ? gt_xstrdup(s) : NULL;
        info->rng_counters[i] = d->rng_counters[i];
    }
    info->extra_keys = gt_xcalloc((size_t)ne + 1, sizeof(char *));
    info->extra_values = gt_xcalloc((size_t)ne + 1, sizeof(char *));
    for (int i = 0; i < ne; i++, info->n_extra++) {
        info->extra_keys[i] = d->extra_keys[i] ? gt_xstrdup(d->extra_keys[i]) : NULL;
        info->extra_values[i] = d->extra_values[i] ? gt_xstrdup(d->extra_values[i]) : NULL;
    }
    GT_TRY(ckpt_describe_tensors(n, names, tensors, need_data, info, err));
    /* Placeholder file entry so the manifest can be validated before anything is written. */
    info->files = gt_xcalloc(1, sizeof *info->files);
    info->files[0].name = gt_xstrdup(GT_CHECKPOINT_TENSOR_FILE);
    info->n_files = 1;
    char *text = NULL;
    GT_TRY(gt_checkpoint_manifest_dump(info, &text, err));
    free(text);
    return GT_OK;
}

/* A source that hashes each tensor's bytes into the manifest as they pass to the file. */
typedef struct {
    gt_tensor_source src;
    void *user;
    const gt_tensor *const *descs;
    gt_checkpoint_info *info;
} ckpt_hashing;

static gt_status ckpt_hashing_source(int i, const void **data, void *user, gt_error *err)
{
    ckpt_hashing *h = user;
    GT_TRY(h->src(i, data, h->user, err));
    h->info->tensors[i].xxh64 = gt_hash64(*data, gt_tensor_nbytes(h->descs[i]), 0);
    return GT_OK;
}

/* The temporary directory name of a save of step by writer pid (its rank 0). */
static void ckpt_tmp_name(char *buf, size_t cap, int64_t step, long pid)
{
    snprintf(buf, cap, CKPT_TMP_PREFIX "step-%lld-%ld", (long long)step, pid);
}

char *gt_checkpoint_tensor_path(const char *folder, int64_t step, long writer_pid)
{
    char name[96];
    ckpt_tmp_name(name, sizeof name, step, writer_pid);
    char *dir = gt_path_join(folder, name);
    char *path = gt_path_join(dir, GT_CHECKPOINT_TENSOR_FILE);
    free(dir);
    return path;
}

/* Step 1 and the directory of step 2: the checked arguments, described (info), the folder made,
 * stale temporaries removed and the temporary directory created (its name in tmp_name). */
static gt_status ckpt_prepare(const gt_checkpoint_desc *d, int n, const char *const *names,
                              const gt_tensor *const *tensors, bool need_data,
                              gt_checkpoint_info *info, char *tmp_name, size_t cap, gt_error *err)
{
    memset(info, 0, sizeof *info);
    if (!d || !d->folder || !d->folder[0])
        return gt_error_set(err, GT_ERR_INVALID, "checkpoint save: no folder given");
    if (d->step < 0 || n < 0 || (n > 0 && (!names || !tensors)))
        return gt_error_set(err, GT_ERR_INVALID,
                            "checkpoint save to %s: bad arguments (step %lld, %d tensors, or "
                            "NULL arrays)",
                            d->folder, (long long)d->step, n);
    GT_TRY(ckpt_describe(d, n, names, tensors, need_data, info, err));
    GT_TRY(ckpt_mkdirs(d->folder, err));
    gt_checkpoint_prune_wait(); /* its .tmp-* names are ours: stale to the line below */
    GT_TRY(ckpt_remove_stale(d->folder, err));
    ckpt_tmp_name(tmp_name, cap, d->step, (long)getpid());
    char *tmp_dir = gt_path_join(d->folder, tmp_name);
    gt_status st = GT_OK;
    if (mkdir(tmp_dir, 0755) != 0)
        st = gt_error_set(err, GT_ERR_IO, "%s: cannot create directory: %s", tmp_dir,
                          strerror(errno));
    free(tmp_dir);
    return st;
}

/* The rest of step 2 and steps 3 and 4, the tensor file written and fsynced in tmp_name: hash it
 * as it lies on disk, write the manifest, publish, prune. A failure removes the temporary
 * directory and says which save failed. */
static gt_status ckpt_complete(const gt_checkpoint_desc *d, const char *tmp_name,
                               gt_checkpoint_info *info, gt_status st, gt_error *err)
{
    char *tmp_dir = gt_path_join(d->folder, tmp_name);
    char *st_path = gt_path_join(tmp_dir, GT_CHECKPOINT_TENSOR_FILE);
    /* The file's hash from its header as it lies on disk and the tensors' hashes (gt_checkpoint.h,
     * version 2): no second pass over the data. */
    gt_safetensors file;
    if (st == GT_OK) st = gt_safetensors_open_lazy(st_path, &file, err);
    if (st == GT_OK) {
        st = ckpt_hash_tensor_file(&file, info, &info->files[0].bytes, &info->files[0].xxh64, err);
        gt_safetensors_close(&file);
    }
    char *text = NULL;
    if (st == GT_OK) st = gt_checkpoint_manifest_dump(info, &text, err);
    if (st == GT_OK) {
        char *path = gt_path_join(tmp_dir, GT_CHECKPOINT_MANIFEST);
        st = ckpt_write_file(path, text, strlen(text), err);
        free(path);
    }
    free(text);
    if (st == GT_OK) st = ckpt_fsync_dir(tmp_dir, err);
    if (st == GT_OK) st = ckpt_publish(d->folder, tmp_name, d->step, err);
    if (st == GT_OK) {
        st = prune(d->folder, d->keep_last, d->prune_in_background, err);
    } else {
        /* Best effort: a leftover is removed by the next save anyway. */
        gt_error ignored = {0};
        struct stat sb;
        if (stat(tmp_dir, &sb) == 0) ckpt_remove_tree(d->folder, tmp_name, &ignored);
        gt_error_wrap(err, "checkpoint save of step %lld to %s", (long long)d->step, d->folder);
    }
    free(st_path);
    free(tmp_dir);
    return st;
}

static gt_status ckpt_save(const gt_checkpoint_desc *d, int n, const char *const *names,
                           const gt_tensor *const *tensors, bool need_data, gt_tensor_source src,
                           void *user, gt_error *err)
{
    gt_checkpoint_info info;
    char tmp_name[96] = "";
    gt_status st =
        ckpt_prepare(d, n, names, tensors, need_data, &info, tmp_name, sizeof tmp_name, err);
    if (st == GT_OK) {
        char *st_path = gt_checkpoint_tensor_path(d->folder, d->step, (long)getpid());
        ckpt_hashing h = {src, user, tensors, &info};
        st = gt_safetensors_write_from(st_path, n, names, tensors, ckpt_hashing_source, &h, 0, NULL,
                                       NULL, err);
        free(st_path);
        st = ckpt_complete(d, tmp_name, &info, st, err);
    } else if (tmp_name[0]) {
        st = ckpt_complete(d, tmp_name, &info, st, err); /* removes the directory */
    } else if (d && d->folder) {
        gt_error_wrap(err, "checkpoint save of step %lld to %s", (long long)d->step, d->folder);
    }
    gt_checkpoint_info_free(&info);
    return st;
}

gt_status gt_checkpoint_begin(const gt_checkpoint_desc *d, int n, const char *const *names,
                              const gt_tensor *const *descs, gt_checkpoint_writer *w, gt_error *err)
{
    memset(w, 0, sizeof *w);
    gt_status st =
        ckpt_prepare(d, n, names, descs, false, &w->info, w->tmp_name, sizeof w->tmp_name, err);
    if (st == GT_OK) {
        w->desc = *d;
        w->pid = (long)getpid();
        w->tensor_path = gt_checkpoint_tensor_path(d->folder, d->step, w->pid);
        st = gt_safetensors_create(w->tensor_path, n, names, descs, 0, NULL, NULL, err);
    }
    if (st != GT_OK) {
        if (w->tmp_name[0]) ckpt_complete(d, w->tmp_name, &w->info, st, err);
        gt_checkpoint_writer_free(w);
        return st;
    }
    w->open = true;
    return GT_OK;
}

gt_status gt_checkpoint_finish(gt_checkpoint_writer *w, const uint64_t *xxh64, gt_error *err)
{
    GT_CHECK(w->open);
    w->open = false;
    for (int i = 0; i < w->info.n_tensors; i++)
        w->info.tensors[i].xxh64 = xxh64[i];
    gt_status st = GT_OK;
    int fd = open(w->tensor_path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || fsync(fd) != 0)
        st = gt_error_set(err, GT_ERR_IO, "%s: cannot fsync: %s", w->tensor_path, strerror(errno));
    if (fd >= 0) close(fd);
    return ckpt_complete(&w->desc, w->tmp_name, &w->info, st, err);
}

void gt_checkpoint_writer_free(gt_checkpoint_writer *w)
{
    if (w->open) { /* abandoned: its temporary directory goes */
        gt_error ignored = {0};
        ckpt_remove_tree(w->desc.folder, w->tmp_name, &ignored);
    }
    gt_checkpoint_info_free(&w->info);
    free(w->tensor_path);
    memset(w, 0, sizeof *w);
}

gt_status gt_checkpoint_save(const gt_checkpoint_desc *d, int n, const char *const *names,
                             const gt_tensor *const *tensors, gt_error *err)
{
    return ckpt_save(d, n, names, tensors, true, gt_tensor_array_source, (void *)tensors, err);
}

gt_status gt_checkpoint_save_from(const gt_checkpoint_desc *d, int n, const char *const *names,
                                  const gt_tensor *const *descs, gt_tensor_source src, void *user,
                                  gt_error *err)
{
    if (!src) return gt_error_set(err, GT_ERR_INVALID, "checkpoint save: no tensor source");
    return ckpt_save(d, n, names, descs, false, src, user, err);
}
