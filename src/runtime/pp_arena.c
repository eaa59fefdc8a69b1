/* pp_arena.c — offsets in one arena for the values a pipeline step's runner holds (pp_exec.c),
 * from each value's bytes and the span of the step's events it lives over. */
#include <stdlib.h>

#include "graphtrain/gt_program.h"
#include "pp_internal.h"

typedef struct {
    int32_t k;
    int64_t size;
} by_size;

typedef struct {
    int64_t begin, end;
} span;

/* Largest first, then the earlier value: the order gt_plan_memory places a step's buffers in,
 * which keeps the arena near the peak when a few large activations dominate. */
static int cmp_by_size(const void *a, const void *b)
{
    const by_size *x = a, *y = b;
    if (x->size != y->size) return x->size > y->size ? -1 : 1;
    return (x->k > y->k) - (x->k < y->k);
}

static int cmp_span(const void *a, const void *b)
{
    const span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return (x->end > y->end) - (x->end < y->end);
}

static int64_t align_up(int64_t x)
{
    return (x + GT_PLAN_ALIGN - 1) / GT_PLAN_ALIGN * GT_PLAN_ALIGN;
}

/* Each slot, largest first, at the lowest aligned offset whose bytes no placed slot living at the
 * same time uses (gt_plan_memory's greedy assignment, on event spans). O(n^2 log n). */
int64_t gt_pp_arena_place(const gt_pp_slot *slots, int32_t n, int64_t *offsets)
{
    by_size *order = gt_xmalloc(((size_t)n + 1) * sizeof *order);
    span *busy = gt_xmalloc(((size_t)n + 1) * sizeof *busy);
    for (int32_t k = 0; k < n; k++)
        order[k] = (by_size){k, align_up(slots[k].size)};
    qsort(order, (size_t)n, sizeof *order, cmp_by_size);
    int64_t top = 0;
    for (int32_t i = 0; i < n; i++) {
        const gt_pp_slot *it = &slots[order[i].k];
        int64_t size = order[i].size, off = 0;
        int32_t nb = 0;
        for (int32_t j = 0; j < i; j++) {
            const gt_pp_slot *o = &slots[order[j].k];
            if (order[j].size && o->first <= it->last && it->first <= o->last)
                busy[nb++] = (span){offsets[order[j].k], offsets[order[j].k] + order[j].size};
        }
        qsort(busy, (size_t)nb, sizeof *busy, cmp_span);
        for (int32_t j = 0; size && j < nb; j++) {
            if (busy[j].begin >= off + size) break;
            if (busy[j].end > off) off = busy[j].end;
        }
        offsets[order[i].k] = off;
        if (off + size > top) top = off + size;
    }
    free(order);
    free(busy);
    return top;
}
