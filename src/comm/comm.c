/* comm.c — the communicator interface: shape/dtype checks, request lifetime, blocking wrappers,
 * the ordered sum every implementation uses, and the collective schedule check. */
#include "graphtrain/gt_comm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *gt_coll_kind_name(gt_coll_kind kind)
{
    switch (kind) {
    case GT_COLL_ALL_REDUCE:
        return "all_reduce";
    case GT_COLL_ALL_GATHER:
        return "all_gather";
    case GT_COLL_REDUCE_SCATTER:
        return "reduce_scatter";
    case GT_COLL_BROADCAST:
        return "broadcast";
    case GT_COLL_ALL_TO_ALL:
        return "all_to_all";
    case GT_COLL_GATHER:
        return "gather";
    case GT_COLL_SEND:
        return "send";
    case GT_COLL_RECV:
        return "recv";
    default:
        return "unknown_collective";
    }
}

int gt_comm_rank(const gt_comm *c)
{
    return c->rank;
}
int gt_comm_size(const gt_comm *c)
{
    return c->size;
}

gt_status gt_comm_split(gt_comm *c, int color, int key, gt_comm **out, gt_error *err)
{
    *out = NULL;
    if (color < 0)
        return gt_error_set(err, GT_ERR_INVALID,
                            "rank %d: split of communicator '%s': color %d < 0", c->rank, c->name,
                            color);
    return c->vt->split(c, color, key, out, err);
}

void gt_comm_destroy(gt_comm *c)
{
    if (c) c->vt->destroy(c);
}

void gt_comm_set_timeout(gt_comm *c, double seconds)
{
    if (c && c->vt->set_timeout) c->vt->set_timeout(c, seconds);
}

/* ---------------------------------------------------------------- ordered sum */

gt_status gt_comm_one_rank(const gt_tensor *in, gt_tensor *out, gt_error *err)
{
    if (in->dtype != out->dtype) {
        const void *src[1] = {in->data};
        return gt_comm_sum_ordered(in->dtype, out->dtype, gt_tensor_numel(out), src, 1, out->data,
                                   err);
    }
    size_t nbytes = gt_tensor_nbytes(in);
    GT_CHECK(nbytes == gt_tensor_nbytes(out));
    if (nbytes && in->data != out->data) memmove(out->data, in->data, nbytes);
    return GT_OK;
}

/* dst = src[0] + src[1] + … + src[n-1], element by element, left to right. The order is the rank
 * order, so the result is the same on every rank and equals a single-rank loop over the ranks.
 * bf16/f16 blocks are widened (exactly) and summed in f32 either way, so writing the f32 sum
 * (out_dt f32) instead of rounding it to the input dtype gives bitwise the sum of the widened
 * blocks: the widening reduce-scatter. */
gt_status gt_comm_sum_check_dtypes(gt_dtype dt, gt_dtype out_dt, bool *widen, gt_error *err)
{
    *widen = gt_dtype_widens_to_f32(dt, out_dt);
    if (out_dt == dt || *widen) return GT_OK;
    return gt_error_set(err, GT_ERR_UNSUPPORTED, "sum of %s blocks into %s is not supported",
                        gt_dtype_name(dt), gt_dtype_name(out_dt));
}

gt_status gt_comm_sum_ordered(gt_dtype dt, gt_dtype out_dt, int64_t numel, const void *const *src,
                              int n_src, void *dst, gt_error *err)
{
    bool widen;
    GT_TRY(gt_comm_sum_check_dtypes(dt, out_dt, &widen, err));
    switch (dt) {
    case GT_F32:
        for (int64_t i = 0; i < numel; i++) {
            float acc = ((const float *)src[0])[i];
            for (int r = 1; r < n_src; r++)
                acc += ((const float *)src[r])[i];
            ((float *)dst)[i] = acc;
        }
        return GT_OK;
    case GT_BF16:
    case GT_F16: {
        /* Storage types: accumulate in f32, round once at the end (or keep the f32 sum). */
        float (*to_f32)(uint16_t) = dt == GT_BF16 ? gt_bf16_to_f32 : gt_f16_to_f32;
        uint16_t (*from_f32)(float) = dt == GT_BF16 ? gt_f32_to_bf16 : gt_f32_to_f16;
        for (int64_t i = 0; i < numel; i++) {
            float acc = to_f32(((const uint16_t *)src[0])[i]);
            for (int r = 1; r < n_src; r++)
                acc += to_f32(((const uint16_t *)src[r])[i]);
            if (widen)
                ((float *)dst)[i] = acc;
            else
                ((uint16_t *)dst)[i] = from_f32(acc);
        }
        return GT_OK;
    }
    case GT_I32:
        /* Wrapping (two's complement) sums through unsigned arithmetic: no UB on overflow. */
        for (int64_t i = 0; i < numel; i++) {
            uint32_t acc = (uint32_t)((const int32_t *)src[0])[i];
            for (int r = 1; r < n_src; r++)
                acc += (uint32_t)((const int32_t *)src[r])[i];
            ((int32_t *)dst)[i] = (int32_t)acc;
        }
        return GT_OK;
    case GT_I64:
        for (int64_t i = 0; i < numel; i++) {
            uint64_t acc = (uint64_t)((const int64_t *)src[0])[i];
            for (int r = 1; r < n_src; r++)
                acc += (uint64_t)((const int64_t *)src[r])[i];
            ((int64_t *)dst)[i] = (int64_t)acc;
        }
        return GT_OK;
    default:
        return gt_error_set(err, GT_ERR_UNSUPPORTED, "sum of dtype %s is not supported",
                            gt_dtype_name(dt));
    }
}

/* ---------------------------------------------------------------- checks */

static gt_status coll_error(gt_comm *c, gt_coll_kind kind, gt_error *err, gt_status code,
                            const char *what)
{
    return gt_error_set(err, code, "rank %d: %s on communicator '%s' (size %d): %s", c->rank,
                        gt_coll_kind_name(kind), c->name, c->size, what);
}

static bool same_tail(const gt_tensor *a, const gt_tensor *b)
{
    for (int d = 1; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d]) return false;
    return true;
}

static gt_status check_shapes(gt_comm *c, gt_coll_kind kind, const gt_tensor *in,
                              const gt_tensor *out, int root, gt_error *err)
{
    char ti[96], to[96], what[320];
    gt_tensor_format_type(in, ti, sizeof ti);
    gt_tensor_format_type(out, to, sizeof to);
    bool out_unused = kind == GT_COLL_GATHER && c->rank != root; /* a gather's senders */
    if (!in->data || (!out->data && !out_unused))
        return coll_error(c, kind, err, GT_ERR_INVALID, "input or output has no storage");
    /* The one dtype change: reduce_scatter of bf16/f16 into f32 (the f32 rank-order sum the
     * 16-bit scatter computes anyway, kept unrounded; blocks travel in the input dtype). */
    bool widen = kind == GT_COLL_REDUCE_SCATTER && gt_dtype_widens_to_f32(in->dtype, out->dtype);
    if (in->dtype != out->dtype && !widen) {
        snprintf(what, sizeof what,
                 "input %s and output %s differ in dtype (expected the same dtype%s)", ti, to,
                 kind == GT_COLL_REDUCE_SCATTER ? ", or a bf16/f16 input with an f32 output" : "");
        return coll_error(c, kind, err, GT_ERR_SHAPE, what);
    }
    bool reduces = kind == GT_COLL_ALL_REDUCE || kind == GT_COLL_REDUCE_SCATTER;
    if (reduces && (in->dtype == GT_BOOL || in->dtype >= GT_DTYPE_COUNT)) {
        snprintf(what, sizeof what, "cannot sum dtype %s", gt_dtype_name(in->dtype));
        return coll_error(c, kind, err, GT_ERR_UNSUPPORTED, what);
    }
    int64_t n = c->size;
    bool ok = true;
    const char *expect = "";
    switch (kind) {
    case GT_COLL_ALL_REDUCE:
    case GT_COLL_BROADCAST:
        ok = in->ndim == out->ndim && same_tail(in, out) &&
             (in->ndim == 0 || in->shape[0] == out->shape[0]);
        expect = "the same shape";
        break;
    case GT_COLL_ALL_GATHER:
    case GT_COLL_GATHER:
        ok = in->ndim >= 1 && in->ndim == out->ndim && same_tail(in, out) &&
             out->shape[0] == n * in->shape[0];
        expect = "output dim 0 = size * input dim 0, other dims equal";
        break;
    case GT_COLL_REDUCE_SCATTER:
        ok = in->ndim >= 1 && in->ndim == out->ndim && same_tail(in, out) &&
             in->shape[0] == n * out->shape[0];
        expect = "input dim 0 = size * output dim 0, other dims equal";
        break;
    case GT_COLL_ALL_TO_ALL:
        ok = in->ndim >= 1 && in->ndim == out->ndim && same_tail(in, out) &&
             in->shape[0] == out->shape[0] && in->shape[0] % n == 0;
        expect = "equal shapes with dim 0 divisible by size";
        break;
    default:
        return coll_error(c, kind, err, GT_ERR_INVALID, "unknown collective kind");
    }
    if (!ok) {
        snprintf(what, sizeof what, "input %s, output %s: expected %s", ti, to, expect);
        return coll_error(c, kind, err, GT_ERR_SHAPE, what);
    }
    return GT_OK;
}

/* ---------------------------------------------------------------- start / wait */

static gt_status start(gt_comm *c, gt_coll_kind kind, const gt_tensor *in, gt_tensor *out, int root,
                       gt_comm_request **req_out, gt_error *err)
{
    *req_out = NULL;
    GT_TRY(check_shapes(c, kind, in, out, root, err));
    if ((kind == GT_COLL_BROADCAST || kind == GT_COLL_GATHER) && (root < 0 || root >= c->size)) {
        char what[96];
        snprintf(what, sizeof what, "root %d outside [0, %d)", root, c->size);
        return coll_error(c, kind, err, GT_ERR_INVALID, what);
    }
    gt_comm_request *req = gt_xcalloc(1, sizeof *req);
    req->comm = c;
    req->kind = kind;
    req->in = in;
    req->out = out;
    req->root = root;
    gt_status st = c->vt->start(c, kind, in, out, root, req, err);
    if (st != GT_OK) {
        if (c->vt->free_request) c->vt->free_request(req);
        free(req);
        return st;
    }
    *req_out = req;
    return GT_OK;
}

gt_status gt_comm_wait(gt_comm_request *req, gt_error *err)
{
    if (!req) return gt_error_set(err, GT_ERR_INVALID, "gt_comm_wait: no request");
    gt_comm *c = req->comm;
    gt_status st = c->vt->wait(c, req, err);
    if (c->vt->free_request) c->vt->free_request(req);
    free(req);
    return st;
}

/* Point-to-point checks: a peer that is another rank of c, a tag in range, an implementation. */
static gt_status p2p_check(gt_comm *c, const char *what, int peer, int tag, bool have,
                           gt_error *err)
{
    if (!c) return gt_error_set(err, GT_ERR_INVALID, "%s: no communicator", what);
    if (!have)
        return gt_error_set(err, GT_ERR_UNSUPPORTED,
                            "rank %d: %s on communicator '%s': the %s communicator has no "
                            "point-to-point transfers yet",
                            c->rank, what, c->name, c->vt->name);
    if (peer < 0 || peer >= c->size || peer == c->rank || tag < 0 || tag >= 32768)
        return gt_error_set(err, GT_ERR_INVALID,
                            "rank %d: %s on communicator '%s' (size %d): peer %d / tag %d: "
                            "expected another rank and a tag in [0, 32768)",
                            c->rank, what, c->name, c->size, peer, tag);
    return GT_OK;
}

gt_status gt_comm_send_start(gt_comm *c, const gt_tensor *t, int peer, int tag, gt_error *err)
{
    GT_TRY(p2p_check(c, "send", peer, tag, c && c->vt->send_start, err));
    return c->vt->send_start(c, t->data, gt_tensor_nbytes(t), peer, tag, err);
}

gt_status gt_comm_recv(gt_comm *c, gt_tensor *t, int peer, int tag, gt_error *err)
{
    GT_TRY(p2p_check(c, "recv", peer, tag, c && c->vt->recv, err));
    return c->vt->recv(c, t->data, gt_tensor_nbytes(t), peer, tag, err);
}

gt_status gt_comm_send_wait_all(gt_comm *c, gt_error *err)
{
    if (!c || !c->vt->send_wait_all) return GT_OK; /* no sends could have started */
    return c->vt->send_wait_all(c, err);
}

gt_status gt_comm_all_reduce_start(gt_comm *c, const gt_tensor *in, gt_tensor *out,
                                   gt_comm_request **req, gt_error *err)
{
    return start(c, GT_COLL_ALL_REDUCE, in, out, 0, req, err);
}
gt_status gt_comm_all_gather_start(gt_comm *c, const gt_tensor *in, gt_tensor *out,
                                   gt_comm_request **req, gt_error *err)
{
    return start(c, GT_COLL_ALL_GATHER, in, out, 0, req, err);
}
gt_status gt_comm_reduce_scatter_start(gt_comm *c, const gt_tensor *in, gt_tensor *out,
                                       gt_comm_request **req, gt_error *err)
{
    return start(c, GT_COLL_REDUCE_SCATTER, in, out, 0, req, err);
}
gt_status gt_comm_broadcast_start(gt_comm *c, gt_tensor *buf, int root, gt_comm_request **req,
                                  gt_error *err)
{
    return start(c, GT_COLL_BROADCAST, buf, buf, root, req, err);
}
gt_status gt_comm_all_to_all_start(gt_comm *c, const gt_tensor *in, gt_tensor *out,
                                   gt_comm_request **req, gt_error *err)
{
    return start(c, GT_COLL_ALL_TO_ALL, in, out, 0, req, err);
}
gt_status gt_comm_gather_start(gt_comm *c, const gt_tensor *in, gt_tensor *out, int root,
                               gt_comm_request **req, gt_error *err)
{
    return start(c, GT_COLL_GATHER, in, out, root, req, err);
}

static gt_status run(gt_comm *c, gt_coll_kind kind, const gt_tensor *in, gt_tensor *out, int root,
                     gt_error *err)
{
    gt_comm_request *req;
    GT_TRY(start(c, kind, in, out, root, &req, err));
    return gt_comm_wait(req, err);
}

gt_status gt_comm_all_reduce(gt_comm *c, const gt_tensor *in, gt_tensor *out, gt_error *err)
{
    return run(c, GT_COLL_ALL_REDUCE, in, out, 0, err);
}
gt_status gt_comm_all_gather(gt_comm *c, const gt_tensor *in, gt_tensor *out, gt_error *err)
{
    return run(c, GT_COLL_ALL_GATHER, in, out, 0, err);
}
gt_status gt_comm_reduce_scatter(gt_comm *c, const gt_tensor *in, gt_tensor *out, gt_error *err)
{
    return run(c, GT_COLL_REDUCE_SCATTER, in, out, 0, err);
}
gt_status gt_comm_broadcast(gt_comm *c, gt_tensor *buf, int root, gt_error *err)
{
    return run(c, GT_COLL_BROADCAST, buf, buf, root, err);
}
gt_status gt_comm_all_to_all(gt_comm *c, const gt_tensor *in, gt_tensor *out, gt_error *err)
{
    return run(c, GT_COLL_ALL_TO_ALL, in, out, 0, err);
}
gt_status gt_comm_gather(gt_comm *c, const gt_tensor *in, gt_tensor *out, int root, gt_error *err)
{
    return run(c, GT_COLL_GATHER, in, out, root, err);
}

/* ---------------------------------------------------------------- schedule check */

uint64_t gt_comm_sched_entry_hash(const gt_comm_sched_entry *e, int64_t index)
{
    uint64_t words[5] = {(uint64_t)e->kind, e->group, e->bytes, e->place, (uint64_t)index};
    return gt_hash64(words, sizeof words, 0x67745f7363686564ull); /* "gt_sched" */
}

/* Two rounds of all_gather_u64, the same on every rank whatever the schedules are:
 *   1. (count, hash of the whole schedule) from every rank;
 *   2. if any differ: the per-entry hashes of the first m = min(count) entries.
 * The first index where some rank's entry hash differs from rank 0's is reported; when the
 * common prefix agrees, the first differing index is m (some rank has more collectives). */
gt_status gt_comm_check_schedule(gt_comm *c, const gt_comm_sched_entry *entries, int64_t count,
                                 gt_error *err)
{
    int n = c->size;
    uint64_t *hashes = gt_xmalloc((size_t)(count > 0 ? count : 1) * sizeof *hashes);
    uint64_t total = 0x9e3779b97f4a7c15ull;
    for (int64_t i = 0; i < count; i++) {
        hashes[i] = gt_comm_sched_entry_hash(&entries[i], i);
        uint64_t pair[2] = {total, hashes[i]};
        total = gt_hash64(pair, sizeof pair, 0);
    }
    uint64_t mine[2] = {(uint64_t)count, total};
    uint64_t *all = gt_xmalloc((size_t)n * 2 * sizeof *all);
    gt_status st = c->vt->all_gather_u64(c, mine, 2, all, err);
    if (st != GT_OK) goto done;
    bool same = true;
    int64_t m = count;
    for (int r = 0; r < n; r++) {
        if (all[2 * r] != all[0] || all[2 * r + 1] != all[1]) same = false;
        if ((int64_t)all[2 * r] < m) m = (int64_t)all[2 * r];
    }
    if (same) goto done;

    uint64_t *prefix = gt_xmalloc((size_t)n * (size_t)(m > 0 ? m : 1) * sizeof *prefix);
    st = c->vt->all_gather_u64(c, hashes, m, prefix, err);
    if (st != GT_OK) {
        free(prefix);
        goto done;
    }
    int64_t first = m;
    for (int64_t i = 0; i < m && first == m; i++)
        for (int r = 1; r < n; r++)
            if (prefix[(size_t)r * (size_t)m + (size_t)i] != prefix[i]) {
                first = i;
                break;
            }
    free(prefix);

    /* Ranks whose whole schedule differs from rank 0's (count or hash). */
    char ranks[256] = "";
    size_t len = 0;
    for (int r = 1; r < n && len + 16 < sizeof ranks; r++)
        if (all[2 * r] != all[0] || all[2 * r + 1] != all[1])
            len += (size_t)snprintf(ranks + len, sizeof ranks - len, "%s%d", len ? "," : "", r);
    char local[200];
    if (first < count)
        snprintf(local, sizeof local, "%s group %016llx %llu bytes%s",
                 gt_coll_kind_name(entries[first].kind), (unsigned long long)entries[first].group,
                 (unsigned long long)entries[first].bytes,
                 entries[first].place ? " at a place in the arenas that every rank must share"
                                      : "");
    else
        snprintf(local, sizeof local, "no collective (schedule has %lld)", (long long)count);
    st = gt_error_set(err, GT_ERR_INVALID,
                      "rank %d: collective schedule mismatch on communicator '%s': first differing "
                      "collective is #%lld (this rank: %s); ranks differing from rank 0: %s",
                      c->rank, c->name, (long long)first, local, ranks[0] ? ranks : "none");
done:
    free(all);
    free(hashes);
    return st;
}

void gt_comm_format_members(const int *world, int size, char *buf, size_t cap)
{
    size_t used = (size_t)snprintf(buf, cap, "world rank%s ", size > 1 ? "s" : "");
    for (int r = 0; r < size && used < cap; r++) {
        int k = snprintf(buf + used, cap - used, r ? ",%d" : "%d", world[r]);
        if (k < 0 || (size_t)k >= cap - used) {
            snprintf(buf + (cap > 4 ? cap - 4 : 0), cap > 4 ? 4 : cap, "...");
            break;
        }
        used += (size_t)k;
    }
}

void gt_comm_chunk(int64_t numel, int n, int j, int64_t *start, int64_t *count)
{
    int64_t base = numel / n, extra = numel % n;
    *count = base + (j < extra ? 1 : 0);
    *start = (int64_t)j * base + (j < extra ? j : extra);
}
