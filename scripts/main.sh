#!/usr/bin/env bash
# The main job: install what is missing, build, and run graphtrain on the default configuration.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
bash scripts/build.sh build
./build/graphtrain graph --model.name llama3 --model.flavor debugmodel --graph.print false "$@"
