/* cuda_test_util.h — helpers the CUDA tests (tests/cuda, label cuda) share: the start of a test's
 * main, a seeded uniform random stream, a kernel call over arrays of tensors, pre-filling a device
 * output with a byte pattern, the max-relative error with NaN and inf matched, and the loop that
 * runs a compiled whole-step program on the device for a number of steps. Header-only and private
 * to the tests. */
#ifndef GT_CUDA_TEST_UTIL_H
#define GT_CUDA_TEST_UTIL_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graphtrain/gt_backend.h"
#include "graphtrain/gt_cuda.h"
#include "graphtrain/gt_program.h"
#include "gt_test.h"
#include "step_harness.h"

/* The start of a CUDA test's main. Without a device: prints the skip line and returns 0 (the
 * test's exit code). Otherwise initialises device 0 (its description into *info when info is not
 * NULL) and, when stream is not NULL, creates *stream; on failure prints why and returns 1.
 * Returns -1 when the test goes on. */
static inline int cu_test_start(gt_cuda_device_info *info, gt_cuda_stream **stream)
{
    if (gt_cuda_device_count() == 0) {
        printf("0 passed, 0 failed (no CUDA device)\n");
        return 0;
    }
    gt_error err = {0};
    if (gt_cuda_init(0, info, &err) != GT_OK ||
        (stream && gt_cuda_stream_create(stream, &err) != GT_OK)) {
        fprintf(stderr, "CUDA setup failed: %s\n", err.msg);
        return 1;
    }
    return -1;
}

/* Uniform in [lo, hi) from the splitmix64 stream *state (each test seeds its own): the state
 * advances by the golden-ratio increment, the mix of the result gives 53 random bits. */
static inline double cu_urand(uint64_t *state, double lo, double hi)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return lo + (hi - lo) * (double)(z >> 11) * 0x1p-53;
}

/* A host tensor of dtype dt and the given shape (contents as gt_tensor_alloc leaves them). */
static inline gt_tensor cu_tensor_new(gt_dtype dt, int ndim, const int64_t *shape)
{
    gt_tensor t;
    gt_error err = {0};
    GT_CHECK(gt_tensor_alloc(&t, dt, ndim, shape, &err) == GT_OK);
    return t;
}

/* A host tensor of dtype dt, each element cu_urand(state, lo, hi) rounded to dt, in order. */
static inline gt_tensor cu_tensor_rand(uint64_t *state, gt_dtype dt, int ndim, const int64_t *shape,
                                       double lo, double hi)
{
    gt_tensor t = cu_tensor_new(dt, ndim, shape);
    for (int64_t k = 0; k < gt_tensor_numel(&t); k++)
        gt_tensor_set_f32(&t, k, (float)cu_urand(state, lo, hi));
    return t;
}

/* An integer tensor (dt GT_I32 or GT_I64) of ids drawn from [lo, hi) by cu_urand(state), one draw
 * per element in order; when every > 0, the elements k with k % every == 1 are `special` instead
 * (drawn all the same, so the stream does not depend on every). */
static inline gt_tensor cu_tensor_ids(uint64_t *state, gt_dtype dt, int ndim, const int64_t *shape,
                                      int64_t lo, int64_t hi, int64_t special, int every)
{
    gt_tensor t = cu_tensor_new(dt, ndim, shape);
    for (int64_t k = 0; k < gt_tensor_numel(&t); k++) {
        int64_t v = lo + (int64_t)cu_urand(state, 0.0, (double)(hi - lo));
        if (every > 0 && k % every == 1) v = special;
        if (dt == GT_I32)
            ((int32_t *)t.data)[k] = (int32_t)v;
        else
            ((int64_t *)t.data)[k] = v;
    }
    return t;
}

/* A kernel call of op on in[0 .. n_in) into out[0 .. n_out), with attributes i, f, e (NULL and 0
 * where the op has none). */
static inline gt_kernel_call cu_kernel_call(gt_op op, const int64_t *i, int ni, const double *f,
                                            int nf, const int64_t *e, int ne, const gt_tensor *in,
                                            int n_in, gt_tensor *out, int n_out)
{
    gt_kernel_call k;
    memset(&k, 0, sizeof k);
    k.op = op;
    k.i = i;
    k.f = f;
    k.e = e;
    k.ni = ni;
    k.nf = nf;
    k.ne = ne;
    k.n_in = n_in;
    k.n_out = n_out;
    for (int j = 0; j < n_in; j++)
        k.in[j] = &in[j];
    for (int j = 0; j < n_out; j++)
        k.out[j] = &out[j];
    return k;
}

/* Fills every byte of device tensor dev with `byte` (and waits for it), so that an output element
 * a kernel leaves unwritten shows as a difference between runs with different patterns. */
static inline bool cu_fill_pattern(gt_cuda_stream *stream, gt_tensor *dev, uint8_t byte)
{
    size_t n = gt_tensor_nbytes(dev);
    if (n == 0) return true;
    uint8_t *buf = malloc(n);
    GT_CHECK(buf);
    memset(buf, byte, n);
    gt_error err = {0};
    bool ok = gt_cuda_memcpy_h2d(stream, dev->data, buf, n, &err) == GT_OK &&
              gt_cuda_stream_sync(stream, &err) == GT_OK;
    free(buf);
    return ok;
}

/* max |a - ref| / max |ref| over the finite elements (absolute when ref is all zero); NaN must
 * match NaN and inf the same inf, else the result is inf. */
static inline double cu_rel_err(const gt_tensor *a, const gt_tensor *ref)
{
    double num = 0.0, den = 0.0;
    for (int64_t k = 0; k < gt_tensor_numel(ref); k++) {
        double r = gt_tensor_get_f32(ref, k), v = gt_tensor_get_f32(a, k);
        if (isnan(r) || isnan(v)) {
            if (!(isnan(r) && isnan(v))) return INFINITY;
            continue;
        }
        if (isinf(r) || isinf(v)) {
            if (r != v) return INFINITY;
            continue;
        }
        num = fmax(num, fabs(v - r));
        den = fmax(den, fabs(r));
    }
    return den > 0.0 ? num / den : num;
}

/* Sets input k of the CUDA program cp from state[k] for every input of g (per_step_only: only
 * those of kind INPUT — tokens, labels, optimizer scalars — which live in the step arena and are
 * set before each step); stops at the first error, counted by EXPECT_OK. */
static inline void cu_program_set_inputs(gt_cuda_program *cp, const gt_graph *g,
                                         const gt_tensor *state, bool per_step_only, gt_error *err)
{
    for (int32_t k = 0; k < g->n_inputs && !err->code; k++)
        if (!per_step_only || g->inputs[k].kind == GT_IN_INPUT)
            EXPECT_OK(gt_cuda_program_set_input(cp, k, &state[k], err), err);
}

/* Steps first .. last of cp (whose inputs are set): before each, the optimizer scalars in state
 * are set for the step and the per-step inputs set again; step n's outputs are read into
 * out[(n - 1) * n_outputs + k] and every state update is carried to its input buffer. Stops at the
 * first error, counted by EXPECT_OK. */
static inline void cu_program_step_range(gt_cuda_program *cp, const step_graph *s,
                                         const gt_graph *g, gt_tensor *state, int64_t first,
                                         int64_t last, gt_tensor *out, gt_error *err)
{
    for (int64_t step = first; step <= last && !err->code; step++) {
        step_set_scalars(s, g, state, step);
        cu_program_set_inputs(cp, g, state, true, err);
        if (!err->code) EXPECT_OK(gt_cuda_program_exec(cp, err), err);
        gt_tensor *o = out + (step - 1) * g->n_outputs;
        for (int32_t k = 0; k < g->n_outputs && !err->code; k++)
            EXPECT_OK(gt_cuda_program_read_output(cp, k, &o[k], err), err);
        for (int32_t k = 0; k < g->n_outputs && !err->code; k++) {
            int32_t in = gt_program_state_input(g, k);
            if (in >= 0) EXPECT_OK(gt_cuda_program_carry(cp, k, in, err), err);
        }
    }
}

/* Steps 1 .. steps of cp, as cu_program_step_range. */
static inline void cu_program_steps(gt_cuda_program *cp, const step_graph *s, const gt_graph *g,
                                    gt_tensor *state, int64_t steps, gt_tensor *out, gt_error *err)
{
    cu_program_step_range(cp, s, g, state, 1, steps, out, err);
}

#endif
