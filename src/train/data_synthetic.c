/* data_synthetic.c — the built-in synthetic corpus: a random first-order Markov chain with a
 * known entropy rate (see gt_data.h for the construction and why H is the loss floor).
 *
 * Randomness (all Philox, seed = config seed, one stream per purpose):
 *   cycle       Sattolo's algorithm: a uniformly random single cycle through all V tokens;
 *   successors  k_c and the extra successors of context c (rejection of repeats by round);
 *   probs       Exp(1) draws e_i, p_i = e_i / Σ e (a Dirichlet(1, …, 1) vector);
 *   sample      the tokens of sample g: two tokens per Philox call (words 0-1, 2-3). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "graphtrain/gt_data.h"

struct gt_synthetic {
    gt_synthetic_config cfg;
    int32_t *off;       /* successors of c: [off[c], off[c + 1]) */
    int32_t *succ;      /* successor tokens */
    double *prob, *cum; /* P(succ | c) and its running sum (last = 1 exactly) */
    double *pi, *pi_cum;
    double entropy;
};

#define GT_SYNTH_MAX_VOCAB (1 << 20)

void gt_synthetic_config_default(gt_synthetic_config *c)
{
    c->vocab_size = 256;
    c->min_successors = 2;
    c->max_successors = 8;
    c->seed = 1234;
}

const gt_synthetic_config *gt_synthetic_get_config(const gt_synthetic *s)
{
    return &s->cfg;
}
double gt_synthetic_entropy_rate(const gt_synthetic *s)
{
    return s->entropy;
}

double gt_synthetic_transition_prob(const gt_synthetic *s, int32_t from, int32_t to)
{
    if (from < 0 || from >= s->cfg.vocab_size) return 0;
    for (int32_t i = s->off[from]; i < s->off[from + 1]; i++)
        if (s->succ[i] == to) return s->prob[i];
    return 0;
}

double gt_synthetic_stationary_prob(const gt_synthetic *s, int32_t token)
{
    return token >= 0 && token < s->cfg.vocab_size ? s->pi[token] : 0;
}

/* π of the chain: power iteration on the lazy chain (P + I)/2, which has the same stationary
 * distribution and converges for every irreducible chain (laziness removes periodicity). */
static void gt_synth_stationary(gt_synthetic *s)
{
    int32_t V = s->cfg.vocab_size;
    double *next = gt_xmalloc((size_t)V * sizeof *next);
    for (int32_t c = 0; c < V; c++)
        s->pi[c] = 1.0 / V;
    for (int iter = 0; iter < 1000000; iter++) {
        for (int32_t c = 0; c < V; c++)
            next[c] = 0.5 * s->pi[c];
        for (int32_t c = 0; c < V; c++)
            for (int32_t i = s->off[c]; i < s->off[c + 1]; i++)
                next[s->succ[i]] += 0.5 * s->pi[c] * s->prob[i];
        double sum = 0, change = 0;
        for (int32_t c = 0; c < V; c++)
            sum += next[c];
        for (int32_t c = 0; c < V; c++) {
            next[c] /= sum;
            change += fabs(next[c] - s->pi[c]);
        }
        memcpy(s->pi, next, (size_t)V * sizeof *next);
        if (change < 1e-14) break;
    }
    free(next);
    double run = 0;
    for (int32_t c = 0; c < V; c++)
        s->pi_cum[c] = (run += s->pi[c]);
    s->pi_cum[V - 1] = 1.0;
}

gt_status gt_synthetic_create(const gt_synthetic_config *c, gt_synthetic **out, gt_error *err)
{
    *out = NULL;
    if (c->vocab_size < 2 || c->vocab_size > GT_SYNTH_MAX_VOCAB)
        return gt_error_set(err, GT_ERR_INVALID,
                            "synthetic corpus: vocab_size %d must be in [2, %d]", c->vocab_size,
                            GT_SYNTH_MAX_VOCAB);
    if (c->min_successors < 1 || c->max_successors < c->min_successors ||
        c->max_successors > c->vocab_size || c->max_successors > 4096)
        return gt_error_set(err, GT_ERR_INVALID,
                            "synthetic corpus: successors [%d, %d] must satisfy 1 <= min <= max "
                            "<= min(vocab_size %d, 4096)",
                            c->min_successors, c->max_successors, c->vocab_size);
    int32_t V = c->vocab_size;
    uint64_t seed = c->seed;
    uint64_t s_cycle = gt_hash_str("synthetic.cycle"), s_succ = gt_hash_str("synthetic.successors");
    uint64_t s_prob = gt_hash_str("synthetic.probs");

    gt_synthetic *s = gt_xcalloc(1, sizeof *s);
    s->cfg = *c;
    int32_t *cycle = gt_xmalloc((size_t)V * sizeof *cycle);
    for (int32_t i = 0; i < V; i++)
        cycle[i] = i;
    /* Sattolo: j uniform in [0, i) gives a uniformly random permutation with a single cycle. */
    for (int32_t i = V - 1; i > 0; i--) {
        int32_t j = (int32_t)(gt_rng_uniform(seed, s_cycle, (uint64_t)i, 0) * i);
        if (j >= i) j = i - 1;
        int32_t tmp = cycle[i];
        cycle[i] = cycle[j];
        cycle[j] = tmp;
    }

    s->off = gt_xmalloc(((size_t)V + 1) * sizeof *s->off);
    size_t cap = (size_t)V * (size_t)c->max_successors;
    s->succ = gt_xmalloc(cap * sizeof *s->succ);
    s->prob = gt_xmalloc(cap * sizeof *s->prob);
    s->cum = gt_xmalloc(cap * sizeof *s->cum);
    int32_t span = c->max_successors - c->min_successors + 1;
    int32_t n = 0;
    for (int32_t ctx = 0; ctx < V; ctx++) {
        s->off[ctx] = n;
        int32_t k =
            c->min_successors + (int32_t)(gt_rng_uniform(seed, s_succ, (uint64_t)ctx, 0) * span);
        if (k > c->max_successors) k = c->max_successors;
        s->succ[n] = cycle[ctx];
        int32_t have = 1;
        for (uint32_t round = 1; have < k; round++) {
            int32_t cand = (int32_t)(gt_rng_uniform(seed, s_succ, (uint64_t)ctx, round) * V);
            if (cand >= V) cand = V - 1;
            bool dup = false;
            for (int32_t i = 0; i < have && !dup; i++)
                dup = s->succ[n + i] == cand;
            if (!dup) s->succ[n + have++] = cand;
        }
        double sum = 0;
        for (int32_t i = 0; i < k; i++) {
            s->prob[n + i] = -log(gt_rng_uniform(seed, s_prob, (uint64_t)ctx, (uint32_t)i));
            sum += s->prob[n + i];
        }
        double run = 0;
        for (int32_t i = 0; i < k; i++) {
            s->prob[n + i] /= sum;
            s->cum[n + i] = (run += s->prob[n + i]);
        }
        s->cum[n + k - 1] = 1.0;
        n += k;
    }
    s->off[V] = n;
    free(cycle);

    s->pi = gt_xmalloc((size_t)V * sizeof *s->pi);
    s->pi_cum = gt_xmalloc((size_t)V * sizeof *s->pi_cum);
    gt_synth_stationary(s);
    double h = 0;
    for (int32_t ctx = 0; ctx < V; ctx++) {
        double hc = 0;
        for (int32_t i = s->off[ctx]; i < s->off[ctx + 1]; i++)
            if (s->prob[i] > 0) hc -= s->prob[i] * log(s->prob[i]);
        h += s->pi[ctx] * hc;
    }
    s->entropy = h;
    *out = s;
    return GT_OK;
}

void gt_synthetic_free(gt_synthetic *s)
{
    if (!s) return;
    free(s->off);
    free(s->succ);
    free(s->prob);
    free(s->cum);
    free(s->pi);
    free(s->pi_cum);
    free(s);
}

/* 53 bits of two Philox words as a double in [0, 1). */
static double gt_synth_u53(uint32_t hi, uint32_t lo)
{
    return (double)((((uint64_t)hi << 32) | lo) >> 11) * 0x1p-53;
}

void gt_synthetic_sample(const gt_synthetic *s, uint64_t index, int64_t len, int64_t *out)
{
    uint64_t stream = gt_hash_str("synthetic.sample");
    uint32_t w[4] = {0};
    int32_t prev = 0;
    for (int64_t t = 0; t < len; t++) {
        if ((t & 1) == 0) gt_rng_bits(s->cfg.seed, stream, index, (uint32_t)(t / 2), w);
        double u = (t & 1) ? gt_synth_u53(w[2], w[3]) : gt_synth_u53(w[0], w[1]);
        int32_t tok;
        if (t == 0) {
            /* inverse CDF of π by binary search: the first c with u < pi_cum[c] */
            int32_t lo = 0, hi = s->cfg.vocab_size - 1;
            while (lo < hi) {
                int32_t mid = lo + (hi - lo) / 2;
                if (u < s->pi_cum[mid])
                    hi = mid;
                else
                    lo = mid + 1;
            }
            tok = lo;
        } else {
            int32_t i = s->off[prev], end = s->off[prev + 1] - 1;
            while (i < end && u >= s->cum[i])
                i++;
            tok = s->succ[i];
        }
        out[t] = tok;
        prev = tok;
    }
}
