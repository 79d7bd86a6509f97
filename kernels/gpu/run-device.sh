#!/usr/bin/env bash
# Runs the GPU tests and benchmarks of kernels/gpu on the GPU machine, from
# the repository root, with the test binary cross-built by `make device`
# (bin/device/kernels/gpu.test). Logs go to $OUT (or ./out).
#   usage: kernels/gpu/run-device.sh [test-regexp] [bench-regexp] [benchtime]
set -uo pipefail
out=${OUT:-out}
mkdir -p "$out"
bin=bin/device/kernels/gpu.test
tests=${1:-.}
bench=${2:-.}
benchtime=${3:-100x}
export FORGE_REQUIRE_GPU=1 FORGE_CACHE_DIR=${FORGE_CACHE_DIR:-/tmp/forge-kernels}
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,memory.total --format=csv
} 2>&1 | tee "$out/log"
if [ "$tests" != "-" ]; then
  "$bin" -test.v -test.run "$tests" -test.timeout 300s >"$out/tests.log" 2>&1
  echo "tests exit $?" | tee -a "$out/log"
  grep -E -B12 -- '--- FAIL|^panic' "$out/tests.log" | grep -v -E '^=== (RUN|PAUSE|CONT)' | head -150 | tee -a "$out/log"
  grep -E -- '^(--- |ok|PASS|FAIL)' "$out/tests.log" | tee -a "$out/log"
fi
if [ "$bench" != "-" ]; then
  "$bin" -test.run '^$' -test.bench "$bench" -test.benchtime "$benchtime" -test.timeout 280s 2>&1 | tee "$out/bench.log" | tee -a "$out/log"
fi
