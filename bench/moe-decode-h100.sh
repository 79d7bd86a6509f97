#!/usr/bin/env bash
# A mixture's decode after a kernel change, in one call on the GPU machine:
# the CUDA objects of the sources as they are ($OUT/cuda-obj.tar, for
# bench/kernels-gen.sh merge), the kernels' and the mixture's GPU tests on
# them, then `forge bench gen -p 512 -n 128` next to llama-bench for each
# preset:
#
#   tar -C bin -cJf bin/moe-dev.tar.xz device/forge device/kernels-gen device/gpu.test device/model.test   # here
#   MOE_PRESETS="qwen3-30b-a3b gpt-oss-20b" bash bench/moe-decode-h100.sh   # there, with .carry/llama-bin.*
set -uo pipefail
. bench/device-prelude.sh bin/moe-dev.tar.xz decode.txt
(cd kernels/gpu && ../../$B/gpu.test -test.v -test.run "${GPU_RUN:-Conformance|Moe|MoE|Route|Norm}" -test.timeout 300s) >/tmp/gpu.log 2>&1
echo "kernels/gpu tests: exit $?" >>"$log"
grep -E -- '^(--- FAIL|FAIL|ok|PASS|panic)' /tmp/gpu.log | head -20 >>"$log"
(cd "$mdir" && "$OLDPWD/$B/model.test" -test.v -test.run "${MODEL_RUN:-GPUMoE|GptOssGPU|GPUBatch|GPUStep|GPUTokens}" -test.timeout 300s) >/tmp/model.log 2>&1
echo "pipeline/model tests: exit $?" >>"$log"
grep -E -- '^(--- FAIL|--- PASS|FAIL|ok|PASS|panic)' /tmp/model.log | head -30 >>"$log"
bash bench/llamacpp-cuda.sh unpack >/tmp/unpack.txt 2>&1 || tail -5 /tmp/unpack.txt >>"$log"
for pr in ${MOE_PRESETS:-qwen3-30b-a3b}; do
  f=/tmp/$pr.gguf
  $B/forge gen --preset "$pr" --quant q4_k_m --valid-utf8 -o $f --progress plain >/tmp/gen-$pr.txt 2>&1 || { tail -3 /tmp/gen-$pr.txt >>"$log"; continue; }
  echo "=== $pr ($(date -u +%T))" >>"$log"
  $B/forge bench gen -m $f --device gpu -p 512 -n 128 -r 3 --peer "/tmp/llama/bin/llama-bench -ngl 99 -fa 1" >>"$log" 2>&1
  rm -f $f
done
tar -C /tmp -czf "$out/logs.tgz" gpu.log model.log
cat "$log"
