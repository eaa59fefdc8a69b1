/* test_optim.c — the optimizer in the whole-step graph and the lr schedule, against PyTorch.
 *
 * The fixture (tools/gen_optim_fixture.py) records what torch.nn.utils.clip_grad_norm_ +
 * torch.optim.AdamW (single-tensor, weight decay on the rank >= 2 params only) + LambdaLR with
 * torchtitan's schedule do over 6 steps of random gradients, for three settings (clipping on,
 * clipping off, beta1 < 0.5), and the lrs of a dozen schedule settings. Checked here:
 *   - gt_lr_at equals LambdaLR's lr bit for bit at every step;
 *   - a graph with PARAM inputs and INPUT gradients, with gt_optim_append_adamw, run by the eager
 *     executor for 6 steps, matches torch's grad norm, params, exp_avg and exp_avg_sq to 1e-6
 *     relative (per tensor max_i |got_i - ref_i| / max_i |ref_i|, printed with the count of
 *     bitwise-equal elements);
 *   - two runs are bitwise equal; the optimizer appended after gt_autodiff equals the one fed the
 *     same gradients as inputs; in-graph gradient accumulation equals summing on the host;
 *   - the graph's names, kinds and phases, and the errors for misuse. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph_text.h"
#include "graphtrain/gt_autodiff.h"
#include "graphtrain/gt_build.h"
#include "graphtrain/gt_config.h"
#include "graphtrain/gt_exec.h"
#include "graphtrain/gt_lr.h"
#include "graphtrain/gt_optim.h"
#include "graphtrain/gt_safetensors.h"
#include "gt_test.h"
#include "train/train_internal.h"

#define N_PARAMS 3
#define MAX_STEPS 16

typedef struct {
    gt_safetensors st;
    int n_params;
    char fqn[N_PARAMS][128];
    int steps;
} fixture;

static bool fixture_open(fixture *fx)
{
    gt_error err = {0};
    memset(fx, 0, sizeof *fx);
    gt_status s =
        gt_safetensors_open(gt_test_path("tests/fixtures/optim/adamw.safetensors"), &fx->st, &err);
    EXPECT(s == GT_OK, "open fixture: %s", err.msg);
    if (s != GT_OK) return false;
    const char *params = gt_safetensors_meta(&fx->st, "params");
    const char *steps = gt_safetensors_meta(&fx->st, "steps");
    EXPECT(params && steps, "fixture metadata");
    if (!params || !steps) return false;
    fx->steps = atoi(steps);
    char buf[512];
    snprintf(buf, sizeof buf, "%s", params);
    for (char *tok = strtok(buf, ","); tok && fx->n_params < N_PARAMS; tok = strtok(NULL, ","))
        snprintf(fx->fqn[fx->n_params++], sizeof fx->fqn[0], "%s", tok);
    EXPECT(fx->n_params == N_PARAMS && fx->steps >= 1 && fx->steps <= MAX_STEPS,
           "fixture has %d params, %d steps", fx->n_params, fx->steps);
    return fx->n_params == N_PARAMS && fx->steps >= 1 && fx->steps <= MAX_STEPS;
}

static gt_tensor fixture_get(const fixture *fx, const char *name)
{
    gt_tensor t = {0};
    gt_error err = {0};
    gt_status s = gt_safetensors_get(&fx->st, name, &t, &err);
    EXPECT(s == GT_OK, "fixture tensor %s: %s", name, err.msg);
    return t;
}

/* The doubles stored as their IEEE-754 bits in an I64 tensor. */
static int fixture_doubles(const fixture *fx, const char *name, double *out, int max)
{
    gt_tensor t = fixture_get(fx, name);
    int n = (int)gt_tensor_numel(&t);
    if (t.dtype != GT_I64 || n > max) n = 0;
    for (int k = 0; k < n; k++)
        memcpy(&out[k], (const int64_t *)t.data + k, sizeof(double));
    gt_tensor_free(&t);
    return n;
}

/* ---------------------------------------------------------------- lr schedule */

static bool parse_decay(const char *name, gt_lr_decay *d)
{
    bool ok = gt_lr_decay_from_name(name, d);
    EXPECT(ok, "decay type '%s'", name);
    return ok;
}

static void test_schedule_fixture(const fixture *fx)
{
    const char *count = gt_safetensors_meta(&fx->st, "sched.count");
    int n = count ? atoi(count) : 0;
    EXPECT(n >= 10, "fixture has %d schedule cases", n);
    for (int k = 0; k < n; k++) {
        char key[64], type[32];
        snprintf(key, sizeof key, "sched.%d", k);
        const char *spec = gt_safetensors_meta(&fx->st, key);
        long long steps = 0, warmup = 0;
        double ratio = 0, min_f = 0, lr = 0;
        if (!spec || sscanf(spec, "%lld %lld %lf %lf %lf %31s", &steps, &warmup, &ratio, &min_f,
                            &lr, type) != 6) {
            EXPECT(false, "schedule case %d spec '%s'", k, spec ? spec : "(missing)");
            continue;
        }
        gt_lr_config cfg = {.lr = lr,
                            .training_steps = steps,
                            .warmup_steps = warmup,
                            .has_decay_ratio = ratio >= 0,
                            .decay_ratio = ratio,
                            .min_lr_factor = min_f};
        if (!parse_decay(type, &cfg.decay_type)) continue;
        gt_lr_schedule s;
        gt_error err = {0};
        gt_log_set_level(GT_LOG_ERROR); /* the capping cases warn, as torchtitan does */
        EXPECT_OK(gt_lr_schedule_init(&s, &cfg, &err), &err);
        gt_log_set_level(GT_LOG_INFO);
        double want[MAX_STEPS];
        snprintf(key, sizeof key, "sched.%d.lrs", k);
        int got_n = fixture_doubles(fx, key, want, MAX_STEPS);
        EXPECT(got_n == steps, "case %d: %d lrs for %lld steps", k, got_n, steps);
        int bad = 0;
        for (int t = 1; t <= got_n; t++) {
            double lr_t = gt_lr_at(&s, t);
            if (lr_t != want[t - 1]) {
                if (!bad)
                    fprintf(stderr, "  schedule '%s' step %d: lr %.17g, torch %.17g\n", spec, t,
                            lr_t, want[t - 1]);
                bad++;
            }
        }
        EXPECT(bad == 0, "schedule '%s': %d of %d steps differ from LambdaLR", spec, bad, got_n);
        /* Past the end the factor holds the completed decay: min_lr_factor (1 without decay). */
        double end = s.decay_steps > 0 ? min_f : 1.0;
        EXPECT(fabs(gt_lr_factor(&s, steps + 1) - end) < 1e-15 &&
                   gt_lr_factor(&s, steps + 5) == gt_lr_factor(&s, steps + 1),
               "schedule '%s' past the end: %g, want %g", spec, gt_lr_factor(&s, steps + 5), end);
    }
}

static void test_schedule_errors(void)
{
    const gt_lr_config good = {.lr = 1e-3, .training_steps = 10, .warmup_steps = 2};
    struct {
        const char *what, *key;
        gt_lr_config cfg;
    } bad[] = {
        {"steps 0", "training.steps", good},
        {"negative warmup", "lr_scheduler.warmup_steps", good},
        {"decay_ratio 1.5", "lr_scheduler.decay_ratio", good},
        {"min_lr_factor 2", "lr_scheduler.min_lr_factor", good},
        {"lr NaN", "optimizer.lr", good},
    };
    bad[0].cfg.training_steps = 0;
    bad[1].cfg.warmup_steps = -1;
    bad[2].cfg.has_decay_ratio = true;
    bad[2].cfg.decay_ratio = 1.5;
    bad[3].cfg.min_lr_factor = 2.0;
    bad[4].cfg.lr = NAN;
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        gt_lr_schedule s;
        gt_error err = {0};
        gt_status st = gt_lr_schedule_init(&s, &bad[k].cfg, &err);
        EXPECT(st == GT_ERR_INVALID && strstr(err.msg, bad[k].key), "%s: %s", bad[k].what, err.msg);
    }
    gt_lr_decay d;
    EXPECT(!gt_lr_decay_from_name("exponential", &d), "unknown decay type refused");
    EXPECT(gt_lr_decay_from_name("cosine", &d) && d == GT_LR_DECAY_COSINE, "cosine by name");
}

/* ---------------------------------------------------------------- graphs */

typedef struct {
    gt_graph *g;
    gt_value_id params[N_PARAMS], grads[N_PARAMS];
} opt_graph;

/* PARAM inputs with the fixture's fqns and shapes, INPUT "grad.<fqn>" gradients; with accum, the
 * gradients go through gt_optim_append_grad_accum; then the optimizer. */
static bool build_opt_graph(const fixture *fx, const gt_adamw_config *cfg, bool accum,
                            opt_graph *og)
{
    gt_error err = {0};
    og->g = gt_graph_new();
    for (int k = 0; k < N_PARAMS; k++) {
        char name[160];
        snprintf(name, sizeof name, "init.%s", fx->fqn[k]);
        const gt_st_entry *e = gt_safetensors_find(&fx->st, name);
        if (!e) return false;
        gt_expr dims[GT_MAX_DIMS];
        for (int d = 0; d < e->ndim; d++)
            dims[d] = gt_c(og->g, e->shape[d]);
        og->params[k] = gt_graph_add_input(og->g, GT_IN_PARAM, fx->fqn[k], GT_F32, e->ndim, dims);
        snprintf(name, sizeof name, "grad.%s", fx->fqn[k]);
        og->grads[k] = gt_graph_add_input(og->g, GT_IN_INPUT, name, GT_F32, e->ndim, dims);
    }
    if (accum)
        EXPECT_OK(gt_optim_append_grad_accum(og->g, N_PARAMS, og->params, og->grads, &err), &err);
    gt_status st = gt_optim_append_adamw(og->g, N_PARAMS, og->params, og->grads, cfg, &err);
    EXPECT(st == GT_OK, "append adamw: %s", err.msg);
    if (st != GT_OK) return false;
    st = gt_graph_verify(og->g, &err);
    EXPECT(st == GT_OK, "verify: %s", err.msg);
    return st == GT_OK;
}

static int32_t find_io(const gt_io *ios, int32_t n, const gt_graph *g, int kind, const char *name)
{
    for (int32_t k = 0; k < n; k++)
        if (ios[k].kind == kind && strcmp(gt_graph_str(g, ios[k].fqn), name) == 0) return k;
    return -1;
}

/* Optimizer state carried between steps: params, exp_avg, exp_avg_sq per param. */
typedef struct {
    gt_tensor p[N_PARAMS], m[N_PARAMS], v[N_PARAMS];
    float grad_norm;
} opt_state;

static void state_init(const fixture *fx, opt_state *s)
{
    for (int k = 0; k < N_PARAMS; k++) {
        char name[160];
        snprintf(name, sizeof name, "init.%s", fx->fqn[k]);
        s->p[k] = fixture_get(fx, name);
        gt_error err = {0};
        GT_CHECK(gt_tensor_alloc(&s->m[k], GT_F32, s->p[k].ndim, s->p[k].shape, &err) == GT_OK);
        GT_CHECK(gt_tensor_alloc(&s->v[k], GT_F32, s->p[k].ndim, s->p[k].shape, &err) == GT_OK);
    }
}

static void state_free(opt_state *s)
{
    for (int k = 0; k < N_PARAMS; k++) {
        gt_tensor_free(&s->p[k]);
        gt_tensor_free(&s->m[k]);
        gt_tensor_free(&s->v[k]);
    }
}

/* One step: feeds state, grads (and accum when the graph has those inputs) and the scalars by
 * input name; replaces the state by the matching outputs. */
static bool run_step(const fixture *fx, const opt_graph *og, opt_state *s, gt_tensor *grads,
                     gt_tensor *accum, const float scalars[3])
{
    const gt_graph *g = og->g;
    gt_tensor *in = calloc((size_t)g->n_inputs, sizeof *in);
    gt_tensor *out = calloc((size_t)g->n_outputs, sizeof *out);
    gt_tensor scal;
    gt_tensor_wrap(&scal, GT_F32, 1, (const int64_t[]){3}, (void *)scalars);
    bool ok = true;
    for (int32_t i = 0; i < g->n_inputs; i++) {
        const char *name = gt_graph_str(g, g->inputs[i].fqn);
        bool found = strcmp(name, GT_OPTIM_SCALARS_NAME) == 0;
        if (found) in[i] = scal;
        for (int k = 0; k < N_PARAMS && !found; k++) {
            char n1[160], n2[160], n3[160], n4[160];
            snprintf(n1, sizeof n1, "grad.%s", fx->fqn[k]);
            snprintf(n2, sizeof n2, "optim.exp_avg.%s", fx->fqn[k]);
            snprintf(n3, sizeof n3, "optim.exp_avg_sq.%s", fx->fqn[k]);
            snprintf(n4, sizeof n4, "grad_accum.%s", fx->fqn[k]);
            found = true;
            if (strcmp(name, fx->fqn[k]) == 0)
                in[i] = s->p[k];
            else if (strcmp(name, n1) == 0)
                in[i] = grads[k];
            else if (strcmp(name, n2) == 0)
                in[i] = s->m[k];
            else if (strcmp(name, n3) == 0)
                in[i] = s->v[k];
            else if (strcmp(name, n4) == 0 && accum)
                in[i] = accum[k];
            else
                found = false;
        }
        EXPECT(found, "graph input '%s' has a feed", name);
        ok &= found;
    }
    gt_error err = {0};
    if (ok) {
        gt_status st = gt_eager_run(g, NULL, in, out, &err);
        EXPECT(st == GT_OK, "eager run: %s", err.msg);
        ok = st == GT_OK;
    }
    if (ok) {
        opt_state next = *s;
        for (int k = 0; k < N_PARAMS; k++) {
            char n2[160], n3[160];
            snprintf(n2, sizeof n2, "optim.exp_avg.%s", fx->fqn[k]);
            snprintf(n3, sizeof n3, "optim.exp_avg_sq.%s", fx->fqn[k]);
            int32_t ip = find_io(g->outputs, g->n_outputs, g, GT_OUT_PARAM_UPDATE, fx->fqn[k]);
            int32_t im = find_io(g->outputs, g->n_outputs, g, GT_OUT_OPT_STATE_UPDATE, n2);
            int32_t iv = find_io(g->outputs, g->n_outputs, g, GT_OUT_OPT_STATE_UPDATE, n3);
            EXPECT(ip >= 0 && im >= 0 && iv >= 0, "outputs of %s", fx->fqn[k]);
            if (ip < 0 || im < 0 || iv < 0) {
                ok = false;
                break;
            }
            next.p[k] = out[ip];
            next.m[k] = out[im];
            next.v[k] = out[iv];
            memset(&out[ip], 0, sizeof out[ip]);
            memset(&out[im], 0, sizeof out[im]);
            memset(&out[iv], 0, sizeof out[iv]);
        }
        int32_t in_norm = find_io(g->outputs, g->n_outputs, g, GT_OUT_METRIC, "grad_norm");
        EXPECT(in_norm >= 0, "grad_norm metric");
        if (ok && in_norm >= 0) {
            next.grad_norm = gt_tensor_get_f32(&out[in_norm], 0);
            state_free(s);
            *s = next;
        } else {
            ok = false;
        }
    }
    for (int32_t i = 0; i < g->n_outputs; i++)
        gt_tensor_free(&out[i]);
    free(out);
    free(in);
    return ok;
}

/* The tensor's relative error max_i |got_i - ref_i| / max_i |ref_i| (elementwise relative errors
 * are meaningless where m' = beta1 m + (1 - beta1) g' cancels to near 0: there f32 rounding of
 * the terms, not the implementation, sets the error). *same counts bitwise-equal elements. */
static double max_rel_error(const gt_tensor *got, const gt_tensor *ref, int64_t *same)
{
    int64_t n = gt_tensor_numel(ref);
    *same = 0;
    if (gt_tensor_numel(got) != n || got->dtype != GT_F32 || ref->dtype != GT_F32) return INFINITY;
    double mx = 0, worst = 0;
    for (int64_t i = 0; i < n; i++)
        mx = fmax(mx, fabs(gt_tensor_get_f32(ref, i)));
    for (int64_t i = 0; i < n; i++) {
        float a = gt_tensor_get_f32(got, i), b = gt_tensor_get_f32(ref, i);
        double e = fabs((double)a - (double)b) / (mx > 0 ? mx : 1.0);
        if (!(e <= worst)) worst = e; /* NaN sticks */
        *same += memcmp(&a, &b, sizeof a) == 0;
    }
    return worst;
}

typedef struct {
    char name[32];
    gt_adamw_config cfg;
    gt_lr_config lr;
} opt_case;

static bool parse_case(const fixture *fx, const char *name, opt_case *c)
{
    char key[64], type[32];
    snprintf(key, sizeof key, "case.%s", name);
    const char *spec = gt_safetensors_meta(&fx->st, key);
    double lr, b1, b2, eps, wd, max_norm, ratio, min_f;
    long long steps, warmup;
    if (!spec || sscanf(spec, "%lf %lf %lf %lf %lf %lf %lld %lld %lf %lf %31s", &lr, &b1, &b2, &eps,
                        &wd, &max_norm, &steps, &warmup, &ratio, &min_f, type) != 11) {
        EXPECT(false, "case %s spec '%s'", name, spec ? spec : "(missing)");
        return false;
    }
    snprintf(c->name, sizeof c->name, "%s", name);
    c->cfg = (gt_adamw_config){
        .beta1 = b1,
        .beta2 = b2,
        .eps = eps,
        .weight_decay = wd,
        .max_norm = max_norm,
        .decay_matrices_only = true}; /* the fixture's torch param groups decay rank >= 2 only */
    c->lr = (gt_lr_config){.lr = lr,
                           .training_steps = steps,
                           .warmup_steps = warmup,
                           .has_decay_ratio = ratio >= 0,
                           .decay_ratio = ratio,
                           .min_lr_factor = min_f};
    return parse_decay(type, &c->lr.decay_type);
}

static void load_grads(const fixture *fx, int step, gt_tensor *grads)
{
    for (int k = 0; k < N_PARAMS; k++) {
        char name[160];
        snprintf(name, sizeof name, "step%d.grad.%s", step, fx->fqn[k]);
        grads[k] = fixture_get(fx, name);
    }
}

/* Runs every step of the case and compares with torch; returns the final state in *final. */
static void run_case_vs_torch(const fixture *fx, const opt_case *c, bool verbose, opt_state *final)
{
    opt_graph og;
    if (!build_opt_graph(fx, &c->cfg, false, &og)) return;
    gt_lr_schedule sched;
    gt_error err = {0};
    EXPECT_OK(gt_lr_schedule_init(&sched, &c->lr, &err), &err);
    double lrs[MAX_STEPS];
    char key[64];
    snprintf(key, sizeof key, "%s.lrs", c->name);
    EXPECT(fixture_doubles(fx, key, lrs, MAX_STEPS) == fx->steps, "%s lrs", c->name);
    snprintf(key, sizeof key, "%s.grad_norms", c->name);
    gt_tensor norms = fixture_get(fx, key);

    opt_state s;
    state_init(fx, &s);
    double worst = 0;
    for (int t = 1; t <= fx->steps; t++) {
        double lr = gt_lr_at(&sched, t);
        EXPECT(lr == lrs[t - 1], "%s step %d: lr %.17g vs torch %.17g", c->name, t, lr, lrs[t - 1]);
        float scalars[3];
        gt_optim_scalars(&c->cfg, t, lr, scalars);
        gt_tensor grads[N_PARAMS];
        load_grads(fx, t, grads);
        bool ok = run_step(fx, &og, &s, grads, NULL, scalars);
        for (int k = 0; k < N_PARAMS; k++)
            gt_tensor_free(&grads[k]);
        if (!ok) break;
        double ref_norm = gt_tensor_get_f32(&norms, t - 1);
        double e_norm = fabs(s.grad_norm - ref_norm) / ref_norm;
        if (verbose)
            printf("%-8s step %d  lr %.6g  grad_norm %.7g (torch %.7g, rel %.2e)\n", c->name, t, lr,
                   s.grad_norm, ref_norm, e_norm);
        EXPECT(e_norm <= 1e-6, "%s step %d grad_norm rel error %.3g", c->name, t, e_norm);
        static const char *const kinds[3] = {"param", "exp_avg", "exp_avg_sq"};
        for (int k = 0; k < N_PARAMS; k++) {
            const gt_tensor *got[3] = {&s.p[k], &s.m[k], &s.v[k]};
            for (int j = 0; j < 3; j++) {
                char name[192];
                snprintf(name, sizeof name, "%s.step%d.%s.%s", c->name, t, kinds[j], fx->fqn[k]);
                gt_tensor ref = fixture_get(fx, name);
                int64_t same = 0;
                double e = max_rel_error(got[j], &ref, &same);
                worst = fmax(worst, e);
                if (verbose)
                    printf("    %-11s %-32s max rel error %.2e, bitwise equal %lld/%lld\n",
                           kinds[j], fx->fqn[k], e, (long long)same,
                           (long long)gt_tensor_numel(&ref));
                EXPECT(e <= 1e-6, "%s: max relative error %.3g > 1e-6", name, e);
                gt_tensor_free(&ref);
            }
        }
    }
    if (verbose)
        printf("%-8s worst max relative error over %d steps: %.2e\n", c->name, fx->steps, worst);
    gt_tensor_free(&norms);
    *final = s;
    gt_graph_free(og.g);
}

static bool same_bits(const gt_tensor *a, const gt_tensor *b)
{
    return a->dtype == b->dtype && gt_tensor_nbytes(a) == gt_tensor_nbytes(b) &&
           memcmp(a->data, b->data, gt_tensor_nbytes(a)) == 0;
}

static bool states_equal(const opt_state *a, const opt_state *b)
{
    bool eq = memcmp(&a->grad_norm, &b->grad_norm, sizeof(float)) == 0;
    for (int k = 0; k < N_PARAMS; k++)
        eq = eq && same_bits(&a->p[k], &b->p[k]) && same_bits(&a->m[k], &b->m[k]) &&
             same_bits(&a->v[k], &b->v[k]);
    return eq;
}

static void test_vs_torch(const fixture *fx)
{
    static const char *const cases[] = {"clip", "noclip", "lowbeta"};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        opt_case c;
        if (!parse_case(fx, cases[k], &c)) continue;
        opt_state a = {0}, b = {0};
        run_case_vs_torch(fx, &c, true, &a);
        run_case_vs_torch(fx, &c, false, &b); /* determinism: the rerun is bitwise identical */
        EXPECT(states_equal(&a, &b), "%s: two runs are bitwise equal", cases[k]);
        state_free(&a);
        state_free(&b);
    }
}

/* decay_matrices_only: the vectors (rank 1) get no weight decay, the matrices the configured one;
 * the trainer's config maps optimizer.weight_decay_matrices_only (default false) onto it. */
static void test_decay_matrices_only(const fixture *fx)
{
    gt_adamw_config cfg = gt_adamw_config_default();
    EXPECT(!cfg.decay_matrices_only, "the default decays every parameter (torchtitan's)");
    cfg.decay_matrices_only = true;
    opt_graph og;
    if (!build_opt_graph(fx, &cfg, false, &og)) return;
    int vectors = 0;
    for (gt_node_id n = 0; n < og.g->n_nodes; n++) {
        const gt_node *nd = &og.g->nodes[n];
        if (nd->op != GT_OP_ADAMW) continue;
        bool matrix = gt_value_type(og.g, nd->in[0])->ndim >= 2;
        vectors += !matrix;
        double want = matrix ? cfg.weight_decay : 0.0;
        EXPECT(nd->attrs.f[3] == want, "matrices only: adamw %s weight_decay %g, want %g",
               gt_graph_str(og.g, nd->fqn), nd->attrs.f[3], want);
    }
    EXPECT(vectors > 0, "the fixture has a vector parameter");
    gt_graph_free(og.g);
    gt_config c;
    gt_config_defaults(&c);
    gt_error err = {0};
    EXPECT(!c.optimizer.weight_decay_matrices_only, "optimizer.weight_decay_matrices_only: false");
    EXPECT(!gt_train_adamw_config(&c).decay_matrices_only, "the trainer decays every parameter");
    EXPECT_OK(gt_config_set(&c, "optimizer.weight_decay_matrices_only", "true", &err), &err);
    EXPECT(gt_train_adamw_config(&c).decay_matrices_only, "the option reaches the optimizer");
    gt_config_free(&c);
}

/* Names, kinds, phases and fqns of what gt_optim_append_adamw adds; the printer shows it. */
static void test_graph_structure(const fixture *fx)
{
    gt_adamw_config cfg = gt_adamw_config_default();
    opt_graph og;
    if (!build_opt_graph(fx, &cfg, false, &og)) return;
    gt_graph *g = og.g;
    int n_state = 0, n_scalars = 0;
    for (int32_t i = 0; i < g->n_inputs; i++) {
        n_state += g->inputs[i].kind == GT_IN_OPT_STATE;
        n_scalars += g->inputs[i].kind == GT_IN_INPUT &&
                     strcmp(gt_graph_str(g, g->inputs[i].fqn), "optim.scalars") == 0;
    }
    EXPECT(n_state == 2 * N_PARAMS && n_scalars == 1, "%d OPT_STATE inputs, %d scalars", n_state,
           n_scalars);
    for (int k = 0; k < N_PARAMS; k++) {
        char n2[160];
        snprintf(n2, sizeof n2, "optim.exp_avg_sq.%s", fx->fqn[k]);
        int32_t in = find_io(g->inputs, g->n_inputs, g, GT_IN_OPT_STATE, n2);
        EXPECT(in >= 0 && gt_value_type(g, g->inputs[in].value)->dtype == GT_F32, "state input %s",
               n2);
    }
    EXPECT(g->n_outputs == 1 + 3 * N_PARAMS && g->outputs[0].kind == GT_OUT_METRIC,
           "%d outputs, grad_norm first", g->n_outputs);
    int n_adamw = 0, n_non_opt = 0;
    for (gt_node_id n = 0; n < g->n_nodes; n++) {
        const gt_node *nd = &g->nodes[n];
        n_non_opt += nd->phase != GT_PHASE_OPTIMIZER;
        if (nd->op != GT_OP_ADAMW) continue;
        const char *fqn = gt_graph_str(g, nd->fqn);
        int k = n_adamw++;
        EXPECT(k < N_PARAMS && strcmp(fqn, fx->fqn[k]) == 0, "adamw node %d fqn %s", k, fqn);
        /* torchtitan's default: weight decay on every parameter, the vector (rank 1) too */
        EXPECT(nd->attrs.f[3] == cfg.weight_decay, "adamw %s weight_decay %g, want %g", fqn,
               nd->attrs.f[3], cfg.weight_decay);
    }
    EXPECT(n_adamw == N_PARAMS && n_non_opt == 0, "%d adamw nodes, %d not in phase opt", n_adamw,
           n_non_opt);
    EXPECT(g->cur_phase == GT_PHASE_FORWARD && g->cur_fqn == 0, "builder state restored");
    char *text = graph_text(g);
    EXPECT(text && strstr(text, "adamw(") && strstr(text, "OPT_STATE_UPDATE") &&
               strstr(text, "clamp("),
           "printed graph names adamw, clamp and OPT_STATE_UPDATE");
    free(text);
    gt_graph_free(g);
}

/* loss = sum(p0 * x0) + sum(p1 * x1) + sum(p2 * x2) has gradients x_k exactly; the optimizer
 * appended after gt_autodiff must equal the optimizer fed x_k as gradient inputs, bit for bit. */
static void test_after_autodiff(const fixture *fx)
{
    gt_adamw_config cfg = gt_adamw_config_default();
    cfg.max_norm = 0.5;
    gt_graph *g = gt_graph_new();
    gt_value_id params[N_PARAMS], xs[N_PARAMS], loss = GT_NONE;
    for (int k = 0; k < N_PARAMS; k++) {
        char name[160];
        snprintf(name, sizeof name, "init.%s", fx->fqn[k]);
        const gt_st_entry *e = gt_safetensors_find(&fx->st, name);
        gt_expr dims[GT_MAX_DIMS];
        int all[GT_MAX_DIMS];
        for (int d = 0; d < e->ndim; d++) {
            dims[d] = gt_c(g, e->shape[d]);
            all[d] = d;
        }
        params[k] = gt_graph_add_input(g, GT_IN_PARAM, fx->fqn[k], GT_F32, e->ndim, dims);
        snprintf(name, sizeof name, "grad.%s",
                 fx->fqn[k]); /* the same feed name as the reference */
        xs[k] = gt_graph_add_input(g, GT_IN_INPUT, name, GT_F32, e->ndim, dims);
        gt_value_id term =
            gt_reduce(g, GT_OP_SUM, gt_mul(g, params[k], xs[k]), e->ndim, all, false);
        loss = k == 0 ? term : gt_add(g, loss, term);
    }
    gt_graph_add_output(g, GT_OUT_LOSS, "loss", loss);
    gt_error err = {0};
    EXPECT_OK(gt_autodiff(g, &err), &err);
    gt_value_id grads[N_PARAMS];
    for (int k = 0; k < N_PARAMS; k++) {
        int32_t o = find_io(g->outputs, g->n_outputs, g, GT_OUT_GRAD, fx->fqn[k]);
        grads[k] = o >= 0 ? g->outputs[o].value : GT_NONE;
    }
    EXPECT_OK(gt_optim_append_adamw(g, N_PARAMS, params, grads, &cfg, &err), &err);
    EXPECT_OK(gt_graph_verify(g, &err), &err);

    opt_graph ref;
    if (!build_opt_graph(fx, &cfg, false, &ref)) return;
    opt_graph whole = {.g = g};
    opt_state a, b;
    state_init(fx, &a);
    state_init(fx, &b);
    bool eq = true;
    for (int t = 1; t <= 3; t++) {
        float scalars[3];
        gt_optim_scalars(&cfg, t, 1e-2, scalars);
        gt_tensor x[N_PARAMS];
        load_grads(fx, t, x);
        eq &= run_step(fx, &whole, &a, x, NULL, scalars);
        eq &= run_step(fx, &ref, &b, x, NULL, scalars);
        eq &= states_equal(&a, &b);
        for (int k = 0; k < N_PARAMS; k++)
            gt_tensor_free(&x[k]);
    }
    EXPECT(eq, "optimizer after autodiff equals the optimizer fed the same gradients");
    state_free(&a);
    state_free(&b);
    gt_graph_free(ref.g);
    gt_graph_free(g);
}

/* In-graph accumulation: feeding accum = a and grad = b equals feeding a + b (summed on the host
 * in f32) to the plain graph, bit for bit. */
static void test_grad_accum(const fixture *fx)
{
    gt_adamw_config cfg = gt_adamw_config_default();
    opt_graph plain, acc;
    if (!build_opt_graph(fx, &cfg, false, &plain) || !build_opt_graph(fx, &cfg, true, &acc)) return;
    int n_accum = 0;
    for (int32_t i = 0; i < acc.g->n_inputs; i++)
        n_accum += strncmp(gt_graph_str(acc.g, acc.g->inputs[i].fqn), "grad_accum.", 11) == 0;
    EXPECT(n_accum == N_PARAMS, "%d grad_accum inputs", n_accum);
    opt_state a, b;
    state_init(fx, &a);
    state_init(fx, &b);
    gt_tensor g1[N_PARAMS], g2[N_PARAMS], sum[N_PARAMS];
    load_grads(fx, 1, g1);
    load_grads(fx, 2, g2);
    gt_error err = {0};
    for (int k = 0; k < N_PARAMS; k++) {
        GT_CHECK(gt_tensor_alloc(&sum[k], GT_F32, g1[k].ndim, g1[k].shape, &err) == GT_OK);
        for (int64_t i = 0; i < gt_tensor_numel(&sum[k]); i++)
            ((float *)sum[k].data)[i] = ((float *)g1[k].data)[i] + ((float *)g2[k].data)[i];
    }
    float scalars[3];
    gt_optim_scalars(&cfg, 1, 1e-2, scalars);
    bool ok =
        run_step(fx, &acc, &a, g2, g1, scalars) && run_step(fx, &plain, &b, sum, NULL, scalars);
    EXPECT(ok && states_equal(&a, &b), "accumulated in the graph equals summed on the host");
    for (int k = 0; k < N_PARAMS; k++) {
        gt_tensor_free(&g1[k]);
        gt_tensor_free(&g2[k]);
        gt_tensor_free(&sum[k]);
    }
    state_free(&a);
    state_free(&b);
    gt_graph_free(plain.g);
    gt_graph_free(acc.g);
}

static void test_errors(const fixture *fx)
{
    gt_adamw_config cfg = gt_adamw_config_default();
    gt_error err = {0};
    gt_graph *g = gt_graph_new();
    gt_expr d3 = gt_c(g, 3), d4 = gt_c(g, 4);
    gt_value_id p = gt_graph_add_input(g, GT_IN_PARAM, "w", GT_F32, 1, &d3);
    gt_value_id x = gt_graph_add_input(g, GT_IN_INPUT, "x", GT_F32, 1, &d3);
    gt_value_id y = gt_graph_add_input(g, GT_IN_INPUT, "y", GT_F32, 1, &d4);

    gt_status st = gt_optim_append_adamw(g, 1, &x, &x, &cfg, &err);
    EXPECT(st == GT_ERR_INVALID && strstr(err.msg, "not a PARAM"), "non-param: %s", err.msg);
    gt_error_clear(&err);
    st = gt_optim_append_adamw(g, 1, &p, &y, &cfg, &err);
    EXPECT(st == GT_ERR_INVALID && strstr(err.msg, "'w'") && strstr(err.msg, "f32[4]"),
           "grad dims: %s", err.msg);
    gt_error_clear(&err);
    gt_value_id twice[2] = {p, p}, gg[2] = {x, x};
    st = gt_optim_append_adamw(g, 2, twice, gg, &cfg, &err);
    EXPECT(st == GT_ERR_INVALID && strstr(err.msg, "twice"), "param twice: %s", err.msg);
    gt_error_clear(&err);
    gt_adamw_config bad = cfg;
    bad.beta2 = 1.0;
    st = gt_optim_append_adamw(g, 1, &p, &x, &bad, &err);
    EXPECT(st == GT_ERR_INVALID && strstr(err.msg, "betas"), "beta2 = 1: %s", err.msg);
    gt_error_clear(&err);
    bad = cfg;
    bad.max_norm = NAN;
    st = gt_optim_append_adamw(g, 1, &p, &x, &bad, &err);
    EXPECT(st == GT_ERR_INVALID && strstr(err.msg, "max_norm"), "max_norm NaN: %s", err.msg);
    gt_error_clear(&err);
    EXPECT(g->n_inputs == 3 && g->n_nodes == 0, "nothing appended on refusal");

    EXPECT_OK(gt_optim_append_adamw(g, 1, &p, &x, &cfg, &err), &err);
    st = gt_optim_append_adamw(g, 1, &p, &x, &cfg, &err);
    EXPECT(st == GT_ERR_INVALID && strstr(err.msg, "twice"), "appended twice: %s", err.msg);
    gt_error_clear(&err);
    EXPECT_OK(gt_graph_verify(g, &err), &err);
    gt_graph_free(g);

    /* The shape rule refuses state of another dtype (built by hand with gt_adamw). */
    g = gt_graph_new();
    d3 = gt_c(g, 3);
    gt_expr three = gt_c(g, 3);
    p = gt_graph_add_input(g, GT_IN_PARAM, "w", GT_F32, 1, &d3);
    x = gt_graph_add_input(g, GT_IN_INPUT, "g", GT_F32, 1, &d3);
    gt_value_id m16 = gt_graph_add_input(g, GT_IN_OPT_STATE, "m", GT_BF16, 1, &d3);
    gt_value_id v = gt_graph_add_input(g, GT_IN_OPT_STATE, "v", GT_F32, 1, &d3);
    gt_value_id sc = gt_graph_add_input(g, GT_IN_INPUT, "s", GT_F32, 1, &three);
    gt_value_id clip = gt_full(g, GT_F32, 0, NULL, 1.0);
    gt_graph_set_fqn(g, "w");
    EXPECT(gt_adamw(g, p, x, m16, v, sc, clip, 0.9, 0.95, 1e-8, 0.1, NULL, NULL) == GT_NONE &&
               g->err.code == GT_ERR_SHAPE && strstr(g->err.msg, "exp_avg") &&
               strstr(g->err.msg, "adamw at w"),
           "bf16 exp_avg refused: %s", g->err.msg);
    gt_graph_free(g);
    g = gt_graph_new();
    d3 = gt_c(g, 3);
    gt_expr two = gt_c(g, 2);
    p = gt_graph_add_input(g, GT_IN_PARAM, "w", GT_F32, 1, &d3);
    x = gt_graph_add_input(g, GT_IN_INPUT, "g", GT_F32, 1, &d3);
    gt_value_id m = gt_graph_add_input(g, GT_IN_OPT_STATE, "m", GT_F32, 1, &d3);
    v = gt_graph_add_input(g, GT_IN_OPT_STATE, "v", GT_F32, 1, &d3);
    sc = gt_graph_add_input(g, GT_IN_INPUT, "s", GT_F32, 1, &two);
    clip = gt_full(g, GT_F32, 0, NULL, 1.0);
    EXPECT(gt_adamw(g, p, x, m, v, sc, clip, 0.9, 0.95, 1e-8, 0.1, NULL, NULL) == GT_NONE &&
               g->err.code == GT_ERR_SHAPE && strstr(g->err.msg, "scalars"),
           "scalars f32[2] refused: %s", g->err.msg);
    gt_graph_free(g);
    g = gt_graph_new();
    x = gt_graph_add_input(g, GT_IN_INPUT, "x", GT_F32, 0, NULL);
    EXPECT(gt_clamp(g, x, 1.0, 0.0) == GT_NONE && g->err.code == GT_ERR_INVALID,
           "clamp min > max refused: %s", g->err.msg);
    gt_graph_free(g);
    (void)fx;
}

/* The f32 sum of squares of t as sum_squares computes it: each square in f32, a double
 * accumulator in row-major order, rounded once. */
static float naive_sum_squares(const gt_tensor *t)
{
    double acc = 0;
    for (int64_t i = 0; i < gt_tensor_numel(t); i++) {
        float x = gt_tensor_get_f32(t, i);
        acc += (double)(x * x);
    }
    return (float)acc;
}

/* cfg.norm_groups: the norm's terms summed per group (groups in order of first appearance), the
 * grad_norm metric bitwise sqrtf of that f32 sum; without groups, in param order. Groups {1, 0, 1}
 * sum (s0 + s2) + s1; the gradients (one nonzero element each: 2528, 337, 3241) make that
 * differ from the param order's (s0 + s1) + s2 in f32 (17008432 against 17008434), and the
 * norms too. */
static void test_norm_groups(const fixture *fx)
{
    static const int groups[N_PARAMS] = {1, 0, 1};
    static const float first[N_PARAMS] = {2528, 337, 3241};
    gt_tensor grads[N_PARAMS];
    load_grads(fx, 1, grads);
    for (int k = 0; k < N_PARAMS; k++) {
        memset(grads[k].data, 0, gt_tensor_nbytes(&grads[k]));
        gt_tensor_set_f32(&grads[k], 0, first[k]);
    }
    float sq[N_PARAMS];
    for (int k = 0; k < N_PARAMS; k++)
        sq[k] = naive_sum_squares(&grads[k]);
    float want[2] = {sqrtf((sq[0] + sq[1]) + sq[2]), sqrtf((sq[0] + sq[2]) + sq[1])};
    EXPECT(memcmp(&want[0], &want[1], sizeof(float)) != 0, "the two orders round alike");
    for (int grouped = 0; grouped < 2; grouped++) {
        gt_adamw_config cfg = gt_adamw_config_default();
        cfg.norm_groups = grouped ? groups : NULL;
        opt_graph og;
        if (!build_opt_graph(fx, &cfg, false, &og)) break;
        opt_state st;
        state_init(fx, &st);
        float scalars[3];
        gt_optim_scalars(&cfg, 1, 1e-3, scalars);
        if (run_step(fx, &og, &st, grads, NULL, scalars))
            EXPECT(memcmp(&st.grad_norm, &want[grouped], sizeof(float)) == 0,
                   "grad_norm %s groups: %.9g, want %.9g", grouped ? "with" : "without",
                   st.grad_norm, want[grouped]);
        state_free(&st);
        gt_graph_free(og.g);
    }
    for (int k = 0; k < N_PARAMS; k++)
        gt_tensor_free(&grads[k]);
}

int main(void)
{
    fixture fx;
    test_schedule_errors();
    if (fixture_open(&fx)) {
        test_schedule_fixture(&fx);
        test_vs_torch(&fx);
        test_graph_structure(&fx);
        test_decay_matrices_only(&fx);
        test_after_autodiff(&fx);
        test_grad_accum(&fx);
        test_norm_groups(&fx);
        test_errors(&fx);
        gt_safetensors_close(&fx.st);
    }
    return gt_test_finish();
}
