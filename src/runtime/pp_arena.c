/* pp_arena.c — offsets in one arena for the values a pipeline step's runner holds (pp_exec.c),
 * from each value's bytes and the span of the step's events it lives over. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "graphtrain/gt_program.h"
#include "pp_internal.h"
#include "runtime_internal.h"

/* Above this many slots a step's placement is the allocator's best fit in event order rather
 * than the greedy one, whose time grows with the square of the slots. */
#define GREEDY_MAX_SLOTS 16384

static int64_t align_up(int64_t x)
{
    return (x + GT_PLAN_ALIGN - 1) / GT_PLAN_ALIGN * GT_PLAN_ALIGN;
}

/* Each slot, largest first, at the lowest aligned offset whose bytes no placed slot living at the
 * same time uses: gt_plan_memory's greedy assignment (gt_plan_place_intervals) on event spans.
 * Slots are in allocation order, so its tie order (the earlier first) is the slots' order. Within
 * 0.01% of the peak on test_pp_exec's steps. */
static int64_t place_greedy(const gt_pp_slot *slots, int32_t n, int64_t *offsets)
{
    gt_plan_interval *items = gt_xmalloc(((size_t)n + 1) * sizeof *items);
    for (int32_t k = 0; k < n; k++)
        items[k] = (gt_plan_interval){align_up(slots[k].size), slots[k].first, slots[k].last, k};
    int64_t top = gt_plan_place_intervals(items, n, offsets);
    free(items);
    return top;
}

typedef struct {
    int64_t off, size;
} block;

static int cmp_by_last(const void *a, const void *b)
{
    const int64_t *x = a, *y = b; /* {last, k} */
    if (x[0] != y[0]) return x[0] < y[0] ? -1 : 1;
    return (x[1] > y[1]) - (x[1] < y[1]);
}

/* The step's events in order, as an allocator would see them, on a free list sorted by offset:
 * an allocation takes the smallest free block that holds it (the lowest such), else grows the
 * arena's top (from a free block ending there); a free returns the block, merged with its free
 * neighbours. Slots are in allocation order (first rising); O(n (log n + free blocks)), a few
 * percent over the peak on test_pp_exec's steps (1 to 4%). */
static int64_t place_best_fit(const gt_pp_slot *slots, int32_t n, int64_t *offsets)
{
    int64_t(*frees)[2] = gt_xmalloc(((size_t)n + 1) * sizeof *frees);
    block *fl = gt_xmalloc(((size_t)n + 1) * sizeof *fl);
    int32_t nf = 0, nfree = 0;
    for (int32_t k = 0; k < n; k++)
        if (slots[k].last != INT64_MAX) {
            frees[nfree][0] = slots[k].last;
            frees[nfree++][1] = k;
        }
    qsort(frees, (size_t)nfree, sizeof *frees, cmp_by_last);
    int64_t top = 0;
    int32_t fi = 0;
    for (int32_t k = 0; k <= n; k++) {
        /* the frees before allocation k */
        for (; fi < nfree && (k == n || frees[fi][0] < slots[k].first); fi++) {
            int32_t j = (int32_t)frees[fi][1];
            int64_t off = offsets[j], size = align_up(slots[j].size);
            if (!size) continue;
            int32_t at = 0;
            while (at < nf && fl[at].off < off)
                at++;
            bool left = at > 0 && fl[at - 1].off + fl[at - 1].size == off;
            bool right = at < nf && off + size == fl[at].off;
            if (left && right) {
                fl[at - 1].size += size + fl[at].size;
                memmove(&fl[at], &fl[at + 1], (size_t)(nf - at - 1) * sizeof *fl);
                nf--;
            } else if (left) {
                fl[at - 1].size += size;
            } else if (right) {
                fl[at].off = off;
                fl[at].size += size;
            } else {
                memmove(&fl[at + 1], &fl[at], (size_t)(nf - at) * sizeof *fl);
                fl[at] = (block){off, size};
                nf++;
            }
        }
        if (k == n) break;
        int64_t size = align_up(slots[k].size);
        int32_t best = -1;
        for (int32_t b = 0; size && b < nf; b++)
            if (fl[b].size >= size && (best < 0 || fl[b].size < fl[best].size)) best = b;
        if (!size) {
            offsets[k] = 0;
        } else if (best >= 0) {
            offsets[k] = fl[best].off;
            fl[best].off += size;
            fl[best].size -= size;
            if (!fl[best].size) {
                memmove(&fl[best], &fl[best + 1], (size_t)(nf - best - 1) * sizeof *fl);
                nf--;
            }
        } else if (nf && fl[nf - 1].off + fl[nf - 1].size == top) { /* grow the last block */
            offsets[k] = fl[nf - 1].off;
            top = offsets[k] + size;
            nf--;
        } else {
            offsets[k] = top;
            top += size;
        }
    }
    free(frees);
    free(fl);
    return top;
}

int64_t gt_pp_arena_place(const gt_pp_slot *slots, int32_t n, int64_t *offsets)
{
    return n <= GREEDY_MAX_SLOTS ? place_greedy(slots, n, offsets)
                                 : place_best_fit(slots, n, offsets);
}
