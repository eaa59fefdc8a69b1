/* runtime_internal.h — what the program executors share (private to src/runtime): exec.c (the
 * CPU) and exec_cuda.c (a CUDA device) walk the same instruction list and differ only in where
 * the arenas live and which backend runs the kernel. */
#ifndef GT_RUNTIME_INTERNAL_H
#define GT_RUNTIME_INTERNAL_H

#include "graphtrain/gt_program.h"

/* The kernel call of instruction ins: its attributes, and in[j] / out[j] as gt_tensor views of
 * its buffers in the arenas whose base addresses are arena[0 .. GT_ARENA_COUNT) (a NULL base
 * gives views with NULL data). call->in / call->out point into in[] and out[]. */
void gt_program_kernel_call(const gt_instr *ins, void *const *arena, gt_kernel_call *call,
                            gt_tensor *in, gt_tensor *out);

/* Wraps err (a failed kernel of instruction ins in the graph g) with the node it came from:
 * "node %N op[ at fqn]" followed by suffix (e.g. " (cuda)"; "" for none). */
void gt_program_wrap_kernel_error(const gt_graph *g, const gt_instr *ins, const char *suffix,
                                  gt_error *err);

#endif
