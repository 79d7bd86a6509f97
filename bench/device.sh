#!/usr/bin/env bash
# Everything GPU-side in one call, on the GPU machine (which has the CUDA
# driver and nvrtc but no Go). Build here first with `make device`, carry
# bin/device, then run from the repository root:
#
#   bench/device.sh [quick|full|load]
#
# quick: the correctness tests of every GPU package; full (default): also
# their benchmarks. Logs go to $OUT (or ./out): one file per package plus a
# summary in $OUT/log.
#
# load: the load path on the 8B shape (bench/results/2026-11-25-gpu-h100.md).
# Binaries from $BIN (default bin/device, from `make device`): actors.test, pipeline.test, forge
# (CGO_ENABLED=0 go test -c -trimpath -ldflags='-s -w' ./actors, ./pipeline;
# go build -trimpath -ldflags='-s -w' ./cmd/forge). It writes the 8B
# Q4_K_M file ($QUANT to change), warms the page cache, runs the actors
# and pipeline GPU tests and, once each (-test.benchtime 1x), the timing
# benchmarks BenchmarkDeviceRates and BenchmarkGPULoadTiming with
# FORGE_BIG_MODEL (rates, load timings, the uploader settings in $GRID;
# $ACTORS_BENCH / $PIPELINE_BENCH pick others), then times `forge run` from the shell and
# `forge bench load` (fresh processes).
set -uo pipefail
mode=${1:-full}
out=${OUT:-out}
mkdir -p "$out"
export FORGE_REQUIRE_GPU=1 FORGE_CACHE_DIR=${FORGE_CACHE_DIR:-/tmp/forge-kernels}
if [ "$mode" = load ]; then
  bin=${BIN:-bin/device}
  big=/tmp/l8.gguf
  {
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv
    nproc; free -g | head -2
  } 2>&1 | tee "$out/summary"
  t0=$(date +%s%N)
  "$bin/forge" gen --preset llama3-8b --quant "${QUANT:-q4_k_m}" -o $big --progress plain >"$out/gen.log" 2>&1 || { echo "gen failed"; tail "$out/gen.log"; exit 1; }
  t1=$(date +%s%N)
  cat $big >/dev/null
  echo "gen ${QUANT:-q4_k_m}: $(( (t1-t0)/1000000 )) ms, $(stat -c %s $big) bytes" | tee -a "$out/summary"
  dir=$(mktemp -d)
  mkdir -p "$dir/github.com/forge-llm" && ln -s "$PWD" "$dir/github.com/forge-llm/forge"
  (cd "$dir" && FORGE_BIG_MODEL=$big "$OLDPWD/$bin/actors.test" -test.v -test.run "${ACTORS_RUN:-Device}" -test.bench "${ACTORS_BENCH:-DeviceRates}" -test.benchtime 1x -test.timeout 300s) >"$out/actors.log" 2>&1
  echo "== actors: exit $?" | tee -a "$out/summary"
  (cd "$dir" && FORGE_BIG_MODEL=$big FORGE_LOAD_GRID="${GRID:-}" "$OLDPWD/$bin/pipeline.test" -test.v -test.run "${PIPELINE_RUN:-GPU}" -test.bench "${PIPELINE_BENCH:-GPULoadTiming}" -test.benchtime 1x -test.timeout 400s) >"$out/pipeline.log" 2>&1
  echo "== pipeline: exit $?" | tee -a "$out/summary"
  grep -hE -- '^(--- |ok|PASS|FAIL|panic|Benchmark)|RATE|GPU-LOAD|GPU-GRID' "$out/actors.log" "$out/pipeline.log" | sed -E 's/^ +//' >>"$out/summary"
  # One forge run, timed from the shell; -v adds the device's own times
  # (context current, kernels loaded, warm-up done, from Open's start).
  run_forge() {
    local label=$1; shift
    local s e rc
    s=$(date +%s%N)
    env "$@" "$bin/forge" -v run --device gpu -m $big -p "Once upon a time" -n 1 --temp 0 --progress plain >/dev/null 2>"$out/run.err"
    rc=$?
    e=$(date +%s%N)
    echo "forge run [$label]: exit $rc, $(( (e-s)/1000000 )) ms from the shell; $(grep -oE '(context|kernels|warm|reserved|first copy|last copy)"?=[0-9.]+ms' "$out/run.err" | tr '\n' ' ')| $(grep -E '^load:' "$out/run.err" | sed 's/ · prompt.*//')"
  }
  {
    for i in 1 2 3 4 5 6; do run_forge default FORGE_X=; done
    for v in ${RUN_VARIANTS:-}; do
      for i in 1 2 3; do run_forge "$v" "$v"; done
    done
    "$bin/forge" bench load -m $big --device gpu --runs ${RUNS:-5} --cache warm --strategies "${STRATEGIES:-prefetch,eager}"
  } 2>&1 | tee -a "$out/summary"
  exit 0
fi
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
} 2>&1 | tee "$out/log"
# KOBJ=1: compile the CUDA objects of the sources as they are first (the
# shipped ones are stale after a kernel change), return them as
# $out/cuda-obj.tar (bench/kernels-gen.sh merge), and run everything below
# on them.
if [ "${KOBJ:-0}" = 1 ] && [ -x bin/device/kernels-gen ]; then
  if KOBJ_DIR=/tmp/kobj bash bench/kernels-gen.sh cuda >"$out/kobj.txt" 2>&1; then
    export FORGE_KERNEL_OBJECTS=/tmp/kobj/obj
    echo "== kernel objects regenerated" | tee -a "$out/log"
  else
    echo "== kernels-gen failed" | tee -a "$out/log"; tail -5 "$out/kobj.txt" | tee -a "$out/log"
  fi
fi
status=0
for pkg in ${PKGS:-rocm kernels/gpu actors pipeline pipeline/model}; do # PKGS: some of them
  bin=bin/device/$(basename $pkg).test
  name=$(echo "$pkg" | tr / -)
  # Tests read their testdata relative to the package folder.
  # The pipeline binary's CPU tests run in CI; here only its GPU ones.
  # Built with -trimpath, it finds gguf/testdata (package testmodels) at
  # github.com/forge-llm/forge/gguf/testdata relative to its directory.
  run=. dir=$pkg
  if [ "$pkg" = pipeline ] || [ "$pkg" = actors ] || [ "$pkg" = pipeline/model ]; then
    run=GPU; [ "$pkg" = actors ] && run=Device; dir=$(mktemp -d)
    mkdir -p "$dir/github.com/forge-llm" && ln -s "$PWD" "$dir/github.com/forge-llm/forge"
  fi
  (cd "$dir" && "$OLDPWD/$bin" -test.v -test.run "$run" -test.timeout 300s) >"$out/$name.log" 2>&1
  rc=$?; [ $rc -ne 0 ] && status=$rc
  echo "== $pkg tests: exit $rc" | tee -a "$out/log"
  grep -E -- '^(--- FAIL|ok|PASS|FAIL|panic)' "$out/$name.log" | tee -a "$out/log"
  if [ "$mode" = full ] && [ "$pkg" != pipeline ] && [ "$pkg" != actors ] && [ "$pkg" != pipeline/model ]; then
    (cd "$pkg" && "$OLDPWD/$bin" -test.run '^$' -test.bench . -test.benchtime 100x -test.timeout 280s) \
      >"$out/$name-bench.log" 2>&1
    grep -E '^Benchmark' "$out/$name-bench.log" | tee -a "$out/log"
  fi
done
exit $status
