#!/usr/bin/env bash
# Issue 20's last bar (stories260K F32, Q8_0, Q4_0, Q4_K_M: forge perplexity
# on the GPU within 0.05 % of the CPU) with the 8-bit prompt product for
# Q4_0 alone (kernels/gpu mmqDefault), and the batched engine's invariance
# with it (batch.Config.ReplayPreempted), in one call on the GPU machine,
# from the repository root (it needs gguf/testdata), with static binaries
# built here:
#
#   CGO_ENABLED=0 go test -c -trimpath -ldflags='-s -w' -o $BIN/gpu.test ./kernels/gpu
#   CGO_ENABLED=0 go test -c -trimpath -ldflags='-s -w' -o $BIN/pipeline.test ./pipeline
#   CGO_ENABLED=0 go test -c -trimpath -ldflags='-s -w' -o $BIN/model.test ./pipeline/model
#   CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o $BIN/forge ./cmd/forge
#   (and $BIN/forge-main: the same build of the commit to compare speed with)
#
# 1. kernel checks: mmq32 and the q8 GEMM against the CPU backend, the
#    conformance suite's products, the FMA GEMM (now with Q4_0 on 8-bit x);
# 2. TestGPUPerplexityMatchesCPU (the default choice), then forge
#    perplexity per file: the CPU, and the GPU with the default (q4_0=q8),
#    the old path (q4_0=f16), Q8_0 on 8-bit x too (q8_0=q8: the Q4_0 file's
#    output layer is Q8_0), and both at -b 64 (every 8-bit product of a
#    chunk through mmq32 instead of the q8 GEMM);
# 3. TestGPUBatchInvariant three times (it preempts: 32 blocks of 16 for
#    16 requests) and the pipeline/model GPU tests;
# 4. forge bench gen -p 512 -n 128 on the 8B shape in Q4_0 (forge gen
#    --preset llama3-8b --quant q4_0), this build and forge-main one after
#    the other.
# Every step has its own time limit; the summary goes to stdout and
# $OUT/summary, the logs to $OUT/logs.tgz (rewritten after each step).
set -uo pipefail
out=${OUT:-out}
bin=$(cd "${BIN:-bin/q40}" && pwd)
root=$PWD
mkdir -p "$out" /tmp/q40-logs
logs=/tmp/q40-logs
export FORGE_REQUIRE_GPU=1 FORGE_CACHE_DIR=/tmp/forge-kernels
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/summary"
"$bin/forge" gen --preset llama3-8b --quant q4_0 -o /tmp/l8-q4_0.gguf --progress plain >"$logs/gen.log" 2>&1 &
gen=$!
d=$(mktemp -d)
mkdir -p "$d/github.com/forge-llm" && ln -s "$root" "$d/github.com/forge-llm/forge"
step() { # name limit command...
  local name=$1 limit=$2 rc
  shift 2
  (cd "$d" && timeout "$limit" "$@") >"$logs/$name.log" 2>&1
  rc=$?
  echo "== $name: exit $rc" | tee -a "$out/summary"
  tar -C /tmp -czf "$out/logs.tgz" q40-logs # after every step: a call cut short keeps what ran
}
step kernels 60 "$bin/gpu.test" -test.v -test.timeout 60s \
  -test.run 'TestMMQ32MatchesCPU|TestPromptGEMMFMAFallback|TestConformance/(MatMulPrompt|MatMul$)|TestMatMulFastAndGEMM|TestMultiRowMatMulAccuracy|TestParseMMQ'
grep -hE -- '--- FAIL|^(ok|FAIL|PASS)' "$logs/kernels.log" | head -20 | tee -a "$out/summary"
step ppl-test 45 "$bin/pipeline.test" -test.v -test.run 'TestGPUPerplexityMatchesCPU'
grep -hE -- 'CPU .*GPU|--- (FAIL|PASS)' "$logs/ppl-test.log" | tee -a "$out/summary"
story=$root/gguf/testdata/story.txt
for f in F32 Q8_0 Q4_0 Q4_K_M; do
  m=$root/gguf/testdata/stories260K-$f.gguf
  # variant: device, batch (0: the chunk), --gpu-mmq
  for v in cpu:0: gpu:0: gpu:0:q4_0=f16 gpu:0:q8_0=q8 gpu:64: gpu:64:q8_0=q8; do
    IFS=: read -r dev b mmq <<<"$v"
    name=$f-$dev-b$b-${mmq:-default}
    step "ppl-$name" 30 "$bin/forge" perplexity -m "$m" -f "$story" -c 128 -b "$b" --json --device "$dev" --gpu-mmq "$mmq"
    printf '%s ppl %s\n' "$name" "$(grep -o '"ppl": *[0-9.]*' "$logs/ppl-$name.log" | grep -o '[0-9.]*$')" | tee -a "$out/summary"
  done
done
for i in 1 2 3; do
  step "invariant-$i" 60 "$bin/pipeline.test" -test.v -test.run 'TestGPUBatchInvariant'
  grep -hE -- '--- (FAIL|PASS)|differ from|among others' "$logs/invariant-$i.log" | head -12 | tee -a "$out/summary"
done
step model-gpu 120 "$bin/model.test" -test.v -test.timeout 120s -test.run 'TestGPU|TestArchGreedyGPU'
grep -hE -- '^--- FAIL|^(ok|FAIL|PASS)' "$logs/model-gpu.log" | head -20 | tee -a "$out/summary"
wait $gen
echo "gen: exit $? ($(ls -l /tmp/l8-q4_0.gguf 2>/dev/null | awk '{print $5}'))" | tee -a "$out/summary"
for f in forge forge-main forge; do
  step "gen-q4_0-$f" 60 "$bin/$f" bench gen -m /tmp/l8-q4_0.gguf --device gpu -p 512 -n 128 -r 3
  grep -E 'pp512|tg128|error' "$logs/gen-q4_0-$f.log" | sed "s/^/$f: /" | tee -a "$out/summary"
done
tar -C /tmp -czf "$out/logs.tgz" q40-logs
