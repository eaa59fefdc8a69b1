for f in .gpu-debs/*.deb; do dpkg -x $f /; done; ldconfig
export NCCL_NVLS_ENABLE=0
(cmake -S . -B /tmp/bg -DCMAKE_BUILD_TYPE=Release >/dev/null && cmake --build /tmp/bg -j16 2>&1 | grep -E "error" | head)
cd /tmp/bg && timeout 330 ctest -L cuda -j1 --output-on-failure > $OUT/ctest_cuda.txt 2>&1; echo ctest rc=$?; grep -E "tests passed|\*\*\*Failed" $OUT/ctest_cuda.txt | tail -12; grep "FAIL" $OUT/ctest_cuda.txt | head -8 | cut -c1-250
