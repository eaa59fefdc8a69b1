/* adamw_groups.c — which adamw instructions of a program one multi-tensor launch can update
 * together (gt_runtime_adamw_groups, runtime_internal.h).
 *
 * The optimizer tail of a step program is one adamw instruction per parameter, in a row. A
 * multi-tensor launch runs a group's members at the same time instead of one after another, and
 * the two orders give the same bytes exactly when no member depends on another: member B must not
 * read what A writes (A's update would be missing or half there), nor write what A reads or writes
 * (A would see B's update). That is a disjointness test on byte ranges in the arenas, decided here
 * from the instruction descriptors alone; what the backend can run (dtypes, alignment) is the
 * `fits` callback's. The members' constants must agree for one launch to derive them once: the
 * same scalars and clip buffers, beta1, beta2 and eps; weight decay may be 0 (norms) or the one
 * nonzero value of the group (matrices), since the launch derives the constants for both. */
#include "runtime_internal.h"

/* Bytes [offset, offset + size) of two buffer refs intersect (empty buffers intersect nothing). */
static bool overlap(const gt_buffer_ref *a, const gt_buffer_ref *b)
{
    size_t na = gt_runtime_ref_bytes(a), nb = gt_runtime_ref_bytes(b);
    return na && nb && a->arena == b->arena && a->offset < b->offset + nb &&
           b->offset < a->offset + na;
}

static bool same_bytes(const gt_buffer_ref *a, const gt_buffer_ref *b)
{
    return a->arena == b->arena && a->offset == b->offset &&
           gt_runtime_ref_bytes(a) == gt_runtime_ref_bytes(b);
}

/* An adamw instruction the backend accepts whose outputs overlap neither each other nor its own
 * inputs, except an output that is exactly one of p, g, m, v (in place); never scalars or clip,
 * which every thread reads for its constants. */
static bool member(const gt_instr *ins, gt_runtime_adamw_fits fits, void *user)
{
    if (ins->op != GT_OP_ADAMW || ins->n_in != 6 || ins->n_out != 3 || ins->nf < 4 ||
        !fits(ins, user))
        return false;
    for (int o = 0; o < 3; o++) {
        for (int o2 = o + 1; o2 < 3; o2++)
            if (overlap(&ins->out[o], &ins->out[o2])) return false;
        for (int i = 0; i < 6; i++)
            if (overlap(&ins->out[o], &ins->in[i]) &&
                (i >= 4 || !same_bytes(&ins->out[o], &ins->in[i])))
                return false;
    }
    return true;
}

/* Whether b can join a group whose first member is a, given the group's nonzero weight decay *wd
 * (0 while it has none; updated when b brings the first). */
static bool same_constants(const gt_instr *a, const gt_instr *b, double *wd)
{
    if (!same_bytes(&a->in[4], &b->in[4]) || !same_bytes(&a->in[5], &b->in[5])) return false;
    if (a->f[0] != b->f[0] || a->f[1] != b->f[1] || a->f[2] != b->f[2]) return false;
    if (b->f[3] != 0.0 && *wd != 0.0 && b->f[3] != *wd) return false;
    if (b->f[3] != 0.0) *wd = b->f[3];
    return true;
}

/* b's outputs touch none of a's buffers, and a's outputs none of b's inputs. */
static bool independent(const gt_instr *a, const gt_instr *b)
{
    for (int o = 0; o < 3; o++) {
        for (int i = 0; i < 6; i++)
            if (overlap(&b->out[o], &a->in[i]) || overlap(&a->out[o], &b->in[i])) return false;
        for (int o2 = 0; o2 < 3; o2++)
            if (overlap(&b->out[o], &a->out[o2])) return false;
    }
    return true;
}

int32_t gt_runtime_adamw_groups(const gt_instr *instrs, int32_t n, gt_runtime_adamw_fits fits,
                                void *user, int32_t *len)
{
    int32_t n_groups = 0;
    for (int32_t k = 0; k < n;) {
        int32_t end = k + 1;
        if (member(&instrs[k], fits, user)) {
            double wd = instrs[k].f[3];
            for (bool more = true; more && end < n;) {
                const gt_instr *b = &instrs[end];
                double wd_b = wd;
                more = member(b, fits, user) && same_constants(&instrs[k], b, &wd_b);
                for (int32_t j = k; more && j < end; j++)
                    more = independent(&instrs[j], b);
                if (more) {
                    wd = wd_b;
                    end++;
                }
            }
        }
        len[k] = end - k;
        for (int32_t j = k + 1; j < end; j++)
            len[j] = 0;
        n_groups += end - k >= 2;
        k = end;
    }
    return n_groups;
}
