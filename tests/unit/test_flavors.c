/* test_flavors.c — every llama3 flavor against REFERENCE.md's table, the graph's parameter list
 * against the closed-form count, the builder's inputs/outputs/fqns, and the error for an unknown
 * flavor. */
#include <math.h>
#include <string.h>

#include "graphtrain/gt_graph.h"
#include "graphtrain/gt_llama3.h"
#include "gt_test.h"

typedef struct {
    const char *name;
    int64_t dim, layers, heads, kv_heads, ffn, vocab;
} flavor_ref;

/* REFERENCE.md's llama3 table; the test flavors as specified for the fixtures, their ffn hidden
 * worked out by hand: int(8·64/3) = 170 → multiple of 32 = 192; int(1.3 · int(8·72/3)) =
 * int(1.3 · 192) = int(249.6) = 249 (multiple_of 1); int(8·128/3) = 341 → multiple of 32 = 352;
 * int(8·256/3) = 682 → multiple of 32 = 704. */
static const flavor_ref refs[] = {
    {"debugmodel", 256, 6, 16, 16, 768, 2048},   {"1B", 2048, 16, 32, 8, 8192, 128256},
    {"8B", 4096, 32, 32, 8, 14336, 128256},      {"70B", 8192, 80, 64, 8, 28672, 128256},
    {"405B", 16384, 126, 128, 8, 53248, 128256}, {"test_tiny", 64, 2, 4, 4, 192, 256},
    {"test_gqa", 64, 2, 8, 2, 192, 256},         {"test_odd", 72, 2, 3, 3, 249, 301},
    {"test_hd64", 128, 2, 2, 1, 352, 256},       {"test_hd128", 256, 2, 2, 1, 704, 256},
};
#define N_REFS ((int)(sizeof refs / sizeof refs[0]))

/* Untied llama3: embedding + output (2·V·D), final norm (D), and per layer q, o (D·H·hd each),
 * k, v (D·Hkv·hd each), SwiGLU (3·D·F) and two norms (2·D). */
static int64_t closed_form_params(const flavor_ref *r)
{
    int64_t hd = r->dim / r->heads;
    int64_t attn = 2 * r->dim * r->heads * hd + 2 * r->dim * r->kv_heads * hd;
    int64_t layer = attn + 3 * r->dim * r->ffn + 2 * r->dim;
    return 2 * r->vocab * r->dim + r->dim + r->layers * layer;
}

static void test_config(const flavor_ref *r)
{
    gt_llama3_config cfg;
    gt_error err = {0};
    EXPECT_OK(gt_llama3_flavor(r->name, &cfg, &err), &err);
    EXPECT(strcmp(cfg.flavor, r->name) == 0, "%s: flavor field '%s'", r->name, cfg.flavor);
    EXPECT(cfg.dim == r->dim, "%s: dim %lld", r->name, (long long)cfg.dim);
    EXPECT(cfg.n_layers == r->layers, "%s: layers %lld", r->name, (long long)cfg.n_layers);
    EXPECT(cfg.n_heads == r->heads, "%s: heads %lld", r->name, (long long)cfg.n_heads);
    EXPECT(cfg.n_kv_heads == r->kv_heads, "%s: kv heads %lld", r->name, (long long)cfg.n_kv_heads);
    EXPECT(cfg.ffn_hidden == r->ffn, "%s: ffn hidden %lld, want %lld", r->name,
           (long long)cfg.ffn_hidden, (long long)r->ffn);
    EXPECT(gt_llama3_ffn_hidden(cfg.dim, cfg.multiple_of, cfg.ffn_dim_multiplier) == r->ffn,
           "%s: gt_llama3_ffn_hidden", r->name);
    EXPECT(cfg.vocab_size == r->vocab, "%s: vocab %lld", r->name, (long long)cfg.vocab_size);
    EXPECT(cfg.norm_eps == 1e-5, "%s: norm_eps %g", r->name, cfg.norm_eps);
    EXPECT(cfg.rope_theta == 500000.0, "%s: rope_theta %g", r->name, cfg.rope_theta);
    /* The real flavors use Llama 3.1's original context 8192; the test flavors 256, so that the
     * scaling changes angles measurably within a 16-token fixture. */
    int64_t original = strncmp(r->name, "test_", 5) == 0 ? 256 : 8192;
    EXPECT(cfg.rope_factor == 8.0 && cfg.rope_low_freq_factor == 1.0 &&
               cfg.rope_high_freq_factor == 4.0 && cfg.rope_original_max_position == original,
           "%s: llama3.1 rope scaling (8, 1, 4, %lld)", r->name, (long long)original);
    EXPECT(cfg.depth_init_base_std == 0.02, "%s: depth_init_base_std", r->name);
    EXPECT(cfg.max_seq_len >= 2048, "%s: max_seq_len %lld", r->name, (long long)cfg.max_seq_len);
    if (strcmp(r->name, "debugmodel") == 0) EXPECT(cfg.dim / cfg.n_heads == 16, "head_dim 16");
}

/* The llama3.1 scaling has three regimes by wavelength 2π/inv_freq_j (inv_freq_j =
 * theta^(-2j/hd)): below original/high_freq_factor kept, above original/low_freq_factor divided
 * by factor, in between interpolated. A test flavor must exercise all three. */
static void test_rope_regimes(const char *name)
{
    gt_llama3_config cfg;
    gt_error err = {0};
    EXPECT_OK(gt_llama3_flavor(name, &cfg, &err), &err);
    int64_t hd = cfg.dim / cfg.n_heads;
    double hi_wave = (double)cfg.rope_original_max_position / cfg.rope_high_freq_factor;
    double lo_wave = (double)cfg.rope_original_max_position / cfg.rope_low_freq_factor;
    int kept = 0, scaled = 0, mixed = 0;
    for (int64_t j = 0; j < hd / 2; j++) {
        double wave = 2.0 * M_PI * pow(cfg.rope_theta, 2.0 * (double)j / (double)hd);
        if (wave < hi_wave)
            kept++;
        else if (wave > lo_wave)
            scaled++;
        else
            mixed++;
    }
    EXPECT(kept > 0 && scaled > 0 && mixed > 0,
           "%s (head dim %lld): regimes kept %d, mixed %d, "
           "scaled %d",
           name, (long long)hd, kept, mixed, scaled);
}

static const char *input_fqn(const gt_graph *g, int k)
{
    return gt_graph_str(g, g->inputs[k].fqn);
}

static void test_graph(const flavor_ref *r)
{
    gt_llama3_config cfg;
    gt_error err = {0};
    EXPECT_OK(gt_llama3_flavor(r->name, &cfg, &err), &err);
    gt_graph *g = gt_graph_new();
    gt_model m;
    gt_status st = gt_llama3_build(g, &cfg, &m, &err);
    EXPECT(st == GT_OK, "%s: build: %s", r->name, err.msg);
    if (st != GT_OK) {
        gt_graph_free(g);
        return;
    }

    /* Parameters: count, numel, order and the graph inputs they correspond to. */
    EXPECT(m.n_params == 3 + 9 * r->layers, "%s: %d params", r->name, m.n_params);
    int64_t total = 0;
    for (int k = 0; k < m.n_params; k++)
        total += gt_shape_numel(m.params[k].ndim, m.params[k].shape);
    EXPECT(total == closed_form_params(r), "%s: %lld params, closed form %lld", r->name,
           (long long)total, (long long)closed_form_params(r));
    EXPECT(g->n_inputs == 2 + m.n_params, "%s: %d graph inputs", r->name, g->n_inputs);
    EXPECT(g->inputs[0].kind == GT_IN_INPUT && strcmp(input_fqn(g, 0), "tokens") == 0 &&
               g->inputs[0].value == m.tokens,
           "%s: input 0 is INPUT tokens", r->name);
    EXPECT(g->inputs[1].kind == GT_IN_INPUT && strcmp(input_fqn(g, 1), "labels") == 0 &&
               g->inputs[1].value == m.labels,
           "%s: input 1 is INPUT labels", r->name);
    const gt_type *tt = gt_value_type(g, m.tokens);
    EXPECT(tt->dtype == GT_I64 && tt->ndim == 2, "%s: tokens i64 rank 2", r->name);
    for (int k = 0; k < m.n_params && 2 + k < g->n_inputs; k++) {
        const gt_io *io = &g->inputs[2 + k];
        const gt_type *t = gt_value_type(g, io->value);
        bool same = io->kind == GT_IN_PARAM && strcmp(input_fqn(g, 2 + k), m.params[k].fqn) == 0 &&
                    t->dtype == GT_F32 && t->ndim == m.params[k].ndim;
        for (int d = 0; same && d < t->ndim; d++) {
            int64_t c;
            same = gt_sym_is_const(g->sym, t->dims[d], &c) && c == m.params[k].shape[d];
        }
        EXPECT(same, "%s: input %d is PARAM %s with the spec's shape", r->name, 2 + k,
               m.params[k].fqn);
    }

    /* torchtitan's order: tok_embeddings, per layer wq wk wv wo attention_norm w1 w2 w3 ffn_norm,
     * then norm, output. */
    static const char *const per_layer[9] = {
        "attention.wq.weight",    "attention.wk.weight",    "attention.wv.weight",
        "attention.wo.weight",    "attention_norm.weight",  "feed_forward.w1.weight",
        "feed_forward.w2.weight", "feed_forward.w3.weight", "ffn_norm.weight"};
    EXPECT(strcmp(m.params[0].fqn, "tok_embeddings.weight") == 0, "%s: first param", r->name);
    for (int64_t i = 0; i < r->layers; i++) {
        for (int j = 0; j < 9; j++) {
            char want[128];
            snprintf(want, sizeof want, "layers.%lld.%s", (long long)i, per_layer[j]);
            int k = (int)(1 + 9 * i + j);
            if (strcmp(m.params[k].fqn, want) != 0) {
                EXPECT(0, "%s: param %d is %s, want %s", r->name, k, m.params[k].fqn, want);
                i = r->layers;
                break;
            }
        }
    }
    EXPECT(strcmp(m.params[m.n_params - 2].fqn, "norm.weight") == 0, "%s: norm", r->name);
    EXPECT(strcmp(m.params[m.n_params - 1].fqn, "output.weight") == 0, "%s: output", r->name);
    int64_t hd = r->dim / r->heads;
    const gt_param_spec *wk = &m.params[2], *w2 = &m.params[7];
    EXPECT(wk->shape[0] == r->kv_heads * hd && wk->shape[1] == r->dim, "%s: wk shape", r->name);
    EXPECT(w2->shape[0] == r->dim && w2->shape[1] == r->ffn, "%s: w2 shape", r->name);

    /* Outputs: one LOSS, a scalar; logits [batch*seq, V] under a binding. */
    EXPECT(g->n_outputs == 1 && g->outputs[0].kind == GT_OUT_LOSS && g->outputs[0].value == m.loss,
           "%s: one LOSS output", r->name);
    EXPECT(gt_value_type(g, m.loss)->ndim == 0, "%s: scalar loss", r->name);
    gt_sym_binding_entry be[2] = {{"batch", 3}, {"seq", 5}};
    gt_sym_binding b = {be, 2};
    int64_t shape[GT_MAX_DIMS];
    EXPECT_OK(gt_graph_eval_shape(g, m.logits, &b, shape, &err), &err);
    EXPECT(gt_value_type(g, m.logits)->ndim == 2 && shape[0] == 15 && shape[1] == r->vocab,
           "%s: logits [15, V]", r->name);

    /* Every node names its module. */
    int unnamed = 0;
    for (int n = 0; n < g->n_nodes; n++)
        unnamed += g->nodes[n].fqn == 0;
    EXPECT(unnamed == 0, "%s: %d nodes without fqn", r->name, unnamed);
    EXPECT_OK(gt_graph_verify(g, &err), &err);

    gt_model_free(&m);
    gt_graph_free(g);
}

static void test_unknown(void)
{
    gt_llama3_config cfg;
    gt_error err = {0};
    gt_status st = gt_llama3_flavor("llama9000", &cfg, &err);
    EXPECT(st == GT_ERR_INVALID, "unknown flavor -> %s", gt_status_name(st));
    EXPECT(strstr(err.msg, "llama9000") != NULL, "message names the flavor: %s", err.msg);
    int n = 0;
    for (const char *const *name = gt_llama3_flavor_names(); *name; name++, n++) {
        EXPECT(strstr(err.msg, *name) != NULL, "message lists '%s': %s", *name, err.msg);
    }
    EXPECT(n == N_REFS, "%d flavor names", n);
    for (int k = 0; k < N_REFS; k++) {
        bool listed = false;
        for (const char *const *name = gt_llama3_flavor_names(); *name; name++) {
            listed |= strcmp(*name, refs[k].name) == 0;
        }
        EXPECT(listed, "%s is listed", refs[k].name);
    }
    gt_error err2 = {0};
    EXPECT(gt_llama3_flavor(NULL, &cfg, &err2) == GT_ERR_INVALID, "NULL flavor");

    /* A config that cannot split into heads is refused, naming the flavor. */
    gt_error err3 = {0};
    EXPECT_OK(gt_llama3_flavor("test_odd", &cfg, &err3), &err3);
    cfg.n_heads = 5;
    gt_graph *g = gt_graph_new();
    gt_model m;
    st = gt_llama3_build(g, &cfg, &m, &err3);
    EXPECT(st == GT_ERR_INVALID && strstr(err3.msg, "test_odd"), "bad heads: %s", err3.msg);
    gt_graph_free(g);
}

int main(void)
{
    for (int k = 0; k < N_REFS; k++)
        test_config(&refs[k]);
    for (int k = 0; k < N_REFS; k++)
        test_graph(&refs[k]);
    test_rope_regimes("test_tiny");
    test_rope_regimes("test_gqa");
    test_rope_regimes("test_odd");
    test_rope_regimes("test_hd64");

    /* Published sizes with an untied output: Llama 3.1 8B 8,030,261,248 parameters; 70B ≈ 70.55e9,
     * 405B ≈ 405.85e9. */
    EXPECT(closed_form_params(&refs[2]) == 8030261248LL, "8B count %lld",
           (long long)closed_form_params(&refs[2]));
    EXPECT(fabs((double)closed_form_params(&refs[3]) - 70.55e9) < 0.01e9, "70B count %lld",
           (long long)closed_form_params(&refs[3]));
    EXPECT(fabs((double)closed_form_params(&refs[4]) - 405.85e9) < 0.02e9, "405B count %lld",
           (long long)closed_form_params(&refs[4]));
    test_unknown();
    return gt_test_finish();
}
