/* test_safetensors.c — safetensors reader and writer.
 *
 * References used instead of the code under test:
 *   - round trips compare against the bytes we put in and the raw file layout read by hand;
 *   - interop reads files written by the Python `safetensors` package and compares each tensor
 *     with the bytes numpy/torch wrote into the sidecar text file;
 *   - every named broken file (tools/gen_broken_safetensors.py) must fail with the expected
 *     reason and the file path in the message.
 * Set GT_SAFETENSORS_EXPORT=FILE to keep the re-written good file for
 * `python3 tools/gen_broken_safetensors.py --verify-written FILE` (manual interop check). */
#include "graphtrain/gt_safetensors.h"
#include "gt_test.h"

#include <dirent.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---------------------------------------------------------------- helpers */

static char g_tmpdir[64];

static char *tmp_path(const char *name)
{
    static char buf[256];
    snprintf(buf, sizeof buf, "%s/%s", g_tmpdir, name);
    return buf;
}

static uint8_t *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc(n > 0 ? (size_t)n + 1 : 1);
    *len = fread(buf, 1, (size_t)n, f);
    buf[*len] = 0;
    fclose(f);
    return buf;
}

static bool file_exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0;
}

static bool no_temp_left(const char *path)
{
    char tmp[512];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    return !file_exists(tmp);
}

static uint64_t le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* An in-memory safetensors file: length field + header + data. */
static uint8_t *make_file(const char *header, const void *data, size_t data_len, size_t *len)
{
    size_t h = strlen(header);
    *len = 8 + h + data_len;
    uint8_t *buf = malloc(*len);
    for (int i = 0; i < 8; i++)
        buf[i] = (uint8_t)((uint64_t)h >> (8 * i));
    memcpy(buf + 8, header, h);
    if (data_len) memcpy(buf + 8 + h, data, data_len);
    return buf;
}

/* ---------------------------------------------------------------- round trip */

static void test_roundtrip(void)
{
    gt_error err = {0};
    enum { NT = 9 };
    gt_tensor t[NT];
    const char *names[NT] = {"f32",  "bf16_all", "f16_all", "i32",       "i64",
                             "bool", "scalar",   "empty",   "empty_null"};
    int64_t s_f32[] = {2, 3}, s_all[] = {256, 256}, s_i32[] = {4}, s_i64[] = {2, 2}, s_bool[] = {5},
            s_empty[] = {3, 0, 2};
    EXPECT_OK(gt_tensor_alloc(&t[0], GT_F32, 2, s_f32, &err), &err);
    EXPECT_OK(gt_tensor_alloc(&t[1], GT_BF16, 2, s_all, &err), &err);
    EXPECT_OK(gt_tensor_alloc(&t[2], GT_F16, 2, s_all, &err), &err);
    EXPECT_OK(gt_tensor_alloc(&t[3], GT_I32, 1, s_i32, &err), &err);
    EXPECT_OK(gt_tensor_alloc(&t[4], GT_I64, 2, s_i64, &err), &err);
    EXPECT_OK(gt_tensor_alloc(&t[5], GT_BOOL, 1, s_bool, &err), &err);
    EXPECT_OK(gt_tensor_alloc(&t[6], GT_F32, 0, NULL, &err), &err);
    EXPECT_OK(gt_tensor_alloc(&t[7], GT_I64, 3, s_empty, &err), &err);
    gt_tensor_wrap(&t[8], GT_BF16, 3, s_empty, NULL); /* no data needed for 0 elements */

    /* f32 bit patterns: 1, -0, +inf, quiet NaN with payload, smallest subnormal, max finite. */
    const uint32_t f32_bits[6] = {0x3f800000u, 0x80000000u, 0x7f800000u,
                                  0x7fc01234u, 0x00000001u, 0x7f7fffffu};
    memcpy(t[0].data, f32_bits, sizeof f32_bits);
    /* Every 16-bit pattern once: bf16 ascending, f16 descending. */
    for (uint32_t i = 0; i < 65536; i++) {
        ((uint16_t *)t[1].data)[i] = (uint16_t)i;
        ((uint16_t *)t[2].data)[i] = (uint16_t)(65535 - i);
    }
    const int32_t i32v[4] = {INT32_MIN, INT32_MAX, 0, -1};
    memcpy(t[3].data, i32v, sizeof i32v);
    const int64_t i64v[4] = {INT64_MIN, INT64_MAX, -1, 1};
    memcpy(t[4].data, i64v, sizeof i64v);
    const uint8_t boolv[5] = {1, 0, 0, 1, 1};
    memcpy(t[5].data, boolv, sizeof boolv);
    *(float *)t[6].data = 2.5f;

    const char *mk[3] = {"format", "unicode", "tricky"};
    const char *mv[3] = {"pt", "\xc3\xa9\xe2\x82\xac", "quote \" backslash \\ newline\n tab\t"};
    const gt_tensor *tp[NT];
    for (int i = 0; i < NT; i++)
        tp[i] = &t[i];

    const char *path = tmp_path("rt.safetensors");
    EXPECT_OK(gt_safetensors_write(path, NT, names, tp, 3, mk, mv, &err), &err);
    EXPECT(no_temp_left(path), "temporary file left behind for %s", path);

    /* Layout read by hand: N, header padded to a multiple of 8 with spaces, data contiguous in
     * the given order. */
    size_t flen = 0;
    uint8_t *raw = read_all(path, &flen);
    EXPECT(raw && flen >= 8, "cannot read %s", path);
    if (raw && flen >= 8) {
        uint64_t n = le64(raw);
        EXPECT((8 + n) % 8 == 0, "header length %llu not 8-aligned", (unsigned long long)n);
        EXPECT(n <= flen - 8, "header length past end");
        EXPECT(raw[8] == '{', "header must start with '{'");
        size_t total = 0;
        for (int i = 0; i < NT; i++)
            total += gt_tensor_nbytes(&t[i]);
        EXPECT(flen - 8 - n == total, "data section %zu bytes, expected %zu",
               (size_t)(flen - 8 - n), total);
        /* Header text: metadata first, then names in the given order; padding is spaces. */
        char *hdr = strndup((const char *)raw + 8, (size_t)n);
        const char *prev = strstr(hdr, "\"__metadata__\"");
        EXPECT(prev != NULL, "no __metadata__ in header");
        for (int i = 0; i < NT && prev; i++) {
            char key[64];
            snprintf(key, sizeof key, "\"%s\":", names[i]);
            const char *at = strstr(hdr, key);
            EXPECT(at && at > prev, "tensor %s not in the given order", names[i]);
            prev = at;
        }
        const char *end = strrchr(hdr, '}');
        for (const char *p = end ? end + 1 : hdr; *p; p++)
            EXPECT(*p == ' ', "header padding byte 0x%02x is not a space", (unsigned)*p);
        free(hdr);
        size_t off = 8 + (size_t)n;
        for (int i = 0; i < NT; i++) {
            size_t nb = gt_tensor_nbytes(&t[i]);
            EXPECT(nb == 0 || memcmp(raw + off, t[i].data, nb) == 0, "raw bytes of %s", names[i]);
            off += nb;
        }
    }
    free(raw);

    gt_safetensors st;
    EXPECT_OK(gt_safetensors_open(path, &st, &err), &err);
    EXPECT(st.n_entries == NT, "n_entries %d", st.n_entries);
    uint64_t expect_begin = 0;
    for (int i = 0; i < NT && i < st.n_entries; i++) {
        const gt_st_entry *e = &st.entries[i];
        EXPECT(strcmp(e->name, names[i]) == 0, "entry %d is %s, expected %s", i, e->name, names[i]);
        EXPECT(e->begin == expect_begin, "entry %s begins at %llu", names[i],
               (unsigned long long)e->begin);
        expect_begin = e->end;
        gt_tensor got;
        EXPECT_OK(gt_safetensors_get(&st, names[i], &got, &err), &err);
        EXPECT(got.dtype == t[i].dtype && got.ndim == t[i].ndim, "type of %s", names[i]);
        for (int d = 0; d < t[i].ndim; d++)
            EXPECT(got.shape[d] == t[i].shape[d], "shape of %s dim %d", names[i], d);
        size_t nb = gt_tensor_nbytes(&t[i]);
        EXPECT(gt_tensor_nbytes(&got) == nb, "nbytes of %s", names[i]);
        EXPECT(nb == 0 || memcmp(got.data, t[i].data, nb) == 0, "bytes of %s", names[i]);
        EXPECT(got.owns_data, "get must return an owned copy");
        gt_tensor_free(&got);
    }
    EXPECT(st.n_meta == 3, "n_meta %d", st.n_meta);
    for (int i = 0; i < 3; i++) {
        const char *v = gt_safetensors_meta(&st, mk[i]);
        EXPECT(v && strcmp(v, mv[i]) == 0, "metadata %s = %s", mk[i], v ? v : "(null)");
    }
    EXPECT(gt_safetensors_meta(&st, "absent") == NULL, "absent metadata key found");
    EXPECT(gt_safetensors_find(&st, "nope") == NULL, "find of a missing name");
    gt_safetensors_close(&st);
    gt_safetensors_close(&st); /* closing twice is harmless */

    /* Lazily: the same entries, each tensor's bytes read from the file on demand; a file that
     * shrinks after the open is an IO error naming it, not a crash. */
    EXPECT_OK(gt_safetensors_open_lazy(path, &st, &err), &err);
    EXPECT(st.lazy && st.data == NULL && st.n_entries == NT && st.n_meta == 3,
           "lazy open: %d entries, %d metadata", st.n_entries, st.n_meta);
    for (int i = 0; i < NT && i < st.n_entries; i++) {
        const gt_st_entry *e = gt_safetensors_find(&st, names[i]);
        size_t nb = gt_tensor_nbytes(&t[i]);
        uint8_t *got = malloc(nb + 1);
        EXPECT(e && e->end - e->begin == nb, "lazy entry %s", names[i]);
        if (e) EXPECT_OK(gt_safetensors_read(&st, e, got, &err), &err);
        EXPECT(nb == 0 || memcmp(got, t[i].data, nb) == 0, "lazy bytes of %s", names[i]);
        free(got);
    }
    const gt_st_entry *last = NULL; /* the non-empty entry that ends last */
    for (int i = 0; i < st.n_entries; i++)
        if (st.entries[i].end > st.entries[i].begin && (!last || st.entries[i].end > last->end))
            last = &st.entries[i];
    EXPECT(truncate(path, (off_t)(st.data_offset + last->end - 1)) == 0, "truncate");
    uint8_t *tail = malloc((size_t)(last->end - last->begin) + 1);
    gt_error_clear(&err);
    EXPECT(gt_safetensors_read(&st, last, tail, &err) == GT_ERR_IO && strstr(err.msg, "shrank") &&
               strstr(err.msg, path),
           "a shrunk file: %s", err.msg);
    free(tail);
    gt_safetensors_close(&st);
    gt_safetensors_close(&st);
    EXPECT_OK(gt_safetensors_write(path, NT, names, tp, 3, mk, mv, &err), &err);

    /* Overwriting an existing file replaces it whole; no metadata means no __metadata__. */
    EXPECT_OK(gt_safetensors_write(path, 1, &names[3], &tp[3], 0, NULL, NULL, &err), &err);
    EXPECT_OK(gt_safetensors_open(path, &st, &err), &err);
    EXPECT(st.n_entries == 1 && st.n_meta == 0 && st.data_len == 16, "overwrite: %d entries",
           st.n_entries);
    gt_safetensors_close(&st);
    raw = read_all(path, &flen);
    EXPECT(raw && !strstr((const char *)raw + 8, "__metadata__"), "unexpected __metadata__");
    free(raw);

    /* Zero tensors: an empty object header. */
    EXPECT_OK(gt_safetensors_write(path, 0, NULL, NULL, 0, NULL, NULL, &err), &err);
    EXPECT_OK(gt_safetensors_open(path, &st, &err), &err);
    EXPECT(st.n_entries == 0 && st.data_len == 0, "empty file: %d entries", st.n_entries);
    gt_safetensors_close(&st);
    remove(path);
    for (int i = 0; i < NT; i++)
        gt_tensor_free(&t[i]);
}

/* A source for gt_safetensors_write_from: each tensor's own data, but the second fails. */
static gt_status fail_second(int i, const void **data, void *user, gt_error *err)
{
    (void)user;
    if (i == 1) return gt_error_set(err, GT_ERR_NOMEM, "second tensor withheld");
    *data = "\0\0\0\0\0\0\0\0";
    return GT_OK;
}

static void test_writer_errors(void)
{
    gt_error err = {0};
    int64_t s[] = {2};
    gt_tensor a, b;
    EXPECT_OK(gt_tensor_alloc(&a, GT_F32, 1, s, &err), &err);
    EXPECT_OK(gt_tensor_alloc(&b, GT_I32, 1, s, &err), &err);
    const gt_tensor *tp[2] = {&a, &b};
    const char *path = tmp_path("bad.safetensors");
    struct {
        const char *names[2];
        const char *want;
    } cases[] = {
        {{"x", "x"}, "\"x\" is used twice"},   {{"x", ""}, "empty name"},
        {{NULL, "y"}, "empty name"},           {{"__metadata__", "y"}, "reserved"},
        {{"x", "bad\xff"}, "not valid UTF-8"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        gt_error_clear(&err);
        gt_status s2 = gt_safetensors_write(path, 2, cases[i].names, tp, 0, NULL, NULL, &err);
        EXPECT(s2 == GT_ERR_INVALID, "case %zu: %s", i, gt_status_name(s2));
        EXPECT(strstr(err.msg, cases[i].want) && strstr(err.msg, path), "case %zu: %s", i, err.msg);
        EXPECT(!file_exists(path) && no_temp_left(path), "case %zu left a file", i);
    }
    /* Duplicate metadata keys. */
    const char *mk[2] = {"k", "k"}, *mv[2] = {"1", "2"}, *nm[1] = {"x"};
    gt_error_clear(&err);
    EXPECT(gt_safetensors_write(path, 1, nm, tp, 2, mk, mv, &err) == GT_ERR_INVALID, "dup meta");
    EXPECT(strstr(err.msg, "duplicate metadata key \"k\""), "%s", err.msg);
    /* A tensor with a bad dtype. */
    gt_tensor c = a;
    c.dtype = GT_DTYPE_COUNT;
    const gt_tensor *cp[1] = {&c};
    gt_error_clear(&err);
    EXPECT(gt_safetensors_write(path, 1, nm, cp, 0, NULL, NULL, &err) == GT_ERR_INVALID,
           "bad dtype accepted");
    /* A streaming source that fails at the second tensor: its error as it is, nothing left. */
    gt_error_clear(&err);
    const char *two[2] = {"x", "y"};
    EXPECT(gt_safetensors_write_from(path, 2, two, tp, fail_second, NULL, 0, NULL, NULL, &err) ==
                   GT_ERR_NOMEM &&
               strstr(err.msg, "second tensor withheld"),
           "failing source: %s", err.msg);
    EXPECT(!file_exists(path) && no_temp_left(path), "a failing source left a file");
    /* A directory that does not exist: IO error naming the path, nothing left behind. */
    const char *missing = tmp_path("no_such_dir/x.safetensors");
    gt_error_clear(&err);
    EXPECT(gt_safetensors_write(missing, 1, nm, tp, 0, NULL, NULL, &err) == GT_ERR_IO, "io");
    EXPECT(strstr(err.msg, missing) != NULL, "%s", err.msg);
    /* Renaming over a directory fails after the temporary file was written: it is removed. */
    const char *dir = tmp_path("a_dir.safetensors");
    mkdir(dir, 0755);
    gt_error_clear(&err);
    EXPECT(gt_safetensors_write(dir, 1, nm, tp, 0, NULL, NULL, &err) == GT_ERR_IO, "rename");
    EXPECT(strstr(err.msg, dir) && strstr(err.msg, "rename"), "%s", err.msg);
    EXPECT(no_temp_left(dir), "temporary file left after a failed rename");
    rmdir(dir);
    gt_tensor_free(&a);
    gt_tensor_free(&b);
}

/* ---------------------------------------------------------------- interop with Python */

typedef struct {
    char name[128], dtype[8];
    int ndim;
    int64_t shape[GT_MAX_DIMS];
    uint8_t *bytes;
    size_t nbytes;
} sidecar_tensor;

static size_t hex_decode(const char *hex, uint8_t **out)
{
    size_t n = strcmp(hex, "-") == 0 ? 0 : strlen(hex) / 2;
    *out = malloc(n + 1);
    for (size_t i = 0; i < n; i++) {
        unsigned v = 0;
        sscanf(hex + 2 * i, "%2x", &v);
        (*out)[i] = (uint8_t)v;
    }
    (*out)[n] = 0;
    return n;
}

/* Checks st against the sidecar; returns the tensors (for re-writing), count in *n. */
static sidecar_tensor *check_sidecar(const gt_safetensors *st, const char *sidecar_rel, int *n)
{
    size_t len = 0;
    char *text = (char *)read_all(gt_test_path(sidecar_rel), &len);
    EXPECT(text != NULL, "cannot read sidecar %s", sidecar_rel);
    *n = 0;
    if (!text) return NULL;
    sidecar_tensor *ts = calloc(64, sizeof *ts);
    int n_meta = 0;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char *tok_save = NULL, *kind = strtok_r(line, " ", &tok_save);
        if (!kind || kind[0] == '#') continue;
        if (strcmp(kind, "meta") == 0) {
            uint8_t *k, *v;
            hex_decode(strtok_r(NULL, " ", &tok_save), &k);
            hex_decode(strtok_r(NULL, " ", &tok_save), &v);
            const char *got = gt_safetensors_meta(st, (const char *)k);
            EXPECT(got && strcmp(got, (const char *)v) == 0, "%s: metadata %s", sidecar_rel, k);
            free(k);
            free(v);
            n_meta++;
        } else if (strcmp(kind, "tensor") == 0 && *n < 64) {
            sidecar_tensor *s = &ts[(*n)++];
            snprintf(s->name, sizeof s->name, "%s", strtok_r(NULL, " ", &tok_save));
            snprintf(s->dtype, sizeof s->dtype, "%s", strtok_r(NULL, " ", &tok_save));
            s->ndim = atoi(strtok_r(NULL, " ", &tok_save));
            for (int d = 0; d < s->ndim; d++)
                s->shape[d] = atoll(strtok_r(NULL, " ", &tok_save));
            s->nbytes = hex_decode(strtok_r(NULL, " ", &tok_save), &s->bytes);
        }
    }
    free(text);
    EXPECT(st->n_meta == n_meta, "%s: %d metadata keys, sidecar has %d", sidecar_rel, st->n_meta,
           n_meta);
    EXPECT(st->n_entries == *n, "%s: %d tensors, sidecar has %d", sidecar_rel, st->n_entries, *n);
    static const char *st_names[GT_DTYPE_COUNT] = {"F32", "BF16", "F16", "I32", "I64", "BOOL"};
    gt_error err = {0};
    for (int i = 0; i < *n; i++) {
        sidecar_tensor *s = &ts[i];
        gt_tensor got;
        gt_error_clear(&err);
        EXPECT_OK(gt_safetensors_get(st, s->name, &got, &err), &err);
        if (!got.data) continue;
        EXPECT(strcmp(st_names[got.dtype], s->dtype) == 0, "%s: dtype %s", s->name, s->dtype);
        EXPECT(got.ndim == s->ndim, "%s: ndim %d vs %d", s->name, got.ndim, s->ndim);
        for (int d = 0; d < s->ndim && d < got.ndim; d++)
            EXPECT(got.shape[d] == s->shape[d], "%s: dim %d", s->name, d);
        EXPECT(gt_tensor_nbytes(&got) == s->nbytes, "%s: %zu bytes", s->name, s->nbytes);
        EXPECT(s->nbytes == 0 || memcmp(got.data, s->bytes, s->nbytes) == 0, "%s: bytes differ",
               s->name);
        gt_tensor_free(&got);
    }
    return ts;
}

static void free_sidecar(sidecar_tensor *ts, int n)
{
    for (int i = 0; i < n; i++)
        free(ts[i].bytes);
    free(ts);
}

static void test_interop(void)
{
    gt_error err = {0};
    gt_safetensors st;
    EXPECT_OK(gt_safetensors_open(gt_test_path("tests/fixtures/safetensors_good_bf16.safetensors"),
                                  &st, &err),
              &err);
    int n = 0;
    sidecar_tensor *ts = check_sidecar(&st, "tests/fixtures/safetensors_good_bf16.txt", &n);
    free_sidecar(ts, n);
    gt_safetensors_close(&st);

    EXPECT_OK(
        gt_safetensors_open(gt_test_path("tests/fixtures/safetensors_good.safetensors"), &st, &err),
        &err);
    ts = check_sidecar(&st, "tests/fixtures/safetensors_good.txt", &n);
    /* A known value derivable without the sidecar: a_f32 = arange(24) * 0.5 - 3. */
    gt_tensor a;
    EXPECT_OK(gt_safetensors_get(&st, "a_f32", &a, &err), &err);
    for (int64_t i = 0; a.data && i < 24; i++)
        EXPECT(((float *)a.data)[i] == (float)i * 0.5f - 3.0f, "a_f32[%lld]", (long long)i);
    gt_tensor_free(&a);

    /* Write the same tensors back in sidecar order with our writer and read them again. */
    const char *env = getenv("GT_SAFETENSORS_EXPORT");
    const char *out = env && env[0] ? env : tmp_path("rewritten.safetensors");
    const char **names = calloc((size_t)n + 1, sizeof *names);
    gt_tensor *tens = calloc((size_t)n + 1, sizeof *tens);
    const gt_tensor **tp = calloc((size_t)n + 1, sizeof *tp);
    for (int i = 0; i < n; i++) {
        names[i] = ts[i].name;
        EXPECT_OK(gt_safetensors_get(&st, ts[i].name, &tens[i], &err), &err);
        tp[i] = &tens[i];
    }
    const char *mk[1] = {st.n_meta ? st.meta_keys[0] : ""};
    const char *mv[1] = {st.n_meta ? st.meta_values[0] : ""};
    EXPECT_OK(gt_safetensors_write(out, n, names, tp, st.n_meta ? 1 : 0, mk, mv, &err), &err);
    gt_safetensors st2;
    EXPECT_OK(gt_safetensors_open(out, &st2, &err), &err);
    int n2 = 0;
    sidecar_tensor *ts2 = check_sidecar(&st2, "tests/fixtures/safetensors_good.txt", &n2);
    free_sidecar(ts2, n2);
    gt_safetensors_close(&st2);
    if (!env || !env[0]) remove(out);
    for (int i = 0; i < n; i++)
        gt_tensor_free(&tens[i]);
    free(names);
    free(tens);
    free(tp);
    free_sidecar(ts, n);
    gt_safetensors_close(&st);
}

/* ---------------------------------------------------------------- broken files */

static const struct {
    const char *file, *want;
} broken[] = {
    {"empty", "is 0 bytes, shorter than the 8-byte header length"},
    {"seven_bytes", "is 7 bytes, shorter than the 8-byte header length"},
    {"header_len_absurd", "header length 9223372036854775808 exceeds the limit"},
    {"header_len_past_end", "runs past the end of the file"},
    {"header_zero_length", "invalid JSON header at line 1, column 0"},
    {"truncated_header", "runs past the end of the file"},
    {"truncated_data", "past the end of the data section (11 bytes)"},
    {"bad_json", "invalid JSON header at line 1, column 23"},
    {"trailing_garbage", "end of file expected"},
    {"nul_in_header", "end of file expected"},
    {"not_utf8", "unable to decode byte 0xff"},
    {"json_array", "header is not a JSON object"},
    {"deeply_nested", "maximum parsing depth"},
    {"duplicate_keys", "duplicate object key"},
    {"entry_not_object", "tensor \"w\": entry must be a JSON object"},
    {"missing_dtype", "tensor \"w\": missing \"dtype\""},
    {"missing_shape", "tensor \"w\": missing \"shape\""},
    {"missing_data_offsets", "tensor \"w\": missing \"data_offsets\""},
    {"dtype_not_string", "\"dtype\" must be a string"},
    {"unknown_dtype", "tensor \"w\": unsupported dtype \"F64\""},
    {"unknown_dtype_name", "unsupported dtype \"Q7\""},
    {"shape_not_array", "\"shape\" must be an array"},
    {"dim_not_integer", "shape[0] must be an integer"},
    {"negative_dim", "shape[0] = -2 is negative"},
    {"rank_too_big", "rank 9 exceeds the maximum of 8"},
    {"huge_dims_overflow", "shape overflows"},
    {"bytes_overflow", "shape overflows"},
    {"integer_too_big", "too big integer"},
    {"offsets_wrong_length", "\"data_offsets\" must be an array of 2"},
    {"offsets_negative", "\"data_offsets\" must be an array of 2 non-negative"},
    {"offsets_reversed", "begin 16 > end 0"},
    {"offsets_out_of_range", "end 1016 is past the end of the data section (16 bytes)"},
    {"size_mismatch", "span 12 bytes but shape x dtype size is 16 bytes"},
    {"overlap", "\"a\" [0, 16) and \"b\" [8, 24) overlap"},
    {"overlap_contained", "\"a\" [0, 16) and \"b\" [4, 6) overlap"},
    {"metadata_non_string", "\"__metadata__\" key \"step\" must have a string value"},
    {"metadata_not_object", "\"__metadata__\" must be a JSON object"},
};
#define N_BROKEN ((int)(sizeof broken / sizeof broken[0]))

static void test_broken(void)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", gt_test_path("tests/fixtures/safetensors_broken"));
    for (int i = 0; i < N_BROKEN; i++) {
        char path[4352];
        snprintf(path, sizeof path, "%s/%s.safetensors", dir, broken[i].file);
        gt_error err = {0};
        gt_safetensors st;
        gt_status s = gt_safetensors_open(path, &st, &err);
        EXPECT(s == GT_ERR_FORMAT, "%s: status %s (%s)", broken[i].file, gt_status_name(s),
               err.msg);
        EXPECT(strstr(err.msg, path) != NULL, "%s: message lacks the path: %s", broken[i].file,
               err.msg);
        EXPECT(strstr(err.msg, broken[i].want) != NULL, "%s: expected \"%s\" in: %s",
               broken[i].file, broken[i].want, err.msg);
        EXPECT(st.entries == NULL && st.n_entries == 0 && st.data == NULL && st.path == NULL,
               "%s: st not cleared on error", broken[i].file);
        /* The lazy reader (header only) gives the same answer. */
        gt_error err3 = {0};
        EXPECT(gt_safetensors_open_lazy(path, &st, &err3) == s &&
                   strstr(err3.msg, broken[i].want) && !st.lazy && st.path == NULL,
               "%s: lazy open differs from open: %s", broken[i].file, err3.msg);
        /* The in-memory parser gives the same answer. */
        size_t len = 0;
        uint8_t *buf = read_all(path, &len);
        gt_error err2 = {0};
        EXPECT(buf && gt_safetensors_parse("mem.safetensors", buf, len, &st, &err2) == s,
               "%s: parse differs from open", broken[i].file);
        EXPECT(strstr(err2.msg, "mem.safetensors") && strstr(err2.msg, broken[i].want),
               "%s: parse message %s", broken[i].file, err2.msg);
        free(buf);
    }
    /* Every file in the directory has a row in the table (generator and test stay in step). */
    DIR *d = opendir(dir);
    EXPECT(d != NULL, "cannot list %s", dir);
    int files = 0;
    for (struct dirent *e; d && (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        files++;
        bool known = false;
        for (int i = 0; i < N_BROKEN; i++) {
            char want[256];
            snprintf(want, sizeof want, "%s.safetensors", broken[i].file);
            known |= strcmp(e->d_name, want) == 0;
        }
        EXPECT(known, "%s/%s has no expected error in the test table", dir, e->d_name);
    }
    if (d) closedir(d);
    EXPECT(files == N_BROKEN, "%d broken files, %d table rows", files, N_BROKEN);
}

/* ---------------------------------------------------------------- edge cases in memory */

static gt_status parse_str(const char *header, const void *data, size_t data_len,
                           gt_safetensors *st, gt_error *err)
{
    size_t len = 0;
    uint8_t *buf = make_file(header, data, data_len, &len);
    gt_error_clear(err);
    gt_status s = gt_safetensors_parse("edge.safetensors", buf, len, st, err);
    free(buf);
    return s;
}

static void test_edges(void)
{
    gt_error err = {0};
    gt_safetensors st;
    uint8_t data[32];
    for (int i = 0; i < 32; i++)
        data[i] = (uint8_t)(i * 7 + 1);

    /* Header padded with spaces and a newline; bytes after the last tensor (a hole at the end)
     * and between tensors (a hole in the middle) are accepted and ignored. */
    EXPECT_OK(parse_str("{\"a\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                        "\"b\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[12,16]}} \n   ",
                        data, 32, &st, &err),
              &err);
    gt_tensor t;
    EXPECT_OK(gt_safetensors_get(&st, "b", &t, &err), &err);
    EXPECT(t.data && memcmp(t.data, data + 12, 4) == 0, "hole: b read from the wrong place");
    gt_tensor_free(&t);
    EXPECT(st.data_len == 32, "data_len %llu", (unsigned long long)st.data_len);
    gt_safetensors_close(&st);

    /* Adjacent ranges share no byte; an empty range inside another holds no byte either. */
    EXPECT_OK(parse_str("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                        "\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]},"
                        "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}",
                        data, 16, &st, &err),
              &err);
    EXPECT(st.n_entries == 3 && strcmp(st.entries[1].name, "e") == 0, "header order kept");
    gt_safetensors_close(&st);

    /* Overlap by one byte, listed out of order. */
    EXPECT(parse_str("{\"b\":{\"dtype\":\"BOOL\",\"shape\":[2],\"data_offsets\":[7,9]},"
                     "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
                     data, 16, &st, &err) == GT_ERR_FORMAT,
           "one-byte overlap accepted");
    EXPECT(strstr(err.msg, "\"a\" [0, 8) and \"b\" [7, 9) overlap"), "%s", err.msg);

    /* Header length just over the 100 MB limit with a short file: the limit is reported. */
    uint8_t big[16] = {0};
    uint64_t over = 100000001ull;
    for (int i = 0; i < 8; i++)
        big[i] = (uint8_t)(over >> (8 * i));
    gt_error_clear(&err);
    EXPECT(gt_safetensors_parse("big", big, sizeof big, &st, &err) == GT_ERR_FORMAT, "limit");
    EXPECT(strstr(err.msg, "exceeds the limit"), "%s", err.msg);

    /* A long tensor name is clipped in the message, which still names the file. */
    char header[1200];
    char longname[701];
    memset(longname, 'n', 700);
    longname[700] = 0;
    snprintf(header, sizeof header,
             "{\"%s\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}", longname);
    EXPECT(parse_str(header, data, 8, &st, &err) == GT_ERR_FORMAT, "F64 accepted");
    EXPECT(strstr(err.msg, "edge.safetensors") && strstr(err.msg, "unsupported dtype"), "%s",
           err.msg);

    /* get of a missing name; open of a missing file and of a directory. */
    EXPECT_OK(parse_str("{}", NULL, 0, &st, &err), &err);
    gt_error_clear(&err);
    EXPECT(gt_safetensors_get(&st, "absent.weight", &t, &err) == GT_ERR_INVALID, "missing get");
    EXPECT(strstr(err.msg, "\"absent.weight\"") && strstr(err.msg, "edge.safetensors"), "%s",
           err.msg);
    gt_safetensors_close(&st);
    const char *nofile = tmp_path("does_not_exist.safetensors");
    gt_error_clear(&err);
    EXPECT(gt_safetensors_open(nofile, &st, &err) == GT_ERR_IO, "missing file");
    EXPECT(strstr(err.msg, nofile) && strstr(err.msg, "No such file"), "%s", err.msg);
    gt_error_clear(&err);
    EXPECT(gt_safetensors_open(g_tmpdir, &st, &err) == GT_ERR_IO, "directory opened");
    EXPECT(strstr(err.msg, "not a regular file"), "%s", err.msg);
}

int main(void)
{
    snprintf(g_tmpdir, sizeof g_tmpdir, "/tmp/gt_test_safetensors_XXXXXX");
    if (!mkdtemp(g_tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    test_roundtrip();
    test_writer_errors();
    test_interop();
    test_broken();
    test_edges();
    rmdir(g_tmpdir);
    return gt_test_finish();
}
