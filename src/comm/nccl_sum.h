/* nccl_sum.h — the ordered sum of the NCCL communicator's reductions (src/comm/nccl.c), on
 * the device. Plain C; defined in nccl_sum.cu. */
#ifndef GRAPHTRAIN_NCCL_SUM_H
#define GRAPHTRAIN_NCCL_SUM_H

#include "graphtrain/gt_core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* dst[i] = src[0·numel + i] + src[1·numel + i] + … + src[(n-1)·numel + i] for i < numel: the n
 * blocks of src (device memory, back to back, dtype dt) added left to right, which is rank order
 * when block r came from rank r, into dst of dtype out_dt. Exactly gt_comm_sum_ordered on the
 * device: f32 accumulation for f32, bf16 and f16 (bf16/f16 widened exactly, rounded to nearest
 * even once at the end, or stored unrounded when out_dt is f32: the widening reduce-scatter),
 * wrapping sums for i32/i64; out_dt is dt or, for bf16/f16, f32. Queued on `stream` (a
 * cudaStream_t); capturable in a CUDA graph. dst may alias block 0 of src when out_dt == dt.
 * When 0 <= own < n, block own is read at own_src instead (this rank's own contribution, where
 * it already lies: no copy into src); own = -1 for none. */
gt_status gt_comm_nccl_sum(gt_dtype dt, gt_dtype out_dt, int64_t numel, const void *src, int n,
                           int own, const void *own_src, void *dst, void *stream, gt_error *err);

#ifdef __cplusplus
}
#endif
#endif
