#!/bin/bash
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
for f in .gpu-debs/*.deb; do dpkg -x "$f" /; done
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release >/dev/null && cmake --build build-gpu -j32 2>&1 | grep -E "error|warning" | head; ls build-gpu/graphtrain || exit 1
t0=$(date +%s)
(cd build-gpu && ctest -L cuda --output-on-failure > $OUT/ctest.txt 2>&1); tail -5 $OUT/ctest.txt; grep -E "Failed|FAIL" $OUT/ctest.txt | head; echo "ctest $(( $(date +%s)-t0 )) s"
python3 bench/bench_multi_gpu.py build-gpu/graphtrain --gpus 4 --layouts fsdp,fsdp_tp --models 1B --steps 12 --skip 4 --timeout 100 --systems graphtrain --json $OUT/b.json --markdown $OUT/b.md > $OUT/b.log 2>&1; tail -3 $OUT/b.log; grep "^| fsdp" $OUT/b.md; echo "bench $(( $(date +%s)-t0 )) s"
python3 bench/fsdp_kernel_times.py build-gpu/graphtrain --model 1B --gpus 4 --tp 2 --top 40 --markdown $OUT/kt_tp.md > $OUT/kt_tp.log 2>&1; tail -2 $OUT/kt_tp.log; head -5 $OUT/kt_tp.md; echo "kt $(( $(date +%s)-t0 )) s"
