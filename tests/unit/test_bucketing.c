/* test_bucketing.c — the FSDP passes (fsdp_bucketing, reduce_scatter_narrow, fsdp_reorder) and the
 * collective report.
 *
 * Graphs: a small FSDP step built by hand the way parallelize emits it (each parameter
 * all-gathered right before its use, each gradient reduce-scattered right after it is produced,
 * tagged fsdp.*), over a mesh of dp_shard 2 (or dp_replicate 2 x dp_shard 2 for HSDP, where the
 * gradients are then all-reduced over dp_replicate), with bf16 casts in front of the forward
 * gathers and gathers again in the backward (reshard after forward); and, when gt_parallelize is
 * there, the parallelized test_tiny step graph.
 *
 * References, independent of the passes:
 *   - counts: the number of collectives per (tag, kind) after bucketing equals the number of
 *     buckets the construction has (blocks, embeddings, the rest; per phase), and with a byte
 *     cap the number of pieces computed from the members' sizes;
 *   - values: every variant (bucketed, reordered, both, capped) and the original run on every
 *     rank of an in-process simulation (one thread per rank, collectives summing in rank order
 *     through gt_comm_sum_ordered) with the same inputs: every output of every rank bitwise
 *     equal, through the eager executor and the compiled program; with gradients rounded to bf16
 *     and widened again before their reduce-scatter (as mixed precision makes them), the same for
 *     reduce_scatter_narrow after bucketing and alone, which must leave every reduce-scatter
 *     reading bf16 into f32;
 *   - order: gt_graph_verify (topological), the gather start of bucket i+1 before the first
 *     matmul of bucket i in forward and backward, and gt_pass_collectives reporting overlap for
 *     them (nodes and FLOPs recounted here from the node order); the last gradient
 *     reduce-scatter waited for after the optimizer nodes that do not need it;
 *   - packing: a bucket's concat tree (at most GT_MAX_IN inputs per node) copies each member once
 *     and, past GT_MAX_IN members, only the cheapest contiguous run of members twice: the bytes
 *     its concat nodes write equal the bucket's plus that run's, computed here from the leaves. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "distributed/comm_test.h"
#include "fqn_units.h"
#include "graphtrain/gt_build.h"
#include "graphtrain/gt_config.h"
#include "graphtrain/gt_exec.h"
#include "graphtrain/gt_flops.h"
#include "graphtrain/gt_optim.h"
#include "graphtrain/gt_pass.h"
#include "graphtrain/gt_program.h"
#include "graphtrain/gt_train.h"
#include "gt_test.h"
#include "passes/pass_internal.h"

#define D 8
#define V 16
#define T 6 /* tokens per rank */
#define MAX_RANKS 4

typedef struct {
    int layers;
    bool cast;       /* forward gathers move bf16 casts of the parameters */
    bool reshard;    /* the backward gathers again */
    bool hsdp;       /* dp_replicate 2 x dp_shard 2; gradients all-reduced over dp_replicate */
    bool bf16_grads; /* gradients cast to bf16 and back to f32 before their reduce-scatter */
} spec;

/* ---------------------------------------------------------------- the hand-built FSDP step */

static gt_value_id collective(gt_graph *g, gt_op op, gt_value_id x, int mesh_dim, const char *tag)
{
    gt_value_id s = comm_test_start(g, op, x, mesh_dim, g->mesh.size[mesh_dim]);
    gt_graph_add_tag(g, g->n_nodes - 1, tag);
    gt_value_id in[2] = {s, x};
    gt_value_id w = gt_graph_add_node(g, GT_OP_WAIT, in, 2, NULL, NULL);
    gt_graph_add_tag(g, g->n_nodes - 1, tag);
    return w;
}

static gt_value_id gather(gt_graph *g, const spec *sp, gt_value_id p)
{
    if (!sp->cast || g->cur_phase != GT_PHASE_FORWARD)
        return collective(g, GT_OP_ALL_GATHER_START, p, 1, GT_FSDP_TAG_ALL_GATHER);
    gt_value_id c = gt_cast(g, p, GT_BF16);
    return gt_cast(g, collective(g, GT_OP_ALL_GATHER_START, c, 1, GT_FSDP_TAG_ALL_GATHER), GT_F32);
}

static gt_value_id reduce_grad(gt_graph *g, const spec *sp, gt_value_id grad)
{
    if (sp->bf16_grads) grad = gt_cast(g, gt_cast(g, grad, GT_BF16), GT_F32);
    gt_value_id r = collective(g, GT_OP_REDUCE_SCATTER_START, grad, 1, GT_FSDP_TAG_REDUCE_SCATTER);
    if (sp->hsdp) r = collective(g, GT_OP_ALL_REDUCE_START, r, 0, GT_FSDP_TAG_ALL_REDUCE);
    return r;
}

typedef struct {
    gt_value_id p, grad;
    char fqn[64];
} param;

static gt_value_id add_param(gt_graph *g, param *ps, int *np, const char *fqn, int64_t rows,
                             int64_t cols)
{
    gt_expr dims[2] = {gt_c(g, rows / 2), gt_c(g, cols)};
    param *p = &ps[(*np)++];
    snprintf(p->fqn, sizeof p->fqn, "%s", fqn);
    p->p = gt_graph_add_input(g, GT_IN_PARAM, fqn, GT_F32, cols ? 2 : 1, dims);
    p->grad = GT_NONE;
    return p->p;
}

static void set_fqn(gt_graph *g, const char *fmt, int l)
{
    char buf[64];
    snprintf(buf, sizeof buf, fmt, l);
    gt_graph_set_fqn(g, buf);
}

static gt_graph *build_step(const spec *sp)
{
    gt_graph *g = gt_graph_new();
    comm_test_set_mesh(g, sp->hsdp ? 2 : 1, 2, 1);
    int L = sp->layers, np = 0;
    param ps[64];
    gt_expr tdim = gt_c(g, T);
    gt_value_id ids = gt_graph_add_input(g, GT_IN_INPUT, "tokens", GT_I32, 1, &tdim);
    gt_value_id emb = add_param(g, ps, &np, "tok_embeddings.weight", V, D);
    gt_value_id nw[8], w1[8], w2[8], a[8], y[8], z[8], w1f[8], w2f[8];
    char name[64];
    for (int l = 0; l < L; l++) {
        snprintf(name, sizeof name, "layers.%d.attention_norm.weight", l);
        nw[l] = add_param(g, ps, &np, name, D, 0);
        snprintf(name, sizeof name, "layers.%d.feed_forward.w1.weight", l);
        w1[l] = add_param(g, ps, &np, name, D, D);
        snprintf(name, sizeof name, "layers.%d.feed_forward.w2.weight", l);
        w2[l] = add_param(g, ps, &np, name, D, D);
    }
    gt_value_id nf = add_param(g, ps, &np, "norm.weight", D, 0);
    gt_value_id ow = add_param(g, ps, &np, "output.weight", V, D);

    /* forward */
    gt_graph_set_fqn(g, "tok_embeddings");
    gt_value_id h = gt_embedding(g, gather(g, sp, emb), ids);
    for (int l = 0; l < L; l++) {
        set_fqn(g, "layers.%d.attention_norm", l);
        a[l] = gt_rms_norm(g, h, gather(g, sp, nw[l]), 1e-5);
        set_fqn(g, "layers.%d.feed_forward.w1", l);
        w1f[l] = gather(g, sp, w1[l]);
        y[l] = gt_matmul(g, a[l], w1f[l], false, true);
        set_fqn(g, "layers.%d.feed_forward", l);
        z[l] = gt_unary(g, GT_OP_SILU, y[l]);
        set_fqn(g, "layers.%d.feed_forward.w2", l);
        w2f[l] = gather(g, sp, w2[l]);
        gt_value_id o = gt_matmul(g, z[l], w2f[l], false, true);
        set_fqn(g, "layers.%d", l);
        h = gt_add(g, h, o);
    }
    gt_graph_set_fqn(g, "norm");
    gt_value_id hn = gt_rms_norm(g, h, gather(g, sp, nf), 1e-5);
    gt_graph_set_fqn(g, "output");
    gt_value_id owf = gather(g, sp, ow);
    gt_value_id logits = gt_matmul(g, hn, owf, false, true);
    gt_graph_set_fqn(g, "loss");
    int all[2] = {0, 1};
    gt_value_id loss = gt_reduce(g, GT_OP_MEAN, gt_mul(g, logits, logits), 2, all, false);
    gt_graph_add_output(g, GT_OUT_LOSS, "loss", loss);

    /* backward (stand-in gradients: the passes only care where they come from) */
    g->cur_phase = GT_PHASE_BACKWARD;
    gt_graph_set_fqn(g, "output");
    gt_value_id dlog = gt_scale(g, logits, 2.0 / (T * V));
    ps[np - 1].grad = reduce_grad(g, sp, gt_matmul(g, dlog, hn, true, false));
    gt_value_id owb = sp->reshard ? gather(g, sp, ow) : owf;
    gt_value_id dh = gt_matmul(g, dlog, owb, false, false);
    gt_graph_set_fqn(g, "norm");
    int rows[1] = {0};
    ps[np - 2].grad =
        reduce_grad(g, sp, gt_reduce(g, GT_OP_SUM, gt_mul(g, dh, hn), 1, rows, false));
    for (int l = L - 1; l >= 0; l--) {
        int base = 1 + 3 * l;
        set_fqn(g, "layers.%d.feed_forward.w2", l);
        gt_value_id w2b = sp->reshard ? gather(g, sp, w2[l]) : w2f[l];
        ps[base + 2].grad = reduce_grad(g, sp, gt_matmul(g, dh, z[l], true, false));
        gt_value_id dz = gt_matmul(g, dh, w2b, false, false);
        set_fqn(g, "layers.%d.feed_forward", l);
        gt_value_id dy = gt_silu_backward(g, y[l], dz);
        set_fqn(g, "layers.%d.feed_forward.w1", l);
        gt_value_id w1b = sp->reshard ? gather(g, sp, w1[l]) : w1f[l];
        ps[base + 1].grad = reduce_grad(g, sp, gt_matmul(g, dy, a[l], true, false));
        gt_value_id da = gt_matmul(g, dy, w1b, false, false);
        set_fqn(g, "layers.%d.attention_norm", l);
        ps[base].grad =
            reduce_grad(g, sp, gt_reduce(g, GT_OP_SUM, gt_mul(g, da, a[l]), 1, rows, false));
        set_fqn(g, "layers.%d", l);
        dh = gt_add(g, dh, da);
    }
    gt_graph_set_fqn(g, "tok_embeddings");
    ps[0].grad = reduce_grad(g, sp, gt_embedding_backward(g, ids, dh, gt_c(g, V)));

    /* optimizer: plain SGD reading the reduced gradients */
    g->cur_phase = GT_PHASE_OPTIMIZER;
    for (int k = 0; k < np; k++) {
        gt_graph_set_fqn(g, ps[k].fqn);
        gt_graph_add_output(g, GT_OUT_GRAD, ps[k].fqn, ps[k].grad);
        gt_value_id upd = gt_sub(g, ps[k].p, gt_scale(g, ps[k].grad, 0.01));
        gt_graph_add_output(g, GT_OUT_PARAM_UPDATE, ps[k].fqn, upd);
    }
    gt_graph_set_fqn(g, NULL);
    EXPECT(g->err.code == GT_OK, "building the FSDP step: %s", g->err.msg);
    gt_error err = {0};
    EXPECT_OK(gt_graph_verify(g, &err), &err);
    gt_test_units_from_fqns(g);
    return g;
}

/* ---------------------------------------------------------------- passes */

/* Runs the named passes of the pipeline (the others disabled), verifying after each. */
static void run_passes(gt_graph *g, const char *a, const char *b, int64_t cap)
{
    gt_error err = {0};
    int n;
    const gt_pass_info *reg = gt_pass_registry(&n);
    char *disable[GT_PASS_MAX];
    int nd = 0;
    for (int k = 0; k < n; k++)
        if (!(a && strcmp(reg[k].name, a) == 0) && !(b && strcmp(reg[k].name, b) == 0))
            disable[nd++] = (char *)reg[k].name;
    gt_pass_options o = {.verify_each = true,
                         .quiet = true,
                         .disable = disable,
                         .n_disable = nd,
                         .bucket_cap_bytes = cap};
    EXPECT_OK(gt_pass_run_pipeline(g, &o, NULL, &err), &err);
}

static gt_graph *variant(const gt_graph *g0, const char *a, const char *b, int64_t cap)
{
    gt_graph *g = gt_graph_copy(g0);
    run_passes(g, a, b, cap);
    return g;
}

/* Collectives with FSDP tag `tag` (index) and op `op`, by phase (-1: any). */
static int count_collectives(const gt_graph *g, int tag, gt_op op, int phase)
{
    int c = 0;
    for (gt_node_id n = 0; n < g->n_nodes; n++) {
        const gt_node *nd = &g->nodes[n];
        if (nd->op != op || !gt_node_has_tag(g, nd, gt_pass_fsdp_tags[tag])) continue;
        c += phase < 0 || nd->phase == phase;
    }
    return c;
}

static int count_op(const gt_graph *g, gt_op op)
{
    int c = 0;
    for (gt_node_id n = 0; n < g->n_nodes; n++)
        c += g->nodes[n].op == op;
    return c;
}

/* ---------------------------------------------------------------- in-process ranks */

/* A barrier that a failing rank can break, so that a bug fails the test instead of hanging it. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int size, arrived;
    unsigned generation;
    bool *broken; /* shared by every group of the simulation */
} sim_barrier;

static bool sim_barrier_wait(sim_barrier *b)
{
    pthread_mutex_lock(&b->mu);
    unsigned gen = b->generation;
    if (++b->arrived == b->size) {
        b->arrived = 0;
        b->generation++;
        pthread_cond_broadcast(&b->cv);
    } else {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += 60;
        while (gen == b->generation && !*b->broken)
            if (pthread_cond_timedwait(&b->cv, &b->mu, &until) != 0) *b->broken = true;
    }
    bool ok = !*b->broken;
    pthread_mutex_unlock(&b->mu);
    return ok;
}

typedef struct {
    sim_barrier bar;
    const gt_tensor *in[MAX_RANKS];
} sim_group;

static gt_status sim_start(gt_comm *c, gt_coll_kind kind, const gt_tensor *in, gt_tensor *out,
                           int root, gt_comm_request *req, gt_error *err)
{
    (void)root, (void)req;
    sim_group *grp = c->impl;
    grp->in[c->rank] = in;
    if (!sim_barrier_wait(&grp->bar))
        return gt_error_set(err, GT_ERR_INTERNAL, "simulated %s: another rank failed", c->name);
    gt_status st = GT_OK;
    size_t nb = gt_tensor_nbytes(in);
    int64_t numel = gt_tensor_numel(in);
    const void *src[MAX_RANKS];
    switch (kind) {
    case GT_COLL_ALL_GATHER:
        for (int r = 0; r < c->size; r++)
            memcpy((char *)out->data + (size_t)r * nb, grp->in[r]->data, nb);
        break;
    case GT_COLL_REDUCE_SCATTER: {
        int64_t block = numel / c->size;
        size_t es = gt_dtype_size(in->dtype);
        for (int r = 0; r < c->size; r++)
            src[r] = (const char *)grp->in[r]->data + (size_t)(c->rank * block) * es;
        st = gt_comm_sum_ordered(in->dtype, out->dtype, block, src, c->size, out->data, err);
        break;
    }
    case GT_COLL_ALL_TO_ALL: /* block r of the output: rank r's block c->rank */
        for (int r = 0; r < c->size; r++)
            memcpy((char *)out->data + (size_t)r * (nb / c->size),
                   (const char *)grp->in[r]->data + (size_t)c->rank * (nb / c->size), nb / c->size);
        break;
    case GT_COLL_ALL_REDUCE:
        for (int r = 0; r < c->size; r++)
            src[r] = grp->in[r]->data;
        st = gt_comm_sum_ordered(in->dtype, out->dtype, numel, src, c->size, out->data, err);
        break;
    default:
        st = gt_error_set(err, GT_ERR_UNSUPPORTED, "simulated communicator: %s",
                          gt_coll_kind_name(kind));
    }
    /* nobody may overwrite or free an input before every rank has read it */
    if (!sim_barrier_wait(&grp->bar) && st == GT_OK)
        st = gt_error_set(err, GT_ERR_INTERNAL, "simulated %s: another rank failed", c->name);
    return st;
}

static gt_status sim_wait(gt_comm *c, gt_comm_request *req, gt_error *err)
{
    (void)c, (void)req, (void)err;
    return GT_OK;
}

static void sim_destroy(gt_comm *c)
{
    free(c);
}

static const gt_comm_vtable sim_vtable = {
    .name = "sim", .start = sim_start, .wait = sim_wait, .destroy = sim_destroy};

typedef struct {
    const gt_graph *g;
    const gt_sym_binding *binding;
    bool program;
    int rank;
    gt_comm *comms[GT_MESH_MAX_DIMS];
    gt_tensor *inputs, *outputs;
    bool *broken;
    gt_status st;
    gt_error err;
} rank_job;

static void *rank_main(void *arg)
{
    rank_job *j = arg;
    gt_error *err = &j->err;
    if (!j->program) {
        j->st = gt_eager_run_comms(j->g, j->binding, j->inputs, j->comms, j->outputs, err);
    } else {
        gt_program *p = NULL;
        j->st = gt_program_build(j->g, j->binding, &p, err);
        if (j->st == GT_OK) j->st = gt_program_set_comms(p, j->comms, err);
        if (j->st == GT_OK) j->st = gt_program_run(p, j->inputs, j->outputs, err);
        if (p) gt_program_free(p);
    }
    if (j->st != GT_OK) *j->broken = true; /* the other ranks' barriers give up */
    return NULL;
}

/* What every simulated rank runs on: its symbol binding and its inputs. */
typedef struct {
    int n_ranks;
    gt_sym_binding binding[MAX_RANKS];
    gt_sym_binding_entry entries[MAX_RANKS][8];
    gt_tensor *inputs[MAX_RANKS];
    int n_inputs;
} sim_data;

/* Each rank's inputs: deterministic, different per rank; ids below id_range; AdamW's scalars
 * and second moments kept in their valid range. */
static void make_inputs(const gt_graph *g, sim_data *d, int64_t id_range)
{
    gt_error err = {0};
    d->n_inputs = g->n_inputs;
    for (int r = 0; r < d->n_ranks; r++) {
        d->inputs[r] = calloc((size_t)g->n_inputs + 1, sizeof(gt_tensor));
        for (int k = 0; k < g->n_inputs; k++) {
            int64_t shape[GT_MAX_DIMS];
            gt_value_id v = g->inputs[k].value;
            const gt_type *t = gt_value_type(g, v);
            const char *name = gt_graph_str(g, g->inputs[k].fqn);
            EXPECT_OK(gt_graph_eval_shape(g, v, &d->binding[r], shape, &err), &err);
            gt_tensor *x = &d->inputs[r][k];
            EXPECT_OK(gt_tensor_alloc(x, t->dtype, t->ndim, shape, &err), &err);
            for (int64_t i = 0; i < gt_tensor_numel(x); i++) {
                int64_t id = (i * 5 + r * 3 + k) % id_range;
                if (strcmp(name, "positions") == 0) /* packed documents of 5 tokens */
                    ((int64_t *)x->data)[i] = i % shape[1] % 5;
                else if (t->dtype == GT_I32)
                    ((int32_t *)x->data)[i] = (int32_t)id;
                else if (t->dtype == GT_I64)
                    ((int64_t *)x->data)[i] = id;
                else if (strcmp(name, "optim.scalars") == 0)
                    gt_tensor_set_f32(x, i, i == 0 ? 1e-3f : i == 1 ? 0.1f : 0.05f);
                else if (strncmp(name, "optim.exp_avg_sq.", 17) == 0)
                    gt_tensor_set_f32(x, i, (float)(i % 5) * 0.01f);
                else
                    gt_tensor_set_f32(x, i, (float)((i * 37 + k * 11 + r * 7) % 23) / 16.0f - 0.7f);
            }
        }
    }
}

static void free_inputs(sim_data *d)
{
    for (int r = 0; r < d->n_ranks; r++) {
        for (int k = 0; k < d->n_inputs; k++)
            gt_tensor_free(&d->inputs[r][k]);
        free(d->inputs[r]);
    }
}

/* Runs g on every simulated rank; out[r] gets rank r's outputs (caller frees). */
static bool simulate(const gt_graph *g, const sim_data *d, bool program, gt_tensor **out)
{
    int R = d->n_ranks;
    bool broken = false;
    /* groups: dp_shard pairs {2q, 2q+1}; with HSDP dp_replicate pairs {s, s+2} */
    sim_group groups[4];
    int n_groups = R == 4 ? 4 : 1;
    for (int k = 0; k < n_groups; k++) {
        memset(&groups[k], 0, sizeof groups[k]);
        pthread_mutex_init(&groups[k].bar.mu, NULL);
        pthread_cond_init(&groups[k].bar.cv, NULL);
        groups[k].bar.size = 2;
        groups[k].bar.broken = &broken;
    }
    rank_job jobs[MAX_RANKS];
    pthread_t th[MAX_RANKS];
    for (int r = 0; r < R; r++) {
        rank_job *j = &jobs[r];
        memset(j, 0, sizeof *j);
        j->g = g, j->program = program, j->rank = r, j->broken = &broken;
        j->binding = &d->binding[r];
        j->inputs = d->inputs[r];
        j->outputs = calloc((size_t)g->n_outputs + 1, sizeof(gt_tensor));
        int rep = r / 2, shard = r % 2;
        for (int dim = 0; dim < 2; dim++) {
            if (dim == 0 && R != 4) continue;
            gt_comm *c = calloc(1, sizeof *c);
            c->vt = &sim_vtable;
            c->size = 2;
            c->rank = dim == 1 ? shard : rep;
            c->impl = &groups[dim == 1 ? rep : 2 + shard];
            snprintf(c->name, sizeof c->name, "sim dim %d group %d", dim, dim == 1 ? rep : shard);
            j->comms[dim] = c;
        }
        pthread_create(&th[r], NULL, rank_main, j);
    }
    bool ok = true;
    for (int r = 0; r < R; r++) {
        pthread_join(th[r], NULL);
        EXPECT(jobs[r].st == GT_OK, "rank %d (%s): %s", r, program ? "program" : "eager",
               jobs[r].err.msg);
        ok &= jobs[r].st == GT_OK;
        for (int dim = 0; dim < GT_MESH_MAX_DIMS; dim++)
            if (jobs[r].comms[dim]) gt_comm_destroy(jobs[r].comms[dim]);
        out[r] = jobs[r].outputs;
    }
    for (int k = 0; k < n_groups; k++) {
        pthread_mutex_destroy(&groups[k].bar.mu);
        pthread_cond_destroy(&groups[k].bar.cv);
    }
    return ok;
}

static void free_outputs(const gt_graph *g, gt_tensor **out, int R)
{
    for (int r = 0; r < R; r++) {
        for (int k = 0; k < g->n_outputs; k++)
            gt_tensor_free(&out[r][k]);
        free(out[r]);
    }
}

/* Every output of every rank of `g` bitwise equal to those of `ref` (same inputs d). */
static void expect_same_results_on(const gt_graph *ref, const gt_graph *g, const sim_data *dp,
                                   const char *what)
{
    const sim_data *d = dp;
    int R = d->n_ranks;
    for (int program = 0; program < 2; program++) {
        gt_tensor *a[MAX_RANKS], *b[MAX_RANKS];
        bool ok = simulate(ref, d, program, a);
        ok &= simulate(g, d, program, b);
        EXPECT(ref->n_outputs == g->n_outputs, "%s: output count", what);
        int bad = 0;
        for (int r = 0; ok && r < R; r++)
            for (int k = 0; k < ref->n_outputs; k++) {
                size_t na = gt_tensor_nbytes(&a[r][k]), nb = gt_tensor_nbytes(&b[r][k]);
                bool same = na == nb && na > 0 && memcmp(a[r][k].data, b[r][k].data, na) == 0;
                if (!same && bad++ < 3)
                    fprintf(stderr, "%s (%s): rank %d output %d (%s %s) differs\n", what,
                            program ? "program" : "eager", r, k,
                            gt_output_kind_name((gt_output_kind)ref->outputs[k].kind),
                            gt_graph_str(ref, ref->outputs[k].fqn));
            }
        EXPECT(ok && bad == 0, "%s (%s): %d outputs differ", what, program ? "program" : "eager",
               bad);
        free_outputs(ref, a, R);
        free_outputs(g, b, R);
    }
}

/* The same for the hand-built step: no symbols, R ranks. */
static void expect_same_results(const gt_graph *ref, const gt_graph *g, int R, const char *what)
{
    sim_data d;
    memset(&d, 0, sizeof d);
    d.n_ranks = R;
    make_inputs(ref, &d, V);
    expect_same_results_on(ref, g, &d, what);
    free_inputs(&d);
}

/* ---------------------------------------------------------------- tests */

/* Sum over the starts of (tag, op, phase) of the larger of input and output bytes. */
static int64_t collective_bytes(const gt_graph *g, int tag, gt_op op, int phase)
{
    int64_t total = 0;
    for (gt_node_id n = 0; n < g->n_nodes; n++) {
        const gt_node *nd = &g->nodes[n];
        if (nd->op != op || !gt_node_has_tag(g, nd, gt_pass_fsdp_tags[tag])) continue;
        if (phase >= 0 && nd->phase != phase) continue;
        int64_t b[2];
        for (int k = 0; k < 2; k++) {
            const gt_type *t = gt_value_type(g, k ? nd->out[0] : nd->in[0]);
            b[k] = (int64_t)gt_dtype_size(t->dtype);
            for (int d = 0; d < t->ndim; d++) {
                int64_t v = 0;
                gt_sym_is_const(g->sym, t->dims[d], &v);
                b[k] *= v;
            }
        }
        total += b[0] > b[1] ? b[0] : b[1];
    }
    return total;
}

static void test_bucketing_counts(const spec *sp)
{
    int L = sp->layers, R = sp->hsdp ? 4 : 2;
    gt_graph *g0 = build_step(sp);
    /* before: one collective per parameter use */
    EXPECT(count_collectives(g0, 0, GT_OP_ALL_GATHER_START, GT_PHASE_FORWARD) == 3 * L + 3,
           "forward gathers before");
    EXPECT(count_collectives(g0, 1, GT_OP_REDUCE_SCATTER_START, -1) == 3 * L + 3,
           "reduce-scatters before");
    gt_graph *g = variant(g0, "fsdp_bucketing", NULL, 0);
    /* forward: one per block, tok_embeddings alone, norm + output together */
    int fwd = count_collectives(g, 0, GT_OP_ALL_GATHER_START, GT_PHASE_FORWARD);
    EXPECT(fwd == L + 2, "forward gathers %d, want %d", fwd, L + 2);
    if (sp->reshard) {
        /* backward: w2 + w1 per block, output alone */
        int bwd = count_collectives(g, 0, GT_OP_ALL_GATHER_START, GT_PHASE_BACKWARD);
        EXPECT(bwd == L + 1, "backward gathers %d, want %d", bwd, L + 1);
    }
    int rs = count_collectives(g, 1, GT_OP_REDUCE_SCATTER_START, -1);
    EXPECT(rs == L + 2, "reduce-scatters %d, want %d", rs, L + 2);
    if (sp->hsdp) {
        int ar = count_collectives(g, 2, GT_OP_ALL_REDUCE_START, -1);
        EXPECT(ar == L + 2, "all-reduces %d, want %d", ar, L + 2);
    }
    int starts = count_op(g, GT_OP_ALL_GATHER_START) + count_op(g, GT_OP_REDUCE_SCATTER_START) +
                 count_op(g, GT_OP_ALL_REDUCE_START);
    EXPECT(count_op(g, GT_OP_WAIT) == starts, "one wait per start");
    /* the same bytes move, per tag and phase */
    for (int ph = 0; ph < 2; ph++)
        EXPECT(collective_bytes(g, 0, GT_OP_ALL_GATHER_START, ph) ==
                   collective_bytes(g0, 0, GT_OP_ALL_GATHER_START, ph),
               "gathered bytes, phase %d", ph);
    EXPECT(collective_bytes(g, 1, GT_OP_REDUCE_SCATTER_START, -1) ==
               collective_bytes(g0, 1, GT_OP_REDUCE_SCATTER_START, -1),
           "reduce-scattered bytes");
    /* bucketed collectives say so; the block's fqn is the members' common path */
    int tagged = 0, block_fqn = 0;
    for (gt_node_id n = 0; n < g->n_nodes; n++) {
        const gt_node *nd = &g->nodes[n];
        if (nd->op != GT_OP_ALL_GATHER_START || !gt_pass_is_bucketed(g, nd)) continue;
        tagged++;
        block_fqn += nd->unit >= 0;
    }
    EXPECT(tagged == (sp->reshard ? 2 * L + 1 : L + 1), "bucketed gathers %d", tagged);
    EXPECT(block_fqn == (sp->reshard ? 2 * L : L), "block fqns %d", block_fqn);
    /* running it again changes nothing */
    gt_graph *again = variant(g, "fsdp_bucketing", NULL, 0);
    EXPECT(again->n_nodes == g->n_nodes, "second bucketing: %d -> %d nodes", g->n_nodes,
           again->n_nodes);
    expect_same_results(g0, g, R, sp->hsdp ? "bucketed (hsdp)" : "bucketed");
    gt_graph_free(again);
    gt_graph_free(g);
    gt_graph_free(g0);
}

/* Byte cap 300: reduce-scatter members (f32, unsharded sizes) per block in backward order w2 256,
 * w1 256, attention_norm 32 -> {w2}, {w1, norm}; the rest: output 512, norm 32 -> two alone;
 * forward gathers (bf16) per block 16 + 128 + 128 = 272 -> one; norm 16 + output 256 -> one;
 * backward gathers (f32) w2 256, w1 256 -> two alone. */
static void test_bucketing_cap(void)
{
    spec sp = {.layers = 2, .cast = true, .reshard = true};
    int L = sp.layers;
    gt_graph *g0 = build_step(&sp);
    gt_graph *g = variant(g0, "fsdp_bucketing", NULL, 300);
    int rs = count_collectives(g, 1, GT_OP_REDUCE_SCATTER_START, -1);
    EXPECT(rs == 2 * L + 3, "capped reduce-scatters %d, want %d", rs, 2 * L + 3);
    int fwd = count_collectives(g, 0, GT_OP_ALL_GATHER_START, GT_PHASE_FORWARD);
    EXPECT(fwd == L + 2, "capped forward gathers %d, want %d", fwd, L + 2);
    int bwd = count_collectives(g, 0, GT_OP_ALL_GATHER_START, GT_PHASE_BACKWARD);
    EXPECT(bwd == 2 * L + 1, "capped backward gathers %d, want %d", bwd, 2 * L + 1);
    expect_same_results(g0, g, 2, "bucketed with a cap");
    gt_graph_free(g);
    gt_graph_free(g0);
}

/* Position of the first node of `phase` that is op and whose fqn is in bucket b; -1 if none. */
static gt_node_id first_node(const gt_graph *g, int phase, gt_op op, int64_t b)
{
    for (gt_node_id n = 0; n < g->n_nodes; n++) {
        const gt_node *nd = &g->nodes[n];
        if (nd->phase == phase && nd->op == op && nd->unit == b) return n;
    }
    return -1;
}

/* First (or last) all-gather start of `phase` in bucket b; -1 if none. */
static gt_node_id gather_start(const gt_graph *g, int phase, int64_t b, bool last)
{
    gt_node_id found = -1;
    for (gt_node_id n = 0; n < g->n_nodes; n++) {
        const gt_node *nd = &g->nodes[n];
        if (nd->op == GT_OP_ALL_GATHER_START && nd->phase == phase && nd->unit == b) {
            found = n;
            if (!last) break;
        }
    }
    return found;
}

/* Overlap of the collective starting at s, recounted from the node order: non-collective nodes
 * between start and wait, and 2*M*N*K per matmul between them. */
static void check_overlap(const gt_graph *g, const gt_sym_binding *b, const gt_collective_info *c,
                          int32_t n, gt_node_id s, const char *what)
{
    const gt_collective_info *info = NULL;
    for (int32_t k = 0; k < n; k++)
        if (c[k].start == s) info = &c[k];
    EXPECT(info != NULL, "%s: start %d not reported", what, s);
    if (!info) return;
    int32_t nodes = 0;
    double flops = 0;
    for (gt_node_id x = s + 1; x < info->wait; x++) {
        const gt_node *nd = &g->nodes[x];
        if (nd->op == GT_OP_WAIT || gt_op_is_collective_start(nd->op)) continue;
        nodes++;
        gt_error err = {0};
        if (nd->op == GT_OP_SDPA || nd->op == GT_OP_SDPA_BACKWARD) {
            /* q [b, hq, s, d], k [b, hkv, t, d] (layout 1: q [b, s, hq, d], k [b, t, hkv, d]):
             * 4*b*hq*s*t*d forward, twice that backward */
            int64_t q[GT_MAX_DIMS], k[GT_MAX_DIMS];
            EXPECT_OK(gt_graph_eval_shape(g, nd->in[0], b, q, &err), &err);
            EXPECT_OK(gt_graph_eval_shape(g, nd->in[1], b, k, &err), &err);
            int64_t t = nd->attrs.i[1] == 1 ? k[1] : k[2];
            flops += (nd->op == GT_OP_SDPA ? 4.0 : 8.0) * (double)(q[0] * q[1] * q[2] * t * q[3]);
        }
        if (nd->op != GT_OP_MATMUL) continue;
        /* out [..., M, N] and K from a: 2*M*N*K per batch element */
        int64_t a[GT_MAX_DIMS], o[GT_MAX_DIMS];
        EXPECT_OK(gt_graph_eval_shape(g, nd->in[0], b, a, &err), &err);
        EXPECT_OK(gt_graph_eval_shape(g, nd->out[0], b, o, &err), &err);
        int na = gt_value_type(g, nd->in[0])->ndim, no = gt_value_type(g, nd->out[0])->ndim;
        double f = 2.0 * (double)a[nd->attrs.i[0] ? na - 2 : na - 1];
        for (int d = 0; d < no; d++)
            f *= (double)o[d];
        flops += f;
    }
    EXPECT(info->overlap_nodes == nodes && nodes > 0, "%s: overlap %d nodes, recounted %d", what,
           info->overlap_nodes, nodes);
    EXPECT(info->overlap_flops == flops && flops > 0, "%s: overlap %g FLOPs, recounted %g", what,
           info->overlap_flops, flops);
}

static void check_prefetch(const gt_graph *g, const gt_sym_binding *b, int L, bool reshard,
                           const char *what)
{
    int32_t n = gt_pass_collectives(g, b, NULL, 0);
    gt_collective_info *c = calloc((size_t)n + 1, sizeof *c);
    EXPECT(gt_pass_collectives(g, b, c, n) == n, "%s: collective count", what);
    /* forward: bucket l+1 is gathered before block l's first matmul, but not before block
     * l-1's (one bucket ahead) */
    for (int l = 0; l < L; l++) {
        int64_t next = l + 1 < L ? l + 1 : GT_UNIT_REST;
        gt_node_id s = gather_start(g, GT_PHASE_FORWARD, next, true);
        gt_node_id mm = first_node(g, GT_PHASE_FORWARD, GT_OP_MATMUL, l);
        EXPECT(s >= 0 && mm >= 0 && s < mm,
               "%s: forward gather of bucket %lld at %d, block %d's "
               "first matmul at %d",
               what, (long long)next, s, l, mm);
        if (l > 0) {
            gt_node_id prev = first_node(g, GT_PHASE_FORWARD, GT_OP_MATMUL, l - 1);
            EXPECT(gather_start(g, GT_PHASE_FORWARD, next, false) > prev,
                   "%s: forward gather of bucket %lld two blocks ahead", what, (long long)next);
        }
        char buf[96];
        snprintf(buf, sizeof buf, "%s: forward gather of bucket %lld", what, (long long)next);
        check_overlap(g, b, c, n, s, buf);
    }
    /* backward: block l-1 gathered before block l's first backward matmul */
    for (int l = L - 1; reshard && l >= 1; l--) {
        gt_node_id s = gather_start(g, GT_PHASE_BACKWARD, l - 1, true);
        gt_node_id mm = first_node(g, GT_PHASE_BACKWARD, GT_OP_MATMUL, l);
        EXPECT(s >= 0 && mm >= 0 && s < mm,
               "%s: backward gather of block %d at %d, block %d's "
               "first backward matmul at %d",
               what, l - 1, s, l, mm);
        char buf[96];
        snprintf(buf, sizeof buf, "%s: backward gather of block %d", what, l - 1);
        check_overlap(g, b, c, n, s, buf);
    }
    /* gradient reduce-scatters overlap the rest of the backward, except the last */
    int rs = 0, exposed = 0;
    for (int32_t k = 0; k < n; k++) {
        if (c[k].op != GT_OP_REDUCE_SCATTER_START) continue;
        rs++;
        exposed += c[k].overlap_nodes == 0;
    }
    EXPECT(rs > 0 && exposed <= 1, "%s: %d of %d reduce-scatters overlap nothing", what, exposed,
           rs);
    free(c);
}

static void test_reorder(const spec *sp)
{
    int L = sp->layers, R = sp->hsdp ? 4 : 2;
    gt_graph *g0 = build_step(sp);
    gt_graph *both = variant(g0, "fsdp_bucketing", "fsdp_reorder", 0);
    check_prefetch(both, NULL, L, sp->reshard, "bucketed + reordered");
    expect_same_results(g0, both, R, "bucketed + reordered");
    gt_graph *only = variant(g0, "fsdp_reorder", NULL, 0);
    check_prefetch(only, NULL, L, sp->reshard, "reordered");
    expect_same_results(g0, only, R, "reordered");
    /* reordering twice is reordering once */
    gt_graph *again = variant(both, "fsdp_reorder", NULL, 0);
    bool same = again->n_nodes == both->n_nodes;
    for (gt_node_id n = 0; same && n < both->n_nodes; n++)
        same = again->nodes[n].op == both->nodes[n].op && again->nodes[n].fqn == both->nodes[n].fqn;
    EXPECT(same, "reorder is not idempotent");
    gt_graph_free(again);
    gt_graph_free(only);
    gt_graph_free(both);
    gt_graph_free(g0);
}

/* reduce_scatter_starts that read bf16 into f32, and all of them. */
static int count_widening(const gt_graph *g, int *starts)
{
    int w = 0;
    *starts = 0;
    for (gt_node_id n = 0; n < g->n_nodes; n++) {
        const gt_node *nd = &g->nodes[n];
        if (nd->op != GT_OP_REDUCE_SCATTER_START) continue;
        (*starts)++;
        w += gt_value_type(g, nd->in[0])->dtype == GT_BF16 &&
             gt_value_type(g, nd->out[0])->dtype == GT_F32;
    }
    return w;
}

/* reduce_scatter_narrow after bucketing, and alone (per-tensor reduce-scatters): every
 * reduce-scatter then reads the bf16 gradients, the widening casts are gone, and every rank's
 * outputs keep their bits. */
static void test_narrow(const spec *sp)
{
    int R = sp->hsdp ? 4 : 2;
    gt_graph *g0 = build_step(sp);
    gt_graph *v[2] = {variant(g0, "fsdp_bucketing", "reduce_scatter_narrow", 0),
                      variant(g0, "reduce_scatter_narrow", NULL, 0)};
    const char *what[2] = {sp->hsdp ? "bucketed + narrowed (hsdp)" : "bucketed + narrowed",
                           sp->hsdp ? "narrowed (hsdp)" : "narrowed"};
    for (int k = 0; k < 2; k++) {
        int starts = 0, widening = count_widening(v[k], &starts);
        EXPECT(starts > 0 && widening == starts, "%s: %d of %d reduce-scatters read bf16 into f32",
               what[k], widening, starts);
        EXPECT(count_op(v[k], GT_OP_CAST) + 3 * sp->layers + 3 == count_op(g0, GT_OP_CAST),
               "%s: one widening cast per gradient gone (%d -> %d casts)", what[k],
               count_op(g0, GT_OP_CAST), count_op(v[k], GT_OP_CAST));
        expect_same_results(g0, v[k], R, what[k]);
    }
    gt_graph_free(v[0]);
    gt_graph_free(v[1]);
    gt_graph_free(g0);
}

/* Without a mesh the passes leave the graph alone. */
static void test_no_mesh(void)
{
    spec sp = {.layers = 2, .cast = true, .reshard = true};
    gt_graph *g0 = build_step(&sp);
    g0->mesh.ndim = 0;
    gt_graph *g = variant(g0, "fsdp_bucketing", "fsdp_reorder", 0);
    char *a = graph_text(g0), *b = graph_text(g);
    EXPECT(strcmp(a, b) == 0, "graph without a mesh changed");
    free(a);
    free(b);
    gt_graph_free(g);
    gt_graph_free(g0);
    /* reduce_scatter_narrow too, called directly (the pipeline would skip it) */
    spec sb = {.layers = 2, .cast = true, .bf16_grads = true};
    g0 = build_step(&sb);
    g0->mesh.ndim = 0;
    g = gt_graph_copy(g0);
    gt_error err = {0};
    EXPECT_OK(gt_pass_reduce_scatter_narrow(g, NULL, &err), &err);
    a = graph_text(g0), b = graph_text(g);
    EXPECT(strcmp(a, b) == 0, "reduce_scatter_narrow changed a graph without a mesh");
    free(a);
    free(b);
    gt_graph_free(g);
    gt_graph_free(g0);
}

/* The report: one line per collective, totals equal to the bytes summed here. */
static void test_report(void)
{
    spec sp = {.layers = 2, .cast = true, .reshard = true};
    gt_graph *g0 = build_step(&sp);
    gt_graph *g = variant(g0, "fsdp_bucketing", "fsdp_reorder", 0);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    gt_pass_collective_report(g, NULL, f);
    fclose(f);
    int lines = 0, rows = 0;
    long long ag_bytes = -1;
    int exposed = -1, total = -1;
    for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n")) {
        lines++;
        int pos;
        if (sscanf(line, " %d ->", &pos) == 1) rows++;
        long long b;
        int cnt;
        if (sscanf(line, "total all_gather %d collectives %*f MiB (%lld B)", &cnt, &b) == 2)
            ag_bytes = b;
        sscanf(line, "zero overlap: %d of %d", &exposed, &total);
    }
    int starts = count_op(g, GT_OP_ALL_GATHER_START) + count_op(g, GT_OP_REDUCE_SCATTER_START) +
                 count_op(g, GT_OP_ALL_REDUCE_START);
    EXPECT(rows == starts, "report rows %d, collectives %d", rows, starts);
    EXPECT(total == starts && exposed >= 0 && exposed < starts, "zero overlap %d of %d", exposed,
           total);
    int64_t want = collective_bytes(g, 0, GT_OP_ALL_GATHER_START, -1);
    EXPECT(ag_bytes == want, "all-gather total %lld, want %lld", ag_bytes, (long long)want);
    free(buf);
    gt_graph_free(g);
    gt_graph_free(g0);
}

/* The default pipeline runs both passes on a graph with a mesh; the disable list takes them out
 * by name; a dump directory receives collectives.txt. */
static void test_pipeline(void)
{
    gt_error err = {0};
    spec sp = {.layers = 2, .cast = true, .reshard = true};
    gt_graph *g0 = build_step(&sp);
    gt_graph *g = gt_graph_copy(g0);
    char dir[] = "/tmp/gt_test_bucketing_XXXXXX";
    EXPECT(mkdtemp(dir) != NULL, "mkdtemp");
    gt_pass_options o = {.verify_each = true, .quiet = true, .dump_dir = dir};
    gt_pass_report rep;
    EXPECT_OK(gt_pass_run_pipeline(g, &o, &rep, &err), &err);
    int fsdp_ran = 0;
    for (int k = 0; k < rep.n_run; k++)
        fsdp_ran += strncmp(rep.pass[k].name, "fsdp_", 5) == 0;
    /* the 6 passes of every graph (canonicalize .. dce, fusion), the 2 FSDP ones,
     * reduce_scatter_narrow and ep_overlap (a no-op without chunks) */
    EXPECT(fsdp_ran == 2 && rep.n_run == 10, "with a mesh: %d passes, %d fsdp", rep.n_run, fsdp_ran);
    EXPECT(count_op(g, GT_OP_ALL_GATHER_START) < count_op(g0, GT_OP_ALL_GATHER_START),
           "default pipeline did not bucket");
    char path[256];
    snprintf(path, sizeof path, "%s/collectives.txt", dir);
    FILE *f = fopen(path, "r");
    EXPECT(f != NULL, "no %s", path);
    int rows = 0;
    char line[512];
    while (f && fgets(line, sizeof line, f)) {
        int pos;
        rows += sscanf(line, " %d ->", &pos) == 1;
    }
    if (f) fclose(f);
    int starts = count_op(g, GT_OP_ALL_GATHER_START) + count_op(g, GT_OP_REDUCE_SCATTER_START);
    EXPECT(rows == starts, "collectives.txt rows %d, collectives %d", rows, starts);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    EXPECT(system(cmd) == 0, "rm");

    gt_graph *off = gt_graph_copy(g0);
    char *disable[] = {"fsdp_bucketing", "fsdp_reorder"};
    gt_pass_options o2 = {.verify_each = true, .quiet = true, .disable = disable, .n_disable = 2};
    EXPECT_OK(gt_pass_run_pipeline(off, &o2, NULL, &err), &err);
    EXPECT(count_op(off, GT_OP_ALL_GATHER_START) == count_op(g0, GT_OP_ALL_GATHER_START),
           "disabled bucketing still bucketed");
    EXPECT(gt_pass_find("fsdp_bucketing") && gt_pass_find("fsdp_reorder"), "registered");

    /* without a mesh the FSDP passes are skipped: not run, not reported */
    gt_graph *plain = gt_graph_copy(g0);
    plain->mesh.ndim = 0;
    gt_pass_options o3 = {.verify_each = true, .quiet = true};
    EXPECT_OK(gt_pass_run_pipeline(plain, &o3, &rep, &err), &err);
    fsdp_ran = 0;
    for (int k = 0; k < rep.n_run; k++)
        fsdp_ran += strncmp(rep.pass[k].name, "fsdp_", 5) == 0;
    EXPECT(fsdp_ran == 0 && rep.n_run == 6, "without a mesh: %d passes, %d fsdp", rep.n_run,
           fsdp_ran);
    gt_graph_free(plain);
    gt_graph_free(off);
    gt_graph_free(g);
    gt_graph_free(g0);
}

/* ---------------------------------------------------------------- test_tiny, parallelized */

/* test_tiny's step graph (bf16 compute: casts feed the gathers) parallelized over dp_shard 2
 * (times tp, rank 0's graph), through the default pipeline with the FSDP passes left out; *cfg
 * stays for the bindings. */
static gt_graph *tiny_step(gt_config *cfg, int tp)
{
    gt_error err = {0};
    char tps[8];
    snprintf(tps, sizeof tps, "%d", tp);
    char *extra[] = {"--parallelism.data_parallel_shard_degree", "2", "--compile.enable", "false",
                     "--parallelism.tensor_parallel_degree",     tps};
    gt_graph *g = gt_graph_new();
    gt_model model = {0};
    gt_train_layout layout;
    gt_status st = comm_test_tiny_config(cfg, extra, (int)(sizeof extra / sizeof extra[0]), &err);
    if (st == GT_OK) st = gt_train_layout_init(cfg, 2 * tp, 0, &layout, &err);
    if (st == GT_OK) st = gt_train_build_graph_layout(cfg, &layout, g, &model, 1, &err);
    gt_model_free(&model);
    EXPECT(st == GT_OK, "test_tiny step graph: %s", err.msg);
    if (st != GT_OK) {
        gt_graph_free(g);
        return NULL;
    }
    run_passes(g, "canonicalize", "cse", 0);
    run_passes(g, "dce", NULL, 0);
    return g;
}

/* Distinct (phase, bucket) of the starts with FSDP tag `tag`: the buckets bucketing must make. */
static int expected_buckets(const gt_graph *g, int tag)
{
    int64_t seen[256][2];
    int n = 0;
    for (gt_node_id x = 0; x < g->n_nodes; x++) {
        const gt_node *nd = &g->nodes[x];
        if (!gt_op_is_collective_start(nd->op) || !gt_node_has_tag(g, nd, gt_pass_fsdp_tags[tag]))
            continue;
        int64_t key[2] = {nd->phase, nd->unit};
        bool dup = false;
        for (int k = 0; k < n && !dup; k++)
            dup = seen[k][0] == key[0] && seen[k][1] == key[1];
        if (!dup && n < 256) seen[n][0] = key[0], seen[n][1] = key[1], n++;
    }
    return n;
}

/* Bytes of v (constant shape). */
static int64_t value_bytes(const gt_graph *g, gt_value_id v)
{
    const gt_type *t = gt_value_type(g, v);
    int64_t n = (int64_t)gt_dtype_size(t->dtype);
    for (int d = 0; d < t->ndim; d++) {
        int64_t v_d = -1;
        EXPECT(gt_sym_is_const(g->sym, t->dims[d], &v_d), "a packed value has a constant shape");
        n *= v_d;
    }
    return n;
}

/* The leaves of the concat tree producing v (through reshapes) in order, and the bytes its concat
 * nodes write. */
static void concat_leaves(const gt_graph *g, gt_value_id v, int64_t *leaf, int *n, int64_t *copied)
{
    gt_node_id p = g->values[v].producer;
    while (p != GT_NONE && g->nodes[p].op == GT_OP_RESHAPE && *n == 0 && *copied == 0) {
        v = g->nodes[p].in[0];
        p = g->values[v].producer;
    }
    if (p == GT_NONE || g->nodes[p].op != GT_OP_CONCAT) {
        if (*n < 64) leaf[(*n)++] = value_bytes(g, v);
        return;
    }
    *copied += value_bytes(g, v);
    for (int k = 0; k < g->nodes[p].n_in; k++)
        concat_leaves(g, g->nodes[p].in[k], leaf, n, copied);
}

static void check_packing(const gt_graph *g, const char *what)
{
    int buckets = 0, wide = 0;
    for (gt_node_id x = 0; x < g->n_nodes; x++) {
        if (!gt_op_is_collective_start(g->nodes[x].op) || !gt_pass_is_bucketed(g, &g->nodes[x]))
            continue;
        int64_t leaf[64], copied = 0, total = 0;
        int n = 0;
        concat_leaves(g, g->nodes[x].in[0], leaf, &n, &copied);
        for (int k = 0; k < n; k++)
            total += leaf[k];
        int64_t extra = 0; /* the cheapest run of n - 7 members: one inner concat (n <= 15) */
        if (n > GT_MAX_IN) {
            extra = INT64_MAX;
            for (int i = 0; i + (n - GT_MAX_IN + 1) <= n; i++) {
                int64_t run = 0;
                for (int k = i; k < i + (n - GT_MAX_IN + 1); k++)
                    run += leaf[k];
                if (run < extra) extra = run;
            }
            wide++;
        }
        buckets++;
        EXPECT(n <= 15 && (n == 1 || copied == total + extra),
               "%s: bucket at node %d of %d members: its concats write %lld bytes, want %lld "
               "(members %lld + the cheapest run %lld)",
               what, x, n, (long long)copied, (long long)(total + extra), (long long)total,
               (long long)extra);
    }
    EXPECT(buckets > 0 && wide > 0, "%s: %d buckets, %d of more than %d members", what, buckets,
           wide, GT_MAX_IN);
}

/* The last gradient reduce-scatter's wait comes after every optimizer node that does not depend
 * on it (the gradient norm's sums of the gradients already reduced overlap it), and there is at
 * least one such node. */
static void check_late_wait(const gt_graph *g, const char *what)
{
    gt_node_id w = -1;
    for (gt_node_id x = 0; x < g->n_nodes; x++)
        if (g->nodes[x].op == GT_OP_WAIT &&
            gt_node_has_tag(g, &g->nodes[x], GT_FSDP_TAG_REDUCE_SCATTER))
            w = x;
    EXPECT(w >= 0, "%s: no reduce-scatter wait", what);
    if (w < 0) return;
    uint8_t *dep = calloc((size_t)g->n_nodes + 1, 1);
    dep[w] = 1;
    int before = 0, after = 0;
    for (gt_node_id x = w + 1; x < g->n_nodes; x++) {
        const gt_node *nd = &g->nodes[x];
        for (int j = 0; j < nd->n_in && !dep[x]; j++) {
            gt_node_id p = g->values[nd->in[j]].producer;
            dep[x] = p != GT_NONE && dep[p];
        }
        if (!dep[x] && nd->phase == GT_PHASE_OPTIMIZER) after++;
    }
    for (gt_node_id x = 0; x < w; x++)
        before += g->nodes[x].phase == GT_PHASE_OPTIMIZER;
    EXPECT(after == 0 && before > 0,
           "%s: %d optimizer nodes independent of the last reduce-scatter run after its wait "
           "(%d before it)",
           what, after, before);
    free(dep);
}

/* The backward's all_to_all of the token embedding's gradient (an activation's collective) starts
 * before the reduce-scatter of layers.0's gradients, which become ready at the same node: the
 * communicator's stream runs in start order, and the embedding's backward waits for it. Before
 * the reorder pass it starts after. */
static void check_activation_first(const gt_graph *g, bool reordered, const char *what)
{
    gt_node_id a2a = -1, rs = -1;
    for (gt_node_id x = 0; x < g->n_nodes; x++) {
        const gt_node *nd = &g->nodes[x];
        if (nd->op == GT_OP_ALL_TO_ALL_START && nd->phase == GT_PHASE_BACKWARD) a2a = x;
        if (nd->op == GT_OP_REDUCE_SCATTER_START &&
            gt_node_has_tag(g, nd, GT_FSDP_BUCKET_TAG_PREFIX "block.0"))
            rs = x;
    }
    EXPECT(a2a >= 0 && rs >= 0 && (a2a < rs) == reordered,
           "%s: the embedding gradient's all_to_all starts at %d, layers.0's reduce-scatter at %d",
           what, a2a, rs);
}

/* Backward reduce-scatters over mesh dim md (tagged: the gradients', else activations') with a
 * matmul between their start and their wait, of how many in all (*total). */
static int overlapped_scatters(const gt_graph *g, int md, bool tagged, int *total)
{
    gt_node_id *wait_of = gt_pass_find_waits(g);
    int n = 0;
    *total = 0;
    for (gt_node_id x = 0; x < g->n_nodes; x++) {
        const gt_node *nd = &g->nodes[x];
        if (nd->op != GT_OP_REDUCE_SCATTER_START || nd->attrs.i[0] != md ||
            nd->phase != GT_PHASE_BACKWARD || (gt_pass_fsdp_tag(g, nd) >= 0) != tagged ||
            wait_of[x] == GT_NONE)
            continue;
        ++*total;
        bool mm = false;
        for (gt_node_id y = x + 1; y < wait_of[x] && !mm; y++)
            mm = g->nodes[y].op == GT_OP_MATMUL;
        n += mm;
    }
    free(wait_of);
    return n;
}

static void test_tiny(void)
{
    gt_config cfg;
    gt_graph *g0 = tiny_step(&cfg, 1);
    if (!g0) {
        gt_config_free(&cfg);
        return;
    }
    int L = 2;
    int want[3], before[3];
    for (int tag = 0; tag < 3; tag++) {
        want[tag] = expected_buckets(g0, tag);
        before[tag] = 0;
        for (gt_node_id x = 0; x < g0->n_nodes; x++)
            before[tag] += gt_op_is_collective_start(g0->nodes[x].op) &&
                           gt_node_has_tag(g0, &g0->nodes[x], gt_pass_fsdp_tags[tag]);
    }
    /* forward: 2 blocks, the rest; the backward gathers again; every gradient. The token
     * embedding is stored on dim 1 (layout.c): neither gathered nor reduce-scattered */
    EXPECT(want[0] >= L + 1 && before[0] > want[0], "test_tiny gathers: %d in %d buckets",
           before[0], want[0]);
    EXPECT(want[1] == L + 1 && before[1] > want[1], "test_tiny reduce-scatters: %d in %d buckets",
           before[1], want[1]);
    gt_graph *b = variant(g0, "fsdp_bucketing", NULL, 0);
    for (int tag = 0; tag < 3; tag++) {
        int after = 0;
        for (gt_node_id x = 0; x < b->n_nodes; x++)
            after += gt_op_is_collective_start(b->nodes[x].op) &&
                     gt_node_has_tag(b, &b->nodes[x], gt_pass_fsdp_tags[tag]);
        EXPECT(after == want[tag], "test_tiny %s: %d collectives after bucketing, %d buckets",
               gt_pass_fsdp_tags[tag], after, want[tag]);
    }
    /* both ranks, with their coordinates bound */
    sim_data d;
    memset(&d, 0, sizeof d);
    d.n_ranks = 2;
    gt_error err = {0};
    for (int r = 0; r < 2; r++) {
        gt_train_layout layout;
        EXPECT_OK(gt_train_layout_init(&cfg, 2, r, &layout, &err), &err);
        gt_train_binding(&cfg, &layout, d.entries[r], &d.binding[r]);
    }
    check_packing(b, "test_tiny bucketed");
    /* each backward re-gather of a block (the last block is not resharded) packs the same
     * shards as its forward gather: it takes the forward's buffer instead of packing again */
    int bwd_gathers = 0, reused = 0;
    for (gt_node_id x = 0; x < b->n_nodes; x++) {
        const gt_node *nd = &b->nodes[x];
        if (nd->op != GT_OP_ALL_GATHER_START || nd->phase != GT_PHASE_BACKWARD) continue;
        bwd_gathers++;
        for (gt_node_id y = 0; y < x; y++)
            if (b->nodes[y].op == GT_OP_ALL_GATHER_START && b->nodes[y].phase == GT_PHASE_FORWARD &&
                b->nodes[y].in[0] == nd->in[0]) {
                reused++;
                break;
            }
    }
    EXPECT(bwd_gathers >= 1 && reused == bwd_gathers,
           "test_tiny bucketed: %d of %d backward gathers read their forward gather's pack", reused,
           bwd_gathers);
    gt_graph *both = variant(g0, "fsdp_bucketing", "fsdp_reorder", 0);
    check_prefetch(both, &d.binding[0], L, true, "test_tiny bucketed + reordered");
    check_late_wait(both, "test_tiny bucketed + reordered");
    /* the gradient reduce-scatters overlap the backward's matmuls: the output's and norm's
     * ("rest", the first), every block's but layers.0's (the last: the embedding is not
     * reduce-scattered) */
    int total = 0, grad = overlapped_scatters(both, GT_MESH_DP_SHARD, true, &total);
    EXPECT(total == L + 1 && grad == L,
           "test_tiny bucketed + reordered: %d of %d gradient reduce-scatters overlap a matmul, "
           "want %d",
           grad, total, L + 1);
    check_activation_first(b, false, "test_tiny bucketed");
    check_activation_first(both, true, "test_tiny bucketed + reordered");
    /* test_tiny's gradients are bf16 (mixed precision): narrowed after bucketing, and alone */
    gt_graph *narrow = variant(g0, "fsdp_bucketing", "reduce_scatter_narrow", 0);
    gt_graph *narrow_only = variant(g0, "reduce_scatter_narrow", NULL, 0);
    int starts = 0, widening = count_widening(narrow, &starts), starts1 = 0,
        widening1 = count_widening(narrow_only, &starts1);
    EXPECT(starts == want[1] && widening == starts && starts1 == before[1] && widening1 == starts1,
           "test_tiny narrowed: %d of %d reduce-scatters widen bucketed, %d of %d alone", widening,
           starts, widening1, starts1);
    make_inputs(g0, &d, 256);
    expect_same_results_on(g0, b, &d, "test_tiny bucketed");
    expect_same_results_on(g0, both, &d, "test_tiny bucketed + reordered");
    expect_same_results_on(g0, narrow, &d, "test_tiny bucketed + narrowed");
    expect_same_results_on(g0, narrow_only, &d, "test_tiny narrowed");
    free_inputs(&d);
    gt_graph_free(narrow);
    gt_graph_free(narrow_only);
    gt_graph_free(both);
    gt_graph_free(b);
    gt_graph_free(g0);
    gt_config_free(&cfg);
}

/* Collective starts of g over mesh dim md with op `op`, tagged `tag` (NULL: untagged). */
static int count_starts(const gt_graph *g, gt_op op, int md, const char *tag)
{
    int n = 0;
    for (gt_node_id x = 0; x < g->n_nodes; x++) {
        const gt_node *nd = &g->nodes[x];
        if (nd->op != op || nd->attrs.i[0] != md) continue;
        n += tag ? gt_node_has_tag(g, nd, tag) : gt_pass_fsdp_tag(g, nd) < 0;
    }
    return n;
}

/* FSDP 2 x TP 2 (sequence parallel): a norm weight's gradient, summed by each TP rank over its own
 * tokens, is all-reduced over TP as a gradient collective (tagged, bucketed per block, waited for
 * late, so the block's reduce-scatter wait is not pulled up to the all-reduce right after it);
 * the backward's sequence-parallel reduce-scatters overlap the weight gradients' matmuls. */
static void test_tiny_tp(void)
{
    gt_config cfg;
    gt_graph *g0 = tiny_step(&cfg, 2);
    if (!g0) {
        gt_config_free(&cfg);
        return;
    }
    const int L = 2; /* test_tiny's blocks */
    /* a block's two norms, the final norm: TP-replicated weights */
    int ar = count_starts(g0, GT_OP_ALL_REDUCE_START, GT_MESH_TP, GT_FSDP_TAG_ALL_REDUCE);
    EXPECT(ar == 2 * L + 1, "test_tiny tp: %d gradient all-reduces over TP tagged, want %d", ar,
           2 * L + 1);
    gt_graph *b = variant(g0, "fsdp_bucketing", NULL, 0);
    ar = count_starts(b, GT_OP_ALL_REDUCE_START, GT_MESH_TP, GT_FSDP_TAG_ALL_REDUCE);
    EXPECT(ar == L + 1, "test_tiny tp bucketed: %d gradient all-reduces over TP, want %d", ar,
           L + 1);
    int rs =
        count_starts(b, GT_OP_REDUCE_SCATTER_START, GT_MESH_DP_SHARD, GT_FSDP_TAG_REDUCE_SCATTER);
    EXPECT(rs == L + 2,
           "test_tiny tp bucketed: %d gradient reduce-scatters, want %d (a block's "
           "one, the rest, the embedding)",
           rs, L + 2);
    gt_graph *both = variant(g0, "fsdp_bucketing", "fsdp_reorder", 0);
    int total0, total1, before = overlapped_scatters(b, GT_MESH_TP, false, &total0),
                        after = overlapped_scatters(both, GT_MESH_TP, false, &total1);
    /* a block's attention and feed-forward input gradients, the output layer's */
    EXPECT(total0 == 2 * L + 1 && total1 == 2 * L + 1 && before == 0 && after == total1,
           "test_tiny tp: %d of %d backward sequence-parallel reduce-scatters overlap a matmul "
           "after the reorder, %d of %d before",
           after, total1, before, total0);
    /* a sequence-parallel collective moves rank-major blocks with one permute: a gather's input
     * and a reduce-scatter's output are views, not permutes (the permute before a gather and
     * after a reduce-scatter are gone) */
    int sp = 0, extra_permutes = 0;
    gt_node_id *waits = gt_pass_find_waits(g0);
    gt_pass_uses uses;
    gt_pass_uses_build(g0, &uses);
    for (gt_node_id x = 0; x < g0->n_nodes; x++) {
        const gt_node *nd = &g0->nodes[x];
        bool ag = nd->op == GT_OP_ALL_GATHER_START, rs = nd->op == GT_OP_REDUCE_SCATTER_START;
        if ((!ag && !rs) || nd->attrs.i[0] != GT_MESH_TP || waits[x] == GT_NONE) continue;
        sp++;
        gt_node_id p = g0->values[nd->in[0]].producer;
        if (ag) extra_permutes += p != GT_NONE && g0->nodes[p].op == GT_OP_PERMUTE;
        gt_value_id out = g0->nodes[waits[x]].out[0];
        for (int32_t j = uses.first[out]; rs && j < uses.first[out + 1]; j++)
            extra_permutes += g0->nodes[uses.node[j]].op == GT_OP_PERMUTE;
    }
    gt_pass_uses_free(&uses);
    free(waits);
    EXPECT(sp > 0 && extra_permutes == 0,
           "test_tiny tp: %d of %d sequence-parallel collectives permute a gather's input or a "
           "reduce-scatter's output",
           extra_permutes, sp);
    /* a block's gradient reduce-scatter is waited for after the next one starts */
    gt_node_id *wait_of = gt_pass_find_waits(both);
    gt_node_id starts[16];
    int n = 0;
    for (gt_node_id x = 0; x < both->n_nodes && n < 16; x++)
        if (both->nodes[x].op == GT_OP_REDUCE_SCATTER_START &&
            gt_node_has_tag(both, &both->nodes[x], GT_FSDP_TAG_REDUCE_SCATTER))
            starts[n++] = x;
    int late = 0;
    for (int k = 0; k + 1 < n; k++)
        late += wait_of[starts[k]] > starts[k + 1];
    EXPECT(n == L + 2 && late == n - 1,
           "test_tiny tp reordered: %d of %d gradient reduce-scatters waited for after the next "
           "starts",
           late, n - 1);
    /* and they overlap compute: every block's but layers.0's (the backward's last) */
    int grad = overlapped_scatters(both, GT_MESH_DP_SHARD, true, &total1);
    EXPECT(total1 == L + 2 && grad == L,
           "test_tiny tp reordered: %d of %d gradient reduce-scatters overlap a matmul, want %d",
           grad, total1, L);
    free(wait_of);
    gt_graph_free(both);
    gt_graph_free(b);
    gt_graph_free(g0);
    gt_config_free(&cfg);
}

/* Gradient accumulation on FSDP 2 x TP 2: the token embedding's micro-batch gradient (the whole
 * table, partial over dp_shard and tp) joins its running sum, stored S(0) on tp with dp_shard's
 * S(0) inside tp's blocks. The reduce-scatters that convert it must go outermost first: over tp,
 * then over dp_shard inside tp's block (the other order hands dp's outer blocks around as inner
 * ones). Walking back from the add, the dp_shard reduce-scatter comes first. */
static void test_accum_conversion_order(void)
{
    gt_config cfg;
    gt_error err = {0};
    char *extra[] = {"--parallelism.data_parallel_shard_degree",
                     "2",
                     "--parallelism.tensor_parallel_degree",
                     "2",
                     "--compile.enable",
                     "false",
                     "--training.local_batch_size",
                     "1",
                     "--training.global_batch_size",
                     "4"};
    gt_graph *g = gt_graph_new();
    gt_model model = {0};
    gt_train_layout layout;
    gt_status st = comm_test_tiny_config(&cfg, extra, (int)(sizeof extra / sizeof extra[0]), &err);
    if (st == GT_OK) st = gt_train_layout_init(&cfg, 4, 0, &layout, &err);
    if (st == GT_OK) st = gt_train_build_graph_layout(&cfg, &layout, g, &model, 2, &err);
    gt_model_free(&model);
    EXPECT(st == GT_OK, "test_tiny FSDP2 x TP2 micro-batch graph: %s", err.msg);
    int dims[8], n = 0;
    for (gt_node_id x = 0; st == GT_OK && x < g->n_nodes && n == 0; x++) {
        const gt_node *nd = &g->nodes[x];
        if (nd->op != GT_OP_ADD) continue;
        bool is_sum = false;
        for (int k = 0; k < g->n_inputs; k++)
            is_sum |= g->inputs[k].value == nd->in[0] &&
                      strcmp(gt_graph_str(g, g->inputs[k].fqn),
                             GT_OPTIM_GRAD_ACCUM_PREFIX "tok_embeddings.weight") == 0;
        if (!is_sum) continue;
        /* back through waits, collective starts and views to the gradient's producer */
        gt_node_id y = g->values[nd->in[1]].producer;
        while (y != GT_NONE && n < 8) {
            const gt_node *yn = &g->nodes[y];
            if (yn->op == GT_OP_REDUCE_SCATTER_START) dims[n++] = (int)yn->attrs.i[0];
            if (yn->op != GT_OP_WAIT && yn->op != GT_OP_REDUCE_SCATTER_START &&
                yn->op != GT_OP_RESHAPE && yn->op != GT_OP_PERMUTE)
                break;
            y = g->values[yn->in[0]].producer;
        }
    }
    EXPECT(n == 2 && dims[0] == GT_MESH_DP_SHARD && dims[1] == GT_MESH_TP,
           "the embedding gradient's reduce-scatters, from the sum back: %d of them, mesh dims "
           "%d, %d (want dp_shard %d, then tp %d)",
           n, n > 0 ? dims[0] : -1, n > 1 ? dims[1] : -1, GT_MESH_DP_SHARD, GT_MESH_TP);
    gt_graph_free(g);
    gt_config_free(&cfg);
}

int main(void)
{
    spec plain = {.layers = 3, .cast = false, .reshard = false};
    spec mixed = {.layers = 3, .cast = true, .reshard = true};
    spec hsdp = {.layers = 2, .cast = true, .reshard = true, .hsdp = true};
    test_bucketing_counts(&plain);
    test_bucketing_counts(&mixed);
    test_bucketing_counts(&hsdp);
    test_bucketing_cap();
    test_reorder(&plain);
    test_reorder(&mixed);
    test_reorder(&hsdp);
    spec plain_bf16 = {.layers = 3, .cast = true, .reshard = false, .bf16_grads = true};
    spec hsdp_bf16 = {.layers = 2, .cast = true, .reshard = true, .hsdp = true, .bf16_grads = true};
    test_narrow(&plain_bf16);
    test_narrow(&hsdp_bf16);
    test_no_mesh();
    test_report();
    test_pipeline();
    test_tiny_tp();
    test_accum_conversion_order();
    test_tiny();
    return gt_test_finish();
}
