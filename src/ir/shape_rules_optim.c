/* shape_rules_optim.c — shape/dtype rules of the optimizer ops: clamp (used for the gradient
 * clipping coefficient) and the fused AdamW update (gt_ops.def gives their semantics). */
#include <math.h>

#include "ir/ir_internal.h"

/* (x) -> x's type. min <= max (NaN bounds are refused: torch would propagate them silently). */
gt_status gt_shape_clamp(gt_graph *g, const gt_node *n, gt_type *out, int *n_out, gt_error *err)
{
    GT_TRY(gt_shape_need_float(g, n, 0, err));
    double lo = n->attrs.f[0], hi = n->attrs.f[1];
    if (isnan(lo) || isnan(hi) || lo > hi)
        return gt_shape_fail(g, n, err, GT_ERR_INVALID,
                             "bounds must satisfy min <= max, got [%g, %g]", lo, hi);
    out[0] = *gt_shape_in(g, n, 0);
    *n_out = 1;
    return GT_OK;
}

/* Input k must be f32 with exactly the given rank and (when dims is not NULL) dims. */
static gt_status need_f32_dims(gt_graph *g, const gt_node *n, int k, const char *what, int ndim,
                               const gt_expr *dims, gt_error *err)
{
    const gt_type *t = gt_shape_in(g, n, k);
    bool ok = t->dtype == GT_F32 && t->ndim == ndim;
    for (int d = 0; ok && dims && d < ndim; d++)
        ok = t->dims[d] == dims[d];
    if (ok) return GT_OK;
    char ts[160], want[160];
    if (dims) {
        gt_type w = {.dtype = GT_F32, .ndim = ndim};
        for (int d = 0; d < ndim; d++)
            w.dims[d] = dims[d];
        gt_type_str(g, &w, want, sizeof want);
    } else {
        snprintf(want, sizeof want, "f32 of rank %d", ndim);
    }
    return gt_shape_fail(g, n, err, GT_ERR_SHAPE, "input %d (%s) must be %s, got %s", k, what, want,
                         gt_type_str(g, t, ts, sizeof ts));
}

/* (p, g, m, v, scalars, clip) -> (p', m', v'). p and g are floats of the same dims (g may have
 * another float dtype: a bf16 gradient updating f32 master weights); m and v are f32 with p's
 * dims; scalars is f32[3]; clip is f32 []. Hyper-parameters must be in torch's accepted ranges. */
gt_status gt_shape_adamw(gt_graph *g, const gt_node *n, gt_type *out, int *n_out, gt_error *err)
{
    GT_TRY(gt_shape_need_float(g, n, 0, err));
    GT_TRY(gt_shape_need_float(g, n, 1, err));
    const gt_type *p = gt_shape_in(g, n, 0), *gr = gt_shape_in(g, n, 1);
    bool same = p->ndim == gr->ndim;
    for (int d = 0; same && d < p->ndim; d++)
        same = p->dims[d] == gr->dims[d];
    if (!same) {
        char ps[160], gs[160];
        return gt_shape_fail(
            g, n, err, GT_ERR_SHAPE,
            "gradient (input 1) must have the dims of the param (input 0): %s vs %s",
            gt_type_str(g, gr, gs, sizeof gs), gt_type_str(g, p, ps, sizeof ps));
    }
    GT_TRY(need_f32_dims(g, n, 2, "exp_avg", p->ndim, p->dims, err));
    GT_TRY(need_f32_dims(g, n, 3, "exp_avg_sq", p->ndim, p->dims, err));
    gt_expr three = gt_sym_const(g->sym, 3);
    GT_TRY(
        need_f32_dims(g, n, 4, "scalars {lr, bias_correction1, bias_correction2}", 1, &three, err));
    GT_TRY(need_f32_dims(g, n, 5, "clip coefficient", 0, NULL, err));

    double beta1 = n->attrs.f[0], beta2 = n->attrs.f[1], eps = n->attrs.f[2];
    double wd = n->attrs.f[3];
    if (!(beta1 >= 0.0 && beta1 < 1.0) || !(beta2 >= 0.0 && beta2 < 1.0))
        return gt_shape_fail(g, n, err, GT_ERR_INVALID, "betas must lie in [0, 1), got (%g, %g)",
                             beta1, beta2);
    if (!(eps >= 0.0) || !(wd >= 0.0) || isinf(eps) || isinf(wd))
        return gt_shape_fail(g, n, err, GT_ERR_INVALID,
                             "eps and weight_decay must be finite and >= 0, got %g and %g", eps,
                             wd);
    out[0] = *p;
    out[1] = *gt_shape_in(g, n, 2);
    out[2] = *gt_shape_in(g, n, 3);
    *n_out = 3;
    return GT_OK;
}
