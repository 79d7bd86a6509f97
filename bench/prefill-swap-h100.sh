#!/usr/bin/env bash
# Prompt pieces over a cached prefix (--turns) and model swaps (--swap) on
# the GPU machine, this branch's forge against a baseline build, in one
# call (bench/results/2026-11-25-prefill-swap-h100.md):
#
#   $BIN/{forge,forge-base,gpu.test,pipeline.test}.gz (BIN: bin/dev), cross-built here
#   (CGO_ENABLED=0, -trimpath) and carried; every log lands in $OUT/ps.tgz.
#
# PHASES picks the phases (default: all, in this order).
set -uo pipefail
o=${OUT:-out}/ps
mkdir -p "$o"
for f in forge forge-base gpu.test pipeline.test; do
  [ -f ${BIN:-bin/dev}/$f.gz ] && gunzip -c ${BIN:-bin/dev}/$f.gz >/tmp/$f && chmod +x /tmp/$f
done
F=/tmp/forge
B=/tmp/forge-base
t0=$(date +%s)
ph() { echo "$1: $(($(date +%s) - t0)) s" | tee -a "$o/phases.txt"; }
bin() { [ "$1" = base ] && echo $B || echo $F; }
nvidia-smi -L >"$o/gpu.txt" 2>&1
for phase in ${PHASES:-kernels models swap turns swaptest swapbatch pipegpu}; do
  case $phase in
  kernels)
    (cd kernels/gpu && FORGE_REQUIRE_GPU=1 timeout 60 /tmp/gpu.test -test.v -test.run 'TestPrefill|TestPagedAttention') >"$o/kernels.txt" 2>&1
    echo "rc=$?" >>"$o/kernels.txt" ;;
  models)
    [ -f /tmp/l8.gguf ] || $F gen --preset llama3-8b --quant q4_k_m -o /tmp/l8.gguf --progress plain >"$o/gen.txt" 2>&1
    [ -f /tmp/l8b.gguf ] || $F gen --preset llama3-8b --quant q4_k_m --seed 2 -o /tmp/l8b.gguf --progress plain >>"$o/gen.txt" 2>&1
    cat /tmp/l8.gguf /tmp/l8b.gguf >/dev/null ;;
  swap)
    for b in ${BINS:-new base}; do
      timeout 40 $(bin $b) bench serve -m a=/tmp/l8.gguf -m b=/tmp/l8b.gguf --device gpu --swap --budget 8GiB \
        --requests-per-client 6 >"$o/swap-$b.txt" 2>&1
      echo "rc=$?" >>"$o/swap-$b.txt"
      ph "swap-$b"
    done ;;
  turns)
    for b in ${BINS:-new base}; do
      timeout 50 $(bin $b) bench serve -m l8=/tmp/l8.gguf --device gpu --serve-flag=--batch-seqs=16 --clients 1 \
        --turns 4 --history-tokens 2000 --turn-tokens 32 --max-tokens 32 >"$o/turns-$b.txt" 2>&1
      echo "rc=$?" >>"$o/turns-$b.txt"
      ph "turns-$b"
    done ;;
  swapbatch) # the same swaps with batching on (each load also makes a KV pool)
    for b in ${BINS:-new base}; do
      timeout 40 $(bin $b) bench serve -m a=/tmp/l8.gguf -m b=/tmp/l8b.gguf --device gpu --serve-flag=--batch-seqs=16 \
        --swap --budget 14GiB --requests-per-client 6 >"$o/swapbatch-$b.txt" 2>&1
      echo "rc=$?" >>"$o/swapbatch-$b.txt"
      ph "swapbatch-$b"
    done ;;
  pipegpu) # the pipeline's GPU tests of the engine and batching
    d=$(mktemp -d)
    mkdir -p "$d/github.com/forge-llm" && ln -s "$PWD" "$d/github.com/forge-llm/forge"
    (cd "$d" && FORGE_REQUIRE_GPU=1 timeout 60 /tmp/pipeline.test -test.v -test.run 'TestEngineGPUUnloadsAndEvicts|TestGPUBatchInvariant' \
      -test.timeout 60s) >"$o/pipegpu.txt" 2>&1
    echo "rc=$?" >>"$o/pipegpu.txt" ;;
  swaptest)
    d=$(mktemp -d)
    mkdir -p "$d/github.com/forge-llm" && ln -s "$PWD" "$d/github.com/forge-llm/forge"
    (cd "$d" && FORGE_REQUIRE_GPU=1 FORGE_SWAP_MODELS=/tmp/l8.gguf,/tmp/l8b.gguf FORGE_SWAP_DEBUG=${SWAP_DEBUG:-1} \
      timeout 60 /tmp/pipeline.test -test.v -test.run 'TestEngineGPUSwap$' -test.timeout 60s) >"$o/swaptest.txt" 2>&1
    echo "rc=$?" >>"$o/swaptest.txt" ;;
  *) echo "unknown phase $phase" >&2 ;;
  esac
  ph "$phase"
done
tar -C "${OUT:-out}" -czf "${OUT:-out}/ps.tgz" ps 2>/dev/null
