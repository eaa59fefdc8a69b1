#!/bin/sh
# Seeds of fuzz_step_artifact: the precompiled step artifact of a one-step test_tiny run (the
# trainer's own save), the graph text inside it, and a few cut or damaged copies.
# Usage: tests/fuzz/make_step_artifact_corpus.sh BUILD_DIR
set -eu
build=${1:-build}
out=$(dirname "$0")/corpus/step_artifact
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$out"
"$build/graphtrain" train --model.flavor test_tiny --training.steps 1 --training.local_batch_size 2 \
    --training.seq_len 16 --job.print_config false --job.dump_folder "$tmp/run" \
    --compile.precompile_artifact_dir "$tmp/art" >/dev/null 2>&1
cp "$tmp/art/step.graph" "$out/test_tiny.artifact"
# the graph text alone: everything after the "graph BYTES XXH64" line
sed -n '/^graph [0-9]* [0-9a-f]*$/,$p' "$tmp/art/step.graph" | tail -n +2 > "$out/test_tiny.graph"
head -c 2000 "$out/test_tiny.graph" > "$out/cut_graph.txt"
head -c 600 "$out/test_tiny.artifact" > "$out/cut_artifact.txt"
sed 's/ matmul / matmull /' "$out/test_tiny.graph" > "$out/unknown_op.graph"
sed '1s/^graphtrain-graph 2 /graphtrain-graph 2 9/' "$out/test_tiny.graph" > "$out/big_counts.graph"
