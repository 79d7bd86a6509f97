#!/usr/bin/env bash
# Model swaps in a warm server, this branch's forge next to a baseline build,
# in one call (bench/results/2026-11-25-night-swap-h100.md):
#
#   .carry/swap/{forge,forge-base,pipeline.test}.xz, cross-built here with
#   CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" (go test -c for the
#   test binary) and xz'd, carried; every log lands in $OUT/sw.tgz.
#
# PHASES picks the phases (default: all, in this order); VARIANTS the bench
# runs: base|new, -b64 (--batch-seqs 64, a budget for one such model),
# -nopin (--pin-files 0), -r10 (10 rounds: 9 swaps).
set -uo pipefail
C=.carry/swap
o=/tmp/sw-out/sw
mkdir -p "$o"
for f in forge forge-base pipeline.test; do xz -dc $C/$f.xz >/tmp/$f && chmod +x /tmp/$f; done
t0=$(date +%s)
ph() { echo "$1: $(($(date +%s) - t0)) s" >>"$o/phases.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$o/device.txt" 2>&1
S="bench serve -m a=/tmp/a.gguf -m b=/tmp/b.gguf --device gpu --swap"
run() { n=$1; shift; timeout 60 "$@" >"$o/$n.txt" 2>&1; echo "rc=$?" >>"$o/$n.txt"; ph "$n"; }
pack() { tar -C /tmp/sw-out -czf "${OUT:-out}/sw.tgz" sw 2>/dev/null; }
for phase in ${PHASES:-gen bench timeline swaptest pipegpu}; do
  case $phase in
  gen)
    /tmp/forge gen --preset llama3-8b --quant q4_k_m --seed 1 -o /tmp/a.gguf --progress plain >"$o/gen.txt" 2>&1
    /tmp/forge gen --preset llama3-8b --quant q4_k_m --seed 2 -o /tmp/b.gguf --progress plain >>"$o/gen.txt" 2>&1
    cat /tmp/a.gguf /tmp/b.gguf >/dev/null; ph gen ;;
  bench)
    for v in ${VARIANTS:-base new-nopin new base-b64 new-b64-nopin new-b64 new-r10 new-b64-r10}; do
      bin=/tmp/forge; [ "${v%%-*}" = base ] && bin=/tmp/forge-base
      fl="--budget 8GiB"; rpc=6
      case $v in *b64*) fl="--budget 30GiB --serve-flag=--batch-seqs=64" ;; esac
      case $v in *nopin*) fl="$fl --serve-flag=--pin-files=0" ;; esac
      case $v in *r10*) rpc=10 ;; esac
      run "$v" $bin $S --requests-per-client $rpc $fl
    done ;;
  timeline) # the batched swap's own log (debug), 8 alternating one-token requests
    for v in ${TL:-new-b64}; do
      bin=/tmp/forge; [ "${v%%-*}" = base ] && bin=/tmp/forge-base
      $bin -v serve -m a=/tmp/a.gguf -m b=/tmp/b.gguf --device gpu --budget 30GiB --batch-seqs 64 --addr 127.0.0.1:8091 >>"$o/tl-$v.log" 2>&1 &
      pid=$!
      for _ in $(seq 1 100); do curl -sf http://127.0.0.1:8091/health >/dev/null && break; sleep 0.2; done
      for i in 0 1 2 3 4 5 6 7; do
        m=a; [ $((i % 2)) = 1 ] && m=b
        echo "=== request $i model $m $(date +%s.%N)" >>"$o/tl-$v.log"
        curl -s -o /dev/null -w "req $i $m ttft %{time_starttransfer} total %{time_total}\n" http://127.0.0.1:8091/v1/completions \
          -H 'Content-Type: application/json' -d "{\"model\":\"$m\",\"prompt\":\"Once upon a time $i\",\"max_tokens\":1}" >>"$o/tl-$v.txt"
        curl -s -o /dev/null -w "warm $i $m ttft %{time_starttransfer}\n" http://127.0.0.1:8091/v1/completions \
          -H 'Content-Type: application/json' -d "{\"model\":\"$m\",\"prompt\":\"warm $i\",\"max_tokens\":1}" >>"$o/tl-$v.txt"
      done
      kill $pid; wait $pid 2>/dev/null
      ph "timeline-$v"
    done ;;
  swaptest)
    d=$(mktemp -d)
    mkdir -p "$d/github.com/forge-llm" && ln -s "$PWD" "$d/github.com/forge-llm/forge"
    (cd "$d" && FORGE_REQUIRE_GPU=1 FORGE_SWAP_MODELS=/tmp/a.gguf,/tmp/b.gguf FORGE_SWAP_DEBUG=1 \
      timeout 90 /tmp/pipeline.test -test.v -test.run 'TestEngineGPUSwap$' -test.timeout 90s) >"$o/swaptest.txt" 2>&1
    echo "rc=$?" >>"$o/swaptest.txt"; ph swaptest ;;
  pipegpu)
    d=$(mktemp -d)
    mkdir -p "$d/github.com/forge-llm" && ln -s "$PWD" "$d/github.com/forge-llm/forge"
    (cd "$d" && FORGE_REQUIRE_GPU=1 timeout 90 /tmp/pipeline.test -test.v -test.run 'TestEngineGPU|TestGPUBatchInvariant' -test.timeout 90s) >"$o/pipegpu.txt" 2>&1
    echo "rc=$?" >>"$o/pipegpu.txt"; ph pipegpu ;;
  esac
  pack
done
