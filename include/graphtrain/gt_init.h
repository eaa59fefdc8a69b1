/* gt_init.h — how a parameter is initialised (kind, std, cut), and the draw of any slice of it.
 * Core: the model builders describe their parameters with it, and the CPU and CUDA backends draw
 * them, without either knowing the other. */
#ifndef GRAPHTRAIN_GT_INIT_H
#define GRAPHTRAIN_GT_INIT_H

#include "gt_core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { GT_INIT_ONES = 0, GT_INIT_ZEROS, GT_INIT_NORMAL, GT_INIT_TRUNC_NORMAL } gt_init_kind;

/* How one parameter is initialised. Element k of the flattened tensor is drawn from Philox keyed
 * by (seed, gt_hash_str(fqn), k) alone, so any slice initialises independently of the rest. */
typedef struct {
    char fqn[128];
    gt_dtype dtype;
    int ndim;
    int64_t shape[GT_MAX_DIMS];
    gt_init_kind init;
    double std, lo, hi; /* trunc_normal: [lo, hi] absolute */
} gt_param_spec;

/* Writes elements [start, start + count) of the flattened parameter into dst (count elements of
 * dst's dtype, any float dtype). */
void gt_param_init(const gt_param_spec *p, uint64_t seed, int64_t start, int64_t count,
                   gt_tensor *dst);

#ifdef __cplusplus
}
#endif
#endif
