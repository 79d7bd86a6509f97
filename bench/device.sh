#!/usr/bin/env bash
# Everything GPU-side in one call, on the GPU machine (which has the CUDA
# driver and nvrtc but no Go). Build here first with `make device`, carry
# bin/device, then run from the repository root:
#
#   bench/device.sh [quick|full]
#
# quick: the correctness tests of every GPU package; full (default): also
# their benchmarks. Logs go to $OUT (or ./out): one file per package plus a
# summary in $OUT/log.
set -uo pipefail
mode=${1:-full}
out=${OUT:-out}
mkdir -p "$out"
export FORGE_REQUIRE_GPU=1 FORGE_CACHE_DIR=${FORGE_CACHE_DIR:-/tmp/forge-kernels}
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
} 2>&1 | tee "$out/log"
status=0
for bin in bin/device/rocm.test bin/device/kernels/gpu.test bin/device/actors.test bin/device/pipeline.test; do
  name=$(echo "${bin#bin/device/}" | tr / -)
  pkg=${bin#bin/device/}; pkg=${pkg%.test}
  # Tests read their testdata relative to the package folder.
  # The pipeline binary's CPU tests run in CI; here only its GPU ones.
  # Built with -trimpath, it finds gguf/testdata (package testmodels) at
  # github.com/forge-llm/forge/gguf/testdata relative to its directory.
  run=. dir=$pkg
  if [ "$pkg" = pipeline ] || [ "$pkg" = actors ]; then
    run=GPU; [ "$pkg" = actors ] && run=Device; dir=$(mktemp -d)
    mkdir -p "$dir/github.com/forge-llm" && ln -s "$PWD" "$dir/github.com/forge-llm/forge"
  fi
  (cd "$dir" && "$OLDPWD/$bin" -test.v -test.run "$run" -test.timeout 300s) >"$out/$name.log" 2>&1
  rc=$?; [ $rc -ne 0 ] && status=$rc
  echo "== $pkg tests: exit $rc" | tee -a "$out/log"
  grep -E -- '^(--- FAIL|ok|PASS|FAIL|panic)' "$out/$name.log" | tee -a "$out/log"
  if [ "$mode" = full ] && [ "$pkg" != pipeline ] && [ "$pkg" != actors ]; then
    (cd "$pkg" && "$OLDPWD/$bin" -test.run '^$' -test.bench . -test.benchtime 100x -test.timeout 280s) \
      >"$out/$name-bench.log" 2>&1
    grep -E '^Benchmark' "$out/$name-bench.log" | tee -a "$out/log"
  fi
done
exit $status
