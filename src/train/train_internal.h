/* train_internal.h — helpers shared by the trainer's files. */
#ifndef GRAPHTRAIN_TRAIN_INTERNAL_H
#define GRAPHTRAIN_TRAIN_INTERNAL_H

/* DIR/NAME (NAME alone when absolute or DIR is empty); malloc'd. */
char *gt_train_join_path(const char *dir, const char *name);

#endif
