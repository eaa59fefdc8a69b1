/* main.c — the graphtrain command line: subcommands and their options.
 *
 *   graphtrain graph [options]   build the whole-step graph, print it and a summary
 *   graphtrain init  [options]   write initialised parameters to a safetensors file
 *
 * Options are spelled as torchtitan spells them (--section.key=value or --section.key value).
 * This file only parses and dispatches; the work is in the library. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "graphtrain/gt_autodiff.h"
#include "graphtrain/gt_flops.h"
#include "graphtrain/gt_graph.h"
#include "graphtrain/gt_model.h"

/* ---------------------------------------------------------------- options */

typedef struct {
    const char *key;
    const char *def;
    const char *help;
} option_spec;

typedef struct {
    const char *name;
    const char *summary;
    const option_spec *options;
    int n_options;
} command_spec;

static const option_spec graph_options[] = {
    {"model.name", "llama3", "model family (llama3)"},
    {"model.flavor", "debugmodel", "named model configuration"},
    {"training.local_batch_size", "8", "sequences per step (binds the batch symbol)"},
    {"training.seq_len", "2048", "tokens per sequence (binds the seq symbol)"},
    {"graph.print", "true", "print the graph listing before the summary (true|false)"},
};
static const option_spec init_options[] = {
    {"model.name", "llama3", "model family (llama3)"},
    {"model.flavor", "debugmodel", "named model configuration"},
    {"debug.seed", "42", "seed of the parameter initialisation"},
    {"out", "", "output safetensors file (required)"},
};

#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))
static const command_spec commands[] = {
    {"graph", "build the whole-step graph (forward, loss, backward); print it and a summary",
     graph_options, COUNT(graph_options)},
    {"init", "write initialised parameters of a model to a safetensors file", init_options,
     COUNT(init_options)},
};

typedef struct {
    const command_spec *cmd;
    const char *values[16];
} parsed_options;

static int edit_distance(const char *a, const char *b)
{
    int la = (int)strlen(a), lb = (int)strlen(b);
    if (la > 63 || lb > 63) return 99;
    int d[64][64];
    for (int i = 0; i <= la; i++) d[i][0] = i;
    for (int j = 0; j <= lb; j++) d[0][j] = j;
    for (int i = 1; i <= la; i++)
        for (int j = 1; j <= lb; j++) {
            int c = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            if (d[i - 1][j] + 1 < c) c = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < c) c = d[i][j - 1] + 1;
            d[i][j] = c;
        }
    return d[la][lb];
}

static void print_help(const command_spec *cmd)
{
    if (!cmd) {
        printf("usage: graphtrain COMMAND [--section.key=value ...]\n\ncommands:\n");
        for (int c = 0; c < COUNT(commands); c++)
            printf("  %-8s %s\n", commands[c].name, commands[c].summary);
        printf("\n`graphtrain COMMAND --help` lists a command's options.\n");
        return;
    }
    printf("usage: graphtrain %s [options]\n%s\n\noptions (default in brackets):\n", cmd->name,
           cmd->summary);
    for (int k = 0; k < cmd->n_options; k++)
        printf("  --%-28s %s [%s]\n", cmd->options[k].key, cmd->options[k].help,
               cmd->options[k].def);
}

/* Returns 0 on success, 1 after printing an error, 2 when help was printed. */
static int parse_options(const command_spec *cmd, int argc, char **argv, parsed_options *p)
{
    p->cmd = cmd;
    for (int k = 0; k < cmd->n_options; k++) p->values[k] = cmd->options[k].def;
    for (int a = 0; a < argc; a++) {
        const char *arg = argv[a];
        if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
            print_help(cmd);
            return 2;
        }
        if (strncmp(arg, "--", 2) != 0) {
            fprintf(stderr, "graphtrain %s: unexpected argument '%s' (options look like "
                            "--section.key=value)\n", cmd->name, arg);
            return 1;
        }
        char key[128];
        const char *eq = strchr(arg, '=');
        size_t klen = eq ? (size_t)(eq - arg - 2) : strlen(arg + 2);
        if (klen >= sizeof key) klen = sizeof key - 1;
        memcpy(key, arg + 2, klen);
        key[klen] = 0;
        int found = -1, best = -1, best_d = 1 << 30;
        for (int k = 0; k < cmd->n_options; k++) {
            if (!strcmp(cmd->options[k].key, key)) found = k;
            int d = edit_distance(cmd->options[k].key, key);
            if (d < best_d) best_d = d, best = k;
        }
        if (found < 0) {
            fprintf(stderr, "graphtrain %s: unknown option --%s; did you mean --%s? (see "
                            "graphtrain %s --help)\n", cmd->name, key, cmd->options[best].key,
                    cmd->name);
            return 1;
        }
        if (eq) {
            p->values[found] = eq + 1;
        } else if (a + 1 < argc) {
            p->values[found] = argv[++a];
        } else {
            fprintf(stderr, "graphtrain %s: option --%s needs a value\n", cmd->name, key);
            return 1;
        }
    }
    return 0;
}

static const char *opt(const parsed_options *p, const char *key)
{
    for (int k = 0; k < p->cmd->n_options; k++)
        if (!strcmp(p->cmd->options[k].key, key)) return p->values[k];
    return NULL;
}

static int opt_int(const parsed_options *p, const char *key, int64_t lo, int64_t hi, int64_t *out)
{
    const char *s = opt(p, key);
    char *end;
    long long v = strtoll(s, &end, 10);
    if (!*s || *end || v < lo || v > hi) {
        fprintf(stderr, "graphtrain %s: --%s=%s: expected an integer in [%lld, %lld]\n",
                p->cmd->name, key, s, (long long)lo, (long long)hi);
        return 1;
    }
    *out = v;
    return 0;
}

static int opt_bool(const parsed_options *p, const char *key, bool *out)
{
    const char *s = opt(p, key);
    if (!strcmp(s, "true") || !strcmp(s, "1")) return *out = true, 0;
    if (!strcmp(s, "false") || !strcmp(s, "0")) return *out = false, 0;
    fprintf(stderr, "graphtrain %s: --%s=%s: expected true or false\n", p->cmd->name, key, s);
    return 1;
}

static int model_config(const parsed_options *p, gt_llama3_config *cfg)
{
    gt_error err = {0};
    if (strcmp(opt(p, "model.name"), "llama3") != 0) {
        fprintf(stderr, "graphtrain %s: --model.name=%s: unknown model (known: llama3)\n",
                p->cmd->name, opt(p, "model.name"));
        return 1;
    }
    if (gt_llama3_flavor(opt(p, "model.flavor"), cfg, &err) != GT_OK) {
        fprintf(stderr, "graphtrain %s: --model.flavor: %s\n", p->cmd->name, err.msg);
        return 1;
    }
    return 0;
}

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---------------------------------------------------------------- graph */

static int cmd_graph(const parsed_options *p)
{
    gt_llama3_config cfg;
    int64_t batch, seq;
    bool print;
    if (model_config(p, &cfg) || opt_int(p, "training.local_batch_size", 1, 1 << 20, &batch) ||
        opt_int(p, "training.seq_len", 1, 1 << 24, &seq) || opt_bool(p, "graph.print", &print))
        return 1;

    double t0 = now_seconds();
    gt_error err = {0};
    gt_graph *g = gt_graph_new();
    gt_model model = {0};
    int rc = 1;
    if (gt_llama3_build(g, &cfg, &model, &err) != GT_OK || gt_autodiff(g, &err) != GT_OK) {
        fprintf(stderr, "graphtrain graph: %s\n", err.msg);
        goto done;
    }
    double t_build = now_seconds() - t0;
    if (gt_graph_verify(g, &err) != GT_OK) {
        fprintf(stderr, "graphtrain graph: the built graph is invalid: %s\n", err.msg);
        goto done;
    }
    double t_verify = now_seconds() - t0 - t_build;

    gt_sym_binding_entry entries[] = {{"batch", batch}, {"seq", seq}};
    gt_sym_binding binding = {entries, 2};
    gt_flops flops;
    if (gt_graph_count_flops(g, &binding, &flops, &err) != GT_OK) {
        fprintf(stderr, "graphtrain graph: %s\n", err.msg);
        goto done;
    }
    if (print) gt_graph_print(g, stdout);

    int64_t n_params = 0, n_embed = 0;
    for (int k = 0; k < model.n_params; k++) {
        const gt_param_spec *ps = &model.params[k];
        int64_t n = gt_shape_numel(ps->ndim, ps->shape);
        n_params += n;
        if (!strcmp(ps->fqn, "tok_embeddings.weight")) n_embed += n;
    }
    int nodes_by_phase[3] = {0, 0, 0};
    for (int n = 0; n < g->n_nodes; n++) nodes_by_phase[g->nodes[n].phase % 3]++;
    double tokens = (double)batch * (double)seq;
    /* torchtitan's MFU numerator per token: 6·N(non-embedding) + 12·L·H·Dh·S */
    double head_dim = (double)cfg.dim / (double)cfg.n_heads;
    double titan = 6.0 * (double)(n_params - n_embed) +
                   12.0 * (double)cfg.n_layers * (double)cfg.n_heads * head_dim * (double)seq;

    printf("\n# summary: llama3 %s, batch %lld x seq %lld\n", cfg.flavor, (long long)batch,
           (long long)seq);
    printf("nodes            %d (forward %d, backward %d, optimizer %d)\n", g->n_nodes,
           nodes_by_phase[0], nodes_by_phase[1], nodes_by_phase[2]);
    printf("values           %d\n", g->n_values);
    printf("parameters       %lld (%.3f B; %lld without the embedding)\n", (long long)n_params,
           (double)n_params / 1e9, (long long)(n_params - n_embed));
    printf("flops/step       %.4e (matmul %.4e, attention %.4e, other %.4e)\n", flops.total,
           flops.matmul, flops.attention, flops.other);
    printf("flops/step phase forward %.4e, backward %.4e\n", flops.by_phase[0],
           flops.by_phase[1]);
    printf("model flops/tok  %.4e from the graph (matmul + attention); torchtitan's formula "
           "6N+12LHDS gives %.4e\n",
           (flops.matmul + flops.attention) / tokens, titan);
    printf("build            %.2f ms (forward + autodiff), verify %.2f ms\n", 1e3 * t_build,
           1e3 * t_verify);
    rc = 0;
done:
    gt_model_free(&model);
    gt_graph_free(g);
    return rc;
}

/* ---------------------------------------------------------------- init */

static int cmd_init(const parsed_options *p)
{
    gt_llama3_config cfg;
    int64_t seed;
    if (model_config(p, &cfg) || opt_int(p, "debug.seed", 0, INT64_MAX, &seed)) return 1;
    const char *out = opt(p, "out");
    if (!*out) {
        fprintf(stderr, "graphtrain init: --out FILE is required\n");
        return 1;
    }
    gt_error err = {0};
    gt_graph *g = gt_graph_new();
    gt_model model = {0};
    int rc = 0;
    if (gt_llama3_build(g, &cfg, &model, &err) != GT_OK ||
        gt_model_save_init(&model, cfg.flavor, (uint64_t)seed, out, &err) != GT_OK) {
        fprintf(stderr, "graphtrain init: %s\n", err.msg);
        rc = 1;
    }
    gt_model_free(&model);
    gt_graph_free(g);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") ||
        !strcmp(argv[1], "help")) {
        print_help(NULL);
        return argc < 2 ? 1 : 0;
    }
    for (int c = 0; c < COUNT(commands); c++) {
        if (strcmp(argv[1], commands[c].name) != 0) continue;
        parsed_options p;
        int rc = parse_options(&commands[c], argc - 2, argv + 2, &p);
        if (rc) return rc == 2 ? 0 : 1;
        if (!strcmp(commands[c].name, "graph")) return cmd_graph(&p);
        return cmd_init(&p);
    }
    fprintf(stderr, "graphtrain: unknown command '%s' (commands: graph, init; see graphtrain --help)\n",
            argv[1]);
    return 1;
}
