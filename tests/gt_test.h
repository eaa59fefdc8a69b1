/* gt_test.h — the minimal test harness: EXPECT counts, gt_test_finish prints the closing line
 * "N passed, N failed" and returns the exit code. */
#ifndef GT_TEST_H
#define GT_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static int gt_test_passed_, gt_test_failed_;

#define EXPECT(cond, ...)                                                                          \
    do {                                                                                           \
        if (cond) {                                                                                \
            gt_test_passed_++;                                                                     \
        } else {                                                                                   \
            gt_test_failed_++;                                                                     \
            fprintf(stderr, "FAIL %s:%d: (%s) ", __FILE__, __LINE__, #cond);                       \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
        }                                                                                          \
    } while (0)

/* A gt_status call that must succeed; prints the error message otherwise. */
#define EXPECT_OK(call, errp)                                                                      \
    do {                                                                                           \
        gt_status st_ = (call);                                                                    \
        EXPECT(st_ == GT_OK, "%s -> %s: %s", #call, gt_status_name(st_), (errp)->msg);             \
    } while (0)

static inline int gt_test_finish(void)
{
    printf("%d passed, %d failed\n", gt_test_passed_, gt_test_failed_);
    return gt_test_failed_ ? 1 : 0;
}

/* Path of a file in the source tree. */
static inline const char *gt_test_path(const char *rel)
{
    static char buf[4096];
    snprintf(buf, sizeof buf, "%s/%s", GT_SOURCE_DIR, rel);
    return buf;
}

#endif
