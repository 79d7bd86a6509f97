#!/usr/bin/env bash
# The decode kernels' ways ($FORGE_DECODE_TUNING, kernels/gpu) compared on
# one GPU machine in one call: the CUDA objects of the sources as they are
# ($OUT/cuda-obj.tar, for bench/kernels-gen.sh merge), the kernels' GPU
# tests of those ways ($GPU_RUN) and pipeline/model's ($MODEL_RUN, where
# set), then for each preset in $PRESETS `forge bench gen -p 0 -n 128 -r 3`
# for each way in $WAYS, twice over, and last the default way and $BEST
# next to llama-bench (carry .carry/llama-bin.*); with LOAD=1 then the
# first token by expert profile, prefetch and eager, next to
# llama-completion, and one `forge -v run`'s debug log:
#
#   tar -C bin -cJf bin/device.tar.xz device/gpu.test device/model.test device/forge device/kernels-gen  # here
#   bash bench/tuning-h100.sh                                                                           # there
set -uo pipefail
. bench/device-prelude.sh bin/device.tar.xz log
(cd kernels/gpu && ../../$B/gpu.test -test.v -test.run "${GPU_RUN:-RouteFused|StepGraph|PrepareQKV|MixAdd|Attention|Overlap|MoEOps}" -test.timeout 200s) >/tmp/gpu.log 2>&1
echo "kernels/gpu tests: exit $? ($(date -u +%T))" >>"$log"
grep -E -- '^(--- FAIL|FAIL|ok|PASS|panic)' /tmp/gpu.log | head -20 >>"$log"
if [ -n "${MODEL_RUN:-}" ]; then
  (cd pipeline/model && ../../$B/model.test -test.v -test.run "$MODEL_RUN" -test.timeout 200s) >/tmp/model.log 2>&1
  echo "pipeline/model tests: exit $? ($(date -u +%T))" >>"$log"
  grep -E -- '^(--- FAIL|FAIL|ok|PASS|panic)' /tmp/model.log | head -20 >>"$log"
fi
bash bench/llamacpp-cuda.sh unpack >/tmp/unpack.txt 2>&1 || tail -5 /tmp/unpack.txt >>"$log"
for pr in ${PRESETS:-qwen3-30b-a3b}; do
  f=/tmp/$pr.gguf
  $B/forge gen --preset "$pr" --quant q4_k_m --valid-utf8 -o $f --progress plain >/tmp/gen.txt 2>&1 || { tail -3 /tmp/gen.txt >>"$log"; exit 1; }
  echo "=== $pr ($(date -u +%T))" >>"$log"
  for round in 1 2; do
    for w in ${WAYS:-none none,wide none,minsplit=64}; do
      printf '%s round %s: ' "$w" "$round" >>"$log"
      FORGE_DECODE_TUNING=$w $B/forge bench gen -m $f --device gpu -p 0 -n 128 -r 3 2>&1 | grep -E 'tg128' | sed -E 's/ +/ /g' >>"$log"
    done
  done
  echo "--- default, then ${BEST:-wide,minsplit=64}, then llama-bench ($(date -u +%T))" >>"$log"
  $B/forge bench gen -m $f --device gpu -p 0 -n 128 -r 3 2>&1 | grep -E 'tg128' >>"$log"
  FORGE_DECODE_TUNING=${BEST:-wide,minsplit=64} $B/forge bench gen -m $f --device gpu -p 0 -n 128 -r 3 \
    --peer "/tmp/llama/bin/llama-bench -ngl 99 -fa 1" 2>&1 | grep -E 'tg128|runtime' >>"$log"
  if [ "${LOAD:-0}" = 1 ]; then # issue 21's first token: by profile, next to eager and llama-completion
    pd=$(mktemp -d)
    echo "--- $pr: the profile's run, then prefetch and eager by profile ($(date -u +%T))" >>"$log"
    $B/forge bench load -m $f --device gpu --runs 1 --cache warm --strategies prefetch --prompt-tokens 8 --expert-profiles "$pd" 2>&1 | grep -E '^ +prefetch|strategy' >>"$log"
    peer="/tmp/llama/bin/llama-completion -m {model} -ngl 99 -fa on -c 4096 -n 1 -p 'Once upon a time' -no-cnv --temp 0 --no-display-prompt 2>/dev/null"
    $B/forge bench load -m $f --device gpu --runs 3 --cache warm --strategies prefetch,eager --prompt-tokens 8 --expert-profiles "$pd" \
      --svg "$out/$pr-profile.svg" --peer "$peer" >>"$log" 2>&1
    $B/forge -v run -m $f --device gpu --expert-profiles "$pd" -n 1 -p 'Once upon a time there was a' >/dev/null 2>"$out/$pr-run-v.txt"
  fi
  rm -f $f
done
tar -C /tmp -czf "$out/logs.tgz" gpu.log $( [ -f /tmp/model.log ] && echo model.log)
cat "$log"
