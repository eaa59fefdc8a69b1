/* autopar_internal.h — what the files of src/parallel/autoparallel share: the parameter classes
 * with their strategies (strategies.c) and the ILP's input (ilp.c). Private to the module. */
#ifndef GRAPHTRAIN_AUTOPAR_INTERNAL_H
#define GRAPHTRAIN_AUTOPAR_INTERNAL_H

#include "graphtrain/gt_autoparallel.h"

/* The cost model's pieces (cost.c), shared with the backend policy (policy.c): a value's bytes
 * under b; a collective start's kind (0 all_gather, 1 reduce_scatter, 2 all_reduce, 3
 * all_to_all; -1 other ops); the alpha-beta time of one of kind over ranks on mesh dim md, full_b
 * the full tensor's bytes; the roofline time of node i (0 for views and collectives). */
gt_status gt_ap_value_bytes(const gt_graph *g, gt_value_id v, const gt_sym_binding *b, double *out,
                            gt_error *err);
int gt_ap_comm_kind(gt_op op);
double gt_ap_collective_s(const gt_autopar_device *d, int md, int ranks, double full_b, int kind);
gt_status gt_ap_node_s(const gt_graph *g, gt_node_id i, const gt_sym_binding *b,
                       const gt_autopar_device *d, double *t, gt_error *err);

/* Per class, beside the public gt_autopar_class. */
typedef struct {
    int32_t *inputs; /* every input of g placed as the class: its PARAMs and their state */
    int n_inputs;
    int32_t first; /* the first member's PARAM input */
    bool block;    /* the members are repeated blocks' (unit >= 0) */
    int *tp_part;  /* per strategy: the index of its placement on tp among tp_options */
    int n_tp;
    gt_placement tp_options[GT_MAX_DIMS + 1];
} gt_ap_info;

/* The classes of g's parameters and their strategies on plan's mesh; the hand plans' layouts
 * (per input) mark each class's hand strategies, which are always in the list. */
gt_status gt_ap_classes(const gt_graph *g, const gt_parallel_plan *plan,
                        const gt_placement (*fsdp)[GT_MESH_MAX_DIMS],
                        const gt_placement (*fsdp_tp)[GT_MESH_MAX_DIMS], gt_autopar_class **classes,
                        gt_ap_info **info, int *n, gt_error *err);
void gt_ap_classes_free(gt_autopar_class *classes, gt_ap_info *info, int n);

/* The ILP: one-hot y[c][s] per class (cost unary[c][s], memory mem[c][s]; infeasible strategies
 * fixed to 0), and per pair of classes the cost of their tensor-parallel parts (i, j) jointly,
 * linearised with z[i][j] in [0, 1] whose marginals are the classes' one-hot sums. */
typedef struct {
    int c, d;
    double *cost; /* [n_tp(c) * n_tp(d)] */
    bool *forbid; /* the combination did not parallelize */
} gt_ap_pair;

typedef struct {
    int n_classes;
    const int *n_strategies;
    double **unary, **mem;
    bool **feasible;
    int *const *tp_part;
    const int *n_tp;
    gt_ap_pair *pairs;
    int n_pairs;
    double mem_limit; /* < 0: none */
} gt_ap_ilp;

/* Solves it with CBC (one thread, fixed seed): choice[c] per class. GT_ERR_UNSUPPORTED without
 * CBC; GT_ERR_INVALID when infeasible. */
gt_status gt_ap_ilp_solve(const gt_ap_ilp *p, int *choice, double *objective, int *n_columns,
                          int *n_rows, gt_error *err);

#endif
