#!/usr/bin/env bash
# Overlapped kernel launches (programmatic dependent launch, GRID_DEPEND in
# kernels/gpu/cu/common.h) checked and timed in one call on the GPU
# machine: the CUDA objects of the sources as they are ($OUT/cuda-obj.tar,
# for bench/kernels-gen.sh merge), the GPU tests of $PKGS on them, then
# `forge bench gen -p 512 -n 128 -r 3` on each of $PRESETS with the
# launches overlapped and with FORGE_LAUNCH_OVERLAP=off, alternating, and
# llama-bench as the peer where $PEER=1 (carry .carry/llama-bin.*);
# OVERLAP_MODES="on" times the overlapped launches alone.
# Steps stop being started once $BUDGET seconds (default 540) have passed.
#
#   make device && tar -C bin -cJf bin/device.tar.xz device   # here
#   PRESETS="qwen3-30b-a3b gpt-oss-20b llama3-8b" bash bench/overlap-h100.sh   # there
set -uo pipefail
t0=$(date +%s)
left() { [ $(( $(date +%s) - t0 )) -lt "${BUDGET:-540}" ]; }
. bench/device-prelude.sh bin/device.tar.xz log
for pkg in ${PKGS-rocm kernels/gpu pipeline/model}; do
  left || break
  run=. dir=$pkg
  case $pkg in pipeline | actors | pipeline/model) run=${RUN_GPU:-GPU}; dir=$mdir ;; esac
  name=$(echo "$pkg" | tr / -)
  (cd "$dir" && "$OLDPWD/$B/$(basename $pkg).test" -test.v -test.run "$run" -test.timeout 300s) >"/tmp/$name.log" 2>&1
  echo "$pkg tests: exit $? ($(date -u +%T))" >>"$log"
  grep -E -- '^(--- FAIL|FAIL|ok|PASS|panic)' "/tmp/$name.log" | head -20 >>"$log"
  grep -hE 'overlap (true|false):' "/tmp/$name.log" | sed -E 's/^ +//' >>"$log"
done
[ "${PEER:-0}" = 1 ] && { bash bench/llamacpp-cuda.sh unpack >/tmp/unpack.txt 2>&1 || tail -5 /tmp/unpack.txt >>"$log"; }
for pr in ${PRESETS:-qwen3-30b-a3b}; do
  left || break
  f=/tmp/$pr.gguf
  $B/forge gen --preset "$pr" --quant q4_k_m --valid-utf8 -o $f --progress plain >/tmp/gen-$pr.txt 2>&1 || { tail -3 /tmp/gen-$pr.txt >>"$log"; continue; }
  echo "=== $pr ($(date -u +%T))" >>"$log"
  for v in ${OVERLAP_MODES:-off on off on}; do
    left || break
    echo "--- launches overlapped: $v" >>"$log"
    FORGE_LAUNCH_OVERLAP=$v $B/forge bench gen -m $f --device gpu -p 512 -n 128 -r 3 >>"$log" 2>&1
  done
  if [ "${PEER:-0}" = 1 ] && left; then
    $B/forge bench gen -m $f --device gpu -p 512 -n 128 -r 3 --peer "/tmp/llama/bin/llama-bench -ngl 99 -fa 1" >>"$log" 2>&1
  fi
  rm -f $f
done
tar -C /tmp -czf "$out/logs.tgz" $(cd /tmp && ls *.log 2>/dev/null)
cat "$log"
