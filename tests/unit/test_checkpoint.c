/* test_checkpoint.c — checkpoint save / find / load / prune and crash safety.
 *
 * References used instead of the code under test:
 *   - round trips compare loaded bytes with the bytes saved (memcmp), and the manifest's checksums
 *     with xxHash64 computed here straight from libxxhash, its file size with stat(2);
 *   - corruption cases damage the files by hand (truncate, flip a byte at an offset computed from
 *     the safetensors layout read here, rewrite the manifest) and check the message names the file
 *     and the fault, and that the caller's tensors keep their sentinel bytes;
 *   - the crash test forks a child that saves in a loop, kills it with SIGKILL at pseudo-random
 *     moments, and requires that every step-<N> directory on disk loads with the exact contents of
 *     step N (a pattern computed here) and that the latest step never goes backwards. */
#include "graphtrain/gt_checkpoint.h"
#include "graphtrain/gt_safetensors.h"
#include "gt_test.h"

#include <dirent.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

/* ---------------------------------------------------------------- fixtures */

static char g_root[64];

/* A path under the test's root; the buffer is reused by the next 8 calls, so a test that keeps a
 * folder name copies it. */
static char *path_of(const char *rel)
{
    static char bufs[8][512];
    static int next;
    char *b = bufs[next++ & 7];
    snprintf(b, 512, "%s/%s", g_root, rel);
    return b;
}

/* A small "model": parameters, optimizer state, a scalar and an empty tensor. */
#define N_TENSORS 6
#define N_PARAMS 3
static const char *const k_names[N_TENSORS] = {"tok_embeddings.weight",
                                               "layers.0.attention.wq.weight",
                                               "norm.weight",
                                               "optim.exp_avg.layers.0.attention.wq.weight",
                                               "optim.step",
                                               "empty"};
static const gt_dtype k_dtypes[N_TENSORS] = {GT_F32, GT_BF16, GT_F32, GT_F32, GT_I64, GT_F32};
static const int k_ndims[N_TENSORS] = {2, 2, 1, 2, 0, 2};
static const int64_t k_shapes[N_TENSORS][2] = {{8, 4}, {4, 4}, {4, 0}, {4, 4}, {0, 0}, {0, 3}};

typedef struct {
    gt_tensor t[N_TENSORS];
    const gt_tensor *ptrs[N_TENSORS];
    gt_tensor *mut[N_TENSORS];
} model_state;

/* Fills every byte from (seed, tensor, byte index) so each step's tensors differ. */
static void state_init(model_state *s, uint32_t seed)
{
    gt_error err = {0};
    for (int i = 0; i < N_TENSORS; i++) {
        GT_CHECK(gt_tensor_alloc(&s->t[i], k_dtypes[i], k_ndims[i], k_shapes[i], &err) == GT_OK);
        uint8_t *p = s->t[i].data;
        for (size_t b = 0; b < gt_tensor_nbytes(&s->t[i]); b++)
            p[b] = (uint8_t)((b * 2654435761u + seed * 40503u + (uint32_t)i * 977u) >> 7);
        s->ptrs[i] = &s->t[i];
        s->mut[i] = &s->t[i];
    }
}

/* Same shapes, every byte set to fill (the sentinel that a refused load must not touch). */
static void state_blank(model_state *s, uint8_t fill)
{
    state_init(s, 0);
    for (int i = 0; i < N_TENSORS; i++)
        memset(s->t[i].data, fill, gt_tensor_nbytes(&s->t[i]));
}

static void state_free(model_state *s)
{
    for (int i = 0; i < N_TENSORS; i++)
        gt_tensor_free(&s->t[i]);
}

static bool state_equal(const model_state *a, const model_state *b, int n)
{
    for (int i = 0; i < n; i++) {
        size_t nb = gt_tensor_nbytes(&a->t[i]);
        if (nb != gt_tensor_nbytes(&b->t[i]) || (nb && memcmp(a->t[i].data, b->t[i].data, nb)))
            return false;
    }
    return true;
}

static bool state_all_bytes(const model_state *s, uint8_t fill)
{
    for (int i = 0; i < N_TENSORS; i++) {
        const uint8_t *p = s->t[i].data;
        for (size_t b = 0; b < gt_tensor_nbytes(&s->t[i]); b++)
            if (p[b] != fill) return false;
    }
    return true;
}

static gt_checkpoint_model tiny_model(const model_state *s)
{
    return (gt_checkpoint_model){"llama3", "test_tiny",
                                 gt_checkpoint_fingerprint(N_PARAMS, k_names, s->ptrs)};
}

static gt_checkpoint_desc basic_desc(const char *folder, int64_t step, const model_state *s)
{
    static const char *const counter_names[] = {"dropout", "data"};
    static const int64_t counters[] = {99, -5};
    static const char *const extra_keys[] = {"config", "note"};
    static const char *const extra_values[] = {"debugmodel.toml", "ünïcode ✓"};
    gt_checkpoint_desc d = {0};
    d.folder = folder;
    d.step = step;
    d.model = tiny_model(s);
    d.loader_json = "{\"shard\": \"a.bin\", \"offset\": 17, \"epoch\": 2, \"rest\": [1, 2.5]}";
    d.rng_seed = -1234567890123LL;
    d.n_rng_counters = 2;
    d.rng_counter_names = counter_names;
    d.rng_counters = counters;
    d.n_extra = 2;
    d.extra_keys = extra_keys;
    d.extra_values = extra_values;
    return d;
}

static bool exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0;
}

static int count_entries(const char *dir, const char *prefix)
{
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.' || strncmp(prefix, ".", 1) == 0)
            n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
    closedir(d);
    return n;
}

static uint8_t *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc((size_t)n + 1);
    *len = fread(buf, 1, (size_t)n, f);
    buf[*len] = 0;
    fclose(f);
    return buf;
}

static void write_all(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    GT_CHECK(f != NULL);
    GT_CHECK(fwrite(data, 1, len, f) == len);
    fclose(f);
}

static void save_ok(const gt_checkpoint_desc *d, const model_state *s)
{
    gt_error err = {0};
    EXPECT_OK(gt_checkpoint_save(d, N_TENSORS, k_names, s->ptrs, &err), &err);
}

/* ---------------------------------------------------------------- round trip */

/* gt_checkpoint_save_from's source: tensor i's bytes from the state, after copying them into one
 * scratch buffer (so each pointer is valid only until the next call, as the contract allows);
 * fail_at >= 0 fails there. Records the order it is asked in. */
typedef struct {
    const model_state *s;
    char scratch[256];
    int asked[N_TENSORS + 1], n_asked, fail_at;
} stream_source;

static gt_status stream_fn(int i, const void **data, void *user, gt_error *err)
{
    stream_source *g = user;
    if (g->n_asked <= N_TENSORS) g->asked[g->n_asked++] = i;
    if (i == g->fail_at) return gt_error_set(err, GT_ERR_IO, "source: tensor %d unavailable", i);
    size_t n = gt_tensor_nbytes(&g->s->t[i]);
    GT_CHECK(n <= sizeof g->scratch);
    memcpy(g->scratch, g->s->t[i].data, n);
    *data = g->scratch;
    return GT_OK;
}

/* gt_checkpoint_load_with's sink: compares tensor i with the state, records the order, fails at
 * fail_at. */
typedef struct {
    const model_state *s;
    int seen[N_TENSORS + 1], n_seen, fail_at, wrong;
} load_sink;

static gt_status sink_fn(int i, const void *bytes, void *user, gt_error *err)
{
    load_sink *k = user;
    if (k->n_seen <= N_TENSORS) k->seen[k->n_seen++] = i;
    if (i == k->fail_at) return gt_error_set(err, GT_ERR_IO, "sink: no room for tensor %d", i);
    size_t n = gt_tensor_nbytes(&k->s->t[i]);
    k->wrong += n && memcmp(bytes, k->s->t[i].data, n) != 0;
    return GT_OK;
}

/* Whether FOLDER_A/step-N/NAME and FOLDER_B/step-N/NAME exist with the same bytes. */
static bool same_step_file(const char *folder_a, const char *folder_b, int step, const char *name)
{
    char a[600], b[600];
    size_t la = 0, lb = 0;
    snprintf(a, sizeof a, "%s/step-%d/%s", folder_a, step, name);
    snprintf(b, sizeof b, "%s/step-%d/%s", folder_b, step, name);
    uint8_t *fa = read_all(a, &la), *fb = read_all(b, &lb);
    bool same = fa && fb && la == lb && memcmp(fa, fb, la) == 0;
    free(fa);
    free(fb);
    return same;
}

/* Descriptors of s's tensors (dtype and shape, no data), for the saves that take their bytes
 * elsewhere. */
static void descriptors_of(const model_state *s, gt_tensor desc[N_TENSORS],
                           const gt_tensor *descs[N_TENSORS])
{
    for (int i = 0; i < N_TENSORS; i++) {
        gt_tensor_wrap(&desc[i], s->t[i].dtype, s->t[i].ndim, s->t[i].shape, NULL);
        descs[i] = &desc[i];
    }
}

/* The streaming save writes what the plain save writes, from descriptors without data; a source
 * that fails stops the save, which publishes nothing and asks no further; a save that fails
 * before writing asks for no tensor. */
static void test_save_from(void)
{
    char plain[512], streamed[512];
    snprintf(plain, sizeof plain, "%s", path_of("from/plain"));
    snprintf(streamed, sizeof streamed, "%s", path_of("from/streamed"));
    model_state src, dst;
    state_init(&src, 11);
    gt_checkpoint_desc d = basic_desc(plain, 3, &src);
    save_ok(&d, &src);
    gt_tensor desc[N_TENSORS];
    const gt_tensor *descs[N_TENSORS];
    descriptors_of(&src, desc, descs);
    stream_source g = {.s = &src, .fail_at = -1};
    gt_error err = {0};
    d.folder = streamed;
    EXPECT_OK(gt_checkpoint_save_from(&d, N_TENSORS, k_names, descs, stream_fn, &g, &err), &err);
    bool in_order = g.n_asked == N_TENSORS;
    for (int i = 0; in_order && i < N_TENSORS; i++)
        in_order = g.asked[i] == i;
    EXPECT(in_order, "save_from: the source was asked %d times, not once per tensor in order",
           g.n_asked);
    EXPECT(same_step_file(plain, streamed, 3, "model.safetensors"),
           "save_from: the tensor file differs from the plain save's");
    char b[600];
    state_blank(&dst, 0x5A);
    gt_checkpoint_model m = tiny_model(&src);
    EXPECT_OK(gt_checkpoint_load(streamed, 3, &m, N_TENSORS, k_names, dst.mut, NULL, &err), &err);
    EXPECT(state_equal(&src, &dst, N_TENSORS), "save_from: loaded tensors differ");

    /* load_with hands each tensor over once, in order, with its bytes; a sink's error stops the
     * load as it is, and the manifest is not handed back */
    load_sink k = {.s = &src, .fail_at = -1};
    gt_checkpoint_info info;
    EXPECT_OK(gt_checkpoint_load_with(streamed, 3, &m, N_TENSORS, k_names, descs, sink_fn, &k,
                                      &info, &err),
              &err);
    bool sunk_in_order = k.n_seen == N_TENSORS && k.wrong == 0;
    for (int i = 0; sunk_in_order && i < N_TENSORS; i++)
        sunk_in_order = k.seen[i] == i;
    EXPECT(sunk_in_order, "load_with: %d tensors handed over, %d with other bytes", k.n_seen,
           k.wrong);
    EXPECT(info.step == 3, "load_with: manifest step %lld", (long long)info.step);
    gt_checkpoint_info_free(&info);
    k = (load_sink){.s = &src, .fail_at = 1};
    memset(&info, 0, sizeof info);
    err = (gt_error){0};
    EXPECT(gt_checkpoint_load_with(streamed, 3, &m, N_TENSORS, k_names, descs, sink_fn, &k, &info,
                                   &err) == GT_ERR_IO &&
               strstr(err.msg, "no room for tensor 1") && k.n_seen == 2 && info.n_tensors == 0,
           "load_with: a failing sink gave %s after %d tensors", err.msg, k.n_seen);

    /* a source failing at tensor 2: its error, nothing published, nothing asked after it */
    g = (stream_source){.s = &src, .fail_at = 2};
    d.step = 4;
    err = (gt_error){0};
    EXPECT(gt_checkpoint_save_from(&d, N_TENSORS, k_names, descs, stream_fn, &g, &err) ==
                   GT_ERR_IO &&
               strstr(err.msg, "tensor 2 unavailable"),
           "save_from: a failing source gives %s", err.msg);
    EXPECT(g.n_asked == 3, "save_from: the source was asked %d times, expected 3", g.n_asked);
    snprintf(b, sizeof b, "%s/step-4", streamed);
    EXPECT(!exists(b) && count_entries(streamed, ".tmp-") == 0,
           "save_from: a failed save left step-4 or a temporary");

    /* a folder that cannot be made: no tensor asked for */
    write_all(path_of("from/file"), "x", 1);
    g = (stream_source){.s = &src, .fail_at = -1};
    d.folder = path_of("from/file/sub");
    EXPECT(gt_checkpoint_save_from(&d, N_TENSORS, k_names, descs, stream_fn, &g, &err) != GT_OK &&
               g.n_asked == 0,
           "save_from: a save that fails first asked the source %d times", g.n_asked);
    state_free(&src);
    state_free(&dst);
}

/* gt_checkpoint_begin / finish: "writers" pwrite each tensor's bytes in two halves, in reverse
 * order, into the file begin sized (found again by gt_checkpoint_tensor_path); the published
 * checkpoint's files are byte for byte the plain save's, and it loads. A writer freed unfinished
 * (another writer failed) leaves no step and no temporary. */
static void test_writers(void)
{
    char plain[512], parts[512];
    snprintf(plain, sizeof plain, "%s", path_of("writers/plain"));
    snprintf(parts, sizeof parts, "%s", path_of("writers/parts"));
    model_state src, dst;
    state_init(&src, 23);
    gt_checkpoint_desc d = basic_desc(plain, 7, &src);
    save_ok(&d, &src);
    gt_tensor desc[N_TENSORS];
    const gt_tensor *descs[N_TENSORS];
    uint64_t h[N_TENSORS], off[N_TENSORS + 1] = {0};
    descriptors_of(&src, desc, descs);
    for (int i = 0; i < N_TENSORS; i++) {
        h[i] = XXH64(src.t[i].data, gt_tensor_nbytes(&src.t[i]), 0);
        off[i + 1] = off[i] + gt_tensor_nbytes(&src.t[i]);
    }
    gt_error err = {0};
    d.folder = parts;
    gt_checkpoint_writer w;
    EXPECT_OK(gt_checkpoint_begin(&d, N_TENSORS, k_names, descs, &w, &err), &err);
    char *path = gt_checkpoint_tensor_path(parts, 7, w.pid);
    EXPECT(strcmp(path, w.tensor_path) == 0, "writers: %s, begin said %s", path, w.tensor_path);
    /* the data section starts after the 8-byte header length and the header (safetensors), and
     * holds the tensors back to back in the order given */
    size_t flen = 0;
    uint8_t *created = read_all(path, &flen);
    uint64_t data_start = 8;
    for (int i = 0; created && flen >= 8 && i < 8; i++)
        data_start += (uint64_t)created[i] << (8 * i);
    free(created);
    EXPECT(flen == data_start + off[N_TENSORS], "writers: created %zu bytes, want %llu", flen,
           (unsigned long long)(data_start + off[N_TENSORS]));
    int fd = open(path, O_WRONLY);
    EXPECT(fd >= 0, "writers: cannot open %s", path);
    for (int i = N_TENSORS - 1; fd >= 0 && i >= 0; i--) {
        size_t n = gt_tensor_nbytes(&src.t[i]), half = n / 2;
        const char *b = src.t[i].data;
        EXPECT((size_t)pwrite(fd, b + half, n - half, (off_t)(data_start + off[i] + half)) ==
                       n - half &&
                   (size_t)pwrite(fd, b, half, (off_t)(data_start + off[i])) == half,
               "writers: pwrite of tensor %d", i);
    }
    if (fd >= 0) close(fd);
    EXPECT_OK(gt_checkpoint_finish(&w, h, &err), &err);
    gt_checkpoint_writer_free(&w);
    static const char *const files[2] = {"model.safetensors", "manifest.json"};
    for (int f = 0; f < 2; f++)
        EXPECT(same_step_file(plain, parts, 7, files[f]), "writers: %s differs from the plain save's",
               files[f]);
    state_blank(&dst, 0x5A);
    gt_checkpoint_model m = tiny_model(&src);
    EXPECT_OK(gt_checkpoint_load(parts, 7, &m, N_TENSORS, k_names, dst.mut, NULL, &err), &err);
    EXPECT(state_equal(&src, &dst, N_TENSORS), "writers: loaded tensors differ");
    EXPECT(count_entries(parts, ".tmp-") == 0, "writers: a temporary is left");
    free(path);

    /* begun, then abandoned: nothing published, nothing left */
    d.step = 8;
    EXPECT_OK(gt_checkpoint_begin(&d, N_TENSORS, k_names, descs, &w, &err), &err);
    EXPECT(count_entries(parts, ".tmp-") == 1, "writers: begin made no temporary directory");
    gt_checkpoint_writer_free(&w);
    char b8[600];
    snprintf(b8, sizeof b8, "%s/step-8", parts);
    EXPECT(!exists(b8) && count_entries(parts, ".tmp-") == 0,
           "writers: an abandoned save left step-8 or a temporary");
    /* a folder that cannot be made */
    d.folder = path_of("from/file/sub");
    EXPECT(gt_checkpoint_begin(&d, N_TENSORS, k_names, descs, &w, &err) != GT_OK,
           "writers: begin under a file succeeded");
    state_free(&src);
    state_free(&dst);
}

/* The version-2 file hash computed here (libxxhash, jansson): the bytes before the data section,
 * then each tensor's xxh64 (of its bytes in the file) as 8 little-endian bytes, in the order of
 * the tensors' data offsets (an empty tensor before one starting at the same byte). */
static uint64_t v2_file_hash(const char *path)
{
    size_t len = 0;
    uint8_t *f = read_all(path, &len);
    if (!f || len < 8) return 0;
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++)
        hlen |= (uint64_t)f[i] << (8 * i);
    json_t *hdr = json_loadb((const char *)f + 8, (size_t)hlen, 0, NULL);
    uint64_t begin[64], end[64];
    int n = 0;
    const char *key;
    json_t *v;
    json_object_foreach(hdr, key, v)
    {
        if (strcmp(key, "__metadata__") == 0 || n == 64) continue;
        json_t *off = json_object_get(v, "data_offsets");
        begin[n] = (uint64_t)json_integer_value(json_array_get(off, 0));
        end[n++] = (uint64_t)json_integer_value(json_array_get(off, 1));
    }
    json_decref(hdr);
    for (int a = 1; a < n; a++) /* insertion sort by (begin, end) */
        for (int b = a; b > 0 && (begin[b - 1] > begin[b] ||
                                  (begin[b - 1] == begin[b] && end[b - 1] > end[b]));
             b--) {
            uint64_t t = begin[b];
            begin[b] = begin[b - 1], begin[b - 1] = t;
            t = end[b], end[b] = end[b - 1], end[b - 1] = t;
        }
    XXH64_state_t *st = XXH64_createState();
    XXH64_reset(st, 0);
    XXH64_update(st, f, 8 + (size_t)hlen);
    for (int k = 0; k < n; k++) {
        uint64_t h = XXH64(f + 8 + hlen + begin[k], (size_t)(end[k] - begin[k]), 0);
        uint8_t le[8];
        for (int b = 0; b < 8; b++)
            le[b] = (uint8_t)(h >> (8 * b));
        XXH64_update(st, le, 8);
    }
    uint64_t h = XXH64_digest(st);
    XXH64_freeState(st);
    free(f);
    return h;
}

static void test_round_trip(void)
{
    char folder[512];
    snprintf(folder, sizeof folder, "%s", path_of("rt/ckpt")); /* parents are created */
    model_state src, dst;
    state_init(&src, 7);
    gt_checkpoint_desc d = basic_desc(folder, 10, &src);
    save_ok(&d, &src);
    EXPECT(exists(path_of("rt/ckpt/step-10/manifest.json")), "manifest written");
    EXPECT(count_entries(folder, ".tmp-") == 0, "no temporary left");

    /* The manifest, read here with jansson: checksums are xxh64 of the bytes we passed. */
    size_t len = 0;
    char *text = (char *)read_all(path_of("rt/ckpt/step-10/manifest.json"), &len);
    json_t *root = json_loads(text, 0, NULL);
    EXPECT(root != NULL, "manifest is JSON");
    for (int i = 0; root && i < N_TENSORS; i++) {
        json_t *e = json_object_get(json_object_get(root, "tensors"), k_names[i]);
        char hex[17];
        snprintf(hex, sizeof hex, "%016llx",
                 (unsigned long long)XXH64(src.t[i].data, gt_tensor_nbytes(&src.t[i]), 0));
        EXPECT(e && strcmp(json_string_value(json_object_get(e, "xxh64")), hex) == 0,
               "tensor %s checksum", k_names[i]);
        EXPECT(e && strcmp(json_string_value(json_object_get(e, "dtype")),
                           gt_dtype_name(k_dtypes[i])) == 0,
               "tensor %s dtype", k_names[i]);
    }
    struct stat sb;
    stat(path_of("rt/ckpt/step-10/model.safetensors"), &sb);
    json_t *file = json_object_get(json_object_get(root, "files"), "model.safetensors");
    EXPECT(json_integer_value(json_object_get(file, "bytes")) == (json_int_t)sb.st_size,
           "recorded file size equals stat size %lld", (long long)sb.st_size);
    EXPECT(json_integer_value(json_object_get(root, "step")) == 10, "step recorded");
    EXPECT(json_integer_value(json_object_get(root, "version")) == 2, "version 2 written");
    char fhex[17];
    snprintf(fhex, sizeof fhex, "%016llx",
             (unsigned long long)v2_file_hash(path_of("rt/ckpt/step-10/model.safetensors")));
    EXPECT(strcmp(json_string_value(json_object_get(file, "xxh64")), fhex) == 0,
           "file checksum %s, want the header and tensor hashes' %s",
           json_string_value(json_object_get(file, "xxh64")), fhex);
    json_decref(root);
    free(text);

    /* Full load: bitwise equal, and the manifest comes back. */
    state_blank(&dst, 0xAB);
    gt_checkpoint_model m = tiny_model(&src);
    gt_checkpoint_info info;
    gt_error err = {0};
    EXPECT_OK(gt_checkpoint_load(folder, 10, &m, N_TENSORS, k_names, dst.mut, &info, &err), &err);
    EXPECT(state_equal(&src, &dst, N_TENSORS), "loaded tensors are bitwise equal");
    EXPECT(info.step == 10 && strcmp(info.model_name, "llama3") == 0 &&
               strcmp(info.model_flavor, "test_tiny") == 0 && info.fingerprint == m.fingerprint,
           "identity round trip");
    json_t *want = json_loads(d.loader_json, 0, NULL), *got = json_loads(info.loader_json, 0, NULL);
    EXPECT(json_equal(want, got), "loader JSON round trip: %s", info.loader_json);
    json_decref(want);
    json_decref(got);
    int64_t c = 0;
    EXPECT(info.rng_seed == d.rng_seed, "rng seed");
    EXPECT(gt_checkpoint_info_counter(&info, "data", &c) && c == -5, "rng counter");
    EXPECT(!gt_checkpoint_info_counter(&info, "nope", &c), "absent counter");
    EXPECT(gt_checkpoint_info_extra(&info, "note") &&
               strcmp(gt_checkpoint_info_extra(&info, "note"), "ünïcode ✓") == 0,
           "extra round trip");
    EXPECT(info.n_tensors == N_TENSORS && info.n_files == 1, "manifest sizes");
    gt_checkpoint_info_free(&info);
    state_free(&dst);

    /* Params only (the checkpoint also holds optimizer state); latest via GT_CHECKPOINT_NONE. */
    state_blank(&dst, 0xCD);
    gt_error_clear(&err);
    EXPECT_OK(
        gt_checkpoint_load(folder, GT_CHECKPOINT_NONE, &m, N_PARAMS, k_names, dst.mut, NULL, &err),
        &err);
    EXPECT(state_equal(&src, &dst, N_PARAMS), "subset load is bitwise equal");
    EXPECT(*(uint8_t *)dst.t[3].data == 0xCD, "tensors not asked for are untouched");
    state_free(&dst);

    /* Re-saving the same step replaces it. */
    model_state src2;
    state_init(&src2, 8);
    save_ok(&d, &src2);
    state_blank(&dst, 0);
    gt_error_clear(&err);
    EXPECT_OK(gt_checkpoint_load(folder, 10, &m, N_TENSORS, k_names, dst.mut, NULL, &err), &err);
    EXPECT(state_equal(&src2, &dst, N_TENSORS) && !state_equal(&src, &dst, N_TENSORS),
           "re-save of a step replaces its contents");
    EXPECT(count_entries(folder, ".tmp-") == 0, "no temporary left after a re-save");
    state_free(&dst);
    state_free(&src2);
    state_free(&src);
}

static void test_fingerprint(void)
{
    model_state s;
    state_init(&s, 1);
    uint64_t base = gt_checkpoint_fingerprint(N_TENSORS, k_names, s.ptrs);
    /* Order of the list does not matter. */
    const char *rev_names[N_TENSORS];
    const gt_tensor *rev[N_TENSORS];
    for (int i = 0; i < N_TENSORS; i++) {
        rev_names[i] = k_names[N_TENSORS - 1 - i];
        rev[i] = s.ptrs[N_TENSORS - 1 - i];
    }
    EXPECT(gt_checkpoint_fingerprint(N_TENSORS, rev_names, rev) == base, "order independent");
    /* The data does not matter; names, dtypes and shapes do. */
    model_state other;
    state_init(&other, 2);
    EXPECT(gt_checkpoint_fingerprint(N_TENSORS, k_names, other.ptrs) == base, "data independent");
    s.t[0].shape[0] = 9;
    EXPECT(gt_checkpoint_fingerprint(N_TENSORS, k_names, s.ptrs) != base, "shape changes it");
    s.t[0].shape[0] = 8;
    s.t[0].dtype = GT_BF16;
    EXPECT(gt_checkpoint_fingerprint(N_TENSORS, k_names, s.ptrs) != base, "dtype changes it");
    s.t[0].dtype = GT_F32;
    rev_names[0] = "emptz";
    rev_names[N_TENSORS - 1] = k_names[0];
    rev[0] = s.ptrs[N_TENSORS - 1];
    EXPECT(gt_checkpoint_fingerprint(N_TENSORS, rev_names, rev) != base, "names change it");
    state_free(&s);
    state_free(&other);
}

/* ---------------------------------------------------------------- find, keep-last-K, stale */

static bool steps_are(const char *folder, const int64_t *want, int n_want)
{
    int64_t *steps;
    int n;
    gt_error err = {0};
    if (gt_checkpoint_list(folder, &steps, &n, &err) != GT_OK) return false;
    bool ok = n == n_want;
    for (int i = 0; ok && i < n; i++)
        ok = steps[i] == want[i];
    free(steps);
    return ok;
}

static void test_keep_last(void)
{
    char folder[512];
    snprintf(folder, sizeof folder, "%s", path_of("keep"));
    model_state s;
    state_init(&s, 3);
    for (int step = 1; step <= 5; step++) {
        gt_checkpoint_desc d = basic_desc(folder, step, &s);
        d.keep_last = 3;
        save_ok(&d, &s);
    }
    EXPECT(steps_are(folder, (int64_t[]){3, 4, 5}, 3), "keep_last 3 keeps 3, 4, 5");
    EXPECT(count_entries(folder, "") == 3 && count_entries(folder, ".tmp-") == 0,
           "nothing else in the folder (%d entries)", count_entries(folder, ""));
    gt_checkpoint_desc d = basic_desc(folder, 6, &s);
    d.keep_last = 0;
    save_ok(&d, &s);
    EXPECT(steps_are(folder, (int64_t[]){3, 4, 5, 6}, 4), "keep_last 0 keeps all");
    gt_error err = {0};
    EXPECT_OK(gt_checkpoint_prune(folder, 2, &err), &err);
    EXPECT(steps_are(folder, (int64_t[]){5, 6}, 2), "prune to 2");
    EXPECT_OK(gt_checkpoint_prune(folder, -1, &err), &err);
    EXPECT(steps_are(folder, (int64_t[]){5, 6}, 2), "prune with keep <= 0 deletes nothing");

    /* prune_in_background: the old steps are gone from the list when the save returns (renamed),
     * their removal finishes in the thread, and the next save (which joins it) finds no leftover
     * of it to clean */
    for (int step = 7; step <= 9; step++) {
        d = basic_desc(folder, step, &s);
        d.keep_last = 1;
        d.prune_in_background = true;
        save_ok(&d, &s);
        EXPECT(steps_are(folder, (int64_t[]){step}, 1), "background prune at step %d", step);
    }
    gt_checkpoint_prune_wait();
    EXPECT(count_entries(folder, "") == 1 && count_entries(folder, ".tmp-") == 0,
           "after the wait only step-9 is left (%d entries, %d .tmp-*)", count_entries(folder, ""),
           count_entries(folder, ".tmp-"));
    gt_checkpoint_prune_wait(); /* nothing running: returns */
    model_state back;
    state_blank(&back, 0x5a);
    gt_checkpoint_model m = tiny_model(&s);
    EXPECT_OK(gt_checkpoint_load(folder, 9, &m, N_TENSORS, k_names, back.mut, NULL, &err), &err);
    EXPECT(state_equal(&s, &back, N_TENSORS), "step-9 loads after the background prunes");
    state_free(&back);
    state_free(&s);
}

static void test_find(void)
{
    gt_error err = {0};
    int64_t latest = 42;
    EXPECT_OK(gt_checkpoint_find_latest(path_of("does-not-exist"), &latest, &err), &err);
    EXPECT(latest == GT_CHECKPOINT_NONE, "missing folder: none, not an error");
    model_state s, dst;
    state_init(&s, 4);
    state_blank(&dst, 0x11);
    gt_error_clear(&err);
    EXPECT(gt_checkpoint_load(path_of("does-not-exist"), GT_CHECKPOINT_NONE, NULL, N_TENSORS,
                              k_names, dst.mut, NULL, &err) != GT_OK &&
               strstr(err.msg, "no checkpoint to load"),
           "loading latest of nothing is an error: %s", err.msg);

    char folder[512];
    snprintf(folder, sizeof folder, "%s", path_of("find"));
    int64_t saved[] = {5, 100, 20};
    for (int i = 0; i < 3; i++) {
        gt_checkpoint_desc d = basic_desc(folder, saved[i], &s);
        save_ok(&d, &s);
    }
    /* Not checkpoints: no manifest, a non-canonical name, a bad manifest, a plain file. */
    mkdir(path_of("find/step-200"), 0755);
    mkdir(path_of("find/step-0300"), 0755);
    mkdir(path_of("find/step-400"), 0755);
    write_all(path_of("find/step-400/manifest.json"), "{}", 2);
    write_all(path_of("find/step-500"), "x", 1);
    gt_log_set_level(GT_LOG_ERROR); /* the ignored directories are logged as warnings */
    gt_error_clear(&err);
    EXPECT_OK(gt_checkpoint_find_latest(folder, &latest, &err), &err);
    EXPECT(latest == 100, "latest with gaps is 100, got %lld", (long long)latest);
    EXPECT(steps_are(folder, (int64_t[]){5, 20, 100}, 3), "list ascending, incomplete ignored");
    EXPECT_OK(gt_checkpoint_find_step(folder, 20, &err), &err);
    EXPECT(gt_checkpoint_find_step(folder, 50, &err) != GT_OK && strstr(err.msg, "step 50") &&
               strstr(err.msg, "5, 20, 100"),
           "missing step lists the available ones: %s", err.msg);
    gt_error_clear(&err);
    EXPECT(gt_checkpoint_find_step(folder, 200, &err) != GT_OK &&
               strstr(err.msg, "step-200/manifest.json") && strstr(err.msg, "incomplete"),
           "step without manifest is incomplete: %s", err.msg);
    gt_error_clear(&err);
    EXPECT(gt_checkpoint_load(folder, 400, NULL, N_TENSORS, k_names, dst.mut, NULL, &err) !=
                   GT_OK &&
               strstr(err.msg, "step-400/manifest.json") && strstr(err.msg, "missing \"format\""),
           "bad manifest named: %s", err.msg);
    gt_error_clear(&err);
    EXPECT(gt_checkpoint_load(folder, 7, NULL, N_TENSORS, k_names, dst.mut, NULL, &err) != GT_OK &&
               strstr(err.msg, "available steps: 5, 20, 100"),
           "load of a missing step lists steps: %s", err.msg);
    gt_log_set_level(GT_LOG_INFO);
    EXPECT(state_all_bytes(&dst, 0x11), "failed loads touched nothing");
    state_free(&dst);
    state_free(&s);
}

static void test_stale_tmp(void)
{
    char folder[512];
    snprintf(folder, sizeof folder, "%s", path_of("stale"));
    model_state s;
    state_init(&s, 5);
    gt_checkpoint_desc d = basic_desc(folder, 1, &s);
    save_ok(&d, &s);
    /* A crashed writer's leftovers: a complete-looking copy under a .tmp name (dead pid: beyond
     * any pid_max), and one of a live writer (our parent), which must be left alone. */
    char dead[600], live[600], cmd[2600];
    snprintf(dead, sizeof dead, "%s/.tmp-step-9-999999999", folder);
    snprintf(live, sizeof live, "%s/.tmp-step-8-%ld", folder, (long)getppid());
    snprintf(cmd, sizeof cmd, "cp -r %s/step-1 %s && cp -r %s/step-1 %s", folder, dead, folder,
             live);
    EXPECT(system(cmd) == 0, "copy");
    gt_error err = {0};
    int64_t latest;
    EXPECT_OK(gt_checkpoint_find_latest(folder, &latest, &err), &err);
    EXPECT(latest == 1, ".tmp directories are not checkpoints");
    d.step = 2;
    save_ok(&d, &s);
    EXPECT(!exists(dead), "stale .tmp of a dead writer removed by the next save");
    EXPECT(exists(live), ".tmp of a live writer kept");
    EXPECT(steps_are(folder, (int64_t[]){1, 2}, 2), "steps 1, 2");
    state_free(&s);
}

static void test_bad_save_args(void)
{
    char folder[512];
    snprintf(folder, sizeof folder, "%s", path_of("badsave"));
    model_state s;
    state_init(&s, 6);
    gt_error err = {0};
    gt_checkpoint_desc d = basic_desc(folder, 3, &s);
    d.loader_json = "[1, 2]";
    EXPECT(gt_checkpoint_save(&d, N_TENSORS, k_names, s.ptrs, &err) == GT_ERR_INVALID &&
               strstr(err.msg, "loader"),
           "loader state must be an object: %s", err.msg);
    d = basic_desc(folder, 3, &s);
    const char *dup[N_TENSORS];
    memcpy(dup, k_names, sizeof dup);
    dup[2] = dup[0];
    gt_error_clear(&err);
    EXPECT(gt_checkpoint_save(&d, N_TENSORS, dup, s.ptrs, &err) == GT_ERR_INVALID &&
               strstr(err.msg, "tok_embeddings.weight"),
           "duplicate tensor names refused: %s", err.msg);
    d.step = -2;
    gt_error_clear(&err);
    EXPECT(gt_checkpoint_save(&d, N_TENSORS, k_names, s.ptrs, &err) == GT_ERR_INVALID,
           "negative step refused");
    int64_t latest;
    EXPECT_OK(gt_checkpoint_find_latest(folder, &latest, &err), &err);
    EXPECT(latest == GT_CHECKPOINT_NONE && count_entries(folder, ".tmp-") <= 0,
           "refused saves leave nothing");
    state_free(&s);
}

/* ---------------------------------------------------------------- corruption */

typedef struct {
    const char *what;
    void (*damage)(const char *dir);
    const char *expect_1, *expect_2; /* substrings of the message */
    int64_t step;                    /* load this step (0: the saved one) */
} corruption_case;

static uint64_t le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static char *st_file(const char *dir)
{
    static char buf[512];
    snprintf(buf, sizeof buf, "%s/model.safetensors", dir);
    return buf;
}

static char *manifest_file(const char *dir)
{
    static char buf[512];
    snprintf(buf, sizeof buf, "%s/manifest.json", dir);
    return buf;
}

static void damage_truncate(const char *dir)
{
    struct stat sb;
    stat(st_file(dir), &sb);
    GT_CHECK(truncate(st_file(dir), sb.st_size - 40) == 0);
}

static void damage_append(const char *dir)
{
    FILE *f = fopen(st_file(dir), "ab");
    fputc(0, f);
    fclose(f);
}

/* Flips one byte inside the data of tensor "norm.weight", located from the raw header. */
static void damage_flip_data(const char *dir)
{
    size_t len = 0;
    uint8_t *buf = read_all(st_file(dir), &len);
    uint64_t hlen = le64(buf);
    json_t *h = json_loadb((const char *)buf + 8, hlen, 0, NULL);
    json_t *off = json_object_get(json_object_get(h, "norm.weight"), "data_offsets");
    size_t at = 8 + hlen + (size_t)json_integer_value(json_array_get(off, 0)) + 5;
    json_decref(h);
    buf[at] ^= 0x10;
    write_all(st_file(dir), buf, len);
    free(buf);
}

/* Changes the header's last byte, which is JSON whitespace (padding or the closing brace's
 * neighbour): a valid file with intact tensors that only the file checksum (of the header's
 * bytes) can catch. */
static void damage_header_padding(const char *dir)
{
    size_t len = 0;
    uint8_t *buf = read_all(st_file(dir), &len);
    uint64_t hlen = le64(buf);
    GT_CHECK(buf[8 + hlen - 1] == ' ');
    buf[8 + hlen - 1] = '\t';
    write_all(st_file(dir), buf, len);
    free(buf);
}

static void damage_no_manifest(const char *dir)
{
    remove(manifest_file(dir));
}

static void damage_bad_json(const char *dir)
{
    write_all(manifest_file(dir), "{\"format\": \"graphtrain-checkpoint\", ", 36);
}

static void damage_manifest_type(const char *dir)
{
    size_t len = 0;
    char *text = (char *)read_all(manifest_file(dir), &len);
    json_t *root = json_loads(text, 0, NULL);
    json_object_set_new(root, "step", json_string("10"));
    char *out = json_dumps(root, 0);
    write_all(manifest_file(dir), out, strlen(out));
    free(out);
    json_decref(root);
    free(text);
}

/* Rewrites the manifest as version 1, whose file checksum is of the whole file: with that
 * checksum (whole), or keeping version 2's (a version-1 reader's view of a damaged file). */
static void set_version1(const char *dir, bool whole)
{
    size_t len = 0, flen = 0;
    char *text = (char *)read_all(manifest_file(dir), &len);
    uint8_t *file = read_all(st_file(dir), &flen);
    json_t *root = json_loads(text, 0, NULL);
    json_object_set_new(root, "version", json_integer(1));
    if (whole) {
        char hex[17];
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)XXH64(file, flen, 0));
        json_t *f = json_object_get(json_object_get(root, "files"), "model.safetensors");
        json_object_set_new(f, "xxh64", json_string(hex));
    }
    char *out = json_dumps(root, 0);
    write_all(manifest_file(dir), out, strlen(out));
    free(out);
    json_decref(root);
    free(file);
    free(text);
}

static void damage_version1_hash(const char *dir)
{
    set_version1(dir, false);
}

/* A version-1 checkpoint (whole-file checksum) still loads, bitwise. */
static void test_version1(void)
{
    model_state src, dst;
    state_init(&src, 31);
    char folder[256];
    snprintf(folder, sizeof folder, "%s", path_of("v1"));
    gt_checkpoint_desc d = basic_desc(folder, 5, &src);
    save_ok(&d, &src);
    char dir[300];
    snprintf(dir, sizeof dir, "%s/step-5", folder);
    set_version1(dir, true);
    state_blank(&dst, 0x77);
    gt_checkpoint_model m = tiny_model(&src);
    gt_checkpoint_info info;
    gt_error err = {0};
    EXPECT_OK(gt_checkpoint_load(folder, 5, &m, N_TENSORS, k_names, dst.mut, &info, &err), &err);
    EXPECT(state_equal(&src, &dst, N_TENSORS) && info.version == 1,
           "version 1 loads bitwise (manifest version %d)", info.version);
    gt_checkpoint_info_free(&info);
    state_free(&src);
    state_free(&dst);
}

/* The several-reader API: open checks no data; verify names a damaged tensor and passes the
 * others; read returns the saved bytes of any range; unchanged notices a rewritten file. */
static void test_reader(void)
{
    model_state src;
    state_init(&src, 41);
    char folder[256];
    snprintf(folder, sizeof folder, "%s", path_of("reader"));
    gt_checkpoint_desc d = basic_desc(folder, 6, &src);
    save_ok(&d, &src);
    gt_checkpoint_model m = tiny_model(&src);
    gt_checkpoint_reader r;
    gt_error err = {0};
    EXPECT_OK(gt_checkpoint_open(folder, 6, &m, N_TENSORS, k_names, src.ptrs, &r, &err), &err);
    for (int k = 0; k < r.info.n_tensors; k++)
        EXPECT_OK(gt_checkpoint_verify(&r, k, &err), &err);
    EXPECT_OK(gt_checkpoint_verify_file(&r, &err), &err);
    for (int i = 0; i < N_TENSORS; i++) { /* every tensor in two pieces, the second first */
        size_t n = gt_tensor_nbytes(&src.t[i]), half = n / 2;
        uint8_t *got = malloc(n + 1);
        EXPECT_OK(gt_checkpoint_read(&r, i, half, got + half, n - half, &err), &err);
        EXPECT_OK(gt_checkpoint_read(&r, i, 0, got, half, &err), &err);
        EXPECT(memcmp(got, src.t[i].data, n) == 0, "reader: tensor %s read back differs",
               k_names[i]);
        free(got);
    }
    EXPECT_OK(gt_checkpoint_unchanged(&r, &err), &err);
    gt_checkpoint_close(&r);

    char dir[300];
    snprintf(dir, sizeof dir, "%s/step-6", folder);
    damage_flip_data(dir); /* a byte of norm.weight */
    EXPECT_OK(gt_checkpoint_open(folder, 6, &m, N_TENSORS, k_names, src.ptrs, &r, &err), &err);
    int bad = 0, named = 0;
    for (int k = 0; k < r.info.n_tensors; k++) {
        err = (gt_error){0};
        if (gt_checkpoint_verify(&r, k, &err) != GT_OK) {
            bad++;
            named += strstr(err.msg, "\"norm.weight\"") && strstr(err.msg, "checksum mismatch");
        }
    }
    EXPECT(bad == 1 && named == 1, "reader: %d tensors failed verification (%d named norm.weight)",
           bad, named);
    /* the file rewritten while open: same size, another modification time */
    size_t len = 0;
    uint8_t *bytes = read_all(st_file(dir), &len);
    struct timespec pause = {0, 20000000};
    nanosleep(&pause, NULL);
    write_all(st_file(dir), bytes, len);
    free(bytes);
    err = (gt_error){0};
    EXPECT(gt_checkpoint_unchanged(&r, &err) == GT_ERR_IO &&
               strstr(err.msg, "changed while it was being loaded"),
           "reader: a rewritten file gives %s", err.msg);
    gt_checkpoint_close(&r);
    state_free(&src);
}

static void damage_rename_dir(const char *dir)
{
    char to[512];
    snprintf(to, sizeof to, "%.*s/step-11", (int)(strrchr(dir, '/') - dir), dir);
    GT_CHECK(rename(dir, to) == 0);
}

static void damage_none(const char *dir)
{
    (void)dir;
}

static void run_corruption(const corruption_case *c, int index, const char *const *names,
                           const gt_tensor *const *expect, const gt_checkpoint_model *model)
{
    char folder[256];
    snprintf(folder, sizeof folder, "%s/corrupt-%d", g_root, index);
    model_state s;
    state_init(&s, 9);
    gt_checkpoint_desc d = basic_desc(folder, 10, &s);
    save_ok(&d, &s);
    char dir[300];
    snprintf(dir, sizeof dir, "%s/step-10", folder);
    c->damage(dir);

    /* Destination tensors shaped like `expect`, filled with a sentinel. */
    gt_tensor dst[N_TENSORS];
    gt_tensor *dst_ptrs[N_TENSORS];
    gt_error err = {0};
    for (int i = 0; i < N_TENSORS; i++) {
        GT_CHECK(gt_tensor_alloc(&dst[i], expect[i]->dtype, expect[i]->ndim, expect[i]->shape,
                                 &err) == GT_OK);
        memset(dst[i].data, 0x5A, gt_tensor_nbytes(&dst[i]));
        dst_ptrs[i] = &dst[i];
    }
    gt_checkpoint_info info;
    memset(&info, 0, sizeof info);
    gt_status st = gt_checkpoint_load(folder, c->step ? c->step : 10, model, N_TENSORS, names,
                                      dst_ptrs, &info, &err);
    EXPECT(st != GT_OK, "%s: load refused", c->what);
    EXPECT(strstr(err.msg, c->expect_1) && (!c->expect_2 || strstr(err.msg, c->expect_2)),
           "%s: message names \"%s\" and \"%s\": %s", c->what, c->expect_1,
           c->expect_2 ? c->expect_2 : "", err.msg);
    bool untouched = info.model_name == NULL && info.n_tensors == 0;
    for (int i = 0; i < N_TENSORS; i++) {
        const uint8_t *p = dst[i].data;
        for (size_t b = 0; b < gt_tensor_nbytes(&dst[i]); b++)
            untouched &= p[b] == 0x5A;
        gt_tensor_free(&dst[i]);
    }
    EXPECT(untouched, "%s: caller tensors and info untouched", c->what);
    state_free(&s);
}

static void test_corruption(void)
{
    model_state s;
    state_init(&s, 9);
    gt_checkpoint_model model = tiny_model(&s);
    const gt_tensor *const *good = s.ptrs;

    /* The header-padding case needs a header with a trailing space; the writer pads to 8 bytes,
     * so check the layout of a sample first and skip the case if it has no padding. */
    char probe[256];
    snprintf(probe, sizeof probe, "%s/probe", g_root);
    gt_checkpoint_desc pd = basic_desc(probe, 10, &s);
    save_ok(&pd, &s);
    size_t len = 0;
    uint8_t *buf = read_all(path_of("probe/step-10/model.safetensors"), &len);
    bool has_padding = buf && buf[8 + le64(buf) - 1] == ' ';
    free(buf);

    const corruption_case cases[] = {
        {"truncated safetensors", damage_truncate, "step-10/model.safetensors", "truncated", 0},
        {"appended byte", damage_append, "step-10/model.safetensors", "overwritten", 0},
        {"flipped data byte", damage_flip_data, "\"norm.weight\"", "checksum mismatch", 0},
        {"manifest missing", damage_no_manifest, "step-10/manifest.json", "incomplete", 0},
        {"manifest bad JSON", damage_bad_json, "step-10/manifest.json", "invalid JSON", 0},
        {"manifest wrong type", damage_manifest_type, "step-10/manifest.json",
         "\"step\" must be a non-negative integer", 0},
        {"manifest in the wrong directory", damage_rename_dir, "records step 10",
         "directory of step 11", 11},
        {"version 1 with a version-2 file checksum", damage_version1_hash,
         "step-10/model.safetensors", "the file is corrupt", 0},
        {"header padding changed", damage_header_padding, "step-10/model.safetensors",
         "the file is corrupt", 0},
    };
    int n_cases = (int)(sizeof cases / sizeof cases[0]) - (has_padding ? 0 : 1);
    if (!has_padding) printf("note: header has no padding byte; skipping that case\n");
    for (int i = 0; i < n_cases; i++)
        run_corruption(&cases[i], i, k_names, good, &model);

    /* Mismatches: another model, a missing tensor, another shape, another dtype. */
    int base = n_cases;
    gt_checkpoint_model gqa = {"llama3", "test_gqa", model.fingerprint ^ 1};
    corruption_case mismatch = {"other model", damage_none,
                                "is for model llama3/test_tiny (fingerprint",
                                "this run is "
                                "llama3/test_gqa",
                                0};
    run_corruption(&mismatch, base++, k_names, good, &gqa);
    gt_checkpoint_model same_name = {"llama3", "test_tiny", model.fingerprint ^ 1};
    mismatch.what = "other fingerprint";
    mismatch.expect_2 = "names, dtypes or shapes differ";
    run_corruption(&mismatch, base++, k_names, good, &same_name);

    const char *names[N_TENSORS];
    memcpy(names, k_names, sizeof names);
    names[3] = "optim.exp_avg_sq.layers.0.attention.wq.weight";
    corruption_case missing = {"missing tensor", damage_none,
                               "\"optim.exp_avg_sq.layers.0.attention.wq.weight\" is missing",
                               "step-10/model.safetensors", 0};
    run_corruption(&missing, base++, names, good, &model);

    gt_tensor transposed;
    gt_tensor_wrap(&transposed, GT_F32, 2, (int64_t[]){4, 8}, NULL);
    const gt_tensor *shapes[N_TENSORS];
    memcpy(shapes, good, sizeof shapes);
    shapes[0] = &transposed;
    corruption_case shape = {"wrong shape", damage_none, "\"tok_embeddings.weight\"",
                             "expected f32[4, 8], found f32[8, 4]", 0};
    run_corruption(&shape, base++, k_names, shapes, &model);

    gt_tensor as_bf16;
    gt_tensor_wrap(&as_bf16, GT_BF16, 1, (int64_t[]){4}, NULL);
    memcpy(shapes, good, sizeof shapes);
    shapes[2] = &as_bf16;
    corruption_case dtype = {"wrong dtype", damage_none, "\"norm.weight\"",
                             "expected bf16[4], found f32[4]", 0};
    run_corruption(&dtype, base++, k_names, shapes, &model);
    state_free(&s);
}

/* ---------------------------------------------------------------- manifest corpus */

/* The fuzz corpus doubles as a table of cases: good_* must parse, broken_* must be refused with
 * the file named in the message. */
static void test_manifest_corpus(void)
{
    const char *dir = gt_test_path("tests/fuzz/corpus/checkpoint_manifest");
    char dirbuf[4096];
    snprintf(dirbuf, sizeof dirbuf, "%s", dir);
    DIR *d = opendir(dirbuf);
    EXPECT(d != NULL, "corpus directory %s", dirbuf);
    int n_good = 0, n_broken = 0;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        bool good = strncmp(e->d_name, "good_", 5) == 0;
        bool broken = strncmp(e->d_name, "broken_", 7) == 0;
        if (!good && !broken) continue;
        char path[4400];
        snprintf(path, sizeof path, "%s/%s", dirbuf, e->d_name);
        size_t len = 0;
        char *text = (char *)read_all(path, &len);
        gt_checkpoint_info info;
        gt_error err = {0};
        gt_status st = gt_checkpoint_manifest_parse(path, text, len, &info, &err);
        if (good) {
            EXPECT(st == GT_OK, "%s parses: %s", e->d_name, err.msg);
            if (st == GT_OK) gt_checkpoint_info_free(&info);
            n_good++;
        } else {
            EXPECT(st == GT_ERR_FORMAT && strstr(err.msg, path), "%s refused naming it: %s",
                   e->d_name, err.msg);
            n_broken++;
        }
        free(text);
    }
    if (d) closedir(d);
    EXPECT(n_good >= 3 && n_broken >= 30, "corpus has %d good and %d broken cases", n_good,
           n_broken);
}

/* ---------------------------------------------------------------- crash safety */

#define BIG_WORDS (1 << 20) /* 4 MiB per tensor, two tensors */
#define CRASH_ROUNDS 24
static const char *const k_big_names[2] = {"big.a", "big.b"};

static void big_fill(gt_tensor *t, int which, int64_t step)
{
    uint32_t *p = t->data;
    for (uint32_t i = 0; i < BIG_WORDS; i++)
        p[i] = i * 2654435761u ^ (uint32_t)step * 40503u ^ (uint32_t)which;
}

static bool big_matches(const gt_tensor *t, int which, int64_t step)
{
    const uint32_t *p = t->data;
    for (uint32_t i = 0; i < BIG_WORDS; i++)
        if (p[i] != (i * 2654435761u ^ (uint32_t)step * 40503u ^ (uint32_t)which)) return false;
    return true;
}

static gt_checkpoint_desc big_desc(const char *folder, int64_t step, const gt_tensor *const *ts)
{
    gt_checkpoint_desc d = {0};
    d.folder = folder;
    d.step = step;
    d.model = (gt_checkpoint_model){"big", "x", gt_checkpoint_fingerprint(2, k_big_names, ts)};
    d.rng_seed = step;
    d.keep_last = 2;
    return d;
}

/* The child: save steps first, first + 1, ... until killed. */
static void crash_child(const char *folder, int64_t first, gt_tensor *big, const gt_tensor **ptrs)
{
    for (int64_t step = first;; step++) {
        big_fill(&big[0], 0, step);
        big_fill(&big[1], 1, step);
        gt_checkpoint_desc d = big_desc(folder, step, ptrs);
        gt_error err = {0};
        if (gt_checkpoint_save(&d, 2, k_big_names, ptrs, &err) != GT_OK) {
            fprintf(stderr, "child: %s\n", err.msg);
            _exit(3);
        }
    }
}

/* Every step-* directory on disk must load with exactly step N's contents. Returns the latest. */
static int64_t crash_verify(const char *folder, gt_tensor *big, gt_tensor **mut,
                            const gt_tensor **ptrs)
{
    DIR *dir = opendir(folder);
    int64_t latest = GT_CHECKPOINT_NONE;
    struct dirent *e;
    gt_checkpoint_model model = {"big", "x", gt_checkpoint_fingerprint(2, k_big_names, ptrs)};
    while (dir && (e = readdir(dir))) {
        if (strncmp(e->d_name, "step-", 5) != 0) continue;
        int64_t step = atoll(e->d_name + 5);
        gt_error err = {0};
        memset(big[0].data, 0, gt_tensor_nbytes(&big[0]));
        gt_status st = gt_checkpoint_load(folder, step, &model, 2, k_big_names, mut, NULL, &err);
        EXPECT(st == GT_OK, "crash: %s loads: %s", e->d_name, err.msg);
        EXPECT(st == GT_OK && big_matches(&big[0], 0, step) && big_matches(&big[1], 1, step),
               "crash: %s holds step %lld's data", e->d_name, (long long)step);
        if (step > latest) latest = step;
    }
    if (dir) closedir(dir);
    int64_t found = 0;
    gt_error err = {0};
    EXPECT_OK(gt_checkpoint_find_latest(folder, &found, &err), &err);
    EXPECT(found == latest, "crash: latest %lld is the highest step directory %lld",
           (long long)found, (long long)latest);
    return latest;
}

/* Whether the writer `pid` left a .tmp-*-<pid> directory behind. */
static bool has_tmp_of(const char *folder, pid_t pid)
{
    char suffix[32];
    int n = snprintf(suffix, sizeof suffix, "-%ld", (long)pid);
    DIR *d = opendir(folder);
    bool found = false;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        size_t len = strlen(e->d_name);
        found |= strncmp(e->d_name, ".tmp-", 5) == 0 && len > (size_t)n &&
                 strcmp(e->d_name + len - (size_t)n, suffix) == 0;
    }
    if (d) closedir(d);
    return found;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void test_crash(void)
{
    char folder[512];
    snprintf(folder, sizeof folder, "%s", path_of("crash"));
    gt_tensor big[2];
    gt_tensor *mut[2] = {&big[0], &big[1]};
    const gt_tensor *ptrs[2] = {&big[0], &big[1]};
    gt_error err = {0};
    for (int i = 0; i < 2; i++)
        GT_CHECK(gt_tensor_alloc(&big[i], GT_F32, 1, (int64_t[]){BIG_WORDS}, &err) == GT_OK);

    /* Step 0 is saved by us, so there is always something to resume from. The save's duration
     * only scales the kill points so that they land before, inside and between saves. */
    big_fill(&big[0], 0, 0);
    big_fill(&big[1], 1, 0);
    gt_checkpoint_desc d = big_desc(folder, 0, ptrs);
    double t0 = now_s();
    EXPECT_OK(gt_checkpoint_save(&d, 2, k_big_names, ptrs, &err), &err);
    double save_s = now_s() - t0;

    uint32_t rng = 12345;
    int64_t latest = 0;
    int inside_save = 0; /* kills that left a .tmp-* behind, i.e. landed inside a save */
    for (int round = 0; round < CRASH_ROUNDS; round++) {
        pid_t pid = fork();
        GT_CHECK(pid >= 0);
        if (pid == 0) crash_child(folder, latest + 1, big, ptrs);
        rng = rng * 1103515245u + 12345u;
        double frac = (double)(rng >> 8) / (double)(1u << 24); /* [0, 1) */
        usleep((useconds_t)(frac * 3.0 * save_s * 1e6));
        kill(pid, SIGKILL);
        int wstatus = 0;
        waitpid(pid, &wstatus, 0);
        EXPECT(WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGKILL,
               "crash: child killed, not failed (status %d)", wstatus);
        inside_save += has_tmp_of(folder, pid);
        int64_t now = crash_verify(folder, big, mut, ptrs);
        EXPECT(now >= latest, "crash: latest went from %lld back to %lld", (long long)latest,
               (long long)now);
        latest = now;
    }
    /* The next save cleans every leftover of the killed writers. */
    big_fill(&big[0], 0, latest + 1);
    big_fill(&big[1], 1, latest + 1);
    d = big_desc(folder, latest + 1, ptrs);
    EXPECT_OK(gt_checkpoint_save(&d, 2, k_big_names, ptrs, &err), &err);
    EXPECT(count_entries(folder, ".tmp-") == 0 && count_entries(folder, "") == 2,
           "crash: after a clean save only the last 2 steps remain (%d entries)",
           count_entries(folder, ""));
    printf("crash test: %d of %d kills landed inside a save; latest step %lld\n", inside_save,
           CRASH_ROUNDS, (long long)latest);
    gt_tensor_free(&big[0]);
    gt_tensor_free(&big[1]);
}

int main(void)
{
    snprintf(g_root, sizeof g_root, "/tmp/gt_ckpt_XXXXXX");
    if (!mkdtemp(g_root)) {
        perror("mkdtemp");
        return 1;
    }
    test_round_trip();
    test_save_from();
    test_writers();
    test_version1();
    test_reader();
    test_fingerprint();
    test_keep_last();
    test_find();
    test_stale_tmp();
    test_bad_save_args();
    test_corruption();
    test_manifest_corpus();
    test_crash();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_root);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_root);
    return gt_test_finish();
}
