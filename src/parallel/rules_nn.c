/* rules_nn.c — sharding rules, part 2: matmul, rms_norm, rope, sdpa, softmax, embedding,
 * cross_entropy, their backwards, and adamw (notation and contract: rules.c,
 * parallel_internal.h). */
#include "parallel/rules_internal.h"

/* ---------------------------------------------------------------- matmul
 *
 * In terms of op(a) [..., M, K] and op(b) [..., K, N] (op = transpose of the last two dims when
 * the flag is set), with output [..., M, N]:
 *   a S(batch d), b R (b rank 2) or b S(batch d)  -> S(d)     each rank its batch block
 *   a S(M), b R                                   -> S(M)     row block of the output
 *   a R, b S(N)                                   -> S(N)     column block
 *   a S(K), b S(K)                                -> P        sum over K split n ways
 *   a P, b R  /  a R, b P                         -> P        linear in each operand
 * A batched b (rank > 2, same batch dims as a) must be split like a's batch: a S(batch) with b R
 * wants b S(batch) (a local slice), and the other way round. Anything else is a conflict: want the
 * weight operand R (FSDP: gather the parameter, keep the activation's shard) or, with no single
 * weight, b R, and try again; if that still does not fit, want both R. On the tp mesh dim it is the
 * other way round: the weight keeps the tensor-parallel plan's shard and the activation is
 * gathered (sequence parallel), or sliced along K to meet a row-wise weight. */
enum { MM_R, MM_P, MM_BATCH, MM_M, MM_K, MM_N };

/* The tensor dim of operand k that is the contracted K. */
static int mm_k_dim(const gt_shard_ctx *c, int k)
{
    int r = gt_rule_in_type(c, k)->ndim;
    bool t = c->n->attrs.i[k] != 0;
    return k == 0 ? (t ? r - 2 : r - 1) : (t ? r - 1 : r - 2);
}

static int mm_role(const gt_shard_ctx *c, int k, gt_placement p)
{
    if (gt_is_r(p)) return MM_R;
    if (gt_is_p(p)) return MM_P;
    if (p.dim < gt_rule_in_type(c, k)->ndim - 2) return MM_BATCH;
    if (p.dim == mm_k_dim(c, k)) return MM_K;
    return k == 0 ? MM_M : MM_N;
}

/* Whether (a, b) as placed computes locally; *out gets the output placement. */
static bool mm_fits(const gt_shard_ctx *c, gt_placement a, gt_placement b, gt_placement *out)
{
    int ra = mm_role(c, 0, a), rb = mm_role(c, 1, b);
    int ro = gt_rule_out_type(c, 0)->ndim;
    bool batched_b = gt_rule_in_type(c, 1)->ndim > 2;
    if (ra == MM_R && rb == MM_R) {
        *out = gt_place_replicate();
        return true;
    }
    if (ra == MM_BATCH && ((rb == MM_R && !batched_b) || (rb == MM_BATCH && b.dim == a.dim))) {
        *out = a;
        return true;
    }
    if (ra == MM_M && rb == MM_R) {
        *out = gt_shard_moved(a, ro - 2);
        return true;
    }
    if (ra == MM_R && rb == MM_N) {
        *out = gt_shard_moved(b, ro - 1);
        return true;
    }
    if ((ra == MM_K && rb == MM_K) || (ra == MM_P && rb == MM_R) || (ra == MM_R && rb == MM_P)) {
        *out = gt_place_partial();
        return true;
    }
    return false;
}

/* Tries (a, b), then the batched fix-up (the replicate side sliced like the other's batch). */
static bool mm_try(gt_shard_ctx *c, gt_placement a, gt_placement b)
{
    gt_placement out;
    if (gt_rule_in_type(c, 1)->ndim > 2) {
        if (mm_role(c, 0, a) == MM_BATCH && gt_is_r(b)) b = a;
        if (mm_role(c, 1, b) == MM_BATCH && gt_is_r(a)) a = b;
    }
    if (!mm_fits(c, a, b, &out)) return false;
    c->want[0] = a;
    c->want[1] = b;
    c->out[0] = out;
    return true;
}

gt_status gt_rule_matmul(gt_shard_ctx *c, gt_error *err)
{
    (void)err;
    if (gt_rule_all_replicate(c)) return GT_OK;
    gt_placement a = c->in[0], b = c->in[1];
    if (mm_try(c, a, b)) return GT_OK;
    bool wa = c->weight && c->weight[0], wb = c->weight && c->weight[1];
    if (wa != wb && c->mesh_dim == GT_MESH_TP) {
        /* tensor parallel: the weight keeps the plan's shard; gather the activation, and when
         * the weight is split along K, take the activation's matching K block (a local slice) */
        int act = wa ? 1 : 0, w = 1 - act;
        gt_placement in[2] = {a, b};
        in[act] = gt_place_replicate();
        if (mm_try(c, in[0], in[1])) return GT_OK;
        if (mm_role(c, w, in[w]) == MM_K) {
            in[act] = gt_shard_moved(in[w], mm_k_dim(c, act));
            if (mm_try(c, in[0], in[1])) return GT_OK;
        }
        return gt_rule_gather_all(c);
    }
    /* FSDP: gather the weight and keep the activation's shard; with no single weight, gather b */
    if (wa && !wb ? mm_try(c, gt_place_replicate(), b) : mm_try(c, a, gt_place_replicate()))
        return GT_OK;
    return gt_rule_gather_all(c);
}

/* ---------------------------------------------------------------- rms_norm */

/* rms_norm (x, w): the mean runs over the last dim, so x may be split along any other dim (w
 * replicate); x split along the last dim, or partial (not linear), gathers — or, with sequence
 * parallel, a partial [b, s, D] is reduce-scattered to S(1). */
gt_status gt_rule_rms_norm(gt_shard_ctx *c, gt_error *err)
{
    (void)err;
    if (gt_rule_all_replicate(c)) return GT_OK;
    gt_placement x = c->in[0];
    int last = gt_rule_in_type(c, 0)->ndim - 1;
    c->want[1] = gt_place_replicate();
    if (gt_is_p(x) && gt_rule_sequence_rows(c, false, 0)) x = c->want[0] = gt_place_shard(1, 0);
    if (gt_is_s(x) && x.dim != last) {
        c->out[0] = x;
        return GT_OK;
    }
    return gt_rule_gather_all(c);
}

/* rms_norm_backward (x, w, dy) -> (dx, dw): with x and dy split alike along a non-last dim each
 * rank computes its rows of dx and its rows' share of dw = sum over rows of dy * x_hat (P). The
 * rows are x's split, else dy's (a replicate x is sliced, a partial one reduce-scattered), else —
 * sequence parallel, x or dy partial — S(1): the forward reduce-scattered x the same way, so
 * converting it again is the engine's cached value. A partial dy is converted to the rows' split.
 * Anything else gathers. */
gt_status gt_rule_rms_norm_backward(gt_shard_ctx *c, gt_error *err)
{
    (void)err;
    if (gt_rule_all_replicate(c)) return GT_OK;
    gt_placement x = c->in[0], dy = c->in[2];
    int last = gt_rule_in_type(c, 0)->ndim - 1;
    gt_placement rows = gt_place_replicate();
    if (gt_is_s(x) && x.dim != last)
        rows = x;
    else if (!gt_is_s(x) && gt_is_s(dy) && dy.dim != last)
        rows = dy;
    else if ((gt_is_p(x) || gt_is_p(dy)) && !gt_is_s(x) && !gt_is_s(dy) &&
             gt_rule_sequence_rows(c, false, 0))
        rows = gt_place_shard(1, 0);
    if (!gt_is_s(rows)) return gt_rule_gather_all(c);
    c->want[0] = gt_is_s_at(x, rows.dim) ? x : rows;
    c->want[1] = gt_place_replicate();
    c->want[2] = gt_is_s_at(dy, rows.dim) ? dy : rows;
    c->out[0] = c->want[0];
    c->out[1] = gt_place_partial();
    return GT_OK;
}

/* ---------------------------------------------------------------- rope */

/* rope (x [b, s, h, d][, positions [b, s]]): without positions they are the global 0..s-1, so a
 * sequence split would rotate by the wrong angles; the head dim pairs j with j + d/2: split b or
 * h only. Positions given are data that travel with their tokens: they follow x's batch or
 * sequence split (then a sequence split is correct too) and are replicate otherwise. Linear in x:
 * P stays P. */
gt_status gt_rule_rope(gt_shard_ctx *c, gt_error *err)
{
    (void)err;
    gt_placement x = c->in[0];
    bool pos = c->n->n_in > 1;
    if (gt_is_s(x) && x.dim != 0 && x.dim != 2 && !(pos && x.dim == 1))
        return gt_rule_gather_all(c);
    if (pos) c->want[1] = gt_is_s(x) && x.dim < 2 ? gt_shard_moved(x, x.dim) : gt_place_replicate();
    c->out[0] = x;
    return GT_OK;
}

/* ---------------------------------------------------------------- sdpa */

/* The input slot of sdpa's document positions (sdpa: 3, sdpa_backward: 6), or -1 without. */
static int sdpa_positions_input(const gt_shard_ctx *c)
{
    int base = c->n->op == GT_OP_SDPA ? 3 : 6;
    return c->n->n_in > base ? base : -1;
}

/* Tensor dim of axis 0 (batch) or 1 (heads) in input k (output k when `output`) of an sdpa or
 * sdpa_backward node: batch is dim 0 everywhere; heads are dim 1 in layout 0 ([b, h, s, d]) and
 * dim 2 in layout 1 ([b, s, h, d]), except in lse ([b, h, s] in both layouts: sdpa's output 1,
 * sdpa_backward's input 4). */
static int sdpa_axis_dim(const gt_shard_ctx *c, bool output, int k, int axis)
{
    if (axis == 0) return 0;
    if (!output && k == sdpa_positions_input(c)) return -1; /* [b, s]: no heads */
    bool lse = c->n->op == GT_OP_SDPA ? output && k == 1 : !output && k == 4;
    return c->n->attrs.i[1] == 1 && !lse ? 2 : 1;
}

/* sdpa (q, k, v) -> (out, lse) and sdpa_backward (q, k, v, out, lse, dout) -> (dq, dk, dv), in
 * either layout (sdpa_axis_dim says where batch and heads are in each operand). Split all of them
 * along the batch, or along the heads when both hq and hkv divide (rank r then holds query heads
 * r*hq/n.. and kv heads r*hkv/n..: query head h still uses kv head h / (hq/hkv)). The driver is
 * the first input split that way; the others follow at their own dim of the same axis (R: a local
 * slice, P: a reduce_scatter). Anything else — a split sequence or head dim — gathers. Document
 * positions ([b, s], optional last input) follow a batch split and are replicate under a head
 * split. */
gt_status gt_rule_sdpa(gt_shard_ctx *c, gt_error *err)
{
    (void)err;
    if (gt_rule_all_replicate(c)) return GT_OK;
    bool heads_divide = gt_shard_divides(c, false, 0, sdpa_axis_dim(c, false, 0, 1)) &&
                        gt_shard_divides(c, false, 1, sdpa_axis_dim(c, false, 1, 1));
    int driver = -1, axis = -1;
    for (int k = 0; k < c->n->n_in && driver < 0; k++) {
        gt_placement p = c->in[k];
        if (!gt_is_s(p)) continue;
        if (p.dim == 0)
            axis = 0;
        else if (p.dim == sdpa_axis_dim(c, false, k, 1) && heads_divide)
            axis = 1;
        if (axis >= 0) driver = k;
    }
    if (driver < 0) return gt_rule_gather_all(c);
    gt_placement dp = c->in[driver];
    for (int k = 0; k < c->n->n_in; k++) {
        int dim = sdpa_axis_dim(c, false, k, axis);
        if (dim < 0) /* positions under a head split: every rank needs all of its rows */
            c->want[k] = gt_place_replicate();
        else if (!gt_is_s_at(c->in[k], dim))
            c->want[k] = gt_shard_moved(dp, dim);
    }
    for (int j = 0; j < c->n->n_out; j++)
        c->out[j] = gt_shard_moved(dp, sdpa_axis_dim(c, true, j, axis));
    return GT_OK;
}

/* ---------------------------------------------------------------- softmax */

/* softmax along dim k: rows along any other dim are independent. */
gt_status gt_rule_softmax(gt_shard_ctx *c, gt_error *err)
{
    (void)err;
    gt_placement x = c->in[0];
    if (gt_is_r(x)) return GT_OK;
    if (gt_is_s(x) && x.dim != c->n->attrs.i[0]) {
        c->out[0] = x;
        return GT_OK;
    }
    return gt_rule_gather_all(c);
}

/* softmax_backward (y, dy) along dim k: dx = y * (dy - sum_k y dy): y and dy split alike along
 * another dim; linear in dy, so y R with dy P gives P. */
gt_status gt_rule_softmax_backward(gt_shard_ctx *c, gt_error *err)
{
    (void)err;
    if (gt_rule_all_replicate(c)) return GT_OK;
    int k_dim = (int)c->n->attrs.i[0];
    gt_placement y = c->in[0], dy = c->in[1];
    if (gt_is_r(y) && gt_is_p(dy)) {
        c->out[0] = gt_place_partial();
        return GT_OK;
    }
    gt_placement drive = gt_place_replicate();
    if (gt_is_s(y) && y.dim != k_dim)
        drive = y;
    else if (gt_is_s(dy) && dy.dim != k_dim)
        drive = dy;
    if (!gt_is_s(drive)) return gt_rule_gather_all(c);
    if (!gt_is_s_at(y, drive.dim)) c->want[0] = drive;
    if (!gt_is_s_at(dy, drive.dim)) c->want[1] = drive;
    c->out[0] = drive;
    return GT_OK;
}

/* ---------------------------------------------------------------- embedding */

/* embedding (w [V, D], ids [...]) -> [..., D]:
 *   ids S(d), w R     -> S(d)          each rank looks up its tokens
 *   w S(1), ids S(d)  -> want ids R, S(last), settled to S(d): FSDP with column storage (layout.c)
 *                                      gathers the ids, not the table; each rank looks up its
 *                                      columns of every rank's tokens, and an all_to_all hands
 *                                      each rank its own tokens' rows
 *   w S(1), ids R     -> S(last)       each rank its columns of every row
 *   w S(0), ids R     -> P             vocabulary-parallel: each rank its rows, zeros elsewhere
 *                                      (embedding_shard, rules_vocab.c)
 *   w S(0), ids S     -> want w R      FSDP: gather the table, keep the batch split
 * Partial (never expected) or anything else gathers. */
gt_status gt_rule_embedding(gt_shard_ctx *c, gt_error *err)
{
    if (gt_rule_from_moe_sort(c->g, c->n->in[1])) return gt_rule_moe(c, err); /* MoE dispatch */
    if (gt_rule_all_replicate(c)) return GT_OK;
    gt_placement w = c->in[0], ids = c->in[1];
    if (gt_is_p(w) || gt_is_p(ids)) return gt_rule_gather_all(c);
    if (gt_is_s(ids) && !ids.padded && gt_is_s_at(w, 1) && !w.padded) {
        c->want[1] = gt_place_replicate();
        c->out[0] = gt_shard_moved(w, gt_rule_in_type(c, 1)->ndim);
        c->settle[0] = ids;
        return GT_OK;
    }
    if (gt_is_s(ids)) {
        c->want[0] = gt_place_replicate();
        c->out[0] = ids;
        return GT_OK;
    }
    if (gt_is_s_at(w, 1)) {
        c->out[0] = gt_shard_moved(w, gt_rule_in_type(c, 1)->ndim);
        return GT_OK;
    }
    if (gt_is_s_at(w, 0)) {
        c->vocab = true;
        c->out[0] = gt_place_partial();
        return GT_OK;
    }
    return gt_rule_gather_all(c);
}

/* embedding_backward (ids, dy [..., D]) -> dw [num_embeddings, D], a scatter-add over tokens:
 *   ids R, dw wanted S(0) (its parameter's) -> S(0) vocabulary-parallel: each rank adds the
 *                                         tokens of its rows only (embedding_shard_backward,
 *                                         rules_vocab.c); dy is gathered if it is split — a
 *                                         [tokens, D] gather instead of reducing [V, D]
 *   dw wanted S(1) (FSDP column storage)    -> S(1): ids gathered, dy to S(last) (an all_to_all
 *                                         from a token split): each rank adds every rank's
 *                                         tokens into its columns, no reduction of [V, D]
 *   ids and dy split alike along a token dim -> P (each rank adds its tokens; data parallel)
 *   ids R, dy S(last)                       -> S(1)
 *   ids R, dy P                             -> P (linear in dy)
 * A token split of ids slices a replicate dy. Anything else gathers. */
gt_status gt_rule_embedding_backward(gt_shard_ctx *c, gt_error *err)
{
    if (gt_rule_from_moe_sort(c->g, c->n->in[0])) return gt_rule_moe(c, err); /* MoE combine */
    gt_placement ids = c->in[0], dy = c->in[1];
    int last = gt_rule_in_type(c, 1)->ndim - 1;
    if (gt_is_p(ids)) return gt_rule_gather_all(c);
    if (gt_is_r(ids) && c->prefer && gt_is_s_at(c->prefer[0], 0) &&
        gt_shard_divides(c, true, 0, 0)) {
        c->want[1] = gt_place_replicate();
        c->vocab = true;
        c->out[0] = c->prefer[0];
        return GT_OK;
    }
    if (c->prefer && gt_is_s_at(c->prefer[0], 1) && !c->prefer[0].padded && !gt_is_p(dy) &&
        gt_shard_divides(c, true, 0, 1)) {
        c->want[0] = gt_place_replicate();
        c->want[1] = gt_shard_moved(c->prefer[0], last);
        c->out[0] = c->prefer[0];
        return GT_OK;
    }
    if (gt_is_r(ids) && gt_is_r(dy)) return GT_OK;
    gt_placement tok = gt_place_replicate();
    if (gt_is_s(ids))
        tok = ids;
    else if (gt_is_s(dy) && dy.dim != last)
        tok = dy;
    if (gt_is_s(tok)) {
        if (!gt_is_s_at(ids, tok.dim)) c->want[0] = tok;
        if (!gt_is_s_at(dy, tok.dim)) c->want[1] = tok;
        c->out[0] = gt_place_partial();
        return GT_OK;
    }
    if (gt_is_s_at(dy, last)) { /* ids R */
        c->out[0] = gt_shard_moved(dy, 1);
        return GT_OK;
    }
    if (gt_is_p(dy)) { /* ids R */
        c->out[0] = gt_place_partial();
        return GT_OK;
    }
    return gt_rule_gather_all(c);
}

/* Logits and targets split by rows (S(0)), or one of them split and the other replicate (then
 * sliced alike): sets want[0..1] and returns true. */
static bool rows_split(gt_shard_ctx *c)
{
    gt_placement l = c->in[0], t = c->in[1];
    bool l_rows = gt_is_s_at(l, 0), t_rows = gt_is_s_at(t, 0);
    if (!(l_rows || t_rows) || !(l_rows || gt_is_r(l)) || !(t_rows || gt_is_r(t))) return false;
    gt_placement rows = l_rows ? l : t;
    if (!l_rows) c->want[0] = rows;
    if (!t_rows) c->want[1] = rows;
    return true;
}

/* cross_entropy (logits [N, V], targets [N]) -> [] (the mean over non-ignored rows):
 *   logits S(0), targets S(0) -> P with out_scale 1/n: data parallel, the mean of the n local
 *       means. That is the global mean only when every rank has the same number of non-ignored
 *       rows; with ignore_index rows spread unevenly it is a mean of means (as torchtitan's data
 *       parallelism, which averages per-rank losses and gradients).
 *   logits S(1), targets R    -> P vocabulary-parallel (rules_vocab.c: a global log-sum-exp
 *       from the per-rank ones, each rank adds the rows whose target it holds).
 * A row split on one side only slices the other. Anything else gathers. */
gt_status gt_rule_cross_entropy(gt_shard_ctx *c, gt_error *err)
{
    (void)err;
    if (gt_rule_all_replicate(c)) return GT_OK;
    if (rows_split(c)) {
        c->out[0] = gt_place_partial();
        c->out_scale = 1.0 / c->group_size;
        return GT_OK;
    }
    if (gt_is_s_at(c->in[0], 1) && gt_is_r(c->in[1])) {
        c->vocab = true;
        c->out[0] = gt_place_partial();
        return GT_OK;
    }
    return gt_rule_gather_all(c);
}

/* cross_entropy_backward (logits, targets, dloss []) -> dlogits [N, V]:
 *   logits S(0), targets S(0), dloss R -> S(0), dloss scaled by 1/n first: each rank's local
 *       backward divides by its own count, N/n rows' worth (the forward's mean of means).
 *   logits S(1), targets R, dloss R    -> S(1) vocabulary-parallel (rules_vocab.c).
 * A partial dloss gathers (it is a scalar: cheap); a row split on one side slices the other. */
gt_status gt_rule_cross_entropy_backward(gt_shard_ctx *c, gt_error *err)
{
    (void)err;
    if (gt_rule_all_replicate(c)) return GT_OK;
    c->want[2] = gt_place_replicate();
    if (rows_split(c)) {
        c->in_scale[2] = 1.0 / c->group_size;
        c->out[0] = c->want[0];
        return GT_OK;
    }
    if (gt_is_s_at(c->in[0], 1) && gt_is_r(c->in[1])) {
        c->vocab = true;
        c->out[0] = c->in[0];
        return GT_OK;
    }
    return gt_rule_gather_all(c);
}

/* ---------------------------------------------------------------- adamw */

/* adamw (p, g, m, v, scalars, clip) -> (p', m', v'): every element is updated from the same
 * element of p, g, m, v, so g, m, v follow p's placement (a partial g is reduce-scattered
 * there), the scalars are replicate, and the outputs have p's placement. */
gt_status gt_rule_adamw(gt_shard_ctx *c, gt_error *err)
{
    (void)err;
    if (gt_rule_all_replicate(c)) return GT_OK;
    gt_placement p = c->in[0];
    if (gt_is_p(p)) return gt_rule_gather_all(c);
    for (int k = 1; k <= 3; k++)
        c->want[k] = p;
    c->want[4] = c->want[5] = gt_place_replicate();
    for (int j = 0; j < 3; j++)
        c->out[j] = p;
    return GT_OK;
}
