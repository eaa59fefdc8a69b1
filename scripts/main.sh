#!/usr/bin/env bash
# The main job: install what is missing, build, and train the default configuration on the CPU
# (a tiny llama3 on the built-in synthetic corpus; see configs/default.toml). Extra arguments are
# config overrides, e.g. --training.steps 50.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
bash scripts/build.sh build
./build/graphtrain train --config configs/default.toml "$@"
