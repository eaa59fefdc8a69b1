/* trainer_parallel.c — the trainer's ranks: joining the world (MPI under mpirun; TCP sockets under
 * a torchrun-style launcher that sets RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT), the device mesh
 * from the config, one communicator per mesh dim, agreeing on errors, the cross-rank schedule check
 * before step 1, the per-rank memory report, and the test-only fault injection.
 *
 * State: each rank holds the block of every parameter and AdamW moment that its graph input is
 * placed on (the box of gt_placement_local_box within the global shape), parameters initialised
 * from their global element indices, so any layout starts from the one-rank bits.
 *
 * Rank r of the world sits at mesh coordinates gt_mesh_coords(mesh, r) (tp fastest). The
 * communicator of mesh dim k groups the ranks whose other coordinates equal this rank's: split
 * the world with color = the rank with coordinate k set to 0 (the same for the whole group, and
 * different between groups) and key = the coordinate on dim k, so a group's comm rank is its
 * coordinate there — what the collectives' rank order (block r = coordinate r) assumes.
 *
 * No hangs: errors that one rank may meet alone (a file it cannot read, rank 0's disk full) are
 * agreed on before the next collective (gt_train_agree / gt_train_share_status), so every rank
 * stops with the same message; errors inside the step's collectives are bounded by the
 * communicators' timeout (comm.init_timeout_seconds through step 1, then
 * comm.train_timeout_seconds: gt_train_dist_set_timeout), and mpirun stops the job when a process
 * dies (over TCP, a dead peer's closed sockets fail the collective at once). */
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "graphtrain/gt_autoparallel.h"
#include "graphtrain/gt_checkpoint.h"
#include "graphtrain/gt_deepseek_v3.h"
#include "train_internal.h"
#include "trainer_pp.h"

/* ---------------------------------------------------------------- AutoParallel */

gt_status gt_train_autoparallel(const gt_config *cfg, const gt_train_layout *layout,
                                const gt_graph *g, const gt_parallel_plan *plan,
                                gt_autopar_result **out, gt_error *err)
{
    *out = NULL;
    gt_autopar_options o = {0};
    /* the cost model's device: the run's (its measured profile when given) */
    GT_TRY(gt_autopar_device_default(cfg->training.device == GT_CFG_DEVICE_CUDA ? "h100" : "cpu",
                                     &o.device, err));
    if (cfg->parallelism.autoparallel_comm_profile[0])
        GT_TRY(gt_autopar_device_load(cfg->parallelism.autoparallel_comm_profile, &o.device, err));
    gt_sym_binding_entry entries[GT_TRAIN_BINDING_MAX];
    gt_sym_binding binding;
    gt_train_binding(cfg, layout, entries, &binding);
    o.binding = &binding;
    o.memory_budget_b = cfg->parallelism.autoparallel_memory_budget_gb * 1073741824.0;
    o.budget_state_only = cfg->compile.autoparallel_backend == GT_CFG_AUTOPAR_AUTOPARALLEL;
    /* the FSDP knobs the user set (nonzero) stay theirs; 0 leaves them to the solver */
    o.fsdp_bucket_cap_mb = cfg->compile.fsdp_bucket_cap_mb;
    o.fsdp_prefetch_depth = (int)cfg->compile.fsdp_prefetch_depth;
    return gt_autopar_solve(g, plan, &o, out, err);
}

void gt_train_autoparallel_compile_config(const gt_config *cfg, const gt_autopar_cost *chosen,
                                          gt_config *out)
{
    *out = *cfg; /* a shallow copy: only read, never freed */
    double budget = cfg->parallelism.autoparallel_memory_budget_gb;
    if (!cfg->compile.enable_autoparallel || !chosen ||
        cfg->compile.autoparallel_backend != GT_CFG_AUTOPAR_AUTOPARALLEL)
        return;
    const gt_autopar_policy *p = &chosen->policy;
    if (p->has_fsdp) { /* the user's nonzero values came back unchanged */
        out->compile.fsdp_bucket_cap_mb = p->bucket_cap_mb;
        out->compile.fsdp_prefetch_depth = p->prefetch_depth;
    }
    if (budget <= 0) return;
    /* what the budget leaves after parameters, gradients, optimizer state and the gathered
     * buckets in flight is the activations' (at least a MiB: the memory policy then recomputes
     * what it can) */
    double state = (chosen->params_b + chosen->grads_b + chosen->opt_b) / 1073741824.0;
    double act = budget - state - p->inflight_b / 1073741824.0;
    out->compile.memory_policy = GT_CFG_MEMORY_BUDGET;
    out->compile.activation_memory_budget_gb = act > 1.0 / 1024 ? act : 1.0 / 1024;
}

bool gt_train_autoparallel_describe(const gt_config *cfg, const gt_config *compile_cfg,
                                    const gt_autopar_cost *chosen, char *buf, size_t len)
{
    if (!cfg->compile.enable_autoparallel || !chosen ||
        cfg->compile.autoparallel_backend != GT_CFG_AUTOPAR_AUTOPARALLEL)
        return false;
    char policy[512];
    gt_autopar_policy_format(&chosen->policy, policy, sizeof policy);
    if (compile_cfg->compile.memory_policy == GT_CFG_MEMORY_BUDGET &&
        cfg->parallelism.autoparallel_memory_budget_gb > 0)
        snprintf(buf, len,
                 "backend autoparallel: memory_policy budget, %.3f GiB of activations (the "
                 "budget less the chosen layout's parameters, gradients, optimizer state and "
                 "gathered buckets); %s",
                 compile_cfg->compile.activation_memory_budget_gb, policy);
    else
        snprintf(buf, len,
                 "backend autoparallel: no memory budget, the configured "
                 "memory_policy; %s",
                 policy);
    return true;
}

/* ---------------------------------------------------------------- the mesh */

bool gt_train_launched_by_mpi(void)
{
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE"};
    for (size_t k = 0; k < sizeof vars / sizeof vars[0]; k++) {
        const char *v = getenv(vars[k]);
        if (v && v[0]) return true;
    }
    return false;
}

bool gt_train_launched_by_env(void)
{
    const char *v = getenv("WORLD_SIZE");
    if (!v || !v[0]) return false;
    char *end = NULL;
    long n = strtol(v, &end, 10);
    return !(end != v && *end == 0 && n == 1);
}

/* Expert parallel: ep must divide dp_shard x tp (efsdp = dp_shard x tp / ep) and the routed
 * experts. An ep dividing dp_shard is an ep group within the dp_shard dim: ep = dp_shard, or a
 * proper divisor of it (efsdp = dp_shard / ep groups, ep inner: gt_mesh_expert_split); the expert
 * weights keep FSDP's dp_shard storage and the rows travel to them (src/parallel/rules_moe.c);
 * with tp > 1 the MoE layers are replicated over tp. Otherwise ep takes tp ranks
 * (gt_mesh_expert_tp): the MoE tokens are split over tp, the groups cut dp_shard x tp, and the
 * expert weights are stored over dp_shard x tp (src/parallel/layout.c). */
static gt_status check_expert_parallel(const gt_config *cfg, int64_t shard, int64_t tp,
                                       gt_error *err)
{
    int64_t ep = cfg->parallelism.expert_parallel_degree;
    double f = cfg->parallelism.expert_parallel_capacity_factor;
    if (f != 0.0 && f < 0.001)
        return gt_error_set(err, GT_ERR_INVALID,
                            "parallelism.expert_parallel_capacity_factor = %g: use 0 (the worst "
                            "case) or at least 0.001",
                            f);
    if (ep <= 1) return GT_OK;
    if ((shard * tp) % ep != 0)
        return gt_error_set(err, GT_ERR_INVALID,
                            "parallelism.expert_parallel_degree = %lld must divide "
                            "data_parallel_shard_degree x tensor_parallel_degree = %lld",
                            (long long)ep, (long long)(shard * tp));
    if (strcmp(cfg->model.name, "deepseek_v3") != 0)
        return gt_error_set(err, GT_ERR_INVALID,
                            "parallelism.expert_parallel_degree = %lld: model %s has no routed "
                            "experts",
                            (long long)ep, cfg->model.name);
    gt_deepseek_v3_config m;
    GT_TRY(gt_deepseek_v3_flavor(cfg->model.flavor, &m, err));
    if (m.n_experts % ep != 0)
        return gt_error_set(err, GT_ERR_INVALID,
                            "parallelism.expert_parallel_degree = %lld must divide the %lld routed "
                            "experts of deepseek_v3 %s",
                            (long long)ep, (long long)m.n_experts, cfg->model.flavor);
    if (shard % ep != 0) {
        /* ep takes tp ranks (gt_mesh_expert_tp): the expert weights are stored, and the rows
         * cut, in dp_shard x tp blocks of whole experts, and the tokens of a rank over its tp
         * ranks */
        int64_t n = shard * tp;
        if (m.n_experts % n != 0)
            return gt_error_set(err, GT_ERR_INVALID,
                                "parallelism.expert_parallel_degree = %lld takes tensor-parallel "
                                "ranks and needs the %lld routed experts of deepseek_v3 %s to "
                                "divide by data_parallel_shard_degree x tensor_parallel_degree = "
                                "%lld",
                                (long long)ep, (long long)m.n_experts, cfg->model.flavor,
                                (long long)n);
        if (cfg->training.seq_len % tp != 0)
            return gt_error_set(err, GT_ERR_INVALID,
                                "parallelism.expert_parallel_degree = %lld takes tensor-parallel "
                                "ranks, which split each sequence's tokens: training.seq_len = "
                                "%lld must be a multiple of tensor_parallel_degree = %lld",
                                (long long)ep, (long long)cfg->training.seq_len, (long long)tp);
        return GT_OK;
    }
    /* the efsdp x ep split keeps FSDP's storage of whole experts: E / dp_shard per rank */
    if (ep != shard && m.n_experts % shard != 0)
        return gt_error_set(err, GT_ERR_INVALID,
                            "parallelism.expert_parallel_degree = %lld < "
                            "data_parallel_shard_degree = %lld needs the %lld routed experts of "
                            "deepseek_v3 %s to divide by data_parallel_shard_degree",
                            (long long)ep, (long long)shard, (long long)m.n_experts,
                            cfg->model.flavor);
    return GT_OK;
}

gt_status gt_train_layout_init(const gt_config *cfg, int world_size, int rank, gt_train_layout *out,
                               gt_error *err)
{
    memset(out, 0, sizeof *out);
    const gt_cfg_parallelism *p = &cfg->parallelism;
    if (p->pipeline_parallel_degree > 1)
        return gt_error_set(err, GT_ERR_UNSUPPORTED,
                            "parallelism.pipeline_parallel_degree = %lld: pipeline parallelism is "
                            "not supported yet; set it to 1",
                            (long long)p->pipeline_parallel_degree);
    int64_t rep = p->data_parallel_replicate_degree, tp = p->tensor_parallel_degree;
    int64_t shard = p->data_parallel_shard_degree;
    if (shard < 0) {
        /* -1: every rank the other degrees leave (1 when there is no launcher to count them) */
        if (world_size > 0 && world_size % (rep * tp) != 0)
            return gt_error_set(err, GT_ERR_INVALID,
                                "parallelism: %d ranks are not a multiple of "
                                "data_parallel_replicate_degree x tensor_parallel_degree = %lld "
                                "(data_parallel_shard_degree = -1 takes the ranks they leave)",
                                world_size, (long long)(rep * tp));
        shard = world_size > 0 ? world_size / (rep * tp) : 1;
    }
    if (rep * shard * tp > (1 << 20))
        return gt_error_set(err, GT_ERR_INVALID,
                            "parallelism: a mesh of %lld x %lld x %lld ranks is too large",
                            (long long)rep, (long long)shard, (long long)tp);
    GT_TRY(gt_mesh_init(&out->mesh, (int)rep, (int)shard, (int)tp, err));
    int size = gt_mesh_world_size(&out->mesh);
    if (world_size > 0 && size != world_size) {
        char mesh[96];
        gt_mesh_format(&out->mesh, mesh, sizeof mesh);
        return gt_error_set(err, GT_ERR_INVALID,
                            "parallelism: the mesh (%s) has %d ranks but %d process%s launched; "
                            "launch one process per rank: `mpirun -np %d graphtrain train ...` "
                            "(or change the parallelism degrees)",
                            mesh, size, world_size, world_size == 1 ? " was" : "es were", size);
    }
    if (tp > 1 && p->enable_sequence_parallel && cfg->training.seq_len % tp != 0)
        return gt_error_set(err, GT_ERR_INVALID,
                            "training.seq_len = %lld is not a multiple of tensor_parallel_degree "
                            "= %lld, which sequence parallelism splits it by (or set "
                            "parallelism.enable_sequence_parallel = false)",
                            (long long)cfg->training.seq_len, (long long)tp);
    GT_TRY(check_expert_parallel(cfg, shard, tp, err));
    gt_mesh_coords(&out->mesh, rank, out->coords);
    return GT_OK;
}

int64_t gt_train_global_batch(const gt_config *cfg, const gt_train_layout *layout)
{
    const gt_mesh *m = &layout->mesh;
    return cfg->training.local_batch_size * m->size[GT_MESH_DP_REPLICATE] *
           m->size[GT_MESH_DP_SHARD];
}

gt_status gt_train_micro_batches(const gt_config *cfg, const gt_train_layout *layout,
                                 int64_t *micro, gt_error *err)
{
    int64_t step = gt_train_global_batch(cfg, layout);
    int64_t global = cfg->training.global_batch_size < 0 ? step : cfg->training.global_batch_size;
    *micro = 1;
    if (global % step != 0)
        return gt_error_set(err, GT_ERR_INVALID,
                            "training.global_batch_size = %lld must be a multiple of "
                            "local_batch_size × data-parallel degree = %lld",
                            (long long)global, (long long)step);
    *micro = global / step;
    return GT_OK;
}

void gt_train_binding(const gt_config *cfg, const gt_train_layout *layout,
                      gt_sym_binding_entry *entries, gt_sym_binding *out)
{
    int n = 0, tp = layout->mesh.size[GT_MESH_TP];
    entries[n++] = (gt_sym_binding_entry){"batch", cfg->training.local_batch_size};
    entries[n++] = (gt_sym_binding_entry){"seq", cfg->training.seq_len};
    if (tp > 1 && (cfg->parallelism.enable_sequence_parallel ||
                   gt_mesh_expert_tp(&layout->mesh, (int)cfg->parallelism.expert_parallel_degree)))
        entries[n++] = (gt_sym_binding_entry){"seq_shard", cfg->training.seq_len / tp};
    if (gt_mesh_world_size(&layout->mesh) > 1)
        for (int d = 0; d < GT_MESH_NDIMS; d++)
            entries[n++] = (gt_sym_binding_entry){gt_mesh_coord_symbol(d), layout->coords[d]};
    *out = (gt_sym_binding){entries, n};
}

/* ---------------------------------------------------------------- ranks */

bool gt_train_dist_multi(const gt_train_dist *d)
{
    return d->world && d->size > 1;
}

gt_status gt_train_dist_init(const gt_config *cfg, gt_train_dist *d, gt_error *err)
{
    memset(d, 0, sizeof *d);
    d->size = 1;
    if (gt_train_launched_by_mpi()) {
        if (!gt_comm_mpi_available())
            return gt_error_set(err, GT_ERR_UNSUPPORTED,
                                "started by an MPI launcher (mpirun), but this graphtrain was "
                                "built without MPI (install libopenmpi-dev and reconfigure)");
        GT_TRY(gt_comm_mpi_world(NULL, NULL, &d->world, err));
        gt_comm_set_timeout(d->world, cfg->comm.init_timeout_seconds);
        d->rank = gt_comm_rank(d->world);
        d->size = gt_comm_size(d->world);
    } else if (gt_train_launched_by_env()) {
        /* torchrun-style: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; a mesh of TCP sockets */
        GT_TRY(gt_comm_tcp_world(cfg->comm.init_timeout_seconds, &d->world, err));
        d->rank = gt_comm_rank(d->world);
        d->size = gt_comm_size(d->world);
    }
    gt_status st = gt_train_layout_init(cfg, d->size, d->rank, &d->layout, err);
    if (st != GT_OK && !d->world && !gt_comm_mpi_available())
        return gt_error_wrap(err, "this graphtrain was built without MPI, so it runs one rank "
                                  "(install libopenmpi-dev and reconfigure for more)");
    if (st != GT_OK) return st;
    if (d->size > 1 && cfg->training.device == GT_CFG_DEVICE_CUDA && !gt_comm_nccl_available())
        return gt_error_set(err, GT_ERR_UNSUPPORTED,
                            "training.device = cuda with %d ranks needs NCCL, and this graphtrain "
                            "was built without it (install libnccl-dev and reconfigure)",
                            d->size);
    if (!gt_train_dist_multi(d)) return GT_OK;
    GT_TRY(gt_train_dist_dim_comms(d, err));
    return gt_train_dist_expert_comms(cfg, d, err);
}

gt_status gt_train_dist_dim_comms(gt_train_dist *d, gt_error *err)
{
    for (int k = 0; k < GT_MESH_NDIMS; k++) {
        int c[GT_MESH_NDIMS];
        memcpy(c, d->layout.coords, sizeof c);
        c[k] = 0;
        int color = gt_mesh_rank(&d->layout.mesh, c);
        GT_TRY(gt_comm_split(d->world, color, d->layout.coords[k], &d->dim_comm[k], err));
        /* messages name the mesh dim and which of its groups: "dp_shard/group 2" */
        snprintf(d->dim_comm[k]->name, sizeof d->dim_comm[k]->name, "%s/group %d",
                 gt_mesh_dim_name(k), color);
    }
    return GT_OK;
}

void gt_train_dist_set_timeout(gt_train_dist *d, double seconds)
{
    gt_comm_set_timeout(d->world, seconds);
    for (int k = 0; k < GT_MESH_MAX_DIMS; k++) {
        gt_comm_set_timeout(d->dim_comm[k], seconds);
        gt_comm_set_timeout(d->nccl[k], seconds);
    }
}

void gt_train_dist_free(gt_train_dist *d)
{
    for (int k = 0; k < GT_MESH_MAX_DIMS; k++)
        gt_comm_destroy(d->nccl[k]);
    for (int k = 0; k < GT_MESH_MAX_DIMS; k++)
        gt_comm_destroy(d->dim_comm[k]);
    gt_comm_destroy(d->world);
    memset(d, 0, sizeof *d);
}

/* ---------------------------------------------------------------- agreement */

/* The status word and message that travel: [code, message bytes]. */
typedef struct {
    int64_t code;
    char msg[GT_ERROR_MSG_MAX];
} shared_status;

gt_status gt_train_share_status(gt_train_dist *d, int root, gt_status st, gt_error *err)
{
    if (!gt_train_dist_multi(d)) return st;
    /* an error every rank already agreed on (gt_train_check_config's) is kept as each rank has it,
     * not prefixed a second time */
    bool agreed_before = d->error_agreed && st != GT_OK;
    shared_status s;
    memset(&s, 0, sizeof s);
    if (d->rank == root) {
        s.code = st;
        if (st != GT_OK) snprintf(s.msg, sizeof s.msg, "%s", err->msg);
    }
    int64_t nbytes = (int64_t)sizeof s;
    gt_tensor buf;
    gt_tensor_wrap(&buf, GT_BOOL, 1, &nbytes, &s);
    gt_error cerr = {0};
    if (gt_comm_broadcast(d->world, &buf, root, &cerr) != GT_OK) {
        *err = cerr;
        return cerr.code;
    }
    if (s.code == GT_OK) return GT_OK;
    d->error_agreed = true;
    s.msg[sizeof s.msg - 1] = 0;
    if (d->rank == root || agreed_before) return (gt_status)s.code; /* err already holds it */
    gt_error_clear(err); /* every rank reports the root's error, not its own as well */
    return gt_error_set(err, (gt_status)s.code, "rank %d: %s", root, s.msg);
}

gt_status gt_train_agree(gt_train_dist *d, gt_status st, gt_error *err)
{
    if (!gt_train_dist_multi(d)) return st;
    int64_t one = 1, n = d->size, mine = st;
    gt_tensor in, all;
    gt_tensor_wrap(&in, GT_I64, 1, &one, &mine);
    gt_error cerr = {0};
    if (gt_tensor_alloc(&all, GT_I64, 1, &n, &cerr) != GT_OK ||
        gt_comm_all_gather(d->world, &in, &all, &cerr) != GT_OK) {
        gt_tensor_free(&all);
        *err = cerr;
        return cerr.code;
    }
    int first = -1;
    for (int r = 0; r < d->size && first < 0; r++)
        if (((int64_t *)all.data)[r] != GT_OK) first = r;
    gt_tensor_free(&all);
    if (first < 0) return GT_OK;
    return gt_train_share_status(d, first, st, err);
}

gt_status gt_train_share_i64(gt_train_dist *d, int64_t *value, gt_error *err)
{
    if (!gt_train_dist_multi(d)) return GT_OK;
    int64_t one = 1;
    gt_tensor buf;
    gt_tensor_wrap(&buf, GT_I64, 1, &one, value);
    return gt_comm_broadcast(d->world, &buf, 0, err);
}

gt_status gt_train_share_slots(gt_train_dist *d, uint64_t *v, int64_t n, gt_error *err)
{
    if (!gt_train_dist_multi(d)) return GT_OK;
    gt_tensor mine, sum;
    gt_tensor_wrap(&mine, GT_I64, 1, &n, v); /* I64 for the sum; the values are u64s */
    GT_TRY(gt_tensor_alloc(&sum, GT_I64, 1, &n, err));
    gt_status st = gt_comm_all_reduce(d->world, &mine, &sum, err);
    if (st == GT_OK) memcpy(v, sum.data, gt_tensor_nbytes(&sum));
    gt_tensor_free(&sum);
    return st;
}

/* ---------------------------------------------------------------- config check */

/* Options that may differ between ranks without changing what they compute: how each rank was
 * given its config and how many threads it uses. */
static bool option_is_per_rank(const gt_cfg_option *o)
{
    static const char *const names[] = {"job.config_file", "job.print_config", "job.description",
                                        "training.cpu_threads"};
    char full[128];
    snprintf(full, sizeof full, "%s.%s", o->section, o->key);
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++)
        if (!strcmp(full, names[k])) return true;
    return false;
}

/* The hash of one option's resolved value (its TOML text, and whether an optional one is set). */
static uint64_t option_hash(const gt_config *cfg, const gt_cfg_option *o)
{
    char text[4096];
    gt_config_format_value(cfg, o, text, sizeof text);
    bool set = !o->has_offset || *(const bool *)((const char *)cfg + o->has_offset);
    return gt_hash64(text, strlen(text), set ? 1 : 2);
}

gt_status gt_train_check_config(gt_train_dist *d, const gt_config *cfg, gt_error *err)
{
    if (!gt_train_dist_multi(d)) return GT_OK;
    int n = 0;
    const gt_cfg_option *opts = gt_config_options(&n);
    /* rank 0's per-option hashes go to every rank, which compares them with its own: one
     * broadcast, and the first differing option can be named */
    int64_t len = n;
    uint64_t *ref = gt_xcalloc((size_t)n, sizeof *ref);
    for (int k = 0; k < n; k++)
        ref[k] = option_is_per_rank(&opts[k]) ? 0 : option_hash(cfg, &opts[k]);
    gt_tensor buf;
    gt_tensor_wrap(&buf, GT_I64, 1, &len, ref);
    gt_status st = gt_comm_broadcast(d->world, &buf, 0, err);
    for (int k = 0; st == GT_OK && k < n; k++) {
        if (option_is_per_rank(&opts[k]) || ref[k] == option_hash(cfg, &opts[k])) continue;
        char text[200];
        gt_config_format_value(cfg, &opts[k], text, sizeof text);
        st = gt_error_set(err, GT_ERR_INVALID,
                          "the ranks were launched with different options: --%s.%s is %s on rank "
                          "%d and another value on rank 0 (every rank must train the same "
                          "config; compare the ranks' command lines and config files)",
                          opts[k].section, opts[k].key, text, d->rank);
    }
    free(ref);
    return gt_train_agree(d, st, err);
}

/* ---------------------------------------------------------------- schedule check */

gt_status gt_train_check_schedule(gt_train_dist *d, const gt_config *cfg, gt_executor *ex,
                                  gt_error *err)
{
    if (!gt_train_dist_multi(d)) return GT_OK;
    gt_comm_sched_entry *entries = NULL;
    int64_t count = 0;
    gt_status st = GT_OK;
    bool drop = cfg->debug.test_drop_collective_rank == d->rank;
    if (drop && (gt_executor_caps(ex) & GT_EXEC_CAP_DROP_COLLECTIVE)) {
        gt_log(GT_LOG_WARN,
               "debug.test_drop_collective_rank: rank %d drops its first "
               "collective (a test of the schedule check)",
               d->rank);
        st = gt_executor_drop_collective(ex, 0, err);
    } else if (drop) {
        st = gt_error_set(err, GT_ERR_INVALID,
                          "debug.test_drop_collective_rank needs the CPU program (compile.enable "
                          "= true, device cpu): it drops a collective of the compiled program");
    }
    if (st == GT_OK) {
        /* symmetric windows: every rank's buffers must lie at the same offsets */
        bool place = d->nccl_buffers_known && d->nccl_buffers == GT_NCCL_BUFFERS_SYMMETRIC;
        int32_t n = 0;
        st = gt_executor_collectives(ex, place, NULL, 0, &n, err);
        entries = gt_xcalloc((size_t)n + 1, sizeof *entries);
        if (st == GT_OK) st = gt_executor_collectives(ex, place, entries, n, &n, err);
        count = n;
    }
    /* a local failure above must not leave the others waiting in the check's exchange */
    st = gt_train_agree(d, st, err);
    if (st == GT_OK) {
        st = gt_comm_check_schedule(d->world, entries, count, err);
        /* a mismatch is found by every rank alike (a failed exchange is this rank's alone) */
        if (st == GT_ERR_INVALID) d->error_agreed = true;
    }
    free(entries);
    if (st == GT_OK && d->rank == 0)
        gt_log(GT_LOG_INFO,
               "collective schedule: %lld collectives per step, the same on all %d "
               "ranks",
               (long long)count, d->size);
    return st;
}

/* ---------------------------------------------------------------- memory report */

/* The first of the launchers' variables (four names, in order) that is set and at least `least`,
 * as an int; `otherwise` when none is. */
static int launcher_env(const char *const vars[4], int least, int otherwise)
{
    for (int k = 0; k < 4; k++) {
        const char *v = getenv(vars[k]);
        if (v && *v && atoi(v) >= least) return atoi(v);
    }
    return otherwise;
}

int gt_train_device_for_rank(const gt_train_dist *d, int n_devices)
{
    static const char *const vars[4] = {"OMPI_COMM_WORLD_LOCAL_RANK", "LOCAL_RANK",
                                        "MPI_LOCALRANKID", "SLURM_LOCALID"};
    int local = launcher_env(vars, INT_MIN, d->rank);
    return n_devices > 0 ? local % n_devices : 0;
}

int gt_train_cpu_threads(const gt_config *cfg, const gt_train_dist *d)
{
    if (cfg->training.cpu_threads > 0) return (int)cfg->training.cpu_threads;
    static const char *const vars[4] = {"OMPI_COMM_WORLD_LOCAL_SIZE", "LOCAL_WORLD_SIZE",
                                        "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"};
    /* unknown: every rank of the world on this host */
    int local = launcher_env(vars, 1, gt_train_dist_multi(d) ? d->size : 1);
    int n = gt_cpu_count() / local;
    return n > 0 ? n : 1;
}

/* --comm.nccl_buffers other than auto passes straight through as a gt_nccl_buffers */
_Static_assert((int)GT_CFG_NCCL_BUFFERS_PLAIN == (int)GT_NCCL_BUFFERS_PLAIN &&
                   (int)GT_CFG_NCCL_BUFFERS_REGISTRABLE == (int)GT_NCCL_BUFFERS_REGISTRABLE &&
                   (int)GT_CFG_NCCL_BUFFERS_SYMMETRIC == (int)GT_NCCL_BUFFERS_SYMMETRIC,
               "gt_cfg_nccl_buffers follows gt_nccl_buffers");

/* A number naming this host: the kernel's boot id (shared by the containers of a host, another
 * one on another host) and the host name, hashed. */
static uint64_t host_id(void)
{
    char buf[384] = {0};
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    size_t n = f ? fread(buf, 1, 64, f) : 0;
    if (f) fclose(f);
    gethostname(buf + n, sizeof buf - n - 1);
    buf[sizeof buf - 1] = 0;
    return (uint64_t)XXH64(buf, strlen(buf), 0);
}

gt_status gt_train_dist_nccl_buffers(gt_train_dist *d, const gt_config *cfg, gt_error *err)
{
    if (d->nccl_buffers_known) return GT_OK;
    if (cfg->comm.nccl_buffers != GT_CFG_NCCL_BUFFERS_AUTO) {
        d->nccl_buffers = (gt_nccl_buffers)cfg->comm.nccl_buffers;
        GT_TRY(gt_comm_nccl_check_buffers(d->nccl_buffers, err));
        d->nccl_buffers_known = true;
        return GT_OK;
    }
    gt_error why = {0};
    int64_t mine[2] = {gt_comm_nccl_check_buffers(GT_NCCL_BUFFERS_SYMMETRIC, &why) == GT_OK,
                       (int64_t)host_id()};
    int64_t two = 2, n = 2 * (int64_t)d->size;
    int64_t *all = gt_xcalloc((size_t)n, sizeof *all);
    gt_tensor in, out;
    gt_tensor_wrap(&in, GT_I64, 1, &two, mine);
    gt_tensor_wrap(&out, GT_I64, 1, &n, all);
    gt_status st = gt_comm_all_gather(d->world, &in, &out, err);
    if (st == GT_OK) {
        int unsupported = -1, hosts = 0;
        for (int r = 0; r < d->size; r++) {
            if (!all[2 * r] && unsupported < 0) unsupported = r;
            bool seen = false;
            for (int q = 0; q < r; q++)
                seen = seen || all[2 * q + 1] == all[2 * r + 1];
            hosts += !seen;
        }
        d->nccl_buffers =
            unsupported < 0 && hosts == 1 ? GT_NCCL_BUFFERS_SYMMETRIC : GT_NCCL_BUFFERS_PLAIN;
        d->nccl_buffers_known = true;
        if (d->rank == 0 && unsupported >= 0)
            gt_log(GT_LOG_INFO, "NCCL buffers: plain (auto: rank %d has no symmetric buffers%s%s)",
                   unsupported, unsupported == 0 ? ": " : "", unsupported == 0 ? why.msg : "");
        else if (d->rank == 0)
            gt_log(GT_LOG_INFO, "NCCL buffers: %s (auto: the %d ranks are on %d host%s)",
                   hosts == 1 ? "symmetric" : "plain", d->size, hosts, hosts == 1 ? "" : "s");
    }
    free(all);
    return st;
}

gt_status gt_train_dist_nccl(gt_train_dist *d, const gt_config *cfg, int device,
                             void *compute_stream, gt_error *err)
{
    GT_TRY(gt_train_dist_nccl_buffers(d, cfg, err));
    for (int k = 0; k < GT_MESH_MAX_DIMS; k++) {
        /* the mesh dims, and expert parallel's efsdp and ep groups where they exist */
        if (d->nccl[k] || !d->dim_comm[k] || gt_comm_size(d->dim_comm[k]) == 1) continue;
        /* set-up bounded by the same timeout as every later host call (a rank that never joins
         * is an error after comm.init_timeout_seconds, not NCCL's default) */
        GT_TRY(gt_comm_nccl_create(d->dim_comm[k], device, compute_stream,
                                   cfg->comm.init_timeout_seconds, d->nccl_buffers, &d->nccl[k],
                                   err));
        /* messages name it like its MPI twin: "dp_shard/group 2 (nccl)" */
        char name[sizeof d->nccl[k]->name];
        snprintf(name, sizeof name, "%.50s (nccl)", d->dim_comm[k]->name);
        memcpy(d->nccl[k]->name, name, sizeof name);
    }
    return GT_OK;
}

gt_status gt_train_report_memory(gt_train_dist *d, const int64_t bytes[4], gt_error *err)
{
    int64_t mine[4] = {bytes[0], bytes[1], bytes[2], bytes[3]};
    int64_t four = 4, n = 4 * (int64_t)d->size;
    int64_t *all = gt_xcalloc((size_t)n, sizeof *all);
    gt_status st = GT_OK;
    if (gt_train_dist_multi(d)) {
        gt_tensor in, out;
        gt_tensor_wrap(&in, GT_I64, 1, &four, mine);
        gt_tensor_wrap(&out, GT_I64, 1, &n, all);
        st = gt_comm_all_gather(d->world, &in, &out, err);
    } else {
        memcpy(all, mine, sizeof mine);
    }
    if (st == GT_OK && d->rank == 0) {
        bool same = true;
        for (int r = 1; r < d->size; r++)
            same = same && !memcmp(all, all + 4 * r, sizeof mine);
        for (int r = 0; r < (same ? 1 : d->size); r++) {
            const int64_t *f = all + 4 * r;
            char who[48];
            if (d->size == 1)
                snprintf(who, sizeof who, "of the step program");
            else if (same)
                snprintf(who, sizeof who, "per rank (all %d)", d->size);
            else
                snprintf(who, sizeof who, "rank %d", r);
            gt_log(GT_LOG_INFO,
                   "memory %s: planned %lld bytes (persistent %lld + step %lld), allocated %lld "
                   "bytes (persistent %lld + step %lld)",
                   who, (long long)(f[0] + f[1]), (long long)f[0], (long long)f[1],
                   (long long)(f[2] + f[3]), (long long)f[2], (long long)f[3]);
        }
    }
    free(all);
    return st;
}

/* ---------------------------------------------------------------- sharded state */

bool gt_train_named(const char *name, const char *prefix, const char *fqn)
{
    size_t n = strlen(prefix);
    return !strncmp(name, prefix, n) && !strcmp(name + n, fqn);
}

/* Evaluates a value's type under the binding (the local shape of a graph input). */
static gt_status value_shape(const gt_graph *g, gt_value_id v, const gt_sym_binding *b,
                             int64_t *shape, gt_error *err)
{
    const gt_type *ty = &g->values[v].type;
    for (int d = 0; d < ty->ndim; d++)
        GT_TRY(gt_sym_eval(g->sym, ty->dims[d], b, &shape[d], err));
    return GT_OK;
}

/* The block of each parameter, moment and of the batch that this rank holds: the box of its graph
 * input's placement within the global shape (the whole tensor with one rank). The local type the
 * SPMD graph gives the input must be that box's size. */
static gt_status state_boxes(gt_trainer *t, gt_error *err)
{
    int n = t->n_params;
    t->box = gt_xcalloc((size_t)t->n_ckpt, sizeof *t->box);
    for (int k = 0; k < 3 * n; k++) {
        const gt_param_spec *ps = &t->model.params[k % n];
        gt_shard_box_whole(&t->box[k], ps->ndim, ps->shape);
    }
    for (int b = 0; b < t->n_bufs; b++) /* replicated (model_buffers checked) */
        gt_shard_box_whole(&t->box[3 * n + b], t->bufs[b].ndim, t->bufs[b].shape);
    int64_t bs[2] = {t->global_batch, t->cfg->training.seq_len};
    gt_shard_box_whole(&t->batch_box, 2, bs);
    const gt_train_layout *lay = &t->dist.layout;
    if (gt_mesh_world_size(&lay->mesh) == 1) return GT_OK;
    const gt_graph *g = t->whole.g;
    gt_shard_box labels_box = t->batch_box;
    for (int i = 0; i < g->n_inputs; i++) {
        const gt_io *in = &g->inputs[i];
        const char *name = gt_graph_str(g, in->fqn);
        gt_shard_box *b = NULL;
        for (int k = 0; k < n && !b; k++) {
            const char *fqn = t->model.params[k].fqn;
            if (in->kind == GT_IN_PARAM && !strcmp(name, fqn)) b = &t->box[k];
            if (in->kind == GT_IN_OPT_STATE && gt_train_named(name, GT_OPTIM_EXP_AVG_PREFIX, fqn))
                b = &t->box[n + k];
            if (in->kind == GT_IN_OPT_STATE &&
                gt_train_named(name, GT_OPTIM_EXP_AVG_SQ_PREFIX, fqn))
                b = &t->box[2 * n + k];
        }
        if (in->kind == GT_IN_INPUT && !strcmp(name, "tokens")) b = &t->batch_box;
        if (in->kind == GT_IN_INPUT && !strcmp(name, "labels")) b = &labels_box;
        if (in->kind == GT_IN_INPUT && !strcmp(name, "positions")) b = &labels_box; /* as tokens */
        if (!b) continue; /* optim.scalars: replicated; the gradient sums: their parameter's box */
        int64_t global[GT_MAX_DIMS], local[GT_MAX_DIMS];
        int ndim = b->ndim;
        memcpy(global, b->global, sizeof global);
        GT_TRY(gt_shard_box_init(b, &lay->mesh, g->values[in->value].place, ndim, global,
                                 lay->coords, err));
        GT_TRY(value_shape(g, in->value, &t->binding, local, err));
        if (g->values[in->value].type.ndim != ndim ||
            memcmp(local, b->local, sizeof(int64_t) * (size_t)ndim) != 0) {
            char place[128];
            gt_value_format_placement(g, in->value, place, sizeof place);
            return gt_error_set(err, GT_ERR_INTERNAL,
                                "trainer: graph input %s %s: local shape [%lld, ...] (%d dims) but "
                                "the block its placement gives this rank is [%lld, ...] (%d dims)",
                                name, place, (long long)local[0], g->values[in->value].type.ndim,
                                (long long)b->local[0], ndim);
        }
    }
    if (memcmp(&labels_box, &t->batch_box, sizeof labels_box) != 0)
        return gt_error_set(err, GT_ERR_INTERNAL,
                            "trainer: graph inputs tokens and labels are placed differently");
    return GT_OK;
}

/* The model's buffers (gt_train_is_model_buffer inputs of the step graph, none without one): a
 * whole host tensor each, zeros (torchtitan starts expert_bias at zero), named by its fqn in
 * ckpt_names[3 n_params + b]. Each rank holds all of it, so it must be replicated. */
static gt_status model_buffers(gt_trainer *t, gt_error *err)
{
    const gt_graph *g = t->whole.g;
    int n = t->n_params, nb = 0;
    for (int i = 0; g && i < g->n_inputs; i++)
        nb += gt_train_is_model_buffer(&g->inputs[i]);
    t->n_bufs = nb;
    t->n_ckpt = 3 * n + nb;
    t->bufs = gt_xcalloc((size_t)nb + 1, sizeof *t->bufs);
    t->ckpt_names = gt_xcalloc((size_t)t->n_ckpt, sizeof *t->ckpt_names);
    t->ckpt_tensors = gt_xcalloc((size_t)t->n_ckpt, sizeof *t->ckpt_tensors);
    bool multi = gt_mesh_world_size(&t->dist.layout.mesh) > 1;
    for (int i = 0, b = 0; g && i < g->n_inputs; i++) {
        const gt_io *in = &g->inputs[i];
        if (!gt_train_is_model_buffer(in)) continue;
        const char *name = gt_graph_str(g, in->fqn);
        const gt_value *v = &g->values[in->value];
        for (int md = 0; multi && md < GT_MESH_MAX_DIMS; md++)
            if (v->place[md].kind != GT_PLACE_REPLICATE)
                return gt_error_set(err, GT_ERR_UNSUPPORTED,
                                    "trainer: model buffer %s is not replicated on mesh dim %d; "
                                    "the trainer keeps buffers whole on every rank",
                                    name, md);
        int64_t shape[GT_MAX_DIMS];
        GT_TRY(value_shape(g, in->value, &t->binding, shape, err));
        t->ckpt_names[3 * n + b] = gt_xstrdup(name);
        GT_TRY(gt_tensor_alloc(&t->bufs[b], v->type.dtype, v->type.ndim, shape, err));
        memset(t->bufs[b].data, 0, gt_tensor_nbytes(&t->bufs[b]));
        b++;
    }
    return GT_OK;
}

gt_status gt_trainer_alloc_state(gt_trainer *t, gt_error *err)
{
    int n = t->n_params;
    GT_TRY(model_buffers(t, err));
    t->params = gt_xcalloc((size_t)n, sizeof *t->params);
    t->exp_avg = gt_xcalloc((size_t)n, sizeof *t->exp_avg);
    t->exp_avg_sq = gt_xcalloc((size_t)n, sizeof *t->exp_avg_sq);
    if (t->accum > 1) t->grads = gt_xcalloc((size_t)n, sizeof *t->grads);
    GT_TRY(state_boxes(t, err));
    uint64_t seed = (uint64_t)t->cfg->debug.seed;
    bool draw = t->resume_step == GT_CHECKPOINT_NONE; /* a resume loads every parameter */
    t->moments_zero = draw;                           /* and the moments */
    /* a fresh GPU run draws its parameters on the device, in the first step; a run that starts
     * from a Hugging Face folder reads them instead (gt_trainer_load_hf) */
    if (gt_trainer_loads_hf(t)) draw = false;
    t->params_pending = draw && t->cuda && !t->pp; /* a pipeline draws on the host */
    for (int k = 0; k < n; k++) {
        const gt_param_spec *ps = &t->model.params[k];
        const gt_shard_box *pb = &t->box[k], *mb = &t->box[n + k], *vb = &t->box[2 * n + k];
        /* a pipeline rank draws and loads only its stages' state (trainer_pp_state.c) */
        if (t->pp && gt_trainer_pp_elsewhere(t, k)) continue;
        GT_TRY(gt_tensor_alloc(&t->params[k], ps->dtype, pb->ndim, pb->local, err));
        /* this rank's block, from the global element indices */
        if (draw && !t->params_pending) gt_shard_init_param(pb, ps, seed, &t->params[k]);
        GT_TRY(gt_tensor_alloc(&t->exp_avg[k], GT_F32, mb->ndim, mb->local, err));
        GT_TRY(gt_tensor_alloc(&t->exp_avg_sq[k], GT_F32, vb->ndim, vb->local, err));
        /* the running gradient sum: this rank's block, where the parameter sits */
        if (t->grads) GT_TRY(gt_tensor_alloc(&t->grads[k], GT_F32, pb->ndim, pb->local, err));
    }
    int64_t three = 3, b = t->global_batch, s = t->cfg->training.seq_len;
    GT_TRY(gt_tensor_alloc(&t->tokens, GT_I64, 2, t->batch_box.size, err));
    GT_TRY(gt_tensor_alloc(&t->labels, GT_I64, 2, t->batch_box.size, err));
    GT_TRY(gt_tensor_alloc(&t->positions, GT_I64, 2, t->batch_box.size, err));
    GT_TRY(gt_tensor_alloc(&t->scalars, GT_F32, 1, &three, err));
    t->window = gt_xcalloc((size_t)(b * (s + 1)), sizeof *t->window);
    if (!gt_shard_box_is_whole(&t->batch_box)) {
        t->batch_tokens = gt_xcalloc((size_t)(b * s), sizeof *t->batch_tokens);
        t->batch_labels = gt_xcalloc((size_t)(b * s), sizeof *t->batch_labels);
    }

    /* checkpoint names: params, then both moments (the buffers' are set) */
    for (int k = 0; k < n; k++) {
        const char *fqn = t->model.params[k].fqn;
        size_t len = strlen(fqn) + 32;
        t->ckpt_names[k] = gt_xstrdup(fqn);
        t->ckpt_names[n + k] = gt_xmalloc(len);
        snprintf(t->ckpt_names[n + k], len, GT_OPTIM_EXP_AVG_PREFIX "%s", fqn);
        t->ckpt_names[2 * n + k] = gt_xmalloc(len);
        snprintf(t->ckpt_names[2 * n + k], len, GT_OPTIM_EXP_AVG_SQ_PREFIX "%s", fqn);
    }
    return GT_OK;
}

void gt_trainer_refresh_ckpt_tensors(gt_trainer *t)
{
    int n = t->n_params;
    for (int k = 0; k < n; k++) {
        t->ckpt_tensors[k] = &t->params[k];
        t->ckpt_tensors[n + k] = &t->exp_avg[k];
        t->ckpt_tensors[2 * n + k] = &t->exp_avg_sq[k];
    }
    for (int b = 0; b < t->n_bufs; b++)
        t->ckpt_tensors[3 * n + b] = &t->bufs[b];
}

/* ---------------------------------------------------------------- fault injection */

int gt_train_kill_signal(const gt_train_dist *d, const gt_config *cfg, int64_t step)
{
    const char *spec = cfg->debug.test_kill_rank_at_step;
    long long r = -1, s = 0;
    int used = 0;
    if (!spec[0] || sscanf(spec, "%lld:%lld%n", &r, &s, &used) != 2) return 0;
    if (r != d->rank || s != step) return 0;
    return !strcmp(spec + used, ":stop") ? SIGSTOP : SIGKILL;
}
