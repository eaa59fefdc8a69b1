/* test_tune_cache.c — the matmul tuning cache file (src/backend/tune_cache.c), on the CPU: a
 * lookup offers the values of the lines whose key is exactly the one asked for, in file order,
 * until one is accepted, and passes over what it cannot use; appends make the folders and add
 * whole lines; hex round-trips and refuses anything but exact hex; the file's default place
 * follows GT_MATMUL_TUNE_CACHE, XDG_CACHE_HOME and HOME. The GPU side (a choice cached, then found
 * by a new stream) is test_cuda_ops's matmul-tune case. */
#define _GNU_SOURCE
#include "backend/tune_cache.h"
#include "gt_test.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct {
    const char *want; /* the value to accept; NULL: accept none */
    char seen[8][64]; /* the values offered, in order */
    int n;
} offers;

static bool accept_want(const char *value, void *user)
{
    offers *o = user;
    if (o->n < 8) snprintf(o->seen[o->n++], sizeof o->seen[0], "%s", value);
    return o->want && strcmp(value, o->want) == 0;
}

static void test_find(void)
{
    const char text[] = "k1\tv1\n"
                        "no tab on this line\n"
                        "\n"
                        "k\tshort\n"
                        "k1\tv2\n"
                        "k1x\tother key\n"
                        "k1\twith\ta tab\n"
                        "k1\tlast, no newline";
    size_t len = sizeof text - 1;
    offers o = {.want = "v2"};
    EXPECT(gt_tune_cache_find(text, len, "k1", accept_want, &o), "find: v2 not accepted");
    EXPECT(o.n == 2 && !strcmp(o.seen[0], "v1") && !strcmp(o.seen[1], "v2"),
           "find: offered %d values (%s, %s), expected v1 then v2", o.n, o.seen[0], o.seen[1]);
    offers none = {0};
    EXPECT(!gt_tune_cache_find(text, len, "k1", accept_want, &none), "find: none accepted");
    EXPECT(none.n == 3 && !strcmp(none.seen[2], "last, no newline"),
           "find: offered %d values of k1, expected v1, v2 and the unterminated last line (a "
           "value with a tab passed over); the third: '%s'",
           none.n, none.seen[2]);
    offers k = {.want = "short"};
    EXPECT(gt_tune_cache_find(text, len, "k", accept_want, &k) && k.n == 1,
           "find: key 'k' matched %d lines, expected its own one (not k1's)", k.n);
    offers prefix = {0}; /* "no" begins a line that has no tab */
    EXPECT(!gt_tune_cache_find(text, len, "no", accept_want, &prefix) && prefix.n == 0,
           "find: key 'no' offered %d values of a line without a tab ('%s')", prefix.n,
           prefix.seen[0]);
    offers missing = {0};
    EXPECT(!gt_tune_cache_find(text, len, "absent", accept_want, &missing) && missing.n == 0,
           "find: an absent key offered %d values", missing.n);
    /* a line cut short, as a torn append leaves it: its rest offered, for the caller to judge */
    offers torn = {0};
    EXPECT(!gt_tune_cache_find(text, 4, "k1", accept_want, &torn) && torn.n == 1 &&
               !strcmp(torn.seen[0], "v"),
           "find: a line cut after 4 bytes offered %d values ('%s'), expected 'v'", torn.n,
           torn.seen[0]);
    /* a value over the limit is passed over, one at the limit is offered */
    size_t big = GT_TUNE_CACHE_MAX_VALUE + 1;
    char *long_text = malloc(2 * (big + 8));
    char *p = long_text;
    p += sprintf(p, "k\t");
    memset(p, 'a', big);
    p += big;
    p += sprintf(p, "\nk\t");
    memset(p, 'b', big - 1);
    p += big - 1;
    offers lim = {0};
    EXPECT(!gt_tune_cache_find(long_text, (size_t)(p - long_text), "k", accept_want, &lim) &&
               lim.n == 1 && lim.seen[0][0] == 'b',
           "find: values over the limit: offered %d, expected only the one at the limit", lim.n);
    free(long_text);
}

static void test_hex(void)
{
    unsigned char bytes[5] = {0x00, 0x7f, 0x80, 0xab, 0xff}, back[5];
    char hex[11];
    gt_tune_cache_hex(bytes, 5, hex);
    EXPECT(!strcmp(hex, "007f80abff"), "hex: got %s", hex);
    EXPECT(gt_tune_cache_unhex(hex, 10, back, 5) && !memcmp(bytes, back, 5),
           "unhex: no round trip");
    EXPECT(gt_tune_cache_unhex("007F80ABFF", 10, back, 5) && !memcmp(bytes, back, 5),
           "unhex: upper case refused");
    EXPECT(!gt_tune_cache_unhex(hex, 9, back, 5), "unhex: an odd length accepted");
    EXPECT(gt_tune_cache_unhex(hex, 8, back, 4) && !memcmp(bytes, back, 4),
           "unhex: 8 digits into 4 bytes refused");
    EXPECT(!gt_tune_cache_unhex("007f80abfg", 10, back, 5), "unhex: 'g' accepted");
    EXPECT(!gt_tune_cache_unhex("007f80ab f", 10, back, 5), "unhex: a space accepted");
    EXPECT(!gt_tune_cache_unhex("007f80abff", 10, back, 4), "unhex: a longer text accepted");
}

static void test_file(void)
{
    char dir[] = "/tmp/gt_tune_cache_XXXXXX";
    GT_CHECK(mkdtemp(dir) != NULL);
    char path[256], sub[256], subsub[256];
    snprintf(sub, sizeof sub, "%s/a", dir);
    snprintf(subsub, sizeof subsub, "%s/a/b", dir);
    snprintf(path, sizeof path, "%s/a/b/cache.tsv", dir);
    gt_error err = {0};
    offers o = {.want = "v1"};
    EXPECT(!gt_tune_cache_lookup(path, "k1", accept_want, &o) && o.n == 0,
           "lookup: a missing file found something");
    EXPECT_OK(gt_tune_cache_append(path, "k1", "v1", &err), &err);
    EXPECT_OK(gt_tune_cache_append(path, "k2", "v2", &err), &err);
    EXPECT(gt_tune_cache_append(path, "k\t3", "v3", &err) == GT_ERR_INVALID &&
               strstr(err.msg, path) != NULL,
           "append: a key with a tab: '%s'", err.msg);
    EXPECT(gt_tune_cache_append(path, "k3", "v\n3", &err) == GT_ERR_INVALID,
           "append: a value with a newline accepted");
    char text[64] = {0};
    FILE *f = fopen(path, "r");
    size_t got = f ? fread(text, 1, sizeof text - 1, f) : 0;
    if (f) fclose(f);
    EXPECT(got == 12 && !strcmp(text, "k1\tv1\nk2\tv2\n"), "append: the file holds '%s'", text);
    EXPECT(gt_tune_cache_lookup(path, "k1", accept_want, &o), "lookup: k1 not found");
    offers o2 = {.want = "v2"};
    EXPECT(gt_tune_cache_lookup(path, "k2", accept_want, &o2), "lookup: k2 not found");
    /* a file over the size limit is not read */
    int fd = open(path, O_WRONLY);
    GT_CHECK(fd >= 0);
    GT_CHECK(ftruncate(fd, (off_t)GT_TUNE_CACHE_MAX_BYTES + 1) == 0);
    close(fd);
    offers o3 = {.want = "v1"};
    EXPECT(!gt_tune_cache_lookup(path, "k1", accept_want, &o3) && o3.n == 0,
           "lookup: a file over the limit was read");
    struct stat sb;
    EXPECT(gt_tune_cache_append(path, "k4", "v4", &err) == GT_ERR_IO && strstr(err.msg, "full") &&
               stat(path, &sb) == 0 && (uint64_t)sb.st_size == GT_TUNE_CACHE_MAX_BYTES + 1,
           "append to a file over the limit: '%s'", err.msg);
    /* a folder in the way: a file where the path needs one */
    char blocked[300];
    snprintf(blocked, sizeof blocked, "%s/cache.tsv/x.tsv", subsub);
    EXPECT(gt_tune_cache_append(blocked, "k", "v", &err) == GT_ERR_INVALID &&
               strstr(err.msg, "not a directory") != NULL,
           "append below a file: '%s'", err.msg);
    remove(path);
    rmdir(subsub);
    rmdir(sub);
    rmdir(dir);
}

static void expect_path(const char *want, const char *what)
{
    char *p = gt_tune_cache_default_path();
    EXPECT(want ? p && !strcmp(p, want) : p == NULL, "default path, %s: got %s, expected %s", what,
           p ? p : "(none)", want ? want : "(none)");
    free(p);
}

static void test_default_path(void)
{
    setenv("GT_MATMUL_TUNE_CACHE", "/x/y.tsv", 1);
    setenv("XDG_CACHE_HOME", "/c", 1);
    setenv("HOME", "/h", 1);
    expect_path("/x/y.tsv", "GT_MATMUL_TUNE_CACHE set");
    setenv("GT_MATMUL_TUNE_CACHE", "", 1);
    expect_path(NULL, "GT_MATMUL_TUNE_CACHE empty");
    setenv("GT_MATMUL_TUNE_CACHE", "0", 1);
    expect_path(NULL, "GT_MATMUL_TUNE_CACHE=0");
    unsetenv("GT_MATMUL_TUNE_CACHE");
    expect_path("/c/graphtrain/matmul_tune.tsv", "XDG_CACHE_HOME");
    setenv("XDG_CACHE_HOME", "relative", 1);
    expect_path("/h/.cache/graphtrain/matmul_tune.tsv", "a relative XDG_CACHE_HOME");
    unsetenv("XDG_CACHE_HOME");
    expect_path("/h/.cache/graphtrain/matmul_tune.tsv", "HOME");
    unsetenv("HOME");
    expect_path(NULL, "no HOME");
}

int main(void)
{
    test_find();
    test_hex();
    test_file();
    test_default_path();
    return gt_test_finish();
}
