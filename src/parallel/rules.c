/* rules.c — the sharding rule of every op (parallel_internal.h states the contract), part 1: the
 * dispatch table, elementwise ops, reductions and the layout ops. The neural-network ops are in
 * rules_nn.c.
 *
 * Notation (one mesh dim of size n at a time): R = replicate, S(d) = tensor dim d split in n
 * contiguous blocks, P = partial (the value is the sum over the n ranks). Every rule starts from
 * "all inputs R -> outputs R", keeps a shard's nesting order when it passes through (the input
 * placement is copied, only .dim changes), never wants S(d) of a dim that does not divide, and
 * lets P through only ops that are linear in that input. When nothing fits it wants R: gathering
 * is always correct, just not free. */
#include "parallel/rules_internal.h"

/* ---------------------------------------------------------------- shared helpers */

bool gt_shard_divides(const gt_shard_ctx *c, bool output, int k, int dim)
{
    const gt_type *t = output ? gt_rule_out_type(c, k) : gt_rule_in_type(c, k);
    if (dim < 0 || dim >= t->ndim) return false;
    int64_t v;
    if (gt_sym_is_const(c->g->sym, t->dims[dim], &v)) return v >= 0 && v % c->group_size == 0;
    return true; /* batch, seq: checked when bound */
}

bool gt_rule_all_replicate(const gt_shard_ctx *c)
{
    for (int k = 0; k < c->n->n_in; k++)
        if (!gt_is_r(c->in[k])) return false;
    return true;
}

gt_status gt_rule_gather_all(gt_shard_ctx *c)
{
    for (int k = 0; k < c->n->n_in; k++)
        c->want[k] = gt_place_replicate();
    for (int j = 0; j < c->n->n_out; j++)
        c->out[j] = gt_place_replicate();
    return GT_OK;
}

bool gt_rule_is_one(const gt_shard_ctx *c, gt_expr e)
{
    int64_t v;
    return gt_sym_is_const(c->g->sym, e, &v) && v == 1;
}

/* The "none" rule of gt_ops.def: an op without a rule of its own wants every input replicate,
 * which is always correct, if not free. full (no inputs) is a replicated constant; the parallel
 * ops (collectives, wait, the *_shard ops, logsumexp) and the fused ops only appear in graphs
 * that parallelize or a later pass emitted, never in the global graph the rules see. */
static gt_status gt_rule_none(gt_shard_ctx *c, gt_error *err)
{
    (void)err;
    return gt_rule_gather_all(c);
}

/* ---------------------------------------------------------------- elementwise
 *
 * n-ary with numpy broadcasting: input k's dim d is output dim d + (rank_out - rank_k). The
 * driver is the first input that is S(d); the output is S(its output dim), and every other input
 * must be S on that same output dim when it has the dim with size > 1, or R when the dim is
 * broadcast or absent (then each rank reads the whole of it).
 *
 * Partial is kept where the op is linear in the partial inputs: add/sub of all-partial inputs
 * (sum_r a_r + sum_r b_r = sum_r (a_r + b_r)), neg and scale of a partial, mul by a replicate,
 * div of a partial by a replicate, and a widening cast (bf16/f16 -> f32 is exact on each summand,
 * so FSDP reduce-scatters gradients in f32). Anything else (exp, add_scalar, a narrowing cast —
 * it would round each summand —, a partial mixed with a replicate in add) converts the partial
 * inputs: to the driver's shard (a reduce_scatter) when there is one, else to R — or, with
 * sequence parallel, a partial [b, s, D] activation to S(1) (a reduce_scatter along the sequence).
 * A sum of partials stays partial even then: the residual add of two partials costs nothing, and
 * the next norm reduce-scatters the sum once (in the backward, the gradient contributions of
 * wq/wk/wv or w1/w3 add up before a single reduce_scatter). */
static bool elementwise_keeps_partial(const gt_shard_ctx *c, int n_partial, int n_shard)
{
    const gt_placement *in = c->in;
    switch (c->n->op) {
    case GT_OP_ADD:
    case GT_OP_SUB:
        return n_partial == c->n->n_in;
    case GT_OP_NEG:
    case GT_OP_SCALE:
        return true;
    case GT_OP_MUL:
        return n_partial == 1 && n_shard == 0;
    case GT_OP_DIV:
        return gt_is_p(in[0]) && gt_is_r(in[1]);
    case GT_OP_CAST: {
        gt_dtype from = gt_rule_in_type(c, 0)->dtype, to = gt_rule_out_type(c, 0)->dtype;
        return from == to || (to == GT_F32 && (from == GT_BF16 || from == GT_F16));
    }
    default:
        return false;
    }
}

bool gt_rule_sequence_rows(const gt_shard_ctx *c, bool output, int k)
{
    const gt_type *t = output ? gt_rule_out_type(c, k) : gt_rule_in_type(c, k);
    return c->sequence_parallel && t->ndim == 3 && gt_shard_divides(c, output, k, 1);
}

static gt_status gt_rule_elementwise(gt_shard_ctx *c, gt_error *err)
{
    (void)err;
    if (gt_rule_all_replicate(c)) return GT_OK;
    const gt_node *n = c->n;
    int ro = gt_rule_out_type(c, 0)->ndim;
    int n_partial = 0, n_shard = 0, driver = -1;
    for (int k = 0; k < n->n_in; k++) {
        if (gt_is_p(c->in[k])) n_partial++;
        if (gt_is_s(c->in[k])) {
            n_shard++;
            if (driver < 0) driver = k;
        }
    }
    gt_placement dp = driver >= 0 ? c->in[driver] : gt_place_replicate();
    int od = driver >= 0 ? dp.dim + ro - gt_rule_in_type(c, driver)->ndim : -1;
    if (n_partial > 0) {
        if (elementwise_keeps_partial(c, n_partial, n_shard)) {
            c->out[0] = gt_place_partial();
            return GT_OK;
        }
        /* R for now; the shard pass below turns them into the driver's shard where it applies */
        for (int k = 0; k < n->n_in; k++)
            if (gt_is_p(c->in[k])) c->want[k] = gt_place_replicate();
        if (driver < 0 && gt_rule_sequence_rows(c, true, 0)) {
            dp = gt_place_shard(1, 0);
            od = 1;
        }
    }
    if (!gt_is_s(dp)) return GT_OK; /* everything is (or becomes) R: out R */
    for (int k = 0; k < n->n_in; k++) {
        if (k == driver) continue;
        const gt_type *t = gt_rule_in_type(c, k);
        int dk = od - (ro - t->ndim);
        bool has = dk >= 0 && !gt_rule_is_one(c, t->dims[dk]);
        if (has) {
            if (!gt_is_s_at(c->want[k], dk)) c->want[k] = gt_shard_moved(dp, dk);
        } else {
            c->want[k] = gt_place_replicate();
        }
    }
    c->out[0] = gt_shard_moved(dp, od);
    return GT_OK;
}

/* ---------------------------------------------------------------- reductions */

/* Which dims of the input the node reduces and where each kept dim lands in the output. */
static void reduced_dims(const gt_shard_ctx *c, bool *red, int *outpos)
{
    const gt_node *n = c->n;
    const gt_type *x = gt_rule_in_type(c, 0);
    for (int d = 0; d < x->ndim; d++)
        red[d] = false;
    if (n->op == GT_OP_SUM_TO) {
        /* leading dims and dims where the target is 1 (and x is not) are summed away */
        const gt_type *o = gt_rule_out_type(c, 0);
        int off = x->ndim - o->ndim;
        for (int d = 0; d < x->ndim; d++) {
            red[d] =
                d < off || (gt_rule_is_one(c, o->dims[d - off]) && !gt_rule_is_one(c, x->dims[d]));
            outpos[d] = d - off;
        }
        return;
    }
    bool keepdim = n->attrs.i[0] != 0;
    for (int k = 1; k < n->attrs.ni; k++)
        if (n->attrs.i[k] >= 0 && n->attrs.i[k] < x->ndim) red[n->attrs.i[k]] = true;
    int removed = 0;
    for (int d = 0; d < x->ndim; d++) {
        outpos[d] = keepdim ? d : d - removed;
        if (red[d]) removed++;
    }
}

/* sum / mean / sum_squares / sum_to / max over dims D. S(d), d in D: each rank reduces its
 * block, so sum and sum_squares give P and mean gives P with out_scale 1/n (the global mean over
 * a dim split n ways is the average of the n local means, all blocks being equal); max would need
 * a max-reduction: want R. S(d), d not in D: S at d's output position. P: sum and mean are
 * linear; max and sum_squares are not. */
static gt_status gt_rule_reduce(gt_shard_ctx *c, gt_error *err)
{
    (void)err;
    gt_placement x = c->in[0];
    bool is_max = c->n->op == GT_OP_MAX;
    if (gt_is_r(x)) return GT_OK;
    if (gt_is_p(x)) {
        /* max and sum of squares are not linear: the summands must be added first */
        if (is_max || c->n->op == GT_OP_SUM_SQUARES) return gt_rule_gather_all(c);
        c->out[0] = x;
        return GT_OK;
    }
    bool red[GT_MAX_DIMS];
    int outpos[GT_MAX_DIMS];
    reduced_dims(c, red, outpos);
    if (!red[x.dim]) {
        c->out[0] = gt_shard_moved(x, outpos[x.dim]);
        return GT_OK;
    }
    if (is_max) return gt_rule_gather_all(c);
    c->out[0] = gt_place_partial();
    if (c->n->op == GT_OP_MEAN) c->out_scale = 1.0 / c->group_size;
    return GT_OK;
}

/* max_backward (x, y, dy) -> dx like x: dy is routed to the first maximum of each group, so with
 * the groups whole on every rank (x split along a kept dim, y and dy split the same way) each
 * rank routes its own block. Linear in dy: x, y R and dy P gives P. Otherwise gather. */
static gt_status gt_rule_max_backward(gt_shard_ctx *c, gt_error *err)
{
    (void)err;
    if (gt_rule_all_replicate(c)) return GT_OK;
    const gt_placement *in = c->in;
    if (gt_is_r(in[0]) && gt_is_r(in[1]) && gt_is_p(in[2])) {
        c->out[0] = gt_place_partial();
        return GT_OK;
    }
    bool red[GT_MAX_DIMS];
    int outpos[GT_MAX_DIMS];
    reduced_dims(c, red, outpos);
    int xr = gt_rule_in_type(c, 0)->ndim;
    /* the shard to compute on, in x's dims: x's own, else one of y/dy's mapped back */
    gt_placement drive = gt_place_replicate();
    if (gt_is_s(in[0]) && !red[in[0].dim]) drive = in[0];
    for (int k = 1; k <= 2 && !gt_is_s(drive); k++) {
        if (!gt_is_s(in[k]) || !gt_is_r(in[0])) continue;
        for (int d = 0; d < xr; d++)
            if (!red[d] && outpos[d] == in[k].dim) drive = gt_shard_moved(in[k], d);
    }
    if (!gt_is_s(drive)) return gt_rule_gather_all(c);
    if (!gt_is_s_at(in[0], drive.dim)) c->want[0] = drive;
    for (int k = 1; k <= 2; k++)
        if (!gt_is_s_at(in[k], outpos[drive.dim]))
            c->want[k] = gt_shard_moved(drive, outpos[drive.dim]);
    c->out[0] = drive;
    return GT_OK;
}

/* ---------------------------------------------------------------- layout ops */

/* A layout op whose input is replicated or partial keeps that placement (true: c->out set). */
static bool gt_rule_unsharded(gt_shard_ctx *c)
{
    if (gt_is_s(c->in[0])) return false;
    c->out[0] = c->in[0];
    return true;
}

/* broadcast_to: new leading dims shift the shard; a dim broadcast from size 1 cannot be split
 * (never the case for a shard: 1 does not divide). Linear: P stays P. */
static gt_status gt_rule_broadcast_to(gt_shard_ctx *c, gt_error *err)
{
    (void)err;
    if (gt_rule_unsharded(c)) return GT_OK;
    gt_placement x = c->in[0];
    const gt_type *ti = gt_rule_in_type(c, 0), *to = gt_rule_out_type(c, 0);
    int off = to->ndim - ti->ndim;
    if (ti->dims[x.dim] != to->dims[x.dim + off]) return gt_rule_gather_all(c);
    c->out[0] = gt_shard_moved(x, x.dim + off);
    return GT_OK;
}

/* reshape: the dims of input and output fall into groups whose products match (the reshape
 * merges or splits inside each group). A shard of the group's outermost input dim (size-1 dims
 * aside) is a contiguous block of the group's flattened elements — the same block as a shard of
 * the group's outermost output dim, when that one divides. So [b, s, D] S(0) -> [b*s, D] S(0),
 * [b, s, H*hd] S(2) -> [b, s, H, hd] S(2) (H must divide), [b, s, H, hd] S(2) -> [b, s, H*hd] S(2);
 * a shard of an inner dim of a group (s in b*s) is strided in the output: want R. Products are
 * compared as canonical expressions, built in a scratch copy of the pool (the global graph stays
 * untouched). */
static gt_status gt_rule_reshape(gt_shard_ctx *c, gt_error *err)
{
    (void)err;
    if (gt_rule_unsharded(c)) return GT_OK;
    gt_placement x = c->in[0];
    const gt_type *ti = gt_rule_in_type(c, 0), *to = gt_rule_out_type(c, 0);
    int ri = ti->ndim, ro = to->ndim, d = x.dim;
    gt_sym_pool *pool = gt_sym_pool_copy(c->g->sym);
    if (!pool) return gt_rule_gather_all(c);
    gt_expr pi[GT_MAX_DIMS + 1], po[GT_MAX_DIMS + 1];
    pi[0] = po[0] = gt_sym_const(pool, 1);
    for (int k = 0; k < ri; k++)
        pi[k + 1] = gt_sym_mul(pool, pi[k], ti->dims[k]);
    for (int k = 0; k < ro; k++)
        po[k + 1] = gt_sym_mul(pool, po[k], to->dims[k]);
    int target = -1;
    for (int i = 0, j = 0; i < ri;) {
        /* the nearest boundary (bi, bj) past (i, j): equal prefix products */
        int bi = -1, bj = -1;
        for (int s = 1; s <= (ri - i) + (ro - j) && bi < 0; s++)
            for (int i2 = i; i2 <= ri && i2 - i <= s; i2++) {
                int j2 = j + s - (i2 - i);
                if (j2 <= ro && pi[i2] == po[j2] && pi[i2] != GT_EXPR_INVALID) {
                    bi = i2;
                    bj = j2;
                    break;
                }
            }
        if (bi < 0) break;
        if (d >= i && d < bi) {
            int fi = -1, fo = -1;
            for (int k = i; k < bi && fi < 0; k++)
                if (!gt_rule_is_one(c, ti->dims[k])) fi = k;
            for (int k = j; k < bj && fo < 0; k++)
                if (!gt_rule_is_one(c, to->dims[k])) fo = k;
            if (fi == d && fo >= 0 && gt_shard_divides(c, true, 0, fo)) target = fo;
            break;
        }
        i = bi;
        j = bj;
    }
    gt_sym_pool_free(pool);
    if (target < 0) return gt_rule_gather_all(c);
    c->out[0] = gt_shard_moved(x, target);
    return GT_OK;
}

/* regroup ([b, ...] to the data-parallel ranks' blocks [G, b // G, ...] and back): a shard of
 * dim 0 is one contiguous block of the elements, which is a shard of the output's dim 0 when the
 * group divides that dim (G, or b); P stays P (a move of elements is linear). Anything else
 * gathers. */
static gt_status gt_rule_regroup(gt_shard_ctx *c, gt_error *err)
{
    (void)err;
    gt_placement x = c->in[0];
    if (gt_is_r(x) || gt_is_p(x)) {
        c->out[0] = x;
        return GT_OK;
    }
    if (!gt_is_s_at(x, 0) || !gt_shard_divides(c, true, 0, 0)) return gt_rule_gather_all(c);
    c->out[0] = x;
    return GT_OK;
}

/* transpose / permute: the shard moves with its dim; P stays P. */
static gt_status gt_rule_transpose(gt_shard_ctx *c, gt_error *err)
{
    (void)err;
    gt_placement x = c->in[0];
    c->out[0] = x;
    if (!gt_is_s(x)) return GT_OK;
    const gt_attrs *a = &c->n->attrs;
    if (c->n->op == GT_OP_TRANSPOSE) {
        int d0 = (int)a->i[0], d1 = (int)a->i[1];
        c->out[0] = gt_shard_moved(x, x.dim == d0 ? d1 : x.dim == d1 ? d0 : x.dim);
    } else {
        for (int k = 0; k < a->ni; k++)
            if (a->i[k] == x.dim) c->out[0] = gt_shard_moved(x, k);
    }
    return GT_OK;
}

/* slice / slice_backward / split along dim k: a shard of dim k does not line up with the
 * [start, end) window (want R); a shard of another dim passes; P stays P (all are linear). */
static gt_status gt_rule_slice(gt_shard_ctx *c, gt_error *err)
{
    (void)err;
    gt_placement x = c->in[0];
    if (gt_is_s_at(x, (int)c->n->attrs.i[0])) return gt_rule_gather_all(c);
    for (int j = 0; j < c->n->n_out; j++)
        c->out[j] = x;
    return GT_OK;
}

/* concat along dim k: every input must be split the same way along another dim (the driver's:
 * the first S), or all be P (concat is linear); a shard of dim k itself, or P mixed with R,
 * gathers. */
static gt_status gt_rule_concat(gt_shard_ctx *c, gt_error *err)
{
    (void)err;
    if (gt_rule_all_replicate(c)) return GT_OK;
    int k_dim = (int)c->n->attrs.i[0], n_in = c->n->n_in, driver = -1, n_partial = 0;
    for (int k = 0; k < n_in; k++) {
        if (gt_is_s_at(c->in[k], k_dim)) return gt_rule_gather_all(c);
        if (gt_is_s(c->in[k]) && driver < 0) driver = k;
        n_partial += gt_is_p(c->in[k]);
    }
    if (driver < 0) {
        if (n_partial == n_in) {
            c->out[0] = gt_place_partial();
            return GT_OK;
        }
        return gt_rule_gather_all(c);
    }
    gt_placement dp = c->in[driver];
    for (int k = 0; k < n_in; k++)
        if (!gt_is_s_at(c->in[k], dp.dim)) c->want[k] = dp;
    c->out[0] = dp;
    return GT_OK;
}

/* ---------------------------------------------------------------- dispatch */

/* gt_rule_<rule> of every op, from gt_ops.def's rule column: an op without one is a compile
 * error (the rules of rules_nn.c are declared in rules_internal.h). */
static const gt_shard_rule gt_shard_rules[GT_OP_COUNT] = {
#define X(E, name, nin, nout, flags, rule, alias, pairs, recompute, schema)                        \
    [GT_OP_##E] = gt_rule_##rule,
#include "graphtrain/gt_ops.def"
#undef X
};

gt_shard_rule gt_shard_rule_for(gt_op op)
{
    return (unsigned)op < GT_OP_COUNT ? gt_shard_rules[op] : gt_rule_none;
}
