/* gt_graph.h — the IR (DESIGN.md §3): an index-based SSA graph.
 *
 * Values and nodes live in arrays and refer to each other by 32-bit index. Nodes are stored in a
 * valid topological order (every input is a graph input or an output of an earlier node); the
 * verifier checks it. Strings (fqn, tags, names) are interned in the graph's string table. Shapes
 * are symbolic (gt_sym.h); the graph owns its expression pool. */
#ifndef GRAPHTRAIN_GT_GRAPH_H
#define GRAPHTRAIN_GT_GRAPH_H

#include <stdio.h>

#include "gt_core.h"
#include "gt_sym.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef int32_t gt_value_id;
typedef int32_t gt_node_id;
typedef int32_t gt_str; /* index into the graph's string table; 0 = "" */
#define GT_NONE (-1)

#define GT_MAX_IN 8
#define GT_MAX_OUT 8
#define GT_MAX_TAGS 4
#define GT_MAX_IATTR 8
#define GT_MAX_FATTR 4
#define GT_MAX_EATTR 8

/* ---------------------------------------------------------------- ops */

enum {
    GT_OPF_ELEMENTWISE = 1 << 0,
    GT_OPF_REDUCTION = 1 << 1,
    GT_OPF_VIEW = 1 << 2,
    GT_OPF_COLLECTIVE = 1 << 3,
    GT_OPF_RANDOM = 1 << 4,
    GT_OPF_SIDE_EFFECT = 1 << 5,
    GT_OPF_SOURCE = 1 << 6, /* no inputs (constants) */
    /* no arithmetic (0 FLOPs); its CPU kernel takes any dtype's bytes (gt_ops.def) */
    GT_OPF_MOVES_BYTES = 1 << 7,
    /* not MOVES_BYTES, yet its CPU kernel takes bf16/f16 as they are (gt_ops.def) */
    GT_OPF_NO_WIDEN = 1 << 8,
    /* autodiff treats its outputs as constants: no gradient flows through them (gt_ops.def) */
    GT_OPF_NONDIFF = 1 << 9,
};

/* Which output may share a buffer with which input (gt_ops.def's alias column). */
typedef enum {
    GT_ALIAS_NONE = 0,
    GT_ALIAS_VIEW,
    GT_ALIAS_VIEW_RUN,
    GT_ALIAS_RESULT,
    GT_ALIAS_PACK,
    GT_ALIAS_IN_PLACE,
    GT_ALIAS_STATE,
} gt_alias_kind;

/* What recomputing an op's output costs (gt_ops.def's recompute column). */
typedef enum {
    GT_RECOMPUTE_FREE = 0,
    GT_RECOMPUTE_PASS,
    GT_RECOMPUTE_KEEP,
    GT_RECOMPUTE_KEEP_PARAM,
    GT_RECOMPUTE_FLOPS,
} gt_recompute_class;

typedef enum {
#define X(E, name, nin, nout, flags, rule, alias, pairs, recompute, schema) GT_OP_##E,
#include "gt_ops.def"
#undef X
    GT_OP_COUNT
} gt_op;

/* Attributes: a fixed set of typed slots whose meaning each op's schema names (gt_ops.def). */
typedef struct {
    int64_t i[GT_MAX_IATTR];
    double f[GT_MAX_FATTR];
    gt_expr e[GT_MAX_EATTR];
    uint8_t ni, nf, ne;
} gt_attrs;

typedef struct gt_graph gt_graph;
typedef struct gt_node gt_node;

/* Shape/dtype rule: from the node's inputs (already set) and attributes, fill the dtype and shape
 * of each output. On misuse returns GT_ERR_SHAPE with a message naming the op, input and dims. */
typedef struct {
    gt_dtype dtype;
    int ndim;
    gt_expr dims[GT_MAX_DIMS];
} gt_type;
typedef gt_status (*gt_shape_rule)(gt_graph *g, const gt_node *n, gt_type *out_types, int *n_out,
                                   gt_error *err);

typedef struct {
    const char *name;
    int n_in;  /* -1 variadic */
    int n_out; /* -1 from attributes */
    unsigned flags;
    const char *schema;
    gt_shape_rule shape;
    gt_alias_kind alias;
    const char *alias_pairs; /* "out=in ...", '*' = every slot */
    gt_recompute_class recompute;
} gt_op_info;

const gt_op_info *gt_op_get(gt_op op);
bool gt_op_from_name(const char *name, gt_op *out);
/* all_gather_start, reduce_scatter_start, all_reduce_start or all_to_all_start (a start that a
 * wait completes). */
bool gt_op_is_collective_start(gt_op op);
/* The (output slot, input slot) pairs of node n's alias column, '*' expanded over n's slots, in
 * the table's order; at most GT_MAX_IN * GT_MAX_OUT. Returns how many. */
int gt_op_alias_pairs(const gt_node *n, int pairs[][2]);

/* ---------------------------------------------------------------- values and nodes */

typedef enum { GT_PHASE_FORWARD = 0, GT_PHASE_BACKWARD, GT_PHASE_OPTIMIZER } gt_phase;
const char *gt_phase_name(gt_phase p); /* "fwd", "bwd", "opt" */

/* ---------------------------------------------------------------- placements (src/parallel/)
 *
 * A parallelized graph carries a device mesh (gt_graph.mesh) and, per value and mesh dim, how the
 * value is laid out over the ranks of that dim (torch DTensor's placements):
 *   replicate  every rank holds the whole value;
 *   shard(d)   tensor dim d is split into n equal contiguous blocks, rank coordinate r holds block
 *              r; when several mesh dims shard the same tensor dim, `order` nests them: the lowest
 *              order is the outermost split;
 *   partial    every rank holds a summand: the value is the sum over the ranks of the mesh dim.
 * A value's type is its local (per-rank) type. Zero-initialised = replicate on every mesh dim,
 * which is what an unparallelized graph is. */
/* dp_replicate, dp_shard, tp, and expert parallel's efsdp and ep (gt_parallel.h); a pipeline
 * step unrolled for one rank (gt_pp_unroll) adds pp, its point-to-point nodes' dim */
#define GT_MESH_MAX_DIMS 6
typedef enum { GT_PLACE_REPLICATE = 0, GT_PLACE_SHARD, GT_PLACE_PARTIAL } gt_place_kind;
typedef struct {
    uint8_t kind; /* gt_place_kind */
    int8_t dim;   /* shard: the tensor dim */
    uint8_t order;
    /* shard of a dim that does not divide (FSDP storage only): every rank holds ceil(D / n) rows,
     * rank r's block starts at r * ceil(D / n), and rows past D are zeros */
    uint8_t padded;
} gt_placement;

typedef struct {
    int32_t ndim; /* 0: not parallelized */
    int32_t size[GT_MESH_MAX_DIMS];
    gt_str name[GT_MESH_MAX_DIMS]; /* "dp_replicate", "dp_shard", "tp" [, "efsdp", "ep"] [, "pp"] */
} gt_graph_mesh;

typedef struct {
    gt_type type;
    gt_placement place[GT_MESH_MAX_DIMS]; /* per mesh dim of the graph's mesh */
    gt_node_id producer;                  /* GT_NONE for graph inputs */
    int32_t producer_slot;
    gt_str name; /* optional */
} gt_value;

/* Structural units (gt_node.unit), set by the model builder (gt_graph_set_unit) and copied by
 * autodiff, parallelize and the passes to the nodes they derive: what memory policy, FSDP
 * bucketing, reordering and the comm report group by, so that no pass parses a module path.
 *   >= 0            repeated block N (a transformer layer): one recompute region, one FSDP unit
 *   GT_UNIT_EMBED   the token embedding (its own FSDP unit)
 *   GT_UNIT_REST    everything else: final norm, output projection, loss, optimizer */
#define GT_UNIT_EMBED (-1)
#define GT_UNIT_REST (-2)

struct gt_node {
    gt_op op;
    uint8_t n_in, n_out;
    uint8_t phase; /* gt_phase */
    uint8_t n_tags;
    gt_value_id in[GT_MAX_IN];
    gt_value_id out[GT_MAX_OUT];
    gt_attrs attrs;
    gt_str fqn;        /* module path that built it: "layers.3.attention.wq" */
    gt_node_id origin; /* backward node: the forward node it differentiates; else GT_NONE */
    int32_t unit;      /* structural unit (GT_UNIT_*, or a block index >= 0) */
    gt_str tags[GT_MAX_TAGS];
};

/* ---------------------------------------------------------------- graph inputs and outputs */

typedef enum { GT_IN_PARAM = 0, GT_IN_BUFFER, GT_IN_OPT_STATE, GT_IN_INPUT } gt_input_kind;
typedef enum {
    GT_OUT_LOSS = 0,
    GT_OUT_GRAD,
    GT_OUT_PARAM_UPDATE,
    GT_OUT_BUFFER_UPDATE,
    GT_OUT_METRIC,
    GT_OUT_OPT_STATE_UPDATE /* new value of the OPT_STATE input of the same name */
} gt_output_kind;
const char *gt_input_kind_name(gt_input_kind k);   /* "PARAM", ... */
const char *gt_output_kind_name(gt_output_kind k); /* "LOSS", ... */

/* The model's parallel plan for one parameter (set by its builder, gt_graph_set_input_plan; the
 * optimizer gives a parameter's moments and gradient sums the same plan): how tensor parallelism
 * splits it and what role it plays, so that parallel/layout.c places inputs from these alone. */
typedef enum {
    GT_TP_NONE = 0, /* replicated over tp */
    GT_TP_COLWISE,  /* a Linear's weight [out, in] split on dim 0 (torch's ColwiseParallel) */
    GT_TP_ROWWISE,  /* split on dim 1 (RowwiseParallel) */
} gt_tp_style;
typedef enum {
    GT_ROLE_NONE = 0,
    GT_ROLE_EMBEDDING, /* the token embedding table [V, D]: vocabulary-parallel rows under tp; FSDP
                        * shards its columns without tp (the step then moves tokens, not rows) */
    GT_ROLE_OUTPUT,    /* the output projection [V, D] (vocabulary-parallel loss under tp) */
    GT_ROLE_EXPERT,    /* routed-expert weights [E, ..] (MoE): whole experts on a rank; where ep
                        * takes tp ranks, stored over the flattened dp_shard x tp ranks */
} gt_param_role;
typedef struct {
    uint8_t tp;       /* gt_tp_style */
    uint8_t role;     /* gt_param_role */
    uint8_t as_param; /* placed as a parameter (FSDP storage): every PARAM, and the state the
                       * optimizer keeps per parameter (moments, gradient sums) */
    int32_t unit;     /* the structural unit whose nodes use it (GT_UNIT_REST by default) */
} gt_param_plan;

typedef struct {
    gt_value_id value;
    int kind;           /* gt_input_kind or gt_output_kind */
    gt_str fqn;         /* parameter/buffer fqn or input/metric name */
    gt_param_plan plan; /* inputs only; a PARAM's defaults to {as_param 1, unit GT_UNIT_REST} */
} gt_io;

/* ---------------------------------------------------------------- the graph */

struct gt_graph {
    gt_node *nodes;
    int32_t n_nodes, cap_nodes;
    gt_value *values;
    int32_t n_values, cap_values;
    gt_io *inputs;
    int32_t n_inputs, cap_inputs;
    gt_io *outputs;
    int32_t n_outputs, cap_outputs;
    gt_sym_pool *sym;
    gt_graph_mesh mesh; /* set by parallelize; ndim 0 otherwise */
    /* string table: concatenated NUL-terminated strings; offsets index it; a hash index dedups. */
    char *str_data;
    int32_t str_len, str_cap;
    int32_t *str_offsets;
    int32_t n_strs, cap_strs;
    int32_t *str_index; /* open addressing, size str_index_cap, -1 empty */
    int32_t str_index_cap;
    /* Builder state: metadata stamped on every node added (never read at run time). */
    gt_str cur_fqn;
    gt_phase cur_phase;
    gt_node_id cur_origin;
    int32_t cur_unit; /* GT_UNIT_REST unless a builder set one */
    /* Sticky builder error: the first failing gt_graph_add_node records it here; later adds with
     * a GT_NONE input return GT_NONE too, so model code checks once at the end. */
    gt_error err;
};

gt_graph *gt_graph_new(void);
void gt_graph_free(gt_graph *g);
/* Deep copy (arrays, strings, expression pool). */
gt_graph *gt_graph_copy(const gt_graph *g);

gt_str gt_graph_intern(gt_graph *g, const char *s);
const char *gt_graph_str(const gt_graph *g, gt_str s);

/* Adds a graph input of the given type; returns its value. */
gt_value_id gt_graph_add_input(gt_graph *g, gt_input_kind kind, const char *fqn, gt_dtype dt,
                               int ndim, const gt_expr *dims);
void gt_graph_add_output(gt_graph *g, gt_output_kind kind, const char *fqn, gt_value_id v);
/* Sets the parallel plan of the graph input whose value is v (no-op when v is no input). */
void gt_graph_set_input_plan(gt_graph *g, gt_value_id v, gt_param_plan plan);
/* The plan of the input whose value is v (no plan, unit GT_UNIT_REST, when v is no input). */
gt_param_plan gt_graph_input_plan(const gt_graph *g, gt_value_id v);

/* Appends a node: checks arity, runs the op's shape rule, creates the outputs, stamps the
 * builder metadata. Writes the output ids to outs (may be NULL) and returns the first output, or
 * GT_NONE on error (recorded in g->err; an input that is GT_NONE propagates silently). */
gt_value_id gt_graph_add_node(gt_graph *g, gt_op op, const gt_value_id *in, int n_in,
                              const gt_attrs *attrs, gt_value_id *outs);

/* Builder metadata */
/* What the builder stamps on the next node (module path, phase, origin, unit): code that adds
 * nodes on another's behalf (autodiff, the optimizer, passes) saves it and restores it after. */
typedef struct {
    gt_str fqn;
    gt_phase phase;
    gt_node_id origin;
    int32_t unit;
} gt_builder_state;
gt_builder_state gt_graph_builder_save(const gt_graph *g);
void gt_graph_builder_restore(gt_graph *g, gt_builder_state s);
/* "node %12 matmul at layers.0.attention.wq" (the fqn omitted when empty), for messages. */
void gt_graph_node_label(const gt_graph *g, gt_node_id n, char *buf, size_t len);
void gt_graph_set_fqn(gt_graph *g, const char *fqn); /* NULL or "" clears */
void gt_graph_set_unit(gt_graph *g, int32_t unit);   /* GT_UNIT_* or a block index */
/* The tag on expert parallelism's token exchange (each all_to_all_start parallelize emits for a
 * MoE layer, both directions): the EP overlap schedule pairs the chunks' exchanges by it. */
#define GT_TAG_TOKEN_EXCHANGE "moe.all_to_all"
void gt_graph_add_tag(gt_graph *g, gt_node_id n, const char *tag);
bool gt_node_has_tag(const gt_graph *g, const gt_node *n, const char *tag);

static inline gt_value *gt_graph_value(gt_graph *g, gt_value_id v)
{
    return &g->values[v];
}
static inline const gt_type *gt_value_type(const gt_graph *g, gt_value_id v)
{
    return &g->values[v].type;
}

/* Same dtype, rank and (hash-consed) dims. */
bool gt_type_equal(const gt_type *a, const gt_type *b);

/* The same attributes: counts, then every integer, float (bit for bit) and expression. */
bool gt_attrs_equal(const gt_attrs *a, const gt_attrs *b);

/* Concrete shape of a value under a binding of its symbols. */
gt_status gt_graph_eval_shape(const gt_graph *g, gt_value_id v, const gt_sym_binding *b,
                              int64_t *shape, gt_error *err);

/* Gradient accumulation runs a step graph in two parts: the micro-batch part — every node that
 * the LOSS and BUFFER_UPDATE outputs (the running gradient sums) depend on: forward, backward,
 * the sums — once per micro-batch, and the whole graph (the optimizer too) for the last one.
 * part[n] = 1 for the nodes of the micro-batch part, 0 for the rest; returns how many have 1.
 * The part is closed under inputs, so it runs alone in graph order. */
int32_t gt_graph_micro_part(const gt_graph *g, uint8_t *part);
/* For each graph input k, the value of the BUFFER_UPDATE output of the same fqn (the buffer's
 * next value, fed back between runs), or GT_NONE: an array of g->n_inputs (+1) the caller
 * frees. */
gt_value_id *gt_graph_buffer_updates(const gt_graph *g);
/* Whether a run of the micro-batch part computes outputs of this gt_output_kind: the loss and the
 * running sums (those the part is made of), not the optimizer's. */
bool gt_graph_micro_output(int kind);
/* What a run executes: the whole graph, or only its micro-batch part (a micro-batch before the
 * last). */
typedef enum { GT_RUN_ALL = 0, GT_RUN_MICRO } gt_run_part;

/* Whether a and b have the same inputs and outputs: as many, each of the same name (fqn) and kind,
 * in the same order (an artifact against the graph it stands for). */
bool gt_graph_same_io(const gt_graph *a, const gt_graph *b);

/* Verifier: SSA (each value produced once, inputs defined before use), order, arity, attribute
 * counts, and shapes/dtypes (re-runs every shape rule and compares). Names the first bad node. */
gt_status gt_graph_verify(const gt_graph *g, gt_error *err);

/* Printer: one stable, diffable line per node, e.g.
 *   %41 : f32[batch*seq, 768] = matmul(%40, %12; trans_a=0, trans_b=1)  # layers.0.feed_forward.w1
 * fwd preceded by one line per graph input and followed by one per output. */
void gt_graph_print(const gt_graph *g, FILE *f);
/* One node into buf; returns the length needed. */
int gt_graph_format_node(const gt_graph *g, gt_node_id n, char *buf, size_t len);
int gt_graph_format_type(const gt_graph *g, const gt_type *t, char *buf, size_t len);

/* Placement text (src/ir/placement.c): "R", "S(0)", "S(0)#1" (order 1), "S(0)+pad", "P"; a value's
 * placements over the graph's mesh as "{S(0)@dp_shard, P@tp}" ("" when replicated everywhere).
 * Return the length needed. */
int gt_placement_format(gt_placement p, char *buf, size_t len);
int gt_value_format_placement(const gt_graph *g, gt_value_id v, char *buf, size_t len);

/* Copies nodes [first, last) of src into dst (which may be src), remapping inputs through map
 * (indexed by src value id; GT_NONE entries map to themselves when dst == src, else error).
 * On return map holds the copies' output ids. Used by remat and chunking. */
gt_status gt_graph_copy_region(gt_graph *dst, const gt_graph *src, gt_node_id first,
                               gt_node_id last, gt_value_id *map, gt_error *err);
/* One symbol of the shapes and the expression that replaces it in a copy (chunking: "batch" by a
 * chunk's size). */
typedef struct {
    const char *name;
    gt_expr repl; /* in the destination's pool */
} gt_sym_subst;
/* Copies nodes ids[0..n) of src, in that order, into dst as gt_graph_copy_region does (map in and
 * out, output types re-derived), with symbol subst->name replaced by subst->repl in every
 * expression attribute when subst is not NULL. */
gt_status gt_graph_copy_nodes(gt_graph *dst, const gt_graph *src, const gt_node_id *ids, int n,
                              gt_value_id *map, const gt_sym_subst *subst, gt_error *err);

/* Number of nodes that use each value (array of n_values; caller frees). Graph outputs count. */
int32_t *gt_graph_use_counts(const gt_graph *g);

/* Graphviz DOT form of the graph (src/ir/dot.c): nodes in nested clusters by module path (at most
 * three fqn components deep), filled by phase, recompute tag and collective flag; graph inputs and
 * outputs as distinct shapes; edges from producer to consumer. Identical graphs give identical
 * text. title names the digraph and labels it (NULL: "graph"). */
void gt_graph_write_dot(const gt_graph *g, FILE *f, const char *title);

/* The graph as text (src/ir/serialize.c; the format is described there): inputs, nodes (op,
 * attributes, fqn, phase, tags, origin), every value's type, placements and name, outputs, the
 * mesh. gt_graph_read rebuilds it through the builder, each node's output types recomputed by its
 * shape rule and required to match, then verified: malformed or inconsistent text is a
 * GT_ERR_FORMAT naming the line, never a crash. Node ids are kept; value ids may be renumbered. */
gt_status gt_graph_write(const gt_graph *g, FILE *f, gt_error *err);
gt_status gt_graph_read(const char *text, size_t len, gt_graph **out, gt_error *err);

#ifdef __cplusplus
}
#endif
#endif
