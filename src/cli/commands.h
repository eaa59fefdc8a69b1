/* commands.h — what the graphtrain subcommands share (src/cli/main.c parses and dispatches;
 * each larger subcommand lives in its own cmd_*.c). */
#ifndef GRAPHTRAIN_CLI_COMMANDS_H
#define GRAPHTRAIN_CLI_COMMANDS_H

#include "graphtrain/gt_config.h"
#include "graphtrain/gt_model.h"

typedef struct {
    const char *name;
    const char *summary;
    const char *usage;
    const char *const *local; /* command-local option names, NULL-terminated */
} command_spec;

typedef struct {
    const char *local[8]; /* values of the command-local options, by index; NULL = unset */
    char *rest[512];      /* the other arguments, in order */
    int n_rest;
} split_args;

/* defaults ← --config FILE ← overrides in sa->rest; prints the error and returns 1 on failure */
int gt_cli_resolve_config(const command_spec *cmd, split_args *sa, gt_config *cfg);
/* the model the config names (model.name, model.flavor, the training precision); prints the
 * error and returns 1 on failure */
int gt_cli_model_config(const gt_config *c, gt_model_config *mc);
/* Frees a subcommand's model, graph and config; returns rc. */
int gt_cli_finish(int rc, gt_model *model, gt_graph *g, gt_config *cfg);

int gt_cli_graph(const command_spec *cmd, split_args *sa);

#endif
