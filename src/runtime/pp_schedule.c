/* pp_schedule.c — pipeline schedules as data (gt_pipeline.h): the generators of each rank's
 * compute order, the sends and receives between ranks, the text form, and the stage layout of a
 * run from its options.
 *
 * The compute orders are ported from torch.distributed.pipelining (schedules.py of torch 2.15):
 * GPipe and 1F1B from the runtime loops of ScheduleGPipe / Schedule1F1B._step_microbatches (the
 * pipeline_order that Schedule1F1B prints starts its last rank at F1 and ends it at F4, so it is
 * not the reference), Interleaved1F1B from _get_1f1b_rank_ops, ZBVZeroBubble and DualPipeV from
 * their _calculate_single_rank_operations. tests/unit/test_pp_schedule.c compares them with
 * tests/fixtures/pp_schedule/torch_orders.txt, written by tools/gen_pp_schedule_fixture.py. */
#include <stdlib.h>
#include <string.h>

#include "graphtrain/gt_pipeline.h"

static const char *const schedule_names[GT_PP_N_SCHEDULES] = {"GPipe", "1F1B", "Interleaved1F1B",
                                                              "ZBVZeroBubble", "DualPipeV"};
static const char *const action_names[GT_PP_N_ACTION_KINDS] = {
    "F", "B", "I", "W", "SEND_F", "RECV_F", "SEND_B", "RECV_B"};

const char *gt_pp_schedule_name(gt_pp_schedule_kind kind)
{
    return kind >= 0 && kind < GT_PP_N_SCHEDULES ? schedule_names[kind] : "?";
}

const char *gt_pp_action_kind_name(gt_pp_action_kind kind)
{
    return kind >= 0 && kind < GT_PP_N_ACTION_KINDS ? action_names[kind] : "?";
}

gt_status gt_pp_schedule_from_name(const char *name, gt_pp_schedule_kind *out, gt_error *err)
{
    for (int k = 0; k < GT_PP_N_SCHEDULES; k++)
        if (name && !strcmp(name, schedule_names[k])) return *out = (gt_pp_schedule_kind)k, GT_OK;
    return gt_error_set(err, GT_ERR_INVALID,
                        "--parallelism.pipeline_parallel_schedule: no schedule \"%s\"; expected "
                        "one of GPipe, 1F1B, Interleaved1F1B, ZBVZeroBubble, DualPipeV",
                        name ? name : "");
}

int gt_pp_default_stages_per_rank(gt_pp_schedule_kind kind)
{
    return kind == GT_PP_GPIPE || kind == GT_PP_1F1B ? 1 : 2;
}

static bool is_v(gt_pp_schedule_kind kind)
{
    return kind == GT_PP_ZBV_ZERO_BUBBLE || kind == GT_PP_DUALPIPEV;
}

int32_t gt_pp_stage_rank(gt_pp_schedule_kind kind, int32_t n_ranks, int32_t n_stages, int32_t s)
{
    (void)n_stages;
    if (!is_v(kind)) return s % n_ranks;
    /* V: down the ranks, then back up (torch's generate_stage_to_rank_mapping style "v") */
    return (s / n_ranks) % 2 == 0 ? s % n_ranks : n_ranks - 1 - s % n_ranks;
}

/* ---------------------------------------------------------------- compute orders */

typedef struct {
    gt_pp_action *a;
    int32_t n, cap;
} action_list;

static void push(action_list *l, gt_pp_action_kind kind, int32_t stage, int32_t mb)
{
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 64;
        l->a = gt_xrealloc(l->a, (size_t)l->cap * sizeof *l->a);
    }
    l->a[l->n++] = (gt_pp_action){kind, stage, mb};
}

static void gen_gpipe(action_list *l, int32_t rank, int32_t n_micro)
{
    for (int32_t m = 0; m < n_micro; m++)
        push(l, GT_PP_F, rank, m);
    for (int32_t m = 0; m < n_micro; m++)
        push(l, GT_PP_B, rank, m);
}

/* Schedule1F1B._step_microbatches: n_stages - stage forwards, then backward and forward in turn,
 * then the remaining backwards. */
static void gen_1f1b(action_list *l, int32_t rank, int32_t n_ranks, int32_t n_micro)
{
    int32_t warmup = n_ranks - rank < n_micro ? n_ranks - rank : n_micro, f = 0, b = 0;
    while (f < warmup)
        push(l, GT_PP_F, rank, f++);
    for (;;) {
        push(l, GT_PP_B, rank, b++);
        if (f == n_micro) break;
        push(l, GT_PP_F, rank, f++);
    }
    while (b < n_micro)
        push(l, GT_PP_B, rank, b++);
}

/* ScheduleInterleaved1F1B: _get_warmup_ops and _get_1f1b_rank_ops without zero bubble (the idle
 * slots that torch pads with are left out: the action list is an order, not a timeline). */
static void gen_interleaved(action_list *l, int32_t rank, int32_t n_ranks, int32_t n_local,
                            int32_t n_micro)
{
    int32_t rounds = n_micro / n_ranks > 1 ? n_micro / n_ranks : 1;
    int32_t per_round = n_micro / rounds;
    int32_t warmup = (n_local - 1) * per_round + 2 * (n_ranks - 1 - rank);
    int32_t mb_ops = n_local * n_micro;
    if (warmup > mb_ops) warmup = mb_ops;
    int32_t fwd_bwd = mb_ops - warmup, cooldown = mb_ops - fwd_bwd;
    int32_t *fmb = gt_xcalloc((size_t)n_local * n_ranks, sizeof *fmb);
    int32_t *bmb = gt_xcalloc((size_t)n_local * n_ranks, sizeof *bmb);
    for (int32_t op = 0; op < warmup + fwd_bwd + cooldown; op++) {
        if (op < warmup + fwd_bwd) {
            int32_t s = (op / per_round) % n_local * n_ranks + rank;
            push(l, GT_PP_F, s, fmb[s]++);
        }
        if (op >= warmup) {
            int32_t s = (n_local - 1 - ((op - warmup) / per_round) % n_local) * n_ranks + rank;
            push(l, GT_PP_B, s, bmb[s]++);
        }
    }
    free(fmb);
    free(bmb);
}

/* ScheduleZBVZeroBubble._calculate_single_rank_operations; micro-batches past n_micro (the
 * generator pads to 2 n_ranks - 1) are dropped as torch drops them. */
static void gen_zbv(action_list *l, int32_t rank, int32_t n_ranks, int32_t n_micro)
{
    int32_t n = n_micro > 2 * n_ranks - 1 ? n_micro : 2 * n_ranks - 1;
    int32_t c0 = rank, c1 = 2 * n_ranks - 1 - rank;
    int32_t f0 = 0, f1 = 0, b0 = 0, b1 = 0;
    action_list t = {0};
    for (int32_t i = 0; i < 2 * (n_ranks - rank) - 1; i++)
        push(&t, GT_PP_F, c0, f0++);
    for (int32_t i = 0; i < rank; i++) {
        push(&t, GT_PP_F, c1, f1++);
        push(&t, GT_PP_F, c0, f0++);
    }
    for (int32_t i = 0; i < n_ranks - rank; i++) {
        push(&t, GT_PP_F, c1, f1++);
        push(&t, GT_PP_I, c1, b1);
        push(&t, GT_PP_W, c1, b1++);
    }
    while (f1 < f0 || f0 < n) {
        if (f0 < n) push(&t, GT_PP_F, c0, f0++);
        push(&t, GT_PP_I, c0, b0);
        push(&t, GT_PP_W, c0, b0++);
        push(&t, GT_PP_F, c1, f1++);
        push(&t, GT_PP_I, c1, b1);
        push(&t, GT_PP_W, c1, b1++);
    }
    int32_t w0 = b0, w1 = b1;
    for (int32_t i = 0; i < rank; i++) {
        push(&t, GT_PP_I, c0, b0++);
        push(&t, GT_PP_I, c1, b1++);
    }
    for (int32_t i = 0; i < n_ranks - rank; i++) {
        push(&t, GT_PP_I, c0, b0++);
        push(&t, GT_PP_W, c0, w0++);
    }
    while (w1 < b1)
        push(&t, GT_PP_W, c1, w1++);
    while (w0 < b0)
        push(&t, GT_PP_W, c0, w0++);
    for (int32_t i = 0; i < t.n; i++)
        if (t.a[i].mb < n_micro) push(l, t.a[i].kind, t.a[i].stage, t.a[i].mb);
    free(t.a);
}

/* ScheduleDualPipeV._calculate_single_rank_operations. Its OVERLAP_F_B (a forward of one
 * micro-batch fused with a backward of another) is the forward then the backward. */
typedef struct {
    action_list *l;
    int32_t c[2], f[2], i[2]; /* the two stages; next forward / input-gradient micro-batch */
    int32_t *wq_stage, *wq_mb, wq_head, wq_tail; /* the W queue: at most one per I */
} dpv;

static void dpv_add(dpv *d, int which, gt_pp_action_kind kind)
{
    if (kind == GT_PP_F) {
        push(d->l, GT_PP_F, d->c[which], d->f[which]++);
    } else if (kind == GT_PP_B) {
        push(d->l, GT_PP_B, d->c[which], d->i[which]++);
    } else { /* I: its W goes to the queue */
        push(d->l, GT_PP_I, d->c[which], d->i[which]);
        d->wq_stage[d->wq_tail] = d->c[which];
        d->wq_mb[d->wq_tail++] = d->i[which]++;
    }
}

static void dpv_weight(dpv *d)
{
    if (d->wq_head == d->wq_tail) return;
    push(d->l, GT_PP_W, d->wq_stage[d->wq_head], d->wq_mb[d->wq_head]);
    d->wq_head++;
}

static void gen_dualpipev(action_list *l, int32_t rank, int32_t n_ranks, int32_t n_micro)
{
    dpv *d = gt_xcalloc(1, sizeof *d);
    d->l = l;
    d->wq_stage = gt_xmalloc((2 * (size_t)n_micro + 1) * sizeof *d->wq_stage);
    d->wq_mb = gt_xmalloc((2 * (size_t)n_micro + 1) * sizeof *d->wq_mb);
    d->c[0] = rank;
    d->c[1] = 2 * n_ranks - 1 - rank;
    for (int32_t k = 0; k < (n_ranks - rank - 1) * 2; k++)
        dpv_add(d, 0, GT_PP_F);
    for (int32_t k = 0; k < rank + 1; k++) {
        dpv_add(d, 0, GT_PP_F);
        dpv_add(d, 1, GT_PP_F);
    }
    for (int32_t k = 0; k < n_ranks - rank - 1; k++) {
        dpv_add(d, 1, GT_PP_I);
        dpv_weight(d);
        dpv_add(d, 1, GT_PP_F);
    }
    for (int32_t k = 0; k < n_micro - n_ranks * 2 + rank + 1; k++) {
        /* the first of the last rank is not overlapped in torch; as a plain order it is the same
         * forward then full backward */
        dpv_add(d, 0, GT_PP_F);
        dpv_add(d, 1, GT_PP_B);
        dpv_add(d, 1, GT_PP_F);
        dpv_add(d, 0, GT_PP_B);
    }
    for (int32_t k = 0; k < n_ranks - rank - 1; k++) {
        dpv_add(d, 1, GT_PP_B);
        dpv_add(d, 1, GT_PP_F);
        dpv_add(d, 0, GT_PP_B);
    }
    bool zb = false;
    int32_t step6 = rank + 1;
    for (int32_t k = 0; k < step6; k++) {
        if (k == step6 / 2 && rank % 2 == 1) zb = true;
        dpv_add(d, 1, zb ? GT_PP_I : GT_PP_B);
        if (k == step6 / 2 && rank % 2 == 0) zb = true;
        dpv_add(d, 0, zb ? GT_PP_I : GT_PP_B);
    }
    for (int32_t k = 0; k < n_ranks - rank - 1; k++) {
        dpv_weight(d);
        dpv_add(d, 0, zb ? GT_PP_I : GT_PP_B);
    }
    for (int32_t k = 0; k < rank + 1; k++)
        dpv_weight(d);
    free(d->wq_stage);
    free(d->wq_mb);
    free(d);
}

/* ---------------------------------------------------------------- sends and receives */

static bool is_backward(gt_pp_action_kind k)
{
    return k == GT_PP_B || k == GT_PP_I;
}

/* A receive right before each action whose input is on another rank, a send right after each
 * action whose output another rank needs. */
static void add_comms(const gt_pp_schedule *s, int32_t r, const action_list *in, action_list *out)
{
    for (int32_t i = 0; i < in->n; i++) {
        gt_pp_action a = in->a[i];
        bool fwd = a.kind == GT_PP_F, bwd = is_backward(a.kind);
        int32_t prev = a.stage - 1, next = a.stage + 1;
        bool prev_remote = prev >= 0 && s->stage_rank[prev] != r;
        bool next_remote = next < s->n_stages && s->stage_rank[next] != r;
        if (fwd && prev_remote) push(out, GT_PP_RECV_F, a.stage, a.mb);
        if (bwd && next_remote) push(out, GT_PP_RECV_B, a.stage, a.mb);
        push(out, a.kind, a.stage, a.mb);
        if (fwd && next_remote) push(out, GT_PP_SEND_F, a.stage, a.mb);
        if (bwd && prev_remote) push(out, GT_PP_SEND_B, a.stage, a.mb);
    }
}

gt_status gt_pp_schedule_build(gt_pp_schedule_kind kind, int32_t n_ranks, int32_t stages_per_rank,
                               int32_t n_micro, gt_pp_schedule *out, gt_error *err)
{
    memset(out, 0, sizeof *out);
    const char *name = gt_pp_schedule_name(kind);
    if (kind < 0 || kind >= GT_PP_N_SCHEDULES)
        return gt_error_set(err, GT_ERR_INVALID, "pipeline schedule: kind %d is no schedule",
                            (int)kind);
    if (n_ranks < 1 || n_micro < 1 || stages_per_rank < 1)
        return gt_error_set(err, GT_ERR_INVALID,
                            "pipeline schedule %s: %d ranks, %d stages per rank, %d micro-batches: "
                            "expected at least 1 of each",
                            name, n_ranks, stages_per_rank, n_micro);
    bool single = kind == GT_PP_GPIPE || kind == GT_PP_1F1B;
    if ((single && stages_per_rank != 1) || (is_v(kind) && stages_per_rank != 2) ||
        (kind == GT_PP_INTERLEAVED_1F1B && stages_per_rank < 2))
        return gt_error_set(err, GT_ERR_INVALID,
                            "--parallelism.pipeline_parallel_layers_per_stage: schedule %s needs "
                            "%s stage%s per rank, the layers per stage give %d",
                            name,
                            single       ? "exactly 1"
                            : is_v(kind) ? "exactly 2"
                                         : "at least 2",
                            single ? "" : "s", stages_per_rank);
    int32_t n_stages = n_ranks * stages_per_rank;
    if (kind == GT_PP_DUALPIPEV && n_micro < n_stages)
        return gt_error_set(err, GT_ERR_INVALID,
                            "--parallelism.pipeline_parallel_microbatch_size: DualPipeV needs at "
                            "least as many micro-batches as stages (%d), got %d micro-batches "
                            "(training.local_batch_size / pipeline_parallel_microbatch_size)",
                            n_stages, n_micro);
    if (kind == GT_PP_INTERLEAVED_1F1B) {
        int32_t rounds = n_micro / n_ranks > 1 ? n_micro / n_ranks : 1;
        if (n_micro % rounds != 0)
            return gt_error_set(err, GT_ERR_INVALID,
                                "--parallelism.pipeline_parallel_microbatch_size: Interleaved1F1B "
                                "needs the micro-batches (%d) to be a multiple of its rounds (%d, "
                                "micro-batches / pipeline_parallel_degree)",
                                n_micro, rounds);
    }
    out->kind = kind;
    out->n_ranks = n_ranks;
    out->n_stages = n_stages;
    out->n_micro = n_micro;
    out->stage_rank = gt_xmalloc((size_t)n_stages * sizeof *out->stage_rank);
    for (int32_t st = 0; st < n_stages; st++)
        out->stage_rank[st] = gt_pp_stage_rank(kind, n_ranks, n_stages, st);
    out->actions = gt_xcalloc((size_t)n_ranks, sizeof *out->actions);
    out->n_actions = gt_xcalloc((size_t)n_ranks, sizeof *out->n_actions);
    for (int32_t r = 0; r < n_ranks; r++) {
        action_list compute = {0}, all = {0};
        switch (kind) {
        case GT_PP_GPIPE:
            gen_gpipe(&compute, r, n_micro);
            break;
        case GT_PP_1F1B:
            gen_1f1b(&compute, r, n_ranks, n_micro);
            break;
        case GT_PP_INTERLEAVED_1F1B:
            gen_interleaved(&compute, r, n_ranks, stages_per_rank, n_micro);
            break;
        case GT_PP_ZBV_ZERO_BUBBLE:
            gen_zbv(&compute, r, n_ranks, n_micro);
            break;
        default:
            gen_dualpipev(&compute, r, n_ranks, n_micro);
            break;
        }
        add_comms(out, r, &compute, &all);
        free(compute.a);
        out->actions[r] = all.a;
        out->n_actions[r] = all.n;
    }
    return GT_OK;
}

void gt_pp_schedule_free(gt_pp_schedule *s)
{
    if (!s) return;
    for (int32_t r = 0; s->actions && r < s->n_ranks; r++)
        free(s->actions[r]);
    free(s->actions);
    free(s->n_actions);
    free(s->stage_rank);
    memset(s, 0, sizeof *s);
}

/* ---------------------------------------------------------------- text form */

void gt_pp_action_format(gt_pp_action a, char *buf, size_t size)
{
    snprintf(buf, size, "%d%s%d", (int)a.stage, gt_pp_action_kind_name(a.kind), (int)a.mb);
}

gt_status gt_pp_action_parse(const char *text, gt_pp_action *out, gt_error *err)
{
    const char *p = text;
    char *end;
    long stage = strtol(p, &end, 10);
    if (end == p || stage < 0 || stage > INT32_MAX) goto bad;
    p = end;
    /* the longest kind name that matches: "SEND_F" before "F" is no issue (distinct first
     * letters but for F), so try each and take the one followed by a digit */
    for (int k = 0; k < GT_PP_N_ACTION_KINDS; k++) {
        size_t n = strlen(action_names[k]);
        if (strncmp(p, action_names[k], n) || p[n] < '0' || p[n] > '9') continue;
        long mb = strtol(p + n, &end, 10);
        if (*end || mb < 0 || mb > INT32_MAX) goto bad;
        *out = (gt_pp_action){(gt_pp_action_kind)k, (int32_t)stage, (int32_t)mb};
        return GT_OK;
    }
bad:
    return gt_error_set(err, GT_ERR_INVALID,
                        "pipeline action \"%s\": expected STAGE KIND MICROBATCH, e.g. 1F0 or "
                        "0SEND_F3 (kinds F, B, I, W, SEND_F, RECV_F, SEND_B, RECV_B)",
                        text);
}

void gt_pp_schedule_print_rank(const gt_pp_schedule *s, int32_t rank, bool compute_only, FILE *f)
{
    fprintf(f, "rank %d:", (int)rank);
    for (int32_t i = 0; i < s->n_actions[rank]; i++) {
        gt_pp_action a = s->actions[rank][i];
        if (compute_only && a.kind > GT_PP_W) continue;
        char buf[48];
        gt_pp_action_format(a, buf, sizeof buf);
        fprintf(f, " %s", buf);
    }
    fputc('\n', f);
}

/* ---------------------------------------------------------------- stages of a model */

gt_status gt_pp_split_layers(int64_t n_layers, int32_t n_stages, int64_t first_less,
                             int64_t last_less, int64_t *first_layer, gt_error *err)
{
    if (n_stages < 1)
        return gt_error_set(err, GT_ERR_INVALID, "pipeline stages: %d, expected >= 1", n_stages);
    if (n_stages == 1) {
        first_layer[0] = 0;
        first_layer[1] = n_layers;
        return GT_OK;
    }
    int64_t effective = n_layers + first_less + last_less;
    if (n_stages > effective)
        return gt_error_set(err, GT_ERR_INVALID,
                            "--parallelism.pipeline_parallel_degree: %d stages for %lld blocks "
                            "plus first_stage_less_layers %lld and last_stage_less_layers %lld: "
                            "more stages than effective layers",
                            n_stages, (long long)n_layers, (long long)first_less,
                            (long long)last_less);
    int64_t per = effective / n_stages, extra = effective % n_stages;
    if (first_less > per)
        return gt_error_set(err, GT_ERR_INVALID,
                            "--parallelism.pipeline_parallel_first_stage_less_layers = %lld: more "
                            "than the %lld effective layers of the smallest stage",
                            (long long)first_less, (long long)per);
    if (last_less > per)
        return gt_error_set(err, GT_ERR_INVALID,
                            "--parallelism.pipeline_parallel_last_stage_less_layers = %lld: more "
                            "than the %lld effective layers of the smallest stage",
                            (long long)last_less, (long long)per);
    int64_t cur = 0;
    for (int32_t s = 0; s < n_stages; s++) {
        first_layer[s] = cur;
        int64_t take = per + (s < extra ? 1 : 0);
        if (s == 0) take -= first_less;
        if (s == n_stages - 1) take -= last_less;
        cur += take;
        if (cur > n_layers) cur = n_layers; /* torchtitan stops at the last block */
    }
    first_layer[n_stages] = cur;
    if (cur != n_layers) /* cannot happen with the checks above; kept as a user-facing error */
        return gt_error_set(err, GT_ERR_INVALID,
                            "pipeline stages: the split covers %lld of %lld blocks", (long long)cur,
                            (long long)n_layers);
    return GT_OK;
}

gt_status gt_pp_layout_init(const char *schedule, int64_t degree, int64_t n_layers,
                            int64_t layers_per_stage, int64_t first_less, int64_t last_less,
                            int64_t local_batch_size, int64_t microbatch_size, gt_pp_layout *out,
                            gt_error *err)
{
    memset(out, 0, sizeof *out);
    GT_TRY(gt_pp_schedule_from_name(schedule, &out->kind, err));
    if (degree < 1 || degree > (1 << 20))
        return gt_error_set(err, GT_ERR_INVALID,
                            "--parallelism.pipeline_parallel_degree = %lld: expected 1 .. 2^20",
                            (long long)degree);
    if (microbatch_size < 1 || local_batch_size % microbatch_size != 0)
        return gt_error_set(err, GT_ERR_INVALID,
                            "--parallelism.pipeline_parallel_microbatch_size = %lld: "
                            "training.local_batch_size = %lld is not a multiple of it",
                            (long long)microbatch_size, (long long)local_batch_size);
    int64_t n_micro = local_batch_size / microbatch_size;
    int64_t n_stages;
    const char *name = gt_pp_schedule_name(out->kind);
    bool single = out->kind == GT_PP_GPIPE || out->kind == GT_PP_1F1B;
    if (layers_per_stage == -1) {
        n_stages = degree * gt_pp_default_stages_per_rank(out->kind);
    } else {
        if (layers_per_stage < 1)
            return gt_error_set(err, GT_ERR_INVALID,
                                "--parallelism.pipeline_parallel_layers_per_stage = %lld: "
                                "expected >= 1 (or -1: unset)",
                                (long long)layers_per_stage);
        int64_t eff = n_layers + first_less + last_less;
        n_stages = (eff + layers_per_stage - 1) / layers_per_stage;
        if (n_stages % degree != 0)
            return gt_error_set(err, GT_ERR_INVALID,
                                "--parallelism.pipeline_parallel_layers_per_stage = %lld: %lld "
                                "blocks + %lld + %lld (first/last_stage_less_layers) give %lld "
                                "stages, not divisible by pipeline_parallel_degree %lld",
                                (long long)layers_per_stage, (long long)n_layers,
                                (long long)first_less, (long long)last_less, (long long)n_stages,
                                (long long)degree);
        int64_t per_rank = n_stages / degree;
        if ((single && per_rank != 1) || (is_v(out->kind) && per_rank != 2) ||
            (!single && per_rank < 2))
            return gt_error_set(err, GT_ERR_INVALID,
                                "--parallelism.pipeline_parallel_layers_per_stage = %lld gives "
                                "%lld stages per rank; schedule %s needs %s",
                                (long long)layers_per_stage, (long long)per_rank, name,
                                single            ? "exactly 1"
                                : is_v(out->kind) ? "exactly 2"
                                                  : ">= 2");
    }
    if (n_stages > (1 << 20) || n_micro > (1 << 20))
        return gt_error_set(err, GT_ERR_INVALID,
                            "pipeline: %lld stages and %lld micro-batches, at most 2^20 each",
                            (long long)n_stages, (long long)n_micro);
    out->n_ranks = (int32_t)degree;
    out->n_stages = (int32_t)n_stages;
    out->stages_per_rank = (int32_t)(n_stages / degree);
    out->n_micro = (int32_t)n_micro;
    out->first_layer = gt_xmalloc((size_t)(n_stages + 1) * sizeof *out->first_layer);
    gt_status st =
        gt_pp_split_layers(n_layers, out->n_stages, first_less, last_less, out->first_layer, err);
    if (st != GT_OK) gt_pp_layout_free(out);
    return st;
}

void gt_pp_layout_free(gt_pp_layout *l)
{
    if (!l) return;
    free(l->first_layer);
    memset(l, 0, sizeof *l);
}
