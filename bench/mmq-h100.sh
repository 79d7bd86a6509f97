#!/usr/bin/env bash
# The tensor-core batched matmul (kernels/gpu/cu/mmq.cu) on the GPU machine
# in one call: ptxas resources, its tests, the per-row-count benchmark
# against the multi-row matrix-vector kernels, and the batched decode step
# of the 8B shape with and without it (FORGE_GPU_NO_MMQ=1). Binaries, built
# here and carried as bin/dev:
#
#   for p in kernels/gpu pipeline/model; do
#     CGO_ENABLED=0 go test -c -trimpath -ldflags='-s -w' -o bin/dev/$(basename $p).test ./$p; done
#   CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o bin/dev/forge ./cmd/forge
#
#   bench/mmq-h100.sh [phases…]   # default: ptxas test bench step
#
# Each phase runs only if the call's budget ($BUDGET seconds from the start,
# default 160) leaves room; the 8B file is written in the background from
# the start. Logs in $OUT.
set -uo pipefail
o=${OUT:-out}
mkdir -p "$o"
t0=$(date +%s)
budget=${BUDGET:-160}
left() { echo $((budget - ($(date +%s) - t0))); }
export FORGE_REQUIRE_GPU=1 FORGE_CACHE_DIR=/tmp/forge-kernels
big=/tmp/l8.gguf
phases=${*:-ptxas test bench step}
sum=$o/summary.txt
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; } >"$sum" 2>&1
if [[ " $phases " == *" step "* ]]; then
  (bin/dev/forge gen --preset llama3-8b --quant q4_k_m -o $big --progress plain >"$o/gen.txt" 2>&1 && cat $big >/dev/null
   echo "gen done at $(( $(date +%s) - t0 )) s" >>"$o/gen.txt") &
fi
mkdir -p pipeline/model kernels/gpu
d=$(mktemp -d)
mkdir -p "$d/github.com/forge-llm" && ln -s "$PWD" "$d/github.com/forge-llm/forge"
for ph in $phases; do
  echo "== $ph at $(( $(date +%s) - t0 )) s, $(left) s left" >>"$sum"
  case $ph in
  ptxas)
    (cd kernels/gpu/cu && timeout 40 nvcc -arch=sm_90 -cubin -Xptxas -v -o /tmp/mmq.cubin mmq.cu) >"$o/ptxas.txt" 2>&1
    grep -E "Compiling entry|registers|spill" "$o/ptxas.txt" | sed -E 's/ptxas info +: //' >>"$sum" ;;
  test)
    (cd kernels/gpu && timeout $(( $(left) > 60 ? 60 : $(left) )) ../../bin/dev/gpu.test -test.v -test.run 'TestMMQ|TestMultiRowMatMul' -test.timeout 120s) >"$o/test.txt" 2>&1
    echo "exit $?" >>"$sum"
    grep -E '^(--- |ok|PASS|FAIL|panic)|differs|error|worst' "$o/test.txt" | head -60 >>"$sum" ;;
  bench)
    (cd kernels/gpu && timeout $(( $(left) - 5 )) ../../bin/dev/gpu.test -test.run '^$' -test.bench "${BENCH:-BenchmarkMMQ}" -test.benchtime ${BENCHTIME:-20x} -test.timeout 300s) >"$o/bench.txt" 2>&1
    echo "exit $?" >>"$sum"
    grep -E '^Benchmark' "$o/bench.txt" | awk '{for(i=1;i<=NF;i++) if($(i)=="us/op") u=$(i-1); print $1, u}' >>"$sum" ;;
  step)
    wait
    tail -2 "$o/gen.txt" >>"$sum"
    for v in new old; do
      [ "$(left)" -lt 25 ] && { echo "step $v: no time left" >>"$sum"; continue; }
      env $([ $v = old ] && echo FORGE_GPU_NO_MMQ=1 || echo FORGE_X=) FORGE_BIG_MODEL=$big \
        timeout $(( $(left) - 3 )) bash -c "cd $d/github.com/forge-llm/forge/pipeline/model && $PWD/bin/dev/model.test -test.v -test.run TestGPUBatchStepBench -test.timeout 300s" >"$o/step-$v.txt" 2>&1
      echo "step $v: exit $?" >>"$sum"
      grep -E 'GPU-BATCH|^(--- |ok|FAIL|panic)' "$o/step-$v.txt" | sed 's/^ *//' >>"$sum"
      grep -E 'GPU-PROFILE' "$o/step-$v.txt" | sed 's/^ *//' | head -34 >>"$sum"
    done ;;
  esac
done
echo "== end at $(( $(date +%s) - t0 )) s" >>"$sum"
