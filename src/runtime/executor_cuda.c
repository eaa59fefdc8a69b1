/* executor_cuda.c — gt_executor's CUDA program backend (gt_exec.h): each entry is the
 * gt_cuda_program_* call of the same name (gt_program.h, "the program on a CUDA device"). Compiled
 * in every build, as exec_cuda.c; without CUDA (GT_HAVE_CUDA) the table is NULL and
 * gt_executor_create refuses the kind. */
#include <stdlib.h>
#include <string.h>

#include "executor_internal.h"

#ifdef GT_HAVE_CUDA
#include "graphtrain/gt_cuda.h"

static void cuda_free(gt_executor *ex)
{
    gt_cuda_program_free(ex->dev);
}

static gt_status cuda_set_comms(gt_executor *ex, gt_comm *const comms[GT_MESH_MAX_DIMS],
                                gt_error *err)
{
    return gt_cuda_program_set_comms(ex->dev, comms, err);
}

static gt_status cuda_set_input(gt_executor *ex, int32_t k, gt_tensor *t, gt_error *err)
{
    return gt_cuda_program_set_input(ex->dev, k, t, err);
}

static gt_status cuda_stage_input(gt_executor *ex, int32_t k, gt_tensor *t, gt_error *err)
{
    return gt_cuda_program_stage_input(ex->dev, k, t, err);
}

static gt_status cuda_zero_input(gt_executor *ex, int32_t k, gt_error *err)
{
    return gt_cuda_program_zero_input(ex->dev, k, err);
}

/* The matmul shapes the warm-up run tuned (cuda_matmul_tune.cu), and what that cost. */
static void say_tuning(gt_executor *ex)
{
    gt_cuda_tune_stats ts = gt_cuda_stream_tune_stats(gt_cuda_program_stream(ex->dev));
    if (ts.timed + ts.cached <= ex->tuned_said) return;
    gt_log(GT_LOG_INFO,
           "matmul tuning: %d shape(s) timed their cuBLASLt candidates, %d taken from %s; "
           "%.2f s (GT_MATMUL_TUNE=0: the heuristic's pick, untimed)",
           ts.timed, ts.cached, ts.cache ? ts.cache : "no cache file", ts.seconds);
    ex->tuned_said = ts.timed + ts.cached;
}

static gt_status cuda_run_part(gt_executor *ex, gt_run_part part, gt_error *err)
{
    GT_TRY(gt_cuda_program_exec_part(ex->dev, part, err));
    if (ex->runs[part] == 1) say_tuning(ex); /* the part's warm-up run tuned its shapes */
    return GT_OK;
}

static gt_status cuda_carry(gt_executor *ex, int32_t out_k, int32_t in_k, gt_error *err)
{
    return gt_cuda_program_carry(ex->dev, out_k, in_k, err);
}

static gt_status cuda_fetch_output(gt_executor *ex, int32_t k, gt_error *err)
{
    return gt_cuda_program_fetch_output(ex->dev, k, err);
}

static gt_status cuda_end_run(gt_executor *ex, int64_t *ticket, gt_error *err)
{
    return gt_cuda_program_step_end(ex->dev, ticket, err);
}

static gt_status cuda_wait(gt_executor *ex, int64_t ticket, gt_error *err)
{
    return gt_cuda_program_step_wait(ex->dev, ticket, err);
}

/* The bytes fetched under ticket, in pinned memory. */
static gt_status cuda_output_view(gt_executor *ex, int64_t ticket, int32_t k, gt_tensor *t,
                                  gt_error *err)
{
    (void)err;
    const void *bytes = gt_cuda_program_fetched(ex->dev, ticket, k);
    if (!bytes) return GT_OK;
    const gt_buffer_ref *r = &gt_cuda_program_lowered(ex->dev)->outputs[k];
    gt_tensor_wrap(t, r->dtype, r->ndim, r->shape, (void *)bytes);
    return GT_OK;
}

static gt_status cuda_read_input(gt_executor *ex, int32_t k, gt_tensor *dst, gt_error *err)
{
    return gt_cuda_program_read_input(ex->dev, k, dst, err);
}

static gt_status cuda_read_input_bytes(gt_executor *ex, int32_t k, size_t offset, size_t n,
                                       void *dst, gt_error *err)
{
    return gt_cuda_program_read_input_bytes(ex->dev, k, offset, n, dst, err);
}

static gt_status cuda_queue_input_bytes(gt_executor *ex, int32_t k, size_t offset, size_t n,
                                        const void *src, gt_error *err)
{
    return gt_cuda_program_queue_input_bytes(ex->dev, k, offset, n, src, err);
}

static gt_status cuda_sync(gt_executor *ex, gt_error *err)
{
    return gt_cuda_program_sync(ex->dev, err);
}

static void *cuda_input_data(gt_executor *ex, int32_t k)
{
    return gt_cuda_program_input_data(ex->dev, k);
}

static void *cuda_stream(gt_executor *ex)
{
    return gt_cuda_program_stream(ex->dev);
}

static gt_status cuda_capture_part(gt_executor *ex, gt_run_part part, gt_error *err)
{
    return gt_cuda_program_capture_part(ex->dev, part, err);
}

static gt_status cuda_set_comm_timing(gt_executor *ex, bool on, gt_error *err)
{
    return gt_cuda_program_set_comm_timing(ex->dev, on, err);
}

static int32_t cuda_comm_timings(gt_executor *ex, gt_comm_timing *out, int32_t max)
{
    return gt_cuda_program_comm_timings(ex->dev, out, max);
}

static double cuda_timed_run_seconds(gt_executor *ex)
{
    return gt_cuda_program_timed_run_seconds(ex->dev);
}

static const gt_program *cuda_lowered(const gt_executor *ex)
{
    return gt_cuda_program_lowered(ex->dev);
}

static size_t cuda_allocated_bytes(const gt_executor *ex, gt_arena_kind a)
{
    return gt_cuda_program_allocated_bytes(ex->dev, a);
}

static gt_status cuda_mark(gt_executor *ex, int64_t mark, gt_error *err)
{
    return gt_cuda_program_mark(ex->dev, mark, err);
}

static gt_status cuda_mark_seconds(gt_executor *ex, int64_t from, int64_t to, double *s,
                                   gt_error *err)
{
    return gt_cuda_program_mark_seconds(ex->dev, from, to, s, err);
}

static const gt_executor_iface cuda_iface = {
    .name = "cuda",
    .caps = GT_EXEC_CAP_ASYNC | GT_EXEC_CAP_DEVICE | GT_EXEC_CAP_COMM_TIMINGS,
    .free = cuda_free,
    .set_comms = cuda_set_comms,
    .set_input = cuda_set_input,
    .stage_input = cuda_stage_input,
    .zero_input = cuda_zero_input,
    .run_part = cuda_run_part,
    .carry = cuda_carry,
    .fetch_output = cuda_fetch_output,
    .end_run = cuda_end_run,
    .wait = cuda_wait,
    .output_view = cuda_output_view,
    .read_input = cuda_read_input,
    .read_input_bytes = cuda_read_input_bytes,
    .queue_input_bytes = cuda_queue_input_bytes,
    .sync = cuda_sync,
    .input_data = cuda_input_data,
    .stream = cuda_stream,
    .capture_part = cuda_capture_part,
    .set_comm_timing = cuda_set_comm_timing,
    .comm_timings = cuda_comm_timings,
    .timed_run_seconds = cuda_timed_run_seconds,
    .lowered = cuda_lowered,
    .allocated_bytes = cuda_allocated_bytes,
    .mark = cuda_mark,
    .mark_seconds = cuda_mark_seconds,
};

const gt_executor_iface *const gt_executor_cuda_iface = &cuda_iface;

gt_status gt_executor_cuda_build(gt_executor *ex, const gt_plan_options *plan, gt_error *err)
{
    return gt_cuda_program_build(ex->g, ex->binding, plan, &ex->dev, err);
}

#else

const gt_executor_iface *const gt_executor_cuda_iface = NULL;

gt_status gt_executor_cuda_build(gt_executor *ex, const gt_plan_options *plan, gt_error *err)
{
    (void)ex, (void)plan;
    return gt_error_set(err, GT_ERR_UNSUPPORTED,
                        "executor cuda: this graphtrain was built without CUDA");
}

#endif /* GT_HAVE_CUDA */
