/* gt_backend.h — the kernel interface a backend implements (DESIGN.md §5).
 *
 * A kernel knows nothing of the graph: it gets the op, its attributes with every symbolic
 * expression already evaluated, and concrete tensors. Outputs are allocated by the caller with the
 * shapes the shape rule gives; a kernel writes every element of every output (it must not assume
 * zeroed memory: the memory planner reuses buffers). Every kernel is deterministic: a fixed
 * reduction order, no atomics, identical bits run to run. */
#ifndef GRAPHTRAIN_GT_BACKEND_H
#define GRAPHTRAIN_GT_BACKEND_H

#include "gt_core.h"
#include "gt_graph.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    gt_op op;
    const int64_t *i; /* attrs.i, as in the node */
    const double *f;  /* attrs.f */
    const int64_t *e; /* attrs.e evaluated */
    int ni, nf, ne;
    int n_in, n_out;
    const gt_tensor *in[GT_MAX_IN];
    gt_tensor *out[GT_MAX_OUT];
} gt_kernel_call;

/* CPU backend: f32 kernels; bf16/f16 inputs are widened to f32 and results rounded to the output
 * dtype. Errors a user's data can cause (an embedding id out of range) come back as GT_ERR_INVALID
 * naming the op and the offending value. */
gt_status gt_cpu_run_kernel(const gt_kernel_call *call, gt_error *err);

/* Number of threads the CPU matmuls may use (n <= 0 leaves it unchanged; 1 at start). A large
 * sgemm is cut into blocks of its output by a rule of its shape alone, each block a
 * single-threaded OpenBLAS call (OpenBLAS itself is kept on one thread), so results are the same
 * bits on any thread count (cpu_matmul.c). gt_cpu_threads: the count set. */
void gt_cpu_set_threads(int n);
int gt_cpu_threads(void);

/* The x86 features that decide which OpenBLAS kernels can run, and the CPU's model name. */
typedef struct {
    bool avx, avx2, fma, avx512f, avx512bw, avx512vl, avx512dq;
    char model[96];
} gt_cpu_features;
void gt_cpu_features_detect(gt_cpu_features *f);
/* The OpenBLAS core this process runs (GT_TEST_BLAS_CORE, without OPENBLAS_CORETYPE, pretends
 * OpenBLAS chose that one: the tests' way to reach a fallback on any machine). */
const char *gt_cpu_blas_core(void);
/* The core to force when `chosen` has narrower kernels than features f allow (a detection that
 * fell back, as on VMs that hide the CPU model), else NULL (cpu_blas.c). */
const char *gt_cpu_blas_core_for(const char *chosen, const gt_cpu_features *f);
/* The run header's line: the BLAS, its core and why, the CPU's model and features. */
void gt_cpu_blas_describe(char *buf, size_t n);

#ifdef __cplusplus
}
#endif
#endif
