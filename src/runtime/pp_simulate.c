/* pp_simulate.c — the pipeline schedule checker and simulator (gt_pp_schedule_simulate,
 * gt_pipeline.h).
 *
 * Two passes. The static pass looks at each rank's list alone: every action belongs on that rank,
 * runs once, and finds what it reads earlier in the list (so no action waits on a later one of
 * its own rank), and every send has its receive on the peer and the other way round. The dynamic
 * pass then runs all ranks together with blocking receives and non-blocking sends, the way the
 * runtime does; a rank that can never get past a receive is a deadlock across ranks, reported
 * with what each stuck rank waits for. The same run times the actions (F, I, W: 1 unit; B: 2),
 * which gives the bubble, and counts the micro-batches in flight. */
#include <stdlib.h>
#include <string.h>

#include "graphtrain/gt_pipeline.h"

typedef struct {
    const gt_pp_schedule *s;
    int32_t *pos; /* [kind][stage][mb] -> position in its rank's list, -1 when absent */
} index_t;

static int32_t *slot(const index_t *x, gt_pp_action_kind k, int32_t stage, int32_t mb)
{
    return &x->pos[((size_t)k * x->s->n_stages + (size_t)stage) * x->s->n_micro + (size_t)mb];
}

static int32_t at(const index_t *x, gt_pp_action_kind k, int32_t stage, int32_t mb)
{
    return *slot(x, k, stage, mb);
}

static const char *fmt(gt_pp_action a, char *buf)
{
    gt_pp_action_format(a, buf, 48);
    return buf;
}

/* The action a reads on its own rank, as kind (GT_PP_N_ACTION_KINDS: none); B-or-I reads are
 * reported as B when the list has a B, else as I. */
static int local_needs(const index_t *x, gt_pp_action a, int32_t r, gt_pp_action need[2])
{
    const gt_pp_schedule *s = x->s;
    int n = 0;
    int32_t last = s->n_stages - 1;
    switch (a.kind) {
    case GT_PP_F:
        if (a.stage > 0)
            need[n++] = s->stage_rank[a.stage - 1] == r
                            ? (gt_pp_action){GT_PP_F, a.stage - 1, a.mb}
                            : (gt_pp_action){GT_PP_RECV_F, a.stage, a.mb};
        break;
    case GT_PP_B:
    case GT_PP_I:
        need[n++] = (gt_pp_action){GT_PP_F, a.stage, a.mb};
        if (a.stage < last) {
            if (s->stage_rank[a.stage + 1] == r) {
                bool full = at(x, GT_PP_B, a.stage + 1, a.mb) >= 0;
                need[n++] = (gt_pp_action){full ? GT_PP_B : GT_PP_I, a.stage + 1, a.mb};
            } else {
                need[n++] = (gt_pp_action){GT_PP_RECV_B, a.stage, a.mb};
            }
        }
        break;
    case GT_PP_W:
        need[n++] = (gt_pp_action){GT_PP_I, a.stage, a.mb};
        break;
    case GT_PP_SEND_F:
        need[n++] = (gt_pp_action){GT_PP_F, a.stage, a.mb};
        break;
    case GT_PP_SEND_B: {
        bool full = at(x, GT_PP_B, a.stage, a.mb) >= 0;
        need[n++] = (gt_pp_action){full ? GT_PP_B : GT_PP_I, a.stage, a.mb};
        break;
    }
    default:
        break;
    }
    return n;
}

/* The peer action of a send or receive, and the rank that runs it. */
static gt_pp_action peer_of(const gt_pp_schedule *s, gt_pp_action a, int32_t *peer_rank)
{
    gt_pp_action p = a;
    switch (a.kind) {
    case GT_PP_SEND_F:
        p = (gt_pp_action){GT_PP_RECV_F, a.stage + 1, a.mb};
        break;
    case GT_PP_RECV_F:
        p = (gt_pp_action){GT_PP_SEND_F, a.stage - 1, a.mb};
        break;
    case GT_PP_SEND_B:
        p = (gt_pp_action){GT_PP_RECV_B, a.stage - 1, a.mb};
        break;
    default:
        p = (gt_pp_action){GT_PP_SEND_B, a.stage + 1, a.mb};
        break;
    }
    *peer_rank = p.stage >= 0 && p.stage < s->n_stages ? s->stage_rank[p.stage] : -1;
    return p;
}

static bool is_comm(gt_pp_action_kind k)
{
    return k >= GT_PP_SEND_F;
}

static gt_status check_static(const index_t *x, gt_error *err)
{
    const gt_pp_schedule *s = x->s;
    char b1[48], b2[48];
    /* where each action is; each runs once, on its stage's rank */
    for (int32_t r = 0; r < s->n_ranks; r++) {
        for (int32_t i = 0; i < s->n_actions[r]; i++) {
            gt_pp_action a = s->actions[r][i];
            if (a.kind < 0 || a.kind >= GT_PP_N_ACTION_KINDS || a.stage < 0 ||
                a.stage >= s->n_stages || a.mb < 0 || a.mb >= s->n_micro)
                return gt_error_set(err, GT_ERR_INVALID,
                                    "pipeline schedule: rank %d action %d (%s): no such stage "
                                    "(%d stages) or micro-batch (%d)",
                                    r, i, fmt(a, b1), s->n_stages, s->n_micro);
            if (s->stage_rank[a.stage] != r)
                return gt_error_set(err, GT_ERR_INVALID,
                                    "pipeline schedule: rank %d action %d (%s): stage %d runs "
                                    "on rank %d",
                                    r, i, fmt(a, b1), a.stage, s->stage_rank[a.stage]);
            int32_t *p = slot(x, a.kind, a.stage, a.mb);
            if (*p >= 0)
                return gt_error_set(err, GT_ERR_INVALID,
                                    "pipeline schedule: rank %d action %d (%s) runs twice "
                                    "(also action %d)",
                                    r, i, fmt(a, b1), *p);
            *p = i;
        }
    }
    /* every micro-batch of every stage: F, then B or I + W */
    for (int32_t st = 0; st < s->n_stages; st++) {
        for (int32_t m = 0; m < s->n_micro; m++) {
            int32_t r = s->stage_rank[st];
            bool f = at(x, GT_PP_F, st, m) >= 0, b = at(x, GT_PP_B, st, m) >= 0;
            bool i = at(x, GT_PP_I, st, m) >= 0, w = at(x, GT_PP_W, st, m) >= 0;
            if (b && (i || w))
                return gt_error_set(err, GT_ERR_INVALID,
                                    "pipeline schedule: rank %d runs both %dB%d and %d%s%d", r, st,
                                    m, st, i ? "I" : "W", m);
            const char *missing = !f ? "F" : !b && !i ? "B" : i && !w ? "W" : w && !i ? "I" : NULL;
            if (missing)
                return gt_error_set(err, GT_ERR_INVALID,
                                    "pipeline schedule: rank %d never runs %d%s%d (stage %d, "
                                    "micro-batch %d)",
                                    r, st, missing, m, st, m);
        }
    }
    /* local order and matching sends and receives */
    for (int32_t r = 0; r < s->n_ranks; r++) {
        for (int32_t i = 0; i < s->n_actions[r]; i++) {
            gt_pp_action a = s->actions[r][i], need[2];
            int n = local_needs(x, a, r, need);
            for (int k = 0; k < n; k++) {
                int32_t j = at(x, need[k].kind, need[k].stage, need[k].mb);
                if (j < 0)
                    return gt_error_set(err, GT_ERR_INVALID,
                                        "pipeline schedule: rank %d action %d (%s) needs %s, "
                                        "which rank %d never runs",
                                        r, i, fmt(a, b1), fmt(need[k], b2), r);
                if (j > i)
                    return gt_error_set(err, GT_ERR_INVALID,
                                        "pipeline schedule: rank %d action %d (%s) needs %s, "
                                        "which comes later (action %d)",
                                        r, i, fmt(a, b1), fmt(need[k], b2), j);
            }
            if (!is_comm(a.kind)) continue;
            int32_t pr;
            gt_pp_action p = peer_of(s, a, &pr);
            if (pr < 0 || pr == r)
                return gt_error_set(err, GT_ERR_INVALID,
                                    "pipeline schedule: rank %d action %d (%s): %s", r, i,
                                    fmt(a, b1),
                                    pr < 0 ? "no stage on the other side"
                                           : "both stages are on this rank (no send or receive)");
            if (at(x, p.kind, p.stage, p.mb) < 0)
                return gt_error_set(err, GT_ERR_INVALID,
                                    "pipeline schedule: rank %d action %d (%s) has no matching "
                                    "%s on rank %d",
                                    r, i, fmt(a, b1), fmt(p, b2), pr);
        }
    }
    /* values that cross ranks go through a send and receive */
    for (int32_t st = 0; st + 1 < s->n_stages; st++) {
        if (s->stage_rank[st] == s->stage_rank[st + 1]) continue;
        for (int32_t m = 0; m < s->n_micro; m++) {
            if (at(x, GT_PP_SEND_F, st, m) < 0)
                return gt_error_set(err, GT_ERR_INVALID,
                                    "pipeline schedule: rank %d never sends %dF%d's output "
                                    "(%dSEND_F%d) to rank %d",
                                    s->stage_rank[st], st, m, st, m, s->stage_rank[st + 1]);
            if (at(x, GT_PP_SEND_B, st + 1, m) < 0)
                return gt_error_set(err, GT_ERR_INVALID,
                                    "pipeline schedule: rank %d never sends stage %d's input "
                                    "gradient of micro-batch %d (%dSEND_B%d) to rank %d",
                                    s->stage_rank[st + 1], st + 1, m, st + 1, m, s->stage_rank[st]);
        }
    }
    return GT_OK;
}

static int64_t cost(gt_pp_action_kind k)
{
    return k == GT_PP_B ? 2 : k <= GT_PP_W ? 1 : 0;
}

gt_status gt_pp_schedule_simulate(const gt_pp_schedule *s, gt_pp_sim *out, gt_error *err)
{
    memset(out, 0, sizeof *out);
    if (s->n_ranks < 1 || s->n_stages < 1 || s->n_micro < 1)
        return gt_error_set(err, GT_ERR_INVALID, "pipeline schedule: empty");
    index_t x = {s, NULL};
    size_t n_pos = (size_t)GT_PP_N_ACTION_KINDS * s->n_stages * s->n_micro;
    x.pos = gt_xmalloc(n_pos * sizeof *x.pos);
    for (size_t i = 0; i < n_pos; i++)
        x.pos[i] = -1;
    int32_t R = s->n_ranks;
    int32_t *ptr = gt_xcalloc((size_t)R, sizeof *ptr), *live = gt_xcalloc((size_t)R, sizeof *live);
    int64_t *clock = gt_xcalloc((size_t)R, sizeof *clock), *busy = gt_xcalloc((size_t)R, 8);
    int64_t **t_done = gt_xcalloc((size_t)R, sizeof *t_done);
    out->n_ranks = R;
    out->rank_bubble = gt_xcalloc((size_t)R, sizeof *out->rank_bubble);
    out->peak_in_flight = gt_xcalloc((size_t)R, sizeof *out->peak_in_flight);
    gt_status st = check_static(&x, err);
    for (int32_t r = 0; st == GT_OK && r < R; r++)
        t_done[r] = gt_xcalloc((size_t)s->n_actions[r] + 1, sizeof **t_done);
    for (bool progress = st == GT_OK; progress;) {
        progress = false;
        for (int32_t r = 0; r < R; r++) {
            while (ptr[r] < s->n_actions[r]) {
                gt_pp_action a = s->actions[r][ptr[r]];
                if (a.kind == GT_PP_RECV_F || a.kind == GT_PP_RECV_B) {
                    int32_t pr;
                    gt_pp_action p = peer_of(s, a, &pr);
                    int32_t j = at(&x, p.kind, p.stage, p.mb);
                    if (ptr[pr] <= j) break; /* its send has not run yet */
                    if (t_done[pr][j] > clock[r]) clock[r] = t_done[pr][j];
                }
                clock[r] += cost(a.kind);
                busy[r] += cost(a.kind);
                t_done[r][ptr[r]++] = clock[r];
                if (a.kind == GT_PP_F) live[r]++;
                if (a.kind == GT_PP_B || a.kind == GT_PP_W) live[r]--;
                if (live[r] > out->peak_in_flight[r]) out->peak_in_flight[r] = live[r];
                progress = true;
            }
        }
    }
    if (st == GT_OK) {
        char buf[4096], b1[48], b2[48];
        size_t len = 0;
        buf[0] = 0;
        for (int32_t r = 0; r < R; r++) {
            if (ptr[r] == s->n_actions[r]) continue;
            gt_pp_action a = s->actions[r][ptr[r]];
            int32_t pr;
            gt_pp_action p = peer_of(s, a, &pr);
            int n = snprintf(buf + len, sizeof buf - len,
                             "%srank %d waits at action %d (%s) for %s (rank %d action %d)",
                             len ? ", " : "", r, ptr[r], fmt(a, b1), fmt(p, b2), pr,
                             at(&x, p.kind, p.stage, p.mb));
            if (n > 0 && (size_t)n < sizeof buf - len) len += (size_t)n;
        }
        if (len) st = gt_error_set(err, GT_ERR_INVALID, "pipeline schedule: deadlock: %s", buf);
    }
    if (st == GT_OK) {
        int64_t total = 0;
        for (int32_t r = 0; r < R; r++) {
            if (clock[r] > out->makespan) out->makespan = clock[r];
            total += busy[r];
        }
        for (int32_t r = 0; r < R; r++) {
            out->rank_bubble[r] =
                out->makespan ? 1.0 - (double)busy[r] / (double)out->makespan : 0.0;
            if (out->peak_in_flight[r] > out->max_in_flight)
                out->max_in_flight = out->peak_in_flight[r];
        }
        out->bubble = out->makespan ? 1.0 - (double)total / ((double)R * out->makespan) : 0.0;
    }
    for (int32_t r = 0; r < R; r++)
        free(t_done[r]);
    free(t_done);
    free(ptr);
    free(live);
    free(clock);
    free(busy);
    free(x.pos);
    if (st != GT_OK) gt_pp_sim_free(out);
    return st;
}

/* Whether the send that receive a waits for is among the first done[pr] actions of its rank. */
static bool sent_before(const gt_pp_schedule *s, const int32_t *done, gt_pp_action a)
{
    gt_pp_action want = a.kind == GT_PP_RECV_F ? (gt_pp_action){GT_PP_SEND_F, a.stage - 1, a.mb}
                                               : (gt_pp_action){GT_PP_SEND_B, a.stage + 1, a.mb};
    int32_t pr = s->stage_rank[want.stage];
    for (int32_t i = 0; i < done[pr]; i++) {
        gt_pp_action b = s->actions[pr][i];
        if (b.kind == want.kind && b.stage == want.stage && b.mb == want.mb) return true;
    }
    return false;
}

/* The order of gt_pp_schedule_each: {rank, index} per action placed; returns how many. */
static int64_t schedule_order(const gt_pp_schedule *s, int32_t rank, int32_t (*order)[2],
                              int32_t *stuck, int32_t *stuck_at)
{
    int32_t *done = gt_xcalloc((size_t)s->n_ranks + 1, sizeof *done);
    int64_t n = 0;
    for (int32_t i = 0; rank >= 0 && i < s->n_actions[rank]; i++, n++) {
        order[n][0] = rank;
        order[n][1] = done[rank]++;
    }
    for (bool progress = rank < 0; progress;) {
        progress = false;
        for (int32_t rk = 0; rk < s->n_ranks; rk++) {
            while (done[rk] < s->n_actions[rk]) {
                gt_pp_action a = s->actions[rk][done[rk]];
                if ((a.kind == GT_PP_RECV_F || a.kind == GT_PP_RECV_B) && !sent_before(s, done, a))
                    break;
                order[n][0] = rk;
                order[n][1] = done[rk]++;
                n++;
                progress = true;
            }
        }
    }
    *stuck = *stuck_at = -1;
    for (int32_t rk = 0; rank < 0 && rk < s->n_ranks && *stuck < 0; rk++)
        if (done[rk] < s->n_actions[rk]) *stuck = rk, *stuck_at = done[rk];
    free(done);
    return n;
}

gt_status gt_pp_schedule_each(const gt_pp_schedule *s, int32_t rank,
                              gt_status (*fn)(void *user, gt_pp_action a, gt_error *err),
                              void *user, gt_error *err)
{
    int64_t total = 0;
    for (int32_t rk = 0; rk < s->n_ranks; rk++)
        total += s->n_actions[rk];
    int32_t(*order)[2] = gt_xcalloc((size_t)total + 1, sizeof *order);
    int32_t stuck, stuck_at;
    int64_t n = schedule_order(s, rank, order, &stuck, &stuck_at);
    gt_status st = GT_OK;
    for (int64_t k = 0; k < n && st == GT_OK; k++) {
        gt_pp_action a = s->actions[order[k][0]][order[k][1]];
        st = fn(user, a, err);
        if (st != GT_OK) {
            char buf[48];
            gt_pp_action_format(a, buf, sizeof buf);
            gt_error_wrap(err, "rank %d action %d (%s)", order[k][0], order[k][1], buf);
        }
    }
    if (st == GT_OK && stuck >= 0)
        st = gt_error_set(err, GT_ERR_INVALID,
                          "pipeline: rank %d is stuck at action %d (check the schedule with "
                          "gt_pp_schedule_simulate)",
                          stuck, stuck_at);
    free(order);
    return st;
}

void gt_pp_sim_free(gt_pp_sim *sim)
{
    if (!sim) return;
    free(sim->rank_bubble);
    free(sim->peak_in_flight);
    memset(sim, 0, sizeof *sim);
}

void gt_pp_schedule_peak_bytes(const gt_pp_schedule *s, const int64_t *stage_bytes, int64_t *peak)
{
    for (int32_t r = 0; r < s->n_ranks; r++) {
        int64_t live = 0;
        peak[r] = 0;
        for (int32_t i = 0; i < s->n_actions[r]; i++) {
            gt_pp_action a = s->actions[r][i];
            if (a.kind == GT_PP_F) live += stage_bytes[a.stage];
            if (a.kind == GT_PP_B || a.kind == GT_PP_W) live -= stage_bytes[a.stage];
            if (live > peak[r]) peak[r] = live;
        }
    }
}
