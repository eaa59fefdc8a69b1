/* dirs.c — mkdir -p, and joining a path. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "graphtrain/gt_core.h"

gt_status gt_make_dirs(const char *dir, gt_error *err)
{
    char *path = gt_xstrdup(dir);
    size_t len = strlen(path);
    while (len > 1 && path[len - 1] == '/')
        path[--len] = '\0';
    gt_status st = GT_OK;
    /* Each prefix ending before a '/', then the whole path. */
    for (size_t i = 1; i <= len && st == GT_OK; i++) {
        if (i < len && path[i] != '/') continue;
        char saved = path[i];
        path[i] = '\0';
        /* An existing prefix may refuse mkdir with EACCES or EROFS rather than EEXIST: judge
         * by stat what is there. */
        struct stat sb;
        if (mkdir(path, 0777) != 0) {
            int e = errno;
            if (stat(path, &sb) != 0)
                st = gt_error_set(err, GT_ERR_IO, "cannot create directory %s: %s", path,
                                  strerror(e));
            else if (!S_ISDIR(sb.st_mode))
                st = gt_error_set(err, GT_ERR_INVALID, "%s exists and is not a directory", path);
        }
        path[i] = saved;
    }
    free(path);
    return st;
}

char *gt_path_join(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = gt_xmalloc(n);
    snprintf(p, n, "%s/%s", dir, name);
    return p;
}
