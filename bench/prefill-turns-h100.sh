#!/usr/bin/env bash
# A conversation turn's prompt attention on the GPU machine (issue 18's
# multi-turn bar: turn k's first token within 1.2 × its new tokens alone),
# in one call. Build here, into an ignored folder that the call carries:
#
#   d=.carry/h18p; mkdir -p $d
#   CGO_ENABLED=0 go test -c -trimpath -ldflags='-s -w' -o $d/gpu.test ./kernels/gpu
#   CGO_ENABLED=0 go test -c -trimpath -ldflags='-s -w' -o $d/model.test ./pipeline/model
#   CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o $d/forge ./cmd/forge
#   xz -T0 -f $d/gpu.test $d/model.test $d/forge
#
# then run (carry .carry/h18p): bench/prefill-turns-h100.sh [tests] [kernels] [step] [turns]
#
#   tests:   prefill.cu's GPU tests (every kernel against the CPU, piece
#            invariance) and the paged attention conformance
#   kernels: BenchmarkPrefillTurn, the 8B shape's attention of 330 rows at
#            positions 0 and 2000, per kernel (device time per layer)
#   step:    TestGPUTurnStepBench on the 8B Q4_K_M file (made here by forge
#            gen): a turn's whole step alone and after 2000 positions, with
#            kernel profiles
#   turns:   forge bench serve --turns (forge only; the peer is the lead's)
#
# Logs land in $OUT (or ./out), one file per phase.
set -uo pipefail
out=${OUT:-out}
mkdir -p "$out"
d=${CARRY:-.carry/h18p}
bin=/tmp/h18p-bin
mkdir -p $bin
for f in gpu.test model.test forge; do
  [ -f $bin/$f ] || { [ -f $d/$f.xz ] && xz -dc $d/$f.xz >$bin/$f && chmod +x $bin/$f; }
done
export FORGE_REQUIRE_GPU=1 FORGE_CACHE_DIR=${FORGE_CACHE_DIR:-/tmp/forge-kernels}
L8=/tmp/l8.gguf
root=$PWD
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$out/device.txt" 2>&1
model() {
  [ -f $L8 ] || $bin/forge gen --preset llama3-8b --quant q4_k_m --valid-utf8 -o $L8 --progress plain >"$out/gen.txt" 2>&1
}
for phase in "${@:-tests kernels step turns}"; do
  for p in $phase; do
    case $p in
    tests)
      (cd "$root/kernels/gpu" && $bin/gpu.test -test.v -test.timeout 300s \
        -test.run 'TestPrefill|TestConformance/PagedAttention|TestPagedAttention') >"$out/tests.txt" 2>&1
      echo "rc=$?" >>"$out/tests.txt" ;;
    kernels)
      (cd "$root/kernels/gpu" && $bin/gpu.test -test.run '^$' -test.bench PrefillTurn -test.benchtime 20x -test.v) >"$out/kernels.txt" 2>&1
      echo "rc=$?" >>"$out/kernels.txt" ;;
    step)
      model
      (cd "$root/pipeline/model" && FORGE_BIG_MODEL=$L8 $bin/model.test -test.v -test.timeout 300s -test.run TestGPUTurnStepBench) >"$out/step.txt" 2>&1
      echo "rc=$?" >>"$out/step.txt" ;;
    turns)
      model
      $bin/forge bench serve -m l8=$L8 --device gpu --serve-flag=--batch-seqs=16 --clients 1,4 --turns 4 \
        --history-tokens 2000 --turn-tokens 32 --max-tokens 32 >"$out/turns.txt" 2>&1
      echo "rc=$?" >>"$out/turns.txt" ;;
    *) echo "unknown phase $p" >&2; exit 2 ;;
    esac
  done
done
