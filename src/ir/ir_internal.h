/* ir_internal.h — what the files of src/ir share and nobody else needs: the parsed attribute
 * schema, the node-append primitive behind gt_graph_add_node and gt_graph_copy_region, the shape
 * rule prototypes and a few message helpers. Not part of the public API. */
#ifndef GRAPHTRAIN_IR_INTERNAL_H
#define GRAPHTRAIN_IR_INTERNAL_H

#include "graphtrain/gt_graph.h"

/* One prototype per op: gt_shape_<name>, defined in shape_rules*.c, referenced by ops.c. */
#define X(E, name, nin, nout, flags, rule, alias, pairs, recompute, schema)                        \
    gt_status gt_shape_##name(gt_graph *g, const gt_node *n, gt_type *out_types, int *n_out,       \
                              gt_error *err);
#include "graphtrain/gt_ops.def"
#undef X

/* ---------------------------------------------------------------- attribute schema */

/* Attribute classes, in the slot arrays of gt_attrs: i (int64), f (double), e (gt_expr). */
enum { GT_ATTR_I = 0, GT_ATTR_F, GT_ATTR_E, GT_ATTR_CLASSES };
#define GT_SCHEMA_MAX_NAMES 8

/* A schema string "i:a,b f:c e:d*" parsed: per class the slot names, in order; a trailing '*'
 * name is a list that takes every remaining slot of its class; trailing names ending in '?' are
 * optional slots a node may leave out (from the end: "i:a,b?" allows 1 or 2 ints), for an
 * attribute added to an op after graphs without it were built (its absence means what the op
 * did before). A class has a list or optional names, not both. */
typedef struct {
    int n_classes;
    int order[GT_ATTR_CLASSES]; /* classes in the order the schema names them */
    int n_names[GT_ATTR_CLASSES];
    int n_optional[GT_ATTR_CLASSES];                        /* trailing names that end in '?' */
    bool has_list[GT_ATTR_CLASSES];                         /* last name of the class ends in '*' */
    const char *name[GT_ATTR_CLASSES][GT_SCHEMA_MAX_NAMES]; /* points into the schema string */
    int name_len[GT_ATTR_CLASSES][GT_SCHEMA_MAX_NAMES];     /* without the '*' */
} gt_schema;

/* The op table's schemas are static and well-formed (checked by test_graph), so this never fails.
 */
void gt_schema_parse(const char *schema, gt_schema *out);
/* Slots a class has without its list: names minus the list name. */
static inline int gt_schema_fixed(const gt_schema *s, int cls)
{
    return s->n_names[cls] - (s->has_list[cls] ? 1 : 0);
}
/* Slots a node must give: the fixed ones minus the optional ones. */
static inline int gt_schema_required(const gt_schema *s, int cls)
{
    return gt_schema_fixed(s, cls) - s->n_optional[cls];
}
int gt_attr_class_max(int cls); /* GT_MAX_IATTR, GT_MAX_FATTR, GT_MAX_EATTR */

/* Checks a node's attribute counts against its op's schema. With fill, missing int/float slots of
 * the required part are added as zeros (so a NULL attrs means "all zero"; optional slots left out
 * stay out, since their absence has a meaning of its own); expression slots cannot
 * default (0 is a real expression), so missing ones are an error. Unused slots are zeroed in
 * either mode when fill is set, so equal attributes compare equal with memcmp.
 * label names the node ("matmul at layers.0.wq"). */
gt_status gt_attrs_fit(gt_op op, gt_attrs *a, bool fill, const char *label, gt_error *err);

/* Number of outputs the op produces for these attributes (split: one per size;
 * fused_elementwise: its program's outputs), clamped to [0, GT_MAX_OUT]. For GT_NONE-filling
 * outs on error. */
int gt_op_n_out(gt_op op, const gt_attrs *a);

/* ---------------------------------------------------------------- nodes */

/* Appends a node built from proto: op, n_in, in, attrs, fqn, phase, origin, n_tags, tags must be
 * set; proto->out and n_out are filled on success. Validates op, arity, input ids, attributes and
 * metadata, runs the shape rule and creates the output values. Nothing is appended on error. */
gt_status gt_graph_append_node(gt_graph *g, gt_node *proto, gt_error *err);

/* "matmul at layers.0.attention.wq" or "matmul" when the node has no fqn. */
void gt_node_label(const gt_graph *g, const gt_node *n, char *buf, size_t len);

/* Records err into g->err unless an earlier error is already recorded there (first error wins). */
void gt_graph_record_error(gt_graph *g, const gt_error *err);

bool gt_graph_str_valid(const gt_graph *g, gt_str s);

/* ---------------------------------------------------------------- shape rule helpers */

/* Every shape-rule message starts with the node's label, so it names the op and its fqn:
 * "matmul at layers.0.attention.wq: inner dims differ: 256 vs 512 (...)". */
gt_status gt_shape_fail(gt_graph *g, const gt_node *n, gt_error *err, gt_status code,
                        const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static inline const gt_type *gt_shape_in(const gt_graph *g, const gt_node *n, int k)
{
    return &g->values[n->in[k]].type;
}
bool gt_expr_is_one(const gt_graph *g, gt_expr e);
/* "f32[batch*seq, 256]" into buf; returns buf, for messages. */
const char *gt_type_str(const gt_graph *g, const gt_type *t, char *buf, size_t len);
const char *gt_expr_str(const gt_graph *g, gt_expr e, char *buf, size_t len);
/* Input k must have a float dtype / an index dtype (i32, i64). */
gt_status gt_shape_need_float(gt_graph *g, const gt_node *n, int k, gt_error *err);
gt_status gt_shape_need_index(gt_graph *g, const gt_node *n, int k, gt_error *err);
/* Inputs k0 and k1 must have the same dtype / the same dtype and shape. */
gt_status gt_shape_need_same_dtype(gt_graph *g, const gt_node *n, int k0, int k1, gt_error *err);
gt_status gt_shape_need_same_type(gt_graph *g, const gt_node *n, int k0, int k1, gt_error *err);
gt_status gt_shape_need_rank(gt_graph *g, const gt_node *n, int k, int rank, gt_error *err);
/* A dim-index attribute: 0 <= dim < ndim (the builder has already normalised negatives). */
gt_status gt_shape_need_dim(gt_graph *g, const gt_node *n, const char *what, int64_t dim, int ndim,
                            gt_error *err);
/* An expression used as a size: valid, and not a negative constant. */
gt_status gt_shape_need_size(gt_graph *g, const gt_node *n, const char *what, gt_expr e,
                             gt_error *err);

/* ---------------------------------------------------------------- text */

/* A bounded text builder that keeps counting past its capacity, so callers get snprintf's "length
 * needed" semantics from a sequence of appends. */
typedef struct {
    char *buf;
    size_t cap;
    size_t len; /* length needed so far (may exceed cap - 1) */
} gt_strbuf;

void gt_strbuf_init(gt_strbuf *sb, char *buf, size_t cap);
void gt_strbuf_printf(gt_strbuf *sb, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void gt_strbuf_expr(gt_strbuf *sb, const gt_graph *g, gt_expr e);

#endif
