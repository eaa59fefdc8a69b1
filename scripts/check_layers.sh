#!/usr/bin/env bash
# check_layers.sh — fails on any #include that runs against the module order (DESIGN.md §2).
#
# The order, lowest first; a module may use the modules below it, transitively:
#
#   core
#   ir        <- core
#   autodiff  <- ir           models <- ir          (models: ir only)
#   passes    <- ir           parallel <- ir
#   backend   <- ir           backend: core and, of ir, the op table and the IR types that a
#                             program's instructions carry (gt_backend.h includes gt_graph.h)
#   comm      <- core
#   runtime   <- autodiff, parallel, passes, backend, comm   (backend and comm through
#                                                              gt_backend.h, gt_cuda.h, gt_comm.h)
#   config    <- core         (the option schema and the TOML parser)
#   train     <- runtime, models, config
#   cli       <- train        (the graphtrain program)
#
# The rule: a file of module A (src/A/..., or a public header A owns, see PUBLIC below) may include
#   - any header of A;
#   - a public header (include/graphtrain/) of a module below A;
#   - a private header (src/B/...) of a module B below A only where EXPORTS names it for A.
# Anything else is an include up the order or sideways, and the script names the file, the line
# and both modules. Includes in <> are system headers (unless they start with graphtrain/). CMake
# enforces the private part when compiling too (each module sees only its own folder of src/ and
# its SEE headers, CMakeLists.txt); the public part is enforced only here. Tests, benches and tools
# are not modules: they may include anything.
#
#   scripts/check_layers.sh [ROOT]     (ROOT: the repository, default this script's parent)
set -euo pipefail
root=${1:-"$(cd "$(dirname "$0")/.." && pwd)"}
cd "$root"

# module: the modules it uses directly (as gt_module's DEPS in CMakeLists.txt, less the temporary
# gt_passes of parallel)
DEPS='
core:
ir: core
autodiff: ir
models: ir
passes: ir
parallel: ir
backend: ir
comm: core
runtime: autodiff parallel passes backend comm
config: core
train: runtime models config
cli: train
'

# public header: the module that owns it (every file of include/graphtrain/ must be listed)
PUBLIC='
gt_core.h core
gt_init.h core
gt_sym.h core
gt_safetensors.h core
gt_graph.h ir
gt_ops.def ir
gt_build.h ir
gt_flops.h ir
gt_autodiff.h autodiff
gt_model.h models
gt_llama3.h models
gt_deepseek_v3.h models
gt_pass.h passes
gt_partition.h passes
gt_pp_split.h passes
gt_parallel.h parallel
gt_autoparallel.h parallel
gt_backend.h backend
gt_cuda.h backend
gt_comm.h comm
gt_program.h runtime
gt_exec.h runtime
gt_pipeline.h runtime
gt_config.h config
gt_checkpoint.h train
gt_data.h train
gt_lr.h train
gt_metrics.h train
gt_optim.h train
gt_tokenizer.h train
gt_train.h train
'

# private header: the modules above its own that may include it (CMakeLists.txt's SEE lists)
EXPORTS='
src/ir/fused_program.h passes backend
src/core/rng_shared.h backend
'

# TEMPORARY allow-list (issue 35): known leaks being removed in other branches. Each line: the
# including file, the included file. Whoever removes a leak deletes its line here (and its SEE or
# DEPS marked TEMPORARY in CMakeLists.txt); a line no longer needed is reported.
ALLOW='
'

files=$( (find src include/graphtrain -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' \
    -o -name '*.cuh' -o -name '*.def' \) | LC_ALL=C sort) )

# awk reads: the tables (prefixed), the list of files, then every file's include lines.
{
    printf '%s\n' "$DEPS" | sed -n 's/^\([a-z]*\):\(.*\)$/D \1 \2/p'
    printf '%s\n' "$PUBLIC" | sed -n 's/^\(gt_[a-z0-9_]*\.[a-z]*\) \([a-z]*\)$/P \1 \2/p'
    printf '%s\n' "$EXPORTS" | sed -n 's/^\(src\/[^ ]*\) \(.*\)$/E \1 \2/p'
    printf '%s\n' "$ALLOW" | sed -n 's/^\([^ ]*\) \([^ ]*\)$/A \1 \2/p'
    printf '%s\n' "$files" | sed 's/^/F /'
    # every include line: I file line kind target (kind: " or <)
    printf '%s\n' "$files" | { xargs grep -Hn '^[[:space:]]*#[[:space:]]*include[[:space:]]*["<]' || true; } |
        sed -n 's/^\([^:]*\):\([0-9]*\):[[:space:]]*#[[:space:]]*include[[:space:]]*\(["<]\)\([^">]*\)[">].*$/I \1 \2 \3 \4/p'
} | awk '
function below_all(m,    k, n, ds, i) {   # closure of DEPS, into BELOW[m, x]
    if (m in DONE) return
    DONE[m] = 1
    n = split(DIRECT[m], ds, " ")
    for (i = 1; i <= n; i++) {
        below_all(ds[i])
        BELOW[m, ds[i]] = 1
        for (k in MODS) if ((ds[i], k) in BELOW) BELOW[m, k] = 1
    }
}
function norm(p,    parts, n, i, out, k, o) {   # a/b/../c -> a/c, a/./b -> a/b
    n = split(p, parts, "/")
    k = 0
    for (i = 1; i <= n; i++) {
        if (parts[i] == "." || parts[i] == "") continue
        if (parts[i] == ".." && k > 0 && o[k] != "..") { k--; continue }
        o[++k] = parts[i]
    }
    out = ""
    for (i = 1; i <= k; i++) out = out (i > 1 ? "/" : "") o[i]
    return out
}
function dirname(p) { return p ~ /\// ? substr(p, 1, match(p, /\/[^\/]*$/) - 1) : "." }
function module_of(p,    h, parts) {
    if (p ~ /^include\/graphtrain\//) {
        h = substr(p, length("include/graphtrain/") + 1)
        return (h in OWNER) ? OWNER[h] : ""
    }
    if (p ~ /^src\/[a-z_]+\//) { split(p, parts, "/"); return (parts[2] in MODS) ? parts[2] : "" }
    return ""
}
function fail(msg) { print "check_layers: " msg > "/dev/stderr"; BAD++ }
$1 == "D" { MODS[$2] = 1; DIRECT[$2] = ""; for (i = 3; i <= NF; i++) DIRECT[$2] = DIRECT[$2] " " $i; next }
$1 == "P" { OWNER[$2] = $3; next }
$1 == "E" { for (i = 3; i <= NF; i++) EXPORT[$2, $i] = 1; next }
$1 == "A" { ALLOW[$2, $3] = 1; next }
$1 == "F" {
    FILE[$2] = 1
    if (module_of($2) == "") fail($2 ": belongs to no module (add it to the tables of scripts/check_layers.sh)")
    next
}
$1 == "I" {
    if (!CLOSED) { for (m in MODS) below_all(m); CLOSED = 1 }
    f = $2; line = $3; kind = $4; inc = $5
    if (kind == "<" && inc !~ /^graphtrain\//) next
    # resolve as the compiler does: next to the including file, then include/, then src/
    t = ""
    if (kind == "\"" && (norm(dirname(f) "/" inc) in FILE)) t = norm(dirname(f) "/" inc)
    else if (("include/" inc) in FILE) t = "include/" inc
    else if (("src/" inc) in FILE) t = "src/" inc
    if (t == "") { fail(f ":" line ": #include \"" inc "\" is no file of src/ or include/"); next }
    a = module_of(f); b = module_of(t)
    if (a == "" || b == "" || a == b) next
    ok = ((a, b) in BELOW) && (t ~ /^include\// || (t, a) in EXPORT)
    if (!ok && (f, t) in ALLOW) { USED[f, t] = 1; next }
    if (ok) next
    if ((a, b) in BELOW) why = "a private header of " b ", not exported to " a
    else if ((b, a) in BELOW) why = "up the order: " b " is above " a
    else why = "sideways: " b " is not below " a
    fail(f ":" line ": " a " includes " t " (" why ")")
    next
}
END {
    for (k in ALLOW) if (!(k in USED)) {
        split(k, p, SUBSEP)
        print "check_layers: note: allow-list entry no longer needed: " p[1] " " p[2] > "/dev/stderr"
    }
    if (BAD) { print "check_layers: " BAD " include(s) against the module order (scripts/check_layers.sh header)" > "/dev/stderr"; exit 1 }
    print "check_layers: ok"
}'
