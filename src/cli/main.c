/* main.c — the graphtrain command line: subcommands and their options.
 *
 *   graphtrain train | graph | init | export | tokenize | plot  [options]
 *
 * Options are spelled as torchtitan spells them (--section.key=value or --section.key value).
 * This file only parses and dispatches; the work is in the library.
 *
 * Under mpirun (`mpirun -np 4 graphtrain train ...`) every process runs main: MPI is initialised
 * first, log lines carry the rank ("[graphtrain rank 1] WARN ..."), ranks other than 0 log only
 * warnings and errors, and only rank 0 prints the config and the summary. MPI is finalised at the
 * end, except after an error that may be this rank's alone (its peers may be waiting for it in a
 * collective, and finalising would wait for them): then the process exits at once and mpirun
 * stops the job. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "commands.h"
#include "graphtrain/gt_backend.h"
#include "graphtrain/gt_comm.h"
#include "graphtrain/gt_config.h"
#include "graphtrain/gt_data.h"
#include "graphtrain/gt_metrics.h"
#include "graphtrain/gt_model.h"
#include "graphtrain/gt_train.h"

/* ---------------------------------------------------------------- options
 *
 * Every subcommand that builds a model reads the training config (defaults ← --config FILE ←
 * --section.key=value overrides; see docs/CONFIG.md). A few options belong to one subcommand
 * alone (graph's --graph.print, init's --out, export's --hf); they are taken out of argv before the
 * rest goes to the config resolver. */

static const char *const graph_local[] = {"graph.print", "graph.dump_dir", "graph.svg", NULL};
static const char *const init_local[] = {"out", NULL};
static const char *const export_local[] = {"hf", "step", "dtype", NULL};
static const char *const tokenize_local[] = {"tokenizer", "out", "format", "json_field", NULL};
static const char *const plot_local[] = {"out", NULL};
static const char *const none_local[] = {NULL};

static const command_spec commands[] = {
    {"train", "train a model as the config says (CPU, or GPU with --training.device cuda)",
     "graphtrain train [--config FILE] [--section.key=value ...]", none_local},
    {"graph", "build the whole-step graph (forward, loss, backward, AdamW); print it and a summary",
     "graphtrain graph [--graph.print=true|false] [--graph.dump_dir DIR [--graph.svg=true|false]]\n"
     "                 [--config FILE] [--section.key=value ...]",
     graph_local},
    {"init", "write initialised parameters of the configured model to a safetensors file",
     "graphtrain init --out FILE [--config FILE] [--section.key=value ...]", init_local},
    {"export", "write a checkpoint as a Hugging Face llama directory",
     "graphtrain export --hf DIR [--step N] [--dtype float32|bfloat16] [--config FILE] "
     "[--section.key=value ...]",
     export_local},
    {"tokenize", "tokenize text or JSON-lines files into a token shard",
     "graphtrain tokenize --tokenizer tokenizer.json --out FILE.bin [--format auto|text|jsonl] "
     "[--json_field text] INPUT...",
     tokenize_local},
    {"plot", "draw loss and throughput curves of a metrics file as SVG",
     "graphtrain plot METRICS.jsonl [--out FILE.svg]", plot_local},
};
#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

static void print_help(const command_spec *cmd)
{
    if (!cmd) {
        printf("usage: graphtrain COMMAND [options]\n\ncommands:\n");
        for (int c = 0; c < COUNT(commands); c++)
            printf("  %-9s %s\n", commands[c].name, commands[c].summary);
        printf("\n`graphtrain COMMAND --help` shows a command's usage and options.\n");
        return;
    }
    printf("usage: %s\n%s\n", cmd->usage, cmd->summary);
    if (strcmp(cmd->name, "tokenize") && strcmp(cmd->name, "plot")) {
        printf("\nconfig options (defaults; docs/CONFIG.md):\n");
        gt_config_help(stdout);
    }
}

/* Moves --LOCAL=value / --LOCAL value into out->local; everything else into out->rest. */
static int split_local(const command_spec *cmd, int argc, char **argv, split_args *out)
{
    memset(out, 0, sizeof *out);
    for (int a = 0; a < argc; a++) {
        const char *arg = argv[a];
        int found = -1;
        size_t klen = 0;
        if (!strncmp(arg, "--", 2)) {
            const char *eq = strchr(arg, '=');
            klen = eq ? (size_t)(eq - arg - 2) : strlen(arg + 2);
            for (int k = 0; cmd->local[k]; k++)
                if (strlen(cmd->local[k]) == klen && !strncmp(arg + 2, cmd->local[k], klen))
                    found = k;
        }
        if (found < 0) {
            if (out->n_rest >= COUNT(out->rest)) {
                fprintf(stderr, "graphtrain %s: too many arguments\n", cmd->name);
                return 1;
            }
            out->rest[out->n_rest++] = argv[a];
            continue;
        }
        if (arg[2 + klen] == '=') {
            out->local[found] = arg + 3 + klen;
        } else if (a + 1 < argc) {
            out->local[found] = argv[++a];
        } else {
            fprintf(stderr, "graphtrain %s: option --%s needs a value\n", cmd->name,
                    cmd->local[found]);
            return 1;
        }
    }
    return 0;
}

int gt_cli_resolve_config(const command_spec *cmd, split_args *sa, gt_config *cfg)
{
    gt_error err = {0};
    if (gt_config_resolve(sa->n_rest, sa->rest, cfg, &err) != GT_OK) {
        fprintf(stderr, "graphtrain %s: %s\n", cmd->name, err.msg);
        return 1;
    }
    return 0;
}

int gt_cli_finish(int rc, gt_model *model, gt_graph *g, gt_config *cfg)
{
    gt_model_free(model);
    gt_graph_free(g);
    gt_config_free(cfg);
    return rc;
}

int gt_cli_model_config(const gt_config *c, gt_model_config *mc)
{
    gt_error err = {0};
    if (gt_train_model_config(c, mc, &err) != GT_OK) {
        fprintf(stderr, "graphtrain: %s\n", err.msg);
        return 1;
    }
    return 0;
}

/* ---------------------------------------------------------------- init */

static int cmd_init(const command_spec *cmd, split_args *sa)
{
    const char *out = sa->local[0];
    if (!out || !*out) {
        fprintf(stderr, "graphtrain init: --out FILE is required\n");
        return 1;
    }
    gt_config cfg;
    gt_model_config mcfg;
    if (gt_cli_resolve_config(cmd, sa, &cfg)) return 1;
    gt_error err = {0};
    gt_graph *g = gt_graph_new();
    gt_model model = {0};
    int rc = 1;
    if (gt_cli_model_config(&cfg, &mcfg)) goto done;
    if (gt_model_build(g, &mcfg, &model, &err) != GT_OK ||
        gt_model_save_init(&model, mcfg.flavor, (uint64_t)cfg.debug.seed, out, &err) != GT_OK) {
        fprintf(stderr, "graphtrain init: %s\n", err.msg);
        goto done;
    }
    rc = 0;
done:
    return gt_cli_finish(rc, &model, g, &cfg);
}

/* ---------------------------------------------------------------- train */

/* This process in an MPI run (rank 0 of 1 otherwise). */
typedef struct {
    int rank, size;
    bool mpi;           /* MPI was initialised here */
    bool skip_finalize; /* an error of this rank alone: exit without finalising */
} cli_ranks;

static void rank_log_sink(gt_log_level level, const char *msg, void *user)
{
    static const char *const names[] = {"DEBUG", "INFO", "WARN", "ERROR"};
    const cli_ranks *r = user;
    fprintf(stderr, "[graphtrain rank %d] %s %s\n", r->rank, names[level], msg);
}

/* Under an MPI launcher: initialise MPI and route the log through the rank's prefix. */
static int init_ranks(cli_ranks *r)
{
    memset(r, 0, sizeof *r);
    r->size = 1;
    if (!gt_train_launched_by_mpi() || !gt_comm_mpi_available()) {
        /* a torchrun-style launch (RANK / WORLD_SIZE, the TCP communicator): the same log prefix
         * and quiet non-zero ranks; the trainer validates the variables */
        const char *rank = getenv("RANK"), *size = getenv("WORLD_SIZE");
        if (rank && size && atoi(size) > 1) {
            r->rank = atoi(rank);
            r->size = atoi(size);
            gt_log_set_sink(rank_log_sink, r);
            if (r->rank != 0) gt_log_set_level(GT_LOG_WARN);
        }
        return 0;
    }
    gt_error err = {0};
    gt_comm *world = NULL;
    if (gt_comm_mpi_world(NULL, NULL, &world, &err) != GT_OK) {
        fprintf(stderr, "graphtrain: %s\n", err.msg);
        return 1;
    }
    r->mpi = true;
    r->rank = gt_comm_rank(world);
    r->size = gt_comm_size(world);
    gt_comm_destroy(world);
    if (r->size > 1) {
        gt_log_set_sink(rank_log_sink, r);
        if (r->rank != 0) gt_log_set_level(GT_LOG_WARN);
    }
    return 0;
}

static int cmd_train(const command_spec *cmd, split_args *sa, cli_ranks *ranks)
{
    gt_config cfg;
    if (gt_cli_resolve_config(cmd, sa, &cfg)) return 1;
    if (cfg.job.print_config && ranks->rank == 0) {
        printf("# resolved config\n");
        gt_config_print(&cfg, stdout);
        printf("\n");
        fflush(stdout);
    }
    gt_error err = {0};
    gt_train_result res;
    gt_status st = gt_train(&cfg, &res, &err);
    gt_config_free(&cfg);
    if (st != GT_OK) {
        if (ranks->size > 1)
            fprintf(stderr, "graphtrain train (rank %d of %d): %s\n", ranks->rank, ranks->size,
                    err.msg);
        else
            fprintf(stderr, "graphtrain train: %s\n", err.msg);
        ranks->skip_finalize = res.error_is_local;
        if (res.device_abandoned) { /* no exit-time device or MPI teardown: it could wait forever */
            fflush(NULL);
            _exit(1);
        }
        return 1;
    }
    if (ranks->rank != 0) return 0;
    if (res.last_step >= res.first_step) {
        printf("trained steps %lld..%lld: final loss %.6f", (long long)res.first_step,
               (long long)res.last_step, res.final_loss);
        if (res.entropy_rate == res.entropy_rate)
            printf(", corpus entropy rate %.6f (gap %.4f nats)", res.entropy_rate,
                   res.final_loss - res.entropy_rate);
        printf("; params xxh64 %016llx\n", (unsigned long long)res.params_hash);
    } else {
        printf("nothing to train: the checkpoint is already at the last step\n");
    }
    return 0;
}

/* ---------------------------------------------------------------- export */

static int cmd_export(const command_spec *cmd, split_args *sa)
{
    const char *dir = sa->local[0], *step_s = sa->local[1], *dtype_s = sa->local[2];
    if (!dir || !*dir) {
        fprintf(stderr, "graphtrain export: --hf DIR is required\n");
        return 1;
    }
    int64_t step = -1;
    if (step_s) {
        char *end;
        step = strtoll(step_s, &end, 10);
        if (!*step_s || *end || step < 0) {
            fprintf(stderr, "graphtrain export: --step=%s: expected a step number >= 0\n", step_s);
            return 1;
        }
    }
    gt_dtype dt = GT_F32;
    if (dtype_s && (!gt_dtype_from_name(dtype_s, &dt) || (dt != GT_F32 && dt != GT_BF16))) {
        fprintf(stderr, "graphtrain export: --dtype=%s: expected float32 or bfloat16\n", dtype_s);
        return 1;
    }
    gt_config cfg;
    if (gt_cli_resolve_config(cmd, sa, &cfg)) return 1;
    gt_error err = {0};
    int rc = gt_train_export_hf(&cfg, step, dir, dt, &err) == GT_OK ? 0 : 1;
    if (rc)
        fprintf(stderr, "graphtrain export: %s\n", err.msg);
    else
        printf("exported to %s\n", dir);
    gt_config_free(&cfg);
    return rc;
}

/* ---------------------------------------------------------------- tokenize */

static int cmd_tokenize(const command_spec *cmd, split_args *sa)
{
    (void)cmd;
    const char *tok_path = sa->local[0], *out = sa->local[1], *fmt = sa->local[2];
    if (!tok_path || !out || sa->n_rest == 0) {
        fprintf(stderr, "graphtrain tokenize: needs --tokenizer FILE, --out FILE and at least one "
                        "input file\n");
        return 1;
    }
    for (int k = 0; k < sa->n_rest; k++)
        if (!strncmp(sa->rest[k], "--", 2)) {
            fprintf(stderr,
                    "graphtrain tokenize: unknown option %s (options: --tokenizer, --out, "
                    "--format, --json_field)\n",
                    sa->rest[k]);
            return 1;
        }
    gt_tokenize_options o;
    gt_tokenize_options_default(&o);
    if (fmt) {
        if (!strcmp(fmt, "auto"))
            o.format = GT_TEXT_AUTO;
        else if (!strcmp(fmt, "text"))
            o.format = GT_TEXT_PLAIN;
        else if (!strcmp(fmt, "jsonl"))
            o.format = GT_TEXT_JSONL;
        else {
            fprintf(stderr, "graphtrain tokenize: --format=%s: expected auto, text or jsonl\n",
                    fmt);
            return 1;
        }
    }
    if (sa->local[3]) o.json_field = sa->local[3];
    gt_error err = {0};
    gt_tokenizer *tok = NULL;
    gt_tokenize_stats stats = {0};
    int rc = 1;
    if (gt_tokenizer_load(tok_path, &tok, &err) == GT_OK &&
        gt_data_tokenize_to_shard(tok, (const char *const *)sa->rest, sa->n_rest, &o, out, &stats,
                                  &err) == GT_OK) {
        printf("tokenized %lld file(s), %lld document(s), %lld bytes -> %lld tokens in %s\n",
               (long long)stats.files, (long long)stats.documents, (long long)stats.bytes,
               (long long)stats.tokens, out);
        rc = 0;
    } else {
        fprintf(stderr, "graphtrain tokenize: %s\n", err.msg);
    }
    gt_tokenizer_free(tok);
    return rc;
}

/* ---------------------------------------------------------------- plot */

static int cmd_plot(const command_spec *cmd, split_args *sa)
{
    (void)cmd;
    if (sa->n_rest != 1 || !strncmp(sa->rest[0], "--", 2)) {
        fprintf(stderr, "graphtrain plot: expected one metrics file (usage: graphtrain plot "
                        "METRICS.jsonl [--out FILE.svg])\n");
        return 1;
    }
    const char *in = sa->rest[0];
    char out[4096];
    if (sa->local[0])
        snprintf(out, sizeof out, "%s", sa->local[0]);
    else
        snprintf(out, sizeof out, "%s.svg", in);
    gt_error err = {0};
    if (gt_metrics_plot_file(in, out, NULL, &err) != GT_OK) {
        fprintf(stderr, "graphtrain plot: %s\n", err.msg);
        return 1;
    }
    printf("wrote %s\n", out);
    return 0;
}

/* OpenBLAS picks its kernels from CPUID when it loads; where that falls back to narrower ones
 * than the CPU's features allow (VMs that hide the model), set OPENBLAS_CORETYPE to the right core
 * and start again, once (cpu_blas.c). A user's OPENBLAS_CORETYPE always wins. If the restart fails
 * the run goes on with OpenBLAS's choice, saying so. */
static void blas_pick_core(char **argv)
{
    if (getenv("OPENBLAS_CORETYPE") || getenv("GT_BLAS_CORE_DETECTED")) return;
    gt_cpu_features f;
    gt_cpu_features_detect(&f);
    const char *chosen = gt_cpu_blas_core(), *want = gt_cpu_blas_core_for(chosen, &f);
    if (!want) return;
    setenv("GT_BLAS_CORE_DETECTED", chosen, 1);
    setenv("OPENBLAS_CORETYPE", want, 1);
    execv("/proc/self/exe", argv);
    fprintf(stderr,
            "warning: OpenBLAS chose its %s kernels on a CPU that runs %s's; restarting with "
            "OPENBLAS_CORETYPE=%s failed: %s (set it yourself for the faster kernels)\n",
            chosen, want, want, strerror(errno));
    unsetenv("OPENBLAS_CORETYPE");
}

int main(int argc, char **argv)
{
    /* Whole lines on stdout even into a file shared with stderr (`> log 2>&1`, a launcher's
     * capture): NCCL's NCCL_DEBUG lines go to stdout too, and a full buffer would cut one of them
     * where it fills, between our stderr lines. */
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") ||
        !strcmp(argv[1], "help")) {
        print_help(NULL);
        return argc < 2 ? 1 : 0;
    }
    blas_pick_core(argv);
    gt_cpu_set_threads(1); /* OpenBLAS on one thread; train sets the matmul threads it wants */
    for (int c = 0; c < COUNT(commands); c++) {
        const command_spec *cmd = &commands[c];
        if (strcmp(argv[1], cmd->name) != 0) continue;
        for (int a = 2; a < argc; a++)
            if (!strcmp(argv[a], "--help") || !strcmp(argv[a], "-h")) {
                print_help(cmd);
                return 0;
            }
        split_args sa;
        if (split_local(cmd, argc - 2, argv + 2, &sa)) return 1;
        if (c <= 1) { /* train and graph run on every rank of an MPI launch */
            cli_ranks ranks;
            if (init_ranks(&ranks)) return 1;
            int rc = c == 0 ? cmd_train(cmd, &sa, &ranks) : gt_cli_graph(cmd, &sa);
            fflush(NULL);
            if (ranks.mpi && !ranks.skip_finalize) {
                gt_error err = {0};
                if (gt_comm_mpi_finalize(&err) != GT_OK && rc == 0) {
                    fprintf(stderr, "graphtrain: %s\n", err.msg);
                    rc = 1;
                }
            }
            gt_log_set_sink(NULL, NULL);
            return rc;
        }
        switch (c) {
        case 2:
            return cmd_init(cmd, &sa);
        case 3:
            return cmd_export(cmd, &sa);
        case 4:
            return cmd_tokenize(cmd, &sa);
        default:
            return cmd_plot(cmd, &sa);
        }
    }
    fprintf(stderr, "graphtrain: unknown command '%s' (see graphtrain --help)\n", argv[1]);
    return 1;
}
