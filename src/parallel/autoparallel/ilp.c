/* ilp.c — AutoParallel's integer program on CBC (coin/Cbc_C_Interface.h, Debian's
 * coinor-libcbc-dev), built when GT_HAVE_CBC:
 *
 *   min  sum_{c,s} unary[c][s] y[c][s] + sum_{(c,d)} sum_{i,j} pair[c,d][i,j] z[c,d][i,j]
 *   s.t. sum_s y[c][s] = 1                                  (one strategy per class)
 *        sum_j z[c,d][i,j] = sum_{s: tp(s) = i} y[c][s]     (z's marginals are the classes'
 *        sum_i z[c,d][i,j] = sum_{s: tp(s) = j} y[d][s]      tensor-parallel choices)
 *        sum_{c,s} mem[c][s] y[c][s] <= mem_limit           (when set)
 *        y binary (0 where infeasible), 0 <= z <= 1 (0 where the pair did not parallelize).
 * With y one-hot, the marginal rows leave z exactly one 1, at the chosen pair, so z needs no
 * integrality. CBC runs on one thread with fixed seeds: the same input, the same solution. */
#include <stdlib.h>
#include <string.h>

#include "parallel/autoparallel/autopar_internal.h"

#ifdef GT_HAVE_CBC
#include <coin/Cbc_C_Interface.h>

bool gt_autopar_available(void)
{
    return true;
}

typedef struct {
    int *cols;
    double *vals;
    int n, cap;
} row_buf;

static void row_add(row_buf *r, int col, double v)
{
    if (r->n == r->cap) {
        r->cap = r->cap ? 2 * r->cap : 32;
        r->cols = gt_xrealloc(r->cols, (size_t)r->cap * sizeof *r->cols);
        r->vals = gt_xrealloc(r->vals, (size_t)r->cap * sizeof *r->vals);
    }
    r->cols[r->n] = col;
    r->vals[r->n++] = v;
}

gt_status gt_ap_ilp_solve(const gt_ap_ilp *p, int *choice, double *objective, int *n_columns,
                          int *n_rows, gt_error *err)
{
    Cbc_Model *m = Cbc_newModel();
    Cbc_setLogLevel(m, 0);
    Cbc_setParameter(m, "threads", "0");
    Cbc_setParameter(m, "randomSeed", "1");
    Cbc_setParameter(m, "randomCbcSeed", "1");
    Cbc_setParameter(m, "ratioGap", "0");
    Cbc_setParameter(m, "allowableGap", "0");
    int **ycol = gt_xcalloc((size_t)p->n_classes + 1, sizeof *ycol);
    int ncol = 0, nrow = 0;
    for (int c = 0; c < p->n_classes; c++) {
        ycol[c] = gt_xmalloc((size_t)p->n_strategies[c] * sizeof **ycol);
        for (int s = 0; s < p->n_strategies[c]; s++) {
            char name[32];
            snprintf(name, sizeof name, "y%d_%d", c, s);
            Cbc_addCol(m, name, 0, p->feasible[c][s] ? 1 : 0, p->unary[c][s], 1, 0, NULL, NULL);
            ycol[c][s] = ncol++;
        }
    }
    int **zcol = gt_xcalloc((size_t)p->n_pairs + 1, sizeof *zcol);
    for (int q = 0; q < p->n_pairs; q++) {
        const gt_ap_pair *pr = &p->pairs[q];
        int ni = p->n_tp[pr->c], nj = p->n_tp[pr->d];
        zcol[q] = gt_xmalloc((size_t)(ni * nj) * sizeof **zcol);
        for (int k = 0; k < ni * nj; k++) {
            char name[40];
            snprintf(name, sizeof name, "z%d_%d", q, k);
            Cbc_addCol(m, name, 0, pr->forbid[k] ? 0 : 1, pr->cost[k], 0, 0, NULL, NULL);
            zcol[q][k] = ncol++;
        }
    }
    row_buf r = {0};
    for (int c = 0; c < p->n_classes; c++) {
        r.n = 0;
        for (int s = 0; s < p->n_strategies[c]; s++)
            row_add(&r, ycol[c][s], 1.0);
        Cbc_addRow(m, "one", r.n, r.cols, r.vals, 'E', 1.0);
        nrow++;
    }
    for (int q = 0; q < p->n_pairs; q++) {
        const gt_ap_pair *pr = &p->pairs[q];
        int ni = p->n_tp[pr->c], nj = p->n_tp[pr->d];
        for (int side = 0; side < 2; side++) {
            int cls = side ? pr->d : pr->c, nk = side ? nj : ni;
            for (int k = 0; k < nk; k++) {
                r.n = 0;
                for (int o = 0; o < (side ? ni : nj); o++)
                    row_add(&r, zcol[q][side ? o * nj + k : k * nj + o], 1.0);
                for (int s = 0; s < p->n_strategies[cls]; s++)
                    if (p->tp_part[cls][s] == k) row_add(&r, ycol[cls][s], -1.0);
                Cbc_addRow(m, "marginal", r.n, r.cols, r.vals, 'E', 0.0);
                nrow++;
            }
        }
    }
    if (p->mem_limit >= 0) {
        r.n = 0;
        for (int c = 0; c < p->n_classes; c++)
            for (int s = 0; s < p->n_strategies[c]; s++)
                if (p->mem[c][s] != 0) row_add(&r, ycol[c][s], p->mem[c][s]);
        Cbc_addRow(m, "memory", r.n, r.cols, r.vals, 'L', p->mem_limit);
        nrow++;
    }
    free(r.cols);
    free(r.vals);
    Cbc_solve(m);
    gt_status st = GT_OK;
    if (!Cbc_isProvenOptimal(m)) {
        st = gt_error_set(err, GT_ERR_INVALID,
                          "autoparallel: the ILP has no solution (CBC status %d%s)", Cbc_status(m),
                          Cbc_isProvenInfeasible(m) ? ", infeasible" : "");
    } else {
        const double *x = Cbc_getColSolution(m);
        for (int c = 0; c < p->n_classes; c++) {
            choice[c] = -1;
            for (int s = 0; s < p->n_strategies[c]; s++)
                if (x[ycol[c][s]] > 0.5) choice[c] = s;
            if (choice[c] < 0)
                st =
                    gt_error_set(err, GT_ERR_INTERNAL, "autoparallel: class %d has no strategy", c);
        }
        *objective = Cbc_getObjValue(m);
    }
    for (int c = 0; c < p->n_classes; c++)
        free(ycol[c]);
    for (int q = 0; q < p->n_pairs; q++)
        free(zcol[q]);
    free(ycol);
    free(zcol);
    Cbc_deleteModel(m);
    *n_columns = ncol;
    *n_rows = nrow;
    return st;
}

#else

bool gt_autopar_available(void)
{
    return false;
}

gt_status gt_ap_ilp_solve(const gt_ap_ilp *p, int *choice, double *objective, int *n_columns,
                          int *n_rows, gt_error *err)
{
    (void)p, (void)choice, (void)objective, (void)n_columns, (void)n_rows;
    return gt_error_set(err, GT_ERR_UNSUPPORTED,
                        "autoparallel: this build has no ILP solver; install coinor-libcbc-dev "
                        "(scripts/deps.sh) and rebuild");
}

#endif
