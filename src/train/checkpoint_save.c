/* checkpoint_save.c — the trainer's saves of sharded state (loading is in shard_io.c).
 *
 * Checkpoints hold whole tensors, whatever the layout that wrote them. A save: rank 0 creates the
 * tensor file with its header and sized data section (gt_checkpoint_begin), every rank writes the
 * blocks it is the first to hold (replicated copies are written once) at their places in the file
 * — an FSDP block of rows is one pwrite —, then hashes every N-th whole tensor back from the file,
 * and rank 0 finishes (file hash, manifest, rename). The ranks agree after each part, so a failed
 * write (disk full) on any rank stops every rank and publishes nothing. The checkpoint directory
 * must be one that every rank sees (a shared filesystem across hosts).
 *
 * checkpoint.async_mode: the save begins in the step loop (rank 0 creates the file; the manifest
 * holds the loader position of that step), the rank copies the blocks it writes into a snapshot in
 * host memory, and a thread writes them, then a
 * thread hashes its share of the tensors, while training goes on. After every step every rank
 * says whether its thread is done (a sum over the ranks, so all see the same answer); once all
 * are, the ranks agree on the part's outcome and go on to the next part, or finish. The next save,
 * and the end of the run, wait for a save still under way. The threads do file I/O alone: every
 * collective and every device call stays on the main thread. A save abandoned after a failure
 * (teardown) stops its thread at the next 64 MiB piece or tensor.
 *
 * The snapshot's memory is allocated once the state is (2 MiB aligned, transparent huge pages
 * asked for) and a thread touches its pages then, so the first save does not fault in fresh
 * pages in the step loop: 3-4 GB/s a process with huge pages, 1.3 GB/s without, on an H200 host,
 * where an 8B rank's snapshot is 24 GB. For async_with_pinned_mem on the GPU the same thread then
 * pins those touched pages (cudaHostRegister, 20-35 GB/s; cudaHostAlloc of fresh memory ran at
 * 1.2 GB/s), and the run's first step waits for it (gt_trainer_snapshot_wait): pinning stalls the
 * step loop's CUDA calls while it runs. The device copies into them run at the link's speed. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "graphtrain/gt_checkpoint.h"
#include "train_internal.h"

/* Rank 0's part of a save, begun: the temporary directory and the tensor file of the whole
 * tensors (descs: their names' dtypes and global shapes), sized, for every rank to fill. */
static gt_status begin_checkpoint(gt_trainer *t, int64_t step, const gt_tensor *const *descs,
                                  gt_checkpoint_writer *w, gt_error *err)
{
    gt_loader_state ls;
    char state[64], loader_json[128], layout[96], world[16];
    gt_loader_get_state(t->loader, &ls);
    gt_loader_state_format(&ls, state, sizeof state);
    snprintf(loader_json, sizeof loader_json, "{\"state\":\"%s\"}", state);
    gt_mesh_format(&t->dist.layout.mesh, layout, sizeof layout);
    snprintf(world, sizeof world, "%d", t->dist.size);
    /* informational: the attention mask the model trained with (model.attn_mask_type) and the
     * layout that wrote it (any layout reads it) */
    const char *keys[3] = {"attn_mask_type", "saved_by_layout", "saved_by_ranks"};
    const char *values[3] = {
        t->cfg->model.attn_mask_type == GT_CFG_ATTN_MASK_CAUSAL ? "causal" : "block_causal", layout,
        world};
    bool multi = gt_train_dist_multi(&t->dist);
    gt_checkpoint_desc d = {
        .folder = t->ckpt_folder,
        .step = step,
        .model = {t->cfg->model.name, t->cfg->model.flavor, gt_trainer_fingerprint(t)},
        .loader_json = loader_json,
        .rng_seed = t->cfg->debug.seed,
        .n_extra = multi ? 3 : 1,
        .extra_keys = keys,
        .extra_values = values,
        .keep_last = (int)t->cfg->checkpoint.keep_latest_k,
        .prune_in_background = true,
    };
    /* the manifest is built now: the strings above need not outlive this call but the folder */
    return gt_checkpoint_begin(&d, t->n_ckpt, (const char *const *)t->ckpt_names, descs, w, err);
}

/* Whether this rank writes its block of a tensor placed as b: the first of the ranks holding the
 * same block (coordinate 0 on every mesh dim that does not shard it). */
static bool writes_block(const gt_train_dist *d, const gt_shard_box *b)
{
    for (int md = 0; md < GT_MESH_NDIMS; md++)
        if (d->layout.mesh.size[md] > 1 && b->place[md].kind != GT_PLACE_SHARD &&
            d->layout.coords[md] != 0)
            return false;
    return true;
}

/* Where a block's bytes come from: the host tensor, or (GPU, state newer than the host's) graph
 * input `input` of the step program on the device, through a pinned bounce buffer. */
typedef struct {
    int fd;
    const char *path, *local;
#ifdef GT_HAVE_CUDA
    gt_executor *dev; /* the step executor holding the state on its device, or NULL */
    int32_t input;
    char *bounce;
    size_t input_bytes;  /* the input's size */
    size_t win, win_len; /* the bytes [win, win + win_len) of the input that bounce holds */
#endif
    size_t es;
    uint64_t at;               /* the tensor's first byte in the file */
    const atomic_bool *cancel; /* an abandoned asynchronous save stops between pieces */
    gt_status st;
    gt_error *err;
} block_writer;

/* Whether the save was abandoned (set on err); NULL cancel: it cannot be. */
static bool abandoned(const atomic_bool *cancel, const char *path, gt_status *st, gt_error *err)
{
    if (!cancel || !atomic_load(cancel)) return false;
    *st = gt_error_set(err, GT_ERR_IO, "%s: the save was abandoned", path);
    return true;
}

/* Writes n bytes at `at`, in pieces of at most GT_CKPT_BOUNCE_BYTES (the cancel flag is read
 * between them). */
static void pwrite_all(block_writer *w, const char *src, size_t n, off_t at)
{
    for (size_t done = 0; w->st == GT_OK && done < n;) {
        if (abandoned(w->cancel, w->path, &w->st, w->err)) break;
        size_t piece = n - done < GT_CKPT_BOUNCE_BYTES ? n - done : GT_CKPT_BOUNCE_BYTES;
        ssize_t r = pwrite(w->fd, src + done, piece, at + (off_t)done);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0)
            w->st = gt_error_set(w->err, GT_ERR_IO, "%s: write failed: %s", w->path,
                                 r < 0 ? strerror(errno) : "no progress");
        else
            done += (size_t)r;
    }
}

static void pwrite_run(int64_t g, int64_t l, int64_t count, void *user)
{
    block_writer *w = user;
    size_t n = (size_t)count * w->es, from = (size_t)l * w->es;
    off_t at = (off_t)(w->at + (uint64_t)g * w->es);
#ifdef GT_HAVE_CUDA
    /* through the bounce buffer, which holds a window of the input: a run inside it (a TP block's
     * row) is written from it, else the window moves to the run's first byte */
    for (size_t done = 0; w->dev && w->st == GT_OK && done < n;) {
        size_t pos = from + done;
        if (pos < w->win || pos >= w->win + w->win_len) {
            size_t left = w->input_bytes - pos;
            w->win = pos;
            w->win_len = left < GT_CKPT_BOUNCE_BYTES ? left : GT_CKPT_BOUNCE_BYTES;
            w->st = gt_executor_read_input_bytes(w->dev, w->input, w->win, w->win_len, w->bounce,
                                                 w->err);
        }
        size_t in_win = w->win + w->win_len - pos, len = n - done < in_win ? n - done : in_win;
        pwrite_all(w, w->bounce + (pos - w->win), len, at + (off_t)done);
        done += len;
    }
    if (w->dev) return;
#endif
    pwrite_all(w, w->local + from, n, at);
}

/* This rank's part: its blocks (those it is the first to hold) written where the file's header
 * (file, open) places each tensor, fsynced. An FSDP block of rows is one write. The bytes come from
 * src[k] when src is given (a snapshot of the state), else from the state itself: when the state on
 * the GPU is newer than the host tensors, the blocks go from the device to the file through one
 * pinned buffer, up to 64 MiB of the input at a time (a TP block's rows one copy, not one each), so
 * the host copy of the state (whose first write faults in fresh pages, 1.3 GB/s a rank on an H200
 * host) is not needed. */
static gt_status write_blocks(gt_trainer *t, const gt_safetensors *file, const gt_tensor *src,
                              const atomic_bool *cancel, gt_error *err)
{
    int fd = open(file->path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return gt_error_set(err, GT_ERR_IO, "%s: cannot open: %s", file->path, strerror(errno));
    block_writer w = {.fd = fd, .path = file->path, .cancel = cancel, .st = GT_OK, .err = err};
#ifdef GT_HAVE_CUDA
    bool from_device = !src && gt_trainer_state_on_device(t) && t->host_stale;
    if (from_device) w.st = gt_cuda_host_alloc((void **)&w.bounce, GT_CKPT_BOUNCE_BYTES, err);
#endif
    for (int k = 0; k < t->n_ckpt && w.st == GT_OK; k++) {
        const gt_shard_box *b = &t->box[k];
        const gt_st_entry *e = gt_safetensors_find(file, t->ckpt_names[k]);
        GT_CHECK(e != NULL); /* the file was created from these names */
        if (!writes_block(&t->dist, b)) continue;
        w.local = src ? src[k].data : t->ckpt_tensors[k]->data;
#ifdef GT_HAVE_CUDA
        w.dev = from_device ? t->whole.ex : NULL;
        if (w.dev && (w.st = gt_trainer_ckpt_input(t, k, &w.input, err)) != GT_OK) break;
        w.input_bytes = gt_tensor_nbytes(t->ckpt_tensors[k]); /* the input's (local) size */
        w.win = w.win_len = 0;
#endif
        w.es = gt_dtype_size(e->dtype);
        w.at = file->data_offset + e->begin;
        gt_shard_for_each_run(b, pwrite_run, &w);
    }
#ifdef GT_HAVE_CUDA
    gt_cuda_host_free(w.bounce);
#endif
    if (w.st == GT_OK && fsync(fd) != 0)
        w.st = gt_error_set(err, GT_ERR_IO, "%s: fsync failed: %s", file->path, strerror(errno));
    if (close(fd) != 0 && w.st == GT_OK)
        w.st = gt_error_set(err, GT_ERR_IO, "%s: close failed: %s", file->path, strerror(errno));
    return w.st;
}

typedef struct {
    gt_trainer *t;
    const gt_safetensors *file;
    uint64_t *h;
    const atomic_bool *cancel;
} hash_job;

/* Job j: tensor k = rank + j * size. */
static gt_status hash_one(int j, void *user, gt_error *err)
{
    hash_job *hj = user;
    int k = hj->t->dist.rank + j * hj->t->dist.size;
    gt_status st = GT_OK;
    if (abandoned(hj->cancel, hj->file->path, &st, err)) return st;
    return gt_safetensors_hash(hj->file, gt_safetensors_find(hj->file, hj->t->ckpt_names[k]),
                               &hj->h[k], err);
}

/* xxh64 of the whole tensors k = rank, rank + size, ... as they lie in the file, into h[k]
 * (h[k] stays 0 for the others), on up to GT_CKPT_HASH_THREADS threads; an abandoned save stops
 * between tensors. */
static gt_status hash_tensors(gt_trainer *t, const gt_safetensors *file, uint64_t *h,
                              const atomic_bool *cancel, gt_error *err)
{
    int n = t->n_ckpt, mine = (n - t->dist.rank + t->dist.size - 1) / t->dist.size;
    hash_job hj = {t, file, h, cancel};
    return gt_run_jobs(mine, gt_ckpt_io_threads(), hash_one, &hj, err);
}

/* ---------------------------------------------------------------- one save, in parts */

enum { PART_WRITE, PART_HASH };

struct gt_ckpt_save {
    gt_trainer *t;
    int64_t step;
    gt_whole_descriptors w;
    gt_checkpoint_writer cw; /* rank 0's */
    gt_safetensors file;
    uint64_t *h;    /* [n_ckpt]: the tensor hashes of this rank's share (0 elsewhere) */
    gt_tensor *src; /* async: views of t->snapshot, one per checkpoint tensor this rank writes */
    int part;       /* the part under way: PART_WRITE, PART_HASH */
    /* the part's own outcome, and whether it is done (written by its thread, if any) */
    gt_status st;
    gt_error err;
    atomic_bool done;
    atomic_bool cancel; /* save_free: the thread stops at its next piece */
    pthread_t thread;
    bool thread_live;
    /* seconds */
    double t_start, t_part, snapshot_s, snapshot_mem_s, loop_s, part_s[2];
};

/* Waits for the part's thread, if it has one. */
static void join_part(struct gt_ckpt_save *s)
{
    if (s->thread_live) pthread_join(s->thread, NULL);
    s->thread_live = false;
}

static void save_free(struct gt_ckpt_save *s)
{
    if (!s) return;
    atomic_store(&s->cancel, true); /* a failure elsewhere need not wait for 96 GB of writes */
    join_part(s);
    gt_safetensors_close(&s->file);
    gt_checkpoint_writer_free(&s->cw); /* not finished: removes the temporary directory */
    gt_whole_descriptors_free(&s->w);
    free(s->h);
    free(s->src);
    free(s);
}

/* The local work of the part under way. */
static void *run_part(void *arg)
{
    struct gt_ckpt_save *s = arg;
    s->st = s->part == PART_WRITE ? write_blocks(s->t, &s->file, s->src, &s->cancel, &s->err)
                                  : hash_tensors(s->t, &s->file, s->h, &s->cancel, &s->err);
    atomic_store(&s->done, true);
    return NULL;
}

/* Starts part `part`: on a thread when the save is asynchronous (inline if none can be made). */
static void start_part(struct gt_ckpt_save *s, int part, bool async)
{
    s->part = part;
    s->st = GT_OK;
    memset(&s->err, 0, sizeof s->err);
    atomic_store(&s->done, false);
    s->t_part = gt_now_seconds();
    s->thread_live = async && pthread_create(&s->thread, NULL, run_part, s) == 0;
    if (!s->thread_live) run_part(s);
}

/* Every rank: waits for this rank's part, then the ranks agree on its outcome (and share the
 * tensor hashes after the hash part). */
static gt_status end_part(struct gt_ckpt_save *s, gt_error *err)
{
    gt_train_dist *d = &s->t->dist;
    join_part(s);
    gt_status st = GT_OK;
    if (s->part == PART_HASH) /* a communication failure is this rank's */
        st = gt_train_share_slots(d, s->h, (int64_t)s->t->n_ckpt, err);
    if (st == GT_OK) {
        if (s->st != GT_OK) *err = s->err;
        st = gt_train_agree(d, s->st, err);
    }
    s->part_s[s->part] = gt_now_seconds() - s->t_part;
    return st;
}

/* Every rank: rank 0 begins the save (the temporary directory and the tensor file, sized), every
 * rank opens the file. */
static gt_status save_begin(gt_trainer *t, int64_t step, struct gt_ckpt_save **out, gt_error *err)
{
    gt_train_dist *d = &t->dist;
    struct gt_ckpt_save *s = gt_xcalloc(1, sizeof *s);
    s->t = t;
    s->step = step;
    s->t_start = gt_now_seconds();
    s->w = gt_whole_descriptors_of(t);
    s->h = gt_xcalloc((size_t)t->n_ckpt + 1, sizeof *s->h);
    /* every rank reaches every collective below in the same order, whatever failed where */
    gt_status st = d->rank == 0 ? begin_checkpoint(t, step, s->w.ptrs, &s->cw, err) : GT_OK;
    st = gt_train_share_status(d, 0, st, err);
    int64_t pid = s->cw.pid;
    if (st == GT_OK) st = gt_train_share_i64(d, &pid, err);
    if (st == GT_OK) {
        char *path = gt_checkpoint_tensor_path(t->ckpt_folder, step, (long)pid);
        gt_status os = gt_safetensors_open_lazy(path, &s->file, err);
        free(path);
        st = gt_train_agree(d, os, err);
    }
    if (st != GT_OK) {
        save_free(s);
        return st;
    }
    *out = s;
    return GT_OK;
}

/* Every rank: rank 0 publishes the save (the file hash, the manifest, the rename, the pruning). */
static gt_status save_finish(struct gt_ckpt_save *s, bool async, int64_t now_step, gt_error *err)
{
    gt_trainer *t = s->t;
    gt_train_dist *d = &t->dist;
    double t0 = gt_now_seconds();
    gt_status fs = d->rank == 0 ? gt_checkpoint_finish(&s->cw, s->h, err) : GT_OK;
    double finish_s = gt_now_seconds() - t0;
    GT_TRY(gt_train_share_status(d, 0, fs, err));
    if (d->rank != 0) return GT_OK;
    double bytes = 0;
    for (int k = 0; k < t->n_ckpt; k++)
        bytes += (double)gt_tensor_nbytes(s->w.ptrs[k]);
    if (!async)
        gt_log(GT_LOG_INFO,
               "checkpoint: saved step %lld to %s/step-%lld (%.2f s): %.2f GB; before it the "
               "state to the host %.2f s; in it the writes %.2f s, tensor hashes %.2f s, file "
               "hash and publishing %.2f s",
               (long long)s->step, t->ckpt_folder, (long long)s->step,
               gt_now_seconds() - s->t_start, bytes / 1e9, s->snapshot_s, s->part_s[PART_WRITE],
               s->part_s[PART_HASH], finish_s);
    else
        gt_log(GT_LOG_INFO,
               "checkpoint: saved step %lld to %s/step-%lld in the background (%.2f s, published "
               "after step %lld): %.2f GB; the step loop spent %.2f s on it (the snapshot of the "
               "state %.2f s, of which waiting for its memory %.2f s); the writes %.2f s, tensor "
               "hashes %.2f s, file hash and publishing %.2f s",
               (long long)s->step, t->ckpt_folder, (long long)s->step,
               gt_now_seconds() - s->t_start, (long long)now_step, bytes / 1e9,
               s->loop_s + gt_now_seconds() - t0, s->snapshot_s, s->snapshot_mem_s,
               s->part_s[PART_WRITE], s->part_s[PART_HASH], finish_s);
    return GT_OK;
}

/* ---------------------------------------------------------------- the snapshot */

/* Bytes of the snapshot: every block this rank writes, each 64-byte aligned. */
static size_t snapshot_size(const gt_trainer *t)
{
    size_t bytes = 0;
    for (int k = 0; k < t->n_ckpt; k++)
        if (writes_block(&t->dist, &t->box[k]))
            bytes += (gt_tensor_nbytes(t->ckpt_tensors[k]) + 63) & ~(size_t)63;
    return bytes;
}

/* Pins the snapshot for async_with_pinned_mem (the calling thread uses the trainer's device). */
static void pin_snapshot(gt_trainer *t)
{
#ifdef GT_HAVE_CUDA
    double t0 = gt_now_seconds();
    if (gt_cuda_init(t->device, NULL, &t->snapshot_pin_err) == GT_OK &&
        gt_cuda_host_register(t->snapshot, t->snapshot_bytes, &t->snapshot_pin_err) == GT_OK)
        t->snapshot_pinned = true;
    else
        t->snapshot_pin_failed = true;
    t->snapshot_pin_s = gt_now_seconds() - t0;
#else
    t->snapshot_pin_failed = true;
    gt_error_set(&t->snapshot_pin_err, GT_ERR_UNSUPPORTED, "built without CUDA");
#endif
}

/* Says how the pinning went (async_with_pinned_mem on the GPU), once the thread is done. */
static void say_pinned(const gt_trainer *t)
{
    if (!t->snapshot_pin) return;
    if (t->snapshot_pin_failed)
        gt_log(GT_LOG_WARN,
               "checkpoint.async_mode = async_with_pinned_mem: %s; the snapshot stays in "
               "pageable memory",
               t->snapshot_pin_err.msg);
    else
        gt_log(GT_LOG_INFO,
               "checkpoint: the snapshot's %.2f GB of host memory were pinned while the first "
               "step ran (%.2f s)",
               t->snapshot_bytes / 1e9, t->snapshot_pin_s);
}

static void *touch_pages(void *arg)
{
    gt_trainer *t = arg;
    memset(t->snapshot, 0, t->snapshot_bytes);
    if (t->snapshot_pin) pin_snapshot(t);
    return NULL;
}

#define HUGE_PAGE ((size_t)2 << 20)

void gt_trainer_snapshot_prepare(gt_trainer *t)
{
    if (!t->cfg->checkpoint.enable || t->cfg->checkpoint.async_mode == GT_CFG_ASYNC_DISABLED)
        return;
    gt_trainer_refresh_ckpt_tensors(t);
    size_t bytes = (snapshot_size(t) + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
    t->snapshot = bytes ? aligned_alloc(HUGE_PAGE, bytes) : NULL;
    if (!t->snapshot) return; /* the first save says so */
    t->snapshot_bytes = bytes;
    t->snapshot_pin = t->cuda && t->cfg->checkpoint.async_mode == GT_CFG_ASYNC_PINNED;
#ifdef MADV_HUGEPAGE
    madvise(t->snapshot, bytes, MADV_HUGEPAGE);
#endif
    t->snapshot_touching = pthread_create(&t->snapshot_thread, NULL, touch_pages, t) == 0;
    if (!t->snapshot_touching) {
        touch_pages(t);
        say_pinned(t);
    }
}

void gt_trainer_snapshot_wait(gt_trainer *t)
{
    if (!t->snapshot_touching) return; /* joined already, or done inline */
    pthread_join(t->snapshot_thread, NULL);
    t->snapshot_touching = false;
    say_pinned(t);
}

/* The snapshot's memory at a save: touched and, for async_with_pinned_mem on the GPU, pinned. */
static gt_status snapshot_memory(gt_trainer *t, gt_error *err)
{
    gt_trainer_snapshot_wait(t);
    size_t bytes = snapshot_size(t);
    if (bytes > 0 && (!t->snapshot || t->snapshot_bytes < bytes)) /* (a replica writes none) */
        return gt_error_set(
            err, GT_ERR_NOMEM,
            "checkpoint.async_mode: %zu bytes of host memory for the snapshot of "
            "the state: out of memory (checkpoint.async_mode = disabled needs none)",
            bytes);
    return GT_OK;
}

/* s->src: a copy, in host memory, of every block this rank writes, as the state is now. */
static gt_status take_snapshot(gt_trainer *t, struct gt_ckpt_save *s, gt_error *err)
{
    int n = t->n_ckpt;
    bool dev = gt_trainer_state_on_device(t) && t->host_stale; /* newer on the device */
    double t0 = gt_now_seconds();
    GT_TRY(snapshot_memory(t, err));
    s->snapshot_mem_s = gt_now_seconds() - t0;
    if (!dev) GT_TRY(gt_trainer_state_to_host(t, false, err));
    s->src = gt_xcalloc((size_t)n, sizeof *s->src);
    char *at = t->snapshot;
    for (int k = 0; k < n; k++) {
        const gt_tensor *x = t->ckpt_tensors[k];
        if (!writes_block(&t->dist, &t->box[k])) continue;
        gt_tensor_wrap(&s->src[k], x->dtype, x->ndim, x->shape, at);
        at += (gt_tensor_nbytes(x) + 63) & ~(size_t)63;
#ifdef GT_HAVE_CUDA
        if (dev) {
            int32_t in = -1;
            GT_TRY(gt_trainer_ckpt_input(t, k, &in, err));
            GT_TRY(gt_executor_read_input(t->whole.ex, in, &s->src[k], err));
            continue;
        }
#endif
        memcpy(s->src[k].data, x->data, gt_tensor_nbytes(x));
    }
    return GT_OK;
}

static void snapshot_free(gt_trainer *t)
{
    if (t->snapshot_touching) pthread_join(t->snapshot_thread, NULL);
#ifdef GT_HAVE_CUDA
    if (t->snapshot_pinned) gt_cuda_host_unregister(t->snapshot);
#endif
    free(t->snapshot);
    t->snapshot = NULL;
    t->snapshot_bytes = 0;
    t->snapshot_touching = t->snapshot_pinned = t->snapshot_pin_failed = false;
}

/* ---------------------------------------------------------------- the trainer's calls */

gt_status gt_trainer_save_checkpoint(gt_trainer *t, int64_t step, gt_error *err)
{
    GT_TRY(gt_trainer_save_poll(t, step, true, err)); /* one save at a time */
    /* parameters left for the device to draw in a step that never ran: drawn on the host now */
    if (t->params_pending) GT_TRY(gt_trainer_state_to_host(t, false, err));
    double t0 = gt_now_seconds();
    /* the run's last save is waited for anyway */
    bool async =
        t->cfg->checkpoint.async_mode != GT_CFG_ASYNC_DISABLED && step < t->cfg->training.steps;
    /* in the step loop, on the GPU the writers read the state from the device (write_blocks) */
    if (!async && !gt_trainer_state_on_device(t)) GT_TRY(gt_trainer_state_to_host(t, false, err));
    gt_trainer_refresh_ckpt_tensors(t);
    double t_host = gt_now_seconds();
    struct gt_ckpt_save *s = NULL;
    GT_TRY(save_begin(t, step, &s, err));
    gt_status st = GT_OK;
    if (async) {
        double t1 = gt_now_seconds();
        /* a rank that cannot take its snapshot (memory) stops every rank, before any thread */
        st = gt_train_agree(&t->dist, take_snapshot(t, s, err), err);
        s->snapshot_s = gt_now_seconds() - t1;
        if (st == GT_OK) {
            start_part(s, PART_WRITE, true);
            s->loop_s = gt_now_seconds() - t0;
            t->saving = s;
            return GT_OK;
        }
    } else {
        s->snapshot_s = t_host - t0; /* the state to the host, before the save began */
        start_part(s, PART_WRITE, false);
        st = end_part(s, err);
        if (st == GT_OK) start_part(s, PART_HASH, false);
        if (st == GT_OK) st = end_part(s, err);
        if (st == GT_OK) st = save_finish(s, false, step, err);
    }
    save_free(s);
    return st;
}

gt_status gt_trainer_save_poll(gt_trainer *t, int64_t step, bool wait, gt_error *err)
{
    struct gt_ckpt_save *s = t->saving;
    if (!s) return GT_OK;
    double t0 = gt_now_seconds();
    gt_status st = GT_OK;
    bool over = false; /* the save failed, or its last part ended */
    for (;;) {
        if (wait) join_part(s);
        uint64_t done = atomic_load(&s->done) ? 1 : 0;
        st = gt_train_share_slots(&t->dist, &done, 1, err);
        if (st == GT_OK && done < (uint64_t)t->dist.size) break; /* a rank's thread is at work */
        if (st == GT_OK) st = end_part(s, err);
        over = st != GT_OK || s->part == PART_HASH;
        if (over) break;
        start_part(s, PART_HASH, true);
        if (!wait) break;
    }
    s->loop_s += gt_now_seconds() - t0;
    if (!over) return GT_OK;
    if (st == GT_OK) st = save_finish(s, true, step, err);
    t->saving = NULL;
    save_free(s);
    return st;
}

void gt_trainer_save_abandon(gt_trainer *t)
{
    save_free(t->saving); /* joins its thread; publishes nothing */
    t->saving = NULL;
    snapshot_free(t);
}
