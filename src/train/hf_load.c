/* hf_load.c — Hugging Face folders in and out of a run (torchtitan's checkpoint options):
 *   --checkpoint.initial_load_path DIR --checkpoint.initial_load_in_hf: a run with no checkpoint
 *     to resume takes its parameters from DIR instead of drawing them;
 *   --checkpoint.last_save_in_hf: the last checkpoint is also written as CKPT/step-N-hf.
 *
 * Reading. DIR/config.json goes to the model's adapter (gt_model_hf_import), which refuses another
 * size naming the key. The weights are DIR/model.safetensors, or the shards that
 * DIR/model.safetensors.index.json's weight_map names. Every parameter is looked up under its
 * hf_name and checked (present, float32 or bfloat16, the parameter's whole shape) before any byte
 * is read, so a folder that does not fit is refused naming the tensor and nothing is loaded. Then
 * each rank reads only its block of each tensor (the runs of its box, gt_shard_for_each_run), from
 * the files opened lazily, bf16 widened to f32 exactly: any layout holds the one-rank bits. A
 * hf_name with '*' (deepseek_v3's stacked routed experts) names one tensor per index of the
 * parameter's dim 0, '*' replaced by the index; the model's buffers that have a hf_name (its
 * expert biases) are read whole, and go to the export too.
 *
 * Writing. The parameters are gathered whole on rank 0 one at a time (gt_shard_whole), which
 * writes the folder through the model's adapter (gt_model_export_hf, float32). */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "graphtrain/gt_model.h"
#include "graphtrain/gt_safetensors.h"
#include "train_internal.h"

#define HF_NAME_MAX 256

/* The weight files of a folder and which one holds each tensor. */
typedef struct {
    char **files; /* names inside the folder */
    gt_safetensors *st;
    bool *open;
    int n_files;
    json_t *weight_map; /* the index's, or NULL: everything is in files[0] */
} hf_folder;

static void folder_free(hf_folder *f)
{
    for (int k = 0; k < f->n_files; k++) {
        if (f->open[k]) gt_safetensors_close(&f->st[k]);
        free(f->files[k]);
    }
    free(f->files);
    free(f->st);
    free(f->open);
    if (f->weight_map) json_decref(f->weight_map);
    memset(f, 0, sizeof *f);
}

static int file_index(hf_folder *f, const char *name)
{
    for (int k = 0; k < f->n_files; k++)
        if (!strcmp(f->files[k], name)) return k;
    f->files = gt_xrealloc(f->files, (size_t)(f->n_files + 1) * sizeof *f->files);
    f->files[f->n_files] = gt_xstrdup(name);
    return f->n_files++;
}

/* The files: the index's (every name it maps to) or model.safetensors alone. */
static gt_status folder_open(const char *dir, hf_folder *f, gt_error *err)
{
    memset(f, 0, sizeof *f);
    char *index = gt_path_join(dir, "model.safetensors.index.json");
    struct stat sb;
    gt_status st = GT_OK;
    if (stat(index, &sb) == 0) {
        json_error_t je;
        json_t *root = json_load_file(index, 0, &je);
        json_t *map = root ? json_object_get(root, "weight_map") : NULL;
        if (!root)
            st = gt_error_set(err, GT_ERR_FORMAT, "%s:%d:%d: %s", index, je.line, je.column,
                              je.text);
        else if (!json_is_object(map))
            st = gt_error_set(err, GT_ERR_FORMAT, "%s: no \"weight_map\" object", index);
        const char *key;
        json_t *v;
        if (st == GT_OK) {
            json_object_foreach(map, key, v)
            {
                const char *file = json_string_value(v);
                if (!file || strchr(file, '/')) {
                    st = gt_error_set(err, GT_ERR_FORMAT,
                                      "%s: weight_map[\"%s\"]: expected a file name of the folder",
                                      index, key);
                    break;
                }
                file_index(f, file);
            }
        }
        if (st == GT_OK) f->weight_map = json_incref(map);
        if (root) json_decref(root);
    } else {
        file_index(f, "model.safetensors");
    }
    free(index);
    f->st = gt_xcalloc((size_t)(f->n_files ? f->n_files : 1), sizeof *f->st);
    f->open = gt_xcalloc((size_t)(f->n_files ? f->n_files : 1), sizeof *f->open);
    for (int k = 0; k < f->n_files && st == GT_OK; k++) {
        char *path = gt_path_join(dir, f->files[k]);
        st = gt_safetensors_open_lazy(path, &f->st[k], err);
        f->open[k] = st == GT_OK;
        free(path);
    }
    return st;
}

/* The entry of tensor hf (the parameter fqn's) and its file, checked against the parameter. */
static gt_status find_tensor(hf_folder *f, const char *dir, const char *hf, const char *fqn,
                             const gt_shard_box *b, const gt_safetensors **st,
                             const gt_st_entry **e, gt_error *err)
{
    int k = 0;
    if (f->weight_map) {
        const char *file = json_string_value(json_object_get(f->weight_map, hf));
        if (!file)
            return gt_error_set(err, GT_ERR_INVALID,
                                "%s: tensor %s (parameter %s) is not in "
                                "model.safetensors.index.json",
                                dir, hf, fqn);
        k = file_index(f, file); /* listed at open: an index below n_files */
    }
    *st = &f->st[k];
    *e = gt_safetensors_find(*st, hf);
    if (!*e)
        return gt_error_set(err, GT_ERR_INVALID, "%s: tensor %s (parameter %s) is missing",
                            (*st)->path, hf, fqn);
    const gt_st_entry *x = *e;
    if (x->dtype != GT_F32 && x->dtype != GT_BF16)
        return gt_error_set(err, GT_ERR_UNSUPPORTED,
                            "%s: tensor %s is %s; float32 and bfloat16 are read", (*st)->path, hf,
                            gt_dtype_name(x->dtype));
    bool same = x->ndim == b->ndim;
    for (int d = 0; same && d < b->ndim; d++)
        same = x->shape[d] == b->global[d];
    if (!same) {
        char want[96] = "", got[96] = "";
        for (int d = 0; d < b->ndim; d++)
            snprintf(want + strlen(want), sizeof want - strlen(want), "%s%lld", d ? ", " : "",
                     (long long)b->global[d]);
        for (int d = 0; d < x->ndim; d++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", d ? ", " : "",
                     (long long)x->shape[d]);
        return gt_error_set(err, GT_ERR_INVALID,
                            "%s: tensor %s has shape [%s], parameter %s has [%s]", (*st)->path, hf,
                            got, fqn, want);
    }
    return GT_OK;
}

/* A parameter's tensors: one, or (a hf_name with '*', the stacked experts) one per index of its
 * dim 0, each holding the rest of its dims. */
typedef struct {
    int n;                      /* 1, or the parameter's dim 0 */
    int64_t slice;              /* elements per tensor */
    const gt_safetensors **sts; /* [n] */
    const gt_st_entry **es;     /* [n] */
} hf_source;

static void source_free(hf_source *s)
{
    free(s->sts);
    free(s->es);
    memset(s, 0, sizeof *s);
}

/* The tensors of parameter fqn (hf: its hf_name), each checked against its part of box b. */
static gt_status find_source(hf_folder *f, const char *dir, const char *hf, const char *fqn,
                             const gt_shard_box *b, hf_source *s, gt_error *err)
{
    const char *star = strchr(hf, '*');
    s->n = star && b->ndim > 1 ? (int)b->global[0] : 1;
    s->sts = gt_xcalloc((size_t)s->n, sizeof *s->sts);
    s->es = gt_xcalloc((size_t)s->n, sizeof *s->es);
    if (s->n == 1 && !star) {
        s->slice = gt_shape_numel(b->ndim, b->global);
        return find_tensor(f, dir, hf, fqn, b, &s->sts[0], &s->es[0], err);
    }
    if (!star || b->ndim < 2)
        return gt_error_set(err, GT_ERR_INTERNAL, "parameter %s: hf_name %s", fqn, hf);
    gt_shard_box part = *b; /* the dims of one tensor: dim 0 dropped */
    part.ndim = b->ndim - 1;
    for (int d = 0; d < part.ndim; d++)
        part.global[d] = b->global[d + 1];
    s->slice = gt_shape_numel(part.ndim, part.global);
    for (int i = 0; i < s->n; i++) {
        char name[HF_NAME_MAX];
        snprintf(name, sizeof name, "%.*s%d%s", (int)(star - hf), hf, i, star + 1);
        GT_TRY(find_tensor(f, dir, name, fqn, &part, &s->sts[i], &s->es[i], err));
    }
    return GT_OK;
}

typedef struct {
    const hf_source *src;
    float *dst;
    uint16_t *scratch;
    size_t scratch_n;
    gt_status status;
    gt_error *err;
} read_ctx;

/* Elements [g, g + count) of tensor (st, e) to dst. */
static void read_part(read_ctx *c, const gt_safetensors *st, const gt_st_entry *e, int64_t g,
                      float *dst, int64_t count)
{
    size_t es = gt_dtype_size(e->dtype), n = (size_t)count;
    if (e->dtype == GT_F32) {
        c->status = gt_safetensors_read_range(st, e, (uint64_t)g * es, dst, n * es, c->err);
        return;
    }
    if (c->scratch_n < n) {
        free(c->scratch);
        c->scratch = gt_xmalloc(n * sizeof *c->scratch);
        c->scratch_n = n;
    }
    c->status = gt_safetensors_read_range(st, e, (uint64_t)g * es, c->scratch, n * es, c->err);
    if (c->status == GT_OK) gt_bf16_to_f32_n(c->scratch, dst, count);
}

/* One run of this rank's block: elements [g, g + count) of the parameter to dst[l ...], split
 * where it crosses from one of its tensors to the next. */
static void read_run(int64_t g, int64_t l, int64_t count, void *user)
{
    read_ctx *c = user;
    const hf_source *s = c->src;
    while (c->status == GT_OK && count > 0) {
        int64_t i = g / s->slice, off = g % s->slice;
        int64_t n = count < s->slice - off ? count : s->slice - off;
        read_part(c, s->sts[i], s->es[i], off, c->dst + l, n);
        g += n, l += n, count -= n;
    }
}

gt_status gt_trainer_load_hf(gt_trainer *t, gt_error *err)
{
    const char *dir = t->cfg->checkpoint.initial_load_path;
    char *config_path = gt_path_join(dir, "config.json");
    char *text = NULL;
    size_t len = 0;
    gt_status st = gt_train_read_file(config_path, &text, &len, err);
    if (st == GT_OK) st = gt_model_hf_import(&t->model_cfg, text, len, config_path, err);
    free(text);
    free(config_path);
    if (st != GT_OK) return st;
    if (!t->model_cfg.family->hf_name)
        return gt_error_set(err, GT_ERR_INVALID, "model %s has no Hugging Face names",
                            t->model_cfg.family->name);
    hf_folder f;
    st = folder_open(dir, &f, err);
    int n = t->n_params, nb = t->n_bufs;
    hf_source *src = gt_xcalloc((size_t)(n + nb + 1), sizeof *src);
    /* every tensor checked before any is read: nothing is loaded half */
    int bf16 = 0, n_bufs = 0;
    for (int k = 0; k < n && st == GT_OK; k++) {
        const char *fqn = t->model.params[k].fqn;
        char hf[HF_NAME_MAX];
        st = t->model_cfg.family->hf_name(fqn, hf, sizeof hf, err);
        if (st == GT_OK) st = find_source(&f, dir, hf, fqn, &t->box[k], &src[k], err);
        if (st == GT_OK && t->params[k].dtype != GT_F32)
            st = gt_error_set(err, GT_ERR_INTERNAL, "parameter %s is not float32", fqn);
        for (int i = 0; st == GT_OK && i < src[k].n; i++)
            bf16 += src[k].es[i]->dtype == GT_BF16;
    }
    /* the model's buffers that have a Hugging Face name (deepseek_v3's expert biases), whole;
     * the others (gradient-accumulation counts) keep their start */
    gt_shard_box *bbox = gt_xcalloc((size_t)(nb + 1), sizeof *bbox);
    for (int b = 0; b < nb && st == GT_OK; b++) {
        const char *name = t->ckpt_names[3 * n + b];
        char hf[HF_NAME_MAX];
        gt_error ignored = {0};
        if (t->model_cfg.family->hf_name(name, hf, sizeof hf, &ignored) != GT_OK ||
            t->bufs[b].dtype != GT_F32)
            continue;
        gt_shard_box_whole(&bbox[b], t->bufs[b].ndim, t->bufs[b].shape);
        st = find_source(&f, dir, hf, name, &bbox[b], &src[n + b], err);
        n_bufs += st == GT_OK;
    }
    read_ctx c = {.status = GT_OK, .err = err};
    for (int k = 0; k < n && st == GT_OK; k++) {
        if (!t->params[k].data) continue; /* another pipeline rank's stage (trainer_pp_state.c) */
        c.src = &src[k], c.dst = t->params[k].data;
        gt_shard_for_each_run(&t->box[k], read_run, &c);
        st = c.status;
    }
    for (int b = 0; b < nb && st == GT_OK; b++) {
        if (!src[n + b].n) continue;
        c.src = &src[n + b], c.dst = t->bufs[b].data;
        read_run(0, 0, gt_tensor_numel(&t->bufs[b]), &c);
        st = c.status;
    }
    free(c.scratch);
    if (st == GT_OK && t->dist.rank == 0)
        gt_log(GT_LOG_INFO,
               "checkpoint.initial_load_path: %d parameters from the Hugging Face folder %s (%d "
               "file(s), %d in bfloat16)%s",
               n, dir, f.n_files, bf16, n_bufs ? "; the model's buffers too" : "");
    for (int k = 0; k < n + nb; k++)
        source_free(&src[k]);
    free(src);
    free(bbox);
    folder_free(&f);
    return st;
}

gt_status gt_trainer_save_hf(gt_trainer *t, int64_t step, gt_error *err)
{
    int n = t->n_params;
    bool root = t->dist.rank == 0;
    gt_tensor *whole = root ? gt_xcalloc((size_t)n, sizeof *whole) : NULL;
    gt_shard_buffers buf = {0};
    gt_status st = GT_OK;
    for (int k = 0; k < n && st == GT_OK; k++) {
        const void *data = NULL;
        st = gt_shard_whole(t->dist.world, &t->dist.layout.mesh, &t->box[k], &t->params[k], 0, &buf,
                            &data, err);
        if (st == GT_OK && root) {
            st = gt_tensor_alloc(&whole[k], GT_F32, t->box[k].ndim, t->box[k].global, err);
            if (st == GT_OK) memcpy(whole[k].data, data, gt_tensor_nbytes(&whole[k]));
        }
    }
    gt_shard_buffers_free(&buf);
    char name[64];
    snprintf(name, sizeof name, "step-%lld-hf", (long long)step);
    char *dir = gt_path_join(t->ckpt_folder, name);
    if (st == GT_OK && root) {
        /* the model's buffers too (deepseek_v3's expert biases): every rank holds them whole */
        gt_export_hf_options o = {.dtype = GT_F32,
                                  .bos_token_id = -1,
                                  .eos_token_id = -1,
                                  .buffers = t->bufs,
                                  .buffer_names = (const char *const *)t->ckpt_names + 3 * n,
                                  .n_buffers = t->n_bufs};
        st = gt_model_export_hf(&t->model_cfg, &t->model, whole, dir, &o, err);
        if (st == GT_OK)
            gt_log(GT_LOG_INFO, "checkpoint.last_save_in_hf: step %lld written to %s",
                   (long long)step, dir);
    }
    for (int k = 0; root && k < n; k++)
        gt_tensor_free(&whole[k]);
    free(whole);
    free(dir);
    /* rank 0 may fail to write: every rank stops with its message */
    return gt_train_share_status(&t->dist, 0, st, err);
}
