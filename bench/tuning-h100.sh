#!/usr/bin/env bash
# The decode kernels' ways ($FORGE_DECODE_TUNING, kernels/gpu) compared on
# one GPU machine in one call: the CUDA objects of the sources as they are
# ($OUT/cuda-obj.tar, for bench/kernels-gen.sh merge), the kernels' GPU
# tests of those ways, then `forge bench gen -p 0 -n 128 -r 3` on $PRESET
# for each way in $WAYS, twice over, and last the default way and $BEST
# next to llama-bench (carry .carry/llama-bin.*):
#
#   tar -C bin -cJf bin/device.tar.xz device/gpu.test device/forge device/kernels-gen   # here
#   bash bench/tuning-h100.sh                                                           # there
set -uo pipefail
. bench/device-prelude.sh bin/device.tar.xz log
(cd kernels/gpu && ../../$B/gpu.test -test.v -test.run "${GPU_RUN:-RouteFused|StepGraph|PrepareQKV|MixAdd|Attention|Overlap|MoEOps}" -test.timeout 200s) >/tmp/gpu.log 2>&1
echo "kernels/gpu tests: exit $? ($(date -u +%T))" >>"$log"
grep -E -- '^(--- FAIL|FAIL|ok|PASS|panic)' /tmp/gpu.log | head -20 >>"$log"
pr=${PRESET:-qwen3-30b-a3b}
f=/tmp/$pr.gguf
$B/forge gen --preset "$pr" --quant q4_k_m --valid-utf8 -o $f --progress plain >/tmp/gen.txt 2>&1 || { tail -3 /tmp/gen.txt >>"$log"; exit 1; }
echo "=== $pr ($(date -u +%T))" >>"$log"
for round in 1 2; do
  for w in ${WAYS:-none none,rank none,wide none,minsplit=64 none,rank,wide,minsplit=64}; do
    printf '%s round %s: ' "$w" "$round" >>"$log"
    FORGE_DECODE_TUNING=$w $B/forge bench gen -m $f --device gpu -p 0 -n 128 -r 3 2>&1 | grep -E 'tg128' | sed -E 's/ +/ /g' >>"$log"
  done
done
bash bench/llamacpp-cuda.sh unpack >/tmp/unpack.txt 2>&1 || tail -5 /tmp/unpack.txt >>"$log"
echo "--- default, then ${BEST:-rank,wide,minsplit=64}, then llama-bench ($(date -u +%T))" >>"$log"
$B/forge bench gen -m $f --device gpu -p 0 -n 128 -r 3 2>&1 | grep -E 'tg128' >>"$log"
FORGE_DECODE_TUNING=${BEST:-rank,wide,minsplit=64} $B/forge bench gen -m $f --device gpu -p 0 -n 128 -r 3 \
  --peer "/tmp/llama/bin/llama-bench -ngl 99 -fa 1" 2>&1 | grep -E 'tg128|runtime' >>"$log"
tar -C /tmp -czf "$out/logs.tgz" gpu.log
cat "$log"
