/* ops.c — the op table built from gt_ops.def, attribute schemas, and the names of enums the IR
 * prints (phases, graph input/output kinds). */
#include <string.h>

#include "ir/fused_program.h"
#include "ir/ir_internal.h"

/* The one X-macro expansion that turns gt_ops.def into data; read-only. */
static const gt_op_info gt_op_table[GT_OP_COUNT] = {
#define X(E, opname, nin, nout, opflags, rule, opalias, oppairs, oprecompute, opschema)            \
    [GT_OP_##E] = {.name = #opname,                                                                \
                   .n_in = nin,                                                                    \
                   .n_out = nout,                                                                  \
                   .flags = opflags,                                                               \
                   .schema = opschema,                                                             \
                   .shape = gt_shape_##opname,                                                     \
                   .alias = GT_ALIAS_##opalias,                                                    \
                   .alias_pairs = oppairs,                                                         \
                   .recompute = GT_RECOMPUTE_##oprecompute},
#include "graphtrain/gt_ops.def"
#undef X
};

const gt_op_info *gt_op_get(gt_op op)
{
    if ((int)op < 0 || op >= GT_OP_COUNT) return NULL;
    return &gt_op_table[op];
}

bool gt_op_from_name(const char *name, gt_op *out)
{
    if (!name) return false;
    for (int k = 0; k < GT_OP_COUNT; k++) {
        if (strcmp(gt_op_table[k].name, name) == 0) {
            if (out) *out = (gt_op)k;
            return true;
        }
    }
    return false;
}

bool gt_op_is_collective_start(gt_op op)
{
    return op == GT_OP_ALL_GATHER_START || op == GT_OP_REDUCE_SCATTER_START ||
           op == GT_OP_ALL_REDUCE_START || op == GT_OP_ALL_TO_ALL_START || op == GT_OP_SEND_START ||
           op == GT_OP_RECV_START;
}

/* One side of an "out=in" pair: a slot number, or '*' for every slot below n. */
static void alias_side(const char **p, int n, int *first, int *last)
{
    if (**p == '*') {
        (*p)++;
        *first = 0, *last = n - 1;
        return;
    }
    GT_CHECK(**p >= '0' && **p <= '9');
    int k = 0;
    for (; **p >= '0' && **p <= '9'; (*p)++)
        k = k * 10 + (**p - '0');
    *first = *last = k;
}

int gt_op_alias_pairs(const gt_node *n, int pairs[][2])
{
    const gt_op_info *info = gt_op_get(n->op);
    GT_CHECK(info);
    int np = 0;
    for (const char *p = info->alias_pairs; *p;) {
        if (*p == ' ') {
            p++;
            continue;
        }
        int o0, o1, i0, i1;
        alias_side(&p, n->n_out, &o0, &o1);
        GT_CHECK(*p == '=');
        p++;
        alias_side(&p, n->n_in, &i0, &i1);
        for (int o = o0; o <= o1; o++)
            for (int i = i0; i <= i1; i++) {
                GT_CHECK(np < GT_MAX_IN * GT_MAX_OUT);
                pairs[np][0] = o, pairs[np][1] = i, np++;
            }
    }
    return np;
}

const char *gt_phase_name(gt_phase p)
{
    switch (p) {
    case GT_PHASE_FORWARD:
        return "fwd";
    case GT_PHASE_BACKWARD:
        return "bwd";
    case GT_PHASE_OPTIMIZER:
        return "opt";
    }
    return "?";
}

const char *gt_input_kind_name(gt_input_kind k)
{
    switch (k) {
    case GT_IN_PARAM:
        return "PARAM";
    case GT_IN_BUFFER:
        return "BUFFER";
    case GT_IN_OPT_STATE:
        return "OPT_STATE";
    case GT_IN_INPUT:
        return "INPUT";
    }
    return "?";
}

const char *gt_output_kind_name(gt_output_kind k)
{
    switch (k) {
    case GT_OUT_LOSS:
        return "LOSS";
    case GT_OUT_GRAD:
        return "GRAD";
    case GT_OUT_PARAM_UPDATE:
        return "PARAM_UPDATE";
    case GT_OUT_BUFFER_UPDATE:
        return "BUFFER_UPDATE";
    case GT_OUT_METRIC:
        return "METRIC";
    case GT_OUT_OPT_STATE_UPDATE:
        return "OPT_STATE_UPDATE";
    }
    return "?";
}

/* ---------------------------------------------------------------- schema */

int gt_attr_class_max(int cls)
{
    switch (cls) {
    case GT_ATTR_I:
        return GT_MAX_IATTR;
    case GT_ATTR_F:
        return GT_MAX_FATTR;
    default:
        return GT_MAX_EATTR;
    }
}

void gt_schema_parse(const char *schema, gt_schema *s)
{
    memset(s, 0, sizeof *s);
    const char *p = schema;
    for (;;) {
        while (*p == ' ')
            p++;
        if (!*p) break;
        int cls = p[0] == 'i' ? GT_ATTR_I : p[0] == 'f' ? GT_ATTR_F : GT_ATTR_E;
        GT_CHECK((p[0] == 'i' || p[0] == 'f' || p[0] == 'e') && p[1] == ':');
        GT_CHECK(s->n_classes < GT_ATTR_CLASSES);
        s->order[s->n_classes++] = cls;
        p += 2;
        for (;;) {
            const char *start = p;
            while (*p && *p != ',' && *p != ' ' && *p != '*' && *p != '?')
                p++;
            int k = s->n_names[cls];
            GT_CHECK(p > start && k < GT_SCHEMA_MAX_NAMES && !s->has_list[cls]);
            s->name[cls][k] = start;
            s->name_len[cls][k] = (int)(p - start);
            s->n_names[cls] = k + 1;
            if (*p == '*') {
                GT_CHECK(s->n_optional[cls] == 0); /* a list after optional slots: ambiguous */
                s->has_list[cls] = true;
                p++;
            } else if (*p == '?') {
                s->n_optional[cls]++;
                p++;
            } else {
                GT_CHECK(s->n_optional[cls] == 0); /* optional slots come last */
            }
            if (*p != ',') break;
            p++;
        }
        GT_CHECK(gt_schema_fixed(s, cls) <= gt_attr_class_max(cls));
    }
}

static const char *const gt_attr_class_word[GT_ATTR_CLASSES] = {"int", "float", "expression"};

gt_status gt_attrs_fit(gt_op op, gt_attrs *a, bool fill, const char *label, gt_error *err)
{
    const gt_op_info *info = gt_op_get(op);
    GT_CHECK(info);
    gt_schema s;
    gt_schema_parse(info->schema, &s);
    uint8_t *counts[GT_ATTR_CLASSES] = {&a->ni, &a->nf, &a->ne};
    for (int cls = 0; cls < GT_ATTR_CLASSES; cls++) {
        int fixed = gt_schema_fixed(&s, cls), required = gt_schema_required(&s, cls);
        int max = s.has_list[cls] ? gt_attr_class_max(cls) : fixed;
        int n = *counts[cls];
        if (n > max)
            return gt_error_set(err, GT_ERR_INVALID,
                                "%s: %d %s attributes given, at most %d fit its schema \"%s\"",
                                label, n, gt_attr_class_word[cls], max, info->schema);
        if (n < required) {
            /* Zero is a fine default for a flag or a scalar, not for an expression id. */
            if (!fill || cls == GT_ATTR_E)
                return gt_error_set(err, GT_ERR_INVALID,
                                    "%s: %d %s attributes given, its schema \"%s\" needs %d", label,
                                    n, gt_attr_class_word[cls], info->schema, required);
            for (int k = n; k < required; k++) {
                if (cls == GT_ATTR_I) a->i[k] = 0;
                if (cls == GT_ATTR_F) a->f[k] = 0.0;
            }
            n = required;
        }
        if (fill) {
            for (int k = n; k < gt_attr_class_max(cls); k++) {
                if (cls == GT_ATTR_I) a->i[k] = 0;
                if (cls == GT_ATTR_F) a->f[k] = 0.0;
                if (cls == GT_ATTR_E) a->e[k] = 0;
            }
        }
        *counts[cls] = (uint8_t)n;
    }
    return GT_OK;
}

int gt_op_n_out(gt_op op, const gt_attrs *a)
{
    const gt_op_info *info = gt_op_get(op);
    if (!info) return 0;
    if (info->n_out >= 0) return info->n_out;
    int n = a ? a->ne : 0;
    if (op == GT_OP_FUSED_ELEMENTWISE) /* its program's outputs (fused_program.h) */
        n = a ? gt_fused_outputs(a->i, a->ni < GT_MAX_IATTR ? a->ni : GT_MAX_IATTR, NULL) : 0;
    return n > GT_MAX_OUT ? GT_MAX_OUT : n;
}
