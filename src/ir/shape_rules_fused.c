/* shape_rules_fused.c — the shape/dtype rule of fused_elementwise (gt_ops.def; encoding in
 * fused_program.h).
 *
 * The rule types the program as the unfused ops would have been typed: each instruction's
 * operands must fit its op exactly as that op's own rule demands (binary ops: one float dtype,
 * numpy-broadcastable dims; silu_backward: identical types; unary ops: any float type; cast: a
 * float target), and the dtype recorded in the instruction must be the one that op's rule gives.
 * So a program the verifier accepts computes, register by register, the types of the graph it
 * replaced. The outputs are the flagged registers and the last one (gt_fused_outputs), each typed
 * as its register; every output must have the last register's shape, the node's index space,
 * which the kernels run over and write each output in (a flagged register of another shape, e.g.
 * silu(x[4, 1]) in a program whose last register is [4, 8], is refused: it would need a kernel
 * writing outputs of several sizes). */
#include <math.h>

#include "ir/fused_program.h"
#include "ir/ir_internal.h"

/* numpy broadcasting of two register types (aligned at the last dim, a constant-1 dim stretches);
 * as the binary ops' rule. */
static gt_status fused_broadcast(gt_graph *g, const gt_node *n, int k, const gt_type *a,
                                 const gt_type *b, gt_type *out, gt_error *err)
{
    int r = a->ndim > b->ndim ? a->ndim : b->ndim;
    out->dtype = a->dtype;
    out->ndim = r;
    for (int d = 0; d < r; d++) {
        int ia = d - (r - a->ndim), ib = d - (r - b->ndim);
        if (ia < 0) {
            out->dims[d] = b->dims[ib];
        } else if (ib < 0 || a->dims[ia] == b->dims[ib] || gt_expr_is_one(g, b->dims[ib])) {
            out->dims[d] = a->dims[ia];
        } else if (gt_expr_is_one(g, a->dims[ia])) {
            out->dims[d] = b->dims[ib];
        } else {
            char as[160], bs[160];
            return gt_shape_fail(g, n, err, GT_ERR_SHAPE,
                                 "instruction %d: operands do not broadcast (dim %d): %s vs %s", k,
                                 d, gt_type_str(g, a, as, sizeof as),
                                 gt_type_str(g, b, bs, sizeof bs));
        }
    }
    return GT_OK;
}

/* The type of operand `src` of instruction k, or an error naming the bad reference. */
static gt_status fused_operand(gt_graph *g, const gt_node *n, int k, int src, const gt_type *regs,
                               const gt_type **out, gt_error *err)
{
    if (src < n->n_in) {
        *out = gt_shape_in(g, n, src);
        return GT_OK;
    }
    int j = src - GT_FUSED_TEMP;
    if (src >= GT_FUSED_TEMP && j < k) {
        *out = &regs[j];
        return GT_OK;
    }
    return gt_shape_fail(g, n, err, GT_ERR_INVALID,
                         "instruction %d: operand %d names neither an input (the node has %d) nor "
                         "an earlier instruction (%d + j, j < %d)",
                         k, src, n->n_in, GT_FUSED_TEMP, k);
}

gt_status gt_shape_fused_elementwise(gt_graph *g, const gt_node *n, gt_type *out, int *n_out,
                                     gt_error *err)
{
    int n_ins = n->attrs.ni;
    if (n_ins < 1)
        return gt_shape_fail(g, n, err, GT_ERR_INVALID, "the program has no instruction");
    for (int k = 0; k < n->n_in; k++)
        GT_TRY(gt_shape_need_float(g, n, k, err));
    gt_type regs[GT_FUSED_MAX_INS];
    for (int k = 0; k < n_ins; k++) {
        int64_t w = n->attrs.i[k];
        gt_fused_ins ins = gt_fused_decode(w);
        int arity = gt_fused_arity(ins.op);
        if (gt_fused_has_extra_bits(w) || arity == 0)
            return gt_shape_fail(g, n, err, GT_ERR_INVALID,
                                 "instruction %d (0x%llx): not an elementwise op of a program", k,
                                 (unsigned long long)w);
        const char *name = gt_op_get((gt_op)ins.op)->name;
        if (!gt_fused_float_dtype(ins.dtype))
            return gt_shape_fail(g, n, err, GT_ERR_INVALID,
                                 "instruction %d (%s): result dtype %d is not a float dtype", k,
                                 name, ins.dtype);
        int nc = gt_fused_n_const(ins.op);
        if (nc > 0 && ins.fslot + nc > n->attrs.nf)
            return gt_shape_fail(g, n, err, GT_ERR_INVALID,
                                 "instruction %d (%s): constants f[%d..%d] but the node has %d", k,
                                 name, ins.fslot, ins.fslot + nc - 1, n->attrs.nf);
        if (ins.op == GT_OP_CLAMP) {
            double lo = n->attrs.f[ins.fslot], hi = n->attrs.f[ins.fslot + 1];
            if (isnan(lo) || isnan(hi) || lo > hi)
                return gt_shape_fail(g, n, err, GT_ERR_INVALID,
                                     "instruction %d (clamp): bounds must satisfy min <= max, got "
                                     "[%g, %g]",
                                     k, lo, hi);
        }
        const gt_type *a = NULL, *b = NULL;
        GT_TRY(fused_operand(g, n, k, ins.src[0], regs, &a, err));
        if (arity == 2) GT_TRY(fused_operand(g, n, k, ins.src[1], regs, &b, err));
        gt_type *r = &regs[k];
        char as[160], bs[160];
        if (arity == 2 && a->dtype != b->dtype)
            return gt_shape_fail(
                g, n, err, GT_ERR_SHAPE, "instruction %d (%s): dtypes differ: %s vs %s", k, name,
                gt_type_str(g, a, as, sizeof as), gt_type_str(g, b, bs, sizeof bs));
        if (ins.op == GT_OP_SILU_BACKWARD) {
            if (!gt_type_equal(a, b))
                return gt_shape_fail(g, n, err, GT_ERR_SHAPE,
                                     "instruction %d (silu_backward): x and dy differ: %s vs %s", k,
                                     gt_type_str(g, a, as, sizeof as),
                                     gt_type_str(g, b, bs, sizeof bs));
            *r = *a;
        } else if (arity == 2) {
            GT_TRY(fused_broadcast(g, n, k, a, b, r, err));
        } else {
            *r = *a;
        }
        if (ins.op == GT_OP_CAST) {
            r->dtype = (gt_dtype)ins.dtype;
        } else if ((int)r->dtype != ins.dtype) {
            return gt_shape_fail(g, n, err, GT_ERR_INVALID,
                                 "instruction %d (%s): records result dtype %s but its operands "
                                 "give %s",
                                 k, name, gt_dtype_name((gt_dtype)ins.dtype),
                                 gt_dtype_name(r->dtype));
        }
    }
    int reg[GT_FUSED_MAX_INS];
    int n_res = gt_fused_outputs(n->attrs.i, n_ins, reg);
    if (n_res > GT_MAX_OUT) /* unreachable while GT_FUSED_MAX_INS <= GT_MAX_OUT */
        return gt_shape_fail(g, n, err, GT_ERR_INVALID,
                             "the program has %d outputs, a node has at most %d", n_res,
                             GT_MAX_OUT);
    const gt_type *last = &regs[n_ins - 1];
    for (int j = 0; j < n_res; j++) {
        const gt_type *r = &regs[reg[j]];
        bool same = r->ndim == last->ndim;
        for (int d = 0; same && d < r->ndim; d++)
            same = r->dims[d] == last->dims[d];
        if (!same) {
            char rs[160], ls[160];
            return gt_shape_fail(g, n, err, GT_ERR_SHAPE,
                                 "instruction %d is output %d of type %s, but every output must "
                                 "have the node's output shape, the last instruction's: %s",
                                 reg[j], j, gt_type_str(g, r, rs, sizeof rs),
                                 gt_type_str(g, last, ls, sizeof ls));
        }
        out[j] = *r;
    }
    *n_out = n_res;
    return GT_OK;
}
