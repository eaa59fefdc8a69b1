/* print.c — the text form of a graph: one line per graph input, node and graph output.
 *
 *   mesh: dp_replicate=1 dp_shard=2 tp=2
 *   input %0 : f32[2048, 256] PARAM tok_embeddings.weight
 *   %41 : f32[batch*seq, 768] = matmul(%40, %12; trans_a=0, trans_b=1)  # layers.0.feed_forward.w1
 *   %7, %8 : f32[b, s, 8, 64], f32[b, 8, s] = sdpa(%4, %5, %6; causal=1, layout=1, scale=0.125)
 *       # layers.0.attention.sdpa fwd
 *   output LOSS loss = %99
 *
 * A parallelized graph (g->mesh.ndim > 0) starts with its mesh line, and a value that is not
 * replicated on every mesh dim has its placements after its type (gt_value_format_placement):
 *   %41 : f32[batch//2*seq, 64] {S(0)@dp_shard, P@tp} = matmul(%40, %12; ...)
 * so an unparallelized graph prints exactly as before.
 *
 * Everything printed comes from the graph's contents (no addresses, no hash order), so identical
 * graphs print identical text and a copy prints like its original: dumps diff cleanly. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "ir/fused_program.h"
#include "ir/ir_internal.h"

void gt_strbuf_init(gt_strbuf *sb, char *buf, size_t cap)
{
    sb->buf = buf;
    sb->cap = cap;
    sb->len = 0;
    if (buf && cap) buf[0] = '\0';
}

void gt_strbuf_printf(gt_strbuf *sb, const char *fmt, ...)
{
    size_t room = sb->len < sb->cap ? sb->cap - sb->len : 0;
    char *dst = room ? sb->buf + sb->len : NULL;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(dst, room, fmt, ap);
    va_end(ap);
    if (n > 0) sb->len += (size_t)n;
}

void gt_strbuf_expr(gt_strbuf *sb, const gt_graph *g, gt_expr e)
{
    if (e == GT_EXPR_INVALID) {
        gt_strbuf_printf(sb, "<invalid>");
        return;
    }
    /* Past capacity, format into a scratch byte only to learn the length needed. */
    char scratch[1];
    size_t room = sb->len < sb->cap ? sb->cap - sb->len : 0;
    int n = room ? gt_sym_format(g->sym, e, sb->buf + sb->len, room)
                 : gt_sym_format(g->sym, e, scratch, sizeof scratch);
    if (n > 0) sb->len += (size_t)n;
}

static void strbuf_type(gt_strbuf *sb, const gt_graph *g, const gt_type *t)
{
    bool known = (int)t->dtype >= 0 && t->dtype < GT_DTYPE_COUNT;
    if (known)
        gt_strbuf_printf(sb, "%s[", gt_dtype_name(t->dtype));
    else
        gt_strbuf_printf(sb, "dtype%d[", (int)t->dtype);
    for (int k = 0; k < t->ndim && k < GT_MAX_DIMS; k++) {
        if (k) gt_strbuf_printf(sb, ", ");
        gt_strbuf_expr(sb, g, t->dims[k]);
    }
    gt_strbuf_printf(sb, "]");
}

/* " {S(0)@dp_shard, P@tp}" after a value's type; nothing when it is replicated everywhere. */
static void strbuf_placement(gt_strbuf *sb, const gt_graph *g, gt_value_id v)
{
    if (g->mesh.ndim <= 0) return;
    char small[128];
    int n = gt_value_format_placement(g, v, small, sizeof small);
    if (n <= 0) return;
    if ((size_t)n < sizeof small) {
        gt_strbuf_printf(sb, " %s", small);
        return;
    }
    char *big = gt_xmalloc((size_t)n + 1);
    gt_value_format_placement(g, v, big, (size_t)n + 1);
    gt_strbuf_printf(sb, " %s", big);
    free(big);
}

int gt_graph_format_type(const gt_graph *g, const gt_type *t, char *buf, size_t len)
{
    gt_strbuf sb;
    gt_strbuf_init(&sb, buf, len);
    strbuf_type(&sb, g, t);
    return (int)sb.len;
}

static const char *safe_str(const gt_graph *g, gt_str s)
{
    return gt_graph_str_valid(g, s) ? gt_graph_str(g, s) : "<bad string>";
}

/* One attribute slot of class cls as text. Slots named "dtype" print the dtype's name. */
static void strbuf_attr(gt_strbuf *sb, const gt_graph *g, const gt_attrs *a, int cls, int k,
                        bool is_dtype)
{
    if (cls == GT_ATTR_I) {
        if (is_dtype && a->i[k] >= 0 && a->i[k] < GT_DTYPE_COUNT)
            gt_strbuf_printf(sb, "%s", gt_dtype_name((gt_dtype)a->i[k]));
        else
            gt_strbuf_printf(sb, "%lld", (long long)a->i[k]);
    } else if (cls == GT_ATTR_F) {
        gt_strbuf_printf(sb, "%.9g", a->f[k]);
    } else {
        gt_strbuf_expr(sb, g, a->e[k]);
    }
}

/* An operand of a fused program: "x1" (the node's input 1) or "t0" (instruction 0's result). */
static void strbuf_fused_src(gt_strbuf *sb, int src)
{
    if (src >= GT_FUSED_TEMP)
        gt_strbuf_printf(sb, "t%d", src - GT_FUSED_TEMP);
    else
        gt_strbuf_printf(sb, "x%d", src);
}

/* A fused_elementwise program as its instructions, "t0 = silu(x0) bf16, t1 = mul(t0, x1) bf16":
 * operand xK is input K, tJ the result of instruction J; cK names float constant K (consts=[..]);
 * "out" marks a flagged output (the last instruction is one too). A word that does not decode to
 * an elementwise instruction prints as its integer. */
static void strbuf_fused_prog(gt_strbuf *sb, const gt_node *n)
{
    int ni = n->attrs.ni < GT_MAX_IATTR ? n->attrs.ni : GT_MAX_IATTR;
    gt_strbuf_printf(sb, "[");
    for (int k = 0; k < ni; k++) {
        int64_t w = n->attrs.i[k];
        gt_fused_ins ins = gt_fused_decode(w);
        int arity = gt_fused_arity(ins.op);
        if (k) gt_strbuf_printf(sb, ", ");
        if (arity == 0 || gt_fused_has_extra_bits(w) || ins.dtype < 0 ||
            ins.dtype >= GT_DTYPE_COUNT) {
            gt_strbuf_printf(sb, "%lld", (long long)w);
            continue;
        }
        gt_strbuf_printf(sb, "t%d = %s(", k, gt_op_get((gt_op)ins.op)->name);
        for (int q = 0; q < arity; q++) {
            if (q) gt_strbuf_printf(sb, ", ");
            strbuf_fused_src(sb, ins.src[q]);
        }
        for (int q = 0; q < gt_fused_n_const(ins.op); q++)
            gt_strbuf_printf(sb, ", c%d", ins.fslot + q);
        gt_strbuf_printf(sb, ") %s%s", gt_dtype_name((gt_dtype)ins.dtype), ins.out ? " out" : "");
    }
    gt_strbuf_printf(sb, "]");
}

/* "trans_a=0, trans_b=1", "keepdim=0, dims=[1, 2]", in the schema's order. */
static void strbuf_attrs(gt_strbuf *sb, const gt_graph *g, const gt_node *n, bool after_inputs)
{
    const gt_op_info *info = gt_op_get(n->op);
    gt_schema s;
    gt_schema_parse(info->schema, &s);
    const uint8_t counts[GT_ATTR_CLASSES] = {n->attrs.ni, n->attrs.nf, n->attrs.ne};
    bool first = true;
    for (int c = 0; c < s.n_classes; c++) {
        int cls = s.order[c];
        int limit = counts[cls] < gt_attr_class_max(cls) ? counts[cls] : gt_attr_class_max(cls);
        int fixed = gt_schema_fixed(&s, cls);
        for (int j = 0; j < s.n_names[cls]; j++) {
            bool list = s.has_list[cls] && j == s.n_names[cls] - 1;
            bool is_dtype = s.name_len[cls][j] == 5 && !strncmp(s.name[cls][j], "dtype", 5);
            /* an optional slot left out prints nothing: graphs without it read as before */
            if (j >= gt_schema_required(&s, cls) && j >= limit && !list) continue;
            gt_strbuf_printf(sb, "%s%.*s=", first ? (after_inputs ? "; " : "") : ", ",
                             s.name_len[cls][j], s.name[cls][j]);
            first = false;
            if (!list) {
                if (j < limit)
                    strbuf_attr(sb, g, &n->attrs, cls, j, is_dtype);
                else
                    gt_strbuf_printf(sb, "?");
                continue;
            }
            if (n->op == GT_OP_FUSED_ELEMENTWISE && cls == GT_ATTR_I && fixed == 0) {
                strbuf_fused_prog(sb, n);
                continue;
            }
            gt_strbuf_printf(sb, "[");
            for (int k = fixed; k < limit; k++) {
                if (k > fixed) gt_strbuf_printf(sb, ", ");
                strbuf_attr(sb, g, &n->attrs, cls, k, is_dtype);
            }
            gt_strbuf_printf(sb, "]");
        }
    }
}

/* A value's type and placements ("f32[8, 4] {S(0)@dp_shard}"); returns the length needed. */
static int format_value_type(const gt_graph *g, gt_value_id v, char *buf, size_t len)
{
    gt_strbuf sb;
    gt_strbuf_init(&sb, buf, len);
    strbuf_type(&sb, g, &g->values[v].type);
    strbuf_placement(&sb, g, v);
    return (int)sb.len;
}

int gt_graph_format_node(const gt_graph *g, gt_node_id id, char *buf, size_t len)
{
    gt_strbuf sb;
    gt_strbuf_init(&sb, buf, len);
    if (id < 0 || id >= g->n_nodes) {
        gt_strbuf_printf(&sb, "<node %d out of range>", id);
        return (int)sb.len;
    }
    const gt_node *n = &g->nodes[id];
    const gt_op_info *info = gt_op_get(n->op);
    int n_out = n->n_out < GT_MAX_OUT ? n->n_out : GT_MAX_OUT;
    int n_in = n->n_in < GT_MAX_IN ? n->n_in : GT_MAX_IN;
    for (int k = 0; k < n_out; k++)
        gt_strbuf_printf(&sb, "%s%%%d", k ? ", " : "", n->out[k]);
    gt_strbuf_printf(&sb, " : ");
    for (int k = 0; k < n_out; k++) {
        if (k) gt_strbuf_printf(&sb, ", ");
        gt_value_id v = n->out[k];
        if (v >= 0 && v < g->n_values) {
            strbuf_type(&sb, g, &g->values[v].type);
            strbuf_placement(&sb, g, v);
        } else
            gt_strbuf_printf(&sb, "?");
    }
    gt_strbuf_printf(&sb, " = %s(", info ? info->name : "<unknown op>");
    for (int k = 0; k < n_in; k++)
        gt_strbuf_printf(&sb, "%s%%%d", k ? ", " : "", n->in[k]);
    if (info) strbuf_attrs(&sb, g, n, n_in > 0);
    gt_strbuf_printf(&sb, ")  # ");
    const char *fqn = safe_str(g, n->fqn);
    if (fqn[0]) gt_strbuf_printf(&sb, "%s ", fqn);
    gt_strbuf_printf(&sb, "%s", gt_phase_name((gt_phase)n->phase));
    if (n->n_tags > 0) {
        gt_strbuf_printf(&sb, " [");
        for (int k = 0; k < n->n_tags && k < GT_MAX_TAGS; k++)
            gt_strbuf_printf(&sb, "%s%s", k ? "," : "", safe_str(g, n->tags[k]));
        gt_strbuf_printf(&sb, "]");
    }
    if (n->origin != GT_NONE) gt_strbuf_printf(&sb, " <- n%d", n->origin);
    return (int)sb.len;
}

void gt_graph_print(const gt_graph *g, FILE *f)
{
    char small[512];
    char *line = small;
    size_t cap = sizeof small;
    if (g->mesh.ndim > 0) {
        fputs("mesh:", f);
        for (int d = 0; d < g->mesh.ndim && d < GT_MESH_MAX_DIMS; d++)
            fprintf(f, " %s=%d", safe_str(g, g->mesh.name[d]), g->mesh.size[d]);
        fputs("\n", f);
    }
    for (int32_t k = 0; k < g->n_inputs; k++) {
        const gt_io *io = &g->inputs[k];
        fprintf(f, "input %%%d : ", io->value);
        if (io->value >= 0 && io->value < g->n_values) {
            size_t need = (size_t)format_value_type(g, io->value, line, cap);
            if (need >= cap) {
                cap = need + 1;
                line = line == small ? gt_xmalloc(cap) : gt_xrealloc(line, cap);
                format_value_type(g, io->value, line, cap);
            }
            fputs(line, f);
        } else {
            fputs("?", f);
        }
        const char *name = safe_str(g, io->fqn);
        fprintf(f, " %s%s%s\n", gt_input_kind_name((gt_input_kind)io->kind), name[0] ? " " : "",
                name);
    }
    for (gt_node_id n = 0; n < g->n_nodes; n++) {
        size_t need = (size_t)gt_graph_format_node(g, n, line, cap);
        if (need >= cap) {
            cap = need + 1;
            line = line == small ? gt_xmalloc(cap) : gt_xrealloc(line, cap);
            gt_graph_format_node(g, n, line, cap);
        }
        fprintf(f, "%s\n", line);
    }
    for (int32_t k = 0; k < g->n_outputs; k++) {
        const gt_io *io = &g->outputs[k];
        const char *name = safe_str(g, io->fqn);
        fprintf(f, "output %s%s%s = %%%d\n", gt_output_kind_name((gt_output_kind)io->kind),
                name[0] ? " " : "", name, io->value);
    }
    if (line != small) free(line);
}
