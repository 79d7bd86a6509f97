#!/usr/bin/env bash
# prefill.cu variants compared on the GPU machine, one call: each variant
# is a build of kernels/gpu's tests, pipeline/model's tests and
# kernels-gen in bin/ab/NAME (here: a worktree per variant, then
#   CGO_ENABLED=0 go test -c -trimpath -ldflags='-s -w' -o bin/ab/NAME/gpu.test ./kernels/gpu
#   CGO_ENABLED=0 go test -c -trimpath -ldflags='-s -w' -o bin/ab/NAME/model.test ./pipeline/model
#   CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o bin/ab/NAME/kernels-gen ./kernels/gpu/gen
# ), carried as bin/ab.tar.xz. For each variant, in the order given
# (VARIANTS, default every folder): its CUDA objects, prefill.cu's GPU
# tests, BenchmarkPrefillTurn (the 8B shape's attention of 330 rows at 0
# and after 2000 positions) and, with STEP=1, TestGPUTurnStepBench on the
# 8B Q4_K_M file (written by bin/ab/forge gen, carried along).
# Used for the split size (2026-11-26: 1024 against 512 and 256) and the
# exp2 softmax (bench/results/2026-11-26-pieces-h100.md).
set -uo pipefail
out=${OUT:-out}
mkdir -p "$out"
tar -C bin -xJf bin/ab.tar.xz
export FORGE_REQUIRE_GPU=1 FORGE_CACHE_DIR=/tmp/forge-kernels
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >"$out/device.txt"
L8=/tmp/l8.gguf
if [ "${STEP:-0}" = 1 ] && [ -x bin/ab/forge ] && [ ! -f $L8 ]; then
  bin/ab/forge gen --preset llama3-8b --quant q4_k_m --valid-utf8 -o $L8 --progress plain >"$out/gen.txt" 2>&1
fi
for v in ${VARIANTS:-$(ls bin/ab | grep -v '^forge$')}; do
  d=$PWD/bin/ab/$v
  rm -rf /tmp/kobj-$v && mkdir -p /tmp/kobj-$v/obj
  $d/kernels-gen -backend cuda -dir /tmp/kobj-$v/obj >"$out/kobj-$v.txt" 2>&1 || { tail -5 "$out/kobj-$v.txt"; continue; }
  cp /tmp/kobj-$v/obj/cuda-sm_90-prefill.gz "$out/prefill-sm_90-$v.gz" # its registers and spills, read here
  (cd kernels/gpu && FORGE_KERNEL_OBJECTS=/tmp/kobj-$v/obj $d/gpu.test -test.v -test.timeout 300s \
    -test.run 'TestPrefill' -test.bench PrefillTurn -test.benchtime 20x) >"$out/ab-$v.txt" 2>&1
  echo "rc=$?" >>"$out/ab-$v.txt"
  if [ "${STEP:-0}" = 1 ] && [ -f $L8 ] && [ -x $d/model.test ]; then
    (cd /tmp && FORGE_KERNEL_OBJECTS=/tmp/kobj-$v/obj FORGE_BIG_MODEL=$L8 $d/model.test -test.v -test.timeout 300s \
      -test.run TestGPUTurnStepBench) >"$out/step-$v.txt" 2>&1
    echo "rc=$?" >>"$out/step-$v.txt"
  fi
done
