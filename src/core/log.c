/* log.c — the log sink: the one piece of global mutable state (DESIGN.md §8).
 *
 * Lines are formatted here and handed to the sink whole; the default sink writes
 * "[graphtrain] LEVEL msg" to stderr. Messages below the level are dropped before formatting. */
#include "graphtrain/gt_core.h"

#include <stdio.h>

static struct {
    gt_log_sink sink; /* NULL: the default stderr sink */
    void *user;
    gt_log_level level;
} gt_log_state = {NULL, NULL, GT_LOG_INFO};

static const char *gt_log_level_name(gt_log_level level)
{
    switch (level) {
    case GT_LOG_DEBUG:
        return "DEBUG";
    case GT_LOG_INFO:
        return "INFO";
    case GT_LOG_WARN:
        return "WARN";
    case GT_LOG_ERROR:
        return "ERROR";
    }
    return "LOG";
}

static void gt_log_stderr(gt_log_level level, const char *msg, void *user)
{
    (void)user;
    fprintf(stderr, "[graphtrain] %s %s\n", gt_log_level_name(level), msg);
}

void gt_log_set_sink(gt_log_sink sink, void *user)
{
    gt_log_state.sink = sink;
    gt_log_state.user = user;
}

void gt_log_set_level(gt_log_level level)
{
    gt_log_state.level = level;
}

void gt_log(gt_log_level level, const char *fmt, ...)
{
    if (level < gt_log_state.level) return;
    char msg[4096]; /* longer lines are truncated, never overflowed */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    gt_log_sink sink = gt_log_state.sink ? gt_log_state.sink : gt_log_stderr;
    sink(level, msg, gt_log_state.user);
}
