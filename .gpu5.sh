for f in .gpu-debs/*.deb; do dpkg -x $f /; done; ldconfig
export NCCL_NVLS_ENABLE=0
(cmake -S . -B /tmp/bg -DCMAKE_BUILD_TYPE=Release >/dev/null && cmake --build /tmp/bg -j16 2>&1 | grep -E "error" | head)
cd /tmp/bg && timeout 330 ctest -L cuda -j1 --output-on-failure > $OUT/ctest_cuda.txt 2>&1; echo ctest rc=$?; grep -E "tests passed|Failed|FAILED|\*\*\*|Test +#" $OUT/ctest_cuda.txt | tail -25; cd - >/dev/null
timeout 100 /tmp/bg/graphtrain train --model.name deepseek_v3 --model.flavor 16B_4layers --training.device cuda --training.local_batch_size 4 --training.seq_len 2048 --training.steps 10 --metrics.log_freq 1 --job.dump_folder /tmp/d16 --job.print_config false > $OUT/d16.txt 2>&1; grep -E "step 10 |params xxh|rror" $OUT/d16.txt | tail -2
timeout 100 /tmp/bg/graphtrain train --config configs/llama3_1b.toml --training.device cuda --training.steps 10 --metrics.log_freq 1 --job.dump_folder /tmp/l1 --job.print_config false > $OUT/l1.txt 2>&1; grep -E "step 10 |rror" $OUT/l1.txt | tail -2
