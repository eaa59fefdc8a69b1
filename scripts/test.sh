#!/usr/bin/env bash
# The test job: check the module order of the includes, install what is missing, build with
# -Werror, run every test; then rebuild under AddressSanitizer + UndefinedBehaviorSanitizer and run
# them all again.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "== layers (scripts/check_layers.sh)"
bash scripts/check_layers.sh
bash scripts/deps.sh
jobs=$(nproc)
echo "== build (-Wall -Wextra -Werror)"
bash scripts/build.sh build -DGT_WERROR=ON
echo "== tests"
ctest --test-dir build --output-on-failure -j "$jobs" -LE cuda
echo "== build (ASan + UBSan)"
bash scripts/build.sh build-asan -DGT_WERROR=ON -DGT_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug
echo "== tests under ASan + UBSan"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build-asan --output-on-failure -j "$jobs" -LE "cuda|slow"
