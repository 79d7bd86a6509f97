#!/usr/bin/env bash
# A mixture's short prompt as products by id (mixtureRows), on one GPU
# machine in one call: carry bin/device.tar.xz (device/model.test,
# device/forge) and .carry/llama-bin.* (bench/llamacpp-cuda.sh). Runs
# pipeline/model's mixture GPU tests, then for each preset in
# $MOE_PRESETS: TestGPUDecodeBench (the 8-token prompt step's wall time
# and kernels), `forge bench gen` pp8 and tg128 next to llama-bench, and
# the first token by expert profile, prefetch and eager, next to
# llama-completion (8-token prompt, page cache warm).
set -uo pipefail
KOBJ=${KOBJ:-0} . bench/device-prelude.sh bin/device.tar.xz rows.txt
(cd pipeline/model && ../../$B/model.test -test.v -test.run "${MODEL_RUN:-TestGPUMoE}" -test.timeout 200s) >"$out/model.txt" 2>&1
echo "pipeline/model tests: exit $? ($(date -u +%T))" >>"$log"
grep -E -- '^(--- FAIL|FAIL|ok|PASS|panic)' "$out/model.txt" | head >>"$log"
bash bench/llamacpp-cuda.sh unpack >/tmp/unpack.txt 2>&1 || tail -5 /tmp/unpack.txt >>"$log"
L=/tmp/llama/bin
peer="$L/llama-completion -m {model} -ngl 99 -fa on -c 4096 -n 1 -p 'Once upon a time' -no-cnv --temp 0 --no-display-prompt 2>/dev/null"
for pr in ${MOE_PRESETS:-gpt-oss-20b qwen3-30b-a3b}; do
  f=/tmp/$pr.gguf
  $B/forge gen --preset "$pr" --quant q4_k_m --valid-utf8 -o $f --progress plain >/tmp/gen.txt 2>&1 || { tail -3 /tmp/gen.txt >>"$log"; continue; }
  cat $f >/dev/null
  echo "=== $pr ($(date -u +%T))" >>"$log"
  (cd pipeline/model && FORGE_BIG_MODEL=$f ../../$B/model.test -test.v -test.run 'TestGPUDecodeBench$' -test.timeout 300s) >"$out/bench-$pr.txt" 2>&1
  grep -E '8-token prompt step|prompt step \(8 tokens\)' "$out/bench-$pr.txt" >>"$log"
  $B/forge bench gen -m $f --device gpu -p 8 -n 128 -r 3 --peer "$L/llama-bench -ngl 99 -fa 1" 2>&1 | grep -E 'pp8|tg128|runtime' >>"$log"
  pd=$(mktemp -d)
  $B/forge bench load -m $f --device gpu --runs 1 --cache warm --strategies prefetch --prompt-tokens 8 --expert-profiles "$pd" >/dev/null 2>&1
  $B/forge bench load -m $f --device gpu --runs 3 --cache warm --strategies prefetch,eager --prompt-tokens 8 --expert-profiles "$pd" \
    --svg "$out/$pr-rows.svg" --peer "$peer" 2>&1 | grep -E '^ +(strategy|prefetch|eager|peer)' >>"$log"
  rm -f $f
done
cat "$log"
