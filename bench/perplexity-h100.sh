#!/usr/bin/env bash
# Issue 20's GPU checks of the 8-bit prompt product of Q4_0 and Q8_0
# weights (kernels/gpu/cu/mmq32.cu) in one call on the GPU machine, from
# the repository root (it needs gguf/testdata), with static binaries built
# here:
#
#   CGO_ENABLED=0 go test -c -trimpath -ldflags='-s -w' -o $BIN/gpu.test ./kernels/gpu
#   CGO_ENABLED=0 go test -c -trimpath -ldflags='-s -w' -o $BIN/pipeline.test ./pipeline
#   CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o $BIN/forge ./cmd/forge
#   (and $BIN/forge-main: the same build of the commit to compare with)
#
# 1. the kernel checks: mmq32 against the CPU backend, the conformance
#    suite's prompt products of every type, the GEMM and mmq checks;
# 2. forge perplexity's CPU-vs-GPU agreement on stories260K (F32, Q8_0,
#    Q4_0, Q4_K_M; TestGPUPerplexityMatchesCPU), with the 8-bit path and,
#    (the comparison without the 8-bit paths is their default now: kernels/gpu q8Prompt);
# 3. `forge bench gen -p 512 -n 0` on the 8B shape in Q4_K_M and Q4_0
#    (forge gen --preset llama3-8b), this build and forge-main, one after
#    the other on the idle GPU;
# 4. with BENCH=1, BenchmarkMMQ32 (the Q4_0 8B shapes at 64-512 rows,
#    the mmq32 kernels vs the GEMM path);
# 5. the GPU's greedy tokens against the CPU's (TestGPUTokensMatchCPU).
# Every step has its own time limit; the summary goes to stdout and
# $OUT/summary, the logs to $OUT/logs.tgz (rewritten after each step).
set -uo pipefail
out=${OUT:-out}
bin=$(cd "${BIN:-bin/ppl}" && pwd)
root=$PWD
mkdir -p "$out" /tmp/ppl-logs
logs=/tmp/ppl-logs
export FORGE_REQUIRE_GPU=1 FORGE_CACHE_DIR=/tmp/forge-kernels
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/summary"
(
  "$bin/forge" gen --preset llama3-8b --quant q4_k_m -o /tmp/l8-q4_k_m.gguf --progress plain &&
    "$bin/forge" gen --preset llama3-8b --quant q4_0 -o /tmp/l8-q4_0.gguf --progress plain
) >"$logs/gen.log" 2>&1 &
gen=$!
d=$(mktemp -d)
mkdir -p "$d/github.com/forge-llm" && ln -s "$root" "$d/github.com/forge-llm/forge"
step() { # name limit command...
  local name=$1 limit=$2 rc
  shift 2
  (cd "$d" && timeout "$limit" "$@") >"$logs/$name.log" 2>&1
  rc=$?
  echo "== $name: exit $rc" | tee -a "$out/summary"
  tar -C /tmp -czf "$out/logs.tgz" ppl-logs # after every step: a call cut short keeps what ran
}
step kernels 60 "$bin/gpu.test" -test.v -test.timeout 60s \
  -test.run 'TestMMQ32MatchesCPU|TestConformance/(MatMulPrompt|Attention)|TestMatMulFastAndGEMM|TestMMQMatchesCPU|TestMultiRowMatMulAccuracy'
grep -hE -- '--- FAIL|off the CPU|worst row against the CPU' "$logs/kernels.log" | grep -E 'FAIL|n=(64|130)|off' | head -40 | tee -a "$out/summary"
step ppl 45 "$bin/pipeline.test" -test.v -test.run 'TestGPUPerplexityMatchesCPU'
grep -hE -- 'CPU .*GPU|--- (FAIL|PASS)' "$logs/ppl.log" | tee -a "$out/summary"
wait $gen
echo "gen: exit $? ($(ls -l /tmp/l8-*.gguf 2>/dev/null | awk '{print $5, $9}' | tr '\n' ' '))" | tee -a "$out/summary"
for q in q4_k_m q4_0; do
  for f in forge forge-main; do
    step "pp512-$q-$f" 40 "$bin/$f" bench gen -m /tmp/l8-$q.gguf --device gpu -p 512 -n 0 -r 3
    grep -E 'pp512|error' "$logs/pp512-$q-$f.log" | sed "s/^/$f $q: /" | tee -a "$out/summary"
  done
done
if [ "${BENCH:-0}" = 1 ]; then
  step bench-mmq32 30 "$bin/gpu.test" -test.run '^$' -test.bench BenchmarkMMQ32 -test.benchtime 10x
  grep -E '^Benchmark' "$logs/bench-mmq32.log" | tee -a "$out/summary"
fi
step tokens 30 "$bin/pipeline.test" -test.v -test.run 'TestGPUTokensMatchCPU'
grep -hE -- '--- (FAIL|PASS)' "$logs/tokens.log" | tee -a "$out/summary"
tar -C /tmp -czf "$out/logs.tgz" ppl-logs
