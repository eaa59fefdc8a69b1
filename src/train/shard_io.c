/* shard_io.c — the blocks of whole tensors that ranks hold, and checkpoints of sharded state.
 *
 * A rank's block of a tensor of global shape G is a box: rows start[d] .. start[d] + size[d] of
 * every dim d (gt_placement_local_box: shards are contiguous, even blocks). The box is walked as
 * rows of its last dim: row r (multi-index i over dims 0..n-2) starts at global flat index
 *   sum_d (start[d] + i[d]) * stride[d] + start[n-1],   stride[d] = prod_{e>d} G[e],
 * and holds size[n-1] contiguous elements — both in the whole tensor and in the block. Rows that
 * follow each other in both (the box spans whole trailing dims) are walked as one run.
 *
 * Checkpoints hold whole tensors, whatever the layout that wrote them: the ordinary single-rank
 * checkpoint plus the layout (informational). Saving is in checkpoint_save.c. Loading: every rank
 * checks the manifest and the file's structure, verifies every N-th tensor's hash, rank 0 the file
 * hash, and every rank reads only its own box of each tensor from the file (on the GPU straight
 * into the step program's inputs). So a checkpoint of any layout resumes in any other.
 * gt_shard_whole (a gather of the blocks in world-rank order to one rank, which puts each rank's
 * block into its box) serves the final parameter hash. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graphtrain/gt_checkpoint.h"
#include "train_internal.h"

/* ---------------------------------------------------------------- boxes */

void gt_shard_box_whole(gt_shard_box *b, int ndim, const int64_t *global)
{
    memset(b, 0, sizeof *b);
    b->ndim = ndim;
    for (int d = 0; d < ndim; d++)
        b->global[d] = b->size[d] = b->local[d] = global[d];
}

gt_status gt_shard_box_init(gt_shard_box *b, const gt_mesh *mesh,
                            const gt_placement place[GT_MESH_MAX_DIMS], int ndim,
                            const int64_t *global, const int coords[GT_MESH_NDIMS], gt_error *err)
{
    gt_shard_box_whole(b, ndim, global);
    memcpy(b->place, place, sizeof b->place);
    GT_TRY(gt_placement_local_box(mesh, place, ndim, global, coords, b->start, b->size, err));
    gt_placement_local_shape(mesh, place, ndim, global, b->local);
    return GT_OK;
}

bool gt_shard_box_is_whole(const gt_shard_box *b)
{
    for (int d = 0; d < b->ndim; d++)
        if (b->start[d] != 0 || b->size[d] != b->global[d]) return false;
    return true;
}

/* Calls fn(global_offset, local_offset, count) for each run of the box, in row-major order: its
 * rows of the last dim, where rows that lie back to back both in the whole tensor and in the block
 * make one run (the box spans the whole of every dim after `inner`), so an FSDP block of rows is
 * one run and its initialisation and copies work on whole blocks, not rows. */
void gt_shard_for_each_run(const gt_shard_box *b, gt_shard_run_fn fn, void *user)
{
    if (b->ndim == 0) {
        fn(0, 0, 1, user);
        return;
    }
    int last = b->ndim - 1, inner = last;
    int64_t stride[GT_MAX_DIMS], lstride[GT_MAX_DIMS], idx[GT_MAX_DIMS] = {0}, rows = 1;
    stride[last] = lstride[last] = 1;
    for (int d = last - 1; d >= 0; d--) {
        stride[d] = stride[d + 1] * b->global[d + 1];
        lstride[d] = lstride[d + 1] * b->local[d + 1];
    }
    while (inner > 0 && b->start[inner] == 0 && b->size[inner] == b->global[inner] &&
           b->local[inner] == b->global[inner])
        inner--;
    for (int d = 0; d < inner; d++)
        rows *= b->size[d];
    int64_t count = b->size[inner] * stride[inner]; /* stride[inner] == lstride[inner] here */
    if (count == 0) return;
    for (int64_t r = 0; r < rows; r++) {
        int64_t off = b->start[inner] * stride[inner], loff = 0;
        for (int d = 0; d < inner; d++) {
            off += (b->start[d] + idx[d]) * stride[d];
            loff += idx[d] * lstride[d];
        }
        fn(off, loff, count, user);
        for (int d = inner - 1; d >= 0; d--) { /* next multi-index */
            if (++idx[d] < b->size[d]) break;
            idx[d] = 0;
        }
    }
}

typedef struct {
    char *full, *local;
    size_t es;
    bool to_full;
} copy_ctx;

static void copy_run(int64_t g, int64_t l, int64_t count, void *user)
{
    copy_ctx *c = user;
    char *full = c->full + (size_t)g * c->es, *local = c->local + (size_t)l * c->es;
    size_t n = (size_t)count * c->es;
    if (c->to_full)
        memcpy(full, local, n);
    else
        memcpy(local, full, n);
}

void gt_shard_slice(const gt_shard_box *b, const gt_tensor *full, gt_tensor *local)
{
    GT_CHECK(full->dtype == local->dtype);
    GT_CHECK(gt_tensor_numel(local) == gt_shape_numel(b->ndim, b->local));
    /* padding rows (FSDP's ceil-sized blocks) are zeros */
    if (gt_shape_numel(b->ndim, b->size) != gt_tensor_numel(local))
        memset(local->data, 0, gt_tensor_nbytes(local));
    copy_ctx c = {full->data, local->data, gt_dtype_size(full->dtype), false};
    gt_shard_for_each_run(b, copy_run, &c);
}

void gt_shard_place(const gt_shard_box *b, const gt_tensor *local, gt_tensor *full)
{
    GT_CHECK(full->dtype == local->dtype);
    GT_CHECK(gt_tensor_numel(local) == gt_shape_numel(b->ndim, b->local));
    copy_ctx c = {full->data, local->data, gt_dtype_size(full->dtype), true};
    gt_shard_for_each_run(b, copy_run, &c);
}

typedef struct {
    const gt_param_spec *p;
    uint64_t seed;
    gt_tensor *local;
} init_ctx;

static void init_run(int64_t g, int64_t l, int64_t count, void *user)
{
    init_ctx *c = user;
    gt_tensor run;
    gt_tensor_wrap(&run, c->local->dtype, 1, &count,
                   (char *)c->local->data + (size_t)l * gt_dtype_size(c->local->dtype));
    gt_param_init(c->p, c->seed, g, count, &run);
}

void gt_shard_init_param(const gt_shard_box *b, const gt_param_spec *p, uint64_t seed,
                         gt_tensor *local)
{
    init_ctx c = {p, seed, local};
    if (gt_shape_numel(b->ndim, b->size) != gt_tensor_numel(local)) /* padding rows: zeros */
        memset(local->data, 0, gt_tensor_nbytes(local));
    gt_shard_for_each_run(b, init_run, &c);
}

/* The box world rank r holds of the tensor whose box `mine` is (same placement). */
static gt_status box_of_rank(const gt_mesh *mesh, const gt_shard_box *mine, int r,
                             gt_shard_box *out, gt_error *err)
{
    int coords[GT_MESH_NDIMS];
    gt_mesh_coords(mesh, r, coords);
    return gt_shard_box_init(out, mesh, mine->place, mine->ndim, mine->global, coords, err);
}

/* full = the blocks of world ranks 0 .. n-1, each n_each elements, laid end to end in all. */
static gt_status place_blocks(int n, const gt_mesh *mesh, const gt_shard_box *mine, gt_dtype dt,
                              int64_t n_each, const void *all, gt_tensor *full, gt_error *err)
{
    for (int r = 0; r < n; r++) {
        gt_shard_box theirs;
        GT_TRY(box_of_rank(mesh, mine, r, &theirs, err));
        gt_tensor block;
        gt_tensor_wrap(&block, dt, theirs.ndim, theirs.local,
                       (char *)all + (size_t)r * (size_t)n_each * gt_dtype_size(dt));
        gt_shard_place(&theirs, &block, full);
    }
    return GT_OK;
}

/* Whether the blocks of world ranks 0 .. n-1, laid end to end, are the whole tensor in row-major
 * order: unpadded bands of whole rows of dim 0, in rank order (an FSDP split over every rank). */
static gt_status blocks_in_order(int n, const gt_mesh *mesh, const gt_shard_box *mine, bool *yes,
                                 gt_error *err)
{
    *yes = false;
    int64_t next = 0;
    for (int r = 0; r < n && mine->ndim > 0; r++) {
        gt_shard_box b;
        GT_TRY(box_of_rank(mesh, mine, r, &b, err));
        for (int d = 0; d < b.ndim; d++)
            if (b.size[d] != b.local[d] || (d > 0 && b.size[d] != b.global[d])) return GT_OK;
        if (b.start[0] != next) return GT_OK;
        next += b.size[0];
    }
    *yes = mine->ndim > 0 && next == mine->global[0];
    return GT_OK;
}

size_t gt_shard_whole_bytes(const gt_shard_box *b, gt_dtype dt)
{
    return (size_t)gt_shape_numel(b->ndim, b->global) * gt_dtype_size(dt);
}

/* *full = buf's whole-tensor buffer, grown to hold the tensor of box b. */
static gt_status whole_buffer(gt_shard_buffers *buf, const gt_shard_box *b, gt_dtype dt,
                              gt_tensor *full, gt_error *err)
{
    GT_TRY(gt_buffer_reserve(&buf->full, &buf->full_bytes, gt_shard_whole_bytes(b, dt), err));
    gt_tensor_wrap(full, dt, b->ndim, b->global, buf->full);
    return GT_OK;
}

gt_status gt_shard_gather_start(gt_comm *world, const gt_tensor *local, int root,
                                gt_shard_buffers *buf, gt_shard_gather *g, gt_error *err)
{
    int64_t n = gt_tensor_numel(local), all_n = n * world->size;
    void *all = NULL;
    if (world->rank == root) {
        GT_TRY(gt_buffer_reserve(&buf->all, &buf->all_bytes,
                                 (size_t)all_n * gt_dtype_size(local->dtype), err));
        all = buf->all;
    }
    g->root = root;
    g->req = NULL;
    gt_tensor_wrap(&g->in, local->dtype, 1, &n, local->data);
    gt_tensor_wrap(&g->out, local->dtype, 1, &all_n, all);
    return gt_comm_gather_start(world, &g->in, &g->out, root, &g->req, err);
}

gt_status gt_shard_gather_finish(gt_comm *world, const gt_mesh *mesh, const gt_shard_box *mine,
                                 gt_shard_buffers *buf, gt_shard_gather *g, const void **whole,
                                 gt_error *err)
{
    *whole = NULL;
    GT_TRY(gt_comm_wait(g->req, err));
    g->req = NULL;
    if (world->rank != g->root) return GT_OK;
    bool in_order;
    GT_TRY(blocks_in_order(world->size, mesh, mine, &in_order, err));
    if (in_order) { /* the gathered blocks are the whole tensor's bytes */
        *whole = buf->all;
        return GT_OK;
    }
    gt_tensor full;
    GT_TRY(whole_buffer(buf, mine, g->in.dtype, &full, err));
    GT_TRY(
        place_blocks(world->size, mesh, mine, g->in.dtype, g->in.shape[0], buf->all, &full, err));
    *whole = buf->full;
    return GT_OK;
}

gt_status gt_shard_whole(gt_comm *world, const gt_mesh *mesh, const gt_shard_box *mine,
                         const gt_tensor *local, int root, gt_shard_buffers *buf,
                         const void **whole, gt_error *err)
{
    *whole = NULL;
    if (!world || world->size == 1) {
        GT_CHECK(root == 0);
        if (gt_shard_box_is_whole(mine)) {
            *whole = local->data;
            return GT_OK;
        }
        gt_tensor full;
        GT_TRY(whole_buffer(buf, mine, local->dtype, &full, err));
        gt_shard_place(mine, local, &full);
        *whole = buf->full;
        return GT_OK;
    }
    gt_shard_gather g;
    GT_TRY(gt_shard_gather_start(world, local, root, buf, &g, err));
    return gt_shard_gather_finish(world, mesh, mine, buf, &g, whole, err);
}

gt_status gt_shard_hash(gt_comm *world, const gt_mesh *mesh, const gt_shard_box *mine,
                        const gt_tensor *local, int root, gt_shard_buffers *buf, uint64_t *h,
                        gt_error *err)
{
    const void *whole;
    GT_TRY(gt_shard_whole(world, mesh, mine, local, root, buf, &whole, err));
    if (whole) *h = gt_hash64(whole, gt_shard_whole_bytes(mine, local->dtype), 0);
    return GT_OK;
}

void gt_shard_buffers_free(gt_shard_buffers *buf)
{
    free(buf->all);
    free(buf->full);
    *buf = (gt_shard_buffers){0};
}

/* ---------------------------------------------------------------- checkpoints */

gt_whole_descriptors gt_whole_descriptors_of(gt_trainer *t)
{
    int n = t->n_ckpt;
    gt_whole_descriptors w = {gt_xcalloc((size_t)n, sizeof *w.desc),
                              gt_xcalloc((size_t)n, sizeof *w.ptrs)};
    for (int k = 0; k < n; k++) {
        const gt_shard_box *b = &t->box[k];
        gt_tensor_wrap(&w.desc[k], t->ckpt_tensors[k]->dtype, b->ndim, b->global, NULL);
        w.ptrs[k] = &w.desc[k];
    }
    return w;
}

void gt_whole_descriptors_free(gt_whole_descriptors *w)
{
    free(w->desc);
    free(w->ptrs);
}

uint64_t gt_trainer_fingerprint(gt_trainer *t)
{
    gt_trainer_refresh_ckpt_tensors(t);
    gt_whole_descriptors w = gt_whole_descriptors_of(t);
    /* the fingerprint covers the parameters (the first n_params names) */
    uint64_t h = gt_checkpoint_fingerprint(t->n_params, (const char *const *)t->ckpt_names, w.ptrs);
    gt_whole_descriptors_free(&w);
    return h;
}

gt_status gt_trainer_ckpt_input(const gt_trainer *t, int k, int32_t *input, gt_error *err)
{
    const gt_step_graph *s = &t->whole;
    for (int32_t j = 0; s->g && s->feed && j < s->g->n_inputs; j++)
        if (s->feed[j] == t->ckpt_tensors[k]) {
            *input = j;
            return GT_OK;
        }
    return gt_error_set(err, GT_ERR_INTERNAL, "checkpoint: no step input holds %s",
                        t->ckpt_names[k]);
}

/* The step to resume from: the configured one or the latest (GT_CHECKPOINT_NONE: none). */
static gt_status find_resume_step(gt_trainer *t, int64_t *want, gt_error *err)
{
    *want = t->cfg->checkpoint.load_step;
    if (*want < 0) return gt_checkpoint_find_latest(t->ckpt_folder, want, err);
    return gt_checkpoint_find_step(t->ckpt_folder, *want, err);
}

/* One piece of this rank's blocks: bytes [from, from + len) of checkpoint tensor i go to byte
 * `to` of its destination (the host tensor, or the step program's input on the GPU). */
typedef struct {
    int i;
    uint64_t from;
    size_t to, len;
} read_piece;

typedef struct {
    read_piece *p;
    int n, cap;
    size_t piece; /* bytes a piece holds at most */
    int i;        /* the tensor being walked */
    size_t es;    /* its element size */
} piece_list;

/* GT_CKPT_READ_PIECE_BYTES in the environment sets the pieces' size (1 byte to 256 MiB; on the GPU
 * twice the threads' worth is pinned; the tests make it small, to split tensors and elements);
 * GT_CKPT_READ_PIECE otherwise. */
static size_t read_piece_bytes(void)
{
    const char *v = getenv("GT_CKPT_READ_PIECE_BYTES");
    char *end = NULL;
    unsigned long long n = v && *v ? strtoull(v, &end, 10) : 0;
    if (n == 0 || n > ((size_t)1 << 28) || !end || *end) {
        if (v && *v)
            gt_log(GT_LOG_WARN,
                   "GT_CKPT_READ_PIECE_BYTES=%s is not a byte count in 1..2^28; "
                   "reading in pieces of %zu bytes",
                   v, GT_CKPT_READ_PIECE);
        return GT_CKPT_READ_PIECE;
    }
    return (size_t)n;
}

static void add_pieces(int64_t g, int64_t l, int64_t count, void *user)
{
    piece_list *pl = user;
    size_t n = (size_t)count * pl->es;
    for (size_t done = 0; done < n; done += pl->piece) {
        if (pl->n == pl->cap) {
            pl->cap = pl->cap ? 2 * pl->cap : 256;
            pl->p = gt_xrealloc(pl->p, (size_t)pl->cap * sizeof *pl->p);
        }
        size_t len = n - done < pl->piece ? n - done : pl->piece;
        pl->p[pl->n++] =
            (read_piece){pl->i, (uint64_t)g * pl->es + done, (size_t)l * pl->es + done, len};
    }
}

typedef struct {
    gt_trainer *t;
    gt_checkpoint_reader *r;
    const read_piece *p; /* the pieces of this round */
    char *bounce;        /* GPU: the round's pinned buffer, */
    const size_t *at;    /* and where in it each of the round's pieces goes */
} piece_reader;

/* Job j: piece j of the round, into its tensor (host) or its place in the bounce buffer (GPU). */
static gt_status read_piece_job(int j, void *user, gt_error *err)
{
    piece_reader *pr = user;
    const read_piece *p = &pr->p[j];
    char *dst =
        pr->bounce ? pr->bounce + pr->at[j] : (char *)pr->t->ckpt_tensors[p->i]->data + p->to;
    return gt_checkpoint_read(pr->r, p->i, p->from, dst, p->len, err);
}

#ifdef GT_HAVE_CUDA
/* The n pieces into the step program's inputs (input[i]: checkpoint tensor i's), in rounds that
 * fill a pinned buffer of `set` bytes: the round's pieces are read on `threads` threads, packed
 * back to back, then copied up in order, one copy for pieces that are also back to back in the
 * input (a TP block's rows). Two such buffers: a round's copies run while the threads read the
 * next round into the other. */
static gt_status read_to_device(piece_reader *pr, int n, const int32_t *input, int threads,
                                size_t set, gt_error *err)
{
    gt_executor *dev = pr->t->whole.ex;
    const read_piece *all = pr->p;
    size_t *at = gt_xcalloc((size_t)(n ? n : 1), sizeof *at);
    char *bounce = NULL;
    gt_status st = gt_cuda_host_alloc((void **)&bounce, 2 * set, err);
    for (int first = 0, round = 0; st == GT_OK && first < n; round++) {
        int m = 0;
        for (size_t used = 0; first + m < n && used + all[first + m].len <= set; m++) {
            at[m] = used;
            used += all[first + m].len;
        }
        pr->p = all + first;
        pr->at = at;
        pr->bounce = bounce + (size_t)(round & 1) * set;
        st = gt_run_jobs(m, threads, read_piece_job, pr, err);
        /* the round before's copies are done: its buffer is the next round's */
        if (st == GT_OK) st = gt_executor_sync(dev, err);
        for (int j = 0; st == GT_OK && j < m;) {
            const read_piece *q = &pr->p[j];
            size_t len = q->len;
            int k = j + 1;
            while (k < m && pr->p[k].i == q->i && pr->p[k].to == q->to + len)
                len += pr->p[k++].len;
            st = gt_executor_queue_input_bytes(dev, input[q->i], q->to, len, pr->bounce + at[j],
                                               err);
            j = k;
        }
        first += m;
    }
    /* the last round's copies (also after a failure: the buffers are freed below) */
    gt_error sync_err = {0};
    gt_status sy = bounce ? gt_executor_sync(dev, st == GT_OK ? err : &sync_err) : GT_OK;
    if (st == GT_OK) st = sy;
    gt_cuda_host_free(bounce);
    free(at);
    pr->bounce = NULL;
    pr->p = all;
    return st;
}
#endif

/* Reads this rank's block of every checkpoint tensor from r, in pieces on up to
 * gt_ckpt_io_threads threads: into the host tensors, or on the GPU straight into the step
 * program's inputs, in rounds through pinned buffers (read_to_device; the host tensors, whose
 * first write would fault in fresh pages at 1.3 GB/s a rank on an H200 host, stay untouched; the
 * program's other state inputs go up from the host, and the host copy is then stale). Padded FSDP
 * rows are zeroed first. The pieces' order is fixed, and of several failures the first piece's is
 * reported. */
static gt_status read_blocks(gt_trainer *t, gt_checkpoint_reader *r, gt_error *err)
{
    int n = t->n_ckpt, threads = gt_ckpt_io_threads();
    piece_list pl = {.piece = read_piece_bytes()};
    int32_t *input = gt_xcalloc((size_t)n, sizeof *input);
    gt_status st = GT_OK;
#ifdef GT_HAVE_CUDA
    gt_executor *dev = gt_trainer_state_on_device(t) ? t->whole.ex : NULL;
#endif
    for (int i = 0; st == GT_OK && i < n; i++) {
        const gt_shard_box *b = &t->box[i];
        gt_tensor *local = t->ckpt_tensors[i];
        /* no storage: another pipeline rank's stage (trainer_pp_state.c), read by that rank */
        if (!local->data && !gt_trainer_state_on_device(t)) continue;
        bool padded = gt_shape_numel(b->ndim, b->size) != gt_tensor_numel(local); /* FSDP */
#ifdef GT_HAVE_CUDA
        if (dev) {
            st = gt_trainer_ckpt_input(t, i, &input[i], err);
            if (st == GT_OK && padded) st = gt_executor_zero_input(dev, input[i], err);
            padded = false; /* the padding is zeroed there */
        }
#endif
        if (padded) memset(local->data, 0, gt_tensor_nbytes(local));
        pl.i = i;
        pl.es = gt_dtype_size(local->dtype);
        gt_shard_for_each_run(b, add_pieces, &pl);
    }
    piece_reader pr = {t, r, pl.p, NULL, NULL};
    bool on_device = false;
#ifdef GT_HAVE_CUDA
    on_device = dev != NULL;
    if (st == GT_OK && on_device)
        st = read_to_device(&pr, pl.n, input, threads, (size_t)threads * pl.piece, err);
    if (st == GT_OK && on_device) st = gt_trainer_state_to_device(t, true, err);
#endif
    if (st == GT_OK && !on_device) st = gt_run_jobs(pl.n, threads, read_piece_job, &pr, err);
    free(pl.p);
    free(input);
    return st;
}

typedef struct {
    gt_checkpoint_reader *r;
    int rank, size;
} verify_job;

/* Job j: tensor rank + j * size's hash against the manifest. */
static gt_status verify_one(int j, void *user, gt_error *err)
{
    verify_job *vj = user;
    return gt_checkpoint_verify(vj->r, vj->rank + j * vj->size, err);
}

/* Reads checkpoint `want` into this rank's blocks: every rank checks the manifest and the file's
 * structure, then the tensors k = rank, rank + size, ... hash to the manifest (so each byte is
 * hashed once over all ranks; on up to gt_ckpt_io_threads threads), rank 0 checks the file hash,
 * and every rank reads only its own blocks (an FSDP block of rows is one run, read in pieces on
 * those threads) — then that the file did not change meanwhile. The
 * ranks agree after each part. *info gets the manifest. */
static gt_status load_blocks(gt_trainer *t, int64_t want, gt_checkpoint_info *info,
                             double seconds[3], gt_error *err)
{
    double t0 = gt_now_seconds(), t1 = t0, t2 = t0;
    gt_train_dist *d = &t->dist;
    int n = t->n_ckpt;
    gt_checkpoint_model m = {t->cfg->model.name, t->cfg->model.flavor, gt_trainer_fingerprint(t)};
    gt_whole_descriptors w = gt_whole_descriptors_of(t);
    gt_checkpoint_reader r;
    gt_status st = gt_checkpoint_open(t->ckpt_folder, want, &m, n,
                                      (const char *const *)t->ckpt_names, w.ptrs, &r, err);
    gt_whole_descriptors_free(&w);
    /* every rank enters each part or none (the agreed status), so the collectives pair up */
    st = gt_train_agree(d, st, err);
    if (st == GT_OK) {
        int mine = (r.info.n_tensors - d->rank + d->size - 1) / d->size;
        verify_job vj = {&r, d->rank, d->size};
        st = mine > 0 ? gt_run_jobs(mine, gt_ckpt_io_threads(), verify_one, &vj, err) : GT_OK;
        st = gt_train_agree(d, st, err);
        t1 = gt_now_seconds();
    }
    if (st == GT_OK) {
        gt_status fs = d->rank == 0 ? gt_checkpoint_verify_file(&r, err) : GT_OK;
        st = gt_train_share_status(d, 0, fs, err);
        t2 = gt_now_seconds();
    }
    if (st == GT_OK) {
        st = read_blocks(t, &r, err);
        if (st == GT_OK) st = gt_checkpoint_unchanged(&r, err);
        st = gt_train_agree(d, st, err);
    }
    seconds[0] = t1 - t0, seconds[1] = t2 - t1, seconds[2] = gt_now_seconds() - t2;
    if (st == GT_OK) {
        *info = r.info;
        memset(&r.info, 0, sizeof r.info);
    }
    gt_checkpoint_close(&r); /* also after a failed open: it left r closed */
    return st;
}

/* The loader position from the manifest: {"state": "gtloader1:..."}. */
static gt_status restore_loader(gt_trainer *t, const gt_checkpoint_info *info, int64_t want,
                                gt_error *err)
{
    char state[64] = {0};
    json_t *root = info->loader_json ? json_loads(info->loader_json, 0, NULL) : NULL;
    const char *sv = json_string_value(json_object_get(root, "state"));
    if (sv && strlen(sv) < sizeof state) strcpy(state, sv);
    json_decref(root);
    if (!state[0])
        return gt_error_set(err, GT_ERR_FORMAT, "checkpoint %s/step-%lld: no loader position",
                            t->ckpt_folder, (long long)want);
    gt_loader_state ls;
    GT_TRY(gt_loader_state_parse(state, &ls, err));
    return gt_loader_set_state(t->loader, &ls, err);
}

gt_status gt_trainer_pick_resume(gt_trainer *t, gt_error *err)
{
    gt_train_dist *d = &t->dist;
    /* rank 0 picks the checkpoint, so every rank loads the same one */
    int64_t want = GT_CHECKPOINT_NONE;
    gt_status st = d->rank == 0 ? find_resume_step(t, &want, err) : GT_OK;
    GT_TRY(gt_train_share_status(d, 0, st, err));
    GT_TRY(gt_train_share_i64(d, &want, err));
    t->resume_step = want;
    return GT_OK;
}

gt_status gt_trainer_resume(gt_trainer *t, int64_t *step, gt_error *err)
{
    *step = 0;
    gt_train_dist *d = &t->dist;
    gt_trainer_refresh_ckpt_tensors(t);
    int64_t want = t->resume_step;
    if (want == GT_CHECKPOINT_NONE) return GT_OK;
    gt_checkpoint_info info;
    memset(&info, 0, sizeof info);
    double t0 = gt_now_seconds(), parts[3] = {0};
    gt_status st = load_blocks(t, want, &info, parts, err);
    if (st == GT_OK) {
        st = restore_loader(t, &info, want, err);
        gt_checkpoint_info_free(&info);
    }
    GT_TRY(gt_train_agree(d, st, err));
    *step = want;
    if (d->rank == 0)
        gt_log(GT_LOG_INFO,
               "checkpoint: resumed from %s/step-%lld (%.2f s): the manifest and tensor hashes "
               "%.2f s, the file hash %.2f s, this rank's blocks%s %.2f s",
               t->ckpt_folder, (long long)want, gt_now_seconds() - t0, parts[0], parts[1],
               gt_trainer_state_on_device(t) ? " to the device" : "", parts[2]);
    return GT_OK;
}
