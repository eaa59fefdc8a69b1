/* executor.c — gt_executor (gt_exec.h): the wrappers every caller goes through, and the eager and
 * CPU program backends. The CUDA program's backend is in executor_cuda.c.
 *
 * The wrappers keep what every backend shares — the run counts, a synchronous executor's tickets,
 * reading a scalar result — and do the trivial thing for an entry a backend leaves NULL, so that
 * a caller never asks which backend it has, only (through gt_executor_caps) what it can do. */
#include <stdlib.h>
#include <string.h>

#include "executor_internal.h"

const char *gt_executor_kind_name(gt_executor_kind kind)
{
    switch (kind) {
    case GT_EXECUTOR_EAGER:
        return "eager";
    case GT_EXECUTOR_CPU:
        return "cpu";
    case GT_EXECUTOR_CUDA:
        return "cuda";
    }
    return "?";
}

static gt_status lacks(const gt_executor *ex, const char *op, gt_error *err)
{
    return gt_error_set(err, GT_ERR_INVALID, "executor %s: %s is not supported", ex->iface->name,
                        op);
}

static gt_status check_input(const gt_executor *ex, int32_t k, gt_error *err)
{
    if (k < 0 || k >= ex->g->n_inputs)
        return gt_error_set(err, GT_ERR_INVALID, "executor %s: no graph input %d (it has %d)",
                            ex->iface->name, k, ex->g->n_inputs);
    return GT_OK;
}

static gt_status check_output(const gt_executor *ex, int32_t k, gt_error *err)
{
    if (k < 0 || k >= ex->g->n_outputs)
        return gt_error_set(err, GT_ERR_INVALID, "executor %s: no graph output %d (it has %d)",
                            ex->iface->name, k, ex->g->n_outputs);
    return GT_OK;
}

static const char *input_name(const gt_executor *ex, int32_t k)
{
    return gt_graph_str(ex->g, ex->g->inputs[k].fqn);
}

/* ---------------------------------------------------------------- eager */

static void eager_free_outputs(gt_executor *ex)
{
    for (int32_t k = 0; ex->out && k < ex->g->n_outputs; k++)
        gt_tensor_free(&ex->out[k]);
}

static void eager_free(gt_executor *ex)
{
    eager_free_outputs(ex);
    free(ex->src);
    free(ex->in);
    free(ex->out);
}

static gt_status eager_set_comms(gt_executor *ex, gt_comm *const comms[GT_MESH_MAX_DIMS],
                                 gt_error *err)
{
    (void)err;
    ex->have_comms = comms != NULL;
    for (int d = 0; d < GT_MESH_MAX_DIMS; d++)
        ex->comms[d] = comms ? comms[d] : NULL;
    return GT_OK;
}

static gt_status eager_set_input(gt_executor *ex, int32_t k, gt_tensor *t, gt_error *err)
{
    (void)err;
    ex->src[k] = t;
    return GT_OK;
}

static gt_status eager_bound(const gt_executor *ex, int32_t k, gt_error *err)
{
    if (ex->src[k]) return GT_OK;
    return gt_error_set(err, GT_ERR_INVALID, "executor eager: graph input %d (%s) was never set", k,
                        input_name(ex, k));
}

static gt_status eager_zero_input(gt_executor *ex, int32_t k, gt_error *err)
{
    GT_TRY(eager_bound(ex, k, err));
    memset(ex->src[k]->data, 0, gt_tensor_nbytes(ex->src[k]));
    return GT_OK;
}

/* The outputs stay in ex->out until the next run (or a carry takes them). */
static gt_status eager_run_part(gt_executor *ex, gt_run_part part, gt_error *err)
{
    eager_free_outputs(ex);
    for (int32_t k = 0; k < ex->g->n_inputs; k++) {
        GT_TRY(eager_bound(ex, k, err));
        ex->in[k] = *ex->src[k];
        ex->in[k].owns_data = false;
    }
    return gt_eager_run_part(ex->g, ex->binding, ex->in, ex->have_comms ? ex->comms : NULL, part,
                             ex->out, err);
}

/* The output tensor moves into the caller's tensor of the input, whose old bytes are freed. */
static gt_status eager_carry(gt_executor *ex, int32_t out_k, int32_t in_k, gt_error *err)
{
    gt_tensor *o = &ex->out[out_k];
    if (!o->data) return GT_OK; /* not computed by the last run's part */
    GT_TRY(eager_bound(ex, in_k, err));
    gt_tensor *dst = ex->src[in_k];
    if (gt_tensor_nbytes(dst) != gt_tensor_nbytes(o))
        return gt_error_set(err, GT_ERR_INTERNAL,
                            "executor eager: output %s has %zu bytes, its input %zu",
                            gt_graph_str(ex->g, ex->g->outputs[out_k].fqn), gt_tensor_nbytes(o),
                            gt_tensor_nbytes(dst));
    gt_tensor_free(dst);
    *dst = *o;
    memset(o, 0, sizeof *o);
    return GT_OK;
}

static gt_status eager_output_view(gt_executor *ex, int64_t ticket, int32_t k, gt_tensor *t,
                                   gt_error *err)
{
    (void)ticket, (void)err;
    *t = ex->out[k];
    t->owns_data = false;
    return GT_OK;
}

static gt_status eager_read_input(gt_executor *ex, int32_t k, gt_tensor *dst, gt_error *err)
{
    GT_TRY(eager_bound(ex, k, err));
    const gt_tensor *s = ex->src[k];
    if (s == dst) return GT_OK; /* the caller's tensor holds the value already */
    if (s->dtype != dst->dtype || gt_tensor_nbytes(s) != gt_tensor_nbytes(dst))
        return gt_error_set(err, GT_ERR_INVALID,
                            "executor eager: graph input %d (%s): the tensor to read into does "
                            "not match it",
                            k, input_name(ex, k));
    memcpy(dst->data, s->data, gt_tensor_nbytes(s));
    return GT_OK;
}

static const gt_executor_iface eager_iface = {
    .name = "eager",
    .caps = 0,
    .free = eager_free,
    .set_comms = eager_set_comms,
    .set_input = eager_set_input,
    .stage_input = eager_set_input,
    .zero_input = eager_zero_input,
    .run_part = eager_run_part,
    .carry = eager_carry,
    .output_view = eager_output_view,
    .read_input = eager_read_input,
};

/* ---------------------------------------------------------------- the CPU program */

static void cpu_free(gt_executor *ex)
{
    gt_program_free(ex->prog);
}

static gt_status cpu_set_comms(gt_executor *ex, gt_comm *const comms[GT_MESH_MAX_DIMS],
                               gt_error *err)
{
    return gt_program_set_comms(ex->prog, comms, err);
}

static gt_status cpu_set_input(gt_executor *ex, int32_t k, gt_tensor *t, gt_error *err)
{
    return gt_program_set_input(ex->prog, k, t, err);
}

static gt_status cpu_zero_input(gt_executor *ex, int32_t k, gt_error *err)
{
    return gt_program_zero_input(ex->prog, k, err);
}

static gt_status cpu_run_part(gt_executor *ex, gt_run_part part, gt_error *err)
{
    return gt_program_exec_part(ex->prog, part, err);
}

static gt_status cpu_carry(gt_executor *ex, int32_t out_k, int32_t in_k, gt_error *err)
{
    return gt_program_carry(ex->prog, out_k, in_k, err);
}

static gt_status cpu_output_view(gt_executor *ex, int64_t ticket, int32_t k, gt_tensor *t,
                                 gt_error *err)
{
    (void)ticket;
    return gt_program_output(ex->prog, k, t, err);
}

static gt_status cpu_read_input(gt_executor *ex, int32_t k, gt_tensor *dst, gt_error *err)
{
    return gt_program_read_input(ex->prog, k, dst, err);
}

static gt_status cpu_drop_collective(gt_executor *ex, int32_t index, gt_error *err)
{
    return gt_program_drop_collective(ex->prog, index, err);
}

static int32_t cpu_comm_timings(gt_executor *ex, gt_comm_timing *out, int32_t max)
{
    return gt_program_comm_timings(ex->prog, out, max);
}

static const gt_program *cpu_lowered(const gt_executor *ex)
{
    return ex->prog;
}

static size_t cpu_allocated_bytes(const gt_executor *ex, gt_arena_kind a)
{
    return gt_program_allocated_bytes(ex->prog, a);
}

static const gt_executor_iface cpu_iface = {
    .name = "cpu",
    .caps = GT_EXEC_CAP_COMM_TIMINGS | GT_EXEC_CAP_DROP_COLLECTIVE,
    .free = cpu_free,
    .set_comms = cpu_set_comms,
    .set_input = cpu_set_input,
    .stage_input = cpu_set_input,
    .zero_input = cpu_zero_input,
    .run_part = cpu_run_part,
    .carry = cpu_carry,
    .output_view = cpu_output_view,
    .read_input = cpu_read_input,
    .drop_collective = cpu_drop_collective,
    .comm_timings = cpu_comm_timings,
    .lowered = cpu_lowered,
    .allocated_bytes = cpu_allocated_bytes,
};

/* ---------------------------------------------------------------- the wrappers */

gt_status gt_executor_create(const gt_graph *g, const gt_sym_binding *binding,
                             gt_executor_kind kind, const gt_plan_options *plan, gt_executor **out,
                             gt_error *err)
{
    *out = NULL;
    gt_executor *ex = gt_xcalloc(1, sizeof *ex);
    ex->kind = kind, ex->g = g, ex->binding = binding;
    gt_status st = GT_OK;
    switch (kind) {
    case GT_EXECUTOR_EAGER:
        ex->iface = &eager_iface;
        ex->src = gt_xcalloc((size_t)g->n_inputs + 1, sizeof *ex->src);
        ex->in = gt_xcalloc((size_t)g->n_inputs + 1, sizeof *ex->in);
        ex->out = gt_xcalloc((size_t)g->n_outputs + 1, sizeof *ex->out);
        break;
    case GT_EXECUTOR_CPU:
        ex->iface = &cpu_iface;
        st = gt_program_build(g, binding, &ex->prog, err);
        break;
    case GT_EXECUTOR_CUDA:
        if (!gt_executor_cuda_iface) {
            st = gt_error_set(err, GT_ERR_UNSUPPORTED,
                              "executor cuda: this graphtrain was built without CUDA");
            break;
        }
        ex->iface = gt_executor_cuda_iface;
        st = gt_executor_cuda_build(ex, plan, err);
        break;
    default:
        st = gt_error_set(err, GT_ERR_INVALID, "executor: unknown kind %d", (int)kind);
    }
    if (st != GT_OK) {
        if (ex->iface) ex->iface->free(ex);
        free(ex);
        return st;
    }
    *out = ex;
    return GT_OK;
}

void gt_executor_free(gt_executor *ex)
{
    if (!ex) return;
    ex->iface->free(ex);
    free(ex);
}

gt_executor_kind gt_executor_kind_of(const gt_executor *ex)
{
    return ex->kind;
}

unsigned gt_executor_caps(const gt_executor *ex)
{
    return ex ? ex->iface->caps : 0;
}

gt_status gt_executor_set_comms(gt_executor *ex, gt_comm *const comms[GT_MESH_MAX_DIMS],
                                gt_error *err)
{
    return ex->iface->set_comms(ex, comms, err);
}

gt_status gt_executor_set_input(gt_executor *ex, int32_t k, gt_tensor *t, gt_error *err)
{
    GT_TRY(check_input(ex, k, err));
    return ex->iface->set_input(ex, k, t, err);
}

gt_status gt_executor_stage_input(gt_executor *ex, int32_t k, gt_tensor *t, gt_error *err)
{
    GT_TRY(check_input(ex, k, err));
    return ex->iface->stage_input(ex, k, t, err);
}

gt_status gt_executor_zero_input(gt_executor *ex, int32_t k, gt_error *err)
{
    GT_TRY(check_input(ex, k, err));
    return ex->iface->zero_input(ex, k, err);
}

gt_status gt_executor_run_part(gt_executor *ex, gt_run_part part, gt_error *err)
{
    if (part != GT_RUN_ALL && part != GT_RUN_MICRO)
        return gt_error_set(err, GT_ERR_INVALID, "executor %s: no run part %d", ex->iface->name,
                            (int)part);
    ex->runs[part]++;
    ex->last_part = part;
    return ex->iface->run_part(ex, part, err);
}

int64_t gt_executor_runs(const gt_executor *ex, gt_run_part part)
{
    return part == GT_RUN_ALL || part == GT_RUN_MICRO ? ex->runs[part] : 0;
}

gt_status gt_executor_carry(gt_executor *ex, int32_t out_k, int32_t in_k, gt_error *err)
{
    GT_TRY(check_output(ex, out_k, err));
    GT_TRY(check_input(ex, in_k, err));
    return ex->iface->carry(ex, out_k, in_k, err);
}

gt_status gt_executor_fetch_output(gt_executor *ex, int32_t k, gt_error *err)
{
    GT_TRY(check_output(ex, k, err));
    return ex->iface->fetch_output ? ex->iface->fetch_output(ex, k, err) : GT_OK;
}

gt_status gt_executor_end_run(gt_executor *ex, int64_t *ticket, gt_error *err)
{
    if (ex->iface->end_run) return ex->iface->end_run(ex, ticket, err);
    *ticket = ex->ended++;
    return GT_OK;
}

gt_status gt_executor_wait(gt_executor *ex, int64_t ticket, gt_error *err)
{
    return ex->iface->wait ? ex->iface->wait(ex, ticket, err) : GT_OK;
}

gt_status gt_executor_read_scalar(gt_executor *ex, int64_t ticket, int32_t k, double *v,
                                  gt_error *err)
{
    GT_TRY(check_output(ex, k, err));
    if (!(ex->iface->caps & GT_EXEC_CAP_ASYNC)) {
        /* a synchronous executor holds the last run's outputs, those of its part */
        if (ticket != ex->ended - 1) return GT_OK;
        if (ex->last_part != GT_RUN_ALL && !gt_graph_micro_output(ex->g->outputs[k].kind))
            return GT_OK;
    }
    gt_tensor t;
    memset(&t, 0, sizeof t);
    GT_TRY(ex->iface->output_view(ex, ticket, k, &t, err));
    if (t.data) *v = gt_tensor_get_f32(&t, 0);
    return GT_OK;
}

gt_status gt_executor_read_input(gt_executor *ex, int32_t k, gt_tensor *dst, gt_error *err)
{
    GT_TRY(check_input(ex, k, err));
    return ex->iface->read_input(ex, k, dst, err);
}

gt_status gt_executor_read_input_bytes(gt_executor *ex, int32_t k, size_t offset, size_t n,
                                       void *dst, gt_error *err)
{
    if (!ex->iface->read_input_bytes) return lacks(ex, "read_input_bytes", err);
    return ex->iface->read_input_bytes(ex, k, offset, n, dst, err);
}

gt_status gt_executor_queue_input_bytes(gt_executor *ex, int32_t k, size_t offset, size_t n,
                                        const void *src, gt_error *err)
{
    if (!ex->iface->queue_input_bytes) return lacks(ex, "queue_input_bytes", err);
    return ex->iface->queue_input_bytes(ex, k, offset, n, src, err);
}

gt_status gt_executor_sync(gt_executor *ex, gt_error *err)
{
    return ex->iface->sync ? ex->iface->sync(ex, err) : GT_OK;
}

void *gt_executor_input_data(gt_executor *ex, int32_t k)
{
    return ex->iface->input_data ? ex->iface->input_data(ex, k) : NULL;
}

void *gt_executor_stream(gt_executor *ex)
{
    return ex->iface->stream ? ex->iface->stream(ex) : NULL;
}

gt_status gt_executor_capture_part(gt_executor *ex, gt_run_part part, bool *captured, gt_error *err)
{
    *captured = false;
    if (!ex->iface->capture_part) return GT_OK;
    GT_TRY(ex->iface->capture_part(ex, part, err));
    *captured = true;
    return GT_OK;
}

gt_status gt_executor_collectives(const gt_executor *ex, bool with_place, gt_comm_sched_entry *out,
                                  int32_t max, int32_t *count, gt_error *err)
{
    const gt_program *lowered = gt_executor_lowered(ex);
    if (!lowered) return gt_graph_collectives(ex->g, ex->binding, out, max, count, err);
    *count = gt_program_collectives(lowered, with_place, out, max);
    return GT_OK;
}

gt_status gt_executor_drop_collective(gt_executor *ex, int32_t index, gt_error *err)
{
    if (!ex->iface->drop_collective) return lacks(ex, "drop_collective", err);
    return ex->iface->drop_collective(ex, index, err);
}

gt_status gt_executor_set_comm_timing(gt_executor *ex, bool on, gt_error *err)
{
    return ex->iface->set_comm_timing ? ex->iface->set_comm_timing(ex, on, err) : GT_OK;
}

int32_t gt_executor_comm_timings(gt_executor *ex, gt_comm_timing *out, int32_t max)
{
    return ex->iface->comm_timings ? ex->iface->comm_timings(ex, out, max) : -1;
}

double gt_executor_timed_run_seconds(gt_executor *ex)
{
    return ex->iface->timed_run_seconds ? ex->iface->timed_run_seconds(ex) : 0;
}

const gt_program *gt_executor_lowered(const gt_executor *ex)
{
    return ex->iface->lowered ? ex->iface->lowered(ex) : NULL;
}

size_t gt_executor_planned_bytes(const gt_executor *ex, gt_arena_kind a)
{
    const gt_program *p = gt_executor_lowered(ex);
    return p ? gt_program_planned_bytes(p, a) : 0;
}

size_t gt_executor_allocated_bytes(const gt_executor *ex, gt_arena_kind a)
{
    return ex->iface->allocated_bytes ? ex->iface->allocated_bytes(ex, a) : 0;
}

gt_status gt_executor_mark(gt_executor *ex, int64_t mark, gt_error *err)
{
    return ex->iface->mark ? ex->iface->mark(ex, mark, err) : GT_OK;
}

gt_status gt_executor_mark_seconds(gt_executor *ex, int64_t from, int64_t to, double *s,
                                   gt_error *err)
{
    return ex->iface->mark_seconds ? ex->iface->mark_seconds(ex, from, to, s, err) : GT_OK;
}
