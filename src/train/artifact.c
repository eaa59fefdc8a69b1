/* artifact.c — precompiled step artifacts (--compile.precompile_artifact_dir): the compiled
 * whole-step graph saved by one rank and loaded by every rank, instead of every rank running the
 * pass pipeline.
 *
 * DIR/step.graph (the whole step; with gradient accumulation DIR/micro_step.graph, the
 * micro-batch step, the optimizer graph being built by every rank) holds:
 *   graphtrain-artifact 2
 *   key BYTES XXH64                what it was compiled for (the key, BYTES long, follows)
 *   <key lines>                    "section.key = value" of every option the compiled graph
 *                                  depends on (debug.moe_force_load_balance among them), then
 *                                  the layout ("layout.world = 4", ..., "layout.efsdp = 1",
 *                                  "layout.ep = 2": the experts' view of the mesh)
 *   graph BYTES XXH64              the graph text (gt_graph_write) follows, BYTES long
 *   <graph text>
 * It is written to DIR/.NAME.tmp-PID, fsynced, renamed over DIR/NAME, and DIR is fsynced (the
 * checkpoint's file helpers): a reader sees a whole artifact or none. Loading checks the checksums
 * (a corrupt file is an error naming it), then compares the key with this run's line by line: an
 * artifact compiled for another model, layout or compile option is an error naming the first option
 * that differs, not a silently wrong step. The graph is rank-agnostic (rank coordinates stay
 * symbols), so one file serves every rank. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "checkpoint_internal.h"
#include "train_internal.h"

#ifndef GT_BUILD_ID /* set by CMakeLists.txt: the version and `git describe` at configure time */
#define GT_BUILD_ID "unknown"
#endif

#define ARTIFACT_VERSION 2 /* 2: the key header lost its line count */

/* Options that do not change the compiled step graph (run length, data, where outputs go). */
static bool key_skips(const gt_cfg_option *o)
{
    static const char *const skip[] = {
        "training.steps",
        "training.dataset",
        "training.dataset_path",
        "training.tokenizer_path",
        "training.seed",
        "optimizer.lr",
        "compile.precompile_artifact_dir",
        "compile.debug_graph_passes",
    };
    char name[128];
    snprintf(name, sizeof name, "%s.%s", o->section, o->key);
    for (size_t k = 0; k < sizeof skip / sizeof skip[0]; k++)
        if (!strcmp(name, skip[k])) return true;
    /* the debug options that change the graph (the rest are test hooks of the run) */
    if (!strcmp(name, "debug.moe_force_load_balance")) return false;
    static const char *const sections[] = {"model", "training", "parallelism", "optimizer",
                                           "compile"};
    for (size_t k = 0; k < sizeof sections / sizeof sections[0]; k++) {
        size_t l = strlen(sections[k]); /* the section or a subsection ([compile.ep_overlap]) */
        if (!strncmp(o->section, sections[k], l) && (!o->section[l] || o->section[l] == '.'))
            return false;
    }
    return true;
}

char *gt_train_artifact_key(const gt_config *cfg, const gt_train_layout *layout)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    int n = 0;
    const gt_cfg_option *opts = gt_config_options(&n);
    for (int k = 0; k < n; k++) {
        if (key_skips(&opts[k])) continue;
        char v[512];
        gt_config_format_value(cfg, &opts[k], v, sizeof v);
        fprintf(f, "%s.%s = %s\n", opts[k].section, opts[k].key, v);
    }
    /* another build may compile another graph from the same options (a pass changed) */
    fprintf(f, "graphtrain.build = %s\n", GT_BUILD_ID);
    fprintf(f, "layout.world = %d\n", gt_mesh_world_size(&layout->mesh));
    for (int d = 0; d < GT_MESH_NDIMS; d++)
        fprintf(f, "layout.%s = %d\n", gt_mesh_dim_name(d), layout->mesh.size[d]);
    /* the sparse (expert) view of the mesh: efsdp x ep = dp_shard x tp */
    int64_t ep =
        cfg->parallelism.expert_parallel_degree > 1 ? cfg->parallelism.expert_parallel_degree : 1;
    int64_t dense = (int64_t)layout->mesh.size[GT_MESH_DP_SHARD] * layout->mesh.size[GT_MESH_TP];
    fprintf(f, "layout.efsdp = %lld\nlayout.ep = %lld\n", (long long)(dense / ep), (long long)ep);
    fclose(f);
    return buf;
}

const char *gt_train_artifact_name(int64_t micro_batches)
{
    return micro_batches > 1 ? "micro_step.graph" : "step.graph";
}

char *gt_train_artifact_path(const char *dir, const char *name)
{
    return gt_train_join_path(dir, name);
}

gt_status gt_train_artifact_save(const char *dir, const char *name, const char *key,
                                 const gt_graph *g, gt_error *err)
{
    char *graph = NULL, *file = NULL;
    size_t glen = 0, flen = 0, kn = strlen(key);
    FILE *m = open_memstream(&graph, &glen);
    gt_status st = gt_graph_write(g, m, err);
    fclose(m);
    m = open_memstream(&file, &flen);
    fprintf(m, "graphtrain-artifact %d\nkey %zu %016llx\n%sgraph %zu %016llx\n", ARTIFACT_VERSION,
            kn, (unsigned long long)XXH64(key, kn, 0), key, glen,
            (unsigned long long)XXH64(graph, glen, 0));
    fwrite(graph, 1, glen, m);
    fclose(m);
    char *path = gt_train_artifact_path(dir, name);
    size_t tn = strlen(path) + 64;
    char *tmp = gt_xmalloc(tn);
    snprintf(tmp, tn, "%s/.%s.tmp-%ld", dir, name, (long)getpid());
    if (st == GT_OK) st = ckpt_mkdirs(dir, err);
    if (st == GT_OK) {
        st = ckpt_write_file(tmp, file, flen, err);
        if (st == GT_OK && rename(tmp, path) != 0)
            st = gt_error_set(err, GT_ERR_IO, "%s: cannot rename to %s: %s", tmp, path,
                              strerror(errno));
        if (st == GT_OK) st = ckpt_fsync_dir(dir, err);
        if (st != GT_OK) unlink(tmp);
    }
    free(tmp);
    free(path);
    free(file);
    free(graph);
    return st;
}

/* The line at *p (NUL-terminated in place); *p moves past it. NULL at the end of the text. */
static char *take_line(char **p, char *end)
{
    if (*p >= end) return NULL;
    char *s = *p, *nl = memchr(s, '\n', (size_t)(end - s));
    if (!nl) return NULL;
    *nl = 0;
    *p = nl + 1;
    return s;
}

/* The first line of a that is not in b at the same place ("" when none); for messages. */
static void first_difference(const char *a, const char *b, char *wa, char *wb, size_t n)
{
    while (*a || *b) {
        size_t la = strcspn(a, "\n"), lb = strcspn(b, "\n");
        if (la != lb || strncmp(a, b, la) != 0) {
            snprintf(wa, n, "%.*s", (int)la, a);
            snprintf(wb, n, "%.*s", (int)lb, b);
            return;
        }
        a += la + (a[la] == '\n');
        b += lb + (b[lb] == '\n');
    }
    wa[0] = wb[0] = 0;
}

gt_status gt_train_artifact_parse(const char *path, char *data, size_t size, const char *key,
                                  gt_graph **out, gt_error *err)
{
    *out = NULL;
    char *p = data, *end = data + size, *line;
    int version = 0, used = 0;
    size_t klen = 0, glen = 0;
    unsigned long long ksum = 0, gsum = 0;
    line = take_line(&p, end);
    if (!line || sscanf(line, "graphtrain-artifact %d%n", &version, &used) != 1 || line[used])
        return gt_error_set(err, GT_ERR_FORMAT,
                            "%s: not a graphtrain step artifact (first line 'graphtrain-artifact "
                            "VERSION' expected)",
                            path);
    if (version != ARTIFACT_VERSION)
        return gt_error_set(err, GT_ERR_FORMAT,
                            "%s: artifact version %d; this graphtrain reads version %d (delete it "
                            "to compile again)",
                            path, version, ARTIFACT_VERSION);
    line = take_line(&p, end);
    if (!line || sscanf(line, "key %zu %llx%n", &klen, &ksum, &used) != 2 || line[used] ||
        klen > (size_t)(end - p))
        return gt_error_set(err, GT_ERR_FORMAT, "%s: malformed or truncated key header", path);
    char *k = p;
    p += klen;
    if ((unsigned long long)XXH64(k, klen, 0) != ksum)
        return gt_error_set(err, GT_ERR_FORMAT,
                            "%s: the key's checksum does not match: the file "
                            "is corrupt (delete it to compile again)",
                            path);
    line = take_line(&p, end);
    if (!line || sscanf(line, "graph %zu %llx%n", &glen, &gsum, &used) != 2 || line[used] ||
        glen != (size_t)(end - p))
        return gt_error_set(err, GT_ERR_FORMAT, "%s: malformed or truncated graph header", path);
    if ((unsigned long long)XXH64(p, glen, 0) != gsum)
        return gt_error_set(err, GT_ERR_FORMAT,
                            "%s: the graph's checksum does not match: the "
                            "file is corrupt (delete it to compile again)",
                            path);
    size_t want = strlen(key);
    if (klen != want || memcmp(k, key, klen) != 0) {
        char *have = gt_xmalloc(klen + 1);
        memcpy(have, k, klen);
        have[klen] = 0;
        char was[256], now[256];
        first_difference(have, key, was, now, sizeof was);
        free(have);
        return gt_error_set(err, GT_ERR_INVALID,
                            "%s was compiled for another run: it has '%s' where this run has "
                            "'%s' (delete it, or give another compile.precompile_artifact_dir, "
                            "to compile again)",
                            path, was[0] ? was : "(nothing)", now[0] ? now : "(nothing)");
    }
    gt_status st = gt_graph_read(p, glen, out, err);
    if (st != GT_OK) gt_error_wrap(err, "%s", path);
    return st;
}

gt_status gt_train_artifact_load(const char *dir, const char *name, const char *key, gt_graph **out,
                                 gt_error *err)
{
    *out = NULL;
    char *path = gt_train_artifact_path(dir, name), *data = NULL;
    size_t size = 0;
    gt_status st = gt_train_read_file(path, &data, &size, err);
    if (st == GT_OK) st = gt_train_artifact_parse(path, data, size, key, out, err);
    free(data);
    free(path);
    return st;
}

bool gt_train_artifact_exists(const char *dir, const char *name)
{
    char *path = gt_train_artifact_path(dir, name);
    struct stat sb;
    bool yes = stat(path, &sb) == 0;
    free(path);
    return yes;
}

gt_status gt_train_precompile(const gt_config *cfg, const gt_train_layout *layout,
                              const gt_graph *g, char **path, gt_error *err)
{
    *path = NULL;
    const char *dir = cfg->compile.precompile_artifact_dir;
    int64_t micro = 1;
    GT_TRY(gt_train_micro_batches(cfg, layout, &micro, err));
    const char *name = gt_train_artifact_name(micro);
    char *key = gt_train_artifact_key(cfg, layout);
    gt_status st = gt_train_artifact_save(dir, name, key, g, err);
    free(key);
    if (st == GT_OK) *path = gt_train_artifact_path(dir, name);
    return st;
}
