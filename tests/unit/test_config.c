/* test_config.c — the config schema and its resolution: torchtitan's defaults, every file in
 * configs/, command-line overrides over file values, the fixed error messages (docs/CONFIG.md),
 * and print → parse → equal round trips, also for random configs. */
#include "graphtrain/gt_config.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gt_test.h"

/* ---------------------------------------------------------------- helpers */

static char tmp_dir[256];

static const char *write_tmp(const char *name, const char *text)
{
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", tmp_dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) return path;
    fputs(text, f);
    fclose(f);
    return path;
}

/* gt_config_print into a string (the caller frees it). */
static char *print_to_string(const gt_config *c, size_t *len)
{
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    gt_config_print(c, f);
    fclose(f);
    return buf;
}

/* print → load on top of defaults → must be equal. */
static bool round_trips(const gt_config *c, const char *what)
{
    size_t len;
    char *text = print_to_string(c, &len);
    gt_config back;
    gt_config_defaults(&back);
    gt_error err = {0};
    gt_status st = gt_config_load_string(&back, text, len, "printed.toml", &err);
    bool eq = st == GT_OK && gt_config_equal(c, &back);
    if (!eq) fprintf(stderr, "round trip of %s failed: %s\n%s\n", what, err.msg, text);
    gt_config_free(&back);
    free(text);
    return eq;
}

static int argv_count(char **argv)
{
    int n = 0;
    while (argv[n])
        n++;
    return n;
}

/* ---------------------------------------------------------------- defaults and schema */

static void test_defaults(void)
{
    gt_config c;
    gt_config_defaults(&c);
    /* torchtitan's defaults (REFERENCE.md "Training defaults", docs of JobConfig). */
    EXPECT(!strcmp(c.job.dump_folder, "./outputs") && !strcmp(c.job.config_file, ""), "job");
    EXPECT(!strcmp(c.model.name, "llama3") && !strcmp(c.model.flavor, "debugmodel"), "model");
    EXPECT(c.training.local_batch_size == 8 && c.training.global_batch_size == -1 &&
               c.training.seq_len == 2048 && c.training.steps == 10 && c.training.max_norm == 1.0,
           "training sizes");
    EXPECT(c.training.mixed_precision_param == GT_CFG_PRECISION_BFLOAT16 &&
               c.training.mixed_precision_reduce == GT_CFG_PRECISION_FLOAT32 &&
               c.training.dataset == GT_CFG_DATASET_SYNTHETIC &&
               c.training.device == GT_CFG_DEVICE_CPU,
           "training enums");
    EXPECT(c.optimizer.name == GT_CFG_OPTIMIZER_ADAMW && c.optimizer.lr == 8e-4 &&
               c.optimizer.beta1 == 0.9 && c.optimizer.beta2 == 0.95 && c.optimizer.eps == 1e-8 &&
               c.optimizer.weight_decay == 0.1,
           "optimizer");
    EXPECT(c.lr_scheduler.warmup_steps == 2 && !c.lr_scheduler.has_decay_ratio &&
               c.lr_scheduler.decay_type == GT_CFG_DECAY_LINEAR &&
               c.lr_scheduler.min_lr_factor == 0.0,
           "lr_scheduler");
    EXPECT(c.parallelism.data_parallel_replicate_degree == 1 &&
               c.parallelism.data_parallel_shard_degree == -1 &&
               c.parallelism.tensor_parallel_degree == 1 &&
               c.parallelism.enable_sequence_parallel &&
               c.parallelism.expert_parallel_degree == 1 &&
               c.parallelism.pipeline_parallel_degree == 1 &&
               c.parallelism.fsdp_reshard_after_forward == GT_CFG_RESHARD_DEFAULT,
           "parallelism");
    EXPECT(c.compile.enable && c.compile.memory_policy == GT_CFG_MEMORY_DEFAULT &&
               c.compile.disable_passes.n == 0 && !c.compile.debug_graph_passes &&
               !strcmp(c.compile.precompile_artifact_dir, ""),
           "compile");
    EXPECT(!c.checkpoint.enable && !strcmp(c.checkpoint.folder, "checkpoint") &&
               c.checkpoint.interval == 500 && c.checkpoint.keep_latest_k == 10 &&
               c.checkpoint.load_step == -1,
           "checkpoint");
    EXPECT(c.metrics.log_freq == 10 && !c.metrics.enable_tensorboard, "metrics");
    EXPECT(c.debug.seed == 0 && !c.debug.deterministic, "debug");
    gt_error err = {0};
    EXPECT_OK(gt_config_validate(&c, &err), &err);
    gt_config_free(&c);
}

static void test_schema(void)
{
    int n;
    const gt_cfg_option *o = gt_config_options(&n);
    EXPECT(n >= 50, "%d options", n);
    gt_config d;
    gt_config_defaults(&d);
    for (int i = 0; i < n; i++) {
        char name[128];
        snprintf(name, sizeof name, "%s.%s", o[i].section, o[i].key);
        EXPECT(gt_config_find_option(name) == &o[i], "%s found by name", name);
        EXPECT(o[i].help && strlen(o[i].help) > 5, "%s has help", name);
        for (int j = 0; j < i; j++)
            EXPECT(strcmp(o[i].section, o[j].section) || strcmp(o[i].key, o[j].key),
                   "%s declared twice", name);
        /* Sections are contiguous (printing and help group by them). */
        if (i > 1 && strcmp(o[i].section, o[i - 1].section))
            for (int j = 0; j < i; j++)
                EXPECT(strcmp(o[j].section, o[i].section), "%s split", name);
        if (o[i].type == GT_CFG_INT) {
            int64_t v = *(const int64_t *)((const char *)&d + o[i].offset);
            EXPECT(o[i].int_min <= v && v <= o[i].int_max, "%s default in range", name);
        }
        if (o[i].type == GT_CFG_FLOAT) {
            EXPECT(o[i].float_min <= o[i].float_max, "%s range", name);
            EXPECT(!o[i].default_value == (o[i].has_offset != 0), "%s optional iff no default",
                   name);
        }
        if (o[i].type == GT_CFG_ENUM) EXPECT(o[i].choices && o[i].choices[0], "%s choices", name);
    }
    EXPECT(gt_config_find_option("training.stepz") == NULL &&
               gt_config_find_option("training") == NULL,
           "unknown names");
    /* --help lists every option with its default. */
    char *buf = NULL;
    size_t len;
    FILE *f = open_memstream(&buf, &len);
    gt_config_help(f);
    fclose(f);
    for (int i = 0; i < n; i++) {
        char flag[140];
        snprintf(flag, sizeof flag, "--%s.%s=", o[i].section, o[i].key);
        EXPECT(strstr(buf, flag) != NULL, "help lists %s", flag);
    }
    EXPECT(strstr(buf, "--training.steps=INT") && strstr(buf, "default 10; in [1, "),
           "help shows type, default, range");
    EXPECT(strstr(buf, "one of bfloat16, float32"), "help lists enum values");
    free(buf);
    /* docs/CONFIG.md documents every option, under its section. */
    FILE *doc = fopen(gt_test_path("docs/CONFIG.md"), "rb");
    EXPECT(doc != NULL, "docs/CONFIG.md exists");
    if (doc) {
        static char text[1 << 17];
        size_t got = fread(text, 1, sizeof text - 1, doc);
        text[got] = '\0';
        fclose(doc);
        for (int i = 0; i < n; i++) {
            char head[80], row[100];
            snprintf(head, sizeof head, "### [%s]", o[i].section);
            snprintf(row, sizeof row, "| `%s` |", o[i].key);
            const char *sec = strstr(text, head);
            const char *next = sec ? strstr(sec + 1, "### [") : NULL;
            const char *at = sec ? strstr(sec, row) : NULL;
            EXPECT(at && (!next || at < next), "docs/CONFIG.md documents %s.%s", o[i].section,
                   o[i].key);
        }
    }
    gt_config_free(&d);
}

/* ---------------------------------------------------------------- configs/ */

static void test_config_files(void)
{
    DIR *dir = opendir(gt_test_path("configs"));
    EXPECT(dir != NULL, "configs/ exists");
    if (!dir) return;
    int files = 0;
    struct dirent *e;
    while ((e = readdir(dir))) {
        size_t l = strlen(e->d_name);
        if (l < 6 || strcmp(e->d_name + l - 5, ".toml")) continue;
        char path[8192];
        snprintf(path, sizeof path, "%s/%s", gt_test_path("configs"), e->d_name);
        char *argv[] = {"--config", path, NULL};
        gt_config c;
        gt_error err = {0};
        EXPECT_OK(gt_config_resolve(2, argv, &c, &err), &err);
        if (err.code != GT_OK) continue;
        EXPECT(!strcmp(c.job.config_file, path), "%s recorded as config_file", e->d_name);
        EXPECT(round_trips(&c, e->d_name), "%s round trip", e->d_name);
        gt_config_free(&c);
        files++;
    }
    closedir(dir);
    EXPECT(files >= 4, "%d config files", files);

    /* torchtitan's debug config, value by value. */
    char *argv[] = {"--config", (char *)gt_test_path("configs/llama3_debugmodel.toml"), NULL};
    gt_config c;
    gt_error err = {0};
    EXPECT_OK(gt_config_resolve(2, argv, &c, &err), &err);
    if (err.code == GT_OK) {
        EXPECT(!strcmp(c.model.flavor, "debugmodel") && c.training.local_batch_size == 8 &&
                   c.training.seq_len == 2048 && c.training.steps == 10 && c.optimizer.lr == 8e-4 &&
                   c.lr_scheduler.warmup_steps == 2 && c.lr_scheduler.has_decay_ratio &&
                   c.lr_scheduler.decay_ratio == 0.8 &&
                   c.lr_scheduler.decay_type == GT_CFG_DECAY_LINEAR && c.training.max_norm == 1.0 &&
                   c.metrics.log_freq == 1,
               "llama3_debugmodel values");
        gt_config_free(&c);
    }
    char *argv2[] = {"--config", (char *)gt_test_path("configs/default.toml"), NULL};
    EXPECT_OK(gt_config_resolve(2, argv2, &c, &err), &err);
    if (err.code == GT_OK) {
        EXPECT(c.training.dataset == GT_CFG_DATASET_SYNTHETIC &&
                   c.training.mixed_precision_param == GT_CFG_PRECISION_FLOAT32 &&
                   c.training.device == GT_CFG_DEVICE_CPU,
               "default.toml is a CPU float32 synthetic run");
        gt_config_free(&c);
    }
}

/* ---------------------------------------------------------------- overrides */

static void test_overrides(void)
{
    const char *path = write_tmp("o.toml", "[training]\nsteps = 5\nseq_len = 64\n[optimizer]\n"
                                           "lr = 0.01\n[job]\nconfig_file = \"ignored\"\n");
    char p[512];
    snprintf(p, sizeof p, "%s", path);
    gt_config c;
    gt_error err = {0};

    /* The file beats defaults; the command line beats the file, wherever --config stands. */
    char *a1[] = {"--training.steps", "7", "--config", p, "--optimizer.lr=3e-4", NULL};
    EXPECT_OK(gt_config_resolve(argv_count(a1), a1, &c, &err), &err);
    EXPECT(c.training.steps == 7 && c.training.seq_len == 64 && c.optimizer.lr == 3e-4 &&
               c.training.local_batch_size == 8 && !strcmp(c.job.config_file, p),
           "defaults <- file <- command line (steps %lld, seq %lld, lr %g, file %s)",
           (long long)c.training.steps, (long long)c.training.seq_len, c.optimizer.lr,
           c.job.config_file);
    gt_config_free(&c);

    char jc[600];
    snprintf(jc, sizeof jc, "--job.config_file=%s", p);
    char *a2[] = {jc, "--training.steps=3", "--training.steps=4", NULL};
    EXPECT_OK(gt_config_resolve(argv_count(a2), a2, &c, &err), &err);
    EXPECT(c.training.steps == 4 && c.training.seq_len == 64, "--job.config_file; later flag wins");
    gt_config_free(&c);

    /* Every spelling of a value. */
    char *a3[] = {"--checkpoint.enable",
                  "--compile.enable",
                  "false",
                  "--parallelism.enable_sequence_parallel=false",
                  "--debug.deterministic",
                  "true",
                  "--compile.disable_passes",
                  "dce, fuse ,,cse",
                  "--training.global_batch_size",
                  "-1",
                  "--debug.seed",
                  "0x10",
                  "--training.steps=1_000",
                  "--optimizer.lr",
                  ".5",
                  "--optimizer.eps=1",
                  "--lr_scheduler.decay_ratio=0.25",
                  "--training.mixed_precision_param",
                  "float32",
                  "--job.description",
                  "a run = with --dashes",
                  "--model.hf_assets_path=",
                  NULL};
    EXPECT_OK(gt_config_resolve(argv_count(a3), a3, &c, &err), &err);
    EXPECT(c.checkpoint.enable && !c.compile.enable && !c.parallelism.enable_sequence_parallel &&
               c.debug.deterministic,
           "booleans");
    EXPECT(c.compile.disable_passes.n == 3 && !strcmp(c.compile.disable_passes.items[0], "dce") &&
               !strcmp(c.compile.disable_passes.items[1], "fuse") &&
               !strcmp(c.compile.disable_passes.items[2], "cse"),
           "comma list");
    EXPECT(c.training.global_batch_size == -1 && c.debug.seed == 16 && c.training.steps == 1000,
           "integers");
    EXPECT(c.optimizer.lr == 0.5 && c.optimizer.eps == 1.0 && c.lr_scheduler.has_decay_ratio &&
               c.lr_scheduler.decay_ratio == 0.25,
           "floats");
    EXPECT(c.training.mixed_precision_param == GT_CFG_PRECISION_FLOAT32, "enum");
    EXPECT(!strcmp(c.job.description, "a run = with --dashes") &&
               !strcmp(c.model.hf_assets_path, ""),
           "strings");
    char *a4[] = {"--compile.disable_passes=[\"a\", 'b,c']", "--lr_scheduler.decay_ratio", "none",
                  NULL};
    EXPECT_OK(gt_config_apply_overrides(&c, argv_count(a4), a4, &err), &err);
    EXPECT(c.compile.disable_passes.n == 2 && !strcmp(c.compile.disable_passes.items[1], "b,c") &&
               !c.lr_scheduler.has_decay_ratio,
           "TOML array list; optional float unset by none");
    EXPECT_OK(gt_config_set(&c, "training.seq_len", "256", &err), &err);
    EXPECT(c.training.seq_len == 256, "gt_config_set");
    gt_config_free(&c);
}

/* ---------------------------------------------------------------- error messages */

typedef struct {
    const char *toml; /* NULL: use argv */
    const char *argv[4];
    const char *message; /* exact; "F" stands for the file name */
} error_case;

static const error_case error_cases[] = {
    /* unknown options and sections, with the nearest valid key */
    {"[training]\nstesp = 5\n",
     {0},
     "F:2:1: training.stesp: unknown option; did you mean training.steps?"},
    {"[training]\nlr = 0.1\n",
     {0},
     "F:2:1: training.lr: unknown option; did you mean optimizer.lr?"},
    {"[trainig]\nsteps = 5\n",
     {0},
     "F:2:1: trainig.steps: unknown option; did you mean training.steps?"},
    {"[trainig]\n", {0}, "F:1:1: [trainig]: unknown section; did you mean training?"},
    {"steps = 5\n", {0}, "F:1:1: steps: unknown option; did you mean training.steps?"},
    {"[training.extra]\nx = 1\n",
     {0},
     "F:1:1: training.extra: unknown option; did you mean training.device?"},
    {NULL,
     {"--training.stesp=5"},
     "command line: --training.stesp: unknown option; did you mean --training.steps?"},
    {NULL,
     {"--optimizer.weight_decy", "1"},
     "command line: --optimizer.weight_decy: unknown option; did you mean "
     "--optimizer.weight_decay?"},
    {NULL, {"--steps=5"}, "command line: --steps: unknown option; did you mean --training.steps?"},
    /* wrong type */
    {"[training]\nsteps = \"ten\"\n",
     {0},
     "F:2:1: training.steps: expected an integer, got string \"ten\""},
    {"[training]\nsteps = 1.5\n", {0}, "F:2:1: training.steps: expected an integer, got float 1.5"},
    {"[optimizer]\nlr = \"fast\"\n",
     {0},
     "F:2:1: optimizer.lr: expected a number, got string \"fast\""},
    {"[checkpoint]\nenable = \"yes\"\n",
     {0},
     "F:2:1: checkpoint.enable: expected true or false, got string \"yes\""},
    {"[model]\nflavor = 8\n", {0}, "F:2:1: model.flavor: expected a string, got integer 8"},
    {"[compile]\ndisable_passes = \"dce\"\n",
     {0},
     "F:2:1: compile.disable_passes: expected an array of strings, got string \"dce\""},
    {"[compile]\ndisable_passes = [\"dce\", 3]\n",
     {0},
     "F:2:1: compile.disable_passes: expected an array of strings, element 2 is integer 3"},
    {"training = 5\n",
     {0},
     "F:1:1: training: expected a table (section [training]), got integer 5"},
    {NULL,
     {"--training.steps=ten"},
     "command line: --training.steps: expected an integer, got \"ten\""},
    {NULL,
     {"--training.steps", "2.0"},
     "command line: --training.steps: expected an integer, got float 2.0"},
    {NULL,
     {"--checkpoint.enable=yes"},
     "command line: --checkpoint.enable: expected true or false, got \"yes\""},
    {NULL,
     {"--optimizer.lr=fast"},
     "command line: --optimizer.lr: expected a number, got \"fast\""},
    {NULL,
     {"--compile.disable_passes=[\"a\""},
     "command line: --compile.disable_passes: TOML array: unterminated array (no closing ']')"},
    /* out of range */
    {"[training]\nsteps = 0\n",
     {0},
     "F:2:1: training.steps: out of range: expected an integer in [1, 1099511627776], got 0"},
    {"[optimizer]\nlr = -1e-3\n",
     {0},
     "F:2:1: optimizer.lr: out of range: expected a number >= 0.0, got -0.001"},
    {"[lr_scheduler]\ndecay_ratio = 1.5\n",
     {0},
     "F:2:1: lr_scheduler.decay_ratio: out of range: expected a number in [0.0, 1.0], got 1.5"},
    {"[optimizer]\nlr = nan\n",
     {0},
     "F:2:1: optimizer.lr: out of range: expected a number >= 0.0, got nan"},
    {"[debug]\nseed = -1\n",
     {0},
     "F:2:1: debug.seed: out of range: expected an integer >= 0, got -1"},
    {NULL,
     {"--training.local_batch_size", "0"},
     "command line: --training.local_batch_size: out of range: expected an integer in [1, "
     "1048576], got 0"},
    /* bad enum value */
    {"[training]\nmixed_precision_param = \"fp8\"\n",
     {0},
     "F:2:1: training.mixed_precision_param: expected one of bfloat16, float32; got string "
     "\"fp8\""},
    {NULL,
     {"--parallelism.fsdp_reshard_after_forward", "sometimes"},
     "command line: --parallelism.fsdp_reshard_after_forward: expected one of default, always, "
     "never; got \"sometimes\""},
    {NULL,
     {"--compile.memory_policy=Full"},
     "command line: --compile.memory_policy: expected one of default, full, eager, none, budget; "
     "got \"Full\""},
    /* TOML syntax, duplicates */
    {"[training]\nsteps 5\n", {0}, "F:2:7: expected '=' after key, found '5'"},
    {"[training]\nsteps = 1\nsteps = 2\n",
     {0},
     "F:3:1: duplicate key 'steps' (first defined at line 2)"},
    {"[training]\n[optimizer]\n[training]\n",
     {0},
     "F:3:1: table [training] is defined twice (first at line 1)"},
    {"[training]\nsteps = \"10\n",
     {0},
     "F:2:9: unterminated string (a newline before the closing quote; use triple quotes for a "
     "multi-line string)"},
    /* command-line shape */
    {NULL, {"--training.steps"}, "command line: --training.steps: needs a value"},
    {NULL, {"--training.steps", "--debug.seed=1"}, "command line: --training.steps: needs a value"},
    {NULL,
     {"train"},
     "command line: unexpected argument train (options look like --section.key=value)"},
    {NULL, {"--config"}, "command line: --config: needs a value"},
    /* rules between options */
    {NULL,
     {"--compile.memory_policy=budget"},
     "config: compile.memory_policy = \"budget\" needs compile.activation_memory_budget_gb > 0"},
    {NULL,
     {"--training.global_batch_size=0"},
     "config: training.global_batch_size: expected -1 (local_batch_size x data-parallel degree) or "
     "a positive integer, got 0"},
    {NULL,
     {"--training.global_batch_size=12"},
     "config: training.global_batch_size = 12 is not a multiple of training.local_batch_size = 8"},
    {NULL,
     {"--training.dataset=text"},
     "config: training.dataset = \"text\" needs training.dataset_path"},
    {NULL,
     {"--optimizer.beta2=1"},
     "config: optimizer.beta1 and optimizer.beta2 must be < 1 (AdamW divides by 1 - beta^step)"},
};

static void test_errors(void)
{
    for (size_t i = 0; i < sizeof error_cases / sizeof error_cases[0]; i++) {
        const error_case *ec = &error_cases[i];
        char want[1024], path[512] = "";
        char *argv[6] = {0};
        int argc = 0;
        if (ec->toml) {
            snprintf(path, sizeof path, "%s", write_tmp("e.toml", ec->toml));
            argv[argc++] = "--config";
            argv[argc++] = path;
        } else {
            for (int k = 0; ec->argv[k]; k++)
                argv[argc++] = (char *)ec->argv[k];
        }
        /* "F" → the file's path */
        if (ec->message[0] == 'F')
            snprintf(want, sizeof want, "%s%s", path, ec->message + 1);
        else
            snprintf(want, sizeof want, "%s", ec->message);
        gt_config c;
        gt_error err = {0};
        gt_status st = gt_config_resolve(argc, argv, &c, &err);
        EXPECT(st == GT_ERR_INVALID && !strcmp(err.msg, want), "case %zu\n  want: %s\n  got:  %s",
               i, want, err.msg);
        if (st == GT_OK) gt_config_free(&c);
    }
    /* A config file that does not exist is an I/O error naming it. */
    char *argv[] = {"--config", "/nonexistent/run.toml", NULL};
    gt_config c;
    gt_error err = {0};
    EXPECT(gt_config_resolve(2, argv, &c, &err) == GT_ERR_IO &&
               !strncmp(err.msg, "/nonexistent/run.toml: cannot open", 34),
           "missing file: %s", err.msg);
}

/* ---------------------------------------------------------------- round trips */

static void test_round_trip(void)
{
    gt_config c;
    gt_config_defaults(&c);
    EXPECT(round_trips(&c, "defaults"), "defaults round trip");

    /* Awkward values: quotes, backslashes, control characters, non-ASCII, extreme floats. */
    gt_error err = {0};
    const char *sets[][2] = {
        {"job.description",
         "say \"hi\" \\ tab\there\nnew line \x01 \x7f caf\xc3\xa9 \xf0\x9f\x98\x80"},
        {"job.dump_folder", "C:\\out\\'x'"},
        {"training.max_norm", "inf"},
        {"optimizer.lr", "0.1"},
        {"optimizer.eps", "4.9406564584124654e-324"},
        {"optimizer.weight_decay", "1.7976931348623157e308"},
        {"lr_scheduler.min_lr_factor", "-0.0"},
        {"lr_scheduler.decay_ratio", "0.3333333333333333"},
        {"compile.disable_passes", "[\"a\\\"b\", \"\", \"x y\"]"},
        {"training.global_batch_size", "1073741824"},
        {"debug.seed", "9223372036854775807"},
    };
    for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++)
        EXPECT_OK(gt_config_set(&c, sets[i][0], sets[i][1], &err), &err);
    EXPECT(signbit(c.lr_scheduler.min_lr_factor), "-0.0 kept");
    EXPECT(round_trips(&c, "awkward values"), "awkward values round trip");

    /* gt_config_equal tells every option apart: change one option at a time. */
    int n;
    const gt_cfg_option *o = gt_config_options(&n);
    for (int i = 0; i < n; i++) {
        gt_config d;
        gt_config_copy(&d, &c);
        EXPECT(gt_config_equal(&c, &d), "copy is equal");
        char *p = (char *)&d + o[i].offset;
        switch (o[i].type) {
        case GT_CFG_BOOL:
            *(bool *)p = !*(bool *)p;
            break;
        case GT_CFG_INT:
            *(int64_t *)p ^= 1;
            break;
        case GT_CFG_FLOAT:
            *(double *)p = *(double *)p == 0.5 ? 0.25 : 0.5;
            break;
        case GT_CFG_ENUM:
            *(int *)p = *(int *)p == 0 && o[i].choices[1] ? 1 : 0;
            break;
        case GT_CFG_STRING:
            free(*(char **)p);
            *(char **)p = strdup("changed");
            break;
        case GT_CFG_STRINGS:
            gt_config_set(&d, "compile.disable_passes", "z", &err);
            break;
        }
        bool differs = !gt_config_equal(&c, &d);
        if (o[i].type == GT_CFG_ENUM && !o[i].choices[1]) differs = true; /* single choice */
        EXPECT(differs, "changing %s.%s is seen", o[i].section, o[i].key);
        gt_config_free(&d);
    }
    gt_config_free(&c);

    /* Random configs: every option set to a random valid value, printed, read back. */
    uint64_t s = 0x2545F4914F6CDD1Dull;
#define NEXT() (s ^= s << 13, s ^= s >> 7, s ^= s << 17, s)
    int good = 0;
    for (int it = 0; it < 200; it++) {
        gt_config r;
        gt_config_defaults(&r);
        for (int i = 0; i < n; i++) {
            char *p = (char *)&r + o[i].offset;
            switch (o[i].type) {
            case GT_CFG_BOOL:
                *(bool *)p = NEXT() & 1;
                break;
            case GT_CFG_INT: {
                uint64_t span = (uint64_t)(o[i].int_max - o[i].int_min);
                *(int64_t *)p =
                    o[i].int_min + (int64_t)(span == UINT64_MAX ? NEXT() : NEXT() % (span + 1));
                break;
            }
            case GT_CFG_FLOAT: {
                double u = (double)(NEXT() >> 11) / 9007199254740992.0, v;
                double hi = isinf(o[i].float_max) ? 1e12 : o[i].float_max;
                v = o[i].float_min + u * (hi - o[i].float_min);
                if (it % 7 == 0) v = o[i].float_min;
                *(double *)p = v;
                if (o[i].has_offset) *((char *)&r + o[i].has_offset) = NEXT() & 1;
                break;
            }
            case GT_CFG_ENUM: {
                int k = 0;
                while (o[i].choices[k])
                    k++;
                *(int *)p = (int)(NEXT() % (uint64_t)k);
                break;
            }
            case GT_CFG_STRING: {
                /* random printable/control/UTF-8 text without NUL */
                static const char *pieces[] = {"a",    "\"",   "\\",   "\n",       "\t",
                                               "\x01", "\x1f", "\x7f", "\xc3\xa9", "\xe2\x82\xac",
                                               "'",    "#",    " ",    "="};
                char buf[128] = "";
                int len = (int)(NEXT() % 12);
                for (int k = 0; k < len; k++)
                    strcat(buf, pieces[NEXT() % 14]);
                free(*(char **)p);
                *(char **)p = strdup(buf);
                break;
            }
            case GT_CFG_STRINGS: {
                char list[64];
                snprintf(list, sizeof list, "[\"%c\", \"q\\\"\"]", 'a' + (int)(NEXT() % 26));
                gt_config_set(&r, "compile.disable_passes", NEXT() & 1 ? list : "", &err);
                break;
            }
            }
        }
        good += round_trips(&r, "random config");
        gt_config_free(&r);
    }
    EXPECT(good == 200, "%d of 200 random configs round-trip", good);
#undef NEXT

    /* gt_config_write writes the same text. */
    gt_config_defaults(&c);
    char path[512];
    snprintf(path, sizeof path, "%s/written.toml", tmp_dir);
    EXPECT_OK(gt_config_write(&c, path, &err), &err);
    gt_config back;
    gt_config_defaults(&back);
    EXPECT_OK(gt_config_load_file(&back, path, &err), &err);
    EXPECT(gt_config_equal(&c, &back) == false && !strcmp(back.job.config_file, path),
           "load_file records the path (the only difference)");
    free(back.job.config_file);
    back.job.config_file = strdup("");
    EXPECT(gt_config_equal(&c, &back), "written file reads back");
    gt_config_free(&back);
    EXPECT(gt_config_write(&c, "/nonexistent/dir/c.toml", &err) == GT_ERR_IO, "write error");
    gt_config_free(&c);
}

int main(void)
{
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/gt_test_config_%d", (int)getpid());
    if (mkdir(tmp_dir, 0700) != 0) return 1;
    test_defaults();
    test_schema();
    test_config_files();
    test_overrides();
    test_errors();
    test_round_trip();
    const char *files[] = {"o.toml", "e.toml", "written.toml"};
    for (int i = 0; i < 3; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s", tmp_dir, files[i]);
        unlink(path);
    }
    rmdir(tmp_dir);
    return gt_test_finish();
}
