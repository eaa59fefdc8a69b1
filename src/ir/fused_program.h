/* fused_program.h — the instruction encoding of fused_elementwise (gt_ops.def), shared by its
 * shape rule (src/ir/shape_rules_fused.c), the fusion pass (src/passes/fusion.c) and the kernels
 * (src/backend/cpu/cpu_fused.c, src/backend/cuda/cuda_fused.cu). Depends on the op enum only, so
 * the backends may include it (DESIGN.md §2: backends depend on core and the op table).
 *
 * A fused_elementwise node runs a straight-line program over f32 registers, one instruction per
 * int attribute, in order. Operand numbers: 0 .. n_in-1 name the node's inputs (widened exactly
 * to f32, broadcast to the output's shape by numpy rules); GT_FUSED_TEMP + j names the result of
 * instruction j (j < the current instruction). Instruction k's result is register k.
 *
 * Outputs: the node's outputs are, in instruction order, the registers of every instruction with
 * the OUTPUT flag (bit 40) and the last instruction's register, flagged or not — so a program
 * without flags has one output, the last register, and several kernels reading the same inputs
 * (the three SwiGLU-backward products of h1, h3, dy) can run as one node with one output each.
 * Every output has the node's output shape, the last register's (the shape rule refuses a flagged
 * register of another shape: the kernels run over that one index space and write each output
 * there); each has its instruction's dtype. GT_FUSED_MAX_INS bounds them (GT_MAX_OUT = 8 too).
 *
 * One int64 per instruction (fields of 8 bits, unused fields zero so equal programs are equal
 * bits, which is what CSE compares):
 *   bits  0.. 7  op       an elementwise op: add sub mul div neg exp log sqrt rsqrt silu sigmoid
 *                         scale add_scalar silu_backward cast clamp
 *   bits  8..15  dtype    the dtype the unfused op's output had: the result is computed in f32
 *                         exactly as that op's kernel computes it, then rounded to this dtype
 *                         (round to nearest even) and widened back, so every intermediate is
 *                         rounded where the unfused graph rounded it. For cast it is the target.
 *   bits 16..23  src0     first operand
 *   bits 24..31  src1     second operand (add sub mul div; silu_backward: src0 = x, src1 = dy)
 *   bits 32..39  fslot    first float attribute the op reads: scale alpha = f[fslot], add_scalar
 *                         value = f[fslot], clamp min = f[fslot] and max = f[fslot + 1]; each is
 *                         rounded to f32 before use, as the unfused kernels do.
 *   bit  40      out      the OUTPUT flag: the result is also an output of the node (above)
 * Bits above 40 are zero (gt_fused_has_extra_bits). All operands and results are float dtypes
 * (f32, bf16, f16). */
#ifndef GRAPHTRAIN_FUSED_PROGRAM_H
#define GRAPHTRAIN_FUSED_PROGRAM_H

#include "graphtrain/gt_graph.h"

#define GT_FUSED_MAX_INS GT_MAX_IATTR   /* instructions per node */
#define GT_FUSED_MAX_CONST GT_MAX_FATTR /* float constants per node */
#define GT_FUSED_TEMP 8                 /* operand >= GT_FUSED_TEMP: an instruction's result */
#define GT_FUSED_OUT_BIT 40             /* the OUTPUT flag of an instruction word */

typedef struct {
    int op;    /* gt_op */
    int dtype; /* gt_dtype */
    int src[2];
    int fslot;
    bool out; /* the OUTPUT flag (the last instruction is an output whether flagged or not) */
} gt_fused_ins;

static inline int64_t gt_fused_encode(gt_op op, gt_dtype dt, int src0, int src1, int fslot)
{
    return (int64_t)((uint64_t)(op & 0xff) | (uint64_t)(dt & 0xff) << 8 |
                     (uint64_t)(src0 & 0xff) << 16 | (uint64_t)(src1 & 0xff) << 24 |
                     (uint64_t)(fslot & 0xff) << 32);
}

/* w with the OUTPUT flag set. */
static inline int64_t gt_fused_with_out(int64_t w)
{
    return (int64_t)((uint64_t)w | (uint64_t)1 << GT_FUSED_OUT_BIT);
}

/* gt_fused_encode, flagged as an output when out is true. */
static inline int64_t gt_fused_encode_out(gt_op op, gt_dtype dt, int src0, int src1, int fslot,
                                          bool out)
{
    int64_t w = gt_fused_encode(op, dt, src0, src1, fslot);
    return out ? gt_fused_with_out(w) : w;
}

static inline gt_fused_ins gt_fused_decode(int64_t w)
{
    uint64_t u = (uint64_t)w;
    gt_fused_ins ins;
    ins.op = (int)(u & 0xff);
    ins.dtype = (int)(u >> 8 & 0xff);
    ins.src[0] = (int)(u >> 16 & 0xff);
    ins.src[1] = (int)(u >> 24 & 0xff);
    ins.fslot = (int)(u >> 32 & 0xff);
    ins.out = (u >> GT_FUSED_OUT_BIT & 1) != 0;
    return ins;
}

/* True when the encoding has bits outside the five fields and the OUTPUT flag (a malformed
 * program). */
static inline bool gt_fused_has_extra_bits(int64_t w)
{
    return ((uint64_t)w >> (GT_FUSED_OUT_BIT + 1)) != 0;
}

/* The outputs of the program prog[0 .. n_ins-1]: returns their number and, when reg is not NULL,
 * fills reg[j] with the instruction (register) index of output j, in instruction order: every
 * flagged instruction, then the last one if it is not flagged. reg has room for n_ins entries
 * (GT_FUSED_MAX_INS suffices); 0 outputs when n_ins < 1. */
static inline int gt_fused_outputs(const int64_t *prog, int n_ins, int *reg)
{
    int n = 0;
    for (int k = 0; k < n_ins; k++)
        if (k == n_ins - 1 || ((uint64_t)prog[k] >> GT_FUSED_OUT_BIT & 1)) {
            if (reg) reg[n] = k;
            n++;
        }
    return n;
}

/* Operands an op reads: 1 or 2 for the elementwise ops of gt_ops.def (GT_OPF_ELEMENTWISE); 0 when
 * the op cannot be part of a program. */
static inline int gt_fused_arity(int op)
{
    const gt_op_info *info = gt_op_get((gt_op)op);
    return info && (info->flags & GT_OPF_ELEMENTWISE) ? info->n_in : 0;
}

/* Float attributes an op reads (scale, add_scalar: 1; clamp: 2). */
static inline int gt_fused_n_const(int op)
{
    return op == GT_OP_CLAMP ? 2 : (op == GT_OP_SCALE || op == GT_OP_ADD_SCALAR) ? 1 : 0;
}

static inline bool gt_fused_float_dtype(int dt)
{
    return dt == GT_F32 || dt == GT_BF16 || dt == GT_F16;
}

#endif
