/* policy.c — the autoparallel backend's FSDP pass policy: the bucket cap and prefetch depth that
 * hide the parameter all-gathers behind compute within the memory budget, on the solver's cost
 * model (gt_autoparallel.h, gt_autopar_policy, states the model and the rule). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/autoparallel/autopar_internal.h"

#define MIB (1024.0 * 1024.0)
#define MAX_DEPTH 4          /* the picks' deepest prefetch */
#define MAX_PRICED 8         /* the deepest a user may fix (compile.fsdp_prefetch_depth) */
#define HIDDEN_FRACTION 0.01 /* "hides": exposed <= this much of the modelled compute */

/* One unit's share of a phase, in the order its compute runs. */
typedef struct {
    int32_t unit;
    double compute_s, scatter_s; /* its compute; its gradient collectives on the gathers' dim */
    double *member_b;            /* its FSDP gathers' unsharded bytes, in node order */
    int n_members;
} unit_part;

typedef struct {
    unit_part *u;
    int n;
    int md, ranks; /* the gathers' mesh dim and group */
} phase_model;

/* The buckets of one phase under a cap. */
typedef struct {
    double *bytes, *gather_s, *compute_s, *scatter_s;
    int n;
} buckets;

static void buckets_free(buckets *k)
{
    free(k->bytes);
    free(k->gather_s);
    free(k->compute_s);
    free(k->scatter_s);
    memset(k, 0, sizeof *k);
}

static void phases_free(phase_model *ph)
{
    for (int p = 0; p < 2; p++) {
        for (int i = 0; i < ph[p].n; i++)
            free(ph[p].u[i].member_b);
        free(ph[p].u);
    }
}

static unit_part *unit_of(phase_model *ph, int32_t unit)
{
    for (int i = 0; i < ph->n; i++)
        if (ph->u[i].unit == unit) return &ph->u[i];
    ph->u = gt_xrealloc(ph->u, (size_t)(ph->n + 1) * sizeof *ph->u);
    ph->u[ph->n] = (unit_part){.unit = unit};
    return &ph->u[ph->n++];
}

/* The forward and backward of spmd, unit by unit in the order of their first compute node. */
static gt_status read_phases(const gt_graph *g, const gt_sym_binding *b, const gt_autopar_device *d,
                             phase_model *ph, gt_error *err)
{
    memset(ph, 0, 2 * sizeof *ph);
    ph[0].md = ph[1].md = -1;
    /* first the compute, which fixes the units' order, then the collectives */
    for (int pass = 0; pass < 2; pass++)
        for (gt_node_id i = 0; i < g->n_nodes; i++) {
            const gt_node *n = &g->nodes[i];
            if (n->phase != GT_PHASE_FORWARD && n->phase != GT_PHASE_BACKWARD) continue;
            phase_model *p = &ph[n->phase == GT_PHASE_BACKWARD];
            int ck = gt_ap_comm_kind(n->op);
            if (pass == 0) {
                if (gt_op_get(n->op)->flags & (GT_OPF_VIEW | GT_OPF_COLLECTIVE)) continue;
                double t;
                GT_TRY(gt_ap_node_s(g, i, b, d, &t, err));
                unit_of(p, n->unit)->compute_s += t;
                continue;
            }
            bool gather = ck == 0 && gt_node_has_tag(g, n, "fsdp.all_gather");
            bool grad = (ck == 1 && gt_node_has_tag(g, n, "fsdp.reduce_scatter")) ||
                        (ck == 2 && gt_node_has_tag(g, n, "fsdp.all_reduce"));
            int md = n->attrs.i[0], ranks = (int)n->attrs.i[1];
            if (!(gather || grad) || md < 0 || md >= GT_MESH_NDIMS || ranks <= 1) continue;
            double in_b, out_b;
            GT_TRY(gt_ap_value_bytes(g, n->in[0], b, &in_b, err));
            GT_TRY(gt_ap_value_bytes(g, n->out[0], b, &out_b, err));
            double full = in_b > out_b ? in_b : out_b;
            if (gather && p->md < 0) p->md = md, p->ranks = ranks;
            /* one link: the collectives of another mesh dim (HSDP's all-reduce) run beside */
            if (md != p->md) continue;
            unit_part *u = unit_of(p, n->unit);
            if (grad) {
                u->scatter_s += gt_ap_collective_s(d, md, ranks, full, ck);
                continue;
            }
            u->member_b = gt_xrealloc(u->member_b, (size_t)(u->n_members + 1) * sizeof(double));
            u->member_b[u->n_members++] = full;
        }
    return GT_OK;
}

static void push_bucket(buckets *k, double bytes, double compute_s, double scatter_s,
                        const gt_autopar_device *d, const phase_model *p)
{
    size_t n = (size_t)k->n + 1;
    k->bytes = gt_xrealloc(k->bytes, n * sizeof(double));
    k->gather_s = gt_xrealloc(k->gather_s, n * sizeof(double));
    k->compute_s = gt_xrealloc(k->compute_s, n * sizeof(double));
    k->scatter_s = gt_xrealloc(k->scatter_s, n * sizeof(double));
    k->bytes[k->n] = bytes;
    /* a bucket's gather is one more launch, whatever its size */
    k->gather_s[k->n] = gt_ap_collective_s(d, p->md, p->ranks, bytes, 0) + d->node_floor_s;
    k->compute_s[k->n] = compute_s;
    k->scatter_s[k->n] = scatter_s;
    k->n++;
}

/* The phase's buckets under cap_b (0: one per unit), as fsdp_bucketing cuts them: a member joins
 * the bucket while the cap holds. A unit without gathers lends its compute to the bucket before
 * (or the first). */
static void make_buckets(const phase_model *p, double cap_b, const gt_autopar_device *d, buckets *k)
{
    memset(k, 0, sizeof *k);
    double lead = 0;
    for (int i = 0; i < p->n; i++) {
        const unit_part *u = &p->u[i];
        if (u->n_members == 0) {
            if (k->n > 0)
                k->compute_s[k->n - 1] += u->compute_s;
            else
                lead += u->compute_s;
            continue;
        }
        double total = 0;
        for (int m = 0; m < u->n_members; m++)
            total += u->member_b[m];
        for (int m = 0; m < u->n_members;) {
            double bytes = u->member_b[m];
            int j = m + 1;
            while (j < u->n_members && !(cap_b > 0 && bytes + u->member_b[j] > cap_b))
                bytes += u->member_b[j++];
            double share = total > 0 ? bytes / total : 1.0 / u->n_members;
            push_bucket(k, bytes, u->compute_s * share, u->scatter_s * share, d, p);
            m = j;
        }
    }
    if (k->n > 0) k->compute_s[0] += lead;
}

/* The schedule of one phase's buckets at depth (gt_autopar_policy): exposed seconds. */
static double exposed_s(const buckets *k, int depth)
{
    if (k->n == 0) return 0;
    double *start = gt_xmalloc((size_t)k->n * sizeof *start);
    double *end = gt_xmalloc((size_t)k->n * sizeof *end);
    double link = 0, done = 0, compute = 0;
    for (int j = 0; j < k->n; j++) {
        double gathered = 0; /* the first bucket was gathered during the phase before */
        if (j > 0) {
            double post = j - depth > 0 ? start[j - depth] : 0;
            link = (post > link ? post : link) + k->gather_s[j];
            gathered = link;
        }
        start[j] = gathered > done ? gathered : done;
        done = end[j] = start[j] + k->compute_s[j];
        compute += k->compute_s[j];
        /* the gradient collectives of bucket j - depth were posted after gather j */
        int r = j - depth;
        if (r >= 0) link = (end[r] > link ? end[r] : link) + k->scatter_s[r];
    }
    free(start);
    free(end);
    double e = done - compute;
    return e > 0 ? e : 0;
}

/* The most bytes of depth + 1 consecutive buckets. */
static double inflight_b(const buckets *k, int depth)
{
    double best = 0;
    for (int j = 0; j < k->n; j++) {
        double s = 0;
        for (int i = j; i < k->n && i <= j + depth; i++)
            s += k->bytes[i];
        if (s > best) best = s;
    }
    return best;
}

typedef struct {
    double cap_mb;
    double exposed[MAX_PRICED + 1], inflight[MAX_PRICED + 1];
    double gather_s;
    int n_buckets;
} candidate;

static void price(const phase_model *ph, const gt_autopar_device *d, candidate *c)
{
    memset(c->exposed, 0, sizeof c->exposed);
    memset(c->inflight, 0, sizeof c->inflight);
    c->gather_s = 0;
    c->n_buckets = 0;
    for (int p = 0; p < 2; p++) {
        buckets k;
        make_buckets(&ph[p], c->cap_mb * MIB, d, &k);
        for (int j = 0; j < k.n; j++)
            c->gather_s += k.gather_s[j];
        c->n_buckets += k.n;
        for (int dep = 1; dep <= MAX_PRICED; dep++) {
            c->exposed[dep] += exposed_s(&k, dep);
            double m = inflight_b(&k, dep);
            if (m > c->inflight[dep]) c->inflight[dep] = m;
        }
        buckets_free(&k);
    }
}

/* The candidate caps, ascending, 0 (one bucket per unit) last: powers of two MiB from the
 * largest gathered tensor of a block (a smaller cap only parts the small tensors: more launches,
 * the same peak) up to below the largest unit. */
static int ladder(const phase_model *ph, double fixed_mb, double *caps)
{
    if (fixed_mb > 0) {
        caps[0] = fixed_mb;
        return 1;
    }
    double tensor_most[2] = {0, 0}, unit_most = 0; /* [0]: blocks', [1]: any unit's */
    for (int p = 0; p < 2; p++)
        for (int i = 0; i < ph[p].n; i++) {
            double t = 0;
            for (int m = 0; m < ph[p].u[i].n_members; m++) {
                double b = ph[p].u[i].member_b[m];
                if (ph[p].u[i].unit >= 0 && b > tensor_most[0]) tensor_most[0] = b;
                if (b > tensor_most[1]) tensor_most[1] = b;
                t += b;
            }
            if (t > unit_most) unit_most = t;
        }
    double least = tensor_most[0] > 0 ? tensor_most[0] : tensor_most[1];
    int n = 0;
    if (least > 0)
        for (double mb = exp2(ceil(log2(least / MIB))); mb * MIB < unit_most && n < 60; mb *= 2)
            caps[n++] = mb;
    caps[n++] = 0;
    return n;
}

gt_status gt_autopar_pick_policy(const gt_graph *spmd, const gt_sym_binding *b,
                                 const gt_autopar_device *d, double allowance_b, double cap_mb,
                                 int depth, gt_autopar_policy *out, gt_error *err)
{
    memset(out, 0, sizeof *out);
    out->allowance_b = allowance_b;
    out->cap_fixed = cap_mb > 0, out->depth_fixed = depth > 0;
    out->bucket_cap_mb = cap_mb > 0 ? cap_mb : 0;
    out->prefetch_depth = depth > 0 ? depth : 1;
    out->why = "hides";
    phase_model ph[2];
    gt_status st = read_phases(spmd, b, d, ph, err);
    for (int p = 0; p < 2 && st == GT_OK; p++)
        for (int i = 0; i < ph[p].n; i++) {
            out->compute_s += ph[p].u[i].compute_s;
            out->has_fsdp |= ph[p].u[i].n_members > 0;
        }
    if (st != GT_OK || !out->has_fsdp) {
        phases_free(ph);
        return st;
    }
    double caps[64];
    int nc = ladder(ph, cap_mb, caps);
    candidate *cs = gt_xcalloc((size_t)nc, sizeof *cs);
    for (int i = 0; i < nc; i++) {
        cs[i].cap_mb = caps[i];
        price(ph, d, &cs[i]);
    }
    int lo = depth > 0 ? (depth < MAX_PRICED ? depth : MAX_PRICED) : 1;
    int hi = depth > 0 ? lo : MAX_DEPTH;
    double eps = HIDDEN_FRACTION * out->compute_s;
    /* preferred: the smallest cap that hides at some depth, the smallest depth that hides there */
    int ci = -1, dep = -1;
    for (int i = 0; i < nc && ci < 0; i++)
        for (int x = lo; x <= hi && ci < 0; x++)
            if (cs[i].exposed[x] <= eps) ci = i, dep = x;
    if (ci < 0) {
        out->why = "exposed";
        ci = nc - 1; /* the largest: fewest latencies */
        dep = lo;
        for (int x = lo; x <= hi; x++)
            if (cs[ci].exposed[x] < cs[ci].exposed[dep]) dep = x;
    }
    if (allowance_b >= 0 && cs[ci].inflight[dep] > allowance_b) {
        out->why = "memory";
        int x = dep;
        while (x > lo && cs[ci].inflight[x] > allowance_b)
            x--;
        if (cs[ci].inflight[x] <= allowance_b) {
            dep = x;
        } else {
            /* at the least depth: the largest cap no larger whose caps below all fit */
            dep = lo;
            int fit = 0;
            while (fit + 1 <= ci && cs[fit + 1].inflight[dep] <= allowance_b &&
                   cs[fit].inflight[dep] <= allowance_b)
                fit++;
            ci = fit;
        }
    }
    out->bucket_cap_mb = cs[ci].cap_mb;
    out->prefetch_depth = depth > 0 ? depth : dep;
    out->n_buckets = cs[ci].n_buckets;
    out->gather_s = cs[ci].gather_s;
    out->exposed_s = cs[ci].exposed[dep];
    out->inflight_b = cs[ci].inflight[dep];
    free(cs);
    phases_free(ph);
    return GT_OK;
}

void gt_autopar_policy_format(const gt_autopar_policy *p, char *buf, size_t len)
{
    if (!p->has_fsdp) {
        snprintf(buf, len,
                 "no FSDP all-gathers in this layout: bucket cap and prefetch depth "
                 "as configured");
        return;
    }
    char cap[64], allow[64] = "no budget";
    if (p->bucket_cap_mb > 0)
        snprintf(cap, sizeof cap, "%g MiB", p->bucket_cap_mb);
    else
        snprintf(cap, sizeof cap, "0 (one bucket per block)");
    if (p->allowance_b >= 0) snprintf(allow, sizeof allow, "%.3f MiB left", p->allowance_b / MIB);
    static const char *const why[] = {"hides",   "hides the gathers",
                                      "exposed", "nothing hides them",
                                      "memory",  "cut to fit the budget"};
    const char *w = p->why;
    for (int k = 0; k < 6; k += 2)
        if (!strcmp(p->why, why[k])) w = why[k + 1];
    snprintf(buf, len,
             "fsdp_bucket_cap_mb %s (%s), fsdp_prefetch_depth %d (%s): %s; %d buckets, gathers "
             "%.3f ms, exposed %.3f ms of %.3f ms compute, %.3f MiB gathered in flight (%s)",
             cap, p->cap_fixed ? "yours" : "chosen", p->prefetch_depth,
             p->depth_fixed ? "yours" : "chosen", w, p->n_buckets, 1e3 * p->gather_s,
             1e3 * p->exposed_s, 1e3 * p->compute_s, p->inflight_b / MIB, allow);
}
