#!/usr/bin/env bash
# GPU decode and prompt rates on the 8B and 7B shapes (Q4_K_M), and the GPU
# correctness tests that guard them, in one call on the GPU machine
# (bench/results/). Build here first with `make device`, carry bin/device
# (or set $BIN), and run from the repository root: bench/gpu-decode.sh
# [tests|bench|all]. Logs go to $OUT (or ./out); the summary is printed last.
set -uo pipefail
mode=${1:-all}
out=${OUT:-out}
bin=${BIN:-bin/device}
mkdir -p "$out"
export FORGE_REQUIRE_GPU=1 FORGE_CACHE_DIR=${FORGE_CACHE_DIR:-/tmp/forge-kernels}
sum="$out/summary"
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,memory.total --format=csv
} 2>&1 | tee "$sum"
# -trimpath test binaries find gguf/testdata relative to their directory.
dir=$(mktemp -d)
mkdir -p "$dir/github.com/forge-llm" && ln -s "$PWD" "$dir/github.com/forge-llm/forge"
root=$PWD

gen() { # preset file
  local s=$(date +%s%N)
  timeout 400 "$bin/forge" gen --preset "$1" --quant q4_k_m -o "$2" --progress plain >"$out/gen-$1.log" 2>&1
  local rc=$?
  echo "gen $1: exit $rc, $(( ($(date +%s%N)-s)/1000000 )) ms, $(stat -c %s "$2" 2>/dev/null) bytes" >>"$sum"
}
if [ "$mode" != tests ]; then
  gen llama3-8b /tmp/l8.gguf &
  g8=$!
  gen llama2-7b /tmp/l7.gguf &
  g7=$!
fi

if [ "$mode" != bench ]; then
  (cd "$dir" && "$root/$bin/gpu.test" -test.v -test.run "${GPU_RUN:-Step|Conformance|AttentionF16|Argmax|MatMul}" -test.timeout 300s) >"$out/gpu.log" 2>&1
  echo "== kernels/gpu tests: exit $?" >>"$sum"
  (cd "$dir" && "$root/$bin/model.test" -test.v -test.run 'GPUGraphDecode' -test.timeout 300s) >"$out/model.log" 2>&1
  echo "== pipeline/model GPU tests: exit $?" >>"$sum"
  (cd "$dir" && "$root/$bin/pipeline.test" -test.v -test.run 'GPUTokensMatchCPU' -test.timeout 300s) >"$out/pipeline.log" 2>&1
  echo "== pipeline GPUTokensMatchCPU: exit $?" >>"$sum"
  grep -hE -- '^(--- FAIL|--- PASS|ok|PASS|FAIL|panic)|worst|differs|ids equal' "$out/gpu.log" "$out/model.log" "$out/pipeline.log" | sed -E 's/^ +//' | head -60 >>"$sum"
fi

if [ "$mode" != tests ]; then
  wait $g8 $g7
  cat /tmp/l8.gguf /tmp/l7.gguf >/dev/null
  p512=$(python3 -c "import random; random.seed(1); w=['the','cat','sat','on','a','mat','and','then','it','ran','far','away','into','woods','where','old','trees','grew']; s=''
while len(s) < 508: s += random.choice(w) + ' '
print(s[:508])")
  for f in /tmp/l8.gguf /tmp/l7.gguf; do
    for g in 0 1; do
      for p in short long; do
        text="Once upon a time"; [ $p = long ] && text=$p512
        "$bin/forge" run --device gpu -m $f -p "$text" -n 128 --temp 0 $([ $g = 0 ] && echo --no-graph) \
          --progress plain >/dev/null 2>"$out/run.err"
        echo "forge run $(basename $f) graph=$g prompt=$p: $(grep -E 'prompt [0-9]+ tok' "$out/run.err" | tail -1)" >>"$sum"
      done
    done
  done
  (cd "$dir" && FORGE_BIG_MODEL=/tmp/l8.gguf,/tmp/l7.gguf "$root/$bin/model.test" -test.v -test.run 'GPUDecodeBench' -test.timeout 400s) >"$out/bench.log" 2>&1
  echo "== GPUDecodeBench: exit $?" >>"$sum"
  grep -hE 'GPU-BENCH|GPU-PROFILE|^(--- |ok|FAIL|panic)' "$out/bench.log" | sed -E 's/^ +//; s/^gpu_bench_test.go:[0-9]+: //' >>"$sum"
fi
cat "$sum"
